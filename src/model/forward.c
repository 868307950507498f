/*
 * forward.c - the Llama-family transformer block over a flat batch of tokens from several
 * sequences, attending over each sequence's paged KV cache.
 * Source: Touvron et al. 2023 (LLaMA), transformers' modeling_llama.py, llama2.c run.c.
 *
 *   x = embed(token)
 *   per layer: h = x + Wo . attn(rope(Wq . rms(x)), rope(Wk . rms(x)), Wv . rms(x))
 *              x = h + Wdown . (silu(Wgate . rms(h)) * (Wup . rms(h)))
 *   logits = Wout . rms(x)
 *
 * Every operation is row-wise or per (token, head) with a fixed reduction order, so a
 * token's result does not depend on the batch around it (DESIGN.md principle 3).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/ops.h"
#include "model/model.h"
#include "util/error.h"

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
    kiln_batch_seq seq = {kv->table.blocks, pos0, n, 0, kv->table.n_blocks};
    kiln_batch b = {n, tokens, 1, &seq, n_out, out};
    kiln_status st = kiln_model_forward_batch(m, kv->pool, tp, &b, logits, err);
    free(out);
    return st;
}

/* ---- the batch forward ---------------------------------------------------------------- */

typedef struct attn_job {
    const kiln_model *m;
    kiln_kv_pool *pool;
    const kiln_batch *b;
    const int32_t *tok_seq, *tok_pos; /* [n_tokens] */
    const void *const *kb, *const *vb; /* per seq: block base pointers for this layer */
    const int64_t *seq_ptr_off;        /* [n_seqs] offset of each seq's pointer list */
    const float *q;                    /* [n_tokens, n_head*hd] */
    float *out;                        /* [n_tokens, n_head*hd] */
    float *scores;                     /* [nth, max_keys] */
    uint16_t *q16;                     /* [nth, hd] */
    int32_t max_keys;
} attn_job;

static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    const kiln_model_config *c = &j->m->cfg;
    const int32_t hd = c->head_dim, group = c->n_head / c->n_head_kv;
    const int64_t q_dim = (int64_t)c->n_head * hd, kv_dim = kiln_kv_pool_kv_dim(j->pool);
    const int32_t bs = kiln_kv_pool_block_size(j->pool);
    const int f16 = kiln_kv_pool_dtype(j->pool) == KILN_DTYPE_F16;
    float *scores = j->scores + (size_t)ith * (size_t)j->max_keys;
    uint16_t *q16 = j->q16 + (size_t)ith * (size_t)hd;
    const float div = sqrtf((float)hd);
    const int64_t total = (int64_t)j->b->n_tokens * c->n_head;
    for (int64_t w = ith; w < total; w += nth) {
        int32_t i = (int32_t)(w / c->n_head), h = (int32_t)(w % c->n_head);
        int32_t s = j->tok_seq[i];
        const int64_t po = j->seq_ptr_off[s];
        kiln_attention_paged(j->out + i * q_dim + (int64_t)h * hd, j->q + i * q_dim + (int64_t)h * hd,
                             j->kb + po, j->vb + po, bs, kv_dim, (int64_t)(h / group) * hd,
                             j->tok_pos[i] + 1, hd, div, f16, scores, q16);
    }
}

static void embed_row(const kiln_mat *e, int32_t token, float *out) {
    const kiln_dtype_traits *tr = kiln_dtype_traits_of(e->dtype);
    size_t row = kiln_dtype_row_size(e->dtype, e->n_in);
    tr->to_float((const char *)e->data + (size_t)token * row, out, e->n_in);
}

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
    }
    if (next != b->n_tokens)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "forward: sequences cover %d tokens, the batch has %d", next,
                              b->n_tokens);
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (b->token[i] < 0 || b->token[i] >= c->n_vocab)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: token id %d at index %d is outside [0, %d)", b->token[i],
                                  i, c->n_vocab);
    for (int32_t k = 0; k < b->n_out; k++)
        if (b->out[k] < 0 || b->out[k] >= b->n_tokens || (k > 0 && b->out[k] <= b->out[k - 1]))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: output rows must be ascending indices into the batch");
    return KILN_OK;
}

