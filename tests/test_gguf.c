/* test_gguf.c - the GGUF reader and writer: a round trip of every metadata
 * type and every tensor type, every GGUF file in ../shared, and a table of
 * hostile files (built here byte by byte) that must each be rejected with
 * their specific message. */
#include "testutil.h"

#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/quant.h"

/* ---- a byte builder for hand-made files ---------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void str(buf_t *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void hdr(buf_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}
static void kv_u32(buf_t *b, const char *key, uint32_t v) {
    str(b, key);
    u32(b, GGUF_UINT32);
    u32(b, v);
}
static void kv_str(buf_t *b, const char *key, const char *v) {
    str(b, key);
    u32(b, GGUF_STRING);
    str(b, v);
}
static void tinfo(buf_t *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) u64(b, ne[d]);
    u32(b, type);
    u64(b, off);
}
static void pad(buf_t *b, size_t a) {
    static const uint8_t z[64];
    while (b->n % a) put(b, z, 1);
}
static void zeros(buf_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) put(b, "", 1);
}

/* A small valid file: two keys, two f32 tensors [8] and [8, 2]. */
static buf_t valid_file(void) {
    buf_t b = {0};
    hdr(&b, 3, 2, 2);
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 2);
    tinfo(&b, "a", 1, (uint64_t[]){8}, 0, 0);
    tinfo(&b, "b", 2, (uint64_t[]){8, 2}, 0, 32);
    pad(&b, 32);
    zeros(&b, 32 + 64);
    return b;
}

/* ---- round trip ------------------------------------------------------------------- */

static char *tmp_path(const char *tag) {
    static char p[8][256];
    static int k;
    char *s = p[k++ & 7];
    snprintf(s, 256, "/tmp/tern_test_gguf_%d_%s.gguf", (int)getpid(), tag);
    return s;
}

static const int all_types[] = {TYPE_F32,  TYPE_F16,  TYPE_BF16, TYPE_Q4_0, TYPE_Q4_1, TYPE_Q5_0,
                                TYPE_Q5_1, TYPE_Q8_0, TYPE_Q4_K, TYPE_Q5_K, TYPE_Q6_K};
#define N_TYPES (int)(sizeof all_types / sizeof all_types[0])

typedef struct {
    const uint8_t *src;
    uint64_t row_bytes;
    int calls;
} fill_ctx_t;

static int fill_rows(void *ctx, const char *name, int64_t row0, int64_t n, void *dst, tern_error_t *err) {
    (void)name;
    (void)err;
    fill_ctx_t *c = ctx;
    memcpy(dst, c->src + (uint64_t)row0 * c->row_bytes, (size_t)((uint64_t)n * c->row_bytes));
    c->calls++;
    return 0;
}

