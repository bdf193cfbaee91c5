/*
 * session.h - one sequence's state (its tokens and its KV entries) in a
 * crash-safe, append-only file (the format is specified at the top of
 * session.c). A session belongs to one model and one KV type (its
 * fingerprint); a file of another is refused with an error naming what
 * differs.
 *
 * A session_t is an open file: its committed tokens are held in memory, its
 * KV rows stay on disk until session_restore reads them. Used by one thread
 * at a time. Two processes must not append to one file at once.
 */
#ifndef TERN_SESSION_H
#define TERN_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "tern_error.h"

/* What a session file must match. */
typedef struct {
    uint32_t arch, kv_type, n_layer, n_head_kv, head_dim, n_vocab;
    uint64_t model_hash; /* session_model_hash */
} session_fp_t;

/* A 64-bit FNV-1a over the model's GGUF identity: file size, every metadata
 * entry (key and raw value), every tensor's name, type, shape and offset,
 * and up to 3 x 64 bytes of each tensor's data (start, middle, end). Cheap
 * (a few pages per tensor) and tells apart files that differ in metadata,
 * layout or (almost surely) weights; two files that differ only in weight
 * bytes outside the sampled ones hash alike. */
uint64_t session_model_hash(const model_t *m);
/* The fingerprint of m with a KV cache of kv_type (TYPE_F16 / TYPE_F32). */
void session_fingerprint(const model_t *m, int kv_type, session_fp_t *fp);

typedef struct session session_t;

/* Open path for fp, creating it (header only, written to path.tmp, fsynced
 * and renamed: a crash never leaves a half header) when it does not exist.
 * Every committed turn is read and checked (sizes against the file length
 * before any allocation, then its checksum); the first torn or invalid
 * record ends the file: it is cut off (ftruncate + fsync) with a tern_log
 * warning "session FILE: cut N torn bytes after turn K". Errors: TERN_EIO
 * (open/read/create), TERN_EFORMAT (not a session file, a damaged header),
 * TERN_EUNSUP (another format version), TERN_EINVAL (another model or KV
 * type: the message names the field). */
session_t *session_open(const char *path, const session_fp_t *fp, tern_error_t *err);
void session_close(session_t *s);

int64_t session_n_tokens(const session_t *s);      /* positions committed */
const int32_t *session_tokens(const session_t *s); /* their ids; valid until the next append/truncate */
int64_t session_n_turns(const session_t *s);       /* committed records */
uint64_t session_cut_bytes(const session_t *s);    /* torn bytes cut off at open (0: none) */

/* Load the first n_pos committed positions (tokens and KV rows) into
 * sequence seq of c, which is emptied first (n_pos <= session_n_tokens,
 * <= c's n_ctx, c's KV layout matches the fingerprint; TERN_EKVFULL when the
 * memory lacks the blocks). Bad arguments (sequence, layout, n_pos) leave
 * the sequence as it was; past them it is emptied, each record read is
 * checked against its checksum again, and any later error (TERN_EKVFULL
 * included) leaves it empty. */
int session_restore(session_t *s, model_ctx_t *c, int seq, int64_t n_pos, tern_error_t *err);
/* The same into a bare memory (the fuzz target's). */
int session_restore_kv(session_t *s, kv_cache_t *kv, int seq, int64_t n_pos, tern_error_t *err);
/* Drop the turns that end after n_pos (the file is cut to the last turn
 * boundary <= n_pos and fsynced). session_n_tokens then says where it ends. */
int session_truncate(session_t *s, int64_t n_pos, tern_error_t *err);
/* Append one turn: positions [session_n_tokens, session_n_tokens + n) with
 * ids tokens, their K and V rows read from sequence seq of c (which must
 * hold them). The
 * record is written, then fsynced; it counts only once complete (its
 * checksum, written last, matches). n 0 is a no-op. */
int session_append(session_t *s, const model_ctx_t *c, int seq, const int32_t *tokens, int64_t n,
                   tern_error_t *err);

#endif
