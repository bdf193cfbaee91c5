/*
 * kquant_avx512_matvec.c - AVX-512 (F/BW/VL/DQ + VNNI) matvec kernels of
 * Q4_K, Q5_K, Q6_K weights against Q8_K activations: the dot / multi-row
 * ("rows") functions used by matvec (and by the GEMM for few columns), the
 * AVX-512 Q8_K activation quantizer, and the registration of the AVX-512
 * entries. Only reached through the kernel table when the CPU has these
 * extensions. Their GEMM for 5 or more columns (kern_gemm_t) is in
 * kquant_avx512_gemm.c and follows the float order below;
 * kquant_avx512.h holds what the two files share.
 *
 * ---- The float order (every function here and in kquant_avx512_gemm.c, bit for bit) -------
 *
 * For one weight row and one activation column, super-block b contributes
 * two exact integers (int32, no overflow possible, see the bounds below):
 *   T_b = sum_j sc_j * sum_{i in sub-block j} q_i * a_i
 *         (Q6_K: q_i - 32 in place of q_i, signed scales)
 *   M_b = sum_j m_j * (bsums[2j] + bsums[2j+1])          (Q4_K / Q5_K only)
 * and the result is the float chain, one per (row, column):
 *   acc = +0.0f
 *   for b = 0, 1, ..., nb-1 in order:
 *     acc = fma((float)T_b, da_b * d_b, acc)                      (one rounding)
 *     acc = fma(-(float)M_b, da_b * dmin_b, acc)   (Q4_K / Q5_K; fnmadd)
 *   result = acc
 * where da_b is the activation block's scale, d_b / dmin_b the weight
 * block's fp16 scales converted exactly, and each product da_b * d_b is one
 * float multiply. Nothing else is rounded, so any code computing the same
 * integers and following this chain gets the same bits: the matvec tiles
 * below reduce their integer vectors to T_b / M_b exactly and run the chain
 * with one float lane per (row, column), and the GEMM runs it with one lane
 * per column (16 columns per vector). This differs from the scalar oracle's
 * order (da * (d * T - dmin * M)); the tests compare the two with a
 * tolerance, and demand bit equality between matvec, GEMM and every tile.
 *
 * Integer bounds: |q_i * a_i| <= 63 * 128; a sub-block sum of 32 products
 * stays below 2^18, times a 6-bit scale (Q6_K: 8-bit) and over 8 (16)
 * sub-blocks below 2^28. The intermediate forms used below (int16 packs of
 * 4-product sums, activations offset by +128 in the GEMM) are bounded where
 * they are used.
 *
 * ---- Matvec tiles (dot and rows functions) --------------------------------
 *
 * A tile is nr rows x nc columns (1 x 1..4 for the dot, 2..4 x 1..2 for the
 * rows function), weights read block by block in lockstep. Per super-block
 * and row the 256 weights are unpacked to bytes, once for all columns, and
 * vpdpbusd (unsigned weights x signed activations, into a zeroed
 * accumulator: |sum of 4| <= 4 * 63 * 128 < 2^15) gives int32 sums of 4
 * products; two such vectors are packed to int16 and one vpdpwssd applies the
 * sub-block scales, giving 16 int32 lanes whose sum is T_b. (Q4_K/Q5_K
 * tiles with more than 2 rows per column unpack the nibbles in a layout that
 * costs fewer operations per row and a rearrangement of the activations per
 * column; see affine_unpack / affine_unpack_nat.) The scales, mins and
 * d/dmin of all rows of the tile are decoded together in one vector (one
 * 128-bit lane per row). The (row, column) pairs ("slots") go in groups of
 * 4: a transposing reduction turns the 4 slots' 16-lane vectors into one
 * vector of 4 totals, and M_b of the 4 slots comes from one vpmaddwd of their
 * mins against the activations' sub-block sums; the float chain then runs
 * on 4 lanes (one per slot). Q6_K's -32 offset enters T_b as
 * -32 * sum_k sc_k * bsums_k, added by one vpdpwssd.
 *
 */
#include "kernels/x86/kquant_avx512.h"

/* ==== matvec tiles ========================================================== */

/* Slots: the (row, column) pairs of an nr x nc tile, 4 per group, slot i of
 * group g in float lane i. nc == 1: slot i = row i. nr == 1: slot i =
 * column i. nc == 2: group g holds rows 2g, 2g+1 (slot i: row 2g + (i & 1),
 * column i >> 1). Slots past the tile are computed on duplicated rows and
 * never stored. */
