/*
 * fuzz_server_json_schema.c - libFuzzer target for the JSON Schema to GBNF
 * converter (tern_json_schema_to_gbnf, tools/json_schema.c).
 *
 * Input: the schema text. Checks: no crash, leak or sanitizer report; a
 * refusal is TERN_EINVAL, TERN_EUNSUP or TERN_ENOMEM with *out NULL and a
 * message "json schema: ..."; an accepted schema gives ASCII GBNF within
 * the output bound, starting with the root rule, that the test-only GBNF
 * reader (tests/gbnf_oracle.c) reads with every rule defined. For a small
 * grammar without oneOf (whose exclusivity the grammar does not express)
 * a few random texts of the grammar must also be valid under the schema
 * (tests/grammar_check.c: check_json_schema).
 *
 * Seeds: fuzz/seeds/fuzz_server_json_schema/; dictionary: the keywords.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gbnf_oracle.h"
#include "grammar_check.h"
#include "json_schema.h"

#define CHECK(c)                                                                        \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "fuzz_server_json_schema: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                                    \
        }                                                                               \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *schema = (const char *)data;
    char *out = (char *)1;
    tern_error_t err;
    int rc = tern_json_schema_to_gbnf(schema, size, &out, &err);
    if (rc) {
        CHECK(rc == TERN_EINVAL || rc == TERN_EUNSUP || rc == TERN_ENOMEM);
        CHECK(out == NULL);
        CHECK(err.code == rc);
        CHECK(!strncmp(err.msg, "json schema: ", 13));
        CHECK(memchr(err.msg, 0, sizeof err.msg) != NULL);
        return 0;
    }
    CHECK(out != NULL);
    size_t n = strlen(out);
    CHECK(n <= TERN_JS_MAX_OUTPUT);
    CHECK(!strncmp(out, "root ::= ", 9));
    for (size_t i = 0; i < n; i++) CHECK((unsigned char)out[i] < 0x80 && (out[i] >= 0x20 || out[i] == '\n'));
    char why[300];
    if (!gbnf_oracle_syntax(out, n, why, sizeof why)) {
        fprintf(stderr, "fuzz_server_json_schema: %s\n%s\n", why, out);
        abort();
    }
    /* soundness on a small grammar: its random texts satisfy the schema */
    if (n < 16384 && size < 4096 && !memmem(schema, size, "oneOf", 5)) {
        char *text = malloc(size + 1);
        CHECK(text != NULL);
        memcpy(text, schema, size);
        text[size] = 0;
        gbnf_oracle_t *g = gbnf_oracle_new(out, n, why, sizeof why); /* NULL: too large for PCRE2 */
        uint64_t rng = 0x5eed ^ size;
        for (int k = 0; g && k < 3; k++) {
            size_t len;
            char *t = gbnf_oracle_sample(g, &rng, 4096, &len);
            if (!t) continue;
            if (strlen(text) == size && !check_json_schema(t, len, text, why, sizeof why)) {
                fprintf(stderr, "fuzz_server_json_schema: a text of the grammar is invalid (%s)\ntext: %s\nschema: %s\n%s\n",
                        why, t, text, out);
                abort();
            }
            free(t);
        }
        gbnf_oracle_free(g);
        free(text);
    }
    free(out);
    return 0;
}
