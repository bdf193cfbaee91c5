/*
 * inline.h - the one spelling of "always inline" in the kernels: the SIMD
 * kernel templates are functions with constant arguments (format, row and
 * column counts) that must be inlined into each instantiation, or the
 * constants stop being constants.
 *
 * TERN_INLINE              a static function inlined into every caller;
 * TERN_INLINE_TARGET(t)    the same, compiled for the extra target t (e.g.
 *                          "avxvnni"): only callers with that target may
 *                          call it.
 */
#ifndef TERN_KERNELS_INLINE_H
#define TERN_KERNELS_INLINE_H

#define TERN_INLINE static inline __attribute__((always_inline))
#define TERN_INLINE_TARGET(t) static inline __attribute__((always_inline, target(t)))

#endif
