/*
 * kquant_avx512.c - AVX-512 (F/BW/VL + VNNI) dot products of Q4_K, Q5_K, Q6_K
 * weights with Q8_K activations, and the AVX-512 Q8_K activation quantizer.
 * Only reached through the kernel table when the CPU has these extensions.
 *
 * Integer core: 64 weights per zmm as unsigned bytes, vpdpbusd against the
 * signed activation bytes into a zeroed accumulator gives int32 sums of 4
 * products (|sum| <= 4 * 63 * 128 < 2^15); two such vectors are packed to
 * int16 and one vpdpwssd multiplies each sum by its sub-block scale and
 * adds pairs of them to the column's int32 lanes. Q4_K/Q5_K
 * unpack 32 bytes of nibbles into 64 weights by broadcasting them to both
 * halves of a zmm and shifting the upper half by 4; Q6_K's -32 offset is
 * taken out once per block as 32 * sum(sc * bsums). Per super-block each
 * column converts its 16 exact int32 lanes to float and accumulates them
 * with FMA scaled by da*d (the Q4_K/Q5_K mins, scaled by da*dmin, in a
 * separate 8-lane accumulator); lanes are summed in a fixed order at the end. Weights are unpacked once for all (up
 * to 4) columns, and each column's operations do not depend on how many
 * columns share the call.
 */
#include "common.h"
#include "kquant.h"

#include <immintrin.h>

#define KQ_INLINE static inline __attribute__((always_inline))

/* fp16 scales are converted with F16C (exact, like fp16_to_f32) so that the
 * hot loops make no calls. */

KQ_INLINE float hsum_ps256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KQ_INLINE float hsum_ps512(__m512 v) {
    return hsum_ps256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

KQ_INLINE __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
KQ_INLINE __m512i loadu512(const void *p) { return _mm512_loadu_si512(p); }
/* 32 bytes into both halves of a zmm */
KQ_INLINE __m512i bcast256(const void *p) { return _mm512_broadcast_i64x4(loadu256(p)); }
/* lo in the low 256 bits, hi in the high 256 bits */
KQ_INLINE __m512i halves(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

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

/* ---- Q4_K / Q5_K ------------------------------------------------------------ */

/* Two vpdpbusd results t0 (chunk j) and t1 (chunk j+1) of 16 int32 lanes
 * each (lanes 0..7: sub-block 2j, 8..15: 2j+1) fit in int16 (|t| <= 4 * 31
 * * 128), so packs_epi32 joins them into one vector and one vpdpwssd
 * applies the scales. packs works per 128-bit lane L: int16 8L..8L+3 come
 * from t0 lanes 4L..4L+3, 8L+4..8L+7 from t1 lanes 4L..4L+3. So the scale
 * vector holds, per lane L: sc[2j + (L >= 2)] x 4, sc[2j + 2 + (L >= 2)] x 4,
 * as a byte shuffle of sc0..sc7 (int16) repeated in every lane. */
#define SC16(e) (char)(2 * (e)), (char)(2 * (e) + 1)
#define SC16x4(e) SC16(e), SC16(e), SC16(e), SC16(e)
#define SC_LANE(a, b) SC16x4(a), SC16x4(b)
static const union {
    char b[2][64];
    __m512i v[2];
} g_sc_pair_u = {{{SC_LANE(0, 2), SC_LANE(0, 2), SC_LANE(1, 3), SC_LANE(1, 3)},
                  {SC_LANE(4, 6), SC_LANE(4, 6), SC_LANE(5, 7), SC_LANE(5, 7)}}};
#define g_sc_pair g_sc_pair_u.v

/* Super-block b of one row (wv) for nc columns: adds to acc[0..nc-1] and
 * accm[0..nc-1]. Every kernel below is this function in a loop, so a
 * column's (and a row's) operations never depend on how many share a call. */
KQ_INLINE void affine_block(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m512 *acc,
                            __m256 *accm, const int is_q5) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), v16 = _mm512_set1_epi8(0x10);
    const __m512i shift = halves(_mm256_setzero_si256(), _mm256_set1_epi16(4)); /* nibble: low | high */
    const uint8_t *scales, *qs, *qhp = NULL;
    fp16_t hd, hm;
    if (is_q5) {
        const block_q5_K *w = (const block_q5_K *)wv + b;
        prefetch_block(w, sizeof *w);
        scales = w->scales, qs = w->qs, qhp = w->qh, hd = w->d, hm = w->dmin;
    } else {
        const block_q4_K *w = (const block_q4_K *)wv + b;
        prefetch_block(w, sizeof *w);
        scales = w->scales, qs = w->qs, hd = w->d, hm = w->dmin;
    }
    uint64_t sc8, m8;
    kquant_scales_k4(scales, &sc8, &m8);
    const __m128i mb = _mm_cvtsi64_si128((long long)m8);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb)); /* m0 m0 m1 m1 .. m7 m7 */
    const float d = _cvtsh_ss(hd), dmin = _cvtsh_ss(hm);
    const __m512i hb = is_q5 ? bcast256(qhp) : _mm512_setzero_si512();
    __m512i sumi[KERN_MAX_COLS];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
    /* sub-block scales as int16 in all four 128-bit lanes, then shuffled
     * by g_sc_pair to match the packed pairs of sums below */
    const __m512i sc4 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
