/*
 * legacy_avx2.c - AVX2 + FMA + F16C kernels of the 32-element block formats
 * Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: the dot (one weight row, 1..4 columns),
 * the rows function (2..4 rows in lockstep, 1..2 columns, for the matvec
 * driver), a GEMM for many columns (kern_gemm_t), and the Q8_0 / Q8_1
 * activation quantizers. legacy_ref.c holds the scalar oracle and legacy.h
 * the activation row layout that all ISAs share (unchanged here); the float
 * formats are in float_avx2.c. AVX2, FMA and F16C instructions: this runs
 * on Haswell and Zen 2 (no AVX-512). Where the CPU has AVX-VNNI (Intel
 * Alder Lake and later; cpu_features()->avxvnni) and the options allow it
 * (kern_options_t.avxvnni, which TERN_NO_AVXVNNI turns off),
 * registration puts a second build of the GEMM in the AVX2 entries: its
 * tiles (only they) use vpdpbusd on ymm (function target "avxvnni"); it
 * gives the same bits as the plain one (below).
 *
 * THE FLOAT ORDER. Every AVX2 kernel of a format computes, for a weight row
 * and an activation column with blocks b = 0 .. nb-1, exactly this (the
 * order of legacy_avx512.c, so both x86 ISAs give the same bits):
 *
 *   I_b   = the exact int32 dot of block b's integer weights (Q4_0: q - 8,
 *           Q5_0: q - 16, Q4_1 / Q5_1: q, Q8_0: qs, -128 included) and the
 *           activation block's int8 quants (|I_b| < 2^24: the conversion
 *           to float is exact);
 *   s_b   = d_w(b) * d_a(b)                   one float multiply;
 *   j     = b mod 4;
 *   acc_j = fma(float(I_b), s_b, acc_j);
 *   Q4_1 / Q5_1 only, right after:
 *   acc_j = fma(m_w(b), s_a(b), acc_j)        s_a = the Q8_1 block's s;
 *
 * with acc_0..acc_3 starting at +0.0f and blocks visited in increasing
 * order; the result is (acc_0 + acc_2) + (acc_1 + acc_3). The fp16 weight
 * scales are read through legacy_fp16_lut (exact). Integer sums are exact
 * whatever their order, so each kernel forms I_b its own way; the float
 * operations are the same in all of them, which makes the dot, the rows
 * function (so kern_matvec and kern_matvec2) and the GEMM bit-identical for
 * every row and column, at any column count, tiling and thread count (batch
 * invariance). A zero-padded block (in a partial last group of four) has
 * I = 0 and zero scales: it adds fma(0, 0, acc_j), which leaves acc_j as it
 * is (acc_j is never -0: it starts at +0, and an exact zero sum rounds to
 * -0 only when both terms are -0), so the GEMM skips such blocks where the
 * dot and rows kernels compute them.
 *
 * Why this order: one exact int32 per block is what a GEMM with 8 columns
 * per vector produces most cheaply (the k-slices of a block are summed in
 * int16 / int32, then ONE convert, multiply and FMA serve 8 columns x 32
 * products); the alternatives with several float partials per block (the
 * previous order: one per 4-element k-slice and lane, or one per half
 * block) cost the GEMM 2-8 converts and FMAs per block and column octet.
 * The matvec pays for it with one transposing reduction per act group and
 * pair of (row, column) units, which the two-blocks-per-vector decode below
 * more than wins back (measured: matvec faster than with the old order).
 *
 * Matvec kernels (dot and rows):
 *  - Weights are decoded two blocks per vector: lo = [block b's elements
 *    0..15 | block b+1's 0..15], hi = [b's 16..31 | b+1's 16..31] (one
 *    16-byte load plus one insert from memory; nibbles by a 16-bit shift
 *    and masks; the Q5 fifth bits by a byte shuffle of qh). Against them
 *    the act group's lo[2j..2j+1] / hi[2j..2j+1] are plain 32-byte loads
 *    shared by all rows: per block pair two maddubs, one int16 add, one
 *    madd give 8 int32 partials (lane 4L+m: block 2j+L's elements 4m..4m+3
 *    and 16+4m..16+4m+3), the offset formats add the act row's nsum
 *    (shifted by log2 of the offset), which covers exactly those lanes.
 *    Q8_0 moves the weights' signs onto the activations (|w| is maddubs'
 *    unsigned operand) and widens its two halves separately.
 *  - A unit is one (row, column). Units go in pairs (u, v): two rows of
 *    one column (rows function, one column) or two columns of one row;
 *    treduce4 (6 unpacks, 3 adds) turns the pair's four
 *    partial vectors of an act group into I in the lanes [u b0, v b0,
 *    u b2, v b2 | u b1, v b1, u b3, v b3], so ONE convert, multiply and FMA
 *    serve 2 units x 4 blocks, lane i of the accumulator holding acc_j of
 *    the block in that lane. d_a comes from the act's dexp by one blend,
 *    s_a from sexp by one shuffle, d_w and m_w by table broadcasts and
 *    blends. The end: per 128-bit lane (l0 + l2, l1 + l3), then low + high
 *    half: (acc_0 + acc_2) + (acc_1 + acc_3) of u in lane 0, of v in lane 1.
 *    A lone unit takes both slots.
 *  - Rows and columns are unrolled over constant counts, so each unit gets
 *    the operations of a one-row, one-column call.
 *
 * GEMM (n >= KERN_GEMM_MIN_COLS), lanes = 8 columns:
 *  - prep lays out each group of 16 columns so that, per block, one vector
 *    holds the same 4-byte k-slice of 8 columns (an 8 x 8 dword transpose
 *    per octet and block), followed by the 16 columns' d and: Q4_0 / Q5_0,
 *    the offset correction already in maddubs' int16 lanes (-8 / -16 times
 *    the sums of the activations each lane meets); Q8_1 acts, their s.
 *    Q8_0 weights get the acts sign-extended to int16, one vector per
 *    element pair and octet (no sign trick, no maddubs saturation limit).
 *  - run decodes row blocks of about GEMM_PANEL_BYTES (small enough to stay
 *    in L1 with an act chunk; the next block's raw rows are prefetched into
 *    L2 meanwhile) into quants in element order (Q4 / Q5: unsigned bytes;
 *    Q8_0: int16) and float scales, then per column group, k-chunk (whose
 *    activations stay in L1; accumulators saved between chunks, exact) and
 *    tile of 4 rows (Q5_1: 2) x 2 column octets, block by block: per
 *    k-slice one maddubs per (row, octet) with the weights' dword
 *    broadcast, summed in int16 (vpaddw wraps, so only each lane's final
 *    value must fit: Q4_0 / Q5_0 start from the correction and end at
 *    |sum (q - off) a| <= 16 * 16 * 127 < 2^15; Q4_1: 16 * 15 * 127;
 *    Q5_1: two sums of 8 products), one madd with ones = I for 8 columns
 *    (Q8_0: one madd per element pair and octet, summed in int32); then
 *    acc[o][j] = fma(float(I), d_w * d_a, acc[o][j]) (and the min FMA):
 *    the same float steps as above. Per block, row and 16 columns that is
 *    40 vector ALU uops for the Q4 / Q5 formats (16 maddubs, 14-16 adds,
 *    2 madds, 2 converts, 2 multiplies, 2-4 FMAs) and 68 for Q8_0 (32
 *    madds, 30 adds, 6 float): on a core with three vector ALU ports that
 *    count, not the loads, is the bound (measured).
 *
 * GEMM with AVX-VNNI: vpdpbusd (unsigned x signed bytes, summed in int32,
 * never saturating) replaces maddubs + add + madd. The weights are the
 * unsigned operand: the decoded rows hold q (Q4 / Q5) or w + 128 (Q8_0) as
 * bytes; prep lays out every format as the Q4 layout above, its x for the
 * offset formats (Q4_0 / Q5_0 / Q8_0: off = 8 / 16 / 128) being one int32
 * per column, -off * (the sum of the column's 32 quants), the start value
 * of the sums: I = sum (w + off) a - off sum a, exact (every partial sum
 * within 32 * 255 * 127 + 128 * 32 * 127 < 2^31). Per k-slice one vpdpbusd
 * per (row, column octet); tiles of 3 rows x 2 octets (6 int32 sums, 6
 * float accumulators, 2 activation vectors, a broadcast: 15 registers), and
 * blocks taken chain by chain (blocks j, j + 4, ... of the k-chunk for
 * chain j), so the accumulators stay in registers over the chunk; every
 * chain still sees its blocks in increasing order and the float steps are
 * the ones above, so the results are those of the plain GEMM. Per block,
 * row and 16 columns: 16 vpdpbusd, 2 converts, 2 multiplies, 2 (min
 * formats: 4) FMAs, all on the two FMA ports (measured at N = 64, k = 4096:
 * 1.3-1.4x the plain GEMM, Q8_0 2.2x).
 *
 * Exactness relies on |a| <= 127 for the activation quants (the act fns
 * clamp to +-127), as maddubs must never saturate. The weight streams of
 * the matvec kernels are prefetched PF_DIST ahead.
 *
 * The act fns quantize a group of four blocks at a time: the four amax by
 * one transposing max reduction, d and 1 / d by one vector division each,
 * d (and Q8_1's s) rounded to fp16 by F16C (the bytes of the scalar act
 * fns; the GEMM's time includes them: ~0.4 ns per element, half the old
 * per-block code's).
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/x86/avx2_util.h"
#include "core/common.h"
#include "core/cpu.h"
#include "kernels/legacy.h"
#include "kernels/prefetch.h"
#include "kernels/x86/rows_entry.h"

/* ---- 32-blocks: formats ---------------------------------------------------- */

