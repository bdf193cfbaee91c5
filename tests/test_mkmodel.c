/* test_mkmodel.c - synthetic models and re-quantization: every type on the
 * tiny shapes loads back with llama.cpp's names, shapes, metadata and the
 * planned types; the Q4_K_M / Q5_K_M plans match the counts of real
 * llama.cpp files (../shared/reference/quant-layouts.md) and, tensor by
 * tensor, the llama.cpp-quantized stories260K-Q4_K_M.gguf; `quantize` of an
 * F32 file reproduces mkmodel's bytes. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "dev/mkmodel.h"
#include "format/quant.h"

static const char *all_targets[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0",   "q4_1",  "q5_0",
                                    "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"};
#define N_TARGETS (int)(sizeof all_targets / sizeof all_targets[0])

static char *tmp_path(const char *tag) {
    static char p[8][256];
    static int k;
    char *s = p[k++ & 7];
    snprintf(s, 256, "/tmp/tern_test_mkmodel_%d_%s.gguf", (int)getpid(), tag);
    return s;
}

static gguf_file_t *make(const char *shape, const char *type, const char *tag, uint64_t seed, int threads,
                         const char *vocab_from) {
    mk_opts_t o = {shape, type, tmp_path(tag), vocab_from, seed, false, threads, 0};
    tern_error_t err = {0};
    if (mk_model_write(&o, &err) != 0) fail_msg("mkmodel %s %s: %s", shape, type, err.msg);
    gguf_file_t *f = gguf_open(o.out, &err);
    if (!f) fail_msg("reading back %s %s: %s", shape, type, err.msg);
    return f;
}

/* Effective bits of precision of a type's values (mantissa bits for the
 * floats, quant bits for the blocks): the error bound below is 2^(2-bits)
 * of the weights' RMS, a few steps of the quantization grid. */
static int type_bits(int t) {
    switch (t) {
    case TYPE_F16: return 11;
    case TYPE_BF16: return 8;
    case TYPE_Q8_0: return 8;
    case TYPE_Q6_K: return 6;
    case TYPE_Q5_0: case TYPE_Q5_1: case TYPE_Q5_K: return 5;
    default: return 4;
    }
}

static void to_float(const gguf_tensor_t *t, int64_t row, float *x) {
    size_t rs = quant_row_size(t->type, t->ne[0]);
    const uint8_t *p = (const uint8_t *)t->data + (size_t)row * rs;
    if (t->type == TYPE_F32)
        memcpy(x, p, (size_t)t->ne[0] * 4);
    else if (t->type == TYPE_F16)
        for (int64_t i = 0; i < t->ne[0]; i++) x[i] = fp16_to_f32(((const uint16_t *)p)[i]);
    else if (t->type == TYPE_BF16)
        for (int64_t i = 0; i < t->ne[0]; i++) x[i] = bf16_to_f32(((const uint16_t *)p)[i]);
    else
        assert_int_equal(quant_dequantize_row(t->type, p, x, t->ne[0]), 0);
}

