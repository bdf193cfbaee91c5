/*
 * pool.c - the persistent worker pool every kernel runs on.
 *
 * Threads are created once per pool. tern_pool_run publishes one job (a copy
 * of the caller's ranges, cut into aligned chunks) in the pool's single job
 * slot, bumps an epoch, does chunks itself, and waits only for the workers
 * that joined the job to leave it. Rows are pulled from one atomic cursor, a
 * chunk at a time, so a slow or descheduled thread simply takes fewer chunks;
 * every row is computed by exactly one thread, by the same job function over
 * the same rows as the serial loop, so results are bit-identical at any
 * thread count.
 *
 * THE PROTOCOL. All coordination goes through one 32-bit word, `state`:
 *
 *     bits 31..14  epoch     bumped by every publish (wraps; see below)
 *     bit  13      WAITER    the caller sleeps on the futex, waiting for leaves
 *     bit  12      CLOSED    no worker may join; the job slot is the caller's
 *     bits 11..0   inside    workers currently inside the job
 *
 *   publish (caller, state CLOSED with inside == 0): write the job slot and
 *     reset the cursor with plain/relaxed stores, then store
 *     state = (epoch+1, open, inside 0) [seq_cst]. If a worker went to park
 *     since the last wake (n_sleeping > 0, taken after that store with an
 *     exchange to 0 [seq_cst]), FUTEX_WAKE all parked workers.
 *   park (worker, after its spin budget): n_sleeping++ [seq_cst], then
 *     FUTEX_WAIT while state still holds the value it saw (old epoch).
 *   join (worker that saw a new epoch): CAS state s -> s+1 [acq_rel], only
 *     when s is open. Only after a successful join does it read the slot.
 *   work (caller and joined workers): c = cursor++ [relaxed]; run chunk c
 *     while c < n_chunks and no error was recorded.
 *   leave (worker): fetch_sub(state, 1) [acq_rel]; if it was the last one
 *     inside and WAITER is set, FUTEX_WAKE the caller.
 *   close (caller, after its own claim failed): CAS state (e, open, inside 0)
 *     -> (e, CLOSED) [acq_rel]; on failure, spin, then sleep with WAITER set.
 *
 * Why a stale worker cannot corrupt a later job (the double-decrement bug of
 * a "remaining workers" counter, where a worker preempted before job k wakes
 * in job k+1, runs it and decrements twice): nothing here counts expected
 * workers. `inside` only counts workers that joined, and each leave pairs
 * with its own successful join, so it cannot go below zero or wrap. A join is
 * a CAS against the whole word, so it succeeds only while the job is open;
 * the caller's close is a CAS that succeeds only with inside == 0, so after
 * close nobody is inside and nobody can enter until the next publish. A
 * worker that slept through any number of epochs just joins whatever job is
 * open when it wakes, reading the slot only after its join; even a join CAS
 * that succeeds on a recycled value (ABA after the epoch wrapped) joins the
 * job open at that instant, which is correct. Epoch wraparound (2^18
 * publishes) is therefore harmless: the epoch only tells a waiting worker
 * that something changed; a worker fooled by an exact wrap merely skips one
 * job, which the others and the caller complete.
 *
 * Memory ordering. (1) Slot -> worker: the slot writes precede the publish
 * store (release, seq_cst); a join CAS that succeeds reads that store or a
 * later RMW of the same word (other joins/leaves, all RMWs, so they continue
 * its release sequence), and is an acquire, so the worker sees the slot and
 * the reset cursor. (2) Results -> caller: a worker's row writes precede its
 * leave (release); the close CAS (acquire) reads the value left by the last
 * leave, so every row written by any worker happens-before the caller
 * returns, and before the caller writes the slot for the next job. (3) Lost
 * wake-ups: a parking worker increments n_sleeping [seq_cst] and then the
 * kernel compares state with the value it saw; the publisher stores state
 * [seq_cst] and then reads-and-zeroes n_sleeping [seq_cst]. In the single
 * total order either the increment comes first (the publisher sees it and
 * wakes) or the state store does (the futex compare fails and the worker
 * does not sleep). Only publishers zero the count and each zeroing is
 * followed by a wake-all, so a sleeper's increment is never lost without a
 * wake; the count can only over-estimate (harmless extra wake). The
 * caller's WAITER bit works the same way, inside one word:
 * it is set by a CAS that fails if a leave happened in between, and the
 * futex compare fails if a leave happens after it.
 *
 * Hot path: when workers are spinning, a dispatch costs the busy flag, the
 * publish store, one load of n_sleeping, one cursor RMW per chunk and the
 * close CAS (plus, every 16th dispatch, sched_getcpu(), read from the rseq
 * area): no allocation, no lock, no syscall. Futex waits use private
 * bitsets so the caller's wake-up (bit 1) never wakes parked workers (bit 0)
 * and vice versa.
 *
 * Waiting: a worker spins TERN_POOL_SPIN iterations (load + pause), then
 * parks on the futex. When the pool has more threads than CPUs we may run
 * on, spinning would only burn the time slices of the threads we wait for,
 * so the spin budget is 0 (park at once). How spinning interacts with the
 * scheduler (no yields in workers, moving off the caller's CPU) is explained
 * at POOL_CPU_CHECK and move_off() below.
 *
 * Two callers: tern_pool_run takes a try-lock flag and returns TERN_EBUSY if
 * the pool is already running a job (another thread, or a job function
 * calling back into its own pool, which a blocking lock would deadlock on).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Futex on Linux; elsewhere (or with -DTERN_POOL_NO_FUTEX, which the tests
 * use to exercise it) a mutex + condvar pair gives the same wait/wake. */
