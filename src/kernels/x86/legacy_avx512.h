/*
 * legacy_avx512.h - private to legacy_avx512_matvec.c and
 * legacy_avx512_gemm.c (compiled with the AVX-512 flags): the decode of
 * four weight blocks into vectors (plain and VBMI + GFNI) and the
 * reductions both halves use, and the GEMMs the matvec half registers.
 */
#ifndef TERN_KERNELS_LEGACY_AVX512_H
#define TERN_KERNELS_LEGACY_AVX512_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "kernels/legacy.h"
#include "kernels/x86/avx512_util.h"

/* ---- weight groups: four blocks decoded into vectors ---------------------- */

/* A group is read whole (nblk = 4, a constant in the main loops) or, at
 * the end of a row, as its first nblk blocks with the rest read as zero
 * bytes: exactly what a zero-padded copy of the partial group would give,
 * without storing one (a copy made just before its 64-byte windows are
 * loaded costs a failed store forwarding per load; measured:
 * docs/PERF.md). Masked loads do not touch the bytes they skip. */

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
 * rows kernels ran slower (measured: docs/PERF.md). */
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
/* The permute tables, filled by perm_init (legacy_avx512_matvec.c) before
 * registration hands out any kernel. Hidden: addressed like a static. */
extern perm_t g_perm[FMT_COUNT] __attribute__((visibility("hidden")));
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
 * bit 4, high in bit 0 (moved to bit 4 by a shift). Chosen over the
 * scalar qh_masks and masked adds for fewer loads on the weight stream
 * (measured: docs/PERF.md). */
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

/* kern_gemm_t.run_small of each format (legacy_avx512_matvec.c: the rows
 * kernel on tiles of up to 8 columns), plain and VBMI + GFNI, for up to
 * LEGACY_SMALL_COLS columns. */
#ifndef LEGACY_SMALL_COLS
#define LEGACY_SMALL_COLS 10
#endif
/* Q4_0's cheaper decode keeps the rows kernel ahead of the fused 16-lane
 * GEMM (legacy_avx512_gemm.c) up to 12 columns; the other formats up to 10
 * (measured: docs/PERF.md). */
#ifndef LEGACY_SMALL_COLS_Q4_0
#define LEGACY_SMALL_COLS_Q4_0 12
#endif
#define LEGACY_SMALL_DECL(name)                                                                                   \
    void name(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y, int64_t ldy) \
        __attribute__((visibility("hidden")));
LEGACY_SMALL_DECL(legacy_small_q4_0)
LEGACY_SMALL_DECL(legacy_small_q4_1)
LEGACY_SMALL_DECL(legacy_small_q5_0)
LEGACY_SMALL_DECL(legacy_small_q5_1)
LEGACY_SMALL_DECL(legacy_small_q8_0)
LEGACY_SMALL_DECL(legacy_small_q4_0_vbmi)
LEGACY_SMALL_DECL(legacy_small_q4_1_vbmi)
LEGACY_SMALL_DECL(legacy_small_q5_0_vbmi)
LEGACY_SMALL_DECL(legacy_small_q5_1_vbmi)
LEGACY_SMALL_DECL(legacy_small_q8_0_vbmi)

/* The GEMMs of legacy_avx512_gemm.c by format (FMT_*): plain, and with the
 * VBMI + GFNI decode (only for CPUs with both). */
extern const kern_gemm_t *const legacy_avx512_gemm[FMT_COUNT];
extern const kern_gemm_t *const legacy_avx512_gemm_vbmi[FMT_COUNT];

#endif
