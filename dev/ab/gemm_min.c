/*
 * gemm_min.c - the compute cost of the few-column GEMMs, robust to a noisy
 * host: one thread (no pool), one matrix small enough to stay in L3 (default
 * 1024 x 4096), the best of many repetitions per column count. The minimum
 * of many runs drops the ones another process interrupted, and with the
 * weights cached the few-column GEMMs are compute-bound, so two builds
 * compare on what their kernels compute (`tern bench kernels --gemm-n` is
 * the figure with weights from RAM and both threads).
 *
 *   cc -O2 -std=c11 -Iinclude -Isrc dev/ab/gemm_min.c build/libtern.a \
 *      $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm -o build/gemm_min
 *   build/gemm_min [FORMATS [NLIST [ROWS [K [REPS]]]]]
 *   e.g. build/gemm_min q4_0,q5_0,q8_0,q4_K,q6_K 1,8,16 1024 4096 40
 *
 * Prints per format the best time of each N (N = 1: kern_matvec) and its
 * ratio to N = 1 when N = 1 is listed first. Kernels follow TERN_ISA etc.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/quant.h"
#include "kernels/kernels.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float frand(void) {
    return (float)rand() / (float)RAND_MAX - 0.5f;
}

int main(int argc, char **argv) {
    const char *fmts = argc > 1 ? argv[1] : "q4_0,q5_0,q8_0,q4_K,q6_K";
    const char *ns = argc > 2 ? argv[2] : "1,8,16";
    const int64_t rows = argc > 3 ? atoll(argv[3]) : 1024, k = argc > 4 ? atoll(argv[4]) : 4096;
    const int reps = argc > 5 ? atoi(argv[5]) : 40;
    enum { NMAX = 64 };
    float *x = malloc(sizeof(float) * (size_t)(k * NMAX)), *y = malloc(sizeof(float) * (size_t)(rows * NMAX));
    float *wf = malloc(sizeof(float) * (size_t)k);
    if (!x || !y || !wf) return 1;
    srand(1);
    for (int64_t i = 0; i < k * NMAX; i++) x[i] = frand();
    char fbuf[256];
    snprintf(fbuf, sizeof fbuf, "%s", fmts);
    char *fsave = NULL;
    for (char *f = strtok_r(fbuf, ",", &fsave); f; f = strtok_r(NULL, ",", &fsave)) {
        const int t = quant_from_name(f);
        const size_t rb = t >= 0 ? quant_row_size(t, k) : 0;
        if (rb == 0) {
            fprintf(stderr, "%s: unknown format or bad row length\n", f);
            return 1;
        }
        char *w = malloc(rb * (size_t)rows);
        if (!w) return 1;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < k; i++) wf[i] = frand();
            quant_quantize_row(t, wf, w + rb * (size_t)r, k);
        }
        const kern_mat_t m = {t, rows, k, rb, w};
        char nbuf[256];
        snprintf(nbuf, sizeof nbuf, "%s", ns);
        double base = 0;
        printf("%-5s", f);
        char *nsave = NULL;
        for (char *s = strtok_r(nbuf, ",", &nsave); s; s = strtok_r(NULL, ",", &nsave)) {
            const int n = atoi(s);
            if (n < 1 || n > NMAX) continue;
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = now();
                const int rc = n == 1 ? kern_matvec(NULL, &m, x, y, NULL) : kern_gemm(NULL, &m, n, x, k, y, rows, NULL);
                const double dt = now() - t0;
                if (rc) return 1;
                if (dt < best) best = dt;
            }
            if (n == 1) base = best;
            printf("  N=%d %.3f ms", n, best * 1e3);
            if (base > 0) printf(" (%.2fx)", best / base);
        }
        printf("\n");
        free(w);
    }
    free(x), free(y), free(wf);
    return 0;
}
