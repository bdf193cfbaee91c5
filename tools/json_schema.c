/*
 * json_schema.c - JSON Schema to GBNF (tools/json_schema.h).
 *
 * The grammar is a subset of the schema's language: every text it matches
 * is valid under the schema, and it spells values one canonical way where
 * JSON allows several (integers without "+", leading zeros or "-0"; enum and
 * const values exactly as cJSON prints them). Keywords:
 *
 *   type            a name or a list: object array string number integer
 *                   boolean null. Without it the type follows the keywords
 *                   present (properties, required, additionalProperties:
 *                   object; items, minItems, maxItems: array; minLength,
 *                   maxLength: string), else any value.
 *   properties      emitted in the schema's order; required ones always,
 *   required        optional ones may each be left out (any subset, order
 *                   kept; linear in the number of properties). A required
 *                   name must be one of the properties.
 *   additionalProperties  false when absent (as llama.cpp), true or a
 *                   schema: extra members after the listed ones, their keys
 *                   plain strings (no escapes) other than the listed names.
 *                   An object with none of the three is any object.
 *   items, minItems, maxItems        (items a schema; the tuple form refused)
 *   minLength, maxLength             characters: a code point or an escape
 *   minimum, maximum, exclusiveMinimum, exclusiveMaximum  for integers only,
 *                   |bound| <= 2^53; exact digit-range grammars.
 *   enum, const     literal alternatives (with "type" they are filtered)
 *   anyOf, oneOf    alternatives (oneOf's exclusivity is not expressed)
 *   $ref            "#", "#/..." (JSON pointers into this document, e.g.
 *                   #/$defs/x, #/definitions/x); a recursive schema becomes a
 *                   recursive rule. Recursion back to a schema with no object
 *                   or array in between (left recursion) is refused.
 *   annotations     title description $schema $id $comment default examples
 *                   $defs definitions (containers of $ref targets)
 *
 * Everything else (pattern, format, multipleOf, allOf, not, if,
 * uniqueItems, patternProperties, minProperties ...) is an error naming the
 * keyword and the JSON pointer of its schema. So is $ref, anyOf/oneOf or
 * enum/const next to constraining keywords (they would need intersection).
 *
 * Whitespace: the rule ws ::= ( " " | "\n" [ \t]{0,32} )? follows every
 * token of a value: nothing, one space, or a newline with up to 32 spaces or
 * tabs of indentation, so a model can pretty-print but never run on in
 * whitespace. No whitespace before or after the top-level value.
 *
 * Numbers: integers have at most 16 digits, fractions at most 16, exponents
 * at most 2. Strings: any code point but " \ and controls, the JSON escapes,
 * \uXXXX without \u0000 and without unpaired surrogates (a high surrogate
 * escape must be followed by a low one).
 *
 * Rule names: "root", the shared primitives (value object array string char
 * hex number integer boolean null ws), and names derived from the path
 * (root-address-street, root-item, a $ref target's last pointer segment),
 * sanitized to [a-zA-Z0-9-], at most 72 characters, made unique with -2, -3...
 *
 * Hostile input: the text is bounded (TERN_JS_MAX_INPUT), its nesting too
 * (TERN_JS_MAX_JSON_DEPTH, checked before cJSON recurses), schemas inside
 * schemas (TERN_JS_MAX_DEPTH), counts (TERN_JS_MAX_COUNT), alternatives
 * (TERN_JS_MAX_ALTS) and the output (TERN_JS_MAX_OUTPUT). \u0000 in the
 * schema text is refused (cJSON would cut strings there).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"

/* ---- the shared primitive rules ------------------------------------------ */

#define G_WS "ws ::= ( \" \" | \"\\n\" [ \\t]{0,32} )?\n"
#define G_HEX "hex ::= [0-9a-fA-F]\n"
#define G_CHAR                                                                            \
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt] | \"\\\\u\" ( \"0\" ( [1-9a-fA-F] " \
    "hex{2} | \"0\" ( [1-9a-fA-F] hex | \"0\" [1-9a-fA-F] ) ) | [1-9a-cA-CeEfF] hex{3} | [dD] "    \
    "[0-7] hex{2} | [dD] [89abAB] hex{2} \"\\\\u\" [dD] [c-fC-F] hex{2} )\n"
#define G_STRING "string ::= \"\\\"\" char* \"\\\"\"\n"
#define G_NUMBER                                                                     \
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] " \
    "[-+]? [0-9]{1,2} )?\n"
#define G_INTEGER "integer ::= \"0\" | \"-\"? [1-9] [0-9]{0,15}\n"
#define G_BOOLEAN "boolean ::= \"true\" | \"false\"\n"
#define G_NULL "null ::= \"null\"\n"
#define G_OBJECT                                                                           \
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value " \
    "ws )* )? \"}\"\n"
#define G_ARRAY "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
#define G_VALUE "value ::= object | array | string | number | boolean | null\n"

static const char JSON_OBJECT_GBNF[] = "root ::= object\n" G_VALUE G_OBJECT G_ARRAY G_STRING G_CHAR G_HEX
    G_NUMBER G_BOOLEAN G_NULL G_WS;

const char *tern_json_object_gbnf(void) { return JSON_OBJECT_GBNF; }

enum { P_VALUE, P_OBJECT, P_ARRAY, P_STRING, P_CHAR, P_HEX, P_NUMBER, P_INTEGER, P_BOOLEAN, P_NULL, P_WS, P_N };
static const struct {
    const char *name, *text;
    unsigned needs; /* other primitives its text names */
} PRIM[P_N] = {
    [P_VALUE] = {"value", G_VALUE,
                 1u << P_OBJECT | 1u << P_ARRAY | 1u << P_STRING | 1u << P_NUMBER | 1u << P_BOOLEAN | 1u << P_NULL},
    [P_OBJECT] = {"object", G_OBJECT, 1u << P_STRING | 1u << P_VALUE | 1u << P_WS},
    [P_ARRAY] = {"array", G_ARRAY, 1u << P_VALUE | 1u << P_WS},
    [P_STRING] = {"string", G_STRING, 1u << P_CHAR},
    [P_CHAR] = {"char", G_CHAR, 1u << P_HEX},
    [P_HEX] = {"hex", G_HEX, 0},
    [P_NUMBER] = {"number", G_NUMBER, 0},
    [P_INTEGER] = {"integer", G_INTEGER, 0},
    [P_BOOLEAN] = {"boolean", G_BOOLEAN, 0},
    [P_NULL] = {"null", G_NULL, 0},
    [P_WS] = {"ws", G_WS, 0},
};

/* ---- text buffers ----------------------------------------------------------
 * Every buffer of a conversion counts against one budget (c->live: the bytes
 * held now), so the output bound holds for the rules being built too. */

typedef struct js js_t;
typedef struct {
    char *p;
    size_t n, cap;
} sb_t;

