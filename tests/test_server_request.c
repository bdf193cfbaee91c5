/* test_server_request.c - the server's request parser (srv_request_parse),
 * its preparation on a real model (srv_request_prepare), and session ids
 * and paths (srv_session_id_valid, srv_session_path), tools/server/. */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "srv.h"
#include "tern.h"
#include "testutil.h"

#define CHAT SRV_KIND_CHAT
#define COMPL SRV_KIND_COMPLETION

static int parse(srv_kind_t kind, const char *body, srv_request_t *r, char *msg, size_t cap) {
    return srv_request_parse(kind, body, strlen(body), NULL, r, msg, cap);
}

/* ---- bodies that must be refused ------------------------------------------ */

typedef struct {
    srv_kind_t kind;
    const char *body;
    const char *piece; /* in the message: names the field */
} bad_t;

#define M1 "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const bad_t BAD[] = {
    {CHAT, "{", "Invalid JSON"},
    {CHAT, "hello", "Invalid JSON"},
    {CHAT, "null", "JSON object"},
    {CHAT, "[1,2]", "JSON object"},
    {CHAT, "{" M1 "}}", "unexpected data"},
    {CHAT, "{}", "messages: required"},
    {CHAT, "{\"messages\":\"hi\"}", "messages: must be an array"},
    {CHAT, "{\"messages\":[]}", "messages: must not be empty"},
    {CHAT, "{\"messages\":[42]}", "messages[0]: must be an object"},
    {CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", "messages[0].role: required"},
    {CHAT, "{\"messages\":[{\"role\":5,\"content\":\"hi\"}]}", "messages[0].role: must be a string"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"wizard\",\"content\":\"hi\"}]}",
     "messages[1].role: unknown role 'wizard'"},
    {CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"hi\"}]}", "messages[0].role: unknown role"},
    {CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content: required"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":42}]}", "messages[0].content: must be a string"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
     "messages[0].content[0].type: 'image_url' is not supported"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}",
     "messages[0].content[0].text: must be a string"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[7]}]}", "messages[0].content[0]: must be an object"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "\\u0000"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\x01" "b\"}]}", "control character"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", "messages[0].content: not valid UTF-8"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", "messages[0].content: not valid UTF-8"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", "not valid UTF-8"}, /* surrogate */
    {CHAT, "{" M1 ",\"temperature\":\"hot\"}", "temperature: must be a number"},
    {CHAT, "{" M1 ",\"temperature\":-0.5}", "temperature: must be between 0 and 2"},
    {CHAT, "{" M1 ",\"temperature\":2.5}", "temperature"},
    {CHAT, "{" M1 ",\"temperature\":1e999}", "temperature"},
    {CHAT, "{" M1 ",\"top_p\":1.5}", "top_p"},
    {CHAT, "{" M1 ",\"min_p\":-1}", "min_p"},
    {CHAT, "{" M1 ",\"top_k\":-2}", "top_k"},
    {CHAT, "{" M1 ",\"top_k\":1e12}", "top_k"},
    {CHAT, "{" M1 ",\"max_tokens\":0}", "max_tokens"},
    {CHAT, "{" M1 ",\"max_tokens\":-5}", "max_tokens"},
    {CHAT, "{" M1 ",\"max_tokens\":1.5}", "max_tokens: must be an integer"},
    {CHAT, "{" M1 ",\"max_tokens\":\"ten\"}", "max_tokens"},
    {CHAT, "{" M1 ",\"max_tokens\":99999999999}", "max_tokens"},
    {CHAT, "{" M1 ",\"max_completion_tokens\":0}", "max_completion_tokens"},
    {CHAT, "{" M1 ",\"stop\":5}", "stop: must be a string or an array"},
    {CHAT, "{" M1 ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop: at most 4"},
    {CHAT, "{" M1 ",\"stop\":[\"a\",\"\"]}", "stop[1]: must not be empty"},
    {CHAT, "{" M1 ",\"stop\":[\"a\",3]}", "stop[1]: must be a string"},
    {CHAT, "{" M1 ",\"stop\":\"\xc0\xaf\"}", "stop[0]: not valid UTF-8"},
    {CHAT, "{" M1 ",\"seed\":\"abc\"}", "seed"},
    {CHAT, "{" M1 ",\"seed\":1.5}", "seed"},
    {CHAT, "{" M1 ",\"seed\":1e30}", "seed"},
    {CHAT, "{" M1 ",\"presence_penalty\":3}", "presence_penalty"},
    {CHAT, "{" M1 ",\"frequency_penalty\":-2.5}", "frequency_penalty"},
    {CHAT, "{" M1 ",\"repeat_penalty\":0}", "repeat_penalty"},
    {CHAT, "{" M1 ",\"logit_bias\":[1]}", "logit_bias: must be an object"},
    {CHAT, "{" M1 ",\"logit_bias\":{\"abc\":1}}", "logit_bias: key 'abc' is not a token id"},
    {CHAT, "{" M1 ",\"logit_bias\":{\"-3\":1}}", "logit_bias: key"},
    {CHAT, "{" M1 ",\"logit_bias\":{\"99999999999\":1}}", "logit_bias: key"},
    {CHAT, "{" M1 ",\"logit_bias\":{\"5\":101}}", "logit_bias: the bias of token 5"},
    {CHAT, "{" M1 ",\"logit_bias\":{\"5\":\"x\"}}", "logit_bias: the bias"},
    {CHAT, "{" M1 ",\"n\":2}", "n: only 1"},
    {CHAT, "{" M1 ",\"logprobs\":1}", "logprobs: must be true or false"},
    {CHAT, "{" M1 ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
    {CHAT, "{" M1 ",\"top_logprobs\":3}", "top_logprobs: needs"},
    {CHAT, "{" M1 ",\"stream\":\"yes\"}", "stream: must be true or false"},
    {CHAT, "{" M1 ",\"stream_options\":{\"include_usage\":true}}", "stream_options: only allowed when stream"},
    {CHAT, "{" M1 ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", "stream_options.include_usage"},
    {CHAT, "{" M1 ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}",
     "json_schema\" with a \"schema\""},
    {CHAT, "{" M1 ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"pattern\":\"x\"}}}}",
     "unsupported keyword \"pattern\""},
    {CHAT, "{" M1 ",\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"}",
     "give one of"},
    {CHAT, "{" M1 ",\"grammar\":7}", "grammar"},
    {CHAT, "{" M1 ",\"response_format\":{\"type\":\"yaml\"}}", "response_format: unknown type"},
    {CHAT, "{" M1 ",\"tools\":[{\"type\":\"function\"}]}", "tools: tool calls are not supported"},
    {CHAT, "{" M1 ",\"model\":5}", "model: must be a string"},
    {CHAT, "{" M1 ",\"ignore_eos\":\"no\"}", "ignore_eos"},
    {CHAT, "{" M1 ",\"session_id\":\"../etc\"}", "session_id"},
    {CHAT, "{" M1 ",\"session_id\":7}", "session_id: must be a string"},
    {COMPL, "{}", "prompt: required"},
    {COMPL, "{\"prompt\":5}", "prompt: must be a string or an array"},
    {COMPL, "{\"prompt\":[]}", "prompt: must not be an empty array"},
    {COMPL, "{\"prompt\":[\"a\",\"b\"]}", "prompt: one prompt per request"},
    {COMPL, "{\"prompt\":[1,-2]}", "prompt[1]: a token id"},
    {COMPL, "{\"prompt\":[1,2.5]}", "prompt[1]"},
    {COMPL, "{\"prompt\":[1,\"x\"]}", "prompt[1]"},
    {COMPL, "{\"prompt\":\"\xff\"}", "prompt: not valid UTF-8"},
    {COMPL, "{\"prompt\":\"a\",\"echo\":true}", "echo: not supported"},
    {COMPL, "{\"prompt\":\"a\",\"logprobs\":21}", "logprobs"},
    {COMPL, "{\"prompt\":\"a\",\"suffix\":\"z\"}", "suffix: not supported"},
    {COMPL, "{\"prompt\":\"a\",\"best_of\":3}", "best_of: only 1"},
    {COMPL, "{\"prompt\":\"a\",\"speculative.n_max\":33}", "speculative.n_max: must be between 0 and 32"},
    {COMPL, "{\"prompt\":\"a\",\"speculative.n_max\":\"4\"}", "speculative.n_max: must be an integer"},
};

