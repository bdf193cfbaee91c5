/*
 * gguf_write.c - the GGUF v3 writer. Metadata and the tensor list are built in
 * memory; gguf_writer_write then streams header, metadata, tensor infos,
 * padding and tensor data to PATH.tmp and renames it over PATH, so a crash
 * never leaves a half-written model under the final name.
 *
 * Layout choices match llama.cpp's writer (gguf.cpp), so its loader, which
 * insists on them, accepts our files: tensor data offsets are consecutive, each
 * tensor padded with zeros to the alignment; the data section starts at the
 * first multiple of the alignment after the tensor infos; general.alignment is
 * written only when it differs from the default 32. Setting a key that exists
 * replaces its value in place (like gguf_set_*).
 *
 * Tensor data comes either from a pointer (valid until the write returns) or
 * from a fill callback asked for a band of rows at a time, so a model larger
 * than memory can be produced (mkmodel, quantize); the writer holds at most
 * one band. An optional progress callback is told the bytes written after
 * each band (gguf_writer_set_progress).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "format/gguf.h"
#include "format/quant.h"

#define W_MAX_NAME 63 /* llama.cpp: GGML_MAX_NAME (64) including the NUL */
#define W_FILL_BAND (64u << 20) /* bytes per fill call, at least one row */

typedef struct {
    char *key;
    uint32_t type;
    uint8_t *val; /* encoded value as on disk (after the type field) */
    size_t val_len;
} w_kv_t;

typedef struct {
    char *name;
    int type;
    int n_dims;
    int64_t ne[4];
    uint64_t size;
    uint64_t offset;
    const void *data;
    gguf_fill_fn fill;
    void *fill_ctx;
} w_tensor_t;

struct gguf_writer {
    uint32_t alignment;
    w_kv_t *kv;
    int64_t n_kv, cap_kv;
    w_tensor_t *t;
    int64_t n_t, cap_t;
    gguf_progress_fn progress;
    void *progress_ctx;
    char msg[TERN_ERR_MSG];
};

static int w_fail(gguf_writer_t *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int w_fail(gguf_writer_t *w, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg, sizeof w->msg, fmt, ap);
    va_end(ap);
    return code;
}

gguf_writer_t *gguf_writer_new(uint32_t alignment) {
    if (alignment == 0) alignment = 32;
    if (alignment & (alignment - 1)) return NULL;
    gguf_writer_t *w = calloc(1, sizeof *w);
    if (w) w->alignment = alignment;
    return w;
}

void gguf_writer_free(gguf_writer_t *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

const char *gguf_writer_errmsg(const gguf_writer_t *w) { return w->msg; }

/* Store (or replace) key with an encoded value; takes ownership of val. */
static int put(gguf_writer_t *w, const char *key, uint32_t type, uint8_t *val, size_t len) {
    if (!key || !*key) {
        free(val);
        return w_fail(w, TERN_EINVAL, "empty metadata key");
    }
    if (!strcmp(key, "general.alignment")) {
        uint32_t a = 0;
        if (type == GGUF_UINT32) memcpy(&a, val, 4);
        if (type != GGUF_UINT32 || a == 0 || (a & (a - 1))) {
            free(val);
            return w_fail(w, TERN_EINVAL, "general.alignment must be a u32 power of two");
        }
        w->alignment = a;
    }
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_len = len;
            return 0;
        }
    if (w->n_kv == w->cap_kv) {
        int64_t nc = w->cap_kv ? w->cap_kv * 2 : 32;
        w_kv_t *n = realloc(w->kv, (size_t)nc * sizeof *n);
        if (!n) {
            free(val);
            return w_fail(w, TERN_ENOMEM, "out of memory");
        }
        w->kv = n;
        w->cap_kv = nc;
    }
    char *k = strdup(key);
    if (!k) {
        free(val);
        return w_fail(w, TERN_ENOMEM, "out of memory");
    }
    w->kv[w->n_kv++] = (w_kv_t){k, type, val, len};
    return 0;
}

static int put_scalar(gguf_writer_t *w, const char *key, gguf_vtype_t t, const void *v) {
    size_t n = gguf_vtype_size(t);
    uint8_t *b = malloc(n);
    if (!b) return w_fail(w, TERN_ENOMEM, "out of memory");
    memcpy(b, v, n);
    return put(w, key, t, b, n);
}

