/*
 * hf_normalizer.c - tokenizer.json normalizers, with the semantics of Hugging Face tokenizers
 * (normalizers/ (each normalizer)): Sequence, Prepend, Replace, NFC/NFKC/NFD/NFKD (here through
 * utf8proc), Lowercase (Rust char::to_lowercase; utf8proc's simple mapping plus U+0130 ->
 * "i\u0307"), Strip, StripAccents, BertNormalizer and the ByteLevel normalizer.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/hf_internal.h"
#include "tokenizer/pretokenize.h"
#include "util/error.h"
#include "util/utf8.h"

typedef enum norm_kind {
    N_SEQUENCE,
    N_PREPEND,
    N_REPLACE,
    N_NFC,
    N_NFKC,
    N_NFD,
    N_NFKD,
    N_LOWERCASE,
    N_STRIP,
    N_STRIP_ACCENTS,
    N_BERT,
    N_BYTELEVEL,
} norm_kind;

struct hf_normalizer {
    norm_kind kind;
    hf_normalizer **seq;
    size_t n_seq;
    char *str; /* Prepend text, Replace content */
    size_t str_len;
    hf_pattern pat;
    bool left, right;                                   /* Strip */
    bool clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
};

void hf_normalizer_free(hf_normalizer *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_seq; i++) hf_normalizer_free(n->seq[i]);
    free(n->seq);
    free(n->str);
    hf_pattern_free(&n->pat);
    free(n);
}

static kiln_status oom(kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer normalizer)");
}

static kiln_status parse_at(const json_t *j, const hf_where *w, hf_normalizer **out, int depth,
                            kiln_error *err) {
    *out = NULL;
    const char *type = NULL;
    kiln_status st = hf_get_type(j, w, &type, err);
    if (st) return st;
    hf_normalizer *n = calloc(1, sizeof *n);
    if (!n) return oom(err);
    if (!strcmp(type, "Sequence")) {
        n->kind = N_SEQUENCE;
        if (depth >= 16) {
            st = hf_err_type(err, w, "a Sequence nested less than 16 deep");
            goto fail;
        }
        hf_where ws;
        hf_where_sub(&ws, w, "normalizers");
        json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a)) {
            st = hf_err_type(err, &ws, "an array");
            goto fail;
        }
        n->seq = calloc(json_array_size(a) + 1, sizeof *n->seq);
        if (!n->seq) goto nomem;
        for (size_t i = 0; i < json_array_size(a); i++) {
            hf_where wi;
            hf_where_idx(&wi, &ws, i);
            st = parse_at(json_array_get(a, i), &wi, &n->seq[i], depth + 1, err);
            if (st) goto fail;
            n->n_seq = i + 1;
        }
    } else if (!strcmp(type, "Prepend")) {
        n->kind = N_PREPEND;
        const char *s = NULL;
        size_t len = 0;
        if ((st = hf_get_str(j, "prepend", w, &s, &len, err))) goto fail;
        if (!s) {
            hf_where wp;
            hf_where_sub(&wp, w, "prepend");
            st = hf_err_type(err, &wp, "a string");
            goto fail;
        }
        if (!(n->str = hf_strndup(s, len))) goto nomem;
        n->str_len = len;
    } else if (!strcmp(type, "Replace")) {
        n->kind = N_REPLACE;
        hf_where wp;
        hf_where_sub(&wp, w, "pattern");
        if ((st = hf_pattern_parse(json_object_get(j, "pattern"), &wp, &n->pat, err))) goto fail;
        const char *s = NULL;
        size_t len = 0;
        if ((st = hf_get_str(j, "content", w, &s, &len, err))) goto fail;
        if (!s) {
            hf_where_sub(&wp, w, "content");
            st = hf_err_type(err, &wp, "a string");
            goto fail;
        }
        if (!(n->str = hf_strndup(s, len))) goto nomem;
        n->str_len = len;
    } else if (!strcmp(type, "NFC")) {
        n->kind = N_NFC;
    } else if (!strcmp(type, "NFKC")) {
        n->kind = N_NFKC;
    } else if (!strcmp(type, "NFD")) {
        n->kind = N_NFD;
    } else if (!strcmp(type, "NFKD")) {
        n->kind = N_NFKD;
    } else if (!strcmp(type, "Lowercase")) {
        n->kind = N_LOWERCASE;
    } else if (!strcmp(type, "Strip")) {
        n->kind = N_STRIP;
        n->left = n->right = true;
        if ((st = hf_get_bool(j, "strip_left", w, &n->left, err))) goto fail;
        if ((st = hf_get_bool(j, "strip_right", w, &n->right, err))) goto fail;
    } else if (!strcmp(type, "StripAccents")) {
        n->kind = N_STRIP_ACCENTS;
    } else if (!strcmp(type, "BertNormalizer")) {
        n->kind = N_BERT;
        n->clean_text = n->chinese = n->lowercase = true;
        if ((st = hf_get_bool(j, "clean_text", w, &n->clean_text, err))) goto fail;
        if ((st = hf_get_bool(j, "handle_chinese_chars", w, &n->chinese, err))) goto fail;
        if ((st = hf_get_bool(j, "lowercase", w, &n->lowercase, err))) goto fail;
        n->strip_accents = n->lowercase; /* strip_accents: null follows lowercase */
        if ((st = hf_get_bool(j, "strip_accents", w, &n->strip_accents, err))) goto fail;
    } else if (!strcmp(type, "ByteLevel")) {
        n->kind = N_BYTELEVEL;
    } else {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: %s.type '%s' is not supported (Sequence, Prepend, Replace, NFC, "
                            "NFKC, NFD, NFKD, Lowercase, Strip, StripAccents, BertNormalizer, "
                            "ByteLevel are)",
                            w->file, w->path, type);
        goto fail;
    }
    *out = n;
    return KILN_OK;
