/* tpl_ops.c - Python's operators on template values, as Jinja2's sandbox applies them:
 * arithmetic (+ - * / // % ** on 64-bit ints and floats, unary - and +, repetition and
 * concatenation of sequences), printf-style `str % args`, markupsafe escaping (Markup + str
 * escapes the plain side), `in`, attribute and item access (SandboxedEnvironment.getattr /
 * getitem: loop attributes, bound methods, unsafe names) and slicing. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "template/tpl.h"
#include "template/tpl_names.h"

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

/* -v and +v */
int tpl_unary(rctx *c, bool neg, tv v, tv *out) {
    if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
    if (!tv_is_num(v))
        return rt_type_error(c, "bad operand type for unary %c: '%s'", neg ? '-' : '+',
                             tv_type_name(v));
    if (v.type == TV_FLOAT) {
        *out = tv_float(neg ? -v.f : v.f);
    } else {
        int64_t i = as_i64(v);
        if (neg && i == INT64_MIN) return overflow(c);
        *out = tv_int(neg ? -i : i);
    }
    return 0;
}

int rt_add(rctx *c, tv a, tv b, tv *out) {
    return binop(c, OP_ADD, a, b, out);
}

int tpl_binop(rctx *c, int op, tv a, tv b, tv *out) {
    return binop(c, op, a, b, out);
}

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
int tpl_slice(rctx *c, tv obj, tv lo, tv hi, tv st, tv *out) {
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

int tpl_contains(rctx *c, tv item, tv container, bool *out) {
    return contains(c, item, container, out);
}
