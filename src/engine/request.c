/*
 * request.c - validating a kiln_request and copying it into an immutable snapshot
 * (DESIGN.md "One request, end to end", step 1). Everything here runs on the submitting
 * thread; a request that fails validation never reaches the engine.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "grammar/grammar.h"
#include "util/error.h"

kiln_request kiln_request_defaults(void) {
    kiln_request r;
    memset(&r, 0, sizeof r);
    r.add_special = true;
    r.max_tokens = 256;
    r.temperature = 1.0f;
    r.top_p = 1.0f;
    r.repetition_penalty = 1.0f;
    r.xtc_threshold = 0.1f;
    return r;
}

void kiln_req_destroy(kiln_req *r) {
    if (!r) return;
    if (r->fill_session && r->fill_session->release)
        r->fill_session->release(r->fill_session_user);
    kiln_ivec_free(&r->prompt);
    kiln_ivec_free(&r->prediction);
    kiln_ivec_free(&r->fill);
    free(r->bias_ids);
    free(r->bias_values);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop_ids);
    free(r->force_tokens);
    kiln_grammar_destroy(r->grammar);
    free(r);
}

static kiln_sampler_params sampler_from_request(const kiln_request *q) {
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = q->temperature;
    p.top_k = q->top_k;
    p.top_p = q->top_p;
    p.min_p = q->min_p;
    p.xtc_probability = q->xtc_probability;
    p.xtc_threshold = q->xtc_threshold;
    p.seed = q->seed;
    p.repetition_penalty = q->repetition_penalty;
    p.repetition_window = q->repetition_window;
    p.presence_penalty = q->presence_penalty;
    p.presence_window = q->presence_window;
    p.frequency_penalty = q->frequency_penalty;
    p.frequency_window = q->frequency_window;
    p.n_bias = q->n_logit_bias;
    p.bias_ids = q->logit_bias_ids;
    p.bias_values = q->logit_bias_values;
    return p;
}

/* A token span given as ids or as text (field names the request field). */
static kiln_status validate_span(const kiln_model *m, const char *field, const int32_t *ids,
                                 int32_t n_ids, const char *text, kiln_error *err) {
    if (ids) {
        if (n_ids < 0)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n_%s_ids must be >= 0 (got %d)",
                                  field, n_ids);
        for (int32_t i = 0; i < n_ids; i++)
            if (ids[i] < 0 || ids[i] >= m->cfg.n_vocab)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "%s_ids[%d] must be in [0, %d) (got %d)", field, i,
                                      m->cfg.n_vocab, ids[i]);
    } else if (n_ids > 0) {
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s_ids is NULL but n_%s_ids is %d", field, field, n_ids);
    } else if (text && !m->tokenizer) {
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: the model has no tokenizer; give %s_ids instead", field, field);
    }
    return KILN_OK;
}

/* The speculation and fill fields (the engine checks what depends on it: kiln_engine_submit). */
static kiln_status validate_spec(const kiln_model *m, const kiln_request *q, kiln_error *err) {
    if (q->spec < KILN_SPEC_DEFAULT || q->spec > KILN_SPEC_RANDOM)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "spec must be a kiln_spec_source (0..%d, got %d)", KILN_SPEC_RANDOM,
                              (int)q->spec);
    if (q->spec_k < 0 || q->spec_k > KILN_MAX_SPEC_K)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "spec_k must be in [1, %d], or 0 for the engine's (got %d)",
                              KILN_MAX_SPEC_K, q->spec_k);
    if (q->spec_accept != KILN_SPEC_ACCEPT_EXACT && q->spec_accept != KILN_SPEC_ACCEPT_REJECTION)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "spec_accept must be KILN_SPEC_ACCEPT_EXACT or "
                              "KILN_SPEC_ACCEPT_REJECTION (got %d)",
                              (int)q->spec_accept);
    if (q->fill_policy != KILN_FILL_ASSERT && q->fill_policy != KILN_FILL_VERIFY)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "fill_policy must be KILN_FILL_ASSERT or KILN_FILL_VERIFY (got %d)",
                              (int)q->fill_policy);
    kiln_status st = validate_span(m, "prediction", q->prediction_ids, q->n_prediction_ids,
                                   q->prediction, err);
    if (!st) st = validate_span(m, "fill", q->fill_ids, q->n_fill_ids, q->fill, err);
    if (st) return st;
    bool has_fill = q->fill_ids ? q->n_fill_ids > 0 : q->fill != NULL;
    bool has_pred = q->prediction_ids ? q->n_prediction_ids > 0 : q->prediction != NULL;
    if (has_fill && q->fill_policy == KILN_FILL_VERIFY && has_pred)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "fill with policy verify cannot be combined with a prediction "
                              "(both predict the output); give one of them");
    if (has_fill && q->fill_hidden && q->fill_policy != KILN_FILL_ASSERT)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "fill_hidden needs fill_policy KILN_FILL_ASSERT (a hidden span is "
                              "part of the prompt)");
    if (q->fill_session && !q->fill_session->propose)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "fill_session->propose must not be NULL");
    return KILN_OK;
}

