/*
 * legacy_avx2_gemm.c - the AVX2 GEMMs (kern_gemm_t) of the 32-element block
 * formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, for n >= KERN_GEMM_MIN_COLS
 * columns, in two builds: plain AVX2, and AVX-VNNI (tiles with target
 * "avxvnni", registered by legacy_avx2_matvec.c only where the CPU has it
 * and the options allow it). Every (row, column) takes THE FLOAT ORDER
 * stated at the top of legacy_avx2_matvec.c (one exact int32 per block,
 * one FMA per block into chain b mod 4), so the GEMMs give the bits of the
 * dot; legacy_avx2.h holds the layout helpers both files share.
 *
 * GEMM (n >= KERN_GEMM_MIN_COLS), lanes = 8 columns:
 *  - prep lays out each group of 16 columns so that, per block, one vector
 *    holds the same 4-byte k-slice of 8 columns (an 8 x 8 dword transpose
 *    per octet and block), followed by the 16 columns' d and: Q4_0 / Q5_0,
 *    the offset correction already in maddubs' int16 lanes (-8 / -16 times
 *    the sums of the activations each lane meets); Q8_1 acts, their s.
 *    Q8_0 weights get the acts sign-extended to int16, one vector per
 *    element pair and octet (no sign trick, no maddubs saturation limit).
 *  - run decodes row blocks of about GEMM_PANEL_BYTES (small enough to stay
 *    in L1 with an act chunk; the next block's raw rows are prefetched into
 *    L2 meanwhile) into quants in element order (Q4 / Q5: unsigned bytes;
 *    Q8_0: int16) and float scales, then per column group, k-chunk (whose
 *    activations stay in L1; accumulators saved between chunks, exact) and
 *    tile of 4 rows (Q5_1: 2) x 2 column octets, block by block: per
 *    k-slice one maddubs per (row, octet) with the weights' dword
 *    broadcast, summed in int16 (vpaddw wraps, so only each lane's final
 *    value must fit: Q4_0 / Q5_0 start from the correction and end at
 *    |sum (q - off) a| <= 16 * 16 * 127 < 2^15; Q4_1: 16 * 15 * 127;
 *    Q5_1: two sums of 8 products), one madd with ones = I for 8 columns
 *    (Q8_0: one madd per element pair and octet, summed in int32); then
 *    acc[o][j] = fma(float(I), d_w * d_a, acc[o][j]) (and the min FMA):
 *    the same float steps as above. Per block, row and 16 columns that is
 *    40 vector ALU uops for the Q4 / Q5 formats (16 maddubs, 14-16 adds,
 *    2 madds, 2 converts, 2 multiplies, 2-4 FMAs) and 68 for Q8_0 (32
 *    madds, 30 adds, 6 float): on a core with three vector ALU ports that
 *    count, not the loads, is the bound (measured).
 *  - A group of at most 8 columns (batched decode of 5-8 sequences, the
 *    last group of a GEMM) runs octet 0 only, in tiles of up to 8 rows
 *    (the same registers as 4 rows x 2 octets): the second octet's lanes
 *    would be zeros, and computing them doubled the time of 5-8 columns
 *    (measured: docs/PERF.md). Per block and row that is 8 maddubs, 8
 *    weight broadcasts and 8 adds; on Zen 3 those three alone take most of
 *    what the whole block takes (docs/PERF.md): only fewer instructions
 *    per product could make it faster (a layout sharing each broadcast
 *    between two maddubs was timed as an instruction mix and did not
 *    separate from this one).
 *
 * GEMM with AVX-VNNI: vpdpbusd (unsigned x signed bytes, summed in int32,
 * never saturating) replaces maddubs + add + madd. The weights are the
 * unsigned operand: the decoded rows hold q (Q4 / Q5) or w + 128 (Q8_0) as
 * bytes; prep lays out every format as the Q4 layout above, its x for the
 * offset formats (Q4_0 / Q5_0 / Q8_0: off = 8 / 16 / 128) being one int32
 * per column, -off * (the sum of the column's 32 quants), the start value
 * of the sums: I = sum (w + off) a - off sum a, exact (every partial sum
 * within 32 * 255 * 127 + 128 * 32 * 127 < 2^31). Per k-slice one vpdpbusd
 * per (row, column octet); tiles of 3 rows x 2 octets (6 int32 sums, 6
 * float accumulators, 2 activation vectors, a broadcast: 15 registers), and
 * blocks taken chain by chain (blocks j, j + 4, ... of the k-chunk for
 * chain j), so the accumulators stay in registers over the chunk; every
 * chain still sees its blocks in increasing order and the float steps are
 * the ones above, so the results are those of the plain GEMM. Per block,
 * row and 16 columns: 16 vpdpbusd, 2 converts, 2 multiplies, 2 (min
 * formats: 4) FMAs, all on the two FMA ports (measured against the plain
 * GEMM: docs/PERF.md).
 *
 * Exactness relies on |a| <= 127 for the activation quants (the act fns
 * clamp to +-127), as maddubs must never saturate.
 */
