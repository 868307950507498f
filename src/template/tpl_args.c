/* tpl_args.c - how the built-in filters, tests and methods take their arguments: Python's
 * binding of positional and keyword arguments to parameters, and the TypeErrors Python raises
 * for what does not bind or is not an integer. */
#include <stdio.h>

#include "template/tpl.h"

int tpl_arg_error(rctx *c, const char *fmt, const char *a, const char *b) {
    char buf[300];
    snprintf(buf, sizeof buf, fmt, a, b);
    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError", "%s", buf);
}

/* Bind Python-style arguments to the parameter list `names` (np of them); `req` leading
 * parameters are required. out[k] is TV_UNDEF with u == NULL and given[k] false for absent
 * optional parameters. */
int tpl_bind_args(rctx *c, const char *fname, const char *const *names, size_t np, size_t req,
                  const tv *args, size_t nargs, const tstr **kwn, const tv *kwv, size_t nkw,
                  tv *out, bool *given) {
    if (nargs > np) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s() takes at most %zu arguments (%zu given)", fname, np, nargs);
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError", "%s", msg);
    }
    for (size_t k = 0; k < np; k++) {
        given[k] = k < nargs;
        out[k] = k < nargs ? args[k] : tv_undef();
    }
    for (size_t j = 0; j < nkw; j++) {
        size_t k = 0;
        while (k < np && !tpl_str_eq(kwn[j], names[k])) k++;
        if (k == np)
            return tpl_arg_error(c, "%s() got an unexpected keyword argument '%s'", fname,
                                 kwn[j]->s);
        if (given[k])
            return tpl_arg_error(c, "%s() got multiple values for argument '%s'", fname, kwn[j]->s);
        given[k] = true;
        out[k] = kwv[j];
    }
    for (size_t k = 0; k < req; k++)
        if (!given[k])
            return tpl_arg_error(c, "%s() missing required argument '%s'", fname, names[k]);
    return 0;
}

int tpl_need_int(rctx *c, tv v, const char *what, int64_t *out) {
    if (v.type == TV_INT || v.type == TV_BOOL) {
        *out = tv_ival(v);
        return 0;
    }
    if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
    return tpl_arg_error(c, "'%s' object cannot be interpreted as an integer (%s)", tv_type_name(v),
                         what);
}
