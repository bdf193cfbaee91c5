/*
 * tokenizer.c - builds a tokenizer from a GGUF file's tokenizer.ggml.* keys
 * (or an in-memory tok_spec_t), finds special tokens inside text, runs the
 * SPM or BPE merges on what is left (tok_spm.c, tok_bpe.c), and turns ids
 * back into bytes, whole or streamed.
 *
 * The rules are those of the reference tokenizers the models were trained
 * with, as llama.cpp reproduces them (its test vectors are our tests):
 *  - Special tokens. Control, user-defined and unknown tokens are cut out of
 *    the text before the merges, longest text first (for each such token, all
 *    its non-overlapping occurrences left to right in the text not yet cut,
 *    then the next shorter token). Without parse_special only user-defined
 *    tokens are cut out; control and unknown ones stay plain text.
 *  - SPM puts its dummy space in front of the first text fragment and of every
 *    fragment that follows a special token.
 *  - Tokens whose text marks the end of a turn ("<|eot_id|>", "<|im_end|>",
 *    "</s>" ...) count as end of generation and as control tokens.
 *  - Decoding: control and unknown tokens render as nothing; SPM's U+2581
 *    becomes a space and <0xNN> the byte NN; byte-level BPE maps each code
 *    point back to its byte; user-defined tokens are their raw text.
 */
#define _GNU_SOURCE /* memmem, qsort_r */
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/common.h"
#include "text/tok_internal.h"

#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_MERGES (1u << 25)
#define TOK_MAX_POOL ((size_t)1 << 30)

/* ---- small helpers ---------------------------------------------------- */

int tok_ids_push(tok_ids_t *a, int32_t id) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, nc * sizeof *v);
        if (!v) return TERN_ENOMEM;
        a->v = v;
        a->cap = nc;
    }
    a->v[a->n++] = id;
    return 0;
}

/* utf8proc's decoder rejects every invalid form (overlong, surrogate, beyond
 * U+10FFFF, bad or missing continuation bytes). */
size_t tok_utf8_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    if (s[0] < 0x80) return 1;
    utf8proc_int32_t cp;
    utf8proc_ssize_t r = utf8proc_iterate(s, (utf8proc_ssize_t)(n < 4 ? n : 4), &cp);
    return r > 0 ? (size_t)r : 0;
}

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)(unsigned char)p[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

/* The table stores (id, high hash bits) so that most probes that miss are
 * decided without touching the token text. */
int32_t tok_lookup(const tokenizer_t *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & t->ht_mask;; i = (i + 1) & t->ht_mask) {
        int32_t id = t->ht[i].id;
        if (id < 0) return -1;
        if (t->ht[i].tag == tag && t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return id;
    }
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* ---- building ----------------------------------------------------------- */

void tok_free(tokenizer_t *t) {
    if (!t) return;
    free(t->text_pool);
    free(t->text_off);
    free(t->text_len);
    free(t->scores);
    free(t->type);
    free(t->attr);
    free(t->piece_pool);
    free(t->piece_off);
    free(t->piece_len);
    free(t->ht);
    free(t->merges);
    tok_pre_free(t->pre);
    free(t->eog);
    free(t->trie_root);
    free(t->trie);
    free(t);
}

/* Texts that end a turn in the chat formats we know; llama.cpp keys
 * end-of-generation on the same list. */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "</s>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>", "<｜end▁of▁sentence｜>",
};
/* The same order llama.cpp uses to pick an EOT id when the file names none. */
static const char *const EOT_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
};

static int32_t resolve_id(int32_t v, int32_t dflt, int32_t n_vocab) {
    if (dflt >= n_vocab) dflt = -1;
    if (v == -2 || v < -2 || v >= n_vocab) return dflt;
    return v;
}

static int build_trie(tokenizer_t *t) {
    size_t n_nodes = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (TA_CONTROL | TA_USER | TA_UNKNOWN)) n_nodes += t->text_len[id];
    t->trie_root = malloc(256 * sizeof *t->trie_root);
    t->trie = malloc((n_nodes ? n_nodes : 1) * sizeof *t->trie);
    if (!t->trie_root || !t->trie) return TERN_ENOMEM;
    for (int i = 0; i < 256; i++) t->trie_root[i] = -1;
    t->trie_n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & (TA_CONTROL | TA_USER | TA_UNKNOWN))) continue;
        const unsigned char *s = (const unsigned char *)tok_text(t, id);
        int32_t *link = &t->trie_root[s[0]];
        int32_t node = -1;
        for (uint32_t k = 0; k < t->text_len[id]; k++) {
            if (k > 0) link = &t->trie[node].child;
            /* find s[k] among the siblings at *link */
            int32_t c = *link;
            while (c >= 0 && (k > 0 && t->trie[c].byte != s[k])) c = t->trie[c].sibling;
            if (c < 0) {
                TERN_CHECK(t->trie_n < n_nodes);
                c = (int32_t)t->trie_n++;
                t->trie[c] = (struct tok_trie_node){-1, k > 0 ? *link : -1, -1, s[k]};
                *link = c;
            }
            node = c;
        }
        if (t->trie[node].tok < 0) t->trie[node].tok = id; /* first id wins for duplicates */
    }
    return 0;
}

