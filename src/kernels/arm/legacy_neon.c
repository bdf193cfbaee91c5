/*
 * legacy_neon.c - aarch64 NEON dot products for the float formats (F32, F16,
 * BF16 weights against F32 activations) and the 32-element block formats
 * (Q4_0, Q5_0, Q8_0 against Q8_0 activations; Q4_1, Q5_1 against Q8_1).
 * legacy_ref.c has the scalar oracle and the arithmetic these follow.
 *
 * Float formats: four floats per vector, four accumulator vectors per
 * column (16 running sums, one FMA each per step of 16 elements), F16
 * widened with FCVTL (exact), BF16 by a 16-bit left shift (exact). The
 * last k % 16 elements go four at a time into the first accumulator, and a
 * final 1..3 through a zero-padded vector. The accumulators are added in a
 * fixed order at the end.
 *
 * Block formats: block i of the weights is decoded once into two int8
 * vectors, elements 0..15 and 16..31, as the values the scalar dot
 * multiplies (Q4_0: nibble - 8; Q5_0: 5-bit value - 16; Q4_1 / Q5_1: the
 * unsigned value, 0..31, which fits an int8; Q8_0: the bytes). The
 * activation row's group layout (legacy.h) has exactly that split: block j
 * of a group keeps quants 0..15 in lo[j] and 16..31 in hi[j]. So for every
 * column, one neon_dot32 (two SDOTs, or the plain NEON equivalent) gives
 * the block's integer dot as four int32 lanes (exact). They are converted
 * to float and multiplied by d_w * d_a (the group's dexp lanes 4j..4j+3 all
 * hold d_a, so one vector load gives it four times), and added to the
 * column's accumulator with one FMA. Even and odd blocks use two
 * accumulators, so two FMA chains overlap. For Q4_1 / Q5_1 the min term
 * m_w * s_a (s_a: the group's sexp lane 4j) goes to a separate float sum
 * per column. The activation quantizers are the scalar ones (the row
 * layout's bytes are theirs by definition).
 *
 * Multi-column calls decode each weight block once for all columns. The
 * per-column work is written once, in always-inline bodies instantiated for
 * a constant column count, and runs the same operations in the same order
 * whatever the count (the file is built with -ffp-contract=off, so the
 * compiler cannot fuse them differently either): each column is
 * bit-identical to a one-column call.
 */
#if defined(__aarch64__)

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "core/common.h"
#include "kernels/legacy.h"
#include "kernels/arm/neon.h"

/* ---- float formats ----------------------------------------------------------- */

enum { W_F32, W_F16, W_BF16 };

/* Weights i..i+3 of a row of format fmt, as floats. */
TERN_INLINE float32x4_t float_w4(int fmt, const void *w, int64_t i) {
    switch (fmt) {
    case W_F32: return vld1q_f32((const float *)w + i);
    case W_F16: return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)w + i)));
    default: return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)w + i), 16));
    }
}

/* Weight i alone, as a float (the zero-padded tail). */
TERN_INLINE float float_w1(int fmt, const void *w, int64_t i) {
    switch (fmt) {
    case W_F32: return ((const float *)w)[i];
    case W_F16: return neon_fp16_load((const uint16_t *)w + i);
    default: return bf16_to_f32(((const uint16_t *)w)[i]);
    }
}

/* nc columns of a float-format row: out[c] = sum of w[i] * x_c[i]. */
TERN_INLINE void float_cols(int64_t k, const void *w, const char *xa, size_t st, float *out, const int nc,
                            const int fmt) {
    float32x4_t acc[KERN_MAX_COLS][4];
    const float *x[KERN_MAX_COLS];
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) {
        x[c] = (const float *)(xa + (size_t)c * st);
        #pragma GCC unroll 16
        for (int r = 0; r < 4; r++) acc[c][r] = vdupq_n_f32(0.0f);
    }
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        #pragma GCC unroll 16
        for (int r = 0; r < 4; r++) {
            const float32x4_t wv = float_w4(fmt, w, i + 4 * r);
            #pragma GCC unroll 16
            for (int c = 0; c < nc; c++) acc[c][r] = vfmaq_f32(acc[c][r], wv, neon_f32x4_load(x[c] + i + 4 * r));
        }
    }
    for (; i + 4 <= k; i += 4) {
        const float32x4_t wv = float_w4(fmt, w, i);
        #pragma GCC unroll 16
        for (int c = 0; c < nc; c++) acc[c][0] = vfmaq_f32(acc[c][0], wv, neon_f32x4_load(x[c] + i));
    }
    if (i < k) { /* 1..3 left: zero-padded on both sides */
        const int n = (int)(k - i);
        float wt[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j = 0; j < n; j++) wt[j] = float_w1(fmt, w, i + j);
        const float32x4_t wv = vld1q_f32(wt);
        #pragma GCC unroll 16
        for (int c = 0; c < nc; c++) {
            float xt[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int j = 0; j < n; j++) xt[j] = x[c][i + j];
            acc[c][0] = vfmaq_f32(acc[c][0], wv, vld1q_f32(xt));
        }
    }
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++)
        out[c] = vaddvq_f32(vaddq_f32(vaddq_f32(acc[c][0], acc[c][1]), vaddq_f32(acc[c][2], acc[c][3])));
}