kiln_status kiln_model_forward_batch(const kiln_model *m, kiln_kv_pool *pool, kiln_threadpool *tp,
                                     const kiln_batch *b, float *logits, kiln_error *err) {
    kiln_status st = check_batch(m, pool, b, err);
    if (st) return st;
    const kiln_model_config *c = &m->cfg;
    const int32_t n = b->n_tokens, bs = kiln_kv_pool_block_size(pool);
    const int64_t d = c->n_embd, hd = c->head_dim, q_dim = (int64_t)c->n_head * hd,
                  kv_dim = (int64_t)c->n_head_kv * hd, ff = c->n_ff;
    const bool f16 = kiln_kv_pool_dtype(pool) == KILN_DTYPE_F16;
    const int nth = kiln_threadpool_size(tp);

    /* per-token sequence and position; per-sequence block pointer lists */
    int32_t max_keys = 0;
    int64_t n_ptrs = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t end = b->seqs[s].n_past + b->seqs[s].n_new;
        if (end > max_keys) max_keys = end;
        n_ptrs += kiln_kv_blocks_for_tokens(end, bs);
    }
    size_t nf = (size_t)n * (size_t)(2 * d + 2 * q_dim + 2 * kv_dim + 2 * ff) +
                (size_t)nth * (size_t)(max_keys + hd);
    float *buf = malloc(nf * sizeof(float));
    int32_t *tok_seq = malloc((size_t)n * 2 * sizeof(int32_t));
    int64_t *ptr_off = malloc((size_t)b->n_seqs * sizeof(int64_t));
    const void **kb = malloc((size_t)n_ptrs * 2 * sizeof(void *));
    if (!buf || !tok_seq || !ptr_off || !kb) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "forward: out of memory for %d tokens", n);
        goto done;
    }
    int32_t *tok_pos = tok_seq + n;
    const void **vb = kb + n_ptrs;
    float *x = buf, *xb = x + n * d, *q = xb + n * d, *att = q + n * q_dim, *k = att + n * q_dim,
          *v = k + n * kv_dim, *g = v + n * kv_dim, *u = g + n * ff, *scores = u + n * ff;
    uint16_t *q16 = (uint16_t *)(scores + (size_t)nth * (size_t)max_keys);
    int64_t off = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const kiln_batch_seq *sq = &b->seqs[s];
        for (int32_t j = 0; j < sq->n_new; j++) {
            tok_seq[sq->first + j] = s;
            tok_pos[sq->first + j] = sq->n_past + j;
        }
        ptr_off[s] = off;
        off += kiln_kv_blocks_for_tokens(sq->n_past + sq->n_new, bs);
    }

    for (int32_t i = 0; i < n; i++) embed_row(&m->tok_embd, b->token[i], x + i * d);

    const size_t esz = f16 ? sizeof(uint16_t) : sizeof(float);
    for (int l = 0; l < c->n_layer; l++) {
        const kiln_layer_weights *L = &m->layers[l];
        for (int32_t i = 0; i < n; i++) kiln_rmsnorm(xb + i * d, x + i * d, L->attn_norm, d, c->norm_eps);
        kiln_cpu_matmul(tp, L->wq.data, L->wq.dtype, q_dim, d, xb, n, q);
        kiln_cpu_matmul(tp, L->wk.data, L->wk.dtype, kv_dim, d, xb, n, k);
        kiln_cpu_matmul(tp, L->wv.data, L->wv.dtype, kv_dim, d, xb, n, v);
        const int adjacent = c->rope_style == KILN_ROPE_ADJACENT;
        for (int32_t i = 0; i < n; i++) {
            const int32_t pos = tok_pos[i];
            kiln_rope(q + i * q_dim, c->n_head, (int32_t)hd, pos, m->inv_freq, adjacent);
            kiln_rope(k + i * kv_dim, c->n_head_kv, (int32_t)hd, pos, m->inv_freq, adjacent);
            const int32_t block = b->seqs[tok_seq[i]].block_table[pos / bs];
            char *kr = (char *)kiln_kv_pool_k(pool, l, block) + (size_t)(pos % bs) * kv_dim * esz;
            char *vr = (char *)kiln_kv_pool_v(pool, l, block) + (size_t)(pos % bs) * kv_dim * esz;
            if (f16) {
                for (int64_t e = 0; e < kv_dim; e++) {
                    ((uint16_t *)kr)[e] = kiln_fp32_to_fp16(k[i * kv_dim + e]);
                    ((uint16_t *)vr)[e] = kiln_fp32_to_fp16(v[i * kv_dim + e]);
                }
            } else {
                memcpy(kr, k + i * kv_dim, (size_t)kv_dim * sizeof(float));
                memcpy(vr, v + i * kv_dim, (size_t)kv_dim * sizeof(float));
            }
        }
        for (int32_t s = 0; s < b->n_seqs; s++) {
            const kiln_batch_seq *sq = &b->seqs[s];
            int32_t nb = kiln_kv_blocks_for_tokens(sq->n_past + sq->n_new, bs);
            for (int32_t i = 0; i < nb; i++) {
                kb[ptr_off[s] + i] = kiln_kv_pool_k(pool, l, sq->block_table[i]);
                vb[ptr_off[s] + i] = kiln_kv_pool_v(pool, l, sq->block_table[i]);
            }
        }
        attn_job job = {m, pool, b, tok_seq, tok_pos, kb, vb, ptr_off, q, att, scores, q16, max_keys};
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

    if (logits && b->n_out > 0) {
        for (int32_t r = 0; r < b->n_out; r++)
            kiln_rmsnorm(xb + r * d, x + (int64_t)b->out[r] * d, m->output_norm, d, c->norm_eps);
        kiln_cpu_matmul(tp, m->output.data, m->output.dtype, c->n_vocab, d, xb, b->n_out, logits);
    }
done:
    free(buf);
    free(tok_seq);
    free(ptr_off);
    free(kb);
    return st;
}
