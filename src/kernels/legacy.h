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

#include <stddef.h>

#include "kernels/kernels.h"

/* fp16 -> float for every binary16 bit pattern (exact, = fp16_to_f32).
 * The SIMD block kernels read their fp16 scales through it: a table read is
 * a pure load, where a vcvtph2ps of a lone scalar competes for the shuffle
 * port with the rest of the block decode. Filled by legacy_lut_init (once,
 * thread-safe), which both register functions call before they hand out
 * any kernel that reads it. */
extern float legacy_fp16_lut[1 << 16];
void legacy_lut_init(void);

/* The act fn of F32, F16 and BF16 weights in every ISA (a plain copy). */
void legacy_act_copy(const float *x, void *xa, int64_t k);

/* Activation rows of the 32-block formats. The act fns of Q4_0 / Q5_0 /
 * Q8_0 (act type Q8_0) and of Q4_1 / Q5_1 (Q8_1) quantize exactly as
 * quant_quantize_row does, but lay the row out for the AVX-512 kernels,
 * which take four weight blocks per 512-bit vector: the row is cut into
 * groups of LEGACY_GROUP blocks (the last one zero-padded), each group
 * LEGACY_GROUP_BYTES long:
 *   int8  lo[4][16]  block j's quants 0..15   (against the low nibbles)
 *   int8  hi[4][16]  block j's quants 16..31  (against the high nibbles)
 *   Q8_0: int32 nsum[16]  lane 4j+m: -(sum of lo[j][4m..4m+3] and
 *                         hi[j][4m..4m+3]), the offset formats' correction
 *   Q8_1: float sexp[16]  lane 4j: block j's s (the fp16 value), others 0
 *   float dexp[16]   lanes 4j..4j+3: block j's d (the fp16 value)
 * Every ISA's act fn writes these same bytes (the scalar one is the
 * reference), and every ISA's dot reads them; the values are those of the
 * Q8_0 / Q8_1 blocks, so the scalar dots compute what they did on plain
 * blocks. kern_act_size() returns legacy_act_size() for these formats. */
#define LEGACY_GROUP 4
#define LEGACY_GROUP_BYTES 256
typedef struct {
    int8_t lo[LEGACY_GROUP][16];
    int8_t hi[LEGACY_GROUP][16];
    union {
        int32_t nsum[16]; /* act type Q8_0 */
        float sexp[16];   /* act type Q8_1 */
    } u;
    float dexp[16];
} legacy_act_group;
_Static_assert(sizeof(legacy_act_group) == LEGACY_GROUP_BYTES, "act group layout");
/* Act rows need not be aligned (the tests place them at 2-byte offsets), so
 * the kernels address a group's fields by these byte offsets (unaligned
 * loads, memcpy), never through a legacy_act_group pointer into the row. */
enum {
    LEGACY_OFF_LO = offsetof(legacy_act_group, lo),
    LEGACY_OFF_HI = offsetof(legacy_act_group, hi),
    LEGACY_OFF_NSUM = offsetof(legacy_act_group, u),
    LEGACY_OFF_DEXP = offsetof(legacy_act_group, dexp),
};

/* Bytes of the activation row of a 32-block weight type for k elements; 0
 * if type is not one, k is not a multiple of 32, or on overflow. */
size_t legacy_act_size(int type, int64_t k);
/* Plain blocks <-> the row layout. blocks: nb = k / 32 block_q8_0 (act_type
 * TYPE_Q8_0) or block_q8_1 (TYPE_Q8_1). pack writes legacy_act_size bytes
 * (the padding zeroed); unpack is its inverse (tests). */
void legacy_act_pack(int act_type, const void *blocks, int64_t k, void *xa);
void legacy_act_unpack(int act_type, const void *xa, int64_t k, void *blocks);
/* Pack n <= LEGACY_GROUP blocks into one group (the rest zeroed). */
void legacy_act_pack_group(int act_type, const void *blocks, int n, void *g);

/* Several rows in one call (kern_ops_t.rows), for memory-bound matvecs:
 * reading 2..4 far-apart rows block by block in lockstep keeps several
 * prefetch streams in flight per core, where one row at a time leaves
 * bandwidth unused (the K formats' rows functions do the same). Row r's
 * result is bit-identical to the dot's on row r: its accumulators see the
 * same operations in the same order. The SIMD files register each dot with
 * its own rows function; the scalar dots have none. */

#if defined(__x86_64__)
/* Fill t[type][ISA_AVX2] / t[type][ISA_AVX512] for F32, F16, BF16 ... */
void legacy_register_float_avx2(kern_table_t t, const kern_options_t *o);
void legacy_register_float_avx512(kern_table_t t, const kern_options_t *o);
/* ... and for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (o->avxvnni: the AVX2 GEMMs
 * with AVX-VNNI; o->vbmi: the AVX-512 decode with VBMI + GFNI). They do not
 * check the CPU: the table's owner decides which ISA may run, and o holds
 * only sub-features the CPU has. */
void legacy_register_blocks_avx2(kern_table_t t, const kern_options_t *o);
void legacy_register_blocks_avx512(kern_table_t t, const kern_options_t *o);
#endif

#endif
