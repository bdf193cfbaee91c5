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
 * The contexts use small KV blocks (3, 4, 5 positions) so that truncations,
 * copies and restores cross block boundaries and tables are not contiguous.
 * Then the paged memory on its own (small layouts, blocks of 3 to 5
 * positions): reserve all or nothing, store / get_raw across blocks, fork
 * sharing blocks, copy on write, truncate and remove giving blocks back,
 * reference counts, kv_seq_copy between block sizes, serialization of
 * scattered blocks, kv_seq_read into a full memory, the token ids, and a
 * seeded random sequence of operations checked against a plain model.
 */
// ctest-label: concurrent
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
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

/* A context like tu_ctx_new's with KV blocks of kv_block positions (0: the
 * default) for n_seq sequences. */
static model_ctx_t *ctx_new(const model_t *m, int threads, int64_t n_ctx, int64_t n_batch, bool kv_f32,
                            int64_t kv_block, int n_seq) {
    model_ctx_params_t p = model_ctx_default_params();
    p.n_threads = threads;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.kv_f32 = kv_f32;
    p.kv_block = kv_block;
    p.n_seq = n_seq;
    tern_error_t err = {0};
    model_ctx_t *c = model_ctx_new(m, &p, NULL, 0, &err);
    if (!c) print_message("model_ctx_new: %s\n", err.msg);
    assert_non_null(c);
    return c;
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
    /* Forward blocks of 5 positions and KV blocks of 5: the re-evaluation
     * starts inside a KV block. */
    model_ctx_t *c = ctx_new(g_model, 2, N_CTX, 5, kv_f32, 5, 1);
    tu_eval_ok(c, g_tok, N_TOK, got);
    assert_same_logits(ref, 0, got, N_TOK, "first evaluation (blocks of 5) vs one block");
    kv_stats_t st;
    kv_cache_stats(model_ctx_kv(c), &st);
    assert_int_equal(st.n_used, (N_TOK + 4) / 5);

    /* Drop the last 17 positions, evaluate them again. */
    assert_int_equal(model_ctx_truncate(c, 7, &err), 0);
    assert_int_equal(model_ctx_pos(c), 7);
    assert_int_equal(kv_seq_n_pos(model_ctx_kv(c), 0), 7);
    assert_int_equal(kv_seq_n_blocks(model_ctx_kv(c), 0), 2);
    kv_cache_stats(model_ctx_kv(c), &st);
    assert_int_equal(st.n_used, 2);
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
    expect_err(kv_seq_truncate(model_ctx_kv(c), 0, N_TOK + 1, &err), TERN_EINVAL, &err, "cannot truncate");
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

    /* B: another n_ctx and KV block size (so other layer strides and block
     * boundaries), another batch and thread count. Before each copy it holds
     * positions of its own, from other tokens, which the copy must replace. */
    model_ctx_t *b = ctx_new(g_model, 2, N_CTX + 9, 4, kv_f32, 3, 1);
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
    model_ctx_t *small = ctx_new(g_model, 1, 8, 8, kv_f32, 4, 1);
    expect_err(model_ctx_copy_prefix(small, a, 9, &err), TERN_EINVAL, &err, "room for 8");
    assert_int_equal(model_ctx_pos(small), 0);
    /* The other KV type: a layout mismatch. */
    model_ctx_t *other = tu_ctx_new(g_model, 1, N_CTX, 512, !kv_f32);
    expect_err(model_ctx_copy_prefix(other, a, 4, &err), TERN_EINVAL, &err, "between layouts");
    expect_err(model_ctx_copy_prefix(b, other, 0, &err), TERN_EINVAL, &err, "between layouts");
    assert_int_equal(model_ctx_pos(other), 0);
    assert_int_equal(model_ctx_pos(b), pos_b);
    /* A memory of two sequences, full: refused for want of blocks, dst's
     * positions stay (3 blocks needed, 2 its own). */
    model_ctx_t *two = ctx_new(g_model, 1, 16, 16, kv_f32, 4, 2);
    tu_eval_ok(two, g_tok, 5, NULL);
    assert_int_equal(kv_seq_copy(model_ctx_kv(two), 1, model_ctx_kv(a), 0, 8, &err), 0);
    expect_err(model_ctx_copy_prefix(two, a, 12, &err), TERN_EKVFULL, &err, "KV memory full");
    assert_int_equal(model_ctx_pos(two), 5);
    tu_eval_ok(two, g_tok + 5, N_TOK - 5 < 3 ? N_TOK - 5 : 3, got);
    assert_same_logits(ref, 5, got, 3, "continue after a refused copy");
    model_ctx_free(two);
    /* Another model (another head_dim): the cache says layout, the context
     * says model. */
    model_ctx_t *c64 = tu_ctx_new(g_model_64, 1, N_CTX, 512, kv_f32);
    expect_err(model_ctx_copy_prefix(c64, a, 4, &err), TERN_EINVAL, &err, "different models");
    expect_err(kv_seq_copy(model_ctx_kv(c64), 0, model_ctx_kv(a), 0, 4, &err), TERN_EINVAL, &err,
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

    /* Into a fresh context with another n_ctx and KV block size; continue:
     * A's logits. */
    model_ctx_t *b = ctx_new(g_model, 2, N_CTX + 5, 3, kv_f32, 4, 1);
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

    /* A context with positions of its own: a bad header leaves them. It
     * serves two sequences in blocks of 4; sequence 1 shares sequence 0's
     * blocks, and no restore into sequence 0 may touch its rows. */
    model_ctx_t *c = ctx_new(g_model, 1, N_CTX, 512, kv_f32, 4, 2);
    tu_eval_ok(c, g_tok, 5, NULL);
    kv_cache_t *kv = model_ctx_kv(c);
    const kv_layout_t *klo = kv_cache_layout(kv);
    assert_int_equal(kv_seq_fork(kv, 1, 0, 5, NULL), 0);
    const size_t side_bytes = 5 * klo->pos_bytes;
    unsigned char *side = malloc(2 * (size_t)klo->n_layer * side_bytes), *now = malloc(2 * side_bytes);
    assert_non_null(side);
    assert_non_null(now);
    for (int64_t l = 0; l < klo->n_layer; l++)
        kv_seq_get_raw(kv, 1, l, 0, 5, side + 2 * l * side_bytes, side + (2 * l + 1) * side_bytes);

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
    model_ctx_t *small = ctx_new(g_model, 1, N_SAVED - 1, 512, kv_f32, 4, 1); /* 3 blocks of 4 */
    expect_restore_err(small, good.data, n, TERN_EFORMAT, "room for 12");

    /* After all that, the good input still restores and continues exactly. */
    tern_error_t err = {0};
    assert_int_equal(model_ctx_kv_load(c, mem_read, rewind_to(&good, n), &err), 0);
    tu_eval_ok(c, g_tok + N_SAVED, N_TOK - N_SAVED, got);
    assert_same_logits(ref, N_SAVED, got, N_TOK - N_SAVED, "restore after rejected inputs");
    /* Sequence 1 kept its 5 positions, byte for byte. */
    assert_int_equal(kv_seq_n_pos(kv, 1), 5);
    for (int64_t l = 0; l < klo->n_layer; l++) {
        kv_seq_get_raw(kv, 1, l, 0, 5, now, now + side_bytes);
        assert_memory_equal(now, side + 2 * l * side_bytes, 2 * side_bytes);
    }
    free(side);
    free(now);

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

/* Position p of a sequence where the attention kernel reads it, gathered
 * into position-major order (out: pos_bytes): head g's row is row
 * p % block_pos of head g in block table[p / block_pos] of the layer's
 * base pointer (head-major blocks, kernels.h). */
static const unsigned char *kernel_row(const kv_cache_t *c, int seq, int v, int64_t layer, int64_t p,
                                       unsigned char *out) {
    const kv_layout_t *lo = kv_cache_layout(c);
    const unsigned char *base = v ? kv_cache_v(c, layer) : kv_cache_k(c, layer);
    const unsigned char *blk = base + (size_t)kv_seq_blocks(c, seq)[p / lo->block_pos] * lo->block_bytes;
    for (int64_t g = 0; g < lo->n_head_kv; g++)
        memcpy(out + (size_t)g * lo->head_bytes, blk + (size_t)(g * lo->block_pos + p % lo->block_pos) * lo->head_bytes,
               lo->head_bytes);
    return out;
}

/* A memory of type, n_layer layers, 2 K/V heads of 4, n_ctx positions in
 * blocks of block_pos, for n_seq sequences. */
static kv_cache_t *mem_new(int type, int64_t n_layer, int64_t n_ctx, int64_t block_pos, int n_seq) {
    kv_layout_t lo;
    tern_error_t err = {0};
    int rc = kv_layout_init(&lo, type, n_layer, n_ctx, 2, 4, block_pos, &err);
    if (rc) print_message("kv_layout_init: %s\n", err.msg);
    assert_int_equal(rc, 0);
    kv_cache_t *c = kv_cache_new(&lo, n_seq, &err);
    if (!c) print_message("kv_cache_new: %s\n", err.msg);
    assert_non_null(c);
    return c;
}

/* The value stored at element e of K (v = 0) or V (v = 1) of position p,
 * layer l, by fill with tag t: integers, exact in F16 (< 2048) and F32. */
static float val(int tag, int64_t p, int64_t l, int64_t e, int v) {
    const float x = (float)((tag * 37 + p * 11 + l * 5 + e * 3 + v) % 2039);
    return v ? -x : x;
}

/* Append n positions to seq (reserve, store layer by layer in pieces of at
 * most piece positions, ids tag * 1000 + p, commit); they must fit. */
static void fill_piece(kv_cache_t *c, int seq, int64_t n, int tag, int64_t piece) {
    const kv_layout_t *lo = kv_cache_layout(c);
    const int64_t row = lo->n_head_kv * lo->head_dim, p0 = kv_seq_n_pos(c, seq);
    tern_error_t err = {0};
    int rc = kv_seq_reserve(c, seq, n, &err);
    if (rc) print_message("kv_seq_reserve: %s\n", err.msg);
    assert_int_equal(rc, 0);
    float *k = malloc((size_t)(n * row + 1) * sizeof *k), *v = malloc((size_t)(n * row + 1) * sizeof *v);
    int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
    assert_true(k && v && ids);
    for (int64_t l = 0; l < lo->n_layer; l++) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < row; e++) {
                k[i * row + e] = val(tag, p0 + i, l, e, 0);
                v[i * row + e] = val(tag, p0 + i, l, e, 1);
            }
        for (int64_t i = 0; i < n; i += piece) {
            const int64_t m = n - i < piece ? n - i : piece;
            kv_seq_store(c, seq, l, p0 + i, m, k + i * row, v + i * row);
        }
    }
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(tag * 1000 + p0 + i);
    kv_seq_put_ids(c, seq, p0, n, ids);
    assert_int_equal(kv_seq_n_pos(c, seq), p0); /* stored, not yet counted */
    assert_int_equal(kv_seq_commit(c, seq, n, &err), 0);
    assert_int_equal(kv_seq_n_pos(c, seq), p0 + n);
    free(k);
    free(v);
    free(ids);
}
static void fill(kv_cache_t *c, int seq, int64_t n, int tag) { fill_piece(c, seq, n, tag, 3); }

