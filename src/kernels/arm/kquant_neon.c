/*
 * kquant_neon.c - aarch64 NEON dot products of the K formats (Q4_K, Q5_K,
 * Q6_K weights against Q8_K activations); kquant_ref.c has the scalar
 * oracle and the per-super-block arithmetic these follow.
 *
 * A super-block of 256 weights is decoded once per call into 16 int8
 * vectors of 16 consecutive elements each (vector v = elements 16v..16v+15),
 * the values the scalar code multiplies:
 *   Q4_K: the nibble (0..15). qs byte 32c+l holds element 64c+l in its low
 *         nibble and 64c+32+l in its high nibble, so chunk c's 32 bytes give
 *         vectors 4c, 4c+1 (low nibbles) and 4c+2, 4c+3 (high nibbles).
 *   Q5_K: the same, plus 16 * (bit of qh): qh byte l has element 64c+l's
 *         fifth bit at bit 2c and element 64c+32+l's at bit 2c+1.
 *   Q6_K: the 6-bit value - 32 (-32..31). Per half h (128 elements), ql
 *         bytes 64h+l give the low four bits of elements 128h+l (low nibble)
 *         and 128h+64+l (high nibble), ql bytes 64h+32+l those of 128h+32+l
 *         and 128h+96+l; qh byte 32h+l holds the top two bits of those four
 *         elements at bits 0-1, 2-3, 4-5, 6-7.
 * The scales are widened to int32 vectors (8 sub-block scales and mins of
 * Q4_K / Q5_K from their packed 6-bit form by kquant_scales_k4; the 16
 * signed scales of Q6_K).
 *
 * For every activation column the integer sums are formed exactly:
 * neon_dot32 / neon_dot16 (SDOT, or the plain NEON equivalent) give each
 * sub-block's dot in four int32 lanes, pairwise adds reduce them to one
 * lane per sub-block, and one multiply-add by the scales vectors and a lane
 * sum give sumi; summ (Q4_K / Q5_K) is the dot of the mins with the
 * activations' sub-block sums (pairs of bsums). Then the column's float
 * sum gets, per super-block, exactly the scalar expression:
 *   Q4_K/Q5_K: da * (d * (float)sumi - dmin * (float)summ)
 *   Q6_K:      da * (d * (float)sumi)
 * in the same order, one float per column (unlike the x86 kernels, which
 * keep one per lane). This file is built with -ffp-contract=off, so those
 * are separate multiplies and subtractions; the scalar build may fuse its
 * copy of the expression into FMAs, so the two can differ in the last bits.
 * The activation quantizer is the scalar one.
 *
 * Multi-column calls decode the weights once for all columns; the
 * per-column work is one always-inline function, so each column is
 * bit-identical to a one-column call.
 */
#if defined(__aarch64__)

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "core/common.h"
#include "kernels/kquant.h"
#include "kernels/arm/neon.h"

/* Activation block b of a column (a row of block_q8_K at any 4-byte
 * offset): its bytes. */
TERN_INLINE const uint8_t *act_block(const char *col, int64_t b) {
    return (const uint8_t *)col + (size_t)b * sizeof(block_q8_K);
}

/* ---- Q4_K / Q5_K ----------------------------------------------------------- */

typedef struct {
    int8x16_t q[16];        /* elements 16v..16v+15; sub-block j = q[2j], q[2j+1] */
    int32x4_t sc03, sc47;   /* scales of sub-blocks 0..3, 4..7 */
    int32x4_t m03, m47;     /* mins */
    float d, dmin;
} kq_affine_t;

TERN_INLINE void affine_decode(const uint8_t *b, bool is_q5, kq_affine_t *o) {
    /* d, dmin and the scales sit at the same offsets in both formats. */
    _Static_assert(offsetof(block_q4_K, scales) == offsetof(block_q5_K, scales), "K header");
    uint64_t sc, m;
    kquant_scales_k4(b + offsetof(block_q4_K, scales), &sc, &m);
    const uint16x8_t sc16 = vmovl_u8(vcreate_u8(sc)), m16 = vmovl_u8(vcreate_u8(m)); /* byte j = sub-block j */
    o->sc03 = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(sc16)));
    o->sc47 = vreinterpretq_s32_u32(vmovl_high_u16(sc16));
    o->m03 = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(m16)));
    o->m47 = vreinterpretq_s32_u32(vmovl_high_u16(m16));
    o->d = neon_fp16_load(b + offsetof(block_q4_K, d));
    o->dmin = neon_fp16_load(b + offsetof(block_q4_K, dmin));

    const uint8_t *qs = b + (is_q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs));
    const uint8x16_t lo4 = vdupq_n_u8(15), v16 = vdupq_n_u8(16);
    /* Q5_K: qh bytes 0..15 and 16..31; shifted right by one after each use,
     * so bit 0 is always the next sub-block's fifth bit. */
    uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
    if (is_q5) {
        h0 = vld1q_u8(b + offsetof(block_q5_K, qh));
        h1 = vld1q_u8(b + offsetof(block_q5_K, qh) + 16);
    }
    #pragma GCC unroll 16
    for (int c = 0; c < 4; c++) {
        const uint8x16_t q0 = vld1q_u8(qs + 32 * c), q1 = vld1q_u8(qs + 32 * c + 16);
        uint8x16_t l0 = vandq_u8(q0, lo4), l1 = vandq_u8(q1, lo4); /* sub-block 2c */
        uint8x16_t u0 = vshrq_n_u8(q0, 4), u1 = vshrq_n_u8(q1, 4);  /* sub-block 2c+1 */
        if (is_q5) {
            l0 = vorrq_u8(l0, vandq_u8(vshlq_n_u8(h0, 4), v16)); /* bit 0 -> 16 */
            l1 = vorrq_u8(l1, vandq_u8(vshlq_n_u8(h1, 4), v16));
            h0 = vshrq_n_u8(h0, 1), h1 = vshrq_n_u8(h1, 1);
            u0 = vorrq_u8(u0, vandq_u8(vshlq_n_u8(h0, 4), v16));
            u1 = vorrq_u8(u1, vandq_u8(vshlq_n_u8(h1, 4), v16));
            h0 = vshrq_n_u8(h0, 1), h1 = vshrq_n_u8(h1, 1);
        }
        o->q[4 * c + 0] = vreinterpretq_s8_u8(l0);
        o->q[4 * c + 1] = vreinterpretq_s8_u8(l1);
        o->q[4 * c + 2] = vreinterpretq_s8_u8(u0);
        o->q[4 * c + 3] = vreinterpretq_s8_u8(u1);
    }
}

