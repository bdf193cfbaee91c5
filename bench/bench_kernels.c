/*
 * bench_kernels.c - `tern bench kernels [--json] [--quick]`: how close the
 * kernels get to the machine's read bandwidth, per format, ISA and thread
 * count, all measured in one run so the ratios hold even on a noisy box.
 *
 *   probe    read bandwidth of a buffer >> LLC at 1 and 2 threads (probe.h)
 *   matvec   4096 x 4096 matrices cycled over a working set >> LLC (1 GiB
 *            by default), so every weight byte comes from RAM: GB/s of
 *            weights and % of the probe at the same thread count
 *   matvec2  the same with two inputs per pass; reported as its cost
 *            relative to one matvec (1.0 = free second input)
 *   cached   the matvec on about 1 MiB of weights per thread, called over
 *            and over, so the weights stay in L2: what the kernel computes
 *            when memory is not the limit (GB/s of weights), i.e. how much
 *            headroom it has over the read bandwidth
 *   gemm     1024 x 4096 of the same weights times N = 1, 16, 64, 512
 *            columns, GFLOP/s (2 * rows * K * N / time); the weights stay
 *            in cache across calls here, the point is the compute rate
 *            (fewer rows for a kernel too slow to run 1024 in ~0.1 s).
 *            x_matvec = GEMM GFLOP/s over matvec GFLOP/s: how much faster
 *            per column prefill is than decode.
 * GEMM timings are the best of a few calls (the minimum is the least noisy
 * estimate of what the code can do).
 *
 * --gemm-n LIST: only the probe and, per format, ISA and thread count, the
 * GEMM of the matvec's matrices with weights from RAM (what batched decode
 * runs: N sequences, one token each): every call takes the next matrix of
 * the working set (nothing is read again before the whole set has been),
 * N = 1 is kern_gemm with one column (the matvec). Measured in rounds; in
 * each round every N runs one slice (order rotated from round to round),
 * and the ratio time(N) / time(1) is taken within the round; reported are
 * the medians over the rounds: ms per matrix, that ratio (1.0 = the extra
 * columns are free, N = perfect scaling of nothing), GFLOP/s and GB/s of
 * weights.
 *
 * Paired rounds: on a shared machine the bandwidth left to us drifts by
 * tens of percent within seconds (other tenants' memory traffic; it shows
 * as neither steal nor load here), so a matvec compared with the probe
 * taken at the start of the run can look 20 points better or worse than it
 * is. The matvec is therefore measured in rounds: each round runs, back to
 * back, one pass of the probe's winning pattern, a slice of matvecs and a
 * slice of matvec2 calls, each over a different quarter of the working set
 * (so nothing is read again before three other quarters have been: no
 * last-level-cache hits), about 10-50 ms each. Every round gives a ratio
 * taken at one moment (matvec / probe, matvec2 / matvec); the medians over
 * the rounds are reported (pct_of_probe_now, with the lowest and highest
 * round; matvec2 ratio), and gbps is the median matvec slice. pct_of_probe
 * is against the start-of-run probe.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "core/common.h"
#include "core/cpu.h"
#include "kernels/kernels.h"
#include "probe.h"

/* The matvec matrices: g_rows x g_cols (--shape; default 4096 x 4096). The
 * GEMM runs BK_GEMM_ROWS rows of the same columns. */
static int64_t g_rows = 4096, g_cols = 4096;
#define BK_GEMM_ROWS 1024
#define BK_MAX_N 512
#define BK_THREADS 2

typedef struct {
    const char *op;
    int format; /* -1: none */
    int isa;    /* -1: none */
    int threads;
    int64_t n; /* 0: none */
    double gbps, pct, gflops, ns, ratio, x_matvec; /* NaN: none */
    double probe_now, pct_now, pct_lo, pct_hi; /* matvec: the paired probe (see above) and % of it */
    double cached;                             /* matvec: cache-resident GB/s (see above) */
} rec_t;

typedef struct {
    rec_t *v;
    int n, cap;
} recs_t;

