/*
 * gguf.h - reading (mmap, hostile-input safe) and writing GGUF v2/v3 files.
 * Tensors returned by the reader point into the read-only mapping, no copies.
 * Knows the tensor formats of quant.h by id only (sizes via quant_row_size).
 */
#ifndef TERN_GGUF_H
#define TERN_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern.h"

typedef enum {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4, GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12, GGUF_TYPE_COUNT = 13
} gguf_vtype_t;

typedef struct {
    uint64_t len;
    const char *data; /* NOT NUL-terminated; points into the mapping */
} gguf_str_t;

typedef struct gguf_kv gguf_kv_t;  /* one metadata entry (opaque) */

typedef struct {
    const char *name; /* NUL-terminated copy owned by the file */
    int type;         /* tern_type_t / ggml_type id */
    int n_dims;
    int64_t ne[4];    /* ne[0] = row length (elements), unused dims = 1 */
    uint64_t offset;  /* relative to the data section */
    uint64_t size;    /* bytes */
    const void *data; /* into the mapping */
} gguf_tensor_t;

typedef struct gguf_file gguf_file_t;

/* Open and validate a whole file. NULL on error with a precise message. */
gguf_file_t *gguf_open(const char *path, tern_error_t *err);
/* Same over a caller-owned buffer (fuzzing, tests); buf must outlive the file. */
gguf_file_t *gguf_open_buffer(const void *buf, size_t len, tern_error_t *err);
void gguf_close(gguf_file_t *f);

uint32_t gguf_version(const gguf_file_t *f);
uint64_t gguf_file_size(const gguf_file_t *f);
uint32_t gguf_alignment(const gguf_file_t *f);

/* Metadata. */
int64_t gguf_n_kv(const gguf_file_t *f);
const gguf_kv_t *gguf_kv_at(const gguf_file_t *f, int64_t i);
const gguf_kv_t *gguf_find(const gguf_file_t *f, const char *key); /* NULL if absent */
const char *gguf_kv_key(const gguf_kv_t *kv);
gguf_vtype_t gguf_kv_type(const gguf_kv_t *kv);
/* For arrays: element type and count; element access by index. */
gguf_vtype_t gguf_arr_type(const gguf_kv_t *kv);
uint64_t gguf_arr_len(const gguf_kv_t *kv);
gguf_str_t gguf_arr_str(const gguf_kv_t *kv, uint64_t i);       /* STRING arrays */
const void *gguf_arr_data(const gguf_kv_t *kv);                  /* numeric arrays, packed LE */

/* Typed getters. Integer getters accept any integer type whose value fits;
 * return 0 on success, TERN_EFORMAT (wrong type / out of range) or
 * TERN_EINVAL (absent) with a message naming the key. */
int gguf_get_u64(const gguf_file_t *f, const char *key, uint64_t *out, tern_error_t *err);
int gguf_get_i64(const gguf_file_t *f, const char *key, int64_t *out, tern_error_t *err);
int gguf_get_f32(const gguf_file_t *f, const char *key, float *out, tern_error_t *err); /* f32/f64/int */
int gguf_get_bool(const gguf_file_t *f, const char *key, bool *out, tern_error_t *err);
int gguf_get_str(const gguf_file_t *f, const char *key, gguf_str_t *out, tern_error_t *err);
/* Architecture-prefixed: gguf_get_arch_u64(f, "block_count") reads
 * "<general.architecture>.block_count". */
int gguf_get_arch_u64(const gguf_file_t *f, const char *suffix, uint64_t *out, tern_error_t *err);
int gguf_get_arch_f32(const gguf_file_t *f, const char *suffix, float *out, tern_error_t *err);
const char *gguf_arch(const gguf_file_t *f); /* NUL-terminated copy, or NULL */

/* Tensors. */
int64_t gguf_n_tensors(const gguf_file_t *f);
const gguf_tensor_t *gguf_tensor_at(const gguf_file_t *f, int64_t i);
const gguf_tensor_t *gguf_tensor_find(const gguf_file_t *f, const char *name);
/* Lookup that checks shape (n_dims dims, ne[i] == want[i]; want[i] < 0 means
 * any) and that the type is in the NUL-terminated-by -1 list `types` (NULL =
 * any type). Error messages name the tensor and what differs. */
const gguf_tensor_t *gguf_tensor_get(const gguf_file_t *f, const char *name, int n_dims, const int64_t *want,
                                     const int *types, tern_error_t *err);

/* ---- writer --------------------------------------------------------------
 * Build metadata and tensor list in memory, then write in one go. Tensor data
 * is provided by pointer (copied at write time). */
typedef struct gguf_writer gguf_writer_t;
gguf_writer_t *gguf_writer_new(uint32_t alignment);
void gguf_writer_free(gguf_writer_t *w);
int gguf_w_u8(gguf_writer_t *w, const char *key, uint8_t v);
int gguf_w_i8(gguf_writer_t *w, const char *key, int8_t v);
int gguf_w_u16(gguf_writer_t *w, const char *key, uint16_t v);
int gguf_w_i16(gguf_writer_t *w, const char *key, int16_t v);
int gguf_w_u32(gguf_writer_t *w, const char *key, uint32_t v);
int gguf_w_i32(gguf_writer_t *w, const char *key, int32_t v);
int gguf_w_u64(gguf_writer_t *w, const char *key, uint64_t v);
int gguf_w_i64(gguf_writer_t *w, const char *key, int64_t v);
int gguf_w_f32(gguf_writer_t *w, const char *key, float v);
int gguf_w_f64(gguf_writer_t *w, const char *key, double v);
int gguf_w_bool(gguf_writer_t *w, const char *key, bool v);
int gguf_w_str(gguf_writer_t *w, const char *key, const char *v);
/* Numeric array of n elements of type et (packed little-endian in data). */
int gguf_w_arr(gguf_writer_t *w, const char *key, gguf_vtype_t et, const void *data, uint64_t n);
int gguf_w_arr_str(gguf_writer_t *w, const char *key, const char *const *v, const uint64_t *lens, uint64_t n);
/* Copy every key of src (except those for which skip(key) returns true). */
int gguf_w_copy_kv(gguf_writer_t *w, const gguf_file_t *src, bool (*skip)(const char *key));
/* Add a tensor: data must stay valid until gguf_writer_write returns;
 * size must equal quant_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]. */
int gguf_w_tensor(gguf_writer_t *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data,
                  uint64_t size);
int gguf_writer_write(gguf_writer_t *w, const char *path, tern_error_t *err);

#endif
