/* test_spec.c - speculative decoding: the prompt-lookup drafter (longest
 * and most recent match, n from max to min, the cap, no match, the
 * repeat past the end, truncation, and an index that agrees with a
 * brute-force scan over a long history), the adaptive controller (off when
 * drafts are rejected and a pass costs more, on and long when they are
 * accepted and a pass is cheap, back on after probing), and
 * tern_generate_spec against tern_generate: the same token ids, text, stop
 * reason, KV memory, logits and sampler state, then the same continuation,
 * on stories260K, aidreams260K and a tiny qwen3, greedy and sampled with
 * penalties, at 1 and 2 threads, with drafts that are accepted and
 * rejected (counted, so the test cannot pass without either). */
// ctest-label: concurrent
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern.h"

/* ---- the drafter ---- */

static tern_drafter_t *drafter(int32_t nmin, int32_t nmax, const int32_t *h, int32_t n) {
    tern_error_t err = {0};
    tern_drafter_t *d = tern_drafter_create(nmin, nmax, &err);
    assert_non_null(d);
    assert_int_equal(tern_drafter_push(d, h, n, &err), 0);
    assert_int_equal(tern_drafter_n_tokens(d), n);
    return d;
}

static void test_drafter_match(void **state) {
    (void)state;
    int32_t out[16], nm;
    /* "1 2 3" is followed by 10 11; the more recent "2 3" by 20 21. */
    const int32_t h[] = {1, 2, 3, 10, 11, 9, 2, 3, 20, 21, 8, 1, 2, 3};
    const int32_t n = (int32_t)(sizeof h / sizeof h[0]);
    tern_drafter_t *d = drafter(1, 4, h, n);
    /* n = 4 ("8 1 2 3") never occurred: n = 3 decides, the longest. */
    assert_int_equal(tern_drafter_draft(d, out, 2, &nm), 2);
    assert_int_equal(nm, 3);
    assert_int_equal(out[0], 10);
    assert_int_equal(out[1], 11);
    /* Without a grammar, tern_drafter_draft_under is tern_drafter_draft. */
    int32_t out2[16], nm2;
    assert_int_equal(tern_drafter_draft_under(d, NULL, NULL, out2, 2, &nm2), 2);
    assert_int_equal(nm2, 3);
    assert_memory_equal(out, out2, 2 * sizeof *out);
    /* The cap. */
    assert_int_equal(tern_drafter_draft(d, out, 1, &nm), 1);
    assert_int_equal(out[0], 10);
    assert_int_equal(tern_drafter_draft(d, out, 0, &nm), 0);
    assert_int_equal(nm, 0);
    tern_drafter_free(d);
    /* At most bigrams: the most recent "2 3" wins. */
    d = drafter(1, 2, h, n);
    assert_int_equal(tern_drafter_draft(d, out, 3, &nm), 3);
    assert_int_equal(nm, 2);
    assert_int_equal(out[0], 20);
    assert_int_equal(out[1], 21);
    assert_int_equal(out[2], 8);
    tern_drafter_free(d);

    /* Most recent of equal n-grams: "4 5" -> 6, then -> 7. */
    const int32_t r[] = {4, 5, 6, 4, 5, 7, 4, 5};
    d = drafter(2, 2, r, 8);
    assert_int_equal(tern_drafter_draft(d, out, 1, &nm), 1);
    assert_int_equal(out[0], 7);
    tern_drafter_free(d);

    /* No match at all, and a unigram match that ngram_min 2 refuses. */
    const int32_t u[] = {1, 2, 3, 4, 5, 3};
    d = drafter(2, 4, u, 6);
    assert_int_equal(tern_drafter_draft(d, out, 4, &nm), 0);
    assert_int_equal(nm, 0);
    tern_drafter_free(d);
    d = drafter(1, 4, u, 6);
    assert_int_equal(tern_drafter_draft(d, out, 2, &nm), 2);
    assert_int_equal(nm, 1);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 5);
    tern_drafter_free(d);

    /* Too short a history, an empty one. */
    d = drafter(1, 4, u, 1);
    assert_int_equal(tern_drafter_draft(d, out, 4, &nm), 0);
    tern_drafter_free(d);
    d = drafter(1, 4, u, 0);
    assert_int_equal(tern_drafter_draft(d, out, 4, &nm), 0);
    tern_drafter_free(d);
}

