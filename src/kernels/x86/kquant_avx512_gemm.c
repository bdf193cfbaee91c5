/*
 * kquant_avx512_gemm.c - the AVX-512 GEMM (kern_gemm_t) of Q4_K, Q5_K and
 * Q6_K weights against Q8_K activations, used for 5 or more columns
 * (registered by kquant_avx512_matvec.c). Every (row, column) takes THE
 * FLOAT ORDER stated at the top of kquant_avx512_matvec.c (exact T_b, M_b
 * per super-block, one float chain), so the GEMM gives the bits of the dot;
 * kquant_avx512.h holds what the two files share.
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
 * Lanes of missing columns (a partial group) are zero. A group of at most
 * 8 columns is laid out for the row-pair kernel instead: lanes 2c and 2c + 1
 * both hold column c (QS, P and D alike) and QS holds the activations as
 * they are (no + 128); gq_kernel reads it with the offset applied on load
 * (each column then computed in two lanes), gq_kernel_pairs as it is.
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
 * Measured choices (docs/PERF.md): the embedded broadcast of the weights
 * (signed operand, hence the +128 offset on the activations) beat
 * broadcasting unsigned weights into a register (one fused uop per vpdpbusd
 * instead of two); the sub-block scale cannot go through vpdpwssd because a sub-block
 * sum does not fit int16, so it costs one vpmulld per row and sub-block.
 * Up to 16 columns (one group: batched decode) run fuses the decode with
 * the compute (gq_run_fused): a panel of GQ_R far-apart rows is decoded
 * GQ_KC super-blocks at a time into L1 and the micro-kernel runs on it at
 * once, no row block through L2 (it replaced the matvec tiles for 5-6
 * (Q6_K 5-8) columns and the row-block path for 7-16, measured:
 * docs/PERF.md). 9-16 columns run gq_kernel there, the panel's offset
 * corrections (negc) from one transposing reduction of its 8 rows. Up to
 * 8 columns the panel is decoded as row pairs and gq_kernel_pairs puts two
 * rows in one 512-bit vector (lane 2c + e: row 2p + e, column c), since a
 * 256-bit vpdpbusd issues no faster than a 512-bit one here (the former
 * 8-lane kernel took as long at 8 columns as gq_kernel at 16); the weight
 * operand is the pair's qword broadcast into a register, so Q4_K / Q5_K
 * take the weights as the unsigned operand against the raw activations and
 * need no offset correction (Q6_K keeps the +128 form and negc).
 * Bounds of the offset form: per sub-block |sum q_i (a_i + 128)| <= 32 * 31 *
 * 255 (Q6_K: 16 * 32 * 255), scaled and summed over the super-block below
 * 2^29, the correction likewise.
 */
#include "kernels/x86/kquant_avx512.h"

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
    const bool dup = ncols <= GQ_LANES / 2; /* the layout for at most 8 columns (see the header) */
    for (int64_t b = 0; b < k / QK_K; b++) {
        uint8_t *o = xg + (size_t)b * GQ_ACT_SB;
        for (int q = 0; q < 4; q++) {
            __m512i r[16];
            for (int l = 0; l < GQ_LANES; l++) {
                const int c = dup ? l >> 1 : l;
                r[l] = c >= ncols ? _mm512_setzero_si512()
                       : dup      ? loadu512(act_at(xa, st, c, b)->qs + 64 * q)
                                  : _mm512_xor_si512(loadu512(act_at(xa, st, c, b)->qs + 64 * q), bias);
            }
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(o + GQ_ACT_QS + 64 * (16 * q + i), r[i]);
        }
        uint32_t P[4][GQ_LANES];
        float D[GQ_LANES];
        for (int l = 0; l < GQ_LANES; l++) {
            const int c = dup ? l >> 1 : l;
            if (c >= ncols) {
                for (int i = 0; i < 4; i++) P[i][l] = 0;
                D[l] = 0.0f;
                continue;
            }
            const block_q8_K *a = act_at(xa, st, c, b);
            for (int i = 0; i < 4; i++) {
                const int s0 = a->bsums[4 * i] + a->bsums[4 * i + 1], s1 = a->bsums[4 * i + 2] + a->bsums[4 * i + 3];
                P[i][l] = (uint32_t)(uint16_t)s0 | (uint32_t)(uint16_t)s1 << 16;
            }
            D[l] = a->d;
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

/* One Q4_K (q5 = 0) / Q5_K block of one row into o, all but negc; returns
 * the vector whose lane total is sum_j sc_j * (sum of sub-block j's weights). */
TERN_INLINE __m512i gq_decode_affine_cs(const uint8_t *blk, gq_row_t *o, const int q5) {
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
    _mm256_storeu_si256((__m256i *)o->sc, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8)));
    _mm_storeu_si128((__m128i *)o->mn, _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m8)));
    fp16_t hd, hm;
    memcpy(&hd, blk, sizeof hd);
    memcpy(&hm, blk + sizeof hd, sizeof hm);
    o->d = _cvtsh_ss(hd);
    o->dmin = _cvtsh_ss(hm);
    return cs;
}

