/*
 * api_internal.h - what the files of the API layer share: the objects
 * behind tern.h's opaque handles and the timed evaluation of sequence 0.
 * Private to src/api/.
 */
#ifndef TERN_API_INTERNAL_H
#define TERN_API_INTERNAL_H

#include "tern.h"
#include "model/model.h"
#include "text/grammar.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

struct tern_model {
    model_t *m;
    tokenizer_t *tok; /* NULL when the file has no usable tokenizer */
    gvocab_t *gv;     /* the vocabulary trie of grammars, built on first use (api.c's gv_mu) */
    char tok_err[TERN_ERR_MSG];
    char type_name[32];
    char name[128];
    double load_ms;
};

struct tern_context {
    const tern_model_t *model;
    model_ctx_t *mc;
    char note[512];
    tern_timings_t t;
    int (*abort_fn)(void *);
    void *abort_user;
};

struct tern_sampler {
    sampler_t *s;
    tern_matcher_t *mt; /* borrowed: the grammar's state the MASK stage reads */
};

/* The grammar matcher behind a tern_matcher_t. */
gmatcher_t *api_matcher(tern_matcher_t *mt);

/* How api_eval counts an evaluation in tern_timings_t: PROMPT into the
 * prompt counters, GEN into the generation counters (tokens, time,
 * dispatches), VERIFY into the generation time and dispatches only: a
 * speculative pass evaluates drafts that may be dropped, so its caller adds
 * the tokens it keeps to n_gen itself. */
typedef enum { API_EVAL_PROMPT, API_EVAL_GEN, API_EVAL_VERIFY } api_eval_kind_t;

/* Evaluate n tokens of sequence 0 at its end (tern_eval's contract: all
 * or, on TERN_ECTXFULL / TERN_EKVFULL, nothing appended; the abort callback
 * between n_batch blocks). logits_all (may be NULL): n x n_vocab floats. */
int api_eval(tern_context_t *c, const int32_t *ids, int32_t n, float *logits_all, api_eval_kind_t kind,
             tern_error_t *err);

/* TERN_EINVAL naming the bad field of p (spec.c). */
int api_spec_check(const tern_spec_params_t *p, tern_error_t *err);

#endif
