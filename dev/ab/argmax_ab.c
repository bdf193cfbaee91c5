/*
 * argmax_ab.c - argmax_f32 (src/core/argmax.c: AVX2 where the CPU has it)
 * against the loop that defines it (argmax_f32_ref), on 16 rows of a
 * 151936-entry vocabulary (Qwen2.5's; 16 sequences of one batched decode
 * step), random floats in [0, 1]; five rounds, each checks both agree.
 *
 *   cc -O2 -Isrc -Iinclude dev/ab/argmax_ab.c src/core/argmax.c src/core/cpu_features.c \
 *      -o build/argmax_ab && build/argmax_ab
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/argmax.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    enum { N = 151936, ROWS = 16 };
    float *x = malloc(sizeof *x * (size_t)N * ROWS);
    if (!x) return 1;
    srand(1);
    for (long i = 0; i < (long)N * ROWS; i++) x[i] = (float)rand() / (float)RAND_MAX;
    for (int r = 0; r < 5; r++) {
        long diff = 0;
        const double t0 = now_s();
        for (int k = 0; k < ROWS; k++) diff += argmax_f32_ref(x + (long)k * N, N);
        const double t1 = now_s();
        for (int k = 0; k < ROWS; k++) diff -= argmax_f32(x + (long)k * N, N);
        const double t2 = now_s();
        printf("%d rows of %d: loop %.3f ms, argmax_f32 %.3f ms (%.1fx)%s\n", ROWS, N, (t1 - t0) * 1e3,
               (t2 - t1) * 1e3, (t1 - t0) / (t2 - t1), diff ? "  THE INDICES DIFFER" : "");
    }
    free(x);
    return 0;
}