/*
 * Tokenize (or copy) a span into out. A text span continues the text before it: with a text
 * prompt, the prompt and the span are tokenized together and the span gets the tokens after
 * the prompt's own (so an SPM vocabulary adds no second leading space and a prediction of the
 * output tokenizes as the output does); when the prompt's tokens are not a prefix of that
 * (a token spans the seam), or the prompt was given as ids, the span is tokenized alone
 * without special tokens.
 */
static kiln_status copy_span(const kiln_model *m, const kiln_request *q, const kiln_ivec *prompt,
                             const char *field, const int32_t *ids, int32_t n_ids,
                             const char *text, size_t len, kiln_ivec *out, kiln_error *err) {
    kiln_status st;
    if (ids) {
        if (n_ids > 0 && (st = kiln_ivec_append(out, ids, (size_t)n_ids)))
            return kiln_error_set(err, st, "out of memory (%s of %d tokens)", field, n_ids);
        return KILN_OK;
    }
    if (!text) return KILN_OK;
    if (!len) len = strlen(text);
    if (!len) return KILN_OK;
    if (!q->prompt_ids) {
        size_t plen = q->prompt_len ? q->prompt_len : strlen(q->prompt);
        char *joined = malloc(plen + len);
        if (!joined) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (%s)", field);
        memcpy(joined, q->prompt, plen);
        memcpy(joined + plen, text, len);
        kiln_ivec all = {0};
        st = kiln_tokenizer_encode(m->tokenizer, joined, plen + len, q->add_special,
                                   q->parse_special, &all, err);
        free(joined);
        bool prefix = !st && all.n > prompt->n &&
                      memcmp(all.data, prompt->data, prompt->n * sizeof *all.data) == 0;
        if (prefix) st = kiln_ivec_append(out, all.data + prompt->n, all.n - prompt->n);
        kiln_ivec_free(&all);
        if (st) {
            char pre[64];
            snprintf(pre, sizeof pre, "%s: ", field);
            kiln_error_prefix(err, pre);
            return st;
        }
        if (prefix) return KILN_OK;
    }
    if ((st = kiln_tokenizer_encode(m->tokenizer, text, len, false, false, out, err))) {
        char pre[64];
        snprintf(pre, sizeof pre, "%s: ", field);
        kiln_error_prefix(err, pre);
    }
    return st;
}

