/*
 * test_tokenizer.c - the tokenizers against the truth they must reproduce:
 * the reference token ids in ../shared/reference/vocab (produced by each
 * model's own tokenizer), the stories260K prompt, hand-derived ids on small
 * synthetic vocabularies, round trips, streaming decode of arbitrary ids, and
 * the chat templates of each family.
 */
#define _GNU_SOURCE /* memmem */
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "core/common.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

#define SEP "\n__ggml_vocab_test__\n"

static tokenizer_t *load_tok(const char *path) {
    tern_error_t err = {0};
    gguf_file_t *f = gguf_open(path, &err);
    if (!f) {
        print_error("gguf_open(%s): %s\n", path, err.msg);
        return NULL;
    }
    tokenizer_t *t = tok_load(f, &err);
    if (!t) print_error("tok_load(%s): %s\n", path, err.msg);
    gguf_close(f);
    return t;
}

static bool utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!need || i + need > n) return false;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (need > 1 && (u[i + 1] < lo || u[i + 1] > hi)) return false;
        for (size_t k = 2; k < need; k++)
            if ((u[i + k] & 0xC0) != 0x80) return false;
        i += need;
    }
    return true;
}

/* Decode through the streaming API with a given output buffer size. */
static char *stream_decode(const tokenizer_t *t, const int32_t *ids, size_t n, size_t *len) {
    size_t cap = 64, k = 0;
    char *out = malloc(cap);
    tok_stream_t s;
    tok_stream_init(&s, t);
    char buf[4096];
    for (size_t i = 0; i <= n; i++) {
        int w = i < n ? tok_stream_push(&s, ids[i], buf, sizeof buf) : tok_stream_flush(&s, buf, sizeof buf);
        assert_true(w >= 0);
        if (k + (size_t)w + 1 > cap) {
            while (k + (size_t)w + 1 > cap) cap *= 2;
            out = realloc(out, cap);
        }
        memcpy(out + k, buf, (size_t)w);
        k += (size_t)w;
    }
    out[k] = 0;
    *len = k;
    return out;
}

static bool has_special(const tokenizer_t *t, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int ty = tok_token_type(t, ids[i]);
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN || tok_is_control(t, ids[i]))
            return true;
    }
    return false;
}

/* Whether decode(encode(text)) must give text back: every byte has a token;
 * no control token came out (they render as nothing); for SPM no special
 * token was cut out of the text (the dummy space that follows one is not in
 * the text) and the text holds no U+2581 (it decodes to a space). */
static bool round_trip_expected(const tokenizer_t *t, const char *s, size_t n, const int32_t *ids, size_t n_ids) {
    if (!tok_can_represent(t, s, n)) return false;
    bool spm = !strcmp(tok_model_name(t), "llama");
    for (size_t i = 0; i < n_ids; i++)
        if (tok_is_control(t, ids[i]) || (spm && has_special(t, ids + i, 1))) return false;
    if (spm && memmem(s, n, "\xe2\x96\x81", 3)) return false;
    return true;
}