/* Bytes a token stands for, appended at dst; returns the length. */
static size_t decode_token(const tokenizer_t *t, int32_t id, char *dst) {
    const char *s = tok_text(t, id);
    size_t n = t->text_len[id];
    uint16_t a = t->attr[id];
    if (a & (TA_CONTROL | TA_UNKNOWN | TA_USER)) {
        memcpy(dst, s, n);
        return n;
    }
    if ((a & TA_BYTE) && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && isxdigit((unsigned char)s[3]) &&
        isxdigit((unsigned char)s[4])) {
        char hex[3] = {s[3], s[4], 0};
        dst[0] = (char)strtol(hex, NULL, 16);
        return 1;
    }
    size_t k = 0;
    if (t->kind == TOK_KIND_SPM) {
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                dst[k++] = ' ';
                i += 3;
            } else {
                dst[k++] = s[i++];
            }
        }
        return k;
    }
    for (size_t i = 0; i < n;) {
        size_t cl = tok_utf8_len((const unsigned char *)s + i, n - i);
        if (cl == 0) { /* not UTF-8: keep the byte as it is */
            dst[k++] = s[i++];
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)cl, &cp);
        int b = tok_cp_to_byte((uint32_t)cp);
        if (b >= 0) {
            dst[k++] = (char)b;
        } else { /* a code point outside the byte map stands for itself */
            memcpy(dst + k, s + i, cl);
            k += cl;
        }
        i += cl;
    }
    return k;
}