nomem:
    st = oom(err);
fail:
    hf_normalizer_free(n);
    return st;
}

kiln_status hf_normalizer_parse(const json_t *j, const hf_where *w, hf_normalizer **out,
                                kiln_error *err) {
    return parse_at(j, w, out, 0, err);
}

/* ---- steps --------------------------------------------------------------------------------- */

static bool put_cp(hf_buf *o, uint32_t cp) {
    char t[4];
    return hf_buf_put(o, t, kiln_utf8_encode(cp, t));
}

static kiln_status unicode_form(norm_kind k, const char *s, size_t n, hf_buf *o, kiln_error *err) {
    int opt = UTF8PROC_STABLE;
    switch (k) {
    case N_NFC:
        opt |= UTF8PROC_COMPOSE;
        break;
    case N_NFKC:
        opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
    case N_NFD:
        opt |= UTF8PROC_DECOMPOSE;
        break;
    default:
        opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    if (n == 0) return KILN_OK;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &res,
                                      (utf8proc_option_t)opt);
    if (m < 0) {
        free(res);
        if (m == UTF8PROC_ERROR_NOMEM) return oom(err);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "tokenizer normalizer: utf8proc failed: %s", utf8proc_errmsg(m));
    }
    bool ok = hf_buf_put(o, (const char *)res, (size_t)m);
    free(res);
    return ok ? KILN_OK : oom(err);
}

static bool lowercase(const char *s, size_t n, hf_buf *o) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += hf_utf8_next(s, n, i, &cp);
        if (cp == 0x130) { /* Rust: 'İ' lowercases to "i\u{307}" */
            if (!put_cp(o, 'i') || !put_cp(o, 0x307)) return false;
            continue;
        }
        if (!put_cp(o, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp))) return false;
    }
    return true;
}

static bool is_mark_nonspacing(uint32_t cp) {
    return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_MN;
}

static bool is_combining_mark(uint32_t cp) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

static bool is_chinese(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool is_other(uint32_t c) {
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
        return true;
    default:
        return false;
    }
}

