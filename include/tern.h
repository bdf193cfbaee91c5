/*
 * tern.h - the public C API of tern, a CPU inference engine for LLMs.
 *
 * Usage (error handling shortened):
 *
 *     tern_error_t err;
 *     tern_pool_t *pool = tern_pool_create(0, 0, &err);     // 0 = default threads
 *     tern_range_t r = { my_rows_fn, my_ctx, n_rows, 16, bytes_per_row };
 *     if (tern_pool_run(pool, &r, 1, &err) != 0) fprintf(stderr, "%s\n", err.msg);
 *     tern_pool_free(pool);
 *
 * Threading contract: a tern_pool_t is driven by one caller thread at a time
 * (see tern_pool_run). Objects are owned by whoever created them; every
 * *_free accepts NULL.
 *
 * Errors: functions that can fail return 0 on success and a negative
 * TERN_E* code on failure, filling `err` (when not NULL) with a message that
 * says what was wrong and where. The library never exits or aborts on bad
 * input; only a broken internal invariant stops the program (TERN_CHECK).
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_VERSION "0.1.0"

/* ---- errors ------------------------------------------------------------ */

enum {
    TERN_OK = 0,
    TERN_EINVAL = -1,   /* bad argument */
    TERN_ENOMEM = -2,   /* allocation failed */
    TERN_EIO = -3,      /* file could not be opened/read/written */
    TERN_EFORMAT = -4,  /* malformed or hostile input file */
    TERN_EUNSUP = -5,   /* valid but unsupported (architecture, type ...) */
    TERN_EBUSY = -6,    /* object in use by another thread */
    TERN_EJOB = -7      /* a pool job reported failure */
};

#define TERN_ERR_MSG 512
typedef struct tern_error {
    int code;
    char msg[TERN_ERR_MSG];
} tern_error_t;

/* ---- the persistent worker pool ---------------------------------------- */

typedef struct tern_pool tern_pool_t;

/* A job body: process rows [row_begin, row_end) of one range. `worker` is
 * 0 for the calling thread and 1..n_threads-1 for pool threads; it indexes
 * per-worker scratch. Return 0, or a nonzero error code that the dispatch
 * reports to its caller (the first one wins). */
typedef int (*tern_job_fn)(void *ctx, int64_t row_begin, int64_t row_end, int worker);

/* One range of rows. Several ranges (e.g. the Q, K and V matrices) may be
 * dispatched as one job. Ranges are split into chunks whose boundaries are
 * multiples of `align` (a chunk never splits a kernel's row block; the last
 * chunk ends at n_rows). `cost` is the approximate number of bytes one row
 * touches; the pool's serial gate uses the total to decide whether the work
 * is too small to pay for waking threads (0 = unknown: always dispatch). */
typedef struct tern_range {
    tern_job_fn fn;
    void *ctx;
    int64_t n_rows;
    int64_t align;
    int64_t cost;
} tern_range_t;

/* Create a pool of n_threads threads in all, the caller included (so
 * n_threads - 1 threads are spawned). n_threads <= 0 means the default
 * (TERN_THREADS, else the physical performance cores). scratch_bytes of
 * 64-byte aligned per-worker scratch are reserved. Returns NULL on error. */
tern_pool_t *tern_pool_create(int n_threads, size_t scratch_bytes, tern_error_t *err);
void tern_pool_free(tern_pool_t *pool);
int tern_pool_threads(const tern_pool_t *pool); /* NULL pool -> 1 */

/* Run all ranges to completion; the caller works too (as worker 0). Returns
 * 0, or the first job error (TERN_EJOB, err->msg names the range and the
 * job's code); after a job fails, chunks not yet started are skipped, and the
 * run still returns only when no thread is inside a job function. A NULL
 * pool, a 1-thread pool, or work below the pool's gate (total n_rows * cost
 * bytes, all costs known) runs the ranges serially on the caller, one call
 * per range. TERN_EINVAL for a bad range (NULL fn, n_rows < 0, align < 1,
 * cost < 0).
 *
 * One caller at a time: if the pool is already running a job (a second
 * thread calling at the same moment, or a job function calling its own
 * pool), this returns TERN_EBUSY at once and runs nothing. It never blocks on
 * another caller: a lock would deadlock the nested case. Serialize your own
 * callers, or give each thread its own pool. */
int tern_pool_run(tern_pool_t *pool, const tern_range_t *ranges, int n_ranges, tern_error_t *err);

/* Per-worker scratch of at least the size given at creation; valid for the
 * pool's lifetime. worker 0 is the caller's. */
