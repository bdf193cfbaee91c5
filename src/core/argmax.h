/*
 * argmax.h - scans over a vector of floats that sampling does once per
 * sequence per step over the whole vocabulary (152k entries): the index of
 * the largest value (greedy sampling, the benchmark's token feedback; the
 * plain loop takes about 0.57 ms a row, 9 ms of a 16-sequence decode step
 * of a 0.5B model that takes 60-75 ms), and the next value above a
 * threshold (top-k's selection, which rejects almost every entry).
 */
#ifndef TERN_CORE_ARGMAX_H
#define TERN_CORE_ARGMAX_H

#include <stdint.h>

/* The result of this loop, which is the definition (argmax_f32_ref):
 *     best = 0; for v in 1..n-1: if x[v] > x[best] then best = v
 * that is, the first index of the largest value, NaNs never chosen past
 * index 0 (0 when x[0] is NaN, or n <= 1). argmax_f32 gives the same index
 * for every input, with AVX2 where the CPU has it. */
int32_t argmax_f32(const float *x, int32_t n);
int32_t argmax_f32_ref(const float *x, int32_t n);

/* The first index j in [i, n) with x[j] > t (an ordered comparison: never
 * a NaN, nothing when t is NaN), or n when there is none (i < 0 counts as 0; i >= n gives n).
 * f32_next_above_ref is this loop; f32_next_above gives the same index for
 * every input, with AVX2 where the CPU has it. */
int32_t f32_next_above(const float *x, int32_t i, int32_t n, float t);
int32_t f32_next_above_ref(const float *x, int32_t i, int32_t n, float t);

#endif
