/*
 * spec.c - the draft proposals of a step and the verify transaction (spec.h; DESIGN.md
 * "Speculation and fill share one transaction").
 *
 * Adaptive k. A sequence starts drafting k_max tokens for a client prediction, 2 for the
 * sources that guess (spec_state.c). A verify step that accepts all its drafts grows k by
 * half (up to k_max); one that rejects some shrinks it to
 * max(accepted + 1, k / 2). A step that accepts nothing starts a cooldown of 2^misses - 1
 * decisions (at most 63) without drafting, for the draft sources that guess (n-gram, draft
 * model, random); a client prediction is re-aligned instead, so it never cools down. Random
 * drafts thus cost one verify of one draft every 64 steps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/drafter.h"
#include "engine/engine_internal.h"
#include "engine/grammar_seq.h"
#include "engine/spec.h"
#include "util/error.h"
#include "util/log.h"

#define COOLDOWN_MAX   63
/* the most known tokens a sequence may still have to feed for drafts to join them (a pending
 * token, a short asserted span, or the accepted tokens a recurrent rollback recomputes) */
#define DRAFT_CATCHUP_MAX 64

/* Ask the fill session once per output length; an asserted span joins s->tokens, a verified
 * one is kept as drafts. False: the session failed the sequence. */
static bool ask_fill_session(kiln_engine *e, kiln_seq *s) {
    kiln_seq_spec *sp = s->spec;
    const kiln_req *r = s->req;
    int32_t n_out = (int32_t)s->tokens.n - s->n_prompt;
    bool jump = s->gm && !r->grammar_no_jump;
    if ((!r->fill_session && !jump) || sp->fs_asked_at == n_out) return true;
    sp->fs_asked_at = n_out;
    int32_t room = r->max_tokens - n_out;
    if (room <= 0) return true;
    if (sp->fs_cap < room) {
        int32_t *nb = realloc(sp->fs_span, (size_t)room * sizeof *nb);
        if (!nb) {
            kiln_seq_finish(s, KILN_FINISH_ERROR, KILN_ERR_OUT_OF_MEMORY,
                            "out of memory (fill session span)");
            return false;
        }
        sp->fs_span = nb;
        sp->fs_cap = room;
    }
    kiln_fill_policy pol = KILN_FILL_ASSERT;
    int32_t n = 0;
    if (r->fill_session)
        n = r->fill_session->propose(r->fill_session_user, s->tokens.data + s->n_prompt, n_out,
                                     sp->fs_span, room, &pol);
    if (n <= 0 && jump) { /* the grammar's forced span (jump-forward), asserted */
        pol = KILN_FILL_ASSERT;
        n = kiln_seq_grammar_forced(e, s, sp->fs_span, room);
    }
    if (n <= 0) return true;
    if (n > room) n = room;
    for (int32_t i = 0; i < n; i++)
        if (sp->fs_span[i] < 0 || sp->fs_span[i] >= e->n_vocab) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "fill session: span token %d is %d, outside the vocabulary [0, %d)", i,
                     sp->fs_span[i], e->n_vocab);
            kiln_seq_finish(s, KILN_FINISH_ERROR, KILN_ERR_INVALID_ARGUMENT, msg);
            return false;
        }
    if (pol == KILN_FILL_VERIFY) {
        sp->fs_n = n;
        sp->fs_pos = 0;
        sp->fs_start = n_out;
        return true;
    }
    if (kiln_ivec_append(&s->tokens, sp->fs_span, (size_t)n)) {
        kiln_seq_finish(s, KILN_FINISH_ERROR, KILN_ERR_OUT_OF_MEMORY, "out of memory (fill)");
        return false;
    }
    for (int32_t i = 0; i < n && s->gm; i++) {
        kiln_error gerr;
        /* the recognizer follows s->tokens: push as if each token had just joined */
        size_t full = s->tokens.n;
        s->tokens.n = full - (size_t)(n - 1 - i);
        kiln_status gst = kiln_seq_grammar_push(e, s, sp->fs_span[i], &gerr);
        s->tokens.n = full;
        if (gst) {
            kiln_seq_finish(s, KILN_FINISH_ERROR, gst, gerr.message);
            return false;
        }
    }
    sp->n_fill += n;
    s->n_generated += n;
    atomic_fetch_add(&e->st_fill, n);
    return true;
}

