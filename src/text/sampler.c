/*
 * sampler.c - the sampling chain of sampler.h: penalties, top-k, top-p,
 * min-p, temperature, and a draw from a splitmix64 RNG.
 *
 * Cost: greedy without penalties is one pass over the logits. Otherwise the
 * logits are copied into a candidate array (the caller's are never touched);
 * top-k selects with a bounded min-heap (O(V log k)) and only the survivors
 * are sorted, so a 150k vocabulary with top-k 40 costs about one pass.
 */
#include "text/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

typedef struct {
    int32_t id;
    float logit;
} cand_t;

struct sampler {
    tern_sampler_params_t p;
    int32_t n_vocab;
    uint64_t rng;
    int32_t *window; /* ring of the last repeat_last_n accepted ids */
    int32_t n_window, window_head;
    cand_t *cand;    /* n_vocab */
    float *prob;     /* n_vocab */
    int32_t *seen;   /* scratch: distinct ids of the window */
    int32_t *counts; /* their counts */
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sampler_uniform(sampler_t *s) { return (double)(splitmix64(&s->rng) >> 11) * (1.0 / 9007199254740992.0); }

sampler_t *sampler_new(const tern_sampler_params_t *p, int32_t n_vocab, tern_error_t *err) {
    if (!p || n_vocab <= 0) {
        tern_err(err, TERN_EINVAL, "sampler: bad arguments (n_vocab %d)", n_vocab);
        return NULL;
    }
    const char *bad = NULL;
    if (!isfinite(p->temp)) bad = "temp";
    else if (!(p->top_p >= 0 && p->top_p <= 1)) bad = "top_p (want 0..1)";
    else if (!(p->min_p >= 0 && p->min_p <= 1)) bad = "min_p (want 0..1)";
    else if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty)) bad = "repeat_penalty (want > 0)";
    else if (!isfinite(p->presence_penalty)) bad = "presence_penalty";
    else if (!isfinite(p->frequency_penalty)) bad = "frequency_penalty";
    else if (p->repeat_last_n < 0 || p->repeat_last_n > (1 << 20)) bad = "repeat_last_n (want 0..1048576)";
    if (bad) {
        tern_err(err, TERN_EINVAL, "sampler: bad %s", bad);
        return NULL;
    }
    sampler_t *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->p = *p;
    s->n_vocab = n_vocab;
    int32_t w = p->repeat_last_n > 0 ? p->repeat_last_n : 1;
    s->window = calloc((size_t)w, sizeof *s->window);
    s->seen = calloc((size_t)w, sizeof *s->seen);
    s->counts = calloc((size_t)w, sizeof *s->counts);
    s->cand = tern_calloc((size_t)n_vocab, sizeof *s->cand);
    s->prob = tern_calloc((size_t)n_vocab, sizeof *s->prob);
    if (!s->window || !s->seen || !s->counts || !s->cand || !s->prob) goto oom;
    sampler_reset(s);
    return s;
oom:
    sampler_free(s);
    tern_err(err, TERN_ENOMEM, "sampler: out of memory for %d candidates", n_vocab);
    return NULL;
}

void sampler_free(sampler_t *s) {
    if (!s) return;
    free(s->window);
    free(s->seen);
    free(s->counts);
    tern_free(s->cand);
    tern_free(s->prob);
    free(s);
}

void sampler_reset(sampler_t *s) {
    s->rng = s->p.seed;
    s->n_window = 0;
    s->window_head = 0;
}

void sampler_accept(sampler_t *s, int32_t id) {
    int32_t w = s->p.repeat_last_n;
    if (w <= 0) return;
    s->window[s->window_head] = id;
    s->window_head = (s->window_head + 1) % w;
    if (s->n_window < w) s->n_window++;
}

static bool penalties_active(const tern_sampler_params_t *p) {
    return p->repeat_last_n > 0 && (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}

/* Distinct ids of the window with their counts, into s->seen / s->counts.
 * The window is small (tens of ids), so a quadratic scan is the fast way. */
static int32_t window_counts(sampler_t *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_window; i++) {
        int32_t id = s->window[i], j;
        for (j = 0; j < n && s->seen[j] != id; j++) {
        }
        if (j == n) {
            s->seen[n] = id;
            s->counts[n++] = 0;
        }
        s->counts[j]++;
    }
    return n;
}

/* Higher logit first; equal logits by lower id. A total order, so the result
 * never depends on the sort or selection algorithm. */
static inline bool cand_before(const cand_t *a, const cand_t *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}
static int cand_cmp(const void *pa, const void *pb) {
    const cand_t *a = pa, *b = pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Min-heap (by cand_before, the "worst" on top) helpers for top-k. */
static void heap_down(cand_t *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(&h[w], &h[l])) w = l;
        if (r < n && cand_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Keep the k best of n candidates in c[0..k), sorted best first. */
static int32_t top_k(cand_t *c, int32_t n, int32_t k) {
    if (k <= 0 || k >= n) {
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        return n;
    }
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_down(c, k, i);
    for (int32_t i = k; i < n; i++)
        if (cand_before(&c[i], &c[0])) {
            c[0] = c[i];
            heap_down(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
    return k;
}

/* Softmax of the (sorted) candidates' logits / temp into s->prob. */
static void softmax_cand(sampler_t *s, int32_t n, float temp) {
    double sum = 0;
    const float mx = s->cand[0].logit;
    for (int32_t i = 0; i < n; i++) {
        float e = expf((s->cand[i].logit - mx) / temp);
        s->prob[i] = e;
        sum += e;
    }
    for (int32_t i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
}

int32_t sampler_sample(sampler_t *s, const float *logits) {
    const tern_sampler_params_t *p = &s->p;
    const int32_t V = s->n_vocab;
    const bool pen = penalties_active(p) && s->n_window > 0;

    if (p->temp <= 0 && !pen) { /* greedy: first maximum */
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }

    /* 1. penalties */
    cand_t *c = s->cand;
    for (int32_t i = 0; i < V; i++) {
        c[i].id = i;
        c[i].logit = logits[i];
    }
    if (pen) {
        int32_t nd = window_counts(s);
        for (int32_t j = 0; j < nd; j++) {
            int32_t id = s->seen[j];
            if (id < 0 || id >= V) continue;
            float l = c[id].logit;
            l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
            l -= (float)s->counts[j] * p->frequency_penalty + p->presence_penalty;
            c[id].logit = l;
        }
    }
    if (p->temp <= 0) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (c[i].logit > c[best].logit) best = i;
        return best;
    }

    /* 2. top-k (also sorts, best first) */
    int32_t n = top_k(c, V, p->top_k);

    /* 3. top-p at temperature 1 */
    if (p->top_p < 1.0f) {
        softmax_cand(s, n, 1.0f);
        double cum = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += s->prob[i];
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }

    /* 4. min-p: p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p) */
    if (p->min_p > 0.0f) {
        const float thr = c[0].logit + logf(p->min_p);
        int32_t keep = 1;
        while (keep < n && c[keep].logit >= thr) keep++;
        n = keep;
    }

    /* 5. temperature, softmax, draw */
    softmax_cand(s, n, p->temp);
    double r = sampler_uniform(s), cum = 0;
    for (int32_t i = 0; i < n; i++) {
        cum += s->prob[i];
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id; /* r within rounding of 1 */
}
