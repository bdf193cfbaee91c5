/*
 * legacy_avx512.c - AVX-512 (F/BW/VL + VNNI) kernels of the 32-element block
 * formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: the dot (one weight row, 1..4
 * columns), the rows function (2..4 rows in lockstep, 1..2 columns, for the
 * matvec driver), a GEMM for many columns (kern_gemm_t), and the Q8_0 /
 * Q8_1 activation quantizers. legacy_ref.c holds the scalar oracle and
 * legacy.h the activation row layout that all ISAs share (unchanged here).
 *
 * THE FLOAT ORDER. Every AVX-512 kernel of a format computes, for a weight
 * row and an activation column with blocks b = 0 .. nb-1, exactly this:
 *
 *   I_b   = the exact int32 dot of block b's integer weights (Q4_0: q - 8,
 *           Q5_0: q - 16, Q4_1 / Q5_1: q, Q8_0: qs, -128 included) and the
 *           activation block's int8 quants (|I_b| <= 32 * 128 * 128 < 2^24:
 *           the conversion to float is exact);
 *   s_b   = d_w(b) * d_a(b)                   one float multiply, the weight
 *                                             scale as first operand;
 *   j     = b mod 4;
 *   acc_j = fma(float(I_b), s_b, acc_j);
 *   Q4_1 / Q5_1 only, right after:
 *   acc_j = fma(m_w(b), s_a(b), acc_j)        s_a = the Q8_1 block's s;
 *
 * with acc_0..acc_3 starting at +0.0f and blocks visited in increasing
 * order; the result is (acc_0 + acc_2) + (acc_1 + acc_3). Integer sums are
 * exact whatever their order, so each kernel forms I_b its own way; the
 * float operations are the same in all of them, which makes the dot, the
 * rows function (so kern_matvec and kern_matvec2) and the GEMM
 * bit-identical for every row and column, at any column count and thread
 * count (batch invariance). A zero-padded block (in a partial last group of
 * four) has I = 0 and zero scales: it adds fma(0, 0, acc_j), which leaves
 * acc_j as it is (acc_j is never -0: it starts at +0, and an exact zero
 * sum rounds to -0 only when both terms are -0), so the GEMM skips such
 * blocks where the dot and rows kernels compute them.
 *
 * How the kernels map that order onto vectors:
 *  - Weights are decoded four blocks (one group of legacy.h's act layout)
 *    at a time into two vectors of unsigned bytes: lo = quants 0..15 and
 *    hi = quants 16..31 of block j in 128-bit lane j, plus the fp16 scales
 *    (block j's d in words 4j..4j+3, m in 16+4j..16+4j+3). Per (row,
 *    column) two vpdpbusd against the group's lo / hi activation bytes give
 *    16 int32 partial sums, lane 4j+m = four products of block j. Signed
 *    weights need the unsigned operand of vpdpbusd: the offset formats use
 *    q as is and Q8_0 uses w + 128; the activation row's nsum (-(sum of
 *    a) per lane) shifted by log2(offset) is the start value that corrects
 *    it.
 *  - Rows function (matvec): for each column the four rows' partial sums
 *    are reduced and transposed at once (treduce4: unpack / add, 9 uops)
 *    into one vector holding I(row i, block j) in lane 4j+i. The rows' fp16
 *    scales are blended the same way (3 word blends) before one vcvtph2ps,
 *    so ONE convert, ONE multiply (by the act's d, which sits in lanes
 *    4j..4j+3) and ONE FMA serve 4 rows x 4 blocks: lane 4j+i of the
 *    accumulator is row i's acc_j.
 *  - Dot (one row): the same reduction over up to four columns (lane 4j+c
 *    = column c's acc_j, the columns' d and s blended into those lanes);
 *    with one column the four partial sums of each block are summed within
 *    the lane (lane_sum), every lane 4j..4j+3 then holding acc_j.
 *  - Both end with final4: lane i of the result is (v[i] + v[8+i]) +
 *    (v[4+i] + v[12+i]) = (acc_0 + acc_2) + (acc_1 + acc_3).
 *  - GEMM (n >= KERN_GEMM_MIN_COLS), lanes = 16 columns: prep lays out each
 *    group of 16 columns so that one vector holds the same 4-byte k-slice
 *    of all 16 columns, as unsigned bytes a + 128 (a 16 x 16 dword
 *    transpose per act group). run decodes panels of 4 weight rows into
 *    signed int8 plus, per (row, block), -128 * sum(w) and the float
 *    scales; then per (row, block) 8 vpdpbusd with the weights' dword as a
 *    broadcast operand give I = sum w (a + 128) - 128 sum w (the
 *    correction is the start value), and one add, one convert, one multiply
 *    and one FMA (two for the min formats) serve 16 columns x 32 products:
 *    acc[row][j] holds acc_j of the 16 columns, the same float steps as
 *    above. vpdpbusd bounds it (one per cycle, port 0, on the development
 *    machine: 512 MACs per row and block in 8 cycles). Rows are taken in row blocks of decoded panels
 *    (L2), columns in groups of 16, k in chunks of 32 blocks whose
 *    activations stay in L1 while every panel of the row block passes over
 *    them (accumulators saved between chunks: exact); the next row block's
 *    weights are prefetched into L2 during the compute.
 *
 * Scales come out of the weight bytes by one word permute (or a byte
 * permute with AVX512-VBMI, checked at registration, which also fetches the
 * quants) and vcvtph2ps (exact). The fifth bit of Q5 quants is applied
 * with byte masks straight from qh (k-registers), or with VBMI + GFNI by a
 * byte permute and an affine op (nibbles5_gf). The matvec weight streams
 * are prefetched PF_DIST ahead. Multi-column and multi-row calls unroll the
 * same per-lane steps over constant counts, so each column and row gets the
 * bits of a one-column, one-row call. The activation quantizers write the
 * act layout directly, the bytes of the scalar act fns.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/x86/avx512_util.h"
#include "kernels/legacy.h"

/* ---- weight groups: four blocks decoded into vectors ---------------------- */

/* A group is read whole (nblk = 4, a constant in the main loops) or, at
 * the end of a row, as its first nblk blocks with the rest read as zero
 * bytes: exactly what a zero-padded copy of the partial group would give,
 * without storing one (a copy made just before its 64-byte windows are
 * loaded costs a failed store forwarding per load, which at 18 blocks per
 * row halved the speed). Masked loads do not touch the bytes they skip. */

/* 16 bytes at p + j * bsz in 128-bit lane j, for the blocks j < nblk. */
TERN_INLINE __m128i load16_blk(const uint8_t *p, size_t bsz, int j, int nblk) {
    return j < nblk ? _mm_loadu_si128((const __m128i *)(p + (size_t)j * bsz)) : _mm_setzero_si128();
}
TERN_INLINE __m512i load4x16(const uint8_t *p, size_t bsz, int nblk) {
    __m512i v = _mm512_castsi128_si512(load16_blk(p, bsz, 0, nblk));
    v = _mm512_inserti32x4(v, load16_blk(p, bsz, 1, nblk), 1);
    v = _mm512_inserti32x4(v, load16_blk(p, bsz, 2, nblk), 2);
    return _mm512_inserti32x4(v, load16_blk(p, bsz, 3, nblk), 3);
}

/* The 64 bytes at w + off, those at or past w + valid read as zero. */
TERN_INLINE __m512i ld_win(const uint8_t *w, size_t off, size_t valid) {
    if (valid >= off + 64) return _mm512_loadu_si512(w + off);
    const size_t n = valid > off ? valid - off : 0;
    return _mm512_maskz_loadu_epi8((__mmask64)((1ull << n) - 1), w + off); /* n < 64 */
}

/* Byte masks of the fifth bits of four Q5 blocks (qh at p, stride bsz):
 * bit 16j+m of *lo = bit m of block j's qh, of *hi = bit 16+m. Each half
 * is its own 16-bit load, shifted once into place: a 32-bit load per block
 * split by shifts and masks took twice the scalar operations, and the Q5
 * rows kernels ran 2-6% slower in cache (docs/PERF.md). */
TERN_INLINE void qh_masks(const uint8_t *p, size_t bsz, int nblk, __mmask64 *lo, __mmask64 *hi) {
    uint64_t l = 0, h = 0;
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        uint16_t a = 0, b = 0;
        if (j < nblk) {
            memcpy(&a, p + (size_t)j * bsz, 2);
            memcpy(&b, p + (size_t)j * bsz + 2, 2);
        }
        l |= (uint64_t)a << (16 * j);
        h |= (uint64_t)b << (16 * j);
    }
    *lo = (__mmask64)l;
    *hi = (__mmask64)h;
}

