/*
 * matvec.c - the drivers that turn a weight matrix and float activations
 * into pool work: matvec, several matrices sharing one input, the two-input
 * matvec and GEMM.
 *
 * Every driver has the same three steps:
 *   1. validate the arguments (a bad shape is an error, never a crash);
 *   2. quantize each activation column ONCE into the weight format's
 *      activation type, in a grow-only per-thread workspace (matrices whose
 *      kernels share an act fn share the quantized copy);
 *   3. one pool dispatch over the rows, one tern_range_t per matrix, where
 *      every output element y[j][r] is produced by the format's dot fn for
 *      row r and a tile of up to KERN_MAX_COLS columns containing j.
 * The dot fn's contract (a column's result does not depend on which tile it
 * is computed in) makes matvec, matvec2 and every GEMM column bit-identical,
 * and since a row is never split, results do not depend on the thread count.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"
#include "kernels/kernels.h"
#include "kernels/prefetch.h"

/* ---- per-thread workspace --------------------------------------------- */

typedef struct {
    void *p;
    size_t cap;
} ws_t;

/* Two per thread: WS_ACT holds a call's quantized activations (on the
 * caller's thread), WS_GEMM the scratch of a GEMM run (on every thread that
 * runs rows, the caller included, while its WS_ACT is in use). */
enum { WS_ACT, WS_GEMM, WS_COUNT };
static pthread_key_t g_ws_key[WS_COUNT];
static pthread_once_t g_ws_once = PTHREAD_ONCE_INIT;
static int g_ws_key_ok;

static void ws_destroy(void *v) {
    ws_t *w = v;
    if (!w) return;
    tern_free(w->p);
    free(w);
}

static void ws_key_init(void) {
    g_ws_key_ok = 1;
    for (int i = 0; i < WS_COUNT; i++)
        if (pthread_key_create(&g_ws_key[i], ws_destroy) != 0) g_ws_key_ok = 0;
}

/* The calling thread's workspace `which`, grown to at least bytes (contents
 * are not kept when it grows). NULL when out of memory. */
static void *ws_get(int which, size_t bytes) {
    pthread_once(&g_ws_once, ws_key_init);
    if (!g_ws_key_ok) return NULL;
    ws_t *w = pthread_getspecific(g_ws_key[which]);
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w) return NULL;
        if (pthread_setspecific(g_ws_key[which], w) != 0) {
            free(w);
            return NULL;
        }
    }
    if (w->cap < bytes) {
        /* Grow geometrically so a sequence of slightly larger calls (a KV
         * cache or a prompt growing) does not reallocate every time. */
        size_t cap = w->cap + w->cap / 2;
        if (cap < bytes) cap = bytes;
        tern_free(w->p);
        w->p = tern_alloc(cap);
        w->cap = w->p ? cap : 0;
        if (!w->p) return NULL;
    }
    return w->p;
}

void kern_thread_release(void) {
    pthread_once(&g_ws_once, ws_key_init);
    if (!g_ws_key_ok) return;
    for (int i = 0; i < WS_COUNT; i++) {
        ws_t *w = pthread_getspecific(g_ws_key[i]);
        if (!w) continue;
        pthread_setspecific(g_ws_key[i], NULL);
        ws_destroy(w);
    }
}

/* ---- the row job ------------------------------------------------------ */

/* Rows of weights per block in the GEMM loop: about this many bytes, so a
 * block stays in L2 while every column tile passes over it, and each tile's
 * activations (at most KERN_MAX_COLS rows of act) stay in L1/L2 across the
 * rows of the block. */
#define GEMM_BLOCK_BYTES (128 * 1024)
/* Rows per chunk boundary handed to the pool: 16 floats of y = one cache
 * line, so two threads never write the same line of an output column. */
#define ROW_ALIGN 16
/* Interleaved read streams per chunk in the matvec loop (-DMV_STREAMS=n for
 * experiments; measured: docs/PERF.md). */
#ifndef MV_STREAMS
#define MV_STREAMS 4
#endif
/* The kernels prefetch their weights PF_DIST (2 KB) ahead of where they
 * read, so the first PF_DIST bytes of each stream would arrive one demand
 * miss at a time: mv_rows prefetches them itself when a chunk starts
 * (measured: docs/PERF.md). */
