/*
 * config_hf.c - kiln_config_from_hf: a config from a Hugging Face config.json (transformers'
 * <Family>Config as saved by save_pretrained): the JSON field readers, rope parameters, layer
 * types, and one builder per family, selected by model_type from HF_FAMILIES.
 */
#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "format/json_file.h"
#include "model/config_internal.h"
#include "util/error.h"

/* Parsing context: the file path for messages, the JSON root, the result. */
typedef struct hf_ctx {
    const char *path;
    json_t *root;
    kiln_model_config *cfg;
    kiln_error *err;
} hf_ctx;

static bool json_get_int(json_t *o, const char *key, int32_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX) return false;
    *out = (int32_t)x;
    return true;
}

static bool json_get_num(json_t *o, const char *key, float *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return false;
    *out = (float)json_number_value(v);
    return true;
}

static bool json_get_dbl(json_t *o, const char *key, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return true;
}

/* A boolean field; absent or null gives dflt. */
static bool json_get_bool(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v)) return json_is_true(v);
    return dflt;
}

static kiln_status hf_req_int(hf_ctx *h, const char *key, int32_t *out) {
    if (!json_get_int(h->root, key, out))
        return kiln_error_set(h->err, KILN_ERR_FORMAT,
                              "%s: field '%s' is missing or not an integer", h->path, key);
    return KILN_OK;
}

/* First id of an int or [int, ...] field, or -1. */
static int32_t json_first_id(json_t *v) {
    if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0);
    if (json_is_integer(v)) return (int32_t)json_integer_value(v);
    return -1;
}

/* One rope parameter set: rope_type default | linear | llama3. */
typedef struct rope_params {
    float theta;
    kiln_rope_scaling scaling;
    float factor, low, high;
    int32_t orig_ctx;
} rope_params;

static kiln_status hf_parse_rope(hf_ctx *h, json_t *p, const char *what, rope_params *r) {
    json_get_num(p, "rope_theta", &r->theta);
    const char *type = json_string_value(json_object_get(p, "rope_type"));
    if (!type) type = json_string_value(json_object_get(p, "type"));
    if (!type || strcmp(type, "default") == 0) return KILN_OK;
    if (strcmp(type, "linear") == 0) {
        if (!json_get_num(p, "factor", &r->factor) || !(r->factor > 0.0f))
            return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                  "%s: %s: linear rope scaling needs a positive factor", h->path,
                                  what);
        r->scaling = r->factor == 1.0f ? KILN_ROPE_SCALING_NONE : KILN_ROPE_SCALING_LINEAR;
        return KILN_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        r->scaling = KILN_ROPE_SCALING_LLAMA3;
        if (!json_get_num(p, "factor", &r->factor) ||
            !json_get_num(p, "low_freq_factor", &r->low) ||
            !json_get_num(p, "high_freq_factor", &r->high) ||
            !json_get_int(p, "original_max_position_embeddings", &r->orig_ctx))
            return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                  "%s: %s: llama3 rope scaling needs factor, low_freq_factor, "
                                  "high_freq_factor and original_max_position_embeddings",
                                  h->path, what);
        if (!(r->factor > 0) || !(r->high > r->low) || !(r->low > 0) || r->orig_ctx <= 0)
            return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                  "%s: %s: llama3 rope scaling values are out of range", h->path,
                                  what);
        return KILN_OK;
    }
    return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                          "%s: %s: rope_type '%s' is not supported (supported: default, linear, "
                          "llama3)",
                          h->path, what, type);
}

/* Rope settings. transformers 5.x: rope_parameters {rope_theta, rope_type, ...}, or for
 * Gemma 3 one such object per layer type; transformers 4.x: rope_theta + rope_scaling
 * {rope_type|type, ...} or null, and Gemma 3's rope_local_base_freq. partial_rotary_factor
 * sits in rope_parameters (5.x) or at the top level (4.x). */
