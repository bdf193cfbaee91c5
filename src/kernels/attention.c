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
 * the scores buffer is one tile on the stack, no scratch needed. Up to
 * ATTN_GMAX heads of a group go through the tiles together (attn_heads),
 * each with its own running max, sum and accumulator: the K / V rows are
 * read and converted once for all of them, and no head's float operations
 * change (attention_impl.h). `tern bench -m llama1b-q4_0.gguf -t 2 -np 16
 * -p 512 -n 32 -r 2`, AMD EPYC (Zen 4): 84.1 -> 103.3 tok/s against one
 * head at a time (same run, alternated).
 *
 * The softmax weights are exp(s - max) by core/fexp.h's fexp1 (not libm's
 * expf): a fixed sequence of IEEE operations whose vector form gives the
 * same bits, so the AVX2 loops take eight weights at once and the result
 * does not depend on the C library or on whether the CPU has FMA. Each
 * head's running max and sum keep the plain loop's order (the heads'
 * chains interleaved). As a tile starts, its V rows and the next tile's K
 * rows are prefetched into L2 (at long contexts they come from DRAM).
 *
 * The scalar inner loops here are the reference; attention_avx2.c has the
 * AVX2/F16C ones (used for ISA_AVX2 and ISA_AVX512).
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/attention_impl.h"
#include "core/common.h"
#include "core/fexp.h"
#include "kernels/kernels.h"

#define ATTN_TILE 64

/* ---- scalar reference inner loops --------------------------------------- */

/* Row t of a cache tile as floats: the row itself (F32) or its exact
 * conversion into buf (F16). */
static const float *row_f32(const void *base, size_t stride, int t, int hd, bool f16, float *buf) {
    const char *r = (const char *)base + (size_t)t * stride;
    if (!f16) return (const float *)r;
    for (int d = 0; d < hd; d++) buf[d] = fp16_to_f32(((const fp16_t *)r)[d]);
    return buf;
}

static void scores(const float *q, size_t qstride, int nh, const void *k, size_t kstride, int nt, int hd, float scale,
                   float *s, size_t sstride, bool f16) {
    float buf[KERN_ATTN_MAX_HEAD_DIM];
    for (int t = 0; t < nt; t++) {
        const float *kr = row_f32(k, kstride, t, hd, f16, buf);
        for (int h = 0; h < nh; h++) {
            const float *qh = q + (size_t)h * qstride;
            float sum = 0.0f;
            for (int d = 0; d < hd; d++) sum += qh[d] * kr[d];
            s[(size_t)h * sstride + (size_t)t] = sum * scale;
        }
    }
}

static void accum(float *acc, size_t accstride, const float *p, size_t pstride, int nh, const void *v, size_t vstride,
                  int nt, int hd, bool f16) {
    float buf[KERN_ATTN_MAX_HEAD_DIM];
    for (int t = 0; t < nt; t++) {
        const float *vr = row_f32(v, vstride, t, hd, f16, buf);
        for (int h = 0; h < nh; h++) {
            const float pt = p[(size_t)h * pstride + (size_t)t];
            float *ah = acc + (size_t)h * accstride;
            for (int d = 0; d < hd; d++) ah[d] += pt * vr[d];
        }
    }
}

static void expsub(float *s, int n, float m) {
    for (int t = 0; t < n; t++) s[t] = fexp1(s[t] - m);
}

static void scale(float *out, const float *in, int n, float c) {
    for (int d = 0; d < n; d++) out[d] = in[d] * c;
}

const attn_vt_t attn_vt_scalar = {scores, accum, expsub, scale};

/* ---- the driver -------------------------------------------------------- */

typedef struct {
    const kern_attn_t *a;
    const attn_vt_t *vt;
    int64_t pos0;                /* contiguous: the block's first position */
    const kern_attn_query_t *qs; /* paged: per query, else NULL */
    const float *q;
    float *out;
    size_t elt;        /* bytes per cache element */
    size_t pos_stride; /* bytes between cache positions (within a block) */
    size_t head_stride; /* bytes between KV heads (within a block) */
    int64_t block_pos; /* positions per block (contiguous: INT64_MAX) */
} attn_job_t;

/* Key position t of KV head g in a cache base (K or V): row t % block_pos of
 * head g in block blocks[t / block_pos] (head-major blocks), or head g of
 * row t of a contiguous cache. */