/* Drafts from a verify span of the fill session, while the output follows it. */
static int32_t span_drafts(kiln_seq_spec *sp, const kiln_seq *s, int32_t cap) {
    if (sp->fs_pos >= sp->fs_n) return 0;
    int32_t n_out = (int32_t)s->tokens.n - s->n_prompt;
    /* the span predicts output[fs_start ..]; the output must still agree with it */
    int32_t done = n_out - sp->fs_start;
    if (done < 0 || done > sp->fs_n) {
        sp->fs_n = 0;
        return 0;
    }
    for (int32_t i = 0; i < done; i++)
        if (s->tokens.data[s->n_prompt + sp->fs_start + i] != sp->fs_span[i]) {
            sp->fs_n = 0; /* diverged: the span is spent */
            return 0;
        }
    sp->fs_pos = done;
    int32_t n = sp->fs_n - done < cap ? sp->fs_n - done : cap;
    memcpy(sp->draft, sp->fs_span + done, (size_t)n * sizeof *sp->draft);
    return n;
}

/* The drafts k a sequence at a decision may propose now (0: none). */
static int32_t draft_room(const kiln_engine *e, const kiln_seq *s) {
    const kiln_seq_spec *sp = s->spec;
    int32_t n_out = (int32_t)s->tokens.n - s->n_prompt;
    int32_t k = sp->k_cur;
    /* each accepted draft is one more output token, and one comes from the last row anyway */
    int32_t by_len = s->req->max_tokens - n_out - 1;
    int32_t by_ctx = e->p.n_ctx - (int32_t)s->tokens.n;
    if (k > by_len) k = by_len;
    if (k > by_ctx) k = by_ctx;
    if (k > KILN_MAX_SPEC_K) k = KILN_MAX_SPEC_K;
    return k < 0 ? 0 : k;
}

/* SplitMix64 (Steele et al. 2014), for KILN_SPEC_RANDOM. */
static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kiln_engine_spec_propose(kiln_engine *e) {
    int32_t n_req = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        kiln_seq *s = e->running[i];
        kiln_seq_spec *sp = s->spec;
        if (!sp || s->finish != KILN_FINISH_NONE) continue;
        sp->n_draft = 0;
        int32_t known = (int32_t)s->tokens.n - s->n_computed;
        if (known > DRAFT_CATCHUP_MAX && s->n_computed < s->n_prompt) continue; /* prefilling */
        if (!ask_fill_session(e, s)) continue;
        known = (int32_t)s->tokens.n - s->n_computed;
        if (known > DRAFT_CATCHUP_MAX) continue;
        int32_t k = draft_room(e, s);
        if (k <= 0) continue;
        int32_t n = span_drafts(sp, s, k);
        if (n == 0 && sp->has_pred) n = kiln_pred_align_drafts(&sp->pred, sp->draft, k);
        if (n == 0 && sp->cooldown > 0) {
            sp->cooldown--;
            continue;
        }
        if (n == 0 && sp->source == KILN_SPEC_NGRAM)
            n = kiln_ngram_propose(s->tokens.data, (int32_t)s->tokens.n,
                                   sp->ngram_min ? sp->ngram_min : 1,
                                   sp->ngram_max ? sp->ngram_max : 4, sp->draft, k);
        if (n == 0 && sp->source == KILN_SPEC_RANDOM) {
            for (int32_t d = 0; d < k; d++)
                sp->draft[d] = (int32_t)(splitmix(&sp->rng) % (uint64_t)e->n_vocab);
            n = k;
        }
        if (n == 0 && sp->source == KILN_SPEC_DRAFT && sp->drafter_slot < 0) {
            /* the slot is opened here, on the engine thread that owns the drafter */
            kiln_error oerr = {0};
            if (kiln_drafter_open(e->drafter, &sp->drafter_slot, &oerr) != KILN_OK) {
                kiln_seq_finish(s, KILN_FINISH_ERROR, oerr.status, oerr.message);
                continue;
            }
        }
        if (n == 0 && sp->source == KILN_SPEC_DRAFT) {
            e->draft_reqs[n_req++] = (kiln_draft_req){.slot = sp->drafter_slot,
                                                      .tokens = s->tokens.data,
                                                      .n_tokens = (int32_t)s->tokens.n,
                                                      .k = k,
                                                      .out = sp->draft};
            continue;
        }
        sp->n_draft = n;
    }
    if (n_req == 0) return;
    kiln_error err = {0};
    if (kiln_drafter_propose(e->drafter, e->draft_reqs, n_req, &err) != KILN_OK) {
        /* the drafter failing costs speed, never output: this step verifies no model drafts */
        kiln_log_warn("draft model: %s; this step runs without its drafts", err.message);
        return;
    }
    for (int32_t i = 0, q = 0; i < e->n_running && q < n_req; i++) {
        kiln_seq *s = e->running[i];
        if (s->spec && e->draft_reqs[q].out == s->spec->draft) {
            s->spec->n_draft = e->draft_reqs[q].n_out;
            q++;
        }
    }
}