/* Everything that does not need the tokenizer. */
static kiln_status validate(const kiln_model *m, const kiln_request *q, kiln_error *err) {
    int32_t n_vocab = m->cfg.n_vocab;
    if (q->prompt_ids) {
        if (q->n_prompt_ids < 1)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "prompt is empty (n_prompt_ids is %d)", q->n_prompt_ids);
        for (int32_t i = 0; i < q->n_prompt_ids; i++)
            if (q->prompt_ids[i] < 0 || q->prompt_ids[i] >= n_vocab)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "prompt_ids[%d] must be in [0, %d) (got %d)", i, n_vocab,
                                      q->prompt_ids[i]);
    } else if (q->n_prompt_ids > 0) {
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "prompt_ids is NULL but n_prompt_ids is %d", q->n_prompt_ids);
    } else if (!q->prompt || (q->prompt_len == 0 && q->prompt[0] == '\0')) {
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "prompt is empty (give prompt text or prompt_ids)");
    }
    if (q->max_tokens < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "max_tokens must be >= 1 (got %d)",
                              q->max_tokens);
    if (q->n_logit_bias < 0 ||
        (q->n_logit_bias > 0 && (!q->logit_bias_ids || !q->logit_bias_values)))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "logit_bias: n_logit_bias is %d but logit_bias_ids or "
                              "logit_bias_values is NULL (or the count is negative)",
                              q->n_logit_bias);
    kiln_sampler_params sp = sampler_from_request(q);
    kiln_status st = kiln_sampler_validate_vocab(&sp, n_vocab, err);
    if (st) return st;
    if ((st = kiln_sampler_validate_top_logprobs(q->top_logprobs, err))) return st;
    if (q->top_prompt_logprobs < 0 || q->top_prompt_logprobs > KILN_MAX_TOP_LOGPROBS)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "top_prompt_logprobs must be in [0, %d] (got %d)",
                              KILN_MAX_TOP_LOGPROBS, q->top_prompt_logprobs);
    if (q->n_stop < 0 || q->n_stop > KILN_MAX_STOP_STRINGS)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "stop must have at most %d entries (got %d)", KILN_MAX_STOP_STRINGS,
                              q->n_stop);
    if (q->n_stop > 0 && !q->stop)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stop is NULL but n_stop is %d",
                              q->n_stop);
    if ((st = kiln_stop_strings_validate(q->stop, q->n_stop, err))) return st;
    if (q->n_stop > 0 && !m->tokenizer)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "stop: the model has no tokenizer, so stop strings cannot be "
                              "matched; use stop_token_ids");
    if (q->n_stop_token_ids > 0 && !q->stop_token_ids)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "stop_token_ids is NULL but n_stop_token_ids is %d",
                              q->n_stop_token_ids);
    if ((st = kiln_stop_tokens_validate(q->stop_token_ids, q->n_stop_token_ids, n_vocab, err)))
        return st;
    return validate_spec(m, q, err);
}