#if defined(__linux__) && !defined(TERN_POOL_NO_FUTEX)
#include <linux/futex.h>
#include <sys/syscall.h>
#define POOL_HAVE_FUTEX 1
#endif

#include "tern_pool.h"
#include "core/common.h"
#include "core/cpu.h"

#define ST_INSIDE_MASK 0xfffu
#define ST_CLOSED (1u << 12)
#define ST_WAITER (1u << 13)
#define ST_EPOCH_SHIFT 14
#define ST_EPOCH_ONE (1u << ST_EPOCH_SHIFT)
#define POOL_MAX_THREADS TERN_POOL_MAX_THREADS /* < ST_INSIDE_MASK */
_Static_assert(POOL_MAX_THREADS < ST_INSIDE_MASK, "inside must count every worker");

#define WAKE_WORKERS 1u
#define WAKE_CALLER 2u

/* Chunks per thread a job is cut into: enough that a thread that starts late
 * or runs slower takes fewer of them, few enough that the cursor RMW per
 * chunk stays negligible. */
#define POOL_CHUNKS_PER_THREAD 4
/* ... but fewer (down to one per thread) where chunks would hold less work
 * than this (bytes, as tern_range_t.cost counts them): every chunk costs a claim
 * and, in a matvec, a fresh start of four read streams (about 0.6 us here),
 * which in a small model's matrices (SmolLM2's 576 x 576 Q8_0 is 352 KB, 23
 * us of streaming at 2 threads) cost 20% with eight chunks (docs/PERF.md). */
#define POOL_MIN_CHUNK_WORK (256 * 1024)
/* In a job with the full POOL_CHUNKS_PER_THREAD, the last n_threads chunks
 * are each cut into this many: when the threads run out of work at
 * different moments (one was descheduled, or shares its core with another
 * tenant), the others wait for at most a small chunk. Only at the end,
 * since every chunk has its cost (above) ... */
#define POOL_TAIL_SPLIT 4
/* ... and no tail chunk below this much work. */
#define POOL_TAIL_MIN_WORK (128 * 1024)

/* Defaults; the measurements behind them are in docs/perf/pool.md. The gate
 * is in bytes of work (sum of n_rows * cost): below it, waking the other
 * threads costs more than it saves. */
#define POOL_SPIN_DEFAULT 20000
#define POOL_GATE_DEFAULT (96 * 1024)

typedef struct {
    tern_job_fn fn;
    void *ctx;
    int64_t n_rows;
    int64_t chunk_rows;   /* multiple of the range's align */
    uint64_t chunk_begin; /* global index of this range's first chunk */
    uint64_t chunk_end;
    /* The tail (the job's last range only): rows from tail_row on go in
     * chunks of tail_rows, global indices tail_chunk..chunk_end-1; without
     * one, tail_chunk = chunk_end. */
    int64_t tail_row, tail_rows;
    uint64_t tail_chunk;
} pool_range_t;

typedef struct {
    _Alignas(64) pthread_t thread;
    tern_pool_t *pool;
    void *scratch;
    int index;
} pool_worker_t;

struct tern_pool {
    /* Each hot word on its own cache line: state is read by every spinner,
     * the cursor is hammered while working, n_sleeping is written only when
     * a worker parks (and zeroed by the publisher that wakes it). */
    _Alignas(64) _Atomic uint32_t state;
    _Alignas(64) _Atomic uint64_t cursor;
    _Alignas(64) _Atomic int n_sleeping;

