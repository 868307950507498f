/*
 * model_fit.h - what a loaded model needs in memory, for `kiln fit` and the engine's
 * memory_budget (kv/kv_fit.h does the arithmetic).
 */
#ifndef KILN_MODEL_MODEL_FIT_H
#define KILN_MODEL_MODEL_FIT_H

#include <stdint.h>

#include "kv/kv_fit.h"
#include "model/model.h"

/**
 * Bytes of the model's weights as stored in its source: the sum of the tensor data sizes of a
 * GGUF or safetensors source (every tensor, norms included, tied embeddings once), or the f32
 * parameter count times 4 for a llama2.c checkpoint. 0 for NULL.
 */
int64_t kiln_model_weights_bytes(const kiln_model *m);

/**
 * The model's layers as KV groups: attention layers without a window are full, with
 * layer[l].sliding_window W > 0 sliding (window W), gated-delta-net layers recurrent with
 * their f32 state (conv window + delta-rule state, kiln_model_seq_state_floats; the state's
 * header is counted once). block_size and the K/V formats are set as given.
 * False when the layout cannot hold the model's distinct layer geometries (more than
 * KILN_KV_FIT_MAX_GROUPS) or an argument is invalid.
 */
bool kiln_model_kv_layout(const kiln_model *m, int32_t block_size, kiln_dtype k_format,
                          kiln_dtype v_format, kiln_kv_fit_layout *out);

/**
 * Scratch the engine's backend needs for steps of up to step_tokens tokens over sequences of
 * up to n_ctx positions: the activation arena (kiln_model_reserve's act_bytes) plus the f32
 * logits of step_tokens rows. An estimate of what the runner reserves: the backend's own
 * per-thread attention scratch is not included.
 */
int64_t kiln_model_scratch_bytes(const kiln_model *m, int32_t step_tokens, int32_t n_ctx);

#endif
