/*
 * gbnf_oracle.c - GBNF for tests: parse, translate to PCRE2, sample
 * (tests/gbnf_oracle.h).
 *
 * The syntax read here: rules "name ::= alternatives", names [a-zA-Z0-9-]+;
 * alternatives separated by "|"; sequences of items, each with any number
 * of postfix operators * + ? {m} {m,} {m,n}; items: "literal" (escapes \n
 * \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH, other characters as UTF-8),
 * [class] ([^...] negated, a-b ranges, the same escapes), . (any
 * character), ( alternatives ), a rule name. # starts a comment to the end
 * of the line. Layout: spaces, tabs and comments separate items; a newline
 * ends the rule except right after "::=" or "|" and inside parentheses.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gbnf_oracle.h"

enum { N_ALT, N_SEQ, N_LIT, N_CLASS, N_ANY, N_REF, N_REP };

typedef struct node {
    int kind;
    int n, cap;         /* kids (ALT, SEQ) or code points (LIT) or range pairs (CLASS) */
    struct node **kids;
    uint32_t *cps;      /* LIT: n code points; CLASS: n pairs lo,hi */
    int negated;        /* CLASS */
    int rule;           /* REF */
    int min, max;       /* REP (max -1: unbounded) */
    int h;              /* least derivation height, once the grammar is read */
} node_t;

typedef struct {
    char *name;
    node_t *body;
    int used;
} rule_t;

struct gbnf_oracle {
    rule_t *rules;
    int n_rules, cap_rules;
    node_t **all; /* every node, for freeing */
    size_t n_all, cap_all;
    int root;
    char *pattern;
    pcre2_code *re;
    pcre2_match_data *md;
    int *height; /* per rule: least derivation height (sampling) */
};

/* ---- parsing ----------------------------------------------------------------- */

typedef struct {
    gbnf_oracle_t *g;
    const char *p, *end, *start;
    char *why;
    size_t cap;
    int failed;
} ps_t;

static void perr(ps_t *s, const char *fmt, ...) {
    if (s->failed) return;
    s->failed = 1;
    int line = 1;
    for (const char *q = s->start; q < s->p && q < s->end; q++) line += *q == '\n';
    char m[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(s->why, s->cap, "gbnf line %d: %s", line, m);
}

static node_t *mk(ps_t *s, int kind) {
    gbnf_oracle_t *g = s->g;
    node_t *n = calloc(1, sizeof *n);
    if (!n) {
        perr(s, "out of memory");
        return NULL;
    }
    if (g->n_all == g->cap_all) {
        size_t cap = g->cap_all ? g->cap_all * 2 : 256;
        node_t **a = realloc(g->all, cap * sizeof *a);
        if (!a) {
            free(n);
            perr(s, "out of memory");
            return NULL;
        }
        g->all = a, g->cap_all = cap;
    }
    g->all[g->n_all++] = n;
    n->kind = kind;
    return n;
}

static int add_kid(ps_t *s, node_t *n, node_t *k) {
    if (n->n == n->cap) {
        int cap = n->cap ? n->cap * 2 : 4;
        node_t **a = realloc(n->kids, (size_t)cap * sizeof *a);
        if (!a) {
            perr(s, "out of memory");
            return -1;
        }
        n->kids = a, n->cap = cap;
    }
    n->kids[n->n++] = k;
    return 0;
}

static int add_cp(ps_t *s, node_t *n, uint32_t cp) {
    if (n->n == n->cap) {
        int cap = n->cap ? n->cap * 2 : 8;
        uint32_t *a = realloc(n->cps, (size_t)cap * sizeof *a);
        if (!a) {
            perr(s, "out of memory");
            return -1;
        }
        n->cps = a, n->cap = cap;
    }
    n->cps[n->n++] = cp;
    return 0;
}

static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static void skip_space(ps_t *s, int newline_ok) {
    while (s->p < s->end) {
        char c = *s->p;
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            s->p++;
        } else if (c == '#') {
            while (s->p < s->end && *s->p != '\n' && *s->p != '\r') s->p++;
        } else {
            break;
        }
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class: an escape or a UTF-8 sequence. */
static int read_char(ps_t *s, uint32_t *cp) {
    if (s->p >= s->end) {
        perr(s, "unexpected end");
        return -1;
    }
    unsigned char c = (unsigned char)*s->p;
    if (c == '\\') {
        s->p++;
        if (s->p >= s->end) {
            perr(s, "unexpected end after \\");
            return -1;
        }
        char e = *s->p++;
        int digits = 0;
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '\\': case '"': case '[': case ']': *cp = (unsigned char)e; return 0;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: perr(s, "unknown escape \\%c", e); return -1;
        }
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = s->p < s->end ? hexval(*s->p) : -1;
            if (h < 0) {
                perr(s, "\\%c needs %d hex digits", e, digits);
                return -1;
            }
            v = v << 4 | (uint32_t)h;
            s->p++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
            perr(s, "escape \\%c%0*X is not a Unicode scalar value", e, digits, (unsigned)v);
            return -1;
        }
        *cp = v;
        return 0;
    }
    int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!k || s->p + k > s->end) {
        perr(s, "invalid UTF-8");
        return -1;
    }
    uint32_t v = k == 1 ? c : k == 2 ? c & 0x1Fu : k == 3 ? c & 0x0Fu : c & 0x07u;
    for (int i = 1; i < k; i++) {
        unsigned char b = (unsigned char)s->p[i];
        if ((b & 0xC0) != 0x80) {
            perr(s, "invalid UTF-8");
            return -1;
        }
        v = v << 6 | (b & 0x3Fu);
    }
    static const uint32_t mins[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < mins[k] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        perr(s, "invalid UTF-8");
        return -1;
    }
    s->p += k;
    *cp = v;
    return 0;
}

