/* test_server_json_schema.c - the JSON Schema to GBNF converter
 * (tools/json_schema.c), judged without the grammar engine: each grammar is
 * read by the test-only GBNF reader (gbnf_oracle.h: PCRE2 decides
 * membership, and it samples random texts) and its texts by the independent
 * validator check_json_schema (grammar_check.h). Checks: a table of schemas
 * (expected rules, texts in and out of the language, random texts all
 * valid); every refused keyword named with its JSON pointer; hostile
 * schemas; integer ranges against plain arithmetic, exhaustively on small
 * bounds and around every power of ten on large ones; string lengths with
 * escapes and non-ASCII; the json_object grammar; the validator itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gbnf_oracle.h"
#include "grammar_check.h"
#include "json_schema.h"
#include "testutil.h"

#define INT_CAP 9999999999999999ll

static char *convert_ok(const char *schema) {
    char *out = NULL;
    tern_error_t err;
    int rc = tern_json_schema_to_gbnf(schema, strlen(schema), &out, &err);
    if (rc) fail_msg("schema %s: %s", schema, err.msg);
    assert_non_null(out);
    return out;
}

static gbnf_oracle_t *oracle(const char *gbnf) {
    char why[300];
    gbnf_oracle_t *g = gbnf_oracle_new(gbnf, strlen(gbnf), why, sizeof why);
    if (!g) fail_msg("%s\n--- grammar:\n%s", why, gbnf);
    return g;
}

static int matches(const gbnf_oracle_t *g, const char *text) {
    int m = gbnf_oracle_match(g, text, strlen(text));
    if (m < 0) fail_msg("PCRE2 could not decide on %s", text);
    return m;
}

/* ---- a table of schemas ----------------------------------------------------------- */

typedef struct {
    const char *schema;
    const char *contains[4]; /* in the GBNF text */
    const char *good[8];     /* in the grammar's language (and valid) */
    const char *bad[10];     /* not in it */
} conv_t;

static const conv_t CONV[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
     "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\"}},"
     "\"required\":[\"name\",\"age\"]}",
     {"root ::= ", "root-name-kv ::= \"\\\"name\\\"\" ws \":\" ws root-name ws", "char{1,8}", "ws ::= "},
     {"{\"name\":\"Al\",\"age\":30}", "{\"name\": \"Al\", \"age\": 0, \"email\": \"a@b\"}",
      "{\n  \"name\": \"Zo\xc3\xab\",\n  \"age\": 150\n}", "{ \"name\" : \"12345678\" , \"age\" : 9 }"},
     {"{\"age\":30,\"name\":\"Al\"}", "{\"name\":\"Al\"}", "{\"name\":\"\",\"age\":1}", "{\"name\":\"Al\",\"age\":151}",
      "{\"name\":\"Al\",\"age\":-1}", "{\"name\":\"Al\",\"age\":30,\"x\":1}", "{\"name\":\"Al\",\"age\":30.5}",
      "{\"name\":\"Al\",\"age\":07}", " {\"name\":\"Al\",\"age\":1}", "{\"name\":\"123456789\",\"age\":1}"}},
    /* optional properties before the first required one */
    {"{\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},\"c\":{\"const\":\"k\"}},"
     "\"required\":[\"c\"]}",
     {"root-from-1 ::= ", "root-c ::= \"\\\"k\\\"\""},
     {"{\"c\":\"k\"}", "{\"a\":true,\"c\":\"k\"}", "{\"b\":null,\"c\":\"k\"}", "{\"a\":false,\"b\":null,\"c\":\"k\"}"},
     {"{}", "{\"a\":true}", "{\"c\":\"k\",\"a\":true}", "{\"a\":true,\"b\":null}", "{\"c\":\"K\"}",
      "{\"a\":true,,\"c\":\"k\"}", "{,\"c\":\"k\"}"}},
    /* all optional, extra members as strings after the listed ones */
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":{\"type\":\"integer\"}},"
     "\"additionalProperties\":{\"type\":\"string\"}}",
     {"root-extra-kv ::= ", "root-key-0 ::= "},
     {"{}", "{\"x\":1}", "{\"y\":2,\"z\":\"s\"}", "{\"x\":1,\"y\":2,\"note\":\"hi\",\"xx\":\"t\"}",
      "{\"z\":\"a\",\"w\":\"b\"}", "{\"\":\"empty key\"}"},
     {"{\"x\":\"1\"}", "{\"z\":1}", "{\"x\":1,\"x\":2}", "{\"z\":\"a\",\"x\":1}", "{\"y\":1,\"x\":2}",
      "{\"x\":1,\"y\":\"s\"}", "{\"x\\u0041\":\"s\"}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":3},\"minItems\":2,\"maxItems\":4}",
     {"{1,3}"},
     {"[1,2]", "[-3, 3, 0]", "[\n  1,\n  2\n]", "[1 ,2]"},
     {"[1]", "[1,2,3,4,5]", "[4,1]", "[]", "[1,,2]", "[1,2,]", "[-0,1]"}},
    {"{\"enum\":[\"red\",\"green\",42,null,{\"a\":[1,true]}]}",
     {"\"\\\"red\\\"\" | "},
     {"\"red\"", "42", "null", "{\"a\":[1,true]}"},
     {"\"blue\"", "{\"a\": [1,true]}", "42.0", "\"Red\"", "\"red\" "}},
    /* numbers spelled so they read back as the same double (cJSON's printer
     * would write -9.00719925474099e+16 for the first) */
    {"{\"enum\":[-90071992547409922.5,0.1,1e300,123456789012345678,[0.30000000000000004,-0.0]]}",
     {"\"-9.007199254740992e+16\"", "\"[0.30000000000000004,-0]\""},
     {"0.1", "1e+300", "[0.30000000000000004,-0]"},
     {"0.3", "[0.3,0]", "-90071992547409920"}},
    {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}]}",
     {"root ::= root-0 | root-1"},
     {"\"ab\"", "[]", "[true,false]", "\"\""},
     {"\"abc\"", "[1]", "5", "[true,]"}},
    {"{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}],\"description\":\"flag\"}",
     {"boolean"},
     {"true", "null"},
     {"1", "\"true\""}},
    {"{\"type\":[\"integer\",\"null\"],\"maximum\":9}",
     {"null"},
     {"9", "-100", "null", "0"},
     {"10", "1.5", "\"9\"", "-0"}},
    /* recursion through a named rule, with an array in between */
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":"
     "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"]}},"
     "\"$ref\":\"#/$defs/node\"}",
     {"root ::= node", "node ::= "},
     {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}"},
     {"{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3},{\"v\":4}]}", "{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}"}},
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"child\":{\"$ref\":\"#\"}},"
     "\"required\":[\"name\"]}",
     {"ws \":\" ws root ws"},
     {"{\"name\":\"a\"}", "{\"name\":\"a\",\"child\":{\"name\":\"b\",\"child\":{\"name\":\"c\"}}}"},
     {"{\"name\":\"a\",\"child\":{}}", "{\"child\":{\"name\":\"b\"}}"}},
    {"{\"definitions\":{\"pos\":{\"type\":\"integer\",\"exclusiveMinimum\":0}},\"type\":\"array\","
     "\"items\":{\"$ref\":\"#/definitions/pos\"}}",
     {"pos ::= "},
     {"[1,2,300]", "[]", "[9999999999999999]"},
     {"[0]", "[-1]", "[1.5]", "[10000000000000000]"}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
     {"char{2,3}"},
     {"\"ab\"", "\"a\\nb\"", "\"\\u00e9\\ud83d\\ude00\"", "\"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\"",
      "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x80\"", "\"\\\"\\\\\\/\""},
     {"\"a\"", "\"abcd\"", "\"\\u0000a\"", "\"\\ud800ab\"", "\"a\tb\"", "\"\\ud83d\"", "\"\\x41b\"", "'ab'"}},
    {"{}",
     {"root ::= value"},
     {"1", "\"x\"", "{\"a\":[null]}", "[{}, [], -1.5e-7, true]"},
     {"", "01", "{\"a\" 1}", "[1] "}},
    {"{\"properties\":{\"a\\\"b\":{\"type\":\"integer\"},\"\xc3\xa9\":{\"type\":\"boolean\"}},\"required\":[\"a\\\"b\"],"
     "\"additionalProperties\":true}",
     {"\"\\\"a\\\\\\\"b\\\"\"", "\\u00E9"},
     {"{\"a\\\"b\":1}", "{\"a\\\"b\":1,\"\xc3\xa9\":true}", "{\"a\\\"b\":1,\"c\":[1]}", "{\"a\\\"b\":1,\"\xc3\xa9\xc3\xa9\":0}"},
     {"{\"\xc3\xa9\":true}", "{\"a\\\"b\":1,\"\xc3\xa9\":1}", "{\"a\\\"b\":1,\"a\\\"b\":2}"}},
    {"{\"type\":\"array\",\"maxItems\":0}", {"\"[\" ws \"]\""}, {"[]", "[ ]"}, {"[1]", "[null]"}},
    {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true,\"maximum\":7}", {"[6-7]"}, {"6", "7"}, {"5", "8", "06"}},
    {"{\"type\":\"number\"}",
     {"root ::= number"},
     {"0", "-0.5", "1e10", "3.25E-2", "-0", "1234567890123456"},
     {"01", ".5", "1e100", "NaN", "1.", "+1", "12345678901234567"}},
    {"{\"type\":[\"boolean\",\"string\",\"null\"],\"maxLength\":1,\"title\":\"t\",\"$comment\":\"c\"}",
     {"\"\\\"\" char? \"\\\"\""},
     {"true", "\"\"", "\"x\"", "null"},
     {"\"xy\"", "0"}},
    {"{\"type\":\"object\",\"properties\":{},\"additionalProperties\":{\"type\":\"array\",\"maxItems\":1}}",
     {"root-extra-kv ::= string ws"},
     {"{}", "{\"a\":[],\"b\":[1]}", "{\"a\\n\":[]}"},
     {"{\"a\":[1,2]}", "{\"a\":1}"}},
};

