/* tpl_eval.c - the interpreter: statements, expressions, scopes, macros, and the globals of
 * transformers' chat-template environment (range, dict, namespace, raise_exception,
 * strftime_now).
 *
 * Scoping follows Jinja2's compiled code: `if` shares its enclosing scope; every `for`
 * iteration, macro call, `with` and call-block body gets a fresh scope whose parent is the
 * enclosing one (for macros: the scope they are defined in, read at call time like the
 * Python closure Jinja2 generates). `set` writes the innermost scope, so a `set` inside a loop is
 * invisible after it - hence templates use namespace() objects, whose attributes `set ns.x`
 * mutates.
 *
 * Undefined follows jinja2.runtime.Undefined: printing, iterating, len() and truth work
 * ("", empty, 0, false), comparing with == is false; attribute/item access, calls,
 * arithmetic and ordering raise UndefinedError.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "template/tpl.h"

enum { R_OK = 0, R_BREAK = 1, R_CONTINUE = 2 };
enum { G_RANGE, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME, G_COUNT };
static const char *const global_names[G_COUNT] = {"range", "dict", "namespace", "raise_exception",
                                                  "strftime_now"};
enum { MAX_RANGE = 100000 };

int tpl_eval(rctx *c, const expr *e, scope *sc, tv *out);

/* ---------------------------------------------------------------------------------------- */
/* recursion depth                                                                          */

