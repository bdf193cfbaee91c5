/*
 * dispatch_cost.c - what the boundaries between matvec dispatches cost a
 * decode step, measured in one process so the drift of a shared machine
 * cancels: the same bytes of weights are read as many small matrices (one
 * dispatch each, the shapes of a model's layers) and as few large ones,
 * alternating over two halves of a working set far larger than the LLC,
 * and each pass is also put against the bandwidth probe's pattern over the
 * same bytes, run just before it. Prints medians over the rounds of
 * time(small) / time(large) and of each pass's GB/s / the probe pass's.
 *
 *   cc -O2 -std=c11 -Iinclude -Isrc -Ibench dev/ab/dispatch_cost.c bench/probe.c build/libtern.a \
 *      $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm -o build/dispatch_cost
 *   build/dispatch_cost THREADS FORMAT COLS ROWS_SMALL ROWS_LARGE [ROUNDS]
 *   e.g. build/dispatch_cost 2 q4_0 2048 2048 65536 30
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "probe.h"
#include "tern_pool.h"

static double pass_ns(tern_pool_t *pool, int type, int64_t rows, int64_t cols, size_t rb, const char *buf,
                      size_t bytes, const float *x, float *y) {
    tern_error_t err;
    const size_t mat = rb * (size_t)rows;
    const uint64_t t0 = tern_now_ns();
    for (size_t o = 0; o + mat <= bytes; o += mat) {
        const kern_mat_t m = {type, rows, cols, rb, buf + o};
        if (kern_matvec(pool, &m, x, y, &err)) {
            fprintf(stderr, "dispatch_cost: %s\n", err.msg);
            return -1.0;
        }
    }
    return (double)(tern_now_ns() - t0);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s THREADS FORMAT COLS ROWS_SMALL ROWS_LARGE [ROUNDS]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[1]);
    const int type = quant_from_name(argv[2]);
    const int64_t cols = atoll(argv[3]), rs = atoll(argv[4]), rl = atoll(argv[5]);
    const int rounds = argc > 6 ? atoi(argv[6]) : 30;
    const size_t rb = type < 0 ? 0 : quant_row_size(type, cols);
    if (threads < 1 || rb == 0 || rs < 1 || rl < rs || rl % rs || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "dispatch_cost: bad arguments\n");
        return 2;
    }
    tern_error_t err;
    tern_pool_t *pool = tern_pool_create(threads, 0, &err);
    const size_t big = rb * (size_t)rl;
    size_t half = ((size_t)1 << 29) / big * big; /* 512 MiB per half, whole large matrices */
    if (half == 0) half = big;
    char *buf = bench_big_alloc(2 * half);
    float *x = malloc(sizeof(float) * (size_t)cols), *y = malloc(sizeof(float) * (size_t)rl);
    float *src = malloc(sizeof(float) * (size_t)cols);
    char *row = malloc(rb);
    double *ratio = malloc(sizeof(double) * (size_t)rounds * 3);
    if (!pool || !buf || !x || !y || !src || !row || !ratio) {
        fprintf(stderr, "dispatch_cost: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < cols; i++) {
        x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        src[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    }
    if (quant_quantize_row(type, src, row, cols)) return 1;
    for (size_t o = 0; o + rb <= 2 * half; o += rb) memcpy(buf + o, row, rb);
    if (bench_probe_read_gbps(threads, (size_t)1 << 28) < 0) return 1; /* picks the probe's pattern */
    double *rsl = ratio, *ps = ratio + rounds, *pl = ratio + 2 * rounds;
    for (int r = -1; r < rounds; r++) {
        double t[2], p[2];
        for (int h = 0; h < 2; h++) {
            const int which = (r + h) & 1; /* 0: small matrices on half h this round */
            const char *b = buf + (size_t)h * half;
            const double g = bench_probe_pass_gbps(threads, b, half);
            t[which] = pass_ns(pool, type, which ? rl : rs, cols, rb, b, half, x, y);
            if (t[which] < 0 || g <= 0) return 1;
            p[which] = ((double)half / t[which]) / g;
        }
        if (r < 0) continue;
        rsl[r] = t[0] / t[1];
        ps[r] = p[0];
        pl[r] = p[1];
    }
    const double m = bench_median(rsl, rounds), a = bench_median(ps, rounds), c = bench_median(pl, rounds);
    printf("%s cols %lld, %d threads: small %lld rows (%.2f MB) vs large %lld rows (%.2f MB): time small/large "
           "median %.3f; %% of probe pass: small %.1f, large %.1f\n",
           argv[2], (long long)cols, threads, (long long)rs, (double)rb * (double)rs / 1e6, (long long)rl,
           (double)big / 1e6, m, 100 * a, 100 * c);
    return 0;
}
