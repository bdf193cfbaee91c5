/*
 * disk_probe.c - the storage read-rate probe (see disk_probe.h).
 *
 * Why two patterns: a disk's headline rate is its sequential one (large
 * reads, one stream, the device's read-ahead and the file system's extents
 * working for it), but the expert cache reads one expert at a time at
 * scattered offsets, with several I/O threads so that many reads are in
 * flight (an NVMe drive needs a deep queue to reach its rate, a network
 * disk needs it to hide its latency). The pattern's rate is the one a
 * decode can hope for; the sequential one says what the hardware has.
 *
 * Both read with O_DIRECT where the file system allows it, so the page
 * cache neither helps (a file read before would be served from memory) nor
 * is disturbed (the benchmark's own rows are timed after the probe).
 * Where it does not (tmpfs, some network file systems) the reads are
 * buffered, and each range is dropped from the page cache before it is
 * read and after, as the expert cache itself does there.
 *
 * Threads of (b) are started first and wait for one flag; the time is the
 * wall time from setting it to the last thread's finish, each thread
 * stopping at the first read that ends past the deadline.
 */
#define _GNU_SOURCE
#include "disk_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

#define DISK_MAX_READERS 256

int bench_drop_page_cache(const char *path) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    const int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return rc;
}

/* Read len bytes at off into buf (retrying short reads and EINTR; a read at
 * the end of the file may come back short). Bytes read, or -1 (errno set). */
static int64_t read_at(int fd, int direct, void *buf, size_t len, uint64_t off) {
    if (!direct) (void)posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    size_t got = 0;
    while (got < len) {
        const ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
        if (direct && got % BENCH_DISK_ALIGN) break; /* the file's end */
    }
    if (!direct) (void)posix_fadvise(fd, (off_t)off, (off_t)got, POSIX_FADV_DONTNEED);
    return (int64_t)got;
}

typedef struct {
    int fd, direct;
    uint64_t unit, n_units;
    uint64_t t_start, deadline; /* written before go is set */
    _Atomic int go;             /* 0: wait, 1: run, -1: abandon (a thread failed to start) */
} rand_ctx_t;

typedef struct {
    rand_ctx_t *c;
    int idx;
    void *buf;
    uint64_t bytes, reads, t_end;
    int err; /* errno of a failed read, or 0 */
} rand_arg_t;

static void rand_run(rand_arg_t *a) {
    rand_ctx_t *c = a->c;
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(a->idx + 1) + 7;
    int go;
    while ((go = atomic_load(&c->go)) == 0) sched_yield();
    if (go < 0) return;
    for (;;) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const uint64_t off = (s % c->n_units) * c->unit;
        const int64_t r = read_at(c->fd, c->direct, a->buf, (size_t)c->unit, off);
        if (r < 0) {
            a->err = errno;
            break;
        }
        a->bytes += (uint64_t)r;
        a->reads++;
        if (tern_now_ns() >= c->deadline) break;
    }
    a->t_end = tern_now_ns();
}

static void *rand_thread(void *v) {
    rand_run(v);
    return NULL;
}

/* Open path with O_DIRECT when a first aligned read works through it, else
 * buffered. -1 with errno when it cannot be opened at all. */
static int open_probe(const char *path, int *direct) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd >= 0) {
        void *b = NULL;
        if (posix_memalign(&b, BENCH_DISK_ALIGN, BENCH_DISK_ALIGN) != 0) b = NULL;
        if (b && pread(fd, b, BENCH_DISK_ALIGN, 0) >= 0) {
            free(b);
            *direct = 1;
            return fd;
        }
        free(b);
        close(fd);
    }
    *direct = 0;
    return open(path, O_RDONLY | O_CLOEXEC);
}

