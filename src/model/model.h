/*
 * model.h - the model layer: Llama-family architectures (llama, qwen2,
 * qwen3) bound from GGUF tensors to kernel formats, the KV cache, and the
 * forward pass over a block of positions.
 *
 * A model_t is read-only after loading and may be shared by any number of
 * contexts (one per thread of use). A model_ctx_t owns its KV cache
 * (kv_cache.h), its scratch and its worker pool; it is driven by one thread
 * at a time.
 *
 * Files: load.c (hyperparameters, tensor binding), kv_cache.c (the cache
 * module), session.c (session files, session.h), context.c (contexts:
 * memory, KV state, prefix copy, save and restore), forward.c (model_eval). The forward pass reads like
 * docs/ARCHITECTURE.md's "path of one token"; a block of n positions goes
 * through GEMM, one position through matvec, and because the kernels are
 * batch-invariant both give the same bits for a position, at any thread
 * count.
 */
#ifndef TERN_MODEL_H
#define TERN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "kernels/kernels.h"
#include "model/kv_cache.h"
#include "tern_pool.h"

/* Most positions a context may have (and a file's context_length may say). */
#define MODEL_MAX_CTX (1 << 24)

typedef enum {
    ARCH_LLAMA = 0, /* also Mixtral: llama with expert_count > 0 */
    ARCH_QWEN2 = 1,
    ARCH_QWEN3 = 2,
    ARCH_QWEN2MOE = 3,
    ARCH_QWEN3MOE = 4,
    ARCH_OLMOE = 5
} model_arch_t;

typedef struct {
    model_arch_t arch;
    char arch_name[32];
    int64_t n_vocab;
    int64_t n_embd;
    int64_t n_layer;
    int64_t n_ff;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;    /* attention.key_length, default n_embd / n_head */
    int64_t n_rot;       /* rope.dimension_count, default head_dim */
    int64_t n_ctx_train; /* context_length */
    float rms_eps;
    float rope_freq_base;
    float rope_freq_scale; /* linear scaling: 1 / rope.scaling.factor, 1 = none */
    bool rope_neox;        /* llama: pairs (2i, 2i+1); qwen2/qwen3: (i, i + n_rot/2) */
    bool has_rope_factors; /* llama3 scaling (rope_freqs tensor or keys) */
    bool tied_output;      /* output matrix is token_embd */
    bool qk_norm_full;     /* olmoe: the Q/K RMSNorm spans the whole projection, not each head */
    /* Mixture of Experts (n_expert 0: a dense feed-forward in every layer) */
    int64_t n_expert;      /* expert_count */
    int64_t n_expert_used; /* expert_used_count: experts per token (top-k) */
    int64_t n_ff_exp;      /* an expert's width */
    int64_t n_ff_shexp;    /* the shared expert's width (qwen2moe), 0: none */
    bool moe_norm_w;       /* the top-k weights are divided by their sum (qwen3moe, Mixtral) */
} model_hparams_t;

/* One routed expert: a SwiGLU feed-forward of width FE. Slices of the
 * 3-D ffn_{gate,up,down}_exps tensors (expert e at e * rows * row_bytes), or
 * Mixtral's older per-expert 2-D tensors ffn_{gate,up,down}.E. */
typedef struct {
    kern_mat_t gate, up; /* (FE, D) */
    kern_mat_t down;     /* (D, FE) */
} model_expert_t;

/* Weights. A matrix (rows, cols) maps a row vector x of cols floats to
 * y = x W^T of rows floats; in GGUF's order its shape is [cols, rows].
 * D = n_embd, HD = head_dim, QD = n_head * HD, KVD = n_head_kv * HD, F = n_ff,
 * V = n_vocab. */
