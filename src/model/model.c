#include "model/model.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/safetensors.h"
#include "util/error.h"

/* ---- helpers ------------------------------------------------------------------------- */

static void *model_alloc(kiln_model *m, size_t bytes) {
    void **list = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *list);
    if (!list) return NULL;
    m->owned = list;
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) return NULL;
    m->owned[m->n_owned++] = p;
    return p;
}

/* A named tensor from any source, normalised to GGML order ne[0] = innermost. */
typedef struct src_tensor {
    const void *data;
    kiln_dtype dtype;
    int32_t n_dims;
    int64_t ne[4];
    size_t nbytes;
} src_tensor;

typedef bool (*find_fn)(const kiln_model *m, const char *name, src_tensor *out);

static bool find_gguf(const kiln_model *m, const char *name, src_tensor *out) {
    const kiln_gguf_tensor *t = kiln_gguf_find_tensor(m->gguf, name);
    if (!t) return false;
    out->data = t->data;
    out->dtype = t->dtype;
    out->n_dims = (int32_t)t->n_dims;
    for (int i = 0; i < 4; i++) out->ne[i] = t->ne[i];
    out->nbytes = t->nbytes;
    return true;
}

static bool find_st(const kiln_model *m, const char *name, src_tensor *out) {
    const kiln_st_tensor *t = kiln_safetensors_find(m->safetensors, name);
    if (!t || t->n_dims > 4) return false;
    out->data = t->data;
    out->dtype = t->dtype;
    out->n_dims = t->n_dims;
    for (int i = 0; i < 4; i++) out->ne[i] = 1;
    for (int i = 0; i < t->n_dims; i++) out->ne[i] = t->shape[t->n_dims - 1 - i];
    out->nbytes = t->nbytes;
    return true;
}

static kiln_status get_mat(kiln_model *m, find_fn find, const char *name, int64_t n_out,
                           int64_t n_in, kiln_mat *mat, kiln_error *err) {
    src_tensor t;
    if (!find(m, name, &t))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    if (t.n_dims != 2 || t.ne[0] != n_in || t.ne[1] != n_out)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tensor '%s' has shape [%lld, %lld] (rows x cols), expected "
                              "[%lld, %lld]",
                              m->path, name, (long long)t.ne[1], (long long)t.ne[0],
                              (long long)n_out, (long long)n_in);
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t.dtype);
    if (!tr || !tr->to_float)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s",
                              m->path, name, kiln_dtype_name(t.dtype));
    if (n_in % tr->block_size != 0)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tensor '%s': row length %lld is not a multiple of the %s block "
                              "size %d",
                              m->path, name, (long long)n_in, tr->name, tr->block_size);
    mat->data = t.data;
    mat->dtype = t.dtype;
    mat->n_out = n_out;
    mat->n_in = n_in;
    mat->name = name;
    return KILN_OK;
}

/* A 1-D vector of n floats; converted to an owned f32 copy when stored in another dtype. */
static kiln_status get_vec(kiln_model *m, find_fn find, const char *name, int64_t n,
                           const float **out, kiln_error *err) {
    src_tensor t;
    if (!find(m, name, &t))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    if (t.n_dims != 1 || t.ne[0] != n)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tensor '%s' should be a vector of %lld elements", m->path, name,
                              (long long)n);
    if (t.dtype == KILN_DTYPE_F32) {
        *out = t.data;
        return KILN_OK;
    }
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t.dtype);
    if (!tr || !tr->to_float || n % tr->block_size != 0)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s",
                              m->path, name, kiln_dtype_name(t.dtype));
    float *f = model_alloc(m, (size_t)n * sizeof *f);
    if (!f) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", m->path);
    tr->to_float(t.data, f, n);
    *out = f;
    return KILN_OK;
}

/* Weight names per source: printf patterns taking the layer index. */
typedef struct name_scheme {
    const char *tok_embd, *output_norm, *output;
    const char *attn_norm, *ffn_norm, *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
} name_scheme;

static const name_scheme gguf_names = {
    "token_embd.weight",       "output_norm.weight",      "output.weight",
    "blk.%d.attn_norm.weight", "blk.%d.ffn_norm.weight",  "blk.%d.attn_q.weight",
    "blk.%d.attn_k.weight",    "blk.%d.attn_v.weight",    "blk.%d.attn_output.weight",
    "blk.%d.ffn_gate.weight",  "blk.%d.ffn_up.weight",    "blk.%d.ffn_down.weight",
};

static const name_scheme hf_names = {
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight",
};

/* Layer tensor names must outlive loading (kiln_mat.name): keep them in owned memory. */
static const char *layer_name(kiln_model *m, const char *pattern, int layer) {
    char buf[256];
    snprintf(buf, sizeof buf, pattern, layer);
    char *s = model_alloc(m, strlen(buf) + 1);
    if (s) strcpy(s, buf);
    return s;
}

