/*
 * forward.c - the Llama-family transformer block over a run of tokens of one sequence.
 * Source: Touvron et al. 2023 (LLaMA), transformers' modeling_llama.py, llama2.c run.c.
 *
 *   x = embed(token)
 *   per layer: h = x + Wo . attn(rope(Wq . rms(x)), rope(Wk . rms(x)), Wv . rms(x))
 *              x = h + Wdown . (silu(Wgate . rms(h)) * (Wup . rms(h)))
 *   logits = Wout . rms(x)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/ops.h"
#include "model/model.h"
#include "util/error.h"

kiln_status kiln_kv_seq_create(const kiln_model *m, int32_t n_ctx, kiln_dtype dtype,
                               kiln_kv_seq **out, kiln_error *err) {
    *out = NULL;
    if (n_ctx < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n_ctx must be >= 1 (got %d)", n_ctx);
    if (dtype != KILN_DTYPE_F32 && dtype != KILN_DTYPE_F16)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "KV cache type must be f32 or f16 (got %s)", kiln_dtype_name(dtype));
    kiln_kv_seq *kv = calloc(1, sizeof *kv);
    if (!kv) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kv->n_ctx = n_ctx;
    kv->n_layer = m->cfg.n_layer;
    kv->kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim;
    kv->dtype = dtype;
    size_t n = (size_t)kv->n_layer * (size_t)n_ctx * (size_t)kv->kv_dim;
    size_t esz = dtype == KILN_DTYPE_F16 ? sizeof(uint16_t) : sizeof(float);
    kv->k = calloc(n, esz);
    kv->v = calloc(n, esz);
    if (!kv->k || !kv->v) {
        kiln_kv_seq_destroy(kv);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "out of memory allocating a KV cache of %d positions", n_ctx);
    }
    *out = kv;
    return KILN_OK;
}

void kiln_kv_seq_destroy(kiln_kv_seq *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

typedef struct attn_job {
    const kiln_model *m;
    const kiln_kv_seq *kv;
    int layer;
    int32_t n, pos0;
    const float *q; /* [n, n_head*hd] */
    float *out;     /* [n, n_head*hd] */
    float *scores;  /* [nth, n_ctx] */
    uint16_t *q16;  /* [nth, head_dim] */
} attn_job;

static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    const kiln_model_config *c = &j->m->cfg;
    const int32_t hd = c->head_dim, group = c->n_head / c->n_head_kv;
    const int64_t q_dim = (int64_t)c->n_head * hd;
    const size_t layer_off = (size_t)j->layer * (size_t)j->kv->n_ctx * (size_t)j->kv->kv_dim;
    float *scores = j->scores + (size_t)ith * (size_t)j->kv->n_ctx;
    const float div = sqrtf((float)hd);
    const int64_t total = (int64_t)j->n * c->n_head;
    for (int64_t w = ith; w < total; w += nth) {
        int32_t i = (int32_t)(w / c->n_head), h = (int32_t)(w % c->n_head);
        int32_t kvh = h / group;
        const size_t off = layer_off + (size_t)kvh * hd;
        float *out = j->out + i * q_dim + (int64_t)h * hd;
        const float *q = j->q + i * q_dim + (int64_t)h * hd;
        if (j->kv->dtype == KILN_DTYPE_F16)
            kiln_attention_head_f16(out, q, (const uint16_t *)j->kv->k + off,
                                    (const uint16_t *)j->kv->v + off, j->kv->kv_dim, j->pos0 + i + 1,
                                    hd, div, scores, j->q16 + (size_t)ith * hd);
        else
            kiln_attention_head(out, q, (const float *)j->kv->k + off, (const float *)j->kv->v + off,
                                j->kv->kv_dim, j->pos0 + i + 1, hd, div, scores);
    }
}

static void embed_row(const kiln_mat *e, int32_t token, float *out) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(e->dtype);
    size_t row = kiln_dtype_row_size(e->dtype, e->n_in);
    tr->to_float((const char *)e->data + (size_t)token * row, out, e->n_in);
}

