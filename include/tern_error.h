/*
 * tern_error.h - tern's error codes and the error record every fallible call
 * fills. The bottom of the public API: every layer of the library includes
 * it, and tern.h includes it for applications.
 *
 * Functions that can fail return 0 on success and a negative TERN_E* code on
 * failure, filling `err` (when not NULL) with a message that says what was
 * wrong and where. The library never exits or aborts on bad input; only a
 * broken internal invariant stops the program (TERN_CHECK).
 */
#ifndef TERN_ERROR_H
#define TERN_ERROR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------ */

enum {
    TERN_OK = 0,
    TERN_EINVAL = -1,   /* bad argument */
    TERN_ENOMEM = -2,   /* allocation failed */
    TERN_EIO = -3,      /* file could not be opened/read/written */
    TERN_EFORMAT = -4,  /* malformed or hostile input file */
    TERN_EUNSUP = -5,   /* valid but unsupported (architecture, type ...) */
    TERN_EBUSY = -6,    /* object in use by another thread */
    TERN_EJOB = -7,     /* a pool job reported failure */
    TERN_ECTXFULL = -8, /* the sequence would pass the context size (tern_eval, tern_decode) */
    TERN_EABORTED = -9, /* the abort callback stopped an evaluation (tern_eval) */
    TERN_EKVFULL = -10  /* the KV memory has too few free blocks for the tokens: free another
                           sequence (tern_seq_remove / tern_seq_truncate) and retry */
};

#define TERN_ERR_MSG 512
typedef struct tern_error {
    int code;
    char msg[TERN_ERR_MSG];
} tern_error_t;

/* ---- diagnostics ------------------------------------------------------- */

/* The library never prints on its own: warnings (an ignored environment
 * variable, an ISA the CPU lacks ...) go to a log callback. The default
 * writes "tern: <msg>\n" to stderr; tern_log_set(NULL, NULL) restores it,
 * and a callback that does nothing silences the library. The callback may
 * be called from any thread that calls into tern, so it must be
 * thread-safe; msg is valid only during the call. Set it before creating
 * models or contexts (the setting itself is an atomic store). */
typedef enum { TERN_LOG_ERROR = 0, TERN_LOG_WARN = 1, TERN_LOG_INFO = 2 } tern_log_level_t;
typedef void (*tern_log_fn)(tern_log_level_t level, const char *msg, void *user);
void tern_log_set(tern_log_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif /* TERN_ERROR_H */