tokenizer_t *tok_new(const tok_spec_t *spec, tern_error_t *err) {
    if (!spec || !spec->model) {
        tern_err(err, TERN_EINVAL, "tok_new: no spec or no tokenizer model");
        return NULL;
    }
    int kind = !strcmp(spec->model, "llama") ? TOK_KIND_SPM : !strcmp(spec->model, "gpt2") ? TOK_KIND_BPE : 0;
    if (!kind) {
        tern_err(err, TERN_EUNSUP, "tokenizer.ggml.model '%.64s' is not supported (llama = SPM, gpt2 = byte-level BPE)",
                 spec->model);
        return NULL;
    }
    if (spec->n_vocab <= 0 || spec->n_vocab > TOK_MAX_VOCAB || !spec->tokens) {
        tern_err(err, TERN_EFORMAT, "tokenizer.ggml.tokens: %d tokens (expected 1..%d)", (int)spec->n_vocab,
                 TOK_MAX_VOCAB);
        return NULL;
    }
    if (kind == TOK_KIND_BPE && spec->n_merges > 0 && !spec->merges) {
        tern_err(err, TERN_EINVAL, "tok_new: n_merges without merges");
        return NULL;
    }
    if (spec->n_merges > TOK_MAX_MERGES) {
        tern_err(err, TERN_EFORMAT, "tokenizer.ggml.merges: %llu merges (at most %u)",
                 (unsigned long long)spec->n_merges, TOK_MAX_MERGES);
        return NULL;
    }
    const int32_t n = spec->n_vocab;
    tokenizer_t *t = calloc(1, sizeof *t);
    if (!t) goto oom;
    t->kind = kind;
    t->n_vocab = n;
    snprintf(t->model, sizeof t->model, "%s", kind == TOK_KIND_SPM ? "llama" : "gpt2");

    /* texts: an empty token gets a placeholder text "[EMPTY_<id>]" (as in
     * llama.cpp), since an empty text would match everywhere */
    size_t pool = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t l = spec->tokens[i].len;
        if (l > 0 && !spec->tokens[i].data) {
            tern_err(err, TERN_EINVAL, "tok_new: token %d has no text", (int)i);
            goto fail;
        }
        if (l == 0) l = 20;
        if (l > TOK_MAX_POOL || pool + l + 1 > TOK_MAX_POOL) {
            tern_err(err, TERN_EFORMAT, "tokenizer.ggml.tokens: token %d: texts exceed %zu bytes in all", (int)i,
                     TOK_MAX_POOL);
            goto fail;
        }
        pool += l + 1;
    }
    t->text_pool = malloc(pool);
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->scores = malloc((size_t)n * sizeof *t->scores);
    t->type = malloc((size_t)n);
    t->attr = calloc((size_t)n, sizeof *t->attr);
    t->eog = calloc((size_t)n, 1);
    t->piece_pool = malloc(pool);
    t->piece_off = malloc((size_t)n * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)n * sizeof *t->piece_len);
    size_t ht_cap = pow2_at_least(2 * (size_t)n);
    t->ht = malloc(ht_cap * sizeof *t->ht);
    if (!t->text_pool || !t->text_off || !t->text_len || !t->scores || !t->type || !t->attr || !t->eog ||
        !t->piece_pool || !t->piece_off || !t->piece_len || !t->ht)
        goto oom;
    t->ht_mask = ht_cap - 1;
    for (size_t i = 0; i < ht_cap; i++) t->ht[i].id = -1;
    size_t pos = 0;
    for (int32_t i = 0; i < n; i++) {
        t->text_off[i] = pos;
        if (spec->tokens[i].len == 0) {
            int w = snprintf(t->text_pool + pos, 21, "[EMPTY_%d]", (int)i);
            t->text_len[i] = (uint32_t)w;
        } else {
            memcpy(t->text_pool + pos, spec->tokens[i].data, spec->tokens[i].len);
            t->text_len[i] = (uint32_t)spec->tokens[i].len;
        }
        t->text_pool[pos + t->text_len[i]] = 0;
        pos += t->text_len[i] + 1;
        float sc = spec->scores ? spec->scores[i] : 0.0f;
        t->scores[i] = isnan(sc) ? -FLT_MAX : sc;
        int ty = spec->types ? spec->types[i] : TOK_TYPE_NORMAL;
        if (ty < 0 || ty > TOK_TYPE_BYTE) ty = TOK_TYPE_UNDEFINED;
        t->type[i] = (uint8_t)ty;
        switch (ty) {
        case TOK_TYPE_UNKNOWN: t->attr[i] = TA_UNKNOWN; break;
        case TOK_TYPE_CONTROL: t->attr[i] = TA_CONTROL; break;
        case TOK_TYPE_USER_DEFINED: t->attr[i] = TA_USER | TA_MERGEABLE; break;
        case TOK_TYPE_UNUSED: t->attr[i] = TA_UNUSED; break;
        case TOK_TYPE_BYTE: t->attr[i] = TA_BYTE; break;
        default: t->attr[i] = TA_NORMAL | TA_MERGEABLE; break;
        }
        /* text -> id; the first id of a duplicated text wins */
        if (tok_lookup(t, tok_text(t, i), t->text_len[i]) < 0) {
            uint64_t h = hash_bytes(tok_text(t, i), t->text_len[i]);
            size_t k = h & t->ht_mask;
            while (t->ht[k].id >= 0) k = (k + 1) & t->ht_mask;
            t->ht[k].id = i;
            t->ht[k].tag = (uint32_t)(h >> 32);
        }
    }

    /* special ids and flags */
    bool spm = kind == TOK_KIND_SPM;
    tok_pre_info_t info = {0};
    if (!spm) {
        const char *pre = spec->pre && *spec->pre ? spec->pre : "default";
        t->pre = tok_pre_new(pre, strlen(pre), &info, err);
        if (!t->pre) goto fail;
        snprintf(t->pre_name, sizeof t->pre_name, "%s", pre);
        t->ignore_merges = info.ignore_merges;
    }
    t->bos = resolve_id(spec->bos, spm ? 1 : -1, n);
    t->eos = resolve_id(spec->eos, spm ? 2 : -1, n);
    t->unk = resolve_id(spec->unk, spm ? 0 : -1, n);
    t->eot = resolve_id(spec->eot, -1, n);
    t->eom = resolve_id(spec->eom, -1, n);
    t->pad = resolve_id(spec->pad, -1, n);
    t->add_bos = spec->add_bos >= 0 ? spec->add_bos != 0 : (spm ? true : info.add_bos_default);
    t->add_eos = spec->add_eos > 0;
    t->add_space_prefix = spm && (spec->add_space_prefix >= 0 ? spec->add_space_prefix != 0 : true);
    if (t->bos < 0) t->add_bos = false;
    if (t->eos < 0) t->add_eos = false;

    for (size_t k = 0; t->eot < 0 && k < sizeof EOT_TEXTS / sizeof EOT_TEXTS[0]; k++)
        t->eot = tok_lookup(t, EOT_TEXTS[k], strlen(EOT_TEXTS[k]));
    if (t->eom < 0) t->eom = tok_lookup(t, "<|eom_id|>", 10);
    for (size_t k = 0; k < sizeof EOG_TEXTS / sizeof EOG_TEXTS[0]; k++) {
        int32_t id = tok_lookup(t, EOG_TEXTS[k], strlen(EOG_TEXTS[k]));
        if (id >= 0) t->eog[id] = 1;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    for (int32_t i = 0; i < n; i++) {
        if (t->eog[i]) t->attr[i] |= TA_CONTROL;
        if (t->attr[i] & TA_CONTROL) t->attr[i] &= (uint16_t)~TA_MERGEABLE;
    }
    /* Phi-3's added tokens swallow the whitespace on their right. */
    if (spec->name) {
        char lower[128];
        size_t ln = strlen(spec->name);
        if (ln >= sizeof lower) ln = sizeof lower - 1;
        for (size_t i = 0; i < ln; i++) lower[i] = (char)tolower((unsigned char)spec->name[i]);
        lower[ln] = 0;
        if (strstr(lower, "phi-3") || strstr(lower, "phi3")) {
            for (int32_t i = 0; i < n; i++)
                if (t->attr[i] & (TA_CONTROL | TA_USER | TA_UNKNOWN)) t->attr[i] |= TA_RSTRIP;
            int32_t id = tok_lookup(t, "</s>", 4);
            if (id >= 0) t->attr[id] |= TA_RSTRIP;
            const char *keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (int k = 0; k < 3; k++)
                if ((id = tok_lookup(t, keep[k], strlen(keep[k]))) >= 0) t->attr[id] &= (uint16_t)~TA_RSTRIP;
        }
    }
    for (int32_t i = 0; i < n; i++)
        if (t->attr[i] & (TA_LSTRIP | TA_RSTRIP)) t->has_strip = true;

    if (spm) {
        t->spm_split_words = true;
        for (int32_t i = 0; i < n && t->spm_split_words; i++) {
            if (!(t->attr[i] & TA_MERGEABLE)) continue;
            const char *s = tok_text(t, i);
            for (size_t k = 1; k + 3 <= t->text_len[i]; k++)
                if (memcmp(s + k, "\xe2\x96\x81", 3) == 0 && !(k >= 3 && memcmp(s + k - 3, "\xe2\x96\x81", 3) == 0)) {
                    t->spm_split_words = false;
                    break;
                }
        }
    }

    /* byte tokens */
    t->bytes_complete = true;
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t l;
        if (spm) {
            l = (size_t)snprintf(s, sizeof s, "<0x%02X>", b);
        } else {
            uint32_t cp = tok_byte_to_cp((uint8_t)b);
            if (cp < 0x80) {
                s[0] = (char)cp;
                l = 1;
            } else {
                s[0] = (char)(0xC0 | (cp >> 6));
                s[1] = (char)(0x80 | (cp & 0x3F));
                l = 2;
            }
        }
        t->byte_tok[b] = tok_lookup(t, s, l);
    }

    /* merges: "left right" -> rank; only rules whose sides are tokens can
     * ever apply, since symbols are always tokens */
    if (!spm) {
        size_t cap = pow2_at_least(2 * (size_t)spec->n_merges + 1);
        t->merges = malloc(cap * sizeof *t->merges);
        if (!t->merges) goto oom;
        t->merges_mask = cap - 1;
        for (size_t i = 0; i < cap; i++) t->merges[i].key = TOK_MERGE_EMPTY;
        char *cat = NULL;
        size_t cat_cap = 0;
        for (uint64_t i = 0; i < spec->n_merges; i++) {
            const char *s = spec->merges[i].data;
            size_t l = spec->merges[i].len;
            if (!s || l < 3) continue;
            const char *sp = memchr(s + 1, ' ', l - 1);
            if (!sp) continue;
            size_t ll = (size_t)(sp - s), rl = l - ll - 1;
            int32_t a = tok_lookup(t, s, ll), b = tok_lookup(t, sp + 1, rl);
            if (a < 0 || b < 0) continue;
            if (ll + rl > cat_cap) {
                char *c = realloc(cat, ll + rl);
                if (!c) {
                    free(cat);
                    goto oom;
                }
                cat = c;
                cat_cap = ll + rl;
            }
            memcpy(cat, s, ll);
            memcpy(cat + ll, sp + 1, rl);
            tok_merge_insert(t->merges, t->merges_mask, a, b, (int32_t)i, tok_lookup(t, cat, ll + rl));
        }
        free(cat);
    }

    if (build_trie(t)) goto oom;

    /* decoded pieces; never longer than the raw texts */
    pos = 0;
    for (int32_t i = 0; i < n; i++) {
        t->piece_off[i] = pos;
        size_t l = decode_token(t, i, t->piece_pool + pos);
        TERN_CHECK(l <= t->text_len[i]);
        t->piece_len[i] = (uint32_t)l;
        t->piece_pool[pos + l] = 0;
        pos += l + 1;
    }
    /* A byte is spelled faithfully when its token decodes to that byte:
     * DeepSeek's vocabs hold some byte-level symbols as user-defined tokens,
     * which (in the reference tokenizers too) decode to their text. */
    for (int b = 0; b < 256; b++) {
        int32_t id = t->byte_tok[b];
        t->byte_exact[b] = id >= 0 && t->piece_len[id] == 1 && (unsigned char)t->piece_pool[t->piece_off[id]] == b;
        if (!t->byte_exact[b]) t->bytes_complete = false;
    }
    return t;