static kiln_status hf_rope(hf_ctx *h) {
    kiln_model_config *c = h->cfg;
    json_t *params = json_object_get(h->root, "rope_parameters");
    json_t *scaling = json_object_get(h->root, "rope_scaling");
    rope_params global = {c->rope_theta, KILN_ROPE_SCALING_NONE, 1, 0, 0, 0};
    rope_params local = {0, KILN_ROPE_SCALING_NONE, 1, 0, 0, 0};
    json_get_num(h->root, "rope_theta", &global.theta);
    json_get_num(h->root, "rope_local_base_freq", &local.theta);
    double partial = 1.0, top_partial = 0.0;
    const bool has_top_partial = json_get_dbl(h->root, "partial_rotary_factor", &top_partial);
    if (has_top_partial) partial = top_partial;
    kiln_status st;
    /* A transformers 4.x rope_scaling left beside 5.x rope_parameters must agree with it. */
    if (json_is_object(params) && json_is_object(scaling)) {
        rope_params legacy = global;
        if ((st = hf_parse_rope(h, scaling, "rope_scaling", &legacy))) return st;
        rope_params current = global;
        json_t *p5 = json_is_object(json_object_get(params, "full_attention"))
                         ? json_object_get(params, "full_attention")
                         : params;
        if ((st = hf_parse_rope(h, p5, "rope_parameters", &current))) return st;
        if (legacy.scaling != current.scaling || legacy.factor != current.factor)
            return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                                  "%s: rope_scaling and rope_parameters disagree; refusing to "
                                  "guess which one applies",
                                  h->path);
    }
    json_t *full = json_is_object(params) ? json_object_get(params, "full_attention") : NULL;
    json_t *slide = json_is_object(params) ? json_object_get(params, "sliding_attention") : NULL;
    if (json_is_object(full) || json_is_object(slide)) {
        if (json_is_object(full)) {
            if ((st = hf_parse_rope(h, full, "rope_parameters.full_attention", &global))) return st;
            json_get_dbl(full, "partial_rotary_factor", &partial);
        }
        if (json_is_object(slide)) {
            if ((st = hf_parse_rope(h, slide, "rope_parameters.sliding_attention", &local)))
                return st;
        }
    } else {
        json_t *p = json_is_object(params) ? params : (json_is_object(scaling) ? scaling : NULL);
        if (p) {
            if ((st = hf_parse_rope(
                     h, p, json_is_object(params) ? "rope_parameters" : "rope_scaling", &global)))
                return st;
            json_get_dbl(p, "partial_rotary_factor", &partial);
        }
    }
    if (has_top_partial && partial != top_partial)
        return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                              "%s: partial_rotary_factor %g at the top level and %g in the rope "
                              "parameters disagree",
                              h->path, top_partial, partial);
    if (local.scaling != KILN_ROPE_SCALING_NONE)
        return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                              "%s: rope scaling on sliding-window layers is not supported",
                              h->path);
    if (!(partial > 0.0 && partial <= 1.0))
        return kiln_error_set(h->err, KILN_ERR_FORMAT,
                              "%s: partial_rotary_factor %g is outside (0, 1]", h->path, partial);
    c->rope_theta = global.theta;
    c->rope_theta_local = local.theta;
    c->rope_scaling = global.scaling;
    c->rope_factor = global.factor;
    c->rope_low_freq_factor = global.low;
    c->rope_high_freq_factor = global.high;
    c->rope_orig_ctx = global.orig_ctx;
    c->rope_dim = (int32_t)((double)c->head_dim * partial); /* transformers: int(hd * factor) */
    return KILN_OK;
}

static kiln_status hf_act(hf_ctx *h, const char *key, kiln_act *out) {
    const char *act = json_string_value(json_object_get(h->root, key));
    if (!act) return KILN_OK; /* keep the family default */
    if (!strcmp(act, "silu") || !strcmp(act, "swish"))
        *out = KILN_ACT_SILU;
    else if (!strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_new"))
        *out = KILN_ACT_GELU_TANH;
    else if (!strcmp(act, "gelu"))
        *out = KILN_ACT_GELU_ERF;
    else
        return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                              "%s: %s '%s' is not supported (supported: silu, gelu, "
                              "gelu_pytorch_tanh, gelu_new)",
                              h->path, key, act);
    return KILN_OK;
}

/* layer_types: full_attention | sliding_attention | linear_attention, one per layer. */
static kiln_status hf_layer_types(hf_ctx *h, json_t *lt, int32_t window, bool allow_linear) {
    kiln_model_config *c = h->cfg;
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layer)
        return kiln_error_set(h->err, KILN_ERR_FORMAT,
                              "%s: layer_types must be an array of num_hidden_layers (%d) strings",
                              h->path, c->n_layer);
    for (int32_t l = 0; l < c->n_layer; l++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)l));
        kiln_layer_config *L = &c->layer[l];
        if (t && !strcmp(t, "full_attention")) {
            L->sliding_window = 0;
        } else if (t && !strcmp(t, "sliding_attention")) {
            if (window <= 0)
                return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                      "%s: layer %d is a sliding_attention layer but "
                                      "sliding_window is not a positive integer",
                                      h->path, l);
            L->sliding_window = window;
        } else if (t && allow_linear && !strcmp(t, "linear_attention")) {
            L->mixer = KILN_MIXER_GATED_DELTA_NET;
        } else {
            return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                                  "%s: layer_types[%d] = '%s' is not supported for this "
                                  "model_type",
                                  h->path, l, t ? t : "(not a string)");
        }
    }
    return KILN_OK;
}

