/*
 * kquant_avx2.c - AVX2+FMA kernels of Q4_K, Q5_K, Q6_K weights against Q8_K
 * activations: the dot / multi-row ("rows") functions used by matvec, a
 * GEMM of their own (kern_gemm_t) used for 5 or more columns, and the AVX2
 * Q8_K activation quantizer (compiled with -mavx2 -mfma -mf16c; only AVX2,
 * FMA and F16C instructions, so it runs on Haswell / Zen 2; only reached
 * through the kernel table when the CPU has them).
 *
 * ---- The float order (shared by every function below, bit for bit) -------
 *
 * For one weight row and one activation column, super-block b contributes
 * two exact integers (int32, see the bounds below):
 *   T_b = sum_j sc_j * sum_{i in sub-block j} q_i * a_i
 *         (Q6_K: q_i - 32 in place of q_i, signed scales)
 *   M_b = sum_j m_j * (bsums[2j] + bsums[2j+1])          (Q4_K / Q5_K only)
 * and the result is one float chain per (row, column):
 *   acc = +0.0f
 *   for b = 0, 1, ..., nb-1 in order:
 *     acc = fma((float)T_b, da_b * d_b, acc)
 *     acc = fma(-(float)M_b, da_b * dmin_b, acc)   (Q4_K / Q5_K; fnmadd)
 *   result = acc
 * with da_b the activation block's scale, d_b / dmin_b the weight block's
 * fp16 scales converted exactly (F16C), each product da_b * d_b one float
 * multiply. (The same chain as kquant_avx512.c, though nothing requires the
 * two ISAs to agree.) This replaced an order with 8 float lanes per (row,
 * column) (lane l: T of the 4-element slices at offset 4l of every
 * sub-block) whose lane sums a GEMM can only form with one maddubs + one
 * madd per 32 products; with whole-block integers the GEMM sums several
 * k-slices in int16 before applying a sub-block scale (see below). The
 * scalar oracle (kquant_ref.c) sums in another order; the tests compare with
 * a tolerance, and demand bit equality between matvec, GEMM and every tile.
 *
 * Integer bounds: |q_i * a_i| <= 63 * 128; over a super-block the scaled
 * sums stay below 2^28, and the offset forms of the GEMM below 2^29.
 *
 * ---- Matvec tiles (dot and rows functions) --------------------------------
 *
 * A tile is nr rows x nc columns (1 x 1..4 for the dot, 2..4 x 1..2 for the
 * rows function, kquant_entry.h), weights read block by block in lockstep.
 * Per super-block and row the weights are unpacked to unsigned bytes (4, 5
 * or 6 bits) once for all columns and multiplied with the signed activation
 * bytes by maddubs (pairs to int16, no saturation: 2 * 63 * 128 < 2^15),
 * then madd with the sub-block scale gives 8 int32 lanes whose sum is T_b;
 * Q6_K's -32 offset is taken out as 32 * sum(sc * bsums).
 * Q4_K / Q5_K (affine_kernel): the (sc_j, sc_j) int16 pairs go through a
 * 32-byte stack buffer and are broadcast from it (loads, not shuffles: the
 * 2-column tile is port-bound). A row pair's 8-lane T vectors of one column
 * fold into a "pair vector" (4 lanes of row 2p | 4 of row 2p+1); M of a row
 * pair and column is one madd of the two rows' mins (int16, one per lane)
 * with the column's S_j = bsums[2j] + bsums[2j+1] (one phaddw per column
 * and block), a pair vector too; up to 4 pair vectors reduce by 3 hadds to
 * one vector of T_b (resp. M_b) whose lane (r & 1) * 4 + (r / 2) * nc + c is
 * slot (r, c), and the chain above runs on 8 float lanes (da of the slot's
 * column times d / dmin of its row, from one cvtph2ps of the rows' (d, dmin)
 * and a permute). Q6_K (q6k_kernel): each slot's T vector, in groups of 4
 * slots (slot order r * nc + c, missing slots zero), through a transposing
 * hadd reduction, the chain on 4 float lanes. Either way a slot's operations
 * do not depend on the tile it is in.
 *
 * ---- GEMM (kern_gemm_t) ---------------------------------------------------
 *
 * prep (ga_prep, shared by the three formats) lays out a group of 16
 * columns as two halves of 8 (one ymm of int32 = 8 columns), per half and
 * super-block (GA_ACT_SB bytes): 64 vectors, vector i = k-slice 4i..4i+3 of
 * the 8 columns (dword c = column c), signed bytes as quantized (Q4_K,
 * Q5_K); 4 vectors of (S_2i, S_2i+1) int16 pairs, S_j = bsums[2j] +
 * bsums[2j+1]; the 8 da; the 64 vectors again with each byte + 128
 * (unsigned: Q6_K). Lanes of missing columns are zero; halves without
 * columns are skipped. run decodes blocks of rows into per-thread scratch
 * (ga_row_t: 256 weight bytes in natural order, Q4_K 0..15, Q5_K 0..31
 * (unsigned), Q6_K q - 32 (signed); scales as int16 pairs; mins pairs; d,
 * dmin; Q6_K's negc = -128 * sum_j sc_j * sum_{i in j} w_i, the correction
 * of the +128 offset), then loops column blocks (L2), row blocks (L2),
 * k-chunks of GA_KC super-blocks (a half-group's chunk in L1), groups,
 * halves, panels of GA_R rows: the micro-kernel, GA_R rows x 8 columns.
 * Per super-block and row, T starts at 0 (Q6_K: negc); per run of KS
 * k-slices of one sub-block (Q4_K 8 = the whole sub-block, Q5_K 4, Q6_K 2:
 * the int16 bound, 8 * 2 * 15 * 128, 4 * 2 * 31 * 128 and 2 * 2 * 32 * 255
 * < 2^15), each activation vector is loaded once and serves every row:
 * maddubs of the row's weight dword broadcast (unsigned) with the
 * activations (signed) for Q4_K / Q5_K, of the activations + 128 with the
 * weights (signed) for Q6_K, summed in int16 along the run (kept a chain by
 * an empty asm: GCC would reassociate it into trees that spill), then T +=
 * madd(that, the broadcast scale pair). M_b is four madds of the row's mins
 * pairs against the S vectors; then the chain above with 8 lanes = 8
 * columns (DA * broadcast d: the same float products). The chains wait in
 * scratch between k-chunks (a stored float reloads exactly).
 * Measured (cache-resident 256 x 4096, one thread, n = 64; /tmp harness):
 * ~1.6x the GFLOP/s of the former dot-tiled GEMM; panel height 2..6 rows
 * made no clear difference. Signed activations for Q4_K / Q5_K (longer
 * runs, no negc) and the chain asm: ~+5% Q4_K, ~+15% Q5_K at n = 64, more
 * at n = 16 (cheaper decode).
 */
