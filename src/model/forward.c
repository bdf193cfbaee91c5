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
#include "model/expert_cache.h"
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
    int64_t ldy[4];
    TERN_CHECK(nm >= 1 && nm <= 4);
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
    STEP_SILU,       /* hb = silu(hb) * hb2 (width n_ff, or n_ff_shexp for the shared expert) */
    STEP_MOE_SILU,   /* rows of (token, expert) pairs: mg = silu(mg) * mu */
    STEP_MOE_MIX     /* xb2 = the token's experts' outputs weighted, best first (+ the shared expert) */
} step_t;

typedef struct {
    model_ctx_t *c;
    const model_tok_t *t;
    const model_layer_t *L;
    const kern_rope_t *rope;
    const float *w;
    int64_t l;
    step_t step;
    int64_t width; /* STEP_SILU, STEP_MOE_SILU: the row width */
} step_job_t;

/* Token i's feed-forward output of an MoE layer: xb2 = sum over its K
 * experts, best first, of weight * output (each product rounded, then
 * added in that order), then + sigmoid gate * the shared expert's output
 * (qwen2moe). The same operations whether the experts ran as matvecs or
 * in GEMMs of many tokens (whose columns have the matvec's bits). */
static void moe_mix_row(model_ctx_t *c, int64_t i) {
    const model_hparams_t *hp = &c->m->hp;
    const int64_t D = hp->n_embd, K = hp->n_expert_used;
    float *out = c->xb2 + i * D;
    for (int64_t r = 0; r < K; r++) {
        const float w = c->mwt[i * K + r];
        const float *y = c->my + c->mrow[i * K + r] * D;
        if (r == 0)
            for (int64_t d = 0; d < D; d++) out[d] = w * y[d];
        else
            for (int64_t d = 0; d < D; d++) out[d] += w * y[d];
    }
    if (hp->n_ff_shexp > 0) {
        const float g = c->msh[i];
        const float *y = c->mshy + i * D;
        for (int64_t d = 0; d < D; d++) out[d] += g * y[d];
    }
}

static int step_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const step_job_t *j = ctx;
    model_ctx_t *c = j->c;
    const model_hparams_t *hp = &c->m->hp;
    const int64_t D = hp->n_embd, HD = hp->head_dim, NH = hp->n_head, NKV = hp->n_head_kv;
    const int64_t QD = NH * HD, KVD = NKV * HD;
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
            /* qwen3: every head of q (NH, HD) and k (NKV, HD) = rmsnorm(head) * q_norm, k_norm;
             * olmoe: q (QD) and k (KVD) normed whole */
            if (L->q_norm && hp->qk_norm_full) {
                kern_rmsnorm(q, q, L->q_norm, QD, eps);
                kern_rmsnorm(k, k, L->k_norm, KVD, eps);
            } else if (L->q_norm) {
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
        case STEP_SILU: kern_silu_mul(c->hb + i * j->width, c->hb2 + i * j->width, j->width); break;
        case STEP_MOE_SILU: {
            const int64_t q = c->mrow0 + i;
            kern_silu_mul(c->mg + q * j->width, c->mu + q * j->width, j->width);
            break;
        }
        case STEP_MOE_MIX: moe_mix_row(c, i); break;
        }
    }
    return 0;
}

/* One step over the n rows: on the caller for one row, else one dispatch. */
static int step(model_ctx_t *c, step_t st, const model_tok_t *t, int64_t n, const model_layer_t *L, int64_t l,
                const kern_rope_t *rope, const float *w, tern_error_t *err) {
    const model_hparams_t *hp = &c->m->hp;
    step_job_t j = {c, t, L, rope, w, l, st, hp->n_ff};
    if (st == STEP_MOE_SILU) j.width = hp->n_ff_exp;
    if (st == STEP_SILU && L && L->experts) j.width = hp->n_ff_shexp;
    if (n == 1) return step_rows(&j, 0, 1, 0);
    /* cost of a row in the pool's unit, bytes of streamed work (its gate
     * needs a magnitude): the bytes a norm or an add touches; an expf
     * (SiLU) or a sin/cos pair (RoPE) counted like 64 and 512 bytes, about
     * what a matvec streams in the same time */
    int64_t cost = 20 * hp->n_embd;
    if (st == STEP_SILU || st == STEP_MOE_SILU) cost = 64 * j.width;
    if (st == STEP_MOE_MIX) cost = 20 * hp->n_embd * (hp->n_expert_used + 1);
    if (st == STEP_QKV)
        cost = 512 * (hp->n_head + hp->n_head_kv) * (hp->n_rot / 2) + 16 * (hp->n_head + 2 * hp->n_head_kv) * hp->head_dim;
    tern_range_t r = {step_rows, &j, n, 1, cost};
    return tern_pool_run(c->pool, &r, 1, err);
}

