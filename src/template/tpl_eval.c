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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/tpl.h"
#include "template/tpl_names.h"

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
/* markup (markupsafe.escape) and arithmetic                                                 */

static int escape_into(rctx *c, tv v, sbuf *b) {
    if (v.type == TV_STR && v.markup) return sb_put(c, b, v.s->s, v.s->len);
    tv s;
    if (tv_to_str(c, v, &s)) return -1;
    size_t run = 0;
    for (size_t i = 0; i < s.s->len; i++) {
        const char *e = NULL;
        switch (s.s->s[i]) {
        case '&':
            e = "&amp;";
            break;
        case '<':
            e = "&lt;";
            break;
        case '>':
            e = "&gt;";
            break;
        case '"':
            e = "&#34;";
            break;
        case '\'':
            e = "&#39;";
            break;
        default:
            run++;
            continue;
        }
        if (sb_put(c, b, s.s->s + i - run, run) || sb_puts(c, b, e)) return -1;
        run = 0;
    }
    return sb_put(c, b, s.s->s + s.s->len - run, run);
}

int tpl_escape(rctx *c, tv v, tv *out);
int tpl_escape(rctx *c, tv v, tv *out) {
    if (v.type == TV_STR && v.markup) {
        *out = v;
        return 0;
    }
    sbuf b = {0};
    if (escape_into(c, v, &b) || sb_str(c, &b, out)) return -1;
    out->markup = 1;
    return 0;
}

static const char *op_sym(int op) {
    static const char *const s[] = {"+", "-", "*", "/", "//", "%", "**"};
    return s[op];
}

static int unsupported_op(rctx *c, int op, tv a, tv b) {
    return rt_type_error(c, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
                         tv_type_name(a), tv_type_name(b));
}

static int64_t as_i64(tv v) {
    return v.type == TV_BOOL ? (int64_t)v.b : v.i;
}

static double as_f64(tv v) {
    return v.type == TV_FLOAT ? v.f : (double)as_i64(v);
}

static int overflow(rctx *c) {
    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, "OverflowError",
                   "integer result beyond 64 bits is not supported");
}

static int repeat(rctx *c, tv seq, int64_t times, tv *out) {
    if (times < 0) times = 0;
    size_t unit = seq.type == TV_STR ? seq.s->len : seq.l->n;
    if (unit == 0) times = 0; /* '' * 10**18 is '' (and must not loop 10**18 times) */
    if (seq.type == TV_STR) {
        if (times && seq.s->len > c->max_output / (uint64_t)times)
            return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "string repetition too large");
        sbuf b = {0};
        for (int64_t k = 0; k < times; k++)
            if (sb_put(c, &b, seq.s->s, seq.s->len)) return -1;
        if (sb_str(c, &b, out)) return -1;
        out->markup = seq.markup;
        return 0;
    }
    size_t n = seq.l->n;
    if (times && n > (size_t)(c->max_steps / (uint64_t)times))
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "list repetition too large");
    if (rt_step(c, n * (uint64_t)times)) return -1;
    tlist *l = tl_new(c, seq.l->kind == L_TUPLE ? L_TUPLE : L_LIST, n * (size_t)times);
    if (!l) return -1;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < n; i++) l->v[l->n++] = seq.l->v[i];
    *out = tv_list(l);
    return 0;
}

static int printf_format(rctx *c, tv fmt, tv args, tv *out);

