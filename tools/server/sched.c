/*
 * sched.c - the engine thread of `tern serve`: continuous batching over
 * tern_decode.
 *
 * One thread owns the tern_context and is the only one that calls into it.
 * HTTP threads hand it prepared requests (srv_sched_submit) and read what
 * their job produced (srv_job_next); the two sides meet under the job's
 * mutex.
 *
 * Sequences. The context has parallel + cache_seqs sequence ids. Each is
 * FREE, ACTIVE (a running job's) or CACHED (a finished conversation kept for
 * prefix reuse, least recently used first out). The scheduler keeps, for
 * every sequence, the token ids its KV memory holds.
 *
 * Admission. Waiting jobs are admitted first in, first out while fewer than
 * `parallel` run. A new job takes the longest prefix of its prompt that
 * some sequence already holds (never the whole prompt: its last token is
 * evaluated for logits): a CACHED sequence is taken over and cut to that
 * prefix; an ACTIVE one (another request with the same system prompt) is
 * forked, sharing its blocks. A session file (--sessions) restores more
 * when it holds a longer prefix. The reused count is `cached_tokens`.
 *
 * A tick. One batch, one tern_decode: first the next token of every job
 * that is generating, then prompt chunks of jobs still prefilling, oldest
 * first, at most prefill_chunk positions in all (so a long prompt does not
 * freeze the others). Then every job whose logits came back samples,
 * detokenizes, checks its stop strings and limits, and wakes its reader.
 *
 * Memory. -c is one KV budget (blocks) for all sequences. When a batch does
 * not fit (TERN_EKVFULL), cached sequences are dropped, least recently used
 * first; when none is left, the newest running job fails with a clear error
 * and the batch is tried again, so the others go on.
 *
 * Byte identity: a job's logits depend only on its own tokens (tern_decode's
 * batch invariance; forks give the bytes of a fresh evaluation) and its
 * sampler is its own, so an answer is the same alone or among others.
 *
 * Speculative decoding (--spec ngram; off, the default, docs/SERVER.md
 * says why; ngram-fixed for measurements). Each job keeps a drafter (tern_drafter_t) whose history is
 * its prompt and every token it accepted. In a tick, a generating job may
 * put k drafts after its token, each with its logits: what followed the
 * last occurrence of the longest n-gram its text ends with, or the text its
 * grammar forces (tern_drafter_draft_under, as tern_generate_spec does).
 * After the pass each job is verified as tern_generate_spec verifies: the
 * token is sampled from position 0's logits by job_sample (the one place a
 * token becomes output: sampler, grammar, drafter, stop strings, logprobs,
 * limits, streaming); while it equals the next draft, that draft is
 * already evaluated and the next token comes from its position's logits.
 * At the first mismatch, or when the job ends (a stop string, the end
 * token, max_tokens), the positions after the last confirmed one are cut
 * off (tern_seq_truncate) before anything else sees the sequence, so the
 * KV memory, the sequence's id record, session files and prefix reuse hold
 * what plain decoding would. Tokens are only sampled from logits of
 * confirmed text, in order, by the job's own sampler: the answer is
 * byte-identical to plain decoding, alone or among others.
 *
 * Limits on drafts: k <= max_tokens - tokens so far - 1 (a tick samples at
 * most k + 1), the context's room, --draft-max and the request's
 * speculative.n_max; and drafts only take KV blocks that are free beyond
 * what the tick needs without them plus one block per generating job
 * (oldest job first). A batch that still does not fit (TERN_EKVFULL) loses
 * its drafts before any cached sequence or running job is given up.
 *
 * When to draft: the rule, per tick. Whether drafts pay depends on how many
 * sequences share the pass: at one a step is bound by reading the weights
 * and extra positions are nearly free; at many the pass is closer to
 * compute-bound and each draft costs about what a sequence's token does.
 * So it is measured per batch size (the number of generating jobs: 1 ..
 * 16, then 17-32, 33-64 ...). Every tick with generating jobs and no
 * prompt chunk is timed from the start of its planning to the end of its
 * verification and kept, with the tokens it emitted, under its batch size
 * and whether it evaluated drafts; the rate of each is the tokens of its
 * last 8 ticks over their time, less the tick with the most time per
 * token (throughput, robust to one tick preempted by another process).
 * When some job has drafts to offer: the first 8 times at this size,
 * draft (exploring); then until 8 ticks without drafts are measured, do
 * not; then draft when 8 with drafts are measured and their rate beats the
 * rate without by more than 10%, except for one plain tick after every 32
 * with drafts (the baseline is measured again); else do not, but probe
 * with drafts after P such ticks: P = max(I, (c - 1) / 0.02), c the time
 * of a tick with drafts over a plain one, so that failed probes cost at
 * most 2% of the time; I starts at 16, drops to 4 after a probe that beat
 * the plain rate and doubles (up to 256) after one that did not, so that a
 * text that turns repetitive is noticed. A probe in which no job's
 * controller drafted counts as done. Ticks with prompt chunks follow the
 * decision of their batch size but are not measured.
 * Within a tick that drafts, each job's draft length comes from its own
 * tern_spec_ctl_t (tern.h's rule: the job's acceptance per match length,
 * the cost of a pass with k drafts over a plain one). It is told of every
 * tick, and given the time of every measured one (planning and pass) as
 * the time of a pass with its own k: with jobs alike, a tick where each
 * drafts k costs what the controller sees, so a job drafts the k that pays
 * when all do; whether drafting pays at all is the measured rule above.
 * --spec ngram-fixed drafts in every tick, up to --draft-max, with neither
 * controller (llama-server's behaviour).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "srv.h"

enum { SEQ_FREE = 0, SEQ_ACTIVE = 1, SEQ_CACHED = 2 };
enum { JOB_WAITING = 0, JOB_PREFILL = 1, JOB_GEN = 2, JOB_DONE = 3 };

typedef struct {
    int state;
    int32_t *ids; /* the token ids its KV memory holds */
    int32_t n, cap;
    uint64_t last_used;
    srv_job_t *job;
    int bad; /* its id record was lost (out of memory): never reused as a prefix */
} seq_slot_t;

struct srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the consumer's and the scheduler's */
    int released;
    /* produced (under mu) */
    char *out;
    size_t out_len, out_cap;
    size_t ready;   /* bytes that can be delivered (not a possible stop-string start) */
    size_t emitted; /* bytes delivered */
    srv_token_t *toks;
    int32_t n_toks, cap_toks, toks_emitted;
    int done, done_delivered;
    const char *finish;
    int err_status;
    char err[256];
    srv_usage_t usage;
    /* engine side (engine thread only, after submit) */
    srv_request_t *req;
    uint64_t order;
    int state;
    int32_t seq;
    int32_t n_done;  /* prompt positions in the KV memory (reused + evaluated) */
    int32_t cached;  /* reused positions */
    int32_t n_gen;   /* tokens sampled (EOG not counted) */
    int32_t max_gen;
    int32_t last_tok;
    int stop_hold;   /* longest stop string - 1 */
    tern_sampler_t *smp;
    tern_matcher_t *mt; /* the request's grammar, when it has one */
    tern_detok_t *dt;
    tern_session_t *sess;
    double t_submit, t_admit, t_prompt_done, t_last_tok;
    srv_job_t *next; /* waiting queue */
    /* speculative decoding (engine thread) */
    tern_drafter_t *dr;   /* its history: the prompt and every accepted token (NULL: no drafts) */
    tern_spec_ctl_t *ctl; /* its draft length, from its acceptance */
    int32_t draft_cap;    /* most drafts per tick (--draft-max, the request's speculative.n_max) */
    int32_t dk, dnm;      /* drafts in this tick's batch; the n-gram match they came from */
    int32_t b0;           /* batch index of its token in this tick; its drafts follow */
    int32_t chunk;        /* prompt positions in this tick */
    int32_t drafts[TERN_SPEC_DRAFT_MAX];
    int32_t n_drafted, n_accepted;
    int32_t pre_id; /* presample's token for this tick's first sample, when has_pre */
    int has_pre;
};

