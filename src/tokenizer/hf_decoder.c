/*
 * hf_decoder.c - tokenizer.json decoders, run one token at a time on bytes (Hugging Face
 * tokenizers decoders/ (each decoder) decode_chain, applied to a stream):
 *
 *   ByteLevel    each token whose characters all belong to the GPT-2 byte alphabet becomes
 *                those bytes; any other token is kept as it is.
 *   Metaspace    the replacement character becomes ' '; in the stream's first token it is
 *                dropped instead, unless prepend_scheme is "never".
 *   Replace      pattern -> content within each token.
 *   ByteFallback a token "<0xNN>" becomes the byte NN (HF groups consecutive byte tokens and
 *                checks UTF-8; here the detokenizer's UTF-8 handling does that).
 *   Fuse         joins the tokens: what follows sees one token starting at the stream start.
 *   Strip        removes up to `start` leading (and `stop` trailing) copies of `content` from
 *                each token; after Fuse only the stream's leading ones (trailing ones would
 *                need the end of the stream and are not removed).
 *   WordPiece    tokens after the first lose the prefix ("##") or get a leading ' '; cleanup
 *                replaces " ." " ?" " !" " ," " ' " " n't" " 'm" " do not" " 's" " 've" " 're".
 *   BPEDecoder   the suffix ("</w>") becomes ' ' (HF makes the last token's suffix "").
 *   (none)       tokens joined by ' '.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/hf_internal.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

typedef enum dec_kind {
    D_BYTELEVEL,
    D_METASPACE,
    D_REPLACE,
    D_BYTEFALLBACK,
    D_FUSE,
    D_STRIP,
    D_WORDPIECE,
    D_BPE,
} dec_kind;

typedef struct dstep {
    dec_kind kind;
    uint32_t ch;    /* Metaspace replacement, Strip content */
    bool never;     /* Metaspace prepend_scheme never */
    hf_pattern pat; /* Replace */
    char *str;      /* Replace content, WordPiece prefix, BPEDecoder suffix */
    size_t str_len;
    uint64_t start, stop; /* Strip */
    bool cleanup;         /* WordPiece */
} dstep;

enum { MAX_STEPS = 32, MAX_FUSED_STRIPS = 4 };

struct hf_decoder {
    dstep *steps;
    size_t n;
    bool none; /* no decoder: join with spaces */
};

void hf_decoder_free(hf_decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n; i++) {
        hf_pattern_free(&d->steps[i].pat);
        free(d->steps[i].str);
    }
    free(d->steps);
    free(d);
}

static kiln_status oom(kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer decoder)");
}

static kiln_status get_char(const json_t *j, const char *key, const hf_where *w, uint32_t def,
                            uint32_t *out, kiln_error *err) {
    const char *s = NULL;
    size_t n = 0;
    *out = def;
    kiln_status st = hf_get_str(j, key, w, &s, &n, err);
    if (st || !s) return st;
    uint32_t cp;
    if (n == 0 || hf_utf8_next(s, n, 0, &cp) != n) {
        hf_where wk;
        hf_where_sub(&wk, w, key);
        return hf_err_type(err, &wk, "a one-character string");
    }
    *out = cp;
    return KILN_OK;
}