static int enter(rctx *c) {
    if (++c->depth > c->max_depth) {
        c->depth--;
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, "RecursionError",
                       "maximum template recursion depth exceeded (%d)", c->max_depth);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* scopes                                                                                    */

static scope *scope_new(rctx *c, scope *parent) {
    scope *s = tpl_zalloc(&c->ar, sizeof *s);
    if (!s) {
        rt_oom(c);
        return NULL;
    }
    s->parent = parent;
    return s;
}

static bool name_eq(const tstr *a, const tstr *b) {
    return a == b || (a->len == b->len && memcmp(a->s, b->s, a->len) == 0);
}

static tv *scope_find_local(scope *s, const tstr *name) {
    for (size_t k = s->n; k > 0; k--)
        if (name_eq(s->names[k - 1], name)) return &s->vals[k - 1];
    return NULL;
}

static int scope_set(rctx *c, scope *s, const tstr *name, tv v) {
    tv *p = scope_find_local(s, name);
    if (p) {
        *p = v;
        return 0;
    }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const tstr **nn = tpl_realloc(&c->ar, s->names, s->cap * sizeof *nn, nc * sizeof *nn);
        if (!nn) return rt_oom(c);
        s->names = nn;
        tv *nv = tpl_realloc(&c->ar, s->vals, s->cap * sizeof *nv, nc * sizeof *nv);
        if (!nv) return rt_oom(c);
        s->vals = nv;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
    return 0;
}

static int scope_set_c(rctx *c, scope *s, const char *name, tv v) {
    const tstr *n = tpl_str_new(&c->ar, name, strlen(name));
    if (!n) return rt_oom(c);
    return scope_set(c, s, n, v);
}

static int lookup(rctx *c, scope *s, const tstr *name, tv *out) {
    for (; s; s = s->parent) {
        tv *p = scope_find_local(s, name);
        if (p) {
            *out = *p;
            return 0;
        }
    }
    for (int g = 0; g < G_COUNT; g++) {
        if (tpl_str_eq(name, global_names[g])) {
            tfunc *f = tpl_zalloc(&c->ar, sizeof *f);
            if (!f) return rt_oom(c);
            f->kind = F_BUILTIN;
            f->id = g;
            out->type = TV_FUNC;
            out->markup = 0;
            out->fn = f;
            return 0;
        }
    }
    *out = tv_undef_named(c, name);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* calls                                                                                     */

static int exec_body(rctx *c, const body *b, scope *sc);

static int render_to(rctx *c, const body *b, scope *sc, tv *out, int *ctl) {
    sbuf buf = {0};
    sbuf *saved = c->out;
    c->out = &buf;
    int r = exec_body(c, b, sc);
    c->out = saved;
    if (r < 0) return -1;
    if (ctl) *ctl = r;
    if (!buf.p) return tv_strc(c, "", 0, out);
    return sb_str(c, &buf, out);
}

static int call_macro(rctx *c, const tfunc *fn, const tv *args, size_t nargs, const tstr **kwn,
                      const tv *kwv, size_t nkw, tv *out) {
    const stmt *m = fn->node;
    const signature *sig = fn->kind == F_MACRO ? &m->macro.sig : &m->callblock.sig;
    const body *bd = fn->kind == F_MACRO ? &m->macro.body : &m->callblock.body;
    const char *mname = fn->kind == F_MACRO ? m->macro.name->s : "caller";
    if (enter(c)) return -1;
    int rc = -1;
    scope *sc = scope_new(c, fn->sc ? fn->sc : c->root);
    if (!sc) goto done;
    bool *used = tpl_zalloc(&c->ar, nkw + 1);
    if (!used) {
        rt_oom(c);
        goto done;
    }
    tv caller = tv_undef();
    bool have_caller = false;
    for (size_t k = 0; k < nkw; k++) {
        if (sig->uses_caller && tpl_str_eq(kwn[k], "caller")) {
            caller = kwv[k];
            have_caller = true;
            used[k] = true;
        }
    }
    for (size_t p = 0; p < sig->nparams; p++) {
        const tstr *pn = sig->params[p];
        tv v;
        bool set = false;
        if (p < nargs) {
            v = args[p];
            set = true;
        }
        for (size_t k = 0; k < nkw; k++) {
            if (!used[k] && name_eq(kwn[k], pn)) {
                if (set) {
                    rt_type_error(c, "macro '%s' got multiple values for argument '%s'", mname,
                                  pn->s);
                    goto done;
                }
                v = kwv[k];
                used[k] = true;
                set = true;
            }
        }
        if (!set) {
            size_t first_default = sig->nparams - sig->ndefaults;
            if (p >= first_default) {
                const expr *d = sig->defaults[p - first_default];
                c->line = d->line;
                if (tpl_eval(c, d, sc, &v)) goto done;
            } else {
                char msg[200];
                snprintf(msg, sizeof msg, "parameter '%s' was not provided", pn->s);
                v = tv_undef_hint(c, msg, UX_UNDEFINED);
            }
        }
        if (scope_set(c, sc, pn, v)) goto done;
    }
    if (nargs > sig->nparams) {
        if (!sig->uses_varargs) {
            rt_type_error(c, "macro '%s' takes not more than %zu argument(s)", mname, sig->nparams);
            goto done;
        }
    }
    if (sig->uses_varargs) {
        size_t extra = nargs > sig->nparams ? nargs - sig->nparams : 0;
        tlist *va = tl_new(c, L_TUPLE, extra);
        if (!va) goto done;
        for (size_t k = 0; k < extra; k++) va->v[va->n++] = args[sig->nparams + k];
        if (scope_set_c(c, sc, "varargs", tv_list(va))) goto done;
    }
    tdict *kw = NULL;
    if (sig->uses_kwargs && !(kw = td_new(c))) goto done;
    for (size_t k = 0; k < nkw; k++) {
        if (used[k]) continue;
        if (!kw) {
            rt_type_error(c, "macro '%s' takes no keyword argument '%s'", mname, kwn[k]->s);
            goto done;
        }
        if (td_set(c, kw, tv_str(kwn[k]), kwv[k])) goto done;
    }
    if (kw && scope_set_c(c, sc, "kwargs", tv_dict(kw))) goto done;
    if (sig->uses_caller) {
        if (!have_caller) caller = tv_undef_hint(c, "No caller defined", UX_UNDEFINED);
        if (scope_set_c(c, sc, "caller", caller)) goto done;
    }
    rc = render_to(c, bd, sc, out, NULL);
done:
    c->depth--;
    return rc;
}

static int to_int_arg(rctx *c, tv v, int64_t *out) {
    if (v.type == TV_INT || v.type == TV_BOOL) {
        *out = v.type == TV_BOOL ? (int64_t)v.b : v.i;
        return 0;
    }
    if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
    return rt_type_error(c, "'%s' object cannot be interpreted as an integer", tv_type_name(v));
}

static int dict_from_args(rctx *c, const tv *args, size_t nargs, const tstr **kwn, const tv *kwv,
                          size_t nkw, const char *fname, tdict **out) {
    tdict *d = td_new(c);
    if (!d) return -1;
    if (nargs > 1) return rt_type_error(c, "%s expected at most 1 argument, got %zu", fname, nargs);
    if (nargs == 1) {
        tv a = args[0];
        if (a.type == TV_DICT || a.type == TV_NS) {
            for (size_t k = 0; k < a.d->n; k++)
                if (td_set(c, d, a.d->e[k].k, a.d->e[k].v)) return -1;
        } else {
            tlist *items;
            if (tv_iterate(c, a, &items)) return -1;
            for (size_t k = 0; k < items->n; k++) {
                tlist *pair;
                if (tv_iterate(c, items->v[k], &pair)) return -1;
                if (pair->n != 2)
                    return rt_fail(
                        c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                        "dictionary update sequence element #%zu has length %zu; 2 is required", k,
                        pair->n);
                if (td_set(c, d, pair->v[0], pair->v[1])) return -1;
            }
        }
    }
    for (size_t k = 0; k < nkw; k++)
        if (td_set(c, d, tv_str(kwn[k]), kwv[k])) return -1;
    *out = d;
    return 0;
}

static int do_strftime(rctx *c, tv fmtv, tv *out) {
    if (fmtv.type != TV_STR)
        return rt_type_error(c, "strftime() argument 1 must be str, not %s", tv_type_name(fmtv));
    struct tm tm;
    if (c->now) {
        tm = *c->now;
        struct tm norm = tm;
        time_t t = timegm(&norm); /* derive weekday and year day */
        struct tm tmp;
        if (t != (time_t)-1 && gmtime_r(&t, &tmp)) {
            tm.tm_wday = tmp.tm_wday;
            tm.tm_yday = tmp.tm_yday;
        }
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &tm);
    }
    const char *f = fmtv.s->s;
    size_t n = fmtv.s->len;
    if (memchr(f, 0, n))
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "embedded null character");
    /* datetime.strftime handles %f, %z and %Z itself (naive datetime: "000000", "", "") */
    sbuf pre = {0};
    for (size_t i = 0; i < n; i++) {
        if (f[i] == '%' && i + 1 < n) {
            char d = f[i + 1];
            if (d == 'f') {
                if (sb_puts(c, &pre, "000000")) return -1;
                i++;
                continue;
            }
            if (d == 'z' || d == 'Z') {
                i++;
                continue;
            }
            if (sb_putc(c, &pre, '%') || sb_putc(c, &pre, d)) return -1;
            i++;
            continue;
        }
        if (sb_putc(c, &pre, f[i])) return -1;
    }
    if (!pre.p) return tv_strc(c, "", 0, out);
    size_t cap = pre.n * 64 + 64;
    char *buf = tpl_alloc(&c->ar, cap);
    if (!buf) return rt_oom(c);
    /* strftime returns 0 both for an empty result and overflow; the cap makes overflow
       impossible (no directive expands past 64 bytes), so 0 means empty. */
    size_t w = strftime(buf, cap, pre.p, &tm);
    return tv_strc(c, buf, w, out);
}