#if defined(__x86_64__)

#include "kernels/x86/legacy_avx2.h"

/* ---- GEMM ------------------------------------------------------------------ */

/* GCC's temporary-expression replacement (TER) expands each single-use
 * chain of int16 adds below at its last use, after every maddubs of the
 * block: 16-32 live vectors, spilled. Without it the adds stay next to their
 * maddubs, and the GEMMs run faster (measured: docs/PERF.md). Clang does
 * not need this. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-tree-ter")
#endif

/* Full unrolling of the loops over a tile's rows (nt: a constant 1..4 in
 * every instance). Clang unrolls a loop with "GCC unroll N" only by a
 * factor N, so not at all a trip count below N (the 3-row VNNI tiles and
 * the 2-row Q5_1 ones ran far slower; measured: docs/PERF.md); its own
 * pragma without a count unrolls any constant trip count fully. */
#if defined(__clang__)
#define UNROLL_NT _Pragma("unroll")
#else
#define UNROLL_NT _Pragma("GCC unroll 8")
#endif

/* prep's layout of one group of 16 columns, per block b:
 * Q4 / Q5 weights (GA_BYTES):
 *   int8  q[2][8][32]  octet o (columns 8o..8o+7), k-slice t (elements
 *                      4t..4t+3 of the block): dword c = column 8o+c's
 *                      four quants
 *   float d[16]        column c's d of block b
 *   x[16]              Q4_0 / Q5_0 (shift sh = 3 / 4): the offset
 *                      correction in maddubs' int16 lanes: column c's
 *                      dword holds -2^sh times the sum of bytes 0..1 (low
 *                      int16) / 2..3 (high) of its eight k-slice dwords;
 *                      Q4_1 / Q5_1: float s (Q8_1 acts)
 * Q8_0 weights (GA8_BYTES):
 *   int16 a[2][16][16] octet o, element pair p (elements 2p, 2p+1): dword c
 *                      = column 8o+c's two quants, sign-extended
 *   float d[16]
 * Columns past the last are zeros (computed on, never stored). */
enum { GA_OFF_D = 512, GA_OFF_X = 576, GA_BYTES = 640, GA8_OFF_D = 1024, GA8_BYTES = 1088 };
TERN_INLINE size_t f_ga(int f, bool v) {
    return f == FMT_Q8_0 && !v ? GA8_BYTES : GA_BYTES;
}
/* Blocks per k-chunk: a chunk of one column group's activations (20 KB,
 * Q8_0: 17 KB) stays in L1 while the rows of a row block pass over it (the
 * accumulators are saved between chunks: exact). */
TERN_INLINE int64_t f_kc(int f, bool v) {
    return f == FMT_Q8_0 && !v ? 16 : 32;
}
/* Bytes of decoded weight rows per row block (at least 4 rows): small
 * enough that the block and an act chunk share L1 while every column
 * group passes over them; a larger block spends its decode time on
 * write-backs to L2 (measured: docs/PERF.md). */
#define GEMM_PANEL_BYTES (20 * 1024)
/* Accumulators of one row: 2 octets x 4 chains (acc[o][j] at 8 * (4o + j)). */
#define GEMM_STATE 256
/* Rows per register tile (at most): 4 rows x 2 octets, 8 int16 sums in
 * flight, each activation vector loaded once for 4 rows. */
#define GEMM_NT 4
/* ... and on one octet (a group of at most 8 columns: half the sums per
 * row, so twice the rows in the same registers). */
#define GEMM_NT1 (2 * GEMM_NT)
/* The AVX-VNNI GEMM (v): rows per tile (3 rows x 2 octets: 6 float
 * accumulators, 6 int32 sums, 2 activation vectors and a broadcast, all in
 * registers; 2 rows and 4 rows (spilling) were slower, measured:
 * docs/PERF.md),
 * and log2 of the weight offset its unsigned weights carry (Q8_0: w + 128).
 * Its prep layout is the Q4 / Q5 one for every format, with x = -2^sh
 * times the sum of the column's 32 quants (int32) for the offset formats,
 * and its decoded rows hold 32 unsigned bytes per block. */
#define VNNI_NT 3
TERN_INLINE int f_vsh(int f) {
    return f == FMT_Q8_0 ? 7 : f_sh(f);
}
/* Plain: Q5_1 takes 2 rows, its int16 sums plus int32 partials would want
 * 16 registers at 4 rows (2 rows faster, measured: docs/PERF.md). */
