/*
 * kquant_avx512.c - AVX-512 (F/BW/VL/DQ + VNNI) kernels of Q4_K, Q5_K, Q6_K
 * weights against Q8_K activations: the dot / multi-row ("rows") functions
 * used by matvec, a GEMM of their own (kern_gemm_t) used for 5 or more
 * columns, and the AVX-512 Q8_K activation quantizer. Only reached through
 * the kernel table when the CPU has these extensions.
 *
 * ---- The float order (shared by every function below, bit for bit) -------
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
 * ---- GEMM (kern_gemm_t) ---------------------------------------------------
 *
 * prep lays out 16 columns per group, per super-block (GQ_ACT_SB bytes):
 *   [GQ_ACT_QS] 64 vectors; vector i holds k-slice 4i..4i+3 of each of the 16
 *               columns (dword c = column c), each byte XOR 0x80, i.e. a + 128
 *               as an unsigned byte;
 *   [GQ_ACT_P]  4 vectors; dword c of vector i = (S_2i, S_2i+1) of column c
 *               as an int16 pair, S_j = bsums[2j] + bsums[2j+1];
 *   [GQ_ACT_D]  the 16 columns' da.
 * Lanes of missing columns (a partial group) are zero.
 * run (per thread, on a chunk of rows) loops over
 *   column blocks (up to gq_gmax groups, whose activations stay in L2)
 *     row blocks (up to gq_mc rows, decoded into per-thread scratch: one
 *                 gq_row_t per row and super-block, in panels of GQ_R rows)
 *       k-chunks (GQ_KC super-blocks: a group's chunk of activations, 17 KB,
 *                 stays in L1 while every panel passes over it)
 *         groups, panels: the micro-kernel, GQ_R rows x 16 columns,
 * with the float chains of the column block parked in scratch between
 * k-chunks (a float stored and reloaded is the same float, and each chain
 * still sees its super-blocks in order).
 * Micro-kernel, per super-block and row: T starts at negc = -128 * sum_j sc_j
 * * sum_{i in j} q_i (the correction of the +128 offset, computed once per
 * row and super-block at decode); per sub-block, k-slice by k-slice, one
 * activation vector is loaded and serves every row: vpdpbusd(activations +
 * 128 (unsigned), the row's weight dword broadcast from memory (signed: Q4_K
 * 0..15, Q5_K 0..31, Q6_K q - 32)) into the row's zeroed sub-block
 * accumulator; then T += accumulator * sc_j (vpmulld with a broadcast
 * operand). Two sub-blocks are in flight per row (two independent chains).
 * M_b is four vpdpwssd of the row's mins pairs against the [GQ_ACT_P]
 * vectors; then the chain above with 16 lanes = 16 columns.
 * Measured choices: the embedded broadcast of the weights (signed operand,
 * hence the +128 offset on the activations) beat broadcasting unsigned
 * weights into a register by ~15% (one fused uop per vpdpbusd instead of
 * two); the sub-block scale cannot go through vpdpwssd because a sub-block
 * sum does not fit int16, so it costs one vpmulld per row and sub-block.
 * With few columns (up to 6, Q6_K 8) run uses the matvec tiles instead
 * (gq_run_small): same chain, same bits, faster than 16 lanes mostly idle.
 * Bounds of the offset form: per sub-block |sum q_i (a_i + 128)| <= 32 * 31 *
 * 255 (Q6_K: 16 * 32 * 255), scaled and summed over the super-block below
 * 2^29, the correction likewise.
 */
#include "core/common.h"
#include "kernels/inline.h"
#include "kernels/kquant.h"
#include "kernels/prefetch.h"

#include <immintrin.h>
#include <stddef.h>


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
#define W4(x) (x), (x), (x), (x)
#define Q4S_LANE(r, h, L) W4(8 * (r) + 4 * (h) + 2 * ((L) >= 2)), W4(8 * (r) + 4 * (h) + 2 * ((L) >= 2) + 1)
#define Q4S_IDX(r, hf) {.h = {Q4S_LANE(r, hf, 0), Q4S_LANE(r, hf, 1), Q4S_LANE(r, hf, 2), Q4S_LANE(r, hf, 3)}}
static const v512_t g_q4_sidx[4][2] = {{Q4S_IDX(0, 0), Q4S_IDX(0, 1)},
                                       {Q4S_IDX(1, 0), Q4S_IDX(1, 1)},
                                       {Q4S_IDX(2, 0), Q4S_IDX(2, 1)},
                                       {Q4S_IDX(3, 0), Q4S_IDX(3, 1)}};
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