static int binop(rctx *c, int op, tv a, tv b, tv *out) {
    if (op == OP_MOD && a.type == TV_STR)
        return printf_format(c, a, b, out); /* str.__mod__ first */
    if (a.type == TV_UNDEF) return tv_undef_fail(c, a);
    if (b.type == TV_UNDEF) return tv_undef_fail(c, b);
    bool an = tv_is_num(a), bn = tv_is_num(b);
    if (an && bn) {
        bool fl = a.type == TV_FLOAT || b.type == TV_FLOAT;
        if (!fl) {
            int64_t x = as_i64(a), y = as_i64(b), r;
            switch (op) {
            case OP_ADD:
                if (__builtin_add_overflow(x, y, &r)) return overflow(c);
                *out = tv_int(r);
                return 0;
            case OP_SUB:
                if (__builtin_sub_overflow(x, y, &r)) return overflow(c);
                *out = tv_int(r);
                return 0;
            case OP_MUL:
                if (__builtin_mul_overflow(x, y, &r)) return overflow(c);
                *out = tv_int(r);
                return 0;
            case OP_DIV:
                if (y == 0)
                    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ZeroDivisionError",
                                   "division by zero");
                *out = tv_float((double)x / (double)y);
                return 0;
            case OP_FLOORDIV:
            case OP_MOD: {
                if (y == 0)
                    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ZeroDivisionError",
                                   op == OP_MOD ? "integer modulo by zero"
                                                : "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    if (op == OP_MOD) {
                        *out = tv_int(0);
                        return 0;
                    }
                    return overflow(c);
                }
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q -= 1;
                    m += y;
                }
                *out = tv_int(op == OP_MOD ? m : q);
                return 0;
            }
            case OP_POW:
                if (y < 0) {
                    if (x == 0)
                        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ZeroDivisionError",
                                       "0.0 cannot be raised to a negative power");
                    *out = tv_float(pow((double)x, (double)y));
                    return 0;
                }
                r = 1;
                for (int64_t base = x, e = y; e; e >>= 1) {
                    if (e & 1 && __builtin_mul_overflow(r, base, &r)) return overflow(c);
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow(c);
                }
                *out = tv_int(r);
                return 0;
            }
        }
        double x = as_f64(a), y = as_f64(b);
        switch (op) {
        case OP_ADD:
            *out = tv_float(x + y);
            return 0;
        case OP_SUB:
            *out = tv_float(x - y);
            return 0;
        case OP_MUL:
            *out = tv_float(x * y);
            return 0;
        case OP_DIV:
            if (y == 0)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ZeroDivisionError",
                               "float division by zero");
            *out = tv_float(x / y);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ZeroDivisionError",
                               op == OP_MOD ? "float modulo" : "float floor division by zero");
            /* CPython float_divmod */
            double mod = fmod(x, y), div = (x - mod) / y;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) {
                    mod += y;
                    div -= 1.0;
                }
            } else {
                mod = copysign(0.0, y);
            }
            double fd;
            if (div != 0) {
                fd = floor(div);
                if (div - fd > 0.5) fd += 1.0;
            } else {
                fd = copysign(0.0, x / y);
            }
            *out = tv_float(op == OP_MOD ? mod : fd);
            return 0;
        }
        case OP_POW: {
            if (x == 0 && y < 0)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ZeroDivisionError",
                               "0.0 cannot be raised to a negative power");
            double r = pow(x, y);
            if (x < 0 && y != floor(y))
                return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, "ValueError",
                               "complex results are not supported");
            if (isinf(r) && !isinf(x) && !isinf(y))
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "OverflowError",
                               "(34, 'Numerical result out of range')");
            *out = tv_float(r);
            return 0;
        }
        }
    }
    switch (op) {
    case OP_ADD:
        if (a.type == TV_STR && b.type == TV_STR) {
            sbuf s = {0};
            if (a.markup || b.markup) { /* Markup.__add__/__radd__ escape the plain side */
                if (escape_into(c, a, &s) || escape_into(c, b, &s) || sb_str(c, &s, out)) return -1;
                out->markup = 1;
                return 0;
            }
            if (sb_put(c, &s, a.s->s, a.s->len) || sb_put(c, &s, b.s->s, b.s->len)) return -1;
            if (!s.p) return tv_strc(c, "", 0, out);
            return sb_str(c, &s, out);
        }
        if (a.type == TV_LIST && b.type == TV_LIST &&
            ((a.l->kind == L_LIST && b.l->kind == L_LIST) ||
             (a.l->kind == L_TUPLE && b.l->kind == L_TUPLE))) {
            if (rt_step(c, a.l->n + b.l->n)) return -1;
            tlist *l = tl_new(c, a.l->kind, a.l->n + b.l->n);
            if (!l) return -1;
            if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof(tv));
            if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(tv));
            l->n = a.l->n + b.l->n;
            *out = tv_list(l);
            return 0;
        }
        if (a.type == TV_STR ||
            (a.type == TV_LIST && (a.l->kind == L_LIST || a.l->kind == L_TUPLE))) {
            const char *an2 = a.type == TV_STR ? "str" : tv_type_name(a);
            if (a.type == TV_STR && a.markup) break;
            return rt_type_error(c, "can only concatenate %s (not \"%s\") to %s", an2,
                                 tv_type_name(b), an2);
        }
        break;
    case OP_MUL:
        if ((a.type == TV_STR || tv_is_seq(a)) && (b.type == TV_INT || b.type == TV_BOOL) &&
            !(a.type == TV_LIST && a.l->kind == L_RANGE))
            return repeat(c, a, as_i64(b), out);
        if ((b.type == TV_STR || tv_is_seq(b)) && (a.type == TV_INT || a.type == TV_BOOL) &&
            !(b.type == TV_LIST && b.l->kind == L_RANGE))
            return repeat(c, b, as_i64(a), out);
        if ((a.type == TV_STR || tv_is_seq(a)) && b.type != TV_STR && !tv_is_seq(b))
            return rt_type_error(c, "can't multiply sequence by non-int of type '%s'",
                                 tv_type_name(b));
        break;
    case OP_MOD:
        if (a.type == TV_STR) return printf_format(c, a, b, out);
        break;
    }
    return unsupported_op(c, op, a, b);
}

