/*
 * test_quant_legacy.c - the float formats (F32, F16, BF16) and the 32-element
 * block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the Q8_0 / Q8_1
 * activation blocks): quantize / dequantize and their dot-product kernels.
 *
 * Layout truth comes from ../shared/reference/quant-layouts.md, applied by
 * hand: the fixed blocks below and their expected floats were produced by an
 * independent reading of that document (a few lines of Python, not this
 * code), so a layout mistake cannot cancel itself out between quantize and
 * dequantize. Kernels are checked against a float64 sum over dequantized
 * values, exactly on inputs where every float operation is exact, SIMD
 * against the scalar oracle, and multi-column calls against one-column
 * calls bit for bit on every ISA this CPU runs.
 */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "kernels/kernels.h"
#include "kernels/legacy.h"
#include "kernels/arm/neon.h"
#include "format/quant.h"

static kern_table_t g_tab;

static int setup(void **state) {
    (void)state;
    memset(g_tab, 0, sizeof(g_tab));
    const kern_options_t o = kern_options(); /* the active sub-features */
    kern_register_float(g_tab, &o);
    kern_register_legacy(g_tab, &o);
#if defined(__aarch64__)
    legacy_register_neon(g_tab, &o); /* after the scalar column: it reuses the scalar act fns */
#endif
    return 0;
}

static const int k_weight_types[] = {TYPE_F32, TYPE_F16, TYPE_BF16, TYPE_Q4_0, TYPE_Q4_1,
                                     TYPE_Q5_0, TYPE_Q5_1, TYPE_Q8_0};
#define N_WEIGHT_TYPES ((int)(sizeof(k_weight_types) / sizeof(k_weight_types[0])))

static bool is_float_type(int t) {
    return t == TYPE_F32 || t == TYPE_F16 || t == TYPE_BF16;
}