void *tern_pool_scratch(tern_pool_t *pool, int worker);
size_t tern_pool_scratch_size(const tern_pool_t *pool);

/* Dispatches (runs that woke the pool) since process start, all pools. */
uint64_t tern_pool_dispatch_count(void);

/* Tuning (benchmarks, tests). Call between runs, from the driving thread.
 * spin: wait-loop iterations (load + pause) a worker spins before it parks
 * on a futex; initial value TERN_POOL_SPIN, else the measured default. With
 * more threads than usable CPUs, workers park at once whatever the budget.
 * gate: work in bytes (sum of n_rows * cost) below which a run stays on the
 * caller; initial value TERN_POOL_GATE, else the measured default; 0 = never
 * gate. Negative values are taken as 0. NULL pool: no-op / 0. */
void tern_pool_set_spin(tern_pool_t *pool, int64_t iters);
int64_t tern_pool_spin(const tern_pool_t *pool);
void tern_pool_set_gate(tern_pool_t *pool, int64_t bytes);
int64_t tern_pool_gate(const tern_pool_t *pool);

/* The default thread count and a human-readable reason ("TERN_THREADS=3",
 * "hwloc: 2 physical performance cores" ...). TERN_THREADS=0 or 1 means
 * serial (returns 1); an invalid value is ignored (the reason says so).
 * TERN_AFFINITY=1 makes tern_pool_create pin worker i (1..n-1) to physical
 * performance core i, leaving core 0 to the caller, whose thread belongs to
 * the application and is not pinned. Workers beyond the core count are not
 * pinned. */
int tern_threads_default(char *why, size_t why_len);

/* ---- models, contexts, sampling, generation ----------------------------
 *
 * Usage (error handling shortened):
 *
 *     tern_error_t err;
 *     tern_model_t *m = tern_model_load("model.gguf", &err);
 *     tern_context_params_t cp = tern_context_default_params();
 *     cp.n_threads = 2;
 *     tern_context_t *ctx = tern_context_create(m, &cp, &err);
 *     tern_sampler_params_t sp = tern_sampler_default_params();
 *     sp.temp = 0;                                           // greedy
 *     tern_sampler_t *smp = tern_sampler_create(m, &sp, &err);
 *     int32_t *ids; size_t n;
 *     tern_tokenize(m, "Once upon a time", 16, 1, 0, &ids, &n, &err);
 *     tern_generate(ctx, smp, ids, (int32_t)n, 64, print_piece, NULL, NULL, &err);
 *     free(ids);
 *     tern_sampler_free(smp); tern_context_free(ctx); tern_model_free(m);
 *
 * Threading: a tern_model_t is read-only after loading; any number of
 * contexts (on any threads) may share it, and it must outlive them. A
 * context, a sampler and a detokenizer are each used by one thread at a
 * time. A context owns its KV cache and its worker pool (n_threads threads,
 * the caller included): evaluation runs on the caller plus those workers.
 *
 * Determinism: the logits of a position depend only on the tokens up to it,
 * the model file and the ISA in use: not on the thread count, the batch size
 * or whether the position came in a prompt block or one at a time. */

typedef struct tern_model tern_model_t;
typedef struct tern_context tern_context_t;
typedef struct tern_sampler tern_sampler_t;

/* Load a GGUF model (mmap'd, read-only). Returns NULL on error: TERN_EIO
 * (cannot open), TERN_EFORMAT (malformed file, missing or ill-shaped tensor:
 * the message names it), TERN_EUNSUP (architecture or tensor type tern does
 * not run; the message names it). The caller owns the model. A tokenizer the
 * file lacks or that tern cannot build does not fail the load: tern_tokenize
 * then returns the reason. */
tern_model_t *tern_model_load(const char *path, tern_error_t *err);
void tern_model_free(tern_model_t *m);

/* Facts about a loaded model (never fail). Strings are owned by the model. */
const char *tern_model_arch(const tern_model_t *m);      /* "llama", "qwen2", "qwen3" */
const char *tern_model_type_name(const tern_model_t *m); /* "Q8_0", "Q4_K_M" ... (general.file_type or dominant) */
const char *tern_model_name(const tern_model_t *m);      /* general.name, or the file's base name */
int32_t tern_model_n_vocab(const tern_model_t *m);
int32_t tern_model_n_layer(const tern_model_t *m);
int32_t tern_model_n_embd(const tern_model_t *m);
int32_t tern_model_n_ctx_train(const tern_model_t *m);
uint64_t tern_model_n_params(const tern_model_t *m);
uint64_t tern_model_file_size(const tern_model_t *m);
/* Weight bytes one decode step reads (all matrices + one embedding row):
 * the denominator of the decode roofline. */