static int rule_index(ps_t *s, const char *name, size_t len) {
    gbnf_oracle_t *g = s->g;
    for (int i = 0; i < g->n_rules; i++)
        if (strlen(g->rules[i].name) == len && !memcmp(g->rules[i].name, name, len)) return i;
    if (g->n_rules == g->cap_rules) {
        int cap = g->cap_rules ? g->cap_rules * 2 : 16;
        rule_t *r = realloc(g->rules, (size_t)cap * sizeof *r);
        if (!r) {
            perr(s, "out of memory");
            return -1;
        }
        g->rules = r, g->cap_rules = cap;
    }
    rule_t *r = &g->rules[g->n_rules];
    r->name = malloc(len + 1);
    if (!r->name) {
        perr(s, "out of memory");
        return -1;
    }
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->body = NULL;
    r->used = 0;
    return g->n_rules++;
}

static node_t *parse_alts(ps_t *s, int nested, int depth);

static int read_int(ps_t *s, int *v) {
    if (s->p >= s->end || *s->p < '0' || *s->p > '9') {
        perr(s, "expected a number in {}");
        return -1;
    }
    long x = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        x = x * 10 + (*s->p++ - '0');
        if (x > 100000) {
            perr(s, "repetition count too large");
            return -1;
        }
    }
    *v = (int)x;
    return 0;
}

