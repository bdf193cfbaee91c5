/*
 * legacy_avx512.c - AVX-512 (F/BW/VL + VNNI) dot products and activation
 * quantizers for F32, F16, BF16 and the 32-element block formats (see
 * legacy_ref.c for the scalar oracle and the arithmetic they follow).
 *
 * Block formats: four blocks per step, against one group of the activation
 * layout of legacy.h (see the comment above load4x16 and BLOCK_DOT): the
 * quants of the four blocks fill two 512-bit vectors, per column two
 * vpdpbusd give 16 exact int32 partial sums (four lanes per block), which
 * are converted and accumulated per lane with one multiply and one FMA by
 * d_w * d_a spread to the lanes. The scales come out of the weight bytes by
 * one word permute and vcvtph2ps; with AVX512-VBMI (checked at
 * registration) the quants come out by one byte permute as well. The
 * fifth bit of Q5 quants is applied with byte masks straight from qh
 * (AVX-512BW k-registers). The weight stream is prefetched PF_DIST ahead.
 * Float formats: 16 elements per vector, four accumulators per column, the
 * ragged end done with masked loads (masked-off lanes read as zero).
 *
 * Only AVX-512 F/BW/VL/VNNI instructions are used (no DQ, no BF16), the set
 * kern_isa_best() checks before it picks ISA_AVX512, except in the *_vbmi
 * kernels (target attribute), registered only where the CPU has VBMI.
 *
 * Multi-column calls decode the weights once for all columns; the per-column
 * work is written once and unrolled over a constant column count, so each
 * column's result is bit-identical to a one-column call. The *_rows kernels
 * (legacy_rows_avx512) run the same per-row work on 2..4 rows in lockstep,
 * for the matvec driver's interleaved streams (legacy.h).
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "avx512_util.h"
#include "legacy.h"


/* ---- 32-blocks ------------------------------------------------------------ */

/* Four blocks per step (one group of the activation layout, legacy.h).
 * The weights' quants go into two vectors, lo = quants 0..15 of blocks
 * 0..3 (one 128-bit lane per block) and hi = quants 16..31, as unsigned
 * bytes; per column two vpdpbusd against the group's lo / hi bytes give 16
 * exact int32 partial sums, four per block. They are converted and
 * accumulated per lane: acc += float(p) * (dw * dexp), with dw the blocks'
 * scales in their lanes (decoded once per group) and dexp the activation
 * scales, already spread by the act fn. So a column costs two vpdpbusd, a
 * shift, a convert, a multiply and an FMA per four blocks, where the
 * one-block-per-ymm kernels this replaced spent about twice that.
 * Signed weights need the unsigned operand of vpdpbusd: for offset quants
 * (Q4_0: w = q - 8, Q5_0: q - 16) q is used as is, and for Q8_0 w + 128;
 * either way sum w * a = sum u * a - off * sum a, and the act row holds
 * -sum a per lane (nsum), so the correction is vpdpbusd's start value,
 * nsum << log2(off). The mins of Q4_1 / Q5_1 go into a second accumulator,
 * accm += mw * sexp (sexp nonzero only in a block's first lane). */

ALWAYS_INLINE __m512i load4x16(const uint8_t *p, size_t bsz) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + bsz)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * bsz)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * bsz)), 3);
}

/* Byte masks of the fifth bits of four Q5 blocks (qh at p, stride bsz):
 * bit 16j+m of *lo = bit m of block j's qh, of *hi = bit 16+m. */
ALWAYS_INLINE void qh_masks(const uint8_t *p, size_t bsz, __mmask64 *lo, __mmask64 *hi) {
    uint16_t h[8];
    memcpy(&h[0], p, 4);
    memcpy(&h[2], p + bsz, 4);
    memcpy(&h[4], p + 2 * bsz, 4);
    memcpy(&h[6], p + 3 * bsz, 4);
    *lo = (__mmask64)((uint64_t)h[0] | (uint64_t)h[2] << 16 | (uint64_t)h[4] << 32 | (uint64_t)h[6] << 48);
    *hi = (__mmask64)((uint64_t)h[1] | (uint64_t)h[3] << 16 | (uint64_t)h[5] << 32 | (uint64_t)h[7] << 48);
}

