/*
 * cpu.h - CPU features (cpuid), the run-time switches of the environment
 * that choose among them, topology (physical performance cores via hwloc)
 * and thread affinity. The bottom layer: knows nothing above it.
 */
#ifndef TERN_CPU_H
#define TERN_CPU_H

#include <stdbool.h>
#include <stddef.h>

/* What the CPU and the OS let this process run. Every x86 bit includes the
 * OS's XSAVE support of the registers it needs (XCR0): ymm for the AVX
 * family, zmm and the mask registers for AVX-512, the tile state for AMX. */
typedef struct {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool avx512vbmi, gfni; /* GFNI is counted only where AVX-512 is usable */
    bool avxvnni;
    /* AMX: cpuid and XCR0 only; Linux also wants each process to ask for
     * the tile data state before it touches a tile (cpu_amx_permit). */
    bool amx_tile, amx_int8, amx_bf16;
    bool neon, dotprod;
} cpu_features_t;

/* Detected once (thread-safe), includes the OS's XSAVE support checks. */
const cpu_features_t *cpu_features(void);

/* Linux: ask for the AMX tile data state for this process (arch_prctl
 * ARCH_REQ_XCOMP_PERM), once; true when granted and the CPU has AMX. */
bool cpu_amx_permit(void);

/* The environment switches of the kernel choice, read here once
 * (thread-safe) and nowhere else in the library:
 *   TERN_ISA=scalar|avx2|avx512|neon   a kernel set (the kernels layer
 *                                      parses and clamps it);
 *   TERN_NO_AVXVNNI (set, any value)   no AVX-VNNI GEMMs;
 *   TERN_NO_VBMI (set, any value)      no AVX512-VBMI + GFNI decode.
 * The kernels layer turns them into its options (kern_options_default). */
typedef struct {
    const char *isa; /* TERN_ISA; NULL when unset or empty */
    bool no_avxvnni, no_vbmi;
} cpu_env_t;
const cpu_env_t *cpu_env(void);

/* Physical performance cores (no SMT siblings, no efficiency cores), at
 * least 1. why (may be NULL) receives how it was determined. */
int cpu_perf_cores(char *why, size_t why_len);
/* Logical CPUs this process may run on (sched_getaffinity). */
int cpu_online(void);
/* Pin the calling thread to the idx-th physical performance core (one PU of
 * it). Returns 0 or -1 when not possible. */
int cpu_pin_thread(int idx);

/* The last-level cache this process can use, in bytes; 0 = unknown. The
 * highest-level data or unified cache above the CPUs the process may run on
 * (hwloc; within the one package the default thread count uses): the sum of
 * its instances there (one L3 per package on Intel, one per CCX on AMD).
 * Fallback: Linux sysfs (cpuN/cache/indexK: level, type, size) of the first
 * allowed CPU. src (may be NULL) receives where the figure comes from, e.g.
 * "hwloc: L3 unified, 1 instance" or "unknown: ...". Computed once,
 * thread-safe. */
size_t cpu_llc_bytes(char *src, size_t src_len);

#endif
