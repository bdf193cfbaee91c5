/* test_model.c - the forward pass against the truths it must match:
 *   - stories260K (../shared): the 256 greedy ids of llama2.c's run.c from
 *     BOS, its logits at positions 0 and 1 (F32 KV cache, within 1e-4), and
 *     llama.cpp's greedy continuation of "Once upon a time";
 *   - each architecture (llama, qwen2, qwen3, llama3 RoPE scaling) on a tiny
 *     `tern mkmodel` file against a float64 reference forward written here
 *     from the GGUF tensors (different code, same math);
 *   - clear errors for an unsupported architecture and a missing or
 *     ill-shaped tensor; bad token ids and a full context.
 * Thread and batch invariance live in test_model_invariance.c.
 */
// ctest-label: concurrent
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "dev/mkmodel.h"
#include "model/model.h"
#include "format/quant.h"

/* ---- helpers ---------------------------------------------------------------- */

static char *ref_text(void) {
    TU_REQUIRE_SHARED(p, "reference/stories260K-greedy.txt");
    char *s = tu_read_file(p, NULL);
    assert_non_null(s);
    return s;
}

/* n numbers (ints or floats) after marker in s. */
static void parse_after(const char *s, const char *marker, double *out, int n) {
    const char *p = strstr(s, marker);
    assert_non_null(p);
    p += strlen(marker);
    for (int i = 0; i < n; i++) {
        char *end;
        out[i] = strtod(p, &end);
        assert_true(end != p);
        p = end;
    }
}

static int32_t argmax(const float *x, int64_t n) {
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int32_t)i;
    return b;
}

static model_t *load_ok(const char *path) {
    tern_error_t err = {0};
    model_t *m = model_load(path, &err);
    if (!m) print_message("model_load %s: %s\n", path, err.msg);
    assert_non_null(m);
    return m;
}

/* ---- stories260K ---------------------------------------------------------------- */

static void greedy_from_bos(bool kv_f32, int threads) {
    TU_REQUIRE_SHARED(path, "models/stories260K.gguf");
    char *ref = ref_text();
    double want[256];
    parse_after(ref, "GREEDY_IDS:", want, 256);
    model_t *m = load_ok(path);
    assert_int_equal(m->hp.arch, ARCH_LLAMA);
    assert_int_equal(m->hp.n_vocab, 512);
    model_ctx_t *c = tu_ctx_new(m, threads, 512, 512, kv_f32);
    int32_t tok = 1; /* BOS */
    for (int pos = 0; pos < 256; pos++) {
        tu_eval_ok(c, &tok, 1, NULL);
        tok = argmax(model_ctx_logits(c), m->hp.n_vocab);
        if (tok != (int32_t)want[pos])
            print_message("kv %s: step %d: got %d, reference %d\n", kv_f32 ? "f32" : "f16", pos, tok, (int)want[pos]);
        assert_int_equal(tok, (int32_t)want[pos]);
    }
    model_ctx_free(c);
    model_free(m);
    free(ref);
}

static void test_stories_greedy_f32(void **state) {
    (void)state;
    greedy_from_bos(true, 1);
}

static void test_stories_greedy_f16(void **state) {
    (void)state;
    greedy_from_bos(false, 2);
}

static void test_stories_logits(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "models/stories260K.gguf");
    char *ref = ref_text();
    double want0[8], want1[8];
    parse_after(ref, "position 0 (input id 1, BOS):", want0, 8);
    parse_after(ref, "position 1 (input id 403):", want1, 8);
    model_t *m = load_ok(path);
    /* One position at a time, then both in one block: same logits. */
    for (int block = 0; block < 2; block++) {
        model_ctx_t *c = tu_ctx_new(m, 2, 64, 64, true);
        const int32_t ids[2] = {1, 403};
        float *all = malloc(2 * 512 * sizeof(float));
        assert_non_null(all);
        if (block) {
            tu_eval_ok(c, ids, 2, all);
        } else {
            tu_eval_ok(c, ids, 1, all);
            tu_eval_ok(c, ids + 1, 1, all + 512);
        }
        for (int i = 0; i < 8; i++) {
            assert_true(fabs(all[i] - want0[i]) < 1e-4);
            assert_true(fabs(all[512 + i] - want1[i]) < 1e-4);
        }
        model_ctx_free(c);
        free(all);
    }
    model_free(m);
    free(ref);
}

typedef struct {
    char *buf;
    size_t len;
} text_t;

static int collect(int32_t id, const char *text, size_t len, void *user) {
    (void)id;
    text_t *t = user;
    t->buf = realloc(t->buf, t->len + len + 1);
    assert_non_null(t->buf);
    memcpy(t->buf + t->len, text, len);
    t->len += len;
    t->buf[t->len] = 0;
    return 0;
}

