/*
 * quant_k.c - the K super-block formats: Q4_K, Q5_K and Q6_K weights (256
 * per block) and the Q8_K activation block. Quantize and dequantize one row.
 * Layouts are GGUF's, bit for bit (../shared/reference/quant-layouts.md):
 *
 *   Q4_K/Q5_K: x = d*sc[j] * q - dmin*m[j], sub-block j of 32, sc/m 6-bit,
 *              packed into scales[12] as get_scale_min_k4 unpacks them.
 *   Q6_K:      x = d*sc[j] * (q - 32), sub-block j of 16, sc int8.
 *   Q8_K:      x = d * q, d float32, plus bsums[k] = sum of quants 16k..16k+15.
 *
 * The weight quantizers fit each sub-block first (weighted least squares
 * over a few starting scales, then alternating rounding / refitting of the
 * best one), then quantize the sub-block scales against the super-block
 * scale, round every weight against its final (fp16 x 6-bit) scale, and
 * finally refit the super-block scale(s) by least squares over the whole
 * block, keeping the refit only when it lowers the error. Weights favour
 * large values (rms + |x|, as llama.cpp does): they matter most to a matvec.
 * Gaussian data: rmse/std 0.0715 (Q4_K), 0.0357 (Q5_K), 0.0174 (Q6_K).
 *
 * The small-vector code uses GCC/clang vector extensions (4 floats, SSE2 on
 * x86-64, NEON on ARM, plain code elsewhere) so that the search runs at
 * 80 million weights per second or so on one core without -m flags; every
 * sum has a fixed order, so a row quantizes to the same bytes on every
 * x86-64 build (gcc or clang; targets that contract a*b+c into FMA may
 * differ in the last bits). Nothing here converts a float that may be NaN
 * or huge to an int: values are clamped as floats first.
 */
#include "format/quant.h"

#include <math.h>

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

#define ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer (ties to even) */

static inline v4f v4_load(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline v4f v4_set1(float f) { return (v4f){f, f, f, f}; }
/* max/min as (a > b ? a : b) and (a < b ? a : b) lane by lane: a NaN in a
 * yields b, so clamping a NaN gives the bound. SSE has exactly these
 * semantics in one instruction; elsewhere a compare and a select. */
#if defined(__SSE__)
#include <xmmintrin.h>
static inline v4f v4_max(v4f a, v4f b) { return (v4f)_mm_max_ps((__m128)a, (__m128)b); }
static inline v4f v4_min(v4f a, v4f b) { return (v4f)_mm_min_ps((__m128)a, (__m128)b); }
#else
static inline v4f v4_max(v4f a, v4f b) {
    v4i m = a > b;
    return (v4f)((m & (v4i)a) | (~m & (v4i)b));
}
static inline v4f v4_min(v4f a, v4f b) {
    v4i m = a < b;
    return (v4f)((m & (v4i)a) | (~m & (v4i)b));
}
#endif
static inline v4f v4_abs(v4f a) { return (v4f)((v4i)a & (v4i){0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff}); }
static inline v4f v4_round(v4f v) {
    const v4f m = v4_set1(ROUND_MAGIC);
    return (v + m) - m;
}
static inline float v4_sum(v4f v) { return (v[0] + v[1]) + (v[2] + v[3]); }

/* Scalar forms of the same rounding and NaN-safe clamp. */
static inline float round_ne(float v) { return (v + ROUND_MAGIC) - ROUND_MAGIC; }
static inline float clampf(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    return v < hi ? v : hi;
}

/* fp16 of a scale, saturated to the largest finite half (weights beyond
 * 65504 * 63 cannot be represented; they are clipped instead of becoming
 * inf or NaN). */
static fp16_t scale_to_fp16(float v) {
    v = clampf(v, -65504.0f, 65504.0f);
    return f32_to_fp16(v);
}

/* Root mean square of a super-block: the base of the quantizers' weights. */
static float block_rms(const float *x) {
    v4f s = v4_set1(0);
    for (int i = 0; i < QK_K; i += 4) {
        v4f v = v4_load(x + i);
        s += v * v;
    }
    return sqrtf(v4_sum(s) / QK_K);
}

/* ---- scale packing of Q4_K / Q5_K --------------------------------------- */

/* Inverse of get_scale_min_k4: sub-blocks 0..3 keep scale and min in the low
 * 6 bits of bytes 0..3 and 4..7; sub-blocks 4..7 put their low 4 bits in
 * bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits in
 * the top bits of bytes 0..3 (scale) and 4..7 (min). */
static void pack_scales_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t q[K_SCALE_SIZE]) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void unpack_scales_k4(const uint8_t q[K_SCALE_SIZE], uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 15) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* ---- Q4_K / Q5_K quantizer ------------------------------------------------ */

