/*
 * kv_cache.c - the KV cache module (see kv_cache.h): layout, store and
 * commit, truncate, prefix copy, and the serialized form.
 */
#include "model/kv_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "format/quant.h"

struct kv_cache {
    kv_layout_t lo;
    int64_t n_pos;    /* positions 0 .. n_pos-1 hold K and V of every layer */
    unsigned char *k; /* (n_layer, n_ctx, n_head_kv, head_dim) */
    unsigned char *v; /* (n_layer, n_ctx, n_head_kv, head_dim) */
};

#define KV_MAGIC 0x43564B54u /* "TKVC" as little-endian bytes */
#define KV_VERSION 1u

/* ---- layout ------------------------------------------------------------- */

int kv_layout_init(kv_layout_t *lo, int type, int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim,
                   tern_error_t *err) {
    memset(lo, 0, sizeof *lo);
    if (type != TYPE_F16 && type != TYPE_F32)
        return tern_err(err, TERN_EINVAL, "kv cache: type %s (%d): only f16 and f32", quant_name(type), type);
    if (n_layer < 1 || n_ctx < 1 || n_head_kv < 1 || head_dim < 1 || n_layer > UINT32_MAX ||
        n_head_kv > UINT32_MAX || head_dim > UINT32_MAX)
        return tern_err(err, TERN_EINVAL, "kv cache: bad layout: %lld layers, %lld positions, %lld heads x %lld",
                        (long long)n_layer, (long long)n_ctx, (long long)n_head_kv, (long long)head_dim);
    const uint64_t elt = type == TYPE_F32 ? sizeof(float) : sizeof(fp16_t);
    uint64_t pos_bytes, layer_bytes, all;
    if (tern_mul_overflow_u64((uint64_t)n_head_kv, (uint64_t)head_dim, &pos_bytes) ||
        tern_mul_overflow_u64(pos_bytes, elt, &pos_bytes) ||
        tern_mul_overflow_u64(pos_bytes, (uint64_t)n_ctx, &layer_bytes) ||
        tern_mul_overflow_u64(layer_bytes, (uint64_t)n_layer, &all) || all > SIZE_MAX / 2)
        return tern_err(err, TERN_EINVAL, "kv cache: a cache of %lld positions overflows", (long long)n_ctx);
    lo->type = type;
    lo->n_layer = n_layer;
    lo->n_ctx = n_ctx;
    lo->n_head_kv = n_head_kv;
    lo->head_dim = head_dim;
    lo->elt_bytes = (size_t)elt;
    lo->pos_bytes = (size_t)pos_bytes;
    lo->layer_bytes = (size_t)layer_bytes;
    return 0;
}

bool kv_layout_compatible(const kv_layout_t *a, const kv_layout_t *b) {
    return a->type == b->type && a->n_layer == b->n_layer && a->n_head_kv == b->n_head_kv &&
           a->head_dim == b->head_dim;
}

/* "f16, 2 layers x 4 heads x 8" for messages. */
static const char *layout_str(char *buf, size_t cap, int type, uint64_t n_layer, uint64_t n_head_kv,
                              uint64_t head_dim) {
    snprintf(buf, cap, "%s, %llu layers x %llu heads x %llu", quant_name(type), (unsigned long long)n_layer,
             (unsigned long long)n_head_kv, (unsigned long long)head_dim);
    return buf;
}

/* ---- the cache ---------------------------------------------------------- */

kv_cache_t *kv_cache_new(const kv_layout_t *lo, tern_error_t *err) {
    kv_layout_t chk;
    if (!lo) {
        tern_err(err, TERN_EINVAL, "kv cache: NULL layout");
        return NULL;
    }
    /* Rederive the strides: a hand-made layout must not size the memory. */
    if (kv_layout_init(&chk, lo->type, lo->n_layer, lo->n_ctx, lo->n_head_kv, lo->head_dim, err)) return NULL;
    kv_cache_t *c = calloc(1, sizeof *c);
    if (!c) {
        tern_err(err, TERN_ENOMEM, "kv cache: out of memory");
        return NULL;
    }
    c->lo = chk;
    const size_t bytes = chk.layer_bytes * (size_t)chk.n_layer;
    c->k = tern_alloc(bytes);
    c->v = tern_alloc(bytes);
    if (!c->k || !c->v) {
        tern_err(err, TERN_ENOMEM, "kv cache: out of memory for %lld positions (%.1f MiB)", (long long)chk.n_ctx,
                 2.0 * (double)bytes / 1048576.0);
        kv_cache_free(c);
        return NULL;
    }
    return c;
}

void kv_cache_free(kv_cache_t *c) {
    if (!c) return;
    tern_free(c->k);
    tern_free(c->v);
    free(c);
}

const kv_layout_t *kv_cache_layout(const kv_cache_t *c) { return &c->lo; }
int64_t kv_cache_n_pos(const kv_cache_t *c) { return c->n_pos; }