typedef struct {
    __m512i lo, hi; /* unsigned quants */
    __m512 dw, mw;  /* scales and mins in their blocks' lanes (mw: Q4_1 / Q5_1) */
} wgroup_t;

/* Every permute below reads two in-bounds 64-byte windows of the group
 * (G = 4 * block size = 72..136 bytes): win0 = bytes 0..63 and win1 =
 * bytes w1..w1+63, w1 = G - 64 (Q8_0: 64). The scales: one word permute of
 * the windows puts block j's fp16 d in words 4j..4j+3 (and its m in words
 * 16+4j..16+4j+3), then vcvtph2ps: far cheaper than four scalar table
 * reads spread by masked broadcasts, whose loads miss L1 on real scales.
 * The conversion is exact, the same values as fp16_to_f32. */
enum { FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0, FMT_COUNT };
typedef struct {
    uint16_t sw[32]; /* word permute: scales (and mins) */
    uint8_t sb[64];  /* the same as a byte permute (VBMI) */
    uint8_t qs[64];  /* byte permute: quants 16j..16j+15 = block j's qs (VBMI) */
    uint8_t qs8[64]; /* Q8_0 quants 16..31, from windows at 8 and 72 (VBMI) */
} perm_t;
static perm_t g_perm[FMT_COUNT] __attribute__((aligned(64)));

static const struct {
    size_t bsz, doff, moff, qoff; /* moff 0: no min */
} k_fmt[FMT_COUNT] = {
    {sizeof(block_q4_0), offsetof(block_q4_0, d), 0, offsetof(block_q4_0, qs)},
    {sizeof(block_q4_1), offsetof(block_q4_1, d), offsetof(block_q4_1, m), offsetof(block_q4_1, qs)},
    {sizeof(block_q5_0), offsetof(block_q5_0, d), 0, offsetof(block_q5_0, qs)},
    {sizeof(block_q5_1), offsetof(block_q5_1, d), offsetof(block_q5_1, m), offsetof(block_q5_1, qs)},
    {sizeof(block_q8_0), offsetof(block_q8_0, d), 0, offsetof(block_q8_0, qs)},
};

ALWAYS_INLINE size_t win1(int f) {
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
                if (k_fmt[f].moff) {
                    const size_t mo = win_index(j * bs + k_fmt[f].moff, 0, w1);
                    p->sw[16 + 4 * j + m] = (uint16_t)(mo / 2);
                    p->sb[32 + 8 * j + 2 * m] = (uint8_t)mo, p->sb[32 + 8 * j + 2 * m + 1] = (uint8_t)(mo + 1);
                }
            }
            for (size_t i = 0; i < 16; i++) {
                p->qs[16 * j + i] = (uint8_t)win_index(j * bs + k_fmt[f].qoff + i, 0, w1);
                if (f == FMT_Q8_0) p->qs8[16 * j + i] = (uint8_t)win_index(j * bs + k_fmt[f].qoff + 16 + i, 8, 72);
            }
        }
    }
}

ALWAYS_INLINE void scales_from(__m512i x, bool min, wgroup_t *g) {
    g->dw = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
    g->mw = min ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1)) : _mm512_setzero_ps();
}

/* Quants vector v (bytes 16j..16j+15 = block j's qs) -> unsigned quants. */
ALWAYS_INLINE void nibbles(__m512i v, wgroup_t *g) {
    const __m512i m = _mm512_set1_epi8(15);
    g->lo = _mm512_and_si512(v, m);
    g->hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
}

