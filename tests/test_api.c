/* test_api.c - the public API (tern.h only) on stories260K: why
 * tern_generate stops (length, end of generation, callback, full context,
 * error), TERN_ECTXFULL and TERN_EABORTED from tern_eval, dispatch counts per
 * pool and per context, the log callback, the thread-count clamp, a sampler
 * rollback with the state blob (as speculative decoding will do it), and two
 * threads generating on one const model at once. */
// ctest-label: concurrent
#define _GNU_SOURCE
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tern.h"

#define MODEL "models/stories260K.gguf"

static tern_model_t *load(const char *path) {
    tern_error_t err = {0};
    tern_model_t *m = tern_model_load(path, &err);
    if (!m) print_message("tern_model_load: %s\n", err.msg);
    assert_non_null(m);
    return m;
}

static tern_context_t *ctx(const tern_model_t *m, int32_t threads, int32_t n_ctx, int32_t n_batch) {
    tern_error_t err = {0};
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = threads;
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    tern_context_t *c = tern_context_create(m, &cp, &err);
    if (!c) print_message("tern_context_create: %s\n", err.msg);
    assert_non_null(c);
    return c;
}

static tern_sampler_t *greedy(const tern_model_t *m) {
    tern_error_t err = {0};
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.temp = 0;
    tern_sampler_t *s = tern_sampler_create(m, &sp, &err);
    assert_non_null(s);
    return s;
}

/* "Once upon a time" with BOS: 5 tokens. */
static int32_t *prompt(const tern_model_t *m, size_t *n) {
    tern_error_t err = {0};
    int32_t *ids = NULL;
    const char *p = "Once upon a time";
    assert_int_equal(tern_tokenize(m, p, strlen(p), 1, 0, &ids, n, &err), 0);
    assert_int_equal(*n, 5);
    return ids;
}

typedef struct {
    int n;         /* ids reported (>= 0) */
    int stop_at;   /* return nonzero at this many (0: never) */
    int32_t last;  /* last id >= 0 */
    int flushes;   /* id -1 calls */
    int32_t ids[256];
} cb_state;

static int on_token(int32_t id, const char *text, size_t len, void *user) {
    cb_state *s = user;
    (void)text;
    (void)len;
    if (id < 0) {
        s->flushes++;
        return 0;
    }
    if (s->n < 256) s->ids[s->n] = id;
    s->n++;
    s->last = id;
    return s->stop_at && s->n >= s->stop_at;
}

/* ---- stop reasons -------------------------------------------------------- */

