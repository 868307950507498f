/*
 * forward.c - kiln's one transformer block (config.h) over a flat batch of tokens from
 * several sequences, attending over each sequence's paged KV cache.
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
 * Every operation is row-wise, per (token, head), per (sequence, head) along the sequence's
 * own tokens, or a matmul with a fixed reduction order per output element, so a token's
 * result does not depend on the batch around it (DESIGN.md principle 3). MoE: a token's
 * experts come from its own router logits; each selected expert's contribution is added to
 * the token's accumulator in ascending expert id (the order of transformers' expert loop),
 * whatever other tokens chose.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/ops.h"
#include "model/model.h"
#include "util/error.h"

#define STATE_HEADER_FLOATS 16 /* must match model.c's KILN_STATE_HEADER_FLOATS */
#define KILN_ATTN_MAX_TILE  16 /* query tokens per attention work item, at most */

/* ---- single-sequence cache: a private pool ------------------------------------------- */

kiln_status kiln_kv_seq_create(const kiln_model *m, int32_t n_ctx, kiln_dtype dtype,
                               kiln_kv_seq **out, kiln_error *err) {
    *out = NULL;
    if (n_ctx < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n_ctx must be >= 1 (got %d)", n_ctx);
    kiln_kv_seq *kv = calloc(1, sizeof *kv);
    if (!kv) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kv->n_ctx = n_ctx;
    kiln_kv_pool_params pp = {
        .n_layer = m->cfg.n_layer,
        .kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim,
        .block_size = KILN_KV_DEFAULT_BLOCK_SIZE,
        .n_blocks = kiln_kv_blocks_for_tokens(n_ctx, KILN_KV_DEFAULT_BLOCK_SIZE),
        .dtype = dtype,
    };
    kiln_status st = kiln_kv_pool_create(&pp, &kv->pool, err);
    if (st == KILN_OK) st = kiln_block_table_reserve(&kv->table, kv->pool, n_ctx, err);
    if (st == KILN_OK && m->state_floats > 0) {
        kv->rec_state = calloc((size_t)m->state_floats, sizeof(float));
        if (!kv->rec_state)
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                "out of memory for the recurrent state");
    }
    if (st != KILN_OK) {
        kiln_kv_seq_destroy(kv);
        return st;
    }
    *out = kv;
    return KILN_OK;
}

void kiln_kv_seq_destroy(kiln_kv_seq *kv) {
    if (!kv) return;
    if (kv->pool) kiln_block_table_release(&kv->table, kv->pool);
    kiln_kv_pool_destroy(kv->pool);
    free(kv->rec_state);
    free(kv);
}

kiln_status kiln_model_forward(const kiln_model *m, kiln_kv_seq *kv, kiln_threadpool *tp,
                               const int32_t *tokens, int32_t n, int32_t pos0, bool want_all,
                               float *logits, kiln_error *err) {
    if (n < 1) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "forward: no tokens");
    if (pos0 < 0 || (int64_t)pos0 + n > kv->n_ctx)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "forward: positions %d..%d exceed the context of %d", pos0,
                              pos0 + n - 1, kv->n_ctx);
    int32_t *out = NULL, n_out = 0;
    if (logits) {
        n_out = want_all ? n : 1;
        out = malloc((size_t)n_out * sizeof *out);
        if (!out) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "forward: out of memory");
        for (int32_t i = 0; i < n_out; i++) out[i] = want_all ? i : n - 1;
    }
    kiln_batch_seq seq = {.block_table = kv->table.blocks,
                          .n_past = pos0,
                          .n_new = n,
                          .first = 0,
                          .n_blocks = kv->table.n_blocks,
                          .rec_state = kv->rec_state};
    kiln_batch b = {n, tokens, 1, &seq, n_out, out};
    kiln_status st = kiln_model_forward_batch(m, kv->pool, tp, &b, logits, err);
    free(out);
    return st;
}

/* ---- the batch forward ---------------------------------------------------------------- */

