/*
 * hf_pretokenizer.c - tokenizer.json pre-tokenizers with the semantics of Hugging Face
 * tokenizers (pre_tokenizers/ (each one) and NormalizedString::split): Sequence, Split, ByteLevel,
 * Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer,
 * CharDelimiterSplit. Every pre-tokenizer works on each piece separately; empty pieces are
 * dropped, as PreTokenizedString::split does.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/hf_internal.h"
#include "tokenizer/pretokenize.h"
#include "util/error.h"
#include "util/utf8.h"

typedef enum pretok_kind {
    P_SEQUENCE,
    P_SPLIT,
    P_BYTELEVEL,
    P_METASPACE,
    P_DIGITS,
    P_WHITESPACE,
    P_WHITESPACE_SPLIT,
    P_PUNCT,
    P_BERT,
    P_CHAR_DELIM,
} pretok_kind;

typedef enum behavior {
    B_REMOVED,
    B_ISOLATED,
    B_MERGED_PREV,
    B_MERGED_NEXT,
    B_CONTIGUOUS,
} behavior;

enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };

struct hf_pretok {
    pretok_kind kind;
    hf_pretok **seq;
    size_t n_seq;
    hf_pattern pat; /* Split; ByteLevel / Whitespace regex in pat.re */
    behavior beh;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    uint32_t ch;                      /* Metaspace replacement, CharDelimiterSplit delimiter */
    int prepend;                      /* Metaspace */
    bool split;                       /* Metaspace */
    bool individual_digits;           /* Digits */
};

/* GPT-2's pattern, as the ByteLevel pre-tokenizer of HF tokenizers uses it. */
static const char RX_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RX_WHITESPACE[] = "\\w+|[^\\w\\s]+";

void hf_pretok_free(hf_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_seq; i++) hf_pretok_free(p->seq[i]);
    free(p->seq);
    hf_pattern_free(&p->pat);
    free(p);
}

static kiln_status oom(kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer pre-tokenizer)");
}

static kiln_status parse_behavior(const json_t *j, const char *key, const hf_where *w,
                                  behavior *out, kiln_error *err) {
    const char *s = NULL;
    kiln_status st = hf_get_str(j, key, w, &s, NULL, err);
    if (st || !s) return st;
    static const struct {
        const char *name;
        behavior b;
    } names[] = {{"Removed", B_REMOVED},
                 {"Isolated", B_ISOLATED},
                 {"MergedWithPrevious", B_MERGED_PREV},
                 {"MergedWithNext", B_MERGED_NEXT},
                 {"Contiguous", B_CONTIGUOUS}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].b;
            return KILN_OK;
        }
    hf_where wb;
    hf_where_sub(&wb, w, key);
    return kiln_error_set(err, KILN_ERR_FORMAT,
                          "%s: %s '%s' is not one of Removed, Isolated, MergedWithPrevious, "
                          "MergedWithNext, Contiguous",
                          wb.file, wb.path, s);
}

/* A member that must hold exactly one character. */
static kiln_status parse_char(const json_t *j, const char *key, const hf_where *w, bool required,
                              uint32_t *out, kiln_error *err) {
    const char *s = NULL;
    size_t n = 0;
    kiln_status st = hf_get_str(j, key, w, &s, &n, err);
    if (st) return st;
    hf_where wk;
    hf_where_sub(&wk, w, key);
    if (!s) return required ? hf_err_type(err, &wk, "a one-character string") : KILN_OK;
    uint32_t cp;
    if (n == 0 || hf_utf8_next(s, n, 0, &cp) != n)
        return hf_err_type(err, &wk, "a one-character string");
    *out = cp;
    return KILN_OK;
}