static void roundtrip(uint32_t alignment) {
    gguf_writer_t *w = gguf_writer_new(alignment);
    assert_non_null(w);
    assert_int_equal(gguf_w_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(gguf_w_u8(w, "t.u8", 250), 0);
    assert_int_equal(gguf_w_i8(w, "t.i8", -7), 0);
    assert_int_equal(gguf_w_u16(w, "t.u16", 65000), 0);
    assert_int_equal(gguf_w_i16(w, "t.i16", -30000), 0);
    assert_int_equal(gguf_w_u32(w, "t.u32", 4000000000u), 0);
    assert_int_equal(gguf_w_i32(w, "t.i32", -2000000000), 0);
    assert_int_equal(gguf_w_u64(w, "t.u64", UINT64_MAX - 1), 0);
    assert_int_equal(gguf_w_i64(w, "t.i64", INT64_MIN + 1), 0);
    assert_int_equal(gguf_w_f32(w, "t.f32", 1.5f), 0);
    assert_int_equal(gguf_w_f64(w, "t.f64", -2.25), 0);
    assert_int_equal(gguf_w_bool(w, "t.bool", true), 0);
    assert_int_equal(gguf_w_str(w, "t.str", "héllo"), 0);
    assert_int_equal(gguf_w_strn(w, "t.bin", "a\0b", 3), 0);
    assert_int_equal(gguf_w_u32(w, "llama.block_count", 1), 0);
    assert_int_equal(gguf_w_u32(w, "llama.block_count", 3), 0); /* replaces */
    int32_t ai[5] = {1, -2, 3, -4, 5};
    assert_int_equal(gguf_w_arr(w, "t.arr_i32", GGUF_INT32, ai, 5), 0);
    float af[3] = {0.5f, -1.0f, 3.25f};
    assert_int_equal(gguf_w_arr(w, "t.arr_f32", GGUF_FLOAT32, af, 3), 0);
    uint8_t ab[4] = {1, 0, 1, 1};
    assert_int_equal(gguf_w_arr(w, "t.arr_bool", GGUF_BOOL, ab, 4), 0);
    assert_int_equal(gguf_w_arr(w, "t.arr_empty", GGUF_UINT64, NULL, 0), 0);
    const char *ss[3] = {"x", "", "zzz"};
    assert_int_equal(gguf_w_arr_str(w, "t.arr_str", ss, NULL, 3), 0);
    assert_int_equal(gguf_w_arr(w, "t.bad", GGUF_STRING, ss, 3), TERN_EINVAL);
    assert_non_null(strstr(gguf_writer_errmsg(w), "numeric"));

    /* One tensor of every type, shapes [256, 3] (rows a multiple of every
     * block size) with random bytes; half by pointer, half by callback. */
    uint64_t st = 42;
    uint8_t *data[N_TYPES];
    fill_ctx_t fc[N_TYPES];
    for (int i = 0; i < N_TYPES; i++) {
        int64_t ne[2] = {256, 3};
        size_t rs = quant_row_size(all_types[i], 256);
        assert_true(rs > 0);
        data[i] = malloc(rs * 3);
        for (size_t j = 0; j < rs * 3; j++) data[i][j] = (uint8_t)tu_rand(&st);
        char name[64];
        snprintf(name, sizeof name, "t_%s", quant_name(all_types[i]));
        if (i % 2) {
            fc[i] = (fill_ctx_t){data[i], rs, 0};
            assert_int_equal(gguf_w_tensor_fill(w, name, all_types[i], 2, ne, fill_rows, &fc[i]), 0);
        } else {
            assert_int_equal(gguf_w_tensor(w, name, all_types[i], 2, ne, data[i], rs * 3), 0);
        }
    }
    /* A 1-D tensor of odd size too, so padding is exercised. */
    float v[5] = {1, 2, 3, 4, 5};
    assert_int_equal(gguf_w_tensor(w, "v", TYPE_F32, 1, (int64_t[]){5}, v, sizeof v), 0);
    /* Writer-side validation. */
    assert_int_equal(gguf_w_tensor(w, "v", TYPE_F32, 1, (int64_t[]){5}, v, sizeof v), TERN_EINVAL);
    assert_non_null(strstr(gguf_writer_errmsg(w), "duplicate"));
    assert_int_equal(gguf_w_tensor(w, "q", TYPE_Q4_0, 1, (int64_t[]){33}, v, 18), TERN_EINVAL);
    assert_non_null(strstr(gguf_writer_errmsg(w), "block size"));
    assert_int_equal(gguf_w_tensor(w, "w", TYPE_F32, 1, (int64_t[]){4}, v, 20), TERN_EINVAL);
    assert_non_null(strstr(gguf_writer_errmsg(w), "expected 16"));

    const char *path = tmp_path(alignment == 32 ? "rt32" : "rt64");
    tern_error_t err = {0};
    assert_int_equal(gguf_writer_write(w, path, &err), 0);
    gguf_writer_free(w);

    gguf_file_t *f = gguf_open(path, &err);
    if (!f) fail_msg("%s", err.msg);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), alignment);
    assert_int_equal(gguf_data_offset(f) % alignment, 0);
    assert_string_equal(gguf_arch(f), "llama");
    /* general.alignment is stored only when it is not the default. */
    assert_int_equal(gguf_find(f, "general.alignment") != NULL, alignment != 32);

    uint64_t u;
    int64_t i64;
    float fl;
    bool bo;
    gguf_str_t s;
    assert_int_equal(gguf_get_u64(f, "t.u8", &u, &err), 0);
    assert_int_equal(u, 250);
    assert_int_equal(gguf_get_i64(f, "t.i8", &i64, &err), 0);
    assert_int_equal(i64, -7);
    assert_int_equal(gguf_get_u64(f, "t.u16", &u, &err), 0);
    assert_int_equal(u, 65000);
    assert_int_equal(gguf_get_i64(f, "t.i16", &i64, &err), 0);
    assert_int_equal(i64, -30000);
    assert_int_equal(gguf_get_u64(f, "t.u32", &u, &err), 0);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "t.i32", &i64, &err), 0);
    assert_int_equal(i64, -2000000000);
    assert_int_equal(gguf_get_u64(f, "t.u64", &u, &err), 0);
    assert_true(u == UINT64_MAX - 1);
    assert_int_equal(gguf_get_i64(f, "t.i64", &i64, &err), 0);
    assert_true(i64 == INT64_MIN + 1);
    assert_int_equal(gguf_get_f32(f, "t.f32", &fl, &err), 0);
    assert_true(fl == 1.5f);
    assert_int_equal(gguf_get_f32(f, "t.f64", &fl, &err), 0);
    assert_true(fl == -2.25f);
    assert_int_equal(gguf_get_f32(f, "t.u8", &fl, &err), 0); /* ints convert */
    assert_true(fl == 250.0f);
    assert_int_equal(gguf_get_bool(f, "t.bool", &bo, &err), 0);
    assert_true(bo);
    assert_int_equal(gguf_get_str(f, "t.str", &s, &err), 0);
    assert_int_equal(s.len, strlen("héllo"));
    assert_memory_equal(s.data, "héllo", s.len);
    assert_int_equal(gguf_get_str(f, "t.bin", &s, &err), 0);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.data, "a\0b", 3);
    assert_int_equal(gguf_get_arch_u64(f, "block_count", &u, &err), 0);
    assert_int_equal(u, 3);
    /* Getter errors name the key. */
    assert_int_equal(gguf_get_u64(f, "t.i8", &u, &err), TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "'t.i8' is negative"));
    assert_int_equal(gguf_get_i64(f, "t.u64", &i64, &err), TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "does not fit"));
    assert_int_equal(gguf_get_u64(f, "t.str", &u, &err), TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "'t.str' has type string"));
    assert_int_equal(gguf_get_bool(f, "nope", &bo, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "'nope' not found"));
    assert_int_equal(gguf_get_arch_f32(f, "rope.freq_base", &fl, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "'llama.rope.freq_base' not found"));

    const gguf_kv_t *kv = gguf_find(f, "t.arr_i32");
    assert_non_null(kv);
    assert_int_equal(gguf_kv_type(kv), GGUF_ARRAY);
    assert_int_equal(gguf_arr_type(kv), GGUF_INT32);
    assert_int_equal(gguf_arr_len(kv), 5);
    assert_memory_equal(gguf_arr_data(kv), ai, sizeof ai);
    kv = gguf_find(f, "t.arr_f32");
    assert_memory_equal(gguf_arr_data(kv), af, sizeof af);
    kv = gguf_find(f, "t.arr_bool");
    assert_int_equal(gguf_arr_type(kv), GGUF_BOOL);
    assert_memory_equal(gguf_arr_data(kv), ab, sizeof ab);
    kv = gguf_find(f, "t.arr_empty");
    assert_int_equal(gguf_arr_len(kv), 0);
    kv = gguf_find(f, "t.arr_str");
    assert_int_equal(gguf_arr_type(kv), GGUF_STRING);
    assert_int_equal(gguf_arr_len(kv), 3);
    for (int k = 0; k < 3; k++) {
        gguf_str_t e = gguf_arr_str(kv, (uint64_t)k);
        assert_int_equal(e.len, strlen(ss[k]));
        assert_memory_equal(e.data, ss[k], e.len);
    }
    assert_null(gguf_arr_str(kv, 3).data);
    /* Keys keep their insertion order; a replaced key keeps its slot. */
    assert_string_equal(gguf_kv_key(gguf_kv_at(f, 0)), "general.architecture");
    assert_string_equal(gguf_kv_key(gguf_kv_at(f, 14)), "llama.block_count");

    assert_int_equal(gguf_n_tensors(f), N_TYPES + 1);
    for (int i = 0; i < N_TYPES; i++) {
        char name[64];
        snprintf(name, sizeof name, "t_%s", quant_name(all_types[i]));
        const gguf_tensor_t *t = gguf_tensor_get(f, name, 2, (int64_t[]){256, 3}, (int[]){all_types[i], -1}, &err);
        if (!t) fail_msg("%s", err.msg);
        assert_int_equal(t->offset % alignment, 0);
        assert_int_equal((uintptr_t)t->data % alignment, 0); /* the mapping is page aligned */
        assert_int_equal(t->size, quant_row_size(all_types[i], 256) * 3);
        assert_memory_equal(t->data, data[i], t->size);
        if (i % 2) assert_true(fc[i].calls >= 1);
        free(data[i]);
    }
    const gguf_tensor_t *t = gguf_tensor_get(f, "v", 1, (int64_t[]){5}, NULL, &err);
    assert_non_null(t);
    assert_memory_equal(t->data, v, sizeof v);
    /* Lookup errors say what differs. */
    assert_null(gguf_tensor_get(f, "v", 1, (int64_t[]){6}, NULL, &err));
    assert_non_null(strstr(err.msg, "tensor 'v' has shape [5], expected [6]"));
    assert_null(gguf_tensor_get(f, "v", 2, (int64_t[]){5, 2}, NULL, &err));
    assert_non_null(strstr(err.msg, "expected [5, 2]"));
    assert_non_null(gguf_tensor_get(f, "v", 2, (int64_t[]){-1, 1}, NULL, &err)); /* trailing 1 matches */
    assert_null(gguf_tensor_get(f, "v", 1, (int64_t[]){5}, (int[]){TYPE_F16, TYPE_Q8_0, -1}, &err));
    assert_non_null(strstr(err.msg, "has type f32, expected one of: f16, q8_0"));
    assert_null(gguf_tensor_get(f, "nope", 1, (int64_t[]){5}, NULL, &err));
    assert_non_null(strstr(err.msg, "tensor 'nope' not found"));

    /* Copying every key to a new file reproduces the metadata byte for byte. */
    gguf_writer_t *w2 = gguf_writer_new(0);
    assert_int_equal(gguf_w_copy_kv(w2, f, NULL), 0);
    const char *path2 = tmp_path("copy");
    assert_int_equal(gguf_writer_write(w2, path2, &err), 0);
    gguf_writer_free(w2);
    gguf_file_t *f2 = gguf_open(path2, &err);
    assert_non_null(f2);
    assert_int_equal(gguf_n_kv(f2), gguf_n_kv(f));
    assert_int_equal(gguf_alignment(f2), alignment);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv_t *a = gguf_kv_at(f, i), *b = gguf_kv_at(f2, i);
        uint64_t la, lb;
        const void *ra = gguf_kv_raw(a, &la), *rb = gguf_kv_raw(b, &lb);
        assert_string_equal(gguf_kv_key(a), gguf_kv_key(b));
        assert_int_equal(la, lb);
        assert_memory_equal(ra, rb, la);
    }
    gguf_close(f2);
    gguf_close(f);
    unlink(path);
    unlink(path2);
}