TERN_INLINE int64_t f_nt(int f, bool v) {
    return v ? VNNI_NT : f == FMT_Q5_1 ? 2 : GEMM_NT;
}

/* A decoded row (run's scratch): per block f_dq bytes of quants in element
 * order (Q4 / Q5: q; Q8_0: w as int16), then float d[nb] and (min formats)
 * float m[nb]; rows 64-aligned. */
TERN_INLINE size_t f_dq(int f, bool v) {
    return f == FMT_Q8_0 && !v ? 64 : 32;
}
TERN_INLINE size_t gemm_row_bytes(int64_t nb, int f, bool v) {
    return ((size_t)nb * (f_dq(f, v) + (f_min(f) ? 8 : 4)) + 63) & ~(size_t)63;
}
/* The VNNI GEMM's row blocks: the same panel bytes, in whole tiles of
 * VNNI_NT rows, at least two (a row block of 4 rows at k = 4096 would run
 * every other tile with one row). */
TERN_INLINE int64_t gemm_rows(int64_t k, int f, bool v) {
    if (v) {
        int64_t rb = GEMM_PANEL_BYTES / (int64_t)gemm_row_bytes(k / QK, f, v);
        rb -= rb % VNNI_NT;
        return rb < 2 * VNNI_NT ? 2 * VNNI_NT : rb > 21 * VNNI_NT ? 21 * VNNI_NT : rb;
    }
    const int64_t rb = GEMM_PANEL_BYTES / (int64_t)gemm_row_bytes(k / QK, f, v);
    return rb < 4 ? 4 : rb > 64 ? 64 : rb;
}
TERN_INLINE size_t gemm_scratch(int64_t k, int f, bool v) {
    return (size_t)gemm_rows(k, f, v) * (gemm_row_bytes(k / QK, f, v) + GEMM_STATE);
}

/* Row w (nb blocks) decoded into dst. */
TERN_INLINE void gemm_dec_row(const uint8_t *w, int64_t nb, char *dst, int f, bool v) {
    const size_t bs = f_bsz(f), dq = f_dq(f, v);
    float *d = (float *)(dst + (size_t)nb * dq), *m = d + nb;
    if (f == FMT_Q8_0 && v) { /* w + 128 as unsigned bytes */
        const __m128i flip = _mm_set1_epi8((char)0x80);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + (size_t)b * bs;
            char *q = dst + (size_t)b * dq;
            _mm_storeu_si128((__m128i *)q, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS)), flip));
            _mm_storeu_si128((__m128i *)(q + 16), _mm_xor_si128(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS_HI)), flip));
            uint16_t h;
            memcpy(&h, p, 2);
            d[b] = *LUT(h);
        }
        return;
    }
    if (f == FMT_Q8_0) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + (size_t)b * bs;
            char *q = dst + (size_t)b * dq;
            _mm256_storeu_si256((__m256i *)q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS))));
            _mm256_storeu_si256((__m256i *)(q + 32), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + Q8_0_QS_HI))));
            uint16_t h;
            memcpy(&h, p, 2);
            d[b] = *LUT(h);
        }
        return;
    }
    for (int64_t b = 0; b < nb; b += 2) {
        const uint8_t *p = w + (size_t)b * bs;
        const wpair_t x = wdec(p, f, b + 1 < nb ? 2 : 1); /* a lone last block: the pair's other half zero */
        char *q = dst + (size_t)b * dq;
        _mm256_storeu_si256((__m256i *)q, _mm256_permute2x128_si256(x.lo, x.hi, 0x20));
        uint16_t h;
        memcpy(&h, p, 2);
        d[b] = *LUT(h);
        if (f_min(f)) memcpy(&h, p + 2, 2), m[b] = *LUT(h);
        if (b + 1 < nb) {
            _mm256_storeu_si256((__m256i *)(q + dq), _mm256_permute2x128_si256(x.lo, x.hi, 0x31));
            memcpy(&h, p + bs, 2);
            d[b + 1] = *LUT(h);
            if (f_min(f)) memcpy(&h, p + bs + 2, 2), m[b + 1] = *LUT(h);
        }
    }
}

