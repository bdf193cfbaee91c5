/* cmd_bench.c - `tern bench -m FILE[,FILE...]`: llama-bench-like speed
 * table of prompt processing (ppN: N tokens in one evaluation, blocks of -b
 * through GEMM) and generation (tgN: N tokens one at a time from an empty
 * cache), mean +- sd tokens/s over -r repetitions after one warm-up.
 *
 * In the same run it measures the machine's read bandwidth (bench/probe.h,
 * per thread count) and reports each generation row against its roofline:
 * the best possible decode rate is bandwidth / weight bytes read per token
 * (tern_model_bytes_per_token), and roofline_pct = 100 * tok_s / that.
 * On a shared machine the bandwidth left to us drifts by tens of percent
 * within seconds, so each generation repetition is also paired with one
 * probe pass taken just before it (over a buffer of --probe-mb, kept for
 * the purpose): roofline_pct_now is the median over the repetitions of the
 * repetition's weights GB/s against its own pass (as in `tern bench
 * kernels`).
 *
 * --check N additionally generates N greedy tokens at every thread count and
 * says whether they are identical (they must be: the kernels are
 * thread-count invariant).
 *
 * -np LIST (--parallel) replaces the pp/tg tests by aggregate decode rows:
 * for each N, N sequences each get a prompt of -p tokens (default 16 in
 * this mode; evaluated in one tern_decode call, untimed), then -n steps are
 * timed, each ONE tern_decode call of N entries (one token per sequence,
 * logits wanted, the argmax fed back). tok_s = N * steps / time (all
 * sequences together), tok_s_per_seq = that / N, and each row N > 1 is
 * compared with the N = 1 row of the same thread count, prompt and steps
 * (speedup). The weights are read once per step, so the weights GB/s and
 * roofline columns of these rows count steps, not tokens. The sequences
 * are removed before every repetition. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmds.h"
#include "probe.h"
#include "tern.h"

#define MAX_LIST 16
#define NP_PROMPT_DEFAULT 16 /* -np: each sequence's prompt when -p is not given */
#define NP_MAX 4096          /* -np: at most tern_context_params_t.n_seq_max's limit */

typedef struct {
    int v[MAX_LIST];
    int n;
} ilist_t;

typedef struct {
    const char *models[MAX_LIST];
    int n_models;
    ilist_t threads, pp, tg;
    ilist_t np; /* -np: sequences decoding together; n == 0: the pp/tg tests */
    int pp_set; /* -p was given */
    int reps, n_batch, kv_f32, check;
    const char *out; /* md, csv, json */
    double probe_mb;
    int profile;
} bench_opts_t;

typedef struct {
    char model[128], type[32];
    uint64_t size, params, bytes_per_token;
    int threads;
    char test[16];
    int is_tg;
    double tok_s, tok_s_sd;
    double probe_gbps, roofline_pct, weights_gbps;
    double probe_now_gbps, roofline_pct_now; /* paired passes (header); NAN: none */
    double dispatches_per_token; /* -np rows: per step (one tern_decode call) */
    int mi; /* model index */
    /* -np rows only (n_seq 0 otherwise): */
    int n_seq, n_prompt, n_steps;
    double tok_s_seq, tok_s_seq_sd; /* tok_s, tok_s_sd: all sequences together */
    double speedup;                 /* tok_s / that of the n_seq 1 row; NAN: no such row */
} row_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int parse_list(const char *s, ilist_t *l, int lo, const char *flag) {
    l->n = 0;
    char *dup = strdup(s), *save = NULL;
    if (!dup) return -1;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        errno = 0;
        long v = strtol(tok, &end, 10);
        if (errno || end == tok || *end || v < lo || v > (1 << 20) || l->n == MAX_LIST) {
            fprintf(stderr, "tern bench: %s: bad value '%s' (integers >= %d, at most %d)\n", flag, tok, lo, MAX_LIST);
            free(dup);
            return -1;
        }
        l->v[l->n++] = (int)v;
    }
    free(dup);
    if (l->n == 0) {
        fprintf(stderr, "tern bench: %s: empty list\n", flag);
        return -1;
    }
    return 0;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: tern bench -m FILE[,FILE...] [options]\n"
            "  -t, --threads LIST     thread counts (default: the default thread count)\n"
            "  -p, --n-prompt LIST    prompt lengths, 0 = none (default 512)\n"
            "  -n, --n-gen LIST       generation lengths, 0 = none (default 128)\n"
            "  -r, --repetitions N    repetitions per test after one warm-up (default 5)\n"
            "  -b, --batch-size N     prompt block size (default 512)\n"
            "  -o, --output FMT       md, csv or json (default md)\n"
            "  --kv-f32               F32 KV cache (default F16)\n"
            "  --probe-mb N           buffer of the bandwidth probe (default 1024)\n"
            "  --check N              N greedy tokens at every thread count, compared\n"
            "  --profile              per-op time split of the generation tests (stderr)\n"
            "  -np, --parallel LIST   sequences decoding together, e.g. 1,2,4,8,16: instead of the\n"
            "                         pp/tg tests, per N: N sequences each take a -p prompt\n"
            "                         (default %d here; untimed), then -n steps of one tern_decode\n"
            "                         call with N entries are timed; t/s of all sequences, per\n"
            "                         sequence, and the speedup over N = 1 (include 1 in LIST)\n",
            NP_PROMPT_DEFAULT);
}

