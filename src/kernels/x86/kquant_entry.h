/*
 * kquant_entry.h - the entry points of a K-format SIMD matvec file
 * (kquant_avx2_matvec.c, kquant_avx512_matvec.c). Included after the file has defined KQ_ISA (the name
 * suffix) and its two kernel templates, by default named
 *
 *   affine_kernel(nb, rows, nr, xa, stride, nc, out, is_q5)   Q4_K / Q5_K
 *   q6k_kernel(nb, rows, nr, xa, stride, nc, out, unused)     Q6_K
 *
 * (other names through KQ_AFFINE_KERNEL / KQ_Q6_KERNEL),
 * each computing nr rows x nc columns in lockstep into out[r * nc + c], the
 * same per-block function applied to every (row, column), so that no result
 * depends on the tile it was computed in. This file instantiates the tiles
 * (1 row x 1..4 columns for the table's dot; 2..4 rows x 1..2 columns for
 * the rows functions) and the dispatch over them (kq_dot: kquant_tiles.h).
 */
#ifndef KQ_ISA
#error "define KQ_ISA before including kquant_entry.h"
#endif

#define KQ_CAT2(a, b) a##_##b
#define KQ_CAT(a, b) KQ_CAT2(a, b)
#define KQ_NAME(n) KQ_CAT(n, KQ_ISA)

#include "kernels/x86/kquant_tiles.h"

/* Linkage of the tile tables and the rows entry points: static, unless the
 * file shares them with its GEMM half (then declared hidden in its header
 * and KQ_LINKAGE defined empty). */
#ifndef KQ_LINKAGE
#define KQ_LINKAGE static
#endif

#define KQ_TILE(fmt, kernel, q5, nr, nc)                                                               \
    static void fmt##_##nr##x##nc(int64_t nb, const void *const *w, const char *xa, size_t st, float *o) { \
        kernel(nb, w, nr, xa, st, nc, o, q5);                                                          \
    }
#define KQ_TILES(fmt, kernel, q5)                                                                                    \
    KQ_TILE(fmt, kernel, q5, 1, 1)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 1, 2)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 1, 3)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 1, 4)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 2, 1)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 2, 2)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 3, 1)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 3, 2)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 4, 1)                                                                                   \
    KQ_TILE(fmt, kernel, q5, 4, 2)                                                                                   \
    KQ_LINKAGE const kq_tile_fn fmt##_tiles[KQUANT_MAX_ROWS][KERN_MAX_COLS] = {                                     \
        {fmt##_1x1, fmt##_1x2, fmt##_1x3, fmt##_1x4},                                                                \
        {fmt##_2x1, fmt##_2x2, NULL, NULL},                                                                          \
        {fmt##_3x1, fmt##_3x2, NULL, NULL},                                                                          \
        {fmt##_4x1, fmt##_4x2, NULL, NULL}};

_Static_assert(KQUANT_MAX_ROWS == 4 && KERN_MAX_COLS == 4 && KQUANT_MAX_ACC >= 8, "tile table shape");

#ifndef KQ_AFFINE_KERNEL
#define KQ_AFFINE_KERNEL affine_kernel
#endif
#ifndef KQ_Q6_KERNEL
#define KQ_Q6_KERNEL q6k_kernel
#endif
KQ_TILES(q4k, KQ_AFFINE_KERNEL, 0)
KQ_TILES(q5k, KQ_AFFINE_KERNEL, 1)
KQ_TILES(q6k, KQ_Q6_KERNEL, 0)

/* Several rows in lockstep where a tile exists (up to 2 columns), else row
 * by row: the same bits either way. */
static void kq_dot_rows(int64_t k, const void *const *w, int nrows, const void *xa, size_t st, int ncols, float *out,
                        const kq_tile_fn tiles[KQUANT_MAX_ROWS][KERN_MAX_COLS]) {
    TERN_CHECK(k % QK_K == 0 && nrows >= 1 && nrows <= KQUANT_MAX_ROWS);
    if (ncols <= 0) return;
    if (ncols <= 2) {
        tiles[nrows - 1][ncols - 1](k / QK_K, w, (const char *)xa, st, out);
        return;
    }
    for (int r = 0; r < nrows; r++) kq_dot(k, w[r], xa, st, ncols, out + (size_t)r * ncols, tiles);
}

#define KQ_ENTRY(fmt, FMT)                                                                                         \
    static void KQ_NAME(dot_##FMT)(int64_t k, const void *w, const void *xa, size_t st, int ncols, float *out) {    \
        kq_dot(k, w, xa, st, ncols, out, fmt##_tiles);                                                             \
    }                                                                                                              \
    KQ_LINKAGE void KQ_NAME(dot_rows_##FMT)(int64_t k, const void *const *w, int nrows, const void *xa, size_t st,  \
                                        int ncols, float *out) {                                                   \
        kq_dot_rows(k, w, nrows, xa, st, ncols, out, fmt##_tiles);                                                 \
    }

KQ_ENTRY(q4k, q4_K)
KQ_ENTRY(q5k, q5_K)
KQ_ENTRY(q6k, q6_K)