oom:
    tern_err(err, TERN_ENOMEM, "out of memory building the tokenizer");
fail:
    tok_free(t);
    return NULL;
}

/* ---- loading from GGUF --------------------------------------------------- */

/* Element i of a numeric array as int64; false for non-integer types. */
static bool arr_int(const gguf_kv_t *kv, uint64_t i, int64_t *v) {
    const unsigned char *p = gguf_arr_data(kv);
    switch (gguf_arr_type(kv)) {
    case GGUF_UINT8: *v = p[i]; return true;
    case GGUF_INT8: *v = (int8_t)p[i]; return true;
    case GGUF_UINT16: { uint16_t x; memcpy(&x, p + 2 * i, 2); *v = x; return true; }
    case GGUF_INT16: { int16_t x; memcpy(&x, p + 2 * i, 2); *v = x; return true; }
    case GGUF_UINT32: { uint32_t x; memcpy(&x, p + 4 * i, 4); *v = x; return true; }
    case GGUF_INT32: { int32_t x; memcpy(&x, p + 4 * i, 4); *v = x; return true; }
    case GGUF_UINT64: { uint64_t x; memcpy(&x, p + 8 * i, 8); *v = x > INT64_MAX ? INT64_MAX : (int64_t)x; return true; }
    case GGUF_INT64: memcpy(v, p + 8 * i, 8); return true;
    default: return false;
    }
}

