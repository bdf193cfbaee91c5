/*
 * kv_cache.c - the paged KV memory (see kv_cache.h): layout, the block pool
 * with reference counts, sequence tables, reserve / store / commit,
 * truncate, fork with copy on write, copies between memories, and the
 * serialized form of one sequence.
 */
#include "model/kv_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "format/quant.h"

typedef struct {
    int64_t n_pos;   /* committed positions */
    int64_t n_blk;   /* entries of blk in use (reserved ones included) */
    int32_t *blk;    /* block table, n_blocks entries of room; NULL until first used */
    int32_t *ids;    /* the token at each position (-1: unknown), ids_cap entries of room */
    int64_t ids_cap;
} kv_seq_t;

struct kv_cache {
    kv_layout_t lo;
    int n_seq;
    kv_seq_t *seq;     /* (n_seq) */
    int32_t *ref;      /* (n_blocks) sequences holding each block; 0 = free */
    int32_t *free_ids; /* stack of free blocks: free_ids[0 .. n_free-1], the top is the next one given */
    int64_t n_free;
    int32_t *cow;      /* (n_seq) kv_reserve_all's scratch: the shared blocks the batch will copy */
    unsigned char *k;  /* (n_layer, n_blocks, block_pos, n_head_kv, head_dim) */
    unsigned char *v;
};

#define KV_MAGIC 0x43564B54u /* "TKVC" as little-endian bytes */
#define KV_VERSION 1u

/* ---- layout ------------------------------------------------------------- */