/* The per-tick decision (the header comment's rule). */
#define TC_KEYS 23        /* batch sizes 1 .. 16, then 17-32, 33-64 ... 513-1024, more */
#define TC_RING 8         /* ticks kept per key and mode: their tokens over their time, the slowest left out */
#define TC_MIN 8          /* ticks measured each way before they are compared (a full ring) */
#define TC_GAIN 1.10      /* ticks with drafts must beat plain ones by 10% */
#define TC_PLAIN_EVERY 32 /* while drafts win: a plain tick after this many with drafts */
#define TC_PROBE_FIRST 16 /* while drafts lose: ticks between probes, at first */
#define TC_PROBE_SOON 4   /* after a probe that beat the plain rate */
#define TC_PROBE_MAX 256  /* the interval doubles after a probe that lost, up to this */
#define TC_PROBE_BUDGET 0.02 /* and is at least what keeps failed probes under 2% of the time */
enum { TC_PLAIN = 0, TC_DRAFT = 1 };
typedef struct {
    double tok[2][TC_RING], sec[2][TC_RING]; /* the last measured ticks, per mode */
    int64_t n[2];                            /* ticks measured, per mode */
    double med[2];                           /* their rate: emitted tokens per second */
    double tick_s[2];                        /* their time per tick */
    int32_t since_plain, since_probe, probe_every;
    int32_t explored; /* ticks given drafts to explore (the jobs' controllers may have drafted none) */
    int probing;
} tick_ctl_t;

#define HIST_N 12
typedef struct {
    double le[HIST_N];
    uint64_t count[HIST_N + 1];
    double sum;
    uint64_t n;
} hist_t;

