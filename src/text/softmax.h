/*
 * softmax.h - the arithmetic of the sampler's probabilities (sampler.c),
 * defined so that every CPU gets the same bits: tern's own exp (a fixed
 * sequence of IEEE operations, not the C library's expf, whose last bit
 * differs between libraries and between its FMA and plain builds), and a
 * sum in a fixed order. The vector forms (AVX2 + FMA where the CPU has
 * both) compute exactly the scalar definitions below; the tests compare
 * them over many inputs.
 *
 * The candidates are tern_token_logit_t pairs; these functions take the
 * array as it is (c: n pairs) and read each pair's logit.
 */
#ifndef TERN_TEXT_SOFTMAX_H
#define TERN_TEXT_SOFTMAX_H

#include <stdbool.h>
#include <stdint.h>

#include "tern_sampler.h"

/* exp(x) for sampling, defined as: x NaN: x (the NaN); x < -87: +0; else
 * core/fexp.h's polynomial of min(x, 88) (every step one IEEE operation;
 * relative error below about two float ulps; exp(0) = 1 exactly;
 * monotonic is not promised, and nothing here relies on it). */
float tern_expf(float x);

/* The largest non-NaN logit of c[0..n) into *max (-INFINITY when there is
 * none); true when every logit is finite (no NaN, no infinity).
 * softmax_max_ref is the loop. */
bool softmax_max(const tern_token_logit_t *c, int32_t n, float *max);
bool softmax_max_ref(const tern_token_logit_t *c, int32_t n, float *max);

/* S = the sum of e_i = tern_expf((c[i].logit - m) / t) over i < n, in
 * double, as 8 striped partial sums: s_j = e_j + e_{j+8} + e_{j+16} + ...
 * (in increasing i, each e_i converted to double and added in turn), then
 * S = ((s_0 + s_1) + (s_2 + s_3)) + ((s_4 + s_5) + (s_6 + s_7)).
 * softmax_sum_ref is this definition written out plainly. */
double softmax_sum(const tern_token_logit_t *c, int32_t n, float m, float t);
double softmax_sum_ref(const tern_token_logit_t *c, int32_t n, float m, float t);

/* The walks' probabilities: p[i] = (float)(e_i / sum) (e_i as above, the
 * quotient in double, rounded to float), stored as double, for i < n.
 * softmax_probs_ref is the loop. */
void softmax_probs(const tern_token_logit_t *c, int32_t n, float m, float t, double sum, double *p);
void softmax_probs_ref(const tern_token_logit_t *c, int32_t n, float m, float t, double sum, double *p);

/* The candidates of c[0..n) with lo <= logit < hi, in order, into out;
 * returns their count. softmax_collect_ref is the loop. */
int32_t softmax_collect(const tern_token_logit_t *c, int32_t n, float lo, float hi, tern_token_logit_t *out);
int32_t softmax_collect_ref(const tern_token_logit_t *c, int32_t n, float lo, float hi, tern_token_logit_t *out);

/* The sum of the walks' probabilities (softmax_probs) of c[0..n), in
 * double in index order, and the smallest of them into *minp (+INFINITY for
 * n = 0). Every p_i >= 2^-29 is a float whose bits are multiples of 2^-52,
 * so sums of such values below 2 are exact in double, in any order: when
 * *minp >= SOFTMAX_EXACT_P, a walk that adds these probabilities in any
 * other order reaches this same sum. */
#define SOFTMAX_EXACT_P 0x1p-29f
double softmax_mass(const tern_token_logit_t *c, int32_t n, float m, float t, double sum, float *minp);

/* For the tests: the vector exp on 8 values at x (out[0..7]) when the CPU
 * has AVX2 and FMA (returns true), else false and out untouched. */
bool tern_expf8_vec(const float *x, float *out);

#endif