/* Through the public API, as `tern run -p "Once upon a time" -n 128 --temp 0`
 * prints it: the prompt's text, then the continuation. */
static void test_stories_prompt(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "models/stories260K.gguf");
    char *ref = ref_text();
    const char *b = strstr(ref, "<<<BEGIN\n"), *e = strstr(ref, ">>>END");
    assert_true(b && e && e > b);
    b += strlen("<<<BEGIN\n");
    tern_error_t err = {0};
    tern_model_t *m = tern_model_load(path, &err);
    assert_non_null(m);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *prompt = "Once upon a time";
    if (tern_tokenize(m, prompt, strlen(prompt), 1, 0, &ids, &n, &err)) print_message("%s\n", err.msg);
    assert_int_equal(n, 5);
    const int32_t want_ids[5] = {1, 403, 407, 261, 378};
    assert_memory_equal(ids, want_ids, sizeof want_ids);
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = 2;
    tern_context_t *c = tern_context_create(m, &cp, &err);
    assert_non_null(c);
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.temp = 0;
    tern_sampler_t *s = tern_sampler_create(m, &sp, &err);
    assert_non_null(s);
    text_t out = {0};
    collect(0, prompt, strlen(prompt), &out);
    tern_generate_result_t gr;
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 128, collect, &out, &gr, &err), 0);
    assert_int_equal(gr.n_generated, 128);
    assert_int_equal(gr.stop, TERN_STOP_LENGTH);
    assert_int_equal(tern_context_pos(c), 5 + 128);
    /* llama.cpp's llama-simple prints a newline after the last token (and so
     * does tern run): the reference's final newline. */
    collect(0, "\n", 1, &out);
    if (out.len != (size_t)(e - b) || memcmp(out.buf, b, out.len) != 0)
        print_message("got:\n%s\nwant:\n%.*s\n", out.buf, (int)(e - b), b);
    assert_int_equal(out.len, (size_t)(e - b));
    assert_memory_equal(out.buf, b, out.len);

    /* The cache ends right after the reported text: 64 more greedy tokens
     * from the cache equal tokens 129..192 of one longer run. */
    text_t more = {0};
    assert_int_equal(tern_generate(c, s, NULL, 0, 64, collect, &more, &gr, &err), 0);
    tern_context_truncate(c, 0, NULL);
    text_t one = {0};
    tern_sampler_reset(s);
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 192, collect, &one, &gr, &err), 0);
    assert_true(one.len == out.len - strlen(prompt) - 1 + more.len);
    assert_memory_equal(one.buf + one.len - more.len, more.buf, more.len);
    free(out.buf);
    free(more.buf);
    free(one.buf);
    free(ids);
    tern_sampler_free(s);
    tern_context_free(c);
    tern_model_free(m);
    free(ref);
}

/* ---- the float64 reference forward -------------------------------------------------
 * Written from the GGUF tensors and keys directly (its own binding, its own
 * loops, everything in double), following the published definitions:
 * RMSNorm x / sqrt(mean(x^2) + eps) * w; q/k/v projections (+ bias for
 * qwen2; per-head RMSNorm for qwen3); RoPE rotating pairs (2i, 2i+1)
 * (llama) or (i, i + d/2) (qwen) by pos * base^(-2i/d) / factor_i; causal
 * softmax(q k / sqrt(d)) v with query head h reading kv head h / (H / Hkv);
 * output projection and residual; SwiGLU FFN and residual; final RMSNorm
 * and the output (or tied embedding) matrix. Mixture of Experts (a layer
 * with ffn_gate_inp): softmax of the router's logits, the K most probable
 * experts (qwen3moe and Mixtral: their probabilities renormalized to sum
 * 1), the weighted sum of their SwiGLU FFNs (3-D _exps tensors or
 * Mixtral's per-expert ffn_*.E tensors), plus, for qwen2moe, the shared
 * expert's FFN scaled by sigmoid(x . ffn_gate_inp_shexp); olmoe's Q/K
 * RMSNorm over the whole projection. */

typedef struct {
    const gguf_file_t *f;
    int64_t D, L, F, H, HKV, HD, V, NROT;
    int64_t E, K, FE, FS; /* experts, used per token, expert width, shared expert width */
    bool renorm;
    double eps, base;
    bool neox;
    double *rope_fac; /* NROT/2 or NULL */
} ref_model_t;

