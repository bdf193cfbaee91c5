/*
 * gbnf_oracle.h - a test-only reading of GBNF, independent of the grammar
 * engine (src/text/grammar.c): a grammar is parsed into a small tree, then
 *
 *   - translated into one PCRE2 pattern (each rule a named group in a
 *     DEFINE block, references as recursive calls), so PCRE2's matcher
 *     decides whether a text is in the grammar's language;
 *   - sampled: random texts of the language, for soundness tests (every
 *     sample must satisfy the independent checkers of grammar_check.h).
 *
 * The parser follows the GBNF layout rules strictly (a rule continues on a
 * new line only after "::=", after "|" or inside parentheses), so a corpus
 * file it accepts is also well-formed for llama.cpp-style parsers. It
 * refuses undefined rules and a missing root. Left-recursive grammars are
 * refused by PCRE2 ("recursive call could loop indefinitely").
 */
#ifndef TERN_GBNF_ORACLE_H
#define TERN_GBNF_ORACLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct gbnf_oracle gbnf_oracle_t;

/* Parses and compiles len bytes of GBNF; NULL with a reason in why. */
gbnf_oracle_t *gbnf_oracle_new(const char *gbnf, size_t len, char *why, size_t why_cap);
void gbnf_oracle_free(gbnf_oracle_t *g);

/* 1 when the text reads as GBNF (every rule defined, a root), without
 * compiling it (PCRE2 cannot hold very large grammars); 0 with why. */
int gbnf_oracle_syntax(const char *gbnf, size_t len, char *why, size_t why_cap);

/* 1 when the whole text is in the language, 0 when not, -1 when PCRE2
 * could not decide (match or depth limit). */
int gbnf_oracle_match(const gbnf_oracle_t *g, const char *text, size_t len);

/* A random text of the language (malloc'd, NUL-terminated, *len set), or
 * NULL when no sample of at most max_len bytes came out in a few tries.
 * Repetitions are drawn short; past a nesting budget the sampler takes the
 * shallowest way out, so it terminates on recursive grammars. */
char *gbnf_oracle_sample(const gbnf_oracle_t *g, uint64_t *rng, size_t max_len, size_t *len);

/* Number of rules; the PCRE2 pattern (for messages). */
int gbnf_oracle_rules(const gbnf_oracle_t *g);
const char *gbnf_oracle_pattern(const gbnf_oracle_t *g);

#endif
