/*
 * legacy_avx2_matvec.c - AVX2 + FMA + F16C matvec kernels of the 32-element
 * block formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: the dot (one weight row,
 * 1..4 columns), the rows function (2..4 rows in lockstep, 1..2 columns, for
 * the matvec driver), the Q8_0 / Q8_1 activation quantizers, and the
 * registration of the AVX2 entries. Their GEMM for many columns
 * (kern_gemm_t) is in legacy_avx2_gemm.c and computes in the float order
 * below; legacy_avx2.h holds what the two files share. legacy_ref.c holds
 * the scalar oracle and legacy.h the activation row layout that all ISAs
 * share (unchanged here); the float formats are in float_avx2.c. AVX2, FMA
 * and F16C instructions: this runs on Haswell and Zen 2 (no AVX-512). Where
 * the CPU has AVX-VNNI (Intel Alder Lake and later) and the options allow it
 * (kern_options_t.avxvnni, which TERN_NO_AVXVNNI turns off), registration
 * puts the GEMM's second build in the AVX2 entries: its tiles (only they)
 * use vpdpbusd on ymm (function target "avxvnni"); it gives the same bits as
 * the plain one.
 *
 * THE FLOAT ORDER. Every AVX2 kernel of a format computes, for a weight row
 * and an activation column with blocks b = 0 .. nb-1, exactly this (the
 * order of legacy_avx512_matvec.c, so both x86 ISAs give the same bits):
 *
 *   I_b   = the exact int32 dot of block b's integer weights (Q4_0: q - 8,
 *           Q5_0: q - 16, Q4_1 / Q5_1: q, Q8_0: qs, -128 included) and the
 *           activation block's int8 quants (|I_b| < 2^24: the conversion
 *           to float is exact);
 *   s_b   = d_w(b) * d_a(b)                   one float multiply;
 *   j     = b mod 4;
 *   acc_j = fma(float(I_b), s_b, acc_j);
 *   Q4_1 / Q5_1 only, right after:
 *   acc_j = fma(m_w(b), s_a(b), acc_j)        s_a = the Q8_1 block's s;
 *
 * with acc_0..acc_3 starting at +0.0f and blocks visited in increasing
 * order; the result is (acc_0 + acc_2) + (acc_1 + acc_3). The fp16 weight
 * scales are read through legacy_fp16_lut (exact). Integer sums are exact
 * whatever their order, so each kernel forms I_b its own way; the float
 * operations are the same in all of them, which makes the dot, the rows
 * function (so kern_matvec and kern_matvec2) and the GEMM bit-identical for
 * every row and column, at any column count, tiling and thread count (batch
 * invariance). A zero-padded block (in a partial last group of four) has
 * I = 0 and zero scales: it adds fma(0, 0, acc_j), which leaves acc_j as it
 * is (acc_j is never -0: it starts at +0, and an exact zero sum rounds to
 * -0 only when both terms are -0), so the GEMM skips such blocks where the
 * dot and rows kernels compute them.
 *
 * Why this order: one exact int32 per block is what a GEMM with 8 columns
 * per vector produces most cheaply (the k-slices of a block are summed in
 * int16 / int32, then ONE convert, multiply and FMA serve 8 columns x 32
 * products); the alternatives with several float partials per block (the
 * previous order: one per 4-element k-slice and lane, or one per half
 * block) cost the GEMM 2-8 converts and FMAs per block and column octet.
 * The matvec pays for it with one transposing reduction per act group and
 * pair of (row, column) units, which the two-blocks-per-vector decode below
 * more than wins back (measured: matvec faster than with the old order).
 *
 * Matvec kernels (dot and rows):
 *  - Weights are decoded two blocks per vector: lo = [block b's elements
 *    0..15 | block b+1's 0..15], hi = [b's 16..31 | b+1's 16..31] (one
 *    16-byte load plus one insert from memory; nibbles by a 16-bit shift
 *    and masks; the Q5 fifth bits by a byte shuffle of qh). Against them
 *    the act group's lo[2j..2j+1] / hi[2j..2j+1] are plain 32-byte loads
 *    shared by all rows: per block pair two maddubs, one int16 add, one
 *    madd give 8 int32 partials (lane 4L+m: block 2j+L's elements 4m..4m+3
 *    and 16+4m..16+4m+3), the offset formats add the act row's nsum
 *    (shifted by log2 of the offset), which covers exactly those lanes.
 *    Q8_0 moves the weights' signs onto the activations (|w| is maddubs'
 *    unsigned operand) and widens its two halves separately.
 *  - A unit is one (row, column). Units go in pairs (u, v): two rows of
 *    one column (rows function, one column) or two columns of one row;
 *    treduce4 (6 unpacks, 3 adds) turns the pair's four
 *    partial vectors of an act group into I in the lanes [u b0, v b0,
 *    u b2, v b2 | u b1, v b1, u b3, v b3], so ONE convert, multiply and FMA
 *    serve 2 units x 4 blocks, lane i of the accumulator holding acc_j of
 *    the block in that lane. d_a comes from the act's dexp by one blend,
 *    s_a from sexp by one shuffle, d_w and m_w by table broadcasts and
 *    blends. The end: per 128-bit lane (l0 + l2, l1 + l3), then low + high
 *    half: (acc_0 + acc_2) + (acc_1 + acc_3) of u in lane 0, of v in lane 1.
 *    A lone unit takes both slots.
 *  - Rows and columns are unrolled over constant counts, so each unit gets
 *    the operations of a one-row, one-column call.
 *
 * Exactness relies on |a| <= 127 for the activation quants (the act fns
 * clamp to +-127), as maddubs must never saturate. The weight streams of
 * the matvec kernels are prefetched PF_DIST ahead.
 *
 * The act fns quantize a group of four blocks at a time: the four amax by
 * one transposing max reduction, d and 1 / d by one vector division each,
 * d (and Q8_1's s) rounded to fp16 by F16C (the bytes of the scalar act
 * fns; the GEMM's time includes them; measured: docs/PERF.md).
 */
