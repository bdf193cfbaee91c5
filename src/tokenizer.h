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

#include "gguf.h"
#include "tern.h"

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
 * token texts inside the input. */
int tok_encode(const tokenizer_t *t, const char *text, size_t len, bool add_bos, bool parse_special,
               int32_t **ids, size_t *n_ids, tern_error_t *err);

/* The bytes a token id stands for (byte tokens and the SPM space marker
 * resolved). NULL for an id out of range. */
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
 * written, or -1 if cap is too small. */
int tok_stream_push(tok_stream_t *s, int32_t id, char *out, size_t cap);
/* Flush pending bytes (invalid leftovers become U+FFFD). */
int tok_stream_flush(tok_stream_t *s, char *out, size_t cap);

/* ---- chat templates ----------------------------------------------------- */
typedef enum { CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_PHI3, CHAT_UNKNOWN } chat_tmpl_t;
typedef struct {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} chat_msg_t;
/* Detect from tokenizer.chat_template (distinctive markers). */
chat_tmpl_t chat_detect(const gguf_file_t *f);
chat_tmpl_t chat_from_name(const char *name); /* "chatml", "llama3", "llama2", "mistral", "phi3" */
const char *chat_name(chat_tmpl_t t);
/* Render messages; with add_assistant, append the opening of the assistant
 * turn. *out is malloc'd. */
int chat_render(chat_tmpl_t tmpl, const chat_msg_t *msgs, size_t n, bool add_assistant, char **out,
                tern_error_t *err);

#endif
