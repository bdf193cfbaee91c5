/*
 * load.c - loading a Llama-family model: hyperparameters from the GGUF keys,
 * then every tensor bound to its kernel format with its shape checked (see
 * model.h). The KV cache is kv_cache.c, contexts context.c, the forward pass
 * forward.c.
 *
 * Supported architectures and how they differ:
 *   llama  (TinyStories, Llama 2/3/3.x, SmolLM/SmolLM2, Mistral): RoPE on
 *          adjacent pairs (2i, 2i+1) (the converter permutes HF's Q/K rows so
 *          that this layout is right), optional Llama 3 frequency factors.
 *   qwen2  (Qwen2, Qwen2.5): biases on Q, K and V; NeoX RoPE (i, i + d/2).
 *   qwen3  : RMSNorm of each Q and K head before RoPE; NeoX RoPE; head_dim
 *            from attention.key_length (not n_embd / n_head).
 * All: RMSNorm, SwiGLU feed-forward, grouped-query attention, output matrix
 * stored (output.weight) or tied to token_embd.weight.
 */
#define _GNU_SOURCE
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "format/quant.h"
#include "model/expert_cache.h"

/* Upper bounds on hyperparameters from a file: far above any real model,
 * low enough that every product below fits easily in 64 bits. */
#define MAX_EMBD (1 << 16)
#define MAX_FF (1 << 20)
#define MAX_LAYER 1024
#define MAX_HEAD 1024
#define MAX_HEAD_DIM 1024
#define MAX_VOCAB (1 << 22)
#define MAX_EXPERT 4096

const char *model_arch_name(model_arch_t a) {
    switch (a) {
    case ARCH_LLAMA: return "llama";
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    case ARCH_QWEN2MOE: return "qwen2moe";
    case ARCH_QWEN3MOE: return "qwen3moe";
    case ARCH_OLMOE: return "olmoe";
    }
    return "?";
}

/* ---- hyperparameters ------------------------------------------------------ */

static bool has_arch_key(const gguf_file_t *f, const char *suffix) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", gguf_arch(f), suffix);
    return gguf_find(f, key) != NULL;
}

/* An integer key "<arch>.<suffix>" in [lo, hi]; absent -> def (def < 0: required). */
static int get_int(const gguf_file_t *f, const char *suffix, int64_t def, int64_t lo, int64_t hi, int64_t *out,
                   tern_error_t *err) {
    if (!has_arch_key(f, suffix)) {
        if (def < 0)
            return tern_err(err, TERN_EFORMAT, "model: required key '%s.%s' is missing", gguf_arch(f), suffix);
        *out = def;
        return 0;
    }
    uint64_t v;
    int rc = gguf_get_arch_u64(f, suffix, &v, err);
    if (rc) return rc;
    if (v < (uint64_t)lo || v > (uint64_t)hi)
        return tern_err(err, TERN_EFORMAT, "model: key '%s.%s' = %llu out of range [%lld, %lld]", gguf_arch(f),
                        suffix, (unsigned long long)v, (long long)lo, (long long)hi);
    *out = (int64_t)v;
    return 0;
}

static int get_float(const gguf_file_t *f, const char *suffix, float def, float *out, tern_error_t *err) {
    if (!has_arch_key(f, suffix)) {
        *out = def;
        return 0;
    }
    int rc = gguf_get_arch_f32(f, suffix, out, err);
    if (rc) return rc;
    if (!isfinite(*out))
        return tern_err(err, TERN_EFORMAT, "model: key '%s.%s' is not a finite number", gguf_arch(f), suffix);
    return 0;
}

static int get_arch_str(const gguf_file_t *f, const char *suffix, char *out, size_t cap, tern_error_t *err) {
    out[0] = 0;
    if (!has_arch_key(f, suffix)) return 0;
    char key[160];
    snprintf(key, sizeof key, "%s.%s", gguf_arch(f), suffix);
    gguf_str_t s;
    int rc = gguf_get_str(f, key, &s, err);
    if (rc) return rc;
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(out, s.data, n);
    out[n] = 0;
    return 0;
}

