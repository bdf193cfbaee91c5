/*
 * dispatch.c - the kernel table: which kernels serve each (weight type,
 * ISA), and the active options (ISA and CPU sub-features).
 *
 * The register functions of the families (ref/legacy_ref.c: F32 F16 BF16 and
 * the 32-blocks; ref/kquant_ref.c: the K formats; each calls its SIMD files'
 * own, and arm/ the NEON ones) fill a raw table for one set of options.
 * This file is the one reader of it: it drops the ISAs the CPU cannot run
 * and resolves the fallback from an ISA to lower ones, once, into a
 * resolved table where every (type, ISA) slot already holds the entry that
 * serves it. A family may so provide only a scalar entry and still serve
 * every ISA, and kern_ops is one indexed load.
 *
 * A configuration is (ISA, sub-feature bits); the resolved table depends
 * only on the bits. Both are built on first use under a mutex, never
 * changed afterwards, and published through an atomic pointer, so
 * kern_configure is seen by every thread at its next driver call while
 * calls in flight keep the entries they read.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>

#include "core/common.h"
#include "core/cpu.h"
#include "kernels/arm/neon.h"
#include "kernels/kernels.h"
#include "kernels/legacy.h"

/* ---- ISAs --------------------------------------------------------------- */

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
    if (avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vnni) return ISA_AVX512;
    if (avx2) return ISA_AVX2;
    return ISA_SCALAR;
}

/* Whether the CPU can run kernels of isa (the ISAs form a chain on x86;
 * NEON stands alone). */
static bool isa_supported(kern_isa_t isa) {
    kern_isa_t best = kern_isa_best();
    if (isa == ISA_SCALAR) return true;
    if (best == ISA_NEON) return isa == ISA_NEON;
    return (unsigned)isa < ISA_COUNT && isa != ISA_NEON && isa <= best;
}

/* ---- options ------------------------------------------------------------ */

/* The sub-feature bits of a configuration. */
enum { SUB_AVXVNNI = 1, SUB_VBMI = 2, SUB_DOTPROD = 4, SUB_COMBOS = 8 };

static unsigned sub_bits(const kern_options_t *o) {
    return (o->avxvnni ? SUB_AVXVNNI : 0u) | (o->vbmi ? SUB_VBMI : 0u) | (o->dotprod ? SUB_DOTPROD : 0u);
}

/* o with the sub-features the CPU lacks dropped, the ISA clamped. */
static kern_options_t options_usable(const kern_options_t *o, bool warn) {
    const cpu_features_t *f = cpu_features();
    kern_options_t u = *o;
    u.avxvnni = o->avxvnni && f->avxvnni;
    u.vbmi = o->vbmi && f->avx512vbmi && f->gfni;
    u.dotprod = o->dotprod && f->dotprod;
    if (!isa_supported(o->isa)) {
        u.isa = kern_isa_best();
        if (warn)
            tern_log(TERN_LOG_WARN, "ISA %s is not supported by this CPU; using %s", kern_isa_name(o->isa),
                     kern_isa_name(u.isa));
    }
    return u;
}

/* TERN_ISA as an ISA this CPU runs, or -1; parsed (and warned about) once. */
static int g_env_isa = -1;
static pthread_once_t g_env_isa_once = PTHREAD_ONCE_INIT;

static void env_isa_parse(void) {
    const char *name = cpu_env()->isa;
    if (!name) return;
    const int want = kern_isa_from_name(name);
    if (want < 0)
        tern_log(TERN_LOG_WARN, "TERN_ISA=%s is not one of scalar|avx2|avx512|neon; using %s", name,
                 kern_isa_name(kern_isa_best()));
    else if (!isa_supported((kern_isa_t)want))
        tern_log(TERN_LOG_WARN, "TERN_ISA=%s is not supported by this CPU; using %s", name,
                 kern_isa_name(kern_isa_best()));
    else
        g_env_isa = want;
}

kern_options_t kern_options_default(void) {
    const cpu_features_t *f = cpu_features();
    const cpu_env_t *env = cpu_env();
    pthread_once(&g_env_isa_once, env_isa_parse);
    return (kern_options_t){.isa = g_env_isa >= 0 ? (kern_isa_t)g_env_isa : kern_isa_best(),
                            .avxvnni = f->avxvnni && !env->no_avxvnni,
                            .vbmi = f->avx512vbmi && f->gfni && !env->no_vbmi,
                            .dotprod = f->dotprod};
}

