/*
 * grammar.h - GBNF grammars: parsing, a pushdown matcher over code points,
 * and the token masks a sampler needs (which ids of a vocabulary may come
 * next). The format, the matcher's model and the cost of a mask are
 * described at the top of grammar.c.
 *
 * Objects:
 *   grammar_t   the compiled rules of one GBNF text; after grammar_bind it
 *               also holds, per character position, which tokens of the
 *               vocabulary that position decides alone. Immutable once
 *               bound: any number of matchers on any threads may share it.
 *   gvocab_t    a vocabulary's token bytes as a sorted byte trie (built once
 *               per tokenizer, shared by every grammar of that model).
 *   gmatcher_t  one generation's parse state (a set of parse stacks) plus a
 *               memo of masks by state. Used by one thread at a time.
 */
#ifndef TERN_TEXT_GRAMMAR_H
#define TERN_TEXT_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern_error.h"
#include "text/tokenizer.h"

typedef struct grammar grammar_t;
typedef struct gvocab gvocab_t;
typedef struct gmatcher gmatcher_t;

/* Limits (hostile grammars get a clear error, never an endless loop). */
#define GRAMMAR_MAX_TEXT (8u << 20)   /* bytes of GBNF */
#define GRAMMAR_MAX_NEST 64           /* ( ) nesting */
#define GRAMMAR_MAX_REPEAT 10000      /* m and n of {m,n} */
#define GRAMMAR_MAX_ELEMS (4u << 20)  /* elements after expanding repetitions */
#define GRAMMAR_MAX_RULES 65536
#define GRAMMAR_MAX_CHAIN 256         /* rules entered at one point without a character between */
#define GRAMMAR_MAX_DEPTH 1024        /* parse stack depth while matching (nesting of the text) */
#define GRAMMAR_MAX_STACKS 4096       /* parses alive at once (ambiguity) */
#define GRAMMAR_MAX_PIECE 1024        /* longer token texts are never allowed under a grammar */

/* Parse and check GBNF (len bytes, need not be NUL-terminated). root: the
 * start rule's name (NULL: "root"). Errors name the line and column:
 * TERN_EINVAL for a syntax error, an undefined rule, left recursion, a
 * limit passed. */
grammar_t *grammar_parse(const char *text, size_t len, const char *root, tern_error_t *err);
void grammar_free(grammar_t *g);
int32_t grammar_n_rules(const grammar_t *g);
int32_t grammar_n_elems(const grammar_t *g);

/* The vocabulary trie of a tokenizer. eog ids are the only control tokens
 * a grammar lets through (when its parse is complete). */
gvocab_t *gvocab_build(const tokenizer_t *t, tern_error_t *err);
void gvocab_free(gvocab_t *v);
int32_t gvocab_n_vocab(const gvocab_t *v);

/* Attach a vocabulary (borrowed: it must outlive g) and precompute, for
 * every character position of the grammar, the tokens it accepts or
 * rejects on its own (grammar.c: "token classes"). */
int grammar_bind(grammar_t *g, const gvocab_t *v, tern_error_t *err);
double grammar_bind_ms(const grammar_t *g);

/* A matcher at the grammar's start (g bound). */
const grammar_t *gmatcher_grammar(const gmatcher_t *m);
gmatcher_t *gmatcher_create(const grammar_t *g, tern_error_t *err);
void gmatcher_free(gmatcher_t *m);
void gmatcher_reset(gmatcher_t *m);
/* dst takes src's parse state (both of the same grammar); the memo stays. */
int gmatcher_copy(gmatcher_t *dst, const gmatcher_t *src, tern_error_t *err);
/* Advance by one token: 0, or TERN_EINVAL (not allowed here; m unchanged). */
int gmatcher_accept(gmatcher_t *m, int32_t id, tern_error_t *err);
/* Advance by raw bytes (tests, forced text): 0 or TERN_EINVAL (unchanged). */
int gmatcher_accept_bytes(gmatcher_t *m, const char *s, size_t n, tern_error_t *err);
/* Whether id may come next (no mask computed). */
bool gmatcher_allows(gmatcher_t *m, int32_t id);
/* The parse is complete here (end-of-generation tokens allowed). */
bool gmatcher_done(const gmatcher_t *m);
/* Nothing but the end can follow (the text is finished). */
bool gmatcher_finished(const gmatcher_t *m);
/* The allowed ids as a bitset of (n_vocab + 63) / 64 words; the pointer
 * stays valid until the next call on m. NULL: out of memory. */
const uint64_t *gmatcher_mask(gmatcher_t *m);
/* Bytes every continuation must start with (the grammar admits exactly one
 * next character, repeatedly), at most cap; returns the count. */
size_t gmatcher_forced(gmatcher_t *m, char *buf, size_t cap);

/* Keep (default) or skip the memo of masks by state (benchmarks measure
 * the cost of a mask computed afresh with it off). */
void gmatcher_set_memo(gmatcher_t *m, bool on);

typedef struct {
    uint64_t masks, memo_hits, uncertain_checked, full_walks;
} gmatcher_stats_t;
void gmatcher_stats(const gmatcher_t *m, gmatcher_stats_t *st);

#endif
