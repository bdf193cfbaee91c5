/*
 * grammar.c - GBNF grammars and the token masks they impose.
 *
 * ---- The format (GBNF, as llama.cpp's grammars/README defines it) ----------
 *
 *   rule-name ::= alternatives          names: letters, digits, '-', '_'
 *   "literal"  [a-z0-9_] [^"\\]  .       literal, class (ranges, ^ negation), any char
 *   \n \r \t \\ \" \[ \] \- \^ \xXX \uXXXX \UXXXXXXXX   escapes in literals and classes
 *   a b        a | b        ( ... )       sequence, alternation, group
 *   x*  x+  x?  x{m}  x{m,}  x{m,n}  x{,n}   repetition of the last item
 *   # comment to the end of the line
 *
 * A rule ends at the end of its line unless a parenthesis is open; a line
 * that starts with '|' continues the previous rule's alternatives. The start
 * rule is "root" (or the name the caller gives). Characters are Unicode
 * code points; the text a grammar matches is UTF-8.
 *
 * Limits (grammar.h) make every hostile grammar a clear error: text size,
 * ( ) nesting, repetition counts, element and rule counts after expanding
 * repetitions, undefined rules (named, with the line and column of the
 * first use), left recursion (refused with the cycle's rules: it would make
 * the matcher loop), and the longest chain of rules entered without a
 * character between (GRAMMAR_MAX_CHAIN). Errors give line:column.
 *
 * ---- The compiled form --------------------------------------------------------
 *
 * One array of elements E: each alternative of each rule is a run of
 * CHAR (a sorted, merged list of code-point ranges, maybe negated) and REF
 * (another rule) elements closed by an END. Repetitions become rules of
 * their own: x* is S ::= x S | (empty), x{m,n} is m copies of x then a
 * chain R_k ::= x R_k-1 | (empty); an item of several elements is first
 * made a rule so copies stay one element.
 *
 * ---- The matcher ------------------------------------------------------------
 *
 * A parse stack is a list of element indices: the top is the CHAR element
 * the next code point must match, the ones below are return addresses
 * (the element after a REF in its parent). Entering a rule replaces the
 * REF at the top by its return address (none when the REF ends its
 * alternative: tail calls do not grow the stack, so x* loops in constant
 * depth) and pushes one new stack per alternative; an END pops. A
 * grammar is ambiguous in general, so the state is a SET of stacks
 * (deduplicated), plus a flag "done" (some parse is complete) and the
 * bytes of a code point a token left half written. A code point advances
 * every stack whose top matches it.
 *
 * ---- Token masks, and why they are cheap -------------------------------------
 *
 * A token is allowed when its bytes advance the state without killing every
 * stack (end-of-generation tokens: when the parse is complete). Checking a
 * few tokens is cheap (gmatcher_allows, used by the sampler to try the
 * tokens it would pick first); a whole mask is not: a vocabulary of 150k
 * tokens holds about a million bytes. Three things cut it down:
 *
 * 1. The vocabulary is a byte trie (gvocab_t): tokens sharing a prefix
 *    share its work, and a prefix no stack survives drops its subtree.
 * 2. Token classes, computed once per grammar (grammar_bind): for every
 *    CHAR element p, walk the trie from a stack holding p alone. A token
 *    that a parse consumes without leaving p's rule instance is ACCEPTED
 *    whatever lies below p on a real stack; one every parse rejects before
 *    leaving it is REJECTED whatever lies below; only a token some parse
 *    carries past the end of p's rule instance, with bytes left, is
 *    UNCERTAIN: it depends on the stack below. Inside a JSON string, say,
 *    the uncertain tokens are those holding a quote.
 *    A mask is then the union, over the state's stacks, of the accepted
 *    set of the stack's top, plus its uncertain tokens checked one by one
 *    against that whole stack.
 * 3. A memo of masks by exact state (the canonical stack set and pending
 *    bytes): generation revisits the same states constantly (every token of
 *    a string at one place of a document is the same state).
 * A state with half a code point pending is rare (byte tokens); its mask is
 * one trie walk from the real stacks.
 *
 * Exactness: the classes are a cache of the same simulation, so masks are
 * what checking every token from the state would give; tests compare them.
 *
 * Bounds while matching: a stack deeper than GRAMMAR_MAX_DEPTH or more than
 * GRAMMAR_MAX_STACKS parses at once drop the parses concerned (the text
 * nests deeper than 1024, or the grammar is ambiguous beyond reason);
 * gmatcher_stats counts nothing for it, the matcher simply refuses those
 * continuations. Token texts over GRAMMAR_MAX_PIECE bytes are never
 * allowed.
 */
#include "text/grammar.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"

/* ============================================================================
 * Elements and rules
 * ========================================================================== */

enum { E_END = 0, E_CHAR = 1, E_REF = 2 };

typedef struct {
    uint8_t kind;
    uint8_t neg;    /* CHAR: the ranges list what is NOT matched */
    uint32_t n;     /* CHAR: ranges */
    uint32_t arg;   /* CHAR: first range; REF: rule */
} elem_t;

typedef struct {
    uint32_t lo, hi;
} crange_t;

typedef struct {
    uint32_t *accept_ids; /* sparse accepted set (sorted) or NULL */
    uint32_t n_accept;
    uint64_t *accept_bits; /* dense accepted set or NULL */
    uint32_t *uncertain;   /* ids whose fate depends on the stack below */
    uint32_t n_uncertain;
} tclass_t;

struct grammar {
    elem_t *E;
    uint32_t n_E;
    crange_t *R;
    uint32_t n_R;
    uint32_t n_rules;
    uint32_t *alt_off;  /* rule r's alternatives: alt_start[alt_off[r] .. alt_off[r+1]) */
    uint32_t *alt_start;
    char **names;       /* per rule, for messages */
    uint32_t root;
    /* bound to a vocabulary */
    uint32_t *rule_of;  /* per element: its rule */
    uint32_t *below;    /* per rule: the one element under its frame on every stack, or BELOW_MANY/BOTTOM */
    const gvocab_t *v;
    int32_t *cls_of;    /* per element: class index for CHAR, -1 otherwise */
    tclass_t *cls;
    uint32_t n_cls;
    double bind_ms;
};

int32_t grammar_n_rules(const grammar_t *g) { return (int32_t)g->n_rules; }
int32_t grammar_n_elems(const grammar_t *g) { return (int32_t)g->n_E; }
double grammar_bind_ms(const grammar_t *g) { return g->bind_ms; }

static bool char_match(const grammar_t *g, const elem_t *e, uint32_t cp) {
    const crange_t *r = g->R + e->arg;
    bool in = false;
    /* ranges are sorted and disjoint: binary search past a few */
    uint32_t lo = 0, hi = e->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (r[mid].hi < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < e->n && r[lo].lo <= cp) in = true;
    return in != (bool)e->neg;
}

/* Whether some code point of [lo, hi] matches e (half-written characters). */
static bool char_intersects(const grammar_t *g, const elem_t *e, uint32_t lo, uint32_t hi) {
    const crange_t *r = g->R + e->arg;
    if (!e->neg) {
        for (uint32_t i = 0; i < e->n; i++)
            if (r[i].lo <= hi && r[i].hi >= lo) return true;
        return false;
    }
    for (uint32_t i = 0; i < e->n; i++)
        if (r[i].lo <= lo && r[i].hi >= hi) return false; /* all of [lo, hi] excluded */
    return true;
}

/* ============================================================================
 * Parsing
 * ========================================================================== */

typedef struct {
    elem_t *v;
    size_t n, cap;
} evec_t;

typedef struct {
    char *name;
    evec_t body; /* alternatives, each closed by an END */
    bool defined;
    size_t def_at, ref_at; /* source offsets: definition, first use */
    bool synth;
} brule_t;

typedef struct {
    const char *s;
    size_t len, pos;
    brule_t *rules;
    uint32_t n_rules, cap_rules;
    crange_t *ranges;
    size_t n_ranges, cap_ranges;
    size_t n_elems; /* over all rules */
    int nest;
    tern_error_t *err;
    int rc;
} parser_t;

static void line_col(const parser_t *p, size_t at, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)p->s[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

#define PFAIL(p, at, ...)                                                                                              \
    do {                                                                                                               \
        if (!(p)->rc) {                                                                                                \
            int l_, c_;                                                                                                \
            line_col((p), (at), &l_, &c_);                                                                             \
            char m_[300];                                                                                              \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                                      \
            (p)->rc = tern_err((p)->err, TERN_EINVAL, "grammar: line %d, column %d: %s", l_, c_, m_);                  \
        }                                                                                                              \
        return (p)->rc;                                                                                                \
    } while (0)

static int oom(parser_t *p) {
    if (!p->rc) p->rc = tern_err(p->err, TERN_ENOMEM, "grammar: out of memory");
    return p->rc;
}

static int evec_push(parser_t *p, evec_t *v, elem_t e) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 16;
        elem_t *nv = realloc(v->v, nc * sizeof *nv);
        if (!nv) return oom(p);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = e;
    return 0;
}

static int count_elems(parser_t *p, size_t add, size_t at) {
    p->n_elems += add;
    if (p->n_elems > GRAMMAR_MAX_ELEMS)
        PFAIL(p, at, "the grammar grows past %u elements (repetition counts too large?)", GRAMMAR_MAX_ELEMS);
    return 0;
}

static int append_body(parser_t *p, uint32_t r, const elem_t *e, size_t n, size_t at) {
    if (count_elems(p, n, at)) return p->rc;
    for (size_t i = 0; i < n; i++)
        if (evec_push(p, &p->rules[r].body, e[i])) return p->rc;
    return 0;
}

static int new_rule(parser_t *p, const char *name, size_t nlen, bool synth, size_t at, uint32_t *out) {
    if (p->n_rules >= GRAMMAR_MAX_RULES) PFAIL(p, at, "more than %u rules", GRAMMAR_MAX_RULES);
    if (p->n_rules == p->cap_rules) {
        uint32_t nc = p->cap_rules ? p->cap_rules * 2 : 32;
        brule_t *nr = realloc(p->rules, nc * sizeof *nr);
        if (!nr) return oom(p);
        p->rules = nr;
        p->cap_rules = nc;
    }
    brule_t *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(nlen + 1);
    if (!r->name) return oom(p);
    memcpy(r->name, name, nlen);
    r->name[nlen] = 0;
    r->synth = synth;
    r->def_at = r->ref_at = at;
    *out = p->n_rules++;
    return 0;
}