/* One sub-block of 32 with weights, and its weighted moments. */
typedef struct {
    v4f x[8], w[8];
    float sw, swx, swxx;
    float xmin, xmax;
} sub32_t;

typedef struct {
    float a, c; /* x ~ a*L + c with a >= 0, c <= 0 */
    float err;  /* weighted squared error of that fit */
} fit_t;

static void sub32_init(sub32_t *s, const float *x, float av) {
    v4f vmin = v4_load(x), vmax = vmin, sw = v4_set1(0), swx = sw, swxx = sw;
    for (int i = 0; i < 8; i++) {
        v4f xv = v4_load(x + 4 * i);
        v4f wv = v4_set1(av) + v4_abs(xv);
        s->x[i] = xv;
        s->w[i] = wv;
        vmin = v4_min(vmin, xv);
        vmax = v4_max(vmax, xv);
        sw += wv;
        swx += wv * xv;
        swxx += wv * xv * xv;
    }
    s->sw = v4_sum(sw);
    s->swx = v4_sum(swx);
    s->swxx = v4_sum(swxx);
    float mn = vmin[0], mx = vmax[0];
    for (int i = 1; i < 4; i++) {
        mn = vmin[i] < mn ? vmin[i] : mn;
        mx = vmax[i] > mx ? vmax[i] : mx;
    }
    s->xmin = mn < 0 ? mn : 0; /* the min term can only subtract */
    s->xmax = mx;
}

/* Round L = clamp(round((x - off) * is), 0, nmax), then the weighted least
 * squares (a, c) for those L, with c <= 0 enforced. */
static fit_t sub32_fit(const sub32_t *s, float is, float off, float nmax) {
    v4f vis = v4_set1(is), voff = v4_set1(off), vn = v4_set1(nmax), zero = v4_set1(0);
    v4f sl = zero, sl2 = zero, slx = zero;
    for (int i = 0; i < 8; i++) {
        v4f l = v4_round(v4_min(v4_max((s->x[i] - voff) * vis, zero), vn));
        v4f wl = s->w[i] * l;
        sl += wl;
        sl2 += wl * l;
        slx += wl * s->x[i];
    }
    float SL = v4_sum(sl), SL2 = v4_sum(sl2), SLX = v4_sum(slx);
    fit_t f;
    float det = s->sw * SL2 - SL * SL;
    if (SL2 <= 0) { /* every L is 0: only a constant (<= 0) fits */
        f.a = 0;
        f.c = s->swx < 0 ? s->swx / s->sw : 0;
    } else {
        f.a = det > 0 ? (s->sw * SLX - SL * s->swx) / det : 0;
        f.c = det > 0 ? (SL2 * s->swx - SL * SLX) / det : 0;
        if (!(det > 0) || f.c > 0) { /* fit through the origin instead */
            f.c = 0;
            f.a = SLX / SL2;
        }
        if (!(f.a > 0)) {
            f.a = 0;
            f.c = s->swx < 0 ? s->swx / s->sw : 0;
        }
    }
    f.err = s->swxx - 2 * f.a * SLX - 2 * f.c * s->swx + f.a * f.a * SL2 + 2 * f.a * f.c * SL + f.c * f.c * s->sw;
    return f;
}

/* Best (a, c) for one sub-block: a few starting grids over [xmin, xmax]
 * (nmax + delta levels across the range), then the best of them refined by
 * re-rounding against its own fit until that stops improving. (Refining
 * every start instead gains 0.2% in RMSE at half the speed.) */
static fit_t sub32_search(const sub32_t *s, float nmax) {
    fit_t best = {0, s->xmin, INFINITY};
    float range = s->xmax - s->xmin;
    if (!(range > 0)) {
        best.err = 0;
        return best;
    }
    static const float starts[] = {0.0f, -0.3f, 0.3f, -0.6f, 0.6f, -1.0f};
    for (size_t t = 0; t < sizeof starts / sizeof starts[0]; t++) {
        fit_t f = sub32_fit(s, (nmax + starts[t]) / range, s->xmin, nmax);
        if (f.err < best.err) best = f;
    }
    for (int it = 0; it < 4 && best.a > 0; it++) {
        fit_t g = sub32_fit(s, 1.0f / best.a, best.c, nmax);
        if (!(g.err < best.err)) break;
        best = g;
    }
    if (!(best.err < INFINITY)) best = (fit_t){0, s->xmin, 0};
    return best;
}