#define LUT(h) (&legacy_fp16_lut[(h)])

enum { FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0 };

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

/* Partial sums of a decoded block pair against blocks 2j, 2j+1 of the act
 * group g (legacy.h; lo[2j..2j+1] and hi[2j..2j+1] are 32 contiguous bytes
 * each): lane 4L+m = sum over block 2j+L's elements 4m..4m+3 and
 * 16+4m..16+4m+3 of w * a, the offset taken out (nsum lane 4(2j+L)+m is
 * minus the sum of those activations). No int16 saturation: Q4 / Q5 add two
 * maddubs outputs of q <= 31 times |a| <= 127 (4 * 31 * 127 < 2^15); Q8_0's
 * |w| <= 128 against |a| <= 127 fills one maddubs (2 * 128 * 127 < 2^15),
 * so its two halves are widened separately. */
TERN_INLINE __m256i pair_int(const wpair_t *w, const char *g, int j, int f) {
    const __m256i alo = _mm256_loadu_si256((const __m256i *)(g + LEGACY_OFF_LO + 32 * j));
    const __m256i ahi = _mm256_loadu_si256((const __m256i *)(g + LEGACY_OFF_HI + 32 * j));
    const __m256i ones = _mm256_set1_epi16(1);
    if (f == FMT_Q8_0)
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w->lo, _mm256_sign_epi8(alo, w->slo)), ones),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(w->hi, _mm256_sign_epi8(ahi, w->shi)), ones));
    __m256i p =
        _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w->lo, alo), _mm256_maddubs_epi16(w->hi, ahi)), ones);
    if (f_sh(f))
        p = _mm256_add_epi32(
            p, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(g + LEGACY_OFF_NSUM + 32 * j)), f_sh(f)));
    return p;
}

/* ---- the float order: unit pairs --------------------------------------------
 * A unit is one (row, column); the matvec kernels take units two at a
 * time (u, v) and one act group (blocks 0..3) at a time, in this lane
 * order: [u b0, v b0, u b2, v b2 | u b1, v b1, u b3, v b3]. A lone unit
 * takes both slots (u = v). */

/* Transposing reduction (9 uops): lane i of 128-bit lane L of the result
 * = the sum of the four dwords of lane L of p_i. With (P01u, P01v, P23u,
 * P23v) (Pxy = a unit's pair_int of blocks x, y): the unit-pair order. */
TERN_INLINE __m256i treduce4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i u01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    const __m256i u23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(u01, u23), _mm256_unpackhi_epi64(u01, u23));
}

/* One row's fp16 field at byte off of blocks 0..3 (group at p):
 * [b0, b0, b2, b2 | b1, b1, b3, b3]; blocks past the first nblk read 0. */
TERN_INLINE __m256 wsc_blk(const uint8_t *p, size_t bs, size_t off, int j, int nblk) {
    return j < nblk ? lut_bcast(p + (size_t)j * bs + off) : _mm256_setzero_ps();
}
TERN_INLINE __m256 wsc(const uint8_t *p, size_t bs, size_t off, int nblk) {
    const __m256 s01 = _mm256_blend_ps(wsc_blk(p, bs, off, 0, nblk), wsc_blk(p, bs, off, 1, nblk), 0xF0);
    const __m256 s23 = _mm256_blend_ps(wsc_blk(p, bs, off, 2, nblk), wsc_blk(p, bs, off, 3, nblk), 0xF0);
    return _mm256_blend_ps(s01, s23, 0xCC);
}

/* One column's d and s of the act group g, in the same lanes. */
TERN_INLINE __m256 act_d4(const char *g) {
    return _mm256_blend_ps(_mm256_loadu_ps((const float *)(g + LEGACY_OFF_DEXP)),
                           _mm256_loadu_ps((const float *)(g + LEGACY_OFF_DEXP + 32)), 0xCC);
}
TERN_INLINE __m256 act_s4(const char *g) {
    /* sexp: s_j in lane 4j, zeros elsewhere */
    return _mm256_shuffle_ps(_mm256_loadu_ps((const float *)(g + LEGACY_OFF_NSUM)),
                             _mm256_loadu_ps((const float *)(g + LEGACY_OFF_NSUM + 32)), 0);
}

/* The unit pair's float step: acc = fma(float(I), d_w * d_a, acc), then
 * for the min formats acc = fma(m_w, s_a, acc). */
TERN_INLINE __m256 unit_step(__m256 acc, __m256i i, __m256 dw, __m256 da, __m256 mw, __m256 sa, int f) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw, da), acc);
    if (f_min(f)) acc = _mm256_fmadd_ps(mw, sa, acc);
    return acc;
}

/* Lane 0: u's (acc_0 + acc_2) + (acc_1 + acc_3), lane 1: v's. */
TERN_INLINE __m128 unit_final(__m256 a) {
    __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    hi = _mm_add_ps(hi, _mm_movehl_ps(hi, hi));
    return _mm_add_ps(lo, hi);
}

