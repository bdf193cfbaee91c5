/*
 * dispatch.c - the kernel table: which dot / activation-quantizer function
 * serves each (weight type, ISA), and which ISA is active.
 *
 * The table is filled once (pthread_once) by the three per-family register
 * functions (quant_legacy / {ref,x86,arm}/legacy_*: F32 F16 BF16 and the
 * 32-blocks; quant_k / {ref,x86,arm}/kquant_*: the K formats). Lookups fall back
 * from the requested ISA to lower ones, so a family may provide only a
 * scalar entry and still serve every ISA. The active ISA is the best one the
 * CPU supports, or TERN_ISA, or whatever kern_isa_set chose last; it is an
 * atomic, so a change is seen by every thread at its next driver call.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "core/common.h"
#include "core/cpu.h"
#include "kernels/kernels.h"
#include "kernels/kquant.h"
#include "kernels/legacy.h"
#include "kernels/arm/neon.h"

static kern_table_t g_table;
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static void table_fill(void) {
    kern_register_float(g_table);
    kern_register_legacy(g_table);
    kern_register_kquant(g_table);
#if defined(__aarch64__)
    /* After the scalar column: the NEON entries reuse its act fns. */
    legacy_register_neon(g_table);
    kquant_register_neon(g_table);
#endif
    /* A family must not claim an ISA the CPU cannot run: drop such entries
     * here rather than trusting every register function to check. */
    kern_isa_t best = kern_isa_best();
    for (int t = 0; t < TYPE_COUNT; t++)
        for (int i = (int)best + 1; i < ISA_COUNT; i++) g_table[t][i] = (kern_ops_t){NULL, NULL, NULL};
}

static const char *const g_isa_names[ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

const char *kern_isa_name(kern_isa_t isa) {
    return (unsigned)isa < ISA_COUNT ? g_isa_names[isa] : "?";
}

int kern_isa_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < ISA_COUNT; i++)
        if (strcasecmp(name, g_isa_names[i]) == 0) return i;
    return -1;
}

kern_isa_t kern_isa_best(void) {
    const cpu_features_t *f = cpu_features();
    if (f->neon) return ISA_NEON;
    bool avx2 = f->avx2 && f->fma && f->f16c;
    /* DQ is not probed by cpu.h; every CPU with AVX512-VNNI has it. */
    if (avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni) return ISA_AVX512;
    if (avx2) return ISA_AVX2;
    return ISA_SCALAR;
}

/* Whether the CPU can run kernels of isa (the ISAs form a chain on x86;
 * NEON stands alone). */
static bool isa_supported(kern_isa_t isa) {
    kern_isa_t best = kern_isa_best();
    if (isa == ISA_SCALAR) return true;
    if (best == ISA_NEON) return isa == ISA_NEON;
    return isa != ISA_NEON && isa <= best;
}

static _Atomic int g_active = -1; /* -1: not decided yet */
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

static void active_from_env(void) {
    kern_isa_t isa = kern_isa_best();
    const char *env = getenv("TERN_ISA");
    if (env && *env) {
        int want = kern_isa_from_name(env);
        if (want < 0) {
            tern_log(TERN_LOG_WARN, "TERN_ISA=%s is not one of scalar|avx2|avx512|neon; using %s", env,
                    kern_isa_name(isa));
        } else if (!isa_supported((kern_isa_t)want)) {
            tern_log(TERN_LOG_WARN, "TERN_ISA=%s is not supported by this CPU; using %s", env,
                    kern_isa_name(isa));
        } else {
            isa = (kern_isa_t)want;
        }
    }
    int expected = -1;
    /* kern_isa_set may have won the race; it takes precedence. */
    atomic_compare_exchange_strong(&g_active, &expected, (int)isa);
}

kern_isa_t kern_isa_active(void) {
    int a = atomic_load_explicit(&g_active, memory_order_relaxed);
    if (a >= 0) return (kern_isa_t)a;
    pthread_once(&g_env_once, active_from_env);
    return (kern_isa_t)atomic_load(&g_active);
}

void kern_isa_set(kern_isa_t isa) {
    if (!isa_supported(isa)) {
        tern_log(TERN_LOG_WARN, "ISA %s is not supported by this CPU; using %s", kern_isa_name(isa),
                kern_isa_name(kern_isa_best()));
        isa = kern_isa_best();
    }
    atomic_store(&g_active, (int)isa);
}

const kern_ops_t *kern_ops(int type, kern_isa_t isa) {
    if (type < 0 || type >= TYPE_COUNT || (unsigned)isa >= ISA_COUNT) return NULL;
    pthread_once(&g_table_once, table_fill);
    if (!isa_supported(isa)) isa = kern_isa_best();
    /* NEON falls back straight to scalar; x86 ISAs step down the chain. */
    for (int i = (int)isa; i >= 0; i = (i == ISA_NEON) ? ISA_SCALAR : i - 1) {
        const kern_ops_t *o = &g_table[type][i];
        if (o->dot && o->act) return o;
        if (i == ISA_SCALAR) break;
    }
    return NULL;
}

size_t kern_act_size(int type, int64_t k) {
    const quant_traits_t *t = quant_traits(type);
    if (!t || !t->weight) return 0;
    /* The weight row must be whole blocks too, not only the activation. */
    if (quant_row_size(type, k) == 0 && k != 0) return 0;
    /* The 32-block formats lay their activation rows out for their kernels
     * (legacy.h); everything else uses plain rows of the act type. */
    if (t->act_type == TYPE_Q8_0 || t->act_type == TYPE_Q8_1) return legacy_act_size(type, k);
    return quant_row_size(t->act_type, k);
}

kern_rows_fn kern_rows(int type, kern_isa_t isa) {
    const kern_ops_t *o = kern_ops(type, isa);
    if (!o) return NULL;
    /* The ISA whose entry kern_ops chose, so rows and dot agree bit for bit. */
    for (int i = 0; i < ISA_COUNT; i++)
        if (&g_table[type][i] == o) {
            kern_rows_fn r = kquant_dot_rows(type, (kern_isa_t)i);
            return r ? r : legacy_dot_rows(type, (kern_isa_t)i);
        }
    return NULL;
}
