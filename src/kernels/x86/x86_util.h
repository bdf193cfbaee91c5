/*
 * x86_util.h - what the AVX2 and AVX-512 kernel files share (include it
 * through avx2_util.h or avx512_util.h, from files compiled with at least
 * -mavx2 -mfma -mf16c): the inlining attribute (kernels/inline.h) and the fixed-order
 * horizontal sum of eight floats.
 */
#ifndef TERN_KERNELS_X86_UTIL_H
#define TERN_KERNELS_X86_UTIL_H

#include <immintrin.h>

#include "kernels/inline.h"


/* Fixed reduction order: high half onto low half, then pairs, then lanes. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