/* ==== GEMM ================================================================== */

#define GQ_LANES KERN_GEMM_GROUP /* columns per vector */
#define GQ_R 8                   /* rows per micro-kernel panel */
#define GQ_MC_MAX 64             /* rows decoded per block */
#define GQ_MC_BYTES (256 * 1024) /* decoded bytes per block (L2) */
#define GQ_KC 4                  /* super-blocks per k-chunk: 4 * GQ_ACT_SB = 17 KB of activations (L1) */
#define GQ_GMAX 32               /* groups of 16 columns per column block, at most */
#define GQ_GMAX_BYTES (768 * 1024) /* their activations (L2) */

/* prep's layout of one super-block of a 16-column group (see the header) */
#define GQ_ACT_QS 0
#define GQ_ACT_P (GQ_ACT_QS + 64 * 64)
#define GQ_ACT_D (GQ_ACT_P + 4 * 64)
#define GQ_ACT_SB (GQ_ACT_D + 64)

_Static_assert(GQ_LANES == 16, "one zmm of int32 per group of columns");

/* One row's super-block, decoded for the micro-kernel. w: the 256 weights
 * as signed bytes (Q4_K 0..15 / Q5_K 0..31, the sub-blocks stored in the
 * order of gq_sub below; Q6_K: q - 32 in natural order); sc: sub-block scales as
 * int32 (natural order); mn: mins pairs (m_2i, m_2i+1) as int16 pairs; negc:
 * -128 * sum_j sc_j * sum_{i in j} w_i, the correction of the +128 offset of
 * the activations. */
typedef struct {
    int8_t w[QK_K];
    int32_t sc[16];
    uint32_t mn[4];
    float d, dmin;
    int32_t negc, pad;
} gq_row_t;
_Static_assert(sizeof(gq_row_t) % 32 == 0, "gq_row_t: whole 32-byte units");

/* Q4_K/Q5_K storage order: 32-byte unit s of w holds sub-block gq_sub[s]
 * (the lo / hi vectors of affine_unpack, stored as they come). */
static const int gq_sub[8] = {0, 2, 1, 3, 4, 6, 5, 7};

static size_t gq_group_size(int64_t k) {
    if (k <= 0 || k % QK_K) return 0;
    const uint64_t nb = (uint64_t)(k / QK_K);
    if (nb > SIZE_MAX / GQ_ACT_SB) return 0;
    return (size_t)nb * GQ_ACT_SB;
}

/* Rows decoded per block: as many as fit GQ_MC_BYTES, a multiple of GQ_R,
 * at least GQ_R, at most GQ_MC_MAX. */
static int64_t gq_mc(int64_t nb) {
    const int64_t per_row = nb * (int64_t)sizeof(gq_row_t);
    int64_t mc = (int64_t)GQ_MC_BYTES / (per_row > 0 ? per_row : 1) / GQ_R * GQ_R;
    if (mc < GQ_R) mc = GQ_R;
    if (mc > GQ_MC_MAX) mc = GQ_MC_MAX;
    return mc;
}

/* Bytes of a decoded row block (gq_mc rows), a multiple of 64. */
static size_t gq_dec_bytes(int64_t nb) {
    return ((size_t)gq_mc(nb) * (size_t)nb * sizeof(gq_row_t) + 63) & ~(size_t)63;
}

/* Groups per column block: as many as fit GQ_GMAX_BYTES of activations,
 * 1..GQ_GMAX. */
static int64_t gq_gmax(int64_t nb) {
    const int64_t per_group = nb * (int64_t)GQ_ACT_SB;
    int64_t g = (int64_t)GQ_GMAX_BYTES / (per_group > 0 ? per_group : 1);
    if (g < 1) g = 1;
    if (g > GQ_GMAX) g = GQ_GMAX;
    return g;
}