static const char *key_row(const attn_job_t *j, const void *base, const int32_t *blocks, int g, int64_t t) {
    const char *b = (const char *)base + (size_t)g * j->head_stride;
    if (!blocks) return b + (size_t)t * j->pos_stride;
    return b + (size_t)blocks[t / j->block_pos] * j->a->block_bytes + (size_t)(t % j->block_pos) * j->pos_stride;
}

/* Keys t .. t+n-1 with t's block: how many of them are contiguous. */
static int run_of(const attn_job_t *j, int64_t t, int n) {
    const int64_t left = j->block_pos - t % j->block_pos;
    return left < n ? (int)left : n;
}

/* Prefetch (into L2) the rows of keys t0 .. t1-1 of KV head g (K or V
 * cache base). At long contexts the rows come from DRAM: fetched only one
 * chunk ahead (chunk_rows) they arrived one latency at a time
 * (dev/ab/attn_ab.c: 8 sequences x 512 positions read K / V at 5 GB/s),
 * so attn_heads asks for the next tile's K and this tile's V as a tile
 * starts. Spreading these prefetches over the tile's chunks measured
 * slower. With head-major blocks (kernels.h) a head's rows are contiguous,
 * yet without these prefetches the blocks still came at the old speed. */
static void prefetch_rows(const attn_job_t *j, const void *base, const int32_t *blocks, int g, int64_t t0, int64_t t1) {
    const size_t bytes = (size_t)j->a->head_dim * j->elt;
    for (int64_t t = t0; t < t1;) {
        const int r = run_of(j, t, t1 - t < ATTN_TILE ? (int)(t1 - t) : ATTN_TILE);
        const char *p = key_row(j, base, blocks, g, t);
        for (int i = 0; i < r; i++, p += j->pos_stride)
            for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
        t += r;
    }
}

/* mt[h] = the max of s[h][0..nt-1] by the plain loop (a NaN first score
 * stays, later NaNs are skipped), four heads' chains at a time in
 * registers (in an array indexed by head they went through memory, a
 * store-to-load forward per score). */
static void tile_max(float (*s)[ATTN_TILE], int nh, int nt, float *mt) {
    int h = 0;
    for (; h + 4 <= nh; h += 4) {
        float a = s[h][0], b = s[h + 1][0], c = s[h + 2][0], d = s[h + 3][0];
        for (int t = 1; t < nt; t++) {
            a = s[h][t] > a ? s[h][t] : a;
            b = s[h + 1][t] > b ? s[h + 1][t] : b;
            c = s[h + 2][t] > c ? s[h + 2][t] : c;
            d = s[h + 3][t] > d ? s[h + 3][t] : d;
        }
        mt[h] = a, mt[h + 1] = b, mt[h + 2] = c, mt[h + 3] = d;
    }
    for (; h < nh; h++) {
        float a = s[h][0];
        for (int t = 1; t < nt; t++) a = s[h][t] > a ? s[h][t] : a;
        mt[h] = a;
    }
}

/* l[h] += s[h][t] for t = 0..nt-1 in order, four heads at a time. */
static void tile_sum(float (*s)[ATTN_TILE], int nh, int nt, float *l) {
    int h = 0;
    for (; h + 4 <= nh; h += 4) {
        float a = l[h], b = l[h + 1], c = l[h + 2], d = l[h + 3];
        for (int t = 0; t < nt; t++) a += s[h][t], b += s[h + 1][t], c += s[h + 2][t], d += s[h + 3][t];
        l[h] = a, l[h + 1] = b, l[h + 2] = c, l[h + 3] = d;
    }
    for (; h < nh; h++) {
        float a = l[h];
        for (int t = 0; t < nt; t++) a += s[h][t];
        l[h] = a;
    }
}

/* Query heads qh + h * head_dim (h < nh <= ATTN_GMAX, one GQA group's)
 * over keys 0..n_keys-1 of KV head g, each head with its own running max,
 * sum and accumulator: the steps of one head, the K / V rows shared. A tile
 * that spans blocks is scored and accumulated run by run: the scores are
 * independent per key and the accumulation goes in key order either way,
 * so the bits do not depend on where blocks begin. */