static rec_t *rec_add(recs_t *r, const char *op, int format, int isa, int threads) {
    if (r->n == r->cap) {
        int cap = r->cap ? r->cap * 2 : 64;
        rec_t *nv = realloc(r->v, sizeof *nv * (size_t)cap);
        if (!nv) return NULL;
        r->v = nv;
        r->cap = cap;
    }
    rec_t *e = &r->v[r->n++];
    *e = (rec_t){op, format, isa, threads, 0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
    return e;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern bench kernels [--json] [--quick] [--format LIST] [--isa LIST] [--set-mb N] [--shape RxC]\n"
            "                          [--gemm-n LIST] [--threads LIST]\n"
            "  --json         print a JSON array of measurements instead of markdown\n"
            "  --quick        fewer rounds, a 512 MiB working set, GEMM up to N = 64\n"
            "  --format LIST  comma-separated formats (default: every weight format)\n"
            "  --isa LIST     comma-separated ISAs among scalar,avx2,avx512 (default: all this CPU has)\n"
            "  --set-mb N     matvec working set in MiB (default 1024; keep it >> the LLC)\n"
            "  --shape RxC    matvec matrices of R rows x C columns (default 4096x4096; e.g. 576x576,\n"
            "                 SmolLM2's attention; formats whose block does not divide C are skipped)\n"
            "  --gemm-n LIST  only GEMM with weights from RAM (batched decode) for these column counts,\n"
            "                 e.g. 1,2,4,8,16: time per matrix relative to N = 1 (the matvec), GFLOP/s\n"
            "  --threads LIST thread counts among 1,2 (default both)\n");
}

