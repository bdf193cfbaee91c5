/*
 * float_avx2.c - AVX2 + FMA + F16C kernels of the F32, F16 and BF16 weights
 * against F32 activations (see legacy_ref.c for the scalar oracle): the dot
 * (1..4 columns, at most two per pass over the row) and the rows function
 * (2..4 rows in lockstep, 1..2 columns, for the matvec driver's interleaved
 * streams, legacy.h).
 *
 * Eight elements per vector, four accumulators per column; a partial last
 * vector is zero-padded on both sides. Multi-column and multi-row calls run
 * each column's and row's operations in the same order as a one-column,
 * one-row call: results are bit-identical to it.
 */
#if defined(__x86_64__)

#include <string.h>

#include "avx2_util.h"
#include "common.h"
#include "legacy.h"
#include "prefetch.h"
#include "rows_entry.h"

/* ---- float formats ------------------------------------------------------ */

/* Accumulators per column: four FMA chains hide the FMA latency. With 16
 * ymm registers that allows two columns per pass, so float calls with more
 * columns make several passes over the (by then cached) weight row; each
 * column's arithmetic is the same whichever pass it is in. */
enum { FU = 4, FLOAT_COLS = 2 };

/* Eight weights as floats. */
ALWAYS_INLINE __m256 load8_f32(const void *p) {
    return _mm256_loadu_ps((const float *)p);
}
ALWAYS_INLINE __m256 load8_f16(const void *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
ALWAYS_INLINE __m256 load8_bf16(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* wsz: bytes per weight element; load: one of load8_*. */
#define FLOAT_DOT(name, wsz, load)                                                                       \
    ALWAYS_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        __m256 acc[KERN_MAX_COLS][FU];                                                                   \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) for (int u = 0; u < FU; u++) acc[c][u] =     \
            _mm256_setzero_ps();                                                                         \
        int64_t i = 0;                                                                                   \
        for (; i + 8 * FU <= k; i += 8 * FU) {                                                           \
            for (int b = 0; b < 8 * FU * (wsz); b += 64) prefetch_ahead(w + i * (wsz) + b, 64);         \
            _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                       \
                const __m256 wv = load(w + (i + 8 * u) * (wsz));                                         \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    const float *x = (const float *)(xa + (size_t)c * st) + i + 8 * u;                   \
                    acc[c][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[c][u]);                      \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        /* Fewer than 8 * FU left: whole vectors, then a zero-padded last one   \
         * (0 * 0 adds nothing, and garbage past the end cannot make a NaN).    \
         * u is a constant after unrolling, so acc stays in registers. */      \
        _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                           \
            if (i >= k) break;                                                                           \
            if (i + 8 <= k) {                                                                            \
                const __m256 wv = load(w + i * (wsz));                                                   \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    const float *x = (const float *)(xa + (size_t)c * st) + i;                           \
                    acc[c][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[c][u]);                      \
                }                                                                                        \
            } else {                                                                                     \
                char wt[8 * 4] = {0};                                                                    \
                memcpy(wt, w + i * (wsz), (size_t)(k - i) * (wsz));                                      \
                const __m256 wv = load(wt);                                                              \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    float xt[8] = {0};                                                                   \
                    memcpy(xt, (const float *)(xa + (size_t)c * st) + i, (size_t)(k - i) * sizeof(float)); \
                    acc[c][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xt), acc[c][u]);                     \
                }                                                                                        \
            }                                                                                            \
            i += 8;                                                                                      \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) out[c] = hsum8(                             \
            _mm256_add_ps(_mm256_add_ps(acc[c][0], acc[c][1]), _mm256_add_ps(acc[c][2], acc[c][3])));    \
    }

FLOAT_DOT(f32, 4, load8_f32)
FLOAT_DOT(f16, 2, load8_f16)
FLOAT_DOT(bf16, 2, load8_bf16)

