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
    /* Mixture of Experts (NULL for a dense model); K = n_expert_used,
     * E = n_expert, FE = n_ff_exp. Rows of the expert buffers are (token,
     * expert) pairs grouped by expert: mrow[i * K + r] is the row of token
     * i's r-th choice. */
    float *mlog;    /* (n_batch, E) router logits */
    int32_t *msel;  /* (n_batch, K) token i's chosen experts, best first */
    float *mwt;     /* (n_batch, K) their weights */
    int64_t *mrow;  /* (n_batch, K) */
    float *mx;      /* (n_batch * K, D) each pair's input row */
    float *mg, *mu; /* (n_batch * K, FE) gate, then silu(gate) * up; up */
    float *my;      /* (n_batch * K, D) each pair's expert output */
    float *msh;     /* (n_batch) qwen2moe: the shared expert's gate, sigmoid(x . sh_gate_inp) */
    float *mshy;    /* (n_batch, D) qwen2moe: the shared expert's output */
    int64_t *mcnt;  /* (3, E) per expert: pairs, first row, rows filled */
    float *mprob;   /* (E) routing scratch */
    int32_t *mact;  /* (E) the experts a block chose, increasing */
    const model_expert_t **mexp; /* (E) their matrices */
    int *mslot;     /* (E) their cache slots */
    uint8_t *mst;   /* (E) their state in moe_cached */
    int64_t mrow0;  /* STEP_MOE_SILU: the first pair row */
    float *mlog2;   /* (n_batch, E) the next layer's router logits (prefetch) */
    uint8_t *mpred; /* (E) experts predicted for layer mpred_layer (-1: none) */
    int64_t mpred_layer;
    bool mnext;     /* this layer's router dispatch also computed the next layer's logits (mlog2) */
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
