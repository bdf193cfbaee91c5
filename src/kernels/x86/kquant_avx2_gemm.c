/*
 * kquant_avx2_gemm.c - the AVX2 GEMMs (kern_gemm_t) of Q4_K, Q5_K and Q6_K
 * weights against Q8_K activations, used for 5 or more columns, plain and
 * in AVX-VNNI builds (functions with target "avxvnni", registered by
 * kquant_avx2_matvec.c only where the CPU has it and the options allow
 * it). Every (row, column) takes THE FLOAT ORDER stated at the top of
 * kquant_avx2_matvec.c (exact T_b, M_b per super-block, one float chain),
 * so the GEMMs give the bits of the dot; kquant_avx2.h holds what the two
 * files share.
 *
 * ---- GEMM (kern_gemm_t) ---------------------------------------------------
 *
 * prep lays out a group of 16 columns as two halves of 8 (one ymm of int32
 * = 8 columns), per half and super-block (ga_act_sb bytes): 64 vectors,
 * vector i = k-slice 4i..4i+3 of the 8 columns (dword c = column c), signed
 * bytes as quantized (Q4_K, Q5_K: ga_prep_affine, shared by the two) or each
 * byte + 128 (unsigned: Q6_K, ga_prep_q6); Q4_K / Q5_K: 4 vectors of
 * (S_2i, S_2i+1) int16 pairs, S_j = bsums[2j] + bsums[2j+1]; the 8 da.
 * (8 x 8 dword transposes. Lanes of missing columns are zero.) run decodes
 * blocks of rows into per-thread scratch (ga_row_t: 256 weight bytes in
 * natural order, Q4_K 0..15, Q5_K 0..31 (unsigned), Q6_K q - 32 (signed);
 * scales as int16 pairs; mins pairs; d, dmin; Q6_K's negc = -128 * sum_j
 * sc_j * sum_{i in j} w_i, the correction of the +128 offset, from maddubs
 * of q + 32 with each byte's scale), then loops column blocks (L2), row
 * blocks (L2), k-chunks of GA_KC super-blocks (a group's chunk in L1),
 * groups, panels of GA_R rows: the micro-kernel, GA_R rows x 16 columns
 * (both halves of the group; 8 where the group's second half is empty).
 * Per super-block and row, T starts at 0 (Q6_K: negc); per run of KS
 * k-slices of one sub-block (Q4_K 8 = the whole sub-block, Q5_K 4, Q6_K 2:
 * the int16 bound, 8 * 2 * 15 * 128, 4 * 2 * 31 * 128 and 2 * 2 * 32 * 255
 * < 2^15), each activation vector is loaded once and serves every row, and
 * each weight dword broadcast serves both halves: maddubs of the row's
 * weight dword broadcast (unsigned) with the activations (signed) for Q4_K /
 * Q5_K, of the activations + 128 with the weights (signed) for Q6_K, summed
 * in int16 along the run (kept a chain by an empty asm: GCC would
 * reassociate it into trees that spill), then T += madd(that, the broadcast
 * scale pair). M_b is four madds of the row's mins pairs against the S
 * vectors; then the chain above with 8 lanes = 8 columns (DA * broadcast d:
 * the same float products). The chains wait in scratch between k-chunks (a
 * stored float reloads exactly), [group][half][row][8 columns], and go out
 * to y by 8 x 8 float transposes.
 * The Q4_K micro-kernel is bound by the three vector ALU ports: per row,
 * 8 columns and super-block 64 maddubs + 56 int16 adds + 8 + 7 (T) + 4 + 3
 * (M) + 6 float operations; in L1 it runs close to that bound (measured:
 * docs/PERF.md). Fewer loads (the 16-column panel) or other panel heights
 * cannot beat that bound; only fewer operations per product could. The
 * choices here (the 3-row x 16-column panel, Q6_K negc by maddubs, Q4_K /
 * Q5_K rows of 320 bytes since decode is bound by its stores' traffic to
 * L2, the transposed output, the vectorized prep and act fn, signed
 * activations for Q4_K / Q5_K, the chain asm) and the ones tried without
 * gain (prefetching the next row block's weights, decoding one k-chunk at a
 * time into an L1-sized buffer, decoding in dec's order, other GA_KC /
 * row-block sizes, 2 x 16 panels, which make the compiler reload the
 * activations per row, and 4..6 x 16, which spill) were measured:
 * docs/PERF.md.
 *
 * ---- AVX-VNNI GEMMs (gv_*, function target "avxvnni") ---------------------
 *
 * Registered for ISA_AVX2 in place of the GEMMs above where the CPU has
 * AVX-VNNI (Alder Lake and later client cores, Sapphire Rapids;
 * cpu_features()->avxvnni) and the options allow it (kern_options_t.avxvnni,
 * which TERN_NO_AVXVNNI turns off). The same decode,
 * driver and float steps; only the integer work of the micro-kernel
 * changes, and T_b, M_b are the same exact integers, so the results are the
 * plain GEMM's bits. vpdpbusd (u8 x s8, 4 products into an int32) replaces
 * maddubs + the int16 adds; vpdpwssd (madd + add) applies the scale pairs.
 * The scale still has to be applied to int16 sums (vpmulld is 2 uops on
 * the same two ports as dpbusd), so a sub-block's int32 sums are split in
 * two halves that fit int16 and packed:
 * Q4_K / Q5_K (gv_kernel, own prep gv_prep_affine): vector 2m + g of a
 * half and super-block = qword m (8 k-bytes) of columns 4g..4g+3, so
 * dpbusd with the row's weight qword broadcast gives per column two sums
 * (its dwords 2l, 2l + 1: the 4-byte halves of the qwords); over a run of
 * Q4_K 4 qwords (the sub-block: 16 products each, 16 * 15 * 128 < 2^15),
 * Q5_K 2 (8 * 31 * 128 < 2^15), packs_epi32 of the two column groups puts
 * each column's two sums into one dword, the columns in lane order gv_perm
 * (0 1 4 5 2 3 6 7; the S pairs and da are prepped in that order, the
 * output transposes store lane d to column gv_perm[d]), then T = dpwssd(T,
 * that, scale pair): per row, 8 columns and super-block Q4_K 64 dpbusd +
 * 8 packs + 8 dpwssd (+ 4 for M + 6 float) against 148 operations, now
 * bound by the two ports that take dpbusd / dpwssd / float (82 of them;
 * it runs close to that bound, measured: docs/PERF.md). The halves of a group go one after the other
 * (3 rows x 8 columns: 6 sums, 3 T, 2 activation vectors in registers).
 * Q6_K (gv_kernel_q6): the plain layout and runs (2 k-slices), with T =
 * dpwssd(T, run sum, scale pair) for madd + add: its int16 bound allows no
 * more than 4 products per sum, and dpbusd over a sub-block + vpmulld
 * would use those two ports as often (64 + 2 * 16 per row, 8 columns and
 * super-block).
 * The gain over the plain GEMM, the variants tried (4-row panels, other
 * GA_KC, other row-block sizes) and the time profile are measured in
 * docs/PERF.md. The matvec (dot / rows) functions are memory-bound and
 * have no VNNI variant.
 */
