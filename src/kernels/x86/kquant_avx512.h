/*
 * kquant_avx512.h - private to kquant_avx512_matvec.c and
 * kquant_avx512_gemm.c (compiled with the AVX-512 flags): the helpers both
 * halves use and the GEMMs the matvec half registers.
 */
#ifndef TERN_KERNELS_KQUANT_AVX512_H
#define TERN_KERNELS_KQUANT_AVX512_H

#include <immintrin.h>
#include <stddef.h>

#include "core/common.h"
#include "kernels/inline.h"
#include "kernels/kquant.h"
#include "kernels/prefetch.h"
#include "kernels/x86/kquant_tiles.h"

TERN_INLINE __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
TERN_INLINE __m128i loadu128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
TERN_INLINE __m512i loadu512(const void *p) { return _mm512_loadu_si512(p); }
/* 32 bytes into both halves of a zmm */
TERN_INLINE __m512i bcast256(const void *p) { return _mm512_broadcast_i64x4(loadu256(p)); }
/* lo in the low 256 bits, hi in the high 256 bits */
TERN_INLINE __m512i halves(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
/* a | (b & c), bitwise */
TERN_INLINE __m512i or_and(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0xF8); }

TERN_INLINE const block_q8_K *act_at(const char *xa, size_t st, int c, int64_t b) {
    return (const block_q8_K *)(xa + (size_t)c * st) + b;
}

typedef union {
    uint16_t h[32];
    uint8_t b[64];
    uint32_t d[16];
    __m512i v;
} v512_t;

/* Four copies of x, for the tables' initializers. */
#define W4(x) (x), (x), (x), (x)

/* Q4_K / Q5_K weights, lo/hi layout (kquant_avx512_matvec.c describes it). */
/* Q5_K high bits: the bit of qh[l] for the elements of lo/hi of half h
 * (bit 4h / 4h+2 for lo's halves, 4h+1 / 4h+3 for hi's) is rotated to bit
 * 4 of its byte (dword rotates by at most 4 left or 3 right never carry a
 * neighbouring byte's bit into bit 4). */
#define ROT(p) ((4 - (p)) & 31)
#define ROT_HALVES(a, b) W4(ROT(a)), W4(ROT(a)), W4(ROT(b)), W4(ROT(b))
static const v512_t g_q5_rot[2][2] = {{{.d = {ROT_HALVES(0, 2)}}, {.d = {ROT_HALVES(1, 3)}}},
                                      {{.d = {ROT_HALVES(4, 6)}}, {.d = {ROT_HALVES(5, 7)}}}};

/* Unpacked weights of one row of a Q4_K/Q5_K block: q[2h] = lo, q[2h+1] = hi
 * of half h, as above. qh: NULL for Q4_K. */
TERN_INLINE void affine_unpack(const uint8_t *qs, const uint8_t *qh, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const __m512i QH = qh ? bcast256(qh) : _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i L = loadu512(qs + 64 * h);
        q[2 * h] = _mm512_and_si512(L, m4);
        q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
        if (qh) {
            q[2 * h] = or_and(q[2 * h], _mm512_rolv_epi32(QH, g_q5_rot[h][0].v), b4);
            q[2 * h + 1] = or_and(q[2 * h + 1], _mm512_rolv_epi32(QH, g_q5_rot[h][1].v), b4);
        }
    }
}

/* Weights of a Q6_K block in natural order as unsigned 0..63 (q + 32):
 * q[2h] (q[2h + 1]) = elements 128h + 0..63 (64..127) of half h (see the
 * layout at g_q6_sidx, kquant_avx512_matvec.c). */
TERN_INLINE void q6k_unpack(const block_q6_K *w, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* (qh >> 2i) & 3 to bits 4..5: i = 0 | 1 via left shifts 4 | 2, i = 2 | 3 via right shifts 0 | 2 */
    const __m512i sh01 = halves(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    const __m512i sh23 = halves(_mm256_setzero_si256(), _mm256_set1_epi16(2));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i L = loadu512(w->ql + 64 * h);
        const __m512i H = bcast256(w->qh + 32 * h);
        q[2 * h] = or_and(_mm512_and_si512(L, m4), _mm512_sllv_epi16(H, sh01), m30);
        q[2 * h + 1] = or_and(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4), _mm512_srlv_epi16(H, sh23), m30);
    }
}

/* The GEMMs of kquant_avx512_gemm.c: [0] Q4_K, [1] Q5_K, [2] Q6_K. */
extern const kern_gemm_t *const kquant_avx512_gemm[3];

#endif
