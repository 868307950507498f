/*
 * config.h - hyper-parameters of kiln's one transformer block (DESIGN.md principle 6: the
 * architectures are configurations of one block, not copies of it), read from GGUF metadata
 * (llama.cpp's `<arch>.*` keys), a llama2.c checkpoint header, or a Hugging Face config.json
 * (transformers' <Family>Config as saved by save_pretrained).
 *
 * The block, per layer l (see forward.c):
 *   h  = norm(x)                                   RMSNorm | RMSNorm(1+w) | LayerNorm+bias
 *   a  = mixer_l(h)                                attention (optionally windowed, biased,
 *                                                  q/k-normed, softcapped, output-gated) or a
 *                                                  gated delta net (linear attention)
 *   a  = post_attn_norm(a)                         only with sandwich norms (Gemma 2/3)
 *   x += a
 *   h  = norm(x)
 *   f  = ffn_l(h)                                  dense GLU | dense MLP | top-k MoE (+ shared)
 *   f  = post_ffn_norm(f)                          only with sandwich norms
 *   x += f
 * logits = softcap(W_out . norm(x)).
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
    KILN_ARCH_MISTRAL,   /* Llama + sliding-window attention */
    KILN_ARCH_QWEN2,     /* Llama + q/k/v bias */
    KILN_ARCH_QWEN3,     /* Llama + per-head q/k RMSNorm, explicit head_dim */
    KILN_ARCH_GEMMA2,    /* sandwich norms, GELU-tanh GLU, softcaps, alternating window */
    KILN_ARCH_GEMMA3,    /* Gemma 2 + q/k norm, local:global pattern with two rope bases */
    KILN_ARCH_PHI3,      /* Llama with fused qkv and gate_up projections */
    KILN_ARCH_MIXTRAL,   /* Mistral with top-k MoE FFN */
    KILN_ARCH_QWEN3_MOE, /* Qwen3 with top-k MoE FFN */
    KILN_ARCH_GPT2,      /* learned positions, LayerNorm, GELU MLP, biases, Conv1D layout */
    KILN_ARCH_QWEN3_NEXT /* gated delta net + gated attention hybrid, MoE + shared expert */
} kiln_arch;

/** Lower-case name of an architecture ("llama", "gemma2", ...); "unknown" otherwise. */
const char *kiln_arch_name(kiln_arch a);

typedef enum kiln_rope_style {
    /* Rotate adjacent pairs (x[2i], x[2i+1]): llama2.c run.c and llama.cpp LLAMA_ROPE_TYPE_NORM
     * (GGUF conversions permute Q/K rows so this style applies). */
    KILN_ROPE_ADJACENT = 0,
    /* Rotate halves (x[i], x[i + d/2]) of the rotated part: transformers' rotate_half (GPT-NeoX
     * style, llama.cpp LLAMA_ROPE_TYPE_NEOX), used on unpermuted Hugging Face weights. */
    KILN_ROPE_HALF = 1,
    /* No rotary embedding (GPT-2: learned absolute positions). */
    KILN_ROPE_NONE = 2,
} kiln_rope_style;

typedef enum kiln_rope_scaling {
    KILN_ROPE_SCALING_NONE = 0,
    KILN_ROPE_SCALING_LLAMA3 = 1, /* transformers _compute_llama3_parameters */
    KILN_ROPE_SCALING_LINEAR = 2, /* inv_freq / factor (transformers _compute_linear_scaling) */
} kiln_rope_scaling;

typedef enum kiln_model_source {
    KILN_SOURCE_GGUF = 1,
    KILN_SOURCE_LLAMA2C = 2,
    KILN_SOURCE_HF = 3,
} kiln_model_source;

typedef enum kiln_norm_kind {
    KILN_NORM_RMS = 0,   /* w * x / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019) */
    KILN_NORM_LAYER = 1, /* (x - mean) / sqrt(var + eps) * w + b (Ba et al. 2016) */
} kiln_norm_kind;

typedef enum kiln_act {
    KILN_ACT_SILU = 0,      /* x * sigmoid(x) */
    KILN_ACT_GELU_TANH = 1, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (gelu_new,
                               gelu_pytorch_tanh) */
    KILN_ACT_GELU_ERF = 2,  /* 0.5 x (1 + erf(x / sqrt 2)) */
} kiln_act;

