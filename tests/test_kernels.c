/*
 * test_kernels.c - the kernel drivers (matvec, matvec_multi, matvec2, GEMM),
 * attention and the small ops, for every weight format and every ISA this
 * CPU has:
 *   - bit-identical results at 1..8 threads;
 *   - matvec2 == two matvecs and GEMM column j == matvec of column j, bit
 *     for bit; a query alone (decode) == the same query in a block (prefill);
 *   - each ISA against the scalar kernels, and everything against float64
 *     references computed here from the dequantized weights;
 *   - odd shapes (rows not a multiple of any chunk, one block per row, huge
 *     K) and argument validation.
 * A weight format without a registered kernel is a failure, not a skip.
 */
// ctest-label: concurrent
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/cpu.h"
#include "kernels/kernels.h"

#define MAX_THREADS 8

static tern_pool_t *g_pools[MAX_THREADS + 1]; /* index = thread count */
static uint64_t g_seed = 0x5eed1234abcdull;

static int setup(void **state) {
    (void)state;
    for (int n = 1; n <= MAX_THREADS; n++) {
        tern_error_t err = {0};
        g_pools[n] = tern_pool_create(n, 0, &err);
        if (!g_pools[n]) {
            fprintf(stderr, "tern_pool_create(%d): %s\n", n, err.msg);
            return -1;
        }
        /* Small test matrices must still be split across the threads. */
        tern_pool_set_gate(g_pools[n], 0);
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int n = 1; n <= MAX_THREADS; n++) tern_pool_free(g_pools[n]);
    kern_thread_release();
    return 0;
}

/* ---- helpers ------------------------------------------------------------ */

static int weight_types(int *out) {
    int n = 0;
    for (int t = 0; t < TYPE_COUNT; t++) {
        const quant_traits_t *tr = quant_traits(t);
        if (tr && tr->weight) out[n++] = t;
    }
    return n;
}

static int isas(kern_isa_t *out) {
    int n = 0;
    kern_isa_t best = kern_isa_best();
    out[n++] = ISA_SCALAR;
    if (best == ISA_NEON) {
        out[n++] = ISA_NEON;
    } else {
        for (int i = ISA_AVX2; i <= (int)best; i++) out[n++] = (kern_isa_t)i;
    }
    return n;
}

/* Tests choose kernels the way benchmarks do: through kern_configure,
 * keeping the active sub-feature options. */
static void set_isa(kern_isa_t isa) {
    kern_options_t o = kern_options();
    o.isa = isa;
    kern_configure(&o);
}

static void randn(float *x, int64_t n, float sigma) {
    for (int64_t i = 0; i < n; i++) x[i] = sigma * tu_randn(&g_seed);
}

typedef struct {
    kern_mat_t m;
    void *data;
    float *deq; /* rows x cols, the exact values the kernels see */
} tmat_t;

/* A rows x cols matrix of type with Gaussian weights, quantized by the
 * reference quantizer; deq holds its dequantized values. */
static void tmat_make(tmat_t *t, int type, int64_t rows, int64_t cols) {
    size_t rb = quant_row_size(type, cols);
    assert_true(rb > 0);
    t->data = tern_alloc(rb * (size_t)rows);
    t->deq = malloc(sizeof(float) * (size_t)(rows * cols));
    float *src = malloc(sizeof(float) * (size_t)cols);
    assert_non_null(t->data);
    assert_non_null(t->deq);
    assert_non_null(src);
    for (int64_t r = 0; r < rows; r++) {
        randn(src, cols, 1.0f);
        int rc = quant_quantize_row(type, src, (char *)t->data + (size_t)r * rb, cols);
        if (rc != 0) fail_msg("quant_quantize_row(%s, %lld) failed", quant_name(type), (long long)cols);
        rc = quant_dequantize_row(type, (char *)t->data + (size_t)r * rb, t->deq + r * cols, cols);
        if (rc != 0) fail_msg("quant_dequantize_row(%s, %lld) failed", quant_name(type), (long long)cols);
    }
    free(src);
    t->m = (kern_mat_t){type, rows, cols, rb, t->data};
}

static void tmat_free(tmat_t *t) {
    tern_free(t->data);
    free(t->deq);
}

static const kern_ops_t *require_ops(int type, kern_isa_t isa) {
    const kern_ops_t *o = kern_ops(type, isa);
    if (!o) fail_msg("no kernel registered for %s (isa %s)", quant_name(type), kern_isa_name(isa));
    return o;
}

static void check_ok(int rc, const tern_error_t *err, const char *what) {
    if (rc != 0) fail_msg("%s failed (%d): %s", what, rc, err->msg);
}

static void assert_bits_equal(const float *a, const float *b, int64_t n, const char *what, int type,
                              kern_isa_t isa, int threads) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s %s/%s: element %lld differs at %d threads: %.9g vs %.9g", what, quant_name(type),
                     kern_isa_name(isa), (long long)i, threads, (double)a[i], (double)b[i]);
}

/* The error a quantized activation row may add to W[r].x: each x[i] moves
 * by at most half a quantization step of its block (d = amax/127). */
static double act_err_bound(int type, const float *wrow, const float *x, int64_t k) {
    int at = quant_traits(type)->act_type;
    if (at == TYPE_F32) return 0.0;
    int blk = quant_traits(at)->blck;
    double e = 0.0;
    for (int64_t b = 0; b < k; b += blk) {
        double amax = 0.0;
        for (int64_t i = b; i < b + blk; i++) amax = fmax(amax, fabs(x[i]));
        /* d is stored as fp16 for Q8_0/Q8_1: the step may be 2^-11 larger. */
        double half_step = amax / 127.0 * 0.5 * (1.0 + 1.0 / 1024.0);
        for (int64_t i = b; i < b + blk; i++) e += fabs(wrow[i]) * half_step;
    }
    return e;
}

/* y vs float64 W.x: activation quantization error plus float rounding of
 * the dot. Rounding errors of a float dot product of k random-signed terms
 * grow like 2^-24 * sqrt(k) relative to sum |w x| (about 1.5e-5 at the
 * largest k = 65536 here, serial and pessimistic), so 2e-5 of sum |w x|. */
static void check_vs_f64(const tmat_t *t, const float *x, const float *y, const char *what, kern_isa_t isa) {
    const int64_t k = t->m.cols;
    for (int64_t r = 0; r < t->m.rows; r++) {
        const float *w = t->deq + r * k;
        double ref = 0.0, mag = 0.0;
        for (int64_t i = 0; i < k; i++) {
            ref += (double)w[i] * x[i];
            mag += fabs((double)w[i] * x[i]);
        }
        double tol = act_err_bound(t->m.type, w, x, k) * 1.05 + 2e-5 * mag + 1e-30;
        if (!(fabs(y[r] - ref) <= tol))
            fail_msg("%s %s/%s row %lld of %lldx%lld: %.9g vs float64 %.9g (tol %.3g)", what,
                     quant_name(t->m.type), kern_isa_name(isa), (long long)r, (long long)t->m.rows,
                     (long long)k, (double)y[r], ref, tol);
    }
}

/* ---- registration and ISA selection ------------------------------------ */

/* The thread sweeps below only mean something if the pools really run that
 * many threads. */
static void test_pools_have_threads(void **state) {
    (void)state;
    for (int n = 1; n <= MAX_THREADS; n++) assert_int_equal(tern_pool_threads(g_pools[n]), n);
}