static int js_fail(js_t *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Map of strings (owned) to ints: rule names, property indexes. */
typedef struct {
    char **key;
    int *val;
    size_t cap, n;
} strmap_t;

/* $ref targets: schema node -> rule name. */
typedef struct {
    const cJSON *node;
    const char *name;
    int in_progress; /* its rule is being built (it is on the stack) */
    int progress_at; /* c->progress when it started */
} ref_t;

struct js {
    const cJSON *doc;
    sb_t out;
    size_t live; /* bytes held by all buffers */
    size_t root_off;
    strmap_t names;    /* every rule name given out (value: next suffix to try) */
    ref_t *refs;       /* open addressing by node pointer */
    size_t refs_cap, refs_n;
    sb_t path;         /* JSON pointer of the schema being converted */
    unsigned prims;    /* primitives used */
    int depth;         /* schemas inside schemas, now */
    int progress;      /* object/array levels entered on the current stack */
    int parsed;        /* errors say where in the schema from here on */
    tern_error_t *err;
};

static int oom(js_t *c) { return js_fail(c, TERN_ENOMEM, "out of memory"); }

static int sb_grow(js_t *c, sb_t *b, size_t add) {
    if (c && c->live + add > TERN_JS_MAX_OUTPUT)
        return js_fail(c, TERN_EINVAL, "the grammar would be larger than %u bytes", TERN_JS_MAX_OUTPUT);
    if (b->n + add + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + add + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return c ? oom(c) : TERN_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (c) c->live += add;
    return 0;
}

static int sb_putn(js_t *c, sb_t *b, const char *s, size_t n) {
    int rc = sb_grow(c, b, n);
    if (rc) return rc;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static int sb_put(js_t *c, sb_t *b, const char *s) { return sb_putn(c, b, s, strlen(s)); }

static int sb_printf(js_t *c, sb_t *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sb_printf(js_t *c, sb_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return js_fail(c, TERN_EINVAL, "internal: bad format");
    int rc = sb_grow(c, b, (size_t)k);
    if (rc) return rc;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
    return 0;
}

static void sb_reset(js_t *c, sb_t *b) {
    if (c) c->live -= b->n;
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

static void sb_free(js_t *c, sb_t *b) {
    sb_reset(c, b);
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

#define TRY(x)                   \
    do {                         \
        int rc_ = (x);           \
        if (rc_) return rc_;     \
    } while (0)

/* ---- errors ----------------------------------------------------------------- */

/* s shortened and with non-printable bytes as \xHH, for messages. */
static const char *shown(const char *s, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; s[i] && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\')
            buf[o++] = (char)ch;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02X", ch);
        if (o + 8 >= cap && s[i + 1]) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
    }
    buf[o] = 0;
    return buf;
}

static int js_fail(js_t *c, int code, const char *fmt, ...) {
    if (!c->err) return code;
    if (c->err->code) return c->err->code; /* the first error stands */
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char where[160] = "";
    if (c->path.n)
        shown(c->path.p, where, sizeof where);
    else
        snprintf(where, sizeof where, "the top level");
    c->err->code = code;
    snprintf(c->err->msg, sizeof c->err->msg, "json schema: %s%s%s", what, c->parsed ? " at " : "",
             c->parsed ? where : "");
    return code;
}

/* ---- string map -------------------------------------------------------------- */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static size_t sm_find(const strmap_t *m, const char *k) {
    size_t i = (size_t)hash_str(k) & (m->cap - 1);
    while (m->key[i] && strcmp(m->key[i], k)) i = (i + 1) & (m->cap - 1);
    return i;
}

static int *sm_get(const strmap_t *m, const char *k) {
    if (!m->cap) return NULL;
    size_t i = sm_find(m, k);
    return m->key[i] ? &m->val[i] : NULL;
}

/* Adds k (copied) with value v; the stored key in *stored. k must be absent. */
static int sm_add(js_t *c, strmap_t *m, const char *k, int v, const char **stored) {
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        char **key = calloc(cap, sizeof *key);
        int *val = calloc(cap, sizeof *val);
        if (!key || !val) {
            free(key);
            free(val);
            return oom(c);
        }
        strmap_t nm = {key, val, cap, m->n};
        for (size_t i = 0; i < m->cap; i++)
            if (m->key[i]) {
                size_t j = sm_find(&nm, m->key[i]);
                nm.key[j] = m->key[i];
                nm.val[j] = m->val[i];
            }
        free(m->key);
        free(m->val);
        *m = nm;
    }
    size_t i = sm_find(m, k);
    m->key[i] = strdup(k);
    if (!m->key[i]) return oom(c);
    m->val[i] = v;
    m->n++;
    if (stored) *stored = m->key[i];
    return 0;
}

static void sm_free(strmap_t *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->key[i]);
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* ---- rule names ------------------------------------------------------------- */

#define NAME_MAX_LEN 72

/* Appends s to b sanitized: [a-zA-Z0-9-] kept, runs of anything else one '-'. */
static void sanitize_into(char *b, size_t cap, const char *s) {
    size_t o = strlen(b);
    for (; *s && o + 1 < cap; s++) {
        char ch = *s;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (ok)
            b[o++] = ch;
        else if (o && b[o - 1] != '-')
            b[o++] = '-';
    }
    while (o && b[o - 1] == '-') o--;
    b[o] = 0;
}

/* base + "-" + part (part may be NULL), sanitized, at most NAME_MAX_LEN. */
static void join_name(char out[NAME_MAX_LEN + 1], const char *base, const char *part) {
    out[0] = 0;
    sanitize_into(out, NAME_MAX_LEN + 1, base);
    if (part) {
        char p[NAME_MAX_LEN + 1] = "";
        sanitize_into(p, sizeof p, part);
        size_t o = strlen(out);
        if (o && o < NAME_MAX_LEN) out[o++] = '-';
        out[o] = 0;
        const char *q = p[0] ? p : "x";
        size_t k = strlen(q);
        if (k > NAME_MAX_LEN - o) k = NAME_MAX_LEN - o;
        memcpy(out + o, q, k);
        out[o + k] = 0;
    }
    size_t o = strlen(out);
    while (o && out[o - 1] == '-') out[--o] = 0;
    if (!o) memcpy(out, "r", 2);
}

/* A fresh rule name from base + "-" + part (part sanitized, may be NULL). */
static int new_name(js_t *c, const char *base, const char *part, const char **out) {
    char nm[NAME_MAX_LEN + 1];
    join_name(nm, base, part);
    int *next = sm_get(&c->names, nm);
    if (!next) return sm_add(c, &c->names, nm, 2, out);
    char cand[NAME_MAX_LEN + 32];
    for (int k = *next;; k++) {
        snprintf(cand, sizeof cand, "%s-%d", nm, k);
        if (!sm_get(&c->names, cand)) {
            *sm_get(&c->names, nm) = k + 1;
            return sm_add(c, &c->names, cand, 2, out);
        }
    }
}

/* Appends "name ::= body\n" to the output. */
static int emit_rule(js_t *c, const char *name, const char *body, size_t n) {
    TRY(sb_put(c, &c->out, name));
    TRY(sb_put(c, &c->out, " ::= "));
    TRY(sb_putn(c, &c->out, body, n));
    return sb_put(c, &c->out, "\n");
}

static const char *prim(js_t *c, int p) {
    c->prims |= 1u << p;
    return PRIM[p].name;
}

/* ---- paths --------------------------------------------------------------------- */

static int path_push(js_t *c, const char *seg, size_t *saved) {
    *saved = c->path.n;
    TRY(sb_putn(NULL, &c->path, "/", 1) ? oom(c) : 0);
    for (const char *s = seg; *s; s++) {
        const char *e = *s == '~' ? "~0" : *s == '/' ? "~1" : NULL;
        if (sb_putn(NULL, &c->path, e ? e : s, e ? 2 : 1)) return oom(c);
    }
    return 0;
}
static int path_push_idx(js_t *c, int i, size_t *saved) {
    char t[24];
    snprintf(t, sizeof t, "%d", i);
    return path_push(c, t, saved);
}
static void path_pop(js_t *c, size_t saved) {
    c->path.n = saved;
    if (c->path.p) c->path.p[saved] = 0;
}

/* ---- UTF-8 and GBNF literals ------------------------------------------------- */

/* Decodes one code point of s[0..n); 0 when the bytes are not valid UTF-8. */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t k;
    uint32_t v, min;
    if ((b & 0xE0) == 0xC0) k = 2, v = b & 0x1F, min = 0x80;
    else if ((b & 0xF0) == 0xE0) k = 3, v = b & 0x0F, min = 0x800;
    else if ((b & 0xF8) == 0xF0) k = 4, v = b & 0x07, min = 0x10000;
    else return 0;
    if (k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return k;
}

/* A code point as GBNF spells it inside a literal (in_class 0) or a
 * character class (1). Non-ASCII always as \u / \U, so grammars are ASCII. */
static int put_cp(js_t *c, sb_t *b, uint32_t cp, int in_class) {
    char t[16];
    if (!in_class && cp == '"') return sb_put(c, b, "\\\"");
    if (cp == '\\') return sb_put(c, b, "\\\\");
    if (cp == '\n') return sb_put(c, b, "\\n");
    if (cp == '\r') return sb_put(c, b, "\\r");
    if (cp == '\t') return sb_put(c, b, "\\t");
    int plain = in_class ? ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9'))
                         : (cp >= 0x20 && cp < 0x7F);
    if (plain) {
        t[0] = (char)cp;
        return sb_putn(c, b, t, 1);
    }
    if (cp < 0x80)
        snprintf(t, sizeof t, "\\x%02X", (unsigned)cp);
    else if (cp <= 0xFFFF)
        snprintf(t, sizeof t, "\\u%04X", (unsigned)cp);
    else
        snprintf(t, sizeof t, "\\U%08X", (unsigned)cp);
    return sb_put(c, b, t);
}

/* The GBNF literal matching exactly the bytes s[0..n) (valid UTF-8). */
static int put_lit(js_t *c, sb_t *b, const char *s, size_t n) {
    TRY(sb_put(c, b, "\""));
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!k) return js_fail(c, TERN_EINVAL, "a string is not valid UTF-8");
        TRY(put_cp(c, b, cp, 0));
        i += k;
    }
    return sb_put(c, b, "\"");
}

/* Appends the JSON text of string s (quotes, escapes) to j (no budget). */
static int json_quote(sb_t *j, const char *s) {
    if (sb_putn(NULL, j, "\"", 1)) return TERN_ENOMEM;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char t[8];
        const char *e = NULL;
        switch (*p) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default:
            if (*p < 0x20) {
                snprintf(t, sizeof t, "\\u%04x", *p);
                e = t;
            }
        }
        if (e ? sb_putn(NULL, j, e, strlen(e)) : sb_putn(NULL, j, (const char *)p, 1)) return TERN_ENOMEM;
    }
    return sb_putn(NULL, j, "\"", 1) ? TERN_ENOMEM : 0;
}