static int parse_opts(bench_opts_t *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->reps = 5;
    o->n_batch = 512;
    o->out = "md";
    o->probe_mb = 1024;
    o->pp.n = o->tg.n = 1;
    o->pp.v[0] = 512;
    o->tg.v[0] = 128;
    o->threads.n = 1;
    o->threads.v[0] = tern_threads_default(NULL, 0);
    static char *model_arg; /* strtok'd in place: keeps the pointers valid */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(x) (!strcmp(a, x))
        if (IS("-h") || IS("--help")) {
            usage(stdout);
            return 1;
        }
        if (IS("--kv-f32")) {
            o->kv_f32 = 1;
            continue;
        }
        if (IS("--profile")) {
            o->profile = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "tern bench: unknown option or missing value: '%s' (see tern bench --help)\n", a);
            return 2;
        }
        i++;
        if (IS("-m") || IS("--model")) {
            free(model_arg);
            model_arg = strdup(v);
            if (!model_arg) return 2;
            char *save = NULL;
            o->n_models = 0;
            for (char *t = strtok_r(model_arg, ",", &save); t && o->n_models < MAX_LIST; t = strtok_r(NULL, ",", &save))
                o->models[o->n_models++] = t;
        } else if (IS("-t") || IS("--threads")) {
            if (parse_list(v, &o->threads, 1, a)) return 2;
        } else if (IS("-p") || IS("--n-prompt")) {
            if (parse_list(v, &o->pp, 0, a)) return 2;
            o->pp_set = 1;
        } else if (IS("-np") || IS("--parallel")) {
            if (parse_list(v, &o->np, 1, a)) return 2;
            for (int k = 0; k < o->np.n; k++)
                if (o->np.v[k] > NP_MAX) {
                    fprintf(stderr, "tern bench: %s: at most %d sequences\n", a, NP_MAX);
                    return 2;
                }
        } else if (IS("-n") || IS("--n-gen")) {
            if (parse_list(v, &o->tg, 0, a)) return 2;
        } else if (IS("-r") || IS("--repetitions")) {
            o->reps = atoi(v);
            if (o->reps < 1 || o->reps > 1000) {
                fprintf(stderr, "tern bench: -r wants 1..1000\n");
                return 2;
            }
        } else if (IS("-b") || IS("--batch-size")) {
            o->n_batch = atoi(v);
            if (o->n_batch < 1) {
                fprintf(stderr, "tern bench: -b wants a positive integer\n");
                return 2;
            }
        } else if (IS("-o") || IS("--output")) {
            if (strcmp(v, "md") && strcmp(v, "csv") && strcmp(v, "json")) {
                fprintf(stderr, "tern bench: -o wants md, csv or json\n");
                return 2;
            }
            o->out = v;
        } else if (IS("--probe-mb")) {
            o->probe_mb = atof(v);
            if (!(o->probe_mb >= 1 && o->probe_mb <= 65536)) {
                fprintf(stderr, "tern bench: --probe-mb wants 1..65536\n");
                return 2;
            }
        } else if (IS("--check")) {
            o->check = atoi(v);
            if (o->check < 0 || o->check > 4096) {
                fprintf(stderr, "tern bench: --check wants 0..4096\n");
                return 2;
            }
        } else {
            fprintf(stderr, "tern bench: unknown option '%s' (see tern bench --help)\n", a);
            return 2;
        }
#undef IS
    }
    if (o->n_models == 0) {
        fprintf(stderr, "tern bench: -m FILE[,FILE...] is required (tern bench pool / kernels are the micro-benchmarks)\n");
        return 2;
    }
    if (o->np.n && !o->pp_set) o->pp.v[0] = NP_PROMPT_DEFAULT;
    return 0;
}

static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    double v = 0;
    for (int i = 0; i < n; i++) v += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(v / (n - 1)) : 0;
}

/* Fixed pseudo-random prompt tokens (never BOS/EOS-dependent). */
static void fill_tokens(int32_t *ids, int n, int32_t n_vocab, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)(s % (uint64_t)n_vocab);
    }
}

