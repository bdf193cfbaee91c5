/* test_grammar.c - the GBNF engine (src/text/grammar.c): parsing, hostile
 * grammars, matching text, masks against a token-by-token check on real
 * vocabularies, and the sampler's shortcut against the whole mask. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "format/gguf.h"
#include "text/grammar.h"
#include "text/sampler.h"
#include "text/tokenizer.h"
#include "tern.h"

static const char *JSON_G =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" char* \"\\\"\" ws\n"
    "char   ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "number ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15}) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "ws     ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *ARITH_G = "root ::= expr\n"
                             "expr ::= term (ws [-+] ws term)*\n"
                             "term ::= factor (ws [*/] ws factor)*\n"
                             "factor ::= num | \"(\" ws expr ws \")\"\n"
                             "num ::= [0-9]+\n"
                             "ws ::= [ ]?\n";

/* Every syntax feature once. */
static const char *FEATURES_G =
    "# a comment line\n"
    "root ::= greeting sep tail   # trailing comment\n"
    "greeting ::= (\"hi\" | \"hello\"\n"
    "             | \"hey\")\n"
    "sep ::= [,;] \" \"?\n"
    "tail ::= digits{2} letters{1,} any{0,2} rng{,2} neg esc kana\n"
    "digits ::= [0-9]\n"
    "letters ::= [a-zA-Z_]\n"
    "any ::= .\n"
    "rng ::= [x-z]\n"
    "neg ::= [^\\n\\x00-\\x2F]\n"
    "esc ::= \"\\x41\\u00e9\\U0001F600\\t\"\n"
    "kana ::= [\\u3041-\\u3096]+\n"
    "  | \"!\"\n";

static gvocab_t *load_vocab(const char *rel, tokenizer_t **tok_out) {
    const char *path = tu_shared(rel);
    if (!path) return NULL;
    tern_error_t err;
    tokenizer_t *t = tu_tokenizer_load(path);
    gvocab_t *v = gvocab_build(t, &err);
    assert_non_null(v);
    *tok_out = t;
    return v;
}

static grammar_t *compile(const char *text, const gvocab_t *v) {
    tern_error_t err = {0};
    grammar_t *g = grammar_parse(text, strlen(text), NULL, &err);
    if (!g) fail_msg("grammar did not parse: %s", err.msg);
    if (v && grammar_bind(g, v, &err)) fail_msg("bind: %s", err.msg);
    return g;
}

/* A vocabulary is needed for a matcher; the BPE one is used for text tests. */
static tokenizer_t *g_tok;
static gvocab_t *g_voc;

static int setup(void **st) {
    (void)st;
    g_voc = load_vocab("reference/vocab/ggml-vocab-llama-bpe.gguf", &g_tok);
    return 0;
}
static int teardown(void **st) {
    (void)st;
    gvocab_free(g_voc);
    tok_free(g_tok);
    return 0;
}

#define NEED_VOCAB()                                                                          \
    if (!g_voc) {                                                                             \
        tu_shared_missing("reference/vocab/ggml-vocab-llama-bpe.gguf", "test");              \
        skip();                                                                               \
    }

/* 1: the whole text matches (complete); 0: rejected or incomplete. */
static int matches(const grammar_t *g, const char *text) {
    tern_error_t err;
    gmatcher_t *m = gmatcher_create(g, &err);
    assert_non_null(m);
    int ok = gmatcher_accept_bytes(m, text, strlen(text), &err) == 0 && gmatcher_done(m);
    gmatcher_free(m);
    return ok;
}