int rt_add(rctx *c, tv a, tv b, tv *out) {
    return binop(c, OP_ADD, a, b, out);
}

int tpl_binop(rctx *c, int op, tv a, tv b, tv *out);
int tpl_binop(rctx *c, int op, tv a, tv b, tv *out) {
    return binop(c, op, a, b, out);
}

int tpl_percent_format(rctx *c, tv fmt, tv args, tv *out);
int tpl_percent_format(rctx *c, tv fmt, tv args, tv *out) {
    return printf_format(c, fmt, args, out);
}

/* printf-style `str % args` (Python's %-formatting) for s r a d i u f F e E g G x X o c %. */
static int printf_format(rctx *c, tv fmt, tv args, tv *out) {
    const tv *av = &args;
    size_t an = 1, ai = 0;
    tdict *map = NULL;
    if (args.type == TV_LIST && args.l->kind == L_TUPLE) {
        av = args.l->v;
        an = args.l->n;
    } else if (args.type == TV_DICT) {
        map = args.d;
    }
    /* Python treats any non-tuple argument with __getitem__ as a mapping: no "not all
       arguments converted" check */
    bool mapping_like =
        args.type == TV_DICT || args.type == TV_UNDEF ||
        (args.type == TV_LIST && (args.l->kind == L_LIST || args.l->kind == L_RANGE));
    sbuf b = {0};
    const char *s = fmt.s->s;
    size_t n = fmt.s->len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            if (sb_putc(c, &b, s[i])) return -1;
            continue;
        }
        if (++i >= n) return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "incomplete format");
        tv arg;
        bool have_key = false;
        if (s[i] == '(') {
            size_t j = i + 1;
            while (j < n && s[j] != ')') j++;
            if (j >= n || !map)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError", "format requires a mapping");
            tv *p = td_get_str(map, s + i + 1, j - i - 1);
            if (!p)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "KeyError", "'%.*s'", (int)(j - i - 1),
                               s + i + 1);
            arg = *p;
            have_key = true;
            i = j + 1;
        }
        char spec[32];
        size_t sl = 0;
        spec[sl++] = '%';
        while (i < n && strchr("-+ #0", s[i]) && sl < 10) spec[sl++] = s[i++];
        while (i < n && s[i] >= '0' && s[i] <= '9' && sl < 20) spec[sl++] = s[i++];
        if (i < n && s[i] == '.') {
            spec[sl++] = s[i++];
            while (i < n && s[i] >= '0' && s[i] <= '9' && sl < 28) spec[sl++] = s[i++];
        }
        if (i >= n) return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "incomplete format");
        char conv = s[i];
        if (conv == '%') {
            if (sb_putc(c, &b, '%')) return -1;
            continue;
        }
        if (!have_key) {
            if (map) {
                arg = args;
            } else {
                if (ai >= an) return rt_type_error(c, "not enough arguments for format string");
                arg = av[ai++];
            }
        }
        if (arg.type == TV_UNDEF && conv != 's') return tv_undef_fail(c, arg);
        char tmp[512];
        spec[sl] = 0;
        switch (conv) {
        case 's':
        case 'r':
        case 'a': {
            sbuf t = {0};
            if ((conv == 's' ? tv_to_sb(c, arg, &t) : tv_repr_sb(c, arg, &t))) return -1;
            spec[sl++] = 's';
            spec[sl] = 0;
            if (sl == 2) {
                if (sb_put(c, &b, t.p, t.n)) return -1;
            } else {
                char *buf = tpl_alloc(&c->ar, t.n + 64);
                if (!buf) return rt_oom(c);
                int w = snprintf(buf, t.n + 64, spec, t.p ? t.p : "");
                if (w > 0 && sb_put(c, &b, buf, (size_t)w < t.n + 64 ? (size_t)w : t.n + 63))
                    return -1;
            }
            break;
        }
        case 'd':
        case 'i':
        case 'u':
        case 'x':
        case 'X':
        case 'o':
        case 'c': {
            if (!tv_is_num(arg))
                return rt_type_error(c, "%%%c format: a real number is required, not %s", conv,
                                     tv_type_name(arg));
            long long v = arg.type == TV_FLOAT ? (long long)arg.f : (long long)as_i64(arg);
            if (conv == 'c') {
                char u8[4];
                size_t k = tpl_utf8_enc((uint32_t)v, u8);
                if (sb_put(c, &b, u8, k)) return -1;
                break;
            }
            spec[sl++] = 'l';
            spec[sl++] = 'l';
            spec[sl++] = conv == 'i' || conv == 'u' ? 'd' : conv;
            spec[sl] = 0;
            snprintf(tmp, sizeof tmp, spec, v);
            if (sb_puts(c, &b, tmp)) return -1;
            break;
        }
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
            if (!tv_is_num(arg))
                return rt_type_error(c, "must be real number, not %s", tv_type_name(arg));
            spec[sl++] = conv;
            spec[sl] = 0;
            snprintf(tmp, sizeof tmp, spec, as_f64(arg));
            if (sb_puts(c, &b, tmp)) return -1;
            break;
        default:
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                           "unsupported format character '%c'", conv);
        }
    }
    if (!mapping_like && ai < an)
        return rt_type_error(c, "not all arguments converted during string formatting");
    if (!b.p) return tv_strc(c, "", 0, out);
    return sb_str(c, &b, out);
}

