/*
 * engine.c - the engine object: limits, the KV pool, the thread that runs the steps, and
 * submission (DESIGN.md "One request, end to end", steps 1 and 2's queue).
 *
 * The engine thread sleeps on a condition variable while it has nothing to do (no busy
 * loop); a submission or the shutdown wakes it. Submitters only validate, snapshot and
 * append to the incoming queue under the engine mutex.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/drafter.h"
#include "engine/engine_internal.h"
#include "model/model_fit.h"
#include "engine/grammar_seq.h"
#include "engine/spec.h"
#include "kv/kv_format.h"
#include "kv/turboquant.h"
#include "util/threadpool.h"
#include "util/error.h"

#define DEFAULT_STEP_TOKENS 512
#define DEFAULT_MAX_SEQS    256
#define DEFAULT_MAX_QUEUE   4096
#define DEFAULT_N_CTX       4096
#define DEFAULT_KV_CONTEXTS 16
#define DEFAULT_KV_BYTES    ((int64_t)2 << 30)

kiln_engine_params kiln_engine_default_params(void) {
    kiln_engine_params p;
    memset(&p, 0, sizeof p);
    return p;
}

/* The KV page formats (kv/kv_format.h) of a public kv_type (validated by resolve_params). */
static void kv_page_formats(kiln_kv_type t, kiln_dtype *k, kiln_dtype *v) {
    *k = *v = KILN_DTYPE_F32;
    switch (t) {
    case KILN_KV_F16:
        *k = *v = KILN_DTYPE_F16;
        break;
    case KILN_KV_BF16:
        *k = *v = KILN_DTYPE_BF16;
        break;
    case KILN_KV_Q8_0:
        *k = *v = KILN_DTYPE_Q8_0;
        break;
    case KILN_KV_Q4_0:
        *k = *v = KILN_DTYPE_Q4_0;
        break;
    case KILN_KV_TURBO: {
        const kiln_turbo_config c = kiln_turbo_config_default();
        *k = (kiln_dtype)kiln_turbo_dtype_of(c.k);
        *v = (kiln_dtype)kiln_turbo_dtype_of(c.v);
        break;
    }
    default:
        break;
    }
}

/* a format the delayed transition converts into: anything but the plain f32 / f16 / bf16 */
static bool is_quantized(kiln_dtype t) {
    return t != KILN_DTYPE_F32 && t != KILN_DTYPE_F16 && t != KILN_DTYPE_BF16;
}

/* the pool resolve_params lays out: main-class formats and blocks, and the f16 class of the
 * delayed transition (n_hi 0: none) */
typedef struct kv_layout {
    kiln_dtype fk, fv;
    int32_t n_main, n_hi;
} kv_layout;

/* gpu_memory (kiln.h): memory_budget from the GPU's total memory, after checking that what
 * it asks for beyond the weights (placed already) is free */
static kiln_status gpu_memory_budget(const kiln_model *m, kiln_engine_params *p, kiln_error *err) {
    int32_t dev = 0;
    if (kiln_model_device(m, &dev) != KILN_DEVICE_CUDA)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gpu_memory (--gpu-memory) sizes GPU memory, but the model's "
                              "weights are on the CPU (load it with device cuda)");
    if (p->memory_budget > 0 || p->kv_memory > 0 || p->kv_tokens > 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gpu_memory (--gpu-memory) excludes memory_budget, kv_memory and "
                              "kv_tokens (it sizes the KV pool itself)");
    int64_t free_b = 0, total_b = 0;
    const kiln_status st = kiln_device_memory(KILN_DEVICE_CUDA, dev, &free_b, &total_b, err);
    if (st != KILN_OK) return st;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const int64_t budget = p->gpu_memory <= 1.0 ? (int64_t)(p->gpu_memory * (double)total_b)
                                                : (int64_t)p->gpu_memory;
    const int64_t weights = kiln_model_weights_bytes(m);
    if (budget - weights > free_b)
        return kiln_error_set(
            err, KILN_ERR_OUT_OF_MEMORY,
            "gpu_memory (--gpu-memory) of %lld bytes (%.2f GiB of device %d's %.2f GiB) minus "
            "the weights already on it (%lld bytes, %.2f GiB) asks %.2f GiB for the KV pool and "
            "scratch, but only %lld bytes (%.2f GiB) are free: lower it by %.2f GiB",
            (long long)budget, (double)budget / gib, dev, (double)total_b / gib,
            (long long)weights, (double)weights / gib, (double)(budget - weights) / gib,
            (long long)free_b, (double)free_b / gib, (double)(budget - weights - free_b) / gib);
    p->memory_budget = budget;
    return KILN_OK;
}