static void test_conversions(void **state) {
    (void)state;
    int n_samples = tu_quick() ? 30 : 150;
    uint64_t rng = 4242;
    for (size_t i = 0; i < sizeof CONV / sizeof *CONV; i++) {
        const conv_t *c = &CONV[i];
        char *gbnf = convert_ok(c->schema);
        char why[300];
        for (int k = 0; k < 4 && c->contains[k]; k++)
            if (!strstr(gbnf, c->contains[k]))
                fail_msg("schema %zu: no \"%s\" in:\n%s", i, c->contains[k], gbnf);
        gbnf_oracle_t *g = oracle(gbnf);
        for (int k = 0; k < 8 && c->good[k]; k++) {
            if (!matches(g, c->good[k])) fail_msg("schema %zu: grammar refuses %s\n%s", i, c->good[k], gbnf);
            if (!check_json_schema(c->good[k], strlen(c->good[k]), c->schema, why, sizeof why))
                fail_msg("schema %zu: the validator refuses good %s: %s", i, c->good[k], why);
        }
        for (int k = 0; k < 10 && c->bad[k]; k++)
            if (matches(g, c->bad[k])) fail_msg("schema %zu: grammar accepts %s\n%s", i, c->bad[k], gbnf);
        /* soundness: random texts of the grammar are valid under the schema */
        int got = 0;
        for (int k = 0; k < n_samples; k++) {
            size_t len;
            char *t = gbnf_oracle_sample(g, &rng, 1 << 16, &len);
            if (!t) continue;
            got++;
            if (!check_json_schema(t, len, c->schema, why, sizeof why))
                fail_msg("schema %zu: a text of the grammar is invalid (%s):\n%s\n--- grammar:\n%s", i, why, t, gbnf);
            if (matches(g, t) != 1) fail_msg("schema %zu: sample outside its grammar: %s", i, t);
            free(t);
        }
        if (got < n_samples / 2) fail_msg("schema %zu: %d samples of %d", i, got, n_samples);
        /* the same schema gives the same grammar */
        char *again = convert_ok(c->schema);
        assert_string_equal(gbnf, again);
        free(again);
        gbnf_oracle_free(g);
        free(gbnf);
    }
}