/* One group of four weight blocks. */
typedef struct {
    __m512i lo, hi; /* unsigned quants: block j's 0..15 (lo) and 16..31 (hi) in 128-bit lane j */
    __m512i sc;     /* fp16 words: block j's d in words 4j..4j+3, its m (Q4_1 / Q5_1) in 16+4j..16+4j+3 */
} wgroup_t;

/* Every permute below reads two in-bounds 64-byte windows of the group
 * (G = 4 * block size = 72..136 bytes): win0 = bytes 0..63 and win1 =
 * bytes w1..w1+63, w1 = G - 64 (Q8_0: 64). The scales: one word permute of
 * the windows puts block j's fp16 d in words 4j..4j+3 (and its m in words
 * 16+4j..16+4j+3); far cheaper than scalar table reads spread by masked
 * broadcasts, whose loads miss L1 on real scales. */
enum { FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0, FMT_COUNT };
typedef struct {
    uint16_t sw[32];  /* word permute: scales (and mins) */
    uint8_t sb[64];   /* the same as a byte permute (VBMI) */
    uint16_t swc[32]; /* compact, for the GEMM decode: d_j in word j, m_j in 4+j */
    uint8_t sbc[64];  /* the same as a byte permute (VBMI) */
    uint8_t qs[64];  /* byte permute: quants 16j..16j+15 = block j's qs (VBMI) */
    uint8_t qs8[64]; /* Q8_0 quants 16..31, from windows at 8 and 72 (VBMI) */
    uint8_t qa[64];  /* Q5: byte permute giving nibbles5_gf's matrices (VBMI) */
    /* The bytes of each byte permute that come from the second window
     * (index bit 6), for perm2: */
    uint64_t msb, msbc, mqs, mqs8;
    uint64_t mqa0, mqa1; /* qa's bytes from the first / the second window (the rest: zero) */
} __attribute__((aligned(64))) perm_t; /* every element of g_perm 64-aligned (aligned vector loads) */
static perm_t g_perm[FMT_COUNT];
_Static_assert(sizeof(perm_t) % 64 == 0, "perm_t keeps its vectors aligned");

static const struct {
    size_t bsz, doff, moff, qoff; /* moff 0: no min */
} k_fmt[FMT_COUNT] = {
    {sizeof(block_q4_0), offsetof(block_q4_0, d), 0, offsetof(block_q4_0, qs)},
    {sizeof(block_q4_1), offsetof(block_q4_1, d), offsetof(block_q4_1, m), offsetof(block_q4_1, qs)},
    {sizeof(block_q5_0), offsetof(block_q5_0, d), 0, offsetof(block_q5_0, qs)},
    {sizeof(block_q5_1), offsetof(block_q5_1, d), offsetof(block_q5_1, m), offsetof(block_q5_1, qs)},
    {sizeof(block_q8_0), offsetof(block_q8_0, d), 0, offsetof(block_q8_0, qs)},
};

TERN_INLINE size_t win1(int f) {
    return f == FMT_Q8_0 ? 64 : 4 * k_fmt[f].bsz - 64;
}

/* Index of group byte o in the concatenation of windows at a0 and a1. */
static size_t win_index(size_t o, size_t a0, size_t a1) {
    TERN_CHECK(o >= a0 && (o < a0 + 64 || (o >= a1 && o < a1 + 64)));
    return o < a0 + 64 ? o - a0 : 64 + (o - a1);
}

static void perm_init(void) {
    for (int f = 0; f < FMT_COUNT; f++) {
        perm_t *p = &g_perm[f];
        const size_t bs = k_fmt[f].bsz, w1 = win1(f);
        memset(p, 0, sizeof(*p));
        for (size_t j = 0; j < 4; j++) {
            for (size_t m = 0; m < 4; m++) {
                const size_t d = win_index(j * bs + k_fmt[f].doff, 0, w1);
                p->sw[4 * j + m] = (uint16_t)(d / 2);
                p->sb[8 * j + 2 * m] = (uint8_t)d, p->sb[8 * j + 2 * m + 1] = (uint8_t)(d + 1);
                p->swc[j] = (uint16_t)(d / 2);
                p->sbc[2 * j] = (uint8_t)d, p->sbc[2 * j + 1] = (uint8_t)(d + 1);
                if (k_fmt[f].moff) {
                    const size_t mo = win_index(j * bs + k_fmt[f].moff, 0, w1);
                    p->sw[16 + 4 * j + m] = (uint16_t)(mo / 2);
                    p->sb[32 + 8 * j + 2 * m] = (uint8_t)mo, p->sb[32 + 8 * j + 2 * m + 1] = (uint8_t)(mo + 1);
                    p->swc[4 + j] = (uint16_t)(mo / 2);
                    p->sbc[8 + 2 * j] = (uint8_t)mo, p->sbc[8 + 2 * j + 1] = (uint8_t)(mo + 1);
                }
            }
            if (f == FMT_Q5_0 || f == FMT_Q5_1) {
                const size_t qh = f == FMT_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
                for (size_t h = 0; h < 2; h++) {
                    const size_t q = 2 * j + h;
                    const size_t lo = j * bs + qh + h, hi = lo + 2;
                    p->qa[8 * q + 3] = (uint8_t)win_index(lo, 0, w1);
                    p->qa[8 * q + 7] = (uint8_t)win_index(hi, 0, w1);
                    *(lo < 64 ? &p->mqa0 : &p->mqa1) |= 1ull << (8 * q + 3);
                    *(hi < 64 ? &p->mqa0 : &p->mqa1) |= 1ull << (8 * q + 7);
                }
            }
            for (size_t i = 0; i < 16; i++) {
                p->qs[16 * j + i] = (uint8_t)win_index(j * bs + k_fmt[f].qoff + i, 0, w1);
                if (f == FMT_Q8_0) p->qs8[16 * j + i] = (uint8_t)win_index(j * bs + k_fmt[f].qoff + 16 + i, 8, 72);
            }
        }
        for (int i = 0; i < 64; i++) {
            p->msb |= (uint64_t)(p->sb[i] >> 6) << i;
            p->msbc |= (uint64_t)(p->sbc[i] >> 6) << i;
            p->mqs |= (uint64_t)(p->qs[i] >> 6) << i;
            p->mqs8 |= (uint64_t)(p->qs8[i] >> 6) << i;
        }
        /* grp_vbmi_x reads the scales of these from the first window alone */
        if (f == FMT_Q4_0 || f == FMT_Q4_1) TERN_CHECK(p->msb == 0 && p->msbc == 0);
    }
}

/* Quants vector v (bytes 16j..16j+15 = block j's qs) -> unsigned quants. */
TERN_INLINE void nibbles(__m512i v, wgroup_t *g) {
    const __m512i m = _mm512_set1_epi8(15);
    g->lo = _mm512_and_si512(v, m);
    g->hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
}

TERN_INLINE void fifth_bits(const uint8_t *w, int f, int nblk, wgroup_t *g) {
    __mmask64 hl, hh;
    const size_t qh = f == FMT_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
    qh_masks(w + qh, k_fmt[f].bsz, nblk, &hl, &hh);
    const __m512i b4 = _mm512_set1_epi8(16);
    g->lo = _mm512_mask_add_epi8(g->lo, hl, g->lo, b4);
    g->hi = _mm512_mask_add_epi8(g->hi, hh, g->hi, b4);
}

/* Decode one group of format f (a constant after inlining), its first nblk
 * blocks (see load4x16); compact: the scales as the GEMM decode wants them
 * (words 0..3 = d_j, 4..7 = m_j). */
TERN_INLINE wgroup_t grp_plain_x(const uint8_t *w, int f, bool compact, int nblk) {
    wgroup_t g;
    const size_t valid = (size_t)nblk * k_fmt[f].bsz;
    g.sc = _mm512_permutex2var_epi16(ld_win(w, 0, valid), _mm512_load_si512(compact ? g_perm[f].swc : g_perm[f].sw),
                                     ld_win(w, win1(f), valid));
    const uint8_t *q = w + k_fmt[f].qoff;
    if (f == FMT_Q8_0) {
        const __m512i s = _mm512_set1_epi8((char)0x80); /* w + 128 */
        g.lo = _mm512_xor_si512(load4x16(q, k_fmt[f].bsz, nblk), s);
        g.hi = _mm512_xor_si512(load4x16(q + 16, k_fmt[f].bsz, nblk), s);
        return g;
    }
    nibbles(load4x16(q, k_fmt[f].bsz, nblk), &g);
    if (f == FMT_Q5_0 || f == FMT_Q5_1) fifth_bits(w, f, nblk, &g);
    return g;
}

