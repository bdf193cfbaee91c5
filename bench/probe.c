/*
 * probe.c - STREAM-style read-bandwidth probe (see probe.h).
 *
 * Why several streams: one sequential stream per core is limited by the
 * number of outstanding L2 misses the hardware prefetcher keeps in flight
 * for it; reading 4 or 8 far-apart regions at once keeps more misses in
 * flight (the reference machine goes from ~45 to ~72 GB/s at 2 threads that
 * way). Loads are 64 bytes (AVX-512) or 32 bytes (AVX2) wide, XOR-folded
 * into registers so the loop is nothing but loads. Threads are pinned to
 * physical cores where possible, start together on a barrier, and the time
 * is the wall time from the barrier to the last thread's finish.
 */
#define _GNU_SOURCE
#include "probe.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "core/common.h"
#include "core/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define PROBE_MAX_THREADS 256
#define PROBE_MAX_STREAMS 8
#define PROBE_REPS 3

void *bench_big_alloc(size_t bytes) {
    if (bytes == 0) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* best effort */
#endif
    /* Fault every page in now (nonzero bytes: no shared zero page). */
    memset(p, 1, bytes);
    return p;
}

void bench_big_free(void *p, size_t bytes) {
    if (p) munmap(p, bytes);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *g_buf;
static size_t g_buf_size;

void bench_probe_release(void) {
    bench_big_free(g_buf, g_buf_size);
    g_buf = NULL;
    g_buf_size = 0;
}

/* Read n64 64-byte lines from each of `streams` regions of `stride` bytes
 * starting at p; returns a fold of the data so the loads cannot be elided. */
typedef uint64_t (*read_fn)(const char *p, size_t stride, int streams, size_t n64);

static uint64_t read_scalar(const char *p, size_t stride, int streams, size_t n64) {
    uint64_t acc = 0;
    for (size_t i = 0; i < n64; i++)
        for (int s = 0; s < streams; s++) {
            const uint64_t *q = (const uint64_t *)(p + (size_t)s * stride + i * 64);
            acc ^= q[0] ^ q[1] ^ q[2] ^ q[3] ^ q[4] ^ q[5] ^ q[6] ^ q[7];
        }
    return acc;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const char *p, size_t stride, int streams, size_t n64) {
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (size_t i = 0; i < n64; i++)
        for (int s = 0; s < streams; s++) {
            const __m256i *q = (const __m256i *)(p + (size_t)s * stride + i * 64);
            a0 = _mm256_xor_si256(a0, _mm256_load_si256(q));
            a1 = _mm256_xor_si256(a1, _mm256_load_si256(q + 1));
        }
    a0 = _mm256_xor_si256(a0, a1);
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, a0);
    return out[0] ^ out[1] ^ out[2] ^ out[3];
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const char *p, size_t stride, int streams,
                                                                size_t n64) {
    __m512i a[PROBE_MAX_STREAMS];
    for (int s = 0; s < PROBE_MAX_STREAMS; s++) a[s] = _mm512_setzero_si512();
    /* The stream count is fixed per call; the switch lets the compiler keep
     * one accumulator per stream in registers. */
#define PROBE_LOOP(S)                                                                          \
    for (size_t i = 0; i < n64; i++)                                                           \
        for (int s = 0; s < (S); s++)                                                          \
            a[s] = _mm512_xor_si512(a[s], _mm512_load_si512((const void *)(p + (size_t)s * stride + i * 64)));
    switch (streams) {
    case 1: PROBE_LOOP(1) break;
    case 2: PROBE_LOOP(2) break;
    case 4: PROBE_LOOP(4) break;
    default: PROBE_LOOP(PROBE_MAX_STREAMS) break;
    }
#undef PROBE_LOOP
    __m512i x = a[0];
    for (int s = 1; s < PROBE_MAX_STREAMS; s++) x = _mm512_xor_si512(x, a[s]);
    return (uint64_t)_mm512_reduce_add_epi64(x);
}

