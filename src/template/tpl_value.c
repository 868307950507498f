/* tpl_value.c - the value model: Python semantics for the objects a chat template sees
 * (str, int, float, bool, None, list, tuple, dict, generators, Jinja2's Undefined and
 * Namespace), their str()/repr(), equality, ordering and hashing, and JSON in (json.loads)
 * and out (json.dumps, as transformers' tojson filter). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl.h"
#include "template/tpl_names.h"

enum { MAX_VALUE_DEPTH = 200 };

const tstr *tpl_str_new(tpl_arena *a, const char *s, size_t n) {
    tstr *t = tpl_alloc(a, sizeof(tstr) + n + 1);
    if (!t) return NULL;
    t->len = n;
    if (n) memcpy(t->s, s, n);
    t->s[n] = 0;
    t->nchars = tpl_utf8_count(s, n);
    return t;
}

bool tpl_str_eq(const tstr *a, const char *s) {
    size_t n = strlen(s);
    return a->len == n && memcmp(a->s, s, n) == 0;
}

int tv_strc(rctx *c, const char *s, size_t n, tv *out) {
    const tstr *t = tpl_str_new(&c->ar, s, n);
    if (!t) return rt_oom(c);
    *out = tv_str(t);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* string builder                                                                            */

int sb_put(rctx *c, sbuf *b, const char *s, size_t n) {
    if (n == 0) return 0;
    if (b->n + n > c->max_output)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "output limit exceeded (%zu bytes)",
                       c->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = tpl_realloc(&c->ar, b->p, b->cap, nc);
        if (!p) return rt_oom(c);
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int sb_puts(rctx *c, sbuf *b, const char *s) {
    return sb_put(c, b, s, strlen(s));
}

int sb_putc(rctx *c, sbuf *b, char ch) {
    return sb_put(c, b, &ch, 1);
}

int sb_printf(rctx *c, sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return 0;
    return sb_put(c, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

int sb_str(rctx *c, sbuf *b, tv *out) {
    return tv_strc(c, b->p ? b->p : "", b->n, out);
}

/* ---------------------------------------------------------------------------------------- */
/* undefined                                                                                 */

static tv make_undef(rctx *c, const char *hint, tv obj, tv name, uint8_t exc) {
    tundef *u = tpl_alloc(&c->ar, sizeof *u);
    tv v = tv_undef();
    if (!u) return v; /* degrade to a plain undefined; the cap error shows up later */
    u->hint = hint;
    u->obj = obj;
    u->name = name;
    u->exc = exc;
    v.u = u;
    return v;
}

tv tv_undef_named(rctx *c, const tstr *name) {
    return make_undef(c, NULL, tv_undef(), tv_str(name), UX_UNDEFINED);
}

tv tv_undef_attr(rctx *c, tv obj, tv name) {
    if (obj.type == TV_UNDEF) obj = tv_none(); /* never happens: getattr(undefined) raises */
    return make_undef(c, NULL, obj, name, UX_UNDEFINED);
}

tv tv_undef_hint(rctx *c, const char *hint, uint8_t exc) {
    char *h = tpl_alloc(&c->ar, strlen(hint) + 1);
    if (h) strcpy(h, hint);
    return make_undef(c, h ? h : "undefined", tv_undef(), tv_undef(), exc);
}

const char *tv_type_name(tv v) {
    switch (v.type) {
    case TV_UNDEF:
        return "Undefined";
    case TV_NONE:
        return "NoneType";
    case TV_BOOL:
        return "bool";
    case TV_INT:
        return "int";
    case TV_FLOAT:
        return "float";
    case TV_STR:
        return v.markup ? "Markup" : "str";
    case TV_LIST:
        switch (v.l->kind) {
        case L_TUPLE:
            return "tuple";
        case L_GEN:
            return v.l->gen_name && v.l->gen_name[0] == '!' ? v.l->gen_name + 1 : "generator";
        case L_ITEMS:
            return "dict_items";
        case L_KEYS:
            return "dict_keys";
        case L_VALUES:
            return "dict_values";
        case L_RANGE:
            return "range";
        default:
            return "list";
        }
    case TV_DICT:
        return "dict";
    case TV_NS:
        return "Namespace";
    case TV_FUNC:
        switch (v.fn->kind) {
        case F_MACRO:
        case F_CALLER:
            return "Macro";
        case F_METHOD:
            return "builtin_function_or_method";
        default:
            return "function";
        }
    case TV_LOOP:
        return "LoopContext";
    }
    return "object";
}

/* jinja2.utils.object_type_repr */
static void object_type_repr(tv v, char *buf, size_t cap) {
    if (v.type == TV_NONE) {
        snprintf(buf, cap, "None");
        return;
    }
    const char *mod = NULL;
    if (v.type == TV_NS) mod = "jinja2.utils";
    if (v.type == TV_LOOP) mod = "jinja2.runtime";
    if (v.type == TV_FUNC && (v.fn->kind == F_MACRO || v.fn->kind == F_CALLER))
        mod = "jinja2.runtime";
    if (v.type == TV_STR && v.markup) mod = "markupsafe";
    if (mod)
        snprintf(buf, cap, "%s.%s object", mod, tv_type_name(v));
    else
        snprintf(buf, cap, "%s object", tv_type_name(v));
}

int tv_undef_fail(rctx *c, tv v) {
    tundef *u = v.u;
    kiln_template_error_kind kind =
        u && u->exc == UX_SECURITY ? KILN_TEMPLATE_ERR_SECURITY : KILN_TEMPLATE_ERR_UNDEFINED;
    const char *exc = u && u->exc == UX_SECURITY ? "SecurityError" : "UndefinedError";
    if (!u) return rt_fail(c, kind, exc, "None is undefined");
    if (u->hint) return rt_fail(c, kind, exc, "%s", u->hint);
    sbuf nb = {0};
    if (tv_repr_sb(c, u->name, &nb)) return -1;
    if (u->obj.type == TV_UNDEF) return rt_fail(c, kind, exc, "%s is undefined", nb.p);
    char otr[128];
    object_type_repr(u->obj, otr, sizeof otr);
    if (u->name.type != TV_STR) return rt_fail(c, kind, exc, "%s has no element %s", otr, nb.p);
    return rt_fail(c, kind, exc, "'%s' has no attribute %s", otr, nb.p);
}

/* ---------------------------------------------------------------------------------------- */
/* lists and dicts                                                                           */

/* gen_name of groupby's (grouper, list) tuples: Jinja2's _GroupTuple, whose attributes
 * grouper and list attribute access knows. */
const char tpl_group_tuple[] = "_GroupTuple";

tlist *tl_new(rctx *c, int kind, size_t cap) {
    tlist *l = tpl_zalloc(&c->ar, sizeof *l);
    if (!l) {
        rt_oom(c);
        return NULL;
    }
    l->kind = (uint8_t)kind;
    if (cap) {
        if (cap > ((size_t)1 << 32)) {
            rt_oom(c);
            return NULL;
        }
        l->v = tpl_alloc(&c->ar, cap * sizeof(tv));
        if (!l->v) {
            rt_oom(c);
            return NULL;
        }
        l->cap = cap;
    }
    return l;
}

int tl_push(rctx *c, tlist *l, tv v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        tv *nv = tpl_realloc(&c->ar, l->v, l->cap * sizeof(tv), nc * sizeof(tv));
        if (!nv) return rt_oom(c);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

tdict *td_new(rctx *c) {
    tdict *d = tpl_zalloc(&c->ar, sizeof *d);
    if (!d) rt_oom(c);
    return d;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static int hash_depth(rctx *c, tv v, uint64_t *h, int depth) {
    if (depth > MAX_VALUE_DEPTH)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, "RecursionError", "value nested too deeply");
    switch (v.type) {
    case TV_NONE:
        *h = 0x9e3779b97f4a7c15ULL;
        return 0;
    case TV_BOOL:
        *h = mix64((uint64_t)v.b);
        return 0;
    case TV_INT:
        *h = mix64((uint64_t)v.i);
        return 0;
    case TV_FLOAT:
        if (v.f == floor(v.f) && fabs(v.f) < 9.2e18) {
            *h = mix64((uint64_t)(int64_t)v.f);
        } else {
            uint64_t bits;
            double f = v.f;
            memcpy(&bits, &f, sizeof bits);
            *h = mix64(bits ^ 0x5555);
        }
        return 0;
    case TV_STR: {
        uint64_t x = 0xcbf29ce484222325ULL;
        for (size_t k = 0; k < v.s->len; k++) x = (x ^ (unsigned char)v.s->s[k]) * 0x100000001b3ULL;
        *h = mix64(x);
        return 0;
    }
    case TV_UNDEF:
        *h = 0x1234567;
        return 0;
    case TV_LIST:
        if (v.l->kind == L_TUPLE) {
            uint64_t x = 0x345678;
            for (size_t k = 0; k < v.l->n; k++) {
                uint64_t e;
                if (hash_depth(c, v.l->v[k], &e, depth + 1)) return -1;
                x = mix64(x ^ e) + k;
            }
            *h = x;
            return 0;
        }
        if (v.l->kind != L_LIST && v.l->kind != L_ITEMS && v.l->kind != L_KEYS &&
            v.l->kind != L_VALUES) {
            *h = mix64((uint64_t)(uintptr_t)v.l);
            return 0;
        }
        break;
    case TV_DICT:
        break;
    case TV_NS:
        break; /* Namespace defines __eq__-less identity? it is a plain object */
    default:
        *h = mix64((uint64_t)(uintptr_t)v.fn);
        return 0;
    }
    if (v.type == TV_NS) {
        *h = mix64((uint64_t)(uintptr_t)v.d);
        return 0;
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError", "unhashable type: '%s'",
                   tv_type_name(v));
}

int tv_hash(rctx *c, tv v, uint64_t *h) {
    return hash_depth(c, v, h, 0);
}

static void idx_insert(tdict *d, size_t ei) {
    size_t mask = d->icap - 1, p = d->e[ei].h & mask;
    while (d->idx[p]) p = (p + 1) & mask;
    d->idx[p] = (uint32_t)(ei + 1);
}

static int idx_rebuild(rctx *c, tdict *d, size_t want) {
    size_t ic = 16;
    while (ic < want * 2) ic *= 2;
    uint32_t *idx = tpl_zalloc(&c->ar, ic * sizeof *idx);
    if (!idx) return rt_oom(c);
    d->idx = idx;
    d->icap = ic;
    for (size_t k = 0; k < d->n; k++) idx_insert(d, k);
    return 0;
}

static long td_find(const tdict *d, tv k, uint64_t h) {
    if (!d->idx) {
        for (size_t i = 0; i < d->n; i++)
            if (d->e[i].h == h && tv_eq(d->e[i].k, k)) return (long)i;
        return -1;
    }
    size_t mask = d->icap - 1, p = h & mask;
    while (d->idx[p]) {
        size_t i = d->idx[p] - 1;
        if (d->e[i].h == h && tv_eq(d->e[i].k, k)) return (long)i;
        p = (p + 1) & mask;
    }
    return -1;
}

int td_set(rctx *c, tdict *d, tv k, tv v) {
    uint64_t h;
    if (tv_hash(c, k, &h)) return -1;
    long i = td_find(d, k, h);
    if (i >= 0) {
        d->e[i].v = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        if (nc > UINT32_MAX / 2) return rt_oom(c);
        tentry *ne = tpl_realloc(&c->ar, d->e, d->cap * sizeof(tentry), nc * sizeof(tentry));
        if (!ne) return rt_oom(c);
        d->e = ne;
        d->cap = nc;
    }
    d->e[d->n].k = k;
    d->e[d->n].v = v;
    d->e[d->n].h = h;
    d->n++;
    if (d->n > 8) {
        if (!d->idx || d->n * 2 > d->icap) {
            if (idx_rebuild(c, d, d->n)) return -1;
        } else {
            idx_insert(d, d->n - 1);
        }
    }
    return 0;
}

int td_get(rctx *c, const tdict *d, tv k, tv **out) {
    uint64_t h;
    *out = NULL;
    if (tv_hash(c, k, &h)) return -1;
    long i = td_find(d, k, h);
    if (i >= 0) *out = &d->e[i].v;
    return 0;
}

tv *td_get_str(const tdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++) {
        tv key = d->e[i].k;
        if (key.type == TV_STR && key.s->len == n && memcmp(key.s->s, k, n) == 0) return &d->e[i].v;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* truth, equality, ordering                                                                 */

bool tv_truthy(tv v) {
    switch (v.type) {
    case TV_UNDEF:
    case TV_NONE:
        return false;
    case TV_BOOL:
        return v.b;
    case TV_INT:
        return v.i != 0;
    case TV_FLOAT:
        return v.f != 0.0;
    case TV_STR:
        return v.s->len != 0;
    case TV_LIST:
        if (v.l->kind == L_GEN) return true;
        return v.l->n != 0;
    case TV_DICT:
        return v.d->n != 0;
    default:
        return true;
    }
}

static double num_as_double(tv v) {
    return v.type == TV_FLOAT ? v.f : v.type == TV_BOOL ? (double)v.b : (double)v.i;
}

/* Exact Python comparison of two numbers: -1, 0, 1; 2 when unordered (NaN). */
static int num_cmp(tv a, tv b) {
    if (a.type != TV_FLOAT && b.type != TV_FLOAT) {
        int64_t x = a.type == TV_BOOL ? a.b : a.i, y = b.type == TV_BOOL ? b.b : b.i;
        return x < y ? -1 : x > y;
    }
    double x = num_as_double(a), y = num_as_double(b);
    if (isnan(x) || isnan(y)) return 2;
    if (a.type != TV_FLOAT && fabs(y) < 9.0e15) { /* int vs float: exact when y is small */
        int64_t xi = a.type == TV_BOOL ? a.b : a.i;
        if (xi > (int64_t)9.0e15 || xi < -(int64_t)9.0e15) return xi < 0 ? -1 : 1;
    }
    if (b.type != TV_FLOAT && fabs(x) < 9.0e15) {
        int64_t yi = b.type == TV_BOOL ? b.b : b.i;
        if (yi > (int64_t)9.0e15 || yi < -(int64_t)9.0e15) return yi < 0 ? 1 : -1;
    }
    return x < y ? -1 : x > y;
}

static bool eq_depth(tv a, tv b, int depth) {
    if (depth > MAX_VALUE_DEPTH) return false;
    if (tv_is_num(a) && tv_is_num(b)) return num_cmp(a, b) == 0;
    if (a.type != b.type) return false;
    switch (a.type) {
    case TV_UNDEF:
    case TV_NONE:
        return true;
    case TV_STR:
        return a.s->len == b.s->len && memcmp(a.s->s, b.s->s, a.s->len) == 0;
    case TV_LIST: {
        int ka = a.l->kind, kb = b.l->kind;
        if (a.l == b.l) return true;
        bool seq_a =
            ka == L_LIST || ka == L_TUPLE || ka == L_RANGE || ka == L_ITEMS || ka == L_KEYS;
        if (!seq_a || ka != kb) return false;
        if (a.l->n != b.l->n) return false;
        if (ka == L_ITEMS || ka == L_KEYS) { /* set-like views: order does not matter */
            for (size_t i = 0; i < a.l->n; i++) {
                bool found = false;
                for (size_t j = 0; j < b.l->n && !found; j++)
                    found = eq_depth(a.l->v[i], b.l->v[j], depth + 1);
                if (!found) return false;
            }
            return true;
        }
        for (size_t i = 0; i < a.l->n; i++)
            if (!eq_depth(a.l->v[i], b.l->v[i], depth + 1)) return false;
        return true;
    }
    case TV_DICT: {
        if (a.d == b.d) return true;
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            long j = td_find(b.d, a.d->e[i].k, a.d->e[i].h);
            if (j < 0 || !eq_depth(a.d->e[i].v, b.d->e[j].v, depth + 1)) return false;
        }
        return true;
    }
    case TV_NS:
        return a.d == b.d;
    case TV_LOOP:
        return a.lp == b.lp;
    case TV_FUNC:
        if (a.fn == b.fn) return true;
        if (a.fn->kind != b.fn->kind || a.fn->id != b.fn->id || a.fn->node != b.fn->node)
            return false;
        if (a.fn->kind == F_METHOD) return eq_depth(a.fn->self, b.fn->self, depth + 1);
        return a.fn->kind == F_BUILTIN;
    default:
        return false;
    }
}

bool tv_eq(tv a, tv b) {
    return eq_depth(a, b, 0);
}

static int lt_depth(rctx *c, tv a, tv b, bool *out, int depth) {
    if (depth > MAX_VALUE_DEPTH)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, "RecursionError", "value nested too deeply");
    if (tv_is_num(a) && tv_is_num(b)) {
        *out = num_cmp(a, b) == -1;
        return 0;
    }
    if (a.type == TV_UNDEF || b.type == TV_UNDEF)
        return tv_undef_fail(c, a.type == TV_UNDEF ? a : b);
    if (a.type == TV_STR && b.type == TV_STR) {
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int r = memcmp(a.s->s, b.s->s, n); /* UTF-8 byte order = code point order */
        *out = r < 0 || (r == 0 && a.s->len < b.s->len);
        return 0;
    }
    if (a.type == TV_LIST && b.type == TV_LIST && a.l->kind == b.l->kind &&
        (a.l->kind == L_LIST || a.l->kind == L_TUPLE)) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++) {
            if (eq_depth(a.l->v[i], b.l->v[i], depth + 1)) continue;
            return lt_depth(c, a.l->v[i], b.l->v[i], out, depth + 1);
        }
        *out = a.l->n < b.l->n;
        return 0;
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError",
                   "'<' not supported between instances of '%s' and '%s'", tv_type_name(a),
                   tv_type_name(b));
}

int tv_lt(rctx *c, tv a, tv b, bool *out) {
    return lt_depth(c, a, b, out, 0);
}

int tv_le(rctx *c, tv a, tv b, bool *out) {
    if (tv_is_num(a) && tv_is_num(b)) {
        int r = num_cmp(a, b);
        *out = r == -1 || r == 0;
        return 0;
    }
    if (tv_lt(c, a, b, out)) return -1;
    if (!*out) *out = tv_eq(a, b);
    return 0;
}

bool tv_hashable(tv v) {
    if (v.type == TV_DICT) return false;
    if (v.type == TV_LIST) {
        if (v.l->kind == L_TUPLE) {
            for (size_t k = 0; k < v.l->n; k++)
                if (!tv_hashable(v.l->v[k])) return false;
            return true;
        }
        return v.l->kind == L_GEN || v.l->kind == L_RANGE;
    }
    return true;
}

/* ---------------------------------------------------------------------------------------- */
/* str() and repr()                                                                          */

static int repr_str(rctx *c, const tstr *s, sbuf *b) {
    bool has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (sb_putc(c, b, q)) return -1;
    size_t i = 0, run = 0;
    while (i < s->len) {
        size_t adv;
        uint32_t cp = tpl_utf8_dec(s->s + i, s->len - i, &adv);
        char esc[16];
        const char *e = NULL;
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\', esc[1] = (char)cp, esc[2] = 0, e = esc;
        } else if (cp == '\t') {
            e = "\\t";
        } else if (cp == '\n') {
            e = "\\n";
        } else if (cp == '\r') {
            e = "\\r";
        } else if (cp < 0x20 || cp == 0x7F) {
            snprintf(esc, sizeof esc, "\\x%02x", cp), e = esc;
        } else if (cp >= 0x80 && !tpl_is_printable(cp)) {
            if (cp <= 0xFF)
                snprintf(esc, sizeof esc, "\\x%02x", cp);
            else if (cp <= 0xFFFF)
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            else
                snprintf(esc, sizeof esc, "\\U%08x", cp);
            e = esc;
        }
        if (e) {
            if (sb_put(c, b, s->s + i - run, run) || sb_puts(c, b, e)) return -1;
            run = 0;
        } else {
            run += adv;
        }
        i += adv;
    }
    if (sb_put(c, b, s->s + i - run, run)) return -1;
    return sb_putc(c, b, q);
}

