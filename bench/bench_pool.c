/* bench_pool.c - `tern bench pool`: tern's pool against the usual ways of
 * running a row-parallel loop, in one run, as ratios to tern.
 *
 * Implementations: tern (default spin budget), tern-spin-N (a sweep of spin
 * budgets, N = 0 is TERN_POOL_SPIN=0: workers always park), spawn
 * (pthread_create/join per call), condvar (persistent threads, mutex +
 * condvar start signal, latch counter for the end), and OpenMP `parallel
 * for` with libgomp's default wait policy (omp-default) and with
 * OMP_WAIT_POLICY=passive / active. libgomp reads its wait policy once, at
 * initialization, so each OpenMP variant runs in a child process (this binary
 * re-executed with a hidden --omp-child option and the variable set).
 *
 * Cases: an empty dispatch (one empty row per thread) and an F32 matvec
 * y = W x (576x576, decode-sized, fits in L2; 4096x4096, 64 MiB, memory
 * bound), all with the same plain row loop, at 1, 2 and N threads. Every
 * number is the median over samples of the mean over a batch of calls.
 *
 * Extra modes for the tuning measurements in docs/perf/pool.md:
 * --gate (serial vs 2-thread pool over work sizes: where the serial gate
 * belongs) and --spin (dispatch latency after a gap of caller work, per spin
 * budget: what the default spin budget must cover).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef TERN_HAVE_OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "core/common.h"
#include "tern_pool.h"

extern char **environ;

/* ---- the work ------------------------------------------------------------ */

typedef struct {
    const float *w; /* n_rows x n_cols, row-major */
    const float *x;
    float *y;
    int64_t n_rows, n_cols;
} job_t;

static float dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

static void job_rows(const job_t *j, int64_t b, int64_t e) {
    if (!j->w) return; /* the empty job */
    for (int64_t r = b; r < e; r++) j->y[r] = dot_f32(j->w + r * j->n_cols, j->x, j->n_cols);
}

/* Rows of thread i of t in a static split (the baselines). */
static void share(const job_t *j, int i, int t, int64_t *b, int64_t *e) {
    *b = j->n_rows * i / t;
    *e = j->n_rows * (i + 1) / t;
}

enum { CASE_EMPTY, CASE_MV576, CASE_MV4096, N_CASES };
static const char *case_name[N_CASES] = {"empty", "matvec576", "matvec4096"};

typedef struct {
    float *w, *x, *y;
    int64_t dim;
} mat_t;

static int mat_init(mat_t *m, int64_t dim) {
    m->dim = dim;
    m->w = tern_alloc((size_t)(dim * dim) * sizeof(float));
    m->x = tern_alloc((size_t)dim * sizeof(float));
    m->y = tern_alloc((size_t)dim * sizeof(float));
    if (!m->w || !m->x || !m->y) return -1;
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (int64_t i = 0; i < dim * dim; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        m->w[i] = (float)((int64_t)(s >> 40) - (1 << 23)) * (1.0f / (1 << 23));
    }
    for (int64_t i = 0; i < dim; i++) m->x[i] = (float)(i % 17) * 0.0625f - 0.5f;
    return 0;
}

static void mat_free(mat_t *m) {
    tern_free(m->w);
    tern_free(m->x);
    tern_free(m->y);
}

/* The job of a case at t threads. Empty: one empty row per thread. */
static job_t case_job(int c, int t, mat_t *m576, mat_t *m4096) {
    if (c == CASE_EMPTY) return (job_t){NULL, NULL, NULL, t, 0};
    mat_t *m = c == CASE_MV576 ? m576 : m4096;
    return (job_t){m->w, m->x, m->y, m->dim, m->dim};
}

/* Calls per sample and samples per round, per case. An empty dispatch is
 * timed in batches (a batch of 100 is ~10 us, so the clock's cost does not
 * matter); a matvec is timed per call (>= 20 us), so a preemption by another
 * process spoils one sample, not a whole batch, and the median skips it. */
static const int reps_of[N_CASES] = {100, 1, 1};
static const int samples_of[N_CASES] = {60, 150, 5};

/* ---- implementations ------------------------------------------------------ */

typedef struct impl impl_t;
struct impl {
    const char *name;
    void *(*create)(const impl_t *im, int threads);
    void (*run)(void *st, const job_t *j);
    void (*destroy)(void *st);
    int64_t spin; /* tern variants: spin budget, -1 = default */
};