/* One Q4_K (q5 = 0) / Q5_K block of one row into o. */
static void gq_decode_affine(const uint8_t *blk, gq_row_t *o, const int q5) {
    o->negc = -128 * hsum_epi32(gq_decode_affine_cs(blk, o, q5));
}

/* One Q6_K block of one row into o, all but negc; returns the vector whose
 * lane total is sum_j sc_j * sum_{i in j} (q_i - 32). */
TERN_INLINE __m512i gq_decode_q6_cs(const block_q6_K *w, gq_row_t *o) {
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
    /* sum_j sc_j * sum_{i in j} (q_i - 32) = sum_j sc_j * sum q_i - 512 * sum_j sc_j: one reduction of
     * cs - 512 * sc (exact: every lane and partial sum stays far below 2^31) */
    const __m512i sc32 = _mm512_cvtepi8_epi32(sc);
    _mm512_storeu_si512(o->sc, sc32);
    memset(o->mn, 0, sizeof o->mn);
    o->d = _cvtsh_ss(w->d);
    o->dmin = 0.0f;
    return _mm512_sub_epi32(cs, _mm512_slli_epi32(sc32, 9));
}

/* One Q6_K block of one row into o. */
static void gq_decode_q6(const block_q6_K *w, gq_row_t *o) {
    o->negc = -128 * hsum_epi32(gq_decode_q6_cs(w, o));
}

/* Lane r (0..7) of the result = the total of the 16 int32 lanes of c[r]
 * (exact: integer adds in another order), one transposing reduction for 8
 * vectors instead of 8 horizontal sums. */
