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
    kv_cache_t *kv; /* (n_layer, n_ctx, n_head_kv, head_dim) K and V; holds model_ctx_pos positions */
    /* Activations of a block of up to n_batch positions. */
    float *x;      /* (n_batch, D) the residual stream */
    float *xb;     /* (n_batch, D) normed input of a sublayer */
    float *xb2;    /* (n_batch, D) sublayer output before the residual add */
    float *q;      /* (n_batch, QD) */
    float *k, *v;  /* (n_batch, KVD) */
    float *att;    /* (n_batch, QD) attention output */
    float *hb;     /* (n_batch, F) gate, then silu(gate) * up */
    float *hb2;    /* (n_batch, F) up */
    float *logits; /* (n_vocab) of the last position evaluated */
    model_prof_t prof;
    uint64_t prof_mark; /* while profiling: when the last timed step ended (ns) */
};

#endif