int kv_layout_init(kv_layout_t *lo, int type, int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim,
                   int64_t block_pos, tern_error_t *err) {
    memset(lo, 0, sizeof *lo);
    if (block_pos <= 0) block_pos = KV_BLOCK_POS_DEFAULT;
    if (type != TYPE_F16 && type != TYPE_F32)
        return tern_err(err, TERN_EINVAL, "kv cache: type %s (%d): only f16 and f32", quant_name(type), type);
    if (n_layer < 1 || n_ctx < 1 || n_head_kv < 1 || head_dim < 1 || n_layer > UINT32_MAX ||
        n_head_kv > UINT32_MAX || head_dim > UINT32_MAX || block_pos > (1 << 20) || n_ctx > INT64_MAX / 2)
        return tern_err(err, TERN_EINVAL, "kv cache: bad layout: %lld layers, %lld positions, %lld heads x %lld",
                        (long long)n_layer, (long long)n_ctx, (long long)n_head_kv, (long long)head_dim);
    const int64_t n_blocks = (n_ctx + block_pos - 1) / block_pos;
    if (n_blocks > INT32_MAX)
        return tern_err(err, TERN_EINVAL, "kv cache: %lld positions is too many blocks", (long long)n_ctx);
    const uint64_t elt = type == TYPE_F32 ? sizeof(float) : sizeof(fp16_t);
    uint64_t pos_bytes, block_bytes, layer_bytes, all;
    if (tern_mul_overflow_u64((uint64_t)n_head_kv, (uint64_t)head_dim, &pos_bytes) ||
        tern_mul_overflow_u64(pos_bytes, elt, &pos_bytes) ||
        tern_mul_overflow_u64(pos_bytes, (uint64_t)block_pos, &block_bytes) ||
        tern_mul_overflow_u64(block_bytes, (uint64_t)n_blocks, &layer_bytes) ||
        tern_mul_overflow_u64(layer_bytes, (uint64_t)n_layer, &all) || all > SIZE_MAX / 2)
        return tern_err(err, TERN_EINVAL, "kv cache: a cache of %lld positions overflows", (long long)n_ctx);
    lo->type = type;
    lo->n_layer = n_layer;
    lo->n_ctx = n_ctx;
    lo->n_head_kv = n_head_kv;
    lo->head_dim = head_dim;
    lo->block_pos = block_pos;
    lo->n_blocks = n_blocks;
    lo->elt_bytes = (size_t)elt;
    lo->head_bytes = (size_t)head_dim * (size_t)elt;
    lo->pos_bytes = (size_t)pos_bytes;
    lo->block_bytes = (size_t)block_bytes;
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

/* ---- the memory --------------------------------------------------------- */

kv_cache_t *kv_cache_new(const kv_layout_t *lo, int n_seq, tern_error_t *err) {
    kv_layout_t chk;
    if (!lo) {
        tern_err(err, TERN_EINVAL, "kv cache: NULL layout");
        return NULL;
    }
    if (n_seq < 1 || n_seq > KV_MAX_SEQ) {
        tern_err(err, TERN_EINVAL, "kv cache: %d sequences is not in 1..%d", n_seq, KV_MAX_SEQ);
        return NULL;
    }
    /* Rederive the strides: a hand-made layout must not size the memory. */
    if (kv_layout_init(&chk, lo->type, lo->n_layer, lo->n_ctx, lo->n_head_kv, lo->head_dim, lo->block_pos, err))
        return NULL;
    kv_cache_t *c = calloc(1, sizeof *c);
    if (!c) {
        tern_err(err, TERN_ENOMEM, "kv cache: out of memory");
        return NULL;
    }
    c->lo = chk;
    c->n_seq = n_seq;
    const size_t bytes = chk.layer_bytes * (size_t)chk.n_layer;
    c->seq = calloc((size_t)n_seq, sizeof *c->seq);
    c->ref = calloc((size_t)chk.n_blocks, sizeof *c->ref);
    c->free_ids = malloc((size_t)chk.n_blocks * sizeof *c->free_ids);
    c->cow = malloc((size_t)n_seq * sizeof *c->cow);
    c->k = tern_alloc(bytes);
    c->v = tern_alloc(bytes);
    if (!c->seq || !c->ref || !c->free_ids || !c->cow || !c->k || !c->v) {
        tern_err(err, TERN_ENOMEM, "kv cache: out of memory for %lld positions (%.1f MiB)", (long long)chk.n_ctx,
                 2.0 * (double)bytes / 1048576.0);
        kv_cache_free(c);
        return NULL;
    }
    /* The stack hands out block 0 first, then 1, 2 ...: one sequence alone
     * gets its positions in order (pages are touched as they are used). */
    for (int64_t i = 0; i < chk.n_blocks; i++) c->free_ids[i] = (int32_t)(chk.n_blocks - 1 - i);
    c->n_free = chk.n_blocks;
    return c;
}

void kv_cache_free(kv_cache_t *c) {
    if (!c) return;
    if (c->seq)
        for (int i = 0; i < c->n_seq; i++) {
            free(c->seq[i].blk);
            free(c->seq[i].ids);
        }
    free(c->seq);
    free(c->ref);
    free(c->free_ids);
    free(c->cow);
    tern_free(c->k);
    tern_free(c->v);
    free(c);
}

const kv_layout_t *kv_cache_layout(const kv_cache_t *c) { return &c->lo; }
int kv_cache_n_seq(const kv_cache_t *c) { return c->n_seq; }

void kv_cache_stats(const kv_cache_t *c, kv_stats_t *st) {
    st->block_pos = c->lo.block_pos;
    st->n_blocks = c->lo.n_blocks;
    st->n_free = c->n_free;
    st->n_used = c->lo.n_blocks - c->n_free;
    st->n_shared = 0;
    for (int64_t b = 0; b < c->lo.n_blocks; b++) st->n_shared += c->ref[b] > 1;
}

static kv_seq_t *seq_of(const kv_cache_t *c, int seq) {
    TERN_CHECK(seq >= 0 && seq < c->n_seq);
    return &c->seq[seq];
}

int64_t kv_seq_n_pos(const kv_cache_t *c, int seq) { return seq_of(c, seq)->n_pos; }
int64_t kv_seq_n_blocks(const kv_cache_t *c, int seq) { return seq_of(c, seq)->n_blk; }
const int32_t *kv_seq_blocks(const kv_cache_t *c, int seq) { return seq_of(c, seq)->blk; }

/* The sequence's table, allocated on first use (room for every block), and
 * room for n ids. */
static int seq_table(const kv_cache_t *c, kv_seq_t *s, int64_t n, tern_error_t *err) {
    if (!s->blk && !(s->blk = malloc((size_t)c->lo.n_blocks * sizeof *s->blk)))
        return tern_err(err, TERN_ENOMEM, "kv cache: out of memory for a block table");
    if (n > s->ids_cap) {
        int64_t cap = s->ids_cap ? s->ids_cap : 256;
        while (cap < n) cap *= 2;
        if (cap > c->lo.n_ctx) cap = c->lo.n_ctx;
        int32_t *ids = realloc(s->ids, (size_t)cap * sizeof *ids);
        if (!ids) return tern_err(err, TERN_ENOMEM, "kv cache: out of memory for %lld token ids", (long long)cap);
        s->ids = ids;
        s->ids_cap = cap;
    }
    return 0;
}

const int32_t *kv_seq_ids(const kv_cache_t *c, int seq) { return seq_of(c, seq)->ids; }

void kv_seq_put_ids(kv_cache_t *c, int seq, int64_t pos, int64_t n, const int32_t *ids) {
    kv_seq_t *s = seq_of(c, seq);
    TERN_CHECK(pos >= s->n_pos && n >= 0 && n <= s->n_blk * c->lo.block_pos - pos && pos + n <= s->ids_cap);
    if (n) memcpy(s->ids + pos, ids, (size_t)n * sizeof *ids);
}

static int32_t blk_take(kv_cache_t *c) {
    TERN_CHECK(c->n_free > 0);
    const int32_t id = c->free_ids[--c->n_free];
    c->ref[id] = 1;
    return id;
}

static void blk_drop(kv_cache_t *c, int32_t id) {
    TERN_CHECK(c->ref[id] > 0);
    if (--c->ref[id] == 0) c->free_ids[c->n_free++] = id;
}

/* Head g's row r of block b of one layer's K (v = 0) or V (v = 1): head
 * g's rows of the block follow it contiguously. */
static unsigned char *blk_row(const kv_cache_t *c, int v, int64_t layer, int32_t b, int64_t g, int64_t r) {
    return (v ? c->v : c->k) + (size_t)layer * c->lo.layer_bytes + (size_t)b * c->lo.block_bytes +
           (size_t)(g * c->lo.block_pos + r) * c->lo.head_bytes;
}

/* Head g's row of position pos of a sequence; the head's rows up to the end
 * of the block follow it contiguously. */
static unsigned char *seq_row(const kv_cache_t *c, const kv_seq_t *s, int v, int64_t layer, int64_t g, int64_t pos) {
    return blk_row(c, v, layer, s->blk[pos / c->lo.block_pos], g, pos % c->lo.block_pos);
}

/* Positions pos .. pos+m-1 (inside one block) out to / in from m
 * position-major rows (pos_bytes each, the heads side by side). */
static void run_out(const kv_cache_t *c, const kv_seq_t *s, int v, int64_t layer, int64_t pos, int64_t m,
                    unsigned char *dst) {
    const size_t hb = c->lo.head_bytes;
    for (int64_t g = 0; g < c->lo.n_head_kv; g++) {
        const unsigned char *src = seq_row(c, s, v, layer, g, pos);
        for (int64_t i = 0; i < m; i++) memcpy(dst + (size_t)i * c->lo.pos_bytes + (size_t)g * hb, src + (size_t)i * hb, hb);
    }
}
static void run_in(kv_cache_t *c, const kv_seq_t *s, int v, int64_t layer, int64_t pos, int64_t m,
                   const unsigned char *src) {
    const size_t hb = c->lo.head_bytes;
    for (int64_t g = 0; g < c->lo.n_head_kv; g++) {
        unsigned char *dst = seq_row(c, s, v, layer, g, pos);
        for (int64_t i = 0; i < m; i++) memcpy(dst + (size_t)i * hb, src + (size_t)i * c->lo.pos_bytes + (size_t)g * hb, hb);
    }
}

/* Positions from pos to the end of its block, at most n. */
static int64_t run_len(const kv_layout_t *lo, int64_t pos, int64_t n) {
    const int64_t left = lo->block_pos - pos % lo->block_pos;
    return n < left ? n : left;
}

/* Blocks s could hold after dropping its own: the free ones plus those only
 * it holds. */
static int64_t seq_avail(const kv_cache_t *c, const kv_seq_t *s) {
    int64_t avail = c->n_free;
    for (int64_t i = 0; i < s->n_blk; i++) avail += c->ref[s->blk[i]] == 1;
    return avail;
}

static void seq_drop_from(kv_cache_t *c, kv_seq_t *s, int64_t keep_blocks) {
    while (s->n_blk > keep_blocks) blk_drop(c, s->blk[--s->n_blk]);
}

int kv_seq_reserve(kv_cache_t *c, int seq, int64_t n, tern_error_t *err) {
    kv_seq_t *s = seq_of(c, seq);
    const int64_t bp = c->lo.block_pos;
    if (n < 0) return tern_err(err, TERN_EINVAL, "kv cache: cannot reserve %lld positions", (long long)n);
    if (n > c->lo.n_ctx - s->n_pos)
        return tern_err(err, TERN_ECTXFULL, "context full: sequence %d holds %lld positions + %lld new > context size %lld",
                        seq, (long long)s->n_pos, (long long)n, (long long)c->lo.n_ctx);
    if (n == 0) return 0;
    const int64_t need = (s->n_pos + n + bp - 1) / bp;
    const int64_t fresh = need > s->n_blk ? need - s->n_blk : 0;
    /* The block the first new position goes into is shared: copy it first. */
    const bool cow = s->n_pos % bp != 0 && c->ref[s->blk[s->n_pos / bp]] > 1;
    if (fresh + cow > c->n_free)
        return tern_err(err, TERN_EKVFULL,
                        "KV memory full: sequence %d needs %lld more blocks of %lld positions, %lld of %lld are free "
                        "(free another sequence)",
                        seq, (long long)(fresh + cow), (long long)bp, (long long)c->n_free, (long long)c->lo.n_blocks);
    int rc = seq_table(c, s, s->n_pos + n, err);
    if (rc) return rc;
    if (cow) {
        const int64_t i = s->n_pos / bp;
        const int32_t old = s->blk[i], nb = blk_take(c);
        const size_t bytes = (size_t)(s->n_pos % bp) * c->lo.head_bytes;
        for (int64_t l = 0; l < c->lo.n_layer; l++)
            for (int v = 0; v < 2; v++)
                for (int64_t g = 0; g < c->lo.n_head_kv; g++)
                    memcpy(blk_row(c, v, l, nb, g, 0), blk_row(c, v, l, old, g, 0), bytes);
        blk_drop(c, old);
        s->blk[i] = nb;
    }
    while (s->n_blk < need) s->blk[s->n_blk++] = blk_take(c);
    return 0;
}

int kv_reserve_all(kv_cache_t *c, const int64_t *n_new, tern_error_t *err) {
    const int64_t bp = c->lo.block_pos;
    for (int q = 0; q < c->n_seq; q++) {
        const kv_seq_t *s = &c->seq[q];
        if (n_new[q] < 0)
            return tern_err(err, TERN_EINVAL, "kv cache: cannot reserve %lld positions", (long long)n_new[q]);
        if (n_new[q] > c->lo.n_ctx - s->n_pos)
            return tern_err(err, TERN_ECTXFULL,
                            "context full: sequence %d holds %lld positions + %lld new > context size %lld", q,
                            (long long)s->n_pos, (long long)n_new[q], (long long)c->lo.n_ctx);
    }
    /* The blocks they take: fresh ones, and a copy of each shared block one
     * of them writes into, except that the last of its holders to write
     * finds it its own (the earlier copies dropped it). Counted by dropping
     * the references as kv_seq_reserve will, then putting them back. */
    int64_t need = 0, n_cow = 0;
    for (int q = 0; q < c->n_seq; q++) {
        const kv_seq_t *s = &c->seq[q];
        if (n_new[q] == 0) continue;
        const int64_t blocks = (s->n_pos + n_new[q] + bp - 1) / bp;
        need += blocks > s->n_blk ? blocks - s->n_blk : 0;
        if (s->n_pos % bp != 0 && c->ref[s->blk[s->n_pos / bp]] > 1) {
            c->cow[n_cow] = s->blk[s->n_pos / bp];
            c->ref[c->cow[n_cow++]]--;
        }
    }
    for (int64_t i = 0; i < n_cow; i++) c->ref[c->cow[i]]++;
    need += n_cow;
    if (need > c->n_free)
        return tern_err(err, TERN_EKVFULL,
                        "KV memory full: the batch needs %lld more blocks of %lld positions, %lld of %lld are free "
                        "(free another sequence)",
                        (long long)need, (long long)bp, (long long)c->n_free, (long long)c->lo.n_blocks);
    /* Tables first (an allocation failure changes nothing), then the
     * reservations, which cannot fail now. */
    for (int q = 0; q < c->n_seq; q++) {
        if (n_new[q] == 0) continue;
        int rc = seq_table(c, &c->seq[q], c->seq[q].n_pos + n_new[q], err);
        if (rc) return rc;
    }
    for (int q = 0; q < c->n_seq; q++)
        if (n_new[q]) TERN_CHECK(kv_seq_reserve(c, q, n_new[q], NULL) == 0);
    return 0;
}

void kv_seq_store(kv_cache_t *c, int seq, int64_t layer, int64_t pos, int64_t n, const float *k, const float *v) {
    const kv_seq_t *s = seq_of(c, seq);
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer && pos >= s->n_pos && n >= 0 &&
               n <= s->n_blk * c->lo.block_pos - pos);
    const int64_t row = c->lo.n_head_kv * c->lo.head_dim;
    while (n > 0) {
        const int64_t m = run_len(&c->lo, pos, n), elems = m * row;
        TERN_CHECK(c->ref[s->blk[pos / c->lo.block_pos]] == 1); /* reserved: copied if it was shared */
        const int64_t hd = c->lo.head_dim;
        for (int64_t g = 0; g < c->lo.n_head_kv; g++) {
            unsigned char *kd = seq_row(c, s, 0, layer, g, pos), *vd = seq_row(c, s, 1, layer, g, pos);
            for (int64_t i = 0; i < m; i++) {
                const float *ks = k + i * row + g * hd, *vs = v + i * row + g * hd;
                if (c->lo.type == TYPE_F32) {
                    memcpy(kd + (size_t)i * c->lo.head_bytes, ks, (size_t)hd * sizeof(float));
                    memcpy(vd + (size_t)i * c->lo.head_bytes, vs, (size_t)hd * sizeof(float));
                } else {
                    fp16_t *kc = (fp16_t *)(void *)(kd + (size_t)i * c->lo.head_bytes);
                    fp16_t *vc = (fp16_t *)(void *)(vd + (size_t)i * c->lo.head_bytes);
                    for (int64_t j = 0; j < hd; j++) {
                        kc[j] = f32_to_fp16(ks[j]);
                        vc[j] = f32_to_fp16(vs[j]);
                    }
                }
            }
        }
        k += elems;
        v += elems;
        pos += m;
        n -= m;
    }
}

