/*
 * forward.c - the forward pass (model_decode, model_eval, see model.h): a
 * batch of tokens of any sequences through every layer, top to bottom as
 * the paper draws it, in blocks of n_batch tokens.
 *
 * Shapes in the comments: n tokens of the block, row-major by position;
 * D = n_embd, HD = head_dim, NH = n_head, NKV = n_head_kv, QD = NH * HD,
 * KVD = NKV * HD, F = n_ff, V = n_vocab. A matrix W (rows, cols) maps
 * x (n, cols) to x W^T (n, rows).
 *
 * Every matrix product goes through matmul1/2/3: one pool dispatch for 1 to
 * 3 matrices sharing the input, matvec for one position and GEMM for more
 * (the kernels make both give the same bits for a position). Profiling
 * lives in the dispatch helpers (matmul, attention): each dispatch is timed
 * into its own counter of model_prof_t, and whatever ran on the caller's
 * thread since the previous one (norms, RoPE, the KV store, adds) into
 * "small".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "format/quant.h"
#include "model/model_ctx.h"

/* Return the error of a failing step. */
#define TRY(call)                \
    do {                         \
        int rc_ = (call);        \
        if (rc_) return rc_;     \
    } while (0)

/* ---- profiling --------------------------------------------------------------- */

static void prof_start(model_ctx_t *c) {
    if (c->p.profile) c->prof_mark = tern_now_ns();
}

/* The time since the previous mark goes to *counter. */
static void prof_lap(model_ctx_t *c, uint64_t *counter) {
    if (!c->p.profile) return;
    const uint64_t t = tern_now_ns();
    *counter += t - c->prof_mark;
    c->prof_mark = t;
}

/* ---- dispatches -------------------------------------------------------------- */

/* y_i (n, rows_i) = x (n, cols) W_i^T for the nm matrices W_i sharing x:
 * one dispatch, timed into *prof. */
static int matmul(model_ctx_t *c, uint64_t *prof, const float *x, int64_t n, int nm, const kern_mat_t *const *w,
                  float *const *y, tern_error_t *err) {
    int64_t ldy[3];
    TERN_CHECK(nm >= 1 && nm <= 3);
    for (int i = 0; i < nm; i++) ldy[i] = w[i]->rows;
    prof_lap(c, &c->prof.small);
    int rc;
    if (n == 1)
        rc = nm == 1 ? kern_matvec(c->pool, w[0], x, y[0], err) : kern_matvec_multi(c->pool, nm, w, x, y, err);
    else
        rc = kern_gemm_multi(c->pool, nm, w, n, x, w[0]->cols, y, ldy, err);
    prof_lap(c, prof);
    return rc;
}

static int matmul1(model_ctx_t *c, uint64_t *prof, const float *x, int64_t n, const kern_mat_t *w, float *y,
                   tern_error_t *err) {
    const kern_mat_t *ws[1] = {w};
    float *const ys[1] = {y};
    return matmul(c, prof, x, n, 1, ws, ys, err);
}

static int matmul2(model_ctx_t *c, uint64_t *prof, const float *x, int64_t n, const kern_mat_t *w0, float *y0,
                   const kern_mat_t *w1, float *y1, tern_error_t *err) {
    const kern_mat_t *ws[2] = {w0, w1};
    float *const ys[2] = {y0, y1};
    return matmul(c, prof, x, n, 2, ws, ys, err);
}

static int matmul3(model_ctx_t *c, uint64_t *prof, const float *x, int64_t n, const kern_mat_t *w0, float *y0,
                   const kern_mat_t *w1, float *y1, const kern_mat_t *w2, float *y2, tern_error_t *err) {
    const kern_mat_t *ws[3] = {w0, w1, w2};
    float *const ys[3] = {y0, y1, y2};
    return matmul(c, prof, x, n, 3, ws, ys, err);
}

/* att (n, QD) = softmax(q K^T / sqrt(HD)) V over layer l's memory, query i
 * seeing positions 0 .. pos_i of its own sequence (c->aq): one dispatch,
 * (query, KV head) pairs partitioned, a GQA group on one thread. */
static int attention(model_ctx_t *c, int64_t l, int64_t n, const float *q, float *att, tern_error_t *err) {
    const model_hparams_t *hp = &c->m->hp;
    const kv_layout_t *lo = kv_cache_layout(c->kv);
    const kern_attn_t a = {(int)hp->n_head,
                           (int)hp->n_head_kv,
                           (int)hp->head_dim,
                           lo->type,
                           kv_cache_k(c->kv, l),
                           kv_cache_v(c->kv, l),
                           1.0f / sqrtf((float)hp->head_dim),
                           lo->block_pos,
                           lo->block_bytes};
    prof_lap(c, &c->prof.small);
    const int rc = kern_attention_batch(c->pool, &a, n, c->aq, q, att, err);
    prof_lap(c, &c->prof.attn);
    return rc;
}

