/*
 * legacy_avx512.c - AVX-512 (F/BW/VL + VNNI) dot products and activation
 * quantizers for F32, F16, BF16 and the 32-element block formats (see
 * legacy_ref.c for the scalar oracle and the arithmetic they follow).
 *
 * Block formats: a block's 32 weights are decoded once into a 256-bit vector
 * (signed bytes, or unsigned quants for Q4_1 / Q5_1); the block sum of each
 * column is formed with vpdpbusd (unsigned x signed bytes -> int32, exact;
 * see step_signed / step_offset for the signed formats), converted to float and
 * accumulated with one FMA by d_w * d_a (fp16 scales read through
 * legacy_fp16_lut: pure loads, where a scalar vcvtph2ps would compete for
 * the shuffle port). Even and odd blocks use separate accumulators. The
 * fifth bit of Q5 quants is applied with a byte mask straight from qh
 * (AVX-512BW k-registers). The weight stream is prefetched PF_DIST ahead.
 * Float formats: 16 elements per vector, four accumulators per column, the
 * ragged end done with masked loads (masked-off lanes read as zero).
 *
 * Only AVX-512 F/BW/VL/VNNI instructions are used (no DQ, no BF16), the set
 * kern_isa_best() checks before it picks ISA_AVX512.
 *
 * Multi-column calls decode the weights once for all columns; the per-column
 * work is written once and unrolled over a constant column count, so each
 * column's result is bit-identical to a one-column call.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "legacy.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Fixed order: upper 256 bits onto lower, then as hsum8. */
static inline float hsum16(__m512 v) {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8(_mm256_add_ps(lo, hi));
}

/* Software prefetch distance for the weight stream. Decode is memory-bound,
 * and the block kernels spend enough ALU work per cache line that the
 * out-of-order window alone keeps too few lines in flight: a prefetch a few
 * KB ahead (past the row's end into the next row, which the drivers visit
 * next) took Q8_0 / Q4_0 single-thread matvec over a 1 GB matrix from about
 * half of a plain read loop's bandwidth to about 85% on the development
 * machine. Prefetches never fault, so reading past the matrix is harmless. */
#define PF_DIST 4096

/* Prefetch the lines PF_DIST bytes past the n bytes at p (the weights one
 * loop iteration consumes; n <= 128, a constant), so that every line of the
 * stream is asked for once or twice. */
ALWAYS_INLINE void prefetch_ahead(const char *p, size_t n) {
    /* Address arithmetic in integers: the target may lie past the object. */
    const uintptr_t a = (uintptr_t)p + PF_DIST;
    _mm_prefetch((const char *)a, _MM_HINT_T0);
    if (n > 64) _mm_prefetch((const char *)(a + 64), _MM_HINT_T0);
}

/* ---- float formats ------------------------------------------------------ */

enum { FU = 4 }; /* accumulators per column */

ALWAYS_INLINE __m512 load16_f32(const void *p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
}
ALWAYS_INLINE __m512 load16_f16(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
ALWAYS_INLINE __m512 load16_bf16(const void *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* Full vectors use an all-ones mask (a plain load once compiled); the ragged
 * end of the row continues the accumulator rotation where it stopped. */
#define FLOAT_DOT(name, wsz, load)                                                                       \
    ALWAYS_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        __m512 acc[KERN_MAX_COLS][FU];                                                                   \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) for (int u = 0; u < FU; u++) acc[c][u] =     \
            _mm512_setzero_ps();                                                                         \
        int64_t i = 0;                                                                                   \
        for (; i + 16 * FU <= k; i += 16 * FU) {                                                         \
            for (int b = 0; b < 16 * FU * (wsz); b += 64) prefetch_ahead(w + i * (wsz) + b, 64);        \
            _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                       \
                const __m512 wv = load(w + (i + 16 * u) * (wsz), 0xffff);                                \
                _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                   \
                    const float *x = (const float *)(xa + (size_t)c * st) + i + 16 * u;                  \
                    acc[c][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x), acc[c][u]);                      \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        /* u is a constant after unrolling, so acc stays in registers */                                 \
        _Pragma("GCC unroll 4") for (int u = 0; u < FU; u++) {                                           \
            if (i >= k) break;                                                                           \
            const __mmask16 m = k - i >= 16 ? 0xffff : (__mmask16)((1u << (k - i)) - 1);                 \
            const __m512 wv = load(w + i * (wsz), m);                                                    \
            _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                       \
                const float *x = (const float *)(xa + (size_t)c * st) + i;                               \
                acc[c][u] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x), acc[c][u]);                 \
            }                                                                                            \
            i += 16;                                                                                     \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) out[c] = hsum16(                            \
            _mm512_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]), _mm512_add_ps(acc[c][2], acc[c][3])));    \
    }