static int repr_depth(rctx *c, tv v, sbuf *b, bool as_str, int depth);

static int repr_items(rctx *c, const tlist *l, sbuf *b, int depth, size_t from) {
    for (size_t k = from; k < l->n; k++) {
        if (k > from && sb_put(c, b, ", ", 2)) return -1;
        if (repr_depth(c, l->v[k], b, false, depth + 1)) return -1;
    }
    return 0;
}

static int repr_dict(rctx *c, const tdict *d, sbuf *b, int depth) {
    if (sb_putc(c, b, '{')) return -1;
    for (size_t k = 0; k < d->n; k++) {
        if (k && sb_put(c, b, ", ", 2)) return -1;
        if (repr_depth(c, d->e[k].k, b, false, depth + 1) || sb_put(c, b, ": ", 2) ||
            repr_depth(c, d->e[k].v, b, false, depth + 1))
            return -1;
    }
    return sb_putc(c, b, '}');
}

static int repr_depth(rctx *c, tv v, sbuf *b, bool as_str, int depth) {
    if (depth > MAX_VALUE_DEPTH)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, "RecursionError",
                       "maximum recursion depth exceeded while getting the repr of an object");
    char num[48];
    switch (v.type) {
    case TV_UNDEF:
        return as_str ? 0 : sb_puts(c, b, "Undefined");
    case TV_NONE:
        return sb_puts(c, b, "None");
    case TV_BOOL:
        return sb_puts(c, b, v.b ? "True" : "False");
    case TV_INT:
        return sb_printf(c, b, "%lld", (long long)v.i);
    case TV_FLOAT:
        tpl_fmt_float(v.f, num);
        return sb_puts(c, b, num);
    case TV_STR:
        if (as_str) return sb_put(c, b, v.s->s, v.s->len);
        if (v.markup) {
            if (sb_puts(c, b, "Markup(")) return -1;
            if (repr_str(c, v.s, b)) return -1;
            return sb_putc(c, b, ')');
        }
        return repr_str(c, v.s, b);
    case TV_LIST:
        switch (v.l->kind) {
        case L_TUPLE:
            if (sb_putc(c, b, '(') || repr_items(c, v.l, b, depth, 0)) return -1;
            if (v.l->n == 1 && sb_putc(c, b, ',')) return -1;
            return sb_putc(c, b, ')');
        case L_GEN:
            if (v.l->gen_name && v.l->gen_name[0] == '!')
                return sb_printf(c, b, "<%s object at 0x7f0000000000>", v.l->gen_name + 1);
            return sb_printf(c, b, "<generator object %s at 0x7f0000000000>",
                             v.l->gen_name ? v.l->gen_name : "<genexpr>");
        case L_RANGE:
            if (v.l->r_step == 1)
                return sb_printf(c, b, "range(%lld, %lld)", (long long)v.l->r_start,
                                 (long long)v.l->r_stop);
            return sb_printf(c, b, "range(%lld, %lld, %lld)", (long long)v.l->r_start,
                             (long long)v.l->r_stop, (long long)v.l->r_step);
        case L_ITEMS:
        case L_KEYS:
        case L_VALUES:
            if (sb_puts(c, b, tv_type_name(v)) || sb_put(c, b, "([", 2) ||
                repr_items(c, v.l, b, depth, 0))
                return -1;
            return sb_put(c, b, "])", 2);
        default:
            if (sb_putc(c, b, '[') || repr_items(c, v.l, b, depth, 0)) return -1;
            return sb_putc(c, b, ']');
        }
    case TV_DICT:
        return repr_dict(c, v.d, b, depth);
    case TV_NS:
        if (sb_puts(c, b, "<Namespace ") || repr_dict(c, v.d, b, depth)) return -1;
        return sb_putc(c, b, '>');
    case TV_LOOP:
        return sb_printf(c, b, "<LoopContext %zu/%zu>", v.lp->i + 1, v.lp->n);
    case TV_FUNC:
        switch (v.fn->kind) {
        case F_MACRO: {
            const tstr *nm = v.fn->node->macro.name;
            return sb_printf(c, b, "<Macro '%s'>", nm ? nm->s : "caller");
        }
        case F_CALLER:
            return sb_puts(c, b, "<Macro 'caller'>");
        case F_METHOD: {
            char otr[64];
            snprintf(otr, sizeof otr, "%s", tv_type_name(v.fn->self));
            return sb_printf(c, b, "<built-in method %s of %s object at 0x7f0000000000>",
                             tpl_method_name(v.fn->id), otr);
        }
        default:
            return sb_puts(c, b, "<function at 0x7f0000000000>");
        }
    }
    return 0;
}