static void test_roundtrip_align32(void **state) {
    (void)state;
    roundtrip(32);
}
static void test_roundtrip_align64(void **state) {
    (void)state;
    roundtrip(64);
}

/* A nested array (which only our reader accepts) survives a copy. */
static void test_nested_array_copy(void **state) {
    (void)state;
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "t.nested");
    u32(&b, GGUF_ARRAY);
    u32(&b, GGUF_ARRAY);
    u64(&b, 2);
    u32(&b, GGUF_UINT8);
    u64(&b, 2);
    put(&b, "\x01\x02", 2);
    u32(&b, GGUF_STRING);
    u64(&b, 1);
    str(&b, "hi");
    tern_error_t err = {0};
    gguf_file_t *f = gguf_open_buffer(b.p, b.n, &err);
    if (!f) fail_msg("%s", err.msg);
    const gguf_kv_t *kv = gguf_find(f, "t.nested");
    assert_int_equal(gguf_arr_type(kv), GGUF_ARRAY);
    assert_int_equal(gguf_arr_len(kv), 2);
    gguf_writer_t *w = gguf_writer_new(32);
    assert_int_equal(gguf_w_copy_kv(w, f, NULL), 0);
    const char *path = tmp_path("nested");
    assert_int_equal(gguf_writer_write(w, path, &err), 0);
    gguf_writer_free(w);
    size_t n;
    char *img = tu_read_file(path, &n);
    assert_non_null(img);
    /* The same bytes, then zero padding up to the alignment (as llama.cpp
     * writes it; the data section is empty). */
    assert_int_equal(n, (b.n + 31) / 32 * 32);
    assert_memory_equal(img, b.p, b.n);
    for (size_t i = b.n; i < n; i++) assert_int_equal(img[i], 0);
    free(img);
    unlink(path);
    gguf_close(f);
    free(b.p);
}