static void print_ids(const char *what, const int32_t *v, size_t n) {
    print_message("    %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) print_message(" %d", (int)v[i]);
    print_message("%s\n", n > 40 ? " ..." : "");
}

/* Every vector of every vocab present: exact ids, and the round trip. */
static void test_vocab_vectors(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(dir, "reference/vocab");
    char pat[4200];
    snprintf(pat, sizeof pat, "%s/ggml-vocab-*.gguf.inp", dir);
    glob_t g;
    assert_int_equal(glob(pat, 0, NULL, &g), 0);
    int total_fail = 0, n_vocabs = 0;
    for (size_t gi = 0; gi < g.gl_pathc; gi++) {
        char gguf_path[4200], out_path[4300];
        size_t pl = strlen(g.gl_pathv[gi]);
        snprintf(gguf_path, sizeof gguf_path, "%.*s", (int)(pl - 4), g.gl_pathv[gi]);
        snprintf(out_path, sizeof out_path, "%s.out", gguf_path);
        const char *name = strrchr(gguf_path, '/') + 1;
        size_t inp_len, out_len;
        char *inp = tu_read_file(g.gl_pathv[gi], &inp_len);
        char *outs = tu_read_file(out_path, &out_len);
        assert_non_null(inp);
        assert_non_null(outs);
        tokenizer_t *t = load_tok(gguf_path);
        assert_non_null(t);
        n_vocabs++;
        int n = 0, pass = 0, rt = 0;
        char *p = inp, *o = outs;
        for (char *sep; (sep = strstr(p, SEP)); p = sep + strlen(SEP), n++) {
            size_t len = (size_t)(sep - p);
            char *eol = strchr(o, '\n');
            assert_non_null(eol);
            *eol = 0;
            int32_t want[1024];
            size_t nw = 0;
            for (char *q = o, *end; *q; q = end) {
                long v = strtol(q, &end, 10);
                if (end == q) break;
                assert_true(nw < 1024);
                want[nw++] = (int32_t)v;
            }
            o = eol + 1;
            int32_t *ids;
            size_t n_ids;
            tern_error_t err = {0};
            assert_int_equal(tok_encode(t, p, len, false, false, &ids, &n_ids, &err), 0);
            if (n_ids == nw && memcmp(ids, want, nw * sizeof *ids) == 0) {
                pass++;
            } else {
                print_message("  %s: string %d '%.*s'\n", name, n, (int)(len > 60 ? 60 : len), p);
                print_ids("want", want, nw);
                print_ids("got ", ids, n_ids);
            }
            if (round_trip_expected(t, p, len, ids, n_ids)) {
                char *dec;
                size_t dl;
                assert_int_equal(tok_decode(t, ids, n_ids, false, &dec, &dl, &err), 0);
                if (dl != len || memcmp(dec, p, len) != 0) {
                    print_message("  %s: string %d does not round-trip: '%s'\n", name, n, dec);
                    total_fail++;
                }
                free(dec);
                char *sd = stream_decode(t, ids, n_ids, &dl);
                assert_true(utf8_valid(sd, dl));
                if (utf8_valid(p, len) && (dl != len || memcmp(sd, p, len) != 0)) {
                    print_message("  %s: string %d stream decode differs: '%s'\n", name, n, sd);
                    total_fail++;
                }
                free(sd);
                rt++;
            }
            free(ids);
        }
        print_message("%-34s %2d/%2d vectors exact, %2d round trips checked\n", name, pass, n, rt);
        assert_true(n > 0);
        total_fail += n - pass;
        tok_free(t);
        free(inp);
        free(outs);
    }
    globfree(&g);
    assert_true(n_vocabs > 0);
    assert_int_equal(total_fail, 0);
}

/* llama2.c's tokenizer on its own model: the ids from the reference
 * implementation (run.c) for this prompt, BOS first. */
static void test_stories260k(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "models/stories260K.gguf");
    tokenizer_t *t = load_tok(path);
    assert_non_null(t);
    assert_true(tok_add_bos(t));
    int32_t *ids;
    size_t n;
    tern_error_t err;
    const char *s = "Once upon a time";
    assert_int_equal(tok_encode(t, s, strlen(s), true, false, &ids, &n, &err), 0);
    const int32_t want[] = {1, 403, 407, 261, 378};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    char *dec;
    size_t dl;
    assert_int_equal(tok_decode(t, ids, n, false, &dec, &dl, &err), 0);
    assert_string_equal(dec, s);
    free(dec);
    free(ids);
    tok_free(t);
}

/* 1 MB of mixed text (the vector strings repeated) through a few vocabs.
 * Prints the time; asserts only that the ids decode back to the text. */
static void test_speed_1mb(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(inp_path, "reference/vocab/ggml-vocab-gpt-2.gguf.inp");
    size_t il;
    char *inp = tu_read_file(inp_path, &il);
    assert_non_null(inp);
    size_t want = tu_quick() ? 100000 : 1000000, n = 0;
    char *text = malloc(want + il);
    while (n < want) {
        /* the separator lines become ordinary text lines */
        memcpy(text + n, inp, il);
        n += il;
    }
    const char *names[] = {"llama-spm", "qwen2"}; /* SPM; BPE with the largest merge table here */
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        char rel[128];
        snprintf(rel, sizeof rel, "reference/vocab/ggml-vocab-%s.gguf", names[v]);
        const char *path = tu_shared(rel);
        if (!path) {
            tu_shared_missing(rel, "part");
            continue;
        }
        tokenizer_t *t = load_tok(path);
        assert_non_null(t);
        int32_t *ids;
        size_t n_ids;
        tern_error_t err;
        uint64_t t0 = tern_now_ns();
        assert_int_equal(tok_encode(t, text, n, false, false, &ids, &n_ids, &err), 0);
        double ms = (double)(tern_now_ns() - t0) / 1e6;
        print_message("encode %zu bytes with %-13s %8zu tokens in %7.1f ms (%.1f MB/s)\n", n, names[v], n_ids, ms,
                      (double)n / 1e3 / ms);
        char *dec;
        size_t dl;
        assert_int_equal(tok_decode(t, ids, n_ids, false, &dec, &dl, &err), 0);
        assert_int_equal(dl, n);
        assert_memory_equal(dec, text, n);
        free(dec);
        free(ids);
        tok_free(t);
    }
    free(text);
    free(inp);
}

/* ---- SmolLM2 (no upstream vectors) ----------------------------------------
 * The expected ids below were derived outside tern: an independent Python
 * script applied the smollm pre-tokenizer (every \p{N} isolated, then the
 * GPT-2 regex, with the `regex` module) and GPT-2's textbook bpe() loop
 * (merge the lowest-ranked adjacent pair everywhere, repeat) over this file's
 * tokenizer.ggml.merges, and looked the results up in tokenizer.ggml.tokens.
 * The token texts are checked here too, so an id that names a different
 * token fails loudly. */
