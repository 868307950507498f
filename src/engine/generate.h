/*
 * generate.h - single-sequence generation: prefill the prompt in one forward, then decode
 * one token per forward until EOS, max_tokens or the context ends. The continuous-batching
 * engine replaces this loop for serving; it stays as the simplest reference path.
 */
#ifndef KILN_ENGINE_GENERATE_H
#define KILN_ENGINE_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "backend/runner.h"
#include "model/model.h"
#include "util/vec.h"

/* kiln_finish_reason (KILN_FINISH_*) is public: see kiln.h. For kiln_generate, STOP means an
 * end-of-generation token was sampled (not emitted); LENGTH, max_tokens or a full context. */

/** "stop", "length", "cancelled", "error" (or "none"). */
const char *kiln_finish_reason_name(kiln_finish_reason r);

typedef struct kiln_generate_params {
    kiln_sampler_params sampler;
    int32_t max_tokens; /* >= 1 */
    int32_t n_ctx;      /* 0 = the model's training context (or prompt + max_tokens if unknown) */
    kiln_dtype kv_type; /* KV cache storage: KILN_DTYPE_F32 (0, the default) or KILN_DTYPE_F16 */
} kiln_generate_params;

typedef struct kiln_generate_result {
    kiln_ivec tokens; /* generated ids, EOS excluded; caller frees with kiln_ivec_free */
    kiln_finish_reason finish;
    double prompt_ms, gen_ms; /* wall time of the prefill forward and of the decode steps */
    int32_t n_prompt;
} kiln_generate_result;

/** Called for each generated token in order; return false to stop (finish = cancelled). */
typedef bool (*kiln_token_fn)(void *user, int32_t token);

/**
 * Generate from prompt[0..n_prompt). End of generation: the tokenizer's EOG ids (or the
 * config's eos_id without a tokenizer); for llama2.c checkpoints also BOS (id 1), as run.c
 * stops. Errors: KILN_ERR_INVALID_ARGUMENT (empty prompt, id out of range, max_tokens < 1,
 * sampler ranges, prompt longer than the context), KILN_ERR_OUT_OF_MEMORY.
 * be: the backend context to run on (borrowed); NULL makes a one-thread CPU context for the
 * call.
 */
kiln_status kiln_generate(const kiln_model *m, kiln_backend *be, const int32_t *prompt,
                          int32_t n_prompt, const kiln_generate_params *p, kiln_token_fn on_token,
                          void *user, kiln_generate_result *res, kiln_error *err);

/* kiln_model_is_eog (model/model.h) says which ids end a generation. */

#endif
