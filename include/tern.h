/*
 * tern.h - the public C API of tern, a CPU inference engine for LLMs: load a
 * GGUF model, create a context, tokenize, evaluate, sample, generate. It
 * includes tern_error.h (error codes, the log callback), tern_pool.h (the
 * worker pool, usable on its own) and tern_sampler.h (the sampler's chain,
 * parameters and state format); see the usage example at "models,
 * contexts" below.
 *
 * Names: tern_<object>_<verb>. Every object is made by tern_<object>_create
 * (tern_context_create, tern_sampler_create, tern_detok_create,
 * tern_pool_create) and released by tern_<object>_free, which accepts NULL.
 * The one other constructor verb is tern_model_load: a model is not built
 * from parameters but opened from a file (and mapped), and load says that.
 * Parameter structs come from tern_<object>_default_params().
 *
 * Threading contract: objects are owned by whoever created them. Which
 * calls may run concurrently is said per object.
 *
 * Errors: functions that can fail return 0 on success and a negative
 * TERN_E* code on failure, filling `err` (when not NULL) with a message that
 * says what was wrong and where (tern_error.h).
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>

#include "tern_error.h"
#include "tern_pool.h"
#include "tern_sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_VERSION "0.1.0"

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
 *     tern_generate(ctx, smp, ids, (int32_t)n, 64, print_piece, NULL, NULL, &err);   // NULL: no result wanted
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

/* Mixture-of-Experts models (qwen2moe, qwen3moe, olmoe, Mixtral) can keep
 * their routed experts in a cache filled from the file by an I/O pool
 * (direct reads where the file system allows them), so a model larger than
 * memory runs: the dense weights stay resident, the experts a token needs
 * are read while the cached ones compute. The logits are the same bits
 * whatever the cache size, prefetch and pinning. Ignored for dense models. */
#define TERN_EXPERTS_AUTO (-1) /* all experts through the mapping when the file fits in memory, else a cache of what fits */
#define TERN_EXPERTS_MMAP 0    /* through the mapping and the page cache (no cache of tern's own) */
typedef struct {
    int64_t expert_cache_bytes; /* TERN_EXPERTS_AUTO, TERN_EXPERTS_MMAP or a size in bytes */
    int io_threads;             /* readers of the expert cache; <= 0: 8 */
    int expert_prefetch;        /* 1: hint the next layer's likely experts; 0: no; < 0: the default (on) */
    int expert_pin;             /* 1: pin the most used experts (counts kept per model file); 0: no; < 0: default (on) */
    const char *expert_usage_path; /* the counts file (NULL: $XDG_CACHE_HOME/tern or ~/.cache/tern, by file name and size) */
} tern_model_params_t;
tern_model_params_t tern_model_default_params(void);
/* tern_model_load with parameters (p NULL: the defaults). Besides
 * tern_model_load's errors: TERN_EINVAL for a bad parameter. */
tern_model_t *tern_model_load_ex(const char *path, const tern_model_params_t *p, tern_error_t *err);

/* The expert cache's counters since load (or the last reset); all zero and
 * active 0 without a cache. */
typedef struct {
    int active;                  /* 1: experts go through tern's cache */
    int direct;                  /* 1: reads bypass the page cache (O_DIRECT) */
    int n_slots, n_pinned;       /* slots (one expert each), slots pinned by usage */
    uint64_t slot_bytes, cache_bytes, expert_bytes; /* one slot; all slots; all routed experts of the file */
    uint64_t n_experts;          /* routed experts in the file (layers x experts); with slot_bytes (set
                                  * even without a cache): n_experts * slot_bytes is a cache that holds them all */
    uint64_t hits, misses;       /* experts a forward pass asked for: in the cache / read */
    uint64_t prefetched, prefetch_used; /* loads started by next-layer hints; of those, asked for later */
    uint64_t pred_hits, pred_total; /* experts a layer chose that the previous layer's hint named; experts chosen */
    uint64_t bytes_read;
    uint64_t read_ns;            /* summed over the I/O threads */
    uint64_t wait_ns;            /* time the forward pass waited for reads */
    uint64_t evictions;
} tern_expert_stats_t;
void tern_model_expert_stats(const tern_model_t *m, tern_expert_stats_t *st);
void tern_model_expert_stats_reset(tern_model_t *m);

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
 * bytes in practice; 256 is safe). NULL from create: out of memory or no
 * tokenizer (err says which). */