/* MoE layer placement as Qwen2/3-MoE and Qwen3-Next: sparse unless listed in mlp_only_layers,
 * and only every decoder_sparse_step-th layer ((l + 1) % step == 0). */
static kiln_status hf_moe_layers(hf_ctx *h) {
    kiln_model_config *c = h->cfg;
    int32_t step = 1;
    json_get_int(h->root, "decoder_sparse_step", &step);
    if (step < 1)
        return kiln_error_set(h->err, KILN_ERR_FORMAT, "%s: decoder_sparse_step must be >= 1",
                              h->path);
    json_t *only = json_object_get(h->root, "mlp_only_layers");
    if (only && !json_is_array(only) && !json_is_null(only))
        return kiln_error_set(h->err, KILN_ERR_FORMAT, "%s: mlp_only_layers must be an array",
                              h->path);
    for (int32_t l = 0; l < c->n_layer; l++) {
        bool dense_only = false;
        for (size_t i = 0; i < json_array_size(only); i++)
            if (json_is_integer(json_array_get(only, i)) &&
                json_integer_value(json_array_get(only, i)) == l)
                dense_only = true;
        c->layer[l].moe = !dense_only && c->n_expert > 0 && (l + 1) % step == 0;
    }
    return KILN_OK;
}

static int32_t hf_sliding_window(hf_ctx *h) {
    int32_t w = 0;
    if (!json_get_int(h->root, "sliding_window", &w) || w < 0) w = 0;
    return w;
}

/* Fields shared by the Llama-like families. */
static kiln_status hf_common(hf_ctx *h) {
    kiln_model_config *c = h->cfg;
    kiln_status st;
    if ((st = hf_req_int(h, "vocab_size", &c->n_vocab))) return st;
    if ((st = hf_req_int(h, "hidden_size", &c->n_embd))) return st;
    if ((st = hf_req_int(h, "num_hidden_layers", &c->n_layer))) return st;
    if ((st = hf_req_int(h, "num_attention_heads", &c->n_head))) return st;
    json_get_int(h->root, "intermediate_size", &c->n_ff);
    if (c->n_layer <= 0 || c->n_layer > KILN_MAX_LAYERS)
        return kiln_error_set(h->err, c->n_layer <= 0 ? KILN_ERR_FORMAT : KILN_ERR_UNSUPPORTED,
                              "%s: num_hidden_layers = %d (kiln supports 1..%d)", h->path,
                              c->n_layer, KILN_MAX_LAYERS);
    c->n_head_kv = c->n_head;
    json_get_int(h->root, "num_key_value_heads", &c->n_head_kv);
    c->head_dim = c->n_head > 0 ? c->n_embd / c->n_head : 0;
    json_get_int(h->root, "head_dim", &c->head_dim); /* null keeps the default */
    json_get_int(h->root, "max_position_embeddings", &c->n_ctx_train);
    json_get_num(h->root, "rms_norm_eps", &c->norm_eps);
    json_t *tie = json_object_get(h->root, "tie_word_embeddings");
    c->tied_embeddings = json_is_true(tie);
    c->bos_id = json_first_id(json_object_get(h->root, "bos_token_id"));
    c->eos_id = json_first_id(json_object_get(h->root, "eos_token_id"));
    if ((st = hf_act(h, "hidden_act", &c->act))) return st;
    if (json_get_bool(h->root, "mlp_bias", false))
        return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED, "%s: mlp_bias is not supported",
                              h->path);
    if (json_get_bool(h->root, "use_bidirectional_attention", false))
        return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                              "%s: use_bidirectional_attention is not supported (causal only)",
                              h->path);
    if (json_get_bool(h->root, "attention_bias", false)) c->attn_bias_qkv = c->attn_bias_o = true;
    return hf_rope(h);
}

/* Qwen2/Qwen3 windows: layer_types when given, else use_sliding_window and sliding_window
 * from layer max_window_layers on (transformers 4.x Qwen2Config's layer_types default). */
