/* test_sampler.c - the sampling chain of sampler.h: greedy and ties, each
 * truncation step against probabilities computed here in double, the
 * penalties against hand-derived logits, the fixed chain order, seeded
 * reproducibility, and parameter validation. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/sampler.h"

static tern_sampler_params_t neutral(void) {
    tern_sampler_params_t p;
    memset(&p, 0, sizeof p);
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 1234;
    return p;
}

static sampler_t *mk(const tern_sampler_params_t *p, int32_t n) {
    tern_error_t err = {0};
    sampler_t *s = sampler_create(p, n, &err);
    if (!s) print_message("sampler_create: %s\n", err.msg);
    assert_non_null(s);
    return s;
}

/* Empirical frequencies of N draws. */
static void draw(sampler_t *s, const float *logits, int32_t n, int draws, double *freq) {
    for (int32_t i = 0; i < n; i++) freq[i] = 0;
    for (int d = 0; d < draws; d++) {
        int32_t id = sampler_sample(s, logits);
        assert_true(id >= 0 && id < n);
        freq[id] += 1.0 / draws;
    }
}

/* |f - p| within 5 binomial standard deviations (and a small floor). */
static void assert_freq(double f, double p, int draws) {
    double sd = sqrt(p * (1 - p) / draws);
    if (fabs(f - p) > 5 * sd + 1e-3) {
        print_message("frequency %.4f, expected %.4f (sd %.4f)\n", f, p, sd);
        fail();
    }
}

/* Logits whose softmax (at temperature 1) is exactly probs. */
static void logits_of(const double *probs, int32_t n, float *logits) {
    for (int32_t i = 0; i < n; i++) logits[i] = (float)log(probs[i]);
}

static void test_greedy_and_ties(void **state) {
    (void)state;
    tern_sampler_params_t p = neutral();
    p.temp = 0;
    sampler_t *s = mk(&p, 6);
    const float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, -3.0f};
    assert_int_equal(sampler_sample(s, l), 1); /* first of the tied maxima */
    const float l2[6] = {0, 0, 0, 0, 0, 0};
    assert_int_equal(sampler_sample(s, l2), 0);
    sampler_free(s);
}

static void test_plain_distribution(void **state) {
    (void)state;
    const double probs[5] = {0.4, 0.25, 0.2, 0.1, 0.05};
    float l[5];
    logits_of(probs, 5, l);
    tern_sampler_params_t p = neutral();
    sampler_t *s = mk(&p, 5);
    const int N = tu_quick() ? 20000 : 100000;
    double f[5];
    draw(s, l, 5, N, f);
    for (int i = 0; i < 5; i++) assert_freq(f[i], probs[i], N);
    sampler_free(s);
}

static void test_temperature(void **state) {
    (void)state;
    const double probs[3] = {0.6, 0.3, 0.1};
    float l[3];
    logits_of(probs, 3, l);
    tern_sampler_params_t p = neutral();
    p.temp = 0.5f; /* p_i^(1/T) renormalized = p_i^2 / sum p^2 */
    sampler_t *s = mk(&p, 3);
    const int N = tu_quick() ? 20000 : 100000;
    double f[3], z = 0.36 + 0.09 + 0.01;
    draw(s, l, 3, N, f);
    assert_freq(f[0], 0.36 / z, N);
    assert_freq(f[1], 0.09 / z, N);
    assert_freq(f[2], 0.01 / z, N);
    sampler_free(s);
}

