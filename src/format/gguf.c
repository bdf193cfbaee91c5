/*
 * gguf.c - the GGUF reader: maps a file read-only and parses it into an index
 * of metadata entries and tensors that point into the mapping. Model files come
 * from untrusted mirrors, so the parser treats every byte as hostile: it never
 * reads past the buffer, never allocates more than a bounded multiple of the
 * file size, never aborts, and reports what was wrong and where.
 *
 * THE FORMAT (GGUF v3; v2 has the same layout; v1, with 32-bit counts, is
 * refused). All integers little-endian, no implicit padding between fields.
 *
 *   header     magic "GGUF" (4 bytes) | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x     string key | u32 value_type | value
 *   n_tensors x string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type |
 *              u64 offset
 *   padding    zero or more bytes up to the next multiple of `alignment`
 *   data       tensor bytes; tensor i at data_start + offset_i
 *
 *   string     u64 len | len bytes (UTF-8 by convention, not NUL-terminated)
 *   value      by value_type: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32,
 *              7 bool (1 byte, 0 or 1), 8 string, 10 u64, 11 i64, 12 f64,
 *              9 array = u32 elem_type | u64 count | count x value of elem_type
 *   alignment  metadata key "general.alignment" (u32), default 32.
 *
 * VALIDITY RULES (each one enforced below, in this order; the first broken rule
 * is the error reported):
 *   1. The magic is "GGUF"; the version is 2 or 3 (a byte-swapped version
 *      means a big-endian file, which is refused by name).
 *   2. n_kv <= GGUF_MAX_KV and n_tensors <= GGUF_MAX_TENSORS, and each also fits
 *      in the bytes that remain at the smallest possible encoding of one entry
 *      (so no allocation is sized by an unchecked count).
 *   3. Every length is checked against the bytes that remain before it is
 *      used; every product and sum is overflow-checked.
 *   4. Keys: 1..GGUF_MAX_KEY bytes, no NUL byte, unique (checked once all are
 *      read, by sorting: O(n log n) whatever the keys, unlike a hash). Value types known.
 *      Strings at most GGUF_MAX_STR bytes. Bools 0 or 1. Arrays may nest (an
 *      extension; llama.cpp refuses nesting) at most GGUF_MAX_DEPTH levels.
 *   5. general.alignment, when present, is a u32 power of two.
 *   6. Tensor names: 1..GGUF_MAX_NAME bytes, no NUL byte, unique. 1 <= n_dims
 *      <= 4; every ne[i] >= 1; the element count fits in int64; the type is a
 *      weight type tern knows (quant.h); ne[0] is a multiple of the type's
 *      block size; the byte size fits in uint64.
 *   7. Offsets are multiples of the alignment; data_start = align_up(end of
 *      tensor infos) lies inside the file when there are tensors; every
 *      tensor's [offset, offset + size) lies inside the data section; no two
 *      tensors overlap (they may appear in any order, with gaps).
 * Files without tensors (vocab files) may end right after the metadata.
 *
 * Recovery: none. A file that breaks a rule is rejected as a whole; the caller
 * gets NULL and a message naming the entry (by index and name) and the offset.
 */
#define _GNU_SOURCE
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "format/quant.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the GGUF reader assumes a little-endian host");

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KEY 65535u
#define GGUF_MAX_NAME 1024u
#define GGUF_MAX_STR (1ull << 30)
#define GGUF_MAX_DEPTH 8

/* Smallest encodings, used to bound counts by the bytes that remain. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)           /* key len, 1-byte key, type, u8 value */
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8) /* name len, name, n_dims, ne0, type, offset */

struct gguf_kv {
    const char *key;      /* NUL-terminated copy in the file's arena */
    gguf_vtype_t type;
    gguf_vtype_t arr_type; /* arrays only */
    uint64_t n;           /* arrays: element count */
    const uint8_t *val;   /* first byte of the value (after the type field) */
    uint64_t val_len;     /* encoded bytes of the value */
    const uint8_t *elems; /* arrays: first element (after elem type and count) */
    const uint8_t **strs; /* string arrays: pointer to each element's length field */
};

struct gguf_file {
    const uint8_t *base;
    size_t len;
    void *map;       /* mmap'ed region, or NULL */
    void *owned;     /* pread fallback buffer, or NULL */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start;
    int64_t n_kv;
    int64_t n_tensors;
    struct gguf_kv *kv;
    gguf_tensor_t *tensors;
    char *arena; /* keys and tensor names, NUL-terminated (mmap'ed, arena_len bytes) */
    size_t arena_len;
    const uint8_t **str_ptrs; /* element pointers of all string arrays */
    /* Indices sorted by key / name: duplicate detection and lookup by binary
     * search. Not a hash table: keys are attacker-chosen, and colliding keys
     * would make a hash quadratic; sorting costs O(n log n) comparisons
     * whatever the keys are. */
    int64_t *kv_sorted;
    int64_t *t_sorted;
    char *arch; /* copy of general.architecture, or NULL */
};

