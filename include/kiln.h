/*
 * kiln.h - the public C API of kiln, an LLM inference engine.
 *
 * Conventions (see DESIGN.md):
 *   - Every fallible call returns a kiln_status and, when `err` is non-NULL, fills
 *     err->message with a sentence a person can act on.
 *   - Objects have one owner and a _create/_destroy (or _load/_free) pair;
 *     _destroy(NULL) is a no-op.
 */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION "0.1.0"

/** Result of every fallible kiln call. KILN_OK is 0; all errors are non-zero. */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARGUMENT, /* a caller-supplied value is out of range or malformed */
    KILN_ERR_IO,               /* open/read/write/mmap failed */
    KILN_ERR_FORMAT,           /* a file is corrupt, truncated or inconsistent */
    KILN_ERR_UNSUPPORTED,      /* well-formed, but kiln does not implement it */
    KILN_ERR_OUT_OF_MEMORY,    /* an allocation failed */
    KILN_ERR_NOT_FOUND,        /* a named key, tensor or file does not exist */
    KILN_ERR_CANCELLED,        /* the operation was cancelled */
    KILN_ERR_INTERNAL,         /* a broken invariant inside kiln: a bug */
} kiln_status;

/** Human-readable error filled by fallible calls. `message` is NUL-terminated. */
typedef struct kiln_error {
    kiln_status status;
    char message[1024];
} kiln_error;

/** Stable short name of a status ("ok", "invalid_argument", ...). Never NULL. */
const char *kiln_status_name(kiln_status status);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