int tv_to_sb(rctx *c, tv v, sbuf *b) {
    return repr_depth(c, v, b, true, 0);
}

int tv_repr_sb(rctx *c, tv v, sbuf *b) {
    return repr_depth(c, v, b, false, 0);
}

int tv_to_str(rctx *c, tv v, tv *out) {
    if (v.type == TV_STR) {
        *out = v;
        return 0;
    }
    sbuf b = {0};
    if (tv_to_sb(c, v, &b)) return -1;
    return sb_str(c, &b, out);
}

/* ---------------------------------------------------------------------------------------- */
/* iteration and len()                                                                       */

int tv_iterate(rctx *c, tv v, tlist **out) {
    switch (v.type) {
    case TV_UNDEF: {
        if (v.u && v.u->exc == UX_SECURITY) return tv_undef_fail(c, v);
        *out = tl_new(c, L_LIST, 0);
        return *out ? 0 : -1;
    }
    case TV_STR: {
        tlist *l = tl_new(c, L_LIST, v.s->nchars);
        if (!l) return -1;
        for (size_t i = 0; i < v.s->len;) {
            size_t adv;
            tpl_utf8_dec(v.s->s + i, v.s->len - i, &adv);
            tv ch;
            if (tv_strc(c, v.s->s + i, adv, &ch)) return -1; /* plain str, even from Markup */
            l->v[l->n++] = ch;
            i += adv;
        }
        *out = l;
        return 0;
    }
    case TV_LIST:
        if (v.l->kind == L_GEN) { /* a generator runs once */
            tlist *l = tl_new(c, L_LIST, v.l->n - v.l->pos);
            if (!l) return -1;
            for (size_t k = v.l->pos; k < v.l->n; k++) l->v[l->n++] = v.l->v[k];
            v.l->pos = v.l->n;
            *out = l;
            return 0;
        }
        *out = v.l;
        return 0;
    case TV_DICT: {
        tlist *l = tl_new(c, L_LIST, v.d->n);
        if (!l) return -1;
        for (size_t k = 0; k < v.d->n; k++) l->v[l->n++] = v.d->e[k].k;
        *out = l;
        return 0;
    }
    default:
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError", "'%s' object is not iterable",
                       tv_type_name(v));
    }
}

