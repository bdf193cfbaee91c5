/* test_pool.c - the worker pool against a serial loop: bit-identical results,
 * every row exactly once over a million dispatches, error propagation, idle
 * CPU, destroy while workers spin or sleep, two callers, scratch, topology.
 * Every long phase runs under a watchdog that fails the test instead of
 * hanging CI.
 */
// ctest-label: concurrent
#define _GNU_SOURCE
#include "testutil.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "core/cpu.h"
#include "tern.h"

/* ---- watchdog ------------------------------------------------------------ */

static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cv = PTHREAD_COND_INITIALIZER;
static bool wd_done;
static const char *wd_what;
static int wd_secs;
static _Atomic long wd_progress;
static pthread_t wd_thread;

static void *wd_main(void *arg) {
    (void)arg;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += wd_secs;
    pthread_mutex_lock(&wd_mu);
    while (!wd_done) {
        if (pthread_cond_timedwait(&wd_cv, &wd_mu, &dl) == ETIMEDOUT && !wd_done) {
            fprintf(stderr, "WATCHDOG: '%s' still running after %d s (progress %ld): the pool hung\n",
                    wd_what, wd_secs, atomic_load(&wd_progress));
            fflush(stderr);
            _exit(1);
        }
    }
    pthread_mutex_unlock(&wd_mu);
    return NULL;
}

static void wd_start(const char *what, int secs) {
    wd_done = false;
    wd_what = what;
    wd_secs = tu_quick() ? secs * 4 : secs; /* sanitizers run several times slower */
    atomic_store(&wd_progress, 0);
    assert_int_equal(pthread_create(&wd_thread, NULL, wd_main, NULL), 0);
}

static void wd_stop(void) {
    pthread_mutex_lock(&wd_mu);
    wd_done = true;
    pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_mu);
    pthread_join(wd_thread, NULL);
}

static void sleep_s(double s);

static tern_pool_t *make_pool(int n, size_t scratch) {
    tern_error_t err = {0};
    tern_pool_t *p = tern_pool_create(n, scratch, &err);
    if (!p) fail_msg("tern_pool_create(%d): %s", n, err.msg);
    assert_int_equal(tern_pool_threads(p), n);
    return p;
}

/* ---- bit-identical row-parallel reduction -------------------------------- */

typedef struct {
    const float *x;
    const int64_t *off; /* row i is x[off[i] .. off[i+1]) */
    float *out;
    int64_t n_rows, align;
    int n_threads;
    _Atomic int bad; /* chunk-boundary or worker-index violations */
} red_ctx_t;

/* A deliberately order-sensitive float reduction: any change in the order of
 * operations within a row changes the bits. */
static float red_row(const float *x, int64_t b, int64_t e) {
    float acc = 0.0f, c = 1.0f;
    for (int64_t j = b; j < e; j++) {
        acc = acc * 0.999f + x[j] * c;
        c = c * -1.0001f + x[j] * 1e-3f;
    }
    return acc;
}

static int red_job(void *vctx, int64_t b, int64_t e, int worker) {
    red_ctx_t *c = vctx;
    if (b >= e || b % c->align || (e % c->align && e != c->n_rows) || e > c->n_rows || worker < 0 ||
        worker >= c->n_threads)
        atomic_fetch_add(&c->bad, 1);
    for (int64_t i = b; i < e; i++) c->out[i] = red_row(c->x, c->off[i], c->off[i + 1]);
    return 0;
}

