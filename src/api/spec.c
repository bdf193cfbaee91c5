/*
 * spec.c - speculative decoding's two parts that do not touch the model:
 * the prompt-lookup drafter (tern_drafter_t) and the adaptive controller of
 * the draft length (tern_spec_ctl_t). The loop that runs them around the
 * forward pass is tern_generate_spec in generate.c; the rules both follow
 * are specified with their declarations in tern.h.
 *
 * The drafter's index. The history is h[0 .. len-1]. For every position p
 * >= 1 and every n in [ngram_min, ngram_max] with n <= p, the n-gram
 * h[p-n .. p-1] is followed by h[p]: the index maps a 64-bit hash of (n,
 * the n-gram) to p, a later p overwriting an earlier one, so it always
 * names the most recent occurrence that has a continuation. Pushing h[p]
 * inserts the n-grams that end at p-1. The n-gram that ends the history
 * (its suffix) is never in the index until a token follows it, so a lookup
 * of the suffix finds an earlier occurrence only. The table is open
 * addressing with linear probing on the hash (key 0 means empty), at most
 * half full; a hit is checked against the history, so a hash collision
 * costs a missed draft, never a wrong one.
 */
#include <stdlib.h>
#include <string.h>

#include "tern.h"
#include "api/api_internal.h"
#include "core/common.h"

/* ---- parameters ---- */

tern_spec_params_t tern_spec_default_params(void) {
    tern_spec_params_t p;
    p.n_draft_max = 8;
    p.ngram_max = 4;
    p.ngram_min = 1;
    p.adaptive = 1;
    return p;
}

static int check_ngram(int32_t nmin, int32_t nmax, const char *who, tern_error_t *err) {
    if (nmin < 1 || nmax < nmin || nmax > TERN_SPEC_NGRAM_MAX)
        return tern_err(err, TERN_EINVAL, "%s: n-gram lengths %d .. %d (want 1 <= min <= max <= %d)", who, nmin,
                        nmax, TERN_SPEC_NGRAM_MAX);
    return 0;
}

static int check_params(const tern_spec_params_t *p, const char *who, tern_error_t *err) {
    if (p->n_draft_max < 0 || p->n_draft_max > TERN_SPEC_DRAFT_MAX)
        return tern_err(err, TERN_EINVAL, "%s: n_draft_max %d (want 0 .. %d)", who, p->n_draft_max,
                        TERN_SPEC_DRAFT_MAX);
    return check_ngram(p->ngram_min, p->ngram_max, who, err);
}

/* ---- the drafter ---- */

struct tern_drafter {
    int32_t nmin, nmax;
    int32_t *hist;
    int32_t len, cap;
    uint64_t *keys; /* (tcap) 0: empty */
    int32_t *vals;  /* (tcap) the position after the n-gram's most recent occurrence */
    size_t tcap, used;
    gmatcher_t *gm; /* scratch of tern_drafter_draft_under: drafts checked against a grammar */
};

static uint64_t ngram_hash(const int32_t *t, int32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(n + 1);
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
    }
    return h ? h : 1;
}

/* The slot of key, or the empty slot where it would go. */
static size_t slot_of(const tern_drafter_t *d, uint64_t key) {
    size_t i = (size_t)(key ^ (key >> 32)) & (d->tcap - 1);
    while (d->keys[i] && d->keys[i] != key) i = (i + 1) & (d->tcap - 1);
    return i;
}

/* Room was made beforehand (the table never fills past half). */
static void insert(tern_drafter_t *d, uint64_t key, int32_t val) {
    size_t i = slot_of(d, key);
    if (!d->keys[i]) {
        d->keys[i] = key;
        d->used++;
    }
    d->vals[i] = val;
}

/* The n-grams that end at p-1, followed by h[p]. */
static void index_pos(tern_drafter_t *d, int32_t p) {
    for (int32_t n = d->nmin; n <= d->nmax && n <= p; n++) insert(d, ngram_hash(d->hist + p - n, n), p);
}

