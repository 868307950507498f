/*
 * config.c - what every config builder shares: architecture names, the per-layer queries, the
 * source-independent defaults (kiln_config_defaults, kiln_config_finish) and the validation of
 * derived invariants. The builders per source are config_gguf.c, config_hf.c and
 * config_llama2c.c.
 */
#include "model/config.h"

#include <math.h>
#include <string.h>

#include "model/config_internal.h"
#include "util/error.h"

const char *kiln_arch_name(kiln_arch a) {
    switch (a) {
    case KILN_ARCH_LLAMA:
        return "llama";
    case KILN_ARCH_MISTRAL:
        return "mistral";
    case KILN_ARCH_QWEN2:
        return "qwen2";
    case KILN_ARCH_QWEN3:
        return "qwen3";
    case KILN_ARCH_GEMMA2:
        return "gemma2";
    case KILN_ARCH_GEMMA3:
        return "gemma3";
    case KILN_ARCH_PHI3:
        return "phi3";
    case KILN_ARCH_MIXTRAL:
        return "mixtral";
    case KILN_ARCH_QWEN3_MOE:
        return "qwen3_moe";
    case KILN_ARCH_GPT2:
        return "gpt2";
    case KILN_ARCH_QWEN3_NEXT:
        return "qwen3_next";
    }
    return "unknown";
}

bool kiln_config_has_mixer(const kiln_model_config *c, kiln_mixer mixer) {
    for (int32_t l = 0; l < c->n_layer && l < KILN_MAX_LAYERS; l++)
        if (c->layer[l].mixer == mixer) return true;
    return false;
}

bool kiln_config_has_sliding(const kiln_model_config *c) {
    for (int32_t l = 0; l < c->n_layer && l < KILN_MAX_LAYERS; l++)
        if (c->layer[l].sliding_window > 0) return true;
    return false;
}

bool kiln_config_has_moe(const kiln_model_config *c) {
    for (int32_t l = 0; l < c->n_layer && l < KILN_MAX_LAYERS; l++)
        if (c->layer[l].moe) return true;
    return false;
}

void kiln_config_defaults(kiln_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = KILN_ARCH_LLAMA;
    cfg->norm_eps = 1e-5f;
    cfg->norm_kind = KILN_NORM_RMS;
    cfg->rope_theta = 10000.0f;
    cfg->rope_style = KILN_ROPE_ADJACENT;
    cfg->rope_scaling = KILN_ROPE_SCALING_NONE;
    cfg->embed_scale = 1.0f;
    cfg->act = KILN_ACT_SILU;
    cfg->ffn_gated = true;
    cfg->bos_id = -1;
    cfg->eos_id = -1;
}

void kiln_config_finish(kiln_model_config *c) {
    if (c->rope_dim == 0 && c->rope_style != KILN_ROPE_NONE) c->rope_dim = c->head_dim;
    if (c->attn_score_div == 0.0f) c->attn_score_div = sqrtf((float)c->head_dim);
    if (c->rope_theta_local == 0.0f) c->rope_theta_local = c->rope_theta;
}

kiln_status kiln_config_validate(const kiln_model_config *c, const char *what, kiln_error *err) {
#define POS(field)                                                                                 \
    if (c->field <= 0)                                                                             \
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: " #field " must be positive (got %d)",    \
                              what, (int)c->field);
    POS(n_vocab)
    POS(n_embd)
    POS(n_layer)
    POS(n_head)
    POS(n_head_kv)
    POS(head_dim)
#undef POS
    if (c->n_layer > KILN_MAX_LAYERS)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: %d layers; kiln supports at most %d",
                              what, c->n_layer, KILN_MAX_LAYERS);
    if (c->n_head % c->n_head_kv != 0)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: n_head (%d) is not a multiple of n_head_kv (%d)", what,
                              c->n_head, c->n_head_kv);
    if (c->rope_style != KILN_ROPE_NONE &&
        (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2 != 0))
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: rotary dimension %d must be even and in [2, head_dim = %d]",
                              what, c->rope_dim, c->head_dim);
    if (c->n_layer > 4096 || c->n_embd > (1 << 20) || c->n_head > 4096 || c->n_ff > (1 << 22) ||
        c->head_dim > 4096 || c->n_vocab > (1 << 26))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: implausible model dimensions", what);
    if (!(c->norm_eps > 0.0f) || !(c->rope_theta > 0.0f) || !(c->rope_theta_local > 0.0f))
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: norm epsilon and rope theta must be positive", what);
    if (!(c->attn_score_div > 0.0f) || !(c->embed_scale > 0.0f) || !(c->attn_softcap >= 0.0f) ||
        !(c->final_softcap >= 0.0f) || !isfinite(c->attn_softcap) || !isfinite(c->final_softcap))
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: attention scale, embedding scale and softcaps must be finite "
                              "and positive",
                              what);
    bool dense = false, moe = false, gdn = false;
    for (int32_t l = 0; l < c->n_layer; l++) {
        const kiln_layer_config *L = &c->layer[l];
        if (L->sliding_window < 0)
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: layer %d: negative sliding window",
                                  what, l);
        if (L->moe)
            moe = true;
        else
            dense = true;
        if (L->mixer == KILN_MIXER_GATED_DELTA_NET)
            gdn = true;
        else if (L->mixer != KILN_MIXER_ATTENTION)
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: layer %d: unknown mixer", what, l);
    }
    if (dense && c->n_ff <= 0)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: n_ff must be positive (got %d)", what,
                              c->n_ff);
    if (moe) {
        if (c->n_expert < 1 || c->n_expert > 4096 || c->n_expert_used < 1 ||
            c->n_expert_used > c->n_expert || c->n_ff_expert <= 0 || c->n_ff_expert > (1 << 22) ||
            c->n_ff_shexp < 0 || c->n_ff_shexp > (1 << 22))
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: MoE sizes out of range (experts %d, used %d, expert FFN "
                                  "%d, shared FFN %d)",
                                  what, c->n_expert, c->n_expert_used, c->n_ff_expert,
                                  c->n_ff_shexp);
    }
    if (gdn) {
        if (c->ssm_conv_kernel < 1 || c->ssm_conv_kernel > 64 || c->ssm_n_k_heads < 1 ||
            c->ssm_n_v_heads < 1 || c->ssm_n_v_heads % c->ssm_n_k_heads != 0 ||
            c->ssm_k_head_dim < 1 || c->ssm_v_head_dim < 1 || c->ssm_k_head_dim > 4096 ||
            c->ssm_v_head_dim > 4096 || c->ssm_n_v_heads > 4096)
            return kiln_error_set(
                err, KILN_ERR_FORMAT,
                "%s: linear-attention sizes out of range (conv %d, key heads %d x "
                "%d, value heads %d x %d)",
                what, c->ssm_conv_kernel, c->ssm_n_k_heads, c->ssm_k_head_dim, c->ssm_n_v_heads,
                c->ssm_v_head_dim);
    }
    return KILN_OK;
}