uint64_t tern_model_bytes_per_token(const tern_model_t *m);
double tern_model_load_ms(const tern_model_t *m);

/* ---- tokens ---- */
int32_t tern_token_bos(const tern_model_t *m); /* -1 if none */
int32_t tern_token_eos(const tern_model_t *m); /* -1 if none */
int tern_token_is_eog(const tern_model_t *m, int32_t id); /* EOS, EOT, <|im_end|> ... */
int tern_model_add_bos(const tern_model_t *m);            /* the model's default for prompts */
/* Encode len bytes of text. *ids is malloc'd (caller frees with free()), *n_ids
 * its length. add_bos: prepend BOS (when the vocab has one). parse_special:
 * recognize special-token texts (chat templates). Errors: TERN_EINVAL (no
 * usable tokenizer: the message says why), TERN_ENOMEM. */
int tern_tokenize(const tern_model_t *m, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t **ids, size_t *n_ids, tern_error_t *err);

/* Streaming detokenizer: bytes are held until a UTF-8 code point completes.
 * push/flush write at most cap bytes to out and return the count, or -1 when
 * cap is too small (32 bytes always suffice for one token's text plus held
 * bytes in practice; 256 is safe). NULL from new: out of memory or no
 * tokenizer (err says which). */
typedef struct tern_detok tern_detok_t;
tern_detok_t *tern_detok_new(const tern_model_t *m, tern_error_t *err);
int tern_detok_push(tern_detok_t *d, int32_t id, char *out, size_t cap);
int tern_detok_flush(tern_detok_t *d, char *out, size_t cap);
void tern_detok_free(tern_detok_t *d);

/* Chat: render messages with the model's chat template (detected from
 * tokenizer.chat_template, or tmpl_name: "chatml", "llama3", "llama2",
 * "mistral", "phi3"); add_assistant appends the opening of the assistant's
 * turn. *out is malloc'd (caller frees). TERN_EUNSUP for an unknown
 * template, TERN_EINVAL for a bad role. */
typedef struct {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} tern_chat_msg_t;
int tern_chat_render(const tern_model_t *m, const char *tmpl_name, const tern_chat_msg_t *msgs, size_t n,
                     int add_assistant, char **out, tern_error_t *err);

/* ---- contexts ---- */
typedef struct {
    int32_t n_threads; /* threads in all, caller included; <= 0: tern_threads_default */
    int32_t n_ctx;     /* positions; <= 0: the model's, capped to fit memory (see tern_context_note) */
    int32_t n_batch;   /* prompt positions per forward block (GEMM); <= 0: 512 */
    int32_t kv_f32;    /* 1: F32 KV cache; 0: F16 (default) */
    int32_t profile;   /* 1: accumulate per-op times (tern_context_profile) */
} tern_context_params_t;
tern_context_params_t tern_context_default_params(void);

/* Create a context (KV cache, scratch, pool). NULL on error: TERN_EINVAL
 * (bad parameter), TERN_ENOMEM (the message gives the KV cache size). The
 * caller owns it; it borrows m. */
tern_context_t *tern_context_create(tern_model_t *m, const tern_context_params_t *p, tern_error_t *err);
void tern_context_free(tern_context_t *c);
/* A line about a decision the context made (e.g. "context capped at ..."),
 * or "". Owned by the context. */
const char *tern_context_note(const tern_context_t *c);
int32_t tern_context_n_ctx(const tern_context_t *c);
int32_t tern_context_pos(const tern_context_t *c); /* positions in the KV cache */
int32_t tern_context_threads(const tern_context_t *c);
/* Replace the context's pool by one of n_threads; the KV cache stays. */
int tern_context_set_threads(tern_context_t *c, int32_t n_threads, tern_error_t *err);
/* Drop positions >= pos from the KV cache (0: start over). TERN_EINVAL if
 * pos is beyond the current position. tern_get_logits is not recomputed:
 * evaluate a token before sampling again. */
int tern_context_truncate(tern_context_t *c, int32_t pos, tern_error_t *err);
/* Called between forward blocks of a long evaluation; returning nonzero
 * stops it with TERN_EINVAL ("aborted"); positions of finished blocks stay in
 * the cache. fn NULL removes it. */
void tern_context_set_abort(tern_context_t *c, int (*fn)(void *user), void *user);

/* Evaluate n tokens at the current position, appending them to the KV
 * cache. logits_all (may be NULL): n x n_vocab floats receive the logits of
 * every position; the last position's are always kept (tern_get_logits).
 * Errors (nothing appended unless stated): TERN_EINVAL (token id out of
 * range, context full: "context full" in the message, aborted), or a kernel
 * error. Timed as prompt when n > 1, as generation when n == 1. */
