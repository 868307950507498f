/*
 * prefix.c - the prefix cache's engine side (DESIGN.md "KV cache", "Block lifecycle"): the
 * namespace, lookup and sharing at admission, indexing at commit, and recurrent checkpoints.
 * The index itself is kv/prefix_cache.c; the disk tier's engine side is prefix_disk.c.
 *
 * Why a hit is bitwise a miss. A block's K and V rows depend only on the tokens at and before
 * its positions (the chain hash covers exactly those), the weights (the fingerprint), the page
 * format and the kernel path (the namespace covers both), never on the batch or on how the
 * prompt was chunked (the batch-invariance promise). So the rows a hit shares are the rows a
 * miss would compute.
 *
 * A shared block is never written. Only full blocks are indexed and shared, and admission
 * always leaves at least the last token to compute (its logits are needed), so a sequence
 * writes only positions past its shared run: into a partial block of its own or a fresh one.
 * No copy-on-write is needed.
 *
 * Recurrent layers (qwen3_next's gated delta net) keep a per-sequence state instead of
 * per-position KV: a hit must also restore the state after the shared run. The state is
 * checkpointed on the block that ends where it was taken, and only there: prefill chunks of
 * such models end on block boundaries (the scheduler's chunk rule), the last full block of a
 * prompt gets one, and decoding keeps one checkpoint per sequence, at its latest boundary (for
 * preemption). A lookup for such a model ends at the last block carrying a checkpoint.
 * Checkpoints are held in host memory within a budget (ckpt_bytes_max); past it, new ones are
 * not taken (the cache then hits less, never wrongly).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "engine/engine_internal.h"
#include "kv/kv_format.h"
#include "util/error.h"
#include "util/log.h"

#define CKPT_BYTES_MIN ((int64_t)256 << 20)

/* A hit needs a checkpoint at its end: the recurrent state, or the sliding window's blocks
 * (kv_window.c; a model has one or the other, never both). */
static bool needs_ckpt(const kiln_engine *e) {
    return e->rec_state_floats > 0 || e->pool_swa;
}

static size_t ckpt_bytes(const kiln_engine *e) {
    return e->pool_swa ? kiln_engine_window_ckpt_bytes(e)
                       : (size_t)e->rec_state_floats * sizeof(float);
}

/* block carries a checkpoint a hit can use */
static bool has_ckpt(const kiln_engine *e, int32_t block) {
    const void *st = kiln_prefix_cache_state(e->pcache, block);
    return st && kiln_engine_window_valid(e, st);
}

