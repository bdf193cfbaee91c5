/*
 * tok_pre.c - the pre-tokenizers of byte-level BPE vocabularies: the text is
 * cut into pieces by an ordered list of regexes before any merge runs, and
 * merges never cross a piece boundary. Which list applies is named by the
 * GGUF key tokenizer.ggml.pre.
 *
 * Semantics (those of the Hugging Face "Split ... isolated" sequence that the
 * models were trained with, and of llama.cpp): the first regex splits the
 * whole text into its matches and the gaps between them (gaps are pieces
 * too); each following regex does the same inside every piece produced so
 * far, with the piece as the whole subject (a lookahead at a piece's end sees
 * the end of the subject). The regex lists are facts about each model family,
 * as llama.cpp's llama-vocab.cpp records them.
 *
 * Matching uses PCRE2 in UTF mode with Unicode properties (\p{L}, \s ...
 * follow the Unicode tables, not ASCII), JIT-compiled when the library has a
 * JIT. Invalid UTF-8 in the input never matches anything, so it ends up in
 * gaps and is merged byte by byte later.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "text/tok_internal.h"

/* GPT-2's pattern (without its final "|\s+": a whitespace run that pattern
 * would match alone is a gap, i.e. a piece, anyway). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* Llama 3 / Qwen2: case-insensitive contractions spelled out (as llama.cpp
 * does), so no (?i) group is needed. NUMS is \p{N}{1,3} or \p{N}. */
#define RE_LLAMA3_LIKE(NUMS)                                                                          \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" NUMS \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* DeepSeek LLM's letter class, written with code points: several of its
 * characters (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) are Unicode
 * singletons that any NFC-normalizing copy of the pattern would silently
 * turn into other characters. */
#define DS_LETTERS                                                                                     \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"     \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}"               \
    "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}"      \
    "\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}"     \
    "\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"   \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}"    \
    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"   \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"   \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"    \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"              \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"              \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"    \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"   \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                 \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"             \
    "\\x{1E900}-\\x{1E943}"
/* CJK ideographs, U+0800..U+4E00 and Hangul, as one class. */
#define DS_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

#define MAX_RE 6
typedef struct {
    const char *names[10]; /* accepted spellings of tokenizer.ggml.pre */
    const char *re[MAX_RE];
    bool ignore_merges, add_bos;
} pre_def_t;

static const pre_def_t PRE_DEFS[] = {
    {{"default"},
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
     false,
     false},
    {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat"}, {RE_GPT2}, false, false},
    {{"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"}, {RE_LLAMA3_LIKE("\\p{N}{1,3}")}, true, true},
    {{"dbrx", "smaug-bpe"}, {RE_LLAMA3_LIKE("\\p{N}{1,3}")}, false, false},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {RE_LLAMA3_LIKE("\\p{N}")}, false, false},
    {{"deepseek-llm"},
     {"[\r\n]", "\\s?[" DS_LETTERS "]+", "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", DS_CJK, "\\p{N}+"},
     false,
     false},
    {{"deepseek-coder"}, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", DS_CJK, "\\p{N}"}, false, false},
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {{"starcoder", "refact", "smollm", "command-r", "codeshell", "exaone", "minerva"}, {"\\p{N}", RE_GPT2}, false, false},
};

struct tok_pre {
    int n_re;
    pcre2_code *re[MAX_RE];
};

void tok_pre_free(tok_pre_t *p) {
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    free(p);
}

static const pre_def_t *find_def(const char *name, size_t n) {
    for (size_t d = 0; d < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; d++)
        for (int k = 0; k < 10 && PRE_DEFS[d].names[k]; k++)
            if (strlen(PRE_DEFS[d].names[k]) == n && memcmp(PRE_DEFS[d].names[k], name, n) == 0) return &PRE_DEFS[d];
    return NULL;
}

tok_pre_t *tok_pre_new(const char *name, size_t name_len, tok_pre_info_t *info, tern_error_t *err) {
    if (!name || name_len == 0) {
        name = "default";
        name_len = 7;
    }
    const pre_def_t *d = find_def(name, name_len);
    if (!d) {
        int shown = name_len > 64 ? 64 : (int)name_len;
        tern_err(err, TERN_EUNSUP,
                 "tokenizer.ggml.pre: unknown pre-tokenizer '%.*s'%s (known: default, gpt-2, llama-bpe, qwen2, smollm, "
                 "deepseek-llm, deepseek-coder, falcon, starcoder, mpt, refact, and aliases)",
                 shown, name, name_len > 64 ? "..." : "");
        return NULL;
    }
    tok_pre_t *p = calloc(1, sizeof *p);
    if (!p) {
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < MAX_RE && d->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        /* DOLLAR_ENDONLY: "$" means the end of the piece, as in the
         * ECMAScript and Rust engines the patterns were written for. */
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)d->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &ec,
                                       &eo, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            tern_err(err, TERN_EUNSUP, "pre-tokenizer '%s': regex %d does not compile at offset %zu: %s", d->names[0], i,
                     (size_t)eo, (const char *)msg);
            tok_pre_free(p);
            return NULL;
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* no JIT: the interpreter runs instead */
        p->re[p->n_re++] = re;
    }
    if (info) {
        info->name = d->names[0];
        info->ignore_merges = d->ignore_merges;
        info->add_bos_default = d->add_bos;
    }
    return p;
}

