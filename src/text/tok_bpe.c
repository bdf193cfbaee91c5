/*
 * tok_bpe.c - byte-level BPE (GPT-2 and its descendants).
 *
 * The text is first cut into pieces by the pre-tokenizer (tok_pre.c). In each
 * piece every byte starts as one symbol: the vocab token of that byte's
 * stand-in code point (GPT-2 maps the 256 byte values to printable code
 * points so that token texts are valid UTF-8). Then, repeatedly, the adjacent
 * pair with the lowest merge rank is merged (ties: the leftmost pair), until
 * no adjacent pair has a merge rule. Symbols carry token ids, so a merge rule
 * is a hash lookup on two ids.
 *
 * Cost: the symbols form a doubly linked list and candidate pairs sit in a
 * binary heap keyed by (rank, position); a merge pushes at most two new pairs
 * and stale heap entries are recognised and dropped when popped, so a piece
 * of n bytes takes O(n log n), never a rescan of all pairs per merge.
 */
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "text/tok_internal.h"

/* GPT-2's byte map: printable Latin-1 bytes stand for themselves, the other
 * 68 bytes (controls, space, DEL, NBSP, soft hyphen ...) take the code points
 * 256, 257 ... in byte order. */
static bool byte_is_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* The 68 others, in order: 0..32 (k = 0..32), 127..160 (k = 33..66), 173
 * (k = 67), standing for code point 256 + k. */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33 + (b - 127u);
    return 256u + 67; /* 173 */
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(127 + k - 33);
    return k == 67 ? 173 : -1;
}

static size_t merge_slot(uint64_t key, size_t mask) {
    key ^= key >> 31; /* splitmix64's finalizer: every key bit moves every slot bit */
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebull;
    key ^= key >> 31;
    return (size_t)key & mask;
}

bool tok_merge_insert(tok_merge_t *tab, size_t mask, int32_t a, int32_t b, int32_t rank, int32_t result) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = merge_slot(key, mask);; i = (i + 1) & mask) {
        if (tab[i].key == key) return false; /* the first rule for a pair wins */
        if (tab[i].key == TOK_MERGE_EMPTY) {
            tab[i] = (tok_merge_t){key, rank, result};
            return true;
        }
    }
}

static const tok_merge_t *find_merge(const tokenizer_t *t, int32_t a, int32_t b) {
    if (a < 0 || b < 0 || !t->merges) return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = merge_slot(key, t->merges_mask);; i = (i + 1) & t->merges_mask) {
        const tok_merge_t *m = &t->merges[i];
        if (m->key == key) return m;
        if (m->key == TOK_MERGE_EMPTY) return NULL;
    }
}

typedef struct {
    int32_t rank, left, right, left_id, right_id;
} pair_t;

/* Heap order: lower rank first, then the leftmost pair. */
static bool pair_before(const pair_t *a, const pair_t *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

TOK_DEFINE_HEAP(heap, pair_t, pair_before)

typedef struct {
    int32_t *id, *prev, *next;
    uint32_t *start, *len;
    size_t cap;
    heap_t heap;
    char *enc; /* byte-level form of a piece (ignore_merges lookup) */
    size_t enc_cap;
} work_t;

static int work_reserve(work_t *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t nc = w->cap ? w->cap : 64;
    while (nc < n) nc *= 2;
    int32_t *id = realloc(w->id, nc * sizeof *id);
    if (id) w->id = id;
    int32_t *pv = realloc(w->prev, nc * sizeof *pv);
    if (pv) w->prev = pv;
    int32_t *nx = realloc(w->next, nc * sizeof *nx);
    if (nx) w->next = nx;
    uint32_t *st = realloc(w->start, nc * sizeof *st);
    if (st) w->start = st;
    uint32_t *ln = realloc(w->len, nc * sizeof *ln);
    if (ln) w->len = ln;
    if (!id || !pv || !nx || !st || !ln) return TERN_ENOMEM;
    w->cap = nc;
    return 0;
}

static int try_pair(const tokenizer_t *t, work_t *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const tok_merge_t *m = find_merge(t, w->id[l], w->id[r]);
    if (!m) return 0;
    return heap_push(&w->heap, (pair_t){m->rank, l, r, w->id[l], w->id[r]});
}

/* Emit the ids of bytes that could not be merged into a known token: each
 * byte's own symbol, else the unknown token, else nothing (a vocab without
 * all 256 byte symbols cannot represent the byte; llama.cpp drops it too). */
static int emit_bytes(const tokenizer_t *t, const unsigned char *s, size_t n, tok_ids_t *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[s[i]] >= 0 ? t->byte_tok[s[i]] : t->unk;
        if (id >= 0 && tok_ids_push(out, id)) return TERN_ENOMEM;
    }
    return 0;
}

