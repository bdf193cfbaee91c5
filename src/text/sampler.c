/*
 * sampler.c - the sampling chain of sampler.h: a list of stages, each a
 * small struct (kind, parameters, apply function) run in order over one
 * candidate set, and the state blob.
 *
 * The candidate set is the array of (id, logit) pairs plus what the stages
 * need to know about it: whether it is still every id in id order ("dense":
 * then c[id] is id's entry), whether it is sorted best first, and the
 * temperature a TEMP stage set. A stage that needs order sorts when the set
 * is not sorted; a stage that looks ids up uses c[id] when dense, else an
 * id -> index map built for the set (only custom chains get there).
 *
 * Cost: when no stage before GREEDY changes logits, greedy is one pass over
 * the caller's logits (argmax_f32). When none before the first TOP_K does,
 * top-k reads the caller's logits directly: a bounded min-heap of the first
 * k, then a vector scan for the next id above its root (f32_next_above),
 * so a 152k vocabulary with top-k 40 costs one pass of compares, no copy.
 * Otherwise the logits are copied into the candidate array (the caller's
 * are never touched) and top-k selects on the copy the same way. Without
 * top-k (OpenAI's default request) top-p and the draw need the whole set's
 * softmax sum (one vector pass, text/softmax.c) but only as much of its
 * sorted order as their walk reaches: the set is sorted band by band
 * (banded_walk), each band a stable radix sort (cset_sort's too, for full
 * sorts of large sets). dev/ab/sampler_ab.c, 151936 ids, AMD EPYC (Zen 4):
 * the CLI's default chain 0.25 ms -> 0.018 ms a draw, the untruncated one
 * 20 ms -> 1.9 ms (radix sort) -> 0.23 ms best, 0.5 ms mean (bands, logits
 * spread like a random model's: the walk often goes deep).
 */
#include "text/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/argmax.h"
#include "core/common.h"
#include "text/grammar.h"
#include "text/softmax.h"

typedef tern_token_logit_t cand_t;

typedef struct {
    cand_t *c;
    int32_t n;
    bool dense;  /* c[i].id == i for every i < n == n_vocab */
    bool sorted; /* best first, by cand_before */
    float temp;  /* set by TEMP; TOP_P, MIN_P and DIST use it */
    int32_t chosen;
} cset_t;

typedef struct stage stage_t;
/* 0: go on; -1: no token can be chosen (sample returns -1). */
typedef int (*stage_fn)(sampler_t *s, const stage_t *st, cset_t *cs);
struct stage {
    tern_sampler_stage_t kind;
    stage_fn apply;
    int32_t k; /* TOP_K */
    float x;   /* TOP_P, MIN_P: p; TEMP: temperature */
};