/* The GBNF literal of the JSON text of string s. */
static int put_json_string_lit(js_t *c, sb_t *b, const char *s) {
    sb_t j = {0};
    int rc = json_quote(&j, s);
    rc = rc ? oom(c) : put_lit(c, b, j.p, j.n);
    free(j.p);
    return rc;
}

/* Compact JSON text of v (no budget; the caller bounds it). Numbers in the
 * shortest form that reads back as the same double: cJSON's printer stops
 * at 15 digits when that is merely close, which would name another number.
 * Returns 0, TERN_ENOMEM, or TERN_EUNSUP for a number that is not finite. */
static int json_print(sb_t *j, const cJSON *v) {
    const char *w = cJSON_IsNull(v) ? "null" : cJSON_IsTrue(v) ? "true" : cJSON_IsFalse(v) ? "false" : NULL;
    if (w) return sb_putn(NULL, j, w, strlen(w)) ? TERN_ENOMEM : 0;
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (!isfinite(d)) return TERN_EUNSUP;
        char t[40];
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, d);
            if (strtod(t, NULL) == d) break;
        }
        return sb_putn(NULL, j, t, strlen(t)) ? TERN_ENOMEM : 0;
    }
    if (cJSON_IsString(v)) return json_quote(j, v->valuestring);
    int obj = cJSON_IsObject(v);
    if (!obj && !cJSON_IsArray(v)) return TERN_EUNSUP;
    if (sb_putn(NULL, j, obj ? "{" : "[", 1)) return TERN_ENOMEM;
    for (const cJSON *m = v->child; m; m = m->next) {
        if (m != v->child && sb_putn(NULL, j, ",", 1)) return TERN_ENOMEM;
        if (obj && (json_quote(j, m->string) || sb_putn(NULL, j, ":", 1))) return TERN_ENOMEM;
        int rc = json_print(j, m);
        if (rc) return rc;
        if (j->n > TERN_JS_MAX_OUTPUT) return TERN_ENOMEM; /* reported as the output bound */
    }
    return sb_putn(NULL, j, obj ? "}" : "]", 1) ? TERN_ENOMEM : 0;
}

/* ---- integer ranges ------------------------------------------------------------
 * Canonical decimals of [lo, hi]. Non-negative part: one alternative per
 * digit count d, over the d-digit strings between two bounds a <= b; those
 * are their common prefix, then (first digits differ) a's first digit with
 * a tail >= a's, the digits strictly between with any tail, b's first digit
 * with a tail <= b's; a tail of all 0s (all 9s) folds its branch into the
 * middle class. Negative numbers: "-" and the range of magnitudes. */

#define INT_CAP 9999999999999999ll /* 16 digits, as the integer rule */

static int put_digit_class(js_t *c, sb_t *b, int lo, int hi) {
    if (lo == hi) return sb_printf(c, b, "\"%d\"", lo);
    return sb_printf(c, b, "[%d-%d]", lo, hi);
}

static int put_any_digits(js_t *c, sb_t *b, int k) {
    if (k <= 0) return 0;
    if (k == 1) return sb_put(c, b, " [0-9]");
    return sb_printf(c, b, " [0-9]{%d}", k);
}

/* The k-digit strings s with a <= s <= b (a <= b, both k digits). */
static int digits_between(js_t *c, sb_t *out, const char *a, const char *b, int k) {
    int i = 0;
    while (i < k && a[i] == b[i]) i++;
    if (i > 0) {
        TRY(sb_put(c, out, "\""));
        TRY(sb_putn(c, out, a, (size_t)i));
        TRY(sb_put(c, out, "\""));
    }
    if (i == k) return 0;
    if (i > 0) TRY(sb_put(c, out, " "));
    a += i, b += i, k -= i;
    int a_zero = 1, b_nine = 1;
    for (int j = 1; j < k; j++) {
        if (a[j] != '0') a_zero = 0;
        if (b[j] != '9') b_nine = 0;
    }
    int lo = a[0] - '0' + (a_zero ? 0 : 1), hi = b[0] - '0' - (b_nine ? 0 : 1);
    int n_alt = (!a_zero) + (!b_nine) + (lo <= hi);
    if (n_alt > 1) TRY(sb_put(c, out, "( "));
    int first = 1;
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    if (!a_zero) {
        TRY(sb_printf(c, out, "\"%c\" ", a[0]));
        TRY(digits_between(c, out, a + 1, nines, k - 1));
        first = 0;
    }
    if (lo <= hi) {
        if (!first) TRY(sb_put(c, out, " | "));
        TRY(put_digit_class(c, out, lo, hi));
        TRY(put_any_digits(c, out, k - 1));
        first = 0;
    }
    if (!b_nine) {
        if (!first) TRY(sb_put(c, out, " | "));
        TRY(sb_printf(c, out, "\"%c\" ", b[0]));
        TRY(digits_between(c, out, zeros, b + 1, k - 1));
    }
    if (n_alt > 1) TRY(sb_put(c, out, " )"));
    return 0;
}

/* Alternatives for the non-negative range [lo, hi]; *n_alt counts them.
 * Digit counts covered whole (10^(d-1) .. 10^d - 1, d >= 2) in a row are one
 * alternative: [1-9] [0-9]{d1-1,d2-1}. */
static int nonneg_range(js_t *c, sb_t *out, int64_t lo, int64_t hi, int *n_alt) {
    int64_t p = 1; /* 10^(d-1) */
    int run = 0;   /* first digit count of a run of whole ones, 0: none */
    for (int d = 1; d <= 17; d++, p *= 10) {
        int64_t dlo = d == 1 ? 0 : p, dhi = d == 17 ? 0 : p * 10 - 1;
        int64_t a = lo > dlo ? lo : dlo, b = hi < dhi ? hi : dhi;
        int whole = d >= 2 && d <= 16 && a == dlo && b == dhi;
        if (run && !whole) { /* close the run of d' in [run, d-1] */
            if (*n_alt) TRY(sb_put(c, out, " | "));
            TRY(sb_put(c, out, "[1-9]"));
            if (run == d - 1) TRY(put_any_digits(c, out, run - 1));
            else TRY(sb_printf(c, out, " [0-9]{%d,%d}", run - 1, d - 2));
            (*n_alt)++;
            run = 0;
        }
        if (d == 17) break;
        if (whole) {
            if (!run) run = d;
            continue;
        }
        if (a > b) continue;
        char sa[24], sbuf[24];
        snprintf(sa, sizeof sa, "%0*lld", d, (long long)a);
        snprintf(sbuf, sizeof sbuf, "%0*lld", d, (long long)b);
        if (*n_alt) TRY(sb_put(c, out, " | "));
        TRY(digits_between(c, out, sa, sbuf, d));
        (*n_alt)++;
    }
    return 0;
}

static int int_range(js_t *c, sb_t *out, int64_t lo, int64_t hi) {
    int n = 0;
    if (lo < 0) {
        int64_t mlo = hi < 0 ? -hi : 1, mhi = -lo;
        sb_t neg = {0};
        int k = 0;
        int rc = nonneg_range(c, &neg, mlo, mhi, &k);
        if (!rc) rc = sb_put(c, out, k > 1 ? "\"-\" ( " : "\"-\" ");
        if (!rc) rc = sb_putn(c, out, neg.p, neg.n);
        if (!rc && k > 1) rc = sb_put(c, out, " )");
        sb_free(c, &neg);
        TRY(rc);
        n = 1;
    }
    if (hi >= 0) TRY(nonneg_range(c, out, lo > 0 ? lo : 0, hi, &n));
    return 0;
}