#include "kernels/x86/kquant_avx2.h"

/* ---- GEMM (kern_gemm_t) ---------------------------------------------------------- */

#define GA_LANES 8  /* columns per vector */
#define GA_HALVES (KERN_GEMM_GROUP / GA_LANES)
#ifndef GA_R
#define GA_R 3 /* rows per micro-kernel panel */
#endif
#ifndef GA_MC_MAX
#define GA_MC_MAX 64
#endif
#ifndef GA_MC_BYTES
#define GA_MC_BYTES (256 * 1024)
#endif
#ifndef GA_KC
#define GA_KC 4 /* super-blocks per k-chunk: 4 x 2 halves x 2.2 KB of a group's activations (L1) */
#endif
#define GA_GMAX 32
#define GA_GMAX_BYTES (768 * 1024)
/* One half-group (8 columns) and super-block of a prep layout (q6: Q6_K's,
 * else Q4_K / Q5_K's): the k-slices at 0, Q4_K / Q5_K's S pairs at GA_ACT_P,
 * the da at ga_act_d, ga_act_sb(q6) bytes in all (64-byte multiples). */
#define GA_ACT_P (64 * 32)
#define GA_ACT_SB_MAX (64 * 32 + 4 * 32 + 64)
TERN_INLINE size_t ga_act_d(const int q6) { return q6 ? 64 * 32 : 64 * 32 + 4 * 32; }
TERN_INLINE size_t ga_act_sb(const int q6) { return ga_act_d(q6) + 64; }
_Static_assert(GA_HALVES == 2, "two vectors of 8 columns per group");

/* One row's super-block, decoded: w: the 256 weights in natural order
 * (Q4_K 0..15, Q5_K 0..31, unsigned; Q6_K q - 32, signed); sc, sc_hi: sub-
 * block scale j (sc_hi: j - 8, Q6_K) as an int16 pair (sc_j, sc_j); mn:
 * mins pairs (m_2i, m_2i+1); negc: Q6_K -128 * sum_j sc_j * sum_{i in j} w_i
 * (the +128 offset of its activations), 0 for Q4_K / Q5_K. Rows lie
 * ga_row_bytes apart: Q4_K / Q5_K rows end before sc_hi (less to write in
 * decode, which is bound by its stores' traffic to L2). */
typedef struct {
    int8_t w[QK_K];
    uint32_t sc[8];
    uint32_t mn[4];
    float d, dmin;
    int32_t negc, pad;
    uint32_t sc_hi[8];
} ga_row_t;
_Static_assert(sizeof(ga_row_t) % 32 == 0 && offsetof(ga_row_t, sc_hi) % 32 == 0, "ga_row_t: whole 32-byte units");
TERN_INLINE size_t ga_row_bytes(const int q6) { return q6 ? sizeof(ga_row_t) : offsetof(ga_row_t, sc_hi); }
/* Decoded row i of a buffer of such rows. */
TERN_INLINE ga_row_t *ga_row(ga_row_t *base, int64_t i, const int q6) {
    return (ga_row_t *)((char *)base + (size_t)i * ga_row_bytes(q6));
}
TERN_INLINE const ga_row_t *ga_crow(const ga_row_t *base, int64_t i, const int q6) {
    return (const ga_row_t *)((const char *)base + (size_t)i * ga_row_bytes(q6));
}
TERN_INLINE const uint32_t *ga_sc(const ga_row_t *o, int j) { return j < 8 ? &o->sc[j] : &o->sc_hi[j - 8]; }

TERN_INLINE size_t ga_group_size(int64_t k, const int q6) {
    if (k <= 0 || k % QK_K) return 0;
    const uint64_t nb = (uint64_t)(k / QK_K);
    if (nb > SIZE_MAX / (GA_HALVES * GA_ACT_SB_MAX)) return 0;
    return (size_t)nb * GA_HALVES * ga_act_sb(q6);
}
static size_t ga_group_size_affine(int64_t k) { return ga_group_size(k, 0); }
static size_t ga_group_size_q6(int64_t k) { return ga_group_size(k, 1); }

static int64_t ga_mc(int64_t nb) {
    const int64_t per_row = nb * (int64_t)sizeof(ga_row_t);
    int64_t mc = (int64_t)GA_MC_BYTES / (per_row > 0 ? per_row : 1) / GA_R * GA_R;
    if (mc < GA_R) mc = GA_R;
    if (mc > GA_MC_MAX / GA_R * GA_R) mc = GA_MC_MAX / GA_R * GA_R;
    return mc; /* a multiple of GA_R */
}

static size_t ga_dec_bytes(int64_t nb) {
    return ((size_t)ga_mc(nb) * (size_t)nb * sizeof(ga_row_t) + 63) & ~(size_t)63;
}