static void test_smollm(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "reference/vocab/ggml-vocab-smollm.gguf");
    tokenizer_t *t = load_tok(path);
    assert_non_null(t);
    assert_string_equal(tok_pre_name(t), "smollm");
    assert_false(tok_add_bos(t)); /* add_bos_token = false in the file */
    static const struct {
        const char *text;
        int32_t ids[12];
        const char *pieces[12]; /* raw token texts, byte-level form */
        int n;
    } cases[] = {
        {"Hello world", {19556, 905}, {"Hello", "\xc4\xa0world"}, 2},
        {"The quick brown fox jumps over the lazy dog.",
         {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30},
         {"The", "\xc4\xa0quick", "\xc4\xa0" "brown", "\xc4\xa0" "fox", "\xc4\xa0jumps", "\xc4\xa0over", "\xc4\xa0the",
          "\xc4\xa0lazy", "\xc4\xa0" "dog", "."},
         10},
        /* digits are isolated before the GPT-2 regex runs, so the space in
         * front of 2024 is left alone as its own piece */
        {"I'm 2024 years old", {57, 5248, 216, 34, 32, 34, 36, 929, 1573},
         {"I", "'m", "\xc4\xa0", "2", "0", "2", "4", "\xc4\xa0years", "\xc4\xa0old"}, 9},
        {"  indented\n\tcode()", {216, 641, 6574, 198, 197, 4635, 1000},
         {"\xc4\xa0", "\xc4\xa0ind", "ented", "\xc4\x8a", "\xc4\x89", "code", "()"}, 7},
        {"na\xc3\xafve caf\xc3\xa9", {3546, 46494, 37366}, {"na", "\xc3\x83\xc2\xafve", "\xc4\xa0" "caf\xc3\x83\xc2\xa9"}, 3},
        /* control tokens are plain text without parse_special */
        {"<|im_start|>", {44, 108, 306, 79, 3738, 108, 46}, {"<", "|", "im", "_", "start", "|", ">"}, 7},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t *ids;
        size_t n;
        tern_error_t err;
        assert_int_equal(tok_encode(t, cases[c].text, strlen(cases[c].text), false, false, &ids, &n, &err), 0);
        if ((int)n != cases[c].n || memcmp(ids, cases[c].ids, n * sizeof *ids)) {
            print_message("smollm: '%s'\n", cases[c].text);
            print_ids("want", cases[c].ids, (size_t)cases[c].n);
            print_ids("got ", ids, n);
            fail();
        }
        for (int i = 0; i < cases[c].n; i++) {
            size_t l;
            const char *tx = tok_token_text(t, cases[c].ids[i], &l);
            assert_int_equal(l, strlen(cases[c].pieces[i]));
            assert_memory_equal(tx, cases[c].pieces[i], l);
        }
        char *dec;
        size_t dl;
        assert_int_equal(tok_decode(t, ids, n, false, &dec, &dl, &err), 0);
        assert_string_equal(dec, cases[c].text);
        free(dec);
        free(ids);
    }
    /* With parse_special the control token is one id: tokenizer.ggml.tokens[1]
     * is "<|im_start|>"; "user" is a whole token. */
    int32_t *ids;
    size_t n;
    tern_error_t err;
    assert_int_equal(tok_encode(t, "<|im_start|>user", 16, false, true, &ids, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[0], tok_find(t, "<|im_start|>", 12));
    assert_int_equal(ids[1], tok_find(t, "user", 4));
    assert_true(tok_is_control(t, ids[0]));
    free(ids);
    /* A run of digits is one token per digit, each the digit's own token. */
    assert_int_equal(tok_encode(t, "9876543210", 10, false, false, &ids, &n, &err), 0);
    assert_int_equal(n, 10);
    const char *digits = "9876543210";
    for (int i = 0; i < 10; i++) assert_int_equal(ids[i], tok_find(t, &digits[i], 1));
    free(ids);
    /* <|im_end|> ends a turn */
    assert_true(tok_is_eog(t, tok_find(t, "<|im_end|>", 10)));
    assert_true(tok_is_eog(t, tok_eos(t)));
    tok_free(t);
}

/* ---- synthetic vocabularies: each rule on a case small enough to derive by
 * hand ------------------------------------------------------------------- */

typedef struct {
    const char *text;
    int type;
    float score;
} vt_t;

static tokenizer_t *mk_tok(const char *model, const char *pre, const char *name, const vt_t *v, int n,
                           const char *const *merges, int n_merges, int add_space_prefix, int32_t unk,
                           tern_error_t *err) {
    gguf_str_t toks[64], mg[64];
    float scores[64];
    int32_t types[64];
    assert_true(n <= 64 && n_merges <= 64);
    for (int i = 0; i < n; i++) {
        toks[i] = (gguf_str_t){strlen(v[i].text), v[i].text};
        scores[i] = v[i].score;
        types[i] = v[i].type;
    }
    for (int i = 0; i < n_merges; i++) mg[i] = (gguf_str_t){strlen(merges[i]), merges[i]};
    tok_spec_t sp = {.model = model, .pre = pre, .name = name, .n_vocab = n, .tokens = toks, .scores = scores,
                     .types = types, .n_merges = (uint64_t)n_merges, .merges = mg, .bos = -2, .eos = -2,
                     .eot = -1, .eom = -1, .unk = unk, .pad = -1, .add_bos = -1, .add_eos = -1,
                     .add_space_prefix = add_space_prefix};
    return tok_new(&sp, err);
}