kiln_status kiln_engine_prefix_init(kiln_engine *e, kiln_error *err) {
    if (e->p.no_prefix_cache) return KILN_OK;
    bool disk = e->p.cache_dir && e->p.cache_dir[0];
    if (disk && e->pool_swa) {
        /* a window checkpoint names blocks of this process's sliding pool (kv_window.c) */
        kiln_log_warn("prefix cache: the disk tier is off for a model whose sliding-window "
                      "blocks are freed (pass kv_keep_window / --kv-keep-window to keep it)");
        disk = false;
    }
    uint64_t fp = 0;
    kiln_error ferr = {0};
    if (kiln_model_fingerprint(e->model, &fp, &ferr) != KILN_OK) {
        if (disk)
            return kiln_error_set(err, KILN_ERR_IO,
                                  "cache_dir needs the model's fingerprint, which failed: %s",
                                  ferr.message);
        /* RAM only: the index lives and dies with this engine and this model, so any
         * namespace no other engine uses will do. */
        fp = (uint64_t)(uintptr_t)e ^ (uint64_t)time(NULL) ^ 0x9e3779b97f4a7c15ull;
    }
    char numerics[128] = "";
    if (e->be->ops->numerics) e->be->ops->numerics(e->be, numerics, sizeof numerics);
    /* the format blocks are indexed under: the write class's (new blocks; with the delayed
     * transition, f16, whose originals stay indexed after conversion, kv_transition.c) */
    const kiln_dtype fmt = kiln_kv_pool_dtype(e->pool), fmt_v = kiln_kv_pool_dtype_v(e->pool);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    static const char tag[] = "kiln prefix namespace v1";
    XXH3_64bits_update(&st, tag, sizeof tag);
    XXH3_64bits_update(&st, &fp, sizeof fp);
    const int32_t geo[3] = {(int32_t)fmt, e->p.block_size, (int32_t)fmt_v};
    XXH3_64bits_update(&st, geo, fmt_v == fmt ? 2 * sizeof geo[0] : sizeof geo);
    XXH3_64bits_update(&st, numerics, strlen(numerics) + 1);
    const uint64_t ns = XXH3_64bits_digest(&st);
    kiln_status s = kiln_prefix_cache_create(e->pool, ns, ckpt_bytes(e), &e->pcache, err);
    if (s) return s;
    e->ckpt_bytes_max = e->p.kv_memory / 4 > CKPT_BYTES_MIN ? e->p.kv_memory / 4 : CKPT_BYTES_MIN;
    const kiln_model_config *c = &e->model->cfg;
    const kiln_kv_geom g = {(int64_t)c->n_head_kv * c->head_dim, c->n_head_kv, c->head_dim};
    e->disk_kv_bytes = (int64_t)c->n_layer * e->p.block_size *
                       (int64_t)(kiln_kv_format_row_bytes_geom(fmt, &g) +
                                 kiln_kv_format_row_bytes_geom(fmt_v, &g));
    if (e->rec_state_floats > 0 && !e->be->ops->host_memory)
        kiln_log_warn("prefix cache: this model's recurrent state lives in device memory, which "
                      "is not checkpointed yet; its prompts are computed, never shared");
    if (disk) return kiln_engine_prefix_disk_open(e, fp, err);
    return KILN_OK;
}

void kiln_engine_prefix_shutdown(kiln_engine *e) {
    kiln_engine_prefix_disk_close(e);
    kiln_prefix_cache_destroy(e->pcache);
    e->pcache = NULL;
}

bool kiln_engine_prefix_align_chunks(const kiln_engine *e) {
    return e->pcache && needs_ckpt(e);
}

/* Make s->bhash cover the first n full blocks (fewer on out of memory: returns how many). */
static int32_t ensure_hashes(kiln_engine *e, kiln_seq *s, int32_t n) {
    const int32_t bs = e->p.block_size;
    if (n > (int32_t)(s->tokens.n / bs)) n = (int32_t)(s->tokens.n / bs);
    if (n <= s->n_hashed) return n;
    if (n > s->cap_hash) {
        int32_t cap = s->cap_hash ? s->cap_hash : 16;
        while (cap < n) cap *= 2;
        uint64_t *nb = realloc(s->bhash, (size_t)cap * sizeof *nb);
        if (!nb) return s->n_hashed;
        s->bhash = nb;
        s->cap_hash = cap;
    }
    const uint64_t ns = kiln_prefix_cache_namespace(e->pcache);
    for (int32_t i = s->n_hashed; i < n; i++)
        s->bhash[i] =
            kiln_prefix_hash(i ? s->bhash[i - 1] : ns, s->tokens.data + (size_t)i * bs, bs, ns);
    s->n_hashed = n;
    return n;
}

int32_t kiln_engine_prefix_lookup(kiln_engine *e, kiln_seq *s, int32_t *blocks) {
    if (!e->pcache || s->tokens.n < 2) return 0;
    const int32_t bs = e->p.block_size;
    const int32_t limit = ensure_hashes(e, s, (int32_t)((s->tokens.n - 1) / bs));
    int32_t n = 0;
    for (; n < limit; n++) {
        int32_t b =
            kiln_prefix_cache_find(e->pcache, s->bhash[n], kiln_engine_prefix_parent(e, s, n),
                                   s->tokens.data + (size_t)n * bs);
        if (b < 0) break;
        blocks[n] = b;
    }
    if (needs_ckpt(e))
        while (n > 0 && !has_ckpt(e, blocks[n - 1])) n--;
    return n;
}