TERN_INLINE __m256i bcast32(const char *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* I of nt (1..GEMM_NT) decoded rows q[r] (block b's quants) against the 16
 * columns' block at xb: i[r][o] = octet o's 8 exact int32 block dots.
 * Q4 / Q5: per k-slice t, one maddubs per (row, octet) with the weights'
 * dword broadcast, summed in int16; vpaddw wraps, so only each lane's final
 * value must fit: Q4_0 / Q5_0 start from prep's correction and end at
 * sum (q - off) * a over the lane's 16 products, |.| <= 16 * 16 * 127 <
 * 2^15; Q4_1: sum q * a <= 16 * 15 * 127; Q5_1 (q <= 31): two sums of 8
 * products (k-slices 0..3, 4..7), each widened. Then one madd with ones.
 * Q8_0: per element pair, one madd of the int16 weight pair's broadcast
 * against the int16 acts, summed in int32. */
TERN_INLINE void gemm_int(const char *const *q, int nt, const char *xb, int f, const int no, __m256i i[GEMM_NT1][2]) {
    if (f == FMT_Q8_0) {
        _Pragma("GCC unroll 16") for (int p = 0; p < 16; p++) {
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(xb + 32 * p));
            const __m256i a1 = no == 2 ? _mm256_loadu_si256((const __m256i *)(xb + 512 + 32 * p)) : a0;
            UNROLL_NT for (int r = 0; r < nt; r++) {
                const __m256i w = bcast32(q[r] + 4 * p);
                const __m256i m0 = _mm256_madd_epi16(w, a0);
                i[r][0] = p ? _mm256_add_epi32(i[r][0], m0) : m0;
                if (no == 2) {
                    const __m256i m1 = _mm256_madd_epi16(w, a1);
                    i[r][1] = p ? _mm256_add_epi32(i[r][1], m1) : m1;
                }
            }
        }
        return;
    }
    const __m256i ones = _mm256_set1_epi16(1);
    const int per = f == FMT_Q5_1 ? 4 : 8; /* k-slices per int16 sum */
    __m256i s[GEMM_NT1][2];
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(xb + 32 * t));
        const __m256i a1 = no == 2 ? _mm256_loadu_si256((const __m256i *)(xb + 256 + 32 * t)) : a0;
        UNROLL_NT for (int r = 0; r < nt; r++) {
            const __m256i w = bcast32(q[r] + 4 * t);
            const __m256i m0 = _mm256_maddubs_epi16(w, a0), m1 = no == 2 ? _mm256_maddubs_epi16(w, a1) : m0;
            if (t % per == 0) {
                if (f_sh(f)) {
                    s[r][0] = _mm256_add_epi16(_mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X)), m0);
                    if (no == 2) s[r][1] = _mm256_add_epi16(_mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X + 32)), m1);
                } else {
                    s[r][0] = m0;
                    if (no == 2) s[r][1] = m1;
                }
            } else {
                s[r][0] = _mm256_add_epi16(s[r][0], m0);
                if (no == 2) s[r][1] = _mm256_add_epi16(s[r][1], m1);
            }
            if (t % per == per - 1) {
                const __m256i p0 = _mm256_madd_epi16(s[r][0], ones);
                i[r][0] = t < per ? p0 : _mm256_add_epi32(i[r][0], p0);
                if (no == 2) {
                    const __m256i p1 = _mm256_madd_epi16(s[r][1], ones);
                    i[r][1] = t < per ? p1 : _mm256_add_epi32(i[r][1], p1);
                }
            }
        }
    }
}

/* Block b of rows row[0..nt-1] (decoded rows, nb blocks each) against the
 * column group's block at xb, into acc[r][o] (row r, octet o: the
 * accumulator acc_j of the block's chain j = b mod 4). Per (row, octet):
 * acc = fma(float(I), d_w * d_a, acc) (and the min FMA): the header's
 * float steps. */
TERN_INLINE void gemm_blk(const char *const *row, int nt, int64_t nb, int64_t b, const char *xb, int f, const int no,
                            __m256 acc[GEMM_NT1][2]) {
    const size_t dq = f_dq(f, false), od = f == FMT_Q8_0 ? GA8_OFF_D : GA_OFF_D;
    const char *q[GEMM_NT1];
    UNROLL_NT for (int r = 0; r < nt; r++) q[r] = row[r] + (size_t)b * dq;
    __m256i i[GEMM_NT1][2];
    gemm_int(q, nt, xb, f, no, i);
    UNROLL_NT for (int r = 0; r < nt; r++) {
        const float *d = (const float *)(row[r] + (size_t)nb * dq);
        const __m256 dw = _mm256_broadcast_ss(d + b);
        _Pragma("GCC unroll 2") for (int o = 0; o < no; o++) {
            acc[r][o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[r][o]),
                                        _mm256_mul_ps(dw, _mm256_loadu_ps((const float *)(xb + od + 32 * o))), acc[r][o]);
            if (f_min(f))
                acc[r][o] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + nb + b),
                                            _mm256_loadu_ps((const float *)(xb + GA_OFF_X + 32 * o)), acc[r][o]);
        }
    }
}

/* Blocks b0..b1-1 (b0 a multiple of 4) of a row tile; st: the tile's saved
 * accumulators (row r's acc[o][j] at st + 64r + 8(4o + j)). A one-row
 * tile keeps its 8 accumulators in registers over the chunk; larger ones
 * load and store them per block (in L1). */