static kiln_status bind_named_weights(kiln_model *m, find_fn find, const name_scheme *nm,
                                      kiln_error *err) {
    const kiln_model_config *c = &m->cfg;
    const int64_t d = c->n_embd, q_dim = (int64_t)c->n_head * c->head_dim,
                  kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    kiln_status st;
    if ((st = get_mat(m, find, nm->tok_embd, c->n_vocab, d, &m->tok_embd, err))) return st;
    if ((st = get_vec(m, find, nm->output_norm, d, &m->output_norm, err))) return st;
    src_tensor probe;
    if (!c->tied_embeddings && find(m, nm->output, &probe)) {
        if ((st = get_mat(m, find, nm->output, c->n_vocab, d, &m->output, err))) return st;
    } else {
        m->output = m->tok_embd;
    }
    for (int l = 0; l < c->n_layer; l++) {
        kiln_layer_weights *L = &m->layers[l];
        struct {
            const char *pat;
            kiln_mat *mat;
            int64_t n_out, n_in;
        } mats[] = {
            {nm->wq, &L->wq, q_dim, d},           {nm->wk, &L->wk, kv_dim, d},
            {nm->wv, &L->wv, kv_dim, d},          {nm->wo, &L->wo, d, q_dim},
            {nm->w_gate, &L->w_gate, c->n_ff, d}, {nm->w_up, &L->w_up, c->n_ff, d},
            {nm->w_down, &L->w_down, d, c->n_ff},
        };
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            const char *name = layer_name(m, mats[i].pat, l);
            if (!name) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
            if ((st = get_mat(m, find, name, mats[i].n_out, mats[i].n_in, mats[i].mat, err)))
                return st;
        }
        const char *an = layer_name(m, nm->attn_norm, l), *fn = layer_name(m, nm->ffn_norm, l);
        if (!an || !fn) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        if ((st = get_vec(m, find, an, d, &L->attn_norm, err))) return st;
        if ((st = get_vec(m, find, fn, d, &L->ffn_norm, err))) return st;
    }
    return KILN_OK;
}

/* RoPE inverse frequencies: 1 / theta^(2j/d), with llama3 scaling as transformers'
 * _compute_llama3_parameters, or GGUF rope_freqs.weight factors (divide) as llama.cpp. */
static kiln_status init_rope(kiln_model *m, const float *freq_factors, kiln_error *err) {
    const kiln_model_config *c = &m->cfg;
    const int32_t half = c->head_dim / 2;
    m->inv_freq = model_alloc(m, (size_t)half * sizeof(float));
    if (!m->inv_freq) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t j = 0; j < half; j++) {
        float inv = 1.0f / powf(c->rope_theta, (float)(2 * j) / (float)c->head_dim);
        if (c->rope_scaling == KILN_ROPE_SCALING_LLAMA3) {
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
        }
        if (freq_factors) inv = inv / freq_factors[j];
        m->inv_freq[j] = inv;
    }
    return KILN_OK;
}

/* ---- sources ------------------------------------------------------------------------- */

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_gguf_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

/* llama2.c tokenizer beside the checkpoint: tokenizer.bin, else the only tok*.bin. */
static char *find_llama2c_tokenizer(const char *model_path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", model_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    char cand[4352];
    snprintf(cand, sizeof cand, "%s/tokenizer.bin", dir);
    if (file_exists(cand)) return strdup(cand);
    DIR *dp = opendir(dir);
    if (!dp) return NULL;
    char *found = NULL;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "tok", 3) == 0 && len > 4 && strcmp(e->d_name + len - 4, ".bin") == 0) {
            count++;
            free(found);
            snprintf(cand, sizeof cand, "%s/%s", dir, e->d_name);
            found = strdup(cand);
        }
    }
    closedir(dp);
    if (count != 1) {
        free(found);
        return NULL;
    }
    return found;
}

