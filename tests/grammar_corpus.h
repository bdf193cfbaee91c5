/*
 * grammar_corpus.h - the grammars of tests/grammars/ and their judges, for
 * any test that wants to iterate over them (the grammar engine's tests:
 * parse each file, constrain generation with it, judge the output).
 *
 *   for (int i = 0; i < GRAMMAR_CORPUS_N; i++) {
 *       const grammar_corpus_t *g = &GRAMMAR_CORPUS[i];
 *       path: GRAMMAR_CORPUS_DIR "/" g->file
 *       g->check(text, len) == 1 for every text the grammar produces;
 *       every g->good[k] is in the grammar's language, no g->bad[k] is.
 *   }
 *
 * exact: 1 when the checker's language is exactly the grammar's (then a
 * text the checker accepts must also be accepted by the grammar); 0 when
 * the checker accepts more (json: any whitespace, any number length).
 * Link tests/grammar_check.c (the terngramcheck library in CMake).
 */
#ifndef TERN_GRAMMAR_CORPUS_H
#define TERN_GRAMMAR_CORPUS_H

#include <stddef.h>

#include "grammar_check.h"

#ifdef TERN_SOURCE_DIR
#define GRAMMAR_CORPUS_DIR TERN_SOURCE_DIR "/tests/grammars"
#endif

typedef struct {
    const char *file;                      /* under tests/grammars/ */
    int (*check)(const char *text, size_t len);
    int exact;
    const char *what;
    const char *const *good;               /* NULL-terminated */
    const char *const *bad;                /* NULL-terminated, "" included */
} grammar_corpus_t;

static const char *const GC_JSON_GOOD[] = {
    "{}", "[]", "0", "-1.5e+10", "true", "null",
    "\"a\\u00e9\\ud83d\\ude00 \\\" \\\\ \\n\"",
    "{\"a\": [1, 2, {\"b\": null}], \"c\": true}",
    "{\n  \"k\": \"v\",\n  \"n\": [\n    1\n  ]\n}",
    "\"\xe6\x97\xa5\xe6\x9c\xac\"",
    NULL};
static const char *const GC_JSON_BAD[] = {
    "", "{", "[1,]", "01", "+1", "\"\\u0000\"", "\"\\ud800\"", "\"\\udc00\"", "{\"a\" 1}", "nul",
    "\"tab\there\"", "[1] [2]", "{\"a\":1,}", "'x'", ".5", "1.", "\"\\x41\"",
    NULL};

static const char *const GC_ARITH_GOOD[] = {
    "1", "1 + 2", "(1+2)*3", "-(4.5 / 2) - -3", "( 7 )", "123456789.123456789", "1*2*3-4/5", "--1",
    NULL};
static const char *const GC_ARITH_BAD[] = {
    "", "1 +", "1  + 2", "+1", "(1", "1.", "1234567890", "a", "1 + 2 ", " 1", "()", "1 2", "(1))",
    NULL};

static const char *const GC_LIST_GOOD[] = {
    "- one\n",
    "# Title\n\n- a\n* b\n  - sub\n",
    "* \xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\n  * x\n  - y\n- z\n",
    "- a - b - c\n",
    NULL};
static const char *const GC_LIST_BAD[] = {
    "", "- a", "-a\n", "- a\n   - b\n", "# T\n- a\n", "-  a\n", "  - a\n", "+ a\n", "- a\n\n- b\n",
    NULL};

static const char *const GC_CHESS_GOOD[] = {
    "1. e4",
    "1. e4 e5 2. Nf3 Nc6 3. Bb5 a6",
    "12. O-O-O Qxd8+ 13. exd8=Q#",
    "1. Nbd2 R1e1 2. Qh4xe1 O-O",
    NULL};
static const char *const GC_CHESS_BAD[] = {
    "", "1.e4", "0. e4", "1. e9", "1. e4  e5", "1. Pe4", "1. e4 e5 f5", "1. O-O-O-O", "1. e4 ", "1. exd8=K",
    NULL};