FLOAT_DOT(f32, 4, load16_f32)
FLOAT_DOT(f16, 2, load16_f16)
FLOAT_DOT(bf16, 2, load16_bf16)

#define COLS_ENTRY(name, body)                                                                           \
    static void name(int64_t k, const void *w, const void *xa, size_t st, int nc, float *out) {          \
        const char *x = xa;                                                                              \
        while (nc > 0) {                                                                                 \
            const int n = nc < KERN_MAX_COLS ? nc : KERN_MAX_COLS;                                       \
            switch (n) {                                                                                 \
            case 1: body(k, w, x, st, 1, out); break;                                                    \
            case 2: body(k, w, x, st, 2, out); break;                                                    \
            case 3: body(k, w, x, st, 3, out); break;                                                    \
            default: body(k, w, x, st, 4, out); break;                                                   \
            }                                                                                            \
            x += (size_t)n * st;                                                                         \
            out += n;                                                                                    \
            nc -= n;                                                                                     \
        }                                                                                                \
    }

COLS_ENTRY(dot_f32_avx512, f32_cols)
COLS_ENTRY(dot_f16_avx512, f16_cols)
COLS_ENTRY(dot_bf16_avx512, bf16_cols)

static void act_copy_avx512(const float *x, void *xa, int64_t k) {
    memcpy(xa, x, (size_t)k * sizeof(float));
}

/* ---- 32-blocks ------------------------------------------------------------ */

#define LUT(h) (&legacy_fp16_lut[(h)])

ALWAYS_INLINE __m256i nibbles32(const uint8_t *qs) {
    /* A broadcast from memory is a pure load; the upper copy is shifted by 4
     * with a per-lane shift, so no shuffle-port insert is needed. */
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

ALWAYS_INLINE __mmask32 qh_mask(const uint8_t qh[4]) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return (__mmask32)h;
}

/* Block steps. Every way of forming a column's int32 block sum below is
 * exact, so the float results do not depend on which one runs: the choice
 * is made per column count (a constant after inlining) purely for speed, and
 * one-column and multi-column calls still agree bit for bit. After the sum:
 * acc += float(sum) * (d_w * d_a), one FMA per block and column. */

ALWAYS_INLINE __m256 col_scale(__m256 dwv, fp16_t da) {
    return _mm256_mul_ps(dwv, _mm256_broadcast_ss(LUT(da)));
}

/* Several columns, signed weights ws: the activations are offset to
 * a + 128 = a ^ 0x80 (vpdpbusd's unsigned operand) and the sum corrected:
 *   sum a*w = sum (a + 128)*w - 128 * sum w.
 * negc = -128 * sum w (per int32 lane) depends on the weights only, so it
 * is formed once and is vpdpbusd's starting value for every column: per
 * column one bitwise op (any vector port) and one vpdpbusd, where moving the
 * sign onto the activations would cost two ops on ports 0/1. */
ALWAYS_INLINE void cols_biased(__m256i ws, __m256i negc, fp16_t dw, const char *xa, size_t st, int64_t ib, int nc,
                               __m256 *acc) {
    const __m256 dwv = _mm256_broadcast_ss(LUT(dw));
    _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {
        const block_q8_0 *a = (const block_q8_0 *)(xa + (size_t)c * st) + ib;
        const __m256i au = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)a->qs), _mm256_set1_epi8((char)0x80));
        const __m256i s = _mm256_dpbusd_epi32(negc, au, ws);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), col_scale(dwv, a->d), acc[c]);
    }
}

/* Signed weights (Q8_0). One column: |w| times a with w's sign moved onto a
 * (three ops); several: cols_biased. */
ALWAYS_INLINE void step_signed(__m256i ws, fp16_t dw, const char *xa, size_t st, int64_t ib, int nc, __m256 *acc) {
    if (nc == 1) {
        const block_q8_0 *a = (const block_q8_0 *)xa + ib;
        const __m256i as = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a->qs), ws);
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(ws), as);
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), col_scale(_mm256_broadcast_ss(LUT(dw)), a->d), acc[0]);
        return;
    }
    const __m256i c128 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), ws);
    cols_biased(ws, _mm256_sub_epi32(_mm256_setzero_si256(), c128), dw, xa, st, ib, nc, acc);
}

