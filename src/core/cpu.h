/*
 * cpu.h - CPU features (cpuid), topology (physical performance cores via
 * hwloc) and thread affinity. The bottom layer: knows nothing above it.
 */
#ifndef TERN_CPU_H
#define TERN_CPU_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16;
    bool avxvnni;
    bool neon, dotprod;
} cpu_features_t;

/* Detected once (thread-safe), includes the OS's XSAVE support checks. */
const cpu_features_t *cpu_features(void);

/* Physical performance cores (no SMT siblings, no efficiency cores), at
 * least 1. why (may be NULL) receives how it was determined. */
int cpu_perf_cores(char *why, size_t why_len);
/* Logical CPUs this process may run on (sched_getaffinity). */
int cpu_online(void);
/* Pin the calling thread to the idx-th physical performance core (one PU of
 * it). Returns 0 or -1 when not possible. */
int cpu_pin_thread(int idx);

#endif