static int call_builtin(rctx *c, int id, const tv *args, size_t nargs, const tstr **kwn,
                        const tv *kwv, size_t nkw, tv *out) {
    switch (id) {
    case G_RANGE: {
        if (nkw) return rt_type_error(c, "range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3)
            return rt_type_error(c, "range expected at least 1 argument, got %zu", nargs);
        int64_t a = 0, b, s = 1;
        if (nargs == 1) {
            if (to_int_arg(c, args[0], &b)) return -1;
        } else {
            if (to_int_arg(c, args[0], &a) || to_int_arg(c, args[1], &b)) return -1;
            if (nargs == 3 && to_int_arg(c, args[2], &s)) return -1;
        }
        if (s == 0)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                           "range() arg 3 must not be zero");
        int64_t count = 0;
        if (s > 0 && b > a)
            count = (int64_t)(((uint64_t)b - (uint64_t)a + (uint64_t)s - 1) / (uint64_t)s);
        if (s < 0 && a > b)
            count = (int64_t)(((uint64_t)a - (uint64_t)b + (uint64_t)(-s) - 1) / (uint64_t)(-s));
        if (count > MAX_RANGE)
            return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, "OverflowError",
                           "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                           MAX_RANGE);
        if (rt_step(c, (uint64_t)count)) return -1;
        tlist *l = tl_new(c, L_RANGE, (size_t)count);
        if (!l) return -1;
        for (int64_t k = 0; k < count; k++) l->v[l->n++] = tv_int(a + k * s);
        l->r_start = a;
        l->r_stop = b;
        l->r_step = s;
        *out = tv_list(l);
        return 0;
    }
    case G_DICT:
    case G_NAMESPACE: {
        tdict *d = NULL;
        if (dict_from_args(c, args, nargs, kwn, kwv, nkw, id == G_DICT ? "dict" : "Namespace", &d))
            return -1;
        out->type = id == G_DICT ? TV_DICT : TV_NS;
        out->markup = 0;
        out->d = d;
        return 0;
    }
    case G_RAISE: {
        if (nargs != 1 || nkw)
            return rt_type_error(
                c, "raise_exception() takes 1 positional argument but %zu were given", nargs + nkw);
        tv m;
        if (args[0].type == TV_UNDEF) {
            m = args[0];
            if (tv_to_str(c, m, &m)) return -1;
        } else if (tv_to_str(c, args[0], &m)) {
            return -1;
        }
        return rt_fail(c, KILN_TEMPLATE_ERR_RAISED, NULL, "%s", m.s->s);
    }
    case G_STRFTIME:
        if (nargs != 1 || nkw)
            return rt_type_error(c, "strftime_now() takes 1 positional argument but %zu were given",
                                 nargs + nkw);
        if (args[0].type == TV_UNDEF) return tv_undef_fail(c, args[0]);
        return do_strftime(c, args[0], out);
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, NULL, "unknown global");
}

