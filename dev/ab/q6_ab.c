/*
 * q6_ab.c - a few-column Q6_K kernel with 16 rows in the lanes, against
 * kern_gemm (for 5-8 columns the row-pair kernel of kquant_avx512_gemm.c,
 * for 3-4 the dot tiles) in the same run, bit for bit.
 *
 * The row-pair kernel puts two rows and eight columns in a vector, so every
 * vpdpbusd needs the pair's weight qword broadcast into a register first (a
 * broadcast load: on Zen 4 about the cost of the vpdpbusd itself). Here a
 * panel of 16 rows is decoded and transposed once per super-block (lane r
 * of vector s = row r's four weights of k-slice s, unsigned q in 0..63),
 * and the activations are the signed operand as an embedded {1to16}
 * broadcast straight from the Q8_K block (no layout, no offset). Per
 * column and super-block:
 *   T  = vpdpwssd chain of the rows' (-32 sc_2i, -32 sc_2i+1) int16 pairs
 *        against the column's bsums pairs       (the -32 offset, exact)
 *   T += vpmulld(D_j, sc_j), D_j = four vpdpbusd (sub-block j, j = 0..15)
 *   acc = fma((float)T, d * da, acc)
 * which is T_b of THE FLOAT ORDER of kquant_avx512_matvec.c and its chain,
 * so every (row, column) must equal kern_gemm's bits; the program checks.
 *
 *   cc -O2 -std=c11 -march=native -Iinclude -Isrc dev/ab/q6_ab.c build/libtern.a \
 *      $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm -o build/q6_ab
 *   build/q6_ab [NLIST [ROWS [K [REPS]]]]     e.g. build/q6_ab 3,4,6,8 1024 4096 60
 *
 * Variants (-D at build time): PIPE interleaves the next super-block's
 * decode with this one's compute (q6_pipe); with wrong results (NOCHECK=1
 * in the environment skips the check), NODEC decodes once and NOCOMP skips
 * the compute, to time each half. Measured on the Zen 4 guest:
 * docs/PERF.md ("Two more few-column layouts").
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/quant.h"
#include "kernels/kernels.h"
#include "kernels/x86/kquant_avx512.h"

enum { R = 16, NCMAX = 8 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One super-block of a 16-row panel, decoded. */
typedef struct {
    __m512i wt[64]; /* lane r: row r's weights 4s..4s+3 (unsigned) */
    __m512i sc[16]; /* lane r: row r's sc_j as int32 */
    __m512i p[8];   /* lane r: (-32 sc_2i, -32 sc_2i+1) of row r as int16 pair */
    __m512 d;       /* lane r: row r's d */
} dec_t;

/* 16 x 16 transpose of dwords: out[i] dword c = in[c] dword i. */
static inline __attribute__((always_inline)) void tr16(__m512i r[16]) {
    __m512i t[16], u[16];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        t[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        u[4 * p + 0] = _mm512_unpacklo_epi64(t[4 * p], t[4 * p + 2]);
        u[4 * p + 1] = _mm512_unpackhi_epi64(t[4 * p], t[4 * p + 2]);
        u[4 * p + 2] = _mm512_unpacklo_epi64(t[4 * p + 1], t[4 * p + 3]);
        u[4 * p + 3] = _mm512_unpackhi_epi64(t[4 * p + 1], t[4 * p + 3]);
    }
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), x1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
        const __m512i y0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
        const __m512i y1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
        r[e] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        r[4 + e] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        r[8 + e] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}