typedef struct tern_detok tern_detok_t;
tern_detok_t *tern_detok_create(const tern_model_t *m, tern_error_t *err);
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
    /* Threads in all, caller included; <= 0: tern_threads_default. More than
     * the CPUs the process may run on works (same results, slower; the note
     * says so); more than 4 per CPU is clamped to 4 per CPU (noted). */
    int32_t n_threads;
    int32_t n_ctx;     /* positions; <= 0: the model's, capped to fit memory (see tern_context_note) */
    int32_t n_batch;   /* prompt positions per forward block (GEMM); <= 0: 512 */
    int32_t kv_f32;    /* 1: F32 KV cache; 0: F16 (default) */
    int32_t profile;   /* 1: accumulate per-op times (tern_context_profile) */
    int32_t n_seq_max; /* sequences the context serves, ids 0 .. n_seq_max-1 (<= 4096); <= 0: 64 */
    int32_t kv_block;  /* positions per KV memory block; <= 0: 32 */
} tern_context_params_t;
tern_context_params_t tern_context_default_params(void);

/* Create a context (KV memory, scratch, pool). The KV memory holds n_ctx
 * positions in all (rounded up to whole blocks of kv_block), shared by
 * every sequence: one sequence may use all of it (n_ctx is the most one
 * sequence holds), or many share it; there is no fixed split. NULL on
 * error: TERN_EINVAL
 * (bad parameter), TERN_ENOMEM (the message gives the KV cache size). The
 * caller owns it; it borrows m, which is only read. */
tern_context_t *tern_context_create(const tern_model_t *m, const tern_context_params_t *p, tern_error_t *err);
void tern_context_free(tern_context_t *c);
/* A line about the decisions the context made ("context capped at ...",
 * "999 threads requested, clamped to 8 ..."), or "". Owned by the context;
 * tern_context_set_threads replaces it by its own (or ""). */
const char *tern_context_note(const tern_context_t *c);
int32_t tern_context_n_ctx(const tern_context_t *c);
int32_t tern_context_pos(const tern_context_t *c); /* positions of sequence 0 in the KV memory */
int32_t tern_context_threads(const tern_context_t *c);
/* The context's worker pool, for the caller's own parallel work between
 * calls on this context (`tern serve` samples its sequences' tokens on it):
 * a pool is driven by one thread at a time, so never during a call on the
 * context, nor from another thread. Owned by the context (or by whoever
 * passed it at creation); replaced by tern_context_set_threads. */
tern_pool_t *tern_context_pool(tern_context_t *c);
/* Replace the context's pool by one of n_threads (resolved and clamped as
 * at creation); the KV cache stays. */
int tern_context_set_threads(tern_context_t *c, int32_t n_threads, tern_error_t *err);
/* Drop positions >= pos of sequence 0 (0: start over). TERN_EINVAL if
 * pos is beyond the current position. tern_get_logits is not recomputed:
 * evaluate a token before sampling again. */
int tern_context_truncate(tern_context_t *c, int32_t pos, tern_error_t *err);
/* Called between forward blocks (n_batch positions) of a long evaluation;
 * returning nonzero stops it with TERN_EABORTED; positions of finished
 * blocks stay in the cache. fn NULL removes it. */
void tern_context_set_abort(tern_context_t *c, int (*fn)(void *user), void *user);

/* Evaluate n tokens of sequence 0 at its current position, appending them
 * to the KV memory (tern_decode for many sequences). logits_all (may be NULL): n x n_vocab floats receive the logits of
 * every position; the last position's are always kept (tern_get_logits).
 * Errors (nothing appended unless stated): TERN_ECTXFULL (pos + n > n_ctx),
 * TERN_EABORTED (the abort callback said stop: the blocks before it stay
 * appended), TERN_EINVAL (bad arguments, token id out of range), or a kernel
 * error (TERN_EJOB ...). Timed as prompt when n > 1, as generation when
 * n == 1. */
int tern_eval(tern_context_t *c, const int32_t *ids, int32_t n, float *logits_all, tern_error_t *err);
/* n_vocab logits of the last position tern_eval evaluated; valid until the
 * next tern_eval. */
const float *tern_get_logits(const tern_context_t *c);