int tern_json_int_range_gbnf(int64_t lo, int64_t hi, char **out) {
    *out = NULL;
    if (lo > hi || lo < -INT_CAP || hi > INT_CAP) return TERN_EINVAL;
    tern_error_t e = {0};
    js_t c = {0};
    c.err = &e;
    sb_t b = {0};
    int rc = int_range(&c, &b, lo, hi);
    sm_free(&c.names);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}

/* ---- schemas ----------------------------------------------------------------------- */

enum {
    K_ANNOT, K_TYPE, K_PROPS, K_REQ, K_ADDL, K_ITEMS, K_MINI, K_MAXI, K_ENUM, K_CONST, K_ANYOF, K_ONEOF,
    K_REF, K_MINL, K_MAXL, K_MIN, K_MAX, K_XMIN, K_XMAX, K_N
};
static const struct {
    const char *name;
    int k;
} KEYWORDS[] = {
    {"type", K_TYPE},       {"properties", K_PROPS},      {"required", K_REQ},
    {"additionalProperties", K_ADDL}, {"items", K_ITEMS}, {"minItems", K_MINI},
    {"maxItems", K_MAXI},   {"enum", K_ENUM},             {"const", K_CONST},
    {"anyOf", K_ANYOF},     {"oneOf", K_ONEOF},           {"$ref", K_REF},
    {"minLength", K_MINL},  {"maxLength", K_MAXL},        {"minimum", K_MIN},
    {"maximum", K_MAX},     {"exclusiveMinimum", K_XMIN}, {"exclusiveMaximum", K_XMAX},
    {"title", K_ANNOT},     {"description", K_ANNOT},     {"$schema", K_ANNOT},
    {"$id", K_ANNOT},       {"$comment", K_ANNOT},        {"default", K_ANNOT},
    {"examples", K_ANNOT},  {"$defs", K_ANNOT},           {"definitions", K_ANNOT},
};

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64 };
static const char *const TYPE_NAMES[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

typedef struct {
    const cJSON *kw[K_N];
    const char *kw_name[K_N];
} kws_t;

static int gen(js_t *c, const cJSON *s, const char *hint, const char *forced, const char **name);

static int gen_child(js_t *c, const cJSON *s, const char *seg1, const char *seg2, int seg2_idx, int progress,
                     const char *base, const char *part, const char **name) {
    size_t saved, dummy;
    TRY(path_push(c, seg1, &saved));
    int rc = 0;
    if (seg2) rc = path_push(c, seg2, &dummy);
    else if (seg2_idx >= 0) rc = path_push_idx(c, seg2_idx, &dummy);
    if (!rc) {
        char hint[NAME_MAX_LEN + 1];
        join_name(hint, base, part);
        c->progress += progress;
        rc = gen(c, s, hint, NULL, name);
        c->progress -= progress;
    }
    path_pop(c, saved);
    return rc;
}

/* A count keyword: a non-negative integer <= TERN_JS_MAX_COUNT, or -1 if absent. */
static int get_count(js_t *c, const kws_t *k, int which, int64_t *v) {
    *v = -1;
    const cJSON *x = k->kw[which];
    if (!x) return 0;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble))
        return js_fail(c, TERN_EINVAL, "\"%s\" must be a non-negative integer", k->kw_name[which]);
    if (x->valuedouble > TERN_JS_MAX_COUNT)
        return js_fail(c, TERN_EUNSUP, "\"%s\" is %.17g, more than the limit of %d", k->kw_name[which], x->valuedouble,
                       TERN_JS_MAX_COUNT);
    *v = (int64_t)x->valuedouble;
    return 0;
}

/* {a,b} repetition suffix (b < 0: unbounded). */
static int put_rep(js_t *c, sb_t *b, int64_t lo, int64_t hi) {
    if (lo == 0 && hi < 0) return sb_put(c, b, "*");
    if (lo == 1 && hi < 0) return sb_put(c, b, "+");
    if (lo == 0 && hi == 1) return sb_put(c, b, "?");
    if (lo == hi) return lo == 1 ? 0 : sb_printf(c, b, "{%lld}", (long long)lo);
    if (hi < 0) return sb_printf(c, b, "{%lld,}", (long long)lo);
    return sb_printf(c, b, "{%lld,%lld}", (long long)lo, (long long)hi);
}

static int parse_types(js_t *c, const cJSON *t, unsigned *mask) {
    *mask = 0;
    const cJSON *one = t;
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : 1;
    if (cJSON_IsArray(t)) {
        if (n == 0) return js_fail(c, TERN_EINVAL, "\"type\" must not be an empty list");
        one = t->child;
    }
    for (; one; one = cJSON_IsArray(t) ? one->next : NULL) {
        if (!cJSON_IsString(one)) return js_fail(c, TERN_EINVAL, "\"type\" must be a type name or a list of them");
        int found = -1;
        for (int i = 0; i < 7; i++)
            if (!strcmp(one->valuestring, TYPE_NAMES[i])) found = i;
        if (found < 0) {
            char sh[64];
            return js_fail(c, TERN_EINVAL, "unknown type \"%s\"", shown(one->valuestring, sh, sizeof sh));
        }
        *mask |= 1u << found;
    }
    return 0;
}

static int value_has_type(const cJSON *v, unsigned mask) {
    if (cJSON_IsObject(v)) return mask & T_OBJECT;
    if (cJSON_IsArray(v)) return mask & T_ARRAY;
    if (cJSON_IsString(v)) return mask & T_STRING;
    if (cJSON_IsBool(v)) return mask & T_BOOLEAN;
    if (cJSON_IsNull(v)) return mask & T_NULL;
    if (cJSON_IsNumber(v))
        return (mask & T_NUMBER) || ((mask & T_INTEGER) && v->valuedouble == floor(v->valuedouble));
    return 0;
}

/* Objects with a key twice have no one meaning (and their literal would
 * not compare equal to the value): refused inside enum and const values. */
static int unique_keys(js_t *c, const cJSON *v, const char *kw) {
    if (cJSON_IsObject(v)) {
        strmap_t seen = {0};
        int rc = 0;
        for (const cJSON *m = v->child; m && !rc; m = m->next) {
            char sh[64];
            if (sm_get(&seen, m->string))
                rc = js_fail(c, TERN_EINVAL, "a value of \"%s\" has the key \"%s\" twice", kw, shown(m->string, sh, sizeof sh));
            else
                rc = sm_add(c, &seen, m->string, 0, NULL);
        }
        sm_free(&seen);
        TRY(rc);
    }
    if (cJSON_IsObject(v) || cJSON_IsArray(v))
        for (const cJSON *m = v->child; m; m = m->next) TRY(unique_keys(c, m, kw));
    return 0;
}

/* enum / const (with "type" as a filter). */
static int gen_enum(js_t *c, const kws_t *k, sb_t *body) {
    unsigned mask = 0x7f;
    if (k->kw[K_TYPE]) TRY(parse_types(c, k->kw[K_TYPE], &mask));
    const cJSON *en = k->kw[K_ENUM], *cn = k->kw[K_CONST];
    if (en) {
        if (!cJSON_IsArray(en) || !en->child) return js_fail(c, TERN_EINVAL, "\"enum\" must be a non-empty array");
        int n = cJSON_GetArraySize(en);
        if (n > TERN_JS_MAX_ALTS)
            return js_fail(c, TERN_EUNSUP, "\"enum\" has %d values, more than the limit of %d", n, TERN_JS_MAX_ALTS);
    }
    int n_out = 0;
    for (const cJSON *v = cn ? cn : en->child; v; v = cn ? NULL : v->next) {
        if (cn && en) {
            int in = 0;
            for (const cJSON *e = en->child; e && !in; e = e->next) in = cJSON_Compare(e, cn, 1);
            if (!in) break;
        }
        if (!value_has_type(v, mask)) continue;
        TRY(unique_keys(c, v, cn ? "const" : "enum"));
        sb_t txt = {0};
        int rc = json_print(&txt, v);
        if (rc == TERN_EUNSUP) /* 1e999 reads as inf */
            rc = js_fail(c, TERN_EUNSUP, "a number in \"%s\" is out of range", cn ? "const" : "enum");
        else if (rc && txt.n > TERN_JS_MAX_OUTPUT)
            rc = js_fail(c, TERN_EINVAL, "the grammar would be larger than %u bytes", TERN_JS_MAX_OUTPUT);
        else if (rc)
            rc = oom(c);
        if (!rc && n_out) rc = sb_put(c, body, " | ");
        if (!rc) rc = put_lit(c, body, txt.p, txt.n);
        free(txt.p);
        TRY(rc);
        n_out++;
    }
    if (!n_out) return js_fail(c, TERN_EINVAL, "\"%s\" admits no value of the allowed type", cn ? "const" : "enum");
    return 0;
}