/* Everything one step needs, shared by the layer functions. */
typedef struct fwd {
    const kiln_model *m;
    const kiln_model_config *c;
    kiln_kv_pool *pool;
    kiln_threadpool *tp;
    const kiln_batch *b;
    int32_t n, nth, bs, max_keys;
    bool f16;
    const int32_t *tok_seq, *tok_pos; /* [n] */
    const int64_t *ptr_off;           /* [n_seqs] offset of each seq's block pointer list */
    const void **kb, **vb;            /* block base pointers for the current layer */
    /* activations */
    float *x, *xb, *o;             /* [n, d] */
    float *qf, *q, *gate;          /* [n, q_rows], [n, q_dim], [n, q_dim] */
    float *att;                    /* [n, q_dim] (also the delta net's [n, value_dim] core) */
    float *k, *v;                  /* [n, kv_dim] */
    float *g, *u;                  /* [n, ff_max] */
    float *acc, *xe, *de;          /* MoE: [n, d] accumulator, gathered rows, expert output */
    float *rl, *rw;                /* MoE: [n, n_expert] router probs, [n, n_expert_used] weights */
    int32_t *rsel, *erow;          /* MoE: [n, n_expert_used] selections; [n] gather list */
    float *ssm_p, *ssm_ba, *ssm_c; /* delta net: [n, 2kd+2vd], [n, 2nv], [n, conv_dim] */
    int32_t attn_tile;             /* query tokens per attention work item */
    int32_t attn_per;              /* attention items dealt together (attn_worker) */
    size_t attn_scratch_floats;    /* per thread, a multiple of 16 */
    float *attn_scratch;           /* [nth, attn_scratch_floats] */
    float *scratch;                /* [nth, 4 * max(k_head_dim, v_head_dim)] delta-net per thread */
} fwd;

static void add_bias(float *y, const float *bias, int32_t n, int64_t dim) {
    if (!bias) return;
    for (int32_t i = 0; i < n; i++)
        for (int64_t j = 0; j < dim; j++) y[i * dim + j] += bias[j];
}

static kiln_cpu_mm_out mm_out(const kiln_mat *w, float *y) {
    return (kiln_cpu_mm_out){w->data, w->dtype, w->n_out, y, w->layout};
}

static void matmul(fwd *f, const kiln_mat *w, const float *x, int32_t n, float *y) {
    const kiln_cpu_mm_out out = mm_out(w, y);
    kiln_cpu_matmul_multi(f->tp, &out, 1, w->n_in, x, n);
}

/* y_i = x w_i^T for two or three weights of the same input width (w3 may be NULL): one call,
 * one quantization of x, one fork/join; the same bits as separate matmuls */
static void matmul3(fwd *f, const kiln_mat *w1, float *y1, const kiln_mat *w2, float *y2,
                    const kiln_mat *w3, float *y3, const float *x, int32_t n) {
    kiln_cpu_mm_out outs[3] = {mm_out(w1, y1), mm_out(w2, y2), {0}};
    if (w3) outs[2] = mm_out(w3, y3);
    kiln_cpu_matmul_multi(f->tp, outs, w3 ? 3 : 2, w1->n_in, x, n);
}

/* Norm of each of n rows of x into out (kind from the config; b only for LayerNorm). */
static void norm_rows(const fwd *f, float *out, const float *x, const float *w, const float *b,
                      int32_t n, int64_t d) {
    for (int32_t i = 0; i < n; i++) {
        if (f->c->norm_kind == KILN_NORM_LAYER)
            kiln_layernorm(out + i * d, x + i * d, w, b, d, f->c->norm_eps);
        else
            kiln_rmsnorm(out + i * d, x + i * d, w, d, f->c->norm_eps);
    }
}

static float sigmoidf(float v) {
    return 1.0f / (1.0f + expf(-v));
}

/* torch.nn.functional.softplus (beta 1, threshold 20). */
static float softplusf(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

/* ---- attention ------------------------------------------------------------------------ */

typedef struct attn_job {
    fwd *f;
    int layer;
    float score_div, softcap;
    int32_t window;
} attn_job;

/* Whether dealing whole (sequence, tile) units round-robin keeps nth threads balanced: at
 * least two sequences per thread, and no thread with more than 5/4 of the mean work, a
 * unit's work taken as its tokens x the keys of its last token (sequences of very different
 * lengths, e.g. 2000/50/50/50 keys, would give one thread ~1.9x the mean). Decided once per
 * batch (f->attn_per), so every thread of every layer uses the same deal. */
static bool whole_units_balanced(const kiln_batch *b, int32_t M, int nth) {
    enum { MAX_NTH = 64 };
    if (b->n_seqs < 2 * nth || nth > MAX_NTH) return false;
    double load[MAX_NTH] = {0}, total = 0;
    int64_t u = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const kiln_batch_seq *sq = &b->seqs[s];
        for (int32_t t0 = 0; t0 < sq->n_new; t0 += M, u++) {
            const int32_t nt = sq->n_new - t0 < M ? sq->n_new - t0 : M;
            const double work = (double)nt * (double)(sq->n_past + t0 + nt);
            load[u % nth] += work;
            total += work;
        }
    }
    for (int i = 0; i < nth; i++)
        if (load[i] * nth > 1.25 * total) return false;
    return true;
}