static const char *const k_isa_names[ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

/* ISAs the CPU runs, as the kernel table's owner decides them. */
static bool isa_ok(kern_isa_t isa) {
    const cpu_features_t *f = cpu_features();
    switch (isa) {
    case ISA_SCALAR: return true;
    case ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case ISA_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni;
    case ISA_NEON: return f->neon;
    default: return false;
    }
}

/* Say, once per ISA, when a kernel cannot be exercised on this CPU. */
static bool isa_usable(kern_isa_t isa) {
    static bool told[ISA_COUNT];
    if (isa_ok(isa)) return true;
    if (!told[isa]) {
        print_message("NOTE: this CPU does not run %s kernels; they are not exercised here\n", k_isa_names[isa]);
        told[isa] = true;
    }
    return false;
}

/* ---- fixed blocks -> fixed floats ---------------------------------------- */

/* Two blocks per format, back to back, with different scales, so the block
 * stride and every field offset matter. */
static const uint8_t k_q4_0_bytes[] = {0x00, 0x38, 0x30, 0xa1, 0x12, 0x83, 0xf4, 0x65, 0xd6, 0x47, 0xb8, 0x29, 0x9a, 0x0b, 0x7c, 0xed, 0x5e, 0xcf, 0x00, 0xc4, 0x1f, 0x6e, 0xbd, 0x0c, 0x5b, 0xaa, 0xf9, 0x48, 0x97, 0xe6, 0x35, 0x84, 0xd3, 0x22, 0x71, 0xc0};
static const float k_q4_0_expect[64] = {
    -4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 3.5f,
    -2.5f, 1.0f, -3.5f, 0.0f, 3.5f, -1.0f, 2.5f, -2.0f,
    1.5f, -3.0f, 0.5f, -4.0f, -0.5f, 3.0f, -1.5f, 2.0f,
    -28.0f, -24.0f, -20.0f, -16.0f, -12.0f, -8.0f, -4.0f, -0.0f,
    4.0f, 8.0f, 12.0f, 16.0f, 20.0f, 24.0f, 28.0f, 32.0f,
    28.0f, 8.0f, -12.0f, 32.0f, 12.0f, -8.0f, -28.0f, 16.0f,
    -4.0f, -24.0f, 20.0f, -0.0f, -20.0f, 24.0f, 4.0f, -16.0f,
};
static const uint8_t k_q4_1_bytes[] = {0x00, 0x34, 0x00, 0xbc, 0x30, 0xa1, 0x12, 0x83, 0xf4, 0x65, 0xd6, 0x47, 0xb8, 0x29, 0x9a, 0x0b, 0x7c, 0xed, 0x5e, 0xcf, 0x00, 0x3c, 0x00, 0x41, 0x1f, 0x6e, 0xbd, 0x0c, 0x5b, 0xaa, 0xf9, 0x48, 0x97, 0xe6, 0x35, 0x84, 0xd3, 0x22, 0x71, 0xc0};
static const float k_q4_1_expect[64] = {
    -1.0f, -0.75f, -0.5f, -0.25f, 0.0f, 0.25f, 0.5f, 0.75f,
    1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.25f, 2.5f, 2.75f,
    -0.25f, 1.5f, -0.75f, 1.0f, 2.75f, 0.5f, 2.25f, 0.0f,
    1.75f, -0.5f, 1.25f, -1.0f, 0.75f, 2.5f, 0.25f, 2.0f,
    17.5f, 16.5f, 15.5f, 14.5f, 13.5f, 12.5f, 11.5f, 10.5f,
    9.5f, 8.5f, 7.5f, 6.5f, 5.5f, 4.5f, 3.5f, 2.5f,
    3.5f, 8.5f, 13.5f, 2.5f, 7.5f, 12.5f, 17.5f, 6.5f,
    11.5f, 16.5f, 5.5f, 10.5f, 15.5f, 4.5f, 9.5f, 14.5f,
};
static const uint8_t k_q5_0_bytes[] = {0x00, 0x3c, 0x01, 0x80, 0x55, 0xf0, 0x30, 0xa1, 0x12, 0x83, 0xf4, 0x65, 0xd6, 0x47, 0xb8, 0x29, 0x9a, 0x0b, 0x7c, 0xed, 0x5e, 0xcf, 0x00, 0xb8, 0xa5, 0x0f, 0x00, 0xc3, 0x1f, 0x6e, 0xbd, 0x0c, 0x5b, 0xaa, 0xf9, 0x48, 0x97, 0xe6, 0x35, 0x84, 0xd3, 0x22, 0x71, 0xc0};
static const float k_q5_0_expect[64] = {
    0.0f, -15.0f, -14.0f, -13.0f, -12.0f, -11.0f, -10.0f, -9.0f,
    -8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, 15.0f,
    3.0f, -6.0f, 1.0f, -8.0f, 15.0f, -10.0f, 13.0f, -12.0f,
    -5.0f, -14.0f, -7.0f, -16.0f, 7.0f, 14.0f, 5.0f, 12.0f,
    -7.5f, 1.0f, -6.5f, 2.0f, 2.5f, -5.0f, 3.5f, -4.0f,
    -3.5f, -3.0f, -2.5f, -2.0f, 6.5f, 7.0f, 7.5f, 8.0f,
    7.5f, 5.0f, 2.5f, 8.0f, 5.5f, 3.0f, 0.5f, 6.0f,
    -4.5f, -7.0f, 6.5f, 4.0f, 1.5f, 7.0f, -3.5f, -6.0f,
};
static const uint8_t k_q5_1_bytes[] = {0x00, 0x38, 0x00, 0x40, 0x01, 0x80, 0x55, 0xf0, 0x30, 0xa1, 0x12, 0x83, 0xf4, 0x65, 0xd6, 0x47, 0xb8, 0x29, 0x9a, 0x0b, 0x7c, 0xed, 0x5e, 0xcf, 0x00, 0x30, 0x00, 0xc2, 0xa5, 0x0f, 0x00, 0xc3, 0x1f, 0x6e, 0xbd, 0x0c, 0x5b, 0xaa, 0xf9, 0x48, 0x97, 0xe6, 0x35, 0x84, 0xd3, 0x22, 0x71, 0xc0};
static const float k_q5_1_expect[64] = {
    10.0f, 2.5f, 3.0f, 3.5f, 4.0f, 4.5f, 5.0f, 5.5f,
    6.0f, 6.5f, 7.0f, 7.5f, 8.0f, 8.5f, 9.0f, 17.5f,
    11.5f, 7.0f, 10.5f, 6.0f, 17.5f, 5.0f, 16.5f, 4.0f,
    7.5f, 3.0f, 6.5f, 2.0f, 13.5f, 17.0f, 12.5f, 16.0f,
    0.875f, -1.25f, 0.625f, -1.5f, -1.625f, 0.25f, -1.875f, 0.0f,
    -0.125f, -0.25f, -0.375f, -0.5f, -2.625f, -2.75f, -2.875f, -3.0f,
    -2.875f, -2.25f, -1.625f, -3.0f, -2.375f, -1.75f, -1.125f, -2.5f,
    0.125f, 0.75f, -2.625f, -2.0f, -1.375f, -2.75f, -0.125f, 0.5f,
};
static const uint8_t k_q8_0_bytes[] = {0x00, 0x30, 0x80, 0x89, 0x92, 0x9b, 0xa4, 0xad, 0xb6, 0xbf, 0xc8, 0xd1, 0xda, 0xe3, 0xec, 0xf5, 0xfe, 0x07, 0x10, 0x19, 0x22, 0x2b, 0x34, 0x3d, 0x46, 0x4f, 0x58, 0x61, 0x6a, 0x73, 0x7c, 0x85, 0x8e, 0x7f, 0x00, 0xb4, 0xc8, 0xbb, 0xae, 0xa1, 0x94, 0x87, 0x7a, 0x6d, 0x60, 0x53, 0x46, 0x39, 0x2c, 0x1f, 0x12, 0x05, 0xf8, 0xeb, 0xde, 0xd1, 0xc4, 0xb7, 0xaa, 0x9d, 0x90, 0x83, 0x76, 0x69, 0x5c, 0x4f, 0x42, 0x35};
static const float k_q8_0_expect[64] = {
    -16.0f, -14.875f, -13.75f, -12.625f, -11.5f, -10.375f, -9.25f, -8.125f,
    -7.0f, -5.875f, -4.75f, -3.625f, -2.5f, -1.375f, -0.25f, 0.875f,
    2.0f, 3.125f, 4.25f, 5.375f, 6.5f, 7.625f, 8.75f, 9.875f,
    11.0f, 12.125f, 13.25f, 14.375f, 15.5f, -15.375f, -14.25f, 15.875f,
    14.0f, 17.25f, 20.5f, 23.75f, 27.0f, 30.25f, -30.5f, -27.25f,
    -24.0f, -20.75f, -17.5f, -14.25f, -11.0f, -7.75f, -4.5f, -1.25f,
    2.0f, 5.25f, 8.5f, 11.75f, 15.0f, 18.25f, 21.5f, 24.75f,
    28.0f, 31.25f, -29.5f, -26.25f, -23.0f, -19.75f, -16.5f, -13.25f,
};

static void check_fixed(int type, const uint8_t *bytes, size_t nbytes, const float *expect) {
    assert_int_equal(nbytes, quant_row_size(type, 64));
    float y[64];
    assert_int_equal(quant_dequantize_row(type, bytes, y, 64), 0);
    for (int i = 0; i < 64; i++) {
        if (y[i] != expect[i]) print_error("%s element %d: got %.9g, expected %.9g\n", quant_name(type), i, y[i], expect[i]);
        assert_true(y[i] == expect[i]);
    }
}

static void test_dequant_fixed_blocks(void **state) {
    (void)state;
    check_fixed(TYPE_Q4_0, k_q4_0_bytes, sizeof(k_q4_0_bytes), k_q4_0_expect);
    check_fixed(TYPE_Q4_1, k_q4_1_bytes, sizeof(k_q4_1_bytes), k_q4_1_expect);
    check_fixed(TYPE_Q5_0, k_q5_0_bytes, sizeof(k_q5_0_bytes), k_q5_0_expect);
    check_fixed(TYPE_Q5_1, k_q5_1_bytes, sizeof(k_q5_1_bytes), k_q5_1_expect);
    check_fixed(TYPE_Q8_0, k_q8_0_bytes, sizeof(k_q8_0_bytes), k_q8_0_expect);
}

static void test_dequant_fixed_floats(void **state) {
    (void)state;
    /* little-endian bytes of each value */
    const uint8_t f32b[] = {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x20, 0xc1, 0x01, 0x00, 0x00, 0x00};
    const float f32e[] = {1.5f, -10.0f, 1.40129846e-45f};
    const uint8_t f16b[] = {0x00, 0x3c, 0x00, 0xc0, 0x55, 0x35, 0x01, 0x00, 0xff, 0x7b, 0x00, 0x80};
    const float f16e[] = {1.0f, -2.0f, 0.333251953125f, 5.9604644775390625e-08f, 65504.0f, -0.0f};
    const uint8_t bf16b[] = {0x80, 0x3f, 0xa0, 0xc0, 0x49, 0x40, 0x80, 0x7f};
    const float bf16e[] = {1.0f, -5.0f, 3.140625f, INFINITY};
    float y[6];
    assert_int_equal(quant_dequantize_row(TYPE_F32, f32b, y, 3), 0);
    for (int i = 0; i < 3; i++) assert_true(y[i] == f32e[i]);
    assert_int_equal(quant_dequantize_row(TYPE_F16, f16b, y, 6), 0);
    for (int i = 0; i < 6; i++) assert_true(y[i] == f16e[i] && signbit(y[i]) == signbit(f16e[i]));
    assert_int_equal(quant_dequantize_row(TYPE_BF16, bf16b, y, 4), 0);
    for (int i = 0; i < 4; i++) assert_true(y[i] == bf16e[i]);
}

/* ---- quantizers on hand-worked inputs ------------------------------------ */

static void test_quantize_fixed(void **state) {
    (void)state;
    float x[32];
    uint8_t buf[32 * 4]; /* room for 32 F32 */

    /* Q4_0: the largest magnitude is x[0] = -4, so d = -4 / -8 = 0.5 and
     * q = trunc(x / 0.5 + 8.5). Low half x[j] = (j - 8) / 2 -> q = j; high
     * half x[16 + j] = (j - 8) / 4 -> q = trunc(j / 2 + 4.5) = (j + 9) / 2. */
    for (int j = 0; j < 16; j++) {
        x[j] = (float)(j - 8) * 0.5f;
        x[16 + j] = (float)(j - 8) * 0.25f;
    }
    assert_int_equal(quant_quantize_row(TYPE_Q4_0, x, buf, 32), 0);
    assert_int_equal(buf[0] | buf[1] << 8, 0x3800); /* fp16 0.5 */
    for (int j = 0; j < 16; j++) assert_int_equal(buf[2 + j], j | ((j + 9) / 2) << 4);

    /* Q4_1: min -4, max 11 -> d = 1, m = -4, q = trunc(x + 4 + 0.5). */
    for (int j = 0; j < 32; j++) x[j] = (float)(j % 16) - 4.0f + (j >= 16 ? 0.49f : 0.0f);
    x[31] = 11.0f;
    assert_int_equal(quant_quantize_row(TYPE_Q4_1, x, buf, 32), 0);
    assert_int_equal(buf[0] | buf[1] << 8, 0x3c00); /* d = 1 */
    assert_int_equal(buf[2] | buf[3] << 8, 0xc400); /* m = -4 */
    for (int j = 0; j < 16; j++) assert_int_equal(buf[4 + j], j | j << 4);

    /* Q5_0: x[j] = j - 16; largest magnitude -16 -> d = 1, q = trunc(x + 16.5)
     * = j: low nibble j & 15 for both halves, fifth bits set for j >= 16. */
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    assert_int_equal(quant_quantize_row(TYPE_Q5_0, x, buf, 32), 0);
    assert_int_equal(buf[0] | buf[1] << 8, 0x3c00);
    const uint8_t qh5[4] = {0x00, 0x00, 0xff, 0xff};
    assert_memory_equal(buf + 2, qh5, 4);
    for (int j = 0; j < 16; j++) assert_int_equal(buf[6 + j], j | j << 4);

    /* Q5_1: x[j] = 31 - j: min 0, max 31 -> d = 1, m = 0, q = 31 - j. */
    for (int j = 0; j < 32; j++) x[j] = (float)(31 - j);
    assert_int_equal(quant_quantize_row(TYPE_Q5_1, x, buf, 32), 0);
    assert_int_equal(buf[0] | buf[1] << 8, 0x3c00);
    assert_int_equal(buf[2] | buf[3] << 8, 0x0000);
    const uint8_t qh51[4] = {0xff, 0xff, 0x00, 0x00}; /* q >= 16 for j <= 15 */
    assert_memory_equal(buf + 4, qh51, 4);
    for (int j = 0; j < 16; j++) assert_int_equal(buf[8 + j], (15 - j) | (15 - j) << 4);

    /* Q8_0 / Q8_1: amax 127 -> d = 1, q = roundf(x): halves round away from
     * zero (2.5 -> 3, -0.5 -> -1, -126.5 -> -127), which ties-to-even would
     * not. Sum of the quants 75 -> s = fp16(75) = 0x54b0. */
    const float xs[7] = {127.0f, 2.5f, -0.5f, 0.5f, -3.5f, 1.4999f, -126.5f};
    const int qs[7] = {127, 3, -1, 1, -4, 1, -127};
    for (int j = 0; j < 32; j++) x[j] = j < 7 ? xs[j] : (float)(j - 16);
    assert_int_equal(quant_quantize_row(TYPE_Q8_0, x, buf, 32), 0);
    assert_int_equal(buf[0] | buf[1] << 8, 0x3c00);
    for (int j = 0; j < 32; j++) assert_int_equal((int8_t)buf[2 + j], j < 7 ? qs[j] : j - 16);
    assert_int_equal(quant_quantize_row(TYPE_Q8_1, x, buf, 32), 0);
    assert_int_equal(buf[0] | buf[1] << 8, 0x3c00);
    assert_int_equal(buf[2] | buf[3] << 8, 0x54b0);
    for (int j = 0; j < 32; j++) assert_int_equal((int8_t)buf[4 + j], j < 7 ? qs[j] : j - 16);

    /* An all-zero block has d = 0 (and m = 0), and dequantizes to zeros.
     * (Q4_0 / Q5_0 store -0: d = max / -8 with max = 0, exactly as ggml.) */
    memset(x, 0, sizeof(x));
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        memset(buf, 0xa5, sizeof(buf));
        assert_int_equal(quant_quantize_row(k_weight_types[t], x, buf, 32), 0);
        if (!is_float_type(k_weight_types[t])) assert_true(fp16_to_f32((fp16_t)(buf[0] | buf[1] << 8)) == 0.0f);
        float y[32];
        assert_int_equal(quant_dequantize_row(k_weight_types[t], buf, y, 32), 0);
        for (int j = 0; j < 32; j++) assert_true(y[j] == 0.0f);
    }
    /* Bad sizes are refused. */
    assert_int_equal(quant_quantize_row(TYPE_Q4_0, x, buf, 31), -1);
    assert_int_equal(quant_dequantize_row(TYPE_Q5_1, buf, x, 33), -1);
}

