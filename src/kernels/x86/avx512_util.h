/*
 * avx512_util.h - small helpers shared by the AVX-512 kernel files
 * (legacy_avx512_*.c, float_avx512.c): horizontal sums in a fixed order, the
 * weight-stream prefetch, and the entry macros that instantiate a kernel
 * template for constant column / row counts. Include only from files
 * compiled with the AVX-512 flags.
 */
#ifndef TERN_KERNELS_AVX512_UTIL_H
#define TERN_KERNELS_AVX512_UTIL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "kernels/kernels.h"
#include "kernels/prefetch.h"
#include "kernels/x86/rows_entry.h"
#include "kernels/x86/x86_util.h"


/* Fixed order: upper 256 bits onto lower, then as hsum8. */
static inline float hsum16(__m512 v) {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8(_mm256_add_ps(lo, hi));
}

#define COLS_ENTRY(name, body) COLS_ENTRY_A(, name, body)
#define COLS_ENTRY_A(attr, name, body)                                                                   \
    attr static void name(int64_t k, const void *w, const void *xa, size_t st, int nc, float *out) {     \
        const char *x = xa;                                                                              \
        while (nc > 0) {                                                                                 \
            const int n = nc < KERN_MAX_COLS ? nc : KERN_MAX_COLS;                                       \
            switch (n) {                                                                                 \
            case 1: body(k, w, x, st, 1, out); break;                                                    \
            case 2: body(k, w, x, st, 2, out); break;                                                    \
            case 3: body(k, w, x, st, 3, out); break;                                                    \
            default: body(k, w, x, st, 4, out); break;                                                   \
            }                                                                                            \
            x += (size_t)n * st;                                                                         \
            out += n;                                                                                    \
            nc -= n;                                                                                     \
        }                                                                                                \
    }

#endif