static inline __attribute__((always_inline)) void decode(const block_q6_K *const blk[R], dec_t *o, __m512i (*tmp)[4]) {
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) q6k_unpack(blk[r], tmp[r]);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        __m512i x[16];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) x[r] = tmp[r][v];
        tr16(x);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) o->wt[16 * v + i] = x[i];
    }
    __m512i s[16], p[16];
    float d[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        const __m128i sc8 = loadu128(blk[r]->scales);
        s[r] = _mm512_cvtepi8_epi32(sc8);
        const __m256i s16 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc8), 5));
        p[r] = _mm512_castsi256_si512(s16); /* upper half: don't care */
        d[r] = _cvtsh_ss(blk[r]->d);
    }
    tr16(s);
    tr16(p);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) o->sc[j] = s[j];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) o->p[i] = p[i];
    o->d = _mm512_loadu_ps(d);
}

static inline __attribute__((always_inline)) __m512i dp_bc(__m512i acc, __m512i w, const void *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}
static inline __attribute__((always_inline)) __m512i dp0_bc(__m512i w, const void *p) {
    __m512i acc;
    __asm__("vpxord %0, %0, %0\n\tvpdpbusd %2%{1to16%}, %1, %0" : "=&v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}
static inline __attribute__((always_inline)) __m512i dpw_bc(__m512i acc, __m512i w, const void *p) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}

/* One super-block of the panel against nc columns (act blocks a[c]). */
static inline __attribute__((always_inline)) void compute(const dec_t *o, const block_q8_K *const a[NCMAX], int nc,
                                                           __m512 acc[NCMAX]) {
    __m512i T[NCMAX] = {0};
#pragma GCC unroll 8
    for (int c = 0; c < NCMAX; c++) {
        if (c >= nc) break;
        __m512i t = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) t = dpw_bc(t, o->p[i], a[c]->bsums + 2 * i);
        T[c] = t;
    }
#pragma GCC unroll 2
    for (int j = 0; j < 16; j++) {
        const __m512i w0 = o->wt[4 * j], w1 = o->wt[4 * j + 1], w2 = o->wt[4 * j + 2], w3 = o->wt[4 * j + 3];
        const __m512i sc = o->sc[j];
#pragma GCC unroll 8
        for (int c = 0; c < NCMAX; c++) {
            if (c >= nc) break;
            const int8_t *q = a[c]->qs + 16 * j;
            __m512i D = dp0_bc(w0, q);
            D = dp_bc(D, w1, q + 4);
            D = dp_bc(D, w2, q + 8);
            D = dp_bc(D, w3, q + 12);
            T[c] = _mm512_add_epi32(T[c], _mm512_mullo_epi32(D, sc));
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NCMAX; c++) {
        if (c >= nc) break;
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[c]), _mm512_mul_ps(o->d, _mm512_set1_ps(a[c]->d)), acc[c]);
    }
}

/* All rows (a multiple of 16), n <= 8 columns of Q8_K rows (xa, stride st). */
__attribute__((unused)) static void q6_small(const char *w, size_t rb, int64_t rows, int64_t nb, const char *xa, size_t st, int n, float *y,
                     int64_t ldy, dec_t *o, __m512i (*tmp)[4]) {
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        __m512 acc[NCMAX];
        for (int c = 0; c < NCMAX; c++) acc[c] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const block_q6_K *blk[R];
            for (int r = 0; r < R; r++) {
                blk[r] = (const block_q6_K *)(w + (size_t)(r0 + r) * rb) + b;
                const char *pf = (const char *)(blk[r] + 1);
                for (int l = 0; l < 4; l++) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
            }
#ifndef NODEC
            decode(blk, o, tmp);
#else
            if (r0 == 0 && b == 0) decode(blk, o, tmp);
#endif
            const block_q8_K *a[NCMAX];
            for (int c = 0; c < n; c++) a[c] = (const block_q8_K *)(xa + (size_t)c * st) + b;
#ifndef NOCOMP
            compute(o, a, n, acc);
#else
            acc[0] = _mm512_add_ps(acc[0], _mm512_castsi512_ps(o->wt[b & 63]));
#endif
        }
        for (int c = 0; c < n; c++) _mm512_storeu_ps(y + c * ldy + r0, acc[c]);
    }
}


