/*
 * cpu_topo.c - CPU topology for the thread count and for pinning: which
 * physical performance cores this process may run on.
 *
 * The pool's default thread count is one thread per physical performance
 * core: an SMT sibling shares the core's load/store units and caches, and
 * decode is bound by memory bandwidth and those units, so a second thread on
 * a core adds dispatch cost and contention, not throughput; an efficiency
 * core (hybrid Intel) runs the same rows several times slower, and since
 * every dispatch waits for its slowest participant it drags the big cores
 * down. The source is hwloc (cores, CPU kinds, the process's allowed CPUs);
 * when hwloc fails we read Linux sysfs (core_id/package id per CPU), and as a
 * last resort use the logical CPU count.
 *
 * Cap: only the cores of one package (socket) are used by default. On a
 * multi-socket machine a second socket's cores read weights from the other
 * socket's memory over the interconnect and each dispatch pays cross-socket
 * cache-line transfers (around 1 us per wake-up round trip), so decode
 * stops getting faster; TERN_THREADS overrides it. A hard cap of
 * CPU_TOPO_MAX_CORES also bounds the pool's fixed tables.
 *
 * The result is computed once (hwloc discovery costs milliseconds) and is
 * immutable afterwards, so all functions here are thread-safe.
 */
#define _GNU_SOURCE
#include "core/cpu.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hwloc.h>

#define CPU_TOPO_MAX_CORES 256

typedef struct {
    int n_cores;                   /* physical performance cores, >= 1 */
    int pu[CPU_TOPO_MAX_CORES];    /* one OS CPU index per core, -1 = unknown */
    char why[256];
} cpu_topo_t;

static cpu_topo_t g_topo;
static pthread_once_t g_topo_once = PTHREAD_ONCE_INIT;

int cpu_online(void) {
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 4096 ? 4096 : n) : 1;
}

/* The kinds that count as performance cores: with ranked efficiencies, the
 * highest; when unranked, every kind that is not an Intel Atom (E) core. */
static hwloc_bitmap_t perf_kind_set(hwloc_topology_t t, const char **how) {
    int nk = hwloc_cpukinds_get_nr(t, 0);
    if (nk <= 1) {
        *how = nk == 1 ? "one core kind" : "no core-kind information";
        return NULL; /* all cores */
    }
    hwloc_bitmap_t perf = hwloc_bitmap_alloc();
    if (!perf) return NULL;
    hwloc_bitmap_t ks = hwloc_bitmap_alloc();
    int best_eff = -1;
    for (int k = 0; k < nk && ks; k++) {
        int eff = -1;
        unsigned ninfo = 0;
        struct hwloc_info_s *infos = NULL;
        if (hwloc_cpukinds_get_info(t, (unsigned)k, ks, &eff, &ninfo, &infos, 0) != 0) continue;
        if (eff >= 0) {
            if (eff > best_eff) {
                best_eff = eff;
                hwloc_bitmap_copy(perf, ks);
            }
            continue;
        }
        bool atom = false;
        for (unsigned i = 0; i < ninfo; i++)
            if (!strcmp(infos[i].name, "CoreType") && strstr(infos[i].value, "Atom")) atom = true;
        if (!atom) hwloc_bitmap_or(perf, perf, ks);
    }
    hwloc_bitmap_free(ks);
    *how = best_eff >= 0 ? "highest-efficiency core kind" : "non-Atom core kinds";
    if (hwloc_bitmap_iszero(perf)) {
        hwloc_bitmap_free(perf);
        *how = "core kinds unranked";
        return NULL;
    }
    return perf;
}

