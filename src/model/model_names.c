/* model_names.c - the tensor name schemes of model_names.h. */
#include "model/model_names.h"

#include <stddef.h>

#define GG_L "blk.%d."
/* llama.cpp's tensor names (llama-arch.cpp LLM_TENSOR_NAMES). */
static const kiln_name_scheme gguf_names = {
    .tok_embd = "token_embd.weight",
    .pos_embd = "position_embd.weight",
    .output_norm = "output_norm.weight",
    .output_norm_b = "output_norm.bias",
    .output = "output.weight",
    .attn_norm = GG_L "attn_norm.weight",
    .attn_norm_b = GG_L "attn_norm.bias",
    .ffn_norm = GG_L "ffn_norm.weight",
    .ffn_norm_b = GG_L "ffn_norm.bias",
    .post_attn_norm = GG_L "post_attention_norm.weight",
    .post_ffn_norm = GG_L "post_ffw_norm.weight",
    .wq = GG_L "attn_q.weight",
    .wk = GG_L "attn_k.weight",
    .wv = GG_L "attn_v.weight",
    .wqkv = GG_L "attn_qkv.weight",
    .wo = GG_L "attn_output.weight",
    .bq = GG_L "attn_q.bias",
    .bk = GG_L "attn_k.bias",
    .bv = GG_L "attn_v.bias",
    .bqkv = GG_L "attn_qkv.bias",
    .bo = GG_L "attn_output.bias",
    .q_norm = GG_L "attn_q_norm.weight",
    .k_norm = GG_L "attn_k_norm.weight",
    .w_gate = GG_L "ffn_gate.weight",
    .w_up = GG_L "ffn_up.weight",
    .w_down = GG_L "ffn_down.weight",
    .b_up = GG_L "ffn_up.bias",
    .b_down = GG_L "ffn_down.bias",
    .router = GG_L "ffn_gate_inp.weight",
    .exp_gate = GG_L "ffn_gate_exps.weight",
    .exp_up = GG_L "ffn_up_exps.weight",
    .exp_down = GG_L "ffn_down_exps.weight",
    .exp_merged = true,
};

kiln_name_scheme kiln_name_scheme_gguf(const kiln_model_config *c) {
    kiln_name_scheme nm = gguf_names;
    if (c->arch == KILN_ARCH_PHI3) { /* ffn_up holds [gate; up] (llama.cpp LLM_FFN_SWIGLU) */
        nm.w_gate = nm.w_up = NULL;
        nm.w_gate_up = GG_L "ffn_up.weight";
    }
    return nm;
}

#define HF_L "model.layers.%d."
/* transformers' Llama-style module names, shared by most families. */
static const kiln_name_scheme hf_llama_names = {
    .tok_embd = "model.embed_tokens.weight",
    .output_norm = "model.norm.weight",
    .output = "lm_head.weight",
    .attn_norm = HF_L "input_layernorm.weight",
    .ffn_norm = HF_L "post_attention_layernorm.weight",
    .wq = HF_L "self_attn.q_proj.weight",
    .wk = HF_L "self_attn.k_proj.weight",
    .wv = HF_L "self_attn.v_proj.weight",
    .wo = HF_L "self_attn.o_proj.weight",
    .bq = HF_L "self_attn.q_proj.bias",
    .bk = HF_L "self_attn.k_proj.bias",
    .bv = HF_L "self_attn.v_proj.bias",
    .bo = HF_L "self_attn.o_proj.bias",
    .q_norm = HF_L "self_attn.q_norm.weight",
    .k_norm = HF_L "self_attn.k_norm.weight",
    .w_gate = HF_L "mlp.gate_proj.weight",
    .w_up = HF_L "mlp.up_proj.weight",
    .w_down = HF_L "mlp.down_proj.weight",
    .router = HF_L "mlp.gate.weight",
    .exp_gate = HF_L "mlp.experts.%d.gate_proj.weight",
    .exp_up = HF_L "mlp.experts.%d.up_proj.weight",
    .exp_down = HF_L "mlp.experts.%d.down_proj.weight",
    .shexp_gate = HF_L "mlp.shared_expert.gate_proj.weight",
    .shexp_up = HF_L "mlp.shared_expert.up_proj.weight",
    .shexp_down = HF_L "mlp.shared_expert.down_proj.weight",
    .shexp_router = HF_L "mlp.shared_expert_gate.weight",
    .ssm_in_qkvz = HF_L "linear_attn.in_proj_qkvz.weight",
    .ssm_in_ba = HF_L "linear_attn.in_proj_ba.weight",
    .ssm_out = HF_L "linear_attn.out_proj.weight",
    .ssm_conv = HF_L "linear_attn.conv1d.weight",
    .ssm_a_log = HF_L "linear_attn.A_log",
    .ssm_dt_bias = HF_L "linear_attn.dt_bias",
    .ssm_norm = HF_L "linear_attn.norm.weight",
};