/* Offset weights w = q - off with unsigned quants q (Q4_0: off 8, Q5_0: 16).
 * One column: q is already vpdpbusd's unsigned operand, so
 *   sum w*a = sum q*a - off * sum a,
 * the second sum being one more vpdpbusd, of the constant off against a.
 * Several columns: cols_biased, whose correction -128 * sum(q - off) comes
 * from q in one vpdpbusd: q times the signed constant -128, started from
 * 128 * off * 4 (four bytes per int32 lane). */
ALWAYS_INLINE void step_offset(__m256i q, int off, fp16_t dw, const char *xa, size_t st, int64_t ib, int nc,
                               __m256 *acc) {
    if (nc == 1) {
        const block_q8_0 *a = (const block_q8_0 *)xa + ib;
        const __m256i av = _mm256_loadu_si256((const __m256i *)a->qs);
        const __m256i offa = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)off), av);
        const __m256i s = _mm256_dpbusd_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), offa), q, av);
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), col_scale(_mm256_broadcast_ss(LUT(dw)), a->d), acc[0]);
        return;
    }
    const __m256i negc = _mm256_dpbusd_epi32(_mm256_set1_epi32(128 * off * 4), q, _mm256_set1_epi8((char)0x80));
    cols_biased(_mm256_sub_epi8(q, _mm256_set1_epi8((char)off)), negc, dw, xa, st, ib, nc, acc);
}

ALWAYS_INLINE void step_min(__m256i q, fp16_t dw, fp16_t mw, const char *xa, size_t st, int64_t ib, int nc,
                            __m256 *acc, __m128 *accm) {
    const __m256 dwv = _mm256_broadcast_ss(LUT(dw));
    const __m128 mwv = _mm_load_ss(LUT(mw));
    _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {
        const block_q8_1 *a = (const block_q8_1 *)(xa + (size_t)c * st) + ib;
        const __m256i av = _mm256_loadu_si256((const __m256i *)a->qs);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, av));
        acc[c] = _mm256_fmadd_ps(p, _mm256_mul_ps(dwv, _mm256_broadcast_ss(LUT(a->d))), acc[c]);
        accm[c] = _mm_fmadd_ss(mwv, _mm_load_ss(LUT(a->s)), accm[c]);
    }
}

ALWAYS_INLINE void blk_q4_0(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    (void)accm;
    const block_q4_0 *b = (const block_q4_0 *)w + ib;
    step_offset(nibbles32(b->qs), 8, b->d, xa, st, ib, nc, acc);
}

ALWAYS_INLINE void blk_q5_0(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    (void)accm;
    const block_q5_0 *b = (const block_q5_0 *)w + ib;
    /* The fifth bit goes in with a byte mask straight from qh. */
    const __m256i q = nibbles32(b->qs);
    step_offset(_mm256_mask_add_epi8(q, qh_mask(b->qh), q, _mm256_set1_epi8(16)), 16, b->d, xa, st, ib, nc, acc);
}

ALWAYS_INLINE void blk_q8_0(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    (void)accm;
    const block_q8_0 *b = (const block_q8_0 *)w + ib;
    step_signed(_mm256_loadu_si256((const __m256i *)b->qs), b->d, xa, st, ib, nc, acc);
}

ALWAYS_INLINE void blk_q4_1(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    const block_q4_1 *b = (const block_q4_1 *)w + ib;
    step_min(nibbles32(b->qs), b->d, b->m, xa, st, ib, nc, acc, accm);
}

ALWAYS_INLINE void blk_q5_1(const char *w, int64_t ib, const char *xa, size_t st, int nc, __m256 *acc, __m128 *accm) {
    const block_q5_1 *b = (const block_q5_1 *)w + ib;
    const __m256i q = nibbles32(b->qs);
    step_min(_mm256_mask_add_epi8(q, qh_mask(b->qh), q, _mm256_set1_epi8(16)), b->d, b->m, xa, st, ib,
             nc, acc, accm);
}

#define BLOCK_DOT(name, blk, bsz)                                                                        \
    ALWAYS_INLINE void name##_cols(int64_t k, const char *w, const char *xa, size_t st, int nc,          \
                                   float *out) {                                                         \
        TERN_CHECK(k % QK == 0);                                                                         \
        TERN_CHECK(legacy_fp16_lut[0x3c00] == 1.0f); /* legacy_lut_init ran */                          \
        const int64_t nb = k / QK;                                                                       \
        __m256 acc0[KERN_MAX_COLS], acc1[KERN_MAX_COLS];                                                 \
        __m128 accm0[KERN_MAX_COLS], accm1[KERN_MAX_COLS];                                               \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) {                                           \
            acc0[c] = acc1[c] = _mm256_setzero_ps();                                                     \
            accm0[c] = accm1[c] = _mm_setzero_ps();                                                      \
        }                                                                                                \
        int64_t i = 0;                                                                                   \
        for (; i + 2 <= nb; i += 2) {                                                                    \
            prefetch_ahead(w + (size_t)i * (bsz), 2 * (bsz));                                            \
            blk(w, i, xa, st, nc, acc0, accm0);                                                          \
            blk(w, i + 1, xa, st, nc, acc1, accm1);                                                      \
        }                                                                                                \
        if (i < nb) blk(w, i, xa, st, nc, acc0, accm0);                                                  \
        _Pragma("GCC unroll 4") for (int c = 0; c < nc; c++) out[c] =                                    \
            hsum8(_mm256_add_ps(acc0[c], acc1[c])) + _mm_cvtss_f32(_mm_add_ss(accm0[c], accm1[c]));       \
    }