struct srv_sched {
    const tern_model_t *m;
    tern_context_t *c;
    srv_sched_opts_t o;
    int32_t n_ctx, n_seq, n_vocab;
    seq_slot_t *seqs;
    uint64_t tick;
    pthread_t th;
    int started;
    /* under mu: the queue, shutdown flags, metrics */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job_t *wait_head, *wait_tail;
    int32_t n_waiting;
    int stopping, cancel_running, exited;
    uint64_t next_order;
    /* engine-only */
    srv_job_t **active;
    int32_t n_active;
    char *sessions_dir;
    /* metrics (under mu) */
    uint64_t m_requests, m_rejected, m_failed, m_prompt_eval, m_prompt_cached, m_generated, m_ticks;
    int32_t m_running;
    tern_kv_stats_t m_kv;
    double m_tok_s; /* generated tok/s, smoothed over ticks */
    hist_t h_ttft, h_itl;
    uint64_t m_drafted, m_accepted, m_draft_ticks;
    double m_tc_med[TC_KEYS][2]; /* the controller's medians, copied for /metrics */
    int64_t m_tc_n[TC_KEYS][2];
    /* the batch (engine-only) */
    tern_batch_entry_t *batch;
    srv_job_t **batch_job;
    uint8_t *batch_draft; /* 1: the entry is a draft */
    srv_job_t **pre_job;  /* presample's jobs and their logits */
    const float **pre_logits;
    int32_t batch_cap;
    tick_ctl_t tc[TC_KEYS]; /* engine-only */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void logf_(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tern serve: %s\n", buf);
}

static void hist_init(hist_t *h, const double *le) {
    memset(h, 0, sizeof *h);
    memcpy(h->le, le, sizeof h->le);
}

static void hist_add(hist_t *h, double v) {
    int i = 0;
    while (i < HIST_N && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

/* ---- jobs: the consumer's side ----------------------------------------- */

static void job_free(srv_job_t *j) {
    if (!j) return;
    tern_sampler_free(j->smp);
    tern_matcher_free(j->mt);
    tern_detok_free(j->dt);
    tern_session_close(j->sess);
    tern_drafter_free(j->dr);
    tern_spec_ctl_free(j->ctl);
    srv_request_free(j->req);
    free(j->req);
    free(j->out);
    free(j->toks);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void job_unref(srv_job_t *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left == 0) job_free(j);
}

int srv_job_next(srv_job_t *j, int timeout_ms, srv_update_t *u) {
    memset(u, 0, sizeof *u);
    pthread_mutex_lock(&j->mu);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    int64_t ns = (int64_t)dl.tv_nsec + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
    dl.tv_sec += (time_t)(ns / 1000000000);
    dl.tv_nsec = (long)(ns % 1000000000);
    for (;;) {
        int news = j->emitted < j->ready || j->toks_emitted < j->n_toks || (j->done && !j->done_delivered);
        if (news || timeout_ms <= 0) break;
        if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT) break;
    }
    int any = 0;
    if (j->emitted < j->ready) {
        size_t n = j->ready - j->emitted;
        u->text = malloc(n + 1);
        if (u->text) {
            memcpy(u->text, j->out + j->emitted, n);
            u->text[n] = 0;
            u->len = n;
            j->emitted = j->ready;
            any = 1;
        }
    }
    if (j->toks_emitted < j->n_toks) {
        int32_t n = j->n_toks - j->toks_emitted;
        u->toks = malloc((size_t)n * sizeof *u->toks);
        if (u->toks) {
            memcpy(u->toks, j->toks + j->toks_emitted, (size_t)n * sizeof *u->toks);
            u->n_toks = n;
            j->toks_emitted = j->n_toks;
            any = 1;
        }
    }
    if (j->done && !j->done_delivered && j->emitted == j->ready && j->toks_emitted == j->n_toks) {
        j->done_delivered = 1;
        u->done = 1;
        u->finish = j->finish;
        u->err_status = j->err_status;
        memcpy(u->err, j->err, sizeof u->err);
        u->usage = j->usage;
        any = 1;
    }
    pthread_mutex_unlock(&j->mu);
    return any;
}

void srv_job_release(srv_job_t *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->released = 1;
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
}

/* ---- jobs: the engine's side ------------------------------------------- */

static int job_released(srv_job_t *j) {
    pthread_mutex_lock(&j->mu);
    int r = j->released;
    pthread_mutex_unlock(&j->mu);
    return r;
}

/* Finish a job (under its mutex the result is published; the engine's
 * reference is dropped by the caller). */
static void job_finish(srv_job_t *j, const char *finish, int status, const char *msg) {
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    j->finish = status ? NULL : finish;
    j->err_status = status;
    if (msg) snprintf(j->err, sizeof j->err, "%s", msg);
    j->ready = j->out_len;
    srv_usage_t *us = &j->usage;
    us->prompt_tokens = j->req ? j->req->n_prompt : 0;
    us->cached_tokens = j->cached;
    us->completion_tokens = j->n_gen;
    double tp = j->t_prompt_done > 0 ? j->t_prompt_done : now_s();
    us->prompt_ms = j->t_admit > 0 ? (tp - j->t_admit) * 1e3 : 0;
    us->predicted_ms = j->t_prompt_done > 0 && j->t_last_tok > 0 ? (j->t_last_tok - j->t_prompt_done) * 1e3 : 0;
    us->draft_n = j->n_drafted;
    us->draft_n_accepted = j->n_accepted;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    j->state = JOB_DONE;
}

static int out_append(srv_job_t *j, const char *s, size_t n) {
    if (j->out_len + n + 1 > j->out_cap) {
        size_t cap = j->out_cap ? j->out_cap : 256;
        while (cap < j->out_len + n + 1) cap *= 2;
        char *p = realloc(j->out, cap);
        if (!p) return -1;
        j->out = p;
        j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, s, n);
    j->out_len += n;
    j->out[j->out_len] = 0;
    return 0;
}

/* After new bytes (under j->mu): cut at the first stop string (returns 1),
 * else hold back a tail that could start one. from: where new bytes began. */
static int check_stop(srv_job_t *j, size_t from) {
    const srv_request_t *r = j->req;
    size_t best = (size_t)-1;
    size_t start = from > (size_t)j->stop_hold ? from - (size_t)j->stop_hold : 0;
    for (int k = 0; k < r->n_stop; k++) {
        size_t sl = strlen(r->stop[k]);
        if (!sl || j->out_len < sl) continue;
        char *p = memmem(j->out + start, j->out_len - start, r->stop[k], sl);
        if (p && (size_t)(p - j->out) < best) best = (size_t)(p - j->out);
    }
    if (best != (size_t)-1) {
        j->out_len = best;
        j->out[best] = 0;
        if (j->ready > best) j->ready = best;
        return 1;
    }
    size_t hold = 0;
    for (int k = 0; k < r->n_stop; k++) {
        size_t sl = strlen(r->stop[k]);
        for (size_t h = sl - 1; h > hold; h--) {
            if (h <= j->out_len && !memcmp(j->out + j->out_len - h, r->stop[k], h)) {
                hold = h;
                break;
            }
        }
    }
    j->ready = j->out_len - hold;
    return 0;
}

/* The bytes of one token on its own (for logprobs). */
static void token_text(const tern_model_t *m, int32_t id, char *buf, size_t cap, uint8_t *len) {
    tern_error_t err = {0};
    tern_detok_t *d = tern_detok_create(m, &err);
    char tmp[256];
    int n = 0;
    if (d) {
        /* a stream's first piece loses its leading space (SPM): the second
         * push of the same id gives the piece as it reads mid-text */
        if (tern_detok_push(d, id, tmp, sizeof tmp) >= 0) tern_detok_flush(d, tmp, sizeof tmp);
        int a = tern_detok_push(d, id, tmp, sizeof tmp);
        if (a > 0) n = a;
        int b = tern_detok_flush(d, tmp + n, sizeof tmp - (size_t)n);
        if (b > 0) n += b;
        tern_detok_free(d);
    }
    if ((size_t)n >= cap) n = (int)cap - 1;
    memcpy(buf, tmp, (size_t)n);
    buf[n] = 0;
    *len = (uint8_t)n;
}

static int fill_logprobs(srv_sched_t *s, srv_job_t *j, const float *logits, int32_t id, srv_token_t *t) {
    int32_t nv = s->n_vocab;
    float mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int32_t i = 0; i < nv; i++) sum += exp((double)(logits[i] - mx));
    double lse = (double)mx + log(sum);
    memset(t, 0, sizeof *t);
    t->id = id;
    t->logprob = (float)((double)logits[id] - lse);
    token_text(s->m, id, t->text, sizeof t->text, &t->text_len);
    int k = j->req->top_logprobs;
    if (k > SRV_MAX_TOP_LOGPROBS) k = SRV_MAX_TOP_LOGPROBS;
    if (k > nv) k = nv;
    /* top k by insertion (k <= 20): highest logit first, lowest id on ties */
    int n = 0;
    for (int32_t i = 0; i < nv; i++) {
        float l = logits[i];
        if (n == k && !(l > logits[t->top_id[n - 1]])) continue;
        int p = n < k ? n++ : n - 1;
        while (p > 0 && l > logits[t->top_id[p - 1]]) {
            t->top_id[p] = t->top_id[p - 1];
            p--;
        }
        t->top_id[p] = i;
    }
    t->n_top = (uint8_t)n;
    for (int i = 0; i < n; i++) {
        t->top_logprob[i] = (float)((double)logits[t->top_id[i]] - lse);
        uint8_t l;
        token_text(s->m, t->top_id[i], t->top_text[i], sizeof t->top_text[i], &l);
    }
    return 0;
}

/* ---- sequences ----------------------------------------------------------- */

static int slot_set(seq_slot_t *sl, const int32_t *ids, int32_t n) {
    if (n > sl->cap) {
        int32_t cap = sl->cap ? sl->cap : 256;
        while (cap < n) cap *= 2;
        int32_t *p = realloc(sl->ids, (size_t)cap * sizeof *p);
        if (!p) return -1;
        sl->ids = p;
        sl->cap = cap;
    }
    if (ids && n) memmove(sl->ids, ids, (size_t)n * sizeof *ids);
    sl->n = n;
    return 0;
}

static void slot_push(seq_slot_t *sl, int32_t id) {
    if (sl->n == sl->cap) {
        int32_t n = sl->n;
        if (slot_set(sl, NULL, n + 1) < 0) {
            sl->bad = 1;
            return;
        }
        sl->n = n;
    }
    sl->ids[sl->n++] = id;
}

static void seq_drop(srv_sched_t *s, int32_t q) {
    tern_error_t err = {0};
    tern_seq_remove(s->c, q, &err);
    s->seqs[q].state = SEQ_FREE;
    s->seqs[q].n = 0;
    s->seqs[q].job = NULL;
    s->seqs[q].bad = 0;
}

/* Least recently used cached sequence, or -1. */
static int32_t lru_cached(const srv_sched_t *s, int32_t except) {
    int32_t best = -1;
    for (int32_t q = 0; q < s->n_seq; q++)
        if (q != except && s->seqs[q].state == SEQ_CACHED &&
            (best < 0 || s->seqs[q].last_used < s->seqs[best].last_used))
            best = q;
    return best;
}

static int32_t free_slot(srv_sched_t *s, int32_t except) {
    for (int32_t q = 0; q < s->n_seq; q++)
        if (s->seqs[q].state == SEQ_FREE) return q;
    int32_t v = lru_cached(s, except);
    if (v >= 0) seq_drop(s, v);
    return v;
}

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* ---- admission ----------------------------------------------------------- */

static void fail_job(srv_sched_t *s, srv_job_t *j, int status, const char *msg);

/* Open the job's session file (cache miss with a warning when it cannot be
 * used; a damaged file is moved aside and started afresh). */
static void open_session(srv_sched_t *s, srv_job_t *j) {
    if (!s->sessions_dir || !j->req->session[0]) return;
    char *path = NULL, msg[256];
    if (srv_session_path(s->sessions_dir, j->req->session, &path, msg, sizeof msg) < 0) {
        logf_("session %s: %s (not used)", j->req->session, msg);
        return;
    }
    tern_error_t err = {0};
    j->sess = tern_session_open(s->m, path, s->c, &err);
    if (!j->sess) {
        logf_("session %s: %s: treated as a cache miss; the file is moved aside and started afresh", j->req->session,
              err.msg);
        size_t pl = strlen(path);
        char *aside = malloc(pl + 16);
        if (aside) {
            snprintf(aside, pl + 16, "%s.bad", path);
            if (rename(path, aside) == 0) {
                memset(&err, 0, sizeof err);
                j->sess = tern_session_open(s->m, path, s->c, &err);
                if (!j->sess) logf_("session %s: %s", j->req->session, err.msg);
            }
            free(aside);
        }
    }
    free(path);
}

static int session_busy(const srv_sched_t *s, const srv_job_t *j) {
    for (int32_t i = 0; i < s->n_active; i++)
        if (s->active[i] != j && s->active[i]->req->session[0] && !strcmp(s->active[i]->req->session, j->req->session))
            return 1;
    return 0;
}

/* Give an admitted job its sequence, with the longest reusable prefix. */
static int admit(srv_sched_t *s, srv_job_t *j) {
    srv_request_t *r = j->req;
    tern_error_t err = {0};
    if (r->session[0] && session_busy(s, j)) {
        fail_job(s, j, 409, "this session has a request running; send the next turn after it finishes");
        return -1;
    }
    j->t_admit = now_s();
    const int32_t *P = r->prompt_ids;
    int32_t n = r->n_prompt;
    int32_t best = -1, best_len = 0;
    for (int32_t q = 0; q < s->n_seq; q++) {
        if (s->seqs[q].state == SEQ_FREE || s->seqs[q].bad) continue;
        int32_t l = common_prefix(P, n, s->seqs[q].ids, s->seqs[q].n);
        if (l > best_len || (l == best_len && l > 0 && s->seqs[q].state == SEQ_CACHED &&
                             s->seqs[best].state != SEQ_CACHED)) {
            best = q;
            best_len = l;
        }
    }
    if (best_len > n - 1) best_len = n - 1;
    int32_t q;
    if (best >= 0 && best_len > 0 && s->seqs[best].state == SEQ_CACHED) {
        q = best; /* take the cached conversation over */
        if (tern_seq_truncate(s->c, q, best_len, &err) < 0) {
            seq_drop(s, q);
            best_len = 0;
        } else {
            s->seqs[q].n = best_len;
        }
    } else {
        q = free_slot(s, best);
        if (q < 0) { /* cannot happen: active <= parallel < n_seq */
            fail_job(s, j, 500, "no free sequence");
            return -1;
        }
        tern_seq_remove(s->c, q, &err);
        s->seqs[q].n = 0;
        if (best >= 0 && best_len > 0) {
            if (tern_seq_fork(s->c, q, best, best_len, &err) < 0 || slot_set(&s->seqs[q], s->seqs[best].ids, best_len) < 0) {
                tern_seq_remove(s->c, q, &err);
                s->seqs[q].n = 0;
                best_len = 0;
            }
        }
    }
    s->seqs[q].state = SEQ_ACTIVE;
    s->seqs[q].job = j;
    s->seqs[q].last_used = ++s->tick;
    j->seq = q;
    j->cached = best_len;
    /* a session file may hold more */
    open_session(s, j);
    if (j->sess) {
        int32_t ls = common_prefix(P, n, tern_session_tokens(j->sess), tern_session_n_tokens(j->sess));
        if (ls > n - 1) ls = n - 1;
        if (ls > j->cached) {
            int32_t k = 0;
            memset(&err, 0, sizeof err);
            if (tern_session_restore_prefix(j->sess, s->c, q, P, n, &k, &err) < 0) {
                logf_("session %s: restore failed (%s): evaluated instead", r->session, err.msg);
                tern_seq_remove(s->c, q, &err);
                s->seqs[q].n = 0;
                j->cached = 0;
            } else {
                slot_set(&s->seqs[q], P, k);
                j->cached = k;
            }
        }
    }
    pthread_mutex_lock(&s->mu);
    s->m_prompt_cached += (uint64_t)j->cached;
    pthread_mutex_unlock(&s->mu);
    j->n_done = j->cached;
    if (s->seqs[q].n != j->n_done) { /* keep the record exact */
        j->n_done = s->seqs[q].n;
        j->cached = s->seqs[q].n;
    }
    /* sampler (prompt ids in its penalty window, as tern_generate does) and detokenizer */
    memset(&err, 0, sizeof err);
    j->smp = tern_sampler_create(s->m, &r->samp, &err);
    if (j->smp && r->n_bias && tern_sampler_set_logit_bias(j->smp, r->bias, r->n_bias, &err) < 0) {
        tern_sampler_free(j->smp);
        j->smp = NULL;
    }
    if (j->smp && r->gram) {
        if ((j->mt = tern_matcher_create(r->gram, &err)))
            tern_sampler_set_matcher(j->smp, j->mt);
        else {
            tern_sampler_free(j->smp);
            j->smp = NULL;
        }
    }
    if (j->smp) j->dt = tern_detok_create(s->m, &err);
    if (!j->smp || !j->dt) {
        fail_job(s, j, 400, err.msg[0] ? err.msg : "could not set up sampling");
        return -1;
    }
    for (int32_t i = 0; i < n; i++) tern_sampler_accept(j->smp, P[i]);
    j->draft_cap = s->o.spec ? s->o.draft_max : 0;
    if (r->has_spec_n_max && r->spec_n_max < j->draft_cap) j->draft_cap = r->spec_n_max;
    if (j->draft_cap > 0) {
        /* No drafter (out of memory): the job runs without drafts, its
         * output does not depend on them. */
        tern_spec_params_t sp = tern_spec_default_params();
        sp.n_draft_max = j->draft_cap;
        sp.ngram_max = s->o.spec_ngram;
        sp.ngram_min = 1;
        sp.adaptive = s->o.spec != SRV_SPEC_FIXED;
        j->dr = tern_drafter_create(sp.ngram_min, sp.ngram_max, NULL);
        j->ctl = j->dr ? tern_spec_ctl_create(&sp, NULL) : NULL;
        if (!j->ctl || tern_drafter_push(j->dr, P, n, NULL)) {
            tern_drafter_free(j->dr);
            tern_spec_ctl_free(j->ctl);
            j->dr = NULL;
            j->ctl = NULL;
        }
    }
    int32_t room = s->n_ctx - n;
    j->max_gen = r->max_tokens > 0 && r->max_tokens < room ? r->max_tokens : room;
    for (int k = 0; k < r->n_stop; k++) {
        int l = (int)strlen(r->stop[k]) - 1;
        if (l > j->stop_hold) j->stop_hold = l;
    }
    j->state = JOB_PREFILL;
    return 0;
}

/* ---- finishing ----------------------------------------------------------- */

static void active_remove(srv_sched_t *s, srv_job_t *j) {
    for (int32_t i = 0; i < s->n_active; i++)
        if (s->active[i] == j) {
            memmove(s->active + i, s->active + i + 1, (size_t)(s->n_active - i - 1) * sizeof *s->active);
            s->n_active--;
            return;
        }
}

static void save_session(srv_sched_t *s, srv_job_t *j) {
    if (!j->sess || j->seq < 0) return;
    tern_error_t err = {0};
    if (tern_session_append(j->sess, s->c, j->seq, &err) < 0)
        logf_("session %s: could not save the turn: %s", j->req->session, err.msg);
}

/* The job leaves the engine: its sequence stays cached for reuse. */
static void retire(srv_sched_t *s, srv_job_t *j, int keep_seq) {
    if (j->seq >= 0) {
        if (keep_seq) {
            save_session(s, j);
            s->seqs[j->seq].state = SEQ_CACHED;
            s->seqs[j->seq].job = NULL;
            s->seqs[j->seq].last_used = ++s->tick;
        } else {
            seq_drop(s, j->seq);
        }
    }
    if (j->seq >= 0 && s->seqs[j->seq].bad) seq_drop(s, j->seq);
    active_remove(s, j);
    pthread_mutex_lock(&s->mu);
    s->m_running = s->n_active;
    if (j->err_status) s->m_failed++;
    pthread_mutex_unlock(&s->mu);
    job_unref(j);
}

static void fail_job(srv_sched_t *s, srv_job_t *j, int status, const char *msg) {
    (void)s;
    job_finish(j, NULL, status, msg);
}

static void log_done(const srv_job_t *j) {
    const srv_usage_t *u = &j->usage;
    if (j->err_status)
        logf_("request %llu: error %d: %s", (unsigned long long)j->order, j->err_status, j->err);
    else
        logf_("request %llu: prompt %d (cached %d), generated %d, %s, %.0f ms to first token, %.1f tok/s",
              (unsigned long long)j->order, u->prompt_tokens, u->cached_tokens, u->completion_tokens,
              j->finish ? j->finish : "?", u->ttft_ms,
              u->predicted_ms > 0 && u->completion_tokens > 1 ? (u->completion_tokens - 1) * 1e3 / u->predicted_ms : 0.0);
}

/* ---- a tick ---------------------------------------------------------------- */

static int batch_reserve(srv_sched_t *s, int32_t n) {
    if (n <= s->batch_cap) return 0;
    tern_batch_entry_t *b = realloc(s->batch, (size_t)n * sizeof *b);
    if (!b) return -1;
    s->batch = b;
    srv_job_t **bj = realloc(s->batch_job, (size_t)n * sizeof *bj);
    if (!bj) return -1;
    s->batch_job = bj;
    uint8_t *bd = realloc(s->batch_draft, (size_t)n * sizeof *bd);
    if (!bd) return -1;
    s->batch_draft = bd;
    srv_job_t **pj = realloc(s->pre_job, (size_t)n * sizeof *pj);
    if (!pj) return -1;
    s->pre_job = pj;
    const float **pl = realloc(s->pre_logits, (size_t)n * sizeof *pl);
    if (!pl) return -1;
    s->pre_logits = pl;
    s->batch_cap = n;
    return 0;
}

/* Sample the job's next token from logits; publish it. n_pos: the positions
 * of confirmed text its sequence holds (drafts after them not counted). */
static void job_sample(srv_sched_t *s, srv_job_t *j, const float *logits, double t, int32_t n_pos) {
    srv_request_t *r = j->req;
    int32_t id;
    if (j->has_pre) { /* presample drew it, with this same call */
        id = j->pre_id;
        j->has_pre = 0;
    } else {
        id = tern_sampler_sample(j->smp, logits);
    }
    if (id < 0 && j->mt && tern_matcher_finished(j->mt)) { /* the grammar is complete; no end token */
        job_finish(j, "stop", 0, NULL);
        return;
    }
    if (id < 0) {
        job_finish(j, NULL, 400,
                   j->mt ? "no token is allowed (the grammar and logit_bias together ban every candidate)"
                         : "no token is allowed (logit_bias banned every candidate)");
        return;
    }
    tern_sampler_accept(j->smp, id);
    if (j->mt) {
        tern_error_t gerr;
        if (tern_matcher_accept(j->mt, id, &gerr)) {
            job_finish(j, NULL, 500, gerr.msg);
            return;
        }
    }
    if (j->dr && tern_drafter_push(j->dr, &id, 1, NULL)) {
        /* out of memory for the history: no more drafts for this job */
        tern_drafter_free(j->dr);
        j->dr = NULL;
    }
    int first = j->n_gen == 0;
    if (first) {
        j->usage.ttft_ms = (t - j->t_submit) * 1e3;
        pthread_mutex_lock(&s->mu);
        hist_add(&s->h_ttft, t - j->t_submit);
        pthread_mutex_unlock(&s->mu);
    } else {
        pthread_mutex_lock(&s->mu);
        hist_add(&s->h_itl, t - j->t_last_tok);
        pthread_mutex_unlock(&s->mu);
    }
    j->t_last_tok = t;
    int eog = tern_token_is_eog(s->m, id) && !r->ignore_eos;
    char buf[512];
    int nb = 0;
    srv_token_t tk;
    int have_tk = 0;
    if (!eog) {
        j->n_gen++;
        nb = tern_detok_push(j->dt, id, buf, sizeof buf);
        if (nb < 0) nb = 0;
        if (r->logprobs) have_tk = fill_logprobs(s, j, logits, id, &tk) == 0;
    }
    int done_len = !eog && j->n_gen >= j->max_gen;
    int ctx_full = !eog && !done_len && n_pos + 1 > s->n_ctx;
    if (eog || done_len || ctx_full) {
        int f = tern_detok_flush(j->dt, buf + nb, sizeof buf - (size_t)nb);
        if (f > 0) nb += f;
    }
    pthread_mutex_lock(&j->mu);
    size_t from = j->out_len;
    int stopped = 0;
    if (nb > 0 && out_append(j, buf, (size_t)nb) == 0) stopped = check_stop(j, from);
    if (have_tk) {
        if (j->n_toks == j->cap_toks) {
            int32_t cap = j->cap_toks ? j->cap_toks * 2 : 16;
            srv_token_t *p = realloc(j->toks, (size_t)cap * sizeof *p);
            if (p) {
                j->toks = p;
                j->cap_toks = cap;
            }
        }
        if (j->n_toks < j->cap_toks) j->toks[j->n_toks++] = tk;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->mu);
    s->m_generated += eog ? 0 : 1;
    pthread_mutex_unlock(&s->mu);
    if (stopped || eog) {
        job_finish(j, "stop", 0, NULL);
    } else if (done_len || ctx_full) {
        job_finish(j, "length", 0, NULL);
    } else {
        j->last_tok = id;
        j->state = JOB_GEN;
    }
}

/* ---- speculative decoding: the per-tick decision ------------------------ */

static int tc_key(int32_t n_gen) {
    if (n_gen <= 16) return n_gen > 0 ? n_gen - 1 : 0;
    int k = 16;
    for (int32_t lim = 32; n_gen > lim && k < TC_KEYS - 1; lim *= 2) k++;
    return k;
}

static void tc_init(tick_ctl_t *c) {
    memset(c, 0, sizeof *c);
    c->probe_every = TC_PROBE_FIRST;
}

/* Drafts in this tick, at its batch size, when some job has them? */
static int tc_decide(tick_ctl_t *c) {
    if (c->n[TC_DRAFT] < TC_MIN && c->explored < TC_MIN) {
        c->explored++;
        return TC_DRAFT;
    }
    if (c->n[TC_PLAIN] < TC_MIN) return TC_PLAIN;
    if (c->n[TC_DRAFT] >= TC_MIN && c->med[TC_DRAFT] > TC_GAIN * c->med[TC_PLAIN])
        return c->since_plain >= TC_PLAIN_EVERY ? TC_PLAIN : TC_DRAFT;
    /* A probe costs the time of a tick with drafts over a plain one. */
    const double dear = c->tick_s[TC_PLAIN] > 0 ? (c->tick_s[TC_DRAFT] / c->tick_s[TC_PLAIN] - 1.0) / TC_PROBE_BUDGET : 0;
    const int32_t every = dear > c->probe_every ? (dear < 1e6 ? (int32_t)dear : 1000000) : c->probe_every;
    if (++c->since_probe >= every) {
        /* whether or not the jobs' controllers then draft */
        c->since_probe = 0;
        c->probing = 1;
        return TC_DRAFT;
    }
    return TC_PLAIN;
}

/* A measured tick: mode (drafts evaluated or not), the tokens it emitted
 * and its time. The rate of a mode is the tokens of its last TC_RING ticks
 * over their time (what throughput is), less the tick with the most time
 * per token once the ring is full (one tick preempted by another process
 * must not decide). */
static void tc_record(tick_ctl_t *c, int mode, double tok, double sec) {
    const int slot = (int)(c->n[mode] % TC_RING);
    c->tok[mode][slot] = tok;
    c->sec[mode][slot] = sec;
    c->n[mode]++;
    const int n = c->n[mode] < TC_RING ? (int)c->n[mode] : TC_RING;
    double st = 0, ss = 0;
    int worst = -1;
    for (int i = 0; i < n; i++) {
        st += c->tok[mode][i];
        ss += c->sec[mode][i];
        if (n == TC_RING && (worst < 0 || c->sec[mode][i] * c->tok[mode][worst] > c->sec[mode][worst] * c->tok[mode][i]))
            worst = i;
    }
    if (worst >= 0) {
        st -= c->tok[mode][worst];
        ss -= c->sec[mode][worst];
    }
    c->med[mode] = ss > 0 ? st / ss : 0;
    c->tick_s[mode] = ss / (worst >= 0 ? n - 1 : n);
    const double rate = sec > 0 ? tok / sec : 0;
    if (mode == TC_PLAIN) {
        c->since_plain = 0;
        c->probing = 0; /* a probe in which no job drafted tells nothing */
        return;
    }
    c->since_plain++;
    if (c->probing) {
        c->probing = 0;
        if (c->n[TC_PLAIN] >= TC_MIN && rate > TC_GAIN * c->med[TC_PLAIN])
            c->probe_every = TC_PROBE_SOON;
        else
            c->probe_every = c->probe_every * 2 < TC_PROBE_MAX ? c->probe_every * 2 : TC_PROBE_MAX;
    }
}

static int32_t blocks_for(int32_t n_pos, int32_t bp) { return (n_pos + bp - 1) / bp; }

/* The drafts of each generating job for this tick (j->dk, j->drafts):
 * found by prompt lookup (or the grammar's forced text), kept when the
 * controller of this batch size says draft, cut to each job's controller,
 * its tokens still wanted and the context; then cut, oldest job first,
 * to the free KV blocks beyond what the tick needs without them (plain_need)
 * and a block per generating job. */
static void plan_drafts(srv_sched_t *s, int32_t n_gen, int32_t plain_need, const tern_kv_stats_t *st) {
    int any = 0;
    for (int32_t i = 0; i < s->n_active; i++) {
        srv_job_t *j = s->active[i];
        j->dk = j->dnm = 0;
        if (j->state != JOB_GEN || !j->dr) continue;
        int32_t cap = j->draft_cap;
        const int32_t left = j->max_gen - j->n_gen - 1; /* a tick samples up to dk + 1 tokens */
        const int32_t room = s->n_ctx - tern_seq_pos(s->c, j->seq) - 1;
        if (cap > left) cap = left;
        if (cap > room) cap = room;
        if (cap <= 0) continue;
        j->dk = tern_drafter_draft_under(j->dr, s->m, j->mt, j->drafts, cap, &j->dnm);
        any |= j->dk > 0;
    }
    if (!any) return;
    const int mode = s->o.spec == SRV_SPEC_FIXED ? TC_DRAFT : tc_decide(&s->tc[tc_key(n_gen)]);
    int32_t spare = st->n_free - plain_need - n_gen;
    for (int32_t i = 0; i < s->n_active; i++) {
        srv_job_t *j = s->active[i];
        if (j->state != JOB_GEN || j->dk == 0) continue;
        if (mode == TC_PLAIN) {
            j->dk = 0;
            continue;
        }
        const int32_t want = tern_spec_ctl_next(j->ctl, j->dnm);
        if (j->dk > want) j->dk = want;
        const int32_t pos = tern_seq_pos(s->c, j->seq) + 1, bp = st->block_pos > 0 ? st->block_pos : 1;
        const int32_t need = blocks_for(pos + j->dk, bp) - blocks_for(pos, bp);
        if (need > spare) j->dk = 0;
        else spare -= need;
    }
}

/* After the pass, the first token of every generating job without a
 * grammar is drawn on the context's pool, all jobs at once, before the
 * per-job work below takes them one by one: the very call job_sample would
 * make first (the job's own sampler, RNG and state, on the logits of its
 * batch entry), so the same tokens. A draw over a 152k vocabulary costs
 * 0.02 ms (top-k) to 2 ms (OpenAI's default, no truncation:
 * dev/ab/sampler_ab.c), times the jobs in the batch, which the engine
 * thread alone would pay while the pool's threads wait. A grammar's
 * matcher stays on the engine thread. */
static int pre_rows(void *ctx, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    srv_sched_t *s = ctx;
    for (int64_t r = r0; r < r1; r++) {
        srv_job_t *j = s->pre_job[r];
        j->pre_id = tern_sampler_sample(j->smp, s->pre_logits[r]);
        j->has_pre = 1;
    }
    return 0;
}
static int32_t presample(srv_sched_t *s, int32_t n) {
    tern_pool_t *pool = tern_context_pool(s->c);
    if (tern_pool_threads(pool) < 2) return 0;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        srv_job_t *j = s->batch_job[i];
        if (s->batch_draft[i] || j->state != JOB_GEN || j->b0 != i || j->mt) continue;
        s->pre_job[m] = j;
        s->pre_logits[m++] = tern_batch_logits(s->c, i);
    }
    if (m < 2) return 0;
    tern_range_t r = {pre_rows, s, m, 1, 0};
    tern_error_t err;
    if (tern_pool_run(pool, &r, 1, &err)) { /* cannot fail (pre_rows returns 0); if it did: one by one */
        for (int32_t i = 0; i < m; i++) s->pre_job[i]->has_pre = 0;
        return 0;
    }
    return m;
}

