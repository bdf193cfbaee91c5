/*
 * tok_internal.h - what the tokenizer files share (tokenizer.c: loading,
 * special-token partition, decoding; tok_spm.c and tok_bpe.c: the two merge
 * algorithms; tok_pre.c: the BPE pre-tokenizer regexes). Not a public API.
 */
#ifndef TERN_TOK_INTERNAL_H
#define TERN_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

enum { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 };

/* Attribute bits. They start from the GGUF token type and are then adjusted
 * the way llama.cpp adjusts them (end-of-generation texts become control,
 * Phi-3 specials strip whitespace on their right), because the reference
 * token ids our tests check were produced under those rules. */
enum {
    TA_NORMAL = 1u << 0,
    TA_UNKNOWN = 1u << 1,
    TA_CONTROL = 1u << 2,
    TA_USER = 1u << 3,
    TA_UNUSED = 1u << 4,
    TA_BYTE = 1u << 5,
    TA_LSTRIP = 1u << 6,
    TA_RSTRIP = 1u << 7,
    TA_MERGEABLE = 1u << 8, /* SPM: may be formed by merging (sentencepiece's rule) */
};

/* Largest text one tok_encode call accepts: symbol indices are int32. */
#define TOK_MAX_TEXT (1u << 28)

/* Growable vector of ids. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids_t;
int tok_ids_push(tok_ids_t *a, int32_t id); /* 0 or TERN_ENOMEM */

/* Byte span of a text. */
typedef struct {
    uint32_t off, len;
} tok_span_t;
typedef struct {
    tok_span_t *v;
    size_t n, cap;
} tok_spans_t;
int tok_spans_push(tok_spans_t *a, uint32_t off, uint32_t len);

/* Pre-tokenizer: an ordered list of regexes, each splitting every piece the
 * previous ones produced into matches and the gaps between them. */
typedef struct tok_pre tok_pre_t;
typedef struct {
    const char *name;     /* canonical name */
    bool ignore_merges;   /* a whole piece that is a token is emitted as is (llama3) */
    bool add_bos_default; /* llama3 adds BOS unless the file says otherwise */
} tok_pre_info_t;
/* NULL with an error naming the pre-tokenizer when unknown. */
tok_pre_t *tok_pre_new(const char *name, size_t name_len, tok_pre_info_t *info, tern_error_t *err);
void tok_pre_free(tok_pre_t *p);
/* Split text[0, len) into pieces appended to out (in order, covering the
 * text). */
int tok_pre_split(const tok_pre_t *p, const char *text, size_t len, tok_spans_t *out, tern_error_t *err);

/* Open-addressing hash of merges: (left id, right id) -> rank, result. */
typedef struct {
    uint64_t key; /* left << 32 | right; TOK_MERGE_EMPTY when free */
    int32_t rank;
    int32_t result; /* id of left+right, -1 if that text is not a token */
} tok_merge_t;
#define TOK_MERGE_EMPTY UINT64_MAX
/* Insert into a table of mask + 1 slots (never full); false if the pair was
 * already there. */
bool tok_merge_insert(tok_merge_t *tab, size_t mask, int32_t a, int32_t b, int32_t rank, int32_t result);

struct tokenizer {
    int kind;
    int32_t n_vocab;
    char model[16];
    char pre_name[48];

    /* token texts (raw vocab form), NUL after each */
    char *text_pool;
    size_t *text_off;
    uint32_t *text_len;
    float *scores;
    uint8_t *type;  /* TOK_TYPE_* as loaded */
    uint16_t *attr; /* TA_* */

    /* decoded pieces (bytes the token stands for) */
    char *piece_pool;
    size_t *piece_off;
    uint32_t *piece_len;

    /* raw text -> id (first id wins on duplicates) */
    struct {
        int32_t id; /* -1: free */
        uint32_t tag;
    } *ht;
    size_t ht_mask;

    /* BPE */
    tok_merge_t *merges;
    size_t merges_mask;
    tok_pre_t *pre;
    bool ignore_merges;