static int call_loop(rctx *c, tv lv, const tv *args, size_t nargs, size_t nkw, tv *out);

int rt_call(rctx *c, tv fn, const tv *args, size_t nargs, const tstr **kwn, const tv *kwv,
            size_t nkw, tv *out) {
    if (fn.type == TV_UNDEF) return tv_undef_fail(c, fn);
    if (fn.type == TV_LOOP) return call_loop(c, fn, args, nargs, nkw, out);
    if (fn.type != TV_FUNC)
        return rt_type_error(c, "'%s' object is not callable", tv_type_name(fn));
    switch (fn.fn->kind) {
    case F_BUILTIN:
        return call_builtin(c, fn.fn->id, args, nargs, kwn, kwv, nkw, out);
    case F_METHOD:
        return tpl_call_method(c, fn.fn->self, fn.fn->id, args, nargs, kwn, kwv, nkw, out);
    case F_MACRO:
    case F_CALLER:
        return call_macro(c, fn.fn, args, nargs, kwn, kwv, nkw, out);
    }
    return rt_type_error(c, "object is not callable");
}

/* ---------------------------------------------------------------------------------------- */
/* expressions                                                                               */

typedef struct evargs {
    tv *args;
    size_t nargs;
    const tstr **kwn;
    tv *kwv;
    size_t nkw;
} evargs;

static int eval_args(rctx *c, const callargs *a, scope *sc, evargs *ea, size_t extra_kw) {
    size_t np = a->nargs, nk = a->nkw;
    tv dyn_a = tv_undef(), dyn_k = tv_undef();
    tlist *dl = NULL;
    if (a->dyn_args) {
        if (tpl_eval(c, a->dyn_args, sc, &dyn_a) || tv_iterate(c, dyn_a, &dl)) return -1;
        np += dl->n;
    }
    if (a->dyn_kwargs) {
        if (tpl_eval(c, a->dyn_kwargs, sc, &dyn_k)) return -1;
        if (dyn_k.type != TV_DICT)
            return rt_type_error(c, "argument after ** must be a mapping, not %s",
                                 tv_type_name(dyn_k));
        nk += dyn_k.d->n;
    }
    ea->args = tpl_alloc(&c->ar, (np + 1) * sizeof(tv));
    ea->kwn = tpl_alloc(&c->ar, (nk + extra_kw + 1) * sizeof(tstr *));
    ea->kwv = tpl_alloc(&c->ar, (nk + extra_kw + 1) * sizeof(tv));
    if (!ea->args || !ea->kwn || !ea->kwv) return rt_oom(c);
    ea->nargs = 0;
    ea->nkw = 0;
    for (size_t k = 0; k < a->nargs; k++)
        if (tpl_eval(c, a->args[k], sc, &ea->args[ea->nargs++])) return -1;
    if (dl)
        for (size_t k = 0; k < dl->n; k++) ea->args[ea->nargs++] = dl->v[k];
    for (size_t k = 0; k < a->nkw; k++) {
        ea->kwn[ea->nkw] = a->kw[k].name;
        if (tpl_eval(c, a->kw[k].value, sc, &ea->kwv[ea->nkw++])) return -1;
    }
    if (a->dyn_kwargs) {
        for (size_t k = 0; k < dyn_k.d->n; k++) {
            tv key = dyn_k.d->e[k].k;
            if (key.type != TV_STR) return rt_type_error(c, "keywords must be strings");
            ea->kwn[ea->nkw] = key.s;
            ea->kwv[ea->nkw++] = dyn_k.d->e[k].v;
        }
    }
    return 0;
}