/* One act group of nr rows x nc columns (wg[r]: row r's group, ag[c]:
 * column c's; the first nblk blocks of the weight groups exist, 4 but in a
 * row's last group). One column: unit pairs are row pairs (r, r+1);
 * several: column pairs (c, c+1) of each row. acc[] in that order. */
TERN_INLINE void tile_grp(const uint8_t *const *wg, int nr, const char *const *ag, int nc, int f, int nblk,
                            __m256 *acc) {
    const size_t bs = f_bsz(f);
    const __m256 z = _mm256_setzero_ps();
    const int n01 = nblk < 2 ? nblk : 2, n23 = nblk > 2 ? nblk - 2 : 0;
    if (nc == 1) {
        const __m256 da = act_d4(ag[0]), sa = f_min(f) ? act_s4(ag[0]) : z;
        _Pragma("GCC unroll 2") for (int r = 0; r < nr; r += 2) {
            const wpair_t u0 = wdec(wg[r], f, n01), u1 = wdec(wg[r] + 2 * bs, f, n23);
            const __m256i pu0 = pair_int(&u0, ag[0], 0, f), pu1 = pair_int(&u1, ag[0], 1, f);
            __m256i i;
            __m256 dw = wsc(wg[r], bs, 0, nblk), mw = f_min(f) ? wsc(wg[r], bs, 2, nblk) : z;
            if (r + 1 < nr) {
                const wpair_t v0 = wdec(wg[r + 1], f, n01), v1 = wdec(wg[r + 1] + 2 * bs, f, n23);
                i = treduce4(pu0, pair_int(&v0, ag[0], 0, f), pu1, pair_int(&v1, ag[0], 1, f));
                dw = _mm256_blend_ps(dw, wsc(wg[r + 1], bs, 0, nblk), 0xAA);
                if (f_min(f)) mw = _mm256_blend_ps(mw, wsc(wg[r + 1], bs, 2, nblk), 0xAA);
            } else {
                i = treduce4(pu0, pu0, pu1, pu1);
            }
            acc[r / 2] = unit_step(acc[r / 2], i, dw, da, mw, sa, f);
        }
        return;
    }
    const int np = (nc + 1) / 2;
    _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {
        const wpair_t w0 = wdec(wg[r], f, n01), w1 = wdec(wg[r] + 2 * bs, f, n23);
        const __m256 dw = wsc(wg[r], bs, 0, nblk), mw = f_min(f) ? wsc(wg[r], bs, 2, nblk) : z;
        _Pragma("GCC unroll 2") for (int c = 0; c < nc; c += 2) {
            const int cv = c + 1 < nc ? c + 1 : c;
            const __m256i i = treduce4(pair_int(&w0, ag[c], 0, f), pair_int(&w0, ag[cv], 0, f),
                                       pair_int(&w1, ag[c], 1, f), pair_int(&w1, ag[cv], 1, f));
            __m256 da = act_d4(ag[c]), sa = f_min(f) ? act_s4(ag[c]) : z;
            if (cv != c) {
                da = _mm256_blend_ps(da, act_d4(ag[cv]), 0xAA);
                if (f_min(f)) sa = _mm256_blend_ps(sa, act_s4(ag[cv]), 0xAA);
            }
            acc[r * np + c / 2] = unit_step(acc[r * np + c / 2], i, dw, da, mw, sa, f);
        }
    }
}

/* nr rows (w[r]) x nc columns: out[r * nc + c]. Groups of four blocks; a
 * partial last group reads as zero-padded (its padded blocks add
 * fma(0, 0, acc): no change, see the header). */
TERN_INLINE void blk_tile(int64_t k, const uint8_t *const *w, const int nr, const char *xa, size_t st, const int nc,
                            float *out, const int f) {
    TERN_CHECK(k % QK == 0);
    TERN_CHECK(legacy_fp16_lut[0x3c00] == 1.0f); /* legacy_lut_init ran */
    const size_t bs = f_bsz(f), gb = LEGACY_GROUP * bs;
    const int64_t nb = k / QK, ng = nb / LEGACY_GROUP;
    const int rem = (int)(nb % LEGACY_GROUP);
    __m256 acc[4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
    const uint8_t *wg[KERN_MAX_ROWS];
    const char *ag[KERN_MAX_COLS];
    for (int64_t gi = 0; gi < ng; gi++) {
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {
            wg[r] = w[r] + (size_t)gi * gb;
            for (size_t o = 0; o < gb; o += 64) prefetch_ahead((const char *)wg[r] + o, 64);
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) ag[c] = xa + (size_t)c * st + (size_t)gi * LEGACY_GROUP_BYTES;
        tile_grp(wg, nr, ag, nc, f, 4, acc);
    }
    if (rem) {
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) wg[r] = w[r] + (size_t)ng * gb;
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) ag[c] = xa + (size_t)c * st + (size_t)ng * LEGACY_GROUP_BYTES;
        tile_grp(wg, nr, ag, nc, f, rem, acc);
    }
    float t[4];
    if (nc == 1) {
        _Pragma("GCC unroll 2") for (int r = 0; r < nr; r += 2) {
            _mm_storeu_ps(t, unit_final(acc[r / 2]));
            out[r] = t[0];
            if (r + 1 < nr) out[r + 1] = t[1];
        }
    } else {
        const int np = (nc + 1) / 2;
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) _Pragma("GCC unroll 2") for (int c = 0; c < nc; c += 2) {
            _mm_storeu_ps(t, unit_final(acc[r * np + c / 2]));
            out[r * nc + c] = t[0];
            if (c + 1 < nc) out[r * nc + c + 1] = t[1];
        }
    }
}