/* One column's value of a decoded Q4_K / Q5_K super-block against
 * activation block a (block_q8_K bytes). */
TERN_INLINE float affine_col(bool sd, const kq_affine_t *w, const uint8_t *a) {
    const int8_t *qa = (const int8_t *)(a + offsetof(block_q8_K, qs));
    int32x4_t s[8];
    #pragma GCC unroll 16
    for (int j = 0; j < 8; j++)
        s[j] = neon_dot32(sd, w->q[2 * j], vld1q_s8(qa + 32 * j), w->q[2 * j + 1], vld1q_s8(qa + 32 * j + 16));
    /* Lane j of s03 = sub-block j's dot (j < 4); s47 likewise. */
    const int32x4_t s03 = neon_hsum4_s32(s[0], s[1], s[2], s[3]), s47 = neon_hsum4_s32(s[4], s[5], s[6], s[7]);
    const int32_t sumi = vaddvq_s32(vmlaq_s32(vmulq_s32(s03, w->sc03), s47, w->sc47));
    /* Sub-block sums of the activations: bsums in pairs (16 quants each). */
    const uint8_t *bs = a + offsetof(block_q8_K, bsums);
    const int32x4_t b03 = vpaddlq_s16(vreinterpretq_s16_u8(vld1q_u8(bs)));
    const int32x4_t b47 = vpaddlq_s16(vreinterpretq_s16_u8(vld1q_u8(bs + 16)));
    const int32_t summ = vaddvq_s32(vmlaq_s32(vmulq_s32(b03, w->m03), b47, w->m47));
    const float da = neon_f32_load(a + offsetof(block_q8_K, d));
    return da * (w->d * (float)sumi - w->dmin * (float)summ);
}

TERN_INLINE void affine_cols(int64_t k, const void *w, const char *xa, size_t st, float *out, const int nc,
                             const bool sd, const bool is_q5) {
    TERN_CHECK(k % QK_K == 0);
    const int64_t nb = k / QK_K;
    const size_t bsz = is_q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    float acc[KERN_MAX_COLS];
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) acc[c] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        kq_affine_t dec;
        affine_decode((const uint8_t *)w + (size_t)b * bsz, is_q5, &dec);
        #pragma GCC unroll 16
        for (int c = 0; c < nc; c++) acc[c] += affine_col(sd, &dec, act_block(xa + (size_t)c * st, b));
    }
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) out[c] = acc[c];
}

/* ---- Q6_K -------------------------------------------------------------------- */

typedef struct {
    int8x16_t q[16]; /* elements 16v..16v+15 (group v of the 16 scales), -32..31 */
    int32x4_t sc[4]; /* scales of groups 4i..4i+3 */
    float d;
} kq_q6_t;

