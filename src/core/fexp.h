/*
 * fexp.h - the polynomial exp that tern's vector code shares with its
 * scalar twin (SiLU in kernels/x86/ops_avx2.c, the sampler's probabilities
 * in text/softmax.c). For x already clamped to [-87, 88] by the caller:
 *   k = nearbyint(x * log2(e));
 *   r = fma(-k, LN2_HI, x); r = fma(-k, LN2_LO, r)   (ln2 split so that
 *       k * LN2_HI is exact, |r| <= ln2 / 2);
 *   p = 1/720; p = fma(p, r, 1/120); ... fma(p, r, 1/2); fma(p, r, 1);
 *       fma(p, r, 1)   (the Taylor series to r^6, Horner's order);
 *   result = p * 2^k (k + 127 written into the exponent bits).
 * Every step is one correctly rounded IEEE operation, so fexp_poly8 gives
 * fexp_poly1's bits in every lane. The truncated series' relative error at
 * |r| = ln2/2 is below 2e-7 (about two float ulps). fexp1 / fexp8 are the
 * whole function on any float: NaN gives NaN, x < FEXP_LO gives +0 (the
 * true value is below 1.7e-38), x > FEXP_HI gives exp(88); the sampler's
 * probabilities (text/softmax.c) and attention's softmax weights
 * (kernels/attention.c) are defined by it, so their bits do not depend on
 * libm or on whether the CPU has FMA. Nothing outside the explicit fmaf
 * calls may be fused: p * s and x * LOG2E have no add to fuse with.
 */
#ifndef TERN_CORE_FEXP_H
#define TERN_CORE_FEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define FEXP_LO (-87.0f)
#define FEXP_HI 88.0f
#define FEXP_LOG2E 1.44269504088896341f
#define FEXP_LN2_HI 0.693145751953125f         /* 11 significant bits: k * LN2_HI is exact */
#define FEXP_LN2_LO 1.42860682030941723212e-6f /* ln2 - LN2_HI */
#define FEXP_C2 (1.0f / 2.0f)
#define FEXP_C3 (1.0f / 6.0f)
#define FEXP_C4 (1.0f / 24.0f)
#define FEXP_C5 (1.0f / 120.0f)
#define FEXP_C6 (1.0f / 720.0f)

/* exp(xc) for FEXP_LO <= xc <= FEXP_HI. */
static inline float fexp_poly1(float xc) {
    const float k = nearbyintf(xc * FEXP_LOG2E);
    float r = fmaf(-k, FEXP_LN2_HI, xc);
    r = fmaf(-k, FEXP_LN2_LO, r);
    float p = FEXP_C6;
    p = fmaf(p, r, FEXP_C5);
    p = fmaf(p, r, FEXP_C4);
    p = fmaf(p, r, FEXP_C3);
    p = fmaf(p, r, FEXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const int32_t bits = ((int32_t)k + 127) * (1 << 23); /* k in [-126, 127] */
    float s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
}

/* exp(x) for every float x (see the header). */
static inline float fexp1(float x) {
    if (x != x) return x;
    if (x < FEXP_LO) return 0.0f;
    return fexp_poly1(x > FEXP_HI ? FEXP_HI : x);
}

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

/* The same on 8 lanes (AVX2 + FMA). */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 fexp_poly8(__m256 xc) {
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(FEXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(FEXP_LN2_HI), xc);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(FEXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(FEXP_C6);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FEXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FEXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FEXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FEXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
/* fexp1 on 8 lanes. */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 fexp8(__m256 x) {
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(FEXP_LO), _CMP_LT_OQ);
    const __m256 y = fexp_poly8(_mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(FEXP_HI)), _mm256_set1_ps(FEXP_LO)));
    return _mm256_blendv_ps(_mm256_blendv_ps(y, _mm256_setzero_ps(), under), x, nan);
}
#endif

#endif
