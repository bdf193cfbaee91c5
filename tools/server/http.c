/* http.c - the HTTP side of `tern serve` on libmicrohttpd (docs/SERVER.md
 * is the user's reference).
 *
 * One thread per connection (MHD_USE_THREAD_PER_CONNECTION): a request's
 * handler may block while its job runs, and a streamed answer's reader
 * blocks in srv_job_next on its own connection's thread.
 *
 * A request: the first call of the access handler routes it and answers
 * what needs no body (404, 405, 401, 413 on Content-Length, 503 while the
 * model loads); the body is then collected up to --max-body (more: 413);
 * the last call runs the endpoint.
 *
 * Streaming (SSE): a callback response whose reader waits for the job's
 * news in steps of 250 ms and writes an SSE comment (": ping") when nothing
 * came for a while, so that a client that went away during a long prompt
 * is noticed (the write fails); libmicrohttpd then drops the response and
 * its free callback releases the job, which cancels it. A non-streamed
 * answer waits for the job on the handler's thread and watches the socket
 * for the client hanging up meanwhile.
 *
 * Slow clients: libmicrohttpd closes a connection silent for
 * --conn-timeout; a watchdog thread also closes one whose request (headers
 * and body) has not arrived whole within that time, so that clients
 * trickling a byte now and then cannot hold the connection slots. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/http.h"
#include "srv.h"

#define WAIT_STEP_MS 250
#define PING_MS 2000
#define TIMEOUT_GRACE_S 10.0 /* past --timeout, behind the scheduler's own limit */

enum { R_NONE = 0, R_PAGE, R_FAVICON, R_HEALTH, R_MODELS, R_METRICS, R_CHAT, R_COMPL, R_TOKENIZE, R_DETOKENIZE };

/* A connection as the watchdog sees it. */
typedef struct watch {
    int fd;
    int receiving;  /* waiting for a request to arrive whole */
    double t_start; /* since when */
    int killed;
    struct watch *prev, *next;
} watch_t;

struct srv_http {
    struct MHD_Daemon *d;
    MHD_socket quiesced_fd; /* the listening socket after MHD_quiesce_daemon, closed after MHD_stop_daemon */
    srv_http_opts_t o;
    char host[256];
    int port;
    char *api_key;
    size_t api_key_len;
    char model_id[256];
    char *sessions_dir;
    double req_timeout_s;
    int ping_ms;
    time_t created;
    /* set once by srv_http_set_ready, published by the release store of ready */
    const tern_model_t *m;
    srv_sched_t *s;
    srv_limits_t lim;
    atomic_int ready;
    atomic_int stopping;
    /* the watchdog */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    watch_t *watch_head;
    pthread_t wth;
    int wth_started, wstop;
};

/* One request (libmicrohttpd's con_cls). */
typedef struct {
    int route;
    char *body;
    size_t len, cap;
    int too_large;
    size_t discarded;
} req_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- strings ------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf_t;

static void buf_put(buf_t *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (n > SIZE_MAX / 2 - b->n) {
        b->oom = 1;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void buf_puts(buf_t *b, const char *s) { buf_put(b, s, strlen(s)); }

/* A JSON string of n bytes: invalid UTF-8 becomes U+FFFD, NUL bytes are
 * dropped (cJSON strings end at one). */
static cJSON *json_text(const char *s, size_t n) {
    buf_t b = {0};
    buf_put(&b, "", 0);
    for (size_t i = 0; i < n;) {
        size_t k = srv_utf8_seq((const unsigned char *)s + i, n - i);
        if (!k) {
            buf_puts(&b, "\xEF\xBF\xBD");
            i++;
        } else {
            if (s[i]) buf_put(&b, s + i, k);
            i += k;
        }
    }
    cJSON *j = cJSON_CreateString(b.p ? b.p : "");
    free(b.p);
    return j;
}

static cJSON *json_bytes(const char *s, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

/* Bound the nesting of a JSON body before cJSON recurses into it. */
static int json_depth_ok(const char *b, size_t n, int max) {
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max) return 0;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return 1;
}

static void random_id(char *out, size_t cap, const char *prefix) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        uint64_t x = (uint64_t)(now_s() * 1e9) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < sizeof r; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            r[i] = (unsigned char)x;
        }
    }
    size_t p = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof r && p + 1 < cap; i++) out[p++] = al[r[i] % (sizeof al - 1)];
    if (p < cap) out[p] = 0;
}

/* ---- responses ---------------------------------------------------------- */

static void add_common_headers(struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
}

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned status, const char *ctype, char *buf, size_t len,
                                enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free(buf);
        return MHD_NO;
    }
    add_common_headers(r);
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Sends and frees j. */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    return send_buf(c, status, "application/json; charset=utf-8", s, strlen(s), MHD_RESPMEM_MUST_FREE);
}

static const char *error_type(unsigned status) {
    if (status == 401) return "authentication_error";
    if (status == 404) return "not_found_error";
    if (status == 503) return "unavailable_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

static cJSON *error_obj(unsigned status, const char *msg, const char *param, const char *code) {
    cJSON *e = cJSON_CreateObject(), *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "message", json_text(msg, strlen(msg)));
    cJSON_AddStringToObject(o, "type", error_type(status));
    if (param) cJSON_AddItemToObject(o, "param", json_text(param, strlen(param)));
    else cJSON_AddNullToObject(o, "param");
    if (code) cJSON_AddStringToObject(o, "code", code);
    else cJSON_AddNullToObject(o, "code");
    cJSON_AddItemToObject(e, "error", o);
    return e;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *param,
                                  const char *code) {
    return send_json(c, status, error_obj(status, msg, param, code));
}

