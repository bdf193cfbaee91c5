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

/* A model shape. head_dim may differ from n_embd / n_head (qwen3).
 *
 * Mixture of experts (n_expert > 0), in llama.cpp's GGUF layout: every layer
 * keeps attn_* and ffn_norm, and in place of ffn_gate / ffn_up / ffn_down has
 *   blk.N.ffn_gate_inp.weight    [n_embd, n_expert]           the router, F32
 *   blk.N.ffn_gate_exps.weight   [n_embd, n_ff_exp, n_expert]  3-D, expert
 *   blk.N.ffn_up_exps.weight     [n_embd, n_ff_exp, n_expert]  outermost
 *   blk.N.ffn_down_exps.weight   [n_ff_exp, n_embd, n_expert]
 * and, for qwen2moe, the shared expert
 *   blk.N.ffn_gate_inp_shexp.weight [n_embd]  (1-D, F32)
 *   blk.N.ffn_gate_shexp.weight, blk.N.ffn_up_shexp.weight [n_embd, n_ff_shexp]
 *   blk.N.ffn_down_shexp.weight  [n_ff_shexp, n_embd].
 * Keys: <arch>.expert_count and <arch>.expert_used_count for every MoE;
 * <arch>.expert_feed_forward_length = n_ff_exp for qwen2moe and qwen3moe
 * (feed_forward_length is then the dense intermediate size, still written);
 * <arch>.expert_shared_feed_forward_length = n_ff_shexp for qwen2moe. For
 * olmoe and Mixtral (arch "llama" with n_expert > 0) the expert width is
 * feed_forward_length itself: n_ff_exp == n_ff and no expert key for it.
 * Mixtral can also be written in the older per-expert 2-D form
 * (mk_opts_t.split_experts): blk.N.ffn_gate.E.weight, blk.N.ffn_up.E.weight
 * [n_embd, n_ff] and blk.N.ffn_down.E.weight [n_ff, n_embd], E = 0..n_expert-1,
 * in place of the three _exps tensors. */
