/*
 * prefetch.h - the weight-stream software prefetch of the x86 kernels
 * (legacy_*, float_*, kquant_* for AVX2 and AVX-512) and its distance,
 * which matvec.c also uses (its start-of-stream prefetch covers the bytes
 * the kernels' own prefetches skip). Only SSE's _mm_prefetch is used, so
 * any x86 kernel file may include it; elsewhere only PF_DIST is defined.
 */
#ifndef TERN_KERNELS_PREFETCH_H
#define TERN_KERNELS_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/inline.h"

/* Software prefetch distance for the weight stream. Decode is memory-bound,
 * and the block kernels spend enough ALU work per cache line that the
 * out-of-order window alone keeps too few lines in flight: a prefetch a few
 * KB ahead (past the row's end into the next row, which the drivers visit
 * next) took Q8_0 / Q4_0 single-thread matvec over a 1 GB matrix from about
 * half of a plain read loop's bandwidth to about 85%. With four streams per
 * thread (matvec.c), 2 KB ahead reads 1-4% faster than 4 KB at 2 threads
 * for every format and both ISAs, 512 bytes up to 4% slower
 * (scripts/ab-prefetch.sh, docs/PERF.md). Prefetches never fault, so
 * reading past the matrix is harmless. */
#ifndef PF_DIST
#define PF_DIST 2048
#endif

#if defined(__x86_64__)
#include <immintrin.h>

/* Prefetch every line of the n bytes PF_DIST past p: the weights one loop
 * iteration consumes (a cache line or a block group: n a constant, so the
 * loop unrolls to one or two prefetches) or a K-quant superblock. Address
 * arithmetic in integers: the target may lie past the object. */
TERN_INLINE void prefetch_ahead(const void *p, size_t n) {
    const uintptr_t a = (uintptr_t)p + PF_DIST;
    for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)(a + o), _MM_HINT_T0);
}
#endif

#endif
