/* cpu_features.c - cpuid-based feature detection (x86) and hwcaps (ARM). */
#include "core/cpu.h"

#include <pthread.h>

static cpu_features_t g_feat;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long xgetbv0(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void detect(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1;
    bool avx = (c >> 28) & 1;
    bool fma = (c >> 12) & 1;
    bool f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    unsigned long long xcr0 = xgetbv0();
    bool ymm_ok = (xcr0 & 0x6) == 0x6;
    bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
    if (!ymm_ok) return;
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    g_feat.avx2 = (b >> 5) & 1;
    g_feat.fma = fma;
    g_feat.f16c = f16c;
    if (zmm_ok) {
        g_feat.avx512f = (b >> 16) & 1;
        g_feat.avx512bw = (b >> 30) & 1;
        g_feat.avx512vl = (b >> 31) & 1;
        g_feat.avx512vnni = (c >> 11) & 1;
        unsigned int a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        g_feat.avx512bf16 = (a1 >> 5) & 1;
        g_feat.avxvnni = (a1 >> 4) & 1;
        (void)b1; (void)c1; (void)d1;
    } else {
        unsigned int a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        g_feat.avxvnni = (a1 >> 4) & 1;
        (void)b1; (void)c1; (void)d1;
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