#if defined(__x86_64__)

#include "kernels/x86/legacy_avx2.h"
#include "kernels/x86/rows_entry.h"

/* Partial sums of a decoded block pair against blocks 2j, 2j+1 of the act
 * group g (legacy.h; lo[2j..2j+1] and hi[2j..2j+1] are 32 contiguous bytes
 * each): lane 4L+m = sum over block 2j+L's elements 4m..4m+3 and
 * 16+4m..16+4m+3 of w * a, the offset taken out (nsum lane 4(2j+L)+m is
 * minus the sum of those activations). No int16 saturation: Q4 / Q5 add two
 * maddubs outputs of q <= 31 times |a| <= 127 (4 * 31 * 127 < 2^15); Q8_0's
 * |w| <= 128 against |a| <= 127 fills one maddubs (2 * 128 * 127 < 2^15),
 * so its two halves are widened separately. */
TERN_INLINE __m256i pair_int(const wpair_t *w, const char *g, int j, int f) {
    const __m256i alo = _mm256_loadu_si256((const __m256i *)(g + LEGACY_OFF_LO + 32 * j));
    const __m256i ahi = _mm256_loadu_si256((const __m256i *)(g + LEGACY_OFF_HI + 32 * j));
    const __m256i ones = _mm256_set1_epi16(1);
    if (f == FMT_Q8_0)
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w->lo, _mm256_sign_epi8(alo, w->slo)), ones),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(w->hi, _mm256_sign_epi8(ahi, w->shi)), ones));
    __m256i p =
        _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w->lo, alo), _mm256_maddubs_epi16(w->hi, ahi)), ones);
    if (f_sh(f))
        p = _mm256_add_epi32(
            p, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(g + LEGACY_OFF_NSUM + 32 * j)), f_sh(f)));
    return p;
}

/* ---- the float order: unit pairs --------------------------------------------
 * A unit is one (row, column); the matvec kernels take units two at a
 * time (u, v) and one act group (blocks 0..3) at a time, in this lane
 * order: [u b0, v b0, u b2, v b2 | u b1, v b1, u b3, v b3]. A lone unit
 * takes both slots (u = v). */

/* Transposing reduction (9 uops): lane i of 128-bit lane L of the result
 * = the sum of the four dwords of lane L of p_i. With (P01u, P01v, P23u,
 * P23v) (Pxy = a unit's pair_int of blocks x, y): the unit-pair order. */
TERN_INLINE __m256i treduce4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i u01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    const __m256i u23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(u01, u23), _mm256_unpackhi_epi64(u01, u23));
}