    /* The job slot: written by the caller only while CLOSED. */
    _Alignas(64) pool_range_t *ranges;
    int n_ranges;
    int ranges_cap;
    uint64_t n_chunks;
    _Atomic int job_err; /* first job error code, 0 = none */
    int job_err_range;   /* written by the thread whose CAS set job_err */
    int64_t job_err_row;

    /* The caller's own line: written on every run, read by nobody else. */
    _Alignas(64) atomic_flag busy;
    unsigned n_runs;
    /* Dispatches of this pool (tern_pool_dispatches). Written only by the
     * caller holding `busy`, so a relaxed load + store suffices (no locked
     * RMW on the hot path); atomic because any thread may read it. */
    _Atomic uint64_t dispatches;

    /* Read by waiting workers, written rarely (caller_cpu every
     * POOL_CALLER_CPU_EVERY runs, the rest by setters and destroy). */
    _Alignas(64) _Atomic bool stop;
    _Atomic int64_t spin;
    _Atomic int64_t gate;
    int n_threads;
    bool oversubscribed;
    bool pin;
    size_t scratch_size;
    void *caller_scratch;
    pool_worker_t *workers; /* n_threads - 1 of them */
    int n_started;
#ifdef __linux__
    cpu_set_t allowed; /* the creator's CPUs, for the initial spread */
    int creator_cpu;
#endif
    _Atomic int caller_cpu; /* where the caller last ran, -1 = unknown */
#ifndef POOL_HAVE_FUTEX
    pthread_mutex_t park_mu;
    pthread_cond_t park_cv;
#endif
};

static _Atomic uint64_t g_dispatches;

/* ---- waiting primitives -------------------------------------------------- */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

/* Spinning threads and the scheduler. (1) A spinning worker that finds
 * itself on the caller's CPU moves to another one (move_off): a woken worker
 * is often placed on its waker's CPU, and a spinner there takes the CPU from
 * the caller whose next dispatch it waits for. sched_getcpu() reads the rseq
 * area (no syscall); the worker checks every POOL_CPU_CHECK iterations, the
 * caller refreshes its CPU every POOL_CALLER_CPU_EVERY dispatches. (2) A
 * worker does not sched_yield() while spinning: under EEVDF each yield
 * pushes the thread's deadline back a slice, so a worker that yields every
 * few microseconds is seldom running when a job arrives. (3) The caller
 * waiting for workers inside a job does yield every POOL_YIELD_EVERY
 * iterations: the thread it waits for may be runnable on its own CPU.
 * The measurements behind these are in docs/perf/pool.md. */
#define POOL_CPU_CHECK 64
#define POOL_CALLER_CPU_EVERY 16
#define POOL_YIELD_EVERY 256

/* Sleep while state == expected (spurious returns allowed). */
static void park_wait(tern_pool_t *p, uint32_t expected, uint32_t bits) {
#ifdef POOL_HAVE_FUTEX
    syscall(SYS_futex, (uint32_t *)&p->state, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected,
            NULL, NULL, bits);
#else
    (void)bits;
    pthread_mutex_lock(&p->park_mu);
    if (atomic_load(&p->state) == expected) pthread_cond_wait(&p->park_cv, &p->park_mu);
    pthread_mutex_unlock(&p->park_mu);
#endif
}

static void park_wake(tern_pool_t *p, uint32_t bits) {
#ifdef POOL_HAVE_FUTEX
    syscall(SYS_futex, (uint32_t *)&p->state, FUTEX_WAKE_BITSET | FUTEX_PRIVATE_FLAG, INT_MAX,
            NULL, NULL, bits);
#else
    (void)bits;
    pthread_mutex_lock(&p->park_mu);
    pthread_cond_broadcast(&p->park_cv);
    pthread_mutex_unlock(&p->park_mu);
#endif
}

/* ---- the job ------------------------------------------------------------- */