int tern_eval(tern_context_t *c, const int32_t *ids, int32_t n, float *logits_all, tern_error_t *err);
/* n_vocab logits of the last evaluated position; valid until the next eval. */
const float *tern_get_logits(const tern_context_t *c);

/* Counters since creation (or the last reset). Dispatches count pool runs
 * that woke workers (all pools of the process, during this context's evals). */
typedef struct {
    int64_t n_prompt;           /* tokens evaluated in blocks (n > 1) */
    uint64_t prompt_ns;
    uint64_t prompt_dispatches;
    int64_t n_gen;              /* tokens evaluated one at a time */
    uint64_t gen_ns;
    uint64_t gen_dispatches;
    int64_t n_sample;
    uint64_t sample_ns;         /* time in the sampler, via tern_generate */
} tern_timings_t;
void tern_context_timings(const tern_context_t *c, tern_timings_t *t);
void tern_context_timings_reset(tern_context_t *c);

/* Per-op wall time (ns) while params.profile was set: the Q/K/V matvecs,
 * attention, the O matvec, gate/up, down, the output matrix, and the small
 * ops on the caller (norms, RoPE, KV store, SiLU). */
typedef struct {
    uint64_t qkv, attn, wo, ffn_up, ffn_down, output, small;
    int64_t n_tokens;
} tern_profile_t;
void tern_context_profile(const tern_context_t *c, tern_profile_t *p);

/* The kernel ISA in use ("avx512", "avx2", "scalar"). */
const char *tern_isa_name(void);

/* ---- sampling ---- */
/* The chain, in this order: repetition/frequency/presence penalties over the
 * last repeat_last_n accepted tokens; top-k; top-p; min-p; temperature;
 * draw. temp <= 0: greedy (highest logit after penalties, lowest id on a
 * tie). Each step is off at its neutral value (top_k <= 0, top_p >= 1,
 * min_p <= 0, penalties 1 / 0 / 0). */
typedef struct {
    float temp;              /* default 0.8 */
    int32_t top_k;           /* default 40 */
    float top_p;             /* default 0.95 */
    float min_p;             /* default 0.05 */
    float repeat_penalty;    /* default 1.0 (off) */
    int32_t repeat_last_n;   /* default 64 */
    float presence_penalty;  /* default 0 */
    float frequency_penalty; /* default 0 */
    uint64_t seed;           /* same seed + model + prompt -> same output */
} tern_sampler_params_t;
tern_sampler_params_t tern_sampler_default_params(void); /* seed 0x7e57 */
/* NULL on error (TERN_EINVAL names the bad parameter). The caller owns it. */
tern_sampler_t *tern_sampler_create(const tern_model_t *m, const tern_sampler_params_t *p, tern_error_t *err);
void tern_sampler_free(tern_sampler_t *s);
/* Choose from n_vocab logits (not modified). */
int32_t tern_sampler_sample(tern_sampler_t *s, const float *logits);
/* Put an id in the penalty window (prompt and generated tokens). */
void tern_sampler_accept(tern_sampler_t *s, int32_t id);
/* Empty the window and restart the RNG from the seed. */
void tern_sampler_reset(tern_sampler_t *s);

/* ---- generation ---- */
/* Called for each generated token with its text (possibly empty while a
 * UTF-8 sequence is incomplete; text is NULL when the model has no
 * tokenizer). Return nonzero to stop. */
typedef int (*tern_token_cb)(int32_t id, const char *text, size_t len, void *user);

/* Evaluate the prompt (n_prompt ids, in n_batch blocks; may be 0 to continue
 * from the cache), then sample, report and evaluate up to n_predict tokens,
 * stopping early at an end-of-generation token (reported, not evaluated), a
 * full context, or when cb returns nonzero. Every reported token except an
 * end-of-generation one is evaluated, so the cache ends right after the
 * text reported and a later call continues from there (except when the
 * context filled up: the last token reported then did not fit). Bytes the detokenizer
 * still holds at the end are reported with id -1. Prompt ids are put in the
 * sampler's penalty window. *n_generated (may be NULL) receives the count of
 * tokens reported. Returns 0 (also when stopped early or by a full context)
 * or an error from tern_eval. */
int tern_generate(tern_context_t *c, tern_sampler_t *s, const int32_t *prompt, int32_t n_prompt, int32_t n_predict,
                  tern_token_cb cb, void *user, int32_t *n_generated, tern_error_t *err);

#ifdef __cplusplus
}
#endif
#endif /* TERN_H */