TERN_INLINE int slot_row(const int nr, const int nc, int g, int i) {
    return nc == 1 ? i : nr == 1 ? 0 : 2 * g + (i & 1);
}
TERN_INLINE int slot_col(const int nr, const int nc, int g, int i) {
    (void)g;
    return nc == 1 ? 0 : nr == 1 ? i : i >> 1;
}
TERN_INLINE int slot_ok(const int nr, const int nc, int g, int i) {
    return slot_row(nr, nc, g, i) < nr && slot_col(nr, nc, g, i) < nc;
}
#define KQ_GROUPS(nr, nc) (((nr) * (nc) + 3) / 4)

/* Per-128-bit-lane sums of 4 vectors: lane i of the result holds 4 int32
 * partial sums whose total is the total of t_i. */
TERN_INLINE __m512i reduce4(__m512i t0, __m512i t1, __m512i t2, __m512i t3) {
    const __m512i a01 = _mm512_add_epi32(_mm512_shuffle_i64x2(t0, t1, 0x44), _mm512_shuffle_i64x2(t0, t1, 0xEE));
    const __m512i a23 = _mm512_add_epi32(_mm512_shuffle_i64x2(t2, t3, 0x44), _mm512_shuffle_i64x2(t2, t3, 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a01, a23, 0x88), _mm512_shuffle_i64x2(a01, a23, 0xDD));
}

/* dword 4i of every 128-bit lane i, then dword 4i + 2 */
static const v512_t g_pick_tm = {.d = {0, 4, 8, 12, 2, 6, 10, 14, 0, 4, 8, 12, 2, 6, 10, 14}};

/* ---- Q4_K / Q5_K ------------------------------------------------------------ */

/* Header decode: lane r of X holds the first 16 bytes of row r's block,
 * d, dmin, scales[12] (u0 = scales[0..3] in dword 1, u1 in dword 2, u2 in
 * dword 3). Y = [u0, u2, u1, u2] and Z = [-, u0, -, u1] per lane, so that
 *   [sc0..3, sc4..7, m0..3, m4..7] = (Y & [3f, 0f, 3f, 0]) | ((Y >> 4) & [0, 0, 0, 0f])
 *                                  | ((Z >> 2) & [0, 30, 0, 30])   (bytes)
 * which is kquant_scales_k4 on four rows at once. */
#define HDR_Y 4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15
#define HDR_Z 0, 0, 0, 0, 4, 5, 6, 7, 0, 0, 0, 0, 8, 9, 10, 11
static const v512_t g_hdr_y = {.b = {HDR_Y, HDR_Y, HDR_Y, HDR_Y}};
static const v512_t g_hdr_z = {.b = {HDR_Z, HDR_Z, HDR_Z, HDR_Z}};
#define HDR_M1 0x3f3f3f3fu, 0x0f0f0f0fu, 0x3f3f3f3fu, 0
#define HDR_M2 0, 0, 0, 0x0f0f0f0fu
#define HDR_M3 0, 0x30303030u, 0, 0x30303030u
static const v512_t g_hdr_m1 = {.d = {HDR_M1, HDR_M1, HDR_M1, HDR_M1}};
static const v512_t g_hdr_m2 = {.d = {HDR_M2, HDR_M2, HDR_M2, HDR_M2}};
static const v512_t g_hdr_m3 = {.d = {HDR_M3, HDR_M3, HDR_M3, HDR_M3}};

/* Weights of half h (elements 128h..128h+127) of a Q4_K/Q5_K block: the 64
 * bytes qs[64h..] give lo = low nibbles = [elements 128h + 0..31 (sub-block
 * 4h) | 128h + 64..95 (4h+2)] and hi = high nibbles = [128h + 32..63 (4h+1) |
 * 128h + 96..127 (4h+3)]. The activations are arranged to match (two 32-byte
 * loads per vector, once per column for all rows).
 * vpdpbusd of lo (hi) gives t_lo (t_hi): dwords 0..7 sub-block 4h (4h+1),
 * 8..15 sub-block 4h+2 (4h+3). packs(t_lo, t_hi) holds, per 128-bit lane L,
 * words 0..3 from t_lo and 4..7 from t_hi, so the scale vector of vpdpwssd
 * is sc[4h + 2(L >= 2)] x 4, sc[4h + 1 + 2(L >= 2)] x 4, picked by vpermw
 * from the lane of the row in SC16 (word 8r + j = sc_j of row r). */
