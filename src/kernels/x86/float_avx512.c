/*
 * float_avx512.c - AVX-512 kernels of the F32, F16 and BF16 weights against
 * F32 activations (see legacy_ref.c for the scalar oracle): the dot (1..4
 * columns), the rows function (2..4 rows in lockstep, 1..2 columns) and a
 * register-tiled GEMM, all computing every output with the SAME float
 * operations in the same order, so that matvec, matvec2 and GEMM agree bit
 * for bit (kernels.h, "batch invariance").
 *
 * The float order of one output (weight row w, activation column x, row
 * length k), for every kernel in this file:
 *   - one 16-lane accumulator acc, starting at +0.0 in every lane;
 *   - for s = 0, 1, ..., ceil(k / 16) - 1 in increasing order:
 *       acc = fma(W_s, X_s, acc)   (one rounding per lane: w * x + acc)
 *     where lane l of W_s / X_s holds element i = 16 s + l of w / x,
 *     converted exactly to float (F16 and BF16 values are all floats), and
 *     lanes with i >= k hold +0.0 in BOTH operands (so the last, ragged step
 *     adds 0 * 0 = +0.0 to those lanes, exactly as a masked load gives);
 *   - the result is hsum16(acc) (avx512_util.h): upper 8 lanes onto the
 *     lower 8, then 4 onto 4, 2 onto 2, 1 onto 1.
 * So lane l accumulates the elements i with i % 16 == l, in increasing i,
 * in a single chain. The dot and rows kernels follow it directly (their
 * latency hiding comes from the columns and rows computed side by side,
 * each of which is an independent chain). The GEMM follows it too, with the
 * chain cut into k-chunks: between two chunks the accumulator is stored to
 * memory and loaded back, which does not change a float.
 *
 * GEMM (kern_gemm_t, kernels.h), layouts and loops:
 *   - prep lays out a group of 16 activation columns (KERN_GEMM_GROUP) as
 *     k-chunks of GEMM_KC = 256 elements (kpad = k rounded up to 16, the
 *     last chunk shorter, the elements past k zero): chunk q holds, for
 *     column c = 0..15, its elements [256 q, 256 q + len_q) contiguously,
 *     column after column; the columns past the group's last are all zero.
 *   - run converts GEMM_RB = 8 weight rows at a time to floats in the same
 *     chunked layout in its scratch (the "panel"; rows past the end and
 *     elements past k zero). Each weight is thus converted once per panel
 *     (per super-block, below), not once per tile of columns.
 *   - the micro-kernel computes a 4 x 4 tile (4 rows x 4 columns: 16
 *     accumulators, 4 weight and 1 activation register) over one chunk:
 *     per step of 16 elements 4 + 4 vector loads and 16 FMAs.
 *   - loop order of run: super-block of columns (as many 16-column groups
 *     as fit about 1 MB of prepped activations, which then stay in L2),
 *     then 8-row panel, then group, then k-chunk, then the 2 row tiles x 4
 *     column tiles of the (panel, group) block. Chunk q of the panel is
 *     packed right before the super-block's first group uses it, and the
 *     weights two chunks ahead are prefetched meanwhile. One chunk of a
 *     block (8 x 256 weights, 16 x 256 activations, 128 partial
 *     accumulators: 32 KB) stays in L1 while its 8 tiles run; the panel
 *     (8 x kpad floats) stays in L2 while the super-block's groups pass
 *     over it. A tile's accumulators are stored between chunks and reduced
 *     by hsum16 after the last one.
 *   - bit-identity with the dot: the same chain per (row, column), the same
 *     zero lanes past k (the pack and prep write the zeros a masked load
 *     reads), the same hsum16; the tiling only decides which chains run
 *     side by side, never the operations of one chain.
 * Speed against the FMA peak and the former path through the dot in
 * tiles of 4 columns: measured, docs/PERF.md.
 */
#if defined(__x86_64__)

#include <stdbool.h>
#include <string.h>

#include "kernels/x86/avx512_util.h"
#include "kernels/legacy.h"

/* ---- loaders: 16 elements from p as floats, lanes off in m read as 0 ---- */

