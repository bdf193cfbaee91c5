/*
 * generate.c - the generation loop, one for tern_generate and
 * tern_generate_spec (plain decoding is the loop with no drafts).
 *
 * The loop's state between iterations: lg, the logits of the text
 * confirmed so far (the prompt and every token reported), from which the
 * next token is sampled. An iteration samples one token and accepts it
 * (gen_accept: the one place a token becomes output). Then either
 *   - the token equals the next draft of the last pass: that draft was
 *     evaluated in the pass, its position's logits are the next lg, and no
 *     forward pass is needed; or
 *   - it does not (or no draft is left): the pass's drafts after the
 *     confirmed text are dropped from the KV memory (end_pass), and a new
 *     pass evaluates the token, with up to k new drafts after it when
 *     speculating, keeping every position's logits.
 * Plain decoding is the second branch with k = 0 always: one token per
 * pass. Either way a token is sampled only from the logits of confirmed
 * text, by the same sampler call in the same order, so the tokens, the
 * sampler's state and the KV memory are those of plain decoding; drafts
 * only decide how many positions one pass evaluates.
 *
 * The stop rules are tern_generate's (tern.h): an end-of-generation token
 * is reported and not evaluated; every other token reported is evaluated
 * before the loop stops (for a confirmed draft it already was), unless the
 * context is full; when several reasons meet, EOG, then CTX_FULL, then
 * CALLBACK, then LENGTH. Drafts never outrun them: a pass holds at most
 * the tokens still to be generated and the positions the context has left.
 */
#include <stdlib.h>
#include <string.h>

#include "tern.h"
#include "api/api_internal.h"
#include "core/common.h"
#include "model/kv_cache.h"

const char *tern_stop_reason_name(tern_stop_reason_t r) {
    switch (r) {
    case TERN_STOP_LENGTH: return "length";
    case TERN_STOP_EOG: return "eog";
    case TERN_STOP_CALLBACK: return "callback";
    case TERN_STOP_CTX_FULL: return "context full";
    case TERN_STOP_ERROR: return "error";
    }
    return "?";
}

typedef struct {
    tern_context_t *c;
    tern_sampler_t *s;
    const tern_model_t *m;
    tern_token_cb cb;
    void *user;
    tok_stream_t ds;
    char text[512];
    int32_t ng;         /* tokens reported */
    /* speculative decoding (dr NULL: no drafts) */
    tern_drafter_t *dr;
    tern_spec_ctl_t *ctl;
    tern_spec_stats_t st;
    int32_t n_draft_max;
    float *buf;         /* (n_draft_max + 1, n_vocab) the logits of the last pass */
    int32_t toks[TERN_SPEC_DRAFT_MAX + 1]; /* the last pass: the token evaluated, then its drafts */
    int32_t k, j;       /* drafts in the last pass; of them confirmed so far */
    int32_t nm;         /* the n-gram match they came from (0: none) */
    int64_t base;       /* position of toks[0] */
    bool rejected;      /* the sampler picked another token than draft j + 1 */
    bool open;          /* a pass ran and end_pass has not closed it */
    gmatcher_t *mt;     /* the sampler's grammar state, or NULL */
    int grc;            /* the grammar refused an accepted token (never expected) */
} gen_t;

/* The next token from logits, timed; TERN_EINVAL when the sampler allowed
 * none; 1 when none is allowed because the grammar's text is complete (a
 * vocabulary without an end token). */
static int gen_sample(gen_t *g, const float *logits, int32_t *id, tern_error_t *err) {
    const uint64_t t0 = tern_now_ns();
    *id = sampler_sample(g->s->s, logits);
    g->c->t.sample_ns += tern_now_ns() - t0;
    g->c->t.n_sample++;
    if (*id < 0 && g->mt && gmatcher_finished(g->mt)) return 1; /* the grammar is complete, no end token */
    if (*id < 0)
        return tern_err(err, TERN_EINVAL,
                        "tern_generate: the sampler allowed no token (the mask or the logit bias banned every one, "
                        "or the mask callback failed) after %d tokens",
                        g->ng);
    return 0;
}

