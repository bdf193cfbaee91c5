/* model_args.h - the options that say how a model is loaded, shared by
 * tern run, chat, perplexity, serve and bench: the expert cache of a
 * Mixture-of-Experts model (--expert-cache, --expert-prefetch,
 * --expert-pin, --io-threads). One parser and one help text, so every
 * command spells and checks them the same way; a dense model accepts and
 * ignores them (tern_model_params_t does). */
#ifndef TERN_MODEL_ARGS_H
#define TERN_MODEL_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "tern.h"

/* One --expert-cache value. */
typedef enum {
    MA_CACHE_AUTO,  /* "auto": TERN_EXPERTS_AUTO */
    MA_CACHE_MMAP,  /* "off", "mmap": TERN_EXPERTS_MMAP */
    MA_CACHE_BYTES, /* "512M", "12GiB": bytes */
    MA_CACHE_SHARE  /* "25%": a share of the file's routed expert bytes, resolved at load */
} ma_cache_kind_t;

typedef struct {
    ma_cache_kind_t kind;
    uint64_t bytes; /* MA_CACHE_BYTES */
    double share;   /* MA_CACHE_SHARE: 0.25 for "25%" */
    char text[24];  /* as the user wrote it (cut to fit), for tables */
} ma_cache_t;

typedef struct {
    ma_cache_t cache;
    int prefetch;   /* 1 on, 0 off, -1 the library's default */
    int pin;        /* 1 on, 0 off, -1 the library's default */
    int io_threads; /* 0: the library's default */
} model_args_t;

#define MA_IO_THREADS_MAX 256

/* The defaults: auto, prefetch and pinning as the library decides, its
 * I/O thread count. */
void model_args_init(model_args_t *a);

/* If argv[*i] is one of the options above, take it and its value (*i moves
 * past the value) and return 1; 0 when it is not one of them; -1 on a bad
 * or missing value, with a message on stderr that names cmd and the
 * option. */
int model_args_take(model_args_t *a, const char *cmd, int argc, char **argv, int *i);

/* The value parsers behind model_args_take, for commands that take lists
 * (tern bench). 0, or -1 with a message naming cmd and opt. */
int model_args_parse_cache(const char *s, const char *cmd, const char *opt, ma_cache_t *out);
int model_args_parse_onoff(const char *s, const char *cmd, const char *opt, int *out);
int model_args_parse_io_threads(const char *s, const char *cmd, const char *opt, int *out);

/* The help lines of the options, the texts starting at column col (the
 * command's own help's). lists: tern bench's spelling (comma-separated
 * lists for the cache, prefetch and pin). */
void model_args_usage(FILE *out, int lists, int col);

/* tern_model_params_t for a (expert_cache_bytes resolved: a share needs the
 * file's expert bytes, see model_args_expert_bytes). */
int model_args_params(const char *path, const model_args_t *a, tern_model_params_t *p, tern_error_t *err);

/* The bytes of an expert cache that holds every routed expert of the file
 * at path (its experts x one slot, which has room for the alignment of
 * direct reads; 0 for a dense model): what a share N% resolves against, so
 * 100% holds them all. From a first load that only maps the file
 * (TERN_EXPERTS_MMAP: no cache, no reads, no usage file written). 0 or an
 * error from tern_model_load_ex. */
int model_args_expert_bytes(const char *path, uint64_t *bytes, tern_error_t *err);

/* The cache size in bytes a resolves to for a model with expert_bytes of
 * routed experts: TERN_EXPERTS_AUTO, TERN_EXPERTS_MMAP or bytes (a share of
 * a dense model's 0 bytes is TERN_EXPERTS_MMAP). */
int64_t model_args_cache_bytes(const ma_cache_t *c, uint64_t expert_bytes);

/* Load path with a's settings; NULL with "tern <cmd>: <message>" on stderr. */
tern_model_t *model_args_load(const char *path, const model_args_t *a, const char *cmd);

#endif