/* ---- objects ---- */

/* A trie of the listed property names (plain ones: no " \ or control), for
 * the keys of additional properties, which must differ from all of them. */
typedef struct {
    uint32_t cp;
    int first, next, last; /* children list (first/last child), sibling */
    int terminal;
} tnode_t;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Rules <base>-key-<i>, one per trie node: the rest of a plain key (and its
 * closing quote) after that node's prefix, such that the key is none of the
 * names. Sets *key_expr to the expression for a whole key. */
static int gen_extra_keys(js_t *c, const cJSON *props, const char *base, sb_t *key_expr) {
    int n = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) n++;
    const char **keys = calloc((size_t)n + 1, sizeof *keys);
    tnode_t *t = NULL;
    int nt = 0, cap = 0, rc = 0, nk = 0;
    const char **rule = NULL;
    if (!keys) return oom(c);
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        int plain = 1;
        for (const unsigned char *s = (const unsigned char *)p->string; *s; s++)
            if (*s == '"' || *s == '\\' || *s < 0x20) plain = 0;
        if (plain) keys[nk++] = p->string;
    }
    qsort(keys, (size_t)nk, sizeof *keys, cmp_str); /* byte order is code point order */
    cap = 64;
    t = malloc((size_t)cap * sizeof *t);
    if (!t) rc = oom(c);
    if (!rc) t[nt++] = (tnode_t){0, -1, -1, -1, 0};
    for (int i = 0; !rc && i < nk; i++) {
        int v = 0;
        const unsigned char *s = (const unsigned char *)keys[i];
        size_t len = strlen(keys[i]);
        for (size_t o = 0; !rc && o < len;) {
            uint32_t cp;
            size_t kk = utf8_next(s + o, len - o, &cp);
            if (!kk) {
                rc = js_fail(c, TERN_EINVAL, "a property name is not valid UTF-8");
                break;
            }
            o += kk;
            /* sorted: a shared prefix continues at the last child */
            if (t[v].last >= 0 && t[t[v].last].cp == cp) {
                v = t[v].last;
                continue;
            }
            if (nt == cap) {
                tnode_t *g = realloc(t, (size_t)cap * 2 * sizeof *t);
                if (!g) {
                    rc = oom(c);
                    break;
                }
                t = g, cap *= 2;
            }
            t[nt] = (tnode_t){cp, -1, -1, -1, 0};
            if (t[v].last >= 0) t[t[v].last].next = nt;
            else t[v].first = nt;
            t[v].last = nt;
            v = nt++;
        }
        if (!rc) t[v].terminal = 1;
    }
    if (!rc) {
        rule = calloc((size_t)nt, sizeof *rule);
        if (!rule) rc = oom(c);
    }
    for (int v = 0; !rc && v < nt; v++) {
        char part[24];
        snprintf(part, sizeof part, "key-%d", v);
        rc = new_name(c, base, part, &rule[v]);
    }
    for (int v = 0; !rc && v < nt; v++) {
        sb_t b = {0};
        int alts = 0;
        if (!t[v].terminal) rc = sb_put(c, &b, "\"\\\"\""), alts++;
        for (int ch = t[v].first; !rc && ch >= 0; ch = t[ch].next) {
            if (alts++) rc = sb_put(c, &b, " | ");
            if (!rc) rc = sb_put(c, &b, "\"");
            if (!rc) rc = put_cp(c, &b, t[ch].cp, 0);
            if (!rc) rc = sb_printf(c, &b, "\" %s", rule[ch]);
        }
        if (!rc && alts) rc = sb_put(c, &b, " | ");
        if (!rc) rc = sb_put(c, &b, "[^\"\\\\\\x00-\\x1F");
        for (int ch = t[v].first; !rc && ch >= 0; ch = t[ch].next) rc = put_cp(c, &b, t[ch].cp, 1);
        if (!rc) rc = sb_put(c, &b, "] [^\"\\\\\\x00-\\x1F]* \"\\\"\"");
        if (!rc) rc = emit_rule(c, rule[v], b.p, b.n);
        sb_free(c, &b);
    }
    if (!rc) rc = sb_printf(c, key_expr, "\"\\\"\" %s", rule[0]);
    free(rule);
    free(t);
    free(keys);
    return rc;
}

