/*
 * fuzz_kv_cache.c - libFuzzer target for the KV cache restore
 * (kv_cache_read): any bytes either restore or are refused, never crash or
 * leak. A refused input leaves the cache as it was (header errors) or empty
 * (input ending inside the data). An input that restores writes back
 * (kv_cache_write) to exactly the bytes the read consumed.
 *
 * Input: bit 0 of byte 0 picks the cache type (F16 or F32), the rest is the
 * serialized cache. The cache is small: 2 layers, 2 K/V heads of 4
 * elements, room for 8 positions; it holds 1 position before each restore.
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
#define N_CTX 8
#define N_HEAD_KV 2
#define HEAD_DIM 4
#define ROW (N_HEAD_KV * HEAD_DIM)

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

/* A cache of the given type holding n positions of distinct values. */
static kv_cache_t *make_cache(int type, int64_t n) {
    kv_layout_t lo;
    TERN_CHECK(kv_layout_init(&lo, type, N_LAYER, N_CTX, N_HEAD_KV, HEAD_DIM, NULL) == 0);
    kv_cache_t *c = kv_cache_new(&lo, NULL);
    TERN_CHECK(c);
    float k[N_CTX * ROW], v[N_CTX * ROW];
    for (int i = 0; i < N_CTX * ROW; i++) k[i] = 0.25f * (float)i, v[i] = -0.5f * (float)i;
    for (int64_t l = 0; l < N_LAYER && n; l++) kv_cache_store(c, l, 0, n, k, v);
    if (n) TERN_CHECK(kv_cache_commit(c, n, NULL) == 0);
    return c;
}

/* Writes the seed files: byte 0 (the type), then a valid serialized cache. */
static void write_seeds(const char *dir) {
    const struct {
        const char *name;
        int type;
        int64_t n_pos;
    } seeds[] = {{"f16", TYPE_F16, 3}, {"f32", TYPE_F32, 2}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        kv_cache_t *c = make_cache(seeds[i].type, seeds[i].n_pos);
        uint8_t buf[4096];
        buf[0] = seeds[i].type == TYPE_F16 ? 0 : 1;
        writer_t w = {buf, 1, sizeof buf};
        TERN_CHECK(kv_cache_write(c, seeds[i].n_pos, write_buf, &w, NULL) == 0);
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int type = (data[0] & 1) ? TYPE_F32 : TYPE_F16;
    kv_cache_t *c = make_cache(type, 1);
    /* The input is copied so that reads past its end are caught (ASan). */
    const size_t len = size - 1;
    uint8_t *copy = malloc(len ? len : 1);
    TERN_CHECK(copy);
    if (len) memcpy(copy, data + 1, len);
    reader_t r = {copy, len, 0};
    tern_error_t err;
    if (kv_cache_read(c, read_buf, &r, &err) != 0) {
        /* Refused in the header: unchanged; inside the data: empty. */
        const int64_t n = kv_cache_n_pos(c);
        TERN_CHECK(n == 1 || (n == 0 && r.pos >= KV_HEADER_BYTES));
        TERN_CHECK(err.msg[0] != '\0');
    } else {
        const int64_t n = kv_cache_n_pos(c);
        TERN_CHECK(n >= 0 && n <= N_CTX);
        TERN_CHECK(r.pos == kv_cache_serialized_size(kv_cache_layout(c), n));
        uint8_t *again = malloc(r.pos);
        TERN_CHECK(again);
        writer_t w = {again, 0, r.pos};
        TERN_CHECK(kv_cache_write(c, n, write_buf, &w, NULL) == 0);
        if (w.size != r.pos || memcmp(again, copy, r.pos) != 0) abort(); /* the round trip lost bytes */
        free(again);
    }
    free(copy);
    kv_cache_free(c);
    return 0;
}