ALWAYS_INLINE void fifth_bits(const uint8_t *w, int f, wgroup_t *g) {
    __mmask64 hl, hh;
    const size_t qh = f == FMT_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
    qh_masks(w + qh, k_fmt[f].bsz, &hl, &hh);
    const __m512i b4 = _mm512_set1_epi8(16);
    g->lo = _mm512_mask_add_epi8(g->lo, hl, g->lo, b4);
    g->hi = _mm512_mask_add_epi8(g->hi, hh, g->hi, b4);
}

/* Decode one group of format f (a constant after inlining). */
ALWAYS_INLINE wgroup_t grp_plain(const uint8_t *w, int f) {
    wgroup_t g;
    const bool min = k_fmt[f].moff != 0;
    const __m512i x = _mm512_permutex2var_epi16(_mm512_loadu_si512(w), _mm512_load_si512(g_perm[f].sw),
                                                _mm512_loadu_si512(w + win1(f)));
    scales_from(x, min, &g);
    const uint8_t *q = w + k_fmt[f].qoff;
    if (f == FMT_Q8_0) {
        const __m512i s = _mm512_set1_epi8((char)0x80); /* w + 128 */
        g.lo = _mm512_xor_si512(load4x16(q, k_fmt[f].bsz), s);
        g.hi = _mm512_xor_si512(load4x16(q + 16, k_fmt[f].bsz), s);
        return g;
    }
    nibbles(load4x16(q, k_fmt[f].bsz), &g);
    if (f == FMT_Q5_0 || f == FMT_Q5_1) fifth_bits(w, f, &g);
    return g;
}

/* AVX512-VBMI: the quants too come from the two windows, by one vpermt2b
 * in place of a load and three inserts (shuffle-port ops). Same values as
 * grp_plain, so the choice changes speed, not results. */
#define VBMI __attribute__((target("avx512vbmi")))
#define ALWAYS_INLINE_VBMI static inline __attribute__((always_inline, target("avx512vbmi")))

ALWAYS_INLINE_VBMI wgroup_t grp_vbmi(const uint8_t *w, int f) {
    wgroup_t g;
    const bool min = k_fmt[f].moff != 0;
    const __m512i a = _mm512_loadu_si512(w), b = _mm512_loadu_si512(w + win1(f));
    scales_from(_mm512_permutex2var_epi8(a, _mm512_load_si512(g_perm[f].sb), b), min, &g);
    const __m512i v = _mm512_permutex2var_epi8(a, _mm512_load_si512(g_perm[f].qs), b);
    if (f == FMT_Q8_0) {
        const __m512i s = _mm512_set1_epi8((char)0x80);
        const __m512i v2 = _mm512_permutex2var_epi8(_mm512_loadu_si512(w + 8), _mm512_load_si512(g_perm[f].qs8),
                                                    _mm512_loadu_si512(w + 72));
        g.lo = _mm512_xor_si512(v, s);
        g.hi = _mm512_xor_si512(v2, s);
        return g;
    }
    nibbles(v, &g);
    if (f == FMT_Q5_0 || f == FMT_Q5_1) fifth_bits(w, f, &g);
    return g;
}

/* One group, nc columns. sh: log2 of the offset (0: none, the min formats). */
ALWAYS_INLINE void grp_cols(const wgroup_t *g, int sh, bool min, const char *xa, size_t st, int64_t gi, int nc,
                            __m512 *acc, __m512 *accm) {
    _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {
        const char *a = xa + (size_t)c * st + (size_t)gi * LEGACY_GROUP_BYTES;
        __m512i p = sh ? _mm512_slli_epi32(_mm512_loadu_si512(a + LEGACY_OFF_NSUM), (unsigned)sh) : _mm512_setzero_si512();
        p = _mm512_dpbusd_epi32(p, g->lo, _mm512_loadu_si512(a + LEGACY_OFF_LO));
        p = _mm512_dpbusd_epi32(p, g->hi, _mm512_loadu_si512(a + LEGACY_OFF_HI));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(g->dw, _mm512_loadu_ps(a + LEGACY_OFF_DEXP)), acc[c]);
        if (min) accm[c] = _mm512_fmadd_ps(g->mw, _mm512_loadu_ps(a + LEGACY_OFF_NSUM), accm[c]); /* sexp */
    }
}