/* ---- refused keywords -------------------------------------------------------------- */

typedef struct {
    const char *schema;
    int code;
    const char *msg; /* the whole message after "json schema: " */
} bad_t;

static const bad_t UNSUP[] = {
    {"{\"properties\":{\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]+$\"}}}", TERN_EUNSUP,
     "unsupported keyword \"pattern\" at /properties/zip"},
    {"{\"type\":\"string\",\"format\":\"date\"}", TERN_EUNSUP, "unsupported keyword \"format\" at the top level"},
    {"{\"type\":\"number\",\"multipleOf\":2}", TERN_EUNSUP, "unsupported keyword \"multipleOf\" at the top level"},
    {"{\"allOf\":[{}]}", TERN_EUNSUP, "unsupported keyword \"allOf\" at the top level"},
    {"{\"not\":{}}", TERN_EUNSUP, "unsupported keyword \"not\" at the top level"},
    {"{\"if\":{},\"then\":{}}", TERN_EUNSUP, "unsupported keyword \"if\" at the top level"},
    {"{\"type\":\"array\",\"uniqueItems\":true}", TERN_EUNSUP, "unsupported keyword \"uniqueItems\" at the top level"},
    {"{\"patternProperties\":{}}", TERN_EUNSUP, "unsupported keyword \"patternProperties\" at the top level"},
    {"{\"type\":\"object\",\"minProperties\":1}", TERN_EUNSUP, "unsupported keyword \"minProperties\" at the top level"},
    {"{\"type\":\"array\",\"items\":{\"contains\":{}}}", TERN_EUNSUP, "unsupported keyword \"contains\" at /items"},
    {"{\"anyOf\":[{\"type\":\"string\"},{\"maxProperties\":2}]}", TERN_EUNSUP,
     "unsupported keyword \"maxProperties\" at /anyOf/1"},
    {"{\"oneOf\":[{\"prefixItems\":[]}]}", TERN_EUNSUP, "unsupported keyword \"prefixItems\" at /oneOf/0"},
    {"{\"$defs\":{\"a\":{\"dependentRequired\":{}}},\"$ref\":\"#/$defs/a\"}", TERN_EUNSUP,
     "unsupported keyword \"dependentRequired\" at /$defs/a"},
    {"{\"properties\":{\"a/b\":{\"properties\":{\"c~d\":{\"x-custom\":1}}}}}", TERN_EUNSUP,
     "unsupported keyword \"x-custom\" at /properties/a~1b/properties/c~0d"},
    {"{\"additionalProperties\":{\"propertyNames\":{}}}", TERN_EUNSUP,
     "unsupported keyword \"propertyNames\" at /additionalProperties"},
    {"{\"type\":\"string\",\"contentEncoding\":\"base64\"}", TERN_EUNSUP, "unsupported keyword \"contentEncoding\""},
    {"{\"type\":\"object\",\"nullable\":true}", TERN_EUNSUP, "unsupported keyword \"nullable\""},
    {"{\"type\":\"number\",\"minimum\":0}", TERN_EUNSUP,
     "\"minimum\" is supported for type \"integer\" only at the top level"},
    {"{\"properties\":{\"p\":{\"exclusiveMaximum\":1}}}", TERN_EUNSUP,
     "\"exclusiveMaximum\" is supported for type \"integer\" only at /properties/p"},
    {"{\"$ref\":\"http://example.com/s.json\"}", TERN_EUNSUP, "only local references"},
    {"{\"$ref\":\"#anchor\"}", TERN_EUNSUP, "only local references"},
    {"{\"$defs\":{\"a\":{}},\"$ref\":\"#/$defs/a\",\"type\":\"object\"}", TERN_EUNSUP,
     "\"$ref\" next to \"type\" is not supported at the top level"},
    {"{\"enum\":[1],\"minimum\":0}", TERN_EUNSUP, "\"enum\" next to \"minimum\" is not supported"},
    {"{\"anyOf\":[{}],\"oneOf\":[{}]}", TERN_EUNSUP, "\"anyOf\" next to \"oneOf\""},
    {"{\"type\":\"string\",\"anyOf\":[{}]}", TERN_EUNSUP, "\"anyOf\" next to \"type\""},
    {"{\"type\":\"array\",\"items\":[{}]}", TERN_EUNSUP, "\"items\" as an array (tuple form) is not supported"},
    {"{\"properties\":{\"a\":{}},\"required\":[\"b\"]}", TERN_EUNSUP,
     "required property \"b\" is not in \"properties\" at the top level"},
    {"{\"type\":\"integer\",\"minimum\":1e20}", TERN_EUNSUP, "\"minimum\" 1e+20 is beyond +-2^53"},
    {"{\"enum\":[1e999]}", TERN_EUNSUP, "out of range"},
};

static void check_refused(const char *schema, size_t len, int code, const char *piece) {
    char *out = (char *)1;
    tern_error_t err;
    int rc = tern_json_schema_to_gbnf(schema, len, &out, &err);
    if (rc == 0) fail_msg("accepted: %.200s", schema);
    assert_null(out);
    assert_int_equal(err.code, rc);
    if (code) assert_int_equal(rc, code);
    if (strncmp(err.msg, "json schema: ", 13)) fail_msg("message without prefix: %s", err.msg);
    if (!strstr(err.msg, piece)) fail_msg("schema %.200s\n  message: %s\n  missing: %s", schema, err.msg, piece);
}

static void test_unsupported(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof UNSUP / sizeof *UNSUP; i++)
        check_refused(UNSUP[i].schema, strlen(UNSUP[i].schema), UNSUP[i].code, UNSUP[i].msg);
    /* the same keywords the validator refuses too: it cannot judge them */
    char why[200];
    assert_false(check_json_schema("\"1\"", 3, "{\"pattern\":\"1\"}", why, sizeof why));
    assert_non_null(strstr(why, "unsupported keyword \"pattern\""));
}

/* ---- hostile schemas ----------------------------------------------------------------- */

