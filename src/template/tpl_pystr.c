/* tpl_pystr.c - Python's str operations, on code points, for the str methods and for the
 * filters that Jinja2 builds on them (lower, upper, capitalize, trim, replace, center, indent,
 * sort by several attributes, ...): case mapping, strip, replace, split, splitlines, padding. */
#include <string.h>

#include "template/tpl.h"

int tpl_to_cps(rctx *c, const tstr *s, cpbuf *o) {
    o->cp = tpl_alloc(&c->ar, (s->nchars + 1) * sizeof(uint32_t));
    if (!o->cp) return rt_oom(c);
    o->n = 0;
    for (size_t i = 0; i < s->len;) {
        size_t adv;
        o->cp[o->n++] = tpl_utf8_dec(s->s + i, s->len - i, &adv);
        i += adv;
    }
    return 0;
}

int tpl_from_cps(rctx *c, const uint32_t *cp, size_t n, tv *out) {
    char *buf = tpl_alloc(&c->ar, n * 4 + 1);
    if (!buf) return rt_oom(c);
    size_t o = 0;
    for (size_t k = 0; k < n; k++) o += tpl_utf8_enc(cp[k], buf + o);
    return tv_strc(c, buf, o, out);
}

/* Python str.lower() on a value already known to be a str. */
int tpl_str_case(rctx *c, tv s, int mode, tv *out) { /* 0 lower, 1 upper, 2 swapcase */
    cpbuf b;
    if (tpl_to_cps(c, s.s, &b)) return -1;
    for (size_t k = 0; k < b.n; k++) {
        uint32_t x = b.cp[k];
        if (mode == 0)
            b.cp[k] = tpl_lower(x);
        else if (mode == 1)
            b.cp[k] = tpl_upper(x);
        else
            b.cp[k] = tpl_is_cased_upper(x) ? tpl_lower(x) : tpl_upper(x);
    }
    if (tpl_from_cps(c, b.cp, b.n, out)) return -1;
    out->markup = s.markup;
    return 0;
}

static bool cp_in(uint32_t x, const cpbuf *set) {
    for (size_t k = 0; k < set->n; k++)
        if (set->cp[k] == x) return true;
    return false;
}

/* str.strip/lstrip/rstrip(chars): which = 1 left, 2 right, 3 both */
int tpl_str_strip(rctx *c, tv s, tv chars, int which, tv *out) {
    cpbuf b, set = {0};
    bool ws = chars.type == TV_NONE || (chars.type == TV_UNDEF && !chars.u);
    if (!ws) {
        if (chars.type != TV_STR)
            return tpl_arg_error(c, "strip arg must be None or str%s%s", "", "");
        if (tpl_to_cps(c, chars.s, &set)) return -1;
    }
    if (tpl_to_cps(c, s.s, &b)) return -1;
    size_t lo = 0, hi = b.n;
    if (which & 1)
        while (lo < hi && (ws ? tpl_is_space(b.cp[lo]) : cp_in(b.cp[lo], &set))) lo++;
    if (which & 2)
        while (hi > lo && (ws ? tpl_is_space(b.cp[hi - 1]) : cp_in(b.cp[hi - 1], &set))) hi--;
    if (lo == 0 && hi == b.n) {
        *out = s;
        return 0;
    }
    if (tpl_from_cps(c, b.cp + lo, hi - lo, out)) return -1;
    out->markup = s.markup;
    return 0;
}

