/*
 * model_bind.c - binding a model's weights: tensors found by name in a GGUF file or the
 * safetensors of a Hugging Face directory (name schemes: model_names.h), checked for shape and
 * dtype and bound to kiln_layer_weights as matrices, views and f32 vectors (owned f32 copies
 * where needed, transposed copies of GPT-2's Conv1D weights), and the fixed layout of a
 * llama2.c checkpoint.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/safetensors.h"
#include "model/model_internal.h"
#include "model/model_names.h"
#include "util/error.h"

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

/* A matrix [n_out, n_in] (rows of n_in). transposed: the file stores it as [n_in, n_out]
 * (GPT-2's Conv1D, y = x W + b); an owned copy in the row layout is made (plain dtypes). */
static kiln_status get_mat_t(kiln_model *m, find_fn find, const char *name, int64_t n_out,
                             int64_t n_in, bool transposed, kiln_mat *mat, kiln_error *err) {
    src_tensor t;
    if (!find(m, name, &t))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    const int64_t want0 = transposed ? n_out : n_in, want1 = transposed ? n_in : n_out;
    if (t.n_dims != 2 || t.ne[0] != want0 || t.ne[1] != want1)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tensor '%s' has shape [%lld, %lld] (rows x cols), expected "
                              "[%lld, %lld]",
                              m->path, name, (long long)t.ne[1], (long long)t.ne[0],
                              (long long)want1, (long long)want0);
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
    if (transposed) {
        if (tr->block_size != 1)
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "%s: tensor '%s': a transposed (Conv1D) weight must be of a "
                                  "plain dtype, not %s",
                                  m->path, name, tr->name);
        const size_t es = tr->type_size;
        char *dst = kiln_model_alloc(m, (size_t)(n_out * n_in) * es);
        if (!dst) return kiln_model_oom(m, err);
        const char *src = t.data;
        for (int64_t i = 0; i < n_in; i++)
            for (int64_t o = 0; o < n_out; o++)
                memcpy(dst + (size_t)(o * n_in + i) * es, src + (size_t)(i * n_out + o) * es, es);
        mat->data = dst;
    }
    mat->dtype = t.dtype;
    mat->n_out = n_out;
    mat->n_in = n_in;
    mat->name = name;
    mat->layout = KILN_MAT_ROWS;
    return KILN_OK;
}

static kiln_status get_mat(kiln_model *m, find_fn find, const char *name, int64_t n_out,
                           int64_t n_in, kiln_mat *mat, kiln_error *err) {
    return get_mat_t(m, find, name, n_out, n_in, false, mat, err);
}

/* Rows [row0, row0 + n) of a bound matrix (row layout: views are taken before packing), as a
 * view. */
static kiln_mat mat_rows(const kiln_mat *a, int64_t row0, int64_t n) {
    kiln_mat v = *a;
    v.data = (const char *)a->data + (size_t)row0 * kiln_dtype_row_size(a->dtype, a->n_in);
    v.n_out = n;
    return v;
}

/* A 3-D tensor [n_expert][n_out][n_in] (GGML ne = {n_in, n_out, n_expert}) as n_expert
 * matrix views. */
static kiln_status get_experts(kiln_model *m, find_fn find, const char *name, int64_t n_expert,
                               int64_t n_out, int64_t n_in, kiln_mat *out, kiln_error *err) {
    src_tensor t;
    if (!find(m, name, &t))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    if (t.n_dims != 3 || t.ne[0] != n_in || t.ne[1] != n_out || t.ne[2] != n_expert)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tensor '%s' has ne [%lld, %lld, %lld], expected [%lld, %lld, "
                              "%lld]",
                              m->path, name, (long long)t.ne[0], (long long)t.ne[1],
                              (long long)t.ne[2], (long long)n_in, (long long)n_out,
                              (long long)n_expert);
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t.dtype);
    if (!tr || !tr->to_float || n_in % tr->block_size != 0)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s",
                              m->path, name, kiln_dtype_name(t.dtype));
    const size_t per = (size_t)n_out * kiln_dtype_row_size(t.dtype, n_in);
    for (int64_t e = 0; e < n_expert; e++)
        out[e] = (kiln_mat){
            (const char *)t.data + (size_t)e * per, t.dtype, n_out, n_in, name, KILN_MAT_ROWS};
    return KILN_OK;
}

/* A tensor of n f32 values (any shape with that many elements and innermost size ne0, or
 * ne0 = 0 for a 1-D vector); converted to an owned f32 copy when stored in another dtype or
 * at an address not aligned for float. add_one: store 1 + w (norms with a unit offset). */