/* Names, shapes, metadata and types of a file against the shape and plan. */
static void check_file(gguf_file_t *f, const mk_shape_t *s, const char *type, int64_t n_vocab) {
    tern_error_t err = {0};
    assert_string_equal(gguf_arch(f), s->arch);
    uint64_t v;
    float fl;
    static const struct {
        const char *k;
        size_t off;
    } keys[] = {
        {"block_count", offsetof(mk_shape_t, n_layer)},
        {"embedding_length", offsetof(mk_shape_t, n_embd)},
        {"attention.head_count", offsetof(mk_shape_t, n_head)},
        {"attention.head_count_kv", offsetof(mk_shape_t, n_head_kv)},
        {"attention.key_length", offsetof(mk_shape_t, head_dim)},
        {"feed_forward_length", offsetof(mk_shape_t, n_ff)},
        {"context_length", offsetof(mk_shape_t, n_ctx)},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (gguf_get_arch_u64(f, keys[i].k, &v, &err)) fail_msg("%s", err.msg);
        assert_int_equal(v, *(const int64_t *)((const char *)s + keys[i].off));
    }
    assert_int_equal(gguf_get_arch_u64(f, "vocab_size", &v, &err), 0);
    assert_int_equal(v, n_vocab);
    assert_int_equal(gguf_get_arch_f32(f, "rope.freq_base", &fl, &err), 0);
    assert_true(fl == s->rope_base);
    assert_int_equal(gguf_get_arch_f32(f, "attention.layer_norm_rms_epsilon", &fl, &err), 0);
    assert_true(fl == s->rms_eps);
    mk_target_t tg;
    assert_int_equal(mk_target_parse(type, &tg), 0);
    assert_int_equal(gguf_get_u64(f, "general.file_type", &v, &err), 0);
    assert_int_equal(v, tg.ftype);
    assert_int_equal(gguf_arr_len(gguf_find(f, "tokenizer.ggml.tokens")), n_vocab);

    int64_t n = mk_shape_tensors(s, n_vocab, NULL, 0);
    mk_tdesc_t *d = calloc((size_t)n, sizeof *d);
    mk_tinfo_t *ti = calloc((size_t)n, sizeof *ti);
    int *types = calloc((size_t)n, sizeof *types);
    mk_shape_tensors(s, n_vocab, d, n);
    for (int64_t i = 0; i < n; i++) ti[i] = (mk_tinfo_t){d[i].name, d[i].n_dims, d[i].ne[0], TYPE_F32};
    mk_plan(&tg, ti, n, types, NULL);
    assert_int_equal(gguf_n_tensors(f), n);
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_t *t = gguf_tensor_get(f, d[i].name, d[i].n_dims, d[i].ne, (int[]){types[i], -1}, &err);
        if (!t) fail_msg("%s %s: %s", s->name, type, err.msg);
        /* 1-D tensors stay F32 in every type, as llama.cpp's converter keeps them. */
        if (d[i].n_dims == 1) assert_int_equal(t->type, TYPE_F32);
    }
    /* Independent facts of the layout: the llama names, tied output. */
    assert_non_null(gguf_tensor_get(f, "token_embd.weight", 2, (int64_t[]){s->n_embd, n_vocab}, NULL, &err));
    assert_non_null(
        gguf_tensor_get(f, "blk.0.attn_q.weight", 2, (int64_t[]){s->n_embd, s->n_head * s->head_dim}, NULL, &err));
    assert_non_null(gguf_tensor_get(f, "blk.0.attn_k.weight", 2, (int64_t[]){s->n_embd, s->n_head_kv * s->head_dim},
                                    NULL, &err));
    assert_non_null(
        gguf_tensor_get(f, "blk.0.attn_output.weight", 2, (int64_t[]){s->n_head * s->head_dim, s->n_embd}, NULL, &err));
    assert_non_null(gguf_tensor_get(f, "blk.0.ffn_down.weight", 2, (int64_t[]){s->n_ff, s->n_embd}, NULL, &err));
    char last[64];
    snprintf(last, sizeof last, "blk.%d.ffn_up.weight", (int)s->n_layer - 1);
    assert_non_null(gguf_tensor_get(f, last, 2, (int64_t[]){s->n_embd, s->n_ff}, NULL, &err));
    assert_int_equal(gguf_tensor_find(f, "output.weight") == NULL, s->tied);
    assert_int_equal(gguf_tensor_find(f, "blk.0.attn_q.bias") != NULL, s->qkv_bias);
    assert_int_equal(gguf_tensor_find(f, "blk.0.attn_v.bias") != NULL, s->qkv_bias);
    assert_int_equal(gguf_tensor_find(f, "blk.0.attn_k_norm.weight") != NULL, s->qk_norm);
    assert_int_equal(gguf_tensor_find(f, "rope_freqs.weight") != NULL, s->rope_factor > 0);
    free(d);
    free(ti);
    free(types);
}

/* Every type on every tiny shape: loads with the right shapes and types, and
 * the values are the F32 file's within the type's precision. */
