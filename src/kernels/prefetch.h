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
 * next) brings the single-thread matvec close to a plain read loop's
 * bandwidth; 2 KB is the distance chosen with four streams per thread
 * (matvec.c) by dev/ab-prefetch.sh (measured: docs/PERF.md).
 * Prefetches never fault, so reading past the matrix is harmless. */
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
