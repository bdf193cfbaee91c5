/* cmd_threads.c - `tern info --threads`: the thread count tern uses by default
 * and how it was chosen (TERN_THREADS, else hwloc's physical performance
 * cores), with the CPUs the process may use, the last-level cache (as
 * `tern bench` sees it) and the pool's tuning. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "core/cpu.h"
#include "tern.h"

int cmd_threads(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--threads")) continue;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tern info --threads [--json]\n"
                   "Prints the thread count tern uses and why, the CPUs and the last-level\n"
                   "cache this process may use. Environment:\n"
                   "  TERN_THREADS=N   N threads in all (0 or 1: serial)\n"
                   "  TERN_AFFINITY=1  pin pool threads to distinct physical cores\n"
                   "  TERN_POOL_SPIN=N spin iterations before a worker parks\n"
                   "  TERN_POOL_GATE=B work (bytes) below which a job stays on the caller\n");
            return 0;
        } else {
            fprintf(stderr, "tern info --threads: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    char why[512], hw[256];
    int n = tern_threads_default(why, sizeof why);
    int cores = cpu_perf_cores(hw, sizeof hw);
    int online = cpu_online();
    char llc_src[160];
    const size_t llc = cpu_llc_bytes(llc_src, sizeof llc_src);
    const char *aff = getenv("TERN_AFFINITY");
    bool pin = aff && !strcmp(aff, "1");
    tern_error_t err = {0};
    /* A 1-thread pool spawns nothing; it only reports the effective tuning. */
    tern_pool_t *p = tern_pool_create(1, 0, &err);
    long long spin = p ? (long long)tern_pool_spin(p) : -1;
    long long gate = p ? (long long)tern_pool_gate(p) : -1;
    tern_pool_free(p);
    if (json) {
        printf("{\"threads\": %d, \"why\": \"", n);
        for (const char *c = why; *c; c++) {
            if (*c == '"' || *c == '\\') putchar('\\');
            putchar(*c >= 0x20 ? *c : ' ');
        }
        printf("\", \"perf_cores\": %d, \"cpus_allowed\": %d, \"affinity\": %s, \"spin\": %lld, "
               "\"gate_bytes\": %lld, \"llc_bytes\": %zu, \"llc_source\": \"",
               cores, online, pin ? "true" : "false", spin, gate, llc);
        for (const char *c = llc_src; *c; c++) {
            if (*c == '"' || *c == '\\') putchar('\\');
            putchar(*c >= 0x20 ? *c : ' ');
        }
        printf("\", \"amx\": \"%s\"}\n", tern_amx_status()); /* plain ASCII, no quotes */
        return 0;
    }
    printf("threads: %d\n", n);
    printf("why: %s\n", why);
    printf("physical performance cores: %d (%s)\n", cores, hw);
    printf("CPUs this process may use: %d\n", online);
    if (llc) printf("last-level cache: %.1f MiB (%s)\n", (double)llc / 1048576.0, llc_src);
    else printf("last-level cache: unknown (%s)\n", llc_src);
    printf("AMX: %s\n", tern_amx_status());
    if (n > online) printf("note: more threads than CPUs: workers park at once instead of spinning\n");
    printf("affinity: %s\n", pin ? "pinned to distinct physical cores (TERN_AFFINITY=1)"
                                 : "not pinned (TERN_AFFINITY=1 to pin)");
    printf("pool spin budget: %lld iterations; serial gate: %lld bytes of work\n", spin, gate);
    return 0;
}
