/*
 * attention.c - softmax(q K^T * scale) V over an F32 or F16 KV cache, for one
 * query (decode) or a causal block of queries (prefill).
 *
 * Work items are (query i, KV head g) pairs, so the query heads of one GQA
 * group, which read the same K/V rows, stay on one thread. For each query
 * head the keys 0..pos0+i are visited in tiles of ATTN_TILE positions
 * starting at position 0: scores of a tile, the tile's max, a rescale of the
 * running sum and accumulator when the max grows (online softmax), then
 * exp(s - max) and the weighted V rows, in position order. The tiles and
 * the order are fixed by the query's position alone, so a query gives the
 * same bits alone (decode) or inside a block (prefill), at any thread count;
 * the scores buffer is one tile on the stack, no scratch needed.
 *
 * The scalar inner loops here are the reference; attention_avx2.c has the
 * AVX2/F16C ones (used for ISA_AVX2 and ISA_AVX512).
 */
#include <math.h>

#include "kernels/attention_impl.h"
#include "core/common.h"
#include "kernels/kernels.h"

#define ATTN_TILE 64

/* ---- scalar reference inner loops --------------------------------------- */

static void scores_f32(const float *q, const void *k, size_t kstride, int nt, int hd, float scale, float *s) {
    for (int t = 0; t < nt; t++) {
        const float *kr = (const float *)((const char *)k + (size_t)t * kstride);
        float sum = 0.0f;
        for (int d = 0; d < hd; d++) sum += q[d] * kr[d];
        s[t] = sum * scale;
    }
}

static void scores_f16(const float *q, const void *k, size_t kstride, int nt, int hd, float scale, float *s) {
    for (int t = 0; t < nt; t++) {
        const fp16_t *kr = (const fp16_t *)((const char *)k + (size_t)t * kstride);
        float sum = 0.0f;
        for (int d = 0; d < hd; d++) sum += q[d] * fp16_to_f32(kr[d]);
        s[t] = sum * scale;
    }
}

static void accum_f32(float *acc, const float *p, const void *v, size_t vstride, int nt, int hd) {
    for (int t = 0; t < nt; t++) {
        const float *vr = (const float *)((const char *)v + (size_t)t * vstride);
        const float pt = p[t];
        for (int d = 0; d < hd; d++) acc[d] += pt * vr[d];
    }
}

static void accum_f16(float *acc, const float *p, const void *v, size_t vstride, int nt, int hd) {
    for (int t = 0; t < nt; t++) {
        const fp16_t *vr = (const fp16_t *)((const char *)v + (size_t)t * vstride);
        const float pt = p[t];
        for (int d = 0; d < hd; d++) acc[d] += pt * fp16_to_f32(vr[d]);
    }
}

const attn_vt_t attn_vt_scalar[2] = {{scores_f32, accum_f32}, {scores_f16, accum_f16}};

/* ---- the driver -------------------------------------------------------- */

typedef struct {
    const kern_attn_t *a;
    const attn_vt_t *vt;
    int64_t pos0;
    const float *q;
    float *out;
    size_t elt;      /* bytes per cache element */
    size_t pos_stride; /* bytes between cache positions */
} attn_job_t;

/* One query head over keys 0..n_keys-1 of KV head g. */
static void attn_head(const attn_job_t *j, int g, const float *qh, float *oh, int64_t n_keys) {
    const kern_attn_t *a = j->a;
    const int hd = a->head_dim;
    const char *kb = (const char *)a->k_cache + (size_t)g * (size_t)hd * j->elt;
    const char *vb = (const char *)a->v_cache + (size_t)g * (size_t)hd * j->elt;
    float acc[KERN_ATTN_MAX_HEAD_DIM];
    float s[ATTN_TILE];
    for (int d = 0; d < hd; d++) acc[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t t0 = 0; t0 < n_keys; t0 += ATTN_TILE) {
        const int nt = n_keys - t0 < ATTN_TILE ? (int)(n_keys - t0) : ATTN_TILE;
        const size_t off = (size_t)t0 * j->pos_stride;
        j->vt->scores(qh, kb + off, j->pos_stride, nt, hd, a->scale, s);
        float mt = s[0];
        for (int t = 1; t < nt; t++) mt = s[t] > mt ? s[t] : mt;
        if (mt > m) {
            if (m != -INFINITY) {
                const float c = expf(m - mt);
                l *= c;
                for (int d = 0; d < hd; d++) acc[d] *= c;
            }
            m = mt;
        }
        for (int t = 0; t < nt; t++) {
            s[t] = expf(s[t] - m);
            l += s[t];
        }
        j->vt->accum(acc, s, vb + off, j->pos_stride, nt, hd);
    }
    const float inv = 1.0f / l;
    for (int d = 0; d < hd; d++) oh[d] = acc[d] * inv;
}

