/* test_kv_cache.c - the KV cache module (src/model/kv_cache.c) and the
 * context operations on top of it, on a tiny `tern mkmodel` file, with F16
 * and F32 caches:
 *   - truncate, then evaluate the dropped positions again: the same logits,
 *     bit for bit, as the first evaluation;
 *   - copy a prefix from context A into a fresh context B (another n_ctx, so
 *     other layer strides), evaluate the rest in B: A's logits, bit for bit;
 *   - save A's cache into a memory buffer, restore it into a fresh context,
 *     continue: A's logits, bit for bit;
 *   - restore rejects a truncated buffer (every cut), a wrong layout (KV
 *     type, model shape, edited header fields), a bad magic or version and
 *     an n_pos beyond n_ctx, with a clear error and no crash; a layout
 *     mismatch in copy_prefix is an error too; the layout arithmetic and
 *     the writer's failures.
 */
// ctest-label: concurrent
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "model/kv_cache.h"
#include "model/model.h"

#define N_TOK 24 /* tokens of the test sequence */
#define N_CTX 32

/* ---- helpers ------------------------------------------------------------------ */

static model_t *g_model;    /* "tiny": 2 layers, 2 KV heads x 64 */
static model_t *g_model_64; /* "tiny-64": 2 layers, 2 KV heads x 16 */
static int32_t g_tok[N_TOK];

static int setup(void **state) {
    (void)state;
    tern_error_t err = {0};
    g_model = model_load(tu_tiny_model("kv", "tiny", "f32", 3), &err);
    if (!g_model) print_message("%s\n", err.msg);
    g_model_64 = model_load(tu_tiny_model("kv", "tiny-64", "f32", 3), &err);
    if (!g_model_64) print_message("%s\n", err.msg);
    uint64_t s = 5;
    for (int i = 0; i < N_TOK; i++) g_tok[i] = (int32_t)(tu_rand(&s) % 512u);
    return g_model && g_model_64 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    model_free(g_model);
    model_free(g_model_64);
    return 0;
}

static float *logits_buf(int64_t n) {
    float *p = calloc((size_t)(n * g_model->hp.n_vocab), sizeof(float));
    assert_non_null(p);
    return p;
}

/* The logits of positions first .. first+n-1 of a run (rows of n_vocab) equal b. */
static void assert_same_logits(const float *run, int64_t first, const float *b, int64_t n, const char *what) {
    const int64_t V = g_model->hp.n_vocab;
    if (memcmp(run + first * V, b, (size_t)(n * V) * sizeof(float))) {
        print_message("logits differ: %s\n", what);
        fail();
    }
}

/* The reference: the whole sequence in one context, every position's logits. */
static float *reference_run(bool kv_f32) {
    float *ref = logits_buf(N_TOK);
    model_ctx_t *c = tu_ctx_new(g_model, 1, N_CTX, 512, kv_f32);
    tu_eval_ok(c, g_tok, N_TOK, ref);
    model_ctx_free(c);
    /* Not degenerate: positions differ. */
    assert_true(memcmp(ref, ref + g_model->hp.n_vocab, (size_t)g_model->hp.n_vocab * sizeof(float)) != 0);
    return ref;
}

static void expect_err(int rc, int code, const tern_error_t *err, const char *needle) {
    if (rc != code || !strstr(err->msg, needle))
        print_message("want error %d containing '%s', got %d: %s\n", code, needle, rc, err->msg);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err->msg, needle));
}

/* A growing memory buffer behind kv_write_fn / kv_read_fn. */
typedef struct {
    unsigned char *data;
    size_t len, cap;
    size_t off;   /* read position */
    size_t limit; /* reads see only the first limit bytes */
    int fail_after; /* writes: fail the n-th call (0 = never) */
    int n_writes;
} membuf_t;

