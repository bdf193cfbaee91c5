/* cmd_serve.c - `tern serve`: the options, the model, the signals.
 *
 * Order: listen first (GET /health answers 503 "loading model" meanwhile),
 * load the model, start the scheduler, serve until SIGINT or SIGTERM. Then:
 * stop accepting connections, let the running requests finish (the
 * scheduler cancels what still runs after SRV_SHUTDOWN_GRACE_S seconds, or
 * at once on a second signal), close the connections, free everything,
 * exit 0. The signals are taken by sigtimedwait on the main thread (they
 * are blocked in every thread), so no handler runs in a server thread. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cmds.h"
#include "model_args.h"
#include "server/http.h"
#include "srv.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern serve -m FILE [options]\n"
            "OpenAI-compatible HTTP server (docs/SERVER.md): /v1/chat/completions, /v1/completions,\n"
            "/v1/models, /health, /metrics, /tokenize, /detokenize, and a chat page at /.\n"
            "\n"
            "  -m, --model FILE       GGUF model (required)\n"
            "  --alias NAME           model id in /v1/models and answers (default: the file's name)\n"
            "  --host ADDR            address to listen on (default 127.0.0.1)\n"
            "  --port N               port (default 8080; 0 picks a free one)\n"
            "  -c, --ctx-size N       KV positions, ONE budget shared by all requests (default: the\n"
            "                         model's, capped to fit memory); also the longest prompt\n"
            "  -np, --parallel N      requests decoding at once (default 8)\n"
            "  --queue N              requests waiting beyond those (default 64; more get a 503)\n"
            "  -t, --threads N        threads (default: tern's choice, see tern info --threads)\n"
            "  -b, --batch N          positions per forward block (default 512)\n"
            "  --prefill-chunk N      prompt positions per step, all requests together (default 256)\n"
            "  --cache-seqs N         finished conversations kept for prefix reuse (default 16)\n"
            "  --kv-block N           positions per KV memory block (default 32)\n"
            "  --sessions DIR         enable X-Session-Id / session_id: conversations saved in DIR\n"
            "                         (created if absent)\n"
            "  --spec MODE            speculative decoding: ngram (drafts looked up in the text so far,\n"
            "                         verified in the batch, used where measured to pay), ngram-fixed\n"
            "                         (drafts in every step, for measurements), off (default);\n"
            "                         the answers are the same as without it\n"
            "  --draft-max N          most drafts per request and step, 1..32 (default 8)\n"
            "  --spec-ngram N         longest n-gram looked up for drafts, 1..16 (default 4)\n"
            "  --api-key KEY          require Authorization: Bearer KEY (all but /health and /)\n"
            "  --api-key-file F       the same, the key read from file F (first line)\n"
            "  --max-body BYTES       largest request body (default 4M; K and M suffixes)\n"
            "  --max-messages N       most chat messages in one request (default 512)\n"
            "  --max-conns N          open connections at most (default 64)\n"
            "  --timeout SEC          wall time of one request (default 600; 0: none)\n"
            "  --conn-timeout SEC     a client must send its request within SEC, and an idle\n"
            "                         connection is closed after SEC (default 30)\n"
            "  -h, --help             this text\n");
    model_args_usage(f, 0, 25);
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || errno || *end || v < lo || v > hi) {
        fprintf(stderr, "tern serve: %s wants an integer from %ld to %ld, got '%s'\n", opt, lo, hi, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_size(const char *opt, const char *s, size_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = s && *s != '-' ? strtoull(s, &end, 10) : 0;
    unsigned long long mul = 1;
    if (end && (*end == 'K' || *end == 'k')) mul = 1024, end++;
    else if (end && (*end == 'M' || *end == 'm')) mul = 1024 * 1024, end++;
    if (end && (*end == 'B' || *end == 'b')) end++;
    if (!s || !*s || !end || errno || *end || v == 0 || v > (1ull << 32) / mul) {
        fprintf(stderr, "tern serve: %s wants a size in bytes (K, M suffixes; at most 4G), got '%s'\n", opt,
                s ? s : "");
        return -1;
    }
    *out = (size_t)(v * mul);
    return 0;
}

/* The first line of a key file, without its line end and blanks. */
static char *read_key_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tern serve: --api-key-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char line[4096];
    char *k = fgets(line, sizeof line, f) ? line : NULL;
    fclose(f);
    if (k) {
        size_t n = strlen(k);
        while (n && strchr(" \t\r\n", k[n - 1])) k[--n] = 0;
        while (*k == ' ' || *k == '\t') k++;
    }
    if (!k || !*k) {
        fprintf(stderr, "tern serve: --api-key-file %s: no key in its first line\n", path);
        return NULL;
    }
    return strdup(k);
}

/* "dir/name.gguf" -> "name". */
static void model_id_of(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
    if (n == 0) b = path, n = strlen(path);
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), b);
}