/* A file larger than this machine's memory opens (the Mixture-of-Experts
 * models tern streams from disk): a small valid file extended to 48 GiB by a
 * sparse hole after its data (no disk space used). Opening must not ask for
 * memory in proportion to the file's length. */
static void test_larger_than_memory(void **state) {
    (void)state;
    tern_error_t err = {0};
    gguf_writer_t *w = gguf_writer_new(32);
    const float data[32] = {1, 2, 3};
    const int64_t ne[2] = {32, 1};
    assert_int_equal(gguf_w_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(gguf_w_tensor(w, "t.weight", TYPE_F32, 2, ne, data, sizeof data), 0);
    const char *path = tmp_path("huge");
    assert_int_equal(gguf_writer_write(w, path, &err), 0);
    gguf_writer_free(w);
    assert_int_equal(truncate(path, (off_t)48 << 30), 0);
    gguf_file_t *f = gguf_open(path, &err);
    if (!f) fail_msg("a 48 GiB file: %s", err.msg);
    assert_int_equal(gguf_file_size(f), (uint64_t)48 << 30);
    const gguf_tensor_t *t = gguf_tensor_find(f, "t.weight");
    assert_non_null(t);
    assert_memory_equal(t->data, data, sizeof data);
    assert_true(gguf_file_offset(f, t->data) > 0);
    assert_int_equal(gguf_file_offset(f, data), -1);
    gguf_close(f);
    unlink(path);
}

/* Many keys and tensors in no particular order: every one is found by name,
 * names that are absent are not. */
static void test_many_names(void **state) {
    (void)state;
    const int nk = 20000, nt = 3000;
    buf_t b = {0};
    hdr(&b, 3, (uint64_t)nt, (uint64_t)nk);
    char name[64];
    for (int i = 0; i < nk; i++) {
        snprintf(name, sizeof name, "k.%d", (i * 7919) % nk);
        kv_u32(&b, name, (uint32_t)((i * 7919) % nk));
    }
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "blk.%d.w", (i * 1009) % nt);
        tinfo(&b, name, 1, (uint64_t[]){8}, 0, (uint64_t)(nt - 1 - i) * 32); /* reverse offset order */
    }
    pad(&b, 32);
    zeros(&b, (size_t)nt * 32);
    tern_error_t err = {0};
    gguf_file_t *f = gguf_open_buffer(b.p, b.n, &err);
    if (!f) fail_msg("%s", err.msg);
    for (int i = 0; i < nk; i++) {
        snprintf(name, sizeof name, "k.%d", i);
        uint64_t v;
        assert_int_equal(gguf_get_u64(f, name, &v, &err), 0);
        assert_int_equal(v, i);
    }
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "blk.%d.w", i);
        const gguf_tensor_t *t = gguf_tensor_find(f, name);
        assert_non_null(t);
        assert_string_equal(t->name, name);
    }
    assert_null(gguf_find(f, "k.20000"));
    assert_null(gguf_find(f, "k."));
    assert_null(gguf_find(f, ""));
    assert_null(gguf_tensor_find(f, "blk.3000.w"));
    gguf_close(f);
    free(b.p);
}

