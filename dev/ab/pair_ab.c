/*
 * pair_ab.c - a few-column Q4_0 kernel with two rows per vector ("row-pair
 * lanes"), on the GGUF layout as it is, against kern_gemm (the rows kernel
 * of legacy_avx512_matvec.c at 3..12 columns) in the same run, bit for bit.
 *
 * The rows kernel holds one row per vector and block j's quants in 128-bit
 * lane j, so a block's partial sums sit in four lanes and each (row,
 * column) group ends with a transposing reduction of four rows (6 unpacks,
 * 3 adds). Here the 256-bit half e of a vector holds row A (e = 0) or row B
 * (e = 1) of a pair: lane 8e + 2j + h gets, over four vpdpbusd, the 16
 * products of block j at elements {4h, 8+4h, 16+4h, 24+4h} + 0..3, so a
 * block's sum is in two lanes, and two pairs (four rows) reduce with two
 * vshufps and one add. The weight vectors come from each row's two 64-byte
 * windows by the same number of vpermb as the rows kernel's decode (the
 * halves pick the same byte pattern from different windows); the
 * activations are laid out per call for these lanes (X0..X3, the offset
 * correction, the scales in the reduced lane order). Every (row, column)
 * takes THE FLOAT ORDER of legacy_avx512_matvec.c, so the output must equal
 * kern_gemm's bit for bit; the program checks it.
 *
 *   cc -O2 -std=c11 -march=native -Iinclude -Isrc dev/ab/pair_ab.c build/libtern.a \
 *      $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm -o build/pair_ab
 *   build/pair_ab [NLIST [ROWS [K [REPS]]]]     e.g. build/pair_ab 3,4,6,8 1024 2048 100
 *
 * Variants (-D at build time), to see where the time goes: SWAP=1 forms
 * X1 / X3 by a half swap of X0 / X2 instead of loading them; IL works on
 * two columns at once (four chains in flight); SPLIT=1 cuts each chain in
 * two; and, with wrong results (NOCHECK=1 in the environment skips the
 * check), NODEC=1 decodes the weights once per row group, NOFLOAT=1 drops
 * the float steps, SAMECOL points every column at a small L1-resident
 * block of activations. Measured on the Zen 4 guest: docs/PERF.md ("Two
 * more few-column layouts").
 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/quant.h"
#include "kernels/kernels.h"

#ifndef SWAP
#define SWAP 0 /* 1: X1, X3 by a half swap of X0, X2 instead of loads */
#endif

enum { GB = 72, XG = 384, OX0 = 0, OX1 = 64, OX2 = 128, OX3 = 192, ONS = 256, ODA = 320 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint8_t g_idx[64] __attribute__((aligned(64)));  /* quants: V from a window */
static uint8_t g_sidx[64] __attribute__((aligned(64))); /* scales: fp16 word 4L+s */
static uint64_t g_smask[4];                             /* bytes of row r's words */

static void tables(void) {
    for (int e = 0; e < 2; e++)
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++)
                for (int b = 0; b < 4; b++) g_idx[32 * e + 8 * j + 4 * h + b] = (uint8_t)(18 * j + 2 + 4 * h + b);
    memset(g_sidx, 0, sizeof g_sidx);
    memset(g_smask, 0, sizeof g_smask);
    for (int L = 0; L < 4; L++)
        for (int s = 0; s < 4; s++) {
            const int w = 4 * L + s, j = 2 * (L & 1) + (s & 1), r = (s >> 1) * 2 + (L >> 1);
            g_sidx[2 * w] = (uint8_t)(18 * j), g_sidx[2 * w + 1] = (uint8_t)(18 * j + 1);
            g_smask[r] |= 3ull << (2 * w);
        }
}

/* ncols Q8_0 columns (nb blocks) into the per-call layout, column c at
 * c * cst, group g at XG * g. */