static void expect_ids(const tokenizer_t *t, const char *text, bool special, const int32_t *want, size_t nw) {
    int32_t *ids;
    size_t n;
    tern_error_t err = {0};
    int rc = tok_encode(t, text, strlen(text), false, special, &ids, &n, &err);
    if (rc) print_message("encode '%s': %s\n", text, err.msg);
    assert_int_equal(rc, 0);
    if (n != nw || (n && memcmp(ids, want, n * sizeof *ids))) {
        print_message("'%s':\n", text);
        print_ids("want", want, nw);
        print_ids("got ", ids, n);
        fail();
    }
    free(ids);
}
#define EXPECT(t, text, special, ...)                                               \
    do {                                                                            \
        const int32_t want_[] = {__VA_ARGS__};                                      \
        expect_ids(t, text, special, want_, sizeof want_ / sizeof want_[0]);        \
    } while (0)
#define EXPECT_NONE(t, text, special) expect_ids(t, text, special, NULL, 0)

#define SP "\xe2\x96\x81" /* U+2581, SPM's space */
#define G "\xc4\xa0"      /* U+0120, byte-level BPE's space */

static const vt_t SPM_VOCAB[] = {
    {"<unk>", TOK_TYPE_UNKNOWN, 0},   {"<s>", TOK_TYPE_CONTROL, 0}, {"</s>", TOK_TYPE_CONTROL, 0},
    {SP, TOK_TYPE_NORMAL, -1},        {"a", TOK_TYPE_NORMAL, -2},   {"b", TOK_TYPE_NORMAL, -2},
    {"c", TOK_TYPE_NORMAL, -2},       {"ab", TOK_TYPE_NORMAL, -1.5f}, {"bc", TOK_TYPE_NORMAL, -1.0f},
    {SP "a", TOK_TYPE_NORMAL, -0.5f}, {"aa", TOK_TYPE_NORMAL, -3},  {"<0xC3>", TOK_TYPE_BYTE, 0},
    {"<0xA9>", TOK_TYPE_BYTE, 0},     {"<", TOK_TYPE_NORMAL, -4},   {"s", TOK_TYPE_NORMAL, -4},
    {">", TOK_TYPE_NORMAL, -4},
};
#define N_SPM_VOCAB ((int)(sizeof SPM_VOCAB / sizeof SPM_VOCAB[0]))

static void test_spm_rules(void **state) {
    (void)state;
    tern_error_t err;
    tokenizer_t *t = mk_tok("llama", NULL, NULL, SPM_VOCAB, N_SPM_VOCAB, NULL, 0, 0, -2, &err);
    assert_non_null(t);
    assert_int_equal(tok_bos(t), 1); /* SPM defaults: BOS 1, EOS 2, UNK 0 */
    assert_int_equal(tok_eos(t), 2);
    assert_int_equal(tok_unk(t), 0);
    /* highest score first: "bc" (-1.0) beats "ab" (-1.5) */
    EXPECT(t, "abc", false, 4, 8);
    /* equal scores: the leftmost pair merges first */
    EXPECT(t, "aaa", false, 10, 4);
    /* a character with no piece: its bytes (byte fallback) ... */
    EXPECT(t, "\xc3\xa9", false, 11, 12);
    /* ... or, when a byte token is missing, one unknown token */
    EXPECT(t, "\xc3\xa4", false, 0);
    /* control tokens are never formed by merging: "<s>" stays three pieces */
    EXPECT(t, "<s>", false, 13, 14, 15);
    EXPECT(t, "<s>", true, 1);
    EXPECT_NONE(t, "", false);
    tok_free(t);

    /* swap the two scores: now "ab" merges first */
    vt_t v2[N_SPM_VOCAB];
    memcpy(v2, SPM_VOCAB, sizeof v2);
    v2[7].score = -1.0f;
    v2[8].score = -1.5f;
    t = mk_tok("llama", NULL, NULL, v2, N_SPM_VOCAB, NULL, 0, 0, -2, &err);
    assert_non_null(t);
    EXPECT(t, "abc", false, 7, 6);
    tok_free(t);

    /* the dummy space: "a b" is "▁a▁b": "▁a" is a piece, "▁b" is not */
    t = mk_tok("llama", NULL, NULL, SPM_VOCAB, N_SPM_VOCAB, NULL, 0, 1, -2, &err);
    assert_non_null(t);
    EXPECT(t, "a b", false, 9, 3, 5);
    /* after a special token the next fragment gets the dummy space again */
    EXPECT(t, "a<s>b", true, 9, 1, 3, 5);
    EXPECT(t, "<s>a", true, 1, 9);
    EXPECT(t, "<s>a", false, 3, 13, 14, 15, 4);
    /* decoding drops the dummy space of the first piece only */
    char *dec;
    size_t dl;
    const int32_t ids[] = {1, 9, 3, 5};
    assert_int_equal(tok_decode(t, ids, 4, false, &dec, &dl, &err), 0);
    assert_string_equal(dec, "a b");
    free(dec);
    assert_int_equal(tok_decode(t, ids, 4, true, &dec, &dl, &err), 0);
    assert_string_equal(dec, "<s>a b");
    free(dec);
    const int32_t bad[] = {1, 99};
    assert_int_not_equal(tok_decode(t, bad, 2, false, &dec, &dl, &err), 0);
    assert_non_null(strstr(err.msg, "99"));
    tok_free(t);

    /* no byte tokens and no unknown token: a clear error, not a crash */
    vt_t v3[] = {{"a", TOK_TYPE_NORMAL, 0}, {"b", TOK_TYPE_NORMAL, 0}};
    t = mk_tok("llama", NULL, NULL, v3, 2, NULL, 0, 0, -1, &err);
    assert_non_null(t);
    int32_t *out;
    size_t n;
    assert_int_not_equal(tok_encode(t, "ax", 2, false, false, &out, &n, &err), 0);
    assert_non_null(strstr(err.msg, "no token"));
    tok_free(t);
}