static double *ref_tensor(const gguf_file_t *f, const char *name, int64_t *rows, int64_t *cols) {
    const gguf_tensor_t *t = gguf_tensor_find(f, name);
    if (!t) return NULL;
    int64_t c = t->ne[0], r = t->ne[1] * t->ne[2] * t->ne[3]; /* a 3-D tensor: its matrices one after another */
    float *row = malloc((size_t)c * sizeof *row);
    double *out = malloc((size_t)(r * c) * sizeof *out);
    assert_true(row && out);
    size_t rb = quant_row_size(t->type, c);
    for (int64_t i = 0; i < r; i++) {
        assert_int_equal(quant_dequantize_row(t->type, (const char *)t->data + i * rb, row, c), 0);
        for (int64_t j = 0; j < c; j++) out[i * c + j] = row[j];
    }
    free(row);
    if (rows) *rows = r;
    if (cols) *cols = c;
    return out;
}

static double *ref_get(const gguf_file_t *f, const char *fmt, int64_t l) {
    char name[96];
    snprintf(name, sizeof name, fmt, (long long)l);
    return ref_tensor(f, name, NULL, NULL);
}

static void ref_rmsnorm(double *out, const double *x, const double *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}

/* y (r) = W (r x c) x (c) */
static void ref_mv(double *y, const double *w, const double *x, int64_t r, int64_t c) {
    for (int64_t i = 0; i < r; i++) {
        double s = 0;
        for (int64_t j = 0; j < c; j++) s += w[i * c + j] * x[j];
        y[i] = s;
    }
}

static void ref_rope(const ref_model_t *rm, double *x, int64_t nh, int64_t pos) {
    for (int64_t h = 0; h < nh; h++) {
        double *v = x + h * rm->HD;
        for (int64_t i = 0; i < rm->NROT / 2; i++) {
            double th = (double)pos * pow(rm->base, -2.0 * (double)i / (double)rm->NROT);
            if (rm->rope_fac) th /= rm->rope_fac[i];
            int64_t a = rm->neox ? i : 2 * i, b = rm->neox ? i + rm->NROT / 2 : 2 * i + 1;
            double x0 = v[a], x1 = v[b];
            v[a] = x0 * cos(th) - x1 * sin(th);
            v[b] = x0 * sin(th) + x1 * cos(th);
        }
    }
}

/* out (D) = down(silu(gate x) * (up x)) of a SwiGLU FFN of width F; g, up:
 * F doubles of scratch. */
static void ref_ffn(double *out, const double *wg, const double *wu, const double *wd, const double *x, int64_t D,
                    int64_t F, double *g, double *up) {
    ref_mv(g, wg, x, F, D);
    ref_mv(up, wu, x, F, D);
    for (int64_t j = 0; j < F; j++) g[j] = g[j] / (1.0 + exp(-g[j])) * up[j];
    ref_mv(out, wd, g, D, F);
}

