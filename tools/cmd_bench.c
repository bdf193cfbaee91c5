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
 * logits wanted, the token of a greedy tern sampler fed back, as a
 * server at temperature 0 picks it). tok_s = N * steps / time (all
 * sequences together), tok_s_per_seq = that / N, and each row N > 1 is
 * compared with the N = 1 row of the same thread count, prompt and steps
 * (speedup). The weights are read once per step, so the weights GB/s and
 * roofline columns of these rows count steps, not tokens. The sequences
 * are removed before every repetition.
 *
 * The probe streams from DRAM, so it is no roofline for a decode whose
 * weights stay in the last-level cache: a generation row (a tg row, or an
 * -np row, per step) whose weight bytes read per token fit in the LLC
 * (bench_llc_bytes: hwloc, else sysfs; --llc-mb overrides it, 0 = unknown)
 * is labelled LLC-resident instead of getting a roofline percentage: "LLC-
 * resident" in the md cell, "llc_resident": true and no roofline_pct /
 * roofline_pct_now keys in json, an llc_resident column of 1 and empty
 * roofline cells in csv. The other generation rows keep their percentages
 * (json "llc_resident": false, csv 0).
 *
 * --busy N forks a child process before anything is measured (the probe
 * included) that runs N threads spinning on counters of their own until the
 * end: how tern behaves when another program takes cores. The child dies
 * with tern (PR_SET_PDEATHSIG) and is killed and reaped on every way out of
 * the command; the header names its pid, json rows carry "busy": N (0
 * without --busy), csv a busy column. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "cmds.h"
#include "disk_probe.h"
#include "model_args.h"
#include "probe.h"
#include "tern.h"

#define MAX_LIST 16
#define NP_PROMPT_DEFAULT 16 /* -np: each sequence's prompt when -p is not given */
#define NP_MAX 4096          /* -np: at most tern_context_params_t.n_seq_max's limit */
#define BUSY_MAX 64          /* --busy: spinning threads at most */

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
    /* --expert-cache and friends: a row per setting (cache x prefetch x pin) */
    ma_cache_t caches[MAX_LIST];
    int n_caches;
    ilist_t prefetch, pin; /* 0/1 each; n == 0: the library's default */
    int io_threads;        /* 0: the library's default (8) */
    double disk_s;         /* seconds per disk probe pattern; 0: no probe */
    int ec_mode;           /* any of the three lists given */
    /* the last-level cache: --llc-mb (llc_set), else detected at the start */
    double llc_mb;
    int llc_set;
    size_t llc_bytes;      /* 0: unknown, no row is labelled */
    char llc_src[256];
    int busy;              /* --busy N: spinning threads of another process; 0: none */
    pid_t busy_pid;        /* that process while it runs; 0: none */
} bench_opts_t;