static void test_every_type_tiny(void **state) {
    (void)state;
    const char *shapes[] = {"tiny", "tiny-64", "tiny-qwen2", "tiny-qwen3", "tiny-llama3"};
    for (int si = 0; si < 5; si++) {
        const mk_shape_t *s = mk_shape_find(shapes[si]);
        assert_non_null(s);
        gguf_file_t *ref = make(shapes[si], "f32", "ref", 7, 0, NULL);
        check_file(ref, s, "f32", s->n_vocab);
        /* Weights N(0, 1/ne0): sample variance of token_embd within 10%;
         * norms exactly 1. */
        const gguf_tensor_t *te = gguf_tensor_find(ref, "token_embd.weight");
        double ss = 0;
        int64_t cnt = te->ne[0] * te->ne[1];
        for (int64_t i = 0; i < cnt; i++) ss += (double)((const float *)te->data)[i] * ((const float *)te->data)[i];
        double var = ss / (double)cnt, want = 1.0 / (double)te->ne[0];
        assert_true(fabs(var - want) < 0.1 * want);
        const gguf_tensor_t *nrm = gguf_tensor_find(ref, "blk.1.ffn_norm.weight");
        for (int64_t i = 0; i < nrm->ne[0]; i++) assert_true(((const float *)nrm->data)[i] == 1.0f);

        for (int ti = 1; ti < N_TARGETS; ti++) {
            if (tu_quick() && si > 0 && ti % 3) continue; /* sanitizers: a subset */
            gguf_file_t *f = make(shapes[si], all_targets[ti], "typed", 7, 0, NULL);
            check_file(f, s, all_targets[ti], s->n_vocab);
            for (int64_t k = 0; k < gguf_n_tensors(f); k++) {
                const gguf_tensor_t *t = gguf_tensor_at(f, k), *r = gguf_tensor_find(ref, t->name);
                assert_non_null(r);
                float *x = malloc((size_t)t->ne[0] * 4), *y = malloc((size_t)t->ne[0] * 4);
                double err2 = 0, sig2 = 0;
                int64_t rows = t->ne[1] < 4 ? t->ne[1] : 4;
                for (int64_t row = 0; row < rows; row++) {
                    to_float(t, row, x);
                    to_float(r, row, y);
                    for (int64_t i = 0; i < t->ne[0]; i++) {
                        err2 += (double)(x[i] - y[i]) * (x[i] - y[i]);
                        sig2 += (double)y[i] * y[i];
                    }
                }
                double rel = sqrt(err2 / sig2);
                if (t->type == TYPE_F32)
                    assert_true(rel == 0);
                else if (rel > ldexp(1.0, 2 - type_bits(t->type)))
                    fail_msg("%s %s %s (%s): relative error %g", shapes[si], all_targets[ti], t->name,
                             quant_name(t->type), rel);
                free(x);
                free(y);
            }
            gguf_close(f);
        }
        gguf_close(ref);
    }
    unlink(tmp_path("ref"));
    unlink(tmp_path("typed"));
}

/* The K formats need rows of 256: on tiny-64 every quantized weight falls
 * back; on tiny none does. */
