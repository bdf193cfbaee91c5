/* test_fp16.c - fp16/bf16 conversions against exhaustive and fixed cases. */
#include "testutil.h"
#include "format/quant.h"

#include <math.h>
#include <string.h>

/* Every half value converts to float and back to itself (NaNs stay NaN). */
static void test_fp16_roundtrip_all(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((fp16_t)h);
        if (isnan(f)) {
            assert_true(isnan(fp16_to_f32(f32_to_fp16(f))));
            continue;
        }
        assert_int_equal(f32_to_fp16(f), h);
    }
}

static void test_fp16_fixed(void **state) {
    (void)state;
    assert_true(fp16_to_f32(0x3c00) == 1.0f);
    assert_true(fp16_to_f32(0xc000) == -2.0f);
    assert_true(fp16_to_f32(0x7bff) == 65504.0f);
    assert_true(fp16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_int_equal(f32_to_fp16(65520.0f), 0x7c00);        /* rounds to inf */
    assert_int_equal(f32_to_fp16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even */
    assert_int_equal(f32_to_fp16(ldexpf(1.0f, -25)), 0x0000);     /* tie to even: 0 */
    assert_int_equal(f32_to_fp16(ldexpf(3.0f, -26)), 0x0001);
}

static void test_bf16(void **state) {
    (void)state;
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    assert_true(bf16_to_f32(0x3f80) == 1.0f);
    /* 1 + 2^-8 is a tie between 1 and 1+2^-7: rounds to even (1). */
    assert_int_equal(f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80);
    assert_int_equal(f32_to_bf16(1.0f + ldexpf(3, -9)), 0x3f81);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_roundtrip_all),
        cmocka_unit_test(test_fp16_fixed),
        cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