static int eval_compare(rctx *c, const expr *e, scope *sc, tv *out) {
    tv left;
    if (tpl_eval(c, e->cmp.first, sc, &left)) return -1;
    for (size_t k = 0; k < e->cmp.n; k++) {
        tv right;
        if (tpl_eval(c, e->cmp.rest[k], sc, &right)) return -1;
        bool r = false;
        switch (e->cmp.ops[k]) {
        case CMP_EQ:
            r = tv_eq(left, right);
            break;
        case CMP_NE:
            r = !tv_eq(left, right);
            break;
        case CMP_LT:
            if (tv_lt(c, left, right, &r)) return -1;
            break;
        case CMP_GT:
            if (tv_lt(c, right, left, &r)) return -1;
            break;
        case CMP_LE:
            if (tv_le(c, left, right, &r)) return -1;
            break;
        case CMP_GE:
            if (tv_le(c, right, left, &r)) return -1;
            break;
        case CMP_IN:
            if (tpl_contains(c, left, right, &r)) return -1;
            break;
        case CMP_NOTIN:
            if (tpl_contains(c, left, right, &r)) return -1;
            r = !r;
            break;
        }
        if (!r) {
            *out = tv_bool(false);
            return 0;
        }
        left = right;
    }
    *out = tv_bool(true);
    return 0;
}

