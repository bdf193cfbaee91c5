/*
 * avx2_util.h - private to the AVX2 kernel files (compiled with -mavx2 -mfma
 * -mf16c): the fixed horizontal sum and the column-count dispatcher they
 * share.
 */
#ifndef TERN_KERNELS_AVX2_UTIL_H
#define TERN_KERNELS_AVX2_UTIL_H

#include "kernels/x86/x86_util.h"

/* Serve any column count in groups of at most maxc columns, each group with
 * a body specialised for its exact count. */
#define COLS_ENTRY(name, body, maxc)                                                                     \
    static void name(int64_t k, const void *w, const void *xa, size_t st, int nc, float *out) {          \
        const char *x = xa;                                                                              \
        while (nc > 0) {                                                                                 \
            const int n = nc < (maxc) ? nc : (maxc);                                                     \
            /* (maxc) is a constant: bodies for counts above it are never built */                      \
            if (n == 1)                                                                                  \
                body(k, w, x, st, 1, out);                                                               \
            else if (n == 2 || (maxc) < 3)                                                               \
                body(k, w, x, st, 2, out);                                                               \
            else if (n == 3 || (maxc) < 4)                                                               \
                body(k, w, x, st, 3, out);                                                               \
            else                                                                                         \
                body(k, w, x, st, 4, out);                                                               \
            x += (size_t)n * st;                                                                         \
            out += n;                                                                                    \
            nc -= n;                                                                                     \
        }                                                                                                \
    }

#endif