static kiln_status resolve_params(const kiln_model *m, const kiln_engine_params *in,
                                  kiln_engine_params *p, kv_layout *lay, kiln_error *err) {
    int32_t *n_blocks = &lay->n_main;
    lay->n_hi = 0;
    *p = in ? *in : kiln_engine_default_params();
#define CHECK_RANGE(field, lo, hi)                                                                 \
    if (p->field < (lo) || p->field > (hi))                                                        \
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,                                      \
                              #field " must be in [%lld, %lld] (got %lld)", (long long)(lo),       \
                              (long long)(hi), (long long)p->field);
    CHECK_RANGE(kv_memory, 0, INT64_MAX)
    CHECK_RANGE(kv_tokens, 0, INT32_MAX)
    CHECK_RANGE(block_size, 0, 4096)
    CHECK_RANGE(step_tokens, 0, 1 << 20)
    CHECK_RANGE(prefill_chunk, 0, 1 << 20)
    CHECK_RANGE(max_seqs, 0, 1 << 16)
    CHECK_RANGE(max_queue, 0, 1 << 24)
    CHECK_RANGE(n_threads, 0, 512)
    CHECK_RANGE(n_ctx, 0, 1 << 24)
    CHECK_RANGE(spec_k, 0, KILN_MAX_SPEC_K)
    CHECK_RANGE(spec_ngram_min, 0, 64)
    CHECK_RANGE(spec_ngram_max, 0, 64)
    CHECK_RANGE(draft_kv_tokens, 0, INT32_MAX)
    CHECK_RANGE(memory_budget, 0, INT64_MAX)