static int eval_inner(rctx *c, const expr *e, scope *sc, tv *out) {
    c->line = e->line;
    c->col = e->col;
    switch (e->kind) {
    case E_CONST:
        *out = e->cval;
        return 0;
    case E_NAME:
        return lookup(c, sc, e->nm.name, out);
    case E_NSREF:
        return rt_fail(c, KILN_TEMPLATE_ERR_SYNTAX, NULL, "namespace reference outside assignment");
    case E_LIST:
    case E_TUPLE: {
        tlist *l = tl_new(c, e->kind == E_LIST ? L_LIST : L_TUPLE, e->seq.n);
        if (!l) return -1;
        for (size_t k = 0; k < e->seq.n; k++) {
            if (tpl_eval(c, e->seq.items[k], sc, &l->v[k])) return -1;
            l->n++;
        }
        *out = tv_list(l);
        return 0;
    }
    case E_DICT: {
        tdict *d = td_new(c);
        if (!d) return -1;
        for (size_t k = 0; k < e->dict.n; k++) {
            tv kk, vv;
            if (tpl_eval(c, e->dict.keys[k], sc, &kk) || tpl_eval(c, e->dict.vals[k], sc, &vv) ||
                td_set(c, d, kk, vv))
                return -1;
        }
        *out = tv_dict(d);
        return 0;
    }
    case E_GETATTR: {
        tv obj;
        if (tpl_eval(c, e->ga.obj, sc, &obj)) return -1;
        c->line = e->line;
        c->col = e->col;
        return rt_getattr(c, obj, e->ga.attr, out);
    }
    case E_GETITEM: {
        tv obj;
        if (tpl_eval(c, e->gi.obj, sc, &obj)) return -1;
        const expr *k = e->gi.key;
        if (k->kind == E_SLICE) {
            tv lo = tv_none(), hi = tv_none(), st = tv_none();
            if ((k->sl.lo && tpl_eval(c, k->sl.lo, sc, &lo)) ||
                (k->sl.hi && tpl_eval(c, k->sl.hi, sc, &hi)) ||
                (k->sl.step && tpl_eval(c, k->sl.step, sc, &st)))
                return -1;
            c->line = e->line;
            c->col = e->col;
            return tpl_slice(c, obj, lo, hi, st, out);
        }
        tv key;
        if (tpl_eval(c, k, sc, &key)) return -1;
        c->line = e->line;
        c->col = e->col;
        return rt_getitem(c, obj, key, out);
    }
    case E_SLICE:
        *out = tv_undef_hint(c, "slice objects are not supported", UX_UNDEFINED);
        return 0;
    case E_CALL: {
        tv fn;
        evargs ea;
        if (tpl_eval(c, e->call.fn, sc, &fn) || eval_args(c, &e->call.a, sc, &ea, 0)) return -1;
        c->line = e->line;
        c->col = e->col;
        return rt_call(c, fn, ea.args, ea.nargs, ea.kwn, ea.kwv, ea.nkw, out);
    }
    case E_FILTER: {
        tv v;
        evargs ea;
        if (e->flt.obj) {
            if (tpl_eval(c, e->flt.obj, sc, &v)) return -1;
        } else {
            v = c->block_value;
        }
        if (eval_args(c, &e->flt.a, sc, &ea, 0)) return -1;
        c->line = e->line;
        c->col = e->col;
        if (e->flt.id < 0)
            return rt_fail(c,
                           e->flt.id == -2 ? KILN_TEMPLATE_ERR_UNSUPPORTED : KILN_TEMPLATE_ERR_TYPE,
                           "TemplateRuntimeError", "No filter named '%s' found.", e->flt.name->s);
        return tpl_apply_filter(c, e->flt.id, v, ea.args, ea.nargs, ea.kwn, ea.kwv, ea.nkw, out);
    }
    case E_TEST: {
        tv v;
        evargs ea;
        bool r;
        if (tpl_eval(c, e->flt.obj, sc, &v) || eval_args(c, &e->flt.a, sc, &ea, 0)) return -1;
        c->line = e->line;
        c->col = e->col;
        if (e->flt.id < 0)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TemplateRuntimeError",
                           "No test named '%s' found.", e->flt.name->s);
        if (tpl_apply_test(c, e->flt.id, v, ea.args, ea.nargs, ea.kwn, ea.kwv, ea.nkw, &r))
            return -1;
        *out = tv_bool(r);
        return 0;
    }
    case E_NOT: {
        tv v;
        if (tpl_eval(c, e->bin.a, sc, &v)) return -1;
        *out = tv_bool(!tv_truthy(v));
        return 0;
    }
    case E_NEG:
    case E_POS: {
        tv v;
        if (tpl_eval(c, e->bin.a, sc, &v)) return -1;
        return tpl_unary(c, e->kind == E_NEG, v, out);
    }
    case E_BIN: {
        tv a, b;
        if (tpl_eval(c, e->bin.a, sc, &a) || tpl_eval(c, e->bin.b, sc, &b)) return -1;
        c->line = e->line;
        c->col = e->col;
        return tpl_binop(c, e->op, a, b, out);
    }
    case E_AND:
    case E_OR: {
        tv a;
        if (tpl_eval(c, e->bin.a, sc, &a)) return -1;
        bool t = tv_truthy(a);
        if ((e->kind == E_AND && !t) || (e->kind == E_OR && t)) {
            *out = a;
            return 0;
        }
        return tpl_eval(c, e->bin.b, sc, out);
    }
    case E_CMP:
        return eval_compare(c, e, sc, out);
    case E_COND: {
        tv cond;
        if (tpl_eval(c, e->cond.cond, sc, &cond)) return -1;
        if (tv_truthy(cond)) return tpl_eval(c, e->cond.a, sc, out);
        if (e->cond.b) return tpl_eval(c, e->cond.b, sc, out);
        *out = tv_undef_hint(
            c, "the inline if-expression evaluated to false and no else section was defined.",
            UX_UNDEFINED);
        return 0;
    }
    case E_CONCAT: {
        sbuf b = {0};
        for (size_t k = 0; k < e->seq.n; k++) {
            tv v;
            if (tpl_eval(c, e->seq.items[k], sc, &v) || tv_to_sb(c, v, &b)) return -1;
        }
        if (!b.p) return tv_strc(c, "", 0, out);
        return sb_str(c, &b, out);
    }
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, NULL, "unknown expression");
}

int tpl_eval(rctx *c, const expr *e, scope *sc, tv *out) {
    if (enter(c)) return -1;
    int r = eval_inner(c, e, sc, out);
    c->depth--;
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* statements                                                                                */

static int assign(rctx *c, const expr *t, tv v, scope *sc) {
    switch (t->kind) {
    case E_NAME:
        return scope_set(c, sc, t->nm.name, v);
    case E_NSREF: {
        tv ns;
        if (lookup(c, sc, t->nm.name, &ns)) return -1;
        if (ns.type != TV_NS)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TemplateRuntimeError",
                           "cannot assign attribute on non-namespace object");
        return td_set(c, ns.d, tv_str(t->nm.attr), v);
    }
    case E_TUPLE: {
        tlist *items;
        if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
        if (tv_iterate(c, v, &items)) return -1;
        if (items->n < t->seq.n)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                           "not enough values to unpack (expected %zu, got %zu)", t->seq.n,
                           items->n);
        if (items->n > t->seq.n)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                           "too many values to unpack (expected %zu)", t->seq.n);
        for (size_t k = 0; k < t->seq.n; k++)
            if (assign(c, t->seq.items[k], items->v[k], sc)) return -1;
        return 0;
    }
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_SYNTAX, NULL, "cannot assign to this target");
}