static int synth_rule(parser_t *p, uint32_t parent, size_t at, uint32_t *out) {
    char nm[96];
    int l, c;
    line_col(p, at, &l, &c);
    snprintf(nm, sizeof nm, "%.40s@%d:%d#%u", p->rules[parent].name, l, c, p->n_rules);
    if (new_rule(p, nm, strlen(nm), true, at, out)) return p->rc;
    p->rules[*out].defined = true;
    return 0;
}

static uint32_t find_rule(const parser_t *p, const char *name, size_t nlen) {
    for (uint32_t i = 0; i < p->n_rules; i++)
        if (!p->rules[i].synth && strlen(p->rules[i].name) == nlen && memcmp(p->rules[i].name, name, nlen) == 0)
            return i;
    return UINT32_MAX;
}

static bool name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int cur(const parser_t *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }

/* Spaces, tabs, comments; newlines too when nl. */
static void skip_ws(parser_t *p, bool nl) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n') p->pos++;
        } else {
            break;
        }
    }
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (escape or UTF-8 code point). */
static int parse_char(parser_t *p, uint32_t *cp) {
    size_t at = p->pos;
    if (p->pos >= p->len) PFAIL(p, at, "unexpected end of the grammar");
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '\\') {
        p->pos++;
        int e = cur(p);
        if (e < 0) PFAIL(p, at, "unexpected end after '\\'");
        p->pos++;
        int nd = 0;
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'':
            *cp = (uint32_t)e;
            return 0;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default: PFAIL(p, at, "unknown escape '\\%c'", e >= 32 && e < 127 ? e : '?');
        }
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            int h = hexval(cur(p));
            if (h < 0) PFAIL(p, at, "escape '\\%c' needs %d hex digits", e, nd);
            v = v * 16 + (uint32_t)h;
            p->pos++;
        }
        if (v > 0x10FFFF) PFAIL(p, at, "code point U+%X is beyond U+10FFFF", v);
        *cp = v;
        return 0;
    }
    /* a UTF-8 code point */
    int n = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
    if (!n || p->pos + (size_t)n > p->len) PFAIL(p, at, "invalid UTF-8 in the grammar");
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int i = 1; i < n; i++) {
        unsigned char b = (unsigned char)p->s[p->pos + (size_t)i];
        if ((b & 0xC0) != 0x80) PFAIL(p, at, "invalid UTF-8 in the grammar");
        v = (v << 6) | (b & 0x3Fu);
    }
    if (v > 0x10FFFF) PFAIL(p, at, "invalid UTF-8 in the grammar");
    p->pos += (size_t)n;
    *cp = v;
    return 0;
}

static int crange_cmp(const void *a, const void *b) {
    const crange_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

/* Append ranges tmp[0..n) sorted and merged to the grammar's range list;
 * returns a CHAR element. */
static int make_char(parser_t *p, crange_t *tmp, size_t n, bool neg, elem_t *out) {
    /* n == 0 comes from "[]" or "[^]"; tmp may then be NULL, which qsort and
     * memcpy must not see even with a zero count. */
    if (n) qsort(tmp, n, sizeof *tmp, crange_cmp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && tmp[i].lo <= tmp[k - 1].hi + 1) {
            if (tmp[i].hi > tmp[k - 1].hi) tmp[k - 1].hi = tmp[i].hi;
        } else {
            tmp[k++] = tmp[i];
        }
    }
    if (p->n_ranges + k > p->cap_ranges) {
        size_t nc = p->cap_ranges ? p->cap_ranges * 2 : 64;
        while (nc < p->n_ranges + k) nc *= 2;
        crange_t *nr = realloc(p->ranges, nc * sizeof *nr);
        if (!nr) return oom(p);
        p->ranges = nr;
        p->cap_ranges = nc;
    }
    if (k) memcpy(p->ranges + p->n_ranges, tmp, k * sizeof *tmp);
    out->kind = E_CHAR;
    out->neg = neg;
    out->n = (uint32_t)k;
    out->arg = (uint32_t)p->n_ranges;
    p->n_ranges += k;
    return 0;
}

static int parse_alternates(parser_t *p, uint32_t rule, bool nested);

static int parse_count(parser_t *p, uint32_t *v) {
    size_t at = p->pos;
    uint64_t x = 0;
    int nd = 0;
    while (cur(p) >= '0' && cur(p) <= '9') {
        x = x * 10 + (uint64_t)(cur(p) - '0');
        if (x > GRAMMAR_MAX_REPEAT) PFAIL(p, at, "repetition count over %u", GRAMMAR_MAX_REPEAT);
        p->pos++;
        nd++;
    }
    if (!nd) PFAIL(p, at, "expected a number in { }");
    *v = (uint32_t)x;
    return 0;
}

/* Replace the last item seq[start..] by its repetition {mn, mx} (mx
 * UINT32_MAX: unbounded). */
static int repeat_item(parser_t *p, uint32_t rule, evec_t *seq, size_t start, uint32_t mn, uint32_t mx, size_t at) {
    if (start >= seq->n) PFAIL(p, at, "nothing to repeat (an empty literal?)");
    if (mx != UINT32_MAX && mx < mn) PFAIL(p, at, "repetition {%u,%u}: the maximum is below the minimum", mn, mx);
    if (mx == 0) { /* x{0}: nothing */
        seq->n = start;
        return 0;
    }
    elem_t item;
    size_t n_item = seq->n - start;
    if (n_item == 1) {
        item = seq->v[start];
    } else {
        uint32_t x;
        if (synth_rule(p, rule, at, &x)) return p->rc;
        elem_t end = {E_END, 0, 0, 0};
        if (append_body(p, x, seq->v + start, n_item, at) || append_body(p, x, &end, 1, at)) return p->rc;
        item = (elem_t){E_REF, 0, 0, x};
    }
    seq->n = start;
    if (count_elems(p, mn, at)) return p->rc;
    for (uint32_t i = 0; i < mn; i++)
        if (evec_push(p, seq, item)) return p->rc;
    const elem_t end = {E_END, 0, 0, 0};
    if (mx == UINT32_MAX) { /* S ::= item S | (empty) */
        uint32_t s;
        if (synth_rule(p, rule, at, &s)) return p->rc;
        elem_t body[4] = {item, {E_REF, 0, 0, s}, end, end};
        if (append_body(p, s, body, 4, at)) return p->rc;
        if (count_elems(p, 1, at) || evec_push(p, seq, (elem_t){E_REF, 0, 0, s})) return p->rc;
        return 0;
    }
    /* R_1 ::= item | (empty); R_k ::= item R_k-1 | (empty) */
    uint32_t prev = UINT32_MAX;
    for (uint32_t k = 1; k <= mx - mn; k++) {
        uint32_t r;
        if (synth_rule(p, rule, at, &r)) return p->rc;
        elem_t body[4];
        size_t nb = 0;
        body[nb++] = item;
        if (prev != UINT32_MAX) body[nb++] = (elem_t){E_REF, 0, 0, prev};
        body[nb++] = end;
        body[nb++] = end;
        if (append_body(p, r, body, nb, at)) return p->rc;
        prev = r;
    }
    if (prev != UINT32_MAX && (count_elems(p, 1, at) || evec_push(p, seq, (elem_t){E_REF, 0, 0, prev}))) return p->rc;
    return 0;
}

static int parse_sequence(parser_t *p, uint32_t rule, evec_t *seq, bool nested) {
    size_t last = SIZE_MAX; /* where the last item starts in seq */
    crange_t *tmp = NULL;
    size_t tmp_cap = 0;
    for (;;) {
        skip_ws(p, nested);
        int c = cur(p);
        size_t at = p->pos;
        if (c == '"') {
            p->pos++;
            last = seq->n;
            while (cur(p) != '"') {
                if (cur(p) < 0) {
                    free(tmp);
                    PFAIL(p, at, "unterminated literal");
                }
                uint32_t cp;
                elem_t e;
                crange_t r;
                if (parse_char(p, &cp)) break;
                r.lo = r.hi = cp;
                if (make_char(p, &r, 1, false, &e) || count_elems(p, 1, at) || evec_push(p, seq, e)) break;
            }
            if (p->rc) break;
            p->pos++;
        } else if (c == '[') {
            p->pos++;
            bool neg = false;
            if (cur(p) == '^') {
                neg = true;
                p->pos++;
            }
            size_t n = 0;
            while (cur(p) != ']') {
                if (cur(p) < 0) {
                    free(tmp);
                    PFAIL(p, at, "unterminated character class");
                }
                uint32_t lo, hi;
                if (parse_char(p, &lo)) break;
                hi = lo;
                if (cur(p) == '-' && p->pos + 1 < p->len && p->s[p->pos + 1] != ']') {
                    p->pos++;
                    size_t rat = p->pos;
                    if (parse_char(p, &hi)) break;
                    if (hi < lo) {
                        free(tmp);
                        PFAIL(p, rat, "range U+%X-U+%X is reversed", lo, hi);
                    }
                }
                if (n == tmp_cap) {
                    if (n >= 65536) {
                        free(tmp);
                        PFAIL(p, at, "character class with more than 65536 ranges");
                    }
                    size_t nc = tmp_cap ? tmp_cap * 2 : 16;
                    crange_t *nt = realloc(tmp, nc * sizeof *nt);
                    if (!nt) {
                        free(tmp);
                        return oom(p);
                    }
                    tmp = nt;
                    tmp_cap = nc;
                }
                tmp[n].lo = lo;
                tmp[n].hi = hi;
                n++;
            }
            if (p->rc) break;
            p->pos++;
            if (!n && !neg) {
                free(tmp);
                PFAIL(p, at, "empty character class [] matches nothing");
            }
            elem_t e;
            last = seq->n;
            if (make_char(p, tmp, n, neg, &e) || count_elems(p, 1, at) || evec_push(p, seq, e)) break;
        } else if (c == '.') {
            p->pos++;
            crange_t r = {0, 0x10FFFF};
            elem_t e;
            last = seq->n;
            if (make_char(p, &r, 1, false, &e) || count_elems(p, 1, at) || evec_push(p, seq, e)) break;
        } else if (c >= 0 && name_char(c)) {
            size_t s = p->pos;
            while (cur(p) >= 0 && name_char(cur(p))) p->pos++;
            size_t nl = p->pos - s;
            uint32_t r = find_rule(p, p->s + s, nl);
            if (r == UINT32_MAX && new_rule(p, p->s + s, nl, false, s, &r)) break;
            last = seq->n;
            if (count_elems(p, 1, at) || evec_push(p, seq, (elem_t){E_REF, 0, 0, r})) break;
        } else if (c == '(') {
            if (++p->nest > GRAMMAR_MAX_NEST) {
                free(tmp);
                PFAIL(p, at, "parentheses nested deeper than %d", GRAMMAR_MAX_NEST);
            }
            p->pos++;
            uint32_t g;
            if (synth_rule(p, rule, at, &g) || parse_alternates(p, g, true)) break;
            skip_ws(p, true);
            if (cur(p) != ')') {
                free(tmp);
                PFAIL(p, p->pos, "expected ')' to close the group opened at this rule");
            }
            p->pos++;
            p->nest--;
            last = seq->n;
            if (count_elems(p, 1, at) || evec_push(p, seq, (elem_t){E_REF, 0, 0, g})) break;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == SIZE_MAX) {
                free(tmp);
                PFAIL(p, at, "'%c' with nothing before it to repeat", c);
            }
            p->pos++;
            uint32_t mn = 0, mx = UINT32_MAX;
            if (c == '+') mn = 1;
            if (c == '?') mx = 1;
            if (c == '{') {
                skip_ws(p, false);
                if (cur(p) == ',') {
                    mn = 0;
                } else if (parse_count(p, &mn)) {
                    break;
                }
                skip_ws(p, false);
                if (cur(p) == ',') {
                    p->pos++;
                    skip_ws(p, false);
                    if (cur(p) != '}' && parse_count(p, &mx)) break;
                } else {
                    mx = mn;
                }
                skip_ws(p, false);
                if (cur(p) != '}') {
                    free(tmp);
                    PFAIL(p, p->pos, "expected '}' to close the repetition count");
                }
                p->pos++;
            }
            if (repeat_item(p, rule, seq, last, mn, mx, at)) break;
            last = SIZE_MAX; /* x** is not allowed: repeat a group instead */
        } else {
            break;
        }
    }
    free(tmp);
    return p->rc;
}