#define Q4S_LANE(r, h, L) W4(8 * (r) + 4 * (h) + 2 * ((L) >= 2)), W4(8 * (r) + 4 * (h) + 2 * ((L) >= 2) + 1)
#define Q4S_IDX(r, hf) {.h = {Q4S_LANE(r, hf, 0), Q4S_LANE(r, hf, 1), Q4S_LANE(r, hf, 2), Q4S_LANE(r, hf, 3)}}
static const v512_t g_q4_sidx[4][2] = {{Q4S_IDX(0, 0), Q4S_IDX(0, 1)},
                                       {Q4S_IDX(1, 0), Q4S_IDX(1, 1)},
                                       {Q4S_IDX(2, 0), Q4S_IDX(2, 1)},
                                       {Q4S_IDX(3, 0), Q4S_IDX(3, 1)}};
/* The natural layout, for tiles with few rows per column (see affine_tile):
 * q[j] = elements 64j..64j+63 (sub-blocks 2j, 2j+1: low nibbles of
 * qs[32j..32j+31] in the low half, their high nibbles in the high half), so
 * the activations are used as they are. packs(t_2h, t_2h+1) then holds per
 * lane L the sums of sub-blocks 4h + (L >= 2) (words 0..3) and 4h + 2 +
 * (L >= 2) (words 4..7). */
#define Q4N_LANE(r, hf, L) W4(8 * (r) + 4 * (hf) + ((L) >= 2)), W4(8 * (r) + 4 * (hf) + ((L) >= 2) + 2)
#define Q4N_IDX(r, hf) {.h = {Q4N_LANE(r, hf, 0), Q4N_LANE(r, hf, 1), Q4N_LANE(r, hf, 2), Q4N_LANE(r, hf, 3)}}
static const v512_t g_q4n_sidx[4][2] = {{Q4N_IDX(0, 0), Q4N_IDX(0, 1)},
                                        {Q4N_IDX(1, 0), Q4N_IDX(1, 1)},
                                        {Q4N_IDX(2, 0), Q4N_IDX(2, 1)},
                                        {Q4N_IDX(3, 0), Q4N_IDX(3, 1)}};
/* Q5_K high bits of q[j]: bit 2j (low half), 2j + 1 (high half) to bit 4 */
static const v512_t g_q5n_rot[4] = {{.d = {ROT_HALVES(0, 1)}}, {.d = {ROT_HALVES(2, 3)}},
                                    {.d = {ROT_HALVES(4, 5)}}, {.d = {ROT_HALVES(6, 7)}}};

TERN_INLINE void affine_unpack_nat(const uint8_t *qs, const uint8_t *qh, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const __m512i shift = halves(_mm256_setzero_si256(), _mm256_set1_epi16(4)); /* nibble: low | high */
    const __m512i QH = qh ? bcast256(qh) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        q[j] = _mm512_and_si512(_mm512_srlv_epi16(bcast256(qs + 32 * j), shift), m4);
        if (qh) q[j] = or_and(q[j], _mm512_rolv_epi32(QH, g_q5n_rot[j].v), b4);
    }
}

/* nr rows (at any addresses) x nc columns of Q4_K (q5 = 0) or Q5_K (q5 = 1),
 * read in lockstep: out[r * nc + c]. */
