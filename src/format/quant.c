/* quant.c - format traits, fp16 conversion, and the per-family dispatch of
 * quantize / dequantize. The formats themselves live in quant_legacy.c
 * (F32/F16/BF16 and the 32-blocks) and quant_k.c (the K super-blocks). */
#include "format/quant.h"

#include <math.h>
#include <strings.h>

static const quant_traits_t g_traits[TYPE_COUNT] = {
    [TYPE_F32] = {"f32", 1, 4, true, TYPE_F32},
    [TYPE_F16] = {"f16", 1, 2, true, TYPE_F32},
    [TYPE_BF16] = {"bf16", 1, 2, true, TYPE_F32},
    [TYPE_Q4_0] = {"q4_0", QK, sizeof(block_q4_0), true, TYPE_Q8_0},
    [TYPE_Q4_1] = {"q4_1", QK, sizeof(block_q4_1), true, TYPE_Q8_1},
    [TYPE_Q5_0] = {"q5_0", QK, sizeof(block_q5_0), true, TYPE_Q8_0},
    [TYPE_Q5_1] = {"q5_1", QK, sizeof(block_q5_1), true, TYPE_Q8_1},
    [TYPE_Q8_0] = {"q8_0", QK, sizeof(block_q8_0), true, TYPE_Q8_0},
    [TYPE_Q8_1] = {"q8_1", QK, sizeof(block_q8_1), false, TYPE_Q8_1},
    [TYPE_Q4_K] = {"q4_k", QK_K, sizeof(block_q4_K), true, TYPE_Q8_K},
    [TYPE_Q5_K] = {"q5_k", QK_K, sizeof(block_q5_K), true, TYPE_Q8_K},
    [TYPE_Q6_K] = {"q6_k", QK_K, sizeof(block_q6_K), true, TYPE_Q8_K},
    [TYPE_Q8_K] = {"q8_k", QK_K, sizeof(block_q8_K), false, TYPE_Q8_K},
};

const quant_traits_t *quant_traits(int type) {
    if (type < 0 || type >= TYPE_COUNT || !g_traits[type].name) return NULL;
    return &g_traits[type];
}

const char *quant_name(int type) {
    const quant_traits_t *t = quant_traits(type);
    return t ? t->name : "?";
}

int quant_from_name(const char *name) {
    for (int i = 0; i < TYPE_COUNT; i++)
        if (g_traits[i].name && strcasecmp(g_traits[i].name, name) == 0) return i;
    return -1;
}

size_t quant_row_size(int type, int64_t n) {
    const quant_traits_t *t = quant_traits(type);
    if (!t || n < 0 || n % t->blck) return 0;
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)(n / t->blck), (uint64_t)t->size, &bytes)) return 0;
    if (bytes > SIZE_MAX) return 0;
    return (size_t)bytes;
}

static bool is_k(int type) {
    return type == TYPE_Q4_K || type == TYPE_Q5_K || type == TYPE_Q6_K || type == TYPE_Q8_K;
}

int quant_quantize_row(int type, const float *x, void *y, int64_t n) {
    const quant_traits_t *t = quant_traits(type);
    if (!t || n < 0 || n % t->blck) return -1;
    return is_k(type) ? quant_k_quantize_row(type, x, y, n) : quant_legacy_quantize_row(type, x, y, n);
}

int quant_dequantize_row(int type, const void *x, float *y, int64_t n) {
    const quant_traits_t *t = quant_traits(type);
    if (!t || n < 0 || n % t->blck) return -1;
    return is_k(type) ? quant_k_dequantize_row(type, x, y, n) : quant_legacy_dequantize_row(type, x, y, n);
}

/* IEEE binary16 <-> binary32, exact, by bit manipulation. */
float fp16_to_f32(fp16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalize */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

fp16_t f32_to_fp16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t absu = u & 0x7fffffff;
    if (absu > 0x7f800000) return (fp16_t)(sign | 0x7e00 | ((absu >> 13) & 0x3ff)); /* NaN */
    if (absu >= 0x477ff000) return (fp16_t)(sign | 0x7c00); /* overflow to inf (after rounding) */
    if (absu < 0x38800000) { /* subnormal or zero in half */
        if (absu < 0x33000000) return (fp16_t)sign; /* rounds to 0 */
        uint32_t e = absu >> 23;
        uint32_t m = (absu & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) - ... */
        /* value = m * 2^(e-150); half subnormal unit = 2^-24 -> q = m >> (126 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (fp16_t)(sign | q);
    }
    uint32_t r = absu + 0xfff + ((absu >> 13) & 1) - (112u << 23);
    return (fp16_t)(sign | (r >> 13));
}