static void test_bit_identical(void **state) {
    (void)state;
    uint64_t rng = 12345;
    enum { MAXR = 2001, NR = 3 };
    int64_t *off = malloc((MAXR + 1) * sizeof *off);
    off[0] = 0;
    for (int i = 0; i < MAXR; i++) off[i + 1] = off[i] + 1 + (int64_t)(tu_rand(&rng) % 300);
    float *x = malloc((size_t)off[MAXR] * sizeof *x);
    for (int64_t j = 0; j < off[MAXR]; j++) x[j] = tu_randn(&rng) * (float)(1 + j % 7);
    float *ref = malloc(MAXR * sizeof *ref);
    for (int i = 0; i < MAXR; i++) ref[i] = red_row(x, off[i], off[i + 1]);
    float *out[NR];
    for (int k = 0; k < NR; k++) out[k] = malloc(MAXR * sizeof(float));
    const int64_t rows[] = {1, 2, 7, 33, 257, 1001, MAXR};
    const int64_t aligns[] = {1, 4, 16};
    wd_start("bit-identical", 60);
    for (int t = 1; t <= 8; t++) {
        tern_pool_t *p = make_pool(t, 0);
        tern_pool_set_gate(p, 0); /* always dispatch, even the tiny shapes */
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ai = 0; ai < 3; ai++)
                for (int nr = 1; nr <= NR; nr++) {
                    red_ctx_t ctx[NR];
                    tern_range_t rg[NR];
                    for (int k = 0; k < nr; k++) {
                        /* Range k covers a different sub-block of the rows. */
                        int64_t n = rows[ri] - k > 0 ? rows[ri] - k : rows[ri];
                        memset(out[k], 0xff, MAXR * sizeof(float)); /* NaN: a missed row shows */
                        ctx[k] = (red_ctx_t){.x = x, .off = off + k, .out = out[k], .n_rows = n,
                                             .align = aligns[ai], .n_threads = t};
                        rg[k] = (tern_range_t){red_job, &ctx[k], n, aligns[ai], 4 * (k + 1)};
                    }
                    tern_error_t err = {0};
                    int rc = tern_pool_run(p, rg, nr, &err);
                    if (rc) fail_msg("run: %s", err.msg);
                    for (int k = 0; k < nr; k++) {
                        assert_int_equal(atomic_load(&ctx[k].bad), 0);
                        /* Serial truth for range k: rows k .. k+n of ref. */
                        if (memcmp(out[k], ref + k, (size_t)ctx[k].n_rows * sizeof(float)))
                            fail_msg("threads %d rows %lld align %lld range %d: differs from serial", t,
                                     (long long)ctx[k].n_rows, (long long)aligns[ai], k);
                    }
                    atomic_fetch_add(&wd_progress, 1);
                }
        tern_pool_free(p);
    }
    wd_stop();
    for (int k = 0; k < NR; k++) free(out[k]);
    free(ref);
    free(x);
    free(off);
}

/* ---- every row exactly once ---------------------------------------------- */

typedef struct {
    _Atomic int *cnt;
    int64_t n_rows, align;
    int n_threads;
    _Atomic int bad;
} cnt_ctx_t;