COLS_ENTRY(dot_f32_avx2, f32_cols, FLOAT_COLS)
COLS_ENTRY(dot_f16_avx2, f16_cols, FLOAT_COLS)
COLS_ENTRY(dot_bf16_avx2, bf16_cols, FLOAT_COLS)

/* Several rows in lockstep (legacy_rows_for): row r's accumulators see the
 * same operations in the same order as in name##_cols, so each row's result
 * is bit-identical to a one-row call; only the interleaving of the rows'
 * loads differs, which keeps nr prefetch streams going per core. */
#define FLOAT_ROWS(name, wsz, load)                                                                      \
    ALWAYS_INLINE void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                   size_t st, const int nc, float *out) {                                \
        __m256 acc[KERN_MAX_ROWS * 2][FU];                                                               \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) for (int u = 0; u < FU; u++) acc[j][u] = \
            _mm256_setzero_ps();                                                                         \
        int64_t i = 0;                                                                                   \
        for (; i + 8 * FU <= k; i += 8 * FU) {                                                           \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const char *w = wr[r];                                                                   \
                for (int b = 0; b < 8 * FU * (wsz); b += 64) prefetch_ahead(w + i * (wsz) + b, 64);     \
                _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                   \
                    const __m256 wv = load(w + (i + 8 * u) * (wsz));                                     \
                    _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                               \
                        const float *x = (const float *)(xa + (size_t)c * st) + i + 8 * u;               \
                        acc[r * nc + c][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[r * nc + c][u]); \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                           \
            if (i >= k) break;                                                                           \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const char *w = wr[r];                                                                   \
                if (i + 8 <= k) {                                                                        \
                    const __m256 wv = load(w + i * (wsz));                                               \
                    _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                               \
                        const float *x = (const float *)(xa + (size_t)c * st) + i;                       \
                        acc[r * nc + c][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[r * nc + c][u]); \
                    }                                                                                    \
                } else {                                                                                 \
                    char wt[8 * 4] = {0};                                                                \
                    memcpy(wt, w + i * (wsz), (size_t)(k - i) * (wsz));                                  \
                    const __m256 wv = load(wt);                                                          \
                    _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                               \
                        float xt[8] = {0};                                                               \
                        memcpy(xt, (const float *)(xa + (size_t)c * st) + i, (size_t)(k - i) * sizeof(float)); \
                        acc[r * nc + c][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xt), acc[r * nc + c][u]); \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
            i += 8;                                                                                      \
        }                                                                                                \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) out[j] = hsum8(                        \
            _mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][1]), _mm256_add_ps(acc[j][2], acc[j][3])));    \
    }

FLOAT_ROWS(f32, 4, load8_f32)
FLOAT_ROWS(f16, 2, load8_f16)
FLOAT_ROWS(bf16, 2, load8_bf16)

ROWS_ENTRY(rows_f32_avx2, f32_rows, dot_f32_avx2)
ROWS_ENTRY(rows_f16_avx2, f16_rows, dot_f16_avx2)
ROWS_ENTRY(rows_bf16_avx2, bf16_rows, dot_bf16_avx2)

static void act_copy_avx2(const float *x, void *xa, int64_t k) {
    memcpy(xa, x, (size_t)k * sizeof(float));
}

void legacy_register_float_avx2(kern_table_t t) {
    t[TYPE_F32][ISA_AVX2] = (kern_ops_t){dot_f32_avx2, act_copy_avx2, NULL};
    t[TYPE_F16][ISA_AVX2] = (kern_ops_t){dot_f16_avx2, act_copy_avx2, NULL};
    t[TYPE_BF16][ISA_AVX2] = (kern_ops_t){dot_bf16_avx2, act_copy_avx2, NULL};
}

kern_rows_fn float_rows_avx2(kern_dot_fn dot) {
    if (dot == dot_f32_avx2) return rows_f32_avx2;
    if (dot == dot_f16_avx2) return rows_f16_avx2;
    if (dot == dot_bf16_avx2) return rows_bf16_avx2;
    return NULL;
}

#endif /* __x86_64__ */