#undef CHECK_RANGE
    if (!(p->gpu_memory >= 0.0 && p->gpu_memory <= 9.2e18)) /* NaN too */
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "gpu_memory must be a fraction in (0, 1], bytes above 1, or 0 "
                              "(got %g)", p->gpu_memory);
    if (p->spec < KILN_SPEC_DEFAULT || p->spec > KILN_SPEC_RANDOM)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "spec must be a kiln_spec_source (0..%d, got %d)", KILN_SPEC_RANDOM,
                              (int)p->spec);
    if (!p->spec_ngram_min) p->spec_ngram_min = 1;
    if (!p->spec_ngram_max) p->spec_ngram_max = p->spec_ngram_min > 4 ? p->spec_ngram_min : 4;
    if (p->spec_ngram_max < p->spec_ngram_min)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "spec_ngram_max (%d) must be >= spec_ngram_min (%d)",
                              p->spec_ngram_max, p->spec_ngram_min);
    if (p->spec == KILN_SPEC_DRAFT && !p->draft_model)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "spec is KILN_SPEC_DRAFT but no draft_model is given");
    if (p->kv_type < KILN_KV_F32 || p->kv_type > KILN_KV_TURBO)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv_type must be KILN_KV_F32, KILN_KV_F16, KILN_KV_BF16, "
                              "KILN_KV_Q8_0, KILN_KV_Q4_0 or KILN_KV_TURBO (got %d)",
                              (int)p->kv_type);
    if (p->kv_quant_start < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "kv_quant_start must be >= 0 (got %d)", p->kv_quant_start);
    kv_page_formats(p->kv_type, &lay->fk, &lay->fv);
    {
        /* kv_type_name for both sides, then kv_type_k / kv_type_v for their own */
        const char *names[3] = {p->kv_type_name, p->kv_type_k, p->kv_type_v};
        const char *opts[3] = {"kv_type_name (--kv-type)", "kv_type_k (--kv-type-k)",
                               "kv_type_v (--kv-type-v)"};
        const kiln_kv_side sides[3] = {KILN_KV_SIDE_BOTH, KILN_KV_SIDE_K, KILN_KV_SIDE_V};
        const char *from_k = "kv_type (--kv-type)", *from_v = from_k; /* who set each side */
        for (int i = 0; i < 3; i++) {
            if (!names[i] || !names[i][0]) continue;
            kiln_status fs =
                kiln_kv_format_parse(opts[i], names[i], sides[i], &lay->fk, &lay->fv, err);
            if (fs) return fs;
            if (sides[i] != KILN_KV_SIDE_V) from_k = opts[i];
            if (sides[i] != KILN_KV_SIDE_K) from_v = opts[i];
        }
        const kiln_kv_geom g = {(int64_t)m->cfg.n_head_kv * m->cfg.head_dim, m->cfg.n_head_kv,
                                m->cfg.head_dim};
        kiln_status fs = kiln_kv_format_check(lay->fk, &g, from_k, err);
        if (!fs) fs = kiln_kv_format_check(lay->fv, &g, from_v, err);
        if (fs) return fs;
    }
    if (!is_quantized(lay->fk) && !is_quantized(lay->fv)) p->kv_quant_start = 0;
    p->kv_type_k = kiln_kv_format_of(lay->fk)->name;
    p->kv_type_v = kiln_kv_format_of(lay->fv)->name;
    p->kv_type_name = NULL;
    if (!p->block_size) p->block_size = KILN_KV_DEFAULT_BLOCK_SIZE;
    if (!p->step_tokens) p->step_tokens = DEFAULT_STEP_TOKENS;
    if (!p->prefill_chunk || p->prefill_chunk > p->step_tokens) p->prefill_chunk = p->step_tokens;
    if (!p->max_seqs) p->max_seqs = DEFAULT_MAX_SEQS;
    if (!p->max_queue) p->max_queue = DEFAULT_MAX_QUEUE;
    if (!p->n_threads) {
        /* a step of a tiny model (stories260K: ~0.1 ms) is shorter than waking and joining
         * a second thread on a busy machine (measured 15k vs 180 tok/s at load 5) */
        const kiln_model_config *c = &m->cfg;
        double weights = (double)c->n_layer * (4.0 * c->n_embd * c->n_embd +
                                               3.0 * c->n_embd * (c->n_ff > 0 ? c->n_ff : 0)) +
                         (double)c->n_vocab * c->n_embd;
        p->n_threads = weights < 4e6 ? 1 : kiln_physical_cores();
    }
    if (!p->n_ctx) p->n_ctx = m->cfg.n_ctx_train > 0 ? m->cfg.n_ctx_train : DEFAULT_N_CTX;
    if (m->cfg.learned_pos && m->cfg.n_ctx_train > 0 && p->n_ctx > m->cfg.n_ctx_train)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "n_ctx %d exceeds the %d positions the model has learned "
                              "embeddings for",
                              p->n_ctx, m->cfg.n_ctx_train);

    int64_t kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim;
    int64_t block_bytes = kiln_kv_block_bytes_geom(m->cfg.n_layer, kv_dim, m->cfg.head_dim,
                                                   p->block_size, lay->fk, lay->fv);
    if (block_bytes <= 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cannot size a KV block (n_layer %d, kv_dim %lld, block_size %d)",
                              m->cfg.n_layer, (long long)kv_dim, p->block_size);
    if (p->gpu_memory > 0) {
        const kiln_status gs = gpu_memory_budget(m, p, err);
        if (gs != KILN_OK) return gs;
    }
    if (p->memory_budget > 0) {
        if (p->kv_memory > 0 || p->kv_tokens > 0)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "memory_budget excludes kv_memory and kv_tokens (it sizes the "
                                  "KV pool itself)");
        int64_t weights = kiln_model_weights_bytes(m) +
                          (p->draft_model ? kiln_model_weights_bytes(p->draft_model) : 0);
        int64_t scratch = kiln_model_scratch_bytes(m, p->step_tokens, p->n_ctx);
        int64_t left = p->memory_budget - weights - scratch;
        if (left < block_bytes)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "%s of %lld bytes leaves %lld for the KV pool after "
                                  "%lld bytes of weights and %lld of scratch: less than one KV "
                                  "block (%lld bytes)",
                                  p->gpu_memory > 0 ? "gpu_memory (--gpu-memory)" : "memory_budget",
                                  (long long)p->memory_budget, (long long)left, (long long)weights,
                                  (long long)scratch, (long long)block_bytes);
        p->kv_memory = left;
    }
    if (p->kv_memory > 0) {
        int64_t nb = p->kv_memory / block_bytes;
        *n_blocks = nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
        if (*n_blocks < 1)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "kv_memory of %lld bytes is smaller than one KV block "
                                  "(%lld bytes: %d positions, %d layers)",
                                  (long long)p->kv_memory, (long long)block_bytes, p->block_size,
                                  m->cfg.n_layer);
    } else {
        int64_t tokens = p->kv_tokens;
        if (tokens == 0) {
            int64_t cap = DEFAULT_KV_BYTES / block_bytes * p->block_size;
            tokens = (int64_t)DEFAULT_KV_CONTEXTS * p->n_ctx;
            if (tokens > cap) tokens = cap > p->n_ctx ? cap : p->n_ctx;
        }
        if (tokens > INT32_MAX) tokens = INT32_MAX;
        *n_blocks = kiln_kv_blocks_for_tokens((int32_t)tokens, p->block_size);
    }
    int64_t budget = (int64_t)*n_blocks * block_bytes;
    if (p->kv_quant_start > 0) {
        /* the f16 class: max_seqs sequences of N positions plus 4 blocks (the partial block,
         * a speculative suffix) each, at most half the budget, at least one such sequence */
        const int64_t hi_bb =
            kiln_kv_block_bytes(m->cfg.n_layer, kv_dim, p->block_size, KILN_DTYPE_F16);
        const int64_t per_seq = kiln_kv_blocks_for_tokens(p->kv_quant_start, p->block_size) + 4;
        int64_t want = per_seq * p->max_seqs, cap = budget / 2 / hi_bb;
        if (want > cap) want = cap;
        if (want < per_seq)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "kv_quant_start %d needs f16 KV blocks for at least one sequence "
                                  "of %d positions (%lld blocks of %lld bytes) in half of the KV "
                                  "pool's %lld bytes; raise kv_memory / kv_tokens or lower "
                                  "kv_quant_start",
                                  p->kv_quant_start, p->kv_quant_start, (long long)per_seq,
                                  (long long)hi_bb, (long long)budget);
        lay->n_hi = (int32_t)want;
        *n_blocks = (int32_t)((budget - want * hi_bb) / block_bytes);
        if (*n_blocks < 1) *n_blocks = 1;
        budget = (int64_t)*n_blocks * block_bytes + want * hi_bb;
    }
    /* the pool as built, for kiln_engine_get_params */
    int64_t pool_tokens = ((int64_t)*n_blocks + lay->n_hi) * p->block_size;
    p->kv_tokens = pool_tokens > INT32_MAX ? INT32_MAX : (int32_t)pool_tokens;
    p->kv_memory = budget;
    return KILN_OK;
}