static void test_top_k(void **state) {
    (void)state;
    const double probs[5] = {0.1, 0.4, 0.05, 0.3, 0.15};
    float l[5];
    logits_of(probs, 5, l);
    tern_sampler_params_t p = neutral();
    p.top_k = 2; /* keeps ids 1 and 3: 0.4 / 0.7 and 0.3 / 0.7 */
    sampler_t *s = mk(&p, 5);
    const int N = tu_quick() ? 20000 : 60000;
    double f[5];
    draw(s, l, 5, N, f);
    assert_true(f[0] == 0 && f[2] == 0 && f[4] == 0);
    assert_freq(f[1], 0.4 / 0.7, N);
    assert_freq(f[3], 0.3 / 0.7, N);
    sampler_free(s);

    /* A large vocabulary through the heap path: top-1 is the argmax. */
    const int32_t V = 50000;
    float *big = malloc((size_t)V * sizeof *big);
    assert_non_null(big);
    uint64_t r = 7;
    for (int32_t i = 0; i < V; i++) big[i] = tu_randn(&r);
    big[31337] = 10.0f;
    p.top_k = 1;
    s = mk(&p, V);
    for (int i = 0; i < 20; i++) assert_int_equal(sampler_sample(s, big), 31337);
    sampler_free(s);
    free(big);
}

static void test_top_p(void **state) {
    (void)state;
    const double probs[4] = {0.15, 0.5, 0.05, 0.3};
    float l[4];
    logits_of(probs, 4, l);
    tern_sampler_params_t p = neutral();
    p.top_p = 0.75f; /* 0.5 < 0.75 <= 0.8: keeps ids 1, 3 */
    sampler_t *s = mk(&p, 4);
    const int N = tu_quick() ? 20000 : 60000;
    double f[4];
    draw(s, l, 4, N, f);
    assert_true(f[0] == 0 && f[2] == 0);
    assert_freq(f[1], 0.5 / 0.8, N);
    sampler_free(s);
    p.top_p = 0.85f; /* 0.8 < 0.85 <= 0.95: adds id 0 */
    s = mk(&p, 4);
    draw(s, l, 4, N, f);
    assert_true(f[2] == 0);
    assert_freq(f[0], 0.15 / 0.95, N);
    sampler_free(s);
}

static void test_min_p(void **state) {
    (void)state;
    const double probs[4] = {0.5, 0.3, 0.15, 0.05};
    float l[4];
    logits_of(probs, 4, l);
    tern_sampler_params_t p = neutral();
    p.min_p = 0.25f; /* threshold 0.125: keeps 0, 1, 2 */
    sampler_t *s = mk(&p, 4);
    const int N = tu_quick() ? 20000 : 60000;
    double f[4];
    draw(s, l, 4, N, f);
    assert_true(f[3] == 0);
    assert_freq(f[2], 0.15 / 0.95, N);
    sampler_free(s);
}

/* Truncation happens at temperature 1, before the temperature: a huge
 * temperature after top-k 2 makes the two survivors equally likely but
 * never revives a third token. */
static void test_chain_order(void **state) {
    (void)state;
    const double probs[4] = {0.5, 0.3, 0.15, 0.05};
    float l[4];
    logits_of(probs, 4, l);
    tern_sampler_params_t p = neutral();
    p.top_k = 2;
    p.temp = 1000.0f;
    sampler_t *s = mk(&p, 4);
    const int N = 20000;
    double f[4];
    draw(s, l, 4, N, f);
    assert_true(f[2] == 0 && f[3] == 0);
    assert_freq(f[0], 0.5, N);
    sampler_free(s);
    /* top-p then min-p: top_p 0.9 keeps {0,1,2}; min_p 0.5 (threshold 0.25)
     * then keeps {0,1}. In the other order min-p first would give the same
     * set here, so also check that top-p's mass is computed before the
     * temperature: at temp 1000 all four would be needed to reach 0.9. */
    p.top_k = 0;
    p.top_p = 0.9f;
    p.min_p = 0.5f;
    s = mk(&p, 4);
    draw(s, l, 4, N, f);
    assert_true(f[2] == 0 && f[3] == 0);
    sampler_free(s);
}

