/*
 * fuzz_session.c - libFuzzer target for the session file reader
 * (session_open, session_restore_kv; format at the top of
 * src/model/session.c): any bytes either open or are refused with a
 * message, never crash or leak. A file that opens holds whole turns only:
 * its tokens are in range, the file was cut to exactly its committed
 * records, opening it again finds the same turns and cuts nothing, and its
 * KV rows restore into sequence 1 of a paged memory (blocks of 4) whose
 * sequence 0 holds positions of its own, which the restore leaves alone.
 *
 * The input is the file, written to a memfd opened through /proc/self/fd.
 * The expected fingerprint is fixed (no model is loaded): llama, F16 KV,
 * 2 layers, 2 K/V heads of 4 elements, 32 tokens, model hash FP_HASH.
 *
 * Seeds: TERN_FUZZ_SESSION_SEED=DIR fuzz_session writes valid files (0, 1
 * and 3 turns) into DIR and exits; fuzz/seeds/fuzz_session/ holds them.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "format/quant.h"
#include "model/session.h"

#define N_LAYER 2
#define N_HEAD_KV 2
#define HEAD_DIM 4
#define N_VOCAB 32
#define N_CTX 64
#define BLOCK_POS 4
#define OTHER 6 /* positions sequence 0 holds */
#define FP_HASH 0x0123456789abcdefull
#define POS_BYTES (N_HEAD_KV * HEAD_DIM * 2)

static session_fp_t g_fp = {0, TYPE_F16, N_LAYER, N_HEAD_KV, HEAD_DIM, N_VOCAB, FP_HASH};

static void silent(tern_log_level_t level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

/* ---- seeds: valid files built by hand from the format's specification ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *d, size_t len) {
    if (b->n + len > b->cap) {
        b->cap = (b->n + len) * 2;
        b->p = realloc(b->p, b->cap);
        TERN_CHECK(b->p);
    }
    memcpy(b->p + b->n, d, len);
    b->n += len;
}
static void put32(buf_t *b, uint32_t v) {
    unsigned char x[4];
    for (int i = 0; i < 4; i++) x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 4);
}
static void put64(buf_t *b, uint64_t v) {
    unsigned char x[8];
    for (int i = 0; i < 8; i++) x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 8);
}
static uint64_t fnv(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void write_seed(const char *dir, const char *name, int n_turns) {
    buf_t b = {0};
    put32(&b, 0x53455354u);
    put32(&b, 1);
    const uint32_t f[] = {g_fp.arch, g_fp.kv_type, g_fp.n_layer, g_fp.n_head_kv, g_fp.head_dim, g_fp.n_vocab};
    for (int i = 0; i < 6; i++) put32(&b, f[i]);
    put64(&b, g_fp.model_hash);
    put64(&b, fnv(b.p, 40));
    uint32_t p0 = 0;
    for (int t = 0; t < n_turns; t++) {
        const uint32_t n = 1 + (uint32_t)t;
        const size_t start = b.n;
        put32(&b, 0x43455254u);
        put32(&b, n);
        put64(&b, p0);
        for (uint32_t i = 0; i < n; i++) put32(&b, (p0 + i * 7) % N_VOCAB);
        for (int l = 0; l < N_LAYER * 2; l++)
            for (uint32_t i = 0; i < n * POS_BYTES; i++) {
                unsigned char x = (unsigned char)(l * 31 + i);
                put(&b, &x, 1);
            }
        put64(&b, fnv(b.p + start, b.n - start));
        put32(&b, 0x444E4554u);
        put32(&b, n);
        p0 += n;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    TERN_CHECK(fp && fwrite(b.p, 1, b.n, fp) == b.n && fclose(fp) == 0);
    free(b.p);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("TERN_FUZZ_SESSION_SEED");
    if (dir) {
        write_seed(dir, "empty", 0);
        write_seed(dir, "one_turn", 1);
        write_seed(dir, "three_turns", 3);
        exit(0);
    }
    tern_log_set(silent, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz_session", MFD_CLOEXEC);
    TERN_CHECK(fd >= 0);
    TERN_CHECK(size == 0 || (size_t)write(fd, data, size) == size);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    tern_error_t err;
    session_t *s = session_open(path, &g_fp, &err);
    if (!s) {
        TERN_CHECK(err.code != 0 && err.msg[0] != '\0');
        close(fd);
        return 0;
    }
    const int64_t n = session_n_tokens(s), turns = session_n_turns(s);
    TERN_CHECK(n >= turns && turns >= 0);
    const int32_t *tok = session_tokens(s);
    for (int64_t i = 0; i < n; i++) TERN_CHECK(tok[i] >= 0 && tok[i] < N_VOCAB);
    /* Cut to exactly the committed records: 48 + 32 per turn + per position. */
    struct stat st;
    TERN_CHECK(fstat(fd, &st) == 0);
    TERN_CHECK((uint64_t)st.st_size == 48 + 32 * (uint64_t)turns + (uint64_t)n * (4 + 2 * N_LAYER * POS_BYTES));
    TERN_CHECK((uint64_t)st.st_size + session_cut_bytes(s) == size);
    if (n <= N_CTX) {
        /* Room for N_CTX positions besides sequence 0's OTHER. */
        kv_layout_t lo;
        TERN_CHECK(kv_layout_init(&lo, TYPE_F16, N_LAYER, N_CTX + OTHER, N_HEAD_KV, HEAD_DIM, BLOCK_POS, NULL) == 0);
        kv_cache_t *kv = kv_cache_new(&lo, 2, NULL);
        TERN_CHECK(kv);
        unsigned char rows[OTHER * POS_BYTES], got[OTHER * POS_BYTES];
        for (size_t i = 0; i < sizeof rows; i++) rows[i] = (unsigned char)(i * 13 + 5);
        TERN_CHECK(kv_seq_reserve(kv, 0, OTHER, NULL) == 0);
        for (int64_t l = 0; l < N_LAYER; l++) kv_seq_put_raw(kv, 0, l, 0, OTHER, rows, rows);
        TERN_CHECK(kv_seq_commit(kv, 0, OTHER, NULL) == 0);
        TERN_CHECK(session_restore_kv(s, kv, 1, n, NULL) == 0 && kv_seq_n_pos(kv, 1) == n);
        for (int64_t i = 0; i < n; i++) TERN_CHECK(kv_seq_ids(kv, 1)[i] == tok[i]);
        TERN_CHECK(session_restore_kv(s, kv, 1, n / 2, NULL) == 0 && kv_seq_n_pos(kv, 1) == n / 2);
        kv_stats_t st;
        kv_cache_stats(kv, &st);
        TERN_CHECK(st.n_used == (OTHER + BLOCK_POS - 1) / BLOCK_POS + (n / 2 + BLOCK_POS - 1) / BLOCK_POS);
        TERN_CHECK(kv_seq_n_pos(kv, 0) == OTHER);
        for (int64_t l = 0; l < N_LAYER; l++) {
            kv_seq_get_raw(kv, 0, l, 0, OTHER, got, NULL);
            TERN_CHECK(memcmp(got, rows, sizeof rows) == 0);
            kv_seq_get_raw(kv, 0, l, 0, OTHER, NULL, got);
            TERN_CHECK(memcmp(got, rows, sizeof rows) == 0);
        }
        kv_cache_free(kv);
    }
    session_close(s);
    /* Opening again finds the same turns and nothing to cut. */
    session_t *again = session_open(path, &g_fp, NULL);
    TERN_CHECK(again && session_n_tokens(again) == n && session_n_turns(again) == turns &&
               session_cut_bytes(again) == 0);
    session_close(again);
    close(fd);
    return 0;
}