/* ---- Mixture of Experts ---------------------------------------------------------- */

/* One token's routing from its router logits (E): softmax over all experts
 * (max subtracted, sums in expert order), the K most probable (ties: the
 * lower index first), best first, weighted by their probabilities; with
 * norm those weights are divided by their sum (in that order; the sum
 * clamped below at 2^-14, as llama.cpp does). p: E floats of scratch. */
static void moe_route(const float *logit, int64_t E, int64_t K, bool norm, float *p, int32_t *sel, float *wt) {
    float mx = logit[0];
    for (int64_t e = 1; e < E; e++)
        if (logit[e] > mx) mx = logit[e];
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(logit[e] - mx);
        sum += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] /= sum;
    for (int64_t r = 0; r < K; r++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t q = 0; q < r && !taken; q++) taken = sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[r] = (int32_t)best;
        wt[r] = p[best];
    }
    if (norm) {
        float s = 0.0f;
        for (int64_t r = 0; r < K; r++) s += wt[r];
        if (s < 6.103515625e-5f) s = 6.103515625e-5f;
        for (int64_t r = 0; r < K; r++) wt[r] /= s;
    }
}

/* Run the products pr[0..*np-1] as one dispatch, timed into *prof. */
static int moe_flush(model_ctx_t *c, uint64_t *prof, kern_prod_t *pr, int *np, tern_error_t *err) {
    if (*np == 0) return 0;
    prof_lap(c, &c->prof.small);
    const int rc = kern_matmul_batch(c->pool, *np, pr, err);
    prof_lap(c, prof);
    *np = 0;
    return rc;
}

/* The experts chosen in this block, in increasing order, into c->mact
 * (their matrices: the model's, or NULL until a cache slot holds them);
 * returns how many. Counts their uses for pinning. */
static int moe_active(model_ctx_t *c, const model_layer_t *L, int64_t l) {
    const int64_t E = c->m->hp.n_expert;
    const int64_t *cnt = c->mcnt;
    int na = 0;
    for (int64_t e = 0; e < E; e++) {
        if (!cnt[e]) continue;
        c->mact[na] = (int32_t)e;
        c->mexp[na] = c->m->ec ? NULL : &L->experts[e];
        if (c->m->ec) ec_count(c->m->ec, l, e, (uint32_t)cnt[e]);
        na++;
    }
    return na;
}

/* Gate, up, SiLU and down of the active experts i0 .. i1-1 (c->mact,
 * c->mexp) over their tokens' rows: KERN_MAX_MULTI / 2 experts per gate/up
 * dispatch, KERN_MAX_MULTI per down dispatch. One token reads xb itself
 * (its activations are then quantized once for all its experts). */
static int moe_run(model_ctx_t *c, const model_tok_t *t, int64_t n, const model_layer_t *L, int64_t l,
                   const kern_rope_t *rope, int i0, int i1, tern_error_t *err) {
    const model_hparams_t *hp = &c->m->hp;
    const int64_t D = hp->n_embd, FE = hp->n_ff_exp;
    const int64_t *cnt = c->mcnt, *first = c->mcnt + hp->n_expert;
    kern_prod_t pr[KERN_MAX_MULTI];
    int np = 0;
    for (int i = i0; i < i1; i++) {
        const int64_t e = c->mact[i];
        const float *x = n == 1 ? c->xb : c->mx + first[e] * D;
        pr[np++] = (kern_prod_t){&c->mexp[i]->gate, x, cnt[e], D, c->mg + first[e] * FE, FE};
        pr[np++] = (kern_prod_t){&c->mexp[i]->up, x, cnt[e], D, c->mu + first[e] * FE, FE};
        if (np + 2 > KERN_MAX_MULTI) TRY(moe_flush(c, &c->prof.ffn_up, pr, &np, err));
    }
    TRY(moe_flush(c, &c->prof.ffn_up, pr, &np, err));
    /* mg = silu(mg) * mu on the rows of these experts (consecutive: the
     * experts are in increasing order) */
    const int64_t r0 = first[c->mact[i0]], r1 = first[c->mact[i1 - 1]] + cnt[c->mact[i1 - 1]];
    c->mrow0 = r0;
    TRY(step(c, STEP_MOE_SILU, t, r1 - r0, L, l, rope, NULL, err));
    for (int i = i0; i < i1; i++) {
        const int64_t e = c->mact[i];
        pr[np++] = (kern_prod_t){&c->mexp[i]->down, c->mg + first[e] * FE, cnt[e], FE, c->my + first[e] * D, D};
        if (np == KERN_MAX_MULTI) TRY(moe_flush(c, &c->prof.ffn_down, pr, &np, err));
    }
    return moe_flush(c, &c->prof.ffn_down, pr, &np, err);
}