/* One timed test: pp (n tokens in one eval) or tg (n evals of one token). */
static int run_test(tern_context_t *c, const int32_t *ids, int n, int is_tg, double *seconds, tern_error_t *err) {
    if (tern_context_truncate(c, 0, err)) return -1;
    double t0 = now_s();
    if (is_tg) {
        for (int i = 0; i < n; i++)
            if (tern_eval(c, ids + i, 1, NULL, err)) return -1;
    } else if (tern_eval(c, ids, n, NULL, err)) {
        return -1;
    }
    *seconds = now_s() - t0;
    return 0;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t v = 1; v < n; v++)
        if (x[v] > x[best]) best = v;
    return best;
}

/* The buffers of the -np tests. */
typedef struct {
    tern_batch_entry_t *e; /* np_max * max(pp_max, 1) entries */
    int32_t *tok;          /* np_max: each sequence's next token */
    int32_t *prompts;      /* sequence s's prompt at s * pp_stride */
    int pp_stride;
} np_buf_t;

static int np_remove(tern_context_t *c, int n_seq, tern_error_t *err) {
    for (int s = 0; s < n_seq; s++)
        if (tern_seq_remove(c, s, err)) return -1;
    return 0;
}

/* One -np repetition: sequences 0 .. n_seq-1 each take their prompt of
 * n_prompt tokens (one tern_decode call, untimed), then n_steps tern_decode
 * calls of n_seq entries (one token per sequence, logits wanted, the argmax
 * fed back) are timed; *dispatches: the pool runs of those calls. The
 * sequences are removed before and after. */
static int run_parallel(tern_context_t *c, np_buf_t *b, int n_seq, int n_prompt, int n_steps, int32_t n_vocab,
                        double *seconds, uint64_t *dispatches, tern_error_t *err) {
    if (np_remove(c, n_seq, err)) return -1;
    if (n_prompt > 0) {
        int k = 0;
        for (int s = 0; s < n_seq; s++)
            for (int i = 0; i < n_prompt; i++)
                b->e[k++] = (tern_batch_entry_t){s, b->prompts[(size_t)s * b->pp_stride + i], TERN_POS_APPEND,
                                                 i == n_prompt - 1};
        if (tern_decode(c, b->e, k, err)) return -1;
        for (int s = 0; s < n_seq; s++) {
            const float *lg = tern_batch_logits(c, s * n_prompt + n_prompt - 1);
            if (!lg) {
                snprintf(err->msg, sizeof err->msg, "bench: no logits for the prompt of sequence %d", s);
                return -1;
            }
            b->tok[s] = argmax(lg, n_vocab);
        }
    } else {
        for (int s = 0; s < n_seq; s++) b->tok[s] = b->prompts[(size_t)s * b->pp_stride];
    }
    tern_timings_t t0, t1;
    tern_context_timings(c, &t0);
    const double w0 = now_s();
    for (int step = 0; step < n_steps; step++) {
        for (int s = 0; s < n_seq; s++) b->e[s] = (tern_batch_entry_t){s, b->tok[s], TERN_POS_APPEND, 1};
        if (tern_decode(c, b->e, n_seq, err)) return -1;
        for (int s = 0; s < n_seq; s++) {
            const float *lg = tern_batch_logits(c, s);
            if (!lg) {
                snprintf(err->msg, sizeof err->msg, "bench: no logits for entry %d of step %d", s, step);
                return -1;
            }
            b->tok[s] = argmax(lg, n_vocab);
        }
    }
    *seconds = now_s() - w0;
    tern_context_timings(c, &t1);
    *dispatches = t1.decode_dispatches - t0.decode_dispatches;
    return np_remove(c, n_seq, err);
}

/* A JSON string body: quotes, backslashes and control bytes escaped. */
static void json_str(const char *s) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
}

/* A JSON row's opening: model, type, size, params, threads, test (the
 * fields every row has), then ", " for the row's own. */
static void json_row_head(const row_t *r) {
    printf("  {\"model\": \"");
    json_str(r->model);
    printf("\", \"type\": \"");
    json_str(r->type);
    printf("\", \"size_bytes\": %llu, \"params\": %llu, \"threads\": %d, \"test\": \"%s\", ",
           (unsigned long long)r->size, (unsigned long long)r->params, r->threads, r->test);
}

static void print_header(const bench_opts_t *o, const double *probe, const ilist_t *th) {
    printf("read bandwidth (probe, %.0f MiB, same run; %% of probe now: against a pass before each repetition):",
           o->probe_mb);
    for (int i = 0; i < th->n; i++) printf(" %d thread%s %.1f GB/s%s", th->v[i], th->v[i] > 1 ? "s" : "", probe[i],
                                           i + 1 < th->n ? "," : "");
    printf("\nISA %s\n\n", tern_isa_name());
}