static kiln_status add_steps(hf_decoder *d, const json_t *j, const hf_where *w, int depth,
                             kiln_error *err) {
    const char *type = NULL;
    kiln_status st = hf_get_type(j, w, &type, err);
    if (st) return st;
    if (!strcmp(type, "Sequence")) {
        hf_where ws;
        hf_where_sub(&ws, w, "decoders");
        json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a)) return hf_err_type(err, &ws, "an array");
        if (depth > 8) return hf_err_type(err, w, "nested less deeply");
        for (size_t i = 0; i < json_array_size(a); i++) {
            hf_where wi;
            hf_where_idx(&wi, &ws, i);
            if ((st = add_steps(d, json_array_get(a, i), &wi, depth + 1, err))) return st;
        }
        return KILN_OK;
    }
    if (d->n >= MAX_STEPS)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: %s: more than %d decoders", w->file,
                              w->path, MAX_STEPS);
    dstep *s = &d->steps[d->n];
    memset(s, 0, sizeof *s);
    if (!strcmp(type, "ByteLevel")) {
        s->kind = D_BYTELEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        s->kind = D_METASPACE;
        if ((st = get_char(j, "replacement", w, 0x2581, &s->ch, err))) return st;
        const char *scheme = NULL;
        if ((st = hf_get_str(j, "prepend_scheme", w, &scheme, NULL, err))) return st;
        bool aps = true;
        if ((st = hf_get_bool(j, "add_prefix_space", w, &aps, err))) return st;
        s->never = (scheme && !strcmp(scheme, "never")) || !aps;
        if (scheme && strcmp(scheme, "never") && strcmp(scheme, "first") &&
            strcmp(scheme, "always")) {
            hf_where wk;
            hf_where_sub(&wk, w, "prepend_scheme");
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: %s '%s' is not one of first, always, never", wk.file,
                                  wk.path, scheme);
        }
    } else if (!strcmp(type, "Replace")) {
        s->kind = D_REPLACE;
        hf_where wp;
        hf_where_sub(&wp, w, "pattern");
        if ((st = hf_pattern_parse(json_object_get(j, "pattern"), &wp, &s->pat, err))) goto bad;
        const char *c = NULL;
        size_t cl = 0;
        if ((st = hf_get_str(j, "content", w, &c, &cl, err))) goto bad;
        if (!c) {
            hf_where_sub(&wp, w, "content");
            st = hf_err_type(err, &wp, "a string");
            goto bad;
        }
        if (!(s->str = hf_strndup(c, cl))) {
            st = oom(err);
            goto bad;
        }
        s->str_len = cl;
    } else if (!strcmp(type, "ByteFallback")) {
        s->kind = D_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        s->kind = D_FUSE;
    } else if (!strcmp(type, "Strip")) {
        s->kind = D_STRIP;
        if ((st = get_char(j, "content", w, ' ', &s->ch, err))) return st;
        if ((st = hf_get_uint(j, "start", w, UINT32_MAX, &s->start, err))) return st;
        if ((st = hf_get_uint(j, "stop", w, UINT32_MAX, &s->stop, err))) return st;
    } else if (!strcmp(type, "WordPiece")) {
        s->kind = D_WORDPIECE;
        const char *p = "##";
        size_t pl = 2;
        if ((st = hf_get_str(j, "prefix", w, &p, &pl, err))) return st;
        s->cleanup = true;
        if ((st = hf_get_bool(j, "cleanup", w, &s->cleanup, err))) return st;
        if (!(s->str = hf_strndup(p, pl))) return oom(err);
        s->str_len = pl;
    } else if (!strcmp(type, "BPEDecoder")) {
        s->kind = D_BPE;
        const char *p = "</w>";
        size_t pl = 4;
        if ((st = hf_get_str(j, "suffix", w, &p, &pl, err))) return st;
        if (!(s->str = hf_strndup(p, pl))) return oom(err);
        s->str_len = pl;
    } else {
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: %s.type '%s' is not supported (Sequence, ByteLevel, "
                              "Metaspace, Replace, ByteFallback, Fuse, Strip, WordPiece, "
                              "BPEDecoder are)",
                              w->file, w->path, type);
    }
    d->n++;
    return KILN_OK;
bad:
    hf_pattern_free(&s->pat);
    free(s->str);
    s->str = NULL;
    return st;
}