static const vt_t BPE_VOCAB[] = {
    {"a", TOK_TYPE_NORMAL, 0},    {"b", TOK_TYPE_NORMAL, 0},        {"c", TOK_TYPE_NORMAL, 0},
    {G, TOK_TYPE_NORMAL, 0},      {"ab", TOK_TYPE_NORMAL, 0},       {"bc", TOK_TYPE_NORMAL, 0},
    {"abc", TOK_TYPE_NORMAL, 0},  {G "b", TOK_TYPE_NORMAL, 0},      {"a" G, TOK_TYPE_NORMAL, 0},
    {"aa", TOK_TYPE_NORMAL, 0},   {"aaaa", TOK_TYPE_NORMAL, 0},     {"<|c|>", TOK_TYPE_CONTROL, 0},
    {"xy", TOK_TYPE_USER_DEFINED, 0}, {"x", TOK_TYPE_NORMAL, 0},    {"y", TOK_TYPE_NORMAL, 0},
    {"z", TOK_TYPE_NORMAL, 0},    {"d", TOK_TYPE_NORMAL, 0},        {"yzd", TOK_TYPE_USER_DEFINED, 0},
    {"<", TOK_TYPE_NORMAL, 0},    {"|", TOK_TYPE_NORMAL, 0},        {">", TOK_TYPE_NORMAL, 0},
};
#define N_BPE_VOCAB ((int)(sizeof BPE_VOCAB / sizeof BPE_VOCAB[0]))
static const char *const BPE_MERGES[] = {"b c", "a bc", "a b", "a " G, G " b", "a a", "aa aa"};

static void test_bpe_rules(void **state) {
    (void)state;
    tern_error_t err;
    tokenizer_t *t = mk_tok("gpt2", "gpt-2", NULL, BPE_VOCAB, N_BPE_VOCAB, BPE_MERGES, 7, -1, -2, &err);
    assert_non_null(t);
    assert_int_equal(tok_bos(t), -1); /* no BOS unless the file names one */
    int32_t *out;
    size_t n;
    assert_int_not_equal(tok_encode(t, "a", 1, true, false, &out, &n, &err), 0);
    assert_non_null(strstr(err.msg, "BOS"));
    /* lowest rank first: "b c" (0), then "a bc" (1) */
    EXPECT(t, "abc", false, 6);
    EXPECT(t, "ab", false, 4);
    /* merges never cross pre-tokenizer pieces: "a b" is "a" + " b", so
     * "a Ġ" (rank 3) cannot apply although it outranks "Ġ b" (rank 4) */
    EXPECT(t, "a b", false, 0, 7);
    /* repeated pair: leftmost first, then the new pair "aa aa" */
    EXPECT(t, "aaaa", false, 10);
    EXPECT(t, "aaa", false, 9, 0);
    /* user-defined tokens are cut out even without parse_special ... */
    EXPECT(t, "axyb", false, 0, 12, 1);
    /* ... longest text first: "yzd" is cut before "xy" can be */
    EXPECT(t, "xyzd", false, 13, 17);
    /* control tokens only with parse_special; else "<|" "c" "|>" by the regex */
    EXPECT(t, "<|c|>", false, 18, 19, 2, 19, 20);
    EXPECT(t, "<|c|>", true, 11);
    EXPECT(t, "a<|c|>b", true, 0, 11, 1);
    /* a byte with no symbol in the vocab is dropped (no unknown token) */
    EXPECT(t, "a\xc3\xa9", false, 0);
    tok_free(t);

    /* ... or becomes the unknown token when there is one */
    t = mk_tok("gpt2", "gpt-2", NULL, BPE_VOCAB, N_BPE_VOCAB, BPE_MERGES, 7, -1, 16, &err);
    assert_non_null(t);
    EXPECT(t, "a\xc3\xa9", false, 0, 16, 16);
    tok_free(t);

    /* Llama 3 takes a piece that is a token whole, whatever the merges say:
     * only "a b" is a rule here, so plain BPE gives "ab" "c" */
    const char *const m1[] = {"a b"};
    t = mk_tok("gpt2", "gpt-2", NULL, BPE_VOCAB, N_BPE_VOCAB, m1, 1, -1, -1, &err);
    assert_non_null(t);
    EXPECT(t, "abc", false, 4, 2);
    tok_free(t);
    t = mk_tok("gpt2", "llama-bpe", NULL, BPE_VOCAB, N_BPE_VOCAB, m1, 1, -1, -1, &err);
    assert_non_null(t);
    EXPECT(t, "abc", false, 6);
    tok_free(t);

    /* Phi-3's added tokens swallow the whitespace on their right (the rule
     * keys on general.name) */
    t = mk_tok("gpt2", "gpt-2", "Phi3 test", BPE_VOCAB, N_BPE_VOCAB, BPE_MERGES, 7, -1, -1, &err);
    assert_non_null(t);
    EXPECT(t, "<|c|> \n b", true, 11, 1); /* " \n " is gone: "b", not " b" */
    tok_free(t);

    /* unknown pre-tokenizers and models are errors that name them */
    t = mk_tok("gpt2", "no-such-pre", NULL, BPE_VOCAB, N_BPE_VOCAB, BPE_MERGES, 7, -1, -1, &err);
    assert_null(t);
    assert_int_equal(err.code, TERN_EUNSUP);
    assert_non_null(strstr(err.msg, "no-such-pre"));
    t = mk_tok("bert", NULL, NULL, BPE_VOCAB, N_BPE_VOCAB, NULL, 0, -1, -1, &err);
    assert_null(t);
    assert_non_null(strstr(err.msg, "bert"));
}