static void attn_heads(const attn_job_t *j, const int32_t *blocks, int g, int nh, const float *qh, float *oh,
                       int64_t n_keys) {
    const kern_attn_t *a = j->a;
    const int hd = a->head_dim;
    /* The heads' accumulators hd + 16 floats apart: at a stride of 4 KB
     * (acc[GMAX][MAX_HEAD_DIM]) each head's loads waited on the stores of
     * the head before (4K aliasing; measured 25% slower than one head at a
     * time at 512 positions). */
    float accbuf[ATTN_GMAX * (KERN_ATTN_MAX_HEAD_DIM + 16)];
    const size_t as = (size_t)hd + 16;
    float s[ATTN_GMAX][ATTN_TILE];
    float m[ATTN_GMAX], l[ATTN_GMAX];
    memset(accbuf, 0, sizeof(float) * as * (size_t)nh);
    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    prefetch_rows(j, a->k_cache, blocks, g, 0, n_keys < ATTN_TILE ? n_keys : ATTN_TILE);
    for (int64_t t0 = 0; t0 < n_keys; t0 += ATTN_TILE) {
        const int nt = n_keys - t0 < ATTN_TILE ? (int)(n_keys - t0) : ATTN_TILE;
        prefetch_rows(j, a->v_cache, blocks, g, t0, t0 + nt);
        prefetch_rows(j, a->k_cache, blocks, g, t0 + nt, n_keys - t0 - nt < ATTN_TILE ? n_keys : t0 + nt + ATTN_TILE);
        for (int t = 0; t < nt;) {
            const int r = run_of(j, t0 + t, nt - t);
            j->vt->scores(qh, (size_t)hd, nh, key_row(j, a->k_cache, blocks, g, t0 + t), j->pos_stride, r, hd, a->scale,
                          &s[0][t], ATTN_TILE, a->kv_type == TYPE_F16);
            t += r;
        }
        /* Each head's max, weights and sum in the plain loop's order. */
        float mt[ATTN_GMAX];
        tile_max(s, nh, nt, mt);
        for (int h = 0; h < nh; h++) {
            if (mt[h] > m[h]) {
                if (m[h] != -INFINITY) {
                    const float c = fexp1(m[h] - mt[h]);
                    l[h] *= c;
                    float *acc = accbuf + (size_t)h * as;
                    j->vt->scale(acc, acc, hd, c);
                }
                m[h] = mt[h];
            }
            j->vt->expsub(s[h], nt, m[h]);
        }
        tile_sum(s, nh, nt, l);
        for (int t = 0; t < nt;) {
            const int r = run_of(j, t0 + t, nt - t);
            j->vt->accum(accbuf, as, &s[0][t], ATTN_TILE, nh,
                         key_row(j, a->v_cache, blocks, g, t0 + t), j->pos_stride, r, hd, a->kv_type == TYPE_F16);
            t += r;
        }
    }
    for (int h = 0; h < nh; h++) j->vt->scale(oh + (size_t)h * (size_t)hd, accbuf + (size_t)h * as, hd, 1.0f / l[h]);
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
        const int64_t pos = j->qs ? j->qs[i].pos : j->pos0 + i;
        const int32_t *blocks = j->qs ? j->qs[i].blocks : NULL;
        for (int h = g * group; h < (g + 1) * group; h += ATTN_GMAX) {
            const int nh = (g + 1) * group - h < ATTN_GMAX ? (g + 1) * group - h : ATTN_GMAX;
            const int64_t off = i * row_elems + (int64_t)h * a->head_dim;
            attn_heads(j, blocks, g, nh, j->q + off, j->out + off, pos + 1);
        }
    }
    return 0;
}

/* Checks shared by both entry points; *elt = bytes per cache element. */
static int attn_check(const kern_attn_t *a, int64_t nq, const float *q, const float *out, size_t *elt,
                      tern_error_t *err) {
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
    if (nq < 0) return tern_err(err, TERN_EINVAL, "kern_attention: bad query count %lld", (long long)nq);
    if (!isfinite(a->scale)) return tern_err(err, TERN_EINVAL, "kern_attention: scale is not finite");
    if (nq > 0 && (!a->k_cache || !a->v_cache || !q || !out))
        return tern_err(err, TERN_EINVAL, "kern_attention: NULL cache, query or output");
    *elt = a->kv_type == TYPE_F32 ? sizeof(float) : sizeof(fp16_t);
    uint64_t rows;
    if (tern_mul_overflow_u64((uint64_t)nq, (uint64_t)a->n_heads * (uint64_t)a->head_dim, &rows) ||
        rows > (uint64_t)INT64_MAX)
        return tern_err(err, TERN_EINVAL, "kern_attention: %lld queries overflow", (long long)nq);
    return 0;
}