TERN_INLINE void affine_tile(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                           float *out, const int q5) {
    const size_t bsz = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t qs_off = q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const int ng = KQ_GROUPS(nr, nc);
    /* lo/hi layout (affine_unpack): 2 fewer operations per row, 4 more per
     * column (rearranging the activations); else the natural layout */
    const int lohi = nr > 2 * nc;
    const uint8_t *row[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) row[r] = (const uint8_t *)wr[r < nr ? r : 0];
    const __m512i zero = _mm512_setzero_si512();
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) blk[r] = row[r] + (size_t)b * bsz;
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) prefetch_ahead(blk[r], bsz);

        /* scales and mins of all rows: SC16 / MN16 lane r = row r's 8
         * scales / mins as int16 */
        __m512i X;
        if (nr == 1) {
            X = _mm512_broadcast_i32x4(loadu128(blk[0]));
        } else {
            X = _mm512_castsi128_si512(loadu128(blk[0]));
            X = _mm512_inserti32x4(X, loadu128(blk[1]), 1);
            X = _mm512_inserti32x4(X, loadu128(blk[2]), 2);
            X = _mm512_inserti32x4(X, loadu128(blk[3]), 3);
        }
        const __m512i Y = _mm512_shuffle_epi8(X, g_hdr_y.v), Z = _mm512_shuffle_epi8(X, g_hdr_z.v);
        __m512i scm = _mm512_and_si512(Y, g_hdr_m1.v);
        scm = or_and(scm, _mm512_srli_epi32(Y, 4), g_hdr_m2.v);
        scm = or_and(scm, _mm512_srli_epi32(Z, 2), g_hdr_m3.v);
        const __m512i SC16 = _mm512_unpacklo_epi8(scm, zero), MN16 = _mm512_unpackhi_epi8(scm, zero);

        /* activations: per column the four vectors matching affine_unpack,
         * the 8 sub-block sums S_j as int16, and da */
        __m512i A[KERN_MAX_COLS][4];
        __m128i S16[KERN_MAX_COLS];
        float da[KERN_MAX_COLS];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const block_q8_K *a = act_at(xa, st, c, b);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int8_t *p = a->qs + 128 * h;
                if (lohi) {
                    A[c][2 * h] = halves(loadu256(p), loadu256(p + 64));
                    A[c][2 * h + 1] = halves(loadu256(p + 32), loadu256(p + 96));
                } else {
                    A[c][2 * h] = loadu512(p);
                    A[c][2 * h + 1] = loadu512(p + 64);
                }
            }
            S16[c] = _mm256_cvtepi32_epi16(_mm256_madd_epi16(loadu256(a->bsums), ones16));
            da[c] = a->d;
        }

        /* T: 16 int32 lanes per (row, column) */
        __m512i T[KQUANT_MAX_ACC]; /* slot (r, c) at r * nc + c */
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512i q[4];
            if (lohi) affine_unpack(blk[r] + qs_off, q5 ? blk[r] + offsetof(block_q5_K, qh) : NULL, q);
            else affine_unpack_nat(blk[r] + qs_off, q5 ? blk[r] + offsetof(block_q5_K, qh) : NULL, q);
            const __m512i S0 = _mm512_permutexvar_epi16((lohi ? g_q4_sidx : g_q4n_sidx)[r][0].v, SC16);
            const __m512i S1 = _mm512_permutexvar_epi16((lohi ? g_q4_sidx : g_q4n_sidx)[r][1].v, SC16);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                const __m512i t0 = _mm512_dpbusd_epi32(zero, q[0], A[c][0]);
                const __m512i t1 = _mm512_dpbusd_epi32(zero, q[1], A[c][1]);
                const __m512i t2 = _mm512_dpbusd_epi32(zero, q[2], A[c][2]);
                const __m512i t3 = _mm512_dpbusd_epi32(zero, q[3], A[c][3]);
                const __m512i s = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(t0, t1), S0);
                T[r * nc + c] = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(t2, t3), S1);
            }
        }

        /* the columns' S_j per slot (lane) */
        __m512i SB;
        if (nc == 1) SB = _mm512_broadcast_i32x4(S16[0]);
        else if (nr == 1) {
            SB = _mm512_castsi128_si512(S16[0]);
            SB = _mm512_inserti32x4(SB, S16[nc > 1 ? 1 : 0], 1);
            SB = _mm512_inserti32x4(SB, S16[nc > 2 ? 2 : 0], 2);
            SB = _mm512_inserti32x4(SB, S16[nc > 3 ? 3 : 0], 3);
        } else {
            const __m512i s01 = _mm512_castsi256_si512(_mm256_set_m128i(S16[nc > 1 ? 1 : 0], S16[0]));
            SB = _mm512_shuffle_i32x4(s01, s01, 0x50); /* [S0, S0, S1, S1] */
        }
        const __m256 DA = nc == 1 ? _mm256_set1_ps(da[0])
                                  : _mm256_setr_ps(da[slot_col(nr, nc, 0, 0) < nc ? slot_col(nr, nc, 0, 0) : 0],
                                                   da[slot_col(nr, nc, 0, 1) < nc ? slot_col(nr, nc, 0, 1) : 0],
                                                   da[slot_col(nr, nc, 0, 2) < nc ? slot_col(nr, nc, 0, 2) : 0],
                                                   da[slot_col(nr, nc, 0, 3) < nc ? slot_col(nr, nc, 0, 3) : 0],
                                                   da[slot_col(nr, nc, 0, 0) < nc ? slot_col(nr, nc, 0, 0) : 0],
                                                   da[slot_col(nr, nc, 0, 1) < nc ? slot_col(nr, nc, 0, 1) : 0],
                                                   da[slot_col(nr, nc, 0, 2) < nc ? slot_col(nr, nc, 0, 2) : 0],
                                                   da[slot_col(nr, nc, 0, 3) < nc ? slot_col(nr, nc, 0, 3) : 0]);
