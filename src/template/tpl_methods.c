/* tpl_methods.c - the methods of str, dict, list and tuple objects that Jinja2's
 * ImmutableSandboxedEnvironment lets templates call, with Python semantics (the mutating ones,
 * such as list.append or dict.update, are refused), and loop.cycle() and loop.changed(). */
#include <string.h>

#include "template/tpl.h"
#include "template/tpl_names.h"

/* ---------------------------------------------------------------------------------------- */
/* str helpers                                                                              */

static int str_join(rctx *c, tv sep, tv iterable, tv *out, bool strict) {
    tlist *items;
    if (tv_iterate(c, iterable, &items)) return -1;
    sbuf b = {0};
    for (size_t k = 0; k < items->n; k++) {
        if (k && sb_put(c, &b, sep.s->s, sep.s->len)) return -1;
        tv it = items->v[k];
        if (strict && it.type != TV_STR)
            return tpl_arg_error(c, "sequence item %s: expected str instance, %s found", "",
                                 tv_type_name(it));
        if (tv_to_sb(c, it, &b)) return -1;
    }
    if (rt_step(c, items->n)) return -1;
    if (!b.p) return tv_strc(c, "", 0, out);
    return sb_str(c, &b, out);
}

/* Python str.title(): uppercase after a non-cased character. */
static int py_title(rctx *c, tv s, tv *out) {
    cpbuf b;
    if (tpl_to_cps(c, s.s, &b)) return -1;
    bool prev_cased = false;
    for (size_t k = 0; k < b.n; k++) {
        uint32_t x = b.cp[k];
        bool cased = tpl_is_cased_lower(x) || tpl_is_cased_upper(x);
        if (cased) b.cp[k] = prev_cased ? tpl_lower(x) : tpl_upper(x);
        prev_cased = cased;
    }
    return tpl_from_cps(c, b.cp, b.n, out);
}

static void norm_range(tv startv, tv endv, int64_t n, int64_t *a, int64_t *b) {
    int64_t s = 0, e = n;
    if (startv.type == TV_INT || startv.type == TV_BOOL) s = tv_ival(startv);
    if (endv.type == TV_INT || endv.type == TV_BOOL) e = tv_ival(endv);
    if (s < 0) s += n;
    if (s < 0) s = 0;
    if (e < 0) e += n;
    if (e < 0) e = 0;
    if (e > n) e = n;
    *a = s;
    *b = e;
}

static int sfind(rctx *c, tv s, tv sub, tv start, tv end, bool rev, int64_t *out) {
    if (sub.type != TV_STR) return tpl_arg_error(c, "must be str, not %s%s", tv_type_name(sub), "");
    int64_t a, b;
    norm_range(start, end, (int64_t)s.s->nchars, &a, &b);
    *out = -1;
    if (a > b) return 0;
    size_t oa = tpl_cp_off(s.s, a), ob = tpl_cp_off(s.s, b);
    const char *hay = s.s->s + oa;
    size_t hn = ob - oa, nn = sub.s->len;
    if (nn > hn) return 0;
    const char *hit = NULL;
    if (!rev) {
        hit = nn ? memmem(hay, hn, sub.s->s, nn) : hay;
    } else {
        for (size_t i = hn - nn + 1; i > 0; i--)
            if (memcmp(hay + i - 1, sub.s->s, nn) == 0) {
                hit = hay + i - 1;
                break;
            }
    }
    if (hit) *out = a + (int64_t)tpl_utf8_count(hay, (size_t)(hit - hay));
    return 0;
}

static int affix_match(rctx *c, tv s, tv aff, tv start, tv end, bool suffix, bool *out) {
    int64_t a, b;
    norm_range(start, end, (int64_t)s.s->nchars, &a, &b);
    tlist one = {.kind = L_TUPLE, .n = 1, .v = &aff};
    const tlist *cands = &one;
    if (aff.type == TV_LIST && aff.l->kind == L_TUPLE)
        cands = aff.l;
    else if (aff.type != TV_STR)
        return tpl_arg_error(c, "%s first arg must be str or a tuple of str, not %s",
                             suffix ? "endswith" : "startswith", tv_type_name(aff));
    *out = false;
    if (a > (int64_t)s.s->nchars) return 0;
    size_t oa = tpl_cp_off(s.s, a), ob = tpl_cp_off(s.s, b < a ? a : b);
    for (size_t k = 0; k < cands->n; k++) {
        tv x = cands->v[k];
        if (x.type != TV_STR)
            return tpl_arg_error(c, "tuple for %s must only contain str, not %s",
                                 suffix ? "endswith" : "startswith", tv_type_name(x));
        size_t n = x.s->len;
        if (b < a) continue;
        if (n > ob - oa) continue;
        const char *p = suffix ? s.s->s + ob - n : s.s->s + oa;
        if (memcmp(p, x.s->s, n) == 0) {
            *out = true;
            return 0;
        }
    }
    return 0;
}