/* Mixture-of-Experts keys, with llama.cpp's per-architecture rules (facts
 * from its loader): qwen2moe, qwen3moe and olmoe always have experts; llama
 * has them when expert_count > 0 (Mixtral). The expert width is
 * expert_feed_forward_length for qwen2moe / qwen3moe (default
 * feed_forward_length / expert_used_count) and feed_forward_length for
 * olmoe and Mixtral; qwen2moe's shared expert is
 * expert_shared_feed_forward_length wide (default feed_forward_length).
 * Whether the top-k weights are renormalized is fixed by the architecture
 * (qwen3moe and Mixtral: yes; qwen2moe and olmoe: no) and gating is always
 * a softmax over all experts: the expert_weights_norm,
 * expert_weights_scale and expert_gating_func keys are not read for these
 * architectures, as llama.cpp does not. */
static int read_moe_hparams(const gguf_file_t *f, model_hparams_t *hp, tern_error_t *err) {
    const bool moe_arch = hp->arch == ARCH_QWEN2MOE || hp->arch == ARCH_QWEN3MOE || hp->arch == ARCH_OLMOE;
    int rc;
    if (!moe_arch && hp->arch != ARCH_LLAMA) return 0;
    if ((rc = get_int(f, "expert_count", moe_arch ? -1 : 0, moe_arch ? 1 : 0, MAX_EXPERT, &hp->n_expert, err)))
        return rc;
    if (hp->n_expert == 0) return 0;
    if ((rc = get_int(f, "expert_used_count", -1, 1, hp->n_expert, &hp->n_expert_used, err))) return rc;
    if (hp->arch == ARCH_QWEN2MOE || hp->arch == ARCH_QWEN3MOE) {
        const int64_t def = hp->n_ff / hp->n_expert_used;
        if ((rc = get_int(f, "expert_feed_forward_length", def > 0 ? def : -1, 1, MAX_FF, &hp->n_ff_exp, err)))
            return rc;
    } else {
        hp->n_ff_exp = hp->n_ff;
    }
    if (hp->arch == ARCH_QWEN2MOE &&
        (rc = get_int(f, "expert_shared_feed_forward_length", hp->n_ff, 1, MAX_FF, &hp->n_ff_shexp, err)))
        return rc;
    hp->moe_norm_w = hp->arch == ARCH_QWEN3MOE || hp->arch == ARCH_LLAMA;
    return 0;
}

static int read_hparams(const gguf_file_t *f, model_hparams_t *hp, tern_error_t *err) {
    memset(hp, 0, sizeof *hp);
    const char *arch = gguf_arch(f);
    if (!arch) return tern_err(err, TERN_EFORMAT, "model: key 'general.architecture' is missing");
    if (!strcmp(arch, "llama"))
        hp->arch = ARCH_LLAMA;
    else if (!strcmp(arch, "qwen2"))
        hp->arch = ARCH_QWEN2;
    else if (!strcmp(arch, "qwen3"))
        hp->arch = ARCH_QWEN3;
    else if (!strcmp(arch, "qwen2moe"))
        hp->arch = ARCH_QWEN2MOE;
    else if (!strcmp(arch, "qwen3moe"))
        hp->arch = ARCH_QWEN3MOE;
    else if (!strcmp(arch, "olmoe"))
        hp->arch = ARCH_OLMOE;
    else
        return tern_err(err, TERN_EUNSUP,
                        "model: architecture '%.64s' is not supported (supported: llama, qwen2, qwen3, qwen2moe, "
                        "qwen3moe, olmoe; Mixtral is llama with experts)",
                        arch);
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", arch);

    int rc;
    if ((rc = get_int(f, "embedding_length", -1, 1, MAX_EMBD, &hp->n_embd, err)) ||
        (rc = get_int(f, "block_count", -1, 1, MAX_LAYER, &hp->n_layer, err)) ||
        (rc = get_int(f, "feed_forward_length", -1, 1, MAX_FF, &hp->n_ff, err)) ||
        (rc = get_int(f, "attention.head_count", -1, 1, MAX_HEAD, &hp->n_head, err)) ||
        (rc = get_int(f, "attention.head_count_kv", hp->n_head, 1, MAX_HEAD, &hp->n_head_kv, err)) ||
        (rc = get_int(f, "context_length", 2048, 1, MODEL_MAX_CTX, &hp->n_ctx_train, err)))
        return rc;
    if (hp->n_head % hp->n_head_kv)
        return tern_err(err, TERN_EFORMAT, "model: head_count %lld is not a multiple of head_count_kv %lld",
                        (long long)hp->n_head, (long long)hp->n_head_kv);
    int64_t def_hd = hp->n_embd % hp->n_head ? -1 : hp->n_embd / hp->n_head;
    if ((rc = get_int(f, "attention.key_length", def_hd, 2, MAX_HEAD_DIM, &hp->head_dim, err))) return rc;
    int64_t vd;
    if ((rc = get_int(f, "attention.value_length", hp->head_dim, 1, MAX_HEAD_DIM, &vd, err))) return rc;
    if (vd != hp->head_dim)
        return tern_err(err, TERN_EUNSUP, "model: value_length %lld != key_length %lld is not supported",
                        (long long)vd, (long long)hp->head_dim);
    if (hp->head_dim % 2)
        return tern_err(err, TERN_EFORMAT, "model: head dimension %lld is odd", (long long)hp->head_dim);
    if ((rc = get_int(f, "rope.dimension_count", hp->head_dim, 2, hp->head_dim, &hp->n_rot, err))) return rc;
    if (hp->n_rot % 2) return tern_err(err, TERN_EFORMAT, "model: rope.dimension_count %lld is odd", (long long)hp->n_rot);
    if ((rc = get_float(f, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err)) ||
        (rc = get_float(f, "rope.freq_base", 10000.0f, &hp->rope_freq_base, err)))
        return rc;
    if (hp->rms_eps <= 0 || hp->rms_eps > 1)
        return tern_err(err, TERN_EFORMAT, "model: rms epsilon %g out of range", (double)hp->rms_eps);
    if (hp->rope_freq_base <= 1)
        return tern_err(err, TERN_EFORMAT, "model: rope.freq_base %g out of range", (double)hp->rope_freq_base);
    hp->rope_freq_scale = 1.0f;
    hp->rope_neox = hp->arch != ARCH_LLAMA;
    hp->qk_norm_full = hp->arch == ARCH_OLMOE;
    return read_moe_hparams(f, hp, err);
}

