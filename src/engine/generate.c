#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

const char *kiln_finish_reason_name(kiln_finish_reason r) {
    switch (r) {
    case KILN_FINISH_STOP:
        return "stop";
    case KILN_FINISH_LENGTH:
        return "length";
    case KILN_FINISH_CANCELLED:
        return "cancelled";
    case KILN_FINISH_ERROR:
        return "error";
    case KILN_FINISH_NONE:
        break;
    }
    return "none";
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

kiln_status kiln_generate(const kiln_model *m, kiln_backend *be, const int32_t *prompt,
                          int32_t n_prompt, const kiln_generate_params *p, kiln_token_fn on_token,
                          void *user, kiln_generate_result *res, kiln_error *err) {
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    if (n_prompt < 1) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "prompt is empty");
    if (p->max_tokens < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "max_tokens must be >= 1 (got %d)",
                              p->max_tokens);
    kiln_status st = kiln_sampler_validate(&p->sampler, err);
    if (st) return st;
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= m->cfg.n_vocab)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "prompt token %d at index %d is outside [0, %d)", prompt[i], i,
                                  m->cfg.n_vocab);
    int64_t n_ctx = p->n_ctx > 0 ? p->n_ctx : m->cfg.n_ctx_train;
    if (n_ctx <= 0) n_ctx = (int64_t)n_prompt + p->max_tokens;
    if (n_prompt > n_ctx)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "the prompt has %d tokens but the context holds %lld", n_prompt,
                              (long long)n_ctx);
    if (n_ctx > (int64_t)n_prompt + p->max_tokens) n_ctx = (int64_t)n_prompt + p->max_tokens;

    kiln_kv_seq *kv = NULL;
    kiln_sampler_scratch *scratch = NULL;
    kiln_backend *own = NULL;
    kiln_runner *runner = NULL;
    if (!be) {
        const kiln_backend_params bp = kiln_model_backend_params(m, 1);
        if ((st = kiln_backend_create(&bp, &own, err))) return st;
        be = own;
    }
    float *logits = malloc((size_t)m->cfg.n_vocab * sizeof *logits);
    if (!logits) {
        kiln_backend_destroy(own);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if ((st = kiln_kv_seq_create_on(m, be->ops->host_memory ? NULL : be, (int32_t)n_ctx,
                                    p->kv_type ? p->kv_type : KILN_DTYPE_F32, &kv, err)))
        goto done;
    if ((st = kiln_sampler_scratch_create(m->cfg.n_vocab, &scratch, err))) goto done;
    if ((st = kiln_runner_create(m, be, kv->pool, n_prompt, (int32_t)n_ctx, &runner, err)))
        goto done;

    double t0 = now_ms();
    if ((st = kiln_runner_forward_seq(runner, kv, prompt, n_prompt, 0, false, logits, err)))
        goto done;
    double t1 = now_ms();
    res->prompt_ms = t1 - t0;
    int32_t pos = n_prompt;
    for (int32_t step = 0;; step++) {
        int32_t tok = kiln_sample(&p->sampler, logits, m->cfg.n_vocab, (uint64_t)step, scratch);
        if (kiln_model_is_eog(m, tok)) {
            res->finish = KILN_FINISH_STOP;
            break;
        }
        if ((st = kiln_ivec_push(&res->tokens, tok))) {
            kiln_error_set(err, st, "out of memory");
            goto done;
        }
        if (on_token && !on_token(user, tok)) {
            res->finish = KILN_FINISH_CANCELLED;
            break;
        }
        if ((int32_t)res->tokens.n >= p->max_tokens || pos >= n_ctx) {
            res->finish = KILN_FINISH_LENGTH;
            break;
        }
        if ((st = kiln_runner_forward_seq(runner, kv, &tok, 1, pos, false, logits, err))) goto done;
        pos++;
    }
    res->gen_ms = now_ms() - t1;
done:
    if (st) res->finish = KILN_FINISH_ERROR;
    free(logits);
    kiln_runner_destroy(runner);
    kiln_kv_seq_destroy(kv);
    kiln_sampler_scratch_destroy(scratch);
    kiln_backend_destroy(own);
    return st;
}
