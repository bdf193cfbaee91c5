// ctest-label: concurrent
/* test_server_grammar.c - grammar-constrained generation end to end, judged
 * by checkers that do not use the grammar engine (tests/grammar_check.c):
 * every grammar of tests/grammars/ parses, accepts its good samples and
 * refuses its bad ones; generation with a trained model (stories260K) at
 * temperature 0.8 over many seeds never produces an invalid text, for the
 * corpus and for JSON schemas (the converter's grammars, judged by cJSON and
 * an independent schema validator). Named test_server_* because the schema
 * converter lives in the server's library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "grammar_corpus.h"
#include "json_schema.h"
#include "tern.h"

static tern_model_t *g_m;

static int setup(void **st) {
    (void)st;
    return tu_group_model_setup(&g_m, "models/stories260K.gguf");
}

static int teardown(void **st) {
    (void)st;
    tern_model_free(g_m);
    return 0;
}
#define NEED_MODEL() TU_NEED_MODEL(g_m, "models/stories260K.gguf")

static tern_grammar_t *load_corpus(int i) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", GRAMMAR_CORPUS_DIR, GRAMMAR_CORPUS[i].file);
    size_t n;
    char *text = tu_read_file(path, &n);
    if (!text) fail_msg("cannot read %s", path);
    tern_error_t err = {0};
    tern_grammar_t *g = tern_grammar_create(g_m, text, n, NULL, &err);
    free(text);
    if (!g) fail_msg("%s: %s", GRAMMAR_CORPUS[i].file, err.msg);
    return g;
}

static int in_language(const tern_grammar_t *g, const char *s) {
    tern_error_t err;
    tern_matcher_t *mt = tern_matcher_create(g, &err);
    assert_non_null(mt);
    int ok = tern_matcher_accept_text(mt, s, strlen(s), &err) == 0 && tern_matcher_done(mt);
    tern_matcher_free(mt);
    return ok;
}

static void test_corpus_samples(void **st) {
    (void)st;
    NEED_MODEL();
    for (int i = 0; i < GRAMMAR_CORPUS_N; i++) {
        const grammar_corpus_t *c = &GRAMMAR_CORPUS[i];
        tern_grammar_t *g = load_corpus(i);
        for (int k = 0; c->good[k]; k++) {
            if (!in_language(g, c->good[k])) fail_msg("%s refuses good sample %d: %s", c->file, k, c->good[k]);
            assert_int_equal(c->check(c->good[k], strlen(c->good[k])), 1);
        }
        for (int k = 0; c->bad[k]; k++)
            if (in_language(g, c->bad[k])) fail_msg("%s accepts bad sample %d: %s", c->file, k, c->bad[k]);
        tern_grammar_free(g);
    }
}

typedef struct {
    char buf[8192];
    size_t n;
} text_t;

static int collect(int32_t id, const char *text, size_t len, void *user) {
    (void)id;
    text_t *t = user;
    if (text && len && t->n + len < sizeof t->buf) {
        memcpy(t->buf + t->n, text, len);
        t->n += len;
    }
    return 0;
}

/* Generate under g from prompt with seed; returns 1 when the grammar was
 * complete (stopped at end of generation), the text in *out. */