/* One row's fp16 field at byte off of blocks 0..3 (group at p):
 * [b0, b0, b2, b2 | b1, b1, b3, b3]; blocks past the first nblk read 0. */
TERN_INLINE __m256 wsc_blk(const uint8_t *p, size_t bs, size_t off, int j, int nblk) {
    return j < nblk ? lut_bcast(p + (size_t)j * bs + off) : _mm256_setzero_ps();
}
TERN_INLINE __m256 wsc(const uint8_t *p, size_t bs, size_t off, int nblk) {
    const __m256 s01 = _mm256_blend_ps(wsc_blk(p, bs, off, 0, nblk), wsc_blk(p, bs, off, 1, nblk), 0xF0);
    const __m256 s23 = _mm256_blend_ps(wsc_blk(p, bs, off, 2, nblk), wsc_blk(p, bs, off, 3, nblk), 0xF0);
    return _mm256_blend_ps(s01, s23, 0xCC);
}

/* One column's d and s of the act group g, in the same lanes. */
TERN_INLINE __m256 act_d4(const char *g) {
    return _mm256_blend_ps(_mm256_loadu_ps((const float *)(g + LEGACY_OFF_DEXP)),
                           _mm256_loadu_ps((const float *)(g + LEGACY_OFF_DEXP + 32)), 0xCC);
}
TERN_INLINE __m256 act_s4(const char *g) {
    /* sexp: s_j in lane 4j, zeros elsewhere */
    return _mm256_shuffle_ps(_mm256_loadu_ps((const float *)(g + LEGACY_OFF_NSUM)),
                             _mm256_loadu_ps((const float *)(g + LEGACY_OFF_NSUM + 32)), 0);
}

/* The unit pair's float step: acc = fma(float(I), d_w * d_a, acc), then
 * for the min formats acc = fma(m_w, s_a, acc). */
TERN_INLINE __m256 unit_step(__m256 acc, __m256i i, __m256 dw, __m256 da, __m256 mw, __m256 sa, int f) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw, da), acc);
    if (f_min(f)) acc = _mm256_fmadd_ps(mw, sa, acc);
    return acc;
}

/* Lane 0: u's (acc_0 + acc_2) + (acc_1 + acc_3), lane 1: v's. */
TERN_INLINE __m128 unit_final(__m256 a) {
    __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    hi = _mm_add_ps(hi, _mm_movehl_ps(hi, hi));
    return _mm_add_ps(lo, hi);
}

/* One act group of nr rows x nc columns (wg[r]: row r's group, ag[c]:
 * column c's; the first nblk blocks of the weight groups exist, 4 but in a
 * row's last group). One column: unit pairs are row pairs (r, r+1);
 * several: column pairs (c, c+1) of each row. acc[] in that order. */
TERN_INLINE void tile_grp(const uint8_t *const *wg, int nr, const char *const *ag, int nc, int f, int nblk,
                            __m256 *acc) {
    const size_t bs = f_bsz(f);
    const __m256 z = _mm256_setzero_ps();
    const int n01 = nblk < 2 ? nblk : 2, n23 = nblk > 2 ? nblk - 2 : 0;
    if (nc == 1) {
        const __m256 da = act_d4(ag[0]), sa = f_min(f) ? act_s4(ag[0]) : z;
        _Pragma("GCC unroll 2") for (int r = 0; r < nr; r += 2) {
            const wpair_t u0 = wdec(wg[r], f, n01), u1 = wdec(wg[r] + 2 * bs, f, n23);
            const __m256i pu0 = pair_int(&u0, ag[0], 0, f), pu1 = pair_int(&u1, ag[0], 1, f);
            __m256i i;
            __m256 dw = wsc(wg[r], bs, 0, nblk), mw = f_min(f) ? wsc(wg[r], bs, 2, nblk) : z;
            if (r + 1 < nr) {
                const wpair_t v0 = wdec(wg[r + 1], f, n01), v1 = wdec(wg[r + 1] + 2 * bs, f, n23);
                i = treduce4(pu0, pair_int(&v0, ag[0], 0, f), pu1, pair_int(&v1, ag[0], 1, f));
                dw = _mm256_blend_ps(dw, wsc(wg[r + 1], bs, 0, nblk), 0xAA);
                if (f_min(f)) mw = _mm256_blend_ps(mw, wsc(wg[r + 1], bs, 2, nblk), 0xAA);
            } else {
                i = treduce4(pu0, pu0, pu1, pu1);
            }
            acc[r / 2] = unit_step(acc[r / 2], i, dw, da, mw, sa, f);
        }
        return;
    }
    const int np = (nc + 1) / 2;
    _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {
        const wpair_t w0 = wdec(wg[r], f, n01), w1 = wdec(wg[r] + 2 * bs, f, n23);
        const __m256 dw = wsc(wg[r], bs, 0, nblk), mw = f_min(f) ? wsc(wg[r], bs, 2, nblk) : z;
        _Pragma("GCC unroll 2") for (int c = 0; c < nc; c += 2) {
            const int cv = c + 1 < nc ? c + 1 : c;
            const __m256i i = treduce4(pair_int(&w0, ag[c], 0, f), pair_int(&w0, ag[cv], 0, f),
                                       pair_int(&w1, ag[c], 1, f), pair_int(&w1, ag[cv], 1, f));
            __m256 da = act_d4(ag[c]), sa = f_min(f) ? act_s4(ag[c]) : z;
            if (cv != c) {
                da = _mm256_blend_ps(da, act_d4(ag[cv]), 0xAA);
                if (f_min(f)) sa = _mm256_blend_ps(sa, act_s4(ag[cv]), 0xAA);
            }
            acc[r * np + c / 2] = unit_step(acc[r * np + c / 2], i, dw, da, mw, sa, f);
        }
    }
}

