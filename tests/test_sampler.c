/* test_sampler.c - the sampling chain of sampler.h: greedy and ties, each
 * truncation step against probabilities computed here in double, the
 * penalties against hand-derived logits, the default chain order and the
 * default chain against an independent reference of the documented steps
 * (same tokens for the same seed), custom chains, the mask stage, the logit
 * bias, seeded reproducibility, parameter validation, and the state blob
 * (snapshot/restore, and hostile blobs rejected). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/argmax.h"
#include "text/sampler.h"
#include "text/softmax.h"

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


/* ---- the default chain against a reference ------------------------------- */

/* The documented steps written out plainly: penalties on a dense copy;
 * top-k as the prefix of one full sort (a total order, so the same as
 * top-k's selection); top-p, min-p and the draw by the probabilities of
 * tern_sampler.h: the sum of tern_expf over the set in the order it has
 * when the stage starts (8 stripes, written out here), then a walk over
 * the set sorted best first; a splitmix64 draw. */
typedef struct {
    int32_t id;
    float l;
} ref_c;
static int ref_cmp(const void *pa, const void *pb) {
    const ref_c *a = pa, *b = pb;
    if (isnan(a->l) || isnan(b->l)) /* NaNs after every number, by id */
        return isnan(a->l) != isnan(b->l) ? (isnan(a->l) ? 1 : -1) : (a->id > b->id) - (a->id < b->id);
    if (a->l > b->l || (a->l == b->l && a->id < b->id)) return -1;
    if (b->l > a->l || (a->l == b->l && b->id < a->id)) return 1;
    return 0;
}
static uint64_t ref_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* The largest non-NaN logit of c[0..n) (-inf if none), and the striped sum. */
static float ref_max(const ref_c *c, int32_t n) {
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (c[i].l > m) m = c[i].l;
    return m;
}
static double ref_sum(const ref_c *c, int32_t n, float mx, float t) {
    double st[8] = {0};
    for (int32_t i = 0; i < n; i++) st[i % 8] += (double)tern_expf((c[i].l - mx) / t);
    return ((st[0] + st[1]) + (st[2] + st[3])) + ((st[4] + st[5]) + (st[6] + st[7]));
}
static int32_t ref_sample(const tern_sampler_params_t *p, const float *logits, int32_t V, const int32_t *win, int nw,
                          uint64_t *rng, ref_c *c) {
    for (int32_t i = 0; i < V; i++) c[i] = (ref_c){i, logits[i]};
    bool pen = p->repeat_last_n > 0 && nw > 0 &&
               (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
    for (int32_t id = 0; pen && id < V; id++) {
        int cnt = 0;
        for (int j = 0; j < nw; j++) cnt += win[j] == id;
        if (!cnt) continue;
        float l = c[id].l;
        l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)cnt * p->frequency_penalty + p->presence_penalty;
        c[id].l = l;
    }
    if (p->temp <= 0) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (c[i].l > c[best].l) best = i;
        return best;
    }
    int32_t n = V;
    bool sorted = false;
    if (p->top_k > 0 && p->top_k < V) {
        qsort(c, (size_t)V, sizeof *c, ref_cmp);
        sorted = true;
        n = p->top_k;
    }
    if (p->top_p < 1.0f) {
        const float mx = ref_max(c, n);
        const double sum = ref_sum(c, n, mx, 1.0f);
        if (!sorted) qsort(c, (size_t)n, sizeof *c, ref_cmp);
        sorted = true;
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += (float)(tern_expf((c[i].l - mx) / 1.0f) / sum);
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        if (!sorted) qsort(c, (size_t)n, sizeof *c, ref_cmp);
        sorted = true;
        int32_t k = 1;
        while (k < n && c[k].l >= c[0].l + logf(p->min_p)) k++;
        n = k;
    }
    const float mx = ref_max(c, n);
    const double sum = ref_sum(c, n, mx, p->temp);
    double r = (double)(ref_rng(rng) >> 11) * (1.0 / 9007199254740992.0), cum = 0;
    if (!sorted) qsort(c, (size_t)n, sizeof *c, ref_cmp);
    for (int32_t i = 0; i < n; i++) {
        cum += (float)(tern_expf((c[i].l - mx) / p->temp) / sum);
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id;
}

/* One step of a chain against ref_sample: the same token, then accepted
 * by both (the penalty window the reference keeps here, its own RNG). */
typedef struct {
    int32_t win[64];
    int nw, head;
    uint64_t rng;
} ref_run;
static void ref_check(sampler_t *s, const tern_sampler_params_t *p, const float *l, int32_t V, ref_run *rr, ref_c *c,
                      int k, int t) {
    const int32_t want = ref_sample(p, l, V, rr->win, rr->nw, &rr->rng, c);
    const int32_t got = sampler_sample(s, l);
    if (got != want) fail_msg("config %d step %d: chain %d, reference %d", k, t, got, want);
    sampler_accept(s, got);
    if (p->repeat_last_n > 0) {
        rr->win[rr->head] = got;
        rr->head = (rr->head + 1) % p->repeat_last_n;
        if (rr->nw < p->repeat_last_n) rr->nw++;
    }
}

