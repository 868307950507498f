/*
 * model_names.h - the tensor names of each source and family (llama.cpp's GGUF names,
 * transformers' module names), as printf patterns the weight binder (model_bind.c) fills in.
 * Internal to src/model.
 */
#ifndef KILN_MODEL_MODEL_NAMES_H
#define KILN_MODEL_MODEL_NAMES_H

#include <stdbool.h>

#include "model/config.h"

/* Weight names per source and family: printf patterns taking the layer index (and the
 * expert index for exp_*). NULL: the scheme has no such tensor. */
typedef struct kiln_name_scheme {
    const char *tok_embd, *pos_embd, *output_norm, *output_norm_b, *output;
    const char *attn_norm, *attn_norm_b, *ffn_norm, *ffn_norm_b, *post_attn_norm, *post_ffn_norm;
    const char *wq, *wk, *wv, *wqkv, *wo, *bq, *bk, *bv, *bqkv, *bo, *q_norm, *k_norm;
    const char *w_gate, *w_up, *w_gate_up, *w_down, *b_up, *b_down;
    const char *router, *exp_gate, *exp_up, *exp_down;
    const char *shexp_gate, *shexp_up, *shexp_down, *shexp_router;
    const char *ssm_in_qkvz, *ssm_in_ba, *ssm_out, *ssm_conv, *ssm_a_log, *ssm_dt_bias, *ssm_norm;
    bool conv1d;     /* 2-D weights stored [in, out] (GPT-2 Conv1D) */
    bool exp_merged; /* exp_* name one 3-D tensor [n_expert][rows][cols] per layer (GGUF) */
} kiln_name_scheme;

/** GGUF tensor names (llama.cpp's llama-arch.cpp LLM_TENSOR_NAMES) for c's architecture:
 *  "blk.%d." per layer, merged 3-D expert tensors; Phi-3's ffn_up holds [gate; up]. */
kiln_name_scheme kiln_name_scheme_gguf(const kiln_model_config *c);

/** Hugging Face (transformers) module names for c's architecture: the Llama-style
 *  "model.layers.%d." names with each family's differences (Gemma sandwich norms, Phi-3 fused
 *  qkv and gate_up, Mixtral block_sparse_moe experts); GPT-2's Conv1D names, with the
 *  "transformer." prefix when gpt2_prefixed (GPT2LMHeadModel) or without (GPT2Model). */
kiln_name_scheme kiln_name_scheme_hf(const kiln_model_config *c, bool gpt2_prefixed);

#endif
