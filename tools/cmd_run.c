/* cmd_run.c - `tern run` (generate text from a prompt, streaming) and
 * `tern chat` (interactive chat through the model's template, keeping the KV
 * cache across turns). Both print llama.cpp-style timings on stderr, also
 * after Ctrl-C (the first Ctrl-C stops generation cleanly, a second one
 * kills the process). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmds.h"
#include "run_args.h"
#include "tern.h"

static volatile sig_atomic_t g_stop;

static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
}

/* One-shot handler: the first Ctrl-C sets the flag; SA_RESETHAND restores
 * the default so a second one ends the process. No SA_RESTART: a read
 * blocked at the chat prompt returns EINTR. */
static void arm_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static int abort_cb(void *user) {
    (void)user;
    return g_stop != 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static tern_context_t *open_context(const tern_model_t *m, const run_opts_t *o) {
    tern_error_t err = {0};
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = o->n_threads;
    cp.n_ctx = o->n_ctx;
    cp.n_batch = o->n_batch;
    cp.kv_f32 = o->kv_f32;
    cp.profile = o->profile;
    tern_context_t *c = tern_context_create(m, &cp, &err);
    if (!c) {
        fprintf(stderr, "tern: %s\n", err.msg);
        return NULL;
    }
    if (tern_context_note(c)[0]) fprintf(stderr, "tern: %s\n", tern_context_note(c));
    tern_context_set_abort(c, abort_cb, NULL);
    return c;
}

/* ---- run ---- */

typedef struct {
    int print_ids;
    int n;
    const tern_context_t *c; /* set when hashing logits */
    int32_t n_vocab;
    uint64_t digest;
    int n_digested;
    const tern_model_t *m;
    const tern_context_t *ctx;
    run_gen_mark_t mark; /* the expert cache's figures at the first generated token */
} run_cb_t;

static int run_token(int32_t id, const char *text, size_t len, void *user) {
    run_cb_t *r = user;
    run_mark_generation(&r->mark, r->m, r->ctx);
    if (r->c && id >= 0) {
        /* FNV-1a over the raw bytes: any bit that differs changes it. */
        const unsigned char *b = (const unsigned char *)tern_get_logits(r->c);
        for (size_t i = 0; b && i < (size_t)r->n_vocab * sizeof(float); i++)
            r->digest = (r->digest ^ b[i]) * 0x100000001b3ull;
        r->n_digested++;
    }
    if (r->print_ids) {
        if (id >= 0) printf("%s%d", r->n++ ? " " : "", id);
    } else if (text && len) {
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return g_stop != 0;
}

int cmd_run(int argc, char **argv) {
    run_opts_t o;
    int prc = run_opts_parse(&o, argc, argv, "run");
    if (prc) return prc == 1 ? 0 : 2;
    double t0 = now_ms();
    tern_error_t err = {0};
    tern_model_t *m = run_load_model(&o, "run");
    if (!m) return 1;
    int rc = 1;
    tern_context_t *c = NULL;
    tern_sampler_t *s = NULL;
    tern_session_t *ses = NULL;
    tern_grammar_t *gram = NULL;
    tern_matcher_t *gmt = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *text = NULL;
    size_t len = 0;
    if (o.prompt_file) {
        if (!(text = run_read_file(o.prompt_file, &len))) goto out;
    } else if (o.prompt) {
        len = strlen(o.prompt);
    }
    const char *ptext = text ? text : o.prompt ? o.prompt : "";
    int add_bos = !o.no_bos && (tern_model_add_bos(m) || len == 0);
    if (tern_tokenize(m, ptext, len, add_bos, o.special, &ids, &n_ids, &err)) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto out;
    }
    if (n_ids == 0) {
        fprintf(stderr, "tern: the prompt is empty and the model has no BOS token to start from\n");
        goto out;
    }
    if (!(c = open_context(m, &o))) goto out;
    if ((int64_t)n_ids >= tern_context_n_ctx(c)) {
        fprintf(stderr, "tern: the prompt has %zu tokens, the context only %d positions (use -c)\n", n_ids,
                tern_context_n_ctx(c));
        goto out;
    }
    if (!(s = tern_sampler_create(m, &o.sp, &err))) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto out;
    }
    int no_grammar;
    char *gtext = run_grammar_text(&o, &no_grammar);
    if (!gtext && !no_grammar) goto out;
    if (gtext) {
        gram = tern_grammar_create(m, gtext, strlen(gtext), NULL, &err);
        free(gtext);
        if (!gram || !(gmt = tern_matcher_create(gram, &err))) {
            fprintf(stderr, "tern: %s\n", err.msg);
            goto out;
        }
        tern_sampler_set_matcher(s, gmt);
        fprintf(stderr, "tern: grammar compiled for the vocabulary in %.1f ms\n", tern_grammar_compile_ms(gram));
    }
    int32_t n_restored = 0;
    if (o.session) {
        if (!(ses = tern_session_open(m, o.session, c, &err)) ||
            tern_session_restore_prefix(ses, c, 0, ids, (int32_t)n_ids, &n_restored, &err)) {
            fprintf(stderr, "tern: %s\n", err.msg);
            goto out;
        }
        /* The restored prompt tokens go into the penalty window as
         * tern_generate would have put them. */
        for (int32_t i = 0; i < n_restored; i++) tern_sampler_accept(s, ids[i]);
        fprintf(stderr, "tern: session %s: %d of %zu prompt tokens restored, %zu evaluated\n", o.session, n_restored,
                n_ids, n_ids - (size_t)n_restored);
    }
    arm_sigint();
    if (!o.no_display_prompt && !o.print_ids) {
        tern_detok_t *d = tern_detok_create(m, &err);
        char buf[512];
        for (size_t i = 0; d && i < n_ids; i++) {
            int k = tern_detok_push(d, ids[i], buf, sizeof buf);
            if (k > 0) fwrite(buf, 1, (size_t)k, stdout);
        }
        if (d) {
            int k = tern_detok_flush(d, buf, sizeof buf);
            if (k > 0) fwrite(buf, 1, (size_t)k, stdout);
        }
        tern_detok_free(d);
        fflush(stdout);
    }
    run_cb_t rcb = {o.print_ids, 0, o.logits_digest ? c : NULL, tern_model_n_vocab(m), 0xcbf29ce484222325ull, 0, m, c, {0}};
    int32_t n_pred = o.n_predict < 0 ? INT32_MAX : o.n_predict;
    tern_generate_result_t gr;
    tern_spec_stats_t sst;
    int grc = tern_generate_spec(c, s, ids + n_restored, (int32_t)n_ids - n_restored, n_pred, &o.spec, run_token,
                                 &rcb, &gr, &sst, &err);
    printf("\n"); /* as llama.cpp's tools end their output */
    fflush(stdout);
    if (ses) {
        /* Whatever was evaluated, also after an error or Ctrl-C. */
        tern_error_t serr = {0};
        if (tern_session_append(ses, c, 0, &serr)) fprintf(stderr, "tern: %s\n", serr.msg);
        else
            fprintf(stderr, "tern: session %s: %d tokens saved in %d turn%s\n", o.session, tern_session_n_tokens(ses),
                    tern_session_n_turns(ses), tern_session_n_turns(ses) == 1 ? "" : "s");
    }
    /* TERN_EABORTED: Ctrl-C during the prompt (the abort callback). */
    if (grc && grc != TERN_EABORTED) {
        fprintf(stderr, "\ntern: %s\n", err.msg);
        goto out;
    }
    if (o.logits_digest)
        fprintf(stderr, "tern: logits digest %016llx over %d vectors\n", (unsigned long long)rcb.digest,
                rcb.n_digested);
    /* Why it stopped: the callback only stops on Ctrl-C here. */
    if (grc == TERN_EABORTED || gr.stop == TERN_STOP_CALLBACK)
        fprintf(stderr, "\ntern: interrupted after %d tokens\n", gr.n_generated);
    else if (gr.stop == TERN_STOP_CTX_FULL)
        fprintf(stderr, "\ntern: context full (%d positions) after %d tokens\n", tern_context_n_ctx(c),
                gr.n_generated);
    else
        fprintf(stderr, "tern: stopped after %d tokens: %s\n", gr.n_generated,
                gr.stop == TERN_STOP_EOG ? "end of generation" : "-n reached");
    if (!o.seed_given && o.sp.temp > 0) fprintf(stderr, "tern: seed %llu\n", (unsigned long long)o.sp.seed);
    run_print_timings(m, c, &o, now_ms() - t0, &rcb.mark);
    run_print_spec(&o, &sst);
    rc = 0;
out:
    free(ids);
    free(text);
    tern_session_close(ses);
    tern_sampler_free(s);
    tern_matcher_free(gmt);
    tern_grammar_free(gram);
    tern_context_free(c);
    tern_model_free(m);
    return rc;
}