/* Alternatives of a rule (or group) into rules[rule].body. */
static int parse_alternates(parser_t *p, uint32_t rule, bool nested) {
    evec_t seq = {0};
    const elem_t end = {E_END, 0, 0, 0};
    for (;;) {
        seq.n = 0;
        size_t at = p->pos;
        if (parse_sequence(p, rule, &seq, nested) || append_body(p, rule, seq.v, seq.n, at) ||
            append_body(p, rule, &end, 1, at))
            break;
        size_t save = p->pos;
        skip_ws(p, true);
        if (cur(p) == '|' && (nested || p->s[save] == '|' || p->pos > save)) {
            /* top level: '|' may start the next line */
            p->pos++;
            skip_ws(p, true);
            continue;
        }
        p->pos = save;
        break;
    }
    free(seq.v);
    return p->rc;
}

static int parse_grammar(parser_t *p) {
    for (;;) {
        skip_ws(p, true);
        if (p->pos >= p->len) break;
        size_t at = p->pos;
        if (!name_char(cur(p))) PFAIL(p, at, "expected a rule name, found '%c'", cur(p) >= 32 && cur(p) < 127 ? cur(p) : '?');
        while (cur(p) >= 0 && name_char(cur(p))) p->pos++;
        size_t nl = p->pos - at;
        skip_ws(p, false);
        if (!(p->pos + 3 <= p->len && memcmp(p->s + p->pos, "::=", 3) == 0)) PFAIL(p, p->pos, "expected '::=' after the rule name");
        p->pos += 3;
        uint32_t r = find_rule(p, p->s + at, nl);
        if (r == UINT32_MAX) {
            if (new_rule(p, p->s + at, nl, false, at, &r)) return p->rc;
        } else if (p->rules[r].defined) {
            PFAIL(p, at, "rule '%s' is defined twice", p->rules[r].name);
        }
        p->rules[r].defined = true;
        p->rules[r].def_at = at;
        skip_ws(p, true);
        if (parse_alternates(p, r, false)) return p->rc;
        skip_ws(p, false);
        if (p->pos < p->len && cur(p) != '\n') {
            int c = cur(p);
            PFAIL(p, p->pos, "unexpected '%c'", c >= 32 && c < 127 ? c : '?');
        }
    }
    return 0;
}

/* ---- checks: undefined rules, left recursion, chain depth ---------------------- */

static bool nullable_seq(const elem_t *e, const bool *null_rule) {
    for (; e->kind != E_END; e++)
        if (e->kind == E_CHAR || !null_rule[e->arg]) return false;
    return true;
}

/* Iterate the rules' left edges (rules a position can enter before any
 * character): for each alternative, REFs up to and including the first
 * non-nullable element. */
typedef struct {
    uint32_t *off, *to; /* CSR */
} edges_t;

static int check_grammar(parser_t *p, grammar_t *g) {
    const uint32_t n = g->n_rules;
    bool *nul = calloc(n, 1);
    uint32_t *deg = calloc((size_t)n + 1, sizeof *deg);
    uint8_t *color = calloc(n, 1);
    uint32_t *depth = calloc(n, sizeof *depth);
    uint32_t *stk = malloc(((size_t)n + 1) * 2 * sizeof *stk);
    uint32_t *from = malloc((size_t)n * sizeof *from);
    edges_t ed = {0};
    int rc = 0;
    if (!nul || !deg || !color || !depth || !stk || !from) goto nomem;
    /* nullable: fixpoint */
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = 0; r < n; r++) {
            if (nul[r]) continue;
            for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++)
                if (nullable_seq(g->E + g->alt_start[a], nul)) {
                    nul[r] = true;
                    ch = true;
                    break;
                }
        }
    }
    /* left edges */
    size_t ne = 0;
    for (int pass = 0; pass < 2; pass++) {
        ne = 0;
        for (uint32_t r = 0; r < n; r++) {
            if (pass) ed.off[r] = (uint32_t)ne;
            for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++)
                for (const elem_t *e = g->E + g->alt_start[a]; e->kind == E_REF; e++) {
                    if (pass) ed.to[ne] = e->arg;
                    ne++;
                    if (!nul[e->arg]) break;
                }
        }
        if (!pass) {
            ed.off = malloc(((size_t)n + 1) * sizeof *ed.off);
            ed.to = malloc((ne ? ne : 1) * sizeof *ed.to);
            if (!ed.off || !ed.to) goto nomem;
        }
    }
    ed.off[n] = (uint32_t)ne;
    /* DFS (iterative): a back edge is left recursion; depth = longest chain */
    for (uint32_t s = 0; s < n && !rc; s++) {
        if (color[s]) continue;
        size_t sp = 0;
        stk[sp++] = s;
        stk[sp++] = ed.off[s];
        color[s] = 1;
        from[s] = UINT32_MAX;
        while (sp && !rc) {
            uint32_t r = stk[sp - 2], i = stk[sp - 1];
            if (i < ed.off[r + 1]) {
                stk[sp - 1]++;
                uint32_t t = ed.to[i];
                if (color[t] == 1) { /* cycle t -> ... -> r -> t */
                    char chain[240];
                    size_t cl = 0;
                    cl += (size_t)snprintf(chain + cl, sizeof chain - cl, "%s", g->names[t]);
                    for (uint32_t x = r, k = 0; x != t && x != UINT32_MAX && k < 6 && cl < sizeof chain; x = from[x], k++)
                        cl += (size_t)snprintf(chain + cl, sizeof chain - cl, " <- %s", g->names[x]);
                    int l, c;
                    line_col(p, p->rules[t].def_at, &l, &c);
                    rc = tern_err(p->err, TERN_EINVAL,
                                  "grammar: line %d, column %d: left recursion: rule '%s' can reach itself without "
                                  "consuming a character (%s); write it with repetition instead (x ::= y (op y)*), "
                                  "and never repeat something that can match nothing",
                                  l, c, g->names[t], chain);
                    break;
                }
                if (color[t] == 0) {
                    color[t] = 1;
                    from[t] = r;
                    stk[sp++] = t;
                    stk[sp++] = ed.off[t];
                } else if (depth[t] + 1 > depth[r]) {
                    depth[r] = depth[t] + 1;
                }
            } else {
                color[r] = 2;
                sp -= 2;
                if (sp) {
                    uint32_t parent = stk[sp - 2];
                    if (depth[r] + 1 > depth[parent]) depth[parent] = depth[r] + 1;
                }
                if (depth[r] > GRAMMAR_MAX_CHAIN) {
                    int l, c;
                    line_col(p, p->rules[r].def_at, &l, &c);
                    rc = tern_err(p->err, TERN_EINVAL,
                                  "grammar: line %d, column %d: rule '%s' enters a chain of more than %d rules before "
                                  "its first character",
                                  l, c, g->names[r], GRAMMAR_MAX_CHAIN);
                }
            }
        }
    }
    goto out;
nomem:
    rc = tern_err(p->err, TERN_ENOMEM, "grammar: out of memory");
out:
    free(nul);
    free(deg);
    free(color);
    free(depth);
    free(stk);
    free(from);
    free(ed.off);
    free(ed.to);
    return rc;
}

/* Give every use of a non-recursive rule its own copy (within a budget of
 * elements), so that what lies under each copy's frame is known statically
 * (below_analysis): "ws" or "char" used in ten places become ten rules, and
 * a token that runs past the end of one is decided without the real stack.
 * The language does not change. Recursive rules (and rules that reach one)
 * stay shared. */
