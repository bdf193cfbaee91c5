/*
 * grammar_check.c - the independent judges of tests/grammar_check.h.
 *
 * The PCRE2 patterns are compiled once per process and kept (tests are
 * single-threaded). The recursive-descent checkers implement ordered
 * choice; their grammars (arithmetic.gbnf, c.gbnf) are written so that the
 * first alternative that matches is the only one that can lead to a full
 * match, which makes ordered choice decide exactly the grammar's language
 * (tests/test_grammar_corpus.c cross-checks them against a PCRE2 reading of
 * the .gbnf files on samples and mutations).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TERN_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

#include "grammar_check.h"

/* ---- strict JSON ------------------------------------------------------------- */

typedef struct {
    const unsigned char *s;
    size_t n, i;
    int depth;
} jscan_t;

static void j_ws(jscan_t *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int j_hex4(jscan_t *p, unsigned *v) {
    if (p->i + 4 > p->n) return 0;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = p->s[p->i++];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return 0;
        *v = *v << 4 | (unsigned)h;
    }
    return 1;
}

/* One UTF-8 sequence at p->i (shortest form, no surrogates, <= U+10FFFF). */
static int j_utf8(jscan_t *p) {
    unsigned char c = p->s[p->i];
    int k = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!k || p->i + (size_t)k > p->n) return 0;
    uint32_t v = k == 2 ? c & 0x1Fu : k == 3 ? c & 0x0Fu : c & 0x07u;
    for (int j = 1; j < k; j++) {
        unsigned char b = p->s[p->i + (size_t)j];
        if ((b & 0xC0) != 0x80) return 0;
        v = v << 6 | (b & 0x3Fu);
    }
    static const uint32_t mins[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < mins[k] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    p->i += (size_t)k;
    return 1;
}

static int j_string(jscan_t *p) {
    if (p->i >= p->n || p->s[p->i] != '"') return 0;
    p->i++;
    while (p->i < p->n) {
        unsigned char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return 1;
        }
        if (c < 0x20) return 0;
        if (c >= 0x80) {
            if (!j_utf8(p)) return 0;
            continue;
        }
        p->i++;
        if (c != '\\') continue;
        if (p->i >= p->n) return 0;
        c = p->s[p->i++];
        if (strchr("\"\\/bfnrt", c) && c) continue;
        if (c != 'u') return 0;
        unsigned v;
        if (!j_hex4(p, &v) || v == 0) return 0;
        if (v >= 0xDC00 && v <= 0xDFFF) return 0; /* a low surrogate alone */
        if (v >= 0xD800 && v <= 0xDBFF) {
            unsigned lo;
            if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') return 0;
            p->i += 2;
            if (!j_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) return 0;
        }
    }
    return 0;
}

static int j_digits(jscan_t *p) {
    size_t st = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    return p->i > st;
}

static int j_number(jscan_t *p) {
    if (p->i < p->n && p->s[p->i] == '-') p->i++;
    if (p->i >= p->n) return 0;
    if (p->s[p->i] == '0') p->i++;
    else if (p->s[p->i] >= '1' && p->s[p->i] <= '9') j_digits(p);
    else return 0;
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (!j_digits(p)) return 0;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (!j_digits(p)) return 0;
    }
    return 1;
}

static int j_word(jscan_t *p, const char *w) {
    size_t k = strlen(w);
    if (p->i + k > p->n || memcmp(p->s + p->i, w, k)) return 0;
    p->i += k;
    return 1;
}

static int j_value(jscan_t *p) {
    if (p->i >= p->n) return 0;
    unsigned char c = p->s[p->i];
    if (c == '{' || c == '[') {
        if (++p->depth > 512) return 0;
        char close = c == '{' ? '}' : ']';
        p->i++;
        j_ws(p);
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            p->depth--;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                if (!j_string(p)) return 0;
                j_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') return 0;
                p->i++;
                j_ws(p);
            }
            if (!j_value(p)) return 0;
            j_ws(p);
            if (p->i >= p->n) return 0;
            if (p->s[p->i] == close) {
                p->i++;
                p->depth--;
                return 1;
            }
            if (p->s[p->i] != ',') return 0;
            p->i++;
            j_ws(p);
        }
    }
    if (c == '"') return j_string(p);
    if (c == '-' || (c >= '0' && c <= '9')) return j_number(p);
    return j_word(p, "true") || j_word(p, "false") || j_word(p, "null");
}