/* A table of tcap slots, the history re-indexed into it. */
static int rehash(tern_drafter_t *d, size_t tcap) {
    uint64_t *k = calloc(tcap, sizeof *k);
    int32_t *v = malloc(tcap * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return -1;
    }
    free(d->keys);
    free(d->vals);
    d->keys = k;
    d->vals = v;
    d->tcap = tcap;
    d->used = 0;
    for (int32_t p = 1; p < d->len; p++) index_pos(d, p);
    return 0;
}

tern_drafter_t *tern_drafter_create(int32_t ngram_min, int32_t ngram_max, tern_error_t *err) {
    if (check_ngram(ngram_min, ngram_max, "tern_drafter_create", err)) return NULL;
    tern_drafter_t *d = calloc(1, sizeof *d);
    if (!d || rehash(d, 1024)) {
        free(d);
        tern_err(err, TERN_ENOMEM, "out of memory for a drafter");
        return NULL;
    }
    d->nmin = ngram_min;
    d->nmax = ngram_max;
    return d;
}

void tern_drafter_free(tern_drafter_t *d) {
    if (!d) return;
    free(d->hist);
    free(d->keys);
    free(d->vals);
    gmatcher_free(d->gm);
    free(d);
}

void tern_drafter_reset(tern_drafter_t *d) {
    d->len = 0;
    memset(d->keys, 0, d->tcap * sizeof *d->keys);
    d->used = 0;
}

int32_t tern_drafter_n_tokens(const tern_drafter_t *d) { return d->len; }

int tern_drafter_push(tern_drafter_t *d, const int32_t *ids, int32_t n, tern_error_t *err) {
    if (!d || n < 0 || (n > 0 && !ids)) return tern_err(err, TERN_EINVAL, "tern_drafter_push: bad arguments");
    if (n == 0) return 0;
    if (n > INT32_MAX - d->len) return tern_err(err, TERN_EINVAL, "tern_drafter_push: history over 2^31 tokens");
    const int32_t len = d->len + n;
    if (len > d->cap) {
        int64_t nc = d->cap ? d->cap : 256;
        while (nc < len) nc *= 2;
        if (nc > INT32_MAX) nc = INT32_MAX;
        int32_t *h = realloc(d->hist, (size_t)nc * sizeof *h);
        if (!h) return tern_err(err, TERN_ENOMEM, "out of memory for a drafter history of %d tokens", len);
        d->hist = h;
        d->cap = (int32_t)nc;
    }
    /* At most (ngram_max - ngram_min + 1) new keys per token: make room for
     * all of them first, so that nothing below can fail. */
    const size_t need = d->used + (size_t)n * (size_t)(d->nmax - d->nmin + 1);
    if (need > d->tcap / 2) {
        size_t tc = d->tcap;
        while (tc / 2 < need) tc *= 2;
        /* rehash indexes the history as it is, which is what we want. */
        if (rehash(d, tc)) return tern_err(err, TERN_ENOMEM, "out of memory for a drafter index of %zu slots", tc);
    }
    memcpy(d->hist + d->len, ids, (size_t)n * sizeof *ids);
    const int32_t p0 = d->len;
    d->len = len;
    for (int32_t p = p0 > 0 ? p0 : 1; p < len; p++) index_pos(d, p);
    return 0;
}

int tern_drafter_truncate(tern_drafter_t *d, int32_t n, tern_error_t *err) {
    if (!d || n < 0) return tern_err(err, TERN_EINVAL, "tern_drafter_truncate: bad arguments");
    if (n >= d->len) return 0;
    d->len = n;
    memset(d->keys, 0, d->tcap * sizeof *d->keys);
    d->used = 0;
    for (int32_t p = 1; p < d->len; p++) index_pos(d, p);
    return 0;
}