int kv_seq_commit(kv_cache_t *c, int seq, int64_t n, tern_error_t *err) {
    kv_seq_t *s = seq_of(c, seq);
    if (n < 0 || n > s->n_blk * c->lo.block_pos - s->n_pos)
        return tern_err(err, TERN_EINVAL, "kv cache: sequence %d cannot add %lld positions to %lld (%lld reserved)",
                        seq, (long long)n, (long long)s->n_pos, (long long)(s->n_blk * c->lo.block_pos));
    s->n_pos += n;
    return 0;
}

int kv_seq_truncate(kv_cache_t *c, int seq, int64_t n, tern_error_t *err) {
    kv_seq_t *s = seq_of(c, seq);
    if (n < 0 || n > s->n_pos)
        return tern_err(err, TERN_EINVAL, "kv cache: cannot truncate sequence %d to %lld positions (it holds %lld)",
                        seq, (long long)n, (long long)s->n_pos);
    seq_drop_from(c, s, (n + c->lo.block_pos - 1) / c->lo.block_pos);
    s->n_pos = n;
    return 0;
}

void kv_seq_remove(kv_cache_t *c, int seq) {
    kv_seq_t *s = seq_of(c, seq);
    seq_drop_from(c, s, 0);
    s->n_pos = 0;
}