/* Claim and run chunks until none are left or a job failed. */
static void pool_work(tern_pool_t *p, int worker) {
    const uint64_t n = p->n_chunks;
    const pool_range_t *rg = p->ranges;
    int r = 0;
    for (;;) {
        uint64_t c = atomic_fetch_add_explicit(&p->cursor, 1, memory_order_relaxed);
        if (c >= n) return;
        if (atomic_load_explicit(&p->job_err, memory_order_relaxed)) return;
        while (c >= rg[r].chunk_end) r++; /* cursor values only grow per thread */
        int64_t b, len;
        if (c < rg[r].tail_chunk) {
            b = (int64_t)(c - rg[r].chunk_begin) * rg[r].chunk_rows;
            len = rg[r].chunk_rows;
        } else {
            b = rg[r].tail_row + (int64_t)(c - rg[r].tail_chunk) * rg[r].tail_rows;
            len = rg[r].tail_rows;
        }
        int64_t e = rg[r].n_rows - b > len ? b + len : rg[r].n_rows;
        int rc = rg[r].fn(rg[r].ctx, b, e, worker);
        if (rc) {
            int zero = 0;
            if (atomic_compare_exchange_strong_explicit(&p->job_err, &zero, rc, memory_order_relaxed,
                                                        memory_order_relaxed)) {
                p->job_err_range = r;
                p->job_err_row = b;
            }
            return;
        }
    }
}

/* Move worker i to an allowed CPU other than `avoid` (the creator's or the
 * caller's), then give it back the full mask: not pinning, the scheduler
 * may move it again later. Why: a new thread starts next to its creator,
 * and a woken thread is often placed on its waker's CPU; a worker that then
 * spins never goes through placement again, and on a busy machine (with
 * autogroup scheduling the load balancer sees no imbalance in two threads
 * of one group sharing a CPU) the caller and its worker can time-share one
 * CPU for good, preempting each other thousands of times a second
 * (measured: docs/perf/pool.md). Two syscalls, only when that happened. */
static void move_off(tern_pool_t *p, int index, int avoid) {
#ifdef __linux__
    int n = CPU_COUNT(&p->allowed);
    if (n < 2 || p->oversubscribed) return;
    int others = avoid >= 0 && avoid < CPU_SETSIZE && CPU_ISSET(avoid, &p->allowed) ? n - 1 : n;
    int want = (index - 1) % others, k = 0, target = -1;
    for (int c = 0; c < CPU_SETSIZE && target < 0; c++) {
        if (!CPU_ISSET(c, &p->allowed) || c == avoid) continue;
        if (k++ == want) target = c;
    }
    if (target < 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(target, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) sched_setaffinity(0, sizeof p->allowed, &p->allowed);
#else
    (void)p, (void)index, (void)avoid;
#endif
}

/* The caller's last known CPU if this thread runs on it, else -1. */
static inline int on_caller_cpu(tern_pool_t *p) {
#ifdef __linux__
    int cpu = sched_getcpu();
    return cpu >= 0 && cpu == atomic_load_explicit(&p->caller_cpu, memory_order_relaxed) ? cpu : -1;
#else
    (void)p;
    return -1;
#endif
}

static void *worker_main(void *arg) {
    pool_worker_t *w = arg;
    tern_pool_t *p = w->pool;
#ifdef __linux__
    char name[16];
    snprintf(name, sizeof name, "tern-w%d", w->index);
    pthread_setname_np(pthread_self(), name);
#endif
    if (p->pin) cpu_pin_thread(w->index);
#ifdef __linux__
    else move_off(p, w->index, p->creator_cpu);
#endif
    /* The epoch at creation, not whatever the word holds when this thread
     * first runs: a pool may publish (or be freed) before we get here. */
    uint32_t seen = 0;
    for (;;) {
        /* Wait for a new epoch: spin, then park. */
        uint32_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        int64_t budget = p->oversubscribed ? 0 : atomic_load_explicit(&p->spin, memory_order_relaxed);
        for (int64_t i = 0; (s >> ST_EPOCH_SHIFT) == seen && i < budget; i++) {
            if (!p->pin && (i & (POOL_CPU_CHECK - 1)) == POOL_CPU_CHECK - 1) {
                int cpu = on_caller_cpu(p);
                if (cpu >= 0) move_off(p, w->index, cpu);
            }
            cpu_relax();
            s = atomic_load_explicit(&p->state, memory_order_acquire);
        }
        while ((s >> ST_EPOCH_SHIFT) == seen) {
            /* No decrement after waking: the publisher that wakes us takes
             * the count (exchange to 0), so a woken worker that has not been
             * scheduled yet does not draw a wake syscall from every
             * following publish. A futex return without that (the word
             * changed under a join/leave) leaves the count one too high:
             * one harmless extra wake later, never a missed one. */
            atomic_fetch_add_explicit(&p->n_sleeping, 1, memory_order_seq_cst);
            s = atomic_load_explicit(&p->state, memory_order_seq_cst);
            if ((s >> ST_EPOCH_SHIFT) == seen) park_wait(p, s, WAKE_WORKERS);
            s = atomic_load_explicit(&p->state, memory_order_acquire);
        }
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
        seen = s >> ST_EPOCH_SHIFT;
        /* Join the open job, if it is still open. */
        bool joined = false;
        while (!(s & ST_CLOSED) && (s >> ST_EPOCH_SHIFT) == seen) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                joined = true;
                break;
            }
        }
        if (!joined) continue;
        pool_work(p, w->index);
        uint32_t old = atomic_fetch_sub_explicit(&p->state, 1, memory_order_acq_rel);
        if ((old & ST_INSIDE_MASK) == 1 && (old & ST_WAITER)) park_wake(p, WAKE_CALLER);
    }
}

