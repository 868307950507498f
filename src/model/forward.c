/*
 * forward.c - kiln's one transformer block (config.h) over a flat batch of tokens from
 * several sequences, attending over each sequence's paged KV cache, written once over the
 * backend operations table (backend/backend.h): this file computes nothing itself, it lays out
 * the activations in the backend's arena and calls operations in dataflow order.
 * Sources: Touvron et al. 2023 (LLaMA), Radford et al. 2019 (GPT-2), Gemma Team 2024
 * (Gemma 2/3), Jiang et al. 2024 (Mixtral), Yang et al. 2024 (Gated Delta Networks), and
 * transformers' modeling_{llama,mistral,qwen2,qwen3,gemma2,gemma3,phi3,mixtral,qwen3_moe,
 * gpt2,qwen3_next}.py for the exact order of operations; llama2.c run.c.
 *
 *   x = embed(token) * embed_scale (+ pos_embed(pos))
 *   per layer: x += post_attn_norm?(mixer(norm(x)))
 *              x += post_ffn_norm?(ffn(norm(x)))
 *   logits = softcap?(Wout . norm(x))
 *
 * Where the backend has the fused forms (backend.h matmul_add, matmul_glu, rope_kv_write) the
 * model calls them instead of the sequences they fuse, with the same bits: the residual add
 * into the output projection and the down projection (layers without a post-norm or a bias),
 * the GLU into the gate/up matmul, RoPE into the KV write.
 *
 * Every operation is row-wise, per (token, head), per (sequence, head) along the sequence's
 * own tokens, or a matmul with a fixed reduction order per output element, so a token's
 * result does not depend on the batch around it (DESIGN.md principle 3). MoE: a token's
 * experts come from its own router logits; each selected expert's contribution is added to
 * the token's accumulator in ascending expert id (the order of transformers' expert loop),
 * whatever other tokens chose.
 */
#include <stdbool.h>
#include <string.h>

#include "model/model.h"

/* Everything one step needs, shared by the layer functions. */
typedef struct fwd {
    const kiln_model *m;
    const kiln_model_config *c;
    kiln_backend *be;
    const kiln_backend_ops *op;
    kiln_kv_pool *pool;
    kiln_kv_pool *pool_swa; /* the sliding group's pool, or NULL (kiln_model_forward_step) */
    const kiln_step *st;
    int32_t n;
    /* activations, in the backend's arena */
    float *x, *xb, *o;             /* [n, d] */
    float *qf, *q, *gate;          /* [n, q_rows], [n, q_dim], [n, q_dim] */
    float *att;                    /* [n, q_dim] (also the delta net's [n, value_dim] core) */
    float *k, *v;                  /* [n, kv_dim] */
    float *g, *u;                  /* [n, ff_max] */
    float *acc, *xe, *de;          /* MoE: [n, d] accumulator, gathered rows, expert output */
    float *rl, *rw;                /* MoE: [n, n_expert] router probs, [n, n_expert_used] weights */
    int32_t *rsel, *erow;          /* MoE: [n, n_expert_used] selections; [n] gather list */
    float *ssm_p, *ssm_ba, *ssm_c; /* delta net: [n, 2kd+2vd], [n, 2nv], [n, conv_dim] */
} fwd;

static void matmul(fwd *f, const kiln_mat *w, const float *x, int32_t n, float *y) {
    const kiln_mm mm = {w, y};
    f->op->matmul(f->be, &mm, 1, x, n);
}

/* y_i = x w_i^T for two or three weights of the same input width (w3 may be NULL): one call,
 * one quantization of x, one fork/join; the same bits as separate matmuls */
static void matmul3(fwd *f, const kiln_mat *w1, float *y1, const kiln_mat *w2, float *y2,
                    const kiln_mat *w3, float *y3, const float *x, int32_t n) {
    const kiln_mm mm[3] = {{w1, y1}, {w2, y2}, {w3, y3}};
    f->op->matmul(f->be, mm, w3 ? 3 : 2, x, n);
}

/* Norm of each of n rows of x into out (kind from the config; b only for LayerNorm). */
static void norm_rows(const fwd *f, float *out, const float *x, const float *w, const float *b,
                      int32_t n, int64_t d) {
    f->op->norm(f->be, out, x, w, b, n, d,
                f->c->norm_kind == KILN_NORM_LAYER ? KILN_BE_NORM_LAYER : KILN_BE_NORM_RMS,
                f->c->norm_eps);
}

/* ---- attention ------------------------------------------------------------------------ */

/* o = attention block of layer l over xb (the normed input); with add_x, x += o instead
 * (o itself then unwritten), when the backend fuses it. Returns whether x was added to. */
