/*
 * config_gguf.c - kiln_config_from_gguf: a config from GGUF metadata, with llama.cpp's keys and
 * defaults (config.h).
 */
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/config_internal.h"
#include "util/error.h"

/* Metadata "<arch>.<suffix>". */
typedef struct gguf_ctx {
    const kiln_gguf *g;
    const char *arch;
    kiln_error *err;
} gguf_ctx;

static const char *gkey(const gguf_ctx *x, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", x->arch, suffix);
    return buf;
}

/* Optional positive integer "<arch>.<suffix>": false when absent; an error (status in *st)
 * when present but not a scalar integer in (0, INT32_MAX] (per-layer arrays included). */
static bool gguf_opt_i32(const gguf_ctx *x, const char *suffix, int32_t *out, kiln_status *st) {
    char key[160];
    gkey(x, suffix, key, sizeof key);
    if (!kiln_gguf_find(x->g, key)) return false;
    int64_t v;
    if (!kiln_gguf_get_i64(x->g, key, &v) || v <= 0 || v > INT32_MAX) {
        *st = kiln_error_set(x->err, KILN_ERR_UNSUPPORTED,
                             "%s: metadata key '%s' is not a positive integer (per-layer "
                             "arrays are not supported)",
                             x->g->path, key);
        return false;
    }
    *out = (int32_t)v;
    return true;
}

static kiln_status gguf_req_i32(const gguf_ctx *x, const char *suffix, int32_t *out) {
    kiln_status st = KILN_OK;
    if (gguf_opt_i32(x, suffix, out, &st)) return KILN_OK;
    if (st) return st;
    char key[160];
    return kiln_error_set(x->err, KILN_ERR_FORMAT, "%s: metadata key '%s' is missing", x->g->path,
                          gkey(x, suffix, key, sizeof key));
}

static bool gguf_opt_f32(const gguf_ctx *x, const char *suffix, float *out) {
    char key[160];
    return kiln_gguf_get_f32(x->g, gkey(x, suffix, key, sizeof key), out);
}

typedef struct gguf_family {
    const char *name; /* general.architecture */
    kiln_arch arch;
} gguf_family;

static const gguf_family GGUF_FAMILIES[] = {
    {"llama", KILN_ARCH_LLAMA},        {"qwen2", KILN_ARCH_QWEN2},   {"qwen3", KILN_ARCH_QWEN3},
    {"qwen3moe", KILN_ARCH_QWEN3_MOE}, {"gemma2", KILN_ARCH_GEMMA2}, {"gemma3", KILN_ARCH_GEMMA3},
    {"phi3", KILN_ARCH_PHI3},          {"gpt2", KILN_ARCH_GPT2},
};

/* Sliding window every `period` layers as llama.cpp's set_swa_pattern: layer l is windowed
 * when l % period < period - 1 (Gemma 2: period 2, even layers; Gemma 3: 5 of every 6). */
static void gguf_swa_pattern(kiln_model_config *c, int32_t window, int32_t period, bool local) {
    for (int32_t l = 0; l < c->n_layer; l++)
        if (period <= 1 || l % period < period - 1) {
            c->layer[l].sliding_window = window;
            c->layer[l].rope_local = local;
        }
}