struct sampler {
    tern_sampler_params_t p;
    int32_t n_vocab;
    stage_t stages[TERN_SAMPLER_MAX_STAGES];
    int n_stages;
    uint64_t rng;
    int32_t cap;     /* window capacity: repeat_last_n (0: no window) */
    int32_t *window; /* ring of the last cap accepted ids */
    int32_t n_window, window_head;
    cand_t *cand;    /* n_vocab */
    cand_t *tmp;     /* n_vocab: radix_sort's other half */
    cand_t *pre;     /* n_vocab: a sorted prefix of the set (prefix_sorted) */
    int32_t *where;  /* n_vocab: id -> index in a non-dense set (see find) */
    cand_t *top;     /* top_k + 32: the grammar's first candidates */
    int32_t *seen;   /* scratch: distinct ids of the window */
    int32_t *counts; /* their counts */
    tern_mask_fn mask_fn;
    void *mask_user;
    gmatcher_t *matcher; /* a grammar's state (borrowed), applied by MASK */
    tern_logit_bias_t *bias;
    size_t n_bias;
    bool bias_bans; /* some bias is -INFINITY */
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sampler_uniform(sampler_t *s) { return (double)(splitmix64(&s->rng) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- the candidate set ----------------------------------------------------- */

/* Higher logit first; equal logits by lower id. A total order, so the result
 * never depends on the sort or selection algorithm. */
static inline bool cand_before(const cand_t *a, const cand_t *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}
/* qsort's order: cand_before's, NaNs after every number by id (as the
 * radix sort puts them), so a sort with NaNs has one result too. */
static int cand_cmp(const void *pa, const void *pb) {
    const cand_t *a = pa, *b = pb;
    if (a->logit != a->logit || b->logit != b->logit)
        return a->logit != a->logit ? (b->logit != b->logit ? (a->id > b->id) - (a->id < b->id) : 1) : -1;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Sort key of a logit: cand_before's order of logits as an ascending
 * unsigned order (higher logit, smaller key); -0 as +0 (they compare
 * equal), every NaN UINT32_MAX (after every number). */
static inline uint32_t sort_key(float f) {
    if (f != f) return UINT32_MAX;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (u == 0x80000000u) u = 0;
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending in f */
    return ~u;
}

/* Sets this large whose ids ascend are sorted by radix_sort. */
#define RADIX_MIN 2048

/* A stable LSD radix sort of c[0..n) by sort_key (4 passes of 8 bits,
 * through tmp, ending in c). Stable, so equal logits keep their order: for
 * ids that ascend, the order cand_before defines (a total order without
 * NaNs, so the same as any sort by it), NaNs last by id. */
static void radix_sort(cand_t *c, cand_t *tmp, int32_t n) {
    uint32_t h[4][256];
    memset(h, 0, sizeof h);
    for (int32_t i = 0; i < n; i++) {
        const uint32_t k = sort_key(c[i].logit);
        for (int d = 0; d < 4; d++) h[d][k >> (8 * d) & 255]++;
    }
    /* A digit every key shares moves nothing: its pass is skipped (the
     * keys of a band of nearby logits share their top byte). */
    bool skip[4];
    for (int d = 0; d < 4; d++) skip[d] = n > 0 && h[d][sort_key(c[0].logit) >> (8 * d) & 255] == (uint32_t)n;
    for (int d = 0; d < 4; d++) {
        uint32_t sum = 0;
        for (int b = 0; b < 256; b++) {
            const uint32_t t = h[d][b];
            h[d][b] = sum;
            sum += t;
        }
    }
    cand_t *src = c, *dst = tmp;
    for (int d = 0; d < 4; d++) {
        if (skip[d]) continue;
        for (int32_t i = 0; i < n; i++) dst[h[d][sort_key(src[i].logit) >> (8 * d) & 255]++] = src[i];
        cand_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != c) memcpy(c, src, (size_t)n * sizeof *c);
}

static bool ids_ascend(const cset_t *cs) {
    if (cs->dense) return true;
    for (int32_t i = 1; i < cs->n; i++)
        if (cs->c[i].id <= cs->c[i - 1].id) return false;
    return true;
}

/* c[0..n) best first: radix_sort (through s->tmp) when n >= radix_min and
 * the ids ascend (stable: the order cand_before defines), qsort otherwise. */
static void sort_cands(sampler_t *s, cand_t *c, int32_t n, int32_t radix_min, bool ascend) {
    if (n >= radix_min && ascend) radix_sort(c, s->tmp, n);
    else qsort(c, (size_t)n, sizeof *c, cand_cmp);
}

/* Best first by cand_before: a large set whose ids ascend (the copied
 * vocabulary, or what a mask or a ban left of it) by radix_sort, which
 * costs a few passes where qsort's comparisons took most of a full-
 * vocabulary draw (OpenAI's default request, no truncation: about 60% of a
 * loaded server's time at 152k ids); qsort otherwise. */
static void cset_sort(sampler_t *s, cset_t *cs) {
    if (cs->sorted) return;
    sort_cands(s, cs->c, cs->n, RADIX_MIN, cs->n >= RADIX_MIN && ids_ascend(cs));
    cs->sorted = true;
    cs->dense = false;
}

/* Lookups of ids in a set that is not dense: where[id] is written for every
 * candidate before the lookups, and an entry counts only if it points at a
 * candidate holding that id (so stale entries of earlier sets never need
 * clearing). */
static void index_set(sampler_t *s, const cset_t *cs) {
    if (cs->dense) return;
    for (int32_t i = 0; i < cs->n; i++)
        if (cs->c[i].id >= 0 && cs->c[i].id < s->n_vocab) s->where[cs->c[i].id] = i;
}
static cand_t *find(sampler_t *s, cset_t *cs, int32_t id) {
    if (id < 0 || id >= s->n_vocab) return NULL;
    if (cs->dense) return &cs->c[id];
    int32_t i = s->where[id];
    return i >= 0 && i < cs->n && cs->c[i].id == id ? &cs->c[i] : NULL;
}

/* Drop candidates at -INFINITY or NaN (banned), keeping the order. */
static int cset_drop_banned(cset_t *cs) {
    int32_t k = 0;
    for (int32_t i = 0; i < cs->n; i++)
        if (cs->c[i].logit > -INFINITY) cs->c[k++] = cs->c[i];
    if (k != cs->n) cs->dense = false;
    cs->n = k;
    return k > 0 ? 0 : -1;
}

/* The probabilities (tern_sampler.h): candidate i of a set of n at
 * temperature t has e_i = tern_expf((logit_i - mx) / t), mx the set's
 * largest logit, and probability (float)(e_i / sum), sum = softmax_sum
 * over the set in the order it has when the stage starts. Returns sum;
 * *mx, and *finite = every logit finite. */
static double set_sum(const cset_t *cs, float t, float *mx, bool *finite) {
    *finite = softmax_max(cs->c, cs->n, mx);
    return softmax_sum(cs->c, cs->n, *mx, t);
}

/* Walks over candidates sorted best first, accumulating the probabilities
 * (softmax_probs, a chunk at a time) in double from *cum: top-p's stop (the
 * first i with cum >= p, top_p >= 0) or else the draw's (the first i with
 * r < cum); -1 when the walk ends first (*cum then holds the total, to go
 * on from). */
#define WALK_CHUNK 256
static int32_t walk(const cand_t *c, int32_t n, double sum, float mx, float t, float top_p, double r, double *cum) {
    double p[WALK_CHUNK];
    for (int32_t i0 = 0; i0 < n; i0 += WALK_CHUNK) {
        const int32_t k = n - i0 < WALK_CHUNK ? n - i0 : WALK_CHUNK;
        softmax_probs(c + i0, k, mx, t, sum, p);
        double a = *cum;
        if (top_p >= 0) {
            for (int32_t i = 0; i < k; i++)
                if ((a += p[i]) >= top_p) return *cum = a, i0 + i;
        } else {
            for (int32_t i = 0; i < k; i++)
                if (r < (a += p[i])) return *cum = a, i0 + i;
        }
        *cum = a;
    }
    return -1;
}

/* A large set not yet sorted is walked band by band instead of sorting it
 * whole: band b holds the candidates with tau_b <= logit < tau_{b-1}, tau_b =
 * mx - t * k_band_nats[b] (the last band: everything below), each band sorted
 * on its own and appended to s->pre. Every candidate of a band comes after
 * every one of the bands before it in the full sort, so s->pre grows as the
 * fully sorted set's prefix, and a walk that stops in it stops where the
 * walk over the fully sorted set would, at the same cum. What stays
 * unsorted is the tail whose probability the walk never reached, and
 * sorting it was most of a draw. Sets with a NaN or an infinity (no band
 * order for them) take the full sort. */
#define BANDED_MIN RADIX_MIN
/* Bands this large take the radix sort (its fixed cost is a few µs). */
#define BAND_RADIX_MIN 64
/* The bands' lower edges, in temperature units below the best logit (the
 * last band: everything below the one before; the draw's skip_draw uses
 * them too). */
static const float k_band_nats[] = {2.0f, 4.0f, 7.0f, 10.0f, 14.0f, 20.0f, 28.0f, INFINITY};
#define N_BANDS ((int)(sizeof k_band_nats / sizeof *k_band_nats))

/* Band b of cs (finite logits; hi = tau_{b-1}, +INFINITY for the first),
 * sorted best first into s->pre + at; returns its count. */
static int32_t band_sorted(sampler_t *s, const cset_t *cs, float lo, float hi, int32_t at) {
    cand_t *o = s->pre + at;
    const int32_t m = softmax_collect(cs->c, cs->n, lo, hi, o);
    /* in the set's order: ids ascend here when they do there */
    sort_cands(s, o, m, BAND_RADIX_MIN, m >= BAND_RADIX_MIN && ids_ascend(cs));
    return m;
}

/* The banded walk: top_p >= 0 walks for top-p's stop, else for the draw's
 * (r). Returns the stop's index in s->pre (every candidate before it is
 * there, sorted), or -1 when the walk ran through the whole set (then all
 * of it is in s->pre, sorted). */
static int32_t banded_walk(sampler_t *s, const cset_t *cs, double sum, float mx, float top_p, double r) {
    const float t = cs->temp;
    double cum = 0;
    int32_t at = 0;
    float hi = INFINITY;
    for (int b = 0; b < N_BANDS; b++) {
        const float lo = b == N_BANDS - 1 ? -INFINITY : mx - t * k_band_nats[b];
        if (!(lo < hi)) continue; /* an empty band (a huge temperature) */
        const int32_t m = band_sorted(s, cs, lo, hi, at);
        const int32_t i = walk(s->pre + at, m, sum, mx, t, top_p, r, &cum);
        if (i >= 0) return at + i;
        at += m;
        hi = lo;
    }
    return -1;
}

/* ---- the stages -------------------------------------------------------------- */

static int st_mask(sampler_t *s, const stage_t *st, cset_t *cs) {
    (void)st;
    if (!s->mask_fn && !s->matcher) return 0;
    if (s->mask_fn) {
        if (s->mask_fn(s->mask_user, cs->c, cs->n)) return -1;
        cs->sorted = false; /* the callback may have touched any logit */
    }
    if (s->matcher) {
        const uint64_t *bits = gmatcher_mask(s->matcher);
        if (!bits) return -1;
        for (int32_t i = 0; i < cs->n; i++) {
            uint32_t id = (uint32_t)cs->c[i].id;
            if (!(bits[id >> 6] >> (id & 63) & 1)) cs->c[i].logit = -INFINITY;
        }
    }
    return cset_drop_banned(cs);
}

static int st_logit_bias(sampler_t *s, const stage_t *st, cset_t *cs) {
    (void)st;
    if (!s->n_bias) return 0;
    index_set(s, cs);
    for (size_t i = 0; i < s->n_bias; i++) {
        cand_t *c = find(s, cs, s->bias[i].token);
        if (c) c->logit += s->bias[i].bias;
    }
    cs->sorted = false;
    return s->bias_bans ? cset_drop_banned(cs) : 0;
}

static bool penalties_on(const sampler_t *s) {
    const tern_sampler_params_t *p = &s->p;
    return s->cap > 0 && s->n_window > 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
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

static int st_penalties(sampler_t *s, const stage_t *st, cset_t *cs) {
    (void)st;
    if (!penalties_on(s)) return 0;
    const tern_sampler_params_t *p = &s->p;
    index_set(s, cs);
    int32_t nd = window_counts(s);
    for (int32_t j = 0; j < nd; j++) {
        cand_t *c = find(s, cs, s->seen[j]);
        if (!c) continue;
        float l = c->logit;
        l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)s->counts[j] * p->frequency_penalty + p->presence_penalty;
        c->logit = l;
    }
    cs->sorted = false;
    return 0;
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

/* The k best of a dense set with a bounded min-heap of the first k, then
 * a scan that replaces the root with every candidate before it (see
 * st_top_k). In id order every later id is after any equal logit in the
 * heap, so "before the root" is logit > the root's, which f32_next_above
 * finds 8 lanes at a time; the pushes are the loop's own, one by one, so
 * the heap holds what the plain scan would (NaNs included: never pushed,
 * and nothing is pushed past a NaN root). logits: the set's logits by id
 * (the caller's array: top-k without copying the vocabulary), c: room for
 * k candidates. */
static void topk_dense(const float *logits, int32_t n, int32_t k, cand_t *c) {
    for (int32_t i = 0; i < k; i++) c[i] = (cand_t){i, logits[i]};
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_down(c, k, i);
    for (int32_t i = f32_next_above(logits, k, n, c[0].logit); i < n;
         i = f32_next_above(logits, i + 1, n, c[0].logit)) {
        const cand_t x = {i, logits[i]};
        if (cand_before(&x, &c[0])) {
            c[0] = x;
            heap_down(c, k, 0);
        }
    }
}

/* Keep the k best candidates, sorted best first (k <= 0: all, sorted). */
static int st_top_k(sampler_t *s, const stage_t *st, cset_t *cs) {
    (void)s;
    const int32_t k = st->k, n = cs->n;
    if (k <= 0 || k >= n) return 0; /* keeps every candidate, as they are */
    if (cs->sorted) {
        cs->n = k;
        return 0;
    }
    cand_t *c = cs->c;
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_down(c, k, i);
    for (int32_t i = k; i < n; i++)
        if (cand_before(&c[i], &c[0])) {
            c[0] = c[i];
            heap_down(c, k, 0);
        }
    cs->n = k;
    cs->sorted = false;
    cset_sort(s, cs);
    return 0;
}

static int st_top_p(sampler_t *s, const stage_t *st, cset_t *cs) {
    if (st->x >= 1.0f) return 0;
    float mx;
    bool finite;
    const double sum = set_sum(cs, cs->temp, &mx, &finite);
    int32_t i;
    if (!cs->sorted && cs->n >= BANDED_MIN && finite) {
        i = banded_walk(s, cs, sum, mx, st->x, 0);
        memcpy(cs->c, s->pre, (size_t)(i >= 0 ? i + 1 : cs->n) * sizeof *cs->c);
        cs->sorted = true;
        cs->dense = false;
    } else {
        cset_sort(s, cs);
        double cum = 0;
        i = walk(cs->c, cs->n, sum, mx, cs->temp, st->x, 0, &cum);
    }
    if (i >= 0) cs->n = i + 1;
    return 0;
}

/* One body (never inlined twice), so both paths of st_min_p compare with
 * the same float, whatever the compiler contracts. */
__attribute__((noinline)) static float min_p_threshold(float best, float temp, float min_p) {
    return best + temp * logf(min_p);
}

static int st_min_p(sampler_t *s, const stage_t *st, cset_t *cs) {
    if (st->x <= 0.0f) return 0;
    float mx;
    if (!cs->sorted && cs->n >= BANDED_MIN && softmax_max(cs->c, cs->n, &mx)) {
        /* the candidates at or above the threshold, sorted: the full sort's first ones */
        const int32_t m = band_sorted(s, cs, min_p_threshold(mx, cs->temp, st->x), INFINITY, 0);
        memcpy(cs->c, s->pre, (size_t)m * sizeof *cs->c);
        cs->n = m;
        cs->sorted = true;
        cs->dense = false;
        return 0;
    }
    cset_sort(s, cs);
    const float thr = min_p_threshold(cs->c[0].logit, cs->temp, st->x);
    int32_t keep = 1;
    while (keep < cs->n && cs->c[keep].logit >= thr) keep++;
    cs->n = keep;
    return 0;
}

static int st_temp(sampler_t *s, const stage_t *st, cset_t *cs) {
    (void)s;
    cs->temp *= st->x;
    return 0;
}

/* The draw over a large unsorted set, without sorting what it does not
 * reach. The set is cut into banded_walk's bands (k_band_nats below the best;
 * one scan of the set collects a band), and a band the draw stops in is
 * halved by logit again until the part it stops in is small. Every part
 * is weighed before it is sorted (softmax_mass): when each probability in
 * it is at least 2^-29 its mass adds to the walk's cumulative sum exactly,
 * in any order, so a part the draw does not stop in is passed whole with
 * the sum the sorted walk would have after it. The small part the draw
 * stops in is sorted and walked from that sum: the same stop as the walk
 * over the fully sorted set. A band with smaller probabilities is sorted
 * and walked whole, and so is every band after it. Returns the chosen id,
 * or -1 when the walk ran past the end (r within rounding of 1: the
 * caller's full sort decides). */
/* Parts at most this large are sorted rather than halved. */
#define SKIP_SORT_MAX 1024
static int32_t skip_draw(sampler_t *s, const cset_t *cs, double sum, float mx, double r) {
    const float t = cs->temp;
    const bool ascend = cs->dense || ids_ascend(cs);
    double cum = 0;
    float hi = INFINITY;
    for (int b = 0; b < N_BANDS; b++) {
        const float lo = b == N_BANDS - 1 ? -INFINITY : mx - t * k_band_nats[b];
        if (!(lo < hi)) continue; /* empty */
        int32_t m = softmax_collect(cs->c, cs->n, lo, hi, s->pre);
        const float band_hi = hi;
        hi = lo;
        if (m == 0) continue;
        float minp;
        const double band = softmax_mass(s->pre, m, mx, t, sum, &minp);
        const bool exact = minp >= SOFTMAX_EXACT_P;
        if (exact && !(r < cum + band)) {
            cum += band;
            continue;
        }
        /* The draw stops in this band (or its sum is not exact): halve it
         * while it is large, keeping the half the draw stops in. The upper
         * half [mid, phi) comes first in the sorted order. */
        float plo = lo == -INFINITY ? mx - t * 64.0f : lo, phi = band_hi == INFINITY ? mx + 1.0f : band_hi;
        while (exact && m > SKIP_SORT_MAX) {
            const float mid = plo + (phi - plo) * 0.5f;
            if (!(plo < mid && mid < phi)) break;
            const int32_t mu = softmax_collect(s->pre, m, mid, INFINITY, s->tmp);
            float mu_min;
            const double upper = softmax_mass(s->tmp, mu, mx, t, sum, &mu_min);
            if (!(r < cum + upper)) { /* past the upper half: keep the lower */
                cum += upper;
                m = softmax_collect(s->pre, m, -INFINITY, mid, s->tmp);
                phi = mid;
            } else {
                m = mu;
                plo = mid;
            }
            memcpy(s->pre, s->tmp, (size_t)m * sizeof *s->pre);
        }
        sort_cands(s, s->pre, m, BAND_RADIX_MIN, ascend);
        const int32_t i = walk(s->pre, m, sum, mx, t, -1.0f, r, &cum);
        if (i >= 0) return s->pre[i].id;
    }
    return -1;
}

static int st_dist(sampler_t *s, const stage_t *st, cset_t *cs) {
    (void)st;
    float mx;
    bool finite;
    const double sum = set_sum(cs, cs->temp, &mx, &finite);
    const double r = sampler_uniform(s);
    if (!cs->sorted && cs->n >= BANDED_MIN && finite) {
        const int32_t id = skip_draw(s, cs, sum, mx, r);
        if (id >= 0) {
            cs->chosen = id;
            return 0;
        }
    }
    cset_sort(s, cs);
    double cum = 0;
    const int32_t i = walk(cs->c, cs->n, sum, mx, cs->temp, -1.0f, r, &cum);
    cs->chosen = cs->c[i >= 0 ? i : cs->n - 1].id; /* past the end: r within rounding of 1 */
    return 0;
}

/* The best candidate: c[0] when sorted; else the first maximum in the set's
 * order (id order when dense), which cand_before makes the same choice. */
static int st_greedy(sampler_t *s, const stage_t *st, cset_t *cs) {
    (void)s;
    (void)st;
    int32_t best = 0;
    if (!cs->sorted)
        for (int32_t i = 1; i < cs->n; i++)
            if (cand_before(&cs->c[i], &cs->c[best])) best = i;
    cs->chosen = cs->c[best].id;
    return 0;
}

static const stage_fn stage_fns[TERN_SAMPLER_MAX_STAGES] = {
    [TERN_STAGE_MASK] = st_mask,   [TERN_STAGE_LOGIT_BIAS] = st_logit_bias, [TERN_STAGE_PENALTIES] = st_penalties,
    [TERN_STAGE_TOP_K] = st_top_k, [TERN_STAGE_TOP_P] = st_top_p,           [TERN_STAGE_MIN_P] = st_min_p,
    [TERN_STAGE_TEMP] = st_temp,   [TERN_STAGE_DIST] = st_dist,             [TERN_STAGE_GREEDY] = st_greedy,
};

/* ---- construction ------------------------------------------------------------ */

static const char *bad_param(const tern_sampler_params_t *p) {
    if (!isfinite(p->temp)) return "temp";
    if (!(p->top_p >= 0 && p->top_p <= 1)) return "top_p (want 0..1)";
    if (!(p->min_p >= 0 && p->min_p <= 1)) return "min_p (want 0..1)";
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty)) return "repeat_penalty (want > 0)";
    if (!isfinite(p->presence_penalty)) return "presence_penalty";
    if (!isfinite(p->frequency_penalty)) return "frequency_penalty";
    if (p->repeat_last_n < 0 || p->repeat_last_n > (1 << 20)) return "repeat_last_n (want 0..1048576)";
    return NULL;
}

sampler_t *sampler_create_chain(const tern_sampler_params_t *p, const tern_sampler_stage_t *stages, int n,
                                int32_t n_vocab, tern_error_t *err) {
    if (!p || n_vocab <= 0 || !stages || n < 1 || n > TERN_SAMPLER_MAX_STAGES) {
        tern_err(err, TERN_EINVAL, "sampler: bad arguments (n_vocab %d, %d stages)", n_vocab, n);
        return NULL;
    }
    const char *bad = bad_param(p);
    if (bad) {
        tern_err(err, TERN_EINVAL, "sampler: bad %s", bad);
        return NULL;
    }
    unsigned used = 0;
    for (int i = 0; i < n; i++) {
        unsigned k = (unsigned)stages[i];
        bool terminal = k == TERN_STAGE_DIST || k == TERN_STAGE_GREEDY;
        if (k >= TERN_SAMPLER_MAX_STAGES) {
            tern_err(err, TERN_EINVAL, "sampler: stage %d has an unknown kind %u", i, k);
            return NULL;
        }
        if (used & (1u << k)) {
            tern_err(err, TERN_EINVAL, "sampler: stage %d repeats kind %u (each kind at most once)", i, k);
            return NULL;
        }
        if (terminal != (i == n - 1)) {
            tern_err(err, TERN_EINVAL, "sampler: the chain must end with DIST or GREEDY, and have it only there");
            return NULL;
        }
        if (k == TERN_STAGE_TEMP && !(p->temp > 0)) {
            tern_err(err, TERN_EINVAL, "sampler: a TEMP stage needs temp > 0 (use GREEDY for temperature 0)");
            return NULL;
        }
        used |= 1u << k;
    }
    sampler_t *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->p = *p;
    s->n_vocab = n_vocab;
    for (int i = 0; i < n; i++) {
        stage_t *st = &s->stages[i];
        st->kind = stages[i];
        st->apply = stage_fns[stages[i]];
        st->k = p->top_k;
        st->x = stages[i] == TERN_STAGE_TOP_P ? p->top_p : stages[i] == TERN_STAGE_MIN_P ? p->min_p : p->temp;
    }
    s->n_stages = n;
    s->cap = p->repeat_last_n;
    int32_t w = s->cap > 0 ? s->cap : 1;
    s->window = calloc((size_t)w, sizeof *s->window);
    s->seen = calloc((size_t)w, sizeof *s->seen);
    s->counts = calloc((size_t)w, sizeof *s->counts);
    s->cand = tern_calloc((size_t)n_vocab, sizeof *s->cand);
    s->tmp = tern_calloc((size_t)n_vocab, sizeof *s->tmp);
    s->pre = tern_calloc((size_t)n_vocab, sizeof *s->pre);
    s->where = tern_calloc((size_t)n_vocab, sizeof *s->where);
    s->top = malloc(((size_t)(p->top_k > 0 ? (p->top_k < n_vocab ? p->top_k : n_vocab) : 0) + 33) * sizeof *s->top);
    if (!s->window || !s->seen || !s->counts || !s->cand || !s->tmp || !s->pre || !s->where || !s->top) goto oom;
    sampler_reset(s);
    return s;
oom:
    sampler_free(s);
    tern_err(err, TERN_ENOMEM, "sampler: out of memory for %d candidates", n_vocab);
    return NULL;
}

sampler_t *sampler_create(const tern_sampler_params_t *p, int32_t n_vocab, tern_error_t *err) {
    static const tern_sampler_stage_t full[] = {TERN_STAGE_MASK,  TERN_STAGE_LOGIT_BIAS, TERN_STAGE_PENALTIES,
                                                TERN_STAGE_TOP_K, TERN_STAGE_TOP_P,      TERN_STAGE_MIN_P,
                                                TERN_STAGE_TEMP,  TERN_STAGE_DIST};
    static const tern_sampler_stage_t greedy[] = {TERN_STAGE_MASK, TERN_STAGE_LOGIT_BIAS, TERN_STAGE_PENALTIES,
                                                  TERN_STAGE_GREEDY};
    if (!p) {
        tern_err(err, TERN_EINVAL, "sampler: bad arguments (no parameters)");
        return NULL;
    }
    if (p->temp > 0) return sampler_create_chain(p, full, (int)(sizeof full / sizeof *full), n_vocab, err);
    return sampler_create_chain(p, greedy, (int)(sizeof greedy / sizeof *greedy), n_vocab, err);
}

void sampler_free(sampler_t *s) {
    if (!s) return;
    free(s->window);
    free(s->seen);
    free(s->counts);
    free(s->bias);
    tern_free(s->cand);
    tern_free(s->tmp);
    tern_free(s->pre);
    tern_free(s->where);
    free(s->top);
    free(s);
}

int sampler_chain(const sampler_t *s, tern_sampler_stage_t *out, int cap) {
    for (int i = 0; i < s->n_stages && i < cap; i++) out[i] = s->stages[i].kind;
    return s->n_stages;
}

void sampler_set_matcher(sampler_t *s, gmatcher_t *m) { s->matcher = m; }

void sampler_set_mask(sampler_t *s, tern_mask_fn fn, void *user) {
    s->mask_fn = fn;
    s->mask_user = fn ? user : NULL;
}

int sampler_set_logit_bias(sampler_t *s, const tern_logit_bias_t *bias, size_t n, tern_error_t *err) {
    if (n && !bias) return tern_err(err, TERN_EINVAL, "sampler: NULL logit bias list of %zu entries", n);
    bool bans = false;
    for (size_t i = 0; i < n; i++) {
        if (bias[i].token < 0 || bias[i].token >= s->n_vocab)
            return tern_err(err, TERN_EINVAL, "sampler: logit bias %zu: token %d out of range [0, %d)", i,
                            bias[i].token, s->n_vocab);
        if (!(bias[i].bias < INFINITY)) /* +INFINITY or NaN */
            return tern_err(err, TERN_EINVAL, "sampler: logit bias %zu (token %d): bias must be finite or -INFINITY",
                            i, bias[i].token);
        if (bias[i].bias == -INFINITY) bans = true;
    }
    tern_logit_bias_t *copy = NULL;
    if (n) {
        copy = n <= SIZE_MAX / sizeof *bias ? malloc(n * sizeof *bias) : NULL;
        if (!copy) return tern_err(err, TERN_ENOMEM, "sampler: out of memory for %zu logit biases", n);
        memcpy(copy, bias, n * sizeof *bias);
    }
    free(s->bias);
    s->bias = copy;
    s->n_bias = n;
    s->bias_bans = bans;
    return 0;
}

void sampler_reset(sampler_t *s) {
    s->rng = s->p.seed;
    s->n_window = 0;
    s->window_head = 0;
}

void sampler_accept(sampler_t *s, int32_t id) {
    if (s->cap <= 0 || id < 0 || id >= s->n_vocab) return;
    s->window[s->window_head] = id;
    s->window_head = (s->window_head + 1) % s->cap;
    if (s->n_window < s->cap) s->n_window++;
}

/* ---- sampling ---------------------------------------------------------------- */

/* Whether stage st can change a logit now (MASK, LOGIT_BIAS, PENALTIES);
 * truncations and TEMP never change which candidate is the best. */
static bool changes_logits(const sampler_t *s, const stage_t *st) {
    switch (st->kind) {
    case TERN_STAGE_MASK: return s->mask_fn != NULL || s->matcher != NULL;
    case TERN_STAGE_LOGIT_BIAS: return s->n_bias > 0;
    case TERN_STAGE_PENALTIES: return penalties_on(s);
    default: return false;
    }
}

/* Whether st, before a TOP_K, leaves the candidate set as it is: MASK,
 * LOGIT_BIAS or PENALTIES with nothing to do now (each returns at once),
 * or TEMP (which only sets the set's temperature). */
static bool pass_through(const sampler_t *s, const stage_t *st) {
    switch (st->kind) {
    case TERN_STAGE_TEMP: return true;
    case TERN_STAGE_MASK:
    case TERN_STAGE_LOGIT_BIAS:
    case TERN_STAGE_PENALTIES: return !changes_logits(s, st);
    default: return false;
    }
}

/* A grammar's MASK stage without a whole mask when it can be skipped
 * exactly. In a chain that starts MASK, [LOGIT_BIAS], [PENALTIES], then
 * GREEDY or TOP_K (k > 0), the masked chain keeps the best one (or k)
 * candidates the grammar allows, in cand_before order; bias and penalties
 * commute with the mask (a banned logit stays -INFINITY through them). So:
 * apply bias and penalties, take the best k + 32 candidates, and ask the
 * matcher about them one by one in order; when k of them are allowed (or
 * every candidate was asked) those are exactly what the full mask would
 * have left. Otherwise compute the whole mask, as the plain stage does.
 * Returns 1 (cs->chosen set: greedy), 0 (continue the chain at *next),
 * -1 (no candidate). */
static int grammar_first(sampler_t *s, cset_t *cs, int *next) {
    int j = 1;
    while (j < s->n_stages &&
           (s->stages[j].kind == TERN_STAGE_LOGIT_BIAS || s->stages[j].kind == TERN_STAGE_PENALTIES))
        j++;
    const stage_t *K = &s->stages[j];
    if (!(K->kind == TERN_STAGE_GREEDY || (K->kind == TERN_STAGE_TOP_K && K->k > 0))) return 0;
    if (s->mask_fn) { /* the application's mask first, exactly as st_mask */
        if (s->mask_fn(s->mask_user, cs->c, cs->n)) return -1;
        cs->sorted = false;
    }
    if (cset_drop_banned(cs)) return -1;
    for (int i = 1; i < j; i++)
        if (s->stages[i].apply(s, &s->stages[i], cs)) return -1;
    const int32_t want = K->kind == TERN_STAGE_GREEDY ? 1 : K->k < s->n_vocab ? K->k : s->n_vocab;
    const int32_t T = want + 32;
    /* the best T by a bounded min-heap, then sorted best first; banned
     * (-INFINITY, NaN) candidates never enter */
    cand_t *h = s->top;
    int32_t nh = 0;
    for (int32_t i = 0; i < cs->n; i++) {
        const cand_t c = cs->c[i];
        if (!(c.logit > -INFINITY)) continue;
        if (nh < T) {
            h[nh++] = c;
            if (nh == T)
                for (int32_t q = T / 2 - 1; q >= 0; q--) heap_down(h, T, q);
        } else if (cand_before(&c, &h[0])) {
            h[0] = c;
            heap_down(h, T, 0);
        }
    }
    qsort(h, (size_t)nh, sizeof *h, cand_cmp);
    int32_t got = 0;
    for (int32_t i = 0; i < nh && got < want; i++)
        if (gmatcher_allows(s->matcher, h[i].id)) h[got++] = h[i];
    if (got < want && nh == T) { /* not decided by the best T: the whole mask */
        const uint64_t *bits = gmatcher_mask(s->matcher);
        if (!bits) return -1;
        for (int32_t i = 0; i < cs->n; i++) {
            uint32_t id = (uint32_t)cs->c[i].id;
            if (!(bits[id >> 6] >> (id & 63) & 1)) cs->c[i].logit = -INFINITY;
        }
        if (cset_drop_banned(cs)) return -1;
        *next = j;
        return 0;
    }
    if (!got) return -1;
    memcpy(cs->c, h, (size_t)got * sizeof *h);
    cs->n = got;
    cs->dense = false;
    cs->sorted = true;
    if (K->kind == TERN_STAGE_GREEDY) {
        cs->chosen = cs->c[0].id;
        return 1;
    }
    *next = j + 1; /* TOP_K is done */
    return 0;
}

int32_t sampler_sample(sampler_t *s, const float *logits) {
    const int32_t V = s->n_vocab;
    if (s->stages[s->n_stages - 1].kind == TERN_STAGE_GREEDY) {
        bool plain = true;
        for (int i = 0; i < s->n_stages - 1 && plain; i++) plain = !changes_logits(s, &s->stages[i]);
        if (plain) return argmax_f32(logits, V); /* greedy on the caller's logits: first maximum */
    }
    cset_t cs = {s->cand, V, true, false, 1.0f, -1};
    /* A chain whose stages before its first TOP_K (0 < k < V) leave every
     * logit as it is (MASK, LOGIT_BIAS, PENALTIES with nothing to do now;
     * TEMP, which only sets the set's temperature) takes top-k straight
     * from the caller's logits: the same k candidates in the same order as
     * top-k on the copied set, without copying the vocabulary. */
    int first = 0;
    while (first < s->n_stages && pass_through(s, &s->stages[first])) first++;
    if (first < s->n_stages && s->stages[first].kind == TERN_STAGE_TOP_K && s->stages[first].k > 0 &&
        s->stages[first].k < V) {
        for (int j = 0; j < first; j++)
            if (s->stages[j].kind == TERN_STAGE_TEMP) st_temp(s, &s->stages[j], &cs);
        topk_dense(logits, V, s->stages[first].k, cs.c);
        cs.n = s->stages[first].k;
        cs.dense = false;
        cset_sort(s, &cs);
        for (int j = first + 1; j < s->n_stages; j++)
            if (s->stages[j].apply(s, &s->stages[j], &cs)) return -1;
        return cs.chosen;
    }
    for (int32_t i = 0; i < V; i++) {
        cs.c[i].id = i;
        cs.c[i].logit = logits[i];
    }
    int i = 0;
    if (s->matcher && s->stages[0].kind == TERN_STAGE_MASK) {
        int r = grammar_first(s, &cs, &i);
        if (r < 0) return -1;
        if (r == 1) return cs.chosen;
    }
    for (; i < s->n_stages; i++)
        if (s->stages[i].apply(s, &s->stages[i], &cs)) return -1;
    return cs.chosen;
}

/* ---- the state blob ---------------------------------------------------------- */

static const unsigned char state_magic[4] = {'T', 'S', 'M', 'P'};
#define STATE_VERSION 1u

size_t sampler_state_size(const sampler_t *s) {
    return TERN_SAMPLER_STATE_HEADER + 4 * (size_t)(s->cap > 0 ? s->cap : 0);
}

size_t sampler_state_save(const sampler_t *s, void *buf, size_t cap) {
    const size_t need = TERN_SAMPLER_STATE_HEADER + 4 * (size_t)s->n_window;
    if (!buf || cap < need) return 0;
    unsigned char *b = buf;
    memcpy(b, state_magic, 4);
    le_put_u32(b + 4, STATE_VERSION);
    le_put_u32(b + 8, (uint32_t)s->n_vocab);
    le_put_u32(b + 12, (uint32_t)(s->cap > 0 ? s->cap : 0));
    le_put_u64(b + 16, s->rng);
    le_put_u32(b + 24, (uint32_t)s->n_window);
    /* Oldest first: the ring starts at head once it is full. */
    const int32_t start = s->n_window == s->cap ? s->window_head : 0;
    for (int32_t i = 0; i < s->n_window; i++)
        le_put_u32(b + TERN_SAMPLER_STATE_HEADER + 4 * (size_t)i, (uint32_t)s->window[(start + i) % s->cap]);
    return need;
}

int sampler_state_load(sampler_t *s, const void *buf, size_t len, tern_error_t *err) {
    const unsigned char *b = buf;
    if (!buf || len < TERN_SAMPLER_STATE_HEADER)
        return tern_err(err, TERN_EFORMAT, "sampler state: %zu bytes, shorter than the %d-byte header", buf ? len : 0,
                        TERN_SAMPLER_STATE_HEADER);
    if (memcmp(b, state_magic, 4) != 0) return tern_err(err, TERN_EFORMAT, "sampler state: bad magic (not TSMP)");
    uint32_t ver = le_get_u32(b + 4), nv = le_get_u32(b + 8), wcap = le_get_u32(b + 12), n = le_get_u32(b + 24);
    if (ver != STATE_VERSION)
        return tern_err(err, TERN_EUNSUP, "sampler state: version %u, this tern reads %u", ver, STATE_VERSION);
    if (nv != (uint32_t)s->n_vocab)
        return tern_err(err, TERN_EINVAL, "sampler state: saved for a vocabulary of %u tokens, this sampler has %d", nv,
                        s->n_vocab);
    if (wcap > (1u << 20) || n > wcap)
        return tern_err(err, TERN_EFORMAT, "sampler state: window of %u ids in a capacity of %u", n, wcap);
    if (n > (uint32_t)(s->cap > 0 ? s->cap : 0))
        return tern_err(err, TERN_EINVAL, "sampler state: window of %u ids, this sampler keeps %d (repeat_last_n)", n,
                        s->cap > 0 ? s->cap : 0);
    if (len != TERN_SAMPLER_STATE_HEADER + 4 * (size_t)n)
        return tern_err(err, TERN_EFORMAT, "sampler state: %zu bytes, a window of %u ids takes %zu", len, n,
                        TERN_SAMPLER_STATE_HEADER + 4 * (size_t)n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = le_get_u32(b + TERN_SAMPLER_STATE_HEADER + 4 * (size_t)i);
        if (id >= nv) return tern_err(err, TERN_EFORMAT, "sampler state: window id %u (entry %u) out of range", id, i);
    }
    /* Valid: now change the sampler. The window order (oldest first) does
     * not change what the penalties do: each distinct id is penalized once
     * with its count. */
    s->rng = le_get_u64(b + 16);
    for (uint32_t i = 0; i < n; i++) s->window[i] = (int32_t)le_get_u32(b + TERN_SAMPLER_STATE_HEADER + 4 * (size_t)i);
    s->n_window = (int32_t)n;
    s->window_head = s->cap > 0 ? (int32_t)(n % (uint32_t)s->cap) : 0;
    return 0;
}
