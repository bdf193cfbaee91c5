/*
 * mkmodel.c - synthetic models and re-quantization (see mkmodel.h).
 *
 * Shapes and metadata follow what llama.cpp's converter writes for the
 * published models (config.json values of SmolLM2-135M, Qwen2.5-0.5B,
 * Llama-3.2-1B, Qwen3-0.6B, and of the mixtures of experts OLMoE-1B-7B,
 * Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B, Mixtral-8x7B); the tiny shapes are ours,
 * for tests:
 *   tiny        llama, dim 256, ffn 512: every row a multiple of 256, so
 *               the K formats apply without fallback;
 *   tiny-64     llama, dim 64, ffn 128: the shape fallback of the K formats
 *               (Q4_K -> Q5_0 ...) applies to every tensor;
 *   tiny-qwen2  tiny with attn_q/k/v biases (qwen2);
 *   tiny-qwen3  tiny with q/k norms and head_dim 128 != dim / heads (qwen3);
 *   tiny-llama3 tiny with a rope_freqs tensor (llama3 RoPE scaling);
 *   tiny-qwen3moe, tiny-qwen2moe (with a shared expert of width 256),
 *   tiny-olmoe, tiny-mixtral: mixtures of 8 (Mixtral: 4) experts of width
 *               128 (Mixtral: 256), 2 used; the 128-wide ffn_down_exps take
 *               the shape fallback of the K formats, the rest does not.
 *
 * Tensor bytes are produced at write time, a band of rows at a time, by
 * pthreads over disjoint row ranges; each row's random numbers depend only
 * on (seed, tensor name, row), so the file is identical at any thread count.
 */
#define _GNU_SOURCE
#include "dev/mkmodel.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "format/quant.h"

/* ---- shapes ---------------------------------------------------------------------- */

static const mk_shape_t g_shapes[] = {
    /* name, arch, layers, dim, heads, kv heads, head dim, ffn, vocab, ctx, rope base, eps, bias, qk norm, tied,
     * llama3 rope (factor, low, high, original ctx), experts (count, used, width, shared width) */
    {"smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, false, false, true,
     0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen2.5-0.5b", "qwen2", 24, 896, 14, 2, 64, 4864, 151936, 32768, 1000000.0f, 1e-6f, true, false, true,
     0, 0, 0, 0, 0, 0, 0, 0},
    {"llama3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f, false, false, true,
     32.0f, 1.0f, 4.0f, 8192, 0, 0, 0, 0},
    {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, false, true, true,
     0, 0, 0, 0, 0, 0, 0, 0},
    {"olmoe-1b-7b", "olmoe", 16, 2048, 16, 16, 128, 1024, 50304, 4096, 10000.0f, 1e-5f, false, true, false,
     0, 0, 0, 0, 64, 8, 1024, 0},
    {"qwen1.5-moe-a2.7b", "qwen2moe", 24, 2048, 16, 16, 128, 5632, 151936, 8192, 1000000.0f, 1e-6f, true, false,
     false, 0, 0, 0, 0, 60, 4, 1408, 5632},
    {"qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 1000000.0f, 1e-6f, false, true, false,
     0, 0, 0, 0, 128, 8, 768, 0},
    {"mixtral-8x7b", "llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1000000.0f, 1e-5f, false, false, false,
     0, 0, 0, 0, 8, 2, 14336, 0},
    {"tiny", "llama", 2, 256, 4, 2, 64, 512, 512, 1024, 10000.0f, 1e-5f, false, false, true,
     0, 0, 0, 0, 0, 0, 0, 0},
    {"tiny-64", "llama", 2, 64, 4, 2, 16, 128, 512, 1024, 10000.0f, 1e-5f, false, false, true,
     0, 0, 0, 0, 0, 0, 0, 0},
    {"tiny-qwen2", "qwen2", 2, 256, 4, 2, 64, 512, 512, 1024, 1000000.0f, 1e-6f, true, false, true,
     0, 0, 0, 0, 0, 0, 0, 0},
    {"tiny-qwen3", "qwen3", 2, 256, 4, 2, 128, 512, 512, 1024, 1000000.0f, 1e-6f, false, true, true,
     0, 0, 0, 0, 0, 0, 0, 0},
    {"tiny-llama3", "llama", 2, 256, 4, 2, 64, 512, 512, 1024, 500000.0f, 1e-5f, false, false, true,
     32.0f, 1.0f, 4.0f, 8192, 0, 0, 0, 0},
    {"tiny-qwen3moe", "qwen3moe", 2, 256, 4, 2, 128, 512, 512, 1024, 1000000.0f, 1e-6f, false, true, true,
     0, 0, 0, 0, 8, 2, 128, 0},
    {"tiny-qwen2moe", "qwen2moe", 2, 256, 4, 2, 64, 512, 512, 1024, 1000000.0f, 1e-6f, true, false, true,
     0, 0, 0, 0, 8, 2, 128, 256},
    {"tiny-olmoe", "olmoe", 2, 256, 4, 4, 64, 128, 512, 1024, 10000.0f, 1e-5f, false, true, false,
     0, 0, 0, 0, 8, 2, 128, 0},
    {"tiny-mixtral", "llama", 2, 256, 4, 2, 64, 256, 512, 1024, 1000000.0f, 1e-5f, false, false, false,
     0, 0, 0, 0, 4, 2, 256, 0},
};
#define N_SHAPES (int)(sizeof g_shapes / sizeof g_shapes[0])