/* After the pass: sample the job's tokens from its positions' logits as
 * plain decoding would, one by one, while each equals the next draft; drop
 * the drafts after the last confirmed one from the KV memory. */
static void verify(srv_sched_t *s, srv_job_t *j, double t, int32_t *emitted) {
    const int32_t dk = j->dk, b0 = j->b0;
    const int32_t base = tern_seq_pos(s->c, j->seq) - 1 - dk; /* positions before this tick */
    int32_t p = 0;
    int rejected = 0;
    j->n_drafted += dk; /* counted before the sampling that may finish the job (its usage) */
    for (;; p++) {
        job_sample(s, j, tern_batch_logits(s->c, b0 + p), t, base + p + 1);
        (*emitted)++;
        if (j->state == JOB_DONE || p == dk) break;
        if (j->last_tok != j->drafts[p]) {
            rejected = 1;
            break;
        }
        /* draft p + 1 confirmed: it is in the KV memory, its logits are next */
        j->n_accepted++;
    }
    for (int32_t q = 0; q <= p; q++) slot_push(&s->seqs[j->seq], s->batch[b0 + q].token);
    if (p < dk) {
        tern_error_t err = {0};
        if (tern_seq_truncate(s->c, j->seq, base + p + 1, &err) < 0) {
            /* cannot happen (the arguments are right); never keep or save
             * a sequence with unconfirmed drafts */
            s->seqs[j->seq].bad = 1;
            tern_session_close(j->sess);
            j->sess = NULL;
            if (j->state != JOB_DONE) job_finish(j, NULL, 500, err.msg);
        }
    }
    /* A tick cut short by a stop (not by a rejection) reports only the
     * drafts that were checked. */
    if (j->ctl) tern_spec_ctl_observe(j->ctl, j->dnm, rejected ? dk : p, p);
    j->dk = 0;
}

