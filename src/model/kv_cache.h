/*
 * kv_cache.h - the KV memory of a context: the keys and values of every
 * layer for the positions of all its sequences, in blocks of positions
 * shared from one pool (paged), as the attention kernel reads them.
 *
 * Memory: one region for K and one for V, each (n_layer, n_blocks,
 * n_head_kv, block_pos, head_dim) elements of F16 or F32, row-major. Layer
 * l's K (or V) is layer_bytes long and starts at l * layer_bytes; block b
 * of it at b * block_bytes; inside a block, head g's rows at g * block_pos
 * * head_bytes, row r of it at r * head_bytes. A block is head-major so that
 * attention, which reads one KV head over many positions, reads
 * block_pos * head_bytes contiguous bytes per block (with the heads of a
 * position side by side it read head_bytes of every pos_bytes: a 1.5-2x
 * slower attention at 512-2048 positions, dev/ab/attn_ab.c). The
 * serialized forms below and kv_seq_get_raw / kv_seq_put_raw keep the
 * position-major order (a position's heads side by side). A
 * sequence owns a block table: its position p lives in block
 * table[p / block_pos], row p % block_pos, of every layer (one table for
 * all layers). The memory is n_blocks = ceil(n_ctx / block_pos) blocks and
 * there is no split among sequences: any sequence may grow until the
 * blocks run out, or until it holds n_ctx positions (the context size a
 * user asked for stays the limit of one sequence).
 *
 * Sequences are ids 0 .. n_seq-1; each also records the token id at each of
 * its positions (sessions match prompts against them). Blocks are reference-counted: a fork
 * (kv_seq_fork) makes the new sequence's table point at the source's blocks
 * (a shared prompt prefix is stored once); a sequence about to write into a
 * block it shares copies that block first (copy on write, in kv_seq_reserve),
 * so a write never shows through another sequence. A block returns to the
 * free list when its last sequence drops it (truncate, remove).
 *
 * Growing a sequence is three steps, so that a failed forward pass changes
 * nothing: kv_seq_reserve takes the blocks the next n positions need (all or
 * none: TERN_ECTXFULL when the sequence would pass n_ctx on its own,
 * TERN_EKVFULL when the free blocks do not suffice and freeing other
 * sequences would help), the forward pass stores K and V rows layer by
 * layer (kv_seq_store, which does not count them), and kv_seq_commit counts
 * them once every layer has them. Blocks reserved but never committed are
 * given back by kv_seq_truncate(seq, n_pos) (the forward pass does it on
 * failure).
 *
 * Serialized form of one sequence (kv_seq_write / kv_seq_read; session
 * files, session.c, store position ranges through kv_seq_get_raw /
 * kv_seq_put_raw instead): a 32-byte header of little-endian fields
 *     u32 magic "TKVC", u32 version 1, u32 type (TYPE_F16 / TYPE_F32),
 *     u32 n_layer, u32 n_head_kv, u32 head_dim, u64 n_pos
 * then, layer by layer, K of positions 0..n_pos-1 (n_pos * pos_bytes bytes)
 * then V of the same positions, in the machine's byte order (little-endian
 * on every target tern builds for). Neither the block size nor n_ctx is part
 * of it: a sequence restores into any memory with the same position shape
 * (type, n_layer, n_head_kv, head_dim) and room for n_pos positions.
 */
#ifndef TERN_KV_CACHE_H
#define TERN_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern_error.h"

/* Positions per block by default: fine enough that short sequences waste
 * little, coarse enough that a block table stays small. */
#define KV_BLOCK_POS_DEFAULT 32
/* Most sequences one memory serves. */
#define KV_MAX_SEQ 4096

