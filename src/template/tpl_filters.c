/* tpl_filters.c - Jinja2 3.1's built-in filters (jinja2/filters.py, "List of Builtin Filters"
 * in the Template Designer Documentation) and transformers' tojson.
 *
 * Filters returning generators in Jinja2 (map, select, reject, selectattr, rejectattr,
 * unique, items, batch, slice, reverse of a sequence) return one here too: iterable once,
 * no len(), not JSON serializable. They are evaluated eagerly, so an error inside one
 * surfaces even if the generator is never consumed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl.h"
#include "template/tpl_names.h"

/* ---------------------------------------------------------------------------------------- */
/* helpers                                                                                   */

/* soft_str: str(v), keeping Markup. */
static int soft_str(rctx *c, tv v, tv *out) {
    if (v.type == TV_STR) {
        *out = v;
        return 0;
    }
    return tv_to_str(c, v, out);
}

static int make_gen(rctx *c, tlist *items, const char *name, tv *out) {
    items->kind = L_GEN;
    items->pos = 0;
    items->gen_name = name;
    *out = tv_list(items);
    return 0;
}

/* ignore_case postprocessor */
static int ignore_case(rctx *c, tv v, tv *out) {
    if (v.type == TV_STR) return tpl_str_case(c, v, 0, out);
    *out = v;
    return 0;
}

/* make_attrgetter: item lookups along "a.b.0" (digit parts are ints); `dflt` replaces an
 * undefined result. */
static int attrgetter(rctx *c, tv item, tv attribute, bool has_default, tv dflt, tv *out) {
    if (attribute.type == TV_UNDEF && !attribute.u) { /* attribute=None: the item itself */
        *out = item;
        return 0;
    }
    if (attribute.type == TV_NONE) {
        *out = item;
        return 0;
    }
    if (attribute.type != TV_STR) {
        if (rt_getitem(c, item, attribute, &item)) return -1;
        if (has_default && item.type == TV_UNDEF) item = dflt;
        *out = item;
        return 0;
    }
    const char *s = attribute.s->s;
    size_t n = attribute.s->len, start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') continue;
        tv part;
        bool digits = i > start;
        for (size_t k = start; k < i; k++)
            if (s[k] < '0' || s[k] > '9') digits = false;
        if (digits && i - start < 18) {
            int64_t v = 0;
            for (size_t k = start; k < i; k++) v = v * 10 + (s[k] - '0');
            part = tv_int(v);
        } else if (tv_strc(c, s + start, i - start, &part)) {
            return -1;
        }
        if (rt_getitem(c, item, part, &item)) return -1;
        if (has_default && item.type == TV_UNDEF) item = dflt;
        start = i + 1;
    }
    *out = item;
    return 0;
}

/* Stable merge sort of keys[] with parallel vals[]; errors from comparisons propagate. */
typedef struct sortctx {
    rctx *c;
    bool reverse;
    bool failed;
} sortctx;

static bool key_less(sortctx *S, tv a, tv b) {
    bool lt = false;
    if (S->failed) return false;
    if (tv_lt(S->c, a, b, &lt)) S->failed = true;
    return lt;
}

static void merge_sort(sortctx *S, tv *keys, tv *vals, tv *tk, tv *tvv, size_t n) {
    if (n < 2 || S->failed) return;
    size_t h = n / 2;
    merge_sort(S, keys, vals, tk, tvv, h);
    merge_sort(S, keys + h, vals + h, tk, tvv, n - h);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        /* take from the right only when strictly before the left (stability); with reverse,
           Python keeps equal elements in original order too */
        bool right_first =
            S->reverse ? key_less(S, keys[i], keys[j]) : key_less(S, keys[j], keys[i]);
        if (right_first) {
            tk[o] = keys[j];
            tvv[o++] = vals[j++];
        } else {
            tk[o] = keys[i];
            tvv[o++] = vals[i++];
        }
    }
    while (i < h) {
        tk[o] = keys[i];
        tvv[o++] = vals[i++];
    }
    while (j < n) {
        tk[o] = keys[j];
        tvv[o++] = vals[j++];
    }
    memcpy(keys, tk, n * sizeof(tv));
    memcpy(vals, tvv, n * sizeof(tv));
}

static int sort_values(rctx *c, tv *keys, tv *vals, size_t n, bool reverse) {
    if (n < 2) return 0;
    tv *tk = tpl_alloc(&c->ar, n * sizeof(tv)), *tvv = tpl_alloc(&c->ar, n * sizeof(tv));
    if (!tk || !tvv) return rt_oom(c);
    uint64_t work = n;
    for (size_t m = n; m > 1; m /= 2) work += n;
    if (rt_step(c, work)) return -1;
    sortctx S = {.c = c, .reverse = reverse};
    merge_sort(&S, keys, vals, tk, tvv, n);
    return S.failed ? -1 : 0;
}

/* Jinja2 do_title: uppercase after runs of [-\s({\[<], lowercase elsewhere. */
static int jinja_title(rctx *c, tv s, tv *out) {
    cpbuf b;
    if (tpl_to_cps(c, s.s, &b)) return -1;
    bool start = true;
    for (size_t k = 0; k < b.n; k++) {
        uint32_t x = b.cp[k];
        bool sep = x == '-' || x == '(' || x == '{' || x == '[' || x == '<' || tpl_is_space(x);
        if (sep) {
            start = true;
            continue;
        }
        b.cp[k] = start ? tpl_upper(x) : tpl_lower(x);
        start = false;
    }
    return tpl_from_cps(c, b.cp, b.n, out);
}

/* ---------------------------------------------------------------------------------------- */
/* filters                                                                                   */