/* ---- bounded reading ------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t len;
    size_t pos;
    tern_error_t *err;
} rd_t;

static size_t rd_left(const rd_t *r) { return r->len - r->pos; }

static int rd_trunc(rd_t *r, const char *ctx, const char *what, uint64_t need) {
    return tern_err(r->err, TERN_EFORMAT, "%s%struncated reading %s at offset %zu (need %" PRIu64 " bytes, %zu left)",
                    ctx, *ctx ? ": " : "", what, r->pos, need, rd_left(r));
}

static int rd_bytes(rd_t *r, void *out, size_t n, const char *ctx, const char *what) {
    if (rd_left(r) < n) return rd_trunc(r, ctx, what, n);
    memcpy(out, r->p + r->pos, n);
    r->pos += n;
    return 0;
}

static int rd_u32(rd_t *r, uint32_t *v, const char *ctx, const char *what) { return rd_bytes(r, v, 4, ctx, what); }
static int rd_u64(rd_t *r, uint64_t *v, const char *ctx, const char *what) { return rd_bytes(r, v, 8, ctx, what); }

/* A string: length bounded by `max` and by the bytes left. On success *s points
 * at the bytes in the buffer. */
static int rd_str(rd_t *r, const uint8_t **s, uint64_t *n, uint64_t max, const char *ctx, const char *what) {
    char w[64];
    snprintf(w, sizeof w, "%s length", what);
    int rc = rd_u64(r, n, ctx, w);
    if (rc) return rc;
    if (*n > max)
        return tern_err(r->err, TERN_EFORMAT, "%s%s%s length %" PRIu64 " at offset %zu exceeds the limit of %" PRIu64,
                        ctx, *ctx ? ": " : "", what, *n, r->pos - 8, max);
    if (*n > rd_left(r))
        return tern_err(r->err, TERN_EFORMAT,
                        "%s%s%s length %" PRIu64 " at offset %zu runs past end of file (%zu bytes left)", ctx,
                        *ctx ? ": " : "", what, *n, r->pos - 8, rd_left(r));
    *s = r->p + r->pos;
    r->pos += (size_t)*n;
    return 0;
}

/* ---- value types ------------------------------------------------------------ */