static void test_stop_reasons(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    const tern_model_t *cm = m; /* contexts only read the model */
    size_t n = 0;
    int32_t *ids = prompt(m, &n);
    tern_error_t err = {0};
    tern_generate_result_t r;

    /* length */
    tern_context_t *c = ctx(cm, 1, 64, 0);
    tern_sampler_t *s = greedy(m);
    cb_state cb = {0};
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 8, on_token, &cb, &r, &err), 0);
    assert_int_equal(r.stop, TERN_STOP_LENGTH);
    assert_int_equal(r.n_generated, 8);
    assert_int_equal(cb.n, 8);
    assert_int_equal(tern_context_pos(c), 5 + 8);
    /* n_predict 0: nothing generated, still "length" */
    assert_int_equal(tern_generate(c, s, NULL, 0, 0, on_token, &cb, &r, &err), 0);
    assert_int_equal(r.stop, TERN_STOP_LENGTH);
    assert_int_equal(r.n_generated, 0);

    /* callback: its token is evaluated */
    tern_context_truncate(c, 0, NULL);
    tern_sampler_reset(s);
    cb = (cb_state){0};
    cb.stop_at = 3;
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 50, on_token, &cb, &r, &err), 0);
    assert_int_equal(r.stop, TERN_STOP_CALLBACK);
    assert_int_equal(r.n_generated, 3);
    assert_int_equal(tern_context_pos(c), 5 + 3);

    /* end of generation: a logit bias makes EOS the greedy choice; it is
     * reported, not evaluated */
    const int32_t eos = tern_token_eos(m);
    assert_true(eos >= 0);
    tern_logit_bias_t b = {eos, 1000.0f};
    assert_int_equal(tern_sampler_set_logit_bias(s, &b, 1, &err), 0);
    tern_context_truncate(c, 0, NULL);
    cb = (cb_state){0};
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 50, on_token, &cb, &r, &err), 0);
    assert_int_equal(r.stop, TERN_STOP_EOG);
    assert_int_equal(r.n_generated, 1);
    assert_int_equal(cb.last, eos);
    assert_int_equal(tern_context_pos(c), 5);

    assert_int_equal(tern_sampler_set_logit_bias(s, NULL, 0, &err), 0);
    tern_context_free(c);

    /* context full: 16 positions, 5 of prompt; 11 tokens evaluated and a
     * 12th reported that did not fit */
    c = ctx(cm, 1, 16, 0);
    assert_int_equal(tern_context_n_ctx(c), 16);
    tern_sampler_reset(s);
    cb = (cb_state){0};
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 100, on_token, &cb, &r, &err), 0);
    assert_int_equal(r.stop, TERN_STOP_CTX_FULL);
    assert_int_equal(r.n_generated, 12);
    assert_int_equal(tern_context_pos(c), 16);
    /* continuing a full context: the first token reported does not fit */
    assert_int_equal(tern_generate(c, s, NULL, 0, 100, on_token, &cb, &r, &err), 0);
    assert_int_equal(r.stop, TERN_STOP_CTX_FULL);
    assert_int_equal(r.n_generated, 1);
    tern_context_free(c);

    /* a prompt longer than the context: an error, with its own code */
    c = ctx(cm, 1, 4, 0);
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 10, on_token, &cb, &r, &err), TERN_ECTXFULL);
    assert_int_equal(r.stop, TERN_STOP_ERROR);
    assert_int_equal(r.n_generated, 0);
    assert_int_equal(tern_context_pos(c), 0);
    /* NULL result is fine */
    assert_int_equal(tern_generate(c, s, ids, 2, 1, NULL, NULL, NULL, &err), 0);
    tern_context_free(c);

    assert_string_equal(tern_stop_reason_name(TERN_STOP_LENGTH), "length");
    assert_string_equal(tern_stop_reason_name(TERN_STOP_EOG), "eog");
    assert_string_equal(tern_stop_reason_name(TERN_STOP_CALLBACK), "callback");
    assert_string_equal(tern_stop_reason_name(TERN_STOP_CTX_FULL), "context full");
    assert_string_equal(tern_stop_reason_name(TERN_STOP_ERROR), "error");
    free(ids);
    tern_sampler_free(s);
    tern_model_free(m);
}

static int ban_all(void *user, tern_token_logit_t *cand, int32_t n) {
    (void)user;
    for (int32_t i = 0; i < n; i++) cand[i].logit = -INFINITY;
    return 0;
}

/* A mask that allows no token makes tern_generate fail (the prompt stays
 * evaluated; nothing reported). */
static void test_generate_mask_error(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    size_t n = 0;
    int32_t *ids = prompt(m, &n);
    tern_context_t *c = ctx(m, 1, 64, 0);
    tern_sampler_t *s = greedy(m);
    tern_sampler_set_mask(s, ban_all, NULL);
    tern_error_t err = {0};
    tern_generate_result_t r;
    cb_state cb = {0};
    assert_int_equal(tern_generate(c, s, ids, (int32_t)n, 8, on_token, &cb, &r, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "no token"));
    assert_int_equal(r.stop, TERN_STOP_ERROR);
    assert_int_equal(cb.n, 0);
    assert_int_equal(tern_context_pos(c), 5);
    assert_int_equal(tern_sampler_sample(s, tern_get_logits(c)), -1);
    free(ids);
    tern_sampler_free(s);
    tern_context_free(c);
    tern_model_free(m);
}

/* ---- tern_eval's codes ------------------------------------------------------ */

static int abort_after(void *user) {
    int *calls = user;
    return ++*calls >= 1;
}
static int never(void *user) {
    int *calls = user;
    ++*calls;
    return 0;
}