kiln_status kiln_config_from_gguf(const kiln_gguf *g, kiln_model_config *cfg, kiln_error *err) {
    kiln_config_defaults(cfg);
    cfg->source = KILN_SOURCE_GGUF;
    const kiln_gguf_str *an = kiln_gguf_get_str(g, "general.architecture");
    if (!an)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: metadata key 'general.architecture' is missing", g->path);
    const gguf_family *fam = NULL;
    for (size_t i = 0; i < sizeof GGUF_FAMILIES / sizeof GGUF_FAMILIES[0]; i++)
        if (!strcmp(an->data, GGUF_FAMILIES[i].name)) fam = &GGUF_FAMILIES[i];
    if (!fam)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: architecture '%s' is not supported from GGUF (supported: "
                              "llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt2)",
                              g->path, an->data);
    gguf_ctx x = {g, fam->name, err};
    kiln_model_config *c = cfg;
    c->arch = fam->arch;
    kiln_status st = KILN_OK;
    if ((st = gguf_req_i32(&x, "embedding_length", &c->n_embd))) return st;
    if ((st = gguf_req_i32(&x, "block_count", &c->n_layer))) return st;
    if ((st = gguf_req_i32(&x, "attention.head_count", &c->n_head))) return st;
    if ((st = gguf_req_i32(&x, "feed_forward_length", &c->n_ff))) return st;
    if (c->n_layer > KILN_MAX_LAYERS)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: %d layers; kiln supports at most %d",
                              g->path, c->n_layer, KILN_MAX_LAYERS);
    c->n_head_kv = c->n_head;
    gguf_opt_i32(&x, "attention.head_count_kv", &c->n_head_kv, &st);
    if (st) return st;
    c->head_dim = c->n_embd / c->n_head;
    gguf_opt_i32(&x, "attention.key_length", &c->head_dim, &st);
    if (st) return st;
    int32_t vlen = c->head_dim;
    gguf_opt_i32(&x, "attention.value_length", &vlen, &st);
    if (st) return st;
    if (vlen != c->head_dim)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: attention.value_length %d differs from key_length %d", g->path,
                              vlen, c->head_dim);
    gguf_opt_i32(&x, "rope.dimension_count", &c->rope_dim, &st);
    if (st) return st;
    gguf_opt_i32(&x, "context_length", &c->n_ctx_train, &st);
    if (st) return st;
    float f;
    if (!gguf_opt_f32(&x, "attention.layer_norm_rms_epsilon", &c->norm_eps))
        gguf_opt_f32(&x, "attention.layer_norm_epsilon", &c->norm_eps);
    gguf_opt_f32(&x, "rope.freq_base", &c->rope_theta);
    char key[160];
    const kiln_gguf_str *stype =
        kiln_gguf_get_str(g, gkey(&x, "rope.scaling.type", key, sizeof key));
    if (stype && strcmp(stype->data, "none") != 0) {
        if (strcmp(stype->data, "linear") != 0)
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "%s: %s.rope.scaling.type '%s' is not supported (none, linear)",
                                  g->path, x.arch, stype->data);
        if (gguf_opt_f32(&x, "rope.scaling.factor", &f) && f != 1.0f) {
            if (!(f > 0.0f))
                return kiln_error_set(err, KILN_ERR_FORMAT, "%s: rope.scaling.factor %g", g->path,
                                      f);
            c->rope_scaling = KILN_ROPE_SCALING_LINEAR;
            c->rope_factor = f;
        }
    }
    if (gguf_opt_f32(&x, "expert_weights_scale", &f) && f != 1.0f)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: %s.expert_weights_scale %g is not supported", g->path, x.arch,
                              f);
    /* MoE */
    gguf_opt_i32(&x, "expert_count", &c->n_expert, &st);
    if (st) return st;
    gguf_opt_i32(&x, "expert_used_count", &c->n_expert_used, &st);
    if (st) return st;
    /* llama.cpp's rope: NORM (adjacent pairs, Q/K rows permuted at conversion) for llama,
     * NEOX (half split, HF order) for the others */
    c->rope_style = c->arch == KILN_ARCH_LLAMA ? KILN_ROPE_ADJACENT : KILN_ROPE_HALF;
    switch (c->arch) {
    case KILN_ARCH_LLAMA:
        if (c->n_expert > 0) { /* Mixtral-style: every layer MoE, top-k renormalised */
            c->arch = KILN_ARCH_MIXTRAL;
            c->n_ff_expert = c->n_ff;
            c->expert_norm_topk = true;
            for (int32_t l = 0; l < c->n_layer; l++) c->layer[l].moe = 1;
        }
        break;
    case KILN_ARCH_QWEN2:
        c->attn_bias_qkv = true;
        break;
    case KILN_ARCH_QWEN3:
        c->qk_norm = true;
        break;
    case KILN_ARCH_QWEN3_MOE:
        c->qk_norm = true;
        gguf_opt_i32(&x, "expert_feed_forward_length", &c->n_ff_expert, &st);
        if (st) return st;
        if (c->n_ff_expert <= 0 && c->n_expert_used > 0)
            c->n_ff_expert = c->n_ff / c->n_expert_used;
        c->expert_norm_topk = true; /* llama.cpp build_moe_ffn(norm_w = true) */
        for (int32_t l = 0; l < c->n_layer; l++) c->layer[l].moe = 1;
        break;
    case KILN_ARCH_GEMMA2:
    case KILN_ARCH_GEMMA3: {
        const bool g3 = c->arch == KILN_ARCH_GEMMA3;
        c->act = KILN_ACT_GELU_TANH;
        c->sandwich_norms = true;
        c->embed_scale = sqrtf((float)c->n_embd);
        /* norms are stored as 1 + w by llama.cpp's conversion */
        int32_t window = 4096, period = g3 ? 6 : 2;
        gguf_opt_i32(&x, "attention.sliding_window", &window, &st);
        if (st) return st;
        gguf_opt_i32(&x, "attention.sliding_window_pattern", &period, &st);
        if (st) return st;
        c->rope_theta_local = g3 ? 10000.0f : c->rope_theta;
        gguf_opt_f32(&x, "rope.freq_base_swa", &c->rope_theta_local);
        gguf_swa_pattern(c, window, period, g3);
        /* llama.cpp: 1/sqrt(n_embd/n_head) for the 27B models (46 / 62 layers), else
         * 1/sqrt(head_dim) (query_pre_attn_scalar is not stored in GGUF) */
        const bool is27b = c->n_layer == (g3 ? 62 : 46);
        c->attn_score_div = sqrtf((float)(is27b ? c->n_embd / c->n_head : c->head_dim));
        if (g3) {
            c->qk_norm = true;
        } else {
            c->attn_softcap = 50.0f;
            c->final_softcap = 30.0f;
            gguf_opt_f32(&x, "attn_logit_softcapping", &c->attn_softcap);
            gguf_opt_f32(&x, "final_logit_softcapping", &c->final_softcap);
        }
        break;
    }
    case KILN_ARCH_PHI3:
        /* llama.cpp disables Phi-3's sliding window (llama.cpp PR 13676); so does kiln */
        if (kiln_gguf_find_tensor(g, "rope_factors_long.weight") ||
            kiln_gguf_find_tensor(g, "rope_factors_short.weight"))
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "%s: Phi-3 long-rope factors (rope_factors_long/short) are not "
                                  "supported",
                                  g->path);
        break;
    case KILN_ARCH_GPT2:
        c->rope_style = KILN_ROPE_NONE;
        c->rope_dim = 0;
        c->norm_kind = KILN_NORM_LAYER;
        c->learned_pos = true;
        c->ffn_gated = false;
        c->ffn_bias = true;
        c->attn_bias_qkv = c->attn_bias_o = true;
        c->act = KILN_ACT_GELU_TANH; /* ggml_gelu */
        if (c->n_ctx_train <= 0)
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: gpt2.context_length is missing",
                                  g->path);
        break;
    default:
        break;
    }
    if (c->n_expert > 0 && !kiln_config_has_moe(c))
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: %s with experts (expert_count %d) is not supported", g->path,
                              x.arch, c->n_expert);
    /* n_vocab: <arch>.vocab_size, else rows of token_embd.weight */
    int64_t v;
    if (kiln_gguf_get_i64(g, gkey(&x, "vocab_size", key, sizeof key), &v) && v > 0 &&
        v <= INT32_MAX) {
        c->n_vocab = (int32_t)v;
    } else {
        const kiln_gguf_tensor *te = kiln_gguf_find_tensor(g, "token_embd.weight");
        if (!te || te->n_dims != 2 || te->ne[1] > INT32_MAX)
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: cannot determine the vocabulary size (no %s.vocab_size "
                                  "and no 2-D token_embd.weight)",
                                  g->path, x.arch);
        c->n_vocab = (int32_t)te->ne[1];
    }
    c->tied_embeddings = kiln_gguf_find_tensor(g, "output.weight") == NULL;
    uint32_t u;
    if (kiln_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u)) c->bos_id = (int32_t)u;
    if (kiln_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u)) c->eos_id = (int32_t)u;
    kiln_config_finish(c);
    return kiln_config_validate(c, g->path, err);
}