static void test_bad_bodies(void **state) {
    (void)state;
    size_t n = sizeof BAD / sizeof BAD[0];
    assert_true(n >= 30);
    for (size_t i = 0; i < n; i++) {
        srv_request_t r;
        char msg[512] = "";
        int st = parse(BAD[i].kind, BAD[i].body, &r, msg, sizeof msg);
        if (st != 400 || !strstr(msg, BAD[i].piece))
            fail_msg("bad body %zu (%s): status %d, message '%s', wanted 400 and '%s'", i, BAD[i].body, st, msg,
                     BAD[i].piece);
        /* A refused request holds nothing. */
        assert_null(r.msgs);
        assert_null(r.prompt_ids);
        assert_null(r.prompt_text);
        assert_null(r.bias);
        assert_int_equal(r.n_stop, 0);
    }
}

/* Nesting: bounded before cJSON recurses (deep input is a 400, not a crash). */
static void test_deep_nesting(void **state) {
    (void)state;
    size_t n = 200000;
    char *b = malloc(n + 1);
    assert_non_null(b);
    memset(b, '[', n);
    b[n] = 0;
    srv_request_t r;
    char msg[256];
    assert_int_equal(srv_request_parse(CHAT, b, n, NULL, &r, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "nested deeper than 32"));
    /* brackets inside strings do not count */
    const char *ok = "{\"messages\":[{\"role\":\"user\",\"content\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"}]}";
    assert_int_equal(parse(CHAT, ok, &r, msg, sizeof msg), 0);
    srv_request_free(&r);
    srv_limits_t lim = {0, 0, 3};
    const char *three = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\"]}";
    assert_int_equal(srv_request_parse(CHAT, three, strlen(three), &lim, &r, msg, sizeof msg), 0);
    srv_request_free(&r);
    const char *four = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}]}";
    assert_int_equal(srv_request_parse(CHAT, four, strlen(four), &lim, &r, msg, sizeof msg), 400);
    free(b);
}