static void test_every_format_registered(void **state) {
    (void)state;
    int types[TYPE_COUNT];
    int nt = weight_types(types);
    assert_int_equal(nt, 11);
    kern_isa_t is[ISA_COUNT];
    int ni = isas(is);
    for (int i = 0; i < nt; i++) {
        /* The scalar entry is the oracle: it must be filled in the table
         * itself, not reached by fallback. */
        const kern_ops_t *o = require_ops(types[i], ISA_SCALAR);
        assert_non_null(o->dot);
        assert_non_null(o->act);
        for (int j = 0; j < ni; j++) require_ops(types[i], is[j]);
        assert_true(kern_act_size(types[i], 256) > 0);
    }
    /* Activation-only and unknown types have no kernels. */
    assert_null(kern_ops(TYPE_Q8_1, ISA_SCALAR));
    assert_null(kern_ops(TYPE_Q8_K, ISA_SCALAR));
    assert_null(kern_ops(-1, ISA_SCALAR));
    assert_null(kern_ops(TYPE_COUNT, ISA_SCALAR));
    assert_int_equal(kern_act_size(TYPE_Q8_K, 256), 0);
    assert_int_equal(kern_act_size(TYPE_Q4_0, 33), 0);
    assert_int_equal(kern_act_size(TYPE_Q4_K, 256), sizeof(block_q8_K));
    assert_int_equal(kern_act_size(TYPE_Q4_0, 64), 256); /* one group of four blocks, legacy.h */
    assert_int_equal(kern_act_size(TYPE_F16, 10), 40);
}

static void test_isa_names_and_set(void **state) {
    (void)state;
    for (int i = 0; i < ISA_COUNT; i++) assert_int_equal(kern_isa_from_name(kern_isa_name((kern_isa_t)i)), i);
    assert_int_equal(kern_isa_from_name("AVX2"), ISA_AVX2);
    assert_int_equal(kern_isa_from_name("sse9"), -1);
    assert_int_equal(kern_isa_from_name(NULL), -1);
    kern_isa_t prev = kern_isa_active();
    set_isa(ISA_SCALAR);
    assert_int_equal(kern_isa_active(), ISA_SCALAR);
    /* An ISA this CPU lacks is clamped to the best one it has. */
    kern_isa_t foreign = kern_isa_best() == ISA_NEON ? ISA_AVX2 : ISA_NEON;
    set_isa(foreign);
    assert_int_equal(kern_isa_active(), kern_isa_best());
    set_isa(prev);
}

/* The options: the defaults hold only what the CPU has, less what the
 * environment turns off (test_kernels_plain runs with TERN_NO_AVXVNNI and
 * TERN_NO_VBMI set); kern_configure drops what the CPU lacks; the table
 * follows the options, and the sub-feature variants give the same bits. */
static void test_options(void **state) {
    (void)state;
    const cpu_features_t *f = cpu_features();
    const kern_options_t prev = kern_options(), def = kern_options_default();
    assert_true(!def.avxvnni || (f->avxvnni && getenv("TERN_NO_AVXVNNI") == NULL));
    assert_true(!def.vbmi || (f->avx512vbmi && f->gfni && getenv("TERN_NO_VBMI") == NULL));
    assert_true(!def.dotprod || f->dotprod);
    if (f->avxvnni) assert_int_equal(def.avxvnni, getenv("TERN_NO_AVXVNNI") == NULL);
    if (f->avx512vbmi && f->gfni) assert_int_equal(def.vbmi, getenv("TERN_NO_VBMI") == NULL);
    kern_options_t all = {.isa = kern_isa_best(), .avxvnni = true, .vbmi = true, .dotprod = true};
    kern_configure(&all);
    const kern_options_t got = kern_options();
    assert_int_equal(got.isa, kern_isa_best());
    assert_int_equal(got.avxvnni, f->avxvnni);
    assert_int_equal(got.vbmi, f->avx512vbmi && f->gfni);
    assert_int_equal(got.dotprod, f->dotprod);
    /* Every weight type has a whole entry at every ISA (fallback resolved). */
    int types[TYPE_COUNT];
    const int nt = weight_types(types);
    for (int i = 0; i < ISA_COUNT; i++)
        for (int t = 0; t < nt; t++) {
            const kern_ops_t *o = kern_ops(types[t], (kern_isa_t)i);
            assert_non_null(o);
            assert_non_null(o->dot);
            assert_non_null(o->act);
        }
    if (kern_isa_best() == ISA_AVX512 && got.vbmi) {
        /* VBMI on and off: other kernels, the same bits. */
        const kern_ops_t with = *kern_ops(TYPE_Q4_0, ISA_AVX512);
        kern_options_t plain = all;
        plain.vbmi = false;
        kern_configure(&plain);
        const kern_ops_t *without = kern_ops(TYPE_Q4_0, ISA_AVX512);
        assert_true(with.dot != without->dot && with.rows != without->rows && with.gemm != without->gemm);
        tmat_t a;
        const int64_t rows = 67, k = 32 * 37, n = 7;
        tmat_make(&a, TYPE_Q4_0, rows, k);
        float *x = malloc(sizeof(float) * (size_t)(k * n));
        float *y0 = malloc(sizeof(float) * (size_t)(rows * n)), *y1 = malloc(sizeof(float) * (size_t)(rows * n));
        float v0[67], v1[67];
        assert_non_null(x);
        assert_non_null(y0);
        assert_non_null(y1);
        randn(x, k * n, 1.0f);
        tern_error_t err = {0};
        check_ok(kern_gemm(g_pools[2], &a.m, n, x, k, y0, rows, &err), &err, "gemm");
        check_ok(kern_matvec(g_pools[2], &a.m, x, v0, &err), &err, "matvec");
        kern_configure(&all);
        check_ok(kern_gemm(g_pools[2], &a.m, n, x, k, y1, rows, &err), &err, "gemm");
        check_ok(kern_matvec(g_pools[2], &a.m, x, v1, &err), &err, "matvec");
        assert_bits_equal(y1, y0, rows * n, "gemm vbmi vs plain", TYPE_Q4_0, ISA_AVX512, 0);
        assert_bits_equal(v1, v0, rows, "matvec vbmi vs plain", TYPE_Q4_0, ISA_AVX512, 0);
        free(x), free(y0), free(y1);
        tmat_free(&a);
    } else {
        print_message("no AVX-512 VBMI + GFNI here: the VBMI option is not exercised\n");
    }
    kern_configure(&prev);
    const kern_options_t back = kern_options();
    assert_true(back.isa == prev.isa && back.avxvnni == prev.avxvnni && back.vbmi == prev.vbmi &&
                back.dotprod == prev.dotprod);
}

/* ---- matvec family across threads, formats and ISAs ------------------- */

/* Cols per format for the sweep: two K super-blocks, or nine 32-blocks. */
static int64_t sweep_cols(int type) { return quant_traits(type)->blck == QK_K ? 512 : 288; }