/* ---------------------------------------------------------------------------------------- */
/* attribute and item access (SandboxedEnvironment.getattr / getitem)                        */

static int loop_attr(rctx *c, tv obj, const tstr *a, tv *out) {
    const tloop *lp = obj.lp;
    int64_t i = (int64_t)lp->i, n = (int64_t)lp->n;
    if (tpl_str_eq(a, "index"))
        *out = tv_int(i + 1);
    else if (tpl_str_eq(a, "index0"))
        *out = tv_int(i);
    else if (tpl_str_eq(a, "revindex"))
        *out = tv_int(n - i);
    else if (tpl_str_eq(a, "revindex0"))
        *out = tv_int(n - i - 1);
    else if (tpl_str_eq(a, "first"))
        *out = tv_bool(i == 0);
    else if (tpl_str_eq(a, "last"))
        *out = tv_bool(i == n - 1);
    else if (tpl_str_eq(a, "length"))
        *out = tv_int(n);
    else if (tpl_str_eq(a, "depth"))
        *out = tv_int(lp->depth);
    else if (tpl_str_eq(a, "depth0"))
        *out = tv_int(lp->depth - 1);
    else if (tpl_str_eq(a, "previtem"))
        *out = i > 0 ? lp->items->v[i - 1]
                     : tv_undef_hint(c, "there is no previous item", UX_UNDEFINED);
    else if (tpl_str_eq(a, "nextitem"))
        *out = i + 1 < n ? lp->items->v[i + 1]
                         : tv_undef_hint(c, "there is no next item", UX_UNDEFINED);
    else
        return 0;
    return 1;
}

