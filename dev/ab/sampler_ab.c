/*
 * sampler_ab.c - the time of one draw of the sampling chain at a 152k
 * vocabulary (Qwen2's), per parameter set: the CLI's default chain (top-k
 * 40, top-p 0.95, min-p 0.05, temperature 0.8), and OpenAI's default
 * request as `tern serve` builds it (temperature 1, no truncation: every id
 * stays in the draw). Build it against two libtern.a (e.g. a git worktree
 * of the commit before) and run them alternately for an A/B:
 *
 *   cc -O2 -std=c11 -Iinclude -Isrc dev/ab/sampler_ab.c build/libtern.a \
 *      $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm -o build/sampler_ab
 *   build/sampler_ab [REPS]
 *
 * Logits: a standard normal per id, times 3 (a spread like a trained
 * model's), one id nudged per draw so that no two draws see the same
 * vector; each draw is accepted (the penalty window moves as in use).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tern.h"
#include "text/sampler.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float randn(uint64_t *s) {
    double u = 0;
    for (int i = 0; i < 12; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        u += (double)(*s >> 11) / 9007199254740992.0;
    }
    return (float)(u - 6.0);
}

int main(int argc, char **argv) {
    const int32_t V = 151936;
    const int reps = argc > 1 ? atoi(argv[1]) : 300;
    float *l = malloc(sizeof(float) * (size_t)V);
    if (!l || reps < 1) return 1;
    uint64_t r = 3;
    for (int32_t i = 0; i < V; i++) l[i] = 3.0f * randn(&r);
    tern_sampler_params_t ps[2];
    const char *names[2] = {"CLI default (top-k 40, top-p 0.95, min-p 0.05, temp 0.8)",
                            "OpenAI default in tern serve (temp 1, no truncation)"};
    ps[0] = tern_sampler_default_params();
    ps[1] = tern_sampler_default_params();
    ps[1].temp = 1.0f, ps[1].top_k = 0, ps[1].top_p = 1.0f, ps[1].min_p = 0.0f;
    printf("| chain | ms per draw (best) | ms per draw (mean) |\n|---|---:|---:|\n");
    for (int c = 0; c < 2; c++) {
        tern_error_t err = {0};
        sampler_t *s = sampler_create(&ps[c], V, &err);
        if (!s) return fprintf(stderr, "%s\n", err.msg), 1;
        double best = 1e30, sum = 0;
        for (int i = 0; i < reps; i++) {
            l[(int32_t)((uint32_t)i * 2654435761u % (uint32_t)V)] += 0.01f;
            const double t0 = now();
            const int32_t id = sampler_sample(s, l);
            const double dt = now() - t0;
            sampler_accept(s, id);
            sum += dt;
            if (dt < best) best = dt;
        }
        printf("| %s | %.3f | %.3f |\n", names[c], best * 1e3, sum / reps * 1e3);
        sampler_free(s);
    }
    free(l);
    return 0;
}