/* Drop the batch's entries of victim, and its drafts when drop_drafts. */
static int32_t batch_filter(srv_sched_t *s, int32_t n, const srv_job_t *victim, int drop_drafts) {
    int32_t w = 0;
    for (int32_t i = 0; i < n; i++) {
        if (s->batch_job[i] == victim || (drop_drafts && s->batch_draft[i])) continue;
        s->batch[w] = s->batch[i];
        s->batch_job[w] = s->batch_job[i];
        s->batch_draft[w++] = s->batch_draft[i];
    }
    return w;
}

/* One forward pass. Returns 1 when work was done. */
static int tick(srv_sched_t *s) {
    const double t0 = now_s();
    int32_t n = 0, n_gen = 0;
    if (batch_reserve(s, s->n_active * (1 + s->o.draft_max) + s->o.prefill_chunk + 1) < 0) return 0;
    /* the prompt chunks of this tick, and the KV blocks the tick needs without drafts */
    tern_kv_stats_t st;
    tern_kv_stats(s->c, &st);
    const int32_t bp = st.block_pos > 0 ? st.block_pos : 1;
    int32_t plain_need = 0, budget = s->o.prefill_chunk;
    for (int32_t i = 0; i < s->n_active; i++) {
        srv_job_t *j = s->active[i];
        j->chunk = 0;
        if (j->state == JOB_GEN) {
            const int32_t pos = tern_seq_pos(s->c, j->seq);
            plain_need += blocks_for(pos + 1, bp) - blocks_for(pos, bp);
            n_gen++;
        } else if (j->state == JOB_PREFILL && budget > 0) {
            const int32_t left = j->req->n_prompt - j->n_done, k = left < budget ? left : budget;
            j->chunk = k;
            budget -= k;
            plain_need += blocks_for(j->n_done + k, bp) - blocks_for(j->n_done, bp);
        }
    }
    if (s->o.spec && n_gen > 0) plan_drafts(s, n_gen, plain_need, &st);
    for (int32_t i = 0; i < s->n_active; i++) {
        srv_job_t *j = s->active[i];
        if (j->state != JOB_GEN) continue;
        s->batch[n] = (tern_batch_entry_t){j->seq, j->last_tok, TERN_POS_APPEND, 1};
        s->batch_draft[n] = 0;
        s->batch_job[n++] = j;
        for (int32_t d = 0; d < j->dk; d++) {
            s->batch[n] = (tern_batch_entry_t){j->seq, j->drafts[d], TERN_POS_APPEND, 1};
            s->batch_draft[n] = 1;
            s->batch_job[n++] = j;
        }
    }
    int has_prefill = 0;
    for (int32_t i = 0; i < s->n_active; i++) {
        srv_job_t *j = s->active[i];
        if (j->state != JOB_PREFILL) continue;
        for (int32_t t = 0; t < j->chunk; t++) {
            int32_t p = j->n_done + t;
            s->batch[n] = (tern_batch_entry_t){j->seq, j->req->prompt_ids[p], TERN_POS_APPEND, p == j->req->n_prompt - 1};
            s->batch_draft[n] = 0;
            s->batch_job[n++] = j;
            has_prefill = 1;
        }
    }
    if (n == 0) return 0;
    int lost = 0; /* a job gave way: the tick is not measured */
    for (;;) {
        tern_error_t err = {0};
        int rc = tern_decode(s->c, s->batch, n, &err);
        if (rc == 0) break;
        if (rc == TERN_EKVFULL) {
            /* drafts go first: they never cost another request its memory */
            int32_t w = batch_filter(s, n, NULL, 1);
            if (w < n) {
                for (int32_t i = 0; i < s->n_active; i++) s->active[i]->dk = 0;
                n = w;
                continue;
            }
            int32_t v = lru_cached(s, -1);
            if (v >= 0) {
                seq_drop(s, v);
                continue;
            }
            /* no cached sequence left: the newest running job gives way */
            srv_job_t *victim = NULL;
            for (int32_t i = 0; i < s->n_active; i++)
                if (s->active[i]->state != JOB_DONE && (!victim || s->active[i]->order > victim->order))
                    victim = s->active[i];
            if (!victim) return 0;
            tern_kv_stats(s->c, &st);
            char msg[256];
            snprintf(msg, sizeof msg,
                     "the KV memory is full (%d blocks of %d positions, used by %d running requests): retry later, or "
                     "start the server with a larger -c",
                     st.n_blocks, st.block_pos, s->n_active);
            fail_job(s, victim, 503, msg);
            /* drop its entries from the batch */
            n = batch_filter(s, n, victim, 0);
            log_done(victim);
            retire(s, victim, 0);
            lost = 1;
            if (n == 0) return 1;
            continue;
        }
        /* anything else fails every job of the batch */
        for (int32_t i = 0; i < n; i++)
            if (s->batch_job[i]->state != JOB_DONE) {
                char msg[TERN_ERR_MSG + 32];
                snprintf(msg, sizeof msg, "evaluation failed: %s", err.msg);
                fail_job(s, s->batch_job[i], 500, msg);
            }
        return 1;
    }
    const double t = now_s();
    /* A tick of generating jobs only is measured (below); its pass, with
     * the planning, is each job's pass time for its controller. */
    const int measured = s->o.spec == SRV_SPEC_NGRAM && !has_prefill && !lost && t > t0;
    int64_t n_prompt_eval = 0, drafted = 0, accepted = 0;
    int32_t emitted = 0, n_gen_batch = 0, n_draft_entries = 0;
    for (int32_t i = 0; i < n; i++) {
        if (s->batch_draft[i]) n_draft_entries++;
        else if (s->batch_job[i]->state == JOB_GEN) {
            s->batch_job[i]->b0 = i;
            n_gen_batch++;
        }
    }
    const int32_t n_pre = presample(s, n);
    for (int32_t i = 0; i < n; i++) {
        srv_job_t *j = s->batch_job[i];
        if (s->batch_draft[i]) continue; /* verified with its job's token */
        if (j->state == JOB_PREFILL) {
            slot_push(&s->seqs[j->seq], s->batch[i].token);
            j->n_done++;
            n_prompt_eval++;
            if (j->n_done == j->req->n_prompt) {
                j->t_prompt_done = t;
                save_session(s, j); /* the prompt is a turn too: a crash while generating keeps it */
                job_sample(s, j, tern_batch_logits(s->c, i), t, j->n_done);
            }
        } else if (j->state == JOB_GEN && j->b0 == i) {
            const int32_t a0 = j->n_accepted, d0 = j->n_drafted;
            if (measured && j->ctl) tern_spec_ctl_time(j->ctl, j->dk, (uint64_t)((t - t0) * 1e9));
            verify(s, j, t, &emitted);
            drafted += j->n_drafted - d0;
            accepted += j->n_accepted - a0;
        }
    }
    for (int32_t i = 0; i < n_pre; i++) s->pre_job[i]->has_pre = 0; /* each was its job's first sample above */
    const double t1 = now_s();
    /* ... for the controller of its batch size: tokens emitted per second,
     * with drafts or without. */
    const int k = tc_key(n_gen_batch);
    if (measured && n_gen_batch > 0) tc_record(&s->tc[k], n_draft_entries ? TC_DRAFT : TC_PLAIN, (double)emitted, t1 - t0);
    pthread_mutex_lock(&s->mu);
    s->m_prompt_eval += (uint64_t)n_prompt_eval;
    s->m_ticks++;
    s->m_drafted += (uint64_t)drafted;
    s->m_accepted += (uint64_t)accepted;
    if (n_draft_entries) s->m_draft_ticks++;
    if (measured && n_gen_batch > 0)
        for (int m = 0; m < 2; m++) {
            s->m_tc_med[k][m] = s->tc[k].med[m];
            s->m_tc_n[k][m] = s->tc[k].n[m];
        }
    tern_kv_stats(s->c, &s->m_kv);
    pthread_mutex_unlock(&s->mu);
    return 1;
}