bool kiln_engine_prefix_share(kiln_engine *e, kiln_seq *s, const int32_t *blocks, int32_t n) {
    if (n <= 0 || !e->pcache) return n == 0;
    kiln_error err = {0};
    if (kiln_block_table_share(&s->bt, e->pool, blocks, n, &err) != KILN_OK) return false;
    if (!kiln_engine_window_share(e, s, blocks[n - 1], n)) {
        kiln_block_table_release(&s->bt, e->pool);
        return false;
    }
    if (e->rec_state_floats > 0) {
        /* the checkpoint holds the state after exactly n * block_size positions (its header
         * says so, which the runner checks against n_past) */
        const void *ck = kiln_prefix_cache_state(e->pcache, blocks[n - 1]);
        e->be->ops->upload(e->be, s->rec_state, ck, (size_t)e->rec_state_floats * sizeof(float));
    }
    s->n_computed = n * e->p.block_size;
    s->n_registered = n;
    return true;
}

void kiln_engine_prefix_rollback(kiln_engine *e, kiln_seq *s) {
    const int32_t full = s->n_computed / e->p.block_size;
    if (s->n_registered > full) s->n_registered = full;
    if (s->n_hashed > full) s->n_hashed = full;
    if (s->ckpt_index >= full) s->ckpt_index = -1;
}

void kiln_engine_prefix_commit(kiln_engine *e, kiln_seq *s) {
    if (!e->pcache) return;
    const int32_t bs = e->p.block_size;
    int32_t full = ensure_hashes(e, s, s->n_computed / bs);
    if (full > s->bt.n_blocks) full = s->bt.n_blocks;
    for (int32_t i = s->n_registered; i < full; i++)
        (void)kiln_prefix_cache_insert(e->pcache, s->bhash[i], kiln_engine_prefix_parent(e, s, i),
                                       s->tokens.data + (size_t)i * bs, s->bt.blocks[i]);
    if (full > s->n_registered) s->n_registered = full;
    if (!needs_ckpt(e) || s->n_computed <= 0 || s->n_computed % bs != 0 ||
        full < s->n_computed / bs)
        return;
    /* a checkpoint on the block ending here (the indexed one with these contents: ours, or
     * an identical block another sequence indexed first) */
    const int32_t i = s->n_computed / bs - 1;
    const int32_t b =
        kiln_prefix_cache_find(e->pcache, s->bhash[i], kiln_engine_prefix_parent(e, s, i),
                               s->tokens.data + (size_t)i * bs);
    if (b < 0) return;
    const bool decode = s->n_computed > s->n_prompt;
    if (!has_ckpt(e, b)) {
        const size_t bytes = ckpt_bytes(e);
        kiln_prefix_cache_stats cs = kiln_prefix_cache_get_stats(e->pcache);
        if ((int64_t)(cs.checkpoints + 1) * (int64_t)bytes > e->ckpt_bytes_max) return;
        if (!e->be->ops->host_memory) return; /* device-resident state: not checkpointed yet */
        if (e->pool_swa ? !kiln_engine_window_checkpoint(e, s, i, b)
                        : !kiln_prefix_cache_set_state(e->pcache, b, s->rec_state))
            return;
    }
    if (!decode) return;
    /* decoding keeps only its latest checkpoint (the one a preempted sequence resumes from) */
    if (s->ckpt_index >= 0 && s->ckpt_index != i && s->ckpt_index < s->n_hashed) {
        const int32_t j = s->ckpt_index;
        const int32_t old =
            kiln_prefix_cache_find(e->pcache, s->bhash[j], kiln_engine_prefix_parent(e, s, j),
                                   s->tokens.data + (size_t)j * bs);
        if (old >= 0) kiln_prefix_cache_drop_state(e->pcache, old);
    }
    s->ckpt_index = i;
}
