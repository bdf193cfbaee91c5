/*
 * fuzz_kv_cache.c - libFuzzer target for the KV sequence restore
 * (kv_seq_read) into a paged memory that other sequences share: any bytes
 * either restore or are refused, never crash or leak. A refused input
 * leaves the target sequence as it was (header errors, TERN_EKVFULL) or
 * empty (input ending inside the data); either way, and on success, every
 * other sequence keeps its positions, its block table and its rows byte
 * for byte, and the block accounting holds (used + free == n_blocks, used
 * and shared agree with the tables, every block free again once all
 * sequences are removed). An input that restores writes back
 * (kv_seq_write) to exactly the bytes the read consumed, and the target
 * then holds blocks of its own only.
 *
 * The memory: 2 layers, 2 K/V heads of 4 elements, 16 positions in 8
 * blocks of 2, 4 sequences. Before each read: sequence 0 holds 1 position,
 * sequence 3 is a fork of it (they share its block), sequence 1 holds 5
 * positions, sequence 2 is a fork of 3 of them plus 1 more (it shares 1's
 * first block and copied the second): 5 blocks used, 2 shared, 3 free.
 *
 * Input: byte 0: bit 0 picks the type (F16 or F32), bits 1-2 the sequence
 * read into, bit 3 removes sequence 3 first (sequence 0's block becomes its
 * own); the rest is the serialized sequence.
 *
 * Seeds: TERN_FUZZ_KV_SEED=DIR fuzz_kv_cache writes a valid input per type
 * into DIR (f16, f32) and exits; fuzz/seeds/fuzz_kv_cache/ holds them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "format/quant.h"
#include "model/kv_cache.h"

#define N_LAYER 2
#define N_CTX 16
#define N_HEAD_KV 2
#define HEAD_DIM 4
#define BLOCK_POS 2
#define N_BLOCKS (N_CTX / BLOCK_POS)
#define N_SEQ 4
#define ROW (N_HEAD_KV * HEAD_DIM)
#define MAX_POS_BYTES (ROW * 4)

typedef struct {
    const uint8_t *data;
    size_t size, pos;
} reader_t;

static int read_buf(void *user, void *dst, size_t len) {
    reader_t *r = user;
    if (len > r->size - r->pos) return 1;
    memcpy(dst, r->data + r->pos, len);
    r->pos += len;
    return 0;
}

typedef struct {
    uint8_t *data;
    size_t size, cap;
} writer_t;

static int write_buf(void *user, const void *src, size_t len) {
    writer_t *w = user;
    if (len > w->cap - w->size) return 1;
    memcpy(w->data + w->size, src, len);
    w->size += len;
    return 0;
}

static kv_cache_t *new_memory(int type, int64_t block_pos, int n_seq) {
    kv_layout_t lo;
    TERN_CHECK(kv_layout_init(&lo, type, N_LAYER, N_CTX, N_HEAD_KV, HEAD_DIM, block_pos, NULL) == 0);
    kv_cache_t *c = kv_cache_new(&lo, n_seq, NULL);
    TERN_CHECK(c);
    return c;
}

/* Append n positions of distinct values (offset by tag) to seq. */
static void append(kv_cache_t *c, int seq, int64_t n, float tag) {
    float k[N_CTX * ROW], v[N_CTX * ROW];
    int32_t ids[N_CTX];
    const int64_t p0 = kv_seq_n_pos(c, seq);
    for (int i = 0; i < n * ROW; i++) k[i] = tag + 0.25f * (float)(p0 * ROW + i), v[i] = -tag - 0.5f * (float)(p0 * ROW + i);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tag * 100.0f) + (int32_t)p0 + i;
    TERN_CHECK(kv_seq_reserve(c, seq, n, NULL) == 0);
    for (int64_t l = 0; l < N_LAYER; l++) kv_seq_store(c, seq, l, p0, n, k, v);
    kv_seq_put_ids(c, seq, p0, n, ids);
    TERN_CHECK(kv_seq_commit(c, seq, n, NULL) == 0);
}

/* One sequence as it stands: positions, table, ids, every K and V byte. */
typedef struct {
    int64_t n_pos, n_blk;
    int32_t blk[N_BLOCKS], ids[N_CTX];
    uint8_t rows[N_LAYER][2][N_CTX * MAX_POS_BYTES];
} seq_state_t;

static void seq_state(const kv_cache_t *c, int seq, seq_state_t *s) {
    memset(s, 0, sizeof *s);
    s->n_pos = kv_seq_n_pos(c, seq);
    s->n_blk = kv_seq_n_blocks(c, seq);
    TERN_CHECK(s->n_pos <= N_CTX && s->n_blk <= N_BLOCKS);
    if (s->n_blk) memcpy(s->blk, kv_seq_blocks(c, seq), (size_t)s->n_blk * sizeof(int32_t));
    if (s->n_pos) memcpy(s->ids, kv_seq_ids(c, seq), (size_t)s->n_pos * sizeof(int32_t));
    for (int64_t l = 0; l < N_LAYER; l++) kv_seq_get_raw(c, seq, l, 0, s->n_pos, s->rows[l][0], s->rows[l][1]);
}

static int seq_same(const kv_cache_t *c, int seq, const seq_state_t *before) {
    static seq_state_t now;
    seq_state(c, seq, &now);
    return memcmp(&now, before, sizeof now) == 0;
}

/* used + free == n_blocks; used / shared = blocks in one / two or more
 * tables; every table as long as its positions need. */