/* Position p of seq (all layers, K and V, and with ids its id) holds what
 * fill with tag wrote at position q. */
static void expect_pos_x(const kv_cache_t *c, int seq, int64_t p, int tag, int64_t q, bool ids) {
    const kv_layout_t *lo = kv_cache_layout(c);
    const int64_t row = lo->n_head_kv * lo->head_dim;
    unsigned char k[64], v[64], want[2][64];
    assert_true(lo->pos_bytes <= sizeof k);
    for (int64_t l = 0; l < lo->n_layer; l++) {
        kv_seq_get_raw(c, seq, l, p, 1, k, v);
        for (int h = 0; h < 2; h++)
            for (int64_t e = 0; e < row; e++) {
                const float x = val(tag, q, l, e, h);
                if (lo->type == TYPE_F32)
                    memcpy(want[h] + e * 4, &x, 4);
                else {
                    const fp16_t y = f32_to_fp16(x);
                    memcpy(want[h] + e * 2, &y, 2);
                }
            }
        if (memcmp(k, want[0], lo->pos_bytes) || memcmp(v, want[1], lo->pos_bytes)) {
            print_message("seq %d position %lld layer %lld: not what tag %d wrote at %lld\n", seq, (long long)p,
                          (long long)l, tag, (long long)q);
            fail();
        }
        /* The kernel's view of the same position. */
        unsigned char kr[256];
        assert_true(lo->pos_bytes <= sizeof kr);
        assert_memory_equal(kernel_row(c, seq, 0, l, p, kr), k, lo->pos_bytes);
        assert_memory_equal(kernel_row(c, seq, 1, l, p, kr), v, lo->pos_bytes);
    }
    if (ids) assert_int_equal(kv_seq_ids(c, seq)[p], tag * 1000 + q);
}
static void expect_pos(const kv_cache_t *c, int seq, int64_t p, int tag, int64_t q) {
    expect_pos_x(c, seq, p, tag, q, true);
}

/* Positions [p0, p0 + n) of seq hold fill's values with tag (at the same
 * positions); _data: K and V only (the ids of a read sequence are -1). */
static void expect_rows(const kv_cache_t *c, int seq, int64_t p0, int64_t n, int tag) {
    for (int64_t p = p0; p < p0 + n; p++) expect_pos_x(c, seq, p, tag, p, true);
}
static void expect_rows_data(const kv_cache_t *c, int seq, int64_t p0, int64_t n, int tag) {
    for (int64_t p = p0; p < p0 + n; p++) expect_pos_x(c, seq, p, tag, p, false);
}

/* Every K and V byte of seq's n_pos positions, layer after layer (malloc'd). */
static unsigned char *snapshot(const kv_cache_t *c, int seq) {
    const kv_layout_t *lo = kv_cache_layout(c);
    const int64_t n = kv_seq_n_pos(c, seq);
    const size_t bytes = (size_t)n * lo->pos_bytes;
    unsigned char *s = malloc(2 * (size_t)lo->n_layer * bytes + 1);
    assert_non_null(s);
    for (int64_t l = 0; l < lo->n_layer; l++) kv_seq_get_raw(c, seq, l, 0, n, s + 2 * l * bytes, s + (2 * l + 1) * bytes);
    return s;
}

static void expect_snapshot(const kv_cache_t *c, int seq, const unsigned char *s, int64_t n_pos) {
    assert_int_equal(kv_seq_n_pos(c, seq), n_pos);
    unsigned char *now = snapshot(c, seq);
    const size_t bytes = 2 * (size_t)kv_cache_layout(c)->n_layer * (size_t)n_pos * kv_cache_layout(c)->pos_bytes;
    if (bytes) assert_memory_equal(now, s, bytes);
    free(now);
}

/* used + free == n_blocks; used and shared agree with the tables (a block in
 * some table is used, in two or more shared); each table is as long as its
 * positions need (every sequence here is committed). */
static void check_accounting(const kv_cache_t *c) {
    const kv_layout_t *lo = kv_cache_layout(c);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_blocks, lo->n_blocks);
    assert_int_equal(st.block_pos, lo->block_pos);
    assert_int_equal(st.n_used + st.n_free, st.n_blocks);
    int *held = calloc((size_t)lo->n_blocks, sizeof *held);
    assert_non_null(held);
    int64_t sum = 0;
    for (int s = 0; s < kv_cache_n_seq(c); s++) {
        const int64_t nb = kv_seq_n_blocks(c, s);
        assert_int_equal(nb, (kv_seq_n_pos(c, s) + lo->block_pos - 1) / lo->block_pos);
        const int32_t *t = kv_seq_blocks(c, s);
        for (int64_t i = 0; i < nb; i++) {
            assert_true(t[i] >= 0 && t[i] < lo->n_blocks);
            /* A table never names a block twice. */
            for (int64_t j = 0; j < i; j++) assert_int_not_equal(t[i], t[j]);
            held[t[i]]++;
        }
        sum += nb;
    }
    int64_t used = 0, shared = 0, refs = 0;
    for (int64_t b = 0; b < lo->n_blocks; b++) {
        used += held[b] > 0;
        shared += held[b] > 1;
        refs += held[b];
    }
    assert_int_equal(refs, sum);
    assert_int_equal(st.n_used, used);
    assert_int_equal(st.n_shared, shared);
    free(held);
}

/* Every sequence of c removed: every block free; one sequence can then take
 * all n_blocks, each once (the free list holds no block twice). */
static void check_all_free(kv_cache_t *c) {
    const kv_layout_t *lo = kv_cache_layout(c);
    for (int s = 0; s < kv_cache_n_seq(c); s++) kv_seq_remove(c, s);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_free, lo->n_blocks);
    assert_int_equal(st.n_used, 0);
    assert_int_equal(st.n_shared, 0);
    assert_int_equal(kv_seq_reserve(c, 0, lo->n_ctx, NULL), 0);
    assert_int_equal(kv_seq_n_blocks(c, 0), lo->n_blocks);
    char *seen = calloc((size_t)lo->n_blocks, 1);
    assert_non_null(seen);
    for (int64_t i = 0; i < lo->n_blocks; i++) {
        const int32_t b = kv_seq_blocks(c, 0)[i];
        assert_true(b >= 0 && b < lo->n_blocks && !seen[b]);
        seen[b] = 1;
    }
    free(seen);
    kv_stats_t full;
    kv_cache_stats(c, &full);
    assert_int_equal(full.n_free, 0);
    assert_int_equal(kv_seq_truncate(c, 0, 0, NULL), 0); /* gives back what was reserved */
    kv_cache_stats(c, &full);
    assert_int_equal(full.n_free, lo->n_blocks);
}

/* Every sequence's position count and table (copied into t, n_seq x
 * n_blocks) and the stats, to compare before and after an operation. */
typedef struct {
    kv_stats_t st;
    int64_t n_pos[8], n_blk[8];
    int32_t t[8][64];
} mem_state_t;

static void state_of(const kv_cache_t *c, mem_state_t *m) {
    memset(m, 0, sizeof *m);
    kv_cache_stats(c, &m->st);
    assert_true(kv_cache_n_seq(c) <= 8 && kv_cache_layout(c)->n_blocks <= 64);
    for (int s = 0; s < kv_cache_n_seq(c); s++) {
        m->n_pos[s] = kv_seq_n_pos(c, s);
        m->n_blk[s] = kv_seq_n_blocks(c, s);
        if (m->n_blk[s]) memcpy(m->t[s], kv_seq_blocks(c, s), (size_t)m->n_blk[s] * sizeof(int32_t));
    }
}

static void expect_state(const kv_cache_t *c, const mem_state_t *before) {
    mem_state_t now;
    state_of(c, &now);
    assert_memory_equal(&now, before, sizeof now);
}

/* A position range read out (kv_seq_get_raw) and put back raw
 * (kv_seq_put_raw) into another memory of another block size: the same
 * bytes, where the attention kernel looks for them. */