/* ---- round trip on Gaussian data ----------------------------------------- */

/* |d| and m of block b of a quantized row (0 for the float formats). */
static void block_dm(int type, const uint8_t *row, int64_t b, float *d, float *m) {
    const size_t sz = (size_t)quant_traits(type)->size;
    const uint8_t *p = row + (size_t)b * sz;
    *d = fabsf(fp16_to_f32((fp16_t)(p[0] | p[1] << 8)));
    *m = (type == TYPE_Q4_1 || type == TYPE_Q5_1) ? fp16_to_f32((fp16_t)(p[2] | p[3] << 8)) : 0.0f;
}

static void test_roundtrip_rmse(void **state) {
    (void)state;
    const int64_t n = tu_quick() ? 32 * 512 : 32 * 8192;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    uint8_t *q = malloc((size_t)n * 4);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(q);
    uint64_t seed = 12345;
    for (int64_t i = 0; i < n; i++) x[i] = tu_randn(&seed);
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t];
        assert_int_equal(quant_quantize_row(type, x, q, n), 0);
        assert_int_equal(quant_dequantize_row(type, q, y, n), 0);
        double se = 0, sd2 = 0;
        for (int64_t i = 0; i < n; i++) {
            const double e = (double)y[i] - x[i];
            se += e * e;
            if (type == TYPE_F32) {
                assert_true(e == 0);
            } else if (type == TYPE_F16) { /* round to nearest: half an ulp of 11 bits (2^-25 absolute among subnormals) */
                assert_true(fabs(e) <= fmax(ldexp(fabs(x[i]), -11), ldexp(1.0, -25)));
            } else if (type == TYPE_BF16) { /* 8 bits */
                assert_true(fabs(e) <= ldexp(fabs(x[i]), -8));
            } else {
                /* Uniform quantizer of step |d|: error at most d/2, plus the
                 * fp16 rounding of d (and of m) times the quant (at most 128). The
                 * Q4_0 / Q5_0 grid is asymmetric (-8..7, -16..15 steps): the
                 * element at the other extreme from the one that set d may
                 * be clamped a whole step. */
                float d, m;
                block_dm(type, q, i / QK, &d, &m);
                const double step = (type == TYPE_Q4_0 || type == TYPE_Q5_0) ? 1.0 : 0.5;
                const double bound = step * d + ldexp(128.0 * d + fabs(m), -11) + 1e-7;
                if (fabs(e) > bound)
                    print_error("%s element %lld: |%g - %g| > %g\n", quant_name(type), (long long)i, y[i], x[i], bound);
                assert_true(fabs(e) <= bound);
                if (i % QK == 0) sd2 += (double)d * d;
            }
        }
        const double rmse = sqrt(se / (double)n);
        print_message("round-trip RMSE %-5s on N(0,1): %.6f\n", quant_name(type), rmse);
        if (!is_float_type(type)) {
            /* Rounding to a grid of step d spreads the error uniformly over
             * +-d/2: RMSE d / sqrt(12) = 0.289 d; allow for the clamped
             * extremes of the asymmetric grids. */
            const double drms = sqrt(sd2 / (double)(n / QK));
            assert_true(rmse <= 0.32 * drms);
            assert_true(rmse >= 0.25 * drms); /* it does quantize */
        }
    }
    free(x);
    free(y);
    free(q);
}

