/*
 * api.c - the public model API of tern.h over the model, tokenizer and
 * sampler layers: ownership and timings (the generation loop is in
 * generate.c, speculative decoding's drafter and controller in spec.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tern.h"
#include "api/api_internal.h"
#include "core/common.h"
#include "core/cpu.h"
#include "kernels/kernels.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "model/session.h"
#include "text/grammar.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

struct tern_session {
    const tern_model_t *model;
    session_t *s;
};

struct tern_grammar {
    grammar_t *g;
};

struct tern_matcher {
    gmatcher_t *m;
};

static pthread_mutex_t gv_mu = PTHREAD_MUTEX_INITIALIZER;

struct tern_detok {
    tok_stream_t s;
};

/* llama.cpp's llama_ftype values as written in general.file_type. */
static const char *ftype_name(uint64_t ft) {
    switch (ft) {
    case 0: return "F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K_S";
    case 12: return "Q3_K_M";
    case 13: return "Q3_K_L";
    case 14: return "Q4_K_S";
    case 15: return "Q4_K_M";
    case 16: return "Q5_K_S";
    case 17: return "Q5_K_M";
    case 18: return "Q6_K";
    case 32: return "BF16";
    }
    return NULL;
}

tern_model_params_t tern_model_default_params(void) {
    return (tern_model_params_t){.expert_cache_bytes = TERN_EXPERTS_AUTO, .expert_prefetch = -1, .expert_pin = -1};
}

/* The usage counts file of path: $XDG_CACHE_HOME/tern (or ~/.cache/tern)
 * /NAME-SIZE.usage, the directory created; false if there is no home. */
static bool usage_path(const char *path, uint64_t size, char *out, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[3072];
    if (xdg && xdg[0]) snprintf(dir, sizeof dir, "%s/tern", xdg);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%s/.cache/tern", home);
    else return false;
    char parent[3072];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) {
        *slash = 0;
        (void)mkdir(parent, 0755);
    }
    (void)mkdir(dir, 0755);
    const char *b = strrchr(path, '/');
    snprintf(out, cap, "%s/%s-%llu.usage", dir, b ? b + 1 : path, (unsigned long long)size);
    return true;
}

/* Attach the expert cache p asks for (or the default's) to a loaded MoE model. */
static int setup_experts(tern_model_t *tm, const char *path, const tern_model_params_t *p, tern_error_t *err) {
    model_t *m = tm->m;
    if (m->hp.n_expert <= 0 || p->expert_cache_bytes == TERN_EXPERTS_MMAP) return 0;
    const uint64_t fsize = gguf_file_size(m->file), dense = fsize - m->expert_bytes;
    uint64_t bytes;
    if (p->expert_cache_bytes == TERN_EXPERTS_AUTO) {
        const uint64_t avail = model_mem_available();
        const uint64_t margin = (uint64_t)1 << 30; /* KV cache, activations, the rest of the system */
        if (!avail || fsize + margin <= avail) return 0; /* it fits: the mapping serves */
        bytes = avail > dense + 2 * margin ? avail - dense - 2 * margin : 0;
    } else if (p->expert_cache_bytes > 0) {
        bytes = (uint64_t)p->expert_cache_bytes;
    } else {
        return tern_err(err, TERN_EINVAL, "expert cache size %lld is not valid", (long long)p->expert_cache_bytes);
    }
    char up[4096];
    const bool pin = p->expert_pin != 0;
    const char *pin_path = NULL;
    if (p->expert_usage_path) pin_path = p->expert_usage_path;
    else if (usage_path(path, fsize, up, sizeof up)) pin_path = up;
    const char *lru = getenv("TERN_EXPERT_LRU"); /* "layer": per-layer lists (for the A/B in PERF.md) */
    const ec_params_t ep = {.bytes = bytes,
                            .io_threads = p->io_threads,
                            .pin_path = pin_path,
                            .pin_share = pin ? 0.5 : 0.0,
                            .per_layer = lru && !strcmp(lru, "layer")};
    /* both pay where routing is spread over the experts (PERF.md, uniform routing: prefetch +20% t/s,
     * pinning +8-16% and 8% fewer bytes read per token): on by default */
    return model_expert_cache(m, path, &ep, p->expert_prefetch != 0, err);
}

tern_model_t *tern_model_load(const char *path, tern_error_t *err) { return tern_model_load_ex(path, NULL, err); }

