/*
 * vnni_issue.c - how fast this core issues the instructions of the int8
 * GEMMs (the few-column kernels of issues 15 and 18): the clock (a chain of
 * dependent adds, one cycle each), 512-bit vpdpbusd alone from registers
 * and with its signed operand from memory (a full 64-byte load, a 32-bit
 * broadcast), then twelve vpdpbusd beside a few of one other instruction:
 * where the iteration takes longer than twelve cycles, that instruction
 * shares vpdpbusd's pipes (on Zen 4: the FMA, the float multiply, the
 * two-source permutes, vgf2p8affineqb, vpmulld); where it does not, it runs
 * beside it for free (shuffles, shifts, integer adds and logic, converts),
 * up to that pipe's own rate. x86-64 with AVX-512 VNNI, VBMI and GFNI (built
 * with -march=native on such a CPU; on another it does not compile). No
 * PMU is needed: every rate is counted from the wall time and the measured
 * clock.
 *
 *   cc -O2 -march=native dev/ab/vnni_issue.c -o build/vnni_issue && build/vnni_issue
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERS 20000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char g_buf[4096] __attribute__((aligned(64)));
static volatile int g_sink; /* keeps the chains live */

/* Twelve independent vpdpbusd chains per iteration; the signed operand
 * from SRC(j). */
#define DP12(SRC)                                                                                      \
    "vpdpbusd " SRC(0) ", %12, %0\n\tvpdpbusd " SRC(1) ", %12, %1\n\tvpdpbusd " SRC(2) ", %12, %2\n\t"   \
    "vpdpbusd " SRC(3) ", %12, %3\n\tvpdpbusd " SRC(4) ", %12, %4\n\tvpdpbusd " SRC(5) ", %12, %5\n\t"   \
    "vpdpbusd " SRC(6) ", %12, %6\n\tvpdpbusd " SRC(7) ", %12, %7\n\tvpdpbusd " SRC(8) ", %12, %8\n\t"   \
    "vpdpbusd " SRC(9) ", %12, %9\n\tvpdpbusd " SRC(10) ", %12, %10\n\tvpdpbusd " SRC(11) ", %12, %11\n\t"
#define REG(j) "%13"
#define MEM64(j) #j "*64(%14)"
#define BC32(j) #j "*4(%14)%{1to16%}"
#define UNPCK8                                                                                                 \
    "vpunpckldq %12, %13, %%zmm28\n\tvpunpckldq %12, %13, %%zmm29\n\tvpunpckldq %12, %13, %%zmm30\n\t"        \
    "vpunpckhdq %12, %13, %%zmm31\n\tvpunpckldq %12, %13, %%zmm28\n\tvpunpckldq %12, %13, %%zmm29\n\t"        \
    "vpunpckldq %12, %13, %%zmm30\n\tvpunpckhdq %12, %13, %%zmm31\n\t"

/* Four of one instruction on the scratch registers (independent of the
 * vpdpbusd chains), to see which of them share its pipes. */
#define X4(op) op " %12, %13, %%zmm28\n\t" op " %12, %13, %%zmm29\n\t" op " %12, %13, %%zmm30\n\t" op " %12, %13, %%zmm31\n\t"
#define X4U(op) op " %12, %%zmm28\n\t" op " %12, %%zmm29\n\t" op " %12, %%zmm30\n\t" op " %12, %%zmm31\n\t"
#define X4I(op) op " $0x4, %12, %%zmm28\n\t" op " $0x4, %12, %%zmm29\n\t" op " $0x4, %12, %%zmm30\n\t" op " $0x4, %12, %%zmm31\n\t"
#define X4J(op) op " $0x44, %12, %13, %%zmm28\n\t" op " $0x44, %12, %13, %%zmm29\n\t" op " $0x44, %12, %13, %%zmm30\n\t" op " $0x44, %12, %13, %%zmm31\n\t"