int check_json_value(const char *text, size_t len) {
    jscan_t p = {(const unsigned char *)text, len, 0, 0};
    j_ws(&p);
    if (!j_value(&p)) return 0;
    j_ws(&p);
    return p.i == len;
}

int check_json(const char *text, size_t len) {
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) i++;
    return i < len && text[i] == '{' && check_json_value(text, len);
}

/* ---- JSON Schema validation ------------------------------------------------------ */

#ifdef TERN_HAVE_CJSON

typedef struct {
    const cJSON *root;
    char *why;
    size_t cap;
} vctx_t;

static int vfail(vctx_t *v, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int vfail(vctx_t *v, const char *path, const char *fmt, ...) {
    if (!v->why || !v->cap) return 0;
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(v->why, v->cap, "%s: %s", path[0] ? path : "(top)", m);
    return 0;
}

static int json_equal(const cJSON *a, const cJSON *b) {
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b)) return a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a) && cJSON_IsString(b)) return !strcmp(a->valuestring, b->valuestring);
    if (cJSON_IsTrue(a) || cJSON_IsTrue(b)) return cJSON_IsTrue(a) && cJSON_IsTrue(b);
    if (cJSON_IsFalse(a) || cJSON_IsFalse(b)) return cJSON_IsFalse(a) && cJSON_IsFalse(b);
    if (cJSON_IsNull(a) || cJSON_IsNull(b)) return cJSON_IsNull(a) && cJSON_IsNull(b);
    if (cJSON_IsArray(a) && cJSON_IsArray(b)) {
        const cJSON *x = a->child, *y = b->child;
        for (; x && y; x = x->next, y = y->next)
            if (!json_equal(x, y)) return 0;
        return !x && !y;
    }
    if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
        int na = 0, nb = 0;
        for (const cJSON *x = a->child; x; x = x->next, na++) {
            const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
            if (!y || !json_equal(x, y)) return 0;
        }
        for (const cJSON *y = b->child; y; y = y->next) nb++;
        return na == nb;
    }
    return 0;
}