static void *engine_main(void *arg);

kiln_status kiln_engine_create_debug(const kiln_model *m, const kiln_engine_params *params,
                                     const kiln_engine_debug *debug, kiln_engine **out,
                                     kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    if (!m) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "model must not be NULL");
    kiln_engine_params p;
    kv_layout lay = {0};
    kiln_status st = resolve_params(m, params, &p, &lay, err);
    const int32_t n_blocks = lay.n_main + lay.n_hi;
    if (st) return st;

    kiln_engine *e = calloc(1, sizeof *e);
    if (!e) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (engine)");
    e->model = m;
    e->p = p;
    e->n_vocab = m->cfg.n_vocab;
    e->rec_state_floats = kiln_model_seq_state_floats(m);
    if (debug) e->debug = *debug;
    atomic_init(&e->n_queued, 0);
    atomic_init(&e->st_running, 0);
    atomic_init(&e->st_steps, 0);
    atomic_init(&e->st_prefill, 0);
    atomic_init(&e->st_decode, 0);
    atomic_init(&e->st_finished, 0);
    atomic_init(&e->st_hit_req, 0);
    atomic_init(&e->st_miss_req, 0);
    atomic_init(&e->st_hit_tok, 0);
    atomic_init(&e->st_miss_tok, 0);
    atomic_init(&e->st_preempt, 0);
    atomic_init(&e->st_verify, 0);
    atomic_init(&e->st_drafted, 0);
    atomic_init(&e->st_accepted, 0);
    atomic_init(&e->st_fill, 0);
    atomic_init(&e->st_mask_ns, 0);
    atomic_init(&e->st_masks, 0);
    bool mu_ok = pthread_mutex_init(&e->mu, NULL) == 0;
    bool cv_ok = mu_ok && pthread_cond_init(&e->cv, NULL) == 0;
    if (!mu_ok || !cv_ok) {
        if (mu_ok) pthread_mutex_destroy(&e->mu);
        free(e);
        return kiln_error_set(err, KILN_ERR_INTERNAL, "cannot create the engine's mutex");
    }

    kiln_kv_pool_params pp = {
        .n_layer = m->cfg.n_layer,
        .kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim,
        .block_size = p.block_size,
        .n_blocks = lay.n_main,
        .dtype = lay.fk,
        .dtype_v_set = lay.fv != lay.fk,
        .dtype_v = lay.fv,
        .head_dim = m->cfg.head_dim,
        .n_blocks_hi = lay.n_hi,
        .dtype_hi = KILN_DTYPE_F16,
    };
    /* the engine computes where the model's weights are (kiln_model_params.device) */
    const kiln_backend_params bp = kiln_model_backend_params(m, p.n_threads);
    if ((st = kiln_backend_create(&bp, &e->be, err))) goto fail;
    pp.backend = e->be;
    /* layer groups (kv_window.c): the full group's pool holds the layers without a window */
    bool *sliding = calloc((size_t)m->cfg.n_layer, 2 * sizeof(bool));
    if (!sliding) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (layer groups)");
        goto fail;
    }
    bool *full = sliding + m->cfg.n_layer;
    const int32_t window = kiln_engine_window_plan(m, &p, e->be->ops->host_memory, sliding);
    if (window > 0) {
        for (int32_t l = 0; l < m->cfg.n_layer; l++) full[l] = !sliding[l];
        pp.layers = full;
        /* a pool sized in bytes spends what the sliding group does not need on more blocks */
        if (params && (params->kv_memory > 0 || params->memory_budget > 0))
            pp.n_blocks = kiln_engine_window_main_blocks(m, &e->p, sliding, window, lay.fk,
                                                         lay.fv);
    }
    st = kiln_kv_pool_create(&pp, &e->pool, err);
    if (!st) st = kiln_runner_create(m, e->be, e->pool, p.step_tokens, p.n_ctx, &e->runner, err);
    pp.layers = NULL;
    if (!st && window > 0) st = kiln_engine_window_create(e, &pp, sliding, window, err);
    free(sliding);
    if (st) goto fail;
    if (window > 0) { /* the pools as built, for kiln_engine_get_params */
        const int64_t tokens = (int64_t)kiln_kv_pool_n_blocks(e->pool) * e->p.block_size;
        e->p.kv_tokens = tokens > INT32_MAX ? INT32_MAX : (int32_t)tokens;
        e->p.kv_memory =
            kiln_kv_pool_storage_bytes(e->pool) + kiln_kv_pool_storage_bytes(e->pool_swa);
    }
    if ((st = kiln_sampler_scratch_create(e->n_vocab, &e->scratch, err))) goto fail;
    if (p.draft_model) {
        kiln_drafter_params dp = {.n_threads = p.n_threads,
                                  .kv_tokens = p.draft_kv_tokens ? p.draft_kv_tokens
                                                                 : (int64_t)n_blocks * p.block_size,
                                  .step_tokens = p.step_tokens,
                                  .n_ctx = p.n_ctx,
                                  .max_slots = p.max_seqs};
        if ((st = kiln_drafter_create(p.draft_model, m, &dp, &e->drafter, err))) {
            kiln_error_prefix(err, "draft_model: ");
            goto fail;
        }
    }
    if (p.cache_dir && p.cache_dir[0] && !p.no_prefix_cache) {
        if (!(e->cache_dir = strdup(p.cache_dir))) {
            st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (cache_dir)");
            goto fail;
        }
    }
    e->p.cache_dir = e->cache_dir; /* the caller's string is borrowed for create only */
    if ((st = kiln_engine_prefix_init(e, err))) goto fail;
    kiln_engine_window_attach_cache(e);
    e->p.no_prefix_cache = e->pcache == NULL;
    e->hit_blocks = malloc((size_t)kiln_kv_pool_n_blocks(e->pool) * sizeof *e->hit_blocks);
    e->running = calloc((size_t)p.max_seqs, sizeof *e->running);
    e->b_tokens = malloc((size_t)p.step_tokens * sizeof *e->b_tokens);
    e->b_out = malloc((size_t)p.step_tokens * sizeof *e->b_out);
    e->b_ids = malloc((size_t)p.step_tokens * sizeof *e->b_ids);
    e->b_seqs = calloc((size_t)p.max_seqs, sizeof *e->b_seqs);
    e->b_seq_of = calloc((size_t)p.max_seqs, sizeof *e->b_seq_of);
    e->draft_reqs = calloc((size_t)p.max_seqs, sizeof *e->draft_reqs);
    if (!e->running || !e->b_tokens || !e->b_out || !e->b_ids || !e->b_seqs || !e->b_seq_of || !e->hit_blocks ||
        !e->draft_reqs) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (engine buffers)");
        goto fail;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        st = kiln_error_set(err, KILN_ERR_INTERNAL, "cannot start the engine thread");
        goto fail;
    }
    e->thread_started = true;
    *out = e;
    return KILN_OK;
