/*
 * expert_cache.c - the routed-expert cache and its I/O pool (see
 * expert_cache.h for what it is for).
 *
 * SLOTS. The cache is n_slots slots of slot_bytes each, one expert (its
 * gate, up and down matrices) per slot, in one anonymous mapping. Each
 * matrix is read as the span of whole alignment units (4096 bytes) that
 * covers it, into its own part of the slot, so a direct read's offset,
 * length and buffer are all aligned; the matrix then starts at
 * (offset mod 4096) inside its part. A slot is
 *     EMPTY    on the free list, no expert
 *     QUEUED   assigned to an expert, a load job for it is in the queue
 *     LOADING  an I/O worker is reading it
 *     READY    its bytes are in
 *     FAILED   its read failed (the error is given to whoever waits)
 * and has pins (forward passes using it), a generation (bumped every time
 * the slot is given to an expert), and `hot` (pinned by usage: never
 * evicted). map[layer * n_expert + e] is the slot of that expert or -1.
 * The LRU list holds exactly the READY slots with pins == 0 and !hot,
 * least recently released first; eviction takes its head. With per_layer,
 * each layer has its own list and a quota of n_slots / n_layer slots: a
 * layer takes free slots up to its quota, then evicts its own least
 * recently used expert (global LRU is the default; PERF.md compares).
 *
 * THE CLAIM PROTOCOL. One mutex guards every slot field, the map, the LRU
 * list, the free list and the job queue; the condition variables only wake
 * (cv_job: a job was queued or the cache closes; cv_ready: a load ended).
 *   assign (ec_get miss, ec_hint, pinning at start; under the lock): take
 *     a free slot or evict the LRU head (its map entry is cleared), set the
 *     key, gen = gen + 1, state QUEUED, and queue the job (slot, gen):
 *     demand jobs at the front, hints at the back. A demand request for a
 *     slot still QUEUED by a hint queues a second job (slot, gen) at the
 *     front; whichever copy a worker takes first does the load.
 *   A load is n_chunks jobs (slot, chunk, gen): the expert's three spans
 *     cut into reads of `chunk` bytes (at least 512 KiB, at most 48 per
 *     expert), so the I/O threads read one expert in parallel: a single
 *     miss then waits for the pool's bandwidth, not one thread's.
 *   claim (worker, under the lock): pop a job; take it only if the slot's
 *     gen equals the job's, the state is QUEUED or LOADING and the chunk's
 *     bit in `claimed` is clear; then set the bit and the state LOADING;
 *     otherwise drop the job. Compute the chunk's file range and buffer,
 *     drop the lock, read.
 *   publish (worker, under the lock): only if the slot's gen still equals
 *     the job's: count the chunk done (and a failure); the worker that
 *     completes the last chunk sets READY (or FAILED), puts the slot on the
 *     LRU list if nobody pins it, and broadcasts cv_ready.
 * Why a stale worker can never take or publish a job of a later
 * generation: a job carries the generation of the assignment that queued
 * it, and a worker compares it with the slot's, under the lock, both when
 * it claims and when it publishes. The generation changes only on
 * assignment, and a slot is assigned again only after it left the slots
 * that are QUEUED or LOADING (only EMPTY slots and LRU slots, which are
 * READY, are ever assigned). So a job whose slot was reassigned (the
 * duplicate of a demand promotion, left in the queue after the first copy
 * loaded it, and the slot later evicted) fails the claim check and is
 * dropped; a duplicate of a chunk already claimed finds its bit set and is
 * dropped; and while any chunk of a slot is being read the slot is LOADING,
 * which nobody reassigns, so every publish matches and each chunk is
 * counted exactly once. Generations are 64-bit: they do not wrap.
 * No read ever writes a slot someone else owns: a worker writes only the
 * buffer of a slot it set LOADING, and the forward reads a slot only after
 * ec_wait / ec_ready saw READY under the lock (the lock orders the
 * worker's writes before the reader's loads).
 *
 * PINNING. With ec_params_t.pin_path, the counts in that file are read at
 * start (whether or not this run pins), demand uses are added per (layer,
 * expert), and ec_save_counts writes them back when anything was counted;
 * with pin_share > 0 the hottest experts (up to that share of the slots,
 * most used first) are queued first and never evicted. The counts file (little-endian):
 *     u8[8]  magic "TERNEXPU"
 *     u32    version (1)
 *     u32    n_layer, u32 n_expert, u32 zero
 *     u64    the model file's size (a counts file of another file is ignored)
 *     u32    counts[n_layer * n_expert]
 *     u64    FNV-1a 64 of every byte before it
 * It is written to PATH.tmp, fsynced and renamed over PATH, so a crash
 * leaves the old file or the new one, never a torn one; on load the length
 * must be exactly what the header implies and the checksum must match, else
 * the file is ignored (no pinning; a note on stderr).
 */
