/*
 * test_server_sched.c - the scheduler of `tern serve` (tools/server/sched.c)
 * without HTTP, on the trained stories260K model:
 *   - byte identity: 16 requests decoded together give exactly the text each
 *     gives alone (greedy and seeded sampling, different prompt lengths);
 *   - stop strings are cut and never returned, also across tokens;
 *   - prefix reuse: a request extending a finished conversation reports its
 *     prefix as cached and answers as a fresh evaluation would;
 *   - a full KV memory fails the newest request with a clear error, the
 *     others finish with their own bytes;
 *   - a released (disconnected) job frees its sequence, the rest go on;
 *   - queue limits answer 503;
 *   - session files: a new scheduler (a restarted server) restores the
 *     committed turns instead of evaluating them, with identical output.
 * The engine runs its own thread, hence the TSan label.
 */
// ctest-label: concurrent
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "srv.h"
#include "tern.h"

static tern_model_t *g_m;

static int setup(void **state) {
    (void)state;
    const char *p = tu_shared("models/stories260K.gguf");
    if (!p) return 0;
    tern_error_t err = {0};
    g_m = tern_model_load(p, &err);
    return g_m ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tern_model_free(g_m);
    return 0;
}

#define NEED_MODEL()                                                   \
    if (!g_m) {                                                        \
        tu_shared_missing("models/stories260K.gguf", "test");          \
        skip();                                                        \
    }

static const char *PROMPTS[] = {
    "Once upon a time",
    "The little dog",
    "Lily and Ben went to the park. They saw a big tree and",
    "Tom had a red ball.",
    "One day, a girl named Sue",
    "The sun was hot and the bird",
    "Mom said",
    "There was a cat who liked to play with yarn. Every day the cat",
    "A boy found a box",
    "The fish swam",
    "Tim and his friend",
    "It was a rainy day and",
    "The old man smiled",
    "Anna wanted a cookie, so she",
    "Far away, in a big forest,",
    "Max",
};
#define NP (int)(sizeof PROMPTS / sizeof *PROMPTS)

static srv_request_t *mkreq(const char *prompt, int32_t max_tokens, float temp, uint64_t seed) {
    srv_request_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->kind = SRV_KIND_COMPLETION;
    int32_t *ids = NULL;
    size_t n = 0;
    tern_error_t err = {0};
    assert_int_equal(tern_tokenize(g_m, prompt, strlen(prompt), tern_model_add_bos(g_m), 0, &ids, &n, &err), 0);
    r->prompt_ids = ids;
    r->n_prompt = (int32_t)n;
    r->samp = tern_sampler_default_params();
    r->samp.temp = temp;
    r->samp.seed = seed;
    r->max_tokens = max_tokens;
    return r;
}

typedef struct {
    char *text;
    size_t len;
    const char *finish;
    int status;
    char err[256];
    srv_usage_t usage;
} answer_t;

/* Read a job to its end (bounded: 120 s). */
static void collect(srv_job_t *j, answer_t *a) {
    memset(a, 0, sizeof *a);
    for (int spins = 0; spins < 1200; spins++) {
        srv_update_t u;
        if (!srv_job_next(j, 100, &u)) continue;
        if (u.len) {
            a->text = realloc(a->text, a->len + u.len + 1);
            assert_non_null(a->text);
            memcpy(a->text + a->len, u.text, u.len);
            a->len += u.len;
            a->text[a->len] = 0;
        }
        free(u.text);
        free(u.toks);
        if (u.done) {
            a->finish = u.finish;
            a->status = u.err_status;
            memcpy(a->err, u.err, sizeof a->err);
            a->usage = u.usage;
            srv_job_release(j);
            if (!a->text) a->text = calloc(1, 1);
            return;
        }
    }
    fail_msg("a job did not finish within 120 s");
}