/* The decoded row block, then the float chains of one column block. */
static size_t gq_scratch_size(int64_t k) {
    if (k <= 0 || k % QK_K) return 0;
    const uint64_t nb = (uint64_t)(k / QK_K);
    if (nb > SIZE_MAX / 2 / sizeof(gq_row_t) / GQ_MC_MAX) return SIZE_MAX; /* the allocation fails: ENOMEM */
    return gq_dec_bytes((int64_t)nb) +
           (size_t)(GQ_MC_MAX / GQ_R) * (size_t)gq_gmax((int64_t)nb) * GQ_R * GQ_LANES * sizeof(float);
}

/* 16 x 16 transpose of dwords: out[i] dword c = in[c] dword i. */
TERN_INLINE void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        t[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
    /* u[4p + e], lane k = rows 4p..4p+3, element 4k + e */
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        u[4 * p + 0] = _mm512_unpacklo_epi64(t[4 * p], t[4 * p + 2]);
        u[4 * p + 1] = _mm512_unpackhi_epi64(t[4 * p], t[4 * p + 2]);
        u[4 * p + 2] = _mm512_unpacklo_epi64(t[4 * p + 1], t[4 * p + 3]);
        u[4 * p + 3] = _mm512_unpackhi_epi64(t[4 * p + 1], t[4 * p + 3]);
    }
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), x1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
        const __m512i y0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
        const __m512i y1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
        r[e] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        r[4 + e] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        r[8 + e] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}

/* One group of ncols (1..16) Q8_K columns into the layout of the header. */
static void gq_prep(int64_t k, const void *xav, size_t st, int ncols, void *xgv) {
    TERN_CHECK(k % QK_K == 0 && ncols >= 1 && ncols <= GQ_LANES);
    const char *xa = xav;
    uint8_t *xg = xgv;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < k / QK_K; b++) {
        uint8_t *o = xg + (size_t)b * GQ_ACT_SB;
        for (int q = 0; q < 4; q++) {
            __m512i r[16];
            for (int c = 0; c < GQ_LANES; c++)
                r[c] = c < ncols ? _mm512_xor_si512(loadu512(act_at(xa, st, c, b)->qs + 64 * q), bias)
                                 : _mm512_setzero_si512();
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(o + GQ_ACT_QS + 64 * (16 * q + i), r[i]);
        }
        uint32_t P[4][GQ_LANES];
        float D[GQ_LANES];
        for (int c = 0; c < GQ_LANES; c++) {
            if (c >= ncols) {
                for (int i = 0; i < 4; i++) P[i][c] = 0;
                D[c] = 0.0f;
                continue;
            }
            const block_q8_K *a = act_at(xa, st, c, b);
            for (int i = 0; i < 4; i++) {
                const int s0 = a->bsums[4 * i] + a->bsums[4 * i + 1], s1 = a->bsums[4 * i + 2] + a->bsums[4 * i + 3];
                P[i][c] = (uint32_t)(uint16_t)s0 | (uint32_t)(uint16_t)s1 << 16;
            }
            D[c] = a->d;
        }
        memcpy(o + GQ_ACT_P, P, sizeof P);
        memcpy(o + GQ_ACT_D, D, sizeof D);
    }
}

/* sum of the 16 int32 lanes (exact) */
TERN_INLINE int32_t hsum_epi32(__m512i v) {
    __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* Byte selectors: lane L of the result = byte sel(L) of each 128-bit lane
 * of the source, 16 times. */
#define B16(x) W4(x), W4(x), W4(x), W4(x)
/* Q4_K/Q5_K: the scale of each byte of lo / hi of half h (see affine_unpack) */
static const v512_t g_gq_scb[2][2] = {{{.b = {B16(0), B16(0), B16(2), B16(2)}}, {.b = {B16(1), B16(1), B16(3), B16(3)}}},
                                      {{.b = {B16(4), B16(4), B16(6), B16(6)}}, {.b = {B16(5), B16(5), B16(7), B16(7)}}}};
/* Q6_K: the scale of each byte of q01 / q23 of half h (see q6k_unpack) */
static const v512_t g_gq_scb6[2][2] = {{{.b = {B16(0), B16(1), B16(2), B16(3)}}, {.b = {B16(4), B16(5), B16(6), B16(7)}}},
                                       {{.b = {B16(8), B16(9), B16(10), B16(11)}},
                                        {.b = {B16(12), B16(13), B16(14), B16(15)}}}};

/* One Q4_K (q5 = 0) / Q5_K block of one row into o. */
static void gq_decode_affine(const uint8_t *blk, gq_row_t *o, const int q5) {
    uint64_t sc8, m8;
    kquant_scales_k4(blk + offsetof(block_q4_K, scales), &sc8, &m8);
    __m512i q[4];
    affine_unpack(blk + (q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs)),
                  q5 ? blk + offsetof(block_q5_K, qh) : NULL, q);
    /* sum_j sc_j * (sum of sub-block j's weights), by vpdpbusd against the
     * scale of each weight's sub-block */
    const __m512i scb = _mm512_set1_epi64((long long)sc8);
    __m512i cs = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        _mm512_storeu_si512(o->w + 64 * v, q[v]);
        cs = _mm512_dpbusd_epi32(cs, q[v], _mm512_shuffle_epi8(scb, g_gq_scb[v >> 1][v & 1].v));
    }
    o->negc = -128 * hsum_epi32(cs);
    _mm256_storeu_si256((__m256i *)o->sc, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8)));
    _mm_storeu_si128((__m128i *)o->mn, _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m8)));
    fp16_t hd, hm;
    memcpy(&hd, blk, sizeof hd);
    memcpy(&hm, blk + sizeof hd, sizeof hm);
    o->d = _cvtsh_ss(hd);
    o->dmin = _cvtsh_ss(hm);
}