static void raw_range(int type) {
    kv_cache_t *a = mem_new(type, 2, 8, 3, 1), *b = mem_new(type, 2, 8, 2, 2);
    const kv_layout_t *lo = kv_cache_layout(a);
    fill(a, 0, 6, 1);
    /* b's sequence 1: positions [0, 2) from a, then [2, 6) one layer half at a time. */
    unsigned char k[6 * 32], v[6 * 32];
    assert_true(6 * lo->pos_bytes <= sizeof k);
    assert_int_equal(kv_seq_reserve(b, 1, 6, NULL), 0);
    for (int l = 0; l < 2; l++) {
        kv_seq_get_raw(a, 0, l, 0, 2, k, v);
        kv_seq_put_raw(b, 1, l, 0, 2, k, v);
        kv_seq_get_raw(a, 0, l, 2, 4, k, NULL);
        kv_seq_put_raw(b, 1, l, 2, 4, k, NULL);
        kv_seq_get_raw(a, 0, l, 2, 4, NULL, v);
        kv_seq_put_raw(b, 1, l, 2, 4, NULL, v);
    }
    assert_int_equal(kv_seq_n_pos(b, 1), 0); /* stored, not yet counted */
    assert_int_equal(kv_seq_commit(b, 1, 6, NULL), 0);
    int32_t ids[6];
    memcpy(ids, kv_seq_ids(a, 0), sizeof ids);
    for (int l = 0; l < 2; l++) {
        unsigned char ka[6 * 32], va[6 * 32], kb[6 * 32], vb[6 * 32];
        kv_seq_get_raw(a, 0, l, 0, 6, ka, va);
        kv_seq_get_raw(b, 1, l, 0, 6, kb, vb);
        assert_memory_equal(ka, kb, 6 * lo->pos_bytes);
        assert_memory_equal(va, vb, 6 * lo->pos_bytes);
        /* Position p is row p % block_pos of each head in block table[p / block_pos],
         * block b at b * block_bytes of the layer: for both block sizes. */
        unsigned char kr[256];
        assert_true(lo->pos_bytes <= sizeof kr);
        for (int64_t p = 0; p < 6; p++) {
            assert_memory_equal(kernel_row(a, 0, 0, l, p, kr), ka + p * lo->pos_bytes, lo->pos_bytes);
            assert_memory_equal(kernel_row(a, 0, 1, l, p, kr), va + p * lo->pos_bytes, lo->pos_bytes);
            assert_memory_equal(kernel_row(b, 1, 0, l, p, kr), ka + p * lo->pos_bytes, lo->pos_bytes);
            assert_memory_equal(kernel_row(b, 1, 1, l, p, kr), va + p * lo->pos_bytes, lo->pos_bytes);
        }
        /* A range that starts inside a block and crosses two boundaries. */
        kv_seq_get_raw(b, 1, l, 1, 4, kb, vb);
        assert_memory_equal(kb, ka + lo->pos_bytes, 4 * lo->pos_bytes);
        assert_memory_equal(vb, va + lo->pos_bytes, 4 * lo->pos_bytes);
    }
    expect_rows(a, 0, 0, 6, 1);
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

/* n_ctx is the limit of one sequence even where the memory, rounded up to
 * whole blocks, has room for more; the rest serves other sequences. */
static void test_n_ctx_is_per_sequence(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_layout_t lo;
    assert_int_equal(kv_layout_init(&lo, TYPE_F32, 1, 10, 1, 4, 4, &err), 0);
    kv_cache_t *c = kv_cache_new(&lo, 2, &err);
    assert_non_null(c);
    expect_err(kv_seq_reserve(c, 0, 11, &err), TERN_ECTXFULL, &err, "context size 10");
    assert_int_equal(kv_seq_reserve(c, 0, 10, &err), 0);
    assert_int_equal(kv_seq_commit(c, 0, 10, &err), 0);
    expect_err(kv_seq_reserve(c, 0, 1, &err), TERN_ECTXFULL, &err, "context size 10");
    /* Sequence 0 holds 3 blocks: all of them. */
    expect_err(kv_seq_reserve(c, 1, 1, &err), TERN_EKVFULL, &err, "KV memory full");
    kv_seq_remove(c, 0);
    assert_int_equal(kv_seq_reserve(c, 1, 10, &err), 0);
    kv_cache_free(c);
}

static void test_layout_and_writer(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_layout_t lo;
    /* 10 positions in blocks of 4: 3 blocks (12 positions of memory); n_ctx,
     * the most one sequence may hold, stays 10. */
    assert_int_equal(kv_layout_init(&lo, TYPE_F16, 3, 10, 2, 8, 4, &err), 0);
    assert_int_equal(lo.elt_bytes, 2);
    assert_int_equal(lo.pos_bytes, 2 * 8 * 2);
    assert_int_equal(lo.block_pos, 4);
    assert_int_equal(lo.n_blocks, 3);
    assert_int_equal(lo.n_ctx, 10);
    assert_int_equal(lo.block_bytes, 4 * 2 * 8 * 2);
    assert_int_equal(lo.layer_bytes, 3 * 4 * 2 * 8 * 2);
    assert_int_equal(kv_cache_serialized_size(&lo, 4), KV_HEADER_BYTES + 2 * 3 * 4 * 32);
    /* block_pos 0 (or < 0): the default. */
    kv_layout_t lod;
    assert_int_equal(kv_layout_init(&lod, TYPE_F16, 3, 10, 2, 8, 0, &err), 0);
    assert_int_equal(lod.block_pos, KV_BLOCK_POS_DEFAULT);
    assert_int_equal(lod.n_blocks, 1);
    assert_int_equal(lod.n_ctx, 10);
    assert_int_equal(kv_layout_init(&lod, TYPE_F16, 3, 10, 2, 8, -5, &err), 0);
    assert_int_equal(lod.block_pos, KV_BLOCK_POS_DEFAULT);
    /* A whole number of blocks stays as it is. */
    assert_int_equal(kv_layout_init(&lod, TYPE_F16, 3, 12, 2, 8, 4, &err), 0);
    assert_int_equal(lod.n_ctx, 12);
    assert_int_equal(lod.n_blocks, 3);
    kv_layout_t lo32;
    assert_int_equal(kv_layout_init(&lo32, TYPE_F32, 3, 99, 2, 8, 4, &err), 0);
    assert_int_equal(lo32.pos_bytes, 2 * 8 * 4);
    assert_false(kv_layout_compatible(&lo, &lo32));
    kv_layout_t lo_long; /* longer, other block size: compatible */
    assert_int_equal(kv_layout_init(&lo_long, TYPE_F16, 3, 99, 2, 8, 5, &err), 0);
    assert_true(kv_layout_compatible(&lo, &lo_long));

    expect_err(kv_layout_init(&lo32, TYPE_Q4_0, 3, 10, 2, 8, 4, &err), TERN_EINVAL, &err, "only f16 and f32");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 0, 10, 2, 8, 4, &err), TERN_EINVAL, &err, "bad layout");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 3, 10, 2, -8, 4, &err), TERN_EINVAL, &err, "bad layout");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 3, 0, 2, 8, 4, &err), TERN_EINVAL, &err, "bad layout");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 3, 10, 2, 8, (1 << 20) + 1, &err), TERN_EINVAL, &err, "bad layout");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 3, INT64_MAX / 4, 1024, 1024, 4, &err), TERN_EINVAL, &err,
               "too many blocks");
    expect_err(kv_layout_init(&lo32, TYPE_F16, 8, (int64_t)1 << 40, 1024, 1024, 1 << 20, &err), TERN_EINVAL, &err,
               "overflows");
    /* kv_cache_new: the sequence count, a hand-made layout. */
    assert_null(kv_cache_new(&lo, 0, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    assert_null(kv_cache_new(&lo, KV_MAX_SEQ + 1, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    kv_layout_t hand = lo;
    hand.block_pos = 0; /* rederived: the default */
    kv_cache_t *hc = kv_cache_new(&hand, 1, &err);
    assert_non_null(hc);
    assert_int_equal(kv_cache_layout(hc)->block_pos, KV_BLOCK_POS_DEFAULT);
    kv_cache_free(hc);

    /* Store two positions of each layer by hand, commit, read back. */
    kv_cache_t *c = kv_cache_new(&lo, 2, &err);
    assert_non_null(c);
    assert_int_equal(kv_cache_n_seq(c), 2);
    assert_int_equal(kv_seq_n_pos(c, 0), 0);
    assert_int_equal(kv_seq_n_blocks(c, 0), 0);
    float k[2 * 16], v[2 * 16];
    for (int i = 0; i < 32; i++) {
        k[i] = (float)i;
        v[i] = -(float)i;
    }
    assert_int_equal(kv_seq_reserve(c, 0, 2, &err), 0);
    for (int64_t l = 0; l < 3; l++) kv_seq_store(c, 0, l, 0, 2, k, v);
    assert_int_equal(kv_seq_commit(c, 0, 2, &err), 0);
    const int32_t b0 = kv_seq_blocks(c, 0)[0];
    const fp16_t *k1 = (const fp16_t *)((const unsigned char *)kv_cache_k(c, 1) + (size_t)b0 * lo.block_bytes);
    const fp16_t *v2 = (const fp16_t *)((const unsigned char *)kv_cache_v(c, 2) + (size_t)b0 * lo.block_bytes);
    /* Head-major blocks of 4 positions: position p, head g, element d at
     * (g * 4 + p) * 8 + d; the stored value was p * 16 + g * 8 + d. */
    assert_int_equal(k1[(0 * 4 + 1) * 8 + 1], f32_to_fp16(17.0f));
    assert_int_equal(k1[(1 * 4 + 0) * 8 + 2], f32_to_fp16(10.0f));
    assert_int_equal(v2[(1 * 4 + 1) * 8 + 7], f32_to_fp16(-31.0f));
    assert_true((const unsigned char *)kv_cache_k(c, 1) - (const unsigned char *)kv_cache_k(c, 0) ==
                (ptrdiff_t)lo.layer_bytes);
    /* Positions 2, 3 are reserved (the rest of the block): 9 are not. */
    expect_err(kv_seq_commit(c, 0, 9, &err), TERN_EINVAL, &err, "cannot add 9 positions");
    expect_err(kv_seq_commit(c, 0, -1, &err), TERN_EINVAL, &err, "cannot add -1 positions");
    assert_int_equal(kv_seq_n_pos(c, 0), 2);

    /* Writes: more positions than held; a failing writer at each call
     * (header, then K and V of each layer: one run each). */
    membuf_t b = {0};
    expect_err(kv_seq_write(c, 0, 3, mem_write, &b, &err), TERN_EINVAL, &err, "cannot write 3 positions");
    expect_err(kv_seq_write(c, 0, -1, mem_write, &b, &err), TERN_EINVAL, &err, "cannot write -1 positions");
    expect_err(kv_seq_write(c, 0, 2, NULL, &b, &err), TERN_EINVAL, &err, "NULL");
    for (int call = 1; call <= 7; call++) {
        membuf_t f = {0};
        f.fail_after = call;
        expect_err(kv_seq_write(c, 0, 2, mem_write, &f, &err), TERN_EIO, &err, "failed");
        free(f.data);
    }
    assert_int_equal(kv_seq_write(c, 0, 2, mem_write, &b, &err), 0);
    assert_int_equal(b.len, kv_cache_serialized_size(&lo, 2));
    /* ... and back into sequence 1 of a longer memory of the same position
     * shape and another block size. */
    kv_cache_t *d = kv_cache_new(&lo_long, 2, &err);
    assert_non_null(d);
    assert_int_equal(kv_seq_read(d, 1, mem_read, rewind_to(&b, b.len), &err), 0);
    assert_int_equal(kv_seq_n_pos(d, 1), 2);
    assert_int_equal(kv_seq_n_pos(d, 0), 0);
    unsigned char r0[2 * 32], r1[2 * 32], s0[2 * 32], s1[2 * 32];
    for (int64_t l = 0; l < 3; l++) {
        kv_seq_get_raw(d, 1, l, 0, 2, r0, r1);
        kv_seq_get_raw(c, 0, l, 0, 2, s0, s1);
        assert_memory_equal(r0, s0, 2 * lo.pos_bytes);
        assert_memory_equal(r1, s1, 2 * lo.pos_bytes);
    }
    /* Read ids are unknown. */
    assert_int_equal(kv_seq_ids(d, 1)[0], -1);
    assert_int_equal(kv_seq_ids(d, 1)[1], -1);
    kv_cache_free(c);
    kv_cache_free(d);
    free(b.data);
}

/* ---- the paged memory -------------------------------------------------------------------- */

/* Reserve takes every block it needs or none. */
static void test_reserve_all_or_nothing(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(TYPE_F32, 2, 16, 4, 3); /* 4 blocks of 4 */
    mem_state_t before;
    fill(c, 0, 6, 1); /* 2 blocks */
    fill(c, 1, 8, 2); /* 2 blocks: the memory is full */
    check_accounting(c);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_free, 0);
    state_of(c, &before);
    expect_err(kv_seq_reserve(c, 2, 1, &err), TERN_EKVFULL, &err, "KV memory full");
    expect_state(c, &before);
    /* Positions 6, 7 are in sequence 0's second block: no block needed. */
    assert_int_equal(kv_seq_reserve(c, 0, 2, &err), 0);
    expect_state(c, &before);
    /* 3 more need a third block. */
    expect_err(kv_seq_reserve(c, 0, 3, &err), TERN_EKVFULL, &err, "needs 1 more blocks");
    expect_state(c, &before);
    /* Past n_ctx on its own: ECTXFULL, even with free blocks. */
    expect_err(kv_seq_reserve(c, 0, 11, &err), TERN_ECTXFULL, &err, "context full");
    expect_state(c, &before);
    kv_seq_remove(c, 1);
    kv_stats_t st2;
    kv_cache_stats(c, &st2);
    assert_int_equal(st2.n_free, 2);
    expect_err(kv_seq_reserve(c, 2, 17, &err), TERN_ECTXFULL, &err, "context full");
    expect_err(kv_seq_reserve(c, 2, -1, &err), TERN_EINVAL, &err, "cannot reserve");
    assert_int_equal(kv_seq_reserve(c, 2, 0, &err), 0);
    assert_int_equal(kv_seq_n_blocks(c, 2), 0);
    /* 3 blocks for sequence 2 with 2 free: none taken. */
    state_of(c, &before);
    expect_err(kv_seq_reserve(c, 2, 9, &err), TERN_EKVFULL, &err, "KV memory full");
    expect_state(c, &before);
    /* Exactly what is free: taken. */
    assert_int_equal(kv_seq_reserve(c, 2, 8, &err), 0);
    assert_int_equal(kv_seq_n_blocks(c, 2), 2);
    assert_int_equal(kv_seq_n_pos(c, 2), 0);
    kv_cache_stats(c, &st2);
    assert_int_equal(st2.n_free, 0);
    assert_int_equal(kv_seq_truncate(c, 2, 0, &err), 0); /* reserved blocks given back */
    kv_cache_stats(c, &st2);
    assert_int_equal(st2.n_free, 2);

    /* A copy on write counts as a block: sequence 2 forked from 0 inside its
     * second block, the memory full, and one more position for 2 needs a
     * copy of that block. */
    assert_int_equal(kv_seq_fork(c, 2, 0, 6, &err), 0);
    fill(c, 1, 8, 3);
    kv_cache_stats(c, &st2);
    assert_int_equal(st2.n_free, 0);
    assert_int_equal(st2.n_shared, 2);
    state_of(c, &before);
    expect_err(kv_seq_reserve(c, 2, 1, &err), TERN_EKVFULL, &err, "needs 1 more blocks");
    expect_err(kv_seq_reserve(c, 0, 1, &err), TERN_EKVFULL, &err, "needs 1 more blocks");
    expect_state(c, &before);
    /* Committing what was not reserved: refused. */
    expect_err(kv_seq_commit(c, 1, 1, &err), TERN_EINVAL, &err, "cannot add 1 positions");
    expect_state(c, &before);
    check_accounting(c);
    expect_rows(c, 0, 0, 6, 1);
    expect_rows(c, 2, 0, 6, 1);
    expect_rows(c, 1, 0, 8, 3);
    check_all_free(c);
    kv_cache_free(c);
}

/* Store and get_raw across block boundaries, with sequences interleaved so
 * that their tables are not contiguous. */
static void store_roundtrip(int type) {
    kv_cache_t *c = mem_new(type, 3, 40, 4, 3);
    /* Turns of 3 and 5 positions, alternating between sequences 0 and 1,
     * stored in pieces of 1, 2 and 5 positions. */
    for (int r = 0; r < 3; r++) {
        fill_piece(c, 0, 3, 1, 1 + r);
        fill_piece(c, 1, 5, 2, 5 - 2 * r);
    }
    check_accounting(c);
    assert_int_equal(kv_seq_n_pos(c, 0), 9);
    assert_int_equal(kv_seq_n_pos(c, 1), 15);
    /* Not one run of blocks: the tables interleave. */
    const int32_t *t0 = kv_seq_blocks(c, 0);
    assert_true(t0[1] != t0[0] + 1 || t0[2] != t0[1] + 1);
    expect_rows(c, 0, 0, 9, 1);
    expect_rows(c, 1, 0, 15, 2);
    /* Every window (start, length) reads as position by position. */
    const kv_layout_t *lo = kv_cache_layout(c);
    unsigned char all_k[15 * 32], all_v[15 * 32], k[15 * 32 + 1], v[15 * 32];
    for (int64_t l = 0; l < lo->n_layer; l++) {
        kv_seq_get_raw(c, 1, l, 0, 15, all_k, all_v);
        for (int64_t p = 0; p < 15; p++)
            for (int64_t n = 0; p + n <= 15; n++) {
                memset(k, 0xAB, sizeof k);
                kv_seq_get_raw(c, 1, l, p, n, k, v);
                if (n) {
                    assert_memory_equal(k, all_k + p * lo->pos_bytes, n * lo->pos_bytes);
                    assert_memory_equal(v, all_v + p * lo->pos_bytes, n * lo->pos_bytes);
                }
                /* Nothing past the range is written. */
                assert_int_equal(k[n * lo->pos_bytes], 0xAB);
            }
    }
    check_all_free(c);
    kv_cache_free(c);
}
static void test_store_roundtrip_f16(void **state) {
    (void)state;
    store_roundtrip(TYPE_F16);
}
static void test_store_roundtrip_f32(void **state) {
    (void)state;
    store_roundtrip(TYPE_F32);
}

/* A fork shares the source's blocks; nothing is copied. */
static void test_fork_shares(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(TYPE_F16, 2, 24, 4, 4);
    fill(c, 0, 10, 1); /* 3 blocks */
    kv_stats_t st;
    assert_int_equal(kv_seq_fork(c, 1, 0, 10, &err), 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 3);
    assert_int_equal(st.n_shared, 3);
    assert_int_equal(kv_seq_n_blocks(c, 1), 3);
    assert_memory_equal(kv_seq_blocks(c, 1), kv_seq_blocks(c, 0), 3 * sizeof(int32_t));
    expect_rows(c, 1, 0, 10, 1);
    /* A fork of 5 positions takes the first 2 blocks. */
    assert_int_equal(kv_seq_fork(c, 2, 0, 5, &err), 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 3);
    assert_int_equal(st.n_shared, 3);
    assert_int_equal(kv_seq_n_pos(c, 2), 5);
    assert_int_equal(kv_seq_n_blocks(c, 2), 2);
    assert_memory_equal(kv_seq_blocks(c, 2), kv_seq_blocks(c, 0), 2 * sizeof(int32_t));
    expect_rows(c, 2, 0, 5, 1);
    /* A fork of a fork. */
    assert_int_equal(kv_seq_fork(c, 3, 2, 4, &err), 0);
    assert_int_equal(kv_seq_n_blocks(c, 3), 1);
    expect_rows(c, 3, 0, 4, 1);
    check_accounting(c);
    /* The source dropping its blocks leaves them to the forks. */
    kv_seq_remove(c, 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 3);
    assert_int_equal(st.n_shared, 2);
    expect_rows(c, 1, 0, 10, 1);
    expect_rows(c, 2, 0, 5, 1);
    check_accounting(c);
    check_all_free(c);
    kv_cache_free(c);
}

/* Copy on write: after a fork at a position inside a block, appending to
 * either sequence copies that block first; the other's rows stay. */
static void cow_case(int type, bool append_to_source) {
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(type, 2, 32, 4, 3);
    fill(c, 0, 7, 1); /* blocks 0 (full), 1 (3 positions) */
    /* Fork 6 positions: the fork ends inside block 1 (2 of its rows), the
     * source holds one more row there. */
    assert_int_equal(kv_seq_fork(c, 1, 0, 6, &err), 0);
    unsigned char *s0 = snapshot(c, 0), *s1 = snapshot(c, 1);
    const int32_t shared_blk = kv_seq_blocks(c, 0)[1], first = kv_seq_blocks(c, 0)[0];
    kv_stats_t st;
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 2);
    assert_int_equal(st.n_shared, 2);
    const int writer = append_to_source ? 0 : 1, other = 1 - writer;
    const int64_t wpos = kv_seq_n_pos(c, writer);
    fill(c, writer, 5, 2); /* crosses into a new block too */
    kv_cache_stats(c, &st);
    /* The writer has its own copy of block 1 and one new block; block 0 is
     * still shared. */
    assert_int_equal(st.n_used, 4);
    assert_int_equal(st.n_shared, 1);
    assert_int_equal(kv_seq_blocks(c, writer)[0], first);
    assert_int_equal(kv_seq_blocks(c, other)[0], first);
    assert_int_not_equal(kv_seq_blocks(c, writer)[1], shared_blk);
    assert_int_equal(kv_seq_blocks(c, other)[1], shared_blk);
    /* The other's rows, byte for byte, and the writer's: the old ones, then
     * the new. */
    expect_snapshot(c, other, other == 0 ? s0 : s1, other == 0 ? 7 : 6);
    expect_rows(c, writer, 0, wpos, 1);
    for (int64_t p = wpos; p < wpos + 5; p++) expect_pos(c, writer, p, 2, p);
    /* Now the other appends: block 1 is its own again, no copy. */
    const int64_t opos = kv_seq_n_pos(c, other);
    fill(c, other, 2, 3);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, other == 0 ? 5 : 4); /* 0 needed a new block, 1 did not */
    assert_int_equal(kv_seq_blocks(c, other)[1], shared_blk);
    expect_rows(c, other, 0, opos, 1);
    for (int64_t p = opos; p < opos + 2; p++) expect_pos(c, other, p, 3, p);
    expect_rows(c, writer, 0, wpos, 1);
    for (int64_t p = wpos; p < wpos + 5; p++) expect_pos(c, writer, p, 2, p);
    check_accounting(c);
    free(s0);
    free(s1);

    /* A fork at a block boundary: appending takes a fresh block, copies
     * nothing. */
    kv_seq_remove(c, 1);
    kv_seq_remove(c, 2);
    assert_int_equal(kv_seq_fork(c, 2, 0, 4, &err), 0);
    kv_stats_t before;
    kv_cache_stats(c, &before);
    fill(c, 2, 3, 4);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, before.n_used + 1);
    assert_int_equal(st.n_shared, 1);
    assert_int_equal(kv_seq_blocks(c, 2)[0], kv_seq_blocks(c, 0)[0]);
    expect_rows(c, 2, 0, 4, 1);
    expect_pos(c, 2, 4, 4, 4);
    expect_pos(c, 0, 4, 1, 4);
    check_accounting(c);
    check_all_free(c);
    kv_cache_free(c);
}
static void test_cow_append_fork_f16(void **state) {
    (void)state;
    cow_case(TYPE_F16, false);
}
static void test_cow_append_source_f32(void **state) {
    (void)state;
    cow_case(TYPE_F32, true);
}

