/*
 * legacy_avx2.c - AVX2 + FMA + F16C dot products and activation quantizers
 * for the 32-element block formats (see legacy_ref.c for the scalar oracle
 * and the arithmetic they follow; the float formats are in float_avx2.c).
 *
 * Block formats: each 32-weight block is decoded once (nibbles by a
 * broadcast load and a per-lane shift), then for every activation column
 * (whose block is read from the group layout of legacy.h: its two 16-byte
 * halves joined by one insert, d and s as floats) the
 * exact int32 block sum is formed with maddubs and madd (see step_signed /
 * step_offset), converted to float and accumulated with one FMA by
 * d_w * d_a; the fp16 scales are read through legacy_fp16_lut (pure loads).
 * Even and odd blocks go to two accumulators so two FMA chains overlap, and
 * the weight stream is prefetched PF_DIST bytes ahead.
 * The *_rows kernels (legacy_rows_avx2) run the same per-row work on 2..4
 * rows in lockstep, for the matvec driver's interleaved streams (legacy.h).
 *
 * Multi-column calls decode the weights once for all columns. The per-column
 * work is written once (always-inline helpers unrolled over a constant column
 * count), so a column's operations and their order do not depend on how many
 * columns share the call: results are bit-identical to one-column calls.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "avx2_util.h"
#include "common.h"
#include "legacy.h"
#include "prefetch.h"
#include "rows_entry.h"

/* ---- 32-blocks ------------------------------------------------------------ */

#define LUT(h) (&legacy_fp16_lut[(h)])