static void test_drafter_repeat_and_edit(void **state) {
    (void)state;
    int32_t out[16], nm;
    /* 1 2 1 2 1: "1 2 1" occurred at 0, followed by 2 1, then the period
     * (2) repeats: 2 1 2 1 2 ... */
    const int32_t h[] = {1, 2, 1, 2, 1};
    tern_drafter_t *d = drafter(1, 4, h, 5);
    assert_int_equal(tern_drafter_draft(d, out, 7, &nm), 7);
    assert_int_equal(nm, 3);
    const int32_t want[] = {2, 1, 2, 1, 2, 1, 2};
    assert_memory_equal(out, want, sizeof want);
    /* A run of one token: period 1. */
    const int32_t z[] = {7, 7, 7};
    tern_drafter_t *e = drafter(1, 4, z, 3);
    assert_int_equal(tern_drafter_draft(e, out, 5, &nm), 5);
    assert_int_equal(nm, 2);
    for (int i = 0; i < 5; i++) assert_int_equal(out[i], 7);
    tern_drafter_free(e);

    /* Negative ids (unknown positions) are never proposed. */
    const int32_t g[] = {3, 4, -1, 5, 3, 4};
    e = drafter(1, 2, g, 6);
    assert_int_equal(tern_drafter_draft(e, out, 4, &nm), 0);
    tern_drafter_free(e);

    /* Truncate: the match at 0..2 is still there, the later text gone. */
    tern_error_t err = {0};
    const int32_t more[] = {9, 9, 1, 2};
    assert_int_equal(tern_drafter_push(d, more, 4, &err), 0); /* 1 2 1 2 1 9 9 1 2 */
    /* "9 1 2" never occurred before; "1 2" did, most recently at 2..3. */
    assert_int_equal(tern_drafter_draft(d, out, 2, &nm), 2);
    assert_int_equal(nm, 2);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 9);
    assert_int_equal(tern_drafter_truncate(d, 3, &err), 0); /* 1 2 1 */
    assert_int_equal(tern_drafter_n_tokens(d), 3);
    assert_int_equal(tern_drafter_draft(d, out, 3, &nm), 3);
    assert_int_equal(nm, 1);
    assert_int_equal(out[0], 2);
    assert_int_equal(tern_drafter_truncate(d, 10, &err), 0); /* beyond: nothing changes */
    assert_int_equal(tern_drafter_n_tokens(d), 3);
    tern_drafter_reset(d);
    assert_int_equal(tern_drafter_n_tokens(d), 0);
    assert_int_equal(tern_drafter_draft(d, out, 3, &nm), 0);
    tern_drafter_free(d);

    /* Bad parameters. */
    assert_null(tern_drafter_create(0, 4, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    assert_null(tern_drafter_create(3, 2, &err));
    assert_null(tern_drafter_create(1, TERN_SPEC_NGRAM_MAX + 1, &err));
    tern_drafter_free(NULL);
}

/* The rule of tern_drafter_draft by a scan of the whole history. */
static int32_t brute_draft(const int32_t *h, int32_t len, int32_t nmin, int32_t nmax, int32_t *out, int32_t cap,
                           int32_t *nm) {
    *nm = 0;
    for (int32_t n = nmax; n >= nmin; n--) {
        if (len < n + 1) continue;
        for (int32_t j = len - 1; j >= n; j--) {
            if (memcmp(h + j - n, h + len - n, (size_t)n * sizeof *h)) continue;
            int32_t m = 0;
            for (; m < cap; m++) {
                const int32_t t = j + m < len ? h[j + m] : out[m - (len - j)];
                if (t < 0) break;
                out[m] = t;
            }
            if (m == 0) break; /* the most recent occurrence decides this n */
            *nm = n;
            return m;
        }
    }
    return 0;
}

static void test_drafter_vs_scan(void **state) {
    (void)state;
    const int32_t total = tu_quick() ? 1500 : 4000;
    int32_t *h = malloc((size_t)total * sizeof *h);
    assert_non_null(h);
    uint64_t rng = 42;
    /* A small alphabet, stretches copied from earlier text: many matches of
     * every length, many hash-table growths. */
    for (int32_t i = 0; i < total; i++) {
        if (i > 50 && tu_rand(&rng) % 3 == 0) {
            int32_t from = (int32_t)(tu_rand(&rng) % (uint64_t)(i - 20));
            int32_t len = 1 + (int32_t)(tu_rand(&rng) % 15);
            for (int32_t k = 0; k < len && i < total; k++, i++) h[i] = h[from + k];
            i--;
        } else {
            h[i] = (int32_t)(tu_rand(&rng) % 6);
        }
    }
    const int32_t cfg[][2] = {{1, 4}, {2, 3}, {1, 1}, {3, 8}};
    tern_error_t err = {0};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        tern_drafter_t *d = tern_drafter_create(cfg[c][0], cfg[c][1], &err);
        assert_non_null(d);
        int32_t at = 0, checks = 0;
        while (at < total) {
            int32_t step = 1 + (int32_t)(tu_rand(&rng) % (at < 100 ? 3 : 40 + 1));
            if (step > total - at) step = total - at;
            assert_int_equal(tern_drafter_push(d, h + at, step, &err), 0);
            at += step;
            int32_t a[24], b[24], na, nb;
            const int32_t cap = 1 + (int32_t)(tu_rand(&rng) % 20);
            const int32_t ka = tern_drafter_draft(d, a, cap, &na);
            const int32_t kb = brute_draft(h, at, cfg[c][0], cfg[c][1], b, cap, &nb);
            assert_int_equal(ka, kb);
            assert_int_equal(na, nb);
            if (ka) assert_memory_equal(a, b, (size_t)ka * sizeof *a);
            checks++;
            /* Now and then cut the history back and grow it again. */
            if (at > 200 && tu_rand(&rng) % 50 == 0) {
                at -= 1 + (int32_t)(tu_rand(&rng) % 100);
                assert_int_equal(tern_drafter_truncate(d, at, &err), 0);
            }
        }
        assert_true(checks > 50);
        tern_drafter_free(d);
    }
    free(h);
}