static void test_matvec_family_threads(void **state) {
    (void)state;
    int types[TYPE_COUNT];
    int nt = weight_types(types);
    kern_isa_t is[ISA_COUNT];
    int ni = isas(is);
    const int64_t rows = tu_quick() ? 37 : 83; /* not a multiple of any chunk */
    const int64_t ngemm = 19;                  /* tiles of 4 + a remainder of 3; >= parallel act threshold */
    kern_isa_t prev = kern_isa_active();
    for (int ti = 0; ti < nt; ti++) {
        const int type = types[ti];
        const int64_t k = sweep_cols(type);
        tmat_t a, b, c;
        tmat_make(&a, type, rows, k);
        tmat_make(&b, type, 5, k);
        /* A second type in the multi dispatch: a different act fn when the
         * family differs, exercising the per-act-group quantization. */
        int other = type == TYPE_Q8_0 ? TYPE_F16 : TYPE_Q8_0;
        tmat_make(&c, other, 21, k);
        float *x = malloc(sizeof(float) * (size_t)(k * ngemm));
        randn(x, k * ngemm, 1.0f);
        float *y_ref = malloc(sizeof(float) * rows), *y = malloc(sizeof(float) * rows);
        float *y2_ref = malloc(sizeof(float) * rows), *y2 = malloc(sizeof(float) * rows);
        float *g_ref = malloc(sizeof(float) * (size_t)(rows * ngemm)), *g = malloc(sizeof(float) * (size_t)(rows * ngemm));
        float *m_ref[3] = {malloc(sizeof(float) * rows), malloc(sizeof(float) * 5), malloc(sizeof(float) * 21)};
        float *m_out[3] = {malloc(sizeof(float) * rows), malloc(sizeof(float) * 5), malloc(sizeof(float) * 21)};
        const kern_mat_t *mats[3] = {&a.m, &b.m, &c.m};
        tern_error_t err = {0};
        for (int ii = 0; ii < ni; ii++) {
            const kern_isa_t isa = is[ii];
            require_ops(type, isa);
            set_isa(isa);
            /* References at one thread. */
            check_ok(kern_matvec(g_pools[1], &a.m, x, y_ref, &err), &err, "matvec");
            check_vs_f64(&a, x, y_ref, "matvec", isa);
            check_ok(kern_matvec2(g_pools[1], &a.m, x, x + k, y_ref, y2_ref, &err), &err, "matvec2");
            check_ok(kern_gemm(g_pools[1], &a.m, ngemm, x, k, g_ref, rows, &err), &err, "gemm");
            check_ok(kern_matvec_multi(g_pools[1], 3, mats, x + 2 * k, m_ref, &err), &err, "matvec_multi");
            /* Same-call invariants: matvec2 == two matvecs, gemm column j
             * == matvec of column j, multi == separate matvecs. */
            for (int64_t j = 0; j < ngemm; j++) {
                check_ok(kern_matvec(g_pools[1], &a.m, x + j * k, y, &err), &err, "matvec");
                assert_bits_equal(g_ref + j * rows, y, rows, "gemm column vs matvec", type, isa, 1);
                if (j < 2) assert_bits_equal(j ? y2_ref : y_ref, y, rows, "matvec2 vs matvec", type, isa, 1);
            }
            for (int mi = 0; mi < 3; mi++) {
                check_ok(kern_matvec(NULL, mats[mi], x + 2 * k, y, &err), &err, "matvec");
                assert_bits_equal(m_ref[mi], y, mats[mi]->rows, "matvec_multi vs matvec", type, isa, 1);
            }
            const uint64_t dispatches = tern_pool_dispatch_count();
            for (int n = 2; n <= MAX_THREADS; n++) {
                tern_pool_t *p = g_pools[n];
                check_ok(kern_matvec(p, &a.m, x, y, &err), &err, "matvec");
                assert_bits_equal(y_ref, y, rows, "matvec", type, isa, n);
                check_ok(kern_matvec2(p, &a.m, x, x + k, y, y2, &err), &err, "matvec2");
                assert_bits_equal(y_ref, y, rows, "matvec2 col 0", type, isa, n);
                assert_bits_equal(y2_ref, y2, rows, "matvec2 col 1", type, isa, n);
                check_ok(kern_gemm(p, &a.m, ngemm, x, k, g, rows, &err), &err, "gemm");
                assert_bits_equal(g_ref, g, rows * ngemm, "gemm", type, isa, n);
                check_ok(kern_matvec_multi(p, 3, mats, x + 2 * k, m_out, &err), &err, "matvec_multi");
                for (int mi = 0; mi < 3; mi++)
                    assert_bits_equal(m_ref[mi], m_out[mi], mats[mi]->rows, "matvec_multi", type, isa, n);
                /* gemm_multi: the same three matrices over the gemm columns. */
                float *gm[3] = {g, malloc(sizeof(float) * 5 * ngemm), malloc(sizeof(float) * 21 * ngemm)};
                int64_t ldy[3] = {rows, 5, 21};
                check_ok(kern_gemm_multi(p, 3, mats, ngemm, x, k, gm, ldy, &err), &err, "gemm_multi");
                assert_bits_equal(g_ref, g, rows * ngemm, "gemm_multi", type, isa, n);
                /* Column 2 of gemm_multi is matvec_multi's input. */
                assert_bits_equal(m_ref[1], gm[1] + 2 * 5, 5, "gemm_multi col 2", type, isa, n);
                assert_bits_equal(m_ref[2], gm[2] + 2 * 21, 21, "gemm_multi col 2", type, isa, n);
                free(gm[1]);
                free(gm[2]);
            }
            /* The pools really dispatched (at least one per call above). */
            assert_true(tern_pool_dispatch_count() - dispatches >= 5 * (MAX_THREADS - 1));
        }
        for (int mi = 0; mi < 3; mi++) {
            free(m_ref[mi]);
            free(m_out[mi]);
        }
        free(x), free(y_ref), free(y), free(y2_ref), free(y2), free(g_ref), free(g);
        tmat_free(&a), tmat_free(&b), tmat_free(&c);
    }
    set_isa(prev);
}

/* Every ISA against the scalar kernels of the same format. Integer dot
 * products are exact; what may differ is the float order of the block
 * scale sums, well under 1e-5 of sum |w x|. */
static void test_isa_vs_scalar(void **state) {
    (void)state;
    int types[TYPE_COUNT];
    int nt = weight_types(types);
    kern_isa_t is[ISA_COUNT];
    int ni = isas(is);
    kern_isa_t prev = kern_isa_active();
    const int64_t rows = 29, k = 2048;
    float *x = malloc(sizeof(float) * k), *ys = malloc(sizeof(float) * rows), *y = malloc(sizeof(float) * rows);
    randn(x, k, 1.0f);
    /* An outlier per 256 elements, as real activations have. */
    for (int64_t i = 0; i < k; i += 256) x[i] *= 20.0f;
    tern_error_t err = {0};
    for (int ti = 0; ti < nt; ti++) {
        tmat_t a;
        tmat_make(&a, types[ti], rows, k);
        set_isa(ISA_SCALAR);
        check_ok(kern_matvec(NULL, &a.m, x, ys, &err), &err, "matvec");
        for (int ii = 1; ii < ni; ii++) {
            set_isa(is[ii]);
            check_ok(kern_matvec(g_pools[2], &a.m, x, y, &err), &err, "matvec");
            check_vs_f64(&a, x, y, "matvec", is[ii]);
            for (int64_t r = 0; r < rows; r++) {
                double mag = 0.0;
                for (int64_t i = 0; i < k; i++) mag += fabs((double)a.deq[r * k + i] * x[i]);
                if (!(fabs((double)y[r] - ys[r]) <= 1e-5 * mag))
                    fail_msg("%s: %s row %lld = %.9g, scalar %.9g (tol %.3g)", quant_name(types[ti]),
                             kern_isa_name(is[ii]), (long long)r, (double)y[r], (double)ys[r], 1e-5 * mag);
            }
        }
        tmat_free(&a);
    }
    free(x), free(ys), free(y);
    set_isa(prev);
}