static kiln_status parse_at(const json_t *j, const hf_where *w, hf_pretok **out, int depth,
                            kiln_error *err) {
    *out = NULL;
    const char *type = NULL;
    kiln_status st = hf_get_type(j, w, &type, err);
    if (st) return st;
    hf_pretok *p = calloc(1, sizeof *p);
    if (!p) return oom(err);
    hf_where ws;
    if (!strcmp(type, "Sequence")) {
        p->kind = P_SEQUENCE;
        if (depth >= 16) {
            st = hf_err_type(err, w, "a Sequence nested less than 16 deep");
            goto fail;
        }
        hf_where_sub(&ws, w, "pretokenizers");
        json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a)) {
            st = hf_err_type(err, &ws, "an array");
            goto fail;
        }
        p->seq = calloc(json_array_size(a) + 1, sizeof *p->seq);
        if (!p->seq) goto nomem;
        for (size_t i = 0; i < json_array_size(a); i++) {
            hf_where wi;
            hf_where_idx(&wi, &ws, i);
            if ((st = parse_at(json_array_get(a, i), &wi, &p->seq[i], depth + 1, err))) goto fail;
            p->n_seq = i + 1;
        }
    } else if (!strcmp(type, "Split")) {
        p->kind = P_SPLIT;
        hf_where_sub(&ws, w, "pattern");
        if ((st = hf_pattern_parse(json_object_get(j, "pattern"), &ws, &p->pat, err))) goto fail;
        if (!json_object_get(j, "behavior")) {
            hf_where_sub(&ws, w, "behavior");
            st = hf_err_type(err, &ws, "a string");
            goto fail;
        }
        if ((st = parse_behavior(j, "behavior", w, &p->beh, err))) goto fail;
        if ((st = hf_get_bool(j, "invert", w, &p->invert, err))) goto fail;
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = P_BYTELEVEL;
        p->add_prefix_space = true;
        p->use_regex = true;
        if ((st = hf_get_bool(j, "add_prefix_space", w, &p->add_prefix_space, err))) goto fail;
        if ((st = hf_get_bool(j, "use_regex", w, &p->use_regex, err))) goto fail;
        if (p->use_regex &&
            (st = hf_regex_compile(RX_GPT2, sizeof RX_GPT2 - 1, w, &p->pat.re, err)))
            goto fail;
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = P_METASPACE;
        p->ch = 0x2581;
        p->prepend = PREPEND_ALWAYS;
        p->split = true;
        if ((st = parse_char(j, "replacement", w, false, &p->ch, err))) goto fail;
        const char *scheme = NULL;
        if ((st = hf_get_str(j, "prepend_scheme", w, &scheme, NULL, err))) goto fail;
        if (scheme) {
            if (!strcmp(scheme, "first"))
                p->prepend = PREPEND_FIRST;
            else if (!strcmp(scheme, "always"))
                p->prepend = PREPEND_ALWAYS;
            else if (!strcmp(scheme, "never"))
                p->prepend = PREPEND_NEVER;
            else {
                hf_where_sub(&ws, w, "prepend_scheme");
                st = kiln_error_set(err, KILN_ERR_FORMAT,
                                    "%s: %s '%s' is not one of first, always, never", ws.file,
                                    ws.path, scheme);
                goto fail;
            }
        }
        bool aps = true; /* legacy add_prefix_space: false means never */
        json_t *ap = json_object_get(j, "add_prefix_space");
        if ((st = hf_get_bool(j, "add_prefix_space", w, &aps, err))) goto fail;
        if (ap && !aps) {
            if (scheme && p->prepend != PREPEND_NEVER) {
                hf_where_sub(&ws, w, "add_prefix_space");
                st = kiln_error_set(err, KILN_ERR_FORMAT,
                                    "%s: %s = false contradicts prepend_scheme '%s'", ws.file,
                                    ws.path, scheme);
                goto fail;
            }
            p->prepend = PREPEND_NEVER;
        }
        if ((st = hf_get_bool(j, "split", w, &p->split, err))) goto fail;
    } else if (!strcmp(type, "Digits")) {
        p->kind = P_DIGITS;
        if ((st = hf_get_bool(j, "individual_digits", w, &p->individual_digits, err))) goto fail;
    } else if (!strcmp(type, "Whitespace")) {
        p->kind = P_WHITESPACE;
        if ((st = hf_regex_compile(RX_WHITESPACE, sizeof RX_WHITESPACE - 1, w, &p->pat.re, err)))
            goto fail;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->kind = P_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "Punctuation")) {
        p->kind = P_PUNCT;
        p->beh = B_ISOLATED;
        if ((st = parse_behavior(j, "behavior", w, &p->beh, err))) goto fail;
    } else if (!strcmp(type, "BertPreTokenizer")) {
        p->kind = P_BERT;
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        p->kind = P_CHAR_DELIM;
        if ((st = parse_char(j, "delimiter", w, true, &p->ch, err))) goto fail;
    } else {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: %s.type '%s' is not supported (Sequence, Split, ByteLevel, "
                            "Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation, "
                            "BertPreTokenizer, CharDelimiterSplit are)",
                            w->file, w->path, type);
        goto fail;
    }
    *out = p;
    return KILN_OK;