int tv_len(rctx *c, tv v, int64_t *out) {
    switch (v.type) {
    case TV_UNDEF:
        *out = 0;
        return 0;
    case TV_STR:
        *out = (int64_t)v.s->nchars;
        return 0;
    case TV_LIST:
        if (v.l->kind != L_GEN) {
            *out = (int64_t)v.l->n;
            return 0;
        }
        break;
    case TV_DICT:
        *out = (int64_t)v.d->n;
        return 0;
    default:
        break;
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError", "object of type '%s' has no len()",
                   tv_type_name(v));
}

/* ---------------------------------------------------------------------------------------- */
/* JSON                                                                                      */

static int from_json_depth(rctx *c, const json_t *j, tv *out, int depth) {
    if (depth > MAX_VALUE_DEPTH)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, NULL, "context nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = tv_none();
        return 0;
    case JSON_TRUE:
        *out = tv_bool(true);
        return 0;
    case JSON_FALSE:
        *out = tv_bool(false);
        return 0;
    case JSON_INTEGER:
        *out = tv_int((int64_t)json_integer_value(j));
        return 0;
    case JSON_REAL:
        *out = tv_float(json_real_value(j));
        return 0;
    case JSON_STRING: {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        if (!tpl_utf8_valid(s, n, NULL))
            return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, NULL, "context string is not valid UTF-8");
        return tv_strc(c, s, n, out);
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tlist *l = tl_new(c, L_LIST, n);
        if (!l) return -1;
        for (size_t k = 0; k < n; k++) {
            if (from_json_depth(c, json_array_get(j, k), &l->v[k], depth + 1)) return -1;
            l->n++;
        }
        *out = tv_list(l);
        return 0;
    }
    case JSON_OBJECT: {
        tdict *d = td_new(c);
        if (!d) return -1;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            tv k, v;
            if (tv_strc(c, key, strlen(key), &k)) return -1;
            if (from_json_depth(c, val, &v, depth + 1) || td_set(c, d, k, v)) return -1;
        }
        *out = tv_dict(d);
        return 0;
    }
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, NULL, "unknown JSON type");
}

