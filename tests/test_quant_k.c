/*
 * test_quant_k.c - the K formats (Q4_K, Q5_K, Q6_K, Q8_K) and their dot
 * kernels:
 *  - dequantize of hand-built blocks against floats worked out by hand from
 *    ../shared/reference/quant-layouts.md (so a layout mistake shared by the
 *    quantizer and the dequantizer cannot cancel out);
 *  - quantize -> dequantize error on Gaussian data (printed), and on odd
 *    inputs (zeros, constants, spikes, tiny and large values);
 *  - every dot (scalar and each SIMD ISA the CPU has) against a float64 dot
 *    of the dequantized values; SIMD against scalar exactly where the float
 *    arithmetic is exact (so only integer work is compared); multi-column
 *    and multi-row (the entries' rows functions) calls bit-identical to one-row,
 *    one-column calls; SIMD activation quantizers byte-identical to the
 *    scalar one;
 *  - the AVX2 GEMMs, plain and AVX-VNNI: every (row, column) the bits of
 *    the AVX2 dot, near the scalar oracle and the float64 value.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "kernels/kernels.h"
#include "kernels/kquant.h"
#include "kernels/arm/neon.h"
#include "format/quant.h"

static const int k_types[3] = {TYPE_Q4_K, TYPE_Q5_K, TYPE_Q6_K};

static uint64_t g_rng = 0x1234567887654321ull;

static float *gauss(int64_t n, float sigma) {
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = sigma * tu_randn(&g_rng);
    return x;
}

/* ---- hand-built blocks ---------------------------------------------------- */

/* Scales bytes of a Q4_K/Q5_K block chosen so that sub-blocks 4..7 use the
 * top-bits branch of get_scale_min_k4 with every value of those 2 bits.
 * Wanted: sc = {1, 2, 10, 63, 17, 33, 48, 63}, m = {0, 5, 10, 20, 47, 8, 18, 15}
 * (the top bits of sc[4..7] and m[4..7] differ, so mixing them up shows).
 *  j < 4: sc = q[j] & 63, m = q[j+4] & 63; top 2 bits of q[j] / q[j+4] are
 *         bits 4..5 of sc[j+4] / m[j+4]:
 *         sc4 = 17 = 01 0001, sc5 = 33 = 10 0001, sc6 = 48 = 11 0000, sc7 = 63 = 11 1111
 *         m4  = 47 = 10 1111, m5  =  8 = 00 1000, m6  = 18 = 01 0010, m7  = 15 = 00 1111
 *  q[0] = 1 | 1<<6 = 0x41   q[1] = 2 | 2<<6 = 0x82   q[2] = 10 | 3<<6 = 0xCA  q[3] = 63 | 3<<6 = 0xFF
 *  q[4] = 0 | 2<<6 = 0x80   q[5] = 5 | 0<<6 = 0x05   q[6] = 10 | 1<<6 = 0x4A  q[7] = 20 | 0<<6 = 0x14
 *  q[8..11] = low nibble of sc[j+4] | low nibble of m[j+4] << 4:
 *  q[8] = 1 | 15<<4 = 0xF1  q[9] = 1 | 8<<4 = 0x81   q[10] = 0 | 2<<4 = 0x20  q[11] = 15 | 15<<4 = 0xFF */
static const uint8_t k4_scales[12] = {0x41, 0x82, 0xCA, 0xFF, 0x80, 0x05, 0x4A, 0x14, 0xF1, 0x81, 0x20, 0xFF};
static const int k4_sc[8] = {1, 2, 10, 63, 17, 33, 48, 63};
static const int k4_m[8] = {0, 5, 10, 20, 47, 8, 18, 15};

static uint8_t pattern(int i, int mul, int add) { return (uint8_t)(i * mul + add); }