#define MV_PREFETCH_BYTES PF_DIST
/* From this many columns on, quantizing them is worth its own dispatch. */
#define ACT_PARALLEL_MIN_COLS 16

typedef struct {
    kern_dot_fn dot;
    kern_rows_fn rows; /* NULL: the format has no multi-row kernel */
    int64_t k;
    size_t row_bytes;
    const char *w;
    const char *xa;   /* column 0's activations */
    size_t xa_stride; /* bytes between columns */
    int64_t n;        /* columns */
    /* Output of column j: ycol[j] when n <= KERN_MAX_COLS and ycol[0] is
     * set (matvec2's unrelated buffers), else y + j * ldy. */
    float *ycol[KERN_MAX_COLS];
    float *y;
    int64_t ldy;
    int64_t block_rows;
    /* The format's own GEMM (n >= KERN_GEMM_MIN_COLS), or NULL; small: its
     * run_small serves these columns. */
    const kern_gemm_t *gemm;
    bool small;
    kern_gemm_args_t gargs;
    size_t scratch;
} mv_job_t;

static inline float *job_col(const mv_job_t *j, int64_t c) {
    return j->ycol[0] ? j->ycol[c] : j->y + c * j->ldy;
}

/* Prefetch the first MV_PREFETCH_BYTES of the bytes [p, p + n). */
static inline void mv_prefetch_start(const char *p, size_t n) {
    if (n > MV_PREFETCH_BYTES) n = MV_PREFETCH_BYTES;
    for (size_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 3);
}

/* One row through the dot fn, scattered to the columns' outputs. */
static inline void mv_row(const mv_job_t *j, const char *xa, int nc, float *const *yc, int64_t r) {
    float out[KERN_MAX_COLS];
    j->dot(j->k, j->w + (size_t)r * j->row_bytes, xa, j->xa_stride, nc, out);
    for (int c = 0; c < nc; c++) yc[c][r] = out[c];
}

static int mv_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const mv_job_t *j = ctx;
    if (j->gemm && j->small) {
        j->gemm->run_small(&j->gargs, j->w + (size_t)r0 * j->row_bytes, j->row_bytes, r1 - r0, j->y + r0, j->ldy);
        return 0;
    }
    if (j->gemm) {
        void *scratch = NULL;
        if (j->scratch) {
            scratch = ws_get(WS_GEMM, j->scratch);
            if (!scratch) return TERN_ENOMEM;
        }
        j->gemm->run(&j->gargs, j->w + (size_t)r0 * j->row_bytes, j->row_bytes, r1 - r0, j->y + r0, j->ldy, scratch);
        return 0;
    }
    if (j->n <= KERN_MAX_COLS) {
        /* Matvec (and matvec2, small GEMM): one tile of columns, memory
         * bound. The chunk is read as MV_STREAMS interleaved sub-ranges, so
         * a core keeps several independent prefetch streams in flight (one
         * sequential stream per core leaves bandwidth unused; see
         * bench/probe.c). Each row is still one dot call: same bits. */
        const int nc = (int)j->n;
        float *yc[KERN_MAX_COLS];
        for (int c = 0; c < nc; c++) yc[c] = job_col(j, c);
        const int64_t len = r1 - r0;
        const int s_n = len >= (int64_t)MV_STREAMS * 4 ? MV_STREAMS : 1;
        const int64_t q = len / s_n;
        for (int s = 0; s < s_n; s++)
            mv_prefetch_start(j->w + (size_t)(r0 + s * q) * j->row_bytes, (size_t)q * j->row_bytes);
        if (j->rows && s_n > 1 && nc <= 2) {
            /* The format reads several rows in lockstep: one call serves
             * one row of each stream. */
            _Static_assert(MV_STREAMS <= KERN_MAX_ROWS, "streams fit one rows call");
            const void *wp[MV_STREAMS];
            float out[MV_STREAMS * 2];
            for (int64_t i = 0; i < q; i++) {
                for (int s = 0; s < s_n; s++) wp[s] = j->w + (size_t)(r0 + s * q + i) * j->row_bytes;
                j->rows(j->k, wp, s_n, j->xa, j->xa_stride, nc, out);
                for (int s = 0; s < s_n; s++)
                    for (int c = 0; c < nc; c++) yc[c][r0 + s * q + i] = out[s * nc + c];
            }
        } else {
            for (int64_t i = 0; i < q; i++)
                for (int s = 0; s < s_n; s++) mv_row(j, j->xa, nc, yc, r0 + s * q + i);
        }
        for (int64_t r = r0 + s_n * q; r < r1; r++) mv_row(j, j->xa, nc, yc, r);
        return 0;
    }
    /* GEMM: blocks of rows that stay in L2 while every tile of columns
     * passes over them; a tile's activations stay in L1/L2 along the rows. */
    for (int64_t b0 = r0; b0 < r1; b0 += j->block_rows) {
        const int64_t b1 = b0 + j->block_rows < r1 ? b0 + j->block_rows : r1;
        for (int64_t c0 = 0; c0 < j->n; c0 += KERN_MAX_COLS) {
            const int nc = j->n - c0 < KERN_MAX_COLS ? (int)(j->n - c0) : KERN_MAX_COLS;
            const char *xa = j->xa + (size_t)c0 * j->xa_stride;
            float *yc[KERN_MAX_COLS];
            for (int c = 0; c < nc; c++) yc[c] = job_col(j, c0 + c);
            for (int64_t r = b0; r < b1; r++) mv_row(j, xa, nc, yc, r);
        }
    }
    return 0;
}