static node_t *parse_seq(ps_t *s, int nested, int depth) {
    node_t *seq = mk(s, N_SEQ);
    if (!seq) return NULL;
    while (!s->failed && s->p < s->end) {
        char c = *s->p;
        node_t *item = NULL;
        if (c == '"') {
            s->p++;
            item = mk(s, N_LIT);
            while (item && !s->failed && s->p < s->end && *s->p != '"') {
                uint32_t cp;
                if (read_char(s, &cp) || add_cp(s, item, cp)) break;
            }
            if (s->p >= s->end) perr(s, "unterminated literal");
            s->p++;
        } else if (c == '[') {
            s->p++;
            item = mk(s, N_CLASS);
            if (item && s->p < s->end && *s->p == '^') item->negated = 1, s->p++;
            while (item && !s->failed && s->p < s->end && *s->p != ']') {
                uint32_t lo, hi;
                if (read_char(s, &lo)) break;
                hi = lo;
                if (s->p + 1 < s->end && s->p[0] == '-' && s->p[1] != ']') {
                    s->p++;
                    if (read_char(s, &hi)) break;
                    if (hi < lo) perr(s, "class range backwards");
                }
                if (add_cp(s, item, lo) || add_cp(s, item, hi)) break;
            }
            if (s->p >= s->end) perr(s, "unterminated class");
            if (item && !item->n) perr(s, "empty class");
            s->p++;
        } else if (c == '.') {
            s->p++;
            item = mk(s, N_ANY);
        } else if (c == '(') {
            if (depth > 100) {
                perr(s, "parentheses nested too deep");
                break;
            }
            s->p++;
            skip_space(s, 1);
            item = parse_alts(s, 1, depth + 1);
            if (s->failed) break;
            if (s->p >= s->end || *s->p != ')') {
                perr(s, "expected )");
                break;
            }
            s->p++;
        } else if (is_word(c)) {
            const char *w = s->p;
            while (s->p < s->end && is_word(*s->p)) s->p++;
            const char *after = s->p;
            skip_space(s, nested);
            if (s->end - s->p >= 3 && !memcmp(s->p, "::=", 3)) {
                perr(s, "rule \"%.*s\" starts inside another rule", (int)(after - w), w);
                break;
            }
            s->p = after;
            item = mk(s, N_REF);
            if (item) item->rule = rule_index(s, w, (size_t)(after - w));
            if (item && item->rule >= 0) s->g->rules[item->rule].used = 1;
        } else {
            break;
        }
        if (s->failed || !item) break;
        skip_space(s, nested);
        /* postfix operators */
        while (!s->failed && s->p < s->end && (*s->p == '*' || *s->p == '+' || *s->p == '?' || *s->p == '{')) {
            node_t *r = mk(s, N_REP);
            if (!r) break;
            r->kids = malloc(sizeof *r->kids);
            if (!r->kids) {
                perr(s, "out of memory");
                break;
            }
            r->kids[0] = item;
            r->n = r->cap = 1;
            char op = *s->p++;
            if (op == '*') r->min = 0, r->max = -1;
            else if (op == '+') r->min = 1, r->max = -1;
            else if (op == '?') r->min = 0, r->max = 1;
            else {
                skip_space(s, nested);
                if (read_int(s, &r->min)) break;
                skip_space(s, nested);
                r->max = r->min;
                if (s->p < s->end && *s->p == ',') {
                    s->p++;
                    skip_space(s, nested);
                    r->max = -1;
                    if (s->p < s->end && *s->p != '}' && read_int(s, &r->max)) break;
                    skip_space(s, nested);
                }
                if (s->p >= s->end || *s->p != '}') {
                    perr(s, "expected }");
                    break;
                }
                s->p++;
                if (r->max >= 0 && r->max < r->min) perr(s, "{m,n} with n < m");
            }
            item = r;
            skip_space(s, nested);
        }
        if (s->failed || add_kid(s, seq, item)) break;
    }
    return s->failed ? NULL : seq;
}

static node_t *parse_alts(ps_t *s, int nested, int depth) {
    node_t *alt = mk(s, N_ALT);
    if (!alt) return NULL;
    for (;;) {
        node_t *seq = parse_seq(s, nested, depth);
        if (!seq || add_kid(s, alt, seq)) return NULL;
        if (s->p < s->end && *s->p == '|') {
            s->p++;
            skip_space(s, 1);
            continue;
        }
        return alt;
    }
}