static void test_default_chain_matches_reference(void **state) {
    (void)state;
    const int32_t V = 1000;
    const int steps = tu_quick() ? 100 : 400;
    float *l = malloc((size_t)V * sizeof *l);
    ref_c *c = malloc((size_t)V * sizeof *c);
    assert_true(l && c);
    tern_sampler_params_t cfg[6];
    for (int k = 0; k < 6; k++) cfg[k] = neutral();
    cfg[0].temp = 0.8f, cfg[0].top_k = 40, cfg[0].top_p = 0.95f, cfg[0].min_p = 0.05f, cfg[0].seed = 0x7e57;
    cfg[1].temp = 0, cfg[1].repeat_penalty = 1.3f, cfg[1].frequency_penalty = 0.2f, cfg[1].repeat_last_n = 16;
    cfg[2].temp = 1.3f, cfg[2].top_p = 0.7f, cfg[2].repeat_penalty = 1.1f, cfg[2].seed = 42;
    cfg[3].temp = 0.6f, cfg[3].top_k = 5, cfg[3].min_p = 0.2f, cfg[3].presence_penalty = 0.5f, cfg[3].repeat_last_n = 8;
    cfg[4].temp = 1.0f, cfg[4].repeat_last_n = 0, cfg[4].repeat_penalty = 2.0f;
    cfg[5].temp = 0; /* greedy, no penalties: the fast path */
    for (int k = 0; k < 6; k++) {
        sampler_t *s = mk(&cfg[k], V);
        ref_run rr = {.rng = cfg[k].seed};
        uint64_t r = 12345 + (uint64_t)k;
        for (int t = 0; t < steps; t++) {
            for (int32_t i = 0; i < V; i++) l[i] = 2.0f * tu_randn(&r);
            if (t % 7 == 3) l[t % V] = l[(t + 1) % V]; /* ties */
            ref_check(s, &cfg[k], l, V, &rr, c, k, t);
        }
        sampler_free(s);
    }
    free(l);
    free(c);
}


/* Full sorts of a large set (no top-k: OpenAI's default request) go
 * through the radix sort: the same draws as the reference's qsort, with
 * ties, +-0 and +-inf among the logits, with and without penalties. */
static void test_full_sort_matches_reference(void **state) {
    (void)state;
    const int32_t V = 30000;
    const int steps = tu_quick() ? 12 : 40;
    float *l = malloc((size_t)V * sizeof *l);
    ref_c *c = malloc((size_t)V * sizeof *c);
    assert_true(l && c);
    tern_sampler_params_t cfg[3];
    for (int k = 0; k < 3; k++) cfg[k] = neutral();
    cfg[0].temp = 1.0f, cfg[0].seed = 5;
    cfg[1].temp = 0.7f, cfg[1].top_p = 0.9f, cfg[1].min_p = 0.001f, cfg[1].seed = 6;
    cfg[2].temp = 1.2f, cfg[2].repeat_penalty = 1.2f, cfg[2].presence_penalty = 0.3f, cfg[2].repeat_last_n = 8,
    cfg[2].seed = 7;
    for (int k = 0; k < 3; k++) {
        sampler_t *s = mk(&cfg[k], V);
        ref_run rr = {.rng = cfg[k].seed};
        uint64_t r = 99 + (uint64_t)k;
        for (int t = 0; t < steps; t++) {
            for (int32_t i = 0; i < V; i++) l[i] = (t % 3 ? 2.0f : 0.05f) * tu_randn(&r);
            if (t % 4 == 1)
                for (int32_t i = 0; i < V; i += 3) l[i] = (float)(i % 5); /* long ties */
            if (t % 4 == 2) l[0] = -0.0f, l[1] = 0.0f, l[2] = -INFINITY, l[V - 1] = -0.0f;
            if (t % 8 == 3) l[t] = INFINITY;
            if (t % 8 == 5) { /* the mass on 100 zeros of both signs: -0 and +0 must tie (by id) */
                for (int32_t i = 0; i < V; i++) l[i] = -60.0f;
                for (int32_t i = 0; i < 100; i++) l[7 * i + 3] = i % 2 ? -0.0f : 0.0f;
            }
            ref_check(s, &cfg[k], l, V, &rr, c, k, t);
        }
        sampler_free(s);
    }
    free(l);
    free(c);
}

/* Large sets are sorted band by band (logits within 2, 4, 6 ... nats of
 * the best) only as deep as the walk goes, not whole: the same draws and
 * the same truncations as the reference's full sort, on sets whose mass
 * sits in the first bands (spread logits), deep (top-p 0.9999 over a band
 * at -17 nats), everywhere (flat logits: every band), with integer ties
 * inside and across bands, and with a NaN (the full sort). */
static void test_prefix_walk_matches_reference(void **state) {
    (void)state;
    const int32_t V = 30000;
    const int steps = tu_quick() ? 12 : 36;
    float *l = malloc((size_t)V * sizeof *l);
    ref_c *c = malloc((size_t)V * sizeof *c);
    assert_true(l && c);
    enum { NC = 6 };
    tern_sampler_params_t cfg[NC];
    for (int k = 0; k < NC; k++) cfg[k] = neutral(), cfg[k].seed = 40 + (uint64_t)k;
    cfg[0].temp = 1.0f;
    cfg[1].temp = 0.8f, cfg[1].top_p = 0.95f;
    cfg[2].temp = 1.0f, cfg[2].top_p = 0.9999f;
    cfg[3].temp = 1.3f, cfg[3].min_p = 0.05f;
    cfg[4].temp = 0.5f, cfg[4].repeat_penalty = 1.3f, cfg[4].repeat_last_n = 8;
    cfg[5].temp = 2.0f, cfg[5].top_p = 0.5f, cfg[5].min_p = 0.2f;
    for (int k = 0; k < NC; k++) {
        sampler_t *s = mk(&cfg[k], V);
        ref_run rr = {.rng = cfg[k].seed};
        uint64_t r = 7 + (uint64_t)k;
        for (int t = 0; t < steps; t++) {
            const int kind = t % 6;
            for (int32_t i = 0; i < V; i++) {
                const float g = tu_randn(&r);
                l[i] = kind == 0 ? 8.0f * g : kind == 1 ? 20.0f * g : kind == 3 ? 0.5f * g : kind == 4 ? rintf(6.0f * g) : 8.0f * g;
            }
            if (kind == 2) { /* a band: the best, a few near it, 7000 at -17, the rest far below */
                for (int32_t i = 0; i < V; i++) l[i] = -40.0f;
                for (int32_t i = 0; i < 7000; i++) l[(int32_t)(tu_rand(&r) % (uint64_t)V)] = -17.0f + 0.1f * tu_randn(&r);
                for (int32_t i = 0; i < 5; i++) l[(int32_t)(tu_rand(&r) % (uint64_t)V)] = -(float)i;
            }
            if (kind == 5) l[(int32_t)(tu_rand(&r) % (uint64_t)V)] = NAN;
            ref_check(s, &cfg[k], l, V, &rr, c, k, t);
        }
        sampler_free(s);
    }
    free(l);
    free(c);
}

