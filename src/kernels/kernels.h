/*
 * kernels.h - the compute kernels: matvec, two-input matvec, GEMM, attention
 * and the small ops, over every weight format of quant.h, with a scalar
 * reference per kernel and SIMD variants chosen at run time.
 *
 * Determinism contract: every output element is computed by exactly one
 * thread, always by the same per-format dot function with the same
 * accumulation order. The per-format dot function computes up to
 * KERN_MAX_COLS columns at once and each column's result is bit-identical to
 * computing that column alone. Matvec (1 column), the two-input matvec
 * (2 columns) and GEMM (tiles of columns) all go through it, so a position
 * gives the same bits in prefill and in decode, at any thread count. Results
 * may differ between ISAs (float summation order), never within one.
 */
#ifndef TERN_KERNELS_H
#define TERN_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/quant.h"
#include "tern_pool.h"

typedef enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_NEON = 3, ISA_COUNT = 4 } kern_isa_t;

#define KERN_MAX_COLS 4

/* out[c] = dot(weight row w, activation column c) for c < ncols, where
 * column c's quantized activations start at (const char *)xa + c * xa_stride.
 * k = row length in elements. */
typedef void (*kern_dot_fn)(int64_t k, const void *w, const void *xa, size_t xa_stride, int ncols,
                            float *out);
/* Quantize one activation row of k floats into the weight format's
 * activation type (Q8_0, Q8_1, Q8_K, or a plain copy for float formats). */
typedef void (*kern_act_fn)(const float *x, void *xa, int64_t k);

/* Optional fast GEMM of a (type, isa), used by kern_gemm / kern_gemm_multi
 * for n >= KERN_GEMM_MIN_COLS columns (fewer go through the dot fn in tiles
 * of KERN_MAX_COLS columns).
 *
 * Contract: y[c * ldy + r] = dot(row r, column c), BIT-IDENTICAL to the same
 * entry's dot fn (and so to kern_matvec) for every row and column, whatever
 * n, nrows or the tiling inside run. A format whose GEMM cannot promise that
 * must not register one.
 *
 * The columns arrive as the entry's act fn wrote them (column c at xa + c *
 * xa_stride). Where run wants another layout (e.g. 16 columns interleaved so
 * that one vector holds the same k-slice of every column), prep lays out one
 * group of up to KERN_GEMM_GROUP columns at a time into group_size(k) bytes;
 * the driver runs it once per call for every group (in parallel), before
 * any run. Lanes past the last column of a partial group must be written
 * (zeros are fine): run may compute on them, it never stores them. */
#define KERN_GEMM_GROUP 16
#define KERN_GEMM_MIN_COLS (KERN_MAX_COLS + 1)
/* Fewest columns that go to a format's run_small (below: matvec, matvec2). */
#define KERN_GEMM_SMALL_MIN_COLS 3
typedef struct {
    int64_t k, n;           /* row length; columns */
    const void *xa;         /* act rows: column c at (const char *)xa + c * xa_stride */
    size_t xa_stride;
    const void *xg;         /* prep's groups: group g at (const char *)xg + g * xg_group; NULL without prep */
    size_t xg_group;
} kern_gemm_args_t;
typedef struct {
    /* NULL: run reads the act rows. Else: bytes of one group (0 on overflow
     * or a bad k), and the function that fills one group from ncols (1..16)
     * act rows starting at column 16g. */
    size_t (*group_size)(int64_t k);
    void (*prep)(int64_t k, const void *xa, size_t xa_stride, int ncols, void *xg);
    /* Bytes of 64-aligned per-thread scratch run needs (NULL: none). The
     * driver keeps one grow-only scratch per thread (no allocation once it
     * is large enough). */
    size_t (*scratch_size)(int64_t k);
    /* Rows 0..nrows-1 of w (row r at (const char *)w + r * row_bytes), all
     * a->n columns: y[c * ldy + r]. */
    void (*run)(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y, int64_t ldy,
                void *scratch);
    /* Optional (0 / NULL: none): calls with KERN_GEMM_SMALL_MIN_COLS <= n
     * <= small_cols columns go to run_small instead of run (or the dot fn), with run's contract, but the driver runs no
     * prep for them (a->xg is NULL: run_small reads the act rows) and gives
     * no scratch. For the few columns of batched decode, where a kernel
     * that decodes the weights in registers and computes on them at once
     * beats a decode into scratch. */
    int small_cols;
    void (*run_small)(const kern_gemm_args_t *a, const void *w, size_t row_bytes, int64_t nrows, float *y,
                      int64_t ldy);
} kern_gemm_t;