/* One Q6_K block of one row into o. */
static void gq_decode_q6(const block_q6_K *w, gq_row_t *o) {
    __m512i q[4];
    q6k_unpack(w, q);
    const __m128i sc = loadu128(w->scales);
    const __m512i scx = _mm512_broadcast_i32x4(sc);
    const __m512i m32 = _mm512_set1_epi8(32);
    __m512i cs = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        _mm512_storeu_si512(o->w + 64 * v, _mm512_sub_epi8(q[v], m32));
        cs = _mm512_dpbusd_epi32(cs, q[v], _mm512_shuffle_epi8(scx, g_gq_scb6[v >> 1][v & 1].v));
    }
    /* sum_j sc_j * sum_{i in j} (q_i - 32) = sum_j sc_j * sum q_i - 512 * sum_j sc_j */
    const __m512i sc32 = _mm512_cvtepi8_epi32(sc);
    o->negc = -128 * (hsum_epi32(cs) - 512 * hsum_epi32(sc32));
    _mm512_storeu_si512(o->sc, sc32);
    memset(o->mn, 0, sizeof o->mn);
    o->d = _cvtsh_ss(w->d);
    o->dmin = 0.0f;
}

/* acc + vpdpbusd(a, the dword at p broadcast), with the broadcast embedded
 * in the instruction (one fused uop; compilers load it separately). dp0
 * starts from a zero it makes itself (a zero idiom, no copy of a shared
 * zero register). */
TERN_INLINE __m512i dp_bcast(__m512i acc, __m512i a, const void *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_t *)p));
    return acc;
}
TERN_INLINE __m512i dp0_bcast(__m512i a, const void *p) {
    __m512i acc;
    __asm__("vpxord %0, %0, %0\n\tvpdpbusd %2%{1to16%}, %1, %0" : "=&v"(acc) : "v"(a), "m"(*(const int32_t *)p));
    return acc;
}
/* t + d * (the int32 at p), in place (one asm block, so that the add
 * stays next to its multiply and t stays in a register) */
TERN_INLINE __m512i muladd_bcast(__m512i t, __m512i d, const int32_t *p) {
    __asm__("vpmulld %2%{1to16%}, %1, %1\n\tvpaddd %1, %0, %0" : "+v"(t), "+v"(d) : "m"(*p));
    return t;
}

/* GQ_R rows (pw: [b][GQ_R] decoded) x 16 columns (xg: one group) over nb
 * super-blocks, continuing the float chains of st[r][c] (row r, column c;
 * first: start them at +0.0f) and leaving them there. Per sub-block, k-slice by k-slice: one
 * activation vector, then one vpdpbusd per row (the rows' chains advance
 * together, so independent instructions follow each other). q6: Q6_K's 16
 * sub-blocks of 16 (4 k-slices each, in order, no mins); else Q4_K/Q5_K's
 * 8 sub-blocks of 32 (8 k-slices each, stored in gq_sub order, with mins).
 * Inlined with a constant q6 into the two kernels below. */