#define _GNU_SOURCE
#include "model/expert_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

#define EC_ALIGN 4096u
/* An expert is read in chunks of at least EC_CHUNK_MIN bytes, at most
 * EC_MAX_CHUNKS of them, taken by the I/O threads in parallel: one expert's
 * read then takes the whole pool's bandwidth, not one thread's. */
#define EC_CHUNK_MIN (512u << 10)
#define EC_MAX_CHUNKS 48

enum { S_EMPTY, S_QUEUED, S_LOADING, S_READY, S_FAILED };

typedef struct {
    int64_t key; /* layer * n_expert + e, -1 when EMPTY */
    uint64_t gen;
    int state;
    int pins;
    bool hot;
    bool hinted; /* loaded by a hint and not yet asked for */
    int prev, next; /* LRU links (-1: none) */
    model_expert_t ex; /* the matrices, pointing into the slot */
    /* the load: n_chunks pieces, claimed (bit c) and done by the I/O threads */
    int n_chunks, n_done;
    uint64_t claimed;
    bool failed;
} ec_slot_t;

typedef struct {
    int slot;
    int chunk;
    uint64_t gen;
} ec_job_t;

struct expert_cache {
    const model_t *m;
    int fd;
    bool direct;
    int64_t n_layer, n_expert;
    uint64_t part[3]; /* bytes of the gate, up and down parts of a slot */
    uint64_t slot_bytes;
    uint64_t chunk; /* bytes per read (whole units) */
    int n_slots;
    char *mem;
    size_t mem_len;
    ec_slot_t *slots;
    int32_t *map;
    int *free_stack;
    int n_free;
    int *lru_head, *lru_tail; /* per list: one list, or one per layer (per_layer) */
    int n_lists;
    int *quota, *used;        /* per_layer: slots each layer may hold, and holds */
    ec_job_t *q; /* deque, capacity qcap */
    int qcap, qhead, qlen;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_ready;
    pthread_t *threads;
    int n_threads;
    bool stop;
    uint32_t *counts; /* (n_layer * n_expert) or NULL without a usage file */
    bool counted;     /* uses were counted since the load (the file is then saved) */
    char *pin_path;
    ec_stats_t st;
};

/* ---- slot layout ------------------------------------------------------------ */

static uint64_t mat_len(const kern_mat_t *w) { return (uint64_t)w->row_bytes * (uint64_t)w->rows; }
static uint64_t up_align(uint64_t x) { return (x + EC_ALIGN - 1) / EC_ALIGN * EC_ALIGN; }

/* Bytes of each part: the widest matrix of that kind, whole units, plus one
 * unit for an unaligned start. */
static void part_sizes(const model_t *m, uint64_t part[3]) {
    part[0] = part[1] = part[2] = 0;
    for (int64_t l = 0; l < m->hp.n_layer; l++) {
        const model_layer_t *L = &m->layers[l];
        for (int64_t e = 0; L->experts && e < m->hp.n_expert; e++) {
            const kern_mat_t *w[3] = {&L->experts[e].gate, &L->experts[e].up, &L->experts[e].down};
            for (int p = 0; p < 3; p++) {
                const uint64_t b = up_align(mat_len(w[p])) + EC_ALIGN;
                if (b > part[p]) part[p] = b;
            }
        }
    }
}

uint64_t ec_slot_bytes(const model_t *m) {
    uint64_t p[3];
    part_sizes(m, p);
    return p[0] + p[1] + p[2];
}

/* ---- LRU, free list, queue (all under the lock) -------------------------------- */

/* The LRU list of a slot's expert: its layer's with per-layer lists. */
static int list_of(const expert_cache_t *c, int64_t key) { return c->n_lists > 1 ? (int)(key / c->n_expert) : 0; }