/* The field a parse/prepare message names: its leading path when it
 * starts with a lowercase letter ("messages[2].role: ..."). */
static const char *param_of(const char *msg, char *out, size_t cap) {
    if (!(msg[0] >= 'a' && msg[0] <= 'z')) return NULL;
    size_t n = strspn(msg, "abcdefghijklmnopqrstuvwxyz0123456789_.[]");
    if (n == 0 || n >= cap || (msg[n] != ':' && msg[n] != ' ')) return NULL;
    memcpy(out, msg, n);
    out[n] = 0;
    return out;
}

/* ---- auth --------------------------------------------------------------- */

/* Constant time in the key's content (the length may show). */
static int key_equal(const char *a, size_t an, const char *b, size_t bn) {
    unsigned char d = an != bn;
    size_t n = an > bn ? an : bn;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < an ? (unsigned char)a[i] : 0, y = i < bn ? (unsigned char)b[i] : 0;
        d |= x ^ y;
    }
    return d == 0;
}

static int authorized(const srv_http_t *h, struct MHD_Connection *c) {
    if (!h->api_key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7) != 0) return 0;
    a += 7;
    while (*a == ' ') a++;
    size_t n = strlen(a);
    while (n && (a[n - 1] == ' ' || a[n - 1] == '\t')) n--;
    return key_equal(a, n, h->api_key, h->api_key_len);
}

/* ---- the watchdog -------------------------------------------------------- */

static void *watchdog_main(void *arg) {
    srv_http_t *h = arg;
    pthread_mutex_lock(&h->wmu);
    while (!h->wstop) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 500 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&h->wcv, &h->wmu, &dl);
        double t = now_s(), lim = (double)h->o.conn_timeout_s;
        for (watch_t *w = h->watch_head; w; w = w->next) {
            if (w->receiving && !w->killed && t - w->t_start > lim) {
                /* The connection's thread sees the socket fail and closes
                 * it; it unregisters (under wmu) before closing the fd. */
                shutdown(w->fd, SHUT_RDWR);
                w->killed = 1;
            }
        }
    }
    pthread_mutex_unlock(&h->wmu);
    return NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    srv_http_t *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        watch_t *w = calloc(1, sizeof *w);
        if (!w || !ci) {
            free(w);
            *socket_context = NULL;
            return;
        }
        w->fd = ci->connect_fd;
        w->receiving = 1;
        w->t_start = now_s();
        pthread_mutex_lock(&h->wmu);
        w->next = h->watch_head;
        if (h->watch_head) h->watch_head->prev = w;
        h->watch_head = w;
        pthread_mutex_unlock(&h->wmu);
        *socket_context = w;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        watch_t *w = *socket_context;
        if (!w) return;
        pthread_mutex_lock(&h->wmu);
        if (w->prev) w->prev->next = w->next;
        else h->watch_head = w->next;
        if (w->next) w->next->prev = w->prev;
        pthread_mutex_unlock(&h->wmu);
        free(w);
        *socket_context = NULL;
    }
}

static void watch_set(srv_http_t *h, struct MHD_Connection *c, int receiving) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    watch_t *w = ci ? ci->socket_context : NULL;
    if (!w) return;
    pthread_mutex_lock(&h->wmu);
    w->receiving = receiving;
    w->t_start = now_s();
    pthread_mutex_unlock(&h->wmu);
}

/* ---- answers: chat and completions -------------------------------------- */

typedef struct {
    srv_http_t *h;
    srv_kind_t kind;
    char id[48];
    time_t created;
    char model[256];
    int include_usage;
    int logprobs, top_logprobs;
    size_t text_off; /* completions' logprobs text_offset */
} answer_t;

/* OpenAI's chat logprobs entry for one token. */
static cJSON *chat_lp_entry(const srv_token_t *t, int top) {
    cJSON *e = cJSON_CreateObject();
    size_t tl = t->text_len < sizeof t->text ? t->text_len : sizeof t->text - 1;
    cJSON_AddItemToObject(e, "token", json_text(t->text, tl));
    cJSON_AddNumberToObject(e, "logprob", isfinite(t->logprob) ? t->logprob : -9999.0);
    cJSON_AddItemToObject(e, "bytes", json_bytes(t->text, tl));
    cJSON *ta = cJSON_AddArrayToObject(e, "top_logprobs");
    int nt = t->n_top < top ? t->n_top : top;
    for (int i = 0; i < nt && i < SRV_MAX_TOP_LOGPROBS; i++) {
        cJSON *x = cJSON_CreateObject();
        size_t l = strnlen(t->top_text[i], sizeof t->top_text[i]);
        cJSON_AddItemToObject(x, "token", json_text(t->top_text[i], l));
        cJSON_AddNumberToObject(x, "logprob", isfinite(t->top_logprob[i]) ? t->top_logprob[i] : -9999.0);
        cJSON_AddItemToObject(x, "bytes", json_bytes(t->top_text[i], l));
        cJSON_AddItemToArray(ta, x);
    }
    return e;
}

