/*
 * legacy_ref.c - scalar reference dot products and activation quantizers for
 * the float formats (F32, F16, BF16 against F32 activations) and the
 * 32-element block formats (Q4_0, Q5_0, Q8_0 against Q8_0 activations;
 * Q4_1, Q5_1 against Q8_1), and the two register functions that put them,
 * and the SIMD variants of legacy_avx2_*.c / legacy_avx512_*.c, in the table.
 *
 * These loops are the oracle the SIMD kernels are tested against, and the
 * fallback on CPUs without AVX2, so they favour plainness. The block dots use
 * ggml's per-block arithmetic (quant-layouts.md, "how the offset/min terms
 * enter"): an exact integer sum per block, scaled by d_w * d_a in float, plus
 * m_w * s_a for the formats with a min. The float formats sum each run of 32
 * products in float, then add that partial sum to the row total, which
 * keeps the error of a long row close to that of the SIMD versions.
 *
 * The activation rows of the block formats are laid out for the AVX-512
 * kernels (legacy.h: groups of four blocks, quants split into halves, d and
 * s stored as the floats of their fp16 values); this file owns that layout
 * (legacy_act_pack / unpack / size) and its act fns are the reference for
 * every ISA's bytes. The scalar dots read the same values they read from
 * plain Q8_0 / Q8_1 blocks, so their results are unchanged by the layout.
 *
 * A multi-column call runs the one-column loop once per column, so each
 * column is trivially bit-identical to a one-column call. F16 weights are
 * converted through legacy_fp16_lut (a table of fp16_to_f32, so the same
 * values), which the register functions fill before handing out kernels.
 */
#include <pthread.h>
#include <string.h>

#include "core/common.h"
#include "kernels/kernels.h"
#include "kernels/legacy.h"

/* ---- fp16 table (legacy.h) ---------------------------------------------- */

float legacy_fp16_lut[1 << 16] __attribute__((aligned(64)));
static pthread_once_t g_lut_once = PTHREAD_ONCE_INIT;

static void lut_fill(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) legacy_fp16_lut[h] = fp16_to_f32((fp16_t)h);
}

void legacy_lut_init(void) {
    TERN_CHECK(pthread_once(&g_lut_once, lut_fill) == 0);
}

/* ---- float formats ------------------------------------------------------ */

#define FLOAT_CHUNK 32

static float dot_f32_1(int64_t k, const float *w, const float *x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i += FLOAT_CHUNK) {
        const int64_t n = k - i < FLOAT_CHUNK ? k - i : FLOAT_CHUNK;
        float s = 0.0f;
        for (int64_t j = 0; j < n; j++) s += w[i + j] * x[i + j];
        acc += s;
    }
    return acc;
}

static float dot_f16_1(int64_t k, const fp16_t *w, const float *x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i += FLOAT_CHUNK) {
        const int64_t n = k - i < FLOAT_CHUNK ? k - i : FLOAT_CHUNK;
        float s = 0.0f;
        for (int64_t j = 0; j < n; j++) s += legacy_fp16_lut[w[i + j]] * x[i + j];
        acc += s;
    }
    return acc;
}

static float dot_bf16_1(int64_t k, const uint16_t *w, const float *x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i += FLOAT_CHUNK) {
        const int64_t n = k - i < FLOAT_CHUNK ? k - i : FLOAT_CHUNK;
        float s = 0.0f;
        for (int64_t j = 0; j < n; j++) s += bf16_to_f32(w[i + j]) * x[i + j];
        acc += s;
    }
    return acc;
}

/* Weights and activations of the float formats may sit at any offset a GGUF
 * file allows (2-byte alignment for F16/BF16, 4 for F32); the pointers are
 * only ever dereferenced as their own element type. */
