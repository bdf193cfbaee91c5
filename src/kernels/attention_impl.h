/*
 * attention_impl.h - the per-ISA inner loops of kern_attention (private to
 * attention.c and x86/attention_avx2.c). A tile is nt consecutive cache
 * positions of one KV head; rows are kstride / vstride bytes apart.
 */
#ifndef TERN_ATTENTION_IMPL_H
#define TERN_ATTENTION_IMPL_H

#include <stdbool.h>
#include <stddef.h>

/* Up to ATTN_GMAX query heads of one GQA group share each K / V row: the
 * inner loops take them together, so an F16 row is converted once for all
 * of them. Head h's query is q + h * qstride, its scores s + h * sstride,
 * its weights p + h * pstride, its accumulator acc + h * accstride. Every
 * head's float operations are those of a one-head call, in the same order
 * (the heads only share the loads and conversions), so the grouping does
 * not change a bit. */
#define ATTN_GMAX 8

/* s_h[t] = scale * (q_h . k_t) for t < nt, h < nh; f16: the cache rows
 * are F16 (else F32). */
typedef void (*attn_scores_fn)(const float *q, size_t qstride, int nh, const void *k, size_t kstride, int nt, int hd,
                               float scale, float *s, size_t sstride, bool f16);
/* acc_h += p_h[t] * v_t for t < nt, in order of t, h < nh. */
typedef void (*attn_accum_fn)(float *acc, size_t accstride, const float *p, size_t pstride, int nh, const void *v,
                              size_t vstride, int nt, int hd, bool f16);

/* s[t] = fexp1(s[t] - m) for t < n (core/fexp.h: the same bits in every
 * ISA's form). */
typedef void (*attn_expsub_fn)(float *s, int n, float m);
/* out[d] = in[d] * c for d < n (out may be in). */
typedef void (*attn_scale_fn)(float *out, const float *in, int n, float c);

typedef struct {
    attn_scores_fn scores;
    attn_accum_fn accum;
    attn_expsub_fn expsub;
    attn_scale_fn scale;
} attn_vt_t;

extern const attn_vt_t attn_vt_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const attn_vt_t attn_vt_avx2;
#endif

#endif
