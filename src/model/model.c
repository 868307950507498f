/*
 * model.c - kiln_model_open / kiln_model_close: recognise the source (Hugging Face directory,
 * GGUF file, llama2.c checkpoint), read its config, bind its weights (model_bind.c), load its
 * tokenizer and generation defaults (gen_defaults.c), build the RoPE tables and the recurrent
 * state layout, and last place the weights (weight_placement.h).
 */
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/safetensors.h"
#include "model/model_internal.h"
#include "tokenizer/hf_tokenizer.h"
#include "util/error.h"

/* RoPE inverse frequencies over rope_dim: 1 / theta^(2j/rope_dim) (transformers
 * compute_default_rope_parameters), with llama3 scaling as _compute_llama3_parameters or
 * linear scaling (/ factor), or GGUF rope_freqs.weight factors (divide) as llama.cpp. */
static float *make_rope_table(kiln_model *m, float theta, kiln_rope_scaling scaling,
                              const float *freq_factors) {
    const kiln_model_config *c = &m->cfg;
    const int32_t half = c->rope_dim / 2;
    float *t = kiln_model_alloc(m, (size_t)(half > 0 ? half : 1) * sizeof(float));
    if (!t) return NULL;
    for (int32_t j = 0; j < half; j++) {
        float inv = 1.0f / powf(theta, (float)(2 * j) / (float)c->rope_dim);
        if (scaling == KILN_ROPE_SCALING_LLAMA3) {
            const float two_pi = 6.283185307179586f;
            float low_wavelen = (float)c->rope_orig_ctx / c->rope_low_freq_factor;
            float high_wavelen = (float)c->rope_orig_ctx / c->rope_high_freq_factor;
            float wavelen = two_pi / inv;
            float scaled = wavelen > low_wavelen ? inv / c->rope_factor : inv;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                float smooth = ((float)c->rope_orig_ctx / wavelen - c->rope_low_freq_factor) /
                               (c->rope_high_freq_factor - c->rope_low_freq_factor);
                scaled = (1.0f - smooth) * scaled / c->rope_factor + smooth * scaled;
            }
            inv = scaled;
        } else if (scaling == KILN_ROPE_SCALING_LINEAR) {
            inv = inv / c->rope_factor;
        }
        if (freq_factors) inv = inv / freq_factors[j];
        t[j] = inv;
    }
    return t;
}

static kiln_status init_rope(kiln_model *m, const float *freq_factors, kiln_error *err) {
    const kiln_model_config *c = &m->cfg;
    if (c->rope_style == KILN_ROPE_NONE) return KILN_OK;
    m->inv_freq = make_rope_table(m, c->rope_theta, c->rope_scaling, freq_factors);
    m->inv_freq_local = make_rope_table(m, c->rope_theta_local, KILN_ROPE_SCALING_NONE, NULL);
    if (!m->inv_freq || !m->inv_freq_local) return kiln_model_oom(m, err);
    for (int32_t l = 0; l < c->n_layer; l++)
        m->layers[l].inv_freq = c->layer[l].rope_local ? m->inv_freq_local : m->inv_freq;
    return KILN_OK;
}

/* Per-sequence recurrent state layout: a header, then per gated-delta-net layer its conv
 * window [conv_dim][conv_kernel - 1] and delta-rule state [n_v_heads][k_head_dim][v_head_dim]. */
#define KILN_STATE_HEADER_FLOATS 16
static void init_state_layout(kiln_model *m) {
    const kiln_model_config *c = &m->cfg;
    int64_t off = KILN_STATE_HEADER_FLOATS;
    bool any = false;
    for (int32_t l = 0; l < c->n_layer; l++) {
        m->layers[l].state_off = -1;
        if (c->layer[l].mixer != KILN_MIXER_GATED_DELTA_NET) continue;
        any = true;
        const int64_t conv_dim = 2 * (int64_t)c->ssm_n_k_heads * c->ssm_k_head_dim +
                                 (int64_t)c->ssm_n_v_heads * c->ssm_v_head_dim;
        m->layers[l].state_off = off;
        off += conv_dim * (c->ssm_conv_kernel - 1) +
               (int64_t)c->ssm_n_v_heads * c->ssm_k_head_dim * c->ssm_v_head_dim;
    }
    m->state_floats = any ? off : 0;
}