#include "common.h"
#include "kquant.h"

#include <immintrin.h>
#include <stddef.h>

#define KQ_INLINE static inline __attribute__((always_inline))
#define KQ_PRAGMA(x) _Pragma(#x)
/* An empty asm that the compiler must assume changes v: keeps an integer
 * accumulation a chain (GCC otherwise reassociates the unrolled sums into
 * trees whose partial results spill). */
#define KQ_OPAQUE(v) __asm__("" : "+x"(v))
#define KQ_UNROLL_(n) KQ_PRAGMA(GCC unroll n)
#define KQ_UNROLL(n) KQ_UNROLL_(n)

/* fp16 scales are converted with F16C (exact, like fp16_to_f32) so that the
 * hot loops make no calls. */

KQ_INLINE __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

#ifndef KQ_PF_DIST
#define KQ_PF_DIST 4096
#endif
#ifndef KQ_PF_HINT
#define KQ_PF_HINT _MM_HINT_T0
#endif
/* Weights stream from memory once per matvec: ask for them KQ_PF_DIST
 * bytes ahead, beyond what the hardware prefetcher keeps in flight. (Past
 * the end of the row this touches the next row, or nothing: a prefetch
 * never faults.) */
KQ_INLINE void prefetch_block(const void *blk, size_t size) {
    const char *p = (const char *)blk + KQ_PF_DIST;
    for (size_t o = 0; o < size; o += 64) _mm_prefetch(p + o, KQ_PF_HINT);
}

KQ_INLINE const block_q8_K *act_at(const char *xa, size_t st, int c, int64_t b) {
    return (const block_q8_K *)(xa + (size_t)c * st) + b;
}

/* Shuffle control selecting int16 element e of each 128-bit lane in the low
 * lane and element f in the high lane. */
KQ_INLINE __m256i pick16(int e, int f) {
    __m128i lo = _mm_set1_epi16((short)(((2 * e + 1) << 8) | (2 * e)));
    __m128i hi = _mm_set1_epi16((short)(((2 * f + 1) << 8) | (2 * f)));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------ */

/* Slot reduction. A "pair vector" holds 4 partial sums of two slots: rows
 * 2p (low 128-bit lane) and 2p+1 (high lane) of one column. */

/* [a.lo + a.hi | b.lo + b.hi]: two 8-lane vectors folded into a pair vector. */
KQ_INLINE __m256i fold2(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
/* [a.lo + a.hi | 0]: a row pair without its second row. */
KQ_INLINE __m256i fold1(__m256i a) {
    return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1)));
}
/* n (1..4) pair vectors -> lane q: the sum of p[q]'s low lane, lane 4 + q:
 * of its high lane (q >= n repeat smaller q). */
KQ_INLINE __m256i reduce_pairs(const __m256i *p, const int n) {
    const __m256i a = _mm256_hadd_epi32(p[0], n > 1 ? p[1] : p[0]);
    const __m256i b = n > 2 ? _mm256_hadd_epi32(p[2], n > 3 ? p[3] : p[2]) : a;
    return _mm256_hadd_epi32(a, b);
}

/* Float lanes of a tile of nr rows x nc columns (nr * nc <= 8, at most 4
 * pair vectors): lane (r & 1) * 4 + (r / 2) * nc + c is slot (r, c). */
KQ_INLINE int lane_of(int r, int c, int nc) { return (r & 1) * 4 + (r / 2) * nc + c; }
/* The row of lane l (0 for lanes without a slot). */
KQ_INLINE int row_of_lane(int l, int nr, int nc) {
    const int r = 2 * ((l & 3) / nc) + (l >> 2);
    return r < nr ? r : 0;
}
/* The activation scales of the tile's columns in their lanes. */
KQ_INLINE __m256 lanes_da(const char *xa, size_t st, int64_t b, const int nc) {
    if (nc == 1) return _mm256_set1_ps(act_at(xa, st, 0, b)->d);
    if (nc == 2) return _mm256_blend_ps(_mm256_set1_ps(act_at(xa, st, 0, b)->d), _mm256_set1_ps(act_at(xa, st, 1, b)->d), 0xAA);
    float v[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) v[c] = act_at(xa, st, c < nc ? c : 0, b)->d;
    return _mm256_setr_ps(v[0], v[1], v[2], v[3], v[0], v[1], v[2], v[3]);
}

