/*
 * softmax.c - softmax.h: tern_expf and the passes over a candidate set, as
 * plain C (the definitions) and AVX2 + FMA (the same operations, 8 lanes).
 *
 * Why the vector forms give the definitions' bits: every step of tern_expf
 * is one correctly rounded IEEE operation (mul, nearbyint, fma, the
 * exponent-bit scaling, mul) and the vector code issues the same ones in
 * the same order per lane (vmulps, vroundps to nearest, vfnmadd = fma with
 * -k, vfmadd, vmulps); the NaN and underflow cases are blended in from
 * masks. The sum keeps one double accumulator per stripe, so lane j of the
 * two 4-double vectors sees e_j, e_{j+8}, ... in order, and the tail adds
 * into the same stripes. This file is compiled without floating-point
 * contraction (CMakeLists.txt), so the compiler fuses nothing the code does
 * not fuse itself.
 *
 * Cost on 151936 candidates (dev/ab/sampler_ab.c, AMD EPYC Zen 4): libm
 * expf over the set took about 0.57 ms a draw; this sum about 0.06 ms.
 */
#include "text/softmax.h"

#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "core/fexp.h"

_Static_assert(sizeof(tern_token_logit_t) == 8, "a candidate is an (int32, float) pair");

float tern_expf(float x) { return fexp1(x); }

bool softmax_max_ref(const tern_token_logit_t *c, int32_t n, float *max) {
    float m = -INFINITY;
    bool finite = true;
    for (int32_t i = 0; i < n; i++) {
        const float l = c[i].logit;
        if (!(fabsf(l) < INFINITY)) finite = false;
        if (l > m) m = l;
    }
    *max = m;
    return finite;
}

double softmax_sum_ref(const tern_token_logit_t *c, int32_t n, float m, float t) {
    double s[8] = {0};
    for (int32_t i = 0; i < n; i++) s[i % 8] += (double)tern_expf((c[i].logit - m) / t);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void softmax_probs_ref(const tern_token_logit_t *c, int32_t n, float m, float t, double sum, double *p) {
    for (int32_t i = 0; i < n; i++) p[i] = (float)(tern_expf((c[i].logit - m) / t) / sum);
}

int32_t softmax_collect_ref(const tern_token_logit_t *c, int32_t n, float lo, float hi, tern_token_logit_t *out) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (c[i].logit >= lo && c[i].logit < hi) out[m++] = c[i];
    return m;
}

double softmax_mass(const tern_token_logit_t *c, int32_t n, float m, float t, double sum, float *minp) {
    double p[256], s = 0;
    float lo = INFINITY;
    for (int32_t i0 = 0; i0 < n; i0 += 256) {
        const int32_t k = n - i0 < 256 ? n - i0 : 256;
        softmax_probs(c + i0, k, m, t, sum, p);
        for (int32_t i = 0; i < k; i++) {
            s += p[i];
            if ((float)p[i] < lo) lo = (float)p[i];
        }
    }
    *minp = lo;
    return s;
}

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define AVX2_FMA __attribute__((target("avx2,fma")))

/* The logits of the 8 pairs at c, in order. */
AVX2_FMA static inline __m256 logits8(const tern_token_logit_t *c) {
    const __m256 a = _mm256_loadu_ps((const float *)(const void *)c);       /* id0 l0 id1 l1 | id2 l2 id3 l3 */
    const __m256 b = _mm256_loadu_ps((const float *)(const void *)(c + 4)); /* id4 l4 id5 l5 | id6 l6 id7 l7 */
    const __m256 x = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));   /* l0 l1 l4 l5 | l2 l3 l6 l7 */
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(x), _MM_SHUFFLE(3, 1, 2, 0)));
}

AVX2_FMA static bool max_avx2(const tern_token_logit_t *c, int32_t n, float *max) {
    const __m256 inf = _mm256_set1_ps(INFINITY), abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_set1_ps(-INFINITY), fin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 l = logits8(c + i);
        m = _mm256_max_ps(l, m); /* m when l is NaN */
        fin = _mm256_and_ps(fin, _mm256_cmp_ps(_mm256_and_ps(l, abs), inf, _CMP_LT_OQ));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float mx = -INFINITY;
    for (int j = 0; j < 8; j++)
        if (lanes[j] > mx) mx = lanes[j];
    bool finite = _mm256_movemask_ps(fin) == 0xff;
    float tm;
    finite = softmax_max_ref(c + i, n - i, &tm) && finite;
    *max = tm > mx ? tm : mx;
    return finite;
}