static void lru_remove(expert_cache_t *c, int s) {
    ec_slot_t *x = &c->slots[s];
    const int li = list_of(c, x->key);
    if (x->prev >= 0) c->slots[x->prev].next = x->next;
    else if (c->lru_head[li] == s) c->lru_head[li] = x->next;
    else return; /* not on the list */
    if (x->next >= 0) c->slots[x->next].prev = x->prev;
    else c->lru_tail[li] = x->prev;
    x->prev = x->next = -1;
}

static void lru_push(expert_cache_t *c, int s) {
    ec_slot_t *x = &c->slots[s];
    const int li = list_of(c, x->key);
    x->prev = c->lru_tail[li];
    x->next = -1;
    if (c->lru_tail[li] >= 0) c->slots[c->lru_tail[li]].next = s;
    else c->lru_head[li] = s;
    c->lru_tail[li] = s;
}

/* Queue the chunks of slot s not yet claimed: at the front (in order) or
 * at the back. */
static void q_push(expert_cache_t *c, int s, bool front) {
    const ec_slot_t *x = &c->slots[s];
    int n = 0;
    for (int k = 0; k < x->n_chunks; k++) n += !(x->claimed >> k & 1);
    TERN_CHECK(c->qlen + n <= c->qcap);
    for (int i = 0; i < x->n_chunks; i++) {
        const int k = front ? x->n_chunks - 1 - i : i; /* pushed in reverse at the front: taken in order */
        if (x->claimed >> k & 1) continue;
        const ec_job_t j = {s, k, x->gen};
        if (front) {
            c->qhead = (c->qhead + c->qcap - 1) % c->qcap;
            c->q[c->qhead] = j;
        } else {
            c->q[(c->qhead + c->qlen) % c->qcap] = j;
        }
        c->qlen++;
    }
    if (n > 1) pthread_cond_broadcast(&c->cv_job);
    else pthread_cond_signal(&c->cv_job);
}

/* The file span of matrix w: [*a0, *a0 + *span) in whole units, of which
 * the first *need bytes hold it; its bytes start at off mod EC_ALIGN. */
static int mat_span(const expert_cache_t *c, const kern_mat_t *w, uint64_t *a0, uint64_t *need, uint64_t *span) {
    const int64_t off = gguf_file_offset(c->m->file, w->data);
    *a0 = *need = *span = 0;
    if (off < 0) return -1;
    *a0 = (uint64_t)off / EC_ALIGN * EC_ALIGN;
    *need = (uint64_t)off + mat_len(w) - *a0;
    *span = up_align(*need);
    return (int)((uint64_t)off % EC_ALIGN);
}

/* Chunk k of an expert's load: matrix *p, bytes [*lo, *lo + *len) of its span. */
static void chunk_of(const expert_cache_t *c, const model_expert_t *src, int k, int *p, uint64_t *lo, uint64_t *len) {
    const kern_mat_t *w[3] = {&src->gate, &src->up, &src->down};
    for (int q = 0; q < 3; q++) {
        uint64_t a0, need, span;
        (void)mat_span(c, w[q], &a0, &need, &span);
        const int n = (int)((span + c->chunk - 1) / c->chunk);
        if (k < n) {
            *p = q;
            *lo = (uint64_t)k * c->chunk;
            *len = span - *lo < c->chunk ? span - *lo : c->chunk;
            return;
        }
        k -= n;
    }
    TERN_CHECK(0);
}

/* A slot for a new expert of layer l: a free one, else the least recently
 * used evictable one (its expert leaves the map); with per-layer lists, a
 * free one only while the layer holds less than its quota, else one of the
 * layer's own. -1 when there is none. */
static int take_slot(expert_cache_t *c, int64_t l) {
    const int li = c->n_lists > 1 ? (int)l : 0;
    int s;
    if (c->n_free > 0 && (c->n_lists == 1 || c->used[li] < c->quota[li])) {
        s = c->free_stack[--c->n_free];
    } else {
        s = c->lru_head[li];
        if (s < 0) return -1;
        lru_remove(c, s);
        c->map[c->slots[s].key] = -1;
        if (c->n_lists > 1) c->used[list_of(c, c->slots[s].key)]--;
        c->st.evictions++;
    }
    if (c->n_lists > 1) c->used[li]++;
    return s;
}

/* A slot back on the free list (its read failed and nobody waits). */
static void free_slot(expert_cache_t *c, int s) {
    ec_slot_t *x = &c->slots[s];
    c->map[x->key] = -1;
    if (c->n_lists > 1) c->used[list_of(c, x->key)]--;
    x->key = -1;
    x->state = S_EMPTY;
    c->free_stack[c->n_free++] = s;
}

