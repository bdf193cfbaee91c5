/*
 * test_session.c - session files (src/model/session.c): save and restore in
 * a fresh context and in another process, byte-identical continuation,
 * longest-prefix restore, refusal of another model or KV type, truncation at
 * every byte, random corruption, kill -9 while appending, and restore into
 * and append from one sequence of a KV memory shared by several. It forks
 * (a context with pool threads is alive at the first fork), so it runs
 * under TSan too.
 */
// ctest-label: concurrent
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#include "core/common.h"
#include "format/quant.h"
#include "model/session.h"

#define N_SEQ 200 /* positions of the reference sequence */
#define N_CTX 256

static model_t *g_m, *g_m2; /* tiny-64 with different weights (seeds 3 and 4) */
static int32_t g_seq[N_SEQ];
static float *g_ref16, *g_ref32; /* N_SEQ x n_vocab: logits of every position of g_seq (F16, F32 KV) */
static char g_dir[64];
static int g_warns;

static void count_log(tern_log_level_t level, const char *msg, void *user) {
    (void)msg;
    (void)user;
    if (level == TERN_LOG_WARN) g_warns++;
}

static int64_t V(void) { return g_m->hp.n_vocab; }

static int setup(void **state) {
    (void)state;
    tern_error_t err = {0};
    g_m = model_load(tu_tiny_model("ses", "tiny-64", "f32", 3), &err);
    g_m2 = model_load(tu_tiny_model("ses2", "tiny-64", "f32", 4), &err);
    if (!g_m || !g_m2) return -1;
    uint64_t s = 11;
    for (int i = 0; i < N_SEQ; i++) g_seq[i] = (int32_t)(tu_rand(&s) % (uint64_t)g_m->hp.n_vocab);
    g_ref16 = malloc((size_t)(N_SEQ * V()) * sizeof(float));
    g_ref32 = malloc((size_t)(N_SEQ * V()) * sizeof(float));
    if (!g_ref16 || !g_ref32) return -1;
    model_ctx_t *c = tu_ctx_new(g_m, 1, N_CTX, 0, false);
    tu_eval_ok(c, g_seq, N_SEQ, g_ref16);
    model_ctx_free(c);
    c = tu_ctx_new(g_m, 1, N_CTX, 0, true);
    tu_eval_ok(c, g_seq, N_SEQ, g_ref32);
    model_ctx_free(c);
    snprintf(g_dir, sizeof g_dir, "/tmp/tern_session_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    tern_log_set(count_log, NULL);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) return -1;
    free(g_ref16);
    free(g_ref32);
    model_free(g_m);
    model_free(g_m2);
    tern_log_set(NULL, NULL);
    return 0;
}

static const char *tmp_path(const char *name) {
    static char buf[4][160];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 160, "%s/%s", g_dir, name);
    return p;
}

static session_t *open_ok(const char *path, const model_t *m, int kv_type) {
    session_fp_t fp;
    session_fingerprint(m, kv_type, &fp);
    tern_error_t err = {0};
    session_t *s = session_open(path, &fp, &err);
    if (!s) print_message("%s\n", err.msg);
    assert_non_null(s);
    return s;
}

/* KV rows of positions [0, n) of sequence sa of a and sb of b equal, every
 * layer (read out of their blocks with kv_seq_get_raw). */
static void assert_seq_kv_equal(const model_ctx_t *a, int sa, const model_ctx_t *b, int sb, int64_t n) {
    const kv_cache_t *ka = model_ctx_kv_const(a), *kb = model_ctx_kv_const(b);
    assert_true(kv_seq_n_pos(ka, sa) >= n && kv_seq_n_pos(kb, sb) >= n);
    const size_t bytes = (size_t)n * kv_cache_layout(ka)->pos_bytes;
    assert_int_equal(kv_cache_layout(kb)->pos_bytes, kv_cache_layout(ka)->pos_bytes);
    unsigned char *buf = malloc(4 * bytes + 1);
    assert_non_null(buf);
    for (int64_t l = 0; l < kv_cache_layout(ka)->n_layer; l++) {
        kv_seq_get_raw(ka, sa, l, 0, n, buf, buf + bytes);
        kv_seq_get_raw(kb, sb, l, 0, n, buf + 2 * bytes, buf + 3 * bytes);
        if (bytes) assert_memory_equal(buf, buf + 2 * bytes, 2 * bytes);
    }
    free(buf);
}

