/*
 * model_vocab.c - what a model's token ids mean, as far as generation needs: which ids end a
 * generation (kiln_model_is_eog), and whether two models' ids mean the same tokens, so that
 * one can draft for the other (kiln_model_vocab_compatible; speculative decoding with a draft
 * model, DESIGN.md "Speculation and fill share one transaction").
 */
#include <stdio.h>
#include <string.h>

#include "model/model.h"

bool kiln_model_is_eog(const kiln_model *m, int32_t id) {
    if (!m) return false;
    if (m->cfg.source == KILN_SOURCE_LLAMA2C && id == 1) return true; /* run.c stops on BOS */
    if (m->tokenizer) return kiln_tokenizer_is_eog(m->tokenizer, id);
    return id == m->cfg.eos_id;
}

/* text[0..len) for a message, NUL-terminated in dst[cap]: printable ASCII as is, the rest
 * (quotes and backslashes too) as \xNN, cut to fit. */
static void quote_piece(char *dst, size_t cap, const char *text, size_t len) {
    size_t o = 0;
    if (cap == 0) return;
    for (size_t i = 0; i < len && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            dst[o++] = (char)c;
        else
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
    }
    dst[o < cap ? o : cap - 1] = '\0';
}

/* Token texts longer than this compare by their length and first PIECE_CAP bytes. */
#define PIECE_CAP 4096

bool kiln_model_vocab_compatible(const kiln_model *target, const kiln_model *draft, char *reason,
                                 size_t n) {
    char scratch[1];
    if (!reason || n == 0) {
        reason = scratch;
        n = sizeof scratch;
    }
    reason[0] = '\0';
    if (!target || !draft) {
        snprintf(reason, n, "%s model is NULL", !target ? "the target" : "the draft");
        return false;
    }
    const int32_t nv = target->cfg.n_vocab;
    if (draft->cfg.n_vocab != nv) {
        snprintf(reason, n, "vocabulary sizes differ: target %d, draft %d", (int)nv,
                 (int)draft->cfg.n_vocab);
        return false;
    }
    const kiln_tokenizer *tt = target->tokenizer, *dt = draft->tokenizer;
    if (!tt || !dt) return true; /* nothing more to compare: the ids are taken on trust */
    const int32_t tn = kiln_tokenizer_n_vocab(tt), dn = kiln_tokenizer_n_vocab(dt);
    if (tn != dn) {
        snprintf(reason, n, "tokenizer sizes differ: target %d tokens, draft %d", (int)tn, (int)dn);
        return false;
    }
    char a[PIECE_CAP], b[PIECE_CAP];
    for (int32_t id = 0; id < tn; id++) {
        const size_t la = kiln_tokenizer_piece(tt, id, true, a, sizeof a);
        const size_t lb = kiln_tokenizer_piece(dt, id, true, b, sizeof b);
        const size_t ka = la < sizeof a ? la : sizeof a, kb = lb < sizeof b ? lb : sizeof b;
        const bool same = la == lb && memcmp(a, b, ka) == 0;
        if (!same) {
            char qa[96], qb[96];
            quote_piece(qa, sizeof qa, a, ka);
            quote_piece(qb, sizeof qb, b, kb);
            snprintf(reason, n, "token %d differs: target \"%s\", draft \"%s\"", (int)id, qa, qb);
            return false;
        }
    }
    for (int32_t id = 0; id < nv; id++) {
        bool et = kiln_model_is_eog(target, id), ed = kiln_model_is_eog(draft, id);
        if (et != ed) {
            snprintf(reason, n,
                     "end-of-generation ids differ: token %d ends generation for the %s, not "
                     "for the %s",
                     (int)id, et ? "target" : "draft", et ? "draft" : "target");
            return false;
        }
    }
    return true;
}