/* ---- every GGUF file in ../shared ---------------------------------------------------- */

static void test_shared_files(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(dir, "models/stories260K.gguf");
    (void)dir;
    const char *pats[] = {"models/*.gguf", "reference/vocab/*.gguf"};
    int n_files = 0;
    for (int p = 0; p < 2; p++) {
        char pat[4096];
        const char *base = tu_shared("models");
        assert_non_null(base);
        snprintf(pat, sizeof pat, "%s/../%s", base, pats[p]);
        glob_t g;
        assert_int_equal(glob(pat, 0, NULL, &g), 0);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            tern_error_t err = {0};
            gguf_file_t *f = gguf_open(g.gl_pathv[i], &err);
            if (!f) fail_msg("%s", err.msg);
            /* Every file names its architecture and has a vocabulary. */
            assert_non_null(gguf_arch(f));
            const gguf_kv_t *toks = gguf_find(f, "tokenizer.ggml.tokens");
            assert_non_null(toks);
            assert_int_equal(gguf_arr_type(toks), GGUF_STRING);
            assert_true(gguf_arr_len(toks) > 0);
            gguf_str_t last = gguf_arr_str(toks, gguf_arr_len(toks) - 1);
            assert_non_null(last.data);
            gguf_str_t model;
            assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &model, &err), 0);
            if (p == 0) {
                /* Models: all 2-D weights sit inside the file, aligned. */
                assert_true(gguf_n_tensors(f) > 0);
                for (int64_t k = 0; k < gguf_n_tensors(f); k++) {
                    const gguf_tensor_t *t = gguf_tensor_at(f, k);
                    assert_int_equal(t->offset % gguf_alignment(f), 0);
                    assert_true(gguf_data_offset(f) + t->offset + t->size <= gguf_file_size(f));
                }
            } else {
                assert_int_equal(gguf_n_tensors(f), 0);
            }
            gguf_close(f);
            n_files++;
        }
        globfree(&g);
    }
    assert_true(n_files >= 15); /* 3 models + 12 vocab files when this was written */
}

/* stories260K's facts from models/README.md. */
/* llama.cpp wrote the model files in ../shared/models. Rewriting each through
 * our writer (same metadata, same tensors, same order) must give the same
 * bytes: the writer lays out headers, strings, arrays, tensor infos,
 * alignment and padding exactly as llama.cpp's writer does. */
static void test_rewrite_llamacpp_files_identical(void **state) {
    (void)state;
    static const char *files[] = {"models/stories260K.gguf", "models/stories260K-Q4_K_M.gguf",
                                  "models/aidreams260K.gguf"};
    TU_REQUIRE_SHARED(first, files[0]);
    (void)first;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        const char *path = tu_shared(files[i]);
        assert_non_null(path);
        tern_error_t err = {0};
        gguf_file_t *f = gguf_open(path, &err);
        assert_non_null(f);
        gguf_writer_t *w = gguf_writer_new(gguf_alignment(f));
        assert_non_null(w);
        assert_int_equal(gguf_w_copy_kv(w, f, NULL), 0);
        for (int64_t t = 0; t < gguf_n_tensors(f); t++) {
            const gguf_tensor_t *ti = gguf_tensor_at(f, t);
            assert_int_equal(gguf_w_tensor(w, ti->name, ti->type, ti->n_dims, ti->ne, ti->data, ti->size), 0);
        }
        char out[64];
        snprintf(out, sizeof out, "/tmp/tern_rewrite_%d.gguf", (int)getpid());
        assert_int_equal(gguf_writer_write(w, out, &err), 0);
        size_t la = 0, lb = 0;
        char *a = tu_read_file(path, &la), *b = tu_read_file(out, &lb);
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(la, lb);
        assert_memory_equal(a, b, la);
        free(a);
        free(b);
        unlink(out);
        gguf_writer_free(w);
        gguf_close(f);
    }
}

static void test_stories_facts(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(path, "models/stories260K.gguf");
    tern_error_t err = {0};
    gguf_file_t *f = gguf_open(path, &err);
    assert_non_null(f);
    uint64_t v;
    assert_int_equal(gguf_get_arch_u64(f, "embedding_length", &v, &err), 0);
    assert_int_equal(v, 64);
    assert_int_equal(gguf_get_arch_u64(f, "block_count", &v, &err), 0);
    assert_int_equal(v, 5);
    assert_int_equal(gguf_get_arch_u64(f, "attention.head_count", &v, &err), 0);
    assert_int_equal(v, 8);
    assert_int_equal(gguf_get_arch_u64(f, "attention.head_count_kv", &v, &err), 0);
    assert_int_equal(v, 4);
    assert_int_equal(gguf_get_arch_u64(f, "feed_forward_length", &v, &err), 0);
    assert_int_equal(v, 172);
    assert_int_equal(gguf_arr_len(gguf_find(f, "tokenizer.ggml.tokens")), 512);
    assert_non_null(gguf_tensor_get(f, "token_embd.weight", 2, (int64_t[]){64, 512}, (int[]){TYPE_F32, -1}, &err));
    assert_non_null(gguf_tensor_get(f, "blk.4.ffn_down.weight", 2, (int64_t[]){172, 64}, NULL, &err));
    assert_non_null(gguf_tensor_get(f, "blk.0.attn_k.weight", 2, (int64_t[]){64, 32}, NULL, &err));
    gguf_close(f);
}

