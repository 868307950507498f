/*
 * grammar_seq.c - structured output on the engine's side (grammar_seq.h).
 *
 * The recognizer (src/grammar) always stands at the end of the sequence's output: every token
 * that joins tokens[n_prompt..] (sampled, accepted draft, asserted fill or jump-forward span)
 * is pushed through it at once. The mask of a step is computed from that state, so in a
 * verify step each draft position is masked with the state after the drafts before it, and a
 * draft the grammar forbids has probability 0: it is never the sample and is rejected.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"
#include "engine/grammar_seq.h"
#include "grammar/grammar.h"
#include "util/error.h"

static size_t piece_of(void *user, int32_t id, char *buf, size_t cap) {
    return kiln_model_token_piece((const kiln_model *)user, id, buf, cap);
}

static kiln_status ensure_trie(kiln_engine *e, kiln_error *err) {
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&e->mu);
    if (!e->trie) {
        int32_t words = (e->n_vocab + 31) / 32;
        kiln_vocab_trie *t = NULL;
        st = kiln_vocab_trie_create(e->n_vocab, piece_of, (void *)e->model, &t, err);
        int32_t *eog = st ? NULL : malloc((size_t)e->n_vocab * sizeof *eog);
        float *row = st ? NULL : malloc((size_t)e->n_vocab * sizeof *row);
        uint32_t *bits = st ? NULL : malloc((size_t)words * sizeof *bits);
        if (!st && (!eog || !row || !bits)) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (grammar masks)");
        }
        if (st) {
            kiln_vocab_trie_destroy(t);
            free(eog);
            free(row);
            free(bits);
        } else {
            int32_t n = 0;
            for (int32_t id = 0; id < e->n_vocab; id++)
                if (kiln_model_is_eog(e->model, id)) eog[n++] = id;
            e->eog_ids = eog;
            e->n_eog = n;
            e->gram_row = row;
            e->gram_bits = bits;
            e->trie = t; /* last: the others are set when it is */
        }
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

kiln_status kiln_seq_grammar_attach(kiln_engine *e, kiln_seq *s, kiln_error *err) {
    const kiln_req *r = s->req;
    if (!r->grammar) return KILN_OK;
    if (!kiln_model_has_tokenizer(e->model))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "grammar: structured output needs a model with a tokenizer");
    kiln_status st = ensure_trie(e, err);
    if (st) return st;
    if ((st = kiln_gmatch_create(r->grammar, &s->gm, err))) return st;
    for (size_t i = (size_t)s->n_prompt; i < s->tokens.n; i++) {
        int32_t len;
        const uint8_t *b = kiln_vocab_trie_bytes(e->trie, s->tokens.data[i], &len);
        if (len == 0 || !kiln_gmatch_advance(s->gm, b, (size_t)len)) {
            kiln_gmatch_destroy(s->gm);
            s->gm = NULL;
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "fill: the asserted content does not match the grammar "
                                  "(output token %zu)",
                                  i - (size_t)s->n_prompt);
        }
    }
    return KILN_OK;
}

void kiln_seq_grammar_detach(kiln_seq *s) {
    if (!s) return;
    kiln_gmatch_destroy(s->gm);
    s->gm = NULL;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

kiln_status kiln_seq_grammar_mask(kiln_engine *e, kiln_seq *s, const float *logits,
                                  const float **out, kiln_error *err) {
    int64_t t0 = now_ns();
    kiln_gmatch *m = s->gm;
    int32_t st = kiln_gmatch_state(m);
    int32_t n = kiln_gmatch_token_mask(m, e->trie, st, e->gram_bits, true);
    if (kiln_gmatch_overflowed(m)) {
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "grammar: the recognizer's state tables outgrew their limits");
    }
    const kiln_req *r = s->req;
    bool accept = kiln_gmatch_accepting(m, st);
    uint32_t *bits = e->gram_bits;
    /* end-of-generation and stop ids: allowed exactly when the output is a whole sentence */
    for (int32_t i = 0; i < e->n_eog && !r->ignore_eos; i++) {
        int32_t id = e->eog_ids[i];
        bool was = bits[id >> 5] >> (id & 31) & 1;
        if (accept && !was) n++;
        if (!accept && was) n--;
        if (accept) bits[id >> 5] |= 1u << (id & 31);
        else bits[id >> 5] &= ~(1u << (id & 31));
    }
    for (int32_t i = 0; i < r->n_stop_ids; i++) {
        int32_t id = r->stop_ids[i];
        bool was = bits[id >> 5] >> (id & 31) & 1;
        if (accept && !was) n++;
        if (!accept && was) n--;
        if (accept) bits[id >> 5] |= 1u << (id & 31);
        else bits[id >> 5] &= ~(1u << (id & 31));
    }
    if (n <= 0) {
        if (accept)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                           "grammar: the output is complete and the grammar allows nothing more, "
                           "but ignore_eos is set");
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                           "grammar: no token of the vocabulary continues the grammar after %zu "
                           "output tokens",
                           s->tokens.n - (size_t)s->n_prompt);
    }
    float *row = e->gram_row;
    for (int32_t id = 0; id < e->n_vocab; id++)
        row[id] = bits[id >> 5] >> (id & 31) & 1 ? logits[id] : -INFINITY;
    atomic_fetch_add(&e->st_mask_ns, now_ns() - t0);
    atomic_fetch_add(&e->st_masks, 1);
    *out = row;
    return KILN_OK;
}

kiln_status kiln_seq_grammar_push(kiln_engine *e, kiln_seq *s, int32_t tok, kiln_error *err) {
    if (!s->gm) return KILN_OK;
    int32_t len;
    const uint8_t *b = kiln_vocab_trie_bytes(e->trie, tok, &len);
    if (len == 0 || !kiln_gmatch_advance(s->gm, b, (size_t)len))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "grammar: output token %zu (id %d) does not match the grammar",
                              s->tokens.n - 1 - (size_t)s->n_prompt, tok);
    return KILN_OK;
}

int32_t kiln_seq_grammar_forced(kiln_engine *e, kiln_seq *s, int32_t *out, int32_t cap) {
    if (!s->gm || s->req->grammar_no_jump || cap <= 0) return 0;
    return kiln_gmatch_forced_tokens(s->gm, e->trie, out, cap);
}

void kiln_engine_grammar_shutdown(kiln_engine *e) {
    kiln_vocab_trie_destroy(e->trie);
    e->trie = NULL;
    free(e->eog_ids);
    free(e->gram_row);
    free(e->gram_bits);
    e->eog_ids = NULL;
    e->gram_row = NULL;
    e->gram_bits = NULL;
}