static void parse_grammar(ps_t *s) {
    skip_space(s, 1);
    while (!s->failed && s->p < s->end) {
        const char *w = s->p;
        while (s->p < s->end && is_word(*s->p)) s->p++;
        if (s->p == w) {
            perr(s, "expected a rule name");
            return;
        }
        int r = rule_index(s, w, (size_t)(s->p - w));
        if (r < 0) return;
        skip_space(s, 0);
        if (s->end - s->p < 3 || memcmp(s->p, "::=", 3)) {
            perr(s, "expected ::= after \"%s\"", s->g->rules[r].name);
            return;
        }
        s->p += 3;
        skip_space(s, 1);
        if (s->g->rules[r].body) {
            perr(s, "rule \"%s\" defined twice", s->g->rules[r].name);
            return;
        }
        node_t *body = parse_alts(s, 0, 0);
        if (!body) return;
        s->g->rules[r].body = body;
        if (s->p < s->end && *s->p == '\r') s->p++;
        if (s->p < s->end && *s->p != '\n') {
            perr(s, "expected the end of the line, found '%c'", *s->p);
            return;
        }
        skip_space(s, 1);
    }
}

/* ---- PCRE2 -------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf_t;

static void put(buf_t *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

static void put_node(buf_t *b, const node_t *n) {
    switch (n->kind) {
    case N_ALT:
        put(b, "(?:");
        for (int i = 0; i < n->n; i++) {
            if (i) put(b, "|");
            put_node(b, n->kids[i]);
        }
        put(b, ")");
        break;
    case N_SEQ:
        for (int i = 0; i < n->n; i++) put_node(b, n->kids[i]);
        break;
    case N_LIT:
        for (int i = 0; i < n->n; i++) put(b, "\\x{%X}", (unsigned)n->cps[i]);
        break;
    case N_CLASS:
        put(b, n->negated ? "[^" : "[");
        for (int i = 0; i + 1 < n->n; i += 2) {
            if (n->cps[i] == n->cps[i + 1]) put(b, "\\x{%X}", (unsigned)n->cps[i]);
            else put(b, "\\x{%X}-\\x{%X}", (unsigned)n->cps[i], (unsigned)n->cps[i + 1]);
        }
        put(b, "]");
        break;
    case N_ANY: put(b, "(?s:.)"); break;
    case N_REF: put(b, "(?&r%d)", n->rule); break;
    default:
        put(b, "(?:");
        put_node(b, n->kids[0]);
        if (n->max < 0) put(b, "){%d,}", n->min);
        else put(b, "){%d,%d}", n->min, n->max);
        break;
    }
}

/* ---- heights for sampling ------------------------------------------------------ */

#define H_INF 1000000

static int node_height(const gbnf_oracle_t *g, const node_t *n) {
    int h = 0;
    switch (n->kind) {
    case N_ALT:
        h = H_INF;
        for (int i = 0; i < n->n; i++) {
            int k = node_height(g, n->kids[i]);
            if (k < h) h = k;
        }
        return h;
    case N_SEQ:
        for (int i = 0; i < n->n; i++) {
            int k = node_height(g, n->kids[i]);
            if (k > h) h = k;
        }
        return h;
    case N_REF: return g->height[n->rule] >= H_INF ? H_INF : g->height[n->rule] + 1;
    case N_REP: return n->min == 0 ? 0 : node_height(g, n->kids[0]);
    default: return 0;
    }
}

/* ---- the API ---------------------------------------------------------------------- */

void gbnf_oracle_free(gbnf_oracle_t *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_all; i++) {
        if (g->all[i]->kind == N_LIT || g->all[i]->kind == N_CLASS) free(g->all[i]->cps);
        else free(g->all[i]->kids);
        free(g->all[i]);
    }
    free(g->all);
    for (int i = 0; i < g->n_rules; i++) free(g->rules[i].name);
    free(g->rules);
    free(g->pattern);
    free(g->height);
    if (g->md) pcre2_match_data_free(g->md);
    if (g->re) pcre2_code_free(g->re);
    free(g);
}

/* The grammar read, every rule defined, a root; NULL with why otherwise. */
static gbnf_oracle_t *read_grammar(const char *gbnf, size_t len, char *why, size_t why_cap) {
    why[0] = 0;
    gbnf_oracle_t *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(why, why_cap, "out of memory");
        return NULL;
    }
    ps_t s = {g, gbnf, gbnf + len, gbnf, why, why_cap, 0};
    parse_grammar(&s);
    g->root = -1;
    for (int i = 0; !s.failed && i < g->n_rules; i++) {
        if (!g->rules[i].body) {
            snprintf(why, why_cap, "gbnf: rule \"%s\" is used but not defined", g->rules[i].name);
            s.failed = 1;
        }
        if (!strcmp(g->rules[i].name, "root")) g->root = i;
    }
    if (!s.failed && g->root < 0) {
        snprintf(why, why_cap, "gbnf: no root rule");
        s.failed = 1;
    }
    if (s.failed) {
        gbnf_oracle_free(g);
        return NULL;
    }
    return g;
}