static srv_sched_t *mksched(int parallel, int queue, int32_t n_ctx, int threads, const char *sessions) {
    srv_sched_opts_t o = {0};
    o.parallel = parallel;
    o.queue = queue;
    o.n_ctx = n_ctx;
    o.n_threads = threads;
    o.prefill_chunk = 16; /* small: prompts span several ticks */
    o.kv_block = 16;
    o.cache_seqs = 4;
    o.sessions_dir = sessions;
    tern_error_t err = {0};
    srv_sched_t *s = srv_sched_create(g_m, &o, &err);
    if (!s) fail_msg("srv_sched_create: %s", err.msg);
    return s;
}

static void submit_ok(srv_sched_t *s, srv_request_t *r, srv_job_t **j) {
    int st = 0;
    char msg[256] = "";
    *j = srv_sched_submit(s, r, &st, msg, sizeof msg);
    if (!*j) fail_msg("submit: %d %s", st, msg);
}

static void answer_free(answer_t *a) { free(a->text); }

/* Each request alone (a fresh scheduler each time, so no reuse helps), then
 * all 16 at once: identical bytes, finish reasons and token counts. */
static void test_batch_identity(void **state) {
    (void)state;
    NEED_MODEL();
    answer_t alone[NP], together[NP];
    for (int i = 0; i < NP; i++) {
        srv_sched_t *s = mksched(1, 4, 512, 2, NULL);
        srv_job_t *j;
        submit_ok(s, mkreq(PROMPTS[i], 24 + 3 * i, i % 3 == 2 ? 0.8f : 0.0f, 1000 + (uint64_t)i), &j);
        collect(j, &alone[i]);
        assert_int_equal(alone[i].status, 0);
        assert_true(alone[i].usage.completion_tokens > 0);
        srv_sched_free(s);
    }
    for (int threads = 1; threads <= 2; threads++) {
        srv_sched_t *s = mksched(NP, 4, 2048, threads, NULL);
        srv_job_t *js[NP];
        for (int i = 0; i < NP; i++)
            submit_ok(s, mkreq(PROMPTS[i], 24 + 3 * i, i % 3 == 2 ? 0.8f : 0.0f, 1000 + (uint64_t)i), &js[i]);
        for (int i = 0; i < NP; i++) collect(js[i], &together[i]);
        for (int i = 0; i < NP; i++) {
            assert_int_equal(together[i].status, 0);
            assert_string_equal(together[i].text, alone[i].text);
            assert_string_equal(together[i].finish, alone[i].finish);
            assert_int_equal(together[i].usage.completion_tokens, alone[i].usage.completion_tokens);
            assert_int_equal(together[i].usage.prompt_tokens, alone[i].usage.prompt_tokens);
            answer_free(&together[i]);
        }
        srv_sched_free(s);
    }
    for (int i = 0; i < NP; i++) answer_free(&alone[i]);
}

/* A stop string taken from the middle of the greedy answer: the answer is
 * the text before it, finish "stop"; a stop string that never occurs
 * changes nothing. */
static void test_stop(void **state) {
    (void)state;
    NEED_MODEL();
    srv_sched_t *s = mksched(2, 4, 512, 2, NULL);
    srv_job_t *j;
    answer_t ref, a, b;
    submit_ok(s, mkreq(PROMPTS[0], 48, 0, 1), &j);
    collect(j, &ref);
    assert_true(ref.len > 20);
    /* a stop string of 5 bytes starting at byte 12 (likely across tokens) */
    char stop[6];
    memcpy(stop, ref.text + 12, 5);
    stop[5] = 0;
    const char *first = strstr(ref.text, stop);
    assert_non_null(first);
    srv_request_t *r = mkreq(PROMPTS[0], 48, 0, 1);
    r->stop[0] = strdup("zzzq-never");
    r->stop[1] = strdup(stop);
    r->n_stop = 2;
    submit_ok(s, r, &j);
    collect(j, &a);
    assert_string_equal(a.finish, "stop");
    assert_int_equal(a.len, (size_t)(first - ref.text));
    assert_memory_equal(a.text, ref.text, a.len);
    r = mkreq(PROMPTS[0], 48, 0, 1);
    r->stop[0] = strdup("zzzq-never");
    r->n_stop = 1;
    submit_ok(s, r, &j);
    collect(j, &b);
    assert_string_equal(b.text, ref.text);
    assert_string_equal(b.finish, ref.finish);
    answer_free(&ref);
    answer_free(&a);
    answer_free(&b);
    srv_sched_free(s);
}