/* AVX512-VBMI + GFNI (Ice Lake and later, Zen 4 and later): the quants too
 * come from the two windows by byte permutes, in place of a load and three
 * inserts, and the high nibbles take one GF(2) affine op in place of a shift
 * and a mask. Same values as grp_plain, so the choice changes speed, not
 * results. */
#define VBMI __attribute__((target("avx512vbmi,gfni")))

/* The two-window permute (index bit 6 picks b) as two one-window ones:
 * on the development machine (Sapphire Rapids class) a vpermt2b takes two
 * cycles of the shuffle port and a vpermb one, and a byte that comes from b
 * is often one of a few (mb: those bytes). */
TERN_INLINE_TARGET("avx512vbmi,gfni") __m512i perm2(__m512i a, __m512i b, const uint8_t *idx, uint64_t mb) {
    const __m512i i = _mm512_load_si512(idx);
    return _mm512_mask_permutexvar_epi8(_mm512_permutexvar_epi8(i, a), (__mmask64)mb, i, b);
}

/* Unsigned nibbles; the high ones by the affine map whose matrix moves
 * bits 4..7 of each byte to 0..3 (result bit i = parity of the source
 * byte AND matrix byte 7 - i). */
TERN_INLINE_TARGET("avx512vbmi,gfni") void nibbles_gf(__m512i v, wgroup_t *g) {
    g->lo = _mm512_and_si512(v, _mm512_set1_epi8(15));
    g->hi = _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(0x1020408000000000ll), 0);
}

/* Q5 quants from v (bytes 16j..16j+15 = block j's qs) and the group's
 * windows a, b, with no masks and no scalar work: a byte permute puts, in
 * qword 2j + h, qh_j's byte h (the fifth bits of block j's low quants
 * 8h..8h+7) in byte 3 and its byte 2 + h (those of the high quants) in
 * byte 7, zeros elsewhere. An affine op with that qword as the matrix maps
 * x = 1 << k (byte k of the qword) to a byte whose bit 4 is bit k of byte 3
 * and bit 0 bit k of byte 7: the fifth bits of quants 16j + 8h + k, low in
 * bit 4, high in bit 0 (moved to bit 4 by a shift). Against the scalar
 * qh_masks and masked adds: 2-3.5% faster at 2 threads over 1 GiB (fewer
 * loads on the weight stream), 0.95-1.01x in L2 (docs/PERF.md). */
TERN_INLINE_TARGET("avx512vbmi,gfni") void nibbles5_gf(__m512i v, __m512i a, __m512i b, const perm_t *pm, wgroup_t *g) {
    const __m512i i = _mm512_load_si512(pm->qa);
    const __m512i m = _mm512_mask_permutexvar_epi8(_mm512_maskz_permutexvar_epi8((__mmask64)pm->mqa0, i, a),
                                                   (__mmask64)pm->mqa1, i, b);
    const __m512i f = _mm512_gf2p8affine_epi64_epi8(_mm512_set1_epi64(0x8040201008040201ll), m, 0);
    g->lo = _mm512_ternarylogic_epi32(v, f, _mm512_set1_epi8(15), 0xe4); /* (v & 15) | (f & ~15) */
    const __m512i hn = _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(0x1020408000000000ll), 0);
    g->hi = _mm512_ternarylogic_epi32(hn, _mm512_slli_epi16(f, 4), _mm512_set1_epi8(16), 0xf8); /* hn | (f4 & 16) */
}

TERN_INLINE_TARGET("avx512vbmi,gfni") wgroup_t grp_vbmi_x(const uint8_t *w, int f, bool compact, int nblk) {
    wgroup_t g;
    const perm_t *pm = &g_perm[f];
    const size_t valid = (size_t)nblk * k_fmt[f].bsz;
    const __m512i a = ld_win(w, 0, valid), b = ld_win(w, win1(f), valid);
    if (f == FMT_Q4_0 || f == FMT_Q4_1) /* every scale in the first window (perm_init checks) */
        g.sc = _mm512_permutexvar_epi8(_mm512_load_si512(compact ? pm->sbc : pm->sb), a);
    else
        g.sc = compact ? perm2(a, b, pm->sbc, pm->msbc) : perm2(a, b, pm->sb, pm->msb);
    const __m512i v = perm2(a, b, pm->qs, pm->mqs);
    if (f == FMT_Q8_0) {
        const __m512i s = _mm512_set1_epi8((char)0x80);
        const __m512i v2 = perm2(ld_win(w, 8, valid), ld_win(w, 72, valid), pm->qs8, pm->mqs8);
        g.lo = _mm512_xor_si512(v, s);
        g.hi = _mm512_xor_si512(v2, s);
        return g;
    }
    if (f == FMT_Q5_0 || f == FMT_Q5_1)
        nibbles5_gf(v, a, b, pm, &g);
    else
        nibbles_gf(v, &g);
    return g;
}

/* Whole groups, and (_n) the first nblk blocks of a row's last group. */
TERN_INLINE wgroup_t grp_plain(const uint8_t *w, int f) {
    return grp_plain_x(w, f, false, 4);
}
TERN_INLINE wgroup_t grp_plain_n(const uint8_t *w, int f, int nblk) {
    return grp_plain_x(w, f, false, nblk);
}
TERN_INLINE wgroup_t gemm_grp_plain(const uint8_t *w, int f) {
    return grp_plain_x(w, f, true, 4);
}
TERN_INLINE wgroup_t gemm_grp_plain_n(const uint8_t *w, int f, int nblk) {
    return grp_plain_x(w, f, true, nblk);
}
TERN_INLINE_TARGET("avx512vbmi,gfni") wgroup_t grp_vbmi(const uint8_t *w, int f) {
    return grp_vbmi_x(w, f, false, 4);
}
TERN_INLINE_TARGET("avx512vbmi,gfni") wgroup_t grp_vbmi_n(const uint8_t *w, int f, int nblk) {
    return grp_vbmi_x(w, f, false, nblk);
}
TERN_INLINE_TARGET("avx512vbmi,gfni") wgroup_t gemm_grp_vbmi(const uint8_t *w, int f) {
    return grp_vbmi_x(w, f, true, 4);
}
TERN_INLINE_TARGET("avx512vbmi,gfni") wgroup_t gemm_grp_vbmi_n(const uint8_t *w, int f, int nblk) {
    return grp_vbmi_x(w, f, true, nblk);
}

/* ---- reductions ----------------------------------------------------------- */

/* The four dwords of each 128-bit lane summed, in every dword of it. */
TERN_INLINE __m512i lane_sum(__m512i p) {
    p = _mm512_add_epi32(p, _mm512_shuffle_epi32(p, _MM_PERM_BADC));
    return _mm512_add_epi32(p, _mm512_shuffle_epi32(p, _MM_PERM_CDAB));
}

/* Transposing reduction of four vectors of partial sums (p_i: lane 4j+m =
 * partial m of block j): lane 4j+i of the result = p_i's four lanes of
 * block j summed. 9 uops. */
TERN_INLINE __m512i treduce4(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    /* [a0 b0 a1 b1] + [a2 b2 a3 b3] = [a0+a2, b0+b2, a1+a3, b1+b3] per lane */
    const __m512i u01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    const __m512i u23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    /* [a0+a2, b0+b2, c0+c2, d0+d2] + [a1+a3, b1+b3, c1+c3, d1+d3] */
    return _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23));
}

/* Lane i (< 4) of the result: (v[i] + v[8+i]) + (v[4+i] + v[12+i]), i.e.
 * (acc_0 + acc_2) + (acc_1 + acc_3) of the chains in lanes 4j+i. */
TERN_INLINE __m128 final4(__m512 v) {
    const __m256 hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

TERN_INLINE __m512 scales_d(__m512i sc) {
    return _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
}

TERN_INLINE __m512 scales_m(__m512i sc) {
    return _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1));
}

/* Partial sums of one weight group against one column's group gi:
 * lane 4j+m = four products of block j, the offset corrected (sh: log2 of
 * the offset, 0: none). */
TERN_INLINE __m512i col_partial(const wgroup_t *g, int sh, const char *a) {
    __m512i p = sh ? _mm512_slli_epi32(_mm512_loadu_si512(a + LEGACY_OFF_NSUM), (unsigned)sh) : _mm512_setzero_si512();
    p = _mm512_dpbusd_epi32(p, g->lo, _mm512_loadu_si512(a + LEGACY_OFF_LO));
    return _mm512_dpbusd_epi32(p, g->hi, _mm512_loadu_si512(a + LEGACY_OFF_HI));
}