TERN_INLINE void gq_kernel(const gq_row_t *pw, const uint8_t *xg, int64_t nb, float st[GQ_R][GQ_LANES], int first,
                         const bool q6) {
    const int units = q6 ? 16 : 8, slices = q6 ? 4 : 8; /* per unit: 4 * slices weight bytes */
    __m512 acc[GQ_R];
#pragma GCC unroll 8
    for (int r = 0; r < GQ_R; r++) acc[r] = first ? _mm512_setzero_ps() : _mm512_load_ps(st[r]);
    for (int64_t b = 0; b < nb; b++) {
        const gq_row_t *w = pw + b * GQ_R;
        const uint8_t *x = xg + (size_t)b * GQ_ACT_SB;
        __m512i T[GQ_R];
#pragma GCC unroll 8
        for (int r = 0; r < GQ_R; r++) T[r] = _mm512_set1_epi32(w[r].negc);
#pragma GCC unroll 8
        for (int u = 0; u < units; u += 2) { /* storage units u, u + 1: two chains per row */
            const int j0 = q6 ? u : gq_sub[u], j1 = q6 ? u + 1 : gq_sub[u + 1];
            const uint8_t *x0 = x + GQ_ACT_QS + 64 * slices * j0, *x1 = x + GQ_ACT_QS + 64 * slices * j1;
            const int o0 = 4 * slices * u, o1 = o0 + 4 * slices;
            __m512i d0[GQ_R], d1[GQ_R];
            {
                const __m512i a0 = _mm512_loadu_si512(x0), a1 = _mm512_loadu_si512(x1);
#pragma GCC unroll 8
                for (int r = 0; r < GQ_R; r++) {
                    d0[r] = dp0_bcast(a0, w[r].w + o0);
                    d1[r] = dp0_bcast(a1, w[r].w + o1);
                }
            }
#pragma GCC unroll 7
            for (int i = 1; i < slices; i++) {
                const __m512i a0 = _mm512_loadu_si512(x0 + 64 * i), a1 = _mm512_loadu_si512(x1 + 64 * i);
#pragma GCC unroll 8
                for (int r = 0; r < GQ_R; r++) {
                    d0[r] = dp_bcast(d0[r], a0, w[r].w + o0 + 4 * i);
                    d1[r] = dp_bcast(d1[r], a1, w[r].w + o1 + 4 * i);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < GQ_R; r++) {
                T[r] = muladd_bcast(T[r], d0[r], &w[r].sc[j0]);
                T[r] = muladd_bcast(T[r], d1[r], &w[r].sc[j1]);
            }
        }
        const __m512 DA = _mm512_loadu_ps(x + GQ_ACT_D);
        if (q6) {
#pragma GCC unroll 8
            for (int r = 0; r < GQ_R; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[r]), _mm512_mul_ps(DA, _mm512_set1_ps(w[r].d)), acc[r]);
            continue;
        }
        __m512i P[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) P[i] = _mm512_loadu_si512(x + GQ_ACT_P + 64 * i);
#pragma GCC unroll 8
        for (int r = 0; r < GQ_R; r++) {
            __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), P[0], _mm512_set1_epi32((int)w[r].mn[0]));
#pragma GCC unroll 3
            for (int i = 1; i < 4; i++) m = _mm512_dpwssd_epi32(m, P[i], _mm512_set1_epi32((int)w[r].mn[i]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[r]), _mm512_mul_ps(DA, _mm512_set1_ps(w[r].d)), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(DA, _mm512_set1_ps(w[r].dmin)), acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < GQ_R; r++) _mm512_store_ps(st[r], acc[r]);
}
static void gq_kernel_affine(const gq_row_t *pw, const uint8_t *xg, int64_t nb, float st[GQ_R][GQ_LANES], int first) {
    gq_kernel(pw, xg, nb, st, first, false);
}
static void gq_kernel_q6(const gq_row_t *pw, const uint8_t *xg, int64_t nb, float st[GQ_R][GQ_LANES], int first) {
    gq_kernel(pw, xg, nb, st, first, true);
}

enum { GQ_Q4K, GQ_Q5K, GQ_Q6K };

