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

/* Little-endian integers in byte buffers: the on-disk and blob formats
 * (KV cache, session files, sampler state) are little-endian whatever the
 * host. */
static inline void le_put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void le_put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t le_get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t le_get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Monotonic clock in nanoseconds. */
uint64_t tern_now_ns(void);

#endif