/* Odd shapes: one row, one block per row, rows not a multiple of 16, a
 * huge K; checked against float64 and across thread counts. */
static void test_odd_shapes(void **state) {
    (void)state;
    int types[TYPE_COUNT];
    int nt = weight_types(types);
    kern_isa_t is[ISA_COUNT];
    int ni = isas(is);
    kern_isa_t prev = kern_isa_active();
    tern_error_t err = {0};
    for (int ti = 0; ti < nt; ti++) {
        const int type = types[ti];
        const int blck = quant_traits(type)->blck;
        const int64_t big = tu_quick() ? 16384 : 65536;
        const int64_t shapes[][2] = {{1, blck}, {17, blck}, {1, 2 * (int64_t)QK_K}, {3, big}, {131, QK_K}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0];
            const int64_t k = shapes[s][1] < blck ? blck : shapes[s][1];
            tmat_t a;
            tmat_make(&a, type, rows, k);
            float *x = malloc(sizeof(float) * k), *y1 = malloc(sizeof(float) * rows),
                  *yn = malloc(sizeof(float) * rows);
            randn(x, k, 0.5f);
            for (int ii = 0; ii < ni; ii++) {
                set_isa(is[ii]);
                check_ok(kern_matvec(g_pools[1], &a.m, x, y1, &err), &err, "matvec");
                check_vs_f64(&a, x, y1, "odd shape matvec", is[ii]);
                for (int n = 2; n <= MAX_THREADS; n += 3) {
                    check_ok(kern_matvec(g_pools[n], &a.m, x, yn, &err), &err, "matvec");
                    assert_bits_equal(y1, yn, rows, "odd shape matvec", type, is[ii], n);
                }
            }
            free(x), free(y1), free(yn);
            tmat_free(&a);
        }
    }
    set_isa(prev);
}

/* GEMM against matvec over the shapes that stress a format's own GEMM
 * (kern_gemm_t): every column count from 1 to 17 (the dot tiles, the
 * small-N paths, groups of up to 8 columns on 8 lanes, 16, one past it),
 * 24 and 40 (a last group of 8 after full ones), rows that are not a
 * multiple of any panel, rows whose length is not a multiple of any k-step
 * (the 32-block formats: 5 blocks; the K formats: 5 super-blocks, past one
 * k-chunk), padded strides (ldx > k, ldy > rows), a zero column and a
 * column of large values. Every column must equal kern_matvec of it bit
 * for bit, at 1 and 3 threads. */
/* kern_matmul_batch (the experts of an MoE layer): up to KERN_MAX_MULTI
 * products of different formats, row lengths, inputs and column counts
 * (1, a few, past the few-column kernels) in one call, some sharing an
 * input; every column of every product equals kern_matvec of it bit for
 * bit, at 1 and 3 threads; a bad product is an error naming it. */
static void test_matmul_batch(void **state) {
    (void)state;
    int types[TYPE_COUNT];
    const int nt = weight_types(types);
    tern_error_t err = {0};
    enum { NP = KERN_MAX_MULTI };
    tmat_t a[NP];
    kern_prod_t pr[NP];
    float *xs[NP], *ys[NP];
    const int64_t ncols[] = {1, 1, 3, 8, 2, 17, 5, 1, 4, 9, 1, 6, 12, 1, 2, 24};
    uint64_t seed = 11;
    for (int i = 0; i < NP; i++) {
        const int type = types[(int)(tu_rand(&seed) % (uint64_t)nt)];
        const int64_t blck = quant_traits(type)->blck, k = blck * (1 + (int64_t)(tu_rand(&seed) % 3));
        const int64_t rows = 5 + (int64_t)(tu_rand(&seed) % 40), n = ncols[i], ldx = k + 1, ldy = rows + 2;
        tmat_make(&a[i], type, rows, k);
        /* products 1 and 7 read product 0's input when the row lengths match */
        xs[i] = malloc(sizeof(float) * (size_t)(ldx * n));
        ys[i] = malloc(sizeof(float) * (size_t)(ldy * n));
        assert_true(xs[i] && ys[i]);
        randn(xs[i], ldx * n, 1.0f);
        const bool share = (i == 1 || i == 7) && n == pr[0].n && k == a[0].m.cols;
        pr[i] = (kern_prod_t){&a[i].m, share ? pr[0].x : xs[i], n, share ? pr[0].ldx : ldx, ys[i], ldy};
    }
    for (int th = 1; th <= 3; th += 2) {
        for (int i = 0; i < NP; i++) memset(ys[i], 0, sizeof(float) * (size_t)(pr[i].ldy * pr[i].n));
        check_ok(kern_matmul_batch(g_pools[th], NP, pr, &err), &err, "matmul_batch");
        for (int i = 0; i < NP; i++) {
            float *y = malloc(sizeof(float) * (size_t)a[i].m.rows);
            assert_non_null(y);
            for (int64_t j = 0; j < pr[i].n; j++) {
                check_ok(kern_matvec(g_pools[1], &a[i].m, pr[i].x + j * pr[i].ldx, y, &err), &err, "matvec");
                char what[96];
                snprintf(what, sizeof what, "matmul_batch product %d (%lld cols) column %lld", i, (long long)pr[i].n,
                         (long long)j);
                assert_bits_equal(y, pr[i].y + j * pr[i].ldy, a[i].m.rows, what, a[i].m.type, kern_isa_active(), th);
            }
            free(y);
        }
    }
    kern_prod_t bad = pr[3];
    bad.ldx = bad.w->cols - 1;
    assert_int_equal(kern_matmul_batch(g_pools[1], 1, &bad, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "ldx"));
    assert_int_equal(kern_matmul_batch(g_pools[1], NP + 1, pr, &err), TERN_EINVAL);
    for (int i = 0; i < NP; i++) free(xs[i]), free(ys[i]), tmat_free(&a[i]);
}

