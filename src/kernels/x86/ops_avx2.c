/*
 * ops_avx2.c - SiLU with a vector exp (AVX2 + FMA). kern_silu_mul (ops.c)
 * uses it on AVX2 and AVX-512 machines alike, so x86 keeps one float order;
 * the scalar loop in ops.c (libm expf) stays the reference.
 *
 * exp(x), element by element:
 *   x is clamped to [-87, 88] (the result stays a normal float);
 *   k = x * log2(e) rounded to the nearest integer (ties to even);
 *   r = x - k * ln2, in two fused steps (ln2 split into a high part exact
 *       in float and a low part), |r| <= ln2 / 2;
 *   p = 1 + r + r^2/2! + ... + r^6/6! (Horner, fused multiply-adds);
 *   exp(x) = p * 2^k (k + 127 written into the exponent bits).
 * The truncated series' relative error at |r| = ln2/2 is below 2e-7 (about
 * two float ulps) before rounding. silu(g) * u = g / (1 + exp(-g)) * u.
 *
 * Every element's bits depend only on its inputs: the tail (n % 8) runs the
 * same operations one element at a time (fmaf, the same rounding), and this
 * file is compiled without floating-point contraction (CMakeLists.txt), so
 * the compiler fuses nothing the code does not fuse itself.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693145751953125f         /* 11 significant bits: k * LN2_HI is exact */
#define LN2_LO 1.42860682030941723212e-6f /* ln2 - LN2_HI */
#define C2 (1.0f / 2.0f)
#define C3 (1.0f / 6.0f)
#define C4 (1.0f / 24.0f)
#define C5 (1.0f / 120.0f)
#define C6 (1.0f / 720.0f)

static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(C6);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* The same operations on one float. */
static inline float exp1(float x) {
    x = x < EXP_LO ? EXP_LO : x; /* max/min as the vector code (x is not NaN in a model) */
    x = x > EXP_HI ? EXP_HI : x;
    const float k = nearbyintf(x * LOG2E);
    float r = fmaf(-k, LN2_HI, x);
    r = fmaf(-k, LN2_LO, r);
    float p = C6;
    p = fmaf(p, r, C5);
    p = fmaf(p, r, C4);
    p = fmaf(p, r, C3);
    p = fmaf(p, r, C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const int32_t bits = ((int32_t)k + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
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