/* Copy on write after a truncation back into a shared block: the truncated
 * sequence overwrites positions the other still holds only in its own copy. */
static void test_cow_after_truncate(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(TYPE_F32, 2, 24, 4, 2);
    fill(c, 0, 8, 1);
    assert_int_equal(kv_seq_fork(c, 1, 0, 8, &err), 0);
    assert_int_equal(kv_seq_truncate(c, 0, 5, &err), 0); /* keeps both blocks, the second shared */
    assert_int_equal(kv_seq_n_blocks(c, 0), 2);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_shared, 2);
    fill(c, 0, 3, 2); /* positions 5..7 again, other values */
    expect_rows(c, 1, 0, 8, 1);
    expect_rows(c, 0, 0, 5, 1);
    for (int64_t p = 5; p < 8; p++) expect_pos(c, 0, p, 2, p);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_shared, 1);
    assert_int_equal(st.n_used, 3);
    check_accounting(c);
    check_all_free(c);
    kv_cache_free(c);
}

/* Truncate gives back the blocks past the kept positions and keeps the rows
 * before; remove frees everything. */
static void test_truncate_remove(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(TYPE_F16, 2, 20, 4, 2); /* 5 blocks */
    fill(c, 0, 10, 1);
    kv_stats_t st;
    const struct {
        int64_t to, blocks;
    } steps[] = {{10, 3}, {9, 3}, {8, 2}, {5, 2}, {4, 1}, {1, 1}, {0, 0}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        assert_int_equal(kv_seq_truncate(c, 0, steps[i].to, &err), 0);
        assert_int_equal(kv_seq_n_pos(c, 0), steps[i].to);
        assert_int_equal(kv_seq_n_blocks(c, 0), steps[i].blocks);
        kv_cache_stats(c, &st);
        assert_int_equal(st.n_used, steps[i].blocks);
        assert_int_equal(st.n_free, 5 - steps[i].blocks);
        expect_rows(c, 0, 0, steps[i].to, 1);
    }
    /* Truncated positions come back with new values. */
    fill(c, 0, 3, 1);
    fill(c, 0, 7, 1);
    expect_rows(c, 0, 0, 10, 1);
    assert_int_equal(kv_seq_truncate(c, 0, 6, &err), 0);
    fill(c, 0, 2, 5);
    expect_rows(c, 0, 0, 6, 1);
    expect_pos(c, 0, 6, 5, 6);
    expect_pos(c, 0, 7, 5, 7);
    /* Errors change nothing. */
    mem_state_t before;
    state_of(c, &before);
    expect_err(kv_seq_truncate(c, 0, 9, &err), TERN_EINVAL, &err, "cannot truncate");
    expect_err(kv_seq_truncate(c, 0, -1, &err), TERN_EINVAL, &err, "cannot truncate");
    expect_state(c, &before);
    /* Reserved, uncommitted blocks go back with truncate(n_pos). */
    assert_int_equal(kv_seq_reserve(c, 0, 12, &err), 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 5);
    assert_int_equal(kv_seq_truncate(c, 0, 8, &err), 0);
    expect_state(c, &before);
    /* A truncated source keeps the blocks a fork holds. */
    assert_int_equal(kv_seq_fork(c, 1, 0, 8, &err), 0);
    assert_int_equal(kv_seq_truncate(c, 0, 2, &err), 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 2);
    assert_int_equal(st.n_shared, 1);
    expect_rows(c, 1, 0, 6, 1);
    kv_seq_remove(c, 1);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 1);
    kv_seq_remove(c, 0);
    kv_seq_remove(c, 0); /* twice: nothing more */
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_free, 5);
    assert_int_equal(kv_seq_n_pos(c, 0), 0);
    assert_int_equal(kv_seq_n_blocks(c, 0), 0);
    check_all_free(c);
    kv_cache_free(c);
}