int64_t kiln_model_seq_state_floats(const kiln_model *m) {
    return m ? m->state_floats : 0;
}

/* ---- sources ------------------------------------------------------------------------- */

static kiln_status open_llama2c(kiln_model *m, const kiln_model_load_params *p, kiln_error *err) {
    kiln_llama2c *l2c = NULL;
    kiln_status st = kiln_llama2c_open(m->path, &l2c, err);
    if (st) return st;
    m->llama2c = l2c;
    kiln_config_from_llama2c(&l2c->config, &m->cfg);
    if ((st = kiln_config_validate(&m->cfg, m->path, err))) return st;
    kiln_model_bind_llama2c(m);
    const kiln_model_config *c = &m->cfg;
    char *tok_path = p && p->tokenizer_path ? strdup(p->tokenizer_path)
                                            : kiln_model_find_llama2c_tokenizer(m->path);
    if (!tok_path) {
        if (p && p->require_tokenizer)
            return kiln_error_set(err, KILN_ERR_NOT_FOUND,
                                  "%s: no tokenizer found (looked for tokenizer.bin or a single "
                                  "tok*.bin beside the model); pass --tokenizer FILE",
                                  m->path);
        return KILN_OK;
    }
    st = kiln_tokenizer_from_llama2c(tok_path, c->n_vocab, &m->tokenizer, err);
    free(tok_path);
    return st;
}

static kiln_status open_gguf(kiln_model *m, const kiln_model_load_params *p, kiln_error *err) {
    kiln_gguf *g = NULL;
    kiln_status st = kiln_gguf_open(m->path, &g, err);
    if (st) return st;
    m->gguf = g;
    if ((st = kiln_config_from_gguf(g, &m->cfg, err))) return st;
    m->layers = kiln_model_alloc(m, (size_t)m->cfg.n_layer * sizeof *m->layers);
    if (!m->layers) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = kiln_model_bind_gguf(m, err))) return st;
    if (p && p->tokenizer_path)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: --tokenizer is only for llama2.c checkpoints; GGUF files carry "
                              "their own tokenizer",
                              m->path);
    if (kiln_gguf_find(g, "tokenizer.ggml.model")) {
        if ((st = kiln_tokenizer_from_gguf(g, &m->tokenizer, err))) return st;
    } else if (p && p->require_tokenizer) {
        return kiln_error_set(err, KILN_ERR_NOT_FOUND,
                              "%s: the file has no tokenizer (metadata key tokenizer.ggml.model "
                              "is missing)",
                              m->path);
    }
    return KILN_OK;
}

static kiln_status open_hf(kiln_model *m, const kiln_model_load_params *p, kiln_error *err) {
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", m->path);
    if (!kiln_model_file_exists(cfg_path))
        return kiln_error_set(err, KILN_ERR_NOT_FOUND,
                              "%s: a directory without config.json (a model is a GGUF file, a "
                              "llama2.c checkpoint or a Hugging Face model directory)",
                              m->path);
    kiln_status st = kiln_config_from_hf(cfg_path, &m->cfg, err);
    if (st) return st;
    kiln_safetensors *sft = NULL;
    if ((st = kiln_safetensors_open(m->path, &sft, err))) return st;
    m->safetensors = sft;
    m->layers = kiln_model_alloc(m, (size_t)m->cfg.n_layer * sizeof *m->layers);
    if (!m->layers) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = kiln_model_bind_hf(m, err))) return st;
    char tok_path[4200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", m->path);
    if (kiln_model_file_exists(tok_path)) {
        if ((st = kiln_tokenizer_from_hf_dir(m->path, &m->tokenizer, err))) return st;
    } else if (p && p->require_tokenizer) {
        return kiln_error_set(err, KILN_ERR_NOT_FOUND,
                              "%s: no tokenizer.json in the directory, so text cannot be tokenized "
                              "(token ids still work: kiln logits --ids, the API's prompt_ids)",
                              m->path);
    }
    return kiln_model_read_gen_defaults(m, err);
}

