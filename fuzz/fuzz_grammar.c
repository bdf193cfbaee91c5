/*
 * fuzz_grammar.c - libFuzzer target for the GBNF parser and matcher
 * (src/text/grammar.c).
 *
 * Input: GBNF text. When it parses, it is bound to a small SPM vocabulary
 * (the 256 byte tokens, some multi-byte pieces, an end token; built once)
 * and a matcher walks up to 24 steps, each computing the mask, checking it
 * against a token-by-token check, and accepting an allowed token picked
 * from the input's bytes. Checks: no crash, no leak, no sanitizer report,
 * no endless loop (libFuzzer's timeout), masks exact.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar.h"
#include "text/tokenizer.h"

static tokenizer_t *g_tok;
static gvocab_t *g_voc;

static const char *extra[] = {"\xe2\x96\x81the", "ab", "abc", "{\"", "\":", "\"}", "12", "\xe3\x81\x82", "\xe2\x96\x81", "()",
                              "true", "null", "\\n", "\xf0\x9f\x98\x80", "\xc3"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    enum { NB = 256, NX = sizeof extra / sizeof extra[0] };
    static char bytes[NB][8];
    gguf_str_t toks[3 + NB + NX];
    int32_t types[3 + NB + NX];
    int n = 0;
    const char *specials[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        toks[n].data = specials[i];
        toks[n].len = strlen(specials[i]);
        types[n++] = i == 0 ? TOK_TYPE_UNKNOWN : TOK_TYPE_CONTROL;
    }
    for (int b = 0; b < NB; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n].data = bytes[b];
        toks[n].len = strlen(bytes[b]);
        types[n++] = TOK_TYPE_BYTE;
    }
    for (int i = 0; i < (int)NX; i++) {
        toks[n].data = extra[i];
        toks[n].len = strlen(extra[i]);
        types[n++] = TOK_TYPE_NORMAL;
    }
    tok_spec_t sp = {.model = "llama", .n_vocab = n, .tokens = toks, .types = types, .bos = 1, .eos = 2, .eot = -1,
                     .eom = -1, .unk = 0, .pad = -1, .add_bos = -1, .add_eos = -1, .add_space_prefix = -1};
    tern_error_t err;
    g_tok = tok_new(&sp, &err);
    if (!g_tok) {
        fprintf(stderr, "fuzz_grammar: %s\n", err.msg);
        abort();
    }
    g_voc = gvocab_build(g_tok, &err);
    if (!g_voc) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tern_error_t err;
    grammar_t *g = grammar_parse((const char *)data, size, NULL, &err);
    if (!g) return 0;
    if (grammar_n_elems(g) > 200000 || grammar_bind(g, g_voc, &err)) {
        grammar_free(g);
        return 0;
    }
    gmatcher_t *m = gmatcher_create(g, &err);
    if (m) {
        const int32_t V = gvocab_n_vocab(g_voc);
        for (int step = 0; step < 24; step++) {
            const uint64_t *bits = gmatcher_mask(m);
            if (!bits) break;
            int32_t allowed[512], n = 0;
            for (int32_t i = 0; i < V; i++) {
                int b = (int)(bits[i >> 6] >> (i & 63) & 1);
                if (b != (int)gmatcher_allows(m, i)) {
                    fprintf(stderr, "fuzz_grammar: mask and check disagree on token %d at step %d\n", i, step);
                    abort();
                }
                if (b && n < 512) allowed[n++] = i;
            }
            if (!n) break;
            int32_t pick = allowed[(size ? data[(size_t)step % size] : 0) % (unsigned)n];
            if (gmatcher_accept(m, pick, &err)) {
                fprintf(stderr, "fuzz_grammar: an allowed token was refused: %s\n", err.msg);
                abort();
            }
            if (gmatcher_finished(m)) break;
        }
        char buf[64];
        (void)gmatcher_forced(m, buf, sizeof buf);
        gmatcher_reset(m);
        (void)gmatcher_accept_bytes(m, (const char *)data, size < 256 ? size : 256, &err);
        gmatcher_free(m);
    }
    grammar_free(g);
    return 0;
}