/* Logits (n x V) of every position of ids. */
static double *ref_forward(const gguf_file_t *f, const int32_t *ids, int64_t n) {
    ref_model_t rm = {0};
    rm.f = f;
    uint64_t u;
    float fl;
    assert_int_equal(gguf_get_arch_u64(f, "embedding_length", &u, NULL), 0), rm.D = (int64_t)u;
    assert_int_equal(gguf_get_arch_u64(f, "block_count", &u, NULL), 0), rm.L = (int64_t)u;
    assert_int_equal(gguf_get_arch_u64(f, "feed_forward_length", &u, NULL), 0), rm.F = (int64_t)u;
    assert_int_equal(gguf_get_arch_u64(f, "attention.head_count", &u, NULL), 0), rm.H = (int64_t)u;
    assert_int_equal(gguf_get_arch_u64(f, "attention.head_count_kv", &u, NULL), 0), rm.HKV = (int64_t)u;
    rm.HD = gguf_get_arch_u64(f, "attention.key_length", &u, NULL) == 0 ? (int64_t)u : rm.D / rm.H;
    rm.NROT = gguf_get_arch_u64(f, "rope.dimension_count", &u, NULL) == 0 ? (int64_t)u : rm.HD;
    rm.eps = gguf_get_arch_f32(f, "attention.layer_norm_rms_epsilon", &fl, NULL) == 0 ? fl : 1e-5;
    rm.base = gguf_get_arch_f32(f, "rope.freq_base", &fl, NULL) == 0 ? fl : 10000.0;
    rm.neox = strcmp(gguf_arch(f), "llama") != 0;
    rm.E = gguf_get_arch_u64(f, "expert_count", &u, NULL) == 0 ? (int64_t)u : 0;
    rm.K = gguf_get_arch_u64(f, "expert_used_count", &u, NULL) == 0 ? (int64_t)u : 0;
    rm.FE = gguf_get_arch_u64(f, "expert_feed_forward_length", &u, NULL) == 0 ? (int64_t)u : rm.F;
    rm.FS = gguf_get_arch_u64(f, "expert_shared_feed_forward_length", &u, NULL) == 0 ? (int64_t)u : 0;
    rm.renorm = !strcmp(gguf_arch(f), "qwen3moe") || !strcmp(gguf_arch(f), "llama");
    const bool full_qk_norm = !strcmp(gguf_arch(f), "olmoe");
    const int64_t FMAX = rm.F > rm.FE ? (rm.F > rm.FS ? rm.F : rm.FS) : (rm.FE > rm.FS ? rm.FE : rm.FS);
    rm.rope_fac = ref_tensor(f, "rope_freqs.weight", NULL, NULL);
    int64_t V, D2;
    double *emb = ref_tensor(f, "token_embd.weight", &V, &D2);
    assert_int_equal(D2, rm.D);
    rm.V = V;
    double *outw = ref_tensor(f, "output.weight", NULL, NULL);
    double *onorm = ref_tensor(f, "output_norm.weight", NULL, NULL);
    const int64_t D = rm.D, HD = rm.HD, QD = rm.H * HD, KVD = rm.HKV * HD;
    double *x = calloc((size_t)(n * D), sizeof *x), *xb = malloc((size_t)D * sizeof *xb);
    double *q = malloc((size_t)QD * sizeof *q), *att = malloc((size_t)QD * sizeof *att);
    double *kc = malloc((size_t)(n * KVD) * sizeof *kc), *vc = malloc((size_t)(n * KVD) * sizeof *vc);
    double *tmp = malloc((size_t)(D > FMAX ? D : FMAX) * sizeof *tmp);
    double *g = malloc((size_t)FMAX * sizeof *g), *up = malloc((size_t)FMAX * sizeof *up);
    double *ffo = malloc((size_t)D * sizeof *ffo), *pr = malloc((size_t)(rm.E + 1) * sizeof *pr);
    double *sc = malloc((size_t)n * sizeof *sc);
    double *logits = malloc((size_t)(n * V) * sizeof *logits);
    for (int64_t i = 0; i < n; i++) memcpy(x + i * D, emb + (int64_t)ids[i] * D, (size_t)D * sizeof *x);
    for (int64_t l = 0; l < rm.L; l++) {
        double *an = ref_get(f, "blk.%lld.attn_norm.weight", l), *wq = ref_get(f, "blk.%lld.attn_q.weight", l);
        double *wk = ref_get(f, "blk.%lld.attn_k.weight", l), *wv = ref_get(f, "blk.%lld.attn_v.weight", l);
        double *wo = ref_get(f, "blk.%lld.attn_output.weight", l), *fn = ref_get(f, "blk.%lld.ffn_norm.weight", l);
        double *wg = ref_get(f, "blk.%lld.ffn_gate.weight", l), *wu = ref_get(f, "blk.%lld.ffn_up.weight", l);
        double *wd = ref_get(f, "blk.%lld.ffn_down.weight", l);
        double *wr = ref_get(f, "blk.%lld.ffn_gate_inp.weight", l);
        double *ge = ref_get(f, "blk.%lld.ffn_gate_exps.weight", l), *ue = ref_get(f, "blk.%lld.ffn_up_exps.weight", l);
        double *de = ref_get(f, "blk.%lld.ffn_down_exps.weight", l);
        double *shi = ref_get(f, "blk.%lld.ffn_gate_inp_shexp.weight", l);
        double *shg = ref_get(f, "blk.%lld.ffn_gate_shexp.weight", l), *shu = ref_get(f, "blk.%lld.ffn_up_shexp.weight", l);
        double *shd = ref_get(f, "blk.%lld.ffn_down_shexp.weight", l);
        double *bq = ref_get(f, "blk.%lld.attn_q.bias", l), *bk = ref_get(f, "blk.%lld.attn_k.bias", l);
        double *bv = ref_get(f, "blk.%lld.attn_v.bias", l);
        double *qn = ref_get(f, "blk.%lld.attn_q_norm.weight", l), *kn = ref_get(f, "blk.%lld.attn_k_norm.weight", l);
        /* The whole sequence layer by layer: keys and values first, then
         * each position's causal attention over positions <= it. */
        double *qs = malloc((size_t)(n * QD) * sizeof *qs);
        for (int64_t i = 0; i < n; i++) {
            ref_rmsnorm(xb, x + i * D, an, D, rm.eps);
            ref_mv(qs + i * QD, wq, xb, QD, D);
            ref_mv(kc + i * KVD, wk, xb, KVD, D);
            ref_mv(vc + i * KVD, wv, xb, KVD, D);
            if (bq)
                for (int64_t j = 0; j < QD; j++) qs[i * QD + j] += bq[j];
            if (bk)
                for (int64_t j = 0; j < KVD; j++) kc[i * KVD + j] += bk[j], vc[i * KVD + j] += bv[j];
            if (qn && full_qk_norm) {
                ref_rmsnorm(qs + i * QD, qs + i * QD, qn, QD, rm.eps);
                ref_rmsnorm(kc + i * KVD, kc + i * KVD, kn, KVD, rm.eps);
            } else if (qn) {
                for (int64_t h = 0; h < rm.H; h++) ref_rmsnorm(qs + i * QD + h * HD, qs + i * QD + h * HD, qn, HD, rm.eps);
                for (int64_t h = 0; h < rm.HKV; h++)
                    ref_rmsnorm(kc + i * KVD + h * HD, kc + i * KVD + h * HD, kn, HD, rm.eps);
            }
            ref_rope(&rm, qs + i * QD, rm.H, i);
            ref_rope(&rm, kc + i * KVD, rm.HKV, i);
        }
        for (int64_t i = 0; i < n; i++) {
            memcpy(q, qs + i * QD, (size_t)QD * sizeof *q);
            for (int64_t h = 0; h < rm.H; h++) {
                int64_t kh = h / (rm.H / rm.HKV);
                double mx = -INFINITY, sum = 0;
                for (int64_t t = 0; t <= i; t++) {
                    double s = 0;
                    for (int64_t d = 0; d < HD; d++) s += q[h * HD + d] * kc[t * KVD + kh * HD + d];
                    sc[t] = s / sqrt((double)HD);
                    if (sc[t] > mx) mx = sc[t];
                }
                for (int64_t t = 0; t <= i; t++) sum += (sc[t] = exp(sc[t] - mx));
                for (int64_t d = 0; d < HD; d++) {
                    double a = 0;
                    for (int64_t t = 0; t <= i; t++) a += sc[t] / sum * vc[t * KVD + kh * HD + d];
                    att[h * HD + d] = a;
                }
            }
            ref_mv(tmp, wo, att, D, QD);
            for (int64_t j = 0; j < D; j++) x[i * D + j] += tmp[j];
            ref_rmsnorm(xb, x + i * D, fn, D, rm.eps);
            if (!wr) {
                ref_ffn(tmp, wg, wu, wd, xb, D, rm.F, g, up);
                for (int64_t j = 0; j < D; j++) x[i * D + j] += tmp[j];
                continue;
            }
            /* routing: softmax over all experts, the K most probable */
            ref_mv(pr, wr, xb, rm.E, D);
            double mx = -INFINITY, ps = 0;
            for (int64_t e = 0; e < rm.E; e++) mx = pr[e] > mx ? pr[e] : mx;
            for (int64_t e = 0; e < rm.E; e++) ps += (pr[e] = exp(pr[e] - mx));
            for (int64_t e = 0; e < rm.E; e++) pr[e] /= ps;
            int64_t sel[64];
            double wsel[64], wsum = 0;
            assert_true(rm.K <= 64);
            for (int64_t r = 0; r < rm.K; r++) {
                int64_t b = -1;
                for (int64_t e = 0; e < rm.E; e++) {
                    bool used = false;
                    for (int64_t q2 = 0; q2 < r; q2++) used |= sel[q2] == e;
                    if (!used && (b < 0 || pr[e] > pr[b])) b = e;
                }
                sel[r] = b, wsel[r] = pr[b], wsum += pr[b];
            }
            for (int64_t j = 0; j < D; j++) ffo[j] = 0;
            for (int64_t r = 0; r < rm.K; r++) {
                const int64_t e = sel[r], FE = rm.FE;
                double *eg = ge, *eu = ue, *ed = de;
                if (!ge) { /* Mixtral's per-expert tensors */
                    char nm[96];
                    snprintf(nm, sizeof nm, "blk.%lld.ffn_gate.%lld.weight", (long long)l, (long long)e);
                    eg = ref_tensor(f, nm, NULL, NULL);
                    snprintf(nm, sizeof nm, "blk.%lld.ffn_up.%lld.weight", (long long)l, (long long)e);
                    eu = ref_tensor(f, nm, NULL, NULL);
                    snprintf(nm, sizeof nm, "blk.%lld.ffn_down.%lld.weight", (long long)l, (long long)e);
                    ed = ref_tensor(f, nm, NULL, NULL);
                    assert_true(eg && eu && ed);
                    ref_ffn(tmp, eg, eu, ed, xb, D, FE, g, up);
                    free(eg), free(eu), free(ed);
                } else {
                    ref_ffn(tmp, ge + e * FE * D, ue + e * FE * D, de + e * D * FE, xb, D, FE, g, up);
                }
                const double w = rm.renorm ? wsel[r] / wsum : wsel[r];
                for (int64_t j = 0; j < D; j++) ffo[j] += w * tmp[j];
            }
            if (shi) {
                double sg = 0;
                for (int64_t j = 0; j < D; j++) sg += shi[j] * xb[j];
                ref_ffn(tmp, shg, shu, shd, xb, D, rm.FS, g, up);
                for (int64_t j = 0; j < D; j++) ffo[j] += tmp[j] / (1.0 + exp(-sg));
            }
            for (int64_t j = 0; j < D; j++) x[i * D + j] += ffo[j];
        }
        free(qs);
        free(an), free(wq), free(wk), free(wv), free(wo), free(fn), free(wg), free(wu), free(wd);
        free(bq), free(bk), free(bv), free(qn), free(kn);
        free(wr), free(ge), free(ue), free(de), free(shi), free(shg), free(shu), free(shd);
    }
    for (int64_t i = 0; i < n; i++) {
        ref_rmsnorm(xb, x + i * D, onorm, D, rm.eps);
        ref_mv(logits + i * V, outw ? outw : emb, xb, V, D);
    }
    free(x), free(xb), free(q), free(att), free(kc), free(vc), free(tmp), free(g), free(up), free(sc);
    free(ffo), free(pr);
    free(emb), free(outw), free(onorm), free(rm.rope_fac);
    return logits;
}