/* The logprobs object of a choice for n tokens (NULL: JSON null). */
static cJSON *logprobs_obj(answer_t *a, const srv_token_t *t, int32_t n) {
    if (!a->logprobs) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (a->kind == SRV_KIND_CHAT) {
        cJSON *arr = cJSON_AddArrayToObject(o, "content");
        for (int32_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, chat_lp_entry(&t[i], a->top_logprobs));
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int32_t i = 0; i < n; i++) {
        size_t tl = t[i].text_len < sizeof t[i].text ? t[i].text_len : sizeof t[i].text - 1;
        cJSON_AddItemToArray(toks, json_text(t[i].text, tl));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(isfinite(t[i].logprob) ? t[i].logprob : -9999.0));
        cJSON *top = cJSON_CreateObject();
        int nt = t[i].n_top < a->top_logprobs ? t[i].n_top : a->top_logprobs;
        for (int k = 0; k < nt && k < SRV_MAX_TOP_LOGPROBS; k++) {
            char key[64];
            cJSON *ks = json_text(t[i].top_text[k], strnlen(t[i].top_text[k], sizeof t[i].top_text[k]));
            snprintf(key, sizeof key, "%s", ks && ks->valuestring ? ks->valuestring : "");
            cJSON_Delete(ks);
            if (!cJSON_GetObjectItemCaseSensitive(top, key))
                cJSON_AddNumberToObject(top, key, isfinite(t[i].top_logprob[k]) ? t[i].top_logprob[k] : -9999.0);
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)a->text_off));
        a->text_off += tl;
    }
    return o;
}

static cJSON *usage_obj(const srv_usage_t *u) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", (double)u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    return o;
}

static double ratio(double a, double b) { return b > 0 && isfinite(a / b) ? a / b : 0.0; }

/* llama-server's timings. */
static cJSON *timings_obj(const srv_usage_t *u) {
    cJSON *o = cJSON_CreateObject();
    double pn = (double)u->prompt_tokens - u->cached_tokens, gn = u->completion_tokens;
    if (pn < 0) pn = 0;
    cJSON_AddNumberToObject(o, "prompt_n", pn);
    cJSON_AddNumberToObject(o, "prompt_ms", u->prompt_ms);
    cJSON_AddNumberToObject(o, "prompt_per_token_ms", ratio(u->prompt_ms, pn));
    cJSON_AddNumberToObject(o, "prompt_per_second", ratio(1e3 * pn, u->prompt_ms));
    cJSON_AddNumberToObject(o, "predicted_n", gn);
    cJSON_AddNumberToObject(o, "predicted_ms", u->predicted_ms);
    cJSON_AddNumberToObject(o, "predicted_per_token_ms", ratio(u->predicted_ms, gn));
    cJSON_AddNumberToObject(o, "predicted_per_second", ratio(1e3 * gn, u->predicted_ms));
    cJSON_AddNumberToObject(o, "cache_n", u->cached_tokens);
    if (u->draft_n > 0) { /* llama-server's names, present when drafts were evaluated */
        cJSON_AddNumberToObject(o, "draft_n", u->draft_n);
        cJSON_AddNumberToObject(o, "draft_n_accepted", u->draft_n_accepted);
    }
    return o;
}

static cJSON *answer_head(const answer_t *a, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", a->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)a->created);
    cJSON_AddItemToObject(o, "model", json_text(a->model, strlen(a->model)));
    cJSON_AddStringToObject(o, "system_fingerprint", "tern-" TERN_VERSION);
    return o;
}

/* ---- streaming ------------------------------------------------------------ */

typedef struct {
    answer_t a;
    srv_job_t *job;
    buf_t out;       /* SSE bytes not yet handed to libmicrohttpd */
    size_t off;
    int started, finished;
    int has_first;      /* first: the update that came before the headers went out */
    srv_update_t first;
    double t_start, t_last;
} stream_t;

/* One update into SSE events. */
static void sse_done(stream_t *st, const srv_update_t *u);
static void sse_chunk(stream_t *st, const char *text, size_t len, int role, const srv_token_t *toks, int32_t n_toks,
                      const char *finish, const srv_usage_t *timings);
static void sse_update(stream_t *st, srv_update_t *u) {
    if (u->len || (u->n_toks && st->a.logprobs))
        sse_chunk(st, u->text ? u->text : "", u->len, 0, u->toks, u->n_toks, NULL, NULL);
    if (u->done) sse_done(st, u);
    free(u->text);
    free(u->toks);
    u->text = NULL;
    u->toks = NULL;
}

static void sse_json(stream_t *st, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) {
        st->out.oom = 1;
        return;
    }
    buf_puts(&st->out, "data: ");
    buf_puts(&st->out, s);
    buf_puts(&st->out, "\n\n");
    free(s);
}

/* A chunk with one choice: delta/text, logprobs, finish_reason. */
static void sse_chunk(stream_t *st, const char *text, size_t len, int role, const srv_token_t *toks, int32_t n_toks,
                      const char *finish, const srv_usage_t *timings) {
    answer_t *a = &st->a;
    int chat = a->kind == SRV_KIND_CHAT;
    cJSON *o = answer_head(a, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddItemToObject(d, "content", json_text(text, len));
    } else {
        cJSON_AddItemToObject(c, "text", json_text(text ? text : "", text ? len : 0));
    }
    cJSON_AddItemToObject(c, "logprobs", toks && n_toks ? logprobs_obj(a, toks, n_toks) : cJSON_CreateNull());
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(ch, c);
    if (a->include_usage) cJSON_AddNullToObject(o, "usage");
    if (timings) cJSON_AddItemToObject(o, "timings", timings_obj(timings));
    sse_json(st, o);
}