/* Each named pre-tokenizer compiles and splits as its family does. */
static void test_pre_tokenizers(void **state) {
    (void)state;
    const char *names[] = {"default", "gpt-2", "llama-bpe", "qwen2", "smollm", "deepseek-llm", "deepseek-coder",
                           "falcon", "starcoder", "mpt", "refact"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tern_error_t err;
        tokenizer_t *t = mk_tok("gpt2", names[i], NULL, BPE_VOCAB, N_BPE_VOCAB, BPE_MERGES, 7, -1, -1, &err);
        if (!t) print_message("%s: %s\n", names[i], err.msg);
        assert_non_null(t);
        assert_string_equal(tok_pre_name(t), names[i]);
        tok_free(t);
    }
}

/* Streaming decode: bytes held until the code point completes, invalid
 * sequences become U+FFFD, a too-small buffer changes nothing. */
static void test_stream_rules(void **state) {
    (void)state;
    tern_error_t err;
    tokenizer_t *t = mk_tok("llama", NULL, NULL, SPM_VOCAB, N_SPM_VOCAB, NULL, 0, 1, -2, &err);
    assert_non_null(t);
    tok_stream_t s;
    char buf[64];
    tok_stream_init(&s, t);
    assert_int_equal(tok_stream_push(&s, 1, buf, sizeof buf), 0);  /* control: nothing */
    assert_int_equal(tok_stream_push(&s, 9, buf, 0), -1);          /* " a" does not fit */
    assert_int_equal(tok_stream_push(&s, 9, buf, sizeof buf), 1);  /* first piece: space dropped */
    assert_memory_equal(buf, "a", 1);
    assert_int_equal(tok_stream_push(&s, 11, buf, sizeof buf), 0); /* 0xC3: held */
    assert_int_equal(tok_stream_push(&s, 12, buf, sizeof buf), 2); /* 0xA9 completes é */
    assert_memory_equal(buf, "\xc3\xa9", 2);
    assert_int_equal(tok_stream_push(&s, 9, buf, sizeof buf), 2); /* later pieces keep their space */
    assert_memory_equal(buf, " a", 2);
    assert_int_equal(tok_stream_push(&s, 12, buf, sizeof buf), 3); /* lone continuation byte */
    assert_memory_equal(buf, "\xef\xbf\xbd", 3);
    assert_int_equal(tok_stream_push(&s, 11, buf, sizeof buf), 0);
    assert_int_equal(tok_stream_push(&s, 4, buf, sizeof buf), 4); /* 0xC3 then 'a': U+FFFD + a */
    assert_memory_equal(buf, "\xef\xbf\xbd" "a", 4);
    assert_int_equal(tok_stream_push(&s, 11, buf, sizeof buf), 0);
    assert_int_equal(tok_stream_flush(&s, buf, 2), -1);
    assert_int_equal(tok_stream_flush(&s, buf, sizeof buf), 3); /* unfinished at the end */
    assert_memory_equal(buf, "\xef\xbf\xbd", 3);
    assert_int_equal(tok_stream_flush(&s, buf, sizeof buf), 0);
    assert_int_equal(tok_stream_push(&s, -5, buf, sizeof buf), 0);
    assert_int_equal(tok_stream_push(&s, 1000, buf, sizeof buf), 0);
    tok_free(t);
}

/* Arbitrary id sequences on real vocabs: the stream only emits valid UTF-8;
 * random byte strings round-trip where the vocab can spell them. */