/* ---- dot: one row, 1..4 columns ------------------------------------------ */

/* One group, nc columns, into acc (lane 4j+c: column c's chain j; with one
 * column, lanes 4j..4j+3 all hold chain j). */
TERN_INLINE void dot_grp(const wgroup_t *g, int sh, bool min, const char *xa, size_t st, int64_t gi, int nc,
                           __m512 *acc) {
    __m512i p[4];
    __m512 da = _mm512_setzero_ps(), sa = _mm512_setzero_ps();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        if (c >= nc) {
            p[c] = _mm512_setzero_si512();
            continue;
        }
        const char *a = xa + (size_t)c * st + (size_t)gi * LEGACY_GROUP_BYTES;
        p[c] = col_partial(g, sh, a);
        const __mmask16 m = (__mmask16)(0x1111u << c);
        da = c == 0 ? _mm512_loadu_ps(a + LEGACY_OFF_DEXP) : _mm512_mask_loadu_ps(da, m, a + LEGACY_OFF_DEXP);
        if (min) {
            const __m512 s = _mm512_loadu_ps(a + LEGACY_OFF_NSUM); /* sexp: s in lane 4j */
            sa = c == 0 ? _mm512_permute_ps(s, 0) : _mm512_mask_permute_ps(sa, m, s, 0);
        }
    }
    const __m512i i = nc == 1 ? lane_sum(p[0]) : treduce4(p[0], p[1], p[2], p[3]);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(scales_d(g->sc), da), *acc);
    if (min) *acc = _mm512_fmadd_ps(scales_m(g->sc), sa, *acc);
}

/* A partial last group reads as zero-padded (zero scales and
 * quants: it adds exact zeros, see the header), so no weight past the row
 * is read. */
#define BLOCK_DOT(name, wblock, fmt, sh, min) BLOCK_DOT_A(, name, wblock, grp_plain, fmt, sh, min)
#define BLOCK_DOT_A(attr, name, wblock, grp, fmt, sh, min)                                                    \
    TERN_INLINE attr void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                        float *out) {                                                        \
        TERN_CHECK(k % QK == 0);                                                                             \
        const int64_t nb = k / QK, ng = nb / LEGACY_GROUP;                                                   \
        const size_t gb = LEGACY_GROUP * sizeof(wblock);                                                     \
        __m512 acc = _mm512_setzero_ps();                                                                    \
        int64_t gi = 0;                                                                                      \
        for (; gi + 2 <= ng; gi += 2) {                                                                      \
            const uint8_t *wp = (const uint8_t *)w + (size_t)gi * gb;                                        \
            for (size_t b = 0; b < 2 * gb; b += 64) prefetch_ahead((const char *)wp + b, 64);                \
            const wgroup_t g0 = grp(wp, fmt);                                                                \
            dot_grp(&g0, sh, min, xa, st, gi, nc, &acc);                                                     \
            const wgroup_t g1 = grp(wp + gb, fmt);                                                           \
            dot_grp(&g1, sh, min, xa, st, gi + 1, nc, &acc);                                                 \
        }                                                                                                    \
        if (gi < ng) {                                                                                       \
            const wgroup_t g0 = grp((const uint8_t *)w + (size_t)gi * gb, fmt);                              \
            dot_grp(&g0, sh, min, xa, st, gi, nc, &acc);                                                     \
            gi++;                                                                                            \
        }                                                                                                    \
        if (nb % LEGACY_GROUP) {                                                                             \
            const wgroup_t g0 = grp##_n((const uint8_t *)w + (size_t)gi * gb, fmt, (int)(nb % LEGACY_GROUP)); \
            dot_grp(&g0, sh, min, xa, st, gi, nc, &acc);                                                     \
        }                                                                                                    \
        float r[4];                                                                                          \
        _mm_storeu_ps(r, final4(acc));                                                                       \
        for (int c = 0; c < nc; c++) out[c] = r[c];                                                          \
    }

/* ---- rows: 2..4 rows in lockstep, 1..2 columns --------------------------- */

/* One group of nr rows (g[0..nr-1]) against nc columns: acc[c] lane 4j+i
 * = row i's chain j for column c. */
TERN_INLINE void rows_grp(const wgroup_t *g, int nr, int sh, bool min, const char *xa, size_t st, int64_t gi,
                            int nc, __m512 *acc) {
    /* Row i's scales into words 4j+i (and 16+4j+i): every row's vector
     * holds them in all four words of the block. */
    __m512i sc = g[0].sc;
    if (nr > 1) sc = _mm512_mask_blend_epi16(0x22222222u, sc, g[1].sc);
    if (nr > 2) sc = _mm512_mask_blend_epi16(0x44444444u, sc, g[2].sc);
    if (nr > 3) sc = _mm512_mask_blend_epi16(0x88888888u, sc, g[3].sc);
    const __m512 dw = scales_d(sc);
    _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {
        const char *a = xa + (size_t)c * st + (size_t)gi * LEGACY_GROUP_BYTES;
        __m512i p[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) p[r] = r < nr ? col_partial(&g[r], sh, a) : _mm512_setzero_si512();
        const __m512i i = treduce4(p[0], p[1], p[2], p[3]);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_loadu_ps(a + LEGACY_OFF_DEXP)), acc[c]);
        if (min)
            acc[c] = _mm512_fmadd_ps(scales_m(sc), _mm512_permute_ps(_mm512_loadu_ps(a + LEGACY_OFF_NSUM), 0), acc[c]);
    }
}

#define BLOCK_ROWS(name, wblock, fmt, sh, min) BLOCK_ROWS_A(, name, wblock, grp_plain, fmt, sh, min)
#define BLOCK_ROWS_A(attr, name, wblock, grp, fmt, sh, min)                                                   \
    TERN_INLINE attr void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                        size_t st, const int nc, float *out) {                                \
        TERN_CHECK(k % QK == 0);                                                                             \
        const int64_t nb = k / QK, ng = nb / LEGACY_GROUP;                                                   \
        const size_t gb = LEGACY_GROUP * sizeof(wblock);                                                     \
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};                                          \
        wgroup_t g[KERN_MAX_ROWS];                                                                           \
        int64_t gi = 0;                                                                                      \
        for (; gi + 2 <= ng; gi += 2) {                                                                      \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                           \
                const char *wp = (const char *)wr[r] + (size_t)gi * gb;                                      \
                for (size_t b = 0; b < 2 * gb; b += 64) prefetch_ahead(wp + b, 64);                          \
                g[r] = grp((const uint8_t *)wp, fmt);                                                        \
            }                                                                                                \
            rows_grp(g, nr, sh, min, xa, st, gi, nc, acc);                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++)                                             \
                g[r] = grp((const uint8_t *)wr[r] + (size_t)(gi + 1) * gb, fmt);                             \
            rows_grp(g, nr, sh, min, xa, st, gi + 1, nc, acc);                                               \
        }                                                                                                    \
        if (gi < ng) {                                                                                       \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++)                                             \
                g[r] = grp((const uint8_t *)wr[r] + (size_t)gi * gb, fmt);                                   \
            rows_grp(g, nr, sh, min, xa, st, gi, nc, acc);                                                   \
            gi++;                                                                                            \
        }                                                                                                    \
        if (nb % LEGACY_GROUP) {                                                                             \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++)                                             \
                g[r] = grp##_n((const uint8_t *)wr[r] + (size_t)gi * gb, fmt, (int)(nb % LEGACY_GROUP));     \
            rows_grp(g, nr, sh, min, xa, st, gi, nc, acc);                                                   \
        }                                                                                                    \
        _Pragma("GCC unroll 2") for (int c = 0; c < nc; c++) {                                               \
            float r[4];                                                                                      \
            _mm_storeu_ps(r, final4(acc[c]));                                                                \
            for (int i = 0; i < nr; i++) out[i * nc + c] = r[i];                                             \
        }                                                                                                    \
    }

/* ---- the entry points of dot and rows ------------------------------------- */

BLOCK_DOT(q4_0, block_q4_0, FMT_Q4_0, 3, false)
BLOCK_DOT(q4_1, block_q4_1, FMT_Q4_1, 0, true)
BLOCK_DOT(q5_0, block_q5_0, FMT_Q5_0, 4, false)
BLOCK_DOT(q5_1, block_q5_1, FMT_Q5_1, 0, true)
BLOCK_DOT(q8_0, block_q8_0, FMT_Q8_0, 7, false)