static void sse_done(stream_t *st, const srv_update_t *u) {
    if (!u->finish) {
        /* An error after the answer started: an error event, no [DONE]. */
        unsigned status = u->err_status ? (unsigned)u->err_status : 500;
        sse_json(st, error_obj(status, u->err[0] ? u->err : "generation failed", NULL, NULL));
        st->finished = 1;
        return;
    }
    sse_chunk(st, st->a.kind == SRV_KIND_CHAT ? NULL : "", 0, 0, NULL, 0, u->finish, &u->usage);
    if (st->a.include_usage) {
        cJSON *o = answer_head(&st->a, st->a.kind == SRV_KIND_CHAT ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_obj(&u->usage));
        sse_json(st, o);
    }
    buf_puts(&st->out, "data: [DONE]\n\n");
    st->finished = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_t *st = cls;
    for (;;) {
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->off < st->out.n) {
            size_t n = st->out.n - st->off;
            if (n > max) n = max;
            memcpy(buf, st->out.p + st->off, n);
            st->off += n;
            if (st->off == st->out.n) st->off = st->out.n = 0;
            st->t_last = now_s();
            return (ssize_t)n;
        }
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!st->started) {
            st->started = 1;
            if (st->a.kind == SRV_KIND_CHAT) sse_chunk(st, "", 0, 1, NULL, 0, NULL, NULL);
            if (st->has_first) {
                st->has_first = 0;
                sse_update(st, &st->first);
            }
            continue;
        }
        srv_update_t u;
        if (srv_job_next(st->job, WAIT_STEP_MS, &u)) {
            sse_update(st, &u);
            continue;
        }
        double t = now_s();
        if (st->a.h->req_timeout_s > 0 && t - st->t_start > st->a.h->req_timeout_s + TIMEOUT_GRACE_S) {
            srv_update_t e;
            memset(&e, 0, sizeof e);
            e.err_status = 504;
            snprintf(e.err, sizeof e.err, "the request ran past the server's time limit (--timeout %.0f s)",
                     st->a.h->req_timeout_s);
            sse_done(st, &e);
            continue;
        }
        if ((t - st->t_last) * 1e3 >= st->a.h->ping_ms) buf_puts(&st->out, ": ping\n\n");
    }
}

static void stream_free(void *cls) {
    stream_t *st = cls;
    srv_job_release(st->job); /* cancels it when it still runs */
    if (st->has_first) {
        free(st->first.text);
        free(st->first.toks);
    }
    free(st->out.p);
    free(st);
}

static enum MHD_Result answer_stream(struct MHD_Connection *c, answer_t *a, srv_job_t *job) {
    stream_t *st = calloc(1, sizeof *st);
    if (!st) {
        srv_job_release(job);
        return send_error(c, 500, "Out of memory", NULL, NULL);
    }
    st->a = *a;
    st->job = job;
    st->t_start = st->t_last = now_s();
    /* A request the scheduler refuses at once (a session busy, sampling
     * that cannot be set up ...) still gets its HTTP status: wait a moment
     * for the first news before the 200 goes out. */
    if (srv_job_next(job, WAIT_STEP_MS, &st->first)) {
        if (st->first.done && !st->first.finish) {
            unsigned status = st->first.err_status ? (unsigned)st->first.err_status : 500;
            char m[sizeof st->first.err];
            memcpy(m, st->first.err, sizeof m);
            free(st->first.text);
            free(st->first.toks);
            free(st);
            srv_job_release(job);
            return send_error(c, status, m[0] ? m : "generation failed", NULL, NULL);
        }
        st->has_first = 1;
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    add_common_headers(r);
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r); /* on failure this frees st and releases the job */
    return ret;
}