/* Several weight rows in one call, read block by block in lockstep, for
 * memory-bound matvecs: one sequential stream per core leaves bandwidth
 * unused, several far-apart streams do not. out[r * ncols + c] = dot(row
 * w[r], column c), bit-identical to the dot of the same entry.
 * 1 <= nrows <= KERN_MAX_ROWS. */
#define KERN_MAX_ROWS 4
typedef void (*kern_rows_fn)(int64_t k, const void *const *w, int nrows, const void *xa, size_t xa_stride,
                             int ncols, float *out);

/* One entry of the kernel table: the kernels of one (weight format, ISA).
 * rows and gemm compute exactly what dot computes (bit for bit) and read
 * what act writes, so an entry is always used whole. */
typedef struct {
    kern_dot_fn dot;         /* NULL: not available for this (type, isa) */
    kern_act_fn act;
    kern_rows_fn rows;       /* NULL: the matvec calls dot row by row */
    const kern_gemm_t *gemm; /* NULL: GEMM goes through dot */
} kern_ops_t;

/* The kernel choice, for the whole process: the ISA and the CPU
 * sub-features the kernels of an ISA may use. The sub-features never change
 * results (each variant computes the bits of the plain kernel), only speed;
 * AMX joins them in the next issue. */
typedef struct {
    kern_isa_t isa; /* ISA of the drivers (kern_isa_active) */
    bool avxvnni;   /* AVX2 GEMMs with AVX-VNNI (TERN_NO_AVXVNNI turns it off) */
    bool vbmi;      /* AVX-512 32-block decode with AVX512-VBMI + GFNI (TERN_NO_VBMI) */
    bool dotprod;   /* NEON kernels with the ARMv8.2 dot product */
} kern_options_t;

/* The defaults: the best ISA and every sub-feature the CPU has, less what
 * the environment (cpu_env: TERN_ISA, TERN_NO_AVXVNNI, TERN_NO_VBMI) turns
 * off; a TERN_ISA that is unknown or that the CPU lacks is logged (warning)
 * and ignored. They are the active options until kern_configure. */
kern_options_t kern_options_default(void);
/* The active options (as kern_configure stored them). */
kern_options_t kern_options(void);
/* Set the options for the whole process (all threads see them at their
 * next driver call); tests and benchmarks choose kernels this way. An ISA
 * the CPU lacks is clamped to kern_isa_best() with a warning; sub-features
 * the CPU lacks are dropped. Thread-safe. */
void kern_configure(const kern_options_t *o);

/* The table as the register functions fill it: table[type][isa]. Each
 * family fills the entries it implements, according to o (whose
 * sub-features must be ones the CPU has: pass kern_options() or
 * kern_options_default(), possibly with features turned off); the scalar
 * entry of every weight type must be filled (it is the oracle). They fill
 * no ISA above kern_isa_best(): an ISA's entries are registered by code in
 * that ISA's files, which are compiled for it as a whole (set-up code
 * included: an AVX-512-built table initialiser once died with SIGILL on an
 * AVX2 CPU), so that code runs only where the CPU has the ISA; the table's
 * owner (dispatch.c) serves a missing ISA by the best one below it. Tests
 * call them to compare variants. */
typedef kern_ops_t kern_table_t[TYPE_COUNT][ISA_COUNT];
void kern_register_float(kern_table_t t, const kern_options_t *o);  /* F32, F16, BF16 */
void kern_register_legacy(kern_table_t t, const kern_options_t *o); /* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 */
void kern_register_kquant(kern_table_t t, const kern_options_t *o); /* Q4_K, Q5_K, Q6_K */

/* ISA_AVX2 means AVX2 + FMA + F16C. ISA_AVX512 means AVX-512 F/BW/VL/DQ +
 * VNNI on top of that (the *_avx512*.c files are compiled with those; a
 * register function using AVX512-BF16 instructions must itself check
 * cpu_features()->avx512bf16 before filling an entry with them). */
kern_isa_t kern_isa_active(void); /* kern_options().isa */
kern_isa_t kern_isa_best(void);   /* best supported by this CPU */
const char *kern_isa_name(kern_isa_t isa);
/* Whether the GEMMs use AMX tiles, and why not: a static sentence for
 * `tern info` and the bench headers ("no: this CPU has no AMX tiles", ...).
 * Asks the OS for the tile data state when the CPU has AMX. */