/* Moments of one sub-block's rounded L, for refitting d and dmin. */
typedef struct {
    float sl, sl2, slx;
} lsum_t;

/* Weighted squared error of a whole super-block for given (d, dmin) and the
 * 6-bit sc/m, with every L re-rounded into L[256]; ls gets the moments. */
static float affine_block_err(const sub32_t *sub, float d, float dmin, const uint8_t sc[8], const uint8_t m[8],
                              float nmax, uint8_t *L, lsum_t ls[8]) {
    v4f e = v4_set1(0);
    const v4f vn = v4_set1(nmax), zero = v4_set1(0);
    for (int j = 0; j < 8; j++) {
        float ds = d * sc[j], dm = dmin * m[j];
        v4f vds = v4_set1(ds), vdm = v4_set1(dm);
        v4f vid = v4_set1(ds != 0 ? 1.0f / ds : 0.0f);
        v4f sl = zero, sl2 = zero, slx = zero;
        for (int i = 0; i < 8; i++) {
            v4f l = v4_round(v4_min(v4_max((sub[j].x[i] + vdm) * vid, zero), vn));
            v4f r = l * vds - vdm - sub[j].x[i];
            v4f wl = sub[j].w[i] * l;
            e += sub[j].w[i] * r * r;
            sl += wl;
            sl2 += wl * l;
            slx += wl * sub[j].x[i];
            v4i li = (v4i)(l + v4_set1(ROUND_MAGIC)); /* low mantissa bits = the integer */
            for (int u = 0; u < 4; u++) L[32 * j + 4 * i + u] = (uint8_t)li[u];
        }
        ls[j] = (lsum_t){v4_sum(sl), v4_sum(sl2), v4_sum(slx)};
    }
    return v4_sum(e);
}

/* Quantize one super-block to Q4_K (nmax 15) or Q5_K (nmax 31): fills
 * d, dmin, the packed scales and L[256] (0..nmax, in element order). */
static void quantize_affine_block(const float *x, float nmax, fp16_t *pd, fp16_t *pdmin,
                                  uint8_t scales[K_SCALE_SIZE], uint8_t L[QK_K]) {
    sub32_t sub[8];
    fit_t fit[8];
    float av = block_rms(x);

    float max_a = 0, max_b = 0;
    for (int j = 0; j < 8; j++) {
        sub32_init(&sub[j], x + 32 * j, av);
        fit[j] = sub32_search(&sub[j], nmax);
        if (fit[j].a > max_a) max_a = fit[j].a;
        if (-fit[j].c > max_b) max_b = -fit[j].c;
    }

    /* Super-block scales in fp16; the 6-bit sub-block values are rounded
     * against the fp16 values actually stored. */
    fp16_t hd = scale_to_fp16(max_a / 63), hm = scale_to_fp16(max_b / 63);
    float d = fp16_to_f32(hd), dmin = fp16_to_f32(hm);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? round_ne(clampf(fit[j].a / d, 0, 63)) : 0);
        m[j] = (uint8_t)(dmin > 0 ? round_ne(clampf(-fit[j].c / dmin, 0, 63)) : 0);
    }
    lsum_t ls[8];
    float err = affine_block_err(sub, d, dmin, sc, m, nmax, L, ls);

    /* Refit d and dmin over the block for the chosen L: x ~ d*(sc*L) - dmin*m. */
    float s11 = 0, s12 = 0, s22 = 0, b1 = 0, b2 = 0;
    for (int j = 0; j < 8; j++) {
        s11 += (float)sc[j] * sc[j] * ls[j].sl2;
        s12 += (float)sc[j] * m[j] * ls[j].sl;
        s22 += (float)m[j] * m[j] * sub[j].sw;
        b1 += sc[j] * ls[j].slx;
        b2 += m[j] * sub[j].swx;
    }
    /* minimize sum w (d*S - dm*M - x)^2: [s11 -s12; -s12 s22] [d; dm] = [b1; -b2] */
    float det = s11 * s22 - s12 * s12;
    if (det > 0) {
        float nd = (b1 * s22 - b2 * s12) / det;
        float nm = (s12 * b1 - s11 * b2) / det;
        if (nd > 0 && nm >= 0) {
            fp16_t hd2 = scale_to_fp16(nd), hm2 = scale_to_fp16(nm);
            float d2 = fp16_to_f32(hd2), m2 = fp16_to_f32(hm2);
            uint8_t L2[QK_K];
            float err2 = affine_block_err(sub, d2, m2, sc, m, nmax, L2, ls);
            if (err2 < err) {
                hd = hd2;
                hm = hm2;
                memcpy(L, L2, QK_K);
            }
        }
    }
    *pd = hd;
    *pdmin = hm;
    pack_scales_k4(sc, m, scales);
}