static int cnt_job(void *vctx, int64_t b, int64_t e, int worker) {
    cnt_ctx_t *c = vctx;
    if (b >= e || b % c->align || (e % c->align && e != c->n_rows) || e > c->n_rows || worker < 0 ||
        worker >= c->n_threads)
        atomic_fetch_add(&c->bad, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add_explicit(&c->cnt[i], 1, memory_order_relaxed);
    return 0;
}

static int64_t rand_rows(uint64_t *rng) {
    uint64_t u = tu_rand(rng) % 1000;
    if (u < 100) return 0;
    if (u < 200) return 1;
    if (u < 700) return 2 + (int64_t)(tu_rand(rng) % 63);       /* tiny */
    if (u < 997) return 65 + (int64_t)(tu_rand(rng) % 4000);    /* medium */
    return 10000 + (int64_t)(tu_rand(rng) % 190000);            /* huge */
}

static void test_every_row_once(void **state) {
    (void)state;
    enum { MAXROWS = 200000, NR = 3 };
    const long n_disp = tu_quick() ? 100000 : 1000000;
    /* Thread counts include more threads than this machine has CPUs; the
     * 2-thread pool (the common case) gets most rounds. */
    const int counts[] = {2, 2, 2, 3, 1, 2, 4, 8};
    const int ncounts = sizeof counts / sizeof counts[0];
    tern_pool_t *pools[9] = {0};
    _Atomic int *cnt[NR];
    for (int k = 0; k < NR; k++) cnt[k] = calloc(MAXROWS, sizeof(_Atomic int));
    uint64_t rng = 777;
    long gated = 0, dispatched = 0;
    wd_start("every row once", 240);
    int t = 2;
    int64_t shape_align = 1, shape_cost = 0;
    for (long it = 0; it < n_disp; it++) {
        if (it % 1000 == 0) {
            /* Switch thread count and job shape every few rounds. */
            t = counts[tu_rand(&rng) % ncounts];
            if (!pools[t]) pools[t] = make_pool(t, 64);
            const int64_t al[] = {1, 1, 2, 4, 16, 32};
            shape_align = al[tu_rand(&rng) % 6];
            /* Costs either side of the default gate: small jobs stay on the
             * caller, larger ones wake the pool; 0 = unknown, always wake. */
            const int64_t co[] = {0, 8, 64, 512, 4096};
            shape_cost = co[tu_rand(&rng) % 5];
        }
        tern_pool_t *p = pools[t];
        int nr = 1 + (int)(tu_rand(&rng) % 16 == 0 ? tu_rand(&rng) % NR : 0);
        cnt_ctx_t ctx[NR];
        tern_range_t rg[NR];
        for (int k = 0; k < nr; k++) {
            int64_t n = rand_rows(&rng);
            ctx[k] = (cnt_ctx_t){.cnt = cnt[k], .n_rows = n, .align = shape_align, .n_threads = t};
            rg[k] = (tern_range_t){cnt_job, &ctx[k], n, shape_align, shape_cost};
        }
        uint64_t before = tern_pool_dispatch_count();
        tern_error_t err = {0};
        if (tern_pool_run(p, rg, nr, &err)) fail_msg("dispatch %ld: %s", it, err.msg);
        if (tern_pool_dispatch_count() == before) gated++;
        else dispatched++;
        for (int k = 0; k < nr; k++) {
            if (atomic_load(&ctx[k].bad))
                fail_msg("dispatch %ld: bad chunk (threads %d, align %lld)", it, t, (long long)shape_align);
            for (int64_t i = 0; i < ctx[k].n_rows; i++) {
                int v = atomic_load_explicit(&cnt[k][i], memory_order_relaxed);
                if (v != 1)
                    fail_msg("dispatch %ld (threads %d, %lld rows, align %lld, range %d): row %lld ran %d "
                             "times",
                             it, t, (long long)ctx[k].n_rows, (long long)shape_align, k, (long long)i, v);
                atomic_store_explicit(&cnt[k][i], 0, memory_order_relaxed);
            }
        }
        atomic_store(&wd_progress, it);
    }
    wd_stop();
    print_message("%ld runs: %ld dispatched to the pool, %ld stayed on the caller\n", n_disp, dispatched,
                  gated);
    /* Both sides of the gate were exercised, many times. */
    assert_true(dispatched > n_disp / 10);
    assert_true(gated > n_disp / 10);
    for (int i = 0; i < 9; i++) tern_pool_free(pools[i]);
    for (int k = 0; k < NR; k++) free(cnt[k]);
}

/* ---- errors -------------------------------------------------------------- */

typedef struct {
    int64_t fail_row; /* -1: never; -2: every chunk */
    int code;
    _Atomic int64_t rows_done;
    _Atomic int inside; /* threads inside the job function right now */
} err_ctx_t;

static int err_job(void *vctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    err_ctx_t *c = vctx;
    atomic_fetch_add(&c->inside, 1);
    int rc = 0;
    if (c->fail_row == -2 || (c->fail_row >= b && c->fail_row < e)) rc = c->code;
    else atomic_fetch_add(&c->rows_done, e - b);
    atomic_fetch_sub(&c->inside, 1);
    return rc;
}

static void test_errors(void **state) {
    (void)state;
    tern_error_t err = {0};
    /* Invalid ranges are refused before anything runs. */
    err_ctx_t ec = {.fail_row = -1};
    tern_range_t bad[] = {
        {NULL, &ec, 10, 1, 0}, {err_job, &ec, -1, 1, 0}, {err_job, &ec, 10, 0, 0}, {err_job, &ec, 10, 1, -5}};
    tern_pool_t *p2 = make_pool(2, 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tern_pool_run(p2, &bad[i], 1, &err), TERN_EINVAL);
        assert_int_equal(tern_pool_run(NULL, &bad[i], 1, &err), TERN_EINVAL);
        assert_true(strlen(err.msg) > 0);
    }
    assert_int_equal(tern_pool_run(p2, NULL, 1, &err), TERN_EINVAL);
    assert_int_equal(tern_pool_run(p2, NULL, 0, &err), 0);
    assert_int_equal(atomic_load(&ec.rows_done), 0);

    wd_start("errors", 60);
    uint64_t rng = 99;
    const int ts[] = {1, 2, 3, 4, 8};
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
        tern_pool_t *p = ts[ti] == 2 ? p2 : make_pool(ts[ti], 0);
        int iters = tu_quick() ? 300 : 2000;
        for (int it = 0; it < iters; it++) {
            int64_t n = 1 + (int64_t)(tu_rand(&rng) % 5000);
            err_ctx_t c[3] = {{.fail_row = -1}, {.fail_row = -1}, {.fail_row = -1}};
            int which = (int)(tu_rand(&rng) % 3);
            c[which].fail_row = it % 7 == 0 ? -2 : (int64_t)(tu_rand(&rng) % (uint64_t)n);
            c[which].code = 40 + which;
            tern_range_t rg[3];
            for (int k = 0; k < 3; k++) rg[k] = (tern_range_t){err_job, &c[k], n, 1 + k, 0};
            memset(&err, 0, sizeof err);
            int rc = tern_pool_run(it % 11 == 0 ? NULL : p, rg, 3, &err);
            assert_int_equal(rc, TERN_EJOB);
            assert_int_equal(err.code, TERN_EJOB);
            char want[64];
            snprintf(want, sizeof want, "range %d", which);
            if (!strstr(err.msg, want)) fail_msg("message '%s' does not name %s", err.msg, want);
            snprintf(want, sizeof want, "failed with %d", 40 + which);
            if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
            /* The run returned only after every job call had returned. */
            for (int k = 0; k < 3; k++) assert_int_equal(atomic_load(&c[k].inside), 0);
            /* The pool still works: a clean job runs every row. */
            err_ctx_t ok = {.fail_row = -1};
            tern_range_t r1 = {err_job, &ok, n, 1, 0};
            assert_int_equal(tern_pool_run(p, &r1, 1, &err), 0);
            assert_int_equal(atomic_load(&ok.rows_done), n);
            atomic_fetch_add(&wd_progress, 1);
        }
        if (p != p2) tern_pool_free(p);
    }
    wd_stop();
    tern_pool_free(p2);
}