static int get_id(const gguf_file_t *f, const char *key, int32_t *out, tern_error_t *err) {
    *out = -2;
    if (!gguf_find(f, key)) return 0;
    int64_t v;
    int rc = gguf_get_i64(f, key, &v, err);
    if (rc) return rc;
    *out = v < 0 || v > INT32_MAX ? -3 : (int32_t)v; /* out of range: resolve_id falls back */
    return 0;
}

static int get_flag(const gguf_file_t *f, const char *key, int *out, tern_error_t *err) {
    *out = -1;
    if (!gguf_find(f, key)) return 0;
    bool b;
    int rc = gguf_get_bool(f, key, &b, err);
    if (rc) return rc;
    *out = b;
    return 0;
}

static const gguf_kv_t *find_array(const gguf_file_t *f, const char *key, gguf_vtype_t want, bool need,
                                   tern_error_t *err) {
    const gguf_kv_t *kv = gguf_find(f, key);
    if (!kv) {
        if (need) tern_err(err, TERN_EFORMAT, "metadata key '%s' not found", key);
        return NULL;
    }
    if (gguf_kv_type(kv) != GGUF_ARRAY || (want != GGUF_TYPE_COUNT && gguf_arr_type(kv) != want)) {
        tern_err(err, TERN_EFORMAT, "metadata key '%s' has the wrong type (expected an array of %s)", key,
                 want == GGUF_STRING ? "strings" : "numbers");
        return NULL;
    }
    return kv;
}

tokenizer_t *tok_load(const gguf_file_t *f, tern_error_t *err) {
    if (!f) {
        tern_err(err, TERN_EINVAL, "tok_load: no file");
        return NULL;
    }
    tok_spec_t sp = {0};
    char model[32], pre[64], name[128];
    gguf_str_t *tokens = NULL, *merges = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    tokenizer_t *t = NULL;
    gguf_str_t s;

    if (!gguf_find(f, "tokenizer.ggml.model")) {
        tern_err(err, TERN_EFORMAT, "no tokenizer in this file (metadata key 'tokenizer.ggml.model' not found)");
        return NULL;
    }
    if (gguf_get_str(f, "tokenizer.ggml.model", &s, err)) return NULL;
    snprintf(model, sizeof model, "%.*s", (int)(s.len < 31 ? s.len : 31), s.data);
    if (s.len >= sizeof model) {
        tern_err(err, TERN_EUNSUP, "tokenizer.ggml.model '%s...' is not supported", model);
        return NULL;
    }
    sp.model = model;
    pre[0] = 0;
    if (gguf_find(f, "tokenizer.ggml.pre")) {
        if (gguf_get_str(f, "tokenizer.ggml.pre", &s, err)) return NULL;
        if (s.len >= sizeof pre) {
            tern_err(err, TERN_EUNSUP, "tokenizer.ggml.pre: unknown pre-tokenizer '%.48s...'", s.data);
            return NULL;
        }
        snprintf(pre, sizeof pre, "%.*s", (int)s.len, s.data);
        if (strlen(pre) != s.len) {
            tern_err(err, TERN_EFORMAT, "tokenizer.ggml.pre contains a NUL byte");
            return NULL;
        }
    }
    sp.pre = pre;
    if (gguf_find(f, "general.name") && gguf_get_str(f, "general.name", &s, NULL) == 0) {
        snprintf(name, sizeof name, "%.*s", (int)(s.len < sizeof name - 1 ? s.len : sizeof name - 1), s.data);
        sp.name = name;
    }

    const gguf_kv_t *kt = find_array(f, "tokenizer.ggml.tokens", GGUF_STRING, true, err);
    if (!kt) return NULL;
    uint64_t n = gguf_arr_len(kt);
    if (n == 0 || n > TOK_MAX_VOCAB) {
        tern_err(err, TERN_EFORMAT, "tokenizer.ggml.tokens: %llu tokens (expected 1..%d)", (unsigned long long)n,
                 TOK_MAX_VOCAB);
        return NULL;
    }
    sp.n_vocab = (int32_t)n;
    tokens = malloc(n * sizeof *tokens);
    if (!tokens) goto oom;
    for (uint64_t i = 0; i < n; i++) tokens[i] = gguf_arr_str(kt, i);
    sp.tokens = tokens;

    const gguf_kv_t *ks = find_array(f, "tokenizer.ggml.scores", GGUF_TYPE_COUNT, false, err);
    if (ks) {
        if (gguf_arr_len(ks) < n) {
            tern_err(err, TERN_EFORMAT, "tokenizer.ggml.scores: %llu scores for %llu tokens",
                     (unsigned long long)gguf_arr_len(ks), (unsigned long long)n);
            goto fail;
        }
        scores = malloc(n * sizeof *scores);
        if (!scores) goto oom;
        const unsigned char *p = gguf_arr_data(ks);
        for (uint64_t i = 0; i < n; i++) {
            int64_t v;
            if (gguf_arr_type(ks) == GGUF_FLOAT32) {
                memcpy(&scores[i], p + 4 * i, 4);
            } else if (arr_int(ks, i, &v)) {
                scores[i] = (float)v;
            } else {
                tern_err(err, TERN_EFORMAT, "tokenizer.ggml.scores: expected an array of f32");
                goto fail;
            }
        }
        sp.scores = scores;
    } else if (gguf_find(f, "tokenizer.ggml.scores")) {
        goto fail; /* wrong type: find_array set the message */
    }

    const gguf_kv_t *ky = find_array(f, "tokenizer.ggml.token_type", GGUF_TYPE_COUNT, false, err);
    if (ky) {
        if (gguf_arr_len(ky) < n) {
            tern_err(err, TERN_EFORMAT, "tokenizer.ggml.token_type: %llu types for %llu tokens",
                     (unsigned long long)gguf_arr_len(ky), (unsigned long long)n);
            goto fail;
        }
        types = malloc(n * sizeof *types);
        if (!types) goto oom;
        for (uint64_t i = 0; i < n; i++) {
            int64_t v;
            if (!arr_int(ky, i, &v)) {
                tern_err(err, TERN_EFORMAT, "tokenizer.ggml.token_type: expected an array of integers");
                goto fail;
            }
            types[i] = v < 0 || v > TOK_TYPE_BYTE ? TOK_TYPE_UNDEFINED : (int32_t)v;
        }
        sp.types = types;
    } else if (gguf_find(f, "tokenizer.ggml.token_type")) {
        goto fail;
    }

    if (!strcmp(model, "gpt2")) {
        const gguf_kv_t *km = find_array(f, "tokenizer.ggml.merges", GGUF_STRING, true, err);
        if (!km) goto fail;
        uint64_t nm = gguf_arr_len(km);
        if (nm > TOK_MAX_MERGES) {
            tern_err(err, TERN_EFORMAT, "tokenizer.ggml.merges: %llu merges (at most %u)", (unsigned long long)nm,
                     TOK_MAX_MERGES);
            goto fail;
        }
        merges = malloc((nm ? nm : 1) * sizeof *merges);
        if (!merges) goto oom;
        for (uint64_t i = 0; i < nm; i++) merges[i] = gguf_arr_str(km, i);
        sp.merges = merges;
        sp.n_merges = nm;
    }

    if (get_id(f, "tokenizer.ggml.bos_token_id", &sp.bos, err) || get_id(f, "tokenizer.ggml.eos_token_id", &sp.eos, err) ||
        get_id(f, "tokenizer.ggml.eot_token_id", &sp.eot, err) || get_id(f, "tokenizer.ggml.eom_token_id", &sp.eom, err) ||
        get_id(f, "tokenizer.ggml.unknown_token_id", &sp.unk, err) ||
        get_id(f, "tokenizer.ggml.padding_token_id", &sp.pad, err) ||
        get_flag(f, "tokenizer.ggml.add_bos_token", &sp.add_bos, err) ||
        get_flag(f, "tokenizer.ggml.add_eos_token", &sp.add_eos, err) ||
        get_flag(f, "tokenizer.ggml.add_space_prefix", &sp.add_space_prefix, err))
        goto fail;

    t = tok_new(&sp, err);
    goto done;
oom:
    tern_err(err, TERN_ENOMEM, "out of memory reading the tokenizer");
fail:
    t = NULL;
done:
    free(tokens);
    free(merges);
    free(scores);
    free(types);
    return t;
}