/* Super-block b of one row (wv) for nc columns: t[c] = 8 int32 lanes whose
 * sum is T_b; the row's mins (byte j = m_j) to *m8, its fp16 (d, dmin) to
 * *dm. Every kernel below is this function in a loop, so a column's (and a
 * row's) integers never depend on how many share a call. */
KQ_INLINE void affine_row(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m256i *t,
                          uint64_t *m8, uint32_t *dm, const int is_q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const uint8_t *scales, *qs, *qhp = NULL;
    const void *blk;
    if (is_q5) {
        const block_q5_K *w = (const block_q5_K *)wv + b;
        scales = w->scales, qs = w->qs, qhp = w->qh, blk = w;
        prefetch_block(w, sizeof *w);
    } else {
        const block_q4_K *w = (const block_q4_K *)wv + b;
        scales = w->scales, qs = w->qs, blk = w;
        prefetch_block(w, sizeof *w);
    }
    memcpy(dm, blk, 4); /* d, dmin */
    uint64_t sc8;
    kquant_scales_k4(scales, &sc8, m8);
    /* (sc_j, sc_j) int16 pairs, broadcast from memory below (loads, not shuffles) */
    int32_t scp[8] __attribute__((aligned(32)));
    const __m128i sb = _mm_cvtsi64_si128((long long)sc8);
    _mm256_store_si256((__m256i *)scp, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sb, sb)));
    __asm__("" : "+m"(*(int32_t(*)[8])scp)); /* keep the compiler from turning the loads into shuffles */
    __m256i hb = is_q5 ? loadu256(qhp) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        /* 64 elements: low nibbles = sub-block 2j, high = 2j+1 */
        const __m256i q = loadu256(qs + 32 * j);
        __m256i ql = _mm256_and_si256(q, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (is_q5) { /* bit 2j / 2j+1 of qh[l], brought to bit 0 / 1 by the shifts so far */
            ql = _mm256_or_si256(ql, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
            qh = _mm256_or_si256(qh, _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
            hb = _mm256_srli_epi16(hb, 2);
        }
        const __m256i s_lo = _mm256_set1_epi32(scp[2 * j]), s_hi = _mm256_set1_epi32(scp[2 * j + 1]);
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qa = act_at(xa, st, c, b)->qs + 64 * j;
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(ql, loadu256(qa)), s_lo);
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(qh, loadu256(qa + 32)), s_hi);
            t[c] = j ? _mm256_add_epi32(t[c], _mm256_add_epi32(p0, p1)) : _mm256_add_epi32(p0, p1);
        }
    }
}

/* nr rows (at any addresses) x nc columns, read in lockstep: out[r*nc + c].
 * Per super-block: each row's T lanes, folded by row pairs into pair vectors
 * and reduced by reduce_pairs; M of a row pair and column is one madd of the
 * two rows' mins (int16, low / high lane) with the column's sub-block sums
 * S_j = bsums[2j] + bsums[2j+1] (int16, both lanes), reduced the same way;
 * then the chains of all slots in one vector of 8 float lanes (lane_of). */
KQ_INLINE void affine_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                             float *out, const int is_q5) {
    _Static_assert(KQUANT_MAX_ACC == 8, "one vector of 8 slots");
    const int np = (nr + 1) / 2, nq = np * nc; /* row pairs, pair vectors (<= 4) */
    int id[8], im[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++) id[l] = 2 * row_of_lane(l, nr, nc), im[l] = id[l] + 1;
    const __m256i idx_d = _mm256_setr_epi32(id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]);
    const __m256i idx_m = _mm256_setr_epi32(im[0], im[1], im[2], im[3], im[4], im[5], im[6], im[7]);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i tp[4], mp[4], tprev[KERN_MAX_COLS];
        uint64_t m8[4] = {0, 0, 0, 0};
        uint32_t dm[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m256i t[KERN_MAX_COLS];
            affine_row(wr[r], b, xa, st, nc, t, &m8[r], &dm[r], is_q5);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                if (r & 1) tp[(r / 2) * nc + c] = fold2(tprev[c], t[c]);
                else if (r == nr - 1) tp[(r / 2) * nc + c] = fold1(t[c]);
                else tprev[c] = t[c];
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int16_t *bs = act_at(xa, st, c, b)->bsums;
            const __m128i s = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs), _mm_loadu_si128((const __m128i *)(bs + 8)));
            const __m256i S = _mm256_broadcastsi128_si256(s);
#pragma GCC unroll 2
            for (int p = 0; p < np; p++)
                mp[p * nc + c] = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_set_epi64x((long long)m8[2 * p + 1], (long long)m8[2 * p])), S);
        }
        const __m256i T = reduce_pairs(tp, nq), M = reduce_pairs(mp, nq);
        const __m256 F = _mm256_cvtph_ps(_mm_setr_epi32((int)dm[0], (int)dm[1], (int)dm[2], (int)dm[3]));
        const __m256 A = lanes_da(xa, st, b, nc);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T), _mm256_mul_ps(A, _mm256_permutevar8x32_ps(F, idx_d)), acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(A, _mm256_permutevar8x32_ps(F, idx_m)), acc);
    }
    float o[8];
    _mm256_storeu_ps(o, acc);
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * nc + c] = o[lane_of(r, c, nc)];
}

