/*
 * disk_probe.h - the read rate of the storage under a model file: the
 * roofline of a Mixture-of-Experts decode whose routed experts come from
 * the file through the expert cache (a token can go no faster than the
 * bytes it must read, over the rate the disk gives them). Used by
 * `tern bench -m FILE --expert-cache LIST`.
 */
#ifndef TERN_BENCH_DISK_PROBE_H
#define TERN_BENCH_DISK_PROBE_H

#include <stddef.h>
#include <stdint.h>

#define BENCH_DISK_SEQ_CHUNK (8u << 20)         /* bytes per sequential read */
#define BENCH_DISK_SEQ_MAX ((uint64_t)4 << 30) /* the sequential pass reads at most this much */
#define BENCH_DISK_ALIGN 4096u                 /* direct reads: offsets, lengths and buffers */

typedef struct {
    int direct;           /* 1: O_DIRECT reads; 0: the file system refuses them: buffered reads, each
                           * range dropped from the page cache before and after (as the expert cache does) */
    double seq_gbps;      /* (a) sequential: BENCH_DISK_SEQ_CHUNK reads, one reader, from the file's start */
    uint64_t seq_bytes;   /* what (a) read (the file, up to BENCH_DISK_SEQ_MAX or the time limit) */
    double seq_s;
    double rand_gbps;     /* (b) the expert cache's pattern: reads of read_bytes at random offsets that
                           * are multiples of read_bytes, `readers` threads at once */
    uint64_t read_bytes;  /* one read of (b): the slot size rounded up to BENCH_DISK_ALIGN */
    uint64_t rand_bytes, rand_reads;
    double rand_s;
    int readers;
} bench_disk_t;

/* Measure (a) (sequential != 0; else seq_* stay 0) and (b) on the file at
 * path, each for at most `seconds` (the sequential pass also stops at the
 * end of the file or BENCH_DISK_SEQ_MAX). GB/s are 1e9 bytes per second of
 * wall time. 0, or -1 with a message in msg (the file cannot be opened or
 * read, or the threads not started). */
int bench_disk_probe(const char *path, uint64_t slot_bytes, int readers, double seconds, int sequential,
                     bench_disk_t *out, char *msg, size_t cap);

/* Drop the file's pages from the page cache (posix_fadvise
 * POSIX_FADV_DONTNEED over the whole file), so that the next reads come
 * from the disk; pages some process has mapped, or dirty ones, stay. 0 or
 * an errno value. */
int bench_drop_page_cache(const char *path);

#endif
