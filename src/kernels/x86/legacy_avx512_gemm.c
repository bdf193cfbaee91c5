/*
 * legacy_avx512_gemm.c - the AVX-512 GEMMs (kern_gemm_t) of the 32-element
 * block formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 for n >= KERN_GEMM_MIN_COLS
 * columns, plain and with the VBMI + GFNI decode (registered by
 * legacy_avx512_matvec.c). Every (row, column) takes THE FLOAT ORDER stated
 * at the top of legacy_avx512_matvec.c, so the GEMMs give the bits of the
 * dot; legacy_avx512.h holds the weight decode both files share.
 *
 * GEMM (n >= KERN_GEMM_MIN_COLS), lanes = 16 columns: prep lays out each
 *    group of 16 columns so that one vector holds the same 4-byte k-slice
 *    of all 16 columns, as unsigned bytes a + 128 (a 16 x 16 dword
 *    transpose per act group). run decodes panels of 4 weight rows into
 *    signed int8 plus, per (row, block), -128 * sum(w) and the float
 *    scales; then per (row, block) 8 vpdpbusd with the weights' dword as a
 *    broadcast operand give I = sum w (a + 128) - 128 sum w (the
 *    correction is the start value), and one add, one convert, one multiply
 *    and one FMA (two for the min formats) serve 16 columns x 32 products:
 *    acc[row][j] holds acc_j of the 16 columns, the same float steps as
 *    above. vpdpbusd bounds it (one per cycle, port 0, on the development
 *    machine: 512 MACs per row and block in 8 cycles). Rows are taken in row blocks of decoded panels
 *    (L2), columns in groups of 16, k in chunks of 32 blocks whose
 *    activations stay in L1 while every panel of the row block passes over
 *    them (accumulators saved between chunks: exact); the next row block's
 *    weights are prefetched into L2 during the compute. A group of at most
 *    8 columns (N = 5..8, or the last group of N = 17..24, ...) runs the
 *    same steps on 8 lanes (ymm, the lower half of prep's vectors): on Zen 4
 *    a 256-bit vpdpbusd is half the work of a 512-bit one, so 8 columns no
 *    longer cost what 16 do (measured: `tern bench kernels --gemm-n`).
 *
 * Up to LEGACY_SMALL_COLS = 10 columns (Q4_0: 12; batched decode) the driver calls
 *    run_small instead (legacy_avx512_matvec.c: the rows kernel on tiles of
 *    up to 8 columns, weights decoded in registers, four far-apart rows at
 *    a time): no decode into scratch, no prep. At N = 8 it costs about
 *    half of the path above (4096 x 4096 from RAM, 2 threads).
 *
 * 11..16 (Q4_0 13..16) columns run the fused form of run (the *_fused
 *    functions): a panel of four far-apart rows is decoded one weight group
 *    at a time into a stack buffer (L1, two buffers: the next group is
 *    decoded while this one computes) and consumed at once by gemm_blk, so
 *    the weights are decoded once for all 16 columns with no round trip
 *    through L2. gemm_blk takes the weight dwords as embedded broadcasts
 *    (dpb_bcast: one load-op uop; the compiler's separate vpbroadcastd
 *    cost a shuffle slot each). Measured (docs/PERF.md): at N = 16 it beats
 *    two 8-column tiles of the rows kernel by 15-25% (q4_0, q5_0, q8_0);
 *    below the thresholds (and at N = 8 against 8 lanes of this one) the
 *    rows kernel stays faster.
 */
#if defined(__x86_64__)

#include "kernels/x86/legacy_avx512.h"

/* ---- GEMM ------------------------------------------------------------------ */

/* prep's activations: one group of KERN_GEMM_GROUP = 16 columns, per block
 * b of the row GA_Q8_0 (act type Q8_0) or GA_Q8_1 (Q8_1) bytes:
 *   uint8 q[8][16][4]  q[t][c] = column c's quants 4t..4t+3 of block b,
 *                      each + 128 (q ^ 0x80: the unsigned operand)
 *   float d[16]        column c's d of block b
 *   float s[16]        column c's s of block b (Q8_1 only)
 * Columns past the last are zeros (computed on, never stored). */
enum { GA_OFF_D = 512, GA_OFF_S = 576, GA_Q8_0 = 576, GA_Q8_1 = 640 };

