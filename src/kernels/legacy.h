/*
 * legacy.h - private to the kernels of the float formats (F32, F16, BF16)
 * and the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
 * legacy_ref.c (scalar oracle, kern_register_float / kern_register_legacy)
 * calls these to fill the SIMD columns of the kernel table.
 *
 * Every dot function here follows kern_dot_fn (kernels.h): up to
 * KERN_MAX_COLS activation columns per call (more are served in groups of
 * KERN_MAX_COLS), each column's result bit-identical to a one-column call of
 * the same function. The SIMD activation quantizers write exactly the bytes
 * of the scalar ones (quant_quantize_row to Q8_0 / Q8_1), so only the float
 * summation order differs between ISAs.
 */
#ifndef TERN_KERNELS_LEGACY_H
#define TERN_KERNELS_LEGACY_H

#include "kernels.h"

/* fp16 -> float for every binary16 bit pattern (exact, = fp16_to_f32).
 * The SIMD block kernels read their fp16 scales through it: a table read is
 * a pure load, where a vcvtph2ps of a lone scalar competes for the shuffle
 * port with the rest of the block decode. Filled by legacy_lut_init (once,
 * thread-safe), which both register functions call before they hand out
 * any kernel that reads it. */
extern float legacy_fp16_lut[1 << 16];
void legacy_lut_init(void);

#if defined(__x86_64__)
/* Fill t[type][ISA_AVX2] / t[type][ISA_AVX512] for F32, F16, BF16 ... */
void legacy_register_float_avx2(kern_table_t t);
void legacy_register_float_avx512(kern_table_t t);
/* ... and for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. They do not check the CPU:
 * the table's owner decides which ISA may run. */
void legacy_register_blocks_avx2(kern_table_t t);
void legacy_register_blocks_avx512(kern_table_t t);
#endif

#endif
