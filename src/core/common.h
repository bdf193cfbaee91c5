/*
 * common.h - small helpers shared by every layer: the always-on invariant
 * check, error formatting, aligned allocation, overflow-checked arithmetic.
 */
#ifndef TERN_COMMON_H
#define TERN_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern_error.h"

/* A broken internal invariant (never bad input) stops the program with file
 * and line. Stays on under NDEBUG, unlike assert(). */
#define TERN_CHECK(cond)                                                    \
    do {                                                                    \
        if (!(cond)) tern_fatal(__FILE__, __LINE__, #cond);                 \
    } while (0)

_Noreturn void tern_fatal(const char *file, int line, const char *expr);

/* Fill err (may be NULL) and return code. printf-style. */
int tern_err(tern_error_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Log a line through the application's callback (tern_log_set; default
 * stderr). printf-style, no trailing newline. */
void tern_log(tern_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 64-byte aligned allocation; size 0 allowed; free accepts NULL. */
void *tern_alloc(size_t size);
void *tern_calloc(size_t n, size_t size); /* overflow-checked, zeroed */
void tern_free(void *p);

static inline bool tern_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool tern_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* Monotonic clock in nanoseconds. */
uint64_t tern_now_ns(void);

#endif