static void test_message_limit(void **state) {
    (void)state;
    size_t n = 600;
    char *b = malloc(64 + n * 40);
    assert_non_null(b);
    size_t at = (size_t)sprintf(b, "{\"messages\":[");
    for (size_t i = 0; i < n; i++) at += (size_t)sprintf(b + at, "%s{\"role\":\"user\",\"content\":\"a\"}", i ? "," : "");
    sprintf(b + at, "]}");
    srv_request_t r;
    char msg[256];
    assert_int_equal(parse(CHAT, b, &r, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "600 messages, more than the limit of 512"));
    srv_limits_t lim = {1000, 0, 0};
    assert_int_equal(srv_request_parse(CHAT, b, strlen(b), &lim, &r, msg, sizeof msg), 0);
    assert_int_equal(r.n_msgs, 600);
    srv_request_free(&r);
    free(b);
}

/* ---- bodies that must be taken, and what they set ------------------------- */

static void test_good_chat(void **state) {
    (void)state;
    srv_request_t r;
    char msg[256];
    const char *b = "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                    "{\"role\":\"assistant\",\"content\":null},{\"role\":\"user\",\"content\":\"h\xc3\xa9\"}],"
                    "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.1,\"max_completion_tokens\":7,"
                    "\"stop\":[\"x\",\"yz\"],\"seed\":-1,\"presence_penalty\":0.5,\"frequency_penalty\":-1,"
                    "\"repeat_penalty\":1.1,\"logit_bias\":{\"5\":-100,\"17\":2.5},\"n\":1,\"logprobs\":true,"
                    "\"top_logprobs\":3,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                    "\"response_format\":{\"type\":\"text\"},\"session_id\":\"chat-1_A\",\"user\":\"u\",\"tools\":[],"
                    "\"unknown_field\":{\"deep\":[1,2,3]}}";
    assert_int_equal(parse(CHAT, b, &r, msg, sizeof msg), 0);
    assert_int_equal(r.kind, CHAT);
    assert_int_equal(r.n_msgs, 4);
    assert_string_equal(r.msgs[0].role, "system"); /* developer -> system */
    assert_string_equal(r.msgs[0].content, "be brief");
    assert_string_equal(r.msgs[1].content, "a\nb");
    assert_string_equal(r.msgs[2].role, "assistant");
    assert_string_equal(r.msgs[2].content, "");
    assert_string_equal(r.msgs[3].content, "h\xc3\xa9");
    assert_string_equal(r.model, "gpt-4o");
    assert_true(fabsf(r.samp.temp - 0.5f) < 1e-6f);
    assert_true(fabsf(r.samp.top_p - 0.9f) < 1e-6f);
    assert_int_equal(r.samp.top_k, 40);
    assert_true(fabsf(r.samp.min_p - 0.1f) < 1e-6f);
    assert_true(fabsf(r.samp.presence_penalty - 0.5f) < 1e-6f);
    assert_true(fabsf(r.samp.frequency_penalty + 1.0f) < 1e-6f);
    assert_true(fabsf(r.samp.repeat_penalty - 1.1f) < 1e-6f);
    assert_int_equal(r.max_tokens, 7);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yz");
    assert_int_equal(r.has_seed, 1);
    assert_true(r.samp.seed == UINT64_MAX); /* -1 as 64 bits */
    assert_int_equal(r.n_bias, 2);
    assert_int_equal(r.bias[0].token, 5);
    assert_true(r.bias[0].bias == -100.0f);
    assert_int_equal(r.bias[1].token, 17);
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 3);
    assert_int_equal(r.ignore_eos, 1);
    assert_int_equal(r.stream, 1);
    assert_int_equal(r.include_usage, 1);
    assert_string_equal(r.session, "chat-1_A");
    srv_request_free(&r);
    assert_null(r.msgs);
    assert_int_equal(r.n_msgs, 0);
}

