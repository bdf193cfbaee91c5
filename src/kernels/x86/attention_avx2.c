/*
 * attention_avx2.c - AVX2/FMA/F16C inner loops of kern_attention (see
 * attention.c for the algorithm and attention_impl.h for the contract).
 * Scores use eight lanes of partial sums reduced in a fixed order (one row
 * at a time, score_row, or eight at once with the same additions,
 * score_chunk); the V accumulation is elementwise, so it rounds like the
 * scalar loop except for the fused multiply-add. Converted F16 rows sit in
 * a compact buffer and each head's accumulator stays in registers over a
 * chunk of rows: with the sum at a 4 KB stride and acc stored per row,
 * dev/ab/attn_ab.c measured 8 sequences x 512 positions (Llama-3.2-1B's
 * heads, 16 layers) at 29-35 ms, now 18-21 ms, at 2048 positions 161-167
 * -> 89-100 ms.
 */
#include <immintrin.h>
#include <stdbool.h>

#include "kernels/attention_impl.h"
#include "core/fexp.h"
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
 * the chunk's row count. buf holds the chunk's rows BUF_STRIDE(hd) floats
 * apart: at a 4 KB stride (buf[CHUNK][MAX_HEAD_DIM]) every converted row
 * fell into the same L1 sets and each store waited on the loads of the
 * row before (4K aliasing): dev/ab/attn_ab.c measured the conversion at
 * half of all attention time. */
#define ATTN_CHUNK 8
#define BUF_STRIDE(hd) ((size_t)(hd) + 16)
#define BUF_FLOATS (ATTN_CHUNK * (KERN_ATTN_MAX_HEAD_DIM + 16))

static int chunk_rows(const void *base, size_t stride, int t0, int nt, int hd, bool f16, float *buf,
                      const float **rows) {
    const int n = nt - t0 < ATTN_CHUNK ? nt - t0 : ATTN_CHUNK;
    const int p1 = nt - t0 - n < ATTN_CHUNK ? nt : t0 + n + ATTN_CHUNK;
    const size_t bytes = (size_t)hd * (f16 ? sizeof(fp16_t) : sizeof(float));
    for (int t = t0 + n; t < p1; t++)
        for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)base + (size_t)t * stride + o, _MM_HINT_T0);
    for (int t = 0; t < n; t++) {
        const char *r = (const char *)base + (size_t)(t0 + t) * stride;
        if (f16) {
            float *b = buf + (size_t)t * BUF_STRIDE(hd);
            row_f16(b, (const fp16_t *)r, hd);
            rows[t] = b;
        } else {
            rows[t] = (const float *)r;
        }
    }
    return n;
}

/* score_row's bits for the n <= ATTN_CHUNK rows of a chunk at once (hd a
 * multiple of 8): per row the same two fma chains a0 / a1 (four rows at a
 * time, q's slice loaded once for the four), v = a0 + a1, then hsum8's
 * additions ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) for all eight
 * rows by transposing (each lane adds the operands hsum8 adds, in its
 * order), times scale. Rows past n repeat row 0; their lanes are dropped. */
static inline void score_chunk(const float *q, const float *const *rows, int n, int hd, float scale, float *out) {
    const float *r[ATTN_CHUNK];
    _Pragma("GCC unroll 8") for (int t = 0; t < ATTN_CHUNK; t++) r[t] = rows[t < n ? t : 0];
    __m256 v[ATTN_CHUNK];
    _Pragma("GCC unroll 2") for (int t0 = 0; t0 < ATTN_CHUNK; t0 += 4) {
        __m256 a0[4], a1[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) a0[i] = a1[i] = _mm256_setzero_ps();
        int d = 0;
        for (; d + 16 <= hd; d += 16) {
            const __m256 q0 = _mm256_loadu_ps(q + d), q1 = _mm256_loadu_ps(q + d + 8);
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                a0[i] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(r[t0 + i] + d), a0[i]);
                a1[i] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(r[t0 + i] + d + 8), a1[i]);
            }
        }
        if (d < hd) {
            const __m256 q0 = _mm256_loadu_ps(q + d);
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) a0[i] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(r[t0 + i] + d), a0[i]);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) v[t0 + i] = _mm256_add_ps(a0[i], a1[i]);
    }
    __m256 w[4]; /* w[t]: row t's lo + hi in lanes 0..3, row t + 4's in 4..7 */
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
        w[t] = _mm256_add_ps(_mm256_permute2f128_ps(v[t], v[t + 4], 0x20), _mm256_permute2f128_ps(v[t], v[t + 4], 0x31));
    /* lanes: (w_0 + w_2), (w_1 + w_3) of rows 0, 1 | 4, 5 and 2, 3 | 6, 7 */
    const __m256 z01 = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(w[0]), _mm256_castps_pd(w[1]))),
                                     _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(w[0]), _mm256_castps_pd(w[1]))));
    const __m256 z23 = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(w[2]), _mm256_castps_pd(w[3]))),
                                     _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(w[2]), _mm256_castps_pd(w[3]))));
    const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(z01, z23, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm256_shuffle_ps(z01, z23, _MM_SHUFFLE(3, 1, 3, 1)));
    float o[ATTN_CHUNK];
    _mm256_storeu_ps(o, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
    for (int t = 0; t < n; t++) out[t] = o[t];
}