/* Few columns: most lanes of a 16-column group would be wasted, and the
 * matvec tiles are faster; they compute the same chain, so the bits are the
 * same. Measured (GFLOP/s, 5 / 8 columns): Q4_K 4x2 tiles ~110 / ~113
 * against the GEMM's ~80 / ~130; Q6_K 1x4 tiles ~107 / ~131 against ~71 /
 * ~116. So Q4_K/Q5_K take 4x2 tiles up to GQ_SMALL_N columns, Q6_K 1x4
 * tiles up to GQ_SMALL_N6. */
#define GQ_SMALL_N 6
#define GQ_SMALL_N6 8
static void gq_run_small(const kern_gemm_args_t *a, const char *w, size_t row_bytes, int64_t nrows, float *y,
                         int64_t ldy, const int fmt) {
    const int n = (int)a->n;
    const char *xa = a->xa;
    if (fmt == GQ_Q6K) {
        for (int64_t r = 0; r < nrows; r++) {
            float out[GQ_SMALL_N6];
            dot_q6_K_avx512(a->k, w + (size_t)r * row_bytes, xa, a->xa_stride, n, out);
            for (int c = 0; c < n; c++) y[c * ldy + r] = out[c];
        }
        return;
    }
    const kern_rows_fn rows_fn = fmt == GQ_Q5K ? dot_rows_q5_K_avx512 : dot_rows_q4_K_avx512;
    for (int64_t r0 = 0; r0 < nrows; r0 += KQUANT_MAX_ROWS) {
        const int nr = nrows - r0 < KQUANT_MAX_ROWS ? (int)(nrows - r0) : KQUANT_MAX_ROWS;
        const void *wp[KQUANT_MAX_ROWS];
        for (int i = 0; i < nr; i++) wp[i] = w + (size_t)(r0 + i) * row_bytes;
        for (int c0 = 0; c0 < n; c0 += 2) {
            const int nc = n - c0 < 2 ? n - c0 : 2;
            float out[KQUANT_MAX_ROWS * 2];
            rows_fn(a->k, wp, nr, xa + (size_t)c0 * a->xa_stride, a->xa_stride, nc, out);
            for (int i = 0; i < nr; i++)
                for (int c = 0; c < nc; c++) y[(c0 + c) * ldy + r0 + i] = out[i * nc + c];
        }
    }
}

/* run: columns in blocks of up to gq_gmax groups (whose activations stay in
 * L2 while every row passes over them); rows in blocks of up to gq_mc
 * decoded rows (L2); k in chunks of GQ_KC super-blocks. Per chunk and group
 * the activations (GQ_KC * GQ_ACT_SB bytes) stay in L1 while every panel of
 * the row block passes over them; the float chains wait in scratch between
 * chunks (stored and reloaded exactly). */