/* run's decoded weights: panels of 4 rows, per group of four blocks
 * GP_BYTES:
 *   int8  q[4][2][4][16]  row i's signed weights (Q4_0 q - 8, Q5_0 q - 16,
 *                         Q4_1 / Q5_1 q, Q8_0 qs): q[i][0][j] = block j's
 *                         elements 0..15, q[i][1][j] = its elements 16..31
 *                         (the decoded lo / hi vectors as they are)
 *   int32 corr[4][4]      corr[i][j] = -128 * sum of row i's block j (the
 *                         start value that takes the +128 of the
 *                         activations back out)
 *   float dm[4][8]        row i: d of blocks 0..3, then m of blocks 0..3
 * A panel holds every group of its four rows (row i's data at offsets
 * 128i, 512 + 16i, 576 + 32i of each group); rows past the last are zeros.
 * The panels of a row block (gemm_rows rows) follow each other in the
 * scratch, then the saved accumulators of each panel (GEMM_STATE bytes). */
enum { GP_OFF_CORR = 512, GP_OFF_DM = 576, GP_BYTES = 704, GEMM_STATE = 16 * 64 };
_Static_assert(GP_BYTES % 64 == 0 && GA_Q8_0 % 64 == 0 && GA_Q8_1 % 64 == 0, "GEMM layouts keep vectors aligned");

/* Bytes of decoded weight rows per row block: the block stays in L2 while
 * every group of columns passes over it. */
#define GEMM_PANEL_BYTES (192 * 1024)
/* Groups of four blocks per k-chunk: 32 blocks of one column group's
 * activations (18..20 KB) stay in L1 while the panels of a row block pass
 * over them; the accumulators are saved between chunks (exact). */
#define GEMM_KC 8

/* Decode one weight group (four blocks, format offset off; scales from
 * the compact permute) into row i of panel group pg. */
TERN_INLINE void gemm_dec_grp(const wgroup_t *g, int off, char *pg, int i) {
    const __m512i vo = _mm512_set1_epi8((char)off), n128 = _mm512_set1_epi8(-128);
    _mm512_store_si512(pg + 128 * i, _mm512_sub_epi8(g->lo, vo));
    _mm512_store_si512(pg + 128 * i + 64, _mm512_sub_epi8(g->hi, vo));
    /* -128 * sum(w) = 32 * 128 * off - 128 * sum(q): vpdpbusd of the
     * unsigned quants with -128 gives lane 4j+m = -128 * (8 of block j's
     * quants) + 1024 * off, lane_sum adds block j's four lanes. */
    __m512i c = _mm512_dpbusd_epi32(_mm512_set1_epi32(1024 * off), g->lo, n128);
    c = lane_sum(_mm512_dpbusd_epi32(c, g->hi, n128));
    _mm_store_si128((__m128i *)(pg + GP_OFF_CORR + 16 * i),
                    _mm512_castsi512_si128(_mm512_permutexvar_epi32(
                        _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), c)));
    /* d_0..3, m_0..3 */
    _mm256_store_ps((float *)(pg + GP_OFF_DM + 32 * i), _mm256_cvtph_ps(_mm512_castsi512_si128(g->sc)));
}

/* Decode one panel: rows w[0..nr-1] (nr 1..4; nb blocks each), group by
 * group, so the panel is written sequentially; rows past nr are zeros. A
 * partial last group reads as zero-padded, as in the dot. */
typedef void (*gemm_dec_fn)(const uint8_t *const *w, int nr, int64_t nb, char *pan);
#define GEMM_DEC(attr, name, wblock, grp, fmt, off)                                                   \
    attr static void name(const uint8_t *const *w, int nr, int64_t nb, char *pan) {                 \
        const int64_t ng = nb / LEGACY_GROUP;                                                          \
        const size_t gb = LEGACY_GROUP * sizeof(wblock);                                               \
        const int64_t ngt = ng + (nb % LEGACY_GROUP != 0);                                             \
        for (int i = nr; i < 4; i++) gemm_zero_row(pan, ngt, i);                                       \
        int64_t gi = 0;                                                                                \
        for (; gi < ng; gi++) {                                                                        \
            for (int i = 0; i < nr; i++) {                                                             \
                const wgroup_t g = grp(w[i] + (size_t)gi * gb, fmt);                                   \
                gemm_dec_grp(&g, off, pan + (size_t)gi * GP_BYTES, i);                                 \
            }                                                                                          \
        }                                                                                              \
        if (nb % LEGACY_GROUP) {                                                                       \
            for (int i = 0; i < nr; i++) {                                                             \
                const wgroup_t g = grp##_n(w[i] + (size_t)gi * gb, fmt, (int)(nb % LEGACY_GROUP));     \
                gemm_dec_grp(&g, off, pan + (size_t)gi * GP_BYTES, i);                                 \
            }                                                                                          \
        }                                                                                              \
    }