/* decode() cut into steps 0..8, to interleave with compute() */
static inline __attribute__((always_inline)) void decode_step(const block_q6_K *const blk[R], dec_t *o,
                                                               __m512i (*tmp)[4], int step) {
    if (step < 4) {
#pragma GCC unroll 4
        for (int r = 4 * step; r < 4 * step + 4; r++) q6k_unpack(blk[r], tmp[r]);
    } else if (step < 8) {
        const int v = step - 4;
        __m512i x[16];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) x[r] = tmp[r][v];
        tr16(x);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) o->wt[16 * v + i] = x[i];
    } else if (step == 8) {
        __m512i sv[16];
        float d[R];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            sv[r] = _mm512_cvtepi8_epi32(loadu128(blk[r]->scales));
            d[r] = _cvtsh_ss(blk[r]->d);
        }
        tr16(sv);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) o->sc[j] = sv[j];
        o->d = _mm512_loadu_ps(d);
    } else if (step == 9) {
        __m512i pv[16];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const __m128i sc8 = loadu128(blk[r]->scales);
            pv[r] = _mm512_castsi256_si512(
                _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc8), 5)));
        }
        tr16(pv);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) o->p[i] = pv[i];
    }
}

/* compute() with decode steps of the next super-block interleaved */
static inline __attribute__((always_inline)) void compute_pipe(const dec_t *o, const block_q8_K *const a[NCMAX], int nc,
                                                                __m512 acc[NCMAX], const block_q6_K *const nblk[R],
                                                                dec_t *no, __m512i (*tmp)[4], bool next) {
    __m512i T[NCMAX] = {0};
#pragma GCC unroll 8
    for (int c = 0; c < NCMAX; c++) {
        if (c >= nc) break;
        __m512i t = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) t = dpw_bc(t, o->p[i], a[c]->bsums + 2 * i);
        T[c] = t;
    }
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        const __m512i w0 = o->wt[4 * j], w1 = o->wt[4 * j + 1], w2 = o->wt[4 * j + 2], w3 = o->wt[4 * j + 3];
        const __m512i sc = o->sc[j];
#pragma GCC unroll 8
        for (int c = 0; c < NCMAX; c++) {
            if (c >= nc) break;
            const int8_t *q = a[c]->qs + 16 * j;
            __m512i D = dp0_bc(w0, q);
            D = dp_bc(D, w1, q + 4);
            D = dp_bc(D, w2, q + 8);
            D = dp_bc(D, w3, q + 12);
            T[c] = _mm512_add_epi32(T[c], _mm512_mullo_epi32(D, sc));
        }
        if (next && (j & 1)) decode_step(nblk, no, tmp, j >> 1);
        if (next && j == 14) decode_step(nblk, no, tmp, 8);
        if (next && j == 15) decode_step(nblk, no, tmp, 9);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NCMAX; c++) {
        if (c >= nc) break;
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[c]), _mm512_mul_ps(o->d, _mm512_set1_ps(a[c]->d)), acc[c]);
    }
}

__attribute__((unused)) static void q6_pipe(const char *w, size_t rb, int64_t rows, int64_t nb, const char *xa, size_t st, int n, float *y,
                    int64_t ldy, dec_t *o, __m512i (*tmp)[4]) {
    const int64_t total = rows / R * nb; /* (panel, super-block) steps in order */
    const block_q6_K *blk[2][R];
    for (int r = 0; r < R; r++) blk[0][r] = (const block_q6_K *)(w + (size_t)r * rb);
    decode(blk[0], &o[0], tmp);
    __m512 acc[NCMAX];
    for (int c = 0; c < NCMAX; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < total; t++) {
        const int64_t r0 = t / nb * R, b = t % nb;
        const bool next = t + 1 < total;
        const int cur = (int)(t & 1), nx = cur ^ 1;
        if (next) {
            const int64_t r1 = (t + 1) / nb * R, b1 = (t + 1) % nb;
            for (int r = 0; r < R; r++) {
                blk[nx][r] = (const block_q6_K *)(w + (size_t)(r1 + r) * rb) + b1;
                const char *pf = (const char *)(blk[nx][r] + 1);
                for (int l = 0; l < 4; l++) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
            }
        }
        const block_q8_K *a[NCMAX];
        for (int c = 0; c < n; c++) a[c] = (const block_q8_K *)(xa + (size_t)c * st) + b;
        compute_pipe(&o[cur], a, n, acc, blk[nx], &o[nx], tmp, next);
        if (b == nb - 1) {
            for (int c = 0; c < n; c++) _mm512_storeu_ps(y + c * ldy + r0, acc[c]);
            for (int c = 0; c < NCMAX; c++) acc[c] = _mm512_setzero_ps();
        }
    }
}