/* ---- the engine thread ----------------------------------------------------- */

static void *engine(void *arg) {
    srv_sched_t *s = arg;
    double t_last = now_s();
    for (;;) {
        /* admit */
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->n_active == 0 && !s->wait_head) pthread_cond_wait(&s->cv, &s->mu);
        int stopping = s->stopping, cancel = s->cancel_running;
        srv_job_t *adm[64];
        int n_adm = 0;
        if (stopping) {
            /* queued requests are refused */
            while (s->wait_head) {
                srv_job_t *j = s->wait_head;
                s->wait_head = j->next;
                s->n_waiting--;
                adm[n_adm++] = j;
                if (n_adm == 64) break;
            }
        } else {
            while (s->wait_head && s->n_active + n_adm < s->o.parallel && n_adm < 64) {
                srv_job_t *j = s->wait_head;
                s->wait_head = j->next;
                s->n_waiting--;
                adm[n_adm++] = j;
            }
        }
        if (!s->wait_head) s->wait_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        if (stopping && s->n_active == 0 && n_adm == 0) break;
        for (int i = 0; i < n_adm; i++) {
            srv_job_t *j = adm[i];
            if (stopping) {
                job_finish(j, NULL, 503, "the server is shutting down");
                job_unref(j);
                continue;
            }
            if (job_released(j)) {
                job_finish(j, "cancelled", 0, NULL);
                job_unref(j);
                continue;
            }
            s->active[s->n_active++] = j;
            j->seq = -1;
            if (admit(s, j) < 0) {
                log_done(j);
                retire(s, j, 0);
            }
        }
        /* cancellations, time limits, shutdown */
        double t = now_s();
        for (int32_t i = 0; i < s->n_active; i++) {
            srv_job_t *j = s->active[i];
            if (j->state == JOB_DONE) continue;
            if (job_released(j) || (stopping && cancel)) {
                job_finish(j, "cancelled", 0, NULL);
            } else if (s->o.request_timeout_s > 0 && t - j->t_submit > s->o.request_timeout_s) {
                char msg[128];
                snprintf(msg, sizeof msg, "the request ran past the server's time limit (--timeout %.0f s)",
                         s->o.request_timeout_s);
                job_finish(j, NULL, 504, msg);
            }
        }
        for (int32_t i = 0; i < s->n_active;) {
            srv_job_t *j = s->active[i];
            if (j->state == JOB_DONE) {
                log_done(j);
                retire(s, j, j->err_status == 0 || j->err_status == 504);
            } else {
                i++;
            }
        }
        pthread_mutex_lock(&s->mu);
        s->m_running = s->n_active;
        pthread_mutex_unlock(&s->mu);
        if (s->n_active == 0) continue;
        uint64_t g0 = s->m_generated;
        tick(s);
        for (int32_t i = 0; i < s->n_active;) {
            srv_job_t *j = s->active[i];
            if (j->state == JOB_DONE) {
                log_done(j);
                retire(s, j, j->err_status == 0);
            } else {
                i++;
            }
        }
        double t2 = now_s();
        pthread_mutex_lock(&s->mu);
        double rate = t2 > t_last ? (double)(s->m_generated - g0) / (t2 - t_last) : 0;
        s->m_tok_s = s->m_tok_s * 0.9 + rate * 0.1;
        s->m_running = s->n_active;
        pthread_mutex_unlock(&s->mu);
        t_last = t2;
    }
    pthread_mutex_lock(&s->mu);
    s->exited = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- the public side -------------------------------------------------------- */