static void test_fallback_tiny64(void **state) {
    (void)state;
    mk_target_t tg;
    const mk_shape_t *s = mk_shape_find("tiny-64");
    mk_tdesc_t d[64];
    int64_t n = mk_shape_tensors(s, s->n_vocab, d, 64);
    assert_true(n <= 64);
    mk_tinfo_t ti[64];
    int types[64], nf;
    for (int64_t i = 0; i < n; i++) ti[i] = (mk_tinfo_t){d[i].name, d[i].n_dims, d[i].ne[0], TYPE_F32};
    /* pure: every 2-D weight is Q4_K, which falls back to Q5_0 (15 of them) */
    assert_int_equal(mk_target_parse("q4_k", &tg), 0);
    tg.pure = true;
    mk_plan(&tg, ti, n, types, &nf);
    for (int64_t i = 0; i < n; i++) assert_int_equal(types[i], d[i].n_dims == 1 ? TYPE_F32 : TYPE_Q5_0);
    assert_int_equal(nf, 15);
    /* default rules: the tied token_embd takes the output rule (64 % 256 != 0: Q8_0) */
    tg.pure = false;
    mk_plan(&tg, ti, n, types, &nf);
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(types[i], d[i].n_dims == 1                          ? TYPE_F32
                                   : !strcmp(d[i].name, "token_embd.weight") ? TYPE_Q8_0
                                                                              : TYPE_Q5_0);
    assert_int_equal(nf, 14);
    assert_int_equal(mk_target_parse("q6_k", &tg), 0);
    mk_plan(&tg, ti, n, types, &nf);
    for (int64_t i = 0; i < n; i++) assert_int_equal(types[i], d[i].n_dims == 1 ? TYPE_F32 : TYPE_Q8_0);
    assert_int_equal(mk_target_parse("q5_k_m", &tg), 0);
    mk_plan(&tg, ti, n, types, &nf);
    for (int64_t i = 0; i < n; i++)
        if (!strcmp(d[i].name, "token_embd.weight"))
            assert_int_equal(types[i], TYPE_Q8_0); /* output rule: 64 % 256 != 0 */
        else if (d[i].n_dims == 2)
            assert_true(types[i] == TYPE_Q5_1 || types[i] == TYPE_Q8_0);
    s = mk_shape_find("tiny");
    n = mk_shape_tensors(s, s->n_vocab, d, 64);
    for (int64_t i = 0; i < n; i++) ti[i] = (mk_tinfo_t){d[i].name, d[i].n_dims, d[i].ne[0], TYPE_F32};
    assert_int_equal(mk_target_parse("q4_k", &tg), 0);
    mk_plan(&tg, ti, n, types, &nf);
    assert_int_equal(nf, 0);
}

typedef struct {
    int type, count;
} tc_t;

static void plan_counts(const char *shape, const char *type, bool untie, const tc_t *want, int n_want,
                        int64_t want_total) {
    const mk_shape_t *s = mk_shape_find(shape);
    assert_non_null(s);
    int64_t n = mk_shape_tensors(s, s->n_vocab, NULL, 0);
    mk_tdesc_t *d = calloc((size_t)n + 1, sizeof *d);
    mk_tinfo_t *ti = calloc((size_t)n + 1, sizeof *ti);
    int *types = calloc((size_t)n + 1, sizeof *types);
    mk_shape_tensors(s, s->n_vocab, d, n);
    if (untie) {
        d[n] = d[0];
        snprintf(d[n].name, sizeof d[n].name, "output.weight");
        n++;
    }
    for (int64_t i = 0; i < n; i++) ti[i] = (mk_tinfo_t){d[i].name, d[i].n_dims, d[i].ne[0], TYPE_F32};
    mk_target_t tg;
    assert_int_equal(mk_target_parse(type, &tg), 0);
    mk_plan(&tg, ti, n, types, NULL);
    assert_int_equal(n, want_total);
    int count[TYPE_COUNT] = {0};
    for (int64_t i = 0; i < n; i++) count[types[i]]++;
    int sum = 0;
    for (int i = 0; i < n_want; i++) {
        if (count[want[i].type] != want[i].count)
            fail_msg("%s %s: %d %s tensors, want %d", shape, type, count[want[i].type], quant_name(want[i].type),
                     want[i].count);
        sum += want[i].count;
    }
    assert_int_equal(sum, n); /* no other type appears */
    if (untie) {
        /* quant-layouts.md: untied output of width 576 -> Q8_0, token_embd -> Q5_0 */
        assert_int_equal(types[n - 1], TYPE_Q8_0);
        assert_int_equal(types[0], TYPE_Q5_0);
    }
    /* Per tensor (SmolLM2, 30 layers): attn_v / ffn_down of layer 5 (use_more_bits:
     * (5 - 3) % 3 == 2) get the larger type, layer 4 does not. */
    if (!strcmp(shape, "smollm2-135m") && !strcmp(type, "q4_k_m")) {
        for (int64_t i = 0; i < n; i++) {
            if (!strcmp(d[i].name, "blk.5.attn_v.weight")) assert_int_equal(types[i], TYPE_Q8_0);
            if (!strcmp(d[i].name, "blk.4.attn_v.weight")) assert_int_equal(types[i], TYPE_Q5_0);
            if (!strcmp(d[i].name, "blk.5.ffn_down.weight")) assert_int_equal(types[i], TYPE_Q6_K);
            if (!strcmp(d[i].name, "blk.4.ffn_down.weight")) assert_int_equal(types[i], TYPE_Q4_K);
            if (!strcmp(d[i].name, "blk.29.ffn_down.weight")) assert_int_equal(types[i], TYPE_Q6_K);
        }
    }
    free(d);
    free(ti);
    free(types);
}