/* ---- tensors --------------------------------------------------------------- */

typedef struct {
    model_t *m;
    float *store; /* next free float of m->f32_store */
    float *store_end;
} binder_t;

static int bind_mat(binder_t *b, const char *name, int64_t rows, int64_t cols, bool optional, kern_mat_t *out,
                    tern_error_t *err) {
    memset(out, 0, sizeof *out);
    const gguf_file_t *f = b->m->file;
    if (optional && !gguf_tensor_find(f, name)) return 0;
    const int64_t want[2] = {cols, rows};
    const gguf_tensor_t *t = gguf_tensor_get(f, name, 2, want, NULL, err);
    if (!t) {
        if (!gguf_tensor_find(f, name))
            return tern_err(err, TERN_EFORMAT, "model (%s): tensor '%s' is missing", b->m->hp.arch_name, name);
        return err ? err->code : TERN_EFORMAT; /* the reader's message names the tensor and the shape */
    }
    const quant_traits_t *tr = quant_traits(t->type);
    if (!tr || !tr->weight || !kern_ops(t->type, kern_isa_active()))
        return tern_err(err, TERN_EUNSUP, "model: tensor '%s' has type %s, which has no matrix kernel", name,
                        quant_name(t->type));
    out->type = t->type;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = quant_row_size(t->type, cols);
    out->data = t->data;
    if (out->row_bytes == 0 || (uint64_t)out->row_bytes * (uint64_t)rows != t->size)
        return tern_err(err, TERN_EFORMAT, "model: tensor '%s': %llu bytes for %lld x %lld %s", name,
                        (unsigned long long)t->size, (long long)rows, (long long)cols, quant_name(t->type));
    b->m->n_params += (uint64_t)rows * (uint64_t)cols;
    return 0;
}

/* A 3-D tensor of E matrices (rows, cols), matrix outermost (GGUF shape
 * [cols, rows, E]): out[e] = matrix e. */
