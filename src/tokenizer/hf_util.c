/*
 * hf_util.c - strings, piece lists, Unicode predicates, JSON field access and patterns for the
 * tokenizer.json pipeline. Pattern semantics follow Hugging Face tokenizers'
 * Pattern::find_matches (tokenizer/pattern.rs) with Oniguruma's find_iter.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/hf_internal.h"
#include "util/error.h"
#include "util/utf8.h"

/* ---- buffers ------------------------------------------------------------------------------- */

bool hf_buf_reserve(hf_buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->n) return false;
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool hf_buf_put(hf_buf *b, const char *s, size_t n) {
    if (!hf_buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

void hf_buf_free(hf_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

bool hf_pieces_add(hf_pieces *l, const char *s, size_t n, int32_t id, bool at_start) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        hf_piece *a = realloc(l->a, cap * sizeof *a);
        if (!a) return false;
        l->a = a;
        l->cap = cap;
    }
    size_t off = l->text.n;
    if (!hf_buf_put(&l->text, s, n)) return false;
    l->a[l->n++] = (hf_piece){off, n, id, at_start};
    return true;
}

void hf_pieces_clear(hf_pieces *l) {
    l->n = 0;
    l->text.n = 0;
}

void hf_pieces_free(hf_pieces *l) {
    hf_buf_free(&l->text);
    free(l->a);
    l->a = NULL;
    l->n = l->cap = 0;
}

/* ---- Unicode ------------------------------------------------------------------------------- */

size_t hf_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp) {
    const char *p = s + i;
    size_t avail = n - i;
    int l = kiln_utf8_decode(p, avail, cp);
    if (l > 0) return (size_t)l;
    /* ill-formed: the lax reading of hf_internal.h */
    unsigned char c = (unsigned char)p[0];
    int len;
    if (avail < 2)
        len = 1;
    else if (c < 0xE0)
        len = 2;
    else if (c < 0xF0 || avail < 4)
        len = avail < 3 ? 1 : 3;
    else
        len = 4;
    *cp = kiln_utf8_bits(p, len);
    return (size_t)len;
}

bool hf_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

bool hf_is_word(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

bool hf_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool hf_is_punct(uint32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return true;
    default:
        return false;
    }
}

/* ---- JSON helpers -------------------------------------------------------------------------- */

/* Append s to dst->path, truncating at its capacity. */
static void path_cat(hf_where *dst, const char *s) {
    size_t n = strlen(dst->path), m = strlen(s), room = sizeof dst->path - 1 - n;
    if (m > room) m = room;
    memcpy(dst->path + n, s, m);
    dst->path[n + m] = '\0';
}

void hf_where_sub(hf_where *dst, const hf_where *w, const char *key) {
    hf_where t;
    t.file = w->file;
    t.path[0] = '\0';
    path_cat(&t, w->path);
    if (w->path[0]) path_cat(&t, ".");
    path_cat(&t, key);
    *dst = t;
}

void hf_where_idx(hf_where *dst, const hf_where *w, size_t i) {
    hf_where t;
    char num[32];
    snprintf(num, sizeof num, "[%zu]", i);
    t.file = w->file;
    t.path[0] = '\0';
    path_cat(&t, w->path);
    path_cat(&t, num);
    *dst = t;
}

static const char *json_kind(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

kiln_status hf_err_type(kiln_error *err, const hf_where *w, const char *want) {
    return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s must be %s", w->file,
                          w->path[0] ? w->path : "the top level", want);
}

static kiln_status err_member(kiln_error *err, const hf_where *w, const char *key, const json_t *v,
                              const char *want) {
    hf_where s;
    hf_where_sub(&s, w, key);
    return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s must be %s, not %s", s.file, s.path, want,
                          json_kind(v));
}

kiln_status hf_get_bool(const json_t *o, const char *key, const hf_where *w, bool *out,
                        kiln_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_boolean(v)) return err_member(err, w, key, v, "a boolean");
    *out = json_is_true(v);
    return KILN_OK;
}

kiln_status hf_get_str(const json_t *o, const char *key, const hf_where *w, const char **s,
                       size_t *n, kiln_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_string(v)) return err_member(err, w, key, v, "a string");
    *s = json_string_value(v);
    if (n) *n = json_string_length(v);
    return KILN_OK;
}

kiln_status hf_get_uint(const json_t *o, const char *key, const hf_where *w, uint64_t max,
                        uint64_t *out, kiln_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max) {
        char want[64];
        snprintf(want, sizeof want, "an integer in [0, %llu]", (unsigned long long)max);
        return err_member(err, w, key, v, want);
    }
    *out = (uint64_t)json_integer_value(v);
    return KILN_OK;
}