typedef struct {
    const float *attn_norm;       /* (D) */
    kern_mat_t wq;                /* (QD, D) */
    kern_mat_t wk, wv;            /* (KVD, D) */
    const float *bq, *bk, *bv;    /* (QD), (KVD), (KVD): qwen2 biases, else NULL */
    const float *q_norm, *k_norm; /* (HD): qwen3 per-head RMSNorm weights, else NULL */
    kern_mat_t wo;                /* (D, QD) */
    const float *ffn_norm;        /* (D) */
    kern_mat_t w_gate, w_up;      /* (F, D) */
    kern_mat_t w_down;            /* (D, F) */
    /* Mixture of Experts (experts NULL: the dense w_gate/w_up/w_down above).
     * E = n_expert, FE = n_ff_exp, FS = n_ff_shexp. */
    kern_mat_t router;            /* (E, D) ffn_gate_inp */
    model_expert_t *experts;      /* (E) */
    kern_mat_t sh_gate, sh_up;    /* (FS, D) qwen2moe's shared expert, data NULL: none */
    kern_mat_t sh_down;           /* (D, FS) */
    const float *sh_gate_inp;     /* (D) its gate: the output is scaled by sigmoid(x . sh_gate_inp) */
} model_layer_t;

typedef struct model {
    gguf_file_t *file; /* owned: the weights point into its mapping */
    model_hparams_t hp;
    kern_mat_t tok_embd;       /* (V, D): rows looked up and dequantized */
    const float *out_norm;     /* (D) */
    kern_mat_t output;         /* (V, D): == tok_embd when tied */
    const float *rope_factors; /* (n_rot / 2) frequency divisors, or NULL */
    model_layer_t *layers;     /* (n_layer) */
    model_expert_t *expert_store; /* (n_layer * n_expert) the layers' experts, or NULL */
    uint64_t expert_bytes;        /* bytes of all routed experts (0: dense model) */
    struct expert_cache *ec;      /* owned: the routed experts' cache (expert_cache.h), or NULL: read
                                   * through the mapping */
    bool moe_prefetch;            /* with a cache: hint the next layer's likely experts */
    float *f32_store;          /* owned copies of norm weights, biases, rope factors */
    uint64_t weight_bytes_per_token; /* bytes of weights one decode step reads */
    uint64_t n_params;
    int main_type; /* the weight type holding the most bytes among the matrices */
} model_t;

/* Load from a GGUF path; the model owns the file. NULL on error with a
 * message naming the architecture, key or tensor at fault. */
model_t *model_load(const char *path, tern_error_t *err);
/* Same over an opened file; on success the model takes ownership of f (also
 * on failure: f is closed). */
model_t *model_load_gguf(gguf_file_t *f, tern_error_t *err);
void model_free(model_t *m);

/* Mixture of Experts: read the routed experts through a cache
 * (expert_cache.h: ec_params_t says its size, I/O threads, pinning and
 * eviction) instead of the file's mapping; path is the file m was loaded
 * from; prefetch: hint the next layer's likely experts. Call before any
 * context runs. TERN_EINVAL for a dense model. */
struct ec_params;
int model_expert_cache(model_t *m, const char *path, const struct ec_params *p, bool prefetch, tern_error_t *err);
/* Bytes of memory available to this process now (MemAvailable; 0 if unknown). */
uint64_t model_mem_available(void);

/* ---- contexts ----------------------------------------------------------- */

typedef struct {
    int n_threads;     /* <= 0: tern_threads_default */
    int64_t n_ctx;     /* <= 0: the model's context_length, capped by memory */
    int64_t n_batch;   /* positions per forward block in prefill; <= 0: 512 */
    bool kv_f32;       /* F32 KV cache instead of F16 */
    int n_seq;         /* sequences the KV memory serves (ids 0 .. n_seq-1); <= 0: 1 */
    int64_t kv_block;  /* positions per KV block; <= 0: KV_BLOCK_POS_DEFAULT */
    bool profile;      /* accumulate per-op times (model_prof_t) */
    tern_pool_t *pool; /* borrowed pool (then n_threads is ignored), or NULL */
} model_ctx_params_t;

/* Per-op wall-clock times in ns, accumulated while params.profile is set. */
typedef struct {
    uint64_t qkv, attn, wo, ffn_up, ffn_down, output, small;
    uint64_t n_tokens;
} model_prof_t;

typedef struct model_ctx model_ctx_t;

model_ctx_params_t model_ctx_default_params(void);
/* note (may be NULL, note_len bytes) receives a line when n_ctx was capped. */
model_ctx_t *model_ctx_new(const model_t *m, const model_ctx_params_t *p, char *note, size_t note_len,
                           tern_error_t *err);
void model_ctx_free(model_ctx_t *c);