/* One normalizer that is not a Sequence: s[0..n) -> o (o reset by the caller). */
static kiln_status step(const hf_normalizer *z, const char *s, size_t n, hf_buf *o, bool *at_start,
                        hf_buf *tmp, kiln_error *err) {
    switch (z->kind) {
    case N_PREPEND:
        if (n > 0 && !hf_buf_put(o, z->str, z->str_len)) return oom(err);
        return hf_buf_put(o, s, n) ? KILN_OK : oom(err);
    case N_REPLACE: {
        hf_matches m = {0};
        kiln_status st = hf_pattern_find(&z->pat, s, n, &m, err);
        if (st) {
            hf_matches_free(&m);
            return st;
        }
        for (size_t i = 0; i < m.n; i++) {
            const hf_match *x = &m.a[i];
            bool ok =
                x->is_match ? hf_buf_put(o, z->str, z->str_len) : hf_buf_put(o, s + x->off, x->len);
            if (!ok) {
                hf_matches_free(&m);
                return oom(err);
            }
        }
        /* a match at offset 0 replaced by nothing removes the start */
        if (m.n > 0 && m.a[0].is_match && m.a[0].len > 0 && z->str_len == 0) *at_start = false;
        hf_matches_free(&m);
        return KILN_OK;
    }
    case N_NFC:
    case N_NFKC:
    case N_NFD:
    case N_NFKD:
        return unicode_form(z->kind, s, n, o, err);
    case N_LOWERCASE:
        return lowercase(s, n, o) ? KILN_OK : oom(err);
    case N_STRIP: {
        size_t b = 0, e = n;
        if (z->left)
            while (b < e) {
                uint32_t cp;
                size_t l = hf_utf8_next(s, n, b, &cp);
                if (!hf_is_whitespace(cp)) break;
                b += l;
            }
        if (z->right)
            while (e > b) {
                size_t k = e - 1;
                while (k > b && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                uint32_t cp;
                hf_utf8_next(s, n, k, &cp);
                if (!hf_is_whitespace(cp)) break;
                e = k;
            }
        if (b > 0) *at_start = false;
        return hf_buf_put(o, s + b, e - b) ? KILN_OK : oom(err);
    }
    case N_STRIP_ACCENTS:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = hf_utf8_next(s, n, i, &cp);
            if (!is_combining_mark(cp) && !hf_buf_put(o, s + i, l)) return oom(err);
            if (i == 0 && is_combining_mark(cp)) *at_start = false;
            i += l;
        }
        return KILN_OK;
    case N_BYTELEVEL: {
        if (!hf_buf_reserve(o, 2 * n)) return oom(err);
        o->n += kiln_bytelevel_encode(s, n, o->p + o->n);
        o->p[o->n] = '\0';
        return KILN_OK;
    }
    case N_BERT: {
        /* clean_text, chinese chars, strip accents (NFD then drop Mn), lowercase, in order */
        hf_buf a = {0};
        kiln_status st = KILN_OK;
        const char *cur = s;
        size_t cn = n;
        if (z->clean_text) {
            for (size_t i = 0; i < cn;) {
                uint32_t cp;
                size_t l = hf_utf8_next(cur, cn, i, &cp);
                bool ws = cp == '\t' || cp == '\n' || cp == '\r' || hf_is_whitespace(cp);
                bool ctl = !(cp == '\t' || cp == '\n' || cp == '\r') && is_other(cp);
                if (cp == 0 || cp == 0xFFFD || ctl) {
                    if (i == 0) *at_start = false;
                } else if (ws) {
                    if (!hf_buf_put(&a, " ", 1)) goto bert_oom;
                } else if (!hf_buf_put(&a, cur + i, l)) {
                    goto bert_oom;
                }
                i += l;
            }
            cur = a.p ? a.p : "";
            cn = a.n;
        }
        if (z->chinese) {
            tmp->n = 0;
            for (size_t i = 0; i < cn;) {
                uint32_t cp;
                size_t l = hf_utf8_next(cur, cn, i, &cp);
                if (is_chinese(cp)) {
                    if (!hf_buf_put(tmp, " ", 1) || !hf_buf_put(tmp, cur + i, l) ||
                        !hf_buf_put(tmp, " ", 1))
                        goto bert_oom;
                } else if (!hf_buf_put(tmp, cur + i, l)) {
                    goto bert_oom;
                }
                i += l;
            }
            a.n = 0;
            if (!hf_buf_put(&a, tmp->p ? tmp->p : "", tmp->n)) goto bert_oom;
            cur = a.p ? a.p : "";
            cn = a.n;
        }
        if (z->strip_accents) {
            tmp->n = 0;
            if ((st = unicode_form(N_NFD, cur, cn, tmp, err))) goto bert_done;
            a.n = 0;
            for (size_t i = 0; i < tmp->n;) {
                uint32_t cp;
                size_t l = hf_utf8_next(tmp->p, tmp->n, i, &cp);
                if (!is_mark_nonspacing(cp) && !hf_buf_put(&a, tmp->p + i, l)) goto bert_oom;
                i += l;
            }
            cur = a.p ? a.p : "";
            cn = a.n;
        }
        if (z->lowercase) {
            if (!lowercase(cur, cn, o)) goto bert_oom;
        } else if (!hf_buf_put(o, cur, cn)) {
            goto bert_oom;
        }
        goto bert_done;
    bert_oom:
        st = oom(err);
    bert_done:
        hf_buf_free(&a);
        return st;
    }
    default:
        return kiln_error_set(err, KILN_ERR_INTERNAL, "tokenizer normalizer: bad kind %d",
                              (int)z->kind);
    }
}

static kiln_status run(const hf_normalizer *z, const char *s, size_t n, hf_buf *o, bool *at_start,
                       kiln_error *err) {
    o->n = 0;
    if (!hf_buf_reserve(o, n)) return oom(err);
    o->p[0] = '\0';
    hf_buf tmp = {0};
    kiln_status st = KILN_OK;
    if (z->kind != N_SEQUENCE) {
        st = step(z, s, n, o, at_start, &tmp, err);
        hf_buf_free(&tmp);
        return st;
    }
    /* ping-pong between o and a second buffer */
    hf_buf b = {0};
    if (!hf_buf_put(o, s, n)) {
        st = oom(err);
        goto done;
    }
    for (size_t i = 0; i < z->n_seq; i++) {
        st = run(z->seq[i], o->p, o->n, &b, at_start, err);
        if (st) goto done;
        hf_buf t = *o;
        *o = b;
        b = t;
    }
done:
    hf_buf_free(&b);
    hf_buf_free(&tmp);
    return st;
}

kiln_status hf_normalize(const hf_normalizer *nz, const char *s, size_t n, hf_buf *out,
                         bool *at_start, kiln_error *err) {
    if (!nz) {
        out->n = 0;
        return hf_buf_put(out, s, n) ? KILN_OK : oom(err);
    }
    return run(nz, s, n, out, at_start, err);
}