#define BLK_KERNELS(name, F)                                                                                 \
    TERN_INLINE void name##_cols(int64_t k, const void *w, const char *xa, size_t st, int nc, float *out) { \
        const uint8_t *wr[1] = {(const uint8_t *)w};                                                         \
        blk_tile(k, wr, 1, xa, st, nc, out, F);                                                              \
    }                                                                                                        \
    TERN_INLINE void name##_rows(int64_t k, const void *const *w, int nr, const char *xa, size_t st, int nc,  \
                                   float *out) {                                                             \
        blk_tile(k, (const uint8_t *const *)w, nr, xa, st, nc, out, F);                                      \
    }                                                                                                        \
    COLS_ENTRY(dot_##name##_avx2, name##_cols, KERN_MAX_COLS)                                                \
    ROWS_ENTRY(rows_##name##_avx2, name##_rows, dot_##name##_avx2)

BLK_KERNELS(q4_0, FMT_Q4_0)
BLK_KERNELS(q4_1, FMT_Q4_1)
BLK_KERNELS(q5_0, FMT_Q5_0)
BLK_KERNELS(q5_1, FMT_Q5_1)
BLK_KERNELS(q8_0, FMT_Q8_0)

/* ---- GEMM ------------------------------------------------------------------ */

/* GCC's temporary-expression replacement (TER) expands each single-use
 * chain of int16 adds below at its last use, after every maddubs of the
 * block: 16-32 live vectors, spilled. Without it the adds stay next to their
 * maddubs (measured: with TER these GEMMs ran 10-30% slower). Clang does
 * not need this. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-tree-ter")
#endif

/* Full unrolling of the loops over a tile's rows (nt: a constant 1..4 in
 * every instance). Clang unrolls a loop with "GCC unroll N" only by a
 * factor N, so not at all a trip count below N (measured: the 3-row VNNI
 * tiles and the 2-row Q5_1 ones ran at half speed); its own pragma without
 * a count unrolls any constant trip count fully. */
#if defined(__clang__)
#define UNROLL_NT _Pragma("unroll")
#else
#define UNROLL_NT _Pragma("GCC unroll 4")
#endif

/* prep's layout of one group of 16 columns, per block b:
 * Q4 / Q5 weights (GA_BYTES):
 *   int8  q[2][8][32]  octet o (columns 8o..8o+7), k-slice t (elements
 *                      4t..4t+3 of the block): dword c = column 8o+c's
 *                      four quants
 *   float d[16]        column c's d of block b
 *   x[16]              Q4_0 / Q5_0 (shift sh = 3 / 4): the offset
 *                      correction in maddubs' int16 lanes: column c's
 *                      dword holds -2^sh times the sum of bytes 0..1 (low
 *                      int16) / 2..3 (high) of its eight k-slice dwords;
 *                      Q4_1 / Q5_1: float s (Q8_1 acts)
 * Q8_0 weights (GA8_BYTES):
 *   int16 a[2][16][16] octet o, element pair p (elements 2p, 2p+1): dword c
 *                      = column 8o+c's two quants, sign-extended
 *   float d[16]
 * Columns past the last are zeros (computed on, never stored). */
enum { GA_OFF_D = 512, GA_OFF_X = 576, GA_BYTES = 640, GA8_OFF_D = 1024, GA8_BYTES = 1088 };
TERN_INLINE size_t f_ga(int f, bool v) {
    return f == FMT_Q8_0 && !v ? GA8_BYTES : GA_BYTES;
}
/* Blocks per k-chunk: a chunk of one column group's activations (20 KB,
 * Q8_0: 17 KB) stays in L1 while the rows of a row block pass over it (the
 * accumulators are saved between chunks: exact). */
TERN_INLINE int64_t f_kc(int f, bool v) {
    return f == FMT_Q8_0 && !v ? 16 : 32;
}
/* Bytes of decoded weight rows per row block (at least 4 rows): small
 * enough that the block and an act chunk share L1 while every column
 * group passes over them; a 96 KB block spent twice the decode time on
 * write-backs to L2 (measured: 6 against 3 cycles per Q4_0 block-row). */
#define GEMM_PANEL_BYTES (20 * 1024)
/* Accumulators of one row: 2 octets x 4 chains (acc[o][j] at 8 * (4o + j)). */
#define GEMM_STATE 256
/* Rows per register tile (at most): 4 rows x 2 octets, 8 int16 sums in
 * flight, each activation vector loaded once for 4 rows. */
#define GEMM_NT 4
/* The AVX-VNNI GEMM (v): rows per tile (3 rows x 2 octets: 6 float
 * accumulators, 6 int32 sums, 2 activation vectors and a broadcast, all in
 * registers; measured: 2 rows 15-20% slower, 4 rows (spilling) 2% slower),
 * and log2 of the weight offset its unsigned weights carry (Q8_0: w + 128).
 * Its prep layout is the Q4 / Q5 one for every format, with x = -2^sh
 * times the sum of the column's 32 quants (int32) for the offset formats,
 * and its decoded rows hold 32 unsigned bytes per block. */
#define VNNI_NT 3
TERN_INLINE int f_vsh(int f) {
    return f == FMT_Q8_0 ? 7 : f_sh(f);
}
/* Plain: Q5_1 takes 2 rows, its int16 sums plus int32 partials would want
 * 16 registers at 4 rows (measured: 2 rows 1-2% faster). */
TERN_INLINE int64_t f_nt(int f, bool v) {
    return v ? VNNI_NT : f == FMT_Q5_1 ? 2 : GEMM_NT;
}

/* A decoded row (run's scratch): per block f_dq bytes of quants in element
 * order (Q4 / Q5: q; Q8_0: w as int16), then float d[nb] and (min formats)
 * float m[nb]; rows 64-aligned. */
TERN_INLINE size_t f_dq(int f, bool v) {
    return f == FMT_Q8_0 && !v ? 64 : 32;
}
TERN_INLINE size_t gemm_row_bytes(int64_t nb, int f, bool v) {
    return ((size_t)nb * (f_dq(f, v) + (f_min(f) ? 8 : 4)) + 63) & ~(size_t)63;
}
/* The VNNI GEMM's row blocks: the same panel bytes, in whole tiles of
 * VNNI_NT rows, at least two (a row block of 4 rows at k = 4096 would run
 * every other tile with one row). */
TERN_INLINE int64_t gemm_rows(int64_t k, int f, bool v) {
    if (v) {
        int64_t rb = GEMM_PANEL_BYTES / (int64_t)gemm_row_bytes(k / QK, f, v);
        rb -= rb % VNNI_NT;
        return rb < 2 * VNNI_NT ? 2 * VNNI_NT : rb > 21 * VNNI_NT ? 21 * VNNI_NT : rb;
    }
    const int64_t rb = GEMM_PANEL_BYTES / (int64_t)gemm_row_bytes(k / QK, f, v);
    return rb < 4 ? 4 : rb > 64 ? 64 : rb;
}
TERN_INLINE size_t gemm_scratch(int64_t k, int f, bool v) {
    return (size_t)gemm_rows(k, f, v) * (gemm_row_bytes(k / QK, f, v) + GEMM_STATE);
}

/* Row w (nb blocks) decoded into dst. */
TERN_INLINE void gemm_dec_row(const uint8_t *w, int64_t nb, char *dst, int f, bool v) {
    const size_t bs = f_bsz(f), dq = f_dq(f, v);
    float *d = (float *)(dst + (size_t)nb * dq), *m = d + nb;
    if (f == FMT_Q8_0 && v) { /* w + 128 as unsigned bytes */
        const __m128i flip = _mm_set1_epi8((char)0x80);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + (size_t)b * bs;
            char *q = dst + (size_t)b * dq;
            _mm_storeu_si128((__m128i *)q, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS)), flip));
            _mm_storeu_si128((__m128i *)(q + 16), _mm_xor_si128(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS_HI)), flip));
            uint16_t h;
            memcpy(&h, p, 2);
            d[b] = *LUT(h);
        }
        return;
    }
    if (f == FMT_Q8_0) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + (size_t)b * bs;
            char *q = dst + (size_t)b * dq;
            _mm256_storeu_si256((__m256i *)q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS))));
            _mm256_storeu_si256((__m256i *)(q + 32), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS_HI))));
            uint16_t h;
            memcpy(&h, p, 2);
            d[b] = *LUT(h);
        }
        return;
    }
    for (int64_t b = 0; b < nb; b += 2) {
        const uint8_t *p = w + (size_t)b * bs;
        const wpair_t x = wdec(p, f, b + 1 < nb ? 2 : 1); /* a lone last block: the pair's other half zero */
        char *q = dst + (size_t)b * dq;
        _mm256_storeu_si256((__m256i *)q, _mm256_permute2x128_si256(x.lo, x.hi, 0x20));
        uint16_t h;
        memcpy(&h, p, 2);
        d[b] = *LUT(h);
        if (f_min(f)) memcpy(&h, p + 2, 2), m[b] = *LUT(h);
        if (b + 1 < nb) {
            _mm256_storeu_si256((__m256i *)(q + dq), _mm256_permute2x128_si256(x.lo, x.hi, 0x31));
            memcpy(&h, p + bs, 2);
            d[b + 1] = *LUT(h);
            if (f_min(f)) memcpy(&h, p + bs + 2, 2), m[b + 1] = *LUT(h);
        }
    }
}