/* tern_expf: the vector form gives the scalar definition's bits on a
 * sweep of float bit patterns (every sign, exponent and many mantissas,
 * NaNs and infinities included); the definition is within 4e-7 of exp on
 * [-87, 88]; exp(0) = 1, underflow to +0 below -87, NaN stays NaN. */
static void test_expf_definition(void **state) {
    (void)state;
    assert_true(tern_expf(0.0f) == 1.0f && tern_expf(-0.0f) == 1.0f);
    assert_true(tern_expf(-87.5f) == 0.0f && tern_expf(-INFINITY) == 0.0f);
    assert_true(isnan(tern_expf(NAN)));
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        const double e = exp((double)x), got = (double)tern_expf(x);
        if (fabs(got - e) > 4e-7 * e) fail_msg("tern_expf(%.9g) = %.9g, exp = %.9g", (double)x, got, e);
    }
    float in[8], out[8];
    in[0] = 0.0f;
    if (!tern_expf8_vec(in, out)) {
        print_message("no AVX2 + FMA here: the vector exp is not compared\n");
        return;
    }
    const uint32_t stride = tu_quick() ? 4099u : 257u;
    uint64_t n = 0;
    int k = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; u += stride) {
        const uint32_t b = (uint32_t)u;
        memcpy(&in[k], &b, sizeof b);
        if (++k < 8) continue;
        k = 0;
        assert_true(tern_expf8_vec(in, out));
        for (int j = 0; j < 8; j++) {
            const float want = tern_expf(in[j]);
            if (memcmp(&want, &out[j], sizeof want) != 0 && !(isnan(want) && isnan(out[j])))
                fail_msg("x = %.9g (0x%08x): vector %.9g, scalar %.9g", (double)in[j], b, (double)out[j], (double)want);
            n++;
        }
    }
    assert_true(n > 1000000);
}

/* softmax_max, softmax_sum, softmax_collect and softmax_mass against their loops, bit
 * for bit, on sets of every length up to 40 and a long one, with NaN,
 * infinities, -0 and ties. */
static void test_softmax_passes_match_loops(void **state) {
    (void)state;
    const int32_t LONG = 30011;
    tern_token_logit_t *c = malloc((size_t)LONG * sizeof *c), *out0 = malloc((size_t)LONG * sizeof *c),
                       *out1 = malloc((size_t)LONG * sizeof *c);
    assert_true(c && out0 && out1);
    uint64_t r = 17;
    for (int round = 0; round < 200; round++) {
        const int32_t n = round < 41 ? round : round % 5 == 0 ? LONG : 1 + (int32_t)(tu_rand(&r) % 200);
        const float scale = round % 3 == 0 ? 30.0f : 3.0f;
        for (int32_t i = 0; i < n; i++) c[i] = (tern_token_logit_t){i, scale * tu_randn(&r)};
        if (n > 4 && round % 4 == 1) c[tu_rand(&r) % (uint64_t)n].logit = NAN;
        if (n > 4 && round % 6 == 2) c[tu_rand(&r) % (uint64_t)n].logit = INFINITY;
        if (n > 4 && round % 6 == 3) c[tu_rand(&r) % (uint64_t)n].logit = -INFINITY;
        if (n > 4 && round % 5 == 4) c[1].logit = -0.0f, c[2].logit = 0.0f, c[3].logit = c[0].logit;
        float m0 = 0, m1 = 0;
        const bool f0 = softmax_max(c, n, &m0), f1 = softmax_max_ref(c, n, &m1);
        assert_true(f0 == f1);
        assert_true(memcmp(&m0, &m1, sizeof m0) == 0);
        const float t = round % 2 ? 0.7f : 1.0f;
        const double s0 = softmax_sum(c, n, m1, t), s1 = softmax_sum_ref(c, n, m1, t);
        if (!(memcmp(&s0, &s1, sizeof s0) == 0 || (isnan(s0) && isnan(s1))))
            fail_msg("round %d (n %d): sum %.17g, loop %.17g", round, n, s0, s1);
        for (int q = 0; q < 8; q++) {
            const float lo = q == 7 ? NAN : q == 6 ? -INFINITY : m1 - scale * 0.5f * (float)q;
            const float hi = q == 5 ? NAN : q % 2 ? INFINITY : m1 - scale * 0.25f * (float)q;
            const int32_t k0 = softmax_collect(c, n, lo, hi, out0), k1 = softmax_collect_ref(c, n, lo, hi, out1);
            assert_int_equal(k0, k1);
            assert_memory_equal(out0, out1, (size_t)k0 * sizeof *out0);
        }
        /* a band's mass: the walk's own sum when every probability is at
         * least 2^-29, whatever the order of the candidates */
        if (f1 && n > 1) {
            const double sum = softmax_sum_ref(c, n, m1, t);
            double *p = malloc((size_t)n * sizeof *p);
            assert_non_null(p);
            softmax_probs_ref(c, n, m1, t, sum, p);
            float minp;
            const double mass = softmax_mass(c, n, m1, t, sum, &minp);
            double fwd = 0, back = 0;
            float lo = INFINITY;
            for (int32_t i = 0; i < n; i++) fwd += p[i], back += p[n - 1 - i], lo = (float)p[i] < lo ? (float)p[i] : lo;
            assert_true(memcmp(&minp, &lo, sizeof lo) == 0);
            assert_true(memcmp(&mass, &fwd, sizeof mass) == 0);
            if (minp >= SOFTMAX_EXACT_P) assert_true(memcmp(&fwd, &back, sizeof fwd) == 0);
            assert_true(fabs(mass - 1.0) < 1e-3);
            free(p);
        }
    }
    free(c);
    free(out0);
    free(out1);
}