/* The -np rows (n_seq set in every row). */
static void print_np_rows(const bench_opts_t *o, const row_t *rows, int n, const double *probe, const ilist_t *th) {
    if (!strcmp(o->out, "json")) {
        printf("[\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            json_row_head(r);
            printf("\"n_seq\": %d, \"n_prompt\": %d, \"tok_s\": %.3f, \"tok_s_sd\": %.3f, \"tok_s_per_seq\": %.3f, "
                   "\"tok_s_per_seq_sd\": %.3f, ",
                   r->n_seq, r->n_prompt, r->tok_s, r->tok_s_sd, r->tok_s_seq, r->tok_s_seq_sd);
            if (isnan(r->speedup)) printf("\"speedup_vs_n_seq_1\": null");
            else printf("\"speedup_vs_n_seq_1\": %.3f", r->speedup);
            printf(", \"probe_gbps\": %.2f, \"weight_bytes_per_token\": %llu, \"weights_gbps\": %.2f, "
                   "\"roofline_pct\": %.1f, \"dispatches_per_step\": %.1f",
                   r->probe_gbps, (unsigned long long)r->bytes_per_token, r->weights_gbps, r->roofline_pct,
                   r->dispatches_per_token);
            if (!isnan(r->roofline_pct_now))
                printf(", \"probe_now_gbps\": %.2f, \"roofline_pct_now\": %.1f", r->probe_now_gbps, r->roofline_pct_now);
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("]\n");
        return;
    }
    if (!strcmp(o->out, "csv")) {
        printf("model,type,size_bytes,params,threads,n_seq,n_prompt,test,tok_s,tok_s_sd,tok_s_per_seq,tok_s_per_seq_sd,"
               "speedup_vs_n_seq_1,probe_gbps,weights_gbps,roofline_pct,dispatches_per_step,probe_now_gbps,"
               "roofline_pct_now\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            printf("%s,%s,%llu,%llu,%d,%d,%d,%s,%.3f,%.3f,%.3f,%.3f,", r->model, r->type, (unsigned long long)r->size,
                   (unsigned long long)r->params, r->threads, r->n_seq, r->n_prompt, r->test, r->tok_s, r->tok_s_sd,
                   r->tok_s_seq, r->tok_s_seq_sd);
            if (!isnan(r->speedup)) printf("%.3f", r->speedup);
            printf(",%.2f,%.2f,%.1f,%.1f,", r->probe_gbps, r->weights_gbps, r->roofline_pct, r->dispatches_per_token);
            if (isnan(r->roofline_pct_now)) printf(",\n");
            else printf("%.2f,%.1f\n", r->probe_now_gbps, r->roofline_pct_now);
        }
        return;
    }
    print_header(o, probe, th);
    printf("n_seq sequences decode together: each takes a prompt of `prompt` tokens (untimed), then every step of "
           "`test` is one tern_decode call with one token per sequence. t/s: all sequences together; vs 1 seq: that "
           "/ the n_seq 1 row's; weights GB/s and %% of roofline count steps (the weights are read once per step).\n\n");
    printf("| model | type | size | params | threads | n_seq | prompt | test | t/s | t/s per seq | vs 1 seq | "
           "weights GB/s | %% of roofline | %% of probe now | dispatches/step |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        printf("| %s | %s | %.1f MiB | %.1f M | %d | %d | %d | %s | %.2f ± %.2f | %.2f ± %.2f |", r->model, r->type,
               (double)r->size / 1048576.0, (double)r->params / 1e6, r->threads, r->n_seq, r->n_prompt, r->test,
               r->tok_s, r->tok_s_sd, r->tok_s_seq, r->tok_s_seq_sd);
        if (isnan(r->speedup)) printf(" - |");
        else printf(" %.2fx |", r->speedup);
        printf(" %.1f | %.1f%% |", r->weights_gbps, r->roofline_pct);
        if (isnan(r->roofline_pct_now)) printf(" - |");
        else printf(" %.1f%% |", r->roofline_pct_now);
        printf(" %.1f |\n", r->dispatches_per_token);
    }
}