/* tern */
typedef struct {
    tern_pool_t *pool;
    const job_t *job;
} tern_st_t;

static int tern_job(void *ctx, int64_t b, int64_t e, int w) {
    (void)w;
    job_rows(((tern_st_t *)ctx)->job, b, e);
    return 0;
}

static void *tern_create(const impl_t *im, int t) {
    tern_st_t *s = calloc(1, sizeof *s);
    tern_error_t err;
    s->pool = tern_pool_create(t, 0, &err);
    if (!s->pool) {
        fprintf(stderr, "bench pool: %s\n", err.msg);
        free(s);
        return NULL;
    }
    if (im->spin >= 0) tern_pool_set_spin(s->pool, im->spin);
    return s;
}

static void tern_run(void *vs, const job_t *j) {
    tern_st_t *s = vs;
    s->job = j;
    /* cost = bytes per row, as the kernels set it; the empty job has unknown
     * cost so it is always dispatched (never gated). */
    tern_range_t r = {tern_job, s, j->n_rows, j->n_cols ? 8 : 1, j->n_cols * (int64_t)sizeof(float)};
    tern_pool_run(s->pool, &r, 1, NULL);
}

static void tern_destroy(void *vs) {
    tern_st_t *s = vs;
    tern_pool_free(s->pool);
    free(s);
}

/* spawn: threads created and joined per call */
typedef struct {
    int t;
} spawn_st_t;
typedef struct {
    const job_t *j;
    int i, t;
} spawn_arg_t;

static void *spawn_main(void *va) {
    spawn_arg_t *a = va;
    int64_t b, e;
    share(a->j, a->i, a->t, &b, &e);
    job_rows(a->j, b, e);
    return NULL;
}

static void *spawn_create(const impl_t *im, int t) {
    (void)im;
    spawn_st_t *s = malloc(sizeof *s);
    s->t = t;
    return s;
}

static void spawn_run(void *vs, const job_t *j) {
    spawn_st_t *s = vs;
    pthread_t th[64];
    spawn_arg_t a[64];
    int t = s->t > 64 ? 64 : s->t;
    for (int i = 1; i < t; i++) {
        a[i] = (spawn_arg_t){j, i, t};
        pthread_create(&th[i], NULL, spawn_main, &a[i]);
    }
    a[0] = (spawn_arg_t){j, 0, t};
    spawn_main(&a[0]);
    for (int i = 1; i < t; i++) pthread_join(th[i], NULL);
}

static void spawn_destroy(void *s) { free(s); }

/* condvar: a classic persistent pool with a start condvar and a latch */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    const job_t *job;
    uint64_t gen;
    int remaining, t;
    bool stop;
    pthread_t th[64];
    int idx[64];
} cv_st_t;
typedef struct {
    cv_st_t *s;
    int i;
} cv_arg_t;
static cv_arg_t cv_args[64];

static void *cv_main(void *va) {
    cv_arg_t *a = va;
    cv_st_t *s = a->s;
    uint64_t seen = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->gen == seen && !s->stop) pthread_cond_wait(&s->start, &s->mu);
        if (s->stop) break;
        seen = s->gen;
        const job_t *j = s->job;
        pthread_mutex_unlock(&s->mu);
        int64_t b, e;
        share(j, a->i, s->t, &b, &e);
        job_rows(j, b, e);
        pthread_mutex_lock(&s->mu);
        if (--s->remaining == 0) pthread_cond_signal(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void *cv_create(const impl_t *im, int t) {
    (void)im;
    cv_st_t *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->start, NULL);
    pthread_cond_init(&s->done, NULL);
    s->t = t > 64 ? 64 : t;
    for (int i = 1; i < s->t; i++) {
        cv_args[i] = (cv_arg_t){s, i};
        pthread_create(&s->th[i], NULL, cv_main, &cv_args[i]);
    }
    return s;
}