/* Next-layer prefetch: layer l + 1's router applied to this layer's FFN
 * input xb (n, D) (the residual stream changes little from one layer to the
 * next; computed in this layer's router dispatch, c->mlog2) names the
 * experts it will likely want; their loads are queued
 * behind the demand loads (ec_hint), and the prediction is kept to score
 * it when layer l + 1 routes (c->mpred). */
static int moe_prefetch(model_ctx_t *c, int64_t n, int64_t l, tern_error_t *err) {
    (void)err;
    const model_t *m = c->m;
    const int64_t E = m->hp.n_expert, K = m->hp.n_expert_used;
    if (!c->mnext) return 0; /* no next MoE layer: its logits were not computed with this layer's */
    memset(c->mpred, 0, (size_t)E);
    int32_t sel[64];
    float wt[64];
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = K < 64 ? K : 64;
        moe_route(c->mlog2 + i * E, E, k, false, c->mprob, sel, wt);
        for (int64_t r = 0; r < k; r++) c->mpred[sel[r]] = 1;
    }
    for (int64_t e = 0; e < E; e++)
        if (c->mpred[e]) ec_hint(m->ec, l + 1, e);
    c->mpred_layer = l + 1;
    return 0;
}

/* The active experts through the cache: pin as many as slots allow; run
 * those already in (consecutive runs of them, in order) while the others
 * load; wait only when none is ready, and then for the first one pending;
 * unpin what ran. The products do not depend on the order: same bits as
 * the resident run. */
static int moe_cached(model_ctx_t *c, const model_tok_t *t, int64_t n, const model_layer_t *L, int64_t l,
                      const kern_rope_t *rope, int na, tern_error_t *err) {
    expert_cache_t *ec = c->m->ec;
    int *slot = c->mslot;
    uint8_t *st = c->mst; /* 0 not pinned, 1 pending, 2 ready, 3 done */
    memset(st, 0, (size_t)na);
    int done = 0, rc = 0;
    bool hinted = false;
    /* score the previous layer's prediction of these experts */
    if (c->mpred_layer == l) {
        uint64_t hits = 0;
        for (int i = 0; i < na; i++) hits += c->mpred[c->mact[i]];
        ec_pred(ec, hits, (uint64_t)na);
        c->mpred_layer = -1;
    }
    while (done < na && rc == 0) {
        for (int i = 0; i < na; i++) {
            if (st[i]) continue;
            const ec_status_t s = ec_get(ec, l, c->mact[i], &slot[i]);
            if (s == EC_NOSLOT) break;
            st[i] = s == EC_READY ? 2 : 1;
        }
        if (!hinted && c->m->moe_prefetch) {
            hinted = true;
            if ((rc = moe_prefetch(c, n, l, err))) break;
        }
        int ready = 0;
        for (int i = 0; i < na; i++) {
            if (st[i] == 1 && ec_ready(ec, slot[i])) st[i] = 2;
            ready += st[i] == 2;
        }
        if (ready == 0) {
            int i = 0;
            while (i < na && st[i] != 1) i++;
            if (i == na) { /* nothing pinned: other users of the cache hold every slot */
                ec_wait_slot(ec, l);
                continue;
            }
            if ((rc = ec_wait(ec, slot[i], err))) break;
            st[i] = 2;
        }
        /* runs of consecutive ready experts (their rows are consecutive) */
        for (int i = 0; i < na && rc == 0;) {
            if (st[i] != 2) {
                i++;
                continue;
            }
            int j = i;
            while (j < na && st[j] == 2) {
                c->mexp[j] = ec_expert(ec, slot[j]);
                j++;
            }
            rc = moe_run(c, t, n, L, l, rope, i, j, err);
            for (int q = i; q < j; q++) {
                ec_put(ec, slot[q]);
                st[q] = 3;
                done++;
            }
            i = j;
        }
    }
    for (int i = 0; i < na; i++)
        if (st[i] == 1 || st[i] == 2) ec_put(ec, slot[i]);
    return rc;
}