/* The same loads with a software prefetch PF bytes ahead in every stream:
 * the kernels prefetch their weights, and on some machines (this VM among
 * them) that reads faster than the hardware prefetcher alone, so a probe
 * without it would flatter the kernels. */
#define PROBE_PF_LOOP(S, PF)                                                                                \
    for (size_t i = 0; i < n64; i++)                                                                        \
        for (int s = 0; s < (S); s++) {                                                                     \
            const char *q = p + (size_t)s * stride + i * 64;                                                \
            _mm_prefetch(q + (PF), _MM_HINT_T0);                                                            \
            a[s] = _mm512_xor_si512(a[s], _mm512_load_si512((const void *)q));                              \
        }
#define PROBE_PF_FN(NAME, PF)                                                                               \
    __attribute__((target("avx512f"))) static uint64_t NAME(const char *p, size_t stride, int streams,     \
                                                            size_t n64) {                                   \
        __m512i a[PROBE_MAX_STREAMS];                                                                       \
        for (int s = 0; s < PROBE_MAX_STREAMS; s++) a[s] = _mm512_setzero_si512();                          \
        switch (streams) {                                                                                  \
        case 1: PROBE_PF_LOOP(1, PF) break;                                                                 \
        case 2: PROBE_PF_LOOP(2, PF) break;                                                                 \
        case 4: PROBE_PF_LOOP(4, PF) break;                                                                 \
        default: PROBE_PF_LOOP(PROBE_MAX_STREAMS, PF) break;                                                \
        }                                                                                                   \
        __m512i x = a[0];                                                                                   \
        for (int s = 1; s < PROBE_MAX_STREAMS; s++) x = _mm512_xor_si512(x, a[s]);                          \
        return (uint64_t)_mm512_reduce_add_epi64(x);                                                        \
    }
/* Prefetching past the end of a stream is harmless (a prefetch never
 * faults), and the buffer is one mapping. */
PROBE_PF_FN(read_avx512_pf1k, 1024)
PROBE_PF_FN(read_avx512_pf4k, 4096)
#endif

typedef struct {
    int threads, streams, idx, reps;
    const char *base;
    size_t slice; /* bytes per thread, multiple of streams * 64 */
    read_fn fn;
    pthread_barrier_t *bar;
    _Atomic int go; /* 0: wait, 1: run, -1: abandon (a thread failed to start) */
    uint64_t t_start[PROBE_REPS], t_end[PROBE_MAX_THREADS][PROBE_REPS];
    volatile uint64_t sink[PROBE_MAX_THREADS];
} probe_ctx_t;

typedef struct {
    probe_ctx_t *c;
    int idx;
} probe_arg_t;

static void probe_run(probe_ctx_t *c, int idx) {
    while (atomic_load(&c->go) == 0) sched_yield();
    if (atomic_load(&c->go) < 0) return;
    cpu_pin_thread(idx); /* best effort */
    const char *p = c->base + (size_t)idx * c->slice;
    const size_t stride = c->slice / (size_t)c->streams;
    const size_t n64 = stride / 64;
    uint64_t acc = 0;
    for (int r = 0; r < c->reps; r++) {
        pthread_barrier_wait(c->bar);
        if (idx == 0) c->t_start[r] = tern_now_ns();
        acc ^= c->fn(p, stride, c->streams, n64);
        c->t_end[idx][r] = tern_now_ns();
        pthread_barrier_wait(c->bar);
    }
    c->sink[idx] = acc;
}

static void *probe_thread(void *v) {
    probe_arg_t *a = v;
    probe_run(a->c, a->idx);
    return NULL;
}