static void test_chain_stages(void **state) {
    (void)state;
    tern_sampler_params_t p = neutral();
    tern_sampler_stage_t st[TERN_SAMPLER_MAX_STAGES];
    sampler_t *s = mk(&p, 8);
    const tern_sampler_stage_t full[] = {TERN_STAGE_MASK,  TERN_STAGE_LOGIT_BIAS, TERN_STAGE_PENALTIES,
                                         TERN_STAGE_TOP_K, TERN_STAGE_TOP_P,      TERN_STAGE_MIN_P,
                                         TERN_STAGE_TEMP,  TERN_STAGE_DIST};
    assert_int_equal(sampler_chain(s, st, TERN_SAMPLER_MAX_STAGES), 8);
    assert_memory_equal(st, full, sizeof full);
    sampler_free(s);
    p.temp = 0;
    s = mk(&p, 8);
    const tern_sampler_stage_t greedy[] = {TERN_STAGE_MASK, TERN_STAGE_LOGIT_BIAS, TERN_STAGE_PENALTIES,
                                           TERN_STAGE_GREEDY};
    assert_int_equal(sampler_chain(s, st, 2), 4); /* the count even when cap is smaller */
    assert_int_equal(sampler_chain(s, st, TERN_SAMPLER_MAX_STAGES), 4);
    assert_memory_equal(st, greedy, sizeof greedy);
    sampler_free(s);

    /* Bad chains. */
    tern_error_t err = {0};
    p = neutral();
    const tern_sampler_stage_t no_end[] = {TERN_STAGE_TOP_K, TERN_STAGE_TEMP};
    const tern_sampler_stage_t mid_end[] = {TERN_STAGE_DIST, TERN_STAGE_TOP_K, TERN_STAGE_GREEDY};
    const tern_sampler_stage_t twice[] = {TERN_STAGE_TOP_K, TERN_STAGE_TOP_K, TERN_STAGE_DIST};
    const tern_sampler_stage_t unknown[] = {(tern_sampler_stage_t)42, TERN_STAGE_DIST};
    const tern_sampler_stage_t temp[] = {TERN_STAGE_TEMP, TERN_STAGE_DIST};
    assert_null(sampler_create_chain(&p, no_end, 2, 8, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    assert_null(sampler_create_chain(&p, mid_end, 3, 8, &err));
    assert_null(sampler_create_chain(&p, twice, 3, 8, &err));
    assert_non_null(strstr(err.msg, "at most once"));
    assert_null(sampler_create_chain(&p, unknown, 2, 8, &err));
    assert_null(sampler_create_chain(&p, temp, 0, 8, &err));
    p.temp = 0;
    assert_null(sampler_create_chain(&p, temp, 2, 8, &err));
    assert_non_null(strstr(err.msg, "TEMP"));
}

/* A custom order changes what the stages see: TEMP before TOP_P makes
 * top-p measure mass at that temperature. probs 0.6, 0.3, 0.1 with top_p
 * 0.5: at temperature 1 only id 0 survives; at temperature 4 its
 * probability is below 0.5, so id 1 survives too. */
static void test_custom_order(void **state) {
    (void)state;
    const double probs[3] = {0.6, 0.3, 0.1};
    float l[3];
    logits_of(probs, 3, l);
    tern_sampler_params_t p = neutral();
    p.top_p = 0.5f;
    p.temp = 4.0f;
    const int N = 4000;
    double f[3];
    sampler_t *s = mk(&p, 3);
    draw(s, l, 3, N, f);
    assert_true(f[1] == 0 && f[2] == 0);
    sampler_free(s);
    const tern_sampler_stage_t temp_first[] = {TERN_STAGE_TEMP, TERN_STAGE_TOP_P, TERN_STAGE_DIST};
    tern_error_t err = {0};
    s = sampler_create_chain(&p, temp_first, 3, 3, &err);
    assert_non_null(s);
    draw(s, l, 3, N, f);
    assert_true(f[2] == 0);
    /* the two survivors at temperature 4: 0.6^(1/4) : 0.3^(1/4) */
    double a = pow(0.6, 0.25), b = pow(0.3, 0.25);
    assert_freq(f[0], a / (a + b), N);
    sampler_free(s);

    /* Penalties after top-k work on the truncated set (looked up by id):
     * top-2 keeps {0, 1}; id 0 seen (3.0 -> 1.0 with penalty 3) loses to
     * id 1 (2.0); id 3, outside the set, is never chosen. */
    const float l4[4] = {3.0f, 2.0f, -1.0f, 1.9f};
    p = neutral();
    p.top_k = 2;
    p.repeat_penalty = 3.0f;
    const tern_sampler_stage_t k_then_pen[] = {TERN_STAGE_TOP_K, TERN_STAGE_PENALTIES, TERN_STAGE_GREEDY};
    s = sampler_create_chain(&p, k_then_pen, 3, 4, &err);
    assert_non_null(s);
    assert_int_equal(sampler_sample(s, l4), 0);
    sampler_accept(s, 0);
    assert_int_equal(sampler_sample(s, l4), 1);
    sampler_free(s);
    /* The default order (penalties first) lets id 3 in instead. */
    p.temp = 0;
    s = mk(&p, 4);
    sampler_accept(s, 0);
    assert_int_equal(sampler_sample(s, l4), 1);
    sampler_accept(s, 1);
    assert_int_equal(sampler_sample(s, l4), 3);
    sampler_free(s);
}

/* ---- mask and logit bias ---------------------------------------------------- */

typedef struct {
    int calls;
    int32_t n_seen;
    int dense; /* cand[i].id == i for all i */
    int fail;
    int32_t allow_mod; /* allow ids with id % allow_mod == 1; 0: ban all */
} mask_ctx;

static int mask_odd(void *user, tern_token_logit_t *cand, int32_t n) {
    mask_ctx *m = user;
    m->calls++;
    m->n_seen = n;
    m->dense = 1;
    for (int32_t i = 0; i < n; i++) {
        if (cand[i].id != i) m->dense = 0;
        if (!m->allow_mod || cand[i].id % m->allow_mod != 1) cand[i].logit = -INFINITY;
    }
    return m->fail;
}

static void test_mask_stage(void **state) {
    (void)state;
    const int32_t V = 64;
    float l[64];
    uint64_t r = 5;
    for (int32_t i = 0; i < V; i++) l[i] = tu_randn(&r);
    l[10] = 9.0f; /* the best, but even: banned */
    mask_ctx m = {0, 0, 0, 0, 2};
    tern_sampler_params_t p = neutral();
    p.temp = 0;
    sampler_t *g = mk(&p, V);
    sampler_set_mask(g, mask_odd, &m);
    int32_t best_odd = 1;
    for (int32_t i = 3; i < V; i += 2)
        if (l[i] > l[best_odd]) best_odd = i;
    assert_int_equal(sampler_sample(g, l), best_odd);
    assert_int_equal(m.calls, 1);
    assert_int_equal(m.n_seen, V); /* first in the chain: every id, in id order */
    assert_true(m.dense);
    assert_true(l[10] == 9.0f); /* the caller's logits are untouched */
    /* Removing the mask: the fast path again, id 10 wins. */
    sampler_set_mask(g, NULL, NULL);
    assert_int_equal(sampler_sample(g, l), 10);
    assert_int_equal(m.calls, 1);
    sampler_free(g);

    /* Drawing: never a banned id, whatever the temperature. */
    p = neutral();
    p.temp = 3.0f;
    sampler_t *s = mk(&p, V);
    sampler_set_mask(s, mask_odd, &m);
    for (int i = 0; i < 2000; i++) {
        int32_t id = sampler_sample(s, l);
        assert_true(id >= 0 && id < V && id % 2 == 1);
    }
    /* Everything banned, or the callback failing: -1. */
    m.allow_mod = 0;
    assert_int_equal(sampler_sample(s, l), -1);
    m.allow_mod = 2;
    m.fail = 1;
    assert_int_equal(sampler_sample(s, l), -1);
    m.fail = 0;
    assert_true(sampler_sample(s, l) % 2 == 1);
    sampler_free(s);

    /* After top-k in a custom chain the mask sees only the survivors. */
    p = neutral();
    p.top_k = 4;
    const tern_sampler_stage_t k_then_mask[] = {TERN_STAGE_TOP_K, TERN_STAGE_MASK, TERN_STAGE_DIST};
    tern_error_t err = {0};
    s = sampler_create_chain(&p, k_then_mask, 3, V, &err);
    assert_non_null(s);
    sampler_set_mask(s, mask_odd, &m);
    int32_t id = sampler_sample(s, l);
    assert_int_equal(m.n_seen, 4);
    assert_true(id == -1 || id % 2 == 1);
    sampler_free(s);
}

static void test_logit_bias(void **state) {
    (void)state;
    const float l[5] = {1.0f, 4.0f, 2.0f, 3.0f, 0.0f};
    tern_sampler_params_t p = neutral();
    p.temp = 0;
    sampler_t *s = mk(&p, 5);
    tern_error_t err = {0};
    assert_int_equal(sampler_sample(s, l), 1);
    /* +5 on id 4 makes it the best; the list is copied. */
    tern_logit_bias_t b[3] = {{4, 5.0f}, {1, -INFINITY}, {2, 0.5f}};
    assert_int_equal(sampler_set_logit_bias(s, b, 3, &err), 0);
    b[0].bias = -100.0f;
    assert_int_equal(sampler_sample(s, l), 4);
    /* id 1 banned: with id 4 back at 0, id 3 (3.0) beats id 2 (2.5). */
    tern_logit_bias_t ban[2] = {{1, -INFINITY}, {2, 0.5f}};
    assert_int_equal(sampler_set_logit_bias(s, ban, 2, &err), 0);
    assert_int_equal(sampler_sample(s, l), 3);
    /* Entries for one token add up: 2 + 0.5 + 0.6 = 3.1 > 3. */
    tern_logit_bias_t sum[3] = {{1, -INFINITY}, {2, 0.5f}, {2, 0.6f}};
    assert_int_equal(sampler_set_logit_bias(s, sum, 3, &err), 0);
    assert_int_equal(sampler_sample(s, l), 2);
    /* Bad lists are refused and change nothing. */
    tern_logit_bias_t bad1[1] = {{5, 1.0f}}, bad2[1] = {{0, NAN}}, bad3[1] = {{0, INFINITY}}, bad4[1] = {{-1, 0}};
    assert_int_equal(sampler_set_logit_bias(s, bad1, 1, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "out of range"));
    assert_int_equal(sampler_set_logit_bias(s, bad2, 1, &err), TERN_EINVAL);
    assert_int_equal(sampler_set_logit_bias(s, bad3, 1, &err), TERN_EINVAL);
    assert_int_equal(sampler_set_logit_bias(s, bad4, 1, &err), TERN_EINVAL);
    assert_int_equal(sampler_set_logit_bias(s, NULL, 2, &err), TERN_EINVAL);
    assert_int_equal(sampler_sample(s, l), 2);
    /* Everything banned: -1. */
    tern_logit_bias_t all[5] = {{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}, {3, -INFINITY}, {4, -INFINITY}};
    assert_int_equal(sampler_set_logit_bias(s, all, 5, &err), 0);
    assert_int_equal(sampler_sample(s, l), -1);
    /* Cleared: back to plain greedy. */
    assert_int_equal(sampler_set_logit_bias(s, NULL, 0, &err), 0);
    assert_int_equal(sampler_sample(s, l), 1);
    sampler_free(s);

    /* Drawing with a ban: the banned best never comes out. */
    p = neutral();
    s = mk(&p, 5);
    tern_logit_bias_t ban1[1] = {{1, -INFINITY}};
    assert_int_equal(sampler_set_logit_bias(s, ban1, 1, &err), 0);
    for (int i = 0; i < 2000; i++) assert_int_not_equal(sampler_sample(s, l), 1);
    sampler_free(s);
}

/* ---- the state blob ----------------------------------------------------------- */

static void fill_logits(float *l, int32_t V, uint64_t *r) {
    for (int32_t i = 0; i < V; i++) l[i] = 1.5f * tu_randn(r);
}

/* k tokens, accepting each, from logits drawn from r. */
static void run_k(sampler_t *s, int32_t V, uint64_t r, int k, int32_t *out) {
    float l[200];
    assert_true(V <= 200);
    for (int i = 0; i < k; i++) {
        fill_logits(l, V, &r);
        out[i] = sampler_sample(s, l);
        sampler_accept(s, out[i]);
    }
}

static void test_snapshot_restore(void **state) {
    (void)state;
    const int32_t V = 200;
    tern_sampler_params_t p = neutral();
    p.temp = 0.9f;
    p.top_k = 30;
    p.repeat_penalty = 1.5f;
    p.frequency_penalty = 0.3f;
    p.repeat_last_n = 16;
    sampler_t *s = mk(&p, V);
    size_t cap = sampler_state_size(s);
    assert_int_equal(cap, TERN_SAMPLER_STATE_HEADER + 4 * 16);
    unsigned char *snap = malloc(cap), *again = malloc(cap);
    assert_true(snap && again);
    /* Before the window fills, after it fills, after it wraps. */
    const int before[3] = {5, 16, 37};
    int32_t a[24], b[24];
    for (int c = 0; c < 3; c++) {
        sampler_reset(s);
        int32_t pre[40];
        run_k(s, V, 77, before[c], pre);
        size_t n = sampler_state_save(s, snap, cap);
        int in_win = before[c] < 16 ? before[c] : 16;
        assert_int_equal(n, TERN_SAMPLER_STATE_HEADER + 4 * (size_t)in_win);
        assert_int_equal(sampler_state_save(s, snap, n - 1), 0); /* too small: nothing */
        run_k(s, V, 1000 + (uint64_t)c, 24, a);
        tern_error_t err = {0};
        assert_int_equal(sampler_state_load(s, snap, n, &err), 0);
        run_k(s, V, 1000 + (uint64_t)c, 24, b);
        assert_memory_equal(a, b, sizeof a);
        /* Into a fresh sampler with the same parameters: the same tokens. */
        sampler_t *t = mk(&p, V);
        assert_int_equal(sampler_state_load(t, snap, n, &err), 0);
        assert_int_equal(sampler_state_save(t, again, cap), n);
        assert_memory_equal(snap, again, n); /* the blob round-trips */
        run_k(t, V, 1000 + (uint64_t)c, 24, b);
        assert_memory_equal(a, b, sizeof a);
        sampler_free(t);
    }
    /* A window of 0 (no penalties): the blob is the header. */
    p.repeat_last_n = 0;
    sampler_t *z = mk(&p, V);
    assert_int_equal(sampler_state_size(z), TERN_SAMPLER_STATE_HEADER);
    run_k(z, V, 3, 4, a);
    assert_int_equal(sampler_state_save(z, snap, cap), TERN_SAMPLER_STATE_HEADER);
    run_k(z, V, 4, 8, a);
    assert_int_equal(sampler_state_load(z, snap, TERN_SAMPLER_STATE_HEADER, NULL), 0);
    run_k(z, V, 4, 8, b);
    assert_memory_equal(a, b, 8 * sizeof *a);
    sampler_free(z);
    sampler_free(s);
    free(snap);
    free(again);
}

static void put32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static void test_state_load_rejects(void **state) {
    (void)state;
    const int32_t V = 200;
    tern_sampler_params_t p = neutral();
    p.repeat_last_n = 8;
    p.repeat_penalty = 1.3f;
    sampler_t *s = mk(&p, V);
    int32_t pre[12];
    run_k(s, V, 9, 12, pre); /* a full, wrapped window */
    unsigned char good[TERN_SAMPLER_STATE_HEADER + 32], bad[TERN_SAMPLER_STATE_HEADER + 64];
    size_t n = sampler_state_save(s, good, sizeof good);
    assert_int_equal(n, sizeof good);
    /* What the sampler would do next, to check failed loads change nothing. */
    unsigned char now[sizeof good];
    assert_int_equal(sampler_state_save(s, now, sizeof now), n);
    tern_error_t err = {0};

    /* Every truncation, and one byte too many. */
    for (size_t len = 0; len < n; len++) {
        err.code = 0;
        assert_int_equal(sampler_state_load(s, good, len, &err), TERN_EFORMAT);
        assert_int_equal(err.code, TERN_EFORMAT);
    }
    memcpy(bad, good, n);
    bad[n] = 0;
    assert_int_equal(sampler_state_load(s, bad, n + 1, &err), TERN_EFORMAT);
    assert_int_equal(sampler_state_load(s, NULL, n, &err), TERN_EFORMAT);
    /* Bad magic, another version. */
    memcpy(bad, good, n);
    bad[0] = 'X';
    assert_int_equal(sampler_state_load(s, bad, n, &err), TERN_EFORMAT);
    memcpy(bad, good, n);
    put32(bad + 4, 2);
    assert_int_equal(sampler_state_load(s, bad, n, &err), TERN_EUNSUP);
    /* Another vocabulary. */
    memcpy(bad, good, n);
    put32(bad + 8, (uint32_t)V + 1);
    assert_int_equal(sampler_state_load(s, bad, n, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "vocabulary"));
    /* A window longer than its own capacity, than the sampler keeps, huge. */
    memcpy(bad, good, n);
    put32(bad + 24, 9);
    assert_int_equal(sampler_state_load(s, bad, n, &err), TERN_EFORMAT);
    memcpy(bad, good, n);
    put32(bad + 12, 16);
    put32(bad + 24, 16);
    memset(bad + n, 0, 32);
    assert_int_equal(sampler_state_load(s, bad, n + 32, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "repeat_last_n"));
    memcpy(bad, good, n);
    put32(bad + 12, 0xffffffffu);
    put32(bad + 24, 0xffffffffu);
    assert_int_equal(sampler_state_load(s, bad, n, &err), TERN_EFORMAT);
    /* A window id out of range (the last one, and a negative one). */
    memcpy(bad, good, n);
    put32(bad + n - 4, (uint32_t)V);
    assert_int_equal(sampler_state_load(s, bad, n, &err), TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "out of range"));
    put32(bad + n - 4, 0xffffffffu);
    assert_int_equal(sampler_state_load(s, bad, n, &err), TERN_EFORMAT);
    /* Random garbage of every length up to the buffer (never accepted
     * unless it happens to be well-formed, and never a crash). */
    uint64_t r = 1;
    for (int it = 0; it < 2000; it++) {
        size_t len = (size_t)(tu_rand(&r) % sizeof bad);
        for (size_t i = 0; i < len; i++) bad[i] = (unsigned char)tu_rand(&r);
        if (it & 1) memcpy(bad, good, len < 12 ? len : 12); /* a plausible header */
        int rc = sampler_state_load(s, bad, len, &err);
        if (rc == 0) {
            assert_int_equal(sampler_state_load(s, now, n, &err), 0); /* well-formed by chance: undo */
        } else {
            assert_true(rc == TERN_EFORMAT || rc == TERN_EUNSUP || rc == TERN_EINVAL);
        }
    }
    /* Nothing changed: the state saves to the same bytes. */
    unsigned char after[sizeof good];
    assert_int_equal(sampler_state_save(s, after, sizeof after), n);
    assert_memory_equal(after, now, n);
    /* Into a sampler of another vocabulary: refused. */
    sampler_t *o = mk(&p, V - 1);
    assert_int_equal(sampler_state_load(o, good, n, &err), TERN_EINVAL);
    sampler_free(o);
    /* Into one with a shorter window: refused (8 ids > 4). */
    p.repeat_last_n = 4;
    o = mk(&p, V);
    assert_int_equal(sampler_state_load(o, good, n, &err), TERN_EINVAL);
    sampler_free(o);
    sampler_free(s);
}

/* Ids outside the vocabulary are not put in the window (so a blob never
 * holds one). */
static void test_accept_out_of_range(void **state) {
    (void)state;
    tern_sampler_params_t p = neutral();
    p.repeat_last_n = 4;
    sampler_t *s = mk(&p, 10);
    unsigned char b[TERN_SAMPLER_STATE_HEADER + 16];
    sampler_accept(s, -1);
    sampler_accept(s, 10);
    assert_int_equal(sampler_state_save(s, b, sizeof b), TERN_SAMPLER_STATE_HEADER);
    sampler_accept(s, 9);
    assert_int_equal(sampler_state_save(s, b, sizeof b), TERN_SAMPLER_STATE_HEADER + 4);
    sampler_free(s);
}

/* argmax_f32 (AVX2 where the CPU has it) against the loop that defines it,
 * on lengths around the vector widths and a vocabulary's size, with ties,
 * signed zeros, infinities and NaNs placed at random. */
static void test_argmax_matches_loop(void **state) {
    (void)state;
    enum { NMAX = 152000 };
    float *x = malloc(NMAX * sizeof *x);
    assert_non_null(x);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    static const int lens[] = {0, 1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 257, 4096, 151936};
    /* per mode 2..5: the specials sprinkled (NaN alone, so that no +inf
     * hides a lane that lost its maximum) */
    static const float specials[4][4] = {{NAN, NAN, NAN, NAN},
                                         {NAN, 0.0f, -0.0f, NAN},
                                         {0.0f, -0.0f, INFINITY, NAN},
                                         {-INFINITY, NAN, 3.5f, -3.5f}};
    int checked = 0, nonzero = 0;
    for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
        const int n = lens[li];
        for (int trial = 0; trial < 60; trial++) {
            const int mode = trial % 6; /* 0 random, 1 few values (ties), 2-5 specials sprinkled */
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                const uint32_t u = (uint32_t)(r >> 32);
                x[i] = mode == 1 ? (float)(u % 4) : (float)u / 4294967296.0f * 20.0f - 10.0f;
                if (mode >= 2 && u % (unsigned)(2 + mode * 3) == 0) x[i] = specials[mode - 2][(u >> 8) % 4];
            }
            if (trial == 7 && n > 0) x[0] = NAN;                      /* the loop stays at 0 */
            if (trial == 8) for (int i = 0; i < n; i++) x[i] = -INFINITY;
            if (trial == 9) for (int i = 0; i < n; i++) x[i] = i % 2 ? NAN : -INFINITY;
            if (trial == 10 && n > 1) { for (int i = 0; i < n; i++) x[i] = -0.0f; x[n - 1] = 0.0f; }
            const int32_t want = argmax_f32_ref(x, n), got = argmax_f32(x, n);
            if (got != want) fail_msg("n %d trial %d: argmax_f32 %d, the loop %d", n, trial, got, want);
            checked++;
            nonzero += want != 0;
        }
    }
    assert_true(checked > 900 && nonzero > 300); /* the cases were not all trivial */
    free(x);
}


