/*
 * kquant_tiles.h - the tile function type of the K-format SIMD files and
 * kq_dot, one row against any number of columns through a tile table (in
 * groups of up to KERN_MAX_COLS). kquant_entry.h builds the tables; a GEMM
 * half that serves few columns through the matvec tiles includes this for
 * kq_dot alone. ISA-neutral (no intrinsics).
 */
#ifndef TERN_KERNELS_KQUANT_TILES_H
#define TERN_KERNELS_KQUANT_TILES_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "kernels/kquant.h"

/* nr rows (w[0..nr-1]) x nc columns of nb super-blocks: out[r * nc + c]. */
typedef void (*kq_tile_fn)(int64_t nb, const void *const *w, const char *xa, size_t st, float *out);

/* One row, any number of columns, in groups of up to KERN_MAX_COLS. */
__attribute__((unused, noinline)) static void kq_dot(int64_t k, const void *w, const void *xa, size_t st, int ncols, float *out,
                                                  const kq_tile_fn tiles[KQUANT_MAX_ROWS][KERN_MAX_COLS]) {
    TERN_CHECK(k % QK_K == 0);
    for (int c0 = 0; c0 < ncols; c0 += KERN_MAX_COLS) {
        const int nc = ncols - c0 < KERN_MAX_COLS ? ncols - c0 : KERN_MAX_COLS;
        tiles[0][nc - 1](k / QK_K, &w, (const char *)xa + (size_t)c0 * st, st, out + c0);
    }
}

#endif