static char *repeat(const char *a, int n, const char *mid, const char *b) {
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid);
    char *s = malloc(la * (size_t)n + lm + lb * (size_t)n + 1);
    assert_non_null(s);
    size_t o = 0;
    for (int i = 0; i < n; i++) memcpy(s + o, a, la), o += la;
    memcpy(s + o, mid, lm), o += lm;
    for (int i = 0; i < n; i++) memcpy(s + o, b, lb), o += lb;
    s[o] = 0;
    return s;
}

static void test_hostile(void **state) {
    (void)state;
    static const bad_t BAD[] = {
        {"{", TERN_EINVAL, "invalid JSON"},
        {"", TERN_EINVAL, "invalid JSON"},
        {"nul", TERN_EINVAL, "invalid JSON"},
        {"{\"type\":}", TERN_EINVAL, "invalid JSON"},
        {"{} x", TERN_EINVAL, "unexpected data after the schema"},
        {"{\"const\":\"a\\u0000b\"}", TERN_EUNSUP, "\\u0000"},
        {"{\"const\":\"a\x01\"}", TERN_EINVAL, "control character"},
        {"42", TERN_EINVAL, "a schema must be an object or a boolean at the top level"},
        {"\"string\"", TERN_EINVAL, "a schema must be an object or a boolean"},
        {"[{}]", TERN_EINVAL, "a schema must be an object or a boolean"},
        {"null", TERN_EINVAL, "a schema must be an object or a boolean"},
        {"false", TERN_EINVAL, "the schema false admits no value"},
        {"{\"properties\":{\"a\":false},\"required\":[\"a\"]}", TERN_EINVAL, "false admits no value at /properties/a"},
        {"{\"properties\":{\"a\":7}}", TERN_EINVAL, "a schema must be an object or a boolean at /properties/a"},
        {"{\"type\":\"string\",\"minLength\":100000}", TERN_EUNSUP, "\"minLength\" is 100000, more than the limit of 10000"},
        {"{\"type\":\"array\",\"maxItems\":1e9}", TERN_EUNSUP, "\"maxItems\" is 1000000000, more than the limit"},
        {"{\"type\":\"string\",\"minLength\":-1}", TERN_EINVAL, "\"minLength\" must be a non-negative integer"},
        {"{\"type\":\"string\",\"maxLength\":1.5}", TERN_EINVAL, "\"maxLength\" must be a non-negative integer"},
        {"{\"type\":\"string\",\"maxLength\":\"3\"}", TERN_EINVAL, "\"maxLength\" must be a non-negative integer"},
        {"{\"type\":\"string\",\"minLength\":5,\"maxLength\":4}", TERN_EINVAL, "\"minLength\" is more than \"maxLength\""},
        {"{\"type\":\"array\",\"minItems\":5,\"maxItems\":4}", TERN_EINVAL, "\"minItems\" is more than \"maxItems\""},
        {"{\"type\":\"array\",\"items\":false,\"minItems\":1}", TERN_EINVAL, "admits no item"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", TERN_EINVAL, "no integer is within the bounds"},
        {"{\"type\":\"integer\",\"minimum\":4.5,\"maximum\":4.9}", TERN_EINVAL, "no integer is within the bounds"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":true}", TERN_EINVAL, "\"exclusiveMinimum\": true needs \"minimum\""},
        {"{\"type\":\"integer\",\"minimum\":\"0\"}", TERN_EINVAL, "\"minimum\" must be a number"},
        {"{\"type\":\"float\"}", TERN_EINVAL, "unknown type \"float\""},
        {"{\"type\":[]}", TERN_EINVAL, "\"type\" must not be an empty list"},
        {"{\"type\":[\"string\",3]}", TERN_EINVAL, "\"type\" must be a type name or a list of them"},
        {"{\"type\":\"string\",\"type\":\"null\"}", TERN_EINVAL, "keyword \"type\" appears twice"},
        {"{\"properties\":{\"a\":{},\"a\":{}}}", TERN_EINVAL, "property \"a\" appears twice in \"properties\""},
        {"{\"properties\":[]}", TERN_EINVAL, "\"properties\" must be an object"},
        {"{\"required\":\"a\"}", TERN_EINVAL, "\"required\" must be an array of strings"},
        {"{\"properties\":{\"a\":{}},\"required\":[1]}", TERN_EINVAL, "\"required\" must be an array of strings"},
        {"{\"additionalProperties\":3}", TERN_EINVAL, "\"additionalProperties\" must be a schema"},
        {"{\"enum\":[]}", TERN_EINVAL, "\"enum\" must be a non-empty array"},
        {"{\"enum\":[1,2],\"type\":\"string\"}", TERN_EINVAL, "\"enum\" admits no value of the allowed type"},
        {"{\"const\":3,\"enum\":[1,2]}", TERN_EINVAL, "\"const\" admits no value"},
        {"{\"anyOf\":[]}", TERN_EINVAL, "\"anyOf\" must be a non-empty array of schemas"},
        {"{\"$ref\":5}", TERN_EINVAL, "\"$ref\" must be a string"},
        {"{\"$ref\":\"#/$defs/missing\"}", TERN_EINVAL, "$ref \"#/$defs/missing\" does not resolve"},
        {"{\"$ref\":\"#/definitions/a~2\"}", TERN_EINVAL, "does not resolve"},
        /* left recursion: cycles of $ref (and anyOf) with no object or array between */
        {"{\"$ref\":\"#\"}", TERN_EUNSUP, "(left recursion) at the top level"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", TERN_EUNSUP,
         "$ref \"#/$defs/a\" leads back to itself with no object or array in between (left recursion) at /$defs/b"},
        {"{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", TERN_EUNSUP, "left recursion) at /anyOf/0"},
        {"{\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/properties/a\"}]}}}", TERN_EUNSUP,
         "left recursion) at /properties/a/anyOf/1"},
        {"{\"properties\":{\"\xff\":{}},\"additionalProperties\":true}", TERN_EINVAL, "not valid UTF-8"},
        {"{\"const\":\"\xc0\xaf\"}", TERN_EINVAL, "not valid UTF-8"},
        {"{\"enum\":[1,[{\"a\":1,\"b\":{\"c\":1,\"c\":2}}]]}", TERN_EINVAL, "a value of \"enum\" has the key \"c\" twice"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) check_refused(BAD[i].schema, strlen(BAD[i].schema), BAD[i].code, BAD[i].msg);

    /* JSON nesting: refused before cJSON recurses */
    char *deep = repeat("{\"items\":", 1000, "{}", "}");
    check_refused(deep, strlen(deep), TERN_EUNSUP, "JSON nested deeper than 256 levels");
    free(deep);
    deep = repeat("[", 200000, "", "]");
    check_refused(deep, strlen(deep), TERN_EUNSUP, "JSON nested deeper than 256 levels");
    free(deep);
    /* schema nesting within the JSON bound: the converter's own limit */
    deep = repeat("{\"items\":", 100, "{}", "}");
    check_refused(deep, strlen(deep), TERN_EUNSUP, "schemas nested deeper than 64 levels at /items/items");
    free(deep);
    deep = repeat("{\"items\":", 63, "{}", "}"); /* 64 schemas: the limit itself */
    free(convert_ok(deep));
    free(deep);
    /* a chain of 100 $ref without a cycle: depth counts $ref steps */
    {
        size_t cap = 100 * 64 + 256, o = 0;
        char *s = malloc(cap);
        assert_non_null(s);
        o += (size_t)snprintf(s + o, cap - o, "{\"$defs\":{");
        for (int i = 0; i < 100; i++)
            o += (size_t)snprintf(s + o, cap - o, "%s\"d%d\":{\"$ref\":\"#/$defs/d%d\"}", i ? "," : "", i, i + 1);
        o += (size_t)snprintf(s + o, cap - o, ",\"d100\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/d0\"}");
        check_refused(s, o, TERN_EUNSUP, "schemas nested deeper than 64 levels");
        free(s);
    }
    /* a huge enum */
    {
        size_t cap = 100000 * 12 + 32, o = 0;
        char *s = malloc(cap);
        assert_non_null(s);
        o += (size_t)snprintf(s + o, cap - o, "{\"enum\":[");
        for (int i = 0; i < 100000; i++) o += (size_t)snprintf(s + o, cap - o, "%s%d", i ? "," : "", i);
        o += (size_t)snprintf(s + o, cap - o, "]}");
        check_refused(s, o, TERN_EUNSUP, "\"enum\" has 100000 values, more than the limit of 10000");
        free(s);
    }
    /* the output bound: 1.5M x "é" in a const, each written \u00E9 (6 bytes) */
    {
        size_t n = 1500000, o = 0;
        char *s = malloc(2 * n + 32);
        assert_non_null(s);
        o += (size_t)snprintf(s, 32, "{\"const\":\"");
        for (size_t i = 0; i < n; i++) s[o++] = '\xc3', s[o++] = '\xa9';
        memcpy(s + o, "\"}", 3);
        o += 2;
        check_refused(s, o, TERN_EINVAL, "the grammar would be larger than 4194304 bytes");
        free(s);
    }
    /* the input bound */
    {
        size_t n = TERN_JS_MAX_INPUT + 10;
        char *s = malloc(n);
        assert_non_null(s);
        memset(s, ' ', n);
        s[0] = '{', s[n - 1] = '}';
        check_refused(s, n, TERN_EUNSUP, "more than the limit of 4194304");
        free(s);
    }
    /* the length is honoured: a schema need not be NUL-terminated */
    {
        const char *s = "{\"type\":\"null\"}GARBAGE";
        char *out;
        tern_error_t err;
        assert_int_equal(tern_json_schema_to_gbnf(s, 15, &out, &err), 0);
        assert_non_null(strstr(out, "root ::= null"));
        free(out);
    }
    /* many optional properties: linear size, not exponential (the grammar
     * of 150 also judged: PCRE2 cannot compile the one of 2000) */
    for (int n = 150; n <= 2000; n += 1850) {
        size_t cap = (size_t)n * 40 + 64, o = 0;
        char *s = malloc(cap);
        assert_non_null(s);
        o += (size_t)snprintf(s + o, cap - o, "{\"properties\":{");
        for (int i = 0; i < n; i++) o += (size_t)snprintf(s + o, cap - o, "%s\"p%d\":{\"type\":\"boolean\"}", i ? "," : "", i);
        o += (size_t)snprintf(s + o, cap - o, "},\"required\":[\"p%d\"]}", n - 1);
        char *out = NULL;
        tern_error_t err;
        assert_int_equal(tern_json_schema_to_gbnf(s, o, &out, &err), 0);
        if (strlen(out) > (size_t)n * 200) fail_msg("%d optional properties gave %zu bytes", n, strlen(out));
        if (n < 1000) {
            gbnf_oracle_t *g = oracle(out);
            char inst[64];
            snprintf(inst, sizeof inst, "{\"p7\":true,\"p%d\":false}", n - 1);
            assert_int_equal(matches(g, inst), 1);
            snprintf(inst, sizeof inst, "{\"p%d\":false}", n - 1);
            assert_int_equal(matches(g, inst), 1);
            snprintf(inst, sizeof inst, "{\"p7\":true}");
            assert_int_equal(matches(g, inst), 0);
            snprintf(inst, sizeof inst, "{\"p8\":true,\"p7\":true,\"p%d\":false}", n - 1);
            assert_int_equal(matches(g, inst), 0);
            gbnf_oracle_free(g);
        }
        free(out);
        free(s);
    }
    /* NULL arguments */
    {
        tern_error_t err;
        assert_int_equal(tern_json_schema_to_gbnf("{}", 2, NULL, &err), TERN_EINVAL);
        char *out;
        assert_int_equal(tern_json_schema_to_gbnf("{}", 2, &out, NULL), 0);
        free(out);
        assert_int_equal(tern_json_schema_to_gbnf("{", 1, &out, NULL), TERN_EINVAL);
        assert_null(out);
    }
}

/* ---- rule names ------------------------------------------------------------------------ */

static void test_rule_names(void **state) {
    (void)state;
    const char *schema =
        "{\"properties\":{\"first name\":{\"type\":\"string\",\"maxLength\":3},\"first-name\":{\"type\":\"string\","
        "\"maxLength\":4},\"\xc3\xbc!\":{\"type\":\"string\",\"maxLength\":5},\"value\":{\"type\":\"string\",\"maxLength\":6},"
        "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":"
        "{\"type\":\"string\",\"maxLength\":7}},\"required\":[\"first name\"]}";
    char *out = convert_ok(schema);
    assert_non_null(strstr(out, "root-first-name ::= "));
    assert_non_null(strstr(out, "root-first-name-2 ::= "));
    assert_non_null(strstr(out, "root-value ::= "));
    /* every rule: a name of [a-zA-Z0-9-], at most 72 + a suffix, defined once */
    char *names[64];
    int n = 0;
    for (char *line = out; *line; line = strchr(line, '\n') + 1) {
        char *def = strstr(line, " ::= ");
        assert_non_null(def);
        size_t len = (size_t)(def - line);
        assert_true(len >= 1 && len <= 80);
        for (size_t k = 0; k < len; k++) {
            char c = line[k];
            assert_true((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-');
        }
        for (int k = 0; k < n; k++)
            if (strlen(names[k]) == len && !strncmp(names[k], line, len)) fail_msg("rule %.*s twice", (int)len, line);
        assert_true(n < 64);
        names[n++] = line;
        if (!strchr(line, '\n')) break;
    }
    gbnf_oracle_t *g = oracle(out);
    assert_int_equal(matches(g, "{\"first name\":\"abc\",\"first-name\":\"abcd\",\"\xc3\xbc!\":\"\"}"), 1);
    gbnf_oracle_free(g);
    free(out);
}

/* ---- integer ranges ---------------------------------------------------------------------- */

static gbnf_oracle_t *range_oracle(int64_t lo, int64_t hi) {
    char *expr;
    assert_int_equal(tern_json_int_range_gbnf(lo, hi, &expr), 0);
    size_t n = strlen(expr) + 16;
    char *gbnf = malloc(n);
    assert_non_null(gbnf);
    snprintf(gbnf, n, "root ::= %s\n", expr);
    gbnf_oracle_t *g = oracle(gbnf);
    free(gbnf);
    free(expr);
    return g;
}

static void check_value(const gbnf_oracle_t *g, int64_t lo, int64_t hi, int64_t v) {
    if (v < -INT_CAP || v > INT_CAP) return;
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)v);
    int want = v >= lo && v <= hi;
    if (matches(g, t) != want) fail_msg("[%lld, %lld]: %s %s", (long long)lo, (long long)hi, t, want ? "refused" : "accepted");
}

static void check_range(int64_t lo, int64_t hi, int window, uint64_t *rng) {
    gbnf_oracle_t *g = range_oracle(lo, hi);
    int64_t pts[] = {lo, hi, 0};
    for (int p = 0; p < 3; p++)
        for (int64_t d = -window; d <= window; d++) check_value(g, lo, hi, pts[p] + d);
    for (int64_t p = 1; p <= INT_CAP; p *= 10) /* every digit-count boundary, both signs */
        for (int64_t d = -2; d <= 2; d++) check_value(g, lo, hi, p + d), check_value(g, lo, hi, -p - d);
    check_value(g, lo, hi, INT_CAP);
    check_value(g, lo, hi, -INT_CAP);
    for (int k = 0; k < 50; k++) { /* random values inside and around */
        uint64_t span = (uint64_t)(hi - lo) + 1;
        check_value(g, lo, hi, lo + (int64_t)(tu_rand(rng) % span));
        check_value(g, lo, hi, (int64_t)(tu_rand(rng) % (2 * (uint64_t)INT_CAP + 1)) - INT_CAP);
    }
    static const char *const never[] = {"-0", "00", "01", "+1", "", "-", "1.0", " 1", "1 ", "0x1", "--1", "-00"};
    for (size_t k = 0; k < sizeof never / sizeof *never; k++)
        if (matches(g, never[k])) fail_msg("[%lld, %lld] accepts \"%s\"", (long long)lo, (long long)hi, never[k]);
    for (int k = 0; k < 20; k++) { /* samples: canonical and in range */
        size_t len;
        char *t = gbnf_oracle_sample(g, rng, 64, &len);
        assert_non_null(t);
        long long v = strtoll(t, NULL, 10);
        char back[32];
        snprintf(back, sizeof back, "%lld", v);
        if (strcmp(back, t) || v < lo || v > hi) fail_msg("[%lld, %lld] sample %s", (long long)lo, (long long)hi, t);
        free(t);
    }
    gbnf_oracle_free(g);
}

static void test_int_ranges(void **state) {
    (void)state;
    uint64_t rng = 99;
    const int64_t p53 = 9007199254740992ll;
    static const int64_t pairs[][2] = {
        {0, 0}, {0, 9}, {1, 9}, {5, 5}, {0, 10}, {7, 12}, {10, 99}, {0, 150}, {-15, 1234}, {-100, -7},
        {-1, 1}, {-9, -1}, {-10, 10}, {99, 101}, {100, 999}, {123, 4567}, {-5000, -4000}, {1000, 1000000},
        {19, 91}, {0, INT_CAP}, {-INT_CAP, 0}, {-INT_CAP, INT_CAP}, {987654321, 987654400}, {1, INT_CAP},
        {-INT_CAP, -1}, {109, 901}, {2000, 2999}, {-1999, -1000}, {10, 10}, {-10, -10}, {5, 9999999999999999ll},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) check_range(pairs[i][0], pairs[i][1], 150, &rng);
    check_range(-p53, p53, 100, &rng);
    check_range(p53 - 50, p53, 100, &rng);
    check_range(-p53, -p53 + 1, 100, &rng);
    /* every small range, every value near it */
    int step = tu_quick() ? 23 : 7;
    for (int lo = -120; lo <= 120; lo += step)
        for (int hi = lo; hi <= 120; hi += step) {
            gbnf_oracle_t *g = range_oracle(lo, hi);
            for (int v = -130; v <= 130; v++) check_value(g, lo, hi, v);
            gbnf_oracle_free(g);
        }
    /* random bounds of every size */
    for (int k = 0; k < (tu_quick() ? 20 : 120); k++) {
        int64_t m1 = 1, m2 = 1;
        for (int d = (int)(tu_rand(&rng) % 17); d > 0; d--) m1 *= 10;
        for (int d = (int)(tu_rand(&rng) % 17); d > 0; d--) m2 *= 10;
        int64_t a = (int64_t)(tu_rand(&rng) % (uint64_t)m1) * (tu_rand(&rng) % 2 ? -1 : 1);
        int64_t b = (int64_t)(tu_rand(&rng) % (uint64_t)m2) * (tu_rand(&rng) % 2 ? -1 : 1);
        check_range(a < b ? a : b, a < b ? b : a, 20, &rng);
    }
    /* the argument checks */
    char *x = (char *)1;
    assert_int_equal(tern_json_int_range_gbnf(5, 4, &x), TERN_EINVAL);
    assert_null(x);
    assert_int_equal(tern_json_int_range_gbnf(0, INT_CAP + 1, &x), TERN_EINVAL);
    assert_int_equal(tern_json_int_range_gbnf(-INT_CAP - 1, 0, &x), TERN_EINVAL);
}

/* Bounds through whole schemas: converter, grammar and validator agree. */
static void test_int_schemas(void **state) {
    (void)state;
    static const struct {
        const char *schema;
        int lo, hi; /* the exact set on [-300, 300]; hi 301: unbounded above */
    } S[] = {
        {"{\"type\":\"integer\",\"minimum\":-15,\"exclusiveMaximum\":200}", -15, 199},
        {"{\"type\":\"integer\",\"minimum\":5}", 5, 301},
        {"{\"type\":\"integer\",\"maximum\":-7.5}", -301, -8},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":-3.5,\"maximum\":2.5}", -3, 2},
        {"{\"type\":\"integer\",\"minimum\":-3.5,\"exclusiveMinimum\":-1}", 0, 301},
        {"{\"type\":\"integer\",\"maximum\":10,\"exclusiveMaximum\":true}", -301, 9},
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", 0, 0},
    };
    char why[200];
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
        char *gbnf = convert_ok(S[i].schema);
        gbnf_oracle_t *g = oracle(gbnf);
        for (int v = -300; v <= 300; v++) {
            char t[16];
            snprintf(t, sizeof t, "%d", v);
            int want = v >= S[i].lo && v <= S[i].hi;
            if (matches(g, t) != want) fail_msg("%s: %d %s by the grammar", S[i].schema, v, want ? "refused" : "accepted");
            if (check_json_schema(t, strlen(t), S[i].schema, why, sizeof why) != want)
                fail_msg("%s: %d %s by the validator", S[i].schema, v, want ? "refused" : "accepted");
        }
        gbnf_oracle_free(g);
        free(gbnf);
    }
}