/* Full groups alternate between two accumulators (two FMA chains in
 * flight); a partial last group is decoded from a zero-padded copy (zero
 * scales: it adds exact zeros), so no weight past the row is read. */
#define BLOCK_DOT(name, wblock, fmt, sh, min) BLOCK_DOT_A(, name, wblock, grp_plain, fmt, sh, min)
#define BLOCK_DOT_A(attr, name, wblock, grp, fmt, sh, min)                                                    \
    ALWAYS_INLINE attr void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        TERN_CHECK(k % QK == 0);                                                                         \
        const int64_t nb = k / QK, ng = nb / LEGACY_GROUP;                                               \
        const size_t gb = LEGACY_GROUP * sizeof(wblock);                                                 \
        __m512 acc[2][KERN_MAX_COLS], accm[2][KERN_MAX_COLS];                                            \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                           \
            acc[0][c] = acc[1][c] = _mm512_setzero_ps();                                                 \
            accm[0][c] = accm[1][c] = _mm512_setzero_ps();                                               \
        }                                                                                                \
        int64_t gi = 0;                                                                                  \
        for (; gi + 2 <= ng; gi += 2) {                                                                  \
            const uint8_t *wp = (const uint8_t *)w + (size_t)gi * gb;                                    \
            for (size_t b = 0; b < 2 * gb; b += 64) prefetch_ahead((const char *)wp + b, 64);           \
            const wgroup_t g0 = grp(wp, fmt);                                                                 \
            grp_cols(&g0, sh, min, xa, st, gi, nc, acc[0], accm[0]);                                     \
            const wgroup_t g1 = grp(wp + gb, fmt);                                                            \
            grp_cols(&g1, sh, min, xa, st, gi + 1, nc, acc[1], accm[1]);                                 \
        }                                                                                                \
        if (gi < ng) {                                                                                   \
            const wgroup_t g0 = grp((const uint8_t *)w + (size_t)gi * gb, fmt);                               \
            grp_cols(&g0, sh, min, xa, st, gi, nc, acc[0], accm[0]);                                     \
            gi++;                                                                                        \
        }                                                                                                \
        if (nb % LEGACY_GROUP) {                                                                         \
            wblock tail[LEGACY_GROUP];                                                                   \
            memset(tail, 0, sizeof(tail));                                                               \
            memcpy(tail, w + (size_t)gi * gb, (size_t)(nb % LEGACY_GROUP) * sizeof(wblock));             \
            const wgroup_t g0 = grp((const uint8_t *)tail, fmt);                                              \
            grp_cols(&g0, sh, min, xa, st, gi, nc, acc[gi & 1], accm[gi & 1]);                           \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                           \
            float r = hsum16(_mm512_add_ps(acc[0][c], acc[1][c]));                                       \
            if (min) r += hsum16(_mm512_add_ps(accm[0][c], accm[1][c]));                                 \
            out[c] = r;                                                                                  \
        }                                                                                                \
    }

/* The rows version of BLOCK_DOT_A: per row the same groups go into the
 * same accumulators in the same order, so each row's bits are those of a
 * one-row call (see FLOAT_ROWS). */