nomem:
    st = oom(err);
fail:
    hf_pretok_free(p);
    return st;
}

kiln_status hf_pretok_parse(const json_t *j, const hf_where *w, hf_pretok **out, kiln_error *err) {
    return parse_at(j, w, out, 0, err);
}

/* ---- splitting ----------------------------------------------------------------------------- */

typedef enum pred_kind { PRED_CHAR, PRED_NUMERIC, PRED_WHITESPACE, PRED_PUNCT } pred_kind;

static bool pred(pred_kind k, uint32_t ch, uint32_t cp) {
    switch (k) {
    case PRED_CHAR:
        return cp == ch;
    case PRED_NUMERIC:
        return hf_is_numeric(cp);
    case PRED_WHITESPACE:
        return hf_is_whitespace(cp);
    default:
        return hf_is_punct(cp);
    }
}

static bool mpush(hf_matches *m, size_t off, size_t len, bool is_match) {
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

/* HF find_matches for a char predicate: every matching character is its own match. */
static bool pred_matches(const char *s, size_t n, pred_kind k, uint32_t ch, hf_matches *m) {
    m->n = 0;
    if (n == 0) return mpush(m, 0, 0, false);
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = hf_utf8_next(s, n, i, &cp);
        if (pred(k, ch, cp)) {
            if (last < i && !mpush(m, last, i - last, false)) return false;
            if (!mpush(m, i, l, true)) return false;
            last = i + l;
        }
        i += l;
    }
    if (last < n && !mpush(m, last, n - last, false)) return false;
    return true;
}

/*
 * NormalizedString::split: turn the matches of s into kept spans per behavior and append
 * the non-empty ones to out. at_start: whether s starts at the input's offset 0.
 */
static bool split_by(const char *s, const hf_matches *m, behavior b, bool invert, bool at_start,
                     hf_pieces *out, hf_matches *spans) {
    spans->n = 0; /* kept spans; is_match reused as "remove" */
    bool prev = false;
    if (b == B_MERGED_NEXT) {
        for (size_t k = m->n; k-- > 0;) {
            hf_match x = m->a[k];
            bool im = x.is_match != invert;
            if (im && !prev && spans->n > 0) {
                hf_match *last = &spans->a[spans->n - 1];
                last->len += last->off - x.off;
                last->off = x.off;
            } else if (!mpush(spans, x.off, x.len, false)) {
                return false;
            }
            prev = im;
        }
        for (size_t i = 0, j = spans->n ? spans->n - 1 : 0; i < j; i++, j--) {
            hf_match t = spans->a[i];
            spans->a[i] = spans->a[j];
            spans->a[j] = t;
        }
    } else {
        for (size_t k = 0; k < m->n; k++) {
            hf_match x = m->a[k];
            bool im = x.is_match != invert;
            switch (b) {
            case B_ISOLATED:
                if (!mpush(spans, x.off, x.len, false)) return false;
                break;
            case B_REMOVED:
                if (!mpush(spans, x.off, x.len, im)) return false;
                break;
            case B_CONTIGUOUS:
                if (im == prev && spans->n > 0) {
                    hf_match *last = &spans->a[spans->n - 1];
                    last->len = x.off + x.len - last->off;
                } else if (!mpush(spans, x.off, x.len, false)) {
                    return false;
                }
                break;
            default: /* B_MERGED_PREV */
                if (im && !prev && spans->n > 0) {
                    hf_match *last = &spans->a[spans->n - 1];
                    last->len = x.off + x.len - last->off;
                } else if (!mpush(spans, x.off, x.len, false)) {
                    return false;
                }
                break;
            }
            prev = im;
        }
    }
    for (size_t i = 0; i < spans->n; i++) {
        const hf_match *x = &spans->a[i];
        if (x->is_match || x->len == 0) continue;
        if (!hf_pieces_add(out, s + x->off, x->len, -1, at_start && x->off == 0)) return false;
    }
    return true;
}

