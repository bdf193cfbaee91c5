/* http.h - the HTTP side of `tern serve` (http.c), as cmd_serve.c drives
 * it: listen first, answer 503 while the model loads, then serve; on a
 * signal stop taking connections, let the answers finish, stop. */
#ifndef TERN_SRV_HTTP_H
#define TERN_SRV_HTTP_H

#include "srv.h"

typedef struct srv_http srv_http_t;

/* Start listening on o->host:o->port (every endpoint but /health and the
 * page answers 503 until srv_http_set_ready). model_id: the id /v1/models
 * reports; sessions_dir: NULL when --sessions is off (requests with a
 * session id then get a 400); request_timeout_s: the per-request wall time
 * (0: none), a backstop behind the scheduler's own. NULL with msg on error. */
srv_http_t *srv_http_start(const srv_http_opts_t *o, const char *model_id, const char *sessions_dir,
                           double request_timeout_s, char *msg, size_t msg_cap);
/* The port actually bound (o->port 0 picks a free one). */
int srv_http_port(const srv_http_t *h);
/* The model is loaded and the scheduler runs: serve. m and s must outlive
 * srv_http_stop. */
void srv_http_set_ready(srv_http_t *h, const tern_model_t *m, srv_sched_t *s);
/* Stop accepting connections; new requests on open ones get a 503. */
void srv_http_quiesce(srv_http_t *h);
/* Close every connection and free h (after the scheduler has stopped, so
 * that every answer in flight has ended). */
void srv_http_stop(srv_http_t *h);

#endif