AVX2_FMA static double sum_avx2(const tern_token_logit_t *c, int32_t n, float m, float t) {
    const __m256 mv = _mm256_set1_ps(m), tv = _mm256_set1_ps(t);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = fexp8(_mm256_div_ps(_mm256_sub_ps(logits8(c + i), mv), tv));
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double s[8];
    _mm256_storeu_pd(s, s0);
    _mm256_storeu_pd(s + 4, s1);
    for (int32_t j = 0; i < n; i++, j++) s[j] += (double)tern_expf((c[i].logit - m) / t);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

AVX2_FMA static void probs_avx2(const tern_token_logit_t *c, int32_t n, float m, float t, double sum, double *p) {
    const __m256 mv = _mm256_set1_ps(m), tv = _mm256_set1_ps(t);
    const __m256d sv = _mm256_set1_pd(sum);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = fexp8(_mm256_div_ps(_mm256_sub_ps(logits8(c + i), mv), tv));
        const __m256d q0 = _mm256_div_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)), sv);
        const __m256d q1 = _mm256_div_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)), sv);
        _mm256_storeu_pd(p + i, _mm256_cvtps_pd(_mm256_cvtpd_ps(q0)));
        _mm256_storeu_pd(p + i + 4, _mm256_cvtps_pd(_mm256_cvtpd_ps(q1)));
    }
    softmax_probs_ref(c + i, n - i, m, t, sum, p + i);
}

AVX2_FMA static int32_t collect_avx2(const tern_token_logit_t *c, int32_t n, float lo, float hi,
                                     tern_token_logit_t *out) {
    const __m256 lv = _mm256_set1_ps(lo), hv = _mm256_set1_ps(hi);
    int32_t m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 l = logits8(c + i);
        unsigned bits =
            (unsigned)_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(l, lv, _CMP_GE_OQ), _mm256_cmp_ps(l, hv, _CMP_LT_OQ)));
        while (bits) {
            out[m++] = c[i + __builtin_ctz(bits)];
            bits &= bits - 1;
        }
    }
    return m + softmax_collect_ref(c + i, n - i, lo, hi, out + m);
}

AVX2_FMA static void expf8_avx2(const float *x, float *out) { _mm256_storeu_ps(out, fexp8(_mm256_loadu_ps(x))); }

static bool have_avx2_fma(void) {
    const cpu_features_t *f = cpu_features();
    return f->avx2 && f->fma;
}
#endif

bool softmax_max(const tern_token_logit_t *c, int32_t n, float *max) {
#if defined(__x86_64__) || defined(_M_X64)
    if (have_avx2_fma()) return max_avx2(c, n, max);
#endif
    return softmax_max_ref(c, n, max);
}

double softmax_sum(const tern_token_logit_t *c, int32_t n, float m, float t) {
#if defined(__x86_64__) || defined(_M_X64)
    if (have_avx2_fma()) return sum_avx2(c, n, m, t);
#endif
    return softmax_sum_ref(c, n, m, t);
}

void softmax_probs(const tern_token_logit_t *c, int32_t n, float m, float t, double sum, double *p) {
#if defined(__x86_64__) || defined(_M_X64)
    if (have_avx2_fma()) {
        probs_avx2(c, n, m, t, sum, p);
        return;
    }
#endif
    softmax_probs_ref(c, n, m, t, sum, p);
}

int32_t softmax_collect(const tern_token_logit_t *c, int32_t n, float lo, float hi, tern_token_logit_t *out) {
#if defined(__x86_64__) || defined(_M_X64)
    if (have_avx2_fma()) return collect_avx2(c, n, lo, hi, out);
#endif
    return softmax_collect_ref(c, n, lo, hi, out);
}

bool tern_expf8_vec(const float *x, float *out) {
#if defined(__x86_64__) || defined(_M_X64)
    if (have_avx2_fma()) {
        expf8_avx2(x, out);
        return true;
    }
#endif
    (void)x;
    (void)out;
    return false;
}