/* f32_next_above (top-k's scan) against its loop: every start offset near
 * the vector boundaries, thresholds among the values, NaN, +-inf, +-0. */
static void test_next_above_matches_loop(void **state) {
    (void)state;
    enum { NMAX = 4200 };
    float *x = malloc(NMAX * sizeof *x);
    assert_non_null(x);
    uint64_t r = 0x2545f4914f6cdd1dull;
    static const int lens[] = {0, 1, 7, 8, 15, 16, 17, 33, 100, 4097};
    static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f};
    int checked = 0, found = 0;
    for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
        const int n = lens[li];
        for (int trial = 0; trial < 12; trial++) {
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                const uint32_t u = (uint32_t)(r >> 32);
                x[i] = trial % 3 == 0 ? (float)(u % 5) - 2.0f : (float)u / 4294967296.0f * 8.0f - 4.0f;
                if (trial % 3 == 2 && u % 7 == 0) x[i] = special[(u >> 8) % 5];
            }
            const float ts[] = {-5.0f, -1.0f, 0.0f, -0.0f, 1.0f, 2.0f, 3.9f, INFINITY, -INFINITY, NAN,
                                n > 0 ? x[n / 2] : 0.0f};
            for (int ti = 0; ti < (int)(sizeof ts / sizeof ts[0]); ti++) {
                for (int i = -2; i <= n + 1; i += (i < 40 || i > n - 40) ? 1 : 37) {
                    const int32_t want = f32_next_above_ref(x, i, n, ts[ti]), got = f32_next_above(x, i, n, ts[ti]);
                    if (got != want)
                        fail_msg("n %d trial %d t %g from %d: f32_next_above %d, the loop %d", n, trial, (double)ts[ti],
                                 i, got, want);
                    checked++;
                    found += want < n;
                }
            }
        }
    }
    assert_true(checked > 10000 && found > 3000 && found < checked); /* both outcomes were exercised */
    free(x);
}

