/*
 * spec_state.c - a sequence's speculation state: made at submission from its request and the
 * engine's defaults, freed with the sequence (spec.h).
 */
#include <stdlib.h>

#include "engine/drafter.h"
#include "engine/engine_internal.h"
#include "engine/spec.h"
#include "util/error.h"

#define DEFAULT_SPEC_K    8  /* most drafts per step of n-gram, draft-model and random drafts */
#define PREDICTION_SPEC_K 32 /* ... of a client prediction (or verify fill, fill session) */
#define GUESS_START_K     2  /* the k a guessing source starts at */

static kiln_spec_source resolved_source(const kiln_engine *e, const kiln_req *r) {
    kiln_spec_source src = r->spec != KILN_SPEC_DEFAULT ? r->spec : e->p.spec;
    return src == KILN_SPEC_DEFAULT ? KILN_SPEC_OFF : src;
}

kiln_status kiln_seq_spec_create(kiln_engine *e, kiln_seq *s, kiln_error *err) {
    kiln_req *r = s->req;
    kiln_spec_source src = resolved_source(e, r);
    if (src == KILN_SPEC_DRAFT && !e->drafter)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "spec: KILN_SPEC_DRAFT needs an engine created with a draft_model");
    if (r->prediction.n > 0 && (int64_t)r->prompt.n + (int64_t)r->prediction.n > e->p.n_ctx)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "prediction: %zu tokens after a prompt of %zu exceed the context "
                              "of %d positions; shorten the prediction",
                              r->prediction.n, r->prompt.n, e->p.n_ctx);
    bool jump = r->grammar && !r->grammar_no_jump; /* grammar jump-forward: asserted spans */
    if (src == KILN_SPEC_OFF && r->prediction.n == 0 && r->fill.n == 0 && !r->fill_session &&
        !jump)
        return KILN_OK;
    kiln_seq_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (speculation)");
    sp->source = src;
    sp->accept = r->spec_accept;
    /* A client's prediction is usually right for long runs, and a verify step of M tokens
     * costs far less than M decode steps, so it drafts widely from the start; the sources
     * that guess start narrow and widen while they are accepted (adaptive k, spec.c). */
    bool predicted = r->prediction.n > 0 || r->fill_session;
    int32_t k_default = predicted ? PREDICTION_SPEC_K : DEFAULT_SPEC_K;
    sp->k_max = r->spec_k ? r->spec_k : e->p.spec_k ? e->p.spec_k : k_default;
    sp->k_cur = predicted || sp->k_max < GUESS_START_K ? sp->k_max : GUESS_START_K;
    sp->ngram_min = e->p.spec_ngram_min;
    sp->ngram_max = e->p.spec_ngram_max;
    sp->has_pred = r->prediction.n > 0;
    kiln_pred_align_init(&sp->pred, r->prediction.data, (int32_t)r->prediction.n);
    sp->fs_asked_at = -1;
    sp->drafter_slot = -1;
    sp->rng = r->sampler.seed ^ 0x9E3779B97F4A7C15ull ^ s->id;
    if (e->rec_state_floats > 0) {
        sp->rec_ckpt = malloc((size_t)e->rec_state_floats * sizeof *sp->rec_ckpt);
        if (!sp->rec_ckpt) {
            free(sp);
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "out of memory (recurrent checkpoint of %lld floats)",
                                  (long long)e->rec_state_floats);
        }
    }
    kiln_status st = KILN_OK;
    if (r->fill.n > 0 && (st = kiln_ivec_append(&s->tokens, r->fill.data, r->fill.n)))
        kiln_error_set(err, st, "out of memory (fill)");
    if (st) {
        free(sp->rec_ckpt);
        free(sp);
        return st;
    }
    sp->n_fill = (int32_t)r->fill.n;
    atomic_fetch_add(&e->st_fill, (long long)r->fill.n);
    s->n_generated = (int32_t)r->fill.n;
    s->spec = sp;
    return KILN_OK;
}

void kiln_seq_spec_destroy(kiln_engine *e, kiln_seq *s) {
    kiln_seq_spec *sp = s->spec;
    if (!sp) return;
    if (sp->drafter_slot >= 0 && e->drafter) kiln_drafter_close(e->drafter, sp->drafter_slot);
    free(sp->rec_ckpt);
    free(sp->fs_span);
    free(sp);
    s->spec = NULL;
}