int gbnf_oracle_syntax(const char *gbnf, size_t len, char *why, size_t why_cap) {
    char dummy[8];
    if (!why || !why_cap) why = dummy, why_cap = sizeof dummy;
    gbnf_oracle_t *g = read_grammar(gbnf, len, why, why_cap);
    gbnf_oracle_free(g);
    return g != NULL;
}

gbnf_oracle_t *gbnf_oracle_new(const char *gbnf, size_t len, char *why, size_t why_cap) {
    char dummy[8];
    if (!why || !why_cap) why = dummy, why_cap = sizeof dummy;
    gbnf_oracle_t *g = read_grammar(gbnf, len, why, why_cap);
    if (!g) return NULL;
    buf_t b = {0};
    put(&b, "(?(DEFINE)");
    for (int i = 0; i < g->n_rules; i++) {
        put(&b, "(?<r%d>", i);
        put_node(&b, g->rules[i].body);
        put(&b, ")");
    }
    put(&b, ")\\A(?&r%d)\\z", g->root);
    if (b.oom) {
        free(b.p);
        snprintf(why, why_cap, "out of memory");
        gbnf_oracle_free(g);
        return NULL;
    }
    g->pattern = b.p;
    int ec;
    PCRE2_SIZE eo;
    g->re = pcre2_compile((PCRE2_SPTR)b.p, b.n, PCRE2_UTF, &ec, &eo, NULL);
    if (!g->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(why, why_cap, "gbnf: PCRE2 refuses the translation at %zu: %s", (size_t)eo, (char *)msg);
        gbnf_oracle_free(g);
        return NULL;
    }
    g->md = pcre2_match_data_create_from_pattern(g->re, NULL);
    g->height = malloc((size_t)g->n_rules * sizeof *g->height);
    if (!g->md || !g->height) {
        snprintf(why, why_cap, "out of memory");
        gbnf_oracle_free(g);
        return NULL;
    }
    for (int i = 0; i < g->n_rules; i++) g->height[i] = H_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n_rules; i++) {
            int h = node_height(g, g->rules[i].body);
            if (h < g->height[i]) g->height[i] = h, changed = 1;
        }
    }
    for (size_t i = 0; i < g->n_all; i++) g->all[i]->h = node_height(g, g->all[i]);
    return g;
}

int gbnf_oracle_match(const gbnf_oracle_t *g, const char *text, size_t len) {
    int rc = pcre2_match(g->re, (PCRE2_SPTR)text, len, 0, 0, g->md, NULL);
    if (rc >= 0) return 1;
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) return 0; /* not UTF-8: not a text of code points */
    return -1;
}

int gbnf_oracle_rules(const gbnf_oracle_t *g) { return g->n_rules; }
const char *gbnf_oracle_pattern(const gbnf_oracle_t *g) { return g->pattern; }

/* ---- sampling ---------------------------------------------------------------------- */

typedef struct {
    const gbnf_oracle_t *g;
    uint64_t *rng;
    buf_t out;
    size_t max_len;
    int budget;
    int failed;
} smp_t;