static int gen_object(js_t *c, const kws_t *k, const char *base, sb_t *body, const char **primname) {
    const cJSON *props = k->kw[K_PROPS], *req = k->kw[K_REQ], *addl = k->kw[K_ADDL];
    if (props && !cJSON_IsObject(props)) return js_fail(c, TERN_EINVAL, "\"properties\" must be an object");
    if (req && !cJSON_IsArray(req)) return js_fail(c, TERN_EINVAL, "\"required\" must be an array of strings");
    if (addl && !cJSON_IsObject(addl) && !cJSON_IsBool(addl))
        return js_fail(c, TERN_EINVAL, "\"additionalProperties\" must be a schema");
    int n = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) n++;
    int has_req = req && req->child;
    int extras = addl ? !cJSON_IsFalse(addl) : 0;
    if ((!props && !has_req && !addl) || (n == 0 && !has_req && extras && cJSON_IsTrue(addl))) {
        *primname = prim(c, P_OBJECT);
        return 0;
    }
    prim(c, P_WS);
    strmap_t idx = {0};
    int rc = 0;
    char *isreq = calloc((size_t)n + 1, 1);
    const char **kv = calloc((size_t)n + 1, sizeof *kv);
    const cJSON **pv = calloc((size_t)n + 1, sizeof *pv);
    sb_t tmp = {0}, xkey = {0};
    const char *xkv = NULL;
    if (!isreq || !kv || !pv) rc = oom(c);
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; !rc && p; p = p->next, i++) {
        char sh[64];
        pv[i] = p;
        if (sm_get(&idx, p->string))
            rc = js_fail(c, TERN_EINVAL, "property \"%s\" appears twice in \"properties\"", shown(p->string, sh, sizeof sh));
        else
            rc = sm_add(c, &idx, p->string, i, NULL);
    }
    for (const cJSON *r = req ? req->child : NULL; !rc && r; r = r->next) {
        char sh[64];
        if (!cJSON_IsString(r)) {
            rc = js_fail(c, TERN_EINVAL, "\"required\" must be an array of strings");
            break;
        }
        int *at = sm_get(&idx, r->valuestring);
        if (!at)
            rc = js_fail(c, TERN_EUNSUP, "required property \"%s\" is not in \"properties\"",
                         shown(r->valuestring, sh, sizeof sh));
        else
            isreq[*at] = 1;
    }
    /* the members: "key" ws ":" ws value ws */
    for (i = 0; !rc && i < n; i++) {
        const char *vname;
        rc = gen_child(c, pv[i], "properties", pv[i]->string, -1, 1, base, pv[i]->string, &vname);
        char part[NAME_MAX_LEN + 8] = "";
        sanitize_into(part, NAME_MAX_LEN + 1, pv[i]->string); /* room left for "-kv" */
        memcpy(part + strlen(part), "-kv", 4);
        if (!rc) rc = new_name(c, base, part, &kv[i]);
        sb_reset(c, &tmp);
        if (!rc) rc = put_json_string_lit(c, &tmp, pv[i]->string);
        if (!rc) rc = sb_printf(c, &tmp, " ws \":\" ws %s ws", vname);
        if (!rc) rc = emit_rule(c, kv[i], tmp.p, tmp.n);
    }
    if (!rc && extras) {
        const char *vname = prim(c, P_VALUE);
        if (cJSON_IsObject(addl)) rc = gen_child(c, addl, "additionalProperties", NULL, -1, 1, base, "additional", &vname);
        if (!rc && n) rc = gen_extra_keys(c, props, base, &xkey);
        else if (!rc) rc = sb_put(c, &xkey, prim(c, P_STRING));
        if (!rc) rc = new_name(c, base, "extra-kv", &xkv);
        sb_reset(c, &tmp);
        if (!rc) rc = sb_printf(c, &tmp, "%s ws \":\" ws %s ws", xkey.p, vname);
        if (!rc) rc = emit_rule(c, xkv, tmp.p, tmp.n);
    }
    int f = 0; /* the first required property (n: none) */
    while (f < n && !isreq[f]) f++;
    /* tail(i): the members after i-1 when one came before (each with its
     * comma); head(i): the members from i on when none came before. */
    if (!rc && (f == 0 || n == 0)) {
        /* no optional member before the first required one: one line */
        rc = sb_put(c, body, "\"{\" ws ");
        if (!rc && n) rc = sb_put(c, body, kv[0]);
        for (i = 1; !rc && i < n; i++)
            rc = sb_printf(c, body, isreq[i] ? " \",\" ws %s" : " ( \",\" ws %s )?", kv[i]);
        if (!rc && extras && n) rc = sb_printf(c, body, " ( \",\" ws %s )*", xkv);
        if (!rc && extras && !n) rc = sb_printf(c, body, "( %s ( \",\" ws %s )* )?", xkv, xkv);
        if (!rc) rc = sb_put(c, body, " \"}\"");
    } else if (!rc) {
        /* rules <base>-rest-i for tail(i), i = 1..n (none when empty) */
        const char **rest = calloc((size_t)n + 2, sizeof *rest);
        if (!rest) rc = oom(c);
        for (i = n; !rc && i >= 1; i--) {
            sb_reset(c, &tmp);
            if (i == n) {
                if (extras) rc = sb_printf(c, &tmp, "( \",\" ws %s )*", xkv);
            } else {
                rc = sb_printf(c, &tmp, isreq[i] ? "\",\" ws %s" : "( \",\" ws %s )?", kv[i]);
                if (!rc && rest[i + 1]) rc = sb_printf(c, &tmp, " %s", rest[i + 1]);
            }
            if (!rc && tmp.n) {
                char part[24];
                snprintf(part, sizeof part, "rest-%d", i);
                rc = new_name(c, base, part, &rest[i]);
                if (!rc) rc = emit_rule(c, rest[i], tmp.p, tmp.n);
            }
        }
        /* head(i) for i = f down to 1 as rules <base>-from-i; head(0) inline */
        const char *next = NULL; /* head(i+1)'s rule, NULL when it is empty */
        sb_t h = {0};
        for (i = f < n ? f : n; !rc && i >= 0; i--) {
            sb_reset(c, &h);
            if (i == n) { /* f == n: every member optional, so may the extras be */
                if (extras) rc = sb_printf(c, &h, "( %s ( \",\" ws %s )* )?", xkv, xkv);
            } else {
                int opt = !isreq[i];
                const char *tl = rest[i + 1];
                if (opt && !next) rc = sb_printf(c, &h, "( %s%s%s )?", kv[i], tl ? " " : "", tl ? tl : "");
                else rc = sb_printf(c, &h, "%s%s%s", kv[i], tl ? " " : "", tl ? tl : "");
                if (!rc && opt && next) rc = sb_printf(c, &h, " | %s", next);
            }
            if (rc) break;
            if (i == 0) {
                rc = sb_put(c, body, "\"{\" ws ");
                if (!rc && h.n) rc = sb_printf(c, body, "( %s ) ", h.p);
                if (!rc) rc = sb_put(c, body, "\"}\"");
            } else if (h.n) {
                char part[24];
                snprintf(part, sizeof part, "from-%d", i);
                const char *nm;
                rc = new_name(c, base, part, &nm);
                if (!rc) rc = emit_rule(c, nm, h.p, h.n);
                next = nm;
            } else {
                next = NULL;
            }
        }
        sb_free(c, &h);
        free(rest);
    }
    sb_free(c, &tmp);
    sb_free(c, &xkey);
    sm_free(&idx);
    free(isreq);
    free(kv);
    free(pv);
    return rc;
}

static int gen_array(js_t *c, const kws_t *k, const char *base, sb_t *body, const char **primname) {
    const cJSON *items = k->kw[K_ITEMS];
    int64_t lo, hi;
    TRY(get_count(c, k, K_MINI, &lo));
    TRY(get_count(c, k, K_MAXI, &hi));
    if (items && cJSON_IsArray(items))
        return js_fail(c, TERN_EUNSUP, "\"items\" as an array (tuple form) is not supported");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return js_fail(c, TERN_EINVAL, "\"items\" must be a schema");
    if (lo < 0) lo = 0;
    if (hi >= 0 && lo > hi) return js_fail(c, TERN_EINVAL, "\"minItems\" is more than \"maxItems\"");
    if (!items && lo == 0 && hi < 0) {
        *primname = prim(c, P_ARRAY);
        return 0;
    }
    const char *iname = NULL;
    if (items && cJSON_IsFalse(items)) {
        if (lo > 0) return js_fail(c, TERN_EINVAL, "\"items\": false admits no item but minItems is %lld", (long long)lo);
        hi = 0;
    } else if (items) {
        TRY(gen_child(c, items, "items", NULL, -1, 1, base, "item", &iname));
    }
    prim(c, P_WS);
    if (hi == 0) return sb_put(c, body, "\"[\" ws \"]\"");
    if (!iname) iname = prim(c, P_VALUE);
    TRY(sb_put(c, body, "\"[\" ws "));
    if (lo == 0) TRY(sb_put(c, body, "( "));
    TRY(sb_printf(c, body, "%s ws", iname));
    if (hi != 1) {
        TRY(sb_printf(c, body, " ( \",\" ws %s ws )", iname));
        TRY(put_rep(c, body, lo ? lo - 1 : 0, hi < 0 ? -1 : hi - 1));
    }
    if (lo == 0) TRY(sb_put(c, body, " )?"));
    return sb_put(c, body, " \"]\"");
}

static int gen_string(js_t *c, const kws_t *k, sb_t *body, const char **primname) {
    int64_t lo, hi;
    TRY(get_count(c, k, K_MINL, &lo));
    TRY(get_count(c, k, K_MAXL, &hi));
    if (lo < 0 && hi < 0) {
        *primname = prim(c, P_STRING);
        return 0;
    }
    if (lo < 0) lo = 0;
    if (hi >= 0 && lo > hi) return js_fail(c, TERN_EINVAL, "\"minLength\" is more than \"maxLength\"");
    if (hi == 0) return sb_put(c, body, "\"\\\"\" \"\\\"\"");
    prim(c, P_CHAR);
    TRY(sb_put(c, body, "\"\\\"\" char"));
    TRY(put_rep(c, body, lo, hi));
    return sb_put(c, body, " \"\\\"\"");
}

/* A bound keyword's number, checked; *v unset when absent or boolean. */
static int bound_value(js_t *c, const kws_t *k, int which, int bool_ok, double *v, int *has) {
    const cJSON *x = k->kw[which];
    *has = 0;
    if (!x) return 0;
    if (cJSON_IsBool(x) && bool_ok) return 0;
    if (!cJSON_IsNumber(x)) return js_fail(c, TERN_EINVAL, "\"%s\" must be a number", k->kw_name[which]);
    if (!(fabs(x->valuedouble) <= 9007199254740992.0))
        return js_fail(c, TERN_EUNSUP, "\"%s\" %.17g is beyond +-2^53", k->kw_name[which], x->valuedouble);
    *v = x->valuedouble;
    *has = 1;
    return 0;
}

/* Integer bounds: minimum (ceil), maximum (floor), exclusiveMinimum and
 * exclusiveMaximum as numbers or in the draft-4 boolean form. */
