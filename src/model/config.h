/*
 * config.h - hyper-parameters of the Llama-family transformer, read from GGUF metadata
 * (llama.cpp's `llama.*` keys), a llama.c checkpoint header, or a Hugging Face config.json
 * (transformers' LlamaConfig).
 */
#ifndef KILN_MODEL_CONFIG_H
#define KILN_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"
#include "format/llama2c.h"
#include "kiln.h"

typedef enum kiln_arch {
    KILN_ARCH_LLAMA = 1, /* Llama 1/2/3, TinyLlama, llama2.c checkpoints */
} kiln_arch;

typedef enum kiln_rope_style {
    /* Rotate adjacent pairs (x[2i], x[2i+1]): llama2.c run.c and llama.cpp LLAMA_ROPE_TYPE_NORM
     * (GGUF conversions permute Q/K rows so this style applies). */
    KILN_ROPE_ADJACENT = 0,
    /* Rotate halves (x[i], x[i + d/2]): transformers' rotate_half (GPT-NeoX style), used on
     * unpermuted Hugging Face weights. */
    KILN_ROPE_HALF = 1,
} kiln_rope_style;

typedef enum kiln_rope_scaling {
    KILN_ROPE_SCALING_NONE = 0,
    KILN_ROPE_SCALING_LLAMA3 = 1, /* transformers _compute_llama3_parameters */
} kiln_rope_scaling;

typedef enum kiln_model_source {
    KILN_SOURCE_GGUF = 1,
    KILN_SOURCE_LLAMA2C = 2,
    KILN_SOURCE_HF = 3,
} kiln_model_source;

typedef struct kiln_model_config {
    kiln_arch arch;
    kiln_model_source source;
    int32_t n_vocab;
    int32_t n_embd;     /* hidden size */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;   /* usually n_embd / n_head */
    int32_t n_ff;       /* FFN intermediate size */
    int32_t n_ctx_train;
    float norm_eps;     /* RMSNorm epsilon */
    float rope_theta;
    kiln_rope_style rope_style;
    kiln_rope_scaling rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int32_t rope_orig_ctx; /* original_max_position_embeddings (llama3 scaling) */
    bool tied_embeddings;
    int32_t bos_id, eos_id; /* from the model config, -1 when absent */
} kiln_model_config;

/**
 * Read a config from GGUF metadata (general.architecture must be "llama"; keys
 * llama.embedding_length, .block_count, .attention.head_count(_kv), .feed_forward_length,
 * .attention.layer_norm_rms_epsilon, .rope.freq_base, .context_length,
 * .rope.dimension_count; n_vocab from llama.vocab_size or the token_embd tensor).
 * Errors: KILN_ERR_UNSUPPORTED (another architecture, named), KILN_ERR_FORMAT (missing or
 * inconsistent key, named).
 */
kiln_status kiln_config_from_gguf(const kiln_gguf *g, kiln_model_config *cfg, kiln_error *err);

/** Config of a llama2.c checkpoint: eps 1e-5, theta 10000, adjacent-pair RoPE (run.c). */
void kiln_config_from_llama2c(const kiln_llama2c_config *c, kiln_model_config *cfg);

/**
 * Read a Hugging Face config.json (architectures [LlamaForCausalLM], model_type "llama").
 * Accepts rope settings either as top-level rope_theta/rope_scaling (transformers 4.x) or as
 * rope_parameters (transformers 5.x); rope types "default" and "llama3".
 * Errors: KILN_ERR_IO, KILN_ERR_FORMAT (malformed JSON, with line/column; missing field),
 * KILN_ERR_UNSUPPORTED (another architecture or an unsupported option such as
 * rope_type "yarn", attention_bias, mlp_bias, hidden_act other than silu).
 */
kiln_status kiln_config_from_hf(const char *config_json_path, kiln_model_config *cfg,
                                kiln_error *err);

/** Validate derived invariants (positive sizes, n_head % n_head_kv == 0, even head_dim...).
 *  `what` names the source for messages. Errors: KILN_ERR_FORMAT. */
kiln_status kiln_config_validate(const kiln_model_config *cfg, const char *what, kiln_error *err);

#endif