/* Work items: (sequence, tile of up to attn_tile consecutive new tokens, KV head); each runs
 * kiln_attention_group for the tile's tokens and the KV head's query heads. Every (token,
 * head) result is independent of the tiling (ops.h), so any split gives the same bits.
 * With at least two sequences per thread (and a balanced deal: whole_units_balanced, f->attn_per),
 * the KV heads of a (sequence, tile) all go to one thread, tiles dealt round-robin: a KV block row
 * holds every head's slice of a token, so one core then reads whole rows instead of two cores each
 * reading every other head's slice (128 bytes in f16, 256 in f32 for head_dim 64). tinyllama Q4_0,
 * 2 threads, 16 sequences decoding: attention 14.3% -> 11.8% of the step at 128-256 keys (perf);
 * A/B 1.10x (3 pairs) at 512-544 keys, 1.00-1.04x at 128-192. Otherwise (one sequence decoding, one
 * prompt's prefill, lengths far apart) the items are dealt round-robin one by one. */
static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    fwd *f = j->f;
    const kiln_model_config *c = f->c;
    const int32_t hd = c->head_dim, G = c->n_head / c->n_head_kv, M = f->attn_tile;
    const int64_t q_dim = (int64_t)c->n_head * hd, kv_dim = (int64_t)c->n_head_kv * hd;
    float *scratch = f->attn_scratch + (size_t)ith * f->attn_scratch_floats;
    int64_t w = 0;
    const int64_t per = f->attn_per;
    for (int32_t s = 0; s < f->b->n_seqs; s++) {
        const kiln_batch_seq *sq = &f->b->seqs[s];
        const int32_t tiles = (sq->n_new + M - 1) / M;
        for (int32_t tl = 0; tl < tiles; tl++) {
            for (int32_t g = 0; g < c->n_head_kv; g++, w++) {
                if (w / per % nth != ith) continue;
                const int32_t i0 = sq->first + tl * M;
                const int32_t nt = sq->first + sq->n_new - i0 < M ? sq->first + sq->n_new - i0 : M;
                int32_t begin[KILN_ATTN_MAX_TILE], end[KILN_ATTN_MAX_TILE];
                for (int32_t k = 0; k < nt; k++) {
                    const int32_t pos = f->tok_pos[i0 + k];
                    begin[k] = j->window > 0 && pos - j->window + 1 > 0 ? pos - j->window + 1 : 0;
                    end[k] = pos + 1;
                }
                const int64_t po = f->ptr_off[s];
                const kiln_attn_kv kv = {f->kb + po,      f->vb + po, f->bs, kv_dim,
                                         (int64_t)g * hd, hd,         f->f16};
                kiln_attention_group(f->att + i0 * q_dim + (int64_t)g * G * hd, q_dim,
                                     f->q + i0 * q_dim + (int64_t)g * G * hd, q_dim, G, nt, begin,
                                     end, &kv, j->score_div, j->softcap, scratch);
            }
        }
    }
}