static int clone_shared(parser_t *p) {
    const uint32_t n = p->n_rules;
    uint32_t *outdeg = calloc(n, sizeof *outdeg), *q = malloc((size_t)n * sizeof *q);
    uint32_t *roff = calloc((size_t)n + 1, sizeof *roff), *radj = NULL;
    bool *dag = calloc(n, 1), *claimed = NULL;
    size_t ne = 0;
    int rc = 0;
    if (!outdeg || !q || !roff || !dag) goto nomem;
    for (uint32_t y = 0; y < n; y++)
        for (size_t i = 0; i < p->rules[y].body.n; i++)
            if (p->rules[y].body.v[i].kind == E_REF) {
                outdeg[y]++;
                roff[p->rules[y].body.v[i].arg + 1]++;
                ne++;
            }
    for (uint32_t x = 0; x < n; x++) roff[x + 1] += roff[x];
    radj = malloc((ne ? ne : 1) * sizeof *radj);
    if (!radj) goto nomem;
    {
        uint32_t *fill = calloc(n, sizeof *fill);
        if (!fill) goto nomem;
        for (uint32_t y = 0; y < n; y++)
            for (size_t i = 0; i < p->rules[y].body.n; i++)
                if (p->rules[y].body.v[i].kind == E_REF) {
                    uint32_t x = p->rules[y].body.v[i].arg;
                    radj[roff[x] + fill[x]++] = y;
                }
        free(fill);
    }
    /* peel rules that reference nothing left: they are not recursive */
    uint32_t qh = 0, qt = 0;
    for (uint32_t x = 0; x < n; x++)
        if (!outdeg[x]) q[qt++] = x;
    while (qh < qt) {
        uint32_t x = q[qh++];
        dag[x] = true;
        for (uint32_t k = roff[x]; k < roff[x + 1]; k++)
            if (--outdeg[radj[k]] == 0) q[qt++] = radj[k];
    }
    /* clone: the first use of a DAG rule keeps it, later uses get copies */
    const size_t budget = p->n_elems * 8 + 4096 < GRAMMAR_MAX_ELEMS / 2 ? p->n_elems * 8 + 4096 : GRAMMAR_MAX_ELEMS / 2;
    claimed = calloc(GRAMMAR_MAX_RULES, 1);
    if (!claimed) goto nomem;
    for (uint32_t y = 0; y < p->n_rules; y++) { /* p->n_rules grows: clones are visited too */
        for (size_t i = 0; i < p->rules[y].body.n; i++) {
            elem_t *e = &p->rules[y].body.v[i];
            if (e->kind != E_REF) continue;
            uint32_t x = e->arg;
            bool isdag = x < n ? dag[x] : true;
            if (!isdag) continue;
            if (!claimed[x]) {
                claimed[x] = 1;
                continue;
            }
            size_t bn = p->rules[x].body.n;
            if (p->n_elems + bn > budget || p->n_rules >= GRAMMAR_MAX_RULES) continue;
            uint32_t c;
            char nm[64];
            snprintf(nm, sizeof nm, "%.40s'", p->rules[x].name);
            if (new_rule(p, nm, strlen(nm), true, p->rules[x].def_at, &c)) {
                rc = p->rc;
                goto out;
            }
            p->rules[c].defined = true;
            if (append_body(p, c, p->rules[x].body.v, bn, p->rules[x].def_at)) {
                rc = p->rc;
                goto out;
            }
            claimed[c] = 1;
            p->rules[y].body.v[i].arg = c; /* bodies may have moved: index again */
            if (c >= n) { /* remember the clone is a DAG rule: indices >= n are clones */
            }
        }
    }
    goto out;
nomem:
    rc = oom(p);
out:
    free(outdeg);
    free(q);
    free(roff);
    free(radj);
    free(dag);
    free(claimed);
    return rc;
}

void grammar_free(grammar_t *g) {
    if (!g) return;
    if (g->names)
        for (uint32_t i = 0; i < g->n_rules; i++) free(g->names[i]);
    free(g->names);
    free(g->E);
    free(g->R);
    free(g->alt_off);
    free(g->alt_start);
    free(g->cls_of);
    free(g->rule_of);
    free(g->below);
    if (g->cls)
        for (uint32_t i = 0; i < g->n_cls; i++) {
            free(g->cls[i].accept_ids);
            free(g->cls[i].accept_bits);
            free(g->cls[i].uncertain);
        }
    free(g->cls);
    free(g);
}

grammar_t *grammar_parse(const char *text, size_t len, const char *root, tern_error_t *err) {
    if (!text && len) {
        tern_err(err, TERN_EINVAL, "grammar: NULL text");
        return NULL;
    }
    if (len > GRAMMAR_MAX_TEXT) {
        tern_err(err, TERN_EINVAL, "grammar: %zu bytes, more than the %u allowed", len, GRAMMAR_MAX_TEXT);
        return NULL;
    }
    if (!root) root = "root";
    parser_t p = {.s = text ? text : "", .len = len, .err = err};
    grammar_t *g = NULL;
    if (parse_grammar(&p)) goto fail;
    /* undefined rules, root */
    for (uint32_t r = 0; r < p.n_rules; r++)
        if (!p.rules[r].defined) {
            int l, c;
            line_col(&p, p.rules[r].ref_at, &l, &c);
            tern_err(err, TERN_EINVAL, "grammar: line %d, column %d: undefined rule '%s'", l, c, p.rules[r].name);
            p.rc = TERN_EINVAL;
            goto fail;
        }
    uint32_t root_id = find_rule(&p, root, strlen(root));
    if (root_id == UINT32_MAX) {
        tern_err(err, TERN_EINVAL, "grammar: no rule named '%s' (the start rule)%s", root,
                 p.n_rules ? "" : "; the grammar is empty");
        p.rc = TERN_EINVAL;
        goto fail;
    }
    if (clone_shared(&p)) goto fail;
    /* flatten */
    g = calloc(1, sizeof *g);
    if (!g) goto nomem;
    g->n_rules = p.n_rules;
    g->root = root_id;
    size_t n_alt = 0;
    for (uint32_t r = 0; r < p.n_rules; r++)
        for (size_t i = 0; i < p.rules[r].body.n; i++) n_alt += p.rules[r].body.v[i].kind == E_END;
    g->n_E = (uint32_t)p.n_elems + 1;
    g->E = calloc(g->n_E, sizeof *g->E);
    g->alt_off = calloc((size_t)p.n_rules + 1, sizeof *g->alt_off);
    g->alt_start = calloc(n_alt + 1, sizeof *g->alt_start);
    g->names = calloc(p.n_rules, sizeof *g->names);
    g->R = malloc((p.n_ranges ? p.n_ranges : 1) * sizeof *g->R);
    if (!g->E || !g->alt_off || !g->alt_start || !g->names || !g->R) goto nomem;
    if (p.n_ranges) memcpy(g->R, p.ranges, p.n_ranges * sizeof *g->R);
    g->n_R = (uint32_t)p.n_ranges;
    uint32_t ei = 0, ai = 0;
    for (uint32_t r = 0; r < p.n_rules; r++) {
        g->alt_off[r] = ai;
        g->names[r] = p.rules[r].name;
        p.rules[r].name = NULL;
        const evec_t *b = &p.rules[r].body;
        bool start = true;
        for (size_t i = 0; i < b->n; i++) {
            if (start) g->alt_start[ai++] = ei;
            g->E[ei++] = b->v[i];
            start = b->v[i].kind == E_END;
        }
    }
    g->alt_off[p.n_rules] = ai;
    g->n_E = ei;
    if (check_grammar(&p, g)) {
        p.rc = TERN_EINVAL;
        goto fail;
    }
    for (uint32_t r = 0; r < p.n_rules; r++) {
        free(p.rules[r].name);
        free(p.rules[r].body.v);
    }
    free(p.rules);
    free(p.ranges);
    return g;
nomem:
    tern_err(err, TERN_ENOMEM, "grammar: out of memory");
fail:
    for (uint32_t r = 0; r < p.n_rules; r++) {
        free(p.rules[r].name);
        free(p.rules[r].body.v);
    }
    free(p.rules);
    free(p.ranges);
    grammar_free(g);
    return NULL;
}

/* ============================================================================
 * Stack sets
 * ========================================================================== */

typedef struct {
    uint32_t *buf; /* records: len, then len element indices (top last) */
    size_t used, cap;
    uint32_t *off; /* record offsets */
    uint64_t *hash;
    uint32_t n, cap_n;
    bool done;     /* a parse is complete (an empty stack) */
    bool failed;   /* out of memory */
} sset_t;

static void sset_clear(sset_t *s) {
    s->used = 0;
    s->n = 0;
    s->done = false;
}

static void sset_free(sset_t *s) {
    free(s->buf);
    free(s->off);
    free(s->hash);
    memset(s, 0, sizeof *s);
}

static inline const uint32_t *sset_stack(const sset_t *s, uint32_t i, uint32_t *len) {
    const uint32_t *r = s->buf + s->off[i];
    *len = r[0];
    return r + 1;
}

static inline uint64_t hash_stack(const uint32_t *st, uint32_t len) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ len;
    for (uint32_t i = 0; i < len; i++) {
        h ^= st[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    return h;
}

static void sset_add(sset_t *s, const uint32_t *st, uint32_t len) {
    uint64_t h = hash_stack(st, len);
    for (uint32_t i = 0; i < s->n; i++)
        if (s->hash[i] == h) {
            uint32_t l;
            const uint32_t *o = sset_stack(s, i, &l);
            if (l == len && memcmp(o, st, len * sizeof *st) == 0) return;
        }
    if (s->n >= GRAMMAR_MAX_STACKS) return; /* beyond reason: the parse is dropped (top of file) */
    if (s->n == s->cap_n) {
        uint32_t nc = s->cap_n ? s->cap_n * 2 : 8;
        uint32_t *no = realloc(s->off, nc * sizeof *no);
        if (no) s->off = no;
        uint64_t *nh = realloc(s->hash, nc * sizeof *nh);
        if (nh) s->hash = nh;
        if (!no || !nh) {
            s->failed = true;
            return;
        }
        s->cap_n = nc;
    }
    if (s->used + len + 1 > s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        while (nc < s->used + len + 1) nc *= 2;
        uint32_t *nb = realloc(s->buf, nc * sizeof *nb);
        if (!nb) {
            s->failed = true;
            return;
        }
        s->buf = nb;
        s->cap = nc;
    }
    s->off[s->n] = (uint32_t)s->used;
    s->hash[s->n] = h;
    s->buf[s->used] = len;
    memcpy(s->buf + s->used + 1, st, len * sizeof *st);
    s->used += len + 1;
    s->n++;
}

static int sset_copy(sset_t *d, const sset_t *s) {
    sset_clear(d);
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t l;
        const uint32_t *st = sset_stack(s, i, &l);
        sset_add(d, st, l);
    }
    d->done = s->done;
    return d->failed ? -1 : 0;
}

/* ---- expansion: make every stack's top a CHAR ---------------------------------
 * A work list of stacks (copies in a bump arena) processed one at a time in
 * a buffer of GRAMMAR_MAX_DEPTH + 2 entries; alternatives after the first
 * are pushed as copies. */
typedef struct {
    const grammar_t *g;
    uint32_t *cur;   /* GRAMMAR_MAX_DEPTH + 2 */
    uint32_t *wl;    /* work list arena: [len, elems...] records */
    size_t wl_used, wl_cap;
    bool failed;
} xp_t;

static int xp_init(xp_t *x, const grammar_t *g) {
    memset(x, 0, sizeof *x);
    x->g = g;
    x->cur = malloc((GRAMMAR_MAX_DEPTH + 2) * sizeof *x->cur);
    x->wl_cap = 4096;
    x->wl = malloc(x->wl_cap * sizeof *x->wl);
    return x->cur && x->wl ? 0 : -1;
}
static void xp_free(xp_t *x) {
    free(x->cur);
    free(x->wl);
}

