/*
 * srv.h - `tern serve`: the interfaces between its parts. The server is a
 * front end on the public API only (tern.h); it shows that the engine is
 * embeddable.
 *
 *   http.c     libmicrohttpd: routes, auth, limits, responses, SSE, the page
 *   request.c  cJSON: request bodies -> srv_request_t, every field checked;
 *              then srv_request_prepare renders and tokenizes the prompt
 *   sched.c    the engine thread: continuous batching over tern_decode,
 *              prompt reuse (fork of cached prefixes, LRU), session files,
 *              metrics
 *   webui.html the chat page, embedded at build time (webui_gen.c)
 *
 * Threads: libmicrohttpd's threads parse requests and stream answers; one
 * engine thread owns the tern_context and is the only one to call into it.
 * They meet in srv_job_t (a mutex and a condition variable per job).
 */
#ifndef TERN_SRV_H
#define TERN_SRV_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

#define SRV_MAX_STOP 4           /* stop strings per request (OpenAI's limit) */
#define SRV_MAX_STOP_LEN 256     /* bytes per stop string */
#define SRV_MAX_TOP_LOGPROBS 20  /* OpenAI's cap */
#define SRV_MAX_LOGIT_BIAS 1024  /* logit_bias entries */
#define SRV_SESSION_ID_MAX 64    /* [A-Za-z0-9_-]{1,64} */

typedef enum { SRV_KIND_CHAT = 0, SRV_KIND_COMPLETION = 1 } srv_kind_t;

/* A request after parsing and checking (request.c), then preparation
 * (srv_request_prepare: prompt -> token ids). Everything the engine sees
 * has been range-checked. Owned by whoever holds it; srv_request_free. */
typedef struct {
    srv_kind_t kind;
    /* parsed: chat messages (kind CHAT) or the prompt (COMPLETION) */
    tern_chat_msg_t *msgs; /* role/content strings owned by the request */
    size_t n_msgs;
    char *prompt_text;     /* COMPLETION with a string prompt */
    int32_t *prompt_ids;   /* COMPLETION with a token array, or after prepare: the prompt's ids */
    int32_t n_prompt;
    /* sampling */
    tern_sampler_params_t samp; /* temp, top_k, top_p, min_p, penalties, seed */
    int has_seed;
    tern_logit_bias_t *bias;
    size_t n_bias;
    int32_t max_tokens;    /* <= 0: until the context ends (the scheduler clamps to the context) */
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int logprobs;          /* 1: per-token logprobs in the answer */
    int top_logprobs;      /* 0 .. SRV_MAX_TOP_LOGPROBS */
    int ignore_eos;        /* llama-server's field */
    /* constrained output: GBNF from "grammar" (llama-server's field) or
     * response_format json_object / json_schema (converted at parse time);
     * compiled for the model by srv_request_prepare */
    char *grammar;
    tern_grammar_t *gram;
    /* speculative decoding: "speculative.n_max" (llama-server's field), the
     * most drafts per step for this request, capped by --draft-max; 0: none */
    int has_spec_n_max;
    int32_t spec_n_max;
    /* transport */
    int stream;
    int include_usage;     /* stream_options.include_usage */
    char model[128];       /* echoed back */
    char session[SRV_SESSION_ID_MAX + 1]; /* "" when none (X-Session-Id header or "session_id" field) */
} srv_request_t;

void srv_request_free(srv_request_t *r);

/* ---- the scheduler (sched.c) ------------------------------------------ */

enum {
    SRV_SPEC_OFF = 0,   /* no drafts */
    SRV_SPEC_NGRAM = 1, /* prompt-lookup drafts where measured to pay: per tick and per job */
    SRV_SPEC_FIXED = 2  /* prompt-lookup drafts in every tick, draft_max of them (for measurements) */
};

typedef struct {
    int32_t parallel;      /* requests decoding at once (default 8) */
    int32_t queue;         /* requests waiting beyond those (default 64); more: 503 */
    int32_t n_ctx;         /* ONE KV budget in positions, shared by all (<= 0: the model's, capped) */
    int32_t n_threads;
    int32_t n_batch;       /* positions per forward block */
    int32_t prefill_chunk; /* prompt positions per tick, all requests together (default 256) */
    int32_t kv_block;      /* positions per KV block (<= 0: the engine's default) */
    int32_t cache_seqs;    /* finished conversations kept for prefix reuse (LRU; default 16) */
    const char *sessions_dir; /* NULL: no session files */
    double request_timeout_s; /* per-request wall time (0: none) */
    /* speculative decoding (sched.c's header comment) */
    int spec;              /* SRV_SPEC_* */
    int32_t draft_max;     /* most drafts per job and tick, 1 .. TERN_SPEC_DRAFT_MAX (default 8) */
    int32_t spec_ngram;    /* longest n-gram looked up, 1 .. TERN_SPEC_NGRAM_MAX (default 4) */
} srv_sched_opts_t;

typedef struct srv_sched srv_sched_t;
typedef struct srv_job srv_job_t;

/* Starts the engine thread. NULL on error (err says why). */
srv_sched_t *srv_sched_create(const tern_model_t *m, const srv_sched_opts_t *o, tern_error_t *err);
/* SIGTERM: stop taking requests; cancel_running 0 lets running requests
 * finish (for at most SRV_SHUTDOWN_GRACE_S seconds, then they are
 * cancelled), 1 cancels them at once (finish_reason "cancelled"); sessions
 * are saved; queued requests get a 503. Blocks until the engine thread has
 * stopped. */