static void assign(expert_cache_t *c, int s, int64_t key, int pins, bool front) {
    ec_slot_t *x = &c->slots[s];
    x->key = key;
    x->gen++;
    x->state = S_QUEUED;
    x->pins = pins;
    x->hinted = !front;
    x->prev = x->next = -1;
    /* where each matrix will sit in the slot, and the chunks of the load */
    const model_expert_t *src = &c->m->layers[key / c->n_expert].experts[key % c->n_expert];
    x->ex = *src;
    kern_mat_t *o[3] = {&x->ex.gate, &x->ex.up, &x->ex.down};
    char *part = c->mem + (size_t)s * c->slot_bytes;
    x->n_chunks = 0;
    for (int p = 0; p < 3; p++) {
        uint64_t a0, need, span;
        const int in = mat_span(c, o[p], &a0, &need, &span);
        TERN_CHECK(in >= 0 && span <= c->part[p]);
        o[p]->data = part + in;
        part += c->part[p];
        x->n_chunks += (int)((span + c->chunk - 1) / c->chunk);
    }
    TERN_CHECK(x->n_chunks >= 1 && x->n_chunks <= EC_MAX_CHUNKS);
    x->n_done = 0;
    x->claimed = 0;
    x->failed = false;
    c->map[key] = s;
    q_push(c, s, front);
}

/* ---- the I/O workers -------------------------------------------------------------- */

/* Read [a0 + lo, a0 + lo + len) of the file into dst (len whole units);
 * bytes past need (the end of the matrix) may be missing at the end of the
 * file. 0 or an errno value. */