TERN_INLINE __m512 load16_f32(const void *p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
}
TERN_INLINE __m512 load16_f16(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
/* bf16 is the upper half of a float: zero-extend to 32 bits, shift up. */
TERN_INLINE __m512 load16_bf16(const void *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* Mask of the first n lanes (n >= 16: all). */
TERN_INLINE __mmask16 lanes16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* ---- dot: one row, 1..4 columns ---------------------------------------- */

/* One accumulator per column (the order of the header). The main loop takes
 * 64 elements per iteration (the weight bytes of one or more cache lines,
 * prefetched PF_DIST ahead); the rest, the ragged end included, goes 16 at
 * a time with masked loads. Each column's chain sees the same operations
 * whatever nc is, so a column's result does not depend on its neighbours. */
#define FLOAT_DOT(name, wsz, load)                                                                       \
    TERN_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        __m512 acc[KERN_MAX_COLS];                                                                       \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();               \
        int64_t i = 0;                                                                                   \
        for (; i + 64 <= k; i += 64) {                                                                   \
            _Pragma("GCC unroll 4") for (int b = 0; b < 64 * (wsz); b += 64)                             \
                prefetch_ahead(w + i * (wsz) + b, 64);                                                   \
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                        \
                const __m512 wv = load(w + (i + 16 * u) * (wsz), 0xffff);                                \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    const float *x = (const float *)(xa + (size_t)c * st) + i + 16 * u;                  \
                    acc[c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x), acc[c]);                            \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (; i < k; i += 16) {                                                                         \
            const __mmask16 m = lanes16(k - i);                                                          \
            const __m512 wv = load(w + i * (wsz), m);                                                    \
            _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                       \
                const float *x = (const float *)(xa + (size_t)c * st) + i;                               \
                acc[c] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x), acc[c]);                       \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) out[c] = hsum16(acc[c]);                    \
    }

FLOAT_DOT(f32, 4, load16_f32)
FLOAT_DOT(f16, 2, load16_f16)
FLOAT_DOT(bf16, 2, load16_bf16)

COLS_ENTRY(dot_f32_avx512, f32_cols)
COLS_ENTRY(dot_f16_avx512, f16_cols)
COLS_ENTRY(dot_bf16_avx512, bf16_cols)

/* ---- rows: 2..4 rows in lockstep, 1..2 columns --------------------------- */

/* Row r's accumulators see the same operations in the same order as in
 * name##_cols, so each row's result is bit-identical to a one-row call; only
 * the interleaving of the rows' loads differs, which keeps nr prefetch
 * streams going per core, and nr * nc independent FMA chains. */
#define FLOAT_ROWS(name, wsz, load)                                                                      \
    TERN_INLINE void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                   size_t st, const int nc, float *out) {                                \
        __m512 acc[KERN_MAX_ROWS * 2];                                                                   \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) acc[j] = _mm512_setzero_ps();          \
        int64_t i = 0;                                                                                   \
        for (; i + 64 <= k; i += 64) {                                                                   \
            /* Row by row: its prefetch, then its 64 elements (this order                                \
             * streamed faster than interleaving the rows per 16). */                                    \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const char *w = wr[r];                                                                   \
                _Pragma("GCC unroll 4") for (int b = 0; b < 64 * (wsz); b += 64)                         \
                    prefetch_ahead(w + i * (wsz) + b, 64);                                               \
                _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                    \
                    const __m512 wv = load(w + (i + 16 * u) * (wsz), 0xffff);                            \
                    _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                               \
                        const float *x = (const float *)(xa + (size_t)c * st) + i + 16 * u;              \
                        acc[r * nc + c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x), acc[r * nc + c]);      \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (; i < k; i += 16) {                                                                         \
            const __mmask16 m = lanes16(k - i);                                                          \
            __m512 x[2];                                                                                 \
            _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) x[c] =                                  \
                _mm512_maskz_loadu_ps(m, (const float *)(xa + (size_t)c * st) + i);                      \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const __m512 wv = load((const char *)wr[r] + i * (wsz), m);                              \
                _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) acc[r * nc + c] =                   \
                    _mm512_fmadd_ps(wv, x[c], acc[r * nc + c]);                                          \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) out[j] = hsum16(acc[j]);               \
    }

FLOAT_ROWS(f32, 4, load16_f32)
FLOAT_ROWS(f16, 2, load16_f16)
FLOAT_ROWS(bf16, 2, load16_bf16)

ROWS_ENTRY(rows_f32_avx512, f32_rows, dot_f32_avx512)
ROWS_ENTRY(rows_f16_avx512, f16_rows, dot_f16_avx512)
ROWS_ENTRY(rows_bf16_avx512, bf16_rows, dot_bf16_avx512)

/* ---- GEMM ------------------------------------------------------------------ */