/* Four slots' T vectors -> T_b (lane s). */
KQ_INLINE __m128i reduce_t(const __m256i v[4]) {
    const __m256i g = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
}

/* ---- Q6_K ------------------------------------------------------------------- */

/* Half h (elements 128h..128h+127) of a Q6_K block as unsigned 6-bit
 * quants (q + 32): q[i] = elements 128h + 32i .. 128h + 32i + 31. */
KQ_INLINE void q6k_unpack_half(const block_q6_K *w, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i l0 = loadu256(w->ql + 64 * h), l1 = loadu256(w->ql + 64 * h + 32);
    const __m256i hv = loadu256(w->qh + 32 * h);
    /* (qh >> 2i) & 3, moved to bits 4..5 of each byte */
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hv, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30));
}

KQ_INLINE void q6k_block(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m256i *tv, float *dd) {
    const block_q6_K *w = (const block_q6_K *)wv + b;
    prefetch_block(w, sizeof *w);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
    *dd = _cvtsh_ss(w->d);
    __m256i sumi[KERN_MAX_COLS];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) sumi[c] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        /* scales 8h..8h+7 in both lanes; quarter i of the half covers
         * sub-blocks 8h+2i (low lane) and 8h+2i+1 (high lane) */
        const __m256i B = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(sc16, 1)
                                                        : _mm256_castsi256_si128(sc16));
        const __m256i S0 = _mm256_shuffle_epi8(B, pick16(0, 1)), S1 = _mm256_shuffle_epi8(B, pick16(2, 3));
        const __m256i S2 = _mm256_shuffle_epi8(B, pick16(4, 5)), S3 = _mm256_shuffle_epi8(B, pick16(6, 7));
        __m256i q[4];
        q6k_unpack_half(w, h, q);
        const __m256i q1 = q[0], q2 = q[1], q3 = q[2], q4 = q[3];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qa = act_at(xa, st, c, b)->qs + 128 * h;
            __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1, loadu256(qa)), S0);
            __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q2, loadu256(qa + 32)), S1);
            __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(q3, loadu256(qa + 64)), S2);
            __m256i p3 = _mm256_madd_epi16(_mm256_maddubs_epi16(q4, loadu256(qa + 96)), S3);
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        const block_q8_K *a = act_at(xa, st, c, b);
        /* the quants above were q+32: subtract 32 * sum_k sc[k] * bsums[k] */
        const __m256i corr = _mm256_madd_epi16(loadu256(a->bsums), sc16);
        tv[c] = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(corr, 5));
    }
}

KQ_INLINE void q6k_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                          float *out, const int unused) {
    (void)unused;
    __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        __m256i h[4];
        float va[4], vd[4];
        int ns = 0, g = 0;
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m256i hr[KERN_MAX_COLS];
            float d;
            q6k_block(wr[r], b, xa, st, nc, hr, &d);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                h[ns] = hr[c], va[ns] = act_at(xa, st, c, b)->d, vd[ns] = d;
                if (++ns == 4 || (r == nr - 1 && c == nc - 1)) {
#pragma GCC unroll 4
                    for (int i = ns; i < 4; i++) h[i] = _mm256_setzero_si256(), va[i] = vd[i] = 0.0f;
                    const __m128 ad = _mm_mul_ps(_mm_setr_ps(va[0], va[1], va[2], va[3]),
                                                 _mm_setr_ps(vd[0], vd[1], vd[2], vd[3]));
                    acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(reduce_t(h)), ad, acc[g]);
                    g++, ns = 0;
                }
            }
        }
    }
    float o[8];
    _mm_storeu_ps(o, acc[0]);
    _mm_storeu_ps(o + 4, acc[1]);
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) out[i] = o[i];
}

/* ---- entry points (tiles of rows x columns, dispatch) ------------------------- */

#define KQ_ISA avx2
#include "kquant_entry.h"

/* ---- GEMM (kern_gemm_t) ---------------------------------------------------------- */

#define GA_LANES 8  /* columns per vector */
#define GA_HALVES (KERN_GEMM_GROUP / GA_LANES)
#ifndef GA_R
#define GA_R 4 /* rows per micro-kernel panel */
#endif
#define GA_MC_MAX 64
#define GA_MC_BYTES (256 * 1024)
#define GA_KC 8     /* super-blocks per k-chunk: 8 x 2.2 KB of one layout of the activations (L1) */
#define GA_GMAX 32
#define GA_GMAX_BYTES (768 * 1024)
/* one half-group (8 columns) and super-block of prep's layout */
#define GA_ACT_QS 0                   /* signed (Q4_K, Q5_K) */
#define GA_ACT_P (GA_ACT_QS + 64 * 32)
#define GA_ACT_D (GA_ACT_P + 4 * 32)
#define GA_ACT_QU (GA_ACT_D + 32 + 32) /* + 128, unsigned (Q6_K); 64-aligned */
#define GA_ACT_SB (GA_ACT_QU + 64 * 32)
_Static_assert(GA_HALVES == 2, "two vectors of 8 columns per group");