int kv_seq_fork(kv_cache_t *c, int dst, int src, int64_t n, tern_error_t *err) {
    kv_seq_t *d = seq_of(c, dst);
    const kv_seq_t *s = seq_of(c, src);
    if (dst == src) return tern_err(err, TERN_EINVAL, "kv cache: cannot fork sequence %d into itself", src);
    if (n < 0 || n > s->n_pos)
        return tern_err(err, TERN_EINVAL, "kv cache: cannot fork %lld positions of sequence %d (it holds %lld)",
                        (long long)n, src, (long long)s->n_pos);
    int rc = seq_table(c, d, n, err);
    if (rc) return rc;
    if (n) memmove(d->ids, s->ids, (size_t)n * sizeof *d->ids);
    const int64_t nb = (n + c->lo.block_pos - 1) / c->lo.block_pos;
    for (int64_t i = 0; i < nb; i++) c->ref[s->blk[i]]++;
    seq_drop_from(c, d, 0);
    if (nb) memcpy(d->blk, s->blk, (size_t)nb * sizeof *d->blk);
    d->n_blk = nb;
    d->n_pos = n;
    return 0;
}

/* Copy positions [pos, pos+n) of one layer between two sequences, block
 * run by block run (the two memories may have different block sizes). */
static void copy_rows(kv_cache_t *cd, const kv_seq_t *d, const kv_cache_t *cs, const kv_seq_t *s, int64_t layer,
                      int64_t pos, int64_t n) {
    while (n > 0) {
        int64_t m = run_len(&cd->lo, pos, n);
        m = run_len(&cs->lo, pos, m);
        for (int v = 0; v < 2; v++)
            for (int64_t g = 0; g < cd->lo.n_head_kv; g++)
                memcpy(seq_row(cd, d, v, layer, g, pos), seq_row(cs, s, v, layer, g, pos), (size_t)m * cd->lo.head_bytes);
        pos += m;
        n -= m;
    }
}