static int output_value(rctx *c, tv v) {
    return tv_to_sb(c, v, c->out);
}

static int run_loop(rctx *c, const stmt *s, scope *sc, tv it, int depth) {
    tlist *items;
    if (tv_iterate(c, it, &items)) return -1;
    scope *is = scope_new(c, sc);
    if (!is) return -1;
    if (s->loop.filter) {
        tlist *kept = tl_new(c, L_LIST, items->n);
        if (!kept) return -1;
        for (size_t k = 0; k < items->n; k++) {
            if (rt_step(c, 1)) return -1;
            is->n = 0;
            tv keep;
            if (assign(c, s->loop.target, items->v[k], is) ||
                tpl_eval(c, s->loop.filter, is, &keep))
                return -1;
            if (tv_truthy(keep)) kept->v[kept->n++] = items->v[k];
        }
        items = kept;
    }
    if (items->n == 0) {
        if (!s->loop.els.n) return R_OK;
        scope *es = scope_new(c, sc);
        if (!es) return -1;
        int r = exec_body(c, &s->loop.els, es); /* break/continue here belong to an outer loop */
        return r < 0 ? -1 : r;
    }
    tloop *lp = tpl_zalloc(&c->ar, sizeof *lp);
    if (!lp) return rt_oom(c);
    lp->items = items;
    lp->n = items->n;
    lp->depth = depth;
    lp->node = s;
    lp->sc = sc;
    tv lv = {.type = TV_LOOP};
    lv.lp = lp;
    const tstr *loop_name = tpl_str_new(&c->ar, "loop", 4);
    if (!loop_name) return rt_oom(c);
    for (size_t k = 0; k < items->n; k++) {
        if (rt_step(c, 1)) return -1;
        lp->i = k;
        is->n = 0; /* a fresh scope per iteration, as Jinja2 re-enters the loop frame */
        if (assign(c, s->loop.target, items->v[k], is) || scope_set(c, is, loop_name, lv))
            return -1;
        int r = exec_body(c, &s->loop.body, is);
        if (r < 0) return -1;
        if (r == R_BREAK) break;
    }
    return R_OK;
}

static int exec_for(rctx *c, const stmt *s, scope *sc) {
    tv it;
    if (tpl_eval(c, s->loop.iter, sc, &it)) return -1;
    return run_loop(c, s, sc, it, 1);
}

/* loop(iterable) in a `recursive` loop: the body again, one level deeper, as a string. */
static int call_loop(rctx *c, tv lv, const tv *args, size_t nargs, size_t nkw, tv *out) {
    const tloop *lp = lv.lp;
    if (!lp->node->loop.recursive)
        return rt_type_error(c,
                             "The loop must have the 'recursive' marker to be called recursively.");
    if (nargs != 1 || nkw) return rt_type_error(c, "loop() takes exactly one argument");
    if (enter(c)) return -1;
    sbuf buf = {0};
    sbuf *saved = c->out;
    c->out = &buf;
    int r = run_loop(c, lp->node, lp->sc, args[0], lp->depth + 1);
    c->out = saved;
    c->depth--;
    if (r < 0) return -1;
    if (!buf.p) return tv_strc(c, "", 0, out);
    return sb_str(c, &buf, out);
}