/* ---- many sequences in one forward pass ----
 * A batch is a list of tokens of any sequences: each entry names its
 * sequence, its position in it (or TERN_POS_APPEND: the next one, counting
 * the batch's earlier entries of that sequence), its token, and whether its
 * logits are wanted. Prompt chunks of some sequences and single tokens of
 * others mix freely; the entries may come in any order, but each
 * sequence's positions must continue where it ends, without gaps or
 * repeats. One call reads every weight matrix once per n_batch tokens (a
 * GEMM over the batch), and attention runs per token over its own
 * sequence's positions.
 *
 * Batch invariance: a token's logits depend only on its sequence's tokens
 * up to it: they are byte-identical whatever other sequences share the
 * batch, how many, in which order, and at any thread count (the same as
 * tern_eval of that sequence alone). */
#define TERN_POS_APPEND (-1)
typedef struct {
    int32_t seq;    /* sequence id, 0 .. n_seq_max-1 */
    int32_t token;
    int32_t pos;    /* position in the sequence, or TERN_POS_APPEND */
    int32_t logits; /* 1: keep this token's logits (tern_batch_logits) */
} tern_batch_entry_t;
/* Evaluate n entries in one forward pass, appending each to its sequence.
 * Errors leave every sequence as it was: TERN_EINVAL (bad sequence id,
 * token id or position: the message names the entry), TERN_ECTXFULL (a
 * sequence would pass n_ctx positions), TERN_EKVFULL (the memory has too
 * few free blocks: remove or truncate another sequence and retry), or a
 * kernel error. Timed into the decode counters of tern_timings_t. */
int tern_decode(tern_context_t *c, const tern_batch_entry_t *entries, int32_t n, tern_error_t *err);
/* n_vocab logits of entry i of the last tern_decode, NULL when it did not
 * ask for them (or i is out of range); valid until the next evaluation. */
const float *tern_batch_logits(const tern_context_t *c, int32_t i);

/* Sequence operations (seq in 0 .. n_seq_max-1, else TERN_EINVAL or -1). */
int32_t tern_context_n_seq(const tern_context_t *c); /* n_seq_max */
int32_t tern_seq_pos(const tern_context_t *c, int32_t seq); /* positions it holds */
/* Keep positions 0 .. pos-1 of seq and give back the blocks past them. */
int tern_seq_truncate(tern_context_t *c, int32_t seq, int32_t pos, tern_error_t *err);
/* Forget seq: its blocks return to the memory (those it shares stay with
 * the other sequences). */
int tern_seq_remove(tern_context_t *c, int32_t seq, tern_error_t *err);
/* dst (emptied first) takes the first n_pos positions of src without
 * copying them: the two share those blocks (a common system prompt is
 * stored once), and the block a sequence then appends into is copied for
 * it first (copy on write). Continuing dst gives the bytes a fresh
 * evaluation of the same tokens would. dst != src, n_pos <= src's. */
int tern_seq_fork(tern_context_t *c, int32_t dst, int32_t src, int32_t n_pos, tern_error_t *err);
/* Blocks in seq's table (shared ones included); -1 for a bad id. */
int32_t tern_seq_blocks(const tern_context_t *c, int32_t seq);
/* The memory's block accounting: n_used + n_free == n_blocks; n_shared
 * blocks are held by more than one sequence. */
typedef struct {
    int32_t block_pos; /* positions per block */
    int32_t n_blocks, n_used, n_free, n_shared;
} tern_kv_stats_t;
void tern_kv_stats(const tern_context_t *c, tern_kv_stats_t *st);

/* Counters since creation (or the last reset). Dispatches count the runs of
 * this context's own pool that handed work to its threads
 * (tern_pool_dispatches), so other contexts working at the same time do not
 * show up here. */
