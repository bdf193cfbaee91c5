/*
 * fuzz_sampler_state.c - libFuzzer target for the sampler's state blob
 * (sampler_state_load): any bytes either load or are refused, never crash
 * or leak; a blob that loads saves back to the same bytes but for the
 * capacity field (which records the saver's repeat_last_n: any capacity
 * that holds the window loads), and the sampler then samples an allowed id.
 *
 * Input: byte 0 picks the window capacity (0..15), the rest is the blob.
 * Samplers of a 64-token vocabulary, one per capacity, made once.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "text/sampler.h"

#define V 64
static sampler_t *g_s[16];
static float g_logits[V];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!g_s[0]) {
        for (int i = 0; i < 16; i++) {
            tern_sampler_params_t p = {0};
            p.temp = 0.7f, p.top_k = 10, p.top_p = 0.9f, p.repeat_penalty = 1.2f, p.repeat_last_n = i, p.seed = 1;
            g_s[i] = sampler_create(&p, V, NULL);
            TERN_CHECK(g_s[i]);
        }
        for (int i = 0; i < V; i++) g_logits[i] = (float)((i * 37) % 11) - 5.0f;
    }
    sampler_t *s = g_s[data[0] & 15];
    const uint8_t *blob = data + 1;
    size_t len = size - 1;
    /* The blob is copied so that reads past its end are caught (ASan). */
    uint8_t *copy = malloc(len ? len : 1);
    TERN_CHECK(copy);
    if (len) memcpy(copy, blob, len);
    if (sampler_state_load(s, copy, len, NULL) == 0) {
        size_t cap = sampler_state_size(s);
        uint8_t *again = malloc(cap);
        TERN_CHECK(again);
        TERN_CHECK(sampler_state_save(s, again, cap) == len);
        TERN_CHECK(memcmp(again, copy, 12) == 0 && memcmp(again + 16, copy + 16, len - 16) == 0);
        free(again);
        int32_t id = sampler_sample(s, g_logits);
        TERN_CHECK(id >= 0 && id < V);
        sampler_accept(s, id);
    }
    free(copy);
    return 0;
}
