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
 *     committed turns instead of evaluating them, with identical output;
 *   - speculative decoding: copy-heavy requests (drafts accepted and
 *     rejected) give the tokens, logprobs, finish reasons and usage of the
 *     same requests without drafts and alone, greedy and sampled, among
 *     other jobs, under grammars (forced and cut drafts), near max_tokens,
 *     with stop strings, on a KV memory that only fits plain decoding, and
 *     in session files (which hold no drafts).
 * The engine runs its own thread, hence the TSan label.
 */
// ctest-label: concurrent
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "json_schema.h"
#include "srv.h"
#include "tern.h"

static tern_model_t *g_m;

static int setup(void **state) {
    (void)state;
    return tu_group_model_setup(&g_m, "models/stories260K.gguf");
}

static int teardown(void **state) {
    (void)state;
    tern_model_free(g_m);
    return 0;
}

#define NEED_MODEL() TU_NEED_MODEL(g_m, "models/stories260K.gguf")

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
    int32_t *ids; /* with logprobs: the tokens and their logprobs */
    float *lp;
    int32_t n_ids;
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
        if (u.n_toks) {
            a->ids = realloc(a->ids, (size_t)(a->n_ids + u.n_toks) * sizeof *a->ids);
            a->lp = realloc(a->lp, (size_t)(a->n_ids + u.n_toks) * sizeof *a->lp);
            assert_true(a->ids && a->lp);
            for (int32_t i = 0; i < u.n_toks; i++) {
                a->ids[a->n_ids] = u.toks[i].id;
                a->lp[a->n_ids++] = u.toks[i].logprob;
            }
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

static int g_spec, g_draft_max; /* what mksched gives the next schedulers */

static srv_sched_t *mksched(int parallel, int queue, int32_t n_ctx, int threads, const char *sessions) {
    srv_sched_opts_t o = {0};
    o.spec = g_spec;
    o.draft_max = g_draft_max;
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

static void answer_free(answer_t *a) {
    free(a->text);
    free(a->ids);
    free(a->lp);
}

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

/* ---- speculative decoding ---------------------------------------------------- */

/* Prompts that repeat themselves: drafts are found, some accepted. */
static const char *COPY[] = {
    "Lily said hello. Lily said hello. Lily said hello. Lily said",
    "Tom ran to the park. Tom ran to the park. Tom ran",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat",
    "Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time, there was a",
};
#define NCOPY (int)(sizeof COPY / sizeof *COPY)

static const char *SCHEMA =
    "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"name\": {\"type\": "
    "\"string\", \"maxLength\": 8}, \"age\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 9}}, "
    "\"required\": [\"name\", \"age\"]}, \"minItems\": 2, \"maxItems\": 2}";

typedef struct {
    const char *prompt;
    int32_t max_tokens;
    float temp;
    uint64_t seed;
    int logprobs;
    int gram;       /* 0: none, 1: SCHEMA, 2: json_object */
    int no_drafts;  /* speculative.n_max 0 */
    int no_bos;     /* the prompt without BOS (shares no prefix with the others) */
} spec_case_t;

static srv_request_t *mkcase(const spec_case_t *c) {
    srv_request_t *r = mkreq(c->prompt, c->max_tokens, c->temp, c->seed);
    if (c->no_bos && r->n_prompt > 1 && r->prompt_ids[0] == tern_token_bos(g_m))
        memmove(r->prompt_ids, r->prompt_ids + 1, (size_t)--r->n_prompt * sizeof *r->prompt_ids);
    r->logprobs = c->logprobs;
    r->top_logprobs = c->logprobs ? 2 : 0;
    if (c->gram) {
        tern_error_t err = {0};
        if (c->gram == 1) assert_int_equal(tern_json_schema_to_gbnf(SCHEMA, strlen(SCHEMA), &r->grammar, &err), 0);
        else r->grammar = strdup(tern_json_object_gbnf());
        assert_non_null(r->grammar);
        r->gram = tern_grammar_create(g_m, r->grammar, strlen(r->grammar), NULL, &err);
        if (!r->gram) fail_msg("grammar: %s", err.msg);
    }
    if (c->no_drafts) {
        r->has_spec_n_max = 1;
        r->spec_n_max = 0;
    }
    return r;
}

static void same_answer(const answer_t *a, const answer_t *b, const char *what, int i) {
    if (a->status != b->status || strcmp(a->text, b->text) || strcmp(a->finish ? a->finish : "", b->finish ? b->finish : ""))
        fail_msg("%s, case %d: '%s' (%s, %d) differs from '%s' (%s, %d)", what, i, b->text, b->finish, b->status, a->text,
                 a->finish, a->status);
    assert_int_equal(a->usage.completion_tokens, b->usage.completion_tokens);
    assert_int_equal(a->usage.prompt_tokens, b->usage.prompt_tokens);
    assert_int_equal(a->n_ids, b->n_ids);
    if (a->n_ids) {
        assert_memory_equal(a->ids, b->ids, (size_t)a->n_ids * sizeof *a->ids);
        assert_memory_equal(a->lp, b->lp, (size_t)a->n_ids * sizeof *a->lp);
    }
}

static void run_alone(const spec_case_t *c, answer_t *a) {
    srv_sched_t *s = mksched(1, 4, 1024, 2, NULL);
    srv_job_t *j;
    submit_ok(s, mkcase(c), &j);
    collect(j, a);
    srv_sched_free(s);
}

static uint64_t metric(srv_sched_t *s, const char *name) {
    char *m = srv_sched_metrics(s);
    assert_non_null(m);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(m, key);
    assert_non_null(p);
    uint64_t v = strtoull(p + strlen(key), NULL, 10);
    free(m);
    return v;
}

/* Each case alone without drafts is the reference. The same requests with
 * drafts in every tick (alone, then together with plain requests among
 * them), then with the per-tick decision, give its tokens, logprobs and
 * counts; drafts were evaluated, some accepted and some rejected; grammar
 * cases accept forced drafts; a request with speculative.n_max 0 gets none. */
static void test_spec_identity(void **state) {
    (void)state;
    NEED_MODEL();
    spec_case_t cs[3 * NCOPY + 5];
    int n = 0;
    for (int i = 0; i < NCOPY; i++) {
        cs[n++] = (spec_case_t){COPY[i], 64, 0.0f, 1, i == 1, 0, 0, 0};
        cs[n++] = (spec_case_t){COPY[i], 64, 0.8f, 7 + (uint64_t)i, i != 1, 0, 0, 0};
        cs[n++] = (spec_case_t){COPY[i], 2 + i, 0.0f, 1, 0, 0, 0, 0}; /* drafts never pass max_tokens */
    }
    const int g0 = n;
    cs[n++] = (spec_case_t){"Names and ages:", 200, 0.0f, 1, 0, 1, 0, 0};
    cs[n++] = (spec_case_t){"Names and ages:", 200, 0.8f, 3, 1, 1, 0, 0};
    cs[n++] = (spec_case_t){"A JSON object:", 48, 0.8f, 5, 0, 2, 0, 0};
    cs[n++] = (spec_case_t){COPY[0], 48, 0.8f, 11, 0, 2, 0, 0};
    const int nd = n;
    cs[n++] = (spec_case_t){COPY[2], 40, 0.0f, 1, 0, 0, 1, 0};
    answer_t ref[3 * NCOPY + 5], a;
    g_spec = SRV_SPEC_OFF;
    for (int i = 0; i < n; i++) {
        run_alone(&cs[i], &ref[i]);
        assert_int_equal(ref[i].status, 0);
        assert_int_equal(ref[i].usage.draft_n, 0);
    }
    int64_t drafted = 0, accepted = 0, gram_accepted = 0;
    g_spec = SRV_SPEC_FIXED;
    g_draft_max = 8;
    for (int i = 0; i < n; i++) {
        run_alone(&cs[i], &a);
        same_answer(&ref[i], &a, "alone, drafts in every tick", i);
        drafted += a.usage.draft_n;
        accepted += a.usage.draft_n_accepted;
        if (i >= g0 && i < nd) gram_accepted += a.usage.draft_n_accepted;
        assert_true(a.usage.draft_n_accepted <= a.usage.draft_n);
        if (i == nd) assert_int_equal(a.usage.draft_n, 0);
        answer_free(&a);
    }
    printf("speculative, alone: %lld drafted, %lld accepted (%lld under grammars)\n", (long long)drafted,
           (long long)accepted, (long long)gram_accepted);
    assert_true(accepted > 0);
    assert_true(accepted < drafted); /* some rejected */
    assert_true(gram_accepted > 0);
    for (int mode = SRV_SPEC_OFF; mode <= SRV_SPEC_FIXED; mode++) {
        g_spec = mode;
        g_draft_max = mode == SRV_SPEC_FIXED ? 16 : 8;
        const int no = (n + 3) / 4; /* plain requests among them */
        srv_sched_t *s = mksched(n + no, 4, 4096, 2, NULL);
        srv_job_t *js[3 * NCOPY + 5], *other[(3 * NCOPY + 5 + 3) / 4];
        answer_t oth[(3 * NCOPY + 5 + 3) / 4];
        for (int i = 0; i < n; i++) {
            if (i % 4 == 0) submit_ok(s, mkreq(PROMPTS[i / 4], 40, i % 8 ? 0.8f : 0.0f, 1000 + (uint64_t)i), &other[i / 4]);
            submit_ok(s, mkcase(&cs[i]), &js[i]);
        }
        drafted = accepted = 0;
        for (int i = 0; i < n; i++) {
            collect(js[i], &a);
            same_answer(&ref[i], &a,
                        mode == SRV_SPEC_FIXED   ? "together, drafts in every tick"
                        : mode == SRV_SPEC_NGRAM ? "together, decided per tick"
                                                 : "together, no drafts",
                        i);
            drafted += a.usage.draft_n;
            accepted += a.usage.draft_n_accepted;
            answer_free(&a);
        }
        for (int k = 0; k < no; k++) collect(other[k], &oth[k]);
        printf("speculative, %d together (%s): %lld drafted, %lld accepted\n", n + no,
               mode == SRV_SPEC_FIXED ? "fixed" : mode == SRV_SPEC_NGRAM ? "per tick" : "off", (long long)drafted,
               (long long)accepted);
        if (mode == SRV_SPEC_FIXED) {
            assert_true(accepted > 0 && accepted < drafted);
            uint64_t all = (uint64_t)drafted;
            for (int k = 0; k < no; k++) all += (uint64_t)oth[k].usage.draft_n;
            assert_int_equal(metric(s, "tern_spec_draft_tokens_total"), all);
            assert_true(metric(s, "tern_spec_draft_passes_total") > 0);
        }
        srv_sched_free(s);
        /* the plain requests among them: their bytes alone */
        g_spec = SRV_SPEC_OFF;
        for (int k = 0; k < no; k++) {
            answer_t al;
            srv_sched_t *s1 = mksched(1, 4, 1024, 2, NULL);
            srv_job_t *j;
            submit_ok(s1, mkreq(PROMPTS[k], 40, (k * 4) % 8 ? 0.8f : 0.0f, 1000 + (uint64_t)(k * 4)), &j);
            collect(j, &al);
            srv_sched_free(s1);
            same_answer(&al, &oth[k], "a plain request among speculative ones", k);
            answer_free(&al);
            answer_free(&oth[k]);
        }
    }
    for (int i = 0; i < n; i++) answer_free(&ref[i]);
    g_spec = SRV_SPEC_OFF;
    g_draft_max = 0;
}

/* A stop string met in the middle of a tick's confirmed drafts ends the job
 * there: the answer is the one without drafts. */
static void test_spec_stop(void **state) {
    (void)state;
    NEED_MODEL();
    answer_t ref, a[2];
    spec_case_t c = {COPY[0], 64, 0.0f, 1, 0, 0, 0, 0};
    g_spec = SRV_SPEC_OFF;
    run_alone(&c, &ref);
    assert_true(ref.len > 40);
    for (int off = 10; off <= 30; off += 10) {
        char stop[5];
        memcpy(stop, ref.text + off, 4);
        stop[4] = 0;
        for (int mode = 0; mode < 2; mode++) {
            g_spec = mode ? SRV_SPEC_FIXED : SRV_SPEC_OFF;
            srv_sched_t *s = mksched(1, 4, 1024, 2, NULL);
            srv_request_t *r = mkcase(&c);
            r->stop[0] = strdup(stop);
            r->n_stop = 1;
            srv_job_t *j;
            submit_ok(s, r, &j);
            collect(j, &a[mode]);
            srv_sched_free(s);
        }
        same_answer(&a[0], &a[1], "stop string", off);
        assert_string_equal(a[1].finish, "stop");
        assert_true(a[1].len < ref.len);
        answer_free(&a[0]);
        answer_free(&a[1]);
    }
    answer_free(&ref);
    g_spec = SRV_SPEC_OFF;
}

/* Four requests that end at stop strings, together, on a KV memory of the
 * blocks their plain runs fill: drafts reach past the positions plain
 * decoding ever fills, yet every request finishes with its bytes. */
static void test_spec_stops_together(void **state) {
    (void)state;
    NEED_MODEL();
    enum { NJ = 4 };
    answer_t ref[NJ], a[NJ];
    char stop[NJ][5];
    int32_t blocks = 0;
    g_spec = SRV_SPEC_OFF;
    for (int i = 0; i < NJ; i++) {
        spec_case_t c = {COPY[i], 200, 0.0f, 1, 0, 0, 0, 0};
        run_alone(&c, &ref[i]);
        assert_true(ref[i].len > 60);
        memcpy(stop[i], ref[i].text + 50, 4);
        stop[i][4] = 0;
        answer_free(&ref[i]);
        srv_sched_t *s = mksched(1, 4, 1024, 2, NULL);
        srv_request_t *r = mkcase(&c);
        r->stop[0] = strdup(stop[i]);
        r->n_stop = 1;
        srv_job_t *j;
        submit_ok(s, r, &j);
        collect(j, &ref[i]);
        srv_sched_free(s);
        assert_string_equal(ref[i].finish, "stop");
        blocks += (ref[i].usage.prompt_tokens + ref[i].usage.completion_tokens - 1 + 15) / 16;
    }
    int64_t drafted = 0;
    for (int mode = 0; mode < 2; mode++) {
        g_spec = mode ? SRV_SPEC_FIXED : SRV_SPEC_OFF;
        g_draft_max = 16;
        srv_sched_t *s = mksched(NJ, 4, blocks * 16, 2, NULL);
        srv_job_t *js[NJ];
        for (int i = 0; i < NJ; i++) {
            spec_case_t c = {COPY[i], 200, 0.0f, 1, 0, 0, 0, 0};
            srv_request_t *r = mkcase(&c);
            r->stop[0] = strdup(stop[i]);
            r->n_stop = 1;
            submit_ok(s, r, &js[i]);
        }
        for (int i = 0; i < NJ; i++) {
            collect(js[i], &a[i]);
            if (a[i].status) fail_msg("%s: request %d failed: %s", mode ? "drafts" : "plain", i, a[i].err);
            same_answer(&ref[i], &a[i], "tight KV memory", i);
            drafted += a[i].usage.draft_n;
            answer_free(&a[i]);
        }
        srv_sched_free(s);
    }
    printf("tight KV memory (%d blocks): %lld drafted\n", blocks, (long long)drafted);
    assert_true(drafted > 0);
    for (int i = 0; i < NJ; i++) answer_free(&ref[i]);
    g_spec = SRV_SPEC_OFF;
    g_draft_max = 0;
}

/* A finished conversation (A) stays cached while B (no prefix in common,
 * so it takes a free sequence) runs alone on a KV
 * memory of exactly A's blocks and the blocks B's plain run fills (B ends
 * at a stop string, so its drafts would reach past them). Drafts are cut
 * to the free blocks, never at another request's cost: C, which continues
 * A, finds A's positions cached as it does without drafts. */
static void test_spec_kv_tight(void **state) {
    (void)state;
    NEED_MODEL();
    answer_t ra, rb, a[2][3];
    spec_case_t ca = {COPY[0], 40, 0.0f, 1, 0, 0, 0, 0}, cb = {COPY[2], 200, 0.0f, 1, 0, 0, 0, 1};
    g_spec = SRV_SPEC_OFF;
    run_alone(&ca, &ra);
    run_alone(&cb, &rb);
    assert_true(rb.len > 160);
    char stop[5];
    memcpy(stop, rb.text + 150, 4);
    stop[4] = 0;
    char *pc = malloc(strlen(COPY[0]) + ra.len + 16);
    assert_non_null(pc);
    sprintf(pc, "%s%s Then", COPY[0], ra.text);
    int32_t n_ctx = 0;
    for (int mode = 0; mode < 2; mode++) {
        g_spec = mode ? SRV_SPEC_FIXED : SRV_SPEC_OFF;
        g_draft_max = 16;
        for (int pass = 0; pass < (mode ? 1 : 2); pass++) {
            /* the plain run sizes the memory first (pass 0, roomy), then runs in it */
            srv_sched_t *s = mksched(1, 4, n_ctx ? n_ctx : 1024, 2, NULL);
            srv_job_t *j;
            submit_ok(s, mkcase(&ca), &j);
            collect(j, &a[mode][0]);
            srv_request_t *r = mkcase(&cb);
            r->stop[0] = strdup(stop);
            r->n_stop = 1;
            submit_ok(s, r, &j);
            collect(j, &a[mode][1]);
            spec_case_t cc = {pc, 8, 0.0f, 1, 0, 0, 0, 0};
            submit_ok(s, mkcase(&cc), &j);
            collect(j, &a[mode][2]);
            srv_sched_free(s);
            if (!n_ctx) {
                const srv_usage_t *ua = &a[0][0].usage, *ub = &a[0][1].usage;
                n_ctx = 16 * ((ua->prompt_tokens + ua->completion_tokens - 1 + 15) / 16 +
                              (ub->prompt_tokens + ub->completion_tokens - 1 + 15) / 16);
                printf("roomy memory: C reused %d positions\n", a[0][2].usage.cached_tokens);
                for (int k = 0; k < 3; k++) answer_free(&a[0][k]);
            }
        }
    }
    for (int k = 0; k < 3; k++) {
        assert_int_equal(a[1][k].status, 0);
        same_answer(&a[0][k], &a[1][k], "tight KV memory", k);
    }
    assert_string_equal(a[1][1].finish, "stop");
    printf("tight KV memory (%d positions): B drafted %d; C reused %d positions (%d without drafts)\n", n_ctx,
           a[1][1].usage.draft_n, a[1][2].usage.cached_tokens, a[0][2].usage.cached_tokens);
    assert_true(a[1][1].usage.draft_n > 0);
    assert_true(a[0][2].usage.cached_tokens > (int32_t)strlen(COPY[0]) / 8);
    assert_int_equal(a[1][2].usage.cached_tokens, a[0][2].usage.cached_tokens);
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < 3; k++) answer_free(&a[mode][k]);
    answer_free(&ra);
    answer_free(&rb);
    free(pc);
    g_spec = SRV_SPEC_OFF;
    g_draft_max = 0;
}

/* Session files hold what the sequence holds: with drafts, exactly the
 * tokens (and turns) of a run without them. */
static void test_spec_sessions(void **state) {
    (void)state;
    NEED_MODEL();
    char dir[2][32] = {"/tmp/tern-sspec-XXXXXX", "/tmp/tern-sspec-XXXXXX"};
    answer_t a[2];
    for (int mode = 0; mode < 2; mode++) {
        assert_non_null(mkdtemp(dir[mode]));
        g_spec = mode ? SRV_SPEC_FIXED : SRV_SPEC_OFF;
        srv_sched_t *s = mksched(2, 4, 512, 2, dir[mode]);
        spec_case_t c = {COPY[1], 48, 0.0f, 1, 0, 0, 0, 0};
        srv_request_t *r = mkcase(&c);
        strcpy(r->session, "conv");
        srv_job_t *j;
        submit_ok(s, r, &j);
        collect(j, &a[mode]);
        srv_sched_free(s);
    }
    same_answer(&a[0], &a[1], "session turn", 0);
    assert_true(a[1].usage.draft_n > 0);
    tern_context_params_t cp = tern_context_default_params();
    cp.n_ctx = 512;
    tern_error_t err = {0};
    tern_context_t *c = tern_context_create(g_m, &cp, &err);
    assert_non_null(c);
    tern_session_t *ss[2];
    for (int mode = 0; mode < 2; mode++) {
        char path[64];
        snprintf(path, sizeof path, "%s/conv.tsess", dir[mode]);
        ss[mode] = tern_session_open(g_m, path, c, &err);
        if (!ss[mode]) fail_msg("%s: %s", path, err.msg);
    }
    assert_int_equal(tern_session_n_tokens(ss[0]), a[0].usage.prompt_tokens + a[0].usage.completion_tokens - 1);
    assert_int_equal(tern_session_n_tokens(ss[0]), tern_session_n_tokens(ss[1]));
    assert_int_equal(tern_session_n_turns(ss[0]), tern_session_n_turns(ss[1]));
    assert_memory_equal(tern_session_tokens(ss[0]), tern_session_tokens(ss[1]),
                        (size_t)tern_session_n_tokens(ss[0]) * sizeof(int32_t));
    for (int mode = 0; mode < 2; mode++) {
        char path[64];
        snprintf(path, sizeof path, "%s/conv.tsess", dir[mode]);
        tern_session_close(ss[mode]);
        unlink(path);
        rmdir(dir[mode]);
        answer_free(&a[mode]);
    }
    tern_context_free(c);
    g_spec = SRV_SPEC_OFF;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_identity), cmocka_unit_test(test_stop),       cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_kv_full),        cmocka_unit_test(test_release),    cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_sessions),       cmocka_unit_test(test_spec_identity), cmocka_unit_test(test_spec_stop),
        cmocka_unit_test(test_spec_stops_together), cmocka_unit_test(test_spec_kv_tight),
        cmocka_unit_test(test_spec_sessions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