/* Counts from ../shared/reference/quant-layouts.md (llama.cpp's quantizer on
 * these shapes, and a published Qwen2.5 0.5B Q4_K_M load log). */
static void test_mix_counts(void **state) {
    (void)state;
    plan_counts("smollm2-135m", "q4_k_m", false,
                (tc_t[]){{TYPE_Q5_0, 166}, {TYPE_Q8_0, 15}, {TYPE_Q4_K, 16}, {TYPE_Q6_K, 14}, {TYPE_F32, 61}}, 5, 272);
    plan_counts("qwen2.5-0.5b", "q4_k_m", false,
                (tc_t[]){{TYPE_Q5_0, 132}, {TYPE_Q8_0, 13}, {TYPE_Q4_K, 12}, {TYPE_Q6_K, 12}, {TYPE_F32, 121}}, 5, 290);
    plan_counts("smollm2-135m", "q5_k_m", false,
                (tc_t[]){{TYPE_Q5_1, 166}, {TYPE_Q8_0, 15}, {TYPE_Q5_K, 16}, {TYPE_Q6_K, 14}, {TYPE_F32, 61}}, 5, 272);
    /* Untied: output.weight becomes Q8_0, token_embd the Q4_K fallback Q5_0. */
    plan_counts("smollm2-135m", "q4_k_m", true,
                (tc_t[]){{TYPE_Q5_0, 167}, {TYPE_Q8_0, 15}, {TYPE_Q4_K, 16}, {TYPE_Q6_K, 14}, {TYPE_F32, 61}}, 5, 273);
}

/* Tensor bytes of each shape and type, planned without writing, against the
 * sizes of the files llama.cpp's own llama-quantize made of these shapes
 * (../shared/reference/llamacpp-bench.md, "file MB", rounded to 1e6 bytes). */
static void test_sizes_match_llamacpp_bench(void **state) {
    (void)state;
    static const struct {
        const char *shape, *type;
        double mb;
    } rows[] = {
        {"smollm2-135m", "f16", 269},  {"smollm2-135m", "q8_0", 143},  {"smollm2-135m", "q4_0", 90},
        {"smollm2-135m", "q4_k_m", 104}, {"qwen2.5-0.5b", "f16", 988},  {"qwen2.5-0.5b", "q8_0", 525},
        {"qwen2.5-0.5b", "q4_0", 346}, {"qwen2.5-0.5b", "q4_k_m", 392}, {"llama3.2-1b", "f16", 2472},
        {"llama3.2-1b", "q8_0", 1313}, {"llama3.2-1b", "q4_0", 763},   {"llama3.2-1b", "q4_k_m", 800},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const mk_shape_t *s = mk_shape_find(rows[r].shape);
        int64_t n = mk_shape_tensors(s, s->n_vocab, NULL, 0);
        mk_tdesc_t *d = calloc((size_t)n, sizeof *d);
        mk_tinfo_t *ti = calloc((size_t)n, sizeof *ti);
        int *types = calloc((size_t)n, sizeof *types);
        mk_shape_tensors(s, s->n_vocab, d, n);
        for (int64_t i = 0; i < n; i++) ti[i] = (mk_tinfo_t){d[i].name, d[i].n_dims, d[i].ne[0], TYPE_F32};
        mk_target_t tg;
        assert_int_equal(mk_target_parse(rows[r].type, &tg), 0);
        mk_plan(&tg, ti, n, types, NULL);
        double bytes = 0;
        for (int64_t i = 0; i < n; i++) bytes += (double)quant_row_size(types[i], d[i].ne[0]) * (double)d[i].ne[1];
        if (fabs(bytes / 1e6 - rows[r].mb) > 0.5)
            fail_msg("%s %s: %.2f MB of tensors, llama.cpp's file %.0f MB", rows[r].shape, rows[r].type, bytes / 1e6,
                     rows[r].mb);
        free(d);
        free(ti);
        free(types);
    }
}