static bool wl_push(xp_t *x, const uint32_t *st, uint32_t len) {
    if (x->wl_used + len + 1 > x->wl_cap) {
        size_t nc = x->wl_cap * 2;
        while (nc < x->wl_used + len + 1) nc *= 2;
        uint32_t *nw = realloc(x->wl, nc * sizeof *nw);
        if (!nw) {
            x->failed = true;
            return false;
        }
        x->wl = nw;
        x->wl_cap = nc;
    }
    memcpy(x->wl + x->wl_used, st, len * sizeof *st);
    x->wl[x->wl_used + len] = len; /* length last, so popping reads it first */
    x->wl_used += len + 1;
    return true;
}

/* Expand the stack in x->cur[0..len) into out. */
static void expand_cur(xp_t *x, uint32_t len, sset_t *out) {
    const grammar_t *g = x->g;
    const size_t floor = x->wl_used;
    uint32_t *st = x->cur;
    uint32_t steps = 0;
    for (;;) {
        for (;;) {
            if (++steps > (1u << 22)) return; /* unreachable for a checked grammar; a guard all the same */
            if (len == 0) {
                out->done = true;
                break;
            }
            uint32_t top = st[len - 1];
            const elem_t *e = &g->E[top];
            if (e->kind == E_CHAR) {
                sset_add(out, st, len);
                break;
            }
            if (e->kind == E_END) {
                len--;
                continue;
            }
            uint32_t base = len - 1;
            if (g->E[top + 1].kind != E_END) st[base++] = top + 1;
            if (base + 1 > GRAMMAR_MAX_DEPTH) break; /* nests too deep: this parse is dropped */
            uint32_t r = e->arg, a0 = g->alt_off[r], a1 = g->alt_off[r + 1];
            for (uint32_t a = a1 - 1; a > a0; a--) {
                st[base] = g->alt_start[a];
                if (!wl_push(x, st, base + 1)) return;
            }
            st[base] = g->alt_start[a0];
            len = base + 1;
        }
        if (x->wl_used == floor) return;
        len = x->wl[x->wl_used - 1];
        x->wl_used -= len + 1;
        memcpy(st, x->wl + x->wl_used, len * sizeof *st);
    }
}

/* out += every stack of in advanced by code point cp. */
static void sset_advance(xp_t *x, const sset_t *in, uint32_t cp, sset_t *out) {
    const grammar_t *g = x->g;
    for (uint32_t i = 0; i < in->n; i++) {
        uint32_t len;
        const uint32_t *st = sset_stack(in, i, &len);
        if (!char_match(g, &g->E[st[len - 1]], cp)) continue;
        memcpy(x->cur, st, len * sizeof *st);
        x->cur[len - 1]++;
        expand_cur(x, len, out);
    }
}

static void sset_expand_from(xp_t *x, const uint32_t *st, uint32_t len, sset_t *out) {
    memcpy(x->cur, st, len * sizeof *st);
    expand_cur(x, len, out);
}

/* ---- UTF-8 -------------------------------------------------------------------- */

typedef struct {
    uint32_t val;
    uint32_t rem;  /* continuation bytes still expected */
    uint32_t lead; /* the lead byte while its first continuation is pending, else 0 */
} u8s_t;

/* 1: cp complete; 0: partial; -1: invalid (stray continuation, overlong
 * form, surrogate, beyond U+10FFFF: checked at the first continuation
 * byte, so every prefix a state keeps can still complete to a valid code
 * point). */
static inline int u8_step(u8s_t *s, uint8_t b, uint32_t *cp) {
    if (s->rem == 0) {
        if (b < 0x80) {
            *cp = b;
            return 1;
        }
        if (b < 0xC2) return -1;
        if (b < 0xE0) {
            s->val = b & 0x1Fu;
            s->rem = 1;
        } else if (b < 0xF0) {
            s->val = b & 0x0Fu;
            s->rem = 2;
        } else if (b < 0xF5) {
            s->val = b & 0x07u;
            s->rem = 3;
        } else {
            return -1;
        }
        s->lead = b;
        return 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    if (s->lead) {
        if ((s->lead == 0xE0 && b < 0xA0) || (s->lead == 0xED && b > 0x9F) || (s->lead == 0xF0 && b < 0x90) ||
            (s->lead == 0xF4 && b > 0x8F))
            return -1;
        s->lead = 0;
    }
    s->val = (s->val << 6) | (b & 0x3Fu);
    if (--s->rem) return 0;
    *cp = s->val;
    s->val = 0;
    return 1;
}

/* Whether some stack of s can match a code point starting with the pending
 * bytes of u. */
static bool partial_ok(const grammar_t *g, const sset_t *s, u8s_t u) {
    uint32_t sh = 6 * u.rem, lo = u.val << sh, hi = lo | ((1u << sh) - 1);
    if (u.lead >= 0xE0 && u.lead < 0xF0 && lo < 0x800) lo = 0x800; /* no overlong forms */
    if (u.lead == 0xED && hi > 0xD7FF) hi = 0xD7FF;                 /* no surrogates */
    if (u.lead >= 0xF0 && lo < 0x10000) lo = 0x10000;
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t len;
        const uint32_t *st = sset_stack(s, i, &len);
        if (char_intersects(g, &g->E[st[len - 1]], lo, hi)) return true;
    }
    return false;
}

/* ============================================================================
 * The vocabulary trie
 * ========================================================================== */

typedef struct {
    uint32_t first, next; /* first child, next sibling (0: none; node 0 is the root) */
    uint32_t tok_lo, tok_hi, sub_hi; /* tokens ending here: order[tok_lo..tok_hi); subtree: order[tok_lo..sub_hi) */
    uint8_t byte;
} tnode_t;

enum { TK_TEXT = 0, TK_EOG = 1, TK_BANNED = 2 };

struct gvocab {
    int32_t n_vocab;
    const char **piece;
    uint32_t *plen;
    uint8_t *kind;
    int32_t *order;   /* eligible ids in trie (byte) order */
    uint32_t n_order;
    int32_t *eog;     /* end-of-generation ids */
    uint32_t n_eog;
    tnode_t *nodes;
    uint32_t n_nodes;
};

int32_t gvocab_n_vocab(const gvocab_t *v) { return v->n_vocab; }

void gvocab_free(gvocab_t *v) {
    if (!v) return;
    free(v->piece);
    free(v->plen);
    free(v->kind);
    free(v->order);
    free(v->eog);
    free(v->nodes);
    free(v);
}

typedef struct {
    const char *s;
    uint32_t len;
    int32_t id;
} pent_t;
static int cmp_pent(const void *a, const void *b) {
    const pent_t *x = a, *y = b;
    uint32_t l = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, l);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

gvocab_t *gvocab_build(const tokenizer_t *t, tern_error_t *err) {
    gvocab_t *v = calloc(1, sizeof *v);
    int32_t n = t ? tok_n_vocab(t) : 0;
    if (!v || n <= 0) {
        free(v);
        tern_err(err, n <= 0 ? TERN_EINVAL : TERN_ENOMEM, "grammar: %s", n <= 0 ? "no vocabulary" : "out of memory");
        return NULL;
    }
    v->n_vocab = n;
    v->piece = calloc((size_t)n, sizeof *v->piece);
    v->plen = calloc((size_t)n, sizeof *v->plen);
    v->kind = calloc((size_t)n, 1);
    v->order = malloc((size_t)n * sizeof *v->order);
    v->eog = malloc((size_t)n * sizeof *v->eog);
    if (!v->piece || !v->plen || !v->kind || !v->order || !v->eog) goto nomem;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = 0;
        const char *s = tok_piece(t, i, &l);
        v->piece[i] = s ? s : "";
        v->plen[i] = s ? (uint32_t)l : 0;
        if (tok_is_eog(t, i)) {
            v->kind[i] = TK_EOG;
            v->eog[v->n_eog++] = i;
        } else if (!s || l == 0 || l > GRAMMAR_MAX_PIECE || tok_is_control(t, i)) {
            v->kind[i] = TK_BANNED;
        } else {
            v->order[v->n_order++] = i;
            total += l;
        }
    }
    /* sort by bytes (shorter first on a common prefix, then by id) */
    pent_t *pe = malloc((v->n_order ? v->n_order : 1) * sizeof *pe);
    if (!pe) goto nomem;
    for (uint32_t k = 0; k < v->n_order; k++) pe[k] = (pent_t){v->piece[v->order[k]], v->plen[v->order[k]], v->order[k]};
    qsort(pe, v->n_order, sizeof *pe, cmp_pent);
    for (uint32_t k = 0; k < v->n_order; k++) v->order[k] = pe[k].id;
    free(pe);
    v->nodes = calloc(total + 1, sizeof *v->nodes);
    if (!v->nodes) goto nomem;
    /* path[d]: the node at depth d of the previous token's bytes */
    uint32_t path[GRAMMAR_MAX_PIECE + 1];
    uint32_t plen = 0, nn = 1;
    path[0] = 0;
    for (uint32_t k = 0; k < v->n_order; k++) {
        int32_t id = v->order[k];
        const uint8_t *s = (const uint8_t *)v->piece[id];
        uint32_t l = v->plen[id], d = 0;
        while (d < plen && d < l && v->nodes[path[d + 1]].byte == s[d]) d++;
        /* the previous path's node at depth d + 1 (if any) is the last
         * child of path[d] so far: the new node is its next sibling */
        uint32_t prev_sib = plen > d ? path[d + 1] : 0;
        while (plen > d) { /* subtrees below depth d end before token k */
            v->nodes[path[plen]].sub_hi = k;
            plen--;
        }
        for (; d < l; d++) {
            uint32_t nd = nn++;
            v->nodes[nd].byte = s[d];
            v->nodes[nd].tok_lo = v->nodes[nd].tok_hi = k;
            if (prev_sib)
                v->nodes[prev_sib].next = nd;
            else
                v->nodes[path[d]].first = nd;
            prev_sib = 0;
            path[d + 1] = nd;
            plen = d + 1;
        }
        tnode_t *end = &v->nodes[path[l]];
        if (end->tok_hi == k) end->tok_hi = k + 1;
    }
    while (plen > 0) {
        v->nodes[path[plen]].sub_hi = v->n_order;
        plen--;
    }
    v->nodes[0].sub_hi = v->n_order;
    v->n_nodes = nn;
    return v;
nomem:
    gvocab_free(v);
    tern_err(err, TERN_ENOMEM, "grammar: out of memory for a vocabulary of %d tokens", n);
    return NULL;
}

/* ============================================================================
 * Trie walks: token classes (local) and whole masks (full)
 * ========================================================================== */