static long utf8_count(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static const cJSON *pointer(const cJSON *root, const char *ref) {
    if (!strcmp(ref, "#")) return root;
    if (ref[0] != '#' || ref[1] != '/') return NULL;
    const cJSON *at = root;
    const char *s = ref + 2;
    for (;;) {
        char seg[1024]; /* longer than the converter's segments */
        size_t k = 0;
        while (*s && *s != '/') {
            char c = *s++;
            if (c == '~') {
                c = *s == '0' ? '~' : *s == '1' ? '/' : 0;
                if (!c) return NULL;
                s++;
            }
            if (k + 1 >= sizeof seg) return NULL;
            seg[k++] = c;
        }
        seg[k] = 0;
        if (cJSON_IsObject(at)) {
            at = cJSON_GetObjectItemCaseSensitive(at, seg);
        } else if (cJSON_IsArray(at)) {
            char *e;
            long i = strtol(seg, &e, 10);
            at = (*e || !k) ? NULL : cJSON_GetArrayItem(at, (int)i);
        } else {
            return NULL;
        }
        if (!at) return NULL;
        if (!*s) return at;
        s++;
    }
}

static int type_is(const cJSON *x, const char *t) {
    if (!strcmp(t, "object")) return cJSON_IsObject(x);
    if (!strcmp(t, "array")) return cJSON_IsArray(x);
    if (!strcmp(t, "string")) return cJSON_IsString(x);
    if (!strcmp(t, "number")) return cJSON_IsNumber(x);
    if (!strcmp(t, "integer"))
        return cJSON_IsNumber(x) && isfinite(x->valuedouble) && x->valuedouble == floor(x->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(x);
    if (!strcmp(t, "null")) return cJSON_IsNull(x);
    return -1;
}

static int validate(vctx_t *v, const cJSON *x, const cJSON *sch, int depth, const char *path);

static int sub_valid(vctx_t *v, const cJSON *x, const cJSON *sch, int depth) {
    vctx_t quiet = {v->root, NULL, 0};
    return validate(&quiet, x, sch, depth, "");
}

static int validate(vctx_t *v, const cJSON *x, const cJSON *sch, int depth, const char *path) {
    if (depth > 300) return vfail(v, path, "schema recursion too deep");
    if (cJSON_IsTrue(sch)) return 1;
    if (cJSON_IsFalse(sch)) return vfail(v, path, "schema false");
    if (!cJSON_IsObject(sch)) return vfail(v, path, "checker: a schema must be an object or boolean");
    static const char *const known[] = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum",
        "const", "anyOf", "oneOf", "$ref", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "title", "description", "$schema", "$id", "$comment", "default", "examples",
        "$defs", "definitions"};
    for (const cJSON *k = sch->child; k; k = k->next) {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++) ok = !strcmp(k->string, known[i]);
        if (!ok) return vfail(v, path, "checker: unsupported keyword \"%s\"", k->string);
    }
    const cJSON *kw;
    char sub[512];
    if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "$ref"))) {
        const cJSON *t = cJSON_IsString(kw) ? pointer(v->root, kw->valuestring) : NULL;
        if (!t) return vfail(v, path, "checker: $ref does not resolve");
        if (!validate(v, x, t, depth + 1, path)) return 0;
    }
    if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "type"))) {
        int ok = 0;
        if (cJSON_IsString(kw)) {
            ok = type_is(x, kw->valuestring);
        } else if (cJSON_IsArray(kw)) {
            for (const cJSON *t = kw->child; t && ok != 1; t = t->next)
                ok = cJSON_IsString(t) ? type_is(x, t->valuestring) : -1;
        }
        if (ok < 0) return vfail(v, path, "checker: bad \"type\"");
        if (!ok) return vfail(v, path, "wrong type");
    }
    if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "enum"))) {
        int in = 0;
        for (const cJSON *e = cJSON_IsArray(kw) ? kw->child : NULL; e && !in; e = e->next) in = json_equal(x, e);
        if (!in) return vfail(v, path, "not one of the enum values");
    }
    if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "const")) && !json_equal(x, kw))
        return vfail(v, path, "not the const value");
    if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "anyOf"))) {
        int any = 0;
        for (const cJSON *s = kw->child; s && !any; s = s->next) any = sub_valid(v, x, s, depth + 1);
        if (!any) return vfail(v, path, "matches no schema of anyOf");
    }
    if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "oneOf"))) {
        int n = 0;
        for (const cJSON *s = kw->child; s; s = s->next) n += sub_valid(v, x, s, depth + 1);
        if (n != 1) return vfail(v, path, "matches %d schemas of oneOf, not exactly one", n);
    }
    if (cJSON_IsObject(x)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
        for (const cJSON *m = x->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            snprintf(sub, sizeof sub, "%s/%s", path, m->string);
            if (ps) {
                if (!validate(v, m, ps, depth + 1, sub)) return 0;
            } else if (addl) {
                if (cJSON_IsFalse(addl)) return vfail(v, sub, "additional property not allowed");
                if (!validate(v, m, addl, depth + 1, sub)) return 0;
            }
        }
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "required")))
            for (const cJSON *r = kw->child; r; r = r->next)
                if (cJSON_IsString(r) && !cJSON_GetObjectItemCaseSensitive(x, r->valuestring))
                    return vfail(v, path, "required property \"%s\" missing", r->valuestring);
    }
    if (cJSON_IsArray(x)) {
        int n = cJSON_GetArraySize(x);
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "items"))) {
            if (cJSON_IsArray(kw)) return vfail(v, path, "checker: tuple items unsupported");
            int i = 0;
            for (const cJSON *e = x->child; e; e = e->next, i++) {
                snprintf(sub, sizeof sub, "%s/%d", path, i);
                if (!validate(v, e, kw, depth + 1, sub)) return 0;
            }
        }
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "minItems")) && n < kw->valuedouble)
            return vfail(v, path, "fewer than minItems");
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "maxItems")) && n > kw->valuedouble)
            return vfail(v, path, "more than maxItems");
    }
    if (cJSON_IsString(x)) {
        long n = utf8_count(x->valuestring);
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "minLength")) && n < kw->valuedouble)
            return vfail(v, path, "shorter than minLength (%ld)", n);
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "maxLength")) && n > kw->valuedouble)
            return vfail(v, path, "longer than maxLength (%ld)", n);
    }
    if (cJSON_IsNumber(x)) {
        double d = x->valuedouble;
        const cJSON *xmin = cJSON_GetObjectItemCaseSensitive(sch, "exclusiveMinimum");
        const cJSON *xmax = cJSON_GetObjectItemCaseSensitive(sch, "exclusiveMaximum");
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "minimum")))
            if (cJSON_IsTrue(xmin) ? !(d > kw->valuedouble) : !(d >= kw->valuedouble))
                return vfail(v, path, "below minimum");
        if ((kw = cJSON_GetObjectItemCaseSensitive(sch, "maximum")))
            if (cJSON_IsTrue(xmax) ? !(d < kw->valuedouble) : !(d <= kw->valuedouble))
                return vfail(v, path, "above maximum");
        if (cJSON_IsNumber(xmin) && !(d > xmin->valuedouble)) return vfail(v, path, "not above exclusiveMinimum");
        if (cJSON_IsNumber(xmax) && !(d < xmax->valuedouble)) return vfail(v, path, "not below exclusiveMaximum");
    }
    return 1;
}