#define RUN(name, body, per_iter)                                                                              \
    do {                                                                                                       \
        __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,      \
                a8 = a0, a9 = a0, a10 = a0, a11 = a0;                                                          \
        const __m512i b = _mm512_set1_epi32(3), c = _mm512_set1_epi32(5);                                      \
        const char *p = g_buf;                                                                                 \
        const double t0 = now();                                                                               \
        for (long i = 0; i < ITERS; i++)                                                                       \
            __asm__ volatile(body : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),      \
                             "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11)                                \
                             : "v"(b), "v"(c), "r"(p)                                                          \
                             : "xmm28", "xmm29", "xmm30", "xmm31", "memory");                                  \
        const double cyc = (now() - t0) * ghz * 1e9 / (double)ITERS;                                           \
        const __m512i s = _mm512_add_epi32(_mm512_add_epi32(a0, a11), _mm512_add_epi32(a5, a7));              \
        g_sink = _mm512_reduce_add_epi32(s);                                                                   \
        printf("| %s | %.2f | %.2f |\n", name, cyc, (per_iter) / cyc);                                        \
    } while (0)

int main(void) {
    double t0 = now();
    unsigned long x = 1;
    for (long i = 0; i < ITERS * 5; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    const double ghz = 4.0 * (double)ITERS * 5 / (now() - t0) / 1e9;
    printf("clock from a chain of dependent adds: %.2f GHz\n\n", ghz);
    printf("| 12 independent 512-bit vpdpbusd per iteration, signed operand | cycles / iteration | vpdpbusd / cycle |\n");
    printf("|---|---:|---:|\n");
    RUN("register", DP12(REG), 12.0);
    RUN("register, plus 8 vpunpck[lh]dq", DP12(REG) UNPCK8, 12.0);
    RUN("64-byte load", DP12(MEM64), 12.0);
    RUN("32-bit broadcast {1to16}", DP12(BC32), 12.0);
    printf("\n| 12 vpdpbusd (registers) beside | cycles / iteration | vpdpbusd / cycle |\n|---|---:|---:|\n");
    RUN("4 vfmadd231ps", DP12(REG) X4("vfmadd231ps"), 12.0);
    RUN("8 vfmadd231ps", DP12(REG) X4("vfmadd231ps") X4("vfmadd231ps"), 12.0);
    RUN("4 vmulps", DP12(REG) X4("vmulps"), 12.0);
    RUN("4 vcvtdq2ps", DP12(REG) X4U("vcvtdq2ps"), 12.0);
    RUN("8 vpaddd", DP12(REG) X4("vpaddd") X4("vpaddd"), 12.0);
    RUN("8 vpandd", DP12(REG) X4("vpandd") X4("vpandd"), 12.0);
    RUN("4 vshufi32x4", DP12(REG) X4J("vshufi32x4"), 12.0);
    RUN("8 vshufi32x4", DP12(REG) X4J("vshufi32x4") X4J("vshufi32x4"), 12.0);
    RUN("4 vpermb", DP12(REG) X4("vpermb"), 12.0);
    RUN("8 vpermb", DP12(REG) X4("vpermb") X4("vpermb"), 12.0);
    RUN("4 vpermt2w", DP12(REG) X4("vpermt2w"), 12.0);
    RUN("4 vgf2p8affineqb", DP12(REG) X4J("vgf2p8affineqb"), 12.0);
    RUN("4 vpmulld", DP12(REG) X4("vpmulld"), 12.0);
    RUN("8 vpsrlw $4", DP12(REG) X4I("vpsrlw") X4I("vpsrlw"), 12.0);
    RUN("8 vpternlogd", DP12(REG) X4J("vpternlogd") X4J("vpternlogd"), 12.0);
    RUN("4 vpermd", DP12(REG) X4("vpermd"), 12.0);
    RUN("4 vpermt2d", DP12(REG) X4("vpermt2d"), 12.0);
    RUN("4 vpermw", DP12(REG) X4("vpermw"), 12.0);
    RUN("4 vcvtph2ps", DP12(REG) "vcvtph2ps %%ymm4, %%zmm28\n\tvcvtph2ps %%ymm4, %%zmm29\n\tvcvtph2ps %%ymm4, %%zmm30\n\tvcvtph2ps %%ymm4, %%zmm31\n\t", 12.0);
    RUN("12 vpunpckldq", DP12(REG) UNPCK8 X4("vpunpckldq"), 12.0);
    RUN("16 vpunpckldq", DP12(REG) UNPCK8 UNPCK8, 12.0);
    return 0;
}