const mk_shape_t *mk_shape_at(int i) { return i >= 0 && i < N_SHAPES ? &g_shapes[i] : NULL; }

const mk_shape_t *mk_shape_find(const char *name) {
    for (int i = 0; i < N_SHAPES; i++)
        if (!strcasecmp(g_shapes[i].name, name)) return &g_shapes[i];
    return NULL;
}

/* ---- targets ---------------------------------------------------------------------- */

/* general.file_type values are llama.cpp's llama_ftype. A plain K type has
 * no ftype of its own; the nearest (Q4_K_S, Q5_K_S, Q6_K) is stored. */
static const mk_target_t g_targets[] = {
    {"f32", TYPE_F32, false, false, 0, 0},      {"f16", TYPE_F16, false, false, 1, 0},
    {"bf16", TYPE_BF16, false, false, 32, 0},   {"q8_0", TYPE_Q8_0, false, false, 7, 0},
    {"q4_0", TYPE_Q4_0, false, false, 2, 0},    {"q4_1", TYPE_Q4_1, false, false, 3, 0},
    {"q5_0", TYPE_Q5_0, false, false, 8, 0},    {"q5_1", TYPE_Q5_1, false, false, 9, 0},
    {"q4_k", TYPE_Q4_K, false, false, 14, 0},   {"q5_k", TYPE_Q5_K, false, false, 16, 0},
    {"q6_k", TYPE_Q6_K, false, false, 18, 0},   {"q4_k_m", TYPE_Q4_K, true, false, 15, 0},
    {"q5_k_m", TYPE_Q5_K, true, false, 17, 0},
};
#define N_TARGETS (int)(sizeof g_targets / sizeof g_targets[0])

int mk_target_parse(const char *name, mk_target_t *t) {
    for (int i = 0; i < N_TARGETS; i++)
        if (name && !strcasecmp(g_targets[i].name, name)) {
            *t = g_targets[i];
            return 0;
        }
    return TERN_EINVAL;
}

const char *mk_target_names(void) {
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, q5_k_m";
}

/* ---- the type plan ----------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

bool mk_quantizable(const char *name, int n_dims) {
    return n_dims >= 2 && ends_with(name, "weight") && !strstr(name, "_norm.weight") &&
           !strstr(name, "ffn_gate_inp.weight");
}

/* N of a "blk.N." name, or -1. */
static int layer_of(const char *name) {
    int l = -1, k = 0;
    if (sscanf(name, "blk.%d.%n", &l, &k) != 1 || k == 0) return -1;
    return l;
}

static bool is_quantized(int type) { return type != TYPE_F32 && type != TYPE_F16 && type != TYPE_BF16; }

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int fallback(int type, int64_t ne0, int *n_fallback) {
    const quant_traits_t *q = quant_traits(type);
    if (ne0 % q->blck == 0) return type;
    if (n_fallback) (*n_fallback)++;
    int r;
    switch (type) {
    case TYPE_Q4_K: r = TYPE_Q5_0; break;
    case TYPE_Q5_K: r = TYPE_Q5_1; break;
    case TYPE_Q6_K: r = TYPE_Q8_0; break;
    default: r = TYPE_F16; break; /* 32-block types: llama.cpp has no fallback and refuses */
    }
    return ne0 % quant_traits(r)->blck ? TYPE_F16 : r;
}

void mk_plan(const mk_target_t *t, const mk_tinfo_t *ti, int64_t n, int *types, int *n_fallback) {
    bool tied = true, moe = t->n_expert > 1, eight = t->n_expert == 8;
    int n_v = 0, n_down = 0, i_v = 0, i_down = 0, n_layer = 0;
    if (n_fallback) *n_fallback = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!strcmp(ti[i].name, "output.weight")) tied = false;
        if (strstr(ti[i].name, "attn_v.weight")) n_v++;
        if (strstr(ti[i].name, "ffn_down")) n_down++;
        int l = layer_of(ti[i].name);
        if (l >= n_layer) n_layer = l + 1;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *name = ti[i].name;
        if (!mk_quantizable(name, ti[i].n_dims)) {
            types[i] = ti[i].type;
            continue;
        }
        int ty = t->base;
        if (is_quantized(ty)) {
            if (t->pure) {
                /* no rules */
            } else if (!strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight"))) {
                if (ti[i].ne0 % quant_traits(ty)->blck)
                    ty = TYPE_Q8_0;
                else if (ty != TYPE_Q8_0)
                    ty = TYPE_Q6_K;
            } else if (strstr(name, "attn_v.weight")) {
                if (t->mix && use_more_bits(i_v, n_v)) ty = TYPE_Q6_K;
                if (eight) ty = TYPE_Q8_0;
                i_v++;
            } else if (strstr(name, "attn_k.weight")) {
                if (eight) ty = TYPE_Q8_0;
            } else if (strstr(name, "ffn_down")) {
                /* MoE: the layer from the name, out of all layers */
                int il = i_down, nl = n_down, l = layer_of(name);
                if (moe && l >= 0) il = l, nl = n_layer;
                if (t->mix && use_more_bits(il, nl)) ty = TYPE_Q6_K;
                i_down++;
            } else if (strstr(name, "attn_output.weight")) {
                if (eight && t->mix && t->base == TYPE_Q4_K) ty = TYPE_Q5_K;
            } else if (t->mix && strstr(name, "attn_qkv.weight")) {
                ty = t->base == TYPE_Q4_K ? TYPE_Q5_K : TYPE_Q6_K;
            }
            ty = fallback(ty, ti[i].ne0, n_fallback);
        }
        types[i] = ty;
    }
}