/* Non-finite and extreme inputs must not crash (nor trip UBSan), and an
 * all-zero block still gets d = 0. */
static void test_weird_inputs(void **state) {
    (void)state;
    float x[64];
    uint8_t q[64 * 4];
    float y[64];
    const float specials[] = {NAN, INFINITY, -INFINITY, 1e38f, -1e38f, 1e-40f, -0.0f, FLT_MAX, 3e-39f};
    for (int s = 0; s < (int)(sizeof(specials) / sizeof(specials[0])); s++) {
        for (int j = 0; j < 64; j++) x[j] = (j % 5 == 0) ? specials[s] : (float)j * 0.1f;
        for (int t = 0; t < N_WEIGHT_TYPES; t++) {
            assert_int_equal(quant_quantize_row(k_weight_types[t], x, q, 64), 0);
            assert_int_equal(quant_dequantize_row(k_weight_types[t], q, y, 64), 0);
        }
        assert_int_equal(quant_quantize_row(TYPE_Q8_1, x, q, 64), 0);
    }
}

/* ---- helpers for the dot tests ------------------------------------------- */

typedef struct {
    int type, act_type;
    int64_t k;
    size_t wbytes, abytes, ast; /* weight row, activation row, activation stride */
    uint8_t *wmem, *amem;       /* allocations; w and a point 2 (or 4) bytes in */
    uint8_t *w, *a;
} dotcase_t;

/* Weights and activation rows sit at odd multiples of their alignment, as
 * rows in a GGUF file and in a driver's workspace may. */
static void dc_init(dotcase_t *dc, int type, int64_t k, int ncols) {
    dc->type = type;
    dc->act_type = quant_traits(type)->act_type;
    dc->k = k;
    dc->wbytes = quant_row_size(type, k);
    dc->abytes = is_float_type(type) ? quant_row_size(dc->act_type, k) : kern_act_size(type, k);
    assert_true(dc->wbytes > 0 && dc->abytes > 0);
    const size_t al = type == TYPE_F32 || dc->act_type == TYPE_F32 ? 4 : 2;
    dc->ast = dc->abytes + 3 * al;
    dc->wmem = malloc(dc->wbytes + 64);
    dc->amem = malloc(dc->ast * (size_t)ncols + 64);
    assert_non_null(dc->wmem);
    assert_non_null(dc->amem);
    dc->w = dc->wmem + al;
    dc->a = dc->amem + al;
}

static void dc_free(dotcase_t *dc) {
    free(dc->wmem);
    free(dc->amem);
}

static const uint8_t *dc_col(const dotcase_t *dc, int c) {
    return dc->a + (size_t)c * dc->ast;
}

/* float64 value of the dot from dequantized weights and activations, and
 * the sum of the absolute values of its terms (for error bounds). For
 * Q4_1 / Q5_1 the kernel uses the activation block's stored s in place of
 * d_a * sum(q_a) (ggml's arithmetic); that difference is added so only the
 * kernel's float rounding is left. */
static double ref64(const dotcase_t *dc, const uint8_t *a, double *l1) {
    const int64_t k = dc->k;
    float *wf = malloc((size_t)k * sizeof(float)), *af = malloc((size_t)k * sizeof(float));
    assert_non_null(wf);
    assert_non_null(af);
    assert_int_equal(quant_dequantize_row(dc->type, dc->w, wf, k), 0);
    /* The block formats' act rows go back to plain Q8_0 / Q8_1 blocks
     * first (legacy.h's layout); test_act_layout checks that step. */
    void *plain = NULL;
    if (dc->act_type == TYPE_F32) {
        memcpy(af, a, (size_t)k * sizeof(float));
    } else {
        plain = malloc(quant_row_size(dc->act_type, k));
        assert_non_null(plain);
        legacy_act_unpack(dc->act_type, a, k, plain);
        assert_int_equal(quant_dequantize_row(dc->act_type, plain, af, k), 0);
    }
    double s = 0, l = 0;
    for (int64_t i = 0; i < k; i++) {
        s += (double)wf[i] * af[i];
        l += fabs((double)wf[i] * af[i]);
    }
    if (dc->act_type == TYPE_Q8_1) {
        for (int64_t b = 0; b < k / QK; b++) {
            const block_q8_1 *ab = (const block_q8_1 *)plain + b;
            float d, m;
            block_dm(dc->type, dc->w, b, &d, &m);
            double sa = 0;
            for (int j = 0; j < QK; j++) sa += ab->qs[j];
            const double s_exact = (double)fp16_to_f32(ab->d) * sa, s_stored = fp16_to_f32(ab->s);
            s += (double)m * (s_stored - s_exact);
            l += fabs((double)m * s_stored);
        }
    }
    free(wf);
    free(af);
    free(plain);
    *l1 = l;
    return s;
}

/* Worst-case rounding of the kernels' float arithmetic: the longest chain of
 * additions any of them runs (scalar: 32 in a chunk then one per chunk;
 * SIMD: k / lanes per lane, then the lane reduction), each adding at most
 * one unit roundoff of the running magnitude, plus the per-term products. */
static double dot_tol(int64_t k, double l1) {
    return ((double)k / 32.0 + 64.0) * ldexp(l1, -23) + 1e-30;
}

static void fill_gauss(float *x, int64_t n, uint64_t *seed) {
    for (int64_t i = 0; i < n; i++) x[i] = tu_randn(seed);
}

/* Weights: a quantized Gaussian row. */
static void dc_weights_gauss(dotcase_t *dc, uint64_t *seed) {
    float *x = malloc((size_t)dc->k * sizeof(float));
    assert_non_null(x);
    fill_gauss(x, dc->k, seed);
    assert_int_equal(quant_quantize_row(dc->type, x, dc->w, dc->k), 0);
    free(x);
}

/* Activation columns from Gaussian floats through the given ISA's act fn. */
static void dc_acts_gauss(dotcase_t *dc, int ncols, kern_isa_t isa, uint64_t *seed) {
    float *x = malloc((size_t)dc->k * sizeof(float));
    assert_non_null(x);
    for (int c = 0; c < ncols; c++) {
        fill_gauss(x, dc->k, seed);
        g_tab[dc->type][isa].act(x, dc->a + (size_t)c * dc->ast, dc->k);
    }
    free(x);
}