/* o = attention block of layer l over xb (the normed input). */
static void attention_layer(fwd *f, int l) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const int32_t n = f->n, hd = c->head_dim;
    const int64_t q_dim = (int64_t)c->n_head * hd, kv_dim = (int64_t)c->n_head_kv * hd,
                  q_rows = c->attn_out_gate ? 2 * q_dim : q_dim;
    matmul3(f, &L->wq, f->qf, &L->wk, f->k, &L->wv, f->v, f->xb, n);
    add_bias(f->qf, L->bq, n, q_rows);
    add_bias(f->k, L->bk, n, kv_dim);
    add_bias(f->v, L->bv, n, kv_dim);
    if (c->attn_out_gate) {
        /* per head: [q (hd) | gate (hd)] (transformers Qwen3NextAttention's chunk) */
        for (int32_t i = 0; i < n; i++)
            for (int32_t h = 0; h < c->n_head; h++) {
                const float *src = f->qf + i * q_rows + (int64_t)h * 2 * hd;
                memcpy(f->q + i * q_dim + (int64_t)h * hd, src, (size_t)hd * sizeof(float));
                memcpy(f->gate + i * q_dim + (int64_t)h * hd, src + hd, (size_t)hd * sizeof(float));
            }
    }
    if (c->qk_norm) {
        for (int32_t i = 0; i < n; i++) {
            for (int32_t h = 0; h < c->n_head; h++) {
                float *qh = f->q + i * q_dim + (int64_t)h * hd;
                kiln_rmsnorm(qh, qh, L->q_norm, hd, c->norm_eps);
            }
            for (int32_t h = 0; h < c->n_head_kv; h++) {
                float *kh = f->k + i * kv_dim + (int64_t)h * hd;
                kiln_rmsnorm(kh, kh, L->k_norm, hd, c->norm_eps);
            }
        }
    }
    const size_t esz = f->f16 ? sizeof(uint16_t) : sizeof(float);
    const int adjacent = c->rope_style == KILN_ROPE_ADJACENT;
    for (int32_t i = 0; i < n; i++) {
        const int32_t pos = f->tok_pos[i];
        if (c->rope_style != KILN_ROPE_NONE) {
            kiln_rope(f->q + i * q_dim, c->n_head, hd, c->rope_dim, pos, L->inv_freq, adjacent);
            kiln_rope(f->k + i * kv_dim, c->n_head_kv, hd, c->rope_dim, pos, L->inv_freq, adjacent);
        }
        const int32_t block = f->b->seqs[f->tok_seq[i]].block_table[pos / f->bs];
        char *kr = (char *)kiln_kv_pool_k(f->pool, l, block) + (size_t)(pos % f->bs) * kv_dim * esz;
        char *vr = (char *)kiln_kv_pool_v(f->pool, l, block) + (size_t)(pos % f->bs) * kv_dim * esz;
        if (f->f16) {
            for (int64_t e = 0; e < kv_dim; e++) {
                ((uint16_t *)kr)[e] = kiln_fp32_to_fp16(f->k[i * kv_dim + e]);
                ((uint16_t *)vr)[e] = kiln_fp32_to_fp16(f->v[i * kv_dim + e]);
            }
        } else {
            memcpy(kr, f->k + i * kv_dim, (size_t)kv_dim * sizeof(float));
            memcpy(vr, f->v + i * kv_dim, (size_t)kv_dim * sizeof(float));
        }
    }
    for (int32_t s = 0; s < f->b->n_seqs; s++) {
        const kiln_batch_seq *sq = &f->b->seqs[s];
        int32_t nb = kiln_kv_blocks_for_tokens(sq->n_past + sq->n_new, f->bs);
        for (int32_t i = 0; i < nb; i++) {
            f->kb[f->ptr_off[s] + i] = kiln_kv_pool_k(f->pool, l, sq->block_table[i]);
            f->vb[f->ptr_off[s] + i] = kiln_kv_pool_v(f->pool, l, sq->block_table[i]);
        }
    }
    attn_job job = {f, l, c->attn_score_div, c->attn_softcap, c->layer[l].sliding_window};
    if (c->attn_scale_inv_layer) job.score_div *= (float)(l + 1);
    kiln_threadpool_run(f->tp, attn_worker, &job);
    if (c->attn_out_gate)
        for (int64_t e = 0; e < n * q_dim; e++) f->att[e] = f->att[e] * sigmoidf(f->gate[e]);
    matmul(f, &L->wo, f->att, n, f->o);
    add_bias(f->o, L->bo, n, c->n_embd);
}

/* ---- gated delta net (Qwen3-Next linear attention) ------------------------------------ */

typedef struct gdn_job {
    fwd *f;
    int layer;
} gdn_job;

/* The delta rule along one sequence's tokens for one value head (Yang et al. 2024; the
 * recurrent form of transformers' torch_recurrent_gated_delta_rule, then the gated RMSNorm):
 *   S *= exp(g);  delta = (v - S^T k) * beta;  S += k delta^T;  o = S^T q
 *   o = rms(o) * w * silu(z) */
