/*
 * detok.c - token pieces and the incremental detokenizer. Piece semantics follow llama.cpp's
 * token_to_piece (SPM/WPM: U+2581 -> ' ', byte tokens -> the byte; byte-level BPE: the GPT-2
 * bytes_to_unicode alphabet mapped back to bytes; control/unknown tokens render only when
 * asked) and run.c's decode for llama2.c vocabs ("<0xNN>" -> byte, the leading space of a
 * piece that follows BOS is dropped).
 */
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/utf8.h"

/* ---------------------------------------------------------------- pieces */

static void put(char *buf, size_t cap, size_t *n, const char *s, size_t m) {
    if (*n < cap) {
        size_t k = cap - *n < m ? cap - *n : m;
        memcpy(buf + *n, s, k);
    }
    *n += m;
}

size_t kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t id, bool render_special, char *buf,
                            size_t cap) {
    const kiln_vocab *v = kiln_tokenizer_vocab(t);
    if (!v || id < 0 || id >= v->n_tokens) return 0;
    if (!buf) cap = 0;
    if (t->hf) { /* tokenizer.json decoder, as for a token in the middle of a stream */
        kiln_hf_dstate mid = {.index = 1, .started = true};
        return kiln_hf_decode_token(t->hf, id, !render_special, &mid, buf, cap);
    }
    const char *s = v->text[id];
    uint32_t sl = v->text_len[id];
    int32_t ty = v->token_type[id];
    size_t n = 0;
    if (ty == KILN_TOKEN_CONTROL || ty == KILN_TOKEN_UNKNOWN) {
        if (render_special) put(buf, cap, &n, s, sl);
        return n;
    }
    uint8_t b;
    switch (v->type) {
    case KILN_VOCAB_LLAMA2C:
        /* run.c decode: "<0xNN>" is the raw byte, everything else is the text as stored */
        if (kiln_vocab_byte_piece(s, sl, &b))
            put(buf, cap, &n, (const char *)&b, 1);
        else
            put(buf, cap, &n, s, sl);
        return n;
    case KILN_VOCAB_SPM:
    case KILN_VOCAB_WPM:
        if (ty == KILN_TOKEN_USER_DEFINED) {
            put(buf, cap, &n, s, sl);
        } else if (ty == KILN_TOKEN_NORMAL) {
            for (uint32_t i = 0; i < sl;) {
                if (i + 3 <= sl && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                    put(buf, cap, &n, " ", 1);
                    i += 3;
                } else {
                    put(buf, cap, &n, s + i, 1);
                    i++;
                }
            }
        } else if (ty == KILN_TOKEN_BYTE && kiln_vocab_byte_piece(s, sl, &b)) {
            put(buf, cap, &n, (const char *)&b, 1);
        }
        return n; /* UNUSED / UNDEFINED: nothing, as llama.cpp */
    case KILN_VOCAB_BPE:
        if (ty == KILN_TOKEN_USER_DEFINED) {
            put(buf, cap, &n, s, sl);
        } else if (ty == KILN_TOKEN_NORMAL) {
            for (uint32_t i = 0; i < sl;) {
                uint32_t cp;
                int m = kiln_utf8_decode(s + i, sl - i, &cp);
                if (m <= 0) { /* malformed token text: pass the byte through */
                    put(buf, cap, &n, s + i, 1);
                    i++;
                    continue;
                }
                int by = kiln_bytelevel_byte(cp);
                if (by >= 0) {
                    char c = (char)by;
                    put(buf, cap, &n, &c, 1);
                } else {
                    /* not in the byte alphabet (llama.cpp prints an [UNK_BYTE] marker):
                     * keep the character itself */
                    put(buf, cap, &n, s + i, (size_t)m);
                }
                i += (uint32_t)m;
            }
        }
        return n;
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------- incremental decoding */

struct kiln_detok {
    const kiln_tokenizer *t;
    char pend[8]; /* bytes of an incomplete UTF-8 sequence */
    size_t n_pend;
    char *out; /* text returned by the last call */
    size_t out_n, out_cap;
    char *piece; /* the current token's piece */
    size_t piece_cap;
    char *scratch; /* held bytes + piece */
    size_t scratch_cap;
    bool started;       /* a non-BOS token has been pushed */
    bool render_special; /* control tokens render their text */
    int32_t prev_id;    /* previous id pushed, -1 at the start */
    kiln_hf_dstate hfs; /* tokenizer.json decoder state */
};

kiln_status kiln_detok_create(const kiln_tokenizer *t, kiln_detok **out, kiln_error *err) {
    if (!t || !out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "detok: NULL argument");
    kiln_detok *d = calloc(1, sizeof *d);
    if (!d) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "detok: out of memory");
    d->t = t;
    d->prev_id = -1;
    *out = d;
    return KILN_OK;
}

void kiln_detok_set_render_special(kiln_detok *d, bool on) {
    if (d) d->render_special = on;
}

void kiln_detok_destroy(kiln_detok *d) {
    if (!d) return;
    free(d->out);
    free(d->piece);
    free(d->scratch);
    free(d);
}

static bool out_reserve(kiln_detok *d, size_t extra) {
    size_t need = d->out_n + extra + 1;
    if (need <= d->out_cap) return true;
    size_t cap = d->out_cap ? d->out_cap : 64;
    while (cap < need) cap *= 2;
    char *o = realloc(d->out, cap);
    if (!o) return false;
    d->out = o;
    d->out_cap = cap;
    return true;
}

static const char REPLACEMENT[3] = {'\xEF', '\xBF', '\xBD'};

/* Append bytes, emitting complete UTF-8 and keeping an incomplete tail in d->pend. */
static bool feed(kiln_detok *d, const char *s, size_t n) {
    size_t total = d->n_pend + n;
    if (total == 0) return out_reserve(d, 0);
    /* worst case every byte becomes U+FFFD */
    if (!out_reserve(d, total * 3)) return false;
    if (total > d->scratch_cap) {
        char *sc = realloc(d->scratch, total);
        if (!sc) return false;
        d->scratch = sc;
        d->scratch_cap = total;
    }
    char *buf = d->scratch;
    memcpy(buf, d->pend, d->n_pend);
    if (n) memcpy(buf + d->n_pend, s, n);
    d->n_pend = 0;
    for (size_t i = 0; i < total;) {
        int m = kiln_utf8_seq_len(buf + i, total - i);
        if (m > 0) {
            memcpy(d->out + d->out_n, buf + i, (size_t)m);
            d->out_n += (size_t)m;
            i += (size_t)m;
        } else if (m == 0) { /* provably invalid: one U+FFFD for the byte */
            memcpy(d->out + d->out_n, REPLACEMENT, 3);
            d->out_n += 3;
            i++;
        } else { /* valid but incomplete tail (at most 3 bytes): hold it */
            memcpy(d->pend, buf + i, total - i);
            d->n_pend = total - i;
            break;
        }
    }
    return true;
}

kiln_status kiln_detok_push(kiln_detok *d, int32_t id, const char **text, size_t *len,
                            kiln_error *err) {
    if (!d || !text || !len)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "detok: NULL argument");
    *text = "";
    *len = 0;
    const kiln_vocab *v = kiln_tokenizer_vocab(d->t);
    if (id < 0 || id >= v->n_tokens)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "detok: token id %d is outside the vocabulary (%d tokens)", id,
                              v->n_tokens);
    if (d->t->hf) { /* tokenizer.json: the decoder chain in stream state */
        kiln_hf_dstate s2 = d->hfs;
        size_t n = kiln_hf_decode_token(d->t->hf, id, !d->render_special, &s2, d->piece,
                                        d->piece_cap);
        if (n > d->piece_cap) {
            char *p = realloc(d->piece, n);
            if (!p) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "detok: out of memory");
            d->piece = p;
            d->piece_cap = n;
            s2 = d->hfs;
            n = kiln_hf_decode_token(d->t->hf, id, !d->render_special, &s2, d->piece,
                                     d->piece_cap);
        }
        d->hfs = s2;
        d->out_n = 0;
        if (!feed(d, d->piece, n))
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "detok: out of memory");
        d->out[d->out_n] = '\0';
        *text = d->out;
        *len = d->out_n;
        return KILN_OK;
    }
    size_t n = kiln_tokenizer_piece(d->t, id, d->render_special, d->piece, d->piece_cap);
    if (n > d->piece_cap) {
        char *p = realloc(d->piece, n);
        if (!p) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "detok: out of memory");
        d->piece = p;
        d->piece_cap = n;
        n = kiln_tokenizer_piece(d->t, id, d->render_special, d->piece, d->piece_cap);
    }
    const char *p = d->piece;
    bool strip;
    if (v->type == KILN_VOCAB_LLAMA2C) {
        strip = d->prev_id >= 0 && d->prev_id == v->bos_id; /* run.c decode */
    } else {
        /* llama.cpp detokenize: drop the prefix space of the first piece (after BOS) */
        strip = v->add_space_prefix && !d->started && id != v->bos_id;
    }
    if (strip && n > 0 && p[0] == ' ') p++, n--;
    if (id != v->bos_id) d->started = true;
    d->prev_id = id;
    d->out_n = 0;
    if (!feed(d, p, n)) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "detok: out of memory");
    d->out[d->out_n] = '\0';
    *text = d->out;
    *len = d->out_n;
    return KILN_OK;
}

kiln_status kiln_detok_flush(kiln_detok *d, const char **text, size_t *len, kiln_error *err) {
    if (!d || !text || !len)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "detok: NULL argument");
    d->out_n = 0;
    if (!out_reserve(d, 3))
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "detok: out of memory");
    if (d->n_pend > 0) { /* a truncated sequence is one replacement character */
        memcpy(d->out, REPLACEMENT, 3);
        d->out_n = 3;
        d->n_pend = 0;
    }
    d->out[d->out_n] = '\0';
    *text = d->out;
    *len = d->out_n;
    return KILN_OK;
}
