/*
 * quant_legacy.c - reference quantize / dequantize for the float formats
 * (F32, F16, BF16) and the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, plus the Q8_1 activation block).
 *
 * The quantizers follow ggml's *_ref rules (see
 * ../shared/reference/quant-layouts.md) so the blocks they write are what
 * llama.cpp would write and read back the same way. They differ from ggml in
 * one respect only: every float -> integer conversion is clamped first, so
 * NaN / inf / huge inputs give garbage blocks rather than undefined
 * behaviour (ggml casts out-of-range floats to int8). For finite input the
 * clamp never changes a value, so the bytes are identical.
 *
 * The SIMD activation quantizers in kernels/x86/legacy_*.c must produce exactly
 * the Q8_0 / Q8_1 bytes written here (tests compare them), so the rounding here is roundf (half away from zero), as in
 * ggml's reference, not the ties-to-even of a vector round instruction.
 */
#include <float.h>
#include <math.h>

#include "format/quant.h"

/* Clamp, then truncate toward zero: (int)v for v in range, lo for NaN. */
static inline int trunc_clamp(float v, float lo, float hi) {
    if (!(v >= lo)) return (int)lo; /* also catches NaN */
    if (v > hi) return (int)hi;
    return (int)v;
}

/* roundf, clamped to [-127, 127]; NaN -> 0. */
static inline int8_t round_q8(float v) {
    if (!(v == v)) return 0;
    float r = roundf(v);
    if (r > 127.0f) r = 127.0f;
    if (r < -127.0f) r = -127.0f;
    return (int8_t)r;
}

/* Element with the largest magnitude, sign kept (first one on ties, as ggml). */
static inline float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        const float v = x[j];
        if (amax < fabsf(v)) {
            amax = fabsf(v);
            max = v;
        }
    }
    return max;
}

static void quantize_q4_0(const float *x, block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_absmax(x, QK) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = trunc_clamp(x[j] * id + 8.5f, 0.0f, 15.0f);
            const int q1 = trunc_clamp(x[j + QK / 2] * id + 8.5f, 0.0f, 15.0f);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void minmax(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

static void quantize_q4_1(const float *x, block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float mn, mx;
        minmax(x, QK, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        y[i].m = f32_to_fp16(mn);
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 0.0f, 15.0f);
            const int q1 = trunc_clamp((x[j + QK / 2] - mn) * id + 0.5f, 0.0f, 15.0f);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quantize_q5_0(const float *x, block_q5_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_absmax(x, QK) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = trunc_clamp(x[j] * id + 16.5f, 0.0f, 31.0f);
            const int q1 = trunc_clamp(x[j + QK / 2] * id + 16.5f, 0.0f, 31.0f);
            y[i].qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK / 2);
        }
        for (int b = 0; b < 4; b++) y[i].qh[b] = (uint8_t)(qh >> (8 * b)); /* little-endian */
    }
}

static void quantize_q5_1(const float *x, block_q5_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float mn, mx;
        minmax(x, QK, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        y[i].m = f32_to_fp16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            /* ggml does not clamp here; for finite input the value is <= 31. */
            const int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 0.0f, 31.0f);
            const int q1 = trunc_clamp((x[j + QK / 2] - mn) * id + 0.5f, 0.0f, 31.0f);
            y[i].qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK / 2);
        }
        for (int b = 0; b < 4; b++) y[i].qh[b] = (uint8_t)(qh >> (8 * b));
    }
}

static float q8_0_block(const float *x, block_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = f32_to_fp16(d);
    for (int j = 0; j < QK; j++) y->qs[j] = round_q8(x[j] * id);
    return d;
}

static void q8_1_block(const float *x, block_q8_1 *y) {
    /* Same quants and d as Q8_0; the block is laid out with s after d. */
    block_q8_0 t;
    const float d = q8_0_block(x, &t);
    int sum = 0;
    for (int j = 0; j < QK; j++) sum += t.qs[j];
    y->d = t.d;
    /* s from the float d, before d is rounded to fp16 (as ggml). */
    y->s = f32_to_fp16((float)sum * d);
    memcpy(y->qs, t.qs, QK);
}