static int mem_write(void *user, const void *data, size_t len) {
    membuf_t *b = user;
    if (b->fail_after && ++b->n_writes >= b->fail_after) return -1;
    if (b->len + len > b->cap) {
        size_t cap = (b->len + len) * 2;
        unsigned char *p = realloc(b->data, cap);
        if (!p) return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

static int mem_read(void *user, void *data, size_t len) {
    membuf_t *b = user;
    if (len > b->limit - b->off) return -1;
    memcpy(data, b->data + b->off, len);
    b->off += len;
    return 0;
}

/* Read back the first limit bytes of b, from the start. */
static membuf_t *rewind_to(membuf_t *b, size_t limit) {
    b->off = 0;
    b->limit = limit;
    return b;
}

static void save_ok(const model_ctx_t *c, membuf_t *b) {
    tern_error_t err = {0};
    memset(b, 0, sizeof *b);
    int rc = model_ctx_kv_save(c, mem_write, b, &err);
    if (rc) print_message("model_ctx_kv_save: %s\n", err.msg);
    assert_int_equal(rc, 0);
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* ---- truncate ------------------------------------------------------------------ */

static void truncate_case(bool kv_f32) {
    float *ref = reference_run(kv_f32), *got = logits_buf(N_TOK);
    tern_error_t err = {0};
    /* Blocks of 5 positions: the re-evaluation starts inside a block. */
    model_ctx_t *c = tu_ctx_new(g_model, 2, N_CTX, 5, kv_f32);
    tu_eval_ok(c, g_tok, N_TOK, got);
    assert_same_logits(ref, 0, got, N_TOK, "first evaluation (blocks of 5) vs one block");

    /* Drop the last 17 positions, evaluate them again. */
    assert_int_equal(model_ctx_truncate(c, 7, &err), 0);
    assert_int_equal(model_ctx_pos(c), 7);
    assert_int_equal(kv_cache_n_pos(model_ctx_kv(c)), 7);
    tu_eval_ok(c, g_tok + 7, N_TOK - 7, got);
    assert_same_logits(ref, 7, got, N_TOK - 7, "after truncate to 7");

    /* Overwrite positions 3.. with other tokens, truncate back, evaluate the
     * original ones one at a time: the stale rows were all replaced. */
    assert_int_equal(model_ctx_truncate(c, 3, &err), 0);
    int32_t other[N_TOK - 3];
    for (int i = 0; i < N_TOK - 3; i++) other[i] = (g_tok[i + 3] + 101) % 512;
    tu_eval_ok(c, other, N_TOK - 3, NULL);
    assert_int_equal(model_ctx_truncate(c, 3, &err), 0);
    for (int i = 3; i < N_TOK; i++) {
        tu_eval_ok(c, g_tok + i, 1, NULL);
        assert_same_logits(ref, i, model_ctx_logits(c), 1, "truncate, other tokens, truncate, one at a time");
    }

    /* Truncate to 0: a fresh start. Past the end: an error, nothing changes. */
    assert_int_equal(model_ctx_truncate(c, 0, &err), 0);
    tu_eval_ok(c, g_tok, N_TOK, got);
    assert_same_logits(ref, 0, got, N_TOK, "after truncate to 0");
    expect_err(model_ctx_truncate(c, N_TOK + 1, &err), TERN_EINVAL, &err, "cannot truncate");
    expect_err(model_ctx_truncate(c, -1, &err), TERN_EINVAL, &err, "cannot truncate");
    expect_err(kv_cache_truncate(model_ctx_kv(c), N_TOK + 1, &err), TERN_EINVAL, &err, "cannot truncate");
    assert_int_equal(model_ctx_pos(c), N_TOK);
    model_ctx_free(c);
    free(ref);
    free(got);
}

static void test_truncate_f16(void **state) {
    (void)state;
    truncate_case(false);
}
static void test_truncate_f32(void **state) {
    (void)state;
    truncate_case(true);
}

/* ---- copy_prefix ----------------------------------------------------------------- */

static void copy_prefix_case(bool kv_f32) {
    float *ref = reference_run(kv_f32), *got = logits_buf(N_TOK);
    tern_error_t err = {0};
    model_ctx_t *a = tu_ctx_new(g_model, 1, N_CTX, 512, kv_f32);
    tu_eval_ok(a, g_tok, N_TOK, NULL);

    /* B: another n_ctx (so another layer stride), another batch and thread
     * count. Before each copy it holds positions of its own, from other
     * tokens, which the copy must replace. */
    model_ctx_t *b = tu_ctx_new(g_model, 2, N_CTX + 9, 4, kv_f32);
    int32_t junk[N_TOK];
    for (int i = 0; i < N_TOK; i++) junk[i] = (g_tok[i] + 7) % 512;
    for (int64_t n = 0; n <= N_TOK; n += 6) {
        assert_int_equal(model_ctx_truncate(b, 0, &err), 0);
        tu_eval_ok(b, junk, N_TOK, NULL);
        assert_int_equal(model_ctx_copy_prefix(b, a, n, &err), 0);
        assert_int_equal(model_ctx_pos(b), n);
        if (n == N_TOK) break;
        tu_eval_ok(b, g_tok + n, N_TOK - n, got);
        char what[64];
        snprintf(what, sizeof what, "copy_prefix of %lld positions, then the rest", (long long)n);
        assert_same_logits(ref, n, got, N_TOK - n, what);
    }
    /* Continue both by one token: the same logits. */
    int32_t next = 42;
    tu_eval_ok(a, &next, 1, NULL);
    tu_eval_ok(b, &next, 1, NULL);
    assert_same_logits(model_ctx_logits(a), 0, model_ctx_logits(b), 1, "one more token after a full copy");

    /* Into itself: a truncation. */
    assert_int_equal(model_ctx_copy_prefix(a, a, 10, &err), 0);
    assert_int_equal(model_ctx_pos(a), 10);
    tu_eval_ok(a, g_tok + 10, N_TOK - 10, got);
    assert_same_logits(ref, 10, got, N_TOK - 10, "copy_prefix of a context into itself");

    /* Errors leave dst as it was. */
    const int64_t pos_b = model_ctx_pos(b);
    expect_err(model_ctx_copy_prefix(b, a, N_TOK + 1, &err), TERN_EINVAL, &err, "cannot copy");
    expect_err(model_ctx_copy_prefix(b, a, -1, &err), TERN_EINVAL, &err, "cannot copy");
    model_ctx_t *small = tu_ctx_new(g_model, 1, 8, 8, kv_f32);
    expect_err(model_ctx_copy_prefix(small, a, 9, &err), TERN_EINVAL, &err, "room for 8");
    assert_int_equal(model_ctx_pos(small), 0);
    /* The other KV type: a layout mismatch. */
    model_ctx_t *other = tu_ctx_new(g_model, 1, N_CTX, 512, !kv_f32);
    expect_err(model_ctx_copy_prefix(other, a, 4, &err), TERN_EINVAL, &err, "between layouts");
    expect_err(model_ctx_copy_prefix(b, other, 0, &err), TERN_EINVAL, &err, "between layouts");
    assert_int_equal(model_ctx_pos(other), 0);
    assert_int_equal(model_ctx_pos(b), pos_b);
    /* Another model (another head_dim): the cache says layout, the context
     * says model. */
    model_ctx_t *c64 = tu_ctx_new(g_model_64, 1, N_CTX, 512, kv_f32);
    expect_err(model_ctx_copy_prefix(c64, a, 4, &err), TERN_EINVAL, &err, "different models");
    expect_err(kv_cache_copy_prefix(model_ctx_kv(c64), model_ctx_kv(a), 4, &err), TERN_EINVAL, &err,
               "between layouts");
    assert_int_equal(model_ctx_pos(c64), 0);

    model_ctx_free(a);
    model_ctx_free(b);
    model_ctx_free(small);
    model_ctx_free(other);
    model_ctx_free(c64);
    free(ref);
    free(got);
}

static void test_copy_prefix_f16(void **state) {
    (void)state;
    copy_prefix_case(false);
}
static void test_copy_prefix_f32(void **state) {
    (void)state;
    copy_prefix_case(true);
}

/* ---- save / restore ---------------------------------------------------------------- */

#define N_SAVED 13

static void save_restore_case(bool kv_f32) {
    float *ref = reference_run(kv_f32), *got = logits_buf(N_TOK);
    tern_error_t err = {0};
    model_ctx_t *a = tu_ctx_new(g_model, 1, N_CTX, 512, kv_f32);
    tu_eval_ok(a, g_tok, N_SAVED, NULL);
    membuf_t buf;
    save_ok(a, &buf);
    assert_int_equal(buf.len, kv_cache_serialized_size(kv_cache_layout(model_ctx_kv(a)), N_SAVED));

    /* Into a fresh context with another n_ctx; continue: A's logits. */
    model_ctx_t *b = tu_ctx_new(g_model, 2, N_CTX + 5, 3, kv_f32);
    assert_int_equal(model_ctx_kv_load(b, mem_read, rewind_to(&buf, buf.len), &err), 0);
    assert_int_equal(buf.off, buf.len);
    assert_int_equal(model_ctx_pos(b), N_SAVED);
    tu_eval_ok(b, g_tok + N_SAVED, N_TOK - N_SAVED, got);
    assert_same_logits(ref, N_SAVED, got, N_TOK - N_SAVED, "restore, then the rest");

    /* Restoring over positions of its own (from other tokens) replaces them. */
    int32_t junk[N_TOK];
    for (int i = 0; i < N_TOK; i++) junk[i] = (g_tok[i] + 7) % 512;
    assert_int_equal(model_ctx_truncate(b, 0, &err), 0);
    tu_eval_ok(b, junk, N_TOK, NULL);
    assert_int_equal(model_ctx_kv_load(b, mem_read, rewind_to(&buf, buf.len), &err), 0);
    assert_int_equal(model_ctx_pos(b), N_SAVED);
    tu_eval_ok(b, g_tok + N_SAVED, N_TOK - N_SAVED, got);
    assert_same_logits(ref, N_SAVED, got, N_TOK - N_SAVED, "restore over a full context, then the rest");

    /* An empty cache round-trips to an empty one. */
    model_ctx_t *e = tu_ctx_new(g_model, 1, N_CTX, 512, kv_f32);
    membuf_t eb;
    save_ok(e, &eb);
    assert_int_equal(eb.len, KV_HEADER_BYTES);
    assert_int_equal(model_ctx_kv_load(b, mem_read, rewind_to(&eb, eb.len), &err), 0);
    assert_int_equal(model_ctx_pos(b), 0);
    tu_eval_ok(b, g_tok, N_TOK, got);
    assert_same_logits(ref, 0, got, N_TOK, "restore of an empty cache, then everything");

    model_ctx_free(a);
    model_ctx_free(b);
    model_ctx_free(e);
    free(buf.data);
    free(eb.data);
    free(ref);
    free(got);
}

static void test_save_restore_f16(void **state) {
    (void)state;
    save_restore_case(false);
}
static void test_save_restore_f32(void **state) {
    (void)state;
    save_restore_case(true);
}

/* ---- restore of bad input ------------------------------------------------------------ */

/* Restoring the first len bytes of data into c fails with code and needle. */
static void expect_restore_err(model_ctx_t *c, const unsigned char *data, size_t len, int code, const char *needle) {
    membuf_t b = {0};
    b.data = (unsigned char *)data;
    b.len = b.limit = len;
    tern_error_t err = {0};
    expect_err(model_ctx_kv_load(c, mem_read, &b, &err), code, &err, needle);
}

static void restore_rejects_case(bool kv_f32) {
    float *ref = reference_run(kv_f32), *got = logits_buf(N_TOK);
    model_ctx_t *a = tu_ctx_new(g_model, 1, N_CTX, 512, kv_f32);
    tu_eval_ok(a, g_tok, N_SAVED, NULL);
    membuf_t good;
    save_ok(a, &good);
    const size_t n = good.len;
    unsigned char *bad = malloc(n);
    assert_non_null(bad);

    /* A context with positions of its own: a bad header leaves them. */
    model_ctx_t *c = tu_ctx_new(g_model, 1, N_CTX, 512, kv_f32);
    tu_eval_ok(c, g_tok, 5, NULL);

    /* Cut inside the header: nothing changes. */
    for (size_t cut = 0; cut < KV_HEADER_BYTES; cut++) {
        expect_restore_err(c, good.data, cut, TERN_EFORMAT, "too short for the header");
        assert_int_equal(model_ctx_pos(c), 5);
    }
    /* Cut inside the data (every cut; a stride under ASan): an error, the
     * context left empty. */
    const size_t step = tu_quick() ? 61 : 1;
    for (size_t cut = KV_HEADER_BYTES; cut < n; cut += step) {
        expect_restore_err(c, good.data, cut, TERN_EFORMAT, "input ends inside");
        assert_int_equal(model_ctx_pos(c), 0);
    }
    expect_restore_err(c, good.data, n - 1, TERN_EFORMAT, "input ends inside V of layer 1");

    /* Edited header fields. */
    struct {
        size_t off;
        int width; /* 4 or 8 bytes */
        uint64_t value;
        const char *needle;
    } edits[] = {
        {0, 4, 0x46554747u, "bad magic"},
        {4, 4, 2, "version 2"},
        {4, 4, 0, "version 0"},
        {8, 4, kv_f32 ? TYPE_F16 : TYPE_F32, "does not match"},
        {8, 4, TYPE_Q4_0, "does not match"},
        {8, 4, 0xFFFFFFFFu, "does not match"},
        {12, 4, 3, "does not match"},
        {12, 4, 0, "does not match"},
        {12, 4, 0xFFFFFFFFu, "does not match"},
        {16, 4, 1, "does not match"},
        {20, 4, 32, "does not match"},
        {20, 4, 0x80000000u, "does not match"},
        {24, 8, N_CTX + 1, "room for 32"},
        {24, 8, (uint64_t)1 << 40, "room for 32"},
        {24, 8, UINT64_MAX, "room for 32"},
    };
    tu_eval_ok(c, g_tok, 5, NULL);
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(bad, good.data, n);
        if (edits[i].width == 4)
            put_u32(bad + edits[i].off, (uint32_t)edits[i].value);
        else
            put_u64(bad + edits[i].off, edits[i].value);
        expect_restore_err(c, bad, n, TERN_EFORMAT, edits[i].needle);
        assert_int_equal(model_ctx_pos(c), 5);
    }
    /* n_pos within n_ctx but past the data: a short read. */
    memcpy(bad, good.data, n);
    put_u64(bad + 24, N_SAVED + 1);
    expect_restore_err(c, bad, n, TERN_EFORMAT, "input ends inside");

    /* The right header for another cache: the other KV type, another model,
     * fewer positions than the input holds. */
    model_ctx_t *other = tu_ctx_new(g_model, 1, N_CTX, 512, !kv_f32);
    expect_restore_err(other, good.data, n, TERN_EFORMAT, "does not match");
    model_ctx_t *c64 = tu_ctx_new(g_model_64, 1, N_CTX, 512, kv_f32);
    expect_restore_err(c64, good.data, n, TERN_EFORMAT, "does not match");
    model_ctx_t *small = tu_ctx_new(g_model, 1, N_SAVED - 1, 512, kv_f32);
    expect_restore_err(small, good.data, n, TERN_EFORMAT, "room for 12");

    /* After all that, the good input still restores and continues exactly. */
    tern_error_t err = {0};
    assert_int_equal(model_ctx_kv_load(c, mem_read, rewind_to(&good, n), &err), 0);
    tu_eval_ok(c, g_tok + N_SAVED, N_TOK - N_SAVED, got);
    assert_same_logits(ref, N_SAVED, got, N_TOK - N_SAVED, "restore after rejected inputs");

    model_ctx_free(a);
    model_ctx_free(c);
    model_ctx_free(other);
    model_ctx_free(c64);
    model_ctx_free(small);
    free(good.data);
    free(bad);
    free(ref);
    free(got);
}

static void test_restore_rejects_f16(void **state) {
    (void)state;
    restore_rejects_case(false);
}
static void test_restore_rejects_f32(void **state) {
    (void)state;
    restore_rejects_case(true);
}

/* ---- the module on its own ------------------------------------------------------------- */

/* A position range written out through kv_cache_k_rows / v_rows and stored
 * back raw (kv_cache_store_raw) into another cache: the same bytes. */
static void raw_range(int type) {
    kv_layout_t lo;
    assert_int_equal(kv_layout_init(&lo, type, 2, 8, 2, 4, NULL), 0);
    kv_cache_t *a = kv_cache_new(&lo, NULL), *b = kv_cache_new(&lo, NULL);
    assert_non_null(a);
    assert_non_null(b);
    float k[6 * 8], v[6 * 8];
    for (int i = 0; i < 6 * 8; i++) {
        k[i] = 0.25f * (float)i;
        v[i] = -0.5f * (float)i;
    }
    for (int l = 0; l < 2; l++) kv_cache_store(a, l, 0, 6, k, v);
    assert_int_equal(kv_cache_commit(a, 6, NULL), 0);
    /* b: positions [0, 2) from a, then [2, 6) one layer half at a time. */
    for (int l = 0; l < 2; l++) {
        kv_cache_store_raw(b, l, 0, 2, kv_cache_k_rows(a, l, 0, 2), kv_cache_v_rows(a, l, 0, 2));
        kv_cache_store_raw(b, l, 2, 4, kv_cache_k_rows(a, l, 2, 4), NULL);
        kv_cache_store_raw(b, l, 2, 4, NULL, kv_cache_v_rows(a, l, 2, 4));
    }
    assert_int_equal(kv_cache_n_pos(b), 0); /* stored, not yet counted */
    assert_int_equal(kv_cache_commit(b, 6, NULL), 0);
    for (int l = 0; l < 2; l++) {
        assert_memory_equal(kv_cache_k(a, l), kv_cache_k(b, l), 6 * lo.pos_bytes);
        assert_memory_equal(kv_cache_v(a, l), kv_cache_v(b, l), 6 * lo.pos_bytes);
        /* A range starts pos rows in. */
        assert_ptr_equal(kv_cache_k_rows(a, l, 3, 2), (const char *)kv_cache_k(a, l) + 3 * lo.pos_bytes);
        assert_ptr_equal(kv_cache_v_rows(a, l, 3, 2), (const char *)kv_cache_v(a, l) + 3 * lo.pos_bytes);
    }
    kv_cache_free(a);
    kv_cache_free(b);
}
static void test_raw_range_f16(void **state) {
    (void)state;
    raw_range(TYPE_F16);
}
static void test_raw_range_f32(void **state) {
    (void)state;
    raw_range(TYPE_F32);
}

static void test_layout_and_writer(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_layout_t lo;
    assert_int_equal(kv_layout_init(&lo, TYPE_F16, 3, 10, 2, 8, &err), 0);
    assert_int_equal(lo.elt_bytes, 2);
    assert_int_equal(lo.pos_bytes, 2 * 8 * 2);
    assert_int_equal(lo.layer_bytes, 10 * 2 * 8 * 2);
    assert_int_equal(kv_cache_serialized_size(&lo, 4), KV_HEADER_BYTES + 2 * 3 * 4 * 32);
    kv_layout_t lo32;
    assert_int_equal(kv_layout_init(&lo32, TYPE_F32, 3, 99, 2, 8, &err), 0);
    assert_int_equal(lo32.pos_bytes, 2 * 8 * 4);
    assert_false(kv_layout_compatible(&lo, &lo32));
    kv_layout_t lo_long;
    assert_int_equal(kv_layout_init(&lo_long, TYPE_F16, 3, 99, 2, 8, &err), 0);
    assert_true(kv_layout_compatible(&lo, &lo_long));

    expect_err(kv_layout_init(&lo32, TYPE_Q4_0, 3, 10, 2, 8, &err), TERN_EINVAL, &err, "only f16 and f32");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 0, 10, 2, 8, &err), TERN_EINVAL, &err, "bad layout");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 3, 10, 2, -8, &err), TERN_EINVAL, &err, "bad layout");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 3, INT64_MAX / 4, 1024, 1024, &err), TERN_EINVAL, &err, "overflows");

    /* Store two positions of each layer by hand, commit, read back. */
    kv_cache_t *c = kv_cache_new(&lo, &err);
    assert_non_null(c);
    assert_int_equal(kv_cache_n_pos(c), 0);
    float k[2 * 16], v[2 * 16];
    for (int i = 0; i < 32; i++) {
        k[i] = (float)i;
        v[i] = -(float)i;
    }
    for (int64_t l = 0; l < 3; l++) kv_cache_store(c, l, 0, 2, k, v);
    assert_int_equal(kv_cache_commit(c, 2, &err), 0);
    const fp16_t *k1 = kv_cache_k(c, 1), *v2 = kv_cache_v(c, 2);
    assert_int_equal(k1[17], f32_to_fp16(17.0f));
    assert_int_equal(v2[31], f32_to_fp16(-31.0f));
    assert_true((const unsigned char *)kv_cache_k(c, 1) - (const unsigned char *)kv_cache_k(c, 0) ==
                (ptrdiff_t)lo.layer_bytes);
    expect_err(kv_cache_commit(c, 9, &err), TERN_EINVAL, &err, "cannot add 9 positions");
    assert_int_equal(kv_cache_n_pos(c), 2);

    /* Writes: more positions than held; a failing writer at each call. */
    membuf_t b = {0};
    expect_err(kv_cache_write(c, 3, mem_write, &b, &err), TERN_EINVAL, &err, "cannot write 3 positions");
    for (int call = 1; call <= 7; call++) {
        membuf_t f = {0};
        f.fail_after = call;
        expect_err(kv_cache_write(c, 2, mem_write, &f, &err), TERN_EIO, &err, "failed");
        free(f.data);
    }
    assert_int_equal(kv_cache_write(c, 2, mem_write, &b, &err), 0);
    assert_int_equal(b.len, kv_cache_serialized_size(&lo, 2));
    /* ... and back into a longer cache of the same position shape. */
    kv_cache_t *d = kv_cache_new(&lo_long, &err);
    assert_non_null(d);
    assert_int_equal(kv_cache_read(d, mem_read, rewind_to(&b, b.len), &err), 0);
    assert_int_equal(kv_cache_n_pos(d), 2);
    for (int64_t l = 0; l < 3; l++) {
        assert_memory_equal(kv_cache_k(d, l), kv_cache_k(c, l), 2 * lo.pos_bytes);
        assert_memory_equal(kv_cache_v(d, l), kv_cache_v(c, l), 2 * lo.pos_bytes);
    }
    kv_cache_free(c);
    kv_cache_free(d);
    free(b.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncate_f16),        cmocka_unit_test(test_truncate_f32),
        cmocka_unit_test(test_copy_prefix_f16),     cmocka_unit_test(test_copy_prefix_f32),
        cmocka_unit_test(test_save_restore_f16),    cmocka_unit_test(test_save_restore_f32),
        cmocka_unit_test(test_restore_rejects_f16), cmocka_unit_test(test_restore_rejects_f32),
        cmocka_unit_test(test_layout_and_writer),
        cmocka_unit_test(test_raw_range_f16),       cmocka_unit_test(test_raw_range_f32),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