/* Reference counts reach 0 exactly once: five sequences sharing blocks in
 * several ways, removed in every order, leave every block free once. */
static void test_refcounts_any_order(void **state) {
    (void)state;
    int perm[5] = {0, 1, 2, 3, 4};
    int n_perm = 0;
    for (;;) {
        kv_cache_t *c = mem_new(TYPE_F16, 1, 40, 4, 5); /* 10 blocks */
        fill(c, 0, 11, 1);
        assert_int_equal(kv_seq_fork(c, 1, 0, 11, NULL), 0);
        assert_int_equal(kv_seq_fork(c, 2, 0, 6, NULL), 0);
        fill(c, 2, 3, 2); /* copies block 1 */
        assert_int_equal(kv_seq_fork(c, 3, 2, 9, NULL), 0);
        assert_int_equal(kv_seq_truncate(c, 1, 4, NULL), 0);
        fill(c, 4, 5, 3);
        assert_int_equal(kv_seq_fork(c, 0, 4, 5, NULL), 0); /* 0 drops its own blocks */
        check_accounting(c);
        for (int i = 0; i < 5; i++) {
            kv_seq_remove(c, perm[i]);
            check_accounting(c);
        }
        kv_stats_t st;
        kv_cache_stats(c, &st);
        assert_int_equal(st.n_free, 10);
        check_all_free(c);
        kv_cache_free(c);
        n_perm++;
        /* Next permutation (lexicographic). */
        int i = 3;
        while (i >= 0 && perm[i] > perm[i + 1]) i--;
        if (i < 0) break;
        int j = 4;
        while (perm[j] < perm[i]) j--;
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        for (int a = i + 1, b = 4; a < b; a++, b--) t = perm[a], perm[a] = perm[b], perm[b] = t;
    }
    assert_int_equal(n_perm, 120);
}