static const int64_t k_block_ks[] = {32, 64, 96, 32 * 129, 4096};
static const int64_t k_float_ks[] = {1, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000, 4099};

/* ---- act functions ------------------------------------------------------- */

static void test_act_matches_reference(void **state) {
    (void)state;
    const int64_t k = 32 * 37;
    float *x = malloc((size_t)k * sizeof(float));
    uint8_t *r = malloc((size_t)k * 4), *s = malloc((size_t)k * 4);
    assert_non_null(x);
    assert_non_null(r);
    assert_non_null(s);
    uint64_t seed = 99;
    for (int round = 0; round < 4; round++) {
        fill_gauss(x, k, &seed);
        if (round == 1) /* exact halves: roundf's ties */
            for (int64_t i = 0; i < k; i++) x[i] = (float)((int)(x[i] * 40.0f)) * 0.5f;
        if (round == 2) /* non-finite, tiny and huge values inside blocks */
            for (int64_t i = 0; i < k; i += 7) x[i] = (float[]){NAN, INFINITY, -INFINITY, 1e-40f, 3e38f, -0.0f}[i % 6];
        if (round == 3) /* whole zero blocks and blocks of tiny values (d underflows) */
            for (int64_t i = 0; i < k; i++) x[i] = (i / QK) % 2 ? 0.0f : x[i] * 1e-41f;
        for (int t = 0; t < N_WEIGHT_TYPES; t++) {
            const int type = k_weight_types[t], at = quant_traits(type)->act_type;
            const size_t n = is_float_type(type) ? quant_row_size(at, k) : kern_act_size(type, k);
            assert_true(n > 0 && n <= (size_t)k * 4);
            if (is_float_type(type)) {
                assert_int_equal(quant_quantize_row(at, x, r, k), 0);
            } else { /* quant_quantize_row's blocks in the kernels' layout */
                assert_int_equal(quant_quantize_row(at, x, s, k), 0);
                legacy_act_pack(at, s, k, r);
            }
            for (int isa = 0; isa < ISA_COUNT; isa++) {
                if (!g_tab[type][isa].act || !isa_usable((kern_isa_t)isa)) continue;
                memset(s, 0x5a, n);
                g_tab[type][isa].act(x, s, k);
                if (memcmp(r, s, n) != 0)
                    print_error("%s act on %s differs from the reference (round %d)\n", quant_name(type), k_isa_names[isa], round);
                assert_memory_equal(r, s, n);
            }
        }
    }
    free(x);
    free(r);
    free(s);
}

/* The act row layout (legacy.h) on a hand-made row: every field where the
 * header says it is, the padding zero, and unpack inverting pack. */
static void test_act_layout(void **state) {
    (void)state;
    const int64_t k = 5 * QK; /* a full group and one block of a second */
    for (int at = TYPE_Q8_0; ; at = TYPE_Q8_1) {
        const int wtype = at == TYPE_Q8_0 ? TYPE_Q4_0 : TYPE_Q4_1;
        const size_t n = kern_act_size(wtype, k);
        assert_int_equal(n, 2 * LEGACY_GROUP_BYTES);
        const size_t bs = (size_t)quant_traits(at)->size;
        uint8_t plain[5 * sizeof(block_q8_1)], back[5 * sizeof(block_q8_1)];
        uint8_t *row = malloc(n);
        assert_non_null(row);
        for (int b = 0; b < 5; b++) {
            uint8_t *p = plain + (size_t)b * bs;
            const fp16_t d = f32_to_fp16(0.5f * (float)(b + 1)), sv = f32_to_fp16(-3.0f * (float)(b + 1));
            memcpy(p, &d, 2);
            if (at == TYPE_Q8_1) memcpy(p + 2, &sv, 2);
            int8_t *qs = (int8_t *)(p + bs - QK);
            for (int j = 0; j < QK; j++) qs[j] = (int8_t)(b * 7 + j * 3 - 40);
        }
        memset(row, 0x5a, n);
        legacy_act_pack(at, plain, k, row);
        for (int b = 0; b < 5; b++) {
            const uint8_t *g = row + (size_t)(b / 4) * LEGACY_GROUP_BYTES;
            const int j = b % 4;
            for (int i = 0; i < QK; i++) /* lo: quants 0..15 at 16j; hi: 16..31 at 64 + 16j */
                assert_int_equal((int8_t)g[(i < 16 ? 0 : 64) + 16 * j + i % 16], b * 7 + i * 3 - 40);
            for (int m = 0; m < 4; m++) {
                float d;
                memcpy(&d, g + 192 + 4 * (4 * j + m), 4);
                assert_true(d == 0.5f * (float)(b + 1));
                if (at == TYPE_Q8_0) {
                    int32_t ns, want = 0;
                    memcpy(&ns, g + 128 + 4 * (4 * j + m), 4);
                    for (int t = 0; t < 4; t++) want -= (b * 7 + (4 * m + t) * 3 - 40) + (b * 7 + (16 + 4 * m + t) * 3 - 40);
                    assert_int_equal(ns, want);
                } else {
                    float sv;
                    memcpy(&sv, g + 128 + 4 * (4 * j + m), 4);
                    assert_true(sv == (m == 0 ? -3.0f * (float)(b + 1) : 0.0f));
                }
            }
        }
        for (size_t i = LEGACY_GROUP_BYTES; i < n; i++) { /* blocks 5..7 of the second group: zero */
            const size_t o = i - LEGACY_GROUP_BYTES;
            const bool blk0 = (o < 128 && o % 64 < 16) || (o >= 128 && (o - 128) % 64 < 16);
            if (!blk0) assert_int_equal(row[i], 0);
        }
        memset(back, 0, sizeof(back));
        legacy_act_unpack(at, row, k, back);
        assert_memory_equal(back, plain, 5 * bs);
        free(row);
        if (at == TYPE_Q8_1) break;
    }
}

/* ---- dots: exact cases ---------------------------------------------------- */

/* Random bytes everywhere (every quant value, every qh bit, Q8_0's -128),
 * scales forced to 1 and mins and sums to small integers, small enough rows
 * that every partial sum is an integer below 2^24: every float operation of
 * every kernel is exact, so all ISAs must give exactly the integer result. */