/* ---- creation ------------------------------------------------------------ */

static int64_t env_int(const char *name, int64_t dflt, int64_t lo, int64_t hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        tern_log(TERN_LOG_WARN, "ignoring %s='%s' (expected an integer in [%lld, %lld])", name, v,
                (long long)lo, (long long)hi);
        return dflt;
    }
    return x;
}

int tern_threads_default(char *why, size_t why_len) {
    const char *v = getenv("TERN_THREADS");
    if (v && *v) {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (!errno && !*end && x >= 0 && x <= POOL_MAX_THREADS) {
            int n = x <= 1 ? 1 : (int)x;
            if (why && why_len)
                snprintf(why, why_len, "TERN_THREADS=%ld%s", x, x <= 1 ? " (serial)" : "");
            return n;
        }
        char hw[256];
        int n = cpu_perf_cores(hw, sizeof hw);
        if (why && why_len)
            snprintf(why, why_len, "TERN_THREADS='%.32s' is not an integer in [0, %d], ignored; %s", v,
                     POOL_MAX_THREADS, hw);
        return n;
    }
    char hw[256];
    int n = cpu_perf_cores(hw, sizeof hw);
    if (why && why_len) snprintf(why, why_len, "%s", hw);
    return n;
}

static void pool_stop_workers(tern_pool_t *p) {
    atomic_store_explicit(&p->stop, true, memory_order_relaxed);
    uint32_t s = atomic_load_explicit(&p->state, memory_order_relaxed);
    /* A new epoch, still CLOSED: every waiter sees the change, nobody joins. */
    atomic_store_explicit(&p->state, (s & ~ST_INSIDE_MASK) + ST_EPOCH_ONE, memory_order_seq_cst);
    park_wake(p, WAKE_WORKERS);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].thread, NULL);
    p->n_started = 0;
}

static void pool_release(tern_pool_t *p) {
    if (p->workers)
        for (int i = 0; i < p->n_threads - 1; i++) tern_free(p->workers[i].scratch);
    tern_free(p->workers);
    tern_free(p->caller_scratch);
    tern_free(p->ranges);
#ifndef POOL_HAVE_FUTEX
    pthread_mutex_destroy(&p->park_mu);
    pthread_cond_destroy(&p->park_cv);
#endif
    tern_free(p);
}

tern_pool_t *tern_pool_create(int n_threads, size_t scratch_bytes, tern_error_t *err) {
    if (n_threads <= 0) n_threads = tern_threads_default(NULL, 0);
    if (n_threads > POOL_MAX_THREADS) {
        tern_err(err, TERN_EINVAL, "pool: %d threads requested, at most %d supported", n_threads,
                 POOL_MAX_THREADS);
        return NULL;
    }
    tern_pool_t *p = tern_calloc(1, sizeof *p);
    if (!p) {
        tern_err(err, TERN_ENOMEM, "pool: out of memory");
        return NULL;
    }
    atomic_init(&p->state, ST_CLOSED);
    atomic_init(&p->cursor, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->job_err, 0);
    atomic_flag_clear(&p->busy);
    atomic_init(&p->stop, false);
    atomic_init(&p->caller_cpu, -1);
    atomic_init(&p->spin, env_int("TERN_POOL_SPIN", POOL_SPIN_DEFAULT, 0, INT64_MAX));
    atomic_init(&p->gate, env_int("TERN_POOL_GATE", POOL_GATE_DEFAULT, 0, INT64_MAX));
    p->n_threads = n_threads;
    p->oversubscribed = n_threads > cpu_online();
    const char *aff = getenv("TERN_AFFINITY");
    p->pin = aff && !strcmp(aff, "1");
    p->scratch_size = scratch_bytes;
#ifndef POOL_HAVE_FUTEX
    pthread_mutex_init(&p->park_mu, NULL);
    pthread_cond_init(&p->park_cv, NULL);
#endif
    p->ranges_cap = 8;
    p->ranges = tern_calloc((size_t)p->ranges_cap, sizeof *p->ranges);
    p->caller_scratch = tern_alloc(scratch_bytes);
    p->workers = tern_calloc((size_t)n_threads, sizeof *p->workers); /* >= 1 element */
    bool ok = p->ranges && p->caller_scratch && p->workers;
    for (int i = 0; ok && i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].index = i + 1;
        p->workers[i].scratch = tern_alloc(scratch_bytes);
        ok = p->workers[i].scratch != NULL;
    }
    if (!ok) {
        pool_release(p);
        tern_err(err, TERN_ENOMEM, "pool: out of memory for %d threads with %zu bytes of scratch each",
                 n_threads, scratch_bytes);
        return NULL;
    }