/* The second request's prompt is the first's prompt plus its answer plus
 * more: the first's positions are reused (cached_tokens), and the answer
 * equals a fresh scheduler's. */
static void test_prefix_reuse(void **state) {
    (void)state;
    NEED_MODEL();
    srv_sched_t *s = mksched(2, 4, 1024, 2, NULL);
    srv_job_t *j;
    answer_t a1, a2, fresh;
    submit_ok(s, mkreq(PROMPTS[2], 32, 0, 1), &j);
    collect(j, &a1);
    assert_int_equal(a1.usage.cached_tokens, 0);
    char *p2 = malloc(strlen(PROMPTS[2]) + a1.len + 32);
    sprintf(p2, "%s%s Then", PROMPTS[2], a1.text);
    submit_ok(s, mkreq(p2, 24, 0, 1), &j);
    collect(j, &a2);
    int32_t n1 = 0;
    {
        srv_request_t *r1 = mkreq(PROMPTS[2], 1, 0, 1);
        n1 = r1->n_prompt;
        srv_request_free(r1);
        free(r1);
    }
    assert_true(a2.usage.cached_tokens >= n1);
    assert_true(a2.usage.cached_tokens < a2.usage.prompt_tokens);
    srv_sched_free(s);
    s = mksched(2, 4, 1024, 2, NULL);
    submit_ok(s, mkreq(p2, 24, 0, 1), &j);
    collect(j, &fresh);
    assert_int_equal(fresh.usage.cached_tokens, 0);
    assert_string_equal(fresh.text, a2.text);
    srv_sched_free(s);
    free(p2);
    answer_free(&a1);
    answer_free(&a2);
    answer_free(&fresh);
}

/* 6 requests on a memory of 10 blocks of 16 positions: they cannot all
 * grow to 70 positions. Some fail with 503 naming the KV memory (the newest
 * first); every one that finishes has its own bytes. */
static void test_kv_full(void **state) {
    (void)state;
    NEED_MODEL();
    answer_t alone[6];
    for (int i = 0; i < 6; i++) {
        srv_sched_t *s = mksched(1, 4, 160, 2, NULL);
        srv_job_t *j;
        submit_ok(s, mkreq(PROMPTS[i], 60, 0, 1), &j);
        collect(j, &alone[i]);
        srv_sched_free(s);
    }
    srv_sched_t *s = mksched(6, 4, 160, 2, NULL);
    srv_job_t *js[6];
    answer_t a[6];
    for (int i = 0; i < 6; i++) submit_ok(s, mkreq(PROMPTS[i], 60, 0, 1), &js[i]);
    int failed = 0, ok = 0;
    for (int i = 0; i < 6; i++) collect(js[i], &a[i]);
    for (int i = 0; i < 6; i++) {
        if (a[i].status) {
            assert_int_equal(a[i].status, 503);
            assert_non_null(strstr(a[i].err, "KV memory is full"));
            failed++;
        } else {
            assert_string_equal(a[i].text, alone[i].text);
            ok++;
        }
        answer_free(&a[i]);
        answer_free(&alone[i]);
    }
    assert_true(failed > 0);
    assert_true(ok > 0);
    /* the first request is the oldest: it never gives way */
    srv_sched_free(s);
}

/* A job released mid-generation (client gone): the others finish with
 * their own bytes, and the memory is not leaked (blocks come back). */
static void test_release(void **state) {
    (void)state;
    NEED_MODEL();
    srv_sched_t *s = mksched(4, 4, 512, 2, NULL);
    srv_job_t *j0, *j1;
    answer_t ref, a;
    submit_ok(s, mkreq(PROMPTS[3], 40, 0, 1), &j0);
    collect(j0, &ref);
    submit_ok(s, mkreq(PROMPTS[1], 200, 0, 1), &j1);
    submit_ok(s, mkreq(PROMPTS[3], 40, 0, 1), &j0);
    srv_update_t u;
    while (!srv_job_next(j1, 100, &u)) {
    }
    free(u.text);
    free(u.toks);
    srv_job_release(j1);
    collect(j0, &a);
    assert_string_equal(a.text, ref.text);
    answer_free(&ref);
    answer_free(&a);
    srv_sched_free(s);
}