static void test_dot_exact(void **state) {
    (void)state;
    uint64_t seed = 7;
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t];
        const int64_t k = is_float_type(type) ? 301 : 32 * 17;
        const int ncols = 3;
        dotcase_t dc;
        dc_init(&dc, type, k, ncols);
        if (is_float_type(type)) {
            float *x = malloc((size_t)k * sizeof(float));
            assert_non_null(x);
            for (int64_t i = 0; i < k; i++) x[i] = (float)((int)(tu_rand(&seed) % 61) - 30);
            assert_int_equal(quant_quantize_row(type, x, dc.w, k), 0);
            for (int c = 0; c < ncols; c++) {
                float *a = (float *)(dc.a + (size_t)c * dc.ast);
                for (int64_t i = 0; i < k; i++) a[i] = (float)((int)(tu_rand(&seed) % 41) - 20);
            }
            free(x);
        } else {
            const size_t bs = (size_t)quant_traits(type)->size, as = (size_t)quant_traits(dc.act_type)->size;
            uint8_t *plain = malloc(quant_row_size(dc.act_type, k) * (size_t)ncols);
            assert_non_null(plain);
            for (size_t i = 0; i < dc.wbytes; i++) dc.w[i] = (uint8_t)tu_rand(&seed);
            for (int64_t b = 0; b < k / QK; b++) {
                uint8_t *p = dc.w + (size_t)b * bs;
                p[0] = 0x00, p[1] = 0x3c; /* d = 1 */
                if (type == TYPE_Q4_1 || type == TYPE_Q5_1) { /* m in -8..7 */
                    const fp16_t m = f32_to_fp16((float)((int)(tu_rand(&seed) % 16) - 8));
                    p[2] = (uint8_t)m, p[3] = (uint8_t)(m >> 8);
                }
                for (int c = 0; c < ncols; c++) {
                    uint8_t *q = plain + quant_row_size(dc.act_type, k) * (size_t)c + (size_t)b * as;
                    for (size_t i = 0; i < as; i++) q[i] = (uint8_t)(tu_rand(&seed) % 255 + 129); /* int8 -127..127 */
                    q[0] = 0x00, q[1] = 0x3c;
                    if (dc.act_type == TYPE_Q8_1) { /* s = d * sum(q), exact here */
                        int sum = 0;
                        for (int j = 0; j < QK; j++) sum += (int8_t)q[4 + j];
                        const fp16_t s = f32_to_fp16((float)sum);
                        assert_true(fp16_to_f32(s) == (float)sum);
                        q[2] = (uint8_t)s, q[3] = (uint8_t)(s >> 8);
                    }
                }
            }
            for (int c = 0; c < ncols; c++)
                legacy_act_pack(dc.act_type, plain + quant_row_size(dc.act_type, k) * (size_t)c, k,
                                dc.a + (size_t)c * dc.ast);
            free(plain);
        }
        for (int c = 0; c < ncols; c++) {
            double l1;
            const double exact = ref64(&dc, dc_col(&dc, c), &l1);
            assert_true(l1 < 16777216.0); /* the premise: every partial sum exact */
            for (int isa = 0; isa < ISA_COUNT; isa++) {
                if (!g_tab[type][isa].dot || !isa_usable((kern_isa_t)isa)) continue;
                float out = NAN;
                g_tab[type][isa].dot(k, dc.w, dc_col(&dc, c), dc.ast, 1, &out);
                if ((double)out != exact)
                    print_error("%s %s column %d: %.9g, exact %.17g\n", quant_name(type), k_isa_names[isa], c, out, exact);
                assert_true((double)out == exact);
            }
        }
        dc_free(&dc);
    }
}

/* ---- dots: float64 reference, SIMD vs scalar ------------------------------- */

static void check_dot_case(int type, int64_t k, uint64_t *seed) {
    dotcase_t dc;
    dc_init(&dc, type, k, 1);
    dc_weights_gauss(&dc, seed);
    dc_acts_gauss(&dc, 1, ISA_SCALAR, seed);
    double l1;
    const double r = ref64(&dc, dc.a, &l1);
    const double tol = dot_tol(k, l1);
    float ref = NAN;
    g_tab[type][ISA_SCALAR].dot(k, dc.w, dc.a, dc.ast, 1, &ref);
    if (fabs(ref - r) > tol) print_error("%s k=%lld scalar %.9g vs f64 %.9g (tol %g)\n", quant_name(type), (long long)k, ref, r, tol);
    assert_true(fabs(ref - r) <= tol);
    for (int isa = 1; isa < ISA_COUNT; isa++) {
        if (!g_tab[type][isa].dot || !isa_usable((kern_isa_t)isa)) continue;
        float out = NAN;
        g_tab[type][isa].dot(k, dc.w, dc.a, dc.ast, 1, &out);
        if (fabs(out - r) > tol || fabs(out - ref) > 2 * tol)
            print_error("%s k=%lld %s %.9g vs scalar %.9g vs f64 %.9g (tol %g)\n", quant_name(type), (long long)k,
                        k_isa_names[isa], out, ref, r, tol);
        assert_true(fabs(out - r) <= tol);
        assert_true(fabs(out - ref) <= 2 * tol);
    }
    dc_free(&dc);
}

static void test_dot_vs_reference(void **state) {
    (void)state;
    uint64_t seed = 2024;
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t];
        if (is_float_type(type))
            for (size_t i = 0; i < sizeof(k_float_ks) / sizeof(k_float_ks[0]); i++) check_dot_case(type, k_float_ks[i], &seed);
        else
            for (size_t i = 0; i < sizeof(k_block_ks) / sizeof(k_block_ks[0]); i++) check_dot_case(type, k_block_ks[i], &seed);
    }
}

/* One huge row per format (a long accumulation; 2^20 elements, 2^16 under
 * sanitizers). */
static void test_dot_huge_k(void **state) {
    (void)state;
    uint64_t seed = 31337;
    const int64_t k = tu_quick() ? (int64_t)1 << 16 : (int64_t)1 << 20;
    for (int t = 0; t < N_WEIGHT_TYPES; t++) check_dot_case(k_weight_types[t], is_float_type(k_weight_types[t]) ? k + 5 : k, &seed);
}

/* ---- multi-column == one column, bit for bit ------------------------------ */

static void test_dot_multicol_bitexact(void **state) {
    (void)state;
    uint64_t seed = 555;
    const int maxc = KERN_MAX_COLS + 3; /* beyond KERN_MAX_COLS: served in groups */
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t];
        const int64_t ks[] = {is_float_type(type) ? 37 : 32, is_float_type(type) ? 1001 : 96, 4096};
        for (int ki = 0; ki < 3; ki++) {
            for (int isa = 0; isa < ISA_COUNT; isa++) {
                if (!g_tab[type][isa].dot || !isa_usable((kern_isa_t)isa)) continue;
                dotcase_t dc;
                dc_init(&dc, type, ks[ki], maxc);
                dc_weights_gauss(&dc, &seed);
                dc_acts_gauss(&dc, maxc, (kern_isa_t)isa, &seed);
                float one[KERN_MAX_COLS + 3], many[KERN_MAX_COLS + 3];
                for (int c = 0; c < maxc; c++) g_tab[type][isa].dot(dc.k, dc.w, dc_col(&dc, c), dc.ast, 1, &one[c]);
                for (int nc = 2; nc <= maxc; nc++) {
                    for (int c0 = 0; c0 + nc <= maxc; c0++) {
                        memset(many, 0xff, sizeof(many));
                        g_tab[type][isa].dot(dc.k, dc.w, dc_col(&dc, c0), dc.ast, nc, many);
                        if (memcmp(many, one + c0, (size_t)nc * sizeof(float)) != 0)
                            print_error("%s %s k=%lld: %d columns from %d differ from one-column calls\n", quant_name(type),
                                        k_isa_names[isa], (long long)dc.k, nc, c0);
                        assert_memory_equal(many, one + c0, (size_t)nc * sizeof(float));
                    }
                }
                dc_free(&dc);
            }
        }
    }
}