/* Split a comma list, mapping each item through fn (-1 = unknown). */
static int parse_list(const char *s, int (*fn)(const char *), int *out, int max, const char *what) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v = fn(t);
        if (v < 0 || n == max) {
            fprintf(stderr, "tern bench kernels: unknown or too many %s '%s'\n", what, t);
            return -1;
        }
        out[n++] = v;
    }
    return n;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float randn(void) {
    /* Box-Muller over xorshift: enough for benchmark data. */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    double u1 = ((g_rng >> 11) + 1.0) / 9007199254740993.0;
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    double u2 = (g_rng >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* The working set: nmat matrices of g_rows x g_cols back to back, filled by
 * replicating a quantized tile of random rows (content does not change the
 * speed; quantizing a whole GiB would take minutes for the K formats). */
typedef struct {
    char *buf;
    size_t bytes, mat_bytes, row_bytes;
    int nmat;
} wset_t;

static int wset_make(wset_t *w, int type, size_t set_bytes) {
    memset(w, 0, sizeof *w);
    w->row_bytes = quant_row_size(type, g_cols);
    if (!w->row_bytes) return -1;
    w->mat_bytes = w->row_bytes * g_rows;
    w->nmat = (int)((set_bytes + w->mat_bytes - 1) / w->mat_bytes);
    if (w->nmat < 4) w->nmat = 4; /* four quarters (paired rounds) */
    w->bytes = w->mat_bytes * (size_t)w->nmat;
    const int tile_rows = 64;
    char *tile = tern_alloc(w->row_bytes * tile_rows);
    float *src = malloc(sizeof(float) * g_cols);
    if (!tile || !src) goto fail;
    for (int r = 0; r < tile_rows; r++) {
        for (int i = 0; i < g_cols; i++) src[i] = 0.02f * randn();
        if (quant_quantize_row(type, src, tile + (size_t)r * w->row_bytes, g_cols) != 0) {
            fprintf(stderr, "tern bench kernels: cannot quantize to %s\n", quant_name(type));
            goto fail;
        }
    }
    w->buf = bench_big_alloc(w->bytes);
    if (!w->buf) goto fail;
    const size_t tb = w->row_bytes * tile_rows;
    for (size_t off = 0; off < w->bytes; off += tb) memcpy(w->buf + off, tile, off + tb <= w->bytes ? tb : w->bytes - off);
    tern_free(tile);
    free(src);
    return 0;
fail:
    tern_free(tile);
    free(src);
    return -1;
}

static void wset_free(wset_t *w) {
    bench_big_free(w->buf, w->bytes);
    w->buf = NULL;
}

static kern_mat_t wset_mat(const wset_t *w, int type, int i, int64_t rows) {
    return (kern_mat_t){type, rows, g_cols, w->row_bytes, w->buf + (size_t)i * w->mat_bytes};
}

typedef struct {
    float *x, *x2, *y, *y2; /* vectors of g_cols / g_rows */
    float *gx, *gy;         /* BK_MAX_N columns */
} bufs_t;

/* The quarters of the working set for the paired rounds: quarter q holds
 * matrices [q * per, (q + 1) * per). */
static int wset_per_quarter(const wset_t *w) {
    return w->nmat / 4;
}

/* One slice: matvecs (two: matvec2) over the matrices of quarter q from
 * its first on, until the quarter ends or budget_ns has passed (at least
 * one call; a slow kernel is compute bound and needs no full quarter to be
 * measured). Returns GB/s of weights (bytes per ns), or -1 on error. */
static double slice_gbps(tern_pool_t *pool, const wset_t *w, int type, int q, bool two, double budget_ns,
                         const bufs_t *b, tern_error_t *err) {
    const int per = wset_per_quarter(w);
    const uint64_t t0 = tern_now_ns();
    uint64_t t = t0;
    int done = 0;
    while (done < per && (done == 0 || (double)(t - t0) < budget_ns)) {
        kern_mat_t m = wset_mat(w, type, q * per + done, g_rows);
        int rc = two ? kern_matvec2(pool, &m, b->x, b->x2, b->y, b->y2, err) : kern_matvec(pool, &m, b->x, b->y, err);
        if (rc) return -1.0;
        done++;
        t = tern_now_ns();
    }
    return (double)w->mat_bytes * done / (double)(t - t0);
}

/* The cache-resident matvec (header: "cached"): GB/s of the best of 5
 * runs of ~10 ms over the same few rows, about CACHED_BYTES per thread. */
#define CACHED_BYTES (1u << 20)
static double cached_gbps(tern_pool_t *pool, int threads, const wset_t *w, int type, const bufs_t *b,
                          tern_error_t *err) {
    int64_t rows = (int64_t)((size_t)CACHED_BYTES * (size_t)threads / w->row_bytes) / 16 * 16;
    if (rows < 16) rows = 16;
    if (rows > g_rows) rows = g_rows;
    kern_mat_t m = wset_mat(w, type, 0, rows);
    if (kern_matvec(pool, &m, b->x, b->y, err)) return -1.0; /* into cache */
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        const uint64_t t0 = tern_now_ns();
        uint64_t t = t0;
        int done = 0;
        while (done < 3 || (double)(t - t0) < 1e7) {
            if (kern_matvec(pool, &m, b->x, b->y, err)) return -1.0;
            done++;
            t = tern_now_ns();
        }
        const double g = (double)w->row_bytes * (double)rows * done / (double)(t - t0);
        if (g > best) best = g;
    }
    return best;
}

#define BK_MAX_ROUNDS 15
typedef struct {
    double mv_gbps, mv2_gbps; /* median slices */
    double probe_gbps;        /* median probe pass */
    double pct_now, pct_lo, pct_hi; /* 100 * matvec / probe of the same round: median, lowest, highest */
    double mv2_ratio;         /* median of matvec2 time / matvec time per matrix, same round */
} rounds_t;

/* The paired rounds of the header comment. Returns 0, or -1 with err set
 * (a kernel error) or err->code == 0 (the probe failed). */
static int run_rounds(tern_pool_t *pool, int threads, const wset_t *w, int type, int rounds, double budget_ns,
                      const bufs_t *b, rounds_t *out, tern_error_t *err) {
    double P[BK_MAX_ROUNDS], M[BK_MAX_ROUNDS], M2[BK_MAX_ROUNDS], R[BK_MAX_ROUNDS], C[BK_MAX_ROUNDS];
    const size_t qbytes = (size_t)wset_per_quarter(w) * w->mat_bytes;
    TERN_CHECK(rounds >= 1 && rounds <= BK_MAX_ROUNDS);
    for (int i = 0; i < rounds; i++) {
        /* op k of the run uses quarter k mod 4: three ops per round */
        const int q = (3 * i) % 4;
        P[i] = bench_probe_pass_gbps(threads, w->buf + (size_t)q * qbytes, qbytes);
        if (P[i] <= 0) return -1;
        M[i] = slice_gbps(pool, w, type, (q + 1) % 4, false, budget_ns, b, err);
        if (M[i] < 0) return -1;
        M2[i] = slice_gbps(pool, w, type, (q + 2) % 4, true, budget_ns, b, err);
        if (M2[i] < 0) return -1;
        R[i] = 100.0 * M[i] / P[i];
        C[i] = M[i] / M2[i];
    }
    out->mv_gbps = bench_median(M, rounds);
    out->mv2_gbps = bench_median(M2, rounds);
    out->probe_gbps = bench_median(P, rounds);
    out->pct_now = bench_median(R, rounds); /* sorted now */
    out->pct_lo = R[0];
    out->pct_hi = R[rounds - 1];
    out->mv2_ratio = bench_median(C, rounds);
    return 0;
}

/* Best ns of one GEMM call, repeated for at least min_ns in all. */
static double time_gemm(tern_pool_t *pool, const kern_mat_t *m, int64_t n, double min_ns, const bufs_t *b,
                        tern_error_t *err) {
    double best = INFINITY, total = 0;
    for (int rep = 0; rep < 1000 && (rep < 2 || total < min_ns); rep++) {
        uint64_t t0 = tern_now_ns();
        if (kern_gemm(pool, m, n, b->gx, g_cols, b->gy, m->rows, err)) return -1.0;
        double t = (double)(tern_now_ns() - t0);
        total += t;
        if (t < best) best = t;
    }
    return best;
}

/* ---- --gemm-n: GEMM with weights from RAM --------------------------------- */

#define BK_MAX_GN 16
typedef struct {
    int cur; /* next matrix of the working set */
} gcursor_t;

/* One slice of GEMM calls with n columns, each on the next matrix of the
 * working set, for about budget_ns (at least 2 calls). Returns ns per
 * matrix, or -1 on error. */
static double gemm_slice_ns(tern_pool_t *pool, const wset_t *w, int type, int64_t n, double budget_ns,
                            gcursor_t *gc, const bufs_t *b, tern_error_t *err) {
    const uint64_t t0 = tern_now_ns();
    uint64_t t = t0;
    int done = 0;
    while (done < 2 || (double)(t - t0) < budget_ns) {
        kern_mat_t m = wset_mat(w, type, gc->cur, g_rows);
        gc->cur = (gc->cur + 1) % w->nmat;
        if (kern_gemm(pool, &m, n, b->gx, g_cols, b->gy, g_rows, err)) return -1.0;
        done++;
        t = tern_now_ns();
    }
    return (double)(t - t0) / done;
}

/* The rounds of --gemm-n for one (format, ISA, pool): per N the median ns
 * per matrix and the median of time(N) / time(N = ns[0]) within a round. */
static int gemm_ram_rounds(tern_pool_t *pool, const wset_t *w, int type, const int64_t *ns, int nn, int rounds,
                           double budget_ns, const bufs_t *b, double *med_ns, double *med_ratio, tern_error_t *err) {
    double T[BK_MAX_GN][BK_MAX_ROUNDS], R[BK_MAX_GN][BK_MAX_ROUNDS];
    gcursor_t gc = {0};
    TERN_CHECK(rounds >= 1 && rounds <= BK_MAX_ROUNDS && nn >= 1 && nn <= BK_MAX_GN);
    /* warm-up: code, workspaces, the pool's threads */
    for (int j = 0; j < nn; j++)
        if (gemm_slice_ns(pool, w, type, ns[j], 0, &gc, b, err) < 0) return -1;
    for (int i = 0; i < rounds; i++) {
        double t[BK_MAX_GN];
        for (int jj = 0; jj < nn; jj++) {
            const int j = (jj + i) % nn;
            t[j] = gemm_slice_ns(pool, w, type, ns[j], budget_ns, &gc, b, err);
            if (t[j] < 0) return -1;
        }
        for (int j = 0; j < nn; j++) T[j][i] = t[j], R[j][i] = t[j] / t[0];
    }
    for (int j = 0; j < nn; j++) {
        med_ns[j] = bench_median(T[j], rounds);
        med_ratio[j] = bench_median(R[j], rounds);
    }
    return 0;
}

static void print_gemm_ram_markdown(const recs_t *r, size_t set_bytes) {
    printf("AMX %s\n\n## Read bandwidth probe\n\n| threads | GB/s |\n|---:|---:|\n", kern_amx_status());
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].op, "probe")) printf("| %d | %.1f |\n", r->v[i].threads, r->v[i].gbps);
    printf("\n## GEMM with weights from RAM (%lld x %lld matrices over a %.0f MiB working set)\n\n",
           (long long)g_rows, (long long)g_cols, (double)set_bytes / 1048576.0);
    printf("| format | isa | t | N | ms / matrix | time / time(N=1) | GFLOP/s | weights GB/s |\n"
           "|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < r->n; i++) {
        const rec_t *e = &r->v[i];
        if (strcmp(e->op, "gemm_ram")) continue;
        printf("| %s | %s | %d | %lld | %.3f | %.2f | %.1f | %.1f |\n", quant_name(e->format),
               kern_isa_name((kern_isa_t)e->isa), e->threads, (long long)e->n, e->ns / 1e6, e->ratio, e->gflops,
               e->gbps);
    }
}