kiln_status hf_get_type(const json_t *o, const hf_where *w, const char **type, kiln_error *err) {
    if (!json_is_object(o)) return hf_err_type(err, w, "an object");
    json_t *t = json_object_get(o, "type");
    if (!t)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s has no \"type\"", w->file,
                              w->path[0] ? w->path : "the top level");
    if (!json_is_string(t)) return err_member(err, w, "type", t, "a string");
    *type = json_string_value(t);
    return KILN_OK;
}

char *hf_strndup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* ---- patterns ------------------------------------------------------------------------------ */

kiln_status hf_regex_compile(const char *rx, size_t len, const hf_where *w, pcre2_code **out,
                             kiln_error *err) {
    int ec;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)rx, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                   &ec, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: %s: the regex does not compile (offset %zu): %s", w->file,
                              w->path, (size_t)eoff, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up */
    *out = re;
    return KILN_OK;
}

kiln_status hf_pattern_parse(const json_t *j, const hf_where *w, hf_pattern *p, kiln_error *err) {
    memset(p, 0, sizeof *p);
    if (!json_is_object(j))
        return hf_err_type(err, w, "an object {\"String\": ...} or {\"Regex\": ...}");
    json_t *s = json_object_get(j, "String");
    json_t *r = json_object_get(j, "Regex");
    if ((s && r) || (!s && !r))
        return hf_err_type(err, w, "an object {\"String\": ...} or {\"Regex\": ...}");
    hf_where sub;
    if (s) {
        hf_where_sub(&sub, w, "String");
        if (!json_is_string(s)) return hf_err_type(err, &sub, "a string");
        p->lit_len = json_string_length(s);
        p->lit = hf_strndup(json_string_value(s), p->lit_len);
        if (!p->lit) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        return KILN_OK;
    }
    hf_where_sub(&sub, w, "Regex");
    if (!json_is_string(r)) return hf_err_type(err, &sub, "a string");
    return hf_regex_compile(json_string_value(r), json_string_length(r), &sub, &p->re, err);
}

void hf_pattern_free(hf_pattern *p) {
    if (!p) return;
    free(p->lit);
    pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

void hf_matches_free(hf_matches *m) {
    free(m->a);
    m->a = NULL;
    m->n = m->cap = 0;
}

static bool matches_push(hf_matches *m, size_t off, size_t len, bool is_match) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        hf_match *a = realloc(m->a, cap * sizeof *a);
        if (!a) return false;
        m->a = a;
        m->cap = cap;
    }
    m->a[m->n++] = (hf_match){off, len, is_match};
    return true;
}

kiln_status hf_regex_find(const pcre2_code *re, const char *s, size_t n, hf_matches *out,
                          kiln_error *err) {
    out->n = 0;
    if (n == 0) {
        if (!matches_push(out, 0, 0, false)) goto oom;
        return KILN_OK;
    }
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) goto oom;
    size_t prev = 0, start = 0;
    bool have_last = false;
    size_t last_end = 0;
    while (start <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                             NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            pcre2_match_data_free(md);
            return kiln_error_set(err, KILN_ERR_INTERNAL, "tokenizer regex match failed: %s",
                                  (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || ms < start || me > n) { /* \K tricks: treat as no further matches */
            break;
        }
        if (ms == me && have_last && last_end == me) {
            /* Oniguruma/Rust: no empty match right after the previous match */
            if (start >= n) break;
            uint32_t cp;
            start += hf_utf8_next(s, n, start, &cp);
            continue;
        }
        if (prev != ms && !matches_push(out, prev, ms - prev, false)) goto oom_md;
        if (!matches_push(out, ms, me - ms, true)) goto oom_md;
        prev = me;
        have_last = true;
        last_end = me;
        if (me == ms) {
            if (me >= n) break;
            uint32_t cp;
            start = me + hf_utf8_next(s, n, me, &cp);
        } else {
            start = me;
        }
    }
    pcre2_match_data_free(md);
    if (prev != n && !matches_push(out, prev, n - prev, false)) goto oom;
    return KILN_OK;
oom_md:
    pcre2_match_data_free(md);
oom:
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer regex)");
}

kiln_status hf_pattern_find(const hf_pattern *p, const char *s, size_t n, hf_matches *out,
                            kiln_error *err) {
    if (p->re) return hf_regex_find(p->re, s, n, out, err);
    out->n = 0;
    if (n == 0 || p->lit_len == 0) {
        if (!matches_push(out, 0, n, false)) goto oom;
        return KILN_OK;
    }
    size_t prev = 0;
    for (size_t i = 0; i + p->lit_len <= n;) {
        const char *m = memmem(s + i, n - i, p->lit, p->lit_len);
        if (!m) break;
        size_t ms = (size_t)(m - s);
        if (ms > prev && !matches_push(out, prev, ms - prev, false)) goto oom;
        if (!matches_push(out, ms, p->lit_len, true)) goto oom;
        prev = i = ms + p->lit_len;
    }
    if (prev != n && !matches_push(out, prev, n - prev, false)) goto oom;
    return KILN_OK;
oom:
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer pattern)");
}