static int64_t ga_gmax(int64_t nb) {
    const int64_t per_group = nb * (int64_t)(GA_HALVES * GA_ACT_SB_MAX);
    int64_t g = (int64_t)GA_GMAX_BYTES / (per_group > 0 ? per_group : 1);
    if (g < 1) g = 1;
    if (g > GA_GMAX) g = GA_GMAX;
    return g;
}

/* chains of one column block: [group][half][row][GA_LANES] floats, ga_mc rows */
static size_t ga_scratch_size(int64_t k) {
    if (k <= 0 || k % QK_K) return 0;
    const uint64_t nb = (uint64_t)(k / QK_K);
    if (nb > SIZE_MAX / 2 / sizeof(ga_row_t) / GA_MC_MAX) return SIZE_MAX;
    return ga_dec_bytes((int64_t)nb) +
           (size_t)ga_mc((int64_t)nb) * (size_t)ga_gmax((int64_t)nb) * GA_HALVES * GA_LANES * sizeof(float);
}

/* One group of ncols (1..16) Q8_K columns: half h (columns 8h..8h+7) at
 * h * nb * ga_act_sb, super-block b of it at b * ga_act_sb:
 *   [0]          64 vectors: dword c of vector i = bytes 4i..4i+3 of column
 *                c: signed, as quantized (Q4_K / Q5_K), or each byte XOR
 *                0x80 (a + 128 as an unsigned byte; Q6_K);
 *   [GA_ACT_P]   (Q4_K / Q5_K) 4 vectors: dword c of vector i = (S_2i,
 *                S_2i+1) of column c as int16, S_j = bsums[2j] + bsums[2j+1];
 *   [ga_act_d]   the 8 columns' da (then 32 zero bytes).
 * Missing columns are zeros. */
TERN_INLINE void ga_prep(int64_t k, const void *xav, size_t st, int ncols, void *xgv, const int q6) {
    TERN_CHECK(k % QK_K == 0 && ncols >= 1 && ncols <= KERN_GEMM_GROUP);
    const char *xa = xav;
    const int64_t nb = k / QK_K;
    const size_t sb = ga_act_sb(q6), od = ga_act_d(q6);
    for (int hf = 0; hf < GA_HALVES; hf++) {
        const int nc = ncols - GA_LANES * hf < GA_LANES ? ncols - GA_LANES * hf : GA_LANES;
        if (nc <= 0) { /* a half without columns: zeros */
            memset((uint8_t *)xgv + (size_t)hf * (size_t)nb * sb, 0, (size_t)nb * sb);
            continue;
        }
        uint32_t flip[GA_LANES];
        for (int l = 0; l < GA_LANES; l++) flip[l] = q6 && l < nc ? 0x80808080u : 0;
        const __m256i fl = loadu256(flip);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = (uint8_t *)xgv + ((size_t)hf * (size_t)nb + (size_t)b) * sb;
            const block_q8_K *a[GA_LANES];
            for (int l = 0; l < GA_LANES; l++) a[l] = l < nc ? act_at(xa, st, GA_LANES * hf + l, b) : NULL;
            /* 8 x 8 dword transposes: vector m of column l (dwords 8m..8m+7) -> dword l of vectors 8m..8m+7 */
            for (int m = 0; m < 8; m++) {
                __m256i v[GA_LANES], t[GA_LANES];
                for (int l = 0; l < GA_LANES; l++) v[l] = a[l] ? loadu256(a[l]->qs + 32 * m) : _mm256_setzero_si256();
                for (int l = 0; l < GA_LANES; l += 2) {
                    t[l] = _mm256_unpacklo_epi32(v[l], v[l + 1]);     /* dwords 0, 1 | 4, 5 of l, l+1 */
                    t[l + 1] = _mm256_unpackhi_epi32(v[l], v[l + 1]); /* 2, 3 | 6, 7 */
                }
                for (int l = 0; l < GA_LANES; l += 4) {
                    v[l] = _mm256_unpacklo_epi64(t[l], t[l + 2]);         /* dword 0 | 4 of columns l..l+3 */
                    v[l + 1] = _mm256_unpackhi_epi64(t[l], t[l + 2]);     /* 1 | 5 */
                    v[l + 2] = _mm256_unpacklo_epi64(t[l + 1], t[l + 3]); /* 2 | 6 */
                    v[l + 3] = _mm256_unpackhi_epi64(t[l + 1], t[l + 3]); /* 3 | 7 */
                }
                for (int i = 0; i < 4; i++) {
                    const __m256i lo = _mm256_permute2x128_si256(v[i], v[4 + i], 0x20); /* dword i */
                    const __m256i hi = _mm256_permute2x128_si256(v[i], v[4 + i], 0x31); /* dword 4 + i */
                    _mm256_storeu_si256((__m256i *)(o + 32 * (8 * m + i)), _mm256_xor_si256(lo, fl));
                    _mm256_storeu_si256((__m256i *)(o + 32 * (8 * m + 4 + i)), _mm256_xor_si256(hi, fl));
                }
            }
            uint32_t P[4][GA_LANES];
            float D[2 * GA_LANES];
            for (int l = 0; l < GA_LANES; l++) {
                uint32_t s4[4] = {0, 0, 0, 0};
                D[l] = D[GA_LANES + l] = 0.0f;
                if (a[l]) {
                    /* (S_2i, S_2i+1) int16 pairs, S_j = bsums[2j] + bsums[2j+1] (wrapping, exact here) */
                    const __m128i h = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)a[l]->bsums),
                                                     _mm_loadu_si128((const __m128i *)(a[l]->bsums + 8)));
                    _mm_storeu_si128((__m128i *)s4, h);
                    D[l] = a[l]->d;
                }
                for (int i = 0; i < 4; i++) P[i][l] = s4[i];
            }
            if (!q6) memcpy(o + GA_ACT_P, P, sizeof P);
            memcpy(o + od, D, sizeof D);
        }
    }
}
static void ga_prep_affine(int64_t k, const void *xa, size_t st, int ncols, void *xg) { ga_prep(k, xa, st, ncols, xg, 0); }
static void ga_prep_q6(int64_t k, const void *xa, size_t st, int ncols, void *xg) { ga_prep(k, xa, st, ncols, xg, 1); }