/* ---- activation quantization ----------------------------------------- */

/* One distinct act fn of a call and where its quantized columns live. */
typedef struct {
    kern_act_fn act;
    size_t stride; /* bytes between columns, 64-aligned */
    char *base;
    const float *x; /* its input: n columns of k floats, ldx apart */
    int64_t n, ldx, k;
} act_group_t;

typedef struct {
    const act_group_t *g;
    int ng;
} act_job_t;

/* Column i of all the groups' columns, counted group after group. */
static int act_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const act_job_t *a = ctx;
    int gi = 0;
    int64_t first = 0; /* index of group gi's column 0 */
    for (int64_t i = r0; i < r1; i++) {
        while (i >= first + a->g[gi].n) first += a->g[gi++].n;
        const act_group_t *g = &a->g[gi];
        const int64_t c = i - first;
        g->act(g->x + c * g->ldx, g->base + (size_t)c * g->stride, g->k);
    }
    return 0;
}

/* One GEMM layout of an act group: prep's groups of KERN_GEMM_GROUP columns. */
typedef struct {
    int ag; /* act group it reads */
    const kern_gemm_t *gemm;
    size_t group_bytes;
    char *base;
} prep_t;

/* Column groups of KERN_GEMM_GROUP in the act group's n columns. */
static int64_t col_groups(int64_t n) { return (n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP; }

typedef struct {
    const act_group_t *g;
    const prep_t *p;
    int np;
} prep_job_t;

/* Column group i of all the layouts' column groups, layout after layout. */
static int prep_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const prep_job_t *pj = ctx;
    int pi = 0;
    int64_t first = 0;
    for (int64_t i = r0; i < r1; i++) {
        while (i >= first + col_groups(pj->g[pj->p[pi].ag].n)) first += col_groups(pj->g[pj->p[pi++].ag].n);
        const prep_t *p = &pj->p[pi];
        const act_group_t *g = &pj->g[p->ag];
        const int64_t gi = i - first, c0 = gi * KERN_GEMM_GROUP;
        const int nc = g->n - c0 < KERN_GEMM_GROUP ? (int)(g->n - c0) : KERN_GEMM_GROUP;
        p->gemm->prep(g->k, g->base + (size_t)c0 * g->stride, g->stride, nc, p->base + (size_t)gi * p->group_bytes);
    }
    return 0;
}

/* ---- the common driver ------------------------------------------------ */

typedef struct {
    const char *fn;      /* caller's name, for messages */
    int nm;              /* matrices */
    const kern_mat_t *const *w;
    int64_t n;           /* columns */
    const float *x;      /* column c at x + c * ldx */
    int64_t ldx;
    float *const *y;     /* per matrix */
    const int64_t *ldy;  /* per matrix; NULL: n == 1 */
    float *ycol2[2];     /* matvec2's separate outputs (nm == 1, n == 2) */
    const float *xcol2[2];
    /* kern_matmul_batch: matrix i's own input xs[i] (ns[i] columns, ldxs[i]
     * apart); NULL: every matrix reads x (n columns, ldx apart). */
    const float *const *xs;
    const int64_t *ns, *ldxs;
} drive_t;

