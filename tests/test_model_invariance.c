/* test_model_invariance.c - the same bits whatever the thread count and the
 * prefill batch size: on the tiny `tern mkmodel` shape in every type (and
 * the other tiny shapes: K-format fallback, qwen2, qwen3, llama3 RoPE), a
 * 32-token prompt then 32 greedy tokens give byte-identical logits at every
 * step at -t 1, 2, 3, 4 and with prefill blocks of 1, 7 and 512; the logits
 * of every prompt position from a prefill block equal those of decoding the
 * positions one at a time. The big shapes (smollm2-135m, qwen2.5-0.5b,
 * llama3.2-1b) are too large for test time: `tern bench --check N` runs the
 * same comparison on them (make demo does, at 1 and 2 threads).
 */
// ctest-label: concurrent
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define N_PROMPT 32
#define N_GEN 32

typedef struct {
    float *prompt_logits; /* N_PROMPT x V */
    float *gen_logits;    /* N_GEN x V: logits after each generated token */
    int32_t gen[N_GEN];
    double dispatches_per_token;
} run_t;

static void run_free(run_t *r) {
    free(r->prompt_logits);
    free(r->gen_logits);
}

static void one_run(const model_t *m, int threads, int64_t batch, const int32_t *prompt, run_t *r) {
    const int64_t V = m->hp.n_vocab;
    model_ctx_params_t p = model_ctx_default_params();
    p.n_threads = threads;
    p.n_ctx = N_PROMPT + N_GEN + 1;
    p.n_batch = batch;
    tern_error_t err = {0};
    model_ctx_t *c = model_ctx_new(m, &p, NULL, 0, &err);
    if (!c) print_message("%s\n", err.msg);
    assert_non_null(c);
    assert_int_equal(model_ctx_threads(c), threads);
    /* The tiny model's matrices are below the pool's serial gate: without
     * this, every run would be serial and the test would prove nothing. */
    tern_pool_set_gate(model_ctx_pool(c), 0);
    r->prompt_logits = malloc((size_t)(N_PROMPT * V) * sizeof(float));
    r->gen_logits = malloc((size_t)(N_GEN * V) * sizeof(float));
    assert_true(r->prompt_logits && r->gen_logits);
    int rc = model_eval(c, prompt, N_PROMPT, r->prompt_logits, &err);
    if (rc) print_message("%s\n", err.msg);
    assert_int_equal(rc, 0);
    uint64_t d0 = tern_pool_dispatch_count();
    for (int i = 0; i < N_GEN; i++) {
        const float *lg = model_ctx_logits(c);
        int32_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = (int32_t)v;
        r->gen[i] = best;
        assert_int_equal(model_eval(c, &best, 1, NULL, &err), 0);
        memcpy(r->gen_logits + i * V, model_ctx_logits(c), (size_t)V * sizeof(float));
    }
    r->dispatches_per_token = (double)(tern_pool_dispatch_count() - d0) / N_GEN;
    model_ctx_free(c);
}

static void check_same(const run_t *a, const run_t *b, int64_t V, const char *what) {
    if (memcmp(a->prompt_logits, b->prompt_logits, (size_t)(N_PROMPT * V) * sizeof(float)) ||
        memcmp(a->gen, b->gen, sizeof a->gen) ||
        memcmp(a->gen_logits, b->gen_logits, (size_t)(N_GEN * V) * sizeof(float))) {
        print_message("logits differ: %s\n", what);
        fail();
    }
}

static void invariance(const char *shape, const char *type) {
    const char *path = tu_tiny_model("inv", shape, type, 7);
    tern_error_t err = {0};
    model_t *m = model_load(path, &err);
    if (!m) print_message("%s\n", err.msg);
    assert_non_null(m);
    const int64_t V = m->hp.n_vocab;
    int32_t prompt[N_PROMPT];
    uint64_t s = 11;
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(tu_rand(&s) % (uint64_t)V);

    /* Reference: 1 thread, the prompt in one block. */
    run_t ref;
    one_run(m, 1, 512, prompt, &ref);
    /* Not degenerate: the logits vary and greedy does not repeat one id. */
    int distinct = 0;
    for (int i = 1; i < N_GEN; i++) distinct += ref.gen[i] != ref.gen[0];
    assert_true(distinct > 0);

    static const struct {
        int threads;
        int64_t batch;
    } cfg[] = {{2, 512}, {3, 512}, {4, 512}, {1, 1}, {2, 7}, {4, 7}, {3, 1}};
    const int n_cfg = tu_quick() ? 3 : (int)(sizeof cfg / sizeof cfg[0]);
    for (int k = 0; k < n_cfg; k++) {
        /* In quick mode: one thread change, batch 1, batch 7 */
        int idx = tu_quick() ? (k == 0 ? 0 : k == 1 ? 3 : 5) : k;
        run_t r;
        one_run(m, cfg[idx].threads, cfg[idx].batch, prompt, &r);
        char what[128];
        snprintf(what, sizeof what, "%s %s: -t %d -b %lld vs -t 1 -b 512", shape, type, cfg[idx].threads,
                 (long long)cfg[idx].batch);
        check_same(&ref, &r, V, what);
        run_free(&r);
    }
    print_message("%s %s: identical across threads and batch sizes\n", shape, type);
    run_free(&ref);
    model_free(m);
}

/* Dispatches per decoded token with 2 threads and no gate: Q/K/V,
 * attention, O, gate/up, down per layer plus the output, never more; and
 * the pool really ran (at least one dispatch per matrix group). */
static void test_dispatch_count(void **state) {
    (void)state;
    tern_error_t err = {0};
    model_t *m = model_load(tu_tiny_model("inv", "tiny", "q8_0", 7), &err);
    assert_non_null(m);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = i + 3;
    run_t r;
    one_run(m, 2, 512, prompt, &r);
    print_message("%.1f dispatches per decoded token (%lld layers)\n", r.dispatches_per_token, (long long)m->hp.n_layer);
    assert_true(r.dispatches_per_token <= 5.0 * (double)m->hp.n_layer + 1.0);
    assert_true(r.dispatches_per_token >= 4.0 * (double)m->hp.n_layer + 1.0);
    run_free(&r);
    model_free(m);
}

static const char *const all_types[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", "q4_1",  "q5_0",
                                        "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m"};

static void test_tiny_every_type(void **state) {
    (void)state;
    const int n = (int)(sizeof all_types / sizeof all_types[0]);
    for (int i = 0; i < n; i++) {
        /* Sanitizer builds: every fourth type (the -O2 build runs them all). */
        if (tu_quick() && i % 4) continue;
        invariance("tiny", all_types[i]);
    }
}

static void test_other_shapes(void **state) {
    (void)state;
    invariance("tiny-64", "q4_k_m"); /* K formats fall back to Q5_0/Q8_0 rows */
    invariance("tiny-qwen3", "q4_k");
    if (tu_quick()) return;
    invariance("tiny-qwen2", "q8_0");
    invariance("tiny-llama3", "q4_0");
}

/* Mixture of Experts: each architecture, in a quantized mix whose routed
 * experts fall back to the 32-block formats (their rows are 128 long) */
static void test_moe_shapes(void **state) {
    (void)state;
    invariance("tiny-qwen3moe", "q4_k_m");
    invariance("tiny-qwen2moe", "q8_0");
    invariance("tiny-olmoe", "q4_0");
    invariance("tiny-mixtral", "q5_k_m");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_every_type),
        cmocka_unit_test(test_other_shapes),
        cmocka_unit_test(test_moe_shapes),
        cmocka_unit_test(test_dispatch_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