size_t gguf_vtype_size(gguf_vtype_t t) {
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gguf_vtype_name(gguf_vtype_t t) {
    static const char *names[GGUF_TYPE_COUNT] = {"u8",   "i8",     "u16", "i16", "u32", "i32", "f32",
                                                 "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "?";
}

/* Validate and skip the elements of an array whose element type and count
 * have been read. Depth counts array levels (the outermost array is 1). */
static int skip_elems(rd_t *r, uint32_t et, uint64_t n, int depth, const char *ctx) {
    if (et >= GGUF_TYPE_COUNT)
        return tern_err(r->err, TERN_EFORMAT, "%s: unknown array element type %u at offset %zu", ctx, et, r->pos - 12);
    if (et == GGUF_STRING) {
        if (n > rd_left(r) / 8)
            return tern_err(r->err, TERN_EFORMAT,
                            "%s: array of %" PRIu64 " strings at offset %zu cannot fit in the %zu bytes left", ctx, n,
                            r->pos, rd_left(r));
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *s = NULL;
            uint64_t len = 0;
            int rc = rd_str(r, &s, &len, GGUF_MAX_STR, ctx, "array string");
            if (rc) return rc;
        }
        return 0;
    }
    if (et == GGUF_ARRAY) {
        if (depth + 1 > GGUF_MAX_DEPTH)
            return tern_err(r->err, TERN_EFORMAT, "%s: arrays nested deeper than %d levels at offset %zu", ctx,
                            GGUF_MAX_DEPTH, r->pos);
        if (n > rd_left(r) / 12)
            return tern_err(r->err, TERN_EFORMAT,
                            "%s: array of %" PRIu64 " arrays at offset %zu cannot fit in the %zu bytes left", ctx, n,
                            r->pos, rd_left(r));
        for (uint64_t i = 0; i < n; i++) {
            uint32_t et2 = 0;
            uint64_t n2 = 0;
            int rc = rd_u32(r, &et2, ctx, "nested array element type");
            if (!rc) rc = rd_u64(r, &n2, ctx, "nested array length");
            if (!rc) rc = skip_elems(r, et2, n2, depth + 1, ctx);
            if (rc) return rc;
        }
        return 0;
    }
    size_t es = gguf_vtype_size((gguf_vtype_t)et);
    if (n > rd_left(r) / es)
        return tern_err(r->err, TERN_EFORMAT,
                        "%s: array of %" PRIu64 " %s at offset %zu runs past end of file (%zu bytes left)", ctx, n,
                        gguf_vtype_name((gguf_vtype_t)et), r->pos, rd_left(r));
    if (et == GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (r->p[r->pos + i] > 1)
                return tern_err(r->err, TERN_EFORMAT, "%s: bool array element %" PRIu64 " has value %u (not 0 or 1)",
                                ctx, i, r->p[r->pos + i]);
    r->pos += (size_t)(n * es);
    return 0;
}

/* ---- name indexes ------------------------------------------------------------ */

static int cmp_kv(const void *a, const void *b, void *ctx) {
    const struct gguf_kv *kv = ctx;
    return strcmp(kv[*(const int64_t *)a].key, kv[*(const int64_t *)b].key);
}

static int cmp_tensor(const void *a, const void *b, void *ctx) {
    const gguf_tensor_t *t = ctx;
    return strcmp(t[*(const int64_t *)a].name, t[*(const int64_t *)b].name);
}

/* Sort idx[0..n) by the names; return the first duplicate pair (lower index
 * first) in *dup, or false. */
static bool sort_names(int64_t *idx, int64_t n, int (*cmp)(const void *, const void *, void *), void *base,
                       const char *(*name)(const void *base, int64_t i), int64_t dup[2]) {
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    qsort_r(idx, (size_t)n, sizeof *idx, cmp, base);
    for (int64_t i = 1; i < n; i++)
        if (!strcmp(name(base, idx[i - 1]), name(base, idx[i]))) {
            dup[0] = idx[i - 1] < idx[i] ? idx[i - 1] : idx[i];
            dup[1] = idx[i - 1] < idx[i] ? idx[i] : idx[i - 1];
            return true;
        }
    return false;
}

static const char *kv_name(const void *base, int64_t i) { return ((const struct gguf_kv *)base)[i].key; }
static const char *t_name(const void *base, int64_t i) { return ((const gguf_tensor_t *)base)[i].name; }

static int64_t bsearch_name(const int64_t *idx, int64_t n, const void *base,
                            const char *(*name)(const void *base, int64_t i), const char *want) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name(base, idx[mid]), want);
        if (c == 0) return idx[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* ---- parsing ------------------------------------------------------------------- */

static int parse_kv(gguf_file_t *f, rd_t *r, int64_t i, char **arena_pos, uint64_t *n_strs_total) {
    struct gguf_kv *kv = &f->kv[i];
    char ctx[160];
    snprintf(ctx, sizeof ctx, "metadata entry #%" PRId64, i);
    const uint8_t *ks = NULL;
    uint64_t klen = 0;
    int rc = rd_str(r, &ks, &klen, GGUF_MAX_KEY, ctx, "key");
    if (rc) return rc;
    if (klen == 0) return tern_err(r->err, TERN_EFORMAT, "%s: empty key at offset %zu", ctx, r->pos - 8);
    if (memchr(ks, 0, (size_t)klen))
        return tern_err(r->err, TERN_EFORMAT, "%s: key contains a NUL byte at offset %zu", ctx, r->pos - (size_t)klen);
    memcpy(*arena_pos, ks, (size_t)klen);
    (*arena_pos)[klen] = 0;
    kv->key = *arena_pos;
    *arena_pos += klen + 1;
    snprintf(ctx, sizeof ctx, "metadata key '%.100s'", kv->key);

    uint32_t t = 0;
    if ((rc = rd_u32(r, &t, ctx, "value type"))) return rc;
    if (t >= GGUF_TYPE_COUNT)
        return tern_err(r->err, TERN_EFORMAT, "%s: unknown value type %u at offset %zu", ctx, t, r->pos - 4);
    kv->type = (gguf_vtype_t)t;
    kv->val = r->p + r->pos;
    size_t start = r->pos;
    if (t == GGUF_STRING) {
        const uint8_t *s = NULL;
        uint64_t n = 0;
        if ((rc = rd_str(r, &s, &n, GGUF_MAX_STR, ctx, "string value"))) return rc;
    } else if (t == GGUF_ARRAY) {
        uint32_t et = 0;
        if ((rc = rd_u32(r, &et, ctx, "array element type"))) return rc;
        if ((rc = rd_u64(r, &kv->n, ctx, "array length"))) return rc;
        kv->arr_type = (gguf_vtype_t)et;
        kv->elems = r->p + r->pos;
        if ((rc = skip_elems(r, et, kv->n, 1, ctx))) return rc;
        if (et == GGUF_STRING) *n_strs_total += kv->n;
    } else {
        size_t es = gguf_vtype_size(kv->type);
        if (rd_left(r) < es) return rd_trunc(r, ctx, "value", es);
        if (t == GGUF_BOOL && r->p[r->pos] > 1)
            return tern_err(r->err, TERN_EFORMAT, "%s: bool value %u at offset %zu is not 0 or 1", ctx, r->p[r->pos],
                            r->pos);
        r->pos += es;
    }
    kv->val_len = r->pos - start;
    return 0;
}

/* Second pass over string arrays: an index of element pointers, so that
 * gguf_arr_str is O(1). The elements were validated by skip_elems. */
static void index_strings(gguf_file_t *f) {
    const uint8_t **next = f->str_ptrs;
    for (int64_t i = 0; i < f->n_kv; i++) {
        struct gguf_kv *kv = &f->kv[i];
        if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING) continue;
        kv->strs = next;
        const uint8_t *p = kv->elems;
        for (uint64_t j = 0; j < kv->n; j++) {
            uint64_t len;
            memcpy(&len, p, 8);
            next[j] = p;
            p += 8 + len;
        }
        next += kv->n;
    }
}

static int parse_tensor(gguf_file_t *f, rd_t *r, int64_t i, char **arena_pos) {
    gguf_tensor_t *t = &f->tensors[i];
    char ctx[160];
    snprintf(ctx, sizeof ctx, "tensor #%" PRId64, i);
    const uint8_t *ns = NULL;
    uint64_t nlen = 0;
    int rc = rd_str(r, &ns, &nlen, GGUF_MAX_NAME, ctx, "name");
    if (rc) return rc;
    if (nlen == 0) return tern_err(r->err, TERN_EFORMAT, "%s: empty name at offset %zu", ctx, r->pos - 8);
    if (memchr(ns, 0, (size_t)nlen)) return tern_err(r->err, TERN_EFORMAT, "%s: name contains a NUL byte", ctx);
    memcpy(*arena_pos, ns, (size_t)nlen);
    (*arena_pos)[nlen] = 0;
    t->name = *arena_pos;
    *arena_pos += nlen + 1;
    snprintf(ctx, sizeof ctx, "tensor '%.100s'", t->name);

    uint32_t nd = 0;
    if ((rc = rd_u32(r, &nd, ctx, "n_dims"))) return rc;
    if (nd < 1 || nd > 4)
        return tern_err(r->err, TERN_EFORMAT, "%s: n_dims %u at offset %zu is outside 1..4", ctx, nd, r->pos - 4);
    t->n_dims = (int)nd;
    int64_t nel = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne = 0;
        if ((rc = rd_u64(r, &ne, ctx, "dimension"))) return rc;
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return tern_err(r->err, TERN_EFORMAT, "%s: dimension %u is %" PRIu64 " (must be 1..2^63-1)", ctx, d, ne);
        t->ne[d] = (int64_t)ne;
        if (__builtin_mul_overflow(nel, (int64_t)ne, &nel))
            return tern_err(r->err, TERN_EFORMAT, "%s: element count overflows int64 at dimension %u", ctx, d);
    }
    uint32_t type = 0;
    if ((rc = rd_u32(r, &type, ctx, "type"))) return rc;
    const quant_traits_t *qt = quant_traits((int)type);
    if (!qt || !qt->weight) {
        if (qt)
            return tern_err(r->err, TERN_EFORMAT, "%s: type %s (%u) is not a storage type", ctx, qt->name, type);
        return tern_err(r->err, TERN_EUNSUP, "%s: unknown or unsupported tensor type %u", ctx, type);
    }
    t->type = (int)type;
    if (t->ne[0] % qt->blck)
        return tern_err(r->err, TERN_EFORMAT, "%s: row length %" PRId64 " is not a multiple of the %s block size %d",
                        ctx, t->ne[0], qt->name, qt->blck);
    uint64_t rows = (uint64_t)(nel / t->ne[0]);
    uint64_t row_bytes;
    if (tern_mul_overflow_u64((uint64_t)(t->ne[0] / qt->blck), (uint64_t)qt->size, &row_bytes) ||
        tern_mul_overflow_u64(row_bytes, rows, &t->size))
        return tern_err(r->err, TERN_EFORMAT, "%s: byte size overflows", ctx);
    if ((rc = rd_u64(r, &t->offset, ctx, "offset"))) return rc;
    if (t->offset % f->alignment)
        return tern_err(r->err, TERN_EFORMAT, "%s: offset %" PRIu64 " is not a multiple of the alignment %u", ctx,
                        t->offset, f->alignment);
    return 0;
}