kiln_status kiln_spec_begin(kiln_engine *e, kiln_seq *s, int32_t n_known, int32_t k,
                            kiln_error *err) {
    kiln_seq_spec *sp = s->spec;
    if (!sp || sp->in_txn || k < 0 || k > KILN_MAX_SPEC_K || n_known < 0)
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "speculation: begin(%d) with %d known tokens is misuse", k, n_known);
    int64_t end = (int64_t)s->n_computed + n_known + k;
    if (end > e->p.n_ctx ||
        end > (int64_t)s->bt.n_blocks * e->p.block_size)
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "speculation: %d drafts after position %lld do not fit (context %d, "
                              "%d blocks reserved)",
                              k, (long long)(s->n_computed + n_known), e->p.n_ctx, s->bt.n_blocks);
    sp->in_txn = true;
    sp->txn_base = s->n_computed;
    sp->txn_k = k;
    sp->ckpt_taken = false;
    if (k > 0 && sp->rec_ckpt && s->rec_state) {
        memcpy(sp->rec_ckpt, s->rec_state, (size_t)e->rec_state_floats * sizeof *sp->rec_ckpt);
        sp->ckpt_taken = true;
    }
    return KILN_OK;
}

kiln_status kiln_spec_resolve(kiln_engine *e, kiln_seq *s, int32_t accepted, int32_t *n_keep,
                              kiln_error *err) {
    kiln_seq_spec *sp = s->spec;
    if (!sp || !sp->in_txn || accepted < 0 || accepted > sp->txn_k)
        return kiln_error_set(err, KILN_ERR_INTERNAL,
                              "speculation: resolve(%d) of %d drafts is misuse", accepted,
                              sp && sp->in_txn ? sp->txn_k : -1);
    sp->in_txn = false;
    int32_t k = sp->txn_k;
    *n_keep = s->n_new - (k - accepted);
    if (k == 0) return KILN_OK;
    sp->verify_steps++;
    sp->drafted += k;
    sp->accepted += accepted;
    atomic_fetch_add(&e->st_verify, 1);
    atomic_fetch_add(&e->st_drafted, k);
    atomic_fetch_add(&e->st_accepted, accepted);
    if (accepted == k) {
        int32_t grow = sp->k_cur / 2 > 1 ? sp->k_cur / 2 : 1;
        sp->k_cur = sp->k_cur + grow < sp->k_max ? sp->k_cur + grow : sp->k_max;
    } else {
        int32_t half = sp->k_cur / 2;
        sp->k_cur = accepted + 1 > half ? accepted + 1 : half;
        if (sp->k_cur < 1) sp->k_cur = 1;
    }
    if (accepted == 0 && !sp->has_pred && sp->fs_n == 0) {
        if (sp->miss_streak < 6) sp->miss_streak++;
        int32_t cd = (1 << sp->miss_streak) - 1;
        sp->cooldown = cd < COOLDOWN_MAX ? cd : COOLDOWN_MAX;
    } else if (accepted > 0) {
        sp->miss_streak = 0;
    }
    if (accepted < k && sp->ckpt_taken) {
        /* the recurrent state went through the rejected drafts: back to begin, and the kept
         * tokens (known + accepted, all in s->tokens) are recomputed next step */
        memcpy(s->rec_state, sp->rec_ckpt, (size_t)e->rec_state_floats * sizeof *sp->rec_ckpt);
        *n_keep = 0;
    }
    return KILN_OK;
}