TERN_INLINE __m256i bcast32(const char *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* I of nt (1..GEMM_NT) decoded rows q[r] (block b's quants) against the 16
 * columns' block at xb: i[r][o] = octet o's 8 exact int32 block dots.
 * Q4 / Q5: per k-slice t, one maddubs per (row, octet) with the weights'
 * dword broadcast, summed in int16; vpaddw wraps, so only each lane's final
 * value must fit: Q4_0 / Q5_0 start from prep's correction and end at
 * sum (q - off) * a over the lane's 16 products, |.| <= 16 * 16 * 127 <
 * 2^15; Q4_1: sum q * a <= 16 * 15 * 127; Q5_1 (q <= 31): two sums of 8
 * products (k-slices 0..3, 4..7), each widened. Then one madd with ones.
 * Q8_0: per element pair, one madd of the int16 weight pair's broadcast
 * against the int16 acts, summed in int32. */
TERN_INLINE void gemm_int(const char *const *q, int nt, const char *xb, int f, __m256i i[GEMM_NT][2]) {
    if (f == FMT_Q8_0) {
        _Pragma("GCC unroll 16") for (int p = 0; p < 16; p++) {
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(xb + 32 * p));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(xb + 512 + 32 * p));
            UNROLL_NT for (int r = 0; r < nt; r++) {
                const __m256i w = bcast32(q[r] + 4 * p);
                const __m256i m0 = _mm256_madd_epi16(w, a0), m1 = _mm256_madd_epi16(w, a1);
                i[r][0] = p ? _mm256_add_epi32(i[r][0], m0) : m0;
                i[r][1] = p ? _mm256_add_epi32(i[r][1], m1) : m1;
            }
        }
        return;
    }
    const __m256i ones = _mm256_set1_epi16(1);
    const int per = f == FMT_Q5_1 ? 4 : 8; /* k-slices per int16 sum */
    __m256i s[GEMM_NT][2];
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(xb + 32 * t));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(xb + 256 + 32 * t));
        UNROLL_NT for (int r = 0; r < nt; r++) {
            const __m256i w = bcast32(q[r] + 4 * t);
            const __m256i m0 = _mm256_maddubs_epi16(w, a0), m1 = _mm256_maddubs_epi16(w, a1);
            if (t % per == 0) {
                if (f_sh(f)) {
                    s[r][0] = _mm256_add_epi16(_mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X)), m0);
                    s[r][1] = _mm256_add_epi16(_mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X + 32)), m1);
                } else {
                    s[r][0] = m0;
                    s[r][1] = m1;
                }
            } else {
                s[r][0] = _mm256_add_epi16(s[r][0], m0);
                s[r][1] = _mm256_add_epi16(s[r][1], m1);
            }
            if (t % per == per - 1) {
                const __m256i p0 = _mm256_madd_epi16(s[r][0], ones), p1 = _mm256_madd_epi16(s[r][1], ones);
                i[r][0] = t < per ? p0 : _mm256_add_epi32(i[r][0], p0);
                i[r][1] = t < per ? p1 : _mm256_add_epi32(i[r][1], p1);
            }
        }
    }
}

/* Block b of rows row[0..nt-1] (decoded rows, nb blocks each) against the
 * column group's block at xb, into acc[r][o] (row r, octet o: the
 * accumulator acc_j of the block's chain j = b mod 4). Per (row, octet):
 * acc = fma(float(I), d_w * d_a, acc) (and the min FMA): the header's
 * float steps. */
TERN_INLINE void gemm_blk(const char *const *row, int nt, int64_t nb, int64_t b, const char *xb, int f,
                            __m256 acc[GEMM_NT][2]) {
    const size_t dq = f_dq(f, false), od = f == FMT_Q8_0 ? GA8_OFF_D : GA_OFF_D;
    const char *q[GEMM_NT];
    UNROLL_NT for (int r = 0; r < nt; r++) q[r] = row[r] + (size_t)b * dq;
    __m256i i[GEMM_NT][2];
    gemm_int(q, nt, xb, f, i);
    UNROLL_NT for (int r = 0; r < nt; r++) {
        const float *d = (const float *)(row[r] + (size_t)nb * dq);
        const __m256 dw = _mm256_broadcast_ss(d + b);
        _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++) {
            acc[r][o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[r][o]),
                                        _mm256_mul_ps(dw, _mm256_loadu_ps((const float *)(xb + od + 32 * o))), acc[r][o]);
            if (f_min(f))
                acc[r][o] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + nb + b),
                                            _mm256_loadu_ps((const float *)(xb + GA_OFF_X + 32 * o)), acc[r][o]);
        }
    }
}

/* Blocks b0..b1-1 (b0 a multiple of 4) of a row tile; st: the tile's saved
 * accumulators (row r's acc[o][j] at st + 64r + 8(4o + j)). A one-row
 * tile keeps its 8 accumulators in registers over the chunk; larger ones
 * load and store them per block (in L1). */
TERN_INLINE void gemm_tile(const char *const *row, int nt, int64_t nb, int64_t b0, int64_t b1, const char *xg, int f,
                             float *st) {
    const size_t ga = f_ga(f, false);
    if (nt == 1) {
        __m256 acc[4][GEMM_NT][2];
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            acc[j][0][o] = _mm256_loadu_ps(st + 8 * (4 * o + j));
        int64_t b = b0;
        for (; b + 4 <= b1; b += 4) {
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) gemm_blk(row, 1, nb, b + j,
                                                                         xg + (size_t)(b + j) * ga, f, acc[j]);
        }
        _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) if (b + j < b1) gemm_blk(
            row, 1, nb, b + j, xg + (size_t)(b + j) * ga, f, acc[j]);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            _mm256_storeu_ps(st + 8 * (4 * o + j), acc[j][0][o]);
        return;
    }
    for (int64_t b = b0; b < b1; b++) {
        const int j = (int)(b & 3);
        __m256 acc[GEMM_NT][2];
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            acc[r][o] = _mm256_loadu_ps(st + 64 * r + 8 * (4 * o + j));
        gemm_blk(row, nt, nb, b, xg + (size_t)b * ga, f, acc);
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            _mm256_storeu_ps(st + 64 * r + 8 * (4 * o + j), acc[r][o]);
    }
}

/* ---- GEMM with AVX-VNNI ---------------------------------------------------
 * The same prep layout as the Q4 / Q5 one above, for all five formats, but
 * x = -2^sh * (the sum of the column's 32 quants) as one int32 per column
 * (sh = f_vsh: Q4_0 3, Q5_0 4, Q8_0 7) for the offset formats. Decoded rows
 * hold unsigned bytes (Q8_0: w + 128). Per k-slice t, one vpdpbusd per (row,
 * octet) of the weights' dword broadcast (unsigned) against the 8 columns'
 * activation dwords (signed) accumulates into int32, starting from x: I =
 * sum (w + off) a - off * sum a exactly (|partial sums| <= 32 * 255 * 127 +
 * 128 * 32 * 127 < 2^31, no saturation anywhere). Then the float steps of
 * gemm_blk. Blocks are taken chain by chain (j = b mod 4: blocks j, j + 4,
 * ... of the k-chunk, increasing), so each (row, octet) accumulator acc_j
 * stays in a register over the chunk; each chain sees its blocks in the
 * same order as before, which is all the float order asks. */