/* ---- multi-row == one row, bit for bit ----------------------------------- */

/* The rows function of each table entry: 1..KERN_MAX_ROWS rows (each
 * its own weights at its own address) x 1..3 columns (3: the row-by-row
 * path) against the entry's dot on each row alone. */
static void check_rows_table(kern_table_t tab, const char *what, uint64_t *seed) {
    enum { MAXC = 3 };
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t];
        const int64_t fks[] = {1, 17, 64, 65, 1001, 4099};
        const int64_t bks[] = {32, 96, 32 * 5, 32 * 37, 4096, 32 * 130};
        for (int ki = 0; ki < 6; ki++) {
            const int64_t k = is_float_type(type) ? fks[ki] : bks[ki];
            for (int isa = 0; isa < ISA_COUNT; isa++) {
                if (!tab[type][isa].dot || !isa_usable((kern_isa_t)isa)) continue;
                const kern_rows_fn rows = tab[type][isa].rows;
                if (!rows) continue;
                dotcase_t dc[KERN_MAX_ROWS];
                const void *w[KERN_MAX_ROWS];
                for (int r = 0; r < KERN_MAX_ROWS; r++) {
                    dc_init(&dc[r], type, k, MAXC);
                    dc_weights_gauss(&dc[r], seed);
                    w[r] = dc[r].w;
                }
                dc_acts_gauss(&dc[0], MAXC, (kern_isa_t)isa, seed);
                for (int nr = 1; nr <= KERN_MAX_ROWS; nr++) {
                    for (int nc = 1; nc <= MAXC; nc++) {
                        float one[KERN_MAX_ROWS * MAXC], many[KERN_MAX_ROWS * MAXC];
                        for (int r = 0; r < nr; r++) tab[type][isa].dot(k, w[r], dc[0].a, dc[0].ast, nc, one + r * nc);
                        memset(many, 0xff, sizeof(many));
                        rows(k, w, nr, dc[0].a, dc[0].ast, nc, many);
                        if (memcmp(many, one, (size_t)(nr * nc) * sizeof(float)) != 0)
                            print_error("%s %s %s k=%lld: %d rows x %d columns differ from one-row calls\n", what,
                                        quant_name(type), k_isa_names[isa], (long long)k, nr, nc);
                        assert_memory_equal(many, one, (size_t)(nr * nc) * sizeof(float));
                    }
                }
                for (int r = 0; r < KERN_MAX_ROWS; r++) dc_free(&dc[r]);
            }
        }
    }
}

static void test_dot_rows_bitexact(void **state) {
    (void)state;
    uint64_t seed = 909;
    check_rows_table(g_tab, "table", &seed);
#if defined(__x86_64__)
    /* The non-VBMI block kernels have their own rows functions. */
    static kern_table_t plain;
    kern_options_t no_vbmi = kern_options();
    no_vbmi.vbmi = false;
    kern_register_float(plain, &no_vbmi);
    kern_register_legacy(plain, &no_vbmi);
    check_rows_table(plain, "no-VBMI", &seed);
    /* Where AVX2 / AVX-512 run, every format has a rows kernel there, and the
     * dispatcher hands out the entry the register functions filled (its
     * options are the ones setup used). */
    for (int isa = ISA_AVX2; isa <= ISA_AVX512; isa++) {
        if (!isa_usable((kern_isa_t)isa)) continue;
        for (int t = 0; t < N_WEIGHT_TYPES; t++) {
            const int type = k_weight_types[t];
            const kern_ops_t *o = kern_ops(type, (kern_isa_t)isa);
            assert_non_null(g_tab[type][isa].rows);
            assert_non_null(o);
            assert_true(o->dot == g_tab[type][isa].dot && o->rows == g_tab[type][isa].rows &&
                        o->act == g_tab[type][isa].act && o->gemm == g_tab[type][isa].gemm);
        }
    }
#endif
    /* The scalar dots have none (the rows API is for memory parallelism). */
    for (int t = 0; t < N_WEIGHT_TYPES; t++) assert_null(g_tab[k_weight_types[t]][ISA_SCALAR].rows);
}

/* The AVX-512 block kernels come in two builds, with and without
 * AVX512-VBMI + GFNI (legacy_avx512_matvec.c picks at registration by
 * kern_options_t.vbmi, which TERN_NO_VBMI turns off). They differ only in how the weights are decoded, so they
 * must agree bit for bit; on a CPU without both extensions both tables hold
 * the same kernel and this checks nothing, which it says. */
static void test_avx512_vbmi_same(void **state) {
    (void)state;
#if defined(__x86_64__)
    if (!isa_usable(ISA_AVX512)) {
        print_message("no AVX-512 here: VBMI comparison not run\n");
        return;
    }
    if (!kern_options().vbmi)
        print_message("no AVX512-VBMI + GFNI here (or TERN_NO_VBMI set): both tables hold the same kernels\n");
    static kern_table_t plain;
    kern_options_t no_vbmi = kern_options();
    no_vbmi.vbmi = false;
    kern_register_legacy(plain, &no_vbmi);
    uint64_t seed = 4242;
    const int block_types[] = {TYPE_Q4_0, TYPE_Q4_1, TYPE_Q5_0, TYPE_Q5_1, TYPE_Q8_0};
    for (int t = 0; t < 5; t++) {
        const int type = block_types[t];
        const int64_t ks[] = {32, 96, 32 * 37, 4096};
        for (int ki = 0; ki < 4; ki++) {
            dotcase_t dc;
            dc_init(&dc, type, ks[ki], KERN_MAX_COLS);
            dc_weights_gauss(&dc, &seed);
            dc_acts_gauss(&dc, KERN_MAX_COLS, ISA_SCALAR, &seed);
            for (int nc = 1; nc <= KERN_MAX_COLS; nc++) {
                float a[KERN_MAX_COLS], b[KERN_MAX_COLS];
                g_tab[type][ISA_AVX512].dot(dc.k, dc.w, dc.a, dc.ast, nc, a);
                plain[type][ISA_AVX512].dot(dc.k, dc.w, dc.a, dc.ast, nc, b);
                assert_memory_equal(a, b, (size_t)nc * sizeof(float));
            }
            dc_free(&dc);
        }
    }
#else
    print_message("not x86-64: VBMI comparison not run\n");
#endif
}

/* ---- GEMM (kern_gemm_t): plain AVX2 and AVX-VNNI ----------------------- */

/* The AVX2 GEMMs of the block formats come in two builds, plain AVX2 and
 * AVX-VNNI (legacy_avx2_matvec.c picks at registration by kern_options_t.avxvnni,
 * which TERN_NO_AVXVNNI turns off). Both form the same exact integer block sums and take the
 * same float steps, so they must agree bit for bit with each other and
 * with the AVX2 dot of every (row, column), and stay within the dot
 * tolerance of the exact value and of the scalar oracle. Shapes: rows
 * around the tiles (1..13), partial groups of four blocks, partial column
 * groups. On a CPU without AVX-VNNI both tables hold the same GEMM (said
 * so). */