static void cv_run(void *vs, const job_t *j) {
    cv_st_t *s = vs;
    pthread_mutex_lock(&s->mu);
    s->job = j;
    s->gen++;
    s->remaining = s->t - 1;
    pthread_cond_broadcast(&s->start);
    pthread_mutex_unlock(&s->mu);
    int64_t b, e;
    share(j, 0, s->t, &b, &e);
    job_rows(j, b, e);
    pthread_mutex_lock(&s->mu);
    while (s->remaining > 0) pthread_cond_wait(&s->done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void cv_destroy(void *vs) {
    cv_st_t *s = vs;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->start);
    pthread_mutex_unlock(&s->mu);
    for (int i = 1; i < s->t; i++) pthread_join(s->th[i], NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->start);
    pthread_cond_destroy(&s->done);
    free(s);
}

#ifdef TERN_HAVE_OPENMP
typedef struct {
    int t;
} omp_st_t;

static void *omp_create(const impl_t *im, int t) {
    (void)im;
    omp_st_t *s = malloc(sizeof *s);
    s->t = t;
    return s;
}

static void omp_run(void *vs, const job_t *j) {
    int t = ((omp_st_t *)vs)->t;
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        int64_t b, e;
        share(j, i, t, &b, &e);
        job_rows(j, b, e);
    }
}

static void omp_destroy(void *s) { free(s); }
#endif

#define SPIN_SWEEP_N 5
static const int64_t spin_sweep[SPIN_SWEEP_N] = {0, 100, 1000, 10000, 100000};
static char spin_names[SPIN_SWEEP_N][32];

/* ---- measurement ---------------------------------------------------------- */

#define MAX_IMPLS 16
#define MAX_TCOUNTS 3
#define MAX_SAMPLES 256

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Median of `samples` samples, each the mean over `reps` calls, after a warm-up. */
static void measure(const impl_t *im, void *st, const job_t *j, int reps, int samples, uint64_t *all,
                    int *n_all) {
    /* Warm up for a while, not a few calls: freshly created threads may
     * need milliseconds to be first scheduled on a busy machine, and a
     * session's pool lives far longer than one benchmark block. Same rule
     * for every implementation. */
    uint64_t w0 = tern_now_ns();
    for (int i = 0; i < 3 || tern_now_ns() - w0 < 20000000; i++) im->run(st, j);
    for (int s = 0; s < samples && *n_all < MAX_SAMPLES; s++) {
        uint64_t t0 = tern_now_ns();
        for (int i = 0; i < reps; i++) im->run(st, j);
        all[(*n_all)++] = (tern_now_ns() - t0) / (uint64_t)reps;
    }
}


typedef struct {
    uint64_t s[MAX_IMPLS][N_CASES][MAX_TCOUNTS][MAX_SAMPLES];
    int n[MAX_IMPLS][N_CASES][MAX_TCOUNTS];
} results_t;

static uint64_t median_of(uint64_t *v, int n) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return v[n / 2];
}

/* The OpenMP child: measures every case and thread count with the wait
 * policy it was started with and prints "case tcount_index ns" per sample. */
static int omp_child(int argc, char **argv) {
#ifdef TERN_HAVE_OPENMP
    int tc[MAX_TCOUNTS], ntc = 0;
    for (int i = 0; i < argc && ntc < MAX_TCOUNTS; i++) tc[ntc++] = atoi(argv[i]);
    mat_t m576, m4096;
    if (mat_init(&m576, 576) || mat_init(&m4096, 4096)) return 1;
    omp_set_dynamic(0);
    impl_t im = {"omp", omp_create, omp_run, omp_destroy, -1};
    for (int c = 0; c < N_CASES; c++)
        for (int ti = 0; ti < ntc; ti++) {
            job_t j = case_job(c, tc[ti], &m576, &m4096);
            void *st = im.create(&im, tc[ti]);
            uint64_t all[MAX_SAMPLES];
            int n = 0;
            measure(&im, st, &j, reps_of[c], samples_of[c], all, &n);
            im.destroy(st);
            for (int k = 0; k < n; k++) printf("%d %d %llu\n", c, ti, (unsigned long long)all[k]);
        }
    mat_free(&m576);
    mat_free(&m4096);
    return 0;
#else
    (void)argc, (void)argv;
    return 1;
#endif
}

/* Run this binary as an OpenMP child with OMP_WAIT_POLICY=policy (NULL:
 * unset) and collect its samples into results slot `ii`. */