typedef void (*vnni_tile_fn)(const char *const *row, int nt, int64_t nb, int64_t b0, int64_t b1, const char *xg,
                             float *st);

TERN_INLINE_TARGET("avxvnni") void vnni_blk(const char *const *row, int nt, int64_t nb, int64_t b, const char *xb, int f,
                          __m256 acc[VNNI_NT][2]) {
    const char *q[VNNI_NT];
    UNROLL_NT for (int r = 0; r < nt; r++) q[r] = row[r] + (size_t)b * 32;
    __m256i i[VNNI_NT][2];
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(xb + 32 * t));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(xb + 256 + 32 * t));
        UNROLL_NT for (int r = 0; r < nt; r++) {
            const __m256i w = bcast32(q[r] + 4 * t);
            if (t == 0) {
                if (f_vsh(f)) {
                    i[r][0] = _mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X));
                    i[r][1] = _mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X + 32));
                } else {
                    i[r][0] = i[r][1] = _mm256_setzero_si256();
                }
            }
            i[r][0] = _mm256_dpbusd_avx_epi32(i[r][0], w, a0);
            i[r][1] = _mm256_dpbusd_avx_epi32(i[r][1], w, a1);
        }
    }
    UNROLL_NT for (int r = 0; r < nt; r++) {
        const float *d = (const float *)(row[r] + (size_t)nb * 32);
        const __m256 dw = _mm256_broadcast_ss(d + b);
        _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++) {
            acc[r][o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[r][o]),
                                        _mm256_mul_ps(dw, _mm256_loadu_ps((const float *)(xb + GA_OFF_D + 32 * o))),
                                        acc[r][o]);
            if (f_min(f))
                acc[r][o] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + nb + b),
                                            _mm256_loadu_ps((const float *)(xb + GA_OFF_X + 32 * o)), acc[r][o]);
        }
    }
}

/* Blocks b0..b1-1 (b0 a multiple of 4) of a tile of nt rows, chain by
 * chain; st as in gemm_tile. */
TERN_INLINE_TARGET("avxvnni") void vnni_tile(const char *const *row, int nt, int64_t nb, int64_t b0, int64_t b1, const char *xg, int f,
                           float *st) {
    for (int j = 0; j < 4 && b0 + j < b1; j++) {
        __m256 acc[VNNI_NT][2];
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            acc[r][o] = _mm256_loadu_ps(st + 64 * r + 8 * (4 * o + j));
        for (int64_t b = b0 + j; b < b1; b += 4) vnni_blk(row, nt, nb, b, xg + (size_t)b * GA_BYTES, f, acc);
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            _mm256_storeu_ps(st + 64 * r + 8 * (4 * o + j), acc[r][o]);
    }
}

#define VNNI_TILE(name, F)                                                                                    \
    __attribute__((target("avxvnni"))) static void tile_##name##_vnni(const char *const *row, int nt, int64_t nb, \
                                                                      int64_t b0, int64_t b1, const char *xg,   \
                                                                      float *st) {                              \
        if (nt == 3)                                                                                            \
            vnni_tile(row, 3, nb, b0, b1, xg, F, st);                                                           \
        else if (nt == 2)                                                                                       \
            vnni_tile(row, 2, nb, b0, b1, xg, F, st);                                                           \
        else                                                                                                    \
            vnni_tile(row, 1, nb, b0, b1, xg, F, st);                                                           \
    }
_Static_assert(VNNI_NT == 3, "tile_*_vnni instantiate 3, 2 and 1 rows");
VNNI_TILE(q4_0, FMT_Q4_0)
VNNI_TILE(q4_1, FMT_Q4_1)
VNNI_TILE(q5_0, FMT_Q5_0)
VNNI_TILE(q5_1, FMT_Q5_1)
VNNI_TILE(q8_0, FMT_Q8_0)

/* Bytes of one prep group; 0 for a bad k or on overflow. */
TERN_INLINE size_t gemm_group_bytes(int64_t k, size_t ga) {
    if (k <= 0 || k % QK) return 0;
    const uint64_t nb = (uint64_t)(k / QK);
    if (nb > SIZE_MAX / (16 * ga)) return 0;
    return (size_t)nb * ga;
}
static size_t gemm_group_size(int64_t k) {
    return gemm_group_bytes(k, GA_BYTES);
}
static size_t gemm_group_size8(int64_t k) {
    return gemm_group_bytes(k, GA8_BYTES);
}

/* In-place transpose of an 8 x 8 matrix of dwords (r[i] = row i). */
TERN_INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* ncols (1..16) act rows into prep's layout of format f, block by block:
 * per octet the eight columns' [lo dwords | hi dwords] of the block,
 * transposed (k-slice t = elements 4t..4t+3 in dword c); Q8_0 weights: each
 * slice's byte pairs sign-extended (pairs 2t, 2t+1); then d and x. */
TERN_INLINE void gemm_prep(int64_t k, const void *xa, size_t st, int ncols, void *xg, int f, bool v) {
    const int64_t nb = k / QK;
    const int sh = v ? f_vsh(f) : f_sh(f);
    const size_t ga = f_ga(f, v);
    for (int64_t b = 0; b < nb; b++) {
        const size_t j = (size_t)(b % LEGACY_GROUP);
        const char *src = (const char *)xa + (size_t)(b / LEGACY_GROUP) * LEGACY_GROUP_BYTES;
        char *dst = (char *)xg + (size_t)b * ga;
        _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++) {
            __m256 r[8];
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                const char *a = src + (size_t)(8 * o + c) * st;
                r[c] = 8 * o + c < ncols ? _mm256_castsi256_ps(_mm256_loadu2_m128i(
                                               (const __m128i *)(a + LEGACY_OFF_HI + 16 * j),
                                               (const __m128i *)(a + LEGACY_OFF_LO + 16 * j)))
                                         : _mm256_setzero_ps();
            }
            transpose8(r);
            if (f == FMT_Q8_0 && !v) {
                /* per lane: [bytes 0..1 of its 4 dwords | bytes 2..3], then
                 * the qwords regrouped: low half = pair 2t of columns 0..7 */
                const __m256i sel = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4,
                                                     5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
                    const __m256i v = _mm256_permute4x64_epi64(
                        _mm256_shuffle_epi8(_mm256_castps_si256(r[t]), sel), 0xD8);
                    _mm256_storeu_si256((__m256i *)(dst + 512 * o + 64 * t),
                                        _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
                    _mm256_storeu_si256((__m256i *)(dst + 512 * o + 64 * t + 32),
                                        _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
                }
                continue;
            }
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) _mm256_storeu_ps(
                (float *)(dst + 256 * o + 32 * t), r[t]);
            if (sh && v) {
                /* int32 sums of each column's 32 quants (maddubs: int16
                 * pairs, |.| <= 8 * 254), times -2^sh */
                __m256i s = _mm256_setzero_si256();
                const __m256i one8 = _mm256_set1_epi8(1);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) s =
                    _mm256_add_epi16(s, _mm256_maddubs_epi16(one8, _mm256_castps_si256(r[t])));
                s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
                _mm256_storeu_si256((__m256i *)(dst + GA_OFF_X + 32 * o),
                                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, sh)));
            } else if (sh) {
                /* int16 pair sums of each dword over the 8 k-slices (|.| <= 16 * 127) */
                __m256i s = _mm256_setzero_si256();
                const __m256i one8 = _mm256_set1_epi8(1);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) s =
                    _mm256_add_epi16(s, _mm256_maddubs_epi16(one8, _mm256_castps_si256(r[t])));
                _mm256_storeu_si256((__m256i *)(dst + GA_OFF_X + 32 * o),
                                    _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s, sh)));
            }
        }
        float d[16], x[16];
        for (int c = 0; c < KERN_GEMM_GROUP; c++) {
            d[c] = x[c] = 0.0f;
            if (c >= ncols) continue;
            const char *a = src + (size_t)c * st;
            memcpy(&d[c], a + LEGACY_OFF_DEXP + 16 * j, sizeof(float));
            if (f_min(f)) memcpy(&x[c], a + LEGACY_OFF_NSUM + 16 * j, sizeof(float)); /* sexp */
        }
        memcpy(dst + (f == FMT_Q8_0 && !v ? GA8_OFF_D : GA_OFF_D), d, sizeof(d));
        if (f_min(f)) memcpy(dst + GA_OFF_X, x, sizeof(x));
    }
}