srv_sched_t *srv_sched_create(const tern_model_t *m, const srv_sched_opts_t *o, tern_error_t *err) {
    srv_sched_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        err->code = TERN_ENOMEM;
        return NULL;
    }
    s->m = m;
    s->o = *o;
    if (s->o.parallel <= 0) s->o.parallel = 8;
    if (s->o.parallel > 1024) s->o.parallel = 1024;
    if (s->o.queue < 0) s->o.queue = 0;
    if (s->o.prefill_chunk <= 0) s->o.prefill_chunk = 256;
    if (s->o.cache_seqs < 0) s->o.cache_seqs = 0;
    if (s->o.cache_seqs > 1024) s->o.cache_seqs = 1024;
    if (s->o.draft_max <= 0) s->o.draft_max = 8;
    if (s->o.draft_max > TERN_SPEC_DRAFT_MAX) s->o.draft_max = TERN_SPEC_DRAFT_MAX;
    if (s->o.spec_ngram <= 0) s->o.spec_ngram = 4;
    if (s->o.spec_ngram > TERN_SPEC_NGRAM_MAX) s->o.spec_ngram = TERN_SPEC_NGRAM_MAX;
    if (!s->o.spec) s->o.draft_max = 0; /* the batch holds no drafts */
    for (int k = 0; k < TC_KEYS; k++) tc_init(&s->tc[k]);
    s->n_seq = s->o.parallel + (s->o.cache_seqs ? s->o.cache_seqs : 0) + 1;
    s->n_vocab = tern_model_n_vocab(m);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    static const double ttft_le[HIST_N] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double itl_le[HIST_N] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
    hist_init(&s->h_ttft, ttft_le);
    hist_init(&s->h_itl, itl_le);
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = o->n_threads;
    cp.n_ctx = o->n_ctx;
    cp.n_batch = o->n_batch > 0 ? o->n_batch : 512;
    cp.n_seq_max = s->n_seq;
    cp.kv_block = o->kv_block;
    s->seqs = calloc((size_t)s->n_seq, sizeof *s->seqs);
    s->active = calloc((size_t)s->o.parallel, sizeof *s->active);
    if (o->sessions_dir) s->sessions_dir = strdup(o->sessions_dir);
    if (!s->seqs || !s->active || (o->sessions_dir && !s->sessions_dir)) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        err->code = TERN_ENOMEM;
        srv_sched_free(s);
        return NULL;
    }
    s->c = tern_context_create(m, &cp, err);
    if (!s->c) {
        srv_sched_free(s);
        return NULL;
    }
    s->n_ctx = tern_context_n_ctx(s->c);
    tern_kv_stats(s->c, &s->m_kv);
    if (pthread_create(&s->th, NULL, engine, s) != 0) {
        snprintf(err->msg, sizeof err->msg, "cannot start the engine thread");
        err->code = TERN_ENOMEM;
        srv_sched_free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

const char *srv_sched_note(const srv_sched_t *s) { return tern_context_note(s->c); }

void srv_sched_shutdown(srv_sched_t *s, int cancel_running) {
    if (!s || !s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    if (cancel_running) s->cancel_running = 1;
    pthread_cond_broadcast(&s->cv);
    /* running requests get SRV_SHUTDOWN_GRACE_S to finish, then are cancelled */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += SRV_SHUTDOWN_GRACE_S;
    while (!s->exited && !s->cancel_running)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT) break;
    s->cancel_running = 1;
    pthread_cond_broadcast(&s->cv);
    while (!s->exited) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void sched_join(srv_sched_t *s) {
    if (!s->started) return;
    srv_sched_shutdown(s, 1);
    pthread_join(s->th, NULL);
    s->started = 0;
}

void srv_sched_free(srv_sched_t *s) {
    if (!s) return;
    sched_join(s);
    for (srv_job_t *j = s->wait_head; j;) { /* none after the join; kept for safety */
        srv_job_t *nx = j->next;
        job_unref(j);
        j = nx;
    }
    if (s->seqs)
        for (int32_t q = 0; q < s->n_seq; q++) free(s->seqs[q].ids);
    free(s->seqs);
    free(s->active);
    free(s->batch);
    free(s->batch_job);
    free(s->batch_draft);
    free(s->pre_job);
    free(s->pre_logits);
    free(s->sessions_dir);
    tern_context_free(s->c);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int32_t srv_sched_n_ctx(const srv_sched_t *s) { return s->n_ctx; }

int srv_sched_ready(const srv_sched_t *s) { return s != NULL && s->started; }

srv_job_t *srv_sched_submit(srv_sched_t *s, srv_request_t *r, int *status, char *msg, size_t msg_cap) {
    if (r->n_prompt <= 0 || !r->prompt_ids) {
        *status = 400;
        snprintf(msg, msg_cap, "the prompt is empty");
        srv_request_free(r);
        free(r);
        return NULL;
    }
    if (r->n_prompt >= s->n_ctx) {
        *status = 400;
        snprintf(msg, msg_cap, "the prompt has %d tokens; the context holds %d (-c), leaving no room to generate",
                 r->n_prompt, s->n_ctx);
        srv_request_free(r);
        free(r);
        return NULL;
    }
    srv_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        *status = 500;
        snprintf(msg, msg_cap, "out of memory");
        srv_request_free(r);
        free(r);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->req = r;
    j->seq = -1;
    j->t_submit = now_s();
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        *status = 503;
        snprintf(msg, msg_cap, "the server is shutting down");
        job_free(j);
        return NULL;
    }
    if (s->n_waiting >= s->o.queue && s->n_active >= s->o.parallel) {
        s->m_rejected++;
        pthread_mutex_unlock(&s->mu);
        *status = 503;
        snprintf(msg, msg_cap, "the server is busy: %d requests running and %d waiting (--parallel, --queue); retry later",
                 s->o.parallel, s->o.queue);
        job_free(j);
        return NULL;
    }
    j->order = ++s->next_order;
    s->m_requests++;
    if (s->wait_tail)
        s->wait_tail->next = j;
    else
        s->wait_head = j;
    s->wait_tail = j;
    s->n_waiting++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return j;
}

/* ---- metrics ---------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)k;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void sb_hist(sbuf_t *b, const char *name, const char *help, const hist_t *h) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < HIST_N; i++) {
        cum += h->count[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[HIST_N];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
              h->sum, name, (unsigned long long)h->n);
}

char *srv_sched_metrics(srv_sched_t *s) {
    sbuf_t b = {malloc(4096), 0, 4096, 0};
    if (!b.p) return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&s->mu);
#define G(name, type, help, fmt, v) sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " " type "\n" name " " fmt "\n", v)
    G("tern_requests_running", "gauge", "Requests decoding now.", "%d", s->m_running);
    G("tern_requests_waiting", "gauge", "Requests queued for a free slot.", "%d", s->n_waiting);
    G("tern_requests_total", "counter", "Requests accepted.", "%llu", (unsigned long long)s->m_requests);
    G("tern_requests_rejected_total", "counter", "Requests refused with 503 (queue full).", "%llu",
      (unsigned long long)s->m_rejected);
    G("tern_requests_failed_total", "counter", "Requests that ended with an error.", "%llu", (unsigned long long)s->m_failed);
    G("tern_prompt_tokens_total", "counter", "Prompt tokens evaluated.", "%llu", (unsigned long long)s->m_prompt_eval);
    G("tern_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the KV memory or a session file.",
      "%llu", (unsigned long long)s->m_prompt_cached);
    G("tern_generated_tokens_total", "counter", "Tokens generated.", "%llu", (unsigned long long)s->m_generated);
    G("tern_generation_tokens_per_second", "gauge", "Generated tokens per second, smoothed over recent forward passes.",
      "%.3f", s->m_tok_s);
    G("tern_decode_passes_total", "counter", "Forward passes (ticks).", "%llu", (unsigned long long)s->m_ticks);
    G("tern_kv_blocks_used", "gauge", "KV memory blocks in use.", "%d", s->m_kv.n_used);
    G("tern_kv_blocks_free", "gauge", "KV memory blocks free.", "%d", s->m_kv.n_free);
    G("tern_kv_blocks_shared", "gauge", "KV memory blocks shared by several sequences.", "%d", s->m_kv.n_shared);
    G("tern_kv_block_positions", "gauge", "Positions per KV memory block.", "%d", s->m_kv.block_pos);
    G("tern_spec_draft_tokens_total", "counter", "Draft tokens evaluated (speculative decoding).", "%llu",
      (unsigned long long)s->m_drafted);
    G("tern_spec_accepted_tokens_total", "counter", "Draft tokens confirmed by the sampler.", "%llu",
      (unsigned long long)s->m_accepted);
    G("tern_spec_draft_passes_total", "counter", "Forward passes (ticks) that evaluated drafts.", "%llu",
      (unsigned long long)s->m_draft_ticks);
    G("tern_spec_acceptance_rate", "gauge", "Draft tokens confirmed over draft tokens evaluated, since the start.",
      "%.4f", s->m_drafted ? (double)s->m_accepted / (double)s->m_drafted : 0.0);
#undef G
    sb_printf(&b,
              "# HELP tern_spec_tick_tokens_per_second Median emitted tokens per second of recent generation-only "
              "ticks, per batch size (sequences) and whether they evaluated drafts: what the per-tick decision "
              "compares.\n# TYPE tern_spec_tick_tokens_per_second gauge\n");
    for (int k = 0; k < TC_KEYS; k++)
        for (int m = 0; m < 2; m++) {
            if (!s->m_tc_n[k][m]) continue;
            char lab[32];
            if (k < 16) snprintf(lab, sizeof lab, "%d", k + 1);
            else if (k < TC_KEYS - 1) snprintf(lab, sizeof lab, "%d-%d", (16 << (k - 16)) + 1, 32 << (k - 16));
            else snprintf(lab, sizeof lab, "%d+", (16 << (k - 16)) + 1);
            sb_printf(&b, "tern_spec_tick_tokens_per_second{sequences=\"%s\",drafts=\"%s\"} %.3f\n", lab,
                      m ? "yes" : "no", s->m_tc_med[k][m]);
        }
    sb_hist(&b, "tern_time_to_first_token_seconds", "Time from a request's arrival to its first token.", &s->h_ttft);
    sb_hist(&b, "tern_inter_token_latency_seconds", "Time between consecutive tokens of a request.", &s->h_itl);
    pthread_mutex_unlock(&s->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