TERN_INLINE void gemm_tile(const char *const *row, int nt, int64_t nb, int64_t b0, int64_t b1, const char *xg, int f,
                             const int no, float *st) {
    const size_t ga = f_ga(f, false);
    if (nt == 1) {
        __m256 acc[4][GEMM_NT1][2];
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) _Pragma("GCC unroll 2") for (int o = 0; o < no; o++)
            acc[j][0][o] = _mm256_loadu_ps(st + 8 * (4 * o + j));
        int64_t b = b0;
        for (; b + 4 <= b1; b += 4) {
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) gemm_blk(row, 1, nb, b + j,
                                                                         xg + (size_t)(b + j) * ga, f, no, acc[j]);
        }
        _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) if (b + j < b1) gemm_blk(
            row, 1, nb, b + j, xg + (size_t)(b + j) * ga, f, no, acc[j]);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) _Pragma("GCC unroll 2") for (int o = 0; o < no; o++)
            _mm256_storeu_ps(st + 8 * (4 * o + j), acc[j][0][o]);
        return;
    }
    for (int64_t b = b0; b < b1; b++) {
        const int j = (int)(b & 3);
        __m256 acc[GEMM_NT1][2];
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < no; o++)
            acc[r][o] = _mm256_loadu_ps(st + 64 * r + 8 * (4 * o + j));
        gemm_blk(row, nt, nb, b, xg + (size_t)b * ga, f, no, acc);
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < no; o++)
            _mm256_storeu_ps(st + 64 * r + 8 * (4 * o + j), acc[r][o]);
    }
}

/* A tile of n rows on octet 0 only (a group of at most 8 columns): n =
 * 2 nt, nt, 2 or 1 (nt = f_nt: 4, Q5_1 2), each a constant in gemm_tile. */
TERN_INLINE void gemm_tile_one(const char *const *row, int n, int64_t nb, int64_t b0, int64_t b1, const char *xg,
                                 int f, float *st) {
    _Static_assert(GEMM_NT1 == 8 && GEMM_NT == 4, "one-octet tiles of 8, 4, 2 and 1 rows");
    if (n == 8)
        gemm_tile(row, 8, nb, b0, b1, xg, f, 1, st);
    else if (n == 4)
        gemm_tile(row, 4, nb, b0, b1, xg, f, 1, st);
    else if (n == 2)
        gemm_tile(row, 2, nb, b0, b1, xg, f, 1, st);
    else
        gemm_tile(row, 1, nb, b0, b1, xg, f, 1, st);
}

/* ---- GEMM with AVX-VNNI ---------------------------------------------------
 * The same prep layout as the Q4 / Q5 one above, for all five formats, but
 * x = -2^sh * (the sum of the column's 32 quants) as one int32 per column
 * (sh = f_vsh: Q4_0 3, Q5_0 4, Q8_0 7) for the offset formats. Decoded rows
 * hold unsigned bytes (Q8_0: w + 128). Per k-slice t, one vpdpbusd per (row,
 * octet) of the weights' dword broadcast (unsigned) against the 8 columns'
 * activation dwords (signed) accumulates into int32, starting from x: I =
 * sum (w + off) a - off * sum a exactly (|partial sums| <= 32 * 255 * 127 +
 * 128 * 32 * 127 < 2^31, no saturation anywhere). Then the float steps of
 * gemm_blk. Blocks are taken chain by chain (j = b mod 4: blocks j, j + 4,
 * ... of the k-chunk, increasing), so each (row, octet) accumulator acc_j
 * stays in a register over the chunk; each chain sees its blocks in the
 * same order as before, which is all the float order asks. */
typedef void (*vnni_tile_fn)(const char *const *row, int nt, int64_t nb, int64_t b0, int64_t b1, const char *xg,
                             float *st);

TERN_INLINE_TARGET("avxvnni") void vnni_blk(const char *const *row, int nt, int64_t nb, int64_t b, const char *xb, int f,
                          __m256 acc[VNNI_NT][2]) {
    const char *q[VNNI_NT];
    UNROLL_NT for (int r = 0; r < nt; r++) q[r] = row[r] + (size_t)b * 32;
    __m256i i[VNNI_NT][2];
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(xb + 32 * t));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(xb + 256 + 32 * t));
        UNROLL_NT for (int r = 0; r < nt; r++) {
            const __m256i w = bcast32(q[r] + 4 * t);
            if (t == 0) {
                if (f_vsh(f)) {
                    i[r][0] = _mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X));
                    i[r][1] = _mm256_loadu_si256((const __m256i *)(xb + GA_OFF_X + 32));
                } else {
                    i[r][0] = i[r][1] = _mm256_setzero_si256();
                }
            }
            i[r][0] = _mm256_dpbusd_avx_epi32(i[r][0], w, a0);
            i[r][1] = _mm256_dpbusd_avx_epi32(i[r][1], w, a1);
        }
    }
    UNROLL_NT for (int r = 0; r < nt; r++) {
        const float *d = (const float *)(row[r] + (size_t)nb * 32);
        const __m256 dw = _mm256_broadcast_ss(d + b);
        _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++) {
            acc[r][o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[r][o]),
                                        _mm256_mul_ps(dw, _mm256_loadu_ps((const float *)(xb + GA_OFF_D + 32 * o))),
                                        acc[r][o]);
            if (f_min(f))
                acc[r][o] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + nb + b),
                                            _mm256_loadu_ps((const float *)(xb + GA_OFF_X + 32 * o)), acc[r][o]);
        }
    }
}