/* ---- small ops on rows --------------------------------------------------------- */

/* x (n, D) = the token_embd rows of ids, dequantized. */
static int embed(const model_t *m, const int32_t *ids, int64_t n, float *x, tern_error_t *err) {
    const int64_t D = m->hp.n_embd;
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *row = (const unsigned char *)m->tok_embd.data + (size_t)ids[i] * m->tok_embd.row_bytes;
        if (quant_dequantize_row(m->tok_embd.type, row, x + i * D, D) != 0)
            return tern_err(err, TERN_EUNSUP, "model: cannot dequantize token_embd rows of type %s",
                            quant_name(m->tok_embd.type));
    }
    return 0;
}

/* out (rows, width) = rmsnorm(x) * w, row by row (out may be x). */
static void rmsnorm_rows(float *out, const float *x, const float *w, int64_t rows, int64_t width, float eps) {
    for (int64_t i = 0; i < rows; i++) kern_rmsnorm(out + i * width, x + i * width, w, width, eps);
}

/* ---- per-token steps ------------------------------------------------------------ */

/* The steps between the matrix products work on each token's row alone
 * (norms, biases, RoPE at its position, the KV store into its sequence,
 * SiLU, residual adds). With several tokens they run as one pool dispatch
 * over the rows, so the other threads do not wait while the caller does
 * them; each row's arithmetic is the same whichever thread runs it. */
typedef enum {
    STEP_NORM,       /* xb = rmsnorm(x) * w */
    STEP_QKV,        /* biases, per-head Q/K norms, RoPE, the KV store of layer l */
    STEP_RESID_NORM, /* x += xb2, then xb = rmsnorm(x) * w (w NULL: the add alone) */
    STEP_SILU        /* hb = silu(hb) * hb2 */
} step_t;

typedef struct {
    model_ctx_t *c;
    const model_tok_t *t;
    const model_layer_t *L;
    const kern_rope_t *rope;
    const float *w;
    int64_t l;
    step_t step;
} step_job_t;

static int step_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const step_job_t *j = ctx;
    model_ctx_t *c = j->c;
    const model_hparams_t *hp = &c->m->hp;
    const int64_t D = hp->n_embd, HD = hp->head_dim, NH = hp->n_head, NKV = hp->n_head_kv;
    const int64_t QD = NH * HD, KVD = NKV * HD, F = hp->n_ff;
    const float eps = hp->rms_eps;
    for (int64_t i = r0; i < r1; i++) {
        switch (j->step) {
        case STEP_NORM: kern_rmsnorm(c->xb + i * D, c->x + i * D, j->w, D, eps); break;
        case STEP_QKV: {
            const model_layer_t *L = j->L;
            float *q = c->q + i * QD, *k = c->k + i * KVD, *v = c->v + i * KVD;
            /* qwen2: q, k, v += bq, bk, bv */
            if (L->bq) {
                kern_add(q, L->bq, QD);
                kern_add(k, L->bk, KVD);
                kern_add(v, L->bv, KVD);
            }
            /* qwen3: every head of q (NH, HD) and k (NKV, HD) = rmsnorm(head) * q_norm, k_norm */
            if (L->q_norm) {
                rmsnorm_rows(q, q, L->q_norm, NH, HD, eps);
                rmsnorm_rows(k, k, L->k_norm, NKV, HD, eps);
            }
            /* RoPE(q), RoPE(k) at the token's position */
            kern_rope(j->rope, q, (int)NH, (int)HD, j->t[i].pos);
            kern_rope(j->rope, k, (int)NKV, (int)HD, j->t[i].pos);
            /* K[l], V[l] of its sequence at its position = k, v */
            kv_seq_store(c->kv, j->t[i].seq, j->l, j->t[i].pos, 1, k, v);
            break;
        }
        case STEP_RESID_NORM:
            kern_add(c->x + i * D, c->xb2 + i * D, D);
            if (j->w) kern_rmsnorm(c->xb + i * D, c->x + i * D, j->w, D, eps);
            break;
        case STEP_SILU: kern_silu_mul(c->hb + i * F, c->hb2 + i * F, F); break;
        }
    }
    return 0;
}