/* The client hung up (or the watchdog closed the socket). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return 1;
    if (p.revents & POLLIN) {
        char b;
        ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0;
    }
    return 0;
}

static enum MHD_Result answer_whole(struct MHD_Connection *c, answer_t *a, srv_job_t *job) {
    srv_http_t *h = a->h;
    buf_t text = {0};
    buf_put(&text, "", 0);
    srv_token_t *toks = NULL;
    int32_t n_toks = 0, cap_toks = 0;
    srv_update_t fin;
    memset(&fin, 0, sizeof fin);
    double t0 = now_s(), t_check = t0;
    int gone = 0, oom = 0, timed_out = 0;
    for (;;) {
        /* Every step, news or not: a job that keeps producing must still
         * notice the client going away. */
        double t = now_s();
        if (t - t_check >= WAIT_STEP_MS * 1e-3) {
            t_check = t;
            if (client_gone(c)) {
                gone = 1;
                break;
            }
            if (h->req_timeout_s > 0 && t - t0 > h->req_timeout_s + TIMEOUT_GRACE_S) {
                timed_out = 1;
                break;
            }
        }
        srv_update_t u;
        if (srv_job_next(job, WAIT_STEP_MS, &u)) {
            buf_put(&text, u.text, u.len);
            if (u.n_toks && a->logprobs && !oom) {
                if (n_toks > INT32_MAX - u.n_toks) {
                    oom = 1;
                } else if (n_toks + u.n_toks > cap_toks) {
                    int32_t nc = cap_toks ? cap_toks : 64;
                    while (nc < n_toks + u.n_toks && nc < INT32_MAX / 2) nc *= 2;
                    srv_token_t *q = nc >= n_toks + u.n_toks ? realloc(toks, (size_t)nc * sizeof *toks) : NULL;
                    if (!q) oom = 1;
                    else toks = q, cap_toks = nc;
                }
                if (!oom) {
                    memcpy(toks + n_toks, u.toks, (size_t)u.n_toks * sizeof *toks);
                    n_toks += u.n_toks;
                }
            }
            free(u.text);
            free(u.toks);
            if (u.done) {
                fin = u;
                break;
            }
            continue;
        }
        t_check = 0; /* nothing came: check at once */
    }
    srv_job_release(job);
    enum MHD_Result ret;
    if (gone) {
        ret = MHD_NO; /* close the connection: nobody is listening */
    } else if (timed_out) {
        char m[160];
        snprintf(m, sizeof m, "the request ran past the server's time limit (--timeout %.0f s)", h->req_timeout_s);
        ret = send_error(c, 504, m, NULL, NULL);
    } else if (text.oom || oom) {
        ret = send_error(c, 500, "Out of memory", NULL, NULL);
    } else if (!fin.finish) {
        ret = send_error(c, fin.err_status ? (unsigned)fin.err_status : 500, fin.err[0] ? fin.err : "generation failed",
                         NULL, NULL);
    } else {
        int chat = a->kind == SRV_KIND_CHAT;
        cJSON *o = answer_head(a, chat ? "chat.completion" : "text_completion");
        cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *cc = cJSON_CreateObject();
        cJSON_AddNumberToObject(cc, "index", 0);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(cc, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddItemToObject(m, "content", json_text(text.p, text.n));
        } else {
            cJSON_AddItemToObject(cc, "text", json_text(text.p, text.n));
        }
        cJSON_AddItemToObject(cc, "logprobs", logprobs_obj(a, toks, n_toks));
        cJSON_AddStringToObject(cc, "finish_reason", fin.finish);
        cJSON_AddItemToArray(ch, cc);
        cJSON_AddItemToObject(o, "usage", usage_obj(&fin.usage));
        cJSON_AddItemToObject(o, "timings", timings_obj(&fin.usage));
        /* The wait may have outlasted the idle timeout: restart its clock. */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->o.conn_timeout_s);
        ret = send_json(c, 200, o);
    }
    free(text.p);
    free(toks);
    return ret;
}

static enum MHD_Result handle_generate(srv_http_t *h, struct MHD_Connection *c, req_t *q, srv_kind_t kind) {
    char msg[512], pbuf[64];
    if (atomic_load(&h->stopping)) return send_error(c, 503, "the server is shutting down", NULL, NULL);
    srv_request_t *r = malloc(sizeof *r);
    if (!r) return send_error(c, 500, "Out of memory", NULL, NULL);
    int st = srv_request_parse(kind, q->body, q->len, &h->lim, r, msg, sizeof msg);
    if (st) {
        free(r);
        return send_error(c, (unsigned)st, msg, param_of(msg, pbuf, sizeof pbuf), NULL);
    }
    const char *hs = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Session-Id");
    const char *bad = NULL, *bad_param = NULL;
    if (hs) {
        if (!srv_session_id_valid(hs))
            bad = "X-Session-Id: not a valid session id (want 1 to 64 characters of A-Z a-z 0-9 _ -)", bad_param = "X-Session-Id";
        else if (r->session[0] && strcmp(r->session, hs) != 0)
            bad = "session_id: the body's session_id and the X-Session-Id header differ", bad_param = "session_id";
        else
            snprintf(r->session, sizeof r->session, "%s", hs);
    }
    if (!bad && r->session[0] && !h->sessions_dir)
        bad = "sessions are not enabled: start tern serve with --sessions DIR", bad_param = "session_id";
    if (bad) {
        srv_request_free(r);
        free(r);
        return send_error(c, 400, bad, bad_param, NULL);
    }
    st = srv_request_prepare(h->m, r, &h->lim, msg, sizeof msg);
    if (st) {
        srv_request_free(r);
        free(r);
        return send_error(c, (unsigned)st, msg, param_of(msg, pbuf, sizeof pbuf), NULL);
    }
    answer_t a;
    memset(&a, 0, sizeof a);
    a.h = h;
    a.kind = kind;
    random_id(a.id, sizeof a.id, kind == SRV_KIND_CHAT ? "chatcmpl-" : "cmpl-");
    a.created = time(NULL);
    snprintf(a.model, sizeof a.model, "%s", r->model[0] ? r->model : h->model_id);
    a.include_usage = r->include_usage;
    a.logprobs = r->logprobs;
    a.top_logprobs = r->top_logprobs;
    int stream = r->stream;
    int status = 500;
    msg[0] = 0;
    srv_job_t *job = srv_sched_submit(h->s, r, &status, msg, sizeof msg); /* r is the job's now */
    if (!job) return send_error(c, (unsigned)status, msg[0] ? msg : "the request was not accepted", NULL, NULL);
    return stream ? answer_stream(c, &a, job) : answer_whole(c, &a, job);
}

/* ---- the other endpoints ------------------------------------------------- */

static cJSON *parse_body(const req_t *q, struct MHD_Connection *c, enum MHD_Result *ret) {
    if (!q->len) {
        *ret = send_error(c, 400, "The request body is empty; send a JSON object", NULL, NULL);
        return NULL;
    }
    if (!json_depth_ok(q->body, q->len, 32)) {
        *ret = send_error(c, 400, "Invalid JSON: nested deeper than 32 levels", NULL, NULL);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(q->body, q->len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        *ret = send_error(c, 400, "The request body must be a JSON object", NULL, NULL);
        return NULL;
    }
    return j;
}

static int opt_bool(const cJSON *o, const char *name, int def, int *out) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!f || cJSON_IsNull(f)) {
        *out = def;
        return 1;
    }
    if (!cJSON_IsBool(f)) return 0;
    *out = cJSON_IsTrue(f);
    return 1;
}