#define BLOCK_ROWS(name, wblock, fmt, sh, min) BLOCK_ROWS_A(, name, wblock, grp_plain, fmt, sh, min)
#define BLOCK_ROWS_A(attr, name, wblock, grp, fmt, sh, min)                                              \
    ALWAYS_INLINE attr void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,  \
                                        size_t st, const int nc, float *out) {                           \
        TERN_CHECK(k % QK == 0);                                                                         \
        const int64_t nb = k / QK, ng = nb / LEGACY_GROUP;                                               \
        const size_t gb = LEGACY_GROUP * sizeof(wblock);                                                 \
        __m512 acc[2][KERN_MAX_ROWS * 2], accm[2][KERN_MAX_ROWS * 2];                                    \
        _Pragma("GCC unroll 8") for (int i = 0; i < nr * nc; i++) {                                      \
            acc[0][i] = acc[1][i] = _mm512_setzero_ps();                                                 \
            accm[0][i] = accm[1][i] = _mm512_setzero_ps();                                               \
        }                                                                                                \
        int64_t gi = 0;                                                                                  \
        for (; gi + 2 <= ng; gi += 2) {                                                                  \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const uint8_t *wp = (const uint8_t *)wr[r] + (size_t)gi * gb;                            \
                for (size_t b = 0; b < 2 * gb; b += 64) prefetch_ahead((const char *)wp + b, 64);       \
                const wgroup_t g0 = grp(wp, fmt);                                                        \
                grp_cols(&g0, sh, min, xa, st, gi, nc, acc[0] + r * nc, accm[0] + r * nc);               \
                const wgroup_t g1 = grp(wp + gb, fmt);                                                   \
                grp_cols(&g1, sh, min, xa, st, gi + 1, nc, acc[1] + r * nc, accm[1] + r * nc);           \
            }                                                                                            \
        }                                                                                                \
        if (gi < ng) {                                                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const wgroup_t g0 = grp((const uint8_t *)wr[r] + (size_t)gi * gb, fmt);                  \
                grp_cols(&g0, sh, min, xa, st, gi, nc, acc[0] + r * nc, accm[0] + r * nc);               \
            }                                                                                            \
            gi++;                                                                                        \
        }                                                                                                \
        if (nb % LEGACY_GROUP) {                                                                         \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                wblock tail[LEGACY_GROUP];                                                               \
                memset(tail, 0, sizeof(tail));                                                           \
                memcpy(tail, (const char *)wr[r] + (size_t)gi * gb,                                      \
                       (size_t)(nb % LEGACY_GROUP) * sizeof(wblock));                                    \
                const wgroup_t g0 = grp((const uint8_t *)tail, fmt);                                     \
                grp_cols(&g0, sh, min, xa, st, gi, nc, acc[gi & 1] + r * nc, accm[gi & 1] + r * nc);     \
            }                                                                                            \
        }                                                                                                \
        _Pragma("GCC unroll 8") for (int i = 0; i < nr * nc; i++) {                                      \
            float r = hsum16(_mm512_add_ps(acc[0][i], acc[1][i]));                                       \
            if (min) r += hsum16(_mm512_add_ps(accm[0][i], accm[1][i]));                                 \
            out[i] = r;                                                                                  \
        }                                                                                                \
    }

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

/* ---- activation quantizers ------------------------------------------------ */

/* roundf (half away from zero) of each lane, exactly; NaN -> 0. */
ALWAYS_INLINE __m512 round_away(__m512 p) {
    const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(p, t));
    const __m512i sgn = _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32((int)0x80000000u));
    const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0f)), sgn));
    const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 r = _mm512_mask_add_ps(t, up, t, step);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), r);
}

ALWAYS_INLINE float q8_block(const float *x, int8_t *qs, fp16_t *dout, int *sum) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    /* max_ps returns its second operand when either is NaN: NaNs are
     * skipped, as in the scalar loop. */
    const __m512 amax = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
    const float d = _mm512_reduce_max_ps(amax) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dout = f32_to_fp16(d);
    const __m512 vid = _mm512_set1_ps(id), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i q0 = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(round_away(_mm512_mul_ps(v0, vid)), lo), hi));
    const __m512i q1 = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(round_away(_mm512_mul_ps(v1, vid)), lo), hi));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtepi32_epi8(q1));
    return d;
}

/* Blocks as quant_quantize_row makes them, packed a group at a time by the
 * reference's packer, so the bytes match the scalar act fn's. */