static inline const float *d_x(const drive_t *d, int i) { return d->xs ? d->xs[i] : d->x; }
static inline int64_t d_n(const drive_t *d, int i) { return d->ns ? d->ns[i] : d->n; }
static inline int64_t d_ldx(const drive_t *d, int i) { return d->ldxs ? d->ldxs[i] : d->ldx; }

static int check_mat(const drive_t *d, int i, const kern_mat_t *m, kern_isa_t isa, const kern_ops_t **ops,
                     tern_error_t *err) {
    char where[48] = "";
    if (d->nm > 1) snprintf(where, sizeof where, " (matrix %d)", i);
    if (!m) return tern_err(err, TERN_EINVAL, "%s: matrix is NULL%s", d->fn, where);
    const quant_traits_t *t = quant_traits(m->type);
    if (!t || !t->weight)
        return tern_err(err, TERN_EINVAL, "%s: type %d (%s) is not a weight type%s", d->fn, m->type,
                        quant_name(m->type), where);
    *ops = kern_ops(m->type, isa);
    if (!*ops)
        return tern_err(err, TERN_EUNSUP, "%s: no kernel for type %s%s", d->fn, t->name, where);
    if (m->rows < 0 || m->cols <= 0)
        return tern_err(err, TERN_EINVAL, "%s: bad shape %lld x %lld%s", d->fn, (long long)m->rows,
                        (long long)m->cols, where);
    if (m->cols % t->blck)
        return tern_err(err, TERN_EINVAL, "%s: cols %lld is not a multiple of the %s block of %d%s", d->fn,
                        (long long)m->cols, t->name, t->blck, where);
    size_t need = quant_row_size(m->type, m->cols);
    if (need == 0 || m->row_bytes < need)
        return tern_err(err, TERN_EINVAL, "%s: row_bytes %zu is less than a row of %lld %s elements (%zu)%s",
                        d->fn, m->row_bytes, (long long)m->cols, t->name, need, where);
    uint64_t total;
    if (tern_mul_overflow_u64((uint64_t)m->rows, (uint64_t)m->row_bytes, &total) || total > SIZE_MAX ||
        total > (uint64_t)INT64_MAX)
        return tern_err(err, TERN_EINVAL, "%s: %lld rows of %zu bytes overflow%s", d->fn, (long long)m->rows,
                        m->row_bytes, where);
    if (m->rows > 0 && !m->data) return tern_err(err, TERN_EINVAL, "%s: matrix data is NULL%s", d->fn, where);
    return 0;
}