static int exec_stmt(rctx *c, const stmt *s, scope *sc) {
    c->line = s->line;
    c->col = s->col;
    if (rt_step(c, 1)) return -1;
    switch (s->kind) {
    case S_DATA:
        return sb_put(c, c->out, s->data->s, s->data->len);
    case S_OUTPUT:
        for (size_t k = 0; k < s->out.n; k++) {
            tv v;
            if (tpl_eval(c, s->out.e[k], sc, &v) || output_value(c, v)) return -1;
        }
        return R_OK;
    case S_IF:
        for (size_t k = 0; k < s->ifs.n; k++) {
            tv cond;
            if (tpl_eval(c, s->ifs.conds[k], sc, &cond)) return -1;
            if (tv_truthy(cond)) return exec_body(c, &s->ifs.bodies[k], sc);
        }
        return exec_body(c, &s->ifs.els, sc);
    case S_FOR:
        return exec_for(c, s, sc);
    case S_SET: {
        tv v;
        if (tpl_eval(c, s->set.value, sc, &v)) return -1;
        c->line = s->line;
        return assign(c, s->set.target, v, sc);
    }
    case S_SETBLOCK: { /* the body runs in its own scope (Jinja2: frame.inner()) */
        tv v;
        int ctl = 0;
        scope *bs = scope_new(c, sc);
        if (!bs || render_to(c, &s->setblock.body, bs, &v, &ctl)) return -1;
        if (s->setblock.filter) {
            tv saved = c->block_value;
            c->block_value = v;
            int r = tpl_eval(c, s->setblock.filter, sc, &v);
            c->block_value = saved;
            if (r) return -1;
        }
        if (assign(c, s->setblock.target, v, sc)) return -1;
        return ctl;
    }
    case S_FILTERBLOCK: {
        tv v;
        int ctl = 0;
        scope *bs = scope_new(c, sc);
        if (!bs || render_to(c, &s->filterblock.body, bs, &v, &ctl)) return -1;
        tv saved = c->block_value;
        c->block_value = v;
        int r = tpl_eval(c, s->filterblock.filter, sc, &v);
        c->block_value = saved;
        if (r) return -1;
        /* Jinja2 yields a filter block's result without str(): the final ''.join fails on
           anything but a string */
        if (v.type != TV_STR)
            return rt_type_error(c, "sequence item: expected str instance, %s found",
                                 tv_type_name(v));
        if (output_value(c, v)) return -1;
        return ctl;
    }
    case S_MACRO: {
        tfunc *f = tpl_zalloc(&c->ar, sizeof *f);
        if (!f) return rt_oom(c);
        f->kind = F_MACRO;
        f->node = s;
        f->sc = sc; /* the macro closes over the scope it is defined in (a Python closure) */
        tv v = {.type = TV_FUNC};
        v.fn = f;
        return scope_set(c, sc, s->macro.name, v);
    }
    case S_CALLBLOCK: {
        const expr *call = s->callblock.call;
        tv fn, res;
        evargs ea;
        if (tpl_eval(c, call->call.fn, sc, &fn) || eval_args(c, &call->call.a, sc, &ea, 1))
            return -1;
        tfunc *f = tpl_zalloc(&c->ar, sizeof *f);
        const tstr *cn = tpl_str_new(&c->ar, "caller", 6);
        if (!f || !cn) return rt_oom(c);
        f->kind = F_CALLER;
        f->node = s;
        f->sc = sc;
        tv cv = {.type = TV_FUNC};
        cv.fn = f;
        ea.kwn[ea.nkw] = cn;
        ea.kwv[ea.nkw++] = cv;
        c->line = s->line;
        if (rt_call(c, fn, ea.args, ea.nargs, ea.kwn, ea.kwv, ea.nkw, &res)) return -1;
        return output_value(c, res);
    }
    case S_WITH: {
        scope *ws = scope_new(c, sc);
        if (!ws) return -1;
        tv *vals = tpl_alloc(&c->ar, (s->with.n + 1) * sizeof(tv));
        if (!vals) return rt_oom(c);
        for (size_t k = 0; k < s->with.n; k++)
            if (tpl_eval(c, s->with.values[k], sc, &vals[k])) return -1;
        for (size_t k = 0; k < s->with.n; k++)
            if (assign(c, s->with.targets[k], vals[k], ws)) return -1;
        return exec_body(c, &s->with.body, ws);
    }
    case S_SCOPE: {
        scope *ws = scope_new(c, sc);
        if (!ws) return -1;
        return exec_body(c, &s->scope, ws);
    }
    case S_BREAK:
        return R_BREAK;
    case S_CONTINUE:
        return R_CONTINUE;
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, NULL, "unknown statement");
}

static int exec_body(rctx *c, const body *b, scope *sc) {
    if (enter(c)) return -1;
    int r = R_OK;
    for (size_t k = 0; k < b->n; k++) {
        r = exec_stmt(c, b->s[k], sc);
        if (r != R_OK) break;
    }
    c->depth--;
    return r;
}

int tpl_render_root(rctx *c, const body *root, sbuf *out) {
    c->out = out;
    int r = exec_body(c, root, c->root);
    return r < 0 ? -1 : 0;
}