/* ---- weight placement ------------------------------------------------------------------ */

static void *alloc_owned(void *owner, size_t bytes) {
    return kiln_model_alloc(owner, bytes);
}

/* Place the matrices for the backend named in the load parameters (its place_weights entry,
 * backend.h; the CPU's moves them into owned huge-page memory, F16 packed), unless the caller
 * only inspects the model or names no backend: every row-layout matrix the
 * forward pass multiplies by (not the token embedding, whose rows are read one by one; a tied
 * output head stays with it), layer by layer, with the file mappings of m's sources. Nothing
 * moves when the list cannot be allocated (the weights work where they are). */
static void place_weights(kiln_model *m, const kiln_model_load_params *p) {
    if (!m->layers || !p || p->keep_file_layout || !p->backend || !p->backend->place_weights)
        return;
    size_t n = 1;
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        const kiln_layer_weights *L = &m->layers[l];
        n += 15;
        const kiln_mat *experts[] = {L->exp_gate, L->exp_up, L->exp_down};
        for (int i = 0; i < 3; i++)
            if (experts[i] && m->cfg.n_expert > 0) n += (size_t)m->cfg.n_expert;
    }
    const kiln_safetensors *st = m->safetensors;
    const size_t n_shards = st ? st->n_shards : 0;
    kiln_mat **mats = malloc(n * sizeof *mats);
    const kiln_mapped_file **maps = malloc((2 + n_shards) * sizeof *maps);
    if (!mats || !maps) {
        free(mats);
        free(maps);
        return;
    }
    size_t k = 0;
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        kiln_layer_weights *L = &m->layers[l];
        kiln_mat *lm[] = {&L->wq,          &L->wk,        &L->wv,         &L->wo,
                          &L->w_gate,      &L->w_up,      &L->w_down,     &L->w_router,
                          &L->shexp_gate,  &L->shexp_up,  &L->shexp_down, &L->shexp_router,
                          &L->ssm_in_qkvz, &L->ssm_in_ba, &L->ssm_out};
        for (size_t i = 0; i < sizeof lm / sizeof lm[0]; i++) mats[k++] = lm[i];
        kiln_mat *experts[] = {L->exp_gate, L->exp_up, L->exp_down};
        for (int i = 0; i < 3; i++)
            for (int32_t e = 0; experts[i] && e < m->cfg.n_expert; e++) mats[k++] = &experts[i][e];
    }
    if (m->output.data != m->tok_embd.data) mats[k++] = &m->output;
    size_t n_maps = 0;
    if (m->gguf) maps[n_maps++] = ((const kiln_gguf *)m->gguf)->owned_map;
    if (m->llama2c) maps[n_maps++] = ((const kiln_llama2c *)m->llama2c)->map;
    for (size_t i = 0; i < n_shards; i++) maps[n_maps++] = st->shards[i];
    p->backend->place_weights(mats, k, maps, n_maps, alloc_owned, m);
    free(mats);
    free(maps);
}

/* Place every weight the forward pass reads on the device of a backend without host memory
 * (its place_device, backend.h): the matrices (with the embedding tables, read by row, and the
 * output head, tied or not) and the f32 vectors with their lengths from the config. Models
 * needing operations the backend leaves out (experts, the delta net) are refused first. */