static int drive(tern_pool_t *pool, drive_t *d, tern_error_t *err) {
    if (d->nm < 1 || d->nm > KERN_MAX_MULTI)
        return tern_err(err, TERN_EINVAL, "%s: %d matrices (1..%d)", d->fn, d->nm, KERN_MAX_MULTI);
    if (!d->w) return tern_err(err, TERN_EINVAL, "%s: matrix list is NULL", d->fn);
    kern_isa_t isa = kern_isa_active();
    const kern_ops_t *ops[KERN_MAX_MULTI];
    for (int i = 0; i < d->nm; i++) {
        int rc = check_mat(d, i, d->w[i], isa, &ops[i], err);
        if (rc) return rc;
        if (d_n(d, i) < 1)
            return tern_err(err, TERN_EINVAL, "%s: %lld columns (need >= 1) for matrix %d", d->fn,
                            (long long)d_n(d, i), i);
    }
    if (!d->xs) {
        const int64_t k = d->w[0]->cols;
        for (int i = 1; i < d->nm; i++)
            if (d->w[i]->cols != k)
                return tern_err(err, TERN_EINVAL, "%s: matrix %d has %lld cols, matrix 0 has %lld", d->fn, i,
                                (long long)d->w[i]->cols, (long long)k);
    }
    if (d->xcol2[0]) {
        if (!d->xcol2[1] || !d->ycol2[0] || !d->ycol2[1])
            return tern_err(err, TERN_EINVAL, "%s: NULL input or output vector", d->fn);
    } else {
        if (!d->y) return tern_err(err, TERN_EINVAL, "%s: output list is NULL", d->fn);
        for (int i = 0; i < d->nm; i++) {
            const int64_t k = d->w[i]->cols;
            if (!d_x(d, i)) return tern_err(err, TERN_EINVAL, "%s: input is NULL (matrix %d)", d->fn, i);
            if (d_n(d, i) > 1 && d_ldx(d, i) < k)
                return tern_err(err, TERN_EINVAL, "%s: ldx %lld < cols %lld (matrix %d)", d->fn,
                                (long long)d_ldx(d, i), (long long)k, i);
            if (!d->y[i]) return tern_err(err, TERN_EINVAL, "%s: output %d is NULL", d->fn, i);
            if (d_n(d, i) > 1 && d->ldy[i] < d->w[i]->rows)
                return tern_err(err, TERN_EINVAL, "%s: ldy %lld < rows %lld (matrix %d)", d->fn,
                                (long long)d->ldy[i], (long long)d->w[i]->rows, i);
        }
    }

    /* The format's GEMM serves a matrix when there are enough columns. */
    bool use_gemm[KERN_MAX_MULTI], small[KERN_MAX_MULTI];
    for (int i = 0; i < d->nm; i++) {
        const kern_gemm_t *g = ops[i]->gemm;
        const int64_t n = d_n(d, i);
        /* A format with a few-column kernel takes 3 and 4 columns there too
         * (it reads each weight once for all of them; the dot fn tiles do
         * too but decode per column pair). */
        small[i] = !d->xcol2[0] && g && g->run_small && n >= KERN_GEMM_SMALL_MIN_COLS && n <= g->small_cols;
        use_gemm[i] = small[i] || (!d->xcol2[0] && n >= KERN_GEMM_MIN_COLS && g != NULL);
    }

    /* Group the matrices by (act fn, input); lay out each group's columns. */
    act_group_t groups[KERN_MAX_MULTI];
    int gi[KERN_MAX_MULTI];
    int ng = 0;
    uint64_t total = 0;
    for (int i = 0; i < d->nm; i++) {
        const int64_t k = d->w[i]->cols, n = d->xcol2[0] ? 2 : d_n(d, i);
        const float *x = d->xcol2[0] ? NULL : d_x(d, i);
        const int64_t ldx = d_ldx(d, i);
        int g = 0;
        while (g < ng && !(groups[g].act == ops[i]->act && groups[g].x == x && groups[g].n == n &&
                           groups[g].k == k && (n == 1 || groups[g].ldx == ldx)))
            g++;
        size_t bytes = kern_act_size(d->w[i]->type, k);
        if (bytes == 0) return tern_err(err, TERN_EINVAL, "%s: cannot size activations of %lld", d->fn, (long long)k);
        uint64_t stride = ((uint64_t)bytes + 63) & ~(uint64_t)63;
        if (g == ng) {
            groups[ng++] = (act_group_t){ops[i]->act, (size_t)stride, NULL, x, n, ldx, k};
        } else if (stride > groups[g].stride) {
            groups[g].stride = (size_t)stride;
        }
        gi[i] = g;
    }
    int64_t act_cols = 0;
    for (int g = 0; g < ng; g++) {
        uint64_t sz;
        if (tern_mul_overflow_u64((uint64_t)groups[g].n, groups[g].stride, &sz) ||
            tern_add_overflow_u64(total, sz, &total))
            return tern_err(err, TERN_EINVAL, "%s: %lld columns of %lld: activations overflow", d->fn,
                            (long long)groups[g].n, (long long)groups[g].k);
        act_cols += groups[g].n;
    }
    /* GEMM layouts, one per (act group, prep fn), after the act rows. */
    prep_t preps[KERN_MAX_MULTI];
    int pi[KERN_MAX_MULTI];
    int np = 0;
    int64_t prep_groups = 0;
    for (int i = 0; i < d->nm; i++) {
        pi[i] = -1;
        if (!use_gemm[i] || small[i] || !ops[i]->gemm->prep) continue;
        int p = 0;
        while (p < np && !(preps[p].ag == gi[i] && preps[p].gemm->prep == ops[i]->gemm->prep &&
                           preps[p].gemm->group_size == ops[i]->gemm->group_size))
            p++;
        if (p == np) {
            const act_group_t *ag = &groups[gi[i]];
            size_t gb = ops[i]->gemm->group_size(ag->k);
            if (gb == 0)
                return tern_err(err, TERN_EINVAL, "%s: cannot size GEMM activations of %lld", d->fn, (long long)ag->k);
            uint64_t gstride = ((uint64_t)gb + 63) & ~(uint64_t)63, sz;
            if (tern_mul_overflow_u64((uint64_t)col_groups(ag->n), gstride, &sz) ||
                tern_add_overflow_u64(total, sz, &total))
                return tern_err(err, TERN_EINVAL, "%s: %lld columns of %lld: GEMM activations overflow", d->fn,
                                (long long)ag->n, (long long)ag->k);
            preps[np++] = (prep_t){gi[i], ops[i]->gemm, (size_t)gstride, NULL};
            prep_groups += col_groups(ag->n);
        }
        pi[i] = p;
    }
    if (total > SIZE_MAX) return tern_err(err, TERN_EINVAL, "%s: activations too large", d->fn);
    char *ws = ws_get(WS_ACT, (size_t)total);
    if (!ws) return tern_err(err, TERN_ENOMEM, "%s: out of memory for %llu bytes of activations", d->fn,
                             (unsigned long long)total);
    size_t off = 0;
    for (int g = 0; g < ng; g++) {
        groups[g].base = ws + off;
        off += (size_t)groups[g].n * groups[g].stride;
    }
    for (int p = 0; p < np; p++) {
        preps[p].base = ws + off;
        off += (size_t)col_groups(groups[preps[p].ag].n) * preps[p].group_bytes;
    }

    if (d->xcol2[0]) {
        for (int g = 0; g < ng; g++)
            for (int c = 0; c < 2; c++) groups[g].act(d->xcol2[c], groups[g].base + c * groups[g].stride, groups[g].k);
    } else if ((d->xs ? act_cols : d->n) >= ACT_PARALLEL_MIN_COLS && tern_pool_threads(pool) > 1) {
        act_job_t aj = {groups, ng};
        tern_range_t ar = {act_rows, &aj, act_cols, 1, groups[0].k * (int64_t)sizeof(float)};
        int rc = tern_pool_run(pool, &ar, 1, err);
        if (rc) return rc;
    } else {
        act_job_t aj = {groups, ng};
        act_rows(&aj, 0, act_cols, 0);
    }

    if (np > 0) {
        prep_job_t pj = {groups, preps, np};
        if (prep_groups > 1 && tern_pool_threads(pool) > 1) {
            tern_range_t pr = {prep_rows, &pj, prep_groups, 1, groups[preps[0].ag].k * KERN_GEMM_GROUP};
            int rc = tern_pool_run(pool, &pr, 1, err);
            if (rc) return rc;
        } else {
            prep_rows(&pj, 0, prep_groups, 0);
        }
    }

    mv_job_t jobs[KERN_MAX_MULTI];
    tern_range_t ranges[KERN_MAX_MULTI];
    int nr = 0;
    for (int i = 0; i < d->nm; i++) {
        const kern_mat_t *m = d->w[i];
        if (m->rows == 0) continue;
        const act_group_t *ag = &groups[gi[i]];
        const int64_t k = m->cols, n = ag->n;
        mv_job_t *j = &jobs[nr];
        *j = (mv_job_t){.dot = ops[i]->dot,
                        .rows = ops[i]->rows,
                        .k = k,
                        .row_bytes = m->row_bytes,
                        .w = m->data,
                        .xa = ag->base,
                        .xa_stride = ag->stride,
                        .n = n,
                        .y = d->y ? d->y[i] : NULL,
                        .ldy = d->ldy ? d->ldy[i] : 0};
        if (d->xcol2[0]) {
            j->ycol[0] = d->ycol2[0];
            j->ycol[1] = d->ycol2[1];
        }
        if (use_gemm[i]) {
            const kern_gemm_t *gm = ops[i]->gemm;
            j->gemm = gm;
            j->small = small[i];
            j->gargs = (kern_gemm_args_t){.k = k, .n = n, .xa = j->xa, .xa_stride = j->xa_stride};
            if (pi[i] >= 0) {
                j->gargs.xg = preps[pi[i]].base;
                j->gargs.xg_group = preps[pi[i]].group_bytes;
            }
            j->scratch = !small[i] && gm->scratch_size ? gm->scratch_size(k) : 0;
        }
        int64_t br = (int64_t)(GEMM_BLOCK_BYTES / m->row_bytes);
        j->block_rows = br < 1 ? 1 : br;
        /* The serial gate weighs bytes touched; a row of GEMM touches its
         * weights once but computes n columns on them. */
        int64_t cost = (int64_t)m->row_bytes;
        int64_t tiles = (n + KERN_MAX_COLS - 1) / KERN_MAX_COLS;
        cost = cost > INT64_MAX / tiles ? INT64_MAX : cost * tiles;
        ranges[nr] = (tern_range_t){mv_rows, j, m->rows, ROW_ALIGN, cost};
        nr++;
    }
    if (nr == 0) return 0;
    return tern_pool_run(pool, ranges, nr, err);
}