static void print_num(FILE *f, const char *key, double v, bool *first) {
    if (isnan(v)) return;
    fprintf(f, "%s\"%s\": %.6g", *first ? "" : ", ", key, v);
    *first = false;
}

static void print_json(const recs_t *r) {
    printf("[\n");
    for (int i = 0; i < r->n; i++) {
        const rec_t *e = &r->v[i];
        printf("  {\"op\": \"%s\"", e->op);
        if (e->format >= 0) printf(", \"format\": \"%s\"", quant_name(e->format));
        if (e->isa >= 0) printf(", \"isa\": \"%s\"", kern_isa_name((kern_isa_t)e->isa));
        printf(", \"threads\": %d", e->threads);
        if (e->n > 0) printf(", \"n\": %lld", (long long)e->n);
        if (!strcmp(e->op, "matvec") || !strcmp(e->op, "matvec2") || !strcmp(e->op, "gemm_ram"))
            printf(", \"rows\": %lld, \"cols\": %lld", (long long)g_rows, (long long)g_cols);
        bool first = false;
        print_num(stdout, "gbps", e->gbps, &first);
        print_num(stdout, "pct_of_probe", e->pct, &first);
        print_num(stdout, "gflops", e->gflops, &first);
        print_num(stdout, "ns", e->ns, &first);
        print_num(stdout, "ratio", e->ratio, &first);
        print_num(stdout, "x_matvec", e->x_matvec, &first);
        print_num(stdout, "probe_now_gbps", e->probe_now, &first);
        print_num(stdout, "pct_of_probe_now", e->pct_now, &first);
        print_num(stdout, "pct_of_probe_now_min", e->pct_lo, &first);
        print_num(stdout, "pct_of_probe_now_max", e->pct_hi, &first);
        print_num(stdout, "cached_gbps", e->cached, &first);
        printf("}%s\n", i + 1 < r->n ? "," : "");
    }
    printf("]\n");
}