static kiln_status hf_qwen_windows(hf_ctx *h) {
    json_t *lt = json_object_get(h->root, "layer_types");
    int32_t w = hf_sliding_window(h);
    if (json_is_array(lt)) return hf_layer_types(h, lt, w, false);
    if (json_get_bool(h->root, "use_sliding_window", false) && w > 0) {
        int32_t from = 0;
        json_get_int(h->root, "max_window_layers", &from);
        for (int32_t l = from < 0 ? 0 : from; l < h->cfg->n_layer; l++)
            h->cfg->layer[l].sliding_window = w;
    }
    return KILN_OK;
}

static kiln_status hf_gemma(hf_ctx *h, bool gemma3) {
    kiln_model_config *c = h->cfg;
    kiln_status st;
    c->act = KILN_ACT_GELU_TANH;
    /* Gemma's MLP reads hidden_activation (hidden_act in early configs). */
    if (json_is_string(json_object_get(h->root, "hidden_activation"))) {
        if ((st = hf_act(h, "hidden_activation", &c->act))) return st;
    }
    c->norm_unit_offset = true;
    c->sandwich_norms = true;
    c->embed_scale = (float)sqrt((double)c->n_embd); /* hidden_size**0.5 in the model dtype */
    double qpas_d = 0;
    if (json_get_dbl(h->root, "query_pre_attn_scalar", &qpas_d)) {
        if (!(qpas_d > 0))
            return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                  "%s: query_pre_attn_scalar must be positive", h->path);
        c->attn_score_div = (float)sqrt(qpas_d);
    }
    json_get_num(h->root, "attn_logit_softcapping", &c->attn_softcap);
    json_get_num(h->root, "final_logit_softcapping", &c->final_softcap);
    int32_t w = hf_sliding_window(h);
    json_t *lt = json_object_get(h->root, "layer_types");
    if (json_is_array(lt)) {
        if ((st = hf_layer_types(h, lt, w, false))) return st;
    } else {
        int32_t pattern = 2; /* Gemma 2: sliding on even layers (l + 1) % 2 != 0 */
        if (gemma3) {
            pattern = 6;
            if (!json_get_int(h->root, "sliding_window_pattern", &pattern))
                json_get_int(h->root, "_sliding_window_pattern", &pattern);
        }
        if (pattern < 1)
            return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                  "%s: sliding_window_pattern must be >= 1", h->path);
        for (int32_t l = 0; l < c->n_layer; l++)
            if ((l + 1) % pattern != 0) {
                if (w <= 0)
                    return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                          "%s: sliding layers need a positive sliding_window",
                                          h->path);
                c->layer[l].sliding_window = w;
            }
    }
    if (gemma3) {
        /* Gemma 3: sliding (local) layers rotate with their own base, unscaled. */
        c->qk_norm = true;
        if (c->rope_theta_local == 0.0f) c->rope_theta_local = 10000.0f; /* Gemma3 default */
        for (int32_t l = 0; l < c->n_layer; l++)
            c->layer[l].rope_local = c->layer[l].sliding_window > 0;
    }
    return KILN_OK;
}

