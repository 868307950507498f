/* perplexity.c - llama-perplexity's method over kiln's forward (perplexity.h). */
#include "engine/perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_format.h"
#include "model/model.h"
#include "util/error.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -log softmax(row)[tok], in double */
static double token_nll(const float *row, int32_t n_vocab, int32_t tok) {
    float mx = row[0];
    for (int32_t i = 1; i < n_vocab; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) s += exp((double)row[i] - (double)mx);
    return log(s) - ((double)row[tok] - (double)mx);
}

kiln_status kiln_perplexity(const kiln_model *m, kiln_backend *be, const int32_t *tokens,
                            int64_t n_tokens, const kiln_ppl_params *p, kiln_ppl_result *out,
                            kiln_error *err) {
    if (!m || !tokens || !p || !out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "perplexity: NULL argument");
    memset(out, 0, sizeof *out);
    const int32_t n_ctx = p->n_ctx, V = m->cfg.n_vocab;
    if (n_ctx < 4)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "perplexity: ctx must be at least 4 (got %d)", n_ctx);
    if (m->cfg.learned_pos && m->cfg.n_ctx_train > 0 && n_ctx > m->cfg.n_ctx_train)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "perplexity: ctx %d exceeds the %d positions the model has learned "
                              "embeddings for",
                              n_ctx, m->cfg.n_ctx_train);
    if (n_tokens < n_ctx)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "perplexity: %lld tokens are fewer than one chunk of ctx %d",
                              (long long)n_tokens, n_ctx);
    if (!kiln_kv_format_of(p->kv_k) || !kiln_kv_format_of(p->kv_v))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "perplexity: the KV type is not a KV page format");
    if (p->bos >= V)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "perplexity: bos id %d is outside the vocabulary (%d)", p->bos, V);
    int64_t n_chunks = n_tokens / n_ctx;
    if (p->max_chunks > 0 && n_chunks > p->max_chunks) n_chunks = p->max_chunks;
    const int32_t first = n_ctx / 2, n_second = n_ctx - first;
    int32_t *chunk = malloc((size_t)n_ctx * sizeof *chunk);
    float *logits = malloc((size_t)n_second * (size_t)V * sizeof *logits);
    kiln_kv_seq *kv = NULL;
    kiln_status st = KILN_OK;
    if (!chunk || !logits) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                            "perplexity: out of memory for %d x %d logits", n_second, V);
        goto done;
    }
    if ((st = kiln_kv_seq_create_kv(m, be, n_ctx, p->kv_k, p->kv_v, &kv, err))) goto done;
    double t0 = now_s(), nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        memcpy(chunk, tokens + c * n_ctx, (size_t)n_ctx * sizeof *chunk);
        if (p->bos >= 0) chunk[0] = p->bos;
        /* a fresh sequence at position 0: earlier chunks' rows are overwritten before they
         * are read (attention reads positions < the query's only) */
        if ((st = kiln_model_forward(m, kv, be, chunk, first, 0, false, NULL, err)) ||
            (st = kiln_model_forward(m, kv, be, chunk + first, n_second, first, true, logits,
                                     err)))
            goto done;
        for (int32_t k = 0; k < n_second - 1; k++) {
            double x = token_nll(logits + (size_t)k * (size_t)V, V, chunk[first + k + 1]);
            nll += x;
            nll2 += x * x;
            count++;
        }
        if (p->progress) p->progress(p->user, (int32_t)c, (int32_t)n_chunks, exp(nll / count));
    }
    out->n_chunks = (int32_t)n_chunks;
    out->n_scored = count;
    out->nll = nll / (double)count;
    out->ppl = exp(out->nll);
    double var = nll2 / (double)count - out->nll * out->nll;
    out->nll_stderr = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) : 0.0;
    out->ppl_stderr = out->nll_stderr * out->ppl;
    out->seconds = now_s() - t0;
done:
    kiln_kv_seq_destroy(kv);
    free(chunk);
    free(logits);
    return st;
}