static int filter_map_like(rctx *c, int id, tv v, const tv *args, size_t nargs, const tstr **kwn,
                           const tv *kwv, size_t nkw, tv *out);

static int apply_filter_by_name(rctx *c, tv name, tv item, const tv *args, size_t nargs,
                                const tstr **kwn, const tv *kwv, size_t nkw, tv *out) {
    if (name.type != TV_STR)
        return tpl_arg_error(c, "filter name must be a string, not %s%s", tv_type_name(name), "");
    int id = tpl_filter_id(name.s->s, name.s->len);
    if (id < 0)
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TemplateRuntimeError", "No filter named '%s'.",
                       name.s->s);
    return tpl_apply_filter(c, id, item, args, nargs, kwn, kwv, nkw, out);
}

static int apply_test_by_name(rctx *c, tv name, tv item, const tv *args, size_t nargs,
                              const tstr **kwn, const tv *kwv, size_t nkw, bool *out) {
    if (name.type != TV_STR)
        return tpl_arg_error(c, "test name must be a string, not %s%s", tv_type_name(name), "");
    int id = tpl_test_id(name.s->s, name.s->len);
    if (id < 0)
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TemplateRuntimeError", "No test named '%s'.",
                       name.s->s);
    return tpl_apply_test(c, id, item, args, nargs, kwn, kwv, nkw, out);
}

static int filter_map_like(rctx *c, int id, tv v, const tv *args, size_t nargs, const tstr **kwn,
                           const tv *kwv, size_t nkw, tv *out) {
    tlist *res = tl_new(c, L_LIST, 0);
    if (!res) return -1;
    const char *gname = id == FL_MAP ? "do_map" : "select_or_reject";
    if (!tv_truthy(v)) return make_gen(c, res, gname, out);
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    if (id == FL_MAP) {
        tv attribute = tv_undef(), dflt = tv_none();
        bool by_attr = false, has_default = false;
        if (nargs == 0) {
            for (size_t k = 0; k < nkw; k++) {
                if (tpl_str_eq(kwn[k], "attribute")) {
                    attribute = kwv[k];
                    by_attr = true;
                } else if (tpl_str_eq(kwn[k], "default")) {
                    dflt = kwv[k];
                    has_default = dflt.type != TV_NONE;
                }
            }
            if (by_attr) {
                for (size_t k = 0; k < nkw; k++)
                    if (!tpl_str_eq(kwn[k], "attribute") && !tpl_str_eq(kwn[k], "default"))
                        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "FilterArgumentError",
                                       "Unexpected keyword argument '%s'", kwn[k]->s);
            } else {
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "FilterArgumentError",
                               "map requires a filter argument");
            }
        }
        for (size_t k = 0; k < items->n; k++) {
            tv r;
            if (rt_step(c, 1)) return -1;
            if (by_attr) {
                if (attrgetter(c, items->v[k], attribute, has_default, dflt, &r)) return -1;
            } else if (apply_filter_by_name(c, args[0], items->v[k], args + 1, nargs - 1, kwn, kwv,
                                            nkw, &r)) {
                return -1;
            }
            if (tl_push(c, res, r)) return -1;
        }
        return make_gen(c, res, gname, out);
    }
    bool lookup_attr = id == FL_SELECTATTR || id == FL_REJECTATTR;
    bool select = id == FL_SELECT || id == FL_SELECTATTR;
    size_t off = 0;
    tv attr = tv_undef();
    if (lookup_attr) {
        if (nargs < 1)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "FilterArgumentError",
                           "Missing parameter for attribute name");
        attr = args[0];
        off = 1;
    }
    for (size_t k = 0; k < items->n; k++) {
        tv item = items->v[k], probe = item;
        if (rt_step(c, 1)) return -1;
        if (lookup_attr && attrgetter(c, item, attr, false, tv_none(), &probe)) return -1;
        bool r = false;
        if (nargs > off) {
            if (apply_test_by_name(c, args[off], probe, args + off + 1, nargs - off - 1, kwn, kwv,
                                   nkw, &r))
                return -1;
        } else {
            r = tv_truthy(probe);
        }
        if (r == select && tl_push(c, res, item)) return -1;
    }
    return make_gen(c, res, gname, out);
}

static int filter_indent(rctx *c, tv s, tv width, tv first, tv blank, tv *out) {
    if (s.type == TV_UNDEF) return tv_undef_fail(c, s); /* `s += newline` */
    if (s.type != TV_STR) {
        if (s.type == TV_NONE || tv_is_num(s) || s.type == TV_LIST || s.type == TV_DICT)
            return tpl_arg_error(c, "unsupported operand type(s) for +=: '%s' and '%s'",
                                 tv_type_name(s), "str");
        return tpl_arg_error(c, "unsupported operand type(s) for +=: '%s' and '%s'",
                             tv_type_name(s), "str");
    }
    tv ind;
    if (width.type == TV_STR) {
        ind = width;
    } else {
        int64_t w = 4;
        if (!(width.type == TV_UNDEF && !width.u) && tpl_need_int(c, width, "indent width", &w))
            return -1;
        if (w < 0) w = 0;
        if ((uint64_t)w > c->max_output)
            return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "indent too large");
        char *sp = tpl_alloc(&c->ar, (size_t)w + 1);
        if (!sp) return rt_oom(c);
        memset(sp, ' ', (size_t)w);
        if (tv_strc(c, sp, (size_t)w, &ind)) return -1;
    }
    sbuf tmp = {0};
    if (sb_put(c, &tmp, s.s->s, s.s->len) || sb_putc(c, &tmp, '\n')) return -1;
    tv s2;
    if (sb_str(c, &tmp, &s2)) return -1;
    tlist *lines;
    if (tpl_str_splitlines(c, s2, false, &lines)) return -1;
    sbuf b = {0};
    bool bl = tv_truthy(blank), fi = tv_truthy(first);
    if (fi && sb_put(c, &b, ind.s->s, ind.s->len)) return -1;
    for (size_t k = 0; k < lines->n; k++) {
        const tstr *ln = lines->v[k].s;
        if (k) {
            if (sb_putc(c, &b, '\n')) return -1;
            if ((bl || ln->len) && sb_put(c, &b, ind.s->s, ind.s->len)) return -1;
        }
        if (sb_put(c, &b, ln->s, ln->len)) return -1;
    }
    if (!b.p) {
        if (tv_strc(c, "", 0, out)) return -1;
    } else if (sb_str(c, &b, out)) {
        return -1;
    }
    out->markup = s.markup;
    return 0;
}

