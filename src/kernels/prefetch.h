/*
 * prefetch.h - the weight-stream software prefetch of the x86 block and
 * float kernels (legacy_avx2.c, legacy_avx512.c, float_avx512.c). Only
 * SSE's _mm_prefetch is used, so any x86 kernel file may include it.
 */
#ifndef TERN_KERNELS_PREFETCH_H
#define TERN_KERNELS_PREFETCH_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Software prefetch distance for the weight stream. Decode is memory-bound,
 * and the block kernels spend enough ALU work per cache line that the
 * out-of-order window alone keeps too few lines in flight: a prefetch a few
 * KB ahead (past the row's end into the next row, which the drivers visit
 * next) took Q8_0 / Q4_0 single-thread matvec over a 1 GB matrix from about
 * half of a plain read loop's bandwidth to about 85% on the development
 * machine. Prefetches never fault, so reading past the matrix is harmless. */
#ifndef PF_DIST
#define PF_DIST 4096
#endif

/* Prefetch the lines PF_DIST bytes past the n bytes at p (the weights one
 * loop iteration consumes; n <= 128, a constant), so that every line of the
 * stream is asked for once or twice. */
static inline __attribute__((always_inline)) void prefetch_ahead(const char *p, size_t n) {
    /* Address arithmetic in integers: the target may lie past the object. */
    const uintptr_t a = (uintptr_t)p + PF_DIST;
    _mm_prefetch((const char *)a, _MM_HINT_T0);
    if (n > 64) _mm_prefetch((const char *)(a + 64), _MM_HINT_T0);
}

#endif
