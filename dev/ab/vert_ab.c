/*
 * vert_ab.c - what a repacked ("vertical") Q4_0 layout would buy the
 * few-column GEMM on this CPU, before anything in the engine depends on it.
 * One thread, one matrix small enough to stay in L3 (as gemm_min.c), the
 * best of many repetitions per column count N, against kern_gemm on the
 * GGUF layout (kern_matvec at N = 1).
 *
 * The layout: per weight row, per chunk of 16 blocks, 288 bytes (the size
 * of the 16 blocks): bytes 64u..64u+63 (u = 0..3) hold, at 4b..4b+3, bytes
 * 4u..4u+3 of block b's qs; bytes 256..287 block b's fp16 d at 2b. One
 * vector load then gives, for 16 blocks, the quants that one vpdpbusd
 * needs (low nibbles: elements 4u..4u+3; high: 16+4u..16+4u+3), so a lane
 * accumulates a whole block and nothing is reduced across lanes. The
 * kernel computes every (row, column) in THE FLOAT ORDER of
 * legacy_avx512_matvec.c (I_b exact; acc_{b mod 4} = fma(I_b, d_w * d_a,
 * .); (acc_0 + acc_2) + (acc_1 + acc_3)): the program checks its output
 * against kern_gemm bit for bit. Gathering the same vectors from the GGUF
 * layout at run time (byte permutes over the chunk's five 64-byte windows)
 * cost about as much as the whole rows kernel (docs/PERF.md), hence the
 * question of a repack at load time.
 *
 *   cc -O2 -std=c11 -march=native -Iinclude -Isrc dev/ab/vert_ab.c build/libtern.a \
 *      $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm -o build/vert_ab
 *   build/vert_ab [NLIST [ROWS [K [REPS]]]]     e.g. build/vert_ab 1,3,5,8 1024 2048 100
 *
 * Times: kern_gemm includes its act quantization and prep; the vertical
 * kernel's figure includes its act layout (from already quantized Q8_0
 * blocks) and the kernel, not the repack (a load-time cost).
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

enum { VB = 16, WCH = 288, COL = 576, QUAD0 = 8 * COL, XCH = QUAD0 + 2 * 256 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One Q4_0 row (nb blocks) into nch chunks of the layout above. */
static void repack_row(const block_q4_0 *b, int64_t nb, uint8_t *o) {
    const int64_t nch = (nb + VB - 1) / VB;
    memset(o, 0, (size_t)nch * WCH);
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *c = o + (size_t)(i / VB) * WCH;
        const int bb = (int)(i % VB);
        for (int u = 0; u < 4; u++) memcpy(c + 64 * u + 4 * bb, b[i].qs + 4 * u, 4);
        memcpy(c + 256 + 2 * bb, &b[i].d, 2);
    }
}

/* ncols (1..8) Q8_0 columns (nb blocks each) into the activation layout:
 * per chunk, column c at COL * c: a[8][64] (a[t][4b..]: block b's quants
 * 4t..4t+3, or 16+4(t-4).. for t >= 4), int32 ns[16] (-8 * sum of block
 * b's quants); quad q at QUAD0 + 256 q: float d[4][16] (d[k][4c + j]:
 * column 4q+c's d of block 4k+j). */
static void act_prep(const block_q8_0 *const *x, int ncols, int64_t nb, char *o) {
    const int64_t nch = (nb + VB - 1) / VB;
    memset(o, 0, (size_t)nch * XCH);
    for (int c = 0; c < ncols; c++) {
        for (int64_t i = 0; i < nb; i++) {
            char *ch = o + (size_t)(i / VB) * XCH;
            const int bb = (int)(i % VB);
            for (int t = 0; t < 8; t++) memcpy(ch + COL * c + 64 * t + 4 * bb, x[c][i].qs + 4 * t, 4);
            int32_t s = 0;
            for (int e = 0; e < QK; e++) s += x[c][i].qs[e];
            s *= -8;
            memcpy(ch + COL * c + 512 + 4 * bb, &s, 4);
            const float d = fp16_to_f32(x[c][i].d);
            memcpy(ch + QUAD0 + 256 * (c / 4) + 64 * (bb / 4) + 4 * (4 * (c % 4) + bb % 4), &d, 4);
        }
    }
}

static inline __attribute__((always_inline)) void vert_row(const uint8_t *w, const char *xg, int ncols, int64_t nch,
                                                           float *y, int64_t ldy) {
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t h = 0; h < nch; h++) {
        const uint8_t *p = w + (size_t)h * WCH;
        for (int o = 0; o < WCH; o += 64) _mm_prefetch((const char *)p + 2048 + o, _MM_HINT_T0);
        __m512i W[8];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const __m512i g = _mm512_loadu_si512(p + 64 * u);
            W[u] = _mm512_and_si512(g, m4);
            W[4 + u] = _mm512_and_si512(_mm512_srli_epi16(g, 4), m4);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 256)));
        const __m512 dk[4] = {_mm512_shuffle_f32x4(dw, dw, 0x00), _mm512_shuffle_f32x4(dw, dw, 0x55),
                              _mm512_shuffle_f32x4(dw, dw, 0xaa), _mm512_shuffle_f32x4(dw, dw, 0xff)};
        const char *x = xg + (size_t)h * XCH;
