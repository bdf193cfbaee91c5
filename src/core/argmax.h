/*
 * argmax.h - the index of the largest float of a vector, as greedy
 * sampling and the benchmark's token feedback need it (a 152k-entry vocab
 * per sequence per step: the plain loop takes about 0.57 ms a row, 9 ms of
 * a 16-sequence decode step of a 0.5B model that takes 60-75 ms).
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

#endif