/* ---- idle workers cost nothing -------------------------------------------- */

static double process_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static int nop_job(void *ctx, int64_t b, int64_t e, int w) {
    (void)ctx, (void)b, (void)e, (void)w;
    return 0;
}

static void test_idle_cpu(void **state) {
    (void)state;
    wd_start("idle cpu", 60);
    tern_range_t r = {nop_job, NULL, 64, 1, 0};
    tern_error_t err = {0};
    /* Sanity check of the measurement itself: workers told to spin for
     * (practically) ever do burn CPU while the caller sleeps. */
    tern_pool_t *p = make_pool(2, 0);
    tern_pool_set_spin(p, INT64_MAX / 2);
    assert_int_equal(tern_pool_run(p, &r, 1, &err), 0);
    assert_int_equal(tern_pool_run(p, &r, 1, &err), 0); /* the worker now waits with the new budget */
    double c0 = process_cpu_s();
    sleep_s(0.5);
    double spin_cpu = process_cpu_s() - c0;
    tern_pool_set_spin(p, 1000);
    assert_int_equal(tern_pool_run(p, &r, 1, &err), 0); /* ends the long spin */
    print_message("spinning worker: %.3f s CPU over 0.5 s\n", spin_cpu);
    /* Even with 1/40 of a CPU on a loaded machine a spinner burns > 0.01 s;
     * a parked worker burns ~0 (below). */
    assert_true(spin_cpu > 0.01);

    /* The real test: after their spin budget, parked workers use ~0 CPU. */
    tern_pool_t *p8 = make_pool(8, 0); /* more threads than CPUs too */
    assert_int_equal(tern_pool_run(p8, &r, 1, &err), 0);
    assert_int_equal(tern_pool_run(p, &r, 1, &err), 0);
    sleep_s(0.2); /* the default budget is far below this (docs/perf/pool.md) */
    c0 = process_cpu_s();
    sleep_s(1.0);
    double idle_cpu = process_cpu_s() - c0;
    print_message("8 + 2 parked workers: %.4f s CPU over 1 s\n", idle_cpu);
    assert_true(idle_cpu < 0.02);
    /* And they still wake up for work. */
    assert_int_equal(tern_pool_run(p, &r, 1, &err), 0);
    assert_int_equal(tern_pool_run(p8, &r, 1, &err), 0);
    tern_pool_free(p);
    tern_pool_free(p8);
    wd_stop();
}

/* ---- destroy while spinning / sleeping, many pools ------------------------- */

static void test_destroy_busy_and_many_pools(void **state) {
    (void)state;
    wd_start("destroy / many pools", 120);
    uint64_t rng = 5;
    int n = tu_quick() ? 150 : 600;
    for (int i = 0; i < n; i++) {
        int t = 1 + (int)(tu_rand(&rng) % 8);
        tern_pool_t *p = make_pool(t, (size_t)(tu_rand(&rng) % 5000));
        int mode = i % 4;
        if (mode == 1) tern_pool_set_spin(p, 0); /* workers park at once */
        tern_range_t r = {nop_job, NULL, 1000, 1, 0};
        tern_error_t err = {0};
        if (mode != 0) assert_int_equal(tern_pool_run(p, &r, 1, &err), 0);
        if (mode == 1) sleep_s(0.001); /* workers asleep on the futex */
        /* mode 2/3: freed right after a run, while workers still spin or are
         * on their way into or out of the job. */
        tern_pool_free(p);
        atomic_fetch_add(&wd_progress, 1);
    }
    tern_pool_free(NULL);
    wd_stop();
}

/* ---- two callers, nested calls --------------------------------------------- */