static bool attention_layer(fwd *f, int l, bool add_x) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const int32_t n = f->n, hd = c->head_dim;
    const int64_t q_dim = (int64_t)c->n_head * hd, kv_dim = (int64_t)c->n_head_kv * hd,
                  q_rows = c->attn_out_gate ? 2 * q_dim : q_dim;
    matmul3(f, &L->wq, f->qf, &L->wk, f->k, &L->wv, f->v, f->xb, n);
    f->op->add_bias(f->be, f->qf, L->bq, n, q_rows);
    f->op->add_bias(f->be, f->k, L->bk, n, kv_dim);
    f->op->add_bias(f->be, f->v, L->bv, n, kv_dim);
    /* per head: [q (hd) | gate (hd)] (transformers Qwen3NextAttention's chunk) */
    if (c->attn_out_gate) f->op->split_heads(f->be, f->q, f->gate, f->qf, n, c->n_head, hd);
    if (c->qk_norm) {
        f->op->head_rmsnorm(f->be, f->q, n, q_dim, c->n_head, hd, L->q_norm, c->norm_eps);
        f->op->head_rmsnorm(f->be, f->k, n, kv_dim, c->n_head_kv, hd, L->k_norm, c->norm_eps);
    }
    const int adjacent = c->rope_style == KILN_ROPE_ADJACENT;
    /* the layer's group: the sliding group's pool when it holds this layer */
    kiln_kv_pool *pool = kiln_kv_pool_holds_layer(f->pool_swa, l) ? f->pool_swa : f->pool;
    if (c->rope_style != KILN_ROPE_NONE && f->op->rope_kv_write) {
        f->op->rope_kv_write(f->be, pool, l, f->st, f->q, q_dim, c->n_head, f->k, f->v,
                             c->n_head_kv, hd, c->rope_dim, L->inv_freq, adjacent);
    } else {
        if (c->rope_style != KILN_ROPE_NONE) {
            f->op->rope(f->be, f->q, q_dim, c->n_head, hd, c->rope_dim, L->inv_freq, adjacent,
                        f->st);
            f->op->rope(f->be, f->k, kv_dim, c->n_head_kv, hd, c->rope_dim, L->inv_freq,
                        adjacent, f->st);
        }
        f->op->kv_write(f->be, pool, l, f->st, f->k, f->v);
    }
    kiln_attn_params ap = {l,
                           c->n_head,
                           c->n_head_kv,
                           hd,
                           c->attn_score_div,
                           c->attn_softcap,
                           c->layer[l].sliding_window};
    if (c->attn_scale_inv_layer) ap.score_div *= (float)(l + 1);
    f->op->attention(f->be, pool, &ap, f->st, f->q, f->att);
    if (c->attn_out_gate) f->op->gate_sigmoid(f->be, f->att, f->gate, n * q_dim);
    if (add_x && !L->bo && f->op->matmul_add) {
        f->op->matmul_add(f->be, &L->wo, f->att, n, f->x);
        return true;
    }
    matmul(f, &L->wo, f->att, n, f->o);
    f->op->add_bias(f->be, f->o, L->bo, n, c->n_embd);
    return false;
}

/* ---- gated delta net (Qwen3-Next linear attention) ------------------------------------ */

static void delta_net_layer(fwd *f, int l) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const kiln_gdn_params p = {c->ssm_n_k_heads,  c->ssm_n_v_heads,   c->ssm_k_head_dim,
                               c->ssm_v_head_dim, c->ssm_conv_kernel, c->norm_eps,
                               L->ssm_conv,       L->ssm_a_log,       L->ssm_dt_bias,
                               L->ssm_norm,       L->state_off};
    matmul(f, &L->ssm_in_qkvz, f->xb, f->n, f->ssm_p);
    matmul(f, &L->ssm_in_ba, f->xb, f->n, f->ssm_ba);
    f->op->gdn_conv(f->be, f->ssm_c, f->ssm_p, &p, f->st);
    f->op->gdn_rule(f->be, f->att, f->ssm_c, f->ssm_p, f->ssm_ba, &p, f->st);
    matmul(f, &L->ssm_out, f->att, f->n, f->o);
}

/* ---- FFN ------------------------------------------------------------------------------ */

/* out[i] = down(act(gate x_i) * up x_i) for n rows of xin (g, u scratch of n * ff); with
 * add_to non-NULL, add_to[i] += that instead when the backend fuses it (out unwritten).
 * Returns whether it added. */