int tpl_str_replace(rctx *c, tv s, tv old, tv new_, int64_t count, tv *out) {
    sbuf b = {0};
    const tstr *S = s.s, *O = old.s, *N = new_.s;
    if (O->len == 0) { /* insert between every code point */
        size_t k = 0, i = 0;
        for (; i <= S->len; k++) {
            if (count >= 0 && (int64_t)k >= count) break;
            if (sb_put(c, &b, N->s, N->len)) return -1;
            if (i == S->len) {
                i++;
                break;
            }
            size_t adv;
            tpl_utf8_dec(S->s + i, S->len - i, &adv);
            if (sb_put(c, &b, S->s + i, adv)) return -1;
            i += adv;
        }
        if (i <= S->len && sb_put(c, &b, S->s + i, S->len - i)) return -1;
    } else {
        size_t i = 0;
        int64_t k = 0;
        while (i <= S->len) {
            const char *hit =
                (count < 0 || k < count) ? memmem(S->s + i, S->len - i, O->s, O->len) : NULL;
            if (!hit) {
                if (sb_put(c, &b, S->s + i, S->len - i)) return -1;
                break;
            }
            size_t h = (size_t)(hit - S->s);
            if (sb_put(c, &b, S->s + i, h - i) || sb_put(c, &b, N->s, N->len)) return -1;
            i = h + O->len;
            k++;
            if (rt_step(c, 1)) return -1;
        }
    }
    if (!b.p) return tv_strc(c, "", 0, out);
    return sb_str(c, &b, out);
}

/* str.split(sep, maxsplit) / rsplit */
int tpl_str_split(rctx *c, tv s, tv sep, int64_t maxsplit, bool right, tv *out) {
    tlist *l = tl_new(c, L_LIST, 0);
    if (!l) return -1;
    const tstr *S = s.s;
    if (sep.type == TV_NONE || (sep.type == TV_UNDEF && !sep.u)) {
        cpbuf b;
        if (tpl_to_cps(c, S, &b)) return -1;
        /* collect word spans */
        size_t nspans = 0;
        size_t *st = tpl_alloc(&c->ar, (b.n + 1) * sizeof(size_t) * 2);
        if (!st) return rt_oom(c);
        size_t i = 0;
        while (i < b.n) {
            while (i < b.n && tpl_is_space(b.cp[i])) i++;
            if (i >= b.n) break;
            size_t j = i;
            while (j < b.n && !tpl_is_space(b.cp[j])) j++;
            st[2 * nspans] = i;
            st[2 * nspans + 1] = j;
            nspans++;
            i = j;
        }
        if (maxsplit >= 0 && (size_t)maxsplit < nspans) {
            /* the remainder after maxsplit words is kept whole, including the whitespace at
               its far end */
            size_t k = (size_t)maxsplit;
            if (!right) {
                st[2 * k + 1] = b.n;
                nspans = k + 1;
            } else {
                size_t first = nspans - 1 - k;
                st[2 * first] = 0;
                memmove(st, st + 2 * first, (k + 1) * 2 * sizeof(size_t));
                nspans = k + 1;
            }
        }
        for (size_t k = 0; k < nspans; k++) {
            tv piece;
            if (tpl_from_cps(c, b.cp + st[2 * k], st[2 * k + 1] - st[2 * k], &piece) ||
                tl_push(c, l, piece))
                return -1;
        }
        *out = tv_list(l);
        return 0;
    }
    if (sep.type != TV_STR)
        return tpl_arg_error(c, "must be str or None, not %s%s", tv_type_name(sep), "");
    const tstr *P = sep.s;
    if (P->len == 0) return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "ValueError", "empty separator");
    /* find all occurrences left to right */
    size_t *pos = NULL, np = 0, cap = 0;
    for (size_t i = 0; i + P->len <= S->len;) {
        const char *hit = memmem(S->s + i, S->len - i, P->s, P->len);
        if (!hit) break;
        if (np == cap) {
            size_t nc = cap ? cap * 2 : 8;
            size_t *q = tpl_realloc(&c->ar, pos, cap * sizeof(size_t), nc * sizeof(size_t));
            if (!q) return rt_oom(c);
            pos = q;
            cap = nc;
        }
        pos[np++] = (size_t)(hit - S->s);
        i = (size_t)(hit - S->s) + P->len;
    }
    if (right && maxsplit >= 0 && (size_t)maxsplit < np) {
        /* rsplit: occurrences found right to left may differ for overlapping separators;
           take the rightmost non-overlapping ones */
        size_t *rp = tpl_alloc(&c->ar, (np + 1) * sizeof(size_t));
        if (!rp) return rt_oom(c);
        size_t nr = 0;
        size_t end = S->len;
        while (nr < (size_t)maxsplit && end >= P->len) {
            size_t i = end - P->len;
            bool found = false;
            for (;;) {
                if (memcmp(S->s + i, P->s, P->len) == 0) {
                    found = true;
                    break;
                }
                if (i == 0) break;
                i--;
            }
            if (!found) break;
            rp[nr++] = i;
            end = i;
        }
        for (size_t k = 0; k < nr / 2; k++) {
            size_t t = rp[k];
            rp[k] = rp[nr - 1 - k];
            rp[nr - 1 - k] = t;
        }
        pos = rp;
        np = nr;
    } else if (maxsplit >= 0 && (size_t)maxsplit < np) {
        np = (size_t)maxsplit;
    }
    size_t start = 0;
    for (size_t k = 0; k <= np; k++) {
        size_t e = k < np ? pos[k] : S->len;
        tv piece;
        if (tv_strc(c, S->s + start, e - start, &piece) || tl_push(c, l, piece)) return -1;
        start = e + P->len;
    }
    if (rt_step(c, np)) return -1;
    *out = tv_list(l);
    return 0;
}