static size_t row_off(const kv_cache_t *c, int64_t layer, int64_t pos) {
    return (size_t)layer * c->lo.layer_bytes + (size_t)pos * c->lo.pos_bytes;
}

void kv_cache_store(kv_cache_t *c, int64_t layer, int64_t pos, int64_t n, const float *k, const float *v) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer && pos >= 0 && n >= 0 && n <= c->lo.n_ctx - pos);
    const size_t off = row_off(c, layer, pos);
    const int64_t elems = n * c->lo.n_head_kv * c->lo.head_dim;
    if (c->lo.type == TYPE_F32) {
        memcpy(c->k + off, k, (size_t)elems * sizeof(float));
        memcpy(c->v + off, v, (size_t)elems * sizeof(float));
        return;
    }
    fp16_t *kc = (fp16_t *)(void *)(c->k + off), *vc = (fp16_t *)(void *)(c->v + off);
    for (int64_t j = 0; j < elems; j++) {
        kc[j] = f32_to_fp16(k[j]);
        vc[j] = f32_to_fp16(v[j]);
    }
}

int kv_cache_commit(kv_cache_t *c, int64_t n, tern_error_t *err) {
    if (n < 0 || n > c->lo.n_ctx - c->n_pos)
        return tern_err(err, TERN_EINVAL, "kv cache: cannot add %lld positions to %lld (room for %lld)", (long long)n,
                        (long long)c->n_pos, (long long)c->lo.n_ctx);
    c->n_pos += n;
    return 0;
}

const void *kv_cache_k(const kv_cache_t *c, int64_t layer) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer);
    return c->k + row_off(c, layer, 0);
}

const void *kv_cache_v(const kv_cache_t *c, int64_t layer) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer);
    return c->v + row_off(c, layer, 0);
}

void kv_cache_store_raw(kv_cache_t *c, int64_t layer, int64_t pos, int64_t n, const void *k, const void *v) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer && pos >= 0 && n >= 0 && n <= c->lo.n_ctx - pos);
    const size_t off = row_off(c, layer, pos), bytes = (size_t)n * c->lo.pos_bytes;
    if (k && bytes) memcpy(c->k + off, k, bytes);
    if (v && bytes) memcpy(c->v + off, v, bytes);
}

const void *kv_cache_k_rows(const kv_cache_t *c, int64_t layer, int64_t pos, int64_t n) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer && pos >= 0 && n >= 0 && n <= c->n_pos - pos);
    return c->k + row_off(c, layer, pos);
}

const void *kv_cache_v_rows(const kv_cache_t *c, int64_t layer, int64_t pos, int64_t n) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer && pos >= 0 && n >= 0 && n <= c->n_pos - pos);
    return c->v + row_off(c, layer, pos);
}

int kv_cache_truncate(kv_cache_t *c, int64_t n, tern_error_t *err) {
    if (n < 0 || n > c->n_pos)
        return tern_err(err, TERN_EINVAL, "kv cache: cannot truncate to %lld positions (the cache holds %lld)",
                        (long long)n, (long long)c->n_pos);
    c->n_pos = n;
    return 0;
}

int kv_cache_copy_prefix(kv_cache_t *dst, const kv_cache_t *src, int64_t n, tern_error_t *err) {
    if (!dst || !src) return tern_err(err, TERN_EINVAL, "kv cache: copy_prefix of a NULL cache");
    if (!kv_layout_compatible(&dst->lo, &src->lo)) {
        char a[96], b[96];
        return tern_err(err, TERN_EINVAL, "kv cache: cannot copy positions between layouts (%s) and (%s)",
                        layout_str(a, sizeof a, src->lo.type, (uint64_t)src->lo.n_layer, (uint64_t)src->lo.n_head_kv,
                                   (uint64_t)src->lo.head_dim),
                        layout_str(b, sizeof b, dst->lo.type, (uint64_t)dst->lo.n_layer, (uint64_t)dst->lo.n_head_kv,
                                   (uint64_t)dst->lo.head_dim));
    }
    if (n < 0 || n > src->n_pos || n > dst->lo.n_ctx)
        return tern_err(err, TERN_EINVAL,
                        "kv cache: cannot copy %lld positions (the source holds %lld, the destination has room for %lld)",
                        (long long)n, (long long)src->n_pos, (long long)dst->lo.n_ctx);
    if (dst == src) return kv_cache_truncate(dst, n, err);
    const size_t bytes = (size_t)n * src->lo.pos_bytes;
    for (int64_t l = 0; l < src->lo.n_layer; l++) {
        memcpy(dst->k + row_off(dst, l, 0), src->k + row_off(src, l, 0), bytes);
        memcpy(dst->v + row_off(dst, l, 0), src->v + row_off(src, l, 0), bytes);
    }
    dst->n_pos = n;
    return 0;
}

/* ---- serialized form ---------------------------------------------------- */