static int read_chunk(expert_cache_t *c, char *dst, uint64_t a0, uint64_t lo, uint64_t len, uint64_t need,
                      uint64_t *nread) {
    const uint64_t want = lo + len > need ? (need > lo ? need - lo : 0) : len;
    uint64_t got = 0;
    while (got < want) {
        const ssize_t r = pread(c->fd, dst + got, (size_t)(len - got), (off_t)(a0 + lo + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (r == 0) break;
        got += (uint64_t)r;
    }
    *nread += got;
    if (!c->direct) (void)posix_fadvise(c->fd, (off_t)(a0 + lo), (off_t)got, POSIX_FADV_DONTNEED);
    return got >= want ? 0 : EIO;
}

static void *worker_main(void *arg) {
    expert_cache_t *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->qlen == 0) pthread_cond_wait(&c->cv_job, &c->mu);
        if (c->stop) break;
        const ec_job_t j = c->q[c->qhead];
        c->qhead = (c->qhead + 1) % c->qcap;
        c->qlen--;
        ec_slot_t *x = &c->slots[j.slot];
        if (x->gen != j.gen || (x->state != S_QUEUED && x->state != S_LOADING) || (x->claimed >> j.chunk & 1))
            continue; /* a duplicate, or stale: drop it */
        x->claimed |= 1ull << j.chunk;
        x->state = S_LOADING;
        const model_expert_t *src = &c->m->layers[x->key / c->n_expert].experts[x->key % c->n_expert];
        int p;
        uint64_t lo, len;
        chunk_of(c, src, j.chunk, &p, &lo, &len);
        const kern_mat_t *w[3] = {&src->gate, &src->up, &src->down};
        uint64_t a0, need, span;
        const bool bad = mat_span(c, w[p], &a0, &need, &span) < 0;
        char *dst = c->mem + (size_t)j.slot * c->slot_bytes + lo;
        for (int q = 0; q < p; q++) dst += c->part[q];
        pthread_mutex_unlock(&c->mu);

        uint64_t nread = 0;
        const uint64_t t0 = tern_now_ns();
        const int rc = bad ? EINVAL : read_chunk(c, dst, a0, lo, len, need, &nread);
        const uint64_t dt = tern_now_ns() - t0;

        pthread_mutex_lock(&c->mu);
        c->st.bytes_read += nread;
        c->st.read_ns += dt;
        if (x->gen == j.gen) { /* always true: a LOADING slot is never reassigned */
            x->failed |= rc != 0;
            if (++x->n_done == x->n_chunks) {
                x->state = x->failed ? S_FAILED : S_READY;
                if (x->state == S_READY && x->pins == 0 && !x->hot) lru_push(c, j.slot);
                if (x->state == S_FAILED && x->pins == 0 && !x->hot) free_slot(c, j.slot); /* nobody waits */
                pthread_cond_broadcast(&c->cv_ready);
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- the counts file ----------------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define EC_FNV0 0xcbf29ce484222325ull
#define EC_HDR 32 /* magic, version, n_layer, n_expert, file size */

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int ec_parse_counts(const unsigned char *b, size_t len, int64_t n_layer, int64_t n_expert, uint64_t file_size,
                    uint32_t *counts) {
    if (!b || n_layer <= 0 || n_expert <= 0 || n_layer > UINT32_MAX || n_expert > UINT32_MAX) return TERN_EFORMAT;
    uint64_t n, want;
    if (tern_mul_overflow_u64((uint64_t)n_layer, (uint64_t)n_expert, &n) || n > (UINT64_MAX - EC_HDR - 8) / 4)
        return TERN_EFORMAT;
    want = EC_HDR + 4 * n + 8;
    if ((uint64_t)len != want || memcmp(b, "TERNEXPU", 8) != 0 || get32(b + 8) != 1 ||
        get32(b + 12) != (uint32_t)n_layer || get32(b + 16) != (uint32_t)n_expert || get32(b + 20) != 0 ||
        get64(b + 24) != file_size || get64(b + want - 8) != fnv1a(EC_FNV0, b, (size_t)(want - 8)))
        return TERN_EFORMAT;
    for (uint64_t i = 0; i < n; i++) counts[i] = get32(b + EC_HDR + 4 * i);
    return 0;
}

/* The counts of path into c->counts when the file is whole and of this
 * model; false (counts left at zero) otherwise. The length is checked
 * against the header's before the file is read. */
static bool load_counts(expert_cache_t *c, const char *path) {
    const uint64_t n = (uint64_t)c->n_layer * (uint64_t)c->n_expert, want = EC_HDR + 4 * n + 8;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool ok = false;
    unsigned char *b = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && (uint64_t)sb.st_size == want && (b = malloc((size_t)want)) &&
        fread(b, 1, (size_t)want, f) == want)
        ok = ec_parse_counts(b, (size_t)want, c->n_layer, c->n_expert, gguf_file_size(c->m->file), c->counts) == 0;
    if (!ok) fprintf(stderr, "tern: expert usage file %s is not one of this model; no pinning from it\n", path);
    free(b);
    fclose(f);
    return ok;
}

int ec_save_counts(expert_cache_t *c, tern_error_t *err) {
    if (!c->counts || !c->pin_path || !c->counted) return 0; /* nothing new: leave the file alone */
    const uint64_t n = (uint64_t)c->n_layer * (uint64_t)c->n_expert, len = EC_HDR + 4 * n + 8;
    unsigned char *b = calloc(1, (size_t)len);
    if (!b) return tern_err(err, TERN_ENOMEM, "expert cache: out of memory for the usage counts");
    memcpy(b, "TERNEXPU", 8);
    put32(b + 8, 1);
    put32(b + 12, (uint32_t)c->n_layer);
    put32(b + 16, (uint32_t)c->n_expert);
    put32(b + 20, 0); /* padding to 8 */
    put64(b + 24, gguf_file_size(c->m->file));
    pthread_mutex_lock(&c->mu);
    for (uint64_t i = 0; i < n; i++) put32(b + EC_HDR + 4 * i, c->counts[i]);
    pthread_mutex_unlock(&c->mu);
    put64(b + len - 8, fnv1a(EC_FNV0, b, (size_t)(len - 8)));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", c->pin_path);
    int rc = 0;
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = tern_err(err, TERN_EIO, "expert cache: cannot write %s: %s", tmp, strerror(errno));
    } else {
        uint64_t off = 0;
        while (off < len && rc == 0) {
            const ssize_t w = write(fd, b + off, (size_t)(len - off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) rc = tern_err(err, TERN_EIO, "expert cache: writing %s: %s", tmp, strerror(errno));
            else off += (uint64_t)w;
        }
        if (rc == 0 && fsync(fd) != 0) rc = tern_err(err, TERN_EIO, "expert cache: fsync %s: %s", tmp, strerror(errno));
        close(fd);
        if (rc == 0 && rename(tmp, c->pin_path) != 0)
            rc = tern_err(err, TERN_EIO, "expert cache: rename %s: %s", tmp, strerror(errno));
        if (rc) unlink(tmp);
    }
    free(b);
    return rc;
}

/* ---- create / free ---------------------------------------------------------------------- */

static int by_count_desc(const void *a, const void *b, void *ctx) {
    const uint32_t *cnt = ctx;
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (cnt[x] != cnt[y]) return cnt[x] > cnt[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

expert_cache_t *ec_new(const model_t *m, const char *path, const ec_params_t *p, tern_error_t *err) {
    if (!m || !path || !p || m->hp.n_expert <= 0) {
        tern_err(err, TERN_EINVAL, "expert cache: needs a Mixture-of-Experts model and its path");
        return NULL;
    }
    expert_cache_t *c = calloc(1, sizeof *c);
    if (!c) {
        tern_err(err, TERN_ENOMEM, "expert cache: out of memory");
        return NULL;
    }
    c->m = m;
    c->fd = -1;
    c->n_layer = m->hp.n_layer;
    c->n_expert = m->hp.n_expert;
    part_sizes(m, c->part);
    c->slot_bytes = c->part[0] + c->part[1] + c->part[2];
    /* chunks: EC_CHUNK_MIN, or larger so that a slot takes at most
     * EC_MAX_CHUNKS - 3 of them (each part rounds up once) */
    const uint64_t cmin = p->chunk_bytes ? up_align(p->chunk_bytes) : EC_CHUNK_MIN;
    c->chunk = up_align(c->slot_bytes / (EC_MAX_CHUNKS - 3) + 1);
    if (c->chunk < cmin) c->chunk = cmin;
    const uint64_t total = (uint64_t)c->n_layer * (uint64_t)c->n_expert;
    uint64_t ns = c->slot_bytes ? p->bytes / c->slot_bytes : 0;
    if (ns < 1) ns = 1;
    if (ns > total) ns = total;
    c->n_slots = (int)ns;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_job, NULL);
    pthread_cond_init(&c->cv_ready, NULL);

    c->fd = p->no_direct ? -1 : open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    c->direct = c->fd >= 0;
    if (c->fd >= 0) { /* does this file system take direct reads? */
        void *probe = NULL;
        if (posix_memalign(&probe, EC_ALIGN, EC_ALIGN) != 0) probe = NULL;
        if (!probe || pread(c->fd, probe, EC_ALIGN, 0) < 0) {
            close(c->fd);
            c->fd = -1;
            c->direct = false;
        }
        free(probe);
    }
    if (c->fd < 0) c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0) {
        tern_err(err, TERN_EIO, "expert cache: cannot open %s: %s", path, strerror(errno));
        ec_free(c);
        return NULL;
    }
    c->mem_len = (size_t)(ns * c->slot_bytes);
    c->mem = mmap(NULL, c->mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c->mem == MAP_FAILED) c->mem = NULL;
    if (c->mem) {
        /* Huge pages where the kernel gives them: fewer TLB misses in the
         * products. The pages are faulted in by the first read into each
         * slot, not at load: faulting in 17 GiB took 25 s at load on the
         * development VM (its host backs guest memory lazily), while the
         * cache fills within the first tokens anyway. */
        (void)madvise(c->mem, c->mem_len, MADV_HUGEPAGE);
    }
    c->slots = calloc((size_t)ns, sizeof *c->slots);
    c->map = malloc((size_t)total * sizeof *c->map);
    c->free_stack = malloc((size_t)ns * sizeof *c->free_stack);
    /* a slot has at most three jobs per chunk queued: its own, a demand
     * promotion of a hint, a retry after a failed read */
    c->qcap = 3 * EC_MAX_CHUNKS * (int)ns + 1;
    c->q = malloc((size_t)c->qcap * sizeof *c->q);
    c->n_lists = p->per_layer && c->n_slots >= c->n_layer ? (int)c->n_layer : 1;
    c->lru_head = malloc((size_t)c->n_lists * sizeof *c->lru_head);
    c->lru_tail = malloc((size_t)c->n_lists * sizeof *c->lru_tail);
    c->quota = calloc((size_t)c->n_lists, sizeof *c->quota);
    c->used = calloc((size_t)c->n_lists, sizeof *c->used);
    if (!c->mem || !c->slots || !c->map || !c->free_stack || !c->q || !c->lru_head || !c->lru_tail || !c->quota ||
        !c->used) {
        tern_err(err, TERN_ENOMEM, "expert cache: out of memory for %d slots of %llu bytes", c->n_slots,
                 (unsigned long long)c->slot_bytes);
        ec_free(c);
        return NULL;
    }
    for (uint64_t i = 0; i < total; i++) c->map[i] = -1;
    for (int i = 0; i < c->n_lists; i++) {
        c->lru_head[i] = c->lru_tail[i] = -1;
        /* per layer: an equal share of the slots, the remainder to the first layers */
        c->quota[i] = c->n_slots / c->n_lists + (i < c->n_slots % c->n_lists);
    }
    for (int s = 0; s < c->n_slots; s++) {
        c->slots[s] = (ec_slot_t){.key = -1, .prev = -1, .next = -1};
        c->free_stack[c->n_free++] = c->n_slots - 1 - s;
    }
    c->st.n_slots = c->n_slots;
    c->st.slot_bytes = c->slot_bytes;
    c->st.direct = c->direct;

    if (p->pin_path) {
        c->counts = calloc((size_t)total, sizeof *c->counts);
        c->pin_path = strdup(p->pin_path);
        if (!c->counts || !c->pin_path) {
            tern_err(err, TERN_ENOMEM, "expert cache: out of memory for the usage counts");
            ec_free(c);
            return NULL;
        }
    }
    /* The counts so far (kept growing whether or not this run pins), then
     * the hottest experts first, pinned for good. */
    const bool have_counts = c->counts && access(p->pin_path, R_OK) == 0 && load_counts(c, p->pin_path);
    if (have_counts && p->pin_share > 0) {
        int64_t *order = malloc((size_t)total * sizeof *order);
        if (order) {
            for (uint64_t i = 0; i < total; i++) order[i] = (int64_t)i;
            qsort_r(order, (size_t)total, sizeof *order, by_count_desc, c->counts);
            int n_hot = (int)(p->pin_share * c->n_slots);
            if (n_hot > c->n_slots) n_hot = c->n_slots;
            for (int i = 0; i < n_hot && c->counts[order[i]] > 0; i++) {
                const int s = take_slot(c, order[i] / c->n_expert);
                if (s < 0) continue;
                assign(c, s, order[i], 0, false);
                c->slots[s].hot = true;
                c->slots[s].hinted = false;
                c->st.n_pinned++;
            }
            free(order);
        }
    }

    c->n_threads = p->io_threads > 0 ? p->io_threads : EC_DEFAULT_IO_THREADS;
    c->threads = calloc((size_t)c->n_threads, sizeof *c->threads);
    if (!c->threads) {
        tern_err(err, TERN_ENOMEM, "expert cache: out of memory");
        ec_free(c);
        return NULL;
    }
    for (int i = 0; i < c->n_threads; i++) {
        if (pthread_create(&c->threads[i], NULL, worker_main, c) != 0) {
            c->n_threads = i;
            tern_err(err, TERN_ENOMEM, "expert cache: cannot start I/O thread %d", i);
            ec_free(c);
            return NULL;
        }
    }
    return c;
}

void ec_free(expert_cache_t *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv_job);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_threads; i++) pthread_join(c->threads[i], NULL);
    free(c->threads);
    if (c->fd >= 0) close(c->fd);
    if (c->mem) munmap(c->mem, c->mem_len);
    free(c->slots);
    free(c->map);
    free(c->free_stack);
    free(c->q);
    free(c->lru_head);
    free(c->lru_tail);
    free(c->quota);
    free(c->used);
    free(c->counts);
    free(c->pin_path);
    pthread_cond_destroy(&c->cv_job);
    pthread_cond_destroy(&c->cv_ready);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- the forward's side ------------------------------------------------------------------ */

ec_status_t ec_get(expert_cache_t *c, int64_t l, int64_t e, int *slot) {
    const int64_t key = l * c->n_expert + e;
    pthread_mutex_lock(&c->mu);
    ec_status_t st;
    int s = c->map[key];
    if (s >= 0) {
        ec_slot_t *x = &c->slots[s];
        if (x->pins == 0) lru_remove(c, s);
        x->pins++;
        const bool hinted = x->hinted;
        if (hinted) {
            c->st.prefetch_used++;
            x->hinted = false;
        }
        if (x->state == S_READY) {
            c->st.hits++;
            st = EC_READY;
        } else {
            c->st.misses++;
            if (x->state == S_FAILED) { /* try again */
                x->state = S_QUEUED;
                x->n_done = 0;
                x->claimed = 0;
                x->failed = false;
                q_push(c, s, true);
            } else if ((x->state == S_QUEUED || x->state == S_LOADING) && hinted) { /* ahead of the other hints */
                q_push(c, s, true);
            }
            st = EC_PENDING;
        }
    } else if ((s = take_slot(c, l)) >= 0) {
        assign(c, s, key, 1, true);
        c->st.misses++;
        st = EC_PENDING;
    } else {
        st = EC_NOSLOT;
    }
    pthread_mutex_unlock(&c->mu);
    *slot = s;
    return st;
}

bool ec_ready(expert_cache_t *c, int slot) {
    pthread_mutex_lock(&c->mu);
    const bool r = c->slots[slot].state == S_READY;
    pthread_mutex_unlock(&c->mu);
    return r;
}

int ec_wait(expert_cache_t *c, int slot, tern_error_t *err) {
    pthread_mutex_lock(&c->mu);
    const uint64_t t0 = tern_now_ns();
    while (c->slots[slot].state == S_QUEUED || c->slots[slot].state == S_LOADING) pthread_cond_wait(&c->cv_ready, &c->mu);
    c->st.wait_ns += tern_now_ns() - t0;
    const int state = c->slots[slot].state;
    const int64_t key = c->slots[slot].key;
    pthread_mutex_unlock(&c->mu);
    if (state != S_READY)
        return tern_err(err, TERN_EIO, "expert cache: reading expert %lld of layer %lld failed",
                        (long long)(key % c->n_expert), (long long)(key / c->n_expert));
    return 0;
}

void ec_wait_slot(expert_cache_t *c, int64_t l) {
    const int li = c->n_lists > 1 ? (int)l : 0;
    pthread_mutex_lock(&c->mu);
    const uint64_t t0 = tern_now_ns();
    while (!(c->n_free > 0 && (c->n_lists == 1 || c->used[li] < c->quota[li])) && c->lru_head[li] < 0)
        pthread_cond_wait(&c->cv_ready, &c->mu);
    c->st.wait_ns += tern_now_ns() - t0;
    pthread_mutex_unlock(&c->mu);
}

const model_expert_t *ec_expert(const expert_cache_t *c, int slot) { return &c->slots[slot].ex; }

void ec_put(expert_cache_t *c, int slot) {
    pthread_mutex_lock(&c->mu);
    ec_slot_t *x = &c->slots[slot];
    TERN_CHECK(x->pins > 0);
    if (--x->pins == 0 && !x->hot) {
        if (x->state == S_READY) {
            lru_push(c, slot);
        } else if (x->state == S_FAILED) {
            free_slot(c, slot);
        }
        pthread_cond_broadcast(&c->cv_ready); /* ec_wait_slot */
    }
    pthread_mutex_unlock(&c->mu);
}

void ec_hint(expert_cache_t *c, int64_t l, int64_t e) {
    const int64_t key = l * c->n_expert + e;
    pthread_mutex_lock(&c->mu);
    if (c->map[key] < 0) {
        const int s = take_slot(c, l);
        if (s >= 0) {
            assign(c, s, key, 0, false);
            c->st.prefetched++;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void ec_count(expert_cache_t *c, int64_t l, int64_t e, uint32_t uses) {
    if (!c->counts) return;
    pthread_mutex_lock(&c->mu);
    uint32_t *n = &c->counts[l * c->n_expert + e];
    *n = *n > UINT32_MAX - uses ? UINT32_MAX : *n + uses;
    c->counted = true;
    pthread_mutex_unlock(&c->mu);
}

void ec_pred(expert_cache_t *c, uint64_t hits, uint64_t total) {
    pthread_mutex_lock(&c->mu);
    c->st.pred_hits += hits;
    c->st.pred_total += total;
    pthread_mutex_unlock(&c->mu);
}

void ec_stats(const expert_cache_t *c, ec_stats_t *st) {
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    *st = c->st;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

void ec_stats_reset(expert_cache_t *c) {
    pthread_mutex_lock(&c->mu);
    const int ns = c->st.n_slots, np = c->st.n_pinned;
    const uint64_t sb = c->st.slot_bytes;
    const bool d = c->st.direct;
    memset(&c->st, 0, sizeof c->st);
    c->st.n_slots = ns, c->st.n_pinned = np, c->st.slot_bytes = sb, c->st.direct = d;
    pthread_mutex_unlock(&c->mu);
}