int quant_legacy_quantize_row(int type, const float *x, void *vy, int64_t n) {
    if (n < 0) return -1;
    const int64_t nb = n / QK;
    switch (type) {
    case TYPE_F32:
        memcpy(vy, x, (size_t)n * sizeof(float));
        return 0;
    case TYPE_F16: {
        fp16_t *y = vy;
        for (int64_t i = 0; i < n; i++) y[i] = f32_to_fp16(x[i]);
        return 0;
    }
    case TYPE_BF16: {
        uint16_t *y = vy;
        for (int64_t i = 0; i < n; i++) y[i] = f32_to_bf16(x[i]);
        return 0;
    }
    default:
        break;
    }
    if (n % QK) return -1;
    switch (type) {
    case TYPE_Q4_0: quantize_q4_0(x, vy, nb); return 0;
    case TYPE_Q4_1: quantize_q4_1(x, vy, nb); return 0;
    case TYPE_Q5_0: quantize_q5_0(x, vy, nb); return 0;
    case TYPE_Q5_1: quantize_q5_1(x, vy, nb); return 0;
    case TYPE_Q8_0:
        for (int64_t i = 0; i < nb; i++) q8_0_block(x + i * QK, (block_q8_0 *)vy + i);
        return 0;
    case TYPE_Q8_1:
        for (int64_t i = 0; i < nb; i++) q8_1_block(x + i * QK, (block_q8_1 *)vy + i);
        return 0;
    default:
        return -1;
    }
}

/* Bit b of the little-endian uint32 in qh is the fifth bit of element b. */
static inline uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

int quant_legacy_dequantize_row(int type, const void *vx, float *y, int64_t n) {
    if (n < 0) return -1;
    switch (type) {
    case TYPE_F32:
        memcpy(y, vx, (size_t)n * sizeof(float));
        return 0;
    case TYPE_F16: {
        const fp16_t *x = vx;
        for (int64_t i = 0; i < n; i++) y[i] = fp16_to_f32(x[i]);
        return 0;
    }
    case TYPE_BF16: {
        const uint16_t *x = vx;
        for (int64_t i = 0; i < n; i++) y[i] = bf16_to_f32(x[i]);
        return 0;
    }
    default:
        break;
    }
    if (n % QK) return -1;
    const int64_t nb = n / QK;
    switch (type) {
    case TYPE_Q4_0: {
        const block_q4_0 *x = vx;
        for (int64_t i = 0; i < nb; i++, y += QK) {
            const float d = fp16_to_f32(x[i].d);
            for (int j = 0; j < QK / 2; j++) {
                y[j] = (float)((x[i].qs[j] & 15) - 8) * d;
                y[j + QK / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
            }
        }
        return 0;
    }
    case TYPE_Q4_1: {
        const block_q4_1 *x = vx;
        for (int64_t i = 0; i < nb; i++, y += QK) {
            const float d = fp16_to_f32(x[i].d), m = fp16_to_f32(x[i].m);
            for (int j = 0; j < QK / 2; j++) {
                y[j] = (float)(x[i].qs[j] & 15) * d + m;
                y[j + QK / 2] = (float)(x[i].qs[j] >> 4) * d + m;
            }
        }
        return 0;
    }
    case TYPE_Q5_0: {
        const block_q5_0 *x = vx;
        for (int64_t i = 0; i < nb; i++, y += QK) {
            const float d = fp16_to_f32(x[i].d);
            const uint32_t qh = load_qh(x[i].qh);
            for (int j = 0; j < QK / 2; j++) {
                const int q0 = (x[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
                const int q1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK / 2)) & 1) << 4;
                y[j] = (float)(q0 - 16) * d;
                y[j + QK / 2] = (float)(q1 - 16) * d;
            }
        }
        return 0;
    }
    case TYPE_Q5_1: {
        const block_q5_1 *x = vx;
        for (int64_t i = 0; i < nb; i++, y += QK) {
            const float d = fp16_to_f32(x[i].d), m = fp16_to_f32(x[i].m);
            const uint32_t qh = load_qh(x[i].qh);
            for (int j = 0; j < QK / 2; j++) {
                const int q0 = (x[i].qs[j] & 15) | (int)((qh >> j) & 1) << 4;
                const int q1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK / 2)) & 1) << 4;
                y[j] = (float)q0 * d + m;
                y[j + QK / 2] = (float)q1 * d + m;
            }
        }
        return 0;
    }
    case TYPE_Q8_0: {
        const block_q8_0 *x = vx;
        for (int64_t i = 0; i < nb; i++, y += QK) {
            const float d = fp16_to_f32(x[i].d);
            for (int j = 0; j < QK; j++) y[j] = (float)x[i].qs[j] * d;
        }
        return 0;
    }
    case TYPE_Q8_1: { /* not a storage type; handy for tests (s is ignored) */
        const block_q8_1 *x = vx;
        for (int64_t i = 0; i < nb; i++, y += QK) {
            const float d = fp16_to_f32(x[i].d);
            for (int j = 0; j < QK; j++) y[j] = (float)x[i].qs[j] * d;
        }
        return 0;
    }
    default:
        return -1;
    }
}