static const rec_t *find(const recs_t *r, const char *op, int format, int isa, int threads, int64_t n) {
    for (int i = 0; i < r->n; i++) {
        const rec_t *e = &r->v[i];
        if (!strcmp(e->op, op) && e->format == format && e->isa == isa && e->threads == threads && e->n == n)
            return e;
    }
    return NULL;
}

static void cell(double v, const char *fmt) {
    if (isnan(v))
        printf(" - |");
    else {
        printf(" ");
        printf(fmt, v);
        printf(" |");
    }
}

static void print_markdown(const recs_t *r, const int64_t *ns, int n_ns, size_t set_bytes) {
    printf("AMX %s\n\n## Read bandwidth probe\n\n| threads | GB/s |\n|---:|---:|\n", kern_amx_status());
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].op, "probe")) printf("| %d | %.1f |\n", r->v[i].threads, r->v[i].gbps);
    printf("\n## Kernels (matvec %lld x %lld over a %.0f MiB working set; GEMM %d x %lld, GFLOP/s)\n\n",
           (long long)g_rows, (long long)g_cols, (double)set_bytes / 1048576.0, BK_GEMM_ROWS, (long long)g_cols);
    printf("| format | isa | t | matvec GB/s | %% of probe | probe now | %% of probe now (lowest-highest round) | cached GB/s | matvec2 / matvec |");
    for (int i = 0; i < n_ns; i++) printf(" gemm N=%lld |", (long long)ns[i]);
    printf(" gemm64 / matvec |\n|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (int i = 0; i < n_ns; i++) printf("---:|");
    printf("---:|\n");
    for (int i = 0; i < r->n; i++) {
        const rec_t *e = &r->v[i];
        if (strcmp(e->op, "matvec")) continue;
        printf("| %s | %s | %d |", quant_name(e->format), kern_isa_name((kern_isa_t)e->isa), e->threads);
        cell(e->gbps, "%.1f");
        cell(e->pct, "%.0f%%");
        cell(e->probe_now, "%.1f");
        if (isnan(e->pct_now))
            printf(" - |");
        else
            printf(" %.0f%% (%.0f-%.0f) |", e->pct_now, e->pct_lo, e->pct_hi);
        cell(e->cached, "%.1f");
        const rec_t *m2 = find(r, "matvec2", e->format, e->isa, e->threads, 0);
        cell(m2 ? m2->ratio : NAN, "%.2f");
        for (int j = 0; j < n_ns; j++) {
            const rec_t *g = find(r, "gemm", e->format, e->isa, e->threads, ns[j]);
            cell(g ? g->gflops : NAN, "%.1f");
        }
        const rec_t *g64 = find(r, "gemm", e->format, e->isa, e->threads, 64);
        cell(g64 ? g64->x_matvec : NAN, "%.1fx");
        printf("\n");
    }
}