static bool glu_ffn(fwd *f, const kiln_mat *wg, const kiln_mat *wu, const kiln_mat *wd,
                    const float *xin, int32_t n, float *out, float *add_to) {
    if (f->op->matmul_glu && wg->dtype == wu->dtype && wg->n_out == wu->n_out) {
        f->op->matmul_glu(f->be, wg, wu, xin, n, (int)f->c->act, f->g);
    } else {
        matmul3(f, wg, f->g, wu, f->u, NULL, NULL, xin, n);
        f->op->glu(f->be, f->g, f->u, n * wg->n_out, (int)f->c->act);
    }
    if (add_to && f->op->matmul_add) {
        f->op->matmul_add(f->be, wd, f->g, n, add_to);
        return true;
    }
    matmul(f, wd, f->g, n, out);
    return false;
}

/* routing, per token: softmax over the router logits, top-k (ties: lower id), then optionally
 * renormalised (transformers' MixtralTopKRouter / Qwen3MoeTopKRouter); each expert's rows
 * gathered, run, and scattered into the accumulator in ascending expert id */
static void moe_ffn(fwd *f, int l) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const int32_t n = f->n, E = c->n_expert, k = c->n_expert_used;
    const int64_t d = c->n_embd;
    matmul(f, &L->w_router, f->xb, n, f->rl);
    f->op->moe_route(f->be, f->rl, f->rsel, f->rw, n, E, k, c->expert_norm_topk);
    f->op->zero(f->be, f->acc, (int64_t)n * d);
    for (int32_t e = 0; e < E; e++) {
        const int32_t m = f->op->moe_gather(f->be, f->xe, f->erow, f->xb, f->rsel, n, k, d, e);
        if (m == 0) continue;
        glu_ffn(f, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], f->xe, m, f->de, NULL);
        f->op->moe_scatter(f->be, f->acc, f->de, f->erow, f->rw, m, k, d);
    }
    if (c->n_ff_shexp > 0) {
        glu_ffn(f, &L->shexp_gate, &L->shexp_up, &L->shexp_down, f->xb, n, f->de, NULL);
        if (c->shexp_gate) matmul(f, &L->shexp_router, f->xb, n, f->rl); /* [n, 1] */
        f->op->moe_shared(f->be, f->o, f->acc, f->de, c->shexp_gate ? f->rl : NULL, n, d);
    } else {
        f->op->copy(f->be, f->o, f->acc, (int64_t)n * d);
    }
}

/* o = the FFN of layer l over xb; with add_x, x += o instead when the backend fuses it.
 * Returns whether x was added to. */
static bool ffn_layer(fwd *f, int l, bool add_x) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const int32_t n = f->n;
    if (c->layer[l].moe) {
        moe_ffn(f, l);
    } else if (c->ffn_gated) {
        return glu_ffn(f, &L->w_gate, &L->w_up, &L->w_down, f->xb, n, f->o,
                       add_x ? f->x : NULL);
    } else {
        matmul(f, &L->w_up, f->xb, n, f->u);
        f->op->add_bias(f->be, f->u, L->b_up, n, c->n_ff);
        f->op->act(f->be, f->u, (int64_t)n * c->n_ff, (int)c->act);
        matmul(f, &L->w_down, f->u, n, f->o);
        f->op->add_bias(f->be, f->o, L->b_down, n, c->n_embd);
    }
    return false;
}

/* ---- activations ---------------------------------------------------------------------- */

/* Bump allocator over the arena. */
typedef struct carve {
    char *base;
    size_t used;
} carve;

static float *take(carve *cv, size_t n) {
    float *p = cv->base ? (float *)(void *)(cv->base + cv->used) : NULL;
    cv->used += ((n + 15) & ~(size_t)15) * sizeof(float); /* keep 64-byte granularity */
    return p;
}