static void test_dequant_q4_K_fixed(void **state) {
    (void)state;
    block_q4_K b;
    b.d = 0x3800;    /* 0.5 */
    b.dmin = 0x3400; /* 0.25 */
    memcpy(b.scales, k4_scales, 12);
    for (int i = 0; i < 128; i++) b.qs[i] = pattern(i, 37, 11);
    float y[QK_K];
    assert_int_equal(quant_dequantize_row(TYPE_Q4_K, &b, y, QK_K), 0);
    /* element 64c + l: low nibble of qs[32c + l], sub-block 2c;
     * element 64c + 32 + l: high nibble, sub-block 2c + 1 */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int q = b.qs[32 * c + l];
            assert_true(y[64 * c + l] == 0.5f * k4_sc[2 * c] * (q & 15) - 0.25f * k4_m[2 * c]);
            assert_true(y[64 * c + 32 + l] == 0.5f * k4_sc[2 * c + 1] * (q >> 4) - 0.25f * k4_m[2 * c + 1]);
        }
    /* by hand: qs[0] = 11 -> y[0] = 0.5*1*11 - 0 = 5.5; y[32] = 0.5*2*0 - 0.25*5 = -1.25;
     * qs[127] = 127*37+11 = 4710 = 0x1266 -> 0x66: y[255] = 0.5*63*6 - 0.25*15 = 185.25;
     * qs[64] = 64*37+11 = 2379 = 0x94B -> 0x4B: y[128] = 0.5*17*11 - 0.25*47 = 81.75,
     * y[160] = 0.5*33*4 - 0.25*8 = 64 */
    assert_true(y[0] == 5.5f);
    assert_true(y[32] == -1.25f);
    assert_true(y[255] == 185.25f);
    assert_true(y[128] == 81.75f);
    assert_true(y[160] == 64.0f);
}

static void test_dequant_q5_K_fixed(void **state) {
    (void)state;
    block_q5_K b;
    b.d = 0x3800;    /* 0.5 */
    b.dmin = 0x3400; /* 0.25 */
    memcpy(b.scales, k4_scales, 12);
    for (int i = 0; i < 128; i++) b.qs[i] = pattern(i, 37, 11);
    for (int i = 0; i < 32; i++) b.qh[i] = pattern(i, 73, 5);
    float y[QK_K];
    assert_int_equal(quant_dequantize_row(TYPE_Q5_K, &b, y, QK_K), 0);
    /* bit k of qh[l] is bit 4 of element 32k + l */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int q = b.qs[32 * c + l];
            int h0 = (b.qh[l] >> (2 * c)) & 1, h1 = (b.qh[l] >> (2 * c + 1)) & 1;
            assert_true(y[64 * c + l] == 0.5f * k4_sc[2 * c] * ((q & 15) + 16 * h0) - 0.25f * k4_m[2 * c]);
            assert_true(y[64 * c + 32 + l] == 0.5f * k4_sc[2 * c + 1] * ((q >> 4) + 16 * h1) - 0.25f * k4_m[2 * c + 1]);
        }
    /* by hand: qh[0] = 5 = 0b101: bits 0 and 2 set. y[0] = 0.5*1*(11+16) = 13.5;
     * y[32] (bit 1 clear) = -1.25; y[64] (bit 2 set, qs[32] = 32*37+11 = 1195 = 0x4AB -> 0xAB,
     * low nibble 11) = 0.5*10*(11+16) - 0.25*10 = 132.5.
     * qh[31] = 31*73+5 = 2268 = 0x8DC -> 0xDC = 0b11011100: bit 7 set; qs[127] = 0x66:
     * y[255] = 0.5*63*(6+16) - 0.25*15 = 689.25 */
    assert_true(y[0] == 13.5f);
    assert_true(y[32] == -1.25f);
    assert_true(y[64] == 132.5f);
    assert_true(y[255] == 689.25f);
}