static kiln_status get_f32(kiln_model *m, find_fn find, const char *name, int64_t n, int64_t ne0,
                           bool add_one, const float **out, kiln_error *err) {
    src_tensor t;
    if (!find(m, name, &t))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' is missing", m->path, name);
    int64_t count = 1;
    for (int i = 0; i < t.n_dims; i++) count *= t.ne[i];
    if ((ne0 == 0 && (t.n_dims != 1 || t.ne[0] != n)) ||
        (ne0 != 0 && (count != n || t.ne[0] != ne0)))
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' should hold %lld elements%s",
                              m->path, name, (long long)n, ne0 == 0 ? " as a vector" : "");
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(t.dtype);
    if (!tr || !tr->to_float || n % tr->block_size != 0)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s",
                              m->path, name, kiln_dtype_name(t.dtype));
    if (t.dtype == KILN_DTYPE_F32 && ((uintptr_t)t.data % sizeof(float)) == 0 && !add_one) {
        *out = t.data;
        return KILN_OK;
    }
    float *f = kiln_model_alloc(m, (size_t)n * sizeof *f);
    if (!f) return kiln_model_oom(m, err);
    tr->to_float(t.data, f, n);
    if (add_one)
        for (int64_t i = 0; i < n; i++) f[i] = 1.0f + f[i];
    *out = f;
    return KILN_OK;
}

static kiln_status get_vec(kiln_model *m, find_fn find, const char *name, int64_t n,
                           const float **out, kiln_error *err) {
    return get_f32(m, find, name, n, 0, false, out, err);
}

/* A norm weight: (1 + w) when the config says the stored weights are offsets. */
static kiln_status get_norm(kiln_model *m, find_fn find, const char *name, int64_t n,
                            const float **out, kiln_error *err) {
    return get_f32(m, find, name, n, 0, m->cfg.norm_unit_offset, out, err);
}

/* Layer tensor names must outlive loading (kiln_mat.name): keep them in owned memory. */
static const char *layer_name2(kiln_model *m, const char *pattern, int layer, int expert) {
    char buf[512];
    snprintf(buf, sizeof buf, pattern, layer, expert);
    char *s = kiln_model_alloc(m, strlen(buf) + 1);
    if (s) strcpy(s, buf);
    return s;
}

static const char *layer_name(kiln_model *m, const char *pattern, int layer) {
    return layer_name2(m, pattern, layer, 0);
}

/* Binding context for one layer. */
typedef struct binder {
    kiln_model *m;
    find_fn find;
    const kiln_name_scheme *nm;
    int layer;
    kiln_error *err;
} binder;

static kiln_status b_mat(binder *b, const char *pat, int64_t n_out, int64_t n_in, kiln_mat *out) {
    if (!pat)
        return kiln_error_set(b->err, KILN_ERR_UNSUPPORTED,
                              "%s: this source has no tensor name for a weight the configuration "
                              "needs (layer %d)",
                              b->m->path, b->layer);
    const char *name = layer_name(b->m, pat, b->layer);
    if (!name) return kiln_model_oom(b->m, b->err);
    return get_mat_t(b->m, b->find, name, n_out, n_in, b->nm->conv1d, out, b->err);
}

static kiln_status b_vec(binder *b, const char *pat, int64_t n, bool norm, const float **out) {
    if (!pat)
        return kiln_error_set(b->err, KILN_ERR_UNSUPPORTED,
                              "%s: this source has no tensor name for a vector the configuration "
                              "needs (layer %d)",
                              b->m->path, b->layer);
    const char *name = layer_name(b->m, pat, b->layer);
    if (!name) return kiln_model_oom(b->m, b->err);
    return norm ? get_norm(b->m, b->find, name, n, out, b->err)
                : get_vec(b->m, b->find, name, n, out, b->err);
}