/* Error of the engine's logits against the reference over all logits of a
 * 24-token sequence, relative to the reference's RMS logit: max and RMS. */
static void path_error(const char *path, int kv_f32, double *max_rel, double *rms_rel) {
    model_t *m = load_ok(path);
    const int64_t n = 24, V = m->hp.n_vocab;
    int32_t ids[24];
    uint64_t r = 5;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tu_rand(&r) % (uint64_t)V);
    float *all = malloc((size_t)(n * V) * sizeof *all);
    model_ctx_t *c = tu_ctx_new(m, 2, 64, 8, kv_f32); /* blocks of 8: prefill and attention over earlier blocks */
    tu_eval_ok(c, ids, n, all);
    double *ref = ref_forward(m->file, ids, n);
    double maxd = 0, ss = 0, sd = 0;
    for (int64_t i = 0; i < n * V; i++) {
        double d = fabs((double)all[i] - ref[i]);
        if (d > maxd) maxd = d;
        ss += ref[i] * ref[i];
        sd += d * d;
    }
    double rms = sqrt(ss / (double)(n * V));
    *max_rel = maxd / rms;
    *rms_rel = sqrt(sd / (double)(n * V)) / rms;
    free(ref);
    free(all);
    model_ctx_free(c);
    model_free(m);
}