static void test_dequant_q6_K_fixed(void **state) {
    (void)state;
    block_q6_K b;
    static const int8_t sc[16] = {-128, 127, -1, 5, 0, 64, -64, 3, 1, -2, 100, -100, 7, -7, 33, -33};
    memcpy(b.scales, sc, 16);
    b.d = 0x3000; /* 0.125 */
    for (int i = 0; i < 128; i++) b.ql[i] = pattern(i, 53, 7);
    for (int i = 0; i < 64; i++) b.qh[i] = pattern(i, 29, 3);
    float y[QK_K];
    assert_int_equal(quant_dequantize_row(TYPE_Q6_K, &b, y, QK_K), 0);
    /* half n (0, 128) uses ql[64h..], qh[32h..], scales[8h..]; for l < 32, is = l/16:
     * y[n+l]    = d*sc[is]  *((ql[l]    & 15) | ((qh[l]>>0)&3)<<4) - 32)
     * y[n+l+32] = d*sc[is+2]*((ql[l+32] & 15) | ((qh[l]>>2)&3)<<4) - 32)
     * y[n+l+64] = d*sc[is+4]*((ql[l]    >> 4) | ((qh[l]>>4)&3)<<4) - 32)
     * y[n+l+96] = d*sc[is+6]*((ql[l+32] >> 4) | ((qh[l]>>6)&3)<<4) - 32) */
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
        const int8_t *s = sc + 8 * h;
        const float *yy = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            assert_true(yy[l] == 0.125f * s[is] * q1);
            assert_true(yy[l + 32] == 0.125f * s[is + 2] * q2);
            assert_true(yy[l + 64] == 0.125f * s[is + 4] * q3);
            assert_true(yy[l + 96] == 0.125f * s[is + 6] * q4);
        }
    }
    /* by hand: ql[0] = 7, qh[0] = 3: y[0] = 0.125 * -128 * ((7 | 3<<4) - 32) = -16 * 23 = -368;
     * y[64]: high nibble of ql[0] = 0, (qh>>4)&3 = 0 -> q = -32, scale sc[4] = 0 -> 0;
     * ql[32] = 32*53+7 = 1703 = 0x6A7 -> 0xA7: y[32] = 0.125 * -1 * ((7 | 0) - 32) = 3.125;
     * y[96] = 0.125 * -64 * ((0xA | 0) - 32) = 176.
     * half 1, l = 16 (is = 1): ql[64+16] = 80*53+7 = 4247 = 0x1097 -> 0x97, qh[32+16] =
     * 48*29+3 = 1395 = 0x573 -> 0x73 = 0b01110011:
     * y[128+16] = 0.125 * sc[9] = -2 * ((7 | 3<<4) - 32) = -0.25 * 23 = -5.75;
     * y[128+16+64] = 0.125 * sc[13] = -7 * ((9 | 3<<4) - 32) = -0.875 * 25 = -21.875 */
    assert_true(y[0] == -368.0f);
    assert_true(y[64] == 0.0f);
    assert_true(y[32] == 3.125f);
    assert_true(y[96] == 176.0f);
    assert_true(y[144] == -5.75f);
    assert_true(y[208] == -21.875f);
}

static void test_q8_K_fixed(void **state) {
    (void)state;
    /* amax 127 -> id = 1, so x is rounded as is: ties go to even */
    float x[QK_K];
    for (int i = 0; i < QK_K; i++) x[i] = (float)((i % 9) - 4) + 0.5f; /* -3.5 .. 4.5 */
    x[100] = 127.0f;
    x[101] = -2.5f;
    block_q8_K b;
    assert_int_equal(quant_quantize_row(TYPE_Q8_K, x, &b, QK_K), 0);
    assert_true(b.d == 1.0f);
    assert_int_equal(b.qs[0], -4); /* -3.5 -> -4 */
    assert_int_equal(b.qs[1], -2); /* -2.5 -> -2 */
    assert_int_equal(b.qs[4], 0);  /* 0.5 -> 0 */
    assert_int_equal(b.qs[5], 2);  /* 1.5 -> 2 */
    assert_int_equal(b.qs[8], 4);  /* 4.5 -> 4 */
    assert_int_equal(b.qs[100], 127);
    assert_int_equal(b.qs[101], -2);
    for (int k = 0; k < 16; k++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += b.qs[16 * k + i];
        assert_int_equal(b.bsums[k], s);
    }
    float y[QK_K];
    assert_int_equal(quant_dequantize_row(TYPE_Q8_K, &b, y, QK_K), 0);
    assert_true(y[100] == 127.0f && y[0] == -4.0f);
    /* an all-zero block gives d = 0 and zero quants */
    memset(x, 0, sizeof x);
    memset(&b, 0x55, sizeof b);
    assert_int_equal(quant_quantize_row(TYPE_Q8_K, x, &b, QK_K), 0);
    assert_true(b.d == 0.0f);
    for (int i = 0; i < QK_K; i++) assert_int_equal(b.qs[i], 0);
    for (int k = 0; k < 16; k++) assert_int_equal(b.bsums[k], 0);
}

/* ---- quantize -> dequantize ----------------------------------------------- */

static double rel_rmse(const float *x, const float *y, int64_t n) {
    double e = 0, v = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        v += (double)x[i] * x[i];
    }
    return v > 0 ? sqrt(e / v) : sqrt(e);
}