static int cmp_offset(const void *a, const void *b, void *base) {
    const gguf_tensor_t *t = base;
    uint64_t x = t[*(const int64_t *)a].offset, y = t[*(const int64_t *)b].offset;
    return x < y ? -1 : x > y;
}

static int check_layout(gguf_file_t *f, tern_error_t *err) {
    uint64_t avail = f->len - f->data_start; /* data_start <= len checked by the caller */
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor_t *t = &f->tensors[i];
        uint64_t end;
        if (tern_add_overflow_u64(t->offset, t->size, &end) || end > avail)
            return tern_err(err, TERN_EFORMAT,
                            "tensor '%.100s': offset %" PRIu64 " + size %" PRIu64
                            " beyond end of file (%zu bytes; data section starts at %" PRIu64 ")",
                            t->name, t->offset, t->size, f->len, f->data_start);
        t->data = f->base + f->data_start + t->offset;
    }
    int64_t *order = malloc(sizeof(int64_t) * (size_t)(f->n_tensors ? f->n_tensors : 1));
    if (!order) return tern_err(err, TERN_ENOMEM, "out of memory sorting %" PRId64 " tensors", f->n_tensors);
    for (int64_t i = 0; i < f->n_tensors; i++) order[i] = i;
    qsort_r(order, (size_t)f->n_tensors, sizeof *order, cmp_offset, f->tensors);
    int rc = 0;
    for (int64_t i = 1; i < f->n_tensors; i++) {
        const gguf_tensor_t *a = &f->tensors[order[i - 1]], *b = &f->tensors[order[i]];
        if (a->offset + a->size > b->offset) {
            rc = tern_err(err, TERN_EFORMAT,
                          "tensors '%.100s' (offset %" PRIu64 ", size %" PRIu64 ") and '%.100s' (offset %" PRIu64
                          ") overlap",
                          a->name, a->offset, a->size, b->name, b->offset);
            break;
        }
    }
    free(order);
    return rc;
}