static void quantize_q4_K(const float *x, block_q4_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        quantize_affine_block(x, 15, &y[b].d, &y[b].dmin, y[b].scales, L);
        /* chunk c: low nibbles = elements 64c..64c+31, high = 64c+32.. */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

static void quantize_q5_K(const float *x, block_q5_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        quantize_affine_block(x, 31, &y[b].d, &y[b].dmin, y[b].scales, L);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                y[b].qs[32 * c + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
                /* bit k of qh[l] is bit 4 of element 32k + l */
                y[b].qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
    }
}

/* ---- Q6_K quantizer ------------------------------------------------------- */

/* Best scale a for x[0..15] ~ a * L, L in -32..31, weights w. Starting grids put the largest |x| on -32 (the longer
 * side) at a few nearby scales, then re-round against the fitted scale. */
static float fit_sub16(const float *x, const float *w) {
    float amax = 0, mx = 0;
    for (int i = 0; i < 16; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            mx = x[i];
        }
    }
    if (!(amax > 1e-30f)) return 0;
    v4f vx[4], vw[4];
    for (int i = 0; i < 4; i++) {
        vx[i] = v4_load(x + 4 * i);
        vw[i] = v4_load(w + 4 * i);
    }
    const v4f lo = v4_set1(-32), hi = v4_set1(31);
    float best_score = -1, best_a = 0;
    static const float starts[] = {0.0f, -0.4f, 0.4f, -0.8f};
    for (size_t t = 0; t < sizeof starts / sizeof starts[0] + 3; t++) {
        /* the first len(starts) passes are grids, the rest refine the best */
        float is = t < sizeof starts / sizeof starts[0] ? -(32 + starts[t]) / mx : 1.0f / best_a;
        if (!isfinite(is)) break;
        v4f vis = v4_set1(is), slx = v4_set1(0), sl2 = slx;
        for (int i = 0; i < 4; i++) {
            v4f l = v4_round(v4_min(v4_max(vx[i] * vis, lo), hi));
            v4f wl = vw[i] * l;
            slx += wl * vx[i];
            sl2 += wl * l;
        }
        float SLX = v4_sum(slx), SL2 = v4_sum(sl2);
        if (!(SL2 > 0)) continue;
        float score = SLX * SLX / SL2; /* error reduction of the LS scale */
        if (score > best_score) {
            best_score = score;
            best_a = SLX / SL2;
        } else if (t >= sizeof starts / sizeof starts[0]) {
            break;
        }
    }
    return best_a;
}

static float q6_block_err(const float *x, const float *w, float d, const int8_t sc[16], uint8_t *L) {
    float e = 0;
    for (int j = 0; j < 16; j++) {
        float ds = d * sc[j];
        float id = ds != 0 ? 1.0f / ds : 0.0f;
        for (int i = 0; i < 16; i++) {
            float l = round_ne(clampf(x[16 * j + i] * id, -32, 31));
            float r = l * ds - x[16 * j + i];
            e += w[16 * j + i] * r * r;
            if (L) L[16 * j + i] = (uint8_t)(int)(l + 32);
        }
    }
    return e;
}