TERN_INLINE int32_t hsum_epi32_256(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* One Q4_K (q5 = 0) / Q5_K block into o: the unpacking of affine_row,
 * stored in natural order. */
TERN_INLINE void ga_decode_affine(const void *blk, ga_row_t *o, const int q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const uint8_t *scales, *qs, *qhp = NULL;
    fp16_t hd, hm;
    if (q5) {
        const block_q5_K *w = blk;
        scales = w->scales, qs = w->qs, qhp = w->qh, hd = w->d, hm = w->dmin;
    } else {
        const block_q4_K *w = blk;
        scales = w->scales, qs = w->qs, hd = w->d, hm = w->dmin;
    }
    uint64_t sc8, m8;
    kquant_scales_k4(scales, &sc8, &m8);
    __m256i hb = q5 ? loadu256(qhp) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256i q = loadu256(qs + 32 * j);
        __m256i ql = _mm256_and_si256(q, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (q5) {
            ql = _mm256_or_si256(ql, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
            qh = _mm256_or_si256(qh, _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
            hb = _mm256_srli_epi16(hb, 2);
        }
        _mm256_storeu_si256((__m256i *)(o->w + 64 * j), ql);
        _mm256_storeu_si256((__m256i *)(o->w + 64 * j + 32), qh);
    }
    const __m128i sb = _mm_cvtsi64_si128((long long)sc8);
    _mm256_storeu_si256((__m256i *)o->sc, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sb, sb))); /* (sc_j, sc_j) */
    _mm_storeu_si128((__m128i *)o->mn, _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m8))); /* (m_2i, m_2i+1) */
    o->negc = 0; /* signed activations: no offset */
    o->d = _cvtsh_ss(hd);
    o->dmin = _cvtsh_ss(hm);
    o->pad = 0;
}

/* One Q6_K block into o: the unpacking of q6k_block, minus 32. */
TERN_INLINE void ga_decode_q6(const block_q6_K *w, ga_row_t *o) {
    const __m256i m32 = _mm256_set1_epi8(32), ones = _mm256_set1_epi16(1);
    const __m128i s8 = _mm_loadu_si128((const __m128i *)w->scales);
    const __m256i B = _mm256_broadcastsi128_si256(s8);
    const __m256i sc16 = _mm256_cvtepi8_epi16(s8); /* sc_0..sc_15 */
    /* negc / -128 = sum_j sc_j * sum_{i in j} (q_i - 32) = sum_i sc_j(i) * q_i - 512 * sum_j sc_j, with
     * q = w + 32 unsigned: maddubs with the scale of each byte (pairs <= 2 * 63 * 128, two vectors
     * summed in int16 < 2^15) */
    __m256i acc = _mm256_madd_epi16(sc16, _mm256_set1_epi16(-512));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        q6k_unpack_half(w, h, q);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) _mm256_storeu_si256((__m256i *)(o->w + 128 * h + 32 * i), _mm256_sub_epi8(q[i], m32));
#pragma GCC unroll 2
        for (int i = 0; i < 4; i += 2) {
            /* q[i]: sub-block 8h + 2i (low lane), 8h + 2i + 1 (high lane) */
            const int j = 8 * h + 2 * i;
            const __m256i i0 = _mm256_setr_m128i(_mm_set1_epi8((char)j), _mm_set1_epi8((char)(j + 1)));
            const __m256i i1 = _mm256_setr_m128i(_mm_set1_epi8((char)(j + 2)), _mm_set1_epi8((char)(j + 3)));
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q[i], _mm256_shuffle_epi8(B, i0)),
                                               _mm256_maddubs_epi16(q[i + 1], _mm256_shuffle_epi8(B, i1)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
        }
    }
    /* (sc_j, sc_j) int16 pairs */
    const __m256i lo = _mm256_unpacklo_epi16(sc16, sc16), hi = _mm256_unpackhi_epi16(sc16, sc16);
    _mm256_storeu_si256((__m256i *)o->sc, _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256((__m256i *)o->sc_hi, _mm256_permute2x128_si256(lo, hi, 0x31));
    memset(o->mn, 0, sizeof o->mn);
    o->negc = -128 * hsum_epi32_256(acc);
    o->d = _cvtsh_ss(w->d);
    o->dmin = 0.0f;
    o->pad = 0;
}

TERN_INLINE __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* maddubs of 4-byte slices: Q6_K activations + 128 (unsigned) x weights q - 32
 * (signed); Q4_K / Q5_K weights (unsigned) x activations (signed). */
TERN_INLINE __m256i ga_mul(__m256i a, __m256i w, const int q6) {
    return q6 ? _mm256_maddubs_epi16(a, w) : _mm256_maddubs_epi16(w, a);
}

/* GA_R rows (pw: [b][GA_R] decoded) x 8 nh columns (x: half 0 of a group
 * at the first super-block, half 1 at x + xh) over nb super-blocks,
 * continuing the float chains st[h] (first: from +0.0f). Per sub-block,
 * k-slices in runs of KS (Q4_K 8, Q5_K 4, Q6_K 2: the int16 bound): ga_mul
 * of the activations with the row's weight dword broadcast (one broadcast
 * serves both halves), summed in int16 along the run, then madd with the
 * scale pair into T. */
