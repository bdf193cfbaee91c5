/*
 * attention_avx2.c - AVX2/FMA/F16C inner loops of kern_attention (see
 * attention.c for the algorithm and attention_impl.h for the contract).
 * Scores use eight lanes of partial sums reduced in a fixed order; the V
 * accumulation is elementwise, so it rounds like the scalar loop except for
 * the fused multiply-add.
 */
#include <immintrin.h>

#include "kernels/attention_impl.h"
#include "format/quant.h"
#include "kernels/kernels.h"

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

static inline __m256 load_f16x8(const fp16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* One head's score against a row of floats: the steps of every score. */
static inline float score_row(const float *q, const float *kr, int hd) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(kr + d + 8), a1);
    }
    for (; d + 8 <= hd; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d), a0);
    float sum = hsum8(_mm256_add_ps(a0, a1));
    for (; d < hd; d++) sum += q[d] * kr[d];
    return sum;
}

/* acc += pt * vr, one head. */
static inline void accum_row(float *acc, float pt, const float *vr, int hd) {
    const __m256 p8 = _mm256_set1_ps(pt);
    int d = 0;
    for (; d + 8 <= hd; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(p8, _mm256_loadu_ps(vr + d), _mm256_loadu_ps(acc + d)));
    for (; d < hd; d++) acc[d] += pt * vr[d];
}

/* An F16 row as floats (exact), once for all heads of the group. */
static inline void row_f16(float *out, const fp16_t *r, int hd) {
    int d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(out + d, load_f16x8(r + d));
    for (; d < hd; d++) out[d] = fp16_to_f32(r[d]);
}

static void scores_f32(const float *q, size_t qstride, int nh, const void *k, size_t kstride, int nt, int hd,
                       float scale, float *s, size_t sstride) {
    for (int t = 0; t < nt; t++) {
        const float *kr = (const float *)((const char *)k + (size_t)t * kstride);
        for (int h = 0; h < nh; h++) s[(size_t)h * sstride + (size_t)t] = score_row(q + (size_t)h * qstride, kr, hd) * scale;
    }
}

/* F16 rows are converted ATTN_CHUNK at a time into floats (exact), the
 * next chunk's lines prefetched: the conversions of a chunk are
 * independent loads, so the cache misses of its rows overlap, as they did
 * when one head at a time streamed a tile; then every head computes on the
 * chunk from L1. */
#define ATTN_CHUNK 8

static void prefetch_rows(const void *base, size_t stride, int t0, int t1, size_t bytes) {
    for (int t = t0; t < t1; t++)
        for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)base + (size_t)t * stride + o, _MM_HINT_T0);
}

static void scores_f16(const float *q, size_t qstride, int nh, const void *k, size_t kstride, int nt, int hd,
                       float scale, float *s, size_t sstride) {
    float kf[ATTN_CHUNK][KERN_ATTN_MAX_HEAD_DIM];
    for (int t0 = 0; t0 < nt; t0 += ATTN_CHUNK) {
        const int n = nt - t0 < ATTN_CHUNK ? nt - t0 : ATTN_CHUNK;
        prefetch_rows(k, kstride, t0 + n, nt - t0 - n < ATTN_CHUNK ? nt : t0 + n + ATTN_CHUNK, (size_t)hd * 2);
        for (int t = 0; t < n; t++) row_f16(kf[t], (const fp16_t *)((const char *)k + (size_t)(t0 + t) * kstride), hd);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nh; h++)
                s[(size_t)h * sstride + (size_t)(t0 + t)] = score_row(q + (size_t)h * qstride, kf[t], hd) * scale;
    }
}

static void accum_f32(float *acc, size_t accstride, const float *p, size_t pstride, int nh, const void *v,
                      size_t vstride, int nt, int hd) {
    for (int t = 0; t < nt; t++) {
        const float *vr = (const float *)((const char *)v + (size_t)t * vstride);
        for (int h = 0; h < nh; h++) accum_row(acc + (size_t)h * accstride, p[(size_t)h * pstride + (size_t)t], vr, hd);
    }
}

static void accum_f16(float *acc, size_t accstride, const float *p, size_t pstride, int nh, const void *v,
                      size_t vstride, int nt, int hd) {
    float vf[ATTN_CHUNK][KERN_ATTN_MAX_HEAD_DIM];
    for (int t0 = 0; t0 < nt; t0 += ATTN_CHUNK) {
        const int n = nt - t0 < ATTN_CHUNK ? nt - t0 : ATTN_CHUNK;
        prefetch_rows(v, vstride, t0 + n, nt - t0 - n < ATTN_CHUNK ? nt : t0 + n + ATTN_CHUNK, (size_t)hd * 2);
        for (int t = 0; t < n; t++) row_f16(vf[t], (const fp16_t *)((const char *)v + (size_t)(t0 + t) * vstride), hd);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nh; h++)
                accum_row(acc + (size_t)h * accstride, p[(size_t)h * pstride + (size_t)(t0 + t)], vf[t], hd);
    }
}

const attn_vt_t attn_vt_avx2[2] = {{scores_f32, accum_f32}, {scores_f16, accum_f16}};