kiln_status kiln_req_create(const kiln_model *m, const kiln_request *q,
                            const kiln_request_debug *debug, kiln_req **out, kiln_error *err) {
    *out = NULL;
    if (!q) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "request must not be NULL");
    kiln_status st = validate(m, q, err);
    if (st) {
        if (q->fill_session && q->fill_session->release)
            q->fill_session->release(q->fill_session_user);
        return st;
    }
    kiln_req *r = calloc(1, sizeof *r);
    if (!r) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (request)");
    /* the request owns the fill session from here on (released by kiln_req_destroy) */
    r->fill_session = q->fill_session;
    r->fill_session_user = q->fill_session_user;
    if (q->grammar) {
        r->grammar = (kiln_grammar *)q->grammar;
        atomic_fetch_add(&r->grammar->refs, 1);
    }
    r->grammar_no_jump = q->grammar_no_jump_forward;
    if (q->prompt_ids) {
        if ((st = kiln_ivec_append(&r->prompt, q->prompt_ids, (size_t)q->n_prompt_ids))) {
            kiln_error_set(err, st, "out of memory (prompt of %d tokens)", q->n_prompt_ids);
            goto fail;
        }
    } else {
        if (!m->tokenizer) {
            st = kiln_error_set(err, KILN_ERR_NOT_FOUND,
                                "prompt: the model has no tokenizer; give prompt_ids instead");
            goto fail;
        }
        size_t len = q->prompt_len ? q->prompt_len : strlen(q->prompt);
        if ((st = kiln_tokenizer_encode(m->tokenizer, q->prompt, len, q->add_special,
                                        q->parse_special, &r->prompt, err))) {
            kiln_error_prefix(err, "prompt: ");
            goto fail;
        }
        if (r->prompt.n == 0) {
            st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                "prompt is empty (the text encodes to no tokens)");
            goto fail;
        }
        if (r->prompt.n > INT32_MAX / 2) {
            st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "prompt is too long (%zu tokens)",
                                r->prompt.n);
            goto fail;
        }
    }
    r->max_tokens = q->max_tokens;
    r->sampler = sampler_from_request(q);
    if (q->n_logit_bias > 0) {
        size_t n = (size_t)q->n_logit_bias;
        r->bias_ids = malloc(n * sizeof *r->bias_ids);
        r->bias_values = malloc(n * sizeof *r->bias_values);
        if (!r->bias_ids || !r->bias_values) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (logit_bias)");
            goto fail;
        }
        memcpy(r->bias_ids, q->logit_bias_ids, n * sizeof *r->bias_ids);
        memcpy(r->bias_values, q->logit_bias_values, n * sizeof *r->bias_values);
    }
    r->sampler.bias_ids = r->bias_ids;
    r->sampler.bias_values = r->bias_values;
    r->logprobs = q->logprobs || q->top_logprobs > 0;
    r->top_logprobs = q->top_logprobs;
    r->prompt_logprobs = q->prompt_logprobs || q->top_prompt_logprobs > 0;
    r->top_prompt_logprobs = q->top_prompt_logprobs;
    for (int32_t i = 0; i < q->n_stop; i++) {
        r->stop[i] = strdup(q->stop[i]);
        if (!r->stop[i]) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (stop)");
            goto fail;
        }
        r->n_stop = i + 1;
    }
    if (q->n_stop_token_ids > 0) {
        size_t n = (size_t)q->n_stop_token_ids;
        r->stop_ids = malloc(n * sizeof *r->stop_ids);
        if (!r->stop_ids) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (stop_token_ids)");
            goto fail;
        }
        memcpy(r->stop_ids, q->stop_token_ids, n * sizeof *r->stop_ids);
        r->n_stop_ids = q->n_stop_token_ids;
    }
    r->ignore_eos = q->ignore_eos;
    r->render_special = q->render_special;
    r->spec = q->spec;
    r->spec_k = q->spec_k;
    r->spec_accept = q->spec_accept;
    {
        kiln_ivec fill = {0};
        if ((st = copy_span(m, q, &r->prompt, "prediction", q->prediction_ids,
                            q->n_prediction_ids, q->prediction, q->prediction_len,
                            &r->prediction, err)) ||
            (st = copy_span(m, q, &r->prompt, "fill", q->fill_ids, q->n_fill_ids, q->fill,
                            q->fill_len, &fill, err))) {
            kiln_ivec_free(&fill);
            goto fail;
        }
        if (q->fill_policy == KILN_FILL_VERIFY) {
            kiln_ivec_free(&r->prediction);
            r->prediction = fill;
        } else if (q->fill_hidden) {
            st = kiln_ivec_append(&r->prompt, fill.data, fill.n);
            r->n_hidden_fill = (int32_t)fill.n;
            kiln_ivec_free(&fill);
            if (st) {
                kiln_error_set(err, st, "out of memory (fill)");
                goto fail;
            }
        } else {
            r->fill = fill;
        }
        if ((int64_t)r->fill.n > q->max_tokens) {
            st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                "fill: the asserted content is %zu tokens, more than max_tokens "
                                "(%d); raise max_tokens or shorten the fill",
                                r->fill.n, q->max_tokens);
            goto fail;
        }
    }
    if (debug) {
        r->debug = *debug;
        r->debug.force_tokens = NULL;
        r->debug.n_force_tokens = 0;
        if (debug->n_force_tokens > 0 && debug->force_tokens) {
            size_t n = (size_t)debug->n_force_tokens;
            for (size_t i = 0; i < n; i++)
                if (debug->force_tokens[i] < 0 || debug->force_tokens[i] >= m->cfg.n_vocab) {
                    st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                        "debug.force_tokens[%zu] must be in [0, %d) (got %d)", i,
                                        m->cfg.n_vocab, debug->force_tokens[i]);
                    goto fail;
                }
            r->force_tokens = malloc(n * sizeof *r->force_tokens);
            if (!r->force_tokens) {
                st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (force_tokens)");
                goto fail;
            }
            memcpy(r->force_tokens, debug->force_tokens, n * sizeof *r->force_tokens);
            r->debug.force_tokens = r->force_tokens;
            r->debug.n_force_tokens = debug->n_force_tokens;
        }
    }
    *out = r;
    return KILN_OK;
fail:
    kiln_req_destroy(r);
    return st;
}