static void gemm_zero_row(char *pan, int64_t ng, int i) {
    for (int64_t gi = 0; gi < ng; gi++) {
        char *pg = pan + (size_t)gi * GP_BYTES;
        memset(pg + 128 * i, 0, 128);
        memset(pg + GP_OFF_CORR + 16 * i, 0, 16);
        memset(pg + GP_OFF_DM + 32 * i, 0, 32);
    }
}

GEMM_DEC(, dec_q4_0, block_q4_0, gemm_grp_plain, FMT_Q4_0, 8)
GEMM_DEC(, dec_q4_1, block_q4_1, gemm_grp_plain, FMT_Q4_1, 0)
GEMM_DEC(, dec_q5_0, block_q5_0, gemm_grp_plain, FMT_Q5_0, 16)
GEMM_DEC(, dec_q5_1, block_q5_1, gemm_grp_plain, FMT_Q5_1, 0)
GEMM_DEC(, dec_q8_0, block_q8_0, gemm_grp_plain, FMT_Q8_0, 128)
GEMM_DEC(VBMI, dec_q4_0_vbmi, block_q4_0, gemm_grp_vbmi, FMT_Q4_0, 8)
GEMM_DEC(VBMI, dec_q4_1_vbmi, block_q4_1, gemm_grp_vbmi, FMT_Q4_1, 0)
GEMM_DEC(VBMI, dec_q5_0_vbmi, block_q5_0, gemm_grp_vbmi, FMT_Q5_0, 16)
GEMM_DEC(VBMI, dec_q5_1_vbmi, block_q5_1, gemm_grp_vbmi, FMT_Q5_1, 0)
GEMM_DEC(VBMI, dec_q8_0_vbmi, block_q8_0, gemm_grp_vbmi, FMT_Q8_0, 128)

TERN_INLINE int32_t ld_i32(const char *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

TERN_INLINE float ld_f32(const char *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* acc + vpdpbusd(a, the dword at p broadcast), the broadcast embedded in
 * the instruction: one fused load-op uop, where the compiler emits a
 * separate vpbroadcastd (which on Zen 4 also takes a shuffle slot). */
TERN_INLINE __m512i dpb_bcast(__m512i acc, __m512i a, const char *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_t *)p));
    return acc;
}
TERN_INLINE __m256i dpb_bcast8(__m256i acc, __m256i a, const char *p) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_t *)p));
    return acc;
}

/* Block j of panel group pg against the 16 columns' block at xb: for each
 * of the 4 rows, 8 vpdpbusd (the row's weight dwords broadcast, two
 * chains for latency), then acc[i][j] = fma(float(I), d_w * d_a, acc[i][j])
 * (and fma(m_w, s_a, .) for the min formats): the header's order. */
TERN_INLINE void gemm_blk(const char *pg, int j, const char *xb, bool min, __m512 acc[4][4]) {
    __m512i a[8];
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) a[t] = _mm512_loadu_si512(xb + 64 * t);
    const __m512 da = _mm512_loadu_ps(xb + GA_OFF_D);
    const __m512 sa = min ? _mm512_loadu_ps(xb + GA_OFF_S) : _mm512_setzero_ps();
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        /* k-slice t of block j: elements 4t..4t+3, in lo (t < 4) or hi */
        const char *q = pg + 128 * i + 16 * j;
        __m512i p = _mm512_set1_epi32(ld_i32(pg + GP_OFF_CORR + 16 * i + 4 * j)), r = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
            p = dpb_bcast(p, a[t], q + 4 * t);
            r = dpb_bcast(r, a[4 + t], q + 64 + 4 * t);
        }
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(ld_f32(pg + GP_OFF_DM + 32 * i + 4 * j)), da);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p, r)), s, acc[i][j]);
        if (min) acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(ld_f32(pg + GP_OFF_DM + 32 * i + 16 + 4 * j)), sa, acc[i][j]);
    }
}

/* gemm_blk for a group of at most 8 columns: the same steps on the lower
 * halves (ymm) of the activation vectors, lane c = column c as above. On
 * Zen 4 a 256-bit vpdpbusd costs half a 512-bit one, so 8 columns cost half
 * of 16 instead of the same. */