static void test_eval_codes(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    tern_error_t err = {0};
    const int32_t ids[9] = {1, 403, 407, 261, 378, 403, 407, 261, 378};
    tern_context_t *c = ctx(m, 1, 8, 2);
    assert_int_equal(tern_eval(c, ids, 9, NULL, &err), TERN_ECTXFULL);
    assert_int_equal(err.code, TERN_ECTXFULL);
    assert_int_equal(tern_context_pos(c), 0);
    /* the abort callback between blocks of 2: the first block stays */
    int calls = 0;
    tern_context_set_abort(c, abort_after, &calls);
    assert_int_equal(tern_eval(c, ids, 6, NULL, &err), TERN_EABORTED);
    assert_int_equal(err.code, TERN_EABORTED);
    assert_int_equal(calls, 1);
    assert_int_equal(tern_context_pos(c), 2);
    /* a callback that lets it run: called between the 3 blocks */
    calls = 0;
    tern_context_set_abort(c, never, &calls);
    assert_int_equal(tern_eval(c, ids + 2, 6, NULL, &err), 0);
    assert_int_equal(calls, 2);
    assert_int_equal(tern_context_pos(c), 8);
    assert_int_equal(tern_eval(c, ids, 1, NULL, &err), TERN_ECTXFULL);
    assert_int_equal(tern_context_pos(c), 8);
    /* a bad id stays TERN_EINVAL */
    tern_context_truncate(c, 0, NULL);
    const int32_t bad = tern_model_n_vocab(m);
    assert_int_equal(tern_eval(c, &bad, 1, NULL, &err), TERN_EINVAL);
    tern_context_set_abort(c, NULL, NULL);
    tern_context_free(c);
    tern_model_free(m);
}

/* ---- dispatch counts ------------------------------------------------------ */

static int nop_job(void *ctx, int64_t b, int64_t e, int worker) {
    (void)ctx;
    (void)b;
    (void)e;
    (void)worker;
    return 0;
}

static void test_pool_dispatches(void **state) {
    (void)state;
    tern_error_t err = {0};
    tern_pool_t *a = tern_pool_create(2, 0, &err), *b = tern_pool_create(2, 0, &err);
    assert_true(a && b);
    assert_int_equal(tern_pool_dispatches(a), 0);
    tern_range_t r = {nop_job, NULL, 64, 1, 0}; /* cost unknown: always dispatched */
    const uint64_t g0 = tern_pool_dispatch_count();
    for (int i = 0; i < 3; i++) assert_int_equal(tern_pool_run(a, &r, 1, &err), 0);
    assert_int_equal(tern_pool_dispatches(a), 3);
    assert_int_equal(tern_pool_dispatches(b), 0);
    assert_true(tern_pool_dispatch_count() - g0 >= 3); /* the process-wide count too */
    /* a gated run stays on the caller: not a dispatch */
    tern_pool_set_gate(a, 1 << 20);
    tern_range_t small = {nop_job, NULL, 2, 1, 1};
    assert_int_equal(tern_pool_run(a, &small, 1, &err), 0);
    assert_int_equal(tern_pool_dispatches(a), 3);
    assert_int_equal(tern_pool_dispatches(NULL), 0);
    tern_pool_free(a);
    tern_pool_free(b);
}

static void test_context_dispatches(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    size_t n = 0;
    int32_t *ids = prompt(m, &n);
    tern_error_t err = {0};
    tern_context_t *a = ctx(m, 2, 64, 0), *b = ctx(m, 2, 64, 0);
    tern_timings_t ta, tb;
    assert_int_equal(tern_eval(a, ids, (int32_t)n, NULL, &err), 0);
    assert_int_equal(tern_eval(a, ids, 1, NULL, &err), 0);
    tern_context_timings(a, &ta);
    tern_context_timings(b, &tb);
    assert_true(ta.prompt_dispatches > 0);
    assert_true(ta.gen_dispatches > 0);
    assert_int_equal(tb.prompt_dispatches + tb.gen_dispatches, 0);
    /* now b works; a's counters stay */
    assert_int_equal(tern_eval(b, ids, (int32_t)n, NULL, &err), 0);
    assert_int_equal(tern_eval(b, ids, 1, NULL, &err), 0);
    tern_timings_t ta2;
    tern_context_timings(a, &ta2);
    tern_context_timings(b, &tb);
    assert_true(ta2.prompt_dispatches == ta.prompt_dispatches && ta2.gen_dispatches == ta.gen_dispatches);
    /* same model, same work: the same count */
    assert_int_equal(tb.prompt_dispatches, ta.prompt_dispatches);
    assert_int_equal(tb.gen_dispatches, ta.gen_dispatches);
    tern_context_timings_reset(a);
    tern_context_timings(a, &ta);
    assert_int_equal(ta.prompt_dispatches + ta.gen_dispatches, 0);
    free(ids);
    tern_context_free(a);
    tern_context_free(b);
    tern_model_free(m);
}

/* ---- the log callback ------------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    int n_calls;
    int saw_spin; /* a warning naming TERN_POOL_SPIN and its bad value */
} log_rec;

