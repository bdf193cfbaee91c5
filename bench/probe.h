/*
 * probe.h - the machine's read bandwidth, the roofline of a decode step
 * (whose matvecs stream every weight once per token). Used by
 * `tern bench kernels` and `tern bench -m`.
 */
#ifndef TERN_BENCH_PROBE_H
#define TERN_BENCH_PROBE_H

#include <stddef.h>

/* Read bandwidth in GB/s (1e9 bytes/s) of `threads` threads together
 * reading a buffer of `bytes` (use >> the last-level cache, e.g. 1 GiB),
 * STREAM-style but with the fastest pattern we know: each thread reads its
 * slice as several independent streams with the widest loads the CPU has;
 * the best of a few stream counts and repetitions is returned, so the probe
 * never flatters a kernel measured against it. The buffer is allocated and
 * faulted in on first use and kept for the next call (grown if a later call
 * asks for more); bench_probe_release frees it. Returns a negative value
 * when the buffer or the threads cannot be had. Not thread-safe. */
double bench_probe_read_gbps(int threads, size_t bytes);
void bench_probe_release(void);

/* One pass of the pattern that won the last bench_probe_read_gbps(threads,
 * ...) call over the caller's buffer buf of bytes (only read). On a shared
 * machine the bandwidth left to us drifts by tens of percent within
 * seconds, so a kernel is best compared with passes taken moments before
 * it over memory of the same kind (see bench_kernels.c). One pass, not the
 * best of several: a second pass over a buffer smaller than the last-level
 * cache would partly hit in it. Negative if no pattern is known for threads
 * yet, or on failure. Not thread-safe. */
double bench_probe_pass_gbps(int threads, const void *buf, size_t bytes);

/* Median of v[0..n-1] (n >= 1; sorts v): how the benchmarks summarize the
 * ratios of their paired rounds (a kernel or a decode against the probe
 * pass taken just before it). */
double bench_median(double *v, int n);

/* A large buffer allocated the way the probe allocates its own (anonymous
 * mmap, transparent huge pages requested, faulted in), so that kernels
 * measured against the probe see the same page-size effects. NULL on
 * failure; free with bench_big_free(p, bytes). */
void *bench_big_alloc(size_t bytes);
void bench_big_free(void *p, size_t bytes);

/* The last-level cache this process can use, in bytes (0 = unknown), and
 * where the figure comes from (src, may be NULL): the cpu layer's
 * cpu_llc_bytes. A decode whose weights fit in it is served from the cache,
 * not from DRAM, so the bandwidth probe is no roofline for it. */
size_t bench_llc_bytes(char *src, size_t src_len);

#endif