/* Loop order: row blocks (decoded once) > column groups > k-chunks > row
 * tiles > blocks. */
TERN_INLINE void gemm_run(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y,
                            int64_t ldy, void *scratch, int f, vnni_tile_fn vtile) {
    TERN_CHECK(legacy_fp16_lut[0x3c00] == 1.0f);
    const bool v = vtile != NULL;
    const int64_t k = a->k, nb = k / QK, rb = gemm_rows(k, f, v), kc = f_kc(f, v), nt = f_nt(f, v);
    const size_t rs = gemm_row_bytes(nb, f, v);
    char *dec = scratch;
    float *state = (float *)(dec + (size_t)rb * rs);
    const int64_t sf = GEMM_STATE / sizeof(float);
    /* Row tiles per row block: the next block's raw rows are prefetched
     * (into L2) a share per tile, so that its decode does not wait on
     * memory. */
    const int64_t calls = ((a->n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP) * ((nb + kc - 1) / kc) * ((rb + nt - 1) / nt);
    const size_t pf_step = ((size_t)rb * row_bytes / (size_t)calls + 63) & ~(size_t)63;
    for (int64_t r0 = 0; r0 < nrows; r0 += rb) {
        const int64_t nr = nrows - r0 < rb ? nrows - r0 : rb;
        for (int64_t r = 0; r < nr; r++)
            gemm_dec_row((const uint8_t *)w + (size_t)(r0 + r) * row_bytes, nb, dec + (size_t)r * rs, f, v);
        const int64_t rn = nrows - (r0 + nr) < rb ? nrows - (r0 + nr) : rb;
        const char *pf = (const char *)w + (size_t)(r0 + nr) * row_bytes, *pf_end = pf + (size_t)rn * row_bytes;
        for (int64_t c0 = 0; c0 < a->n; c0 += KERN_GEMM_GROUP) {
            const char *xg = (const char *)a->xg + (size_t)(c0 / KERN_GEMM_GROUP) * a->xg_group;
            const int ncols = a->n - c0 < KERN_GEMM_GROUP ? (int)(a->n - c0) : KERN_GEMM_GROUP;
            memset(state, 0, (size_t)nr * GEMM_STATE); /* every acc_j starts at +0 */
            for (int64_t b0 = 0; b0 < nb; b0 += kc) {
                const int64_t b1 = nb - b0 < kc ? nb : b0 + kc;
                for (int64_t r = 0; r < nr;) {
                    for (size_t o = 0; o < pf_step && pf < pf_end; o += 64, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
                    const int64_t n = nr - r >= nt ? nt : nr - r >= 2 ? 2 : 1; /* tiles of nt, 2 or 1 rows */
                    const char *rows[GEMM_NT];
                    _Pragma("GCC unroll 4") for (int i = 0; i < GEMM_NT; i++) rows[i] = dec + (size_t)(r + (i < n ? i : 0)) * rs;
                    if (v)
                        vtile(rows, (int)n, nb, b0, b1, xg, state + r * sf);
                    else if (n == nt)
                        gemm_tile(rows, (int)nt, nb, b0, b1, xg, f, state + r * sf);
                    else if (n == 2)
                        gemm_tile(rows, 2, nb, b0, b1, xg, f, state + r * sf);
                    else
                        gemm_tile(rows, 1, nb, b0, b1, xg, f, state + r * sf);
                    r += n;
                }
            }
            /* the row block's sums, column by column (contiguous in y) */
            for (int c = 0; c < ncols; c++) {
                const int o = c / 8, l = c % 8;
                for (int64_t r = 0; r < nr; r++) {
                    const float *s = state + r * sf + 32 * o + l;
                    y[(c0 + c) * ldy + r0 + r] = (s[0] + s[16]) + (s[8] + s[24]);
                }
            }
        }
    }
}

/* One kern_gemm_t per format: plain (vtile NULL) or AVX-VNNI (vtile =
 * the format's VNNI tile; v = true for the layout helpers). */
#define GEMM_FMT(name, F, gsize, v, vtile)                                                                   \
    static size_t scratch_##name(int64_t k) {                                                                \
        return gemm_scratch(k, F, v);                                                                        \
    }                                                                                                        \
    static void prep_##name(int64_t k, const void *xa, size_t st, int ncols, void *xg) {                    \
        gemm_prep(k, xa, st, ncols, xg, F, v);                                                               \
    }                                                                                                        \
    static void run_##name(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y, \
                           int64_t ldy, void *scratch) {                                                     \
        gemm_run(a, w, row_bytes, nrows, y, ldy, scratch, F, vtile);                                         \
    }                                                                                                        \
    static const kern_gemm_t gemm_##name = {gsize, prep_##name, scratch_##name, run_##name};

GEMM_FMT(q4_0, FMT_Q4_0, gemm_group_size, false, NULL)
GEMM_FMT(q4_1, FMT_Q4_1, gemm_group_size, false, NULL)
GEMM_FMT(q5_0, FMT_Q5_0, gemm_group_size, false, NULL)
GEMM_FMT(q5_1, FMT_Q5_1, gemm_group_size, false, NULL)
GEMM_FMT(q8_0, FMT_Q8_0, gemm_group_size8, false, NULL)
GEMM_FMT(q4_0_vnni, FMT_Q4_0, gemm_group_size, true, tile_q4_0_vnni)
GEMM_FMT(q4_1_vnni, FMT_Q4_1, gemm_group_size, true, tile_q4_1_vnni)
GEMM_FMT(q5_0_vnni, FMT_Q5_0, gemm_group_size, true, tile_q5_0_vnni)
GEMM_FMT(q5_1_vnni, FMT_Q5_1, gemm_group_size, true, tile_q5_1_vnni)
GEMM_FMT(q8_0_vnni, FMT_Q8_0, gemm_group_size, true, tile_q8_0_vnni)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* ---- activation quantizers ------------------------------------------------ */