int32_t tern_drafter_draft(const tern_drafter_t *d, int32_t *out, int32_t cap, int32_t *n_match) {
    if (n_match) *n_match = 0;
    if (!d || !out || cap <= 0) return 0;
    const int32_t *h = d->hist;
    const int32_t len = d->len;
    for (int32_t n = d->nmax; n >= d->nmin; n--) {
        if (len < n + 1) continue; /* the suffix and an earlier occurrence need n + 1 tokens */
        const int32_t *suf = h + len - n;
        const uint64_t key = ngram_hash(suf, n);
        const size_t i = slot_of(d, key);
        if (!d->keys[i]) continue;
        const int32_t j = d->vals[i]; /* h[j - n .. j - 1] is the occurrence, h[j] followed it */
        if (j < n || j >= len || memcmp(h + j - n, suf, (size_t)n * sizeof *h)) continue;
        /* Copy what followed; past the end of the history the text repeats
         * with period len - j (the draft continues its own copy). */
        const int32_t period = len - j;
        int32_t m = 0;
        for (; m < cap; m++) {
            const int32_t t = j + m < len ? h[j + m] : out[m - period];
            if (t < 0) break;
            out[m] = t;
        }
        if (m == 0) continue;
        if (n_match) *n_match = n;
        return m;
    }
    return 0;
}

int32_t tern_drafter_draft_under(tern_drafter_t *d, const tern_model_t *m, tern_matcher_t *mt, int32_t *out,
                                 int32_t cap, int32_t *n_match) {
    if (n_match) *n_match = 0;
    if (!d || !out || cap <= 0) return 0;
    gmatcher_t *g = api_matcher(mt);
    if (g && m && m->tok) {
        /* A grammar that admits one continuation: its text, tokenized, is
         * the draft (keyed as the surest match length). */
        char forced[256];
        const size_t nf = gmatcher_forced(g, forced, sizeof forced);
        int32_t *ids = NULL;
        size_t n = 0;
        if (nf && tok_encode(m->tok, forced, nf, false, false, &ids, &n, NULL) == 0 && n) {
            /* the last token may merge with what follows the forced text */
            size_t keep = n > 1 ? n - 1 : 1;
            if (keep > (size_t)cap) keep = (size_t)cap;
            memcpy(out, ids, keep * sizeof *ids);
            free(ids);
            if (n_match) *n_match = TERN_SPEC_NGRAM_MAX;
            return (int32_t)keep;
        }
        free(ids);
    }
    int32_t nm = 0;
    int32_t k = tern_drafter_draft(d, out, cap, &nm);
    if (k > 0 && g) { /* drafts the grammar refuses would be rejected: cut them */
        if (d->gm && gmatcher_grammar(d->gm) != gmatcher_grammar(g)) {
            gmatcher_free(d->gm);
            d->gm = NULL;
        }
        if (!d->gm) d->gm = gmatcher_create(gmatcher_grammar(g), NULL);
        if (!d->gm || gmatcher_copy(d->gm, g, NULL)) return 0;
        int32_t ok = 0;
        while (ok < k && gmatcher_accept(d->gm, out[ok], NULL) == 0) ok++;
        k = ok;
        if (!k) nm = 0;
    }
    if (n_match) *n_match = nm;
    return k;
}

/* ---- the controller ----
 * The rule is specified with tern_spec_ctl_t in tern.h; the constants: */
#define CTL_DECAY 0.9        /* per observed pass, of the accepted and rejection counts */
#define CTL_PRIOR_A 0.5      /* the acceptance before any observation, weighted as one pass */
#define CTL_TIME_RING 7      /* pass times kept per k: their median is the estimate */
#define CTL_PRIOR_SLOPE 0.25 /* r(k) = 1 + s k before any time is measured */
#define CTL_MIN_GAIN 1.05    /* drafting must promise 5% more tokens per unit of time */
#define CTL_PROBE_FIRST 16   /* passes while off before the first probe */
#define CTL_PROBE_MAX 256
#define CTL_PROBE_SOON 4     /* after a probe that accepted half or more */
#define CTL_PROBE_K 3
#define CTL_PROBE_BUDGET 0.02 /* failed probes may cost this share of the time */
#define CTL_BASELINE_EVERY 64 /* passes with drafts between plain steps measured */

