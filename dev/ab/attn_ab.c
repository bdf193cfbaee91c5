/*
 * attn_ab.c - batched-decode attention over a paged F16 KV cache larger than
 * the LLC, the shape of Llama-3.2-1B (32 query heads, 8 KV heads, head_dim
 * 64, blocks of 32 positions, 16 layers): one "step" is one
 * kern_attention_batch call per layer, NSEQ queries each over its own
 * sequence of CTX positions, the sequences' blocks interleaved in memory as
 * a server allocates them. Prints the best and median step time, the K / V
 * bytes read per step over the best time, and a digest of every output bit
 * (two builds compare on it: the same digest means the same bits).
 *
 *   cc -O2 -std=c11 -Iinclude -Isrc dev/ab/attn_ab.c build/libtern.a \
 *      $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm -o build/attn_ab
 *   build/attn_ab [NSEQ [CTX [THREADS [REPS]]]]     e.g. build/attn_ab 8 512 2 15
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/quant.h"
#include "kernels/kernels.h"
#include "tern_pool.h"

enum { LAYERS = 16, NH = 32, NKV = 8, HD = 64, BP = 32 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

int main(int argc, char **argv) {
    const int nseq = argc > 1 ? atoi(argv[1]) : 8, ctx = argc > 2 ? atoi(argv[2]) : 512;
    const int threads = argc > 3 ? atoi(argv[3]) : 2, reps = argc > 4 ? atoi(argv[4]) : 15;
    if (nseq < 1 || ctx < 1 || threads < 1 || reps < 1) return 2;
    const int bps = (ctx + BP - 1) / BP, nblocks = bps * nseq;
    const size_t pos_bytes = (size_t)NKV * HD * sizeof(fp16_t), block_bytes = (size_t)BP * pos_bytes;
    /* per layer: K and V caches of nblocks blocks; block table per sequence:
     * block i of sequence s is nblocks' slot i * nseq + s (interleaved) */
    fp16_t *kc[LAYERS], *vc[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        kc[l] = malloc(block_bytes * (size_t)nblocks);
        vc[l] = malloc(block_bytes * (size_t)nblocks);
        if (!kc[l] || !vc[l]) return 1;
        for (size_t i = 0; i < block_bytes / 2 * (size_t)nblocks; i++) {
            kc[l][i] = f32_to_fp16(frand());
            vc[l][i] = f32_to_fp16(frand());
        }
    }
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)nblocks);
    kern_attn_query_t *qs = malloc(sizeof(*qs) * (size_t)nseq);
    float *q = malloc(sizeof(float) * (size_t)nseq * NH * HD), *out = malloc(sizeof(float) * (size_t)nseq * NH * HD);
    if (!tables || !qs || !q || !out) return 1;
    for (int s = 0; s < nseq; s++) {
        for (int i = 0; i < bps; i++) tables[s * bps + i] = i * nseq + s;
        qs[s].pos = ctx - 1;
        qs[s].blocks = tables + s * bps;
    }
    for (size_t i = 0; i < (size_t)nseq * NH * HD; i++) q[i] = frand();
    tern_error_t err = {0};
    tern_pool_t *pool = tern_pool_create(threads, 0, &err);
    if (!pool) return 1;
    double *t = malloc(sizeof(double) * (size_t)reps);
    uint64_t digest = 1469598103934665603ull;
    for (int r = 0; r < reps; r++) {
        const double t0 = now();
        for (int l = 0; l < LAYERS; l++) {
            kern_attn_t a = {NH, NKV, HD, TYPE_F16, kc[l], vc[l], 0.125f, BP, block_bytes};
            if (kern_attention_batch(pool, &a, nseq, qs, q, out, &err)) {
                fprintf(stderr, "attention failed: %s\n", err.msg);
                return 1;
            }
            if (r == 0) {
                const unsigned char *b = (const unsigned char *)out;
                for (size_t i = 0; i < sizeof(float) * (size_t)nseq * NH * HD; i++) digest = (digest ^ b[i]) * 1099511628211ull;
            }
        }
        t[r] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_d);
    const double bytes = 2.0 * LAYERS * (double)nseq * ctx * (double)pos_bytes;
    printf("nseq %d ctx %d threads %d: best %.3f ms, median %.3f ms, %.1f GB/s of K/V at best, digest %016llx\n", nseq,
           ctx, threads, t[0] * 1e3, t[reps / 2] * 1e3, bytes / t[0] * 1e-9, (unsigned long long)digest);
    tern_pool_free(pool);
    return 0;
}