TERN_INLINE void gq_run(const kern_gemm_args_t *a, const void *wv, size_t row_bytes, int64_t nrows, float *y,
                      int64_t ldy, void *scratch, const int fmt) {
    TERN_CHECK(a->k % QK_K == 0 && a->xg != NULL && scratch != NULL);
    if (a->n <= (fmt == GQ_Q6K ? GQ_SMALL_N6 : GQ_SMALL_N)) {
        gq_run_small(a, wv, row_bytes, nrows, y, ldy, fmt);
        return;
    }
    const int64_t nb = a->k / QK_K, ngroups = (a->n + GQ_LANES - 1) / GQ_LANES;
    const int64_t mc_max = gq_mc(nb), gmax = gq_gmax(nb);
    const size_t bsz = fmt == GQ_Q6K ? sizeof(block_q6_K) : fmt == GQ_Q5K ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const char *w = wv;
    /* decoded rows: panel p, super-block b, row r at dec[(p * nb + b) * GQ_R + r];
     * chains: panel p, group g of the column block at st[p * gmax + g] */
    gq_row_t *dec = scratch;
    float(*st)[GQ_R][GQ_LANES] = (void *)((char *)scratch + gq_dec_bytes(nb));
    for (int64_t g0 = 0; g0 < ngroups; g0 += gmax) {
        const int64_t gn = ngroups - g0 < gmax ? ngroups - g0 : gmax;
        for (int64_t r0 = 0; r0 < nrows; r0 += mc_max) {
            const int64_t mc = nrows - r0 < mc_max ? nrows - r0 : mc_max;
            const int64_t np = (mc + GQ_R - 1) / GQ_R;
            for (int64_t i = 0; i < np * GQ_R; i++) {
                gq_row_t *o = dec + (i / GQ_R) * nb * GQ_R + i % GQ_R;
                if (i >= mc) {
                    for (int64_t b = 0; b < nb; b++) memset(o + b * GQ_R, 0, sizeof *o);
                    continue;
                }
                const char *row = w + (size_t)(r0 + i) * row_bytes;
                for (int64_t b = 0; b < nb; b++) {
                    const char *blk = row + (size_t)b * bsz;
                    if (fmt == GQ_Q6K) gq_decode_q6((const block_q6_K *)blk, o + b * GQ_R);
                    else gq_decode_affine((const uint8_t *)blk, o + b * GQ_R, fmt == GQ_Q5K);
                }
            }
            for (int64_t k0 = 0; k0 < nb; k0 += GQ_KC) {
                const int64_t kc = nb - k0 < GQ_KC ? nb - k0 : GQ_KC;
                for (int64_t g = 0; g < gn; g++) {
                    const uint8_t *xg = (const uint8_t *)a->xg + (size_t)(g0 + g) * a->xg_group + (size_t)k0 * GQ_ACT_SB;
                    for (int64_t p = 0; p < np; p++) {
                        const gq_row_t *pw = dec + (p * nb + k0) * GQ_R;
                        if (fmt == GQ_Q6K) gq_kernel_q6(pw, xg, kc, st[p * gmax + g], k0 == 0);
                        else gq_kernel_affine(pw, xg, kc, st[p * gmax + g], k0 == 0);
                    }
                }
            }
            for (int64_t g = 0; g < gn; g++) {
                const int64_t c0 = (g0 + g) * GQ_LANES;
                const int nc = a->n - c0 < GQ_LANES ? (int)(a->n - c0) : GQ_LANES;
                for (int64_t p = 0; p < np; p++) {
                    const int64_t rb = r0 + p * GQ_R;
                    const int nr = nrows - rb < GQ_R ? (int)(nrows - rb) : GQ_R;
                    const float(*out)[GQ_LANES] = st[p * gmax + g];
                    for (int c = 0; c < nc; c++) {
                        float *yc = y + (c0 + c) * ldy + rb;
                        for (int r = 0; r < nr; r++) yc[r] = out[r][c];
                    }
                }
            }
        }
    }
}

static void gq_run_q4k(const kern_gemm_args_t *a, const void *w, size_t rb, int64_t nr, float *y, int64_t ldy,
                       void *s) {
    gq_run(a, w, rb, nr, y, ldy, s, GQ_Q4K);
}
static void gq_run_q5k(const kern_gemm_args_t *a, const void *w, size_t rb, int64_t nr, float *y, int64_t ldy,
                       void *s) {
    gq_run(a, w, rb, nr, y, ldy, s, GQ_Q5K);
}
static void gq_run_q6k(const kern_gemm_args_t *a, const void *w, size_t rb, int64_t nr, float *y, int64_t ldy,
                       void *s) {
    gq_run(a, w, rb, nr, y, ldy, s, GQ_Q6K);
}

/* One prep (and group_size) for the three formats, so that matrices of
 * different K formats sharing an input share its layout. */
static const kern_gemm_t g_gemm_q4k = {gq_group_size, gq_prep, gq_scratch_size, gq_run_q4k};
static const kern_gemm_t g_gemm_q5k = {gq_group_size, gq_prep, gq_scratch_size, gq_run_q5k};
static const kern_gemm_t g_gemm_q6k = {gq_group_size, gq_prep, gq_scratch_size, gq_run_q6k};

/* ==== Q8_K activations ====================================================== */

/* The scalar quantizer's operations exactly (see kquant_avx2.c). */
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
    t[TYPE_Q4_K][ISA_AVX512] = (kern_ops_t){dot_q4_K_avx512, act_q8_K_avx512, dot_rows_q4_K_avx512, &g_gemm_q4k};
    t[TYPE_Q5_K][ISA_AVX512] = (kern_ops_t){dot_q5_K_avx512, act_q8_K_avx512, dot_rows_q5_K_avx512, &g_gemm_q5k};
    t[TYPE_Q6_K][ISA_AVX512] = (kern_ops_t){dot_q6_K_avx512, act_q8_K_avx512, dot_rows_q6_K_avx512, &g_gemm_q6k};
}
