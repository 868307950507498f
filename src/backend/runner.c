/* runner.c - the model runner (runner.h): one kiln_batch on a backend and a KV pool. */
#include "backend/runner.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_format.h"
#include "util/error.h"

struct kiln_runner {
    uint64_t id; /* unique in the process: part of its steps' graph keys */
    const kiln_model *m;
    kiln_backend *be;
    kiln_kv_pool *pool;
    kiln_kv_pool *pool_swa;       /* the sliding group's pool, or NULL */
    int32_t max_tokens, max_keys; /* reserved */
    int32_t *tok_seq;             /* [max_tokens], then tok_pos [max_tokens] */
    float *logits_dev;            /* backends without host memory: [logits_rows, n_vocab] */
    int32_t logits_rows;
    float *logits_host; /* kiln_runner_step_argmax on a backend without argmax: [rows, n_vocab] */
    int32_t logits_host_rows;
};

static kiln_status reserve(kiln_runner *r, int32_t max_tokens, int32_t max_keys, kiln_error *err) {
    if (max_tokens > r->max_tokens) {
        int32_t *t = realloc(r->tok_seq, (size_t)max_tokens * 2 * sizeof *t);
        if (!t)
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                  "runner: out of memory for %d tokens", max_tokens);
        r->tok_seq = t;
    }
    const int32_t nt = max_tokens > r->max_tokens ? max_tokens : r->max_tokens;
    const int32_t nk = max_keys > r->max_keys ? max_keys : r->max_keys;
    const kiln_backend_reserve res = kiln_model_reserve(r->m, nt, nk);
    kiln_status st = r->be->ops->arena_reserve(r->be, &res, err);
    if (st) return st;
    r->max_tokens = nt;
    r->max_keys = nk;
    return KILN_OK;
}

/* a KV page format's name for messages ("q8_0", "turbo3"; kiln_dtype_name for others) */
static const char *kv_format_name(kiln_dtype t) {
    const kiln_kv_format_traits *f = kiln_kv_format_of(t);
    return f ? f->name : kiln_dtype_name((int32_t)t);
}

/* A device backend computes only over weights placed on its own device and a pool in its
 * memory; a host backend over weights and a pool in host memory. Operations the model needs
 * and the backend lacks (NULL entries: experts, the delta net) are refused here. */

static kiln_status check_placement(const kiln_model *m, const kiln_backend *be,
                                   const kiln_kv_pool *pool, kiln_error *err) {
    const kiln_backend_ops *op = be->ops;
    const kiln_backend *pb = kiln_kv_pool_backend(pool);
    if (!op->host_memory) {
        if (m->placed != op || m->device != be->device)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: the %s backend on device %d needs the model's weights "
                                  "placed there (load it for that device); they are in %s memory",
                                  op->name, be->device,
                                  m->placed && !m->placed->host_memory ? m->placed->name : "host");
        if (pb != be)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: the KV pool must be allocated through the %s backend "
                                  "context that runs the model (kiln_kv_pool_params.backend)",
                                  op->name);
    } else {
        if (m->placed && !m->placed->host_memory)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: the model's weights are in %s device %d's memory; the "
                                  "%s backend cannot read them",
                                  m->placed->name, m->device, op->name);
        if (pb && !pb->ops->host_memory)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "forward: the KV pool is in %s device memory; the %s backend "
                                  "cannot read it",
                                  pb->ops->name, op->name);
    }
    if (!op->host_memory) {
        /* quantized KV pages and the delayed transition's mixed pages are read by the CPU
         * backend only (kv/kv_format.h) */
        for (int cls = 0; cls < KILN_KV_N_CLASSES; cls++) {
            const kiln_dtype fk = kiln_kv_pool_class_format_k(pool, cls);
            const kiln_dtype fv = kiln_kv_pool_class_format_v(pool, cls);
            if (fk == KILN_DTYPE_COUNT) continue;
            const bool plain = (fk == KILN_DTYPE_F32 || fk == KILN_DTYPE_F16 ||
                                fk == KILN_DTYPE_BF16) &&
                               fv == fk;
            if (!plain || cls == KILN_KV_CLASS_HI)
                return kiln_error_set(
                    err, KILN_ERR_UNSUPPORTED,
                    "forward: the %s backend does not read %s/%s KV pages%s yet; use --kv-type "
                    "f16, bf16 or f32 (the same for K and V, no --kv-quant-start) or the CPU",
                    op->name, kv_format_name(fk), kv_format_name(fv),
                    cls == KILN_KV_CLASS_HI ? " (the delayed transition)" : "");
        }
    }
    if (kiln_config_has_moe(&m->cfg) &&
        (!op->moe_route || !op->moe_gather || !op->moe_scatter || !op->moe_shared))
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "forward: the %s backend has no mixture-of-experts kernels yet",
                              op->name);
    if (kiln_config_has_mixer(&m->cfg, KILN_MIXER_GATED_DELTA_NET) &&
        (!op->gdn_conv || !op->gdn_rule))
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "forward: the %s backend has no gated-delta-net kernels yet",
                              op->name);
    return KILN_OK;
}