TERN_INLINE void q6_decode(const uint8_t *b, kq_q6_t *o) {
    const uint8_t *ql = b + offsetof(block_q6_K, ql), *qh = b + offsetof(block_q6_K, qh);
    const uint8x16_t lo4 = vdupq_n_u8(15), top2 = vdupq_n_u8(0x30);
    const int8x16_t v32 = vdupq_n_s8(32);
    #pragma GCC unroll 16
    for (int h = 0; h < 2; h++) {
        uint8x16_t l[4], hb[2];
        #pragma GCC unroll 16
        for (int i = 0; i < 4; i++) l[i] = vld1q_u8(ql + 64 * h + 16 * i);
        #pragma GCC unroll 16
        for (int i = 0; i < 2; i++) hb[i] = vld1q_u8(qh + 32 * h + 16 * i);
        uint8x16_t u[8];
        #pragma GCC unroll 16
        for (int i = 0; i < 2; i++) {
            /* l[i], l[i+2]: ql bytes 64h+16i.. and 64h+32+16i..; hb[i]: qh bytes 32h+16i.. */
            u[i] = vorrq_u8(vandq_u8(l[i], lo4), vandq_u8(vshlq_n_u8(hb[i], 4), top2));         /* +0:  bits 0-1 */
            u[i + 2] = vorrq_u8(vandq_u8(l[i + 2], lo4), vandq_u8(vshlq_n_u8(hb[i], 2), top2)); /* +32: bits 2-3 */
            u[i + 4] = vorrq_u8(vshrq_n_u8(l[i], 4), vandq_u8(hb[i], top2));                   /* +64: bits 4-5 */
            u[i + 6] = vorrq_u8(vshrq_n_u8(l[i + 2], 4), vandq_u8(vshrq_n_u8(hb[i], 2), top2)); /* +96: bits 6-7 */
        }
        #pragma GCC unroll 16
        for (int i = 0; i < 8; i++) o->q[8 * h + i] = vsubq_s8(vreinterpretq_s8_u8(u[i]), v32);
    }
    const int8x16_t sc8 = vld1q_s8((const int8_t *)b + offsetof(block_q6_K, scales));
    const int16x8_t s0 = vmovl_s8(vget_low_s8(sc8)), s1 = vmovl_high_s8(sc8);
    o->sc[0] = vmovl_s16(vget_low_s16(s0));
    o->sc[1] = vmovl_high_s16(s0);
    o->sc[2] = vmovl_s16(vget_low_s16(s1));
    o->sc[3] = vmovl_high_s16(s1);
    o->d = neon_fp16_load(b + offsetof(block_q6_K, d));
}

TERN_INLINE float q6_col(bool sd, const kq_q6_t *w, const uint8_t *a) {
    const int8_t *qa = (const int8_t *)(a + offsetof(block_q8_K, qs));
    int32x4_t s[16];
    #pragma GCC unroll 16
    for (int j = 0; j < 16; j++) s[j] = neon_dot16(sd, w->q[j], vld1q_s8(qa + 16 * j));
    /* t[i] lane j = group 4i+j's dot; times its scale, summed. */
    int32x4_t t = vmulq_s32(neon_hsum4_s32(s[0], s[1], s[2], s[3]), w->sc[0]);
    t = vmlaq_s32(t, neon_hsum4_s32(s[4], s[5], s[6], s[7]), w->sc[1]);
    t = vmlaq_s32(t, neon_hsum4_s32(s[8], s[9], s[10], s[11]), w->sc[2]);
    t = vmlaq_s32(t, neon_hsum4_s32(s[12], s[13], s[14], s[15]), w->sc[3]);
    const int32_t sumi = vaddvq_s32(t);
    const float da = neon_f32_load(a + offsetof(block_q8_K, d));
    return da * (w->d * (float)sumi);
}

TERN_INLINE void q6_cols(int64_t k, const void *w, const char *xa, size_t st, float *out, const int nc,
                         const bool sd) {
    TERN_CHECK(k % QK_K == 0);
    const int64_t nb = k / QK_K;
    float acc[KERN_MAX_COLS];
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) acc[c] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        kq_q6_t dec;
        q6_decode((const uint8_t *)w + (size_t)b * sizeof(block_q6_K), &dec);
        #pragma GCC unroll 16
        for (int c = 0; c < nc; c++) acc[c] += q6_col(sd, &dec, act_block(xa + (size_t)c * st, b));
    }
    #pragma GCC unroll 16
    for (int c = 0; c < nc; c++) out[c] = acc[c];
}

/* ---- instantiation and registration -------------------------------------- */

NEON_DOT_FN(dot_q4_K_sdot, NEON_SDOT_FN, affine_cols, true, false)
NEON_DOT_FN(dot_q4_K_plain, , affine_cols, false, false)
NEON_DOT_FN(dot_q5_K_sdot, NEON_SDOT_FN, affine_cols, true, true)
NEON_DOT_FN(dot_q5_K_plain, , affine_cols, false, true)
NEON_DOT_FN(dot_q6_K_sdot, NEON_SDOT_FN, q6_cols, true)
NEON_DOT_FN(dot_q6_K_plain, , q6_cols, false)

/* dot, and the scalar entry's Q8_K quantizer. */
static void set_entry(kern_table_t t, int type, kern_dot_fn dot) {
    TERN_CHECK(t[type][ISA_SCALAR].act != NULL); /* registered after the scalar column */
    t[type][ISA_NEON] = (kern_ops_t){.dot = dot, .act = t[type][ISA_SCALAR].act};
}

void kquant_register_neon(kern_table_t t, const kern_options_t *o) {
    const bool sd = o->dotprod;
    set_entry(t, TYPE_Q4_K, sd ? dot_q4_K_sdot : dot_q4_K_plain);
    set_entry(t, TYPE_Q5_K, sd ? dot_q5_K_sdot : dot_q5_K_plain);
    set_entry(t, TYPE_Q6_K, sd ? dot_q6_K_sdot : dot_q6_K_plain);
}

#endif /* __aarch64__ */