/* ---- tensors of a shape -------------------------------------------------------------- */

/* One tensor: fmt takes the layer and, for split experts, the expert. */
static void desc3(mk_tdesc_t *out, int64_t cap, int64_t *k, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                  const char *fmt, int layer, int expert) {
    if (*k < cap) {
        mk_tdesc_t *d = &out[*k];
        snprintf(d->name, sizeof d->name, fmt, layer, expert);
        d->n_dims = n_dims;
        d->ne[0] = ne0;
        d->ne[1] = n_dims > 1 ? ne1 : 1;
        d->ne[2] = n_dims > 2 ? ne2 : 1;
        d->ne[3] = 1;
    }
    (*k)++;
}

static void desc(mk_tdesc_t *out, int64_t cap, int64_t *k, int n_dims, int64_t ne0, int64_t ne1, const char *fmt,
                 int layer) {
    desc3(out, cap, k, n_dims, ne0, ne1, 1, fmt, layer, 0);
}

int64_t mk_shape_tensors(const mk_shape_t *s, int64_t n_vocab, mk_tdesc_t *out, int64_t cap) {
    return mk_shape_tensors_opt(s, n_vocab, false, out, cap);
}

int64_t mk_shape_tensors_opt(const mk_shape_t *s, int64_t n_vocab, bool split_experts, mk_tdesc_t *out,
                             int64_t cap) {
    int64_t k = 0, D = s->n_embd, QD = s->n_head * s->head_dim, KVD = s->n_head_kv * s->head_dim;
    int64_t NE = s->n_expert, FE = s->n_ff_exp, FS = s->n_ff_shexp;
    bool olmoe = !strcmp(s->arch, "olmoe");
    split_experts = split_experts && NE > 0 && !strcmp(s->arch, "llama");
    desc(out, cap, &k, 2, D, n_vocab, "token_embd.weight", 0);
    if (s->rope_factor > 0) desc(out, cap, &k, 1, s->head_dim / 2, 1, "rope_freqs.weight", 0);
    for (int l = 0; l < s->n_layer; l++) {
        desc(out, cap, &k, 1, D, 1, "blk.%d.attn_norm.weight", l);
        desc(out, cap, &k, 2, D, QD, "blk.%d.attn_q.weight", l);
        if (s->qkv_bias) desc(out, cap, &k, 1, QD, 1, "blk.%d.attn_q.bias", l);
        desc(out, cap, &k, 2, D, KVD, "blk.%d.attn_k.weight", l);
        if (s->qkv_bias) desc(out, cap, &k, 1, KVD, 1, "blk.%d.attn_k.bias", l);
        desc(out, cap, &k, 2, D, KVD, "blk.%d.attn_v.weight", l);
        if (s->qkv_bias) desc(out, cap, &k, 1, KVD, 1, "blk.%d.attn_v.bias", l);
        if (s->qk_norm) {
            desc(out, cap, &k, 1, olmoe ? QD : s->head_dim, 1, "blk.%d.attn_q_norm.weight", l);
            desc(out, cap, &k, 1, olmoe ? KVD : s->head_dim, 1, "blk.%d.attn_k_norm.weight", l);
        }
        desc(out, cap, &k, 2, QD, D, "blk.%d.attn_output.weight", l);
        desc(out, cap, &k, 1, D, 1, "blk.%d.ffn_norm.weight", l);
        if (NE == 0) {
            desc(out, cap, &k, 2, D, s->n_ff, "blk.%d.ffn_gate.weight", l);
            desc(out, cap, &k, 2, D, s->n_ff, "blk.%d.ffn_up.weight", l);
            desc(out, cap, &k, 2, s->n_ff, D, "blk.%d.ffn_down.weight", l);
            continue;
        }
        desc(out, cap, &k, 2, D, NE, "blk.%d.ffn_gate_inp.weight", l);
        if (split_experts) {
            for (int e = 0; e < (int)NE; e++) {
                desc3(out, cap, &k, 2, D, FE, 1, "blk.%d.ffn_gate.%d.weight", l, e);
                desc3(out, cap, &k, 2, D, FE, 1, "blk.%d.ffn_up.%d.weight", l, e);
                desc3(out, cap, &k, 2, FE, D, 1, "blk.%d.ffn_down.%d.weight", l, e);
            }
        } else {
            desc3(out, cap, &k, 3, D, FE, NE, "blk.%d.ffn_gate_exps.weight", l, 0);
            desc3(out, cap, &k, 3, D, FE, NE, "blk.%d.ffn_up_exps.weight", l, 0);
            desc3(out, cap, &k, 3, FE, D, NE, "blk.%d.ffn_down_exps.weight", l, 0);
        }
        if (FS > 0) {
            desc(out, cap, &k, 1, D, 1, "blk.%d.ffn_gate_inp_shexp.weight", l);
            desc(out, cap, &k, 2, D, FS, "blk.%d.ffn_gate_shexp.weight", l);
            desc(out, cap, &k, 2, D, FS, "blk.%d.ffn_up_shexp.weight", l);
            desc(out, cap, &k, 2, FS, D, "blk.%d.ffn_down_shexp.weight", l);
        }
    }
    desc(out, cap, &k, 1, D, 1, "output_norm.weight", 0);
    if (!s->tied) desc(out, cap, &k, 2, D, n_vocab, "output.weight", 0);
    return k;
}

