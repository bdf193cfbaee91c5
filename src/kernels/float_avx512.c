/*
 * float_avx512.c - AVX-512 dot products of F32, F16 and BF16 weights with
 * F32 activations (see legacy_ref.c for the scalar oracle): 16 elements per
 * vector, four accumulators per column, the ragged end done with masked
 * loads (masked-off lanes read as zero). Multi-column calls load each weight
 * vector once for all columns; the *_rows kernels run the same per-row work
 * on 2..4 rows in lockstep (legacy.h).
 */
#if defined(__x86_64__)

#include <string.h>

#include "avx512_util.h"
#include "legacy.h"

/* ---- float formats ------------------------------------------------------ */

enum { FU = 4 }; /* accumulators per column */

ALWAYS_INLINE __m512 load16_f32(const void *p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
}
ALWAYS_INLINE __m512 load16_f16(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
ALWAYS_INLINE __m512 load16_bf16(const void *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* Full vectors use an all-ones mask (a plain load once compiled); the ragged
 * end of the row continues the accumulator rotation where it stopped. */
#define FLOAT_DOT(name, wsz, load)                                                                       \
    ALWAYS_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        __m512 acc[KERN_MAX_COLS][FU];                                                                   \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) for (int u = 0; u < FU; u++) acc[c][u] =     \
            _mm512_setzero_ps();                                                                         \
        int64_t i = 0;                                                                                   \
        for (; i + 16 * FU <= k; i += 16 * FU) {                                                         \
            for (int b = 0; b < 16 * FU * (wsz); b += 64) prefetch_ahead(w + i * (wsz) + b, 64);        \
            _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                       \
                const __m512 wv = load(w + (i + 16 * u) * (wsz), 0xffff);                                \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    const float *x = (const float *)(xa + (size_t)c * st) + i + 16 * u;                  \
                    acc[c][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x), acc[c][u]);                      \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        /* u is a constant after unrolling, so acc stays in registers */                                 \
        _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                           \
            if (i >= k) break;                                                                           \
            const __mmask16 m = k - i >= 16 ? 0xffff : (__mmask16)((1u << (k - i)) - 1);                 \
            const __m512 wv = load(w + i * (wsz), m);                                                    \
            _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                       \
                const float *x = (const float *)(xa + (size_t)c * st) + i;                               \
                acc[c][u] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x), acc[c][u]);                 \
            }                                                                                            \
            i += 16;                                                                                     \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) out[c] = hsum16(                            \
            _mm512_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]), _mm512_add_ps(acc[c][2], acc[c][3])));    \
    }

FLOAT_DOT(f32, 4, load16_f32)
FLOAT_DOT(f16, 2, load16_f16)
FLOAT_DOT(bf16, 2, load16_bf16)

COLS_ENTRY(dot_f32_avx512, f32_cols)
COLS_ENTRY(dot_f16_avx512, f16_cols)
COLS_ENTRY(dot_bf16_avx512, bf16_cols)

/* Several rows in lockstep (legacy_rows_for): row r's accumulators see the
 * same operations in the same order as in name##_cols, so each row's result
 * is bit-identical to a one-row call; only the interleaving of the rows'
 * loads differs, which keeps nr prefetch streams going per core. */
#define FLOAT_ROWS(name, wsz, load)                                                                      \
    ALWAYS_INLINE void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                   size_t st, const int nc, float *out) {                                \
        __m512 acc[KERN_MAX_ROWS * 2][FU];                                                               \
        _Pragma("GCC unroll 8") for (int i = 0; i < nr * nc; i++) for (int u = 0; u < FU; u++) acc[i][u] = \
            _mm512_setzero_ps();                                                                         \
        int64_t i = 0;                                                                                   \
        for (; i + 16 * FU <= k; i += 16 * FU) {                                                         \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const char *w = wr[r];                                                                   \
                for (int b = 0; b < 16 * FU * (wsz); b += 64) prefetch_ahead(w + i * (wsz) + b, 64);    \
                _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                   \
                    const __m512 wv = load(w + (i + 16 * u) * (wsz), 0xffff);                            \
                    _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                               \
                        const float *x = (const float *)(xa + (size_t)c * st) + i + 16 * u;              \
                        acc[r * nc + c][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x), acc[r * nc + c][u]); \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                           \
            if (i >= k) break;                                                                           \
            const __mmask16 m = k - i >= 16 ? 0xffff : (__mmask16)((1u << (k - i)) - 1);                 \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const __m512 wv = load((const char *)wr[r] + i * (wsz), m);                              \
                _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                                   \
                    const float *x = (const float *)(xa + (size_t)c * st) + i;                           \
                    acc[r * nc + c][u] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x), acc[r * nc + c][u]); \
                }                                                                                        \
            }                                                                                            \
            i += 16;                                                                                     \
        }                                                                                                \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) out[j] = hsum16(                       \
            _mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]), _mm512_add_ps(acc[j][2], acc[j][3])));    \
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


void legacy_register_float_avx512(kern_table_t t) {
    t[TYPE_F32][ISA_AVX512] = (kern_ops_t){dot_f32_avx512, act_copy_avx512, NULL};
    t[TYPE_F16][ISA_AVX512] = (kern_ops_t){dot_f16_avx512, act_copy_avx512, NULL};
    t[TYPE_BF16][ISA_AVX512] = (kern_ops_t){dot_bf16_avx512, act_copy_avx512, NULL};
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
