/*
 * cmd_grammar.c - `tern bench grammar`: the time a grammar costs per token
 * on large vocabularies.
 *
 * For each vocabulary (a GGUF file with a tokenizer: a vocab-only file is
 * enough) and each grammar (any JSON object, the grammar of tern's JSON
 * schema converter, and a schema-derived grammar), seeded random documents
 * of the grammar's language are tokenized with the vocabulary's own
 * tokenizer and replayed token by token through a fresh matcher per
 * document. At every token it times:
 *   mask      the whole allowed set, as the sampler's MASK stage builds it
 *             when it needs one (token classes + the memo of states; the
 *             memo starts empty with every document),
 *   uncached  the same with the memo off (every state computed afresh),
 *   check     asking about one token (the sampler's shortcut when the token
 *             it would pick is allowed: the usual case with a real model).
 * and checks that the document's next token is in the mask (a document of
 * the language must be accepted whatever its tokenization). It prints a
 * table: per-token median, p90, p99 and max, the grammar's compile time
 * and the memo's hit rate.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"

#ifdef TERN_HAVE_SERVER /* the schema converter needs the server's cJSON */
#include "core/common.h"
#include "format/gguf.h"
#include "json_schema.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

/* ---- documents ------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
} sbuf_t;

static void put(sbuf_t *b, const char *s) {
    size_t l = strlen(s);
    if (b->n + l + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        while (nc < b->n + l + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            fprintf(stderr, "tern bench grammar: out of memory\n");
            exit(1);
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, l + 1);
    b->n += l;
}

static uint64_t rnd(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int pick(uint64_t *s, int n) { return (int)(rnd(s) % (uint64_t)n); }

static const char *WORDS[] = {"alpha",  "river",   "Tokyo",    "lantern", "quick",  "brown",   "fox",
                              "jumps",  "over",    "the",      "lazy",    "dog",    "north",   "caf\xc3\xa9",
                              "na\xc3\xafve", "\xe6\x9d\xb1\xe4\xba\xac", "data", "value", "id", "user_name",
                              "2024",   "version", "enabled",  "Z\xc3\xbcrich", "hello", "world", "item", "price"};
#define NWORDS ((int)(sizeof WORDS / sizeof WORDS[0]))

static void gen_string(sbuf_t *b, uint64_t *s, int max_words) {
    put(b, "\"");
    int n = 1 + pick(s, max_words);
    for (int i = 0; i < n; i++) {
        if (i) put(b, pick(s, 8) ? " " : "-");
        put(b, WORDS[pick(s, NWORDS)]);
    }
    if (!pick(s, 12)) put(b, pick(s, 2) ? "\\n" : "\\\"ok\\\"");
    put(b, "\"");
}

static void gen_value(sbuf_t *b, uint64_t *s, int depth);

static void gen_object(sbuf_t *b, uint64_t *s, int depth) {
    put(b, "{");
    int n = 1 + pick(s, 5);
    for (int i = 0; i < n; i++) {
        if (i) put(b, ", ");
        put(b, "\"");
        put(b, WORDS[pick(s, NWORDS)]);
        put(b, "\": ");
        gen_value(b, s, depth + 1);
    }
    put(b, "}");
}

static void gen_value(sbuf_t *b, uint64_t *s, int depth) {
    char num[64];
    int k = pick(s, depth >= 3 ? 5 : 7);
    switch (k) {
    case 0: gen_string(b, s, 6); break;
    case 1:
        snprintf(num, sizeof num, "%d", (int)(rnd(s) % 200000) - 100000);
        put(b, num);
        break;
    case 2:
        snprintf(num, sizeof num, "%d.%03d", pick(s, 1000), pick(s, 1000));
        put(b, num);
        break;
    case 3: put(b, pick(s, 2) ? "true" : "false"); break;
    case 4: put(b, "null"); break;
    case 5: gen_object(b, s, depth); break;
    default: {
        put(b, "[");
        int n = 1 + pick(s, 4);
        for (int i = 0; i < n; i++) {
            if (i) put(b, ", ");
            gen_value(b, s, depth + 1);
        }
        put(b, "]");
    }
    }
}

/* A person record, in the order of SCHEMA's properties. */
static const char *SCHEMA =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 60},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150},"
    "\"email\": {\"type\": \"string\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 5},"
    "\"address\": {\"type\": \"object\", \"properties\": {"
    "\"street\": {\"type\": \"string\"}, \"city\": {\"type\": \"string\"},"
    "\"zip\": {\"type\": \"string\", \"minLength\": 5, \"maxLength\": 5}},"
    "\"required\": [\"street\", \"city\"]},"
    "\"active\": {\"type\": \"boolean\"},"
    "\"role\": {\"enum\": [\"admin\", \"user\", \"guest\"]},"
    "\"score\": {\"type\": \"number\"}},"
    "\"required\": [\"name\", \"age\", \"active\"]}";

