/*
 * json_schema.h - JSON Schema to GBNF, for grammar-constrained output
 * (response_format json_schema / json_object of the server).
 *
 * The grammar describes JSON text that the schema accepts: every string it
 * matches is valid under the schema (the grammar may be narrower than the
 * schema, never wider). What it accepts and refuses is listed at the top of
 * tools/json_schema.c; anything else in a schema is an error that names the
 * keyword and its JSON pointer, never silently ignored.
 *
 * Needs cJSON (built into ternsrvreq, where the server is built).
 */
#ifndef TERN_JSON_SCHEMA_H
#define TERN_JSON_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "tern_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits (the error messages name them). */
#define TERN_JS_MAX_INPUT (4u << 20)  /* schema text, bytes */
#define TERN_JS_MAX_OUTPUT (4u << 20) /* GBNF text, bytes */
#define TERN_JS_MAX_DEPTH 64          /* schemas inside schemas ($ref steps count) */
#define TERN_JS_MAX_JSON_DEPTH 256    /* [ and { nesting of the schema text */
#define TERN_JS_MAX_COUNT 10000       /* minLength, maxLength, minItems, maxItems */
#define TERN_JS_MAX_ALTS 10000        /* values of an enum, branches of an anyOf/oneOf */

/* GBNF text for a JSON schema (len bytes of JSON, need not be NUL-terminated).
 * Returns 0 and *out (malloc'd, NUL-terminated; the caller frees), or a
 * negative TERN_E* code with *out = NULL and err filled: TERN_EINVAL for
 * invalid JSON or a malformed schema, TERN_EUNSUP for a keyword or form that
 * is valid JSON Schema but not supported, TERN_ENOMEM. Messages start with
 * "json schema: " and end with " at <JSON pointer>" where one applies. */
int tern_json_schema_to_gbnf(const char *schema, size_t len, char **out, tern_error_t *err);

/* GBNF of any JSON value whose top level is an object (response_format
 * json_object): the same value, string, number and whitespace rules as the
 * converter's output. Static storage. */
const char *tern_json_object_gbnf(void);

/* The GBNF expression (no rule name, no trailing newline) for the canonical
 * decimal spellings of the integers in [lo, hi]: no leading zeros, no "+",
 * no "-0". |lo|, |hi| <= 2^53 and lo <= hi; otherwise returns TERN_EINVAL.
 * *out is malloc'd. The converter's integer rules are made of it; exposed so
 * tests can check it on its own. */
int tern_json_int_range_gbnf(int64_t lo, int64_t hi, char **out);

#ifdef __cplusplus
}
#endif
#endif /* TERN_JSON_SCHEMA_H */