/* The text of one token as it reads inside a text: the detokenizer drops
 * the leading space of a text's first piece, so a plain token (primer, or
 * -1: none) goes first and its text is discarded. */
static int token_piece(const tern_model_t *m, int32_t primer, int32_t id, char *out, size_t cap) {
    tern_detok_t *d = tern_detok_create(m, NULL);
    if (!d) return -1;
    if (primer >= 0 && tern_detok_push(d, primer, out, cap) < 0) {
        tern_detok_free(d);
        return -1;
    }
    int n = tern_detok_push(d, id, out, cap);
    int k = n >= 0 ? tern_detok_flush(d, out + n, cap - (size_t)n) : -1;
    tern_detok_free(d);
    return n >= 0 && k >= 0 ? n + k : -1;
}

static enum MHD_Result handle_tokenize(srv_http_t *h, struct MHD_Connection *c, const req_t *q) {
    enum MHD_Result ret = MHD_NO;
    cJSON *j = parse_body(q, c, &ret);
    if (!j) return ret;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "content");
    int add_special, parse_special, with_pieces;
    const char *bad = NULL, *param = NULL;
    if (!cJSON_IsString(ct) || !ct->valuestring) bad = "content: required, a string", param = "content";
    else if (!srv_utf8_valid(ct->valuestring, strlen(ct->valuestring))) bad = "content: not valid UTF-8", param = "content";
    else if (!opt_bool(j, "add_special", 0, &add_special)) bad = "add_special: must be true or false", param = "add_special";
    else if (!opt_bool(j, "parse_special", 1, &parse_special))
        bad = "parse_special: must be true or false", param = "parse_special";
    else if (!opt_bool(j, "with_pieces", 0, &with_pieces)) bad = "with_pieces: must be true or false", param = "with_pieces";
    if (bad) {
        cJSON_Delete(j);
        return send_error(c, 400, bad, param, NULL);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    tern_error_t err = {0};
    int rc = tern_tokenize(h->m, ct->valuestring, strlen(ct->valuestring), add_special ? tern_model_add_bos(h->m) : 0,
                           parse_special, &ids, &n, &err);
    cJSON_Delete(j);
    if (rc) return send_error(c, 500, err.msg, NULL, NULL);
    int32_t primer = -1;
    if (with_pieces) {
        int32_t *pi = NULL;
        size_t pn = 0;
        if (tern_tokenize(h->m, "a", 1, 0, 0, &pi, &pn, NULL) == 0 && pn == 1) primer = pi[0];
        free(pi);
    }
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < n; i++) {
        if (!with_pieces) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            continue;
        }
        char piece[512];
        int pl = token_piece(h->m, primer, ids[i], piece, sizeof piece);
        if (pl < 0) pl = 0;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", ids[i]);
        /* A piece that is not whole UTF-8 is given as its bytes. */
        if (srv_utf8_valid(piece, (size_t)pl) && !memchr(piece, 0, (size_t)pl)) cJSON_AddItemToObject(e, "piece", json_text(piece, (size_t)pl));
        else cJSON_AddItemToObject(e, "piece", json_bytes(piece, (size_t)pl));
        cJSON_AddItemToArray(arr, e);
    }
    free(ids);
    return send_json(c, 200, o);
}

static enum MHD_Result handle_detokenize(srv_http_t *h, struct MHD_Connection *c, const req_t *q) {
    enum MHD_Result ret = MHD_NO;
    cJSON *j = parse_body(q, c, &ret);
    if (!j) return ret;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens"), *e;
    int32_t nv = tern_model_n_vocab(h->m);
    char m[160];
    if (!cJSON_IsArray(t)) {
        cJSON_Delete(j);
        return send_error(c, 400, "tokens: required, an array of token ids", "tokens", NULL);
    }
    size_t i = 0;
    cJSON_ArrayForEach(e, t) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!isfinite(v) || v != floor(v) || v < 0 || v >= nv) {
            snprintf(m, sizeof m, "tokens[%zu]: not a token id of this model (0..%d)", i, nv - 1);
            cJSON_Delete(j);
            return send_error(c, 400, m, "tokens", NULL);
        }
        i++;
    }
    tern_error_t err = {0};
    tern_detok_t *d = tern_detok_create(h->m, &err);
    if (!d) {
        cJSON_Delete(j);
        return send_error(c, 500, err.msg, NULL, NULL);
    }
    buf_t b = {0};
    buf_put(&b, "", 0);
    char piece[512];
    cJSON_ArrayForEach(e, t) {
        int n = tern_detok_push(d, (int32_t)e->valuedouble, piece, sizeof piece);
        if (n > 0) buf_put(&b, piece, (size_t)n);
    }
    int n = tern_detok_flush(d, piece, sizeof piece);
    if (n > 0) buf_put(&b, piece, (size_t)n);
    tern_detok_free(d);
    cJSON_Delete(j);
    if (b.oom) {
        free(b.p);
        return send_error(c, 500, "Out of memory", NULL, NULL);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "content", json_text(b.p, b.n));
    free(b.p);
    return send_json(c, 200, o);
}