kiln_status hf_decoder_parse(const json_t *j, const hf_where *w, hf_decoder **out,
                             kiln_error *err) {
    *out = NULL;
    hf_decoder *d = calloc(1, sizeof *d);
    if (!d) return oom(err);
    d->steps = calloc(MAX_STEPS, sizeof *d->steps);
    if (!d->steps) {
        free(d);
        return oom(err);
    }
    if (!j || json_is_null(j)) {
        d->none = true;
        *out = d;
        return KILN_OK;
    }
    kiln_status st = add_steps(d, j, w, 0, err);
    if (st == KILN_OK) {
        size_t fused_strips = 0;
        bool fused = false;
        for (size_t i = 0; i < d->n; i++) {
            if (d->steps[i].kind == D_FUSE) fused = true;
            if (fused && d->steps[i].kind == D_STRIP) fused_strips++;
        }
        if (fused_strips > MAX_FUSED_STRIPS)
            st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                "%s: %s: more than %d Strip decoders after Fuse", w->file, w->path,
                                MAX_FUSED_STRIPS);
    }
    if (st) {
        hf_decoder_free(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

/* ---- decoding ------------------------------------------------------------------------------ */

/* "<0xNN>" (tokenizer/vocab.h's reading) */
static bool byte_token(const char *s, size_t n, uint8_t *b) {
    return n == 6 && kiln_vocab_byte_piece(s, (uint32_t)n, b);
}

/*
 * The structure of UTF-8 only: a lead byte C2..F4 followed by its continuation bytes. Looser
 * than kiln_utf8_valid (util/utf8.h), which also applies Table 3-7's second-byte limits (E0
 * A0.., ED ..9F, F0 90.., F4 ..8F). Kept as it is: only raw bytes that an earlier decoder
 * step made (ByteLevel before ByteLevel) can tell the two apart, and there the loose check
 * decides what this decoder has always output.
 */
static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
        if (!l || i + l > n) return false;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += l;
    }
    return true;
}

/* Strip up to `count` leading copies of ch; returns how many were removed. */
static size_t strip_leading(const char *s, size_t n, uint32_t ch, uint64_t count, size_t *off) {
    size_t i = 0, k = 0;
    while (k < count && i < n) {
        uint32_t cp;
        size_t l = hf_utf8_next(s, n, i, &cp);
        if (cp != ch) break;
        i += l;
        k++;
    }
    *off = i;
    return k;
}