/* A walk moves between stack sets; most walks visit few distinct ones (a
 * string's content loops on one), so sets are interned (state ids, by
 * content) and each (state, code point) transition is computed once per
 * walk and then looked up: the trie walk costs a hash probe per node. */
typedef struct {
    uint64_t key; /* state << 21 | code point */
    uint32_t val; /* next state */
    uint32_t gen; /* valid when it is the walk's generation */
} tslot_t;

typedef struct {
    const grammar_t *g;
    const gvocab_t *v;
    xp_t x;
    bool local;       /* class walk: an empty stack is an escape from p's rule */
    uint64_t *bits;   /* accepted ids */
    uint64_t *ubits;  /* uncertain ids (local walks) */
    size_t n_unc;
    bool failed;
    /* interned states of the current walk */
    sset_t *st;
    uint64_t *st_hash;
    uint32_t n_st, cap_st;
    uint32_t *itab; /* open addressing: state + 1, 0 empty */
    uint32_t itab_cap;
    tslot_t *tt;
    uint32_t tt_cap, tt_n, gen;
    uint32_t *asc;  /* per state, 128 entries: the ASCII transitions, UINT32_MAX unknown */
    uint32_t asc_cap; /* states it has room for */
    sset_t scratch;
} walk_t;

static uint64_t sset_hash(const sset_t *s) {
    uint64_t h = 0x51afd7ed558ccdull ^ s->n ^ ((uint64_t)s->done << 40);
    for (uint32_t i = 0; i < s->n; i++) {
        h ^= s->hash[i];
        h *= 0x9e3779b97f4a7c15ull;
        h ^= h >> 31;
    }
    return h;
}

static bool sset_equal(const sset_t *a, const sset_t *b) {
    if (a->n != b->n || a->done != b->done) return false;
    for (uint32_t i = 0; i < a->n; i++) {
        uint32_t la, lb;
        const uint32_t *x = sset_stack(a, i, &la), *y = sset_stack(b, i, &lb);
        if (la != lb || memcmp(x, y, la * sizeof *x)) return false;
    }
    return true;
}

/* Start a walk: forget the previous walk's states and transitions. */
static void walk_reset(walk_t *w) {
    w->n_st = 0;
    w->gen++;
    w->tt_n = 0;
    if (w->itab) memset(w->itab, 0, w->itab_cap * sizeof *w->itab);
}

/* The id of a state equal to s (copied in when new); UINT32_MAX: no memory. */
static uint32_t intern(walk_t *w, const sset_t *s) {
    if (s->failed) return UINT32_MAX;
    uint64_t h = sset_hash(s);
    if ((w->n_st + 1) * 2 > w->itab_cap) { /* grow and rehash */
        uint32_t nc = w->itab_cap ? w->itab_cap * 2 : 256;
        uint32_t *nt = calloc(nc, sizeof *nt);
        if (!nt) return UINT32_MAX;
        for (uint32_t k = 0; k < w->n_st; k++) {
            uint32_t q = (uint32_t)w->st_hash[k] & (nc - 1);
            while (nt[q]) q = (q + 1) & (nc - 1);
            nt[q] = k + 1;
        }
        free(w->itab);
        w->itab = nt;
        w->itab_cap = nc;
    }
    uint32_t q = (uint32_t)h & (w->itab_cap - 1);
    for (; w->itab[q]; q = (q + 1) & (w->itab_cap - 1)) {
        uint32_t k = w->itab[q] - 1;
        if (w->st_hash[k] == h && sset_equal(&w->st[k], s)) return k;
    }
    if (w->n_st == w->cap_st) {
        uint32_t nc = w->cap_st ? w->cap_st * 2 : 64;
        sset_t *ns = realloc(w->st, nc * sizeof *ns);
        if (!ns) return UINT32_MAX;
        memset(ns + w->cap_st, 0, (nc - w->cap_st) * sizeof *ns);
        w->st = ns;
        uint64_t *nh = realloc(w->st_hash, nc * sizeof *nh);
        if (!nh) return UINT32_MAX;
        w->st_hash = nh;
        w->cap_st = nc;
    }
    uint32_t k = w->n_st;
    if (sset_copy(&w->st[k], s)) return UINT32_MAX;
    if (k >= w->asc_cap && k < 4096) { /* ASCII tables for the first 4096 states */
        uint32_t nc = w->asc_cap ? w->asc_cap * 2 : 64;
        uint32_t *na = realloc(w->asc, (size_t)nc * 128 * sizeof *na);
        if (na) {
            w->asc = na;
            w->asc_cap = nc;
        }
    }
    if (k < w->asc_cap) memset(&w->asc[(size_t)k * 128], 0xFF, 128 * sizeof *w->asc);
    w->st_hash[k] = h;
    w->itab[q] = k + 1;
    w->n_st++;
    return k;
}

static uint32_t trans_slow(walk_t *w, uint32_t sid, uint32_t cp);

static inline uint32_t trans(walk_t *w, uint32_t sid, uint32_t cp) {
    if (cp < 128 && sid < w->asc_cap) {
        uint32_t *a = &w->asc[(size_t)sid * 128 + cp];
        if (*a == UINT32_MAX) *a = trans_slow(w, sid, cp);
        return *a;
    }
    return trans_slow(w, sid, cp);
}

static uint32_t trans_slow(walk_t *w, uint32_t sid, uint32_t cp) {
    const uint64_t key = (uint64_t)sid << 21 | cp;
    if ((w->tt_n + 1) * 2 > w->tt_cap) {
        uint32_t nc = w->tt_cap ? w->tt_cap * 2 : 1024;
        tslot_t *nt = calloc(nc, sizeof *nt);
        if (!nt) {
            w->failed = true;
            return UINT32_MAX;
        }
        for (uint32_t k = 0; k < w->tt_cap; k++) {
            if (w->tt[k].gen != w->gen) continue;
            uint32_t q = (uint32_t)((w->tt[k].key * 0x9e3779b97f4a7c15ull) >> 32) & (nc - 1);
            while (nt[q].gen == w->gen) q = (q + 1) & (nc - 1);
            nt[q] = w->tt[k];
        }
        free(w->tt);
        w->tt = nt;
        w->tt_cap = nc;
    }
    uint32_t q = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (w->tt_cap - 1);
    for (; w->tt[q].gen == w->gen; q = (q + 1) & (w->tt_cap - 1))
        if (w->tt[q].key == key) return w->tt[q].val;
    sset_clear(&w->scratch);
    sset_advance(&w->x, &w->st[sid], cp, &w->scratch);
    uint32_t nid = intern(w, &w->scratch);
    if (nid == UINT32_MAX) {
        w->failed = true;
        return UINT32_MAX;
    }
    w->tt[q] = (tslot_t){key, nid, w->gen};
    w->tt_n++;
    return nid;
}

static void add_unc(walk_t *w, uint32_t lo, uint32_t hi) {
    for (uint32_t k = lo; k < hi; k++) {
        uint32_t id = (uint32_t)w->v->order[k];
        w->ubits[id >> 6] |= 1ull << (id & 63);
    }
    w->n_unc += hi - lo;
}

static void walk(walk_t *w, uint32_t node, uint32_t sid, u8s_t u, bool esc_before) {
    const gvocab_t *v = w->v;
    for (uint32_t c = v->nodes[node].first; c && !w->failed; c = v->nodes[c].next) {
        const tnode_t *cn = &v->nodes[c];
        u8s_t u2 = u;
        uint32_t cp = 0;
        int r = u8_step(&u2, cn->byte, &cp);
        if (r < 0) continue; /* invalid UTF-8: every token below is rejected */
        uint32_t nid = sid;
        bool live, end_here = false;
        if (r == 1) {
            nid = trans(w, sid, cp);
            if (nid == UINT32_MAX) return;
            end_here = w->st[nid].done; /* local: escaped from p's rule; full: parse complete */
            live = w->st[nid].n > 0;
        } else {
            live = w->st[sid].n > 0 && partial_ok(w->g, &w->st[sid], u2);
        }
        bool esc = w->local && (esc_before || end_here);
        /* tokens ending at this node */
        if (cn->tok_hi > cn->tok_lo) {
            if (live || end_here) {
                for (uint32_t k = cn->tok_lo; k < cn->tok_hi; k++) {
                    uint32_t id = (uint32_t)v->order[k];
                    w->bits[id >> 6] |= 1ull << (id & 63);
                }
            } else if (w->local && esc_before) {
                add_unc(w, cn->tok_lo, cn->tok_hi);
            }
        }
        if (cn->sub_hi > cn->tok_hi) { /* longer tokens below */
            if (live)
                walk(w, c, nid, u2, esc);
            else if (esc)
                add_unc(w, cn->tok_hi, cn->sub_hi);
        }
    }
}

/* Walk the trie from state S with pending bytes u. */
static void walk_from(walk_t *w, const sset_t *S, u8s_t u) {
    walk_reset(w);
    uint32_t sid = intern(w, S);
    if (sid == UINT32_MAX) {
        w->failed = true;
        return;
    }
    walk(w, 0, sid, u, false);
}

static int walk_init(walk_t *w, const grammar_t *g, bool local) {
    memset(w, 0, sizeof *w);
    w->g = g;
    w->v = g->v;
    w->local = local;
    if (xp_init(&w->x, g)) return -1;
    return 0;
}
static void walk_free(walk_t *w) {
    for (uint32_t i = 0; i < w->cap_st; i++) sset_free(&w->st[i]);
    free(w->st);
    free(w->st_hash);
    free(w->itab);
    free(w->tt);
    free(w->asc);
    sset_free(&w->scratch);
    xp_free(&w->x);
}

/* What lies under a rule's frame. Rule X's frame sits on the return
 * address of the REF that entered it: e + 1 for a REF X at e that is not
 * the last of its alternative; for a tail REF (replacing the caller's
 * frame), whatever lies under the caller's frame. When every way into X
 * leaves the same element under it, that element is on every stack under
 * X's frame, and so on down: a CHAR element's class is computed from that
 * whole known suffix, so a token that leaves X's frame (the end of a rule
 * like char ::= [a-z] inside a string's char*) is still decided without
 * the real stack. BELOW_BOTTOM: the root's frame (nothing under it). */
#define BELOW_NONE 0xFFFFFFFFu
#define BELOW_MANY 0xFFFFFFFEu
#define BELOW_BOTTOM 0xFFFFFFFDu
#define BELOW_MAX 32

static void below_merge(uint32_t *slot, uint32_t v, bool *ch) {
    if (v == BELOW_NONE || *slot == v || *slot == BELOW_MANY) return;
    *slot = *slot == BELOW_NONE ? v : BELOW_MANY;
    *ch = true;
}