static void test_defaults(void **state) {
    (void)state;
    srv_request_t r1, r2;
    char msg[256];
    const char *b = "{" M1 "}";
    assert_int_equal(parse(CHAT, b, &r1, msg, sizeof msg), 0);
    assert_int_equal(parse(CHAT, b, &r2, msg, sizeof msg), 0);
    /* OpenAI's defaults, not the CLI's */
    assert_true(r1.samp.temp == 1.0f);
    assert_true(r1.samp.top_p == 1.0f);
    assert_int_equal(r1.samp.top_k, 0);
    assert_true(r1.samp.min_p == 0.0f);
    assert_true(r1.samp.repeat_penalty == 1.0f);
    assert_true(r1.samp.presence_penalty == 0.0f && r1.samp.frequency_penalty == 0.0f);
    assert_int_equal(r1.max_tokens, 0);
    assert_int_equal(r1.stream, 0);
    assert_int_equal(r1.n_stop, 0);
    assert_string_equal(r1.session, "");
    assert_string_equal(r1.model, "");
    /* no seed: a random one per request */
    assert_int_equal(r1.has_seed, 0);
    assert_true(r1.samp.seed != r2.samp.seed);
    srv_request_free(&r1);
    srv_request_free(&r2);
    /* max_tokens and max_completion_tokens; null fields keep the default */
    assert_int_equal(parse(CHAT, "{" M1 ",\"max_tokens\":12,\"temperature\":null,\"stop\":null,\"seed\":null}", &r1, msg,
                           sizeof msg),
                     0);
    assert_int_equal(r1.max_tokens, 12);
    assert_true(r1.samp.temp == 1.0f);
    assert_int_equal(r1.has_seed, 0);
    srv_request_free(&r1);
    assert_int_equal(parse(CHAT, "{" M1 ",\"seed\":42,\"stop\":\"END\",\"top_k\":-1}", &r1, msg, sizeof msg), 0);
    assert_true(r1.samp.seed == 42 && r1.has_seed);
    assert_int_equal(r1.n_stop, 1);
    assert_string_equal(r1.stop[0], "END");
    assert_int_equal(r1.samp.top_k, 0);
    srv_request_free(&r1);
}

static void test_good_completion(void **state) {
    (void)state;
    srv_request_t r;
    char msg[256];
    assert_int_equal(parse(COMPL, "{\"prompt\":\"Once upon\",\"logprobs\":3,\"echo\":false,\"suffix\":null}", &r, msg,
                           sizeof msg),
                     0);
    assert_string_equal(r.prompt_text, "Once upon");
    assert_null(r.prompt_ids);
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 3);
    assert_int_equal(r.has_spec_n_max, 0);
    srv_request_free(&r);
    assert_int_equal(parse(COMPL, "{\"prompt\":\"x\",\"speculative.n_max\":0}", &r, msg, sizeof msg), 0);
    assert_int_equal(r.has_spec_n_max, 1);
    assert_int_equal(r.spec_n_max, 0);
    srv_request_free(&r);
    assert_int_equal(parse(COMPL, "{\"prompt\":[\"one\"]}", &r, msg, sizeof msg), 0);
    assert_string_equal(r.prompt_text, "one");
    srv_request_free(&r);
    assert_int_equal(parse(COMPL, "{\"prompt\":[1, 20, 300]}", &r, msg, sizeof msg), 0);
    assert_null(r.prompt_text);
    assert_int_equal(r.n_prompt, 3);
    assert_int_equal(r.prompt_ids[2], 300);
    srv_request_free(&r);
    /* chat-only fields mean nothing here and the other way round */
    assert_int_equal(parse(COMPL, "{\"prompt\":\"x\",\"messages\":5}", &r, msg, sizeof msg), 0);
    srv_request_free(&r);
    assert_int_equal(parse(CHAT, "{" M1 ",\"prompt\":5,\"echo\":true}", &r, msg, sizeof msg), 0);
    srv_request_free(&r);
}

