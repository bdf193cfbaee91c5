/* testutil.h - helpers shared by the cmocka tests. */
#ifndef TERN_TESTUTIL_H
#define TERN_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/kernels.h"
#include "model/model.h"
#include "tern.h"
#include "text/tokenizer.h"

/* Path of a file under ../shared (TERN_SHARED env overrides the build-time
 * default). Returns NULL when the file is absent; the caller then skips
 * (TU_REQUIRE_SHARED) or leaves out that part, after tu_shared_missing. The
 * returned string is static storage (a small ring of buffers). */
const char *tu_shared(const char *rel);
/* 1 under CI: CI is set, non-empty and neither "0" nor "false". */
int tu_ci(void);
/* Report that rel is absent under ../shared. Under CI this FAILS the
 * current test (CI must never pass by skipping); otherwise it prints
 * "SKIP: <what>" and returns, and the caller skips. what: e.g. "test", "part". */
void tu_shared_missing(const char *rel, const char *what);
/* Skip the current cmocka test when rel is absent (fail it under CI). */
#define TU_REQUIRE_SHARED(var, rel)                                                      \
    const char *var = tu_shared(rel);                                                    \
    if (!var) {                                                                          \
        tu_shared_missing(rel, "test");                                                  \
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

/* A tiny `tern mkmodel` file (shape, type, seed) under the build folder,
 * <build>/test_model_files/<prefix>-<shape>-<type>.gguf, written once per
 * process. The prefix keeps the files of test programs that ctest runs at
 * the same time apart. Fails the test when it cannot be written. */
const char *tu_tiny_model(const char *prefix, const char *shape, const char *type, uint64_t seed);
/* A model context with these settings (the defaults otherwise); fails the
 * test on an error. */
model_ctx_t *tu_ctx_new(const model_t *m, int threads, int64_t n_ctx, int64_t n_batch, bool kv_f32);
/* model_eval of n tokens that must succeed (all: every position's logits, or NULL). */
void tu_eval_ok(model_ctx_t *c, const int32_t *ids, int64_t n, float *all);

/* The tokenizer of a GGUF file (a vocab-only one under ../shared works);
 * fails the test when the file cannot be read. */
tokenizer_t *tu_tokenizer_load(const char *path);

/* A model under ../shared for a cmocka group: tu_group_model_setup(&m, rel)
 * in the group's setup leaves m NULL when the file is absent (the tests then
 * skip through TU_NEED_MODEL, or fail under CI) and -1 when it cannot be
 * loaded; tern_model_free(m) in the teardown. */
int tu_group_model_setup(tern_model_t **m, const char *rel);
#define TU_NEED_MODEL(m, rel)                                                            \
    if (!(m)) {                                                                          \
        tu_shared_missing(rel, "test");                                                  \
        skip();                                                                          \
    }

#endif
