/* quant_legacy.c - PLACEHOLDER: F32/F16/BF16 and the 32-block formats. */
#include "quant.h"
int quant_legacy_quantize_row(int t, const float *x, void *y, int64_t n) { (void)t; (void)x; (void)y; (void)n; return -1; }
int quant_legacy_dequantize_row(int t, const void *x, float *y, int64_t n) { (void)t; (void)x; (void)y; (void)n; return -1; }