kiln_status kiln_runner_create(const kiln_model *m, kiln_backend *be, kiln_kv_pool *pool,
                               int32_t max_tokens, int32_t max_keys, kiln_runner **out,
                               kiln_error *err) {
    *out = NULL;
    if (!m || !be || !pool || max_tokens < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "runner: a model, a backend, a pool and max_tokens >= 1 are needed");
    const kiln_model_config *c = &m->cfg;
    if (kiln_kv_pool_n_layer(pool) != c->n_layer ||
        kiln_kv_pool_kv_dim(pool) != (int64_t)c->n_head_kv * c->head_dim)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "forward: the KV pool's geometry does not match the model");
    kiln_status st = check_placement(m, be, pool, err);
    if (st) return st;
    kiln_runner *r = calloc(1, sizeof *r);
    if (!r) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "runner: out of memory");
    static _Atomic uint64_t next_id = 1;
    r->id = atomic_fetch_add(&next_id, 1);
    r->m = m;
    r->be = be;
    r->pool = pool;
    st = reserve(r, max_tokens, max_keys > 0 ? max_keys : 1, err);
    if (st) {
        kiln_runner_destroy(r);
        return st;
    }
    *out = r;
    return KILN_OK;
}

kiln_status kiln_runner_set_sliding_pool(kiln_runner *r, kiln_kv_pool *pool_swa,
                                         kiln_error *err) {
    if (!r) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "runner: NULL runner");
    if (!pool_swa) {
        r->pool_swa = NULL;
        return KILN_OK;
    }
    const kiln_model_config *c = &r->m->cfg;
    const int32_t w = kiln_kv_pool_window(pool_swa);
    if (kiln_kv_pool_n_layer(pool_swa) != c->n_layer ||
        kiln_kv_pool_kv_dim(pool_swa) != (int64_t)c->n_head_kv * c->head_dim ||
        kiln_kv_pool_block_size(pool_swa) != kiln_kv_pool_block_size(r->pool) || w < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "runner: the sliding pool's geometry (layers, kv_dim, block size, "
                              "window %d) does not match the model and the main pool",
                              w);
    for (int32_t l = 0; l < c->n_layer; l++)
        if (kiln_kv_pool_holds_layer(pool_swa, l) &&
            (c->layer[l].sliding_window < 1 || c->layer[l].sliding_window > w))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "runner: the sliding pool (window %d) holds layer %d, whose "
                                  "window is %d",
                                  w, l, c->layer[l].sliding_window);
    if (!r->be->ops->host_memory)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "runner: the %s backend's attention does not read sliding-window "
                              "block tables yet; keep every block (kv_keep_window)",
                              r->be->ops->name);
    kiln_status st = check_placement(r->m, r->be, pool_swa, err);
    if (st) return st;
    r->pool_swa = pool_swa;
    return KILN_OK;
}