static kiln_status open_llama2c(kiln_model *m, const kiln_model_load_params *p, kiln_error *err) {
    kiln_llama2c *l2c = NULL;
    kiln_status st = kiln_llama2c_open(m->path, &l2c, err);
    if (st) return st;
    m->llama2c = l2c;
    kiln_config_from_llama2c(&l2c->config, &m->cfg);
    if ((st = kiln_config_validate(&m->cfg, m->path, err))) return st;
    const kiln_model_config *c = &m->cfg;
    const int64_t d = c->n_embd, hd = c->head_dim, q_dim = (int64_t)c->n_head * hd,
                  kv_dim = (int64_t)c->n_head_kv * hd, ff = c->n_ff;
#define MAT(field, ptr, no, ni)                                                                    \
    (m->field = (kiln_mat){(ptr), KILN_DTYPE_F32, (no), (ni), #field})
    MAT(tok_embd, l2c->token_embedding, c->n_vocab, d);
    MAT(output, l2c->wcls, c->n_vocab, d);
    m->output_norm = l2c->rms_final;
    for (int l = 0; l < c->n_layer; l++) {
        kiln_layer_weights *L = &m->layers[l];
        L->attn_norm = l2c->rms_att + l * d;
        L->ffn_norm = l2c->rms_ffn + l * d;
        MAT(layers[l].wq, l2c->wq + l * q_dim * d, q_dim, d);
        MAT(layers[l].wk, l2c->wk + l * kv_dim * d, kv_dim, d);
        MAT(layers[l].wv, l2c->wv + l * kv_dim * d, kv_dim, d);
        MAT(layers[l].wo, l2c->wo + l * d * q_dim, d, q_dim);
        MAT(layers[l].w_gate, l2c->w1 + l * ff * d, ff, d);
        MAT(layers[l].w_down, l2c->w2 + l * d * ff, d, ff);
        MAT(layers[l].w_up, l2c->w3 + l * ff * d, ff, d);
    }
#undef MAT
    char *tok_path = p && p->tokenizer_path ? strdup(p->tokenizer_path)
                                            : find_llama2c_tokenizer(m->path);
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
    m->layers = model_alloc(m, (size_t)m->cfg.n_layer * sizeof *m->layers);
    if (!m->layers) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = bind_named_weights(m, find_gguf, &gguf_names, err))) return st;
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
    kiln_status st = kiln_config_from_hf(cfg_path, &m->cfg, err);
    if (st) return st;
    kiln_safetensors *sft = NULL;
    if ((st = kiln_safetensors_open(m->path, &sft, err))) return st;
    m->safetensors = sft;
    m->layers = model_alloc(m, (size_t)m->cfg.n_layer * sizeof *m->layers);
    if (!m->layers) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = bind_named_weights(m, find_st, &hf_names, err))) return st;
    if (p && p->require_tokenizer)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: loading a tokenizer from a Hugging Face directory "
                              "(tokenizer.json) is not supported yet; pass token ids instead",
                              m->path);
    return KILN_OK;
}

kiln_status kiln_model_open(const char *path, const kiln_model_load_params *params,
                            kiln_model **out, kiln_error *err) {
    *out = NULL;
    kiln_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    kiln_status st;
    if (is_dir(path)) {
        st = open_hf(m, params, err);
    } else if (!file_exists(path)) {
        st = kiln_error_set(err, KILN_ERR_IO, "%s: no such file or directory", path);
    } else if (has_gguf_magic(path)) {
        st = open_gguf(m, params, err);
    } else {
        st = KILN_OK;
        m->layers = NULL;
        /* llama2.c has no magic: the reader validates the header against the file size. */
        kiln_llama2c *probe = NULL;
        st = kiln_llama2c_open(path, &probe, err);
        if (st == KILN_OK) {
            int32_t nl = probe->config.n_layers;
            kiln_llama2c_close(probe);
            m->layers = model_alloc(m, (size_t)nl * sizeof *m->layers);
            st = m->layers ? open_llama2c(m, params, err)
                           : kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        } else {
            kiln_error_prefix(err, "not a GGUF file (no 'GGUF' magic) and not a llama2.c checkpoint: ");
        }
    }
    if (st == KILN_OK) {
        const float *ff = NULL;
        if (m->gguf) {
            const kiln_gguf_tensor *t = kiln_gguf_find_tensor(m->gguf, "rope_freqs.weight");
            if (t) {
                if (t->dtype != KILN_DTYPE_F32 || t->n_dims != 1 || t->ne[0] != m->cfg.head_dim / 2)
                    st = kiln_error_set(err, KILN_ERR_FORMAT,
                                        "%s: tensor 'rope_freqs.weight' should be f32 [%d]", path,
                                        m->cfg.head_dim / 2);
                ff = t->data;
            }
        }
        if (st == KILN_OK) st = init_rope(m, ff, err);
    }
    if (st == KILN_OK && m->tokenizer && kiln_tokenizer_n_vocab(m->tokenizer) > m->cfg.n_vocab)
        st = kiln_error_set(err, KILN_ERR_FORMAT,
                            "%s: the tokenizer has %d tokens but the model only %d", path,
                            kiln_tokenizer_n_vocab(m->tokenizer), m->cfg.n_vocab);
    if (st != KILN_OK) {
        kiln_model_close(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

void kiln_model_close(kiln_model *m) {
    if (!m) return;
    kiln_tokenizer_destroy(m->tokenizer);
    kiln_gguf_close(m->gguf);
    kiln_llama2c_close(m->llama2c);
    kiln_safetensors_close(m->safetensors);
    for (int32_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->path);
    free(m);
}