static void act_q8_0_avx512(const float *x, void *xa, int64_t k) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK;
    char *g = xa;
    for (int64_t i = 0; i < nb; i += LEGACY_GROUP, g += LEGACY_GROUP_BYTES) {
        const int n = nb - i < LEGACY_GROUP ? (int)(nb - i) : LEGACY_GROUP;
        block_q8_0 y[LEGACY_GROUP];
        for (int j = 0; j < n; j++) {
            int sum;
            q8_block(x + (i + j) * QK, y[j].qs, &y[j].d, &sum);
        }
        legacy_act_pack_group(TYPE_Q8_0, y, n, g);
    }
}

static void act_q8_1_avx512(const float *x, void *xa, int64_t k) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK;
    char *g = xa;
    for (int64_t i = 0; i < nb; i += LEGACY_GROUP, g += LEGACY_GROUP_BYTES) {
        const int n = nb - i < LEGACY_GROUP ? (int)(nb - i) : LEGACY_GROUP;
        block_q8_1 y[LEGACY_GROUP];
        for (int j = 0; j < n; j++) {
            int sum;
            const float d = q8_block(x + (i + j) * QK, y[j].qs, &y[j].d, &sum);
            y[j].s = f32_to_fp16((float)sum * d);
        }
        legacy_act_pack_group(TYPE_Q8_1, y, n, g);
    }
}

void legacy_register_blocks_avx512(kern_table_t t) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    TERN_CHECK(pthread_once(&once, perm_init) == 0); /* before any kernel is handed out */
    t[TYPE_Q4_0][ISA_AVX512] = (kern_ops_t){dot_q4_0_avx512, act_q8_0_avx512, NULL};
    t[TYPE_Q4_1][ISA_AVX512] = (kern_ops_t){dot_q4_1_avx512, act_q8_1_avx512, NULL};
    t[TYPE_Q5_0][ISA_AVX512] = (kern_ops_t){dot_q5_0_avx512, act_q8_0_avx512, NULL};
    t[TYPE_Q5_1][ISA_AVX512] = (kern_ops_t){dot_q5_1_avx512, act_q8_1_avx512, NULL};
    t[TYPE_Q8_0][ISA_AVX512] = (kern_ops_t){dot_q8_0_avx512, act_q8_0_avx512, NULL};
    /* The VBMI variants compute exactly what the plain ones do (only the
     * quants' load differs), so the choice changes speed, not results. */
    if (getenv("TERN_NO_VBMI") == NULL && __builtin_cpu_supports("avx512vbmi")) {
        t[TYPE_Q4_0][ISA_AVX512].dot = dot_q4_0_vbmi;
        t[TYPE_Q4_1][ISA_AVX512].dot = dot_q4_1_vbmi;
        t[TYPE_Q5_0][ISA_AVX512].dot = dot_q5_0_vbmi;
        t[TYPE_Q5_1][ISA_AVX512].dot = dot_q5_1_vbmi;
        t[TYPE_Q8_0][ISA_AVX512].dot = dot_q8_0_vbmi;
    }
}

kern_rows_fn legacy_rows_avx512(kern_dot_fn dot) {
    static const struct {
        kern_dot_fn dot;
        kern_rows_fn rows;
    } pairs[] = {
        {dot_q4_0_avx512, rows_q4_0_avx512},
        {dot_q4_1_avx512, rows_q4_1_avx512}, {dot_q5_0_avx512, rows_q5_0_avx512},
        {dot_q5_1_avx512, rows_q5_1_avx512}, {dot_q8_0_avx512, rows_q8_0_avx512},
        {dot_q4_0_vbmi, rows_q4_0_vbmi},     {dot_q4_1_vbmi, rows_q4_1_vbmi},
        {dot_q5_0_vbmi, rows_q5_0_vbmi},     {dot_q5_1_vbmi, rows_q5_1_vbmi},
        {dot_q8_0_vbmi, rows_q8_0_vbmi},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
        if (pairs[i].dot == dot) return pairs[i].rows;
    return NULL;
}

#endif /* __x86_64__ */
