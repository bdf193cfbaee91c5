/* common.c - see common.h. */
#define _GNU_SOURCE
#include "core/common.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tern_fatal(const char *file, int line, const char *expr) {
    fprintf(stderr, "tern: internal error at %s:%d: check failed: %s\n", file, line, expr);
    abort();
}

/* The callback and its user pointer travel together in one allocation-free
 * pair; a reader may see the old or the new pair, never a mix. */
typedef struct {
    tern_log_fn fn;
    void *user;
} log_sink_t;
static log_sink_t g_sinks[2];
static _Atomic int g_sink = -1; /* index into g_sinks, -1: stderr */
static atomic_flag g_sink_lock = ATOMIC_FLAG_INIT;

void tern_log_set(tern_log_fn fn, void *user) {
    while (atomic_flag_test_and_set(&g_sink_lock)) {
    }
    if (!fn) {
        atomic_store(&g_sink, -1);
    } else {
        int next = atomic_load(&g_sink) == 0 ? 1 : 0;
        g_sinks[next].fn = fn;
        g_sinks[next].user = user;
        atomic_store(&g_sink, next);
    }
    atomic_flag_clear(&g_sink_lock);
}

void tern_log(tern_log_level_t level, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int i = atomic_load(&g_sink);
    if (i < 0) {
        fprintf(stderr, "tern: %s\n", msg);
        return;
    }
    g_sinks[i].fn(level, msg, g_sinks[i].user);
}

int tern_err(tern_error_t *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void *tern_alloc(size_t size) {
    void *p = NULL;
    size_t rounded = (size + 63) & ~(size_t)63;
    if (rounded < size) return NULL;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) return NULL;
    return p;
}

void *tern_calloc(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) return NULL;
    void *p = tern_alloc(total);
    if (p) memset(p, 0, total);
    return p;
}

void tern_free(void *p) { free(p); }

uint64_t tern_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