static void test_penalties(void **state) {
    (void)state;
    tern_sampler_params_t p = neutral();
    p.temp = 0;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 3;
    sampler_t *s = mk(&p, 4);
    /* id 0: 3.0 -> 1.5 once seen; id 1: 2.0 stays; id 2: -1 -> -2. */
    const float l[4] = {3.0f, 2.0f, -1.0f, 1.0f};
    assert_int_equal(sampler_sample(s, l), 0);
    sampler_accept(s, 0);
    assert_int_equal(sampler_sample(s, l), 1);
    /* The window holds 3 ids: three others push id 0 out. */
    sampler_accept(s, 3);
    sampler_accept(s, 3);
    assert_int_equal(sampler_sample(s, l), 1);
    sampler_accept(s, 2);
    assert_int_equal(sampler_sample(s, l), 0);
    /* Input logits are never modified. */
    assert_true(l[0] == 3.0f && l[2] == -1.0f);
    sampler_free(s);

    /* frequency: l -= 0.4 * count; presence: l -= 0.3 once. id 0 seen twice:
     * 3.0 - 0.8 - 0.3 = 1.9 < 2.0, so id 1 wins; seen once: 3.0 - 0.7 = 2.3. */
    p = neutral();
    p.temp = 0;
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.3f;
    s = mk(&p, 4);
    sampler_accept(s, 0);
    assert_int_equal(sampler_sample(s, l), 0);
    sampler_accept(s, 0);
    assert_int_equal(sampler_sample(s, l), 1);
    sampler_reset(s);
    assert_int_equal(sampler_sample(s, l), 0);
    sampler_free(s);
}

static void test_seed_reproducible(void **state) {
    (void)state;
    const int32_t V = 1000;
    float *l = malloc((size_t)V * sizeof *l);
    assert_non_null(l);
    uint64_t r = 99;
    for (int32_t i = 0; i < V; i++) l[i] = tu_randn(&r);
    tern_sampler_params_t p = neutral();
    p.top_k = 50;
    p.top_p = 0.9f;
    p.temp = 0.9f;
    p.repeat_penalty = 1.1f;
    int32_t a[200], b[200], c[200];
    sampler_t *s1 = mk(&p, V), *s2 = mk(&p, V);
    p.seed = 4321;
    sampler_t *s3 = mk(&p, V);
    for (int i = 0; i < 200; i++) {
        a[i] = sampler_sample(s1, l);
        sampler_accept(s1, a[i]);
        b[i] = sampler_sample(s2, l);
        sampler_accept(s2, b[i]);
        c[i] = sampler_sample(s3, l);
        sampler_accept(s3, c[i]);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    /* reset restarts the RNG: the same sequence again */
    sampler_reset(s1);
    for (int i = 0; i < 200; i++) {
        int32_t id = sampler_sample(s1, l);
        sampler_accept(s1, id);
        assert_int_equal(id, a[i]);
    }
    sampler_free(s1);
    sampler_free(s2);
    sampler_free(s3);
    free(l);
}

static void test_uniform_range(void **state) {
    (void)state;
    tern_sampler_params_t p = neutral();
    sampler_t *s = mk(&p, 2);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = sampler_uniform(s);
        assert_true(u >= 0 && u < 1);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.01);
    sampler_free(s);
}

static void test_bad_params(void **state) {
    (void)state;
    tern_error_t err = {0};
    tern_sampler_params_t p = neutral();
    p.top_p = 1.5f;
    assert_null(sampler_create(&p, 10, &err));
    assert_non_null(strstr(err.msg, "top_p"));
    p = neutral();
    p.repeat_penalty = 0;
    assert_null(sampler_create(&p, 10, &err));
    assert_non_null(strstr(err.msg, "repeat_penalty"));
    p = neutral();
    p.temp = NAN;
    assert_null(sampler_create(&p, 10, &err));
    p = neutral();
    assert_null(sampler_create(&p, 0, &err));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),  cmocka_unit_test(test_plain_distribution),
        cmocka_unit_test(test_temperature),      cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),            cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_chain_order),      cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_seed_reproducible), cmocka_unit_test(test_uniform_range),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
