/*
 * float_avx2.c - AVX2 + FMA + F16C kernels of the F32, F16 and BF16 weights
 * against F32 activations (see legacy_ref.c for the scalar oracle): the dot
 * (1..4 columns), the rows function (2..4 rows in lockstep, 1..2 columns,
 * for the matvec driver's interleaved streams, legacy.h) and a
 * register-tiled GEMM, all computing every output with the SAME float
 * operations in the same order, so that matvec, matvec2 and GEMM agree bit
 * for bit (kernels.h, "batch invariance").
 *
 * The float order of one output (weight row w, activation column x, row
 * length k), for every kernel in this file:
 *   - a 16-lane accumulator held as two 8-lane vectors lo (lanes 0..7) and
 *     hi (lanes 8..15), both starting at +0.0 in every lane;
 *   - for s = 0, 1, ..., ceil(k / 16) - 1 in increasing order:
 *       lo = fma(W_s[0..7], X_s[0..7], lo)
 *       hi = fma(W_s[8..15], X_s[8..15], hi)
 *     (one rounding per lane: w * x + acc) where lane l of W_s / X_s holds
 *     element i = 16 s + l of w / x, converted exactly to float (F16 and
 *     BF16 values are all floats), and lanes with i >= k hold +0.0 in BOTH
 *     operands (so the last, ragged step adds 0 * 0 = +0.0 to those lanes;
 *     garbage past the end can never make a NaN);
 *   - the result is hsum8(lo + hi) (avx2_util.h): hi added onto lo, then
 *     the upper 4 lanes onto the lower 4, 2 onto 2, 1 onto 1.
 * So lane l (0..15) accumulates the elements i with i % 16 == l, in
 * increasing i, in a single chain. This is exactly the order of
 * float_avx512.c (its hsum16 is hsum8 of lo + hi), so the AVX2 and AVX-512
 * float kernels give the same bits as well. Two chains per (row, column)
 * keep two FMAs in flight in a one-row, one-column dot (it serves leftover
 * rows only); the rows kernel and the GEMM hide the FMA latency with the
 * rows and columns computed side by side, each an independent chain.
 *
 * GEMM (kern_gemm_t, kernels.h), layouts and loops:
 *   - prep lays out a group of 16 activation columns (KERN_GEMM_GROUP) as
 *     k-chunks of GEMM_KC = 256 elements (kpad = k rounded up to 16, the
 *     last chunk shorter, the elements past k zero): chunk q holds, for
 *     column c = 0..15, its elements [256 q, 256 q + len_q) contiguously,
 *     column after column; the columns past the group's last are all zero.
 *   - run converts GEMM_RB = 6 weight rows at a time to floats in the same
 *     chunked layout in its scratch (the "panel"; rows past the end and
 *     elements past k zero). Each weight is converted once per panel (per
 *     super-block, below), not once per tile of columns.
 *   - the micro-kernel computes a 3 x 4 tile (3 rows x 4 columns: 12
 *     accumulators, 3 weight and 1 activation register of the 16 ymm) over
 *     one chunk and one half (lo: elements 16 s + 0..7, hi: 16 s + 8..15):
 *     per step of 16 elements 3 + 4 vector loads and 12 FMAs. The lo and hi
 *     chains of an output are independent, so the tile runs the chunk's lo
 *     half, then its hi half.
 *   - loop order of run: super-block of columns (as many 16-column groups
 *     as fit about GEMM_X_BYTES of prepped activations, which then stay in
 *     L2), then 6-row panel, then group, then k-chunk, then the 2 row tiles
 *     x 4 column tiles x 2 halves of the (panel, group) block. Chunk q of
 *     the panel is packed right before the super-block's first group uses
 *     it, and the weights two chunks ahead are prefetched meanwhile. One
 *     chunk of a block (6 x 256 weights, 16 x 256 activations, 192 partial
 *     accumulators: 28 KB) stays in L1 while its tiles run; the panel stays
 *     in L2 while the super-block's groups pass over it. A tile's
 *     accumulators are stored between chunks and reduced by hsum8(lo + hi)
 *     after the last one.
 *   - bit-identity with the dot: the same two chains per (row, column), the
 *     same zero lanes past k (the pack and prep write the zeros the dot's
 *     zero-padded tail reads), the same reduction; the tiling only decides
 *     which chains run side by side, never the operations of one chain.
 * The one-row, one-column dot is bound by its two chains' FMA latency,
 * still above a core's memory stream for every format (measured, and the
 * GEMM against the former path through the dot: docs/PERF.md).
 */