/* ---- the controller ---- */

/* A simulated pass on drafts of an n_match match: each draft accepted with
 * probability acc, a pass of k drafts costing 1 + slope k plain steps.
 * Returns the k asked for. */
static int32_t sim_pass(tern_spec_ctl_t *c, int32_t n_match, double acc, double slope, uint64_t *rng) {
    const int32_t k = tern_spec_ctl_next(c, n_match);
    int32_t a = 0;
    while (a < k && (double)(tu_rand(rng) % 1000) < acc * 1000.0) a++;
    tern_spec_ctl_time(c, k, (uint64_t)(1e6 * (1.0 + slope * k)));
    tern_spec_ctl_observe(c, n_match, k, a);
    return k;
}

static void test_ctl_off_when_rejected(void **state) {
    (void)state;
    tern_error_t err = {0};
    tern_spec_ctl_t *c = tern_spec_ctl_create(NULL, &err);
    assert_non_null(c);
    uint64_t rng = 7;
    /* Every draft rejected, a pass with k drafts costs 1 + 0.3 k steps. */
    for (int i = 0; i < 100; i++) sim_pass(c, 2, 0.0, 0.3, &rng);
    tern_spec_ctl_info_t info;
    tern_spec_ctl_info(c, 2, &info);
    assert_int_equal(info.off, 1);
    assert_int_equal(info.k, 0);
    assert_true(info.accept < 0.25); /* the prior (one half, weighted as one pass) fades only as drafts are seen */
    assert_true(info.cost_slope > 0.25 && info.cost_slope < 0.35);
    /* Off: only sparse probes, each of 3 drafts costing 0.9 steps, so at
     * least 45 passes apart (2%). */
    int drafting = 0;
    for (int i = 0; i < 1000; i++) drafting += sim_pass(c, 2, 0.0, 0.3, &rng) > 0;
    assert_true(drafting > 0);  /* it keeps probing */
    assert_true(drafting < 12); /* intervals doubling to 256 */
    /* No match, no draft. */
    assert_int_equal(tern_spec_ctl_next(c, 0), 0);
    /* The text turns repetitive: the probes see it and drafting comes back. */
    int back = -1;
    for (int i = 0; i < 600 && back < 0; i++)
        if (sim_pass(c, 2, 1.0, 0.3, &rng) > 0) {
            tern_spec_ctl_info(c, 2, &info);
            if (!info.off) back = i;
        }
    assert_true(back >= 0);
    int k_sum = 0;
    for (int i = 0; i < 50; i++) k_sum += sim_pass(c, 2, 1.0, 0.3, &rng);
    assert_true(k_sum > 50 * 4);
    tern_spec_ctl_free(c);
}