struct tern_spec_ctl {
    tern_spec_params_t p;
    double acc[TERN_SPEC_NGRAM_MAX + 1], rej[TERN_SPEC_NGRAM_MAX + 1]; /* moving sums per match length */
    double acc_all, rej_all; /* over all match lengths: the prior of each */
    double ring[TERN_SPEC_DRAFT_MAX + 1][CTL_TIME_RING]; /* the last pass times with k drafts, ns */
    double t[TERN_SPEC_DRAFT_MAX + 1];   /* their median */
    int64_t nt[TERN_SPEC_DRAFT_MAX + 1]; /* passes timed with k drafts */
    int32_t probing; /* the last tern_spec_ctl_next asked for a probe */
    int32_t since_probe, probe_every;
    int32_t since_base;
};

tern_spec_ctl_t *tern_spec_ctl_create(const tern_spec_params_t *p, tern_error_t *err) {
    tern_spec_params_t dp = tern_spec_default_params();
    if (!p) p = &dp;
    if (check_params(p, "tern_spec_ctl_create", err)) return NULL;
    tern_spec_ctl_t *c = calloc(1, sizeof *c);
    if (!c) {
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    c->p = *p;
    tern_spec_ctl_reset(c);
    return c;
}

void tern_spec_ctl_free(tern_spec_ctl_t *ctl) { free(ctl); }

void tern_spec_ctl_reset(tern_spec_ctl_t *ctl) {
    const tern_spec_params_t p = ctl->p;
    memset(ctl, 0, sizeof *ctl);
    ctl->p = p;
    ctl->probe_every = CTL_PROBE_FIRST;
}

static int bucket(int32_t n_match) { return n_match < TERN_SPEC_NGRAM_MAX ? n_match : TERN_SPEC_NGRAM_MAX; }

/* a over all matches (prior one half), then a(n) with that as its prior:
 * a match length not seen yet starts from what the others showed. */
static double accept_est(const tern_spec_ctl_t *c, int b) {
    const double all = (c->acc_all + CTL_PRIOR_A) / (c->acc_all + c->rej_all + 1.0);
    return (c->acc[b] + all) / (c->acc[b] + c->rej[b] + 1.0);
}

/* s: least squares through r(0) = 1 over the k measured, each weighted by
 * its count (at most 8, so that no k dominates). */
static double slope_est(const tern_spec_ctl_t *c) {
    if (!c->nt[0]) return CTL_PRIOR_SLOPE;
    double num = 0, den = 0;
    for (int k = 1; k <= c->p.n_draft_max; k++) {
        if (!c->nt[k]) continue;
        const double w = (double)(c->nt[k] < 8 ? c->nt[k] : 8);
        num += w * k * (c->t[k] / c->t[0] - 1.0);
        den += w * k * k;
    }
    if (den <= 0) return CTL_PRIOR_SLOPE;
    const double s = num / den;
    return s > 0 ? s : 0;
}

/* r(k) >= 1: a pass never costs less than a plain step (a measurement
 * that says so is noise, and would make drafting look free). */
static double cost_ratio(const tern_spec_ctl_t *c, int k, double slope) {
    double r = c->nt[0] && c->nt[k] >= 2 ? c->t[k] / c->t[0] : 1.0 + slope * k;
    return r > 1.0 ? r : 1.0;
}

static int32_t choose(const tern_spec_ctl_t *c, int b, double *gain_out) {
    const double a = accept_est(c, b), s = slope_est(c);
    double best = 1.0, e = 1.0, ai = 1.0;
    int32_t bk = 0;
    for (int k = 1; k <= c->p.n_draft_max; k++) {
        ai *= a;
        e += ai; /* E(k) = 1 + a + ... + a^k */
        const double g = e / cost_ratio(c, k, s);
        if (g > best) {
            best = g;
            bk = k;
        }
    }
    if (best <= CTL_MIN_GAIN) {
        bk = 0;
        best = 1.0;
    }
    if (gain_out) *gain_out = best;
    return bk;
}

/* A baseline is due when passes with drafts were timed but no plain step
 * was, or not for CTL_BASELINE_EVERY passes with drafts. */
static int baseline_due(const tern_spec_ctl_t *c) {
    if (c->nt[0]) return c->since_base >= CTL_BASELINE_EVERY;
    for (int k = 1; k <= c->p.n_draft_max; k++)
        if (c->nt[k]) return 1;
    return 0;
}

static int32_t probe_k(const tern_spec_ctl_t *c) {
    return c->p.n_draft_max < CTL_PROBE_K ? c->p.n_draft_max : CTL_PROBE_K;
}

/* Passes between probes: the interval, or more when a probe is dear. */
static int32_t probe_interval(const tern_spec_ctl_t *c) {
    const double dear = (cost_ratio(c, probe_k(c), slope_est(c)) - 1.0) / CTL_PROBE_BUDGET;
    return dear > c->probe_every ? (dear < 1e6 ? (int32_t)dear : 1000000) : c->probe_every;
}

int32_t tern_spec_ctl_next(tern_spec_ctl_t *ctl, int32_t n_match) {
    ctl->probing = 0;
    if (ctl->p.n_draft_max == 0 || n_match <= 0) return 0;
    if (!ctl->p.adaptive) return ctl->p.n_draft_max;
    if (baseline_due(ctl)) return 0;
    const int32_t k = choose(ctl, bucket(n_match), NULL);
    if (k) return k;
    if (ctl->since_probe >= probe_interval(ctl)) {
        ctl->probing = 1;
        return probe_k(ctl);
    }
    return 0;
}

void tern_spec_ctl_observe(tern_spec_ctl_t *ctl, int32_t n_match, int32_t n_drafted, int32_t n_accepted) {
    const int probe = ctl->probing;
    ctl->probing = 0;
    if (n_drafted <= 0 || n_match <= 0) {
        ctl->since_probe++;
        return;
    }
    const int b = bucket(n_match);
    if (n_accepted < 0) n_accepted = 0;
    if (n_accepted > n_drafted) n_accepted = n_drafted;
    ctl->acc[b] = CTL_DECAY * ctl->acc[b] + n_accepted;
    ctl->rej[b] = CTL_DECAY * ctl->rej[b] + (n_accepted < n_drafted);
    ctl->acc_all = CTL_DECAY * ctl->acc_all + n_accepted;
    ctl->rej_all = CTL_DECAY * ctl->rej_all + (n_accepted < n_drafted);
    ctl->since_base++;
    if (!probe) return;
    /* A probe: is drafting worth it again? */
    ctl->since_probe = 0;
    if (choose(ctl, b, NULL)) ctl->probe_every = CTL_PROBE_FIRST;
    else if (2 * n_accepted < n_drafted)
        ctl->probe_every = ctl->probe_every * 2 < CTL_PROBE_MAX ? ctl->probe_every * 2 : CTL_PROBE_MAX;
    else
        ctl->probe_every = CTL_PROBE_SOON;
}

void tern_spec_ctl_time(tern_spec_ctl_t *ctl, int32_t n_drafted, uint64_t ns) {
    if (n_drafted < 0 || n_drafted > ctl->p.n_draft_max || ns == 0) return;
    /* The median of the last few: one pass preempted on a busy machine
     * (ten times the usual time) must not decide. */
    double *r = ctl->ring[n_drafted];
    r[ctl->nt[n_drafted] % CTL_TIME_RING] = (double)ns;
    ctl->nt[n_drafted]++;
    const int n = ctl->nt[n_drafted] < CTL_TIME_RING ? (int)ctl->nt[n_drafted] : CTL_TIME_RING;
    double v[CTL_TIME_RING];
    for (int i = 0; i < n; i++) { /* insertion sort of at most 7 */
        int j = i;
        for (; j > 0 && v[j - 1] > r[i]; j--) v[j] = v[j - 1];
        v[j] = r[i];
    }
    ctl->t[n_drafted] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    if (n_drafted == 0) ctl->since_base = 0;
}

void tern_spec_ctl_info(const tern_spec_ctl_t *ctl, int32_t n_match, tern_spec_ctl_info_t *info) {
    const int b = bucket(n_match > 0 ? n_match : 1);
    info->accept = accept_est(ctl, b);
    info->cost_slope = slope_est(ctl);
    info->gain = 1.0;
    info->k = ctl->p.adaptive ? choose(ctl, b, &info->gain) : ctl->p.n_draft_max;
    info->off = info->k == 0;
}

int api_spec_check(const tern_spec_params_t *p, tern_error_t *err) { return check_params(p, "tern_generate_spec", err); }