typedef struct {
    tern_pool_t *pool;
    _Atomic int *cnt;
    int64_t n;
    long ok, busy;
    int iters;
    bool failed;
} caller_arg_t;

static void *caller_main(void *varg) {
    caller_arg_t *a = varg;
    for (int it = 0; it < a->iters && !a->failed; it++) {
        cnt_ctx_t c = {.cnt = a->cnt, .n_rows = a->n, .align = 1, .n_threads = tern_pool_threads(a->pool)};
        tern_range_t r = {cnt_job, &c, a->n, 1, 0};
        tern_error_t err = {0};
        int rc = tern_pool_run(a->pool, &r, 1, &err);
        int want = rc == 0 ? 1 : 0;
        if (rc == TERN_EBUSY) a->busy++;
        else if (rc == 0) a->ok++;
        else a->failed = true;
        for (int64_t i = 0; i < a->n; i++) {
            if (atomic_load(&a->cnt[i]) != want) a->failed = true;
            atomic_store(&a->cnt[i], 0);
        }
    }
    return NULL;
}

typedef struct {
    tern_pool_t *pool;
    _Atomic int nested_rc;
} nest_ctx_t;

static int nest_job(void *vctx, int64_t b, int64_t e, int w) {
    (void)b, (void)e, (void)w;
    nest_ctx_t *c = vctx;
    tern_range_t r = {nop_job, NULL, 100, 1, 0};
    tern_error_t err;
    atomic_store(&c->nested_rc, tern_pool_run(c->pool, &r, 1, &err));
    return 0;
}