#ifdef __linux__
    CPU_ZERO(&p->allowed);
    if (sched_getaffinity(0, sizeof p->allowed, &p->allowed) != 0) CPU_ZERO(&p->allowed);
    p->creator_cpu = sched_getcpu();
#endif
    /* Workers take no asynchronous signals: Ctrl-C and friends go to the
     * application's threads, never to a pool thread in the middle of a job.
     * Faults stay unblocked so a crash in a job is reported where it is. */
    sigset_t all, old;
    sigfillset(&all);
    const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&all, faults[i]);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = 0;
    for (int i = 0; i < n_threads - 1; i++) {
        rc = pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]);
        if (rc) break;
        p->n_started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        pool_stop_workers(p);
        pool_release(p);
        tern_err(err, TERN_ENOMEM, "pool: cannot create thread %d of %d: %s", p->n_started + 1,
                 n_threads, strerror(rc));
        return NULL;
    }
    return p;
}

void tern_pool_free(tern_pool_t *p) {
    if (!p) return;
    /* Freeing a pool in the middle of its own run is a caller bug that would
     * free memory under running workers: stop here instead. */
    TERN_CHECK(!atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire));
    pool_stop_workers(p);
    pool_release(p);
}

int tern_pool_threads(const tern_pool_t *p) { return p ? p->n_threads : 1; }

void *tern_pool_scratch(tern_pool_t *p, int worker) {
    if (!p || worker < 0 || worker >= p->n_threads) return NULL;
    return worker == 0 ? p->caller_scratch : p->workers[worker - 1].scratch;
}

size_t tern_pool_scratch_size(const tern_pool_t *p) { return p ? p->scratch_size : 0; }

uint64_t tern_pool_dispatch_count(void) {
    return atomic_load_explicit(&g_dispatches, memory_order_relaxed);
}

uint64_t tern_pool_dispatches(const tern_pool_t *p) {
    return p ? atomic_load_explicit(&p->dispatches, memory_order_relaxed) : 0;
}

void tern_pool_set_spin(tern_pool_t *p, int64_t iters) {
    if (p) atomic_store_explicit(&p->spin, iters < 0 ? 0 : iters, memory_order_relaxed);
}
int64_t tern_pool_spin(const tern_pool_t *p) {
    return p ? atomic_load_explicit(&((tern_pool_t *)p)->spin, memory_order_relaxed) : 0;
}
void tern_pool_set_gate(tern_pool_t *p, int64_t bytes) {
    if (p) atomic_store_explicit(&p->gate, bytes < 0 ? 0 : bytes, memory_order_relaxed);
}
int64_t tern_pool_gate(const tern_pool_t *p) {
    return p ? atomic_load_explicit(&((tern_pool_t *)p)->gate, memory_order_relaxed) : 0;
}

/* ---- running a job ------------------------------------------------------- */

static int run_serial(const tern_range_t *r, int n, tern_error_t *err) {
    for (int i = 0; i < n; i++) {
        if (r[i].n_rows == 0) continue;
        int rc = r[i].fn(r[i].ctx, 0, r[i].n_rows, 0);
        if (rc)
            return tern_err(err, TERN_EJOB, "pool: range %d (rows 0..%lld) failed with %d", i,
                            (long long)r[i].n_rows, rc);
    }
    return 0;
}

static int validate(const tern_range_t *r, int n, tern_error_t *err) {
    if (n < 0 || (n > 0 && !r))
        return tern_err(err, TERN_EINVAL, "pool: bad range list (%d ranges at %p)", n, (const void *)r);
    for (int i = 0; i < n; i++) {
        if (!r[i].fn) return tern_err(err, TERN_EINVAL, "pool: range %d has no job function", i);
        if (r[i].n_rows < 0)
            return tern_err(err, TERN_EINVAL, "pool: range %d has %lld rows", i, (long long)r[i].n_rows);
        if (r[i].align < 1)
            return tern_err(err, TERN_EINVAL, "pool: range %d has row alignment %lld (must be >= 1)",
                            i, (long long)r[i].align);
        if (r[i].cost < 0)
            return tern_err(err, TERN_EINVAL, "pool: range %d has negative cost %lld", i,
                            (long long)r[i].cost);
    }
    return 0;
}

