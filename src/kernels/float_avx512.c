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
 * Speed (1024 x 4096, N = 64, one Sapphire Rapids core, a quiet moment of
 * a shared machine): about 100-120 GFLOP/s for all three formats, the
 * micro-kernel alone on L1 data about 140 (FMA peak about 175); the former
 * path through the dot in tiles of 4 columns made 45-55.
 */
#if defined(__x86_64__)

#include <stdbool.h>
#include <string.h>

#include "avx512_util.h"
#include "legacy.h"

/* ---- loaders: 16 elements from p as floats, lanes off in m read as 0 ---- */

ALWAYS_INLINE __m512 load16_f32(const void *p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
}
ALWAYS_INLINE __m512 load16_f16(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
/* bf16 is the upper half of a float: zero-extend to 32 bits, shift up. */
ALWAYS_INLINE __m512 load16_bf16(const void *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* Mask of the first n lanes (n >= 16: all). */
ALWAYS_INLINE __mmask16 lanes16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* ---- dot: one row, 1..4 columns ---------------------------------------- */

/* One accumulator per column (the order of the header). The main loop takes
 * 64 elements per iteration (the weight bytes of one or more cache lines,
 * prefetched PF_DIST ahead); the rest, the ragged end included, goes 16 at
 * a time with masked loads. Each column's chain sees the same operations
 * whatever nc is, so a column's result does not depend on its neighbours. */
#define FLOAT_DOT(name, wsz, load)                                                                       \
    ALWAYS_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
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
    ALWAYS_INLINE void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                   size_t st, const int nc, float *out) {                                \
        __m512 acc[KERN_MAX_ROWS * 2];                                                                   \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) acc[j] = _mm512_setzero_ps();          \
        int64_t i = 0;                                                                                   \
        for (; i + 64 <= k; i += 64) {                                                                   \
            /* Row by row: its prefetch, then its 64 elements (this order                                \
             * streamed a few % faster than interleaving the rows per 16). */                            \
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

static void act_copy_avx512(const float *x, void *xa, int64_t k) {
    memcpy(xa, x, (size_t)k * sizeof(float));
}

/* ---- GEMM ------------------------------------------------------------------ */

/* Blocking (see the header for the loop order):
 *   GEMM_KC  elements per k-chunk (a multiple of 16);
 *   GEMM_RB  weight rows per panel (a multiple of the tile's GEMM_TR rows);
 *   GEMM_GC  columns per group (prep's unit, KERN_GEMM_GROUP);
 *   GEMM_TR x GEMM_TC  the register tile: 16 accumulators, 4 weight vectors
 *            and 1 activation vector live, of the 32 zmm registers.
 * One chunk of a (panel, group) block holds GEMM_RB * GEMM_KC weights (8 KB)
 * and GEMM_GC * GEMM_KC activations (16 KB) as floats, plus GEMM_RB * GEMM_GC
 * partial accumulators (8 KB): 32 KB, which stays in L1 while the block's
 * 8 tiles run (each tile reads 4 of its weight rows and 4 of its columns).
 * A longer chunk means fewer partial stores and reloads per FMA; on the
 * development machine (48 KB L1) 256 and 384 ran alike, 128 about 15%
 * slower; 256 keeps the block inside a 32 KB L1 too. */
enum { GEMM_KC = 256, GEMM_RB = 8, GEMM_GC = KERN_GEMM_GROUP, GEMM_TR = 4, GEMM_TC = 4 };
_Static_assert(GEMM_KC % 16 == 0 && GEMM_RB % GEMM_TR == 0 && GEMM_GC % GEMM_TC == 0, "gemm blocking");

/* Columns per super-block: the prepped activations of one super-block (about
 * GEMM_X_BYTES) stay in L2 while every panel of the run passes over them,
 * so that for many columns they are not fetched again from L3 per panel;
 * the price is packing each panel once per super-block. At k = 4096 a
 * super-block has 64 columns; it has at least one group of 16. */
#define GEMM_X_BYTES ((int64_t)1 << 20)
/* The weights of the chunk GEMM_PF_CHUNKS chunks ahead are prefetched into
 * L2 (not L1, which holds the block) while the first group runs its tiles. */
#define GEMM_PF_CHUNKS 2

/* Largest k for which the layouts' sizes are computed without overflow (far
 * beyond any model). */
#define GEMM_MAX_K ((int64_t)1 << 40)

/* Row length rounded up to whole 16-element steps. */
static int64_t gemm_kpad(int64_t k) {
    return (k + 15) & ~(int64_t)15;
}

/* Length of the chunk starting at element k0 (a multiple of GEMM_KC < kp).
 * In a chunked layout of `lines` lines (columns or rows), that chunk starts
 * at k0 * lines floats, since every chunk before it is a full one. */
static int64_t gemm_chunk_len(int64_t kp, int64_t k0) {
    return kp - k0 < GEMM_KC ? kp - k0 : GEMM_KC;
}

static size_t gemm_group_size(int64_t k) {
    if (k <= 0 || k > GEMM_MAX_K) return 0;
    return (size_t)gemm_kpad(k) * GEMM_GC * sizeof(float);
}

/* Scratch of run: the panel (GEMM_RB rows in the chunked layout), then the
 * partial accumulators of one block (GEMM_RB * GEMM_GC vectors). */
static size_t gemm_scratch_size(int64_t k) {
    if (k <= 0 || k > GEMM_MAX_K) return 0;
    return (size_t)gemm_kpad(k) * GEMM_RB * sizeof(float) + (size_t)GEMM_RB * GEMM_GC * sizeof(__m512);
}

static int64_t gemm_super_cols(int64_t kp) {
    const int64_t c = GEMM_X_BYTES / (kp * (int64_t)sizeof(float)) / GEMM_GC * GEMM_GC;
    return c < GEMM_GC ? GEMM_GC : c;
}

/* The group layout of the header from ncols act rows (plain float copies). */
static void gemm_prep(int64_t k, const void *xa, size_t st, int ncols, void *xg) {
    const int64_t kp = gemm_kpad(k);
    float *dst = xg;
    for (int64_t k0 = 0; k0 < kp; k0 += GEMM_KC) {
        const int64_t len = gemm_chunk_len(kp, k0), v = k - k0 < len ? k - k0 : len;
        for (int c = 0; c < GEMM_GC; c++, dst += len) {
            int64_t done = 0;
            if (c < ncols) {
                memcpy(dst, (const float *)((const char *)xa + (size_t)c * st) + k0, (size_t)v * sizeof(float));
                done = v;
            }
            memset(dst + done, 0, (size_t)(len - done) * sizeof(float));
        }
    }
}

/* Pack one row's chunk: len floats (a multiple of 16) at dst, the first v
 * (0..len) converted from the weights at src, zeros after them. */
typedef void (*gemm_pack_fn)(const char *src, int64_t v, int64_t len, float *dst);
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
ALWAYS_INLINE void gemm_tile(const float *w, const float *x, int64_t len, __m512 *part, bool first, bool last,
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

/* Ask for the bytes [p, p + n) into L2. Integer arithmetic: p may lie past
 * the matrix (prefetches never fault). */
static inline void gemm_prefetch(uintptr_t p, size_t n) {
    for (size_t b = 0; b < n; b += 64) _mm_prefetch((const char *)(p + b), _MM_HINT_T1);
}

/* kern_gemm_t.run of the three formats: they differ only in pack (and in
 * wsz, the bytes of one weight). */
static void gemm_run(const kern_gemm_args_t *a, const char *w, size_t row_bytes, int64_t nrows, float *y,
                     int64_t ldy, void *scratch, gemm_pack_fn pack, size_t wsz) {
    const int64_t k = a->k, n = a->n, kp = gemm_kpad(k);
    const int64_t nq = (kp + GEMM_KC - 1) / GEMM_KC; /* chunks per row */
    float *panel = scratch;
    __m512 *part = (__m512 *)(panel + kp * GEMM_RB); /* 64-aligned: kp * GEMM_RB * 4 is a multiple of 64 */
    const int64_t scols = gemm_super_cols(kp);
    for (int64_t s0 = 0; s0 < n; s0 += scols) {
        const int64_t s1 = n - s0 < scols ? n : s0 + scols;
        for (int64_t r0 = 0; r0 < nrows; r0 += GEMM_RB) {
            const int nr = nrows - r0 < GEMM_RB ? (int)(nrows - r0) : GEMM_RB;
            const int rtiles = (nr + GEMM_TR - 1) / GEMM_TR;
            for (int64_t c0 = s0; c0 < s1; c0 += GEMM_GC) {
                const int nc = s1 - c0 < GEMM_GC ? (int)(s1 - c0) : GEMM_GC;
                const int ctiles = (nc + GEMM_TC - 1) / GEMM_TC;
                const float *xg = (const float *)((const char *)a->xg + (size_t)(c0 / GEMM_GC) * a->xg_group);
                for (int64_t k0 = 0; k0 < kp; k0 += GEMM_KC) {
                    const int64_t len = gemm_chunk_len(kp, k0);
                    float *wq = panel + k0 * GEMM_RB;
                    const float *xq = xg + k0 * GEMM_GC;
                    const bool pack_now = c0 == s0, first = k0 == 0, last = k0 + len == kp;
                    if (pack_now) {
                        /* The super-block's first group is the first to use
                         * this chunk of the panel: pack it now (it stays in
                         * L1 for the tiles below). The rows past nr up to
                         * the last tile's end are zero. */
                        const int64_t v = k - k0 < len ? k - k0 : len;
                        for (int r = 0; r < rtiles * GEMM_TR; r++) {
                            const int64_t src = r < nr ? r0 + r : r0; /* a padding row reads nothing */
                            pack(w + (size_t)src * row_bytes + (size_t)k0 * wsz, r < nr ? v : 0, len,
                                 wq + r * len);
                        }
                    }
                    /* The weights to prefetch (while packing): those of the
                     * chunk GEMM_PF_CHUNKS on, counting on through the next
                     * panels (past the run's rows they are unused). */
                    const int64_t pq = k0 / GEMM_KC + GEMM_PF_CHUNKS;
                    const int64_t pk = pq % nq * GEMM_KC, prow = r0 + pq / nq * GEMM_RB;
                    const size_t pf = (size_t)gemm_chunk_len(kp, pk) * wsz;
                    for (int rt = 0; rt < rtiles; rt++) {
                        /* A row tile's share at a time, to spread them out. */
                        if (pack_now)
                            for (int r = rt * GEMM_TR; r < rt * GEMM_TR + GEMM_TR; r++)
                                gemm_prefetch((uintptr_t)w + (uintptr_t)(prow + r) * row_bytes + (uintptr_t)pk * wsz,
                                              pf);
                        for (int ct = 0; ct < ctiles; ct++)
                            gemm_tile(wq + rt * GEMM_TR * len, xq + ct * GEMM_TC * len, len,
                                      part + (rt * (GEMM_GC / GEMM_TC) + ct) * GEMM_TR * GEMM_TC, first, last,
                                      y + (c0 + ct * GEMM_TC) * ldy + r0 + rt * GEMM_TR, ldy, nr - rt * GEMM_TR,
                                      nc - ct * GEMM_TC);
                    }
                }
            }
        }
    }
}

#define FLOAT_GEMM(name, wsz)                                                                            \
    static void name##_gemm_run(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, \
                                float *y, int64_t ldy, void *scratch) {                                  \
        gemm_run(a, w, row_bytes, nrows, y, ldy, scratch, name##_pack, wsz);                             \
    }                                                                                                    \
    static const kern_gemm_t name##_gemm = {gemm_group_size, gemm_prep, gemm_scratch_size, name##_gemm_run};

FLOAT_GEMM(f32, 4)
FLOAT_GEMM(f16, 2)
FLOAT_GEMM(bf16, 2)

void legacy_register_float_avx512(kern_table_t t) {
    t[TYPE_F32][ISA_AVX512] = (kern_ops_t){dot_f32_avx512, act_copy_avx512, &f32_gemm};
    t[TYPE_F16][ISA_AVX512] = (kern_ops_t){dot_f16_avx512, act_copy_avx512, &f16_gemm};
    t[TYPE_BF16][ISA_AVX512] = (kern_ops_t){dot_bf16_avx512, act_copy_avx512, &bf16_gemm};
}

kern_rows_fn float_rows_avx512(kern_dot_fn dot) {
    static const struct {
        kern_dot_fn dot;
        kern_rows_fn rows;
    } pairs[] = {
        {dot_f32_avx512, rows_f32_avx512},
        {dot_f16_avx512, rows_f16_avx512},
        {dot_bf16_avx512, rows_bf16_avx512},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
        if (pairs[i].dot == dot) return pairs[i].rows;
    return NULL;
}

#endif /* __x86_64__ */
