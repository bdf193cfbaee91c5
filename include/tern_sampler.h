/*
 * tern_sampler.h - the sampler's parameters, public on their own so that the
 * library's sampler (src/text/) and applications share one definition
 * without the sampler including the whole engine API. tern.h includes it and
 * declares the sampler's functions.
 */
#ifndef TERN_SAMPLER_H
#define TERN_SAMPLER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The chain, in this order: repetition/frequency/presence penalties over the
 * last repeat_last_n accepted tokens; top-k; top-p; min-p; temperature;
 * draw. temp <= 0: greedy (highest logit after penalties, lowest id on a
 * tie). Each step is off at its neutral value (top_k <= 0, top_p >= 1,
 * min_p <= 0, penalties 1 / 0 / 0). */
typedef struct {
    float temp;              /* default 0.8 */
    int32_t top_k;           /* default 40 */
    float top_p;             /* default 0.95 */
    float min_p;             /* default 0.05 */
    float repeat_penalty;    /* default 1.0 (off) */
    int32_t repeat_last_n;   /* default 64 */
    float presence_penalty;  /* default 0 */
    float frequency_penalty; /* default 0 */
    uint64_t seed;           /* same seed + model + prompt -> same output */
} tern_sampler_params_t;

#ifdef __cplusplus
}
#endif
#endif /* TERN_SAMPLER_H */