int tv_from_json(rctx *c, const void *json, tv *out) {
    return from_json_depth(c, (const json_t *)json, out, 0);
}

static int json_str(rctx *c, const char *s, size_t n, sbuf *b) {
    if (sb_putc(c, b, '"')) return -1;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        switch (ch) {
        case '"':
            e = "\\\"";
            break;
        case '\\':
            e = "\\\\";
            break;
        case '\n':
            e = "\\n";
            break;
        case '\r':
            e = "\\r";
            break;
        case '\t':
            e = "\\t";
            break;
        case '\b':
            e = "\\b";
            break;
        case '\f':
            e = "\\f";
            break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                e = esc;
            }
        }
        if (e) {
            if (sb_put(c, b, s + i - run, run) || sb_puts(c, b, e)) return -1;
            run = 0;
        } else {
            run++;
        }
    }
    if (sb_put(c, b, s + n - run, run)) return -1;
    return sb_putc(c, b, '"');
}

static int json_newline(rctx *c, const json_opts *o, sbuf *b, int level) {
    if (sb_putc(c, b, '\n')) return -1;
    for (int k = 0; k < level; k++)
        if (sb_put(c, b, o->indent, o->indent_len)) return -1;
    return 0;
}

static int json_key(rctx *c, tv k, sbuf *b) {
    char num[48];
    switch (k.type) {
    case TV_STR:
        return json_str(c, k.s->s, k.s->len, b);
    case TV_INT:
        snprintf(num, sizeof num, "\"%lld\"", (long long)k.i);
        return sb_puts(c, b, num);
    case TV_BOOL:
        return sb_puts(c, b, k.b ? "\"true\"" : "\"false\"");
    case TV_NONE:
        return sb_puts(c, b, "\"null\"");
    case TV_FLOAT: {
        char f[40];
        if (isnan(k.f))
            strcpy(f, "NaN");
        else if (isinf(k.f))
            strcpy(f, k.f < 0 ? "-Infinity" : "Infinity");
        else
            tpl_fmt_float(k.f, f);
        return sb_printf(c, b, "\"%s\"", f);
    }
    default:
        return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError",
                       "keys must be str, int, float, bool or None, not %s", tv_type_name(k));
    }
}