/* Byte-map s into out as one piece (the ByteLevel pre-tokenizer's normalize step). */
static bool add_bytelevel(const char *s, size_t n, bool at_start, hf_pieces *out, hf_buf *tmp) {
    tmp->n = 0;
    if (!hf_buf_reserve(tmp, 2 * n)) return false;
    tmp->n = kiln_bytelevel_encode(s, n, tmp->p);
    return hf_pieces_add(out, tmp->p, tmp->n, -1, at_start);
}

typedef struct scratch {
    hf_matches m, spans;
    hf_buf a, b;
    hf_pieces sub;
} scratch;

static kiln_status one_piece(const hf_pretok *p, const char *s, size_t n, bool at_start,
                             hf_pieces *out, scratch *w, kiln_error *err) {
    kiln_status st;
    switch (p->kind) {
    case P_SPLIT:
        if ((st = hf_pattern_find(&p->pat, s, n, &w->m, err))) return st;
        return split_by(s, &w->m, p->beh, p->invert, at_start, out, &w->spans) ? KILN_OK : oom(err);
    case P_BYTELEVEL: {
        const char *src = s;
        size_t sn = n;
        if (p->add_prefix_space && n > 0 && s[0] != ' ') {
            w->a.n = 0;
            if (!hf_buf_put(&w->a, " ", 1) || !hf_buf_put(&w->a, s, n)) return oom(err);
            src = w->a.p;
            sn = w->a.n;
        }
        if (!p->use_regex) {
            if (sn == 0) return KILN_OK;
            return add_bytelevel(src, sn, at_start, out, &w->b) ? KILN_OK : oom(err);
        }
        if ((st = hf_regex_find(p->pat.re, src, sn, &w->m, err))) return st;
        hf_pieces_clear(&w->sub);
        if (!split_by(src, &w->m, B_ISOLATED, false, at_start, &w->sub, &w->spans)) return oom(err);
        for (size_t i = 0; i < w->sub.n; i++) {
            const hf_piece *q = &w->sub.a[i];
            if (!add_bytelevel(w->sub.text.p + q->off, q->len, q->at_start, out, &w->b))
                return oom(err);
        }
        return KILN_OK;
    }
    case P_METASPACE: {
        char rep[4];
        size_t rl = kiln_utf8_encode(p->ch, rep);
        w->a.n = 0;
        if (!hf_buf_reserve(&w->a, n * 4 + 4)) return oom(err);
        /* after ' ' -> replacement, prepend unless the piece starts with the replacement */
        bool starts = (n >= rl && memcmp(s, rep, rl) == 0) || (n > 0 && s[0] == ' ');
        bool prepend = n > 0 && !starts &&
                       (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && at_start));
        if (prepend && !hf_buf_put(&w->a, rep, rl)) return oom(err);
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') {
                if (!hf_buf_put(&w->a, rep, rl)) return oom(err);
            } else if (!hf_buf_put(&w->a, s + i, 1)) {
                return oom(err);
            }
        }
        if (!p->split) {
            if (w->a.n == 0) return KILN_OK;
            return hf_pieces_add(out, w->a.p, w->a.n, -1, at_start) ? KILN_OK : oom(err);
        }
        if (!pred_matches(w->a.p, w->a.n, PRED_CHAR, p->ch, &w->m)) return oom(err);
        return split_by(w->a.p, &w->m, B_MERGED_NEXT, false, at_start, out, &w->spans) ? KILN_OK
                                                                                       : oom(err);
    }
    case P_DIGITS:
        if (!pred_matches(s, n, PRED_NUMERIC, 0, &w->m)) return oom(err);
        return split_by(s, &w->m, p->individual_digits ? B_ISOLATED : B_CONTIGUOUS, false, at_start,
                        out, &w->spans)
                   ? KILN_OK
                   : oom(err);
    case P_WHITESPACE:
        if ((st = hf_regex_find(p->pat.re, s, n, &w->m, err))) return st;
        return split_by(s, &w->m, B_REMOVED, true, at_start, out, &w->spans) ? KILN_OK : oom(err);
    case P_WHITESPACE_SPLIT:
        if (!pred_matches(s, n, PRED_WHITESPACE, 0, &w->m)) return oom(err);
        return split_by(s, &w->m, B_REMOVED, false, at_start, out, &w->spans) ? KILN_OK : oom(err);
    case P_PUNCT:
        if (!pred_matches(s, n, PRED_PUNCT, 0, &w->m)) return oom(err);
        return split_by(s, &w->m, p->beh, false, at_start, out, &w->spans) ? KILN_OK : oom(err);
    case P_BERT: {
        if (!pred_matches(s, n, PRED_WHITESPACE, 0, &w->m)) return oom(err);
        hf_pieces_clear(&w->sub);
        if (!split_by(s, &w->m, B_REMOVED, false, at_start, &w->sub, &w->spans)) return oom(err);
        for (size_t i = 0; i < w->sub.n; i++) {
            const hf_piece *q = &w->sub.a[i];
            const char *qs = w->sub.text.p + q->off;
            if (!pred_matches(qs, q->len, PRED_PUNCT, 0, &w->m)) return oom(err);
            if (!split_by(qs, &w->m, B_ISOLATED, false, q->at_start, out, &w->spans))
                return oom(err);
        }
        return KILN_OK;
    }
    case P_CHAR_DELIM:
        if (!pred_matches(s, n, PRED_CHAR, p->ch, &w->m)) return oom(err);
        return split_by(s, &w->m, B_REMOVED, false, at_start, out, &w->spans) ? KILN_OK : oom(err);
    default:
        return kiln_error_set(err, KILN_ERR_INTERNAL, "pre-tokenizer: bad kind %d", (int)p->kind);
    }
}

static kiln_status run(const hf_pretok *p, hf_pieces *io, hf_pieces *tmp, scratch *w,
                       kiln_error *err) {
    if (p->kind == P_SEQUENCE) {
        for (size_t i = 0; i < p->n_seq; i++) {
            kiln_status st = run(p->seq[i], io, tmp, w, err);
            if (st) return st;
        }
        return KILN_OK;
    }
    hf_pieces_clear(tmp);
    for (size_t i = 0; i < io->n; i++) {
        const hf_piece *q = &io->a[i];
        kiln_status st = one_piece(p, io->text.p + q->off, q->len, q->at_start, tmp, w, err);
        if (st) return st;
    }
    hf_pieces t = *io;
    *io = *tmp;
    *tmp = t;
    return KILN_OK;
}

kiln_status hf_pretokenize(const hf_pretok *p, hf_pieces *io, hf_pieces *tmp, kiln_error *err) {
    if (!p) return KILN_OK;
    scratch w = {0};
    kiln_status st = run(p, io, tmp, &w, err);
    hf_matches_free(&w.m);
    hf_matches_free(&w.spans);
    hf_buf_free(&w.a);
    hf_buf_free(&w.b);
    hf_pieces_free(&w.sub);
    return st;
}