static int below_analysis(grammar_t *g) {
    g->rule_of = malloc((size_t)g->n_E * sizeof *g->rule_of);
    g->below = malloc((size_t)g->n_rules * sizeof *g->below);
    if (!g->rule_of || !g->below) return -1;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        g->below[r] = BELOW_NONE;
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            uint32_t e = g->alt_start[a];
            for (; g->E[e].kind != E_END; e++) g->rule_of[e] = r;
            g->rule_of[e] = r;
        }
    }
    g->below[g->root] = BELOW_BOTTOM;
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t y = 0; y < g->n_rules; y++)
            for (uint32_t a = g->alt_off[y]; a < g->alt_off[y + 1]; a++)
                for (uint32_t e = g->alt_start[a]; g->E[e].kind != E_END; e++) {
                    if (g->E[e].kind != E_REF) continue;
                    uint32_t x = g->E[e].arg;
                    below_merge(&g->below[x], g->E[e + 1].kind != E_END ? e + 1 : g->below[y], &ch);
                }
    }
    return 0;
}

/* The classes of the CHAR elements the shared cursor hands out, one
 * thread's share: each thread has its own walk and buffers, and writes
 * only the classes of the elements it took. */
typedef struct {
    grammar_t *g;
    _Atomic uint32_t next; /* next element to look at */
    _Atomic int failed;
} bind_job_t;

static int bind_one(walk_t *w, uint64_t *bits, grammar_t *g, uint32_t e) {
    const gvocab_t *v = g->v;
    const size_t nw = ((size_t)v->n_vocab + 63) / 64;
    tclass_t *tc = &g->cls[g->cls_of[e]];
    memset(bits, 0, 2 * nw * sizeof *bits);
    w->n_unc = 0;
    sset_t *S = &w->scratch;
    sset_clear(S);
    /* the stack suffix every stack with e on top has (see below_analysis) */
    uint32_t chain[BELOW_MAX + 1], n = 0, r = g->rule_of[e];
    bool bottom = false;
    chain[BELOW_MAX - n++] = e;
    while (n <= BELOW_MAX - 1) {
        uint32_t b = g->below[r];
        if (b == BELOW_BOTTOM) bottom = true;
        if (b >= BELOW_BOTTOM) break;
        chain[BELOW_MAX - n++] = b;
        r = g->rule_of[b];
    }
    sset_add(S, chain + BELOW_MAX + 1 - n, n);
    /* a suffix down to the stack's bottom: nothing lies below, so an
     * empty stack means the text is complete (no uncertain tokens) */
    w->local = !bottom;
    sset_t start = {0};
    if (sset_copy(&start, S)) {
        sset_free(&start);
        return -1;
    }
    walk_from(w, &start, (u8s_t){0, 0, 0});
    sset_free(&start);
    if (w->failed) return -1;
    uint32_t na = 0;
    for (size_t i = 0; i < nw; i++) na += (uint32_t)__builtin_popcountll(bits[i]);
    if ((size_t)na * 32 < (size_t)v->n_vocab) {
        tc->accept_ids = malloc((na ? na : 1) * sizeof *tc->accept_ids);
        if (!tc->accept_ids) return -1;
        uint32_t k = 0;
        for (size_t i = 0; i < nw; i++)
            for (uint64_t b = bits[i]; b; b &= b - 1) tc->accept_ids[k++] = (uint32_t)(i * 64 + (size_t)__builtin_ctzll(b));
    } else {
        tc->accept_bits = malloc(nw * sizeof *bits);
        if (!tc->accept_bits) return -1;
        memcpy(tc->accept_bits, bits, nw * sizeof *bits);
    }
    tc->n_accept = na;
    if (w->n_unc) {
        uint32_t nu = 0;
        for (size_t i = 0; i < nw; i++) nu += (uint32_t)__builtin_popcountll(w->ubits[i] & ~bits[i]);
        tc->uncertain = malloc((nu ? nu : 1) * sizeof *tc->uncertain);
        if (!tc->uncertain) return -1;
        uint32_t k = 0;
        for (size_t i = 0; i < nw; i++)
            for (uint64_t b = w->ubits[i] & ~bits[i]; b; b &= b - 1)
                tc->uncertain[k++] = (uint32_t)(i * 64 + (size_t)__builtin_ctzll(b));
        tc->n_uncertain = nu;
    }
    return 0;
}

static void *bind_worker(void *arg) {
    bind_job_t *job = arg;
    grammar_t *g = job->g;
    const size_t nw = ((size_t)g->v->n_vocab + 63) / 64;
    walk_t w;
    uint64_t *bits = calloc(2 * nw, sizeof *bits);
    if (!bits || walk_init(&w, g, true)) {
        if (bits) walk_free(&w);
        free(bits);
        job->failed = 1;
        return NULL;
    }
    w.bits = bits;
    w.ubits = bits + nw;
    for (;;) {
        uint32_t e = job->next++;
        if (e >= g->n_E || job->failed) break;
        if (g->E[e].kind == E_CHAR && bind_one(&w, bits, g, e)) {
            job->failed = 1;
            break;
        }
    }
    walk_free(&w);
    free(bits);
    return NULL;
}

int grammar_bind(grammar_t *g, const gvocab_t *v, tern_error_t *err) {
    uint64_t t0 = tern_now_ns();
    g->v = v;
    g->cls_of = malloc((size_t)g->n_E * sizeof *g->cls_of);
    uint32_t n_cls = 0;
    if (!g->cls_of) goto nomem;
    for (uint32_t e = 0; e < g->n_E; e++) g->cls_of[e] = g->E[e].kind == E_CHAR ? (int32_t)n_cls++ : -1;
    g->cls = calloc(n_cls ? n_cls : 1, sizeof *g->cls);
    if (!g->cls) goto nomem;
    g->n_cls = n_cls;
    if (below_analysis(g)) goto nomem;
    /* Classes are independent: big grammars take the machine's CPUs (up to
     * 8 threads; a small one stays on the caller). The result does not
     * depend on the thread count. */
    bind_job_t job = {g, 0, 0};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = n_cls >= 256 ? (int)(ncpu > 8 ? 8 : ncpu < 1 ? 1 : ncpu) : 1;
    pthread_t th[8];
    int started = 0;
    for (int i = 1; i < nt; i++)
        if (pthread_create(&th[started], NULL, bind_worker, &job) == 0) started++;
    bind_worker(&job);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (job.failed) goto nomem;
    g->bind_ms = (double)(tern_now_ns() - t0) / 1e6;
    return 0;
nomem:
    return tern_err(err, TERN_ENOMEM, "grammar: out of memory while indexing the vocabulary");
}

/* ============================================================================
 * The matcher
 * ========================================================================== */

typedef struct {
    uint64_t key;
    uint32_t *state; /* canonical state, for an exact compare */
    size_t state_len;
    uint64_t *bits;
} memo_t;

#define MEMO_MAX 512

struct gmatcher {
    const grammar_t *g;
    sset_t S;        /* the state */
    u8s_t u;         /* pending bytes of a code point */
    bool ended;      /* an end-of-generation token was accepted */
    sset_t A, B, C;  /* scratch */
    xp_t x;
    uint64_t *bits;  /* the last mask */
    size_t nw;
    memo_t memo[MEMO_MAX];
    uint32_t memo_n, memo_next;
    uint32_t *key;   /* scratch: canonical state */
    size_t key_cap;
    uint32_t *ord;   /* scratch: stack order */
    size_t ord_cap;
    walk_t *full;    /* for states with pending bytes */
    bool no_memo;
    gmatcher_stats_t st;
};

static void start_state(gmatcher_t *m) {
    sset_clear(&m->S);
    m->u = (u8s_t){0, 0, 0};
    m->ended = false;
    const grammar_t *g = m->g;
    /* expand "root": push each alternative */
    for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) {
        uint32_t st = g->alt_start[a];
        sset_expand_from(&m->x, &st, 1, &m->S);
    }
}

gmatcher_t *gmatcher_create(const grammar_t *g, tern_error_t *err) {
    if (!g || !g->v) {
        tern_err(err, TERN_EINVAL, "grammar: matcher of a grammar without a vocabulary");
        return NULL;
    }
    gmatcher_t *m = calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->g = g;
    m->nw = ((size_t)g->v->n_vocab + 63) / 64;
    m->bits = calloc(m->nw, sizeof *m->bits);
    if (!m->bits || xp_init(&m->x, g)) goto nomem;
    start_state(m);
    if (m->S.failed) goto nomem;
    return m;
nomem:
    gmatcher_free(m);
    tern_err(err, TERN_ENOMEM, "grammar: out of memory for a matcher");
    return NULL;
}

void gmatcher_free(gmatcher_t *m) {
    if (!m) return;
    sset_free(&m->S);
    sset_free(&m->A);
    sset_free(&m->B);
    sset_free(&m->C);
    xp_free(&m->x);
    free(m->bits);
    for (uint32_t i = 0; i < m->memo_n; i++) {
        free(m->memo[i].state);
        free(m->memo[i].bits);
    }
    free(m->key);
    free(m->ord);
    if (m->full) {
        walk_free(m->full);
        free(m->full);
    }
    free(m);
}

void gmatcher_reset(gmatcher_t *m) { start_state(m); }
const grammar_t *gmatcher_grammar(const gmatcher_t *m) { return m->g; }

int gmatcher_copy(gmatcher_t *dst, const gmatcher_t *src, tern_error_t *err) {
    if (!dst || !src || dst->g != src->g) return tern_err(err, TERN_EINVAL, "grammar: copy between different grammars");
    if (sset_copy(&dst->S, &src->S)) return tern_err(err, TERN_ENOMEM, "grammar: out of memory");
    dst->u = src->u;
    dst->ended = src->ended;
    return 0;
}

bool gmatcher_done(const gmatcher_t *m) { return !m->ended && m->S.done && m->u.rem == 0; }
bool gmatcher_finished(const gmatcher_t *m) { return m->ended || (m->S.n == 0); }

/* Run bytes from (S, u) into out (ping-pong through A/B). 0 ok (out holds
 * the new state, *uo its pending bytes), -1 rejected. */
static int run_bytes(gmatcher_t *m, const sset_t *S, u8s_t u, const uint8_t *s, size_t n, sset_t **out, u8s_t *uo) {
    const sset_t *cur = S;
    sset_t *nx = &m->A;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        int r = u8_step(&u, s[i], &cp);
        if (r < 0) return -1;
        if (r == 0) continue;
        sset_clear(nx);
        sset_advance(&m->x, cur, cp, nx);
        if (nx->n == 0 && !(nx->done && i + 1 == n)) return -1;
        cur = nx;
        nx = nx == &m->A ? &m->B : &m->A;
    }
    if (u.rem) {
        if (!partial_ok(m->g, cur, u)) return -1;
    } else if (cur->n == 0 && !cur->done) {
        return -1;
    }
    *out = (sset_t *)cur;
    *uo = u;
    return 0;
}