static void test_two_callers(void **state) {
    (void)state;
    wd_start("two callers", 120);
    tern_pool_t *p = make_pool(3, 0);
    caller_arg_t a[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        a[i] = (caller_arg_t){.pool = p, .cnt = calloc(3000, sizeof(_Atomic int)), .n = 3000,
                              .iters = tu_quick() ? 500 : 5000};
        assert_int_equal(pthread_create(&th[i], NULL, caller_main, &a[i]), 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    print_message("two callers: ok %ld + %ld, refused (EBUSY) %ld + %ld\n", a[0].ok, a[1].ok, a[0].busy,
                  a[1].busy);
    for (int i = 0; i < 2; i++) {
        assert_false(a[i].failed);
        assert_int_equal(a[i].ok + a[i].busy, a[i].iters);
        free(a[i].cnt);
    }
    /* A job calling its own pool is refused, not deadlocked. */
    nest_ctx_t nc = {.pool = p};
    atomic_init(&nc.nested_rc, 1);
    tern_range_t r = {nest_job, &nc, 1, 1, 0};
    tern_error_t err = {0};
    assert_int_equal(tern_pool_run(p, &r, 1, &err), 0);
    assert_int_equal(atomic_load(&nc.nested_rc), TERN_EBUSY);
    tern_pool_free(p);
    wd_stop();
}

/* ---- scratch, worker indices, load balance ---------------------------------- */

typedef struct {
    tern_pool_t *pool;
    _Atomic int bad;
    _Atomic int chunks[16];
} scr_ctx_t;

static int scr_job(void *vctx, int64_t b, int64_t e, int w) {
    scr_ctx_t *c = vctx;
    unsigned char *s = tern_pool_scratch(c->pool, w);
    size_t n = tern_pool_scratch_size(c->pool);
    /* Scratch belongs to this worker for the whole chunk: fill, then check
     * nobody else wrote it meanwhile. */
    for (int64_t i = b; i < e; i++) {
        memset(s, w + 1, n);
        for (size_t j = 0; j < n; j++)
            if (s[j] != (unsigned char)(w + 1)) atomic_fetch_add(&c->bad, 1);
    }
    atomic_fetch_add(&c->chunks[w], 1);
    return 0;
}

static int slow_job(void *vctx, int64_t b, int64_t e, int w) {
    (void)b, (void)e;
    scr_ctx_t *c = vctx;
    if (w != 0) sleep_s(0.05); /* every worker but the caller is slow */
    atomic_fetch_add(&c->chunks[w], 1);
    return 0;
}

static void test_scratch_and_balance(void **state) {
    (void)state;
    wd_start("scratch", 60);
    const size_t sz = 1000;
    tern_pool_t *p = make_pool(4, sz);
    assert_int_equal(tern_pool_scratch_size(p), sz);
    assert_null(tern_pool_scratch(p, -1));
    assert_null(tern_pool_scratch(p, 4));
    for (int i = 0; i < 4; i++) {
        uintptr_t a = (uintptr_t)tern_pool_scratch(p, i);
        assert_true(a != 0 && a % 64 == 0);
        for (int j = 0; j < i; j++) {
            uintptr_t b = (uintptr_t)tern_pool_scratch(p, j);
            /* Disjoint, and not sharing a cache line (no false sharing). */
            assert_true(a >= b + ((sz + 63) & ~(size_t)63) || b >= a + ((sz + 63) & ~(size_t)63));
        }
    }
    scr_ctx_t c = {.pool = p};
    tern_range_t r = {scr_job, &c, 4000, 1, 0};
    tern_error_t err = {0};
    for (int it = 0; it < 20; it++) assert_int_equal(tern_pool_run(p, &r, 1, &err), 0);
    assert_int_equal(atomic_load(&c.bad), 0);
    tern_pool_free(p);

    /* A slow thread takes fewer chunks: with 2 threads the job is cut into 8
     * chunks; the worker sleeps 50 ms per chunk while the caller's take no
     * time, so the caller does most of them (it would have to be descheduled
     * for over 150 ms for the worker to get 4). */
    p = make_pool(2, 0);
    scr_ctx_t s = {.pool = p};
    tern_range_t rs = {slow_job, &s, 8, 1, 0};
    assert_int_equal(tern_pool_run(p, &rs, 1, &err), 0);
    int c0 = atomic_load(&s.chunks[0]), c1 = atomic_load(&s.chunks[1]);
    print_message("slow worker: caller took %d chunks, worker %d\n", c0, c1);
    assert_int_equal(c0 + c1, 8);
    assert_true(c0 >= 5);
    tern_pool_free(p);

    /* NULL pool: serial, one call per range, worker 0, no scratch. */
    assert_int_equal(tern_pool_threads(NULL), 1);
    assert_null(tern_pool_scratch(NULL, 0));
    assert_int_equal(tern_pool_scratch_size(NULL), 0);
    scr_ctx_t z = {.pool = NULL};
    tern_range_t rz = {slow_job, &z, 100, 4, 0};
    assert_int_equal(tern_pool_run(NULL, &rz, 1, &err), 0);
    assert_int_equal(atomic_load(&z.chunks[0]), 1);
    wd_stop();
}

/* ---- how a job is cut into chunks ---------------------------------------- */

typedef struct {
    _Atomic int n;
    int64_t b[64], e[64];
} chunk_log_t;

static int log_job(void *vctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    chunk_log_t *c = vctx;
    int i = atomic_fetch_add(&c->n, 1);
    if (i < 64) c->b[i] = b, c->e[i] = e;
    return 0;
}

/* Run the job once and check its chunks, sorted by first row: they tile the
 * last range without gaps, with the sizes of want, a list of (count, rows)
 * pairs ended by a count of 0. */
static void expect_chunks(tern_pool_t *p, const tern_range_t *r, int n_ranges, chunk_log_t *log,
                          const int64_t *want) {
    tern_error_t err = {0};
    atomic_store(&log->n, 0);
    assert_int_equal(tern_pool_run(p, r, n_ranges, &err), 0);
    const int n = atomic_load(&log->n);
    assert_true(n <= 64);
    for (int i = 1; i < n; i++) /* insertion sort by first row */
        for (int j = i; j > 0 && log->b[j] < log->b[j - 1]; j--) {
            int64_t tb = log->b[j], te = log->e[j];
            log->b[j] = log->b[j - 1], log->e[j] = log->e[j - 1];
            log->b[j - 1] = tb, log->e[j - 1] = te;
        }
    int i = 0;
    for (; want[0] > 0; want += 2)
        for (int64_t c = 0; c < want[0]; c++, i++) {
            assert_true(i < n);
            assert_int_equal(log->b[i], i ? log->e[i - 1] : 0);
            assert_int_equal(log->e[i] - log->b[i], want[1]);
        }
    assert_int_equal(i, n);
    assert_int_equal(log->e[n - 1], r[n_ranges - 1].n_rows);
}

static void test_chunk_plan(void **state) {
    (void)state;
    tern_pool_t *p = make_pool(2, 0);
    tern_pool_set_gate(p, 0);
    chunk_log_t log;
    /* 4096 rows of 1 KB, 2 threads: chunks of 4096 / 8 = 512 rows, the
     * last two of them (one per thread) cut into 128-row chunks. */
    tern_range_t r = {log_job, &log, 4096, 16, 1024};
    expect_chunks(p, &r, 1, &log, (const int64_t[]){6, 512, 8, 128, 0});
    /* A ragged end: 4000 rows -> chunks of 512 (500 rounded up to 16); the
     * last 1024 + 928 % 512 = 1440 rows in chunks of 128, the final one 32. */
    r.n_rows = 4000;
    expect_chunks(p, &r, 1, &log, (const int64_t[]){5, 512, 11, 128, 1, 32, 0});
    /* Two ranges: only the job's last range (the end of the job) has a tail. */
    chunk_log_t log2;
    tern_range_t rr[2] = {{log_job, &log2, 4096, 16, 1024}, {log_job, &log, 4096, 16, 1024}};
    atomic_store(&log2.n, 0);
    expect_chunks(p, rr, 2, &log, (const int64_t[]){2, 1024, 8, 256, 0});
    assert_int_equal(atomic_load(&log2.n), 4);
    /* Tail chunks of at least POOL_TAIL_MIN_WORK (128 KB): 4096 rows of 600
     * bytes, chunks of 300 KB; the tail's 1024 rows go in chunks of 208
     * (219 rows rounded down to 16) and the 192 left. */
    r.n_rows = 4096;
    r.cost = 600;
    expect_chunks(p, &r, 1, &log, (const int64_t[]){6, 512, 4, 208, 1, 192, 0});
    /* Less work: fewer chunks per thread (each of at least
     * POOL_MIN_CHUNK_WORK, 256 KB) and no tail. 1.2 MB: two per thread. */
    r.cost = 300;
    expect_chunks(p, &r, 1, &log, (const int64_t[]){4, 1024, 0});
    /* 400 KB, and 64 KB: one per thread. */
    r.cost = 100;
    expect_chunks(p, &r, 1, &log, (const int64_t[]){2, 2048, 0});
    r.n_rows = 64;
    r.cost = 1024;
    expect_chunks(p, &r, 1, &log, (const int64_t[]){2, 32, 0});
    /* Unknown cost: four per thread, as many rows as the alignment allows. */
    r.cost = 0;
    expect_chunks(p, &r, 1, &log, (const int64_t[]){4, 16, 0});
    tern_pool_free(p);
}

/* ---- dispatch counter and gate ------------------------------------------- */

static void test_dispatch_count_and_gate(void **state) {
    (void)state;
    tern_pool_t *p = make_pool(2, 0);
    tern_error_t err = {0};
    int64_t gate = tern_pool_gate(p);
    assert_true(gate > 0);
    tern_range_t big = {nop_job, NULL, 1000, 1, gate}; /* way over the gate */
    tern_range_t small = {nop_job, NULL, 2, 1, gate / 4};  /* under it */
    tern_range_t unknown = {nop_job, NULL, 2, 1, 0};   /* cost unknown: dispatch */
    uint64_t d0 = tern_pool_dispatch_count();
    assert_int_equal(tern_pool_run(p, &big, 1, &err), 0);
    assert_int_equal(tern_pool_dispatch_count(), d0 + 1);
    assert_int_equal(tern_pool_run(p, &small, 1, &err), 0);
    assert_int_equal(tern_pool_dispatch_count(), d0 + 1);
    assert_int_equal(tern_pool_run(p, &unknown, 1, &err), 0);
    assert_int_equal(tern_pool_dispatch_count(), d0 + 2);
    assert_int_equal(tern_pool_run(NULL, &big, 1, &err), 0);
    assert_int_equal(tern_pool_dispatch_count(), d0 + 2);
    tern_pool_set_gate(p, 0);
    assert_int_equal(tern_pool_run(p, &small, 1, &err), 0);
    assert_int_equal(tern_pool_dispatch_count(), d0 + 3);
    /* The pool's own counter saw the same three (it started at 0). */
    assert_int_equal(tern_pool_dispatches(p), 3);
    tern_pool_t *p1 = make_pool(1, 0);
    assert_int_equal(tern_pool_run(p1, &big, 1, &err), 0);
    assert_int_equal(tern_pool_dispatch_count(), d0 + 3);
    assert_int_equal(tern_pool_dispatches(p1), 0);
    assert_int_equal(tern_pool_dispatches(p), 3);
    tern_pool_free(p);
    tern_pool_free(p1);
}

/* ---- thread count, topology, affinity ---------------------------------------- */

static void *pin_main(void *arg) {
    int *out = arg;
    out[0] = cpu_pin_thread(0);
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    out[1] = CPU_COUNT(&set);
    out[2] = cpu_pin_thread(1 << 20); /* no such core */
    return NULL;
}

typedef struct {
    _Atomic int mask_count[4]; /* CPUs in each worker's affinity mask */
} aff_ctx_t;

static int aff_job(void *vctx, int64_t b, int64_t e, int w) {
    (void)b, (void)e;
    aff_ctx_t *c = vctx;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (w < 4 && sched_getaffinity(0, sizeof set, &set) == 0) atomic_store(&c->mask_count[w], CPU_COUNT(&set));
    sleep_s(0.002); /* long enough that every thread gets a chunk */
    return 0;
}

/* TERN_AFFINITY=1 pins workers (not the caller) to distinct cores. */
static void test_affinity(void **state) {
    (void)state;
    if (cpu_perf_cores(NULL, 0) < 2) {
        print_message("SKIP: one core, nothing to pin apart\n");
        skip();
    }
    cpu_set_t before, after;
    sched_getaffinity(0, sizeof before, &before);
    setenv("TERN_AFFINITY", "1", 1);
    tern_pool_t *p = make_pool(2, 0);
    unsetenv("TERN_AFFINITY");
    aff_ctx_t c = {0};
    tern_range_t r = {aff_job, &c, 64, 1, 0};
    tern_error_t err;
    for (int i = 0; i < 20 && !atomic_load(&c.mask_count[1]); i++)
        assert_int_equal(tern_pool_run(p, &r, 1, &err), 0);
    assert_int_equal(atomic_load(&c.mask_count[1]), 1);
    sched_getaffinity(0, sizeof after, &after);
    assert_true(CPU_EQUAL(&before, &after));
    tern_pool_free(p);
}

/* The last-level cache: one figure for the process (the same from every
 * thread and call), and a source that agrees with it: hwloc or sysfs gave a
 * size, or it is unknown and 0. */
static void *llc_thread(void *arg) {
    *(size_t *)arg = cpu_llc_bytes(NULL, 0);
    return NULL;
}

static void test_llc(void **state) {
    (void)state;
    char src[256] = "";
    size_t got[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, llc_thread, &got[i]), 0);
    const size_t llc = cpu_llc_bytes(src, sizeof src);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_true(got[i] == llc);
    }
    print_message("cpu_llc_bytes: %zu (%s)\n", llc, src);
    if (!strncmp(src, "hwloc: L", 8) || !strncmp(src, "sysfs: L", 8)) {
        assert_true(llc >= 4096); /* no real last-level cache is smaller */
    } else {
        if (strncmp(src, "unknown: ", 9) != 0) fail_msg("cpu_llc_bytes source '%s'", src);
        assert_true(llc == 0);
    }
    char small[8];
    assert_true(cpu_llc_bytes(small, sizeof small) == llc); /* a short buffer: cut, NUL-terminated */
    assert_true(strlen(small) == sizeof small - 1 && !strncmp(small, src, sizeof small - 1));
}