/* ---- string lengths ------------------------------------------------------------------------ */

static void test_string_lengths(void **state) {
    (void)state;
    /* one character each, in the JSON text */
    static const char *const pieces[] = {"a", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", "\\n", "\\u00e9",
                                         "\\ud83d\\ude00", "\\\"", "\\\\", "\\/", " ", "\x7f"};
    static const int bounds[][2] = {{0, 0}, {1, 1}, {2, 3}, {0, 5}, {3, -1}, {0, -1}, {7, 7}};
    uint64_t rng = 5;
    char why[200];
    for (size_t b = 0; b < sizeof bounds / sizeof *bounds; b++) {
        char schema[128];
        int lo = bounds[b][0], hi = bounds[b][1];
        if (hi >= 0)
            snprintf(schema, sizeof schema, "{\"type\":\"string\",\"minLength\":%d,\"maxLength\":%d}", lo, hi);
        else
            snprintf(schema, sizeof schema, "{\"type\":\"string\",\"minLength\":%d}", lo);
        char *gbnf = convert_ok(schema);
        gbnf_oracle_t *g = oracle(gbnf);
        for (int len = 0; len <= 9; len++)
            for (int rep = 0; rep < 12; rep++) {
                char t[256];
                size_t o = 0;
                t[o++] = '"';
                for (int k = 0; k < len; k++) {
                    const char *p = pieces[tu_rand(&rng) % (sizeof pieces / sizeof *pieces)];
                    memcpy(t + o, p, strlen(p));
                    o += strlen(p);
                }
                t[o++] = '"';
                t[o] = 0;
                int want = len >= lo && (hi < 0 || len <= hi);
                if (matches(g, t) != want) fail_msg("%s: %s %s by the grammar", schema, t, want ? "refused" : "accepted");
                if (check_json_schema(t, o, schema, why, sizeof why) != want)
                    fail_msg("%s: %s %s by the validator (%s)", schema, t, want ? "refused" : "accepted", why);
            }
        gbnf_oracle_free(g);
        free(gbnf);
    }
}