static void on_log(tern_log_level_t level, const char *msg, void *user) {
    log_rec *r = user;
    pthread_mutex_lock(&r->mu);
    r->n_calls++;
    if (level == TERN_LOG_WARN && strstr(msg, "TERN_POOL_SPIN") && strstr(msg, "garbage")) r->saw_spin++;
    pthread_mutex_unlock(&r->mu);
}

static void test_log_callback(void **state) {
    (void)state;
    log_rec rec = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
    const char *old = getenv("TERN_POOL_SPIN");
    char *saved = old ? strdup(old) : NULL;
    tern_log_set(on_log, &rec);
    setenv("TERN_POOL_SPIN", "garbage", 1);
    tern_error_t err = {0};
    tern_pool_t *p = tern_pool_create(2, 0, &err);
    assert_non_null(p);
    tern_pool_free(p);
    tern_log_set(NULL, NULL);
    char *saved2 = saved ? strdup(saved) : NULL;
    if (saved) setenv("TERN_POOL_SPIN", saved, 1);
    else unsetenv("TERN_POOL_SPIN");
    free(saved);
    pthread_mutex_lock(&rec.mu);
    const int calls = rec.n_calls;
    assert_int_equal(rec.saw_spin, 1);
    pthread_mutex_unlock(&rec.mu);
    /* back to the default sink: our callback hears nothing more, even of
     * the same warning (which now goes to stderr) */
    setenv("TERN_POOL_SPIN", "garbage", 1);
    p = tern_pool_create(2, 0, &err);
    tern_pool_free(p);
    if (saved2) setenv("TERN_POOL_SPIN", saved2, 1);
    else unsetenv("TERN_POOL_SPIN");
    free(saved2);
    pthread_mutex_lock(&rec.mu);
    assert_int_equal(rec.n_calls, calls);
    pthread_mutex_unlock(&rec.mu);
}

/* ---- thread counts ------------------------------------------------------------- */

