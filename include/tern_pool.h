/*
 * tern_pool.h - tern's persistent worker pool as a public product:
 * row-parallel work on threads spawned once, dispatched by an atomic epoch,
 * the caller working too (src/core/pool.c specifies the protocol).
 *
 * Usage (error handling shortened):
 *
 *     tern_error_t err;
 *     tern_pool_t *pool = tern_pool_create(0, 0, &err);     // 0 = default threads
 *     tern_range_t r = { my_rows_fn, my_ctx, n_rows, 16, bytes_per_row };
 *     if (tern_pool_run(pool, &r, 1, &err) != 0) fprintf(stderr, "%s\n", err.msg);
 *     tern_pool_free(pool);
 *
 * Threading contract: a tern_pool_t is driven by one caller thread at a time
 * (see tern_pool_run). Whoever creates a pool frees it; tern_pool_free
 * accepts NULL.
 */
#ifndef TERN_POOL_H
#define TERN_POOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "tern_error.h"

/* ---- the persistent worker pool ---------------------------------------- */

typedef struct tern_pool tern_pool_t;

/* The most threads a pool can have (tern_pool_create fails beyond). */
#define TERN_POOL_MAX_THREADS 1024

/* A job body: process rows [row_begin, row_end) of one range. `worker` is
 * 0 for the calling thread and 1..n_threads-1 for pool threads; it indexes
 * per-worker scratch. Return 0, or a nonzero error code that the dispatch
 * reports to its caller (the first one wins). */
typedef int (*tern_job_fn)(void *ctx, int64_t row_begin, int64_t row_end, int worker);

/* One range of rows. Several ranges (e.g. the Q, K and V matrices) may be
 * dispatched as one job. Ranges are split into chunks whose boundaries are
 * multiples of `align` (a chunk never splits a kernel's row block; the last
 * chunk ends at n_rows). `cost` is the approximate number of bytes one row
 * touches; the pool's serial gate uses the total to decide whether the work
 * is too small to pay for waking threads (0 = unknown: always dispatch). */
typedef struct tern_range {
    tern_job_fn fn;
    void *ctx;
    int64_t n_rows;
    int64_t align;
    int64_t cost;
} tern_range_t;

/* Create a pool of n_threads threads in all, the caller included (so
 * n_threads - 1 threads are spawned). n_threads <= 0 means the default
 * (TERN_THREADS, else the physical performance cores). scratch_bytes of
 * 64-byte aligned per-worker scratch are reserved. Returns NULL on error. */
tern_pool_t *tern_pool_create(int n_threads, size_t scratch_bytes, tern_error_t *err);
void tern_pool_free(tern_pool_t *pool);
int tern_pool_threads(const tern_pool_t *pool); /* NULL pool -> 1 */

/* Run all ranges to completion; the caller works too (as worker 0). Returns
 * 0, or the first job error (TERN_EJOB, err->msg names the range and the
 * job's code); after a job fails, chunks not yet started are skipped, and the
 * run still returns only when no thread is inside a job function. A NULL
 * pool, a 1-thread pool, or work below the pool's gate (total n_rows * cost
 * bytes, all costs known) runs the ranges serially on the caller, one call
 * per range. TERN_EINVAL for a bad range (NULL fn, n_rows < 0, align < 1,
 * cost < 0).
 *
 * One caller at a time: if the pool is already running a job (a second
 * thread calling at the same moment, or a job function calling its own
 * pool), this returns TERN_EBUSY at once and runs nothing. It never blocks on
 * another caller: a lock would deadlock the nested case. Serialize your own
 * callers, or give each thread its own pool. */
int tern_pool_run(tern_pool_t *pool, const tern_range_t *ranges, int n_ranges, tern_error_t *err);

/* Per-worker scratch of at least the size given at creation; valid for the
 * pool's lifetime. worker 0 is the caller's. */
void *tern_pool_scratch(tern_pool_t *pool, int worker);
size_t tern_pool_scratch_size(const tern_pool_t *pool);

/* Dispatches: runs that handed work to the pool's threads (not those that
 * stayed on the caller: serial, gated or one-chunk runs). Per pool since its
 * creation (NULL pool -> 0; safe to read from any thread, exact once the
 * pool's runs have returned), and in all pools since process start. */
uint64_t tern_pool_dispatches(const tern_pool_t *pool);
uint64_t tern_pool_dispatch_count(void);

/* Tuning (benchmarks, tests). Call between runs, from the driving thread.
 * spin: wait-loop iterations (load + pause) a worker spins before it parks
 * on a futex; initial value TERN_POOL_SPIN, else the measured default. With
 * more threads than usable CPUs, workers park at once whatever the budget.
 * gate: work in bytes (sum of n_rows * cost) below which a run stays on the
 * caller; initial value TERN_POOL_GATE, else the measured default; 0 = never
 * gate. Negative values are taken as 0. NULL pool: no-op / 0. */
void tern_pool_set_spin(tern_pool_t *pool, int64_t iters);
int64_t tern_pool_spin(const tern_pool_t *pool);
void tern_pool_set_gate(tern_pool_t *pool, int64_t bytes);
int64_t tern_pool_gate(const tern_pool_t *pool);

/* The default thread count and a human-readable reason ("TERN_THREADS=3",
 * "hwloc: 2 physical performance cores" ...). TERN_THREADS=0 or 1 means
 * serial (returns 1); an invalid value is ignored (the reason says so).
 * TERN_AFFINITY=1 makes tern_pool_create pin worker i (1..n-1) to physical
 * performance core i, leaving core 0 to the caller, whose thread belongs to
 * the application and is not pinned. Workers beyond the core count are not
 * pinned. */
int tern_threads_default(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif /* TERN_POOL_H */