static int bind_mat3(binder_t *b, const char *name, int64_t rows, int64_t cols, int64_t ne, kern_mat_t *out,
                     size_t stride, tern_error_t *err) {
    const gguf_file_t *f = b->m->file;
    const int64_t want[3] = {cols, rows, ne};
    const gguf_tensor_t *t = gguf_tensor_get(f, name, 3, want, NULL, err);
    if (!t) {
        if (!gguf_tensor_find(f, name))
            return tern_err(err, TERN_EFORMAT, "model (%s): tensor '%s' is missing", b->m->hp.arch_name, name);
        return err ? err->code : TERN_EFORMAT;
    }
    const quant_traits_t *tr = quant_traits(t->type);
    if (!tr || !tr->weight || !kern_ops(t->type, kern_isa_active()))
        return tern_err(err, TERN_EUNSUP, "model: tensor '%s' has type %s, which has no matrix kernel", name,
                        quant_name(t->type));
    const size_t rb = quant_row_size(t->type, cols);
    uint64_t mb, total;
    if (rb == 0 || tern_mul_overflow_u64(rb, (uint64_t)rows, &mb) || tern_mul_overflow_u64(mb, (uint64_t)ne, &total) ||
        total != t->size)
        return tern_err(err, TERN_EFORMAT, "model: tensor '%s': %llu bytes for %lld x %lld x %lld %s", name,
                        (unsigned long long)t->size, (long long)ne, (long long)rows, (long long)cols,
                        quant_name(t->type));
    for (int64_t e = 0; e < ne; e++) {
        kern_mat_t *o = (kern_mat_t *)((char *)out + (size_t)e * stride);
        *o = (kern_mat_t){t->type, rows, cols, rb, (const char *)t->data + (size_t)e * mb};
    }
    b->m->n_params += (uint64_t)rows * (uint64_t)cols * (uint64_t)ne;
    return 0;
}

/* A vector (norm weight, bias, rope factors) dequantized into the model's own
 * float store, so that its alignment and type never matter to the kernels. */