static void scores(const float *q, size_t qstride, int nh, const void *k, size_t kstride, int nt, int hd, float scale,
                   float *s, size_t sstride, bool f16) {
    float buf[BUF_FLOATS];
    const float *rows[ATTN_CHUNK];
    for (int t0 = 0; t0 < nt;) {
        const int n = chunk_rows(k, kstride, t0, nt, hd, f16, buf, rows);
        for (int h = 0; h < nh; h++) {
            float *sh = s + (size_t)h * sstride + (size_t)t0;
            const float *qh = q + (size_t)h * qstride;
            if (hd % 8 == 0)
                score_chunk(qh, rows, n, hd, scale, sh);
            else
                for (int t = 0; t < n; t++) sh[t] = score_row(qh, rows[t], hd) * scale;
        }
        t0 += n;
    }
}

static void expsub(float *s, int n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    int t = 0;
    for (; t + 8 <= n; t += 8) _mm256_storeu_ps(s + t, fexp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv)));
    for (; t < n; t++) s[t] = fexp1(s[t] - m);
}

/* acc_h[d] += p_h[t] * v_t[d] for the chunk's rows t in order: each
 * element's chain of fmas is accum_row's, but 8 dims of one head stay in a
 * register over the chunk's rows (accum_row loaded and stored them per
 * row). */
static void accum_chunk(float *acc, size_t accstride, const float *p, size_t pstride, int nh, const float *const *rows,
                        int n, int hd) {
    const int hv = hd & ~7;
    for (int h = 0; h < nh; h++) {
        float *ah = acc + (size_t)h * accstride;
        const float *ph = p + (size_t)h * pstride;
        int d = 0;
        for (; d + 64 <= hv; d += 64) { /* eight independent fma chains */
            __m256 a[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(ah + d + 8 * i);
            for (int t = 0; t < n; t++) {
                const __m256 p8 = _mm256_set1_ps(ph[t]);
                const float *vr = rows[t] + d;
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(p8, _mm256_loadu_ps(vr + 8 * i), a[i]);
            }
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) _mm256_storeu_ps(ah + d + 8 * i, a[i]);
        }
        for (; d < hv; d += 8) {
            __m256 a0 = _mm256_loadu_ps(ah + d);
            for (int t = 0; t < n; t++) a0 = _mm256_fmadd_ps(_mm256_set1_ps(ph[t]), _mm256_loadu_ps(rows[t] + d), a0);
            _mm256_storeu_ps(ah + d, a0);
        }
        for (; d < hd; d++)
            for (int t = 0; t < n; t++) ah[d] += ph[t] * rows[t][d];
    }
}

static void accum(float *acc, size_t accstride, const float *p, size_t pstride, int nh, const void *v, size_t vstride,
                  int nt, int hd, bool f16) {
    float buf[BUF_FLOATS];
    const float *rows[ATTN_CHUNK];
    for (int t0 = 0; t0 < nt;) {
        const int n = chunk_rows(v, vstride, t0, nt, hd, f16, buf, rows);
        accum_chunk(acc, accstride, p + t0, pstride, nh, rows, n, hd);
        t0 += n;
    }
}

static void scale(float *out, const float *in, int n, float c) {
    const __m256 c8 = _mm256_set1_ps(c);
    int d = 0;
    for (; d + 8 <= n; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(in + d), c8));
    for (; d < n; d++) out[d] = in[d] * c;
}

const attn_vt_t attn_vt_avx2 = {scores, accum, expsub, scale};