static int to_json_depth(rctx *c, tv v, const json_opts *o, sbuf *b, int level);

static int json_seq(rctx *c, const tv *items, size_t n, const json_opts *o, sbuf *b, int level) {
    if (n == 0) return sb_put(c, b, "[]", 2);
    if (sb_putc(c, b, '[')) return -1;
    for (size_t k = 0; k < n; k++) {
        if (k && sb_put(c, b, o->item_sep, o->item_sep_len)) return -1;
        if (o->indent && json_newline(c, o, b, level + 1)) return -1;
        if (to_json_depth(c, items[k], o, b, level + 1)) return -1;
    }
    if (o->indent && json_newline(c, o, b, level)) return -1;
    return sb_putc(c, b, ']');
}

static int to_json_depth(rctx *c, tv v, const json_opts *o, sbuf *b, int level) {
    if (level > MAX_VALUE_DEPTH)
        return rt_fail(c, KILN_TEMPLATE_ERR_LIMIT, "RecursionError", "value nested too deeply");
    char num[48];
    switch (v.type) {
    case TV_NONE:
        return sb_put(c, b, "null", 4);
    case TV_BOOL:
        return sb_puts(c, b, v.b ? "true" : "false");
    case TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.i);
        return sb_puts(c, b, num);
    case TV_FLOAT:
        if (isnan(v.f)) return sb_puts(c, b, "NaN");
        if (isinf(v.f)) return sb_puts(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        tpl_fmt_float(v.f, num);
        return sb_puts(c, b, num);
    case TV_STR:
        return json_str(c, v.s->s, v.s->len, b);
    case TV_LIST:
        if (v.l->kind == L_LIST || v.l->kind == L_TUPLE)
            return json_seq(c, v.l->v, v.l->n, o, b, level);
        break;
    case TV_DICT: {
        tdict *d = v.d;
        if (d->n == 0) return sb_put(c, b, "{}", 2);
        size_t *order = tpl_alloc(&c->ar, d->n * sizeof *order);
        if (!order) return rt_oom(c);
        for (size_t k = 0; k < d->n; k++) order[k] = k;
        if (o->sort_keys) { /* sorted(dct.items()): insertion sort, stable, Python '<' */
            for (size_t k = 1; k < d->n; k++) {
                size_t x = order[k], m = k;
                while (m > 0) {
                    bool lt;
                    if (tv_lt(c, d->e[x].k, d->e[order[m - 1]].k, &lt)) return -1;
                    if (!lt) break;
                    order[m] = order[m - 1];
                    m--;
                }
                order[m] = x;
                if (rt_step(c, k)) return -1;
            }
        }
        if (sb_putc(c, b, '{')) return -1;
        for (size_t k = 0; k < d->n; k++) {
            const tentry *e = &d->e[order[k]];
            if (k && sb_put(c, b, o->item_sep, o->item_sep_len)) return -1;
            if (o->indent && json_newline(c, o, b, level + 1)) return -1;
            if (json_key(c, e->k, b) || sb_put(c, b, o->key_sep, o->key_sep_len) ||
                to_json_depth(c, e->v, o, b, level + 1))
                return -1;
        }
        if (o->indent && json_newline(c, o, b, level)) return -1;
        return sb_putc(c, b, '}');
    }
    default:
        break;
    }
    return rt_fail(c, KILN_TEMPLATE_ERR_TYPE, "TypeError",
                   "Object of type %s is not JSON serializable", tv_type_name(v));
}

int tv_to_json(rctx *c, tv v, const json_opts *o, sbuf *b) {
    return to_json_depth(c, v, o, b, 0);
}