static void act_prep(const block_q8_0 *const *x, int ncols, int64_t nb, char *o, size_t cst) {
    const int64_t ng = (nb + 3) / 4;
    for (int c = 0; c < ncols; c++)
        for (int64_t g = 0; g < ng; g++) {
            char *p = o + (size_t)c * cst + (size_t)g * XG;
            memset(p, 0, XG);
            int8_t *X[4] = {(int8_t *)p + OX0, (int8_t *)p + OX1, (int8_t *)p + OX2, (int8_t *)p + OX3};
            int32_t ns[16] = {0};
            float da[16] = {0};
            float d[4] = {0};
            for (int j = 0; j < 4; j++) {
                const int64_t i = 4 * g + j;
                if (i >= nb) continue;
                const int8_t *q = x[c][i].qs;
                d[j] = fp16_to_f32(x[c][i].d);
                for (int h = 0; h < 2; h++) {
                    int32_t s = 0;
                    for (int b = 0; b < 4; b++) {
                        const int l0 = 4 * (2 * j + h) + b, l1 = 32 + l0;
                        X[0][l0] = q[4 * h + b], X[0][l1] = q[8 + 4 * h + b];
                        X[1][l0] = q[8 + 4 * h + b], X[1][l1] = q[4 * h + b];
                        X[2][l0] = q[16 + 4 * h + b], X[2][l1] = q[24 + 4 * h + b];
                        X[3][l0] = q[24 + 4 * h + b], X[3][l1] = q[16 + 4 * h + b];
                        s += q[4 * h + b] + q[8 + 4 * h + b] + q[16 + 4 * h + b] + q[24 + 4 * h + b];
                    }
                    ns[2 * j + h] = ns[8 + 2 * j + h] = -8 * s;
                }
            }
            for (int L = 0; L < 4; L++)
                for (int s = 0; s < 4; s++) da[4 * L + s] = d[2 * (L & 1) + (s & 1)];
            memcpy(p + ONS, ns, sizeof ns);
            memcpy(p + ODA, da, sizeof da);
        }
}

/* Two vectors of a pair (rows a, b): v0 / v1 as in the header. */
static inline __attribute__((always_inline)) void pair_v(__m512i wa0, __m512i wa1, __m512i wb0, __m512i wb1,
                                                          __m512i idx, __m512i *v0, __m512i *v1) {
    const __mmask64 hi = 0xFFFFFFFF00000000ull;
    *v0 = _mm512_mask_permutexvar_epi8(_mm512_permutexvar_epi8(idx, wa0), hi, idx, wb1);
    *v1 = _mm512_mask_permutexvar_epi8(_mm512_permutexvar_epi8(idx, wa1), hi, idx, wb0);
}

#ifndef NODEC
#define NODEC 0
#endif
#ifndef NOFLOAT
#define NOFLOAT 0
#endif
static inline __attribute__((always_inline)) void group(const uint8_t *const wr[4], int64_t g, const char *x, size_t cst,
                                                         int nc, __m512 *acc) {
    const int64_t g_ = g;
    if (NODEC) g = 0;
    const __m512i idx = _mm512_load_si512(g_idx), sidx = _mm512_load_si512(g_sidx), m4 = _mm512_set1_epi8(15);
    const __m512i gfm = _mm512_set1_epi64(0x1020408000000000ll);
    __m512i wa[4], wb[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        wa[r] = _mm512_loadu_si512(wr[r] + (size_t)g * GB);
        wb[r] = _mm512_loadu_si512(wr[r] + (size_t)g * GB + 8);
    }
    __m512i W[2][4];
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        __m512i v0, v1;
        pair_v(wa[2 * p], wb[2 * p], wa[2 * p + 1], wb[2 * p + 1], idx, &v0, &v1);
        W[p][0] = _mm512_and_si512(v0, m4);
        W[p][1] = _mm512_and_si512(v1, m4);
        W[p][2] = _mm512_gf2p8affine_epi64_epi8(v0, gfm, 0);
        W[p][3] = _mm512_gf2p8affine_epi64_epi8(v1, gfm, 0);
    }
    __m512i sc = _mm512_maskz_permutexvar_epi8((__mmask64)g_smask[0], sidx, wa[0]);
    sc = _mm512_mask_permutexvar_epi8(sc, (__mmask64)g_smask[1], sidx, wa[1]);
    sc = _mm512_mask_permutexvar_epi8(sc, (__mmask64)g_smask[2], sidx, wa[2]);
    sc = _mm512_mask_permutexvar_epi8(sc, (__mmask64)g_smask[3], sidx, wa[3]);
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
#if IL
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2) {
        if (c >= nc) break;
        const int c1 = c + 1 < nc ? c + 1 : c;
        const char *a = x + (size_t)c * cst + (size_t)g_ * XG, *b = x + (size_t)c1 * cst + (size_t)g_ * XG;
        __m512i p0 = _mm512_dpbusd_epi32(_mm512_loadu_si512(a + ONS), W[0][0], _mm512_loadu_si512(a + OX0));
        __m512i p1 = _mm512_dpbusd_epi32(_mm512_loadu_si512(a + ONS), W[1][0], _mm512_loadu_si512(a + OX0));
        __m512i q0 = _mm512_dpbusd_epi32(_mm512_loadu_si512(b + ONS), W[0][0], _mm512_loadu_si512(b + OX0));
        __m512i q1 = _mm512_dpbusd_epi32(_mm512_loadu_si512(b + ONS), W[1][0], _mm512_loadu_si512(b + OX0));
#pragma GCC unroll 3
        for (int t = 1; t < 4; t++) {
            p0 = _mm512_dpbusd_epi32(p0, W[0][t], _mm512_loadu_si512(a + 64 * t));
            p1 = _mm512_dpbusd_epi32(p1, W[1][t], _mm512_loadu_si512(a + 64 * t));
            q0 = _mm512_dpbusd_epi32(q0, W[0][t], _mm512_loadu_si512(b + 64 * t));
            q1 = _mm512_dpbusd_epi32(q1, W[1][t], _mm512_loadu_si512(b + 64 * t));
        }
        const __m512 f0 = _mm512_castsi512_ps(p0), f1 = _mm512_castsi512_ps(p1);
        const __m512 h0 = _mm512_castsi512_ps(q0), h1 = _mm512_castsi512_ps(q1);
        const __m512i i = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0x88)),
                                           _mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0xDD)));
        const __m512i j = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(h0, h1, 0x88)),
                                           _mm512_castps_si512(_mm512_shuffle_ps(h0, h1, 0xDD)));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_loadu_ps(a + ODA)), acc[c]);
        if (c + 1 < nc) acc[c + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(j), _mm512_mul_ps(dw, _mm512_loadu_ps(b + ODA)), acc[c + 1]);
    }