static int bound_method(rctx *c, tv obj, int id, tv *out) {
    tfunc *f = tpl_zalloc(&c->ar, sizeof *f);
    if (!f) return rt_oom(c);
    f->kind = F_METHOD;
    f->id = id;
    f->self = obj;
    out->type = TV_FUNC;
    out->markup = 0;
    out->fn = f;
    return 1;
}

/* Python getattr(obj, name) for the attributes templates can reach. 1 found, 0 not, -1 err. */
static int attr_only(rctx *c, tv obj, const tstr *a, tv *out) {
    if (obj.type == TV_UNDEF) return tv_undef_fail(c, obj);
    if (a->len >= 4 && a->s[0] == '_' && a->s[1] == '_' && a->s[a->len - 1] == '_' &&
        a->s[a->len - 2] == '_') {
        char msg[200];
        snprintf(msg, sizeof msg, "access to attribute '%.*s' of '%s' object is unsafe.",
                 (int)(a->len > 60 ? 60 : a->len), a->s, tv_type_name(obj));
        *out = tv_undef_hint(c, msg, UX_SECURITY);
        return 1;
    }
    if (obj.type == TV_NS) {
        tv *p = td_get_str(obj.d, a->s, a->len);
        if (p) {
            *out = *p;
            return 1;
        }
        return 0;
    }
    if (obj.type == TV_LOOP) {
        int r = loop_attr(c, obj, a, out);
        if (r) return r;
    }
    if (obj.type == TV_LIST && obj.l->kind == L_TUPLE && obj.l->gen_name == tpl_group_tuple &&
        obj.l->n == 2) { /* groupby's _GroupTuple(grouper, list) */
        if (tpl_str_eq(a, "grouper")) {
            *out = obj.l->v[0];
            return 1;
        }
        if (tpl_str_eq(a, "list")) {
            *out = obj.l->v[1];
            return 1;
        }
    }
    bool unsafe = false;
    int id = tpl_method_id(obj, a->s, a->len, &unsafe);
    if (id >= 0) {
        if (unsafe) {
            char msg[200];
            snprintf(msg, sizeof msg, "access to attribute '%s' of '%s' object is unsafe.", a->s,
                     tv_type_name(obj));
            *out = tv_undef_hint(c, msg, UX_SECURITY);
            return 1;
        }
        return bound_method(c, obj, id, out);
    }
    return 0;
}

static int normalize_index(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return 0;
    *out = (size_t)i;
    return 1;
}

/* Python obj[key]: 1 found, 0 LookupError/TypeError (not fatal here), -1 err. */
static int item_only(rctx *c, tv obj, tv key, tv *out) {
    if (obj.type == TV_UNDEF) return tv_undef_fail(c, obj);
    if (obj.type == TV_DICT) {
        tv *p;
        if (!tv_hashable(key)) return 0; /* a TypeError, which getitem swallows */
        if (td_get(c, obj.d, key, &p)) return -1;
        if (p) {
            *out = *p;
            return 1;
        }
        return 0;
    }
    bool is_int = key.type == TV_INT || key.type == TV_BOOL;
    size_t idx;
    if (obj.type == TV_LIST && tv_is_seq(obj)) {
        if (!is_int || !normalize_index(as_i64(key), obj.l->n, &idx)) return 0;
        *out = obj.l->v[idx];
        return 1;
    }
    if (obj.type == TV_STR) {
        if (!is_int || !normalize_index(as_i64(key), obj.s->nchars, &idx)) return 0;
        const char *p = obj.s->s;
        size_t off = 0, adv = 0;
        for (size_t k = 0;; k++) {
            tpl_utf8_dec(p + off, obj.s->len - off, &adv);
            if (k == idx) break;
            off += adv;
        }
        if (tv_strc(c, p + off, adv, out)) return -1;
        out->markup = obj.markup;
        return 1;
    }
    return 0;
}