#pragma GCC unroll 2
        for (int g = 0; g < ng; g++) {
            __m512i t[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                t[i] = slot_ok(nr, nc, g, i) ? T[slot_row(nr, nc, g, i) * nc + slot_col(nr, nc, g, i)] : zero;
            /* mins of the slots' rows, lane i = slot i */
            const __m512i MN = !(nc == 2 && nr > 1) ? MN16
                               : g         ? _mm512_shuffle_i32x4(MN16, MN16, 0xEE)
                                           : _mm512_shuffle_i32x4(MN16, MN16, 0x44);
            const __m512i Mv = _mm512_madd_epi16(MN, SB);
            /* lane i: [T_i part, T_i part, M_i part, M_i part], then totals */
            const __m512i B = reduce4(t[0], t[1], t[2], t[3]);
            const __m512i C = _mm512_add_epi32(_mm512_unpacklo_epi64(B, Mv), _mm512_unpackhi_epi64(B, Mv));
            const __m512i D = _mm512_add_epi32(C, _mm512_shuffle_epi32(C, _MM_PERM_CDAB));
            const __m256 F = _mm256_cvtepi32_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi32(g_pick_tm.v, D)));
            /* [d, dmin] of the slots' rows: words 8r, 8r + 1 of X */
            const __m512i didx = _mm512_zextsi128_si512(_mm_setr_epi16(
                (short)(8 * slot_row(nr, nc, g, 0)), (short)(8 * slot_row(nr, nc, g, 1)),
                (short)(8 * slot_row(nr, nc, g, 2)), (short)(8 * slot_row(nr, nc, g, 3)),
                (short)(8 * slot_row(nr, nc, g, 0) + 1), (short)(8 * slot_row(nr, nc, g, 1) + 1),
                (short)(8 * slot_row(nr, nc, g, 2) + 1), (short)(8 * slot_row(nr, nc, g, 3) + 1)));
            const __m256 DD = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(didx, X)));
            const __m256 scl = _mm256_mul_ps(DA, DD); /* [da*d x 4, da*dmin x 4] */
            acc[g] = _mm_fmadd_ps(_mm256_castps256_ps128(F), _mm256_castps256_ps128(scl), acc[g]);
            acc[g] = _mm_fnmadd_ps(_mm256_extractf128_ps(F, 1), _mm256_extractf128_ps(scl, 1), acc[g]);
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < ng; g++) {
        float v[4];
        _mm_storeu_ps(v, acc[g]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            if (slot_ok(nr, nc, g, i)) out[slot_row(nr, nc, g, i) * nc + slot_col(nr, nc, g, i)] = v[i];
    }
}

/* ---- Q6_K ------------------------------------------------------------------- */

/* Weights of half h (elements 128h..128h+127) in natural order as unsigned
 * 0..63 (q + 32): q01 = elements 0..63 (low nibbles of ql[64h..64h+63] and
 * bits 0-1 / 2-3 of qh), q23 = elements 64..127 (high nibbles, bits 4-5 /
 * 6-7). vpdpbusd of q01 (q23) gives dwords 4L..4L+3 = sub-block 8h + L
 * (8h + 4 + L); packs puts them in words 0..3 (4..7) of lane L, so the scale
 * vector is sc[8h + L] x 4, sc[8h + 4 + L] x 4, picked by vpermw from SC16
 * (rows 2s, 2s+1 of the tile in SC16[s], words 16 (r & 1) + j). */