/* nr rows (w[r]) x nc columns: out[r * nc + c]. Groups of four blocks; a
 * partial last group reads as zero-padded (its padded blocks add
 * fma(0, 0, acc): no change, see the header). */
TERN_INLINE void blk_tile(int64_t k, const uint8_t *const *w, const int nr, const char *xa, size_t st, const int nc,
                            float *out, const int f) {
    TERN_CHECK(k % QK == 0);
    TERN_CHECK(legacy_fp16_lut[0x3c00] == 1.0f); /* legacy_lut_init ran */
    const size_t bs = f_bsz(f), gb = LEGACY_GROUP * bs;
    const int64_t nb = k / QK, ng = nb / LEGACY_GROUP;
    const int rem = (int)(nb % LEGACY_GROUP);
    __m256 acc[4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
    const uint8_t *wg[KERN_MAX_ROWS];
    const char *ag[KERN_MAX_COLS];
    for (int64_t gi = 0; gi < ng; gi++) {
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {
            wg[r] = w[r] + (size_t)gi * gb;
            for (size_t o = 0; o < gb; o += 64) prefetch_ahead((const char *)wg[r] + o, 64);
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) ag[c] = xa + (size_t)c * st + (size_t)gi * LEGACY_GROUP_BYTES;
        tile_grp(wg, nr, ag, nc, f, 4, acc);
    }
    if (rem) {
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) wg[r] = w[r] + (size_t)ng * gb;
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) ag[c] = xa + (size_t)c * st + (size_t)ng * LEGACY_GROUP_BYTES;
        tile_grp(wg, nr, ag, nc, f, rem, acc);
    }
    float t[4];
    if (nc == 1) {
        _Pragma("GCC unroll 2") for (int r = 0; r < nr; r += 2) {
            _mm_storeu_ps(t, unit_final(acc[r / 2]));
            out[r] = t[0];
            if (r + 1 < nr) out[r + 1] = t[1];
        }
    } else {
        const int np = (nc + 1) / 2;
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) _Pragma("GCC unroll 2") for (int c = 0; c < nc; c += 2) {
            _mm_storeu_ps(t, unit_final(acc[r * np + c / 2]));
            out[r * nc + c] = t[0];
            if (c + 1 < nc) out[r * nc + c + 1] = t[1];
        }
    }
}