COLS_ENTRY(dot_q4_0_avx512, q4_0_cols)
COLS_ENTRY(dot_q4_1_avx512, q4_1_cols)
COLS_ENTRY(dot_q5_0_avx512, q5_0_cols)
COLS_ENTRY(dot_q5_1_avx512, q5_1_cols)
COLS_ENTRY(dot_q8_0_avx512, q8_0_cols)

BLOCK_DOT_A(VBMI, q4_0_vbmi, block_q4_0, grp_vbmi, FMT_Q4_0, 3, false)
BLOCK_DOT_A(VBMI, q4_1_vbmi, block_q4_1, grp_vbmi, FMT_Q4_1, 0, true)
BLOCK_DOT_A(VBMI, q5_0_vbmi, block_q5_0, grp_vbmi, FMT_Q5_0, 4, false)
BLOCK_DOT_A(VBMI, q5_1_vbmi, block_q5_1, grp_vbmi, FMT_Q5_1, 0, true)
BLOCK_DOT_A(VBMI, q8_0_vbmi, block_q8_0, grp_vbmi, FMT_Q8_0, 7, false)

COLS_ENTRY_A(VBMI, dot_q4_0_vbmi, q4_0_vbmi_cols)
COLS_ENTRY_A(VBMI, dot_q4_1_vbmi, q4_1_vbmi_cols)
COLS_ENTRY_A(VBMI, dot_q5_0_vbmi, q5_0_vbmi_cols)
COLS_ENTRY_A(VBMI, dot_q5_1_vbmi, q5_1_vbmi_cols)
COLS_ENTRY_A(VBMI, dot_q8_0_vbmi, q8_0_vbmi_cols)

BLOCK_ROWS(q4_0, block_q4_0, FMT_Q4_0, 3, false)
BLOCK_ROWS(q4_1, block_q4_1, FMT_Q4_1, 0, true)
BLOCK_ROWS(q5_0, block_q5_0, FMT_Q5_0, 4, false)
BLOCK_ROWS(q5_1, block_q5_1, FMT_Q5_1, 0, true)
BLOCK_ROWS(q8_0, block_q8_0, FMT_Q8_0, 7, false)

ROWS_ENTRY(rows_q4_0_avx512, q4_0_rows, dot_q4_0_avx512)
ROWS_ENTRY(rows_q4_1_avx512, q4_1_rows, dot_q4_1_avx512)
ROWS_ENTRY(rows_q5_0_avx512, q5_0_rows, dot_q5_0_avx512)
ROWS_ENTRY(rows_q5_1_avx512, q5_1_rows, dot_q5_1_avx512)
ROWS_ENTRY(rows_q8_0_avx512, q8_0_rows, dot_q8_0_avx512)

BLOCK_ROWS_A(VBMI, q4_0_vbmi, block_q4_0, grp_vbmi, FMT_Q4_0, 3, false)
BLOCK_ROWS_A(VBMI, q4_1_vbmi, block_q4_1, grp_vbmi, FMT_Q4_1, 0, true)
BLOCK_ROWS_A(VBMI, q5_0_vbmi, block_q5_0, grp_vbmi, FMT_Q5_0, 4, false)
BLOCK_ROWS_A(VBMI, q5_1_vbmi, block_q5_1, grp_vbmi, FMT_Q5_1, 0, true)
BLOCK_ROWS_A(VBMI, q8_0_vbmi, block_q8_0, grp_vbmi, FMT_Q8_0, 7, false)

ROWS_ENTRY_A(VBMI, rows_q4_0_vbmi, q4_0_vbmi_rows, dot_q4_0_vbmi)
ROWS_ENTRY_A(VBMI, rows_q4_1_vbmi, q4_1_vbmi_rows, dot_q4_1_vbmi)
ROWS_ENTRY_A(VBMI, rows_q5_0_vbmi, q5_0_vbmi_rows, dot_q5_0_vbmi)
ROWS_ENTRY_A(VBMI, rows_q5_1_vbmi, q5_1_vbmi_rows, dot_q5_1_vbmi)
ROWS_ENTRY_A(VBMI, rows_q8_0_vbmi, q8_0_vbmi_rows, dot_q8_0_vbmi)

/* ---- GEMM ------------------------------------------------------------------ */

/* prep's activations: one group of KERN_GEMM_GROUP = 16 columns, per block
 * b of the row GA_Q8_0 (act type Q8_0) or GA_Q8_1 (Q8_1) bytes:
 *   uint8 q[8][16][4]  q[t][c] = column c's quants 4t..4t+3 of block b,
 *                      each + 128 (q ^ 0x80: the unsigned operand)
 *   float d[16]        column c's d of block b
 *   float s[16]        column c's s of block b (Q8_1 only)
 * Columns past the last are zeros (computed on, never stored). */
enum { GA_OFF_D = 512, GA_OFF_S = 576, GA_Q8_0 = 576, GA_Q8_1 = 640 };

/* run's decoded weights: panels of 4 rows, per group of four blocks
 * GP_BYTES:
 *   int8  q[4][2][4][16]  row i's signed weights (Q4_0 q - 8, Q5_0 q - 16,
 *                         Q4_1 / Q5_1 q, Q8_0 qs): q[i][0][j] = block j's
 *                         elements 0..15, q[i][1][j] = its elements 16..31
 *                         (the decoded lo / hi vectors as they are)
 *   int32 corr[4][4]      corr[i][j] = -128 * sum of row i's block j (the
 *                         start value that takes the +128 of the
 *                         activations back out)
 *   float dm[4][8]        row i: d of blocks 0..3, then m of blocks 0..3
 * A panel holds every group of its four rows (row i's data at offsets
 * 128i, 512 + 16i, 576 + 32i of each group); rows past the last are zeros.
 * The panels of a row block (gemm_rows rows) follow each other in the
 * scratch, then the saved accumulators of each panel (GEMM_STATE bytes). */
enum { GP_OFF_CORR = 512, GP_OFF_DM = 576, GP_BYTES = 704, GEMM_STATE = 16 * 64 };
_Static_assert(GP_BYTES % 64 == 0 && GA_Q8_0 % 64 == 0 && GA_Q8_1 % 64 == 0, "GEMM layouts keep vectors aligned");

/* Bytes of decoded weight rows per row block: the block stays in L2 while
 * every group of columns passes over it. */
#define GEMM_PANEL_BYTES (192 * 1024)
/* Groups of four blocks per k-chunk: 32 blocks of one column group's
 * activations (18..20 KB) stay in L1 while the panels of a row block pass
 * over them; the accumulators are saved between chunks (exact). */
#define GEMM_KC 8

/* Decode one weight group (four blocks, format offset off; scales from
 * the compact permute) into row i of panel group pg. */
TERN_INLINE void gemm_dec_grp(const wgroup_t *g, int off, char *pg, int i) {
    const __m512i vo = _mm512_set1_epi8((char)off), n128 = _mm512_set1_epi8(-128);
    _mm512_store_si512(pg + 128 * i, _mm512_sub_epi8(g->lo, vo));
    _mm512_store_si512(pg + 128 * i + 64, _mm512_sub_epi8(g->hi, vo));
    /* -128 * sum(w) = 32 * 128 * off - 128 * sum(q): vpdpbusd of the
     * unsigned quants with -128 gives lane 4j+m = -128 * (8 of block j's
     * quants) + 1024 * off, lane_sum adds block j's four lanes. */
    __m512i c = _mm512_dpbusd_epi32(_mm512_set1_epi32(1024 * off), g->lo, n128);
    c = lane_sum(_mm512_dpbusd_epi32(c, g->hi, n128));
    _mm_store_si128((__m128i *)(pg + GP_OFF_CORR + 16 * i),
                    _mm512_castsi512_si128(_mm512_permutexvar_epi32(
                        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c)));
    /* d_0..3, m_0..3 */
    _mm256_store_ps((float *)(pg + GP_OFF_DM + 32 * i), _mm256_cvtph_ps(_mm512_castsi512_si128(g->sc)));
}

/* Decode one panel: rows w[0..nr-1] (nr 1..4; nb blocks each), group by
 * group, so the panel is written sequentially; rows past nr are zeros. A
 * partial last group reads as zero-padded, as in the dot. */