const char *kern_amx_status(void);
int kern_isa_from_name(const char *name); /* -1 if unknown */
/* The entry of a weight type for an ISA under the active options, falling
 * back to lower ISAs where an entry is missing (an entry counts only with
 * both dot and act set); an ISA the CPU lacks is clamped to
 * kern_isa_best(). The fallback is resolved when the table is built, so
 * this is one indexed load. NULL when the type has no kernel at all.
 * Thread-safe; the table is built on first use. */
const kern_ops_t *kern_ops(int type, kern_isa_t isa);

/* Bytes of the quantized activation row for a weight type and row length:
 * a row of its traits' act_type (so 4k for the float formats). An act fn may
 * write less than this (e.g. bf16 activations) but never more. 0 when the
 * type is unknown, k is not a multiple of the block size, or on overflow. */
size_t kern_act_size(int type, int64_t k);

/* A weight matrix: rows x cols (cols = k = row length), row-major blocks. */
typedef struct {
    int type;
    int64_t rows, cols;
    size_t row_bytes;
    const void *data;
} kern_mat_t;

/* Drivers. All of them: pool may be NULL (serial); return 0, or TERN_EINVAL
 * with a message for a bad argument (unknown or non-weight type, shapes that
 * do not match, row_bytes smaller than a row, NULL pointers), TERN_EUNSUP
 * for a weight type without a registered kernel, TERN_ENOMEM, or the pool's
 * error. Outputs must not overlap inputs. The activations are quantized once
 * per call on the caller's thread into a grow-only per-thread workspace (no
 * allocation once it is large enough; kern_thread_release frees it), then the
 * rows go out in ONE pool dispatch (GEMM with many columns: one more
 * dispatch to quantize the columns in parallel). Kernels follow
 * kern_options() at the time of the call. */

/* y[r] = W[r] . x for all rows. */
int kern_matvec(tern_pool_t *pool, const kern_mat_t *w, const float *x, float *y, tern_error_t *err);
/* Several matrices that share one input (Q/K/V, gate/up) in ONE dispatch;
 * they may differ in type and rows, not in cols. 1 <= n <= KERN_MAX_MULTI. */
#define KERN_MAX_MULTI 16
int kern_matvec_multi(tern_pool_t *pool, int n, const kern_mat_t *const *w, const float *x, float *const *y,
                      tern_error_t *err);
/* Two inputs, one pass over the weights: y0 = W x0, y1 = W x1; bit-identical
 * to two kern_matvec calls. */
int kern_matvec2(tern_pool_t *pool, const kern_mat_t *w, const float *x0, const float *x1, float *y0,
                 float *y1, tern_error_t *err);
/* GEMM: Y[j][r] = W[r] . X[j] for j < n columns; X is n x cols (row stride
 * ldx floats), Y is n x rows (row stride ldy). Column j bit-identical to
 * kern_matvec of X[j]. Several matrices sharing X in one dispatch: gemm_multi. */
int kern_gemm(tern_pool_t *pool, const kern_mat_t *w, int64_t n, const float *x, int64_t ldx, float *y,
              int64_t ldy, tern_error_t *err);
int kern_gemm_multi(tern_pool_t *pool, int nm, const kern_mat_t *const *w, int64_t n, const float *x,
                    int64_t ldx, float *const *y, const int64_t *ldy, tern_error_t *err);
/* Independent products in ONE dispatch (the experts of a Mixture-of-Experts
 * layer): y (n x w->rows, row stride ldy) = x (n x w->cols, row stride ldx)
 * W^T for each of the np (1..KERN_MAX_MULTI) products, each with its own
 * matrix, input and column count. Each column is bit-identical to
 * kern_matvec of it. */
typedef struct {
    const kern_mat_t *w;
    const float *x;
    int64_t n, ldx;
    float *y;
    int64_t ldy;
} kern_prod_t;
int kern_matmul_batch(tern_pool_t *pool, int np, const kern_prod_t *p, tern_error_t *err);