static kiln_status hf_gpt2(hf_ctx *h) {
    kiln_model_config *c = h->cfg;
    kiln_status st;
    if ((st = hf_req_int(h, "vocab_size", &c->n_vocab))) return st;
    if ((st = hf_req_int(h, "n_embd", &c->n_embd))) return st;
    if ((st = hf_req_int(h, "n_layer", &c->n_layer))) return st;
    if ((st = hf_req_int(h, "n_head", &c->n_head))) return st;
    if (c->n_layer <= 0 || c->n_layer > KILN_MAX_LAYERS)
        return kiln_error_set(h->err, c->n_layer <= 0 ? KILN_ERR_FORMAT : KILN_ERR_UNSUPPORTED,
                              "%s: n_layer = %d (kiln supports 1..%d)", h->path, c->n_layer,
                              KILN_MAX_LAYERS);
    c->n_ff = 4 * c->n_embd;
    json_get_int(h->root, "n_inner", &c->n_ff);
    if (!json_get_int(h->root, "n_positions", &c->n_ctx_train))
        json_get_int(h->root, "n_ctx", &c->n_ctx_train);
    if (c->n_ctx_train <= 0)
        return kiln_error_set(h->err, KILN_ERR_FORMAT, "%s: n_positions must be positive", h->path);
    c->n_head_kv = c->n_head;
    c->head_dim = c->n_head > 0 ? c->n_embd / c->n_head : 0;
    if (c->n_head > 0 && c->n_embd % c->n_head != 0)
        return kiln_error_set(h->err, KILN_ERR_FORMAT, "%s: n_embd is not a multiple of n_head",
                              h->path);
    c->norm_kind = KILN_NORM_LAYER;
    json_get_num(h->root, "layer_norm_epsilon", &c->norm_eps);
    c->rope_style = KILN_ROPE_NONE;
    c->learned_pos = true;
    c->ffn_gated = false;
    c->ffn_bias = true;
    c->attn_bias_qkv = c->attn_bias_o = true;
    c->act = KILN_ACT_GELU_TANH; /* gelu_new is GPT2Config's default */
    if ((st = hf_act(h, "activation_function", &c->act))) return st;
    if (!json_get_bool(h->root, "scale_attn_weights", true)) c->attn_score_div = 1.0f;
    c->attn_scale_inv_layer = json_get_bool(h->root, "scale_attn_by_inverse_layer_idx", false);
    if (json_get_bool(h->root, "add_cross_attention", false))
        return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                              "%s: add_cross_attention (encoder-decoder GPT-2) is not supported",
                              h->path);
    json_t *tie = json_object_get(h->root, "tie_word_embeddings");
    c->tied_embeddings = tie ? json_is_true(tie) : true;
    c->bos_id = json_first_id(json_object_get(h->root, "bos_token_id"));
    c->eos_id = json_first_id(json_object_get(h->root, "eos_token_id"));
    return KILN_OK;
}

static kiln_status hf_qwen3_next(hf_ctx *h) {
    kiln_model_config *c = h->cfg;
    kiln_status st;
    c->qk_norm = true;
    c->attn_out_gate = true;
    c->norm_unit_offset = true;
    json_t *lt = json_object_get(h->root, "layer_types");
    if (json_is_array(lt)) {
        if ((st = hf_layer_types(h, lt, 0, true))) return st;
    } else {
        int32_t interval = 4;
        json_get_int(h->root, "full_attention_interval", &interval);
        if (interval < 1)
            return kiln_error_set(h->err, KILN_ERR_FORMAT,
                                  "%s: full_attention_interval must be >= 1", h->path);
        for (int32_t l = 0; l < c->n_layer; l++)
            if ((l + 1) % interval != 0) c->layer[l].mixer = KILN_MIXER_GATED_DELTA_NET;
    }
    if ((st = hf_req_int(h, "linear_conv_kernel_dim", &c->ssm_conv_kernel))) return st;
    if ((st = hf_req_int(h, "linear_num_key_heads", &c->ssm_n_k_heads))) return st;
    if ((st = hf_req_int(h, "linear_num_value_heads", &c->ssm_n_v_heads))) return st;
    if ((st = hf_req_int(h, "linear_key_head_dim", &c->ssm_k_head_dim))) return st;
    if ((st = hf_req_int(h, "linear_value_head_dim", &c->ssm_v_head_dim))) return st;
    json_get_int(h->root, "num_experts", &c->n_expert);
    json_get_int(h->root, "num_experts_per_tok", &c->n_expert_used);
    json_get_int(h->root, "moe_intermediate_size", &c->n_ff_expert);
    json_get_int(h->root, "shared_expert_intermediate_size", &c->n_ff_shexp);
    c->shexp_gate = c->n_ff_shexp > 0;
    c->expert_norm_topk = json_get_bool(h->root, "norm_topk_prob", true);
    return hf_moe_layers(h);
}

typedef struct hf_family {
    const char *model_type;
    kiln_arch arch;
} hf_family;

static const hf_family HF_FAMILIES[] = {
    {"llama", KILN_ARCH_LLAMA},
    {"mistral", KILN_ARCH_MISTRAL},
    {"qwen2", KILN_ARCH_QWEN2},
    {"qwen3", KILN_ARCH_QWEN3},
    {"gemma2", KILN_ARCH_GEMMA2},
    {"gemma3_text", KILN_ARCH_GEMMA3},
    {"phi3", KILN_ARCH_PHI3},
    {"mixtral", KILN_ARCH_MIXTRAL},
    {"qwen3_moe", KILN_ARCH_QWEN3_MOE},
    {"gpt2", KILN_ARCH_GPT2},
    {"qwen3_next", KILN_ARCH_QWEN3_NEXT},
};