static int filter_tojson(rctx *c, tv v, const tv *args, size_t nargs, const tstr **kwn,
                         const tv *kwv, size_t nkw, tv *out) {
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    tv a[4];
    bool g[4];
    if (tpl_bind_args(c, "tojson", names, 4, 0, args, nargs, kwn, kwv, nkw, a, g)) return -1;
    json_opts o = {.item_sep = ", ", .item_sep_len = 2, .key_sep = ": ", .key_sep_len = 2};
    if (g[1] && a[1].type != TV_NONE) {
        if (a[1].type == TV_STR) {
            o.indent = a[1].s->s;
            o.indent_len = a[1].s->len;
        } else if (a[1].type == TV_INT || a[1].type == TV_BOOL) {
            int64_t n = tv_ival(a[1]);
            if (n < 0) n = 0;
            if (n > 4096)
                return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "tojson indent too large");
            char *sp = tpl_alloc(&c->ar, (size_t)n + 1);
            if (!sp) return rt_oom(c);
            memset(sp, ' ', (size_t)n);
            sp[n] = 0;
            o.indent = sp;
            o.indent_len = (size_t)n;
        } else {
            return tpl_arg_error(c, "can't multiply sequence by non-int of type '%s'%s",
                                 tv_type_name(a[1]), "");
        }
        o.item_sep = ",";
        o.item_sep_len = 1;
    }
    if (g[2] && a[2].type != TV_NONE) {
        tlist *sp;
        if (tv_iterate(c, a[2], &sp)) return -1;
        if (sp->n != 2 || sp->v[0].type != TV_STR || sp->v[1].type != TV_STR)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                           "separators must be a pair of strings");
        o.item_sep = sp->v[0].s->s;
        o.item_sep_len = sp->v[0].s->len;
        o.key_sep = sp->v[1].s->s;
        o.key_sep_len = sp->v[1].s->len;
    }
    o.sort_keys = g[3] && tv_truthy(a[3]);
    sbuf b = {0};
    if (tv_to_json(c, v, &o, &b)) return -1;
    if (g[0] && tv_truthy(a[0]) && b.p) { /* ensure_ascii: \uXXXX (surrogate pairs) */
        sbuf e = {0};
        for (size_t i = 0; i < b.n;) {
            size_t adv;
            uint32_t cp = tpl_utf8_dec(b.p + i, b.n - i, &adv);
            if (cp < 0x80) {
                if (sb_putc(c, &e, (char)cp)) return -1;
            } else if (cp < 0x10000) {
                if (sb_printf(c, &e, "\\u%04x", cp)) return -1;
            } else {
                uint32_t x = cp - 0x10000;
                if (sb_printf(c, &e, "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF)))
                    return -1;
            }
            i += adv;
        }
        b = e;
    }
    return sb_str(c, &b, out);
}

static int filter_round(rctx *c, tv v, tv prec, tv method, tv *out) {
    int64_t p = 0;
    if (!(prec.type == TV_UNDEF && !prec.u) && tpl_need_int(c, prec, "precision", &p)) return -1;
    int m = 0;
    if (!(method.type == TV_UNDEF && !method.u)) {
        if (method.type == TV_STR && tpl_str_eq(method.s, "common"))
            m = 0;
        else if (method.type == TV_STR && tpl_str_eq(method.s, "ceil"))
            m = 1;
        else if (method.type == TV_STR && tpl_str_eq(method.s, "floor"))
            m = 2;
        else
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "FilterArgumentError",
                           "method must be common, ceil or floor");
    }
    if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
    if (!tv_is_num(v)) {
        if (m == 0)
            return tpl_arg_error(c, "type %s doesn't define __round__ method%s", tv_type_name(v),
                                 "");
        return tpl_arg_error(c, "unsupported operand type(s) for *: '%s' and '%s'", tv_type_name(v),
                             "int");
    }
    if (m == 0) {
        if (v.type != TV_FLOAT) {
            int64_t x = tv_ival(v);
            if (p >= 0) {
                *out = tv_int(x);
                return 0;
            }
            if (p < -18) {
                *out = tv_int(0);
                return 0;
            }
            int64_t q = 1;
            for (int64_t k = 0; k < -p; k++) q *= 10;
            int64_t r = x % q, base = x - r;
            if (r < 0) {
                r += q;
                base -= q;
            }
            if (2 * r > q || (2 * r == q && ((base / q) & 1))) base += q;
            *out = tv_int(base);
            return 0;
        }
        *out = tv_float(tpl_py_round(v.f, p));
        return 0;
    }
    double x = v.type == TV_FLOAT ? v.f : (double)tv_ival(v);
    double scale = pow(10.0, (double)p);
    double r = (m == 1 ? ceil(x * scale) : floor(x * scale)) / scale;
    *out = tv_float(r);
    return 0;
}