/* What an expert-cache row adds (ec.on set). NAN: does not apply. */
typedef struct {
    int on;
    char setting[24];       /* as given: "25%", "mmap", "auto" ("-" for a dense model) */
    int prefetch, pin;      /* as loaded, 0 or 1 */
    int io_threads;
    int active, direct, n_slots, n_pinned; /* the cache as loaded (active 0: through the mapping) */
    uint64_t cache_bytes, slot_bytes;
    uint64_t expert_bytes;  /* all routed experts of the file */
    int dropped;            /* the file's pages were dropped from the page cache before the load */
    /* warm: the -r repetitions after the warm-up */
    double hit_rate, gb_tok, io_gbps, wait_share, pred;
    /* cold: the first repetition right after the load (tg rows of the first length) */
    double cold_tok_s, cold_hit_rate, cold_gb_tok, cold_io_gbps, cold_wait_share;
    /* the disk probe of the model's file, and the row against it */
    int disk_ok, disk_direct, disk_readers;
    uint64_t disk_read_bytes;
    double disk_seq_gbps, disk_rand_gbps;
    /* the pattern probed again right before the row's timed repetitions and
     * right after them (tg rows; NAN: not probed): a disk whose rate swings
     * within seconds (seen here: 0.7-2.0 GB/s) is read against the rate it
     * had while the row ran, their mean */
    double disk_before_gbps, disk_after_gbps;
    double roof_tok_s, roof_pct, compute_ms, io_ms;
} ec_row_t;

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
    int llc_resident;               /* a generation row whose weights per token fit in the LLC */
    int busy;                       /* --busy N of the run */
    ec_row_t ec;
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
            "                         sequence, and the speedup over N = 1 (include 1 in LIST)\n"
            "  --llc-mb N             last-level cache size in MiB instead of the detected one (hwloc,\n"
            "                         else sysfs; 0 = unknown): a generation row whose weight bytes\n"
            "                         read per token (per step with -np) fit in it says LLC-resident\n"
            "                         instead of a %% of roofline (the probe measures DRAM, not the cache)\n"
            "  --busy N               N threads (1..%d) of another process spin during the whole\n"
            "                         measurement, probe included: tern on a machine with cores taken\n",
            NP_PROMPT_DEFAULT, BUSY_MAX);
    model_args_usage(out, 1, 25);
    fprintf(out,
            "  --disk-probe-s S       seconds of each disk probe pattern (default 3; 0: no probe); the probe\n"
            "                         runs at the start, and its expert pattern alone right before and after each tg row\n"
            "With --expert-cache (or the prefetch or pin lists), each row is one setting at one thread\n"
            "count, the model loaded again for it (the cache lives per load), the file's pages dropped\n"
            "from the page cache first; tg rows add a cold rate (the first repetition right after the\n"
            "load) and the cache's figures over the repetitions (hit rate, GB read per token, I/O GB/s,\n"
            "share of the time waiting on reads, prefetch prediction). The header gives the disk under\n"
            "the file: sequential 8 MiB O_DIRECT reads, one reader, and the expert cache's pattern\n"
            "(reads of one expert slot at random offsets, --io-threads readers); each row's I/O\n"
            "roofline is that pattern's GB/s / GB read per token. Not with -np.\n");
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
    o->disk_s = 3;
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
        } else if (IS("--expert-cache")) {
            char *dup = strdup(v), *save = NULL;
            if (!dup) return 2;
            o->n_caches = 0;
            for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->n_caches == MAX_LIST) {
                    fprintf(stderr, "tern bench: %s: at most %d settings\n", a, MAX_LIST);
                    free(dup);
                    return 2;
                }
                if (model_args_parse_cache(t, "bench", a, &o->caches[o->n_caches++])) {
                    free(dup);
                    return 2;
                }
            }
            free(dup);
            if (o->n_caches == 0) {
                fprintf(stderr, "tern bench: %s: empty list\n", a);
                return 2;
            }
        } else if (IS("--expert-prefetch") || IS("--expert-pin")) {
            ilist_t *l = IS("--expert-pin") ? &o->pin : &o->prefetch;
            char *dup = strdup(v), *save = NULL;
            if (!dup) return 2;
            l->n = 0;
            for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (l->n == MAX_LIST || model_args_parse_onoff(t, "bench", a, &l->v[l->n])) {
                    if (l->n == MAX_LIST) fprintf(stderr, "tern bench: %s: at most %d values\n", a, MAX_LIST);
                    free(dup);
                    return 2;
                }
                l->n++;
            }
            free(dup);
            if (l->n == 0) {
                fprintf(stderr, "tern bench: %s: empty list\n", a);
                return 2;
            }
        } else if (IS("--io-threads")) {
            if (model_args_parse_io_threads(v, "bench", a, &o->io_threads)) return 2;
        } else if (IS("--disk-probe-s")) {
            char *end;
            o->disk_s = strtod(v, &end);
            if (end == v || *end || !(o->disk_s >= 0 && o->disk_s <= 600)) {
                fprintf(stderr, "tern bench: --disk-probe-s wants seconds from 0 to 600, got '%s'\n", v);
                return 2;
            }
        } else if (IS("--llc-mb")) {
            char *end;
            o->llc_mb = strtod(v, &end);
            if (end == v || *end || !(o->llc_mb >= 0 && o->llc_mb <= 1048576)) {
                fprintf(stderr, "tern bench: --llc-mb wants MiB from 0 to 1048576, got '%s'\n", v);
                return 2;
            }
            o->llc_set = 1;
        } else if (IS("--busy")) {
            char *end;
            errno = 0;
            long b = strtol(v, &end, 10);
            if (errno || end == v || *end || b < 1 || b > BUSY_MAX) {
                fprintf(stderr, "tern bench: --busy wants an integer from 1 to %d, got '%s'\n", BUSY_MAX, v);
                return 2;
            }
            o->busy = (int)b;
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
    o->ec_mode = o->n_caches || o->prefetch.n || o->pin.n;
    if (o->ec_mode && o->np.n) {
        fprintf(stderr, "tern bench: --expert-cache, --expert-prefetch and --expert-pin rows do not combine with -np\n");
        return 2;
    }
    if (o->ec_mode && !o->n_caches) {
        o->n_caches = 1;
        model_args_parse_cache("auto", "bench", "--expert-cache", &o->caches[0]);
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

/* The buffers of the -np tests. */
typedef struct {
    tern_batch_entry_t *e; /* np_max * max(pp_max, 1) entries */
    int32_t *tok;          /* np_max: each sequence's next token */
    int32_t *prompts;      /* sequence s's prompt at s * pp_stride */
    int pp_stride;
    tern_sampler_t *greedy; /* temperature 0: the token fed back (np_tests) */
} np_buf_t;

static int np_remove(tern_context_t *c, int n_seq, tern_error_t *err) {
    for (int s = 0; s < n_seq; s++)
        if (tern_seq_remove(c, s, err)) return -1;
    return 0;
}

/* One -np repetition: sequences 0 .. n_seq-1 each take their prompt of
 * n_prompt tokens (one tern_decode call, untimed), then n_steps tern_decode
 * calls of n_seq entries (one token per sequence, logits wanted, the greedy
 * sampler's token fed back) are timed; *dispatches: the pool runs of those calls. The
 * sequences are removed before and after. */
static int run_parallel(tern_context_t *c, np_buf_t *b, int n_seq, int n_prompt, int n_steps,
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
            b->tok[s] = tern_sampler_sample(b->greedy, lg);
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
            b->tok[s] = tern_sampler_sample(b->greedy, lg);
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
    printf("\", \"size_bytes\": %llu, \"params\": %llu, \"threads\": %d, \"test\": \"%s\", \"busy\": %d, ",
           (unsigned long long)r->size, (unsigned long long)r->params, r->threads, r->test, r->busy);
}

/* A generation row's roofline keys: "llc_resident" and, when the weights do
 * not fit in the LLC, "roofline_pct" (DRAM roofline of the whole run's
 * probe). The caller prints roofline_pct_now the same way (json_now). */
static void json_roofline(const row_t *r) {
    if (r->llc_resident) printf(", \"llc_resident\": true");
    else printf(", \"llc_resident\": false, \"roofline_pct\": %.1f", r->roofline_pct);
}
static void json_now(const row_t *r) {
    if (isnan(r->roofline_pct_now)) return;
    printf(", \"probe_now_gbps\": %.2f", r->probe_now_gbps);
    if (!r->llc_resident) printf(", \"roofline_pct_now\": %.1f", r->roofline_pct_now);
}

/* The md cells "% of roofline | % of probe now |" of a generation row. */
static void md_roofline(const row_t *r) {
    if (r->llc_resident) {
        printf(" LLC-resident | - |");
        return;
    }
    printf(" %.1f%% |", r->roofline_pct);
    if (isnan(r->roofline_pct_now)) printf(" - |");
    else printf(" %.1f%% |", r->roofline_pct_now);
}

/* The csv cells of roofline_pct (after a comma) and, separately,
 * "probe_now_gbps,roofline_pct_now": empty where the row is LLC-resident. */
static void csv_roofline(const row_t *r) {
    if (!r->llc_resident) printf("%.1f", r->roofline_pct);
}
static void csv_now(const row_t *r) {
    if (isnan(r->roofline_pct_now)) printf(",");
    else if (r->llc_resident) printf("%.2f,", r->probe_now_gbps);
    else printf("%.2f,%.1f", r->probe_now_gbps, r->roofline_pct_now);
}

static void print_header(const bench_opts_t *o, const double *probe, const ilist_t *th) {
    printf("read bandwidth (probe, %.0f MiB, same run; %% of probe now: against a pass before each repetition):",
           o->probe_mb);
    for (int i = 0; i < th->n; i++) printf(" %d thread%s %.1f GB/s%s", th->v[i], th->v[i] > 1 ? "s" : "", probe[i],
                                           i + 1 < th->n ? "," : "");
    printf("\nISA %s; AMX %s\n", tern_isa_name(), tern_amx_status());
    if (o->llc_bytes)
        printf("last-level cache: %.1f MiB (%s); generation rows whose weight bytes per token fit in it say "
               "LLC-resident instead of a %% of roofline\n",
               (double)o->llc_bytes / 1048576.0, o->llc_src);
    else
        printf("last-level cache: unknown (%s); no row is labelled LLC-resident\n", o->llc_src);
    if (o->busy)
        printf("busy: %d spinning thread%s in another process (pid %ld)\n", o->busy, o->busy == 1 ? "" : "s",
               (long)o->busy_pid);
    printf("\n");
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
            printf(", \"probe_gbps\": %.2f, \"weight_bytes_per_token\": %llu, \"weights_gbps\": %.2f",
                   r->probe_gbps, (unsigned long long)r->bytes_per_token, r->weights_gbps);
            json_roofline(r);
            printf(", \"dispatches_per_step\": %.1f", r->dispatches_per_token);
            json_now(r);
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("]\n");
        return;
    }
    if (!strcmp(o->out, "csv")) {
        printf("model,type,size_bytes,params,threads,n_seq,n_prompt,test,tok_s,tok_s_sd,tok_s_per_seq,tok_s_per_seq_sd,"
               "speedup_vs_n_seq_1,probe_gbps,weights_gbps,roofline_pct,dispatches_per_step,probe_now_gbps,"
               "roofline_pct_now,llc_resident,busy\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            printf("%s,%s,%llu,%llu,%d,%d,%d,%s,%.3f,%.3f,%.3f,%.3f,", r->model, r->type, (unsigned long long)r->size,
                   (unsigned long long)r->params, r->threads, r->n_seq, r->n_prompt, r->test, r->tok_s, r->tok_s_sd,
                   r->tok_s_seq, r->tok_s_seq_sd);
            if (!isnan(r->speedup)) printf("%.3f", r->speedup);
            printf(",%.2f,%.2f,", r->probe_gbps, r->weights_gbps);
            csv_roofline(r);
            printf(",%.1f,", r->dispatches_per_token);
            csv_now(r);
            printf(",%d,%d\n", r->llc_resident, r->busy);
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
        printf(" %.1f |", r->weights_gbps);
        md_roofline(r);
        printf(" %.1f |\n", r->dispatches_per_token);
    }
}

/* ---- the expert rows' table ---- */

/* A number or, for NAN, "-" (md), "" (csv), null (json). */
static void md_num(const char *fmt, double v) {
    if (isnan(v)) printf(" - |");
    else {
        putchar(' ');
        printf(fmt, v);
        printf(" |");
    }
}
static void csv_num(const char *fmt, double v) {
    putchar(',');
    if (!isnan(v)) printf(fmt, v);
}
static void json_num(const char *key, const char *fmt, double v) {
    printf(", \"%s\": ", key);
    if (isnan(v)) printf("null");
    else printf(fmt, v);
}

/* "25% (0.40 GiB, 3 slots)", "mmap", "auto (mapped)", "-" (dense). */
static void ec_cache_cell(const ec_row_t *e, char *out, size_t cap) {
    if (!e->active) {
        snprintf(out, cap, "%s%s", e->setting, strcmp(e->setting, "auto") ? "" : " (mapped)");
        return;
    }
    const double gib = (double)e->cache_bytes / 1073741824.0;
    if (gib >= 0.1) snprintf(out, cap, "%s (%.2f GiB, %d slots)", e->setting, gib, e->n_slots);
    else snprintf(out, cap, "%s (%.1f MiB, %d slots)", e->setting, gib * 1024, e->n_slots);
}

static void print_ec_rows(const bench_opts_t *o, const row_t *rows, int n, const double *probe, const ilist_t *th) {
    if (!strcmp(o->out, "json")) {
        printf("[\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            const ec_row_t *e = &r->ec;
            json_row_head(r);
            printf("\"tok_s\": %.3f, \"tok_s_sd\": %.3f, \"probe_gbps\": %.2f", r->tok_s, r->tok_s_sd, r->probe_gbps);
            if (r->is_tg) {
                printf(", \"weight_bytes_per_token\": %llu, \"weights_gbps\": %.2f",
                       (unsigned long long)r->bytes_per_token, r->weights_gbps);
                json_roofline(r);
                printf(", \"dispatches_per_token\": %.1f", r->dispatches_per_token);
            }
            printf(", \"expert_cache\": \"");
            json_str(e->setting);
            printf("\", \"expert_bytes\": %llu, \"cache_active\": %s, \"cache_bytes\": %llu, \"cache_gib\": %.4f, "
                   "\"cache_slots\": %d, \"slot_bytes\": %llu, \"pinned_slots\": %d, \"direct_io\": %s, \"prefetch\": %s, "
                   "\"pin\": %s, \"io_threads\": %d, \"page_cache_dropped\": %s",
                   (unsigned long long)e->expert_bytes, e->active ? "true" : "false", (unsigned long long)e->cache_bytes,
                   (double)e->cache_bytes / 1073741824.0, e->n_slots, (unsigned long long)e->slot_bytes, e->n_pinned,
                   e->direct ? "true" : "false", e->prefetch ? "true" : "false", e->pin ? "true" : "false",
                   e->io_threads, e->dropped ? "true" : "false");
            json_num("hit_rate", "%.4f", e->hit_rate);
            json_num("gb_per_token", "%.6g", e->gb_tok);
            json_num("io_gbps", "%.4f", e->io_gbps);
            json_num("io_wait_share", "%.4f", e->wait_share);
            json_num("prediction_accuracy", "%.4f", e->pred);
            json_num("tok_s_cold", "%.3f", e->cold_tok_s);
            json_num("cold_hit_rate", "%.4f", e->cold_hit_rate);
            json_num("cold_gb_per_token", "%.6g", e->cold_gb_tok);
            json_num("cold_io_gbps", "%.4f", e->cold_io_gbps);
            json_num("cold_io_wait_share", "%.4f", e->cold_wait_share);
            printf(", \"disk_direct\": %s", e->disk_ok ? (e->disk_direct ? "true" : "false") : "null");
            json_num("disk_seq_gbps", "%.4f", e->disk_ok ? e->disk_seq_gbps : NAN);
            json_num("disk_rand_gbps", "%.4f", e->disk_ok ? e->disk_rand_gbps : NAN);
            json_num("disk_read_bytes", "%.0f", e->disk_ok ? (double)e->disk_read_bytes : NAN);
            json_num("disk_readers", "%.0f", e->disk_ok ? (double)e->disk_readers : NAN);
            json_num("disk_rand_gbps_before", "%.4f", e->disk_before_gbps);
            json_num("disk_rand_gbps_after", "%.4f", e->disk_after_gbps);
            json_num("io_roofline_tok_s", "%.3f", e->roof_tok_s);
            json_num("io_roofline_pct", "%.2f", e->roof_pct);
            json_num("compute_ms_per_token", "%.4f", e->compute_ms);
            json_num("io_ms_per_token", "%.4f", e->io_ms);
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("]\n");
        return;
    }
    if (!strcmp(o->out, "csv")) {
        printf("model,type,size_bytes,params,threads,expert_cache,cache_active,cache_bytes,cache_slots,pinned_slots,"
               "direct_io,prefetch,pin,io_threads,test,tok_s,tok_s_sd,tok_s_cold,hit_rate,gb_per_token,io_gbps,"
               "io_wait_share,prediction_accuracy,cold_hit_rate,cold_gb_per_token,cold_io_gbps,cold_io_wait_share,"
               "disk_seq_gbps,disk_rand_gbps,disk_rand_gbps_before,disk_rand_gbps_after,io_roofline_tok_s,io_roofline_pct,"
               "compute_ms_per_token,io_ms_per_token\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            const ec_row_t *e = &r->ec;
            printf("%s,%s,%llu,%llu,%d,%s,%d,%llu,%d,%d,%d,%d,%d,%d,%s,%.3f,%.3f", r->model, r->type,
                   (unsigned long long)r->size, (unsigned long long)r->params, r->threads, e->setting, e->active,
                   (unsigned long long)e->cache_bytes, e->n_slots, e->n_pinned, e->direct, e->prefetch, e->pin,
                   e->io_threads, r->test, r->tok_s, r->tok_s_sd);
            csv_num("%.3f", e->cold_tok_s);
            csv_num("%.4f", e->hit_rate);
            csv_num("%.6g", e->gb_tok);
            csv_num("%.4f", e->io_gbps);
            csv_num("%.4f", e->wait_share);
            csv_num("%.4f", e->pred);
            csv_num("%.4f", e->cold_hit_rate);
            csv_num("%.6g", e->cold_gb_tok);
            csv_num("%.4f", e->cold_io_gbps);
            csv_num("%.4f", e->cold_wait_share);
            csv_num("%.4f", e->disk_ok ? e->disk_seq_gbps : NAN);
            csv_num("%.4f", e->disk_ok ? e->disk_rand_gbps : NAN);
            csv_num("%.4f", e->disk_before_gbps);
            csv_num("%.4f", e->disk_after_gbps);
            csv_num("%.3f", e->roof_tok_s);
            csv_num("%.2f", e->roof_pct);
            csv_num("%.4f", e->compute_ms);
            csv_num("%.4f", e->io_ms);
            printf("\n");
        }
        return;
    }
    print_header(o, probe, th);
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        if (i > 0 && rows[i - 1].mi == r->mi) continue;
        const ec_row_t *e = &r->ec;
        if (e->disk_ok)
            printf("disk under %s (%s reads): sequential (%u MiB reads, 1 reader) %.2f GB/s; the expert cache's pattern "
                   "(%.0f KiB reads at random offsets, %d readers) %.2f GB/s\n",
                   r->model, e->disk_direct ? "O_DIRECT" : "buffered", BENCH_DISK_SEQ_CHUNK >> 20, e->disk_seq_gbps,
                   (double)e->disk_read_bytes / 1024.0, e->disk_readers, e->disk_rand_gbps);
        else
            printf("disk under %s: not probed\n", r->model);
    }
    printf("\nEach row loads the model again with its setting, after dropping the file's pages from the page cache "
           "(posix_fadvise DONTNEED). cold: the first tg repetition right after the load; t/s and the I/O columns: the "
           "repetitions after a warm-up run. Rows with a cache count its reads; rows through the mapping (mmap) count "
           "the process's storage reads (/proc/self/io). disk now: the pattern probed again right before the row's "
           "repetitions and right after them (GB/s, before / after; the disk's rate can swing within seconds). I/O "
           "roofline: the pattern's GB/s (the mean of those two where the row has them, else the probe above) / GB read "
           "per token; compute ms/token: time per token not spent waiting on reads; I/O ms/token: the token's reads at "
           "that rate.\n\n");
    printf("| model | threads | cache | prefetch | pin | test | t/s | t/s cold | hit rate | GB read/token | I/O GB/s | "
           "I/O wait | prediction | disk now GB/s | I/O roofline t/s | %% of I/O roofline | compute ms/token | I/O ms/token "
           "|\n");
    printf("|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        const ec_row_t *e = &r->ec;
        char cell[96];
        ec_cache_cell(e, cell, sizeof cell);
        printf("| %s | %d | %s | %s | %s | %s | %.2f ± %.2f |", r->model, r->threads, cell,
               !e->active ? "-" : e->prefetch ? "on" : "off",
               !e->active ? "-" : e->pin ? (e->n_pinned ? "on" : "on (none yet)") : "off", r->test, r->tok_s,
               r->tok_s_sd);
        md_num("%.2f", e->cold_tok_s);
        md_num("%.1f%%", 100 * e->hit_rate);
        md_num("%.4f", e->gb_tok);
        md_num("%.2f", e->io_gbps);
        md_num("%.1f%%", 100 * e->wait_share);
        md_num("%.1f%%", 100 * e->pred);
        if (e->disk_before_gbps > 0 && e->disk_after_gbps > 0)
            printf(" %.2f / %.2f |", e->disk_before_gbps, e->disk_after_gbps);
        else
            printf(" - |");
        md_num("%.1f", e->roof_tok_s);
        md_num("%.1f%%", e->roof_pct);
        md_num("%.3f", e->compute_ms);
        md_num("%.3f", e->io_ms);
        printf("\n");
    }
}

static void print_rows(const bench_opts_t *o, const row_t *rows, int n, const double *probe, const ilist_t *th) {
    if (o->ec_mode) {
        print_ec_rows(o, rows, n, probe, th);
        return;
    }
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
                printf(", \"weight_bytes_per_token\": %llu, \"weights_gbps\": %.2f",
                       (unsigned long long)r->bytes_per_token, r->weights_gbps);
                json_roofline(r);
                printf(", \"dispatches_per_token\": %.1f", r->dispatches_per_token);
                json_now(r);
            }
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("]\n");
        return;
    }
    if (!strcmp(o->out, "csv")) {
        printf("model,type,size_bytes,params,threads,test,tok_s,tok_s_sd,probe_gbps,weights_gbps,roofline_pct,"
               "dispatches_per_token,probe_now_gbps,roofline_pct_now,llc_resident,busy\n");
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            printf("%s,%s,%llu,%llu,%d,%s,%.3f,%.3f,%.2f,", r->model, r->type, (unsigned long long)r->size,
                   (unsigned long long)r->params, r->threads, r->test, r->tok_s, r->tok_s_sd, r->probe_gbps);
            if (r->is_tg) {
                printf("%.2f,", r->weights_gbps);
                csv_roofline(r);
                printf(",%.1f,", r->dispatches_per_token);
                csv_now(r);
                printf(",%d,%d\n", r->llc_resident, r->busy);
            } else {
                printf(",,,,,,%d\n", r->busy);
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
            printf(" %.1f |", r->weights_gbps);
            md_roofline(r);
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

static int np_tests_run(const bench_opts_t *o, int mi, const tern_model_t *m, int th, tern_context_t *c, double probe_gbps,
                        void *pbuf, size_t probe_bytes, np_buf_t *nb, double *secs, double *pass, double *pct,
                        row_t *rows, int *n_rows);

/* The -np rows of one context: prompt lengths x steps x sequence counts. */
static int np_tests(const bench_opts_t *o, int mi, const tern_model_t *m, tern_context_t *c, double probe_gbps,
                    void *pbuf, size_t probe_bytes, np_buf_t *nb, double *secs, double *pass, double *pct, row_t *rows,
                    int *n_rows) {
    tern_error_t err = {0};
    const int th = tern_context_threads(c);
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.temp = 0;
    nb->greedy = tern_sampler_create(m, &sp, &err);
    if (!nb->greedy) {
        fprintf(stderr, "tern bench: %s\n", err.msg);
        return -1;
    }
    const int rc = np_tests_run(o, mi, m, th, c, probe_gbps, pbuf, probe_bytes, nb, secs, pass, pct, rows, n_rows);
    tern_sampler_free(nb->greedy);
    nb->greedy = NULL;
    return rc;
}

static int np_tests_run(const bench_opts_t *o, int mi, const tern_model_t *m, int th, tern_context_t *c, double probe_gbps,
                        void *pbuf, size_t probe_bytes, np_buf_t *nb, double *secs, double *pass, double *pct,
                        row_t *rows, int *n_rows) {
    tern_error_t err = {0};
    for (int pi = 0; pi < o->pp.n; pi++)
        for (int gi = 0; gi < o->tg.n; gi++)
            for (int k = 0; k < o->np.n; k++) {
                const int n_seq = o->np.v[k], n_prompt = o->pp.v[pi], n_steps = o->tg.v[gi];
                if (n_steps == 0) continue;
                double warm;
                uint64_t d, disp = 0;
                if (run_parallel(c, nb, n_seq, n_prompt, n_steps, &warm, &d, &err)) {
                    fprintf(stderr, "tern bench: %s\n", err.msg);
                    return -1;
                }
                for (int r = 0; r < o->reps; r++) {
                    pass[r] = pbuf ? bench_probe_pass_gbps(th, pbuf, probe_bytes) : -1.0;
                    if (run_parallel(c, nb, n_seq, n_prompt, n_steps, &secs[r], &d, &err)) {
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

/* ---- expert-cache rows (--expert-cache, --expert-prefetch, --expert-pin) ---- */

/* read_bytes of /proc/self/io: what this process had read from storage,
 * page faults of the mapping included; -1 where the kernel does not say. */
static int64_t proc_read_bytes(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128];
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %lld", &v) == 1) break;
    fclose(f);
    return v;
}

/* The counters before and after a measured stretch. */
typedef struct {
    tern_expert_stats_t es;
    int64_t proc;
} io_mark_t;

static void io_mark(const tern_model_t *m, io_mark_t *k) {
    tern_model_expert_stats(m, &k->es);
    k->proc = proc_read_bytes();
}

/* The I/O of a stretch of secs seconds (evaluation time) and tokens tokens
 * between marks a and b: with a cache, its counters; through the mapping,
 * the process's storage reads. NAN: does not apply or is not known. */
typedef struct {
    double hit_rate, gb_tok, io_gbps, wait_share, wait_s, pred;
} io_fig_t;

static io_fig_t io_figures(const io_mark_t *a, const io_mark_t *b, double secs, double tokens) {
    io_fig_t f = {NAN, NAN, NAN, NAN, NAN, NAN};
    double bytes;
    if (b->es.active) {
        const double hits = (double)(b->es.hits - a->es.hits), asked = hits + (double)(b->es.misses - a->es.misses);
        if (asked > 0) f.hit_rate = hits / asked;
        const double pt = (double)(b->es.pred_total - a->es.pred_total);
        if (pt > 0) f.pred = (double)(b->es.pred_hits - a->es.pred_hits) / pt;
        f.wait_s = (double)(b->es.wait_ns - a->es.wait_ns) / 1e9;
        if (secs > 0) f.wait_share = f.wait_s / secs;
        bytes = (double)(b->es.bytes_read - a->es.bytes_read);
    } else if (a->proc >= 0 && b->proc >= a->proc) {
        bytes = (double)(b->proc - a->proc);
    } else {
        return f;
    }
    if (tokens > 0) f.gb_tok = bytes / 1e9 / tokens;
    if (secs > 0) f.io_gbps = bytes / 1e9 / secs;
    return f;
}

/* What the expert rows of one model share. */
typedef struct {
    uint64_t expert_bytes; /* routed experts of the file (0: dense) */
    uint64_t slot_bytes;   /* one slot of its cache */
    int disk_ok;
    bench_disk_t disk;
    char usage[4096];      /* the usage counts file of this run (--expert-pin) */
} ec_model_t;

static int ec_n_settings(const bench_opts_t *o) {
    return o->n_caches * (o->prefetch.n ? o->prefetch.n : 1) * (o->pin.n ? o->pin.n : 1);
}

/* Setting si: cache index, prefetch and pin (-1: the default). */
static void ec_setting(const bench_opts_t *o, int si, int *ci, int *pf, int *pn) {
    const int npf = o->prefetch.n ? o->prefetch.n : 1, npn = o->pin.n ? o->pin.n : 1;
    *pn = o->pin.n ? o->pin.v[si % npn] : -1;
    *pf = o->prefetch.n ? o->prefetch.v[si / npn % npf] : -1;
    *ci = si / (npn * npf);
}

/* Whether setting si is the first prefetch and pin combination of its
 * cache setting: the only one run through the mapping (no cache, nothing
 * for prefetch or pinning to change). */
static int ec_first_combo(const bench_opts_t *o, int si) {
    const int npf = o->prefetch.n ? o->prefetch.n : 1, npn = o->pin.n ? o->pin.n : 1;
    return si % (npf * npn) == 0;
}

/* Before a model's expert rows: its expert bytes (a load that only maps
 * it), its slot size (a load with a one-slot cache, which reads nothing),
 * and the disk probe of its file. The usage counts go to a file of this
 * run's own (usage_dir), not to the user's: pinning in a later row uses the
 * counts of the earlier rows. */
static int ec_model_prepare(const bench_opts_t *o, const char *path, int mi, const char *usage_dir, ec_model_t *em) {
    memset(em, 0, sizeof *em);
    snprintf(em->usage, sizeof em->usage, "%s/model%d.usage", usage_dir, mi);
    tern_error_t err = {0};
    if (model_args_expert_bytes(path, &em->expert_bytes, &err)) {
        fprintf(stderr, "tern bench: %s\n", err.msg);
        return -1;
    }
    if (!em->expert_bytes) return 0;
    tern_model_params_t p = tern_model_default_params();
    p.expert_cache_bytes = 1; /* one slot */
    p.io_threads = 1;
    p.expert_usage_path = em->usage;
    tern_model_t *m = tern_model_load_ex(path, &p, &err);
    if (!m) {
        fprintf(stderr, "tern bench: %s\n", err.msg);
        return -1;
    }
    tern_expert_stats_t st;
    tern_model_expert_stats(m, &st);
    em->slot_bytes = st.slot_bytes;
    tern_model_free(m);
    if (o->disk_s > 0) {
        char msg[512];
        const int readers = o->io_threads > 0 ? o->io_threads : 8;
        fprintf(stderr, "tern bench: disk probe on %s: sequential reads, then %d readers of one slot (%.1f s each)\n",
                base_name(path), readers, o->disk_s);
        if (bench_disk_probe(path, em->slot_bytes, readers, o->disk_s, 1, &em->disk, msg, sizeof msg) == 0) {
            em->disk_ok = 1;
            fprintf(stderr, "tern bench: disk under %s (%s): sequential %.2f GB/s, slot reads %.2f GB/s\n",
                    base_name(path), em->disk.direct ? "O_DIRECT" : "buffered", em->disk.seq_gbps, em->disk.rand_gbps);
        } else {
            fprintf(stderr, "tern bench: %s (the rows go without an I/O roofline)\n", msg);
        }
    }
    return 0;
}

/* Load path for setting si: the file's pages dropped from the page cache
 * first (so the first repetition reads from the disk, also through the
 * mapping), then loaded with the setting; *er describes the row. NULL with
 * a message on failure. */
static tern_model_t *ec_load(const bench_opts_t *o, const char *path, const ec_model_t *em, int si, ec_row_t *er) {
    int ci, pf, pn;
    ec_setting(o, si, &ci, &pf, &pn);
    tern_model_params_t p = tern_model_default_params();
    p.expert_cache_bytes = model_args_cache_bytes(&o->caches[ci], em->expert_bytes);
    p.expert_prefetch = pf;
    p.expert_pin = pn;
    p.io_threads = o->io_threads;
    p.expert_usage_path = em->usage;
    memset(er, 0, sizeof *er);
    er->on = 1;
    snprintf(er->setting, sizeof er->setting, "%s", em->expert_bytes ? o->caches[ci].text : "-");
    er->prefetch = pf != 0; /* the default is on */
    er->pin = pn != 0; /* the library pins by default */
    er->io_threads = o->io_threads > 0 ? o->io_threads : 8;
    er->expert_bytes = em->expert_bytes;
    er->dropped = bench_drop_page_cache(path) == 0;
    tern_error_t err = {0};
    tern_model_t *m = tern_model_load_ex(path, &p, &err);
    if (!m) {
        fprintf(stderr, "tern bench: %s\n", err.msg);
        return NULL;
    }
    tern_expert_stats_t st;
    tern_model_expert_stats(m, &st);
    er->active = st.active;
    er->direct = st.direct;
    er->n_slots = st.n_slots;
    er->n_pinned = st.n_pinned;
    er->cache_bytes = st.cache_bytes;
    er->slot_bytes = st.slot_bytes;
    er->disk_ok = em->disk_ok;
    if (em->disk_ok) {
        er->disk_direct = em->disk.direct;
        er->disk_readers = em->disk.readers;
        er->disk_read_bytes = em->disk.read_bytes;
        er->disk_seq_gbps = em->disk.seq_gbps;
        er->disk_rand_gbps = em->disk.rand_gbps;
    }
    return m;
}

/* The cold repetition of the expert rows. */
typedef struct {
    int n; /* tokens (the first tg length); 0: none was run */
    double tok_s;
    io_fig_t f;
} ec_cold_t;

/* Right after the load: one tg repetition of the first tg length, timed,
 * with its I/O (since the load: pinned experts queued at the load count). */
static int ec_cold_run(const bench_opts_t *o, const tern_model_t *m, tern_context_t *c, const int32_t *ids,
                       ec_cold_t *cold, tern_error_t *err) {
    memset(cold, 0, sizeof *cold);
    for (int k = 0; k < o->tg.n && !cold->n; k++) cold->n = o->tg.v[k];
    if (!cold->n) return 0;
    io_mark_t a, b;
    io_mark(m, &a);
    memset(&a.es, 0, sizeof a.es); /* the counters since the load */
    double secs;
    if (run_test(c, ids, cold->n, 1, &secs, err)) return -1;
    io_mark(m, &b);
    cold->tok_s = cold->n / secs;
    cold->f = io_figures(&a, &b, secs, cold->n);
    return 0;
}

/* The disk's rate for the expert cache's pattern now (o->disk_s seconds of
 * that pattern alone), or NAN. */
static double ec_disk_now(const bench_opts_t *o, const char *path, const ec_row_t *er) {
    if (!er->disk_ok || o->disk_s <= 0) return NAN;
    bench_disk_t d;
    char msg[256];
    if (bench_disk_probe(path, er->slot_bytes, er->disk_readers, o->disk_s, 0, &d, msg, sizeof msg)) return NAN;
    return d.rand_gbps;
}

/* A row's I/O roofline against the disk probe's pattern (the probes
 * bracketing the row where there are both, else the one at the start): the fastest decode
 * the disk allows for the bytes it reads per token, the row's share of
 * it, compute time per token (what is not waiting on reads) and the time
 * the token's reads take at the pattern's rate. */
static void ec_roofline(row_t *r, double secs, double tokens, double wait_s) {
    ec_row_t *e = &r->ec;
    e->roof_tok_s = e->roof_pct = e->io_ms = e->compute_ms = NAN;
    double rate = e->disk_ok ? e->disk_rand_gbps : 0;
    if (e->disk_before_gbps > 0 && e->disk_after_gbps > 0) rate = (e->disk_before_gbps + e->disk_after_gbps) / 2;
    if (!isnan(e->gb_tok) && rate > 0) {
        e->io_ms = e->gb_tok / rate * 1e3;
        if (e->gb_tok >= 1e-4) { /* a row that reads under 100 kB per token (a file in the page cache) has no I/O
                                  * roofline worth printing */
            e->roof_tok_s = rate / e->gb_tok;
            e->roof_pct = 100.0 * r->tok_s / e->roof_tok_s;
        }
    }
    if (tokens > 0 && !isnan(wait_s)) e->compute_ms = (secs - wait_s) / tokens * 1e3;
    else if (tokens > 0 && e->gb_tok == 0) e->compute_ms = secs / tokens * 1e3; /* through the mapping, nothing read */
}

/* The pp and tg rows of one context: per length, a warm-up run, then -r
 * timed repetitions. Expert rows (er) also take the I/O over the
 * repetitions, and the tg row of the cold run's length its cold figures. */
static int pptg_tests(const bench_opts_t *o, int mi, tern_model_t *m, tern_context_t *c, int ti, double probe_gbps,
                      void *pbuf, size_t probe_bytes, const int32_t *ids, double *secs, double *pass, double *pct,
                      const ec_row_t *er, const ec_cold_t *cold, row_t *rows, int *n_rows) {
    tern_error_t err = {0};
    for (int kind = 0; kind < 2; kind++) {
        const ilist_t *l = kind ? &o->tg : &o->pp;
        for (int k = 0; k < l->n; k++) {
            int n = l->v[k];
            if (n == 0) continue;
            /* expert rows: the warm-up on the second stretch, repetition r
             * on stretch r + 2 (the cold run took the first) */
            const int stride = er ? n : 0;
            double warm;
            if (run_test(c, ids + stride, n, kind, &warm, &err)) {
                fprintf(stderr, "tern bench: %s\n", err.msg);
                return -1;
            }
            const double disk_before = kind && er ? ec_disk_now(o, o->models[mi], er) : NAN;
            tern_context_timings_reset(c);
            io_mark_t ia, ib;
            io_mark(m, &ia);
            double total = 0;
            for (int r = 0; r < o->reps; r++) {
                pass[r] = kind && pbuf ? bench_probe_pass_gbps(o->threads.v[ti], pbuf, probe_bytes) : -1.0;
                if (run_test(c, ids + (size_t)(r + 2) * stride, n, kind, &secs[r], &err)) {
                    fprintf(stderr, "tern bench: %s\n", err.msg);
                    return -1;
                }
                total += secs[r];
            }
            io_mark(m, &ib);
            const double disk_after = kind && er ? ec_disk_now(o, o->models[mi], er) : NAN;
            double *tps = secs; /* converted in place */
            for (int r = 0; r < o->reps; r++) tps[r] = n / secs[r];
            row_t *row = &rows[(*n_rows)++];
            row_init(row, o->models[mi], mi, m, c);
            row->is_tg = kind;
            snprintf(row->test, sizeof row->test, "%s%d", kind ? "tg" : "pp", n);
            mean_sd(tps, o->reps, &row->tok_s, &row->tok_s_sd);
            row->probe_gbps = probe_gbps;
            if (kind) {
                tern_timings_t t;
                tern_context_timings(c, &t);
                row->weights_gbps = row->tok_s * (double)row->bytes_per_token / 1e9;
                row->roofline_pct = probe_gbps > 0 ? 100.0 * row->weights_gbps / probe_gbps : 0;
                row->probe_now_gbps = row->roofline_pct_now = NAN;
                int np = 0;
                for (int r = 0; r < o->reps; r++)
                    if (pass[r] > 0) pct[np++] = 100.0 * tps[r] * (double)row->bytes_per_token / 1e9 / pass[r];
                if (np == o->reps) {
                    row->roofline_pct_now = bench_median(pct, np);
                    row->probe_now_gbps = bench_median(pass, np);
                }
                row->dispatches_per_token = t.n_gen ? (double)t.gen_dispatches / (double)t.n_gen : 0;
                if (o->profile) {
                    tern_profile_t p;
                    tern_context_profile(c, &p);
                    double tot = (double)(p.qkv + p.attn + p.wo + p.ffn_up + p.ffn_down + p.output + p.small);
                    if (tot <= 0) tot = 1;
                    fprintf(stderr,
                            "tern bench: profile %s t=%d %s: qkv %.1f%%, attention %.1f%%, o %.1f%%, gate/up "
                            "%.1f%%, down %.1f%%, output %.1f%%, small ops %.1f%% (%.3f ms/token)\n",
                            row->model, row->threads, row->test, 100 * p.qkv / tot, 100 * p.attn / tot,
                            100 * p.wo / tot, 100 * p.ffn_up / tot, 100 * p.ffn_down / tot, 100 * p.output / tot,
                            100 * p.small / tot, p.n_tokens ? tot / 1e6 / (double)p.n_tokens : 0.0);
                }
            }
            fprintf(stderr, "tern bench: %s t=%d", row->model, row->threads);
            if (er) {
                const double tokens = (double)o->reps * n;
                const io_fig_t f = io_figures(&ia, &ib, total, tokens);
                row->ec = *er;
                row->ec.disk_before_gbps = disk_before;
                row->ec.disk_after_gbps = disk_after;
                row->ec.hit_rate = f.hit_rate;
                row->ec.gb_tok = f.gb_tok;
                row->ec.io_gbps = f.io_gbps;
                row->ec.wait_share = f.wait_share;
                row->ec.pred = f.pred;
                row->ec.cold_tok_s = row->ec.cold_hit_rate = row->ec.cold_gb_tok = row->ec.cold_io_gbps =
                    row->ec.cold_wait_share = NAN;
                if (kind && cold->n == n) {
                    row->ec.cold_tok_s = cold->tok_s;
                    row->ec.cold_hit_rate = cold->f.hit_rate;
                    row->ec.cold_gb_tok = cold->f.gb_tok;
                    row->ec.cold_io_gbps = cold->f.io_gbps;
                    row->ec.cold_wait_share = cold->f.wait_share;
                }
                ec_roofline(row, total, tokens, f.wait_s);
                fprintf(stderr, " expert cache %s", er->setting);
                if (o->prefetch.n && er->active) fprintf(stderr, " prefetch %s", er->prefetch ? "on" : "off");
                if (o->pin.n && er->active) fprintf(stderr, " pin %s", er->pin ? "on" : "off");
            }
            fprintf(stderr, " %s: %.2f ± %.2f tok/s", row->test, row->tok_s, row->tok_s_sd);
            if (er && !isnan(row->ec.cold_tok_s)) fprintf(stderr, ", cold %.2f tok/s", row->ec.cold_tok_s);
            if (er && !isnan(row->ec.hit_rate)) fprintf(stderr, ", hit rate %.1f%%", 100 * row->ec.hit_rate);
            fprintf(stderr, "\n");
        }
    }
    return 0;
}

/* --busy: the child's spinning threads, each on a counter of its own (no
 * shared cache line: the load is cores taken, not memory traffic). */
static void *busy_spin(void *arg) {
    (void)arg;
    volatile uint64_t counter = 0;
    for (;;) counter++;
    return NULL;
}

/* Fork the --busy child: it asks to be killed when tern dies, starts its
 * threads, says so through a pipe and sleeps. 0 when they all spin. */
static int busy_start(bench_opts_t *o) {
    int fd[2];
    if (pipe(fd) != 0) {
        fprintf(stderr, "tern bench: --busy: pipe: %s\n", strerror(errno));
        return -1;
    }
    const pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "tern bench: --busy: fork: %s\n", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        close(fd[0]);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
        if (getppid() != parent) _exit(1); /* tern is already gone */
        for (int i = 0; i < o->busy; i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, busy_spin, NULL) != 0) _exit(1);
        }
        const char ok = 1;
        if (write(fd[1], &ok, 1) != 1) _exit(1);
        close(fd[1]);
        for (;;) pause();
    }
    close(fd[1]);
    o->busy_pid = pid;
    char ok = 0;
    ssize_t got;
    do got = read(fd[0], &ok, 1);
    while (got < 0 && errno == EINTR);
    close(fd[0]);
    if (got != 1) {
        fprintf(stderr, "tern bench: --busy: the spinning process did not start its %d threads\n", o->busy);
        return -1;
    }
    fprintf(stderr, "tern bench: busy: %d spinning thread%s in another process (pid %ld)\n", o->busy,
            o->busy == 1 ? "" : "s", (long)pid);
    return 0;
}

/* Kill and reap the --busy child, if there is one. */
static void busy_stop(bench_opts_t *o) {
    if (o->busy_pid <= 0) return;
    kill(o->busy_pid, SIGKILL);
    while (waitpid(o->busy_pid, NULL, 0) < 0 && errno == EINTR) {}
    o->busy_pid = 0;
}

static int bench_model(const bench_opts_t *opts);

int cmd_bench_model(int argc, char **argv) {
    bench_opts_t o;
    int prc = parse_opts(&o, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    if (o.llc_set) {
        char det[200];
        const size_t d = bench_llc_bytes(det, sizeof det);
        o.llc_bytes = (size_t)(o.llc_mb * 1048576.0);
        if (d)
            snprintf(o.llc_src, sizeof o.llc_src, "--llc-mb %g; detected %.1f MiB, %s", o.llc_mb,
                     (double)d / 1048576.0, det);
        else snprintf(o.llc_src, sizeof o.llc_src, "--llc-mb %g; detected: %s", o.llc_mb, det);
    } else {
        o.llc_bytes = bench_llc_bytes(o.llc_src, sizeof o.llc_src);
    }
    if (o.llc_bytes)
        fprintf(stderr, "tern bench: last-level cache %.1f MiB (%s)\n", (double)o.llc_bytes / 1048576.0, o.llc_src);
    else
        fprintf(stderr, "tern bench: last-level cache unknown (%s): no row is labelled LLC-resident\n", o.llc_src);
    int rc;
    if (o.busy && busy_start(&o)) rc = 1;
    else rc = bench_model(&o);
    busy_stop(&o);
    return rc;
}

/* The run itself, with the options parsed (and the --busy child running). */
static int bench_model(const bench_opts_t *opts) {
    bench_opts_t o = *opts;
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

    const int max_rows = o.n_models * o.threads.n * (o.np.n ? o.pp.n * o.tg.n * o.np.n : o.pp.n + o.tg.n) *
                         (o.ec_mode ? ec_n_settings(&o) : 1);
    /* Loads of the plain rows: the defaults, with --io-threads. */
    model_args_t plain;
    model_args_init(&plain);
    plain.io_threads = o.io_threads;
    /* Expert rows: the usage counts of this run, in a folder of its own. */
    char usage_dir[4096] = "";
    if (o.ec_mode) {
        const char *tmp = getenv("TMPDIR");
        snprintf(usage_dir, sizeof usage_dir, "%s/tern-bench-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(usage_dir)) {
            fprintf(stderr, "tern bench: cannot make a folder %s: %s\n", usage_dir, strerror(errno));
            bench_big_free(pbuf, probe_bytes);
            return 1;
        }
    }
    row_t *rows = calloc((size_t)max_rows, sizeof *rows);
    /* Expert rows take a fresh stretch of tokens for every run (the cold
     * one, the warm-up, each repetition): repeating a run's tokens would
     * route to the same experts and find them all cached. */
    const int ids_len = o.ec_mode ? max_n * (o.reps + 2) : max_n;
    int32_t *ids = malloc((size_t)ids_len * sizeof *ids);
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
        const char *path = o.models[mi];
        ec_model_t em;
        if (o.ec_mode && ec_model_prepare(&o, path, mi, usage_dir, &em)) {
            rc = 1;
            break;
        }
        /* A dense model takes the expert options and ignores them: one setting. */
        const int n_set = o.ec_mode && em.expert_bytes ? ec_n_settings(&o) : 1;
        if (o.ec_mode && !em.expert_bytes)
            fprintf(stderr, "tern bench: %s is a dense model: the expert options do not apply to it\n", base_name(path));
        tern_model_t *m = NULL;
        int32_t *greedy_ref = NULL;
        int greedy_same = 1, n_greedy = 0;
        for (int si = 0; si < n_set && rc == 0; si++) {
            if (o.ec_mode && !ec_first_combo(&o, si)) {
                int ci, pf, pn;
                ec_setting(&o, si, &ci, &pf, &pn);
                if (o.caches[ci].kind == MA_CACHE_MMAP) continue;
            }
            for (int ti = 0; ti < o.threads.n && rc == 0; ti++) {
                ec_row_t er = {0};
                if (!m) {
                    /* Once per model, or (expert rows) once per row: the cache lives per load. */
                    m = o.ec_mode ? ec_load(&o, path, &em, si, &er) : model_args_load(path, &plain, "bench");
                    if (!m) {
                        rc = 1;
                        break;
                    }
                    if (o.ec_mode && !er.active && !ec_first_combo(&o, si)) { /* auto, through the mapping */
                        tern_model_free(m);
                        m = NULL;
                        break;
                    }
                    fill_tokens(ids, ids_len, tern_model_n_vocab(m), 42);
                    for (int s = 0; s < max_np; s++) /* -np: a prompt of its own per sequence */
                        fill_tokens(nb.prompts + (size_t)s * nb.pp_stride, nb.pp_stride, tern_model_n_vocab(m),
                                    1000 + (uint64_t)s);
                }
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
                /* Expert rows: the cold rate, the first tg repetition right after the load. */
                ec_cold_t cold = {0};
                if (o.ec_mode && ec_cold_run(&o, m, c, ids, &cold, &err)) {
                    fprintf(stderr, "tern bench: %s\n", err.msg);
                    rc = 1;
                }
                if (rc == 0 && o.np.n &&
                    np_tests(&o, mi, m, c, probe[ti], pbuf, probe_bytes, &nb, secs, pass, pct, rows, &n_rows))
                    rc = 1;
                if (rc == 0 && !o.np.n &&
                    pptg_tests(&o, mi, m, c, ti, probe[ti], pbuf, probe_bytes, ids, secs, pass, pct,
                               o.ec_mode ? &er : NULL, &cold, rows, &n_rows))
                    rc = 1;
                if (rc == 0 && o.check > 0) {
                    /* Greedy from token ids[0], compared across thread counts (and expert settings:
                     * the cache does not change the logits either). */
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
                        fprintf(stderr, "tern bench: %s t=%d", base_name(path), tern_context_threads(c));
                        if (o.ec_mode) fprintf(stderr, " expert cache %s", er.setting);
                        fprintf(stderr, " greedy tokens:");
                        for (int i = 0; i < o.check; i++) fprintf(stderr, " %d", g[i]);
                        fprintf(stderr, "\n");
                        n_greedy++;
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
                if (o.ec_mode) {
                    tern_model_free(m);
                    m = NULL;
                }
            }
        }
        if (rc == 0 && o.check > 0 && n_greedy > 1) {
            fprintf(stderr, "tern bench: %s: %d greedy tokens %s at threads", base_name(path), o.check,
                    greedy_same ? "IDENTICAL" : "DIFFERENT");
            for (int ti = 0; ti < o.threads.n; ti++) fprintf(stderr, "%s%d", ti ? "," : " ", o.threads.v[ti]);
            if (n_set > 1) fprintf(stderr, " and %d expert settings", n_set);
            fprintf(stderr, "\n");
            if (!greedy_same) rc = 1;
        }
        free(greedy_ref);
        tern_model_free(m);
    }
    for (int i = 0; i < n_rows; i++) /* an N = 1 row may come after the others (-np 8,1) */
        if (rows[i].n_seq) rows[i].speedup = np_speedup(rows, n_rows, &rows[i]);
    for (int i = 0; i < n_rows; i++) {
        row_t *r = &rows[i];
        r->llc_resident = r->is_tg && o.llc_bytes > 0 && r->bytes_per_token > 0 && r->bytes_per_token <= o.llc_bytes;
        r->busy = o.busy;
    }
    if (n_rows) print_rows(&o, rows, n_rows, probe, &o.threads);
out:
    if (usage_dir[0]) {
        for (int mi = 0; mi < o.n_models; mi++) {
            char f[4200];
            snprintf(f, sizeof f, "%s/model%d.usage", usage_dir, mi);
            unlink(f);
            snprintf(f, sizeof f, "%s/model%d.usage.tmp", usage_dir, mi);
            unlink(f);
        }
        rmdir(usage_dir);
    }
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