TERN_INLINE void gemm_blk8(const char *pg, int j, const char *xb, bool min, __m256 acc[4][4]) {
    __m256i a[8];
    _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) a[t] = _mm256_loadu_si256((const __m256i *)(xb + 64 * t));
    const __m256 da = _mm256_loadu_ps((const float *)(xb + GA_OFF_D));
    const __m256 sa = min ? _mm256_loadu_ps((const float *)(xb + GA_OFF_S)) : _mm256_setzero_ps();
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        const char *q = pg + 128 * i + 16 * j;
        __m256i p = _mm256_set1_epi32(ld_i32(pg + GP_OFF_CORR + 16 * i + 4 * j)), r = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
            p = dpb_bcast8(p, a[t], q + 4 * t);
            r = dpb_bcast8(r, a[4 + t], q + 64 + 4 * t);
        }
        const __m256 s = _mm256_mul_ps(_mm256_set1_ps(ld_f32(pg + GP_OFF_DM + 32 * i + 4 * j)), da);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p, r)), s, acc[i][j]);
        if (min) acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(ld_f32(pg + GP_OFF_DM + 32 * i + 16 + 4 * j)), sa, acc[i][j]);
    }
}

/* Rows of a row block: decoded bytes within GEMM_PANEL_BYTES, a multiple
 * of 4, 4..64. */
static int64_t gemm_rows(int64_t k) {
    const int64_t ng = (k / QK + LEGACY_GROUP - 1) / LEGACY_GROUP;
    int64_t rb = GEMM_PANEL_BYTES / (ng * (GP_BYTES / 4) + 1);
    rb &= ~(int64_t)3;
    return rb < 4 ? 4 : rb > 64 ? 64 : rb;
}

static size_t gemm_scratch_size(int64_t k) {
    const int64_t ng = (k / QK + LEGACY_GROUP - 1) / LEGACY_GROUP;
    return (size_t)(gemm_rows(k) / 4) * ((size_t)ng * GP_BYTES + GEMM_STATE);
}

/* Bytes of one prep group; 0 for a bad k, or one whose run scratch would
 * overflow. */
static size_t gemm_group_size(int64_t k, size_t per_block) {
    if (k <= 0 || k % QK) return 0;
    const uint64_t nb = (uint64_t)(k / QK);
    if (nb > SIZE_MAX / (16 * GP_BYTES)) return 0;
    return (size_t)nb * per_block;
}

static size_t gsize_q8_0(int64_t k) {
    return gemm_group_size(k, GA_Q8_0);
}

static size_t gsize_q8_1(int64_t k) {
    return gemm_group_size(k, GA_Q8_1);
}