TERN_INLINE void ga_kernel(const ga_row_t *pw, const uint8_t *x, size_t xh, int64_t nb, float *st, size_t hs,
                         int first, const int fmt, const int nh) {
    /* k-slices per run / per sub-block */
    const int q6 = fmt == 2, ks = fmt == 0 ? 8 : fmt == 1 ? 4 : 2, sub = q6 ? 4 : 8;
    const size_t sb = ga_act_sb(q6), od = ga_act_d(q6);
    __m256 acc[GA_HALVES][GA_R];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) acc[h][r] = first ? _mm256_setzero_ps() : _mm256_load_ps(st + h * hs + GA_LANES * r);
    for (int64_t b = 0; b < nb; b++, x += sb) {
        const ga_row_t *w[GA_R];
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) w[r] = ga_crow(pw, b * GA_R + r, q6);
        __m256i T[GA_HALVES][GA_R];
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) T[h][r] = q6 ? _mm256_set1_epi32(w[r]->negc) : _mm256_setzero_si256();
#ifndef GA_UNROLL
#define GA_UNROLL 16
#endif
        KQ_UNROLL(GA_UNROLL)
        for (int i0 = 0; i0 < 64; i0 += ks) {
            const int j = i0 / sub;
            __m256i s16[GA_HALVES][GA_R];
#pragma GCC unroll 8
            for (int i = i0; i < i0 + ks; i++) {
                __m256i a[GA_HALVES];
#pragma GCC unroll 2
                for (int h = 0; h < nh; h++) a[h] = loadu256(x + h * xh + 32 * i);
#pragma GCC unroll 8
                for (int r = 0; r < GA_R; r++) {
                    const __m256i wb = bcast32(w[r]->w + 4 * i);
#pragma GCC unroll 2
                    for (int h = 0; h < nh; h++) {
                        const __m256i p = ga_mul(a[h], wb, q6);
                        s16[h][r] = i == i0 ? p : _mm256_add_epi16(s16[h][r], p);
                        if (!q6) KQ_OPAQUE(s16[h][r]);
                    }
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) {
                const __m256i sc = bcast32(ga_sc(w[r], j));
#pragma GCC unroll 2
                for (int h = 0; h < nh; h++) T[h][r] = _mm256_add_epi32(T[h][r], _mm256_madd_epi16(s16[h][r], sc));
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++) {
            const uint8_t *xx = x + h * xh;
            const __m256 DA = _mm256_loadu_ps((const float *)(xx + od));
            if (q6) {
#pragma GCC unroll 8
                for (int r = 0; r < GA_R; r++)
                    acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T[h][r]), _mm256_mul_ps(DA, _mm256_set1_ps(w[r]->d)), acc[h][r]);
            } else {
#pragma GCC unroll 8
                for (int r = 0; r < GA_R; r++) {
                    __m256i m = _mm256_madd_epi16(loadu256(xx + GA_ACT_P), bcast32(&w[r]->mn[0]));
#pragma GCC unroll 3
                    for (int i = 1; i < 4; i++)
                        m = _mm256_add_epi32(m, _mm256_madd_epi16(loadu256(xx + GA_ACT_P + 32 * i), bcast32(&w[r]->mn[i])));
                    acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T[h][r]), _mm256_mul_ps(DA, _mm256_set1_ps(w[r]->d)), acc[h][r]);
                    acc[h][r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(DA, _mm256_set1_ps(w[r]->dmin)), acc[h][r]);
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) _mm256_store_ps(st + h * hs + GA_LANES * r, acc[h][r]);
}

#define GA_KERNELS(fmt, name)                                                                                       \
    static void ga_kernel_##name##_1(const ga_row_t *pw, const uint8_t *x, size_t xh, int64_t nb, float *st,       \
                                     size_t hs, int first) {                                                       \
        ga_kernel(pw, x, xh, nb, st, hs, first, fmt, 1);                                                           \
    }                                                                                                              \
    static void ga_kernel_##name##_2(const ga_row_t *pw, const uint8_t *x, size_t xh, int64_t nb, float *st,       \
                                     size_t hs, int first) {                                                       \
        ga_kernel(pw, x, xh, nb, st, hs, first, fmt, 2);                                                           \
    }
GA_KERNELS(0, q4)
GA_KERNELS(1, q5)
GA_KERNELS(2, q6)

/* ---- AVX-VNNI GEMM kernels (target "avxvnni") ------------------------------------ */

#define GV_DEF __attribute__((target("avxvnni"))) static

/* Q4_K / Q5_K layout (gv_prep_affine): as ga_prep's, but the 64 vectors of a
 * half and super-block are vector 2m + g = qword m (bytes 8m..8m+7) of
 * columns 4g..4g+3 (dwords 2l, 2l+1 = column 4g + l), and the S pairs and
 * da are in lane order gv_perm: lane d holds column gv_perm[d], the column
 * order that packs_epi32 of two such vectors' sums leaves (see gv_kernel). */
static const int gv_perm[GA_LANES] = {0, 1, 4, 5, 2, 3, 6, 7};
static const int ga_ident[GA_LANES] = {0, 1, 2, 3, 4, 5, 6, 7};