static void test_ctl_on_when_accepted(void **state) {
    (void)state;
    tern_error_t err = {0};
    tern_spec_ctl_t *c = tern_spec_ctl_create(NULL, &err);
    assert_non_null(c);
    uint64_t rng = 9;
    for (int i = 0; i < 60; i++) sim_pass(c, 4, 0.97, 0.02, &rng);
    tern_spec_ctl_info_t info;
    tern_spec_ctl_info(c, 4, &info);
    assert_int_equal(info.off, 0);
    assert_int_equal(info.k, 8);
    assert_true(info.gain > 4.0);
    /* Mostly 8, with a plain step every 64 passes to re-measure. */
    int eights = 0, zeros = 0;
    for (int i = 0; i < 200; i++) {
        int32_t k = sim_pass(c, 4, 0.97, 0.02, &rng);
        eights += k == 8;
        zeros += k == 0;
    }
    assert_true(eights >= 190);
    assert_true(zeros >= 2 && zeros <= 5);

    /* Match lengths are learned apart: unigram matches always rejected,
     * 4-gram ones accepted; passes of 1 + 0.3 k steps. */
    tern_spec_ctl_reset(c);
    for (int i = 0; i < 200; i++) {
        sim_pass(c, 1, 0.0, 0.3, &rng);
        sim_pass(c, 4, 0.97, 0.3, &rng);
    }
    tern_spec_ctl_info(c, 1, &info);
    assert_int_equal(info.off, 1);
    tern_spec_ctl_info(c, 4, &info);
    assert_true(info.k >= 4);

    /* Moderate acceptance, costly passes: a short draft. a = 0.6, r(k) =
     * 1 + 0.2 k: E(k)/r(k) = 1.6/1.2, 1.96/1.4, 2.176/1.6, 2.31/1.8 ...
     * peaks at k = 2. */
    tern_spec_ctl_reset(c);
    for (int i = 0; i < 400; i++) sim_pass(c, 3, 0.6, 0.2, &rng);
    tern_spec_ctl_info(c, 3, &info);
    assert_int_equal(info.off, 0);
    assert_true(info.k >= 1 && info.k <= 3);

    /* Not adaptive: always n_draft_max. */
    tern_spec_params_t p = tern_spec_default_params();
    p.adaptive = 0;
    p.n_draft_max = 5;
    tern_spec_ctl_t *f = tern_spec_ctl_create(&p, &err);
    assert_non_null(f);
    for (int i = 0; i < 50; i++) assert_int_equal(sim_pass(f, 1, 0.0, 1.0, &rng), 5);
    tern_spec_ctl_free(f);
    /* No times ever reported: the prior cost, and no baseline steps. */
    p = tern_spec_default_params();
    f = tern_spec_ctl_create(&p, &err);
    for (int i = 0; i < 100; i++) {
        int32_t k = tern_spec_ctl_next(f, 2);
        if (i > 10) assert_true(k > 0);
        tern_spec_ctl_observe(f, 2, k, k);
    }
    tern_spec_ctl_free(f);
    /* Bad parameters; off. */
    p.n_draft_max = TERN_SPEC_DRAFT_MAX + 1;
    assert_null(tern_spec_ctl_create(&p, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    p.n_draft_max = 0;
    f = tern_spec_ctl_create(&p, &err);
    assert_int_equal(tern_spec_ctl_next(f, 3), 0);
    tern_spec_ctl_free(f);
    tern_spec_ctl_free(c);
}

/* ---- generation: speculative == plain ---- */

#define MAXT 512

typedef struct {
    int32_t ids[MAXT];
    int n;       /* ids >= 0 reported */
    int stop_at; /* return nonzero at this many (0: never) */
    int flushes;
    char text[8192];
    size_t tlen;
} out_t;

static int on_tok(int32_t id, const char *text, size_t len, void *user) {
    out_t *o = user;
    if (text && len && o->tlen + len < sizeof o->text) {
        memcpy(o->text + o->tlen, text, len);
        o->tlen += len;
    }
    if (id < 0) {
        o->flushes++;
        return 0;
    }
    if (o->n < MAXT) o->ids[o->n] = id;
    o->n++;
    return o->stop_at && o->n >= o->stop_at;
}

typedef struct {
    int threads;
    int32_t n_ctx;
    int32_t n_predict;
    int stop_at;
    int fill_seq1; /* positions of sequence 1 evaluated first, so that the memory runs out (kv_block 16) */
    tern_sampler_params_t sp;
    int32_t n_batch; /* 0: the default */
} cfg_t;

typedef struct {
    int rc;
    tern_generate_result_t res;
    out_t out;
    int32_t pos;
    tern_kv_stats_t kv;
    uint64_t logits_hash; /* tern_get_logits after the call */
    unsigned char smp[4096];
    size_t smp_len;
    int rc2;
    tern_generate_result_t res2; /* a plain continuation */
    out_t more;
    int32_t pos2;
    tern_spec_stats_t st;
} result_t;

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void run_one(const tern_model_t *m, const cfg_t *cfg, const int32_t *prompt, int32_t n_prompt,
                    const tern_spec_params_t *spec, result_t *r) {
    memset(r, 0, sizeof *r);
    tern_error_t err = {0};
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = cfg->threads;
    cp.n_ctx = cfg->n_ctx;
    cp.n_batch = cfg->n_batch;
    if (cfg->fill_seq1) {
        cp.kv_block = 16;
        cp.n_seq_max = 2;
    }
    tern_context_t *c = tern_context_create(m, &cp, &err);
    assert_non_null(c);
    if (cfg->fill_seq1) {
        tern_batch_entry_t e[256];
        assert_true(cfg->fill_seq1 <= 256);
        for (int i = 0; i < cfg->fill_seq1; i++) e[i] = (tern_batch_entry_t){1, 1 + i % 7, TERN_POS_APPEND, 0};
        assert_int_equal(tern_decode(c, e, cfg->fill_seq1, &err), 0);
    }
    tern_sampler_t *s = tern_sampler_create(m, &cfg->sp, &err);
    assert_non_null(s);
    r->out.stop_at = cfg->stop_at;
    if (spec)
        r->rc = tern_generate_spec(c, s, prompt, n_prompt, cfg->n_predict, spec, on_tok, &r->out, &r->res, &r->st,
                                   &err);
    else
        r->rc = tern_generate(c, s, prompt, n_prompt, cfg->n_predict, on_tok, &r->out, &r->res, &err);
    r->pos = tern_context_pos(c);
    tern_kv_stats(c, &r->kv);
    r->logits_hash = fnv(tern_get_logits(c), (size_t)tern_model_n_vocab(m) * sizeof(float));
    assert_true(tern_sampler_state_size(s) <= sizeof r->smp);
    r->smp_len = tern_sampler_state_save(s, r->smp, sizeof r->smp);
    assert_true(r->smp_len > 0);
    /* Continue plainly from what the call left: the KV memory, the logits
     * and the sampler must be those of plain decoding. */
    if (r->rc == 0 && r->res.stop != TERN_STOP_CTX_FULL) {
        r->rc2 = tern_generate(c, s, NULL, 0, 24, on_tok, &r->more, &r->res2, &err);
        r->pos2 = tern_context_pos(c);
    }
    tern_sampler_free(s);
    tern_context_free(c);
}

static void same(const result_t *a, const result_t *b, const char *what) {
    int bad = a->rc != b->rc || a->res.stop != b->res.stop || a->res.n_generated != b->res.n_generated ||
              a->out.n != b->out.n || memcmp(a->out.ids, b->out.ids, sizeof a->out.ids) ||
              a->out.tlen != b->out.tlen || memcmp(a->out.text, b->out.text, a->out.tlen) ||
              a->out.flushes != b->out.flushes || a->pos != b->pos || a->kv.n_used != b->kv.n_used ||
              a->logits_hash != b->logits_hash || a->smp_len != b->smp_len || memcmp(a->smp, b->smp, a->smp_len) ||
              a->rc2 != b->rc2 || a->res2.stop != b->res2.stop || a->more.n != b->more.n ||
              memcmp(a->more.ids, b->more.ids, sizeof a->more.ids) || a->pos2 != b->pos2;
    if (bad) {
        print_message("%s: plain rc %d stop %d n %d pos %d used %d | spec rc %d stop %d n %d pos %d used %d\n", what,
                      a->rc, a->res.stop, a->out.n, a->pos, a->kv.n_used, b->rc, b->res.stop, b->out.n, b->pos,
                      b->kv.n_used);
        for (int i = 0; i < a->out.n && i < b->out.n && i < MAXT; i++)
            if (a->out.ids[i] != b->out.ids[i]) {
                print_message("  first difference at token %d: %d vs %d\n", i, a->out.ids[i], b->out.ids[i]);
                break;
            }
        fail_msg("%s: speculative decoding differs from plain decoding", what);
    }
    assert_int_equal(b->st.n_generated, b->res.n_generated);
}

typedef struct {
    int64_t drafted, accepted, passes, runs;
} tally_t;

static tern_sampler_params_t sampling(float temp, uint64_t seed) {
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.temp = temp;
    sp.seed = seed;
    if (temp > 0) {
        sp.top_k = 40;
        sp.top_p = 0.95f;
        sp.min_p = 0.05f;
        sp.repeat_penalty = 1.1f;
        sp.presence_penalty = 0.1f;
        sp.frequency_penalty = 0.05f;
    }
    return sp;
}

/* Plain against three speculative settings for one prompt and config. */
static void compare_all(const tern_model_t *m, const cfg_t *cfg, const int32_t *prompt, int32_t n_prompt,
                        const char *what, tally_t *t) {
    result_t *plain = malloc(sizeof *plain), *sp = malloc(sizeof *sp);
    assert_non_null(plain);
    assert_non_null(sp);
    run_one(m, cfg, prompt, n_prompt, NULL, plain);
    tern_spec_params_t v[4];
    v[0] = tern_spec_default_params(); /* adaptive */
    v[1] = tern_spec_default_params(); /* always 8 drafts, unigrams too: many rejections */
    v[1].adaptive = 0;
    v[2] = tern_spec_default_params(); /* always 3 drafts from 2..3-grams */
    v[2].adaptive = 0;
    v[2].n_draft_max = 3;
    v[2].ngram_min = 2;
    v[2].ngram_max = 3;
    v[3] = tern_spec_default_params(); /* off: plain through the spec entry */
    v[3].n_draft_max = 0;
    for (int i = 0; i < 4; i++) {
        char w[256];
        snprintf(w, sizeof w, "%s, spec setting %d", what, i);
        run_one(m, cfg, prompt, n_prompt, &v[i], sp);
        same(plain, sp, w);
        t->drafted += sp->st.n_drafted;
        t->accepted += sp->st.n_accepted;
        t->passes += sp->st.n_passes;
        t->runs++;
        if (i == 3) assert_int_equal(sp->st.n_drafted, 0);
    }
    free(plain);
    free(sp);
}

static tern_model_t *load(const char *path) {
    tern_error_t err = {0};
    tern_model_t *m = tern_model_load(path, &err);
    if (!m) print_message("%s: %s\n", path, err.msg);
    assert_non_null(m);
    return m;
}

static int32_t *tokenize(const tern_model_t *m, const char *text, int32_t *n) {
    tern_error_t err = {0};
    int32_t *ids = NULL;
    size_t k = 0;
    assert_int_equal(tern_tokenize(m, text, strlen(text), 1, 0, &ids, &k, &err), 0);
    *n = (int32_t)k;
    return ids;
}

static const char *const k_prompts[] = {
    "Once upon a time",
    /* copy-heavy: a passage, then its start again */
    "Lily had a big red ball. She played with the ball in the park every day. One day, the ball rolled into the "
    "pond and Lily was sad. Her mom helped her get it back.\nLily had a big red ball. She played with the",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the",
};

/* Every prompt at temperature 0 and 0.8 (two seeds), 1 and 2 threads; then
 * the stops: a full context, the callback, a short n_predict. */
static void check_model(const tern_model_t *m, const char *name, int32_t n_ctx_small, tally_t *greedy,
                        tally_t *sampled) {
    const int quick = tu_quick();
    for (size_t p = 0; p < sizeof k_prompts / sizeof k_prompts[0]; p++) {
        int32_t n_prompt;
        int32_t *ids = tokenize(m, k_prompts[p], &n_prompt);
        const struct {
            float temp;
            uint64_t seed;
        } samp[] = {{0, 1}, {0.8f, 1}, {0.8f, 12345}};
        for (size_t si = 0; si < sizeof samp / sizeof samp[0]; si++) {
            for (int th = 1; th <= 2; th++) {
                if (quick && th == 2 && si > 0) continue;
                cfg_t cfg = {th, 0, 120, 0, 0, sampling(samp[si].temp, samp[si].seed), 0};
                char what[160];
                snprintf(what, sizeof what, "%s prompt %zu temp %.1f seed %llu threads %d", name, p, samp[si].temp,
                         (unsigned long long)samp[si].seed, th);
                compare_all(m, &cfg, ids, n_prompt, what, samp[si].temp > 0 ? sampled : greedy);
            }
        }
        /* A context that fills up during generation, a callback stop, a
         * short n_predict, n_predict 0. */
        const cfg_t stops[] = {
            {1, n_prompt + n_ctx_small, 200, 0, 0, sampling(0, 1), 0},
            {2, n_prompt + n_ctx_small, 200, 0, 0, sampling(0.8f, 3), 0},
            {1, 0, 100, 23, 0, sampling(0, 1), 0},
            {1, 0, 100, 17, 0, sampling(0.8f, 5), 0},
            {1, 0, 3, 0, 0, sampling(0, 1), 0},
            {1, 0, 0, 0, 0, sampling(0, 1), 0},
            {2, 0, 80, 0, 0, sampling(0, 1), 3}, /* blocks of 3: at most 2 drafts a pass */
        };
        for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
            char what[160];
            snprintf(what, sizeof what, "%s prompt %zu stop case %zu", name, p, i);
            compare_all(m, &stops[i], ids, n_prompt, what, stops[i].sp.temp > 0 ? sampled : greedy);
        }
        free(ids);
    }
}

static void report(const char *name, const tally_t *g, const tally_t *s) {
    print_message("%s: greedy %lld drafted, %lld accepted; sampled %lld drafted, %lld accepted\n", name,
                  (long long)g->drafted, (long long)g->accepted, (long long)s->drafted, (long long)s->accepted);
}

static void test_generate_stories(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "models/stories260K.gguf");
    tern_model_t *m = load(path);
    tally_t g = {0}, s = {0};
    check_model(m, "stories260K", 30, &g, &s);
    report("stories260K", &g, &s);
    /* Drafts were accepted and rejected, greedy and sampled. */
    assert_true(g.accepted > 0 && g.drafted - g.accepted > 0);
    assert_true(s.accepted > 0 && s.drafted - s.accepted > 0);
    tern_model_free(m);
}