typedef struct {
    int type;           /* TYPE_F16 or TYPE_F32 (format/quant.h) */
    int64_t n_layer;    /* layers, each with its own K and V */
    int64_t n_ctx;      /* positions one sequence may hold; the memory has n_blocks * block_pos >= n_ctx */
    int64_t n_head_kv;  /* K/V heads per position */
    int64_t head_dim;   /* elements per head */
    int64_t block_pos;  /* positions per block */
    int64_t n_blocks;   /* blocks */
    size_t elt_bytes;   /* 2 (F16) or 4 (F32) */
    size_t head_bytes;  /* one head of one position: head_dim * elt_bytes */
    size_t pos_bytes;   /* one position of one layer's K (or V): n_head_kv * head_bytes */
    size_t block_bytes; /* one block of one layer's K (or V): block_pos * pos_bytes */
    size_t layer_bytes; /* one layer's K (or V): n_blocks * block_bytes */
} kv_layout_t;

/* Fill a layout from its dimensions and derive the strides: room for at
 * least n_ctx positions in blocks of block_pos (<= 0: the default): n_ctx
 * rounded up to whole blocks. Errors: a type other than F16/F32, a
 * dimension < 1, sizes that overflow. */
int kv_layout_init(kv_layout_t *lo, int type, int64_t n_layer, int64_t n_ctx, int64_t n_head_kv, int64_t head_dim,
                   int64_t block_pos, tern_error_t *err);
/* Same position shape (type, n_layer, n_head_kv, head_dim): positions of one
 * can be copied into the other. n_ctx and block_pos may differ. */
bool kv_layout_compatible(const kv_layout_t *a, const kv_layout_t *b);

typedef struct kv_cache kv_cache_t;

/* An empty memory (every sequence at 0 positions) of layout lo for
 * sequences 0 .. n_seq-1 (1 <= n_seq <= KV_MAX_SEQ); NULL on error (ENOMEM,
 * bad layout). */
kv_cache_t *kv_cache_new(const kv_layout_t *lo, int n_seq, tern_error_t *err);
void kv_cache_free(kv_cache_t *c);

const kv_layout_t *kv_cache_layout(const kv_cache_t *c);
int kv_cache_n_seq(const kv_cache_t *c);

/* Block accounting. used + free == n_blocks; shared counts the blocks held
 * by more than one sequence. */
typedef struct {
    int64_t block_pos, n_blocks, n_used, n_free, n_shared;
} kv_stats_t;
void kv_cache_stats(const kv_cache_t *c, kv_stats_t *st);

/* ---- one sequence (seq in 0 .. n_seq-1, else TERN_CHECK: a caller's bug) */

int64_t kv_seq_n_pos(const kv_cache_t *c, int seq);    /* positions held: 0 .. n_pos-1 */
int64_t kv_seq_n_blocks(const kv_cache_t *c, int seq); /* blocks in its table (shared ones included) */
/* The block table: entry i holds positions i * block_pos .. (i+1) * block_pos - 1. */
const int32_t *kv_seq_blocks(const kv_cache_t *c, int seq);

/* Make room for positions n_pos .. n_pos+n-1: allocate blocks and copy a
 * shared block that would be written into. All or nothing: TERN_ECTXFULL
 * (n_pos + n > n_ctx), TERN_EKVFULL (too few free blocks; nothing changed). */
int kv_seq_reserve(kv_cache_t *c, int seq, int64_t n, tern_error_t *err);
/* kv_seq_reserve of n_new[s] positions for every sequence s (n_seq
 * entries, 0 for those that get none), all or nothing: TERN_ECTXFULL (a
 * sequence would pass n_ctx), TERN_EKVFULL (the free blocks do not suffice
 * for all of them, copies on write included); nothing changed on error. */
int kv_reserve_all(kv_cache_t *c, const int64_t *n_new, tern_error_t *err);
/* The token ids of positions 0 .. n_pos-1 (what was evaluated there; -1
 * where unknown: after kv_seq_read). put_ids sets those of reserved
 * positions pos .. pos+n-1 (>= n_pos; TERN_CHECK). */