int64_t model_ctx_n_ctx(const model_ctx_t *c);
int64_t model_ctx_pos(const model_ctx_t *c); /* positions sequence 0 holds in the KV memory */
int64_t model_ctx_n_batch(const model_ctx_t *c);
int model_ctx_threads(const model_ctx_t *c);
tern_pool_t *model_ctx_pool(model_ctx_t *c);
/* Forget positions >= pos of sequence 0 (pos <= current). */
int model_ctx_truncate(model_ctx_t *c, int64_t pos, tern_error_t *err);
const model_prof_t *model_ctx_prof(const model_ctx_t *c);
void model_ctx_prof_reset(model_ctx_t *c);
/* Replace the pool by one of n_threads (only for an owned pool). */
int model_ctx_set_threads(model_ctx_t *c, int n_threads, tern_error_t *err);

/* Run the forward pass (forward.c) over n tokens of sequence 0 at positions
 * pos..pos+n-1 (pos = its current position), appending them to the KV cache. Blocks of
 * n_batch positions go through GEMM. logits_all (may be NULL): n x n_vocab
 * floats, the logits of every position. The logits of the last position are
 * always available afterwards from model_ctx_logits. Errors: TERN_EINVAL
 * (bad token id), TERN_ECTXFULL (context full; nothing is appended for
 * either), or a kernel failure. */
int model_eval(model_ctx_t *c, const int32_t *ids, int64_t n, float *logits_all, tern_error_t *err);
const float *model_ctx_logits(const model_ctx_t *c); /* n_vocab floats */
/* Replace them by a copy of n_vocab floats: for a caller that evaluated
 * more positions than it keeps (speculative decoding drops the rejected
 * drafts), so that they are again those of the last position kept. */
void model_ctx_set_logits(model_ctx_t *c, const float *logits);

/* A batch entry: token of sequence seq at position pos (MODEL_POS_APPEND:
 * the next one of its sequence, counting the batch's earlier entries of
 * it), and whether its logits are wanted. */
#define MODEL_POS_APPEND (-1)
typedef struct {
    int32_t seq;
    int32_t token;
    int64_t pos;
    bool logits;
} model_tok_t;
/* One forward pass over n entries of any sequences (in any order; each
 * sequence's positions must continue where its memory ends, without gaps or
 * repeats), in blocks of n_batch tokens through GEMM. A token's logits
 * depend only on its sequence's tokens up to it: not on the other entries,
 * their number or order, nor the thread count. Errors leave every sequence
 * as it was: TERN_EINVAL (a bad entry), TERN_ECTXFULL (a sequence would pass
 * n_ctx), TERN_EKVFULL (not enough free KV blocks), or a kernel failure. */
int model_decode(model_ctx_t *c, const model_tok_t *toks, int64_t n, tern_error_t *err);
/* The logits (n_vocab) of entry i of the last model_decode (or model_eval
 * without logits_all), NULL when it did not ask for them; valid until the
 * next call. */
const float *model_ctx_out(const model_ctx_t *c, int64_t i);

const char *model_arch_name(model_arch_t a);

/* ---- KV state ------------------------------------------------------------
 * A context's state between calls is its KV memory: the positions of each
 * sequence (kv_cache.h for the operations on one). The functions below work
 * on sequence 0, the one model_eval appends to.
 * The logits (model_ctx_logits) are not part of it: after a prefix copy or a
 * restore, evaluate at least one token before reading them. */

/* The context's cache (its layout: kv_cache_layout). */
kv_cache_t *model_ctx_kv(model_ctx_t *c);
const kv_cache_t *model_ctx_kv_const(const model_ctx_t *c);
/* dst takes src's first n positions (prompt-prefix sharing): both contexts
 * of the same model with compatible caches (same KV type), n <= src's
 * position and <= dst's n_ctx. dst's own positions are dropped; on error dst
 * is unchanged. */
int model_ctx_copy_prefix(model_ctx_t *dst, const model_ctx_t *src, int64_t n, tern_error_t *err);
/* Save the KV cache (all model_ctx_pos positions) through write, in
 * kv_cache.h's serialized form; restore it through read (the layout and
 * position count are checked before anything is read into the cache; a
 * short input leaves the context empty). */
int model_ctx_kv_save(const model_ctx_t *c, kv_write_fn write, void *user, tern_error_t *err);
int model_ctx_kv_load(model_ctx_t *c, kv_read_fn read, void *user, tern_error_t *err);

#endif