TERN_INLINE __m256i reduce8_epi32(const __m512i c[8]) {
    __m512i p[4], q[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* per 128-bit lane: [c2i, c2i+1, c2i, c2i+1] partials */
        p[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(c[2 * i], c[2 * i + 1]),
                                _mm512_unpackhi_epi32(c[2 * i], c[2 * i + 1]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* per 128-bit lane: [c4i .. c4i+3] partials */
        q[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(p[2 * i], p[2 * i + 1]),
                                _mm512_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
    /* lanes: [c0..3, c0..3, c4..7, c4..7] partials, then totals */
    const __m512i x = _mm512_add_epi32(_mm512_shuffle_i32x4(q[0], q[1], 0x44), _mm512_shuffle_i32x4(q[0], q[1], 0xEE));
    const __m512i y = _mm512_add_epi32(x, _mm512_shuffle_i32x4(x, x, 0xB1));
    return _mm512_castsi512_si256(_mm512_shuffle_i32x4(y, y, 0x08));
}

/* Super-block b of GQ_R rows (blk[r]) into o[0..GQ_R-1]: the decodes above,
 * with the rows' negc from one reduction. */
TERN_INLINE void gq_decode_panel(const char *const blk[GQ_R], gq_row_t *o, const int fmt);

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
                         const bool q6, const bool raw) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
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
                __m512i a0 = _mm512_loadu_si512(x0), a1 = _mm512_loadu_si512(x1);
                if (raw) a0 = _mm512_xor_si512(a0, bias), a1 = _mm512_xor_si512(a1, bias);
#pragma GCC unroll 8
                for (int r = 0; r < GQ_R; r++) {
                    d0[r] = dp0_bcast(a0, w[r].w + o0);
                    d1[r] = dp0_bcast(a1, w[r].w + o1);
                }
            }
#pragma GCC unroll 7
            for (int i = 1; i < slices; i++) {
                __m512i a0 = _mm512_loadu_si512(x0 + 64 * i), a1 = _mm512_loadu_si512(x1 + 64 * i);
                if (raw) a0 = _mm512_xor_si512(a0, bias), a1 = _mm512_xor_si512(a1, bias);
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
    gq_kernel(pw, xg, nb, st, first, false, false);
}
static void gq_kernel_q6(const gq_row_t *pw, const uint8_t *xg, int64_t nb, float st[GQ_R][GQ_LANES], int first) {
    gq_kernel(pw, xg, nb, st, first, true, false);
}
/* On the layout of at most 8 columns (a last group of gq_run): every
 * column in two lanes, computed twice. */
static void gq_kernel_affine_dup(const gq_row_t *pw, const uint8_t *xg, int64_t nb, float st[GQ_R][GQ_LANES],
                                 int first) {
    gq_kernel(pw, xg, nb, st, first, false, true);
}
static void gq_kernel_q6_dup(const gq_row_t *pw, const uint8_t *xg, int64_t nb, float st[GQ_R][GQ_LANES], int first) {
    gq_kernel(pw, xg, nb, st, first, true, true);
}

enum { GQ_Q4K, GQ_Q5K, GQ_Q6K };

TERN_INLINE void gq_decode_panel(const char *const blk[GQ_R], gq_row_t *o, const int fmt) {
    _Static_assert(GQ_R == 8, "reduce8_epi32 serves 8 rows");
    __m512i cs[GQ_R];
#pragma GCC unroll 8
    for (int r = 0; r < GQ_R; r++)
        cs[r] = fmt == GQ_Q6K ? gq_decode_q6_cs((const block_q6_K *)blk[r], o + r)
                              : gq_decode_affine_cs((const uint8_t *)blk[r], o + r, fmt == GQ_Q5K);
    int32_t negc[GQ_R];
    _mm256_storeu_si256((__m256i *)negc, _mm256_mullo_epi32(reduce8_epi32(cs), _mm256_set1_epi32(-128)));
#pragma GCC unroll 8
    for (int r = 0; r < GQ_R; r++) o[r].negc = negc[r];
}

/* ---- Row pairs: up to 8 columns on 16 lanes -------------------------------
 *
 * With at most 8 columns the 8-lane micro-kernel above issues one 256-bit
 * vpdpbusd per 32 MACs, and a 256-bit vpdpbusd issues no faster than a
 * 512-bit one here (measured: the 8-lane kernel took as long as the
 * 16-lane one at 16 columns). So two rows share one 512-bit vector: lane
 * 2c + e = (row 2p + e of the panel, column c), e = 0, 1. The activation
 * vector of a k-slice is prep's (lane c = column c) with each dword doubled
 * (one vpermd, shared by the 4 pairs), the weight operand is the pair's two
 * dwords broadcast as a qword, stored interleaved at decode. Per lane the
 * steps are those of gq_kernel (same integers; the float chain per lane
 * takes the same operations in the same order), so the same bits. */
typedef struct {
    int8_t w[2 * QK_K]; /* see gq_pw_off */
    int32_t sc[16][2];  /* [sub-block][row e] */
    uint32_t mn[4][2];  /* [mins pair][row e] */
    float d[2], dmin[2];
    int32_t negc[2], pad[2];
} gq_pair_t;
_Static_assert(sizeof(gq_pair_t) <= 2 * sizeof(gq_row_t), "a pair fits the scratch of two decoded rows");

/* Byte offset in gq_pair_t.w of the qword [row 0 dword s, row 1 dword s],
 * s = storage slice (dword) 0..63 of gq_row_t.w: chunk v = s / 16 of 64
 * bytes is stored as unpacklo_epi32(row 0, row 1), unpackhi_epi32(...). */
#define GQ_PW_OFF(s) (128 * ((s) / 16) + 64 * (((s) % 4) >= 2) + 16 * (((s) % 16) / 4) + 8 * ((s) % 2))

/* Q4_K / Q5_K block headers of 8 rows (blk[r]: d, dmin, scales[12]) into
 * the sc, mn, d, dmin of 4 pairs, the 8 rows at once: lane r & 3 of X[r >> 2]
 * holds row r's 16 header bytes, decoded by kquant_scales_k4's steps on
 * dword vectors: Y = [u0, u2, u1, u2], Z = [-, u0, -, u1] per lane, then
 * [sc0..3, sc4..7, m0..3, m4..7] = (Y & [3f, 0f, 3f, 0]) | ((Y >> 4) & [0, 0,
 * 0, 0f]) | ((Z >> 2) & [0, 30, 0, 30]) (the same bytes). */
#define GQH_Y 4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15
#define GQH_Z 0, 0, 0, 0, 4, 5, 6, 7, 0, 0, 0, 0, 8, 9, 10, 11
#define GQH_M1 0x3f3f3f3fu, 0x0f0f0f0fu, 0x3f3f3f3fu, 0
#define GQH_M2 0, 0, 0, 0x0f0f0f0fu
#define GQH_M3 0, 0x30303030u, 0, 0x30303030u
static const v512_t g_gqh_y = {.b = {GQH_Y, GQH_Y, GQH_Y, GQH_Y}};
static const v512_t g_gqh_z = {.b = {GQH_Z, GQH_Z, GQH_Z, GQH_Z}};
static const v512_t g_gqh_m1 = {.d = {GQH_M1, GQH_M1, GQH_M1, GQH_M1}};
static const v512_t g_gqh_m2 = {.d = {GQH_M2, GQH_M2, GQH_M2, GQH_M2}};
static const v512_t g_gqh_m3 = {.d = {GQH_M3, GQH_M3, GQH_M3, GQH_M3}};
/* Word selectors for the pair in lanes 2q, 2q + 1 of SC16 / MN16 (q = 0, 1;
 * lane L = words 8L..8L+7): sc (permutex2var_epi16 on [SC16 | zero]): dword
 * 2j + e = sc_j of row e as int32; mn (permutexvar_epi16 on MN16, lower 256
 * bits): dword 2i + e = the int16 pair (m_2i, m_2i+1) of row e. */
#define GQS_W(q, j, e) (8 * (2 * (q) + (e)) + (j)), 32
#define GQS_J(q, j) GQS_W(q, j, 0), GQS_W(q, j, 1)
#define GQS_IDX(q) {.h = {GQS_J(q, 0), GQS_J(q, 1), GQS_J(q, 2), GQS_J(q, 3), GQS_J(q, 4), GQS_J(q, 5), GQS_J(q, 6), GQS_J(q, 7)}}
static const v512_t g_gqs_idx[2] = {GQS_IDX(0), GQS_IDX(1)};
#define GQM_W(q, i, e) (8 * (2 * (q) + (e)) + 2 * (i)), (8 * (2 * (q) + (e)) + 2 * (i) + 1)
#define GQM_I(q, i) GQM_W(q, i, 0), GQM_W(q, i, 1)
#define GQM_IDX(q) {.h = {GQM_I(q, 0), GQM_I(q, 1), GQM_I(q, 2), GQM_I(q, 3), GQM_I(q, 0), GQM_I(q, 1), GQM_I(q, 2), GQM_I(q, 3)}}
static const v512_t g_gqm_idx[2] = {GQM_IDX(0), GQM_IDX(1)};
/* [d(2p), d(2p + 1), dmin(2p), dmin(2p + 1)] in words 4p..4p+3 from X[0]
 * (words 0..31) and X[1] (32..63): row r's d is word 8 (r & 3) + 32 (r >> 2),
 * dmin the next. */
#define GQD_R(r) (8 * ((r) & 3) + 32 * ((r) >> 2))
#define GQD_P(p) GQD_R(2 * (p)), GQD_R(2 * (p) + 1), GQD_R(2 * (p)) + 1, GQD_R(2 * (p) + 1) + 1
static const v512_t g_gqd_idx = {.h = {GQD_P(0), GQD_P(1), GQD_P(2), GQD_P(3), GQD_P(0), GQD_P(1), GQD_P(2), GQD_P(3)}};

TERN_INLINE void gq_pair_hdr_affine(const char *const blk[GQ_R], gq_pair_t *o) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i X[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i x = _mm512_castsi128_si512(loadu128(blk[4 * h]));
        x = _mm512_inserti32x4(x, loadu128(blk[4 * h + 1]), 1);
        x = _mm512_inserti32x4(x, loadu128(blk[4 * h + 2]), 2);
        X[h] = _mm512_inserti32x4(x, loadu128(blk[4 * h + 3]), 3);
        const __m512i Y = _mm512_shuffle_epi8(X[h], g_gqh_y.v), Z = _mm512_shuffle_epi8(X[h], g_gqh_z.v);
        __m512i scm = _mm512_and_si512(Y, g_gqh_m1.v);
        scm = or_and(scm, _mm512_srli_epi32(Y, 4), g_gqh_m2.v);
        scm = or_and(scm, _mm512_srli_epi32(Z, 2), g_gqh_m3.v);
        const __m512i SC16 = _mm512_unpacklo_epi8(scm, zero), MN16 = _mm512_unpackhi_epi8(scm, zero);
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++) {
            gq_pair_t *op = o + 2 * h + q;
            _mm512_storeu_si512(op->sc, _mm512_permutex2var_epi16(SC16, g_gqs_idx[q].v, zero));
            _mm256_storeu_si256((__m256i *)op->mn, _mm512_castsi512_si256(_mm512_permutexvar_epi16(g_gqm_idx[q].v, MN16)));
        }
    }
    const __m512 DD = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(X[0], g_gqd_idx.v, X[1])));
    _mm_storeu_ps(o[0].d, _mm512_castps512_ps128(DD));
    _mm_storeu_ps(o[1].d, _mm512_extractf32x4_ps(DD, 1));
    _mm_storeu_ps(o[2].d, _mm512_extractf32x4_ps(DD, 2));
    _mm_storeu_ps(o[3].d, _mm512_extractf32x4_ps(DD, 3));
}

