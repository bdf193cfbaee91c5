/*
 * ops_avx2.c - SiLU with a vector exp (AVX2 + FMA). kern_silu_mul (ops.c)
 * uses it on AVX2 and AVX-512 machines alike, so x86 keeps one float order;
 * the scalar loop in ops.c (libm expf) stays the reference.
 *
 * exp(x), element by element: x clamped to [-87, 88] (the result stays a
 * normal float), then core/fexp.h's polynomial (its relative error below
 * about two float ulps). silu(g) * u = g / (1 + exp(-g)) * u.
 *
 * Every element's bits depend only on its inputs: the tail (n % 8) runs the
 * same operations one element at a time (fmaf, the same rounding), and this
 * file is compiled without floating-point contraction (CMakeLists.txt), so
 * the compiler fuses nothing the code does not fuse itself.
 */
#include <immintrin.h>

#include "core/fexp.h"
#include "kernels/kernels.h"

static inline __m256 exp8(__m256 x) {
    return fexp_poly8(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(FEXP_LO)), _mm256_set1_ps(FEXP_HI)));
}

/* The same operations on one float. */
static inline float exp1(float x) {
    x = x < FEXP_LO ? FEXP_LO : x; /* max/min as the vector code (x is not NaN in a model) */
    x = x > FEXP_HI ? FEXP_HI : x;
    return fexp_poly1(x);
}

void kern_silu_mul_avx2(float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_xor_ps(g, sign));
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        const float g = gate[i];
        gate[i] = (g / (1.0f + exp1(-g))) * up[i];
    }
}