#pragma GCC unroll 2
    for (int jp = 0; jp < 2; jp++) { /* chunks 2jp and 2jp+1: 128 elements */
        const __m512i S = _mm512_shuffle_epi8(sc4, g_sc_pair[jp]);
        __m512i q[2];
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
            const int j = 2 * jp + u;
            /* 64 elements 64j..64j+63: sub-block 2j (low nibbles of
             * qs[32j..]) in the low half, 2j+1 (high nibbles) in the high */
            q[u] = _mm512_and_si512(_mm512_srlv_epi16(bcast256(qs + 32 * j), shift), m4);
            if (is_q5) { /* bit 2j (low half) / 2j+1 (high half) of qh[l] */
                const __m512i bit =
                    halves(_mm256_set1_epi8((char)(1 << (2 * j))), _mm256_set1_epi8((char)(1 << (2 * j + 1))));
                q[u] = _mm512_mask_add_epi8(q[u], _mm512_test_epi8_mask(hb, bit), q[u], v16);
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qa = act_at(xa, st, c, b)->qs + 128 * jp;
            const __m512i t0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], loadu512(qa));
            const __m512i t1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[1], loadu512(qa + 64));
            sumi[c] = _mm512_dpwssd_epi32(sumi[c], _mm512_packs_epi32(t0, t1), S);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        const block_q8_K *a = act_at(xa, st, c, b);
        /* the mins in 8-lane vectors: 256-bit operations also run on the
         * port that 512-bit ones leave free */
        const __m256i summ = _mm256_madd_epi16(loadu256(a->bsums), mins);
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(a->d * d), _mm512_cvtepi32_ps(sumi[c]), acc[c]);
        accm[c] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * dmin), _mm256_cvtepi32_ps(summ), accm[c]);
    }
}

/* nr rows (at any addresses) x nc columns, read in lockstep: out[r*nc + c]. */
KQ_INLINE void affine_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                             float *out, const int is_q5) {
    __m512 acc[KQUANT_MAX_ACC];
    __m256 accm[KQUANT_MAX_ACC];
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) {
        acc[i] = _mm512_setzero_ps();
        accm[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) affine_block(wr[r], b, xa, st, nc, acc + r * nc, accm + r * nc, is_q5);
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) out[i] = hsum_ps512(acc[i]) - hsum_ps256(accm[i]);
}

/* ---- Q6_K ------------------------------------------------------------------- */

