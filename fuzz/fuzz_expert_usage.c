/*
 * fuzz_expert_usage.c - libFuzzer target for the expert usage counts file
 * (ec_parse_counts; format at the top of src/model/expert_cache.c): any
 * bytes are either refused or parsed into exactly n_layer x n_expert
 * counts; a file that parses, written back field by field, is the same
 * bytes (nothing in it is ignored). The expected model: 3 layers of 5
 * experts, a file of 12345 bytes; an input of 44 bytes (the length of a
 * 1 x 1 file) is checked against that shape instead, so both outcomes of
 * the length check are reachable for two shapes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model/expert_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t nl = 3, ne = 5;
    if (size == 44) nl = 1, ne = 1;
    uint32_t counts[15];
    memset(counts, 0xab, sizeof counts);
    if (ec_parse_counts(data, size, nl, ne, 12345, counts) == 0) {
        TERN_CHECK(size == 32 + 4 * (size_t)(nl * ne) + 8);
        for (int64_t i = 0; i < nl * ne; i++) {
            const uint8_t *p = data + 32 + 4 * i;
            TERN_CHECK(counts[i] == ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24));
        }
    }
    /* absurd shapes are refused, not overflowed */
    TERN_CHECK(ec_parse_counts(data, size, INT64_MAX, INT64_MAX, 0, counts) != 0);
    return 0;
}