static int attn_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const attn_job_t *j = ctx;
    const kern_attn_t *a = j->a;
    const int group = a->n_heads / a->n_kv_heads;
    const int64_t row_elems = (int64_t)a->n_heads * a->head_dim;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i = r / a->n_kv_heads;
        const int g = (int)(r % a->n_kv_heads);
        for (int h = g * group; h < (g + 1) * group; h++) {
            const int64_t off = i * row_elems + (int64_t)h * a->head_dim;
            attn_head(j, g, j->q + off, j->out + off, j->pos0 + i + 1);
        }
    }
    return 0;
}

int kern_attention(tern_pool_t *pool, const kern_attn_t *a, int64_t pos0, int64_t nq, const float *q,
                   float *out, tern_error_t *err) {
    if (!a) return tern_err(err, TERN_EINVAL, "kern_attention: parameters are NULL");
    if (a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
        return tern_err(err, TERN_EINVAL, "kern_attention: %d heads is not a multiple of %d KV heads", a->n_heads,
                        a->n_kv_heads);
    if (a->head_dim <= 0 || a->head_dim > KERN_ATTN_MAX_HEAD_DIM)
        return tern_err(err, TERN_EINVAL, "kern_attention: head_dim %d not in 1..%d", a->head_dim,
                        KERN_ATTN_MAX_HEAD_DIM);
    if (a->kv_type != TYPE_F32 && a->kv_type != TYPE_F16)
        return tern_err(err, TERN_EINVAL, "kern_attention: KV cache type %s (%d): only f32 and f16",
                        quant_name(a->kv_type), a->kv_type);
    if (pos0 < 0 || nq < 0)
        return tern_err(err, TERN_EINVAL, "kern_attention: bad block pos0 %lld nq %lld", (long long)pos0,
                        (long long)nq);
    if (!isfinite(a->scale)) return tern_err(err, TERN_EINVAL, "kern_attention: scale is not finite");
    if (nq == 0) return 0;
    if (!a->k_cache || !a->v_cache || !q || !out)
        return tern_err(err, TERN_EINVAL, "kern_attention: NULL cache, query or output");
    const size_t elt = a->kv_type == TYPE_F32 ? sizeof(float) : sizeof(fp16_t);
    uint64_t npos, bytes, rows;
    if (tern_add_overflow_u64((uint64_t)pos0, (uint64_t)nq, &npos) ||
        tern_mul_overflow_u64(npos, (uint64_t)a->n_kv_heads * (uint64_t)a->head_dim * elt, &bytes) ||
        bytes > SIZE_MAX || tern_mul_overflow_u64((uint64_t)nq, (uint64_t)a->n_heads * (uint64_t)a->head_dim, &rows) ||
        rows > (uint64_t)INT64_MAX)
        return tern_err(err, TERN_EINVAL, "kern_attention: a cache of %lld + %lld positions overflows", (long long)pos0,
                        (long long)nq);

    const kern_isa_t isa = kern_isa_active();
    const attn_vt_t *vt = &attn_vt_scalar[a->kv_type == TYPE_F16];
#if defined(__x86_64__) || defined(__i386__)
    if (isa == ISA_AVX2 || isa == ISA_AVX512) vt = &attn_vt_avx2[a->kv_type == TYPE_F16];
#else
    (void)isa;
#endif
    attn_job_t j = {a, vt, pos0, q, out, elt, (size_t)a->n_kv_heads * (size_t)a->head_dim * elt};
    /* cost: the K and V bytes one work item reads at most (the gate only
     * needs a magnitude: computed in double, clamped so the pool's total of
     * rows * cost cannot overflow). */
    const int64_t n_items = nq * a->n_kv_heads;
    double cost_d = (double)(a->n_heads / a->n_kv_heads) * 2.0 * (double)npos * (double)a->head_dim * (double)elt;
    double cost_max = (double)(INT64_MAX / n_items) * 0.5;
    int64_t cost = cost_d < cost_max ? (int64_t)cost_d : (int64_t)cost_max;
    tern_range_t r = {attn_rows, &j, n_items, 1, cost};
    return tern_pool_run(pool, &r, 1, err);
}