/* gq_decode_panel for Q4_K / Q5_K with the 8 rows' headers decoded
 * together (as gq_pair_hdr_affine) instead of kquant_scales_k4 per row:
 * the same gq_row_t bytes. */
static const v512_t g_gqr_d_idx = {.h = {0, 1, 8, 9, 16, 17, 24, 25}};
TERN_INLINE void gq_decode_panel_affine(const char *const blk[GQ_R], gq_row_t *o, const int q5) {
    const __m512i zero = _mm512_setzero_si512();
    const size_t qs_off = q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    __m512i cs[GQ_R];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i X = _mm512_castsi128_si512(loadu128(blk[4 * h]));
        X = _mm512_inserti32x4(X, loadu128(blk[4 * h + 1]), 1);
        X = _mm512_inserti32x4(X, loadu128(blk[4 * h + 2]), 2);
        X = _mm512_inserti32x4(X, loadu128(blk[4 * h + 3]), 3);
        const __m512i Y = _mm512_shuffle_epi8(X, g_gqh_y.v), Z = _mm512_shuffle_epi8(X, g_gqh_z.v);
        __m512i scm = _mm512_and_si512(Y, g_gqh_m1.v);
        scm = or_and(scm, _mm512_srli_epi32(Y, 4), g_gqh_m2.v);
        scm = or_and(scm, _mm512_srli_epi32(Z, 2), g_gqh_m3.v); /* lane L: sc0..7, m0..7 of row 4h + L */
        /* through memory: the lane index L below is a loop variable, and
         * clang (the fuzz builds) wants vextracti32x4's immediate constant */
        _Alignas(64) uint8_t mn16[64];
        _mm512_store_si512(mn16, _mm512_unpackhi_epi8(scm, zero));
        const __m256 DD = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(g_gqr_d_idx.v, X)));