#if defined(__x86_64__)

#include <stdbool.h>
#include <string.h>

#include "kernels/x86/avx2_util.h"
#include "core/common.h"
#include "kernels/legacy.h"
#include "kernels/prefetch.h"
#include "kernels/x86/rows_entry.h"

/* ---- loaders: eight weights from p as floats ---------------------------- */

TERN_INLINE __m256 load8_f32(const void *p) {
    return _mm256_loadu_ps((const float *)p);
}
TERN_INLINE __m256 load8_f16(const void *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
/* bf16 is the upper half of a float: zero-extend to 32 bits, shift up. */
TERN_INLINE __m256 load8_bf16(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* The final reduction of one output's two chains (the header's order). */
TERN_INLINE float hsum_lohi(__m256 lo, __m256 hi) {
    return hsum8(_mm256_add_ps(lo, hi));
}

/* ---- dot: one row, 1..4 columns ---------------------------------------- */

/* Two chains per column (the order of the header). The main loop takes 64
 * elements per iteration (the weight bytes of one or more cache lines,
 * prefetched PF_DIST ahead): even vectors go to lo, odd ones to hi. The
 * rest, the ragged end included, goes 16 at a time; a partial last step is
 * copied into zeroed temporaries (both operands). Each column's chains see
 * the same operations whatever nc is. */
#define FLOAT_DOT(name, wsz, load)                                                                       \
    TERN_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        __m256 acc[KERN_MAX_COLS][2];                                                                    \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) acc[c][0] = acc[c][1] = _mm256_setzero_ps(); \
        int64_t i = 0;                                                                                   \
        for (; i + 64 <= k; i += 64) {                                                                   \
            _Pragma("GCC unroll 4") for (int b = 0; b < 64 * (wsz); b += 64)                             \
                prefetch_ahead(w + i * (wsz) + b, 64);                                                   \
            _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) {                                        \
                const __m256 wv = load(w + (i + 8 * u) * (wsz));                                         \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    const float *x = (const float *)(xa + (size_t)c * st) + i + 8 * u;                   \
                    acc[c][u & 1] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[c][u & 1]);              \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (; i < k; i += 16) {                                                                         \
            if (i + 16 <= k) {                                                                           \
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                    \
                    const __m256 wv = load(w + (i + 8 * h) * (wsz));                                     \
                    _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                               \
                        const float *x = (const float *)(xa + (size_t)c * st) + i + 8 * h;               \
                        acc[c][h] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[c][h]);                  \
                    }                                                                                    \
                }                                                                                        \
            } else {                                                                                     \
                char wt[16 * (wsz)];                                                                     \
                memset(wt, 0, sizeof wt);                                                                \
                memcpy(wt, w + i * (wsz), (size_t)(k - i) * (wsz));                                      \
                const __m256 w0 = load(wt), w1 = load(wt + 8 * (wsz));                                   \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    float xt[16] = {0};                                                                  \
                    memcpy(xt, (const float *)(xa + (size_t)c * st) + i, (size_t)(k - i) * sizeof(float)); \
                    acc[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), acc[c][0]);                     \
                    acc[c][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), acc[c][1]);                 \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) out[c] = hsum_lohi(acc[c][0], acc[c][1]);   \
    }

FLOAT_DOT(f32, 4, load8_f32)
FLOAT_DOT(f16, 2, load8_f16)
FLOAT_DOT(bf16, 2, load8_bf16)

COLS_ENTRY(dot_f32_avx2, f32_cols, KERN_MAX_COLS)
COLS_ENTRY(dot_f16_avx2, f16_cols, KERN_MAX_COLS)
COLS_ENTRY(dot_bf16_avx2, bf16_cols, KERN_MAX_COLS)

