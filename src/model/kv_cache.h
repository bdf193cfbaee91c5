/*
 * kv_cache.h - the KV cache of one sequence: the keys and values of every
 * layer for positions 0 .. n_pos-1, as the attention kernel reads them.
 *
 * Memory: one block for K and one for V, each (n_layer, n_ctx, n_head_kv,
 * head_dim) elements of F16 or F32, row-major. A layer's K (or V) is
 * layer_bytes long and starts at layer * layer_bytes; position p of it at
 * p * pos_bytes, which is n_head_kv * head_dim elements: the layout
 * kern_attention expects (kernels.h).
 *
 * The cache counts the positions it holds (n_pos). The forward pass stores
 * the K and V rows of a block of new positions layer by layer
 * (kv_cache_store, which does not count them), then commits the block once
 * every layer has it (kv_cache_commit): a failed forward pass leaves n_pos
 * as it was.
 *
 * Serialized form (a whole cache at once; session files, session.c, store
 * position ranges through kv_cache_k_rows / kv_cache_store_raw instead):
 * a 32-byte header of little-endian fields
 *     u32 magic "TKVC", u32 version 1, u32 type (TYPE_F16 / TYPE_F32),
 *     u32 n_layer, u32 n_head_kv, u32 head_dim, u64 n_pos
 * then, layer by layer, K of positions 0..n_pos-1 (n_pos * pos_bytes bytes)
 * then V of the same positions, in the machine's byte order (little-endian
 * on every target tern builds for). n_ctx is not part of it: a cache
 * restores into any cache with the same position shape (type, n_layer,
 * n_head_kv, head_dim) and room for n_pos positions.
 */
#ifndef TERN_KV_CACHE_H
#define TERN_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern_error.h"

typedef struct {
    int type;          /* TYPE_F16 or TYPE_F32 (format/quant.h) */
    int64_t n_layer;   /* layers, each with its own K and V */
    int64_t n_ctx;     /* positions the cache has room for */
    int64_t n_head_kv; /* K/V heads per position */
    int64_t head_dim;  /* elements per head */
    size_t elt_bytes;  /* 2 (F16) or 4 (F32) */
    size_t pos_bytes;  /* one position of one layer's K (or V): n_head_kv * head_dim * elt_bytes */
    size_t layer_bytes; /* one layer's K (or V): n_ctx * pos_bytes */
} kv_layout_t;

/* Fill a layout from its dimensions and derive the strides. Errors: a type
 * other than F16/F32, a dimension < 1, sizes that overflow. */
int kv_layout_init(kv_layout_t *lo, int type, int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim,
                   tern_error_t *err);
/* Same position shape (type, n_layer, n_head_kv, head_dim): positions of one
 * can be copied into the other. n_ctx may differ. */
bool kv_layout_compatible(const kv_layout_t *a, const kv_layout_t *b);

typedef struct kv_cache kv_cache_t;

/* An empty cache (n_pos 0) of layout lo; NULL on error (ENOMEM, bad layout). */
kv_cache_t *kv_cache_new(const kv_layout_t *lo, tern_error_t *err);
void kv_cache_free(kv_cache_t *c);

const kv_layout_t *kv_cache_layout(const kv_cache_t *c);
int64_t kv_cache_n_pos(const kv_cache_t *c); /* positions held: 0 .. n_pos-1 */

/* Store K and V of n positions pos .. pos+n-1 of one layer: k and v are n
 * rows of n_head_kv * head_dim floats (converted to F16 for an F16 cache).
 * The positions count once committed. pos + n <= n_ctx (a caller's bug
 * otherwise: TERN_CHECK). */
void kv_cache_store(kv_cache_t *c, int64_t layer, int64_t pos, int64_t n, const float *k, const float *v);
/* Positions n_pos .. n_pos+n-1, stored in every layer, now count. Error when
 * they would pass n_ctx. */
int kv_cache_commit(kv_cache_t *c, int64_t n, tern_error_t *err);

/* A layer's K (or V) from position 0, the base pointer kern_attention takes;
 * position p of it at p * pos_bytes. */
const void *kv_cache_k(const kv_cache_t *c, int64_t layer);
const void *kv_cache_v(const kv_cache_t *c, int64_t layer);

/* Store n positions pos .. pos+n-1 of one layer from rows already in the
 * cache's element type (raw bytes, n * pos_bytes each, as kv_cache_k hands
 * them out; a session file restores through it). k or v may be NULL to
 * leave that half alone. Like kv_cache_store, the positions count once
 * committed. pos + n <= n_ctx (TERN_CHECK). */
void kv_cache_store_raw(kv_cache_t *c, int64_t layer, int64_t pos, int64_t n, const void *k, const void *v);
/* Rows of positions pos .. pos+n-1 of one layer, raw (n * pos_bytes bytes
 * from each pointer), for writing a position range [pos, pos+n) out; pos +
 * n <= n_pos (TERN_CHECK). */
const void *kv_cache_k_rows(const kv_cache_t *c, int64_t layer, int64_t pos, int64_t n);
const void *kv_cache_v_rows(const kv_cache_t *c, int64_t layer, int64_t pos, int64_t n);

/* Forget positions n_pos .. : keep the first n (0 <= n <= n_pos). */
int kv_cache_truncate(kv_cache_t *c, int64_t n, tern_error_t *err);
/* dst takes src's first n positions (its own are dropped): n <= src's n_pos
 * and <= dst's n_ctx, layouts compatible. On error dst is unchanged. */
int kv_cache_copy_prefix(kv_cache_t *dst, const kv_cache_t *src, int64_t n, tern_error_t *err);

/* ---- serialization ------------------------------------------------------ */

/* Write len bytes / read exactly len bytes; 0 on success, anything else is
 * a failure (a short read included). */
typedef int (*kv_write_fn)(void *user, const void *data, size_t len);
typedef int (*kv_read_fn)(void *user, void *data, size_t len);

#define KV_HEADER_BYTES 32

/* Bytes kv_cache_write emits for n_pos positions of layout lo (0 on overflow). */
uint64_t kv_cache_serialized_size(const kv_layout_t *lo, int64_t n_pos);
/* Header, then the K and V of positions 0 .. n_pos-1 (n_pos <= the cache's
 * n_pos). A failing write is TERN_EIO. */
int kv_cache_write(const kv_cache_t *c, int64_t n_pos, kv_write_fn write, void *user, tern_error_t *err);
/* Restore from what kv_cache_write wrote. The header is read and checked
 * first (magic, version, the layout against c's, n_pos against c's n_ctx):
 * an error there leaves c as it was. Then the data is read in place: a short
 * read (TERN_EFORMAT) leaves c empty. On success n_pos is the header's. */
int kv_cache_read(kv_cache_t *c, kv_read_fn read, void *user, tern_error_t *err);

#endif