tern_model_t *tern_model_load_ex(const char *path, const tern_model_params_t *params, tern_error_t *err) {
    if (!path) {
        tern_err(err, TERN_EINVAL, "tern_model_load: NULL path");
        return NULL;
    }
    const tern_model_params_t p = params ? *params : tern_model_default_params();
    uint64_t t0 = tern_now_ns();
    tern_model_t *tm = calloc(1, sizeof *tm);
    if (!tm) {
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    tm->m = model_load(path, err);
    if (!tm->m) {
        free(tm);
        return NULL;
    }
    if (setup_experts(tm, path, &p, err)) {
        model_free(tm->m);
        free(tm);
        return NULL;
    }
    tern_error_t terr = {0};
    tm->tok = tok_load(tm->m->file, &terr);
    if (!tm->tok) snprintf(tm->tok_err, sizeof tm->tok_err, "no usable tokenizer in %.200s: %.280s", path, terr.msg);
    else if (tok_n_vocab(tm->tok) > tm->m->hp.n_vocab) {
        snprintf(tm->tok_err, sizeof tm->tok_err, "tokenizer has %d tokens, the model only %lld", tok_n_vocab(tm->tok),
                 (long long)tm->m->hp.n_vocab);
        tok_free(tm->tok);
        tm->tok = NULL;
    }

    const gguf_file_t *f = tm->m->file;
    uint64_t ft;
    const char *tn = NULL;
    if (gguf_find(f, "general.file_type") && gguf_get_u64(f, "general.file_type", &ft, NULL) == 0) tn = ftype_name(ft);
    if (tn) snprintf(tm->type_name, sizeof tm->type_name, "%s", tn);
    else {
        const char *q = quant_name(tm->m->main_type);
        size_t i = 0;
        for (; q[i] && i + 1 < sizeof tm->type_name; i++)
            tm->type_name[i] = (char)(q[i] >= 'a' && q[i] <= 'z' ? q[i] - 32 : q[i]);
        tm->type_name[i] = 0;
    }
    gguf_str_t s;
    if (gguf_find(f, "general.name") && gguf_get_str(f, "general.name", &s, NULL) == 0 && s.len > 0) {
        int n = s.len < sizeof tm->name - 1 ? (int)s.len : (int)sizeof tm->name - 1;
        snprintf(tm->name, sizeof tm->name, "%.*s", n, s.data);
    } else {
        const char *b = strrchr(path, '/');
        snprintf(tm->name, sizeof tm->name, "%s", b ? b + 1 : path);
    }
    tm->load_ms = (double)(tern_now_ns() - t0) / 1e6;
    return tm;
}

void tern_model_free(tern_model_t *m) {
    if (!m) return;
    gvocab_free(m->gv);
    tok_free(m->tok);
    model_free(m->m);
    free(m);
}

const char *tern_model_arch(const tern_model_t *m) { return m->m->hp.arch_name; }
const char *tern_model_type_name(const tern_model_t *m) { return m->type_name; }
const char *tern_model_name(const tern_model_t *m) { return m->name; }
int32_t tern_model_n_vocab(const tern_model_t *m) { return (int32_t)m->m->hp.n_vocab; }
int32_t tern_model_n_layer(const tern_model_t *m) { return (int32_t)m->m->hp.n_layer; }
int32_t tern_model_n_embd(const tern_model_t *m) { return (int32_t)m->m->hp.n_embd; }
int32_t tern_model_n_ctx_train(const tern_model_t *m) { return (int32_t)m->m->hp.n_ctx_train; }
uint64_t tern_model_n_params(const tern_model_t *m) { return m->m->n_params; }
uint64_t tern_model_file_size(const tern_model_t *m) { return gguf_file_size(m->m->file); }
uint64_t tern_model_bytes_per_token(const tern_model_t *m) { return m->m->weight_bytes_per_token; }
double tern_model_load_ms(const tern_model_t *m) { return m->load_ms; }

void tern_model_expert_stats(const tern_model_t *m, tern_expert_stats_t *st) {
    memset(st, 0, sizeof *st);
    st->expert_bytes = m->m->expert_bytes;
    if (m->m->hp.n_expert > 0) {
        st->n_experts = (uint64_t)m->m->hp.n_layer * (uint64_t)m->m->hp.n_expert;
        st->slot_bytes = ec_slot_bytes(m->m);
    }
    if (!m->m->ec) return;
    ec_stats_t e;
    ec_stats(m->m->ec, &e);
    st->active = 1;
    st->direct = e.direct;
    st->n_slots = e.n_slots;
    st->n_pinned = e.n_pinned;
    st->slot_bytes = e.slot_bytes;
    st->cache_bytes = (uint64_t)e.n_slots * e.slot_bytes;
    st->hits = e.hits;
    st->misses = e.misses;
    st->prefetched = e.prefetched;
    st->prefetch_used = e.prefetch_used;
    st->pred_hits = e.pred_hits;
    st->pred_total = e.pred_total;
    st->bytes_read = e.bytes_read;
    st->read_ns = e.read_ns;
    st->wait_ns = e.wait_ns;
    st->evictions = e.evictions;
}

void tern_model_expert_stats_reset(tern_model_t *m) {
    if (m->m->ec) ec_stats_reset(m->m->ec);
}

/* ---- tokens ---- */

int32_t tern_token_bos(const tern_model_t *m) { return m->tok ? tok_bos(m->tok) : -1; }
int32_t tern_token_eos(const tern_model_t *m) { return m->tok ? tok_eos(m->tok) : -1; }
int tern_token_is_eog(const tern_model_t *m, int32_t id) { return m->tok ? tok_is_eog(m->tok, id) : 0; }
int tern_model_add_bos(const tern_model_t *m) { return m->tok ? tok_add_bos(m->tok) : 0; }

int tern_tokenize(const tern_model_t *m, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t **ids, size_t *n_ids, tern_error_t *err) {
    if (!m || !ids || !n_ids || (!text && len)) return tern_err(err, TERN_EINVAL, "tern_tokenize: bad arguments");
    if (!m->tok) return tern_err(err, TERN_EINVAL, "%s", m->tok_err);
    return tok_encode(m->tok, text ? text : "", len, add_bos != 0, parse_special != 0, ids, n_ids, err);
}

tern_detok_t *tern_detok_create(const tern_model_t *m, tern_error_t *err) {
    if (!m->tok) {
        tern_err(err, TERN_EINVAL, "%s", m->tok_err);
        return NULL;
    }
    tern_detok_t *d = calloc(1, sizeof *d);
    if (!d) {
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    tok_stream_init(&d->s, m->tok);
    return d;
}
int tern_detok_push(tern_detok_t *d, int32_t id, char *out, size_t cap) { return tok_stream_push(&d->s, id, out, cap); }
int tern_detok_flush(tern_detok_t *d, char *out, size_t cap) { return tok_stream_flush(&d->s, out, cap); }
void tern_detok_free(tern_detok_t *d) { free(d); }

int tern_chat_render(const tern_model_t *m, const char *tmpl_name, const tern_chat_msg_t *msgs, size_t n,
                     int add_assistant, char **out, tern_error_t *err) {
    chat_tmpl_t t = tmpl_name && *tmpl_name ? chat_from_name(tmpl_name) : chat_detect(m->m->file);
    if (t == CHAT_UNKNOWN)
        return tern_err(err, TERN_EUNSUP,
                        tmpl_name && *tmpl_name ? "unknown chat template '%s' (chatml, llama3, llama2, mistral, phi3)"
                                                : "%sthe model's chat template is not one tern knows; choose one with "
                                                  "--chat-template (chatml, llama3, llama2, mistral, phi3)",
                        tmpl_name ? tmpl_name : "");
    chat_msg_t *cm = calloc(n ? n : 1, sizeof *cm);
    if (!cm) return tern_err(err, TERN_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content;
    }
    int rc = chat_render(t, cm, n, add_assistant != 0, out, err);
    free(cm);
    return rc;
}

/* ---- contexts ---- */

tern_context_params_t tern_context_default_params(void) {
    tern_context_params_t p = {0};
    p.n_batch = 512;
    return p;
}

/* Thread counts. A pool of more threads than the CPUs this process may run
 * on still computes the same bits, but its workers park instead of spinning
 * and every dispatch waits for all of them to be scheduled: slower, and at
 * hundreds of threads per CPU absurdly so. Up to TERN_THREADS_PER_CPU per
 * CPU is allowed (thread-invariance checks run -t 3 and 4 on two cores) with
 * a note; more is clamped to that, with a note. The note is appended to
 * note (the context's note, which may already hold a line). */
#define TERN_THREADS_PER_CPU 4
static int32_t resolve_threads(int32_t want, char *note, size_t note_len) {
    int32_t n = want > 0 ? want : (int32_t)tern_threads_default(NULL, 0);
    const int cpus = cpu_online();
    int32_t max = (int32_t)TERN_THREADS_PER_CPU * cpus;
    if (max > TERN_POOL_MAX_THREADS) max = TERN_POOL_MAX_THREADS;
    size_t used = strlen(note);
    char *at = note + used;
    size_t room = note_len - used;
    const char *sep = used ? "; " : "";
    if (n > max) {
        snprintf(at, room,
                 "%s%d threads requested, clamped to %d (at most %d per CPU; this process may run on %d CPU%s)", sep,
                 n, max, TERN_THREADS_PER_CPU, cpus, cpus == 1 ? "" : "s");
        n = max;
    } else if (n > cpus) {
        snprintf(at, room, "%s%d threads on %d CPU%s: oversubscribed (same results, slower than %d threads)", sep, n,
                 cpus, cpus == 1 ? "" : "s", cpus);
    }
    return n;
}

tern_context_t *tern_context_create(const tern_model_t *m, const tern_context_params_t *p, tern_error_t *err) {
    if (!m) {
        tern_err(err, TERN_EINVAL, "tern_context_create: NULL model");
        return NULL;
    }
    tern_context_params_t dp = tern_context_default_params();
    if (!p) p = &dp;
    tern_context_t *c = calloc(1, sizeof *c);
    if (!c) {
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    c->model = m;
    model_ctx_params_t mp = model_ctx_default_params();
    char tnote[sizeof c->note] = "";
    mp.n_threads = resolve_threads(p->n_threads, tnote, sizeof tnote);
    mp.n_ctx = p->n_ctx;
    mp.n_batch = p->n_batch;
    mp.kv_f32 = p->kv_f32 != 0;
    mp.profile = p->profile != 0;
    if (p->n_seq_max > KV_MAX_SEQ || p->kv_block > (1 << 20)) {
        free(c);
        tern_err(err, TERN_EINVAL, "tern_context_create: n_seq_max %d (at most %d) or kv_block %d (at most %d)",
                 p->n_seq_max, KV_MAX_SEQ, p->kv_block, 1 << 20);
        return NULL;
    }
    mp.n_seq = p->n_seq_max > 0 ? p->n_seq_max : 64;
    mp.kv_block = p->kv_block;
    c->mc = model_ctx_new(m->m, &mp, c->note, sizeof c->note, err);
    if (!c->mc) {
        free(c);
        return NULL;
    }
    if (tnote[0]) {
        size_t used = strlen(c->note);
        snprintf(c->note + used, sizeof c->note - used, "%s%s", used ? "; " : "", tnote);
    }
    return c;
}

void tern_context_free(tern_context_t *c) {
    if (!c) return;
    model_ctx_free(c->mc);
    free(c);
}

const char *tern_context_note(const tern_context_t *c) { return c->note; }
int32_t tern_context_n_ctx(const tern_context_t *c) { return (int32_t)model_ctx_n_ctx(c->mc); }
int32_t tern_context_pos(const tern_context_t *c) { return (int32_t)model_ctx_pos(c->mc); }
int32_t tern_context_threads(const tern_context_t *c) { return model_ctx_threads(c->mc); }
tern_pool_t *tern_context_pool(tern_context_t *c) { return c ? model_ctx_pool(c->mc) : NULL; }
int tern_context_set_threads(tern_context_t *c, int32_t n, tern_error_t *err) {
    char tnote[sizeof c->note] = "";
    int rc = model_ctx_set_threads(c->mc, resolve_threads(n, tnote, sizeof tnote), err);
    if (rc == 0) snprintf(c->note, sizeof c->note, "%s", tnote);
    return rc;
}
int tern_context_truncate(tern_context_t *c, int32_t pos, tern_error_t *err) {
    return model_ctx_truncate(c->mc, pos, err);
}
void tern_context_set_abort(tern_context_t *c, int (*fn)(void *), void *user) {
    c->abort_fn = fn;
    c->abort_user = user;
}

int api_eval(tern_context_t *c, const int32_t *ids, int32_t n, float *logits_all, api_eval_kind_t kind,
             tern_error_t *err) {
    if (!c || n < 0 || (n > 0 && !ids)) return tern_err(err, TERN_EINVAL, "tern_eval: bad arguments");
    if (n == 0) return 0;
    int64_t room = model_ctx_n_ctx(c->mc) - model_ctx_pos(c->mc);
    /* Checked here for the whole call, before the first block: model_eval
     * sees one block at a time, and nothing may be appended when the whole
     * does not fit. */
    if (n > room)
        return tern_err(err, TERN_ECTXFULL, "context full: %lld positions + %d new > context size %lld",
                        (long long)model_ctx_pos(c->mc), n, (long long)model_ctx_n_ctx(c->mc));
    const int64_t V = c->model->m->hp.n_vocab;
    /* The blocks of the whole call are taken now (TERN_EKVFULL: nothing
     * appended), so that a later block cannot find the memory full. */
    int rc = kv_seq_reserve(model_ctx_kv(c->mc), 0, n, err);
    if (rc) return rc;
    /* Block by block, so that the abort callback runs between blocks. The
     * pool does not change during an eval (set_threads is the caller's). */
    const int64_t step = model_ctx_n_batch(c->mc);
    const tern_pool_t *pool = model_ctx_pool(c->mc);
    uint64_t d0 = tern_pool_dispatches(pool), t0 = tern_now_ns();
    for (int64_t off = 0; off < n && rc == 0; off += step) {
        if (off > 0 && c->abort_fn && c->abort_fn(c->abort_user)) {
            rc = tern_err(err, TERN_EABORTED, "evaluation aborted after %lld of %d tokens", (long long)off, n);
            break;
        }
        int64_t k = n - off < step ? n - off : step;
        rc = model_eval(c->mc, ids + off, k, logits_all ? logits_all + off * V : NULL, err);
    }
    /* Blocks reserved past what was evaluated go back. */
    if (rc) (void)model_ctx_truncate(c->mc, model_ctx_pos(c->mc), NULL);
    uint64_t dt = tern_now_ns() - t0, dd = tern_pool_dispatches(pool) - d0;
    if (kind == API_EVAL_PROMPT) {
        c->t.n_prompt += n;
        c->t.prompt_ns += dt;
        c->t.prompt_dispatches += dd;
    } else {
        if (kind == API_EVAL_GEN) c->t.n_gen += n;
        c->t.gen_ns += dt;
        c->t.gen_dispatches += dd;
    }
    return rc;
}

int tern_eval(tern_context_t *c, const int32_t *ids, int32_t n, float *logits_all, tern_error_t *err) {
    return api_eval(c, ids, n, logits_all, n > 1 ? API_EVAL_PROMPT : API_EVAL_GEN, err);
}

const float *tern_get_logits(const tern_context_t *c) { return model_ctx_logits(c->mc); }

void tern_context_timings(const tern_context_t *c, tern_timings_t *t) { *t = c->t; }
void tern_context_timings_reset(tern_context_t *c) {
    memset(&c->t, 0, sizeof c->t);
    model_ctx_prof_reset(c->mc);
}

void tern_context_profile(const tern_context_t *c, tern_profile_t *p) {
    const model_prof_t *mp = model_ctx_prof(c->mc);
    p->qkv = mp->qkv;
    p->attn = mp->attn;
    p->wo = mp->wo;
    p->ffn_up = mp->ffn_up;
    p->ffn_down = mp->ffn_down;
    p->output = mp->output;
    p->small = mp->small;
    p->n_tokens = (int64_t)mp->n_tokens;
}

const char *tern_isa_name(void) { return kern_isa_name(kern_isa_active()); }
const char *tern_amx_status(void) { return kern_amx_status(); }

/* ---- sampling ---- */

tern_sampler_params_t tern_sampler_default_params(void) {
    tern_sampler_params_t p = {0};
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 0x7e57;
    return p;
}

static tern_sampler_t *sampler_wrap(sampler_t *in, tern_error_t *err) {
    if (!in) return NULL;
    tern_sampler_t *s = calloc(1, sizeof *s);
    if (!s) {
        sampler_free(in);
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    s->s = in;
    return s;
}

tern_sampler_t *tern_sampler_create(const tern_model_t *m, const tern_sampler_params_t *p, tern_error_t *err) {
    if (!m || !p) {
        tern_err(err, TERN_EINVAL, "tern_sampler_create: bad arguments");
        return NULL;
    }
    return sampler_wrap(sampler_create(p, (int32_t)m->m->hp.n_vocab, err), err);
}
tern_sampler_t *tern_sampler_create_chain(const tern_model_t *m, const tern_sampler_params_t *p,
                                          const tern_sampler_stage_t *stages, int32_t n_stages, tern_error_t *err) {
    if (!m || !p || !stages) {
        tern_err(err, TERN_EINVAL, "tern_sampler_create_chain: bad arguments");
        return NULL;
    }
    return sampler_wrap(sampler_create_chain(p, stages, (int)n_stages, (int32_t)m->m->hp.n_vocab, err), err);
}
void tern_sampler_free(tern_sampler_t *s) {
    if (!s) return;
    sampler_free(s->s);
    free(s);
}
int32_t tern_sampler_chain(const tern_sampler_t *s, tern_sampler_stage_t *stages, int32_t cap) {
    return sampler_chain(s->s, stages, cap);
}
void tern_sampler_set_mask(tern_sampler_t *s, tern_mask_fn fn, void *user) { sampler_set_mask(s->s, fn, user); }
int tern_sampler_set_logit_bias(tern_sampler_t *s, const tern_logit_bias_t *bias, size_t n, tern_error_t *err) {
    return sampler_set_logit_bias(s->s, bias, n, err);
}
int32_t tern_sampler_sample(tern_sampler_t *s, const float *logits) { return sampler_sample(s->s, logits); }
void tern_sampler_accept(tern_sampler_t *s, int32_t id) { sampler_accept(s->s, id); }
void tern_sampler_reset(tern_sampler_t *s) { sampler_reset(s->s); }
size_t tern_sampler_state_size(const tern_sampler_t *s) { return sampler_state_size(s->s); }
size_t tern_sampler_state_save(const tern_sampler_t *s, void *buf, size_t cap) {
    return sampler_state_save(s->s, buf, cap);
}
int tern_sampler_state_load(tern_sampler_t *s, const void *buf, size_t len, tern_error_t *err) {
    return sampler_state_load(s->s, buf, len, err);
}

/* ---- grammars ---- */

tern_grammar_t *tern_grammar_create(const tern_model_t *m, const char *gbnf, size_t len, const char *root,
                                    tern_error_t *err) {
    if (!m || (!gbnf && len)) {
        tern_err(err, TERN_EINVAL, "tern_grammar_create: bad arguments");
        return NULL;
    }
    if (!m->tok) {
        tern_err(err, TERN_EINVAL, "grammar: the model has no usable tokenizer (%s)", m->tok_err);
        return NULL;
    }
    pthread_mutex_lock(&gv_mu);
    if (!m->gv) ((tern_model_t *)m)->gv = gvocab_build(m->tok, err);
    const gvocab_t *gv = m->gv;
    pthread_mutex_unlock(&gv_mu);
    if (!gv) return NULL;
    grammar_t *g = grammar_parse(gbnf, len, root, err);
    if (!g) return NULL;
    tern_grammar_t *tg = calloc(1, sizeof *tg);
    if (!tg) {
        grammar_free(g);
        tern_err(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    tg->g = g;
    if (grammar_bind(g, gv, err)) {
        tern_grammar_free(tg);
        return NULL;
    }
    return tg;
}

void tern_grammar_free(tern_grammar_t *g) {
    if (!g) return;
    grammar_free(g->g);
    free(g);
}

double tern_grammar_compile_ms(const tern_grammar_t *g) { return g ? grammar_bind_ms(g->g) : 0; }

tern_matcher_t *tern_matcher_create(const tern_grammar_t *g, tern_error_t *err) {
    if (!g) {
        tern_err(err, TERN_EINVAL, "tern_matcher_create: no grammar");
        return NULL;
    }
    tern_matcher_t *mt = calloc(1, sizeof *mt);
    if (!mt) {
        tern_err(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    if (!(mt->m = gmatcher_create(g->g, err))) {
        free(mt);
        return NULL;
    }
    return mt;
}

void tern_matcher_free(tern_matcher_t *mt) {
    if (!mt) return;
    gmatcher_free(mt->m);
    free(mt);
}
void tern_matcher_reset(tern_matcher_t *mt) { gmatcher_reset(mt->m); }
int tern_matcher_copy(tern_matcher_t *dst, const tern_matcher_t *src, tern_error_t *err) {
    if (!dst || !src) return tern_err(err, TERN_EINVAL, "tern_matcher_copy: bad arguments");
    return gmatcher_copy(dst->m, src->m, err);
}
int tern_matcher_accept(tern_matcher_t *mt, int32_t id, tern_error_t *err) { return gmatcher_accept(mt->m, id, err); }
int tern_matcher_accept_text(tern_matcher_t *mt, const char *text, size_t len, tern_error_t *err) {
    if (!text && len) return tern_err(err, TERN_EINVAL, "tern_matcher_accept_text: NULL text");
    return gmatcher_accept_bytes(mt->m, text, len, err);
}
int tern_matcher_allows(tern_matcher_t *mt, int32_t id) { return gmatcher_allows(mt->m, id); }
int tern_matcher_done(const tern_matcher_t *mt) { return gmatcher_done(mt->m); }
int tern_matcher_finished(const tern_matcher_t *mt) { return gmatcher_finished(mt->m); }
size_t tern_matcher_forced(const tern_matcher_t *mt, char *buf, size_t cap) {
    return buf ? gmatcher_forced(mt->m, buf, cap) : 0;
}
void tern_sampler_set_matcher(tern_sampler_t *s, tern_matcher_t *mt) {
    s->mt = mt;
    sampler_set_matcher(s->s, mt ? mt->m : NULL);
}
tern_matcher_t *tern_sampler_matcher(const tern_sampler_t *s) { return s->mt; }
gmatcher_t *api_matcher(tern_matcher_t *mt) { return mt ? mt->m : NULL; }


/* ---- many sequences ---- */

static bool seq_ok(const tern_context_t *c, int32_t seq) {
    return seq >= 0 && seq < kv_cache_n_seq(model_ctx_kv_const(c->mc));
}

int tern_decode(tern_context_t *c, const tern_batch_entry_t *e, int32_t n, tern_error_t *err) {
    if (!c || n < 0 || (n > 0 && !e)) return tern_err(err, TERN_EINVAL, "tern_decode: bad arguments");
    model_tok_t *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    if (!t) return tern_err(err, TERN_ENOMEM, "out of memory for a batch of %d tokens", n);
    for (int32_t i = 0; i < n; i++) {
        if (e[i].pos < 0 && e[i].pos != TERN_POS_APPEND) {
            free(t);
            return tern_err(err, TERN_EINVAL, "tern_decode: entry %d: position %d", i, e[i].pos);
        }
        t[i] = (model_tok_t){e[i].seq, e[i].token, e[i].pos == TERN_POS_APPEND ? MODEL_POS_APPEND : e[i].pos,
                             e[i].logits != 0};
    }
    const tern_pool_t *pool = model_ctx_pool(c->mc);
    const uint64_t d0 = tern_pool_dispatches(pool), t0 = tern_now_ns();
    const int rc = model_decode(c->mc, t, n, err);
    free(t);
    if (rc == 0) {
        c->t.n_decode += n;
        c->t.n_decode_calls++;
        c->t.decode_ns += tern_now_ns() - t0;
        c->t.decode_dispatches += tern_pool_dispatches(pool) - d0;
    }
    return rc;
}

const float *tern_batch_logits(const tern_context_t *c, int32_t i) { return model_ctx_out(c->mc, i); }

int32_t tern_context_n_seq(const tern_context_t *c) { return kv_cache_n_seq(model_ctx_kv_const(c->mc)); }

int32_t tern_seq_pos(const tern_context_t *c, int32_t seq) {
    return seq_ok(c, seq) ? (int32_t)kv_seq_n_pos(model_ctx_kv_const(c->mc), seq) : -1;
}

int32_t tern_seq_blocks(const tern_context_t *c, int32_t seq) {
    return seq_ok(c, seq) ? (int32_t)kv_seq_n_blocks(model_ctx_kv_const(c->mc), seq) : -1;
}

int tern_seq_truncate(tern_context_t *c, int32_t seq, int32_t pos, tern_error_t *err) {
    if (!c || !seq_ok(c, seq)) return tern_err(err, TERN_EINVAL, "tern_seq_truncate: no sequence %d", seq);
    return kv_seq_truncate(model_ctx_kv(c->mc), seq, pos, err);
}

int tern_seq_remove(tern_context_t *c, int32_t seq, tern_error_t *err) {
    if (!c || !seq_ok(c, seq)) return tern_err(err, TERN_EINVAL, "tern_seq_remove: no sequence %d", seq);
    kv_seq_remove(model_ctx_kv(c->mc), seq);
    return 0;
}

int tern_seq_fork(tern_context_t *c, int32_t dst, int32_t src, int32_t n_pos, tern_error_t *err) {
    if (!c || !seq_ok(c, dst) || !seq_ok(c, src))
        return tern_err(err, TERN_EINVAL, "tern_seq_fork: no sequence %d or %d", dst, src);
    return kv_seq_fork(model_ctx_kv(c->mc), dst, src, n_pos, err);
}

void tern_kv_stats(const tern_context_t *c, tern_kv_stats_t *st) {
    kv_stats_t k;
    kv_cache_stats(model_ctx_kv_const(c->mc), &k);
    st->block_pos = (int32_t)k.block_pos;
    st->n_blocks = (int32_t)k.n_blocks;
    st->n_used = (int32_t)k.n_used;
    st->n_free = (int32_t)k.n_free;
    st->n_shared = (int32_t)k.n_shared;
}

/* ---- sessions ---- */

tern_session_t *tern_session_open(const tern_model_t *m, const char *path, const tern_context_t *c,
                                  tern_error_t *err) {
    if (!m || !path || !c || c->model != m) {
        tern_err(err, TERN_EINVAL, "tern_session_open: bad arguments (NULL, or a context of another model)");
        return NULL;
    }
    tern_session_t *ts = calloc(1, sizeof *ts);
    if (!ts) {
        tern_err(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    session_fp_t fp;
    session_fingerprint(m->m, kv_cache_layout(model_ctx_kv_const(c->mc))->type, &fp);
    ts->model = m;
    if (!(ts->s = session_open(path, &fp, err))) {
        free(ts);
        return NULL;
    }
    return ts;
}

void tern_session_close(tern_session_t *s) {
    if (!s) return;
    session_close(s->s);
    free(s);
}

int32_t tern_session_n_tokens(const tern_session_t *s) { return (int32_t)session_n_tokens(s->s); }
const int32_t *tern_session_tokens(const tern_session_t *s) { return session_tokens(s->s); }
int32_t tern_session_n_turns(const tern_session_t *s) { return (int32_t)session_n_turns(s->s); }

int tern_session_restore_prefix(tern_session_t *s, tern_context_t *c, int32_t seq, const int32_t *prompt,
                                int32_t n_prompt, int32_t *n_restored, tern_error_t *err) {
    if (n_restored) *n_restored = 0;
    if (!s || !c || c->model != s->model || n_prompt < 0 || (n_prompt > 0 && !prompt) || !seq_ok(c, seq))
        return tern_err(err, TERN_EINVAL, "tern_session_restore_prefix: bad arguments");
    const int32_t *st = session_tokens(s->s);
    int64_t n = 0, ns = session_n_tokens(s->s);
    while (n < ns && n < n_prompt && st[n] == prompt[n]) n++;
    if (n >= n_prompt) n = n_prompt - 1; /* one prompt token is left to evaluate: the logits */
    if (n < 0) n = 0;
    if (n > model_ctx_n_ctx(c->mc)) n = model_ctx_n_ctx(c->mc);
    int rc = session_restore(s->s, c->mc, seq, n, err);
    if (rc) return rc;
    if (n_restored) *n_restored = (int32_t)n;
    return 0;
}

int tern_session_append(tern_session_t *s, const tern_context_t *c, int32_t seq, tern_error_t *err) {
    if (!s || !c || c->model != s->model || !seq_ok(c, seq))
        return tern_err(err, TERN_EINVAL, "tern_session_append: bad arguments");
    const kv_cache_t *kv = model_ctx_kv_const(c->mc);
    const int64_t pos = kv_seq_n_pos(kv, seq);
    const int32_t *st = session_tokens(s->s), *hist = kv_seq_ids(kv, seq);
    int64_t common = 0, ns = session_n_tokens(s->s);
    while (common < ns && common < pos && st[common] == hist[common]) common++;
    int rc = 0;
    if (common < ns && (rc = session_truncate(s->s, common, err))) return rc;
    const int64_t from = session_n_tokens(s->s);
    return session_append(s->s, c->mc, seq, hist + from, pos - from, err);
}