static void gv_prep_affine(int64_t k, const void *xav, size_t st, int ncols, void *xgv) {
    TERN_CHECK(k % QK_K == 0 && ncols >= 1 && ncols <= KERN_GEMM_GROUP);
    const char *xa = xav;
    const int64_t nb = k / QK_K;
    const size_t sb = ga_act_sb(0), od = ga_act_d(0);
    for (int hf = 0; hf < GA_HALVES; hf++) {
        const int nc = ncols - GA_LANES * hf < GA_LANES ? ncols - GA_LANES * hf : GA_LANES;
        if (nc <= 0) {
            memset((uint8_t *)xgv + (size_t)hf * (size_t)nb * sb, 0, (size_t)nb * sb);
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = (uint8_t *)xgv + ((size_t)hf * (size_t)nb + (size_t)b) * sb;
            const block_q8_K *a[GA_LANES];
            for (int l = 0; l < GA_LANES; l++) a[l] = l < nc ? act_at(xa, st, GA_LANES * hf + l, b) : NULL;
            /* 4 x 4 qword transposes: 32-byte chunk n of columns 4g..4g+3 -> qwords 4n..4n+3 */
            for (int g = 0; g < 2; g++)
                for (int n = 0; n < 8; n++) {
                    __m256i v[4];
                    for (int l = 0; l < 4; l++) v[l] = a[4 * g + l] ? loadu256(a[4 * g + l]->qs + 32 * n) : _mm256_setzero_si256();
                    const __m256i t0 = _mm256_unpacklo_epi64(v[0], v[1]), t1 = _mm256_unpackhi_epi64(v[0], v[1]);
                    const __m256i t2 = _mm256_unpacklo_epi64(v[2], v[3]), t3 = _mm256_unpackhi_epi64(v[2], v[3]);
                    __m256i *out = (__m256i *)(o + 32 * (2 * 4 * n + g));
                    _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(t0, t2, 0x20)); /* qword 4n */
                    _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(t1, t3, 0x20)); /* 4n + 1 */
                    _mm256_storeu_si256(out + 4, _mm256_permute2x128_si256(t0, t2, 0x31)); /* 4n + 2 */
                    _mm256_storeu_si256(out + 6, _mm256_permute2x128_si256(t1, t3, 0x31)); /* 4n + 3 */
                }
            uint32_t P[4][GA_LANES];
            float D[2 * GA_LANES];
            for (int d = 0; d < GA_LANES; d++) {
                const block_q8_K *ac = a[gv_perm[d]];
                uint32_t s4[4] = {0, 0, 0, 0};
                D[d] = D[GA_LANES + d] = 0.0f;
                if (ac) {
                    const __m128i h = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ac->bsums),
                                                     _mm_loadu_si128((const __m128i *)(ac->bsums + 8)));
                    _mm_storeu_si128((__m128i *)s4, h);
                    D[d] = ac->d;
                }
                for (int i = 0; i < 4; i++) P[i][d] = s4[i];
            }
            memcpy(o + GA_ACT_P, P, sizeof P);
            memcpy(o + od, D, sizeof D);
        }
    }
}

TERN_INLINE __m256i bcast64(const void *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}

/* Q4_K / Q5_K: GA_R rows x 8 columns (gv layout), the halves one after the
 * other. Per run of RUN qwords of one sub-block (Q4_K 4 = the sub-block,
 * Q5_K 2: the int16 bound, 16 * 15 * 128 and 8 * 31 * 128 < 2^15), per row
 * and column group g: X = dpbusd of the row's weight qword broadcast with
 * the activations, dword 2l / 2l + 1 of X: column 4g + l's sum over the
 * run's first / second 4-byte halves of each qword; packs_epi32 of the two
 * groups' X (exact: the bound) puts a column's two sums in one dword, lane
 * d = column gv_perm[d]; T = dpwssd(T, that, scale pair). Then M by dpwssd
 * of the mins pairs with the S vectors and the float chain, as ga_kernel. */
TERN_INLINE_TARGET("avxvnni") void gv_kernel(const ga_row_t *pw, const uint8_t *x, size_t xh, int64_t nb, float *st, size_t hs, int first,
                     const int q5, const int nh) {
    const int run = q5 ? 2 : 4;
    const size_t sb = ga_act_sb(0), od = ga_act_d(0);
    for (int h = 0; h < nh; h++) {
        const uint8_t *xx = x + h * xh;
        float *sh = st + h * hs;
        __m256 acc[GA_R];
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) acc[r] = first ? _mm256_setzero_ps() : _mm256_load_ps(sh + GA_LANES * r);
        for (int64_t b = 0; b < nb; b++, xx += sb) {
            const ga_row_t *w[GA_R];
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) w[r] = ga_crow(pw, b * GA_R + r, 0);
            __m256i T[GA_R];
#ifndef GV_UNROLL
#define GV_UNROLL 16
#endif
            KQ_UNROLL(GV_UNROLL)
            for (int m0 = 0; m0 < 32; m0 += run) {
                __m256i X[GA_R][2];
#pragma GCC unroll 4
                for (int m = m0; m < m0 + run; m++) {
                    const __m256i a0 = loadu256(xx + 64 * m), a1 = loadu256(xx + 64 * m + 32);
#pragma GCC unroll 8
                    for (int r = 0; r < GA_R; r++) {
                        const __m256i wq = bcast64(w[r]->w + 8 * m);
                        const __m256i z0 = m == m0 ? _mm256_setzero_si256() : X[r][0];
                        const __m256i z1 = m == m0 ? _mm256_setzero_si256() : X[r][1];
                        X[r][0] = _mm256_dpbusd_avx_epi32(z0, wq, a0);
                        X[r][1] = _mm256_dpbusd_avx_epi32(z1, wq, a1);
                    }
                }
#pragma GCC unroll 8
                for (int r = 0; r < GA_R; r++) {
                    const __m256i p = _mm256_packs_epi32(X[r][0], X[r][1]);
                    const __m256i sc = bcast32(&w[r]->sc[m0 / 4]);
                    T[r] = m0 == 0 ? _mm256_madd_epi16(p, sc) : _mm256_dpwssd_avx_epi32(T[r], p, sc);
                }
            }
            const __m256 DA = _mm256_loadu_ps((const float *)(xx + od));
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) {
                __m256i m = _mm256_madd_epi16(loadu256(xx + GA_ACT_P), bcast32(&w[r]->mn[0]));
#pragma GCC unroll 3
                for (int i = 1; i < 4; i++) m = _mm256_dpwssd_avx_epi32(m, loadu256(xx + GA_ACT_P + 32 * i), bcast32(&w[r]->mn[i]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T[r]), _mm256_mul_ps(DA, _mm256_set1_ps(w[r]->d)), acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(DA, _mm256_set1_ps(w[r]->dmin)), acc[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) _mm256_store_ps(sh + GA_LANES * r, acc[r]);
    }
}

/* Q6_K: ga_kernel's (the same layout and runs) with the scale step fused:
 * T = dpwssd(T, run sum, scale pair) for T + madd. */