/* Top-k straight from the caller's logits (a chain that starts TOP_K)
 * against the same chain through the copied candidate set (a TOP_P of 1
 * first: a stage that keeps everything but is not passed over): the same
 * draws, step by step, at a 152k vocabulary and on hostile logits (NaN,
 * +-inf, long ties, ascending runs that push at every entry). */
static void test_direct_top_k_matches_copy(void **state) {
    (void)state;
    const int32_t V = 151936;
    float *l = malloc((size_t)V * sizeof *l);
    assert_non_null(l);
    const tern_sampler_stage_t direct[] = {TERN_STAGE_TOP_K, TERN_STAGE_TOP_P, TERN_STAGE_MIN_P, TERN_STAGE_TEMP,
                                           TERN_STAGE_DIST};
    const tern_sampler_stage_t copied[] = {TERN_STAGE_TOP_P, TERN_STAGE_TOP_K, TERN_STAGE_MIN_P, TERN_STAGE_TEMP,
                                           TERN_STAGE_DIST};
    const int32_t ks[] = {1, 40, 1000};
    uint64_t r = 77;
    int steps = 0;
    for (int ki = 0; ki < 3; ki++) {
        tern_sampler_params_t p = neutral();
        p.temp = 0.9f, p.top_k = ks[ki], p.top_p = 1.0f, p.min_p = 0.01f, p.seed = 1000 + (uint64_t)ki;
        tern_error_t err = {0};
        sampler_t *a = sampler_create_chain(&p, direct, 5, V, &err), *b = sampler_create_chain(&p, copied, 5, V, &err);
        assert_non_null(a);
        assert_non_null(b);
        for (int t = 0; t < (tu_quick() ? 8 : 24); t++) {
            const int mode = t % 8;
            for (int32_t i = 0; i < V; i++) l[i] = 3.0f * tu_randn(&r);
            if (mode == 1)
                for (int32_t i = 0; i < V; i++) l[i] = (float)(i % 3); /* three values, long ties */
            if (mode == 2)
                for (int32_t i = 0; i < V; i++) l[i] = (float)i * 1e-3f; /* ascending: every entry pushes */
            if (mode == 3)
                for (int32_t i = 0; i < V; i += 97) l[i] = NAN;
            if (mode == 4) l[0] = NAN, l[5] = INFINITY, l[V - 1] = INFINITY, l[17] = -INFINITY;
            if (mode == 5)
                for (int32_t i = 0; i < V; i++) l[i] = i % 2 ? -INFINITY : l[i];
            if (mode == 6) l[3] = -0.0f, l[4] = 0.0f, l[V / 2] = 100.0f, l[V / 2 + 1] = 100.0f;
            const int32_t ga = sampler_sample(a, l), gb = sampler_sample(b, l);
            if (ga != gb) fail_msg("k %d step %d (mode %d): direct top-k drew %d, the copied set %d", ks[ki], t, mode, ga, gb);
            sampler_accept(a, ga);
            sampler_accept(b, gb);
            steps++;
        }
        sampler_free(a);
        sampler_free(b);
    }
    assert_true(steps >= 24);
    free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),  cmocka_unit_test(test_plain_distribution),
        cmocka_unit_test(test_temperature),      cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),            cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_chain_order),      cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_seed_reproducible), cmocka_unit_test(test_uniform_range),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_default_chain_matches_reference),
        cmocka_unit_test(test_full_sort_matches_reference),
        cmocka_unit_test(test_prefix_walk_matches_reference),
        cmocka_unit_test(test_expf_definition),
        cmocka_unit_test(test_softmax_passes_match_loops),
        cmocka_unit_test(test_chain_stages),
        cmocka_unit_test(test_custom_order),
        cmocka_unit_test(test_mask_stage),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_snapshot_restore),
        cmocka_unit_test(test_state_load_rejects),
        cmocka_unit_test(test_accept_out_of_range),
        cmocka_unit_test(test_argmax_matches_loop),
        cmocka_unit_test(test_next_above_matches_loop),
        cmocka_unit_test(test_direct_top_k_matches_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