/* The plan applied to stories260K.gguf (F32) gives, tensor by tensor, the
 * types llama.cpp chose in stories260K-Q4_K_M.gguf. */
static void test_plan_matches_llamacpp_file(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(p32, "models/stories260K.gguf");
    TU_REQUIRE_SHARED(pq, "models/stories260K-Q4_K_M.gguf");
    tern_error_t err = {0};
    gguf_file_t *a = gguf_open(p32, &err), *b = gguf_open(pq, &err);
    assert_non_null(a);
    assert_non_null(b);
    int64_t n = gguf_n_tensors(a);
    assert_int_equal(n, gguf_n_tensors(b));
    mk_tinfo_t *ti = calloc((size_t)n, sizeof *ti);
    int *types = calloc((size_t)n, sizeof *types);
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_t *t = gguf_tensor_at(a, i);
        ti[i] = (mk_tinfo_t){t->name, t->n_dims, t->ne[0], t->type};
    }
    mk_target_t tg;
    assert_int_equal(mk_target_parse("q4_k_m", &tg), 0);
    mk_plan(&tg, ti, n, types, NULL);
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor_t *t = gguf_tensor_find(b, ti[i].name);
        assert_non_null(t);
        if (t->type != types[i])
            fail_msg("%s: planned %s, llama.cpp chose %s", ti[i].name, quant_name(types[i]), quant_name(t->type));
    }
    free(ti);
    free(types);
    gguf_close(a);
    gguf_close(b);
}

/* quantize(F32 file) == mkmodel(type) byte for byte (both quantize the same
 * floats), and a file is the same at any thread count; seeds matter. */
static void test_quantize_matches_mkmodel(void **state) {
    (void)state;
    const char *types[] = {"q4_k_m", "q8_0", "bf16"};
    gguf_file_t *f32 = make("tiny-qwen2", "f32", "q_src", 3, 1, NULL);
    for (int k = 0; k < 3; k++) {
        gguf_file_t *direct = make("tiny-qwen2", types[k], "q_direct", 3, 2, NULL);
        tern_error_t err = {0};
        const char *out = tmp_path("q_out");
        if (mk_quantize_file(tmp_path("q_src"), out, types[k], false, 2, 0, &err)) fail_msg("%s", err.msg);
        gguf_file_t *q = gguf_open(out, &err);
        assert_non_null(q);
        assert_int_equal(gguf_n_tensors(q), gguf_n_tensors(direct));
        for (int64_t i = 0; i < gguf_n_tensors(q); i++) {
            const gguf_tensor_t *a = gguf_tensor_at(q, i), *b = gguf_tensor_find(direct, a->name);
            assert_non_null(b);
            assert_int_equal(a->type, b->type);
            assert_int_equal(a->size, b->size);
            if (memcmp(a->data, b->data, a->size)) fail_msg("%s %s: bytes differ", types[k], a->name);
        }
        uint64_t ft;
        assert_int_equal(gguf_get_u64(q, "general.file_type", &ft, &err), 0);
        mk_target_t tg;
        mk_target_parse(types[k], &tg);
        assert_int_equal(ft, tg.ftype);
        gguf_close(q);
        gguf_close(direct);
    }
    /* Thread count does not change the bytes; the seed does. */
    gguf_file_t *t1 = make("tiny", "q4_0", "t1", 11, 1, NULL);
    gguf_file_t *t2 = make("tiny", "q4_0", "t2", 11, 3, NULL);
    gguf_file_t *t3 = make("tiny", "q4_0", "t3", 12, 2, NULL);
    const gguf_tensor_t *a = gguf_tensor_find(t1, "blk.1.ffn_up.weight"), *b = gguf_tensor_find(t2, a->name),
                        *c = gguf_tensor_find(t3, a->name);
    assert_memory_equal(a->data, b->data, a->size);
    assert_true(memcmp(a->data, c->data, a->size) != 0);
    gguf_close(t1);
    gguf_close(t2);
    gguf_close(t3);
    gguf_close(f32);
    const char *tags[] = {"q_src", "q_direct", "q_out", "t1", "t2", "t3"};
    for (int i = 0; i < 6; i++) unlink(tmp_path(tags[i]));
}