int kern_matvec(tern_pool_t *pool, const kern_mat_t *w, const float *x, float *y, tern_error_t *err) {
    const kern_mat_t *ws[1] = {w};
    float *ys[1] = {y};
    drive_t d = {.fn = "kern_matvec", .nm = 1, .w = ws, .n = 1, .x = x, .ldx = 0, .y = ys};
    return drive(pool, &d, err);
}

int kern_matvec_multi(tern_pool_t *pool, int n, const kern_mat_t *const *w, const float *x, float *const *y,
                      tern_error_t *err) {
    drive_t d = {.fn = "kern_matvec_multi", .nm = n, .w = w, .n = 1, .x = x, .ldx = 0, .y = y};
    return drive(pool, &d, err);
}

int kern_matvec2(tern_pool_t *pool, const kern_mat_t *w, const float *x0, const float *x1, float *y0,
                 float *y1, tern_error_t *err) {
    if (!x0 || !x1 || !y0 || !y1) return tern_err(err, TERN_EINVAL, "kern_matvec2: NULL input or output vector");
    const kern_mat_t *ws[1] = {w};
    drive_t d = {.fn = "kern_matvec2", .nm = 1, .w = ws, .n = 2, .ycol2 = {y0, y1}, .xcol2 = {x0, x1}};
    return drive(pool, &d, err);
}