fail:
    kiln_engine_destroy(e);
    return st;
}

kiln_status kiln_engine_create(const kiln_model *model, const kiln_engine_params *params,
                               kiln_engine **out, kiln_error *err) {
    return kiln_engine_create_debug(model, params, NULL, out, err);
}

static void *engine_main(void *arg) {
    kiln_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->shutdown && !e->in_head && !e->wait_head && e->n_running == 0) {
            if (!e->load_head) {
                pthread_cond_wait(&e->cv, &e->mu);
                continue;
            }
            /* only disk reads in flight: look at them every millisecond */
            if (kiln_engine_any_load_done(e)) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        }
        bool stop = e->shutdown;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        kiln_engine_step(e);
    }
    /* Shutdown: everything still queued or running finishes as cancelled. No submission can
     * arrive any more (submit checks e->shutdown under the mutex). */
    kiln_engine_drain_incoming(e);
    kiln_engine_cancel_loading(e);
    /* running first: releasing a sequence lets its unforked choices go to the waiting FIFO */
    for (int32_t i = 0; i < e->n_running; i++) {
        kiln_seq_finish(e->running[i], KILN_FINISH_CANCELLED, KILN_OK, NULL);
        kiln_seq_release(e, e->running[i]);
    }
    e->n_running = 0;
    atomic_store(&e->st_running, 0);
    while (e->wait_head) {
        kiln_seq *s = e->wait_head;
        e->wait_head = s->next;
        if (!e->wait_head) e->wait_tail = NULL;
        s->next = NULL;
        atomic_fetch_sub(&e->n_queued, 1);
        kiln_seq_finish(s, KILN_FINISH_CANCELLED, KILN_OK, NULL);
        kiln_seq_release(e, s);
    }
    e->wait_head = e->wait_tail = NULL;
    return NULL;
}