static void gdn_worker(void *ctx, int ith, int nth) {
    gdn_job *j = ctx;
    fwd *f = j->f;
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[j->layer];
    const int32_t nk = c->ssm_n_k_heads, nv = c->ssm_n_v_heads, hk = c->ssm_k_head_dim,
                  hv = c->ssm_v_head_dim, r = nv / nk, K = c->ssm_conv_kernel;
    const int64_t key_dim = (int64_t)nk * hk, value_dim = (int64_t)nv * hv,
                  conv_dim = 2 * key_dim + value_dim, grp = 2 * (int64_t)hk + 2 * (int64_t)r * hv,
                  proj = 2 * key_dim + 2 * value_dim;
    const int32_t mx = hk > hv ? hk : hv;
    float *qn = f->scratch + (size_t)ith * 4 * (size_t)mx, *kn = qn + mx, *kvm = kn + mx,
          *ov = kvm + mx;
    const float qscale = 1.0f / sqrtf((float)hk);
    const int64_t total = (int64_t)f->b->n_seqs * nv;
    for (int64_t w = ith; w < total; w += nth) {
        const int32_t s = (int32_t)(w / nv), h = (int32_t)(w % nv), kh = h / r;
        const kiln_batch_seq *sq = &f->b->seqs[s];
        float *S = sq->rec_state + L->state_off + conv_dim * (K - 1) + (int64_t)h * hk * hv;
        const float A = expf(L->ssm_a_log[h]);
        for (int32_t t = 0; t < sq->n_new; t++) {
            const int32_t i = sq->first + t;
            const float *cr = f->ssm_c + i * conv_dim;
            memcpy(qn, cr + (int64_t)kh * hk, (size_t)hk * sizeof(float));
            memcpy(kn, cr + key_dim + (int64_t)kh * hk, (size_t)hk * sizeof(float));
            kiln_l2norm(qn, hk, 1e-6f);
            kiln_l2norm(kn, hk, 1e-6f);
            for (int32_t e = 0; e < hk; e++) qn[e] *= qscale;
            const float *vv = cr + 2 * key_dim + (int64_t)h * hv;
            const float *ba = f->ssm_ba + i * 2 * (int64_t)nv + (int64_t)kh * 2 * r;
            const float beta = sigmoidf(ba[h % r]);
            const float g = -A * softplusf(ba[r + h % r] + L->ssm_dt_bias[h]);
            const float decay = expf(g);
            for (int64_t e = 0; e < (int64_t)hk * hv; e++) S[e] *= decay;
            for (int32_t b2 = 0; b2 < hv; b2++) kvm[b2] = 0.0f;
            for (int32_t a = 0; a < hk; a++)
                for (int32_t b2 = 0; b2 < hv; b2++) kvm[b2] += S[a * hv + b2] * kn[a];
            for (int32_t b2 = 0; b2 < hv; b2++) kvm[b2] = (vv[b2] - kvm[b2]) * beta;
            for (int32_t a = 0; a < hk; a++)
                for (int32_t b2 = 0; b2 < hv; b2++) S[a * hv + b2] += kn[a] * kvm[b2];
            for (int32_t b2 = 0; b2 < hv; b2++) ov[b2] = 0.0f;
            for (int32_t a = 0; a < hk; a++)
                for (int32_t b2 = 0; b2 < hv; b2++) ov[b2] += S[a * hv + b2] * qn[a];
            /* gated RMSNorm with z of this head */
            const float *z = f->ssm_p + i * proj + (int64_t)kh * grp + 2 * hk + (int64_t)r * hv +
                             (int64_t)(h % r) * hv;
            float *out = f->att + i * value_dim + (int64_t)h * hv;
            kiln_rmsnorm(out, ov, L->ssm_norm, hv, c->norm_eps);
            for (int32_t b2 = 0; b2 < hv; b2++)
                out[b2] = out[b2] * kiln_act_value(z[b2], KILN_OP_ACT_SILU);
        }
    }
}

static void delta_net_layer(fwd *f, int l) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const int32_t n = f->n, nk = c->ssm_n_k_heads, nv = c->ssm_n_v_heads, hk = c->ssm_k_head_dim,
                  hv = c->ssm_v_head_dim, r = nv / nk, K = c->ssm_conv_kernel;
    const int64_t key_dim = (int64_t)nk * hk, value_dim = (int64_t)nv * hv,
                  conv_dim = 2 * key_dim + value_dim, grp = 2 * (int64_t)hk + 2 * (int64_t)r * hv,
                  proj = 2 * key_dim + 2 * value_dim;
    matmul(f, &L->ssm_in_qkvz, f->xb, n, f->ssm_p);
    matmul(f, &L->ssm_in_ba, f->xb, n, f->ssm_ba);
    /* causal depthwise conv over [q | k | v] channels, then silu; the window holds the
     * previous K-1 inputs of each channel, oldest first */
    for (int32_t s = 0; s < f->b->n_seqs; s++) {
        const kiln_batch_seq *sq = &f->b->seqs[s];
        float *win = sq->rec_state + L->state_off;
        for (int32_t t = 0; t < sq->n_new; t++) {
            const int32_t i = sq->first + t;
            const float *p = f->ssm_p + i * proj;
            for (int64_t ch = 0; ch < conv_dim; ch++) {
                float xin;
                if (ch < 2 * key_dim) {
                    const int64_t part = ch / key_dim, e = ch % key_dim;
                    xin = p[(e / hk) * grp + part * hk + e % hk];
                } else {
                    const int64_t e = ch - 2 * key_dim, vh = e / hv;
                    xin = p[(vh / r) * grp + 2 * hk + (vh % r) * hv + e % hv];
                }
                const float *w = L->ssm_conv + ch * K;
                float *cw = win + ch * (K - 1);
                float acc = 0.0f;
                for (int32_t a = 0; a < K - 1; a++) acc += w[a] * cw[a];
                acc += w[K - 1] * xin;
                for (int32_t a = 0; a + 1 < K - 1; a++) cw[a] = cw[a + 1];
                if (K > 1) cw[K - 2] = xin;
                f->ssm_c[i * conv_dim + ch] = kiln_act_value(acc, KILN_OP_ACT_SILU);
            }
        }
    }
    gdn_job job = {f, l};
    kiln_threadpool_run(f->tp, gdn_worker, &job);
    matmul(f, &L->ssm_out, f->att, n, f->o);
}

/* ---- FFN ------------------------------------------------------------------------------ */

