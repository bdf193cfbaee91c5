/*
 * float_gemm.h - the scaffolding of the float-weight GEMMs that
 * float_avx2.c and float_avx512.c share: the prep layout, the sizes, and
 * the loop nest of run; each file brings its register tile. Private to
 * those two files; include it after defining
 *
 *   enum { GEMM_RB, GEMM_TR, GEMM_TC }  rows per panel (a multiple of
 *       GEMM_TR) and the register tile, GEMM_TR rows x GEMM_TC columns;
 *   GEMM_TILE_BYTES  bytes of one tile's saved partial accumulators (a
 *       multiple of 32, written and read by the tile only);
 *   gemm_tile_all(w, x, len, part, first, last, y, ldy, rv, cv)  one tile
 *       over one k-chunk of len elements: w = its first weight row of the
 *       chunk (rows len floats apart), x = its first column (columns len
 *       floats apart); continues every chain of the tile (from +0.0 when
 *       first, else from part), stores them back to part unless last, and
 *       after the last chunk writes the rv x cv valid results to y[c * ldy
 *       + r].
 *
 * Layouts (see the files' headers for the float order they keep):
 *   - prep lays out a group of GEMM_GC = 16 columns as k-chunks of GEMM_KC
 *     elements (kpad = k rounded up to 16, the last chunk shorter, elements
 *     past k zero): chunk q holds, column after column, each column's
 *     elements [GEMM_KC q, GEMM_KC q + len_q); columns past the group's
 *     last are zero.
 *   - run converts GEMM_RB weight rows at a time to floats in the same
 *     chunked layout in its scratch (the panel; rows past the end and
 *     elements past k zero), followed by the partial accumulators of one
 *     (panel, group) block.
 *   - loop order of run: super-block of columns (as many groups as fit
 *     about GEMM_X_BYTES of prepped activations, which then stay in L2),
 *     8-row panel, group, k-chunk, then the tiles of the (panel, group)
 *     block. A chunk of the panel is packed right before the super-block's
 *     first group uses it, and the weights GEMM_PF_CHUNKS chunks ahead are
 *     prefetched into L2 meanwhile.
 */
#ifndef TERN_KERNELS_FLOAT_GEMM_H
#define TERN_KERNELS_FLOAT_GEMM_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#define GEMM_KC 256              /* elements per k-chunk (a multiple of 16) */
#define GEMM_GC KERN_GEMM_GROUP  /* columns per group, prep's unit */
_Static_assert(GEMM_KC % 16 == 0 && GEMM_RB % GEMM_TR == 0 && GEMM_GC % GEMM_TC == 0, "gemm blocking");
_Static_assert(GEMM_TILE_BYTES % 32 == 0, "tile partials stay aligned");

/* Columns per super-block: the prepped activations of one super-block
 * (about GEMM_X_BYTES) stay in L2 while every panel of the run passes over
 * them, so that for many columns they are not fetched again from L3 per
 * panel; the price is packing each panel once per super-block. At k = 4096
 * a super-block has 64 columns; it has at least one group of 16. */
#define GEMM_X_BYTES ((int64_t)1 << 20)
/* The weights of the chunk GEMM_PF_CHUNKS chunks ahead are prefetched into
 * L2 (not L1, which holds the block) while the first group runs its tiles. */
#define GEMM_PF_CHUNKS 2
/* Largest k for which the layouts' sizes are computed without overflow (far
 * beyond any model). */
#define GEMM_MAX_K ((int64_t)1 << 40)

/* Row length rounded up to whole 16-element steps. */
static inline int64_t gemm_kpad(int64_t k) {
    return (k + 15) & ~(int64_t)15;
}

/* Length of the chunk starting at element k0 (a multiple of GEMM_KC < kp).
 * In a chunked layout of `lines` lines (columns or rows), that chunk starts
 * at k0 * lines floats, since every chunk before it is a full one. */
static inline int64_t gemm_chunk_len(int64_t kp, int64_t k0) {
    return kp - k0 < GEMM_KC ? kp - k0 : GEMM_KC;
}

static size_t gemm_group_size(int64_t k) {
    if (k <= 0 || k > GEMM_MAX_K) return 0;
    return (size_t)gemm_kpad(k) * GEMM_GC * sizeof(float);
}

/* Scratch of run: the panel (GEMM_RB rows in the chunked layout, a multiple
 * of 64 bytes), then the partial accumulators of one block. */
static size_t gemm_scratch_size(int64_t k) {
    if (k <= 0 || k > GEMM_MAX_K) return 0;
    return (size_t)gemm_kpad(k) * GEMM_RB * sizeof(float) +
           (size_t)(GEMM_RB / GEMM_TR) * (GEMM_GC / GEMM_TC) * GEMM_TILE_BYTES;
}

static inline int64_t gemm_super_cols(int64_t kp) {
    const int64_t c = GEMM_X_BYTES / (kp * (int64_t)sizeof(float)) / GEMM_GC * GEMM_GC;
    return c < GEMM_GC ? GEMM_GC : c;
}

/* The group layout from ncols act rows (plain float copies). */
static void gemm_prep(int64_t k, const void *xa, size_t st, int ncols, void *xg) {
    const int64_t kp = gemm_kpad(k);
    float *dst = xg;
    for (int64_t k0 = 0; k0 < kp; k0 += GEMM_KC) {
        const int64_t len = gemm_chunk_len(kp, k0), v = k - k0 < len ? k - k0 : len;
        for (int c = 0; c < GEMM_GC; c++, dst += len) {
            int64_t done = 0;
            if (c < ncols) {
                memcpy(dst, (const float *)((const char *)xa + (size_t)c * st) + k0, (size_t)v * sizeof(float));
                done = v;
            }
            memset(dst + done, 0, (size_t)(len - done) * sizeof(float));
        }
    }
}