void kiln_engine_destroy(kiln_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->shutdown = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    kiln_runner_destroy(e->runner);
    kiln_drafter_destroy(e->drafter);
    free(e->draft_reqs);
    /* the disk tier's queue is flushed here: a restart finds every block written behind */
    kiln_engine_prefix_shutdown(e);
    kiln_kv_pool_destroy(e->pool);
    kiln_kv_pool_destroy(e->pool_swa);
    kiln_backend_destroy(e->be);
    kiln_sampler_scratch_destroy(e->scratch);
    free(e->running);
    free(e->b_tokens);
    free(e->b_out);
    free(e->b_ids);
    free(e->b_seqs);
    free(e->b_seq_of);
    free(e->hit_blocks);
    free(e->win_ckref);
    free(e->win_gen);
    free(e->cache_dir);
    free(e->logits_buf);
    kiln_engine_grammar_shutdown(e);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* A new sequence for req with its stream (two references: the caller's and the sequence's).
 * Errors: as kiln_engine_submit's validation. */
static kiln_status seq_build(kiln_engine *e, const kiln_request *req,
                             const kiln_request_debug *debug, kiln_seq **out, kiln_error *err) {
    kiln_req *r = NULL;
    kiln_status st = kiln_req_create(e->model, req, debug, &r, err);
    if (st) return st;
    kiln_seq *s = calloc(1, sizeof *s);
    if (!s) {
        kiln_req_destroy(r);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (sequence)");
    }
    s->req = r;
    s->method = &kiln_method_sample;
    s->ckpt_index = -1;
    s->n_prompt = (int32_t)r->prompt.n;
    if ((st = kiln_ivec_append(&s->tokens, r->prompt.data, r->prompt.n)))
        kiln_error_set(err, st, "out of memory (sequence tokens)");
    if (!st && !(st = kiln_seq_spec_create(e, s, err)) && s->spec) s->method = &kiln_method_spec;
    if (!st) st = kiln_seq_grammar_attach(e, s, err);
    if (!st && !(st = kiln_stream_create(e->model, r, &s->stream, err))) s->stream->seq = s;
    if (st) {
        *out = s;
        return st;
    }
    *out = s;
    return KILN_OK;
}

/* Free a sequence that never reached the engine (its stream, both references). */
static void seq_discard(kiln_engine *e, kiln_seq *s) {
    if (!s) return;
    if (s->stream) {
        kiln_stream_unref(s->stream);
        kiln_stream_unref(s->stream);
    }
    kiln_seq_spec_destroy(e, s);
    kiln_seq_grammar_detach(s);
    kiln_ivec_free(&s->tokens);
    kiln_req_destroy(s->req);
    free(s);
}

/* Queue s (with its fork_kids: n sequences in all) for the engine thread. */
static kiln_status seq_enqueue(kiln_engine *e, kiln_seq *s, int32_t n, kiln_error *err) {
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&e->mu);
    if (e->shutdown) {
        st = kiln_error_set(err, KILN_ERR_CANCELLED, "the engine is shutting down");
    } else if (atomic_load(&e->n_queued) + n > e->p.max_queue) {
        st = kiln_error_set(err, KILN_ERR_QUEUE_FULL,
                            "the engine's queue is full (%d requests waiting, max_queue %d%s); "
                            "retry later",
                            atomic_load(&e->n_queued), e->p.max_queue,
                            n > 1 ? ", and every choice counts" : "");
    } else {
        s->id = e->next_id++;
        for (kiln_seq *c = s->fork_kids; c; c = c->next) c->id = e->next_id++;
        if (e->in_tail)
            e->in_tail->next = s;
        else
            e->in_head = s;
        e->in_tail = s;
        atomic_fetch_add(&e->n_queued, n);
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

kiln_status kiln_engine_submit_debug(kiln_engine *e, const kiln_request *req,
                                     const kiln_request_debug *debug, kiln_stream **out,
                                     kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    if (!e) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "engine must not be NULL");
    kiln_seq *s = NULL;
    kiln_status st = seq_build(e, req, debug, &s, err);
    /* once queued, s belongs to the engine thread (it may be released at once) */
    kiln_stream *stream = s ? s->stream : NULL;
    if (!st) st = seq_enqueue(e, s, 1, err);
    if (st) {
        seq_discard(e, s);
        return st;
    }
    *out = stream;
    return KILN_OK;
}

kiln_status kiln_engine_submit_n(kiln_engine *e, const kiln_request *req, int32_t n,
                                 kiln_stream **out, kiln_error *err) {
    if (n == 1 && out) return kiln_engine_submit_debug(e, req, NULL, out, err);
    kiln_status bad = KILN_OK;
    if (!out || !e || !req)
        bad = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                             "engine, req and out must not be NULL");
    else if (n < 1 || n > KILN_MAX_CHOICES)
        bad = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "n must be in [1, %d] (got %d)",
                             KILN_MAX_CHOICES, n);
    else if (req->fill_session)
        bad = kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                             "fill_session cannot be shared by n > 1 choices (it is one object "
                             "with one release)");
    if (bad) {
        /* the request owns its fill session from a failed submit on too */
        if (req && req->fill_session && req->fill_session->release)
            req->fill_session->release(req->fill_session_user);
        return bad;
    }
    for (int32_t i = 0; i < n; i++) out[i] = NULL;
    kiln_seq *seqs[KILN_MAX_CHOICES] = {0};
    kiln_status st = KILN_OK;
    for (int32_t i = 0; i < n && !st; i++) {
        kiln_request ri = *req;
        ri.seed = req->seed + (uint64_t)i;
        st = seq_build(e, &ri, NULL, &seqs[i], err);
    }
    for (int32_t i = 1; i < n && !st; i++) {
        if (i == 1)
            seqs[0]->fork_kids = seqs[1];
        else
            seqs[i - 1]->next = seqs[i];
    }
    kiln_stream *streams[KILN_MAX_CHOICES] = {0};
    for (int32_t i = 0; i < n && !st; i++) streams[i] = seqs[i]->stream;
    if (!st) st = seq_enqueue(e, seqs[0], n, err);
    if (st) {
        for (int32_t i = 0; i < n; i++) {
            if (seqs[i]) seqs[i]->next = NULL;
            seq_discard(e, seqs[i]);
        }
        return st;
    }
    /* the sequences are the engine thread's now (read nothing of them) */
    for (int32_t i = 0; i < n; i++) out[i] = streams[i];
    return KILN_OK;
}