/* ---- hostile input ---------------------------------------------------------------------- */

typedef struct {
    const char *what;
    buf_t (*build)(void);
    const char *expect; /* substring of the error message */
} bad_t;

static buf_t b_empty(void) { return (buf_t){0}; }
static buf_t b_magic(void) {
    buf_t b = valid_file();
    memcpy(b.p, "GGML", 4);
    return b;
}
static buf_t b_v1(void) {
    buf_t b = valid_file();
    b.p[4] = 1;
    return b;
}
static buf_t b_v99(void) {
    buf_t b = valid_file();
    b.p[4] = 99;
    return b;
}
static buf_t b_bigendian(void) {
    buf_t b = valid_file();
    memcpy(b.p + 4, "\0\0\0\3", 4);
    return b;
}
static buf_t b_huge_kv(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, UINT64_MAX);
    zeros(&b, 100);
    return b;
}
static buf_t b_kv_count_vs_bytes(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1000); /* needs >= 14000 bytes */
    kv_u32(&b, "a", 1);
    return b;
}
static buf_t b_huge_tensors(void) {
    buf_t b = {0};
    hdr(&b, 3, UINT64_MAX / 2, 0);
    zeros(&b, 100);
    return b;
}
static buf_t b_dims_overflow(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 3, (uint64_t[]){1ull << 32, 1ull << 32, 1ull << 32}, 0, 0);
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_size_overflow(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, (uint64_t[]){1ull << 62}, 0, 0); /* 2^62 f32 = 2^64 bytes */
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_dim_negative(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 2, (uint64_t[]){8, (uint64_t)-1}, 0, 0);
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_dim_zero(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 2, (uint64_t[]){8, 0}, 0, 0);
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_ndims5(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 5, (uint64_t[]){1, 1, 1, 1, 1}, 0, 0);
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_ndims0(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 0, NULL, 0, 0);
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_unknown_type(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, (uint64_t[]){32}, 99, 0);
    pad(&b, 32);
    zeros(&b, 128);
    return b;
}
static buf_t b_act_type(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, (uint64_t[]){256}, TYPE_Q8_K, 0);
    pad(&b, 32);
    zeros(&b, 320);
    return b;
}
static buf_t b_row_block(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 2, (uint64_t[]){33, 2}, TYPE_Q4_0, 0);
    pad(&b, 32);
    zeros(&b, 128);
    return b;
}
static buf_t b_misaligned(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, (uint64_t[]){8}, 0, 4);
    pad(&b, 32);
    zeros(&b, 64);
    return b;
}
static buf_t b_out_of_file(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "blk.3.attn_q.weight", 1, (uint64_t[]){8}, 0, 64);
    pad(&b, 32);
    zeros(&b, 64);
    return b;
}
static buf_t b_offset_wraps(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, (uint64_t[]){8}, 0, UINT64_MAX - 31);
    pad(&b, 32);
    zeros(&b, 64);
    return b;
}
static buf_t b_overlap(void) {
    buf_t b = {0};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 1, (uint64_t[]){16}, 0, 32); /* [32, 96) */
    tinfo(&b, "b", 1, (uint64_t[]){8}, 0, 64);  /* [64, 96) */
    pad(&b, 32);
    zeros(&b, 128);
    return b;
}
static buf_t b_dup_key(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 2);
    kv_u32(&b, "general.x", 1);
    kv_u32(&b, "general.x", 2);
    return b;
}
static buf_t b_dup_tensor(void) {
    buf_t b = {0};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "w", 1, (uint64_t[]){8}, 0, 0);
    tinfo(&b, "w", 1, (uint64_t[]){8}, 0, 32);
    pad(&b, 32);
    zeros(&b, 64);
    return b;
}
static buf_t b_str_past_eof(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "general.name");
    u32(&b, GGUF_STRING);
    u64(&b, 1000);
    put(&b, "short", 5);
    return b;
}
static buf_t b_key_past_eof(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    u64(&b, UINT64_MAX);
    zeros(&b, 20);
    return b;
}
static buf_t b_nest_bomb(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "bomb");
    u32(&b, GGUF_ARRAY);
    for (int i = 0; i < 100000; i++) {
        u32(&b, GGUF_ARRAY);
        u64(&b, 1);
    }
    u32(&b, GGUF_UINT8);
    u64(&b, 0);
    return b;
}
static buf_t b_str_array_count(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "tokenizer.ggml.tokens");
    u32(&b, GGUF_ARRAY);
    u32(&b, GGUF_STRING);
    u64(&b, 1ull << 60);
    zeros(&b, 64);
    return b;
}
static buf_t b_num_array_count(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "scores");
    u32(&b, GGUF_ARRAY);
    u32(&b, GGUF_FLOAT32);
    u64(&b, (1ull << 62) + 1); /* times 4 wraps to 4 */
    zeros(&b, 64);
    return b;
}
static buf_t b_array_elem_type(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "a");
    u32(&b, GGUF_ARRAY);
    u32(&b, 77);
    u64(&b, 1);
    zeros(&b, 8);
    return b;
}
static buf_t b_value_type(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "a");
    u32(&b, 13);
    zeros(&b, 8);
    return b;
}
static buf_t b_bool(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    str(&b, "a");
    u32(&b, GGUF_BOOL);
    put(&b, "\x02", 1);
    return b;
}
static buf_t b_empty_key(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "", 1);
    return b;
}
static buf_t b_nul_key(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    u64(&b, 3);
    put(&b, "a\0b", 3);
    u32(&b, GGUF_UINT8);
    put(&b, "\x01", 1);
    return b;
}
static buf_t b_align_npot(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 24);
    return b;
}
static buf_t b_align_zero(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 0);
    return b;
}
static buf_t b_align_type(void) {
    buf_t b = {0};
    hdr(&b, 3, 0, 1);
    kv_str(&b, "general.alignment", "32");
    return b;
}
static buf_t b_data_past_eof(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, (uint64_t[]){8}, 0, 0);
    /* ends 2 bytes after the infos: the data section would start past EOF */
    zeros(&b, 2);
    return b;
}
static buf_t b_name_empty(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "", 1, (uint64_t[]){8}, 0, 0);
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_name_long(void) {
    buf_t b = {0};
    hdr(&b, 3, 1, 0);
    u64(&b, 5000);
    zeros(&b, 5000);
    u32(&b, 1);
    u64(&b, 8);
    u32(&b, 0);
    u64(&b, 0);
    pad(&b, 32);
    zeros(&b, 32);
    return b;
}
static buf_t b_truncated_data(void) {
    buf_t b = valid_file();
    b.n -= 1; /* tensor "b" loses its last byte */
    return b;
}