/* Blocks b0..b1-1 (b0 a multiple of 4) of a tile of nt rows, chain by
 * chain; st as in gemm_tile. */
TERN_INLINE_TARGET("avxvnni") void vnni_tile(const char *const *row, int nt, int64_t nb, int64_t b0, int64_t b1, const char *xg, int f,
                           float *st) {
    for (int j = 0; j < 4 && b0 + j < b1; j++) {
        __m256 acc[VNNI_NT][2];
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            acc[r][o] = _mm256_loadu_ps(st + 64 * r + 8 * (4 * o + j));
        for (int64_t b = b0 + j; b < b1; b += 4) vnni_blk(row, nt, nb, b, xg + (size_t)b * GA_BYTES, f, acc);
        UNROLL_NT for (int r = 0; r < nt; r++) _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++)
            _mm256_storeu_ps(st + 64 * r + 8 * (4 * o + j), acc[r][o]);
    }
}

#define VNNI_TILE(name, F)                                                                                    \
    __attribute__((target("avxvnni"))) static void tile_##name##_vnni(const char *const *row, int nt, int64_t nb, \
                                                                      int64_t b0, int64_t b1, const char *xg,   \
                                                                      float *st) {                              \
        if (nt == 3)                                                                                            \
            vnni_tile(row, 3, nb, b0, b1, xg, F, st);                                                           \
        else if (nt == 2)                                                                                       \
            vnni_tile(row, 2, nb, b0, b1, xg, F, st);                                                           \
        else                                                                                                    \
            vnni_tile(row, 1, nb, b0, b1, xg, F, st);                                                           \
    }
_Static_assert(VNNI_NT == 3, "tile_*_vnni instantiate 3, 2 and 1 rows");
VNNI_TILE(q4_0, FMT_Q4_0)
VNNI_TILE(q4_1, FMT_Q4_1)
VNNI_TILE(q5_0, FMT_Q5_0)
VNNI_TILE(q5_1, FMT_Q5_1)
VNNI_TILE(q8_0, FMT_Q8_0)

/* Bytes of one prep group; 0 for a bad k or on overflow. */
TERN_INLINE size_t gemm_group_bytes(int64_t k, size_t ga) {
    if (k <= 0 || k % QK) return 0;
    const uint64_t nb = (uint64_t)(k / QK);
    if (nb > SIZE_MAX / (16 * ga)) return 0;
    return (size_t)nb * ga;
}
static size_t gemm_group_size(int64_t k) {
    return gemm_group_bytes(k, GA_BYTES);
}
static size_t gemm_group_size8(int64_t k) {
    return gemm_group_bytes(k, GA8_BYTES);
}

/* In-place transpose of an 8 x 8 matrix of dwords (r[i] = row i). */
TERN_INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* ncols (1..16) act rows into prep's layout of format f, block by block:
 * per octet the eight columns' [lo dwords | hi dwords] of the block,
 * transposed (k-slice t = elements 4t..4t+3 in dword c); Q8_0 weights: each
 * slice's byte pairs sign-extended (pairs 2t, 2t+1); then d and x. */
