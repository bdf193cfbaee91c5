/*
 * tokenizer.h - exact SPM and byte-level BPE tokenizers built from a GGUF
 * file's tokenizer.ggml.* metadata, streaming detokenization, and chat
 * templates. Knows nothing about the forward pass.
 */
#ifndef TERN_TOKENIZER_H
#define TERN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "tern_error.h"

typedef struct tokenizer tokenizer_t;

/* Build from metadata (the tokenizer copies what it needs; f may be closed
 * afterwards). NULL with a clear message for unknown models/pre-tokenizers. */
tokenizer_t *tok_load(const gguf_file_t *f, tern_error_t *err);
void tok_free(tokenizer_t *t);

int32_t tok_n_vocab(const tokenizer_t *t);
int32_t tok_bos(const tokenizer_t *t); /* -1 if none */
int32_t tok_eos(const tokenizer_t *t);
bool tok_add_bos(const tokenizer_t *t); /* tokenizer.ggml.add_bos_token (model default) */
bool tok_is_eog(const tokenizer_t *t, int32_t id); /* EOS, EOT, <|im_end|> ... */
const char *tok_model_name(const tokenizer_t *t); /* "llama" / "gpt2" */
const char *tok_pre_name(const tokenizer_t *t);   /* pre-tokenizer, "" for SPM */

/* Encode len bytes of text. *ids is malloc'd (caller frees), *n_ids its
 * length. add_bos: prepend BOS. parse_special: recognize special/control
 * token texts inside the input (user-defined tokens are always recognized).
 * Any bytes are accepted, invalid UTF-8 included. Errors: BOS asked for but
 * absent, text over 256 MiB, a byte the vocab cannot spell at all (SPM
 * without byte tokens or <unk>), out of memory; then *ids is NULL. */
int tok_encode(const tokenizer_t *t, const char *text, size_t len, bool add_bos, bool parse_special,
               int32_t **ids, size_t *n_ids, tern_error_t *err);

/* The bytes a token id stands for (byte tokens and the SPM space marker
 * resolved; control tokens give their text, e.g. "<|im_end|>"). NUL-
 * terminated, owned by the tokenizer. NULL for an id out of range. */
const char *tok_piece(const tokenizer_t *t, int32_t id, size_t *len);

/* Streaming decode: bytes are held until a UTF-8 code point completes, so
 * the output never contains half a sequence. */
typedef struct {
    const tokenizer_t *t;
    unsigned char pending[8];
    int n_pending;
    bool first; /* SPM: strip the leading space of the first piece */
} tok_stream_t;
void tok_stream_init(tok_stream_t *s, const tokenizer_t *t);
/* Append the completed bytes for id to out (cap bytes); returns the count
 * written, or -1 if cap is too small (the stream is then unchanged; 3 x the
 * piece length + 12 always suffices). Control and unknown tokens and ids out
 * of range write nothing; invalid UTF-8 becomes U+FFFD. */
int tok_stream_push(tok_stream_t *s, int32_t id, char *out, size_t cap);
/* Flush pending bytes (invalid leftovers become U+FFFD). */
int tok_stream_flush(tok_stream_t *s, char *out, size_t cap);

/* ---- additions (tokenizer helper) ----------------------------------------
 * Thread safety: a tokenizer_t is immutable once built; tok_encode, tok_decode
 * and the accessors may run concurrently on one tokenizer from any number of
 * threads. A tok_stream_t belongs to one thread at a time. */

/* Token types as stored in tokenizer.ggml.token_type. */
enum {
    TOK_TYPE_UNDEFINED = 0, TOK_TYPE_NORMAL = 1, TOK_TYPE_UNKNOWN = 2, TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4, TOK_TYPE_UNUSED = 5, TOK_TYPE_BYTE = 6
};

/* A tokenizer described in memory, the way the tokenizer.ggml.* keys describe
 * it (tests build small ones; tok_load fills one from a GGUF file). Strings
 * need not be NUL-terminated; everything is copied. */
typedef struct {
    const char *model;            /* "llama" (SPM) or "gpt2" (byte-level BPE) */
    const char *pre;              /* BPE pre-tokenizer; NULL or "" = "default" */
    const char *name;             /* general.name (a Phi-3 quirk keys on it); may be NULL */
    int32_t n_vocab;
    const gguf_str_t *tokens;     /* n_vocab texts */
    const float *scores;          /* n_vocab SPM scores, or NULL (all 0) */
    const int32_t *types;         /* n_vocab TOK_TYPE_*, or NULL (all normal) */
    uint64_t n_merges;
    const gguf_str_t *merges;     /* BPE: "left right", rank = index */
    /* Special ids: -1 none, -2 the model's default. */
    int32_t bos, eos, eot, eom, unk, pad;
    /* Flags: -1 the model's default, else 0/1. */
    int add_bos, add_eos, add_space_prefix;
} tok_spec_t;
/* Build from a spec. NULL with a clear message on bad input. */
tokenizer_t *tok_new(const tok_spec_t *spec, tern_error_t *err);

int tok_token_type(const tokenizer_t *t, int32_t id); /* TOK_TYPE_*, -1 out of range */
/* Control or unknown token (never produced from text without parse_special,
 * and not rendered by the stream decoder). */
bool tok_is_control(const tokenizer_t *t, int32_t id);
/* The raw text of a token as stored in the vocab (byte-level / U+2581 form). */
const char *tok_token_text(const tokenizer_t *t, int32_t id, size_t *len);
/* Exact vocab lookup of a raw token text; -1 if absent. */
int32_t tok_find(const tokenizer_t *t, const char *text, size_t len);
int32_t tok_eot(const tokenizer_t *t);
int32_t tok_unk(const tokenizer_t *t);
bool tok_add_eos(const tokenizer_t *t);
/* True when every byte value has a token (byte fallback for SPM, the 256
 * byte-level symbols for BPE): then any text without special tokens (and,
 * for SPM, without U+2581) decodes back to itself. */
bool tok_bytes_complete(const tokenizer_t *t);
/* True when every byte of text has a token of its own (byte fallback or
 * byte-level symbol), i.e. the vocab can spell the text whatever merges do. */
bool tok_can_represent(const tokenizer_t *t, const char *text, size_t len);

/* Decode ids to raw bytes (no UTF-8 repair): control tokens are skipped
 * (with special: written as their text), the SPM leading space of the first
 * piece is removed. *out is malloc'd and NUL-terminated (caller frees).
 * Error for an id out of range. */
int tok_decode(const tokenizer_t *t, const int32_t *ids, size_t n, bool special, char **out, size_t *out_len,
               tern_error_t *err);

/* ---- chat templates ----------------------------------------------------- */
typedef enum { CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_PHI3, CHAT_UNKNOWN } chat_tmpl_t;
typedef struct {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} chat_msg_t;
/* Detect from tokenizer.chat_template (distinctive markers). */
chat_tmpl_t chat_detect(const gguf_file_t *f);
chat_tmpl_t chat_detect_str(const char *tmpl, size_t len); /* the same on the template text */
chat_tmpl_t chat_from_name(const char *name); /* "chatml", "llama3", "llama2", "mistral", "phi3" */
const char *chat_name(chat_tmpl_t t);
/* Render messages; with add_assistant, append the opening of the assistant
 * turn. *out is malloc'd. */
int chat_render(chat_tmpl_t tmpl, const chat_msg_t *msgs, size_t n, bool add_assistant, char **out,
                tern_error_t *err);

#endif