/* Attention over a KV cache. Cache layout: [pos][n_kv_heads][head_dim], in
 * F32 or F16 (kv_type TYPE_F32 / TYPE_F16). For query position i of a block
 * of nq queries starting at position pos0, keys 0..pos0+i are visited
 * (causal); the cache must hold positions 0..pos0+nq-1. q: nq x n_heads x
 * head_dim; out same shape. Work items are (query, GQA group) pairs over the
 * pool: a GQA group (n_heads / n_kv_heads query heads, which share one K/V
 * head) stays on one thread. scale is usually 1/sqrt(head_dim). Softmax is
 * computed in float with max subtraction over fixed tiles of keys (online
 * rescaling between tiles), so no scratch is needed and a query's result
 * does not depend on nq, pos0 splitting, the thread count or the paging of
 * the cache (only on the ISA). head_dim <= KERN_ATTN_MAX_HEAD_DIM. Returns 0
 * or TERN_EINVAL.
 *
 * Paging (kern_attention_batch): the cache is blocks of block_pos positions,
 * block b at k_cache + b * block_bytes (v_cache likewise), each block
 * head-major: [n_kv_heads][block_pos][head_dim], so one KV head's rows of
 * a block are contiguous; a query's sequence maps its position p to block
 * blocks[p / block_pos], row p % block_pos. kern_attention reads one
 * contiguous cache in the layout above (block_pos and block_bytes are
 * ignored there). */
#define KERN_ATTN_MAX_HEAD_DIM 1024
typedef struct {
    int n_heads, n_kv_heads, head_dim;
    int kv_type;
    const void *k_cache, *v_cache;
    float scale;
    int64_t block_pos;  /* kern_attention_batch: positions per block (>= 1) */
    size_t block_bytes; /* kern_attention_batch: bytes between blocks */
} kern_attn_t;
int kern_attention(tern_pool_t *pool, const kern_attn_t *a, int64_t pos0, int64_t nq, const float *q,
                   float *out, tern_error_t *err);
/* One query of a batch: it sees keys 0..pos of the sequence whose block
 * table is blocks (which must cover position pos). */
typedef struct {
    int64_t pos;
    const int32_t *blocks;
} kern_attn_query_t;
/* nq queries, each over its own sequence (qs[i]), q and out as above. */
int kern_attention_batch(tern_pool_t *pool, const kern_attn_t *a, int64_t nq, const kern_attn_query_t *qs,
                         const float *q, float *out, tern_error_t *err);

/* Frees the calling thread's kernel workspace (it is also freed when the
 * thread exits); the next driver call grows it again. */
void kern_thread_release(void);

/* Small ops (caller's thread; cheap vector work). Scalar and deterministic,
 * following llama.cpp's arithmetic:
 * rmsnorm: out = (x * (1 / sqrtf(mean(x^2) + eps))) * w, the sum of squares
 *   accumulated in double; w may be NULL (no weight).
 * layernorm: mean and variance accumulated in double; w, b may be NULL.
 * out may equal x for both. */
void kern_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
void kern_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n, float eps);
/* RoPE on one vector of n_heads heads of head_dim at position pos.
 * neox=0: pairs (2i, 2i+1); neox=1: pairs (i, i + n_dims/2), i < n_dims/2.
 * Dims n_dims..head_dim-1 are left as they are.
 * freq_factors (may be NULL): per pair divisor of the frequency (llama3 rope
 * scaling precomputes them). Angle of pair i, as llama.cpp computes it:
 * theta_i = freq_scale * (pos * s^i) / freq_factors[i] with
 * s = powf(freq_base, -2/n_dims) and s^i an iterated float product.
 * n_dims must be even and <= head_dim (else TERN_CHECK: a model bug). */
typedef struct {
    float freq_base;
    float freq_scale; /* linear scaling: position multiplier, 1 = none */
    const float *freq_factors;
    int neox;
    int n_dims; /* rotated dims per head (<= head_dim), usually head_dim */
} kern_rope_t;
void kern_rope(const kern_rope_t *r, float *x, int n_heads, int head_dim, int64_t pos);
void kern_silu_mul(float *gate, const float *up, int64_t n); /* gate = silu(gate) * up */
/* The reference (libm expf) and the x86 vector form (AVX2+FMA, used on
 * AVX2 and AVX-512: x86/ops_avx2.c; within about 2 ulps of the reference,
 * each element's bits depending only on its inputs). kern_silu_mul picks. */
void kern_silu_mul_ref(float *gate, const float *up, int64_t n);
void kern_silu_mul_avx2(float *gate, const float *up, int64_t n);
void kern_add(float *y, const float *x, int64_t n);         /* y += x */
void kern_softmax(float *x, int64_t n); /* max subtracted; sum in double */

#endif
