/* cmd_bench_spec.c - `tern bench spec`: what speculative decoding costs and
 * what it gains, in one run.
 *
 * Part 1, the cost of a verify pass (models of -m): after a prompt of
 * --depth positions, a pass of k + 1 positions with the logits of all of
 * them (what tern_generate_spec evaluates for k drafts) against a plain
 * step of one position, k = 0 .. --k-max, each timed -r times (the order of
 * k rotated between repetitions, one untimed round first), the median
 * taken. ratio = median(k) / median(0); break-even is the acceptance a at
 * which k drafts pay for themselves: 1 + a + ... + a^k = ratio (tern.h's
 * model of the controller; "-" when even a = 1 does not pay).
 *
 * Part 2, workloads on trained models (--trained, default stories260K and
 * aidreams260K from ../shared/models or $TERN_SHARED/models): a story is
 * generated plainly first (greedy, from "Once upon a time"); then
 *   retell  the story, a newline, its first half; continue (a copy source
 *           in the prompt),
 *   edit    the story, a newline, its first half with one word replaced;
 *           continue (a copy with a change in it),
 *   prose   a short prompt with nothing to copy; continue.
 * Each is generated plainly and speculatively (adaptive, and fixed at
 * --draft-max) in the same run, -r times; within a repetition a short
 * generation is run several times (at least ~50 ms of each kind), plain
 * and speculative interleaved one by one, the first alternating, so both
 * see the same moments of a machine whose speed drifts; the rates are
 * generated tokens over the wall time of the call minus its prompt
 * evaluation (sampling and drafting included); x is the median over the
 * repetitions of each repetition's speculative rate / plain rate;
 * "same" says whether every speculative run gave the plain run's tokens
 * (it must). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmds.h"
#include "tern.h"

#define LIST_MAX 8

typedef struct {
    const char *models[LIST_MAX];
    int n_models;
    const char *trained[LIST_MAX];
    int n_trained;
    int threads[LIST_MAX];
    int n_threads;
    int reps, k_max, depth, n_gen, draft_max;
    float temp;
    int do_cost, do_work;
} sb_opts_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: tern bench spec [-m FILE[,FILE...]] [options]\n"
            "  -m, --model LIST       models for the verify-cost table (e.g. tern mkmodel shapes)\n"
            "  --trained LIST         trained models for the workloads (default: stories260K and\n"
            "                         aidreams260K under $TERN_SHARED/models or ../shared/models)\n"
            "  --part cost|work|all   which tables (default all; cost needs -m)\n"
            "  -t, --threads LIST     thread counts (default 1)\n"
            "  -r, --repetitions N    timed repetitions, medians (default 5)\n"
            "  --k-max N              cost table: drafts 0..N (default 8)\n"
            "  --depth N              cost table: positions already in the cache (default 128)\n"
            "  -n, --n-gen N          workloads: tokens generated (default 128; at most a quarter\n"
            "                         of the model's context)\n"
            "  --draft-max N          workloads: the fixed rows' drafts per pass, and the adaptive\n"
            "                         rows' most (default 8)\n"
            "  --temp F               workloads: sampling temperature (default 0, greedy)\n"
            "Part 1: ms of a pass of k+1 positions with all their logits, its ratio to one position,\n"
            "and the acceptance at which k drafts break even. Part 2: plain vs speculative t/s on\n"
            "copy-heavy and plain continuations, acceptance, tokens per pass.\n");
}

static int parse_int(const char *s, int lo, int hi, const char *flag, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tern bench spec: %s wants an integer in [%d, %d], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Split a comma list in place (s is an argv string we own for the run). */
static int split(char *s, const char **out, int cap, const char *flag) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (n == cap) {
            fprintf(stderr, "tern bench spec: %s takes at most %d items\n", flag, cap);
            return -1;
        }
        out[n++] = tok;
    }
    return n;
}