static void assert_kv_equal(const model_ctx_t *a, const model_ctx_t *b, int64_t n) {
    assert_seq_kv_equal(a, 0, b, 0, n);
}

/* Evaluate g_seq[from .. to) one token at a time in c (which holds from
 * positions) and check each position's logits against the uninterrupted
 * reference, bit for bit. */
static int continue_matches(model_ctx_t *c, int64_t from, int64_t to) {
    const float *ref = kv_cache_layout(model_ctx_kv_const(c))->type == TYPE_F32 ? g_ref32 : g_ref16;
    for (int64_t p = from; p < to; p++) {
        tern_error_t err = {0};
        if (model_eval(c, &g_seq[p], 1, NULL, &err)) return 0;
        if (memcmp(model_ctx_logits(c), ref + p * V(), (size_t)V() * sizeof(float)) != 0) return 0;
    }
    return 1;
}

/* A session of turns of the given sizes over g_seq, written from one context. */
static void write_session(const char *path, const int *turns, int n_turns, int kv_type) {
    unlink(path);
    session_t *s = open_ok(path, g_m, kv_type);
    model_ctx_t *c = tu_ctx_new(g_m, 1, N_CTX, 0, kv_type == TYPE_F32);
    int64_t p = 0;
    for (int i = 0; i < n_turns; i++) {
        tu_eval_ok(c, g_seq + p, turns[i], NULL);
        tern_error_t err = {0};
        assert_int_equal(session_append(s, c, 0, g_seq + p, turns[i], &err), 0);
        p += turns[i];
        assert_int_equal(session_n_tokens(s), p);
    }
    assert_int_equal(session_n_turns(s), n_turns);
    model_ctx_free(c);
    session_close(s);
}

/* ---- save, restore, continue ------------------------------------------------ */