int check_json_schema(const char *text, size_t len, const char *schema, char *why, size_t why_cap) {
    if (why && why_cap) why[0] = 0;
    if (!check_json_value(text, len)) {
        if (why && why_cap) snprintf(why, why_cap, "not strict JSON");
        return 0;
    }
    cJSON *x = cJSON_ParseWithLengthOpts(text, len, NULL, 0);
    cJSON *s = cJSON_Parse(schema);
    int ok = 0;
    if (!x || !s) {
        if (why && why_cap) snprintf(why, why_cap, "%s", !x ? "cJSON refuses the text" : "schema is not JSON");
    } else {
        vctx_t v = {s, why, why_cap};
        ok = validate(&v, x, s, 0, "");
    }
    cJSON_Delete(x);
    cJSON_Delete(s);
    return ok;
}

#else

int check_json_schema(const char *text, size_t len, const char *schema, char *why, size_t why_cap) {
    (void)text, (void)len, (void)schema;
    if (why && why_cap) snprintf(why, why_cap, "check_json_schema: built without cJSON");
    return 0;
}

#endif

/* ---- PCRE2 languages ---------------------------------------------------------------- */

enum { RE_LIST, RE_CHESS, RE_JAPANESE, RE_FEATURES, RE_N };

#define LIST_LINE "[^ \\t\\n\\r][^\\n\\r]{0,119}"
#define CHESS_MOVE                                                                      \
    "(?:O-O(?:-O)?|[KQRBN][a-h]?[1-8]?x?[a-h][1-8]|(?:[a-h]x)?[a-h][1-8](?:=[QRBN])?)" \
    "[+#]?"
#define CHESS_TURN "[1-9][0-9]{0,2}\\. " CHESS_MOVE "(?: " CHESS_MOVE ")?"
#define JA_CHAR "[\\x{3041}-\\x{3096}\\x{309D}\\x{309E}\\x{30A1}-\\x{30FA}\\x{30FC}-\\x{30FE}" \
                "\\x{4E00}-\\x{9FFF}\\x{3005}\\x{20000}-\\x{2A6DF}]"
#define JA_PIECE "(?:" JA_CHAR "|\\x{300C}(?:" JA_CHAR "|\\x{3001})+\\x{300D})"