/* Fork into a sequence that holds blocks (its own, or shared with the
 * source), fork of 0 positions, and fork errors. */
static void test_fork_into_holder(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(TYPE_F32, 2, 32, 4, 3); /* 8 blocks */
    fill(c, 0, 9, 1);
    fill(c, 1, 12, 2);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 6);
    /* Sequence 1's own 3 blocks go back; it shares 0's first 2. */
    assert_int_equal(kv_seq_fork(c, 1, 0, 5, &err), 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 3);
    assert_int_equal(st.n_shared, 2);
    expect_rows(c, 1, 0, 5, 1);
    assert_int_equal(kv_seq_ids(c, 1)[4], 1004);
    /* Again, from the sequence it shares with, longer: no block freed early. */
    assert_int_equal(kv_seq_fork(c, 1, 0, 9, &err), 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 3);
    assert_int_equal(st.n_shared, 3);
    expect_rows(c, 1, 0, 9, 1);
    /* The source forked from its own fork (which holds the same blocks). */
    assert_int_equal(kv_seq_fork(c, 0, 1, 3, &err), 0);
    expect_rows(c, 0, 0, 3, 1);
    expect_rows(c, 1, 0, 9, 1);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 3);
    assert_int_equal(st.n_shared, 1);
    check_accounting(c);
    /* Fork of 0 positions: an empty sequence, its blocks given back. */
    assert_int_equal(kv_seq_fork(c, 1, 0, 0, &err), 0);
    assert_int_equal(kv_seq_n_pos(c, 1), 0);
    assert_int_equal(kv_seq_n_blocks(c, 1), 0);
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_used, 1);
    assert_int_equal(st.n_shared, 0);
    assert_int_equal(kv_seq_fork(c, 2, 1, 0, &err), 0); /* of an empty one */
    assert_int_equal(kv_seq_n_pos(c, 2), 0);
    fill(c, 2, 4, 3); /* and it grows normally */
    expect_rows(c, 2, 0, 4, 3);
    /* Errors leave both as they were. */
    mem_state_t before;
    state_of(c, &before);
    expect_err(kv_seq_fork(c, 0, 0, 1, &err), TERN_EINVAL, &err, "into itself");
    expect_err(kv_seq_fork(c, 2, 0, 4, &err), TERN_EINVAL, &err, "cannot fork 4 positions");
    expect_err(kv_seq_fork(c, 2, 0, -1, &err), TERN_EINVAL, &err, "cannot fork");
    expect_state(c, &before);
    expect_rows(c, 2, 0, 4, 3);
    check_accounting(c);
    check_all_free(c);
    kv_cache_free(c);
}

/* kv_seq_copy between memories of different block sizes: identical rows and
 * ids; the destination's own positions are dropped. */
static void test_copy_between_block_sizes(void **state) {
    (void)state;
    tern_error_t err = {0};
    const int64_t bps[] = {1, 3, 4, 5, 8};
    for (int t = 0; t < 2; t++) {
        const int type = t ? TYPE_F32 : TYPE_F16;
        kv_cache_t *a = mem_new(type, 2, 48, 4, 2);
        fill(a, 1, 3, 9); /* not at block 0 */
        fill(a, 0, 17, 1);
        for (size_t i = 0; i < sizeof bps / sizeof bps[0]; i++) {
            kv_cache_t *b = mem_new(type, 2, 30, bps[i], 3);
            for (int64_t n = 0; n <= 17; n++) {
                fill(b, 2, 2, 4);
                fill(b, 1, 5, 5); /* to be replaced */
                fill(b, 2, 2, 4);
                assert_int_equal(kv_seq_copy(b, 1, a, 0, n, &err), 0);
                assert_int_equal(kv_seq_n_pos(b, 1), n);
                expect_rows(b, 1, 0, n, 1);
                expect_rows(b, 2, 0, 4, 4);
                check_accounting(b);
                /* Back the other way, into a's sequence 1. */
                assert_int_equal(kv_seq_copy(a, 1, b, 1, n, &err), 0);
                expect_rows(a, 1, 0, n, 1);
                kv_seq_remove(b, 2);
            }
            kv_cache_free(b);
        }
        /* Errors leave the destination as it was: another layout; n past
         * the source or the destination's n_ctx; too few blocks free or its
         * own. */
        kv_cache_t *other = mem_new(t ? TYPE_F16 : TYPE_F32, 2, 24, 4, 1);
        kv_cache_t *small = mem_new(type, 2, 8, 4, 2);
        fill(small, 0, 3, 6);
        mem_state_t before;
        state_of(small, &before);
        expect_err(kv_seq_copy(other, 0, a, 0, 4, &err), TERN_EINVAL, &err, "between layouts");
        expect_err(kv_seq_copy(small, 0, a, 0, 18, &err), TERN_EINVAL, &err, "cannot copy 18 positions");
        expect_err(kv_seq_copy(small, 0, a, 0, 9, &err), TERN_EINVAL, &err, "room for 8");
        expect_err(kv_seq_copy(small, 0, a, 0, -1, &err), TERN_EINVAL, &err, "cannot copy");
        expect_err(kv_seq_copy(NULL, 0, a, 0, 1, &err), TERN_EINVAL, &err, "NULL");
        expect_state(small, &before);
        expect_rows(small, 0, 0, 3, 6);
        fill(small, 1, 4, 7); /* the second block: none left free */
        state_of(small, &before);
        expect_err(kv_seq_copy(small, 0, a, 0, 5, &err), TERN_EKVFULL, &err, "KV memory full");
        expect_state(small, &before);
        expect_rows(small, 0, 0, 3, 6);
        expect_rows(small, 1, 0, 4, 7);
        /* Its own block is enough for 4. */
        assert_int_equal(kv_seq_copy(small, 0, a, 0, 4, &err), 0);
        expect_rows(small, 0, 0, 4, 1);
        expect_rows(small, 1, 0, 4, 7);
        /* A block it shares does not count. */
        assert_int_equal(kv_seq_fork(small, 1, 0, 4, &err), 0);
        fill(small, 1, 1, 8); /* the other block again */
        state_of(small, &before);
        expect_err(kv_seq_copy(small, 0, a, 0, 1, &err), TERN_EKVFULL, &err, "KV memory full");
        expect_state(small, &before);
        check_accounting(small);
        /* Into the same memory: a fork. */
        assert_int_equal(kv_seq_copy(a, 1, a, 0, 10, &err), 0);
        assert_memory_equal(kv_seq_blocks(a, 1), kv_seq_blocks(a, 0), 3 * sizeof(int32_t));
        kv_cache_free(other);
        kv_cache_free(small);
        kv_cache_free(a);
    }
}

/* A sequence whose blocks are scattered (other sequences took and freed
 * blocks around them) serializes to the same bytes as one held in order,
 * and reads back into any memory. */
static void test_serialize_scattered(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(TYPE_F16, 2, 64, 4, 4); /* 16 blocks */
    for (int r = 0; r < 3; r++) {
        fill(c, 0, 4, 1);
        fill(c, 1, 4, 2);
        fill(c, 2, 4, 3);
    }
    kv_seq_remove(c, 1);
    assert_int_equal(kv_seq_truncate(c, 0, 5, NULL), 0);
    /* Sequence 3 takes the freed blocks, in no order, and a new one. */
    fill(c, 3, 13, 4);
    const int32_t *t = kv_seq_blocks(c, 3);
    bool ascending = true;
    for (int i = 1; i < 4; i++) ascending &= t[i] == t[i - 1] + 1;
    assert_false(ascending);
    membuf_t b = {0}, ref = {0};
    assert_int_equal(kv_seq_write(c, 3, 13, mem_write, &b, &err), 0);
    /* The same positions in a fresh memory (blocks in order, another size). */
    kv_cache_t *plain = mem_new(TYPE_F16, 2, 16, 16, 1);
    fill(plain, 0, 13, 4);
    assert_int_equal(kv_seq_write(plain, 0, 13, mem_write, &ref, &err), 0);
    assert_int_equal(b.len, ref.len);
    assert_memory_equal(b.data, ref.data, b.len);
    /* Read back: into sequence 1 of c (free blocks scattered too), into the
     * plain memory, into a memory of blocks of 3. */
    assert_int_equal(kv_seq_read(c, 1, mem_read, rewind_to(&b, b.len), &err), 0);
    kv_cache_t *three = mem_new(TYPE_F16, 2, 18, 3, 2);
    fill(three, 0, 2, 5);
    assert_int_equal(kv_seq_read(three, 1, mem_read, rewind_to(&b, b.len), &err), 0);
    assert_int_equal(kv_seq_read(plain, 0, mem_read, rewind_to(&b, b.len), &err), 0);
    unsigned char *want = snapshot(c, 3);
    expect_snapshot(c, 1, want, 13);
    expect_snapshot(three, 1, want, 13);
    expect_snapshot(plain, 0, want, 13);
    free(want);
    expect_rows(c, 0, 0, 5, 1);
    expect_rows(c, 2, 0, 12, 3);
    expect_rows(c, 3, 0, 13, 4);
    expect_rows(three, 0, 0, 2, 5);
    check_accounting(c);
    check_accounting(three);
    /* A prefix of a sequence written, read over a longer one. */
    membuf_t p = {0};
    assert_int_equal(kv_seq_write(c, 2, 6, mem_write, &p, &err), 0);
    assert_int_equal(kv_seq_read(c, 3, mem_read, rewind_to(&p, p.len), &err), 0);
    assert_int_equal(kv_seq_n_pos(c, 3), 6);
    expect_rows_data(c, 3, 0, 6, 3);
    check_accounting(c);
    kv_cache_free(c);
    kv_cache_free(plain);
    kv_cache_free(three);
    free(b.data);
    free(ref.data);
    free(p.data);
}