/* Re-quantizing a real file: stories260K to q8_0 and to q4_k_m. */
static void test_quantize_stories(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(p32, "models/stories260K.gguf");
    TU_REQUIRE_SHARED(pq, "models/stories260K-Q4_K_M.gguf");
    tern_error_t err = {0};
    const char *out = tmp_path("stories");
    if (mk_quantize_file(p32, out, "q4_k_m", false, 0, 0, &err)) fail_msg("%s", err.msg);
    gguf_file_t *src = gguf_open(p32, &err), *q = gguf_open(out, &err), *ref = gguf_open(pq, &err);
    assert_non_null(q);
    assert_int_equal(gguf_n_kv(q), gguf_n_kv(src) + 2); /* + file_type, quantization_version */
    for (int64_t i = 0; i < gguf_n_tensors(q); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(q, i), *r = gguf_tensor_find(ref, t->name);
        assert_int_equal(t->type, r->type);
        assert_int_equal(t->size, r->size);
        if (t->type == TYPE_F32) /* not quantizable: copied */
            assert_memory_equal(t->data, gguf_tensor_find(src, t->name)->data, t->size);
    }
    gguf_close(q);
    /* Quantizing the quantized file again (Q5_0/Q8_0/F16 to q8_0) works too. */
    if (mk_quantize_file(pq, out, "q8_0", false, 0, 0, &err)) fail_msg("%s", err.msg);
    q = gguf_open(out, &err);
    assert_non_null(q);
    assert_int_equal(gguf_tensor_find(q, "blk.0.attn_q.weight")->type, TYPE_Q8_0);
    assert_int_equal(gguf_tensor_find(q, "blk.0.ffn_down.weight")->type, TYPE_F16); /* 172 % 32 != 0 */
    gguf_close(q);
    /* Errors. */
    assert_int_equal(mk_quantize_file(p32, out, "q3_k", false, 0, 0, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "unknown type 'q3_k'"));
    assert_int_equal(mk_quantize_file(out, out, "q8_0", false, 0, 0, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "is the input file"));
    gguf_close(src);
    gguf_close(ref);
    unlink(out);
}

/* The byte-level stand-in vocabulary, and --vocab-from. */
static void test_vocab(void **state) {
    (void)state;
    gguf_file_t *f = make("tiny", "f32", "vocab", 1, 0, NULL);
    const gguf_kv_t *toks = gguf_find(f, "tokenizer.ggml.tokens");
    const gguf_kv_t *tt = gguf_find(f, "tokenizer.ggml.token_type");
    const gguf_kv_t *sc = gguf_find(f, "tokenizer.ggml.scores");
    assert_int_equal(gguf_arr_len(toks), 512);
    assert_int_equal(gguf_arr_type(tt), GGUF_INT32);
    assert_int_equal(gguf_arr_type(sc), GGUF_FLOAT32);
    assert_int_equal(gguf_arr_len(sc), 512);
    const int32_t *type = gguf_arr_data(tt);
    gguf_str_t s = gguf_arr_str(toks, 0);
    assert_true(s.len == 5 && !memcmp(s.data, "<unk>", 5));
    s = gguf_arr_str(toks, 1);
    assert_true(s.len == 3 && !memcmp(s.data, "<s>", 3));
    s = gguf_arr_str(toks, 2);
    assert_true(s.len == 4 && !memcmp(s.data, "</s>", 4));
    for (int b = 0; b < 256; b++) {
        char want[8];
        snprintf(want, sizeof want, "<0x%02X>", b);
        s = gguf_arr_str(toks, (uint64_t)(3 + b));
        assert_true(s.len == 6 && !memcmp(s.data, want, 6));
        assert_int_equal(type[3 + b], 6);
    }
    /* Every token distinct. */
    for (uint64_t i = 0; i < 512; i++)
        for (uint64_t j = i + 1; j < 512; j++) {
            gguf_str_t a = gguf_arr_str(toks, i), b = gguf_arr_str(toks, j);
            assert_false(a.len == b.len && !memcmp(a.data, b.data, a.len));
        }
    gguf_str_t model;
    tern_error_t err = {0};
    assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &model, &err), 0);
    assert_true(model.len == 5 && !memcmp(model.data, "llama", 5));
    uint64_t v;
    assert_int_equal(gguf_get_u64(f, "tokenizer.ggml.bos_token_id", &v, &err), 0);
    assert_int_equal(v, 1);
    assert_int_equal(gguf_get_u64(f, "tokenizer.ggml.eos_token_id", &v, &err), 0);
    assert_int_equal(v, 2);
    gguf_close(f);
    unlink(tmp_path("vocab")); /* before a skip for want of ../shared can return */

    TU_REQUIRE_SHARED(vf, "reference/vocab/ggml-vocab-llama-spm.gguf");
    gguf_file_t *src = gguf_open(vf, &err);
    assert_non_null(src);
    uint64_t nv = gguf_arr_len(gguf_find(src, "tokenizer.ggml.tokens"));
    f = make("tiny-qwen2", "q8_0", "vocab", 1, 0, vf);
    check_file(f, mk_shape_find("tiny-qwen2"), "q8_0", (int64_t)nv);
    int copied = 0;
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        const gguf_kv_t *a = gguf_kv_at(src, i);
        if (strncmp(gguf_kv_key(a), "tokenizer.", 10)) continue;
        const gguf_kv_t *b = gguf_find(f, gguf_kv_key(a));
        assert_non_null(b);
        uint64_t la, lb;
        const void *ra = gguf_kv_raw(a, &la), *rb = gguf_kv_raw(b, &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(ra, rb, la);
        copied++;
    }
    assert_true(copied >= 5);
    gguf_close(f);
    gguf_close(src);
    unlink(tmp_path("vocab"));
}

