/*
 * legacy_avx512_matvec.c - AVX-512 (F/BW/VL + VNNI) matvec kernels of the
 * 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: the dot (one
 * weight row, 1..4 columns), the rows function (2..4 rows in lockstep, 1..2
 * columns, for the matvec driver), the Q8_0 / Q8_1 activation quantizers,
 * and the registration of the AVX-512 entries (plain, or the VBMI + GFNI
 * decode where kern_options_t.vbmi says so). Their GEMM for many columns
 * (kern_gemm_t) is in legacy_avx512_gemm.c and computes in the float order
 * below; legacy_avx512.h holds the weight decode both files share.
 * legacy_ref.c holds the scalar oracle and legacy.h the activation row
 * layout that all ISAs share (unchanged here).
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

#include <pthread.h>
#include <stdlib.h>

#include "kernels/x86/legacy_avx512.h"

perm_t g_perm[FMT_COUNT];

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

/* Columns of one rows kernel call: 2 for the matvec (kern_rows_fn), up to
 * 8 for the few-column GEMM (GEMM_SMALL). */
#define ROWS_MAX_COLS 8

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
    _Pragma("GCC unroll 8") for (int c = 0; c < nc && c < ROWS_MAX_COLS; c++) {
        const char *a = xa + (size_t)c * st + (size_t)gi * LEGACY_GROUP_BYTES;
        /* col_partial's start value, once per column for all rows */
        const __m512i s0 = sh ? _mm512_slli_epi32(_mm512_loadu_si512(a + LEGACY_OFF_NSUM), (unsigned)sh) : _mm512_setzero_si512();
        const __m512i alo = _mm512_loadu_si512(a + LEGACY_OFF_LO), ahi = _mm512_loadu_si512(a + LEGACY_OFF_HI);
        __m512i p[4];
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) p[r] = r < nr ? _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s0, g[r].lo, alo), g[r].hi, ahi)
                                                                         : _mm512_setzero_si512();
        const __m512i i = treduce4(p[0], p[1], p[2], p[3]);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_loadu_ps(a + LEGACY_OFF_DEXP)), acc[c]);
        if (min)
            acc[c] = _mm512_fmadd_ps(scales_m(sc), _mm512_permute_ps(_mm512_loadu_ps(a + LEGACY_OFF_NSUM), 0), acc[c]);
    }
}

#define BLOCK_ROWS(name, wblock, fmt, sh, min) BLOCK_ROWS_A(, name, wblock, grp_plain, fmt, sh, min)
#define BLOCK_ROWS_A(attr, name, wblock, grp, fmt, sh, min)                                                   \
    TERN_INLINE attr void name##_rows_x(int64_t k, const void *const *wr, const int nr, const char *xa,     \
                                          size_t st, const int nc, float *out, size_t ost, size_t cst) {       \
        TERN_CHECK(k % QK == 0);                                                                             \
        const int64_t nb = k / QK, ng = nb / LEGACY_GROUP;                                                   \
        const size_t gb = LEGACY_GROUP * sizeof(wblock);                                                     \
        __m512 acc[ROWS_MAX_COLS];                                                                           \
        _Pragma("GCC unroll 8") for (int c = 0; c < ROWS_MAX_COLS; c++) acc[c] = _mm512_setzero_ps();        \
        wgroup_t g[KERN_MAX_ROWS];                                                                           \
        _Pragma("GCC unroll 4") for (int r = 0; r < KERN_MAX_ROWS; r++) g[r].lo = g[r].hi = g[r].sc =        \
            _mm512_setzero_si512();                                                                          \
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
        _Pragma("GCC unroll 8") for (int c = 0; c < nc && c < ROWS_MAX_COLS; c++) {                                               \
            float r[4];                                                                                      \
            _mm_storeu_ps(r, final4(acc[c]));                                                                \
            for (int i = 0; i < nr; i++) out[i * ost + c * cst] = r[i];                                      \
        }                                                                                                    \
    }                                                                                                        \
    TERN_INLINE attr void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                        size_t st, const int nc, float *out) {                                \
        name##_rows_x(k, wr, nr, xa, st, nc, out, (size_t)nc, 1);                                            \
    }

/* ---- GEMM for a few columns (kern_gemm_t.run_small) ---------------------- */

/* The rows kernel on up to ROWS_MAX_COLS columns: the weights are decoded
 * in registers, four rows at a time, and every column of a tile computes
 * on them at once; no prep, no scratch. The rows come from four far-apart
 * streams, as in the matvec driver (several prefetch streams per core);
 * columns in tiles of at most ROWS_MAX_COLS (balanced: 12 = 6 + 6), each
 * tile decoding the four rows again (from L1). Every (row, column) is the
 * rows kernel's, so the dot's bits. */