/* A token is accepted: the one place where the text grows. Everything that
 * must follow the confirmed text advances here, once per token and in
 * order: the sampler's window (and whatever state it carries), the
 * drafter's history, the detokenizer, the count, the callback. Returns the
 * callback's wish to stop; *eog: an end-of-generation token. */
static bool gen_accept(gen_t *g, int32_t id, bool *eog) {
    sampler_accept(g->s->s, id);
    if (g->mt && !g->grc) g->grc = gmatcher_accept(g->mt, id, NULL);
    if (g->dr && tern_drafter_push(g->dr, &id, 1, NULL)) {
        /* Out of memory for the history: go on without drafts (the output
         * does not depend on them). */
        tern_drafter_free(g->dr);
        g->dr = NULL;
    }
    const tokenizer_t *tok = g->m->tok;
    *eog = tok && tok_is_eog(tok, id);
    int len = 0;
    if (tok && !*eog) {
        len = tok_stream_push(&g->ds, id, g->text, sizeof g->text);
        if (len < 0) len = 0;
    }
    g->ng++;
    return g->cb && g->cb(id, tok ? g->text : NULL, (size_t)len, g->user);
}

/* The draft source: up to cap tokens guessed to follow the accepted text
 * (which ends with the token about to be evaluated), and how much of the
 * text backs the guess (*n_match, the controller's key): the grammar's
 * forced text, else prompt lookup cut where the grammar refuses
 * (tern_drafter_draft_under, which the server shares). */
static int32_t gen_draft(gen_t *g, int32_t *out, int32_t cap, int32_t *n_match) {
    *n_match = 0;
    if (!g->dr || cap <= 0) return 0;
    return tern_drafter_draft_under(g->dr, g->m, g->s->mt, out, cap, n_match);
}

/* Close the last pass: drop its drafts after the confirmed ones from the
 * KV memory, count the kept positions as generated tokens, tell the
 * controller. final: the loop ends, so the context's logits must again be
 * those of the last position kept (a next pass would replace them). */
static void end_pass(gen_t *g, bool final) {
    if (!g->open) return;
    g->open = false;
    if (g->k > 0) {
        if (g->j < g->k) {
            TERN_CHECK(model_ctx_truncate(g->c->mc, g->base + g->j + 1, NULL) == 0);
            if (final) model_ctx_set_logits(g->c->mc, g->buf + (size_t)g->j * (size_t)g->m->m->hp.n_vocab);
        }
        g->c->t.n_gen += g->j + 1;
        g->st.n_accepted += g->j;
    }
    /* A pass cut short by a stop (not by a rejection) reports only what
     * was checked: the unchecked drafts say nothing about acceptance. */
    if (g->ctl) tern_spec_ctl_observe(g->ctl, g->nm, g->rejected ? g->k : g->j, g->j);
    g->k = g->j = 0;
    g->rejected = false;
}

/* Evaluate id (the last token accepted) at the end of sequence 0, with up
 * to kmax drafts after it, as many as the controller wants of those found. */