int bench_disk_probe(const char *path, uint64_t slot_bytes, int readers, double seconds, int sequential,
                     bench_disk_t *out, char *msg, size_t cap) {
    memset(out, 0, sizeof *out);
    if (readers < 1) readers = 1;
    if (readers > DISK_MAX_READERS) readers = DISK_MAX_READERS;
    if (!(seconds > 0)) seconds = 0.001;
    int direct;
    const int fd = open_probe(path, &direct);
    if (fd < 0) {
        snprintf(msg, cap, "disk probe: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)BENCH_DISK_ALIGN) {
        snprintf(msg, cap, "disk probe: %s is smaller than %u bytes", path, BENCH_DISK_ALIGN);
        close(fd);
        return -1;
    }
    const uint64_t size = (uint64_t)sb.st_size;
    out->direct = direct;
    const uint64_t ns_limit = (uint64_t)(seconds * 1e9);
    int rc = -1;
    void *buf = NULL;
    rand_arg_t *args = NULL;
    pthread_t *tid = NULL;

    /* (a) sequential */
    if (posix_memalign(&buf, BENCH_DISK_ALIGN, BENCH_DISK_SEQ_CHUNK) != 0) {
        buf = NULL;
        snprintf(msg, cap, "disk probe: out of memory");
        goto out;
    }
    if (!direct) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const uint64_t limit = size < BENCH_DISK_SEQ_MAX ? size : BENCH_DISK_SEQ_MAX;
    uint64_t t0 = tern_now_ns(), t1 = t0;
    while (sequential && out->seq_bytes < limit) {
        const int64_t r = read_at(fd, direct, buf, BENCH_DISK_SEQ_CHUNK, out->seq_bytes);
        if (r < 0) {
            snprintf(msg, cap, "disk probe: reading %s: %s", path, strerror(errno));
            goto out;
        }
        out->seq_bytes += (uint64_t)r;
        t1 = tern_now_ns();
        if (r < (int64_t)BENCH_DISK_SEQ_CHUNK || t1 - t0 >= ns_limit) break;
    }
    out->seq_s = (double)(t1 - t0) / 1e9;
    out->seq_gbps = out->seq_s > 0 ? (double)out->seq_bytes / out->seq_s / 1e9 : 0;
    free(buf);
    buf = NULL;

    /* (b) the expert cache's pattern */
    uint64_t unit = (slot_bytes + BENCH_DISK_ALIGN - 1) / BENCH_DISK_ALIGN * BENCH_DISK_ALIGN;
    if (unit == 0) unit = BENCH_DISK_ALIGN;
    if (unit > size) unit = size / BENCH_DISK_ALIGN * BENCH_DISK_ALIGN;
    out->read_bytes = unit;
    out->readers = readers;
    rand_ctx_t c = {.fd = fd, .direct = direct, .unit = unit, .n_units = size / unit};
    atomic_init(&c.go, 0);
    args = calloc((size_t)readers, sizeof *args);
    tid = calloc((size_t)readers, sizeof *tid);
    int ok = args && tid;
    for (int i = 0; ok && i < readers; i++) {
        args[i] = (rand_arg_t){.c = &c, .idx = i};
        if (posix_memalign(&args[i].buf, BENCH_DISK_ALIGN, (size_t)unit) != 0) {
            args[i].buf = NULL;
            ok = 0;
        }
    }
    if (!ok) {
        snprintf(msg, cap, "disk probe: out of memory");
        goto out;
    }
    int started = 0;
    for (int i = 1; i < readers; i++) {
        if (pthread_create(&tid[i], NULL, rand_thread, &args[i]) != 0) break;
        started++;
    }
    if (started != readers - 1) {
        atomic_store(&c.go, -1);
        for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
        snprintf(msg, cap, "disk probe: could not start %d reader threads", readers);
        goto out;
    }
    if (!direct) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    c.t_start = tern_now_ns();
    c.deadline = c.t_start + ns_limit;
    atomic_store(&c.go, 1);
    rand_run(&args[0]);
    for (int i = 1; i < readers; i++) pthread_join(tid[i], NULL);
    uint64_t end = 0;
    for (int i = 0; i < readers; i++) {
        if (args[i].err) {
            snprintf(msg, cap, "disk probe: reading %s: %s", path, strerror(args[i].err));
            goto out;
        }
        out->rand_bytes += args[i].bytes;
        out->rand_reads += args[i].reads;
        end = args[i].t_end > end ? args[i].t_end : end;
    }
    out->rand_s = (double)(end - c.t_start) / 1e9;
    out->rand_gbps = out->rand_s > 0 ? (double)out->rand_bytes / out->rand_s / 1e9 : 0;
    rc = 0;
out:
    if (args)
        for (int i = 0; i < readers; i++) free(args[i].buf);
    free(args);
    free(tid);
    free(buf);
    close(fd);
    return rc;
}