/* ---- accessors ----------------------------------------------------------- */

int32_t tok_n_vocab(const tokenizer_t *t) { return t ? t->n_vocab : 0; }
int32_t tok_bos(const tokenizer_t *t) { return t ? t->bos : -1; }
int32_t tok_eos(const tokenizer_t *t) { return t ? t->eos : -1; }
int32_t tok_eot(const tokenizer_t *t) { return t ? t->eot : -1; }
int32_t tok_unk(const tokenizer_t *t) { return t ? t->unk : -1; }
bool tok_add_bos(const tokenizer_t *t) { return t && t->add_bos; }
bool tok_add_eos(const tokenizer_t *t) { return t && t->add_eos; }
bool tok_bytes_complete(const tokenizer_t *t) { return t && t->bytes_complete; }
bool tok_can_represent(const tokenizer_t *t, const char *text, size_t len) {
    if (!t || (!text && len)) return false;
    for (size_t i = 0; i < len; i++)
        if (!t->byte_exact[(unsigned char)text[i]]) return false;
    return true;
}
bool tok_is_eog(const tokenizer_t *t, int32_t id) { return t && id >= 0 && id < t->n_vocab && t->eog[id]; }
const char *tok_model_name(const tokenizer_t *t) { return t ? t->model : ""; }
const char *tok_pre_name(const tokenizer_t *t) { return t && t->kind == TOK_KIND_BPE ? t->pre_name : ""; }
int tok_token_type(const tokenizer_t *t, int32_t id) { return t && id >= 0 && id < t->n_vocab ? t->type[id] : -1; }
bool tok_is_control(const tokenizer_t *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & (TA_CONTROL | TA_UNKNOWN));
}
const char *tok_token_text(const tokenizer_t *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->text_len[id];
    return tok_text(t, id);
}
int32_t tok_find(const tokenizer_t *t, const char *text, size_t len) {
    return t && (text || !len) ? tok_lookup(t, text ? text : "", len) : -1;
}
const char *tok_piece(const tokenizer_t *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->piece_len[id];
    return t->piece_pool + t->piece_off[id];
}