static int parse(gguf_file_t *f, tern_error_t *err) {
    rd_t r = {f->base, f->len, 0, err};
    int rc;
    if (f->len == 0) return tern_err(err, TERN_EFORMAT, "file is empty (0 bytes), not a GGUF file");
    uint32_t magic = 0;
    if ((rc = rd_u32(&r, &magic, "header", "magic"))) return rc;
    if (magic != GGUF_MAGIC) {
        const uint8_t *m = f->base;
        return tern_err(err, TERN_EFORMAT, "bad magic %02x %02x %02x %02x (expected \"GGUF\"): not a GGUF file", m[0],
                        m[1], m[2], m[3]);
    }
    if ((rc = rd_u32(&r, &f->version, "header", "version"))) return rc;
    if (f->version == 1)
        return tern_err(err, TERN_EUNSUP, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (f->version != 2 && f->version != 3) {
        uint32_t sw = __builtin_bswap32(f->version);
        if (sw == 2 || sw == 3)
            return tern_err(err, TERN_EUNSUP, "big-endian GGUF (version %u byte-swapped) is not supported", sw);
        return tern_err(err, TERN_EUNSUP, "unsupported GGUF version %u (only versions 2 and 3)", f->version);
    }
    uint64_t n_tensors = 0, n_kv = 0;
    if ((rc = rd_u64(&r, &n_tensors, "header", "tensor count"))) return rc;
    if ((rc = rd_u64(&r, &n_kv, "header", "metadata count"))) return rc;
    if (n_kv > GGUF_MAX_KV || n_kv > rd_left(&r) / MIN_KV_BYTES)
        return tern_err(err, TERN_EFORMAT,
                        "header: metadata count %" PRIu64 " is impossible (limit %u; %zu bytes left hold at most %zu)",
                        n_kv, GGUF_MAX_KV, rd_left(&r), rd_left(&r) / MIN_KV_BYTES);
    if (n_tensors > GGUF_MAX_TENSORS || n_tensors > (rd_left(&r) - n_kv * MIN_KV_BYTES) / MIN_TENSOR_BYTES)
        return tern_err(err, TERN_EFORMAT,
                        "header: tensor count %" PRIu64 " is impossible (limit %u; %zu bytes left)", n_tensors,
                        GGUF_MAX_TENSORS, rd_left(&r));
    f->n_kv = (int64_t)n_kv;
    f->n_tensors = (int64_t)n_tensors;

    /* Every allocation below is bounded by a small multiple of the file size:
     * the counts were bounded above, names and keys by the bytes they occupy. */
    f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *f->tensors);
    /* The arena is bounded by the file's length (every name and key is
     * copied from it) but uses a few KB: reserve address space only
     * (MAP_NORESERVE), so a file larger than memory does not ask for that
     * much memory up front. */
    f->arena_len = f->len + (size_t)(n_kv + n_tensors) + 1;
    f->arena = mmap(NULL, f->arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (f->arena == MAP_FAILED) f->arena = NULL;
    f->kv_sorted = malloc(sizeof(int64_t) * (size_t)(n_kv ? n_kv : 1));
    f->t_sorted = malloc(sizeof(int64_t) * (size_t)(n_tensors ? n_tensors : 1));
    if (!f->kv || !f->tensors || !f->arena || !f->kv_sorted || !f->t_sorted)
        return tern_err(err, TERN_ENOMEM, "out of memory indexing %" PRIu64 " keys and %" PRIu64 " tensors", n_kv,
                        n_tensors);

    char *arena_pos = f->arena;
    uint64_t n_strs = 0;
    for (int64_t i = 0; i < f->n_kv; i++)
        if ((rc = parse_kv(f, &r, i, &arena_pos, &n_strs))) return rc;
    int64_t dup[2];
    if (sort_names(f->kv_sorted, f->n_kv, cmp_kv, f->kv, kv_name, dup))
        return tern_err(err, TERN_EFORMAT, "metadata key '%.100s': duplicate key (entries #%" PRId64 " and #%" PRId64 ")",
                        f->kv[dup[0]].key, dup[0], dup[1]);
    f->str_ptrs = malloc(sizeof(*f->str_ptrs) * (size_t)(n_strs ? n_strs : 1)); /* n_strs <= len / 8 */
    if (!f->str_ptrs) return tern_err(err, TERN_ENOMEM, "out of memory indexing %" PRIu64 " strings", n_strs);
    index_strings(f);

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv_t *al = gguf_find(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_UINT32)
            return tern_err(err, TERN_EFORMAT, "metadata key 'general.alignment' has type %s (must be u32)",
                            gguf_vtype_name(al->type));
        uint32_t a;
        memcpy(&a, al->val, 4);
        if (a == 0 || (a & (a - 1)))
            return tern_err(err, TERN_EFORMAT, "metadata key 'general.alignment' is %u (must be a power of two)", a);
        f->alignment = a;
    }
    const gguf_kv_t *ar = gguf_find(f, "general.architecture");
    if (ar && ar->type == GGUF_STRING) {
        gguf_str_t s = gguf_kv_str(ar);
        if (!memchr(s.data, 0, (size_t)s.len)) {
            f->arch = malloc((size_t)s.len + 1);
            if (!f->arch) return tern_err(err, TERN_ENOMEM, "out of memory");
            memcpy(f->arch, s.data, (size_t)s.len);
            f->arch[s.len] = 0;
        }
    }

    for (int64_t i = 0; i < f->n_tensors; i++)
        if ((rc = parse_tensor(f, &r, i, &arena_pos))) return rc;
    if (sort_names(f->t_sorted, f->n_tensors, cmp_tensor, f->tensors, t_name, dup))
        return tern_err(err, TERN_EFORMAT,
                        "tensor '%.100s': duplicate tensor name (tensors #%" PRId64 " and #%" PRId64 ")",
                        f->tensors[dup[0]].name, dup[0], dup[1]);

    uint64_t pos = r.pos; /* pos <= len, so this cannot overflow */
    f->data_start = (pos + f->alignment - 1) / f->alignment * f->alignment;
    if (f->n_tensors == 0) {
        if (f->data_start > f->len) f->data_start = f->len;
        return 0;
    }
    if (f->data_start > f->len)
        return tern_err(err, TERN_EFORMAT, "data section would start at offset %" PRIu64 ", beyond end of file (%zu)",
                        f->data_start, f->len);
    return check_layout(f, err);
}