/* out[i] = down(act(gate x_i) * up x_i) for n rows of xin (g, u scratch of n * ff). */
static void glu_ffn(fwd *f, const kiln_mat *wg, const kiln_mat *wu, const kiln_mat *wd,
                    const float *xin, int32_t n, float *out) {
    matmul3(f, wg, f->g, wu, f->u, NULL, NULL, xin, n);
    kiln_glu(f->g, f->u, n * wg->n_out, (int)f->c->act);
    matmul(f, wd, f->g, n, out);
}

static void moe_ffn(fwd *f, int l) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const int32_t n = f->n, E = c->n_expert, k = c->n_expert_used;
    const int64_t d = c->n_embd;
    /* routing, per token: softmax over the router logits, top-k (ties: lower id), then
     * optionally renormalised (transformers' MixtralTopKRouter / Qwen3MoeTopKRouter) */
    matmul(f, &L->w_router, f->xb, n, f->rl);
    for (int32_t i = 0; i < n; i++) {
        float *p = f->rl + (int64_t)i * E;
        kiln_softmax(p, E);
        int32_t *sel = f->rsel + (int64_t)i * k;
        float *wt = f->rw + (int64_t)i * k;
        for (int32_t a = 0; a < k; a++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                bool taken = false;
                for (int32_t b2 = 0; b2 < a; b2++) taken |= sel[b2] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[a] = best;
            wt[a] = p[best];
        }
        if (c->expert_norm_topk) {
            float sum = 0.0f;
            for (int32_t a = 0; a < k; a++) sum += wt[a];
            for (int32_t a = 0; a < k; a++) wt[a] /= sum;
        }
    }
    memset(f->acc, 0, (size_t)n * (size_t)d * sizeof(float));
    for (int32_t e = 0; e < E; e++) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            for (int32_t a = 0; a < k; a++)
                if (f->rsel[(int64_t)i * k + a] == e) {
                    f->erow[m] = i * k + a;
                    memcpy(f->xe + (int64_t)m * d, f->xb + (int64_t)i * d,
                           (size_t)d * sizeof(float));
                    m++;
                }
        if (m == 0) continue;
        glu_ffn(f, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], f->xe, m, f->de);
        for (int32_t r = 0; r < m; r++) {
            const int32_t i = f->erow[r] / k;
            const float w = f->rw[f->erow[r]];
            float *acc = f->acc + (int64_t)i * d;
            const float *y = f->de + (int64_t)r * d;
            for (int64_t j = 0; j < d; j++) acc[j] = acc[j] + y[j] * w;
        }
    }
    if (c->n_ff_shexp > 0) {
        glu_ffn(f, &L->shexp_gate, &L->shexp_up, &L->shexp_down, f->xb, n, f->de);
        if (c->shexp_gate) matmul(f, &L->shexp_router, f->xb, n, f->rl); /* [n, 1] */
        for (int32_t i = 0; i < n; i++) {
            const float sg = c->shexp_gate ? sigmoidf(f->rl[i]) : 1.0f;
            for (int64_t j = 0; j < d; j++)
                f->o[i * d + j] = f->acc[i * d + j] + sg * f->de[i * d + j];
        }
    } else {
        memcpy(f->o, f->acc, (size_t)n * (size_t)d * sizeof(float));
    }
}

static void ffn_layer(fwd *f, int l) {
    const kiln_model_config *c = f->c;
    const kiln_layer_weights *L = &f->m->layers[l];
    const int32_t n = f->n;
    if (c->layer[l].moe) {
        moe_ffn(f, l);
    } else if (c->ffn_gated) {
        glu_ffn(f, &L->w_gate, &L->w_up, &L->w_down, f->xb, n, f->o);
    } else {
        matmul(f, &L->w_up, f->xb, n, f->u);
        add_bias(f->u, L->b_up, n, c->n_ff);
        kiln_act_apply(f->u, (int64_t)n * c->n_ff, (int)c->act);
        matmul(f, &L->w_down, f->u, n, f->o);
        add_bias(f->o, L->b_down, n, c->n_embd);
    }
}

/* ---- checks and the step -------------------------------------------------------------- */