static void test_gemm_vs_matvec(void **state) {
    (void)state;
    int types[TYPE_COUNT];
    int nt = weight_types(types);
    kern_isa_t is[ISA_COUNT];
    int ni = isas(is);
    kern_isa_t prev = kern_isa_active();
    tern_error_t err = {0};
    const int64_t ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 40};
    for (int ti = 0; ti < nt; ti++) {
        const int type = types[ti];
        const int64_t blck = quant_traits(type)->blck;
        const int64_t big = blck >= 256 ? 9 * blck : 1152; /* K: three k-chunks; 1152 = 36 blocks of 32 */
        const int64_t shapes[][2] = {{3, blck}, {21, 5 * blck}, {50, big}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], k = shapes[s][1];
            const int64_t ldx = k + 3, ldy = rows + 5, nmax = 40;
            tmat_t a;
            tmat_make(&a, type, rows, k);
            float *x = malloc(sizeof(float) * (size_t)(ldx * nmax));
            float *g = malloc(sizeof(float) * (size_t)(ldy * nmax));
            float *y = malloc(sizeof(float) * (size_t)rows);
            assert_non_null(x);
            assert_non_null(g);
            assert_non_null(y);
            randn(x, ldx * nmax, 1.0f);
            memset(x + 2 * ldx, 0, sizeof(float) * (size_t)k);          /* column 2: zeros */
            for (int64_t i = 0; i < k; i++) x[3 * ldx + i] *= 3000.0f; /* column 3: large */
            for (int ii = 0; ii < ni; ii++) {
                set_isa(is[ii]);
                for (size_t nn = 0; nn < sizeof ns / sizeof ns[0]; nn++) {
                    const int64_t n = ns[nn];
                    if (tu_quick() && (n == 6 || (n >= 10 && n <= 15))) continue;
                    for (int th = 1; th <= 3; th += 2) {
                        for (int64_t i = 0; i < ldy * n; i++) g[i] = -7.0f; /* padding must survive */
                        check_ok(kern_gemm(g_pools[th], &a.m, n, x, ldx, g, ldy, &err), &err, "gemm");
                        for (int64_t j = 0; j < n; j++) {
                            check_ok(kern_matvec(g_pools[1], &a.m, x + j * ldx, y, &err), &err, "matvec");
                            char what[96];
                            snprintf(what, sizeof what, "gemm %lldx%lld n=%lld column %lld vs matvec",
                                     (long long)rows, (long long)k, (long long)n, (long long)j);
                            assert_bits_equal(y, g + j * ldy, rows, what, type, is[ii], th);
                            for (int64_t r = rows; r < ldy; r++)
                                if (g[j * ldy + r] != -7.0f)
                                    fail_msg("%s: gemm wrote past its rows (%s/%s, n=%lld)", quant_name(type),
                                             kern_isa_name(is[ii]), what, (long long)n);
                        }
                    }
                }
            }
            free(x), free(g), free(y);
            tmat_free(&a);
        }
    }
    set_isa(prev);
}

/* The x86 kernels of every weight format follow one float order in AVX2
 * and AVX-512 (see the headers of the *_avx2.c / *_avx512.c files), so a
 * model gives the same bits on any x86-64 machine with AVX2: matvec and
 * GEMM agree across the two ISAs, bit for bit. Not run where AVX-512 is
 * not usable (said so). */
static void test_x86_isas_agree(void **state) {
    (void)state;
    if (kern_isa_best() != ISA_AVX512) {
        print_message("no AVX-512 here: AVX2 vs AVX-512 comparison not run\n");
        return;
    }
    int types[TYPE_COUNT];
    int nt = weight_types(types);
    kern_isa_t prev = kern_isa_active();
    tern_error_t err = {0};
    const int64_t rows = 37, n = 9;
    for (int ti = 0; ti < nt; ti++) {
        const int type = types[ti];
        const int64_t blck = quant_traits(type)->blck;
        const int64_t k = blck >= 256 ? 9 * blck : 37 * blck; /* a partial group of 4 blocks */
        tmat_t a;
        tmat_make(&a, type, rows, k);
        float *x = malloc(sizeof(float) * (size_t)(k * n));
        float *y[2], *g[2];
        assert_non_null(x);
        randn(x, k * n, 1.0f);
        for (int64_t i = 0; i < k * n; i += 97) x[i] *= 30.0f; /* outliers */
        for (int v = 0; v < 2; v++) {
            y[v] = malloc(sizeof(float) * (size_t)rows);
            g[v] = malloc(sizeof(float) * (size_t)(rows * n));
            assert_non_null(y[v]);
            assert_non_null(g[v]);
            set_isa(v ? ISA_AVX512 : ISA_AVX2);
            check_ok(kern_matvec(g_pools[2], &a.m, x, y[v], &err), &err, "matvec");
            check_ok(kern_gemm(g_pools[2], &a.m, n, x, k, g[v], rows, &err), &err, "gemm");
        }
        assert_bits_equal(y[1], y[0], rows, "matvec avx512 vs avx2", type, ISA_AVX2, 2);
        assert_bits_equal(g[1], g[0], rows * n, "gemm avx512 vs avx2", type, ISA_AVX2, 2);
        for (int v = 0; v < 2; v++) free(y[v]), free(g[v]);
        free(x);
        tmat_free(&a);
    }
    set_isa(prev);
}

/* Row strides larger than a row (a view into a wider buffer) work; rows of
 * zero produce nothing and touch nothing. */
static void test_row_stride_and_empty(void **state) {
    (void)state;
    tern_error_t err = {0};
    const int64_t rows = 9, k = 64;
    tmat_t a;
    tmat_make(&a, TYPE_Q8_0, rows, k);
    size_t rb = a.m.row_bytes, wide = rb + 40;
    char *buf = tern_alloc(wide * rows);
    for (int64_t r = 0; r < rows; r++) memcpy(buf + r * wide, (char *)a.data + r * rb, rb);
    kern_mat_t v = a.m;
    v.data = buf;
    v.row_bytes = wide;
    float x[64], y0[9], y1[9];
    randn(x, k, 1.0f);
    check_ok(kern_matvec(g_pools[3], &a.m, x, y0, &err), &err, "matvec");
    check_ok(kern_matvec(g_pools[3], &v, x, y1, &err), &err, "matvec strided");
    assert_bits_equal(y0, y1, rows, "strided rows", TYPE_Q8_0, kern_isa_active(), 3);
    kern_mat_t e = a.m;
    e.rows = 0;
    float sentinel = 12345.0f;
    assert_int_equal(kern_matvec(g_pools[2], &e, x, &sentinel, &err), 0);
    assert_true(sentinel == 12345.0f);
    tern_free(buf);
    tmat_free(&a);
}

static void expect_einval(int rc, const tern_error_t *err, const char *needle) {
    assert_true(rc == TERN_EINVAL || rc == TERN_EUNSUP);
    if (!strstr(err->msg, needle)) fail_msg("error message '%s' lacks '%s'", err->msg, needle);
}

static void test_bad_arguments(void **state) {
    (void)state;
    tern_error_t err = {0};
    tmat_t a;
    tmat_make(&a, TYPE_Q4_0, 4, 64);
    float x[128] = {0}, y[16];
    kern_mat_t m = a.m;
    m.type = TYPE_Q8_K;
    expect_einval(kern_matvec(NULL, &m, x, y, &err), &err, "not a weight type");
    m.type = 99;
    expect_einval(kern_matvec(NULL, &m, x, y, &err), &err, "not a weight type");
    m = a.m;
    m.cols = 48;
    expect_einval(kern_matvec(NULL, &m, x, y, &err), &err, "not a multiple");
    m = a.m;
    m.row_bytes = 20;
    expect_einval(kern_matvec(NULL, &m, x, y, &err), &err, "row_bytes");
    m = a.m;
    m.rows = -1;
    expect_einval(kern_matvec(NULL, &m, x, y, &err), &err, "shape");
    m = a.m;
    m.data = NULL;
    expect_einval(kern_matvec(NULL, &m, x, y, &err), &err, "NULL");
    m = a.m;
    m.rows = INT64_MAX / 2;
    expect_einval(kern_matvec(NULL, &m, x, y, &err), &err, "overflow");
    expect_einval(kern_matvec(NULL, NULL, x, y, &err), &err, "NULL");
    expect_einval(kern_matvec(NULL, &a.m, NULL, y, &err), &err, "NULL");
    expect_einval(kern_matvec(NULL, &a.m, x, NULL, &err), &err, "NULL");
    expect_einval(kern_matvec2(NULL, &a.m, x, NULL, y, y, &err), &err, "NULL");
    tmat_t b;
    tmat_make(&b, TYPE_Q8_0, 4, 32);
    const kern_mat_t *two[2] = {&a.m, &b.m};
    float *ys[2] = {y, y + 8};
    expect_einval(kern_matvec_multi(NULL, 2, two, x, ys, &err), &err, "cols");
    expect_einval(kern_matvec_multi(NULL, 0, two, x, ys, &err), &err, "matrices");
    expect_einval(kern_matvec_multi(NULL, KERN_MAX_MULTI + 1, two, x, ys, &err), &err, "matrices");
    expect_einval(kern_gemm(NULL, &a.m, 0, x, 64, y, 4, &err), &err, "columns");
    expect_einval(kern_gemm(NULL, &a.m, 2, x, 32, y, 4, &err), &err, "ldx");
    expect_einval(kern_gemm(NULL, &a.m, 2, x, 64, y, 3, &err), &err, "ldy");
    int64_t ldy[2] = {4, 4};
    expect_einval(kern_gemm_multi(NULL, 1, two, 2, x, 64, ys, NULL, &err), &err, "ldy");
    expect_einval(kern_gemm_multi(NULL, 1, two, 2, x, 64, ys, (int64_t[]){2}, &err), &err, "ldy");
    assert_int_equal(kern_gemm_multi(NULL, 1, two, 2, x, 64, ys, ldy, &err), 0);
    tmat_free(&a);
    tmat_free(&b);
}