void kiln_runner_destroy(kiln_runner *r) {
    if (!r) return;
    if (r->logits_dev) r->be->ops->buf_free(r->be, r->logits_dev);
    free(r->logits_host);
    free(r->tok_seq);
    free(r);
}

/* positions a sequence's recurrent state has consumed (its header's first int32) */
static int32_t rec_positions(kiln_backend *be, const float *rec_state) {
    int32_t have;
    float head;
    be->ops->download(be, &head, rec_state, sizeof head);
    memcpy(&have, &head, sizeof have);
    return have;
}

static kiln_status check_batch(const kiln_runner *r, const kiln_batch *b, kiln_error *err) {
    const kiln_model *m = r->m;
    const kiln_model_config *c = &m->cfg;
    kiln_kv_pool *pool = r->pool;
    if (b->n_tokens < 1 || b->n_seqs < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "forward: empty batch");
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
        if (r->pool_swa) {
            /* the sliding table: live from the block of the step's first key on */
            const int32_t w = kiln_kv_pool_window(r->pool_swa);
            const int32_t lo = (q->n_past - w + 1 > 0 ? q->n_past - w + 1 : 0) / bs;
            if (!q->block_table_swa || q->n_blocks_swa < need)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "forward: sequence %d's sliding block table has %d blocks, "
                                      "%d needed for %d positions",
                                      s, q->block_table_swa ? q->n_blocks_swa : 0, need,
                                      q->n_past + q->n_new);
            for (int32_t i = lo; i < need; i++)
                if (kiln_kv_pool_refcount(r->pool_swa, q->block_table_swa[i]) < 1)
                    return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                          "forward: sequence %d's sliding block %d (id %d) is not "
                                          "a live block of the sliding pool (window %d)",
                                          s, i, q->block_table_swa[i], w);
        }
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
            const int32_t have = rec_positions(r->be, q->rec_state);
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

/* sampler.h kiln_argmax of one row, or -1 when it holds a NaN (the backend's argmax's rule;
 * the sampler lives above this layer) */
static int32_t kiln_runner_argmax_row(const float *x, int32_t n) {
    int32_t best = 0;
    float bv = -INFINITY;
    bool found = false;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(x[i])) return -1;
        if (!isfinite(x[i])) continue;
        if (!found || x[i] > bv) {
            bv = x[i];
            best = i;
            found = true;
        }
    }
    return best;
}

/* The graph key of a step (backend.h kiln_step.graph_key): a decode step (one new token per
 * sequence) of a model without recurrent state issues, for a given runner (model, pool,
 * backend), token count, sequence count, output rows and logits buffer, the same operations
 * with the same arguments: the model's dataflow depends on nothing else on the host. Other
 * steps get 0. */
static uint64_t graph_key(const kiln_runner *r, const kiln_batch *b, const float *logits_dev,
                          bool argmax) {
    if (r->m->state_floats > 0 || b->n_tokens != b->n_seqs) return 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->seqs[s].n_new != 1) return 0;
    uint64_t h = 0x9E3779B97F4A7C15ull;
    const uint64_t parts[6] = {r->id,           (uint64_t)b->n_tokens, (uint64_t)b->n_seqs,
                               (uint64_t)b->n_out, (uint64_t)(uintptr_t)logits_dev,
                               (uint64_t)argmax};
    for (int i = 0; i < 6; i++) {
        h ^= parts[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
    }
    return h ? h : 1;
}