/* ---- json_object ---------------------------------------------------------------------------- */

static void test_json_object_gbnf(void **state) {
    (void)state;
    const char *gbnf = tern_json_object_gbnf();
    assert_non_null(strstr(gbnf, "root ::= object\n"));
    gbnf_oracle_t *g = oracle(gbnf);
    static const char *const good[] = {"{}", "{ }", "{\"a\":1}", "{\"a\": [1, \"x\", null, true, false, {\"b\": -2.5e-3}]}",
                                       "{\n  \"k\": {\n    \"n\": []\n  }\n}", "{\"\\u00e9\\ud83d\\ude00\": \"\\n\"}",
                                       "{\"a\":1,\"a\":2}", NULL};
    static const char *const bad[] = {"[]", "1", "\"x\"", "null", "{", "{\"a\"}", "{\"a\":1,}", "{'a':1}",
                                      "{\"a\":01}", "{\"a\":\"\\u0000\"}", "{\"a\":\"\\udc00\"}", " {}", "{} ",
                                      "{\"a\":1e100}", NULL};
    for (const char *const *s = good; *s; s++) {
        if (!matches(g, *s)) fail_msg("json_object grammar refuses %s", *s);
        assert_true(check_json(*s, strlen(*s)));
    }
    for (const char *const *s = bad; *s; s++)
        if (matches(g, *s)) fail_msg("json_object grammar accepts %s", *s);
    /* whitespace is bounded: 32 indentation characters after a newline, not 33 */
    char ws[128];
    snprintf(ws, sizeof ws, "{\n%32s\"a\":1}", "");
    assert_int_equal(matches(g, ws), 1);
    snprintf(ws, sizeof ws, "{\n%33s\"a\":1}", "");
    assert_int_equal(matches(g, ws), 0);
    assert_int_equal(matches(g, "{\n\n\"a\":1}"), 0);
    assert_int_equal(matches(g, "{  \"a\":1}"), 0);
    assert_true(check_json(ws, strlen(ws))); /* the checker is wider: any whitespace */
    uint64_t rng = 17;
    for (int k = 0; k < (tu_quick() ? 50 : 300); k++) {
        size_t len;
        char *t = gbnf_oracle_sample(g, &rng, 1 << 16, &len);
        if (!t) continue;
        if (!check_json(t, len)) fail_msg("json_object sample is not a JSON object: %s", t);
        free(t);
    }
    gbnf_oracle_free(g);
}