/* ---- row conversion ------------------------------------------------------------------- */

static int row_to_float(int type, const void *src, float *dst, int64_t n) {
    if (type == TYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (type == TYPE_F16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_f32(h[i]);
    } else if (type == TYPE_BF16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(h[i]);
    } else {
        return quant_dequantize_row(type, src, dst, n);
    }
    return 0;
}

static int row_from_float(int type, const float *src, void *dst, int64_t n) {
    if (type == TYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (type == TYPE_F16) {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_fp16(src[i]);
    } else if (type == TYPE_BF16) {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]);
    } else {
        return quant_quantize_row(type, src, dst, n);
    }
    return 0;
}

/* ---- random numbers ---------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *name; name++) h = (h ^ (uint8_t)*name) * 1099511628211ull;
    uint64_t s = h;
    return splitmix(&s);
}

/* Mixtures of experts: what makes random weights route like a trained
 * model across a stream of tokens. With every matrix at std 1/sqrt(fan-in)
 * each attention and FFN branch adds about unit-size elements to a residual
 * stream whose embedding elements are 1/sqrt(dim) small; after a layer or
 * two the stream of every token is mostly the attention's average over
 * the positions before it, the routers see nearly the same input for every
 * token, and a few experts per layer take most of them (measured: 60% of
 * Qwen3-30B-A3B's experts held 97-98% of the uses). Here the token's own
 * embedding dominates instead: its elements at std 1, and each branch's
 * output projection (attn_output, ffn_down*) scaled by 1 / (2 n_layer), so
 * all branches together stay below it. Routing then follows the token, and
 * random tokens spread over the experts (near uniform, as the issue's
 * baseline assumes; --router-skew adds the popularity). Speed does not
 * depend on the values. Not where the output matrix is the embedding
 * (tied: the tiny test shapes tiny-qwen3moe, tiny-qwen2moe): a residual
 * that is mostly the token's own embedding would predict that token again
 * and again. */
static float moe_std_factor(const char *name, int64_t ne0, int n_layer) {
    if (!strcmp(name, "token_embd.weight")) return (float)sqrt((double)ne0);
    if (strstr(name, ".attn_output.") || strstr(name, ".ffn_down")) return 1.0f / (2.0f * (float)n_layer);
    return 1.0f;
}

/* n normals N(0, std^2) by Box-Muller from the stream of row `row`. */
static void randn_row(uint64_t key, int64_t row, float std, float *x, int64_t n) {
    uint64_t s = key ^ ((uint64_t)row * 0xd1342543de82ef95ull);
    splitmix(&s);
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((splitmix(&s) >> 11) + 1.0) * (1.0 / 9007199254740992.0); /* (0, 1] */
        double u2 = (splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1)) * std;
        x[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(6.283185307179586 * u2));
    }
}

void mk_router_scales(uint64_t seed, int layer, int64_t n_expert, float skew, float *scale) {
    /* rank[e] by a Fisher-Yates shuffle from the stream of (seed, layer);
     * scale[e] = (1 + rank[e])^-skew. The ranks go through scale[] itself. */
    uint64_t s = name_key(seed, "router-skew") ^ ((uint64_t)(uint32_t)layer * 0x9e3779b97f4a7c15ull);
    splitmix(&s);
    for (int64_t e = 0; e < n_expert; e++) scale[e] = (float)e;
    for (int64_t i = n_expert - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix(&s) % (uint64_t)(i + 1));
        float t = scale[i];
        scale[i] = scale[j];
        scale[j] = t;
    }
    for (int64_t e = 0; e < n_expert; e++) scale[e] = skew == 0 ? 1.0f : (float)pow(1.0 + scale[e], -(double)skew);
}

/* ---- the fill callback: sources of rows ----------------------------------------------------- */

typedef enum { SRC_RANDN, SRC_ONES, SRC_VALUES, SRC_TENSOR } src_kind_t;

typedef struct {
    src_kind_t kind;
    int type;        /* destination type */
    int64_t ne0;
    uint64_t key;    /* SRC_RANDN */
    float std;
    const float *row_scale; /* SRC_RANDN: NULL, or a factor per row (the router skew) */
    const float *values; /* SRC_VALUES: ne0 * rows floats */
    const uint8_t *src;  /* SRC_TENSOR */
    int src_type;
    size_t src_row;
    int n_threads;
    int verbose;
    int64_t index, count; /* progress */
} fill_t;

typedef struct {
    const fill_t *f;
    int64_t r0, r1; /* absolute rows */
    int64_t band0;  /* first row of the band */
    uint8_t *dst;
    size_t dst_row;
    int rc;
} job_t;

static void *fill_job(void *arg) {
    job_t *j = arg;
    const fill_t *f = j->f;
    float *x = malloc((size_t)f->ne0 * sizeof(float));
    if (!x) {
        j->rc = TERN_ENOMEM;
        return NULL;
    }
    for (int64_t r = j->r0; r < j->r1 && !j->rc; r++) {
        switch (f->kind) {
        case SRC_RANDN:
            randn_row(f->key, r, f->std, x, f->ne0);
            if (f->row_scale)
                for (int64_t i = 0; i < f->ne0; i++) x[i] *= f->row_scale[r];
            break;
        case SRC_ONES:
            for (int64_t i = 0; i < f->ne0; i++) x[i] = 1.0f;
            break;
        case SRC_VALUES: memcpy(x, f->values + r * f->ne0, (size_t)f->ne0 * sizeof(float)); break;
        case SRC_TENSOR:
            if (row_to_float(f->src_type, f->src + (size_t)r * f->src_row, x, f->ne0)) j->rc = TERN_EUNSUP;
            break;
        }
        if (!j->rc && row_from_float(f->type, x, j->dst + (size_t)(r - j->band0) * j->dst_row, f->ne0))
            j->rc = TERN_EUNSUP;
    }
    free(x);
    return NULL;
}