static void check_accounting(const kv_cache_t *c) {
    kv_stats_t st;
    kv_cache_stats(c, &st);
    TERN_CHECK(st.n_blocks == N_BLOCKS && st.n_used + st.n_free == st.n_blocks);
    int held[N_BLOCKS] = {0};
    for (int s = 0; s < N_SEQ; s++) {
        const int64_t nb = kv_seq_n_blocks(c, s);
        TERN_CHECK(nb == (kv_seq_n_pos(c, s) + BLOCK_POS - 1) / BLOCK_POS);
        for (int64_t i = 0; i < nb; i++) {
            const int32_t b = kv_seq_blocks(c, s)[i];
            TERN_CHECK(b >= 0 && b < N_BLOCKS);
            held[b]++;
        }
    }
    int64_t used = 0, shared = 0;
    for (int b = 0; b < N_BLOCKS; b++) used += held[b] > 0, shared += held[b] > 1;
    TERN_CHECK(st.n_used == used && st.n_shared == shared);
}

/* The memory every input is read into (see the top). */
static kv_cache_t *make_memory(int type, int drop3) {
    kv_cache_t *c = new_memory(type, BLOCK_POS, N_SEQ);
    append(c, 0, 1, 0.0f);
    append(c, 1, 5, 10.0f);
    TERN_CHECK(kv_seq_fork(c, 2, 1, 3, NULL) == 0);
    append(c, 2, 1, 20.0f); /* copies 1's second block */
    TERN_CHECK(kv_seq_fork(c, 3, 0, 1, NULL) == 0);
    if (drop3) kv_seq_remove(c, 3);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    TERN_CHECK(st.n_used == 5 && st.n_shared == 2 - drop3);
    check_accounting(c);
    return c;
}

/* Writes the seed files: byte 0 (the type; sequence 0), then a valid
 * serialized sequence (the same bytes as before the memory was paged). */
static void write_seeds(const char *dir) {
    const struct {
        const char *name;
        int type;
        int64_t n_pos;
    } seeds[] = {{"f16", TYPE_F16, 3}, {"f32", TYPE_F32, 2}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        kv_cache_t *c = new_memory(seeds[i].type, 0, 1);
        append(c, 0, seeds[i].n_pos, 0.0f);
        uint8_t buf[4096];
        buf[0] = seeds[i].type == TYPE_F16 ? 0 : 1;
        writer_t w = {buf, 1, sizeof buf};
        TERN_CHECK(kv_seq_write(c, 0, seeds[i].n_pos, write_buf, &w, NULL) == 0);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, seeds[i].name);
        FILE *f = fopen(path, "wb");
        TERN_CHECK(f && fwrite(buf, 1, w.size, f) == w.size && fclose(f) == 0);
        kv_cache_free(c);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("TERN_FUZZ_KV_SEED");
    if (dir) {
        write_seeds(dir);
        exit(0);
    }
    return 0;
}

static seq_state_t g_before[N_SEQ];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int type = (data[0] & 1) ? TYPE_F32 : TYPE_F16;
    const int target = (data[0] >> 1) & 3;
    kv_cache_t *c = make_memory(type, (data[0] >> 3) & 1);
    for (int s = 0; s < N_SEQ; s++) seq_state(c, s, &g_before[s]);
    /* The input is copied so that reads past its end are caught (ASan). */
    const size_t len = size - 1;
    uint8_t *copy = malloc(len ? len : 1);
    TERN_CHECK(copy);
    if (len) memcpy(copy, data + 1, len);
    reader_t r = {copy, len, 0};
    tern_error_t err;
    const int rc = kv_seq_read(c, target, read_buf, &r, &err);
    check_accounting(c);
    for (int s = 0; s < N_SEQ; s++)
        if (s != target && !seq_same(c, s, &g_before[s])) abort(); /* the read touched another sequence */
    if (rc != 0) {
        /* Refused in the header (or for want of blocks): unchanged; inside
         * the data: empty. */
        TERN_CHECK(err.msg[0] != '\0');
        TERN_CHECK(seq_same(c, target, &g_before[target]) ||
                   (rc == TERN_EFORMAT && r.pos >= KV_HEADER_BYTES && kv_seq_n_pos(c, target) == 0 &&
                    kv_seq_n_blocks(c, target) == 0));
    } else {
        const int64_t n = kv_seq_n_pos(c, target);
        TERN_CHECK(n >= 0 && n <= N_CTX);
        TERN_CHECK(r.pos == kv_cache_serialized_size(kv_cache_layout(c), n));
        for (int64_t i = 0; i < n; i++) TERN_CHECK(kv_seq_ids(c, target)[i] == -1);
        /* Its blocks are its own. */
        for (int s = 0; s < N_SEQ; s++)
            for (int64_t i = 0; s != target && i < kv_seq_n_blocks(c, s); i++)
                for (int64_t j = 0; j < kv_seq_n_blocks(c, target); j++)
                    TERN_CHECK(kv_seq_blocks(c, s)[i] != kv_seq_blocks(c, target)[j]);
        uint8_t *again = malloc(r.pos);
        TERN_CHECK(again);
        writer_t w = {again, 0, r.pos};
        TERN_CHECK(kv_seq_write(c, target, n, write_buf, &w, NULL) == 0);
        if (w.size != r.pos || memcmp(again, copy, r.pos) != 0) abort(); /* the round trip lost bytes */
        free(again);
    }
    /* Every block comes back once. */
    for (int s = 0; s < N_SEQ; s++) kv_seq_remove(c, s);
    kv_stats_t st;
    kv_cache_stats(c, &st);
    TERN_CHECK(st.n_free == N_BLOCKS && st.n_used == 0);
    free(copy);
    kv_cache_free(c);
    return 0;
}