static void quantize_q6_K(const float *x, block_q6_K *y, int64_t nb) {
    float w[QK_K], a[16];
    uint8_t L[QK_K];
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float av = block_rms(x);
        for (int i = 0; i < QK_K; i++) w[i] = av + fabsf(x[i]);

        float max_abs = 0, max_a = 0;
        for (int j = 0; j < 16; j++) {
            a[j] = fit_sub16(x + 16 * j, w + 16 * j);
            if (fabsf(a[j]) > max_abs) {
                max_abs = fabsf(a[j]);
                max_a = a[j];
            }
        }
        int8_t sc[16];
        fp16_t hd = 0;
        float d = 0;
        if (max_abs > 0) {
            /* the largest sub-block scale takes -128, the longer int8 side */
            hd = scale_to_fp16(-max_a / 128);
            d = fp16_to_f32(hd);
        }
        for (int j = 0; j < 16; j++)
            sc[j] = (int8_t)(d != 0 ? round_ne(clampf(a[j] / d, -128, 127)) : 0);
        float err = q6_block_err(x, w, d, sc, L);

        /* Refit d over the block for these L: x ~ d * (sc*(L-32)). */
        if (d != 0) {
            float sqx = 0, sqq = 0;
            for (int i = 0; i < QK_K; i++) {
                float q = (float)sc[i / 16] * ((int)L[i] - 32);
                sqx += w[i] * q * x[i];
                sqq += w[i] * q * q;
            }
            if (sqq > 0) {
                fp16_t hd2 = scale_to_fp16(sqx / sqq);
                float d2 = fp16_to_f32(hd2);
                uint8_t L2[QK_K];
                if (isfinite(d2) && d2 != 0) {
                    float err2 = q6_block_err(x, w, d2, sc, L2);
                    if (err2 < err) {
                        hd = hd2;
                        memcpy(L, L2, QK_K);
                    }
                }
            }
        }
        y[b].d = hd;
        memcpy(y[b].scales, sc, 16);
        for (int h = 0; h < 2; h++) {
            const uint8_t *Lh = L + 128 * h;
            uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 15) | ((Lh[l + 64] & 15) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 15) | ((Lh[l + 96] & 15) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                  ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

/* ---- Q8_K (activations) --------------------------------------------------- */

/* d = amax/127, q = round_ne(x * (127/amax)). The SIMD act quantizers in
 * src/kernels/ compute exactly these operations, so every ISA produces the
 * same bytes. */
static void quantize_q8_K(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float amax = 0;
        for (int i = 0; i < QK_K; i++) {
            float ax = fabsf(x[i]);
            amax = ax > amax ? ax : amax;
        }
        if (amax == 0) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float id = 127.0f / amax;
        y[b].d = amax / 127.0f;
        for (int i = 0; i < QK_K; i++) y[b].qs[i] = (int8_t)round_ne(clampf(x[i] * id, -127, 127));
        for (int k = 0; k < QK_K / 16; k++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += y[b].qs[16 * k + i];
            y[b].bsums[k] = (int16_t)s;
        }
    }
}

int quant_k_quantize_row(int type, const float *x, void *y, int64_t n) {
    if (n < 0 || n % QK_K) return -1;
    int64_t nb = n / QK_K;
    switch (type) {
    case TYPE_Q4_K: quantize_q4_K(x, y, nb); return 0;
    case TYPE_Q5_K: quantize_q5_K(x, y, nb); return 0;
    case TYPE_Q6_K: quantize_q6_K(x, y, nb); return 0;
    case TYPE_Q8_K: quantize_q8_K(x, y, nb); return 0;
    default: return -1;
    }
}

/* ---- dequantize ------------------------------------------------------------ */

static void dequantize_q4_K(const block_q4_K *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = fp16_to_f32(x[b].d), dmin = fp16_to_f32(x[b].dmin);
        uint8_t sc[8], m[8];
        unpack_scales_k4(x[b].scales, sc, m);
        for (int c = 0; c < 4; c++) {
            float d1 = d * sc[2 * c], m1 = dmin * m[2 * c];
            float d2 = d * sc[2 * c + 1], m2 = dmin * m[2 * c + 1];
            const uint8_t *q = x[b].qs + 32 * c;
            for (int l = 0; l < 32; l++) y[l] = d1 * (q[l] & 15) - m1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * (q[l] >> 4) - m2;
            y += 64;
        }
    }
}

static void dequantize_q5_K(const block_q5_K *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = fp16_to_f32(x[b].d), dmin = fp16_to_f32(x[b].dmin);
        uint8_t sc[8], m[8];
        unpack_scales_k4(x[b].scales, sc, m);
        for (int c = 0; c < 4; c++) {
            float d1 = d * sc[2 * c], m1 = dmin * m[2 * c];
            float d2 = d * sc[2 * c + 1], m2 = dmin * m[2 * c + 1];
            const uint8_t *q = x[b].qs + 32 * c, *qh = x[b].qh;
            for (int l = 0; l < 32; l++) y[l] = d1 * ((q[l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * ((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
            y += 64;
        }
    }
}

static void dequantize_q6_K(const block_q6_K *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = fp16_to_f32(x[b].d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
            const int8_t *sc = x[b].scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
        }
    }
}

static void dequantize_q8_K(const block_q8_K *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++)
        for (int i = 0; i < QK_K; i++) *y++ = x[b].d * x[b].qs[i];
}

int quant_k_dequantize_row(int type, const void *x, float *y, int64_t n) {
    if (n < 0 || n % QK_K) return -1;
    int64_t nb = n / QK_K;
    switch (type) {
    case TYPE_Q4_K: dequantize_q4_K(x, y, nb); return 0;
    case TYPE_Q5_K: dequantize_q5_K(x, y, nb); return 0;
    case TYPE_Q6_K: dequantize_q6_K(x, y, nb); return 0;
    case TYPE_Q8_K: dequantize_q8_K(x, y, nb); return 0;
    default: return -1;
    }
}
