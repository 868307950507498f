/* tpl_tests.c - Jinja2 3.1's built-in tests (jinja2/tests.py, "List of Builtin Tests" in the
 * Template Designer Documentation): `x is defined`, `x is divisibleby(3)`, `x is in(y)`,
 * `x is ==(y)`, ... */
#include "template/tpl.h"
#include "template/tpl_names.h"

static int test_mod(rctx *c, tv v, tv m, int64_t want, bool *out) {
    tv r;
    if (tpl_binop(c, OP_MOD, v, m, &r)) return -1;
    if (want < 0) { /* divisibleby: == 0 */
        *out = tv_eq(r, tv_int(0));
        return 0;
    }
    *out = tv_eq(r, tv_int(want));
    return 0;
}

int tpl_apply_test(rctx *c, int id, tv v, const tv *args, size_t nargs, const tstr **kwn,
                   const tv *kwv, size_t nkw, bool *out) {
    tv a[2];
    bool g[2];
    static const char *const one[] = {"other"};
    const char *tname = tpl_test_name(id);
    bool need_arg = id == TS_DIVISIBLEBY || id == TS_SAMEAS || id == TS_IN || id >= TS_EQ;
    if (tpl_bind_args(c, tname, one, need_arg ? 1 : 0, need_arg ? 1 : 0, args, nargs, kwn, kwv, nkw,
                      a, g))
        return -1;
    switch (id) {
    case TS_ODD:
        return test_mod(c, v, tv_int(2), 1, out);
    case TS_EVEN:
        return test_mod(c, v, tv_int(2), 0, out);
    case TS_DIVISIBLEBY:
        return test_mod(c, v, a[0], -1, out);
    case TS_DEFINED:
        *out = v.type != TV_UNDEF;
        return 0;
    case TS_UNDEFINED:
        *out = v.type == TV_UNDEF;
        return 0;
    case TS_FILTER:
        *out = v.type == TV_STR && tpl_filter_id(v.s->s, v.s->len) >= 0;
        return 0;
    case TS_TEST:
        *out = v.type == TV_STR && tpl_test_id(v.s->s, v.s->len) >= 0;
        return 0;
    case TS_NONE:
        *out = v.type == TV_NONE;
        return 0;
    case TS_BOOLEAN:
        *out = v.type == TV_BOOL;
        return 0;
    case TS_FALSE:
        *out = v.type == TV_BOOL && !v.b;
        return 0;
    case TS_TRUE:
        *out = v.type == TV_BOOL && v.b;
        return 0;
    case TS_INTEGER:
        *out = v.type == TV_INT;
        return 0;
    case TS_FLOAT:
        *out = v.type == TV_FLOAT;
        return 0;
    case TS_LOWER:
    case TS_UPPER: {
        tv s;
        if (tv_to_str(c, v, &s)) return -1;
        bool any = false, ok = true;
        for (size_t i = 0; i < s.s->len;) {
            size_t adv;
            uint32_t x = tpl_utf8_dec(s.s->s + i, s.s->len - i, &adv);
            if (tpl_is_cased_lower(x)) {
                any = true;
                if (id == TS_UPPER) ok = false;
            } else if (tpl_is_cased_upper(x)) {
                any = true;
                if (id == TS_LOWER) ok = false;
            }
            i += adv;
        }
        *out = any && ok;
        return 0;
    }
    case TS_STRING:
        *out = v.type == TV_STR;
        return 0;
    case TS_MAPPING:
        *out = v.type == TV_DICT;
        return 0;
    case TS_NUMBER:
        *out = tv_is_num(v);
        return 0;
    case TS_SEQUENCE:
        *out = v.type == TV_STR || v.type == TV_DICT || v.type == TV_UNDEF ||
               (v.type == TV_LIST &&
                (v.l->kind == L_LIST || v.l->kind == L_TUPLE || v.l->kind == L_RANGE));
        return 0;
    case TS_ITERABLE:
        *out = v.type == TV_STR || v.type == TV_DICT || v.type == TV_UNDEF || v.type == TV_LIST ||
               v.type == TV_LOOP;
        return 0;
    case TS_CALLABLE:
        *out = v.type == TV_FUNC || v.type == TV_UNDEF || v.type == TV_LOOP;
        return 0;
    case TS_SAMEAS: {
        tv o = a[0];
        if (v.type != o.type) {
            *out = false;
        } else if (v.type == TV_NONE || v.type == TV_UNDEF) {
            *out = v.type == TV_NONE || v.u == o.u;
        } else if (v.type == TV_BOOL) {
            *out = v.b == o.b;
        } else if (v.type == TV_INT) {
            *out = v.i == o.i && v.i >= -5 && v.i <= 256; /* CPython's small int cache */
        } else if (v.type == TV_FLOAT) {
            *out = false;
        } else {
            *out = v.s == o.s; /* same object (any pointer member) */
        }
        return 0;
    }
    case TS_ESCAPED:
        *out = v.type == TV_STR && v.markup;
        return 0;
    case TS_IN: {
        return tpl_contains(c, v, a[0], out);
    }
    case TS_EQ:
        *out = tv_eq(v, a[0]);
        return 0;
    case TS_NE:
        *out = !tv_eq(v, a[0]);
        return 0;
    case TS_LT:
        return tv_lt(c, v, a[0], out);
    case TS_GT:
        return tv_lt(c, a[0], v, out);
    case TS_LE:
        return tv_le(c, v, a[0], out);
    case TS_GE:
        return tv_le(c, a[0], v, out);
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, NULL, "unknown test");
}