static void gen_person(sbuf_t *b, uint64_t *s) {
    char num[64];
    put(b, "{\"name\": ");
    gen_string(b, s, 4);
    snprintf(num, sizeof num, ", \"age\": %d", pick(s, 151));
    put(b, num);
    if (pick(s, 2)) {
        put(b, ", \"email\": \"");
        put(b, WORDS[pick(s, NWORDS)]);
        put(b, "@example.org\"");
    }
    if (pick(s, 2)) {
        put(b, ", \"tags\": [");
        int n = pick(s, 6);
        for (int i = 0; i < n; i++) {
            if (i) put(b, ", ");
            gen_string(b, s, 2);
        }
        put(b, "]");
    }
    if (pick(s, 2)) {
        put(b, ", \"address\": {\"street\": ");
        gen_string(b, s, 3);
        put(b, ", \"city\": ");
        gen_string(b, s, 1);
        if (pick(s, 2)) {
            snprintf(num, sizeof num, ", \"zip\": \"%05d\"", pick(s, 100000));
            put(b, num);
        }
        put(b, "}");
    }
    put(b, pick(s, 2) ? ", \"active\": true" : ", \"active\": false");
    if (pick(s, 2)) {
        static const char *roles[] = {"admin", "user", "guest"};
        put(b, ", \"role\": \"");
        put(b, roles[pick(s, 3)]);
        put(b, "\"");
    }
    if (pick(s, 2)) {
        snprintf(num, sizeof num, ", \"score\": %d.%d", pick(s, 100), pick(s, 10));
        put(b, num);
    }
    put(b, "}");
}