int rt_getattr(rctx *c, tv obj, const tstr *attr, tv *out) {
    int r = attr_only(c, obj, attr, out);
    if (r) return r < 0 ? -1 : 0;
    r = item_only(c, obj, tv_str(attr), out);
    if (r) return r < 0 ? -1 : 0;
    *out = tv_undef_attr(c, obj, tv_str(attr));
    return 0;
}

int rt_getitem(rctx *c, tv obj, tv key, tv *out) {
    int r = item_only(c, obj, key, out);
    if (r) return r < 0 ? -1 : 0;
    if (key.type == TV_STR) {
        r = attr_only(c, obj, key.s, out);
        if (r) return r < 0 ? -1 : 0;
    }
    *out = tv_undef_attr(c, obj, key);
    return 0;
}

/* Python slice semantics: indices for obj[lo:hi:step]. */
static int slice_indices(rctx *c, tv lo, tv hi, tv st, int64_t n, int64_t *start, int64_t *stop,
                         int64_t *step, bool *bad) {
    *bad = false;
    int64_t s = 1;
    if (st.type != TV_NONE) {
        if (st.type != TV_INT && st.type != TV_BOOL) {
            *bad = true;
            return 0;
        }
        s = as_i64(st);
        if (s == 0)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "slice step cannot be zero");
    }
    int64_t a, b;
    if (lo.type == TV_NONE) {
        a = s > 0 ? 0 : n - 1;
    } else {
        if (lo.type != TV_INT && lo.type != TV_BOOL) {
            *bad = true;
            return 0;
        }
        a = as_i64(lo);
        if (a < 0) a += n;
        if (a < 0) a = s > 0 ? 0 : -1;
        if (a >= n) a = s > 0 ? n : n - 1;
    }
    if (hi.type == TV_NONE) {
        b = s > 0 ? n : -1;
    } else {
        if (hi.type != TV_INT && hi.type != TV_BOOL) {
            *bad = true;
            return 0;
        }
        b = as_i64(hi);
        if (b < 0) b += n;
        if (b < 0) b = s > 0 ? 0 : -1;
        if (b >= n) b = s > 0 ? n : n - 1;
    }
    *start = a;
    *stop = b;
    *step = s;
    return 0;
}

/* Jinja2 compiles slices to a plain Python subscript (no sandbox getitem), so every failure
 * here is an error, not an undefined. */
static int do_slice(rctx *c, tv obj, tv lo, tv hi, tv st, tv *out) {
    if (obj.type == TV_UNDEF) return tv_undef_fail(c, obj);
    bool is_str = obj.type == TV_STR;
    if (!is_str && !tv_is_seq(obj)) {
        if (obj.type == TV_DICT) return rt_type_error(c, "unhashable type: 'slice'");
        return rt_type_error(c, "'%s' object is not subscriptable", tv_type_name(obj));
    }
    int64_t n = is_str ? (int64_t)obj.s->nchars : (int64_t)obj.l->n;
    int64_t a = 0, b = 0, s = 1;
    bool bad;
    if (slice_indices(c, lo, hi, st, n, &a, &b, &s, &bad)) return -1;
    if (bad)
        return rt_type_error(c,
                             "slice indices must be integers or None or have an __index__ method");
    size_t count = 0;
    if (s > 0 && b > a) count = (size_t)((b - a + s - 1) / s);
    if (s < 0 && a > b) count = (size_t)((a - b + (-s) - 1) / (-s));
    if (rt_step(c, count)) return -1;
    if (is_str) {
        /* code point offsets */
        size_t *offs = tpl_alloc(&c->ar, ((size_t)n + 1) * sizeof *offs);
        if (!offs) return rt_oom(c);
        size_t off = 0;
        for (int64_t k = 0; k < n; k++) {
            size_t adv;
            offs[k] = off;
            tpl_utf8_dec(obj.s->s + off, obj.s->len - off, &adv);
            off += adv;
        }
        offs[n] = off;
        sbuf sb = {0};
        if (s == 1) {
            if (count && sb_put(c, &sb, obj.s->s + offs[a], offs[a + (int64_t)count] - offs[a]))
                return -1;
        } else {
            for (size_t k = 0; k < count; k++) {
                int64_t i = a + (int64_t)k * s;
                if (sb_put(c, &sb, obj.s->s + offs[i], offs[i + 1] - offs[i])) return -1;
            }
        }
        if (!sb.p) {
            if (tv_strc(c, "", 0, out)) return -1;
        } else if (sb_str(c, &sb, out)) {
            return -1;
        }
        out->markup = obj.markup;
        return 0;
    }
    tlist *l = tl_new(c, obj.l->kind == L_TUPLE ? L_TUPLE : L_LIST, count);
    if (!l) return -1;
    for (size_t k = 0; k < count; k++) l->v[l->n++] = obj.l->v[a + (int64_t)k * s];
    if (obj.l->kind == L_RANGE) { /* a range sliced is a range */
        l->kind = L_RANGE;
        l->r_step = obj.l->r_step * s;
        l->r_start = obj.l->r_start + a * obj.l->r_step;
        l->r_stop = obj.l->r_start + b * obj.l->r_step;
    }
    *out = tv_list(l);
    return 0;
}