static int bind_vec(binder_t *b, const char *name, int64_t n, bool optional, const float **out, tern_error_t *err) {
    *out = NULL;
    const gguf_file_t *f = b->m->file;
    if (optional && !gguf_tensor_find(f, name)) return 0;
    const int64_t want[1] = {n};
    const gguf_tensor_t *t = gguf_tensor_get(f, name, 1, want, NULL, err);
    if (!t) {
        if (!gguf_tensor_find(f, name))
            return tern_err(err, TERN_EFORMAT, "model (%s): tensor '%s' is missing", b->m->hp.arch_name, name);
        return err ? err->code : TERN_EFORMAT;
    }
    TERN_CHECK(b->store + n <= b->store_end);
    if (quant_dequantize_row(t->type, t->data, b->store, n) != 0)
        return tern_err(err, TERN_EUNSUP, "model: tensor '%s' of type %s cannot be read as %lld floats", name,
                        quant_name(t->type), (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(b->store[i]))
            return tern_err(err, TERN_EFORMAT, "model: tensor '%s' element %lld is not finite", name, (long long)i);
    *out = b->store;
    b->store += n;
    b->m->n_params += (uint64_t)n;
    return 0;
}

/* Llama 3 RoPE scaling from keys, when the file has no rope_freqs tensor:
 * wavelengths shorter than orig_ctx / high_freq_factor are kept, longer than
 * orig_ctx / low_freq_factor are divided by factor, and those in between are
 * blended (Llama 3.1's published rule). */
static int llama3_factors(binder_t *b, tern_error_t *err) {
    const gguf_file_t *f = b->m->file;
    model_hparams_t *hp = &b->m->hp;
    float factor, lo, hi, orig;
    int rc;
    if ((rc = get_float(f, "rope.scaling.factor", 8.0f, &factor, err)) ||
        (rc = get_float(f, "rope.scaling.low_freq_factor", 1.0f, &lo, err)) ||
        (rc = get_float(f, "rope.scaling.high_freq_factor", 4.0f, &hi, err)) ||
        (rc = get_float(f, "rope.scaling.original_context_length", 8192.0f, &orig, err)))
        return rc;
    if (factor <= 0 || lo <= 0 || hi <= lo || orig <= 0)
        return tern_err(err, TERN_EFORMAT, "model: llama3 rope scaling keys out of range");
    int64_t np = hp->n_rot / 2;
    TERN_CHECK(b->store + np <= b->store_end);
    float *fac = b->store;
    const double lo_wl = orig / lo, hi_wl = orig / hi;
    for (int64_t i = 0; i < np; i++) {
        double freq = pow(hp->rope_freq_base, -2.0 * (double)i / (double)hp->n_rot);
        double wl = 2.0 * M_PI / freq;
        if (wl < hi_wl)
            fac[i] = 1.0f;
        else if (wl > lo_wl)
            fac[i] = factor;
        else {
            double smooth = (orig / wl - lo) / (hi - lo);
            fac[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
    b->m->rope_factors = fac;
    b->store += np;
    return 0;
}

static int bind_rope(binder_t *b, tern_error_t *err) {
    const gguf_file_t *f = b->m->file;
    model_hparams_t *hp = &b->m->hp;
    int rc;
    if (gguf_tensor_find(f, "rope_freqs.weight")) {
        if ((rc = bind_vec(b, "rope_freqs.weight", hp->n_rot / 2, false, &b->m->rope_factors, err))) return rc;
        for (int64_t i = 0; i < hp->n_rot / 2; i++)
            if (!(b->m->rope_factors[i] > 0))
                return tern_err(err, TERN_EFORMAT, "model: rope_freqs.weight[%lld] is not positive", (long long)i);
        hp->has_rope_factors = true;
        return 0;
    }
    char type[32];
    if ((rc = get_arch_str(f, "rope.scaling.type", type, sizeof type, err))) return rc;
    if (!type[0] || !strcmp(type, "none")) {
        if (has_arch_key(f, "rope.scaling.low_freq_factor") && hp->arch == ARCH_LLAMA) strcpy(type, "llama3");
        else return 0;
    }
    if (!strcmp(type, "linear")) {
        float factor;
        if ((rc = get_float(f, "rope.scaling.factor", 1.0f, &factor, err))) return rc;
        if (factor < 1.0f || factor > 1024.0f)
            return tern_err(err, TERN_EFORMAT, "model: rope.scaling.factor %g out of range", (double)factor);
        hp->rope_freq_scale = 1.0f / factor;
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        if ((rc = llama3_factors(b, err))) return rc;
        hp->has_rope_factors = true;
        return 0;
    }
    return tern_err(err, TERN_EUNSUP, "model: rope scaling type '%s' is not supported (linear, llama3)", type);
}

static uint64_t mat_bytes(const kern_mat_t *w) { return w->data ? (uint64_t)w->row_bytes * (uint64_t)w->rows : 0; }

/* The feed-forward of an MoE layer l: the router, the routed experts (3-D
 * tensors, or Mixtral's per-expert 2-D ones when the 3-D ones are absent)
 * and qwen2moe's shared expert. */
static int bind_moe(binder_t *b, int64_t l, model_layer_t *L, tern_error_t *err) {
    const model_hparams_t *hp = &b->m->hp;
    const gguf_file_t *f = b->m->file;
    const int64_t D = hp->n_embd, E = hp->n_expert, FE = hp->n_ff_exp;
    char nm[96];
    int rc;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%lld." s, (long long)l), nm)
    L->experts = b->m->expert_store + l * E;
    if ((rc = bind_mat(b, NAME("ffn_gate_inp.weight"), E, D, false, &L->router, err))) return rc;
    const size_t st = sizeof(model_expert_t);
    if (gguf_tensor_find(f, NAME("ffn_gate_exps.weight")) || hp->arch != ARCH_LLAMA) {
        if ((rc = bind_mat3(b, NAME("ffn_gate_exps.weight"), FE, D, E, &L->experts[0].gate, st, err)) ||
            (rc = bind_mat3(b, NAME("ffn_up_exps.weight"), FE, D, E, &L->experts[0].up, st, err)) ||
            (rc = bind_mat3(b, NAME("ffn_down_exps.weight"), D, FE, E, &L->experts[0].down, st, err)))
            return rc;
    } else {
        for (int64_t e = 0; e < E; e++) {
            char en[112];
#define ENAME(s) (snprintf(en, sizeof en, "blk.%lld." s ".%lld.weight", (long long)l, (long long)e), en)
            if ((rc = bind_mat(b, ENAME("ffn_gate"), FE, D, false, &L->experts[e].gate, err)) ||
                (rc = bind_mat(b, ENAME("ffn_up"), FE, D, false, &L->experts[e].up, err)) ||
                (rc = bind_mat(b, ENAME("ffn_down"), D, FE, false, &L->experts[e].down, err)))
                return rc;
#undef ENAME
        }
    }
    if (hp->n_ff_shexp > 0) {
        const int64_t FS = hp->n_ff_shexp;
        if ((rc = bind_vec(b, NAME("ffn_gate_inp_shexp.weight"), D, false, &L->sh_gate_inp, err)) ||
            (rc = bind_mat(b, NAME("ffn_gate_shexp.weight"), FS, D, false, &L->sh_gate, err)) ||
            (rc = bind_mat(b, NAME("ffn_up_shexp.weight"), FS, D, false, &L->sh_up, err)) ||
            (rc = bind_mat(b, NAME("ffn_down_shexp.weight"), D, FS, false, &L->sh_down, err)))
            return rc;
    }
#undef NAME
    return 0;
}

static int bind_tensors(model_t *m, tern_error_t *err) {
    model_hparams_t *hp = &m->hp;
    const gguf_file_t *f = m->file;
    const int64_t D = hp->n_embd, HD = hp->head_dim, QD = hp->n_head * HD, KVD = hp->n_head_kv * HD;

    /* The vocabulary size is the embedding's row count. */
    const gguf_tensor_t *te = gguf_tensor_find(f, "token_embd.weight");
    if (!te) return tern_err(err, TERN_EFORMAT, "model (%s): tensor 'token_embd.weight' is missing", hp->arch_name);
    if (te->n_dims != 2 || te->ne[0] != D || te->ne[1] < 1 || te->ne[1] > MAX_VOCAB)
        return tern_err(err, TERN_EFORMAT, "model: tensor 'token_embd.weight' has shape [%lld, %lld], want [%lld, n_vocab]",
                        (long long)te->ne[0], (long long)te->ne[1], (long long)D);
    hp->n_vocab = te->ne[1];

    /* Floats of the store: per layer 2 norms + 3 biases + 2 head norms; output
     * norm; rope factors. All small, bounded by the MAX_* limits. */
    uint64_t per_layer = 3 * (uint64_t)D + 2 * (uint64_t)QD + 3 * (uint64_t)KVD + 2 * (uint64_t)HD;
    uint64_t n_store = per_layer * (uint64_t)hp->n_layer + (uint64_t)D + (uint64_t)hp->n_rot / 2;
    m->f32_store = tern_alloc(n_store * sizeof(float));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (hp->n_expert > 0) {
        m->expert_store = calloc((size_t)(hp->n_layer * hp->n_expert), sizeof *m->expert_store);
        if (!m->expert_store) return tern_err(err, TERN_ENOMEM, "model: out of memory for the experts' table");
    }
    if (!m->f32_store || !m->layers) return tern_err(err, TERN_ENOMEM, "model: out of memory for %llu floats", (unsigned long long)n_store);
    binder_t b = {m, m->f32_store, m->f32_store + n_store};

    int rc;
    if ((rc = bind_mat(&b, "token_embd.weight", hp->n_vocab, D, false, &m->tok_embd, err))) return rc;
    if (quant_row_size(m->tok_embd.type, D) == 0)
        return tern_err(err, TERN_EUNSUP, "model: token_embd.weight type %s cannot be dequantized", quant_name(m->tok_embd.type));
    if ((rc = bind_vec(&b, "output_norm.weight", D, false, &m->out_norm, err))) return rc;
    if ((rc = bind_mat(&b, "output.weight", hp->n_vocab, D, true, &m->output, err))) return rc;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    if ((rc = bind_rope(&b, err))) return rc;

    for (int64_t l = 0; l < hp->n_layer; l++) {
        model_layer_t *L = &m->layers[l];
        char nm[96];
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%lld." s, (long long)l), nm)
        if ((rc = bind_vec(&b, NAME("attn_norm.weight"), D, false, &L->attn_norm, err)) ||
            (rc = bind_mat(&b, NAME("attn_q.weight"), QD, D, false, &L->wq, err)) ||
            (rc = bind_mat(&b, NAME("attn_k.weight"), KVD, D, false, &L->wk, err)) ||
            (rc = bind_mat(&b, NAME("attn_v.weight"), KVD, D, false, &L->wv, err)) ||
            (rc = bind_mat(&b, NAME("attn_output.weight"), D, QD, false, &L->wo, err)) ||
            (rc = bind_vec(&b, NAME("ffn_norm.weight"), D, false, &L->ffn_norm, err)))
            return rc;
        if (hp->n_expert == 0) {
            if ((rc = bind_mat(&b, NAME("ffn_gate.weight"), hp->n_ff, D, false, &L->w_gate, err)) ||
                (rc = bind_mat(&b, NAME("ffn_up.weight"), hp->n_ff, D, false, &L->w_up, err)) ||
                (rc = bind_mat(&b, NAME("ffn_down.weight"), D, hp->n_ff, false, &L->w_down, err)))
                return rc;
        } else if ((rc = bind_moe(&b, l, L, err))) {
            return rc;
        }
        if (hp->arch == ARCH_QWEN2 || hp->arch == ARCH_QWEN2MOE) {
            if ((rc = bind_vec(&b, NAME("attn_q.bias"), QD, false, &L->bq, err)) ||
                (rc = bind_vec(&b, NAME("attn_k.bias"), KVD, false, &L->bk, err)) ||
                (rc = bind_vec(&b, NAME("attn_v.bias"), KVD, false, &L->bv, err)))
                return rc;
        }
        if (hp->arch == ARCH_QWEN3 || hp->arch == ARCH_QWEN3MOE) {
            if ((rc = bind_vec(&b, NAME("attn_q_norm.weight"), HD, false, &L->q_norm, err)) ||
                (rc = bind_vec(&b, NAME("attn_k_norm.weight"), HD, false, &L->k_norm, err)))
                return rc;
        }
        if (hp->arch == ARCH_OLMOE) {
            if ((rc = bind_vec(&b, NAME("attn_q_norm.weight"), QD, false, &L->q_norm, err)) ||
                (rc = bind_vec(&b, NAME("attn_k_norm.weight"), KVD, false, &L->k_norm, err)))
                return rc;
        }
#undef NAME
        m->weight_bytes_per_token += mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo) +
                                     mat_bytes(&L->w_gate) + mat_bytes(&L->w_up) + mat_bytes(&L->w_down) +
                                     mat_bytes(&L->router) + mat_bytes(&L->sh_gate) + mat_bytes(&L->sh_up) +
                                     mat_bytes(&L->sh_down);
        if (L->experts) {
            /* a decode step reads n_expert_used experts of the layer (their average size) */
            uint64_t eb = 0;
            for (int64_t e = 0; e < hp->n_expert; e++)
                eb += mat_bytes(&L->experts[e].gate) + mat_bytes(&L->experts[e].up) + mat_bytes(&L->experts[e].down);
            m->expert_bytes += eb;
            m->weight_bytes_per_token += eb / (uint64_t)hp->n_expert * (uint64_t)hp->n_expert_used;
        }
    }
    /* One decode step reads every layer matrix, the whole output matrix and
     * one embedding row (norms are noise). */
    m->weight_bytes_per_token += mat_bytes(&m->output) + m->tok_embd.row_bytes;

    /* The type holding the most matrix bytes names the file in tables. */
    uint64_t by_type[TYPE_COUNT] = {0};
    for (int64_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &m->layers[l];
        const kern_mat_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->sh_gate,
                                  &L->sh_up, &L->sh_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) by_type[ws[i]->type] += mat_bytes(ws[i]);
        for (int64_t e = 0; L->experts && e < hp->n_expert; e++) {
            const model_expert_t *x = &L->experts[e];
            by_type[x->gate.type] += mat_bytes(&x->gate);
            by_type[x->up.type] += mat_bytes(&x->up);
            by_type[x->down.type] += mat_bytes(&x->down);
        }
    }
    by_type[m->output.type] += mat_bytes(&m->output);
    m->main_type = 0;
    for (int t = 0; t < TYPE_COUNT; t++)
        if (by_type[t] > by_type[m->main_type]) m->main_type = t;
    return 0;
}

model_t *model_load_gguf(gguf_file_t *f, tern_error_t *err) {
    model_t *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        tern_err(err, TERN_ENOMEM, "model: out of memory");
        return NULL;
    }
    m->file = f;
    if (read_hparams(f, &m->hp, err) || bind_tensors(m, err)) {
        model_free(m);
        return NULL;
    }
    return m;
}

model_t *model_load(const char *path, tern_error_t *err) {
    gguf_file_t *f = gguf_open(path, err);
    if (!f) return NULL;
    return model_load_gguf(f, err);
}

int model_expert_cache(model_t *m, const char *path, const ec_params_t *p, bool prefetch, tern_error_t *err) {
    if (!m || m->hp.n_expert <= 0) return tern_err(err, TERN_EINVAL, "expert cache: the model has no experts");
    expert_cache_t *ec = ec_new(m, path, p, err);
    if (!ec) return err ? err->code : TERN_EIO;
    ec_free(m->ec);
    m->ec = ec;
    m->moe_prefetch = prefetch;
    return 0;
}

void model_free(model_t *m) {
    if (!m) return;
    if (m->ec) {
        (void)ec_save_counts(m->ec, NULL);
        ec_free(m->ec);
    }
    gguf_close(m->file);
    tern_free(m->f32_store);
    free(m->layers);
    free(m->expert_store);
    free(m);
}