/* Pack one row's chunk: len floats (a multiple of 16) at dst, the first v
 * (0..len) converted from the weights at src, zeros after them. */
typedef void (*gemm_pack_fn)(const char *src, int64_t v, int64_t len, float *dst);

/* Ask for the bytes [p, p + n) into L2. Integer arithmetic: p may lie past
 * the matrix (prefetches never fault). */
static inline void gemm_prefetch(uintptr_t p, size_t n) {
    for (size_t b = 0; b < n; b += 64) _mm_prefetch((const char *)(p + b), _MM_HINT_T1);
}

/* kern_gemm_t.run of the three formats: they differ only in pack (and in
 * wsz, the bytes of one weight). */
static void gemm_run(const kern_gemm_args_t *a, const char *w, size_t row_bytes, int64_t nrows, float *y,
                     int64_t ldy, void *scratch, gemm_pack_fn pack, size_t wsz) {
    const int64_t k = a->k, n = a->n, kp = gemm_kpad(k);
    const int64_t nq = (kp + GEMM_KC - 1) / GEMM_KC; /* chunks per row */
    float *panel = scratch;
    /* 64-aligned: scratch is, and kp * GEMM_RB * 4 is a multiple of 64 */
    char *part = (char *)(panel + kp * GEMM_RB);
    const int64_t scols = gemm_super_cols(kp);
    for (int64_t s0 = 0; s0 < n; s0 += scols) {
        const int64_t s1 = n - s0 < scols ? n : s0 + scols;
        for (int64_t r0 = 0; r0 < nrows; r0 += GEMM_RB) {
            const int nr = nrows - r0 < GEMM_RB ? (int)(nrows - r0) : GEMM_RB;
            const int rtiles = (nr + GEMM_TR - 1) / GEMM_TR;
            for (int64_t c0 = s0; c0 < s1; c0 += GEMM_GC) {
                const int nc = s1 - c0 < GEMM_GC ? (int)(s1 - c0) : GEMM_GC;
                const int ctiles = (nc + GEMM_TC - 1) / GEMM_TC;
                const float *xg = (const float *)((const char *)a->xg + (size_t)(c0 / GEMM_GC) * a->xg_group);
                for (int64_t k0 = 0; k0 < kp; k0 += GEMM_KC) {
                    const int64_t len = gemm_chunk_len(kp, k0);
                    float *wq = panel + k0 * GEMM_RB;
                    const float *xq = xg + k0 * GEMM_GC;
                    const bool pack_now = c0 == s0, first = k0 == 0, last = k0 + len == kp;
                    if (pack_now) {
                        /* The super-block's first group is the first to use
                         * this chunk of the panel: pack it now (it stays in
                         * L1 for the tiles below). The rows past nr up to
                         * the last tile's end are zero. */
                        const int64_t v = k - k0 < len ? k - k0 : len;
                        for (int r = 0; r < rtiles * GEMM_TR; r++) {
                            const int64_t src = r < nr ? r0 + r : r0; /* a padding row reads nothing */
                            pack(w + (size_t)src * row_bytes + (size_t)k0 * wsz, r < nr ? v : 0, len,
                                 wq + r * len);
                        }
                    }
                    /* The weights to prefetch (while packing): those of the
                     * chunk GEMM_PF_CHUNKS on, counting on through the next
                     * panels (past the run's rows they are unused). */
                    const int64_t pq = k0 / GEMM_KC + GEMM_PF_CHUNKS;
                    const int64_t pk = pq % nq * GEMM_KC, prow = r0 + pq / nq * GEMM_RB;
                    const size_t pf = (size_t)gemm_chunk_len(kp, pk) * wsz;
                    for (int rt = 0; rt < rtiles; rt++) {
                        /* A row tile's share at a time, to spread them out. */
                        if (pack_now)
                            for (int r = rt * GEMM_TR; r < rt * GEMM_TR + GEMM_TR; r++)
                                gemm_prefetch((uintptr_t)w + (uintptr_t)(prow + r) * row_bytes + (uintptr_t)pk * wsz,
                                              pf);
                        for (int ct = 0; ct < ctiles; ct++)
                            gemm_tile_all(wq + rt * GEMM_TR * len, xq + ct * GEMM_TC * len, len,
                                          part + (size_t)(rt * (GEMM_GC / GEMM_TC) + ct) * GEMM_TILE_BYTES, first,
                                          last, y + (c0 + ct * GEMM_TC) * ldy + r0 + rt * GEMM_TR, ldy,
                                          nr - rt * GEMM_TR, nc - ct * GEMM_TC);
                    }
                }
            }
        }
    }
}

/* The kern_gemm_t of one format, from its pack function name##_pack. */
#define FLOAT_GEMM(name, wsz)                                                                            \
    static void name##_gemm_run(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, \
                                float *y, int64_t ldy, void *scratch) {                                  \
        gemm_run(a, w, row_bytes, nrows, y, ldy, scratch, name##_pack, wsz);                             \
    }                                                                                                    \
    static const kern_gemm_t name##_gemm = {gemm_group_size, gemm_prep, gemm_scratch_size, name##_gemm_run, 0, NULL};

#endif