#define Q6S_LANE(r, h, L) W4(16 * ((r) & 1) + 8 * (h) + (L)), W4(16 * ((r) & 1) + 8 * (h) + (L) + 4)
#define Q6S_IDX(r, hf) {.h = {Q6S_LANE(r, hf, 0), Q6S_LANE(r, hf, 1), Q6S_LANE(r, hf, 2), Q6S_LANE(r, hf, 3)}}
static const v512_t g_q6_sidx[4][2] = {{Q6S_IDX(0, 0), Q6S_IDX(0, 1)},
                                       {Q6S_IDX(1, 0), Q6S_IDX(1, 1)},
                                       {Q6S_IDX(2, 0), Q6S_IDX(2, 1)},
                                       {Q6S_IDX(3, 0), Q6S_IDX(3, 1)}};

TERN_INLINE void q6k_tile(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                        float *out, const int unused) {
    (void)unused;
    const int ng = KQ_GROUPS(nr, nc);
    const block_q6_K *row[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) row[r] = (const block_q6_K *)wr[r < nr ? r : 0];
    const __m512i zero = _mm512_setzero_si512();
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const block_q6_K *blk[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) blk[r] = row[r] + b;
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) prefetch_ahead(blk[r], sizeof *blk[r]);

        /* scales of all rows as int16: SC16[s] = rows 2s, 2s+1 (16 words
         * each); SN = -32 x those, for the -32 offset */
        __m512i X = _mm512_zextsi128_si512(loadu128(blk[0]->scales)); /* lanes of absent rows: 0 */
        if (nr > 1) X = _mm512_inserti32x4(X, loadu128(blk[1]->scales), 1);
        if (nr > 2) {
            X = _mm512_inserti32x4(X, loadu128(blk[2]->scales), 2);
            X = _mm512_inserti32x4(X, loadu128(blk[3]->scales), 3);
        }
        __m512i SC16[2], SN[2];
        SC16[0] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(X));
        SC16[1] = nr > 2 ? _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(X, 1)) : SC16[0];
        SN[0] = _mm512_mullo_epi16(SC16[0], _mm512_set1_epi16(-32));
        SN[1] = nr > 2 ? _mm512_mullo_epi16(SC16[1], _mm512_set1_epi16(-32)) : SN[0];
        /* d of rows 0..3 */
        uint64_t dh = 0;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) dh |= (uint64_t)blk[r]->d << (16 * r);
        const __m128 D4 = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)dh));

        __m512i A[KERN_MAX_COLS][4], BS[KERN_MAX_COLS][2];
        float da[KERN_MAX_COLS];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const block_q8_K *a = act_at(xa, st, c, b);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) A[c][i] = loadu512(a->qs + 64 * i);
            const __m256i bs = loadu256(a->bsums);
            BS[c][0] = _mm512_zextsi256_si512(bs);         /* bsums in words 0..15 */
            BS[c][1] = _mm512_inserti64x4(zero, bs, 1); /* bsums in words 16..31 */
            da[c] = a->d;
        }

        __m512i T[KQUANT_MAX_ACC]; /* slot (r, c) at r * nc + c */
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512i q[4];
            q6k_unpack(blk[r], q);
            const __m512i S0 = _mm512_permutexvar_epi16(g_q6_sidx[r][0].v, SC16[r >> 1]);
            const __m512i S1 = _mm512_permutexvar_epi16(g_q6_sidx[r][1].v, SC16[r >> 1]);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                /* -32 * sum_k sc_k * bsums_k, then the scaled sums of q + 32 */
                __m512i s = _mm512_dpwssd_epi32(zero, BS[c][r & 1], SN[r >> 1]);
                const __m512i t0 = _mm512_dpbusd_epi32(zero, q[0], A[c][0]);
                const __m512i t1 = _mm512_dpbusd_epi32(zero, q[1], A[c][1]);
                const __m512i t2 = _mm512_dpbusd_epi32(zero, q[2], A[c][2]);
                const __m512i t3 = _mm512_dpbusd_epi32(zero, q[3], A[c][3]);
                s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(t0, t1), S0);
                T[r * nc + c] = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(t2, t3), S1);
            }
        }

        const __m128 DA = nc == 1 ? _mm_set1_ps(da[0])
                                  : _mm_setr_ps(da[slot_col(nr, nc, 0, 0) < nc ? slot_col(nr, nc, 0, 0) : 0],
                                                da[slot_col(nr, nc, 0, 1) < nc ? slot_col(nr, nc, 0, 1) : 0],
                                                da[slot_col(nr, nc, 0, 2) < nc ? slot_col(nr, nc, 0, 2) : 0],
                                                da[slot_col(nr, nc, 0, 3) < nc ? slot_col(nr, nc, 0, 3) : 0]);