uint64_t kv_cache_serialized_size(const kv_layout_t *lo, int64_t n_pos) {
    uint64_t data;
    if (n_pos < 0 || tern_mul_overflow_u64((uint64_t)n_pos, (uint64_t)lo->pos_bytes, &data) ||
        tern_mul_overflow_u64(data, 2 * (uint64_t)lo->n_layer, &data) || data > UINT64_MAX - KV_HEADER_BYTES)
        return 0;
    return KV_HEADER_BYTES + data;
}

int kv_cache_write(const kv_cache_t *c, int64_t n_pos, kv_write_fn write, void *user, tern_error_t *err) {
    if (!c || !write) return tern_err(err, TERN_EINVAL, "kv cache: write with a NULL cache or writer");
    if (n_pos < 0 || n_pos > c->n_pos)
        return tern_err(err, TERN_EINVAL, "kv cache: cannot write %lld positions (the cache holds %lld)",
                        (long long)n_pos, (long long)c->n_pos);
    unsigned char h[KV_HEADER_BYTES];
    le_put_u32(h + 0, KV_MAGIC);
    le_put_u32(h + 4, KV_VERSION);
    le_put_u32(h + 8, (uint32_t)c->lo.type);
    le_put_u32(h + 12, (uint32_t)c->lo.n_layer);
    le_put_u32(h + 16, (uint32_t)c->lo.n_head_kv);
    le_put_u32(h + 20, (uint32_t)c->lo.head_dim);
    le_put_u64(h + 24, (uint64_t)n_pos);
    if (write(user, h, sizeof h)) return tern_err(err, TERN_EIO, "kv cache: writing the header failed");
    const size_t bytes = (size_t)n_pos * c->lo.pos_bytes;
    for (int64_t l = 0; l < c->lo.n_layer && bytes; l++) {
        if (write(user, c->k + row_off(c, l, 0), bytes))
            return tern_err(err, TERN_EIO, "kv cache: writing K of layer %lld failed", (long long)l);
        if (write(user, c->v + row_off(c, l, 0), bytes))
            return tern_err(err, TERN_EIO, "kv cache: writing V of layer %lld failed", (long long)l);
    }
    return 0;
}

int kv_cache_read(kv_cache_t *c, kv_read_fn read, void *user, tern_error_t *err) {
    if (!c || !read) return tern_err(err, TERN_EINVAL, "kv cache: read with a NULL cache or reader");
    unsigned char h[KV_HEADER_BYTES];
    if (read(user, h, sizeof h)) return tern_err(err, TERN_EFORMAT, "kv cache: input too short for the header");
    if (le_get_u32(h + 0) != KV_MAGIC) return tern_err(err, TERN_EFORMAT, "kv cache: input is not a KV cache (bad magic)");
    if (le_get_u32(h + 4) != KV_VERSION)
        return tern_err(err, TERN_EFORMAT, "kv cache: version %u is not supported (this build reads %u)",
                        le_get_u32(h + 4), KV_VERSION);
    const uint32_t type = le_get_u32(h + 8), n_layer = le_get_u32(h + 12), n_head_kv = le_get_u32(h + 16),
                   head_dim = le_get_u32(h + 20);
    const uint64_t n_pos = le_get_u64(h + 24);
    if ((int64_t)type != c->lo.type || (int64_t)n_layer != c->lo.n_layer || (int64_t)n_head_kv != c->lo.n_head_kv ||
        (int64_t)head_dim != c->lo.head_dim) {
        char a[96], b[96];
        return tern_err(err, TERN_EFORMAT, "kv cache: the input's layout (%s) does not match this cache's (%s)",
                        layout_str(a, sizeof a, type < 256 ? (int)type : -1, n_layer, n_head_kv, head_dim),
                        layout_str(b, sizeof b, c->lo.type, (uint64_t)c->lo.n_layer, (uint64_t)c->lo.n_head_kv,
                                   (uint64_t)c->lo.head_dim));
    }
    if (n_pos > (uint64_t)c->lo.n_ctx)
        return tern_err(err, TERN_EFORMAT, "kv cache: the input holds %llu positions, this cache has room for %lld",
                        (unsigned long long)n_pos, (long long)c->lo.n_ctx);
    /* The layout matches and n_pos fits: from here the data goes in place. */
    c->n_pos = 0;
    const size_t bytes = (size_t)n_pos * c->lo.pos_bytes;
    for (int64_t l = 0; l < c->lo.n_layer && bytes; l++) {
        if (read(user, c->k + row_off(c, l, 0), bytes))
            return tern_err(err, TERN_EFORMAT, "kv cache: input ends inside K of layer %lld", (long long)l);
        if (read(user, c->v + row_off(c, l, 0), bytes))
            return tern_err(err, TERN_EFORMAT, "kv cache: input ends inside V of layer %lld", (long long)l);
    }
    c->n_pos = (int64_t)n_pos;
    return 0;
}