TERN_INLINE_TARGET("avxvnni") void gv_kernel_q6(const ga_row_t *pw, const uint8_t *x, size_t xh, int64_t nb, float *st, size_t hs, int first,
                        const int nh) {
    const size_t sb = ga_act_sb(1), od = ga_act_d(1);
    __m256 acc[GA_HALVES][GA_R];
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) acc[h][r] = first ? _mm256_setzero_ps() : _mm256_load_ps(st + h * hs + GA_LANES * r);
    for (int64_t b = 0; b < nb; b++, x += sb) {
        const ga_row_t *w[GA_R];
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) w[r] = ga_crow(pw, b * GA_R + r, 1);
        __m256i T[GA_HALVES][GA_R];
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) T[h][r] = _mm256_set1_epi32(w[r]->negc);
        KQ_UNROLL(GA_UNROLL)
        for (int i0 = 0; i0 < 64; i0 += 2) {
            const int j = i0 / 4;
            __m256i s16[GA_HALVES][GA_R];
#pragma GCC unroll 2
            for (int i = i0; i < i0 + 2; i++) {
                __m256i a[GA_HALVES];
#pragma GCC unroll 2
                for (int h = 0; h < nh; h++) a[h] = loadu256(x + h * xh + 32 * i);
#pragma GCC unroll 8
                for (int r = 0; r < GA_R; r++) {
                    const __m256i wb = bcast32(w[r]->w + 4 * i);
#pragma GCC unroll 2
                    for (int h = 0; h < nh; h++) {
                        const __m256i p = _mm256_maddubs_epi16(a[h], wb);
                        s16[h][r] = i == i0 ? p : _mm256_add_epi16(s16[h][r], p);
                    }
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++) {
                const __m256i sc = bcast32(ga_sc(w[r], j));
#pragma GCC unroll 2
                for (int h = 0; h < nh; h++) T[h][r] = _mm256_dpwssd_avx_epi32(T[h][r], s16[h][r], sc);
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < nh; h++) {
            const __m256 DA = _mm256_loadu_ps((const float *)(x + h * xh + od));
#pragma GCC unroll 8
            for (int r = 0; r < GA_R; r++)
                acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T[h][r]), _mm256_mul_ps(DA, _mm256_set1_ps(w[r]->d)), acc[h][r]);
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 8
        for (int r = 0; r < GA_R; r++) _mm256_store_ps(st + h * hs + GA_LANES * r, acc[h][r]);
}

#define GV_KERNELS(name, call)                                                                                      \
    GV_DEF void gv_kernel_##name##_1(const ga_row_t *pw, const uint8_t *x, size_t xh, int64_t nb, float *st,       \
                                     size_t hs, int first) {                                                       \
        const int nh = 1;                                                                                          \
        call;                                                                                                      \
    }                                                                                                              \
    GV_DEF void gv_kernel_##name##_2(const ga_row_t *pw, const uint8_t *x, size_t xh, int64_t nb, float *st,       \
                                     size_t hs, int first) {                                                       \
        const int nh = 2;                                                                                          \
        call;                                                                                                      \
    }
GV_KERNELS(q4, gv_kernel(pw, x, xh, nb, st, hs, first, 0, nh))
GV_KERNELS(q5, gv_kernel(pw, x, xh, nb, st, hs, first, 1, nh))
GV_KERNELS(q6, gv_kernel_q6(pw, x, xh, nb, st, hs, first, nh))

/* 8 x 8 floats: v[i] = row i -> v[c] = column c. */
TERN_INLINE void ga_transpose8(__m256 v[8]) {
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]), t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
#pragma GCC unroll 2
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44), u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44), u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* run: column blocks (activations in L2), row blocks decoded into scratch
 * (L2), k-chunks (a group's chunk in L1), then groups, panels (both halves
 * of a group at once); the float chains wait in scratch between chunks,
 * [group][half][row][8 columns], and go out by 8 x 8 transposes. */