/* ---- encoding -------------------------------------------------------------- */

typedef struct {
    uint32_t off, len;
    int32_t tok; /* -1: plain text */
} frag_t;

typedef struct {
    frag_t *v;
    size_t n, cap;
} frags_t;

static int frags_push(frags_t *a, uint32_t off, uint32_t len, int32_t tok) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 16;
        frag_t *v = realloc(a->v, nc * sizeof *v);
        if (!v) return TERN_ENOMEM;
        a->v = v;
        a->cap = nc;
    }
    a->v[a->n++] = (frag_t){off, len, tok};
    return 0;
}

static bool special_eligible(const tokenizer_t *t, int32_t id, bool parse_special) {
    return parse_special || !(t->attr[id] & (TA_CONTROL | TA_UNKNOWN));
}

/* Longer texts first; ties by id (llama.cpp leaves that order unspecified). */
static int cmp_special_r(const void *a, const void *b, void *ctx) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const tokenizer_t *t = ctx;
    uint32_t lx = t->text_len[x], ly = t->text_len[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return (x > y) - (x < y);
}

/* Cut the special tokens out of text, in llama.cpp's order (see the file
 * comment). First the trie finds which specials occur at all, so the
 * per-token passes only run for those. */
static int partition(const tokenizer_t *t, const char *text, size_t len, bool parse_special, frags_t *out) {
    int32_t *found = NULL;
    size_t n_found = 0, cap_found = 0;
    uint8_t *seen = NULL; /* bit set over ids, made at the first match */
    frags_t a = {0}, b = {0};
    int rc = TERN_ENOMEM;
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++) {
        int32_t node = t->trie_root[u[i]];
        for (size_t k = i; node >= 0;) {
            int32_t id = t->trie[node].tok;
            if (id >= 0 && special_eligible(t, id, parse_special)) {
                if (!seen && !(seen = calloc((size_t)t->n_vocab / 8 + 1, 1))) goto done;
                if (!(seen[id >> 3] & (1u << (id & 7)))) {
                    seen[id >> 3] |= (uint8_t)(1u << (id & 7));
                    if (n_found == cap_found) {
                        size_t nc = cap_found ? 2 * cap_found : 16;
                        int32_t *f = realloc(found, nc * sizeof *f);
                        if (!f) goto done;
                        found = f;
                        cap_found = nc;
                    }
                    found[n_found++] = id;
                }
            }
            if (++k >= len) break;
            int32_t c = t->trie[node].child;
            while (c >= 0 && t->trie[c].byte != u[k]) c = t->trie[c].sibling;
            node = c;
        }
    }
    if (len && frags_push(&a, 0, (uint32_t)len, -1)) goto done;
    if (n_found > 1) qsort_r(found, n_found, sizeof *found, cmp_special_r, (void *)t);
    for (size_t s = 0; s < n_found; s++) {
        int32_t id = found[s];
        const char *st = tok_text(t, id);
        size_t sl = t->text_len[id];
        uint16_t at = t->attr[id];
        b.n = 0;
        for (size_t i = 0; i < a.n; i++) {
            frag_t fr = a.v[i];
            if (fr.tok >= 0) {
                if (frags_push(&b, fr.off, fr.len, fr.tok)) goto done;
                continue;
            }
            size_t off = fr.off, rem = fr.len;
            for (;;) {
                const char *m = rem >= sl ? memmem(text + off, rem, st, sl) : NULL;
                if (!m) {
                    if (rem && frags_push(&b, (uint32_t)off, (uint32_t)rem, -1)) goto done;
                    break;
                }
                size_t mo = (size_t)(m - text), ll = mo - off;
                if (at & TA_LSTRIP)
                    while (ll > 0 && isspace((unsigned char)text[off + ll - 1])) ll--;
                if (ll && frags_push(&b, (uint32_t)off, (uint32_t)ll, -1)) goto done;
                if (frags_push(&b, (uint32_t)mo, (uint32_t)sl, id)) goto done;
                size_t ro = mo + sl, rl = off + rem - ro;
                if (at & TA_RSTRIP)
                    while (rl > 0 && isspace((unsigned char)text[ro])) ro++, rl--;
                off = ro;
                rem = rl;
            }
        }
        frags_t tmp = a;
        a = b;
        b = tmp;
    }
    *out = a;
    a.v = NULL;
    rc = 0;
done:
    free(found);
    free(seen);
    free(a.v);
    free(b.v);
    return rc;
}