static kiln_status bind_attention(binder *b, kiln_layer_weights *L) {
    const kiln_model_config *c = &b->m->cfg;
    const kiln_name_scheme *nm = b->nm;
    const int64_t d = c->n_embd, hd = c->head_dim, q_dim = (int64_t)c->n_head * hd,
                  q_rows = c->attn_out_gate ? 2 * q_dim : q_dim,
                  kv_dim = (int64_t)c->n_head_kv * hd;
    kiln_status st;
    src_tensor probe;
    const char *fused = nm->wqkv ? layer_name(b->m, nm->wqkv, b->layer) : NULL;
    if (nm->wqkv && !fused) return kiln_model_oom(b->m, b->err);
    if (fused && (!nm->wq || b->find(b->m, fused, &probe))) {
        kiln_mat qkv;
        if ((st = b_mat(b, nm->wqkv, q_rows + 2 * kv_dim, d, &qkv))) return st;
        L->wq = mat_rows(&qkv, 0, q_rows);
        L->wk = mat_rows(&qkv, q_rows, kv_dim);
        L->wv = mat_rows(&qkv, q_rows + kv_dim, kv_dim);
    } else {
        if ((st = b_mat(b, nm->wq, q_rows, d, &L->wq))) return st;
        if ((st = b_mat(b, nm->wk, kv_dim, d, &L->wk))) return st;
        if ((st = b_mat(b, nm->wv, kv_dim, d, &L->wv))) return st;
    }
    if ((st = b_mat(b, nm->wo, d, q_dim, &L->wo))) return st;
    if (c->attn_bias_qkv) {
        const char *fb = nm->bqkv ? layer_name(b->m, nm->bqkv, b->layer) : NULL;
        if (nm->bqkv && !fb) return kiln_model_oom(b->m, b->err);
        if (fb && (!nm->bq || b->find(b->m, fb, &probe))) {
            const float *bqkv;
            if ((st = b_vec(b, nm->bqkv, q_rows + 2 * kv_dim, false, &bqkv))) return st;
            L->bq = bqkv;
            L->bk = bqkv + q_rows;
            L->bv = bqkv + q_rows + kv_dim;
        } else {
            if ((st = b_vec(b, nm->bq, q_rows, false, &L->bq))) return st;
            if ((st = b_vec(b, nm->bk, kv_dim, false, &L->bk))) return st;
            if ((st = b_vec(b, nm->bv, kv_dim, false, &L->bv))) return st;
        }
    }
    if (c->attn_bias_o && (st = b_vec(b, nm->bo, d, false, &L->bo))) return st;
    if (c->qk_norm) {
        if ((st = b_vec(b, nm->q_norm, hd, true, &L->q_norm))) return st;
        if ((st = b_vec(b, nm->k_norm, hd, true, &L->k_norm))) return st;
    }
    return KILN_OK;
}

static kiln_status bind_delta_net(binder *b, kiln_layer_weights *L) {
    const kiln_model_config *c = &b->m->cfg;
    const kiln_name_scheme *nm = b->nm;
    const int64_t d = c->n_embd, key_dim = (int64_t)c->ssm_n_k_heads * c->ssm_k_head_dim,
                  value_dim = (int64_t)c->ssm_n_v_heads * c->ssm_v_head_dim,
                  conv_dim = 2 * key_dim + value_dim;
    kiln_status st;
    if ((st = b_mat(b, nm->ssm_in_qkvz, 2 * key_dim + 2 * value_dim, d, &L->ssm_in_qkvz)))
        return st;
    if ((st = b_mat(b, nm->ssm_in_ba, 2 * (int64_t)c->ssm_n_v_heads, d, &L->ssm_in_ba))) return st;
    if ((st = b_mat(b, nm->ssm_out, d, value_dim, &L->ssm_out))) return st;
    if (!nm->ssm_conv)
        return kiln_error_set(b->err, KILN_ERR_UNSUPPORTED, "%s: no conv weight name", b->m->path);
    const char *cn = layer_name(b->m, nm->ssm_conv, b->layer);
    if (!cn) return kiln_model_oom(b->m, b->err);
    if ((st = get_f32(b->m, b->find, cn, conv_dim * c->ssm_conv_kernel, c->ssm_conv_kernel, false,
                      &L->ssm_conv, b->err)))
        return st;
    if ((st = b_vec(b, nm->ssm_a_log, c->ssm_n_v_heads, false, &L->ssm_a_log))) return st;
    if ((st = b_vec(b, nm->ssm_dt_bias, c->ssm_n_v_heads, false, &L->ssm_dt_bias))) return st;
    /* the gated norm multiplies by w itself, never 1 + w */
    if ((st = b_vec(b, nm->ssm_norm, c->ssm_v_head_dim, false, &L->ssm_norm))) return st;
    return KILN_OK;
}