static const bad_t bad_files[] = {
    {"zero-size file", b_empty, "file is empty"},
    {"wrong magic", b_magic, "bad magic 47 47 4d 4c"},
    {"version 1", b_v1, "GGUF version 1 is not supported"},
    {"version 99", b_v99, "unsupported GGUF version 99"},
    {"big-endian", b_bigendian, "big-endian GGUF"},
    {"huge kv count", b_huge_kv, "metadata count 18446744073709551615 is impossible"},
    {"kv count past the bytes", b_kv_count_vs_bytes, "metadata count 1000 is impossible"},
    {"huge tensor count", b_huge_tensors, "tensor count 9223372036854775807 is impossible"},
    {"dims overflow", b_dims_overflow, "tensor 't': element count overflows int64 at dimension 1"},
    {"byte size overflow", b_size_overflow, "tensor 't': byte size overflows"},
    {"negative dim", b_dim_negative, "tensor 't': dimension 1 is 18446744073709551615"},
    {"zero dim", b_dim_zero, "tensor 't': dimension 1 is 0"},
    {"n_dims 5", b_ndims5, "tensor 't': n_dims 5"},
    {"n_dims 0", b_ndims0, "tensor 't': n_dims 0"},
    {"unknown tensor type", b_unknown_type, "tensor 't': unknown or unsupported tensor type 99"},
    {"activation type", b_act_type, "tensor 't': type q8_k (15) is not a storage type"},
    {"row not a block multiple", b_row_block, "row length 33 is not a multiple of the q4_0 block size 32"},
    {"misaligned offset", b_misaligned, "tensor 't': offset 4 is not a multiple of the alignment 32"},
    {"offset out of file", b_out_of_file, "tensor 'blk.3.attn_q.weight': offset 64 + size 32 beyond end of file"},
    {"offset + size wraps", b_offset_wraps, "offset 18446744073709551584 + size 32 beyond end of file"},
    {"overlapping tensors", b_overlap, "tensors 'a' (offset 32, size 64) and 'b' (offset 64) overlap"},
    {"duplicate key", b_dup_key, "metadata key 'general.x': duplicate key"},
    {"duplicate tensor", b_dup_tensor, "tensor 'w': duplicate tensor name"},
    {"string past EOF", b_str_past_eof, "string value length 1000 at offset 48 runs past end of file"},
    {"key length past EOF", b_key_past_eof, "metadata entry #0: key length 18446744073709551615"},
    {"nesting bomb", b_nest_bomb, "arrays nested deeper than 8 levels"},
    {"string array count", b_str_array_count, "array of 1152921504606846976 strings"},
    {"numeric array count wraps", b_num_array_count, "array of 4611686018427387905 f32"},
    {"unknown array element type", b_array_elem_type, "unknown array element type 77"},
    {"unknown value type", b_value_type, "metadata key 'a': unknown value type 13"},
    {"bool not 0/1", b_bool, "bool value 2"},
    {"empty key", b_empty_key, "metadata entry #0: empty key"},
    {"NUL in key", b_nul_key, "key contains a NUL byte"},
    {"alignment not a power of two", b_align_npot, "'general.alignment' is 24 (must be a power of two)"},
    {"alignment zero", b_align_zero, "'general.alignment' is 0"},
    {"alignment wrong type", b_align_type, "'general.alignment' has type string (must be u32)"},
    {"data section past EOF", b_data_past_eof, "data section would start at offset"},
    {"empty tensor name", b_name_empty, "tensor #0: empty name"},
    {"tensor name too long", b_name_long, "tensor #0: name length 5000"},
    {"tensor data truncated", b_truncated_data, "tensor 'b': offset 32 + size 64 beyond end of file (287 bytes"},
};

