/*
 * avx2_util.h - private to the AVX2 kernel files (compiled with -mavx2 -mfma
 * -mf16c): the fixed horizontal sum and the column-count dispatcher they
 * share.
 */
#ifndef TERN_KERNELS_AVX2_UTIL_H
#define TERN_KERNELS_AVX2_UTIL_H

#include <immintrin.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Fixed reduction order: high half onto low half, then pairs, then lanes. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Serve any column count in groups of at most maxc columns, each group with
 * a body specialised for its exact count. */
#define COLS_ENTRY(name, body, maxc)                                                                     \
    static void name(int64_t k, const void *w, const void *xa, size_t st, int nc, float *out) {          \
        const char *x = xa;                                                                              \
        while (nc > 0) {                                                                                 \
            const int n = nc < (maxc) ? nc : (maxc);                                                     \
            /* (maxc) is a constant: bodies for counts above it are never built */                      \
            if (n == 1)                                                                                  \
                body(k, w, x, st, 1, out);                                                               \
            else if (n == 2 || (maxc) < 3)                                                               \
                body(k, w, x, st, 2, out);                                                               \
            else if (n == 3 || (maxc) < 4)                                                               \
                body(k, w, x, st, 3, out);                                                               \
            else                                                                                         \
                body(k, w, x, st, 4, out);                                                               \
            x += (size_t)n * st;                                                                         \
            out += n;                                                                                    \
            nc -= n;                                                                                     \
        }                                                                                                \
    }

#endif