static kiln_status bind_ffn(binder *b, kiln_layer_weights *L, bool moe) {
    const kiln_model_config *c = &b->m->cfg;
    const kiln_name_scheme *nm = b->nm;
    const int64_t d = c->n_embd;
    kiln_status st;
    if (!moe) {
        const int64_t ff = c->n_ff;
        if (c->ffn_gated) {
            if (nm->w_gate_up && !nm->w_gate) {
                kiln_mat gu;
                if ((st = b_mat(b, nm->w_gate_up, 2 * ff, d, &gu))) return st;
                L->w_gate = mat_rows(&gu, 0, ff); /* Phi-3: gate first, then up */
                L->w_up = mat_rows(&gu, ff, ff);
            } else {
                if ((st = b_mat(b, nm->w_gate, ff, d, &L->w_gate))) return st;
                if ((st = b_mat(b, nm->w_up, ff, d, &L->w_up))) return st;
            }
        } else if ((st = b_mat(b, nm->w_up, ff, d, &L->w_up))) {
            return st;
        }
        if ((st = b_mat(b, nm->w_down, d, ff, &L->w_down))) return st;
        if (c->ffn_bias) {
            if ((st = b_vec(b, nm->b_up, ff, false, &L->b_up))) return st;
            if ((st = b_vec(b, nm->b_down, d, false, &L->b_down))) return st;
        }
        return KILN_OK;
    }
    kiln_model *m = b->m;
    const int64_t fe = c->n_ff_expert, E = c->n_expert;
    if ((st = b_mat(b, nm->router, E, d, &L->w_router))) return st;
    L->exp_gate = kiln_model_alloc(m, (size_t)E * 3 * sizeof(kiln_mat));
    if (!L->exp_gate) return kiln_model_oom(m, b->err);
    L->exp_up = L->exp_gate + E;
    L->exp_down = L->exp_up + E;
    if (!nm->exp_gate || !nm->exp_up || !nm->exp_down)
        return kiln_error_set(b->err, KILN_ERR_UNSUPPORTED, "%s: no expert weight names", m->path);
    if (nm->exp_merged) {
        const char *pats[3] = {nm->exp_gate, nm->exp_up, nm->exp_down};
        kiln_mat *outs[3] = {L->exp_gate, L->exp_up, L->exp_down};
        for (int w = 0; w < 3; w++) {
            const int64_t n_out = w == 2 ? d : fe, n_in = w == 2 ? fe : d;
            const char *name = layer_name(m, pats[w], b->layer);
            if (!name) return kiln_model_oom(m, b->err);
            if ((st = get_experts(m, b->find, name, E, n_out, n_in, outs[w], b->err))) return st;
        }
    }
    for (int64_t e = 0; !nm->exp_merged && e < E; e++) {
        const char *gn = layer_name2(m, nm->exp_gate, b->layer, (int)e),
                   *un = layer_name2(m, nm->exp_up, b->layer, (int)e),
                   *dn = layer_name2(m, nm->exp_down, b->layer, (int)e);
        if (!gn || !un || !dn) return kiln_model_oom(m, b->err);
        if ((st = get_mat(m, b->find, gn, fe, d, &L->exp_gate[e], b->err))) return st;
        if ((st = get_mat(m, b->find, un, fe, d, &L->exp_up[e], b->err))) return st;
        if ((st = get_mat(m, b->find, dn, d, fe, &L->exp_down[e], b->err))) return st;
    }
    if (c->n_ff_shexp > 0) {
        const int64_t fs = c->n_ff_shexp;
        if ((st = b_mat(b, nm->shexp_gate, fs, d, &L->shexp_gate))) return st;
        if ((st = b_mat(b, nm->shexp_up, fs, d, &L->shexp_up))) return st;
        if ((st = b_mat(b, nm->shexp_down, d, fs, &L->shexp_down))) return st;
        if (c->shexp_gate && (st = b_mat(b, nm->shexp_router, 1, d, &L->shexp_router))) return st;
    }
    return KILN_OK;
}

