#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "util/error.h"

static void config_defaults(kiln_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = KILN_ARCH_LLAMA;
    cfg->norm_eps = 1e-5f;
    cfg->rope_theta = 10000.0f;
    cfg->rope_style = KILN_ROPE_ADJACENT;
    cfg->rope_scaling = KILN_ROPE_SCALING_NONE;
    cfg->bos_id = -1;
    cfg->eos_id = -1;
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
    POS(n_ff)
#undef POS
    if (c->n_head % c->n_head_kv != 0)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: n_head (%d) is not a multiple of n_head_kv (%d)", what,
                              c->n_head, c->n_head_kv);
    if (c->head_dim % 2 != 0)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: head_dim (%d) must be even for RoPE",
                              what, c->head_dim);
    if (c->n_layer > 4096 || c->n_embd > (1 << 20) || c->n_head > 4096 || c->n_ff > (1 << 22) ||
        c->head_dim > 4096)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: implausible model dimensions", what);
    if (!(c->norm_eps > 0.0f) || !(c->rope_theta > 0.0f))
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: norm epsilon and rope theta must be positive", what);
    return KILN_OK;
}

/* ---- GGUF ---------------------------------------------------------------------------- */

static kiln_status gguf_req_i32(const kiln_gguf *g, const char *key, int32_t *out,
                                kiln_error *err) {
    int64_t v;
    if (!kiln_gguf_get_i64(g, key, &v))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: metadata key '%s' is missing or not an integer",
                              g->path, key);
    if (v <= 0 || v > INT32_MAX)
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: metadata key '%s' = %lld is out of range",
                              g->path, key, (long long)v);
    *out = (int32_t)v;
    return KILN_OK;
}

kiln_status kiln_config_from_gguf(const kiln_gguf *g, kiln_model_config *cfg, kiln_error *err) {
    config_defaults(cfg);
    cfg->source = KILN_SOURCE_GGUF;
    const kiln_gguf_str *arch = kiln_gguf_get_str(g, "general.architecture");
    if (!arch)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: metadata key 'general.architecture' is missing", g->path);
    if (strcmp(arch->data, "llama") != 0)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: architecture '%s' is not supported (supported: llama)", g->path,
                              arch->data);
    kiln_status st;
    if ((st = gguf_req_i32(g, "llama.embedding_length", &cfg->n_embd, err))) return st;
    if ((st = gguf_req_i32(g, "llama.block_count", &cfg->n_layer, err))) return st;
    if ((st = gguf_req_i32(g, "llama.attention.head_count", &cfg->n_head, err))) return st;
    if ((st = gguf_req_i32(g, "llama.feed_forward_length", &cfg->n_ff, err))) return st;
    cfg->n_head_kv = cfg->n_head;
    int64_t v;
    if (kiln_gguf_get_i64(g, "llama.attention.head_count_kv", &v)) {
        if (v <= 0 || v > INT32_MAX)
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: llama.attention.head_count_kv = %lld is out of range",
                                  g->path, (long long)v);
        cfg->n_head_kv = (int32_t)v;
    }
    cfg->head_dim = cfg->n_embd / cfg->n_head;
    if (kiln_gguf_get_i64(g, "llama.attention.key_length", &v) && v > 0 && v < 65536)
        cfg->head_dim = (int32_t)v;
    if (kiln_gguf_get_i64(g, "llama.rope.dimension_count", &v) && v != cfg->head_dim)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: llama.rope.dimension_count = %lld (partial rotary) is not "
                              "supported; head_dim is %d",
                              g->path, (long long)v, cfg->head_dim);
    if (kiln_gguf_get_i64(g, "llama.context_length", &v) && v > 0 && v <= INT32_MAX)
        cfg->n_ctx_train = (int32_t)v;
    float f;
    if (kiln_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f)) cfg->norm_eps = f;
    if (kiln_gguf_get_f32(g, "llama.rope.freq_base", &f)) cfg->rope_theta = f;
    const kiln_gguf_str *stype = kiln_gguf_get_str(g, "llama.rope.scaling.type");
    if (stype && strcmp(stype->data, "none") != 0 && strcmp(stype->data, "linear") != 0)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: llama.rope.scaling.type '%s' is not supported", g->path,
                              stype->data);
    if (stype && strcmp(stype->data, "linear") == 0 &&
        kiln_gguf_get_f32(g, "llama.rope.scaling.factor", &f) && f != 1.0f)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: linear rope scaling (factor %g) is not supported", g->path, f);
    /* n_vocab: llama.vocab_size, else rows of token_embd.weight */
    if (kiln_gguf_get_i64(g, "llama.vocab_size", &v) && v > 0 && v <= INT32_MAX) {
        cfg->n_vocab = (int32_t)v;
    } else {
        const kiln_gguf_tensor *te = kiln_gguf_find_tensor(g, "token_embd.weight");
        if (!te || te->n_dims != 2 || te->ne[1] > INT32_MAX)
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: cannot determine the vocabulary size (no llama.vocab_size "
                                  "and no 2-D token_embd.weight)",
                                  g->path);
        cfg->n_vocab = (int32_t)te->ne[1];
    }
    cfg->tied_embeddings = kiln_gguf_find_tensor(g, "output.weight") == NULL;
    uint32_t u;
    if (kiln_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u)) cfg->bos_id = (int32_t)u;
    if (kiln_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u)) cfg->eos_id = (int32_t)u;
    return kiln_config_validate(cfg, g->path, err);
}

/* ---- llama2.c ------------------------------------------------------------------------ */