/* one step: logits rows into logits (host), or with ids != NULL their argmax into ids */
static kiln_status runner_step(kiln_runner *r, const kiln_batch *b, float *logits, int32_t *ids,
                               kiln_error *err) {
    kiln_status st = check_batch(r, b, err);
    if (st) return st;
    const kiln_model *m = r->m;
    kiln_backend *be = r->be;
    int32_t max_keys = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const int32_t end = b->seqs[s].n_past + b->seqs[s].n_new;
        if (end > max_keys) max_keys = end;
    }
    if (b->n_tokens > r->max_tokens || max_keys > r->max_keys)
        if ((st = reserve(r, b->n_tokens, max_keys, err))) return st;
    int32_t *tok_seq = r->tok_seq, *tok_pos = r->tok_seq + r->max_tokens;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const kiln_batch_seq *sq = &b->seqs[s];
        for (int32_t j = 0; j < sq->n_new; j++) {
            tok_seq[sq->first + j] = s;
            tok_pos[sq->first + j] = sq->n_past + j;
        }
    }
    const bool dev_argmax = ids && b->n_out > 0 && be->ops->argmax && !be->ops->host_memory;
    if (ids && b->n_out > 0 && !dev_argmax) { /* the argmax of host logits */
        if (b->n_out > r->logits_host_rows) {
            float *p = realloc(r->logits_host,
                               (size_t)b->n_out * (size_t)m->cfg.n_vocab * sizeof(float));
            if (!p)
                return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                                      "runner: out of memory for %d logits rows", b->n_out);
            r->logits_host = p;
            r->logits_host_rows = b->n_out;
        }
        logits = r->logits_host;
    }
    float *dev = logits;
    if ((logits || dev_argmax) && b->n_out > 0 && !be->ops->host_memory) {
        if (b->n_out > r->logits_rows) {
            void *p = NULL;
            if ((st = be->ops->buf_alloc(
                     be, (size_t)b->n_out * (size_t)m->cfg.n_vocab * sizeof(float), &p, err)))
                return st;
            if (r->logits_dev) be->ops->buf_free(be, r->logits_dev);
            r->logits_dev = p;
            r->logits_rows = b->n_out;
        }
        dev = r->logits_dev;
    }
    const kiln_step step = {b,        b->n_tokens, tok_seq,
                            tok_pos,  max_keys,    graph_key(r, b, dev, dev_argmax)};
    if ((st = be->ops->step_begin(be, &step, err))) return st;
    /* a sequence starting afresh starts its recurrent state from zero */
    if (m->state_floats > 0)
        for (int32_t s = 0; s < b->n_seqs; s++)
            if (b->seqs[s].n_past == 0) be->ops->zero(be, b->seqs[s].rec_state, m->state_floats);

    kiln_model_forward_step(m, be, r->pool, r->pool_swa, &step, logits || dev_argmax ? dev : NULL);
    if (dev_argmax)
        be->ops->argmax(be, ids, dev, b->n_out, m->cfg.n_vocab);
    else if (logits && b->n_out > 0 && dev != logits)
        be->ops->download(be, logits, dev,
                          (size_t)b->n_out * (size_t)m->cfg.n_vocab * sizeof(float));
    if (m->state_floats > 0)
        for (int32_t s = 0; s < b->n_seqs; s++) {
            const int32_t have = b->seqs[s].n_past + b->seqs[s].n_new;
            float head;
            memcpy(&head, &have, sizeof head);
            be->ops->upload(be, b->seqs[s].rec_state, &head, sizeof head);
        }
    be->ops->sync(be);
    if (ids && !dev_argmax)
        for (int32_t k = 0; k < b->n_out; k++) {
            const float *row = logits + (size_t)k * (size_t)m->cfg.n_vocab;
            int32_t id = kiln_runner_argmax_row(row, m->cfg.n_vocab);
            ids[k] = id;
        }
    return KILN_OK;
}

kiln_status kiln_runner_step(kiln_runner *r, const kiln_batch *b, float *logits, kiln_error *err) {
    return runner_step(r, b, logits, NULL, err);
}

kiln_status kiln_runner_step_argmax(kiln_runner *r, const kiln_batch *b, int32_t *ids,
                                    kiln_error *err) {
    if (!ids) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "runner: no ids buffer");
    return runner_step(r, b, NULL, ids, err);
}