/* As for Q4_K: t01 (elements 128h + 0..63, 4 lanes per sub-block 8h..8h+3)
 * and t23 (128h + 64..127, sub-blocks 8h+4..8h+7) fit in int16 (|t| <= 4 *
 * 63 * 128), are packed into one vector, and lane L of it needs
 * sc[8h + L] x 4, sc[8h + 4 + L] x 4. */
static const union {
    char b[64];
    __m512i v;
} g_sc_q6 = {{SC_LANE(0, 4), SC_LANE(1, 5), SC_LANE(2, 6), SC_LANE(3, 7)}};

KQ_INLINE void q6k_block(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m512 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* (qh >> 2i) & 3 to bits 4..5: i = 0 | 1 via left shifts 4 | 2, i = 2 | 3 via right shifts 0 | 2 */
    const __m512i sh01 = halves(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    const __m512i sh23 = halves(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    const block_q6_K *w = (const block_q6_K *)wv + b;
    prefetch_block(w, sizeof *w);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
    /* scales 0..7 (or 8..15) as int16 in every 128-bit lane */
    const __m512i sc_lo = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16));
    const __m512i sc_hi = _mm512_broadcast_i32x4(_mm256_extracti128_si256(sc16, 1));
    const float d = _cvtsh_ss(w->d);
    __m512i sumi[KERN_MAX_COLS];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i S = _mm512_shuffle_epi8(h ? sc_hi : sc_lo, g_sc_q6.v);
        const __m512i L = loadu512(w->ql + 64 * h);
        const __m512i H = bcast256(w->qh + 32 * h);
        const __m512i q01 = _mm512_or_si512(_mm512_and_si512(L, m4), _mm512_and_si512(_mm512_sllv_epi16(H, sh01), m30));
        const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                            _mm512_and_si512(_mm512_srlv_epi16(H, sh23), m30));
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qa = act_at(xa, st, c, b)->qs + 128 * h;
            const __m512i t01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q01, loadu512(qa));
            const __m512i t23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q23, loadu512(qa + 64));
            sumi[c] = _mm512_dpwssd_epi32(sumi[c], _mm512_packs_epi32(t01, t23), S);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        const block_q8_K *a = act_at(xa, st, c, b);
        /* the quants above were q+32: subtract 32 * sum_k sc[k] * bsums[k] */
        const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(loadu256(a->bsums), sc16), 5);
        const __m512i s = _mm512_sub_epi32(sumi[c], _mm512_zextsi256_si512(corr));
        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(a->d * d), _mm512_cvtepi32_ps(s), acc[c]);
    }
}

KQ_INLINE void q6k_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                          float *out, const int unused) {
    (void)unused;
    __m512 acc[KQUANT_MAX_ACC];
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) q6k_block(wr[r], b, xa, st, nc, acc + r * nc);
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) out[i] = hsum_ps512(acc[i]);
}

/* ---- entry points (tiles of rows x columns, dispatch) ------------------------- */

#define KQ_ISA avx512
#include "kquant_entry.h"

/* ---- Q8_K activations ----------------------------------------------------------- */

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

void kquant_register_avx512(kern_table_t t) {
    t[TYPE_Q4_K][ISA_AVX512] = (kern_ops_t){dot_q4_K_avx512, act_q8_K_avx512, NULL};
    t[TYPE_Q5_K][ISA_AVX512] = (kern_ops_t){dot_q5_K_avx512, act_q8_K_avx512, NULL};
    t[TYPE_Q6_K][ISA_AVX512] = (kern_ops_t){dot_q6_K_avx512, act_q8_K_avx512, NULL};
}

kquant_dot_rows_fn kquant_rows_avx512(int type) {
    switch (type) {
    case TYPE_Q4_K: return dot_rows_q4_K_avx512;
    case TYPE_Q5_K: return dot_rows_q5_K_avx512;
    case TYPE_Q6_K: return dot_rows_q6_K_avx512;
    default: return NULL;
    }
}
