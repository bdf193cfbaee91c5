/* test_moe_cache.c - Mixture-of-Experts models with their routed experts
 * read through the expert cache (expert_cache.c): every logit of a prompt
 * (blocks of tokens) and of a decode (one token at a time) is bit-identical
 * to the run that reads the experts through the mapping, whatever the cache
 * size (one expert, a few, all of them), the next-layer prefetch, usage
 * pinning and the thread count; the cache's counters say what happened
 * (misses and evictions in a small cache, hits in a full one, pinned
 * slots after a saved usage file); a damaged usage file is ignored. */
// ctest-label: concurrent
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/expert_cache.h"
#include "model/model.h"

enum { N_PROMPT = 12, N_GEN = 6 };

typedef struct {
    uint64_t slots; /* 0: no cache; else cache of that many slots */
    bool prefetch;
    const char *pin; /* usage file, or NULL */
    double share;
    int threads;
    bool per_layer;
    uint32_t chunk; /* smallest read (0: the default) */
} run_t;

/* The logits of a prompt (all positions) and of N_GEN decoded tokens
 * (fixed ids), (N_PROMPT + N_GEN) x V floats; the cache's counters. */
static float *run(const char *path, const run_t *r, ec_stats_t *st) {
    tern_error_t err = {0};
    model_t *m = model_load(path, &err);
    if (!m) fail_msg("%s: %s", path, err.msg);
    if (r->slots) {
        const ec_params_t p = {.bytes = r->slots * ec_slot_bytes(m),
                               .io_threads = 3,
                               .pin_path = r->pin,
                               .pin_share = r->share,
                               .per_layer = r->per_layer,
                               .chunk_bytes = r->chunk};
        if (model_expert_cache(m, path, &p, r->prefetch, &err))
            fail_msg("expert cache: %s", err.msg);
    }
    const int64_t V = m->hp.n_vocab;
    float *out = malloc((size_t)((N_PROMPT + N_GEN) * V) * sizeof *out);
    assert_non_null(out);
    int32_t ids[N_PROMPT + N_GEN];
    uint64_t s = 3;
    for (int i = 0; i < N_PROMPT + N_GEN; i++) ids[i] = (int32_t)(tu_rand(&s) % (uint64_t)V);
    model_ctx_t *c = tu_ctx_new(m, r->threads, 64, 5, false); /* blocks of 5: three prompt blocks */
    tu_eval_ok(c, ids, N_PROMPT, out);
    for (int i = 0; i < N_GEN; i++) {
        tu_eval_ok(c, ids + N_PROMPT + i, 1, NULL);
        memcpy(out + (N_PROMPT + i) * V, model_ctx_logits(c), (size_t)V * sizeof *out);
    }
    memset(st, 0, sizeof *st);
    if (m->ec) ec_stats(m->ec, st);
    model_ctx_free(c);
    model_free(m); /* saves the usage counts when a usage file is set */
    return out;
}

static void same(const float *a, const float *b, int64_t n, const char *what) {
    if (memcmp(a, b, (size_t)n * sizeof *a) != 0) {
        int64_t i = 0;
        while (a[i] == b[i]) i++;
        fail_msg("%s: logit %lld differs: %.9g vs %.9g", what, (long long)i, (double)a[i], (double)b[i]);
    }
}

