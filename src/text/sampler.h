/*
 * sampler.h - choosing the next token from logits: greedy, or a fixed chain
 * of penalties and truncations followed by a draw from a seeded RNG.
 *
 * The chain, always in this order (llama.cpp's default order, so the same
 * flags mean the same thing):
 *   1. penalties over the last repeat_last_n accepted tokens:
 *        repetition: a logit l of a token seen in the window becomes
 *                    l / repeat_penalty if l > 0, else l * repeat_penalty;
 *        frequency:  l -= frequency_penalty * count;
 *        presence:   l -= presence_penalty (once, when count > 0)
 *   2. top-k: keep the k highest logits (k <= 0: all)
 *   3. top-p: keep the smallest prefix (by descending probability at
 *      temperature 1) whose mass reaches top_p (>= 1: off)
 *   4. min-p: drop tokens whose probability is below min_p times the top
 *      one's (<= 0: off)
 *   5. temperature: divide the logits by temp; then softmax and draw.
 * temp <= 0 means greedy: after the penalties, the highest logit wins (ties:
 * the lowest id). Truncation always keeps at least one token.
 *
 * Reproducibility: the RNG is splitmix64 seeded from params.seed; one draw
 * per sampled token, so the same seed, model and prompt give the same text.
 * Candidates with equal logits are ordered by id, so no step depends on the
 * sort algorithm.
 */
#ifndef TERN_TEXT_SAMPLER_H
#define TERN_TEXT_SAMPLER_H

#include <stdint.h>

#include "tern_sampler.h"
#include "tern_error.h"

typedef struct sampler sampler_t;

/* params: see tern_sampler_params_t in tern_sampler.h. NULL on error (bad parameter
 * named in err). */
sampler_t *sampler_new(const tern_sampler_params_t *p, int32_t n_vocab, tern_error_t *err);
void sampler_free(sampler_t *s);
/* Pick a token from n_vocab logits (not modified). */
int32_t sampler_sample(sampler_t *s, const float *logits);
/* Record an accepted token (prompt or generated) in the penalty window. */
void sampler_accept(sampler_t *s, int32_t id);
/* Empty the window and reseed. */
void sampler_reset(sampler_t *s);
/* Uniform double in [0, 1) from the sampler's RNG (exposed for tests). */
double sampler_uniform(sampler_t *s);

#endif
