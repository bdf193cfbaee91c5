/*
 * legacy_avx2.h - private to legacy_avx2_matvec.c and legacy_avx2_gemm.c
 * (compiled with -mavx2 -mfma -mf16c): the 32-block formats' layout
 * helpers both halves use, and the GEMMs the matvec half registers.
 */
#ifndef TERN_KERNELS_LEGACY_AVX2_H
#define TERN_KERNELS_LEGACY_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "kernels/legacy.h"
#include "kernels/prefetch.h"
#include "kernels/x86/avx2_util.h"

/* ---- 32-blocks: formats ---------------------------------------------------- */

#define LUT(h) (&legacy_fp16_lut[(h)])

enum { FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0, FMT_COUNT };

/* The kernels read d at offset 0 and m (the min formats) at offset 2. */
_Static_assert(offsetof(block_q4_0, d) == 0 && offsetof(block_q5_0, d) == 0 && offsetof(block_q8_0, d) == 0 &&
                   offsetof(block_q4_1, d) == 0 && offsetof(block_q5_1, d) == 0,
               "d first");
_Static_assert(offsetof(block_q4_1, m) == 2 && offsetof(block_q5_1, m) == 2, "m after d");

/* Block bytes; offset of qs, of qh (Q5 only); a min (m at offset 2);
 * log2 of the weight offset (Q4_0: 8, Q5_0: 16; 0: none). d is at 0. */
TERN_INLINE size_t f_bsz(int f) {
    return f == FMT_Q4_0   ? sizeof(block_q4_0)
           : f == FMT_Q4_1 ? sizeof(block_q4_1)
           : f == FMT_Q5_0 ? sizeof(block_q5_0)
           : f == FMT_Q5_1 ? sizeof(block_q5_1)
                           : sizeof(block_q8_0);
}
TERN_INLINE size_t f_qs(int f) {
    return f == FMT_Q4_1   ? offsetof(block_q4_1, qs)
           : f == FMT_Q5_0 ? offsetof(block_q5_0, qs)
           : f == FMT_Q5_1 ? offsetof(block_q5_1, qs)
           : f == FMT_Q4_0 ? offsetof(block_q4_0, qs)
                           : offsetof(block_q8_0, qs);
}
/* Q8_0: where quants 0..15 and 16..31 start. */
#define Q8_0_QS offsetof(block_q8_0, qs)
#define Q8_0_QS_HI (Q8_0_QS + 16)
TERN_INLINE size_t f_qh(int f) {
    return f == FMT_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
}
TERN_INLINE bool f_q5(int f) {
    return f == FMT_Q5_0 || f == FMT_Q5_1;
}
TERN_INLINE bool f_min(int f) {
    return f == FMT_Q4_1 || f == FMT_Q5_1;
}
TERN_INLINE int f_sh(int f) {
    return f == FMT_Q4_0 ? 3 : f == FMT_Q5_0 ? 4 : 0;
}

/* The fp16 at p as a float broadcast (a table read: pure loads). */
TERN_INLINE __m256 lut_bcast(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return _mm256_broadcast_ss(LUT(h));
}

/* Two 16-byte pieces: lane 0 from p, lane 1 from p + bsz (the same field
 * of the next block): one load and one insert from memory (no shuffle). */
TERN_INLINE __m256i load2x16(const uint8_t *p, size_t bsz) {
    return _mm256_loadu2_m128i((const __m128i *)(p + bsz), (const __m128i *)p);
}

/* The same for a row's last, partial group: only the first n (0..2) of the
 * two blocks exist; the other lane reads as zeros (what a zero-padded copy
 * would give, without making one: a copy stored just before these loads
 * misses store forwarding on every one of them). n is a constant 2 in the
 * main loops. */
TERN_INLINE __m256i load2x16_n(const uint8_t *p, size_t bsz, int n) {
    if (n >= 2) return load2x16(p, bsz);
    if (n == 1) return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)p), 0);
    return _mm256_setzero_si256();
}

/* ---- weights: two blocks per vector ---------------------------------------- */

/* Blocks b (at p) and b+1 (at p + bsz) decoded: lo = [b's elements 0..15 |
 * b+1's 0..15], hi = [b's 16..31 | b+1's 16..31], as maddubs' unsigned
 * operand (Q4 / Q5: the quants q; Q8_0: |w|, with the signed w in slo /
 * shi, whose signs move onto the activations). */
typedef struct {
    __m256i lo, hi, slo, shi;
} wpair_t;

/* Byte e of each lane: 0xFF when bit e + 16 * half of that lane's qh (its
 * dword 0) is set. */
TERN_INLINE __m256i qh_mask(__m256i h, int half) {
    const __m256i sel = half ? _mm256_setr_epi64x(0x0202020202020202, 0x0303030303030303, 0x0202020202020202,
                                                  0x0303030303030303)
                             : _mm256_setr_epi64x(0, 0x0101010101010101, 0, 0x0101010101010101);
    /* Each byte of the OR mask has every bit set but bit (e mod 8). */
    const __m256i v = _mm256_or_si256(_mm256_shuffle_epi8(h, sel), _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

/* n: how many of the two blocks exist (2, or 0..1 in a partial group). */
TERN_INLINE wpair_t wdec(const uint8_t *p, int f, int n) {
    const size_t bs = f_bsz(f);
    wpair_t w;
    if (f == FMT_Q8_0) {
        w.slo = load2x16_n(p + Q8_0_QS, bs, n);
        w.shi = load2x16_n(p + Q8_0_QS_HI, bs, n);
        w.lo = _mm256_abs_epi8(w.slo); /* -128 reads as unsigned 128 */
        w.hi = _mm256_abs_epi8(w.shi);
        return w;
    }
    const __m256i v = load2x16_n(p + f_qs(f), bs, n), m4 = _mm256_set1_epi8(15);
    w.lo = _mm256_and_si256(v, m4);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (f_q5(f)) {
        /* 16 bytes from qh: dword 0 of each lane is its block's qh (the
         * rest, quants, is ignored; the read stays inside the block). */
        const __m256i h = load2x16_n(p + f_qh(f), bs, n), b16 = _mm256_set1_epi8(16);
        w.lo = _mm256_or_si256(w.lo, _mm256_and_si256(qh_mask(h, 0), b16));
        w.hi = _mm256_or_si256(w.hi, _mm256_and_si256(qh_mask(h, 1), b16));
    }
    w.slo = w.shi = _mm256_setzero_si256();
    return w;
}

/* The GEMMs of legacy_avx2_gemm.c by format (FMT_*): plain AVX2, and the
 * AVX-VNNI build (only for CPUs with AVX-VNNI). */
extern const kern_gemm_t *const legacy_avx2_gemm[FMT_COUNT];
extern const kern_gemm_t *const legacy_avx2_gemm_vnni[FMT_COUNT];

#endif