static void test_roundtrip_gaussian(void **state) {
    (void)state;
    /* llama.cpp's reference quantizers reach about 0.07 / 0.035 / 0.018 */
    static const struct {
        int type;
        double bound;
    } cases[] = {{TYPE_Q4_K, 0.075}, {TYPE_Q5_K, 0.038}, {TYPE_Q6_K, 0.019}, {TYPE_Q8_K, 0.008}};
    const int64_t n = QK_K * (tu_quick() ? 64 : 1024);
    float *x = gauss(n, 0.02f), *y = malloc((size_t)n * sizeof *y);
    void *q = malloc(quant_row_size(TYPE_Q8_K, n));
    assert_non_null(y);
    assert_non_null(q);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_int_equal(quant_quantize_row(cases[c].type, x, q, n), 0);
        assert_int_equal(quant_dequantize_row(cases[c].type, q, y, n), 0);
        double r = rel_rmse(x, y, n);
        print_message("%-5s rmse/std on Gaussian data: %.5f (bound %.3f)\n", quant_name(cases[c].type), r,
                      cases[c].bound);
        assert_true(r < cases[c].bound);
        /* quantizing again gives the same bytes */
        void *q2 = malloc(quant_row_size(cases[c].type, n));
        assert_non_null(q2);
        assert_int_equal(quant_quantize_row(cases[c].type, x, q2, n), 0);
        assert_memory_equal(q, q2, quant_row_size(cases[c].type, n));
        free(q2);
    }
    free(x);
    free(y);
    free(q);
}

/* Blocks llama.cpp would read the same way: finite non-negative d / dmin for
 * Q4_K/Q5_K (mins are subtracted). */
static void check_block_sane(int type, const void *q) {
    if (type == TYPE_Q4_K || type == TYPE_Q5_K) {
        const block_q4_K *b = q; /* d and dmin lead both structs */
        float d = fp16_to_f32(b->d), dm = fp16_to_f32(b->dmin);
        assert_true(isfinite(d) && d >= 0);
        assert_true(isfinite(dm) && dm >= 0);
    } else {
        const block_q6_K *b = q;
        assert_true(isfinite(fp16_to_f32(b->d)));
    }
}

static void test_roundtrip_odd_inputs(void **state) {
    (void)state;
    enum { NCASE = 10 };
    float x[QK_K], y[QK_K];
    union {
        block_q4_K q4;
        block_q5_K q5;
        block_q6_K q6;
    } q;
    for (int t = 0; t < 3; t++) {
        int type = k_types[t];
        for (int cs = 0; cs < NCASE; cs++) {
            float amax = 0;
            for (int i = 0; i < QK_K; i++) {
                float g = tu_randn(&g_rng);
                switch (cs) {
                case 0: x[i] = 0; break;                                 /* all zero */
                case 1: x[i] = 0.75f; break;                             /* positive constant */
                case 2: x[i] = -3.0f; break;                             /* negative constant */
                case 3: x[i] = i == 77 ? 5.0f : 0; break;                /* one spike */
                case 4: x[i] = 1e-20f * g; break;                        /* below fp16 range */
                case 5: x[i] = 3e3f * g; break;                          /* large */
                case 6: x[i] = fabsf(g); break;                          /* positive only */
                case 7: x[i] = -fabsf(g) - 10; break;                    /* negative, offset */
                case 8: x[i] = (i / 32) % 2 ? 1e-3f * g : 100 * g; break; /* mixed sub-blocks */
                default: x[i] = 1e12f * g; break; /* beyond fp16 scales: clipped, finite */
                }
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            }
            assert_int_equal(quant_quantize_row(type, x, &q, QK_K), 0);
            check_block_sane(type, &q);
            assert_int_equal(quant_dequantize_row(type, &q, y, QK_K), 0);
            /* error per element within the coarsest step the format could
             * need for this block (a few levels of amax / 15); values below
             * what fp16 scales can express may all flush to zero */
            const float tol = cs == 4 ? amax : 0.25f * amax;
            for (int i = 0; i < QK_K; i++) {
                assert_true(isfinite(y[i]));
                if (cs == 9) continue;
                if (!(fabsf(x[i] - y[i]) <= tol))
                    fail_msg("%s case %d: x[%d] = %g dequantized to %g", quant_name(type), cs, i, x[i], y[i]);
            }
            if (cs == 0)
                for (int i = 0; i < QK_K; i++) assert_true(y[i] == 0);
            if (cs == 1 || cs == 2 || cs == 3) /* exactly representable in every format */
                assert_true(rel_rmse(x, y, QK_K) < 0.01);
        }
    }
}

/* ---- dot kernels ------------------------------------------------------------ */

static kern_table_t g_tab;

static const char *isa_name(int isa) { return isa == ISA_NEON ? "neon" : isa == ISA_AVX512 ? "avx512" : isa == ISA_AVX2 ? "avx2" : "scalar"; }

static int isa_supported(int isa) {
    const cpu_features_t *f = cpu_features();
    switch (isa) {
    case ISA_SCALAR: return 1;
    case ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case ISA_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni;
    case ISA_NEON: return f->neon;
    default: return 0;
    }
}

