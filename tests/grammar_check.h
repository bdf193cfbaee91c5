/*
 * grammar_check.h - independent judges of generated text, for tests of
 * grammar-constrained output. None of them uses the grammar engine or the
 * JSON-Schema converter: each re-states its language its own way (a strict
 * JSON scanner, a JSON Schema validator over cJSON, PCRE2 patterns,
 * recursive-descent parsers), so a bug in the engine or the converter shows
 * up as a text the checker refuses.
 *
 * Every function takes text + len (need not be NUL-terminated) and returns
 * 1 when the text is in the language, 0 when not.
 */
#ifndef TERN_GRAMMAR_CHECK_H
#define TERN_GRAMMAR_CHECK_H

#include <stddef.h>

/* Strict RFC 8259 JSON, one value with optional whitespace around it: no
 * trailing commas, leading zeros, "+", raw control characters in strings,
 * invalid escapes or invalid UTF-8. Also refused, as tern's grammars never
 * produce them: \u0000 and unpaired surrogate escapes. Nesting up to 512. */
int check_json_value(const char *text, size_t len);

/* check_json_value with an object at the top (response_format json_object). */
int check_json(const char *text, size_t len);

/* text is strict JSON (check_json_value) and valid under the JSON schema
 * (NUL-terminated): type (incl. lists; integer = a number with no fraction),
 * properties, required, additionalProperties (absent: anything, as JSON
 * Schema says), items, minItems, maxItems, enum, const (deep equality),
 * anyOf, oneOf (exactly one), $ref (#, #/pointer; siblings apply too),
 * minLength/maxLength (code points), minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum (numbers, or draft-4 booleans); annotations ignored. Any
 * other keyword makes it return 0 ("checker: unsupported keyword"), as does
 * a schema that is not valid JSON. why (may be NULL) gets the reason. */
int check_json_schema(const char *text, size_t len, const char *schema, char *why, size_t why_cap);

/* The languages of tests/grammars/ (grammar_corpus.h lists which judges which). */
int check_arithmetic(const char *text, size_t len); /* arithmetic.gbnf, recursive descent */
int check_list(const char *text, size_t len);       /* list.gbnf, PCRE2 */
int check_chess(const char *text, size_t len);      /* chess.gbnf, PCRE2 */
int check_japanese(const char *text, size_t len);   /* japanese.gbnf, PCRE2 (UTF) */
int check_c(const char *text, size_t len);          /* c.gbnf, recursive descent */
int check_features(const char *text, size_t len);   /* features.gbnf, PCRE2 */

#endif