int kv_seq_copy(kv_cache_t *cd, int dst, const kv_cache_t *cs, int src, int64_t n, tern_error_t *err) {
    if (!cd || !cs) return tern_err(err, TERN_EINVAL, "kv cache: copy of a NULL cache");
    if (cd == cs) return kv_seq_fork(cd, dst, src, n, err);
    if (!kv_layout_compatible(&cd->lo, &cs->lo)) {
        char a[96], b[96];
        return tern_err(err, TERN_EINVAL, "kv cache: cannot copy positions between layouts (%s) and (%s)",
                        layout_str(a, sizeof a, cs->lo.type, (uint64_t)cs->lo.n_layer, (uint64_t)cs->lo.n_head_kv,
                                   (uint64_t)cs->lo.head_dim),
                        layout_str(b, sizeof b, cd->lo.type, (uint64_t)cd->lo.n_layer, (uint64_t)cd->lo.n_head_kv,
                                   (uint64_t)cd->lo.head_dim));
    }
    const kv_seq_t *s = seq_of(cs, src);
    kv_seq_t *d = seq_of(cd, dst);
    if (n < 0 || n > s->n_pos || n > cd->lo.n_ctx)
        return tern_err(err, TERN_EINVAL,
                        "kv cache: cannot copy %lld positions (the source holds %lld, the destination has room for %lld)",
                        (long long)n, (long long)s->n_pos, (long long)cd->lo.n_ctx);
    /* Checked before dst is dropped, so that a full memory leaves it as it was. */
    const int64_t need = (n + cd->lo.block_pos - 1) / cd->lo.block_pos, avail = seq_avail(cd, d);
    if (need > avail)
        return tern_err(err, TERN_EKVFULL, "KV memory full: %lld positions need %lld blocks, %lld are free",
                        (long long)n, (long long)need, (long long)avail);
    kv_seq_remove(cd, dst);
    int rc = kv_seq_reserve(cd, dst, n, err);
    if (rc) return rc;
    for (int64_t l = 0; l < cd->lo.n_layer; l++) copy_rows(cd, d, cs, s, l, 0, n);
    if (n) memcpy(d->ids, s->ids, (size_t)n * sizeof *d->ids);
    d->n_pos = n;
    return 0;
}

