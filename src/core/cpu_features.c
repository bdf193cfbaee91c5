/*
 * cpu_features.c - cpuid-based feature detection (x86), hwcaps (ARM), the
 * AMX permission request, and the environment switches of the kernel choice
 * (the one place the library reads TERN_ISA, TERN_NO_AVXVNNI, TERN_NO_VBMI).
 */
#define _GNU_SOURCE /* syscall */
#include "core/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static cpu_features_t g_feat;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long xgetbv0(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

/* XCR0 state components: x87 | SSE | AVX (ymm); opmask | ZMM_Hi256 |
 * Hi16_ZMM; XTILECFG | XTILEDATA. */
#define XCR0_YMM 0x6ull
#define XCR0_ZMM 0xe6ull
#define XCR0_TILE 0x60000ull

static void detect(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1;
    bool avx = (c >> 28) & 1;
    bool fma = (c >> 12) & 1;
    bool f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    unsigned long long xcr0 = xgetbv0();
    bool ymm_ok = (xcr0 & XCR0_YMM) == XCR0_YMM;
    bool zmm_ok = (xcr0 & XCR0_ZMM) == XCR0_ZMM;
    bool tile_ok = (xcr0 & XCR0_TILE) == XCR0_TILE;
    if (!ymm_ok) return;
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned int max_sub7 = a;
    g_feat.avx2 = (b >> 5) & 1;
    g_feat.fma = fma;
    g_feat.f16c = f16c;
    g_feat.gfni = (c >> 8) & 1;
    unsigned int a1 = 0, b1, c1, d1;
    if (max_sub7 >= 1) __cpuid_count(7, 1, a1, b1, c1, d1);
    (void)b1; (void)c1; (void)d1;
    g_feat.avxvnni = (a1 >> 4) & 1;
    if (zmm_ok) {
        g_feat.avx512f = (b >> 16) & 1;
        g_feat.avx512dq = (b >> 17) & 1;
        g_feat.avx512bw = (b >> 30) & 1;
        g_feat.avx512vl = (b >> 31) & 1;
        g_feat.avx512vbmi = (c >> 1) & 1;
        g_feat.avx512vnni = (c >> 11) & 1;
        g_feat.avx512bf16 = (a1 >> 5) & 1;
    }
    if (tile_ok) {
        g_feat.amx_bf16 = (d >> 22) & 1;
        g_feat.amx_tile = (d >> 24) & 1;
        g_feat.amx_int8 = (d >> 25) & 1;
    }
}
#elif defined(__aarch64__)
#if defined(__linux__)
#include <sys/auxv.h>
/* Linux hwcap bits (asm/hwcap.h), in case the libc headers lack them. */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#endif

/* Advanced SIMD is part of every aarch64 Linux system (the ABI passes
 * floats in its registers); the kernel reports it anyway, and the ARMv8.2
 * dot-product instructions (SDOT/UDOT) only where the CPU has them: the
 * binary is built for baseline armv8-a, so a compile-time macro would say
 * nothing about the CPU it runs on. */
static void detect(void) {
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    g_feat.neon = (hw & HWCAP_ASIMD) != 0;
    g_feat.dotprod = g_feat.neon && (hw & HWCAP_ASIMDDP) != 0;
#else
    g_feat.neon = true;
#if defined(__ARM_FEATURE_DOTPROD)
    g_feat.dotprod = true;
#endif
#endif
}
#else
static void detect(void) {}
#endif

const cpu_features_t *cpu_features(void) {
    pthread_once(&g_once, detect);
    return &g_feat;
}

/* ---- AMX permission ----------------------------------------------------- */

static bool g_amx_ok;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define TERN_ARCH_REQ_XCOMP_PERM 0x1023 /* asm/prctl.h */
#define TERN_XFEATURE_XTILEDATA 18

static void amx_request(void) {
    const cpu_features_t *f = cpu_features();
    g_amx_ok = f->amx_tile && syscall(SYS_arch_prctl, TERN_ARCH_REQ_XCOMP_PERM, TERN_XFEATURE_XTILEDATA) == 0;
}
#else
static void amx_request(void) {}
#endif

bool cpu_amx_permit(void) {
    pthread_once(&g_amx_once, amx_request);
    return g_amx_ok;
}

/* ---- environment -------------------------------------------------------- */

static cpu_env_t g_env;
static char g_env_isa[64]; /* a copy: a later setenv must not free what g_env.isa points to */
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

static void env_read(void) {
    const char *isa = getenv("TERN_ISA");
    if (isa && *isa) {
        snprintf(g_env_isa, sizeof g_env_isa, "%s", isa);
        g_env.isa = g_env_isa;
    }
    g_env.no_avxvnni = getenv("TERN_NO_AVXVNNI") != NULL;
    g_env.no_vbmi = getenv("TERN_NO_VBMI") != NULL;
}

const cpu_env_t *cpu_env(void) {
    pthread_once(&g_env_once, env_read);
    return &g_env;
}