static int cpus_usable(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void test_thread_clamp(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    tern_error_t err = {0};
    const int cpus = cpus_usable();
    int max = 4 * cpus;
    if (max > TERN_POOL_MAX_THREADS) max = TERN_POOL_MAX_THREADS;
    /* 1 thread: nothing to say */
    tern_context_t *c = ctx(m, 1, 64, 0);
    assert_int_equal(tern_context_threads(c), 1);
    assert_string_equal(tern_context_note(c), "");
    /* far too many: clamped, with a note */
    assert_int_equal(tern_context_set_threads(c, 999999, &err), 0);
    assert_int_equal(tern_context_threads(c), max);
    assert_non_null(strstr(tern_context_note(c), "clamped"));
    /* back to 1: the note goes */
    assert_int_equal(tern_context_set_threads(c, 1, &err), 0);
    assert_string_equal(tern_context_note(c), "");
    tern_context_free(c);
    c = ctx(m, max + 1, 64, 0);
    assert_int_equal(tern_context_threads(c), max);
    print_message("note: %s\n", tern_context_note(c));
    assert_non_null(strstr(tern_context_note(c), "clamped"));
    tern_context_free(c);
    /* one more than the CPUs: allowed, noted */
    c = ctx(m, cpus + 1, 64, 0);
    assert_int_equal(tern_context_threads(c), cpus + 1);
    assert_non_null(strstr(tern_context_note(c), "oversubscribed"));
    /* and it still computes: a token */
    const int32_t bos = 1;
    assert_int_equal(tern_eval(c, &bos, 1, NULL, &err), 0);
    tern_context_free(c);
    tern_model_free(m);
}

/* ---- rollback with the sampler state -------------------------------------------- */

/* Sample, accept and evaluate k tokens from the context's logits (or from
 * first for the first one). */
static void step_k(tern_context_t *c, tern_sampler_t *s, const float *first, int k, int32_t *out) {
    tern_error_t err = {0};
    for (int i = 0; i < k; i++) {
        int32_t id = tern_sampler_sample(s, i == 0 && first ? first : tern_get_logits(c));
        assert_true(id >= 0);
        tern_sampler_accept(s, id);
        out[i] = id;
        assert_int_equal(tern_eval(c, &id, 1, NULL, &err), 0);
    }
}

static void test_sampler_rollback(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    size_t n = 0;
    int32_t *ids = prompt(m, &n);
    tern_error_t err = {0};
    tern_context_t *c = ctx(m, 1, 128, 0);
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.seed = 99;
    sp.repeat_penalty = 1.3f;
    sp.repeat_last_n = 8;
    tern_sampler_t *s = tern_sampler_create(m, &sp, &err);
    assert_non_null(s);
    assert_int_equal(tern_eval(c, ids, (int32_t)n, NULL, &err), 0);
    for (size_t i = 0; i < n; i++) tern_sampler_accept(s, ids[i]);
    int32_t pre[6], a[10], b[10];
    step_k(c, s, NULL, 6, pre);
    /* snapshot: sampler state, position, logits */
    size_t cap = tern_sampler_state_size(s);
    void *blob = malloc(cap);
    float *logits = malloc((size_t)tern_model_n_vocab(m) * sizeof *logits);
    assert_true(blob && logits);
    size_t len = tern_sampler_state_save(s, blob, cap);
    assert_true(len > 0 && len <= cap);
    const int32_t pos = tern_context_pos(c);
    memcpy(logits, tern_get_logits(c), (size_t)tern_model_n_vocab(m) * sizeof *logits);
    step_k(c, s, NULL, 10, a);
    /* roll back both and run again: the same tokens */
    assert_int_equal(tern_context_truncate(c, pos, &err), 0);
    assert_int_equal(tern_sampler_state_load(s, blob, len, &err), 0);
    step_k(c, s, logits, 10, b);
    assert_memory_equal(a, b, sizeof a);
    /* garbage is refused */
    memset(blob, 0xab, len);
    assert_int_equal(tern_sampler_state_load(s, blob, len, &err), TERN_EFORMAT);
    free(blob);
    free(logits);
    free(ids);
    tern_sampler_free(s);
    tern_context_free(c);
    tern_model_free(m);
}

/* ---- two threads, one model --------------------------------------------------- */

typedef struct {
    const tern_model_t *m;
    const int32_t *ids;
    int32_t n;
    cb_state out;
    int rc;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    tern_error_t err = {0};
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = 2;
    cp.n_ctx = 64;
    tern_context_t *c = tern_context_create(w->m, &cp, &err);
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.seed = 5;
    tern_sampler_t *s = tern_sampler_create(w->m, &sp, &err);
    tern_detok_t *d = tern_detok_create(w->m, &err);
    w->rc = -1;
    if (c && s && d) w->rc = tern_generate(c, s, w->ids, w->n, 24, on_token, &w->out, NULL, &err);
    tern_detok_free(d);
    tern_sampler_free(s);
    tern_context_free(c);
    return NULL;
}

static void test_two_threads_one_model(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    size_t n = 0;
    int32_t *ids = prompt(m, &n);
    worker_arg w[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].m = m;
        w[i].ids = ids;
        w[i].n = (int32_t)n;
        assert_int_equal(pthread_create(&t[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(w[0].rc, 0);
    assert_int_equal(w[1].rc, 0);
    assert_int_equal(w[0].out.n, 24);
    assert_int_equal(w[1].out.n, 24);
    assert_memory_equal(w[0].out.ids, w[1].out.ids, 24 * sizeof(int32_t));
    free(ids);
    tern_model_free(m);
}

/* Sessions through the public API: a run saved after 10 tokens continues in
 * a fresh context with the prompt restored but its last token, and gives
 * the uninterrupted run's tokens; appending extends the file by one turn; a
 * context that went another way rewrites the file past the common prefix. */
static void test_session_api(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, MODEL);
    tern_model_t *m = load(path);
    size_t n;
    int32_t *ids = prompt(m, &n);
    char file[64];
    snprintf(file, sizeof file, "/tmp/tern_test_api_%d.tses", (int)getpid());
    unlink(file);
    tern_error_t err = {0};

    tern_context_t *a = ctx(m, 1, 128, 0);
    tern_sampler_t *s = greedy(m);
    cb_state ref = {0};
    assert_int_equal(tern_generate(a, s, ids, (int32_t)n, 20, on_token, &ref, NULL, &err), 0);
    assert_int_equal(ref.n, 20);

    /* First run: nothing to restore; 10 tokens; saved. */
    tern_context_t *b = ctx(m, 1, 128, 0);
    tern_session_t *ses = tern_session_open(m, file, b, &err);
    assert_non_null(ses);
    assert_int_equal(tern_session_n_tokens(ses), 0);
    int32_t k = -1;
    assert_int_equal(tern_session_restore_prefix(ses, b, 0, ids, (int32_t)n, &k, &err), 0);
    assert_int_equal(k, 0);
    tern_sampler_reset(s);
    cb_state first = {0};
    assert_int_equal(tern_generate(b, s, ids, (int32_t)n, 10, on_token, &first, NULL, &err), 0);
    assert_int_equal(tern_session_append(ses, b, 0, &err), 0);
    assert_int_equal(tern_session_n_tokens(ses), (int32_t)n + 10);
    assert_int_equal(tern_session_n_turns(ses), 1);
    tern_session_close(ses);

    /* Second run, fresh context: the prompt but its last token comes from
     * the file; 20 tokens as the uninterrupted run gave them. */
    tern_context_t *c = ctx(m, 2, 128, 0);
    ses = tern_session_open(m, file, c, &err);
    assert_non_null(ses);
    assert_int_equal(tern_session_n_tokens(ses), (int32_t)n + 10);
    assert_memory_equal(tern_session_tokens(ses), ids, n * sizeof(int32_t));
    assert_memory_equal(tern_session_tokens(ses) + n, first.ids, 10 * sizeof(int32_t));
    assert_int_equal(tern_session_restore_prefix(ses, c, 0, ids, (int32_t)n, &k, &err), 0);
    assert_int_equal(k, (int32_t)n - 1);
    assert_int_equal(tern_context_pos(c), k);
    tern_sampler_reset(s);
    for (int32_t i = 0; i < k; i++) tern_sampler_accept(s, ids[i]);
    cb_state second = {0};
    assert_int_equal(tern_generate(c, s, ids + k, (int32_t)n - k, 20, on_token, &second, NULL, &err), 0);
    assert_int_equal(second.n, 20);
    assert_memory_equal(second.ids, ref.ids, 20 * sizeof(int32_t));
    tern_timings_t t;
    tern_context_timings(c, &t);
    assert_int_equal(t.n_prompt, 1); /* only the unrestored prompt token was evaluated */
    assert_int_equal(tern_session_append(ses, c, 0, &err), 0);
    assert_int_equal(tern_session_n_tokens(ses), (int32_t)n + 20);
    assert_int_equal(tern_session_n_turns(ses), 2); /* only the new positions were written */
    assert_int_equal(tern_session_append(ses, c, 0, &err), 0); /* nothing new */
    assert_int_equal(tern_session_n_turns(ses), 2);

    /* Another continuation from position n + 3: the file keeps what is
     * common (cut at a turn boundary) and takes the rest from d. */
    tern_context_t *d = ctx(m, 1, 128, 0);
    int32_t alt[16];
    memcpy(alt, ids, n * sizeof(int32_t));
    memcpy(alt + n, ref.ids, 3 * sizeof(int32_t));
    alt[n + 3] = (ref.ids[3] + 1) % tern_model_n_vocab(m);
    assert_int_equal(tern_session_restore_prefix(ses, d, 0, alt, (int32_t)n + 4, &k, &err), 0);
    assert_int_equal(k, (int32_t)n + 3);
    assert_int_equal(tern_eval(d, alt + k, 1, NULL, &err), 0);
    assert_int_equal(tern_session_append(ses, d, 0, &err), 0);
    assert_int_equal(tern_session_n_tokens(ses), (int32_t)n + 4);
    assert_memory_equal(tern_session_tokens(ses), alt, (n + 4) * sizeof(int32_t));
    tern_session_close(ses);

    /* A context with the other KV type is refused, naming the KV type. */
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = 1;
    cp.n_ctx = 64;
    cp.kv_f32 = 1;
    tern_context_t *e = tern_context_create(m, &cp, &err);
    assert_non_null(e);
    assert_null(tern_session_open(m, file, e, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    assert_non_null(strstr(err.msg, "KV cache"));
    tern_session_close(NULL);

    unlink(file);
    tern_context_free(e);
    tern_context_free(d);
    tern_context_free(c);
    tern_context_free(b);
    tern_context_free(a);
    tern_sampler_free(s);
    free(ids);
    tern_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_session_api),
        cmocka_unit_test(test_stop_reasons),     cmocka_unit_test(test_generate_mask_error),
        cmocka_unit_test(test_eval_codes),       cmocka_unit_test(test_pool_dispatches),
        cmocka_unit_test(test_context_dispatches), cmocka_unit_test(test_log_callback),
        cmocka_unit_test(test_thread_clamp),     cmocka_unit_test(test_sampler_rollback),
        cmocka_unit_test(test_two_threads_one_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