/* ---- chat ---- */

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} strbuf_t;

static void sb_add(strbuf_t *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->failed = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}

static int chat_token(int32_t id, const char *text, size_t len, void *user) {
    (void)id;
    strbuf_t *reply = user;
    if (text && len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        sb_add(reply, text, len);
    }
    return g_stop != 0;
}

typedef struct {
    tern_chat_msg_t *v;
    size_t n, cap;
} msgs_t;

static int msgs_add(msgs_t *ms, const char *role, const char *content) {
    if (ms->n == ms->cap) {
        size_t cap = ms->cap ? ms->cap * 2 : 16;
        tern_chat_msg_t *nv = realloc(ms->v, cap * sizeof *nv);
        if (!nv) return -1;
        ms->v = nv;
        ms->cap = cap;
    }
    char *dup = strdup(content);
    if (!dup) return -1;
    ms->v[ms->n].role = role;
    ms->v[ms->n].content = dup;
    ms->n++;
    return 0;
}

int cmd_chat(int argc, char **argv) {
    run_opts_t o;
    int prc = run_opts_parse(&o, argc, argv, "chat");
    if (prc) return prc == 1 ? 0 : 2;
    double t0 = now_ms();
    tern_error_t err = {0};
    tern_model_t *m = run_load_model(&o, "chat");
    if (!m) return 1;
    int rc = 1;
    tern_context_t *c = NULL;
    tern_sampler_t *s = NULL;
    tern_session_t *ses = NULL;
    msgs_t ms = {0};
    strbuf_t cached = {0}; /* the rendered text whose tokens are in the KV cache */
    tern_spec_stats_t spec_total = {0}; /* over all replies */
    char *line = NULL;
    size_t line_cap = 0;
    if (!(c = open_context(m, &o))) goto out;
    if (!(s = tern_sampler_create(m, &o.sp, &err))) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto out;
    }
    if (o.session && !(ses = tern_session_open(m, o.session, c, &err))) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto out;
    }
    if (o.sys && msgs_add(&ms, "system", o.sys)) goto oom;
    /* Check the template before the first turn. */
    char *probe = NULL;
    if (tern_chat_render(m, o.chat_template, ms.v, ms.n, 1, &probe, &err)) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto out;
    }
    free(probe);
    const int tty = isatty(0);
    if (tty) fprintf(stderr, "tern chat: %s (%s); empty line or Ctrl-D ends, Ctrl-C stops a reply\n", tern_model_name(m),
                     tern_model_arch(m));
    for (;;) {
        g_stop = 0;
        arm_sigint();
        if (tty) {
            printf("> ");
            fflush(stdout);
        }
        errno = 0;
        ssize_t nr = getline(&line, &line_cap, stdin);
        if (nr < 0 || g_stop) break;
        while (nr > 0 && (line[nr - 1] == '\n' || line[nr - 1] == '\r')) line[--nr] = 0;
        if (nr == 0) {
            if (tty) break;
            continue;
        }
        if (msgs_add(&ms, "user", line)) goto oom;
        char *full = NULL;
        if (tern_chat_render(m, o.chat_template, ms.v, ms.n, 1, &full, &err)) {
            fprintf(stderr, "tern: %s\n", err.msg);
            goto out;
        }
        /* Evaluate only what the cache lacks: the rendered conversation
         * extends the cached text unless the template rewrote history; then
         * start over. */
        size_t keep = cached.len;
        int fresh = cached.len == 0 || strncmp(full, cached.buf, cached.len) != 0;
        if (fresh && cached.len) {
            fprintf(stderr, "tern: the template rewrote earlier turns; re-reading the conversation\n");
            tern_context_truncate(c, 0, NULL);
            keep = 0;
        }
        const char *delta = full + keep;
        int add_bos = fresh && !o.no_bos && tern_model_add_bos(m);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (tern_tokenize(m, delta, strlen(delta), add_bos, 1, &ids, &n_ids, &err)) {
            fprintf(stderr, "tern: %s\n", err.msg);
            free(full);
            goto out;
        }
        if (tern_context_pos(c) + (int64_t)n_ids >= tern_context_n_ctx(c)) {
            fprintf(stderr, "tern: context full (%d positions); start a new chat or use -c\n", tern_context_n_ctx(c));
            free(ids);
            free(full);
            break;
        }
        cached.len = 0;
        sb_add(&cached, full, strlen(full));
        free(full);
        strbuf_t reply = {0};
        sb_add(&reply, "", 0);
        int32_t n_pred = o.n_predict < 0 ? INT32_MAX : o.n_predict;
        /* With a session, a conversation read from the start takes the
         * longest prefix of its tokens (the system prompt, an earlier
         * chat's same first turns) from the file instead of evaluating it. */
        int32_t n_restored = 0;
        if (ses && fresh) {
            if (tern_session_restore_prefix(ses, c, 0, ids, (int32_t)n_ids, &n_restored, &err)) {
                fprintf(stderr, "tern: %s\n", err.msg);
                free(ids);
                free(reply.buf);
                goto out;
            }
            for (int32_t i = 0; i < n_restored; i++) tern_sampler_accept(s, ids[i]);
            fprintf(stderr, "tern: session %s: %d of %zu prompt tokens restored, %zu evaluated\n", o.session,
                    n_restored, n_ids, n_ids - (size_t)n_restored);
        }
        tern_generate_result_t gr;
        tern_spec_stats_t sst;
        int grc = tern_generate_spec(c, s, ids + n_restored, (int32_t)n_ids - n_restored, n_pred, &o.spec,
                                     chat_token, &reply, &gr, &sst, &err);
        spec_total.n_passes += sst.n_passes;
        spec_total.n_spec_passes += sst.n_spec_passes;
        spec_total.n_drafted += sst.n_drafted;
        spec_total.n_accepted += sst.n_accepted;
        spec_total.n_generated += sst.n_generated;
        spec_total.pass_ns += sst.pass_ns;
        free(ids);
        if (ses) {
            tern_error_t serr = {0};
            if (tern_session_append(ses, c, 0, &serr)) fprintf(stderr, "tern: %s\n", serr.msg);
        }
        printf("\n");
        fflush(stdout);
        if (grc && grc != TERN_EABORTED) {
            fprintf(stderr, "tern: %s\n", err.msg);
            free(reply.buf);
            goto out;
        }
        if (reply.failed || cached.failed || msgs_add(&ms, "assistant", reply.buf ? reply.buf : "")) {
            free(reply.buf);
            goto oom;
        }
        sb_add(&cached, reply.buf ? reply.buf : "", reply.len);
        free(reply.buf);
        if (gr.stop == TERN_STOP_CTX_FULL) {
            /* The last token of the reply did not fit: no turn can follow. */
            fprintf(stderr, "tern: context full (%d positions); start a new chat or use -c\n", tern_context_n_ctx(c));
            break;
        }
        if (grc == TERN_EABORTED) {
            /* Stopped inside the prompt: the cache holds only part of it, so
             * the next turn re-reads the conversation. */
            tern_context_truncate(c, 0, NULL);
            cached.len = 0;
            fprintf(stderr, "tern: reply stopped\n");
        } else if (gr.stop == TERN_STOP_CALLBACK) {
            /* A stopped reply may end mid-token-sequence: the cache holds
             * exactly the reported text, so the next turn still continues. */
            fprintf(stderr, "tern: reply stopped\n");
        }
    }
    run_print_timings(m, c, &o, now_ms() - t0, NULL);
    run_print_spec(&o, &spec_total);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "tern: out of memory\n");
out:
    for (size_t i = 0; i < ms.n; i++) free((void *)ms.v[i].content);
    free(ms.v);
    free(cached.buf);
    free(line);
    tern_session_close(ses);
    tern_sampler_free(s);
    tern_context_free(c);
    tern_model_free(m);
    return rc;
}
