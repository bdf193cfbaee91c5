/*
 * context.c - model contexts (see model.h): the KV memory of its sequences,
 * the activations of a block, the logits, and its worker pool; the
 * sequence-0 state operations (truncate, prefix copy, save and restore) on
 * top of kv_cache.c.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "format/quant.h"
#include "model/expert_cache.h"
#include "model/model_ctx.h"

model_ctx_params_t model_ctx_default_params(void) {
    model_ctx_params_t p = {0};
    p.n_batch = 512;
    return p;
}

/* Memory the system could give us now (Linux: MemAvailable), 0 if unknown. */
uint64_t model_mem_available(void) {
    FILE *fp = fopen("/proc/meminfo", "r");
    uint64_t kb = 0;
    if (fp) {
        char line[256];
        while (fgets(line, sizeof line, fp))
            if (sscanf(line, "MemAvailable: %llu kB", (unsigned long long *)&kb) == 1) break;
        fclose(fp);
    }
    if (kb) return kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

/* Pool scratch per worker: the kernels keep their own per-thread workspaces
 * and attention needs none (kernels.h), so the context asks for a token
 * amount; a borrowed pool only has to provide this much. */
static size_t ctx_scratch_bytes(void) { return 64; }

static void ctx_free_buffers(model_ctx_t *c) {
    kv_cache_free(c->kv);
    tern_free(c->x);
    tern_free(c->xb);
    tern_free(c->xb2);
    tern_free(c->q);
    tern_free(c->k);
    tern_free(c->v);
    tern_free(c->att);
    tern_free(c->hb);
    tern_free(c->hb2);
    tern_free(c->logits);
    tern_free(c->mlog);
    free(c->msel);
    tern_free(c->mwt);
    free(c->mrow);
    tern_free(c->mx);
    tern_free(c->mg);
    tern_free(c->mu);
    tern_free(c->my);
    tern_free(c->msh);
    tern_free(c->mshy);
    free(c->mcnt);
    free(c->mact);
    free(c->mexp);
    free(c->mslot);
    free(c->mst);
    tern_free(c->mlog2);
    free(c->mpred);
    tern_free(c->mprob);
    free(c->ids);
    free(c->aq);
    free(c->bt);
    free(c->slot);
    free(c->seq_n);
    free(c->out);
}

static float *alloc_f(int64_t a, int64_t b) {
    uint64_t n;
    if (tern_mul_overflow_u64((uint64_t)a, (uint64_t)b, &n) || n > SIZE_MAX / sizeof(float)) return NULL;
    return tern_alloc((size_t)n * sizeof(float));
}

model_ctx_t *model_ctx_new(const model_t *m, const model_ctx_params_t *p, char *note, size_t note_len,
                           tern_error_t *err) {
    if (note && note_len) note[0] = 0;
    if (!m) {
        tern_err(err, TERN_EINVAL, "model_ctx_new: NULL model");
        return NULL;
    }
    model_ctx_params_t dp = model_ctx_default_params();
    if (!p) p = &dp;
    const model_hparams_t *hp = &m->hp;
    model_ctx_t *c = calloc(1, sizeof *c);
    if (!c) {
        tern_err(err, TERN_ENOMEM, "model: out of memory");
        return NULL;
    }
    c->m = m;
    c->p = *p;
    const int kv_type = p->kv_f32 ? TYPE_F32 : TYPE_F16;
    const size_t kv_elt = p->kv_f32 ? 4 : 2;
    const int64_t KVD = hp->n_head_kv * hp->head_dim;
    /* Per position: K and V of every layer. */
    uint64_t per_pos = 2 * (uint64_t)hp->n_layer * (uint64_t)KVD * kv_elt;

    if (p->n_ctx > MODEL_MAX_CTX) {
        tern_err(err, TERN_EINVAL, "model: context %lld exceeds the limit %d", (long long)p->n_ctx, MODEL_MAX_CTX);
        goto fail;
    }
    c->n_ctx = p->n_ctx > 0 ? p->n_ctx : hp->n_ctx_train;
    if (p->n_ctx <= 0) {
        /* The model's context by default, but never more KV cache than half of
         * the memory left after the weights (pages are touched as used, so an
         * overestimate only costs address space; this keeps it honest). */
        uint64_t avail = model_mem_available();
        uint64_t fsize = gguf_file_size(m->file);
        if (m->ec) { /* streamed experts: what stays in memory is the rest plus the cache */
            ec_stats_t es;
            ec_stats(m->ec, &es);
            fsize = fsize - m->expert_bytes + (uint64_t)es.n_slots * es.slot_bytes;
        }
        uint64_t budget = avail > fsize ? (avail - fsize) / 2 : 0;
        if (avail && (uint64_t)c->n_ctx * per_pos > budget) {
            int64_t fit = (int64_t)(budget / per_pos) / 256 * 256;
            if (fit < 256) fit = 256;
            if (fit < c->n_ctx) {
                if (note && note_len)
                    snprintf(note, note_len,
                             "context capped at %lld positions (model: %lld) to fit the KV cache (%.1f MiB) in half of "
                             "the available memory; use -c to choose",
                             (long long)fit, (long long)c->n_ctx, (double)fit * (double)per_pos / 1048576.0);
                c->n_ctx = fit;
            }
        }
    }
    c->n_batch = p->n_batch > 0 ? p->n_batch : 512;
    if (c->n_batch > c->n_ctx) c->n_batch = c->n_ctx;

    kv_layout_t lo;
    if (kv_layout_init(&lo, kv_type, hp->n_layer, c->n_ctx, hp->n_head_kv, hp->head_dim, p->kv_block, err)) goto fail;
    c->kv = kv_cache_new(&lo, p->n_seq > 0 ? p->n_seq : 1, err);
    if (!c->kv) goto fail;
    const int64_t B = c->n_batch, D = hp->n_embd, QD = hp->n_head * hp->head_dim;
    c->x = alloc_f(B, D);
    c->xb = alloc_f(B, D);
    c->xb2 = alloc_f(B, D);
    c->q = alloc_f(B, QD);
    c->k = alloc_f(B, KVD);
    c->v = alloc_f(B, KVD);
    c->att = alloc_f(B, QD);
    const int64_t F = hp->n_ff > hp->n_ff_shexp ? hp->n_ff : hp->n_ff_shexp;
    c->hb = alloc_f(B, F);
    c->hb2 = alloc_f(B, F);
    if (hp->n_expert > 0) {
        const int64_t K = hp->n_expert_used, BK = B * K; /* K <= E <= MAX_EXPERT: no overflow */
        c->mlog = alloc_f(B, hp->n_expert);
        c->msel = malloc((size_t)BK * sizeof *c->msel);
        c->mwt = alloc_f(B, K);
        c->mrow = malloc((size_t)BK * sizeof *c->mrow);
        c->mx = alloc_f(BK, D);
        c->mg = alloc_f(BK, hp->n_ff_exp);
        c->mu = alloc_f(BK, hp->n_ff_exp);
        c->my = alloc_f(BK, D);
        c->msh = alloc_f(B, 1);
        c->mshy = alloc_f(B, D);
        c->mcnt = malloc((size_t)(3 * hp->n_expert) * sizeof *c->mcnt);
        c->mprob = alloc_f(1, hp->n_expert);
        c->mact = malloc((size_t)hp->n_expert * sizeof *c->mact);
        c->mexp = malloc((size_t)hp->n_expert * sizeof *c->mexp);
        c->mslot = malloc((size_t)hp->n_expert * sizeof *c->mslot);
        c->mst = malloc((size_t)hp->n_expert);
        c->mlog2 = alloc_f(B, hp->n_expert);
        c->mpred = calloc((size_t)hp->n_expert, 1);
        c->mpred_layer = -1;
        if (!c->mlog2 || !c->mpred || !c->mact || !c->mexp || !c->mslot || !c->mst || !c->mcnt || !c->mprob || !c->mlog || !c->msel || !c->mwt || !c->mrow || !c->mx || !c->mg || !c->mu || !c->my || !c->msh ||
            !c->mshy) {
            tern_err(err, TERN_ENOMEM, "model: out of memory for the expert buffers of a block of %lld positions",
                     (long long)c->n_batch);
            goto fail;
        }
    }
    c->logits = alloc_f(1, hp->n_vocab);
    c->ids = malloc((size_t)B * sizeof *c->ids);
    c->aq = malloc((size_t)B * sizeof *c->aq);
    if (!c->x || !c->xb || !c->xb2 || !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2 || !c->logits ||
        !c->ids || !c->aq) {
        tern_err(err, TERN_ENOMEM, "model: out of memory for the activations of a block of %lld positions",
                 (long long)c->n_batch);
        goto fail;
    }
    memset(c->logits, 0, (size_t)hp->n_vocab * sizeof(float));
    c->scratch_bytes = ctx_scratch_bytes();
    if (p->pool) {
        if (tern_pool_scratch_size(p->pool) < c->scratch_bytes) {
            tern_err(err, TERN_EINVAL, "model: the given pool has %zu bytes of scratch per worker, the context needs %zu",
                     tern_pool_scratch_size(p->pool), c->scratch_bytes);
            goto fail;
        }
        c->pool = p->pool;
    } else {
        c->pool = tern_pool_create(p->n_threads, c->scratch_bytes, err);
        if (!c->pool) goto fail;
        c->own_pool = true;
    }
    return c;
fail:
    model_ctx_free(c);
    return NULL;
}

void model_ctx_free(model_ctx_t *c) {
    if (!c) return;
    if (c->own_pool) tern_pool_free(c->pool);
    ctx_free_buffers(c);
    free(c);
}

int64_t model_ctx_n_ctx(const model_ctx_t *c) { return c->n_ctx; }
int64_t model_ctx_pos(const model_ctx_t *c) { return kv_seq_n_pos(c->kv, 0); }
int64_t model_ctx_n_batch(const model_ctx_t *c) { return c->n_batch; }
int model_ctx_threads(const model_ctx_t *c) { return tern_pool_threads(c->pool); }
tern_pool_t *model_ctx_pool(model_ctx_t *c) { return c->pool; }
const float *model_ctx_logits(const model_ctx_t *c) { return c->logits; }
void model_ctx_set_logits(model_ctx_t *c, const float *logits) {
    if (logits != c->logits) memcpy(c->logits, logits, (size_t)c->m->hp.n_vocab * sizeof *c->logits);
}
const model_prof_t *model_ctx_prof(const model_ctx_t *c) { return &c->prof; }
void model_ctx_prof_reset(model_ctx_t *c) { memset(&c->prof, 0, sizeof c->prof); }

kv_cache_t *model_ctx_kv(model_ctx_t *c) { return c->kv; }
const kv_cache_t *model_ctx_kv_const(const model_ctx_t *c) { return c->kv; }

/* ---- KV state --------------------------------------------------------------- */

int model_ctx_truncate(model_ctx_t *c, int64_t pos, tern_error_t *err) {
    if (pos < 0 || pos > model_ctx_pos(c))
        return tern_err(err, TERN_EINVAL, "model: cannot truncate to position %lld (context holds %lld)", (long long)pos,
                        (long long)model_ctx_pos(c));
    return kv_seq_truncate(c->kv, 0, pos, err);
}

int model_ctx_copy_prefix(model_ctx_t *dst, const model_ctx_t *src, int64_t n, tern_error_t *err) {
    if (!dst || !src) return tern_err(err, TERN_EINVAL, "model_ctx_copy_prefix: NULL context");
    if (dst->m != src->m)
        return tern_err(err, TERN_EINVAL, "model: cannot copy positions between contexts of different models");
    if (dst == src) return kv_seq_truncate(dst->kv, 0, n, err);
    return kv_seq_copy(dst->kv, 0, src->kv, 0, n, err);
}

int model_ctx_kv_save(const model_ctx_t *c, kv_write_fn write, void *user, tern_error_t *err) {
    if (!c) return tern_err(err, TERN_EINVAL, "model_ctx_kv_save: NULL context");
    return kv_seq_write(c->kv, 0, kv_seq_n_pos(c->kv, 0), write, user, err);
}

int model_ctx_kv_load(model_ctx_t *c, kv_read_fn read, void *user, tern_error_t *err) {
    if (!c) return tern_err(err, TERN_EINVAL, "model_ctx_kv_load: NULL context");
    return kv_seq_read(c->kv, 0, read, user, err);
}

int model_ctx_set_threads(model_ctx_t *c, int n_threads, tern_error_t *err) {
    if (!c->own_pool) return tern_err(err, TERN_EINVAL, "model: the context's pool is borrowed");
    tern_pool_t *np = tern_pool_create(n_threads, c->scratch_bytes, err);
    if (!np) return err ? err->code : TERN_ENOMEM;
    tern_pool_free(c->pool);
    c->pool = np;
    return 0;
}