/* ---- open / close ---------------------------------------------------------------- */

static gguf_file_t *finish_open(gguf_file_t *f, const char *path, tern_error_t *err) {
    tern_error_t e = {0};
    if (parse(f, &e) != 0) {
        if (path)
            tern_err(err, e.code, "%s: %s", path, e.msg);
        else if (err)
            *err = e;
        gguf_close(f);
        return NULL;
    }
    return f;
}

int64_t gguf_file_offset(const gguf_file_t *f, const void *p) {
    const uint8_t *q = p;
    if (!f || !q || q < f->base || (size_t)(q - f->base) > f->len) return -1;
    return (int64_t)(q - f->base);
}

gguf_file_t *gguf_open_buffer(const void *buf, size_t len, tern_error_t *err) {
    if (!buf && len) {
        tern_err(err, TERN_EINVAL, "gguf_open_buffer: NULL buffer");
        return NULL;
    }
    gguf_file_t *f = calloc(1, sizeof *f);
    if (!f) {
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    f->base = buf ? buf : (const uint8_t *)"";
    f->len = len;
    return finish_open(f, NULL, err);
}

gguf_file_t *gguf_open(const char *path, tern_error_t *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tern_err(err, TERN_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        tern_err(err, TERN_EIO, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        tern_err(err, TERN_EIO, "%s: file too large to map", path);
        close(fd);
        return NULL;
    }
    gguf_file_t *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    f->len = (size_t)st.st_size;
    f->base = (const uint8_t *)"";
    if (f->len > 0) {
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            f->map = m;
            f->base = m;
        } else { /* e.g. a file system without mmap: read it whole */
            f->owned = malloc(f->len);
            if (!f->owned) {
                close(fd);
                free(f);
                tern_err(err, TERN_ENOMEM, "%s: out of memory reading %zu bytes", path, (size_t)st.st_size);
                return NULL;
            }
            size_t got = 0;
            while (got < f->len) {
                ssize_t k = pread(fd, (uint8_t *)f->owned + got, f->len - got, (off_t)got);
                if (k < 0 && errno == EINTR) continue;
                if (k <= 0) {
                    tern_err(err, TERN_EIO, "%s: read failed at offset %zu: %s", path, got,
                             k < 0 ? strerror(errno) : "unexpected end of file");
                    close(fd);
                    gguf_close(f);
                    return NULL;
                }
                got += (size_t)k;
            }
            f->base = f->owned;
        }
    }
    close(fd);
    return finish_open(f, path, err);
}

void gguf_close(gguf_file_t *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->len);
    free(f->owned);
    free(f->kv);
    free(f->tensors);
    if (f->arena) munmap(f->arena, f->arena_len);
    free(f->str_ptrs);
    free(f->kv_sorted);
    free(f->t_sorted);
    free(f->arch);
    free(f);
}

uint32_t gguf_version(const gguf_file_t *f) { return f->version; }
uint64_t gguf_file_size(const gguf_file_t *f) { return f->len; }
uint32_t gguf_alignment(const gguf_file_t *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file_t *f) { return f->data_start; }

/* ---- metadata --------------------------------------------------------------------- */

int64_t gguf_n_kv(const gguf_file_t *f) { return f->n_kv; }

const gguf_kv_t *gguf_kv_at(const gguf_file_t *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? &f->kv[i] : NULL;
}