void kiln_config_from_llama2c(const kiln_llama2c_config *c, kiln_model_config *cfg) {
    config_defaults(cfg);
    cfg->source = KILN_SOURCE_LLAMA2C;
    cfg->n_vocab = c->vocab_size;
    cfg->n_embd = c->dim;
    cfg->n_layer = c->n_layers;
    cfg->n_head = c->n_heads;
    cfg->n_head_kv = c->n_kv_heads;
    cfg->head_dim = c->dim / c->n_heads;
    cfg->n_ff = c->hidden_dim;
    cfg->n_ctx_train = c->seq_len;
    cfg->tied_embeddings = c->shared_classifier;
    cfg->bos_id = 1; /* run.c: BOS=1, EOS=2 */
    cfg->eos_id = 2;
}

/* ---- Hugging Face config.json -------------------------------------------------------- */

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

static kiln_status hf_req_int(json_t *o, const char *path, const char *key, int32_t *out,
                              kiln_error *err) {
    if (!json_get_int(o, key, out))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: field '%s' is missing or not an integer",
                              path, key);
    return KILN_OK;
}

/* First id of an int or [int, ...] field, or -1. */
static int32_t json_first_id(json_t *v) {
    if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0);
    if (json_is_integer(v)) return (int32_t)json_integer_value(v);
    return -1;
}

static kiln_status hf_rope(json_t *root, const char *path, kiln_model_config *cfg,
                           kiln_error *err) {
    /* transformers 5.x: rope_parameters {rope_theta, rope_type, ...};
     * transformers 4.x: rope_theta + rope_scaling {rope_type|type, ...} or null. */
    json_t *params = json_object_get(root, "rope_parameters");
    json_t *scaling = json_object_get(root, "rope_scaling");
    json_get_num(root, "rope_theta", &cfg->rope_theta);
    json_t *p = json_is_object(params) ? params : (json_is_object(scaling) ? scaling : NULL);
    if (!p) return KILN_OK;
    json_get_num(p, "rope_theta", &cfg->rope_theta);
    const char *type = json_string_value(json_object_get(p, "rope_type"));
    if (!type) type = json_string_value(json_object_get(p, "type"));
    if (!type || strcmp(type, "default") == 0) return KILN_OK;
    if (strcmp(type, "llama3") == 0) {
        cfg->rope_scaling = KILN_ROPE_SCALING_LLAMA3;
        if (!json_get_num(p, "factor", &cfg->rope_factor) ||
            !json_get_num(p, "low_freq_factor", &cfg->rope_low_freq_factor) ||
            !json_get_num(p, "high_freq_factor", &cfg->rope_high_freq_factor) ||
            !json_get_int(p, "original_max_position_embeddings", &cfg->rope_orig_ctx))
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: llama3 rope scaling needs factor, low_freq_factor, "
                                  "high_freq_factor and original_max_position_embeddings",
                                  path);
        if (!(cfg->rope_factor > 0) || !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
            cfg->rope_orig_ctx <= 0)
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: llama3 rope scaling values are out of range",
                                  path);
        return KILN_OK;
    }
    return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: rope_type '%s' is not supported "
                          "(supported: default, llama3)", path, type);
}

kiln_status kiln_config_from_hf(const char *path, kiln_model_config *cfg, kiln_error *err) {
    config_defaults(cfg);
    cfg->source = KILN_SOURCE_HF;
    cfg->rope_style = KILN_ROPE_HALF;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        kiln_status st = (jerr.line == -1 && jerr.position == 0) ? KILN_ERR_IO : KILN_ERR_FORMAT;
        return kiln_error_set(err, st, "%s: line %d, column %d: %s", path, jerr.line, jerr.column,
                              jerr.text);
    }
    kiln_status st = KILN_OK;
    if (!json_is_object(root)) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: top level is not a JSON object", path);
        goto done;
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!mt || strcmp(mt, "llama") != 0) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: model_type '%s' is not supported (supported: llama)", path,
                            mt ? mt : "(missing)");
        goto done;
    }
    if ((st = hf_req_int(root, path, "vocab_size", &cfg->n_vocab, err))) goto done;
    if ((st = hf_req_int(root, path, "hidden_size", &cfg->n_embd, err))) goto done;
    if ((st = hf_req_int(root, path, "num_hidden_layers", &cfg->n_layer, err))) goto done;
    if ((st = hf_req_int(root, path, "num_attention_heads", &cfg->n_head, err))) goto done;
    if ((st = hf_req_int(root, path, "intermediate_size", &cfg->n_ff, err))) goto done;
    cfg->n_head_kv = cfg->n_head;
    json_get_int(root, "num_key_value_heads", &cfg->n_head_kv);
    cfg->head_dim = cfg->n_head > 0 ? cfg->n_embd / cfg->n_head : 0;
    json_get_int(root, "head_dim", &cfg->head_dim);
    json_get_int(root, "max_position_embeddings", &cfg->n_ctx_train);
    json_get_num(root, "rms_norm_eps", &cfg->norm_eps);
    cfg->tied_embeddings = json_is_true(json_object_get(root, "tie_word_embeddings"));
    cfg->bos_id = json_first_id(json_object_get(root, "bos_token_id"));
    cfg->eos_id = json_first_id(json_object_get(root, "eos_token_id"));
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu") != 0) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (silu only)",
                            path, act);
        goto done;
    }
    if (json_is_true(json_object_get(root, "attention_bias")) ||
        json_is_true(json_object_get(root, "mlp_bias"))) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: attention_bias / mlp_bias are not supported for llama", path);
        goto done;
    }
    if ((st = hf_rope(root, path, cfg, err))) goto done;
    st = kiln_config_validate(cfg, path, err);
done:
    json_decref(root);
    return st;
}
