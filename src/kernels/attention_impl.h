/*
 * attention_impl.h - the per-ISA inner loops of kern_attention (private to
 * attention.c and x86/attention_avx2.c). A tile is nt consecutive cache
 * positions of one KV head; rows are kstride / vstride bytes apart.
 */
#ifndef TERN_ATTENTION_IMPL_H
#define TERN_ATTENTION_IMPL_H

#include <stddef.h>

/* s[t] = scale * (q . k_t) for t < nt. */
typedef void (*attn_scores_fn)(const float *q, const void *k, size_t kstride, int nt, int hd, float scale,
                               float *s);
/* acc += p[t] * v_t for t < nt, in order of t. */
typedef void (*attn_accum_fn)(float *acc, const float *p, const void *v, size_t vstride, int nt, int hd);

typedef struct {
    attn_scores_fn scores;
    attn_accum_fn accum;
} attn_vt_t;

/* kv: 0 = F32 cache, 1 = F16 cache. */
extern const attn_vt_t attn_vt_scalar[2];
#if defined(__x86_64__) || defined(__i386__)
extern const attn_vt_t attn_vt_avx2[2];
#endif

#endif