static kiln_status check_batch(const kiln_model *m, kiln_kv_pool *pool, const kiln_batch *b,
                               kiln_error *err) {
    const kiln_model_config *c = &m->cfg;
    if (b->n_tokens < 1 || b->n_seqs < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "forward: empty batch");
    if (kiln_kv_pool_n_layer(pool) != c->n_layer ||
        kiln_kv_pool_kv_dim(pool) != (int64_t)c->n_head_kv * c->head_dim)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "forward: the KV pool's geometry does not match the model");
    const int32_t bs = kiln_kv_pool_block_size(pool);
    const int32_t n_pool_blocks = kiln_kv_pool_get_stats(pool).n_blocks;
    int32_t next = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const kiln_batch_seq *q = &b->seqs[s];
        if (q->first != next || q->n_new < 1 || q->n_past < 0 || !q->block_table ||
            (int64_t)q->n_past + q->n_new > INT32_MAX / 2)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: sequence %d does not continue the batch in order", s);
        next += q->n_new;
        const int32_t need = kiln_kv_blocks_for_tokens(q->n_past + q->n_new, bs);
        if (q->n_blocks < need)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: sequence %d's block table has %d blocks, %d needed for "
                                  "%d positions",
                                  s, q->n_blocks, need, q->n_past + q->n_new);
        for (int32_t i = 0; i < need; i++)
            if (q->block_table[i] < 0 || q->block_table[i] >= n_pool_blocks ||
                kiln_kv_pool_refcount(pool, q->block_table[i]) < 1)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "forward: sequence %d's block %d (id %d) is not a live block",
                                      s, i, q->block_table[i]);
        if (c->learned_pos && q->n_past + q->n_new > c->n_ctx_train)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: sequence %d reaches position %d; the model has learned "
                                  "positions for %d only",
                                  s, q->n_past + q->n_new - 1, c->n_ctx_train);
        if (m->state_floats > 0) {
            if (!q->rec_state)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "forward: sequence %d has no recurrent state; this model's "
                                      "linear-attention layers need one",
                                      s);
            int32_t have;
            memcpy(&have, q->rec_state, sizeof have);
            if (q->n_past > 0 && have != q->n_past)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "forward: sequence %d's recurrent state holds %d positions, "
                                      "n_past is %d (the state cannot be rolled back)",
                                      s, have, q->n_past);
        }
    }
    if (next != b->n_tokens)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "forward: sequences cover %d tokens, the batch has %d", next,
                              b->n_tokens);
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (b->token[i] < 0 || b->token[i] >= c->n_vocab)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: token id %d at index %d is outside [0, %d)",
                                  b->token[i], i, c->n_vocab);
    for (int32_t k = 0; k < b->n_out; k++)
        if (b->out[k] < 0 || b->out[k] >= b->n_tokens || (k > 0 && b->out[k] <= b->out[k - 1]))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: output rows must be ascending indices into the batch");
    return KILN_OK;
}

static void embed_row(const kiln_mat *e, int32_t token, float *out) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(e->dtype);
    size_t row = kiln_dtype_row_size(e->dtype, e->n_in);
    tr->to_float((const char *)e->data + (size_t)token * row, out, e->n_in);
}

/* Bump allocator over one float buffer. */
typedef struct carve {
    float *base;
    size_t used;
} carve;

static float *take(carve *cv, size_t n) {
    float *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += (n + 15) & ~(size_t)15; /* keep 64-byte granularity */
    return p;
}

/* Lay out the step's activation buffers; with cv->base NULL only measures. */
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
        const size_t mx =
            (size_t)(c->ssm_k_head_dim > c->ssm_v_head_dim ? c->ssm_k_head_dim : c->ssm_v_head_dim);
        f->ssm_p = take(cv, n * (2 * key_dim + 2 * value_dim));
        f->ssm_ba = take(cv, n * 2 * (size_t)c->ssm_n_v_heads);
        f->ssm_c = take(cv, n * (2 * key_dim + value_dim));
        f->scratch = take(cv, (size_t)f->nth * 4 * mx);
    }
    f->attn_scratch = take(cv, (size_t)f->nth * f->attn_scratch_floats);
}

