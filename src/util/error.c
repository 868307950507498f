#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kiln_status_name(kiln_status status) {
    switch (status) {
    case KILN_OK: return "ok";
    case KILN_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case KILN_ERR_IO: return "io_error";
    case KILN_ERR_FORMAT: return "format_error";
    case KILN_ERR_UNSUPPORTED: return "unsupported";
    case KILN_ERR_OUT_OF_MEMORY: return "out_of_memory";
    case KILN_ERR_NOT_FOUND: return "not_found";
    case KILN_ERR_CANCELLED: return "cancelled";
    case KILN_ERR_INTERNAL: return "internal_error";
    case KILN_ERR_CONTEXT_OVER_BUDGET: return "context_over_budget";
    case KILN_ERR_QUEUE_FULL: return "queue_full";
    }
    return "unknown_status";
}

kiln_status kiln_error_set(kiln_error *err, kiln_status status, const char *fmt, ...) {
    if (!err) return status;
    err->status = status;
    if (status == KILN_OK || !fmt) {
        err->message[0] = '\0';
        return status;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status;
}

kiln_status kiln_error_prefix(kiln_error *err, const char *fmt, ...) {
    if (!err) return KILN_ERR_INTERNAL;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* message = prefix + old message, truncated to fit */
    size_t cap = sizeof err->message, pl = strlen(prefix), ol = strnlen(err->message, cap - 1);
    if (pl > cap - 1) pl = cap - 1;
    if (pl + ol > cap - 1) ol = cap - 1 - pl;
    memmove(err->message + pl, err->message, ol);
    memcpy(err->message, prefix, pl);
    err->message[pl + ol] = '\0';
    return err->status;
}