const gguf_kv_t *gguf_find(const gguf_file_t *f, const char *key) {
    if (!key || !f->kv_sorted) return NULL;
    int64_t j = bsearch_name(f->kv_sorted, f->n_kv, f->kv, kv_name, key);
    return j >= 0 ? &f->kv[j] : NULL;
}

const char *gguf_kv_key(const gguf_kv_t *kv) { return kv->key; }
gguf_vtype_t gguf_kv_type(const gguf_kv_t *kv) { return kv->type; }
gguf_vtype_t gguf_arr_type(const gguf_kv_t *kv) { return kv->type == GGUF_ARRAY ? kv->arr_type : GGUF_TYPE_COUNT; }
uint64_t gguf_arr_len(const gguf_kv_t *kv) { return kv->type == GGUF_ARRAY ? kv->n : 0; }

gguf_str_t gguf_arr_str(const gguf_kv_t *kv, uint64_t i) {
    gguf_str_t s = {0, NULL};
    if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || i >= kv->n) return s;
    memcpy(&s.len, kv->strs[i], 8);
    s.data = (const char *)kv->strs[i] + 8;
    return s;
}

const void *gguf_arr_data(const gguf_kv_t *kv) {
    if (kv->type != GGUF_ARRAY || kv->arr_type == GGUF_STRING) return NULL;
    return kv->elems;
}

const void *gguf_kv_data(const gguf_kv_t *kv) {
    return kv->type == GGUF_STRING || kv->type == GGUF_ARRAY ? NULL : kv->val;
}

gguf_str_t gguf_kv_str(const gguf_kv_t *kv) {
    gguf_str_t s = {0, NULL};
    if (kv->type != GGUF_STRING) return s;
    memcpy(&s.len, kv->val, 8);
    s.data = (const char *)kv->val + 8;
    return s;
}

const void *gguf_kv_raw(const gguf_kv_t *kv, uint64_t *len) {
    *len = kv->val_len;
    return kv->val;
}

/* Integer value of a scalar kv as a sign flag + magnitude-free pair: returns
 * false for non-integer types. */
static bool kv_int(const gguf_kv_t *kv, bool *neg, uint64_t *u, int64_t *s) {
    const uint8_t *p = kv->val;
    int64_t v = 0;
    uint64_t uv = 0;
    bool is_signed = false;
    switch (kv->type) {
    case GGUF_UINT8: uv = p[0]; break;
    case GGUF_INT8: v = (int8_t)p[0]; is_signed = true; break;
    case GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); uv = x; break; }
    case GGUF_INT16: { int16_t x; memcpy(&x, p, 2); v = x; is_signed = true; break; }
    case GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); uv = x; break; }
    case GGUF_INT32: { int32_t x; memcpy(&x, p, 4); v = x; is_signed = true; break; }
    case GGUF_UINT64: memcpy(&uv, p, 8); break;
    case GGUF_INT64: memcpy(&v, p, 8); is_signed = true; break;
    default: return false;
    }
    if (is_signed) {
        *neg = v < 0;
        *s = v;
        *u = v < 0 ? 0 : (uint64_t)v;
    } else {
        *neg = false;
        *u = uv;
        *s = uv > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)uv;
    }
    return true;
}

static const gguf_kv_t *find_or_err(const gguf_file_t *f, const char *key, tern_error_t *err) {
    const gguf_kv_t *kv = gguf_find(f, key);
    if (!kv) tern_err(err, TERN_EINVAL, "metadata key '%s' not found", key);
    return kv;
}

int gguf_get_u64(const gguf_file_t *f, const char *key, uint64_t *out, tern_error_t *err) {
    const gguf_kv_t *kv = find_or_err(f, key, err);
    if (!kv) return TERN_EINVAL;
    bool neg;
    uint64_t u;
    int64_t s;
    if (!kv_int(kv, &neg, &u, &s))
        return tern_err(err, TERN_EFORMAT, "metadata key '%s' has type %s, expected an integer", key,
                        gguf_vtype_name(kv->type));
    if (neg) return tern_err(err, TERN_EFORMAT, "metadata key '%s' is negative (%" PRId64 ")", key, s);
    *out = u;
    return 0;
}

int gguf_get_i64(const gguf_file_t *f, const char *key, int64_t *out, tern_error_t *err) {
    const gguf_kv_t *kv = find_or_err(f, key, err);
    if (!kv) return TERN_EINVAL;
    bool neg;
    uint64_t u;
    int64_t s;
    if (!kv_int(kv, &neg, &u, &s))
        return tern_err(err, TERN_EFORMAT, "metadata key '%s' has type %s, expected an integer", key,
                        gguf_vtype_name(kv->type));
    if (!neg && u > (uint64_t)INT64_MAX)
        return tern_err(err, TERN_EFORMAT, "metadata key '%s' value %" PRIu64 " does not fit in int64", key, u);
    *out = s;
    return 0;
}