TERN_INLINE void gemm_prep(int64_t k, const void *xa, size_t st, int ncols, void *xg, int f, bool v) {
    const int64_t nb = k / QK;
    const int sh = v ? f_vsh(f) : f_sh(f);
    const size_t ga = f_ga(f, v);
    for (int64_t b = 0; b < nb; b++) {
        const size_t j = (size_t)(b % LEGACY_GROUP);
        const char *src = (const char *)xa + (size_t)(b / LEGACY_GROUP) * LEGACY_GROUP_BYTES;
        char *dst = (char *)xg + (size_t)b * ga;
        _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++) {
            __m256 r[8];
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
                const char *a = src + (size_t)(8 * o + c) * st;
                r[c] = 8 * o + c < ncols ? _mm256_castsi256_ps(_mm256_loadu2_m128i(
                                               (const __m128i *)(a + LEGACY_OFF_HI + 16 * j),
                                               (const __m128i *)(a + LEGACY_OFF_LO + 16 * j)))
                                         : _mm256_setzero_ps();
            }
            transpose8(r);
            if (f == FMT_Q8_0 && !v) {
                /* per lane: [bytes 0..1 of its 4 dwords | bytes 2..3], then
                 * the qwords regrouped: low half = pair 2t of columns 0..7 */
                const __m256i sel = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4,
                                                     5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
                    const __m256i v = _mm256_permute4x64_epi64(
                        _mm256_shuffle_epi8(_mm256_castps_si256(r[t]), sel), 0xD8);
                    _mm256_storeu_si256((__m256i *)(dst + 512 * o + 64 * t),
                                        _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
                    _mm256_storeu_si256((__m256i *)(dst + 512 * o + 64 * t + 32),
                                        _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
                }
                continue;
            }
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) _mm256_storeu_ps(
                (float *)(dst + 256 * o + 32 * t), r[t]);
            if (sh && v) {
                /* int32 sums of each column's 32 quants (maddubs: int16
                 * pairs, |.| <= 8 * 254), times -2^sh */
                __m256i s = _mm256_setzero_si256();
                const __m256i one8 = _mm256_set1_epi8(1);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) s =
                    _mm256_add_epi16(s, _mm256_maddubs_epi16(one8, _mm256_castps_si256(r[t])));
                s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
                _mm256_storeu_si256((__m256i *)(dst + GA_OFF_X + 32 * o),
                                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, sh)));
            } else if (sh) {
                /* int16 pair sums of each dword over the 8 k-slices (|.| <= 16 * 127) */
                __m256i s = _mm256_setzero_si256();
                const __m256i one8 = _mm256_set1_epi8(1);
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) s =
                    _mm256_add_epi16(s, _mm256_maddubs_epi16(one8, _mm256_castps_si256(r[t])));
                _mm256_storeu_si256((__m256i *)(dst + GA_OFF_X + 32 * o),
                                    _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s, sh)));
            }
        }
        float d[16], x[16];
        for (int c = 0; c < KERN_GEMM_GROUP; c++) {
            d[c] = x[c] = 0.0f;
            if (c >= ncols) continue;
            const char *a = src + (size_t)c * st;
            memcpy(&d[c], a + LEGACY_OFF_DEXP + 16 * j, sizeof(float));
            if (f_min(f)) memcpy(&x[c], a + LEGACY_OFF_NSUM + 16 * j, sizeof(float)); /* sexp */
        }
        memcpy(dst + (f == FMT_Q8_0 && !v ? GA8_OFF_D : GA_OFF_D), d, sizeof(d));
        if (f_min(f)) memcpy(dst + GA_OFF_X, x, sizeof(x));
    }
}

/* Loop order: row blocks (decoded once) > column groups > k-chunks > row
 * tiles > blocks. */
