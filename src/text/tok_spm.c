/*
 * tok_spm.c - the SentencePiece BPE algorithm of Llama 2, Mistral, Phi-3 and
 * TinyStories vocabularies (tokenizer.ggml.model = "llama").
 *
 * Spaces are written as U+2581 ("▁") and, when the model asks for it, one is
 * put in front of the text (the "dummy prefix": "Hello" is tokenized as
 * "▁Hello"). The text starts as one symbol per UTF-8 character; repeatedly the
 * adjacent pair whose concatenation is a vocab piece with the highest score is
 * merged (ties: the leftmost pair), until no adjacent pair forms a piece.
 * Symbols that are not pieces at the end are spelled with byte tokens
 * <0xNN> (byte fallback), or are one unknown token when the vocab lacks them.
 *
 * Which pieces may be formed by merging follows sentencepiece: normal and
 * user-defined ones; control, unknown, byte and unused tokens never are.
 *
 * Cost: linked list of symbols + binary heap of candidate pairs keyed by
 * (score, position); stale pairs are dropped when popped. O(n log n).
 */
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "text/tok_internal.h"

typedef struct {
    float score;
    int32_t left, right;
    uint32_t size;
} bigram_t;

/* Heap order: higher score first, then the leftmost pair. */
static bool bigram_before(const bigram_t *a, const bigram_t *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

TOK_DEFINE_HEAP(bheap, bigram_t, bigram_before)

typedef struct {
    const tokenizer_t *t;
    const char *buf;
    int32_t *prev, *next;
    uint32_t *start, *len;
    bheap_t heap;
} spm_t;

static int32_t mergeable_piece(const tokenizer_t *t, const char *s, size_t n) {
    int32_t id = tok_lookup(t, s, n);
    return id >= 0 && (t->attr[id] & TA_MERGEABLE) ? id : -1;
}

static int try_bigram(spm_t *S, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    uint32_t size = S->len[l] + S->len[r];
    int32_t id = mergeable_piece(S->t, S->buf + S->start[l], size);
    if (id < 0) return 0;
    return bheap_push(&S->heap, (bigram_t){S->t->scores[id], l, r, size});
}

/* A symbol that is not a piece: its bytes as byte tokens when the vocab has
 * them all (byte fallback), else one unknown token for the symbol. */
static int emit_fallback(const tokenizer_t *t, const unsigned char *s, size_t n, size_t where, tok_ids_t *out,
                         tern_error_t *err) {
    bool bytes = true;
    for (size_t i = 0; i < n; i++) bytes = bytes && t->byte_tok[s[i]] >= 0;
    if (bytes) {
        for (size_t i = 0; i < n; i++)
            if (tok_ids_push(out, t->byte_tok[s[i]])) return tern_err(err, TERN_ENOMEM, "out of memory");
        return 0;
    }
    if (t->unk < 0)
        return tern_err(err, TERN_EINVAL,
                        "SPM: the character at byte %zu of the escaped text (first byte 0x%02x) has no token, and the "
                        "vocab has neither byte tokens for it nor an unknown token",
                        where, s[0]);
    return tok_ids_push(out, t->unk) ? tern_err(err, TERN_ENOMEM, "out of memory") : 0;
}

/* Merge buf[w0, w1) and append its ids. */
static int encode_word(spm_t *S, size_t w0, size_t w1, tok_ids_t *out, tern_error_t *err) {
    const tokenizer_t *t = S->t;
    const char *buf = S->buf;
    /* One symbol per character; a byte that does not start a valid UTF-8
     * sequence is a symbol of its own (it will come out as a byte token).
     * Symbol indices count from 0 in each word. */
    int32_t n_sym = 0;
    for (size_t i = w0; i < w1;) {
        size_t cl = tok_utf8_len((const unsigned char *)buf + i, w1 - i);
        if (cl == 0) cl = 1;
        S->start[n_sym] = (uint32_t)i;
        S->len[n_sym] = (uint32_t)cl;
        S->prev[n_sym] = n_sym - 1;
        S->next[n_sym] = i + cl < w1 ? n_sym + 1 : -1;
        n_sym++;
        i += cl;
    }
    S->heap.n = 0;
    for (int32_t i = 1; i < n_sym; i++)
        if (try_bigram(S, i - 1, i)) goto oom;
    while (S->heap.n) {
        bigram_t b = bheap_pop(&S->heap);
        int32_t l = b.left, r = b.right;
        /* Stale when a side was merged away or grew since it was queued. */
        if (S->len[l] == 0 || S->len[r] == 0 || S->len[l] + S->len[r] != b.size) continue;
        S->len[l] += S->len[r];
        S->len[r] = 0;
        S->next[l] = S->next[r];
        if (S->next[r] >= 0) S->prev[S->next[r]] = l;
        if (try_bigram(S, S->prev[l], l) || try_bigram(S, l, S->next[l])) goto oom;
    }
    for (int32_t i = 0; i >= 0; i = S->next[i]) {
        int32_t id = mergeable_piece(t, buf + S->start[i], S->len[i]);
        if (id >= 0) {
            if (tok_ids_push(out, id)) goto oom;
        } else {
            int rc = emit_fallback(t, (const unsigned char *)buf + S->start[i], S->len[i], S->start[i], out, err);
            if (rc) return rc;
        }
    }
    return 0;
oom:
    return tern_err(err, TERN_ENOMEM, "out of memory");
}

int tok_spm_encode(const tokenizer_t *t, const char *text, size_t len, bool space_prefix, tok_ids_t *out,
                   tern_error_t *err) {
    if (len > TOK_MAX_TEXT) return tern_err(err, TERN_EINVAL, "text of %zu bytes is too long to tokenize", len);
    size_t cap = 3 * len + 3;
    char *buf = malloc(cap ? cap : 1);
    spm_t S = {.t = t, .buf = buf};
    size_t n_sym_cap = len + 1;
    S.prev = malloc(n_sym_cap * sizeof *S.prev);
    S.next = malloc(n_sym_cap * sizeof *S.next);
    S.start = malloc(n_sym_cap * sizeof *S.start);
    S.len = malloc(n_sym_cap * sizeof *S.len);
    int rc = 0;
    if (!buf || !S.prev || !S.next || !S.start || !S.len) {
        rc = tern_err(err, TERN_ENOMEM, "out of memory");
        goto done;
    }
    /* Escape spaces as U+2581, with the dummy prefix in front. */
    size_t n = 0;
    if (space_prefix) {
        memcpy(buf, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            buf[n++] = text[i];
        }
    }
    /* Merge word by word when no mergeable piece holds a U+2581 after
     * another character: then no merge can cross the start of a "▁word",
     * the words merge independently, and the result is the same as over the
     * whole text, with small heaps instead of one of the text's size. */
    size_t w0 = 0;
    for (size_t i = 0; i <= n; i++) {
        bool cut = i == n || (t->spm_split_words && i > w0 && i + 3 <= n && memcmp(buf + i, "\xe2\x96\x81", 3) == 0 &&
                              !(i >= 3 && memcmp(buf + i - 3, "\xe2\x96\x81", 3) == 0));
        if (!cut) continue;
        if (i > w0 && (rc = encode_word(&S, w0, i, out, err))) goto done;
        w0 = i;
    }
done:
    free(buf);
    free(S.prev);
    free(S.next);
    free(S.start);
    free(S.len);
    free(S.heap.v);
    return rc;
}