static enum MHD_Result handle_models(srv_http_t *h, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *arr = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToObject(m, "id", json_text(h->model_id, strlen(h->model_id)));
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->created);
    cJSON_AddStringToObject(m, "owned_by", "tern");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddStringToObject(meta, "arch", tern_model_arch(h->m));
    cJSON_AddStringToObject(meta, "type", tern_model_type_name(h->m));
    cJSON_AddNumberToObject(meta, "n_vocab", tern_model_n_vocab(h->m));
    cJSON_AddNumberToObject(meta, "n_ctx_train", tern_model_n_ctx_train(h->m));
    cJSON_AddNumberToObject(meta, "n_ctx", srv_sched_n_ctx(h->s));
    cJSON_AddNumberToObject(meta, "n_embd", tern_model_n_embd(h->m));
    cJSON_AddNumberToObject(meta, "n_params", (double)tern_model_n_params(h->m));
    cJSON_AddNumberToObject(meta, "size", (double)tern_model_file_size(h->m));
    cJSON_AddItemToArray(arr, m);
    return send_json(c, 200, o);
}

/* ---- routing -------------------------------------------------------------- */

static int route_of(const char *url) {
    static const struct {
        const char *path;
        int route;
    } t[] = {
        {"/", R_PAGE},
        {"/index.html", R_PAGE},
        {"/favicon.ico", R_FAVICON},
        {"/health", R_HEALTH},
        {"/v1/health", R_HEALTH},
        {"/v1/models", R_MODELS},
        {"/models", R_MODELS},
        {"/metrics", R_METRICS},
        {"/v1/chat/completions", R_CHAT},
        {"/chat/completions", R_CHAT},
        {"/v1/completions", R_COMPL},
        {"/completions", R_COMPL},
        {"/tokenize", R_TOKENIZE},
        {"/detokenize", R_DETOKENIZE},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(url, t[i].path)) return t[i].route;
    return R_NONE;
}

static int route_is_get(int r) { return r == R_PAGE || r == R_FAVICON || r == R_HEALTH || r == R_MODELS || r == R_METRICS; }