TERN_INLINE void gemm_run(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y,
                            int64_t ldy, void *scratch, int f, vnni_tile_fn vtile) {
    TERN_CHECK(legacy_fp16_lut[0x3c00] == 1.0f);
    const bool v = vtile != NULL;
    const int64_t k = a->k, nb = k / QK, rb = gemm_rows(k, f, v), kc = f_kc(f, v), nt = f_nt(f, v);
    const size_t rs = gemm_row_bytes(nb, f, v);
    char *dec = scratch;
    float *state = (float *)(dec + (size_t)rb * rs);
    const int64_t sf = GEMM_STATE / sizeof(float);
    /* Row tiles per row block: the next block's raw rows are prefetched
     * (into L2) a share per tile, so that its decode does not wait on
     * memory. */
    const int64_t calls = ((a->n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP) * ((nb + kc - 1) / kc) * ((rb + nt - 1) / nt);
    const size_t pf_step = ((size_t)rb * row_bytes / (size_t)calls + 63) & ~(size_t)63;
    for (int64_t r0 = 0; r0 < nrows; r0 += rb) {
        const int64_t nr = nrows - r0 < rb ? nrows - r0 : rb;
        for (int64_t r = 0; r < nr; r++)
            gemm_dec_row((const uint8_t *)w + (size_t)(r0 + r) * row_bytes, nb, dec + (size_t)r * rs, f, v);
        const int64_t rn = nrows - (r0 + nr) < rb ? nrows - (r0 + nr) : rb;
        const char *pf = (const char *)w + (size_t)(r0 + nr) * row_bytes, *pf_end = pf + (size_t)rn * row_bytes;
        for (int64_t c0 = 0; c0 < a->n; c0 += KERN_GEMM_GROUP) {
            const char *xg = (const char *)a->xg + (size_t)(c0 / KERN_GEMM_GROUP) * a->xg_group;
            const int ncols = a->n - c0 < KERN_GEMM_GROUP ? (int)(a->n - c0) : KERN_GEMM_GROUP;
            /* a group of at most 8 columns: octet 0 only (the plain
             * GEMM; its lanes past ncols are zeros, computed on) */
            const bool one = !v && ncols <= 8;
            memset(state, 0, (size_t)nr * GEMM_STATE); /* every acc_j starts at +0 */
            for (int64_t b0 = 0; b0 < nb; b0 += kc) {
                const int64_t b1 = nb - b0 < kc ? nb : b0 + kc;
                for (int64_t r = 0; r < nr;) {
                    for (size_t o = 0; o < pf_step && pf < pf_end; o += 64, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
                    /* tiles of nt (one octet: 2 nt), nt, 2 or 1 rows */
                    const int64_t n = one && nr - r >= 2 * nt ? 2 * nt : nr - r >= nt ? nt : nr - r >= 2 ? 2 : 1;
                    const char *rows[GEMM_NT1];
                    _Pragma("GCC unroll 8") for (int i = 0; i < GEMM_NT1; i++) rows[i] = dec + (size_t)(r + (i < n ? i : 0)) * rs;
                    if (v)
                        vtile(rows, (int)n, nb, b0, b1, xg, state + r * sf);
                    else if (one)
                        gemm_tile_one(rows, (int)n, nb, b0, b1, xg, f, state + r * sf);
                    else if (n == nt)
                        gemm_tile(rows, (int)nt, nb, b0, b1, xg, f, 2, state + r * sf);
                    else if (n == 2)
                        gemm_tile(rows, 2, nb, b0, b1, xg, f, 2, state + r * sf);
                    else
                        gemm_tile(rows, 1, nb, b0, b1, xg, f, 2, state + r * sf);
                    r += n;
                }
            }
            /* the row block's sums, column by column (contiguous in y) */
            for (int c = 0; c < ncols; c++) {
                const int o = c / 8, l = c % 8;
                for (int64_t r = 0; r < nr; r++) {
                    const float *s = state + r * sf + 32 * o + l;
                    y[(c0 + c) * ldy + r0 + r] = (s[0] + s[16]) + (s[8] + s[24]);
                }
            }
        }
    }
}

/* One kern_gemm_t per format: plain (vtile NULL) or AVX-VNNI (vtile =
 * the format's VNNI tile; v = true for the layout helpers). */
#define GEMM_FMT(name, F, gsize, v, vtile)                                                                   \
    static size_t scratch_##name(int64_t k) {                                                                \
        return gemm_scratch(k, F, v);                                                                        \
    }                                                                                                        \
    static void prep_##name(int64_t k, const void *xa, size_t st, int ncols, void *xg) {                    \
        gemm_prep(k, xa, st, ncols, xg, F, v);                                                               \
    }                                                                                                        \
    static void run_##name(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y, \
                           int64_t ldy, void *scratch) {                                                     \
        gemm_run(a, w, row_bytes, nrows, y, ldy, scratch, F, vtile);                                         \
    }                                                                                                        \
    static const kern_gemm_t gemm_##name = {gsize, prep_##name, scratch_##name, run_##name, 0, NULL};

GEMM_FMT(q4_0, FMT_Q4_0, gemm_group_size, false, NULL)
GEMM_FMT(q4_1, FMT_Q4_1, gemm_group_size, false, NULL)
GEMM_FMT(q5_0, FMT_Q5_0, gemm_group_size, false, NULL)
GEMM_FMT(q5_1, FMT_Q5_1, gemm_group_size, false, NULL)
GEMM_FMT(q8_0, FMT_Q8_0, gemm_group_size8, false, NULL)
GEMM_FMT(q4_0_vnni, FMT_Q4_0, gemm_group_size, true, tile_q4_0_vnni)
GEMM_FMT(q4_1_vnni, FMT_Q4_1, gemm_group_size, true, tile_q4_1_vnni)
GEMM_FMT(q5_0_vnni, FMT_Q5_0, gemm_group_size, true, tile_q5_0_vnni)
GEMM_FMT(q5_1_vnni, FMT_Q5_1, gemm_group_size, true, tile_q5_1_vnni)
GEMM_FMT(q8_0_vnni, FMT_Q8_0, gemm_group_size, true, tile_q8_0_vnni)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

const kern_gemm_t *const legacy_avx2_gemm[FMT_COUNT] = {&gemm_q4_0, &gemm_q4_1, &gemm_q5_0, &gemm_q5_1, &gemm_q8_0};
const kern_gemm_t *const legacy_avx2_gemm_vnni[FMT_COUNT] = {&gemm_q4_0_vnni, &gemm_q4_1_vnni, &gemm_q5_0_vnni,
                                                             &gemm_q5_1_vnni, &gemm_q8_0_vnni};

#endif /* __x86_64__ */
