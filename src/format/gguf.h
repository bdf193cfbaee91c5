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

#include "tern_error.h"

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

/* Open and validate a whole file (the validity rules are specified at the top
 * of gguf.c). NULL on error, with err->code (TERN_EIO, TERN_EFORMAT,
 * TERN_EUNSUP, TERN_ENOMEM) and a message naming the path, the entry and the
 * offset. The returned file owns the mapping; every pointer it hands out
 * (keys, names, strings, tensor data) is valid until gguf_close. Read-only
 * after open: any number of threads may call the getters concurrently. */
gguf_file_t *gguf_open(const char *path, tern_error_t *err);
/* Same over a caller-owned buffer (fuzzing, tests); buf must outlive the file. */
gguf_file_t *gguf_open_buffer(const void *buf, size_t len, tern_error_t *err);
void gguf_close(gguf_file_t *f);

uint32_t gguf_version(const gguf_file_t *f);
uint64_t gguf_file_size(const gguf_file_t *f);
uint32_t gguf_alignment(const gguf_file_t *f);
/* The offset in the file of p, a pointer into the file's bytes (tensor data,
 * strings), or -1 when p is not one: for reading those bytes again by
 * another route (the expert cache's direct reads). */
int64_t gguf_file_offset(const gguf_file_t *f, const void *p);

/* Metadata. */
int64_t gguf_n_kv(const gguf_file_t *f);
const gguf_kv_t *gguf_kv_at(const gguf_file_t *f, int64_t i);
const gguf_kv_t *gguf_find(const gguf_file_t *f, const char *key); /* NULL if absent */
const char *gguf_kv_key(const gguf_kv_t *kv);
gguf_vtype_t gguf_kv_type(const gguf_kv_t *kv);
/* For arrays: element type and count (GGUF_TYPE_COUNT and 0 for a non-array);
 * element access by index. gguf_arr_str returns {0, NULL} for a non-string
 * array or an index past the end. Nested arrays (element type GGUF_ARRAY)
 * have no typed accessor: use gguf_kv_raw. */
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

/* Scalar and raw access to one entry (for dumping and copying metadata). */
const void *gguf_kv_data(const gguf_kv_t *kv);  /* scalar value bytes (LE); NULL for string/array */
gguf_str_t gguf_kv_str(const gguf_kv_t *kv);    /* STRING entries; {0, NULL} otherwise */
/* The encoded value as stored after the type field (len bytes), e.g. for a
 * nested array, which has no typed accessor. */
const void *gguf_kv_raw(const gguf_kv_t *kv, uint64_t *len);
size_t gguf_vtype_size(gguf_vtype_t t);          /* 0 for STRING / ARRAY / unknown */
const char *gguf_vtype_name(gguf_vtype_t t);     /* "u32", "string" ...; "?" if unknown */
uint64_t gguf_data_offset(const gguf_file_t *f); /* file offset of the tensor data section */

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
/* alignment 0 = default 32; NULL if not a power of two. Every gguf_w_*
 * returns 0 or a TERN_E* code with the reason in gguf_writer_errmsg. Setting
 * a key that exists replaces its value; setting "general.alignment" (u32
 * power of two) changes the writer's alignment. */
gguf_writer_t *gguf_writer_new(uint32_t alignment);
void gguf_writer_free(gguf_writer_t *w);
const char *gguf_writer_errmsg(const gguf_writer_t *w);
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
int gguf_w_strn(gguf_writer_t *w, const char *key, const char *v, uint64_t len); /* may hold any bytes */
/* Numeric array of n elements of type et (packed little-endian in data). */
int gguf_w_arr(gguf_writer_t *w, const char *key, gguf_vtype_t et, const void *data, uint64_t n);
int gguf_w_arr_str(gguf_writer_t *w, const char *key, const char *const *v, const uint64_t *lens, uint64_t n);
/* Copy every key of src (except those for which skip(key) returns true). */
int gguf_w_copy_kv(gguf_writer_t *w, const gguf_file_t *src, bool (*skip)(const char *key));
/* Copy one entry of a file being read (any type, nested arrays included). */
int gguf_w_kv(gguf_writer_t *w, const gguf_kv_t *kv);
/* Add a tensor: data must stay valid until gguf_writer_write returns;
 * size must equal quant_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]. */
int gguf_w_tensor(gguf_writer_t *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data,
                  uint64_t size);
/* A tensor whose bytes are produced at write time, a band of whole rows at a
 * time (rows = ne[1]*ne[2]*ne[3], each quant_row_size(type, ne[0]) bytes):
 * fill writes n_rows rows starting at row0 into dst and returns 0, or an
 * error code (with err filled) that aborts the write. Bands are at most
 * 64 MiB (or one row), so models larger than memory can be written. */
typedef int (*gguf_fill_fn)(void *ctx, const char *name, int64_t row0, int64_t n_rows, void *dst,
                            tern_error_t *err);
int gguf_w_tensor_fill(gguf_writer_t *w, const char *name, int type, int n_dims, const int64_t *ne, gguf_fill_fn fill,
                       void *ctx);
int64_t gguf_writer_n_tensors(const gguf_writer_t *w);
/* Optional progress report of gguf_writer_write (fn NULL = none, the
 * default): called on the writing thread once the header is out, after each
 * band of tensor data (at most 64 MiB, pointer tensors included) with the
 * bytes written so far and the file's total size, and a last time with
 * last = true when the write ends (done == total on success, less when it
 * failed), so a display can end its line. */
typedef void (*gguf_progress_fn)(void *ctx, uint64_t done, uint64_t total, bool last);
void gguf_writer_set_progress(gguf_writer_t *w, gguf_progress_fn fn, void *ctx);
/* Write PATH (via PATH.tmp, renamed on success). Tensor offsets are assigned
 * in the order the tensors were added, each padded to the alignment. */
int gguf_writer_write(gguf_writer_t *w, const char *path, tern_error_t *err);

#endif