/* Total work in bytes (saturating); *unknown when some range has cost 0. */
static uint64_t total_cost(const tern_range_t *r, int n, bool *unknown) {
    uint64_t total = 0;
    *unknown = false;
    for (int i = 0; i < n; i++) {
        if (r[i].n_rows == 0) continue;
        if (r[i].cost == 0) *unknown = true;
        uint64_t c;
        if (tern_mul_overflow_u64((uint64_t)r[i].n_rows, (uint64_t)(r[i].cost ? r[i].cost : 1), &c) ||
            tern_add_overflow_u64(total, c, &total))
            total = UINT64_MAX;
    }
    return total;
}

/* Cut the ranges into chunks of about total / (threads * CHUNKS_PER_THREAD)
 * work each (fewer, down to one per thread, where that would make them
 * smaller than POOL_MIN_CHUNK_WORK), rounded up to each range's alignment,
 * the job's tail finer (POOL_TAIL_SPLIT). Fills the job slot;
 * called only while the slot is the caller's. */
static int plan_job(tern_pool_t *p, const tern_range_t *r, int n, bool unknown, uint64_t total,
                    tern_error_t *err) {
    if (n > p->ranges_cap) {
        /* Grow-only: a job shape seen once costs no allocation again. */
        int cap = p->ranges_cap;
        while (cap < n) cap = cap > INT_MAX / 2 ? n : cap * 2;
        pool_range_t *nr = tern_calloc((size_t)cap, sizeof *nr);
        if (!nr) return tern_err(err, TERN_ENOMEM, "pool: out of memory for %d ranges", n);
        tern_free(p->ranges);
        p->ranges = nr;
        p->ranges_cap = cap;
    }
    uint64_t per_thread = POOL_CHUNKS_PER_THREAD;
    if (!unknown) {
        const uint64_t fit = total / ((uint64_t)p->n_threads * POOL_MIN_CHUNK_WORK);
        if (fit < per_thread) per_thread = fit < 1 ? 1 : fit;
    }
    uint64_t target = total / ((uint64_t)p->n_threads * per_thread);
    if (target == 0) target = 1;
    uint64_t next = 0;
    for (int i = 0; i < n; i++) {
        pool_range_t *d = &p->ranges[i];
        uint64_t cost = unknown || r[i].cost == 0 ? 1 : (uint64_t)r[i].cost;
        uint64_t align = (uint64_t)r[i].align;
        /* target < 2^61 and cost < 2^63: no overflow; rows < 2^63 before
         * rounding up to align < 2^63, so the sum fits too. */
        uint64_t rows = (target + cost - 1) / cost;
        if (rows < align) rows = align;
        else if (rows % align) rows += align - rows % align;
        if (rows > (uint64_t)r[i].n_rows && r[i].n_rows > 0) rows = (uint64_t)r[i].n_rows;
        if (rows == 0) rows = 1;
        const uint64_t n_rows = (uint64_t)r[i].n_rows;
        uint64_t chunks = (n_rows + rows - 1) / rows;
        /* The tail: the last range's final n_threads * rows rows (or all of
         * it, if shorter), in chunks of rows / POOL_TAIL_SPLIT (at least
         * POOL_TAIL_MIN_WORK) rounded down to align; the rows before it stay
         * in whole chunks of rows. */
        uint64_t big = chunks, tail_row = n_rows, small = rows, tail_chunks = 0;
        uint64_t cut = rows / POOL_TAIL_SPLIT;
        const uint64_t min_cut = (POOL_TAIL_MIN_WORK + cost - 1) / cost;
        if (cut < min_cut) cut = min_cut;
        cut = cut / align * align;
        if (i == n - 1 && p->n_threads > 1 && per_thread == POOL_CHUNKS_PER_THREAD && cut >= 1 && cut < rows) {
            uint64_t span;
            if (tern_mul_overflow_u64((uint64_t)p->n_threads, rows, &span)) span = UINT64_MAX;
            big = n_rows > span ? (n_rows - span) / rows : 0;
            tail_row = big * rows;
            small = cut;
            tail_chunks = (n_rows - tail_row + small - 1) / small;
            chunks = big + tail_chunks;
        }
        d->fn = r[i].fn;
        d->ctx = r[i].ctx;
        d->n_rows = r[i].n_rows;
        d->chunk_rows = (int64_t)rows;
        d->tail_row = (int64_t)tail_row;
        d->tail_rows = (int64_t)small;
        d->chunk_begin = next;
        d->tail_chunk = next + big;
        if (tern_add_overflow_u64(next, chunks, &next))
            return tern_err(err, TERN_EINVAL, "pool: job too large (chunk count overflows)");
        d->chunk_end = next;
        if (tail_chunks == 0) d->tail_chunk = next;
    }
    /* Each thread overshoots the cursor by at most one claim: keep it far
     * from wrapping. */
    if (next > UINT64_MAX / 2)
        return tern_err(err, TERN_EINVAL, "pool: job too large (%llu chunks)", (unsigned long long)next);
    p->n_ranges = n;
    p->n_chunks = next;
    return 0;
}