static void dot_f32_ref(int64_t k, const void *w, const void *xa, size_t st, int nc, float *out) {
    for (int c = 0; c < nc; c++) out[c] = dot_f32_1(k, w, (const float *)((const char *)xa + (size_t)c * st));
}
static void dot_f16_ref(int64_t k, const void *w, const void *xa, size_t st, int nc, float *out) {
    for (int c = 0; c < nc; c++) out[c] = dot_f16_1(k, w, (const float *)((const char *)xa + (size_t)c * st));
}
static void dot_bf16_ref(int64_t k, const void *w, const void *xa, size_t st, int nc, float *out) {
    for (int c = 0; c < nc; c++) out[c] = dot_bf16_1(k, w, (const float *)((const char *)xa + (size_t)c * st));
}

/* The float formats' act fn in every ISA: the activations as they are. */
void legacy_act_copy(const float *x, void *xa, int64_t k) {
    memcpy(xa, x, (size_t)k * sizeof(float));
}

/* ---- 32-blocks: activation row layout (legacy.h) ------------------------ */

size_t legacy_act_size(int type, int64_t k) {
    if (type != TYPE_Q4_0 && type != TYPE_Q4_1 && type != TYPE_Q5_0 && type != TYPE_Q5_1 && type != TYPE_Q8_0)
        return 0;
    if (k < 0 || k % QK != 0) return 0;
    const int64_t groups = (k / QK + LEGACY_GROUP - 1) / LEGACY_GROUP;
    if (groups > (int64_t)(SIZE_MAX / LEGACY_GROUP_BYTES)) return 0;
    return (size_t)groups * LEGACY_GROUP_BYTES;
}

void legacy_act_pack_group(int act_type, const void *blocks, int n, void *dst) {
    legacy_act_group gg, *g = &gg; /* built aligned, copied out */
    memset(g, 0, sizeof(*g));
    for (int j = 0; j < n; j++) {
        const int8_t *qs;
        fp16_t d;
        if (act_type == TYPE_Q8_1) {
            const block_q8_1 *b = (const block_q8_1 *)blocks + j;
            qs = b->qs, d = b->d;
            g->u.sexp[4 * j] = fp16_to_f32(b->s);
        } else {
            const block_q8_0 *b = (const block_q8_0 *)blocks + j;
            qs = b->qs, d = b->d;
        }
        memcpy(g->lo[j], qs, 16);
        memcpy(g->hi[j], qs + 16, 16);
        for (int m = 0; m < 4; m++) {
            g->dexp[4 * j + m] = fp16_to_f32(d);
            if (act_type != TYPE_Q8_1) {
                int s = 0;
                for (int t = 0; t < 4; t++) s += qs[4 * m + t] + qs[16 + 4 * m + t];
                g->u.nsum[4 * j + m] = -s;
            }
        }
    }
    memcpy(dst, g, sizeof(*g));
}

void legacy_act_pack(int act_type, const void *blocks, int64_t k, void *xa) {
    const int64_t nb = k / QK;
    const size_t bsz = act_type == TYPE_Q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    char *g = xa;
    for (int64_t i = 0; i < nb; i += LEGACY_GROUP, g += LEGACY_GROUP_BYTES) {
        const int n = nb - i < LEGACY_GROUP ? (int)(nb - i) : LEGACY_GROUP;
        legacy_act_pack_group(act_type, (const char *)blocks + (size_t)i * bsz, n, g);
    }
}

void legacy_act_unpack(int act_type, const void *xa, int64_t k, void *blocks) {
    legacy_act_group grp, *gi = &grp;
    for (int64_t i = 0; i < k / QK; i++) {
        const int j = (int)(i % LEGACY_GROUP);
        if (j == 0) memcpy(gi, (const char *)xa + (size_t)(i / LEGACY_GROUP) * LEGACY_GROUP_BYTES, sizeof(grp));
        int8_t *qs;
        if (act_type == TYPE_Q8_1) {
            block_q8_1 *b = (block_q8_1 *)blocks + i;
            b->d = f32_to_fp16(gi->dexp[4 * j]);
            b->s = f32_to_fp16(gi->u.sexp[4 * j]);
            qs = b->qs;
        } else {
            block_q8_0 *b = (block_q8_0 *)blocks + i;
            b->d = f32_to_fp16(gi->dexp[4 * j]);
            qs = b->qs;
        }
        memcpy(qs, gi->lo[j], 16);
        memcpy(qs + 16, gi->hi[j], 16);
    }
}