static const char *const PATTERNS[RE_N] = {
    [RE_LIST] = "\\A(?:# " LIST_LINE "\\n\\n)?(?:[-*] " LIST_LINE "\\n(?:  [-*] " LIST_LINE "\\n)*){1,50}\\z",
    /* the turn once, as a named group called again (copies would be too large) */
    [RE_CHESS] = "\\A(?<turn>" CHESS_TURN ")(?: (?&turn)){0,199}\\z",
    [RE_JAPANESE] = "\\A(?:" JA_PIECE "+(?:\\x{3001}" JA_PIECE "+)*[\\x{3002}\\x{FF01}\\x{FF1F}]){1,10}\\z",
    [RE_FEATURES] = "\\AREC[0-9]{2}(?:| |\\t)[A-Z][-a-z0-9_]+\\n"
                    "(?:(?:int:[-+]?[1-9][0-9]{0,5}"
                    "|str:\"(?:[^\"\\\\\\n]|\\\\[\"\\\\n])*\""
                    "|hex:A[0-9A-F]{2,8}"
                    "|greek:[\\x{3B1}-\\x{3C9}]+"
                    "|smile:[\\x{1F600}-\\x{1F64F}]"
                    "|pair:\\x{AB}(?s:.)\\x{1F642}(?s:.)?"
                    "|brackets:[\\[\\]]{1,3}"
                    "|not:[^a-zA-Z0-9 \\n]+"
                    ")\\r?\\n){1,4}"
                    "END[!?]*\\n?\\z",
};

