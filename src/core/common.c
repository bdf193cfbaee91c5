/* common.c - see common.h. */
#define _GNU_SOURCE
#include "core/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tern_fatal(const char *file, int line, const char *expr) {
    fprintf(stderr, "tern: internal error at %s:%d: check failed: %s\n", file, line, expr);
    abort();
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
