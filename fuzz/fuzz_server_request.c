/*
 * fuzz_server_request.c - libFuzzer target for the request parser of
 * `tern serve` (srv_request_parse, tools/server/request.c) and its session
 * ids (srv_session_id_valid, srv_session_path).
 *
 * Input: byte 0 picks the kind (bit 0: chat or completion) and the limits
 * (bits 1-2: the nesting depth 4, 8, 32 or 64); the rest is the body. Checks:
 * no crash, leak or sanitizer report; a refused body gives 400 with a
 * message and holds nothing afterwards; an accepted one holds only what the
 * parser promises: in-range sampling values, at most SRV_MAX_STOP non-empty
 * stop strings, a chat with 1..max_messages messages of known roles, a
 * completion with a prompt (text or ids >= 0), a valid session id. The body
 * is also tried as a session id, and a valid id must map to a path inside
 * a scratch folder.
 *
 * Seeds: fuzz/seeds/fuzz_server_request/ (request bodies with byte 0).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "srv.h"

#define CHECK(c)                                                                \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "fuzz_server_request: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                            \
        }                                                                       \
    } while (0)

static char g_dir[64];

static void check_accepted(const srv_request_t *r, srv_kind_t kind, const srv_limits_t *lim) {
    CHECK(r->kind == kind);
    CHECK(r->samp.temp >= 0 && r->samp.temp <= 2);
    CHECK(r->samp.top_p >= 0 && r->samp.top_p <= 1);
    CHECK(r->samp.min_p >= 0 && r->samp.min_p <= 1);
    CHECK(r->samp.top_k >= 0);
    CHECK(r->samp.repeat_penalty > 0);
    CHECK(r->samp.presence_penalty >= -2 && r->samp.presence_penalty <= 2);
    CHECK(r->samp.frequency_penalty >= -2 && r->samp.frequency_penalty <= 2);
    CHECK(r->max_tokens >= 0);
    CHECK(r->n_stop >= 0 && r->n_stop <= SRV_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        CHECK(l >= 1 && l <= SRV_MAX_STOP_LEN);
    }
    CHECK(r->n_bias <= SRV_MAX_LOGIT_BIAS);
    for (size_t i = 0; i < r->n_bias; i++) {
        CHECK(r->bias[i].token >= 0);
        CHECK(r->bias[i].bias >= -100 && r->bias[i].bias <= 100);
    }
    CHECK(r->top_logprobs >= 0 && r->top_logprobs <= SRV_MAX_TOP_LOGPROBS);
    CHECK(!r->top_logprobs || r->logprobs);
    CHECK(!r->include_usage || r->stream);
    CHECK(!r->session[0] || srv_session_id_valid(r->session));
    if (kind == SRV_KIND_CHAT) {
        CHECK(r->n_msgs >= 1 && r->n_msgs <= lim->max_messages);
        for (size_t i = 0; i < r->n_msgs; i++) {
            const char *ro = r->msgs[i].role;
            CHECK(!strcmp(ro, "system") || !strcmp(ro, "user") || !strcmp(ro, "assistant"));
            CHECK(r->msgs[i].content != NULL);
        }
    } else {
        CHECK((r->prompt_text != NULL) != (r->prompt_ids != NULL));
        if (r->prompt_ids) {
            CHECK(r->n_prompt >= 1);
            for (int32_t i = 0; i < r->n_prompt; i++) CHECK(r->prompt_ids[i] >= 0);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/fuzz-server-request-XXXXXX");
        if (!mkdtemp(g_dir)) abort();
    }
    srv_kind_t kind = (data[0] & 1) ? SRV_KIND_COMPLETION : SRV_KIND_CHAT;
    static const int depths[4] = {4, 8, 32, 64};
    srv_limits_t lim = {64, 0, depths[(data[0] >> 1) & 3]};
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    srv_request_t r;
    char msg[512];
    msg[0] = 0;
    int st = srv_request_parse(kind, body, len, &lim, &r, msg, sizeof msg);
    if (st) {
        CHECK(st == 400 || st == 500);
        CHECK(msg[0] != 0);
        CHECK(r.msgs == NULL && r.prompt_ids == NULL && r.prompt_text == NULL && r.bias == NULL && r.n_stop == 0);
    } else {
        check_accepted(&r, kind, &lim);
        srv_request_free(&r);
    }

    /* the body as a session id */
    char id[SRV_SESSION_ID_MAX + 2];
    size_t n = len < sizeof id - 1 ? len : sizeof id - 1;
    memcpy(id, body, n);
    id[n] = 0;
    if (srv_session_id_valid(id)) {
        CHECK(strlen(id) >= 1 && strlen(id) <= SRV_SESSION_ID_MAX);
        CHECK(!strchr(id, '/') && !strchr(id, '.'));
        char *path = NULL;
        CHECK(srv_session_path(g_dir, id, &path, msg, sizeof msg) == 0);
        CHECK(path && strstr(path, id) && !strstr(path, ".."));
        free(path);
    } else {
        char *path = (char *)1;
        CHECK(srv_session_path(g_dir, id, &path, msg, sizeof msg) == -1 && path == NULL);
    }
    return 0;
}
