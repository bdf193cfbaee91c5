/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader: parse the input with
 * gguf_open_buffer and, when it is accepted, touch everything the index
 * claims is there (every key, every array element, every tensor's first and
 * last byte, the typed getters and the checked lookup), so ASan/UBSan see any
 * index that points outside the input. Then copy the metadata through the
 * writer's in-memory path, which re-encodes raw values.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format/gguf.h"

static volatile uint64_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tern_error_t err;
    gguf_file_t *f = gguf_open_buffer(data, size, &err);
    if (!f) {
        g_sink += strlen(err.msg);
        return 0;
    }
    uint64_t acc = gguf_version(f) + gguf_alignment(f) + gguf_data_offset(f);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv_t *kv = gguf_kv_at(f, i);
        const char *key = gguf_kv_key(kv);
        acc += strlen(key);
        if (gguf_find(f, key) != kv) __builtin_trap(); /* keys are unique */
        uint64_t u;
        int64_t s;
        float fl;
        bool b;
        gguf_str_t str;
        acc += (uint64_t)gguf_get_u64(f, key, &u, NULL) + (uint64_t)gguf_get_i64(f, key, &s, NULL) +
               (uint64_t)gguf_get_f32(f, key, &fl, NULL) + (uint64_t)gguf_get_bool(f, key, &b, NULL);
        if (gguf_get_str(f, key, &str, NULL) == 0 && str.len) acc += (uint8_t)str.data[str.len - 1];
        uint64_t rl;
        const uint8_t *raw = gguf_kv_raw(kv, &rl);
        if (rl) acc += raw[rl - 1];
        if (gguf_kv_type(kv) != GGUF_ARRAY) continue;
        uint64_t n = gguf_arr_len(kv);
        if (gguf_arr_type(kv) == GGUF_STRING) {
            for (uint64_t j = 0; j < n; j++) {
                gguf_str_t e = gguf_arr_str(kv, j);
                if (e.len) acc += (uint8_t)e.data[0] + (uint8_t)e.data[e.len - 1];
            }
        } else if (gguf_arr_type(kv) != GGUF_ARRAY && n) {
            const uint8_t *p = gguf_arr_data(kv);
            acc += p[0] + p[n * gguf_vtype_size(gguf_arr_type(kv)) - 1];
        }
    }
    uint64_t ar;
    acc += (uint64_t)gguf_get_arch_u64(f, "block_count", &ar, NULL);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        acc += p[0] + p[t->size - 1];
        if (gguf_tensor_find(f, t->name) != t) __builtin_trap(); /* names are unique */
        tern_error_t e2;
        int64_t want[4] = {t->ne[0], -1, -1, -1};
        int types[2] = {t->type, -1};
        if (!gguf_tensor_get(f, t->name, t->n_dims, want, types, &e2)) __builtin_trap();
        acc += gguf_tensor_get(f, t->name, 1, want, NULL, &e2) != NULL;
    }
    gguf_writer_t *w = gguf_writer_new(0);
    if (w) {
        acc += (uint64_t)gguf_w_copy_kv(w, f, NULL);
        gguf_writer_free(w);
    }
    g_sink += acc;
    gguf_close(f);
    return 0;
}
