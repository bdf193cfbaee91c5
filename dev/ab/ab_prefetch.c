/*
 * ab_prefetch.c - in-process A/B of the weight-prefetch distance (PF_DIST,
 * src/kernels/prefetch.h), built and run by dev/ab-prefetch.sh.
 *
 * Why in one process: on a shared machine the bandwidth left to us drifts
 * by tens of percent within seconds, so two builds run one after the other
 * differ by more than the few percent a prefetch distance is worth. The
 * script builds libtern with PF_DIST read from the global tern_ab_pf_dist
 * (defined here), and this program alternates two distances slice by slice:
 * each round times one pass of matvecs over each half of a 1 GiB working
 * set of rows x cols matrices, distance A on one half and B on the other,
 * the halves swapped every round, so both see the same moments and neither
 * reads data the other left in cache. It prints, per format, the median
 * over the rounds of time(A) / time(B) (> 1: B is faster) and its
 * quartiles. An A/A run (the same distance twice) shows the noise floor.
 *
 * Usage: ab_prefetch THREADS DIST_A DIST_B FORMATS [ROUNDS] [ROWSxCOLS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "kernels/kernels.h"
#include "probe.h"
#include "format/quant.h"
#include "tern_pool.h"

unsigned long tern_ab_pf_dist = 4096;

/* One pass of matvecs over n matrices from buf; ns, or -1 on error. */
static double pass_ns(tern_pool_t *pool, int type, int64_t rows, int64_t cols, size_t rb, const char *buf, int n,
                      const float *x, float *y) {
    tern_error_t err;
    const uint64_t t0 = tern_now_ns();
    for (int i = 0; i < n; i++) {
        const kern_mat_t m = {type, rows, cols, rb, buf + (size_t)i * rb * (size_t)rows};
        if (kern_matvec(pool, &m, x, y, &err)) {
            fprintf(stderr, "ab_prefetch: %s\n", err.msg);
            return -1.0;
        }
    }
    return (double)(tern_now_ns() - t0);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s THREADS DIST_A DIST_B FORMATS [ROUNDS] [ROWSxCOLS]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[1]);
    const unsigned long da = strtoul(argv[2], NULL, 0), db = strtoul(argv[3], NULL, 0);
    const int rounds = argc > 5 ? atoi(argv[5]) : 30;
    long long r_in = 4096, c_in = 4096;
    if (argc > 6 && sscanf(argv[6], "%lldx%lld", &r_in, &c_in) != 2) {
        fprintf(stderr, "ab_prefetch: bad shape '%s' (want ROWSxCOLS)\n", argv[6]);
        return 2;
    }
    const int64_t rows = r_in, cols = c_in;
    if (threads < 1 || rounds < 1 || rounds > 1000 || rows < 1 || cols < 1 || rows > (1 << 20) || cols > (1 << 20)) {
        fprintf(stderr, "ab_prefetch: bad arguments\n");
        return 2;
    }
    tern_error_t err;
    tern_pool_t *pool = tern_pool_create(threads, 0, &err);
    float *x = malloc(sizeof(float) * (size_t)cols), *y = malloc(sizeof(float) * (size_t)rows);
    float *src = malloc(sizeof(float) * (size_t)cols);
    double *ratio = malloc(sizeof(double) * (size_t)rounds);
    if (!pool || !x || !y || !src || !ratio) {
        fprintf(stderr, "ab_prefetch: out of memory\n");
        return 1;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < cols; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    printf("| format | shape | threads | A | B | time(A) / time(B), median | quartiles |\n|---|---|---:|---:|---:|---:|---|\n");
    for (char *fmt = strtok(argv[4], ","); fmt; fmt = strtok(NULL, ",")) {
        const int type = quant_from_name(fmt);
        const size_t rb = type < 0 ? 0 : quant_row_size(type, cols);
        if (rb == 0) {
            fprintf(stderr, "ab_prefetch: format '%s' does not fit %lld columns; skipped\n", fmt, (long long)cols);
            continue;
        }
        const size_t mat = rb * (size_t)rows;
        const int half = (int)(((size_t)1 << 29) / mat) > 0 ? (int)(((size_t)1 << 29) / mat) : 1;
        const size_t bytes = 2 * (size_t)half * mat;
        char *buf = bench_big_alloc(bytes); /* huge pages where possible, as the kernel bench's */
        char *row = malloc(rb);
        if (!buf || !row || quant_quantize_row(type, src, row, cols)) {
            fprintf(stderr, "ab_prefetch: no memory or no quantizer for %s\n", fmt);
            return 1;
        }
        for (size_t o = 0; o < bytes; o += rb) memcpy(buf + o, row, rb);
        for (int r = 0; r < rounds; r++) {
            double t[2];
            for (int h = 0; h < 2; h++) {
                const int b = (r + h) & 1; /* which distance reads half h this round */
                tern_ab_pf_dist = b ? db : da;
                t[b] = pass_ns(pool, type, rows, cols, rb, buf + (size_t)h * half * mat, half, x, y);
                if (t[b] < 0) return 1;
            }
            ratio[r] = t[0] / t[1];
        }
        const double med = bench_median(ratio, rounds); /* sorts ratio: the quartiles follow */
        printf("| %s | %lldx%lld | %d | %lu | %lu | %.3f | %.3f-%.3f |\n", fmt, (long long)rows, (long long)cols,
               threads, da, db, med, ratio[rounds / 4], ratio[(3 * rounds) / 4]);
        fflush(stdout);
        bench_big_free(buf, bytes);
        free(row);
    }
    free(x);
    free(y);
    free(src);
    free(ratio);
    tern_pool_free(pool);
    return 0;
}
