/*
 * quant.h - the tensor formats tern reads (GGUF/ggml block layouts, bit for
 * bit; see ../shared/reference/quant-layouts.md), their traits, and
 * quantize / dequantize. Knows nothing about threads.
 *
 * Each on-disk block is a struct defined once here with its size checked at
 * compile time. Blocks are packed back to back along a row; fields are
 * little-endian; fp16 is IEEE binary16 stored as uint16.
 */
#ifndef TERN_QUANT_H
#define TERN_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ggml_type ids, as stored in GGUF tensor infos. */
typedef enum {
    TYPE_F32 = 0,
    TYPE_F16 = 1,
    TYPE_Q4_0 = 2,
    TYPE_Q4_1 = 3,
    TYPE_Q5_0 = 6,
    TYPE_Q5_1 = 7,
    TYPE_Q8_0 = 8,
    TYPE_Q8_1 = 9,  /* activations only */
    TYPE_Q4_K = 12,
    TYPE_Q5_K = 13,
    TYPE_Q6_K = 14,
    TYPE_Q8_K = 15, /* activations only */
    TYPE_BF16 = 30,
    TYPE_COUNT = 31
} tern_type_t;

#define QK 32   /* elements per block of the 32-block formats */
#define QK_K 256 /* elements per super-block of the K formats */
#define K_SCALE_SIZE 12

typedef uint16_t fp16_t;

typedef struct { fp16_t d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { fp16_t d; fp16_t m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { fp16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { fp16_t d; fp16_t m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { fp16_t d; int8_t qs[QK]; } block_q8_0;
typedef struct { fp16_t d; fp16_t s; int8_t qs[QK]; } block_q8_1; /* s = d * sum(qs) */
typedef struct {
    fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
typedef struct {
    fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    fp16_t d;
} block_q6_K;
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sum of each group of 16 quants */
} block_q8_K;

_Static_assert(sizeof(block_q4_0) == 18, "q4_0 size");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1 size");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0 size");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1 size");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0 size");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1 size");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K size");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K size");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K size");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K size");

typedef struct {
    const char *name;     /* "q4_0", "f16" ... (lower case, as CLI flags) */
    int blck;             /* elements per block */
    int size;             /* bytes per block */
    bool weight;          /* may appear as a weight tensor type */
    tern_type_t act_type; /* activation format its dot product consumes */
} quant_traits_t;

/* NULL for ids tern does not know. */
const quant_traits_t *quant_traits(int type);
const char *quant_name(int type); /* "?" when unknown */
int quant_from_name(const char *name); /* -1 when unknown; case-insensitive */

/* Bytes of a row of n elements; 0 if the type is unknown or n is not a
 * multiple of the block size (or on overflow). */
size_t quant_row_size(int type, int64_t n);

/* Reference quantizer (float -> type) and dequantizer (type -> float) for one
 * row of n elements (n a multiple of the block size). Also valid for the
 * activation types Q8_0, Q8_1, Q8_K (quantize only for Q8_1/Q8_K).
 * Return 0, or -1 for an unknown type / bad n. */
int quant_quantize_row(int type, const float *x, void *y, int64_t n);
int quant_dequantize_row(int type, const void *x, float *y, int64_t n);

/* Per-family entry points, called by the two functions above. */
int quant_legacy_quantize_row(int type, const float *x, void *y, int64_t n);
int quant_legacy_dequantize_row(int type, const void *x, float *y, int64_t n);
int quant_k_quantize_row(int type, const float *x, void *y, int64_t n);
int quant_k_dequantize_row(int type, const void *x, float *y, int64_t n);

/* fp16 / bf16 conversion, exact IEEE (round to nearest even on the way in). */
float fp16_to_f32(fp16_t h);
fp16_t f32_to_fp16(float f);
static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

#endif