/* 32 nibbles of a 16-byte qs: low nibbles -> bytes 0..15, high -> 16..31. */
ALWAYS_INLINE __m256i nibbles32(const uint8_t *qs) {
    /* A broadcast from memory is a pure load; the upper copy is shifted by 4
     * with a per-lane shift, so no shuffle-port insert is needed. */
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* Byte j = 0xFF when bit j of h is set, else 0. */
ALWAYS_INLINE __m256i bits_to_bytes(const uint8_t qh[4]) {
    uint32_t h;
    memcpy(&h, qh, 4);
    __m256i v = _mm256_set1_epi32((int)h);
    v = _mm256_shuffle_epi8(v, _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    /* Each byte of the OR mask has every bit set but bit (j mod 8). */
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

/* int32 x8 whose total is sum_j u[j] * s[j] (u unsigned, s signed; no int16
 * saturation: |u| <= 128 and |s| <= 127 here). */
ALWAYS_INLINE __m256i dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Block ib of an activation row (layout in legacy.h): its 32 quants in
 * block order (one 128-bit insert from the lo / hi halves), d and s. */
typedef struct {
    const char *g; /* the group's first byte */
    size_t j;
} act_ref_t;
ALWAYS_INLINE act_ref_t act_at(const char *xa, int64_t ib) {
    return (act_ref_t){xa + (size_t)(ib / LEGACY_GROUP) * LEGACY_GROUP_BYTES, (size_t)(ib % LEGACY_GROUP)};
}
ALWAYS_INLINE __m256i act_qs(act_ref_t a) {
    return _mm256_loadu2_m128i((const __m128i *)(a.g + LEGACY_OFF_HI + 16 * a.j),
                               (const __m128i *)(a.g + LEGACY_OFF_LO + 16 * a.j));
}
/* d and s: possibly unaligned floats, read by memcpy (one vbroadcastss /
 * vmovss once compiled). */
ALWAYS_INLINE __m256 act_d(act_ref_t a) {
    float d;
    memcpy(&d, a.g + LEGACY_OFF_DEXP + 16 * a.j, sizeof(d));
    return _mm256_set1_ps(d);
}
ALWAYS_INLINE __m128 act_s(act_ref_t a) {
    float s;
    memcpy(&s, a.g + LEGACY_OFF_NSUM + 16 * a.j, sizeof(s));
    return _mm_set_ss(s);
}

/* Block steps. Every way of forming a column's int32 block sum below is
 * exact (and gives the same value in every int32 lane: the sum over four
 * consecutive bytes), so the float results do not depend on which one runs:
 * the choice is made per column count (a constant after inlining) purely for
 * speed, and one-column and multi-column calls agree bit for bit. After the
 * sum: acc += float(sum) * (d_w * d_a), one FMA per block and column. */

/* Signed weights ws: |w| times a with w's sign moved onto a. */
ALWAYS_INLINE void step_signed(__m256i ws, fp16_t dw, const char *xa, size_t st, int64_t ib, int nc, __m256 *acc) {
    const __m256i aw = _mm256_sign_epi8(ws, ws); /* |w|; -128 reads as unsigned 128 */
    const __m256 dwv = _mm256_broadcast_ss(LUT(dw));
    _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {
        const act_ref_t a = act_at(xa + (size_t)c * st, ib);
        const __m256i as = _mm256_sign_epi8(act_qs(a), ws);
        const __m256 p = _mm256_cvtepi32_ps(dot_us(aw, as));
        acc[c] = _mm256_fmadd_ps(p, _mm256_mul_ps(dwv, act_d(a)), acc[c]);
    }
}

/* Offset weights w = q - off with unsigned quants q (Q4_0: off 8, Q5_0: 16).
 * One column: q is already maddubs' unsigned operand, so the int16 pairs are
 * q*a - off*a (no saturation: q <= 31, off <= 16, |a| <= 127), one op fewer
 * than forming w and moving its sign. Several columns: step_signed, whose
 * per-column cost is lower once w is formed. */
ALWAYS_INLINE void step_offset(__m256i q, int off, fp16_t dw, const char *xa, size_t st, int64_t ib, int nc,
                               __m256 *acc) {
    if (nc == 1) {
        const act_ref_t a = act_at(xa, ib);
        const __m256i av = act_qs(a);
        const __m256i p16 =
            _mm256_sub_epi16(_mm256_maddubs_epi16(q, av), _mm256_maddubs_epi16(_mm256_set1_epi8((char)off), av));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        acc[0] = _mm256_fmadd_ps(p, _mm256_mul_ps(_mm256_broadcast_ss(LUT(dw)), act_d(a)), acc[0]);
        return;
    }
    step_signed(_mm256_sub_epi8(q, _mm256_set1_epi8((char)off)), dw, xa, st, ib, nc, acc);
}

/* Unsigned-weight block step with a min (Q4_1 / Q5_1 against Q8_1). */
ALWAYS_INLINE void step_min(__m256i q, fp16_t dw, fp16_t mw, const char *xa, size_t st, int64_t ib, int nc,
                            __m256 *acc, __m128 *accm) {
    const __m256 dwv = _mm256_broadcast_ss(LUT(dw));
    const __m128 mwv = _mm_load_ss(LUT(mw));
    _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {
        const act_ref_t a = act_at(xa + (size_t)c * st, ib);
        const __m256 p = _mm256_cvtepi32_ps(dot_us(q, act_qs(a)));
        acc[c] = _mm256_fmadd_ps(p, _mm256_mul_ps(dwv, act_d(a)), acc[c]);
        accm[c] = _mm_fmadd_ss(mwv, act_s(a), accm[c]);
    }
}

ALWAYS_INLINE void blk_q4_0(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    (void)accm;
    const block_q4_0 *b = (const block_q4_0 *)w + ib;
    step_offset(nibbles32(b->qs), 8, b->d, xa, st, ib, nc, acc);
}

/* The 32 five-bit quants of a Q5_0 / Q5_1 block, unsigned (0..31). */
ALWAYS_INLINE __m256i quants5(const uint8_t *qs, const uint8_t qh[4]) {
    return _mm256_or_si256(nibbles32(qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(16)));
}

ALWAYS_INLINE void blk_q5_0(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    (void)accm;
    const block_q5_0 *b = (const block_q5_0 *)w + ib;
    step_offset(quants5(b->qs, b->qh), 16, b->d, xa, st, ib, nc, acc);
}

ALWAYS_INLINE void blk_q8_0(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    (void)accm;
    const block_q8_0 *b = (const block_q8_0 *)w + ib;
    step_signed(_mm256_loadu_si256((const __m256i *)b->qs), b->d, xa, st, ib, nc, acc);
}

ALWAYS_INLINE void blk_q4_1(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    const block_q4_1 *b = (const block_q4_1 *)w + ib;
    step_min(nibbles32(b->qs), b->d, b->m, xa, st, ib, nc, acc, accm);
}

ALWAYS_INLINE void blk_q5_1(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    const block_q5_1 *b = (const block_q5_1 *)w + ib;
    step_min(quants5(b->qs, b->qh), b->d, b->m, xa, st, ib, nc, acc, accm);
}

/* Even blocks into acc0 / accm0, odd blocks into acc1 / accm1; result
 * hsum(acc0 + acc1) + (accm0 + accm1) (the min terms are zero for the
 * formats without a min). */
#define BLOCK_DOT(name, blk, bsz)                                                                        \
    ALWAYS_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        TERN_CHECK(k % QK == 0);                                                                         \
        TERN_CHECK(legacy_fp16_lut[0x3c00] == 1.0f); /* legacy_lut_init ran */                          \
        const int64_t nb = k / QK;                                                                       \
        __m256 acc0[KERN_MAX_COLS], acc1[KERN_MAX_COLS];                                                 \
        __m128 accm0[KERN_MAX_COLS], accm1[KERN_MAX_COLS];                                               \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                           \
            acc0[c] = acc1[c] = _mm256_setzero_ps();                                                     \
            accm0[c] = accm1[c] = _mm_setzero_ps();                                                      \
        }                                                                                                \
        int64_t i = 0;                                                                                   \
        for (; i + 2 <= nb; i += 2) {                                                                    \
            prefetch_ahead(w + (size_t)i * (bsz), 2 * (bsz));                                            \
            blk(w, i, xa, st, nc, acc0, accm0);                                                          \
            blk(w, i + 1, xa, st, nc, acc1, accm1);                                                      \
        }                                                                                                \
        if (i < nb) blk(w, i, xa, st, nc, acc0, accm0);                                                  \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) out[c] =                                    \
            hsum8(_mm256_add_ps(acc0[c], acc1[c])) + _mm_cvtss_f32(_mm_add_ss(accm0[c], accm1[c]));       \
    }

