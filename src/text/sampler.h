/*
 * sampler.h - choosing the next token from logits: an explicit chain of
 * stages (mask, logit bias, penalties, top-k, top-p, min-p, temperature,
 * then a seeded draw or greedy), and the sampler's state as a byte blob.
 *
 * The stages, their default order and their exact semantics are documented
 * once, in tern_sampler.h (the public header): sampler_create builds the
 * default chain from tern_sampler_params_t, sampler_create_chain any order
 * an application gives.
 *
 * Reproducibility: the RNG is splitmix64 seeded from params.seed; one draw
 * per sampled token, so the same seed, model and prompt give the same text.
 * Candidates with equal logits are ordered by id, so no step depends on the
 * sort algorithm.
 */
#ifndef TERN_TEXT_SAMPLER_H
#define TERN_TEXT_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "tern_sampler.h"
#include "tern_error.h"

typedef struct sampler sampler_t;

/* The default chain of p (tern_sampler.h). NULL on error (bad parameter
 * named in err). */
sampler_t *sampler_create(const tern_sampler_params_t *p, int32_t n_vocab, tern_error_t *err);
/* n stages in the given order (each kind at most once; DIST or GREEDY last
 * and only there), their parameters from p. */
sampler_t *sampler_create_chain(const tern_sampler_params_t *p, const tern_sampler_stage_t *stages, int n,
                                int32_t n_vocab, tern_error_t *err);
void sampler_free(sampler_t *s);
/* The chain's stages into out (at most cap); returns their count. */
int sampler_chain(const sampler_t *s, tern_sampler_stage_t *out, int cap);

/* A grammar matcher (borrowed; NULL removes it): the MASK stage allows only
 * the tokens it allows (after the callback, if both are set). The sampler
 * never advances it: the caller accepts each chosen token into it. */
struct gmatcher;
void sampler_set_matcher(sampler_t *s, struct gmatcher *m);
/* The MASK stage's callback (NULL: the stage does nothing). */
void sampler_set_mask(sampler_t *s, tern_mask_fn fn, void *user);
/* Replace the LOGIT_BIAS list by a copy of n entries (0: none). TERN_EINVAL
 * for a token out of range or a NaN / +INFINITY bias (nothing changed). */
int sampler_set_logit_bias(sampler_t *s, const tern_logit_bias_t *bias, size_t n, tern_error_t *err);

/* Pick a token from n_vocab logits (not modified); -1 when the mask or the
 * logit bias left no candidate, or the mask callback failed. */
int32_t sampler_sample(sampler_t *s, const float *logits);
/* Record an accepted token (prompt or generated) in the penalty window; ids
 * outside [0, n_vocab) are ignored (they could never be penalized). */
void sampler_accept(sampler_t *s, int32_t id);
/* Empty the window and reseed. */
void sampler_reset(sampler_t *s);
/* Uniform double in [0, 1) from the sampler's RNG (exposed for tests). */
double sampler_uniform(sampler_t *s);

/* The state blob (format in tern_sampler.h). size: the most bytes a save of
 * this sampler can take (a full window), so one buffer serves every
 * snapshot. save: the bytes written, 0 when cap is too small. load: 0, or
 * TERN_EFORMAT (truncated, bad magic, inconsistent sizes, id out of range),
 * TERN_EUNSUP (another version), TERN_EINVAL (a blob of another vocabulary,
 * or a window longer than this sampler keeps); on error s is unchanged. */
size_t sampler_state_size(const sampler_t *s);
size_t sampler_state_save(const sampler_t *s, void *buf, size_t cap);
int sampler_state_load(sampler_t *s, const void *buf, size_t len, tern_error_t *err);

#endif