static const struct {
    const char *from, *to;
} cleanups[] = {{" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
                {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
                {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

/* out = s with every `from` replaced by `to`, left to right, non-overlapping. */
static bool replace_all(const char *s, size_t n, const char *from, size_t fl, const char *to,
                        size_t tl, hf_buf *out) {
    out->n = 0;
    if (!hf_buf_reserve(out, n)) return false;
    for (size_t i = 0; i < n;) {
        const char *m = fl && i + fl <= n ? memmem(s + i, n - i, from, fl) : NULL;
        if (!m) return hf_buf_put(out, s + i, n - i);
        size_t ms = (size_t)(m - s);
        if (!hf_buf_put(out, s + i, ms - i) || !hf_buf_put(out, to, tl)) return false;
        i = ms + fl;
    }
    return true;
}

bool hf_decode_one(const hf_decoder *d, const char *tok, size_t n, kiln_hf_dstate *st, hf_buf *out,
                   hf_buf *tmp) {
    out->n = 0;
    if (!hf_buf_reserve(out, n + 1)) return false;
    if (d->none) {
        bool ok = (st->index == 0 || hf_buf_put(out, " ", 1)) && hf_buf_put(out, tok, n);
        st->index++;
        return ok;
    }
    if (!st->started) {
        size_t k = 0;
        bool fused = false;
        for (size_t i = 0; i < d->n; i++) {
            if (d->steps[i].kind == D_FUSE) fused = true;
            if (fused && d->steps[i].kind == D_STRIP && k < MAX_FUSED_STRIPS)
                st->fused_left[k++] = (uint32_t)d->steps[i].start;
        }
        st->started = true;
    }
    if (!hf_buf_put(out, tok, n)) return false;
    bool first = st->index == 0, fused = false;
    size_t fk = 0;
    for (size_t i = 0; i < d->n; i++) {
        const dstep *s = &d->steps[i];
        const char *cur = out->p;
        size_t cn = out->n;
        tmp->n = 0;
        switch (s->kind) {
        case D_FUSE:
            fused = true;
            continue;
        case D_BYTELEVEL: {
            /* all characters in the byte alphabet: their bytes; otherwise the token as is */
            bool all = true;
            for (size_t k = 0; k < cn && all;) {
                uint32_t cp;
                size_t l = hf_utf8_next(cur, cn, k, &cp);
                all = kiln_bytelevel_byte(cp) >= 0;
                k += l;
            }
            if (!all || !valid_utf8(cur, cn)) continue;
            if (!hf_buf_reserve(tmp, cn)) return false;
            tmp->n = kiln_bytelevel_decode(cur, cn, tmp->p);
            break;
        }
        case D_METASPACE: {
            /* HF: index 0 of the token list; after Fuse the list is one token */
            bool drop = (first || fused) && !s->never;
            for (size_t k = 0; k < cn;) {
                uint32_t cp;
                size_t l = hf_utf8_next(cur, cn, k, &cp);
                if (cp == s->ch) {
                    if (!drop && !hf_buf_put(tmp, " ", 1)) return false;
                } else if (!hf_buf_put(tmp, cur + k, l)) {
                    return false;
                }
                k += l;
            }
            break;
        }
        case D_REPLACE: {
            hf_matches m = {0};
            if (hf_pattern_find(&s->pat, cur, cn, &m, NULL) != KILN_OK) {
                hf_matches_free(&m);
                return false;
            }
            for (size_t k = 0; k < m.n; k++) {
                bool ok = m.a[k].is_match ? hf_buf_put(tmp, s->str, s->str_len)
                                          : hf_buf_put(tmp, cur + m.a[k].off, m.a[k].len);
                if (!ok) {
                    hf_matches_free(&m);
                    return false;
                }
            }
            hf_matches_free(&m);
            break;
        }
        case D_BYTEFALLBACK: {
            uint8_t b;
            if (!byte_token(cur, cn, &b)) continue;
            out->p[0] = (char)b;
            out->n = 1;
            continue;
        }
        case D_STRIP: {
            size_t off = 0;
            if (fused) {
                if (fk >= MAX_FUSED_STRIPS) {
                    fk++;
                    continue;
                }
                uint32_t *left = &st->fused_left[fk++];
                if (*left == 0) continue;
                size_t k = strip_leading(cur, cn, s->ch, *left, &off);
                /* HF strips leading copies of the fused text only: stop at the first other */
                *left = (off < cn) ? 0 : *left - (uint32_t)k;
                if (!hf_buf_put(tmp, cur + off, cn - off)) return false;
                break;
            }
            strip_leading(cur, cn, s->ch, s->start, &off);
            size_t end = cn;
            for (uint64_t k = 0; k < s->stop && end > off; k++) {
                size_t b = end - 1;
                while (b > off && ((unsigned char)cur[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                hf_utf8_next(cur, end, b, &cp);
                if (cp != s->ch) break;
                end = b;
            }
            if (!hf_buf_put(tmp, cur + off, end - off)) return false;
            break;
        }
        case D_WORDPIECE: {
            if (!first && !fused) {
                if (cn >= s->str_len && memcmp(cur, s->str, s->str_len) == 0) {
                    if (!hf_buf_put(tmp, cur + s->str_len, cn - s->str_len)) return false;
                } else if (!hf_buf_put(tmp, " ", 1) || !hf_buf_put(tmp, cur, cn)) {
                    return false;
                }
            } else if (!hf_buf_put(tmp, cur, cn)) {
                return false;
            }
            if (s->cleanup) {
                hf_buf t2 = {0};
                for (size_t k = 0; k < sizeof cleanups / sizeof cleanups[0]; k++) {
                    if (!replace_all(tmp->p, tmp->n, cleanups[k].from, strlen(cleanups[k].from),
                                     cleanups[k].to, strlen(cleanups[k].to), &t2)) {
                        hf_buf_free(&t2);
                        return false;
                    }
                    hf_buf sw = *tmp;
                    *tmp = t2;
                    t2 = sw;
                }
                hf_buf_free(&t2);
            }
            break;
        }
        case D_BPE:
            if (!replace_all(cur, cn, s->str, s->str_len, " ", 1, tmp)) return false;
            break;
        }
        /* the step wrote its result to tmp: swap it into out */
        hf_buf t = *out;
        *out = *tmp;
        *tmp = t;
    }
    st->index++;
    return true;
}
