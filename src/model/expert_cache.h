/*
 * expert_cache.h - routed experts of a Mixture-of-Experts model kept in a
 * cache of fixed-size slots and read from the model file by an I/O pool of
 * its own (expert_cache.c: the slot states, the claim protocol between the
 * I/O workers and the forward pass, eviction and pinning).
 *
 * The dense weights (attention, norms, embeddings, routers, shared experts)
 * stay in the file's mapping; the routed experts are never read through it
 * when a cache is in use, so a model larger than memory keeps its dense
 * part resident and streams only experts, with direct reads (O_DIRECT where
 * the file system allows it) that do not fill the page cache.
 *
 * The forward pass (forward.c) asks for the experts a block of tokens
 * chose: ec_get pins an expert's slot and returns at once, ready or still
 * loading; ec_ready / ec_wait tell when its bytes are in; ec_put unpins it.
 * An expert's matrices in a slot are the same bytes as in the file, so the
 * products, and the logits, are the same bits whatever the cache size,
 * eviction order, prefetch or pinning.
 */
#ifndef TERN_EXPERT_CACHE_H
#define TERN_EXPERT_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

typedef struct expert_cache expert_cache_t;

typedef struct ec_params {
    uint64_t bytes;     /* capacity (rounded down to whole slots; at least one slot) */
    int io_threads;     /* <= 0: EC_DEFAULT_IO_THREADS */
    bool no_direct;     /* plain reads even where O_DIRECT works (tests) */
    const char *pin_path; /* usage counts file (NULL: no pinning) */
    double pin_share;   /* share of the slots the hottest experts may hold pinned (0: none) */
    bool per_layer;     /* one LRU list and an equal quota of slots per layer (default: one global LRU) */
    uint32_t chunk_bytes; /* smallest read (0: 512 KiB; tests use small ones) */
} ec_params_t;

#define EC_DEFAULT_IO_THREADS 8

/* Counters since creation (or ec_stats_reset). */
typedef struct {
    uint64_t hits, misses;     /* demand requests found in the cache / loaded */
    uint64_t prefetched;       /* loads started by a hint */
    uint64_t prefetch_used;    /* of those, the ones a demand request later found */
    uint64_t pred_hits, pred_total; /* experts a layer chose that the previous layer's hint named; chosen */
    uint64_t bytes_read;
    uint64_t read_ns;          /* summed over the I/O workers */
    uint64_t wait_ns;          /* the forward's time in ec_wait */
    uint64_t evictions;
    int n_slots, n_pinned;
    uint64_t slot_bytes;
    bool direct;               /* O_DIRECT in use */
} ec_stats_t;

/* A cache for model m, reading path (the file m was loaded from). NULL on
 * error (TERN_EIO: cannot open; TERN_ENOMEM; TERN_EINVAL: no experts). */
expert_cache_t *ec_new(const model_t *m, const char *path, const ec_params_t *p, tern_error_t *err);
void ec_free(expert_cache_t *c);

/* The bytes of one slot (one expert of the widest layer, with alignment). */
uint64_t ec_slot_bytes(const model_t *m);

typedef enum { EC_READY, EC_PENDING, EC_NOSLOT } ec_status_t;

/* Pin expert e of layer l: EC_READY (in the cache), EC_PENDING (its load is
 * queued or running; ec_wait), or EC_NOSLOT (every slot is pinned or loading:
 * put some back first). *slot is set unless EC_NOSLOT. Thread-safe. */
ec_status_t ec_get(expert_cache_t *c, int64_t l, int64_t e, int *slot);
/* A pinned slot's state without blocking: true once its bytes are in. */
bool ec_ready(expert_cache_t *c, int slot);
/* Block until a pinned slot is loaded. 0, or TERN_EIO when its read failed
 * (then ec_put it; the next ec_get retries). */
int ec_wait(expert_cache_t *c, int slot, tern_error_t *err);
/* The matrices of a pinned, loaded slot. */
/* Block until a slot for an expert of layer l could be had (another user
 * of the cache put one back): after EC_NOSLOT with nothing pinned. */
void ec_wait_slot(expert_cache_t *c, int64_t l);
const model_expert_t *ec_expert(const expert_cache_t *c, int slot);
void ec_put(expert_cache_t *c, int slot);
/* Start loading expert e of layer l if it is not cached and a slot can be
 * had without evicting a pinned one; never blocks. Queued behind demand loads. */
void ec_hint(expert_cache_t *c, int64_t l, int64_t e);
/* Count uses of (l, e) for pinning (demand requests only). */
void ec_count(expert_cache_t *c, int64_t l, int64_t e, uint32_t uses);
/* Write the usage counts to the pin file (atomically: a temporary file
 * renamed over it). 0 or TERN_EIO. */
int ec_save_counts(expert_cache_t *c, tern_error_t *err);

/* Score a prefetch prediction: hits of total experts chosen were hinted. */
void ec_pred(expert_cache_t *c, uint64_t hits, uint64_t total);
/* Parse a usage counts file (format at the top of expert_cache.c) of a
 * model with n_layer x n_expert experts and a file of file_size bytes:
 * counts[n_layer * n_expert] on success (0); TERN_EFORMAT for anything
 * else (wrong length, magic, version, shape, model, checksum). */
int ec_parse_counts(const unsigned char *b, size_t len, int64_t n_layer, int64_t n_expert, uint64_t file_size,
                    uint32_t *counts);
void ec_stats(const expert_cache_t *c, ec_stats_t *st);
void ec_stats_reset(expert_cache_t *c);

#endif