typedef enum kiln_mixer {
    KILN_MIXER_ATTENTION = 0,      /* softmax attention over the paged KV cache */
    KILN_MIXER_GATED_DELTA_NET = 1 /* linear attention with a per-sequence recurrent state
                                      (Yang et al. 2024, "Gated Delta Networks") */
} kiln_mixer;

/** Per-layer attributes. */
typedef struct kiln_layer_config {
    int32_t sliding_window; /* 0: full causal attention; W > 0: the token at position p
                               attends to keys at positions (p - W, p] (transformers'
                               sliding_window_overlay: kv_idx > q_idx - W) */
    uint8_t mixer;          /* kiln_mixer */
    uint8_t rope_local;     /* 1: rotary frequencies from rope_theta_local (Gemma 3 local) */
    uint8_t moe;            /* 1: sparse MoE FFN; 0: dense FFN */
    uint8_t reserved;
} kiln_layer_config;

#define KILN_MAX_LAYERS 512

typedef struct kiln_model_config {
    kiln_arch arch;
    kiln_model_source source;
    int32_t n_vocab;
    int32_t n_embd; /* hidden size */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim; /* usually n_embd / n_head; explicit for Qwen3 / Gemma */
    int32_t n_ff;     /* dense FFN intermediate size */
    int32_t n_ctx_train;
    float norm_eps;
    kiln_norm_kind norm_kind;
    bool norm_unit_offset; /* the stored norm weights are w with the norm using (1 + w) (HF
                              Gemma, Qwen3-Next); applied once at load time */
    /* attention */
    float rope_theta;
    float rope_theta_local; /* layers with rope_local (Gemma 3 sliding layers) */
    int32_t rope_dim;       /* rotated dimensions per head (partial rotary); <= head_dim */
    kiln_rope_style rope_style;
    kiln_rope_scaling rope_scaling; /* for the global rope_theta table */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int32_t rope_orig_ctx;     /* original_max_position_embeddings (llama3 scaling) */
    bool attn_bias_qkv;        /* biases on q, k, v projections */
    bool attn_bias_o;          /* bias on the output projection */
    bool qk_norm;              /* per-head norm of q and k (before RoPE), weights [head_dim] */
    bool attn_out_gate;        /* Qwen3-Next: q_proj also yields a per-head gate; the attention
                                  output is multiplied by sigmoid(gate) before o_proj */
    float attn_score_div;      /* scores = q.k / attn_score_div (sqrt(head_dim), or
                                  sqrt(query_pre_attn_scalar) for Gemma, 1 when unscaled) */
    bool attn_scale_inv_layer; /* GPT-2 scale_attn_by_inverse_layer_idx: also / (l + 1) */
    float attn_softcap;        /* 0 = none; scores = c * tanh(scores / c) */
    float final_softcap;       /* 0 = none; logits = c * tanh(logits / c) */
    /* residual stream */
    bool sandwich_norms; /* Gemma: norms on the attention and FFN outputs too */
    float embed_scale;   /* embeddings are multiplied by this (1, or sqrt(n_embd) for Gemma) */
    bool learned_pos;    /* GPT-2: absolute position embeddings added to the input */
    /* FFN */
    kiln_act act;
    bool ffn_gated; /* down(act(gate x) * up x); else proj(act(fc x + b) ) + b (GPT-2) */
    bool ffn_bias;  /* biases on the dense FFN (GPT-2 MLP) */
    /* MoE (layers with moe = 1) */
    int32_t n_expert, n_expert_used, n_ff_expert;
    bool expert_norm_topk; /* renormalise the top-k softmax weights to sum 1 */
    int32_t n_ff_shexp;    /* shared expert intermediate size, 0 = none */
    bool shexp_gate;       /* shared expert output scaled by sigmoid(w . x) */
    /* gated delta net (layers with mixer = GATED_DELTA_NET) */
    int32_t ssm_conv_kernel; /* depthwise causal conv width */
    int32_t ssm_n_k_heads, ssm_n_v_heads, ssm_k_head_dim, ssm_v_head_dim;
    bool tied_embeddings;
    int32_t bos_id, eos_id; /* from the model config, -1 when absent */
    kiln_layer_config layer[KILN_MAX_LAYERS];
} kiln_model_config;

