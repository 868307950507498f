/* error.h - filling kiln_error values (DESIGN.md principle 4: errors are values). */
#ifndef KILN_UTIL_ERROR_H
#define KILN_UTIL_ERROR_H

#include "kiln.h"

/**
 * Record an error and return its status, so callers can write
 * `return kiln_error_set(err, KILN_ERR_FORMAT, "%s: bad magic at offset %zu", path, off);`.
 *
 * err:    may be NULL (then only the status is returned).
 * status: the status to record; KILN_OK clears the message.
 * fmt:    printf-style message; truncated to fit err->message (1024 bytes with NUL).
 * Returns `status`.
 */
kiln_status kiln_error_set(kiln_error *err, kiln_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/**
 * Prefix an existing error message with context ("loading model X: " + old message).
 * err may be NULL. Returns err->status (or KILN_ERR_INTERNAL if err is NULL).
 */
kiln_status kiln_error_prefix(kiln_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