static int setup(void **state) {
    (void)state;
    memset(g_tab, 0, sizeof g_tab);
    const kern_options_t o = kern_options(); /* the active sub-features */
    kern_register_kquant(g_tab, &o);
#if defined(__aarch64__)
    kquant_register_neon(g_tab, &o); /* after the scalar column: it reuses the scalar act fn */
#endif
    for (int isa = ISA_AVX2; isa < ISA_COUNT; isa++)
        if (!isa_supported(isa)) print_message("NOTE: CPU lacks %s: its K kernels are not tested here\n",
                                               isa == ISA_AVX2 ? "AVX2+FMA" : isa == ISA_AVX512 ? "AVX-512 F/BW/VL/VNNI" : "NEON");
    return 0;
}

/* A row of k quantized activations in column c of a block with stride. */
typedef struct {
    int64_t k;
    int ncols;
    size_t stride;
    uint8_t *xa;   /* ncols columns of Q8_K */
    double *xd;    /* ncols x k: dequantized activations, exact */
} acts_t;

static acts_t make_acts(int64_t k, int ncols, float sigma) {
    acts_t a = {k, ncols, quant_row_size(TYPE_Q8_K, k) + 4 * sizeof(float), NULL, NULL}; /* padded stride */
    a.xa = malloc(a.stride * (size_t)ncols);
    a.xd = malloc(sizeof(double) * (size_t)(k * ncols));
    assert_non_null(a.xa);
    assert_non_null(a.xd);
    for (int c = 0; c < ncols; c++) {
        float *x = gauss(k, sigma);
        if (c == 1 && k >= 2 * QK_K) memset(x + QK_K, 0, QK_K * sizeof *x); /* an all-zero block */
        block_q8_K *b = (block_q8_K *)(a.xa + (size_t)c * a.stride);
        assert_int_equal(quant_quantize_row(TYPE_Q8_K, x, b, k), 0);
        for (int64_t i = 0; i < k; i++) a.xd[c * k + i] = (double)b[i / QK_K].d * b[i / QK_K].qs[i % QK_K];
        free(x);
    }
    return a;
}

static void free_acts(acts_t *a) {
    free(a->xa);
    free(a->xd);
}

static void test_act_simd_matches_scalar(void **state) {
    (void)state;
    const int64_t k = QK_K * 8;
    float *x = gauss(k, 1.0f);
    memset(x + 2 * QK_K, 0, QK_K * sizeof *x);               /* zero block */
    for (int i = 0; i < QK_K; i++) x[3 * QK_K + i] = (float)((i % 9) - 4) + 0.5f; /* ties */
    x[3 * QK_K + 7] = -127.0f;
    for (int i = 0; i < QK_K; i++) x[4 * QK_K + i] = 1e-30f * (float)(i - 128); /* tiny */
    size_t sz = quant_row_size(TYPE_Q8_K, k);
    uint8_t *ref = malloc(sz), *got = malloc(sz);
    assert_int_equal(quant_quantize_row(TYPE_Q8_K, x, ref, k), 0);
    for (int t = 0; t < 3; t++)
        for (int isa = 0; isa < ISA_COUNT; isa++) {
            if (!isa_supported(isa)) continue;
            kern_act_fn act = g_tab[k_types[t]][isa].act;
            assert_non_null(act);
            memset(got, 0xA5, sz);
            act(x, got, k);
            assert_memory_equal(ref, got, sz);
        }
    free(x);
    free(ref);
    free(got);
}

/* float64 dot of dequantized weights and activations */
static double dot64(const float *wd, const double *xd, int64_t k, double *mag) {
    double s = 0, m = 0;
    for (int64_t i = 0; i < k; i++) {
        s += wd[i] * xd[i];
        m += fabs(wd[i] * xd[i]);
    }
    *mag = m;
    return s;
}

/* Each dot of every ISA vs float64; each multi-column call vs one-column
 * calls of the same function, bit for bit. */