static uint64_t rnd(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static void put_cp_utf8(smp_t *m, uint32_t cp) {
    char t[4];
    int k;
    if (cp < 0x80) t[0] = (char)cp, k = 1;
    else if (cp < 0x800) t[0] = (char)(0xC0 | cp >> 6), t[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    else if (cp < 0x10000)
        t[0] = (char)(0xE0 | cp >> 12), t[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), t[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    else
        t[0] = (char)(0xF0 | cp >> 18), t[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), t[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    put(&m->out, "%.*s", k, t);
    if (m->out.n > m->max_len || m->out.oom) m->failed = 1;
}

static int in_class(const node_t *n, uint32_t cp) {
    int in = 0;
    for (int i = 0; i + 1 < n->n && !in; i += 2) in = cp >= n->cps[i] && cp <= n->cps[i + 1];
    return n->negated ? !in : in;
}

/* Characters tried for negated classes and ".": ASCII and a few others. */
static uint32_t pool_cp(uint64_t *rng) {
    static const uint32_t extra[] = {'\t', '\n', 0xE9, 0xDF, 0x3B1, 0x3042, 0x30A2, 0x65E5, 0x1F600, 0x10FFFD, 0x7F, 0x1};
    uint64_t r = rnd(rng) % 100;
    if (r < 85) return 0x20 + (uint32_t)(rnd(rng) % 95);
    return extra[rnd(rng) % (sizeof extra / sizeof *extra)];
}

static void sample_node(smp_t *m, const node_t *n, int depth) {
    if (m->failed) return;
    const gbnf_oracle_t *g = m->g;
    switch (n->kind) {
    case N_ALT: {
        int pick = -1;
        if (depth > m->budget) {
            int best = H_INF, ties = 0;
            for (int i = 0; i < n->n; i++) {
                int h = n->kids[i]->h;
                if (h < best) best = h, pick = i, ties = 1;
                else if (h == best && rnd(m->rng) % (uint64_t)(++ties) == 0) pick = i;
            }
        } else {
            int ok = 0;
            for (int i = 0; i < n->n; i++) ok += n->kids[i]->h < H_INF;
            if (ok) {
                int k = (int)(rnd(m->rng) % (uint64_t)ok);
                for (int i = 0; i < n->n; i++)
                    if (n->kids[i]->h < H_INF && k-- == 0) pick = i;
            }
        }
        if (pick < 0) m->failed = 1;
        else sample_node(m, n->kids[pick], depth);
        break;
    }
    case N_SEQ:
        for (int i = 0; i < n->n; i++) sample_node(m, n->kids[i], depth);
        break;
    case N_LIT:
        for (int i = 0; i < n->n; i++) put_cp_utf8(m, n->cps[i]);
        break;
    case N_CLASS:
    case N_ANY:
        for (int tries = 0; tries < 200; tries++) {
            uint32_t cp;
            if (n->kind == N_CLASS && !n->negated) {
                int r = (int)(rnd(m->rng) % (uint64_t)(n->n / 2)) * 2;
                cp = n->cps[r] + (uint32_t)(rnd(m->rng) % (n->cps[r + 1] - n->cps[r] + 1));
            } else {
                cp = pool_cp(m->rng);
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            if (n->kind == N_CLASS && !in_class(n, cp)) continue;
            put_cp_utf8(m, cp);
            return;
        }
        m->failed = 1;
        break;
    case N_REF: sample_node(m, g->rules[n->rule].body, depth + 1); break;
    default: {
        int count = n->min;
        int kid_h = n->kids[0]->h;
        if (depth <= m->budget && kid_h < H_INF) {
            int room = n->max < 0 ? 3 : n->max - n->min;
            if (room > 3) room = 3;
            count += (int)(rnd(m->rng) % (uint64_t)(room + 1));
        }
        for (int i = 0; i < count && !m->failed; i++) sample_node(m, n->kids[0], depth);
        break;
    }
    }
}

char *gbnf_oracle_sample(const gbnf_oracle_t *g, uint64_t *rng, size_t max_len, size_t *len) {
    if (g->height[g->root] >= H_INF) return NULL;
    for (int attempt = 0; attempt < 20; attempt++) {
        smp_t m = {g, rng, {0}, max_len, 3 + (int)(rnd(rng) % 8), 0};
        put(&m.out, "%s", "");
        sample_node(&m, g->rules[g->root].body, 0);
        if (!m.failed && !m.out.oom) {
            if (len) *len = m.out.n;
            return m.out.p;
        }
        free(m.out.p);
    }
    return NULL;
}