static int topo_from_hwloc(cpu_topo_t *tp) {
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) return -1;
    hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM);
    if (hwloc_topology_load(t) != 0) {
        hwloc_topology_destroy(t);
        return -1;
    }
    const char *kind_how = "";
    hwloc_bitmap_t perf = perf_kind_set(t, &kind_how);
    /* Allowed = the cgroup's CPUs and this thread's binding (taskset). */
    hwloc_bitmap_t allowed = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t));
    hwloc_bitmap_t bound = hwloc_bitmap_alloc();
    if (allowed && bound && hwloc_get_cpubind(t, bound, HWLOC_CPUBIND_THREAD) == 0 &&
        hwloc_bitmap_intersects(allowed, bound))
        hwloc_bitmap_and(allowed, allowed, bound);
    hwloc_bitmap_free(bound);
    if (!allowed) {
        hwloc_bitmap_free(perf);
        hwloc_topology_destroy(t);
        return -1;
    }
    int ncores_all = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
    int n = 0, skipped_kind = 0, skipped_pkg = 0, skipped_cap = 0;
    int first_pkg = -1;
    hwloc_bitmap_t tmp = hwloc_bitmap_alloc();
    for (int i = 0; i < ncores_all && tmp; i++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, (unsigned)i);
        if (!core || !core->cpuset) continue;
        hwloc_bitmap_and(tmp, core->cpuset, allowed);
        if (hwloc_bitmap_iszero(tmp)) continue;
        if (perf && !hwloc_bitmap_isincluded(core->cpuset, perf)) {
            skipped_kind++;
            continue;
        }
        hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, core);
        int pkg_idx = pkg ? (int)pkg->logical_index : 0;
        if (first_pkg < 0) first_pkg = pkg_idx;
        if (pkg_idx != first_pkg) {
            skipped_pkg++;
            continue;
        }
        if (n >= CPU_TOPO_MAX_CORES) {
            skipped_cap++;
            continue;
        }
        tp->pu[n++] = hwloc_bitmap_first(tmp); /* one PU: never its SMT sibling */
    }
    hwloc_bitmap_free(tmp);
    hwloc_bitmap_free(perf);
    hwloc_bitmap_free(allowed);
    hwloc_topology_destroy(t);
    if (n == 0) return -1;
    tp->n_cores = n;
    int len = snprintf(tp->why, sizeof tp->why, "hwloc: %d physical performance core%s (%s", n,
                       n == 1 ? "" : "s", kind_how);
    if (skipped_kind && len > 0 && (size_t)len < sizeof tp->why)
        len += snprintf(tp->why + len, sizeof tp->why - (size_t)len, "; %d efficiency cores skipped",
                        skipped_kind);
    if (skipped_pkg && len > 0 && (size_t)len < sizeof tp->why)
        len += snprintf(tp->why + len, sizeof tp->why - (size_t)len,
                        "; capped to one socket, %d cores on other sockets unused", skipped_pkg);
    if (skipped_cap && len > 0 && (size_t)len < sizeof tp->why)
        len += snprintf(tp->why + len, sizeof tp->why - (size_t)len, "; capped at %d",
                        CPU_TOPO_MAX_CORES);
    if (len > 0 && (size_t)len < sizeof tp->why)
        snprintf(tp->why + len, sizeof tp->why - (size_t)len, ")");
    return 0;
}

static int read_int_file(const char *path, int *out) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, "%d", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

/* Fallback: count distinct (package, core) pairs among the allowed CPUs. No
 * core-kind information here, so a hybrid machine may count E cores. */
static int topo_from_sysfs(cpu_topo_t *tp) {
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    static int seen_pkg[CPU_TOPO_MAX_CORES], seen_core[CPU_TOPO_MAX_CORES];
    int n = 0, first_pkg = -1;
    for (int cpu = 0; cpu < CPU_SETSIZE && n < CPU_TOPO_MAX_CORES; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128];
        int core, pkg;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        if (read_int_file(path, &core) != 0) return -1;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        if (read_int_file(path, &pkg) != 0) return -1;
        if (first_pkg < 0) first_pkg = pkg;
        if (pkg != first_pkg) continue;
        bool dup = false;
        for (int i = 0; i < n; i++) dup |= seen_pkg[i] == pkg && seen_core[i] == core;
        if (dup) continue;
        seen_pkg[n] = pkg;
        seen_core[n] = core;
        tp->pu[n++] = cpu;
    }
    if (n == 0) return -1;
    tp->n_cores = n;
    snprintf(tp->why, sizeof tp->why,
             "sysfs: %d physical core%s in one socket (hwloc failed; core kinds unknown)", n,
             n == 1 ? "" : "s");
    return 0;
#else
    (void)tp;
    return -1;
#endif
}

static void topo_init(void) {
    cpu_topo_t *tp = &g_topo;
    for (int i = 0; i < CPU_TOPO_MAX_CORES; i++) tp->pu[i] = -1;
    if (topo_from_hwloc(tp) == 0 || topo_from_sysfs(tp) == 0) return;
    int n = cpu_online();
    if (n > CPU_TOPO_MAX_CORES) n = CPU_TOPO_MAX_CORES;
    tp->n_cores = n;
    for (int i = 0; i < CPU_TOPO_MAX_CORES; i++) tp->pu[i] = -1;
    snprintf(tp->why, sizeof tp->why,
             "%d logical CPUs (hwloc and sysfs failed; SMT siblings may be counted)", n);
}

int cpu_perf_cores(char *why, size_t why_len) {
    pthread_once(&g_topo_once, topo_init);
    if (why && why_len) snprintf(why, why_len, "%s", g_topo.why);
    return g_topo.n_cores;
}

int cpu_pin_thread(int idx) {
    pthread_once(&g_topo_once, topo_init);
    if (idx < 0 || idx >= g_topo.n_cores || g_topo.pu[idx] < 0) return -1;
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(g_topo.pu[idx], &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0 ? 0 : -1;
#else
    return -1;
#endif
}