#pragma GCC unroll 4
        for (int L = 0; L < 4; L++) {
            const int r = 4 * h + L;
            const uint8_t *b = (const uint8_t *)blk[r];
            __m512i q[4];
            affine_unpack(b + qs_off, q5 ? b + offsetof(block_q5_K, qh) : NULL, q);
            const __m512i scb = _mm512_permutexvar_epi64(_mm512_set1_epi64(2 * L), scm); /* sc0..7 in every qword */
            __m512i c = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                _mm512_storeu_si512(o[r].w + 64 * v, q[v]);
                c = _mm512_dpbusd_epi32(c, q[v], _mm512_shuffle_epi8(scb, g_gq_scb[v >> 1][v & 1].v));
            }
            cs[r] = c;
            _mm256_storeu_si256((__m256i *)o[r].sc, _mm256_cvtepu8_epi32(_mm512_castsi512_si128(scb)));
            memcpy(o[r].mn, mn16 + 16 * L, 16);
            _mm_storel_pi((__m64 *)&o[r].d, L & 1 ? _mm_movehl_ps(_mm_setzero_ps(), L < 2 ? _mm256_castps256_ps128(DD) : _mm256_extractf128_ps(DD, 1))
                                                  : (L < 2 ? _mm256_castps256_ps128(DD) : _mm256_extractf128_ps(DD, 1)));
        }
    }
    int32_t negc[GQ_R];
    _mm256_storeu_si256((__m256i *)negc, _mm256_mullo_epi32(reduce8_epi32(cs), _mm256_set1_epi32(-128)));
#pragma GCC unroll 8
    for (int r = 0; r < GQ_R; r++) o[r].negc = negc[r];
}

/* Super-block b of GQ_R rows (blk[r]) into GQ_R / 2 pairs. */
TERN_INLINE void gq_decode_panel_pairs(const char *const blk[GQ_R], gq_pair_t *o, const int fmt) {
    if (fmt != GQ_Q6K) { /* Q4_K / Q5_K: the weights, the headers at once (no negc: see dp_pair) */
        const size_t qs_off = fmt == GQ_Q5K ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
#pragma GCC unroll 4
        for (int p = 0; p < GQ_R / 2; p++) {
            __m512i q[2][4];
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const uint8_t *b = (const uint8_t *)blk[2 * p + e];
                affine_unpack(b + qs_off, fmt == GQ_Q5K ? b + offsetof(block_q5_K, qh) : NULL, q[e]);
            }
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                _mm512_storeu_si512(o[p].w + 128 * v, _mm512_unpacklo_epi32(q[0][v], q[1][v]));
                _mm512_storeu_si512(o[p].w + 128 * v + 64, _mm512_unpackhi_epi32(q[0][v], q[1][v]));
            }
        }
        gq_pair_hdr_affine(blk, o);
        return;
    }
    /* Q6_K: as gq_decode_q6, two rows at a time, straight into the pair */
    const __m512i m32 = _mm512_set1_epi8(32);
    __m512i cs[GQ_R];
