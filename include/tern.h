/*
 * tern.h - the public C API of tern, a CPU inference engine for LLMs.
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
 * (see tern_pool_run). Objects are owned by whoever created them; every
 * *_free accepts NULL.
 *
 * Errors: functions that can fail return 0 on success and a negative
 * TERN_E* code on failure, filling `err` (when not NULL) with a message that
 * says what was wrong and where. The library never exits or aborts on bad
 * input; only a broken internal invariant stops the program (TERN_CHECK).
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_VERSION "0.1.0"

/* ---- errors ------------------------------------------------------------ */

enum {
    TERN_OK = 0,
    TERN_EINVAL = -1,   /* bad argument */
    TERN_ENOMEM = -2,   /* allocation failed */
    TERN_EIO = -3,      /* file could not be opened/read/written */
    TERN_EFORMAT = -4,  /* malformed or hostile input file */
    TERN_EUNSUP = -5,   /* valid but unsupported (architecture, type ...) */
    TERN_EBUSY = -6,    /* object in use by another thread */
    TERN_EJOB = -7      /* a pool job reported failure */
};

#define TERN_ERR_MSG 512
typedef struct tern_error {
    int code;
    char msg[TERN_ERR_MSG];
} tern_error_t;

/* ---- the persistent worker pool ---------------------------------------- */

typedef struct tern_pool tern_pool_t;

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

/* Run all ranges to completion; the caller works too. Returns 0, or the
 * first job error (TERN_EJOB, err->msg names the range). A NULL pool runs the
 * ranges serially on the caller. */
int tern_pool_run(tern_pool_t *pool, const tern_range_t *ranges, int n_ranges, tern_error_t *err);

/* Per-worker scratch of at least the size given at creation; valid for the
 * pool's lifetime. worker 0 is the caller's. */
void *tern_pool_scratch(tern_pool_t *pool, int worker);
size_t tern_pool_scratch_size(const tern_pool_t *pool);

/* Dispatches (runs that woke the pool) since process start, all pools. */
uint64_t tern_pool_dispatch_count(void);

/* The default thread count and a human-readable reason ("TERN_THREADS=3",
 * "hwloc: 2 physical performance cores" ...). */
int tern_threads_default(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif /* TERN_H */