typedef struct {
    const char *name;
    /* "llama", "qwen2", "qwen3", "olmoe", "qwen2moe", "qwen3moe" */
    const char *arch;
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    float rope_base, rms_eps;
    bool qkv_bias; /* qwen2, qwen2moe: attn_q/k/v.bias */
    /* attn_q_norm / attn_k_norm: per head, [head_dim] (qwen3, qwen3moe); for
     * olmoe over the whole projection, [n_head*head_dim] and
     * [n_head_kv*head_dim] */
    bool qk_norm;
    bool tied;     /* no output.weight: the output reuses token_embd */
    /* llama3 RoPE scaling, stored as the rope_freqs.weight tensor as
     * llama.cpp's converter does (factor 0 = none). */
    float rope_factor, rope_low_freq, rope_high_freq;
    int64_t rope_orig_ctx;
    /* Mixture of experts, all 0 for a dense model (layout above): experts per
     * layer, experts used per token, one expert's width, the shared expert's
     * width (qwen2moe; 0 = none). */
    int64_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
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
 * biases, rope_freqs; the MoE router ffn_gate_inp) keep their type (F32 in
 * mkmodel files).
 *
 * Mixture of experts (n_expert set, see below), as llama.cpp's
 * llama_tensor_get_type has it for these targets:
 *   - the router blk.N.ffn_gate_inp.weight is never quantized (F32 in every
 *     target, --pure included); the 3-D expert tensors are quantized like
 *     2-D ones, every expert's rows in the same type;
 *   - every tensor whose name holds "ffn_down" (ffn_down_exps,
 *     ffn_down_shexp, Mixtral's split ffn_down.E) is an ffn_down for the
 *     Q4_K_M / Q5_K_M use_more_bits rule, with its layer taken from the name
 *     "blk.N." and n_layer = the highest N + 1 (llama.cpp parses the name when
 *     n_expert > 1, since split experts are not in layer order); dense models
 *     count ffn_down tensors in file order as before;
 *   - n_expert == 8 exactly (Mixtral 8x7B; the 8-expert tiny shapes):
 *     attn_v and attn_k become Q8_0 in every quantized target (over the
 *     *_m attn_v rule), and attn_output becomes Q5_K under q4_k_m (llama.cpp
 *     also does so for Q4_K_S, whose tweaks q4_k does not take);
 *   - the shape fallback is decided per tensor by its own ne0, so e.g. an
 *     ffn_down_exps of width 128 falls back from Q4_K to Q5_0 while the
 *     ffn_gate_exps of the same layer (ne0 = n_embd 256) stays Q4_K. */
typedef struct {
    const char *name;
    int base;       /* tern_type_t of the bulk of the weights */
    bool mix;       /* the *_m rules (attn_v, ffn_down) */
    bool pure;      /* no per-tensor rules at all */
    uint32_t ftype; /* llama_ftype, stored as general.file_type */
    /* The model's expert count (<arch>.expert_count; 0 = dense): the MoE
     * rules above. mk_target_parse leaves it 0; the caller of mk_plan sets it
     * (mk_model_write from the shape, mk_quantize_file from the key). */
    int64_t n_expert;
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
 * knows): 2+ dims, name ends in "weight", not a norm, not an MoE router
 * (ffn_gate_inp.weight). */
bool mk_quantizable(const char *name, int n_dims);

/* The type of every tensor under target t, following llama.cpp's
 * llama_tensor_get_type (rules above), then the shape fallback Q4_K->Q5_0,
 * Q5_K->Q5_1, Q6_K->Q8_0, and F16 when even the fallback's 32-block does not
 * divide the row (also for the 32-block types, where llama.cpp would refuse).
 * n_fallback (may be NULL) counts fallbacks. */
void mk_plan(const mk_target_t *t, const mk_tinfo_t *ti, int64_t n, int *types, int *n_fallback);

/* The tensors of a shape in file order, with n_vocab rows of embeddings.
 * Returns the count and fills up to cap entries of names (static storage per
 * call is NOT used: each name is written into names[i], 64 bytes). Unused
 * dimensions are 1; the expert tensors are 3-D (ne[2] = n_expert). */
typedef struct {
    char name[64];
    int n_dims;
    int64_t ne[4];
} mk_tdesc_t;
int64_t mk_shape_tensors(const mk_shape_t *s, int64_t n_vocab, mk_tdesc_t *out, int64_t cap);
/* The same with Mixtral's per-expert 2-D tensors when split_experts is set
 * (ignored unless arch is "llama" and n_expert > 0). */
int64_t mk_shape_tensors_opt(const mk_shape_t *s, int64_t n_vocab, bool split_experts, mk_tdesc_t *out,
                             int64_t cap);

/* Router skew: the factor by which mkmodel scales row e (expert e) of layer
 * `layer`'s router ffn_gate_inp: (1 + rank_e)^(-skew), a Zipf-like ranking
 * where rank is a permutation of 0..n_expert-1 drawn per layer from
 * (seed, layer), so every layer has its own hot experts. skew 0 gives all
 * factors 1: uniform routing, the bytes of an unskewed file.
 *
 * Why it skews: expert e's logit w_e . x for a random input has a spread
 * proportional to its factor, so the top-k is taken mostly from the experts
 * of large factor. Measured with Gaussian inputs (test_router_skew), the
 * share of all top-k selections that goes to the top quarter of the experts
 * at skew 1 is about 68% for 64 experts top 8, 91% for 128 top 8, against
 * 25-30% at skew 0. A limit of any router without a bias on inputs as
 * likely as their negation: an expert is in the top k of x or of -x, not
 * both (k <= n_expert / 2), so no expert is chosen for more than half of the
 * tokens; with 2 of 8 used (Mixtral, the tiny shapes) the top quarter can
 * therefore take at most 50% (measured: 40% at skew 1). */
void mk_router_scales(uint64_t seed, int layer, int64_t n_expert, float skew, float *scale);

typedef struct {
    const char *shape;
    const char *type;       /* target name */
    const char *out;        /* output path */
    const char *vocab_from; /* GGUF file whose tokenizer.* keys are copied, or NULL */
    uint64_t seed;
    bool pure;     /* llama-quantize --pure: no per-tensor rules */
    int n_threads; /* <= 0: TERN_THREADS, else the online CPUs */
    /* 0 silent; 1 type summary on stderr and, when stderr is a terminal, one
     * progress line while writing; 2 also each tensor as it is written */
    int verbose;
    bool split_experts; /* Mixtral (arch llama MoE) only: per-expert 2-D tensors; an error otherwise */
    float router_skew;  /* >= 0; 0 = uniform routing; see mk_router_scales */
} mk_opts_t;

/* Write a synthetic model. Weights: N(0, 1/ne0) per element (std
 * 1/sqrt(fan_in)), from a counter-based RNG keyed by (seed, tensor name, row),
 * so the file does not depend on the thread count (a row of a 3-D tensor is
 * ne0 elements, rows numbered 0 .. ne1*ne2-1); norm weights 1; qwen2 biases
 * N(0, 0.02^2); router rows scaled by mk_router_scales. */
int mk_model_write(const mk_opts_t *o, tern_error_t *err);

/* Re-quantize a model file: every quantizable weight is converted to its
 * planned type (dequantized to float, then quantized; copied as is when the
 * type does not change); other tensors are copied; metadata copied with
 * general.file_type (and general.quantization_version) set. n_expert for the
 * plan comes from <arch>.expert_count. verbose as in mk_opts_t (1: summary,
 * and a progress line when stderr is a terminal). */
int mk_quantize_file(const char *in, const char *out, const char *type, bool pure, int n_threads, int verbose,
                     tern_error_t *err);

#endif