static int fill_rows(void *ctx, const char *name, int64_t row0, int64_t n_rows, void *dst, tern_error_t *err) {
    const fill_t *f = ctx;
    if (f->verbose >= 2 && row0 == 0)
        fprintf(stderr, "[%4" PRId64 "/%4" PRId64 "] %-32s %-5s\n", f->index + 1, f->count, name, quant_name(f->type));
    int nt = f->n_threads;
    /* Threads pay off only for real work: about 64K elements each. */
    int64_t work = n_rows * f->ne0;
    if (nt > 1 && work / nt < 65536) nt = (int)(work / 65536) > 1 ? (int)(work / 65536) : 1;
    if (nt > n_rows) nt = (int)n_rows;
    job_t jobs[64];
    pthread_t th[64];
    bool started[64] = {false};
    size_t dst_row = quant_row_size(f->type, f->ne0);
    for (int t = 0; t < nt; t++) {
        jobs[t] = (job_t){f, row0 + n_rows * t / nt, row0 + n_rows * (t + 1) / nt, row0, dst, dst_row, 0};
        if (t > 0) started[t] = pthread_create(&th[t], NULL, fill_job, &jobs[t]) == 0;
    }
    fill_job(&jobs[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            fill_job(&jobs[t]); /* could not start a thread: do its share here */
    }
    for (int t = 0; t < nt; t++)
        if (jobs[t].rc == TERN_ENOMEM) return tern_err(err, TERN_ENOMEM, "tensor '%s': out of memory", name);
        else if (jobs[t].rc) {
            const char *s = f->kind == SRC_TENSOR ? quant_name(f->src_type) : "f32";
            return tern_err(err, TERN_EUNSUP, "tensor '%s': converting %s to %s is not available in this build", name,
                            s, quant_name(f->type));
        }
    return 0;
}

static int default_threads(int n) {
    if (n > 0) return n > 64 ? 64 : n;
    const char *e = getenv("TERN_THREADS");
    if (e && atoi(e) > 0) return atoi(e) > 64 ? 64 : atoi(e);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c < 1 ? 1 : c > 64 ? 64 : (int)c;
}

/* ---- the byte-level stand-in vocabulary ------------------------------------------------------ */

/* SPM ("llama") vocabulary that the tokenizer can load: <unk>, <s>, </s>,
 * the 256 byte tokens <0x00>..<0xFF> (type 6), then filler pieces: every
 * string over a-z of length 1, 2, 3, 4 ..., first with the SPM space mark
 * U+2581 in front, then without, until n_vocab. Scores fall with the index
 * so shorter pieces rank first. */
static int standin_vocab(gguf_writer_t *w, int64_t n_vocab, tern_error_t *err) {
    if (n_vocab < 259) return tern_err(err, TERN_EINVAL, "vocab size %" PRId64 " below the 259 base tokens", n_vocab);
    char *arena = malloc((size_t)n_vocab * 16);
    const char **tok = malloc((size_t)n_vocab * sizeof *tok);
    float *score = malloc((size_t)n_vocab * sizeof *score);
    int32_t *type = malloc((size_t)n_vocab * sizeof *type);
    int rc = 0;
    if (!arena || !tok || !score || !type) {
        rc = tern_err(err, TERN_ENOMEM, "out of memory building the vocabulary");
        goto done;
    }
    char *p = arena;
    int64_t k = 0;
    static const char *specials[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++, k++) {
        tok[k] = specials[i];
        score[k] = 0;
        type[k] = i == 0 ? 2 : 3; /* unknown, control */
    }
    for (int b = 0; b < 256; b++, k++) {
        snprintf(p, 16, "<0x%02X>", b);
        tok[k] = p;
        p += strlen(p) + 1;
        score[k] = 0;
        type[k] = 6;
    }
    for (int len = 1; k < n_vocab && len <= 8; len++) {
        int64_t combos = 1;
        for (int i = 0; i < len; i++) combos *= 26;
        for (int mark = 1; mark >= 0 && k < n_vocab; mark--)
            for (int64_t c = 0; c < combos && k < n_vocab; c++, k++) {
                char *s = p;
                if (mark) {
                    memcpy(p, "\xe2\x96\x81", 3);
                    p += 3;
                }
                int64_t v = c;
                for (int i = len - 1; i >= 0; i--) {
                    p[i] = (char)('a' + v % 26);
                    v /= 26;
                }
                p += len;
                *p++ = 0;
                tok[k] = s;
                score[k] = -(float)(k - 258);
                type[k] = 1;
            }
    }
    if ((rc = gguf_w_str(w, "tokenizer.ggml.model", "llama")) ||
        (rc = gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, NULL, (uint64_t)n_vocab)) ||
        (rc = gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, score, (uint64_t)n_vocab)) ||
        (rc = gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, type, (uint64_t)n_vocab)) ||
        (rc = gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1)) || (rc = gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
        (rc = gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
        (rc = gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true)) ||
        (rc = gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false)))
        rc = tern_err(err, rc, "%s", gguf_writer_errmsg(w));
done:
    free(arena);
    free(tok);
    free(score);
    free(type);
    return rc;
}

