/*
 * kquant_avx2_matvec.c - AVX2+FMA matvec kernels of Q4_K, Q5_K, Q6_K
 * weights against Q8_K activations: the dot / multi-row ("rows") functions
 * used by matvec, the AVX2 Q8_K activation quantizer, and the registration
 * of the AVX2 entries (compiled with -mavx2 -mfma -mf16c; only AVX2, FMA
 * and F16C instructions, so it runs on Haswell / Zen 2; only reached
 * through the kernel table when the CPU has them). Their GEMMs for 5 or
 * more columns (kern_gemm_t, plain and AVX-VNNI) are in kquant_avx2_gemm.c
 * and follow the float order below; kquant_avx2.h holds what the two files
 * share.
 *
 * ---- The float order (every function here and in kquant_avx2_gemm.c, bit for bit) -------
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
 * multiply. (The same chain as kquant_avx512_matvec.c, though nothing requires the
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
 */
#include "kernels/x86/kquant_avx2.h"

/* ---- Q4_K / Q5_K ------------------------------------------------------------ */

/* Slot reduction. A "pair vector" holds 4 partial sums of two slots: rows
 * 2p (low 128-bit lane) and 2p+1 (high lane) of one column. */

/* [a.lo + a.hi | b.lo + b.hi]: two 8-lane vectors folded into a pair vector. */
TERN_INLINE __m256i fold2(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
/* [a.lo + a.hi | 0]: a row pair without its second row. */
TERN_INLINE __m256i fold1(__m256i a) {
    return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1)));
}
/* n (1..4) pair vectors -> lane q: the sum of p[q]'s low lane, lane 4 + q:
 * of its high lane (q >= n repeat smaller q). */
TERN_INLINE __m256i reduce_pairs(const __m256i *p, const int n) {
    const __m256i a = _mm256_hadd_epi32(p[0], n > 1 ? p[1] : p[0]);
    const __m256i b = n > 2 ? _mm256_hadd_epi32(p[2], n > 3 ? p[3] : p[2]) : a;
    return _mm256_hadd_epi32(a, b);
}

/* Float lanes of a tile of nr rows x nc columns (nr * nc <= 8, at most 4
 * pair vectors): lane (r & 1) * 4 + (r / 2) * nc + c is slot (r, c). */