static int filter_join(rctx *c, tv v, tv d, tv attribute, tv *out) {
    tv sep;
    if (d.type == TV_UNDEF && !d.u) {
        if (tv_strc(c, "", 0, &sep)) return -1;
    } else if (tv_to_str(c, d, &sep)) {
        return -1;
    }
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    sbuf b = {0};
    bool has_attr = !(attribute.type == TV_UNDEF && !attribute.u) && attribute.type != TV_NONE;
    for (size_t k = 0; k < items->n; k++) {
        tv it = items->v[k];
        if (has_attr && attrgetter(c, it, attribute, false, tv_none(), &it)) return -1;
        if (k && sb_put(c, &b, sep.s->s, sep.s->len)) return -1;
        if (tv_to_sb(c, it, &b)) return -1;
    }
    if (rt_step(c, items->n)) return -1;
    if (!b.p) return tv_strc(c, "", 0, out);
    return sb_str(c, &b, out);
}

static int filter_sort(rctx *c, tv v, bool reverse, bool case_sensitive, tv attribute, tv *out) {
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    size_t n = items->n;
    tlist *res = tl_new(c, L_LIST, n);
    tv *keys = tpl_alloc(&c->ar, (n + 1) * sizeof(tv));
    if (!res || !keys) return rt_oom(c);
    bool has_attr = !(attribute.type == TV_UNDEF && !attribute.u) && attribute.type != TV_NONE;
    /* attribute may be "a,b": a list of keys compared as lists */
    tlist *parts = NULL;
    if (has_attr && attribute.type == TV_STR && memchr(attribute.s->s, ',', attribute.s->len)) {
        tv sp, comma;
        if (tv_strc(c, ",", 1, &comma) || tpl_str_split(c, attribute, comma, -1, false, &sp))
            return -1;
        parts = sp.l;
    }
    for (size_t k = 0; k < n; k++) {
        tv it = items->v[k], key = it;
        if (parts) {
            tlist *kl = tl_new(c, L_LIST, parts->n);
            if (!kl) return -1;
            for (size_t j = 0; j < parts->n; j++) {
                tv kk;
                if (attrgetter(c, it, parts->v[j], false, tv_none(), &kk)) return -1;
                if (!case_sensitive && ignore_case(c, kk, &kk)) return -1;
                kl->v[kl->n++] = kk;
            }
            key = tv_list(kl);
        } else {
            if (has_attr && attrgetter(c, it, attribute, false, tv_none(), &key)) return -1;
            if (!case_sensitive && ignore_case(c, key, &key)) return -1;
        }
        keys[k] = key;
        res->v[res->n++] = it;
    }
    if (sort_values(c, keys, res->v, n, reverse)) return -1;
    *out = tv_list(res);
    return 0;
}

static int filter_minmax(rctx *c, tv v, bool is_max, bool case_sensitive, tv attribute, tv *out) {
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    if (items->n == 0) {
        *out = tv_undef_hint(c, "No aggregated item, sequence was empty.", UX_UNDEFINED);
        return 0;
    }
    tv best = items->v[0], bestk;
    bool has_attr = !(attribute.type == TV_UNDEF && !attribute.u) && attribute.type != TV_NONE;
    if (has_attr && attrgetter(c, best, attribute, false, tv_none(), &bestk)) return -1;
    if (!has_attr) bestk = best;
    if (!case_sensitive && ignore_case(c, bestk, &bestk)) return -1;
    for (size_t k = 1; k < items->n; k++) {
        tv it = items->v[k], key = it;
        if (has_attr && attrgetter(c, it, attribute, false, tv_none(), &key)) return -1;
        if (!case_sensitive && ignore_case(c, key, &key)) return -1;
        bool better;
        if (is_max ? tv_lt(c, bestk, key, &better) : tv_lt(c, key, bestk, &better)) return -1;
        if (better) {
            best = it;
            bestk = key;
        }
    }
    if (rt_step(c, items->n)) return -1;
    *out = best;
    return 0;
}

static int filter_unique(rctx *c, tv v, bool case_sensitive, tv attribute, tv *out) {
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    tlist *res = tl_new(c, L_LIST, 0);
    tdict *seen = td_new(c);
    if (!res || !seen) return -1;
    bool has_attr = !(attribute.type == TV_UNDEF && !attribute.u) && attribute.type != TV_NONE;
    for (size_t k = 0; k < items->n; k++) {
        tv it = items->v[k], key = it;
        if (rt_step(c, 1)) return -1;
        if (has_attr && attrgetter(c, it, attribute, false, tv_none(), &key)) return -1;
        if (!case_sensitive && ignore_case(c, key, &key)) return -1;
        tv *p;
        if (td_get(c, seen, key, &p)) return -1;
        if (p) continue;
        if (td_set(c, seen, key, tv_none()) || tl_push(c, res, it)) return -1;
    }
    return make_gen(c, res, "sync_do_unique", out);
}

static int filter_sum(rctx *c, tv v, tv attribute, tv start, tv *out) {
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    tv acc = (start.type == TV_UNDEF && !start.u) ? tv_int(0) : start;
    if (acc.type == TV_STR)
        return tpl_arg_error(c, "sum() can't sum strings [use ''.join(seq) instead]%s%s", "", "");
    bool has_attr = !(attribute.type == TV_UNDEF && !attribute.u) && attribute.type != TV_NONE;
    for (size_t k = 0; k < items->n; k++) {
        tv it = items->v[k];
        if (has_attr && attrgetter(c, it, attribute, false, tv_none(), &it)) return -1;
        if (rt_add(c, acc, it, &acc) || rt_step(c, 1)) return -1;
    }
    *out = acc;
    return 0;
}