static kiln_status hf_family_config(hf_ctx *h) {
    kiln_model_config *c = h->cfg;
    kiln_status st;
    if (c->arch == KILN_ARCH_GPT2) return hf_gpt2(h);
    if ((st = hf_common(h))) return st;
    switch (c->arch) {
    case KILN_ARCH_LLAMA:
        break;
    case KILN_ARCH_MISTRAL:
    case KILN_ARCH_PHI3:
    case KILN_ARCH_MIXTRAL: {
        /* These families window every layer when sliding_window is set. */
        int32_t w = hf_sliding_window(h);
        for (int32_t l = 0; l < c->n_layer; l++) c->layer[l].sliding_window = w;
        if (c->arch == KILN_ARCH_PHI3) c->attn_bias_qkv = c->attn_bias_o = false;
        if (c->arch == KILN_ARCH_MIXTRAL) {
            json_get_int(h->root, "num_local_experts", &c->n_expert);
            json_get_int(h->root, "num_experts_per_tok", &c->n_expert_used);
            c->n_ff_expert = c->n_ff;
            c->expert_norm_topk = true; /* Mixtral always renormalises the top-k weights */
            for (int32_t l = 0; l < c->n_layer; l++) c->layer[l].moe = 1;
        }
        break;
    }
    case KILN_ARCH_QWEN2:
        c->attn_bias_qkv = true; /* Qwen2: q/k/v with bias, o without */
        c->attn_bias_o = false;
        if ((st = hf_qwen_windows(h))) return st;
        break;
    case KILN_ARCH_QWEN3:
        c->qk_norm = true;
        if ((st = hf_qwen_windows(h))) return st;
        break;
    case KILN_ARCH_QWEN3_MOE:
        c->qk_norm = true;
        if (json_is_array(json_object_get(h->root, "layer_types"))) {
            if ((st = hf_qwen_windows(h))) return st;
        } else if (json_get_bool(h->root, "use_sliding_window", false) &&
                   hf_sliding_window(h) > 0) {
            return kiln_error_set(h->err, KILN_ERR_UNSUPPORTED,
                                  "%s: use_sliding_window without layer_types is not supported "
                                  "for qwen3_moe",
                                  h->path);
        }
        if (!json_get_int(h->root, "num_experts", &c->n_expert))
            json_get_int(h->root, "num_local_experts", &c->n_expert);
        json_get_int(h->root, "num_experts_per_tok", &c->n_expert_used);
        json_get_int(h->root, "moe_intermediate_size", &c->n_ff_expert);
        c->expert_norm_topk = json_get_bool(h->root, "norm_topk_prob", false);
        if ((st = hf_moe_layers(h))) return st;
        break;
    case KILN_ARCH_GEMMA2:
        return hf_gemma(h, false);
    case KILN_ARCH_GEMMA3:
        return hf_gemma(h, true);
    case KILN_ARCH_QWEN3_NEXT:
        return hf_qwen3_next(h);
    case KILN_ARCH_GPT2:
        break;
    }
    return KILN_OK;
}

kiln_status kiln_config_from_hf(const char *path, kiln_model_config *cfg, kiln_error *err) {
    kiln_config_defaults(cfg);
    cfg->source = KILN_SOURCE_HF;
    cfg->rope_style = KILN_ROPE_HALF;
    json_t *root;
    kiln_status jst = kiln_json_load_path(path, JSON_REJECT_DUPLICATES, &root, err);
    if (jst) return jst;
    kiln_status st = KILN_OK;
    hf_ctx h = {path, root, cfg, err};
    if (!json_is_object(root)) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: top level is not a JSON object", path);
        goto done;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    const hf_family *fam = NULL;
    for (size_t i = 0; mt && i < sizeof HF_FAMILIES / sizeof HF_FAMILIES[0]; i++)
        if (!strcmp(mt, HF_FAMILIES[i].model_type)) fam = &HF_FAMILIES[i];
    if (!fam) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: model_type '%s' is not supported (supported: llama, mistral, "
                            "qwen2, qwen3, gemma2, gemma3_text, phi3, mixtral, qwen3_moe, gpt2, "
                            "qwen3_next)",
                            path, mt ? mt : "(missing)");
        goto done;
    }
    cfg->arch = fam->arch;
    if ((st = hf_family_config(&h))) goto done;
    kiln_config_finish(cfg);
    st = kiln_config_validate(cfg, path, err);
done:
    json_decref(root);
    return st;
}