static void test_text_matching(void **st) {
    (void)st;
    NEED_VOCAB();
    grammar_t *g = compile(FEATURES_G, g_voc);
    assert_true(matches(g, "hi, 42abc\xc3\xa9xzA\x41\xc3\xa9\xf0\x9f\x98\x80\t\xe3\x81\x82\xe3\x81\x84"));
    assert_true(matches(g, "hey;12Z!!BA\xc3\xa9\xf0\x9f\x98\x80\t!"));
    assert_true(matches(g, "hello,00_QA\xc3\xa9\xf0\x9f\x98\x80\t\xe3\x81\x82"));
    assert_false(matches(g, "hello,0_Q\xc3\xa9\xf0\x9f\x98\x80\t\xe3\x81\x82"));  /* digits{2} */
    assert_false(matches(g, "hi, 42abc/A\xc3\xa9\xf0\x9f\x98\x80\t!"));             /* no split of "/A" fits */
    assert_false(matches(g, "yo, 42abcQ\xc3\xa9\xf0\x9f\x98\x80\t!"));
    assert_false(matches(g, "hi, 42abcxyz\nA\xc3\xa9\xf0\x9f\x98\x80\t!")); /* neg refuses the newline */
    grammar_free(g);

    g = compile(ARITH_G, g_voc);
    assert_true(matches(g, "1+2*(3 - 4)/5"));
    assert_true(matches(g, "((7))"));
    assert_false(matches(g, "1+"));
    assert_false(matches(g, "(1"));
    assert_false(matches(g, "1 ++ 2"));
    grammar_free(g);

    g = compile(JSON_G, g_voc);
    assert_true(matches(g, "{\"a\": [1, 2.5e3, \"x\\u00e9\", true, null, {\"b\": {}}]}"));
    assert_true(matches(g, "{}"));
    assert_false(matches(g, "{\"a\": 01}"));
    assert_false(matches(g, "{\"a\" 1}"));
    assert_false(matches(g, "[1]"));
    assert_false(matches(g, "{\"a\": \"\x01\"}"));
    grammar_free(g);

    /* "[^]" excludes nothing: any one character (an empty range list, which
     * once reached qsort as a null pointer; found by fuzz_grammar). */
    g = compile("root ::= \"<\" [^] [^]* \">\"\n", g_voc);
    assert_true(matches(g, "<a>"));
    assert_true(matches(g, "<\xc3\xa9]\n\xf0\x9f\x98\x80>"));
    assert_false(matches(g, "<>"));
    grammar_free(g);
}