kiln_status kiln_model_forward_batch(const kiln_model *m, kiln_kv_pool *pool, kiln_backend *be,
                                     const kiln_batch *b, float *logits, kiln_error *err) {
    kiln_backend *own = NULL;
    kiln_status st = KILN_OK;
    if (!be) {
        const kiln_backend_params bp = kiln_model_backend_params(m, 1);
        if ((st = kiln_backend_create(&bp, &own, err))) return st;
        be = own;
    }
    kiln_runner *r = NULL;
    st = kiln_runner_create(m, be, pool, b->n_tokens > 0 ? b->n_tokens : 1, 1, &r, err);
    if (st == KILN_OK) st = kiln_runner_step(r, b, logits, err);
    kiln_runner_destroy(r);
    kiln_backend_destroy(own);
    return st;
}

/* ---- single-sequence cache: a private pool ------------------------------------------- */

kiln_status kiln_kv_seq_create(const kiln_model *m, int32_t n_ctx, kiln_dtype dtype,
                               kiln_kv_seq **out, kiln_error *err) {
    return kiln_kv_seq_create_on(m, NULL, n_ctx, dtype, out, err);
}

kiln_status kiln_kv_seq_create_on(const kiln_model *m, kiln_backend *be, int32_t n_ctx,
                                  kiln_dtype dtype, kiln_kv_seq **out, kiln_error *err) {
    return kiln_kv_seq_create_kv(m, be, n_ctx, dtype, dtype, out, err);
}

kiln_status kiln_kv_seq_create_kv(const kiln_model *m, kiln_backend *be, int32_t n_ctx,
                                  kiln_dtype dtype, kiln_dtype dtype_v, kiln_kv_seq **out,
                                  kiln_error *err) {
    *out = NULL;
    if (n_ctx < 1)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n_ctx must be >= 1 (got %d)", n_ctx);
    if (be && !be->ops->host_memory && m->state_floats > 0)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "the %s backend does not keep recurrent state yet", be->ops->name);
    kiln_kv_seq *kv = calloc(1, sizeof *kv);
    if (!kv) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kv->n_ctx = n_ctx;
    kiln_kv_pool_params pp = {
        .n_layer = m->cfg.n_layer,
        .kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim,
        .block_size = KILN_KV_DEFAULT_BLOCK_SIZE,
        .n_blocks = kiln_kv_blocks_for_tokens(n_ctx, KILN_KV_DEFAULT_BLOCK_SIZE),
        .dtype = dtype,
        .backend = be,
        .head_dim = m->cfg.head_dim,
    };
    if (dtype_v != dtype) {
        pp.dtype_v_set = true;
        pp.dtype_v = dtype_v;
    }
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

/* one sequence's batch through r (r NULL: a runner made for the call on m and be) */
static kiln_status forward_seq(kiln_runner *r, const kiln_model *m, kiln_kv_seq *kv,
                               kiln_backend *be, const int32_t *tokens, int32_t n, int32_t pos0,
                               bool want_all, float *logits, kiln_error *err) {
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
    kiln_status st = r ? kiln_runner_step(r, &b, logits, err)
                       : kiln_model_forward_batch(m, kv->pool, be, &b, logits, err);
    free(out);
    return st;
}

kiln_status kiln_model_forward(const kiln_model *m, kiln_kv_seq *kv, kiln_backend *be,
                               const int32_t *tokens, int32_t n, int32_t pos0, bool want_all,
                               float *logits, kiln_error *err) {
    return forward_seq(NULL, m, kv, be, tokens, n, pos0, want_all, logits, err);
}

kiln_status kiln_runner_forward_seq(kiln_runner *r, kiln_kv_seq *kv, const int32_t *tokens,
                                    int32_t n, int32_t pos0, bool want_all, float *logits,
                                    kiln_error *err) {
    return forward_seq(r, r->m, kv, r->be, tokens, n, pos0, want_all, logits, err);
}