/* One row's super-block, decoded: w: the 256 weights in natural order
 * (Q4_K 0..15, Q5_K 0..31, unsigned; Q6_K q - 32, signed); sc: sub-block
 * scale j as an int16 pair (sc_j, sc_j); mn: mins pairs (m_2i, m_2i+1);
 * negc: Q6_K -128 * sum_j sc_j * sum_{i in j} w_i (the +128 offset of its
 * activations), 0 for Q4_K / Q5_K. */
typedef struct {
    int8_t w[QK_K];
    uint32_t sc[16];
    uint32_t mn[4];
    float d, dmin;
    int32_t negc, pad;
} ga_row_t;
_Static_assert(sizeof(ga_row_t) % 32 == 0, "ga_row_t: whole 32-byte units");

static size_t ga_group_size(int64_t k) {
    if (k <= 0 || k % QK_K) return 0;
    const uint64_t nb = (uint64_t)(k / QK_K);
    if (nb > SIZE_MAX / (GA_HALVES * GA_ACT_SB)) return 0;
    return (size_t)nb * GA_HALVES * GA_ACT_SB;
}

static int64_t ga_mc(int64_t nb) {
    const int64_t per_row = nb * (int64_t)sizeof(ga_row_t);
    int64_t mc = (int64_t)GA_MC_BYTES / (per_row > 0 ? per_row : 1) / GA_R * GA_R;
    if (mc < GA_R) mc = GA_R;
    if (mc > GA_MC_MAX) mc = GA_MC_MAX;
    return mc;
}

static size_t ga_dec_bytes(int64_t nb) {
    return ((size_t)ga_mc(nb) * (size_t)nb * sizeof(ga_row_t) + 63) & ~(size_t)63;
}

static int64_t ga_gmax(int64_t nb) {
    const int64_t per_group = nb * (int64_t)(GA_HALVES * GA_ACT_SB);
    int64_t g = (int64_t)GA_GMAX_BYTES / (per_group > 0 ? per_group : 1);
    if (g < 1) g = 1;
    if (g > GA_GMAX) g = GA_GMAX;
    return g;
}

/* chains of one column block: [panel][group][half][GA_R][GA_LANES] floats */
static size_t ga_scratch_size(int64_t k) {
    if (k <= 0 || k % QK_K) return 0;
    const uint64_t nb = (uint64_t)(k / QK_K);
    if (nb > SIZE_MAX / 2 / sizeof(ga_row_t) / GA_MC_MAX) return SIZE_MAX;
    return ga_dec_bytes((int64_t)nb) +
           (size_t)(GA_MC_MAX / GA_R) * (size_t)ga_gmax((int64_t)nb) * GA_HALVES * GA_R * GA_LANES * sizeof(float);
}

/* One group of ncols (1..16) Q8_K columns: half h (columns 8h..8h+7) at
 * h * nb * GA_ACT_SB, super-block b of it at b * GA_ACT_SB:
 *   [GA_ACT_QS] 64 vectors: dword c of vector i = bytes 4i..4i+3 of column
 *               c (signed, as quantized; Q4_K / Q5_K);
 *   [GA_ACT_P]  4 vectors: dword c of vector i = (S_2i, S_2i+1) of column c
 *               as int16, S_j = bsums[2j] + bsums[2j+1];
 *   [GA_ACT_D]  the 8 columns' da (then 32 zero bytes);
 *   [GA_ACT_QU] the QS vectors with each byte XOR 0x80 (a + 128 as an
 *               unsigned byte; Q6_K).
 * Missing columns are zeros. */
static void ga_prep(int64_t k, const void *xav, size_t st, int ncols, void *xgv) {
    TERN_CHECK(k % QK_K == 0 && ncols >= 1 && ncols <= KERN_GEMM_GROUP);
    const char *xa = xav;
    const int64_t nb = k / QK_K;
    for (int hf = 0; hf < GA_HALVES; hf++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = (uint8_t *)xgv + ((size_t)hf * (size_t)nb + (size_t)b) * GA_ACT_SB;
            uint32_t Q[64][GA_LANES], U[64][GA_LANES], P[4][GA_LANES];
            float D[GA_LANES];
            for (int l = 0; l < GA_LANES; l++) {
                const int c = GA_LANES * hf + l;
                if (c >= ncols) {
                    for (int i = 0; i < 64; i++) Q[i][l] = U[i][l] = 0;
                    for (int i = 0; i < 4; i++) P[i][l] = 0;
                    D[l] = 0.0f;
                    continue;
                }
                const block_q8_K *a = act_at(xa, st, c, b);
                for (int i = 0; i < 64; i++) {
                    uint32_t v;
                    memcpy(&v, a->qs + 4 * i, 4);
                    Q[i][l] = v;
                    U[i][l] = v ^ 0x80808080u;
                }
                for (int i = 0; i < 4; i++) {
                    const int s0 = a->bsums[4 * i] + a->bsums[4 * i + 1], s1 = a->bsums[4 * i + 2] + a->bsums[4 * i + 3];
                    P[i][l] = (uint32_t)(uint16_t)s0 | (uint32_t)(uint16_t)s1 << 16;
                }
                D[l] = a->d;
            }
            memcpy(o + GA_ACT_QS, Q, sizeof Q);
            memcpy(o + GA_ACT_P, P, sizeof P);
            memcpy(o + GA_ACT_D, D, sizeof D);
            memset(o + GA_ACT_D + sizeof D, 0, GA_ACT_QU - GA_ACT_D - sizeof D);
            memcpy(o + GA_ACT_QU, U, sizeof U);
        }
    }
}

