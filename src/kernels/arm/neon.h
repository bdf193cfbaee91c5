/*
 * neon.h - private to the aarch64 NEON kernels (legacy_neon.c: F32, F16,
 * BF16 and the 32-element block formats; kquant_neon.c: Q4_K, Q5_K, Q6_K):
 * their register functions, called by dispatch.c, and the small helpers
 * both files share.
 *
 * Integer dot products come in two builds of the same kernel source:
 *   - "sdot": the ARMv8.2 dot-product instruction (SDOT, vdotq_s32), for
 *     CPUs that report it (kern_options_t.dotprod, from cpu_features()'s
 *     Linux hwcaps).
 *     Only the functions that use it are compiled for armv8.2-a+dotprod
 *     (NEON_SDOT_FN), so the rest of the binary still runs on any armv8-a.
 *   - "plain": baseline NEON (widening multiplies and pairwise adds), for
 *     the CPUs without it.
 * Both give the same int32 lanes (see neon_dot16 / neon_dot32), so the two
 * builds of a kernel return the same bits. A kernel body is an always-inline
 * function with a constant `sd` argument saying which one to use; each
 * instantiation is compiled with the matching target.
 */
#ifndef TERN_KERNELS_NEON_H
#define TERN_KERNELS_NEON_H

#include "kernels/inline.h"
#include "kernels/kernels.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>

/* Fill t[type][ISA_NEON] for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
 * (legacy_neon.c) and for Q4_K, Q5_K, Q6_K (kquant_neon.c). They reuse the
 * scalar entries' activation functions, so they must run after
 * kern_register_float / kern_register_legacy / kern_register_kquant filled
 * the scalar column. They pick the SDOT or the plain build by o->dotprod
 * (set only where the CPU has it); like the x86 register functions they do
 * not decide whether NEON may run at all (dispatch.c does). No rows
 * functions: the matvec calls the dot row by row. */
void legacy_register_neon(kern_table_t t, const kern_options_t *o);
void kquant_register_neon(kern_table_t t, const kern_options_t *o);

/* GCC 12's arm_neon.h declares vdotq_s32 for armv8.2-a+dotprod, so a
 * function that inlines it needs at least that target. Every CPU with the
 * dot-product extension implements armv8.2-a. */
#define NEON_SDOT_FN __attribute__((target("arch=armv8.2-a+dotprod")))

/* An fp16 value at any address (block scales sit at 2-byte offsets): FCVT
 * is part of base armv8-a and exact for every binary16 value. */
TERN_INLINE float neon_fp16_load(const void *p) {
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
}

TERN_INLINE float neon_f32_load(const void *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* Four floats at any address (byte load: activation rows of the block
 * formats may start at odd 2-byte offsets). */
TERN_INLINE float32x4_t neon_f32x4_load(const void *p) {
    return vreinterpretq_f32_u8(vld1q_u8((const uint8_t *)p));
}

/* ---- int8 dot products -------------------------------------------------- */

/* Lane m of the result is the sum of the products of bytes 4m..4m+3 of w
 * and a: what one SDOT computes. The plain version forms the 16 int16
 * products (exact: |w*a| <= 128*128), adds neighbours to int32, then adds
 * neighbouring pairs again, which groups the bytes exactly as SDOT does. */
TERN_INLINE int32x4_t neon_dot16_plain(int8x16_t w, int8x16_t a) {
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));  /* bytes 0..7 in pairs */
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, a));                     /* bytes 8..15 in pairs */
    return vpaddq_s32(lo, hi);
}

/* Two 16-byte pairs into one vector: lane m = the sum over bytes 4m..4m+3
 * of w0*a0 and of w1*a1 (a 32-element sub-block in one vector). */
TERN_INLINE int32x4_t neon_dot32_plain(int8x16_t w0, int8x16_t a0, int8x16_t w1, int8x16_t a1) {
    int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(a0)));
    lo = vpadalq_s16(lo, vmull_s8(vget_low_s8(w1), vget_low_s8(a1)));
    int32x4_t hi = vpaddlq_s16(vmull_high_s8(w0, a0));
    hi = vpadalq_s16(hi, vmull_high_s8(w1, a1));
    return vpaddq_s32(lo, hi);
}

/* The SDOT versions. Not always_inline: the plain kernels mention them in a
 * branch their constant `sd` removes, and an always_inline function of
 * another target could not even be considered there. The SDOT kernels
 * share their target, so the compiler inlines them (checked in the
 * disassembly: no calls in the kernels). */
NEON_SDOT_FN static inline int32x4_t neon_dot16_sdot(int8x16_t w, int8x16_t a) {
    return vdotq_s32(vdupq_n_s32(0), w, a);
}
NEON_SDOT_FN static inline int32x4_t neon_dot32_sdot(int8x16_t w0, int8x16_t a0, int8x16_t w1, int8x16_t a1) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, a0), w1, a1);
}

TERN_INLINE int32x4_t neon_dot16(bool sd, int8x16_t w, int8x16_t a) {
    return sd ? neon_dot16_sdot(w, a) : neon_dot16_plain(w, a);
}
TERN_INLINE int32x4_t neon_dot32(bool sd, int8x16_t w0, int8x16_t a0, int8x16_t w1, int8x16_t a1) {
    return sd ? neon_dot32_sdot(w0, a0, w1, a1) : neon_dot32_plain(w0, a0, w1, a1);
}

/* Horizontal sums of four int32x4 vectors: lane i = the sum of v[i]'s
 * lanes (exact, integers). */
TERN_INLINE int32x4_t neon_hsum4_s32(int32x4_t v0, int32x4_t v1, int32x4_t v2, int32x4_t v3) {
    return vpaddq_s32(vpaddq_s32(v0, v1), vpaddq_s32(v2, v3));
}

/* ---- instantiation ---------------------------------------------------------- */

/* A kernel body `body(k, w, xa, stride, out, ncols, ...)` computes ncols (a
 * constant 1..KERN_MAX_COLS) columns of a row of k elements; NEON_DOT_FN
 * defines the kern_dot_fn `name` that serves any number of columns in
 * groups of KERN_MAX_COLS with the constant-width instantiations of body
 * (the trailing arguments, constants too, pass through: the `sd` choice, a
 * format). attr: the function's target (empty, or NEON_SDOT_FN). */
#define NEON_DOT_FN(name, attr, body, ...)                                                          \
    attr static void name(int64_t k, const void *w, const void *xa, size_t st, int ncols, float *out) { \
        for (int c0 = 0; c0 < ncols; c0 += KERN_MAX_COLS) {                                         \
            const char *x = (const char *)xa + (size_t)c0 * st;                                     \
            switch (ncols - c0) {                                                                   \
            case 1: body(k, w, x, st, out + c0, 1, __VA_ARGS__); break;                             \
            case 2: body(k, w, x, st, out + c0, 2, __VA_ARGS__); break;                             \
            case 3: body(k, w, x, st, out + c0, 3, __VA_ARGS__); break;                             \
            default: body(k, w, x, st, out + c0, 4, __VA_ARGS__); break;                            \
            }                                                                                       \
        }                                                                                           \
    }

_Static_assert(KERN_MAX_COLS == 4, "NEON_DOT_FN instantiates 1..4 columns");

#endif /* __aarch64__ */

#endif