/* Blocking (the k-chunks of GEMM_KC = 256, the groups of 16 columns and
 * the loops are float_gemm.h's): panels of 8 rows and 4 x 4 register tiles
 * (16 accumulators, 4 weight vectors and 1 activation vector of the 32 zmm
 * registers). One chunk of a (panel, group) block holds 8 KB of weights,
 * 16 KB of activations and 8 KB of partial accumulators: 32 KB, which stays
 * in L1 while the block's 8 tiles run. A longer chunk means fewer partial
 * stores and reloads per FMA; 256 ran as fast as longer chunks on the
 * development machine (measured: docs/PERF.md) and keeps the block inside
 * a 32 KB L1 too. */
enum { GEMM_RB = 8, GEMM_TR = 4, GEMM_TC = 4 };
#define GEMM_TILE_BYTES (GEMM_TR * GEMM_TC * 64)

#define FLOAT_PACK(name, wsz, load)                                                                      \
    static void name##_pack(const char *src, int64_t v, int64_t len, float *dst) {                       \
        int64_t j = 0;                                                                                   \
        for (; j + 16 <= v; j += 16) _mm512_storeu_ps(dst + j, load(src + j * (wsz), 0xffff));           \
        if (j < v) {                                                                                     \
            _mm512_storeu_ps(dst + j, load(src + j * (wsz), lanes16(v - j)));                            \
            j += 16;                                                                                     \
        }                                                                                                \
        for (; j < len; j += 16) _mm512_storeu_ps(dst + j, _mm512_setzero_ps());                         \
    }

FLOAT_PACK(f32, 4, load16_f32)
FLOAT_PACK(f16, 2, load16_f16)
FLOAT_PACK(bf16, 2, load16_bf16)

/* One 4 x 4 tile over one chunk of len elements: w = the chunk's first row
 * of the tile (rows len floats apart), x = its first column (columns len
 * floats apart). acc[r][c] continues the chain of (row r, column c): from
 * +0.0 on the first chunk, else from part[r * 4 + c]; after the last chunk
 * its hsum16 goes to y[c * ldy + r] for the rv x cv valid rows x columns,
 * else it goes back to part. Per step: 4 weight and 4 activation loads, 16
 * FMAs; every FMA is fma(weight, activation, acc), as in the dot. */
TERN_INLINE void gemm_tile(const float *w, const float *x, int64_t len, __m512 *part, bool first, bool last,
                             float *y, int64_t ldy, int rv, int cv) {
    __m512 acc[GEMM_TR][GEMM_TC];
    _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) {
        _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
            acc[r][c] = first ? _mm512_setzero_ps() : _mm512_load_ps(&part[r * GEMM_TC + c]);
        }
    }
    for (int64_t i = 0; i < len; i += 16) {
        __m512 wv[GEMM_TR];
        _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) wv[r] = _mm512_loadu_ps(w + r * len + i);
        _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
            const __m512 xv = _mm512_loadu_ps(x + c * len + i);
            _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) acc[r][c] =
                _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    if (!last) {
        _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) {
            _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
                _mm512_store_ps(&part[r * GEMM_TC + c], acc[r][c]);
            }
        }
        return;
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < GEMM_TC; c++) {
        if (c >= cv) break;
        _Pragma("GCC unroll 4") for (int r = 0; r < GEMM_TR; r++) {
            if (r < rv) y[c * ldy + r] = hsum16(acc[r][c]);
        }
    }
}

/* float_gemm.h's gemm_tile_all: the tile is one chain per (row, column). */
TERN_INLINE void gemm_tile_all(const float *w, const float *x, int64_t len, char *part, bool first, bool last,
                                 float *y, int64_t ldy, int rv, int cv) {
    gemm_tile(w, x, len, (__m512 *)(void *)part, first, last, y, ldy, rv, cv);
}

#include "kernels/x86/float_gemm.h"

FLOAT_GEMM(f32, 4)
FLOAT_GEMM(f16, 2)
FLOAT_GEMM(bf16, 2)

void legacy_register_float_avx512(kern_table_t t, const kern_options_t *o) {
    (void)o;
    t[TYPE_F32][ISA_AVX512] = (kern_ops_t){dot_f32_avx512, legacy_act_copy, rows_f32_avx512, &f32_gemm};
    t[TYPE_F16][ISA_AVX512] = (kern_ops_t){dot_f16_avx512, legacy_act_copy, rows_f16_avx512, &f16_gemm};
    t[TYPE_BF16][ISA_AVX512] = (kern_ops_t){dot_bf16_avx512, legacy_act_copy, rows_bf16_avx512, &bf16_gemm};
}

#endif /* __x86_64__ */