#define SRV_SHUTDOWN_GRACE_S 10
void srv_sched_shutdown(srv_sched_t *s, int cancel_running);
/* The context's note (tern_context_note): capped context, clamped threads. */
const char *srv_sched_note(const srv_sched_t *s);
void srv_sched_free(srv_sched_t *s);
int32_t srv_sched_n_ctx(const srv_sched_t *s);

/* Hand a prepared request to the scheduler (ownership of r moves to the
 * job, also on failure). Returns the job, or NULL with *status (503 queue
 * full / shutting down, 400 prompt too long for the context ...) and msg. */
srv_job_t *srv_sched_submit(srv_sched_t *s, srv_request_t *r, int *status, char *msg, size_t msg_cap);

/* One generated token, for logprobs. */
typedef struct {
    int32_t id;
    float logprob;
    char text[48];          /* its bytes (may be a partial UTF-8 sequence), NUL-terminated */
    uint8_t text_len;
    uint8_t n_top;
    int32_t top_id[SRV_MAX_TOP_LOGPROBS];
    float top_logprob[SRV_MAX_TOP_LOGPROBS];
    char top_text[SRV_MAX_TOP_LOGPROBS][48];
} srv_token_t;

typedef struct {
    int32_t prompt_tokens, cached_tokens, completion_tokens;
    double prompt_ms, predicted_ms; /* llama-server's timings */
    double ttft_ms;
    int32_t draft_n, draft_n_accepted; /* drafts evaluated for the request; of them, confirmed */
} srv_usage_t;

/* What a job produced since the consumer's last call. text/toks are
 * malloc'd for the caller (free both; NULL when empty). Text is cut at
 * stop strings (never returned) and held back while it might be the start
 * of one; it is whole UTF-8. */
typedef struct {
    char *text;
    size_t len;
    srv_token_t *toks;
    int32_t n_toks;
    int done;            /* 1: nothing more will come */
    const char *finish;  /* when done: "stop", "length", "cancelled", or NULL on error */
    int err_status;      /* when done with an error: HTTP status (500, 503, 507 ...) */
    char err[256];
    srv_usage_t usage;   /* valid when done */
} srv_update_t;

/* Wait up to timeout_ms for news (0: poll). Returns 1 when *u holds news
 * (text, tokens or done), 0 on timeout. */
int srv_job_next(srv_job_t *j, int timeout_ms, srv_update_t *u);
/* The consumer is finished with the job (answer sent, or the client went
 * away): a running job is cancelled at the next tick, its sequence freed
 * or kept for prefix reuse. j is invalid afterwards. */
void srv_job_release(srv_job_t *j);

/* Prometheus text (text/plain; version=0.0.4) of the server's counters;
 * malloc'd, caller frees. */
char *srv_sched_metrics(srv_sched_t *s);
int srv_sched_ready(const srv_sched_t *s); /* 1 once the model is loaded and the engine runs */

/* ---- requests (request.c) --------------------------------------------- */

typedef struct {
    size_t max_messages;      /* default 512 */
    int32_t max_prompt_tokens;/* default: the context */
    int max_depth;            /* JSON nesting, default 32 */
} srv_limits_t;

/* Parse and check a body for /v1/chat/completions (kind CHAT) or
 * /v1/completions (COMPLETION). 0 on success; otherwise the HTTP status
 * (400) and a message naming the field. Needs no model: the fuzz target
 * runs it alone. */
int srv_request_parse(srv_kind_t kind, const char *body, size_t len, const srv_limits_t *lim, srv_request_t *out,
                      char *msg, size_t msg_cap);
/* Render (chat template) and tokenize the prompt, check token ids against
 * the vocabulary and the prompt length against the limits. 0 or a status
 * with a message. */
int srv_request_prepare(const tern_model_t *m, srv_request_t *r, const srv_limits_t *lim, char *msg, size_t msg_cap);

/* Strict UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF): the length (1..4) of the valid sequence at s, or 0; and 1 when
 * all n bytes are valid. */
size_t srv_utf8_seq(const unsigned char *s, size_t n);
int srv_utf8_valid(const char *s, size_t n);

/* Session ids: [A-Za-z0-9_-], 1..SRV_SESSION_ID_MAX. 1 when valid. */
int srv_session_id_valid(const char *id);
/* The file for a session id inside dir: "<dir>/<id>.tsess", checked to be a
 * regular file (or absent) whose resolved path lies inside the resolved
 * dir (no symlink escape). 0 and *path (malloc'd), or -1 with msg. */
int srv_session_path(const char *dir, const char *id, char **path, char *msg, size_t msg_cap);

/* ---- the page (webui_gen.c, generated from webui.html) ----------------- */
extern const unsigned char srv_webui_html[];
extern const size_t srv_webui_html_len;

/* ---- the server (http.c) ---------------------------------------------- */
typedef struct {
    const char *host;        /* default "127.0.0.1" */
    int port;                /* default 8080 */
    const char *api_key;     /* NULL: no auth */
    size_t max_body;         /* default 4 MiB (413 beyond) */
    unsigned max_conns;      /* default 64 */
    unsigned conn_timeout_s; /* idle/slow client timeout, default 30 */
    srv_limits_t lim;
} srv_http_opts_t;

/* `tern serve`: tools/server/cmd_serve.c parses the options and runs this
 * until SIGINT/SIGTERM. */
/* cmd_serve is declared in cmds.h (tools/server/cmd_serve.c). */

#endif /* TERN_SRV_H */