static void print_rows(const bench_opts_t *o, const row_t *rows, int n, const double *probe, const ilist_t *th) {
    if (o->np.n) {
        print_np_rows(o, rows, n, probe, th);
        return;
    }
    if (!strcmp(o->out, "json")) {
        printf("[\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            json_row_head(r);
            printf("\"tok_s\": %.3f, \"tok_s_sd\": %.3f, \"probe_gbps\": %.2f", r->tok_s, r->tok_s_sd, r->probe_gbps);
            if (r->is_tg) {
                printf(", \"weight_bytes_per_token\": %llu, \"weights_gbps\": %.2f, \"roofline_pct\": %.1f, "
                       "\"dispatches_per_token\": %.1f",
                       (unsigned long long)r->bytes_per_token, r->weights_gbps, r->roofline_pct, r->dispatches_per_token);
                if (!isnan(r->roofline_pct_now))
                    printf(", \"probe_now_gbps\": %.2f, \"roofline_pct_now\": %.1f", r->probe_now_gbps,
                           r->roofline_pct_now);
            }
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("]\n");
        return;
    }
    if (!strcmp(o->out, "csv")) {
        printf("model,type,size_bytes,params,threads,test,tok_s,tok_s_sd,probe_gbps,weights_gbps,roofline_pct,"
               "dispatches_per_token,probe_now_gbps,roofline_pct_now\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            printf("%s,%s,%llu,%llu,%d,%s,%.3f,%.3f,%.2f,", r->model, r->type, (unsigned long long)r->size,
                   (unsigned long long)r->params, r->threads, r->test, r->tok_s, r->tok_s_sd, r->probe_gbps);
            if (r->is_tg) {
                printf("%.2f,%.1f,%.1f,", r->weights_gbps, r->roofline_pct, r->dispatches_per_token);
                if (isnan(r->roofline_pct_now)) printf(",\n");
                else printf("%.2f,%.1f\n", r->probe_now_gbps, r->roofline_pct_now);
            } else {
                printf(",,,,\n");
            }
        }
        return;
    }
    print_header(o, probe, th);
    printf("| model | type | size | params | threads | test | t/s | weights GB/s | %% of roofline | %% of probe now | "
           "dispatches/token |\n");
    printf("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        printf("| %s | %s | %.1f MiB | %.1f M | %d | %s | %.2f ± %.2f |", r->model, r->type,
               (double)r->size / 1048576.0, (double)r->params / 1e6, r->threads, r->test, r->tok_s, r->tok_s_sd);
        if (r->is_tg) {
            printf(" %.1f | %.1f%% |", r->weights_gbps, r->roofline_pct);
            if (isnan(r->roofline_pct_now)) printf(" - |");
            else printf(" %.1f%% |", r->roofline_pct_now);
            printf(" %.1f |\n", r->dispatches_per_token);
        } else {
            printf(" | | | |\n");
        }
    }
}