/* xb2 (n, D) = the MoE feed-forward of xb (n, D) in layer L:
 *   router logits (n, E) = xb Wrouter^T (qwen2moe: with the shared
 *   expert's gate and up, one dispatch); each token's K experts and weights
 *   (moe_route); the (token, expert) pairs grouped by expert; every chosen
 *   expert's gate and up over its tokens (GEMM, or matvec for one token),
 *   KERN_MAX_MULTI / 2 experts per dispatch (decode: all K in one); SiLU;
 *   their downs, KERN_MAX_MULTI per dispatch; the weighted sum per token in
 *   a fixed order (moe_mix_row). Each pair's output has the bits of a
 *   matvec of its token, so a token's result does not depend on the other
 *   tokens of the block. */
static int moe_ffn(model_ctx_t *c, const model_tok_t *t, int64_t n, const model_layer_t *L, int64_t l,
                   const kern_rope_t *rope, tern_error_t *err) {
    const model_hparams_t *hp = &c->m->hp;
    const int64_t D = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used, FS = hp->n_ff_shexp;
    /* router logits; qwen2moe: the shared expert's gate and up; with
     * prefetch: the next layer's router on the same input (moe_prefetch) */
    {
        const kern_mat_t *ws[4] = {&L->router};
        float *ys[4] = {c->mlog};
        int nm = 1;
        if (FS > 0) {
            ws[nm] = &L->sh_gate, ys[nm++] = c->hb;
            ws[nm] = &L->sh_up, ys[nm++] = c->hb2;
        }
        const model_t *m = c->m;
        c->mnext = m->ec && m->moe_prefetch && l + 1 < hp->n_layer && m->layers[l + 1].experts;
        if (c->mnext) ws[nm] = &m->layers[l + 1].router, ys[nm++] = c->mlog2;
        TRY(matmul(c, &c->prof.ffn_up, c->xb, n, nm, ws, ys, err));
    }

    int64_t *cnt = c->mcnt, *first = c->mcnt + E, *fill = c->mcnt + 2 * E;
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    for (int64_t i = 0; i < n; i++) {
        moe_route(c->mlog + i * E, E, K, hp->moe_norm_w, c->mprob, c->msel + i * K, c->mwt + i * K);
        for (int64_t r = 0; r < K; r++) cnt[c->msel[i * K + r]]++;
        if (FS > 0) {
            /* the shared expert's gate: sigmoid(xb . sh_gate_inp), summed in order */
            const float *x = c->xb + i * D;
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += x[d] * L->sh_gate_inp[d];
            c->msh[i] = 1.0f / (1.0f + expf(-s));
        }
    }
    int64_t row = 0;
    for (int64_t e = 0; e < E; e++) {
        first[e] = row;
        fill[e] = 0;
        row += cnt[e];
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < K; r++) {
            const int64_t e = c->msel[i * K + r], q = first[e] + fill[e]++;
            c->mrow[i * K + r] = q;
            if (n > 1) memcpy(c->mx + q * D, c->xb + i * D, (size_t)D * sizeof(float));
        }

    /* experts, resident or through the cache */
    const int na = moe_active(c, L, l);
    if (c->m->ec) {
        TRY(moe_cached(c, t, n, L, l, rope, na, err));
    } else {
        TRY(moe_run(c, t, n, L, l, rope, 0, na, err));
    }
    if (FS > 0) {
        /* the shared expert: hb = silu(hb) * hb2; mshy (n, D) = hb Wdown^T */
        TRY(step(c, STEP_SILU, t, n, L, l, rope, NULL, err));
        TRY(matmul1(c, &c->prof.ffn_down, c->hb, n, &L->sh_down, c->mshy, err));
    }

    /* xb2 = the weighted sum per token */
    return step(c, STEP_MOE_MIX, t, n, L, l, rope, NULL, err);
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

        /* ---- feed-forward (SwiGLU, or a Mixture of Experts of them) ---- */
        if (L->experts) {
            /* xb2 (n, D) = the weighted outputs of each token's experts */
            TRY(moe_ffn(c, t, n, L, l, &rope, err));
        } else {
            /* hb (n, F) = xb Wgate^T, hb2 (n, F) = xb Wup^T: one dispatch */
            TRY(matmul2(c, &c->prof.ffn_up, c->xb, n, &L->w_gate, c->hb, &L->w_up, c->hb2, err));

            /* hb (n, F) = silu(hb) * hb2 */
            TRY(step(c, STEP_SILU, t, n, L, l, &rope, NULL, err));

            /* xb2 (n, D) = hb Wdown^T */
            TRY(matmul1(c, &c->prof.ffn_down, c->hb, n, &L->w_down, c->xb2, err));
        }
        /* x += xb2; xb = rmsnorm(x) * the next layer's attn_norm */
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