int gguf_w_u8(gguf_writer_t *w, const char *key, uint8_t v) { return put_scalar(w, key, GGUF_UINT8, &v); }
int gguf_w_i8(gguf_writer_t *w, const char *key, int8_t v) { return put_scalar(w, key, GGUF_INT8, &v); }
int gguf_w_u16(gguf_writer_t *w, const char *key, uint16_t v) { return put_scalar(w, key, GGUF_UINT16, &v); }
int gguf_w_i16(gguf_writer_t *w, const char *key, int16_t v) { return put_scalar(w, key, GGUF_INT16, &v); }
int gguf_w_u32(gguf_writer_t *w, const char *key, uint32_t v) { return put_scalar(w, key, GGUF_UINT32, &v); }
int gguf_w_i32(gguf_writer_t *w, const char *key, int32_t v) { return put_scalar(w, key, GGUF_INT32, &v); }
int gguf_w_u64(gguf_writer_t *w, const char *key, uint64_t v) { return put_scalar(w, key, GGUF_UINT64, &v); }
int gguf_w_i64(gguf_writer_t *w, const char *key, int64_t v) { return put_scalar(w, key, GGUF_INT64, &v); }
int gguf_w_f32(gguf_writer_t *w, const char *key, float v) { return put_scalar(w, key, GGUF_FLOAT32, &v); }
int gguf_w_f64(gguf_writer_t *w, const char *key, double v) { return put_scalar(w, key, GGUF_FLOAT64, &v); }
int gguf_w_bool(gguf_writer_t *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return put_scalar(w, key, GGUF_BOOL, &b);
}

int gguf_w_str(gguf_writer_t *w, const char *key, const char *v) {
    if (!v) return w_fail(w, TERN_EINVAL, "metadata key '%s': NULL string", key ? key : "");
    return gguf_w_strn(w, key, v, strlen(v));
}

int gguf_w_strn(gguf_writer_t *w, const char *key, const char *v, uint64_t len) {
    if (!v && len) return w_fail(w, TERN_EINVAL, "metadata key '%s': NULL string", key ? key : "");
    if (len > SIZE_MAX - 8) return w_fail(w, TERN_EINVAL, "metadata key '%s': string too long", key);
    uint8_t *b = malloc(8 + (size_t)len);
    if (!b) return w_fail(w, TERN_ENOMEM, "out of memory");
    memcpy(b, &len, 8);
    if (len) memcpy(b + 8, v, (size_t)len);
    return put(w, key, GGUF_STRING, b, 8 + (size_t)len);
}

int gguf_w_arr(gguf_writer_t *w, const char *key, gguf_vtype_t et, const void *data, uint64_t n) {
    size_t es = gguf_vtype_size(et);
    if (!es) return w_fail(w, TERN_EINVAL, "metadata key '%s': gguf_w_arr needs a numeric element type", key);
    uint64_t bytes;
    if (tern_mul_overflow_u64(es, n, &bytes) || bytes > SIZE_MAX - 12)
        return w_fail(w, TERN_EINVAL, "metadata key '%s': array too large", key);
    if (!data && n) return w_fail(w, TERN_EINVAL, "metadata key '%s': NULL array data", key);
    uint8_t *b = malloc(12 + (size_t)bytes);
    if (!b) return w_fail(w, TERN_ENOMEM, "out of memory");
    uint32_t t = et;
    memcpy(b, &t, 4);
    memcpy(b + 4, &n, 8);
    if (bytes) memcpy(b + 12, data, (size_t)bytes);
    return put(w, key, GGUF_ARRAY, b, 12 + (size_t)bytes);
}

int gguf_w_arr_str(gguf_writer_t *w, const char *key, const char *const *v, const uint64_t *lens, uint64_t n) {
    uint64_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = lens ? lens[i] : strlen(v[i]);
        if (tern_add_overflow_u64(total, 8, &total) || tern_add_overflow_u64(total, l, &total) || total > SIZE_MAX)
            return w_fail(w, TERN_EINVAL, "metadata key '%s': array too large", key);
    }
    uint8_t *b = malloc((size_t)total), *p = b;
    if (!b) return w_fail(w, TERN_ENOMEM, "out of memory");
    uint32_t t = GGUF_STRING;
    memcpy(p, &t, 4);
    memcpy(p + 4, &n, 8);
    p += 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = lens ? lens[i] : strlen(v[i]);
        memcpy(p, &l, 8);
        if (l) memcpy(p + 8, v[i], (size_t)l);
        p += 8 + l;
    }
    return put(w, key, GGUF_ARRAY, b, (size_t)total);
}