static int generate(const tern_grammar_t *g, const char *prompt, uint64_t seed, int n_predict, text_t *out) {
    tern_error_t err = {0};
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = 1;
    cp.n_ctx = 1024;
    tern_context_t *c = tern_context_create(g_m, &cp, &err);
    assert_non_null(c);
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.temp = 0.8f;
    sp.seed = seed;
    tern_sampler_t *s = tern_sampler_create(g_m, &sp, &err);
    tern_matcher_t *mt = tern_matcher_create(g, &err);
    assert_non_null(s);
    assert_non_null(mt);
    tern_sampler_set_matcher(s, mt);
    /* the tiny model rarely ends on its own: favour the end where the
     * grammar allows it, so most texts complete and get judged */
    tern_logit_bias_t bias[2] = {{tern_token_eos(g_m), seed % 3 == 0 ? 10.0f : seed % 3 == 1 ? 20.0f : 30.0f},
                                 {-1, 8.0f}};
    size_t nb = 1;
    int32_t *nl = NULL;
    size_t nnl = 0;
    /* and, every other seed, newlines (line-based grammars end lines there) */
    if (seed % 2 == 0 && tern_tokenize(g_m, "\n", 1, 0, 0, &nl, &nnl, &err) == 0 && nnl) {
        bias[1].token = nl[nnl - 1];
        nb = 2;
    }
    free(nl);
    assert_int_equal(tern_sampler_set_logit_bias(s, bias, nb, &err), 0);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tern_tokenize(g_m, prompt, strlen(prompt), 1, 0, &ids, &n, &err), 0);
    out->n = 0;
    tern_generate_result_t r;
    int rc = tern_generate(c, s, ids, (int32_t)n, n_predict, collect, out, &r, &err);
    if (rc) fail_msg("generate: %s", err.msg);
    out->buf[out->n] = 0;
    int complete = r.stop == TERN_STOP_EOG;
    if (complete) assert_true(tern_matcher_finished(mt));
    free(ids);
    tern_matcher_free(mt);
    tern_sampler_free(s);
    tern_context_free(c);
    return complete;
}

static void test_corpus_generation(void **st) {
    (void)st;
    NEED_MODEL();
    const int seeds = tu_quick() ? 4 : 12;
    for (int i = 0; i < GRAMMAR_CORPUS_N; i++) {
        const grammar_corpus_t *c = &GRAMMAR_CORPUS[i];
        tern_grammar_t *g = load_corpus(i);
        int complete = 0, sd;
        /* at least `seeds` generations, more until one completes (at most 80) */
        for (sd = 1; sd <= 80 && (sd <= seeds || !complete); sd++) {
            text_t t;
            if (!generate(g, "Once upon a time", (uint64_t)sd, 400, &t)) {
                if (getenv("TERN_TEST_VERBOSE")) printf("%s seed %d incomplete: %s\n", c->file, sd, t.buf);
                continue;
            }
            complete++;
            if (c->check(t.buf, t.n) != 1) fail_msg("%s, seed %d: the checker refuses: %s", c->file, sd, t.buf);
        }
        printf("%s: %d of %d generations complete, all valid\n", c->file, complete, sd - 1);
        assert_true(complete > 0);
        tern_grammar_free(g);
    }
}

static void test_schema_generation(void **st) {
    (void)st;
    NEED_MODEL();
    static const char *schemas[] = {
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 12}, \"age\": "
        "{\"type\": \"integer\", \"minimum\": 3, \"maximum\": 99}, \"pet\": {\"enum\": [\"cat\", \"dog\", 7]}}, "
        "\"required\": [\"name\", \"age\"]}",
        "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}, "
        "\"ok\": {\"type\": \"boolean\"}}, \"required\": [\"ok\"]}, \"minItems\": 1, \"maxItems\": 3}",
        "{\"$defs\": {\"word\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 6}}, \"type\": \"object\", "
        "\"properties\": {\"words\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/word\"}, \"maxItems\": "
        "4}, \"kind\": {\"anyOf\": [{\"const\": \"story\"}, {\"type\": \"null\"}, {\"type\": \"integer\", "
        "\"minimum\": -5, \"maximum\": 5}]}}, \"required\": [\"words\", \"kind\"]}",
    };
    const int seeds = tu_quick() ? 4 : 10;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        char *gbnf = NULL;
        tern_error_t err = {0};
        if (tern_json_schema_to_gbnf(schemas[i], strlen(schemas[i]), &gbnf, &err)) fail_msg("schema %zu: %s", i, err.msg);
        tern_grammar_t *g = tern_grammar_create(g_m, gbnf, strlen(gbnf), NULL, &err);
        if (!g) fail_msg("schema %zu grammar: %s\n%s", i, err.msg, gbnf);
        int complete = 0;
        for (int sd = 1; sd <= seeds; sd++) {
            text_t t;
            if (!generate(g, "The little dog", (uint64_t)sd * 31, 200, &t)) continue;
            complete++;
            char why[256];
            if (check_json_schema(t.buf, t.n, schemas[i], why, sizeof why) != 1)
                fail_msg("schema %zu, seed %d: %s: %s", i, sd, why, t.buf);
        }
        printf("schema %zu: %d of %d generations complete, all valid\n", i, complete, seeds);
        assert_true(complete > 0);
        tern_grammar_free(g);
        free(gbnf);
    }
}