typedef void (*gemm_dec_fn)(const uint8_t *const *w, int nr, int64_t nb, char *pan);
#define GEMM_DEC(attr, name, wblock, grp, fmt, off)                                                   \
    attr static void name(const uint8_t *const *w, int nr, int64_t nb, char *pan) {                 \
        const int64_t ng = nb / LEGACY_GROUP;                                                          \
        const size_t gb = LEGACY_GROUP * sizeof(wblock);                                               \
        const int64_t ngt = ng + (nb % LEGACY_GROUP != 0);                                             \
        for (int i = nr; i < 4; i++) gemm_zero_row(pan, ngt, i);                                       \
        int64_t gi = 0;                                                                                \
        for (; gi < ng; gi++) {                                                                        \
            for (int i = 0; i < nr; i++) {                                                             \
                const wgroup_t g = grp(w[i] + (size_t)gi * gb, fmt);                                   \
                gemm_dec_grp(&g, off, pan + (size_t)gi * GP_BYTES, i);                                 \
            }                                                                                          \
        }                                                                                              \
        if (nb % LEGACY_GROUP) {                                                                       \
            for (int i = 0; i < nr; i++) {                                                             \
                const wgroup_t g = grp##_n(w[i] + (size_t)gi * gb, fmt, (int)(nb % LEGACY_GROUP));     \
                gemm_dec_grp(&g, off, pan + (size_t)gi * GP_BYTES, i);                                 \
            }                                                                                          \
        }                                                                                              \
    }

static void gemm_zero_row(char *pan, int64_t ng, int i) {
    for (int64_t gi = 0; gi < ng; gi++) {
        char *pg = pan + (size_t)gi * GP_BYTES;
        memset(pg + 128 * i, 0, 128);
        memset(pg + GP_OFF_CORR + 16 * i, 0, 16);
        memset(pg + GP_OFF_DM + 32 * i, 0, 32);
    }
}

GEMM_DEC(, dec_q4_0, block_q4_0, gemm_grp_plain, FMT_Q4_0, 8)
GEMM_DEC(, dec_q4_1, block_q4_1, gemm_grp_plain, FMT_Q4_1, 0)
GEMM_DEC(, dec_q5_0, block_q5_0, gemm_grp_plain, FMT_Q5_0, 16)
GEMM_DEC(, dec_q5_1, block_q5_1, gemm_grp_plain, FMT_Q5_1, 0)
GEMM_DEC(, dec_q8_0, block_q8_0, gemm_grp_plain, FMT_Q8_0, 128)
GEMM_DEC(VBMI, dec_q4_0_vbmi, block_q4_0, gemm_grp_vbmi, FMT_Q4_0, 8)
GEMM_DEC(VBMI, dec_q4_1_vbmi, block_q4_1, gemm_grp_vbmi, FMT_Q4_1, 0)
GEMM_DEC(VBMI, dec_q5_0_vbmi, block_q5_0, gemm_grp_vbmi, FMT_Q5_0, 16)
GEMM_DEC(VBMI, dec_q5_1_vbmi, block_q5_1, gemm_grp_vbmi, FMT_Q5_1, 0)
GEMM_DEC(VBMI, dec_q8_0_vbmi, block_q8_0, gemm_grp_vbmi, FMT_Q8_0, 128)

TERN_INLINE int32_t ld_i32(const char *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

TERN_INLINE float ld_f32(const char *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Block j of panel group pg against the 16 columns' block at xb: for each
 * of the 4 rows, 8 vpdpbusd (the row's weight dwords broadcast, two
 * chains for latency), then acc[i][j] = fma(float(I), d_w * d_a, acc[i][j])
 * (and fma(m_w, s_a, .) for the min formats): the header's order. */
TERN_INLINE void gemm_blk(const char *pg, int j, const char *xb, bool min, __m512 acc[4][4]) {
    __m512i a[8];
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) a[t] = _mm512_loadu_si512(xb + 64 * t);
    const __m512 da = _mm512_loadu_ps(xb + GA_OFF_D);
    const __m512 sa = min ? _mm512_loadu_ps(xb + GA_OFF_S) : _mm512_setzero_ps();
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        /* k-slice t of block j: elements 4t..4t+3, in lo (t < 4) or hi */
        const char *q = pg + 128 * i + 16 * j;
        __m512i p = _mm512_set1_epi32(ld_i32(pg + GP_OFF_CORR + 16 * i + 4 * j)), r = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
            p = _mm512_dpbusd_epi32(p, a[t], _mm512_set1_epi32(ld_i32(q + 4 * t)));
            r = _mm512_dpbusd_epi32(r, a[4 + t], _mm512_set1_epi32(ld_i32(q + 64 + 4 * t)));
        }
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(ld_f32(pg + GP_OFF_DM + 32 * i + 4 * j)), da);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p, r)), s, acc[i][j]);
        if (min) acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(ld_f32(pg + GP_OFF_DM + 32 * i + 16 + 4 * j)), sa, acc[i][j]);
    }
}

/* Rows of a row block: decoded bytes within GEMM_PANEL_BYTES, a multiple
 * of 4, 4..64. */
static int64_t gemm_rows(int64_t k) {
    const int64_t ng = (k / QK + LEGACY_GROUP - 1) / LEGACY_GROUP;
    int64_t rb = GEMM_PANEL_BYTES / (ng * (GP_BYTES / 4) + 1);
    rb &= ~(int64_t)3;
    return rb < 4 ? 4 : rb > 64 ? 64 : rb;
}

static size_t gemm_scratch_size(int64_t k) {
    const int64_t ng = (k / QK + LEGACY_GROUP - 1) / LEGACY_GROUP;
    return (size_t)(gemm_rows(k) / 4) * ((size_t)ng * GP_BYTES + GEMM_STATE);
}

/* Bytes of one prep group; 0 for a bad k, or one whose run scratch would
 * overflow. */
static size_t gemm_group_size(int64_t k, size_t per_block) {
    if (k <= 0 || k % QK) return 0;
    const uint64_t nb = (uint64_t)(k / QK);
    if (nb > SIZE_MAX / (16 * GP_BYTES)) return 0;
    return (size_t)nb * per_block;
}

static size_t gsize_q8_0(int64_t k) {
    return gemm_group_size(k, GA_Q8_0);
}

static size_t gsize_q8_1(int64_t k) {
    return gemm_group_size(k, GA_Q8_1);
}

/* In-place transpose of a 16 x 16 matrix of dwords (r[i] = row i). */
TERN_INLINE void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    /* t[2i], t[2i+1]: rows 2i, 2i+1 interleaved by dword */
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i+k], 128-bit lane L: rows 4i..4i+3 of column 4L+k */
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* column 4L+k = lane L of u[k], u[4+k], u[8+k], u[12+k] */
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const __m512i a0 = _mm512_shuffle_i32x4(u[k], u[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i a1 = _mm512_shuffle_i32x4(u[k], u[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i b0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i b1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
        r[k] = _mm512_shuffle_i32x4(a0, b0, _MM_SHUFFLE(2, 0, 2, 0));
        r[8 + k] = _mm512_shuffle_i32x4(a0, b0, _MM_SHUFFLE(3, 1, 3, 1));
        r[4 + k] = _mm512_shuffle_i32x4(a1, b1, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + k] = _mm512_shuffle_i32x4(a1, b1, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* One group of ncols (1..16) act rows into prep's layout, one act group
 * (four blocks) at a time: the 16 columns' lo (then hi) vectors, flipped
 * to unsigned, transposed by dword, give q[t] of blocks 0..3 (dword 4j+t
 * of lo is block j's elements 4t..4t+3). */
TERN_INLINE void gemm_prep(int64_t k, const void *xa, size_t st, int ncols, void *xg, bool q81) {
    const int64_t nb = k / QK;
    const size_t ab = q81 ? GA_Q8_1 : GA_Q8_0;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t gi = 0; gi * LEGACY_GROUP < nb; gi++) {
        const int nbk = nb - gi * LEGACY_GROUP < LEGACY_GROUP ? (int)(nb - gi * LEGACY_GROUP) : LEGACY_GROUP;
        const char *src = (const char *)xa + (size_t)gi * LEGACY_GROUP_BYTES;
        char *dst = (char *)xg + (size_t)gi * LEGACY_GROUP * ab;
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m512i r[16];
            _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) r[c] =
                c < ncols ? _mm512_xor_si512(_mm512_loadu_si512(src + (size_t)c * st + (h ? LEGACY_OFF_HI : LEGACY_OFF_LO)), flip)
                          : _mm512_setzero_si512();
            transpose16(r);
            for (int j = 0; j < nbk; j++)
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
                    _mm512_storeu_si512(dst + (size_t)j * ab + 64 * (4 * h + t), r[4 * j + t]);
        }
        for (int j = 0; j < nbk; j++) {
            float d[16], s[16];
            for (int c = 0; c < KERN_GEMM_GROUP; c++) {
                d[c] = s[c] = 0.0f;
                if (c >= ncols) continue;
                memcpy(&d[c], src + (size_t)c * st + LEGACY_OFF_DEXP + 16 * j, sizeof(float)); /* lane 4j */
                memcpy(&s[c], src + (size_t)c * st + LEGACY_OFF_NSUM + 16 * j, sizeof(float)); /* sexp (Q8_1) */
            }
            memcpy(dst + (size_t)j * ab + GA_OFF_D, d, sizeof(d));
            if (q81) memcpy(dst + (size_t)j * ab + GA_OFF_S, s, sizeof(s));
        }
    }
}

static void prep_q8_0(int64_t k, const void *xa, size_t st, int ncols, void *xg) {
    gemm_prep(k, xa, st, ncols, xg, false);
}

static void prep_q8_1(int64_t k, const void *xa, size_t st, int ncols, void *xg) {
    gemm_prep(k, xa, st, ncols, xg, true);
}

/* The 4 rows of an accumulator tile (nrv valid) into y, columns c0.. */
TERN_INLINE void gemm_store(__m512 acc[4][4], float *y, int64_t ldy, int64_t c0, int ncols, int nrv) {
    float t[4][16] __attribute__((aligned(64)));
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) _mm512_store_ps(
        t[i], _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3])));
    for (int c = 0; c < ncols; c++) {
        float *yc = y + (c0 + c) * ldy;
        for (int i = 0; i < nrv; i++) yc[i] = t[i][c];
    }
}