static void cache_case(const char *shape, const char *type) {
    const char *path = tu_tiny_model("moec", shape, type, 5);
    tern_error_t err = {0};
    model_t *m = model_load(path, &err);
    assert_non_null(m);
    const int64_t V = m->hp.n_vocab, n = (N_PROMPT + N_GEN) * V;
    const uint64_t all = (uint64_t)(m->hp.n_layer * m->hp.n_expert);
    model_free(m);

    ec_stats_t st;
    run_t base = {.threads = 2};
    float *want = run(path, &base, &st);
    assert_int_equal(st.n_slots, 0);

    /* one slot: every expert evicts the one before; reads of one 4 KiB unit
     * (each matrix in several chunks, read by three threads in parallel) */
    run_t one = {.slots = 1, .threads = 2, .chunk = 4096};
    float *got = run(path, &one, &st);
    same(want, got, n, "cache of 1 expert");
    assert_int_equal(st.n_slots, 1);
    assert_true(st.misses > 0 && st.evictions > 0);
    free(got);

    /* a few slots, with prefetch, 1 and 3 threads */
    for (int th = 1; th <= 3; th += 2) {
        run_t few = {.slots = 3, .prefetch = true, .threads = th};
        got = run(path, &few, &st);
        char what[64];
        snprintf(what, sizeof what, "cache of 3 experts, prefetch, %d threads", th);
        same(want, got, n, what);
        assert_true(st.prefetched > 0);
        assert_true(st.pred_total > 0);
        free(got);
    }

    /* per-layer LRU lists, 2 slots per layer */
    run_t per = {.slots = 2 * (uint64_t)(all / 8 > 0 ? all / 8 : 1), .per_layer = true, .threads = 2};
    got = run(path, &per, &st);
    same(want, got, n, "per-layer LRU");
    free(got);

    /* all experts: the later tokens hit */
    run_t full = {.slots = all, .threads = 2};
    got = run(path, &full, &st);
    same(want, got, n, "cache of all experts");
    assert_true(st.hits > 0);
    assert_int_equal(st.evictions, 0);
    free(got);

    /* pinning: a first run counts and saves the uses, the second pins the
     * hottest experts at start */
    char pin[512];
    snprintf(pin, sizeof pin, "%s/test_model_files/moec-%s-%d.usage", TERN_BUILD_DIR, shape, (int)getpid());
    unlink(pin);
    run_t counting = {.slots = 4, .pin = pin, .share = 0.5, .threads = 2};
    got = run(path, &counting, &st);
    same(want, got, n, "cache of 4, counting uses");
    assert_int_equal(st.n_pinned, 0);
    free(got);
    assert_int_equal(access(pin, R_OK), 0);
    got = run(path, &counting, &st);
    same(want, got, n, "cache of 4, 2 pinned");
    assert_int_equal(st.n_pinned, 2);
    free(got);
    /* a damaged usage file is ignored (no pinning), the run unchanged */
    FILE *f = fopen(pin, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    fputc(0x5a, f);
    fclose(f);
    got = run(path, &counting, &st);
    same(want, got, n, "cache of 4, damaged usage file");
    assert_int_equal(st.n_pinned, 0);
    free(got);
    unlink(pin);
    free(want);
    print_message("%s %s: identical with caches of 1, 3 (prefetch) and %llu experts, and with pinning\n", shape, type,
                  (unsigned long long)all);
}

/* Two contexts of one model decode at the same time through a cache of one
 * expert (each waits for the other to put the slot back): both get the
 * logits of the mapped run. */
typedef struct {
    model_t *m;
    float *out;
} peer_t;

static void *peer_main(void *arg) {
    peer_t *p = arg;
    const int64_t V = p->m->hp.n_vocab;
    int32_t ids[N_PROMPT + N_GEN];
    uint64_t s = 3;
    for (int i = 0; i < N_PROMPT + N_GEN; i++) ids[i] = (int32_t)(tu_rand(&s) % (uint64_t)V);
    model_ctx_t *c = tu_ctx_new(p->m, 1, 64, 5, false);
    tu_eval_ok(c, ids, N_PROMPT, p->out);
    for (int i = 0; i < N_GEN; i++) {
        tu_eval_ok(c, ids + N_PROMPT + i, 1, NULL);
        memcpy(p->out + (N_PROMPT + i) * V, model_ctx_logits(c), (size_t)V * sizeof *p->out);
    }
    model_ctx_free(c);
    return NULL;
}

static void test_shared_cache(void **state) {
    (void)state;
    const char *path = tu_tiny_model("moec", "tiny-qwen3moe", "q8_0", 5);
    ec_stats_t st;
    run_t base = {.threads = 1};
    float *want = run(path, &base, &st);
    tern_error_t err = {0};
    model_t *m = model_load(path, &err);
    assert_non_null(m);
    const ec_params_t p = {.bytes = ec_slot_bytes(m), .io_threads = 2};
    assert_int_equal(model_expert_cache(m, path, &p, false, &err), 0);
    const int64_t n = (N_PROMPT + N_GEN) * m->hp.n_vocab;
    peer_t peers[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        peers[i] = (peer_t){m, malloc((size_t)n * sizeof(float))};
        assert_non_null(peers[i].out);
        assert_int_equal(pthread_create(&th[i], NULL, peer_main, &peers[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        same(want, peers[i].out, n, "two contexts sharing a cache of one expert");
        free(peers[i].out);
    }
    model_free(m);
    free(want);
}

/* mkmodel's untied MoE shapes route a stream of random tokens over all the
 * experts, as a trained router does over real text, not onto a few experts
 * whatever the token (mkmodel.c, moe_std_factor: the token's embedding
 * dominates the residual stream). 64 random tokens through tiny-olmoe (8
 * experts, 2 used), the uses of each (layer, expert) counted by the cache's
 * usage file: in every layer the two most used experts take under 45% of
 * the selections (uniform: 25%; before that scaling: 42% in layer 0, 82%
 * in layer 1). */
static void test_routing_spread(void **state) {
    (void)state;
    const char *path = tu_tiny_model("moes", "tiny-olmoe", "q8_0", 5);
    char pin[512];
    snprintf(pin, sizeof pin, "%s/test_model_files/moes-%d.usage", TERN_BUILD_DIR, (int)getpid());
    unlink(pin);
    tern_error_t err = {0};
    model_t *m = model_load(path, &err);
    assert_non_null(m);
    const int64_t L = m->hp.n_layer, E = m->hp.n_expert, K = m->hp.n_expert_used, V = m->hp.n_vocab;
    const ec_params_t p = {
        .bytes = (uint64_t)(L * E) * ec_slot_bytes(m), .io_threads = 2, .pin_path = pin}; /* counts, no pinning */
    assert_int_equal(model_expert_cache(m, path, &p, false, &err), 0);
    model_ctx_t *c = tu_ctx_new(m, 2, 128, 1, false);
    uint64_t s = 17;
    for (int i = 0; i < 64; i++) {
        int32_t id = (int32_t)(tu_rand(&s) % (uint64_t)V);
        tu_eval_ok(c, &id, 1, NULL);
    }
    model_ctx_free(c);
    model_free(m); /* saves the counts */
    size_t len = 0;
    unsigned char *b = (unsigned char *)tu_read_file(pin, &len);
    assert_non_null(b);
    FILE *mf = fopen(path, "rb");
    assert_non_null(mf);
    assert_int_equal(fseek(mf, 0, SEEK_END), 0);
    const uint64_t fsize = (uint64_t)ftell(mf);
    fclose(mf);
    uint32_t *counts = calloc((size_t)(L * E), sizeof *counts);
    assert_non_null(counts);
    assert_int_equal(ec_parse_counts(b, len, L, E, fsize, counts), 0);
    for (int64_t l = 0; l < L; l++) {
        uint64_t tot = 0, top1 = 0, top2 = 0;
        for (int64_t e = 0; e < E; e++) {
            const uint32_t v = counts[l * E + e];
            tot += v;
            if (v > top1) {
                top2 = top1;
                top1 = v;
            } else if (v > top2) {
                top2 = v;
            }
        }
        assert_int_equal(tot, 64 * (uint64_t)K);
        const double share = (double)(top1 + top2) / (double)tot;
        print_message("tiny-olmoe layer %lld: the 2 most used of %lld experts take %.1f%% of %llu selections\n",
                      (long long)l, (long long)E, 100 * share, (unsigned long long)tot);
        assert_true(share < 0.45);
    }
    free(counts);
    free(b);
    unlink(pin);
}

static void test_qwen3moe(void **state) {
    (void)state;
    cache_case("tiny-qwen3moe", "q8_0");
}

static void test_qwen2moe(void **state) {
    (void)state;
    cache_case("tiny-qwen2moe", "q4_k_m");
}

static void test_mixtral(void **state) {
    (void)state;
    cache_case("tiny-mixtral", "q4_0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3moe),
        cmocka_unit_test(test_qwen2moe),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_shared_cache),
        cmocka_unit_test(test_routing_spread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
