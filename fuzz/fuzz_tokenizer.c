/*
 * fuzz_tokenizer.c - libFuzzer target for encode and decode on every vocab
 * in the shared folder (reference/vocab/ggml-vocab-*.gguf and the stories260K
 * model), loaded once.
 *
 * Input: byte 0 picks the vocab (and, with bit 7, special-token parsing);
 * the rest is the text. Checks: no crash, no leak, no sanitizer report;
 * decode(encode(text)) == text wherever the vocab can represent the text
 * (see roundtrip_holds); the streaming decoder, fed the ids and then the
 * input bytes read as arbitrary ids, only ever emits valid UTF-8.
 *
 * The shared folder: $TERN_SHARED, else TERN_SHARED_DIR given at compile
 * time, else /work/shared.
 */
#define _GNU_SOURCE /* memmem */
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/tokenizer.h"

#ifndef TERN_SHARED_DIR
#define TERN_SHARED_DIR "/work/shared"
#endif

#define MAX_TOK 32
static tokenizer_t *g_tok[MAX_TOK];
static int g_n;

static void load_one(const char *path) {
    if (g_n >= MAX_TOK) return;
    tern_error_t err;
    gguf_file_t *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err.msg);
        return;
    }
    tokenizer_t *t = tok_load(f, &err);
    gguf_close(f);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err.msg);
        return;
    }
    g_tok[g_n++] = t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("TERN_SHARED");
    if (!dir || !*dir) dir = TERN_SHARED_DIR;
    char pat[4096];
    snprintf(pat, sizeof pat, "%s/reference/vocab/ggml-vocab-*.gguf", dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) load_one(g.gl_pathv[i]);
        globfree(&g);
    }
    snprintf(pat, sizeof pat, "%s/models/stories260K.gguf", dir);
    load_one(pat);
    if (g_n == 0) {
        fprintf(stderr, "fuzz_tokenizer: no vocab found under %s (set TERN_SHARED)\n", dir);
        abort();
    }
    fprintf(stderr, "fuzz_tokenizer: %d vocabs from %s\n", g_n, dir);
    return 0;
}

static void check_utf8(const char *s, int n) {
    const unsigned char *u = (const unsigned char *)s;
    for (int i = 0; i < n;) {
        unsigned c = u[i];
        int need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!need || i + need > n) abort();
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (need > 1 && (u[i + 1] < lo || u[i + 1] > hi)) abort();
        for (int k = 2; k < need; k++)
            if ((u[i + k] & 0xC0) != 0x80) abort();
        i += need;
    }
}

/* Round trip holds when every byte has a token, no control token was
 * produced, and for SPM: no special token was cut out and no U+2581 is in
 * the text (see test_tokenizer.c). */
static int roundtrip_holds(const tokenizer_t *t, const char *s, size_t n, const int32_t *ids, size_t n_ids,
                           int parse_special) {
    if (parse_special || !tok_can_represent(t, s, n)) return 0;
    int spm = !strcmp(tok_model_name(t), "llama");
    for (size_t i = 0; i < n_ids; i++) {
        int ty = tok_token_type(t, ids[i]);
        if (tok_is_control(t, ids[i])) return 0;
        if (spm && (ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN)) return 0;
    }
    if (spm && memmem(s, n, "\xe2\x96\x81", 3)) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const tokenizer_t *t = g_tok[(data[0] & 0x7f) % g_n];
    int parse_special = data[0] >> 7;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    int32_t *ids = NULL;
    size_t n_ids = 0;
    tern_error_t err;
    if (tok_encode(t, text, len, (data[0] & 1) != 0 && tok_bos(t) >= 0, parse_special, &ids, &n_ids, &err) != 0) {
        fprintf(stderr, "encode failed: %s\n", err.msg);
        abort(); /* the vocabs under test can encode any text */
    }
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) abort();

    char *dec = NULL;
    size_t dl = 0;
    if (tok_decode(t, ids, n_ids, false, &dec, &dl, &err) != 0) abort();
    if (roundtrip_holds(t, text, len, ids, n_ids, parse_special) && (dl != len || memcmp(dec, text, len) != 0)) {
        fprintf(stderr, "round trip failed on vocab %d: %zu bytes in, %zu out\n", (data[0] & 0x7f) % g_n, len, dl);
        abort();
    }
    free(dec);

    /* Stream the ids, then the input read as ids (any value, in range or
     * not): the output is always valid UTF-8. */
    tok_stream_t s;
    tok_stream_init(&s, t);
    char buf[8192];
    for (size_t i = 0; i < n_ids; i++) {
        int w = tok_stream_push(&s, ids[i], buf, sizeof buf);
        if (w < 0) abort();
        check_utf8(buf, w);
    }
    for (size_t i = 0; i + 3 < len; i += 3) {
        int32_t id = (int32_t)((uint32_t)data[1 + i] | (uint32_t)data[2 + i] << 8 | (uint32_t)data[3 + i] << 16);
        if (data[1 + i] & 1) id %= tok_n_vocab(t); /* mostly in range */
        int w = tok_stream_push(&s, id, buf, sizeof buf);
        if (w < 0) abort();
        check_utf8(buf, w);
    }
    int w = tok_stream_flush(&s, buf, sizeof buf);
    if (w < 0) abort();
    check_utf8(buf, w);
    free(ids);
    return 0;
}