static void arch_error(const char *shape, const char *type, int kv_f32, double *max_rel, double *rms_rel) {
    path_error(tu_tiny_model("model", shape, type, 1), kv_f32, max_rel, rms_rel);
}

/* F32 weights and cache: the only differences are float vs double rounding
 * (sums of a few hundred products, a few layers): relative error ~1e-6;
 * a max of 1e-4 leaves room without hiding a wrong formula (a wrong RoPE
 * pairing, head mapping, bias or norm gives errors of order 1). Q8_0
 * weights also quantize the activations to 8 bits (and the cache is F16):
 * a few % RMS; an RMS bound of 0.05 still tells a correct forward from a
 * wrong one. */
static void arch_case(const char *shape, const char *want_arch) {
    const char *path = tu_tiny_model("model", shape, "f32", 1);
    model_t *m = load_ok(path);
    assert_string_equal(m->hp.arch_name, want_arch);
    model_free(m);
    double m32, r32, m8, r8;
    arch_error(shape, "f32", 1, &m32, &r32);
    arch_error(shape, "q8_0", 0, &m8, &r8);
    print_message("%s: error vs float64 relative to RMS logit: f32 max %.2e rms %.2e; q8_0 max %.2e rms %.2e\n", shape,
                  m32, r32, m8, r8);
    assert_true(m32 < 1e-4);
    assert_true(r8 < 0.05);
}

