/*
 * rows_entry.h - ROWS_ENTRY(name, body, dot): the kern_rows_fn of a 32-block
 * or float kernel file (legacy_avx2_matvec.c, legacy_avx512_matvec.c, float_avx2.c, float_avx512.c),
 * instantiating the file's lockstep template `body(k, w, nr, xa, st, nc,
 * out)` for constant row and column counts. ISA-neutral (no intrinsics);
 * ROWS_ENTRY_A adds a function attribute (e.g. a target) to the entry.
 */
#ifndef TERN_KERNELS_ROWS_ENTRY_H
#define TERN_KERNELS_ROWS_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "kernels/kernels.h"

/* rows x columns tiles with constant counts (2..4 rows x 1..2 columns);
 * one row, or more than two columns, go to the dot row by row. */
#define ROWS_ENTRY(name, body, dot) ROWS_ENTRY_A(, name, body, dot)
#define ROWS_ENTRY_A(attr, name, body, dot)                                                              \
    attr static void name(int64_t k, const void *const *w, int nr, const void *xa, size_t st, int nc,    \
                          float *out) {                                                                  \
        TERN_CHECK(nr >= 1 && nr <= KERN_MAX_ROWS && nc >= 1);                                           \
        const char *x = xa;                                                                              \
        if (nr == 1 || nc > 2) {                                                                         \
            for (int r = 0; r < nr; r++) dot(k, w[r], xa, st, nc, out + (size_t)r * (size_t)nc);         \
            return;                                                                                      \
        }                                                                                                \
        switch (nr * 4 + nc) {                                                                           \
        case 9: body(k, w, 2, x, st, 1, out); break;                                                     \
        case 10: body(k, w, 2, x, st, 2, out); break;                                                    \
        case 13: body(k, w, 3, x, st, 1, out); break;                                                    \
        case 14: body(k, w, 3, x, st, 2, out); break;                                                    \
        case 17: body(k, w, 4, x, st, 1, out); break;                                                    \
        default: body(k, w, 4, x, st, 2, out); break;                                                    \
        }                                                                                                \
    }

#endif