/* A read that needs more blocks than are free (counting the sequence's own,
 * not the ones it shares) is refused after the header, nothing changed. */
static void test_read_kvfull(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *src = mem_new(TYPE_F32, 2, 16, 4, 1);
    fill(src, 0, 8, 7);
    membuf_t b = {0};
    assert_int_equal(kv_seq_write(src, 0, 8, mem_write, &b, &err), 0); /* 8 positions: 2 blocks */

    kv_cache_t *c = mem_new(TYPE_F32, 2, 16, 4, 3); /* 4 blocks */
    fill(c, 0, 3, 1);                                 /* 1 block */
    fill(c, 1, 9, 2);                                 /* 3 blocks: full */
    assert_int_equal(kv_seq_fork(c, 2, 1, 9, &err), 0);
    mem_state_t before;
    state_of(c, &before);
    /* Sequence 0 has 1 block of its own: 1 < 2. */
    expect_err(kv_seq_read(c, 0, mem_read, rewind_to(&b, b.len), &err), TERN_EKVFULL, &err, "KV memory full");
    assert_int_equal(b.off, KV_HEADER_BYTES); /* only the header was read */
    expect_state(c, &before);
    expect_rows(c, 0, 0, 3, 1);
    /* Sequence 2 holds 3 blocks, all shared: none of its own. */
    expect_err(kv_seq_read(c, 2, mem_read, rewind_to(&b, b.len), &err), TERN_EKVFULL, &err, "KV memory full");
    expect_state(c, &before);
    expect_rows(c, 2, 0, 9, 2);
    /* Sequence 1 shares all of its blocks too, until 2 drops them. */
    expect_err(kv_seq_read(c, 1, mem_read, rewind_to(&b, b.len), &err), TERN_EKVFULL, &err, "KV memory full");
    expect_state(c, &before);
    assert_int_equal(kv_seq_truncate(c, 2, 4, &err), 0); /* 1 and 2 share block 0; 1 owns 2 */
    assert_int_equal(kv_seq_read(c, 1, mem_read, rewind_to(&b, b.len), &err), 0);
    expect_rows_data(c, 1, 0, 8, 7);
    expect_rows(c, 2, 0, 4, 2);
    expect_rows(c, 0, 0, 3, 1);
    check_accounting(c);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    assert_int_equal(st.n_free, 0);
    assert_int_equal(st.n_shared, 0);
    /* Exactly enough: sequence 0 owns 1 block, 1 more freed. */
    kv_seq_remove(c, 2);
    assert_int_equal(kv_seq_read(c, 0, mem_read, rewind_to(&b, b.len), &err), 0);
    expect_rows_data(c, 0, 0, 8, 7);
    expect_rows_data(c, 1, 0, 8, 7);
    check_accounting(c);
    /* A short read after the check: the sequence is left empty, its blocks free. */
    assert_int_equal(kv_seq_read(c, 0, mem_read, rewind_to(&b, b.len - 1), &err), TERN_EFORMAT);
    assert_int_equal(kv_seq_n_pos(c, 0), 0);
    assert_int_equal(kv_seq_n_blocks(c, 0), 0);
    expect_rows_data(c, 1, 0, 8, 7);
    check_accounting(c);
    check_all_free(c);
    kv_cache_free(c);
    kv_cache_free(src);
    free(b.data);
}

/* The token ids follow fork, truncate, copy and read. */
static void test_ids(void **state) {
    (void)state;
    tern_error_t err = {0};
    kv_cache_t *c = mem_new(TYPE_F16, 1, 24, 4, 3), *d = mem_new(TYPE_F16, 1, 24, 5, 1);
    fill(c, 0, 9, 1);
    for (int64_t p = 0; p < 9; p++) assert_int_equal(kv_seq_ids(c, 0)[p], 1000 + p);
    assert_int_equal(kv_seq_fork(c, 1, 0, 6, &err), 0);
    for (int64_t p = 0; p < 6; p++) assert_int_equal(kv_seq_ids(c, 1)[p], 1000 + p);
    fill(c, 1, 2, 2);
    assert_int_equal(kv_seq_ids(c, 1)[6], 2006);
    assert_int_equal(kv_seq_ids(c, 0)[6], 1006); /* the source's stay */
    assert_int_equal(kv_seq_truncate(c, 0, 4, &err), 0);
    fill(c, 0, 3, 3);
    for (int64_t p = 0; p < 4; p++) assert_int_equal(kv_seq_ids(c, 0)[p], 1000 + p);
    for (int64_t p = 4; p < 7; p++) assert_int_equal(kv_seq_ids(c, 0)[p], 3000 + p);
    for (int64_t p = 0; p < 6; p++) assert_int_equal(kv_seq_ids(c, 1)[p], 1000 + p);
    assert_int_equal(kv_seq_copy(d, 0, c, 1, 8, &err), 0);
    for (int64_t p = 0; p < 6; p++) assert_int_equal(kv_seq_ids(d, 0)[p], 1000 + p);
    for (int64_t p = 6; p < 8; p++) assert_int_equal(kv_seq_ids(d, 0)[p], 2000 + p);
    /* put_ids on reserved positions. */
    assert_int_equal(kv_seq_reserve(d, 0, 2, &err), 0);
    const int32_t two[2] = {77, 78};
    kv_seq_put_ids(d, 0, 8, 2, two);
    assert_int_equal(kv_seq_commit(d, 0, 2, &err), 0);
    assert_int_equal(kv_seq_ids(d, 0)[9], 78);
    /* Read: unknown ids. */
    membuf_t b = {0};
    assert_int_equal(kv_seq_write(c, 0, 7, mem_write, &b, &err), 0);
    assert_int_equal(kv_seq_read(c, 2, mem_read, rewind_to(&b, b.len), &err), 0);
    for (int64_t p = 0; p < 7; p++) assert_int_equal(kv_seq_ids(c, 2)[p], -1);
    free(b.data);
    kv_cache_free(c);
    kv_cache_free(d);
}

/* ---- a random model test: the memory against per-sequence arrays of rows ---------------- */

#define M_SEQ 5
#define M_LAYER 2

typedef struct {
    kv_cache_t *c;
    const kv_layout_t *lo;
    int64_t n_pos[M_SEQ];
    unsigned char *rows[M_SEQ][M_LAYER][2]; /* n_ctx x pos_bytes: the reference */
    int32_t *ids[M_SEQ];
    unsigned char *buf;                      /* get_raw scratch */
    int64_t ops[8], refused;
} ref_model_t;

/* Blocks each sequence holds per block id (the reference's view of refcounts). */
static void ref_holds(const ref_model_t *m, int *held) {
    memset(held, 0, (size_t)m->lo->n_blocks * sizeof *held);
    for (int s = 0; s < M_SEQ; s++)
        for (int64_t i = 0; i < kv_seq_n_blocks(m->c, s); i++) held[kv_seq_blocks(m->c, s)[i]]++;
}

static void model_check(const ref_model_t *m) {
    check_accounting(m->c);
    const size_t pb = m->lo->pos_bytes;
    for (int s = 0; s < M_SEQ; s++) {
        const int64_t n = m->n_pos[s];
        assert_int_equal(kv_seq_n_pos(m->c, s), n);
        if (n) assert_memory_equal(kv_seq_ids(m->c, s), m->ids[s], (size_t)n * sizeof(int32_t));
        for (int l = 0; l < M_LAYER; l++) {
            kv_seq_get_raw(m->c, s, l, 0, n, m->buf, m->buf + (size_t)m->lo->n_ctx * pb);
            if (memcmp(m->buf, m->rows[s][l][0], (size_t)n * pb) ||
                memcmp(m->buf + (size_t)m->lo->n_ctx * pb, m->rows[s][l][1], (size_t)n * pb)) {
                print_message("model test: sequence %d layer %d differs from the reference\n", s, l);
                fail();
            }
        }
    }
}