static int encode_piece(const tokenizer_t *t, const unsigned char *s, size_t n, work_t *w, tok_ids_t *out) {
    if (n == 1) return emit_bytes(t, s, 1, out);
    if (t->ignore_merges) {
        /* A piece that is itself a token is taken whole (Llama 3 does this:
         * its merges do not always rebuild every token). */
        size_t need = 2 * n;
        if (need > w->enc_cap) {
            char *e = realloc(w->enc, need);
            if (!e) return TERN_ENOMEM;
            w->enc = e;
            w->enc_cap = need;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = tok_byte_to_cp(s[i]);
            if (cp < 0x80) {
                w->enc[k++] = (char)cp;
            } else {
                w->enc[k++] = (char)(0xC0 | (cp >> 6));
                w->enc[k++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t id = tok_lookup(t, w->enc, k);
        if (id >= 0) return tok_ids_push(out, id);
    }
    if (work_reserve(w, n)) return TERN_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->byte_tok[s[i]];
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        w->start[i] = (uint32_t)i;
        w->len[i] = 1;
    }
    w->heap.n = 0;
    for (size_t i = 1; i < n; i++)
        if (try_pair(t, w, (int32_t)i - 1, (int32_t)i)) return TERN_ENOMEM;
    while (w->heap.n) {
        pair_t p = heap_pop(&w->heap);
        int32_t l = p.left, r = p.right;
        /* Stale: one side was merged away, or changed since the pair was
         * queued. (A symbol only grows by absorbing its right neighbour, so
         * equal ids on both live, adjacent sides mean the same pair.) */
        if (w->len[l] == 0 || w->len[r] == 0 || w->next[l] != r || w->id[l] != p.left_id || w->id[r] != p.right_id)
            continue;
        const tok_merge_t *m = find_merge(t, p.left_id, p.right_id);
        TERN_CHECK(m != NULL);
        w->id[l] = m->result;
        w->len[l] += w->len[r];
        w->len[r] = 0;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        if (try_pair(t, w, w->prev[l], l) || try_pair(t, w, l, w->next[l])) return TERN_ENOMEM;
    }
    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        if (w->id[i] >= 0) {
            if (tok_ids_push(out, w->id[i])) return TERN_ENOMEM;
        } else if (emit_bytes(t, s + w->start[i], w->len[i], out)) {
            return TERN_ENOMEM;
        }
    }
    return 0;
}

int tok_bpe_encode(const tokenizer_t *t, const char *text, size_t len, tok_ids_t *out, tern_error_t *err) {
    tok_spans_t pieces = {0};
    work_t w = {0};
    int rc = tok_pre_split(t->pre, text, len, &pieces, err);
    for (size_t i = 0; rc == 0 && i < pieces.n; i++) {
        if (encode_piece(t, (const unsigned char *)text + pieces.v[i].off, pieces.v[i].len, &w, out))
            rc = tern_err(err, TERN_ENOMEM, "out of memory");
    }
    free(pieces.v);
    free(w.id);
    free(w.prev);
    free(w.next);
    free(w.start);
    free(w.len);
    free(w.heap.v);
    free(w.enc);
    return rc;
}
