/*
 * kquant_avx2.h - private to kquant_avx2_matvec.c and kquant_avx2_gemm.c
 * (compiled with -mavx2 -mfma -mf16c): the helpers both halves use, and the
 * GEMMs the matvec half registers.
 */
#ifndef TERN_KERNELS_KQUANT_AVX2_H
#define TERN_KERNELS_KQUANT_AVX2_H

#include <immintrin.h>
#include <stddef.h>
#include <stdlib.h>

#include "core/common.h"
#include "kernels/inline.h"
#include "kernels/kquant.h"
#include "kernels/prefetch.h"

#define KQ_PRAGMA(x) _Pragma(#x)
/* An empty asm that the compiler must assume changes v: keeps an integer
 * accumulation a chain (GCC otherwise reassociates the unrolled sums into
 * trees whose partial results spill). */
#define KQ_OPAQUE(v) __asm__("" : "+x"(v))
#define KQ_UNROLL_(n) KQ_PRAGMA(GCC unroll n)
#define KQ_UNROLL(n) KQ_UNROLL_(n)

/* fp16 scales are converted with F16C (exact, like fp16_to_f32) so that the
 * hot loops make no calls. */

TERN_INLINE __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

TERN_INLINE const block_q8_K *act_at(const char *xa, size_t st, int c, int64_t b) {
    return (const block_q8_K *)(xa + (size_t)c * st) + b;
}

/* Shuffle control selecting int16 element e of each 128-bit lane in the low
 * lane and element f in the high lane. */
TERN_INLINE __m256i pick16(int e, int f) {
    __m128i lo = _mm_set1_epi16((short)(((2 * e + 1) << 8) | (2 * e)));
    __m128i hi = _mm_set1_epi16((short)(((2 * f + 1) << 8) | (2 * f)));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* Half h (elements 128h..128h+127) of a Q6_K block as unsigned 6-bit
 * quants (q + 32): q[i] = elements 128h + 32i .. 128h + 32i + 31. */
TERN_INLINE void q6k_unpack_half(const block_q6_K *w, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i l0 = loadu256(w->ql + 64 * h), l1 = loadu256(w->ql + 64 * h + 32);
    const __m256i hv = loadu256(w->qh + 32 * h);
    /* (qh >> 2i) & 3, moved to bits 4..5 of each byte */
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hv, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30));
}

/* The GEMMs of kquant_avx2_gemm.c, [0] Q4_K, [1] Q5_K, [2] Q6_K: plain
 * AVX2, and the AVX-VNNI build (only for CPUs with AVX-VNNI). */
extern const kern_gemm_t *const kquant_avx2_gemm[3];
extern const kern_gemm_t *const kquant_avx2_gemm_vnni[3];

#endif