const void *kv_cache_k(const kv_cache_t *c, int64_t layer) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer);
    return c->k + (size_t)layer * c->lo.layer_bytes;
}

const void *kv_cache_v(const kv_cache_t *c, int64_t layer) {
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer);
    return c->v + (size_t)layer * c->lo.layer_bytes;
}

void kv_seq_put_raw(kv_cache_t *c, int seq, int64_t layer, int64_t pos, int64_t n, const void *k, const void *v) {
    const kv_seq_t *s = seq_of(c, seq);
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer && pos >= s->n_pos && n >= 0 &&
               n <= s->n_blk * c->lo.block_pos - pos);
    const unsigned char *src[2] = {k, v};
    for (int h = 0; h < 2; h++) {
        if (!src[h]) continue;
        for (int64_t p = pos, left = n; left > 0;) {
            const int64_t m = run_len(&c->lo, p, left);
            TERN_CHECK(c->ref[s->blk[p / c->lo.block_pos]] == 1);
            run_in(c, s, h, layer, p, m, src[h]);
            src[h] += (size_t)m * c->lo.pos_bytes;
            p += m;
            left -= m;
        }
    }
}

void kv_seq_get_raw(const kv_cache_t *c, int seq, int64_t layer, int64_t pos, int64_t n, void *k, void *v) {
    const kv_seq_t *s = seq_of(c, seq);
    TERN_CHECK(layer >= 0 && layer < c->lo.n_layer && pos >= 0 && n >= 0 && n <= s->n_pos - pos);
    unsigned char *dst[2] = {k, v};
    for (int h = 0; h < 2; h++) {
        if (!dst[h]) continue;
        for (int64_t p = pos, left = n; left > 0;) {
            const int64_t m = run_len(&c->lo, p, left);
            run_out(c, s, h, layer, p, m, dst[h]);
            dst[h] += (size_t)m * c->lo.pos_bytes;
            p += m;
            left -= m;
        }
    }
}