#pragma GCC unroll 4
    for (int p = 0; p < GQ_R / 2; p++) {
        __m512i q[2][4], sc32[2];
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            const block_q6_K *w = (const block_q6_K *)blk[2 * p + e];
            q6k_unpack(w, q[e]);
            const __m128i sc = loadu128(w->scales);
            const __m512i scx = _mm512_broadcast_i32x4(sc);
            __m512i c = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                c = _mm512_dpbusd_epi32(c, q[e][v], _mm512_shuffle_epi8(scx, g_gq_scb6[v >> 1][v & 1].v));
                q[e][v] = _mm512_sub_epi8(q[e][v], m32);
            }
            sc32[e] = _mm512_cvtepi8_epi32(sc);
            cs[2 * p + e] = _mm512_sub_epi32(c, _mm512_slli_epi32(sc32[e], 9));
            o[p].d[e] = _cvtsh_ss(w->d);
        }
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            _mm512_storeu_si512(o[p].w + 128 * v, _mm512_unpacklo_epi32(q[0][v], q[1][v]));
            _mm512_storeu_si512(o[p].w + 128 * v + 64, _mm512_unpackhi_epi32(q[0][v], q[1][v]));
        }
        const __m512i lo = _mm512_unpacklo_epi32(sc32[0], sc32[1]), hi = _mm512_unpackhi_epi32(sc32[0], sc32[1]);
        /* lane L: lo = sc[4L], sc[4L + 1] pairs; hi = sc[4L + 2], sc[4L + 3] */
        _mm512_storeu_si512(o[p].sc, _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi));
        _mm512_storeu_si512(o[p].sc[8], _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi));
    }
    int32_t negc[GQ_R];
    _mm256_storeu_si256((__m256i *)negc, _mm256_mullo_epi32(reduce8_epi32(cs), _mm256_set1_epi32(-128)));
#pragma GCC unroll 4
    for (int p = 0; p < GQ_R / 2; p++) o[p].negc[0] = negc[2 * p], o[p].negc[1] = negc[2 * p + 1];
}

TERN_INLINE __m512i bq(const void *p) { return _mm512_set1_epi64(*(const long long *)p); }
/* One k-slice of activations (prep's layout for at most 8 columns: raw
 * int8, lane 2c + e = column c); + 128 for Q6_K (see dp_pair). */
TERN_INLINE __m512i gq_act(const uint8_t *x, const bool q6) {
    const __m512i a = _mm512_loadu_si512(x);
    return q6 ? _mm512_xor_si512(a, _mm512_set1_epi8((char)0x80)) : a;
}
/* acc + the pair's weight qword at p against a. Q4_K / Q5_K: weights
 * (0..31) as the unsigned operand, raw activations as the signed one, so
 * no offset correction (T starts at 0); Q6_K: activations + 128 unsigned,
 * weights q - 32 signed, T starts at negc (as in gq_kernel). */
TERN_INLINE __m512i dp_pair(__m512i acc, __m512i a, const void *p, const bool q6) {
    return q6 ? _mm512_dpbusd_epi32(acc, a, bq(p)) : _mm512_dpbusd_epi32(acc, bq(p), a);
}

/* 4 pairs (pp: [b][4]) x up to 8 columns (xg: one group, lanes 0..7) over
 * nb super-blocks, continuing st[p] (lane 2c + e) like gq_kernel. */