static int re_match(int which, const char *text, size_t len) {
    static pcre2_code *re[RE_N];
    if (!re[which]) {
        int ec;
        PCRE2_SIZE eo;
        re[which] = pcre2_compile((PCRE2_SPTR)PATTERNS[which], PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
        if (!re[which]) {
            PCRE2_UCHAR m[256];
            pcre2_get_error_message(ec, m, sizeof m);
            fprintf(stderr, "grammar_check: pattern %d does not compile at %zu: %s\n", which, (size_t)eo, (char *)m);
            return 0;
        }
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re[which], NULL);
    if (!md) return 0;
    int rc = pcre2_match(re[which], (PCRE2_SPTR)text, len, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

int check_list(const char *text, size_t len) { return re_match(RE_LIST, text, len); }
int check_chess(const char *text, size_t len) { return re_match(RE_CHESS, text, len); }
int check_japanese(const char *text, size_t len) { return re_match(RE_JAPANESE, text, len); }
int check_features(const char *text, size_t len) { return re_match(RE_FEATURES, text, len); }

/* ---- recursive descent ------------------------------------------------------------------ */

typedef struct {
    const char *s;
    size_t n, i;
    int depth;
} rd_t;

#define RD_MAX_DEPTH 1000

static int rd_is(const rd_t *p, char c) { return p->i < p->n && p->s[p->i] == c; }
static int rd_digit(const rd_t *p) { return p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9'; }
static int rd_lit(rd_t *p, const char *w) {
    size_t k = strlen(w);
    if (p->i + k > p->n || memcmp(p->s + p->i, w, k)) return 0;
    p->i += k;
    return 1;
}
/* at least lo, at most hi digits, greedily */
static int rd_digits(rd_t *p, int lo, int hi) {
    int k = 0;
    while (k < hi && rd_digit(p)) p->i++, k++;
    return k >= lo;
}

/* arithmetic.gbnf */
static int ar_expr(rd_t *p);

static void ar_sp(rd_t *p) {
    if (rd_is(p, ' ')) p->i++;
}

static int ar_number(rd_t *p) {
    if (!rd_digits(p, 1, 9)) return 0;
    if (rd_is(p, '.') && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9') {
        p->i++;
        rd_digits(p, 1, 9);
    }
    return 1;
}

static int ar_factor(rd_t *p) {
    if (++p->depth > RD_MAX_DEPTH) return 0;
    int ok = 0;
    if (rd_digit(p)) {
        ok = ar_number(p);
    } else if (rd_is(p, '-')) {
        p->i++;
        ok = ar_factor(p);
    } else if (rd_is(p, '(')) {
        p->i++;
        ar_sp(p);
        if (ar_expr(p)) {
            ar_sp(p);
            ok = rd_is(p, ')');
            p->i += (size_t)ok;
        }
    }
    p->depth--;
    return ok;
}

static int ar_chain(rd_t *p, const char *ops, int (*operand)(rd_t *)) {
    if (!operand(p)) return 0;
    for (;;) {
        size_t save = p->i;
        ar_sp(p);
        if (p->i < p->n && strchr(ops, p->s[p->i]) && p->s[p->i]) {
            p->i++;
            ar_sp(p);
            if (operand(p)) continue;
        }
        p->i = save;
        return 1;
    }
}

static int ar_term(rd_t *p) { return ar_chain(p, "*/", ar_factor); }
static int ar_expr(rd_t *p) { return ar_chain(p, "+-", ar_term); }

int check_arithmetic(const char *text, size_t len) {
    rd_t p = {text, len, 0, 0};
    return ar_expr(&p) && p.i == len;
}

/* c.gbnf */
static int cc_stmt(rd_t *p);
static int cc_expr(rd_t *p);

static int cc_ws(rd_t *p, int min) {
    int k = 0;
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n')) p->i++, k++;
    return k >= min && k <= 40;
}

static int cc_idstart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int cc_idchar(char c) { return cc_idstart(c) || (c >= '0' && c <= '9'); }

static int cc_ident(rd_t *p) {
    if (p->i >= p->n || !cc_idstart(p->s[p->i])) return 0;
    p->i++;
    for (int k = 0; k < 31 && p->i < p->n && cc_idchar(p->s[p->i]); k++) p->i++;
    return 1;
}

static int cc_type(rd_t *p) { return rd_lit(p, "int") || rd_lit(p, "char") || rd_lit(p, "float") || rd_lit(p, "void"); }

static int cc_number(rd_t *p) {
    if (!rd_digits(p, 1, 9)) return 0;
    if (rd_is(p, '.') && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9') {
        p->i++;
        rd_digits(p, 1, 9);
    }
    return 1;
}

static int cc_charlit(rd_t *p) {
    if (p->i + 3 > p->n || p->s[p->i] != '\'' || p->s[p->i + 2] != '\'') return 0;
    char c = p->s[p->i + 1];
    if (!cc_idchar(c) && c != ' ') return 0;
    if (c == '_') return 0;
    p->i += 3;
    return 1;
}

static int cc_binop(rd_t *p) {
    static const char *const two[] = {"==", "!=", "<=", ">=", "&&", "||"};
    for (size_t k = 0; k < sizeof two / sizeof *two; k++)
        if (rd_lit(p, two[k])) return 1;
    if (p->i < p->n && p->s[p->i] && strchr("-+*/%<>=", p->s[p->i])) {
        p->i++;
        return 1;
    }
    return 0;
}

static int cc_call(rd_t *p) {
    if (!cc_ident(p) || !cc_ws(p, 0) || !rd_lit(p, "(") || !cc_ws(p, 0)) return 0;
    size_t save = p->i;
    if (cc_expr(p) && cc_ws(p, 0)) {
        for (;;) {
            size_t s2 = p->i;
            if (rd_lit(p, ",") && cc_ws(p, 0) && cc_expr(p) && cc_ws(p, 0)) continue;
            p->i = s2;
            break;
        }
    } else {
        p->i = save;
    }
    return rd_lit(p, ")");
}

static int cc_primary(rd_t *p) {
    size_t save = p->i;
    if (rd_digit(p)) return cc_number(p);
    if (rd_is(p, '\'')) return cc_charlit(p);
    if (cc_call(p)) return 1;
    p->i = save;
    if (cc_ident(p)) return 1;
    p->i = save;
    return rd_lit(p, "(") && cc_ws(p, 0) && cc_expr(p) && cc_ws(p, 0) && rd_lit(p, ")");
}

static int cc_unary(rd_t *p) {
    if (++p->depth > RD_MAX_DEPTH) return 0;
    int ok;
    if (rd_is(p, '-') || rd_is(p, '!')) {
        p->i++;
        ok = cc_ws(p, 0) && cc_unary(p);
    } else {
        ok = cc_primary(p);
    }
    p->depth--;
    return ok;
}

static int cc_expr(rd_t *p) {
    if (!cc_unary(p)) return 0;
    for (;;) {
        size_t save = p->i;
        if (cc_ws(p, 0) && cc_binop(p) && cc_ws(p, 0) && cc_unary(p)) continue;
        p->i = save;
        return 1;
    }
}

/* ( "=" ws expr ws )? ";" */
static int cc_init_end(rd_t *p) {
    size_t save = p->i;
    if (!(rd_lit(p, "=") && cc_ws(p, 0) && cc_expr(p) && cc_ws(p, 0))) p->i = save;
    return rd_lit(p, ";");
}

static int cc_block(rd_t *p) {
    if (!rd_lit(p, "{") || !cc_ws(p, 0)) return 0;
    for (;;) {
        size_t save = p->i;
        if (cc_stmt(p) && cc_ws(p, 0)) continue;
        p->i = save;
        break;
    }
    return rd_lit(p, "}");
}

/* "kw" ws "(" ws expr ws ")" ws stmt */
static int cc_cond(rd_t *p, const char *kw) {
    return rd_lit(p, kw) && cc_ws(p, 0) && rd_lit(p, "(") && cc_ws(p, 0) && cc_expr(p) && cc_ws(p, 0) &&
           rd_lit(p, ")") && cc_ws(p, 0) && cc_stmt(p);
}

static int cc_stmt_alt(rd_t *p) {
    size_t save = p->i;
    if (rd_is(p, '{')) return cc_block(p);
    if (cc_type(p) && cc_ws(p, 1) && cc_ident(p) && cc_ws(p, 0) && cc_init_end(p)) return 1;
    p->i = save;
    if (cc_cond(p, "if")) {
        size_t s2 = p->i;
        if (!(cc_ws(p, 0) && rd_lit(p, "else") && cc_ws(p, 1) && cc_stmt(p))) p->i = s2;
        return 1;
    }
    p->i = save;
    if (cc_cond(p, "while")) return 1;
    p->i = save;
    if (rd_lit(p, "return")) {
        size_t s2 = p->i;
        if (!(cc_ws(p, 1) && cc_expr(p))) p->i = s2;
        if (cc_ws(p, 0) && rd_lit(p, ";")) return 1;
    }
    p->i = save;
    return cc_expr(p) && cc_ws(p, 0) && rd_lit(p, ";");
}

static int cc_stmt(rd_t *p) {
    if (++p->depth > RD_MAX_DEPTH) return 0;
    int ok = cc_stmt_alt(p);
    p->depth--;
    return ok;
}

static int cc_param(rd_t *p) { return cc_type(p) && cc_ws(p, 1) && cc_ident(p) && cc_ws(p, 0); }

static int cc_item(rd_t *p) {
    if (!(cc_type(p) && cc_ws(p, 1) && cc_ident(p) && cc_ws(p, 0))) return 0;
    if (rd_lit(p, "(")) {
        if (!cc_ws(p, 0)) return 0;
        size_t save = p->i;
        if (cc_param(p)) {
            for (;;) {
                size_t s2 = p->i;
                if (rd_lit(p, ",") && cc_ws(p, 0) && cc_param(p)) continue;
                p->i = s2;
                break;
            }
        } else {
            p->i = save;
        }
        return rd_lit(p, ")") && cc_ws(p, 0) && cc_block(p);
    }
    return cc_init_end(p);
}

int check_c(const char *text, size_t len) {
    rd_t p = {text, len, 0, 0};
    if (!cc_ws(&p, 0) || !cc_item(&p)) return 0;
    for (;;) {
        size_t save = p.i;
        if (cc_ws(&p, 0) && cc_item(&p)) continue;
        p.i = save;
        break;
    }
    return cc_ws(&p, 0) && p.i == len;
}