int tern_pool_run(tern_pool_t *p, const tern_range_t *r, int n, tern_error_t *err) {
    int rc = validate(r, n, err);
    if (rc) return rc;
    if (!p) return run_serial(r, n, err);
    if (atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire))
        return tern_err(err, TERN_EBUSY,
                        "pool: already running a job (tern_pool_run from two threads at once, or "
                        "from inside one of its own jobs)");
    bool unknown;
    uint64_t total = total_cost(r, n, &unknown);
    uint64_t gate = (uint64_t)atomic_load_explicit(&p->gate, memory_order_relaxed);
    if (p->n_threads == 1 || (!unknown && total < gate)) {
        rc = run_serial(r, n, err);
        atomic_flag_clear_explicit(&p->busy, memory_order_release);
        return rc;
    }
    rc = plan_job(p, r, n, unknown, total, err);
    if (rc || p->n_chunks <= 1) {
        if (!rc) rc = run_serial(r, n, err); /* one chunk: nothing to share */
        atomic_flag_clear_explicit(&p->busy, memory_order_release);
        return rc;
    }
    atomic_store_explicit(&p->cursor, 0, memory_order_relaxed);
    atomic_store_explicit(&p->job_err, 0, memory_order_relaxed);

#ifdef __linux__
    if (p->n_runs++ % POOL_CALLER_CPU_EVERY == 0)
        atomic_store_explicit(&p->caller_cpu, sched_getcpu(), memory_order_relaxed);
#endif
    /* Publish. We own the word while CLOSED: nobody else writes it. */
    uint32_t s = atomic_load_explicit(&p->state, memory_order_relaxed);
    uint32_t open = ((s >> ST_EPOCH_SHIFT) + 1) << ST_EPOCH_SHIFT;
    atomic_store_explicit(&p->state, open, memory_order_seq_cst);
    atomic_fetch_add_explicit(&g_dispatches, 1, memory_order_relaxed);
    atomic_store_explicit(&p->dispatches, atomic_load_explicit(&p->dispatches, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (atomic_load_explicit(&p->n_sleeping, memory_order_seq_cst) > 0 &&
        atomic_exchange_explicit(&p->n_sleeping, 0, memory_order_seq_cst) > 0)
        park_wake(p, WAKE_WORKERS);

    pool_work(p, 0);

    /* Close: wait until every worker that joined has left. */
    int64_t budget = p->oversubscribed ? 0 : atomic_load_explicit(&p->spin, memory_order_relaxed);
    s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (int64_t i = 0;;) {
        if ((s & ST_INSIDE_MASK) == 0) {
            uint32_t closed = (s & ~ST_WAITER) | ST_CLOSED;
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, closed, memory_order_acq_rel,
                                                      memory_order_acquire))
                break;
            continue;
        }
        if (i < budget) {
            if ((i++ & (POOL_YIELD_EVERY - 1)) == POOL_YIELD_EVERY - 1) sched_yield();
            else cpu_relax();
            s = atomic_load_explicit(&p->state, memory_order_acquire);
            continue;
        }
        if (!(s & ST_WAITER)) {
            if (!atomic_compare_exchange_weak_explicit(&p->state, &s, s | ST_WAITER, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue;
            s |= ST_WAITER;
        }
        park_wait(p, s, WAKE_CALLER);
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }

    int job_rc = atomic_load_explicit(&p->job_err, memory_order_relaxed);
    if (job_rc) {
        int ri = p->job_err_range;
        rc = tern_err(err, TERN_EJOB, "pool: range %d (chunk at row %lld) failed with %d", ri,
                      (long long)p->job_err_row, job_rc);
    }
    atomic_flag_clear_explicit(&p->busy, memory_order_release);
    return rc;
}