static void check_dots(int type, int64_t k, int rows) {
    const int ncols = KERN_MAX_COLS + 3; /* a full group and a partial one */
    acts_t a = make_acts(k, ncols, 1.0f);
    size_t rb = quant_row_size(type, k);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *wd = malloc(sizeof(float) * (size_t)k);
    assert_non_null(w);
    assert_non_null(wd);
    for (int r = 0; r < rows; r++) {
        float *x = gauss(k, 0.05f);
        assert_int_equal(quant_quantize_row(type, x, w + (size_t)r * rb, k), 0);
        free(x);
    }
    for (int r = 0; r < rows; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        assert_int_equal(quant_dequantize_row(type, wr, wd, k), 0);
        float scalar[KERN_MAX_COLS + 3];
        for (int isa = 0; isa < ISA_COUNT; isa++) {
            if (!isa_supported(isa)) continue;
            kern_dot_fn dot = g_tab[type][isa].dot;
            assert_non_null(dot);
            float multi[KERN_MAX_COLS + 3];
            dot(k, wr, a.xa, a.stride, ncols, multi);
            for (int nc = 1; nc <= KERN_MAX_COLS; nc++) { /* every group width, every column */
                float part[KERN_MAX_COLS];
                for (int c0 = 0; c0 + nc <= ncols; c0 += nc) {
                    dot(k, wr, a.xa + (size_t)c0 * a.stride, a.stride, nc, part);
                    for (int c = 0; c < nc; c++)
                        if (memcmp(&part[c], &multi[c0 + c], sizeof(float)) != 0)
                            fail_msg("%s %s k=%lld: column %d in a call of %d gives %.9g, alone %.9g",
                                     quant_name(type), isa_name(isa), (long long)k, c0 + c, nc, part[c],
                                     multi[c0 + c]);
                }
            }
            for (int c = 0; c < ncols; c++) {
                double mag, ref = dot64(wd, a.xd + c * k, k, &mag);
                /* float rounding of the dequantized weights (~1 ulp each)
                 * and of the per-block float accumulation */
                double tol = 2e-6 * mag * (1 + sqrt((double)(k / QK_K))) + 1e-30;
                if (!(fabs(multi[c] - ref) <= tol))
                    fail_msg("%s %s k=%lld col %d: %.9g vs float64 %.9g (tol %.3g)", quant_name(type),
                             isa_name(isa), (long long)k, c, multi[c], ref, tol);
                if (isa == ISA_SCALAR) scalar[c] = multi[c];
                else if (!(fabs(multi[c] - scalar[c]) <= tol))
                    fail_msg("%s %s vs scalar: %.9g vs %.9g", quant_name(type), isa_name(isa), multi[c],
                             scalar[c]);
            }
        }
    }
    free(w);
    free(wd);
    free_acts(&a);
}

static void test_dots_sizes(void **state) {
    (void)state;
    static const int64_t nblocks[] = {1, 2, 3, 17, 64};
    for (int t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof nblocks / sizeof nblocks[0]; s++)
            check_dots(k_types[t], QK_K * nblocks[s], tu_quick() ? 2 : 4);
}

static void test_dots_large_k(void **state) {
    (void)state;
    for (int t = 0; t < 3; t++) check_dots(k_types[t], QK_K * (tu_quick() ? 256 : 1024), 1);
}

/* Where every float operation is exact, SIMD and scalar must agree to the
 * bit, so any error in the integer work (a wrong nibble, high bit, scale,
 * min or bsum) shows up exactly. One super-block per call with d = dmin a
 * power of two and activations mostly in -7..7: the block's value is an
 * integer below 2^23 times a power of two in every ISA's lanes and sums.
 * The weight bytes are random, so every 6-bit scale/min and every high bit
 * pattern occurs. */
static void test_dots_exact_vs_scalar(void **state) {
    (void)state;
    enum { NCOLS = 3 };
    const int trials = tu_quick() ? 100 : 400;
    const size_t stride = sizeof(block_q8_K);
    block_q8_K xa[NCOLS];
    for (int t = 0; t < 3; t++) {
        const int type = k_types[t];
        for (int it = 0; it < trials; it++) {
            for (int c = 0; c < NCOLS; c++) {
                block_q8_K *x = &xa[c];
                x->d = ldexpf(1.0f, (int)(tu_rand(&g_rng) % 5) - 2);
                for (int i = 0; i < QK_K; i++) x->qs[i] = (int8_t)((int)(tu_rand(&g_rng) % 15) - 7);
                x->qs[tu_rand(&g_rng) % QK_K] = -128; /* the int8 extremes */
                x->qs[tu_rand(&g_rng) % QK_K] = 127;
                for (int j = 0; j < 16; j++) {
                    int s = 0;
                    for (int i = 0; i < 16; i++) s += x->qs[16 * j + i];
                    x->bsums[j] = (int16_t)s;
                }
            }
            union {
                block_q4_K q4;
                block_q5_K q5;
                block_q6_K q6;
            } w;
            for (size_t i = 0; i < sizeof w; i++) ((uint8_t *)&w)[i] = (uint8_t)tu_rand(&g_rng);
            fp16_t d = f32_to_fp16(ldexpf(1.0f, (int)(tu_rand(&g_rng) % 5) - 6));
            if (type == TYPE_Q6_K) w.q6.d = d;
            else w.q4.d = w.q4.dmin = d; /* d, dmin lead both Q4_K and Q5_K */
            float ref[NCOLS];
            g_tab[type][ISA_SCALAR].dot(QK_K, &w, xa, stride, NCOLS, ref);
            for (int isa = ISA_AVX2; isa < ISA_COUNT; isa++) {
                if (!isa_supported(isa)) continue;
                float got[NCOLS];
                g_tab[type][isa].dot(QK_K, &w, xa, stride, NCOLS, got);
                for (int c = 0; c < NCOLS; c++)
                    if (ref[c] != got[c])
                        fail_msg("%s %s trial %d col %d: %.9g, scalar %.9g", quant_name(type), isa_name(isa),
                                 it, c, got[c], ref[c]);
            }
        }
    }
}