/* ---- 32-blocks: dots ------------------------------------------------------ */

static inline uint32_t qh_word(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* Block i of an activation row: quant j (0..31), its d and s. */
typedef struct {
    const int8_t *lo, *hi;
    float d, s;
} act_blk_t;

static inline act_blk_t act_blk(const void *xa, int64_t i) {
    const char *g = (const char *)xa + (size_t)(i / LEGACY_GROUP) * LEGACY_GROUP_BYTES;
    const size_t j = (size_t)(i % LEGACY_GROUP);
    act_blk_t a = {(const int8_t *)(g + LEGACY_OFF_LO + 16 * j), (const int8_t *)(g + LEGACY_OFF_HI + 16 * j), 0, 0};
    memcpy(&a.d, g + LEGACY_OFF_DEXP + 16 * j, sizeof(float));
    memcpy(&a.s, g + LEGACY_OFF_NSUM + 16 * j, sizeof(float)); /* sexp (Q8_1 rows only) */
    return a;
}

static float dot_q4_0_1(int64_t nb, const block_q4_0 *w, const void *xa) {
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const act_blk_t a = act_blk(xa, i);
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            sumi += ((w[i].qs[j] & 15) - 8) * a.lo[j];
            sumi += ((w[i].qs[j] >> 4) - 8) * a.hi[j];
        }
        acc += (float)sumi * (fp16_to_f32(w[i].d) * a.d);
    }
    return acc;
}

static float dot_q4_1_1(int64_t nb, const block_q4_1 *w, const void *xa) {
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const act_blk_t a = act_blk(xa, i);
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            sumi += (w[i].qs[j] & 15) * a.lo[j];
            sumi += (w[i].qs[j] >> 4) * a.hi[j];
        }
        acc += (float)sumi * (fp16_to_f32(w[i].d) * a.d) + fp16_to_f32(w[i].m) * a.s;
    }
    return acc;
}

