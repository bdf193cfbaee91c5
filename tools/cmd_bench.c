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
 * thread-count invariant). */
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

typedef struct {
    int v[MAX_LIST];
    int n;
} ilist_t;

typedef struct {
    const char *models[MAX_LIST];
    int n_models;
    ilist_t threads, pp, tg;
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
    double dispatches_per_token;
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
            "  --profile              per-op time split of the generation tests (stderr)\n");
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

/* A JSON string body: quotes, backslashes and control bytes escaped. */
static void json_str(const char *s) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
}

static void print_rows(const bench_opts_t *o, const row_t *rows, int n, const double *probe, const ilist_t *th) {
    if (!strcmp(o->out, "json")) {
        printf("[\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            printf("  {\"model\": \"");
            json_str(r->model);
            printf("\", \"type\": \"");
            json_str(r->type);
            printf("\", \"size_bytes\": %llu, \"params\": %llu, \"threads\": %d, \"test\": \"%s\", \"tok_s\": %.3f, "
                   "\"tok_s_sd\": %.3f, \"probe_gbps\": %.2f",
                   (unsigned long long)r->size, (unsigned long long)r->params, r->threads, r->test, r->tok_s,
                   r->tok_s_sd, r->probe_gbps);
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
    printf("read bandwidth (probe, %.0f MiB, same run; %% of probe now: against a pass before each repetition):",
           o->probe_mb);
    for (int i = 0; i < th->n; i++) printf(" %d thread%s %.1f GB/s%s", th->v[i], th->v[i] > 1 ? "s" : "", probe[i],
                                           i + 1 < th->n ? "," : "");
    printf("\nISA %s\n\n", tern_isa_name());
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

int cmd_bench_model(int argc, char **argv) {
    bench_opts_t o;
    int prc = parse_opts(&o, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    int max_pp = 0, max_tg = 0;
    for (int i = 0; i < o.pp.n; i++) max_pp = o.pp.v[i] > max_pp ? o.pp.v[i] : max_pp;
    for (int i = 0; i < o.tg.n; i++) max_tg = o.tg.v[i] > max_tg ? o.tg.v[i] : max_tg;
    int max_n = max_pp > max_tg ? max_pp : max_tg;
    if (o.check > max_n) max_n = o.check;
    if (max_n == 0) {
        fprintf(stderr, "tern bench: nothing to run (-p 0 -n 0)\n");
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

    const int max_rows = o.n_models * o.threads.n * (o.pp.n + o.tg.n);
    row_t *rows = calloc((size_t)max_rows, sizeof *rows);
    int32_t *ids = malloc((size_t)max_n * sizeof *ids);
    double *secs = malloc((size_t)o.reps * sizeof *secs);
    double *pass = malloc((size_t)o.reps * sizeof *pass), *pct = malloc((size_t)o.reps * sizeof *pct);
    int n_rows = 0, rc = 0;
    if (!rows || !ids || !secs || !pass || !pct) {
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
        int32_t *greedy_ref = NULL;
        int greedy_same = 1;
        for (int ti = 0; ti < o.threads.n && rc == 0; ti++) {
            tern_context_params_t cp = tern_context_default_params();
            cp.n_threads = o.threads.v[ti];
            cp.n_ctx = max_n + 1;
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
            for (int kind = 0; kind < 2 && rc == 0; kind++) {
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
                    snprintf(row->model, sizeof row->model, "%s", base_name(o.models[mi]));
                    snprintf(row->type, sizeof row->type, "%s", tern_model_type_name(m));
                    row->size = tern_model_file_size(m);
                    row->params = tern_model_n_params(m);
                    row->bytes_per_token = tern_model_bytes_per_token(m);
                    row->threads = tern_context_threads(c);
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
    if (n_rows) print_rows(&o, rows, n_rows, probe, &o.threads);
out:
    free(rows);
    free(ids);
    free(secs);
    free(pass);
    free(pct);
    bench_big_free(pbuf, probe_bytes);
    return rc;
}