static int gen_pass(gen_t *g, int32_t id, int32_t kmax, tern_error_t *err) {
    tern_context_t *c = g->c;
    g->toks[0] = id;
    g->base = model_ctx_pos(c->mc);
    int32_t kd = gen_draft(g, g->toks + 1, kmax, &g->nm);
    if (kd > 0) {
        const int32_t want = tern_spec_ctl_next(g->ctl, g->nm);
        if (kd > want) kd = want;
    }
    const uint64_t t0 = tern_now_ns();
    int rc = 0;
    if (kd > 0) {
        tern_error_t e = {0};
        rc = api_eval(c, g->toks, kd + 1, g->buf, API_EVAL_VERIFY, &e);
        /* The memory has no blocks for the drafts: the token alone needs
         * what plain decoding needs. */
        if (rc == TERN_EKVFULL) kd = 0;
        else if (rc && err) *err = e;
    }
    if (kd == 0) rc = api_eval(c, &id, 1, NULL, API_EVAL_GEN, err);
    if (rc) return rc;
    const uint64_t dt = tern_now_ns() - t0;
    g->st.n_passes++;
    g->st.pass_ns += dt;
    if (kd > 0) {
        g->st.n_spec_passes++;
        g->st.n_drafted += kd;
    }
    if (g->ctl) tern_spec_ctl_time(g->ctl, kd, dt);
    g->k = kd;
    g->j = 0;
    g->rejected = false;
    g->open = true;
    return 0;
}

/* The most drafts the next pass may hold. */
static int32_t gen_room(gen_t *g, int32_t n_predict, bool cb_stop) {
    if (!g->dr || cb_stop) return 0;
    int32_t kd = g->n_draft_max;
    /* Room in the context after the token itself, and tokens still wanted:
     * a draft past those would be evaluated for nothing. */
    const int64_t room = model_ctx_n_ctx(g->c->mc) - model_ctx_pos(g->c->mc) - 1;
    const int32_t left = n_predict - g->ng;
    if (kd > room) kd = (int32_t)room;
    if (kd > left) kd = left;
    /* One block (n_batch positions) per pass: the abort callback runs
     * between blocks, and plain decoding never stops between a token and
     * its evaluation, so neither may a pass. */
    const int64_t nb = model_ctx_n_batch(g->c->mc);
    if (kd > nb - 1) kd = (int32_t)(nb - 1);
    return kd > 0 ? kd : 0;
}