BLOCK_DOT(q4_0, blk_q4_0, sizeof(block_q4_0))
BLOCK_DOT(q4_1, blk_q4_1, sizeof(block_q4_1))
BLOCK_DOT(q5_0, blk_q5_0, sizeof(block_q5_0))
BLOCK_DOT(q5_1, blk_q5_1, sizeof(block_q5_1))
BLOCK_DOT(q8_0, blk_q8_0, sizeof(block_q8_0))

COLS_ENTRY(dot_q4_0_avx512, q4_0_cols)
COLS_ENTRY(dot_q4_1_avx512, q4_1_cols)
COLS_ENTRY(dot_q5_0_avx512, q5_0_cols)
COLS_ENTRY(dot_q5_1_avx512, q5_1_cols)
COLS_ENTRY(dot_q8_0_avx512, q8_0_cols)

/* ---- activation quantizers ------------------------------------------------ */

/* roundf (half away from zero) of each lane, exactly; NaN -> 0. */
ALWAYS_INLINE __m512 round_away(__m512 p) {
    const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(p, t));
    const __m512i sgn = _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32((int)0x80000000u));
    const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0f)), sgn));
    const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 r = _mm512_mask_add_ps(t, up, t, step);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), r);
}

ALWAYS_INLINE float q8_block(const float *x, int8_t *qs, fp16_t *dout, int *sum) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    /* max_ps returns its second operand when either is NaN: NaNs are
     * skipped, as in the scalar loop. */
    const __m512 amax = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
    const float d = _mm512_reduce_max_ps(amax) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *dout = f32_to_fp16(d);
    const __m512 vid = _mm512_set1_ps(id), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i q0 = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(round_away(_mm512_mul_ps(v0, vid)), lo), hi));
    const __m512i q1 = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(round_away(_mm512_mul_ps(v1, vid)), lo), hi));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtepi32_epi8(q1));
    return d;
}

static void act_q8_0_avx512(const float *x, void *xa, int64_t k) {
    TERN_CHECK(k % QK == 0);
    block_q8_0 *y = xa;
    for (int64_t i = 0; i < k / QK; i++) {
        int sum;
        q8_block(x + i * QK, y[i].qs, &y[i].d, &sum);
    }
}

static void act_q8_1_avx512(const float *x, void *xa, int64_t k) {
    TERN_CHECK(k % QK == 0);
    block_q8_1 *y = xa;
    for (int64_t i = 0; i < k / QK; i++) {
        int sum;
        const float d = q8_block(x + i * QK, y[i].qs, &y[i].d, &sum);
        y[i].s = f32_to_fp16((float)sum * d);
    }
}

void legacy_register_float_avx512(kern_table_t t) {
    t[TYPE_F32][ISA_AVX512] = (kern_ops_t){dot_f32_avx512, act_copy_avx512};
    t[TYPE_F16][ISA_AVX512] = (kern_ops_t){dot_f16_avx512, act_copy_avx512};
    t[TYPE_BF16][ISA_AVX512] = (kern_ops_t){dot_bf16_avx512, act_copy_avx512};
}

void legacy_register_blocks_avx512(kern_table_t t) {
    t[TYPE_Q4_0][ISA_AVX512] = (kern_ops_t){dot_q4_0_avx512, act_q8_0_avx512};
    t[TYPE_Q4_1][ISA_AVX512] = (kern_ops_t){dot_q4_1_avx512, act_q8_1_avx512};
    t[TYPE_Q5_0][ISA_AVX512] = (kern_ops_t){dot_q5_0_avx512, act_q8_0_avx512};
    t[TYPE_Q5_1][ISA_AVX512] = (kern_ops_t){dot_q5_1_avx512, act_q8_1_avx512};
    t[TYPE_Q8_0][ISA_AVX512] = (kern_ops_t){dot_q8_0_avx512, act_q8_0_avx512};
}

#endif /* __x86_64__ */