/* parallel 1, queue 1: the third request is refused with 503. */
static void test_queue_full(void **state) {
    (void)state;
    NEED_MODEL();
    srv_sched_t *s = mksched(1, 1, 512, 1, NULL);
    srv_job_t *j0, *j1;
    submit_ok(s, mkreq(PROMPTS[0], 100, 0, 1), &j0);
    /* wait until the first runs (no longer waiting) */
    srv_update_t u;
    while (!srv_job_next(j0, 100, &u)) {
    }
    free(u.text);
    free(u.toks);
    submit_ok(s, mkreq(PROMPTS[1], 4, 0, 1), &j1);
    int st = 0;
    char msg[256] = "";
    srv_job_t *j2 = srv_sched_submit(s, mkreq(PROMPTS[2], 4, 0, 1), &st, msg, sizeof msg);
    assert_null(j2);
    assert_int_equal(st, 503);
    assert_non_null(strstr(msg, "busy"));
    /* a prompt longer than the context: 400 with the numbers */
    srv_request_t *big = mkreq(PROMPTS[0], 4, 0, 1);
    big->prompt_ids = realloc(big->prompt_ids, 600 * sizeof(int32_t));
    for (int i = big->n_prompt; i < 600; i++) big->prompt_ids[i] = 100;
    big->n_prompt = 600;
    j2 = srv_sched_submit(s, big, &st, msg, sizeof msg);
    assert_null(j2);
    assert_int_equal(st, 400);
    assert_non_null(strstr(msg, "600"));
    answer_t a;
    srv_job_release(j0);
    collect(j1, &a);
    assert_int_equal(a.status, 0);
    answer_free(&a);
    srv_sched_free(s);
}

/* Sessions: turn 1 in one scheduler, turn 2 in a new one (a restarted
 * server): the committed prompt and answer are restored, not evaluated;
 * the answer equals a run without sessions. */
static void test_sessions(void **state) {
    (void)state;
    NEED_MODEL();
    char dir[] = "/tmp/tern-sched-XXXXXX";
    assert_non_null(mkdtemp(dir));
    srv_sched_t *s = mksched(2, 4, 512, 2, dir);
    srv_job_t *j;
    answer_t t1, t2, ref;
    srv_request_t *r = mkreq(PROMPTS[7], 24, 0, 1);
    strcpy(r->session, "conv-1");
    submit_ok(s, r, &j);
    collect(j, &t1);
    assert_int_equal(t1.status, 0);
    srv_sched_free(s);
    char *p2 = malloc(strlen(PROMPTS[7]) + t1.len + 32);
    sprintf(p2, "%s%s The end", PROMPTS[7], t1.text);
    s = mksched(2, 4, 512, 2, dir);
    r = mkreq(p2, 16, 0, 1);
    strcpy(r->session, "conv-1");
    submit_ok(s, r, &j);
    collect(j, &t2);
    assert_int_equal(t2.status, 0);
    srv_request_t *r1 = mkreq(PROMPTS[7], 1, 0, 1);
    assert_true(t2.usage.cached_tokens >= r1->n_prompt);
    srv_request_free(r1);
    free(r1);
    srv_sched_free(s);
    s = mksched(2, 4, 512, 2, NULL);
    submit_ok(s, mkreq(p2, 16, 0, 1), &j);
    collect(j, &ref);
    assert_string_equal(t2.text, ref.text);
    srv_sched_free(s);
    char path[128];
    snprintf(path, sizeof path, "%s/conv-1.tsess", dir);
    unlink(path);
    rmdir(dir);
    free(p2);
    answer_free(&t1);
    answer_free(&t2);
    answer_free(&ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_identity), cmocka_unit_test(test_stop),       cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_kv_full),        cmocka_unit_test(test_release),    cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_sessions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