#define BLK_KERNELS(name, F)                                                                                 \
    TERN_INLINE void name##_cols(int64_t k, const void *w, const char *xa, size_t st, int nc, float *out) { \
        const uint8_t *wr[1] = {(const uint8_t *)w};                                                         \
        blk_tile(k, wr, 1, xa, st, nc, out, F);                                                              \
    }                                                                                                        \
    TERN_INLINE void name##_rows(int64_t k, const void *const *w, int nr, const char *xa, size_t st, int nc,  \
                                   float *out) {                                                             \
        blk_tile(k, (const uint8_t *const *)w, nr, xa, st, nc, out, F);                                      \
    }                                                                                                        \
    COLS_ENTRY(dot_##name##_avx2, name##_cols, KERN_MAX_COLS)                                                \
    ROWS_ENTRY(rows_##name##_avx2, name##_rows, dot_##name##_avx2)

BLK_KERNELS(q4_0, FMT_Q4_0)
BLK_KERNELS(q4_1, FMT_Q4_1)
BLK_KERNELS(q5_0, FMT_Q5_0)
BLK_KERNELS(q5_1, FMT_Q5_1)
BLK_KERNELS(q8_0, FMT_Q8_0)

/* ---- activation quantizers ------------------------------------------------ */

/* round_q8(v) of each lane of v = x * id (legacy_ref.c's scalar: roundf,
 * half away from zero, clamped to [-127, 127], NaN -> 0), exactly:
 * trunc(v + copysign(0.49999997f, v)) equals roundf(v) for every float (the
 * largest float below one half never carries a fraction below one half up
 * to the next integer, and an exact half lands on it; legacy_avx512_matvec.c's
 * round_q8x16, checked over all 2^32 patterns). The empty asm keeps the
 * product a rounded float: GCC (-ffp-contract=fast) could otherwise fuse
 * the multiply into the add. */
TERN_INLINE __m256i round_q8x8(__m256 x, __m256 id) {
    __m256 v = _mm256_mul_ps(x, id);
    __asm__("" : "+x"(v));
    const __m256 half = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(0x1.fffffep-2f));
    __m256 r = _mm256_round_ps(_mm256_add_ps(v, half), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    r = _mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r);
}

/* One group of the act layout (legacy.h) from the n (1..4) blocks at x,
 * the bytes legacy_act_pack_group writes for the blocks quant_quantize_row
 * makes: d = amax / 127 (NaNs skipped: max_ps returns its second operand,
 * NaN-free, when either is NaN), q = round_q8(x * (1 / d)) (0 for d = 0), d
 * rounded to fp16 by vcvtps2ph (round to nearest even, as f32_to_fp16,
 * NaN and infinity included) and read back exactly; Q8_1's s =
 * fp16((float)sum(q) * d) with the float d; nsum from the quants; the
 * missing blocks zero. The four blocks' scales are computed together (one
 * division for d, one for 1 / d). Every field is written once, by vector
 * stores into the row (a group built on the stack and copied out stalled
 * on store forwarding). */
TERN_INLINE void act_group(const float *x, int n, char *g, bool q81) {
    const __m256 sign = _mm256_set1_ps(-0.0f), z = _mm256_setzero_ps();
    __m256 m[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        m[j] = z;
        if (j < n)
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) m[j] =
                _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 32 * j + 8 * v)), m[j]);
    }
    /* amax of block j in lane j (NaN-free from here on: max is exact in any
     * order) */
    const __m256 m01 = _mm256_max_ps(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));
    const __m256 m23 = _mm256_max_ps(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));
    const __m256 m4 = _mm256_max_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(m01), _mm256_castps_pd(m23))),
                                    _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(m01), _mm256_castps_pd(m23))));
    const __m128 amax = _mm_max_ps(_mm256_castps256_ps128(m4), _mm256_extractf128_ps(m4, 1));
    const __m128 d = _mm_div_ps(amax, _mm_set1_ps(127.0f));
    const __m128 id = _mm_and_ps(_mm_div_ps(_mm_set1_ps(1.0f), d), _mm_cmp_ps(d, _mm_setzero_ps(), _CMP_NEQ_UQ));
    const __m256 dh = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT)));
    _mm256_storeu_ps((float *)(g + LEGACY_OFF_DEXP), _mm256_permutevar8x32_ps(dh, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)));
    _mm256_storeu_ps((float *)(g + LEGACY_OFF_DEXP + 32),
                     _mm256_permutevar8x32_ps(dh, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)));
    __m128i part[4];
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        __m128i lo = _mm_setzero_si128(), hi = lo;
        part[j] = lo;
        if (j < n) {
            const __m256 idj = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(id), _mm256_set1_epi32(j));
            __m256i q[4];
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) q[v] = round_q8x8(_mm256_loadu_ps(x + 32 * j + 8 * v), idj);
            /* packs work per 128-bit lane: fix the dword order afterwards */
            const __m256i qs = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            lo = _mm256_castsi256_si128(qs);
            hi = _mm256_extracti128_si256(qs, 1);
            /* lane m: the sum of quants 4m..4m+3 and 16+4m..16+4m+3 */
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qs), _mm256_set1_epi16(1));
            part[j] = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        }
        _mm_storeu_si128((__m128i *)(g + LEGACY_OFF_LO + 16 * j), lo);
        _mm_storeu_si128((__m128i *)(g + LEGACY_OFF_HI + 16 * j), hi);
        if (!q81) _mm_storeu_si128((__m128i *)(g + LEGACY_OFF_NSUM + 16 * j), _mm_sub_epi32(_mm_setzero_si128(), part[j]));
    }
    if (q81) {
        /* sum(q) of block j in lane j; s_j in lane 4j of sexp, zeros elsewhere */
        const __m128i sum = _mm_hadd_epi32(_mm_hadd_epi32(part[0], part[1]), _mm_hadd_epi32(part[2], part[3]));
        const __m128 sv = _mm_cvtph_ps(_mm_cvtps_ph(_mm_mul_ps(_mm_cvtepi32_ps(sum), d), _MM_FROUND_TO_NEAREST_INT));
        const __m256 s8 = _mm256_castps128_ps256(sv);
        const __m256 keep = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, 0, 0, -1, 0, 0, 0));
        _mm256_storeu_ps((float *)(g + LEGACY_OFF_NSUM),
                         _mm256_and_ps(_mm256_permutevar8x32_ps(s8, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)), keep));
        _mm256_storeu_ps((float *)(g + LEGACY_OFF_NSUM + 32),
                         _mm256_and_ps(_mm256_permutevar8x32_ps(s8, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)), keep));
    }
}