TERN_INLINE void ga_run(const kern_gemm_args_t *a, const void *wv, size_t row_bytes, int64_t nrows, float *y,
                      int64_t ldy, void *scratch, const int fmt, const int vnni) {
    TERN_CHECK(a->k % QK_K == 0 && a->xg != NULL && scratch != NULL);
    const int64_t nb = a->k / QK_K, ngroups = (a->n + KERN_GEMM_GROUP - 1) / KERN_GEMM_GROUP;
    const int64_t mc_max = ga_mc(nb), gmax = ga_gmax(nb);
    const size_t bsz = fmt == 2 ? sizeof(block_q6_K) : fmt == 1 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t hs = (size_t)mc_max * GA_LANES; /* floats of one half's chains */
    const char *w = wv;
    ga_row_t *dec = scratch;
    float *st = (float *)((char *)scratch + ga_dec_bytes(nb));
    for (int64_t g0 = 0; g0 < ngroups; g0 += gmax) {
        const int64_t gn = ngroups - g0 < gmax ? ngroups - g0 : gmax;
        for (int64_t r0 = 0; r0 < nrows; r0 += mc_max) {
            const int64_t mc = nrows - r0 < mc_max ? nrows - r0 : mc_max;
            const int64_t np = (mc + GA_R - 1) / GA_R;
            for (int64_t i = 0; i < np * GA_R; i++) {
                ga_row_t *o = ga_row(dec, (i / GA_R) * nb * GA_R + i % GA_R, fmt == 2);
                if (i >= mc) {
                    for (int64_t b = 0; b < nb; b++) memset(ga_row(o, b * GA_R, fmt == 2), 0, ga_row_bytes(fmt == 2));
                    continue;
                }
                const char *row = w + (size_t)(r0 + i) * row_bytes;
                for (int64_t b = 0; b < nb; b++) {
                    const char *blk = row + (size_t)b * bsz;
                    if (fmt == 2) ga_decode_q6((const block_q6_K *)blk, ga_row(o, b * GA_R, 1));
                    else ga_decode_affine(blk, ga_row(o, b * GA_R, 0), fmt == 1);
                }
            }
            for (int64_t k0 = 0; k0 < nb; k0 += GA_KC) {
                const int64_t kc = nb - k0 < GA_KC ? nb - k0 : GA_KC;
                for (int64_t g = 0; g < gn; g++) {
                    /* both halves in one kernel where the group has more than 8 columns */
                    const int nh = (g0 + g) * KERN_GEMM_GROUP + GA_LANES < a->n ? 2 : 1;
                    const size_t xh = (size_t)nb * ga_act_sb(fmt == 2);
                    const uint8_t *xg = (const uint8_t *)a->xg + (size_t)(g0 + g) * a->xg_group + (size_t)k0 * ga_act_sb(fmt == 2);
                    for (int64_t p = 0; p < np; p++) {
                        const ga_row_t *pw = ga_crow(dec, (p * nb + k0) * GA_R, fmt == 2);
                        float *s = st + (size_t)g * GA_HALVES * hs + (size_t)p * GA_R * GA_LANES;
                        const int first = k0 == 0;
                        if (vnni) {
                            if (fmt == 2) (nh == 2 ? gv_kernel_q6_2 : gv_kernel_q6_1)(pw, xg, xh, kc, s, hs, first);
                            else if (fmt == 1) (nh == 2 ? gv_kernel_q5_2 : gv_kernel_q5_1)(pw, xg, xh, kc, s, hs, first);
                            else (nh == 2 ? gv_kernel_q4_2 : gv_kernel_q4_1)(pw, xg, xh, kc, s, hs, first);
                        } else if (fmt == 2) (nh == 2 ? ga_kernel_q6_2 : ga_kernel_q6_1)(pw, xg, xh, kc, s, hs, first);
                        else if (fmt == 1) (nh == 2 ? ga_kernel_q5_2 : ga_kernel_q5_1)(pw, xg, xh, kc, s, hs, first);
                        else (nh == 2 ? ga_kernel_q4_2 : ga_kernel_q4_1)(pw, xg, xh, kc, s, hs, first);
                    }
                }
            }
            /* out: rows of 8 columns -> columns of y, 8 x 8 at a time (lane d:
             * column perm[d]) */
            const int *perm = vnni && fmt != 2 ? gv_perm : ga_ident;
            for (int64_t g = 0; g < gn; g++) {
                for (int hf = 0; hf < GA_HALVES; hf++) {
                    const int64_t c0 = (g0 + g) * KERN_GEMM_GROUP + hf * GA_LANES;
                    if (c0 >= a->n) break;
                    const int nc = a->n - c0 < GA_LANES ? (int)(a->n - c0) : GA_LANES;
                    const float *out = st + ((size_t)g * GA_HALVES + (size_t)hf) * hs;
                    float *yb = y + c0 * ldy + r0;
                    int64_t r = 0;
                    for (; r + 8 <= mc; r += 8) {
                        __m256 v[8];
#pragma GCC unroll 8
                        for (int i = 0; i < 8; i++) v[i] = _mm256_load_ps(out + (r + i) * GA_LANES);
                        ga_transpose8(v);
                        for (int d = 0; d < GA_LANES; d++)
                            if (perm[d] < nc) _mm256_storeu_ps(yb + perm[d] * ldy + r, v[d]);
                    }
                    for (; r < mc; r++)
                        for (int d = 0; d < GA_LANES; d++)
                            if (perm[d] < nc) yb[perm[d] * ldy + r] = out[r * GA_LANES + d];
                }
            }
        }
    }
}

/* The kern_gemm_t run entries: fmt 0 / 1 / 2 = Q4_K / Q5_K / Q6_K, ga_ the
 * plain tiles, gv_ the AVX-VNNI ones. */
#define GA_RUN_ENTRY(name, fmt, vnni)                                                                     \
    static void name(const kern_gemm_args_t *a, const void *w, size_t rb, int64_t nr, float *y, int64_t ldy, \
                     void *s) {                                                                           \
        ga_run(a, w, rb, nr, y, ldy, s, fmt, vnni);                                                       \
    }
GA_RUN_ENTRY(ga_run_q4k, 0, 0)
GA_RUN_ENTRY(gv_run_q4k, 0, 1)
GA_RUN_ENTRY(ga_run_q5k, 1, 0)
GA_RUN_ENTRY(gv_run_q5k, 1, 1)
GA_RUN_ENTRY(ga_run_q6k, 2, 0)
GA_RUN_ENTRY(gv_run_q6k, 2, 1)

/* One prep for Q4_K and Q5_K (matrices sharing an input and a prep share
 * its layout), one for Q6_K: each layout only what its kernel reads. */
static const kern_gemm_t g_gemm_q4k = {ga_group_size_affine, ga_prep_affine, ga_scratch_size, ga_run_q4k, 0, NULL};
static const kern_gemm_t g_gemm_q5k = {ga_group_size_affine, ga_prep_affine, ga_scratch_size, ga_run_q5k, 0, NULL};
static const kern_gemm_t g_gemm_q6k = {ga_group_size_q6, ga_prep_q6, ga_scratch_size, ga_run_q6k, 0, NULL};
/* AVX-VNNI: Q4_K / Q5_K with their own prep layout (gv_prep_affine), Q6_K
 * with ga_prep_q6's. */
static const kern_gemm_t g_gemm_q4k_vnni = {ga_group_size_affine, gv_prep_affine, ga_scratch_size, gv_run_q4k, 0, NULL};
static const kern_gemm_t g_gemm_q5k_vnni = {ga_group_size_affine, gv_prep_affine, ga_scratch_size, gv_run_q5k, 0, NULL};
static const kern_gemm_t g_gemm_q6k_vnni = {ga_group_size_q6, ga_prep_q6, ga_scratch_size, gv_run_q6k, 0, NULL};

const kern_gemm_t *const kquant_avx2_gemm[3] = {&g_gemm_q4k, &g_gemm_q5k, &g_gemm_q6k};
const kern_gemm_t *const kquant_avx2_gemm_vnni[3] = {&g_gemm_q4k_vnni, &g_gemm_q5k_vnni, &g_gemm_q6k_vnni};