static void test_hostile_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        buf_t b = bad_files[i].build();
        /* An exact-size heap copy, so ASan sees any read past the end. */
        uint8_t *exact = malloc(b.n ? b.n : 1);
        if (b.n) memcpy(exact, b.p, b.n);
        tern_error_t err = {0};
        gguf_file_t *f = gguf_open_buffer(exact, b.n, &err);
        if (f) fail_msg("%s: accepted", bad_files[i].what);
        if (!strstr(err.msg, bad_files[i].expect))
            fail_msg("%s: message \"%s\" lacks \"%s\"", bad_files[i].what, err.msg, bad_files[i].expect);
        assert_true(err.code == TERN_EFORMAT || err.code == TERN_EUNSUP);
        free(exact);
        free(b.p);
    }
}

/* Truncating a valid file anywhere before its last tensor byte is an error,
 * and cutting inside each header field names that field. */
static void test_truncation_everywhere(void **state) {
    (void)state;
    buf_t b = valid_file();
    static const struct {
        size_t len;
        const char *expect;
    } fields[] = {
        {0, "file is empty"},
        {3, "header: truncated reading magic at offset 0 (need 4 bytes, 3 left)"},
        {7, "header: truncated reading version at offset 4"},
        {15, "header: truncated reading tensor count at offset 8"},
        {23, "header: truncated reading metadata count at offset 16"},
        {30, "metadata count 2 is impossible"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        tern_error_t err = {0};
        assert_null(gguf_open_buffer(b.p, fields[i].len, &err));
        if (!strstr(err.msg, fields[i].expect)) fail_msg("len %zu: \"%s\"", fields[i].len, err.msg);
    }
    for (size_t len = 0; len < b.n; len++) {
        uint8_t *exact = malloc(len ? len : 1);
        memcpy(exact, b.p, len);
        tern_error_t err = {0};
        gguf_file_t *f = gguf_open_buffer(exact, len, &err);
        if (f) fail_msg("truncated to %zu of %zu bytes: accepted", len, b.n);
        assert_true(strlen(err.msg) > 10);
        free(exact);
    }
    gguf_file_t *f = gguf_open_buffer(b.p, b.n, NULL);
    assert_non_null(f);
    gguf_close(f);
    free(b.p);
}

/* Random single-byte corruptions of a valid file never crash (ASan build
 * checks the reads); the accepted ones still satisfy the layout rules. */
static void test_random_corruption(void **state) {
    (void)state;
    buf_t b = valid_file();
    uint64_t st = 7;
    int iters = tu_quick() ? 2000 : 20000;
    for (int it = 0; it < iters; it++) {
        uint8_t *c = malloc(b.n);
        memcpy(c, b.p, b.n);
        int flips = 1 + (int)(tu_rand(&st) % 3);
        for (int k = 0; k < flips; k++) c[tu_rand(&st) % b.n] = (uint8_t)tu_rand(&st);
        tern_error_t err = {0};
        gguf_file_t *f = gguf_open_buffer(c, b.n, &err);
        if (f) {
            for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
                const gguf_tensor_t *t = gguf_tensor_at(f, i);
                assert_true(gguf_data_offset(f) + t->offset + t->size <= b.n);
            }
            gguf_close(f);
        } else {
            assert_true(err.msg[0] != 0);
        }
        free(c);
    }
    free(b.p);
}

static void test_open_errors(void **state) {
    (void)state;
    tern_error_t err = {0};
    assert_null(gguf_open("/nonexistent/x.gguf", &err));
    assert_int_equal(err.code, TERN_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/x.gguf: cannot open"));
    assert_null(gguf_open("/tmp", &err));
    assert_non_null(strstr(err.msg, "not a regular file"));
    /* An empty file on disk, through the mmap path. */
    const char *p = tmp_path("empty");
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    fclose(fp);
    assert_null(gguf_open(p, &err));
    assert_non_null(strstr(err.msg, "file is empty"));
    assert_non_null(strstr(err.msg, p)); /* the path is named */
    unlink(p);
    gguf_close(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_align32),   cmocka_unit_test(test_roundtrip_align64),
        cmocka_unit_test(test_nested_array_copy),   cmocka_unit_test(test_many_names),
        cmocka_unit_test(test_shared_files),
        cmocka_unit_test(test_stories_facts),       cmocka_unit_test(test_hostile_table),
        cmocka_unit_test(test_truncation_everywhere), cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_open_errors),          cmocka_unit_test(test_larger_than_memory),
        cmocka_unit_test(test_rewrite_llamacpp_files_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
