/*
 * session.c - session files: one sequence's tokens and KV rows, appended
 * turn by turn, crash-safe (session.h has the API).
 *
 * Format (version 1). Every integer is little-endian; KV rows are in the
 * cache's element type (F16 or F32) and the machine's byte order
 * (little-endian on every target tern builds for).
 *
 *   header, 48 bytes:
 *     0  u32 magic "TSES"        4  u32 version 1
 *     8  u32 arch (model_arch_t) 12 u32 KV type (TYPE_F16 1 / TYPE_F32 0)
 *     16 u32 n_layer             20 u32 n_head_kv
 *     24 u32 head_dim            28 u32 n_vocab
 *     32 u64 model hash (session_model_hash: FNV-1a over the GGUF's
 *            size, metadata, tensor table and sampled tensor bytes)
 *     40 u64 FNV-1a 64 of bytes 0..39
 *   then turn records, back to back, until the end of the file:
 *     u32 magic "TREC", u32 n (1 .. 2^24 positions), u64 p0 (the first
 *     position: the positions of the records before it, summed)
 *     n x i32 token ids (each in [0, n_vocab))
 *     for each layer: K rows of positions p0 .. p0+n-1 (n * pos_bytes),
 *                     then V rows of the same positions
 *                     (pos_bytes = n_head_kv * head_dim * 2 or 4)
 *     trailer, 16 bytes: u64 FNV-1a 64 of the record from its magic to
 *     the end of the rows, u32 "TEND", u32 n again.
 *
 * Commit protocol: a new file is created as PATH.tmp (header), fsynced and
 * renamed, so a session file always has a whole header. A turn's record is
 * written after the last committed one without its trailer, fdatasync'd,
 * then the trailer (checksum and count: the commit marker) is written and
 * fdatasync'd again. A record counts only when it is whole and its
 * checksum and trailer match, so a crash at any byte leaves the file
 * readable up to the last committed turn.
 *
 * Reading: the header is checked (magic, checksum, version, then the
 * fingerprint field by field against the model and KV type: a mismatch is
 * an error naming the field). Records are read while each one's size
 * (computed with overflow checks) fits in what is left of the file, its
 * fields are valid and its checksum matches; nothing is allocated for a
 * record before its size was checked against the file's length. The first
 * record that fails ends the file: it and everything after it are cut off
 * (ftruncate + fsync) with a warning, never trusted.
 *
 * Limits: the checksum detects torn writes and random damage, not a
 * deliberate forgery; the model hash samples tensor data (see session.h).
 */
#include "model/session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "format/quant.h"

#define SES_MAGIC 0x53455354u /* "TSES" */
#define SES_VERSION 1u
#define REC_MAGIC 0x43455254u /* "TREC" */
#define END_MAGIC 0x444E4554u /* "TEND" */
#define HDR_BYTES 48
#define REC_HEAD 16
#define REC_TAIL 16
#define MAX_TURN_POS (1 << 24)

#define FNV_OFF 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* ---- model identity ------------------------------------------------------ */

uint64_t session_model_hash(const model_t *m) {
    const gguf_file_t *f = m->file;
    uint64_t h = FNV_OFF, sz = gguf_file_size(f);
    h = fnv(h, &sz, sizeof sz);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv_t *kv = gguf_kv_at(f, i);
        const char *key = gguf_kv_key(kv);
        h = fnv(h, key, strlen(key) + 1);
        uint32_t t = (uint32_t)gguf_kv_type(kv);
        h = fnv(h, &t, sizeof t);
        uint64_t len = 0;
        const void *raw = gguf_kv_raw(kv, &len);
        if (raw && len) h = fnv(h, raw, (size_t)len);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        h = fnv(h, t->name, strlen(t->name) + 1);
        int64_t meta[6] = {t->type, t->ne[0], t->ne[1], t->ne[2], t->ne[3], (int64_t)t->offset};
        h = fnv(h, meta, sizeof meta);
        const unsigned char *d = t->data;
        if (!d || !t->size) continue;
        const uint64_t n = t->size < 64 ? t->size : 64;
        h = fnv(h, d, (size_t)n);
        h = fnv(h, d + (t->size - n) / 2, (size_t)n);
        h = fnv(h, d + t->size - n, (size_t)n);
    }
    return h;
}