/* str.splitlines(keepends) */
int tpl_str_splitlines(rctx *c, tv s, bool keepends, tlist **out) {
    tlist *l = tl_new(c, L_LIST, 0);
    if (!l) return -1;
    const tstr *S = s.s;
    size_t i = 0, start = 0;
    while (i < S->len) {
        size_t adv;
        uint32_t cp = tpl_utf8_dec(S->s + i, S->len - i, &adv);
        if (tpl_is_linebreak(cp)) {
            size_t end = i, next = i + adv;
            if (cp == '\r' && next < S->len && S->s[next] == '\n') next++;
            tv piece;
            if (tv_strc(c, S->s + start, (keepends ? next : end) - start, &piece)) return -1;
            piece.markup = s.markup;
            if (tl_push(c, l, piece)) return -1;
            start = i = next;
            continue;
        }
        i += adv;
    }
    if (start < S->len) {
        tv piece;
        if (tv_strc(c, S->s + start, S->len - start, &piece)) return -1;
        piece.markup = s.markup;
        if (tl_push(c, l, piece)) return -1;
    }
    *out = l;
    return 0;
}

int tpl_str_capitalize(rctx *c, tv s, tv *out) {
    cpbuf b;
    if (tpl_to_cps(c, s.s, &b)) return -1;
    for (size_t k = 0; k < b.n; k++) b.cp[k] = k ? tpl_lower(b.cp[k]) : tpl_upper(b.cp[k]);
    return tpl_from_cps(c, b.cp, b.n, out);
}

int tpl_str_pad(rctx *c, tv s, int64_t width, tv fill, int align, tv *out) {
    /* align: 0 center, 1 ljust, 2 rjust */
    uint32_t f = ' ';
    if (fill.type == TV_STR) {
        if (fill.s->nchars != 1)
            return tpl_arg_error(c, "The fill character must be exactly one character long%s%s", "",
                                 "");
        size_t adv;
        f = tpl_utf8_dec(fill.s->s, fill.s->len, &adv);
    }
    int64_t len = (int64_t)s.s->nchars;
    if (width <= len) {
        *out = s;
        return 0;
    }
    if (width - len > (int64_t)c->max_output)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "padding too large");
    int64_t marg = width - len, left;
    if (align == 0)
        left = marg / 2 + (marg & width & 1);
    else if (align == 1)
        left = 0;
    else
        left = marg;
    char fc[4];
    size_t fl = tpl_utf8_enc(f, fc);
    sbuf b = {0};
    for (int64_t k = 0; k < left; k++)
        if (sb_put(c, &b, fc, fl)) return -1;
    if (sb_put(c, &b, s.s->s, s.s->len)) return -1;
    for (int64_t k = 0; k < marg - left; k++)
        if (sb_put(c, &b, fc, fl)) return -1;
    return sb_str(c, &b, out);
}

/* code point index -> byte offset */
size_t tpl_cp_off(const tstr *s, int64_t idx) {
    size_t off = 0;
    for (int64_t k = 0; k < idx && off < s->len; k++) {
        size_t adv;
        tpl_utf8_dec(s->s + off, s->len - off, &adv);
        off += adv;
    }
    return off;
}