static const attn_vt_t *attn_vt(void) {
    const kern_isa_t isa = kern_isa_active();
    const attn_vt_t *vt = &attn_vt_scalar;
#if defined(__x86_64__) || defined(__i386__)
    if (isa == ISA_AVX2 || isa == ISA_AVX512) vt = &attn_vt_avx2;
#else
    (void)isa;
#endif
    return vt;
}

/* The pool run: n_items (query, KV head) pairs; cost is the K and V bytes
 * one item reads at most for keys 0..max_pos (the gate only needs a
 * magnitude: computed in double, clamped so the pool's total of rows * cost
 * cannot overflow). */
static int attn_run(tern_pool_t *pool, attn_job_t *j, int64_t nq, int64_t max_pos, tern_error_t *err) {
    const kern_attn_t *a = j->a;
    const int64_t n_items = nq * a->n_kv_heads;
    double cost_d = (double)(a->n_heads / a->n_kv_heads) * 2.0 * (double)(max_pos + 1) * (double)a->head_dim *
                    (double)j->elt;
    double cost_max = (double)(INT64_MAX / n_items) * 0.5;
    int64_t cost = cost_d < cost_max ? (int64_t)cost_d : (int64_t)cost_max;
    tern_range_t r = {attn_rows, j, n_items, 1, cost};
    return tern_pool_run(pool, &r, 1, err);
}

int kern_attention(tern_pool_t *pool, const kern_attn_t *a, int64_t pos0, int64_t nq, const float *q,
                   float *out, tern_error_t *err) {
    size_t elt;
    int rc = attn_check(a, nq, q, out, &elt, err);
    if (rc) return rc;
    if (pos0 < 0) return tern_err(err, TERN_EINVAL, "kern_attention: bad block pos0 %lld", (long long)pos0);
    if (nq == 0) return 0;
    uint64_t npos, bytes;
    if (tern_add_overflow_u64((uint64_t)pos0, (uint64_t)nq, &npos) ||
        tern_mul_overflow_u64(npos, (uint64_t)a->n_kv_heads * (uint64_t)a->head_dim * elt, &bytes) ||
        bytes > SIZE_MAX)
        return tern_err(err, TERN_EINVAL, "kern_attention: a cache of %lld + %lld positions overflows", (long long)pos0,
                        (long long)nq);
    attn_job_t j = {a, attn_vt(), pos0, NULL, q, out, elt, (size_t)a->n_kv_heads * (size_t)a->head_dim * elt,
                    (size_t)a->head_dim * elt, INT64_MAX};
    return attn_run(pool, &j, nq, pos0 + nq - 1, err);
}

int kern_attention_batch(tern_pool_t *pool, const kern_attn_t *a, int64_t nq, const kern_attn_query_t *qs,
                         const float *q, float *out, tern_error_t *err) {
    size_t elt;
    int rc = attn_check(a, nq, q, out, &elt, err);
    if (rc) return rc;
    if (nq == 0) return 0;
    if (!qs) return tern_err(err, TERN_EINVAL, "kern_attention_batch: NULL queries");
    const size_t pos_stride = (size_t)a->n_kv_heads * (size_t)a->head_dim * elt;
    uint64_t bb;
    if (a->block_pos < 1 || tern_mul_overflow_u64((uint64_t)a->block_pos, pos_stride, &bb) || bb > a->block_bytes)
        return tern_err(err, TERN_EINVAL, "kern_attention_batch: blocks of %lld positions do not fit %zu bytes",
                        (long long)a->block_pos, a->block_bytes);
    int64_t max_pos = 0;
    for (int64_t i = 0; i < nq; i++) {
        if (qs[i].pos < 0 || !qs[i].blocks)
            return tern_err(err, TERN_EINVAL, "kern_attention_batch: query %lld has position %lld or no blocks",
                            (long long)i, (long long)qs[i].pos);
        if (qs[i].pos > max_pos) max_pos = qs[i].pos;
    }
    attn_job_t j = {a, attn_vt(), 0, qs, q, out, elt, (size_t)a->head_dim * elt,
                    (size_t)a->block_pos * (size_t)a->head_dim * elt, a->block_pos};
    return attn_run(pool, &j, nq, max_pos, err);
}