static void roundtrip(int kv_type) {
    const char *path = tmp_path(kv_type == TYPE_F32 ? "rt32.tses" : "rt16.tses");
    const int turns[] = {9, 1, 6, 4};
    write_session(path, turns, 4, kv_type);
    /* The uninterrupted context the file came from. */
    model_ctx_t *a = tu_ctx_new(g_m, 1, N_CTX, 0, kv_type == TYPE_F32);
    tu_eval_ok(a, g_seq, 20, NULL);

    session_t *s = open_ok(path, g_m, kv_type);
    assert_int_equal(session_n_tokens(s), 20);
    assert_int_equal(session_n_turns(s), 4);
    assert_int_equal(session_cut_bytes(s), 0);
    assert_memory_equal(session_tokens(s), g_seq, 20 * sizeof(int32_t));

    /* Fresh context: all 20 positions, then 10 more tokens bit-identical. */
    model_ctx_t *b = tu_ctx_new(g_m, 2, N_CTX, 0, kv_type == TYPE_F32);
    tu_eval_ok(b, g_seq, 3, NULL); /* restore empties whatever was there */
    tern_error_t err = {0};
    assert_int_equal(session_restore(s, b, 0, 20, &err), 0);
    assert_int_equal(model_ctx_pos(b), 20);
    assert_kv_equal(a, b, 20);
    assert_true(continue_matches(b, 20, 30));

    /* Longest-prefix restore: a prefix ending inside a turn. */
    assert_int_equal(session_restore(s, b, 0, 12, &err), 0);
    assert_int_equal(model_ctx_pos(b), 12);
    assert_kv_equal(a, b, 12);
    assert_true(continue_matches(b, 12, 24));
    assert_int_equal(session_restore(s, b, 0, 0, &err), 0);
    assert_int_equal(model_ctx_pos(b), 0);
    assert_int_not_equal(session_restore(s, b, 0, 21, &err), 0);
    assert_int_equal(model_ctx_pos(b), 0);
    session_close(s);

    /* Another process: a forked child restores and continues, reports. */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        session_fp_t fp;
        session_fingerprint(g_m, kv_type, &fp);
        session_t *cs = session_open(path, &fp, NULL);
        model_ctx_params_t mp = model_ctx_default_params();
        mp.n_threads = 1;
        mp.n_ctx = N_CTX;
        mp.kv_f32 = kv_type == TYPE_F32;
        model_ctx_t *cc = cs ? model_ctx_new(g_m, &mp, NULL, 0, NULL) : NULL;
        char ok = cc && session_restore(cs, cc, 0, 19, NULL) == 0 && continue_matches(cc, 19, 30) ? 'y' : 'n';
        if (write(fds[1], &ok, 1) != 1) _exit(3);
        _exit(0);
    }
    close(fds[1]);
    char ok = 0;
    assert_int_equal(read(fds[0], &ok, 1), 1);
    close(fds[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(ok, 'y');
    model_ctx_free(a);
    model_ctx_free(b);
}
static void test_roundtrip_f16(void **state) {
    (void)state;
    roundtrip(TYPE_F16);
}
static void test_roundtrip_f32(void **state) {
    (void)state;
    roundtrip(TYPE_F32);
}

/* Appending more turns after reopening; truncating to a turn boundary. */
static void test_reopen_append_truncate(void **state) {
    (void)state;
    const char *path = tmp_path("reopen.tses");
    const int turns[] = {5, 3};
    write_session(path, turns, 2, TYPE_F16);
    session_t *s = open_ok(path, g_m, TYPE_F16);
    model_ctx_t *c = tu_ctx_new(g_m, 1, N_CTX, 0, false);
    tern_error_t err = {0};
    assert_int_equal(session_restore(s, c, 0, 8, &err), 0);
    tu_eval_ok(c, g_seq + 8, 4, NULL);
    assert_int_equal(session_append(s, c, 0, g_seq + 8, 4, &err), 0);
    /* Appending positions the context does not hold is refused. */
    assert_int_equal(session_append(s, c, 0, g_seq + 12, 1, &err), TERN_EINVAL);
    session_close(s);
    s = open_ok(path, g_m, TYPE_F16);
    assert_int_equal(session_n_turns(s), 3);
    assert_int_equal(session_n_tokens(s), 12);
    /* Cut to position 10: the turn ending at 12 goes, 8 remain. */
    assert_int_equal(session_truncate(s, 10, &err), 0);
    assert_int_equal(session_n_tokens(s), 8);
    assert_int_equal(session_n_turns(s), 2);
    session_close(s);
    s = open_ok(path, g_m, TYPE_F16);
    assert_int_equal(session_n_tokens(s), 8);
    assert_int_equal(session_restore(s, c, 0, 8, &err), 0);
    assert_true(continue_matches(c, 8, 16));
    session_close(s);
    model_ctx_free(c);
}

/* ---- sequences of a shared KV memory ------------------------------------------ */

/* Restore into sequence 1 of a memory where sequences 0 and 2 share blocks
 * (KV blocks of 7: the fork ends inside one); continue 1 and 2 in one
 * batch; append from sequence 1 to another file; a memory without the
 * blocks refuses (TERN_EKVFULL) and leaves the other sequences alone. */
static void test_shared_memory(void **state) {
    (void)state;
    const char *path = tmp_path("shared.tses"), *path2 = tmp_path("shared2.tses");
    const int turns[] = {9, 1, 6, 4};
    write_session(path, turns, 4, TYPE_F16);
    model_ctx_t *a = tu_ctx_new(g_m, 1, N_CTX, 0, false);
    tu_eval_ok(a, g_seq, 20, NULL);

    model_ctx_params_t mp = model_ctx_default_params();
    mp.n_threads = 2;
    mp.n_ctx = N_CTX;
    mp.n_seq = 3;
    mp.kv_block = 7;
    tern_error_t err = {0};
    model_ctx_t *c = model_ctx_new(g_m, &mp, NULL, 0, &err);
    assert_non_null(c);
    kv_cache_t *kv = model_ctx_kv(c);
    tu_eval_ok(c, g_seq, 10, NULL); /* sequence 0 */
    assert_int_equal(kv_seq_fork(kv, 2, 0, 10, &err), 0);
    tu_eval_ok(c, g_seq + 10, 1, NULL); /* 0 copies its shared block, 2 keeps it */
    kv_stats_t st;
    kv_cache_stats(kv, &st);
    assert_int_equal(st.n_shared, 1);

    session_t *s = open_ok(path, g_m, TYPE_F16);
    assert_int_equal(session_restore(s, c, 1, 20, &err), 0);
    assert_int_equal(kv_seq_n_pos(kv, 1), 20);
    assert_int_equal(kv_seq_n_blocks(kv, 1), 3);
    assert_memory_equal(kv_seq_ids(kv, 1), g_seq, 20 * sizeof(int32_t));
    assert_seq_kv_equal(a, 0, c, 1, 20);
    assert_seq_kv_equal(a, 0, c, 0, 11);
    assert_seq_kv_equal(a, 0, c, 2, 10);
    kv_cache_stats(kv, &st);
    assert_int_equal(st.n_used, 2 + 1 + 3);
    assert_int_equal(st.n_shared, 1);

    /* Sequences 1 and 2 continue in one batch, each bit-identical to the
     * uninterrupted reference. */
    for (int k = 0; k < 6; k++) {
        const model_tok_t toks[2] = {{1, g_seq[20 + k], MODEL_POS_APPEND, true},
                                     {2, g_seq[10 + k], MODEL_POS_APPEND, true}};
        assert_int_equal(model_decode(c, toks, 2, &err), 0);
        assert_memory_equal(model_ctx_out(c, 0), g_ref16 + (20 + k) * V(), (size_t)V() * sizeof(float));
        assert_memory_equal(model_ctx_out(c, 1), g_ref16 + (10 + k) * V(), (size_t)V() * sizeof(float));
    }
    assert_seq_kv_equal(a, 0, c, 0, 11);

    /* Sequence 1's 26 positions appended to a new file, restored elsewhere. */
    unlink(path2);
    session_t *s2 = open_ok(path2, g_m, TYPE_F16);
    assert_int_equal(session_append(s2, c, 1, g_seq, 26, &err), 0);
    assert_int_equal(session_append(s2, c, 1, g_seq + 26, 1, &err), TERN_EINVAL); /* not held */
    session_close(s2);
    s2 = open_ok(path2, g_m, TYPE_F16);
    assert_int_equal(session_n_tokens(s2), 26);
    model_ctx_t *d = tu_ctx_new(g_m, 1, N_CTX, 0, false);
    assert_int_equal(session_restore(s2, d, 0, 26, &err), 0);
    assert_seq_kv_equal(c, 1, d, 0, 26);
    assert_true(continue_matches(d, 26, 30));
    session_close(s2);

    /* No such sequence. */
    assert_int_equal(session_restore(s, c, 3, 4, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "no sequence 3"));
    assert_int_equal(session_append(s, c, -1, g_seq, 1, &err), TERN_EINVAL);

    /* Too few blocks: 3 blocks of 7, sequence 0 holds 2 of them. */
    mp.n_ctx = 21;
    mp.n_seq = 2;
    model_ctx_t *small = model_ctx_new(g_m, &mp, NULL, 0, &err);
    assert_non_null(small);
    tu_eval_ok(small, g_seq, 10, NULL);
    assert_int_equal(session_restore(s, small, 1, 20, &err), TERN_EKVFULL);
    assert_int_equal(kv_seq_n_pos(model_ctx_kv(small), 1), 0);
    assert_int_equal(kv_seq_n_pos(model_ctx_kv(small), 0), 10);
    assert_seq_kv_equal(a, 0, small, 0, 10);
    kv_cache_stats(model_ctx_kv(small), &st);
    assert_int_equal(st.n_used, 2);
    assert_int_equal(session_restore(s, small, 1, 7, &err), 0);
    assert_seq_kv_equal(a, 0, small, 1, 7);
    session_close(s);
    model_ctx_free(small);
    model_ctx_free(d);
    model_ctx_free(c);
    model_ctx_free(a);
}

/* ---- refusals ----------------------------------------------------------------- */

static void test_wrong_model_and_kv_type(void **state) {
    (void)state;
    const char *path = tmp_path("wrong.tses");
    const int turns[] = {4};
    write_session(path, turns, 1, TYPE_F16);
    session_fp_t fp;
    tern_error_t err = {0};
    session_fingerprint(g_m2, TYPE_F16, &fp);
    assert_null(session_open(path, &fp, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    assert_non_null(strstr(err.msg, "another model"));
    session_fingerprint(g_m, TYPE_F32, &fp);
    assert_null(session_open(path, &fp, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    assert_non_null(strstr(err.msg, "KV cache"));
    /* A context of the other KV type is refused by restore and append. */
    session_t *s = open_ok(path, g_m, TYPE_F16);
    model_ctx_t *c = tu_ctx_new(g_m, 1, N_CTX, 0, true);
    assert_int_equal(session_restore(s, c, 0, 4, &err), TERN_EINVAL);
    tu_eval_ok(c, g_seq, 5, NULL);
    assert_int_equal(session_append(s, c, 0, g_seq, 5, &err), TERN_EINVAL);
    session_close(s);
    model_ctx_free(c);
    /* Not a session file at all. */
    const char *junk = tmp_path("junk.tses");
    FILE *f = fopen(junk, "wb");
    assert_non_null(f);
    for (int i = 0; i < 100; i++) fputc('x', f);
    fclose(f);
    session_fingerprint(g_m, TYPE_F16, &fp);
    assert_null(session_open(junk, &fp, &err));
    assert_int_equal(err.code, TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "not a tern session file"));
}

/* ---- damage -------------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len) {
    char *d = tu_read_file(path, len);
    assert_non_null(d);
    return d;
}

static void write_all(const char *path, const void *d, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(d, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Open path; when it opens, its turns are a prefix of the original's
 * (ends[] = the original's turn ends), every token matches, and the KV rows
 * restore and continue bit-identically. Returns the turns loaded, -1 when
 * refused (the message must say something). */
static int check_damaged(const char *path, const int64_t *ends, int n_ends, model_ctx_t *c, int deep) {
    session_fp_t fp;
    session_fingerprint(g_m, TYPE_F16, &fp);
    tern_error_t err = {0};
    session_t *s = session_open(path, &fp, &err);
    if (!s) {
        assert_true(err.code != 0 && err.msg[0]);
        return -1;
    }
    const int64_t k = session_n_turns(s);
    assert_true(k <= n_ends);
    assert_int_equal(session_n_tokens(s), k ? ends[k - 1] : 0);
    assert_memory_equal(session_tokens(s), g_seq, (size_t)session_n_tokens(s) * sizeof(int32_t));
    if (deep && k) {
        assert_int_equal(session_restore(s, c, 0, session_n_tokens(s) - 1, &err), 0);
        assert_true(continue_matches(c, session_n_tokens(s) - 1, session_n_tokens(s) + 1));
    }
    session_close(s);
    return (int)k;
}

static void test_truncate_every_byte(void **state) {
    (void)state;
    const char *path = tmp_path("trunc.tses"), *cut = tmp_path("trunc_cut.tses");
    const int turns[] = {2, 1, 3};
    const int64_t ends[] = {2, 3, 6};
    write_session(path, turns, 3, TYPE_F16);
    size_t len;
    char *orig = read_all(path, &len);
    /* 48-byte header, then records of 32 + n * (4 + K and V rows of every layer) bytes. */
    const int64_t per_pos = 4 + 2 * g_m->hp.n_layer * g_m->hp.n_head_kv * g_m->hp.head_dim * 2;
    int64_t bounds[4] = {48, 0, 0, 0};
    for (int i = 0; i < 3; i++) bounds[i + 1] = bounds[i] + 32 + turns[i] * per_pos;
    model_ctx_t *c = tu_ctx_new(g_m, 1, N_CTX, 0, false);
    assert_int_equal(bounds[3], (int64_t)len);
    for (size_t n = 0; n <= len; n++) {
        write_all(cut, orig, n);
        g_warns = 0;
        int k = check_damaged(cut, ends, 3, c, n % 7 == 0);
        if (n < 48) {
            assert_int_equal(k, -1);
            continue;
        }
        int want = 0;
        while (want < 3 && bounds[want + 1] <= (int64_t)n) want++;
        assert_int_equal(k, want);
        /* A cut that is not at a record boundary is reported and removed. */
        assert_int_equal(g_warns, (int64_t)n == bounds[want] ? 0 : 1);
        struct stat st;
        assert_int_equal(stat(cut, &st), 0);
        assert_int_equal(st.st_size, bounds[want]);
    }
    model_ctx_free(c);
    free(orig);
}

static void test_random_corruption(void **state) {
    (void)state;
    const char *path = tmp_path("corrupt.tses"), *bad = tmp_path("corrupt_bad.tses");
    const int turns[] = {3, 2, 4};
    const int64_t ends[] = {3, 5, 9};
    write_session(path, turns, 3, TYPE_F16);
    size_t len;
    char *orig = read_all(path, &len);
    char *buf = malloc(len);
    assert_non_null(buf);
    model_ctx_t *c = tu_ctx_new(g_m, 1, N_CTX, 0, false);
    uint64_t rng = 99;
    const int iters = tu_quick() ? 150 : 600;
    int refused = 0, shorter = 0;
    for (int it = 0; it < iters; it++) {
        memcpy(buf, orig, len);
        const int flips = 1 + (int)(tu_rand(&rng) % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)(tu_rand(&rng) % len);
            unsigned char x = (unsigned char)(1 + tu_rand(&rng) % 255);
            buf[at] = (char)((unsigned char)buf[at] ^ x);
        }
        write_all(bad, buf, len);
        int k = check_damaged(bad, ends, 3, c, it % 5 == 0);
        refused += k < 0;
        shorter += k >= 0 && k < 3;
    }
    /* Damage was seen: some files refused (header), most cut short. */
    assert_true(refused > 0 && shorter > 0);
    model_ctx_free(c);
    free(buf);
    free(orig);
}

/* ---- kill -9 while appending ----------------------------------------------------- */

/* Turn i of the kill loop has 1 + i % 3 positions. */
static int64_t turn_end(int64_t i) {
    int64_t p = 0;
    for (int64_t j = 0; j <= i; j++) p += 1 + j % 3;
    return p;
}

/* The child: continue the session at path (restore what it holds), then
 * append turns of g_seq until killed or the sequence ends, writing the count
 * of committed turns to fd after each append returns. */
static _Noreturn void appender(const char *path, int fd) {
    session_fp_t fp;
    session_fingerprint(g_m, TYPE_F16, &fp);
    session_t *s = session_open(path, &fp, NULL);
    if (!s) _exit(2);
    model_ctx_params_t mp = model_ctx_default_params();
    mp.n_threads = 1;
    mp.n_ctx = N_CTX;
    model_ctx_t *c = model_ctx_new(g_m, &mp, NULL, 0, NULL);
    if (!c || session_restore(s, c, 0, session_n_tokens(s), NULL)) _exit(2);
    for (int64_t i = session_n_turns(s);; i++) {
        int64_t p0 = session_n_tokens(s), p1 = turn_end(i);
        if (p1 > N_SEQ) break;
        if (model_eval(c, g_seq + p0, p1 - p0, NULL, NULL)) _exit(2);
        if (session_append(s, c, 0, g_seq + p0, p1 - p0, NULL)) _exit(2);
        int32_t k = (int32_t)session_n_turns(s);
        if (write(fd, &k, sizeof k) != (ssize_t)sizeof k) _exit(2);
    }
    _exit(0);
}

static void test_kill9_while_appending(void **state) {
    (void)state;
    const char *path = tmp_path("kill.tses");
    unlink(path);
    uint64_t rng = 2026;
    const int max_iter = tu_quick() ? 10 : 30;
    const uint64_t t_end = tern_now_ns() + (tu_quick() ? 1500000000ull : 3000000000ull);
    model_ctx_t *c = tu_ctx_new(g_m, 1, N_CTX, 0, false);
    int iters = 0, killed_mid = 0, torn = 0;
    for (; iters < max_iter && tern_now_ns() < t_end; iters++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            appender(path, fds[1]);
        }
        close(fds[1]);
        struct timespec ts = {0, (long)(200000 + tu_rand(&rng) % 15000000)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (WIFEXITED(st)) assert_int_equal(WEXITSTATUS(st), 0); /* finished: the sequence is complete */
        else killed_mid++;
        int32_t k, committed = 0;
        while (read(fds[0], &k, sizeof k) == (ssize_t)sizeof k) committed = k;
        close(fds[0]);
        /* The file loads, holds at least every turn the child saw committed,
         * each one intact, and continues bit-identically. */
        session_t *s = open_ok(path, g_m, TYPE_F16);
        const int64_t turns = session_n_turns(s), n = session_n_tokens(s);
        torn += session_cut_bytes(s) > 0;
        assert_true(turns >= committed);
        assert_int_equal(n, turns ? turn_end(turns - 1) : 0);
        assert_memory_equal(session_tokens(s), g_seq, (size_t)n * sizeof(int32_t));
        if (n > 0) {
            tern_error_t err = {0};
            assert_int_equal(session_restore(s, c, 0, n - 1, &err), 0);
            assert_true(continue_matches(c, n - 1, n < N_SEQ ? n + 1 : n));
        }
        session_close(s);
        if (n + 3 > N_SEQ) unlink(path); /* full: start over */
    }
    print_message("kill -9 loop: %d iterations, %d killed while appending, %d torn tails cut\n", iters, killed_mid,
                  torn);
    assert_true(iters > 0);
    assert_true(killed_mid > 0);
    model_ctx_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_f16),
        cmocka_unit_test(test_roundtrip_f32),
        cmocka_unit_test(test_reopen_append_truncate),
        cmocka_unit_test(test_shared_memory),
        cmocka_unit_test(test_wrong_model_and_kv_type),
        cmocka_unit_test(test_truncate_every_byte),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_kill9_while_appending),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