/* llama3 RoPE factors: 1 for the fastest frequencies, the scaling factor for
 * the slowest, monotone in between (Llama 3.2: factor 32). */
static void test_rope_freqs(void **state) {
    (void)state;
    gguf_file_t *f = make("tiny-llama3", "q4_0", "rope", 1, 0, NULL);
    const mk_shape_t *s = mk_shape_find("tiny-llama3");
    tern_error_t err = {0};
    const gguf_tensor_t *t =
        gguf_tensor_get(f, "rope_freqs.weight", 1, (int64_t[]){s->head_dim / 2}, (int[]){TYPE_F32, -1}, &err);
    assert_non_null(t);
    const float *r = t->data;
    assert_true(r[0] == 1.0f);
    assert_true(r[t->ne[0] - 1] == s->rope_factor);
    int mid = 0;
    for (int64_t i = 1; i < t->ne[0]; i++) {
        assert_true(r[i] >= r[i - 1]);
        if (r[i] > 1.0f && r[i] < s->rope_factor) mid++;
    }
    assert_true(mid > 0); /* the smooth band exists for base 500000, 64 dims */
    gguf_close(f);
    unlink(tmp_path("rope"));
}

static void test_errors(void **state) {
    (void)state;
    tern_error_t err = {0};
    mk_opts_t o = {"nope", "f32", tmp_path("err"), NULL, 1, false, 1, 0};
    assert_int_equal(mk_model_write(&o, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "unknown shape 'nope' (known: smollm2-135m"));
    o.shape = "tiny";
    o.type = "q2_k";
    assert_int_equal(mk_model_write(&o, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "unknown type 'q2_k'"));
    o.type = "f32";
    o.vocab_from = "/nonexistent.gguf";
    assert_int_equal(mk_model_write(&o, &err), TERN_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent.gguf"));
    assert_int_equal(access(o.out, F_OK), -1); /* nothing left behind */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_tiny),     cmocka_unit_test(test_fallback_tiny64),
        cmocka_unit_test(test_mix_counts),          cmocka_unit_test(test_sizes_match_llamacpp_bench),
        cmocka_unit_test(test_plan_matches_llamacpp_file),
        cmocka_unit_test(test_quantize_matches_mkmodel), cmocka_unit_test(test_quantize_stories),
        cmocka_unit_test(test_vocab),               cmocka_unit_test(test_rope_freqs),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