kiln_status kiln_model_forward_batch(const kiln_model *m, kiln_kv_pool *pool, kiln_threadpool *tp,
                                     const kiln_batch *b, float *logits, kiln_error *err) {
    kiln_status st = check_batch(m, pool, b, err);
    if (st) return st;
    const kiln_model_config *c = &m->cfg;
    fwd F = {0}, *f = &F;
    f->m = m;
    f->c = c;
    f->pool = pool;
    f->tp = tp;
    f->b = b;
    f->n = b->n_tokens;
    f->nth = kiln_threadpool_size(tp);
    if (f->nth < 1) f->nth = 1;
    f->bs = kiln_kv_pool_block_size(pool);
    f->f16 = kiln_kv_pool_dtype(pool) == KILN_DTYPE_F16;
    const int32_t n = f->n;
    const int64_t d = c->n_embd;

    int64_t n_ptrs = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t end = b->seqs[s].n_past + b->seqs[s].n_new;
        if (end > f->max_keys) f->max_keys = end;
        n_ptrs += kiln_kv_blocks_for_tokens(end, f->bs);
    }
    if (c->n_head_kv > 0 && c->head_dim > 0) {
        /* enough rows per work item to amortize each key chunk's transpose */
        const int32_t G = c->n_head / c->n_head_kv;
        f->attn_tile = G >= 4 ? 4 : 16 / (G > 0 ? G : 1);
        if (f->attn_tile > KILN_ATTN_MAX_TILE) f->attn_tile = KILN_ATTN_MAX_TILE;
        f->attn_per = whole_units_balanced(b, f->attn_tile, f->nth) ? c->n_head_kv : 1;
        size_t fl = kiln_attention_group_scratch(f->attn_tile, G, c->head_dim,
                                                 f->max_keys > 0 ? f->max_keys : 1);
        f->attn_scratch_floats = (fl + 15) & ~(size_t)15;
    }
    carve cv = {NULL, 0};
    layout(f, &cv);
    float *buf = NULL;
    if (posix_memalign((void **)&buf, 64, cv.used * sizeof(float)) != 0) buf = NULL;
    int32_t *tok_seq = malloc((size_t)n * 2 * sizeof(int32_t));
    int64_t *ptr_off = malloc((size_t)b->n_seqs * sizeof(int64_t));
    const void **kb = malloc((size_t)(n_ptrs > 0 ? n_ptrs : 1) * 2 * sizeof(void *));
    if (!buf || !tok_seq || !ptr_off || !kb) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "forward: out of memory for %d tokens", n);
        goto done;
    }
    cv = (carve){buf, 0};
    layout(f, &cv);
    int32_t *tok_pos = tok_seq + n;
    f->tok_seq = tok_seq;
    f->tok_pos = tok_pos;
    f->ptr_off = ptr_off;
    f->kb = kb;
    f->vb = kb + n_ptrs;
    int64_t off = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const kiln_batch_seq *sq = &b->seqs[s];
        for (int32_t j = 0; j < sq->n_new; j++) {
            tok_seq[sq->first + j] = s;
            tok_pos[sq->first + j] = sq->n_past + j;
        }
        ptr_off[s] = off;
        off += kiln_kv_blocks_for_tokens(sq->n_past + sq->n_new, f->bs);
        if (m->state_floats > 0 && sq->n_past == 0)
            memset(sq->rec_state, 0, (size_t)m->state_floats * sizeof(float));
    }

    for (int32_t i = 0; i < n; i++) {
        float *xi = f->x + i * d;
        embed_row(&m->tok_embd, b->token[i], xi);
        if (c->embed_scale != 1.0f)
            for (int64_t j = 0; j < d; j++) xi[j] *= c->embed_scale;
        if (c->learned_pos) {
            float *pe = f->xb + i * d;
            embed_row(&m->pos_embd, tok_pos[i], pe);
            for (int64_t j = 0; j < d; j++) xi[j] += pe[j];
        }
    }

    for (int l = 0; l < c->n_layer; l++) {
        const kiln_layer_weights *L = &m->layers[l];
        norm_rows(f, f->xb, f->x, L->attn_norm, L->attn_norm_b, n, d);
        if (c->layer[l].mixer == KILN_MIXER_GATED_DELTA_NET)
            delta_net_layer(f, l);
        else
            attention_layer(f, l);
        if (L->post_attn_norm) norm_rows(f, f->o, f->o, L->post_attn_norm, NULL, n, d);
        for (int64_t i = 0; i < n * d; i++) f->x[i] += f->o[i];

        norm_rows(f, f->xb, f->x, L->ffn_norm, L->ffn_norm_b, n, d);
        ffn_layer(f, l);
        if (L->post_ffn_norm) norm_rows(f, f->o, f->o, L->post_ffn_norm, NULL, n, d);
        for (int64_t i = 0; i < n * d; i++) f->x[i] += f->o[i];
    }

    if (logits && b->n_out > 0) {
        for (int32_t r = 0; r < b->n_out; r++) {
            const float *xr = f->x + (int64_t)b->out[r] * d;
            if (c->norm_kind == KILN_NORM_LAYER)
                kiln_layernorm(f->xb + r * d, xr, m->output_norm, m->output_norm_b, d, c->norm_eps);
            else
                kiln_rmsnorm(f->xb + r * d, xr, m->output_norm, d, c->norm_eps);
        }
        const kiln_cpu_mm_out out = mm_out(&m->output, logits);
        kiln_cpu_matmul_multi(tp, &out, 1, d, f->xb, b->n_out);
        if (c->final_softcap > 0.0f)
            kiln_softcap(logits, (int64_t)b->n_out * c->n_vocab, c->final_softcap);
    }
    if (m->state_floats > 0)
        for (int32_t s = 0; s < b->n_seqs; s++) {
            int32_t have = b->seqs[s].n_past + b->seqs[s].n_new;
            memcpy(b->seqs[s].rec_state, &have, sizeof have);
        }
done:
    free(buf);
    free(tok_seq);
    free(ptr_off);
    free(kb);
    return st;
}
