/*
 * forward.c - the forward pass (model_eval, see model.h): a block of n
 * positions through every layer, top to bottom as the paper draws it.
 *
 * Shapes in the comments: n positions of the block, row-major by position;
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
#include <string.h>

#include "core/common.h"
#include "format/quant.h"
#include "model/model_ctx.h"

/* Which logits a block computes. */
typedef enum {
    LOGITS_NONE, /* none: a prefill block before the last one */
    LOGITS_LAST, /* the last position's, into c->logits */
    LOGITS_ALL   /* every position's, into logits_all; the last also into c->logits */
} logits_mode_t;

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

/* att (n, QD) = softmax(q K^T / sqrt(HD)) V over layer l's cache, query i
 * seeing positions 0 .. pos0+i: one dispatch, heads partitioned, a GQA
 * group on one thread. */
static int attention(model_ctx_t *c, int64_t l, int64_t pos0, int64_t n, const float *q, float *att,
                     tern_error_t *err) {
    const model_hparams_t *hp = &c->m->hp;
    const kern_attn_t a = {(int)hp->n_head,
                           (int)hp->n_head_kv,
                           (int)hp->head_dim,
                           kv_cache_layout(c->kv)->type,
                           kv_cache_k(c->kv, l),
                           kv_cache_v(c->kv, l),
                           1.0f / sqrtf((float)hp->head_dim)};
    prof_lap(c, &c->prof.small);
    const int rc = kern_attention(c->pool, &a, pos0, n, q, att, err);
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

/* y (rows, width) += b, row by row. */
static void add_rows(float *y, const float *b, int64_t rows, int64_t width) {
    for (int64_t i = 0; i < rows; i++) kern_add(y + i * width, b, width);
}

/* x (n, n_heads, HD): RoPE of row i at position pos0 + i. */
static void rope_rows(const kern_rope_t *rope, float *x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t pos0) {
    for (int64_t i = 0; i < n; i++) kern_rope(rope, x + i * n_heads * head_dim, (int)n_heads, (int)head_dim, pos0 + i);
}

/* ---- the forward pass ---------------------------------------------------------- */

/* n tokens at positions pos0 .. pos0+n-1 (pos0 = the cache's position,
 * n <= n_batch): every layer, then the logits that want asks for. */
static int forward_block(model_ctx_t *c, const int32_t *ids, int64_t n, logits_mode_t want, float *logits_all,
                         tern_error_t *err) {
    const model_t *m = c->m;
    const model_hparams_t *hp = &m->hp;
    const int64_t D = hp->n_embd, HD = hp->head_dim, NH = hp->n_head, NKV = hp->n_head_kv;
    const int64_t QD = NH * HD, KVD = NKV * HD, F = hp->n_ff, V = hp->n_vocab;
    const int64_t pos0 = kv_cache_n_pos(c->kv);
    const float eps = hp->rms_eps;
    const kern_rope_t rope = {hp->rope_freq_base, hp->rope_freq_scale, m->rope_factors, hp->rope_neox, (int)hp->n_rot};

    /* x (n, D) = token_embd[ids] */
    TRY(embed(m, ids, n, c->x, err));

    for (int64_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &m->layers[l];

        /* ---- attention ---- */
        /* xb (n, D) = rmsnorm(x) * attn_norm */
        rmsnorm_rows(c->xb, c->x, L->attn_norm, n, D, eps);

        /* q (n, QD), k (n, KVD), v (n, KVD) = xb Wq^T, xb Wk^T, xb Wv^T: one dispatch */
        TRY(matmul3(c, &c->prof.qkv, c->xb, n, &L->wq, c->q, &L->wk, c->k, &L->wv, c->v, err));

        /* qwen2: q, k, v += bq, bk, bv */
        if (L->bq) {
            add_rows(c->q, L->bq, n, QD);
            add_rows(c->k, L->bk, n, KVD);
            add_rows(c->v, L->bv, n, KVD);
        }
        /* qwen3: every head of q (n, NH, HD) and k (n, NKV, HD) = rmsnorm(head) * q_norm, k_norm */
        if (L->q_norm) {
            rmsnorm_rows(c->q, c->q, L->q_norm, n * NH, HD, eps);
            rmsnorm_rows(c->k, c->k, L->k_norm, n * NKV, HD, eps);
        }

        /* q (n, NH, HD), k (n, NKV, HD) = RoPE(q), RoPE(k): row i at position pos0 + i */
        rope_rows(&rope, c->q, n, NH, HD, pos0);
        rope_rows(&rope, c->k, n, NKV, HD, pos0);

        /* K[l], V[l] at positions pos0 .. pos0+n-1 (n, NKV, HD) = k, v */
        kv_cache_store(c->kv, l, pos0, n, c->k, c->v);

        /* att (n, QD) = softmax(q K[l]^T / sqrt(HD)) V[l], causal */
        TRY(attention(c, l, pos0, n, c->q, c->att, err));

        /* x (n, D) += att Wo^T */
        TRY(matmul1(c, &c->prof.wo, c->att, n, &L->wo, c->xb2, err));
        kern_add(c->x, c->xb2, n * D);

        /* ---- feed-forward (SwiGLU) ---- */
        /* xb (n, D) = rmsnorm(x) * ffn_norm */
        rmsnorm_rows(c->xb, c->x, L->ffn_norm, n, D, eps);

        /* hb (n, F) = xb Wgate^T, hb2 (n, F) = xb Wup^T: one dispatch */
        TRY(matmul2(c, &c->prof.ffn_up, c->xb, n, &L->w_gate, c->hb, &L->w_up, c->hb2, err));

        /* hb (n, F) = silu(hb) * hb2 */
        kern_silu_mul(c->hb, c->hb2, n * F);

        /* x (n, D) += hb Wdown^T */
        TRY(matmul1(c, &c->prof.ffn_down, c->hb, n, &L->w_down, c->xb2, err));
        kern_add(c->x, c->xb2, n * D);
    }

    /* ---- output ---- */
    if (want == LOGITS_LAST) {
        /* logits (V) = rmsnorm(x[n-1]) * out_norm Wout^T */
        rmsnorm_rows(c->xb, c->x + (n - 1) * D, m->out_norm, 1, D, eps);
        TRY(matmul1(c, &c->prof.output, c->xb, 1, &m->output, c->logits, err));
    } else if (want == LOGITS_ALL) {
        /* logits_all (n, V) = rmsnorm(x) * out_norm Wout^T; logits (V) = its last row */
        rmsnorm_rows(c->xb, c->x, m->out_norm, n, D, eps);
        TRY(matmul1(c, &c->prof.output, c->xb, n, &m->output, logits_all, err));
        memcpy(c->logits, logits_all + (n - 1) * V, (size_t)V * sizeof(float));
    }

    /* The block's positions count in the cache from here. */
    TRY(kv_cache_commit(c->kv, n, err));
    c->prof.n_tokens += (uint64_t)n;
    return 0;
}

int model_eval(model_ctx_t *c, const int32_t *ids, int64_t n, float *logits_all, tern_error_t *err) {
    if (!c || (!ids && n > 0) || n < 0) return tern_err(err, TERN_EINVAL, "model_eval: bad arguments");
    if (n == 0) return 0;
    const int64_t V = c->m->hp.n_vocab, pos = model_ctx_pos(c);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return tern_err(err, TERN_EINVAL, "model: token id %d at index %lld is out of range [0, %lld)", ids[i],
                            (long long)i, (long long)V);
    if (n > c->n_ctx - pos)
        return tern_err(err, TERN_ECTXFULL, "model: context full: %lld positions + %lld new > context size %lld",
                        (long long)pos, (long long)n, (long long)c->n_ctx);
    prof_start(c);
    for (int64_t off = 0; off < n; off += c->n_batch) {
        const int64_t nb = n - off < c->n_batch ? n - off : c->n_batch;
        const logits_mode_t want = logits_all ? LOGITS_ALL : off + nb == n ? LOGITS_LAST : LOGITS_NONE;
        TRY(forward_block(c, ids + off, nb, want, logits_all ? logits_all + off * V : NULL, err));
    }
    return 0;
}