kiln_status kiln_engine_submit(kiln_engine *e, const kiln_request *req, kiln_stream **out,
                               kiln_error *err) {
    return kiln_engine_submit_debug(e, req, NULL, out, err);
}

void kiln_engine_get_stats(const kiln_engine *e, kiln_engine_stats *out) {
    memset(out, 0, sizeof *out);
    if (!e) return;
    kiln_kv_pool_stats ps = kiln_kv_pool_get_stats(e->pool);
    out->kv_blocks_total = ps.n_blocks;
    out->kv_blocks_used = ps.used;
    out->kv_blocks_free = ps.free;
    out->kv_blocks_peak = ps.peak;
    out->block_size = e->p.block_size;
    out->n_running = atomic_load(&((kiln_engine *)e)->st_running);
    out->n_queued = atomic_load(&((kiln_engine *)e)->n_queued);
    out->n_steps = atomic_load(&((kiln_engine *)e)->st_steps);
    out->n_prefill_tokens = atomic_load(&((kiln_engine *)e)->st_prefill);
    out->n_decode_tokens = atomic_load(&((kiln_engine *)e)->st_decode);
    out->n_requests_finished = atomic_load(&((kiln_engine *)e)->st_finished);
    kiln_engine *me = (kiln_engine *)e;
    out->kv_blocks_cached = ps.cached;
    out->kv_bytes = kiln_kv_pool_storage_bytes(e->pool) + kiln_kv_pool_storage_bytes(e->pool_swa);
    if (e->pool_swa) {
        const kiln_kv_pool_stats ws = kiln_kv_pool_get_stats(e->pool_swa);
        out->kv_blocks_window_held = ws.used + ws.cached;
        out->kv_blocks_window_cached = ws.cached;
        out->kv_blocks_window_total = ws.n_blocks;
    }
    out->kv_blocks_main_held = ps.class_held[KILN_KV_CLASS_MAIN];
    out->kv_blocks_hi_held = ps.class_held[KILN_KV_CLASS_HI];
    out->kv_blocks_main_total = ps.class_blocks[KILN_KV_CLASS_MAIN];
    out->kv_blocks_hi_total = ps.class_blocks[KILN_KV_CLASS_HI];
    out->kv_blocks_converted = ps.converted;
    out->kv_evictions = ps.evictions;
    out->prefix_hit_requests = atomic_load(&me->st_hit_req);
    out->prefix_miss_requests = atomic_load(&me->st_miss_req);
    out->prefix_hit_tokens = atomic_load(&me->st_hit_tok);
    out->prefix_miss_tokens = atomic_load(&me->st_miss_tok);
    out->preemptions = atomic_load(&me->st_preempt);
    out->spec_verify_steps = atomic_load(&me->st_verify);
    out->spec_drafted = atomic_load(&me->st_drafted);
    out->spec_accepted = atomic_load(&me->st_accepted);
    out->fill_tokens = atomic_load(&me->st_fill);
    out->n_forked = atomic_load(&me->st_forked);
    kiln_engine_prefix_disk_stats(e, out);
}

void kiln_engine_reset_peak(kiln_engine *e) {
    if (e) kiln_kv_pool_reset_peak(e->pool);
}

kiln_status kiln_engine_debug_progress(kiln_engine *e, kiln_stream *stream, kiln_seq_progress *out,
                                       kiln_error *err) {
    if (!e || !stream || !out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "NULL argument");
    memset(out, 0, sizeof *out);
    kiln_seq *s = stream->seq;
    if (!s) {
        out->finished = true;
        return KILN_OK;
    }
    out->admitted = s->state == KILN_SEQ_RUNNING;
    out->loading = s->state == KILN_SEQ_LOADING;
    out->finished = s->finish != KILN_FINISH_NONE;
    out->n_prompt = s->n_prompt;
    out->n_computed = s->n_computed;
    out->n_generated = s->n_generated;
    out->n_blocks = s->bt.n_blocks;
    return KILN_OK;
}

void kiln_engine_get_params(const kiln_engine *engine, kiln_engine_params *out) {
    if (!out) return;
    *out = engine ? engine->p : kiln_engine_default_params();
}