bool gmatcher_allows(gmatcher_t *m, int32_t id) {
    const gvocab_t *v = m->g->v;
    if (id < 0 || id >= v->n_vocab || m->ended) return false;
    if (v->kind[id] == TK_EOG) return gmatcher_done(m);
    if (v->kind[id] == TK_BANNED) return false;
    sset_t *o;
    u8s_t u;
    return run_bytes(m, &m->S, m->u, (const uint8_t *)v->piece[id], v->plen[id], &o, &u) == 0;
}

int gmatcher_accept_bytes(gmatcher_t *m, const char *s, size_t n, tern_error_t *err) {
    if (m->ended) return tern_err(err, TERN_EINVAL, "grammar: the text is already complete");
    sset_t *o;
    u8s_t u;
    if (run_bytes(m, &m->S, m->u, (const uint8_t *)s, n, &o, &u))
        return tern_err(err, TERN_EINVAL, "grammar: the text does not match here");
    if (n && o != &m->S) {
        sset_t t = m->S;
        m->S = *o;
        *o = t;
    }
    m->u = u;
    return 0;
}

int gmatcher_accept(gmatcher_t *m, int32_t id, tern_error_t *err) {
    const gvocab_t *v = m->g->v;
    if (id < 0 || id >= v->n_vocab) return tern_err(err, TERN_EINVAL, "grammar: token %d out of range", id);
    if (v->kind[id] == TK_EOG) {
        if (!gmatcher_done(m)) return tern_err(err, TERN_EINVAL, "grammar: end of generation before the grammar is complete");
        m->ended = true;
        return 0;
    }
    if (v->kind[id] == TK_BANNED)
        return tern_err(err, TERN_EINVAL, "grammar: token %d (a control token or empty) is never allowed", id);
    if (gmatcher_accept_bytes(m, v->piece[id], v->plen[id], NULL))
        return tern_err(err, TERN_EINVAL, "grammar: token %d is not allowed here", id);
    return 0;
}

/* ---- masks ------------------------------------------------------------------------ */

static int cmp_stack(const sset_t *S, uint32_t i, uint32_t j) {
    uint32_t li, lj;
    const uint32_t *x = sset_stack(S, i, &li), *y = sset_stack(S, j, &lj);
    if (li != lj) return li < lj ? -1 : 1;
    return memcmp(x, y, li * sizeof *x);
}

/* The canonical state (stacks sorted) into m->key; returns its length. */
static size_t canon(gmatcher_t *m) {
    const sset_t *S = &m->S;
    size_t need = 4 + S->used;
    if (need > m->key_cap) {
        uint32_t *nk = realloc(m->key, need * sizeof *nk);
        if (!nk) return 0;
        m->key = nk;
        m->key_cap = need;
    }
    if (S->n > m->ord_cap) {
        uint32_t *no = realloc(m->ord, S->n * sizeof *no);
        if (!no) return 0;
        m->ord = no;
        m->ord_cap = S->n;
    }
    for (uint32_t i = 0; i < S->n; i++) m->ord[i] = i;
    for (uint32_t i = 1; i < S->n; i++) { /* insertion sort: sets are small */
        uint32_t x = m->ord[i], j = i;
        while (j > 0 && cmp_stack(S, m->ord[j - 1], x) > 0) {
            m->ord[j] = m->ord[j - 1];
            j--;
        }
        m->ord[j] = x;
    }
    size_t k = 0;
    m->key[k++] = m->u.val;
    m->key[k++] = m->u.rem | m->u.lead << 8;
    m->key[k++] = S->done | (m->ended ? 2u : 0u);
    m->key[k++] = S->n;
    for (uint32_t i = 0; i < S->n; i++) {
        uint32_t l;
        const uint32_t *st = sset_stack(S, m->ord[i], &l);
        m->key[k++] = l;
        memcpy(m->key + k, st, l * sizeof *st);
        k += l;
    }
    return k;
}

static void set_eog(gmatcher_t *m, uint64_t *bits) {
    if (!gmatcher_done(m)) return;
    const gvocab_t *v = m->g->v;
    for (uint32_t i = 0; i < v->n_eog; i++) bits[v->eog[i] >> 6] |= 1ull << (v->eog[i] & 63);
}

/* Whether token id is accepted from the single stack st. */
static bool stack_accepts(gmatcher_t *m, const uint32_t *st, uint32_t len, int32_t id) {
    const gvocab_t *v = m->g->v;
    sset_clear(&m->C);
    sset_add(&m->C, st, len);
    sset_t *o;
    u8s_t u;
    return run_bytes(m, &m->C, (u8s_t){0, 0, 0}, (const uint8_t *)v->piece[id], v->plen[id], &o, &u) == 0;
}

static void mask_compute(gmatcher_t *m, uint64_t *bits) {
    const grammar_t *g = m->g;
    memset(bits, 0, m->nw * sizeof *bits);
    if (m->ended) return;
    if (m->u.rem) { /* half a code point pending: one walk from the real stacks */
        if (!m->full) {
            m->full = calloc(1, sizeof *m->full);
            if (!m->full || walk_init(m->full, g, false)) {
                if (m->full) walk_free(m->full);
                free(m->full);
                m->full = NULL;
                return;
            }
        }
        m->full->bits = bits;
        m->st.full_walks++;
        walk_from(m->full, &m->S, m->u);
        return;
    }
    for (uint32_t i = 0; i < m->S.n; i++) {
        uint32_t len;
        const uint32_t *st = sset_stack(&m->S, i, &len);
        const tclass_t *tc = &g->cls[g->cls_of[st[len - 1]]];
        if (tc->accept_bits) {
            for (size_t w = 0; w < m->nw; w++) bits[w] |= tc->accept_bits[w];
        } else {
            for (uint32_t k = 0; k < tc->n_accept; k++) bits[tc->accept_ids[k] >> 6] |= 1ull << (tc->accept_ids[k] & 63);
        }
    }
    for (uint32_t i = 0; i < m->S.n; i++) {
        uint32_t len;
        const uint32_t *st0 = sset_stack(&m->S, i, &len);
        const tclass_t *tc = &g->cls[g->cls_of[st0[len - 1]]];
        for (uint32_t k = 0; k < tc->n_uncertain; k++) {
            uint32_t id = tc->uncertain[k];
            if (bits[id >> 6] >> (id & 63) & 1) continue;
            m->st.uncertain_checked++;
            const uint32_t *st = sset_stack(&m->S, i, &len); /* S is not touched by checks */
            if (stack_accepts(m, st, len, (int32_t)id)) bits[id >> 6] |= 1ull << (id & 63);
        }
    }
    set_eog(m, bits);
}

void gmatcher_set_memo(gmatcher_t *m, bool on) { m->no_memo = !on; }

const uint64_t *gmatcher_mask(gmatcher_t *m) {
    m->st.masks++;
    if (m->no_memo) {
        mask_compute(m, m->bits);
        return m->bits;
    }
    size_t kl = canon(m);
    if (!kl) return NULL;
    uint64_t h = hash_stack(m->key, (uint32_t)kl);
    for (uint32_t i = 0; i < m->memo_n; i++) {
        memo_t *e = &m->memo[i];
        if (e->key == h && e->state_len == kl && memcmp(e->state, m->key, kl * sizeof *m->key) == 0) {
            m->st.memo_hits++;
            return e->bits;
        }
    }
    /* compute into a memo slot (oldest replaced) */
    memo_t *e;
    if (m->memo_n < MEMO_MAX) {
        e = &m->memo[m->memo_n];
        e->bits = malloc(m->nw * sizeof *e->bits);
        e->state = NULL;
        if (!e->bits) {
            mask_compute(m, m->bits);
            return m->bits;
        }
        m->memo_n++;
    } else {
        e = &m->memo[m->memo_next];
        m->memo_next = (m->memo_next + 1) % MEMO_MAX;
    }
    uint32_t *ns = realloc(e->state, kl * sizeof *ns);
    if (!ns) {
        e->key = 0;
        e->state_len = 0;
        mask_compute(m, m->bits);
        return m->bits;
    }
    e->state = ns;
    memcpy(e->state, m->key, kl * sizeof *ns);
    e->state_len = kl;
    e->key = h;
    mask_compute(m, e->bits);
    return e->bits;
}

size_t gmatcher_forced(gmatcher_t *m, char *buf, size_t cap) {
    /* m's state is copied first; only its scratch sets change */
    if (m->ended || m->u.rem) return 0;
    sset_t cur = {0}, nx = {0};
    if (sset_copy(&cur, &m->S)) {
        sset_free(&cur);
        return 0;
    }
    size_t n = 0;
    while (!cur.done && cur.n > 0) {
        /* one code point every stack's top admits, and nothing else */
        uint32_t cp = 0;
        bool one = true;
        for (uint32_t i = 0; i < cur.n && one; i++) {
            uint32_t len;
            const uint32_t *st = sset_stack(&cur, i, &len);
            const elem_t *e = &m->g->E[st[len - 1]];
            const crange_t *r = m->g->R + e->arg;
            if (e->neg || e->n != 1 || r->lo != r->hi || (i && r->lo != cp))
                one = false;
            else
                cp = r->lo;
        }
        if (!one) break;
        char enc[4];
        size_t el = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (n + el > cap) break;
        if (el == 1) {
            enc[0] = (char)cp;
        } else if (el == 2) {
            enc[0] = (char)(0xC0 | (cp >> 6));
            enc[1] = (char)(0x80 | (cp & 0x3F));
        } else if (el == 3) {
            enc[0] = (char)(0xE0 | (cp >> 12));
            enc[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            enc[2] = (char)(0x80 | (cp & 0x3F));
        } else {
            enc[0] = (char)(0xF0 | (cp >> 18));
            enc[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            enc[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
            enc[3] = (char)(0x80 | (cp & 0x3F));
        }
        memcpy(buf + n, enc, el);
        n += el;
        sset_clear(&nx);
        sset_advance(&m->x, &cur, cp, &nx);
        sset_t t = cur;
        cur = nx;
        nx = t;
    }
    sset_free(&cur);
    sset_free(&nx);
    return n;
}

void gmatcher_stats(const gmatcher_t *m, gmatcher_stats_t *st) { *st = m->st; }
