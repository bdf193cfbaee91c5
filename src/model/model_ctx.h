/*
 * model_ctx.h - the inside of a model context, shared by context.c (memory,
 * KV state) and forward.c (the forward pass). Private to the model layer.
 */
#ifndef TERN_MODEL_CTX_H
#define TERN_MODEL_CTX_H

#include "model/kv_cache.h"
#include "model/model.h"

/* Shapes: n_batch positions per block, row-major by position; D = n_embd,
 * QD = n_head * head_dim, KVD = n_head_kv * head_dim, F = n_ff. */
struct model_ctx {
    const model_t *m;
    model_ctx_params_t p;
    tern_pool_t *pool;
    bool own_pool;
    size_t scratch_bytes;
    int64_t n_ctx, n_batch;
    kv_cache_t *kv; /* the paged K and V of every sequence (kv_cache.h) */
    /* Activations of a block of up to n_batch positions. */
    float *x;      /* (n_batch, D) the residual stream */
    float *xb;     /* (n_batch, D) normed input of a sublayer */
    float *xb2;    /* (n_batch, D) sublayer output before the residual add */
    float *q;      /* (n_batch, QD) */
    float *k, *v;  /* (n_batch, KVD) */
    float *att;    /* (n_batch, QD) attention output */
    float *hb;     /* (n_batch, F) gate, then silu(gate) * up */
    float *hb2;    /* (n_batch, F) up */
    float *logits; /* (n_vocab) of the last position model_eval evaluated */
    int32_t *ids;           /* (n_batch) token ids of a block */
    kern_attn_query_t *aq;  /* (n_batch) each token's position and block table, for attention */
    /* model_decode's batch: its tokens sorted by (sequence, position), each
     * entry's output slot (-1: no logits), tokens per sequence, the logits. */
    model_tok_t *bt;
    int64_t bt_cap;
    int64_t *slot;
    int64_t slot_cap;
    int64_t *seq_n;
    int64_t seq_n_cap;
    float *out; /* (n_out, n_vocab) */
    int64_t out_cap, n_out, n_entries;
    model_prof_t prof;
    uint64_t prof_mark; /* while profiling: when the last timed step ended (ns) */
};

#endif