KQ_INLINE int32_t hsum_epi32_256(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* sum_j sc_j * sum_{i in j} w_i over a decoded row (sc as int16 pairs):
 * vector v of w (32 bytes) holds sub-block v (Q4_K/Q5_K) or sub-blocks 2v, 2v+1 (Q6_K) */
KQ_INLINE int32_t ga_scaled_sum(const ga_row_t *o, const int q6) {
    const __m256i ones = _mm256_set1_epi8(1);
    __m256i s = _mm256_setzero_si256();
    for (int v = 0; v < 8; v++) {
        const __m256i p = _mm256_maddubs_epi16(ones, loadu256(o->w + 32 * v)); /* pair sums (int16) */
        const __m256i scv = q6 ? _mm256_setr_m128i(_mm_set1_epi32((int)o->sc[2 * v]), _mm_set1_epi32((int)o->sc[2 * v + 1]))
                               : _mm256_set1_epi32((int)o->sc[v]);
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, scv));
    }
    return hsum_epi32_256(s);
}

/* One Q4_K (q5 = 0) / Q5_K block into o: the unpacking of affine_row,
 * stored in natural order. */
static void ga_decode_affine(const void *blk, ga_row_t *o, const int q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const uint8_t *scales, *qs, *qhp = NULL;
    fp16_t hd, hm;
    if (q5) {
        const block_q5_K *w = blk;
        scales = w->scales, qs = w->qs, qhp = w->qh, hd = w->d, hm = w->dmin;
    } else {
        const block_q4_K *w = blk;
        scales = w->scales, qs = w->qs, hd = w->d, hm = w->dmin;
    }
    uint64_t sc8, m8;
    kquant_scales_k4(scales, &sc8, &m8);
    __m256i hb = q5 ? loadu256(qhp) : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i q = loadu256(qs + 32 * j);
        __m256i ql = _mm256_and_si256(q, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (q5) {
            ql = _mm256_or_si256(ql, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
            qh = _mm256_or_si256(qh, _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
            hb = _mm256_srli_epi16(hb, 2);
        }
        _mm256_storeu_si256((__m256i *)(o->w + 64 * j), ql);
        _mm256_storeu_si256((__m256i *)(o->w + 64 * j + 32), qh);
    }
    const __m128i sb = _mm_cvtsi64_si128((long long)sc8);
    _mm256_storeu_si256((__m256i *)o->sc, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sb, sb))); /* (sc_j, sc_j) */
    _mm256_storeu_si256((__m256i *)(o->sc + 8), _mm256_setzero_si256());
    _mm_storeu_si128((__m128i *)o->mn, _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m8))); /* (m_2i, m_2i+1) */
    o->negc = 0; /* signed activations: no offset */
    o->d = _cvtsh_ss(hd);
    o->dmin = _cvtsh_ss(hm);
    o->pad = 0;
}

/* One Q6_K block into o: the unpacking of q6k_block, minus 32. */
static void ga_decode_q6(const block_q6_K *w, ga_row_t *o) {
    const __m256i m32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        q6k_unpack_half(w, h, q);
        for (int i = 0; i < 4; i++) _mm256_storeu_si256((__m256i *)(o->w + 128 * h + 32 * i), _mm256_sub_epi8(q[i], m32));
    }
    for (int j = 0; j < 16; j++) {
        const uint32_t s = (uint16_t)(int16_t)w->scales[j];
        o->sc[j] = s | s << 16;
    }
    memset(o->mn, 0, sizeof o->mn);
    o->negc = -128 * ga_scaled_sum(o, 1);
    o->d = _cvtsh_ss(w->d);
    o->dmin = 0.0f;
    o->pad = 0;
}

KQ_INLINE __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* maddubs of 4-byte slices: Q6_K activations + 128 (unsigned) x weights q - 32
 * (signed); Q4_K / Q5_K weights (unsigned) x activations (signed). */
KQ_INLINE __m256i ga_mul(__m256i a, __m256i w, const int q6) {
    return q6 ? _mm256_maddubs_epi16(a, w) : _mm256_maddubs_epi16(w, a);
}

/* GA_R rows (pw: [b][GA_R] decoded) x 8 columns (x: one half-group, at the
 * first super-block) over nb super-blocks, continuing the float chains st
 * (first: from +0.0f). Per sub-block, k-slices in runs of KS (Q4_K 8, Q5_K
 * 4, Q6_K 2: the int16 bound): ga_mul of the activations with the row's
 * weight dword broadcast, summed in int16 along the run, then madd with the
 * scale pair into T. */