static const char *const GC_JAPANESE_GOOD[] = {
    "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf\xe3\x80\x82", /* こんにちは。 */
    /* 今日は「晴れ」です！ */
    "\xe4\xbb\x8a\xe6\x97\xa5\xe3\x81\xaf\xe3\x80\x8c\xe6\x99\xb4\xe3\x82\x8c\xe3\x80\x8d\xe3\x81\xa7\xe3\x81\x99"
    "\xef\xbc\x81",
    /* カタカナ、ひらがな？ */
    "\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a\xe3\x80\x81\xe3\x81\xb2\xe3\x82\x89\xe3\x81\x8c\xe3\x81\xaa"
    "\xef\xbc\x9f",
    "\xe4\xba\xba\xe3\x80\x85\xe3\x80\x82\xf0\xa0\x80\x8b\xe3\x80\x82", /* 人々。𠀋。 */
    NULL};
static const char *const GC_JAPANESE_BAD[] = {
    "",
    "hello\xe3\x80\x82",                                              /* hello。 */
    "\xe3\x81\x93\xe3\x82\x93",                                       /* こん (no end) */
    "\xe3\x81\x93 \xe3\x80\x82",                                      /* こ 。 */
    "\xe3\x80\x8c\xe3\x80\x8d\xe3\x80\x82",                           /* 「」。 */
    "\xe3\x80\x81\xe3\x81\x82\xe3\x80\x82",                           /* 、あ。 */
    "\xe3\x81\x82\xe3\x80\x82\xe3\x80\x82",                           /* あ。。 */
    NULL};

static const char *const GC_C_GOOD[] = {
    "int x;",
    "int main() { return 0; }",
    "int add(int a, int b) {\n  int c = a + b;\n  return c;\n}\n",
    "void f() { if (x == 1) y = 2; else { while (!z) z = g(z, 'a'); } }",
    "float pi = 3.14;\nchar c = 'q';",
    "int f(){return(x);}",
    NULL};
static const char *const GC_C_BAD[] = {
    "", "int;", "int x", "x = 1;", "int main() { return 0 }", "int main( { }", "intx;", "int f() { if x; }",
    "int f() { 1 + ; }", "int f() { a & b; }", "int f() { else x; }", "int 1x;",
    NULL};

static const char *const GC_FEATURES_GOOD[] = {
    "REC07 Tag-name_1\nint:-42\nstr:\"a \\\"q\\\" \\\\ x\"\nEND!?\n",
    "REC00\tAb\nhex:A0F\r\ngreek:\xce\xb1\xce\xb2\xce\xb3\nsmile:\xf0\x9f\x98\x80\nEND",
    "REC12Zz\npair:\xc2\xab\n\xf0\x9f\x99\x82\nbrackets:[]]\nnot:!@#\xc3\xa9\nEND\n",
    NULL};
static const char *const GC_FEATURES_BAD[] = {
    "", "REC7 Tag\nint:1\nEND", "REC07 T\nint:1\nEND", "REC07 Tag\nEND", "REC07 Tag\nint:0\nEND",
    "REC07 Tag\nhex:B12\nEND", "REC07 Tag\nnot:abc\nEND", "REC07 Tag\nint:1\nint:1\nint:1\nint:1\nint:1\nEND",
    "REC07  Tag\nint:1\nEND", "REC07 Tag\nsmile:\xe2\x98\xba\nEND",
    NULL};

static const grammar_corpus_t GRAMMAR_CORPUS[] = {
    {"json.gbnf", check_json_value, 0, "any JSON value", GC_JSON_GOOD, GC_JSON_BAD},
    {"arithmetic.gbnf", check_arithmetic, 1, "arithmetic expressions", GC_ARITH_GOOD, GC_ARITH_BAD},
    {"list.gbnf", check_list, 1, "a bullet list", GC_LIST_GOOD, GC_LIST_BAD},
    {"chess.gbnf", check_chess, 1, "chess moves in SAN", GC_CHESS_GOOD, GC_CHESS_BAD},
    {"japanese.gbnf", check_japanese, 1, "Japanese sentences", GC_JAPANESE_GOOD, GC_JAPANESE_BAD},
    {"c.gbnf", check_c, 1, "a small C-like language", GC_C_GOOD, GC_C_BAD},
    {"features.gbnf", check_features, 1, "every GBNF syntax feature", GC_FEATURES_GOOD, GC_FEATURES_BAD},
};
#define GRAMMAR_CORPUS_N ((int)(sizeof GRAMMAR_CORPUS / sizeof GRAMMAR_CORPUS[0]))

#endif
