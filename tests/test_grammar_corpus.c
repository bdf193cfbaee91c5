/* test_grammar_corpus.c - the grammars of tests/grammars/ and their judges
 * (grammar_corpus.h, grammar_check.h), without the grammar engine: each
 * file is read by the test-only GBNF reader (gbnf_oracle.h, strict about
 * layout), which also decides membership through PCRE2. Checks: the good
 * and bad samples on both sides; random texts of each grammar pass its
 * checker; for the exact checkers, random mutations of texts get the same
 * verdict from the checker and from the grammar. So a checker that accepts
 * everything, or a grammar file that says something else than its checker,
 * fails here. Also the judges' own corner cases (strict JSON). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gbnf_oracle.h"
#include "grammar_corpus.h"
#include "testutil.h"

static gbnf_oracle_t *load(const grammar_corpus_t *c) {
    char path[1024], why[256];
    snprintf(path, sizeof path, "%s/%s", GRAMMAR_CORPUS_DIR, c->file);
    size_t len;
    char *text = tu_read_file(path, &len);
    if (!text) fail_msg("%s: cannot read", path);
    assert_true(len > 0);
    gbnf_oracle_t *g = gbnf_oracle_new(text, len, why, sizeof why);
    if (!g) fail_msg("%s: %s", c->file, why);
    free(text);
    return g;
}

static void test_files_parse(void **state) {
    (void)state;
    for (int i = 0; i < GRAMMAR_CORPUS_N; i++) {
        gbnf_oracle_t *g = load(&GRAMMAR_CORPUS[i]);
        assert_true(gbnf_oracle_rules(g) >= 1);
        gbnf_oracle_free(g);
    }
}

static void test_good_and_bad(void **state) {
    (void)state;
    for (int i = 0; i < GRAMMAR_CORPUS_N; i++) {
        const grammar_corpus_t *c = &GRAMMAR_CORPUS[i];
        gbnf_oracle_t *g = load(c);
        int n_good = 0, n_bad = 0;
        for (const char *const *s = c->good; *s; s++, n_good++) {
            if (c->check(*s, strlen(*s)) != 1) fail_msg("%s: checker refuses good sample \"%s\"", c->file, *s);
            if (gbnf_oracle_match(g, *s, strlen(*s)) != 1) fail_msg("%s: grammar refuses good sample \"%s\"", c->file, *s);
        }
        for (const char *const *s = c->bad; *s; s++, n_bad++) {
            if (c->check(*s, strlen(*s)) != 0) fail_msg("%s: checker accepts bad sample \"%s\"", c->file, *s);
            if (gbnf_oracle_match(g, *s, strlen(*s)) != 0) fail_msg("%s: grammar accepts bad sample \"%s\"", c->file, *s);
        }
        assert_true(n_good >= 3 && n_bad >= 5);
        gbnf_oracle_free(g);
    }
}

static void test_samples_pass_checkers(void **state) {
    (void)state;
    int n = tu_quick() ? 60 : 300;
    uint64_t rng = 12345;
    for (int i = 0; i < GRAMMAR_CORPUS_N; i++) {
        const grammar_corpus_t *c = &GRAMMAR_CORPUS[i];
        gbnf_oracle_t *g = load(c);
        int got = 0;
        for (int k = 0; k < n; k++) {
            size_t len;
            char *t = gbnf_oracle_sample(g, &rng, 4096, &len);
            if (!t) continue;
            got++;
            if (c->check(t, len) != 1) fail_msg("%s: checker refuses a text of the grammar: \"%s\"", c->file, t);
            int m = gbnf_oracle_match(g, t, len);
            if (m == 0) fail_msg("%s: a sample does not match its own grammar: \"%s\"", c->file, t);
            free(t);
        }
        if (got < n / 2) fail_msg("%s: only %d of %d samples", c->file, got, n);
        gbnf_oracle_free(g);
    }
}

/* One random edit of t (malloc'd result). */
static char *mutate(const char *t, size_t len, uint64_t *rng, size_t *out_len) {
    static const char *const bits[] = {" ", "\n", "  ", "(", ")", "-", "+", ";", "{", "}", ",", "\"", "\\", "0", "9",
                                       "a", "x", "=", "'", ".", "#", "*", "\t", "\xe3\x80\x82", "\xe3\x81\x82",
                                       "\xe3\x80\x8c", "O-O", "e4", "1. ", "int ", "if", "else ", "return", "[",
                                       "]", ":", "\xc3\xa9", "\r", "END", "!", "\xf0\x9f\x98\x80"};
    char *o = malloc(len + 64);
    assert_non_null(o);
    size_t p = len ? (size_t)(tu_rand(rng) % (len + 1)) : 0;
    const char *b = bits[tu_rand(rng) % (sizeof bits / sizeof *bits)];
    size_t bl = strlen(b), n = 0;
    switch (tu_rand(rng) % 4) {
    case 0: /* delete 1-3 bytes */ {
        size_t k = 1 + (size_t)(tu_rand(rng) % 3);
        if (p + k > len) k = len - p;
        memcpy(o, t, p);
        memcpy(o + p, t + p + k, len - p - k);
        n = len - k;
        break;
    }
    case 1: /* insert */
        memcpy(o, t, p);
        memcpy(o + p, b, bl);
        memcpy(o + p + bl, t + p, len - p);
        n = len + bl;
        break;
    case 2: /* replace one byte */
        memcpy(o, t, len);
        if (p < len) o[p] = b[0];
        n = len;
        break;
    default: /* truncate */
        memcpy(o, t, p);
        n = p;
        break;
    }
    o[n] = 0;
    *out_len = n;
    return o;
}