/* ---- attention ------------------------------------------------------------ */

typedef struct {
    kern_attn_t a;
    void *k, *v;
    float *kf, *vf; /* the cache's exact values as float */
} tcache_t;

static void tcache_make(tcache_t *c, int kv_type, int n_heads, int n_kv, int hd, int64_t npos) {
    size_t elt = kv_type == TYPE_F32 ? 4 : 2;
    size_t n = (size_t)npos * n_kv * hd;
    c->k = malloc(n * elt);
    c->v = malloc(n * elt);
    c->kf = malloc(n * sizeof(float));
    c->vf = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float kv[2] = {tu_randn(&g_seed), tu_randn(&g_seed)};
        /* Keys with a spread of magnitudes make softmax peaky somewhere. */
        if (i % 97 == 0) kv[0] *= 4.0f;
        for (int w = 0; w < 2; w++) {
            float *f = w ? c->vf : c->kf;
            void *raw = w ? c->v : c->k;
            if (kv_type == TYPE_F32) {
                ((float *)raw)[i] = kv[w];
                f[i] = kv[w];
            } else {
                fp16_t h = f32_to_fp16(kv[w]);
                ((fp16_t *)raw)[i] = h;
                f[i] = fp16_to_f32(h);
            }
        }
    }
    c->a = (kern_attn_t){n_heads, n_kv, hd, kv_type, c->k, c->v, 1.0f / sqrtf((float)hd), 0, 0};
}

static void tcache_free(tcache_t *c) {
    free(c->k), free(c->v), free(c->kf), free(c->vf);
}

/* float64 softmax(q.k * scale) . v for query head h at position p. */
static void attn_ref(const tcache_t *c, const float *qh, int h, int64_t p, double *out) {
    const kern_attn_t *a = &c->a;
    const int g = h / (a->n_heads / a->n_kv_heads), hd = a->head_dim;
    double *s = malloc(sizeof(double) * (size_t)(p + 1));
    double mx = -INFINITY;
    for (int64_t t = 0; t <= p; t++) {
        const float *kr = c->kf + (t * a->n_kv_heads + g) * hd;
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)qh[i] * kr[i];
        s[t] = d * a->scale;
        mx = fmax(mx, s[t]);
    }
    double sum = 0;
    for (int64_t t = 0; t <= p; t++) sum += (s[t] = exp(s[t] - mx));
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int64_t t = 0; t <= p; t++) {
        const float *vr = c->vf + (t * a->n_kv_heads + g) * hd;
        for (int i = 0; i < hd; i++) out[i] += s[t] / sum * vr[i];
    }
    free(s);
}

static void test_attention(void **state) {
    (void)state;
    kern_isa_t is[ISA_COUNT];
    int ni = isas(is);
    kern_isa_t prev = kern_isa_active();
    /* (heads, kv heads, head_dim): GQA 3:1, MHA, MQA with an odd head_dim
     * (tails of the SIMD loops). */
    const int cfg[][3] = {{6, 2, 64}, {4, 4, 32}, {3, 1, 37}};
    const int64_t pos0 = 61, nq = tu_quick() ? 9 : 75; /* crosses tile boundaries at 64, 128 */
    tern_error_t err = {0};
    for (int kvt = 0; kvt < 2; kvt++) {
        const int kv_type = kvt ? TYPE_F16 : TYPE_F32;
        for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
            const int nh = cfg[ci][0], nkv = cfg[ci][1], hd = cfg[ci][2];
            tcache_t c;
            tcache_make(&c, kv_type, nh, nkv, hd, pos0 + nq);
            const int64_t qn = nq * nh * hd;
            float *q = malloc(sizeof(float) * qn), *o1 = malloc(sizeof(float) * qn), *on = malloc(sizeof(float) * qn);
            float *od = malloc(sizeof(float) * nh * hd);
            double *ref = malloc(sizeof(double) * hd);
            randn(q, qn, 1.0f);
            for (int ii = 0; ii < ni; ii++) {
                set_isa(is[ii]);
                check_ok(kern_attention(g_pools[1], &c.a, pos0, nq, q, o1, &err), &err, "attention");
                /* float64 reference: softmax weights sum to 1, so the error
                 * is relative to the largest |v|, which is about 4.5 here. */
                for (int64_t i = 0; i < nq; i++)
                    for (int h = 0; h < nh; h++) {
                        attn_ref(&c, q + (i * nh + h) * hd, h, pos0 + i, ref);
                        for (int d = 0; d < hd; d++) {
                            double got = o1[(i * nh + h) * hd + d];
                            if (!(fabs(got - ref[d]) <= 2e-5 * 5.0))
                                fail_msg("attention %s %s h%d/%d hd %d q %lld d %d: %.9g vs %.9g",
                                         quant_name(kv_type), kern_isa_name(is[ii]), nh, nkv, hd, (long long)i, d,
                                         got, ref[d]);
                        }
                    }
                /* Decode of each position alone == its row of the block. */
                for (int64_t i = 0; i < nq; i += (i < 4 ? 1 : 7)) {
                    check_ok(kern_attention(g_pools[2], &c.a, pos0 + i, 1, q + i * nh * hd, od, &err), &err,
                             "attention decode");
                    assert_bits_equal(o1 + i * nh * hd, od, nh * hd, "attention decode vs prefill", kv_type, is[ii], 2);
                }
                /* The whole block from position 0 (the prompt's first
                 * prefill) contains the same rows. */
                for (int n = 2; n <= MAX_THREADS; n++) {
                    check_ok(kern_attention(g_pools[n], &c.a, pos0, nq, q, on, &err), &err, "attention");
                    assert_bits_equal(o1, on, qn, "attention", kv_type, is[ii], n);
                }
            }
            free(q), free(o1), free(on), free(od), free(ref);
            tcache_free(&c);
        }
    }
    set_isa(prev);
}

/* Paged attention (kern_attention_batch): the contiguous cache scattered
 * into blocks of bp positions in a shuffled order, queries of several
 * "sequences" (prefixes of the same cache, each with its own table) in one
 * batch in mixed order: every row bit-identical to the contiguous kernel's,
 * whatever the block size (1, odd, smaller and larger than the 64-key
 * tile), the ISA or the thread count. */