int bench_kernels_main(int argc, char **argv) {
    bool json = false, quick = false;
    int formats[TYPE_COUNT], nf = 0;
    int isas[ISA_COUNT], ni = 0;
    double set_mb = 1024;
    int64_t gns[BK_MAX_GN];
    int ngn = 0;
    int thr[BK_THREADS], nthr = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--quick")) {
            quick = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "--format") || !strcmp(a, "--isa") || !strcmp(a, "--set-mb") ||
                    !strcmp(a, "--shape") || !strcmp(a, "--gemm-n") || !strcmp(a, "--threads")) &&
                   i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(a, "--gemm-n") || !strcmp(a, "--threads")) {
                const bool t = !strcmp(a, "--threads");
                char buf[256];
                snprintf(buf, sizeof buf, "%s", v);
                int cnt = 0;
                for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                    char *end;
                    long long x = strtoll(tok, &end, 10);
                    if (*end || x < 1 || x > (t ? BK_THREADS : BK_MAX_N) || cnt == (t ? BK_THREADS : BK_MAX_GN)) {
                        fprintf(stderr, "tern bench kernels: %s wants up to %d of 1..%d\n", a,
                                t ? BK_THREADS : BK_MAX_GN, t ? BK_THREADS : BK_MAX_N);
                        return 2;
                    }
                    if (t) thr[cnt++] = (int)x;
                    else gns[cnt++] = x;
                }
                if (t) nthr = cnt;
                else ngn = cnt;
            } else if (!strcmp(a, "--format")) {
                if ((nf = parse_list(v, quant_from_name, formats, TYPE_COUNT, "format")) < 0) return 2;
                for (int j = 0; j < nf; j++)
                    if (!quant_traits(formats[j])->weight) {
                        fprintf(stderr, "tern bench kernels: %s is not a weight format\n", v);
                        return 2;
                    }
            } else if (!strcmp(a, "--isa")) {
                if ((ni = parse_list(v, kern_isa_from_name, isas, ISA_COUNT, "isa")) < 0) return 2;
            } else if (!strcmp(a, "--shape")) {
                long long r = 0, c = 0;
                char tail = 0;
                if (sscanf(v, "%lldx%lld%c", &r, &c, &tail) != 2 || r < 16 || r > 65536 || c < 32 || c > 65536) {
                    fprintf(stderr, "tern bench kernels: --shape wants RxC, 16 <= R <= 65536, 32 <= C <= 65536\n");
                    return 2;
                }
                g_rows = r, g_cols = c;
            } else {
                set_mb = atof(v);
                if (!(set_mb >= 16 && set_mb <= 65536)) {
                    fprintf(stderr, "tern bench kernels: --set-mb wants 16..65536\n");
                    return 2;
                }
            }
        } else {
            fprintf(stderr, "tern bench kernels: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (quick && set_mb == 1024) set_mb = 512;
    const size_t set_bytes = (size_t)(set_mb * 1048576.0);
    if (nf == 0)
        for (int t = 0; t < TYPE_COUNT; t++)
            if (quant_traits(t) && quant_traits(t)->weight) formats[nf++] = t;
    const kern_isa_t best = kern_isa_best();
    if (ni == 0) {
        isas[ni++] = ISA_SCALAR;
        if (best == ISA_NEON)
            isas[ni++] = ISA_NEON;
        else
            for (int i = ISA_AVX2; i <= (int)best; i++) isas[ni++] = i;
    }
    if (nthr == 0)
        for (int t = 1; t <= BK_THREADS; t++) thr[nthr++] = t;
    if (ngn > 0 && gns[0] != 1) {
        /* time(1) is the reference of every ratio */
        if (ngn == BK_MAX_GN) {
            fprintf(stderr, "tern bench kernels: --gemm-n: at most %d counts with 1\n", BK_MAX_GN - 1);
            return 2;
        }
        memmove(gns + 1, gns, sizeof gns[0] * (size_t)ngn);
        gns[0] = 1;
        ngn++;
    }
    const int64_t all_ns[] = {1, 16, 64, 512};
    const int n_ns = quick ? 3 : 4;
    const int rounds = quick ? 7 : BK_MAX_ROUNDS;
    const double gemm_min_ns = quick ? 2e7 : 1e8;
    const double slice_budget_ns = 5e7;

    recs_t recs = {0};
    int rc = 0;
    tern_error_t err = {0};
    tern_pool_t *pools[BK_THREADS + 1] = {0};
    bufs_t b = {0};
    const kern_options_t opt0 = kern_options(); /* restored at the end */

    /* 1. The roofline. */
    double probe[BK_THREADS + 1];
    for (int t = 1; t <= BK_THREADS; t++) {
        probe[t] = bench_probe_read_gbps(t, set_bytes);
        if (probe[t] <= 0) {
            fprintf(stderr, "tern bench kernels: bandwidth probe failed (%.0f MiB)\n", set_mb);
            rc = 1;
            goto out;
        }
        rec_t *e = rec_add(&recs, "probe", -1, -1, t);
        if (!e) goto oom;
        e->gbps = probe[t];
        e->ns = (double)set_bytes / probe[t];
        fprintf(stderr, "probe: %d thread%s %.1f GB/s\n", t, t > 1 ? "s" : "", probe[t]);
    }
    bench_probe_release(); /* the weights need the memory now */

    for (int t = 1; t <= BK_THREADS; t++) {
        pools[t] = tern_pool_create(t, 0, &err);
        if (!pools[t]) {
            fprintf(stderr, "tern bench kernels: %s\n", err.msg);
            rc = 1;
            goto out;
        }
    }
    b.x = malloc(sizeof(float) * g_cols);
    b.x2 = malloc(sizeof(float) * g_cols);
    b.y = malloc(sizeof(float) * g_rows);
    b.y2 = malloc(sizeof(float) * g_rows);
    b.gx = malloc(sizeof(float) * g_cols * BK_MAX_N);
    b.gy = malloc(sizeof(float) * (size_t)(g_rows > BK_GEMM_ROWS ? g_rows : BK_GEMM_ROWS) * BK_MAX_N);
    if (!b.x || !b.x2 || !b.y || !b.y2 || !b.gx || !b.gy) goto oom;
    for (int i = 0; i < g_cols; i++) b.x[i] = randn(), b.x2[i] = randn();
    for (int i = 0; i < g_cols * BK_MAX_N; i++) b.gx[i] = randn();

    /* 2. Per format, ISA and thread count. */
    for (int fi = 0; fi < nf; fi++) {
        const int type = formats[fi];
        if (!kern_ops(type, ISA_SCALAR)) {
            fprintf(stderr, "%s: no kernel registered, skipped\n", quant_name(type));
            continue;
        }
        if (g_cols % quant_traits(type)->blck) {
            fprintf(stderr, "%s: %lld columns are not a multiple of its block of %d, skipped\n", quant_name(type),
                    (long long)g_cols, quant_traits(type)->blck);
            continue;
        }
        wset_t w;
        if (wset_make(&w, type, set_bytes) != 0) {
            fprintf(stderr, "%s: cannot build the working set, skipped\n", quant_name(type));
            rc = 1;
            continue;
        }
        for (int ii = 0; ii < ni; ii++) {
            const kern_isa_t isa = (kern_isa_t)isas[ii];
            if (isa != ISA_SCALAR && (isa > best || (best == ISA_NEON) != (isa == ISA_NEON))) {
                fprintf(stderr, "%s: this CPU has no %s, skipped\n", quant_name(type), kern_isa_name(isa));
                continue;
            }
            /* An ISA that only falls back to a lower one's kernel measures
             * nothing new. */
            const kern_ops_t *o = kern_ops(type, isa);
            if (isa != ISA_SCALAR) {
                const kern_ops_t *lower = kern_ops(type, isa == ISA_NEON ? ISA_SCALAR : (kern_isa_t)(isa - 1));
                if (o && lower && o->dot == lower->dot) {
                    fprintf(stderr, "%s/%s: same kernel as a lower ISA, skipped\n", quant_name(type),
                            kern_isa_name(isa));
                    continue;
                }
            }
            kern_options_t run_opt = opt0; /* the ISA measured; the active sub-features */
            run_opt.isa = isa;
            kern_configure(&run_opt);
            for (int ti = 0; ti < nthr; ti++) {
                const int t = thr[ti];
                tern_pool_t *p = pools[t];
                kern_mat_t m0 = wset_mat(&w, type, 0, g_rows);
                if (kern_matvec(p, &m0, b.x, b.y, &err)) goto kerr; /* warm-up: code, workspace */
                if (ngn > 0) {
                    double mns[BK_MAX_GN], mr[BK_MAX_GN];
                    if (gemm_ram_rounds(p, &w, type, gns, ngn, rounds, quick ? 3e7 : 6e7, &b, mns, mr, &err))
                        goto kerr;
                    fprintf(stderr, "%s/%s t=%d:", quant_name(type), kern_isa_name(isa), t);
                    for (int j = 0; j < ngn; j++) {
                        rec_t *e = rec_add(&recs, "gemm_ram", type, isa, t);
                        if (!e) goto oom;
                        e->n = gns[j];
                        e->ns = mns[j];
                        e->ratio = mr[j];
                        e->gflops = 2.0 * (double)g_rows * (double)g_cols * (double)gns[j] / mns[j];
                        e->gbps = (double)w.mat_bytes / mns[j];
                        fprintf(stderr, " N=%lld %.2fx", (long long)gns[j], mr[j]);
                    }
                    fprintf(stderr, "\n");
                    continue;
                }
                rounds_t rr;
                err.code = 0;
                if (run_rounds(p, t, &w, type, rounds, slice_budget_ns, &b, &rr, &err)) {
                    if (err.code) goto kerr;
                    fprintf(stderr, "tern bench kernels: probe pass failed\n");
                    rc = 1;
                    break;
                }
                const double flops_mat = 2.0 * g_rows * g_cols;
                const double mv_ns = (double)w.mat_bytes / rr.mv_gbps, mv2_ns = (double)w.mat_bytes / rr.mv2_gbps;
                rec_t *e = rec_add(&recs, "matvec", type, isa, t);
                if (!e) goto oom;
                e->gbps = rr.mv_gbps;
                e->pct = 100.0 * e->gbps / probe[t];
                e->probe_now = rr.probe_gbps;
                e->pct_now = rr.pct_now;
                e->pct_lo = rr.pct_lo;
                e->pct_hi = rr.pct_hi;
                e->gflops = flops_mat / mv_ns;
                e->ns = mv_ns;
                const double mv_gflops = e->gflops;
                e->cached = cached_gbps(p, t, &w, type, &b, &err);
                if (e->cached < 0) goto kerr;
                fprintf(stderr,
                        "%s/%s t=%d: matvec %.1f GB/s (%.0f%% of probe, %.0f%% of probe now, rounds %.0f-%.0f%%), "
                        "cached %.1f GB/s, matvec2 %.2fx",
                        quant_name(type), kern_isa_name(isa), t, e->gbps, e->pct, e->pct_now, e->pct_lo, e->pct_hi,
                        e->cached, rr.mv2_ratio);
                e = rec_add(&recs, "matvec2", type, isa, t);
                if (!e) goto oom;
                e->gbps = rr.mv2_gbps;
                e->pct = 100.0 * e->gbps / probe[t];
                e->gflops = 2.0 * flops_mat / mv2_ns;
                e->ns = mv2_ns;
                e->ratio = rr.mv2_ratio;
                /* GEMM rows shrink for slow kernels so that one call stays
                 * near the time budget (GFLOP/s does not depend on rows
                 * once they are many; the weights are cache-resident here
                 * either way). */
                double ns_per_flop = 0;
                for (int j = 0; j < n_ns; j++) {
                    int64_t rows = BK_GEMM_ROWS;
                    if (ns_per_flop > 0) {
                        double est = ns_per_flop * 2.0 * BK_GEMM_ROWS * g_cols * (double)all_ns[j];
                        if (est > gemm_min_ns) rows = (int64_t)(BK_GEMM_ROWS * gemm_min_ns / est) / 16 * 16;
                        if (rows < 64) rows = 64;
                    }
                    /* the rows from matrix 1 on must lie in the working set
                     * (small matrices in a small set: --shape, --set-mb) */
                    const int64_t avail = (int64_t)(w.nmat - 1) * g_rows;
                    if (rows > avail) rows = avail;
                    kern_mat_t g = wset_mat(&w, type, 1, rows);
                    double ns = time_gemm(p, &g, all_ns[j], gemm_min_ns, &b, &err);
                    if (ns < 0) goto kerr;
                    e = rec_add(&recs, "gemm", type, isa, t);
                    if (!e) goto oom;
                    e->n = all_ns[j];
                    e->ns = ns;
                    e->gflops = 2.0 * (double)rows * g_cols * (double)all_ns[j] / ns;
                    e->x_matvec = e->gflops / mv_gflops;
                    ns_per_flop = 1.0 / e->gflops;
                    fprintf(stderr, ", gemm%lld %.1f", (long long)all_ns[j], e->gflops);
                }
                fprintf(stderr, " GFLOP/s\n");
            }
        }
        wset_free(&w);
        continue;
    kerr:
        fprintf(stderr, "tern bench kernels: %s: %s\n", quant_name(type), err.msg);
        wset_free(&w);
        rc = 1;
    }

    if (json)
        print_json(&recs);
    else if (ngn > 0)
        print_gemm_ram_markdown(&recs, set_bytes);
    else
        print_markdown(&recs, all_ns, n_ns, set_bytes);
    goto out;
oom:
    fprintf(stderr, "tern bench kernels: out of memory\n");
    rc = 1;
out:
    kern_configure(&opt0);
    for (int t = 1; t <= BK_THREADS; t++) tern_pool_free(pools[t]);
    free(b.x), free(b.x2), free(b.y), free(b.y2), free(b.gx), free(b.gy);
    free(recs.v);
    bench_probe_release();
    kern_thread_release();
    return rc;
}