/* The multi-row entry points give, for every row and column, the bits of
 * the one-row dot of the same ISA, whatever the rows' addresses and the
 * number of rows and columns. */
static void test_dot_rows_match_dot(void **state) {
    (void)state;
    const int64_t k = QK_K * 5;
    const int nrows_total = 9, ncols_max = KERN_MAX_COLS + 1;
    acts_t a = make_acts(k, ncols_max, 1.0f);
    for (int t = 0; t < 3; t++) {
        const int type = k_types[t];
        const size_t rb = quant_row_size(type, k);
        uint8_t *w = malloc(rb * nrows_total);
        assert_non_null(w);
        for (int r = 0; r < nrows_total; r++) {
            float *x = gauss(k, 0.05f);
            assert_int_equal(quant_quantize_row(type, x, w + (size_t)r * rb, k), 0);
            free(x);
        }
        for (int isa = 0; isa < ISA_COUNT; isa++) {
            if (!isa_supported(isa) || isa == ISA_NEON) continue; /* NEON has no rows kernels */
            const kern_rows_fn rows = g_tab[type][isa].rows;
            kern_dot_fn dot = g_tab[type][isa].dot;
            assert_non_null(rows);
            float ref[9][KERN_MAX_COLS + 1];
            for (int r = 0; r < nrows_total; r++) dot(k, w + (size_t)r * rb, a.xa, a.stride, ncols_max, ref[r]);
            for (int nr = 1; nr <= KQUANT_MAX_ROWS; nr++)
                for (int nc = 1; nc <= ncols_max; nc++) {
                    /* rows far apart and out of order */
                    const void *wr[KQUANT_MAX_ROWS];
                    int idx[KQUANT_MAX_ROWS];
                    for (int i = 0; i < nr; i++) {
                        idx[i] = (7 * i + nr + nc) % nrows_total;
                        wr[i] = w + (size_t)idx[i] * rb;
                    }
                    float out[KQUANT_MAX_ROWS * (KERN_MAX_COLS + 1)];
                    rows(k, wr, nr, a.xa, a.stride, nc, out);
                    for (int i = 0; i < nr; i++)
                        for (int c = 0; c < nc; c++)
                            if (memcmp(&out[i * nc + c], &ref[idx[i]][c], sizeof(float)) != 0)
                                fail_msg("%s %s rows=%d cols=%d: row %d col %d %.9g, one-row dot %.9g",
                                         quant_name(type), isa_name(isa), nr, nc, i, c, out[i * nc + c],
                                         ref[idx[i]][c]);
                }
        }
        free(w);
    }
    free_acts(&a);
}

/* ---- GEMM (kern_gemm_t): plain AVX2 and AVX-VNNI ------------------------- */

/* The AVX2 GEMMs of the K formats come in two builds, plain AVX2 and
 * AVX-VNNI (kquant_avx2_matvec.c picks at registration by kern_options_t.avxvnni,
 * which TERN_NO_AVXVNNI turns off). Both form the same exact integers per super-block and take
 * the same float steps, so each must give, for every (row, column), the bits
 * of the AVX2 dot (so of each other), within the dot tolerance of the
 * float64 value and of the scalar oracle. Shapes: rows around the 3-row
 * panels and the row blocks, k-chunks, partial column groups and halves
 * (the VNNI layout permutes the 8 columns of a half), column blocks (the
 * last shape: 3 groups of 16, 2 to a block at this k). On a CPU without
 * AVX-VNNI both tables hold the same GEMM (said so). */