static void test_arch_llama(void **state) {
    (void)state;
    arch_case("tiny", "llama");
}
static void test_arch_qwen2(void **state) {
    (void)state;
    arch_case("tiny-qwen2", "qwen2");
}
static void test_arch_qwen3(void **state) {
    (void)state;
    arch_case("tiny-qwen3", "qwen3");
}
static void test_arch_llama3_rope(void **state) {
    (void)state;
    const char *path = tu_tiny_model("model", "tiny-llama3", "f32", 1);
    model_t *m = load_ok(path);
    assert_true(m->hp.has_rope_factors);
    model_free(m);
    arch_case("tiny-llama3", "llama");
}

static void test_arch_qwen3moe(void **state) {
    (void)state;
    arch_case("tiny-qwen3moe", "qwen3moe");
}
static void test_arch_qwen2moe(void **state) {
    (void)state;
    arch_case("tiny-qwen2moe", "qwen2moe");
}
static void test_arch_olmoe(void **state) {
    (void)state;
    arch_case("tiny-olmoe", "olmoe");
}
static void test_arch_mixtral(void **state) {
    (void)state;
    const char *path = tu_tiny_model("model", "tiny-mixtral", "f32", 1);
    model_t *m = load_ok(path);
    assert_int_equal(m->hp.n_expert, 4);
    assert_int_equal(m->hp.n_expert_used, 2);
    assert_true(m->hp.moe_norm_w);
    model_free(m);
    arch_case("tiny-mixtral", "llama");
    /* the older per-expert tensors ffn_{gate,up,down}.E */
    char split[512];
    snprintf(split, sizeof split, "%s/test_model_files/model-tiny-mixtral-split-f32.gguf", TERN_BUILD_DIR);
    mk_opts_t o = {.shape = "tiny-mixtral", .type = "f32", .out = split, .seed = 1, .n_threads = 1, .split_experts = true};
    tern_error_t err = {0};
    if (mk_model_write(&o, &err)) fail_msg("mkmodel --split-experts: %s", err.msg);
    gguf_file_t *f = gguf_open(split, &err);
    assert_non_null(f);
    assert_non_null(gguf_tensor_find(f, "blk.1.ffn_down.3.weight"));
    assert_null(gguf_tensor_find(f, "blk.1.ffn_down_exps.weight"));
    gguf_close(f);
    double mx, rms;
    path_error(split, 1, &mx, &rms);
    print_message("tiny-mixtral (per-expert tensors): f32 max %.2e rms %.2e\n", mx, rms);
    assert_true(mx < 1e-4);
}

/* ---- errors ------------------------------------------------------------------------- */

static const char *g_skip_tensor;
static const char *g_bad_shape_tensor;
static bool g_llama3_keys;


/* Rewrite a tiny f32 model with one change; returns the new path. */
static const char *variant_of(const char *shape, const char *tag, const char *arch) {
    static char out[1024];
    snprintf(out, sizeof out, "%s/test_model_files/variant-%s.gguf", TERN_BUILD_DIR, tag);
    tern_error_t err = {0};
    gguf_file_t *src = gguf_open(tu_tiny_model("model", shape, "f32", 1), &err);
    assert_non_null(src);
    gguf_writer_t *w = gguf_writer_new(32);
    assert_non_null(w);
    assert_int_equal(gguf_w_copy_kv(w, src, NULL), 0);
    if (arch) assert_int_equal(gguf_w_str(w, "general.architecture", arch), 0);
    if (g_llama3_keys) {
        const mk_shape_t *sh = mk_shape_find(shape);
        assert_non_null(sh);
        assert_int_equal(gguf_w_str(w, "llama.rope.scaling.type", "llama3"), 0);
        assert_int_equal(gguf_w_f32(w, "llama.rope.scaling.factor", sh->rope_factor), 0);
        assert_int_equal(gguf_w_f32(w, "llama.rope.scaling.low_freq_factor", sh->rope_low_freq), 0);
        assert_int_equal(gguf_w_f32(w, "llama.rope.scaling.high_freq_factor", sh->rope_high_freq), 0);
        assert_int_equal(gguf_w_u32(w, "llama.rope.scaling.original_context_length", (uint32_t)sh->rope_orig_ctx), 0);
    }
    float *junk = NULL;
    for (int64_t i = 0; i < gguf_n_tensors(src); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(src, i);
        if (g_skip_tensor && !strcmp(t->name, g_skip_tensor)) continue;
        if (g_bad_shape_tensor && !strcmp(t->name, g_bad_shape_tensor)) {
            /* Same bytes, one row fewer and a wrong row length. */
            int64_t ne[2] = {t->ne[0] / 2, t->ne[1]};
            junk = calloc((size_t)(ne[0] * ne[1]), sizeof(float));
            assert_int_equal(gguf_w_tensor(w, t->name, TYPE_F32, 2, ne, junk, (uint64_t)(ne[0] * ne[1]) * 4), 0);
            continue;
        }
        assert_int_equal(gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size), 0);
    }
    int rc = gguf_writer_write(w, out, &err);
    if (rc) print_message("write: %s\n", err.msg);
    assert_int_equal(rc, 0);
    gguf_writer_free(w);
    gguf_close(src);
    free(junk);
    return out;
}