/* Best GB/s of reps (<= PROBE_REPS) passes with a given stream count. */
static double probe_once(const void *buf, int threads, size_t bytes, int streams, read_fn fn, int reps) {
    static probe_ctx_t c; /* large (t_end); static to keep it off the stack */
    pthread_barrier_t bar;
    if (pthread_barrier_init(&bar, NULL, (unsigned)threads) != 0) return -1.0;
    memset(&c, 0, sizeof c);
    atomic_init(&c.go, 0);
    c.threads = threads;
    c.streams = streams;
    c.reps = reps;
    c.base = buf;
    c.slice = bytes / (size_t)threads / ((size_t)streams * 64) * ((size_t)streams * 64);
    c.fn = fn;
    c.bar = &bar;
    pthread_t tid[PROBE_MAX_THREADS];
    probe_arg_t args[PROBE_MAX_THREADS];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        args[i] = (probe_arg_t){&c, i};
        if (pthread_create(&tid[i], NULL, probe_thread, &args[i]) != 0) break;
        started++;
    }
    if (started != threads - 1) {
        /* Nobody has touched the barrier yet: release the started threads
         * with "abandon" and report failure. */
        atomic_store(&c.go, -1);
        for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
        pthread_barrier_destroy(&bar);
        fprintf(stderr, "bench probe: could not start %d threads\n", threads);
        return -1.0;
    }
    cpu_set_t saved;
    int have_saved = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
    atomic_store(&c.go, 1);
    probe_run(&c, 0);
    for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
    if (have_saved) pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    pthread_barrier_destroy(&bar);
    double best = 0.0;
    const double total = (double)c.slice * threads;
    for (int r = 0; r < reps; r++) {
        uint64_t end = 0;
        for (int i = 0; i < threads; i++) end = c.t_end[i][r] > end ? c.t_end[i][r] : end;
        double s = (double)(end - c.t_start[r]) * 1e-9;
        if (s > 0 && total / s / 1e9 > best) best = total / s / 1e9;
    }
    return best;
}

/* The fastest pattern found per thread count, for bench_probe_pass_gbps. */
typedef struct {
    read_fn fn;
    int streams;
} best_t;
static best_t g_best[PROBE_MAX_THREADS + 1];

double bench_probe_read_gbps(int threads, size_t bytes) {
    if (threads < 1 || threads > PROBE_MAX_THREADS || bytes < (size_t)threads * PROBE_MAX_STREAMS * 64)
        return -1.0;
    if (bytes > g_buf_size) {
        bench_probe_release();
        g_buf = bench_big_alloc(bytes);
        if (!g_buf) return -1.0;
        g_buf_size = bytes;
    }
    /* The best of every pattern: 1, 4 and 8 streams per thread, with and
     * without software prefetch. */
    read_fn fns[3] = {read_scalar, NULL, NULL};
#if defined(__x86_64__)
    const cpu_features_t *f = cpu_features();
    if (f->avx512f) {
        fns[0] = read_avx512;
        fns[1] = read_avx512_pf1k;
        fns[2] = read_avx512_pf4k;
    } else if (f->avx2) {
        fns[0] = read_avx2;
    }
#endif
    static const int streams[] = {1, 4, 8};
    double best = -1.0;
    for (int v = 0; v < 3 && fns[v]; v++)
        for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++) {
            double g = probe_once(g_buf, threads, bytes, streams[i], fns[v], PROBE_REPS);
            if (g > best) {
                best = g;
                g_best[threads] = (best_t){fns[v], streams[i]};
            }
        }
    return best;
}

double bench_probe_pass_gbps(int threads, const void *buf, size_t bytes) {
    if (threads < 1 || threads > PROBE_MAX_THREADS || !buf || bytes < (size_t)threads * PROBE_MAX_STREAMS * 64 ||
        !g_best[threads].fn)
        return -1.0;
    return probe_once(buf, threads, bytes, g_best[threads].streams, g_best[threads].fn, 1);
}

size_t bench_llc_bytes(char *src, size_t src_len) { return cpu_llc_bytes(src, src_len); }
