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

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

static inline __m256 load_f16x8(const fp16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static void scores_f32(const float *q, const void *k, size_t kstride, int nt, int hd, float scale, float *s) {
    for (int t = 0; t < nt; t++) {
        const float *kr = (const float *)((const char *)k + (size_t)t * kstride);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int d = 0;
        for (; d + 16 <= hd; d += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(kr + d + 8), a1);
        }
        for (; d + 8 <= hd; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d), a0);
        float sum = hsum8(_mm256_add_ps(a0, a1));
        for (; d < hd; d++) sum += q[d] * kr[d];
        s[t] = sum * scale;
    }
}

static void scores_f16(const float *q, const void *k, size_t kstride, int nt, int hd, float scale, float *s) {
    for (int t = 0; t < nt; t++) {
        const fp16_t *kr = (const fp16_t *)((const char *)k + (size_t)t * kstride);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int d = 0;
        for (; d + 16 <= hd; d += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f16x8(kr + d), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load_f16x8(kr + d + 8), a1);
        }
        for (; d + 8 <= hd; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f16x8(kr + d), a0);
        float sum = hsum8(_mm256_add_ps(a0, a1));
        for (; d < hd; d++) sum += q[d] * fp16_to_f32(kr[d]);
        s[t] = sum * scale;
    }
}

static void accum_f32(float *acc, const float *p, const void *v, size_t vstride, int nt, int hd) {
    for (int t = 0; t < nt; t++) {
        const float *vr = (const float *)((const char *)v + (size_t)t * vstride);
        const __m256 pt = _mm256_set1_ps(p[t]);
        int d = 0;
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pt, _mm256_loadu_ps(vr + d), _mm256_loadu_ps(acc + d)));
        for (; d < hd; d++) acc[d] += p[t] * vr[d];
    }
}

static void accum_f16(float *acc, const float *p, const void *v, size_t vstride, int nt, int hd) {
    for (int t = 0; t < nt; t++) {
        const fp16_t *vr = (const fp16_t *)((const char *)v + (size_t)t * vstride);
        const __m256 pt = _mm256_set1_ps(p[t]);
        int d = 0;
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pt, load_f16x8(vr + d), _mm256_loadu_ps(acc + d)));
        for (; d < hd; d++) acc[d] += p[t] * fp16_to_f32(vr[d]);
    }
}

const attn_vt_t attn_vt_avx2[2] = {{scores_f32, accum_f32}, {scores_f16, accum_f16}};