/* ---- the validator on its own ----------------------------------------------------------------- */

static void test_validator(void **state) {
    (void)state;
    static const struct {
        const char *schema, *text;
        int valid;
    } V[] = {
        {"{\"type\":\"integer\"}", "1.0", 1},
        {"{\"type\":\"integer\"}", "1.5", 0},
        {"{\"type\":\"number\"}", "\"1\"", 0},
        {"{\"type\":[\"string\",\"null\"]}", "null", 1},
        {"{\"type\":[\"string\",\"null\"]}", "0", 0},
        {"{\"properties\":{\"a\":{\"type\":\"string\"}}}", "{\"a\":\"x\",\"b\":1}", 1}, /* extra allowed */
        {"{\"properties\":{\"a\":{\"type\":\"string\"}},\"additionalProperties\":false}", "{\"a\":\"x\",\"b\":1}", 0},
        {"{\"additionalProperties\":{\"type\":\"integer\"}}", "{\"b\":1,\"c\":\"x\"}", 0},
        {"{\"properties\":{\"a\":{\"type\":\"string\"}}}", "{\"a\":1}", 0},
        {"{\"properties\":{\"a\":{\"type\":\"string\"}}}", "[1]", 1}, /* keywords of another type do not apply */
        {"{\"required\":[\"a\",\"b\"]}", "{\"a\":1}", 0},
        {"{\"required\":[\"a\",\"b\"]}", "{\"b\":1,\"a\":1}", 1},
        {"{\"items\":{\"type\":\"null\"},\"minItems\":1,\"maxItems\":2}", "[null,null]", 1},
        {"{\"items\":{\"type\":\"null\"},\"minItems\":1,\"maxItems\":2}", "[null,null,null]", 0},
        {"{\"items\":{\"type\":\"null\"},\"minItems\":1,\"maxItems\":2}", "[]", 0},
        {"{\"items\":{\"type\":\"null\"}}", "[null,1]", 0},
        {"{\"enum\":[{\"a\":[1,2]},\"x\"]}", "{\"a\":[1,2.0]}", 1},
        {"{\"enum\":[{\"a\":[1,2]},\"x\"]}", "{\"a\":[2,1]}", 0},
        {"{\"enum\":[{\"a\":1,\"b\":2}]}", "{\"b\":2,\"a\":1}", 1},
        {"{\"enum\":[{\"a\":1,\"b\":2}]}", "{\"a\":1}", 0},
        {"{\"const\":null}", "null", 1},
        {"{\"const\":false}", "0", 0},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"minimum\":3}]}", "2", 0},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"minimum\":3}]}", "4", 1},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1", 0}, /* both match */
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1.5", 1},
        {"{\"minLength\":2,\"maxLength\":2}", "\"\xf0\x9f\x98\x80\xc3\xa9\"", 1}, /* code points, not bytes */
        {"{\"minLength\":2,\"maxLength\":2}", "\"\\ud83d\\ude00\"", 0},
        {"{\"minimum\":1,\"exclusiveMinimum\":true}", "1", 0},
        {"{\"exclusiveMaximum\":1}", "0.999", 1},
        {"{\"exclusiveMaximum\":1}", "1", 0},
        {"{\"$defs\":{\"p\":{\"type\":\"integer\"}},\"properties\":{\"x\":{\"$ref\":\"#/$defs/p\"}}}", "{\"x\":\"s\"}", 0},
        {"{\"properties\":{\"c\":{\"$ref\":\"#\"}},\"required\":[\"v\"]}", "{\"v\":1,\"c\":{\"v\":2,\"c\":{}}}", 0},
        {"{\"properties\":{\"c\":{\"$ref\":\"#\"}},\"required\":[\"v\"]}", "{\"v\":1,\"c\":{\"v\":2}}", 1},
        {"{\"$ref\":\"#\"}", "1", 0}, /* never ends: too deep */
        {"{\"$ref\":\"#/nowhere\"}", "1", 0},
        {"false", "1", 0},
        {"true", "[1, {\"a\": null}]", 1},
        {"{\"title\":\"t\",\"description\":\"d\",\"default\":1,\"examples\":[1],\"$schema\":\"x\",\"$id\":\"y\"}", "2", 1},
        {"{\"multipleOf\":2}", "4", 0},
        {"{}", "{\"a\":1", 0},
        {"{}", "01", 0},
        {"{}", "[1] x", 0},
    };
    char why[200];
    for (size_t i = 0; i < sizeof V / sizeof *V; i++)
        if (check_json_schema(V[i].text, strlen(V[i].text), V[i].schema, why, sizeof why) != V[i].valid)
            fail_msg("schema %s, text %s: want %d (%s)", V[i].schema, V[i].text, V[i].valid, why);
    assert_false(check_json_schema("1", 1, "{not json", why, sizeof why));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions),      cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_hostile),          cmocka_unit_test(test_rule_names),
        cmocka_unit_test(test_int_ranges),       cmocka_unit_test(test_int_schemas),
        cmocka_unit_test(test_string_lengths),   cmocka_unit_test(test_json_object_gbnf),
        cmocka_unit_test(test_validator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
