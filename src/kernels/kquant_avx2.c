/*
 * kquant_avx2.c - AVX2+FMA dot products of Q4_K, Q5_K, Q6_K weights with Q8_K
 * activations, and the AVX2 Q8_K activation quantizer (compiled with -mavx2
 * -mfma -mf16c; only reached through the kernel table when the CPU has them).
 *
 * Integer core: weights unpacked to unsigned bytes (4, 5 or 6 bits) and
 * multiplied with the signed activation bytes by maddubs (pairs to int16,
 * no saturation possible: 2 * 63 * 128 < 2^15), then madd with the
 * sub-block scale (int16) to int32 lanes; Q6_K's -32 offset is taken out
 * once per block as 32 * sum(sc * bsums). Per super-block each column keeps
 * 8 exact int32 lane sums, converts them and adds da * (d * sumi - dmin *
 * summ) (the scalar formula, lane by lane) to 8 float lanes; the lanes are
 * summed in a fixed order at the end. Weights of a
 * super-block are unpacked once for all (up to 4) columns, and each column's
 * operations are the same whatever the number of columns.
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

/* Super-block b of one row (wv) for nc columns: adds to acc[0..nc-1]. Every
 * kernel below is this function in a loop, so a column's (and a row's)
 * operations never depend on how many share a call. */
KQ_INLINE void affine_block(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m256 *acc,
                            const int is_q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
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
    /* sc[0..7] as int16 in both lanes; mins as m0 m0 m1 m1 .. m7 m7 to
     * pair with the 16 bsums (two per 32-element sub-block) */
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
    const __m128i mb = _mm_cvtsi64_si128((long long)m8);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(hd)), dmin = _mm256_set1_ps(_cvtsh_ss(hm));
    __m256i hb = is_q5 ? loadu256(qhp) : _mm256_setzero_si256();
    __m256i sumi[KERN_MAX_COLS];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) sumi[c] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        /* 64 elements: low nibbles = sub-block 2j, high = 2j+1 */
        const __m256i s_lo = _mm256_shuffle_epi8(sc16, pick16(2 * j, 2 * j));
        const __m256i s_hi = _mm256_shuffle_epi8(sc16, pick16(2 * j + 1, 2 * j + 1));
        const __m256i q = loadu256(qs + 32 * j);
        __m256i ql = _mm256_and_si256(q, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (is_q5) { /* bit 2j / 2j+1 of qh[l], brought to bit 0 / 1 by the shifts so far */
            ql = _mm256_or_si256(ql, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
            qh = _mm256_or_si256(qh, _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
            hb = _mm256_srli_epi16(hb, 2);
        }
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qa = act_at(xa, st, c, b)->qs + 64 * j;
            __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(ql, loadu256(qa)), s_lo);
            __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(qh, loadu256(qa + 32)), s_hi);
            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(p0, p1));
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        const block_q8_K *a = act_at(xa, st, c, b);
        const __m256i summ = _mm256_madd_epi16(loadu256(a->bsums), mins);
        const __m256 v = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(summ), _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi[c])));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(a->d), v, acc[c]);
    }
}

/* nr rows (at any addresses) x nc columns, read in lockstep: out[r*nc + c]. */
KQ_INLINE void affine_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                             float *out, const int is_q5) {
    __m256 acc[KQUANT_MAX_ACC];
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) affine_block(wr[r], b, xa, st, nc, acc + r * nc, is_q5);
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) out[i] = hsum_ps256(acc[i]);
}

/* ---- Q6_K ------------------------------------------------------------------- */

KQ_INLINE void q6k_block(const void *wv, int64_t b, const char *xa, size_t st, const int nc, __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const block_q6_K *w = (const block_q6_K *)wv + b;
    prefetch_block(w, sizeof *w);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(w->d));
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
        const __m256i l0 = loadu256(w->ql + 64 * h), l1 = loadu256(w->ql + 64 * h + 32);
        const __m256i hv = loadu256(w->qh + 32 * h);
        /* (qh >> 2i) & 3, moved to bits 4..5 of each byte */
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 4), m30));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30));
        const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hv, m30));
        const __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30));
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
        const __m256i s = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(corr, 5));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(a->d), _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)), acc[c]);
    }
}

KQ_INLINE void q6k_kernel(int64_t nb, const void *const *wr, const int nr, const char *xa, size_t st, const int nc,
                          float *out, const int unused) {
    (void)unused;
    __m256 acc[KQUANT_MAX_ACC];
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) q6k_block(wr[r], b, xa, st, nc, acc + r * nc);
#pragma GCC unroll 8
    for (int i = 0; i < nr * nc; i++) out[i] = hsum_ps256(acc[i]);
}

/* ---- entry points (tiles of rows x columns, dispatch) ------------------------- */

#define KQ_ISA avx2
#include "kquant_entry.h"

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
    t[TYPE_Q4_K][ISA_AVX2] = (kern_ops_t){dot_q4_K_avx2, act_q8_K_avx2, NULL};
    t[TYPE_Q5_K][ISA_AVX2] = (kern_ops_t){dot_q5_K_avx2, act_q8_K_avx2, NULL};
    t[TYPE_Q6_K][ISA_AVX2] = (kern_ops_t){dot_q6_K_avx2, act_q8_K_avx2, NULL};
}

kquant_dot_rows_fn kquant_rows_avx2(int type) {
    switch (type) {
    case TYPE_Q4_K: return dot_rows_q4_K_avx2;
    case TYPE_Q5_K: return dot_rows_q5_K_avx2;
    case TYPE_Q6_K: return dot_rows_q6_K_avx2;
    default: return NULL;
    }
}