/* In-place transpose of a 16 x 16 matrix of dwords (r[i] = row i). */
TERN_INLINE void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    /* t[2i], t[2i+1]: rows 2i, 2i+1 interleaved by dword */
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i+k], 128-bit lane L: rows 4i..4i+3 of column 4L+k */
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* column 4L+k = lane L of u[k], u[4+k], u[8+k], u[12+k] */
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const __m512i a0 = _mm512_shuffle_i32x4(u[k], u[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i a1 = _mm512_shuffle_i32x4(u[k], u[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i b0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i b1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
        r[k] = _mm512_shuffle_i32x4(a0, b0, _MM_SHUFFLE(2, 0, 2, 0));
        r[8 + k] = _mm512_shuffle_i32x4(a0, b0, _MM_SHUFFLE(3, 1, 3, 1));
        r[4 + k] = _mm512_shuffle_i32x4(a1, b1, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + k] = _mm512_shuffle_i32x4(a1, b1, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* One group of ncols (1..16) act rows into prep's layout, one act group
 * (four blocks) at a time: the 16 columns' lo (then hi) vectors, flipped
 * to unsigned, transposed by dword, give q[t] of blocks 0..3 (dword 4j+t
 * of lo is block j's elements 4t..4t+3). */
TERN_INLINE void gemm_prep(int64_t k, const void *xa, size_t st, int ncols, void *xg, bool q81) {
    const int64_t nb = k / QK;
    const size_t ab = q81 ? GA_Q8_1 : GA_Q8_0;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t gi = 0; gi * LEGACY_GROUP < nb; gi++) {
        const int nbk = nb - gi * LEGACY_GROUP < LEGACY_GROUP ? (int)(nb - gi * LEGACY_GROUP) : LEGACY_GROUP;
        const char *src = (const char *)xa + (size_t)gi * LEGACY_GROUP_BYTES;
        char *dst = (char *)xg + (size_t)gi * LEGACY_GROUP * ab;
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m512i r[16];
            _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++) r[c] =
                c < ncols ? _mm512_xor_si512(_mm512_loadu_si512(src + (size_t)c * st + (h ? LEGACY_OFF_HI : LEGACY_OFF_LO)), flip)
                          : _mm512_setzero_si512();
            transpose16(r);
            for (int j = 0; j < nbk; j++)
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)
                    _mm512_storeu_si512(dst + (size_t)j * ab + 64 * (4 * h + t), r[4 * j + t]);
        }
        for (int j = 0; j < nbk; j++) {
            float d[16], s[16];
            for (int c = 0; c < KERN_GEMM_GROUP; c++) {
                d[c] = s[c] = 0.0f;
                if (c >= ncols) continue;
                memcpy(&d[c], src + (size_t)c * st + LEGACY_OFF_DEXP + 16 * j, sizeof(float)); /* lane 4j */
                memcpy(&s[c], src + (size_t)c * st + LEGACY_OFF_NSUM + 16 * j, sizeof(float)); /* sexp (Q8_1) */
            }
            memcpy(dst + (size_t)j * ab + GA_OFF_D, d, sizeof(d));
            if (q81) memcpy(dst + (size_t)j * ab + GA_OFF_S, s, sizeof(s));
        }
    }
}

static void prep_q8_0(int64_t k, const void *xa, size_t st, int ncols, void *xg) {
    gemm_prep(k, xa, st, ncols, xg, false);
}

static void prep_q8_1(int64_t k, const void *xa, size_t st, int ncols, void *xg) {
    gemm_prep(k, xa, st, ncols, xg, true);
}

/* The 4 rows of an accumulator tile (nrv valid) into y, columns c0.. */
TERN_INLINE void gemm_store(__m512 acc[4][4], float *y, int64_t ldy, int64_t c0, int ncols, int nrv) {
    float t[4][16] __attribute__((aligned(64)));
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) _mm512_store_ps(
        t[i], _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3])));
    for (int c = 0; c < ncols; c++) {
        float *yc = y + (c0 + c) * ldy;
        for (int i = 0; i < nrv; i++) yc[i] = t[i][c];
    }
}

TERN_INLINE void gemm_store8(__m256 acc[4][4], float *y, int64_t ldy, int64_t c0, int ncols, int nrv) {
    float t[4][8] __attribute__((aligned(32)));
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) _mm256_store_ps(
        t[i], _mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][2]), _mm256_add_ps(acc[i][1], acc[i][3])));
    for (int c = 0; c < ncols; c++) {
        float *yc = y + (c0 + c) * ldy;
        for (int i = 0; i < nrv; i++) yc[i] = t[i][c];
    }
}

/* Loop order: row blocks (decoded once) > column groups > k-chunks >
 * panels of 4 rows > groups of 4 blocks > blocks. */