int gguf_get_f32(const gguf_file_t *f, const char *key, float *out, tern_error_t *err) {
    const gguf_kv_t *kv = find_or_err(f, key, err);
    if (!kv) return TERN_EINVAL;
    bool neg;
    uint64_t u;
    int64_t s;
    if (kv->type == GGUF_FLOAT32) {
        memcpy(out, kv->val, 4);
    } else if (kv->type == GGUF_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
    } else if (kv_int(kv, &neg, &u, &s)) {
        *out = neg ? (float)s : (float)u;
    } else {
        return tern_err(err, TERN_EFORMAT, "metadata key '%s' has type %s, expected a number", key,
                        gguf_vtype_name(kv->type));
    }
    return 0;
}

int gguf_get_bool(const gguf_file_t *f, const char *key, bool *out, tern_error_t *err) {
    const gguf_kv_t *kv = find_or_err(f, key, err);
    if (!kv) return TERN_EINVAL;
    if (kv->type != GGUF_BOOL)
        return tern_err(err, TERN_EFORMAT, "metadata key '%s' has type %s, expected bool", key,
                        gguf_vtype_name(kv->type));
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file_t *f, const char *key, gguf_str_t *out, tern_error_t *err) {
    const gguf_kv_t *kv = find_or_err(f, key, err);
    if (!kv) return TERN_EINVAL;
    if (kv->type != GGUF_STRING)
        return tern_err(err, TERN_EFORMAT, "metadata key '%s' has type %s, expected string", key,
                        gguf_vtype_name(kv->type));
    *out = gguf_kv_str(kv);
    return 0;
}

const char *gguf_arch(const gguf_file_t *f) { return f->arch; }

static int arch_key(const gguf_file_t *f, const char *suffix, char *buf, size_t n, tern_error_t *err) {
    if (!f->arch) return tern_err(err, TERN_EINVAL, "metadata key 'general.architecture' not found (needed for '%s')", suffix);
    int k = snprintf(buf, n, "%s.%s", f->arch, suffix);
    if (k < 0 || (size_t)k >= n) return tern_err(err, TERN_EINVAL, "metadata key '%s.%s' too long", f->arch, suffix);
    return 0;
}

int gguf_get_arch_u64(const gguf_file_t *f, const char *suffix, uint64_t *out, tern_error_t *err) {
    char key[512];
    int rc = arch_key(f, suffix, key, sizeof key, err);
    return rc ? rc : gguf_get_u64(f, key, out, err);
}

int gguf_get_arch_f32(const gguf_file_t *f, const char *suffix, float *out, tern_error_t *err) {
    char key[512];
    int rc = arch_key(f, suffix, key, sizeof key, err);
    return rc ? rc : gguf_get_f32(f, key, out, err);
}

/* ---- tensors ------------------------------------------------------------------------ */

int64_t gguf_n_tensors(const gguf_file_t *f) { return f->n_tensors; }

const gguf_tensor_t *gguf_tensor_at(const gguf_file_t *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor_t *gguf_tensor_find(const gguf_file_t *f, const char *name) {
    if (!name || !f->t_sorted) return NULL;
    int64_t j = bsearch_name(f->t_sorted, f->n_tensors, f->tensors, t_name, name);
    return j >= 0 ? &f->tensors[j] : NULL;
}

static void fmt_shape(char *buf, size_t n, int n_dims, const int64_t *ne) {
    size_t k = 0;
    buf[0] = 0;
    for (int d = 0; d < n_dims && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "[", ne[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

const gguf_tensor_t *gguf_tensor_get(const gguf_file_t *f, const char *name, int n_dims, const int64_t *want,
                                     const int *types, tern_error_t *err) {
    const gguf_tensor_t *t = gguf_tensor_find(f, name);
    if (!t) {
        tern_err(err, TERN_EFORMAT, "tensor '%s' not found", name);
        return NULL;
    }
    /* Stored n_dims drops trailing 1s (ggml_n_dims), so compare all 4 dims
     * with the unwanted ones required to be 1. */
    bool ok = n_dims >= 1 && n_dims <= 4;
    for (int d = 0; ok && d < 4; d++) {
        if (d < n_dims)
            ok = !want || want[d] < 0 || t->ne[d] == want[d];
        else
            ok = t->ne[d] == 1;
    }
    if (!ok) {
        char have[128], exp[128];
        int64_t w[4];
        for (int d = 0; d < 4; d++) w[d] = d < n_dims && want ? want[d] : 1;
        fmt_shape(have, sizeof have, t->n_dims, t->ne);
        fmt_shape(exp, sizeof exp, n_dims >= 1 && n_dims <= 4 ? n_dims : 0, w);
        tern_err(err, TERN_EFORMAT, "tensor '%s' has shape %s, expected %s (-1 = any)", name, have, exp);
        return NULL;
    }
    if (types) {
        bool found = false;
        char list[256];
        size_t k = 0;
        list[0] = 0;
        for (const int *p = types; *p >= 0; p++) {
            if (*p == t->type) found = true;
            if (k < sizeof list) k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", p == types ? "" : ", ", quant_name(*p));
        }
        if (!found) {
            tern_err(err, TERN_EUNSUP, "tensor '%s' has type %s, expected one of: %s", name, quant_name(t->type), list);
            return NULL;
        }
    }
    return t;
}
