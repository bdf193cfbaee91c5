/*
 * attention_avx2.c - AVX2/FMA/F16C inner loops of kern_attention (see
 * attention.c for the algorithm and attention_impl.h for the contract).
 * Scores use eight lanes of partial sums reduced in a fixed order; the V
 * accumulation is elementwise, so it rounds like the scalar loop except for
 * the fused multiply-add.
 */
#include <immintrin.h>
#include <stdbool.h>

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

/* Rows are taken ATTN_CHUNK at a time, the next chunk's lines prefetched;
 * F16 rows are converted into buf (exact) first. The conversions of a
 * chunk are independent loads, so the cache misses of its rows overlap, as
 * they did when one head at a time streamed a tile; then every head
 * computes on the chunk from L1. rows[t] = row t0 + t as floats; returns
 * the chunk's row count. */
#define ATTN_CHUNK 8

static int chunk_rows(const void *base, size_t stride, int t0, int nt, int hd, bool f16,
                      float (*buf)[KERN_ATTN_MAX_HEAD_DIM], const float **rows) {
    const int n = nt - t0 < ATTN_CHUNK ? nt - t0 : ATTN_CHUNK;
    const int p1 = nt - t0 - n < ATTN_CHUNK ? nt : t0 + n + ATTN_CHUNK;
    const size_t bytes = (size_t)hd * (f16 ? sizeof(fp16_t) : sizeof(float));
    for (int t = t0 + n; t < p1; t++)
        for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)base + (size_t)t * stride + o, _MM_HINT_T0);
    for (int t = 0; t < n; t++) {
        const char *r = (const char *)base + (size_t)(t0 + t) * stride;
        if (f16) {
            row_f16(buf[t], (const fp16_t *)r, hd);
            rows[t] = buf[t];
        } else {
            rows[t] = (const float *)r;
        }
    }
    return n;
}

static void scores(const float *q, size_t qstride, int nh, const void *k, size_t kstride, int nt, int hd, float scale,
                   float *s, size_t sstride, bool f16) {
    float buf[ATTN_CHUNK][KERN_ATTN_MAX_HEAD_DIM];
    const float *rows[ATTN_CHUNK];
    for (int t0 = 0; t0 < nt;) {
        const int n = chunk_rows(k, kstride, t0, nt, hd, f16, buf, rows);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nh; h++)
                s[(size_t)h * sstride + (size_t)(t0 + t)] = score_row(q + (size_t)h * qstride, rows[t], hd) * scale;
        t0 += n;
    }
}

static void accum(float *acc, size_t accstride, const float *p, size_t pstride, int nh, const void *v, size_t vstride,
                  int nt, int hd, bool f16) {
    float buf[ATTN_CHUNK][KERN_ATTN_MAX_HEAD_DIM];
    const float *rows[ATTN_CHUNK];
    for (int t0 = 0; t0 < nt;) {
        const int n = chunk_rows(v, vstride, t0, nt, hd, f16, buf, rows);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nh; h++)
                accum_row(acc + (size_t)h * accstride, p[(size_t)h * pstride + (size_t)(t0 + t)], rows[t], hd);
        t0 += n;
    }
}

const attn_vt_t attn_vt_avx2 = {scores, accum};