static const char *variant(const char *tag, const char *arch) { return variant_of("tiny", tag, arch); }

static void expect_load_error(const char *path, int code, const char *needle) {
    tern_error_t err = {0};
    model_t *m = model_load(path, &err);
    assert_null(m);
    print_message("expected error: %s\n", err.msg);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.msg, needle));
}

static void test_errors(void **state) {
    (void)state;
    g_skip_tensor = g_bad_shape_tensor = NULL;
    expect_load_error(variant("gpt2", "gpt2"), TERN_EUNSUP, "'gpt2'");
    g_skip_tensor = "blk.1.ffn_up.weight";
    expect_load_error(variant("missing", NULL), TERN_EFORMAT, "blk.1.ffn_up.weight");
    g_skip_tensor = NULL;
    g_bad_shape_tensor = "blk.0.attn_k.weight";
    const char *p = variant("shape", NULL);
    tern_error_t err = {0};
    assert_null(model_load(p, &err));
    print_message("expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "blk.0.attn_k.weight"));
    g_bad_shape_tensor = NULL;
    expect_load_error("/nonexistent/model.gguf", TERN_EIO, "/nonexistent/model.gguf");

    /* Bad token id and a full context: errors, nothing appended. */
    model_t *m = load_ok(tu_tiny_model("model", "tiny", "f32", 1));
    model_ctx_t *c = tu_ctx_new(m, 1, 8, 4, false);
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int32_t bad[2] = {1, (int32_t)m->hp.n_vocab};
    assert_int_equal(model_eval(c, bad, 2, NULL, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "out of range"));
    assert_int_equal(model_ctx_pos(c), 0);
    assert_int_equal(model_eval(c, ids, 9, NULL, &err), TERN_ECTXFULL);
    assert_non_null(strstr(err.msg, "context full"));
    assert_int_equal(model_ctx_pos(c), 0);
    tu_eval_ok(c, ids, 8, NULL);
    assert_int_equal(model_eval(c, ids, 1, NULL, &err), TERN_ECTXFULL);
    assert_int_equal(model_ctx_truncate(c, 9, &err), TERN_EINVAL);
    assert_int_equal(model_ctx_truncate(c, 3, &err), 0);
    tu_eval_ok(c, ids, 5, NULL);
    model_ctx_free(c);
    model_free(m);
}

/* Llama 3 RoPE scaling from the keys (no rope_freqs tensor) gives the same
 * frequency factors as the tensor mkmodel computed for the same parameters. */
static void test_llama3_rope_keys(void **state) {
    (void)state;
    model_t *a = load_ok(tu_tiny_model("model", "tiny-llama3", "f32", 1));
    g_skip_tensor = "rope_freqs.weight";
    g_llama3_keys = true;
    const char *p = variant_of("tiny-llama3", "llama3-keys", NULL);
    g_skip_tensor = NULL;
    g_llama3_keys = false;
    model_t *b = load_ok(p);
    assert_non_null(a->rope_factors);
    assert_non_null(b->rope_factors);
    assert_true(gguf_tensor_find(b->file, "rope_freqs.weight") == NULL);
    int64_t np = a->hp.n_rot / 2, n_scaled = 0;
    for (int64_t i = 0; i < np; i++) {
        assert_true(fabsf(a->rope_factors[i] - b->rope_factors[i]) <= 1e-5f * a->rope_factors[i]);
        n_scaled += a->rope_factors[i] != 1.0f;
    }
    assert_true(n_scaled > 0 && n_scaled < np); /* the blend really applies to some pairs, not all */
    model_free(a);
    model_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_greedy_f32), cmocka_unit_test(test_stories_greedy_f16),
        cmocka_unit_test(test_stories_logits),     cmocka_unit_test(test_stories_prompt),
        cmocka_unit_test(test_arch_llama),         cmocka_unit_test(test_arch_qwen2),
        cmocka_unit_test(test_arch_qwen3),         cmocka_unit_test(test_arch_llama3_rope),
        cmocka_unit_test(test_arch_qwen3moe),      cmocka_unit_test(test_arch_qwen2moe),
        cmocka_unit_test(test_arch_olmoe),         cmocka_unit_test(test_arch_mixtral),
        cmocka_unit_test(test_llama3_rope_keys),   cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