/* `a in b` */
static int contains(rctx *c, tv item, tv container, bool *out) {
    switch (container.type) {
    case TV_STR:
        if (item.type == TV_UNDEF) return tv_undef_fail(c, item);
        if (item.type != TV_STR)
            return rt_type_error(c, "'in <string>' requires string as left operand, not %s",
                                 tv_type_name(item));
        *out = item.s->len == 0 ||
               memmem(container.s->s, container.s->len, item.s->s, item.s->len) != NULL;
        return 0;
    case TV_DICT: {
        tv *p;
        if (td_get(c, container.d, item, &p)) return -1;
        *out = p != NULL;
        return 0;
    }
    case TV_UNDEF:
        if (container.u && container.u->exc == UX_SECURITY) return tv_undef_fail(c, container);
        *out = false;
        return 0;
    case TV_LIST: {
        const tlist *l = container.l;
        size_t from = l->kind == L_GEN ? l->pos : 0;
        *out = false;
        for (size_t k = from; k < l->n; k++) {
            if (tv_eq(l->v[k], item)) {
                *out = true;
                if (l->kind == L_GEN) container.l->pos = k + 1;
                return rt_step(c, k - from + 1);
            }
        }
        if (l->kind == L_GEN) container.l->pos = l->n;
        return rt_step(c, l->n - from);
    }
    default:
        return rt_type_error(c, "argument of type '%s' is not iterable", tv_type_name(container));
    }
}

int tpl_contains(rctx *c, tv item, tv container, bool *out);
int tpl_contains(rctx *c, tv item, tv container, bool *out) {
    return contains(c, item, container, out);
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
        *out = as_i64(v);
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
            if (contains(c, left, right, &r)) return -1;
            break;
        case CMP_NOTIN:
            if (contains(c, left, right, &r)) return -1;
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
            return do_slice(c, obj, lo, hi, st, out);
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
        if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
        if (!tv_is_num(v))
            return rt_type_error(c, "bad operand type for unary %c: '%s'",
                                 e->kind == E_NEG ? '-' : '+', tv_type_name(v));
        if (v.type == TV_FLOAT) {
            *out = tv_float(e->kind == E_NEG ? -v.f : v.f);
        } else {
            int64_t i = as_i64(v);
            if (e->kind == E_NEG && i == INT64_MIN) return overflow(c);
            *out = tv_int(e->kind == E_NEG ? -i : i);
        }
        return 0;
    }
    case E_BIN: {
        tv a, b;
        if (tpl_eval(c, e->bin.a, sc, &a) || tpl_eval(c, e->bin.b, sc, &b)) return -1;
        c->line = e->line;
        c->col = e->col;
        return binop(c, e->op, a, b, out);
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

int tpl_render_root(rctx *c, const body *root, sbuf *out);
int tpl_render_root(rctx *c, const body *root, sbuf *out) {
    c->out = out;
    int r = exec_body(c, root, c->root);
    return r < 0 ? -1 : 0;
}
