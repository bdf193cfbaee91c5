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
 *
 * The last-level cache (cpu_llc_bytes) comes from the same hwloc view: the
 * deepest data or unified cache over the CPUs this process may use, in the
 * package the threads stay in; `tern bench` uses it to tell a decode served
 * from the cache from one that streams its weights from DRAM.
 */
#define _GNU_SOURCE
#include "core/cpu.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
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

/* This system's topology, loaded; -1 when hwloc fails. */
static int topo_load(hwloc_topology_t *t) {
    if (hwloc_topology_init(t) != 0) return -1;
    hwloc_topology_set_flags(*t, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM);
    if (hwloc_topology_load(*t) != 0) {
        hwloc_topology_destroy(*t);
        return -1;
    }
    return 0;
}

/* The CPUs this thread may use: the cgroup's (allowed) and its binding
 * (taskset), when the two meet. A new bitmap (NULL: out of memory). */
static hwloc_bitmap_t allowed_cpus(hwloc_topology_t t) {
    hwloc_bitmap_t allowed = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t));
    hwloc_bitmap_t bound = hwloc_bitmap_alloc();
    if (allowed && bound && hwloc_get_cpubind(t, bound, HWLOC_CPUBIND_THREAD) == 0 &&
        hwloc_bitmap_intersects(allowed, bound))
        hwloc_bitmap_and(allowed, allowed, bound);
    hwloc_bitmap_free(bound);
    return allowed;
}

static int topo_from_hwloc(cpu_topo_t *tp) {
    hwloc_topology_t t;
    if (topo_load(&t)) return -1;
    const char *kind_how = "";
    hwloc_bitmap_t perf = perf_kind_set(t, &kind_how);
    hwloc_bitmap_t allowed = allowed_cpus(t);
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

/* ---- the last-level cache ------------------------------------------------ */

typedef struct {
    size_t bytes; /* 0 = unknown */
    char src[160];
} cpu_llc_t;

static cpu_llc_t g_llc;
static pthread_once_t g_llc_once = PTHREAD_ONCE_INIT;

static const char *cache_kind(hwloc_obj_cache_type_t t) {
    return t == HWLOC_OBJ_CACHE_UNIFIED ? "unified" : t == HWLOC_OBJ_CACHE_DATA ? "data" : "instruction";
}

/* hwloc: the caches of the deepest level (L3 above L2) among the data and
 * unified caches that hold at least one allowed CPU of the first package
 * with one; their sizes summed (each instance serves its own cores). */
static int llc_from_hwloc(cpu_llc_t *l) {
    hwloc_topology_t t;
    if (topo_load(&t)) return -1;
    int rc = -1;
    hwloc_bitmap_t allowed = allowed_cpus(t);
    if (!allowed || hwloc_bitmap_iszero(allowed)) goto out;
    /* The package of the first allowed CPU: the default thread count stays in one. */
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t, (unsigned)hwloc_bitmap_first(allowed));
    hwloc_obj_t pkg = pu ? hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, pu) : NULL;
    if (pkg && pkg->cpuset) hwloc_bitmap_and(allowed, allowed, pkg->cpuset);
    static const hwloc_obj_type_t types[] = {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE,
                                             HWLOC_OBJ_L4CACHE, HWLOC_OBJ_L5CACHE};
    unsigned best_depth = 0;
    size_t sum = 0;
    int count = 0;
    hwloc_obj_cache_type_t kind = HWLOC_OBJ_CACHE_UNIFIED;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int n = hwloc_get_nbobjs_by_type(t, types[ti]);
        for (int i = 0; i < n; i++) {
            hwloc_obj_t o = hwloc_get_obj_by_type(t, types[ti], (unsigned)i);
            if (!o || !o->cpuset || !hwloc_bitmap_intersects(o->cpuset, allowed)) continue;
            if (o->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION || o->attr->cache.size == 0) continue;
            if (o->attr->cache.depth > best_depth) {
                best_depth = o->attr->cache.depth;
                sum = 0;
                count = 0;
            }
            if (o->attr->cache.depth == best_depth) {
                sum += (size_t)o->attr->cache.size;
                kind = o->attr->cache.type;
                count++;
            }
        }
    }
    if (sum > 0) {
        l->bytes = sum;
        snprintf(l->src, sizeof l->src, "hwloc: L%u %s, %d instance%s over the allowed CPUs", best_depth,
                 cache_kind(kind), count, count == 1 ? "" : "s");
        rc = 0;
    }
out:
    hwloc_bitmap_free(allowed);
    hwloc_topology_destroy(t);
    return rc;
}

/* "32768K", "1M", "512": bytes; 0 when not a size. */
static size_t parse_cache_size(const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return 0;
    unsigned long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024;
    else if (*end == 'M' || *end == 'm') mul = 1024ull * 1024;
    else if (*end == 'G' || *end == 'g') mul = 1024ull * 1024 * 1024;
    if (v > (unsigned long long)SIZE_MAX / mul) return 0;
    return (size_t)(v * mul);
}

/* Linux sysfs: the deepest data or unified cache of the first allowed CPU. */
static int llc_from_sysfs(cpu_llc_t *l) {
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &set)) cpu++;
    if (cpu == CPU_SETSIZE) return -1;
    int best_level = 0;
    size_t best = 0;
    for (int idx = 0; idx < 16; idx++) {
        char path[160], type[32] = "", size[32] = "";
        int level;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/level", cpu, idx);
        if (read_int_file(path, &level) != 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/type", cpu, idx);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int ok = fscanf(f, "%31s", type) == 1;
        fclose(f);
        if (!ok || !strcmp(type, "Instruction")) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/size", cpu, idx);
        f = fopen(path, "r");
        if (!f) continue;
        ok = fscanf(f, "%31s", size) == 1;
        fclose(f);
        const size_t bytes = ok ? parse_cache_size(size) : 0;
        if (bytes > 0 && level > best_level) {
            best_level = level;
            best = bytes;
        }
    }
    if (best == 0) return -1;
    l->bytes = best;
    snprintf(l->src, sizeof l->src, "sysfs: L%d of cpu%d (hwloc gave none)", best_level, cpu);
    return 0;
#else
    (void)l;
    return -1;
#endif
}

static void llc_init(void) {
    if (llc_from_hwloc(&g_llc) == 0 || llc_from_sysfs(&g_llc) == 0) return;
    g_llc.bytes = 0;
    snprintf(g_llc.src, sizeof g_llc.src, "unknown: neither hwloc nor sysfs reports a data cache");
}

size_t cpu_llc_bytes(char *src, size_t src_len) {
    pthread_once(&g_llc_once, llc_init);
    if (src && src_len) snprintf(src, src_len, "%s", g_llc.src);
    return g_llc.bytes;
}