int tok_spans_push(tok_spans_t *a, uint32_t off, uint32_t len) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        tok_span_t *v = realloc(a->v, nc * sizeof *v);
        if (!v) return TERN_ENOMEM;
        a->v = v;
        a->cap = nc;
    }
    a->v[a->n++] = (tok_span_t){off, len};
    return 0;
}

/* Split one span with one regex: matches and the gaps between them. */
static int split_span(const pcre2_code *re, pcre2_match_data *md, pcre2_match_context *mc, const char *text,
                      tok_span_t sp, tok_spans_t *out, tern_error_t *err) {
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + sp.off);
    size_t n = sp.len, pos = 0, last = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, subj, n, pos, 0, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tern_err(err, TERN_EINVAL, "pre-tokenizer: regex failed on the text at byte %zu: %s",
                            (size_t)sp.off + pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        TERN_CHECK(ms >= pos && me >= ms && me <= n);
        if (me == ms) {
            /* An empty match cuts nothing (none of our patterns produce one;
             * step over a character so the loop always advances). */
            pos = ms + 1;
            while (pos < n && (subj[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > last && tok_spans_push(out, sp.off + (uint32_t)last, (uint32_t)(ms - last))) goto oom;
        if (tok_spans_push(out, sp.off + (uint32_t)ms, (uint32_t)(me - ms))) goto oom;
        last = pos = me;
    }
    if (last < n && tok_spans_push(out, sp.off + (uint32_t)last, (uint32_t)(n - last))) goto oom;
    return 0;
oom:
    return tern_err(err, TERN_ENOMEM, "out of memory");
}

int tok_pre_split(const tok_pre_t *p, const char *text, size_t len, tok_spans_t *out, tern_error_t *err) {
    if (len > TOK_MAX_TEXT) return tern_err(err, TERN_EINVAL, "text of %zu bytes is too long to tokenize", len);
    if (len == 0) return 0;
    tok_spans_t a = {0}, b = {0};
    int rc = 0;
    pcre2_match_data *md = NULL;
    /* A private JIT stack per call keeps concurrent encodes independent and
     * lets long runs of one character class match without hitting the
     * default 32 KiB stack. */
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!mc || !js || tok_spans_push(&a, 0, (uint32_t)len)) {
        rc = tern_err(err, TERN_ENOMEM, "out of memory");
        goto done;
    }
    pcre2_jit_stack_assign(mc, NULL, js);
    for (int r = 0; r < p->n_re; r++) {
        pcre2_match_data_free(md);
        md = pcre2_match_data_create_from_pattern(p->re[r], NULL);
        if (!md) {
            rc = tern_err(err, TERN_ENOMEM, "out of memory");
            goto done;
        }
        b.n = 0;
        for (size_t i = 0; i < a.n; i++)
            if ((rc = split_span(p->re[r], md, mc, text, a.v[i], &b, err))) goto done;
        tok_spans_t tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t i = 0; i < a.n; i++)
        if (tok_spans_push(out, a.v[i].off, a.v[i].len)) {
            rc = tern_err(err, TERN_ENOMEM, "out of memory");
            goto done;
        }
done:
    pcre2_match_data_free(md);
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    free(a.v);
    free(b.v);
    return rc;
}