    /* SPM: <0xNN> token per byte; BPE: token of the byte-level symbol of
     * each byte. -1 when absent. */
    int32_t byte_tok[256];
    bool byte_exact[256]; /* byte_tok[b] decodes to exactly b */
    bool bytes_complete;  /* all 256 are */

    /* SPM: no mergeable piece has U+2581 after another character, so each
     * "▁word" can be merged on its own (see tok_spm.c). */
    bool spm_split_words;

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix;
    uint8_t *eog; /* n_vocab flags */

    /* Specials matched inside text before the merges run: control, user
     * defined and unknown tokens, found through a byte trie. */
    int32_t *trie_root;  /* 256 child node indices (-1 none) */
    struct tok_trie_node *trie;
    size_t trie_n;
    bool has_strip; /* some special strips whitespace: breaks round trips */
};

struct tok_trie_node {
    int32_t child, sibling, tok;
    uint8_t byte;
};

int32_t tok_lookup(const tokenizer_t *t, const char *s, size_t n);
static inline const char *tok_text(const tokenizer_t *t, int32_t id) { return t->text_pool + t->text_off[id]; }

/* Encode one fragment of plain text (no specials inside), appending ids.
 * SPM: space_prefix adds the leading U+2581. */
int tok_spm_encode(const tokenizer_t *t, const char *text, size_t len, bool space_prefix, tok_ids_t *out,
                   tern_error_t *err);
int tok_bpe_encode(const tokenizer_t *t, const char *text, size_t len, tok_ids_t *out, tern_error_t *err);

/* GPT-2's reversible byte <-> code point map used by byte-level BPE. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the map */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid there
 * (bad lead byte, bad continuation, overlong, surrogate, > U+10FFFF or cut
 * short by n). */
size_t tok_utf8_len(const unsigned char *s, size_t n);

/* A binary min-heap over elements of TYPE ordered by BEFORE(a, b) (true
 * when a pops first), growing by doubling: the merge queue of both the SPM
 * and the BPE encoder. Defines NAME##_t with NAME##_push (0 or TERN_ENOMEM)
 * and NAME##_pop (the heap must not be empty); free .v when done. */
#define TOK_DEFINE_HEAP(NAME, TYPE, BEFORE)                                   \
    typedef struct {                                                          \
        TYPE *v;                                                              \
        size_t n, cap;                                                        \
    } NAME##_t;                                                               \
    static int NAME##_push(NAME##_t *h, TYPE p) {                             \
        if (h->n == h->cap) {                                                 \
            size_t nc = h->cap ? h->cap * 2 : 64;                             \
            TYPE *v = realloc(h->v, nc * sizeof *v);                          \
            if (!v) return TERN_ENOMEM;                                       \
            h->v = v;                                                         \
            h->cap = nc;                                                      \
        }                                                                     \
        size_t i = h->n++;                                                    \
        while (i > 0) {                                                       \
            size_t up = (i - 1) / 2;                                          \
            if (!BEFORE(&p, &h->v[up])) break;                                \
            h->v[i] = h->v[up];                                               \
            i = up;                                                           \
        }                                                                     \
        h->v[i] = p;                                                          \
        return 0;                                                             \
    }                                                                         \
    static TYPE NAME##_pop(NAME##_t *h) {                                     \
        TYPE top = h->v[0], last = h->v[--h->n];                              \
        size_t i = 0;                                                         \
        for (;;) {                                                            \
            size_t c = 2 * i + 1;                                             \
            if (c >= h->n) break;                                             \
            if (c + 1 < h->n && BEFORE(&h->v[c + 1], &h->v[c])) c++;          \
            if (!BEFORE(&h->v[c], &last)) break;                              \
            h->v[i] = h->v[c];                                                \
            i = c;                                                            \
        }                                                                     \
        if (h->n) h->v[i] = last;                                             \
        return top;                                                           \
    }

#endif