static int parse(sb_opts_t *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->reps = 5;
    o->k_max = 8;
    o->depth = 128;
    o->n_gen = 128;
    o->draft_max = 8;
    o->do_cost = o->do_work = 1;
    const char *part = "all";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!v) {
            fprintf(stderr, "tern bench spec: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if ((o->n_models = split(argv[i], o->models, LIST_MAX, a)) < 0) return 2;
        } else if (!strcmp(a, "--trained")) {
            if ((o->n_trained = split(argv[i], o->trained, LIST_MAX, a)) < 0) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            const char *t[LIST_MAX];
            int n = split(argv[i], t, LIST_MAX, a);
            if (n < 0) return 2;
            for (int j = 0; j < n; j++)
                if (parse_int(t[j], 1, 1024, a, &o->threads[j])) return 2;
            o->n_threads = n;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            if (parse_int(v, 1, 1000, a, &o->reps)) return 2;
        } else if (!strcmp(a, "--k-max")) {
            if (parse_int(v, 1, TERN_SPEC_DRAFT_MAX, a, &o->k_max)) return 2;
        } else if (!strcmp(a, "--depth")) {
            if (parse_int(v, 1, 1 << 20, a, &o->depth)) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            if (parse_int(v, 1, 1 << 16, a, &o->n_gen)) return 2;
        } else if (!strcmp(a, "--draft-max")) {
            if (parse_int(v, 1, TERN_SPEC_DRAFT_MAX, a, &o->draft_max)) return 2;
        } else if (!strcmp(a, "--temp")) {
            char *end;
            o->temp = strtof(v, &end);
            if (end == v || *end || !(o->temp >= 0)) {
                fprintf(stderr, "tern bench spec: --temp wants a number >= 0, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--part")) {
            part = v;
        } else {
            fprintf(stderr, "tern bench spec: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!strcmp(part, "cost")) o->do_work = 0;
    else if (!strcmp(part, "work")) o->do_cost = 0;
    else if (strcmp(part, "all")) {
        fprintf(stderr, "tern bench spec: --part wants cost, work or all, got '%s'\n", part);
        return 2;
    }
    if (!o->n_threads) o->threads[o->n_threads++] = 1;
    if (o->do_cost && !o->n_models && !o->do_work) {
        fprintf(stderr, "tern bench spec: the cost table needs -m FILE\n");
        return 2;
    }
    if (o->do_work && !o->n_trained) {
        static char paths[2][1024];
        const char *env = getenv("TERN_SHARED");
        const char *dir = env && *env ? env : "../shared";
        const char *names[] = {"stories260K.gguf", "aidreams260K.gguf"};
        for (int j = 0; j < 2; j++) {
            snprintf(paths[j], sizeof paths[j], "%s/models/%s", dir, names[j]);
            if (access(paths[j], R_OK) == 0) o->trained[o->n_trained++] = paths[j];
        }
        if (!o->n_trained) {
            fprintf(stderr, "tern bench spec: no trained model under %s/models (give --trained FILE)\n", dir);
            if (!o->n_models) return 2;
            o->do_work = 0;
        }
    }
    return 0;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static tern_context_t *open_ctx(const tern_model_t *m, int threads, int n_ctx) {
    tern_error_t err = {0};
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = threads;
    cp.n_ctx = n_ctx;
    tern_context_t *c = tern_context_create(m, &cp, &err);
    if (!c) fprintf(stderr, "tern bench spec: %s\n", err.msg);
    return c;
}

/* The acceptance a with 1 + a + ... + a^k = r (NAN: not reachable, r >= k + 1). */
static double break_even(int k, double r) {
    if (r <= 1) return 0;
    if (r >= k + 1) return NAN;
    double lo = 0, hi = 1;
    for (int it = 0; it < 60; it++) {
        const double a = 0.5 * (lo + hi);
        double e = 1, p = 1;
        for (int i = 0; i < k; i++) e += (p *= a);
        if (e < r) lo = a;
        else hi = a;
    }
    return 0.5 * (lo + hi);
}

/* ---- part 1 ---- */

static int cost_table(const sb_opts_t *o) {
    printf("## verify cost: k drafts = one pass of k+1 positions with all their logits, vs one position\n\n");
    printf("depth %d positions, median of %d repetitions (k order rotated), after one untimed round\n\n", o->depth,
           o->reps);
    printf("| model | threads | k | ms | ratio | break-even acceptance |\n|---|---:|---:|---:|---:|---:|\n");
    for (int mi = 0; mi < o->n_models; mi++) {
        tern_error_t err = {0};
        tern_model_t *m = tern_model_load(o->models[mi], &err);
        if (!m) {
            fprintf(stderr, "tern bench spec: %s\n", err.msg);
            return 1;
        }
        const int32_t V = tern_model_n_vocab(m);
        const int K = o->k_max;
        int32_t *ids = malloc((size_t)(o->depth + K + 1) * sizeof *ids);
        float *buf = malloc((size_t)(K + 1) * (size_t)V * sizeof *buf);
        double *t = malloc((size_t)(K + 1) * (size_t)o->reps * sizeof *t);
        if (!ids || !buf || !t) {
            fprintf(stderr, "tern bench spec: out of memory\n");
            return 1;
        }
        uint64_t s = 0x1234567ull + (uint64_t)mi;
        for (int i = 0; i < o->depth + K + 1; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            ids[i] = (int32_t)(s % (uint64_t)V);
        }
        for (int ti = 0; ti < o->n_threads; ti++) {
            tern_context_t *c = open_ctx(m, o->threads[ti], o->depth + K + 8);
            if (!c) return 1;
            if (tern_eval(c, ids, o->depth, NULL, &err)) {
                fprintf(stderr, "tern bench spec: %s\n", err.msg);
                return 1;
            }
            for (int r = -1; r < o->reps; r++) {
                for (int q = 0; q <= K; q++) {
                    const int k = (q + (r > 0 ? r : 0)) % (K + 1);
                    const double t0 = now_s();
                    if (tern_eval(c, ids + o->depth, k + 1, k ? buf : NULL, &err)) {
                        fprintf(stderr, "tern bench spec: %s\n", err.msg);
                        return 1;
                    }
                    const double dt = now_s() - t0;
                    if (tern_context_truncate(c, o->depth, &err)) return 1;
                    if (r >= 0) t[k * o->reps + r] = dt;
                }
            }
            const double base = median(t, o->reps);
            for (int k = 0; k <= K; k++) {
                const double ms = 1e3 * (k ? median(t + k * o->reps, o->reps) : base);
                const double ratio = ms / (1e3 * base);
                const double be = break_even(k, ratio);
                printf("| %s | %d | %d | %.3f | %.2f | ", base_name(o->models[mi]), o->threads[ti], k, ms, ratio);
                if (k == 0) printf("- |\n");
                else if (isnan(be)) printf("never |\n");
                else printf("%.2f |\n", be);
            }
            fflush(stdout);
            tern_context_free(c);
        }
        free(ids);
        free(buf);
        free(t);
        tern_model_free(m);
    }
    printf("\n");
    return 0;
}

/* ---- part 2 ---- */

typedef struct {
    int32_t *ids;
    int n, cap;
    char *text;
    size_t len, tcap;
} collect_t;

static int on_token(int32_t id, const char *text, size_t len, void *user) {
    collect_t *c = user;
    if (id >= 0) {
        if (c->n == c->cap) {
            int nc = c->cap ? 2 * c->cap : 256;
            int32_t *p = realloc(c->ids, (size_t)nc * sizeof *p);
            if (!p) return 1;
            c->ids = p;
            c->cap = nc;
        }
        c->ids[c->n++] = id;
    }
    if (text && len) {
        if (c->len + len + 1 > c->tcap) {
            size_t nc = c->tcap ? 2 * c->tcap : 4096;
            while (nc < c->len + len + 1) nc *= 2;
            char *p = realloc(c->text, nc);
            if (!p) return 1;
            c->text = p;
            c->tcap = nc;
        }
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    return 0;
}

static void collect_free(collect_t *c) {
    free(c->ids);
    free(c->text);
    memset(c, 0, sizeof *c);
}

typedef struct {
    double secs;
    tern_spec_stats_t st;
    int rc;
} gen_run_t;

/* One generation from a fresh context; spec NULL: plain. */
static int gen_once(const tern_model_t *m, int threads, int n_ctx, const char *prompt, int n_gen, float temp,
                    const tern_spec_params_t *spec, collect_t *out, gen_run_t *g) {
    tern_error_t err = {0};
    tern_context_t *c = open_ctx(m, threads, n_ctx);
    if (!c) return -1;
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.temp = temp;
    tern_sampler_t *s = tern_sampler_create(m, &sp, &err);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = -1;
    if (!s || tern_tokenize(m, prompt, strlen(prompt), tern_model_add_bos(m), 0, &ids, &n, &err)) goto out;
    tern_generate_result_t res;
    memset(g, 0, sizeof *g);
    const double t0 = now_s();
    g->rc = spec ? tern_generate_spec(c, s, ids, (int32_t)n, n_gen, spec, on_token, out, &res, &g->st, &err)
                 : tern_generate(c, s, ids, (int32_t)n, n_gen, on_token, out, &res, &err);
    const double wall = now_s() - t0;
    tern_timings_t t;
    tern_context_timings(c, &t);
    g->secs = wall - (double)t.prompt_ns / 1e9;
    if (!spec) g->st.n_generated = res.n_generated;
    rc = g->rc;
out:
    if (rc) fprintf(stderr, "tern bench spec: %s\n", err.msg[0] ? err.msg : "generation failed");
    free(ids);
    tern_sampler_free(s);
    tern_context_free(c);
    return rc;
}

/* Up to about `frac` of text's bytes, cut after a space. */
static size_t cut_at_word(const char *text, size_t len, double frac) {
    size_t k = (size_t)((double)len * frac);
    while (k > 0 && text[k - 1] != ' ') k--;
    return k ? k : len / 2;
}

/* text[0..n) with its fourth word of three letters or more replaced by w. */
static char *with_edit(const char *text, size_t n, const char *w) {
    size_t at = 0, wl = 0;
    int seen = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && text[i] == ' ') i++;
        size_t j = i;
        while (j < n && text[j] != ' ') j++;
        if (j - i >= 3 && ++seen == 4) {
            at = i;
            wl = j - i;
            break;
        }
        i = j;
    }
    char *out = malloc(n + strlen(w) + 1);
    if (!out) return NULL;
    if (!wl) {
        memcpy(out, text, n);
        out[n] = 0;
        return out;
    }
    memcpy(out, text, at);
    strcpy(out + at, w);
    memcpy(out + at + strlen(w), text + at + wl, n - at - wl);
    out[n - wl + strlen(w)] = 0;
    return out;
}

static int work_table(const sb_opts_t *o) {
    printf("## workloads: plain vs speculative decoding (prompt lookup), same run\n\n");
    printf("%s, %d repetitions, medians; in each, plain and speculative generations interleaved one by one (at "
           "least ~50 ms of each); t/s = generated tokens / (call wall time - prompt evaluation); x = the median over "
           "the repetitions of each one's spec t/s / plain t/s\n\n",
           o->temp > 0 ? "sampled" : "greedy", o->reps);
    printf("| model | threads | workload | prompt | gen | mode | plain t/s | spec t/s | x | drafted | accepted "
           "| tok/pass | same |\n|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (int mi = 0; mi < o->n_trained; mi++) {
        tern_error_t err = {0};
        tern_model_t *m = tern_model_load(o->trained[mi], &err);
        if (!m) {
            fprintf(stderr, "tern bench spec: %s\n", err.msg);
            return 1;
        }
        /* The model's context, at most 1024: enough for the prompts below. */
        const int n_ctx = tern_model_n_ctx_train(m) > 0 && tern_model_n_ctx_train(m) < 1024 ? tern_model_n_ctx_train(m) : 1024;
        int n_gen = o->n_gen < n_ctx / 4 ? o->n_gen : n_ctx / 4;
        /* The story: at most 1/4 of the context and 128 tokens, so that
         * story + half + the continuation fit. */
        collect_t story = {0};
        gen_run_t g;
        if (gen_once(m, o->threads[0], n_ctx, "Once upon a time", n_ctx / 4 < 128 ? n_ctx / 4 : 128, 0, NULL, &story,
                     &g) ||
            !story.text) {
            collect_free(&story);
            tern_model_free(m);
            fprintf(stderr, "tern bench spec: %s: no story\n", o->trained[mi]);
            return 1;
        }
        char *full = malloc(strlen("Once upon a time") + story.len + 2);
        sprintf(full, "Once upon a time%s", story.text);
        const size_t half = cut_at_word(full, strlen(full), 0.5);
        char *p_retell = malloc(2 * strlen(full) + 4);
        sprintf(p_retell, "%s\n%.*s", full, (int)half, full);
        char *edited = with_edit(full, half, "happy");
        char *p_edit = malloc(strlen(full) + strlen(edited) + 4);
        sprintf(p_edit, "%s\n%s", full, edited);
        const char *p_prose = "One day, a little bird";
        const struct {
            const char *name, *prompt;
        } wl[] = {{"retell", p_retell}, {"edit", p_edit}, {"prose", p_prose}};
        for (int ti = 0; ti < o->n_threads; ti++) {
            for (size_t w = 0; w < sizeof wl / sizeof wl[0]; w++) {
                int32_t np = 0;
                {
                    int32_t *ids = NULL;
                    size_t n = 0;
                    if (tern_tokenize(m, wl[w].prompt, strlen(wl[w].prompt), tern_model_add_bos(m), 0, &ids, &n,
                                      &err) == 0)
                        np = (int32_t)n;
                    free(ids);
                }
                int gen_w = n_gen;
                if (np + gen_w + 1 > n_ctx) gen_w = n_ctx - np - 1;
                if (gen_w < 8) continue;
                for (int mode = 0; mode < 2; mode++) {
                    tern_spec_params_t sp = tern_spec_default_params();
                    sp.n_draft_max = o->draft_max;
                    sp.adaptive = mode == 0;
                    double *tp = calloc((size_t)o->reps, sizeof *tp), *ts = calloc((size_t)o->reps, sizeof *ts),
                           *rr = calloc((size_t)o->reps, sizeof *rr);
                    tern_spec_stats_t sum = {0};
                    int same = 1, fail = !tp || !ts || !rr;
                    /* A short generation is timed as `inner` generations in a
                     * row, at least ~50 ms (an untimed plain run says how
                     * long one takes). */
                    int inner = 1;
                    {
                        collect_t a = {0};
                        gen_run_t ga;
                        fail |= gen_once(m, o->threads[ti], n_ctx, wl[w].prompt, gen_w, o->temp, NULL, &a, &ga);
                        if (!fail && ga.secs > 0 && ga.secs < 0.05) inner = (int)(0.05 / ga.secs) + 1;
                        if (inner > 1000) inner = 1000;
                        collect_free(&a);
                    }
                    for (int r = 0; r < o->reps && !fail; r++) {
                        double sec[2] = {0, 0}, tok[2] = {0, 0};
                        /* plain and speculative generations interleaved one
                         * by one (the first alternating), so both see the same
                         * moments of a machine whose speed drifts */
                        for (int q = 0; q < inner && !fail; q++) {
                            for (int h = 0; h < 2 && !fail; h++) {
                                const int is_spec = (h + r + q) % 2;
                                collect_t a = {0}, b = {0};
                                gen_run_t ga, gb;
                                if (is_spec) {
                                    fail |= gen_once(m, o->threads[ti], n_ctx, wl[w].prompt, gen_w, o->temp, &sp, &b,
                                                     &gb);
                                    if (!fail && q == 0) {
                                        /* the plain tokens of this repetition, untimed */
                                        fail |= gen_once(m, o->threads[ti], n_ctx, wl[w].prompt, gen_w, o->temp, NULL,
                                                         &a, &ga);
                                        same &= a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * sizeof *a.ids);
                                    }
                                    sec[1] += gb.secs;
                                    tok[1] += (double)gb.st.n_generated;
                                    sum.n_drafted += gb.st.n_drafted;
                                    sum.n_accepted += gb.st.n_accepted;
                                    sum.n_passes += gb.st.n_passes;
                                    sum.n_generated += gb.st.n_generated;
                                } else {
                                    fail |= gen_once(m, o->threads[ti], n_ctx, wl[w].prompt, gen_w, o->temp, NULL, &a,
                                                     &ga);
                                    sec[0] += ga.secs;
                                    tok[0] += (double)ga.st.n_generated;
                                }
                                collect_free(&a);
                                collect_free(&b);
                            }
                        }
                        if (!fail) {
                            tp[r] = tok[0] / sec[0];
                            ts[r] = tok[1] / sec[1];
                            rr[r] = ts[r] / tp[r];
                        }
                    }
                    if (!fail) {
                        const double mp = median(tp, o->reps), ms = median(ts, o->reps), mr = median(rr, o->reps);
                        printf("| %s | %d | %s | %d | %d | %s | %.0f | %.0f | %.2f | %lld | %.1f%% | %.2f | %s |\n",
                               base_name(o->trained[mi]), o->threads[ti], wl[w].name, np, gen_w,
                               mode == 0 ? "adaptive" : "fixed", mp, ms, mr, (long long)(sum.n_drafted / o->reps / inner),
                               sum.n_drafted ? 100.0 * (double)sum.n_accepted / (double)sum.n_drafted : 0.0,
                               sum.n_passes ? (double)sum.n_generated / (double)sum.n_passes : 0.0,
                               same ? "yes" : "NO");
                        fflush(stdout);
                    }
                    free(tp);
                    free(rr);
                    free(ts);
                    if (fail) return 1;
                }
            }
        }
        free(full);
        free(p_retell);
        free(edited);
        free(p_edit);
        collect_free(&story);
        tern_model_free(m);
    }
    printf("\n");
    return 0;
}

int cmd_bench_spec(int argc, char **argv) {
    sb_opts_t o;
    const int prc = parse(&o, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    printf("tern bench spec: ISA %s\n\n", tern_isa_name());
    if (o.do_cost && o.n_models && cost_table(&o)) return 1;
    if (o.do_work && work_table(&o)) return 1;
    return 0;
}