TERN_INLINE void gemm_run(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y,
                            int64_t ldy, void *scratch, gemm_dec_fn dec, bool min) {
    const int64_t k = a->k, nb = k / QK, ng = (nb + LEGACY_GROUP - 1) / LEGACY_GROUP;
    const int rem = (int)(nb % LEGACY_GROUP);
    const size_t ab = min ? GA_Q8_1 : GA_Q8_0, pan_bytes = (size_t)ng * GP_BYTES;
    const int64_t rb = gemm_rows(k);
    char *pans = scratch;
    float *state = (float *)(pans + (size_t)(rb / 4) * pan_bytes);
    for (int64_t r0 = 0; r0 < nrows; r0 += rb) {
        const int64_t nr = nrows - r0 < rb ? nrows - r0 : rb, np = (nr + 3) / 4;
        for (int64_t p = 0; p < np; p++) {
            const uint8_t *wr[4];
            const int nrp = nr - 4 * p < 4 ? (int)(nr - 4 * p) : 4;
            for (int i = 0; i < nrp; i++) wr[i] = (const uint8_t *)w + (size_t)(r0 + 4 * p + i) * row_bytes;
            dec(wr, nrp, nb, pans + (size_t)p * pan_bytes);
        }
        /* The next row block's weights go to L2 while this one computes
         * (its decode would otherwise wait on memory): a share of its
         * lines before each panel's k-chunk. */
        const int64_t nr2 = nrows - r0 - nr < rb ? nrows - r0 - nr : rb;
        uintptr_t pf = (uintptr_t)w + (size_t)(r0 + nr) * row_bytes;
        const uintptr_t pf_end = nr2 > 0 ? pf + (size_t)nr2 * row_bytes : pf;
        const int64_t calls = (a->n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP * ((ng + GEMM_KC - 1) / GEMM_KC) * np;
        const size_t pf_step = ((pf_end - pf) / 64 / (size_t)calls + 1) * 64;
        for (int64_t c0 = 0; c0 < a->n; c0 += KERN_GEMM_GROUP) {
            const char *xg = (const char *)a->xg + (size_t)(c0 / KERN_GEMM_GROUP) * a->xg_group;
            const int ncols = a->n - c0 < KERN_GEMM_GROUP ? (int)(a->n - c0) : KERN_GEMM_GROUP;
            for (int64_t g0 = 0; g0 < ng; g0 += GEMM_KC) {
                const int64_t g1 = ng - g0 < GEMM_KC ? ng : g0 + GEMM_KC;
                for (int64_t p = 0; p < np; p++) {
                    float *st = state + p * (GEMM_STATE / sizeof(float));
                    const char *pan = pans + (size_t)p * pan_bytes;
                    for (const uintptr_t e = pf + pf_step < pf_end ? pf + pf_step : pf_end; pf < e; pf += 64)
                        _mm_prefetch((const char *)pf, _MM_HINT_T1);
                    const int nrv = nr - 4 * p < 4 ? (int)(nr - 4 * p) : 4;
                    if (ncols <= 8) {
                        __m256 acc[4][4];
                        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i / 4][i % 4] =
                            g0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(st + 16 * i);
                        for (int64_t gi = g0; gi < g1; gi++) {
                            const char *pg = pan + (size_t)gi * GP_BYTES, *xb = xg + (size_t)gi * LEGACY_GROUP * ab;
                            const int nbk = gi == ng - 1 && rem ? rem : 4;
                            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nbk) gemm_blk8(pg, j, xb + j * ab, min, acc);
                        }
                        if (g1 < ng) {
                            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) _mm256_store_ps(st + 16 * i, acc[i / 4][i % 4]);
                        } else {
                            gemm_store8(acc, y + r0 + 4 * p, ldy, c0, ncols, nrv);
                        }
                        continue;
                    }
                    __m512 acc[4][4];
                    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i / 4][i % 4] =
                        g0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(st + 16 * i);
                    for (int64_t gi = g0; gi < g1; gi++) {
                        const char *pg = pan + (size_t)gi * GP_BYTES, *xb = xg + (size_t)gi * LEGACY_GROUP * ab;
                        const int nbk = gi == ng - 1 && rem ? rem : 4;
                        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) if (j < nbk) gemm_blk(pg, j, xb + j * ab, min, acc);
                    }
                    if (g1 < ng) {
                        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) _mm512_store_ps(st + 16 * i, acc[i / 4][i % 4]);
                    } else {
                        gemm_store(acc, y + r0 + 4 * p, ldy, c0, ncols, nrv);
                    }
                }
            }
        }
    }
}

/* ---- one group of columns: the decode fused with the compute -------------- */

/* 11..16 columns (one prep group; batched decode): the row-block scheme
 * above decodes a block of rows into L2-sized scratch, pays for it once per
 * row and spreads it over at most 16 columns. Here a panel of four rows is
 * decoded one weight group (four blocks) at a time into a 64-byte aligned
 * buffer on the stack (L1) and consumed at once by gemm_blk, the
 * same per-(row, column) steps as run, so the same bits. The four rows are
 * four far-apart streams (rows i, q + i, 2q + i, 3q + i), as in the matvec
 * and run_small, each prefetched PF_DIST ahead. */