static void test_stream_random_and_roundtrip(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(dir, "reference/vocab");
    const char *names[] = {"llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "mpt"};
    uint64_t rng = 12345;
    int iters = tu_quick() ? 20 : 200;
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        char rel[128];
        snprintf(rel, sizeof rel, "reference/vocab/ggml-vocab-%s.gguf", names[v]);
        const char *path = tu_shared(rel);
        if (!path) {
            tu_shared_missing(rel, "part");
            continue;
        }
        tokenizer_t *t = load_tok(path);
        assert_non_null(t);
        int32_t nv = tok_n_vocab(t);
        int n_rt = 0;
        for (int it = 0; it < iters; it++) {
            /* ids: half uniform, half byte tokens and short pieces */
            int32_t ids[64];
            for (int i = 0; i < 64; i++) {
                uint64_t r = tu_rand(&rng);
                ids[i] = (r & 1) ? (int32_t)(r % (uint64_t)nv) : (int32_t)((r >> 8) % 300);
            }
            size_t dl;
            char *sd = stream_decode(t, ids, 64, &dl);
            assert_true(utf8_valid(sd, dl));
            free(sd);
            /* random bytes, biased to spaces, ASCII and UTF-8 lead bytes */
            char text[96];
            size_t tl = tu_rand(&rng) % sizeof text;
            for (size_t i = 0; i < tl; i++) {
                uint64_t r = tu_rand(&rng);
                text[i] = (char)((r & 3) == 0 ? ' ' : (r & 3) == 1 ? 'a' + (r >> 8) % 26 : (r >> 8) & 0xff);
            }
            int32_t *out;
            size_t n;
            tern_error_t err;
            assert_int_equal(tok_encode(t, text, tl, false, false, &out, &n, &err), 0);
            if (round_trip_expected(t, text, tl, out, n)) {
                char *dec;
                assert_int_equal(tok_decode(t, out, n, false, &dec, &dl, &err), 0);
                assert_int_equal(dl, tl);
                assert_memory_equal(dec, text, tl);
                free(dec);
                n_rt++;
            }
            free(out);
        }
        print_message("%-13s random bytes: %d/%d round trips checked\n", names[v], n_rt, iters);
        tok_free(t);
    }
}

/* ---- chat templates ------------------------------------------------------- */

static const chat_msg_t CONV[] = {
    {"system", "Be brief."},
    {"user", "Hi!"},
    {"assistant", "Hello."},
    {"user", "2+2?"},
};

static void expect_render(chat_tmpl_t tm, bool add_assistant, const char *want) {
    char *out;
    tern_error_t err;
    assert_int_equal(chat_render(tm, CONV, 4, add_assistant, &out, &err), 0);
    if (strcmp(out, want)) print_message("%s:\n got: %s\nwant: %s\n", chat_name(tm), out, want);
    assert_string_equal(out, want);
    free(out);
}

/* The expected strings spell out each family's published format. */
static void test_chat_render(void **state) {
    (void)state;
    expect_render(CHAT_CHATML, true,
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                  "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render(CHAT_LLAMA3, true,
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(CHAT_LLAMA2, true, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]Hello.</s>[INST] 2+2? [/INST]");
    expect_render(CHAT_PHI3, true,
                  "<|system|>\nBe brief.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n"
                  "<|user|>\n2+2?<|end|>\n<|assistant|>\n");
    expect_render(CHAT_CHATML, false,
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                  "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n");
    /* Llama 3 trims each message, as its official template does */
    char *out;
    tern_error_t err;
    chat_msg_t m = {"user", "  hi \n"};
    assert_int_equal(chat_render(CHAT_LLAMA3, &m, 1, false, &out, &err), 0);
    assert_string_equal(out, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
    free(out);
    /* errors */
    chat_msg_t tool = {"tool", "x"};
    assert_int_equal(chat_render(CHAT_CHATML, &tool, 1, false, &out, &err), 0);
    assert_string_equal(out, "<|im_start|>tool\nx<|im_end|>\n");
    free(out);
    assert_int_not_equal(chat_render(CHAT_PHI3, &tool, 1, false, &out, &err), 0);
    assert_non_null(strstr(err.msg, "tool"));
    chat_msg_t nul = {"user", NULL};
    assert_int_not_equal(chat_render(CHAT_CHATML, &nul, 1, false, &out, &err), 0);
    assert_int_not_equal(chat_render(CHAT_UNKNOWN, CONV, 1, false, &out, &err), 0);
    /* names */
    assert_int_equal(chat_from_name("chatml"), CHAT_CHATML);
    assert_int_equal(chat_from_name("llama3"), CHAT_LLAMA3);
    assert_int_equal(chat_from_name("llama2"), CHAT_LLAMA2);
    assert_int_equal(chat_from_name("mistral"), CHAT_LLAMA2);
    assert_int_equal(chat_from_name("phi3"), CHAT_PHI3);
    assert_int_equal(chat_from_name("jinja-magic"), CHAT_UNKNOWN);
    for (int k = CHAT_CHATML; k < CHAT_UNKNOWN; k++) assert_int_equal(chat_from_name(chat_name((chat_tmpl_t)k)), k);
}

static void test_chat_detect(void **state) {
    (void)state;
    const char *mistral = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                          "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}";
    assert_int_equal(chat_detect_str(mistral, strlen(mistral)), CHAT_LLAMA2);
    const char *other = "{% for m in messages %}<start_of_turn>{{ m.content }}<end_of_turn>{% endfor %}";
    assert_int_equal(chat_detect_str(other, strlen(other)), CHAT_UNKNOWN);
    assert_int_equal(chat_detect_str("", 0), CHAT_UNKNOWN);
    static const struct {
        const char *vocab;
        chat_tmpl_t want;
    } files[] = {{"phi-3", CHAT_PHI3}, {"qwen2", CHAT_CHATML}, {"llama-bpe", CHAT_LLAMA3}, {"gpt-2", CHAT_UNKNOWN}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "reference/vocab/ggml-vocab-%s.gguf", files[i].vocab);
        TU_REQUIRE_SHARED(path, rel);
        tern_error_t err;
        gguf_file_t *f = gguf_open(path, &err);
        assert_non_null(f);
        assert_int_equal(chat_detect(f), files[i].want);
        gguf_close(f);
    }
}

/* A rendered Phi-3 prompt tokenizes with its markers as single control
 * tokens, and the whitespace after them swallowed (Phi-3's rule). */
static void test_chat_tokenize_phi3(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "reference/vocab/ggml-vocab-phi-3.gguf");
    tokenizer_t *t = load_tok(path);
    assert_non_null(t);
    chat_msg_t m = {"user", "Hi"};
    char *prompt;
    tern_error_t err;
    assert_int_equal(chat_render(CHAT_PHI3, &m, 1, true, &prompt, &err), 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode(t, prompt, strlen(prompt), true, true, &ids, &n, &err), 0);
    int32_t user = tok_find(t, "<|user|>", 8), end = tok_find(t, "<|end|>", 7), asst = tok_find(t, "<|assistant|>", 13);
    int32_t hi = tok_find(t, SP "Hi", 5);
    assert_true(user >= 0 && end >= 0 && asst >= 0 && hi >= 0);
    /* BOS, <|user|>, "▁Hi" (newline stripped, dummy space after a special),
     * <|end|>, <|assistant|> (the "\n"s after the specials are stripped) */
    const int32_t want[] = {1, user, hi, end, asst};
    if (n != 5 || memcmp(ids, want, sizeof want)) {
        print_ids("want", want, 5);
        print_ids("got ", ids, n);
        fail();
    }
    assert_true(tok_is_eog(t, end));
    free(ids);
    free(prompt);
    tok_free(t);
}