/* ---- timing ---------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double pct(double *v, size_t n, double p) {
    if (!n) return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

typedef struct {
    double *v;
    size_t n, cap;
} dvec_t;
static void dpush(dvec_t *d, double x) {
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4096;
        d->v = realloc(d->v, d->cap * sizeof *d->v);
        if (!d->v) exit(1);
    }
    d->v[d->n++] = x;
}

static void usage(FILE *out) {
    fprintf(out, "usage: tern bench grammar [--vocab FILE[,FILE...]] [--docs N] [--seed S]\n"
                 "  --vocab   GGUF files with a tokenizer (default: the 128k llama-bpe and 152k qwen2\n"
                 "            vocabularies of ../shared/reference/vocab, or $TERN_SHARED/reference/vocab)\n"
                 "  --docs    documents per grammar (default 20)\n"
                 "  --seed    seed of the documents (default 1)\n");
}

int cmd_bench_grammar(int argc, char **argv) {
    char vocabs[4096] = "";
    int docs = 20;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--vocab") && v) {
            snprintf(vocabs, sizeof vocabs, "%s", v);
            i++;
        } else if (!strcmp(a, "--docs") && v) {
            docs = atoi(v);
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            seed = strtoull(v, NULL, 0);
            i++;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (docs < 1 || docs > 100000) {
        fprintf(stderr, "tern bench grammar: --docs wants 1..100000\n");
        return 2;
    }
    if (!vocabs[0]) {
        const char *sh = getenv("TERN_SHARED");
        if (!sh) sh = "../shared";
        snprintf(vocabs, sizeof vocabs, "%s/reference/vocab/ggml-vocab-llama-bpe.gguf,%s/reference/vocab/ggml-vocab-qwen2.gguf",
                 sh, sh);
    }
    char *schema_gbnf = NULL;
    tern_error_t err = {0};
    if (tern_json_schema_to_gbnf(SCHEMA, strlen(SCHEMA), &schema_gbnf, &err)) {
        fprintf(stderr, "tern bench grammar: the schema: %s\n", err.msg);
        return 1;
    }
    const struct {
        const char *name, *gbnf;
        int person;
    } grammars[] = {{"json_object", tern_json_object_gbnf(), 0}, {"schema", schema_gbnf, 1}};

    printf("tern bench grammar: %d documents per grammar, seed %llu; times per token in microseconds\n", docs,
           (unsigned long long)seed);
    printf("| vocab | n_vocab | grammar | compile ms | tokens | mask p50 | p90 | p99 | max | uncached p50 | p99 | "
           "check p50 | p99 | memo hits |\n");
    printf("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    char *save = NULL;
    for (char *path = strtok_r(vocabs, ",", &save); path; path = strtok_r(NULL, ",", &save)) {
        gguf_file_t *f = gguf_open(path, &err);
        if (!f) {
            fprintf(stderr, "tern bench grammar: %s\n", err.msg);
            rc = 1;
            continue;
        }
        tokenizer_t *t = tok_load(f, &err);
        gguf_close(f);
        if (!t) {
            fprintf(stderr, "tern bench grammar: %s: %s\n", path, err.msg);
            rc = 1;
            continue;
        }
        gvocab_t *v = gvocab_build(t, &err);
        if (!v) {
            fprintf(stderr, "tern bench grammar: %s\n", err.msg);
            tok_free(t);
            rc = 1;
            continue;
        }
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        for (size_t gi = 0; gi < sizeof grammars / sizeof grammars[0]; gi++) {
            grammar_t *g = grammar_parse(grammars[gi].gbnf, strlen(grammars[gi].gbnf), NULL, &err);
            if (!g || grammar_bind(g, v, &err)) {
                fprintf(stderr, "tern bench grammar: %s: %s\n", grammars[gi].name, err.msg);
                grammar_free(g);
                rc = 1;
                continue;
            }
            dvec_t mk = {0}, cold = {0}, chk = {0};
            uint64_t rs = seed * 7919 + gi, hits = 0, masks = 0;
            for (int d = 0; d < docs && !rc; d++) {
                sbuf_t b = {0};
                if (grammars[gi].person)
                    gen_person(&b, &rs);
                else
                    gen_object(&b, &rs, 0);
                int32_t *ids = NULL;
                size_t n = 0;
                if (tok_encode(t, b.p, b.n, false, false, &ids, &n, &err)) {
                    fprintf(stderr, "tern bench grammar: tokenize: %s\n", err.msg);
                    rc = 1;
                    free(b.p);
                    break;
                }
                gmatcher_t *m = gmatcher_create(g, &err), *mc = gmatcher_create(g, &err);
                if (!m || !mc) {
                    fprintf(stderr, "tern bench grammar: %s\n", err.msg);
                    rc = 1;
                }
                if (mc) gmatcher_set_memo(mc, false);
                for (size_t k = 0; k < n && !rc; k++) {
                    uint64_t t0 = tern_now_ns();
                    const uint64_t *bits = gmatcher_mask(m);
                    uint64_t t1 = tern_now_ns();
                    (void)gmatcher_mask(mc);
                    uint64_t t2 = tern_now_ns();
                    bool ok = gmatcher_allows(m, ids[k]);
                    uint64_t t3 = tern_now_ns();
                    dpush(&mk, (double)(t1 - t0) / 1e3);
                    dpush(&cold, (double)(t2 - t1) / 1e3);
                    dpush(&chk, (double)(t3 - t2) / 1e3);
                    if (!bits || !ok || !(bits[ids[k] >> 6] >> (ids[k] & 63) & 1) || gmatcher_accept(m, ids[k], &err) ||
                        gmatcher_accept(mc, ids[k], &err)) {
                        fprintf(stderr, "tern bench grammar: %s/%s: document %d token %zu (id %d) refused: %.*s\n",
                                base, grammars[gi].name, d, k, ids[k], (int)b.n, b.p);
                        rc = 1;
                    }
                }
                if (!rc && !gmatcher_done(m)) {
                    fprintf(stderr, "tern bench grammar: %s/%s: document %d incomplete: %.*s\n", base,
                            grammars[gi].name, d, (int)b.n, b.p);
                    rc = 1;
                }
                if (m) {
                    gmatcher_stats_t st;
                    gmatcher_stats(m, &st);
                    hits += st.memo_hits;
                    masks += st.masks;
                }
                gmatcher_free(m);
                gmatcher_free(mc);
                free(ids);
                free(b.p);
            }
            if (!rc) {
                qsort(mk.v, mk.n, sizeof *mk.v, cmp_d);
                qsort(cold.v, cold.n, sizeof *cold.v, cmp_d);
                qsort(chk.v, chk.n, sizeof *chk.v, cmp_d);
                printf("| %s | %d | %s | %.1f | %zu | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.2f | %.2f | %.0f%% |\n",
                       base, gvocab_n_vocab(v), grammars[gi].name, grammar_bind_ms(g), mk.n, pct(mk.v, mk.n, 0.5),
                       pct(mk.v, mk.n, 0.9), pct(mk.v, mk.n, 0.99), mk.v[mk.n - 1], pct(cold.v, cold.n, 0.5),
                       pct(cold.v, cold.n, 0.99), pct(chk.v, chk.n, 0.5), pct(chk.v, chk.n, 0.99),
                       masks ? 100.0 * (double)hits / (double)masks : 0.0);
                fflush(stdout);
            }
            free(mk.v);
            free(cold.v);
            free(chk.v);
            grammar_free(g);
        }
        gvocab_free(v);
        tok_free(t);
    }
    free(schema_gbnf);
    return rc;
}
#endif