TERN_INLINE void gq_kernel_pairs(const gq_pair_t *pp, const uint8_t *xg, int64_t nb, float st[GQ_R / 2][GQ_LANES],
                                 int first, const bool q6) {
    enum { NP = GQ_R / 2 };
    const int units = q6 ? 16 : 8, slices = q6 ? 4 : 8;
    __m512 acc[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) acc[p] = first ? _mm512_setzero_ps() : _mm512_load_ps(st[p]);
    for (int64_t b = 0; b < nb; b++) {
        const gq_pair_t *w = pp + b * NP;
        const uint8_t *x = xg + (size_t)b * GQ_ACT_SB;
        __m512i T[NP];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) T[p] = q6 ? bq(w[p].negc) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int u = 0; u < units; u += 2) {
            const int j0 = q6 ? u : gq_sub[u], j1 = q6 ? u + 1 : gq_sub[u + 1];
            const uint8_t *x0 = x + GQ_ACT_QS + 64 * slices * j0, *x1 = x + GQ_ACT_QS + 64 * slices * j1;
            const int s0 = slices * u, s1 = s0 + slices; /* storage slices */
            __m512i d0[NP], d1[NP];
            {
                const __m512i a0 = gq_act(x0, q6), a1 = gq_act(x1, q6);
#pragma GCC unroll 4
                for (int p = 0; p < NP; p++) {
                    d0[p] = dp_pair(_mm512_setzero_si512(), a0, w[p].w + GQ_PW_OFF(s0), q6);
                    d1[p] = dp_pair(_mm512_setzero_si512(), a1, w[p].w + GQ_PW_OFF(s1), q6);
                }
            }
#pragma GCC unroll 7
            for (int i = 1; i < slices; i++) {
                const __m512i a0 = gq_act(x0 + 64 * i, q6), a1 = gq_act(x1 + 64 * i, q6);
#pragma GCC unroll 4
                for (int p = 0; p < NP; p++) {
                    d0[p] = dp_pair(d0[p], a0, w[p].w + GQ_PW_OFF(s0 + i), q6);
                    d1[p] = dp_pair(d1[p], a1, w[p].w + GQ_PW_OFF(s1 + i), q6);
                }
            }
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                T[p] = _mm512_add_epi32(T[p], _mm512_mullo_epi32(d0[p], bq(w[p].sc[j0])));
                T[p] = _mm512_add_epi32(T[p], _mm512_mullo_epi32(d1[p], bq(w[p].sc[j1])));
            }
        }
        const __m512 DA = _mm512_loadu_ps(x + GQ_ACT_D);
        if (q6) {
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++)
                acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[p]), _mm512_mul_ps(DA, _mm512_castsi512_ps(bq(w[p].d))),
                                         acc[p]);
            continue;
        }
        __m512i P[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) P[i] = _mm512_loadu_si512(x + GQ_ACT_P + 64 * i);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), P[0], bq(w[p].mn[0]));
#pragma GCC unroll 3
            for (int i = 1; i < 4; i++) m = _mm512_dpwssd_epi32(m, P[i], bq(w[p].mn[i]));
            acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[p]), _mm512_mul_ps(DA, _mm512_castsi512_ps(bq(w[p].d))), acc[p]);
            acc[p] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(DA, _mm512_castsi512_ps(bq(w[p].dmin))),
                                      acc[p]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) _mm512_store_ps(st[p], acc[p]);
}
static void gq_kernel_pairs_affine(const gq_pair_t *pp, const uint8_t *xg, int64_t nb, float st[GQ_R / 2][GQ_LANES],
                                   int first) {
    gq_kernel_pairs(pp, xg, nb, st, first, false);
}
static void gq_kernel_pairs_q6(const gq_pair_t *pp, const uint8_t *xg, int64_t nb, float st[GQ_R / 2][GQ_LANES],
                               int first) {
    gq_kernel_pairs(pp, xg, nb, st, first, true);
}

/* One group of columns (up to 16; batched decode): the row blocks of
 * gq_run below decode gq_mc rows into L2-sized scratch and read them back
 * for at most 16 columns. Here a panel of GQ_R far-apart rows (rows i, q +
 * i, ..., 7q + i: eight prefetch streams) is decoded GQ_KC super-blocks at
 * a time into the start of the scratch (GQ_KC * GQ_R rows, 11 KB: L1) and
 * consumed at once by the same micro-kernel, so the same bits. */