/* groupby(attribute, default=None, case_sensitive=False): sort by the key, then group runs of
 * equal keys into (grouper, list) tuples; without case_sensitive the grouper is the first
 * item's original key. */
static int filter_groupby(rctx *c, tv v, tv attribute, tv dflt, bool case_sensitive, tv *out) {
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    size_t n = items->n;
    bool has_default = !(dflt.type == TV_UNDEF && !dflt.u) && dflt.type != TV_NONE;
    tv *keys = tpl_alloc(&c->ar, (n + 1) * sizeof(tv)),
       *vals = tpl_alloc(&c->ar, (n + 1) * sizeof(tv));
    if (!keys || !vals) return rt_oom(c);
    for (size_t k = 0; k < n; k++) {
        tv key;
        if (attrgetter(c, items->v[k], attribute, has_default, dflt, &key)) return -1;
        if (!case_sensitive && ignore_case(c, key, &key)) return -1;
        keys[k] = key;
        vals[k] = items->v[k];
    }
    if (sort_values(c, keys, vals, n, false)) return -1;
    tlist *res = tl_new(c, L_LIST, 0);
    if (!res) return -1;
    for (size_t k = 0; k < n;) {
        size_t j = k + 1;
        while (j < n && tv_eq(keys[j], keys[k])) j++;
        tlist *grp = tl_new(c, L_LIST, j - k), *pair = tl_new(c, L_TUPLE, 2);
        if (!grp || !pair) return -1;
        for (size_t m = k; m < j; m++) grp->v[grp->n++] = vals[m];
        tv grouper = keys[k];
        if (!case_sensitive && attrgetter(c, vals[k], attribute, has_default, dflt, &grouper))
            return -1;
        pair->v[0] = grouper;
        pair->v[1] = tv_list(grp);
        pair->n = 2;
        pair->gen_name = tpl_group_tuple;
        if (tl_push(c, res, tv_list(pair))) return -1;
        k = j;
    }
    *out = tv_list(res);
    return 0;
}

static int filter_dictsort(rctx *c, tv v, bool case_sensitive, tv by, bool reverse, tv *out) {
    int pos = 0;
    if (!(by.type == TV_UNDEF && !by.u)) {
        if (by.type == TV_STR && tpl_str_eq(by.s, "key"))
            pos = 0;
        else if (by.type == TV_STR && tpl_str_eq(by.s, "value"))
            pos = 1;
        else
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "FilterArgumentError",
                           "You can only sort by either \"key\" or \"value\"");
    }
    if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
    if (v.type != TV_DICT && v.type != TV_NS)
        return rt_fail(c, KILN_TEMPLATE_ERR_UNDEFINED, "UndefinedError",
                       "'%s object' has no attribute 'items'", tv_type_name(v));
    size_t n = v.d->n;
    tlist *res = tl_new(c, L_LIST, n);
    tv *keys = tpl_alloc(&c->ar, (n + 1) * sizeof(tv));
    if (!res || !keys) return rt_oom(c);
    for (size_t k = 0; k < n; k++) {
        tlist *pair = tl_new(c, L_TUPLE, 2);
        if (!pair) return -1;
        pair->v[0] = v.d->e[k].k;
        pair->v[1] = v.d->e[k].v;
        pair->n = 2;
        tv key = pair->v[pos];
        if (!case_sensitive && ignore_case(c, key, &key)) return -1;
        keys[k] = key;
        res->v[res->n++] = tv_list(pair);
    }
    if (sort_values(c, keys, res->v, n, reverse)) return -1;
    *out = tv_list(res);
    return 0;
}

static int filter_truncate(rctx *c, tv s, tv length, tv killwords, tv end, tv leeway, tv *out) {
    int64_t len = 255, lw = 5;
    if (!(length.type == TV_UNDEF && !length.u) && tpl_need_int(c, length, "length", &len))
        return -1;
    if (!(leeway.type == TV_UNDEF && !leeway.u) && leeway.type != TV_NONE &&
        tpl_need_int(c, leeway, "leeway", &lw))
        return -1;
    tv e;
    if (end.type == TV_UNDEF && !end.u) {
        if (tv_strc(c, "...", 3, &e)) return -1;
    } else if (tv_to_str(c, end, &e)) {
        return -1;
    }
    int64_t elen = (int64_t)e.s->nchars;
    if (len < elen)
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "AssertionError",
                       "expected length >= %lld, got %lld", (long long)elen, (long long)len);
    if (lw < 0)
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "AssertionError",
                       "expected leeway >= 0, got %lld", (long long)lw);
    int64_t slen;
    if (tv_len(c, s, &slen)) return -1; /* len() of the value itself, as do_truncate does */
    if (slen - lw <= len) { /* slen <= len + lw without overflow (slen, lw >= 0) */
        *out = s;
        return 0;
    }
    if (s.type != TV_STR)
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "AttributeError",
                       "'%s' object has no attribute 'rsplit'", tv_type_name(s));
    tv str = s;
    size_t cut = tpl_cp_off(str.s, len - elen);
    sbuf b = {0};
    if (tv_truthy(killwords)) {
        if (sb_put(c, &b, str.s->s, cut)) return -1;
    } else {
        size_t k = cut;
        const char *sp = NULL;
        for (size_t i = k; i > 0; i--)
            if (str.s->s[i - 1] == ' ') {
                sp = str.s->s + i - 1;
                break;
            }
        size_t keep = sp ? (size_t)(sp - str.s->s) : cut;
        if (sb_put(c, &b, str.s->s, keep)) return -1;
    }
    if (sb_put(c, &b, e.s->s, e.s->len)) return -1;
    return sb_str(c, &b, out);
}