/* Lay out a step's activation buffers for n tokens; with cv->base NULL only measures. */
static void layout(fwd *f, carve *cv) {
    const kiln_model_config *c = f->c;
    const size_t n = (size_t)f->n, d = (size_t)c->n_embd, hd = (size_t)c->head_dim;
    const size_t q_dim = (size_t)c->n_head * hd, kv_dim = (size_t)c->n_head_kv * hd;
    const size_t q_rows = c->attn_out_gate ? 2 * q_dim : q_dim;
    const bool moe = kiln_config_has_moe(c),
               gdn = kiln_config_has_mixer(c, KILN_MIXER_GATED_DELTA_NET);
    size_t ff = (size_t)c->n_ff;
    if (moe && (size_t)c->n_ff_expert > ff) ff = (size_t)c->n_ff_expert;
    if (moe && (size_t)c->n_ff_shexp > ff) ff = (size_t)c->n_ff_shexp;
    const size_t key_dim = (size_t)c->ssm_n_k_heads * (size_t)c->ssm_k_head_dim,
                 value_dim = (size_t)c->ssm_n_v_heads * (size_t)c->ssm_v_head_dim;
    size_t att = q_dim;
    if (gdn && value_dim > att) att = value_dim;
    f->x = take(cv, n * d);
    f->xb = take(cv, n * d);
    f->o = take(cv, n * d);
    f->qf = take(cv, n * q_rows);
    f->q = c->attn_out_gate ? take(cv, n * q_dim) : f->qf;
    f->gate = c->attn_out_gate ? take(cv, n * q_dim) : NULL;
    f->att = take(cv, n * att);
    f->k = take(cv, n * kv_dim);
    f->v = take(cv, n * kv_dim);
    f->g = take(cv, n * ff);
    f->u = take(cv, n * ff);
    if (moe) {
        const size_t E = (size_t)c->n_expert, k = (size_t)c->n_expert_used;
        f->acc = take(cv, n * d);
        f->xe = take(cv, n * d);
        f->de = take(cv, n * d);
        f->rl = take(cv, n * (E > 1 ? E : 1));
        f->rw = take(cv, n * k);
        f->rsel = (int32_t *)take(cv, n * k);
        f->erow = (int32_t *)take(cv, n);
    }
    if (gdn) {
        f->ssm_p = take(cv, n * (2 * key_dim + 2 * value_dim));
        f->ssm_ba = take(cv, n * 2 * (size_t)c->ssm_n_v_heads);
        f->ssm_c = take(cv, n * (2 * key_dim + value_dim));
    }
}

kiln_backend_reserve kiln_model_reserve(const kiln_model *m, int32_t max_tokens, int32_t max_keys) {
    const kiln_model_config *c = &m->cfg;
    fwd f = {.m = m, .c = c, .n = max_tokens > 0 ? max_tokens : 1};
    carve cv = {NULL, 0};
    layout(&f, &cv);
    kiln_backend_reserve r = {.act_bytes = cv.used,
                              .max_tokens = f.n,
                              .max_keys = max_keys > 0 ? max_keys : 1,
                              .n_head = c->n_head,
                              .n_head_kv = c->n_head_kv,
                              .head_dim = c->head_dim};
    if (kiln_config_has_mixer(c, KILN_MIXER_GATED_DELTA_NET))
        r.gdn_head_dim =
            c->ssm_k_head_dim > c->ssm_v_head_dim ? c->ssm_k_head_dim : c->ssm_v_head_dim;
    return r;
}

/* ---- the step -------------------------------------------------------------------------- */

void kiln_model_forward_step(const kiln_model *m, kiln_backend *be, kiln_kv_pool *pool,
                             kiln_kv_pool *pool_swa, const kiln_step *st, float *logits) {
    const kiln_model_config *c = &m->cfg;
    const kiln_batch *b = st->b;
    fwd F = {.m = m,
             .c = c,
             .be = be,
             .op = be->ops,
             .pool = pool,
             .pool_swa = pool_swa,
             .st = st,
             .n = st->n_tokens};
    fwd *f = &F;
    carve cv = {be->ops->arena(be), 0};
    layout(f, &cv);
    const int32_t n = f->n;
    const int64_t d = c->n_embd;

    f->op->embed(be, f->x, f->xb, &m->tok_embd, c->learned_pos ? &m->pos_embd : NULL,
                 c->embed_scale, st);
    for (int l = 0; l < c->n_layer; l++) {
        const kiln_layer_weights *L = &m->layers[l];
        norm_rows(f, f->xb, f->x, L->attn_norm, L->attn_norm_b, n, d);
        /* the residual adds may be fused into the last matmul (backend.h matmul_add) */
        bool added = false;
        if (c->layer[l].mixer == KILN_MIXER_GATED_DELTA_NET)
            delta_net_layer(f, l);
        else
            added = attention_layer(f, l, !L->post_attn_norm);
        if (!added) {
            if (L->post_attn_norm) norm_rows(f, f->o, f->o, L->post_attn_norm, NULL, n, d);
            f->op->add(be, f->x, f->o, (int64_t)n * d);
        }

        norm_rows(f, f->xb, f->x, L->ffn_norm, L->ffn_norm_b, n, d);
        if (!ffn_layer(f, l, !L->post_ffn_norm)) {
            if (L->post_ffn_norm) norm_rows(f, f->o, f->o, L->post_ffn_norm, NULL, n, d);
            f->op->add(be, f->x, f->o, (int64_t)n * d);
        }
    }

    if (logits && b->n_out > 0) {
        f->op->gather_rows(be, f->o, f->x, b->out, b->n_out, d);
        norm_rows(f, f->xb, f->o, m->output_norm, m->output_norm_b, b->n_out, d);
        matmul(f, &m->output, f->xb, b->n_out, logits);
        if (c->final_softcap > 0.0f)
            f->op->softcap(be, logits, (int64_t)b->n_out * c->n_vocab, c->final_softcap);
    }
}