static float dot_q5_0_1(int64_t nb, const block_q5_0 *w, const void *xa) {
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const act_blk_t a = act_blk(xa, i);
        const uint32_t qh = qh_word(w[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = (w[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int q1 = (w[i].qs[j] >> 4) | (int)((qh >> (j + QK / 2)) & 1) << 4;
            sumi += (q0 - 16) * a.lo[j] + (q1 - 16) * a.hi[j];
        }
        acc += (float)sumi * (fp16_to_f32(w[i].d) * a.d);
    }
    return acc;
}

static float dot_q5_1_1(int64_t nb, const block_q5_1 *w, const void *xa) {
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const act_blk_t a = act_blk(xa, i);
        const uint32_t qh = qh_word(w[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = (w[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            const int q1 = (w[i].qs[j] >> 4) | (int)((qh >> (j + QK / 2)) & 1) << 4;
            sumi += q0 * a.lo[j] + q1 * a.hi[j];
        }
        acc += (float)sumi * (fp16_to_f32(w[i].d) * a.d) + fp16_to_f32(w[i].m) * a.s;
    }
    return acc;
}

static float dot_q8_0_1(int64_t nb, const block_q8_0 *w, const void *xa) {
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const act_blk_t a = act_blk(xa, i);
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) sumi += w[i].qs[j] * a.lo[j] + w[i].qs[j + QK / 2] * a.hi[j];
        acc += (float)sumi * (fp16_to_f32(w[i].d) * a.d);
    }
    return acc;
}

#define BLOCK_DOT_REF(name, wblock)                                                                    \
    static void dot_##name##_ref(int64_t k, const void *w, const void *xa, size_t st, int nc,          \
                                 float *out) {                                                         \
        TERN_CHECK(k % QK == 0);                                                                       \
        for (int c = 0; c < nc; c++)                                                                   \
            out[c] = dot_##name##_1(k / QK, (const wblock *)w, (const char *)xa + (size_t)c * st);     \
    }
BLOCK_DOT_REF(q4_0, block_q4_0)
BLOCK_DOT_REF(q4_1, block_q4_1)
BLOCK_DOT_REF(q5_0, block_q5_0)
BLOCK_DOT_REF(q5_1, block_q5_1)
BLOCK_DOT_REF(q8_0, block_q8_0)

/* The reference quantizer is the scalar act: quant_quantize_row's blocks,
 * packed a group at a time; k is a multiple of QK (the drivers check row
 * shapes before they quantize). */
static void act_ref(int act_type, const float *x, void *xa, int64_t k) {
    TERN_CHECK(k % QK == 0);
    block_q8_1 tmp[LEGACY_GROUP]; /* large enough for either block type */
    char *g = xa;
    for (int64_t i = 0; i < k / QK; i += LEGACY_GROUP, g += LEGACY_GROUP_BYTES) {
        const int n = k / QK - i < LEGACY_GROUP ? (int)(k / QK - i) : LEGACY_GROUP;
        TERN_CHECK(quant_legacy_quantize_row(act_type, x + i * QK, tmp, (int64_t)n * QK) == 0);
        legacy_act_pack_group(act_type, tmp, n, g);
    }
}
static void act_q8_0_ref(const float *x, void *xa, int64_t k) {
    act_ref(TYPE_Q8_0, x, xa, k);
}
static void act_q8_1_ref(const float *x, void *xa, int64_t k) {
    act_ref(TYPE_Q8_1, x, xa, k);
}

/* ---- registration ------------------------------------------------------- */


/* The scalar dots have no rows function: the rows API is about memory
 * parallelism, which the scalar kernels are too slow to need. */
void kern_register_float(kern_table_t t, const kern_options_t *o) {
    legacy_lut_init();
    t[TYPE_F32][ISA_SCALAR] = (kern_ops_t){.dot = dot_f32_ref, .act = legacy_act_copy};
    t[TYPE_F16][ISA_SCALAR] = (kern_ops_t){.dot = dot_f16_ref, .act = legacy_act_copy};
    t[TYPE_BF16][ISA_SCALAR] = (kern_ops_t){.dot = dot_bf16_ref, .act = legacy_act_copy};
#if defined(__x86_64__)
    /* an ISA's file registers only where the CPU has the ISA (kernels.h) */
    if (kern_isa_best() >= ISA_AVX2) legacy_register_float_avx2(t, o);
    if (kern_isa_best() >= ISA_AVX512) legacy_register_float_avx512(t, o);
#else
    (void)o;
#endif
}

void kern_register_legacy(kern_table_t t, const kern_options_t *o) {
    legacy_lut_init();
    t[TYPE_Q4_0][ISA_SCALAR] = (kern_ops_t){.dot = dot_q4_0_ref, .act = act_q8_0_ref};
    t[TYPE_Q4_1][ISA_SCALAR] = (kern_ops_t){.dot = dot_q4_1_ref, .act = act_q8_1_ref};
    t[TYPE_Q5_0][ISA_SCALAR] = (kern_ops_t){.dot = dot_q5_0_ref, .act = act_q8_0_ref};
    t[TYPE_Q5_1][ISA_SCALAR] = (kern_ops_t){.dot = dot_q5_1_ref, .act = act_q8_1_ref};
    t[TYPE_Q8_0][ISA_SCALAR] = (kern_ops_t){.dot = dot_q8_0_ref, .act = act_q8_0_ref};
#if defined(__x86_64__)
    if (kern_isa_best() >= ISA_AVX2) legacy_register_blocks_avx2(t, o);
    if (kern_isa_best() >= ISA_AVX512) legacy_register_blocks_avx512(t, o);
#else
    (void)o;
#endif
}