/* ---- rows: 2..4 rows in lockstep, 1..2 columns --------------------------- */

/* Row r's chains see the same operations in the same order as in
 * name##_cols, so each row's result is bit-identical to a one-row call; only
 * the interleaving of the rows' loads differs, which keeps nr prefetch
 * streams going per core, and 2 * nr * nc independent FMA chains. */
#define FLOAT_ROWS(name, wsz, load)                                                                      \
    TERN_INLINE void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                   size_t st, const int nc, float *out) {                                \
        __m256 acc[KERN_MAX_ROWS * 2][2];                                                                \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) acc[j][0] = acc[j][1] =                \
            _mm256_setzero_ps();                                                                         \
        int64_t i = 0;                                                                                   \
        for (; i + 64 <= k; i += 64) {                                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const char *w = wr[r];                                                                   \
                _Pragma("GCC unroll 4") for (int b = 0; b < 64 * (wsz); b += 64)                         \
                    prefetch_ahead(w + i * (wsz) + b, 64);                                               \
                _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) {                                    \
                    const __m256 wv = load(w + (i + 8 * u) * (wsz));                                     \
                    _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                               \
                        const float *x = (const float *)(xa + (size_t)c * st) + i + 8 * u;               \
                        acc[r * nc + c][u & 1] =                                                         \
                            _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[r * nc + c][u & 1]);             \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (; i < k; i += 16) {                                                                         \
            const int64_t v = k - i < 16 ? k - i : 16;                                                   \
            __m256 x[2][2];                                                                              \
            _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                                       \
                float xt[16] = {0};                                                                      \
                memcpy(xt, (const float *)(xa + (size_t)c * st) + i, (size_t)v * sizeof(float));         \
                x[c][0] = _mm256_loadu_ps(xt);                                                           \
                x[c][1] = _mm256_loadu_ps(xt + 8);                                                       \
            }                                                                                            \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                char wt[16 * (wsz)];                                                                     \
                memset(wt, 0, sizeof wt);                                                                \
                memcpy(wt, (const char *)wr[r] + i * (wsz), (size_t)v * (wsz));                          \
                const __m256 w0 = load(wt), w1 = load(wt + 8 * (wsz));                                   \
                _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                                   \
                    acc[r * nc + c][0] = _mm256_fmadd_ps(w0, x[c][0], acc[r * nc + c][0]);               \
                    acc[r * nc + c][1] = _mm256_fmadd_ps(w1, x[c][1], acc[r * nc + c][1]);               \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) out[j] = hsum_lohi(acc[j][0], acc[j][1]); \
    }

FLOAT_ROWS(f32, 4, load8_f32)
FLOAT_ROWS(f16, 2, load8_f16)
FLOAT_ROWS(bf16, 2, load8_bf16)

ROWS_ENTRY(rows_f32_avx2, f32_rows, dot_f32_avx2)
ROWS_ENTRY(rows_f16_avx2, f16_rows, dot_f16_avx2)
ROWS_ENTRY(rows_bf16_avx2, bf16_rows, dot_bf16_avx2)

/* ---- GEMM ------------------------------------------------------------------ */

/* Blocking (the k-chunks of GEMM_KC = 256, the groups of 16 columns and
 * the loops are float_gemm.h's): panels of 6 rows and 3 x 4 register tiles
 * (12 accumulators, 3 weight vectors and 1 activation vector of the 16 ymm
 * registers). One chunk of a (panel, group) block is 6 KB of weights, 16 KB
 * of activations and 6 KB of partial accumulators: 28 KB, inside a 32 KB L1. */
enum { GEMM_RB = 6, GEMM_TR = 3, GEMM_TC = 4 };
/* Partial accumulators of one tile: both halves of its GEMM_TR x GEMM_TC. */
#define GEMM_TILE_PART (2 * GEMM_TR * GEMM_TC)
#define GEMM_TILE_BYTES (GEMM_TILE_PART * 32)

