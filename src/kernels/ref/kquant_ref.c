/*
 * kquant_ref.c - scalar reference dot products of the K formats against Q8_K
 * activations (the oracle every SIMD variant is tested against, and the
 * fallback on CPUs without one), the scalar Q8_K activation quantizer, and
 * kern_register_kquant, which fills the kernel table for Q4_K, Q5_K, Q6_K.
 *
 * Per super-block b of weights (d, dmin, sc, m, q) and activations (da, qa,
 * bsums), the value added to the row's float accumulator is, in this order:
 *   Q4_K/Q5_K: da * (d * (float)sumi - dmin * (float)summ)
 *              sumi = sum_j sc[j] * sum_{i in j} q[i]*qa[i]   (exact int32)
 *              summ = sum_j m[j] * (bsums[2j] + bsums[2j+1])   (exact int32)
 *   Q6_K:      da * (d * (float)sumi), sumi = sum_j sc[j] * sum_{i in j} (q[i]-32)*qa[i]
 * The ints cannot overflow: |sumi| < 16 * 128 * 16 * 32 * 128 < 2^31.
 */
#include "core/common.h"
#include "kernels/kquant.h"

/* Q4_K / Q5_K weights of one super-block, unpacked to one byte per element. */
typedef struct {
    float d, dmin;
    uint8_t sc[8], m[8];
    uint8_t q[QK_K];
} kq_affine_t;

static void decode_q4_K(const block_q4_K *x, kq_affine_t *o) {
    uint64_t sc, m;
    kquant_scales_k4(x->scales, &sc, &m);
    memcpy(o->sc, &sc, 8);
    memcpy(o->m, &m, 8);
    o->d = fp16_to_f32(x->d);
    o->dmin = fp16_to_f32(x->dmin);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->q[64 * c + l] = x->qs[32 * c + l] & 15;
            o->q[64 * c + 32 + l] = x->qs[32 * c + l] >> 4;
        }
}

static void decode_q5_K(const block_q5_K *x, kq_affine_t *o) {
    uint64_t sc, m;
    kquant_scales_k4(x->scales, &sc, &m);
    memcpy(o->sc, &sc, 8);
    memcpy(o->m, &m, 8);
    o->d = fp16_to_f32(x->d);
    o->dmin = fp16_to_f32(x->dmin);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->q[64 * c + l] = (uint8_t)((x->qs[32 * c + l] & 15) | (((x->qh[l] >> (2 * c)) & 1) << 4));
            o->q[64 * c + 32 + l] = (uint8_t)((x->qs[32 * c + l] >> 4) | (((x->qh[l] >> (2 * c + 1)) & 1) << 4));
        }
}

static inline const block_q8_K *act_block(const void *xa, size_t stride, int c, int64_t b) {
    return (const block_q8_K *)((const char *)xa + (size_t)c * stride) + b;
}

