/*
 * perplexity.h - perplexity of a token sequence under a model, by llama.cpp's llama-perplexity
 * method (examples/perplexity/perplexity.cpp, `perplexity()`; its README: "the perplexity over
 * the last half of the window"), run through the model forward over a KV cache of the chosen
 * page formats, so the formats' rounding is part of what is measured.
 *
 * The method, for context n_ctx:
 *   - the text is tokenized whole (the caller does that: add_special as the vocab says, so a
 *     model that adds BOS gets one at the start; special texts are not parsed);
 *   - n_chunks = floor(n_tokens / n_ctx) chunks of n_ctx consecutive tokens (or fewer when
 *     asked), chunk c = tokens [c*n_ctx, (c+1)*n_ctx); the tail is not scored;
 *   - each chunk starts a fresh cache at position 0; where the model adds BOS (bos >= 0 in the
 *     params) the chunk's first token is replaced by BOS;
 *   - with first = n_ctx / 2, the logits at positions first .. n_ctx-2 are scored against the
 *     next tokens (n_ctx - first - 1 per chunk): nll_i = logsumexp(logits) - logits[next];
 *   - ppl = exp(mean nll); the uncertainty is llama.cpp's: s = sqrt((mean nll^2 - mean^2) /
 *     (count - 1)), ppl_stderr = s * ppl.
 * The log-softmax is computed in double (llama.cpp: float max and expf, a double sum), which
 * differs from llama.cpp's by rounding only.
 */
#ifndef KILN_ENGINE_PERPLEXITY_H
#define KILN_ENGINE_PERPLEXITY_H

#include <stdint.h>

#include "backend/runner.h"
#include "kiln.h"

typedef struct kiln_ppl_params {
    int32_t n_ctx;       /* >= 4 */
    int32_t max_chunks;  /* 0: every whole chunk */
    kiln_dtype kv_k;     /* KV page format of K rows (kv/kv_format.h) */
    kiln_dtype kv_v;     /* of V rows */
    int32_t bos;         /* >= 0: each chunk's first token becomes this id; -1: kept */
    /* optional: called after each chunk with the running perplexity */
    void (*progress)(void *user, int32_t chunk, int32_t n_chunks, double ppl);
    void *user;
} kiln_ppl_params;

typedef struct kiln_ppl_result {
    double ppl;        /* exp(nll) */
    double nll;        /* mean negative log-likelihood, nats per scored token */
    double nll_stderr; /* llama.cpp's uncertainty of the mean */
    double ppl_stderr;
    int64_t n_scored;  /* tokens scored: n_chunks * (n_ctx - n_ctx/2 - 1) */
    int32_t n_chunks;
    double seconds;    /* wall time of the forwards and scoring */
} kiln_ppl_result;

/**
 * Score tokens[0..n_tokens) as above with model m on backend be (borrowed; NULL: one CPU
 * thread), each chunk forwarded through kiln_model_forward over a private cache of n_ctx
 * positions with K rows in p->kv_k and V rows in p->kv_v (kiln_kv_seq_create_kv): the first half of the chunk without logits, the second with every
 * row's (batch invariance makes the split immaterial to the logits).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL, n_ctx < 4 or past the model's learned positions,
 * fewer than n_ctx tokens, a token or bos outside the vocabulary, a format that is not a KV
 * page format or cannot hold the model's rows: q8_0 / q4_0 need kv_dim % 32 == 0),
 * KILN_ERR_OUT_OF_MEMORY, and the forward's errors.
 */
kiln_status kiln_perplexity(const kiln_model *m, kiln_backend *be, const int32_t *tokens,
                            int64_t n_tokens, const kiln_ppl_params *p, kiln_ppl_result *out,
                            kiln_error *err);

#endif