static kiln_status place_device(kiln_model *m, const kiln_model_load_params *p, kiln_error *err) {
    const kiln_backend_ops *be = p->backend;
    const kiln_model_config *c = &m->cfg;
    if (kiln_config_has_moe(c) && !be->moe_route)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: the %s backend has no mixture-of-experts kernels yet", m->path,
                              be->name);
    if (kiln_config_has_mixer(c, KILN_MIXER_GATED_DELTA_NET) && !be->gdn_rule)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: the %s backend has no gated-delta-net kernels yet", m->path,
                              be->name);
    const int64_t d = c->n_embd, hd = c->head_dim, q_dim = (int64_t)c->n_head * hd,
                  kv_dim = (int64_t)c->n_head_kv * hd, q_rows = c->attn_out_gate ? 2 * q_dim : q_dim;
    const int64_t key_dim = (int64_t)c->ssm_n_k_heads * c->ssm_k_head_dim,
                  value_dim = (int64_t)c->ssm_n_v_heads * c->ssm_v_head_dim;
    const size_t n_mats_max = 4 + (size_t)c->n_layer * (15 + 3 * (size_t)(c->n_expert > 0 ? c->n_expert : 0));
    const size_t n_vecs_max = 2 + (size_t)c->n_layer * 22;
    kiln_mat **mats = malloc(n_mats_max * sizeof *mats);
    kiln_vec_ref *vecs = malloc(n_vecs_max * sizeof *vecs);
    if (!mats || !vecs) {
        free(mats);
        free(vecs);
        return kiln_model_oom(m, err);
    }
    size_t k = 0, nv = 0;
    mats[k++] = &m->tok_embd;
    if (c->learned_pos) mats[k++] = &m->pos_embd;
    mats[k++] = &m->output; /* the tied head shares tok_embd's copy */
    vecs[nv++] = (kiln_vec_ref){&m->output_norm, d};
    vecs[nv++] = (kiln_vec_ref){&m->output_norm_b, d};
    for (int32_t l = 0; l < c->n_layer; l++) {
        kiln_layer_weights *L = &m->layers[l];
        kiln_mat *lm[] = {&L->wq,          &L->wk,        &L->wv,         &L->wo,
                          &L->w_gate,      &L->w_up,      &L->w_down,     &L->w_router,
                          &L->shexp_gate,  &L->shexp_up,  &L->shexp_down, &L->shexp_router,
                          &L->ssm_in_qkvz, &L->ssm_in_ba, &L->ssm_out};
        for (size_t i = 0; i < sizeof lm / sizeof lm[0]; i++) mats[k++] = lm[i];
        kiln_mat *experts[] = {L->exp_gate, L->exp_up, L->exp_down};
        for (int i = 0; i < 3; i++)
            for (int32_t e = 0; experts[i] && e < c->n_expert; e++) mats[k++] = &experts[i][e];
        const kiln_vec_ref lv[] = {
            {&L->attn_norm, d},      {&L->attn_norm_b, d},      {&L->ffn_norm, d},
            {&L->ffn_norm_b, d},     {&L->post_attn_norm, d},   {&L->post_ffn_norm, d},
            {&L->bq, q_rows},        {&L->bk, kv_dim},          {&L->bv, kv_dim},
            {&L->bo, d},             {&L->q_norm, hd},          {&L->k_norm, hd},
            {&L->b_up, c->n_ff},     {&L->b_down, d},           {&L->inv_freq, c->rope_dim / 2},
            {&L->ssm_conv, (2 * key_dim + value_dim) * c->ssm_conv_kernel},
            {&L->ssm_a_log, c->ssm_n_v_heads},                  {&L->ssm_dt_bias, c->ssm_n_v_heads},
            {&L->ssm_norm, c->ssm_v_head_dim},
        };
        for (size_t i = 0; i < sizeof lv / sizeof lv[0]; i++)
            if (*lv[i].p && lv[i].n > 0) vecs[nv++] = lv[i];
    }
    void *handle = NULL;
    kiln_status st = be->place_device(p->device, mats, k, vecs, nv, &handle, err);
    free(mats);
    free(vecs);
    if (st) {
        kiln_error_prefix(err, "%s: ", m->path);
        return st;
    }
    m->placement = handle;
    m->device = p->device;
    m->placed = be;
    return KILN_OK;
}