/* ---- serialized form ---------------------------------------------------- */

uint64_t kv_cache_serialized_size(const kv_layout_t *lo, int64_t n_pos) {
    uint64_t data;
    if (n_pos < 0 || tern_mul_overflow_u64((uint64_t)n_pos, (uint64_t)lo->pos_bytes, &data) ||
        tern_mul_overflow_u64(data, 2 * (uint64_t)lo->n_layer, &data) || data > UINT64_MAX - KV_HEADER_BYTES)
        return 0;
    return KV_HEADER_BYTES + data;
}

int kv_seq_write(const kv_cache_t *c, int seq, int64_t n_pos, kv_write_fn write, void *user, tern_error_t *err) {
    if (!c || !write) return tern_err(err, TERN_EINVAL, "kv cache: write with a NULL cache or writer");
    const kv_seq_t *s = seq_of(c, seq);
    if (n_pos < 0 || n_pos > s->n_pos)
        return tern_err(err, TERN_EINVAL, "kv cache: cannot write %lld positions (the sequence holds %lld)",
                        (long long)n_pos, (long long)s->n_pos);
    unsigned char h[KV_HEADER_BYTES];
    le_put_u32(h + 0, KV_MAGIC);
    le_put_u32(h + 4, KV_VERSION);
    le_put_u32(h + 8, (uint32_t)c->lo.type);
    le_put_u32(h + 12, (uint32_t)c->lo.n_layer);
    le_put_u32(h + 16, (uint32_t)c->lo.n_head_kv);
    le_put_u32(h + 20, (uint32_t)c->lo.head_dim);
    le_put_u64(h + 24, (uint64_t)n_pos);
    if (write(user, h, sizeof h)) return tern_err(err, TERN_EIO, "kv cache: writing the header failed");
    unsigned char *buf = malloc(c->lo.block_bytes); /* one block run in position-major order */
    if (!buf) return tern_err(err, TERN_ENOMEM, "kv cache: out of memory");
    for (int64_t l = 0; l < c->lo.n_layer; l++)
        for (int v = 0; v < 2; v++)
            for (int64_t p = 0; p < n_pos;) {
                const int64_t m = run_len(&c->lo, p, n_pos - p);
                run_out(c, s, v, l, p, m, buf);
                if (write(user, buf, (size_t)m * c->lo.pos_bytes)) {
                    free(buf);
                    return tern_err(err, TERN_EIO, "kv cache: writing %s of layer %lld failed", v ? "V" : "K",
                                    (long long)l);
                }
                p += m;
            }
    free(buf);
    return 0;
}

