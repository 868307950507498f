/*
 * request.c - validating a kiln_request and copying it into an immutable snapshot
 * (DESIGN.md "One request, end to end", step 1). Everything here runs on the submitting
 * thread; a request that fails validation never reaches the engine.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
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
    kiln_ivec_free(&r->prompt);
    free(r->bias_ids);
    free(r->bias_values);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop_ids);
    free(r->force_tokens);
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
    return KILN_OK;
}

kiln_status kiln_req_create(const kiln_model *m, const kiln_request *q,
                            const kiln_request_debug *debug, kiln_req **out, kiln_error *err) {
    *out = NULL;
    if (!q) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "request must not be NULL");
    kiln_status st = validate(m, q, err);
    if (st) return st;
    kiln_req *r = calloc(1, sizeof *r);
    if (!r) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (request)");
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