static bool not_tokenizer(const char *key) { return strncmp(key, "tokenizer.", 10) != 0; }

/* ---- mkmodel ------------------------------------------------------------------------------------ */

/* llama.cpp's llama3 rope_freqs: the factor each inverse frequency is divided
 * by (1 for short wavelengths, `factor` for long ones, smooth between). */
static void llama3_rope_freqs(const mk_shape_t *s, float *out) {
    int64_t half = s->head_dim / 2;
    double lo_wl = (double)s->rope_orig_ctx / s->rope_low_freq, hi_wl = (double)s->rope_orig_ctx / s->rope_high_freq;
    for (int64_t i = 0; i < half; i++) {
        double freq = 1.0 / pow(s->rope_base, (double)(2 * i) / (double)s->head_dim);
        double wl = 2.0 * M_PI / freq;
        if (wl < hi_wl)
            out[i] = 1.0f;
        else if (wl > lo_wl)
            out[i] = s->rope_factor;
        else {
            double smooth = ((double)s->rope_orig_ctx / wl - s->rope_low_freq) / (s->rope_high_freq - s->rope_low_freq);
            out[i] = (float)(1.0 / ((1.0 - smooth) / s->rope_factor + smooth));
        }
    }
}

#define W(call)                                                             \
    do {                                                                    \
        if ((rc = (call)) != 0) {                                           \
            rc = tern_err(err, rc, "%s", gguf_writer_errmsg(w));            \
            goto done;                                                      \
        }                                                                   \
    } while (0)

static void print_plan(const char *what, const int *types, int64_t n, int n_fallback) {
    uint64_t count[TYPE_COUNT] = {0};
    for (int64_t i = 0; i < n; i++) count[types[i]]++;
    fprintf(stderr, "%s: %" PRId64 " tensors:", what, n);
    for (int t = 0; t < TYPE_COUNT; t++)
        if (count[t]) fprintf(stderr, " %s %" PRIu64, quant_name(t), count[t]);
    if (n_fallback) fprintf(stderr, " (%d shape fallbacks)", n_fallback);
    fputc('\n', stderr);
}

/* ---- progress on a terminal ---------------------------------------------------------------- */

/* One line on stderr, rewritten at most 4 times a second: bytes written of
 * the total, rate, time left; a newline when the write ends. Only when
 * stderr is a terminal (tests and logs stay quiet), and only once a write has
 * run 250 ms (a small file shows nothing). */
typedef struct {
    const char *what;
    uint64_t t0, last_ns;
    bool shown;
} progress_t;

static void fmt_bytes(char *b, size_t n, double x) {
    if (x >= 1e9)
        snprintf(b, n, "%.2f GB", x / 1e9);
    else
        snprintf(b, n, "%.1f MB", x / 1e6);
}