kiln_status kiln_model_forward(const kiln_model *m, kiln_kv_seq *kv, kiln_threadpool *tp,
                               const int32_t *tokens, int32_t n, int32_t pos0, bool want_all,
                               float *logits, kiln_error *err) {
    const kiln_model_config *c = &m->cfg;
    if (n < 1) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "forward: no tokens");
    if (pos0 < 0 || (int64_t)pos0 + n > kv->n_ctx)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "forward: positions %d..%d exceed the context of %d", pos0,
                              pos0 + n - 1, kv->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: token id %d at index %d is outside [0, %d)", tokens[i],
                                  i, c->n_vocab);
    const int64_t d = c->n_embd, hd = c->head_dim, q_dim = (int64_t)c->n_head * hd,
                  kv_dim = kv->kv_dim, ff = c->n_ff;
    const int nth = kiln_threadpool_size(tp);
    size_t need = (size_t)n * (size_t)(2 * d + 2 * q_dim + 2 * kv_dim + 2 * ff) +
                  (size_t)nth * (size_t)(kv->n_ctx + hd);
    float *buf = malloc(need * sizeof(float));
    if (!buf) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "forward: out of memory");
    float *x = buf, *xb = x + n * d, *q = xb + n * d, *att = q + n * q_dim, *k = att + n * q_dim,
          *v = k + n * kv_dim, *g = v + n * kv_dim, *u = g + n * ff, *scores = u + n * ff;

    for (int32_t i = 0; i < n; i++) embed_row(&m->tok_embd, tokens[i], x + i * d);

    for (int l = 0; l < c->n_layer; l++) {
        const kiln_layer_weights *L = &m->layers[l];
        for (int32_t i = 0; i < n; i++) kiln_rmsnorm(xb + i * d, x + i * d, L->attn_norm, d, c->norm_eps);
        kiln_cpu_matmul(tp, L->wq.data, L->wq.dtype, q_dim, d, xb, n, q);
        kiln_cpu_matmul(tp, L->wk.data, L->wk.dtype, kv_dim, d, xb, n, k);
        kiln_cpu_matmul(tp, L->wv.data, L->wv.dtype, kv_dim, d, xb, n, v);
        const int adjacent = c->rope_style == KILN_ROPE_ADJACENT;
        for (int32_t i = 0; i < n; i++) {
            kiln_rope(q + i * q_dim, c->n_head, (int32_t)hd, pos0 + i, m->inv_freq, adjacent);
            kiln_rope(k + i * kv_dim, c->n_head_kv, (int32_t)hd, pos0 + i, m->inv_freq, adjacent);
            size_t off = ((size_t)l * (size_t)kv->n_ctx + (size_t)(pos0 + i)) * (size_t)kv_dim;
            if (kv->dtype == KILN_DTYPE_F16) {
                for (int64_t e = 0; e < kv_dim; e++) {
                    ((uint16_t *)kv->k)[off + e] = kiln_fp32_to_fp16(k[i * kv_dim + e]);
                    ((uint16_t *)kv->v)[off + e] = kiln_fp32_to_fp16(v[i * kv_dim + e]);
                }
            } else {
                memcpy((float *)kv->k + off, k + i * kv_dim, (size_t)kv_dim * sizeof(float));
                memcpy((float *)kv->v + off, v + i * kv_dim, (size_t)kv_dim * sizeof(float));
            }
        }
        attn_job job = {m, kv, l, n, pos0, q, att, scores, (uint16_t *)(scores + (size_t)nth * kv->n_ctx)};
        kiln_threadpool_run(tp, attn_worker, &job);
        kiln_cpu_matmul(tp, L->wo.data, L->wo.dtype, d, q_dim, att, n, xb);
        for (int64_t i = 0; i < n * d; i++) x[i] += xb[i];

        for (int32_t i = 0; i < n; i++) kiln_rmsnorm(xb + i * d, x + i * d, L->ffn_norm, d, c->norm_eps);
        kiln_cpu_matmul(tp, L->w_gate.data, L->w_gate.dtype, ff, d, xb, n, g);
        kiln_cpu_matmul(tp, L->w_up.data, L->w_up.dtype, ff, d, xb, n, u);
        kiln_swiglu(g, u, n * ff);
        kiln_cpu_matmul(tp, L->w_down.data, L->w_down.dtype, d, ff, g, n, xb);
        for (int64_t i = 0; i < n * d; i++) x[i] += xb[i];
    }

    if (logits) {
        int32_t first = want_all ? 0 : n - 1, rows = want_all ? n : 1;
        for (int32_t i = 0; i < rows; i++)
            kiln_rmsnorm(xb + i * d, x + (first + i) * d, m->output_norm, d, c->norm_eps);
        kiln_cpu_matmul(tp, m->output.data, m->output.dtype, c->n_vocab, d, xb, rows, logits);
    }
    free(buf);
    return KILN_OK;
}
