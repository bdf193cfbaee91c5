/*
 * kquant.h - private to the K-format kernels (Q4_K, Q5_K, Q6_K weights x
 * Q8_K activations): kquant_ref.c (scalar oracle and
 * kern_register_kquant), kquant_avx2_{matvec,gemm}.c and
 * kquant_avx512_{matvec,gemm}.c.
 *
 * Every dot function follows kern_dot_fn (kernels.h): any number of
 * activation columns per call (served in groups of KERN_MAX_COLS), weights
 * decoded once per group, each column's result bit-identical to a
 * one-column call of the same function. Per super-block the integer sums are
 * exact in every ISA (int8 x 4/5/6-bit products, int32 sums); only the float
 * accumulation across super-blocks differs from the scalar oracle (the AVX2
 * and AVX-512 kernels reduce each super-block to exact integers and keep one
 * float chain per (row, column), the order their own GEMMs follow too: see
 * kquant_avx512_matvec.c and kquant_avx2_matvec.c). The SIMD Q8_K activation quantizers write
 * exactly the bytes of the scalar one (quant_quantize_row to TYPE_Q8_K).
 */
#ifndef TERN_KERNELS_KQUANT_H
#define TERN_KERNELS_KQUANT_H

#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* The 8 six-bit scales and mins of a Q4_K / Q5_K block, as 8 bytes each
 * (byte j = sub-block j), by whole-word bit operations on scales[12]
 * (get_scale_min_k4 of the layout document, four sub-blocks at a time). */
static inline void kquant_scales_k4(const uint8_t q[K_SCALE_SIZE], uint64_t *sc, uint64_t *m) {
    uint32_t u0, u1, u2;
    memcpy(&u0, q, 4);
    memcpy(&u1, q + 4, 4);
    memcpy(&u2, q + 8, 4);
    uint32_t sc_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
    uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
    *sc = (uint64_t)sc_lo | ((uint64_t)sc_hi << 32);
    *m = (uint64_t)m_lo | ((uint64_t)m_hi << 32);
}

/* Several rows in one call (kern_ops_t.rows), for memory-bound matvecs.
 * One sequential stream of weights per core leaves memory bandwidth unused
 * (the hardware keeps too few misses in flight for it); reading up to
 * KQUANT_MAX_ROWS rows from far-apart places block by block, in lockstep,
 * keeps several streams going (measured: docs/PERF.md). Row-level
 * interleaving of one-row calls does not get there: a row (~2 KB) is too
 * short a burst.
 *
 * out[r * ncols + c] = dot(row w[r], activation column c), bit-identical to
 * the entry's dot on row r. 1 <= nrows <= KQUANT_MAX_ROWS; any ncols
 * (lockstep for up to 2 columns, row by row beyond). */
#define KQUANT_MAX_ROWS 4
#define KQUANT_MAX_ACC 8 /* accumulators of the largest tile: 4 rows x 2 or 1 x 4 columns */
_Static_assert(KQUANT_MAX_ROWS == KERN_MAX_ROWS, "one rows API");

#if defined(__x86_64__)
/* Fill t[Q4_K|Q5_K|Q6_K][ISA_AVX2] / [ISA_AVX512] (o->avxvnni: the AVX2
 * GEMMs with AVX-VNNI). They do not check the CPU: the table's owner
 * (dispatch.c) drops ISAs the CPU cannot run. */
void kquant_register_avx2(kern_table_t t, const kern_options_t *o);
void kquant_register_avx512(kern_table_t t, const kern_options_t *o);
#endif

#if defined(__AVX2__)
#include <immintrin.h>

/* bsums of one Q8_K block from its 256 quants in 8 vectors of 32:
 * bsums[k] = sum of quants 16k..16k+15. */
static inline void kquant_bsums_avx2(const __m256i q[8], int16_t *bsums) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i s[8];
    for (int i = 0; i < 8; i++) /* 8 x i32 = [4 partial sums of group 2i | 4 of group 2i+1] */
        s[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q[i]), ones16);
    /* hadd works within 128-bit lanes, so groups come out split between
     * the lanes (even groups low, odd groups high); unpack restores order. */
    __m256i g01 = _mm256_hadd_epi32(s[0], s[1]); /* [g0 g0 g2 g2 | g1 g1 g3 g3] */
    __m256i g23 = _mm256_hadd_epi32(s[2], s[3]); /* [g4 g4 g6 g6 | g5 g5 g7 g7] */
    __m256i g45 = _mm256_hadd_epi32(s[4], s[5]);
    __m256i g67 = _mm256_hadd_epi32(s[6], s[7]);
    __m256i lo = _mm256_hadd_epi32(g01, g23); /* [g0 g2 g4 g6 | g1 g3 g5 g7] */
    __m256i hi = _mm256_hadd_epi32(g45, g67); /* [g8 g10 g12 g14 | g9 g11 g13 g15] */
    __m256i p = _mm256_packs_epi32(lo, hi);   /* [g0 g2 g4 g6 g8 .. g14 | g1 g3 .. g15] (i16) */
    __m128i e = _mm256_castsi256_si128(p), o = _mm256_extracti128_si256(p, 1);
    _mm_storeu_si128((__m128i *)bsums, _mm_unpacklo_epi16(e, o));
    _mm_storeu_si128((__m128i *)(bsums + 8), _mm_unpackhi_epi16(e, o));
}
#endif

#endif