/* ---- tables and configurations ------------------------------------------ */

typedef struct {
    kern_ops_t ops[TYPE_COUNT][ISA_COUNT]; /* resolved: fallback done, unsupported ISAs clamped */
} resolved_t;

typedef struct {
    kern_options_t opt;
    const resolved_t *tab;
} config_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static resolved_t g_tabs[SUB_COMBOS];      /* written once under g_mu, then read only */
static bool g_tab_built[SUB_COMBOS];       /* under g_mu */
static config_t g_cfgs[ISA_COUNT][SUB_COMBOS];
static bool g_cfg_built[ISA_COUNT][SUB_COMBOS];
static _Atomic(const config_t *) g_cur;    /* NULL: not decided yet */
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

/* The one place the raw table is filled and read. o is usable. */
static void table_build(resolved_t *r, const kern_options_t *o) {
    static kern_table_t raw; /* under g_mu */
    memset(raw, 0, sizeof raw);
    kern_register_float(raw, o);
    kern_register_legacy(raw, o);
    kern_register_kquant(raw, o);
#if defined(__aarch64__)
    /* After the scalar column: the NEON entries reuse its act fns. */
    legacy_register_neon(raw, o);
    kquant_register_neon(raw, o);
#endif
    const kern_isa_t best = kern_isa_best();
    for (int t = 0; t < TYPE_COUNT; t++) {
        for (int isa = 0; isa < ISA_COUNT; isa++) {
            r->ops[t][isa] = (kern_ops_t){0};
            /* An ISA the CPU lacks is served as the best one; NEON falls
             * back straight to scalar, x86 ISAs step down the chain. A
             * family must not claim an ISA the CPU cannot run, so entries
             * above best are never read. */
            int i = isa_supported((kern_isa_t)isa) ? isa : (int)best;
            for (;;) {
                const kern_ops_t *e = &raw[t][i];
                if (e->dot && e->act) {
                    r->ops[t][isa] = *e;
                    break;
                }
                if (i == ISA_SCALAR) break;
                i = i == ISA_NEON ? ISA_SCALAR : i - 1;
            }
        }
    }
}

/* The configuration of usable options u, built on first use. */
static const config_t *config_get(const kern_options_t *u) {
    const unsigned sb = sub_bits(u);
    pthread_mutex_lock(&g_mu);
    if (!g_tab_built[sb]) {
        table_build(&g_tabs[sb], u);
        g_tab_built[sb] = true;
    }
    config_t *c = &g_cfgs[u->isa][sb];
    if (!g_cfg_built[u->isa][sb]) {
        c->opt = *u;
        c->tab = &g_tabs[sb];
        g_cfg_built[u->isa][sb] = true;
    }
    pthread_mutex_unlock(&g_mu);
    return c;
}

static void config_default(void) {
    const kern_options_t o = kern_options_default();
    const kern_options_t u = options_usable(&o, false);
    const config_t *expected = NULL;
    /* kern_configure may have won the race; it takes precedence. */
    atomic_compare_exchange_strong(&g_cur, &expected, config_get(&u));
}

static const config_t *config_cur(void) {
    const config_t *c = atomic_load_explicit(&g_cur, memory_order_acquire);
    if (c) return c;
    pthread_once(&g_default_once, config_default);
    return atomic_load_explicit(&g_cur, memory_order_acquire);
}

void kern_configure(const kern_options_t *o) {
    const kern_options_t u = options_usable(o, true);
    atomic_store_explicit(&g_cur, config_get(&u), memory_order_release);
}

kern_options_t kern_options(void) {
    return config_cur()->opt;
}

const char *kern_amx_status(void) {
    const cpu_features_t *f = cpu_features();
    if (!f->amx_tile || (!f->amx_int8 && !f->amx_bf16)) return "no: this CPU has no AMX tiles (or the OS does not save them)";
    if (!cpu_amx_permit()) return "no: the OS refused the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM)";
    return "no: the CPU has AMX and the OS grants the tiles, but this build has no AMX GEMM yet (the VNNI GEMMs run)";
}

kern_isa_t kern_isa_active(void) {
    return config_cur()->opt.isa;
}

const kern_ops_t *kern_ops(int type, kern_isa_t isa) {
    if (type < 0 || type >= TYPE_COUNT || (unsigned)isa >= ISA_COUNT) return NULL;
    const kern_ops_t *o = &config_cur()->tab->ops[type][isa];
    return o->dot ? o : NULL;
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