#define FLOAT_PACK(name, wsz, load)                                                                      \
    static void name##_pack(const char *src, int64_t v, int64_t len, float *dst) {                       \
        int64_t j = 0;                                                                                   \
        for (; j + 8 <= v; j += 8) _mm256_storeu_ps(dst + j, load(src + j * (wsz)));                     \
        if (j < v) {                                                                                     \
            char t[8 * (wsz)];                                                                           \
            memset(t, 0, sizeof t);                                                                      \
            memcpy(t, src + j * (wsz), (size_t)(v - j) * (wsz));                                         \
            _mm256_storeu_ps(dst + j, load(t));                                                          \
            j += 8;                                                                                      \
        }                                                                                                \
        for (; j < len; j += 8) _mm256_storeu_ps(dst + j, _mm256_setzero_ps());                          \
    }

FLOAT_PACK(f32, 4, load8_f32)
FLOAT_PACK(f16, 2, load8_f16)
FLOAT_PACK(bf16, 2, load8_bf16)

/* One 3 x 4 tile over one half h (0: lo, 1: hi; a constant) of one chunk of
 * len elements: w = the chunk's first row of the tile (rows len floats
 * apart), x = its first column (columns len floats apart). acc[r][c]
 * continues the chain (row r, column c, half h): from +0.0 on the first
 * chunk, else from part[h][r][c]; it goes back to part unless this is the
 * hi half of the last chunk, which instead writes hsum8(lo + hi) to
 * y[c * ldy + r] for the rv x cv valid rows x columns (lo from part). Per
 * step: 3 weight and 4 activation loads, 12 FMAs; every FMA is
 * fma(weight, activation, acc), as in the dot. */
TERN_INLINE void gemm_tile(const float *w, const float *x, int64_t len, const int h, __m256 *part, bool first,
                             bool last, float *y, int64_t ldy, int rv, int cv) {
    __m256 acc[GEMM_TR][GEMM_TC];
    __m256 *ph = part + h * GEMM_TR * GEMM_TC;
    _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) {
        _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
            acc[r][c] = first ? _mm256_setzero_ps() : _mm256_load_ps((const float *)&ph[r * GEMM_TC + c]);
        }
    }
    for (int64_t i = 8 * h; i < len; i += 16) {
        __m256 wv[GEMM_TR];
        _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) wv[r] = _mm256_loadu_ps(w + r * len + i);
        _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
            const __m256 xv = _mm256_loadu_ps(x + c * len + i);
            _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) acc[r][c] =
                _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    if (!last || h == 0) {
        _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) {
            _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
                _mm256_store_ps((float *)&ph[r * GEMM_TC + c], acc[r][c]);
            }
        }
        return;
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
        if (c >= cv) break;
        _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) {
            if (r < rv) y[c * ldy + r] = hsum_lohi(_mm256_load_ps((const float *)&part[r * GEMM_TC + c]), acc[r][c]);
        }
    }
}

/* Both halves of a tile (float_gemm.h's gemm_tile_all). */
TERN_INLINE void gemm_tile_all(const float *w, const float *x, int64_t len, char *part, bool first, bool last,
                                 float *y, int64_t ldy, int rv, int cv) {
    __m256 *pt = (__m256 *)(void *)part;
    gemm_tile(w, x, len, 0, pt, first, last, y, ldy, rv, cv);
    gemm_tile(w, x, len, 1, pt, first, last, y, ldy, rv, cv);
}

#include "kernels/x86/float_gemm.h"

FLOAT_GEMM(f32, 4)
FLOAT_GEMM(f16, 2)
FLOAT_GEMM(bf16, 2)

void legacy_register_float_avx2(kern_table_t t, const kern_options_t *o) {
    (void)o;
    t[TYPE_F32][ISA_AVX2] = (kern_ops_t){dot_f32_avx2, legacy_act_copy, rows_f32_avx2, &f32_gemm};
    t[TYPE_F16][ISA_AVX2] = (kern_ops_t){dot_f16_avx2, legacy_act_copy, rows_f16_avx2, &f16_gemm};
    t[TYPE_BF16][ISA_AVX2] = (kern_ops_t){dot_bf16_avx2, legacy_act_copy, rows_bf16_avx2, &bf16_gemm};
}

#endif /* __x86_64__ */
