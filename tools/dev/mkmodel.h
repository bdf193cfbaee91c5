/*
 * mkmodel.h - synthetic model files (random weights in the exact tensor names,
 * shapes and metadata llama.cpp uses), the per-tensor type plan of llama.cpp's
 * quantizer (plain types and the Q4_K_M / Q5_K_M mixes), and re-quantization
 * of an existing GGUF model. Library code behind `tern mkmodel` and
 * `tern quantize`, so tests can call it directly.
 */
#ifndef TERN_MKMODEL_H
#define TERN_MKMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"
#include "tern.h"

/* A model shape. head_dim may differ from n_embd / n_head (qwen3). */
typedef struct {
    const char *name;
    const char *arch; /* "llama", "qwen2", "qwen3" */
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    float rope_base, rms_eps;
    bool qkv_bias; /* qwen2: attn_q/k/v.bias */
    bool qk_norm;  /* qwen3: attn_q_norm / attn_k_norm */
    bool tied;     /* no output.weight: the output reuses token_embd */
    /* llama3 RoPE scaling, stored as the rope_freqs.weight tensor as
     * llama.cpp's converter does (factor 0 = none). */
    float rope_factor, rope_low_freq, rope_high_freq;
    int64_t rope_orig_ctx;
} mk_shape_t;

const mk_shape_t *mk_shape_find(const char *name); /* NULL if unknown */
const mk_shape_t *mk_shape_at(int i);              /* NULL past the last */

/* A target file type, with llama.cpp's per-tensor rules (llama-quantize
 * without --pure): "q4_0", "q8_0" ... put every quantizable weight in that
 * type except the output matrix (or the tied token_embd), which becomes Q6_K
 * (Q8_0 when its rows are not a multiple of the base block size); the mixes
 * "q4_k_m", "q5_k_m" also raise attn_v and ffn_down to Q6_K in the
 * use_more_bits layers. "q4_k" / "q5_k" have no llama.cpp file type of their
 * own: they get the output rule only (stored file_type: Q4_K_S / Q5_K_S, whose
 * extra attn_v / ffn_down tweaks are NOT applied). With pure set, every
 * quantizable weight gets the base type (llama-quantize --pure). In all
 * cases the shape fallback follows. Non-quantizable tensors (1-D: norms,
 * biases, rope_freqs) keep their type (F32 in mkmodel files). */
typedef struct {
    const char *name;
    int base;       /* tern_type_t of the bulk of the weights */
    bool mix;       /* the *_m rules (attn_v, ffn_down) */
    bool pure;      /* no per-tensor rules at all */
    uint32_t ftype; /* llama_ftype, stored as general.file_type */
} mk_target_t;

int mk_target_parse(const char *name, mk_target_t *t); /* 0, or TERN_EINVAL */
const char *mk_target_names(void);                     /* "f32, f16, ..." for usage text */

/* One tensor as the planner sees it (file order matters: llama.cpp counts
 * attn_v and ffn_down tensors in order). */
typedef struct {
    const char *name;
    int n_dims;
    int64_t ne0;
    int type; /* current type; kept when the tensor is not quantizable */
} mk_tinfo_t;

/* llama.cpp's rule (tensor_allows_quantization, for the architectures tern
 * knows): 2+ dims, name ends in "weight", not a norm. */
bool mk_quantizable(const char *name, int n_dims);

/* The type of every tensor under target t, following llama.cpp's
 * llama_tensor_get_type (rules above), then the shape fallback Q4_K->Q5_0,
 * Q5_K->Q5_1, Q6_K->Q8_0, and F16 when even the fallback's 32-block does not
 * divide the row (also for the 32-block types, where llama.cpp would refuse).
 * n_fallback (may be NULL) counts fallbacks. */
void mk_plan(const mk_target_t *t, const mk_tinfo_t *ti, int64_t n, int *types, int *n_fallback);

/* The tensors of a shape in file order, with n_vocab rows of embeddings.
 * Returns the count and fills up to cap entries of names (static storage per
 * call is NOT used: each name is written into names[i], 64 bytes). */
typedef struct {
    char name[64];
    int n_dims;
    int64_t ne[4];
} mk_tdesc_t;
int64_t mk_shape_tensors(const mk_shape_t *s, int64_t n_vocab, mk_tdesc_t *out, int64_t cap);

typedef struct {
    const char *shape;
    const char *type;       /* target name */
    const char *out;        /* output path */
    const char *vocab_from; /* GGUF file whose tokenizer.* keys are copied, or NULL */
    uint64_t seed;
    bool pure;     /* llama-quantize --pure: no per-tensor rules */
    int n_threads; /* <= 0: TERN_THREADS, else the online CPUs */
    int verbose;   /* 0 silent, 1 type summary on stderr, 2 also each tensor as it is written */
} mk_opts_t;

/* Write a synthetic model. Weights: N(0, 1/ne0) per element (std
 * 1/sqrt(fan_in)), from a counter-based RNG keyed by (seed, tensor name, row),
 * so the file does not depend on the thread count; norm weights 1; qwen2
 * biases N(0, 0.02^2). */
int mk_model_write(const mk_opts_t *o, tern_error_t *err);

/* Re-quantize a model file: every quantizable weight is converted to its
 * planned type (dequantized to float, then quantized; copied as is when the
 * type does not change); other tensors are copied; metadata copied with
 * general.file_type (and general.quantization_version) set. */
int mk_quantize_file(const char *in, const char *out, const char *type, bool pure, int n_threads, int verbose,
                     tern_error_t *err);

#endif