typedef struct {
    int64_t n_prompt;           /* tokens evaluated in blocks (n > 1) */
    uint64_t prompt_ns;
    uint64_t prompt_dispatches;
    int64_t n_gen;              /* tokens evaluated one at a time */
    uint64_t gen_ns;
    uint64_t gen_dispatches;
    int64_t n_sample;
    uint64_t sample_ns;         /* time in the sampler, via tern_generate */
    int64_t n_decode;           /* tokens evaluated by tern_decode */
    int64_t n_decode_calls;
    uint64_t decode_ns;
    uint64_t decode_dispatches;
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
/* Whether the GEMMs (prompts, batches) use AMX tiles, and if not why: a
 * sentence starting "yes" or "no: ". */
const char *tern_amx_status(void);

/* ---- sampling ----
 * The chain, its stages and their order: tern_sampler.h. A sampler is used
 * by one thread at a time. */
tern_sampler_params_t tern_sampler_default_params(void); /* seed 0x7e57 */
/* The default chain of p. NULL on error (TERN_EINVAL names the bad
 * parameter). The caller owns it. */
tern_sampler_t *tern_sampler_create(const tern_model_t *m, const tern_sampler_params_t *p, tern_error_t *err);
/* A chain of n_stages stages in the application's order (each kind at most
 * once, TERN_STAGE_DIST or TERN_STAGE_GREEDY last), parameters from p.
 * TERN_EINVAL for a bad chain (the message says what). E.g. temperature
 * before the truncations:
 *     tern_sampler_stage_t st[] = {TERN_STAGE_MASK, TERN_STAGE_PENALTIES, TERN_STAGE_TEMP,
 *                                  TERN_STAGE_TOP_K, TERN_STAGE_TOP_P, TERN_STAGE_DIST};
 *     s = tern_sampler_create_chain(m, &p, st, 6, &err); */
tern_sampler_t *tern_sampler_create_chain(const tern_model_t *m, const tern_sampler_params_t *p,
                                          const tern_sampler_stage_t *stages, int32_t n_stages, tern_error_t *err);
void tern_sampler_free(tern_sampler_t *s);
/* The chain's stages in order into stages (at most cap); returns how many
 * it has. */
int32_t tern_sampler_chain(const tern_sampler_t *s, tern_sampler_stage_t *stages, int32_t cap);
/* The MASK stage's callback (tern_mask_fn); fn NULL removes it. user is
 * passed back to fn. Stays until replaced. */
void tern_sampler_set_mask(tern_sampler_t *s, tern_mask_fn fn, void *user);
/* Replace the LOGIT_BIAS list by a copy of n entries (n 0: none).
 * TERN_EINVAL (nothing changed) for a token outside [0, n_vocab) or a bias
 * that is NaN or +INFINITY. */
int tern_sampler_set_logit_bias(tern_sampler_t *s, const tern_logit_bias_t *bias, size_t n, tern_error_t *err);
/* Choose from n_vocab logits (not modified). -1 when no token is allowed:
 * the mask and the logit bias banned every one, or the mask callback
 * returned nonzero. Without a mask or bans it never fails. */
int32_t tern_sampler_sample(tern_sampler_t *s, const float *logits);
/* Put an id in the penalty window (prompt and generated tokens); ids
 * outside [0, n_vocab) are ignored. */
void tern_sampler_accept(tern_sampler_t *s, int32_t id);
/* Empty the window and restart the RNG from the seed. */
void tern_sampler_reset(tern_sampler_t *s);

/* Snapshot and restore of the sampler's state (RNG position and penalty
 * window; not the chain, mask or bias, which are configuration): a byte
 * blob (format in tern_sampler.h) a session file can store. size: the most
 * bytes a save can take for this sampler (header + a full window), so one
 * buffer of that size serves every snapshot. save: writes the state and
 * returns its length, or 0 when cap is too small (nothing written). load:
 * 0, or an error with s unchanged: TERN_EFORMAT (truncated or malformed
 * blob, id out of range), TERN_EUNSUP (another format version), TERN_EINVAL
 * (saved for another vocabulary size, or a window longer than this
 * sampler's repeat_last_n). Safe on any bytes. */
size_t tern_sampler_state_size(const tern_sampler_t *s);
size_t tern_sampler_state_save(const tern_sampler_t *s, void *buf, size_t cap);
int tern_sampler_state_load(tern_sampler_t *s, const void *buf, size_t len, tern_error_t *err);

/* ---- grammars: constrained output ----
 * A grammar in GBNF (the format llama.cpp's grammars/README describes:
 * rules "name ::= ...", literals, character classes, groups, | * + ? {m,n},
 * comments; the start rule is "root"), compiled for one model's vocabulary.
 * A matcher is one generation's place in it. Attached to a sampler
 * (tern_sampler_set_matcher), the MASK stage lets through only the tokens
 * that keep the text inside the grammar, and end-of-generation tokens only
 * once it is complete; tern_generate advances the sampler's matcher with
 * every token it reports. The sampler tries the tokens it would pick first
 * and builds a whole mask only when the chain needs one, with the same
 * result either way (src/text/grammar.c explains how masks stay cheap).
 *
 * A grammar is immutable once created: any number of matchers on any
 * threads may share it, and it must outlive them. A matcher is used by one
 * thread at a time. */
typedef struct tern_grammar tern_grammar_t;
typedef struct tern_matcher tern_matcher_t;
/* Compile len bytes of GBNF for m's vocabulary. root: the start rule (NULL:
 * "root"). NULL on error: TERN_EINVAL with the line and column (syntax, an
 * undefined rule, left recursion, a limit passed: nesting, repetition
 * counts, size), TERN_ENOMEM. The grammar borrows m. */
tern_grammar_t *tern_grammar_create(const tern_model_t *m, const char *gbnf, size_t len, const char *root,
                                    tern_error_t *err);
void tern_grammar_free(tern_grammar_t *g);
/* Milliseconds spent indexing the vocabulary for the grammar at creation. */
double tern_grammar_compile_ms(const tern_grammar_t *g);
/* A matcher at the grammar's start. */
tern_matcher_t *tern_matcher_create(const tern_grammar_t *g, tern_error_t *err);
void tern_matcher_free(tern_matcher_t *mt);
void tern_matcher_reset(tern_matcher_t *mt);
/* dst takes src's place in the text (the same grammar). */
int tern_matcher_copy(tern_matcher_t *dst, const tern_matcher_t *src, tern_error_t *err);
/* Advance by a token: 0, or TERN_EINVAL when the grammar does not allow it
 * here (the matcher is unchanged). An end-of-generation token is allowed
 * only when the text is complete; it ends the matcher. */
int tern_matcher_accept(tern_matcher_t *mt, int32_t id, tern_error_t *err);
/* Advance by text (a prompt's prefill of the answer, say): 0 or TERN_EINVAL. */
int tern_matcher_accept_text(tern_matcher_t *mt, const char *text, size_t len, tern_error_t *err);
int tern_matcher_allows(tern_matcher_t *mt, int32_t id); /* 1: id may come next */
int tern_matcher_done(const tern_matcher_t *mt);     /* 1: the text is complete here (it may go on) */
int tern_matcher_finished(const tern_matcher_t *mt); /* 1: nothing can follow but the end */
/* The text every continuation must start with (the grammar allows exactly
 * one next character, repeatedly), at most cap bytes; returns its length.
 * Speculative decoding drafts it. */
size_t tern_matcher_forced(const tern_matcher_t *mt, char *buf, size_t cap);
/* Attach a matcher to a sampler's MASK stage (borrowed; NULL detaches). */
void tern_sampler_set_matcher(tern_sampler_t *s, tern_matcher_t *mt);
tern_matcher_t *tern_sampler_matcher(const tern_sampler_t *s);

/* ---- generation ---- */
/* Called for each generated token with its text (possibly empty while a
 * UTF-8 sequence is incomplete; text is NULL when the model has no
 * tokenizer). Return nonzero to stop. */
typedef int (*tern_token_cb)(int32_t id, const char *text, size_t len, void *user);

/* Why tern_generate stopped. Each reason also says where the KV cache ends. */
typedef enum {
    TERN_STOP_LENGTH = 0,   /* n_predict tokens reported, all evaluated */
    TERN_STOP_EOG = 1,      /* an end-of-generation token: reported, not evaluated */
    TERN_STOP_CALLBACK = 2, /* cb returned nonzero: its token was evaluated */
    TERN_STOP_CTX_FULL = 3, /* the context filled up: the last token reported did not fit */
    TERN_STOP_ERROR = 4     /* tern_generate returned an error (err says which) */
} tern_stop_reason_t;
/* "length", "eog", "callback", "context full", "error" (as an HTTP server's
 * finish_reason would want them); "?" for other values. */
const char *tern_stop_reason_name(tern_stop_reason_t r);

typedef struct {
    int32_t n_generated;     /* tokens reported to cb (not counting the final id -1 flush) */
    tern_stop_reason_t stop; /* why it stopped */
} tern_generate_result_t;

/* Evaluate the prompt (n_prompt ids, in n_batch blocks; may be 0 to continue
 * from the cache), then sample, report and evaluate up to n_predict tokens,
 * stopping early at an end-of-generation token (reported, not evaluated), a
 * full context, or when cb returns nonzero. Every reported token except an
 * end-of-generation one is evaluated, so the cache ends right after the
 * text reported and a later call continues from there (except when the
 * context filled up: the last token reported then did not fit). When
 * several reasons meet at one token, the first of EOG, CTX_FULL, CALLBACK,
 * LENGTH is reported (so the reason tells where the cache ends). Bytes the
 * detokenizer still holds at the end are reported with id -1. Prompt ids
 * are put in the sampler's penalty window. res (may be NULL) receives the
 * count of tokens reported and the stop reason. Returns 0 (also when
 * stopped early or by a full context) or an error: from tern_eval
 * (TERN_ECTXFULL when the prompt does not fit, TERN_EABORTED ...), or
 * TERN_EINVAL when the sampler's mask or logit bias allowed no token. */
int tern_generate(tern_context_t *c, tern_sampler_t *s, const int32_t *prompt, int32_t n_prompt, int32_t n_predict,
                  tern_token_cb cb, void *user, tern_generate_result_t *res, tern_error_t *err);

/* ---- speculative decoding ----
 * Lossless: tern_generate_spec reports exactly the tokens (and stop reason)
 * tern_generate would for the same context, sampler state and prompt, at
 * any temperature, and leaves the KV memory, the logits and the sampler in
 * the same state; only the time differs. Each forward pass evaluates the
 * last sampled token together with k draft tokens guessed from the text so
 * far (prompt lookup: what followed an earlier occurrence of the longest
 * n-gram the text ends with), with the logits of all k+1 positions. The
 * sampler then picks tokens from those logits one by one, exactly as plain
 * decoding would; while its pick equals the next draft, that draft is
 * already evaluated and the next position's logits are ready, so one pass
 * yields up to k+1 tokens. At the first pick that differs the remaining
 * drafts are dropped from the KV memory. Tokens are only ever sampled from
 * the logits of confirmed text, so the sampler's RNG and penalty window
 * advance as in plain decoding (Leviathan et al. 2023, with a draft that
 * puts all its probability on one token).
 *
 * The drafter and the controller are public so that a server can run them
 * per sequence around its own batched passes. Each is used by one thread at
 * a time. */

#define TERN_SPEC_DRAFT_MAX 32 /* most draft tokens per pass */
#define TERN_SPEC_NGRAM_MAX 16 /* longest n-gram the drafter matches */

typedef struct {
    int32_t n_draft_max; /* most drafts per pass, 0 .. TERN_SPEC_DRAFT_MAX; 0: plain decoding (default 8) */
    int32_t ngram_max;   /* longest suffix n-gram looked up, ngram_min .. TERN_SPEC_NGRAM_MAX (default 4) */
    int32_t ngram_min;   /* shortest, >= 1 (default 1) */
    int32_t adaptive;    /* 1: tern_spec_ctl_t picks each pass's draft length and turns drafting off when it
                          * does not pay (default); 0: always draft up to n_draft_max */
} tern_spec_params_t;
tern_spec_params_t tern_spec_default_params(void);

/* Prompt-lookup drafter: a token history with a hash index of its n-grams
 * (n = ngram_min .. ngram_max), each mapped to the position after its most
 * recent occurrence, updated as tokens are pushed (O(ngram_max^2) per
 * token), so a draft costs O(ngram_max^2 + cap) whatever the history's
 * length. */
typedef struct tern_drafter tern_drafter_t;
/* NULL on error: TERN_EINVAL (ngram_min < 1, ngram_max < ngram_min or >
 * TERN_SPEC_NGRAM_MAX), TERN_ENOMEM. */
tern_drafter_t *tern_drafter_create(int32_t ngram_min, int32_t ngram_max, tern_error_t *err);
void tern_drafter_free(tern_drafter_t *d);
/* Forget the history. */
void tern_drafter_reset(tern_drafter_t *d);
/* Append n ids (prompt, then each accepted token) to the history. TERN_ENOMEM
 * leaves the history as it was; TERN_EINVAL for n < 0. */
int tern_drafter_push(tern_drafter_t *d, const int32_t *ids, int32_t n, tern_error_t *err);
/* Keep the first n tokens (a sequence cut back); the index is rebuilt (O(n)).
 * n beyond the history: nothing changes. */
int tern_drafter_truncate(tern_drafter_t *d, int32_t n, tern_error_t *err);
int32_t tern_drafter_n_tokens(const tern_drafter_t *d);
/* Up to cap draft tokens into out: for n from ngram_max down to ngram_min,
 * the first n whose suffix n-gram of the history occurred earlier decides;
 * its most recent earlier occurrence is followed, and the tokens after it
 * are proposed (when they run into the end of the history, the repeat
 * continues: the pattern's period is copied again). Returns the count (0:
 * no n-gram matched, or cap <= 0); *n_match (may be NULL) receives the
 * matched n (0: none). Negative ids in the history are never proposed. */
int32_t tern_drafter_draft(const tern_drafter_t *d, int32_t *out, int32_t cap, int32_t *n_match);
/* The drafts of text constrained by a grammar (mt: the sampler's matcher,
 * NULL for none: tern_drafter_draft). When the grammar admits one
 * continuation, its text (tern_matcher_forced) tokenized is the draft, less
 * its last token (which may merge with what follows), with *n_match
 * TERN_SPEC_NGRAM_MAX; otherwise the n-gram drafts, cut before the first
 * token the grammar refuses. mt is not changed (a scratch copy in d checks
 * the drafts). What tern_generate_spec drafts; for a server that runs its
 * own passes. */
int32_t tern_drafter_draft_under(tern_drafter_t *d, const tern_model_t *m, tern_matcher_t *mt, int32_t *out,
                                 int32_t cap, int32_t *n_match);

/* Adaptive draft length. It keeps two estimates:
 *   a(n)  for drafts that came from a match of an n-gram (n = the
 *         drafter's n_match: a longer match is a better guess), the
 *         probability that a draft token is accepted given the ones before
 *         it were: accepted / (accepted + rejections), both counts moving
 *         sums over the passes with such drafts (decay 0.9), plus a prior
 *         weighted as one pass: the same estimate over all match lengths
 *         (itself with a prior of one half weighted as one pass). A pass
 *         whose drafts were all accepted adds no rejection.
 *   r(k)  the time of a pass with k drafts over that of a plain step
 *         (k = 0), from the times the caller reports (per k the median
 *         of the last 7, used once measured twice; else 1 + s k with s
 *         fitted by least squares to the measured ones, or s = 0.25 before
 *         any).
 * A pass with k drafts yields E(k) = 1 + a + ... + a^k tokens on average
 * (the drafts accepted, plus the token the sampler picks at the first
 * rejection or after the last draft), so drafting k pays E(k) / r(k)
 * tokens per plain step's time. tern_spec_ctl_next returns the k in
 * 1 .. n_draft_max maximizing that when it exceeds 1.05, else 0 (off for
 * that n). While off it still asks for a probe of min(3, n_draft_max)
 * drafts, so it notices when the text turns repetitive, when P passes went
 * by since the last probe: P = max(I, (r(probe) - 1) / 0.02), so that
 * failed probes cost at most 2% of the time; I starts at 16, doubles (up
 * to 256) after a probe that accepts less than half its drafts and drops
 * to 4 after one that accepts more. Every 64 passes with drafts (and
 * before the first, once a pass with drafts was timed) it asks for a plain
 * step (0) to measure the baseline again. With params.adaptive 0 it always
 * returns n_draft_max. */
typedef struct tern_spec_ctl tern_spec_ctl_t;
/* NULL on error: TERN_EINVAL (bad parameters), TERN_ENOMEM. p NULL: the defaults. */
tern_spec_ctl_t *tern_spec_ctl_create(const tern_spec_params_t *p, tern_error_t *err);
void tern_spec_ctl_free(tern_spec_ctl_t *ctl);
/* Forget what was learned. */
void tern_spec_ctl_reset(tern_spec_ctl_t *ctl);
/* How many of the drafts the drafter found with a match of n_match tokens
 * (tern_drafter_draft's *n_match) to evaluate in the next pass; 0: a plain
 * step. n_match 0 (no draft): 0. */
int32_t tern_spec_ctl_next(tern_spec_ctl_t *ctl, int32_t n_match);
/* The outcome of a pass: it evaluated n_drafted drafts of a match of
 * n_match tokens and the sampler confirmed the first n_accepted;
 * n_accepted < n_drafted means draft n_accepted + 1 was rejected. Plain
 * steps are reported too (n_drafted 0): they count toward the probes. */
void tern_spec_ctl_observe(tern_spec_ctl_t *ctl, int32_t n_match, int32_t n_drafted, int32_t n_accepted);
/* The wall time of a forward pass that evaluated n_drafted drafts (0: a
 * plain step of one token). */
void tern_spec_ctl_time(tern_spec_ctl_t *ctl, int32_t n_drafted, uint64_t ns);
typedef struct {
    double accept;     /* a(n_match) */
    double cost_slope; /* s */
    double gain;       /* E(k)/r(k) of the k it would choose now (1 when 0) */
    int32_t k;         /* what tern_spec_ctl_next would return without a probe or a baseline step */
    int32_t off;       /* 1: drafting is off for matches of this length (only probes) */
} tern_spec_ctl_info_t;
void tern_spec_ctl_info(const tern_spec_ctl_t *ctl, int32_t n_match, tern_spec_ctl_info_t *info);

/* Counters of one tern_generate_spec call. */
typedef struct {
    int64_t n_passes;      /* forward passes after the prompt (plain steps and passes with drafts) */
    int64_t n_spec_passes; /* of them, with at least one draft */
    int64_t n_drafted;     /* draft tokens evaluated */
    int64_t n_accepted;    /* of them, confirmed (each saves a pass) */
    int64_t n_generated;   /* tokens reported (= tern_generate_result_t.n_generated) */
    uint64_t pass_ns;      /* wall time of the passes */
} tern_spec_stats_t;

/* tern_generate with speculative decoding (sp NULL: the defaults;
 * sp->n_draft_max 0: plain decoding): the same arguments, callback, stop
 * reasons, KV end, result and errors, plus TERN_EINVAL for bad sp. The
 * context's timings count each token the passes kept as one generated
 * token, and the passes' whole time (dropped drafts included) as
 * generation time. st (may be NULL) receives the counters. Drafts are cut
 * to the tokens still to generate, the context's free positions and
 * n_batch - 1 (a pass is one forward block, so the abort callback never
 * runs inside one); a pass that finds too few free KV blocks (TERN_EKVFULL)
 * is retried without drafts. */
int tern_generate_spec(tern_context_t *c, tern_sampler_t *s, const int32_t *prompt, int32_t n_prompt,
                       int32_t n_predict, const tern_spec_params_t *sp, tern_token_cb cb, void *user,
                       tern_generate_result_t *res, tern_spec_stats_t *st, tern_error_t *err);

/* ---- sessions ----
 * One sequence's state (its tokens and its KV entries) in a file that is
 * appended turn by turn and survives a crash at any byte (the format and
 * the commit protocol are specified at the top of src/model/session.c), so
 * a later process continues where this one stopped without evaluating the
 * prefix again; the continuation is byte-identical to the uninterrupted run.
 *
 * Like a model, a session is opened from a file rather than created from
 * parameters, hence tern_session_open / tern_session_close (not
 * _create/_free); close accepts NULL. A session is used by one thread at a
 * time, and one file by one process at a time. */
typedef struct tern_session tern_session_t;
/* Open (or create, when absent) the session file at path for model m and
 * the KV type of c (a context of m). The committed turns are read and
 * checked; a torn tail (a crash during an append) is cut off with a
 * warning through the log callback. NULL on error: TERN_EINVAL (the file
 * belongs to another model or KV type: the message names what differs),
 * TERN_EFORMAT (not a session file, damaged header), TERN_EUNSUP (another
 * format version), TERN_EIO, TERN_ENOMEM. The caller owns it; it borrows m. */
tern_session_t *tern_session_open(const tern_model_t *m, const char *path, const tern_context_t *c,
                                  tern_error_t *err);
void tern_session_close(tern_session_t *s);
/* Committed positions (tokens) and their ids (owned by the session, valid
 * until the next append); committed turns (appends). */
int32_t tern_session_n_tokens(const tern_session_t *s);
const int32_t *tern_session_tokens(const tern_session_t *s);
int32_t tern_session_n_turns(const tern_session_t *s);
/* Empty sequence seq of c, then load into it the longest common prefix of
 * prompt and the session's tokens, but never the whole prompt: at least its last token is
 * left for the caller to evaluate (the logits are not stored), e.g.
 *     tern_session_restore_prefix(s, c, 0, ids, n, &k, &err);
 *     tern_generate(c, smp, ids + k, n - k, ...);
 * (accept ids[0..k) into the sampler first when it uses penalties).
 * *n_restored (may be NULL) receives k. On error c is left empty. */
int tern_session_restore_prefix(tern_session_t *s, tern_context_t *c, int32_t seq, const int32_t *prompt,
                                int32_t n_prompt, int32_t *n_restored, tern_error_t *err);
/* Commit what sequence seq of c holds beyond the file as one turn (written, fsynced, then
 * its commit marker written and fsynced). When the file's tokens are not a
 * prefix of c's (c went another way), the file's turns past the common
 * prefix are dropped first (cut at a turn boundary) and the rest written
 * again from c. Nothing new: no-op. Errors: TERN_EIO (the file is left at
 * its last committed turn), TERN_EINVAL. */
int tern_session_append(tern_session_t *s, const tern_context_t *c, int32_t seq, tern_error_t *err);

#ifdef __cplusplus
}
#endif
#endif /* TERN_H */
