/*
 * hf_pipeline.c - running a loaded tokenizer.json pipeline (struct kiln_hf, built by
 * hf_tokenizer.c): encode (added tokens, normalizer, pre-tokenizer, model, post-processor ids),
 * decode one token, free. hf_tokenizer.h documents the hooks (Hugging Face tokenizers:
 * tokenizer/mod.rs Tokenizer::encode / decode).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/hf_internal.h"
#include "util/error.h"

/* ---- encoding ----------------------------------------------------------------------------- */

kiln_status kiln_hf_encode(const struct kiln_hf *h, const char *text, size_t len, bool add_special,
                           bool parse_special, kiln_ivec *out, kiln_error *err) {
    if (!h || !out || (!text && len))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tokenizer: NULL argument");
    size_t n0 = out->n;
    kiln_status st = KILN_OK;
    hf_pieces raw = {0}, normd = {0}, pre = {0}, tmp = {0};
    hf_buf nb = {0};
    hf_model_work mw = {0};
    if (add_special && h->prefix.n && kiln_ivec_append(out, h->prefix.data, h->prefix.n))
        goto nomem;
    if (!hf_added_split(h->added, &h->raw, text ? text : "", len, true, parse_special, &raw))
        goto nomem;
    for (size_t i = 0; i < raw.n; i++) {
        const hf_piece *p = &raw.a[i];
        if (p->id >= 0) {
            if (kiln_ivec_push(out, p->id)) goto nomem;
            continue;
        }
        bool at_start = p->at_start;
        if ((st = hf_normalize(h->norm, raw.text.p + p->off, p->len, &nb, &at_start, err)))
            goto done;
        hf_pieces_clear(&normd);
        if (!hf_added_split(h->added, &h->normd, nb.p ? nb.p : "", nb.n, at_start, parse_special,
                            &normd))
            goto nomem;
        for (size_t k = 0; k < normd.n; k++) {
            const hf_piece *q = &normd.a[k];
            if (q->id >= 0) {
                if (kiln_ivec_push(out, q->id)) goto nomem;
                continue;
            }
            hf_pieces_clear(&pre);
            if (!hf_pieces_add(&pre, normd.text.p + q->off, q->len, -1, q->at_start)) goto nomem;
            if ((st = hf_pretokenize(h->pretok, &pre, &tmp, err))) goto done;
            for (size_t m = 0; m < pre.n; m++) {
                st = hf_model_encode(&h->model, pre.text.p + pre.a[m].off, pre.a[m].len, out, &mw,
                                     err);
                if (st) goto done;
            }
        }
    }
    if (add_special && h->suffix.n && kiln_ivec_append(out, h->suffix.data, h->suffix.n))
        goto nomem;
    goto done;
nomem:
    st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer.json)");
done:
    hf_pieces_free(&raw);
    hf_pieces_free(&normd);
    hf_pieces_free(&pre);
    hf_pieces_free(&tmp);
    hf_buf_free(&nb);
    hf_model_work_free(&mw);
    if (st) out->n = n0;
    return st;
}

/* ---- decoding ----------------------------------------------------------------------------- */

size_t kiln_hf_decode_token(const struct kiln_hf *h, int32_t id, bool skip_special,
                            kiln_hf_dstate *s, char *buf, size_t cap) {
    if (!h || id < 0 || id >= h->n_tokens || h->unused[id]) return 0;
    if (skip_special && h->skip[id]) return 0;
    const char *t = h->dec_text[id] ? h->dec_text[id] : h->v->text[id];
    size_t tn = h->dec_text[id] ? h->dec_len[id] : h->v->text_len[id];
    hf_buf out = {0}, tmp = {0};
    size_t n = 0;
    if (hf_decode_one(h->dec, t, tn, s, &out, &tmp)) {
        n = out.n;
        if (buf && cap) memcpy(buf, out.p, n < cap ? n : cap);
    }
    hf_buf_free(&out);
    hf_buf_free(&tmp);
    return n;
}

/* ---- freeing ------------------------------------------------------------------------------ */

void kiln_hf_free(struct kiln_hf *h) {
    if (!h) return;
    hf_model_free(&h->model);
    hf_normalizer_free(h->norm);
    hf_pretok_free(h->pretok);
    hf_decoder_free(h->dec);
    for (size_t i = 0; i < h->n_added; i++) {
        free(h->added[i].content);
        free(h->added[i].norm);
    }
    free(h->added);
    hf_trie_free(&h->raw);
    hf_trie_free(&h->normd);
    kiln_ivec_free(&h->prefix);
    kiln_ivec_free(&h->suffix);
    free(h->skip);
    free(h->unused);
    if (h->dec_text)
        for (int32_t i = 0; i < h->n_tokens; i++) free(h->dec_text[i]);
    free(h->dec_text);
    free(h->dec_len);
    free(h);
}