static const char *base_name(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

static void row_init(row_t *row, const char *path, int mi, const tern_model_t *m, const tern_context_t *c) {
    snprintf(row->model, sizeof row->model, "%s", base_name(path));
    snprintf(row->type, sizeof row->type, "%s", tern_model_type_name(m));
    row->mi = mi;
    row->size = tern_model_file_size(m);
    row->params = tern_model_n_params(m);
    row->bytes_per_token = tern_model_bytes_per_token(m);
    row->threads = tern_context_threads(c);
}

/* The -np row's speedup over the n_seq 1 row of the same model, thread
 * count, prompt and steps among rows[0 .. n-1]; NAN: none. */
static double np_speedup(const row_t *rows, int n, const row_t *r) {
    for (int i = 0; i < n; i++) {
        const row_t *b = &rows[i];
        if (b->n_seq == 1 && b->mi == r->mi && b->threads == r->threads && b->n_prompt == r->n_prompt &&
            b->n_steps == r->n_steps && b->tok_s > 0)
            return r->tok_s / b->tok_s;
    }
    return NAN;
}

/* The -np rows of one context: prompt lengths x steps x sequence counts. */
static int np_tests(const bench_opts_t *o, int mi, const tern_model_t *m, tern_context_t *c, double probe_gbps,
                    void *pbuf, size_t probe_bytes, np_buf_t *nb, double *secs, double *pass, double *pct, row_t *rows,
                    int *n_rows) {
    tern_error_t err = {0};
    const int32_t n_vocab = tern_model_n_vocab(m);
    const int th = tern_context_threads(c);
    for (int pi = 0; pi < o->pp.n; pi++)
        for (int gi = 0; gi < o->tg.n; gi++)
            for (int k = 0; k < o->np.n; k++) {
                const int n_seq = o->np.v[k], n_prompt = o->pp.v[pi], n_steps = o->tg.v[gi];
                if (n_steps == 0) continue;
                double warm;
                uint64_t d, disp = 0;
                if (run_parallel(c, nb, n_seq, n_prompt, n_steps, n_vocab, &warm, &d, &err)) {
                    fprintf(stderr, "tern bench: %s\n", err.msg);
                    return -1;
                }
                for (int r = 0; r < o->reps; r++) {
                    pass[r] = pbuf ? bench_probe_pass_gbps(th, pbuf, probe_bytes) : -1.0;
                    if (run_parallel(c, nb, n_seq, n_prompt, n_steps, n_vocab, &secs[r], &d, &err)) {
                        fprintf(stderr, "tern bench: %s\n", err.msg);
                        return -1;
                    }
                    disp += d;
                }
                double *tps = secs; /* converted in place: tokens of all sequences per second */
                for (int r = 0; r < o->reps; r++) tps[r] = (double)n_seq * n_steps / secs[r];
                row_t *row = &rows[(*n_rows)++];
                row_init(row, o->models[mi], mi, m, c);
                row->is_tg = 1;
                row->n_seq = n_seq;
                row->n_prompt = n_prompt;
                row->n_steps = n_steps;
                snprintf(row->test, sizeof row->test, "tg%d", n_steps);
                mean_sd(tps, o->reps, &row->tok_s, &row->tok_s_sd);
                row->tok_s_seq = row->tok_s / n_seq;
                row->tok_s_seq_sd = row->tok_s_sd / n_seq;
                row->probe_gbps = probe_gbps;
                /* One step reads the weights once for all its sequences. */
                row->weights_gbps = row->tok_s / n_seq * (double)row->bytes_per_token / 1e9;
                row->roofline_pct = probe_gbps > 0 ? 100.0 * row->weights_gbps / probe_gbps : 0;
                row->probe_now_gbps = row->roofline_pct_now = NAN;
                int np = 0;
                for (int r = 0; r < o->reps; r++)
                    if (pass[r] > 0) pct[np++] = 100.0 * tps[r] / n_seq * (double)row->bytes_per_token / 1e9 / pass[r];
                if (np == o->reps) {
                    row->roofline_pct_now = bench_median(pct, np);
                    row->probe_now_gbps = bench_median(pass, np);
                }
                row->dispatches_per_token = (double)disp / ((double)o->reps * n_steps);
                row->speedup = np_speedup(rows, *n_rows, row);
                fprintf(stderr, "tern bench: %s t=%d np%d p%d %s: %.2f ± %.2f tok/s, %.2f per sequence", row->model,
                        row->threads, n_seq, n_prompt, row->test, row->tok_s, row->tok_s_sd, row->tok_s_seq);
                if (n_seq > 1 && !isnan(row->speedup)) fprintf(stderr, ", %.2fx the 1-sequence rate", row->speedup);
                fprintf(stderr, "\n");
            }
    return 0;
}

int cmd_bench_model(int argc, char **argv) {
    bench_opts_t o;
    int prc = parse_opts(&o, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    int max_pp = 0, max_tg = 0;
    for (int i = 0; i < o.pp.n; i++) max_pp = o.pp.v[i] > max_pp ? o.pp.v[i] : max_pp;
    for (int i = 0; i < o.tg.n; i++) max_tg = o.tg.v[i] > max_tg ? o.tg.v[i] : max_tg;
    int max_n = max_pp > max_tg ? max_pp : max_tg;
    if (o.check > max_n) max_n = o.check;
    if (max_n == 0 || (o.np.n && max_tg == 0)) {
        fprintf(stderr, "tern bench: nothing to run (%s)\n", o.np.n ? "-np with -n 0" : "-p 0 -n 0");
        return 2;
    }
    int max_np = 0;
    for (int i = 0; i < o.np.n; i++) max_np = o.np.v[i] > max_np ? o.np.v[i] : max_np;
    /* -np: every sequence holds its prompt and steps, in whole KV blocks. */
    const int np_kv_block = 32;
    int64_t np_ctx = (int64_t)max_np * (((int64_t)max_pp + max_tg + np_kv_block - 1) / np_kv_block * np_kv_block);
    if (np_ctx < o.check + 1) np_ctx = o.check + 1;
    if (o.np.n && np_ctx > (1 << 30)) {
        fprintf(stderr, "tern bench: -np %d with -p %d -n %d needs too large a context\n", max_np, max_pp, max_tg);
        return 2;
    }

    /* The roofline's bandwidth, measured now, per thread count. */
    double probe[MAX_LIST];
    for (int i = 0; i < o.threads.n; i++) {
        probe[i] = bench_probe_read_gbps(o.threads.v[i], (size_t)(o.probe_mb * 1048576.0));
        fprintf(stderr, "tern bench: read bandwidth at %d thread%s: %.1f GB/s\n", o.threads.v[i],
                o.threads.v[i] > 1 ? "s" : "", probe[i]);
    }
    bench_probe_release();
    /* The buffer of the paired passes (header). Without it (no memory) the
     * table says "-" for them. */
    const size_t probe_bytes = (size_t)(o.probe_mb * 1048576.0);
    void *pbuf = bench_big_alloc(probe_bytes);
    if (!pbuf) fprintf(stderr, "tern bench: no %.0f MiB for the paired probe passes\n", o.probe_mb);

    const int max_rows = o.n_models * o.threads.n * (o.np.n ? o.pp.n * o.tg.n * o.np.n : o.pp.n + o.tg.n);
    row_t *rows = calloc((size_t)max_rows, sizeof *rows);
    int32_t *ids = malloc((size_t)max_n * sizeof *ids);
    np_buf_t nb = {0};
    if (o.np.n) {
        nb.pp_stride = max_pp > 0 ? max_pp : 1;
        nb.e = malloc((size_t)max_np * (size_t)nb.pp_stride * sizeof *nb.e);
        nb.tok = malloc((size_t)max_np * sizeof *nb.tok);
        nb.prompts = malloc((size_t)max_np * (size_t)nb.pp_stride * sizeof *nb.prompts);
    }
    double *secs = malloc((size_t)o.reps * sizeof *secs);
    double *pass = malloc((size_t)o.reps * sizeof *pass), *pct = malloc((size_t)o.reps * sizeof *pct);
    int n_rows = 0, rc = 0;
    if (!rows || !ids || !secs || !pass || !pct || (o.np.n && (!nb.e || !nb.tok || !nb.prompts))) {
        fprintf(stderr, "tern bench: out of memory\n");
        rc = 1;
        goto out;
    }
    for (int mi = 0; mi < o.n_models && rc == 0; mi++) {
        tern_error_t err = {0};
        tern_model_t *m = tern_model_load(o.models[mi], &err);
        if (!m) {
            fprintf(stderr, "tern bench: %s\n", err.msg);
            rc = 1;
            break;
        }
        fill_tokens(ids, max_n, tern_model_n_vocab(m), 42);
        for (int s = 0; s < max_np; s++) /* -np: a prompt of its own per sequence */
            fill_tokens(nb.prompts + (size_t)s * nb.pp_stride, nb.pp_stride, tern_model_n_vocab(m), 1000 + (uint64_t)s);
        int32_t *greedy_ref = NULL;
        int greedy_same = 1;
        for (int ti = 0; ti < o.threads.n && rc == 0; ti++) {
            tern_context_params_t cp = tern_context_default_params();
            cp.n_threads = o.threads.v[ti];
            cp.n_ctx = max_n + 1;
            if (o.np.n) {
                cp.n_ctx = (int32_t)np_ctx;
                cp.n_seq_max = max_np;
                cp.kv_block = np_kv_block;
            }
            cp.n_batch = o.n_batch;
            cp.kv_f32 = o.kv_f32;
            cp.profile = o.profile;
            tern_context_t *c = tern_context_create(m, &cp, &err);
            if (!c) {
                fprintf(stderr, "tern bench: %s\n", err.msg);
                rc = 1;
                break;
            }
            if (tern_context_note(c)[0]) fprintf(stderr, "tern bench: %s\n", tern_context_note(c));
            if (o.np.n && np_tests(&o, mi, m, c, probe[ti], pbuf, probe_bytes, &nb, secs, pass, pct, rows, &n_rows))
                rc = 1;
            for (int kind = 0; kind < 2 && rc == 0 && !o.np.n; kind++) {
                const ilist_t *l = kind ? &o.tg : &o.pp;
                for (int k = 0; k < l->n && rc == 0; k++) {
                    int n = l->v[k];
                    if (n == 0) continue;
                    double warm;
                    if (run_test(c, ids, n, kind, &warm, &err)) {
                        fprintf(stderr, "tern bench: %s\n", err.msg);
                        rc = 1;
                        break;
                    }
                    tern_context_timings_reset(c);
                    for (int r = 0; r < o.reps && rc == 0; r++) {
                        pass[r] = kind && pbuf ? bench_probe_pass_gbps(o.threads.v[ti], pbuf, probe_bytes) : -1.0;
                        if (run_test(c, ids, n, kind, &secs[r], &err)) {
                            fprintf(stderr, "tern bench: %s\n", err.msg);
                            rc = 1;
                        }
                    }
                    if (rc) break;
                    double *tps = secs; /* converted in place */
                    for (int r = 0; r < o.reps; r++) tps[r] = n / secs[r];
                    row_t *row = &rows[n_rows++];
                    row_init(row, o.models[mi], mi, m, c);
                    row->is_tg = kind;
                    snprintf(row->test, sizeof row->test, "%s%d", kind ? "tg" : "pp", n);
                    mean_sd(tps, o.reps, &row->tok_s, &row->tok_s_sd);
                    row->probe_gbps = probe[ti];
                    if (kind) {
                        tern_timings_t t;
                        tern_context_timings(c, &t);
                        row->weights_gbps = row->tok_s * (double)row->bytes_per_token / 1e9;
                        row->roofline_pct = probe[ti] > 0 ? 100.0 * row->weights_gbps / probe[ti] : 0;
                        row->probe_now_gbps = row->roofline_pct_now = NAN;
                        int np = 0;
                        for (int r = 0; r < o.reps; r++)
                            if (pass[r] > 0) pct[np++] = 100.0 * tps[r] * (double)row->bytes_per_token / 1e9 / pass[r];
                        if (np == o.reps) {
                            row->roofline_pct_now = bench_median(pct, np);
                            row->probe_now_gbps = bench_median(pass, np);
                        }
                        row->dispatches_per_token = t.n_gen ? (double)t.gen_dispatches / (double)t.n_gen : 0;
                        if (o.profile) {
                            tern_profile_t p;
                            tern_context_profile(c, &p);
                            double tot = (double)(p.qkv + p.attn + p.wo + p.ffn_up + p.ffn_down + p.output + p.small);
                            if (tot <= 0) tot = 1;
                            fprintf(stderr,
                                    "tern bench: profile %s t=%d %s: qkv %.1f%%, attention %.1f%%, o %.1f%%, gate/up "
                                    "%.1f%%, down %.1f%%, output %.1f%%, small ops %.1f%% (%.3f ms/token)\n",
                                    row->model, row->threads, row->test, 100 * p.qkv / tot, 100 * p.attn / tot,
                                    100 * p.wo / tot, 100 * p.ffn_up / tot, 100 * p.ffn_down / tot,
                                    100 * p.output / tot, 100 * p.small / tot,
                                    p.n_tokens ? tot / 1e6 / (double)p.n_tokens : 0.0);
                        }
                    }
                    fprintf(stderr, "tern bench: %s t=%d %s: %.2f ± %.2f tok/s\n", row->model, row->threads, row->test,
                            row->tok_s, row->tok_s_sd);
                }
            }
            if (rc == 0 && o.check > 0) {
                /* Greedy from token ids[0], compared across thread counts. */
                int32_t *g = malloc((size_t)o.check * sizeof *g);
                if (!g || tern_context_truncate(c, 0, &err)) rc = 1;
                int32_t tok = ids[0];
                for (int i = 0; rc == 0 && i < o.check; i++) {
                    if (tern_eval(c, &tok, 1, NULL, &err)) {
                        fprintf(stderr, "tern bench: %s\n", err.msg);
                        rc = 1;
                        break;
                    }
                    const float *lg = tern_get_logits(c);
                    int32_t best = 0;
                    for (int32_t v = 1; v < tern_model_n_vocab(m); v++)
                        if (lg[v] > lg[best]) best = v;
                    g[i] = tok = best;
                }
                if (rc == 0) {
                    fprintf(stderr, "tern bench: %s t=%d greedy tokens:", base_name(o.models[mi]), tern_context_threads(c));
                    for (int i = 0; i < o.check; i++) fprintf(stderr, " %d", g[i]);
                    fprintf(stderr, "\n");
                    if (!greedy_ref) {
                        greedy_ref = g;
                        g = NULL;
                    } else if (memcmp(greedy_ref, g, (size_t)o.check * sizeof *g) != 0) {
                        greedy_same = 0;
                    }
                }
                free(g);
            }
            tern_context_free(c);
        }
        if (rc == 0 && o.check > 0 && o.threads.n > 1) {
            fprintf(stderr, "tern bench: %s: %d greedy tokens %s at threads", base_name(o.models[mi]), o.check,
                    greedy_same ? "IDENTICAL" : "DIFFERENT");
            for (int ti = 0; ti < o.threads.n; ti++) fprintf(stderr, "%s%d", ti ? "," : " ", o.threads.v[ti]);
            fprintf(stderr, "\n");
            if (!greedy_same) rc = 1;
        }
        free(greedy_ref);
        tern_model_free(m);
    }
    for (int i = 0; i < n_rows; i++) /* an N = 1 row may come after the others (-np 8,1) */
        if (rows[i].n_seq) rows[i].speedup = np_speedup(rows, n_rows, &rows[i]);
    if (n_rows) print_rows(&o, rows, n_rows, probe, &o.threads);
out:
    free(nb.e);
    free(nb.tok);
    free(nb.prompts);
    free(rows);
    free(ids);
    free(secs);
    free(pass);
    free(pct);
    bench_big_free(pbuf, probe_bytes);
    return rc;
}