static void test_threads_and_topology(void **state) {
    (void)state;
    char why[512], hw[256];
    int cores = cpu_perf_cores(hw, sizeof hw);
    print_message("cpu_perf_cores: %d (%s); cpu_online: %d\n", cores, hw, cpu_online());
    assert_true(cores >= 1 && cores <= cpu_online());
    assert_true(strlen(hw) > 0);

    char *saved = getenv("TERN_THREADS") ? strdup(getenv("TERN_THREADS")) : NULL;
    setenv("TERN_THREADS", "3", 1);
    assert_int_equal(tern_threads_default(why, sizeof why), 3);
    assert_non_null(strstr(why, "TERN_THREADS=3"));
    tern_pool_t *p = tern_pool_create(0, 0, NULL);
    assert_int_equal(tern_pool_threads(p), 3);
    tern_pool_free(p);
    setenv("TERN_THREADS", "0", 1);
    assert_int_equal(tern_threads_default(why, sizeof why), 1);
    setenv("TERN_THREADS", "1", 1);
    assert_int_equal(tern_threads_default(why, sizeof why), 1);
    setenv("TERN_THREADS", "two", 1);
    assert_int_equal(tern_threads_default(why, sizeof why), cores);
    assert_non_null(strstr(why, "ignored"));
    unsetenv("TERN_THREADS");
    assert_int_equal(tern_threads_default(why, sizeof why), cores);
    if (saved) setenv("TERN_THREADS", saved, 1);
    free(saved);

    tern_error_t err = {0};
    assert_null(tern_pool_create(100000, 0, &err));
    assert_int_equal(err.code, TERN_EINVAL);

    /* Pinning: in a fresh thread, so the test's own affinity is untouched. */
    int out[3];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pin_main, out), 0);
    pthread_join(th, NULL);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 1);
    assert_int_equal(out[2], -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_and_topology),
        cmocka_unit_test(test_affinity),
        cmocka_unit_test(test_dispatch_count_and_gate),
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_scratch_and_balance),
        cmocka_unit_test(test_chunk_plan),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_two_callers),
        cmocka_unit_test(test_destroy_busy_and_many_pools),
        cmocka_unit_test(test_idle_cpu),
        cmocka_unit_test(test_every_row_once),
        cmocka_unit_test(test_llc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