/* Loop order: row blocks (decoded once) > column groups > k-chunks >
 * panels of 4 rows > groups of 4 blocks > blocks. */
TERN_INLINE void gemm_run(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y,
                            int64_t ldy, void *scratch, gemm_dec_fn dec, bool min) {
    const int64_t k = a->k, nb = k / QK, ng = (nb + LEGACY_GROUP - 1) / LEGACY_GROUP;
    const int rem = (int)(nb % LEGACY_GROUP);
    const size_t ab = min ? GA_Q8_1 : GA_Q8_0, pan_bytes = (size_t)ng * GP_BYTES;
    const int64_t rb = gemm_rows(k);
    char *pans = scratch;
    float *state = (float *)(pans + (size_t)(rb / 4) * pan_bytes);
    for (int64_t r0 = 0; r0 < nrows; r0 += rb) {
        const int64_t nr = nrows - r0 < rb ? nrows - r0 : rb, np = (nr + 3) / 4;
        for (int64_t p = 0; p < np; p++) {
            const uint8_t *wr[4];
            const int nrp = nr - 4 * p < 4 ? (int)(nr - 4 * p) : 4;
            for (int i = 0; i < nrp; i++) wr[i] = (const uint8_t *)w + (size_t)(r0 + 4 * p + i) * row_bytes;
            dec(wr, nrp, nb, pans + (size_t)p * pan_bytes);
        }
        /* The next row block's weights go to L2 while this one computes
         * (its decode would otherwise wait on memory): a share of its
         * lines before each panel's k-chunk. */
        const int64_t nr2 = nrows - r0 - nr < rb ? nrows - r0 - nr : rb;
        uintptr_t pf = (uintptr_t)w + (size_t)(r0 + nr) * row_bytes;
        const uintptr_t pf_end = nr2 > 0 ? pf + (size_t)nr2 * row_bytes : pf;
        const int64_t calls = (a->n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP * ((ng + GEMM_KC - 1) / GEMM_KC) * np;
        const size_t pf_step = ((pf_end - pf) / 64 / (size_t)calls + 1) * 64;
        for (int64_t c0 = 0; c0 < a->n; c0 += KERN_GEMM_GROUP) {
            const char *xg = (const char *)a->xg + (size_t)(c0 / KERN_GEMM_GROUP) * a->xg_group;
            const int ncols = a->n - c0 < KERN_GEMM_GROUP ? (int)(a->n - c0) : KERN_GEMM_GROUP;
            for (int64_t g0 = 0; g0 < ng; g0 += GEMM_KC) {
                const int64_t g1 = ng - g0 < GEMM_KC ? ng : g0 + GEMM_KC;
                for (int64_t p = 0; p < np; p++) {
                    float *st = state + p * (GEMM_STATE / sizeof(float));
                    const char *pan = pans + (size_t)p * pan_bytes;
                    for (const uintptr_t e = pf + pf_step < pf_end ? pf + pf_step : pf_end; pf < e; pf += 64)
                        _mm_prefetch((const char *)pf, _MM_HINT_T1);
                    __m512 acc[4][4];
                    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i / 4][i % 4] =
                        g0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(st + 16 * i);
                    for (int64_t gi = g0; gi < g1; gi++) {
                        const char *pg = pan + (size_t)gi * GP_BYTES, *xb = xg + (size_t)gi * LEGACY_GROUP * ab;
                        const int nbk = gi == ng - 1 && rem ? rem : 4;
                        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nbk) gemm_blk(pg, j, xb + j * ab, min, acc);
                    }
                    if (g1 < ng) {
                        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) _mm512_store_ps(st + 16 * i, acc[i / 4][i % 4]);
                    } else {
                        const int nrv = nr - 4 * p < 4 ? (int)(nr - 4 * p) : 4;
                        gemm_store(acc, y + r0 + 4 * p, ldy, c0, ncols, nrv);
                    }
                }
            }
        }
    }
}

#define GEMM_RUN(attr, name, dec, min)                                                                      \
    attr static void name(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y, \
                          int64_t ldy, void *scratch) {                                                       \
        gemm_run(a, w, row_bytes, nrows, y, ldy, scratch, dec, min);                                          \
    }

GEMM_RUN(, run_q4_0, dec_q4_0, false)
GEMM_RUN(, run_q4_1, dec_q4_1, true)
GEMM_RUN(, run_q5_0, dec_q5_0, false)
GEMM_RUN(, run_q5_1, dec_q5_1, true)
GEMM_RUN(, run_q8_0, dec_q8_0, false)
GEMM_RUN(, run_q4_0_vbmi, dec_q4_0_vbmi, false)
GEMM_RUN(, run_q4_1_vbmi, dec_q4_1_vbmi, true)
GEMM_RUN(, run_q5_0_vbmi, dec_q5_0_vbmi, false)
GEMM_RUN(, run_q5_1_vbmi, dec_q5_1_vbmi, true)
GEMM_RUN(, run_q8_0_vbmi, dec_q8_0_vbmi, false)

static const kern_gemm_t gemm_q4_0 = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q4_0};
static const kern_gemm_t gemm_q4_1 = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q4_1};
static const kern_gemm_t gemm_q5_0 = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q5_0};
static const kern_gemm_t gemm_q5_1 = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q5_1};
static const kern_gemm_t gemm_q8_0 = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q8_0};
static const kern_gemm_t gemm_q4_0_vbmi = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q4_0_vbmi};
static const kern_gemm_t gemm_q4_1_vbmi = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q4_1_vbmi};
static const kern_gemm_t gemm_q5_0_vbmi = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q5_0_vbmi};
static const kern_gemm_t gemm_q5_1_vbmi = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q5_1_vbmi};
static const kern_gemm_t gemm_q8_0_vbmi = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q8_0_vbmi};

/* ---- activation quantizers ------------------------------------------------ */

/* roundq8(x * id) of each lane: the product rounded to float, then roundf
 * (half away from zero) clamped to [-127, 127], NaN -> 0, exactly the
 * scalar round_q8(x * id). trunc(v + copysign(0.49999997f, v)) equals
 * roundf(v) for every float (checked exhaustively over all 2^32 bit
 * patterns when this was written): the largest float below 0.5 never
 * carries a fraction below one half up to the next integer, and an exact
 * half lands on (or ties to) it. The multiply and add use the explicit
 * rounding forms (round to nearest, the default), which the compiler never
 * fuses into an FMA (the file is built with GCC's -ffp-contract=fast). */
TERN_INLINE __m512i round_q8x16(__m512 x, __m512 id) {
#define RN_SAE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    const __m512 v = _mm512_mul_round_ps(x, id, RN_SAE);
    const __m512 half = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_set1_epi32((int)0x80000000u), _mm512_castps_si512(v), _mm512_castps_si512(_mm512_set1_ps(0.49999997f)),
        0xEA)); /* (sign bit & v) | 0.49999997f */
    __m512 r = _mm512_roundscale_ps(_mm512_add_round_ps(v, half, RN_SAE), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), r);
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    return _mm512_cvttps_epi32(r);
#undef RN_SAE
}