/** True when some layer uses the mixer / a sliding window / MoE. */
bool kiln_config_has_mixer(const kiln_model_config *cfg, kiln_mixer mixer);
bool kiln_config_has_sliding(const kiln_model_config *cfg);
bool kiln_config_has_moe(const kiln_model_config *cfg);

/**
 * Read a config from GGUF metadata with llama.cpp's conventions (llama-arch.cpp keys
 * "<arch>.*", llama-model.cpp hyper-parameter defaults). general.architecture: llama (with
 * <arch>.expert_count: Mixtral-style MoE, top-k renormalised), qwen2 (q/k/v bias), qwen3
 * (q/k norm), qwen3moe, gemma2, gemma3, phi3, gpt2. Keys: embedding_length, block_count,
 * attention.head_count(_kv), feed_forward_length, attention.key_length/value_length,
 * rope.dimension_count (partial rotary), context_length, attention.layer_norm_rms_epsilon
 * (layer_norm_epsilon for gpt2), rope.freq_base, rope.scaling.type none|linear (+ factor),
 * expert_count, expert_used_count, expert_feed_forward_length; Gemma: attention.sliding_window
 * (default 4096), attention.sliding_window_pattern (2 / 6: layer l windowed when
 * l % period < period - 1), rope.freq_base_swa (Gemma 3 default 10000), attn/final logit
 * softcapping (Gemma 2 defaults 50 / 30); the Gemma attention scale is 1/sqrt(head_dim), or
 * 1/sqrt(n_embd/n_head) for the 27B models, as llama.cpp. llama uses adjacent-pair RoPE (its
 * Q/K rows were permuted at conversion); the others half-split (NEOX). Phi-3 runs without a
 * sliding window, as llama.cpp. n_vocab from <arch>.vocab_size or the token_embd tensor.
 * Errors: KILN_ERR_UNSUPPORTED (another architecture, a rope scaling type, per-layer arrays,
 * long-rope factors, expert_weights_scale: named), KILN_ERR_FORMAT (missing or inconsistent
 * key, named).
 */
kiln_status kiln_config_from_gguf(const kiln_gguf *g, kiln_model_config *cfg, kiln_error *err);

/** Config of a llama2.c checkpoint: eps 1e-5, theta 10000, adjacent-pair RoPE (run.c). */
void kiln_config_from_llama2c(const kiln_llama2c_config *c, kiln_model_config *cfg);

/**
 * Read a Hugging Face config.json. model_type selects the family: llama, mistral, qwen2,
 * qwen3, gemma2, gemma3_text (or gemma3 with a text_config), phi3, mixtral, qwen3_moe, gpt2,
 * qwen3_next. Rope settings are read either as top-level rope_theta/rope_scaling
 * (transformers 4.x) or as rope_parameters (transformers 5.x, per layer type for Gemma 3);
 * rope types "default", "linear" and "llama3". Per-layer attention kinds come from
 * layer_types when present, else from each family's defaults (Gemma 2 alternates from a
 * sliding layer 0; Gemma 3 every sliding_window_pattern-th layer is global; Mistral, Mixtral
 * and Phi-3 window every layer when sliding_window is set).
 * Errors: KILN_ERR_IO, KILN_ERR_FORMAT (malformed JSON, with line/column; missing or
 * out-of-range field, named), KILN_ERR_UNSUPPORTED (an unknown model_type or an option
 * kiln does not implement, named: e.g. rope_type "yarn", mlp_bias, a hidden activation,
 * a layer type, bidirectional attention).
 */
kiln_status kiln_config_from_hf(const char *config_json_path, kiln_model_config *cfg,
                                kiln_error *err);

/** Validate derived invariants (positive sizes, n_head % n_head_kv == 0, even rope_dim,
 *  MoE and delta-net sizes...). `what` names the source for messages.
 *  Errors: KILN_ERR_FORMAT, KILN_ERR_UNSUPPORTED (more than KILN_MAX_LAYERS layers). */
kiln_status kiln_config_validate(const kiln_model_config *cfg, const char *what, kiln_error *err);

#endif