#pragma GCC unroll 2
        for (int g = 0; g < ng; g++) {
            __m512i t[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                t[i] = slot_ok(nr, nc, g, i) ? T[slot_row(nr, nc, g, i) * nc + slot_col(nr, nc, g, i)] : zero;
            const __m512i B = reduce4(t[0], t[1], t[2], t[3]);
            const __m512i C = _mm512_add_epi32(B, _mm512_shuffle_epi32(B, _MM_PERM_BADC));
            const __m512i D = _mm512_add_epi32(C, _mm512_shuffle_epi32(C, _MM_PERM_CDAB));
            const __m128 F = _mm_cvtepi32_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(g_pick_tm.v, D)));
            const int sel = slot_row(nr, nc, g, 0) | slot_row(nr, nc, g, 1) << 2 | slot_row(nr, nc, g, 2) << 4 |
                            slot_row(nr, nc, g, 3) << 6;
            const __m128 Dg = sel == 0xE4 ? D4 : _mm_permutevar_ps(D4, _mm_setr_epi32(slot_row(nr, nc, g, 0),
                                                                                      slot_row(nr, nc, g, 1),
                                                                                      slot_row(nr, nc, g, 2),
                                                                                      slot_row(nr, nc, g, 3)));
            acc[g] = _mm_fmadd_ps(F, _mm_mul_ps(DA, Dg), acc[g]);
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < ng; g++) {
        float v[4];
        _mm_storeu_ps(v, acc[g]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            if (slot_ok(nr, nc, g, i)) out[slot_row(nr, nc, g, i) * nc + slot_col(nr, nc, g, i)] = v[i];
    }
}

/* ---- tiles and entry points -------------------------------------------------- */

/* The tile table and entry points (dot_q4_K_avx512, dot_rows_q4_K_avx512,
 * ...) are kquant_entry.h's, over this file's tile templates. */
#define KQ_ISA avx512
#define KQ_AFFINE_KERNEL affine_tile
#define KQ_Q6_KERNEL q6k_tile
#include "kernels/x86/kquant_entry.h"

/* ==== Q8_K activations ====================================================== */

/* The scalar quantizer's operations exactly (see kquant_avx2_matvec.c). */
static void act_q8_K_avx512(const float *x, void *xav, int64_t k) {
    TERN_CHECK(k % QK_K == 0);
    block_q8_K *y = xav;
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        __m512 m0 = _mm512_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
        for (int i = 0; i < QK_K; i += 64) {
            m0 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m0);
            m1 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i + 16)), m1);
            m2 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i + 32)), m2);
            m3 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i + 48)), m3);
        }
        __m512 m = _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3));
        __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const __m512 id = _mm512_set1_ps(127.0f / amax);
        y[b].d = amax / 127.0f;
        __m256i q[8];
        for (int i = 0; i < 8; i++) {
            __m128i v[2];
            for (int u = 0; u < 2; u++) {
                __m512 f = _mm512_mul_ps(_mm512_loadu_ps(x + 32 * i + 16 * u), id);
                f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
                v[u] = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(f)); /* MXCSR default: nearest even */
            }
            q[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(v[0]), v[1], 1);
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * i), q[i]);
        }
        kquant_bsums_avx2(q, y[b].bsums);
    }
}

void kquant_register_avx512(kern_table_t t, const kern_options_t *o) {
    (void)o;
    t[TYPE_Q4_K][ISA_AVX512] = (kern_ops_t){dot_q4_K_avx512, act_q8_K_avx512, dot_rows_q4_K_avx512, kquant_avx512_gemm[0]};
    t[TYPE_Q5_K][ISA_AVX512] = (kern_ops_t){dot_q5_K_avx512, act_q8_K_avx512, dot_rows_q5_K_avx512, kquant_avx512_gemm[1]};
    t[TYPE_Q6_K][ISA_AVX512] = (kern_ops_t){dot_q6_K_avx512, act_q8_K_avx512, dot_rows_q6_K_avx512, kquant_avx512_gemm[2]};
}