static int filter_batch_slice(rctx *c, int id, tv v, tv count, tv fill, tv *out) {
    int64_t n;
    if (tpl_need_int(c, count, id == FL_BATCH ? "linecount" : "slices", &n)) return -1;
    tlist *items;
    if (tv_iterate(c, v, &items)) return -1;
    tlist *res = tl_new(c, L_LIST, 0);
    if (!res) return -1;
    bool has_fill = !(fill.type == TV_UNDEF && !fill.u) && fill.type != TV_NONE;
    if (id == FL_BATCH) {
        if (n <= 0)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "batch size must be positive");
        tlist *cur = NULL;
        for (size_t k = 0; k < items->n; k++) {
            if (!cur && !(cur = tl_new(c, L_LIST, 0))) return -1;
            if (tl_push(c, cur, items->v[k])) return -1;
            if ((int64_t)cur->n == n) {
                if (tl_push(c, res, tv_list(cur))) return -1;
                cur = NULL;
            }
        }
        if (cur) {
            if (has_fill)
                while ((int64_t)cur->n < n)
                    if (tl_push(c, cur, fill)) return -1;
            if (tl_push(c, res, tv_list(cur))) return -1;
        }
        return make_gen(c, res, "do_batch", out);
    }
    if (n <= 0)
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ZeroDivisionError",
                       "integer division or modulo by zero");
    if (n > 100000) return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "too many slices");
    size_t len = items->n, per = len / (size_t)n, extra = len % (size_t)n, offset = 0;
    for (size_t s = 0; s < (size_t)n; s++) {
        size_t start = offset + s * per;
        if (s < extra) offset++;
        size_t end = offset + (s + 1) * per;
        tlist *part = tl_new(c, L_LIST, end - start + 1);
        if (!part) return -1;
        for (size_t k = start; k < end; k++) part->v[part->n++] = items->v[k];
        if (has_fill && s >= extra) part->v[part->n++] = fill;
        if (tl_push(c, res, tv_list(part))) return -1;
    }
    return make_gen(c, res, "sync_do_slice", out);
}