static int gen_integer(js_t *c, const kws_t *k, sb_t *body, const char **primname) {
    int64_t lo = -INT_CAP, hi = INT_CAP;
    double v;
    int has, bounded = 0;
    int xmin_true = k->kw[K_XMIN] && cJSON_IsTrue(k->kw[K_XMIN]);
    int xmax_true = k->kw[K_XMAX] && cJSON_IsTrue(k->kw[K_XMAX]);
    if (xmin_true && !k->kw[K_MIN]) return js_fail(c, TERN_EINVAL, "\"exclusiveMinimum\": true needs \"minimum\"");
    if (xmax_true && !k->kw[K_MAX]) return js_fail(c, TERN_EINVAL, "\"exclusiveMaximum\": true needs \"maximum\"");
    TRY(bound_value(c, k, K_MIN, 0, &v, &has));
    if (has) {
        int64_t b = xmin_true ? (int64_t)floor(v) + 1 : (int64_t)ceil(v);
        if (b > lo) lo = b;
        bounded = 1;
    }
    TRY(bound_value(c, k, K_MAX, 0, &v, &has));
    if (has) {
        int64_t b = xmax_true ? (int64_t)ceil(v) - 1 : (int64_t)floor(v);
        if (b < hi) hi = b;
        bounded = 1;
    }
    TRY(bound_value(c, k, K_XMIN, 1, &v, &has));
    if (has) {
        int64_t b = (int64_t)floor(v) + 1;
        if (b > lo) lo = b;
        bounded = 1;
    }
    TRY(bound_value(c, k, K_XMAX, 1, &v, &has));
    if (has) {
        int64_t b = (int64_t)ceil(v) - 1;
        if (b < hi) hi = b;
        bounded = 1;
    }
    if (!bounded) {
        *primname = prim(c, P_INTEGER);
        return 0;
    }
    if (lo > hi) return js_fail(c, TERN_EINVAL, "no integer is within the bounds");
    return int_range(c, body, lo, hi);
}

/* type-driven schemas: one alternative per allowed type */
static int gen_typed(js_t *c, const kws_t *k, const char *base, sb_t *body, const char **primname) {
    unsigned mask = 0;
    if (k->kw[K_TYPE]) {
        TRY(parse_types(c, k->kw[K_TYPE], &mask));
    } else {
        if (k->kw[K_PROPS] || k->kw[K_REQ] || k->kw[K_ADDL]) mask |= T_OBJECT;
        if (k->kw[K_ITEMS] || k->kw[K_MINI] || k->kw[K_MAXI]) mask |= T_ARRAY;
        if (k->kw[K_MINL] || k->kw[K_MAXL]) mask |= T_STRING;
        if (k->kw[K_MIN] || k->kw[K_MAX] || k->kw[K_XMIN] || k->kw[K_XMAX]) mask |= T_NUMBER;
        if (!mask) {
            *primname = prim(c, P_VALUE);
            return 0;
        }
    }
    if (mask & T_NUMBER) {
        static const int b[4] = {K_MIN, K_MAX, K_XMIN, K_XMAX};
        for (int i = 0; i < 4; i++)
            if (k->kw[b[i]])
                return js_fail(c, TERN_EUNSUP, "\"%s\" is supported for type \"integer\" only", k->kw_name[b[i]]);
        mask &= ~(unsigned)T_INTEGER; /* number covers the integers */
    }
    int multi = (mask & (mask - 1)) != 0, n_alt = 0;
    for (int t = 0; t < 7; t++) {
        if (!(mask & (1u << t))) continue;
        sb_t alt = {0};
        const char *pn = NULL;
        int rc;
        switch (1 << t) {
        case T_OBJECT: rc = gen_object(c, k, base, &alt, &pn); break;
        case T_ARRAY: rc = gen_array(c, k, base, &alt, &pn); break;
        case T_STRING: rc = gen_string(c, k, &alt, &pn); break;
        case T_NUMBER: rc = 0, pn = prim(c, P_NUMBER); break;
        case T_INTEGER: rc = gen_integer(c, k, &alt, &pn); break;
        case T_BOOLEAN: rc = 0, pn = prim(c, P_BOOLEAN); break;
        default: rc = 0, pn = prim(c, P_NULL); break;
        }
        if (!rc && !multi && pn) *primname = pn;
        else if (!rc && n_alt++) rc = sb_put(c, body, " | ");
        if (!rc && !*primname) {
            if (pn) rc = sb_put(c, body, pn);
            else if (multi) rc = sb_printf(c, body, "( %s )", alt.p);
            else rc = sb_putn(c, body, alt.p, alt.n);
        }
        sb_free(c, &alt);
        TRY(rc);
    }
    return 0;
}

/* Resolves a local $ref ("#" or "#/pointer") in the document. */
static const cJSON *resolve(const cJSON *doc, const char *ref) {
    if (!strcmp(ref, "#")) return doc;
    if (strncmp(ref, "#/", 2)) return NULL;
    const cJSON *at = doc;
    const char *s = ref + 2;
    char seg[512];
    for (;;) {
        size_t o = 0;
        for (; *s && *s != '/'; s++) {
            char ch = *s;
            if (ch == '~') {
                if (s[1] == '0') ch = '~';
                else if (s[1] == '1') ch = '/';
                else return NULL;
                s++;
            }
            if (o + 1 >= sizeof seg) return NULL;
            seg[o++] = ch;
        }
        seg[o] = 0;
        if (cJSON_IsObject(at)) {
            at = cJSON_GetObjectItemCaseSensitive(at, seg);
        } else if (cJSON_IsArray(at)) {
            char *end;
            if (!o || (o > 1 && seg[0] == '0')) return NULL;
            long i = strtol(seg, &end, 10);
            if (*end || i < 0 || i >= cJSON_GetArraySize(at)) return NULL;
            at = cJSON_GetArrayItem(at, (int)i);
        } else {
            return NULL;
        }
        if (!at) return NULL;
        if (!*s) return at;
        s++;
    }
}

static ref_t *ref_slot(js_t *c, const cJSON *node) {
    size_t h = (size_t)(((uintptr_t)node >> 4) * 0x9E3779B97F4A7C15ull);
    size_t i = h & (c->refs_cap - 1);
    while (c->refs[i].node && c->refs[i].node != node) i = (i + 1) & (c->refs_cap - 1);
    return &c->refs[i];
}

static int ref_add(js_t *c, const cJSON *node, const char *name) {
    if (2 * (c->refs_n + 1) > c->refs_cap) {
        size_t cap = c->refs_cap ? c->refs_cap * 2 : 32;
        ref_t *old = c->refs;
        size_t oc = c->refs_cap;
        c->refs = calloc(cap, sizeof *c->refs);
        if (!c->refs) {
            c->refs = old;
            return oom(c);
        }
        c->refs_cap = cap;
        for (size_t i = 0; i < oc; i++)
            if (old[i].node) *ref_slot(c, old[i].node) = old[i];
        free(old);
    }
    ref_t *r = ref_slot(c, node);
    *r = (ref_t){node, name, 1, c->progress};
    c->refs_n++;
    return 0;
}

static int gen_ref(js_t *c, const cJSON *ref, const char **name) {
    char sh[96];
    if (!cJSON_IsString(ref)) return js_fail(c, TERN_EINVAL, "\"$ref\" must be a string");
    const char *s = ref->valuestring;
    if (s[0] != '#' || (s[1] && s[1] != '/'))
        return js_fail(c, TERN_EUNSUP, "$ref \"%s\": only local references (\"#\", \"#/...\") are supported",
                       shown(s, sh, sizeof sh));
    const cJSON *t = resolve(c->doc, s);
    if (!t) return js_fail(c, TERN_EINVAL, "$ref \"%s\" does not resolve", shown(s, sh, sizeof sh));
    ref_t *r = c->refs_cap ? ref_slot(c, t) : NULL;
    if (r && r->node) {
        if (r->in_progress && r->progress_at == c->progress)
            return js_fail(c, TERN_EUNSUP,
                           "$ref \"%s\" leads back to itself with no object or array in between (left recursion)",
                           shown(s, sh, sizeof sh));
        *name = r->name;
        return 0;
    }
    const char *last = strrchr(s, '/');
    char part[NAME_MAX_LEN + 1] = "";
    sanitize_into(part, sizeof part, last ? last + 1 : "");
    const char *nm;
    TRY(new_name(c, part[0] ? part : "ref", NULL, &nm));
    TRY(ref_add(c, t, nm));
    /* build it with the target's own pointer as the path */
    sb_t saved = c->path;
    sb_t p = {0};
    if (sb_putn(NULL, &p, s + 1, strlen(s + 1))) return oom(c);
    c->path = p;
    int rc = gen(c, t, nm, nm, name);
    free(c->path.p);
    c->path = saved;
    ref_slot(c, t)->in_progress = 0;
    return rc;
}