static float affine_block_dot(const kq_affine_t *w, const block_q8_K *a) {
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += w->q[32 * j + i] * a->qs[32 * j + i];
        sumi += w->sc[j] * s;
        summ += w->m[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    return a->d * (w->d * (float)sumi - w->dmin * (float)summ);
}

static void dot_affine(int64_t k, const void *w, const void *xa, size_t xa_stride, int ncols, float *out,
                       int is_q5) {
    TERN_CHECK(k % QK_K == 0);
    const int64_t nb = k / QK_K;
    kq_affine_t dec;
    for (int c0 = 0; c0 < ncols; c0 += KERN_MAX_COLS) {
        const int nc = ncols - c0 < KERN_MAX_COLS ? ncols - c0 : KERN_MAX_COLS;
        float acc[KERN_MAX_COLS] = {0};
        for (int64_t b = 0; b < nb; b++) {
            if (is_q5)
                decode_q5_K((const block_q5_K *)w + b, &dec);
            else
                decode_q4_K((const block_q4_K *)w + b, &dec);
            for (int c = 0; c < nc; c++) acc[c] += affine_block_dot(&dec, act_block(xa, xa_stride, c0 + c, b));
        }
        for (int c = 0; c < nc; c++) out[c0 + c] = acc[c];
    }
}

static void dot_q4_K_ref(int64_t k, const void *w, const void *xa, size_t xa_stride, int ncols, float *out) {
    dot_affine(k, w, xa, xa_stride, ncols, out, 0);
}

static void dot_q5_K_ref(int64_t k, const void *w, const void *xa, size_t xa_stride, int ncols, float *out) {
    dot_affine(k, w, xa, xa_stride, ncols, out, 1);
}

static void dot_q6_K_ref(int64_t k, const void *w, const void *xa, size_t xa_stride, int ncols, float *out) {
    TERN_CHECK(k % QK_K == 0);
    const int64_t nb = k / QK_K;
    int8_t q[QK_K];
    for (int c0 = 0; c0 < ncols; c0 += KERN_MAX_COLS) {
        const int nc = ncols - c0 < KERN_MAX_COLS ? ncols - c0 : KERN_MAX_COLS;
        float acc[KERN_MAX_COLS] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const block_q6_K *x = (const block_q6_K *)w + b;
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
                int8_t *o = q + 128 * h;
                for (int l = 0; l < 32; l++) {
                    o[l] = (int8_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                    o[l + 32] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
            const float d = fp16_to_f32(x->d);
            for (int c = 0; c < nc; c++) {
                const block_q8_K *a = act_block(xa, xa_stride, c0 + c, b);
                int32_t sumi = 0;
                for (int j = 0; j < 16; j++) {
                    int32_t s = 0;
                    for (int i = 0; i < 16; i++) s += q[16 * j + i] * a->qs[16 * j + i];
                    sumi += x->scales[j] * s;
                }
                acc[c] += a->d * (d * (float)sumi);
            }
        }
        for (int c = 0; c < nc; c++) out[c0 + c] = acc[c];
    }
}

static void act_q8_K_ref(const float *x, void *xa, int64_t k) {
    TERN_CHECK(quant_quantize_row(TYPE_Q8_K, x, xa, k) == 0);
}

/* Scalar: row by row (the rows API exists for memory parallelism, which
 * the scalar code is too slow to need). */
static void dot_rows_ref(kern_dot_fn dot, int64_t k, const void *const *w, int nrows, const void *xa, size_t st,
                         int ncols, float *out) {
    TERN_CHECK(nrows >= 1 && nrows <= KQUANT_MAX_ROWS);
    if (ncols <= 0) return;
    for (int r = 0; r < nrows; r++) dot(k, w[r], xa, st, ncols, out + (size_t)r * ncols);
}
static void dot_rows_q4_K_ref(int64_t k, const void *const *w, int nrows, const void *xa, size_t st, int ncols,
                              float *out) {
    dot_rows_ref(dot_q4_K_ref, k, w, nrows, xa, st, ncols, out);
}
static void dot_rows_q5_K_ref(int64_t k, const void *const *w, int nrows, const void *xa, size_t st, int ncols,
                              float *out) {
    dot_rows_ref(dot_q5_K_ref, k, w, nrows, xa, st, ncols, out);
}
static void dot_rows_q6_K_ref(int64_t k, const void *const *w, int nrows, const void *xa, size_t st, int ncols,
                              float *out) {
    dot_rows_ref(dot_q6_K_ref, k, w, nrows, xa, st, ncols, out);
}

void kern_register_kquant(kern_table_t t, const kern_options_t *o) {
    t[TYPE_Q4_K][ISA_SCALAR] = (kern_ops_t){.dot = dot_q4_K_ref, .act = act_q8_K_ref, .rows = dot_rows_q4_K_ref};
    t[TYPE_Q5_K][ISA_SCALAR] = (kern_ops_t){.dot = dot_q5_K_ref, .act = act_q8_K_ref, .rows = dot_rows_q5_K_ref};
    t[TYPE_Q6_K][ISA_SCALAR] = (kern_ops_t){.dot = dot_q6_K_ref, .act = act_q8_K_ref, .rows = dot_rows_q6_K_ref};
#if defined(__x86_64__)
    if (kern_isa_best() >= ISA_AVX2) kquant_register_avx2(t, o); /* see kernels.h */
    if (kern_isa_best() >= ISA_AVX512) kquant_register_avx512(t, o);
#else
    (void)o;
#endif
}