static int str_pred(rctx *c, tv s, int id, tv *out) {
    cpbuf b;
    if (tpl_to_cps(c, s.s, &b)) return -1;
    bool r = b.n > 0, any_cased = false;
    if (id == M_ISTITLE) {
        bool prev_cased = false;
        r = false;
        for (size_t k = 0; k < b.n; k++) {
            uint32_t x = b.cp[k];
            if (tpl_is_cased_upper(x)) {
                if (prev_cased) {
                    *out = tv_bool(false);
                    return 0;
                }
                prev_cased = true;
                r = true;
            } else if (tpl_is_cased_lower(x)) {
                if (!prev_cased) {
                    *out = tv_bool(false);
                    return 0;
                }
                prev_cased = true;
                r = true;
            } else {
                prev_cased = false;
            }
        }
        *out = tv_bool(r);
        return 0;
    }
    for (size_t k = 0; k < b.n; k++) {
        uint32_t x = b.cp[k];
        switch (id) {
        case M_ISDIGIT:
        case M_ISDECIMAL:
        case M_ISNUMERIC:
            if (!tpl_is_digit(x)) r = false;
            break;
        case M_ISALPHA:
            if (!tpl_is_alpha(x)) r = false;
            break;
        case M_ISALNUM:
            if (!tpl_is_alpha(x) && !tpl_is_digit(x)) r = false;
            break;
        case M_ISSPACE:
            if (!tpl_is_space(x)) r = false;
            break;
        case M_ISLOWER:
            if (tpl_is_cased_upper(x)) r = false;
            if (tpl_is_cased_lower(x)) any_cased = true;
            break;
        case M_ISUPPER:
            if (tpl_is_cased_lower(x)) r = false;
            if (tpl_is_cased_upper(x)) any_cased = true;
            break;
        }
    }
    if (id == M_ISLOWER || id == M_ISUPPER) r = r && any_cased;
    *out = tv_bool(r);
    return 0;
}

/* str.format (SandboxedEnvironment routes it through a sandboxed formatter): "{}", "{0}",
 * "{name}", "{0.attr}", "{0[key]}", "{!r}"/"{!s}", "{{" and "}}". Format specs are not
 * supported. */
static int str_format(rctx *c, tv fmt, const tv *args, size_t nargs, const tstr **kwn,
                      const tv *kwv, size_t nkw, tv *out) {
    sbuf b = {0};
    const char *s = fmt.s->s;
    size_t n = fmt.s->len, auto_idx = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '}') {
            if (i + 1 < n && s[i + 1] == '}') {
                if (sb_putc(c, &b, '}')) return -1;
                i++;
                continue;
            }
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                           "Single '}' encountered in format string");
        }
        if (ch != '{') {
            if (sb_putc(c, &b, ch)) return -1;
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            if (sb_putc(c, &b, '{')) return -1;
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && s[j] != '}') j++;
        if (j >= n)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError",
                           "Single '{' encountered in format string");
        const char *f = s + i + 1, *fe = s + j;
        const char *conv = memchr(f, '!', (size_t)(fe - f));
        const char *spec = memchr(f, ':', (size_t)(fe - f));
        if (spec && (!conv || spec < conv)) {
            if (spec + 1 < fe)
                return rt_fail(c, KILN_TEMPLATE_ERR_UNSUPPORTED, NULL,
                               "unsupported: format specs in str.format");
            fe = spec;
        }
        char cv = 's';
        if (conv && conv < fe) {
            cv = conv + 1 < fe ? conv[1] : 's';
            fe = conv;
        }
        /* field name: first part up to '.' or '[' */
        const char *p = f;
        while (p < fe && *p != '.' && *p != '[') p++;
        tv val;
        if (p == f) {
            if (auto_idx >= nargs)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "IndexError",
                               "Replacement index %zu out of range for positional args tuple",
                               auto_idx);
            val = args[auto_idx++];
        } else if (*f >= '0' && *f <= '9') {
            size_t idx = 0;
            for (const char *q = f; q < p; q++) {
                if (*q < '0' || *q > '9')
                    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "bad format field");
                idx = idx * 10 + (size_t)(*q - '0');
                if (idx > 1000000) break;
            }
            if (idx >= nargs)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "IndexError",
                               "Replacement index %zu out of range for positional args tuple", idx);
            val = args[idx];
        } else {
            size_t k = 0;
            while (k < nkw &&
                   !(kwn[k]->len == (size_t)(p - f) && memcmp(kwn[k]->s, f, (size_t)(p - f)) == 0))
                k++;
            if (k == nkw)
                return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "KeyError", "'%.*s'", (int)(p - f), f);
            val = kwv[k];
        }
        while (p < fe) {
            if (*p == '.') {
                const char *q = ++p;
                while (p < fe && *p != '.' && *p != '[') p++;
                const tstr *an = tpl_str_new(&c->ar, q, (size_t)(p - q));
                if (!an) return rt_oom(c);
                if (rt_getattr(c, val, an, &val)) return -1;
            } else {
                const char *q = ++p;
                while (p < fe && *p != ']') p++;
                tv key;
                bool digits = p > q;
                for (const char *r = q; r < p; r++) digits = digits && *r >= '0' && *r <= '9';
                if (digits && p - q < 18) {
                    int64_t x = 0;
                    for (const char *r = q; r < p; r++) x = x * 10 + (*r - '0');
                    key = tv_int(x);
                } else if (tv_strc(c, q, (size_t)(p - q), &key)) {
                    return -1;
                }
                if (rt_getitem(c, val, key, &val)) return -1;
                if (p < fe) p++;
            }
        }
        if (cv == 'r' || cv == 'a') {
            if (tv_repr_sb(c, val, &b)) return -1;
        } else {
            if (val.type == TV_UNDEF && val.u && val.u->exc == UX_SECURITY)
                return tv_undef_fail(c, val);
            if (tv_to_sb(c, val, &b)) return -1;
        }
        i = j;
    }
    if (!b.p) return tv_strc(c, "", 0, out);
    return sb_str(c, &b, out);
}