kiln_name_scheme kiln_name_scheme_hf(const kiln_model_config *c, bool gpt2_prefixed) {
    kiln_name_scheme nm = hf_llama_names;
    switch (c->arch) {
    case KILN_ARCH_GEMMA2:
    case KILN_ARCH_GEMMA3:
        nm.ffn_norm = HF_L "pre_feedforward_layernorm.weight";
        nm.post_attn_norm = HF_L "post_attention_layernorm.weight";
        nm.post_ffn_norm = HF_L "post_feedforward_layernorm.weight";
        break;
    case KILN_ARCH_PHI3:
        nm.wq = nm.wk = nm.wv = NULL;
        nm.wqkv = HF_L "self_attn.qkv_proj.weight";
        nm.w_gate = nm.w_up = NULL;
        nm.w_gate_up = HF_L "mlp.gate_up_proj.weight";
        break;
    case KILN_ARCH_MIXTRAL:
        nm.router = HF_L "block_sparse_moe.gate.weight";
        nm.exp_gate = HF_L "block_sparse_moe.experts.%d.w1.weight";
        nm.exp_up = HF_L "block_sparse_moe.experts.%d.w3.weight";
        nm.exp_down = HF_L "block_sparse_moe.experts.%d.w2.weight";
        break;
    case KILN_ARCH_GPT2: {
        static const kiln_name_scheme gpt2[2] = {
#define GPT2_NAMES(P)                                                                              \
    {                                                                                              \
        .tok_embd = P "wte.weight",                                                                \
        .pos_embd = P "wpe.weight",                                                                \
        .output_norm = P "ln_f.weight",                                                            \
        .output_norm_b = P "ln_f.bias",                                                            \
        .output = "lm_head.weight",                                                                \
        .attn_norm = P "h.%d.ln_1.weight",                                                         \
        .attn_norm_b = P "h.%d.ln_1.bias",                                                         \
        .ffn_norm = P "h.%d.ln_2.weight",                                                          \
        .ffn_norm_b = P "h.%d.ln_2.bias",                                                          \
        .wqkv = P "h.%d.attn.c_attn.weight",                                                       \
        .bqkv = P "h.%d.attn.c_attn.bias",                                                         \
        .wo = P "h.%d.attn.c_proj.weight",                                                         \
        .bo = P "h.%d.attn.c_proj.bias",                                                           \
        .w_up = P "h.%d.mlp.c_fc.weight",                                                          \
        .b_up = P "h.%d.mlp.c_fc.bias",                                                            \
        .w_down = P "h.%d.mlp.c_proj.weight",                                                      \
        .b_down = P "h.%d.mlp.c_proj.bias",                                                        \
        .conv1d = true,                                                                            \
    }
            GPT2_NAMES("transformer."),
            GPT2_NAMES(""),
#undef GPT2_NAMES
        };
        nm = gpt2[gpt2_prefixed ? 0 : 1];
        break;
    }
    default:
        break;
    }
    return nm;
}