KQ_INLINE void ga_kernel(const ga_row_t *pw, const uint8_t *x, int64_t nb, float st[GA_R][GA_LANES], int first,
                         const int fmt) {
    /* k-slices per run / per sub-block */
    const int q6 = fmt == 2, ks = fmt == 0 ? 8 : fmt == 1 ? 4 : 2, sub = q6 ? 4 : 8;
    const int qo = q6 ? GA_ACT_QU : GA_ACT_QS;
    __m256 acc[GA_R];
#pragma GCC unroll 8
    for (int r = 0; r < GA_R; r++) acc[r] = first ? _mm256_setzero_ps() : _mm256_load_ps(st[r]);
    for (int64_t b = 0; b < nb; b++, x += GA_ACT_SB) {
        const ga_row_t *w = pw + b * GA_R;
        __m256i T[GA_R];
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) T[r] = q6 ? _mm256_set1_epi32(w[r].negc) : _mm256_setzero_si256();
#ifndef GA_UNROLL
#define GA_UNROLL 16
#endif
        KQ_UNROLL(GA_UNROLL)
        for (int i0 = 0; i0 < 64; i0 += ks) {
            const int j = i0 / sub;
            __m256i s16[GA_R];
            {
                const __m256i a = loadu256(x + qo + 32 * i0);
#pragma GCC unroll 8
                for (int r = 0; r < GA_R; r++) s16[r] = ga_mul(a, bcast32(w[r].w + 4 * i0), q6);
            }
#pragma GCC unroll 8
            for (int i = i0 + 1; i < i0 + ks; i++) {
                const __m256i a = loadu256(x + qo + 32 * i);
#pragma GCC unroll 8
                for (int r = 0; r < GA_R; r++) {
                    s16[r] = _mm256_add_epi16(s16[r], ga_mul(a, bcast32(w[r].w + 4 * i), q6));
                    if (!q6) KQ_OPAQUE(s16[r]);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) T[r] = _mm256_add_epi32(T[r], _mm256_madd_epi16(s16[r], bcast32(&w[r].sc[j])));
        }
        const __m256 DA = _mm256_loadu_ps((const float *)(x + GA_ACT_D));
        if (q6) {
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T[r]), _mm256_mul_ps(DA, _mm256_set1_ps(w[r].d)), acc[r]);
        } else {
            __m256i P[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) P[i] = loadu256(x + GA_ACT_P + 32 * i);
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) {
                __m256i m = _mm256_madd_epi16(P[0], bcast32(&w[r].mn[0]));
#pragma GCC unroll 3
                for (int i = 1; i < 4; i++) m = _mm256_add_epi32(m, _mm256_madd_epi16(P[i], bcast32(&w[r].mn[i])));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T[r]), _mm256_mul_ps(DA, _mm256_set1_ps(w[r].d)), acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(DA, _mm256_set1_ps(w[r].dmin)), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < GA_R; r++) _mm256_store_ps(st[r], acc[r]);
}

static void ga_kernel_q4(const ga_row_t *pw, const uint8_t *x, int64_t nb, float st[GA_R][GA_LANES], int first) {
    ga_kernel(pw, x, nb, st, first, 0);
}
static void ga_kernel_q5(const ga_row_t *pw, const uint8_t *x, int64_t nb, float st[GA_R][GA_LANES], int first) {
    ga_kernel(pw, x, nb, st, first, 1);
}
static void ga_kernel_q6(const ga_row_t *pw, const uint8_t *x, int64_t nb, float st[GA_R][GA_LANES], int first) {
    ga_kernel(pw, x, nb, st, first, 2);
}

/* run: as kquant_avx512.c's: column blocks (activations in L2), row blocks
 * decoded into scratch (L2), k-chunks (a half-group's chunk in L1), then
 * groups, halves, panels; the float chains wait in scratch between chunks. */