BLOCK_DOT(q4_0, blk_q4_0, sizeof(block_q4_0))
BLOCK_DOT(q4_1, blk_q4_1, sizeof(block_q4_1))
BLOCK_DOT(q5_0, blk_q5_0, sizeof(block_q5_0))
BLOCK_DOT(q5_1, blk_q5_1, sizeof(block_q5_1))
BLOCK_DOT(q8_0, blk_q8_0, sizeof(block_q8_0))

COLS_ENTRY(dot_q4_0_avx2, q4_0_cols, KERN_MAX_COLS)
COLS_ENTRY(dot_q4_1_avx2, q4_1_cols, KERN_MAX_COLS)
COLS_ENTRY(dot_q5_0_avx2, q5_0_cols, KERN_MAX_COLS)
COLS_ENTRY(dot_q5_1_avx2, q5_1_cols, KERN_MAX_COLS)
COLS_ENTRY(dot_q8_0_avx2, q8_0_cols, KERN_MAX_COLS)

/* The rows version of BLOCK_DOT: per row the same blocks go into the same
 * accumulators in the same order (see FLOAT_ROWS). */
#define BLOCK_ROWS(name, blk, bsz)                                                                       \
    ALWAYS_INLINE void name##_rows(int64_t k, const void *const *wr, const int nr, const char *xa,       \
                                   size_t st, const int nc, float *out) {                                \
        TERN_CHECK(k % QK == 0);                                                                         \
        TERN_CHECK(legacy_fp16_lut[0x3c00] == 1.0f); /* legacy_lut_init ran */                          \
        const int64_t nb = k / QK;                                                                       \
        __m256 acc0[KERN_MAX_ROWS * 2], acc1[KERN_MAX_ROWS * 2];                                         \
        __m128 accm0[KERN_MAX_ROWS * 2], accm1[KERN_MAX_ROWS * 2];                                       \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) {                                      \
            acc0[j] = acc1[j] = _mm256_setzero_ps();                                                     \
            accm0[j] = accm1[j] = _mm_setzero_ps();                                                      \
        }                                                                                                \
        int64_t i = 0;                                                                                   \
        for (; i + 2 <= nb; i += 2) {                                                                    \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++) {                                       \
                const char *w = wr[r];                                                                   \
                prefetch_ahead(w + (size_t)i * (bsz), 2 * (bsz));                                        \
                blk(w, i, xa, st, nc, acc0 + r * nc, accm0 + r * nc);                                    \
                blk(w, i + 1, xa, st, nc, acc1 + r * nc, accm1 + r * nc);                                \
            }                                                                                            \
        }                                                                                                \
        if (i < nb) {                                                                                    \
            _Pragma("GCC unroll 4") for (int r = 0; r < nr; r++)                                         \
                blk((const char *)wr[r], i, xa, st, nc, acc0 + r * nc, accm0 + r * nc);                  \
        }                                                                                                \
        _Pragma("GCC unroll 8") for (int j = 0; j < nr * nc; j++) out[j] =                               \
            hsum8(_mm256_add_ps(acc0[j], acc1[j])) + _mm_cvtss_f32(_mm_add_ss(accm0[j], accm1[j]));       \
    }

BLOCK_ROWS(q4_0, blk_q4_0, sizeof(block_q4_0))
BLOCK_ROWS(q4_1, blk_q4_1, sizeof(block_q4_1))
BLOCK_ROWS(q5_0, blk_q5_0, sizeof(block_q5_0))
BLOCK_ROWS(q5_1, blk_q5_1, sizeof(block_q5_1))
BLOCK_ROWS(q8_0, blk_q8_0, sizeof(block_q8_0))