TERN_INLINE void gq_run_fused(const kern_gemm_args_t *a, const char *w, size_t row_bytes, int64_t nrows, float *y,
                            int64_t ldy, void *scratch, const int fmt) {
    const int64_t nb = a->k / QK_K;
    const size_t bsz = fmt == GQ_Q6K ? sizeof(block_q6_K) : fmt == GQ_Q5K ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const bool half = a->n <= 8;
    const int nc = (int)a->n;
    gq_row_t *dec = scratch;
    gq_pair_t *pairs = scratch; /* up to 8 columns: row pairs in place of the rows */
    float(*st)[GQ_LANES] = (void *)((char *)scratch + gq_dec_bytes(nb));
    const int64_t q = nrows >= 2 * GQ_R ? nrows / GQ_R : 0; /* rows per stream */
    const int64_t npan = q + (nrows - GQ_R * q + GQ_R - 1) / GQ_R;
    for (int64_t p = 0; p < npan; p++) {
        int64_t ri[GQ_R];
        int nrv = GQ_R;
        if (p < q) {
            for (int r = 0; r < GQ_R; r++) ri[r] = r * q + p;
        } else {
            const int64_t r0 = GQ_R * q + (p - q) * GQ_R;
            nrv = nrows - r0 < GQ_R ? (int)(nrows - r0) : GQ_R;
            for (int r = 0; r < GQ_R; r++) ri[r] = r0 + (r < nrv ? r : 0);
        }
        for (int64_t k0 = 0; k0 < nb; k0 += GQ_KC) {
            const int64_t kc = nb - k0 < GQ_KC ? nb - k0 : GQ_KC;
            for (int64_t b = 0; b < kc; b++) {
                const char *blk[GQ_R];
                for (int r = 0; r < GQ_R; r++) {
                    blk[r] = w + (size_t)ri[r] * row_bytes + (size_t)(k0 + b) * bsz;
                    prefetch_ahead(blk[r], bsz);
                }
                if (half) {
                    gq_decode_panel_pairs(blk, pairs + b * (GQ_R / 2), fmt);
                } else {
                    if (fmt == GQ_Q6K) gq_decode_panel(blk, dec + b * GQ_R, fmt);
                    else gq_decode_panel_affine(blk, dec + b * GQ_R, fmt == GQ_Q5K);
                }
            }
            const uint8_t *xg = (const uint8_t *)a->xg + (size_t)k0 * GQ_ACT_SB;
            if (half) {
                if (fmt == GQ_Q6K) gq_kernel_pairs_q6(pairs, xg, kc, st, k0 == 0);
                else gq_kernel_pairs_affine(pairs, xg, kc, st, k0 == 0);
            } else {
                if (fmt == GQ_Q6K) gq_kernel_q6(dec, xg, kc, st, k0 == 0);
                else gq_kernel_affine(dec, xg, kc, st, k0 == 0);
            }
        }
        if (half) {
            for (int c = 0; c < nc; c++)
                for (int r = 0; r < nrv; r++) y[c * ldy + ri[r]] = st[r >> 1][2 * c + (r & 1)];
        } else {
            for (int c = 0; c < nc; c++)
                for (int r = 0; r < nrv; r++) y[c * ldy + ri[r]] = st[r][c];
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
    if (a->n <= GQ_LANES) {
        gq_run_fused(a, wv, row_bytes, nrows, y, ldy, scratch, fmt);
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
            /* The next row block's weights go to L2 while this one
             * computes (its decode would otherwise wait on memory): a share
             * of its lines before each panel call. */
            const int64_t mc2 = nrows - r0 - mc < mc_max ? nrows - r0 - mc : mc_max;
            uintptr_t pf = (uintptr_t)(w + (size_t)(r0 + mc) * row_bytes);
            const uintptr_t pf_end = mc2 > 0 ? pf + (size_t)mc2 * row_bytes : pf;
            const int64_t calls = (nb + GQ_KC - 1) / GQ_KC * gn * np;
            const size_t pf_step = ((pf_end - pf) / 64 / (size_t)calls + 1) * 64;
            for (int64_t k0 = 0; k0 < nb; k0 += GQ_KC) {
                const int64_t kc = nb - k0 < GQ_KC ? nb - k0 : GQ_KC;
                for (int64_t g = 0; g < gn; g++) {
                    const uint8_t *xg = (const uint8_t *)a->xg + (size_t)(g0 + g) * a->xg_group + (size_t)k0 * GQ_ACT_SB;
                    /* a group of at most 8 columns: prep's layout for them */
                    const bool half = a->n - (g0 + g) * GQ_LANES <= 8;
                    for (int64_t p = 0; p < np; p++) {
                        for (const uintptr_t e = pf + pf_step < pf_end ? pf + pf_step : pf_end; pf < e; pf += 64)
                            _mm_prefetch((const char *)pf, _MM_HINT_T1);
                        const gq_row_t *pw = dec + (p * nb + k0) * GQ_R;
                        if (half) {
                            if (fmt == GQ_Q6K) gq_kernel_q6_dup(pw, xg, kc, st[p * gmax + g], k0 == 0);
                            else gq_kernel_affine_dup(pw, xg, kc, st[p * gmax + g], k0 == 0);
                        } else {
                            if (fmt == GQ_Q6K) gq_kernel_q6(pw, xg, kc, st[p * gmax + g], k0 == 0);
                            else gq_kernel_affine(pw, xg, kc, st[p * gmax + g], k0 == 0);
                        }
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
                    const int lm = nc <= GQ_LANES / 2 ? 2 : 1; /* lane of column c: lm * c */
                    for (int c = 0; c < nc; c++) {
                        float *yc = y + (c0 + c) * ldy + rb;
                        for (int r = 0; r < nr; r++) yc[r] = out[r][lm * c];
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
static const kern_gemm_t g_gemm_q4k = {gq_group_size, gq_prep, gq_scratch_size, gq_run_q4k, 0, NULL};
static const kern_gemm_t g_gemm_q5k = {gq_group_size, gq_prep, gq_scratch_size, gq_run_q5k, 0, NULL};
static const kern_gemm_t g_gemm_q6k = {gq_group_size, gq_prep, gq_scratch_size, gq_run_q6k, 0, NULL};

const kern_gemm_t *const kquant_avx512_gemm[3] = {&g_gemm_q4k, &g_gemm_q5k, &g_gemm_q6k};