/* The scales of one group of n (1..4) blocks of x: lanes 0..3 of *d and
 * *id = block j's d = amax / 127 (NaNs skipped, as in the scalar loop) and
 * 1 / d (0 when d = 0); lanes 4..15 undefined. The padding blocks get 0. */
TERN_INLINE void act_scales(const float *x, int n, __m512 *d, __m512 *id) {
    __m512 m[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        /* max_ps returns its second operand when either is NaN: NaNs are
         * skipped. */
        m[j] = j < n ? _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j + 16)),
                                     _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j)), _mm512_setzero_ps()))
                     : _mm512_setzero_ps();
    }
    /* amax of block j into lane 4L+j of every 128-bit lane L (max is exact:
     * any order). */
    const __m512 m01 = _mm512_max_ps(_mm512_unpacklo_ps(m[0], m[1]), _mm512_unpackhi_ps(m[0], m[1]));
    const __m512 m23 = _mm512_max_ps(_mm512_unpacklo_ps(m[2], m[3]), _mm512_unpackhi_ps(m[2], m[3]));
    __m512 amax = _mm512_max_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(m01), _mm512_castps_pd(m23))),
                                _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(m01), _mm512_castps_pd(m23))));
    amax = _mm512_max_ps(amax, _mm512_shuffle_f32x4(amax, amax, _MM_SHUFFLE(1, 0, 3, 2)));
    amax = _mm512_max_ps(amax, _mm512_shuffle_f32x4(amax, amax, _MM_SHUFFLE(2, 3, 0, 1)));
    /* Lanes 0..3 suffice for the divisions (xmm: cheaper). */
    const __m128 d4 = _mm_div_ps(_mm512_castps512_ps128(amax), _mm_set1_ps(127.0f));
    const __m128 id4 = _mm_maskz_div_ps(_mm_cmp_ps_mask(d4, _mm_setzero_ps(), _CMP_NEQ_UQ), _mm_set1_ps(1.0f), d4);
    *d = _mm512_castps128_ps512(d4);
    *id = _mm512_castps128_ps512(id4);
}

/* One group of the act layout (legacy.h) from n (1..4) blocks of x and
 * their scales (act_scales): the bytes legacy_act_pack_group writes for
 * the blocks quant_quantize_row makes: quants roundq8(x * (1 / d)), d
 * rounded to fp16 (vcvtps2ph rounds to nearest even, as f32_to_fp16 does,
 * NaN and infinity included), Q8_1's s = fp16((float)sum(q) * d) with the
 * float d; the padding blocks zero. */
TERN_INLINE void act_group(const float *x, int n, __m512 d, __m512 id, char *g, bool q81) {
    __m512i ql[4], qh[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        if (j < n) {
            const __m512 idj = _mm512_permutexvar_ps(_mm512_set1_epi32(j), id);
            ql[j] = round_q8x16(_mm512_loadu_ps(x + 32 * j), idj);
            qh[j] = round_q8x16(_mm512_loadu_ps(x + 32 * j + 16), idj);
        } else {
            ql[j] = qh[j] = _mm512_setzero_si512();
        }
    }
    /* Quants are within [-127, 127]: the saturating packs are exact. Packed
     * in-lane, dword 4L+j holds block j's quants 4L..4L+3; the dword
     * transpose puts block j's 16 quants at bytes 16j..16j+15. */
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i qlo = _mm512_permutexvar_epi32(
        tr, _mm512_packs_epi16(_mm512_packs_epi32(ql[0], ql[1]), _mm512_packs_epi32(ql[2], ql[3])));
    const __m512i qhi = _mm512_permutexvar_epi32(
        tr, _mm512_packs_epi16(_mm512_packs_epi32(qh[0], qh[1]), _mm512_packs_epi32(qh[2], qh[3])));
    _mm512_storeu_si512(g + LEGACY_OFF_LO, qlo);
    _mm512_storeu_si512(g + LEGACY_OFF_HI, qhi);
    /* lane 4j+m: sum of lo[j][4m..4m+3] and hi[j][4m..4m+3] */
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, qlo), ones, qhi);
    /* block j's float d in lanes 4j..4j+3 */
    const __m512 dj = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), d);
    _mm512_storeu_ps(g + LEGACY_OFF_DEXP, _mm512_cvtph_ps(_mm512_cvtps_ph(dj, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    if (q81) {
        const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(lane_sum(sum)), dj);
        _mm512_storeu_ps(g + LEGACY_OFF_NSUM, _mm512_maskz_mov_ps(0x1111, _mm512_cvtph_ps(_mm512_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))));
    } else {
        _mm512_storeu_si512(g + LEGACY_OFF_NSUM, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    }
}

/* Software-pipelined by one group: the scales of group i + 1 (a long
 * chain: max reduction, two divisions) are computed before group i is
 * quantized, so the two overlap. */
TERN_INLINE void act_row(const float *x, void *xa, int64_t k, bool q81) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK, ng = (nb + LEGACY_GROUP - 1) / LEGACY_GROUP;
    char *g = xa;
    __m512 d, id;
    act_scales(x, nb < LEGACY_GROUP ? (int)nb : LEGACY_GROUP, &d, &id);
    for (int64_t i = 0; i < ng; i++, g += LEGACY_GROUP_BYTES) {
        const float *xi = x + i * LEGACY_GROUP * QK;
        const int n = nb - i * LEGACY_GROUP < LEGACY_GROUP ? (int)(nb - i * LEGACY_GROUP) : LEGACY_GROUP;
        __m512 dn = d, idn = id;
        if (i + 1 < ng) {
            const int64_t left = nb - (i + 1) * LEGACY_GROUP;
            act_scales(xi + LEGACY_GROUP * QK, left < LEGACY_GROUP ? (int)left : LEGACY_GROUP, &dn, &idn);
        }
        act_group(xi, n, d, id, g, q81);
        d = dn, id = idn;
    }
}

static void act_q8_0_avx512(const float *x, void *xa, int64_t k) {
    act_row(x, xa, k, false);
}

static void act_q8_1_avx512(const float *x, void *xa, int64_t k) {
    act_row(x, xa, k, true);
}

void legacy_register_blocks_avx512(kern_table_t t, const kern_options_t *o) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    TERN_CHECK(pthread_once(&once, perm_init) == 0); /* before any kernel is handed out */
    /* The VBMI (+ GFNI) variants compute exactly what the plain ones do
     * (only the decode's instructions differ), so the choice changes speed,
     * not results. */
    if (o->vbmi) {
        t[TYPE_Q4_0][ISA_AVX512] = (kern_ops_t){dot_q4_0_vbmi, act_q8_0_avx512, rows_q4_0_vbmi, &gemm_q4_0_vbmi};
        t[TYPE_Q4_1][ISA_AVX512] = (kern_ops_t){dot_q4_1_vbmi, act_q8_1_avx512, rows_q4_1_vbmi, &gemm_q4_1_vbmi};
        t[TYPE_Q5_0][ISA_AVX512] = (kern_ops_t){dot_q5_0_vbmi, act_q8_0_avx512, rows_q5_0_vbmi, &gemm_q5_0_vbmi};
        t[TYPE_Q5_1][ISA_AVX512] = (kern_ops_t){dot_q5_1_vbmi, act_q8_1_avx512, rows_q5_1_vbmi, &gemm_q5_1_vbmi};
        t[TYPE_Q8_0][ISA_AVX512] = (kern_ops_t){dot_q8_0_vbmi, act_q8_0_avx512, rows_q8_0_vbmi, &gemm_q8_0_vbmi};
    } else {
        t[TYPE_Q4_0][ISA_AVX512] = (kern_ops_t){dot_q4_0_avx512, act_q8_0_avx512, rows_q4_0_avx512, &gemm_q4_0};
        t[TYPE_Q4_1][ISA_AVX512] = (kern_ops_t){dot_q4_1_avx512, act_q8_1_avx512, rows_q4_1_avx512, &gemm_q4_1};
        t[TYPE_Q5_0][ISA_AVX512] = (kern_ops_t){dot_q5_0_avx512, act_q8_0_avx512, rows_q5_0_avx512, &gemm_q5_0};
        t[TYPE_Q5_1][ISA_AVX512] = (kern_ops_t){dot_q5_1_avx512, act_q8_1_avx512, rows_q5_1_avx512, &gemm_q5_1};
        t[TYPE_Q8_0][ISA_AVX512] = (kern_ops_t){dot_q8_0_avx512, act_q8_0_avx512, rows_q8_0_avx512, &gemm_q8_0};
    }
}

#endif /* __x86_64__ */