TERN_INLINE void fused_store(const __m512 acc[4][4], float *y, int64_t ldy, const int64_t *ri, int ncols, int nrv) {
    float t[4][16] __attribute__((aligned(64)));
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) _mm512_store_ps(
        t[i], _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][2]), _mm512_add_ps(acc[i][1], acc[i][3])));
    for (int c = 0; c < ncols; c++)
        for (int i = 0; i < nrv; i++) y[c * ldy + ri[i]] = t[i][c];
}
/* One panel: rows wr[0..3] (duplicates past nrv), their output rows ri. */
#define GEMM_FUSED(attr, name, wblock, grp, fmt, off, min)                                                     \
    TERN_INLINE attr void name##_panel(const kern_gemm_args_t *a, const uint8_t *const *wr, const int64_t *ri,  \
                                         int nrv, float *y, int64_t ldy) {                                \
        const int64_t nb = a->k / QK, ng = nb / LEGACY_GROUP;                                                  \
        const int rem = (int)(nb % LEGACY_GROUP);                                                              \
        const size_t gb = LEGACY_GROUP * sizeof(wblock), ab = min ? GA_Q8_1 : GA_Q8_0;                         \
        const char *xg = a->xg;                                                                                \
        char pg[2][GP_BYTES] __attribute__((aligned(64)));                                                     \
        if (ng > 0) {                                                                                          \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                                              \
                const wgroup_t g = grp(wr[i], fmt);                                                            \
                gemm_dec_grp(&g, off, pg[0], i);                                                               \
            }                                                                                                  \
        }                                                                                                      \
        __m512 acc[4][4];                                                                                      \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) acc[i / 4][i % 4] = _mm512_setzero_ps();         \
        for (int64_t gi = 0; gi < ng; gi++) {                                                              \
            if (gi + 1 < ng) {                                                                             \
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                                      \
                    const uint8_t *wp = wr[i] + (size_t)(gi + 1) * gb;                                     \
                    prefetch_ahead(wp, gb);                                                                \
                    const wgroup_t g = grp(wp, fmt);                                                       \
                    gemm_dec_grp(&g, off, pg[(gi + 1) & 1], i);                                            \
                }                                                                                          \
            }                                                                                              \
            const char *xb = xg + (size_t)gi * LEGACY_GROUP * ab;                                          \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) gemm_blk(pg[gi & 1], j, xb + j * ab, min, acc); \
        }                                                                                                  \
        if (rem) {                                                                                             \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                                              \
                const wgroup_t g = grp##_n(wr[i] + (size_t)ng * gb, fmt, rem);                                 \
                gemm_dec_grp(&g, off, pg[0], i);                                                                  \
            }                                                                                                  \
            const char *xb = xg + (size_t)ng * LEGACY_GROUP * ab;                                              \
            for (int j = 0; j < rem; j++) gemm_blk(pg[0], j, xb + j * ab, min, acc);                              \
        }                                                                                                      \
        fused_store(acc, y, ldy, ri, (int)a->n, nrv);                                                          \
    }                                                                                                          \
    attr static void name##_fused(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows,   \
                                  float *y, int64_t ldy) {                                                     \
        const int64_t q = nrows >= 16 ? nrows / 4 : 0; /* rows per stream */                                   \
        for (int64_t i = 0; i < q; i++) {                                                                      \
            const uint8_t *wr[4];                                                                              \
            int64_t ri[4];                                                                                     \
            for (int s = 0; s < 4; s++) {                                                                      \
                ri[s] = s * q + i;                                                                             \
                wr[s] = (const uint8_t *)w + (size_t)ri[s] * row_bytes;                                        \
            }                                                                                                  \
            name##_panel(a, wr, ri, 4, y, ldy);                                                                \
        }                                                                                                      \
        for (int64_t r = 4 * q; r < nrows; r += 4) {                                                           \
            const int nr = nrows - r < 4 ? (int)(nrows - r) : 4;                                               \
            const uint8_t *wr[4];                                                                              \
            int64_t ri[4];                                                                                     \
            for (int s = 0; s < 4; s++) {                                                                      \
                ri[s] = r + (s < nr ? s : 0);                                                                  \
                wr[s] = (const uint8_t *)w + (size_t)ri[s] * row_bytes;                                        \
            }                                                                                                  \
            name##_panel(a, wr, ri, nr, y, ldy);                                                               \
        }                                                                                                      \
    }

GEMM_FUSED(, q4_0, block_q4_0, gemm_grp_plain, FMT_Q4_0, 8, false)
GEMM_FUSED(, q4_1, block_q4_1, gemm_grp_plain, FMT_Q4_1, 0, true)
GEMM_FUSED(, q5_0, block_q5_0, gemm_grp_plain, FMT_Q5_0, 16, false)
GEMM_FUSED(, q5_1, block_q5_1, gemm_grp_plain, FMT_Q5_1, 0, true)
GEMM_FUSED(, q8_0, block_q8_0, gemm_grp_plain, FMT_Q8_0, 128, false)
GEMM_FUSED(VBMI, q4_0_vbmi, block_q4_0, gemm_grp_vbmi, FMT_Q4_0, 8, false)
GEMM_FUSED(VBMI, q4_1_vbmi, block_q4_1, gemm_grp_vbmi, FMT_Q4_1, 0, true)
GEMM_FUSED(VBMI, q5_0_vbmi, block_q5_0, gemm_grp_vbmi, FMT_Q5_0, 16, false)
GEMM_FUSED(VBMI, q5_1_vbmi, block_q5_1, gemm_grp_vbmi, FMT_Q5_1, 0, true)
GEMM_FUSED(VBMI, q8_0_vbmi, block_q8_0, gemm_grp_vbmi, FMT_Q8_0, 128, false)