static void test_avx2_gemm_vnni_same(void **state) {
    (void)state;
#if defined(__x86_64__)
    if (!isa_usable(ISA_AVX2)) return;
    const bool vnni = kern_options().avxvnni;
    if (!vnni) print_message("no AVX-VNNI here (or TERN_NO_AVXVNNI set): both tables hold the same GEMMs\n");
    static kern_table_t plain;
    kern_options_t no_vnni = kern_options();
    no_vnni.avxvnni = false;
    kern_register_legacy(plain, &no_vnni);
    uint64_t seed = 7117;
    const int block_types[] = {TYPE_Q4_0, TYPE_Q4_1, TYPE_Q5_0, TYPE_Q5_1, TYPE_Q8_0};
    const int64_t shapes[][3] = {{1, 32, 5}, {5, 32 * 5, 16}, {13, 32 * 37, 17}, {7, 4096, 40}, {4, 32 * 6, 33}};
    for (int t = 0; t < 5; t++) {
        const int type = block_types[t];
        const kern_gemm_t *gv = g_tab[type][ISA_AVX2].gemm, *gp = plain[type][ISA_AVX2].gemm;
        assert_non_null(gv);
        assert_non_null(gp);
        assert_true((gv != gp) == vnni);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t nrows = shapes[si][0], k = shapes[si][1], n = shapes[si][2];
            dotcase_t dc;
            dc_init(&dc, type, k, (int)n);
            dc_acts_gauss(&dc, (int)n, ISA_AVX2, &seed);
            const size_t rb = dc.wbytes + 2; /* rows at a stride wider than a row, 2 bytes off alignment */
            uint8_t *wmem = malloc(rb * (size_t)nrows + 2), *w = wmem + 2;
            float *x = malloc((size_t)k * sizeof(float));
            float *yv = malloc(sizeof(float) * (size_t)(nrows * n)), *yp = malloc(sizeof(float) * (size_t)(nrows * n));
            assert_non_null(wmem);
            assert_non_null(x);
            assert_non_null(yv);
            assert_non_null(yp);
            for (int64_t r = 0; r < nrows; r++) {
                fill_gauss(x, k, &seed);
                assert_int_equal(quant_quantize_row(type, x, w + (size_t)r * rb, k), 0);
            }
            tu_run_gemm(gv, k, w, rb, nrows, dc.a, dc.ast, n, yv);
            tu_run_gemm(gp, k, w, rb, nrows, dc.a, dc.ast, n, yp);
            if (memcmp(yv, yp, sizeof(float) * (size_t)(nrows * n)) != 0)
                print_error("%s %lldx%lld n=%lld: AVX-VNNI GEMM differs from the plain AVX2 one\n", quant_name(type),
                            (long long)nrows, (long long)k, (long long)n);
            assert_memory_equal(yv, yp, sizeof(float) * (size_t)(nrows * n));
            for (int64_t r = 0; r < nrows; r++) {
                dotcase_t rc = dc;
                rc.w = w + (size_t)r * rb;
                for (int64_t c = 0; c < n; c++) {
                    float d = NAN, sref = NAN;
                    const float got = yv[c * nrows + r];
                    g_tab[type][ISA_AVX2].dot(k, rc.w, dc_col(&dc, (int)c), dc.ast, 1, &d);
                    g_tab[type][ISA_SCALAR].dot(k, rc.w, dc_col(&dc, (int)c), dc.ast, 1, &sref);
                    double l1;
                    const double exact = ref64(&rc, dc_col(&dc, (int)c), &l1), tol = dot_tol(k, l1);
                    if (memcmp(&got, &d, sizeof got) != 0 || fabs(got - exact) > tol || fabs(got - sref) > 2 * tol)
                        print_error("%s %lldx%lld n=%lld row %lld column %lld: gemm %.9g, dot %.9g, scalar %.9g, "
                                    "exact %.17g (tol %g)\n",
                                    quant_name(type), (long long)nrows, (long long)k, (long long)n, (long long)r,
                                    (long long)c, got, d, sref, exact, tol);
                    assert_memory_equal(&got, &d, sizeof got);
                    assert_true(fabs(got - exact) <= tol);
                    assert_true(fabs(got - sref) <= 2 * tol);
                }
            }
            free(wmem), free(x), free(yv), free(yp);
            dc_free(&dc);
        }
    }
#else
    print_message("not x86-64: AVX-VNNI comparison not run\n");
#endif
}

/* The fp16 table the kernels read scales (and scalar F16 weights) through
 * is the exact conversion for every bit pattern, NaNs included. */
static void test_fp16_table(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = legacy_fp16_lut[h], b = fp16_to_f32((fp16_t)h);
        assert_memory_equal(&a, &b, sizeof(float));
    }
}

/* Every weight format has a scalar entry (the oracle), every ISA entry has
 * both functions, the x86 ISAs are filled exactly where the CPU runs them,
 * and the activation types are the ones the layouts document pairs them
 * with. */
static void test_table_entries(void **state) {
    (void)state;
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t];
        assert_non_null(g_tab[type][ISA_SCALAR].dot);
        assert_non_null(g_tab[type][ISA_SCALAR].act);
        for (int isa = 0; isa < ISA_COUNT; isa++) assert_true((g_tab[type][isa].dot == NULL) == (g_tab[type][isa].act == NULL));
    }
    assert_int_equal(quant_traits(TYPE_Q4_0)->act_type, TYPE_Q8_0);
    assert_int_equal(quant_traits(TYPE_Q5_0)->act_type, TYPE_Q8_0);
    assert_int_equal(quant_traits(TYPE_Q8_0)->act_type, TYPE_Q8_0);
    assert_int_equal(quant_traits(TYPE_Q4_1)->act_type, TYPE_Q8_1);
    assert_int_equal(quant_traits(TYPE_Q5_1)->act_type, TYPE_Q8_1);
#if defined(__x86_64__)
    /* an ISA the CPU runs has every format; one it lacks has none (its
     * files, built for it, must not run even their registration) */
    for (int t = 0; t < N_WEIGHT_TYPES; t++) {
        for (int isa = ISA_AVX2; isa <= ISA_AVX512; isa++) {
            if (isa_ok((kern_isa_t)isa))
                assert_non_null(g_tab[k_weight_types[t]][isa].dot);
            else
                assert_null(g_tab[k_weight_types[t]][isa].dot);
        }
    }
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_fixed_blocks),
        cmocka_unit_test(test_dequant_fixed_floats),
        cmocka_unit_test(test_quantize_fixed),
        cmocka_unit_test(test_roundtrip_rmse),
        cmocka_unit_test(test_weird_inputs),
        cmocka_unit_test(test_table_entries),
        cmocka_unit_test(test_fp16_table),
        cmocka_unit_test(test_act_layout),
        cmocka_unit_test(test_act_matches_reference),
        cmocka_unit_test(test_dot_exact),
        cmocka_unit_test(test_dot_vs_reference),
        cmocka_unit_test(test_dot_huge_k),
        cmocka_unit_test(test_dot_multicol_bitexact),
        cmocka_unit_test(test_avx512_vbmi_same),
        cmocka_unit_test(test_avx2_gemm_vnni_same),
        cmocka_unit_test(test_dot_rows_bitexact),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