kiln_status kiln_model_load_file(const char *path, const kiln_model_load_params *params,
                                 kiln_model **out, kiln_error *err) {
    *out = NULL;
    kiln_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    kiln_status st;
    if (kiln_model_is_dir(path)) {
        st = open_hf(m, params, err);
    } else if (!kiln_model_file_exists(path)) {
        struct stat sb;
        st = stat(path, &sb) != 0
                 ? kiln_error_set(err, KILN_ERR_IO, "%s: %s", path, strerror(errno))
                 : kiln_error_set(err, KILN_ERR_IO,
                                  "%s: not a regular file or a directory (a model is a GGUF "
                                  "file, a llama2.c checkpoint or a Hugging Face directory)",
                                  path);
    } else if (kiln_model_has_gguf_magic(path)) {
        st = open_gguf(m, params, err);
    } else if (strlen(path) > 12 && !strcmp(path + strlen(path) - 12, ".safetensors")) {
        st = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                            "%s: a safetensors file holds weights only: pass the Hugging Face "
                            "model directory that holds it with config.json",
                            path);
    } else {
        st = KILN_OK;
        m->layers = NULL;
        /* llama2.c has no magic: the reader validates the header against the file size. */
        kiln_llama2c *probe = NULL;
        st = kiln_llama2c_open(path, &probe, err);
        if (st == KILN_OK) {
            int32_t nl = probe->config.n_layers;
            kiln_llama2c_close(probe);
            m->layers = kiln_model_alloc(m, (size_t)nl * sizeof *m->layers);
            st = m->layers ? open_llama2c(m, params, err)
                           : kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        } else {
            kiln_error_prefix(err,
                              "not a GGUF file (no 'GGUF' magic) and not a llama2.c checkpoint: ");
        }
    }
    if (st == KILN_OK) {
        const float *ff = NULL;
        if (m->gguf) {
            const kiln_gguf_tensor *t = kiln_gguf_find_tensor(m->gguf, "rope_freqs.weight");
            if (t) {
                if (t->dtype != KILN_DTYPE_F32 || t->n_dims != 1 || t->ne[0] != m->cfg.rope_dim / 2)
                    st = kiln_error_set(err, KILN_ERR_FORMAT,
                                        "%s: tensor 'rope_freqs.weight' should be f32 [%d]", path,
                                        m->cfg.rope_dim / 2);
                ff = t->data;
            }
        }
        if (st == KILN_OK) st = init_rope(m, ff, err);
        if (st == KILN_OK) init_state_layout(m);
    }
    if (st == KILN_OK && m->tokenizer && kiln_tokenizer_n_vocab(m->tokenizer) > m->cfg.n_vocab)
        st = kiln_error_set(err, KILN_ERR_FORMAT,
                            "%s: the tokenizer has %d tokens but the model only %d", path,
                            kiln_tokenizer_n_vocab(m->tokenizer), m->cfg.n_vocab);
    if (st != KILN_OK) {
        kiln_model_close(m);
        return st;
    }
    /* last: a load that fails never pays for the copies */
    if (params && params->backend && !params->backend->host_memory && !params->keep_file_layout) {
        if ((st = place_device(m, params, err))) {
            kiln_model_close(m);
            return st;
        }
    } else {
        place_weights(m, params);
        if (params && params->backend && !params->keep_file_layout) m->placed = params->backend;
    }
    *out = m;
    return KILN_OK;
}

void kiln_model_close(kiln_model *m) {
    if (!m) return;
    if (m->placement && m->placed && m->placed->release_weights)
        m->placed->release_weights(m->placement);
    kiln_tokenizer_destroy(m->tokenizer);
    kiln_gguf_close(m->gguf);
    kiln_llama2c_close(m->llama2c);
    kiln_safetensors_close(m->safetensors);
    for (int32_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->path);
    free(m);
}