TERN_INLINE void act_row(const float *x, void *xa, int64_t k, bool q81) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK;
    char *out = xa;
    for (int64_t i = 0; i + LEGACY_GROUP <= nb; i += LEGACY_GROUP, out += LEGACY_GROUP_BYTES)
        act_group(x + i * QK, LEGACY_GROUP, out, q81);
    const int rem = (int)(nb % LEGACY_GROUP);
    if (rem) act_group(x + (nb - rem) * QK, rem, out, q81);
}

static void act_q8_0_avx2(const float *x, void *xa, int64_t k) {
    act_row(x, xa, k, false);
}

static void act_q8_1_avx2(const float *x, void *xa, int64_t k) {
    act_row(x, xa, k, true);
}

void legacy_register_blocks_avx2(kern_table_t t, const kern_options_t *o) {
    /* The AVX-VNNI GEMMs compute exactly what the plain ones do (exact
     * integer block sums, the same float steps), so the choice changes
     * speed, not results. */
    const bool vnni = o->avxvnni;
    t[TYPE_Q4_0][ISA_AVX2] = (kern_ops_t){dot_q4_0_avx2, act_q8_0_avx2, rows_q4_0_avx2, (vnni ? legacy_avx2_gemm_vnni : legacy_avx2_gemm)[FMT_Q4_0]};
    t[TYPE_Q4_1][ISA_AVX2] = (kern_ops_t){dot_q4_1_avx2, act_q8_1_avx2, rows_q4_1_avx2, (vnni ? legacy_avx2_gemm_vnni : legacy_avx2_gemm)[FMT_Q4_1]};
    t[TYPE_Q5_0][ISA_AVX2] = (kern_ops_t){dot_q5_0_avx2, act_q8_0_avx2, rows_q5_0_avx2, (vnni ? legacy_avx2_gemm_vnni : legacy_avx2_gemm)[FMT_Q5_0]};
    t[TYPE_Q5_1][ISA_AVX2] = (kern_ops_t){dot_q5_1_avx2, act_q8_1_avx2, rows_q5_1_avx2, (vnni ? legacy_avx2_gemm_vnni : legacy_avx2_gemm)[FMT_Q5_1]};
    t[TYPE_Q8_0][ISA_AVX2] = (kern_ops_t){dot_q8_0_avx2, act_q8_0_avx2, rows_q8_0_avx2, (vnni ? legacy_avx2_gemm_vnni : legacy_avx2_gemm)[FMT_Q8_0]};
}

#endif /* __x86_64__ */
