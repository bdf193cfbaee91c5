/*
 * maddubs_issue.c - how fast this core issues the instructions of the
 * plain AVX2 int8 GEMM (legacy_avx2_gemm.c, no VNNI): the clock (a chain of
 * dependent adds, one cycle each), eight independent 256-bit vpmaddubsw,
 * then eight beside the other instructions of the GEMM's inner loop: the
 * int16 adds that sum them, the weight dword broadcasts from memory, the
 * activation loads, vpmaddwd. It prints cycles per iteration: where a row
 * takes longer than the eight vpmaddubsw alone, those instructions do not
 * run beside them for free. Any x86-64 CPU with AVX2. No PMU is needed:
 * every rate is counted from the wall time and the measured clock, so run
 * it on a quiet machine, several times.
 *
 *   cc -O2 -mavx2 dev/ab/maddubs_issue.c -o build/maddubs_issue && build/maddubs_issue
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

static char g_buf[512] __attribute__((aligned(64)));
static volatile int g_sink; /* keeps the results live */

/* One row: BODY (asm text over %0..%11: twelve ymm registers, %12 / %13:
 * two inputs, %14: g_buf) ITERS times, in cycles per iteration. */
#define ROW(name, body)                                                                                        \
    do {                                                                                                       \
        __m256i a0 = _mm256_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,      \
                a8 = a0, a9 = a0, a10 = a0, a11 = a0;                                                          \
        const __m256i w = _mm256_set1_epi8(3), v = w;                                                          \
        const double s = now();                                                                                \
        for (long i = 0; i < ITERS; i++)                                                                       \
            __asm__ volatile(body                                                                              \
                             : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), \
                               "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11)                                        \
                             : "x"(w), "x"(v), "r"(g_buf)                                                      \
                             : "memory");                                                                      \
        const double c = (now() - s) * clk / (double)ITERS;                                                    \
        g_sink = _mm256_extract_epi32(_mm256_add_epi32(a0, a11), 0);                                           \
        printf("| %-52s | %5.2f |\n", name, c);                                                                \
    } while (0)

#define MUB                                                                                                    \
    "vpmaddubsw %12,%13,%0\n\tvpmaddubsw %12,%13,%1\n\tvpmaddubsw %12,%13,%2\n\tvpmaddubsw %12,%13,%3\n\t"     \
    "vpmaddubsw %12,%13,%4\n\tvpmaddubsw %12,%13,%5\n\tvpmaddubsw %12,%13,%6\n\tvpmaddubsw %12,%13,%7\n\t"
#define ADD4 "vpaddw %12,%8,%8\n\tvpaddw %12,%9,%9\n\tvpaddw %12,%10,%10\n\tvpaddw %12,%11,%11\n\t"
#define BCD8                                                                                                   \
    "vpbroadcastd (%14),%8\n\tvpbroadcastd 4(%14),%9\n\tvpbroadcastd 8(%14),%10\n\tvpbroadcastd 12(%14),%11\n\t" \
    "vpbroadcastd 16(%14),%8\n\tvpbroadcastd 20(%14),%9\n\tvpbroadcastd 24(%14),%10\n\tvpbroadcastd 28(%14),%11\n\t"
#define LD8                                                                                                    \
    "vmovdqu (%14),%8\n\tvmovdqu 32(%14),%9\n\tvmovdqu 64(%14),%10\n\tvmovdqu 96(%14),%11\n\t"                 \
    "vmovdqu 128(%14),%8\n\tvmovdqu 160(%14),%9\n\tvmovdqu 192(%14),%10\n\tvmovdqu 224(%14),%11\n\t"
#define BCQ4 "vpbroadcastq (%14),%8\n\tvpbroadcastq 8(%14),%9\n\tvpbroadcastq 16(%14),%10\n\tvpbroadcastq 24(%14),%11\n\t"
#define MWD1 "vpmaddwd %12,%13,%8\n\t"
#define MWD2 "vpmaddwd %12,%13,%8\n\tvpmaddwd %12,%13,%9\n\t"
#define MWD4 "vpmaddwd %12,%13,%8\n\tvpmaddwd %12,%13,%9\n\tvpmaddwd %12,%13,%10\n\tvpmaddwd %12,%13,%11\n\t"

int main(void) {
    long x = 0;
    const double t0 = now();
    for (long i = 0; i < ITERS; i++)
        __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
                         "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0"
                         : "+r"(x));
    const double clk = 12.0 * (double)ITERS / (now() - t0);
    g_sink = (int)x;
    printf("clock %.2f GHz (a chain of dependent adds)\n\n", clk / 1e9);
    printf("| per iteration | cycles |\n|---|---:|\n");
    ROW("8 vpmaddubsw", MUB);
    ROW("8 vpmaddubsw + 8 vpaddw", MUB ADD4 ADD4);
    ROW("8 vpmaddubsw + 12 vpaddw", MUB ADD4 ADD4 ADD4);
    ROW("8 vpmaddubsw + 4 vpmaddwd", MUB MWD4);
    ROW("8 vpbroadcastd from memory", BCD8);
    ROW("8 vpmaddubsw + 8 vpbroadcastd", MUB BCD8);
    ROW("8 vpmaddubsw + 8 32-byte loads", MUB LD8);
    ROW("8 vpmaddubsw + 8 vpbroadcastd + 8 vpaddw (a GEMM row)", MUB BCD8 ADD4 ADD4);
    /* one octet's block and row as run (+ its vpmaddwd), against a layout
     * of 4 columns x 2 k-slices per vector: one qword broadcast per two
     * vpmaddubsw, two vpmaddwd */
    ROW("one octet: 8 mub, 8 bcast d, 8 add, 1 madd", MUB BCD8 ADD4 ADD4 MWD1);
    ROW("4 cols x 2 slices: 8 mub, 4 bcast q, 8 add, 2 madd", MUB BCQ4 ADD4 ADD4 MWD2);
    return 0;
}