#define GEMM_SMALL(attr, fname, body)                                                                         \
    attr void fname(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y,       \
                    int64_t ldy) {                                                                            \
        const int64_t n = a->n, nt = (n + ROWS_MAX_COLS - 1) / ROWS_MAX_COLS;                                \
        const int64_t q = nrows >= 16 ? nrows / 4 : 0; /* rows per stream */                                \
        const char *x = a->xa;                                                                               \
        const size_t st = a->xa_stride;                                                                      \
        {                                                                                                    \
            for (int64_t i = 0; i < q; i++) {                                                                \
                const void *wr[4];                                                                           \
                for (int s = 0; s < 4; s++) wr[s] = (const char *)w + (size_t)(s * q + i) * row_bytes;       \
                for (int64_t t = 0; t < nt; t++) {                                                           \
                    const int64_t c0 = t * n / nt, nc = (t + 1) * n / nt - c0;                               \
                    body##_rows_x(a->k, wr, 4, x + (size_t)c0 * st, st, (int)nc, y + c0 * ldy + i, (size_t)q,      \
                                  (size_t)ldy);                                                                \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        for (int64_t r = 4 * q; r < nrows; r += 4) {                                                         \
            const int nr = nrows - r < 4 ? (int)(nrows - r) : 4;                                             \
            const void *wr[4];                                                                               \
            for (int s = 0; s < nr; s++) wr[s] = (const char *)w + (size_t)(r + s) * row_bytes;              \
            for (int64_t t = 0; t < nt; t++) {                                                               \
                const int64_t c0 = t * n / nt, nc = (t + 1) * n / nt - c0;                                   \
                body##_rows_x(a->k, wr, nr, x + (size_t)c0 * st, st, (int)nc, y + c0 * ldy + r, 1, (size_t)ldy); \
            }                                                                                                \
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

GEMM_SMALL(, legacy_small_q4_0, q4_0)
GEMM_SMALL(, legacy_small_q4_1, q4_1)
GEMM_SMALL(, legacy_small_q5_0, q5_0)
GEMM_SMALL(, legacy_small_q5_1, q5_1)
GEMM_SMALL(, legacy_small_q8_0, q8_0)
GEMM_SMALL(VBMI, legacy_small_q4_0_vbmi, q4_0_vbmi)
GEMM_SMALL(VBMI, legacy_small_q4_1_vbmi, q4_1_vbmi)
GEMM_SMALL(VBMI, legacy_small_q5_0_vbmi, q5_0_vbmi)
GEMM_SMALL(VBMI, legacy_small_q5_1_vbmi, q5_1_vbmi)
GEMM_SMALL(VBMI, legacy_small_q8_0_vbmi, q8_0_vbmi)

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
        t[TYPE_Q4_0][ISA_AVX512] = (kern_ops_t){dot_q4_0_vbmi, act_q8_0_avx512, rows_q4_0_vbmi, legacy_avx512_gemm_vbmi[FMT_Q4_0]};
        t[TYPE_Q4_1][ISA_AVX512] = (kern_ops_t){dot_q4_1_vbmi, act_q8_1_avx512, rows_q4_1_vbmi, legacy_avx512_gemm_vbmi[FMT_Q4_1]};
        t[TYPE_Q5_0][ISA_AVX512] = (kern_ops_t){dot_q5_0_vbmi, act_q8_0_avx512, rows_q5_0_vbmi, legacy_avx512_gemm_vbmi[FMT_Q5_0]};
        t[TYPE_Q5_1][ISA_AVX512] = (kern_ops_t){dot_q5_1_vbmi, act_q8_1_avx512, rows_q5_1_vbmi, legacy_avx512_gemm_vbmi[FMT_Q5_1]};
        t[TYPE_Q8_0][ISA_AVX512] = (kern_ops_t){dot_q8_0_vbmi, act_q8_0_avx512, rows_q8_0_vbmi, legacy_avx512_gemm_vbmi[FMT_Q8_0]};
    } else {
        t[TYPE_Q4_0][ISA_AVX512] = (kern_ops_t){dot_q4_0_avx512, act_q8_0_avx512, rows_q4_0_avx512, legacy_avx512_gemm[FMT_Q4_0]};
        t[TYPE_Q4_1][ISA_AVX512] = (kern_ops_t){dot_q4_1_avx512, act_q8_1_avx512, rows_q4_1_avx512, legacy_avx512_gemm[FMT_Q4_1]};
        t[TYPE_Q5_0][ISA_AVX512] = (kern_ops_t){dot_q5_0_avx512, act_q8_0_avx512, rows_q5_0_avx512, legacy_avx512_gemm[FMT_Q5_0]};
        t[TYPE_Q5_1][ISA_AVX512] = (kern_ops_t){dot_q5_1_avx512, act_q8_1_avx512, rows_q5_1_avx512, legacy_avx512_gemm[FMT_Q5_1]};
        t[TYPE_Q8_0][ISA_AVX512] = (kern_ops_t){dot_q8_0_avx512, act_q8_0_avx512, rows_q8_0_avx512, legacy_avx512_gemm[FMT_Q8_0]};
    }
}

#endif /* __x86_64__ */