TERN_INLINE int lane_of(int r, int c, int nc) { return (r & 1) * 4 + (r / 2) * nc + c; }
/* The row of lane l (0 for lanes without a slot). */
TERN_INLINE int row_of_lane(int l, int nr, int nc) {
    const int r = 2 * ((l & 3) / nc) + (l >> 2);
    return r < nr ? r : 0;
}
/* The activation scales of the tile's columns in their lanes. */
TERN_INLINE __m256 lanes_da(const char *xa, size_t st, int64_t b, const int nc) {
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
TERN_INLINE void affine_row(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m256i *t,
                          uint64_t *m8, uint32_t *dm, const int is_q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const uint8_t *scales, *qs, *qhp = NULL;
    const void *blk;
    if (is_q5) {
        const block_q5_K *w = (const block_q5_K *)wv + b;
        scales = w->scales, qs = w->qs, qhp = w->qh, blk = w;
        prefetch_ahead(w, sizeof *w);
    } else {
        const block_q4_K *w = (const block_q4_K *)wv + b;
        scales = w->scales, qs = w->qs, blk = w;
        prefetch_ahead(w, sizeof *w);
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
TERN_INLINE void affine_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
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
TERN_INLINE __m128i reduce_t(const __m256i v[4]) {
    const __m256i g = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
}

/* ---- Q6_K ------------------------------------------------------------------- */

TERN_INLINE void q6k_block(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m256i *tv, float *dd) {
    const block_q6_K *w = (const block_q6_K *)wv + b;
    prefetch_ahead(w, sizeof *w);
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

TERN_INLINE void q6k_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
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
#include "kernels/x86/kquant_entry.h"

/* ---- Q8_K activations ----------------------------------------------------------- */

/* One block's 256 quants, x * id rounded to nearest even, clamped to
 * [-127, 127] first when clamp; without: returns 0 if a byte is -128. */
TERN_INLINE int act_block(const float *xb, __m256 id, __m256i q[8], const int clamp) {
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i mn = _mm256_set1_epi8(127);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        __m256i v[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            __m256 f = _mm256_mul_ps(_mm256_loadu_ps(xb + 32 * i + 8 * u), id);
            if (clamp) f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
            v[u] = _mm256_cvtps_epi32(f); /* MXCSR default: nearest even */
        }
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        q[i] = _mm256_permutevar8x32_epi32(p, perm);
        if (!clamp) mn = _mm256_min_epi8(mn, q[i]);
    }
    return clamp || !_mm256_movemask_epi8(_mm256_cmpeq_epi8(mn, _mm256_set1_epi8(-128)));
}

/* The scalar quantizer's operations exactly (quant_k.c): amax, id = 127/amax,
 * d = amax/127, q = round-to-nearest-even(clamp(x * id, -127, 127)). The
 * clamp has max/min-instruction NaN semantics, like the scalar one (and is
 * skipped where it cannot change a result, see act_block). The amax of a
 * chunk of blocks first, then their quants: the amax -> divide -> quantize
 * latency of one block no longer serializes the loop (measured, with the
 * clamp skip: docs/PERF.md). */
#define ACT_CHUNK 16 /* blocks per pass pair: 16 KB of floats, in L1 for the second pass */
static void act_q8_K_avx2(const float *x, void *xav, int64_t k) {
    TERN_CHECK(k % QK_K == 0);
    block_q8_K *y = xav;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const int64_t nb = k / QK_K;
    for (int64_t b0 = 0; b0 < nb; b0 += ACT_CHUNK) {
        const int nc = nb - b0 < ACT_CHUNK ? (int)(nb - b0) : ACT_CHUNK;
        /* pass 1, every block of the chunk before any pass 2 (independent
         * chains; a max over a set does not depend on the order) */
        float amax[ACT_CHUNK];
        for (int c = 0; c < nc; c++) {
            const float *xb = x + (b0 + c) * QK_K;
            __m256 m[8];
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) /* max(|x|, m) keeps m where |x| is NaN: NaNs do not count */
                m[u] = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + 8 * u), absmask), _mm256_setzero_ps());
#pragma GCC unroll 3
            for (int i = 64; i < QK_K; i += 64)
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++) m[u] = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i + 8 * u), absmask), m[u]);
            __m256 v = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])),
                                     _mm256_max_ps(_mm256_max_ps(m[4], m[5]), _mm256_max_ps(m[6], m[7])));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            amax[c] = _mm_cvtss_f32(m4);
        }
        for (int c = 0; c < nc; c++) {
            const float *xb = x + (b0 + c) * QK_K;
            block_q8_K *yb = &y[b0 + c];
            if (amax[c] == 0) {
                memset(yb, 0, sizeof *yb);
                continue;
            }
            const __m256 id = _mm256_set1_ps(127.0f / amax[c]);
            yb->d = amax[c] / 127.0f;
            __m256i q[8];
            /* Without the clamp first: |x * id| <= 127 * (1 + 2^-24)^2 rounds into
             * [-127, 127] as the clamped value does, for every finite product; a NaN
             * or infinite one (x NaN or infinite, id infinite) converts to INT_MIN,
             * i.e. byte -128, which the clamped path never gives: then redo the
             * block with the clamp. */
            if (!act_block(xb, id, q, 0)) act_block(xb, id, q, 1);
            for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)(yb->qs + 32 * i), q[i]);
            kquant_bsums_avx2(q, yb->bsums);
        }
    }
}

void kquant_register_avx2(kern_table_t t, const kern_options_t *o) {
    /* The AVX-VNNI GEMMs form the same exact integers T_b, M_b and take the
     * same float steps: the choice changes speed, not results. */
    const bool vnni = o->avxvnni;
    t[TYPE_Q4_K][ISA_AVX2] = (kern_ops_t){dot_q4_K_avx2, act_q8_K_avx2, dot_rows_q4_K_avx2, (vnni ? kquant_avx2_gemm_vnni : kquant_avx2_gemm)[0]};
    t[TYPE_Q5_K][ISA_AVX2] = (kern_ops_t){dot_q5_K_avx2, act_q8_K_avx2, dot_rows_q5_K_avx2, (vnni ? kquant_avx2_gemm_vnni : kquant_avx2_gemm)[1]};
    t[TYPE_Q6_K][ISA_AVX2] = (kern_ops_t){dot_q6_K_avx2, act_q8_K_avx2, dot_rows_q6_K_avx2, (vnni ? kquant_avx2_gemm_vnni : kquant_avx2_gemm)[2]};
}