/* The answer a request gets before its body is read, or MHD_NO-free 0. */
static int early_answer(srv_http_t *h, struct MHD_Connection *c, req_t *q, const char *url, const char *method,
                        enum MHD_Result *ret) {
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int post = !strcmp(method, "POST");
    int options = !strcmp(method, "OPTIONS");
    if (q->route == R_NONE) {
        char m[320];
        size_t ul = strlen(url);
        snprintf(m, sizeof m, "no endpoint %s %s", method, ul <= 200 && srv_utf8_valid(url, ul) ? url : "(path)");
        *ret = send_error(c, 404, m, NULL, NULL);
        return 1;
    }
    if (options) {
        /* CORS preflight: browsers send no credentials with it. */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r) {
            *ret = MHD_NO;
            return 1;
        }
        add_common_headers(r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type, X-Session-Id");
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
        *ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return 1;
    }
    if (route_is_get(q->route) ? !get : !post) {
        char m[160];
        snprintf(m, sizeof m, "%s needs %s, not %.16s", url, route_is_get(q->route) ? "GET" : "POST", method);
        *ret = send_error(c, 405, m, NULL, NULL);
        return 1;
    }
    if (q->route == R_PAGE || q->route == R_FAVICON) return 0;
    if (q->route == R_HEALTH) return 0;
    if (!authorized(h, c)) {
        *ret = send_error(c, 401, "Invalid or missing API key: send the header Authorization: Bearer KEY", NULL,
                          "invalid_api_key");
        return 1;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        if (errno == ERANGE || v > h->o.max_body) {
            char m[160];
            snprintf(m, sizeof m, "The request body is larger than the limit of %zu bytes (--max-body)", h->o.max_body);
            *ret = send_error(c, 413, m, NULL, NULL);
            return 1;
        }
    }
    if (!atomic_load_explicit(&h->ready, memory_order_acquire)) {
        *ret = send_error(c, 503, "Loading model", NULL, NULL);
        return 1;
    }
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_http_t *h = cls;
    req_t *q = *con_cls;
    if (!q) {
        if (!(q = calloc(1, sizeof *q))) return MHD_NO;
        *con_cls = q;
        q->route = route_of(url);
        enum MHD_Result ret;
        if (early_answer(h, c, q, url, method, &ret)) {
            watch_set(h, c, 0);
            return ret;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (q->too_large || n > h->o.max_body - q->len) {
            q->too_large = 1;
            q->discarded += n;
            /* A client that goes on and on is cut off. */
            return q->discarded > h->o.max_body + (16u << 20) ? MHD_NO : MHD_YES;
        }
        if (q->len + n + 1 > q->cap) {
            size_t nc = q->cap ? q->cap : 4096;
            while (nc < q->len + n + 1) nc *= 2;
            if (nc > h->o.max_body + 1) nc = h->o.max_body + 1;
            char *b = realloc(q->body, nc);
            if (!b) return MHD_NO;
            q->body = b;
            q->cap = nc;
        }
        memcpy(q->body + q->len, upload, n);
        q->len += n;
        q->body[q->len] = 0;
        return MHD_YES;
    }
    /* The request is whole. */
    watch_set(h, c, 0);
    if (q->too_large) {
        char m[160];
        snprintf(m, sizeof m, "The request body is larger than the limit of %zu bytes (--max-body)", h->o.max_body);
        return send_error(c, 413, m, NULL, NULL);
    }
    int ready = atomic_load_explicit(&h->ready, memory_order_acquire);
    switch (q->route) {
    case R_PAGE:
        return send_buf(c, 200, "text/html; charset=utf-8", (char *)srv_webui_html, srv_webui_html_len,
                        MHD_RESPMEM_PERSISTENT);
    case R_FAVICON: /* browsers ask for it; no icon, and no 404 in their console */
        return send_buf(c, 204, NULL, (char *)"", 0, MHD_RESPMEM_PERSISTENT);
    case R_HEALTH: {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", ready ? "ok" : "loading model");
        return send_json(c, ready ? 200 : 503, o);
    }
    case R_MODELS: return handle_models(h, c);
    case R_METRICS: {
        char *s = srv_sched_metrics(h->s);
        if (!s) return send_error(c, 500, "Out of memory", NULL, NULL);
        return send_buf(c, 200, "text/plain; version=0.0.4; charset=utf-8", s, strlen(s), MHD_RESPMEM_MUST_FREE);
    }
    case R_CHAT: return handle_generate(h, c, q, SRV_KIND_CHAT);
    case R_COMPL: return handle_generate(h, c, q, SRV_KIND_COMPLETION);
    case R_TOKENIZE: return handle_tokenize(h, c, q);
    case R_DETOKENIZE: return handle_detokenize(h, c, q);
    default: return send_error(c, 404, "no such endpoint", NULL, NULL);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    srv_http_t *h = cls;
    req_t *q = *con_cls;
    if (q) {
        free(q->body);
        free(q);
        *con_cls = NULL;
    }
    watch_set(h, c, 1); /* the next request on this connection */
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    fprintf(stderr, "tern serve: http: %s\n", line);
}

/* ---- the server ------------------------------------------------------------ */

srv_http_t *srv_http_start(const srv_http_opts_t *o, const char *model_id, const char *sessions_dir,
                           double request_timeout_s, char *msg, size_t msg_cap) {
    srv_http_t *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(msg, msg_cap, "out of memory");
        return NULL;
    }
    h->o = *o;
    h->quiesced_fd = MHD_INVALID_SOCKET;
    snprintf(h->host, sizeof h->host, "%s", o->host && *o->host ? o->host : "127.0.0.1");
    h->o.host = h->host;
    if (!h->o.max_body) h->o.max_body = 4u << 20;
    if (!h->o.max_conns) h->o.max_conns = 64;
    if (!h->o.conn_timeout_s) h->o.conn_timeout_s = 30;
    if (o->api_key && *o->api_key) {
        h->api_key = strdup(o->api_key);
        h->api_key_len = h->api_key ? strlen(h->api_key) : 0;
    }
    snprintf(h->model_id, sizeof h->model_id, "%s", model_id ? model_id : "model");
    h->sessions_dir = sessions_dir ? strdup(sessions_dir) : NULL;
    h->req_timeout_s = request_timeout_s;
    h->ping_ms = PING_MS;
    if ((int)h->o.conn_timeout_s * 1000 / 2 < h->ping_ms) h->ping_ms = (int)h->o.conn_timeout_s * 1000 / 2;
    if (h->ping_ms < WAIT_STEP_MS) h->ping_ms = WAIT_STEP_MS;
    h->created = time(NULL);
    h->lim = o->lim;
    pthread_mutex_init(&h->wmu, NULL);
    pthread_cond_init(&h->wcv, NULL);
    if ((o->api_key && !h->api_key) || (sessions_dir && !h->sessions_dir)) {
        snprintf(msg, msg_cap, "out of memory");
        srv_http_stop(h);
        return NULL;
    }

    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gr = getaddrinfo(h->host, port, &hints, &ai);
    if (gr != 0 || !ai) {
        snprintf(msg, msg_cap, "--host %s: %s", h->host, gai_strerror(gr));
        if (ai) freeaddrinfo(ai);
        srv_http_stop(h);
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG |
                     MHD_USE_ITC | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (pthread_create(&h->wth, NULL, watchdog_main, h) == 0) h->wth_started = 1;
    h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, h->o.max_conns, MHD_OPTION_CONNECTION_TIMEOUT,
                            h->o.conn_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64u << 10),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
                            h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        snprintf(msg, msg_cap, "cannot listen on %s:%d (in use, or not an address of this machine?)", h->host, o->port);
        srv_http_stop(h);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    return h;
}

int srv_http_port(const srv_http_t *h) { return h->port; }

void srv_http_set_ready(srv_http_t *h, const tern_model_t *m, srv_sched_t *s) {
    h->m = m;
    h->s = s;
    if (h->lim.max_prompt_tokens <= 0) h->lim.max_prompt_tokens = srv_sched_n_ctx(s);
    atomic_store_explicit(&h->ready, 1, memory_order_release);
}

void srv_http_quiesce(srv_http_t *h) {
    atomic_store(&h->stopping, 1);
    if (h->d && h->quiesced_fd == MHD_INVALID_SOCKET) h->quiesced_fd = MHD_quiesce_daemon(h->d);
}

void srv_http_stop(srv_http_t *h) {
    if (!h) return;
    if (h->d) {
        srv_http_quiesce(h);
        MHD_stop_daemon(h->d);
        if (h->quiesced_fd != MHD_INVALID_SOCKET) close(h->quiesced_fd);
    }
    if (h->wth_started) {
        pthread_mutex_lock(&h->wmu);
        h->wstop = 1;
        pthread_cond_signal(&h->wcv);
        pthread_mutex_unlock(&h->wmu);
        pthread_join(h->wth, NULL);
    }
    pthread_mutex_destroy(&h->wmu);
    pthread_cond_destroy(&h->wcv);
    free(h->api_key);
    free(h->sessions_dir);
    free(h);
}
