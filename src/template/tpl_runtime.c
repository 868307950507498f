/* tpl_runtime.c - how a render fails and what it may spend: the first error is recorded in the
 * render context (kind, position, message) and every later one ignored; statements,
 * iterations and items count against max_steps. */
#include <stdarg.h>
#include <stdio.h>

#include "template/tpl.h"

int rt_fail(rctx *c, kiln_template_error_kind kind, const char *exc, const char *fmt, ...) {
    if (c->d.kind != KILN_TEMPLATE_OK) return -1; /* the first error wins */
    c->d.kind = kind;
    c->d.line = c->line;
    c->d.col = c->col;
    size_t off = 0;
    if (exc) off = (size_t)snprintf(c->d.msg, sizeof c->d.msg, "%s: ", exc);
    if (off >= sizeof c->d.msg) off = sizeof c->d.msg - 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->d.msg + off, sizeof c->d.msg - off, fmt, ap);
    va_end(ap);
    return -1;
}

int rt_type_error(rctx *c, const char *fmt, ...) {
    char buf[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError", "%s", buf);
}

int rt_oom(rctx *c) {
    if (c->ar.over)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "memory limit exceeded (%zu bytes)",
                       c->ar.cap);
    return rt_fail(c, KILN_TEMPLATE_ERR_MEMORY, NULL, "out of memory");
}

int rt_step(rctx *c, uint64_t n) {
    c->steps += n;
    if (c->steps > c->max_steps)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL,
                       "step limit exceeded (%llu statements, iterations and items)",
                       (unsigned long long)c->max_steps);
    return 0;
}