#else
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        if (c >= nc) break;
#ifndef SAMECOL
        const char *a = x + (size_t)c * cst + (size_t)g_ * XG;
#else
        const char *a = x + (size_t)c * XG + (size_t)(g_ & 1) * 8 * XG;
#endif
        const __m512i s0 = _mm512_loadu_si512(a + ONS);
        const __m512i x0 = _mm512_loadu_si512(a + OX0), x2 = _mm512_loadu_si512(a + OX2);
#if SWAP
        const __m512i x1 = _mm512_shuffle_i64x2(x0, x0, 0x4E), x3 = _mm512_shuffle_i64x2(x2, x2, 0x4E);
#else
        const __m512i x1 = _mm512_loadu_si512(a + OX1), x3 = _mm512_loadu_si512(a + OX3);
#endif
        __m512i p0 = _mm512_dpbusd_epi32(s0, W[0][0], x0), p1 = _mm512_dpbusd_epi32(s0, W[1][0], x0);
        p0 = _mm512_dpbusd_epi32(p0, W[0][1], x1), p1 = _mm512_dpbusd_epi32(p1, W[1][1], x1);
#if SPLIT
        __m512i q0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0][2], x2), q1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[1][2], x2);
        q0 = _mm512_dpbusd_epi32(q0, W[0][3], x3), q1 = _mm512_dpbusd_epi32(q1, W[1][3], x3);
        p0 = _mm512_add_epi32(p0, q0), p1 = _mm512_add_epi32(p1, q1);
#else
        p0 = _mm512_dpbusd_epi32(p0, W[0][2], x2), p1 = _mm512_dpbusd_epi32(p1, W[1][2], x2);
        p0 = _mm512_dpbusd_epi32(p0, W[0][3], x3), p1 = _mm512_dpbusd_epi32(p1, W[1][3], x3);
#endif
        const __m512 f0 = _mm512_castsi512_ps(p0), f1 = _mm512_castsi512_ps(p1);
        const __m512i i = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0x88)),
                                           _mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0xDD)));
#if NOFLOAT
        acc[c] = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(acc[c]), i));
        (void)dw;
#else
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_loadu_ps(a + ODA)), acc[c]);
#endif
    }
#endif
}

/* Four rows (wr) x nc (<= 8) columns over ng whole groups. */
static inline __attribute__((always_inline)) void rows4(const uint8_t *const wr[4], int64_t ng, const char *x,
                                                         size_t cst, int nc, float *y, size_t ost, size_t ldy) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) acc[c] = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 2 <= ng; g += 2) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            for (size_t b = 0; b < 2 * GB; b += 64) _mm_prefetch((const char *)wr[r] + (size_t)g * GB + b + 2048, _MM_HINT_T0);
        group(wr, g, x, cst, nc, acc);
        group(wr, g + 1, x, cst, nc, acc);
    }
    for (; g < ng; g++) group(wr, g, x, cst, nc, acc);
    for (int c = 0; c < nc; c++) {
        float v[16] __attribute__((aligned(64)));
        _mm512_store_ps(v, acc[c]);
        /* row r's chains j = 0..3 in lanes b, b + 1, b + 4, b + 5 */
        static const int base[4] = {0, 8, 2, 10};
        for (int r = 0; r < 4; r++) {
            const float *a = v + base[r];
            y[(size_t)r * ost + (size_t)c * ldy] = (a[0] + a[4]) + (a[1] + a[5]);
        }
    }
}