int kv_seq_read(kv_cache_t *c, int seq, kv_read_fn read, void *user, tern_error_t *err) {
    if (!c || !read) return tern_err(err, TERN_EINVAL, "kv cache: read with a NULL cache or reader");
    kv_seq_t *s = seq_of(c, seq);
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
    /* The blocks it needs: the free ones plus those only this sequence holds. */
    const int64_t avail = seq_avail(c, s);
    const int64_t need = ((int64_t)n_pos + c->lo.block_pos - 1) / c->lo.block_pos;
    if (need > avail)
        return tern_err(err, TERN_EKVFULL, "KV memory full: %llu positions need %lld blocks, %lld are free",
                        (unsigned long long)n_pos, (long long)need, (long long)avail);
    int rc = seq_table(c, s, (int64_t)n_pos, err);
    if (rc) return rc;
    unsigned char *buf = malloc(c->lo.block_bytes); /* one block run in position-major order */
    if (!buf) return tern_err(err, TERN_ENOMEM, "kv cache: out of memory");
    /* The layout matches and the blocks are there: from here the data goes in place. */
    kv_seq_remove(c, seq);
    if ((rc = kv_seq_reserve(c, seq, (int64_t)n_pos, err))) {
        free(buf);
        return rc;
    }
    for (int64_t l = 0; l < c->lo.n_layer; l++)
        for (int v = 0; v < 2; v++)
            for (int64_t p = 0; p < (int64_t)n_pos;) {
                const int64_t m = run_len(&c->lo, p, (int64_t)n_pos - p);
                if (read(user, buf, (size_t)m * c->lo.pos_bytes)) {
                    free(buf);
                    kv_seq_remove(c, seq);
                    return tern_err(err, TERN_EFORMAT, "kv cache: input ends inside %s of layer %lld", v ? "V" : "K",
                                    (long long)l);
                }
                run_in(c, s, v, l, p, m, buf);
                p += m;
            }
    free(buf);
    for (uint64_t i = 0; i < n_pos; i++) s->ids[i] = -1;
    s->n_pos = (int64_t)n_pos;
    return 0;
}