#pragma GCC unroll 2
        for (int q = 0; q < 2; q++) {
            if (4 * q >= ncols) break;
            __m512 f[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                if (4 * q + c >= ncols) {
                    f[c] = _mm512_setzero_ps();
                    continue;
                }
                const char *xc = x + COL * (4 * q + c);
                __m512i i0 = _mm512_load_si512(xc + 512), i1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++) {
                    i0 = _mm512_dpbusd_epi32(i0, W[t], _mm512_load_si512(xc + 64 * t));
                    i1 = _mm512_dpbusd_epi32(i1, W[4 + t], _mm512_load_si512(xc + 64 * (4 + t)));
                }
                f[c] = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
            }
            const __m512 x0 = _mm512_shuffle_f32x4(f[0], f[1], 0x44), x1 = _mm512_shuffle_f32x4(f[0], f[1], 0xee);
            const __m512 x2 = _mm512_shuffle_f32x4(f[2], f[3], 0x44), x3 = _mm512_shuffle_f32x4(f[2], f[3], 0xee);
            const __m512 T[4] = {_mm512_shuffle_f32x4(x0, x2, 0x88), _mm512_shuffle_f32x4(x0, x2, 0xdd),
                                 _mm512_shuffle_f32x4(x1, x3, 0x88), _mm512_shuffle_f32x4(x1, x3, 0xdd)};
            const char *xd = x + QUAD0 + 256 * q;
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                acc[q] = _mm512_fmadd_ps(T[k], _mm512_mul_ps(dk[k], _mm512_load_ps((const float *)(xd + 64 * k))), acc[q]);
        }
    }
    for (int q = 0; q < 2 && 4 * q < ncols; q++) {
        float r[16] __attribute__((aligned(64)));
        _mm512_store_ps(r, acc[q]);
        for (int c = 0; c < 4 && 4 * q + c < ncols; c++)
            y[(4 * q + c) * ldy] = (r[4 * c] + r[4 * c + 2]) + (r[4 * c + 1] + r[4 * c + 3]);
    }
}

/* All rows, four far-apart streams as the matvec. */
static void vert_gemm(const uint8_t *w, size_t wrow, int64_t rows, int64_t nch, const char *xg, int ncols, float *y,
                      int64_t ldy) {
    const int64_t q = rows >= 16 ? rows / 4 : 0;
    for (int64_t i = 0; i < q; i++)
        for (int s = 0; s < 4; s++) vert_row(w + (size_t)(s * q + i) * wrow, xg, ncols, nch, y + s * q + i, ldy);
    for (int64_t r = 4 * q; r < rows; r++) vert_row(w + (size_t)r * wrow, xg, ncols, nch, y + r, ldy);
}

int main(int argc, char **argv) {
    const char *ns = argc > 1 ? argv[1] : "1,3,5,8";
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 1024, k = argc > 3 ? atoll(argv[3]) : 2048;
    const int reps = argc > 4 ? atoi(argv[4]) : 100;
    if (rows < 1 || k < QK || k % QK) return fprintf(stderr, "rows >= 1, k a multiple of 32\n"), 1;
    const int64_t nb = k / QK, nch = (nb + VB - 1) / VB;
    const size_t rb = quant_row_size(TYPE_Q4_0, k), wrow = (size_t)nch * WCH;
    char *w = malloc(rb * (size_t)rows);
    uint8_t *wv = aligned_alloc(64, wrow * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)(k * 8)), *wf = malloc(sizeof(float) * (size_t)k);
    float *y0 = malloc(sizeof(float) * (size_t)(rows * 8)), *y1 = malloc(sizeof(float) * (size_t)(rows * 8));
    char *xg = aligned_alloc(64, (size_t)nch * XCH);
    block_q8_0 *xq[8];
    if (!w || !wv || !x || !wf || !y0 || !y1 || !xg) return 1;
    srand(1);
    for (int64_t i = 0; i < k * 8; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < k; i++) wf[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        quant_quantize_row(TYPE_Q4_0, wf, w + rb * (size_t)r, k);
        repack_row((const block_q4_0 *)(w + rb * (size_t)r), nb, wv + wrow * (size_t)r);
    }
    for (int c = 0; c < 8; c++) {
        xq[c] = malloc(sizeof(block_q8_0) * (size_t)nb);
        if (!xq[c]) return 1;
        quant_quantize_row(TYPE_Q8_0, x + c * k, xq[c], k);
    }
    const kern_mat_t m = {TYPE_Q4_0, rows, k, rb, w};
    char nbuf[256];
    snprintf(nbuf, sizeof nbuf, "%s", ns);
    printf("| N | kern_gemm ms | vertical ms | vertical / kern_gemm | bits |\n|---:|---:|---:|---:|---|\n");
    char *save = NULL;
    for (char *s = strtok_r(nbuf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        const int n = atoi(s);
        if (n < 1 || n > 8) continue;
        double b0 = 1e30, b1 = 1e30, bp = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            const int rc = n == 1 ? kern_matvec(NULL, &m, x, y0, NULL) : kern_gemm(NULL, &m, n, x, k, y0, rows, NULL);
            double dt = now() - t0;
            if (rc) return 1;
            if (dt < b0) b0 = dt;
            t0 = now();
            act_prep((const block_q8_0 *const *)xq, n, nb, xg);
            const double t1 = now();
            vert_gemm(wv, wrow, rows, nch, xg, n, y1, rows);
            dt = now() - t0;
            if (dt < b1) b1 = dt;
            if (t1 - t0 < bp) bp = t1 - t0;
        }
        const bool same = memcmp(y0, y1, sizeof(float) * (size_t)(rows * n)) == 0;
        printf("| %d | %.3f | %.3f (layout %.3f) | %.2f | %s |\n", n, b0 * 1e3, b1 * 1e3, bp * 1e3, b1 / b0, same ? "identical" : "DIFFER");
        if (!same) return 2;
    }
    for (int c = 0; c < 8; c++) free(xq[c]);
    free(w), free(wv), free(x), free(wf), free(y0), free(y1), free(xg);
    return 0;
}
