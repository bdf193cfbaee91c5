/*
 * tern_sampler.h - the sampler's chain, parameters and types, public on their
 * own so that the library's sampler (src/text/) and applications share one
 * definition without the sampler including the whole engine API. tern.h
 * includes it and declares the sampler's functions.
 */
#ifndef TERN_SAMPLER_H
#define TERN_SAMPLER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the chain --------------------------------------------------------
 *
 * A sampler is an ordered chain of stages over the candidate tokens
 * (initially every id, in id order, with the model's logits; the caller's
 * logits are never modified). tern_sampler_create builds the default chain
 * from tern_sampler_params_t, always in this order (llama.cpp's, so the same
 * flags mean the same thing):
 *
 *   1. MASK        the application's mask callback (tern_sampler_set_mask;
 *                  a grammar fills it): sets disallowed logits to -INFINITY
 *   2. LOGIT_BIAS  logit += bias for listed ids (tern_sampler_set_logit_bias;
 *                  -INFINITY bans)
 *   3. PENALTIES   over the last repeat_last_n accepted ids:
 *                    repetition: l / repeat_penalty if l > 0, else l * repeat_penalty;
 *                    frequency:  l -= frequency_penalty * count;
 *                    presence:   l -= presence_penalty (once, when count > 0)
 *   4. TOP_K       keep the top_k highest logits
 *   5. TOP_P       keep the smallest prefix (by descending probability) whose
 *                  mass reaches top_p
 *   6. MIN_P       drop tokens whose probability is below min_p times the top one's
 *   7. TEMP        from here on probabilities are softmax(logit / temp)
 *   8. DIST        draw one token from the seeded RNG (one draw per sample)
 *
 * or, with temp <= 0, MASK, LOGIT_BIAS, PENALTIES, GREEDY (the highest logit,
 * the lowest id on a tie). A stage at its neutral value does nothing (no
 * mask set, no bias, penalties 1 / 0 / 0 or repeat_last_n 0, top_k <= 0,
 * top_p >= 1, min_p <= 0). After MASK and LOGIT_BIAS, candidates at
 * -INFINITY (or NaN) are removed; when none is left, sampling fails (-1).
 * Truncations always keep at least the best token. Candidates with equal
 * logits are ordered by id (NaNs after every number), so no step depends on
 * a sort algorithm: the same seed, model and prompt give the same tokens.
 *
 * Probabilities (TOP_P and DIST, over the candidates the stage receives):
 * e_i = tern's exp((logit_i - max) / temp), a fixed sequence of float
 * operations (src/text/softmax.h) rather than the C library's expf, so
 * every CPU and build gets the same bits; sum = the e_i added in double in
 * the candidates' order at that point (id order unless TOP_K or an earlier
 * truncation sorted them), in 8 interleaved partial sums; candidate i's
 * probability is (float)(e_i / sum), accumulated in double over the
 * candidates sorted best first (TOP_P stops at the first cumulative sum >=
 * top_p; DIST at the first one above its uniform draw in [0, 1)). A
 * TOP_K at its neutral value keeps the candidates in their order.
 *
 * tern_sampler_create_chain takes the stages and their order from the
 * application (each kind at most once, DIST or GREEDY last and only there),
 * with their parameters from tern_sampler_params_t (fields of stages not in
 * the chain are ignored). Any order works: MASK, LOGIT_BIAS and PENALTIES
 * also apply to a truncated candidate set; TEMP sets the temperature that
 * later TOP_P, MIN_P and DIST use (before it, they work at temperature 1),
 * and does not rescale the stored logits, so a bias after TEMP adds to the
 * unscaled logit. */
typedef enum {
    TERN_STAGE_MASK = 0,
    TERN_STAGE_LOGIT_BIAS = 1,
    TERN_STAGE_PENALTIES = 2,
    TERN_STAGE_TOP_K = 3,
    TERN_STAGE_TOP_P = 4,
    TERN_STAGE_MIN_P = 5,
    TERN_STAGE_TEMP = 6,
    TERN_STAGE_DIST = 7,
    TERN_STAGE_GREEDY = 8
} tern_sampler_stage_t;
#define TERN_SAMPLER_MAX_STAGES 9 /* one of each kind */

typedef struct {
    float temp;              /* default 0.8; <= 0: greedy (default chain) */
    int32_t top_k;           /* default 40 */
    float top_p;             /* default 0.95 */
    float min_p;             /* default 0.05 */
    float repeat_penalty;    /* default 1.0 (off) */
    int32_t repeat_last_n;   /* default 64: the penalty window's capacity */
    float presence_penalty;  /* default 0 */
    float frequency_penalty; /* default 0 */
    uint64_t seed;           /* same seed + model + prompt -> same output */
} tern_sampler_params_t;

/* A candidate token, as the MASK stage sees it. */
typedef struct {
    int32_t id;
    float logit;
} tern_token_logit_t;

/* The MASK stage: set the logit of every candidate the application does not
 * allow to -INFINITY; leave the others, and every id, alone. In the default
 * chain it runs first, on all n_vocab ids in id order (cand[i].id == i); in
 * a custom chain after a truncation, on the survivors in any order. Return
 * 0, or nonzero to fail the sample (tern_sampler_sample returns -1). Called
 * on the thread that samples, once per sample. */
typedef int (*tern_mask_fn)(void *user, tern_token_logit_t *cand, int32_t n_cand);

/* One LOGIT_BIAS entry: logit += bias for token (-INFINITY bans it; entries
 * for the same token add up). */
typedef struct {
    int32_t token;
    float bias;
} tern_logit_bias_t;

/* The sampler's state (not its configuration) as a byte blob a session
 * file can hold: the RNG position and the penalty window (the counts follow
 * from it). Little-endian, versioned, TERN_SAMPLER_STATE_HEADER bytes then
 * the window:
 *   "TSMP", u32 version (1), u32 n_vocab, u32 window capacity (the saver's
 *   repeat_last_n), u64 rng, u32 n (ids in the window), n x u32 ids
 *   (oldest first). A blob loads into any sampler of the same vocabulary
 *   size whose repeat_last_n holds its n ids.
 * Loading validates everything (hostile input) and changes nothing on
 * error. Restoring a snapshot and sampling from the same logits repeats the
 * same tokens: speculative decoding rolls back rejected drafts this way. */
#define TERN_SAMPLER_STATE_HEADER 28

#ifdef __cplusplus
}
#endif
#endif /* TERN_SAMPLER_H */
