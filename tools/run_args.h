/* run_args.h - the command-line options shared by tern run, chat and
 * perplexity (llama.cpp's flag names where they mean the same thing), and
 * the llama.cpp-style timing summary they print on stderr. */
#ifndef TERN_RUN_ARGS_H
#define TERN_RUN_ARGS_H

#include <stdint.h>

#include "model_args.h"
#include "tern.h"

typedef struct {
    const char *model;
    const char *prompt;
    const char *prompt_file;
    const char *sys;           /* chat: system message */
    const char *chat_template; /* chat: override the detected template */
    int32_t n_predict;         /* -1: until end of generation or a full context */
    int32_t n_threads, n_ctx, n_batch;
    int kv_f32;
    int special;      /* parse special tokens in the prompt */
    int no_bos;       /* do not prepend BOS even if the model wants it */
    int print_ids;    /* run: print generated ids (one line) instead of text */
    int no_display_prompt;
    int profile;      /* print the per-op profile with the timings */
    int logits_digest; /* run: print a hash of every logit vector sampled from */
    int seed_given;
    const char *session; /* run, chat: session file (prompt cache), or NULL */
    model_args_t ma;     /* how the model is loaded (the expert cache) */
    tern_sampler_params_t sp;
    /* constrained output (run): at most one of them */
    const char *grammar;      /* GBNF text */
    const char *grammar_file; /* GBNF file */
    const char *json_schema;  /* a JSON schema: a file, or the text itself when it starts with '{' */
    tern_spec_params_t spec; /* run, chat: speculative decoding (n_draft_max 0: off, the default) */
} run_opts_t;

/* The GBNF text o asks for (malloc'd), or NULL with *none set when it asks
 * for no grammar; NULL with *none 0 after an error (printed). */
char *run_grammar_text(const run_opts_t *o, int *none);

/* Parse argv[1..]; cmd names the subcommand for messages and help ("run",
 * "chat", "perplexity"). Returns 0 to proceed, 1 when --help was printed,
 * 2 on a bad option (message printed). */
int run_opts_parse(run_opts_t *o, int argc, char **argv, const char *cmd);

/* Load o->model with o->ma's settings, printing the error on stderr when it
 * fails (NULL then); cmd names the subcommand in the message. */
tern_model_t *run_load_model(const run_opts_t *o, const char *cmd);

/* Read a whole file into a malloc'd NUL-terminated buffer; NULL with a
 * message on stderr. */
char *run_read_file(const char *path, size_t *len);

/* The expert cache's counters and the context's timings when generation
 * started (taken at the first generated token, before it is evaluated), so
 * that the summary can give the generation's own figures. */
typedef struct {
    int taken;
    tern_expert_stats_t es;
    tern_timings_t t;
} run_gen_mark_t;
/* Take the mark, once (later calls do nothing). */
void run_mark_generation(run_gen_mark_t *mk, const tern_model_t *m, const tern_context_t *c);

/* The stderr summary: load, prompt and generation times and rates,
 * dispatches per token, threads, ISA, with --profile the per-op split, and
 * for a model with an expert cache a line on it: hit rate, GB read per
 * token, I/O GB/s, the share of the time spent waiting on reads, the
 * prefetch's prediction accuracy; over the generation after mk (when
 * taken and tokens were generated after it), else over everything
 * evaluated. mk may be NULL. */
void run_print_timings(const tern_model_t *m, const tern_context_t *c, const run_opts_t *o, double total_ms,
                       const run_gen_mark_t *mk);

/* With speculative decoding on (o->spec.n_draft_max > 0): a line with the
 * drafts evaluated and accepted, the acceptance rate, the passes and the
 * tokens per pass. */
void run_print_spec(const run_opts_t *o, const tern_spec_stats_t *st);

#endif