const int32_t *kv_seq_ids(const kv_cache_t *c, int seq);
void kv_seq_put_ids(kv_cache_t *c, int seq, int64_t pos, int64_t n, const int32_t *ids);
/* Store K and V of n positions pos .. pos+n-1 of one layer: k and v are n
 * rows of n_head_kv * head_dim floats (converted to F16 for an F16 cache).
 * The positions must be reserved and >= n_pos (TERN_CHECK); they count once
 * committed. */
void kv_seq_store(kv_cache_t *c, int seq, int64_t layer, int64_t pos, int64_t n, const float *k, const float *v);
/* Positions n_pos .. n_pos+n-1, stored in every layer, now count (they must
 * have been reserved: else TERN_EINVAL). */
int kv_seq_commit(kv_cache_t *c, int seq, int64_t n, tern_error_t *err);
/* Keep the first n positions (0 <= n <= n_pos) and give back the blocks
 * past them (reserved ones included). */
int kv_seq_truncate(kv_cache_t *c, int seq, int64_t n, tern_error_t *err);
/* Forget the sequence: kv_seq_truncate(c, seq, 0). */
void kv_seq_remove(kv_cache_t *c, int seq);
/* dst takes src's first n positions (its own are dropped) by sharing src's
 * blocks: no K or V is copied until one of them writes into a shared block.
 * dst != src, n <= src's n_pos. */
int kv_seq_fork(kv_cache_t *c, int dst, int src, int64_t n, tern_error_t *err);
/* dst (in memory cd) takes the first n positions of src (in memory cs) by
 * copying them (different memories: layouts compatible, n <= src's n_pos,
 * n <= dst's n_ctx; TERN_EKVFULL when the free blocks and those only dst
 * holds are too few). On error dst is left as it was (empty only after an
 * ENOMEM). cd == cs is kv_seq_fork. */
int kv_seq_copy(kv_cache_t *cd, int dst, const kv_cache_t *cs, int src, int64_t n, tern_error_t *err);

/* The base pointer of a layer's K (or V), the one kern_attention takes;
 * block b of it at b * block_bytes. */
const void *kv_cache_k(const kv_cache_t *c, int64_t layer);
const void *kv_cache_v(const kv_cache_t *c, int64_t layer);

/* Raw rows (the cache's element type, pos_bytes per position) of positions
 * pos .. pos+n-1 of one layer: put stores them into reserved positions
 * (k or v may be NULL to leave that half alone; they count once committed),
 * get copies committed ones out (pos + n <= n_pos). Both TERN_CHECK their
 * ranges. */
void kv_seq_put_raw(kv_cache_t *c, int seq, int64_t layer, int64_t pos, int64_t n, const void *k, const void *v);
void kv_seq_get_raw(const kv_cache_t *c, int seq, int64_t layer, int64_t pos, int64_t n, void *k, void *v);

/* ---- serialization ------------------------------------------------------ */

/* Write len bytes / read exactly len bytes; 0 on success, anything else is
 * a failure (a short read included). */
typedef int (*kv_write_fn)(void *user, const void *data, size_t len);
typedef int (*kv_read_fn)(void *user, void *data, size_t len);

#define KV_HEADER_BYTES 32

/* Bytes kv_seq_write emits for n_pos positions of layout lo (0 on overflow). */
uint64_t kv_cache_serialized_size(const kv_layout_t *lo, int64_t n_pos);
/* Header, then the K and V of positions 0 .. n_pos-1 of seq (n_pos <= its
 * n_pos). A failing write is TERN_EIO. */
int kv_seq_write(const kv_cache_t *c, int seq, int64_t n_pos, kv_write_fn write, void *user, tern_error_t *err);
/* Restore seq from what kv_seq_write wrote. The header is read and checked
 * first (magic, version, the layout against c's, n_pos against n_ctx and
 * the free blocks): an error there leaves seq as it was. Then the data is
 * read in place: a short read (TERN_EFORMAT) leaves seq empty. On success
 * seq holds the header's n_pos positions. */
int kv_seq_read(kv_cache_t *c, int seq, kv_read_fn read, void *user, tern_error_t *err);

#endif