/* round_q8(v) of each lane of v = x * id (legacy_ref.c's scalar: roundf,
 * half away from zero, clamped to [-127, 127], NaN -> 0), exactly:
 * trunc(v + copysign(0.49999997f, v)) equals roundf(v) for every float (the
 * largest float below one half never carries a fraction below one half up
 * to the next integer, and an exact half lands on it; legacy_avx512.c's
 * round_q8x16, checked over all 2^32 patterns). The empty asm keeps the
 * product a rounded float: GCC (-ffp-contract=fast) could otherwise fuse
 * the multiply into the add. */
TERN_INLINE __m256i round_q8x8(__m256 x, __m256 id) {
    __m256 v = _mm256_mul_ps(x, id);
    __asm__("" : "+x"(v));
    const __m256 half = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(0x1.fffffep-2f));
    __m256 r = _mm256_round_ps(_mm256_add_ps(v, half), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    r = _mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r);
}

/* One group of the act layout (legacy.h) from the n (1..4) blocks at x,
 * the bytes legacy_act_pack_group writes for the blocks quant_quantize_row
 * makes: d = amax / 127 (NaNs skipped: max_ps returns its second operand,
 * NaN-free, when either is NaN), q = round_q8(x * (1 / d)) (0 for d = 0), d
 * rounded to fp16 by vcvtps2ph (round to nearest even, as f32_to_fp16,
 * NaN and infinity included) and read back exactly; Q8_1's s =
 * fp16((float)sum(q) * d) with the float d; nsum from the quants; the
 * missing blocks zero. The four blocks' scales are computed together (one
 * division for d, one for 1 / d). Every field is written once, by vector
 * stores into the row (a group built on the stack and copied out stalled
 * on store forwarding). */
TERN_INLINE void act_group(const float *x, int n, char *g, bool q81) {
    const __m256 sign = _mm256_set1_ps(-0.0f), z = _mm256_setzero_ps();
    __m256 m[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        m[j] = z;
        if (j < n)
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) m[j] =
                _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 32 * j + 8 * v)), m[j]);
    }
    /* amax of block j in lane j (NaN-free from here on: max is exact in any
     * order) */
    const __m256 m01 = _mm256_max_ps(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));
    const __m256 m23 = _mm256_max_ps(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));
    const __m256 m4 = _mm256_max_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(m01), _mm256_castps_pd(m23))),
                                    _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(m01), _mm256_castps_pd(m23))));
    const __m128 amax = _mm_max_ps(_mm256_castps256_ps128(m4), _mm256_extractf128_ps(m4, 1));
    const __m128 d = _mm_div_ps(amax, _mm_set1_ps(127.0f));
    const __m128 id = _mm_and_ps(_mm_div_ps(_mm_set1_ps(1.0f), d), _mm_cmp_ps(d, _mm_setzero_ps(), _CMP_NEQ_UQ));
    const __m256 dh = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT)));
    _mm256_storeu_ps((float *)(g + LEGACY_OFF_DEXP), _mm256_permutevar8x32_ps(dh, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)));
    _mm256_storeu_ps((float *)(g + LEGACY_OFF_DEXP + 32),
                     _mm256_permutevar8x32_ps(dh, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)));
    __m128i part[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        __m128i lo = _mm_setzero_si128(), hi = lo;
        part[j] = lo;
        if (j < n) {
            const __m256 idj = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(id), _mm256_set1_epi32(j));
            __m256i q[4];
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) q[v] = round_q8x8(_mm256_loadu_ps(x + 32 * j + 8 * v), idj);
            /* packs work per 128-bit lane: fix the dword order afterwards */
            const __m256i qs = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            lo = _mm256_castsi256_si128(qs);
            hi = _mm256_extracti128_si256(qs, 1);
            /* lane m: the sum of quants 4m..4m+3 and 16+4m..16+4m+3 */
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qs), _mm256_set1_epi16(1));
            part[j] = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        }
        _mm_storeu_si128((__m128i *)(g + LEGACY_OFF_LO + 16 * j), lo);
        _mm_storeu_si128((__m128i *)(g + LEGACY_OFF_HI + 16 * j), hi);
        if (!q81) _mm_storeu_si128((__m128i *)(g + LEGACY_OFF_NSUM + 16 * j), _mm_sub_epi32(_mm_setzero_si128(), part[j]));
    }
    if (q81) {
        /* sum(q) of block j in lane j; s_j in lane 4j of sexp, zeros elsewhere */
        const __m128i sum = _mm_hadd_epi32(_mm_hadd_epi32(part[0], part[1]), _mm_hadd_epi32(part[2], part[3]));
        const __m128 sv = _mm_cvtph_ps(_mm_cvtps_ph(_mm_mul_ps(_mm_cvtepi32_ps(sum), d), _MM_FROUND_TO_NEAREST_INT));
        const __m256 s8 = _mm256_castps128_ps256(sv);
        const __m256 keep = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, 0, 0, -1, 0, 0, 0));
        _mm256_storeu_ps((float *)(g + LEGACY_OFF_NSUM),
                         _mm256_and_ps(_mm256_permutevar8x32_ps(s8, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)), keep));
        _mm256_storeu_ps((float *)(g + LEGACY_OFF_NSUM + 32),
                         _mm256_and_ps(_mm256_permutevar8x32_ps(s8, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)), keep));
    }
}

TERN_INLINE void act_row(const float *x, void *xa, int64_t k, bool q81) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK;
    char *out = xa;
    for (int64_t i = 0; i + LEGACY_GROUP <= nb; i += LEGACY_GROUP, out += LEGACY_GROUP_BYTES)
        act_group(x + i * QK, LEGACY_GROUP, out, q81);
    const int rem = (int)(nb % LEGACY_GROUP);
    if (rem) act_group(x + (nb - rem) * QK, rem, out, q81);
}

static void act_q8_0_avx2(const float *x, void *xa, int64_t k) {
    act_row(x, xa, k, false);
}

static void act_q8_1_avx2(const float *x, void *xa, int64_t k) {
    act_row(x, xa, k, true);
}

void legacy_register_blocks_avx2(kern_table_t t, const kern_options_t *o) {
    /* The AVX-VNNI GEMMs compute exactly what the plain ones do (exact
     * integer block sums, the same float steps), so the choice changes
     * speed, not results. */
    const bool vnni = o->avxvnni;
    t[TYPE_Q4_0][ISA_AVX2] = (kern_ops_t){dot_q4_0_avx2, act_q8_0_avx2, rows_q4_0_avx2, vnni ? &gemm_q4_0_vnni : &gemm_q4_0};
    t[TYPE_Q4_1][ISA_AVX2] = (kern_ops_t){dot_q4_1_avx2, act_q8_1_avx2, rows_q4_1_avx2, vnni ? &gemm_q4_1_vnni : &gemm_q4_1};
    t[TYPE_Q5_0][ISA_AVX2] = (kern_ops_t){dot_q5_0_avx2, act_q8_0_avx2, rows_q5_0_avx2, vnni ? &gemm_q5_0_vnni : &gemm_q5_0};
    t[TYPE_Q5_1][ISA_AVX2] = (kern_ops_t){dot_q5_1_avx2, act_q8_1_avx2, rows_q5_1_avx2, vnni ? &gemm_q5_1_vnni : &gemm_q5_1};
    t[TYPE_Q8_0][ISA_AVX2] = (kern_ops_t){dot_q8_0_avx2, act_q8_0_avx2, rows_q8_0_avx2, vnni ? &gemm_q8_0_vnni : &gemm_q8_0};
}

#endif /* __x86_64__ */