static void test_generate_aidreams(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "models/aidreams260K.gguf");
    tern_model_t *m = load(path);
    tally_t g = {0}, s = {0};
    check_model(m, "aidreams260K", 20, &g, &s);
    report("aidreams260K", &g, &s);
    assert_true(g.accepted > 0 && g.drafted - g.accepted > 0);
    assert_true(s.accepted > 0 && s.drafted - s.accepted > 0);
    tern_model_free(m);
}

/* A second architecture (qwen3, no tokenizer: no end of generation, no
 * text), random weights, Q8_0 (the GEMM path of a quantized format). */
static void test_generate_tiny_qwen3(void **state) {
    (void)state;
    tern_model_t *m = load(tu_tiny_model("spec", "tiny-qwen3", "q8_0", 11));
    tally_t g = {0}, s = {0};
    const int32_t p0[] = {1, 5, 9, 13, 5, 9, 13, 5, 9};
    int32_t p1[40];
    uint64_t rng = 3;
    for (int i = 0; i < 40; i++) p1[i] = i < 20 ? (int32_t)(tu_rand(&rng) % 512) : p1[i - 20];
    const struct {
        const int32_t *ids;
        int32_t n;
    } prompts[] = {{p0, 9}, {p1, 40}};
    for (size_t p = 0; p < 2; p++)
        for (int th = 1; th <= 2; th++)
            for (int si = 0; si < 2; si++) {
                cfg_t cfg = {th, 0, 100, 0, 0, sampling(si ? 0.8f : 0, 77), 0};
                char what[128];
                snprintf(what, sizeof what, "tiny-qwen3 prompt %zu threads %d temp %d", p, th, si);
                compare_all(m, &cfg, prompts[p].ids, prompts[p].n, what, si ? &s : &g);
            }
    const cfg_t full = {1, 60, 200, 0, 0, sampling(0, 1), 0};
    compare_all(m, &full, p1, 40, "tiny-qwen3 full context", &g);
    report("tiny-qwen3", &g, &s);
    assert_true(g.accepted > 0 && g.drafted - g.accepted > 0);
    tern_model_free(m);
}