/* One step over the n rows: on the caller for one row, else one dispatch. */
static int step(model_ctx_t *c, step_t st, const model_tok_t *t, int64_t n, const model_layer_t *L, int64_t l,
                const kern_rope_t *rope, const float *w, tern_error_t *err) {
    step_job_t j = {c, t, L, rope, w, l, st};
    if (n == 1) return step_rows(&j, 0, 1, 0);
    const model_hparams_t *hp = &c->m->hp;
    /* cost of a row in the pool's unit, bytes of streamed work (its gate
     * needs a magnitude): the bytes a norm or an add touches; an expf
     * (SiLU) or a sin/cos pair (RoPE) counted like 64 and 512 bytes, about
     * what a matvec streams in the same time */
    int64_t cost = 20 * hp->n_embd;
    if (st == STEP_SILU) cost = 64 * hp->n_ff;
    if (st == STEP_QKV)
        cost = 512 * (hp->n_head + hp->n_head_kv) * (hp->n_rot / 2) + 16 * (hp->n_head + 2 * hp->n_head_kv) * hp->head_dim;
    tern_range_t r = {step_rows, &j, n, 1, cost};
    return tern_pool_run(c->pool, &r, 1, err);
}

/* ---- the forward pass ---------------------------------------------------------- */

/* n tokens (n <= n_batch), sorted by (sequence, position), each sequence's
 * positions following on what its memory holds (reserved by the caller):
 * every layer, then the logits of the n_out tokens that want them, in
 * order, into out (n_out, V). Every step is per row except the matrix
 * products, whose columns are bit-identical to one-column products, and
 * attention, which is per query: a token's bits depend on its sequence
 * alone. */
static int forward_block(model_ctx_t *c, const model_tok_t *t, int64_t n, int64_t n_out, float *out,
                         tern_error_t *err) {
    const model_t *m = c->m;
    const model_hparams_t *hp = &m->hp;
    const int64_t D = hp->n_embd;
    const float eps = hp->rms_eps;
    const kern_rope_t rope = {hp->rope_freq_base, hp->rope_freq_scale, m->rope_factors, hp->rope_neox, (int)hp->n_rot};

    /* x (n, D) = token_embd[ids]; each query's sequence for attention */
    for (int64_t i = 0; i < n; i++) {
        c->ids[i] = t[i].token;
        c->aq[i] = (kern_attn_query_t){t[i].pos, kv_seq_blocks(c->kv, t[i].seq)};
    }
    TRY(embed(m, c->ids, n, c->x, err));

    /* xb (n, D) = rmsnorm(x) * attn_norm of layer 0 */
    TRY(step(c, STEP_NORM, t, n, NULL, 0, &rope, m->layers[0].attn_norm, err));

    for (int64_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &m->layers[l];

        /* ---- attention ---- */
        /* q (n, QD), k (n, KVD), v (n, KVD) = xb Wq^T, xb Wk^T, xb Wv^T: one dispatch */
        TRY(matmul3(c, &c->prof.qkv, c->xb, n, &L->wq, c->q, &L->wk, c->k, &L->wv, c->v, err));

        /* per token: qwen2 biases, qwen3 Q/K head norms, RoPE at its
         * position, K[l] and V[l] of its sequence at its position = k, v */
        TRY(step(c, STEP_QKV, t, n, L, l, &rope, NULL, err));

        /* att (n, QD) = softmax(q K[l]^T / sqrt(HD)) V[l], causal, each over its sequence */
        TRY(attention(c, l, n, c->q, c->att, err));

        /* xb2 (n, D) = att Wo^T; x += xb2; xb = rmsnorm(x) * ffn_norm */
        TRY(matmul1(c, &c->prof.wo, c->att, n, &L->wo, c->xb2, err));
        TRY(step(c, STEP_RESID_NORM, t, n, L, l, &rope, L->ffn_norm, err));

        /* ---- feed-forward (SwiGLU) ---- */
        /* hb (n, F) = xb Wgate^T, hb2 (n, F) = xb Wup^T: one dispatch */
        TRY(matmul2(c, &c->prof.ffn_up, c->xb, n, &L->w_gate, c->hb, &L->w_up, c->hb2, err));

        /* hb (n, F) = silu(hb) * hb2 */
        TRY(step(c, STEP_SILU, t, n, L, l, &rope, NULL, err));

        /* xb2 (n, D) = hb Wdown^T; x += xb2; xb = rmsnorm(x) * the next layer's attn_norm */
        TRY(matmul1(c, &c->prof.ffn_down, c->hb, n, &L->w_down, c->xb2, err));
        TRY(step(c, STEP_RESID_NORM, t, n, L, l, &rope, l + 1 < hp->n_layer ? m->layers[l + 1].attn_norm : NULL,
                 err));
    }

    /* ---- output ---- */
    if (n_out > 0) {
        /* xb (n_out, D) = rmsnorm(x) * out_norm of the rows that want logits;
         * out (n_out, V) = xb Wout^T */
        int64_t j = 0;
        for (int64_t i = 0; i < n; i++)
            if (t[i].logits) rmsnorm_rows(c->xb + j++ * D, c->x + i * D, m->out_norm, 1, D, eps);
        TERN_CHECK(j == n_out);
        TRY(matmul1(c, &c->prof.output, c->xb, n_out, &m->output, out, err));
    }
    c->prof.n_tokens += (uint64_t)n;
    return 0;
}

