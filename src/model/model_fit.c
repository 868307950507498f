/* model_fit.c - a model's memory needs (model_fit.h). */
#include "model/model_fit.h"

#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/safetensors.h"

int64_t kiln_model_weights_bytes(const kiln_model *m) {
    if (!m) return 0;
    int64_t s = 0;
    if (m->gguf) {
        const kiln_gguf *g = m->gguf;
        for (size_t i = 0; i < g->n_tensors; i++) s += (int64_t)g->tensors[i].nbytes;
    } else if (m->safetensors) {
        const kiln_safetensors *st = m->safetensors;
        for (size_t i = 0; i < st->n_tensors; i++) s += (int64_t)st->tensors[i].nbytes;
    } else if (m->llama2c) {
        const kiln_llama2c_config *c = &((const kiln_llama2c *)m->llama2c)->config;
        int64_t d = c->dim, h = c->hidden_dim, L = c->n_layers, v = c->vocab_size;
        int64_t kvd = d / c->n_heads * c->n_kv_heads;
        int64_t p = v * d + L * (2 * d + d * d + 2 * d * kvd + d * d + 3 * d * h) + d;
        if (!c->shared_classifier) p += v * d;
        s = p * 4;
    }
    return s;
}

bool kiln_model_kv_layout(const kiln_model *m, int32_t block_size, kiln_dtype k_format,
                          kiln_dtype v_format, kiln_kv_fit_layout *out) {
    if (!m || !out || block_size < 1) return false;
    *out = (kiln_kv_fit_layout){.block_size = block_size, .k_format = k_format,
                                .v_format = v_format};
    const kiln_model_config *c = &m->cfg;
    const int64_t kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    bool header = false;
    for (int32_t l = 0; l < c->n_layer; l++) {
        const kiln_layer_config *lc = &c->layer[l];
        bool ok;
        if (lc->mixer == KILN_MIXER_GATED_DELTA_NET) {
            const int64_t conv_dim = 2 * (int64_t)c->ssm_n_k_heads * c->ssm_k_head_dim +
                                     (int64_t)c->ssm_n_v_heads * c->ssm_v_head_dim;
            int64_t floats = conv_dim * (c->ssm_conv_kernel - 1) +
                             (int64_t)c->ssm_n_v_heads * c->ssm_k_head_dim * c->ssm_v_head_dim;
            if (!header) floats += KILN_MODEL_STATE_HEADER_FLOATS, header = true;
            ok = kiln_kv_fit_add(out, KILN_KV_LAYER_RECURRENT, 1, 0, 0, 0, floats * 4);
        } else if (lc->sliding_window > 0) {
            ok = kiln_kv_fit_add(out, KILN_KV_LAYER_SLIDING, 1, kv_dim, c->head_dim,
                                 lc->sliding_window, 0);
        } else {
            ok = kiln_kv_fit_add(out, KILN_KV_LAYER_FULL, 1, kv_dim, c->head_dim, 0, 0);
        }
        if (!ok) return false;
    }
    return true;
}

int64_t kiln_model_scratch_bytes(const kiln_model *m, int32_t step_tokens, int32_t n_ctx) {
    if (!m || step_tokens < 1 || n_ctx < 1) return 0;
    kiln_backend_reserve r = kiln_model_reserve(m, step_tokens, n_ctx);
    return (int64_t)r.act_bytes + (int64_t)step_tokens * m->cfg.n_vocab * 4;
}