/* One random operation on the memory and the reference. */
static void model_step(ref_model_t *m, uint64_t *rng) {
    const kv_layout_t *lo = m->lo;
    const size_t pb = lo->pos_bytes;
    const int64_t row = lo->n_head_kv * lo->head_dim, bp = lo->block_pos;
    const int s = (int)(tu_rand(rng) % M_SEQ);
    const unsigned op = (unsigned)(tu_rand(rng) % 16);
    tern_error_t err = {0};
    if (op < 7) {
        /* Append n positions: reserve (predicting its answer), store floats
         * or put raw bytes in random pieces, then commit, or give them back
         * (a failed forward pass). */
        const int64_t n = 1 + (int64_t)(tu_rand(rng) % (uint64_t)(2 * bp + 3));
        int held[64];
        ref_holds(m, held);
        kv_stats_t st;
        kv_cache_stats(m->c, &st);
        const int64_t p0 = m->n_pos[s], nb = kv_seq_n_blocks(m->c, s);
        const int64_t need = (p0 + n + bp - 1) / bp - nb;
        const int64_t cow = p0 % bp && held[kv_seq_blocks(m->c, s)[p0 / bp]] > 1;
        const int want = p0 + n > lo->n_ctx ? TERN_ECTXFULL : need + cow > st.n_free ? TERN_EKVFULL : 0;
        mem_state_t before;
        state_of(m->c, &before);
        const int rc = kv_seq_reserve(m->c, s, n, &err);
        assert_int_equal(rc, want);
        if (rc) {
            expect_state(m->c, &before);
            m->refused++;
            return;
        }
        m->ops[0]++;
        const bool raw = tu_rand(rng) & 1;
        float *f = malloc((size_t)(2 * n * row) * sizeof *f);
        unsigned char *bytes = malloc(2 * (size_t)n * pb);
        assert_true(f && bytes);
        for (int l = 0; l < M_LAYER; l++) {
            for (int h = 0; h < 2; h++) {
                unsigned char *dst = m->rows[s][l][h] + (size_t)p0 * pb;
                if (raw) {
                    for (size_t i = 0; i < (size_t)n * pb; i++) bytes[h * (size_t)n * pb + i] = (unsigned char)tu_rand(rng);
                    memcpy(dst, bytes + h * (size_t)n * pb, (size_t)n * pb);
                } else
                    for (int64_t i = 0; i < n * row; i++) {
                        const float x = tu_randn(rng);
                        f[h * n * row + i] = x;
                        if (lo->type == TYPE_F32)
                            memcpy(dst + i * 4, &x, 4);
                        else {
                            const fp16_t y = f32_to_fp16(x);
                            memcpy(dst + i * 2, &y, 2);
                        }
                    }
            }
            for (int64_t i = 0; i < n;) {
                const int64_t k = 1 + (int64_t)(tu_rand(rng) % (uint64_t)(n - i));
                if (raw)
                    kv_seq_put_raw(m->c, s, l, p0 + i, k, bytes + (size_t)i * pb, bytes + ((size_t)n + (size_t)i) * pb);
                else
                    kv_seq_store(m->c, s, l, p0 + i, k, f + i * row, f + (n + i) * row);
                i += k;
            }
        }
        free(f);
        free(bytes);
        for (int64_t i = 0; i < n; i++) m->ids[s][p0 + i] = (int32_t)(tu_rand(rng) % 1000);
        kv_seq_put_ids(m->c, s, p0, n, m->ids[s] + p0);
        if (tu_rand(rng) % 5 == 0) {
            assert_int_equal(kv_seq_truncate(m->c, s, p0, &err), 0);
            m->ops[1]++;
        } else {
            assert_int_equal(kv_seq_commit(m->c, s, n, &err), 0);
            m->n_pos[s] = p0 + n;
        }
    } else if (op < 9) {
        const int64_t n = (int64_t)(tu_rand(rng) % (uint64_t)(m->n_pos[s] + 1));
        assert_int_equal(kv_seq_truncate(m->c, s, n, &err), 0);
        m->n_pos[s] = n;
        m->ops[2]++;
    } else if (op < 13) {
        const int d = (int)(tu_rand(rng) % M_SEQ);
        const int64_t n = (int64_t)(tu_rand(rng) % (uint64_t)(m->n_pos[s] + 1));
        if (d == s) {
            assert_int_equal(kv_seq_fork(m->c, d, s, n, &err), TERN_EINVAL);
            return;
        }
        assert_int_equal(kv_seq_fork(m->c, d, s, n, &err), 0);
        for (int l = 0; l < M_LAYER; l++)
            for (int h = 0; h < 2; h++) memcpy(m->rows[d][l][h], m->rows[s][l][h], (size_t)n * pb);
        memcpy(m->ids[d], m->ids[s], (size_t)n * sizeof(int32_t));
        m->n_pos[d] = n;
        m->ops[3]++;
    } else if (op < 14) {
        kv_seq_remove(m->c, s);
        m->n_pos[s] = 0;
        m->ops[4]++;
    } else {
        /* Serialize s, read it into d: refused (nothing changed) when d's
         * own blocks and the free ones are too few. */
        const int d = (int)(tu_rand(rng) % M_SEQ);
        const int64_t n = m->n_pos[s];
        membuf_t b = {0};
        assert_int_equal(kv_seq_write(m->c, s, n, mem_write, &b, &err), 0);
        int held[64];
        ref_holds(m, held);
        kv_stats_t st;
        kv_cache_stats(m->c, &st);
        int64_t avail = st.n_free;
        for (int64_t i = 0; i < kv_seq_n_blocks(m->c, d); i++) avail += held[kv_seq_blocks(m->c, d)[i]] == 1;
        mem_state_t before;
        state_of(m->c, &before);
        const int rc = kv_seq_read(m->c, d, mem_read, rewind_to(&b, b.len), &err);
        if ((n + bp - 1) / bp > avail) {
            assert_int_equal(rc, TERN_EKVFULL);
            expect_state(m->c, &before);
            m->refused++;
        } else {
            assert_int_equal(rc, 0);
            if (d != s) {
                for (int l = 0; l < M_LAYER; l++)
                    for (int h = 0; h < 2; h++) memcpy(m->rows[d][l][h], m->rows[s][l][h], (size_t)n * pb);
                m->n_pos[d] = n;
            }
            for (int64_t i = 0; i < n; i++) m->ids[d][i] = -1;
            m->ops[5]++;
        }
        free(b.data);
    }
}

static void model_run(int type, int64_t bp, uint64_t seed, uint64_t t_end, int max_steps) {
    ref_model_t m = {0};
    m.c = mem_new(type, M_LAYER, 12 * bp, bp, M_SEQ); /* 12 blocks */
    m.lo = kv_cache_layout(m.c);
    const size_t bytes = (size_t)m.lo->n_ctx * m.lo->pos_bytes;
    for (int s = 0; s < M_SEQ; s++) {
        for (int l = 0; l < M_LAYER; l++)
            for (int h = 0; h < 2; h++) assert_non_null(m.rows[s][l][h] = calloc(bytes, 1));
        assert_non_null(m.ids[s] = calloc((size_t)m.lo->n_ctx, sizeof(int32_t)));
    }
    assert_non_null(m.buf = malloc(2 * bytes));
    uint64_t rng = seed;
    int steps = 0;
    for (; steps < max_steps && (steps % 64 || tern_now_ns() < t_end); steps++) {
        model_step(&m, &rng);
        model_check(&m);
    }
    print_message("random model (%s, blocks of %lld): %d steps; %lld appends, %lld given back, %lld truncates, "
                  "%lld forks, %lld removes, %lld reads, %lld refused\n",
                  type == TYPE_F32 ? "f32" : "f16", (long long)bp, steps, (long long)m.ops[0], (long long)m.ops[1],
                  (long long)m.ops[2], (long long)m.ops[3], (long long)m.ops[4], (long long)m.ops[5],
                  (long long)m.refused);
    /* Every operation ran, and reserve was refused some of the time. */
    for (int i = 0; i < 6; i++) assert_true(m.ops[i] > 0);
    assert_true(m.refused > 0);
    check_all_free(m.c);
    for (int s = 0; s < M_SEQ; s++) {
        for (int l = 0; l < M_LAYER; l++)
            for (int h = 0; h < 2; h++) free(m.rows[s][l][h]);
        free(m.ids[s]);
    }
    free(m.buf);
    kv_cache_free(m.c);
}

static void test_random_model(void **state) {
    (void)state;
    /* Bounded in time: 1.2 s over all configurations, at most 3000 steps each. */
    const uint64_t t0 = tern_now_ns();
    const struct {
        int type;
        int64_t bp;
    } cfg[] = {{TYPE_F16, 4}, {TYPE_F32, 3}, {TYPE_F16, 1}, {TYPE_F32, 5}};
    const int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    for (int i = 0; i < n_cfg; i++) {
        const uint64_t t_end = t0 + (uint64_t)(i + 1) * 300000000ull;
        model_run(cfg[i].type, cfg[i].bp, 0x5eed0000u + (uint64_t)i, t_end, 3000);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncate_f16),        cmocka_unit_test(test_truncate_f32),
        cmocka_unit_test(test_copy_prefix_f16),     cmocka_unit_test(test_copy_prefix_f32),
        cmocka_unit_test(test_save_restore_f16),    cmocka_unit_test(test_save_restore_f32),
        cmocka_unit_test(test_restore_rejects_f16), cmocka_unit_test(test_restore_rejects_f32),
        cmocka_unit_test(test_n_ctx_is_per_sequence),
        cmocka_unit_test(test_layout_and_writer),
        cmocka_unit_test(test_raw_range_f16),       cmocka_unit_test(test_raw_range_f32),
        cmocka_unit_test(test_reserve_all_or_nothing),
        cmocka_unit_test(test_store_roundtrip_f16), cmocka_unit_test(test_store_roundtrip_f32),
        cmocka_unit_test(test_fork_shares),
        cmocka_unit_test(test_cow_append_fork_f16), cmocka_unit_test(test_cow_append_source_f32),
        cmocka_unit_test(test_cow_after_truncate),
        cmocka_unit_test(test_truncate_remove),
        cmocka_unit_test(test_refcounts_any_order),
        cmocka_unit_test(test_fork_into_holder),
        cmocka_unit_test(test_copy_between_block_sizes),
        cmocka_unit_test(test_serialize_scattered),
        cmocka_unit_test(test_read_kvfull),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_random_model),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