int tpl_apply_filter(rctx *c, int id, tv v, const tv *args, size_t nargs, const tstr **kwn,
                     const tv *kwv, size_t nkw, tv *out) {
    tv a[5];
    bool g[5];
    const char *fname = tpl_filter_name(id);
#define BIND(np, req, ...)                                                                         \
    do {                                                                                           \
        static const char *const pn_[] = {__VA_ARGS__};                                            \
        if (tpl_bind_args(c, fname, pn_, np, req, args, nargs, kwn, kwv, nkw, a, g)) return -1;    \
    } while (0)
#define BIND0()                                                                                    \
    do {                                                                                           \
        if (tpl_bind_args(c, fname, NULL, 0, 0, args, nargs, kwn, kwv, nkw, a, g)) return -1;      \
    } while (0)
    switch (id) {
    case FL_ABS:
        BIND0();
        if (v.type == TV_INT || v.type == TV_BOOL) {
            int64_t x = tv_ival(v);
            if (x == INT64_MIN)
                return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, "OverflowError",
                               "integer overflow");
            *out = tv_int(x < 0 ? -x : x);
            return 0;
        }
        if (v.type == TV_FLOAT) {
            *out = tv_float(fabs(v.f));
            return 0;
        }
        return tpl_arg_error(c, "bad operand type for abs(): '%s'%s", tv_type_name(v), "");
    case FL_ATTR: {
        BIND(1, 1, "name");
        tv name;
        if (tv_to_str(c, a[0], &name)) return -1;
        if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
        /* getattr only: no item fallback */
        if (v.type == TV_DICT) {
            bool unsafe;
            if (tpl_method_id(v, name.s->s, name.s->len, &unsafe) < 0) {
                *out = tv_undef_attr(c, v, name);
                return 0;
            }
        }
        if (v.type == TV_LIST || v.type == TV_STR || v.type == TV_NS || v.type == TV_LOOP ||
            v.type == TV_DICT)
            return rt_getattr(c, v, name.s, out);
        *out = tv_undef_attr(c, v, name);
        return 0;
    }
    case FL_BATCH:
        BIND(2, 1, "linecount", "fill_with");
        return filter_batch_slice(c, id, v, a[0], a[1], out);
    case FL_SLICE:
        BIND(2, 1, "slices", "fill_with");
        return filter_batch_slice(c, id, v, a[0], a[1], out);
    case FL_CAPITALIZE:
    case FL_LOWER:
    case FL_UPPER:
    case FL_TITLE: {
        BIND0();
        tv s;
        if (soft_str(c, v, &s)) return -1;
        int r = id == FL_CAPITALIZE ? tpl_str_capitalize(c, s, out)
                : id == FL_TITLE    ? jinja_title(c, s, out)
                                    : tpl_str_case(c, s, id == FL_LOWER ? 0 : 1, out);
        if (r) return -1;
        out->markup = s.markup;
        return 0;
    }
    case FL_CENTER: {
        BIND(1, 0, "width");
        int64_t w = 80;
        if (g[0] && tpl_need_int(c, a[0], "width", &w)) return -1;
        tv s;
        if (soft_str(c, v, &s)) return -1;
        return tpl_str_pad(c, s, w, tv_none(), 0, out);
    }
    case FL_COUNT:
    case FL_LENGTH: {
        BIND0();
        int64_t n;
        if (tv_len(c, v, &n)) return -1;
        *out = tv_int(n);
        return 0;
    }
    case FL_D:
    case FL_DEFAULT:
        BIND(2, 0, "default_value", "boolean");
        if (v.type == TV_UNDEF || (g[1] && tv_truthy(a[1]) && !tv_truthy(v))) {
            if (g[0]) {
                *out = a[0];
                return 0;
            }
            return tv_strc(c, "", 0, out);
        }
        *out = v;
        return 0;
    case FL_DICTSORT:
        BIND(3, 0, "case_sensitive", "by", "reverse");
        return filter_dictsort(c, v, g[0] && tv_truthy(a[0]), a[1], g[2] && tv_truthy(a[2]), out);
    case FL_E:
    case FL_ESCAPE:
        BIND0();
        return tpl_escape(c, v, out);
    case FL_FORCEESCAPE: {
        BIND0();
        tv s;
        if (tv_to_str(c, v, &s)) return -1;
        s.markup = 0;
        return tpl_escape(c, s, out);
    }
    case FL_FIRST: {
        BIND0();
        if (v.type == TV_LIST && v.l->kind == L_GEN) {
            if (v.l->pos < v.l->n) {
                *out = v.l->v[v.l->pos++];
                return 0;
            }
        } else {
            tlist *items;
            if (tv_iterate(c, v, &items)) return -1;
            if (items->n) {
                *out = items->v[0];
                return 0;
            }
        }
        *out = tv_undef_hint(c, "No first item, sequence was empty.", UX_UNDEFINED);
        return 0;
    }
    case FL_LAST: {
        BIND0();
        if (v.type == TV_LIST &&
            (v.l->kind == L_GEN || v.l->kind == L_ITEMS || v.l->kind == L_KEYS ||
             v.l->kind == L_VALUES) &&
            v.l->kind == L_GEN)
            return tpl_arg_error(c, "'%s' object is not reversible%s", tv_type_name(v), "");
        if (v.type != TV_UNDEF && v.type != TV_STR && v.type != TV_LIST && v.type != TV_DICT)
            return tpl_arg_error(c, "'%s' object is not reversible%s", tv_type_name(v), "");
        tlist *items;
        if (tv_iterate(c, v, &items)) return -1;
        if (items->n) {
            *out = items->v[items->n - 1];
            return 0;
        }
        *out = tv_undef_hint(c, "No last item, sequence was empty.", UX_UNDEFINED);
        return 0;
    }
    case FL_FLOAT: {
        BIND(1, 0, "default");
        tv dflt = g[0] ? a[0] : tv_float(0.0);
        if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
        if (v.type == TV_FLOAT) {
            *out = v;
            return 0;
        }
        if (v.type == TV_INT || v.type == TV_BOOL) {
            *out = tv_float((double)tv_ival(v));
            return 0;
        }
        double d;
        if (v.type == TV_STR && tpl_parse_py_float(v.s, &d)) {
            *out = tv_float(d);
            return 0;
        }
        *out = dflt;
        return 0;
    }
    case FL_INT: {
        BIND(2, 0, "default", "base");
        tv dflt = g[0] ? a[0] : tv_int(0);
        int64_t base = 10;
        if (g[1] && tpl_need_int(c, a[1], "base", &base)) return -1;
        if (v.type == TV_UNDEF) return tv_undef_fail(c, v);
        if (v.type == TV_INT || v.type == TV_BOOL) {
            *out = tv_int(tv_ival(v));
            return 0;
        }
        if (v.type == TV_FLOAT) {
            if (!isfinite(v.f)) {
                *out = dflt;
                return 0;
            }
            if (fabs(v.f) >= 9.2e18)
                return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, "OverflowError",
                               "integer beyond 64 bits");
            *out = tv_int((int64_t)v.f);
            return 0;
        }
        if (v.type == TV_STR) {
            int64_t r;
            bool ovf;
            if (base != 0 && (base < 2 || base > 36)) {
                *out = dflt;
                return 0;
            }
            if (tpl_parse_py_int(v.s, (int)base, &r, &ovf)) {
                if (ovf)
                    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, "OverflowError",
                                   "integer beyond 64 bits");
                *out = tv_int(r);
                return 0;
            }
            double d; /* "42.23"|int gives 42 */
            if (tpl_parse_py_float(v.s, &d) && isfinite(d)) {
                if (fabs(d) >= 9.2e18)
                    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, "OverflowError",
                                   "integer beyond 64 bits");
                *out = tv_int((int64_t)d);
                return 0;
            }
        }
        *out = dflt;
        return 0;
    }
    case FL_FORMAT: {
        tv s;
        if (soft_str(c, v, &s)) return -1;
        if (nargs && nkw)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "FilterArgumentError",
                           "can't handle positional and keyword arguments at the same time");
        tv fa;
        if (nkw) {
            tdict *d = td_new(c);
            if (!d) return -1;
            for (size_t k = 0; k < nkw; k++)
                if (td_set(c, d, tv_str(kwn[k]), kwv[k])) return -1;
            fa = tv_dict(d);
        } else {
            tlist *t = tl_new(c, L_TUPLE, nargs);
            if (!t) return -1;
            for (size_t k = 0; k < nargs; k++) t->v[t->n++] = args[k];
            fa = tv_list(t);
        }
        return tpl_percent_format(c, s, fa, out);
    }
    case FL_GROUPBY:
        BIND(3, 1, "attribute", "default", "case_sensitive");
        return filter_groupby(c, v, a[0], a[1], g[2] && tv_truthy(a[2]), out);
    case FL_INDENT:
        BIND(3, 0, "width", "first", "blank");
        return filter_indent(c, v, a[0], a[1], a[2], out);
    case FL_ITEMS: {
        BIND0();
        tlist *res = tl_new(c, L_LIST, 0);
        if (!res) return -1;
        if (v.type == TV_UNDEF) return make_gen(c, res, "do_items", out);
        if (v.type != TV_DICT)
            return tpl_arg_error(c, "Can only get item pairs from a mapping.%s%s", "", "");
        for (size_t k = 0; k < v.d->n; k++) {
            tlist *pair = tl_new(c, L_TUPLE, 2);
            if (!pair) return -1;
            pair->v[0] = v.d->e[k].k;
            pair->v[1] = v.d->e[k].v;
            pair->n = 2;
            if (tl_push(c, res, tv_list(pair))) return -1;
        }
        return make_gen(c, res, "do_items", out);
    }
    case FL_JOIN:
        BIND(2, 0, "d", "attribute");
        return filter_join(c, v, a[0], a[1], out);
    case FL_LIST: {
        BIND0();
        tlist *items;
        if (tv_iterate(c, v, &items)) return -1;
        tlist *l = tl_new(c, L_LIST, items->n);
        if (!l) return -1;
        if (items->n) memcpy(l->v, items->v, items->n * sizeof(tv));
        l->n = items->n;
        *out = tv_list(l);
        return 0;
    }
    case FL_MAP:
    case FL_SELECT:
    case FL_REJECT:
    case FL_SELECTATTR:
    case FL_REJECTATTR:
        return filter_map_like(c, id, v, args, nargs, kwn, kwv, nkw, out);
    case FL_MAX:
    case FL_MIN:
        BIND(2, 0, "case_sensitive", "attribute");
        return filter_minmax(c, v, id == FL_MAX, g[0] && tv_truthy(a[0]), a[1], out);
    case FL_REPLACE: {
        BIND(3, 2, "old", "new", "count");
        int64_t count = -1;
        if (g[2] && a[2].type != TV_NONE && tpl_need_int(c, a[2], "count", &count)) return -1;
        tv s, o, n;
        if (tv_to_str(c, v, &s) || tv_to_str(c, a[0], &o) || tv_to_str(c, a[1], &n)) return -1;
        return tpl_str_replace(c, s, o, n, count, out);
    }
    case FL_REVERSE: {
        BIND0();
        if (v.type == TV_STR) {
            cpbuf b;
            if (tpl_to_cps(c, v.s, &b)) return -1;
            for (size_t i = 0, j = b.n; i + 1 < j; i++, j--) {
                uint32_t t = b.cp[i];
                b.cp[i] = b.cp[j - 1];
                b.cp[j - 1] = t;
            }
            if (tpl_from_cps(c, b.cp, b.n, out)) return -1;
            out->markup = v.markup;
            return 0;
        }
        tlist *items;
        if (tv_iterate(c, v, &items)) return -1;
        tlist *r = tl_new(c, L_LIST, items->n);
        if (!r) return -1;
        for (size_t k = items->n; k > 0; k--) r->v[r->n++] = items->v[k - 1];
        if (v.type == TV_LIST && v.l->kind == L_GEN) { /* list(value) reversed: a list */
            *out = tv_list(r);
            return 0;
        }
        return make_gen(c, r,
                        v.type == TV_DICT                           ? "!dict_reversekeyiterator"
                        : v.type == TV_LIST && v.l->kind == L_RANGE ? "!range_iterator"
                                                                    : "!list_reverseiterator",
                        out);
    }
    case FL_ROUND:
        BIND(2, 0, "precision", "method");
        return filter_round(c, v, a[0], a[1], out);
    case FL_SAFE: {
        BIND0();
        if (tv_to_str(c, v, out)) return -1;
        out->markup = 1;
        return 0;
    }
    case FL_SORT:
        BIND(3, 0, "reverse", "case_sensitive", "attribute");
        return filter_sort(c, v, g[0] && tv_truthy(a[0]), g[1] && tv_truthy(a[1]), a[2], out);
    case FL_STRING:
        BIND0();
        return soft_str(c, v, out);
    case FL_SUM:
        BIND(2, 0, "attribute", "start");
        return filter_sum(c, v, a[0], a[1], out);
    case FL_TOJSON:
        return filter_tojson(c, v, args, nargs, kwn, kwv, nkw, out);
    case FL_TRIM: {
        BIND(1, 0, "chars");
        tv s;
        if (soft_str(c, v, &s)) return -1;
        return tpl_str_strip(c, s, g[0] ? a[0] : tv_none(), 3, out);
    }
    case FL_TRUNCATE:
        BIND(4, 0, "length", "killwords", "end", "leeway");
        return filter_truncate(c, v, a[0], a[1], a[2], a[3], out);
    case FL_UNIQUE:
        BIND(2, 0, "case_sensitive", "attribute");
        return filter_unique(c, v, g[0] && tv_truthy(a[0]), a[1], out);
    case FL_WORDCOUNT: {
        BIND0();
        tv s;
        if (soft_str(c, v, &s)) return -1;
        cpbuf b;
        if (tpl_to_cps(c, s.s, &b)) return -1;
        int64_t n = 0;
        bool in = false;
        for (size_t k = 0; k < b.n; k++) {
            uint32_t x = b.cp[k];
            bool w = x == '_' || tpl_is_alpha(x) || tpl_is_digit(x);
            if (w && !in) n++;
            in = w;
        }
        *out = tv_int(n);
        return 0;
    }
    }
#undef BIND
#undef BIND0
    return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, NULL, "unknown filter");
}