static void test_avx2_gemm_vnni_same(void **state) {
    (void)state;
#if defined(__x86_64__)
    if (!isa_supported(ISA_AVX2)) return;
    const bool vnni = kern_options().avxvnni;
    if (!vnni) print_message("no AVX-VNNI here (or TERN_NO_AVXVNNI set): both tables hold the same GEMMs\n");
    static kern_table_t plain;
    kern_options_t no_vnni = kern_options();
    no_vnni.avxvnni = false;
    kern_register_kquant(plain, &no_vnni);
    static const int64_t shapes[][3] = {{1, 1, 1},  {2, 1, 5},   {4, 3, 8},   {5, 5, 11},
                                        {13, 17, 23}, {7, 4, 16}, {3, 2, 9}, {13, 64, 40}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t nrows = shapes[si][0], k = QK_K * shapes[si][1], n = shapes[si][2];
        acts_t a = make_acts(k, (int)n, 1.0f);
        float *wd = malloc(sizeof(float) * (size_t)k);
        float *yv = malloc(sizeof(float) * (size_t)(nrows * n)), *yp = malloc(sizeof(float) * (size_t)(nrows * n));
        assert_non_null(wd);
        assert_non_null(yv);
        assert_non_null(yp);
        for (int t = 0; t < 3; t++) {
            const int type = k_types[t];
            const kern_gemm_t *gv = g_tab[type][ISA_AVX2].gemm, *gp = plain[type][ISA_AVX2].gemm;
            assert_non_null(gv);
            assert_non_null(gp);
            assert_true((gv != gp) == vnni);
            const size_t rb = quant_row_size(type, k) + 2; /* rows at a wider stride, 2 bytes off alignment */
            uint8_t *wmem = malloc(rb * (size_t)nrows + 2), *w = wmem + 2;
            assert_non_null(wmem);
            for (int64_t r = 0; r < nrows; r++) {
                float *x = gauss(k, 0.05f);
                assert_int_equal(quant_quantize_row(type, x, w + (size_t)r * rb, k), 0);
                free(x);
            }
            tu_run_gemm(gv, k, w, rb, nrows, a.xa, a.stride, n, yv);
            tu_run_gemm(gp, k, w, rb, nrows, a.xa, a.stride, n, yp);
            for (int64_t r = 0; r < nrows; r++) {
                const uint8_t *wr = w + (size_t)r * rb;
                assert_int_equal(quant_dequantize_row(type, wr, wd, k), 0);
                for (int64_t c = 0; c < n; c++) {
                    const uint8_t *xc = a.xa + (size_t)c * a.stride;
                    float d = NAN, sref = NAN;
                    g_tab[type][ISA_AVX2].dot(k, wr, xc, a.stride, 1, &d);
                    g_tab[type][ISA_SCALAR].dot(k, wr, xc, a.stride, 1, &sref);
                    const float gotv = yv[c * nrows + r], gotp = yp[c * nrows + r];
                    double mag;
                    const double ref = dot64(wd, a.xd + c * k, k, &mag);
                    const double tol = 2e-6 * mag * (1 + sqrt((double)(k / QK_K))) + 1e-30;
                    if (memcmp(&gotv, &d, sizeof d) != 0 || memcmp(&gotp, &d, sizeof d) != 0 ||
                        !(fabs(gotv - ref) <= tol) || !(fabs(gotv - sref) <= tol))
                        fail_msg("%s %lldx%lld n=%lld row %lld col %lld: vnni gemm %.9g, plain gemm %.9g, dot %.9g, "
                                 "scalar %.9g, float64 %.17g (tol %.3g)",
                                 quant_name(type), (long long)nrows, (long long)k, (long long)n, (long long)r,
                                 (long long)c, gotv, gotp, d, sref, ref, tol);
                }
            }
            free(wmem);
        }
        free(wd);
        free(yv);
        free(yp);
        free_acts(&a);
    }
#else
    print_message("not x86-64: AVX-VNNI comparison not run\n");
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_q4_K_fixed),
        cmocka_unit_test(test_dequant_q5_K_fixed),
        cmocka_unit_test(test_dequant_q6_K_fixed),
        cmocka_unit_test(test_q8_K_fixed),
        cmocka_unit_test(test_roundtrip_gaussian),
        cmocka_unit_test(test_roundtrip_odd_inputs),
        cmocka_unit_test(test_act_simd_matches_scalar),
        cmocka_unit_test(test_dots_exact_vs_scalar),
        cmocka_unit_test(test_dots_sizes),
        cmocka_unit_test(test_dots_large_k),
        cmocka_unit_test(test_dot_rows_match_dot),
        cmocka_unit_test(test_avx2_gemm_vnni_same),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
