/* testutil.h - helpers shared by the cmocka tests. */
#ifndef TERN_TESTUTIL_H
#define TERN_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/kernels.h"

/* Path of a file under ../shared (TERN_SHARED env overrides the build-time
 * default). Returns NULL when the file is absent; the caller then skips with
 * a message (test_skip_missing). The returned string is static storage
 * (a small ring of buffers). */
const char *tu_shared(const char *rel);
/* Print a clear message and skip the current cmocka test. */
#define TU_REQUIRE_SHARED(var, rel)                                                      \
    const char *var = tu_shared(rel);                                                    \
    if (!var) {                                                                          \
        print_message("SKIP: %s not found (../shared absent; set TERN_SHARED)\n", rel);  \
        skip();                                                                          \
    }
/* 1 when TERN_TEST_QUICK is set (sanitizer builds run reduced iteration counts). */
int tu_quick(void);
/* Read a whole file (malloc'd, NUL-terminated); NULL on error. */
char *tu_read_file(const char *path, size_t *len);
/* Deterministic xorshift RNG for tests. */
uint64_t tu_rand(uint64_t *state);
float tu_randn(uint64_t *state); /* approx. standard normal */

/* A kernel table entry's GEMM (kern_gemm_t) run as the driver runs it: prep
 * per group of KERN_GEMM_GROUP columns (64-aligned group stride), then run
 * over all rows with a 64-aligned scratch. Activation column c at a + c *
 * ast; y[c * nrows + r]. Fails the test on an allocation failure. */
void tu_run_gemm(const kern_gemm_t *g, int64_t k, const uint8_t *w, size_t row_bytes, int64_t nrows,
                 const uint8_t *a, size_t ast, int64_t n, float *y);

#endif