/* Speculative decoding under a grammar: the same tokens as plain decoding
 * (greedy and sampled), with grammar-forced drafts accepted. */
typedef struct {
    int32_t ids[1024];
    int n;
} ids_t;
static int collect_ids(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    ids_t *t = user;
    if (id >= 0 && t->n < 1024) t->ids[t->n++] = id;
    return 0;
}

static void run_gen(const tern_grammar_t *g, float temp, uint64_t seed, int spec, ids_t *out, tern_spec_stats_t *st,
                    tern_stop_reason_t *why) {
    tern_error_t err = {0};
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = 2;
    cp.n_ctx = 1024;
    tern_context_t *c = tern_context_create(g_m, &cp, &err);
    tern_sampler_params_t sp = tern_sampler_default_params();
    sp.temp = temp;
    sp.seed = seed;
    sp.repeat_penalty = 1.1f;
    tern_sampler_t *s = tern_sampler_create(g_m, &sp, &err);
    tern_matcher_t *mt = tern_matcher_create(g, &err);
    assert_non_null(c);
    assert_non_null(s);
    assert_non_null(mt);
    tern_sampler_set_matcher(s, mt);
    tern_logit_bias_t eos = {tern_token_eos(g_m), 15.0f};
    assert_int_equal(tern_sampler_set_logit_bias(s, &eos, 1, &err), 0);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *prompt = "Lily wrote down her friends: Tom is 5, Sue is 7, Ben is 6. In JSON:";
    assert_int_equal(tern_tokenize(g_m, prompt, strlen(prompt), 1, 0, &ids, &n, &err), 0);
    out->n = 0;
    tern_generate_result_t r;
    tern_spec_params_t spp = tern_spec_default_params();
    int rc = spec ? tern_generate_spec(c, s, ids, (int32_t)n, 300, &spp, collect_ids, out, &r, st, &err)
                  : tern_generate(c, s, ids, (int32_t)n, 300, collect_ids, out, &r, &err);
    if (rc) fail_msg("generate: %s", err.msg);
    *why = r.stop;
    free(ids);
    tern_matcher_free(mt);
    tern_sampler_free(s);
    tern_context_free(c);
}

static void test_spec_with_grammar(void **st) {
    (void)st;
    NEED_MODEL();
    static const char *schema =
        "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"name\": {\"type\": "
        "\"string\", \"maxLength\": 8}, \"age\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 9}}, "
        "\"required\": [\"name\", \"age\"]}, \"minItems\": 3, \"maxItems\": 3}";
    char *gbnf = NULL;
    tern_error_t err = {0};
    assert_int_equal(tern_json_schema_to_gbnf(schema, strlen(schema), &gbnf, &err), 0);
    tern_grammar_t *g = tern_grammar_create(g_m, gbnf, strlen(gbnf), NULL, &err);
    assert_non_null(g);
    int64_t drafted = 0, accepted = 0;
    for (int mode = 0; mode < 2; mode++)
        for (uint64_t seed = 1; seed <= 4; seed++) {
            ids_t a, b;
            tern_spec_stats_t ss;
            tern_stop_reason_t wa, wb;
            run_gen(g, mode ? 0.8f : 0.0f, seed, 0, &a, NULL, &wa);
            run_gen(g, mode ? 0.8f : 0.0f, seed, 1, &b, &ss, &wb);
            assert_int_equal(a.n, b.n);
            assert_memory_equal(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]);
            assert_int_equal(wa, wb);
            drafted += ss.n_drafted;
            accepted += ss.n_accepted;
        }
    printf("spec under a schema grammar: %lld drafted, %lld accepted\n", (long long)drafted, (long long)accepted);
    assert_true(accepted > 0);            /* the forced spans were drafted and taken */
    assert_true(accepted < drafted);      /* and some drafts were refused */
    tern_grammar_free(g);
    free(gbnf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_samples),
        cmocka_unit_test(test_corpus_generation),
        cmocka_unit_test(test_schema_generation),
        cmocka_unit_test(test_spec_with_grammar),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