static int run_omp_child(const char *policy, const int *tc, int ntc, results_t *res, int ii) {
    char targ[MAX_TCOUNTS][16];
    char *args[8 + MAX_TCOUNTS];
    int na = 0;
    args[na++] = "tern";
    args[na++] = "bench";
    args[na++] = "pool";
    args[na++] = "--omp-child";
    for (int i = 0; i < ntc; i++) {
        snprintf(targ[i], sizeof targ[i], "%d", tc[i]);
        args[na++] = targ[i];
    }
    args[na] = NULL;
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **envp = calloc(ne + 2, sizeof *envp);
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "OMP_WAIT_POLICY=", 16)) envp[k++] = environ[i];
    char pol[64];
    if (policy) {
        snprintf(pol, sizeof pol, "OMP_WAIT_POLICY=%s", policy);
        envp[k++] = pol;
    }
    envp[k] = NULL;
    int fd[2];
    if (pipe(fd)) {
        free(envp);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    close(fd[1]);
    if (rc) {
        close(fd[0]);
        fprintf(stderr, "bench pool: cannot start the OpenMP child: %s\n", strerror(rc));
        return -1;
    }
    FILE *f = fdopen(fd[0], "r");
    int c, ti;
    unsigned long long ns;
    while (f && fscanf(f, "%d %d %llu", &c, &ti, &ns) == 3)
        if (c >= 0 && c < N_CASES && ti >= 0 && ti < ntc && res->n[ii][c][ti] < MAX_SAMPLES)
            res->s[ii][c][ti][res->n[ii][c][ti]++] = ns;
    if (f) fclose(f);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- tuning modes --------------------------------------------------------- */

static void busy_wait_ns(uint64_t ns) {
    uint64_t t0 = tern_now_ns();
    while (tern_now_ns() - t0 < ns) {
    }
}

static int nop_job(void *c, int64_t b, int64_t e, int w) {
    (void)c, (void)b, (void)e, (void)w;
    return 0;
}

static double ns_per_spin(void) {
    enum { N = 200000 };
    volatile int flag = 0;
    uint64_t t0 = tern_now_ns();
    for (int i = 0; i < N && !flag; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    return (double)(tern_now_ns() - t0) / N;
}

/* Latency of a 2-thread empty dispatch issued after `gap` of caller work,
 * per spin budget. A budget that does not cover the gap means the worker
 * parked, and the dispatch pays a futex wake-up (and the worker arrives late). */
static int mode_spin(void) {
    const int64_t budgets[] = {0, 100, 1000, 3000, 10000, 30000, 100000};
    const uint64_t gaps_us[] = {0, 2, 20, 100, 500, 2000};
    const int nb = sizeof budgets / sizeof budgets[0], ng = sizeof gaps_us / sizeof gaps_us[0];
    printf("Spin loop iteration (load + pause): %.1f ns\n\n", ns_per_spin());
    printf("Empty 2-thread dispatch after a gap of caller work, median ns (workers' CPU burnt per "
           "gap is min(gap, budget)):\n\n| spin budget |");
    for (int g = 0; g < ng; g++) printf(" gap %llu us |", (unsigned long long)gaps_us[g]);
    printf("\n|---|");
    for (int g = 0; g < ng; g++) printf("---|");
    printf("\n");
    for (int b = 0; b < nb; b++) {
        tern_pool_t *p = tern_pool_create(2, 0, NULL);
        if (!p) return 1;
        tern_pool_set_spin(p, budgets[b]);
        printf("| %lld |", (long long)budgets[b]);
        for (int g = 0; g < ng; g++) {
            int reps = gaps_us[g] >= 500 ? 60 : 400;
            uint64_t v[400];
            tern_range_t r = {nop_job, NULL, 2, 1, 0};
            for (int i = 0; i < reps; i++) {
                busy_wait_ns(gaps_us[g] * 1000);
                uint64_t t0 = tern_now_ns();
                tern_pool_run(p, &r, 1, NULL);
                v[i] = tern_now_ns() - t0;
            }
            printf(" %llu |", (unsigned long long)median_of(v, reps));
            fflush(stdout);
        }
        printf("\n");
        tern_pool_free(p);
    }
    return 0;
}

/* Serial vs a 2-thread pool (gate disabled) on matvecs of growing size: the
 * gate belongs where the pool starts to win. Align 1 so even 2 rows make two
 * chunks; medians over many short batches so a preemption spoils one
 * sample, not the result. */
static int gate_job(void *ctx, int64_t b, int64_t e, int w) {
    (void)w;
    job_rows(ctx, b, e);
    return 0;
}

static int mode_gate(void) {
    const int64_t cols = 576;
    const int64_t rows_list[] = {2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 576};
    mat_t m;
    if (mat_init(&m, cols)) return 1;
    tern_pool_t *p = tern_pool_create(2, 0, NULL);
    if (!p) return 1;
    tern_pool_set_gate(p, 0);
    printf("F32 matvec with %lld columns (%lld bytes per row): serial vs 2-thread pool with the gate "
           "off, median ns per call\n\n| rows | bytes | serial ns | pool ns | pool / serial |\n"
           "|---|---|---|---|---|\n",
           (long long)cols, (long long)cols * 4);
    enum { SAMPLES = 201 };
    for (size_t k = 0; k < sizeof rows_list / sizeof rows_list[0]; k++) {
        job_t j = {m.w, m.x, m.y, rows_list[k], cols};
        tern_range_t r = {gate_job, &j, j.n_rows, 1, cols * 4};
        int reps = rows_list[k] >= 64 ? 1 : 10;
        uint64_t vs[SAMPLES], vp[SAMPLES];
        for (int s = 0; s < SAMPLES; s++) {
            /* Alternate the two so both see the same background. */
            uint64_t t0 = tern_now_ns();
            for (int i = 0; i < reps; i++) job_rows(&j, 0, j.n_rows);
            vs[s] = (tern_now_ns() - t0) / (uint64_t)reps;
            t0 = tern_now_ns();
            for (int i = 0; i < reps; i++) tern_pool_run(p, &r, 1, NULL);
            vp[s] = (tern_now_ns() - t0) / (uint64_t)reps;
        }
        uint64_t a = median_of(vs, SAMPLES), b = median_of(vp, SAMPLES);
        printf("| %lld | %lld | %llu | %llu | %.2f |\n", (long long)rows_list[k],
               (long long)(rows_list[k] * cols * 4), (unsigned long long)a, (unsigned long long)b,
               a ? (double)b / (double)a : 0.0);
        fflush(stdout);
    }
    tern_pool_free(p);
    mat_free(&m);
    return 0;
}

/* ---- main ------------------------------------------------------------------ */

int bench_pool_main(int argc, char **argv) {
    bool json = false;
    int rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--omp-child")) return omp_child(argc - i - 1, argv + i + 1);
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--gate")) return mode_gate();
        else if (!strcmp(argv[i], "--spin")) return mode_spin();
        else if (!strcmp(argv[i], "--quick")) rounds = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tern bench pool [--json] [--quick]   pool vs baselines, ratios to tern\n"
                   "       tern bench pool --gate               where the serial gate belongs\n"
                   "       tern bench pool --spin               dispatch latency per spin budget\n");
            return 0;
        } else {
            fprintf(stderr, "tern bench pool: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }

    char why[256];
    int nt = tern_threads_default(why, sizeof why);
    int tc[MAX_TCOUNTS] = {1, 2, nt}, ntc = nt > 2 ? 3 : 2;

    impl_t impls[MAX_IMPLS];
    int ni = 0;
    impls[ni++] = (impl_t){"tern", tern_create, tern_run, tern_destroy, -1};
    impls[ni++] = (impl_t){"spawn", spawn_create, spawn_run, spawn_destroy, -1};
    impls[ni++] = (impl_t){"condvar", cv_create, cv_run, cv_destroy, -1};
    int first_omp = ni;
#ifdef TERN_HAVE_OPENMP
    const char *omp_names[3] = {"omp-default", "omp-passive", "omp-active"};
    const char *omp_policy[3] = {NULL, "passive", "active"};
    for (int k = 0; k < 3; k++) impls[ni++] = (impl_t){omp_names[k], NULL, NULL, NULL, -1};
#endif
    int n_omp = ni - first_omp;
    int first_spin = ni;
    for (int k = 0; k < SPIN_SWEEP_N; k++) {
        snprintf(spin_names[k], sizeof spin_names[k], "tern-spin-%lld", (long long)spin_sweep[k]);
        impls[ni++] = (impl_t){spin_names[k], tern_create, tern_run, tern_destroy, spin_sweep[k]};
    }

    mat_t m576, m4096;
    if (mat_init(&m576, 576) || mat_init(&m4096, 4096)) {
        fprintf(stderr, "bench pool: out of memory\n");
        return 1;
    }
    results_t *res = calloc(1, sizeof *res);
    tern_pool_t *dp = tern_pool_create(1, 0, NULL);
    int64_t default_spin = tern_pool_spin(dp);
    tern_pool_free(dp);
    if (!json)
        fprintf(stderr, "tern bench pool: %d round%s, threads 1, 2%s (default %d: %s)\n", rounds,
                rounds == 1 ? "" : "s", ntc > 2 ? ", N" : "", nt, why);
    /* Rounds interleave the implementations so a burst of noise from other
     * processes is spread over all of them rather than hitting one. Each
     * implementation is created and destroyed around its block so its
     * threads (spinning or not) never overlap another's measurement. */
    for (int round = 0; round < rounds; round++) {
        for (int ii = 0; ii < ni; ii++) {
            if (ii >= first_omp && ii < first_omp + n_omp) {
#ifdef TERN_HAVE_OPENMP
                if (run_omp_child(omp_policy[ii - first_omp], tc, ntc, res, ii))
                    fprintf(stderr, "bench pool: %s child failed\n", impls[ii].name);
#endif
                continue;
            }
            for (int c = 0; c < N_CASES; c++)
                for (int ti = 0; ti < ntc; ti++) {
                    job_t j = case_job(c, tc[ti], &m576, &m4096);
                    void *st = impls[ii].create(&impls[ii], tc[ti]);
                    if (!st) return 1;
                    measure(&impls[ii], st, &j, reps_of[c], samples_of[c], res->s[ii][c][ti],
                            &res->n[ii][c][ti]);
                    impls[ii].destroy(st);
                }
        }
        if (!json) fprintf(stderr, "  round %d/%d done\n", round + 1, rounds);
    }

    uint64_t med[MAX_IMPLS][N_CASES][MAX_TCOUNTS];
    for (int ii = 0; ii < ni; ii++)
        for (int c = 0; c < N_CASES; c++)
            for (int ti = 0; ti < ntc; ti++) med[ii][c][ti] = median_of(res->s[ii][c][ti], res->n[ii][c][ti]);

    if (json) {
        printf("[");
        bool first = true;
        for (int ii = 0; ii < ni; ii++)
            for (int c = 0; c < N_CASES; c++)
                for (int ti = 0; ti < ntc; ti++) {
                    if (!res->n[ii][c][ti]) continue;
                    double ratio = med[0][c][ti] ? (double)med[ii][c][ti] / (double)med[0][c][ti] : 0;
                    printf("%s\n  {\"impl\": \"%s\", \"case\": \"%s\", \"threads\": %d, \"ns\": %llu, "
                           "\"ratio_to_tern\": %.3f, \"samples\": %d}",
                           first ? "" : ",", impls[ii].name, case_name[c], tc[ti],
                           (unsigned long long)med[ii][c][ti], ratio, res->n[ii][c][ti]);
                    first = false;
                }
        printf("\n]\n");
    } else {
        for (int table = 0; table < 2; table++) {
            int lo = table == 0 ? 1 : first_spin, hi = table == 0 ? first_spin : ni;
            if (table == 0)
                printf("\nMedian ns per call; in parentheses, time relative to tern (>1 = tern is "
                       "faster).\n\n| case | threads | tern ns |");
            else
                printf("\nSpin-budget sweep (TERN_POOL_SPIN; tern's default is %lld), same format.\n\n"
                       "| case | threads | tern ns |",
                       (long long)default_spin);
            for (int ii = lo; ii < hi; ii++) printf(" %s |", impls[ii].name);
            printf("\n|---|---|---|");
            for (int ii = lo; ii < hi; ii++) printf("---|");
            printf("\n");
            for (int c = 0; c < N_CASES; c++)
                for (int ti = 0; ti < ntc; ti++) {
                    printf("| %s | %d | %llu |", case_name[c], tc[ti], (unsigned long long)med[0][c][ti]);
                    for (int ii = lo; ii < hi; ii++) {
                        if (!res->n[ii][c][ti]) {
                            printf(" n/a |");
                            continue;
                        }
                        printf(" %llu (%.2fx) |", (unsigned long long)med[ii][c][ti],
                               med[0][c][ti] ? (double)med[ii][c][ti] / (double)med[0][c][ti] : 0.0);
                    }
                    printf("\n");
                }
        }
    }
    free(res);
    mat_free(&m576);
    mat_free(&m4096);
    return 0;
}