#define GEMM_RUN(attr, name, fname, dec, min)                                                                      \
    attr static void name(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y, \
                          int64_t ldy, void *scratch) {                                                       \
        if (a->n > 8 && a->n <= KERN_GEMM_GROUP) {                                                                        \
            fname##_fused(a, w, row_bytes, nrows, y, ldy);                                                    \
            return;                                                                                           \
        }                                                                                                     \
        gemm_run(a, w, row_bytes, nrows, y, ldy, scratch, dec, min);                                          \
    }

GEMM_RUN(, run_q4_0, q4_0, dec_q4_0, false)
GEMM_RUN(, run_q4_1, q4_1, dec_q4_1, true)
GEMM_RUN(, run_q5_0, q5_0, dec_q5_0, false)
GEMM_RUN(, run_q5_1, q5_1, dec_q5_1, true)
GEMM_RUN(, run_q8_0, q8_0, dec_q8_0, false)
GEMM_RUN(VBMI, run_q4_0_vbmi, q4_0_vbmi, dec_q4_0_vbmi, false)
GEMM_RUN(VBMI, run_q4_1_vbmi, q4_1_vbmi, dec_q4_1_vbmi, true)
GEMM_RUN(VBMI, run_q5_0_vbmi, q5_0_vbmi, dec_q5_0_vbmi, false)
GEMM_RUN(VBMI, run_q5_1_vbmi, q5_1_vbmi, dec_q5_1_vbmi, true)
GEMM_RUN(VBMI, run_q8_0_vbmi, q8_0_vbmi, dec_q8_0_vbmi, false)

static const kern_gemm_t gemm_q4_0 = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q4_0, LEGACY_SMALL_COLS_Q4_0, legacy_small_q4_0};
static const kern_gemm_t gemm_q4_1 = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q4_1, LEGACY_SMALL_COLS, legacy_small_q4_1};
static const kern_gemm_t gemm_q5_0 = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q5_0, LEGACY_SMALL_COLS, legacy_small_q5_0};
static const kern_gemm_t gemm_q5_1 = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q5_1, LEGACY_SMALL_COLS, legacy_small_q5_1};
static const kern_gemm_t gemm_q8_0 = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q8_0, LEGACY_SMALL_COLS, legacy_small_q8_0};
static const kern_gemm_t gemm_q4_0_vbmi = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q4_0_vbmi, LEGACY_SMALL_COLS_Q4_0, legacy_small_q4_0_vbmi};
static const kern_gemm_t gemm_q4_1_vbmi = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q4_1_vbmi, LEGACY_SMALL_COLS, legacy_small_q4_1_vbmi};
static const kern_gemm_t gemm_q5_0_vbmi = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q5_0_vbmi, LEGACY_SMALL_COLS, legacy_small_q5_0_vbmi};
static const kern_gemm_t gemm_q5_1_vbmi = {gsize_q8_1, prep_q8_1, gemm_scratch_size, run_q5_1_vbmi, LEGACY_SMALL_COLS, legacy_small_q5_1_vbmi};
static const kern_gemm_t gemm_q8_0_vbmi = {gsize_q8_0, prep_q8_0, gemm_scratch_size, run_q8_0_vbmi, LEGACY_SMALL_COLS, legacy_small_q8_0_vbmi};

const kern_gemm_t *const legacy_avx512_gemm[FMT_COUNT] = {&gemm_q4_0, &gemm_q4_1, &gemm_q5_0, &gemm_q5_1, &gemm_q8_0};
const kern_gemm_t *const legacy_avx512_gemm_vbmi[FMT_COUNT] = {&gemm_q4_0_vbmi, &gemm_q4_1_vbmi, &gemm_q5_0_vbmi,
                                                               &gemm_q5_1_vbmi, &gemm_q8_0_vbmi};

#endif /* __x86_64__ */