/* Hostile and broken grammars: each a clear error naming what is wrong. */
static void test_hostile_grammars(void **st) {
    (void)st;
    static const struct {
        const char *text;
        const char *want; /* substring of the message */
    } cases[] = {
        {"", "no rule named 'root'"},
        {"root ::= foo\n", "undefined rule 'foo'"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
        {"root ::= root \"a\" | \"b\"\n", "left recursion"},
        {"root ::= a\na ::= b \"x\"\nb ::= c\nc ::= a | \"y\"\n", "left recursion"},
        {"root ::= (\"a\"?)*\n", "left recursion"},
        {"root ::= x* \"a\"\nx ::= \"b\"?\n", "left recursion"},
        {"root ::= \"abc\n", "unterminated literal"},
        {"root ::= [abc\n", "unterminated character class"},
        {"root ::= [z-a]\n", "reversed"},
        {"root ::= []\n", "empty character class"},
        {"root ::= \"a\"{100000}\n", "repetition count over"},
        {"root ::= \"a\"{5,2}\n", "below the minimum"},
        {"root ::= \"a\"{3\n", "expected '}'"},
        {"root ::= * \"a\"\n", "nothing before it"},
        {"root ::= \"\\q\"\n", "unknown escape"},
        {"root ::= \"\\x4\"\n", "hex digits"},
        {"root ::= \"\\U00110000\"\n", "beyond U+10FFFF"},
        {"root ::= (\"a\"\n", "expected ')'"},
        {"root := \"a\"\n", "expected '::='"},
        {"root ::= \"a\" ) \n", "unexpected ')'"},
        {"root ::= \"\xff\"\n", "invalid UTF-8"},
        {"root ::= \"a\"{1000}{1000}{1000}\n", "nothing before it"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tern_error_t err = {0};
        grammar_t *g = grammar_parse(cases[i].text, strlen(cases[i].text), NULL, &err);
        if (g) fail_msg("case %zu parsed but should fail: %s", i, cases[i].text);
        if (!strstr(err.msg, cases[i].want)) fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err.msg, cases[i].want);
        if (strncmp(cases[i].text, "", 1) && !strstr(err.msg, "line") && !strstr(err.msg, "root"))
            fail_msg("case %zu: no position in \"%s\"", i, err.msg);
    }
    /* nesting beyond the bound */
    char deep[2048];
    size_t k = (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 200; i++) deep[k++] = '(';
    deep[k++] = '"';
    deep[k++] = 'a';
    deep[k++] = '"';
    for (int i = 0; i < 200; i++) deep[k++] = ')';
    deep[k] = 0;
    tern_error_t err;
    assert_null(grammar_parse(deep, k, NULL, &err));
    assert_non_null(strstr(err.msg, "nested deeper"));
    /* a chain of rules entered without a character */
    size_t cap = 1 << 16;
    char *chain = malloc(cap);
    k = (size_t)snprintf(chain, cap, "root ::= r0\n");
    for (int i = 0; i < 400; i++) k += (size_t)snprintf(chain + k, cap - k, "r%d ::= r%d\n", i, i + 1);
    k += (size_t)snprintf(chain + k, cap - k, "r400 ::= \"x\"\n");
    assert_null(grammar_parse(chain, k, NULL, &err));
    assert_non_null(strstr(err.msg, "chain"));
    /* expanded repetitions past the element or rule bound */
    k = (size_t)snprintf(chain, cap, "root ::= r0\n");
    for (int i = 0; i < 120; i++) k += (size_t)snprintf(chain + k, cap - k, "r%d ::= \"a\"{0,10000} r%d\n", i, i + 1);
    k += (size_t)snprintf(chain + k, cap - k, "r120 ::= \"x\"\n");
    assert_null(grammar_parse(chain, k, NULL, &err));
    assert_true(strstr(err.msg, "elements") || strstr(err.msg, "rules"));
    free(chain);
    /* the line and column of an error */
    const char *bad = "root ::= \"a\"\nx ::= \"b\" ]\n";
    assert_null(grammar_parse(bad, strlen(bad), NULL, &err));
    assert_non_null(strstr(err.msg, "line 2, column 11"));
}

/* Deep nesting of the TEXT is bounded while matching, never a crash. */
static void test_deep_text(void **st) {
    (void)st;
    NEED_VOCAB();
    grammar_t *g = compile(ARITH_G, g_voc);
    tern_error_t err;
    gmatcher_t *m = gmatcher_create(g, &err);
    int rejected_at = -1;
    for (int i = 0; i < 5000; i++)
        if (gmatcher_accept_bytes(m, "(", 1, &err)) {
            rejected_at = i;
            break;
        }
    assert_true(rejected_at > 100 && rejected_at < 5000);
    gmatcher_free(m);
    grammar_free(g);
}

/* The mask equals asking about every token one by one, along random walks
 * through the grammar, on vocabularies of each kind. */
static void check_masks(const char *rel, const char *gtext, int walks, int steps) {
    tokenizer_t *t = NULL;
    gvocab_t *v = load_vocab(rel, &t);
    if (!v) {
        tu_shared_missing(rel, "part");
        return;
    }
    grammar_t *g = compile(gtext, v);
    const int32_t V = gvocab_n_vocab(v);
    uint64_t rng = 0x1234;
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    tern_error_t err;
    long checked = 0;
    for (int w = 0; w < walks; w++) {
        gmatcher_t *m = gmatcher_create(g, &err);
        assert_non_null(m);
        for (int s = 0; s < steps; s++) {
            const uint64_t *bits = gmatcher_mask(m);
            assert_non_null(bits);
            int32_t n = 0;
            const bool brute = s < 3 || s % 4 == 0;
            for (int32_t i = 0; i < V; i++) {
                bool b = bits[i >> 6] >> (i & 63) & 1;
                if (brute && b != gmatcher_allows(m, i)) {
                    size_t l;
                    fail_msg("%s: walk %d step %d: token %d '%s': mask %d, check %d", rel, w, s, i, tok_piece(t, i, &l), b,
                             !b);
                }
                if (b) ids[n++] = i;
            }
            checked += brute;
            if (!n) break;
            /* prefer short tokens half the time so walks go deep */
            int32_t pick = ids[tu_rand(&rng) % (uint64_t)n];
            if (tu_rand(&rng) & 1)
                for (int tries = 0; tries < 8; tries++) {
                    int32_t c = ids[tu_rand(&rng) % (uint64_t)n];
                    size_t l1, l2;
                    tok_piece(t, c, &l1);
                    tok_piece(t, pick, &l2);
                    if (l1 < l2) pick = c;
                }
            if (tok_is_eog(t, pick)) {
                assert_true(gmatcher_done(m));
                assert_int_equal(gmatcher_accept(m, pick, &err), 0);
                assert_true(gmatcher_finished(m));
                break;
            }
            assert_int_equal(gmatcher_accept(m, pick, &err), 0);
        }
        gmatcher_free(m);
    }
    assert_true(checked > 0);
    free(ids);
    grammar_free(g);
    gvocab_free(v);
    tok_free(t);
}

static const char *ONE_G = "root ::= \"The answer is \" [0-9]{1,3} \".\"\n";
static const char *JP_G = "root ::= jp+ \"\\u3002\"\njp ::= [\\u3041-\\u3096] | [\\u30A1-\\u30FA] | [\\u4E00-\\u9FFF] | \"\\u3001\"\n";

static void test_masks_bpe(void **st) {
    (void)st;
    int q = tu_quick();
    check_masks("reference/vocab/ggml-vocab-llama-bpe.gguf", JSON_G, q ? 2 : 4, q ? 30 : 60);
    check_masks("reference/vocab/ggml-vocab-llama-bpe.gguf", ARITH_G, 2, 25);
    check_masks("reference/vocab/ggml-vocab-llama-bpe.gguf", JP_G, 2, 20);
}

static void test_masks_qwen_spm(void **st) {
    (void)st;
    int q = tu_quick();
    check_masks("reference/vocab/ggml-vocab-qwen2.gguf", JSON_G, q ? 1 : 3, q ? 30 : 50);
    check_masks("reference/vocab/ggml-vocab-qwen2.gguf", ONE_G, 2, 12);
    check_masks("reference/vocab/ggml-vocab-llama-spm.gguf", JSON_G, q ? 1 : 3, q ? 30 : 50);
    check_masks("reference/vocab/ggml-vocab-llama-spm.gguf", JP_G, 2, 20);
}

/* The sampler's shortcut (asking the matcher about the best candidates
 * only) picks exactly what the whole mask would, greedy and with top-k. */
static int full_mask_cb(void *user, tern_token_logit_t *c, int32_t n) {
    gmatcher_t *m = user;
    const uint64_t *bits = gmatcher_mask(m);
    if (!bits) return 1;
    for (int32_t i = 0; i < n; i++) {
        uint32_t id = (uint32_t)c[i].id;
        if (!(bits[id >> 6] >> (id & 63) & 1)) c[i].logit = -INFINITY;
    }
    return 0;
}

static void test_sampler_shortcut(void **st) {
    (void)st;
    NEED_VOCAB();
    grammar_t *g = compile(JSON_G, g_voc);
    const int32_t V = gvocab_n_vocab(g_voc);
    float *logits = malloc((size_t)V * sizeof *logits);
    tern_error_t err;
    uint64_t rng = 99;
    for (int mode = 0; mode < 3; mode++) {
        tern_sampler_params_t p = {.temp = mode ? 0.8f : 0.0f, .top_k = mode == 2 ? 5 : 40, .top_p = 0.95f,
                                   .min_p = 0.05f, .repeat_penalty = 1.1f, .repeat_last_n = 16, .seed = 7};
        sampler_t *a = sampler_create(&p, V, &err), *b = sampler_create(&p, V, &err);
        gmatcher_t *ma = gmatcher_create(g, &err), *mb = gmatcher_create(g, &err);
        sampler_set_matcher(a, ma);
        sampler_set_mask(b, full_mask_cb, mb);
        int shortcut_misses = 0;
        for (int s = 0; s < 80; s++) {
            for (int32_t i = 0; i < V; i++) logits[i] = tu_randn(&rng) * 3.0f;
            /* make some grammar-forbidden tokens the best ones */
            for (int k = 0; k < 10; k++) logits[tu_rand(&rng) % (uint64_t)V] = 30.0f + (float)k;
            gmatcher_stats_t s0, s1;
            gmatcher_stats(ma, &s0);
            int32_t x = sampler_sample(a, logits), y = sampler_sample(b, logits);
            gmatcher_stats(ma, &s1);
            shortcut_misses += s1.masks > s0.masks;
            assert_int_equal(x, y);
            assert_true(x >= 0);
            if (tok_is_eog(g_tok, x)) break;
            sampler_accept(a, x);
            sampler_accept(b, y);
            assert_int_equal(gmatcher_accept(ma, x, &err), 0);
            assert_int_equal(gmatcher_accept(mb, y, &err), 0);
        }
        /* the shortcut decided most samples without a whole mask */
        assert_true(shortcut_misses < 40);
        sampler_free(a);
        sampler_free(b);
        gmatcher_free(ma);
        gmatcher_free(mb);
    }
    free(logits);
    grammar_free(g);
}

/* Forced text: where one continuation is possible. */
static void test_forced(void **st) {
    (void)st;
    NEED_VOCAB();
    grammar_t *g = compile("root ::= \"{\\\"name\\\": \\\"\" [a-z]+ \"\\\", \\\"age\\\": \" [0-9]+ \"}\"\n", g_voc);
    tern_error_t err;
    gmatcher_t *m = gmatcher_create(g, &err);
    char buf[64];
    size_t n = gmatcher_forced(m, buf, sizeof buf);
    assert_int_equal(n, 10);
    assert_memory_equal(buf, "{\"name\": \"", 10);
    assert_int_equal(gmatcher_accept_bytes(m, buf, n, &err), 0);
    assert_int_equal(gmatcher_forced(m, buf, sizeof buf), 0);
    assert_int_equal(gmatcher_accept_bytes(m, "bob", 3, &err), 0);
    assert_int_equal(gmatcher_forced(m, buf, sizeof buf), 0); /* more letters or the quote */
    assert_int_equal(gmatcher_accept_bytes(m, "\"", 1, &err), 0);
    n = gmatcher_forced(m, buf, sizeof buf);
    assert_int_equal(n, 9);
    assert_memory_equal(buf, ", \"age\": ", 9);
    gmatcher_free(m);
    grammar_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_grammars), cmocka_unit_test(test_text_matching),
        cmocka_unit_test(test_deep_text),        cmocka_unit_test(test_masks_bpe),
        cmocka_unit_test(test_masks_qwen_spm),   cmocka_unit_test(test_sampler_shortcut),
        cmocka_unit_test(test_forced),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