KQ_INLINE void ga_run(const kern_gemm_args_t *a, const void *wv, size_t row_bytes, int64_t nrows, float *y,
                      int64_t ldy, void *scratch, const int fmt) {
    TERN_CHECK(a->k % QK_K == 0 && a->xg != NULL && scratch != NULL);
    const int64_t nb = a->k / QK_K, ngroups = (a->n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP;
    const int64_t mc_max = ga_mc(nb), gmax = ga_gmax(nb);
    const size_t bsz = fmt == 2 ? sizeof(block_q6_K) : fmt == 1 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const char *w = wv;
    ga_row_t *dec = scratch;
    float(*st)[GA_R][GA_LANES] = (void *)((char *)scratch + ga_dec_bytes(nb));
    for (int64_t g0 = 0; g0 < ngroups; g0 += gmax) {
        const int64_t gn = ngroups - g0 < gmax ? ngroups - g0 : gmax;
        for (int64_t r0 = 0; r0 < nrows; r0 += mc_max) {
            const int64_t mc = nrows - r0 < mc_max ? nrows - r0 : mc_max;
            const int64_t np = (mc + GA_R - 1) / GA_R;
            for (int64_t i = 0; i < np * GA_R; i++) {
                ga_row_t *o = dec + (i / GA_R) * nb * GA_R + i % GA_R;
                if (i >= mc) {
                    for (int64_t b = 0; b < nb; b++) memset(o + b * GA_R, 0, sizeof *o);
                    continue;
                }
                const char *row = w + (size_t)(r0 + i) * row_bytes;
                for (int64_t b = 0; b < nb; b++) {
                    const char *blk = row + (size_t)b * bsz;
                    if (fmt == 2) ga_decode_q6((const block_q6_K *)blk, o + b * GA_R);
                    else ga_decode_affine(blk, o + b * GA_R, fmt == 1);
                }
            }
            for (int64_t k0 = 0; k0 < nb; k0 += GA_KC) {
                const int64_t kc = nb - k0 < GA_KC ? nb - k0 : GA_KC;
                for (int64_t g = 0; g < gn; g++) {
                    for (int hf = 0; hf < GA_HALVES; hf++) {
                        if ((g0 + g) * KERN_GEMM_GROUP + hf * GA_LANES >= a->n) break;
                        const uint8_t *xg = (const uint8_t *)a->xg + (size_t)(g0 + g) * a->xg_group +
                                            ((size_t)hf * (size_t)nb + (size_t)k0) * GA_ACT_SB;
                        for (int64_t p = 0; p < np; p++) {
                            const ga_row_t *pw = dec + (p * nb + k0) * GA_R;
                            float(*s)[GA_LANES] = st[(p * gmax + g) * GA_HALVES + hf];
                            if (fmt == 2) ga_kernel_q6(pw, xg, kc, s, k0 == 0);
                            else if (fmt == 1) ga_kernel_q5(pw, xg, kc, s, k0 == 0);
                            else ga_kernel_q4(pw, xg, kc, s, k0 == 0);
                        }
                    }
                }
            }
            for (int64_t g = 0; g < gn; g++) {
                for (int hf = 0; hf < GA_HALVES; hf++) {
                    const int64_t c0 = (g0 + g) * KERN_GEMM_GROUP + hf * GA_LANES;
                    if (c0 >= a->n) break;
                    const int nc = a->n - c0 < GA_LANES ? (int)(a->n - c0) : GA_LANES;
                    for (int64_t p = 0; p < np; p++) {
                        const int64_t rb = r0 + p * GA_R;
                        const int nr = nrows - rb < GA_R ? (int)(nrows - rb) : GA_R;
                        const float(*out)[GA_LANES] = st[(p * gmax + g) * GA_HALVES + hf];
                        for (int c = 0; c < nc; c++) {
                            float *yc = y + (c0 + c) * ldy + rb;
                            for (int r = 0; r < nr; r++) yc[r] = out[r][c];
                        }
                    }
                }
            }
        }
    }
}

static void ga_run_q4k(const kern_gemm_args_t *a, const void *w, size_t rb, int64_t nr, float *y, int64_t ldy,
                       void *s) {
    ga_run(a, w, rb, nr, y, ldy, s, 0);
}
static void ga_run_q5k(const kern_gemm_args_t *a, const void *w, size_t rb, int64_t nr, float *y, int64_t ldy,
                       void *s) {
    ga_run(a, w, rb, nr, y, ldy, s, 1);
}
static void ga_run_q6k(const kern_gemm_args_t *a, const void *w, size_t rb, int64_t nr, float *y, int64_t ldy,
                       void *s) {
    ga_run(a, w, rb, nr, y, ldy, s, 2);
}

/* One prep for the three formats, so that matrices sharing an input share it. */
static const kern_gemm_t g_gemm_q4k = {ga_group_size, ga_prep, ga_scratch_size, ga_run_q4k};
static const kern_gemm_t g_gemm_q5k = {ga_group_size, ga_prep, ga_scratch_size, ga_run_q5k};
static const kern_gemm_t g_gemm_q6k = {ga_group_size, ga_prep, ga_scratch_size, ga_run_q6k};

/* ---- Q8_K activations ----------------------------------------------------------- */

/* The scalar quantizer's operations exactly (quant_k.c): amax, id = 127/amax,
 * d = amax/127, q = round-to-nearest-even(clamp(x * id, -127, 127)). The
 * clamp has max/min-instruction NaN semantics, like the scalar one. */
static void act_q8_K_avx2(const float *x, void *xav, int64_t k) {
    TERN_CHECK(k % QK_K == 0);
    block_q8_K *y = xav;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
        for (int i = 0; i < QK_K; i += 32) {
            m0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), absmask), m0);
            m1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 8), absmask), m1);
            m2 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 16), absmask), m2);
            m3 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 24), absmask), m3);
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const __m256 id = _mm256_set1_ps(127.0f / amax);
        y[b].d = amax / 127.0f;
        __m256i q[8];
        for (int i = 0; i < 8; i++) {
            __m256i v[4];
            for (int u = 0; u < 4; u++) {
                __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * i + 8 * u), id);
                f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
                v[u] = _mm256_cvtps_epi32(f); /* MXCSR default: nearest even */
            }
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            q[i] = _mm256_permutevar8x32_epi32(p, perm);
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * i), q[i]);
        }
        kquant_bsums_avx2(q, y[b].bsums);
    }
}

void kquant_register_avx2(kern_table_t t) {
    t[TYPE_Q4_K][ISA_AVX2] = (kern_ops_t){dot_q4_K_avx2, act_q8_K_avx2, &g_gemm_q4k};
    t[TYPE_Q5_K][ISA_AVX2] = (kern_ops_t){dot_q5_K_avx2, act_q8_K_avx2, &g_gemm_q5k};
    t[TYPE_Q6_K][ISA_AVX2] = (kern_ops_t){dot_q6_K_avx2, act_q8_K_avx2, &g_gemm_q6k};
}

kquant_dot_rows_fn kquant_rows_avx2(int type) {
    switch (type) {
    case TYPE_Q4_K: return dot_rows_q4_K_avx2;
    case TYPE_Q5_K: return dot_rows_q5_K_avx2;
    case TYPE_Q6_K: return dot_rows_q6_K_avx2;
    default: return NULL;
    }
}