static void fmt_secs(char *b, size_t n, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(b, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(b, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(b, n, "%lds", t);
}

static void progress_cb(void *ctx, uint64_t done, uint64_t total, bool last) {
    progress_t *p = ctx;
    uint64_t now = tern_now_ns();
    if (!last && (now - p->t0 < 250000000u || now - p->last_ns < 250000000u)) return;
    if (last && !p->shown) return;
    p->last_ns = now;
    p->shown = true;
    double sec = (double)(now - p->t0) / 1e9, rate = sec > 0 ? (double)done / sec : 0;
    char a[32], b[32], left[32] = "";
    fmt_bytes(a, sizeof a, (double)done);
    fmt_bytes(b, sizeof b, (double)total);
    if (last)
        snprintf(left, sizeof left, "%s", done == total ? "done" : "stopped");
    else if (rate > 0) {
        fmt_secs(left, sizeof left, (double)(total - done) / rate);
        strcat(left, " left");
    }
    fprintf(stderr, "\r%s: %s / %s (%.1f%%), %.0f MB/s, %s\033[K%s", p->what, a, b,
            total ? 100.0 * (double)done / (double)total : 100.0, rate / 1e6, left, last ? "\n" : "");
    fflush(stderr);
}

/* Progress for verbose level 1 on a terminal (level 2 prints a line per tensor instead). */
static void progress_attach(gguf_writer_t *w, progress_t *p, const char *what, int verbose) {
    if (verbose != 1 || !isatty(STDERR_FILENO)) return;
    *p = (progress_t){what, tern_now_ns(), 0, false};
    gguf_writer_set_progress(w, progress_cb, p);
}

int mk_model_write(const mk_opts_t *o, tern_error_t *err) {
    const mk_shape_t *s = mk_shape_find(o->shape ? o->shape : "");
    if (!s) {
        char names[1024];
        size_t k = 0;
        for (int i = 0; i < N_SHAPES; i++)
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", g_shapes[i].name);
        return tern_err(err, TERN_EINVAL, "unknown shape '%s' (known: %s)", o->shape ? o->shape : "", names);
    }
    mk_target_t tg;
    if (mk_target_parse(o->type, &tg))
        return tern_err(err, TERN_EINVAL, "unknown type '%s' (known: %s)", o->type ? o->type : "", mk_target_names());
    tg.pure = o->pure;
    tg.n_expert = s->n_expert;
    if (!o->out) return tern_err(err, TERN_EINVAL, "no output file");
    if (o->split_experts && (s->n_expert == 0 || strcmp(s->arch, "llama")))
        return tern_err(err, TERN_EINVAL,
                        "split experts: shape '%s' (%s%s) is not a llama-arch mixture of experts (Mixtral)", s->name,
                        s->arch, s->n_expert ? "" : ", dense");
    if (!(o->router_skew >= 0 && o->router_skew <= 100))
        return tern_err(err, TERN_EINVAL, "router skew %g outside 0..100", (double)o->router_skew);

    int rc = 0;
    gguf_file_t *vf = NULL;
    gguf_writer_t *w = gguf_writer_new(32);
    mk_tdesc_t *d = NULL;
    mk_tinfo_t *ti = NULL;
    int *types = NULL;
    fill_t *fills = NULL;
    float *rope = NULL, *router = NULL;
    progress_t prog;
    if (!w) return tern_err(err, TERN_ENOMEM, "out of memory");

    int64_t n_vocab = s->n_vocab;
    if (o->vocab_from) {
        if (!(vf = gguf_open(o->vocab_from, err))) {
            rc = err ? err->code : TERN_EFORMAT;
            goto done;
        }
        const gguf_kv_t *toks = gguf_find(vf, "tokenizer.ggml.tokens");
        if (!toks || gguf_arr_type(toks) != GGUF_STRING || gguf_arr_len(toks) == 0) {
            rc = tern_err(err, TERN_EFORMAT, "%s: no tokenizer.ggml.tokens string array", o->vocab_from);
            goto done;
        }
        if ((int64_t)gguf_arr_len(toks) != n_vocab) {
            fprintf(stderr, "mkmodel: vocab size %" PRIu64 " from %s replaces the shape's %" PRId64 "\n",
                    gguf_arr_len(toks), o->vocab_from, n_vocab);
            n_vocab = (int64_t)gguf_arr_len(toks);
        }
    }

    char key[128];
#define AK(suffix) (snprintf(key, sizeof key, "%s.%s", s->arch, suffix), key)
    W(gguf_w_str(w, "general.architecture", s->arch));
    W(gguf_w_str(w, "general.type", "model"));
    W(gguf_w_str(w, "general.name", s->name));
    char descr[160];
    snprintf(descr, sizeof descr, "tern mkmodel: random weights, seed %" PRIu64 ", shape %s, type %s%s", o->seed,
             s->name, tg.name, tg.pure ? " (pure)" : "");
    W(gguf_w_str(w, "general.description", descr));
    W(gguf_w_u32(w, AK("block_count"), (uint32_t)s->n_layer));
    W(gguf_w_u32(w, AK("context_length"), (uint32_t)s->n_ctx));
    W(gguf_w_u32(w, AK("embedding_length"), (uint32_t)s->n_embd));
    W(gguf_w_u32(w, AK("feed_forward_length"), (uint32_t)s->n_ff));
    W(gguf_w_u32(w, AK("attention.head_count"), (uint32_t)s->n_head));
    W(gguf_w_u32(w, AK("attention.head_count_kv"), (uint32_t)s->n_head_kv));
    W(gguf_w_f32(w, AK("rope.freq_base"), s->rope_base));
    W(gguf_w_f32(w, AK("attention.layer_norm_rms_epsilon"), s->rms_eps));
    W(gguf_w_u32(w, AK("attention.key_length"), (uint32_t)s->head_dim));
    W(gguf_w_u32(w, AK("attention.value_length"), (uint32_t)s->head_dim));
    W(gguf_w_u32(w, "general.file_type", tg.ftype));
    W(gguf_w_u32(w, AK("vocab_size"), (uint32_t)n_vocab));
    W(gguf_w_u32(w, AK("rope.dimension_count"), (uint32_t)s->head_dim));
    if (s->n_expert > 0) {
        W(gguf_w_u32(w, AK("expert_count"), (uint32_t)s->n_expert));
        W(gguf_w_u32(w, AK("expert_used_count"), (uint32_t)s->n_expert_used));
        /* olmoe and Mixtral: the expert width is feed_forward_length */
        if (!strcmp(s->arch, "qwen2moe") || !strcmp(s->arch, "qwen3moe"))
            W(gguf_w_u32(w, AK("expert_feed_forward_length"), (uint32_t)s->n_ff_exp));
        if (s->n_ff_shexp > 0) W(gguf_w_u32(w, AK("expert_shared_feed_forward_length"), (uint32_t)s->n_ff_shexp));
    }
    if (is_quantized(tg.base)) W(gguf_w_u32(w, "general.quantization_version", 2));
#undef AK
    if (vf) {
        W(gguf_w_copy_kv(w, vf, not_tokenizer));
    } else if ((rc = standin_vocab(w, n_vocab, err))) {
        goto done;
    }

    int64_t n = mk_shape_tensors_opt(s, n_vocab, o->split_experts, NULL, 0);
    d = calloc((size_t)n, sizeof *d);
    ti = calloc((size_t)n, sizeof *ti);
    types = calloc((size_t)n, sizeof *types);
    fills = calloc((size_t)n, sizeof *fills);
    rope = calloc((size_t)(s->head_dim / 2 + 1), sizeof *rope);
    router = calloc((size_t)(s->n_layer * s->n_expert + 1), sizeof *router);
    if (!d || !ti || !types || !fills || !rope || !router) {
        rc = tern_err(err, TERN_ENOMEM, "out of memory");
        goto done;
    }
    mk_shape_tensors_opt(s, n_vocab, o->split_experts, d, n);
    for (int l = 0; l < s->n_layer && s->n_expert > 0; l++)
        mk_router_scales(o->seed, l, s->n_expert, o->router_skew, router + (int64_t)l * s->n_expert);
    for (int64_t i = 0; i < n; i++) ti[i] = (mk_tinfo_t){d[i].name, d[i].n_dims, d[i].ne[0], TYPE_F32};
    int n_fallback = 0;
    mk_plan(&tg, ti, n, types, &n_fallback);
    if (s->rope_factor > 0) llama3_rope_freqs(s, rope);

    int nt = default_threads(o->n_threads);
    for (int64_t i = 0; i < n; i++) {
        fill_t *f = &fills[i];
        f->type = types[i];
        f->ne0 = d[i].ne[0];
        f->n_threads = nt;
        f->verbose = o->verbose;
        f->index = i;
        f->count = n;
        if (ends_with(d[i].name, "_norm.weight")) {
            f->kind = SRC_ONES;
        } else if (!strcmp(d[i].name, "rope_freqs.weight")) {
            f->kind = SRC_VALUES;
            f->values = rope;
        } else {
            f->kind = SRC_RANDN;
            f->key = name_key(o->seed, d[i].name);
            f->std = ends_with(d[i].name, ".bias") ? 0.02f : (float)(1.0 / sqrt((double)d[i].ne[0]));
            if (s->n_expert > 0 && !s->tied) f->std *= moe_std_factor(d[i].name, d[i].ne[0], s->n_layer);
            if (o->router_skew > 0 && ends_with(d[i].name, ".ffn_gate_inp.weight"))
                f->row_scale = router + (int64_t)layer_of(d[i].name) * s->n_expert;
        }
        W(gguf_w_tensor_fill(w, d[i].name, types[i], d[i].n_dims, d[i].ne, fill_rows, f));
    }
    if (o->verbose) print_plan(tg.name, types, n, n_fallback);
    progress_attach(w, &prog, "mkmodel", o->verbose);
    uint64_t t0 = tern_now_ns();
    if ((rc = gguf_writer_write(w, o->out, err))) goto done;
    if (o->verbose >= 2) {
        struct stat st;
        if (stat(o->out, &st) == 0)
            fprintf(stderr, "mkmodel: wrote %s (%lld bytes) in %.1f s with %d threads\n", o->out, (long long)st.st_size,
                    (double)(tern_now_ns() - t0) / 1e9, nt);
    }
done:
    gguf_writer_free(w);
    gguf_close(vf);
    free(d);
    free(ti);
    free(types);
    free(fills);
    free(rope);
    free(router);
    return rc;
}

/* ---- quantize ------------------------------------------------------------------------------------ */

static bool skip_ftype(const char *key) {
    return !strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version");
}

int mk_quantize_file(const char *in, const char *out, const char *type, bool pure, int n_threads, int verbose,
                     tern_error_t *err) {
    mk_target_t tg;
    if (mk_target_parse(type, &tg))
        return tern_err(err, TERN_EINVAL, "unknown type '%s' (known: %s)", type ? type : "", mk_target_names());
    tg.pure = pure;
    struct stat a, b;
    if (stat(in, &a) == 0 && stat(out, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return tern_err(err, TERN_EINVAL, "output %s is the input file", out);
    gguf_file_t *f = gguf_open(in, err);
    if (!f) return err ? err->code : TERN_EFORMAT;
    int rc = 0;
    int64_t n = gguf_n_tensors(f);
    mk_tinfo_t *ti = calloc((size_t)(n ? n : 1), sizeof *ti);
    int *types = calloc((size_t)(n ? n : 1), sizeof *types);
    fill_t *fills = calloc((size_t)(n ? n : 1), sizeof *fills);
    gguf_writer_t *w = gguf_writer_new(gguf_alignment(f));
    if (!ti || !types || !fills || !w) {
        rc = tern_err(err, TERN_ENOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        ti[i] = (mk_tinfo_t){t->name, t->n_dims, t->ne[0], t->type};
    }
    uint64_t n_expert = 0;
    if (gguf_get_arch_u64(f, "expert_count", &n_expert, NULL)) n_expert = 0; /* absent: dense */
    tg.n_expert = (int64_t)n_expert;
    int n_fallback = 0;
    mk_plan(&tg, ti, n, types, &n_fallback);

    W(gguf_w_copy_kv(w, f, skip_ftype));
    W(gguf_w_u32(w, "general.file_type", tg.ftype));
    bool any_q = false;
    for (int64_t i = 0; i < n; i++) any_q |= is_quantized(types[i]);
    if (any_q) W(gguf_w_u32(w, "general.quantization_version", 2));

    int nt = default_threads(n_threads);
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        if (types[i] == t->type) { /* unchanged: copied straight from the mapping */
            W(gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size));
            continue;
        }
        fill_t *fl = &fills[i];
        fl->kind = SRC_TENSOR;
        fl->type = types[i];
        fl->ne0 = t->ne[0];
        fl->src = t->data;
        fl->src_type = t->type;
        fl->src_row = quant_row_size(t->type, t->ne[0]);
        fl->n_threads = nt;
        fl->verbose = verbose;
        fl->index = i;
        fl->count = n;
        W(gguf_w_tensor_fill(w, t->name, types[i], t->n_dims, t->ne, fill_rows, fl));
    }
    if (verbose) print_plan(tg.name, types, n, n_fallback);
    progress_t prog;
    progress_attach(w, &prog, "quantize", verbose);
    rc = gguf_writer_write(w, out, err);
done:
    gguf_writer_free(w);
    free(ti);
    free(types);
    free(fills);
    gguf_close(f);
    return rc;
}