/* ---- session ids and paths ------------------------------------------------- */

static void test_session_ids(void **state) {
    (void)state;
    assert_true(srv_session_id_valid("a"));
    assert_true(srv_session_id_valid("user-42_chat"));
    char id64[65], id65[66];
    memset(id64, 'x', 64), id64[64] = 0;
    memset(id65, 'x', 65), id65[65] = 0;
    assert_true(srv_session_id_valid(id64));
    assert_false(srv_session_id_valid(id65));
    const char *bad[] = {"", "..", ".", "../x", "/etc/passwd", "a/b", "a.b", "a b", "a\\b", "h\xc3\xa9", "a\n", "~"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (srv_session_id_valid(bad[i])) fail_msg("session id '%s' was taken", bad[i]);
    assert_false(srv_session_id_valid(NULL));
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_session_paths(void **state) {
    (void)state;
    char base[] = "/tmp/tern-test-sess-XXXXXX";
    assert_non_null(mkdtemp(base));
    char dir[PATH_MAX], outside[PATH_MAX], p[PATH_MAX + 64], q[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/sessions", base);
    snprintf(outside, sizeof outside, "%s/outside", base);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(mkdir(outside, 0700), 0);
    char msg[256], *path = NULL;

    /* absent file: fine, inside the resolved folder */
    assert_int_equal(srv_session_path(dir, "abc", &path, msg, sizeof msg), 0);
    char *rdir = realpath(dir, NULL);
    assert_non_null(rdir);
    snprintf(p, sizeof p, "%s/abc.tsess", rdir);
    assert_string_equal(path, p);
    free(path);
    /* an existing regular file: fine */
    write_file(p, "x");
    assert_int_equal(srv_session_path(dir, "abc", &path, msg, sizeof msg), 0);
    free(path);
    /* ids with .. or / never reach the file system */
    const char *bad[] = {"..", "../outside/secret", "/etc/passwd", "a/b", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        path = (char *)1;
        assert_int_equal(srv_session_path(dir, bad[i], &path, msg, sizeof msg), -1);
        assert_null(path);
        assert_non_null(strstr(msg, "session id"));
    }
    /* a symlink in the folder pointing outside it */
    snprintf(q, sizeof q, "%s/secret", outside);
    write_file(q, "secret");
    snprintf(p, sizeof p, "%s/evil.tsess", dir);
    assert_int_equal(symlink(q, p), 0);
    assert_int_equal(srv_session_path(dir, "evil", &path, msg, sizeof msg), -1);
    assert_null(path);
    assert_non_null(strstr(msg, "symbolic link"));
    /* a dangling symlink too (the scheduler would create the target) */
    snprintf(q, sizeof q, "%s/not-yet", outside);
    snprintf(p, sizeof p, "%s/dangle.tsess", dir);
    assert_int_equal(symlink(q, p), 0);
    assert_int_equal(srv_session_path(dir, "dangle", &path, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "symbolic link"));
    /* a folder, a FIFO */
    snprintf(p, sizeof p, "%s/d.tsess", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(srv_session_path(dir, "d", &path, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "not a regular file"));
    snprintf(p, sizeof p, "%s/f.tsess", dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(srv_session_path(dir, "f", &path, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "not a regular file"));
    /* a hard link to a file outside */
    snprintf(q, sizeof q, "%s/secret", outside);
    snprintf(p, sizeof p, "%s/hard.tsess", dir);
    if (link(q, p) == 0) {
        assert_int_equal(srv_session_path(dir, "hard", &path, msg, sizeof msg), -1);
        assert_non_null(strstr(msg, "hard links"));
    }
    /* the folder reached through a symlink resolves to the real one */
    snprintf(q, sizeof q, "%s/via-link", base);
    assert_int_equal(symlink(dir, q), 0);
    assert_int_equal(srv_session_path(q, "abc", &path, msg, sizeof msg), 0);
    snprintf(p, sizeof p, "%s/abc.tsess", rdir);
    assert_string_equal(path, p);
    free(path);
    /* a missing folder */
    snprintf(q, sizeof q, "%s/none", base);
    assert_int_equal(srv_session_path(q, "abc", &path, msg, sizeof msg), -1);
    assert_null(path);
    free(rdir);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    assert_int_equal(system(cmd), 0);
}

/* ---- prepare on the tiny trained model ------------------------------------- */

static tern_model_t *load_stories(void) {
    const char *p = tu_shared("models/stories260K.gguf");
    if (!p) {
        tu_shared_missing("models/stories260K.gguf", "test");
        return NULL;
    }
    tern_error_t err = {0};
    tern_model_t *m = tern_model_load(p, &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

static void test_prepare(void **state) {
    (void)state;
    tern_model_t *m = load_stories();
    if (!m) skip();
    int32_t nv = tern_model_n_vocab(m);
    srv_limits_t lim = {0, 2048, 0};
    srv_request_t r;
    char msg[256];

    /* a string prompt: tokenized with the model's BOS, special texts not parsed */
    assert_int_equal(parse(COMPL, "{\"prompt\":\"Once upon a time\"}", &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &lim, msg, sizeof msg), 0);
    int32_t *ids = NULL;
    size_t n = 0;
    tern_error_t err = {0};
    assert_int_equal(tern_tokenize(m, "Once upon a time", 16, tern_model_add_bos(m), 0, &ids, &n, &err), 0);
    assert_int_equal(r.n_prompt, (int32_t)n);
    assert_memory_equal(r.prompt_ids, ids, n * sizeof *ids);
    if (tern_model_add_bos(m)) assert_int_equal(r.prompt_ids[0], tern_token_bos(m));
    free(ids);
    srv_request_free(&r);

    /* chat: the template's rendering (ChatML for a model without one), special texts parsed */
    assert_int_equal(parse(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &lim, msg, sizeof msg), 0);
    char *text = NULL;
    tern_chat_msg_t cm = {"user", "Hi"};
    int rc = tern_chat_render(m, NULL, &cm, 1, 1, &text, &err);
    if (rc == TERN_EUNSUP) rc = tern_chat_render(m, "chatml", &cm, 1, 1, &text, &err);
    assert_int_equal(rc, 0);
    assert_int_equal(tern_tokenize(m, text, strlen(text), tern_model_add_bos(m), 1, &ids, &n, &err), 0);
    assert_int_equal(r.n_prompt, (int32_t)n);
    assert_memory_equal(r.prompt_ids, ids, n * sizeof *ids);
    for (int32_t i = 0; i < r.n_prompt; i++) assert_true(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < nv);
    free(ids);
    free(text);
    srv_request_free(&r);

    /* token arrays and logit_bias ids are checked against the vocabulary */
    char b[256];
    snprintf(b, sizeof b, "{\"prompt\":[1,2,%d]}", nv - 1);
    assert_int_equal(parse(COMPL, b, &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &lim, msg, sizeof msg), 0);
    assert_int_equal(r.n_prompt, 3);
    assert_int_equal(r.prompt_ids[2], nv - 1);
    srv_request_free(&r);
    snprintf(b, sizeof b, "{\"prompt\":[1,%d]}", nv);
    assert_int_equal(parse(COMPL, b, &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &lim, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "prompt[1]: token id"));
    assert_non_null(strstr(msg, "outside the vocabulary"));
    srv_request_free(&r);
    snprintf(b, sizeof b, "{\"prompt\":\"a\",\"logit_bias\":{\"%d\":1}}", nv);
    assert_int_equal(parse(COMPL, b, &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &lim, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "logit_bias: token id"));
    srv_request_free(&r);
    snprintf(b, sizeof b, "{\"prompt\":\"a\",\"logit_bias\":{\"%d\":1}}", nv - 1);
    assert_int_equal(parse(COMPL, b, &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &lim, msg, sizeof msg), 0);
    srv_request_free(&r);

    /* the prompt-token limit, with the numbers */
    srv_limits_t small = {0, 3, 0};
    assert_int_equal(parse(COMPL, "{\"prompt\":\"Once upon a time there was\"}", &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &small, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "more than the limit of 3"));
    srv_request_free(&r);
    assert_int_equal(parse(CHAT, "{" M1 "}", &r, msg, sizeof msg), 0);
    assert_int_equal(srv_request_prepare(m, &r, &small, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "messages: the prompt has"));
    srv_request_free(&r);
    tern_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_bodies),    cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_message_limit), cmocka_unit_test(test_good_chat),
        cmocka_unit_test(test_defaults),      cmocka_unit_test(test_good_completion),
        cmocka_unit_test(test_session_ids),   cmocka_unit_test(test_session_paths),
        cmocka_unit_test(test_prepare),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