NEON_DOT_FN(dot_f32_neon, , float_cols, W_F32)
NEON_DOT_FN(dot_f16_neon, , float_cols, W_F16)
NEON_DOT_FN(dot_bf16_neon, , float_cols, W_BF16)

/* ---- 32-element blocks ----------------------------------------------------- */

enum { B_Q4_0, B_Q4_1, B_Q5_0, B_Q5_1, B_Q8_0 };

TERN_INLINE size_t block_bytes(int fmt) {
    switch (fmt) {
    case B_Q4_0: return sizeof(block_q4_0);
    case B_Q4_1: return sizeof(block_q4_1);
    case B_Q5_0: return sizeof(block_q5_0);
    case B_Q5_1: return sizeof(block_q5_1);
    default: return sizeof(block_q8_0);
    }
}

TERN_INLINE bool block_has_min(int fmt) {
    return fmt == B_Q4_1 || fmt == B_Q5_1;
}

/* The fifth bits of a Q5 block, as 0x10 in the byte of every element whose
 * bit is set: qh is 32 bits, little-endian, bit j for element j. Elements
 * 0..15 take their bits from qh bytes 0 and 1: each byte is repeated eight
 * times ([b0 x8, b1 x8]) and tested against 1, 2, 4, .., 128. */
TERN_INLINE void q5_high_bits(const uint8_t *qh, uint8x16_t *h0, uint8x16_t *h1) {
    static const uint8_t bit_of_lane[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bits = vld1q_u8(bit_of_lane), v16 = vdupq_n_u8(16);
    const uint8x16_t b01 = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
    const uint8x16_t b23 = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
    *h0 = vandq_u8(vtstq_u8(b01, bits), v16);
    *h1 = vandq_u8(vtstq_u8(b23, bits), v16);
}

/* Weights of one block: elements 0..15 in *w0, 16..31 in *w1, as the int8
 * values the scalar dot multiplies; its d and (offset formats) m. */
TERN_INLINE void block_decode(int fmt, const uint8_t *b, int8x16_t *w0, int8x16_t *w1, float *d, float *m) {
    const uint8x16_t lo4 = vdupq_n_u8(15);
    *d = neon_fp16_load(b); /* d leads every block */
    *m = 0.0f;
    if (fmt == B_Q8_0) {
        *w0 = vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs));
        *w1 = vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs) + 16);
        return;
    }
    /* Nibble formats: byte j holds element j (low nibble) and j+16 (high). */
    size_t qs_off;
    switch (fmt) {
    case B_Q4_0: qs_off = offsetof(block_q4_0, qs); break;
    case B_Q4_1: qs_off = offsetof(block_q4_1, qs); break;
    case B_Q5_0: qs_off = offsetof(block_q5_0, qs); break;
    default: qs_off = offsetof(block_q5_1, qs); break;
    }
    const uint8x16_t q = vld1q_u8(b + qs_off);
    uint8x16_t u0 = vandq_u8(q, lo4), u1 = vshrq_n_u8(q, 4);
    if (fmt == B_Q5_0 || fmt == B_Q5_1) {
        uint8x16_t h0, h1;
        q5_high_bits(b + (fmt == B_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh)), &h0, &h1);
        u0 = vorrq_u8(u0, h0);
        u1 = vorrq_u8(u1, h1);
    }
    if (block_has_min(fmt)) *m = neon_fp16_load(b + offsetof(block_q4_1, m)); /* same place in Q5_1 */
    /* The symmetric formats are centred: Q4_0 on 8, Q5_0 on 16. */
    const int8_t zero = fmt == B_Q4_0 ? 8 : fmt == B_Q5_0 ? 16 : 0;
    *w0 = vsubq_s8(vreinterpretq_s8_u8(u0), vdupq_n_s8(zero));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(u1), vdupq_n_s8(zero));
}
_Static_assert(offsetof(block_q4_1, m) == offsetof(block_q5_1, m), "m at the same offset");