static void test_mutations_agree(void **state) {
    (void)state;
    int rounds = tu_quick() ? 150 : 800;
    uint64_t rng = 777;
    for (int i = 0; i < GRAMMAR_CORPUS_N; i++) {
        const grammar_corpus_t *c = &GRAMMAR_CORPUS[i];
        gbnf_oracle_t *g = load(c);
        int n_good = 0, agree_in = 0;
        while (c->good[n_good]) n_good++;
        for (int k = 0; k < rounds; k++) {
            size_t len;
            char *base;
            if (k % 2) {
                base = gbnf_oracle_sample(g, &rng, 2048, &len);
                if (!base) continue;
            } else {
                base = strdup(c->good[k / 2 % n_good]);
                len = strlen(base);
            }
            size_t ml;
            char *m = mutate(base, len, &rng, &ml);
            if (tu_rand(&rng) % 2) { /* a second edit */
                char *m2 = mutate(m, ml, &rng, &ml);
                free(m);
                m = m2;
            }
            int by_grammar = gbnf_oracle_match(g, m, ml), by_checker = c->check(m, ml);
            if (by_grammar == 1 && by_checker != 1)
                fail_msg("%s: the grammar accepts, the checker refuses: \"%s\"", c->file, m);
            if (c->exact && by_grammar == 0 && by_checker != 0)
                fail_msg("%s: the checker accepts, the grammar refuses: \"%s\"", c->file, m);
            agree_in += by_grammar == 1;
            free(m);
            free(base);
        }
        /* the mutations must hit both sides for this to mean anything */
        if (agree_in == 0 || agree_in == rounds) fail_msg("%s: %d of %d mutations in the language", c->file, agree_in, rounds);
        gbnf_oracle_free(g);
    }
}

/* The strict JSON scanner's corners, which cJSON alone would let through. */
static void test_json_strict(void **state) {
    (void)state;
    static const char *const good[] = {" {} ", "[1, -0, 0.5, 1e5, 1E-5, 2.5e+3]", "\"\\/\\b\\f\\r\\t\"",
                                       "{\"a\":{\"b\":[[[]]]}}", "\"\xf4\x8f\xbf\xbf\"", "-0", NULL};
    static const char *const bad[] = {"01", "-01", "1.e5", "1e", "-", "--1", "0x10", "Infinity", "NaN",
                                      "[1,,2]", "{\"a\":1 \"b\":2}", "{1:2}", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
                                      "\"\xf4\x90\x80\x80\"", "\"\\ud83d\\u0041\"", "\"\\uZZZZ\"", "[1]x", "tru",
                                      "\"\x01\"", NULL};
    for (const char *const *s = good; *s; s++)
        if (!check_json_value(*s, strlen(*s))) fail_msg("refused: %s", *s);
    for (const char *const *s = bad; *s; s++)
        if (check_json_value(*s, strlen(*s))) fail_msg("accepted: %s", *s);
    assert_true(check_json("{\"a\": 1}", 8));
    assert_false(check_json("[1]", 3));
    assert_false(check_json("1", 1));
    /* nesting: 512 levels pass, 513 do not */
    char deep[1100];
    for (int d = 512; d <= 513; d++) {
        memset(deep, '[', (size_t)d);
        memset(deep + d, ']', (size_t)d);
        assert_int_equal(check_json_value(deep, 2 * (size_t)d), d == 512);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_parse),          cmocka_unit_test(test_good_and_bad),
        cmocka_unit_test(test_samples_pass_checkers), cmocka_unit_test(test_mutations_agree),
        cmocka_unit_test(test_json_strict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