/* The KV memory runs out of blocks (another sequence holds them): a pass
 * with drafts retries without them, and where plain decoding fails with
 * TERN_EKVFULL, so does the speculative loop, after the same tokens. */
static void test_generate_memory_full(void **state) {
    (void)state;
    tern_model_t *m = load(tu_tiny_model("spec", "tiny", "q8_0", 5));
    /* 64 positions in 4 blocks of 16; sequence 1 takes 2 of them. */
    const int32_t p[] = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2};
    tally_t t = {0};
    for (int si = 0; si < 2; si++) {
        cfg_t cfg = {1, 64, 100, 0, 32, sampling(si ? 0.8f : 0, 1), 0};
        compare_all(m, &cfg, p, 10, "memory full", &t);
    }
    result_t *r = malloc(sizeof *r);
    cfg_t cfg = {1, 64, 100, 0, 32, sampling(0, 1), 0};
    run_one(m, &cfg, p, 10, NULL, r);
    assert_int_equal(r->rc, TERN_EKVFULL);
    assert_int_equal(r->res.stop, TERN_STOP_ERROR);
    free(r);
    tern_model_free(m);
}

/* tern_generate_spec against a loop of tern_eval and tern_sampler_sample
 * written here, independent of the library's generation loop. */
static void test_generate_vs_hand_loop(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "models/stories260K.gguf");
    tern_model_t *m = load(path);
    int32_t n_prompt;
    int32_t *ids = tokenize(m, k_prompts[1], &n_prompt);
    tern_error_t err = {0};
    for (int si = 0; si < 2; si++) {
        const tern_sampler_params_t sp = sampling(si ? 0.8f : 0, 99);
        tern_context_params_t cp = tern_context_default_params();
        cp.n_threads = 1;
        tern_context_t *c = tern_context_create(m, &cp, &err);
        tern_sampler_t *s = tern_sampler_create(m, &sp, &err);
        assert_int_equal(tern_eval(c, ids, n_prompt, NULL, &err), 0);
        for (int32_t i = 0; i < n_prompt; i++) tern_sampler_accept(s, ids[i]);
        int32_t want[80];
        int n = 0;
        while (n < 80) {
            int32_t id = tern_sampler_sample(s, tern_get_logits(c));
            tern_sampler_accept(s, id);
            want[n++] = id;
            if (tern_token_is_eog(m, id)) break;
            assert_int_equal(tern_eval(c, &id, 1, NULL, &err), 0);
        }
        tern_sampler_free(s);
        tern_context_free(c);

        c = tern_context_create(m, &cp, &err);
        s = tern_sampler_create(m, &sp, &err);
        out_t *o = calloc(1, sizeof *o);
        tern_generate_result_t res;
        tern_spec_stats_t st;
        tern_spec_params_t spp = tern_spec_default_params();
        spp.adaptive = 0;
        assert_int_equal(tern_generate_spec(c, s, ids, n_prompt, 80, &spp, on_tok, o, &res, &st, &err), 0);
        assert_int_equal(o->n, n);
        assert_memory_equal(o->ids, want, (size_t)n * sizeof *want);
        assert_true(st.n_accepted > 0);
        /* Timings: each kept position one generated token. */
        tern_timings_t t;
        tern_context_timings(c, &t);
        assert_int_equal(t.n_gen, tern_context_pos(c) - n_prompt);
        assert_int_equal(t.n_sample, n);
        assert_int_equal(st.n_generated, n);
        assert_true(st.n_passes < n);
        free(o);
        tern_sampler_free(s);
        tern_context_free(c);
    }
    /* Bad parameters. */
    tern_context_t *c = tern_context_create(m, NULL, &err);
    tern_sampler_params_t sp = sampling(0, 1);
    tern_sampler_t *s = tern_sampler_create(m, &sp, &err);
    tern_spec_params_t bad = tern_spec_default_params();
    bad.ngram_min = 0;
    tern_generate_result_t res;
    assert_int_equal(tern_generate_spec(c, s, ids, n_prompt, 8, &bad, NULL, NULL, &res, NULL, &err), TERN_EINVAL);
    assert_int_equal(res.stop, TERN_STOP_ERROR);
    assert_int_equal(tern_context_pos(c), 0);
    /* NULL params: the defaults. */
    assert_int_equal(tern_generate_spec(c, s, ids, n_prompt, 8, NULL, NULL, NULL, &res, NULL, &err), 0);
    assert_int_equal(res.n_generated, 8);
    tern_sampler_free(s);
    tern_context_free(c);
    free(ids);
    tern_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drafter_match),        cmocka_unit_test(test_drafter_repeat_and_edit),
        cmocka_unit_test(test_drafter_vs_scan),      cmocka_unit_test(test_ctl_off_when_rejected),
        cmocka_unit_test(test_ctl_on_when_accepted), cmocka_unit_test(test_generate_vs_hand_loop),
        cmocka_unit_test(test_generate_stories),     cmocka_unit_test(test_generate_aidreams),
        cmocka_unit_test(test_generate_tiny_qwen3),  cmocka_unit_test(test_generate_memory_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