int gguf_w_kv(gguf_writer_t *w, const gguf_kv_t *kv) {
    uint64_t len;
    const void *raw = gguf_kv_raw(kv, &len);
    uint8_t *b = malloc(len ? (size_t)len : 1);
    if (!b) return w_fail(w, TERN_ENOMEM, "out of memory");
    memcpy(b, raw, (size_t)len);
    return put(w, gguf_kv_key(kv), gguf_kv_type(kv), b, (size_t)len);
}

int gguf_w_copy_kv(gguf_writer_t *w, const gguf_file_t *src, bool (*skip)(const char *key)) {
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        const gguf_kv_t *kv = gguf_kv_at(src, i);
        if (skip && skip(gguf_kv_key(kv))) continue;
        int rc = gguf_w_kv(w, kv);
        if (rc) return rc;
    }
    return 0;
}

static int add_tensor(gguf_writer_t *w, const char *name, int type, int n_dims, const int64_t *ne, uint64_t *size) {
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > W_MAX_NAME)
        return w_fail(w, TERN_EINVAL, "tensor name '%s' must be 1..%d bytes", name ? name : "", W_MAX_NAME);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return w_fail(w, TERN_EINVAL, "duplicate tensor '%s'", name);
    const quant_traits_t *qt = quant_traits(type);
    if (!qt || !qt->weight) return w_fail(w, TERN_EINVAL, "tensor '%s': type %d is not a storage type", name, type);
    if (n_dims < 1 || n_dims > 4) return w_fail(w, TERN_EINVAL, "tensor '%s': n_dims %d outside 1..4", name, n_dims);
    uint64_t rows = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1) return w_fail(w, TERN_EINVAL, "tensor '%s': dimension %d is %" PRId64, name, d, ne[d]);
        if (d > 0 && tern_mul_overflow_u64(rows, (uint64_t)ne[d], &rows))
            return w_fail(w, TERN_EINVAL, "tensor '%s': too many elements", name);
    }
    size_t rs = quant_row_size(type, ne[0]);
    if (!rs)
        return w_fail(w, TERN_EINVAL, "tensor '%s': row length %" PRId64 " is not a multiple of the %s block size %d",
                      name, ne[0], qt->name, qt->blck);
    uint64_t want;
    if (tern_mul_overflow_u64(rs, rows, &want)) return w_fail(w, TERN_EINVAL, "tensor '%s': too large", name);
    if (*size == UINT64_MAX)
        *size = want;
    else if (*size != want)
        return w_fail(w, TERN_EINVAL, "tensor '%s': size %" PRIu64 " bytes, expected %" PRIu64 " for its shape and type",
                      name, *size, want);
    if (w->n_t == w->cap_t) {
        int64_t nc = w->cap_t ? w->cap_t * 2 : 64;
        w_tensor_t *n = realloc(w->t, (size_t)nc * sizeof *n);
        if (!n) return w_fail(w, TERN_ENOMEM, "out of memory");
        w->t = n;
        w->cap_t = nc;
    }
    w_tensor_t *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return w_fail(w, TERN_ENOMEM, "out of memory");
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->size = want;
    w->n_t++;
    return 0;
}

int gguf_w_tensor(gguf_writer_t *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data,
                  uint64_t size) {
    if (!data) return w_fail(w, TERN_EINVAL, "tensor '%s': NULL data", name ? name : "");
    int rc = add_tensor(w, name, type, n_dims, ne, &size);
    if (rc) return rc;
    w->t[w->n_t - 1].data = data;
    return 0;
}

int gguf_w_tensor_fill(gguf_writer_t *w, const char *name, int type, int n_dims, const int64_t *ne, gguf_fill_fn fill,
                       void *ctx) {
    uint64_t size = UINT64_MAX;
    if (!fill) return w_fail(w, TERN_EINVAL, "tensor '%s': NULL fill function", name ? name : "");
    int rc = add_tensor(w, name, type, n_dims, ne, &size);
    if (rc) return rc;
    w->t[w->n_t - 1].fill = fill;
    w->t[w->n_t - 1].fill_ctx = ctx;
    return 0;
}

int64_t gguf_writer_n_tensors(const gguf_writer_t *w) { return w->n_t; }

void gguf_writer_set_progress(gguf_writer_t *w, gguf_progress_fn fn, void *ctx) {
    w->progress = fn;
    w->progress_ctx = ctx;
}

/* ---- output -------------------------------------------------------------------- */

typedef struct {
    FILE *fp;
    uint64_t pos;
    bool failed;
} out_t;

static void out(out_t *o, const void *p, size_t n) {
    if (o->failed || n == 0) return;
    if (fwrite(p, 1, n, o->fp) != n) o->failed = true;
    o->pos += n;
}