static void test_attention_paged(void **state) {
    (void)state;
    kern_isa_t is[ISA_COUNT];
    int ni = isas(is);
    kern_isa_t prev = kern_isa_active();
    const int nh = 6, nkv = 2, hd = 40;
    const int64_t npos = tu_quick() ? 70 : 150;
    const int64_t bps[] = {1, 3, 16, 64, 100, 200};
    tern_error_t err = {0};
    for (int kvt = 0; kvt < 2; kvt++) {
        const int kv_type = kvt ? TYPE_F16 : TYPE_F32;
        tcache_t c;
        tcache_make(&c, kv_type, nh, nkv, hd, npos);
        const size_t pos_bytes = (size_t)nkv * hd * (kv_type == TYPE_F32 ? 4 : 2);
        const int64_t nq = 12, rowf = (int64_t)nh * hd;
        float *q = malloc(sizeof(float) * (size_t)(nq * rowf));
        float *ref = malloc(sizeof(float) * (size_t)(nq * rowf)), *got = malloc(sizeof(float) * (size_t)(nq * rowf));
        randn(q, nq * rowf, 1.0f);
        /* Query i sits at position pos[i] (some near the end, some early). */
        int64_t pos[12];
        for (int64_t i = 0; i < nq; i++) pos[i] = (i * 37 + 5) % npos;
        pos[0] = npos - 1;
        for (size_t bi = 0; bi < sizeof bps / sizeof bps[0]; bi++) {
            const int64_t bp = bps[bi], nb = (npos + bp - 1) / bp;
            const size_t bb = (size_t)bp * pos_bytes + 24; /* padding between blocks: block_bytes is a stride */
            unsigned char *kp = calloc((size_t)nb, bb), *vp = calloc((size_t)nb, bb);
            int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
            /* A shuffled table: logical block i lives in physical block table[i]. */
            for (int64_t i = 0; i < nb; i++) table[i] = (int32_t)i;
            for (int64_t i = nb - 1; i > 0; i--) {
                int64_t j = (int64_t)(tu_rand(&g_seed) % (uint64_t)(i + 1));
                int32_t t = table[i];
                table[i] = table[j];
                table[j] = t;
            }
            /* Head-major blocks: head g's row r of block b at b * bb + (g * bp + r) * head_bytes. */
            const size_t head_bytes = pos_bytes / nkv;
            for (int64_t p = 0; p < npos; p++)
                for (int g = 0; g < nkv; g++) {
                    const size_t off = (size_t)table[p / bp] * bb + (size_t)((int64_t)g * bp + p % bp) * head_bytes;
                    const size_t src = (size_t)p * pos_bytes + (size_t)g * head_bytes;
                    memcpy(kp + off, (const unsigned char *)c.k + src, head_bytes);
                    memcpy(vp + off, (const unsigned char *)c.v + src, head_bytes);
                }
            kern_attn_t pa = c.a;
            pa.k_cache = kp;
            pa.v_cache = vp;
            pa.block_pos = bp;
            pa.block_bytes = bb;
            kern_attn_query_t qs[12];
            for (int64_t i = 0; i < nq; i++) qs[i] = (kern_attn_query_t){pos[i], table};
            for (int ii = 0; ii < ni; ii++) {
                set_isa(is[ii]);
                for (int64_t i = 0; i < nq; i++)
                    check_ok(kern_attention(g_pools[1], &c.a, pos[i], 1, q + i * rowf, ref + i * rowf, &err), &err,
                             "attention");
                for (int n = 1; n <= MAX_THREADS; n++) {
                    check_ok(kern_attention_batch(g_pools[n], &pa, nq, qs, q, got, &err), &err, "attention batch");
                    assert_bits_equal(ref, got, nq * rowf, "paged attention vs contiguous", kv_type, is[ii], n);
                }
            }
            /* Bad block geometry and queries are refused. */
            pa.block_bytes = (size_t)bp * pos_bytes - 1;
            expect_einval(kern_attention_batch(NULL, &pa, nq, qs, q, got, &err), &err, "do not fit");
            pa.block_bytes = bb;
            pa.block_pos = 0;
            expect_einval(kern_attention_batch(NULL, &pa, nq, qs, q, got, &err), &err, "do not fit");
            pa.block_pos = bp;
            qs[3].blocks = NULL;
            expect_einval(kern_attention_batch(NULL, &pa, nq, qs, q, got, &err), &err, "no blocks");
            expect_einval(kern_attention_batch(NULL, &pa, nq, NULL, q, got, &err), &err, "NULL queries");
            free(kp), free(vp), free(table);
        }
        free(q), free(ref), free(got);
        tcache_free(&c);
    }
    set_isa(prev);
}

static void test_attention_bad_arguments(void **state) {
    (void)state;
    tern_error_t err = {0};
    float kv[64] = {0}, q[64] = {0}, o[64];
    kern_attn_t a = {4, 3, 16, TYPE_F32, kv, kv, 0.25f, 0, 0};
    expect_einval(kern_attention(NULL, &a, 0, 1, q, o, &err), &err, "KV heads");
    a.n_kv_heads = 2;
    a.kv_type = TYPE_Q8_0;
    expect_einval(kern_attention(NULL, &a, 0, 1, q, o, &err), &err, "only f32 and f16");
    a.kv_type = TYPE_F16;
    a.head_dim = KERN_ATTN_MAX_HEAD_DIM + 1;
    expect_einval(kern_attention(NULL, &a, 0, 1, q, o, &err), &err, "head_dim");
    a.head_dim = 16;
    expect_einval(kern_attention(NULL, &a, -1, 1, q, o, &err), &err, "pos0");
    a.k_cache = NULL;
    expect_einval(kern_attention(NULL, &a, 0, 1, q, o, &err), &err, "NULL");
    a.k_cache = kv;
    a.scale = NAN;
    expect_einval(kern_attention(NULL, &a, 0, 1, q, o, &err), &err, "scale");
    a.scale = 0.25f;
    expect_einval(kern_attention(NULL, &a, INT64_MAX, 1, q, o, &err), &err, "overflow");
    assert_int_equal(kern_attention(NULL, &a, 0, 0, q, o, &err), 0);
}

/* ---- small ops vs float64 ------------------------------------------------ */

static void test_rmsnorm_layernorm(void **state) {
    (void)state;
    const int64_t n = 1000;
    float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n),
          *y = malloc(sizeof(float) * n);
    randn(x, n, 3.0f);
    randn(w, n, 1.0f);
    randn(b, n, 1.0f);
    const float eps = 1e-5f;
    double ss = 0, mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i], mean += x[i];
    mean /= n;
    for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= n;
    const double rs = 1.0 / sqrt(ss / n + eps), ls = 1.0 / sqrt(var + eps);
    kern_rmsnorm(y, x, w, n, eps);
    /* A few float roundings (square, sqrt, divide, two products). */
    for (int64_t i = 0; i < n; i++) assert_true(fabs(y[i] - x[i] * rs * w[i]) <= 8 * 0x1p-24 * fabs(x[i] * rs * w[i]) + 1e-30);
    kern_rmsnorm(y, x, NULL, n, eps);
    for (int64_t i = 0; i < n; i++) assert_true(fabs(y[i] - x[i] * rs) <= 6 * 0x1p-24 * fabs(x[i] * rs));
    memcpy(y, x, sizeof(float) * n);
    kern_rmsnorm(y, y, NULL, n, eps); /* in place */
    for (int64_t i = 0; i < n; i++) assert_true(fabs(y[i] - x[i] * rs) <= 6 * 0x1p-24 * fabs(x[i] * rs));
    kern_layernorm(y, x, w, b, n, eps);
    /* x - mean rounds relative to |x| + |mean|. */
    for (int64_t i = 0; i < n; i++) {
        double ref = (x[i] - mean) * ls * w[i] + b[i];
        double tol = 8 * 0x1p-24 * ((fabs(x[i]) + fabs(mean)) * ls * fabs(w[i]) + fabs(b[i]));
        if (!(fabs(y[i] - ref) <= tol)) fail_msg("layernorm %lld: %.9g vs %.9g", (long long)i, (double)y[i], ref);
    }
    free(x), free(w), free(b), free(y);
}

