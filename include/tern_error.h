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
    TERN_EJOB = -7      /* a pool job reported failure */
};

#define TERN_ERR_MSG 512
typedef struct tern_error {
    int code;
    char msg[TERN_ERR_MSG];
} tern_error_t;

#ifdef __cplusplus
}
#endif
#endif /* TERN_ERROR_H */