/* ---------------------------------------------------------------------------------------- */
/* calls                                                                                    */

int tpl_call_method(rctx *c, tv self, int id, const tv *args, size_t nargs, const tstr **kwn,
                    const tv *kwv, size_t nkw, tv *out) {
    tv a[4];
    bool g[4];
    const char *mname = tpl_method_name(id);
#define MBIND(np, req, ...)                                                                        \
    do {                                                                                           \
        static const char *const pn_[] = {__VA_ARGS__};                                            \
        if (tpl_bind_args(c, mname, pn_, np, req, args, nargs, kwn, kwv, nkw, a, g)) return -1;    \
    } while (0)
#define MBIND0()                                                                                   \
    do {                                                                                           \
        if (tpl_bind_args(c, mname, NULL, 0, 0, args, nargs, kwn, kwv, nkw, a, g)) return -1;      \
    } while (0)
    if (rt_step(c, 1)) return -1;
    switch (id) {
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        MBIND(1, 0, "chars");
        return tpl_str_strip(c, self, g[0] ? a[0] : tv_none(),
                             id == M_STRIP    ? 3
                             : id == M_LSTRIP ? 1
                                              : 2,
                             out);
    case M_SPLIT:
    case M_RSPLIT: {
        MBIND(2, 0, "sep", "maxsplit");
        int64_t maxsplit = -1;
        if (g[1] && tpl_need_int(c, a[1], "maxsplit", &maxsplit)) return -1;
        return tpl_str_split(c, self, g[0] ? a[0] : tv_none(), maxsplit, id == M_RSPLIT, out);
    }
    case M_SPLITLINES: {
        MBIND(1, 0, "keepends");
        tlist *l;
        if (tpl_str_splitlines(c, self, g[0] && tv_truthy(a[0]), &l)) return -1;
        *out = tv_list(l);
        return 0;
    }
    case M_STARTSWITH:
    case M_ENDSWITH: {
        MBIND(3, 1, "prefix", "start", "end");
        bool r = false;
        if (affix_match(c, self, a[0], a[1], a[2], id == M_ENDSWITH, &r)) return -1;
        *out = tv_bool(r);
        return 0;
    }
    case M_UPPER:
    case M_LOWER:
    case M_CASEFOLD:
    case M_SWAPCASE:
        MBIND0();
        return tpl_str_case(c, self, id == M_UPPER ? 1 : id == M_SWAPCASE ? 2 : 0, out);
    case M_TITLE:
        MBIND0();
        return py_title(c, self, out);
    case M_CAPITALIZE:
        MBIND0();
        return tpl_str_capitalize(c, self, out);
    case M_REPLACE: {
        MBIND(3, 2, "old", "new", "count");
        int64_t count = -1;
        if (g[2] && tpl_need_int(c, a[2], "count", &count)) return -1;
        if (a[0].type != TV_STR || a[1].type != TV_STR)
            return tpl_arg_error(c, "replace() argument must be str, not %s%s",
                                 tv_type_name(a[0].type != TV_STR ? a[0] : a[1]), "");
        return tpl_str_replace(c, self, a[0], a[1], count, out);
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_RINDEX: {
        MBIND(3, 1, "sub", "start", "end");
        int64_t r;
        if (sfind(c, self, a[0], a[1], a[2], id == M_RFIND || id == M_RINDEX, &r)) return -1;
        if (r < 0 && (id == M_INDEX || id == M_RINDEX))
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "substring not found");
        *out = tv_int(r);
        return 0;
    }
    case M_SCOUNT: {
        MBIND(3, 1, "sub", "start", "end");
        if (a[0].type != TV_STR)
            return tpl_arg_error(c, "must be str, not %s%s", tv_type_name(a[0]), "");
        int64_t lo, hi;
        norm_range(a[1], a[2], (int64_t)self.s->nchars, &lo, &hi);
        if (lo > hi) {
            *out = tv_int(0);
            return 0;
        }
        size_t oa = tpl_cp_off(self.s, lo), ob = tpl_cp_off(self.s, hi);
        int64_t n = 0;
        if (a[0].s->len == 0) {
            n = (int64_t)tpl_utf8_count(self.s->s + oa, ob - oa) + 1;
        } else {
            for (size_t i = oa; i + a[0].s->len <= ob;) {
                const char *h = memmem(self.s->s + i, ob - i, a[0].s->s, a[0].s->len);
                if (!h) break;
                n++;
                i = (size_t)(h - self.s->s) + a[0].s->len;
            }
        }
        *out = tv_int(n);
        return 0;
    }
    case M_JOIN:
        MBIND(1, 1, "iterable");
        return str_join(c, self, a[0], out, true);
    case M_ISDIGIT:
    case M_ISDECIMAL:
    case M_ISNUMERIC:
    case M_ISALPHA:
    case M_ISALNUM:
    case M_ISSPACE:
    case M_ISLOWER:
    case M_ISUPPER:
    case M_ISTITLE:
        MBIND0();
        return str_pred(c, self, id, out);
    case M_CENTER:
    case M_LJUST:
    case M_RJUST: {
        MBIND(2, 1, "width", "fillchar");
        int64_t w;
        if (tpl_need_int(c, a[0], "width", &w)) return -1;
        if (g[1] && a[1].type != TV_STR)
            return tpl_arg_error(c, "The fill character must be a unicode character, not %s%s",
                                 tv_type_name(a[1]), "");
        return tpl_str_pad(c, self, w, g[1] ? a[1] : tv_none(),
                           id == M_CENTER  ? 0
                           : id == M_LJUST ? 1
                                           : 2,
                           out);
    }
    case M_ZFILL: {
        MBIND(1, 1, "width");
        int64_t w;
        if (tpl_need_int(c, a[0], "width", &w)) return -1;
        int64_t len = (int64_t)self.s->nchars;
        if (w <= len) {
            *out = self;
            return 0;
        }
        if (w - len > (int64_t)c->max_output)
            return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "zfill too large");
        sbuf b = {0};
        size_t start = 0;
        if (self.s->len && (self.s->s[0] == '+' || self.s->s[0] == '-')) {
            if (sb_putc(c, &b, self.s->s[0])) return -1;
            start = 1;
        }
        for (int64_t k = 0; k < w - len; k++)
            if (sb_putc(c, &b, '0')) return -1;
        if (sb_put(c, &b, self.s->s + start, self.s->len - start)) return -1;
        return sb_str(c, &b, out);
    }
    case M_PARTITION:
    case M_RPARTITION: {
        MBIND(1, 1, "sep");
        if (a[0].type != TV_STR)
            return tpl_arg_error(c, "must be str, not %s%s", tv_type_name(a[0]), "");
        if (a[0].s->len == 0)
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "empty separator");
        int64_t pos;
        if (sfind(c, self, a[0], tv_none(), tv_none(), id == M_RPARTITION, &pos)) return -1;
        tlist *t = tl_new(c, L_TUPLE, 3);
        if (!t) return -1;
        tv e;
        if (tv_strc(c, "", 0, &e)) return -1;
        if (pos < 0) {
            t->v[0] = id == M_PARTITION ? self : e;
            t->v[1] = e;
            t->v[2] = id == M_PARTITION ? e : self;
        } else {
            size_t o = tpl_cp_off(self.s, pos);
            if (tv_strc(c, self.s->s, o, &t->v[0]) ||
                tv_strc(c, self.s->s + o + a[0].s->len, self.s->len - o - a[0].s->len, &t->v[2]))
                return -1;
            t->v[1] = a[0];
        }
        t->n = 3;
        *out = tv_list(t);
        return 0;
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        MBIND(1, 1, "affix");
        if (a[0].type != TV_STR)
            return tpl_arg_error(c, "must be str, not %s%s", tv_type_name(a[0]), "");
        size_t n = a[0].s->len;
        if (n <= self.s->len) {
            if (id == M_REMOVEPREFIX && memcmp(self.s->s, a[0].s->s, n) == 0)
                return tv_strc(c, self.s->s + n, self.s->len - n, out);
            if (id == M_REMOVESUFFIX && n && memcmp(self.s->s + self.s->len - n, a[0].s->s, n) == 0)
                return tv_strc(c, self.s->s, self.s->len - n, out);
        }
        *out = self;
        return 0;
    }
    case M_FORMAT:
        return str_format(c, self, args, nargs, kwn, kwv, nkw, out);
    case M_GET: {
        if (nkw) return tpl_arg_error(c, "dict.get() takes no keyword arguments%s%s", "", "");
        if (nargs < 1 || nargs > 2)
            return tpl_arg_error(c, "get expected at most 2 arguments, got %s%s",
                                 nargs ? "3+" : "0", "");
        tv *p;
        if (td_get(c, self.d, args[0], &p)) return -1;
        *out = p ? *p : nargs == 2 ? args[1] : tv_none();
        return 0;
    }
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES: {
        MBIND0();
        tlist *l = tl_new(c, id == M_ITEMS ? L_ITEMS : id == M_KEYS ? L_KEYS : L_VALUES, self.d->n);
        if (!l) return -1;
        for (size_t k = 0; k < self.d->n; k++) {
            if (id == M_ITEMS) {
                tlist *pair = tl_new(c, L_TUPLE, 2);
                if (!pair) return -1;
                pair->v[0] = self.d->e[k].k;
                pair->v[1] = self.d->e[k].v;
                pair->n = 2;
                l->v[l->n++] = tv_list(pair);
            } else {
                l->v[l->n++] = id == M_KEYS ? self.d->e[k].k : self.d->e[k].v;
            }
        }
        *out = tv_list(l);
        return 0;
    }
    case M_DCOPY: {
        MBIND0();
        tdict *d = td_new(c);
        if (!d) return -1;
        for (size_t k = 0; k < self.d->n; k++)
            if (td_set(c, d, self.d->e[k].k, self.d->e[k].v)) return -1;
        *out = tv_dict(d);
        return 0;
    }
    case M_LCOPY: {
        MBIND0();
        tlist *l = tl_new(c, L_LIST, self.l->n);
        if (!l) return -1;
        if (self.l->n) memcpy(l->v, self.l->v, self.l->n * sizeof(tv));
        l->n = self.l->n;
        *out = tv_list(l);
        return 0;
    }
    case M_LCOUNT: {
        MBIND(1, 1, "value");
        int64_t n = 0;
        for (size_t k = 0; k < self.l->n; k++) n += tv_eq(self.l->v[k], a[0]);
        *out = tv_int(n);
        return rt_step(c, self.l->n);
    }
    case M_LINDEX: {
        MBIND(1, 1, "value");
        for (size_t k = 0; k < self.l->n; k++)
            if (tv_eq(self.l->v[k], a[0])) {
                *out = tv_int((int64_t)k);
                return rt_step(c, k);
            }
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "value is not in list");
    }
    case M_CYCLE:
        if (nkw)
            return tpl_arg_error(c, "cycle() got an unexpected keyword argument '%s'%s", kwn[0]->s,
                                 "");
        if (!nargs) return tpl_arg_error(c, "no items for cycling given%s%s", "", "");
        *out = args[self.lp->i % nargs];
        return 0;
    case M_CHANGED: {
        tlist *t = tl_new(c, L_TUPLE, nargs);
        if (!t) return -1;
        for (size_t k = 0; k < nargs; k++) t->v[t->n++] = args[k];
        tv val = tv_list(t);
        tloop *lp = self.lp;
        bool changed = !lp->has_last || !tv_eq(lp->last, val);
        lp->last = val;
        lp->has_last = true;
        *out = tv_bool(changed);
        return 0;
    }
    }
#undef MBIND
#undef MBIND0
    return rt_fail(c, KILN_TEMPLATE_ERR_SECURITY, "SecurityError", "method not allowed");
}