/* Rotate by the float64 angle pos * freq_scale * base^(-2i/n_dims) / ff.
 * The kernel's angle is an iterated float product, so its error grows with
 * the pair index and the angle: powf's base step is off by up to 2^-23
 * relative and compounds i times, each of the i products adds 2^-24, the
 * scale and the divide two more: |theta| * (3i + 8) * 2^-24 covers it. */
static void test_rope(void **state) {
    (void)state;
    const int nh = 3, hd = 64;
    float ff[32];
    for (int i = 0; i < 32; i++) ff[i] = 1.0f + (float)i / 8.0f;
    const struct {
        int neox, n_dims;
        float base, scale;
        const float *ff;
        int64_t pos;
    } cases[] = {
        {0, 64, 10000.0f, 1.0f, NULL, 0},   {0, 64, 10000.0f, 1.0f, NULL, 7},
        {1, 64, 1000000.0f, 1.0f, NULL, 513}, {1, 32, 10000.0f, 0.25f, NULL, 4000},
        {0, 48, 500000.0f, 1.0f, ff, 123},   {1, 64, 500000.0f, 1.0f, ff, 2047},
    };
    float x[3 * 64], y[3 * 64];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        randn(x, nh * hd, 1.0f);
        memcpy(y, x, sizeof y);
        kern_rope_t r = {cases[ci].base, cases[ci].scale, cases[ci].ff, cases[ci].neox, cases[ci].n_dims};
        kern_rope(&r, y, nh, hd, cases[ci].pos);
        const int nd = cases[ci].n_dims, half = nd / 2;
        for (int h = 0; h < nh; h++) {
            const float *xv = x + h * hd;
            const float *yv = y + h * hd;
            for (int i = 0; i < half; i++) {
                double th = (double)cases[ci].pos * cases[ci].scale * pow(cases[ci].base, -2.0 * i / nd) /
                            (cases[ci].ff ? cases[ci].ff[i] : 1.0);
                int i0 = cases[ci].neox ? i : 2 * i, i1 = cases[ci].neox ? i + half : 2 * i + 1;
                double r0 = xv[i0] * cos(th) - xv[i1] * sin(th);
                double r1 = xv[i0] * sin(th) + xv[i1] * cos(th);
                double tol = (fabs(xv[i0]) + fabs(xv[i1])) * (fabs(th) * (3 * i + 8) * 0x1p-24 + 4 * 0x1p-24);
                if (!(fabs(yv[i0] - r0) <= tol && fabs(yv[i1] - r1) <= tol))
                    fail_msg("rope case %zu head %d pair %d: (%.9g, %.9g) vs (%.9g, %.9g) tol %.3g", ci, h, i,
                             (double)yv[i0], (double)yv[i1], r0, r1, tol);
            }
            /* Dims past n_dims are untouched. */
            for (int d = nd; d < hd; d++) assert_true(memcmp(&xv[d], &yv[d], sizeof(float)) == 0);
        }
    }
}

static void test_silu_add_softmax(void **state) {
    (void)state;
    const int64_t n = 513;
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    randn(g, n, 4.0f);
    randn(u, n, 1.0f);
    memcpy(y, g, sizeof(float) * n);
    kern_silu_mul(y, u, n);
    for (int64_t i = 0; i < n; i++) {
        double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        assert_true(fabs(y[i] - ref) <= 8 * 0x1p-24 * fabs(ref) + 1e-30);
    }
    /* The reference (libm expf) and, where the CPU has it, the x86 vector
     * form, to the same bound; the vector form's tail (one element at a
     * time) gives each element the bits its vector lane gives. */
    memcpy(y, g, sizeof(float) * n);
    kern_silu_mul_ref(y, u, n);
    for (int64_t i = 0; i < n; i++) {
        double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        assert_true(fabs(y[i] - ref) <= 8 * 0x1p-24 * fabs(ref) + 1e-30);
    }
#if defined(__x86_64__)
    if (kern_isa_best() >= ISA_AVX2) {
        float big[4] = {-200.0f, -87.5f, 90.0f, 300.0f}, bu[4] = {1, 1, 1, 1};
        memcpy(y, g, sizeof(float) * n);
        kern_silu_mul_avx2(y, u, n);
        for (int64_t i = 0; i < n; i++) {
            double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            if (!(fabs(y[i] - ref) <= 8 * 0x1p-24 * fabs(ref) + 1e-30))
                fail_msg("silu avx2 %lld: %.9g vs %.9g", (long long)i, (double)y[i], ref);
            float one = g[i];
            kern_silu_mul_avx2(&one, &u[i], 1);
            if (memcmp(&one, &y[i], sizeof one)) fail_msg("silu avx2 tail != lane at %lld", (long long)i);
        }
        /* beyond the clamp: silu(-200) ~ -0, silu(300) = 300 */
        kern_silu_mul_avx2(big, bu, 4);
        assert_true(fabsf(big[0]) < 1e-30f && big[1] > -1e-30f && big[1] <= 0.0f);
        assert_true(big[2] == 90.0f && big[3] == 300.0f);
    }
#endif
    memcpy(y, g, sizeof(float) * n);
    kern_add(y, u, n);
    for (int64_t i = 0; i < n; i++) assert_true(y[i] == g[i] + u[i]);
    /* Softmax of large logits: max subtraction keeps it finite. */
    for (int64_t i = 0; i < n; i++) y[i] = g[i] * 100.0f;
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, y[i]);
    for (int64_t i = 0; i < n; i++) sum += exp(y[i] - mx);
    float *l = malloc(sizeof(float) * n);
    memcpy(l, y, sizeof(float) * n);
    kern_softmax(y, n);
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = exp(l[i] - mx) / sum;
        /* expf of the float difference: its error scales with |l - mx|. */
        double tol = ref * (fabs(l[i] - mx) * 0x1p-23 + 8 * 0x1p-24) + 1e-38;
        if (!(fabs(y[i] - ref) <= tol)) fail_msg("softmax %lld: %.9g vs %.9g", (long long)i, (double)y[i], ref);
        total += y[i];
    }
    assert_true(fabs(total - 1.0) < 1e-5);
    free(g), free(u), free(y), free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pools_have_threads),
        cmocka_unit_test(test_every_format_registered),
        cmocka_unit_test(test_isa_names_and_set),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_matvec_family_threads),
        cmocka_unit_test(test_isa_vs_scalar),
        cmocka_unit_test(test_odd_shapes),
        cmocka_unit_test(test_gemm_vs_matvec),
        cmocka_unit_test(test_matmul_batch),
        cmocka_unit_test(test_x86_isas_agree),
        cmocka_unit_test(test_row_stride_and_empty),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_attention_bad_arguments),
        cmocka_unit_test(test_rmsnorm_layernorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu_add_softmax),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