static kiln_status bind_named_weights(kiln_model *m, find_fn find, const kiln_name_scheme *nm,
                                      kiln_error *err) {
    const kiln_model_config *c = &m->cfg;
    const int64_t d = c->n_embd;
    kiln_status st;
    if ((st = get_mat(m, find, nm->tok_embd, c->n_vocab, d, &m->tok_embd, err))) return st;
    if (c->learned_pos) {
        if (!nm->pos_embd)
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: no position embedding name",
                                  m->path);
        if ((st = get_mat(m, find, nm->pos_embd, c->n_ctx_train, d, &m->pos_embd, err))) return st;
    }
    if ((st = get_norm(m, find, nm->output_norm, d, &m->output_norm, err))) return st;
    if (c->norm_kind == KILN_NORM_LAYER &&
        (st = get_vec(m, find, nm->output_norm_b, d, &m->output_norm_b, err)))
        return st;
    src_tensor probe;
    if (!c->tied_embeddings && find(m, nm->output, &probe)) {
        if ((st = get_mat(m, find, nm->output, c->n_vocab, d, &m->output, err))) return st;
    } else {
        m->output = m->tok_embd;
    }
    for (int l = 0; l < c->n_layer; l++) {
        kiln_layer_weights *L = &m->layers[l];
        const kiln_layer_config *lc = &c->layer[l];
        binder b = {m, find, nm, l, err};
        if ((st = b_vec(&b, nm->attn_norm, d, true, &L->attn_norm))) return st;
        if ((st = b_vec(&b, nm->ffn_norm, d, true, &L->ffn_norm))) return st;
        if (c->norm_kind == KILN_NORM_LAYER) {
            if ((st = b_vec(&b, nm->attn_norm_b, d, false, &L->attn_norm_b))) return st;
            if ((st = b_vec(&b, nm->ffn_norm_b, d, false, &L->ffn_norm_b))) return st;
        }
        if (c->sandwich_norms) {
            if ((st = b_vec(&b, nm->post_attn_norm, d, true, &L->post_attn_norm))) return st;
            if ((st = b_vec(&b, nm->post_ffn_norm, d, true, &L->post_ffn_norm))) return st;
        }
        st =
            lc->mixer == KILN_MIXER_GATED_DELTA_NET ? bind_delta_net(&b, L) : bind_attention(&b, L);
        if (st) return st;
        if ((st = bind_ffn(&b, L, lc->moe))) return st;
    }
    return KILN_OK;
}

/* A tensor of a layer the metadata does not declare (prefix + N + "." with N >= n_layer)
 * means the file and its metadata disagree: refuse it rather than run on fewer layers. */
static kiln_status check_layer_count(const char *path, const char *name, const char *prefix,
                                     int32_t n_layer, const char *key, kiln_error *err) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) return KILN_OK;
    char *end;
    long li = strtol(name + pl, &end, 10);
    if (end == name + pl || *end != '.' || li < n_layer) return KILN_OK;
    return kiln_error_set(err, KILN_ERR_FORMAT,
                          "%s: tensor '%s' belongs to layer %ld, but %s declares %d layers", path,
                          name, li, key, n_layer);
}

kiln_status kiln_model_bind_gguf(kiln_model *m, kiln_error *err) {
    const kiln_gguf *g = m->gguf;
    kiln_status st;
    kiln_name_scheme nm = kiln_name_scheme_gguf(&m->cfg);
    if ((st = bind_named_weights(m, find_gguf, &nm, err))) return st;
    for (size_t i = 0; i < g->n_tensors; i++)
        if ((st = check_layer_count(m->path, g->tensors[i].name, "blk.", m->cfg.n_layer,
                                    "the block_count metadata", err)))
            return st;
    return KILN_OK;
}

kiln_status kiln_model_bind_hf(kiln_model *m, kiln_error *err) {
    const kiln_safetensors *sft = m->safetensors;
    kiln_status st;
    src_tensor probe;
    kiln_name_scheme nm =
        kiln_name_scheme_hf(&m->cfg, find_st(m, "transformer.wte.weight", &probe));
    if ((st = bind_named_weights(m, find_st, &nm, err))) return st;
    for (size_t i = 0; i < sft->n_tensors; i++) {
        const char *tn = sft->tensors[i].name;
        if ((st = check_layer_count(m->path, tn, "model.layers.", m->cfg.n_layer,
                                    "config.json's num_hidden_layers", err)) ||
            (st = check_layer_count(m->path, tn, "transformer.h.", m->cfg.n_layer,
                                    "config.json's n_layer", err)))
            return st;
    }
    return KILN_OK;
}

void kiln_model_bind_llama2c(kiln_model *m) {
    const kiln_llama2c *l2c = m->llama2c;
    const kiln_model_config *c = &m->cfg;
    const int64_t d = c->n_embd, hd = c->head_dim, q_dim = (int64_t)c->n_head * hd,
                  kv_dim = (int64_t)c->n_head_kv * hd, ff = c->n_ff;
#define MAT(field, ptr, no, ni)                                                                    \
    (m->field = (kiln_mat){(ptr), KILN_DTYPE_F32, (no), (ni), #field, KILN_MAT_ROWS})
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
}