static int gen_inner(js_t *c, const cJSON *s, const char *hint, const char *forced, const char **name) {
    if (cJSON_IsTrue(s)) {
        *name = prim(c, P_VALUE);
    } else if (cJSON_IsFalse(s)) {
        return js_fail(c, TERN_EINVAL, "the schema false admits no value");
    } else if (!cJSON_IsObject(s)) {
        return js_fail(c, TERN_EINVAL, "a schema must be an object or a boolean");
    }
    if (*name && !forced) return 0;
    sb_t body = {0};
    const char *pn = *name;
    const char *base = forced;
    int rc = 0;
    if (!pn) {
        kws_t k;
        memset(&k, 0, sizeof k);
        for (const cJSON *x = s->child; x; x = x->next) {
            int found = -1;
            char sh[64];
            for (size_t i = 0; i < sizeof KEYWORDS / sizeof *KEYWORDS; i++)
                if (!strcmp(x->string, KEYWORDS[i].name)) found = KEYWORDS[i].k;
            if (found < 0)
                return js_fail(c, TERN_EUNSUP, "unsupported keyword \"%s\"", shown(x->string, sh, sizeof sh));
            if (found == K_ANNOT) continue;
            if (k.kw[found]) return js_fail(c, TERN_EINVAL, "keyword \"%s\" appears twice", x->string);
            k.kw[found] = x;
            k.kw_name[found] = x->string;
        }
        /* $ref, anyOf/oneOf and enum/const stand alone (enum/const: with type) */
        static const int alone[3] = {K_REF, K_ANYOF, K_ENUM};
        for (int a = 0; a < 3; a++) {
            int kw = alone[a];
            const cJSON *me = k.kw[kw];
            if (!me && kw == K_ANYOF) me = k.kw[K_ONEOF];
            if (!me && kw == K_ENUM) me = k.kw[K_CONST];
            if (!me) continue;
            for (int o = 1; o < K_N; o++) {
                if (!k.kw[o] || k.kw[o] == me) continue;
                if (kw == K_ENUM && (o == K_TYPE || o == K_ENUM || o == K_CONST)) continue;
                return js_fail(c, TERN_EUNSUP, "\"%s\" next to \"%s\" is not supported", me->string, k.kw_name[o]);
            }
            break;
        }
        if (!base) rc = new_name(c, hint, NULL, &base);
        if (rc) {
        } else if (k.kw[K_REF]) {
            rc = gen_ref(c, k.kw[K_REF], &pn);
        } else if (k.kw[K_ANYOF] || k.kw[K_ONEOF]) {
            const cJSON *arr = k.kw[K_ANYOF] ? k.kw[K_ANYOF] : k.kw[K_ONEOF];
            const char *kwn = arr->string;
            if (!cJSON_IsArray(arr) || !arr->child) {
                rc = js_fail(c, TERN_EINVAL, "\"%s\" must be a non-empty array of schemas", kwn);
            } else if (cJSON_GetArraySize(arr) > TERN_JS_MAX_ALTS) {
                rc = js_fail(c, TERN_EUNSUP, "\"%s\" has more than %d schemas", kwn, TERN_JS_MAX_ALTS);
            } else {
                int i = 0;
                for (const cJSON *b = arr->child; !rc && b; b = b->next, i++) {
                    const char *bn;
                    char part[16];
                    snprintf(part, sizeof part, "%d", i);
                    rc = gen_child(c, b, kwn, NULL, i, 0, base, part, &bn);
                    if (!rc && i) rc = sb_put(c, &body, " | ");
                    if (!rc) rc = sb_put(c, &body, bn);
                }
            }
        } else if (k.kw[K_ENUM] || k.kw[K_CONST]) {
            rc = gen_enum(c, &k, &body);
        } else {
            rc = gen_typed(c, &k, base, &body, &pn);
        }
    }
    if (!rc) {
        if (pn && !forced) {
            *name = pn;
        } else {
            if (!base) rc = new_name(c, hint, NULL, &base);
            if (!rc && forced && !strcmp(forced, "root")) c->root_off = c->out.n;
            if (!rc) rc = emit_rule(c, base, pn ? pn : body.p, pn ? strlen(pn) : body.n);
            *name = base;
        }
    }
    sb_free(c, &body);
    return rc;
}

static int gen(js_t *c, const cJSON *s, const char *hint, const char *forced, const char **name) {
    *name = NULL;
    if (c->depth >= TERN_JS_MAX_DEPTH)
        return js_fail(c, TERN_EUNSUP, "schemas nested deeper than %d levels", TERN_JS_MAX_DEPTH);
    c->depth++;
    int rc = gen_inner(c, s, hint, forced, name);
    c->depth--;
    return rc;
}

/* ---- the entry point ---------------------------------------------------------- */

/* Nesting and \u0000 before cJSON sees the text (cJSON recurses per level). */
static int prescan(js_t *c, const char *b, size_t n) {
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)b[i];
        if (in_str) {
            if (ch == '\\') {
                if (i + 5 < n && b[i + 1] == 'u' && !memcmp(b + i + 2, "0000", 4))
                    return js_fail(c, TERN_EUNSUP, "\\u0000 in a string (byte %zu) is not supported", i);
                i++;
            } else if (ch == '"') {
                in_str = 0;
            } else if (ch < 0x20) {
                return js_fail(c, TERN_EINVAL, "invalid JSON: a control character in a string (byte %zu)", i);
            }
        } else if (ch == '"') {
            in_str = 1;
        } else if (ch == '[' || ch == '{') {
            if (++depth > TERN_JS_MAX_JSON_DEPTH)
                return js_fail(c, TERN_EUNSUP, "JSON nested deeper than %d levels (byte %zu)", TERN_JS_MAX_JSON_DEPTH, i);
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return 0;
}

int tern_json_schema_to_gbnf(const char *schema, size_t len, char **out, tern_error_t *err) {
    tern_error_t local = {0};
    if (!err) err = &local;
    memset(err, 0, sizeof *err);
    js_t c = {0};
    c.err = err;
    if (!out) return js_fail(&c, TERN_EINVAL, "no output pointer");
    *out = NULL;
    if (!schema && len) return js_fail(&c, TERN_EINVAL, "no schema text");
    if (len > TERN_JS_MAX_INPUT)
        return js_fail(&c, TERN_EUNSUP, "schema text of %zu bytes, more than the limit of %u", len, TERN_JS_MAX_INPUT);
    int rc = prescan(&c, schema ? schema : "", len);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *doc = len ? cJSON_ParseWithLengthOpts(schema, len, &end, 0) : NULL;
    if (!doc) {
        size_t at = end && end >= schema ? (size_t)(end - schema) : 0;
        return js_fail(&c, TERN_EINVAL, "invalid JSON (near byte %zu)", at);
    }
    for (const char *p = end; p < schema + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(doc);
            return js_fail(&c, TERN_EINVAL, "invalid JSON: unexpected data after the schema (byte %zu)",
                           (size_t)(p - schema));
        }
    c.doc = doc;
    c.parsed = 1;
    /* the primitives' names and "root" are taken */
    for (int p = 0; p < P_N && !rc; p++) rc = sm_add(&c, &c.names, PRIM[p].name, 2, NULL);
    const char *root = NULL, *name;
    if (!rc) rc = sm_add(&c, &c.names, "root", 2, &root);
    if (!rc) rc = ref_add(&c, doc, root);
    if (!rc) rc = gen(&c, doc, "root", root, &name);
    sb_t fin = {0};
    if (!rc) {
        /* root first, then the rules in the order they were made, then the primitives */
        unsigned need = c.prims;
        for (int round = 0; round < P_N; round++)
            for (int p = 0; p < P_N; p++)
                if (need & (1u << p)) need |= PRIM[p].needs;
        rc = sb_putn(&c, &fin, c.out.p + c.root_off, c.out.n - c.root_off);
        if (!rc) rc = sb_putn(&c, &fin, c.out.p, c.root_off);
        for (int p = 0; p < P_N && !rc; p++)
            if (need & (1u << p)) rc = sb_put(&c, &fin, PRIM[p].text);
    }
    cJSON_Delete(doc);
    sb_free(&c, &c.out);
    free(c.path.p);
    sm_free(&c.names);
    free(c.refs);
    if (rc) {
        free(fin.p);
        return rc;
    }
    *out = fin.p;
    return 0;
}