int kern_gemm(tern_pool_t *pool, const kern_mat_t *w, int64_t n, const float *x, int64_t ldx, float *y,
              int64_t ldy, tern_error_t *err) {
    const kern_mat_t *ws[1] = {w};
    float *ys[1] = {y};
    int64_t ldys[1] = {ldy};
    drive_t d = {.fn = "kern_gemm", .nm = 1, .w = ws, .n = n, .x = x, .ldx = ldx, .y = ys, .ldy = ldys};
    return drive(pool, &d, err);
}

int kern_gemm_multi(tern_pool_t *pool, int nm, const kern_mat_t *const *w, int64_t n, const float *x,
                    int64_t ldx, float *const *y, const int64_t *ldy, tern_error_t *err) {
    if (n > 1 && !ldy) return tern_err(err, TERN_EINVAL, "kern_gemm_multi: ldy is NULL");
    drive_t d = {.fn = "kern_gemm_multi", .nm = nm, .w = w, .n = n, .x = x, .ldx = ldx, .y = y, .ldy = ldy};
    return drive(pool, &d, err);
}

int kern_matmul_batch(tern_pool_t *pool, int np, const kern_prod_t *p, tern_error_t *err) {
    if (np < 1 || np > KERN_MAX_MULTI)
        return tern_err(err, TERN_EINVAL, "kern_matmul_batch: %d products (1..%d)", np, KERN_MAX_MULTI);
    if (!p) return tern_err(err, TERN_EINVAL, "kern_matmul_batch: product list is NULL");
    const kern_mat_t *w[KERN_MAX_MULTI];
    const float *xs[KERN_MAX_MULTI];
    float *y[KERN_MAX_MULTI];
    int64_t ns[KERN_MAX_MULTI], ldxs[KERN_MAX_MULTI], ldy[KERN_MAX_MULTI];
    for (int i = 0; i < np; i++) {
        w[i] = p[i].w, xs[i] = p[i].x, y[i] = p[i].y;
        ns[i] = p[i].n, ldxs[i] = p[i].ldx, ldy[i] = p[i].ldy;
    }
    drive_t d = {.fn = "kern_matmul_batch", .nm = np, .w = w, .n = 0, .y = y, .ldy = ldy, .xs = xs, .ns = ns,
                 .ldxs = ldxs};
    return drive(pool, &d, err);
}
