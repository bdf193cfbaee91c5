/*
 * ops.c - the small vector ops of a transformer step: RMSNorm, LayerNorm,
 * RoPE, SiLU*mul, residual add, softmax. They run on the caller's thread
 * (a few thousand elements each) and follow llama.cpp's arithmetic step by
 * step, so that a model run here and there rounds the same way: sums of
 * squares and means in double, the rest in float, RoPE angles by the same
 * iterated float product.
 */
#include <math.h>

#include "core/common.h"
#include "kernels/kernels.h"

void kern_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    if (n <= 0) return;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    /* llama.cpp scales, then multiplies by the weight as a separate op. */
    if (w)
        for (int64_t i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
    else
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale;
}

void kern_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n, float eps) {
    if (n <= 0) return;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i];
    const float mean = (float)(sum / (double)n);
    double sum2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] - mean;
        out[i] = v;
        sum2 += (double)(v * v);
    }
    const float variance = (float)(sum2 / (double)n);
    const float scale = 1.0f / sqrtf(variance + eps);
    for (int64_t i = 0; i < n; i++) {
        float v = out[i] * scale;
        if (w) v *= w[i];
        if (b) v += b[i];
        out[i] = v;
    }
}

void kern_rope(const kern_rope_t *r, float *x, int n_heads, int head_dim, int64_t pos) {
    TERN_CHECK(r != NULL && r->n_dims > 0 && r->n_dims % 2 == 0 && r->n_dims <= head_dim);
    const int half = r->n_dims / 2;
    const float theta_scale = powf(r->freq_base, -2.0f / (float)r->n_dims);
    /* Pairs outer, heads inner: one cos/sin per pair for all heads, and the
     * angle advances by the same float product as llama.cpp's rope cache. */
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        const float ff = r->freq_factors ? r->freq_factors[i] : 1.0f;
        const float th = r->freq_scale * (theta / ff);
        const float c = cosf(th), s = sinf(th);
        const int i0 = r->neox ? i : 2 * i;
        const int i1 = r->neox ? i + half : 2 * i + 1;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (int64_t)h * head_dim;
            const float x0 = v[i0], x1 = v[i1];
            v[i0] = x0 * c - x1 * s;
            v[i1] = x0 * s + x1 * c;
        }
        theta *= theta_scale;
    }
}

void kern_silu_mul_ref(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        gate[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

void kern_silu_mul(float *gate, const float *up, int64_t n) {
#if defined(__x86_64__) || defined(_M_X64)
    const kern_isa_t isa = kern_isa_active();
    if (isa == ISA_AVX2 || isa == ISA_AVX512) {
        kern_silu_mul_avx2(gate, up, n); /* a vector exp: x86/ops_avx2.c */
        return;
    }
#endif
    kern_silu_mul_ref(gate, up, n);
}

void kern_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void kern_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += (double)x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}