static int generate(tern_context_t *c, tern_sampler_t *s, const int32_t *prompt, int32_t n_prompt,
                    int32_t n_predict, const tern_spec_params_t *sp, tern_token_cb cb, void *user,
                    tern_generate_result_t *res, tern_spec_stats_t *st, tern_error_t *err) {
    if (res) {
        res->n_generated = 0;
        res->stop = TERN_STOP_ERROR;
    }
    if (st) memset(st, 0, sizeof *st);
    if (!c || !s || n_prompt < 0 || (n_prompt > 0 && !prompt))
        return tern_err(err, TERN_EINVAL, "tern_generate: bad arguments");
    if (sp && api_spec_check(sp, err)) return TERN_EINVAL;
    if (n_prompt == 0 && model_ctx_pos(c->mc) == 0)
        return tern_err(err, TERN_EINVAL, "tern_generate: empty prompt and empty context (nothing to continue)");

    gen_t g;
    memset(&g, 0, sizeof g);
    tern_stop_reason_t why = TERN_STOP_LENGTH;
    bool cb_stop = false, eog = false;
    g.c = c;
    g.s = s;
    g.m = c->model;
    g.cb = cb;
    g.user = user;
    g.mt = api_matcher(s->mt);
    int rc = 0;
    if (sp && sp->n_draft_max > 0) {
        const size_t V = (size_t)g.m->m->hp.n_vocab;
        g.dr = tern_drafter_create(sp->ngram_min, sp->ngram_max, err);
        g.ctl = g.dr ? tern_spec_ctl_create(sp, err) : NULL;
        g.n_draft_max = sp->n_draft_max;
        g.buf = g.ctl ? malloc(((size_t)sp->n_draft_max + 1) * V * sizeof *g.buf) : NULL;
        if (!g.buf) {
            rc = g.ctl ? tern_err(err, TERN_ENOMEM, "out of memory for the logits of %d drafts", sp->n_draft_max)
                       : TERN_ENOMEM;
            goto done;
        }
    }
    if ((rc = api_eval(c, prompt, n_prompt, NULL, API_EVAL_PROMPT, err))) goto done;
    for (int32_t i = 0; i < n_prompt; i++) sampler_accept(s->s, prompt[i]);
    if (g.dr) {
        /* The history is what sequence 0 holds (a continued call's earlier
         * text included); ids the memory does not know are -1, never drafted. */
        const kv_cache_t *kv = model_ctx_kv_const(c->mc);
        if (tern_drafter_push(g.dr, kv_seq_ids(kv, 0), (int32_t)kv_seq_n_pos(kv, 0), NULL)) {
            tern_drafter_free(g.dr);
            g.dr = NULL;
        }
    }
    if (g.m->tok) {
        tok_stream_init(&g.ds, g.m->tok);
        /* SPM drops the leading space of the first piece of a text; after a
         * prompt (more than BOS) the generated text continues it instead. */
        if (model_ctx_pos(c->mc) > 1) g.ds.first = false;
    }

    const size_t V = (size_t)g.m->m->hp.n_vocab;
    const float *lg = model_ctx_logits(c->mc);
    for (;;) {
        if (cb_stop) {
            why = TERN_STOP_CALLBACK;
            break;
        }
        if (g.ng >= n_predict) {
            why = TERN_STOP_LENGTH;
            break;
        }
        int32_t id;
        if ((rc = gen_sample(&g, lg, &id, err))) {
            if (rc == 1) { /* the grammar's text is complete */
                rc = 0;
                why = TERN_STOP_EOG;
            }
            break;
        }
        cb_stop = gen_accept(&g, id, &eog);
        if (g.grc) {
            rc = tern_err(err, TERN_EINVAL, "tern_generate: the grammar refused token %d that its mask allowed", id);
            break;
        }
        if (eog) {
            why = TERN_STOP_EOG;
            break;
        }
        if (g.j < g.k) {
            if (id == g.toks[g.j + 1]) {
                /* Draft j + 1 confirmed: it is in the KV memory already. */
                g.j++;
                lg = g.buf + (size_t)g.j * V;
                continue;
            }
            g.rejected = true;
        }
        end_pass(&g, false);
        /* Every reported token except an end-of-generation one goes into the
         * cache, so a later call (chat) continues exactly after it. */
        if (model_ctx_pos(c->mc) >= model_ctx_n_ctx(c->mc)) {
            why = TERN_STOP_CTX_FULL;
            break;
        }
        if ((rc = gen_pass(&g, id, gen_room(&g, n_predict, cb_stop), err))) break;
        lg = g.k ? g.buf : model_ctx_logits(c->mc);
    }
    end_pass(&g, true);
    if (g.m->tok && cb) {
        int len = tok_stream_flush(&g.ds, g.text, sizeof g.text);
        if (len > 0) cb(-1, g.text, (size_t)len, user);
    }
    if (res) {
        res->n_generated = g.ng;
        res->stop = rc ? TERN_STOP_ERROR : why;
    }
done:
    g.st.n_generated = g.ng;
    if (st) *st = g.st;
    tern_drafter_free(g.dr);
    tern_spec_ctl_free(g.ctl);
    free(g.buf);
    return rc;
}

int tern_generate(tern_context_t *c, tern_sampler_t *s, const int32_t *prompt, int32_t n_prompt, int32_t n_predict,
                  tern_token_cb cb, void *user, tern_generate_result_t *res, tern_error_t *err) {
    return generate(c, s, prompt, n_prompt, n_predict, NULL, cb, user, res, NULL, err);
}

int tern_generate_spec(tern_context_t *c, tern_sampler_t *s, const int32_t *prompt, int32_t n_prompt,
                       int32_t n_predict, const tern_spec_params_t *sp, tern_token_cb cb, void *user,
                       tern_generate_result_t *res, tern_spec_stats_t *st, tern_error_t *err) {
    tern_spec_params_t dp = tern_spec_default_params();
    return generate(c, s, prompt, n_prompt, n_predict, sp ? sp : &dp, cb, user, res, st, err);
}