/* Block i of the row, against nc columns: acc[c] += (its int32 lanes) *
 * (d_w * d_a); accm[c] += m_w * s_a for the offset formats. xa: column 0's
 * row, st: the column stride. */
TERN_INLINE void block_step(int fmt, bool sd, int nc, const void *w, int64_t i, const char *xa, size_t st,
                            float32x4_t *acc, float *accm) {
    int8x16_t w0, w1;
    float dw, mw;
    block_decode(fmt, (const uint8_t *)w + (size_t)i * block_bytes(fmt), &w0, &w1, &dw, &mw);
    /* The block's slot in its group: lo / hi / dexp / sexp of block j are
     * 16 bytes per block into their arrays. */
    const size_t at = (size_t)(i / LEGACY_GROUP) * LEGACY_GROUP_BYTES + 16 * (size_t)(i % LEGACY_GROUP);
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) {
        const char *g = xa + (size_t)c * st + at;
        const int8x16_t a0 = vld1q_s8((const int8_t *)(g + LEGACY_OFF_LO));
        const int8x16_t a1 = vld1q_s8((const int8_t *)(g + LEGACY_OFF_HI));
        const int32x4_t s = neon_dot32(sd, w0, a0, w1, a1);
        const float32x4_t scale = vmulq_n_f32(neon_f32x4_load(g + LEGACY_OFF_DEXP), dw);
        acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(s), scale);
        if (block_has_min(fmt)) accm[c] += mw * neon_f32_load(g + LEGACY_OFF_NSUM); /* sexp lane 4j */
    }
}

/* nc columns of a block-format row of k elements. */
TERN_INLINE void block_cols(int64_t k, const void *w, const char *xa, size_t st, float *out, const int nc,
                            const bool sd, const int fmt) {
    TERN_CHECK(k % QK == 0);
    const int64_t nb = k / QK;
    float32x4_t even[KERN_MAX_COLS], odd[KERN_MAX_COLS];
    float accm[KERN_MAX_COLS];
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) {
        even[c] = odd[c] = vdupq_n_f32(0.0f);
        accm[c] = 0.0f;
    }
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        block_step(fmt, sd, nc, w, i, xa, st, even, accm);
        block_step(fmt, sd, nc, w, i + 1, xa, st, odd, accm);
    }
    if (i < nb) block_step(fmt, sd, nc, w, i, xa, st, even, accm);
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) {
        const float s = vaddvq_f32(vaddq_f32(even[c], odd[c]));
        out[c] = block_has_min(fmt) ? s + accm[c] : s;
    }
}

/* Each format twice: SDOT and plain NEON. */
#define BLOCK_DOTS(name, FMT)                                                  \
    NEON_DOT_FN(dot_##name##_sdot, NEON_SDOT_FN, block_cols, true, FMT)        \
    NEON_DOT_FN(dot_##name##_plain, , block_cols, false, FMT)
BLOCK_DOTS(q4_0, B_Q4_0)
BLOCK_DOTS(q4_1, B_Q4_1)
BLOCK_DOTS(q5_0, B_Q5_0)
BLOCK_DOTS(q5_1, B_Q5_1)
BLOCK_DOTS(q8_0, B_Q8_0)

/* ---- registration --------------------------------------------------------- */

/* The NEON entry of type: dot, and the scalar entry's act fn (the float
 * formats' plain copy; the block formats' Q8_0 / Q8_1 quantizer, whose bytes
 * define the activation row layout). */
static void set_entry(kern_table_t t, int type, kern_dot_fn dot) {
    TERN_CHECK(t[type][ISA_SCALAR].act != NULL); /* registered after the scalar column */
    t[type][ISA_NEON] = (kern_ops_t){.dot = dot, .act = t[type][ISA_SCALAR].act};
}

void legacy_register_neon(kern_table_t t, const kern_options_t *o) {
    const bool sd = o->dotprod;
    set_entry(t, TYPE_F32, dot_f32_neon);
    set_entry(t, TYPE_F16, dot_f16_neon);
    set_entry(t, TYPE_BF16, dot_bf16_neon);
    set_entry(t, TYPE_Q4_0, sd ? dot_q4_0_sdot : dot_q4_0_plain);
    set_entry(t, TYPE_Q4_1, sd ? dot_q4_1_sdot : dot_q4_1_plain);
    set_entry(t, TYPE_Q5_0, sd ? dot_q5_0_sdot : dot_q5_0_plain);
    set_entry(t, TYPE_Q5_1, sd ? dot_q5_1_sdot : dot_q5_1_plain);
    set_entry(t, TYPE_Q8_0, sd ? dot_q8_0_sdot : dot_q8_0_plain);
}

#endif /* __aarch64__ */