static void out_pad(out_t *o, uint32_t align) {
    static const uint8_t zeros[256];
    uint64_t pad = (align - o->pos % align) % align;
    while (pad) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        out(o, zeros, k);
        pad -= k;
    }
}

static void out_str(out_t *o, const char *s) {
    uint64_t n = strlen(s);
    out(o, &n, 8);
    out(o, s, (size_t)n);
}

static uint64_t pad_to(uint64_t x, uint32_t a) { return (x + a - 1) / a * a; }

int gguf_writer_write(gguf_writer_t *w, const char *path, tern_error_t *err) {
    /* Alignment is a property of the file, so it goes in as metadata when it
     * is not the default (and is dropped when it is, as llama.cpp does). */
    bool want_al = w->alignment != 32, have_al = false;
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, "general.alignment")) have_al = true;
    if (want_al && !have_al && gguf_w_u32(w, "general.alignment", w->alignment))
        return tern_err(err, TERN_ENOMEM, "%s: %s", path, w->msg);

    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        if (tern_add_overflow_u64(off, pad_to(w->t[i].size, w->alignment), &off))
            return tern_err(err, TERN_EINVAL, "%s: tensor data too large", path);
    }

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return tern_err(err, TERN_ENOMEM, "out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    out_t o = {fopen(tmp, "wb"), 0, false};
    if (!o.fp) {
        int rc = tern_err(err, TERN_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    setvbuf(o.fp, NULL, _IOFBF, 1 << 20);

    uint32_t magic = 0x46554747u, version = 3;
    uint64_t n_t = (uint64_t)w->n_t, n_kv = (uint64_t)w->n_kv;
    out(&o, &magic, 4);
    out(&o, &version, 4);
    out(&o, &n_t, 8);
    out(&o, &n_kv, 8);
    for (int64_t i = 0; i < w->n_kv; i++) {
        out_str(&o, w->kv[i].key);
        out(&o, &w->kv[i].type, 4);
        out(&o, w->kv[i].val, w->kv[i].val_len);
    }
    for (int64_t i = 0; i < w->n_t; i++) {
        const w_tensor_t *t = &w->t[i];
        uint32_t nd = (uint32_t)t->n_dims, ty = (uint32_t)t->type;
        out_str(&o, t->name);
        out(&o, &nd, 4);
        for (int d = 0; d < t->n_dims; d++) out(&o, &t->ne[d], 8);
        out(&o, &ty, 4);
        out(&o, &t->offset, 8);
    }
    out_pad(&o, w->alignment);

    /* The file is the header written so far plus the data section. */
    uint64_t total = o.pos + off;
    if (w->progress) w->progress(w->progress_ctx, o.pos, total, false);
    int rc = 0;
    void *band = NULL;
    for (int64_t i = 0; i < w->n_t && !rc && !o.failed; i++) {
        const w_tensor_t *t = &w->t[i];
        if (t->data) {
            /* In bands too, so a large copied tensor reports progress. */
            for (uint64_t b = 0; b < t->size && !o.failed; b += W_FILL_BAND) {
                uint64_t n = t->size - b < W_FILL_BAND ? t->size - b : W_FILL_BAND;
                out(&o, (const uint8_t *)t->data + b, (size_t)n);
                if (w->progress) w->progress(w->progress_ctx, o.pos, total, false);
            }
        } else {
            int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
            uint64_t rs = t->size / (uint64_t)rows;
            int64_t per = (int64_t)(W_FILL_BAND / rs);
            if (per < 1) per = 1;
            if (per > rows) per = rows;
            free(band);
            band = malloc((size_t)(rs * (uint64_t)per));
            if (!band) {
                rc = tern_err(err, TERN_ENOMEM, "%s: out of memory for tensor '%s'", path, t->name);
                break;
            }
            for (int64_t r0 = 0; r0 < rows && !rc && !o.failed; r0 += per) {
                int64_t n = rows - r0 < per ? rows - r0 : per;
                rc = t->fill(t->fill_ctx, t->name, r0, n, band, err);
                if (!rc) out(&o, band, (size_t)(rs * (uint64_t)n));
                if (w->progress) w->progress(w->progress_ctx, o.pos, total, false);
            }
        }
        out_pad(&o, w->alignment);
    }
    free(band);
    if (fclose(o.fp) != 0) o.failed = true;
    if (w->progress) w->progress(w->progress_ctx, rc || o.failed ? o.pos : total, total, true);
    if (!rc && o.failed) rc = tern_err(err, TERN_EIO, "%s: write failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = tern_err(err, TERN_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}