int main(int argc, char **argv) {
    const char *ns = argc > 1 ? argv[1] : "3,4,6,8";
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 1024, k = argc > 3 ? atoll(argv[3]) : 4096;
    const int reps = argc > 4 ? atoi(argv[4]) : 60;
    if (rows < R || rows % R || k % QK_K) return fprintf(stderr, "rows a multiple of 16, k of 256\n"), 1;
    const int64_t nb = k / QK_K;
    const size_t rb = quant_row_size(TYPE_Q6_K, k), st = sizeof(block_q8_K) * (size_t)nb;
    char *w = malloc(rb * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)(k * NCMAX)), *wf = malloc(sizeof(float) * (size_t)k);
    float *y0 = malloc(sizeof(float) * (size_t)(rows * NCMAX)), *y1 = malloc(sizeof(float) * (size_t)(rows * NCMAX));
    char *xa = malloc(st * NCMAX);
    dec_t *o = aligned_alloc(64, 2 * sizeof(dec_t));
    __m512i(*tmp)[4] = aligned_alloc(64, sizeof(__m512i) * 4 * R);
    if (!w || !x || !wf || !y0 || !y1 || !xa || !o || !tmp) return 1;
    srand(1);
    for (int64_t i = 0; i < k * NCMAX; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < k; i++) wf[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        quant_quantize_row(TYPE_Q6_K, wf, w + rb * (size_t)r, k);
    }
    const kern_mat_t m = {TYPE_Q6_K, rows, k, rb, w};
    char nbuf[256];
    snprintf(nbuf, sizeof nbuf, "%s", ns);
    printf("| N | kern_gemm ms | lanes ms | lanes / kern_gemm | bits |\n|---:|---:|---:|---:|---|\n");
    char *save = NULL;
    for (char *s = strtok_r(nbuf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        const int n = atoi(s);
        if (n < 2 || n > NCMAX) continue;
        double b0 = 1e30, b1 = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            if (kern_gemm(NULL, &m, n, x, k, y0, rows, NULL)) return 1;
            double dt = now() - t0;
            if (dt < b0) b0 = dt;
            if (r == 0)
                for (int c = 0; c < n; c++) quant_quantize_row(TYPE_Q8_K, x + c * k, xa + st * (size_t)c, k);
            t0 = now();
#ifdef PIPE
            q6_pipe(w, rb, rows, nb, xa, st, n, y1, rows, o, tmp);
#else
            q6_small(w, rb, rows, nb, xa, st, n, y1, rows, o, tmp);
#endif
            dt = now() - t0;
            if (dt < b1) b1 = dt;
        }
        const bool same = memcmp(y0, y1, sizeof(float) * (size_t)(rows * n)) == 0;
        printf("| %d | %.3f | %.3f | %.2f | %s |\n", n, b0 * 1e3, b1 * 1e3, b1 / b0, same ? "identical" : "DIFFER");
        if (!same && !getenv("NOCHECK")) {
            for (int64_t i = 0; i < rows * n && i < 4; i++) printf("  %g vs %g\n", y0[i], y1[i]);
            return 2;
        }
    }
    return 0;
}