void session_fingerprint(const model_t *m, int kv_type, session_fp_t *fp) {
    memset(fp, 0, sizeof *fp);
    fp->arch = (uint32_t)m->hp.arch;
    fp->kv_type = (uint32_t)kv_type;
    fp->n_layer = (uint32_t)m->hp.n_layer;
    fp->n_head_kv = (uint32_t)m->hp.n_head_kv;
    fp->head_dim = (uint32_t)m->hp.head_dim;
    fp->n_vocab = (uint32_t)m->hp.n_vocab;
    fp->model_hash = session_model_hash(m);
}

/* ---- file ------------------------------------------------------------------ */

typedef struct {
    uint64_t off; /* of its magic */
    int64_t n, p0;
} turn_t;

struct session {
    int fd;
    char *path;
    session_fp_t fp;
    uint64_t pos_bytes; /* one position of one layer's K (or V) */
    uint64_t end;       /* end of the last committed record */
    int32_t *tokens;
    int64_t n_tokens, tok_cap;
    turn_t *turns;
    int64_t n_turns, turn_cap;
    uint64_t cut;
};

static int pread_full(int fd, void *buf, size_t len, uint64_t off) {
    unsigned char *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off) {
    const unsigned char *p = buf;
    while (len) {
        ssize_t r = pwrite(fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int sync_fd(int fd) {
    int r;
    do r = fdatasync(fd);
    while (r < 0 && errno == EINTR);
    return r;
}

static void encode_header(unsigned char *h, const session_fp_t *fp) {
    le_put_u32(h + 0, SES_MAGIC);
    le_put_u32(h + 4, SES_VERSION);
    le_put_u32(h + 8, fp->arch);
    le_put_u32(h + 12, fp->kv_type);
    le_put_u32(h + 16, fp->n_layer);
    le_put_u32(h + 20, fp->n_head_kv);
    le_put_u32(h + 24, fp->head_dim);
    le_put_u32(h + 28, fp->n_vocab);
    le_put_u64(h + 32, fp->model_hash);
    le_put_u64(h + 40, fnv(FNV_OFF, h, 40));
}

static int create_file(const char *path, const session_fp_t *fp, tern_error_t *err) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return tern_err(err, TERN_ENOMEM, "out of memory");
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = tern_err(err, TERN_EIO, "session %s: cannot create %s: %s", path, tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    unsigned char h[HDR_BYTES];
    encode_header(h, fp);
    int bad = pwrite_full(fd, h, sizeof h, 0) || sync_fd(fd);
    bad |= close(fd) != 0;
    if (bad || rename(tmp, path) != 0) {
        int rc = tern_err(err, TERN_EIO, "session %s: cannot write the header: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return rc;
    }
    free(tmp);
    /* The rename is durable once the directory is synced. */
    char *dir = strdup(path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        const char *d = ".";
        if (slash == dir) d = "/";
        else if (slash) {
            *slash = 0;
            d = dir;
        }
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return 0;
}

static int check_header(const session_t *s, const unsigned char *h, tern_error_t *err) {
    const char *p = s->path;
    if (le_get_u32(h) != SES_MAGIC) return tern_err(err, TERN_EFORMAT, "session %s: not a tern session file", p);
    if (le_get_u64(h + 40) != fnv(FNV_OFF, h, 40))
        return tern_err(err, TERN_EFORMAT, "session %s: the header is damaged (checksum mismatch)", p);
    if (le_get_u32(h + 4) != SES_VERSION)
        return tern_err(err, TERN_EUNSUP, "session %s: format version %u, this tern reads version %u", p,
                        le_get_u32(h + 4), SES_VERSION);
    const session_fp_t *fp = &s->fp;
    if (le_get_u32(h + 8) != fp->arch)
        return tern_err(err, TERN_EINVAL, "session %s: saved for architecture %s, this model is %s", p,
                        model_arch_name((model_arch_t)le_get_u32(h + 8)), model_arch_name((model_arch_t)fp->arch));
    if (le_get_u32(h + 12) != fp->kv_type)
        return tern_err(err, TERN_EINVAL, "session %s: saved with a %s KV cache, this context's is %s", p,
                        quant_name((int)le_get_u32(h + 12)), quant_name((int)fp->kv_type));
    static const char *names[] = {"n_layer", "n_head_kv", "head_dim", "n_vocab"};
    const uint32_t mine[] = {fp->n_layer, fp->n_head_kv, fp->head_dim, fp->n_vocab};
    for (int i = 0; i < 4; i++)
        if (le_get_u32(h + 16 + 4 * i) != mine[i])
            return tern_err(err, TERN_EINVAL, "session %s: saved for another model (%s %u, this model has %u)", p,
                            names[i], le_get_u32(h + 16 + 4 * i), mine[i]);
    if (le_get_u64(h + 32) != fp->model_hash)
        return tern_err(err, TERN_EINVAL,
                        "session %s: saved for another model of the same shape (model hash %016llx, this model's "
                        "is %016llx)",
                        p, (unsigned long long)le_get_u64(h + 32), (unsigned long long)fp->model_hash);
    return 0;
}

/* Bytes of a record of n positions, or 0 on overflow. */
static uint64_t record_bytes(const session_t *s, uint64_t n, uint64_t *rows_out) {
    uint64_t rows, t;
    if (tern_mul_overflow_u64(n, s->pos_bytes, &rows) || tern_mul_overflow_u64(rows, 2ull * s->fp.n_layer, &rows))
        return 0;
    if (tern_add_overflow_u64(rows, REC_HEAD + REC_TAIL, &t) || tern_add_overflow_u64(t, 4 * n, &t)) return 0;
    if (rows_out) *rows_out = rows;
    return t;
}

/* Hash file bytes [off, off+len) into *h through a bounce buffer. */
static int hash_range(int fd, uint64_t off, uint64_t len, uint64_t *h) {
    unsigned char buf[65536];
    while (len) {
        size_t k = len < sizeof buf ? (size_t)len : sizeof buf;
        if (pread_full(fd, buf, k, off)) return -1;
        *h = fnv(*h, buf, k);
        off += k;
        len -= k;
    }
    return 0;
}

static int reserve(void **p, int64_t *cap, int64_t need, size_t elt) {
    if (need <= *cap) return 0;
    int64_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elt);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* Read and validate the record at s->end (size bytes in all): 1 if it is a
 * committed turn (then added), 0 if it is not (torn or invalid), < 0 on
 * ENOMEM / EIO. */
static int read_record(session_t *s, uint64_t size, tern_error_t *err) {
    const uint64_t off = s->end;
    if (size - off < REC_HEAD + REC_TAIL) return 0;
    unsigned char hd[REC_HEAD];
    if (pread_full(s->fd, hd, sizeof hd, off)) return tern_err(err, TERN_EIO, "session %s: read error", s->path);
    const uint32_t n = le_get_u32(hd + 4);
    const uint64_t p0 = le_get_u64(hd + 8);
    if (le_get_u32(hd) != REC_MAGIC || n < 1 || n > MAX_TURN_POS || p0 != (uint64_t)s->n_tokens) return 0;
    uint64_t rows, bytes = record_bytes(s, n, &rows);
    if (!bytes || bytes > size - off) return 0; /* sized against the file before any allocation */
    if (reserve((void **)&s->tokens, &s->tok_cap, s->n_tokens + n, sizeof(int32_t)) ||
        reserve((void **)&s->turns, &s->turn_cap, s->n_turns + 1, sizeof(turn_t)))
        return tern_err(err, TERN_ENOMEM, "out of memory");
    int32_t *tok = s->tokens + s->n_tokens;
    if (pread_full(s->fd, tok, 4ull * n, off + REC_HEAD))
        return tern_err(err, TERN_EIO, "session %s: read error", s->path);
    for (uint32_t i = 0; i < n; i++) {
        int32_t t = (int32_t)le_get_u32((const unsigned char *)&tok[i]);
        if (t < 0 || (uint32_t)t >= s->fp.n_vocab) return 0;
        tok[i] = t;
    }
    uint64_t h = FNV_OFF;
    if (hash_range(s->fd, off, bytes - REC_TAIL, &h)) return tern_err(err, TERN_EIO, "session %s: read error", s->path);
    unsigned char tl[REC_TAIL];
    if (pread_full(s->fd, tl, sizeof tl, off + bytes - REC_TAIL))
        return tern_err(err, TERN_EIO, "session %s: read error", s->path);
    if (le_get_u64(tl) != h || le_get_u32(tl + 8) != END_MAGIC || le_get_u32(tl + 12) != n) return 0;
    s->turns[s->n_turns++] = (turn_t){off, n, (int64_t)p0};
    s->n_tokens += n;
    s->end = off + bytes;
    return 1;
}

session_t *session_open(const char *path, const session_fp_t *fp, tern_error_t *err) {
    if (!path || !fp) {
        tern_err(err, TERN_EINVAL, "session_open: NULL argument");
        return NULL;
    }
    if ((fp->kv_type != TYPE_F16 && fp->kv_type != TYPE_F32) || fp->n_layer < 1 || fp->n_head_kv < 1 ||
        fp->head_dim < 1 || fp->n_vocab < 1) {
        tern_err(err, TERN_EINVAL, "session %s: bad fingerprint", path);
        return NULL;
    }
    session_t *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    s->fd = -1;
    s->fp = *fp;
    s->pos_bytes = (uint64_t)fp->n_head_kv * fp->head_dim * (fp->kv_type == TYPE_F32 ? 4u : 2u);
    s->fd = open(path, O_RDWR | O_CLOEXEC);
    if (s->fd < 0 && errno == ENOENT) {
        if (create_file(path, fp, err)) goto fail;
        s->fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (s->fd < 0) {
        tern_err(err, TERN_EIO, "session %s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        tern_err(err, TERN_EIO, "session %s: not a regular file", path);
        goto fail;
    }
    const uint64_t size = (uint64_t)st.st_size;
    unsigned char h[HDR_BYTES];
    if (size < HDR_BYTES) {
        tern_err(err, TERN_EFORMAT, "session %s: %llu bytes, shorter than a session header (%d)", path,
                 (unsigned long long)size, HDR_BYTES);
        goto fail;
    }
    if (pread_full(s->fd, h, sizeof h, 0)) {
        tern_err(err, TERN_EIO, "session %s: read error", path);
        goto fail;
    }
    if (check_header(s, h, err)) goto fail;
    s->end = HDR_BYTES;
    for (;;) {
        int r = read_record(s, size, err);
        if (r < 0) goto fail;
        if (r == 0) break;
    }
    if (s->end < size) {
        s->cut = size - s->end;
        tern_log(TERN_LOG_WARN, "session %s: cut %llu torn bytes after turn %lld", path, (unsigned long long)s->cut,
                 (long long)s->n_turns);
        if (ftruncate(s->fd, (off_t)s->end) != 0 || sync_fd(s->fd) != 0) {
            tern_err(err, TERN_EIO, "session %s: cannot cut the torn tail: %s", path, strerror(errno));
            goto fail;
        }
    }
    return s;
fail:
    session_close(s);
    return NULL;
}

void session_close(session_t *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s->path);
    free(s->tokens);
    free(s->turns);
    free(s);
}

int64_t session_n_tokens(const session_t *s) { return s->n_tokens; }
const int32_t *session_tokens(const session_t *s) { return s->tokens; }
int64_t session_n_turns(const session_t *s) { return s->n_turns; }
uint64_t session_cut_bytes(const session_t *s) { return s->cut; }

static int check_ctx(const session_t *s, const kv_cache_t *kv, tern_error_t *err) {
    const kv_layout_t *lo = kv_cache_layout(kv);
    if ((uint32_t)lo->type != s->fp.kv_type || lo->n_layer != s->fp.n_layer || lo->n_head_kv != s->fp.n_head_kv ||
        lo->head_dim != s->fp.head_dim)
        return tern_err(err, TERN_EINVAL, "session %s: the context's KV cache (%s) does not match the file's (%s)",
                        s->path, quant_name(lo->type), quant_name((int)s->fp.kv_type));
    return 0;
}

int session_restore(session_t *s, model_ctx_t *c, int seq, int64_t n_pos, tern_error_t *err) {
    return session_restore_kv(s, model_ctx_kv(c), seq, n_pos, err);
}

int session_restore_kv(session_t *s, kv_cache_t *kv, int seq, int64_t n_pos, tern_error_t *err) {
    int rc = check_ctx(s, kv, err);
    if (rc) return rc;
    if (n_pos < 0 || n_pos > s->n_tokens || n_pos > kv_cache_layout(kv)->n_ctx)
        return tern_err(err, TERN_EINVAL, "session %s: cannot restore %lld positions (the file holds %lld, the "
                        "context has room for %lld)", s->path, (long long)n_pos, (long long)s->n_tokens,
                        (long long)kv_cache_layout(kv)->n_ctx);
    if (seq < 0 || seq >= kv_cache_n_seq(kv))
        return tern_err(err, TERN_EINVAL, "session %s: no sequence %d in the context", s->path, seq);
    kv_seq_remove(kv, seq);
    if ((rc = kv_seq_reserve(kv, seq, n_pos, err))) return rc;
    if (n_pos > 0) kv_seq_put_ids(kv, seq, 0, n_pos, s->tokens);
    unsigned char *buf = NULL;
    size_t buf_cap = 0;
    for (int64_t i = 0; i < s->n_turns && s->turns[i].p0 < n_pos; i++) {
        const turn_t *t = &s->turns[i];
        const int64_t m = n_pos - t->p0 < t->n ? n_pos - t->p0 : t->n;
        const uint64_t blk = (uint64_t)t->n * s->pos_bytes;
        if (blk > buf_cap) {
            unsigned char *nb = realloc(buf, (size_t)blk);
            if (!nb) {
                rc = tern_err(err, TERN_ENOMEM, "out of memory");
                break;
            }
            buf = nb;
            buf_cap = (size_t)blk;
        }
        uint64_t h = FNV_OFF, off = t->off + REC_HEAD + 4ull * (uint64_t)t->n;
        if (hash_range(s->fd, t->off, off - t->off, &h)) {
            rc = tern_err(err, TERN_EIO, "session %s: read error", s->path);
            break;
        }
        for (int64_t l = 0; l < (int64_t)s->fp.n_layer && rc == 0; l++) {
            for (int kvh = 0; kvh < 2; kvh++, off += blk) {
                if (pread_full(s->fd, buf, (size_t)blk, off)) {
                    rc = tern_err(err, TERN_EIO, "session %s: read error", s->path);
                    break;
                }
                h = fnv(h, buf, (size_t)blk);
                kv_seq_put_raw(kv, seq, l, t->p0, m, kvh ? NULL : buf, kvh ? buf : NULL);
            }
        }
        if (rc) break;
        unsigned char tl[REC_TAIL];
        if (pread_full(s->fd, tl, sizeof tl, off) || le_get_u64(tl) != h) {
            rc = tern_err(err, TERN_EFORMAT, "session %s: turn %lld changed since the file was opened", s->path,
                          (long long)i + 1);
            break;
        }
    }
    free(buf);
    if (rc == 0) rc = kv_seq_commit(kv, seq, n_pos, err);
    if (rc) kv_seq_remove(kv, seq);
    return rc;
}

int session_truncate(session_t *s, int64_t n_pos, tern_error_t *err) {
    int64_t k = s->n_turns;
    while (k > 0 && s->turns[k - 1].p0 + s->turns[k - 1].n > n_pos) k--;
    if (k == s->n_turns) return 0;
    const uint64_t end = k ? s->turns[k].off : HDR_BYTES;
    if (ftruncate(s->fd, (off_t)end) != 0 || sync_fd(s->fd) != 0)
        return tern_err(err, TERN_EIO, "session %s: cannot truncate: %s", s->path, strerror(errno));
    s->n_turns = k;
    s->n_tokens = k ? s->turns[k - 1].p0 + s->turns[k - 1].n : 0;
    s->end = end;
    return 0;
}

int session_append(session_t *s, const model_ctx_t *c, int seq, const int32_t *tokens, int64_t n,
                   tern_error_t *err) {
    const kv_cache_t *kv = model_ctx_kv_const(c);
    int rc = check_ctx(s, kv, err);
    if (rc) return rc;
    if (seq < 0 || seq >= kv_cache_n_seq(kv))
        return tern_err(err, TERN_EINVAL, "session %s: no sequence %d in the context", s->path, seq);
    if (n == 0) return 0;
    const int64_t p0 = s->n_tokens;
    if (n < 0 || n > MAX_TURN_POS || !tokens || kv_seq_n_pos(kv, seq) - p0 < n)
        return tern_err(err, TERN_EINVAL, "session %s: cannot append %lld positions from %lld (the sequence holds %lld)",
                        s->path, (long long)n, (long long)p0, (long long)kv_seq_n_pos(kv, seq));
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= s->fp.n_vocab)
            return tern_err(err, TERN_EINVAL, "session %s: token id %d out of range", s->path, tokens[i]);
    if (reserve((void **)&s->tokens, &s->tok_cap, p0 + n, sizeof(int32_t)) ||
        reserve((void **)&s->turns, &s->turn_cap, s->n_turns + 1, sizeof(turn_t)))
        return tern_err(err, TERN_ENOMEM, "out of memory");
    uint64_t bytes = record_bytes(s, (uint64_t)n, NULL);
    unsigned char *head = malloc(REC_HEAD + 4 * (size_t)n);
    if (!bytes || !head) {
        free(head);
        return tern_err(err, TERN_ENOMEM, "out of memory");
    }
    le_put_u32(head, REC_MAGIC);
    le_put_u32(head + 4, (uint32_t)n);
    le_put_u64(head + 8, (uint64_t)p0);
    for (int64_t i = 0; i < n; i++) le_put_u32(head + REC_HEAD + 4 * i, (uint32_t)tokens[i]);
    const uint64_t start = s->end;
    uint64_t off = start, h = FNV_OFF;
    const size_t hl = REC_HEAD + 4 * (size_t)n, blk = (size_t)n * (size_t)s->pos_bytes;
    /* One layer's K and V rows of the turn, gathered from the sequence's blocks. */
    unsigned char *rows = malloc(2 * blk);
    if (!rows) {
        free(head);
        return tern_err(err, TERN_ENOMEM, "out of memory");
    }
    int bad = pwrite_full(s->fd, head, hl, off);
    h = fnv(h, head, hl);
    off += hl;
    free(head);
    for (int64_t l = 0; l < (int64_t)s->fp.n_layer && !bad; l++) {
        unsigned char *k = rows, *v = rows + blk;
        kv_seq_get_raw(kv, seq, l, p0, n, k, v);
        bad |= pwrite_full(s->fd, k, blk, off);
        h = fnv(h, k, blk);
        off += blk;
        bad |= pwrite_full(s->fd, v, blk, off);
        h = fnv(h, v, blk);
        off += blk;
    }
    free(rows);
    /* The body is durable before the trailer that commits it is written. */
    bad = bad || sync_fd(s->fd) != 0;
    unsigned char tl[REC_TAIL];
    le_put_u64(tl, h);
    le_put_u32(tl + 8, END_MAGIC);
    le_put_u32(tl + 12, (uint32_t)n);
    bad = bad || pwrite_full(s->fd, tl, sizeof tl, off) != 0 || sync_fd(s->fd) != 0;
    if (bad) {
        int e = errno;
        if (ftruncate(s->fd, (off_t)start) == 0) (void)sync_fd(s->fd);
        return tern_err(err, TERN_EIO, "session %s: cannot append a turn: %s", s->path, strerror(e));
    }
    TERN_CHECK(off + REC_TAIL - start == bytes);
    memcpy(s->tokens + p0, tokens, (size_t)n * sizeof(int32_t));
    s->turns[s->n_turns++] = (turn_t){start, n, p0};
    s->n_tokens = p0 + n;
    s->end = start + bytes;
    return 0;
}