/* Sort order of a batch: sequence, then position. */
static int tok_cmp(const void *pa, const void *pb) {
    const model_tok_t *a = pa, *b = pb;
    if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* Grow a buffer to hold n elements of size sz. */
static int grow(void **p, int64_t *cap, int64_t n, size_t sz) {
    if (n <= *cap) return 0;
    int64_t nc = *cap ? *cap : 16;
    while (nc < n) nc *= 2;
    if ((uint64_t)nc > SIZE_MAX / sz) return -1;
    void *q = realloc(*p, (size_t)nc * sz);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* model_decode, the logits into ext (n_out x V, in the sorted order) when
 * it is not NULL instead of the context's buffer. */
static int decode(model_ctx_t *c, const model_tok_t *toks, int64_t n, float *ext, tern_error_t *err) {
    if (!c || (!toks && n > 0) || n < 0) return tern_err(err, TERN_EINVAL, "model_decode: bad arguments");
    c->n_out = 0;
    if (n == 0) return 0;
    const int64_t V = c->m->hp.n_vocab;
    const int n_seq = kv_cache_n_seq(c->kv);
    if (grow((void **)&c->bt, &c->bt_cap, n, sizeof *c->bt) ||
        grow((void **)&c->slot, &c->slot_cap, n, sizeof *c->slot) ||
        grow((void **)&c->seq_n, &c->seq_n_cap, n_seq, sizeof *c->seq_n))
        return tern_err(err, TERN_ENOMEM, "model: out of memory for a batch of %lld tokens", (long long)n);
    memset(c->seq_n, 0, (size_t)n_seq * sizeof *c->seq_n);

    /* Check every entry and resolve appends (in entry order per sequence). */
    int64_t n_out = 0;
    for (int64_t i = 0; i < n; i++) {
        model_tok_t e = toks[i];
        if (e.seq < 0 || e.seq >= n_seq)
            return tern_err(err, TERN_EINVAL, "model: entry %lld: sequence %d is not in 0..%d", (long long)i, e.seq,
                            n_seq - 1);
        if (e.token < 0 || e.token >= V)
            return tern_err(err, TERN_EINVAL, "model: token id %d at index %lld is out of range [0, %lld)", e.token,
                            (long long)i, (long long)V);
        const int64_t held = kv_seq_n_pos(c->kv, e.seq);
        if (e.pos == MODEL_POS_APPEND) e.pos = held + c->seq_n[e.seq];
        if (e.pos < held)
            return tern_err(err, TERN_EINVAL,
                            "model: entry %lld: position %lld of sequence %d is already evaluated (it holds %lld; "
                            "truncate it first)",
                            (long long)i, (long long)e.pos, e.seq, (long long)held);
        c->seq_n[e.seq]++;
        n_out += e.logits;
        c->bt[i] = e;
    }
    /* Sort by (sequence, position), each token with its entry index (ties
     * are duplicate positions: an error below, so stability does not matter). */
    {
        typedef struct {
            model_tok_t t; /* first: tok_cmp reads it */
            int64_t idx;
        } ent_t;
        ent_t *tmp = malloc((size_t)n * sizeof *tmp);
        if (!tmp) return tern_err(err, TERN_ENOMEM, "model: out of memory for a batch of %lld tokens", (long long)n);
        for (int64_t i = 0; i < n; i++) tmp[i] = (ent_t){c->bt[i], i};
        qsort(tmp, (size_t)n, sizeof *tmp, tok_cmp);
        int64_t slot = 0;
        for (int64_t i = 0; i < n; i++) {
            c->bt[i] = tmp[i].t;
            c->slot[tmp[i].idx] = c->bt[i].logits ? slot++ : -1;
        }
        free(tmp);
    }
    /* Each sequence's positions must be exactly the next ones: held, held+1 ... */
    for (int64_t i = 0; i < n; i++) {
        const model_tok_t *e = &c->bt[i];
        const int64_t want = i > 0 && c->bt[i - 1].seq == e->seq ? c->bt[i - 1].pos + 1 : kv_seq_n_pos(c->kv, e->seq);
        if (e->pos != want)
            return tern_err(err, TERN_EINVAL,
                            "model: sequence %d: the batch gives position %lld where %lld comes next (positions must "
                            "follow on without gaps or repeats)",
                            e->seq, (long long)e->pos, (long long)want);
    }
    if (!ext && grow((void **)&c->out, &c->out_cap, n_out * V, sizeof *c->out))
        return tern_err(err, TERN_ENOMEM, "model: out of memory for the logits of %lld tokens", (long long)n_out);
    float *const out = ext ? ext : c->out;

    /* Reserve every sequence's blocks, all or nothing (one sequence at a
     * time would leave an earlier one's copy-on-write block behind when a
     * later one fails). */
    int rc = kv_reserve_all(c->kv, c->seq_n, err);
    if (rc) return rc;

    /* Blocks of n_batch tokens; each block's positions count before the next. */
    prof_start(c);
    int64_t o = 0;
    for (int64_t off = 0; off < n && rc == 0; off += c->n_batch) {
        const int64_t nb = n - off < c->n_batch ? n - off : c->n_batch;
        const model_tok_t *t = c->bt + off;
        int64_t bo = 0;
        for (int64_t i = 0; i < nb; i++) bo += t[i].logits;
        rc = forward_block(c, t, nb, bo, out + o * V, err);
        if (rc) break;
        for (int64_t i = 0; i < nb;) {
            int64_t r = 1;
            while (i + r < nb && t[i + r].seq == t[i].seq) r++;
            int32_t ids[64];
            for (int64_t k = 0; k < r; k += 64) {
                const int64_t m = r - k < 64 ? r - k : 64;
                for (int64_t q = 0; q < m; q++) ids[q] = t[i + k + q].token;
                kv_seq_put_ids(c->kv, t[i].seq, t[i].pos + k, m, ids);
            }
            TERN_CHECK(kv_seq_commit(c->kv, t[i].seq, r, NULL) == 0);
            i += r;
        }
        o += bo;
    }
    if (rc) {
        /* Give back what was reserved and not committed. */
        for (int64_t i = 0; i < n; i++)
            if (i == 0 || c->bt[i].seq != c->bt[i - 1].seq)
                (void)kv_seq_truncate(c->kv, c->bt[i].seq, kv_seq_n_pos(c->kv, c->bt[i].seq), NULL);
        return rc;
    }
    c->n_out = ext ? 0 : n_out;
    c->n_entries = n;
    return 0;
}

int model_decode(model_ctx_t *c, const model_tok_t *toks, int64_t n, tern_error_t *err) {
    return decode(c, toks, n, NULL, err);
}

const float *model_ctx_out(const model_ctx_t *c, int64_t i) {
    if (i < 0 || i >= c->n_entries || c->n_out == 0 || c->slot[i] < 0) return NULL;
    return c->out + c->slot[i] * c->m->hp.n_vocab;
}

int model_eval(model_ctx_t *c, const int32_t *ids, int64_t n, float *logits_all, tern_error_t *err) {
    if (!c || (!ids && n > 0) || n < 0) return tern_err(err, TERN_EINVAL, "model_eval: bad arguments");
    if (n == 0) return 0;
    const int64_t V = c->m->hp.n_vocab;
    model_tok_t *t = malloc((size_t)n * sizeof *t);
    if (!t) return tern_err(err, TERN_ENOMEM, "model: out of memory for %lld tokens", (long long)n);
    for (int64_t i = 0; i < n; i++)
        t[i] = (model_tok_t){0, ids[i], MODEL_POS_APPEND, logits_all != NULL || i == n - 1};
    /* One sequence appended in order: the sorted order is the entries'
     * order, so every position's logits go straight into logits_all. */
    int rc = decode(c, t, n, logits_all, err);
    free(t);
    if (rc) return rc;
    memcpy(c->logits, logits_all ? logits_all + (n - 1) * V : c->out + (c->n_out - 1) * V, (size_t)V * sizeof(float));
    return 0;
}