int tok_encode(const tokenizer_t *t, const char *text, size_t len, bool add_bos, bool parse_special, int32_t **ids,
               size_t *n_ids, tern_error_t *err) {
    if (!t || !ids || !n_ids || (!text && len)) return tern_err(err, TERN_EINVAL, "tok_encode: bad arguments");
    *ids = NULL;
    *n_ids = 0;
    if (len > TOK_MAX_TEXT)
        return tern_err(err, TERN_EINVAL, "text of %zu bytes is too long to tokenize (at most %u)", len, TOK_MAX_TEXT);
    tok_ids_t out = {0};
    frags_t fr = {0};
    int rc = 0;
    if (add_bos) {
        if (t->bos < 0) return tern_err(err, TERN_EINVAL, "tok_encode: BOS requested but the vocab has no BOS token");
        if (tok_ids_push(&out, t->bos)) goto oom;
    }
    if (len && partition(t, text, len, parse_special, &fr)) goto oom;
    bool prev_special = true; /* SPM: the first fragment gets the dummy space */
    for (size_t i = 0; i < fr.n && rc == 0; i++) {
        const frag_t *f = &fr.v[i];
        if (f->tok >= 0) {
            if (tok_ids_push(&out, f->tok)) goto oom;
            prev_special = true;
        } else if (t->kind == TOK_KIND_SPM) {
            rc = tok_spm_encode(t, text + f->off, f->len, t->add_space_prefix && prev_special, &out, err);
            prev_special = false;
        } else {
            rc = tok_bpe_encode(t, text + f->off, f->len, &out, err);
        }
    }
    free(fr.v);
    if (rc) {
        free(out.v);
        return rc;
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v))) goto oom;
    *ids = out.v;
    *n_ids = out.n;
    return 0;
oom:
    free(fr.v);
    free(out.v);
    return tern_err(err, TERN_ENOMEM, "out of memory");
}

/* ---- decoding ---------------------------------------------------------------- */

int tok_decode(const tokenizer_t *t, const int32_t *ids, size_t n, bool special, char **out, size_t *out_len,
               tern_error_t *err) {
    if (!t || (!ids && n) || !out) return tern_err(err, TERN_EINVAL, "tok_decode: bad arguments");
    *out = NULL;
    if (out_len) *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return tern_err(err, TERN_EINVAL, "tok_decode: id %d at position %zu is outside the vocab (0..%d)",
                            (int)ids[i], i, (int)t->n_vocab - 1);
        total += t->piece_len[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return tern_err(err, TERN_ENOMEM, "out of memory");
    size_t k = 0;
    bool first = t->kind == TOK_KIND_SPM && t->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        const char *p = t->piece_pool + t->piece_off[ids[i]];
        size_t l = t->piece_len[ids[i]];
        if (t->attr[ids[i]] & (TA_CONTROL | TA_UNKNOWN)) {
            if (!special) continue;
        } else {
            if (first && l && p[0] == ' ') p++, l--;
            first = false;
        }
        memcpy(s + k, p, l);
        k += l;
    }
    s[k] = 0;
    *out = s;
    if (out_len) *out_len = k;
    return 0;
}

void tok_stream_init(tok_stream_t *s, const tokenizer_t *t) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->first = t && t->kind == TOK_KIND_SPM && t->add_space_prefix;
}

/* Complete code points of bytes[0, n) go to out; a valid but unfinished
 * sequence at the very end is left (its length returned in *keep); every
 * maximal invalid subpart becomes U+FFFD. Returns bytes written or -1. */
static int utf8_emit(const unsigned char *bytes, size_t n, bool final, char *out, size_t cap, size_t *keep) {
    size_t k = 0;
    *keep = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = tok_utf8_len(bytes + i, n - i);
        if (cl) {
            if (k + cl > cap) return -1;
            memcpy(out + k, bytes + i, cl);
            k += cl;
            i += cl;
            continue;
        }
        /* Invalid here: find how many bytes form a valid prefix. */
        unsigned c = bytes[i];
        size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        size_t j = 1;
        if (need) {
            unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            while (j < need && i + j < n) {
                unsigned d = bytes[i + j];
                if (j == 1 ? (d < lo || d > hi) : (d & 0xC0) != 0x80) break;
                j++;
            }
            if (i + j == n && j < need && !final) { /* unfinished: hold it */
                *keep = j;
                return (int)k;
            }
        }
        if (k + 3 > cap) return -1;
        memcpy(out + k, "\xef\xbf\xbd", 3);
        k += 3;
        i += j;
    }
    return (int)k;
}

int tok_stream_push(tok_stream_t *s, int32_t id, char *out, size_t cap) {
    const tokenizer_t *t = s->t;
    if (!t || id < 0 || id >= t->n_vocab || (t->attr[id] & (TA_CONTROL | TA_UNKNOWN))) return 0;
    const char *p = t->piece_pool + t->piece_off[id];
    size_t l = t->piece_len[id];
    bool strip = s->first && l && p[0] == ' ';
    if (strip) p++, l--;
    unsigned char small[64];
    size_t np = (size_t)s->n_pending, total = np + l;
    unsigned char *buf = total <= sizeof small ? small : malloc(total);
    if (!buf) return -1;
    memcpy(buf, s->pending, np);
    memcpy(buf + np, p, l);
    size_t keep;
    int w = utf8_emit(buf, total, false, out, cap, &keep);
    if (w >= 0) {
        TERN_CHECK(keep < sizeof s->pending);
        memcpy(s->pending, buf + total - keep, keep);
        s->n_pending = (int)keep;
        s->first = false;
    }
    if (buf != small) free(buf);
    return w;
}

int tok_stream_flush(tok_stream_t *s, char *out, size_t cap) {
    size_t keep;
    int w = utf8_emit(s->pending, (size_t)s->n_pending, true, out, cap, &keep);
    if (w >= 0) s->n_pending = 0;
    return w;
}
