/* testutil.c - see testutil.h. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev/mkmodel.h"
#include "format/gguf.h"

const char *tu_shared(const char *rel) {
    static char bufs[8][4096];
    static int next;
    const char *base = getenv("TERN_SHARED");
#ifdef TERN_SHARED_DIR
    if (!base || !*base) base = TERN_SHARED_DIR;
#endif
    if (!base) return NULL;
    char *b = bufs[next++ & 7];
    snprintf(b, 4096, "%s/%s", base, rel);
    return access(b, R_OK) == 0 ? b : NULL;
}

int tu_ci(void) {
    const char *ci = getenv("CI");
    if (!ci || !*ci || !strcmp(ci, "0")) return 0;
    return strcmp(ci, "false") && strcmp(ci, "False") && strcmp(ci, "FALSE");
}

void tu_shared_missing(const char *rel, const char *what) {
    const char *base = getenv("TERN_SHARED");
#ifdef TERN_SHARED_DIR
    if (!base || !*base) base = TERN_SHARED_DIR;
#endif
    if (!base) base = "(unset)";
    if (tu_ci())
        fail_msg("%s/%s not found: CI=%s, so a missing ../shared file fails the test instead of skipping it "
                 "(set TERN_SHARED to the folder with models/ and reference/)",
                 base, rel, getenv("CI"));
    print_message("SKIP %s: %s/%s not found (../shared absent; set TERN_SHARED)\n", what, base, rel);
}

int tu_quick(void) {
    const char *q = getenv("TERN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return NULL;
    }
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[n] = 0;
        if (len) *len = (size_t)n;
    }
    return p;
}

uint64_t tu_rand(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

float tu_randn(uint64_t *s) {
    double u1 = ((tu_rand(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (tu_rand(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* A table entry's GEMM run as the driver runs it: prep per group of
 * KERN_GEMM_GROUP columns (64-aligned group stride), then run over all rows
 * with a 64-aligned scratch. y[c * nrows + r]. */
void tu_run_gemm(const kern_gemm_t *g, int64_t k, const uint8_t *w, size_t row_bytes, int64_t nrows,
                     const uint8_t *a, size_t ast, int64_t n, float *y) {
    const int64_t ng = (n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP;
    size_t gstride = 0;
    void *xg = NULL, *scratch = NULL;
    if (g->prep) {
        const size_t gb = g->group_size(k);
        assert_true(gb > 0);
        gstride = (gb + 63) & ~(size_t)63;
        xg = aligned_alloc(64, gstride * (size_t)ng);
        assert_non_null(xg);
        for (int64_t gi = 0; gi < ng; gi++) {
            const int nc = n - gi * KERN_GEMM_GROUP < KERN_GEMM_GROUP ? (int)(n - gi * KERN_GEMM_GROUP) : KERN_GEMM_GROUP;
            g->prep(k, a + (size_t)(gi * KERN_GEMM_GROUP) * ast, ast, nc, (char *)xg + (size_t)gi * gstride);
        }
    }
    const size_t ss = g->scratch_size ? g->scratch_size(k) : 0;
    if (ss) {
        scratch = aligned_alloc(64, (ss + 63) & ~(size_t)63);
        assert_non_null(scratch);
    }
    const kern_gemm_args_t args = {k, n, a, ast, xg, gstride};
    g->run(&args, w, row_bytes, nrows, y, nrows, scratch);
    free(xg);
    free(scratch);
}

const char *tu_tiny_model(const char *prefix, const char *shape, const char *type, uint64_t seed) {
    static char paths[32][512];
    static int n;
    char path[512];
    snprintf(path, sizeof path, "%s/test_model_files/%s-%s-%s.gguf", TERN_BUILD_DIR, prefix, shape, type);
    for (int i = 0; i < n; i++)
        if (!strcmp(paths[i], path)) return paths[i];
    char dir[512];
    snprintf(dir, sizeof dir, "%s/test_model_files", TERN_BUILD_DIR);
    if (mkdir(dir, 0755) != 0) assert_int_equal(access(dir, W_OK), 0); /* exists already */
    mk_opts_t o = {0};
    o.shape = shape;
    o.type = type;
    o.out = path;
    o.seed = seed;
    o.n_threads = 1;
    tern_error_t err = {0};
    int rc = mk_model_write(&o, &err);
    if (rc) print_message("mk_model_write %s %s: %s\n", shape, type, err.msg);
    assert_int_equal(rc, 0);
    assert_true(n < 32);
    snprintf(paths[n], sizeof paths[n], "%s", path);
    return paths[n++];
}

model_ctx_t *tu_ctx_new(const model_t *m, int threads, int64_t n_ctx, int64_t n_batch, bool kv_f32) {
    model_ctx_params_t p = model_ctx_default_params();
    p.n_threads = threads;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.kv_f32 = kv_f32;
    tern_error_t err = {0};
    model_ctx_t *c = model_ctx_new(m, &p, NULL, 0, &err);
    if (!c) print_message("model_ctx_new: %s\n", err.msg);
    assert_non_null(c);
    return c;
}

void tu_eval_ok(model_ctx_t *c, const int32_t *ids, int64_t n, float *all) {
    tern_error_t err = {0};
    int rc = model_eval(c, ids, n, all, &err);
    if (rc) print_message("model_eval: %s\n", err.msg);
    assert_int_equal(rc, 0);
}

tokenizer_t *tu_tokenizer_load(const char *path) {
    tern_error_t err = {0};
    gguf_file_t *f = gguf_open(path, &err);
    if (!f) fail_msg("%s: %s", path, err.msg);
    tokenizer_t *t = tok_load(f, &err);
    gguf_close(f);
    if (!t) fail_msg("%s: %s", path, err.msg);
    return t;
}

int tu_group_model_setup(tern_model_t **m, const char *rel) {
    *m = NULL;
    const char *p = tu_shared(rel);
    if (!p) return 0;
    tern_error_t err = {0};
    *m = tern_model_load(p, &err);
    if (!*m) print_message("%s: %s\n", p, err.msg);
    return *m ? 0 : -1;
}