/* ---- loading: bad metadata is an error that names the key ----------------- */

static char *write_vocab(const char *model, const char *pre, int n_tokens, int n_scores, bool merges, char *path) {
    gguf_writer_t *w = gguf_writer_new(32);
    const char *toks[] = {"a", "b", "ab", "<s>"};
    const char *mg[] = {"a b"};
    float scores[4] = {0, 0, -1, 0};
    if (model) gguf_w_str(w, "tokenizer.ggml.model", model);
    if (pre) gguf_w_str(w, "tokenizer.ggml.pre", pre);
    if (n_tokens) gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)n_tokens);
    if (n_scores) gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, (uint64_t)n_scores);
    if (merges) gguf_w_arr_str(w, "tokenizer.ggml.merges", mg, NULL, 1);
    strcpy(path, "/tmp/tern_test_tok_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    tern_error_t err;
    assert_int_equal(gguf_writer_write(w, path, &err), 0);
    gguf_writer_free(w);
    return path;
}

static void expect_load_error(const char *path, const char *needle) {
    tern_error_t err = {0};
    gguf_file_t *f = gguf_open(path, &err);
    assert_non_null(f);
    tokenizer_t *t = tok_load(f, &err);
    gguf_close(f);
    unlink(path);
    if (t) tok_free(t);
    assert_null(t);
    if (!strstr(err.msg, needle)) print_message("message '%s' lacks '%s'\n", err.msg, needle);
    assert_non_null(strstr(err.msg, needle));
}

static void test_load_errors(void **state) {
    (void)state;
    char path[64];
    expect_load_error(write_vocab(NULL, NULL, 4, 0, false, path), "tokenizer.ggml.model");
    expect_load_error(write_vocab("llama", NULL, 0, 0, false, path), "tokenizer.ggml.tokens");
    expect_load_error(write_vocab("llama", NULL, 4, 2, false, path), "tokenizer.ggml.scores");
    expect_load_error(write_vocab("gpt2", "gpt-2", 4, 0, false, path), "tokenizer.ggml.merges");
    expect_load_error(write_vocab("gpt2", "not-a-pre", 4, 0, true, path), "not-a-pre");
    expect_load_error(write_vocab("t5", NULL, 4, 0, false, path), "t5");
    /* and a good one loads */
    write_vocab("gpt2", "gpt-2", 4, 0, true, path);
    tern_error_t err;
    gguf_file_t *f = gguf_open(path, &err);
    tokenizer_t *t = tok_load(f, &err);
    gguf_close(f);
    unlink(path);
    assert_non_null(t);
    EXPECT(t, "ab", false, 2);
    tok_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_vectors),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_speed_1mb),
        cmocka_unit_test(test_smollm),
        cmocka_unit_test(test_spm_rules),
        cmocka_unit_test(test_bpe_rules),
        cmocka_unit_test(test_pre_tokenizers),
        cmocka_unit_test(test_stream_rules),
        cmocka_unit_test(test_stream_random_and_roundtrip),
        cmocka_unit_test(test_chat_render),
        cmocka_unit_test(test_chat_detect),
        cmocka_unit_test(test_chat_tokenize_phi3),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