static void pair_gemm(const char *w, size_t rb, int64_t rows, int64_t ng, const char *x, size_t cst, int n, float *y,
                      int64_t ldy) {
    const int64_t q = rows / 4, nt = (n + 7) / 8;
    for (int64_t i = 0; i < q; i++) {
        const uint8_t *wr[4];
        for (int s = 0; s < 4; s++) wr[s] = (const uint8_t *)w + (size_t)(s * q + i) * rb;
        for (int64_t t = 0; t < nt; t++) {
            const int64_t c0 = t * n / nt, nc = (t + 1) * n / nt - c0;
            rows4(wr, ng, x + (size_t)c0 * cst, cst, (int)nc, y + c0 * ldy + i, (size_t)q, (size_t)ldy);
        }
    }
}

int main(int argc, char **argv) {
    const char *ns = argc > 1 ? argv[1] : "3,4,6,8";
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 1024, k = argc > 3 ? atoll(argv[3]) : 2048;
    const int reps = argc > 4 ? atoi(argv[4]) : 100;
    if (rows < 4 || rows % 4 || k % 128) return fprintf(stderr, "rows a multiple of 4, k of 128\n"), 1;
    tables();
    const int64_t nb = k / QK, ng = nb / 4;
    const size_t rb = quant_row_size(TYPE_Q4_0, k), cst = (size_t)ng * XG;
    char *w = malloc(rb * (size_t)rows + 64);
    float *x = malloc(sizeof(float) * (size_t)(k * 16)), *wf = malloc(sizeof(float) * (size_t)k);
    float *y0 = malloc(sizeof(float) * (size_t)(rows * 16)), *y1 = malloc(sizeof(float) * (size_t)(rows * 16));
    char *xg = aligned_alloc(64, cst * 16);
    block_q8_0 *xq[16];
    if (!w || !x || !wf || !y0 || !y1 || !xg) return 1;
    srand(1);
    for (int64_t i = 0; i < k * 16; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < k; i++) wf[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        quant_quantize_row(TYPE_Q4_0, wf, w + rb * (size_t)r, k);
    }
    for (int c = 0; c < 16; c++) {
        xq[c] = malloc(sizeof(block_q8_0) * (size_t)nb);
        if (!xq[c]) return 1;
        quant_quantize_row(TYPE_Q8_0, x + c * k, xq[c], k);
    }
    const kern_mat_t m = {TYPE_Q4_0, rows, k, rb, w};
    char nbuf[256];
    snprintf(nbuf, sizeof nbuf, "%s", ns);
    printf("| N | kern_gemm ms | pairs ms (layout ms) | pairs / kern_gemm | bits |\n|---:|---:|---:|---:|---|\n");
    char *save = NULL;
    for (char *s = strtok_r(nbuf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        const int n = atoi(s);
        if (n < 3 || n > 16) continue;
        double b0 = 1e30, b1 = 1e30, bp = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            if (kern_gemm(NULL, &m, n, x, k, y0, rows, NULL)) return 1;
            double dt = now() - t0;
            if (dt < b0) b0 = dt;
            t0 = now();
            act_prep((const block_q8_0 *const *)xq, n, nb, xg, cst);
            const double t1 = now();
            pair_gemm(w, rb, rows, ng, xg, cst, n, y1, rows);
            dt = now() - t0;
            if (dt < b1) b1 = dt;
            if (t1 - t0 < bp) bp = t1 - t0;
        }
        const bool same = memcmp(y0, y1, sizeof(float) * (size_t)(rows * n)) == 0;
        printf("| %d | %.3f | %.3f (%.3f) | %.2f | %s |\n", n, b0 * 1e3, b1 * 1e3, bp * 1e3, b1 / b0,
               same ? "identical" : "DIFFER");
        if (!same && !getenv("NOCHECK")) return 2;
    }
    for (int c = 0; c < 16; c++) free(xq[c]);
    free(w), free(x), free(wf), free(y0), free(y1), free(xg);
    return 0;
}