typedef struct {
    srv_sched_t *s;
    sigset_t sigs;
    atomic_int done;
} second_t;

static void *second_signal(void *arg) {
    second_t *x = arg;
    struct timespec ts = {0, 100 * 1000000L};
    while (!atomic_load(&x->done)) {
        if (sigtimedwait(&x->sigs, NULL, &ts) > 0) {
            fprintf(stderr, "tern serve: second signal: cancelling the running requests\n");
            srv_sched_shutdown(x->s, 1);
            break;
        }
    }
    return NULL;
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *alias = NULL, *key_file = NULL;
    char *api_key = NULL;
    srv_http_opts_t ho;
    memset(&ho, 0, sizeof ho);
    ho.host = "127.0.0.1";
    ho.port = 8080;
    ho.max_body = 4u << 20;
    ho.max_conns = 64;
    ho.conn_timeout_s = 30;
    ho.lim.max_messages = 512;
    ho.lim.max_depth = 32;
    srv_sched_opts_t so;
    memset(&so, 0, sizeof so);
    so.parallel = 8;
    so.queue = 64;
    so.prefill_chunk = 256;
    so.cache_seqs = 16;
    so.request_timeout_s = 600;
    so.spec = SRV_SPEC_OFF; /* docs/SERVER.md: measured to cost a few percent at saturation */
    so.draft_max = 8;
    so.spec_ngram = 4;
    int rc = 2;
    model_args_t ma;
    model_args_init(&ma);

    for (int i = 1; i < argc; i++) {
        const int mr = model_args_take(&ma, "serve", argc, argv, &i);
        if (mr < 0) goto out;
        if (mr > 0) continue;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
#define NEED_ARG                                                                     \
    do {                                                                             \
        if (!v) {                                                                    \
            fprintf(stderr, "tern serve: %s needs a value (tern serve --help)\n", a); \
            goto out;                                                                \
        }                                                                            \
        i++;                                                                         \
    } while (0)
#define INT_OPT(lo, hi, dst)                                   \
    do {                                                       \
        NEED_ARG;                                              \
        if (parse_long(a, v, (lo), (hi), &n) < 0) goto out;    \
        dst = (int32_t)n;                                      \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED_ARG;
            model = v;
        } else if (!strcmp(a, "--alias")) {
            NEED_ARG;
            alias = v;
        } else if (!strcmp(a, "--host")) {
            NEED_ARG;
            ho.host = v;
        } else if (!strcmp(a, "--port")) {
            INT_OPT(0, 65535, ho.port);
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            INT_OPT(0, INT32_MAX, so.n_ctx);
        } else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
            INT_OPT(1, 1024, so.parallel);
        } else if (!strcmp(a, "--queue")) {
            INT_OPT(0, 1 << 20, so.queue);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            INT_OPT(0, 4096, so.n_threads);
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch") || !strcmp(a, "--batch-size")) {
            INT_OPT(1, 1 << 16, so.n_batch);
        } else if (!strcmp(a, "--prefill-chunk")) {
            INT_OPT(1, 1 << 20, so.prefill_chunk);
        } else if (!strcmp(a, "--cache-seqs")) {
            INT_OPT(0, 1024, so.cache_seqs);
        } else if (!strcmp(a, "--kv-block")) {
            INT_OPT(1, 1 << 16, so.kv_block);
        } else if (!strcmp(a, "--sessions")) {
            NEED_ARG;
            so.sessions_dir = v;
        } else if (!strcmp(a, "--spec")) {
            NEED_ARG;
            if (!strcmp(v, "ngram")) so.spec = SRV_SPEC_NGRAM;
            else if (!strcmp(v, "ngram-fixed")) so.spec = SRV_SPEC_FIXED;
            else if (!strcmp(v, "off")) so.spec = SRV_SPEC_OFF;
            else {
                fprintf(stderr, "tern serve: --spec wants ngram, ngram-fixed or off, got '%s'\n", v);
                goto out;
            }
        } else if (!strcmp(a, "--draft-max")) {
            INT_OPT(1, TERN_SPEC_DRAFT_MAX, so.draft_max);
        } else if (!strcmp(a, "--spec-ngram")) {
            INT_OPT(1, TERN_SPEC_NGRAM_MAX, so.spec_ngram);
        } else if (!strcmp(a, "--api-key")) {
            NEED_ARG;
            free(api_key);
            if (!*v) {
                fprintf(stderr, "tern serve: --api-key is empty\n");
                goto out;
            }
            api_key = strdup(v);
        } else if (!strcmp(a, "--api-key-file")) {
            NEED_ARG;
            key_file = v;
        } else if (!strcmp(a, "--max-body")) {
            NEED_ARG;
            if (parse_size(a, v, &ho.max_body) < 0) goto out;
        } else if (!strcmp(a, "--max-messages")) {
            INT_OPT(1, 1 << 20, ho.lim.max_messages);
        } else if (!strcmp(a, "--max-conns")) {
            INT_OPT(1, 65536, ho.max_conns);
        } else if (!strcmp(a, "--timeout")) {
            int32_t t = 0;
            INT_OPT(0, 7 * 24 * 3600, t);
            so.request_timeout_s = (double)t;
        } else if (!strcmp(a, "--conn-timeout")) {
            INT_OPT(1, 24 * 3600, ho.conn_timeout_s);
        } else {
            fprintf(stderr, "tern serve: unknown option '%s' (tern serve --help)\n", a);
            goto out;
        }
#undef INT_OPT
#undef NEED_ARG
    }
    if (!model) {
        fprintf(stderr, "tern serve: -m FILE is required (tern serve --help)\n");
        goto out;
    }
    if (key_file) {
        free(api_key);
        if (!(api_key = read_key_file(key_file))) goto out;
    }
    ho.api_key = api_key;
    if (so.sessions_dir) {
        struct stat st;
        if (mkdir(so.sessions_dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "tern serve: --sessions %s: %s\n", so.sessions_dir, strerror(errno));
            rc = 1;
            goto out;
        }
        if (stat(so.sessions_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "tern serve: --sessions %s: not a folder\n", so.sessions_dir);
            rc = 1;
            goto out;
        }
    }
    char model_id[256];
    if (alias) snprintf(model_id, sizeof model_id, "%s", alias);
    else model_id_of(model, model_id, sizeof model_id);

    /* Every thread started from here on inherits the blocked signals. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    rc = 1;
    char msg[512];
    srv_http_t *h = srv_http_start(&ho, model_id, so.sessions_dir, so.request_timeout_s, msg, sizeof msg);
    if (!h) {
        fprintf(stderr, "tern serve: %s\n", msg);
        goto out;
    }
    int port = srv_http_port(h);
    fprintf(stderr, "tern serve: loading %s (http://%s:%d/health answers 503 until it is loaded)\n", model, ho.host,
            port);
    tern_error_t err = {0};
    tern_model_t *m = model_args_load(model, &ma, "serve");
    srv_sched_t *s = NULL;
    if (!m) {
        srv_http_stop(h);
        goto out;
    }
    {
        /* Chat needs a template: say so when the model's is unknown. */
        tern_chat_msg_t probe = {"user", "hi"};
        char *out = NULL;
        tern_error_t e2 = {0};
        if (tern_chat_render(m, NULL, &probe, 1, 1, &out, &e2) == TERN_EUNSUP)
            fprintf(stderr, "tern serve: the model has no chat template tern knows: chat uses ChatML\n");
        free(out);
    }
    if (!(s = srv_sched_create(m, &so, &err))) {
        fprintf(stderr, "tern serve: %s\n", err.msg);
        srv_http_stop(h);
        tern_model_free(m);
        goto out;
    }
    if (srv_sched_note(s) && srv_sched_note(s)[0]) fprintf(stderr, "tern serve: %s\n", srv_sched_note(s));
    if (so.spec)
        fprintf(stderr,
                "tern serve: speculative decoding: n-gram drafts (up to %d per step, n-grams up to %d)%s\n",
                so.draft_max, so.spec_ngram,
                so.spec == SRV_SPEC_FIXED ? " in every step" : ", used where measured to pay (--spec off disables)");
    srv_http_set_ready(h, m, s);
    fprintf(stderr, "tern serve: listening on http://%s:%d (model %s, ctx %d shared by up to %d requests)\n", ho.host,
            port, model_id, srv_sched_n_ctx(s), so.parallel);
    if (!api_key && strcmp(ho.host, "127.0.0.1") != 0 && strcmp(ho.host, "localhost") != 0 && strcmp(ho.host, "::1") != 0)
        fprintf(stderr, "tern serve: warning: listening on %s without --api-key: anyone who reaches it can use it\n",
                ho.host);

    int sig;
    while ((sig = sigwaitinfo(&sigs, NULL)) < 0 && errno == EINTR) {
    }
    fprintf(stderr, "tern serve: %s: stopping (running requests get up to %d s; a second signal cancels them)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", SRV_SHUTDOWN_GRACE_S);
    srv_http_quiesce(h);
    /* The scheduler lets running requests finish (bounded by
     * SRV_SHUTDOWN_GRACE_S); a second signal meanwhile cancels them. */
    second_t sec = {.s = s, .sigs = sigs};
    pthread_t th;
    int th_ok = pthread_create(&th, NULL, second_signal, &sec) == 0;
    srv_sched_shutdown(s, 0);
    atomic_store(&sec.done, 1);
    if (th_ok) pthread_join(th, NULL);
    srv_http_stop(h);
    srv_sched_free(s);
    tern_model_free(m);
    fprintf(stderr, "tern serve: stopped\n");
    rc = 0;
out:
    free(api_key);
    return rc;
}