ROWS_ENTRY(rows_q4_0_avx2, q4_0_rows, dot_q4_0_avx2)
ROWS_ENTRY(rows_q4_1_avx2, q4_1_rows, dot_q4_1_avx2)
ROWS_ENTRY(rows_q5_0_avx2, q5_0_rows, dot_q5_0_avx2)
ROWS_ENTRY(rows_q5_1_avx2, q5_1_rows, dot_q5_1_avx2)
ROWS_ENTRY(rows_q8_0_avx2, q8_0_rows, dot_q8_0_avx2)

/* ---- activation quantizers ------------------------------------------------ */

/* roundf (half away from zero) of each lane, exactly: truncate, then step
 * away from zero when the dropped fraction is at least one half. NaN -> 0. */
ALWAYS_INLINE __m256 round_away(__m256 p) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
    const __m256 step = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(sign, p));
    const __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
    return _mm256_and_ps(r, _mm256_cmp_ps(p, p, _CMP_ORD_Q));
}

/* One block of 32 floats to 32 int8 quants, as the reference: d = amax/127,
 * q = roundf(x * (1/d)) clamped to +-127. Returns the float d; *sum gets the
 * sum of the quants. */
ALWAYS_INLINE float q8_block(const float *x, int8_t *qs, fp16_t *dout, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        /* max_ps returns its second operand when either is NaN: NaNs are skipped, as in the scalar loop. */
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), amax);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dout = f32_to_fp16(d);
    const __m256 vid = _mm256_set1_ps(id), lim = _mm256_set1_ps(127.0f);
    __m256i q[4];
    for (int j = 0; j < 4; j++) {
        __m256 r = round_away(_mm256_mul_ps(v[j], vid));
        r = _mm256_min_ps(_mm256_max_ps(r, _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim);
        q[j] = _mm256_cvttps_epi32(r);
    }
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *sum = _mm_cvtsi128_si32(s4);
    /* packs work per 128-bit lane: fix the dword order afterwards. */
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, p8);
    return d;
}

/* Blocks as quant_quantize_row makes them, packed a group at a time by the
 * reference's packer, so the bytes match the scalar act fn's. */
static void act_q8_0_avx2(const float *x, void *xa, int64_t k) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK;
    char *g = xa;
    for (int64_t i = 0; i < nb; i += LEGACY_GROUP, g += LEGACY_GROUP_BYTES) {
        const int n = nb - i < LEGACY_GROUP ? (int)(nb - i) : LEGACY_GROUP;
        block_q8_0 y[LEGACY_GROUP];
        for (int j = 0; j < n; j++) {
            int sum;
            q8_block(x + (i + j) * QK, y[j].qs, &y[j].d, &sum);
        }
        legacy_act_pack_group(TYPE_Q8_0, y, n, g);
    }
}

static void act_q8_1_avx2(const float *x, void *xa, int64_t k) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK;
    char *g = xa;
    for (int64_t i = 0; i < nb; i += LEGACY_GROUP, g += LEGACY_GROUP_BYTES) {
        const int n = nb - i < LEGACY_GROUP ? (int)(nb - i) : LEGACY_GROUP;
        block_q8_1 y[LEGACY_GROUP];
        for (int j = 0; j < n; j++) {
            int sum;
            const float d = q8_block(x + (i + j) * QK, y[j].qs, &y[j].d, &sum);
            y[j].s = f32_to_fp16((float)sum * d);
        }
        legacy_act_pack_group(TYPE_Q8_1, y, n, g);
    }
}

void legacy_register_blocks_avx2(kern_table_t t) {
    t[TYPE_Q4_0][ISA_AVX2] = (kern_ops_t){dot_q4_0_avx2, act_q8_0_avx2, NULL};
    t[TYPE_Q4_1][ISA_AVX2] = (kern_ops_t){dot_q4_1_avx2, act_q8_1_avx2, NULL};
    t[TYPE_Q5_0][ISA_AVX2] = (kern_ops_t){dot_q5_0_avx2, act_q8_0_avx2, NULL};
    t[TYPE_Q5_1][ISA_AVX2] = (kern_ops_t){dot_q5_1_avx2, act_q8_1_avx2, NULL};
    t[TYPE_Q8_0][ISA_AVX2] = (kern_ops_t){dot_q8_0_avx2, act_q8_0_avx2, NULL};
}

kern_rows_fn legacy_rows_avx2(kern_dot_fn dot) {
    static const struct {
        kern_dot_fn dot;
        kern_rows_fn rows;
    } pairs[] = {
        {dot_q4_0_avx2, rows_q4_0_avx2}, {dot_q4_1_avx2, rows_q4_1_avx2}, {dot_q5_0_avx2, rows_q5_0_avx2},
        {dot_q5_1_avx2, rows_q5_1_avx2}, {dot_q8_0_avx2, rows_q8_0_avx2},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
        if (pairs[i].dot == dot) return pairs[i].rows;
    return NULL;
}

#endif /* __x86_64__ */
