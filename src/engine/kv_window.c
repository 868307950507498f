/*
 * kv_window.c - sliding-window memory (issue 14 item 4): layer groups, and freeing blocks
 * outside the window.
 *
 * A model's attention layers fall in two groups: full (no window) and sliding (window W; the
 * group's W is the largest of its layers'). With a sliding group the engine keeps two block
 * pools: e->pool holds the full group's layers (possibly none: Mistral windows every layer,
 * and its pool then only counts block ids), e->pool_swa the sliding group's. Each sequence has
 * one table per pool (s->bt, s->bt_swa), always of the same length: block i of either holds
 * positions [i*bs, (i+1)*bs). This is the layout of vLLM's hybrid KV cache manager (one block
 * table per KV cache group), written afresh.
 *
 * Freeing. At a step's commit, after the speculative transaction resolved and rejected
 * positions were truncated, a sequence has n_computed = N committed positions, and every
 * position it can still compute is >= N (a rollback only ever discards uncommitted drafts,
 * which sit at positions >= N; preemption drops the whole table). The token at position p
 * attends to (p - W, p], so no query that can still run reads a key below N - W + 1. The
 * sequence keeps its last min(ceil(N/bs), ceil(W/bs) + 1) sliding blocks and gives back the
 * ones before (kiln_block_table_free_below): exactly the count `kiln fit` prints
 * (kv_fit.h kiln_kv_fit_group_tokens). The first kept block starts at or below N - W - 1, so
 * the keys N - W + 1 .. N - 1 every later query may read are always kept.
 * Speculation: up to k (<= KILN_MAX_SPEC_K = 32) drafts are written at N .. N + k and read
 * keys from N - W + 1 on, all kept; freeing is relative to the committed N, never to the
 * drafted end, and happens after the rollback, which is what keeps a rollback of k drafts
 * safe (the margin is the whole uncommitted suffix). During a step a sequence holds up to
 * ceil(W/bs) + 1 + ceil(n_new/bs) sliding blocks.
 *
 * Sizing: a pool sized in bytes (kv_memory, memory_budget) spends what the sliding group does
 * not need on more full-group blocks (kiln_engine_window_main_blocks); one sized in positions
 * (kv_tokens, the default) keeps that many. The sliding pool gets max(c, min(n_main, max_seqs * c)) blocks, c = ceil(W/bs) +
 * ceil(step_tokens/bs) + 2, the most one sequence holds during a step. A sequence's live
 * sliding blocks are no more than its full table's, so it rarely runs dry before the full
 * pool; when it does (sequences sharing a prefix hold one full block each but a window of
 * sliding blocks each), the sequence is not planned that step, and a step that plans nothing
 * preempts the newest sequence, as for the full pool.
 *
 * Prefix cache. A hit of H = n blocks needs, besides the full group's n blocks, the sliding
 * blocks of the window before H. They are kept as a checkpoint, the way recurrent models keep
 * their state (prefix.c): at a commit that ends on a block boundary, the prefix cache's
 * indexed block b ending there gets the ids of the last min(n, keep) sliding blocks, which
 * are marked cached in the sliding pool (so when the sequence gives them back they wait in
 * its LRU instead of being freed; e->win_ckref counts the checkpoints keeping each). A lookup
 * shortens a hit to the longest run whose last block has a valid checkpoint; the hit's
 * sliding table is n - k holes and then the k checkpointed blocks, shared. A checkpoint is
 * freed with its block's entry (unindexed, evicted) or when the sequence's next decode
 * checkpoint replaces it; it goes stale when the sliding pool evicts one of its blocks for a
 * new one (each eviction moves the block's generation, e->win_gen, on; a checkpoint records
 * the generations it saw). Prefill chunks end on block boundaries (kiln_engine_prefix_align_chunks), so a prompt
 * leaves checkpoints at its chunk ends. The disk tier is off for such a model: a checkpoint
 * names blocks of this process's pool.
 */
#include <stdlib.h>

#include "backend/runner.h"
#include "engine/engine_internal.h"
#include "kv/prefix_cache.h"
#include "util/error.h"
#include "util/log.h"

/* One sliding block of a window checkpoint: its id and the generation it had (win_gen). */
typedef struct win_ref {
    int32_t id; /* -1: none */
    uint32_t gen;
} win_ref;

int32_t kiln_engine_window_plan(const kiln_model *m, const kiln_engine_params *p,
                                bool host_memory, bool *sliding) {
    const kiln_model_config *c = &m->cfg;
    /* a model with recurrent state too would need both checkpoints at a prefix hit (not done) */
    if (p->kv_keep_window || p->kv_quant_start > 0 || !kiln_config_has_sliding(c) ||
        kiln_model_seq_state_floats(m) > 0)
        return 0;
    if (!host_memory) {
        kiln_log_warn("kv: sliding-window layers keep every block on this backend (its "
                      "attention reads one block table per sequence)");
        return 0;
    }
    int32_t w = 0;
    for (int32_t l = 0; l < c->n_layer; l++) {
        sliding[l] = c->layer[l].sliding_window > 0;
        if (c->layer[l].sliding_window > w) w = c->layer[l].sliding_window;
    }
    return w;
}

/* blocks one sequence holds in the sliding pool during a step, at most */
static int64_t seq_cap(int32_t window, int32_t step_tokens, int32_t bs) {
    return (int64_t)kiln_kv_blocks_for_tokens(window, bs) +
           kiln_kv_blocks_for_tokens(step_tokens, bs) + 2;
}

int32_t kiln_engine_window_main_blocks(const kiln_model *m, const kiln_engine_params *p,
                                       const bool *sliding, int32_t window, kiln_dtype fk,
                                       kiln_dtype fv) {
    const kiln_model_config *c = &m->cfg;
    const int64_t kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    int32_t n_sw = 0;
    for (int32_t l = 0; l < c->n_layer; l++) n_sw += sliding[l];
    const int64_t bb_full =
        n_sw < c->n_layer
            ? kiln_kv_block_bytes_geom(c->n_layer - n_sw, kv_dim, c->head_dim, p->block_size, fk,
                                       fv)
            : 0;
    const int64_t bb_sw =
        kiln_kv_block_bytes_geom(n_sw, kv_dim, c->head_dim, p->block_size, fk, fv);
    const int64_t S = seq_cap(window, p->step_tokens, p->block_size) * p->max_seqs;
    const int64_t budget = p->kv_memory;
    int64_t n;
    if (bb_sw <= 0) return 1;
    if (budget / bb_sw >= S && bb_full == 0) {
        /* ids only: enough for max_seqs full contexts, and no fewer than the sliding pool */
        n = (int64_t)p->max_seqs * kiln_kv_blocks_for_tokens(p->n_ctx, p->block_size);
        if (n < S) n = S;
    } else if (bb_full > 0 && budget / (bb_full + bb_sw) >= S)
        n = (budget - S * bb_sw) / bb_full;
    else
        n = budget / (bb_full + bb_sw);
    return n < 1 ? 1 : n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

kiln_status kiln_engine_window_create(kiln_engine *e, const kiln_kv_pool_params *main_params,
                                      const bool *sliding, int32_t window, kiln_error *err) {
    const int32_t bs = e->p.block_size;
    const int64_t cap = seq_cap(window, e->p.step_tokens, bs);
    int64_t n = cap * e->p.max_seqs;
    if (n > main_params->n_blocks) n = main_params->n_blocks;
    if (n < cap) n = cap; /* one sequence always fits */
    e->win_keep = kiln_kv_blocks_for_tokens(window, bs) + 1;
    e->win_ckref = calloc((size_t)n, sizeof *e->win_ckref);
    e->win_gen = calloc((size_t)n, sizeof *e->win_gen);
    if (!e->win_ckref || !e->win_gen)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (window)");
    kiln_kv_pool_params pp = *main_params;
    pp.n_blocks = (int32_t)n;
    pp.layers = sliding;
    pp.window = window;
    kiln_status st = kiln_kv_pool_create(&pp, &e->pool_swa, err);
    if (st) return st;
    st = kiln_runner_set_sliding_pool(e->runner, e->pool_swa, err);
    if (st) {
        kiln_kv_pool_destroy(e->pool_swa);
        e->pool_swa = NULL;
    }
    return st;
}

kiln_status kiln_engine_window_reserve(kiln_engine *e, kiln_seq *s, kiln_error *err) {
    if (!e->pool_swa) return KILN_OK;
    const int32_t n_tokens = s->bt.n_blocks * e->p.block_size;
    return kiln_block_table_reserve(&s->bt_swa, e->pool_swa, n_tokens, err);
}

void kiln_engine_window_truncate(kiln_engine *e, kiln_seq *s) {
    if (e->pool_swa) kiln_block_table_truncate(&s->bt_swa, e->pool_swa, s->n_computed);
}

void kiln_engine_window_release(kiln_engine *e, kiln_seq *s) {
    if (e->pool_swa) kiln_block_table_release(&s->bt_swa, e->pool_swa);
}

void kiln_engine_window_commit(kiln_engine *e, kiln_seq *s) {
    if (!e->pool_swa) return;
    const int32_t bs = e->p.block_size;
    const int32_t first = kiln_kv_blocks_for_tokens(s->n_computed, bs) - e->win_keep;
    if (first > 0) (void)kiln_block_table_free_below(&s->bt_swa, e->pool_swa, first * bs);
}

size_t kiln_engine_window_ckpt_bytes(const kiln_engine *e) {
    return e->pool_swa ? (size_t)e->win_keep * sizeof(win_ref) : 0;
}

/* the sliding pool is about to hand out a cached block: every checkpoint naming it is stale
 * from now on (its generation moves on) */
static void win_on_evict(void *user, int32_t block) {
    kiln_engine *e = user;
    e->win_gen[block]++;
    e->win_ckref[block] = 0;
}

/* a checkpoint is being freed: its sliding blocks are kept for one checkpoint fewer */
static void win_state_free(void *user, int32_t block, const void *state) {
    (void)block;
    kiln_engine *e = user;
    const win_ref *r = state;
    for (int32_t k = 0; k < e->win_keep; k++) {
        const int32_t id = r[k].id;
        if (id < 0 || e->win_gen[id] != r[k].gen || e->win_ckref[id] <= 0) continue;
        if (--e->win_ckref[id] == 0 && kiln_kv_pool_is_cached(e->pool_swa, id))
            kiln_kv_pool_set_cached(e->pool_swa, id, false);
    }
}

void kiln_engine_window_attach_cache(kiln_engine *e) {
    if (!e->pool_swa || !e->pcache) return;
    const kiln_kv_pool_hooks h = {.user = e, .on_evict = win_on_evict};
    kiln_kv_pool_set_hooks(e->pool_swa, &h);
    kiln_prefix_cache_set_state_free_fn(e->pcache, win_state_free, e);
}

bool kiln_engine_window_valid(const kiln_engine *e, const void *state) {
    if (!e->pool_swa) return true;
    const win_ref *r = state;
    if (!r) return false;
    for (int32_t k = 0; k < e->win_keep; k++)
        if (r[k].id >= 0 && e->win_gen[r[k].id] != r[k].gen) return false;
    return true;
}

bool kiln_engine_window_checkpoint(kiln_engine *e, kiln_seq *s, int32_t i, int32_t b) {
    if (!e->pool_swa || !e->pcache || i < 0 || i >= s->bt_swa.n_blocks) return false;
    win_ref *r = malloc((size_t)e->win_keep * sizeof *r);
    if (!r) return false;
    const int32_t first = i + 1 - e->win_keep > 0 ? i + 1 - e->win_keep : 0;
    for (int32_t k = 0; k < e->win_keep; k++) {
        const int32_t id = first + k <= i ? s->bt_swa.blocks[first + k] : -1;
        if (first + k <= i && id < 0) { /* given back already */
            free(r);
            return false;
        }
        r[k] = (win_ref){id, id >= 0 ? e->win_gen[id] : 0};
    }
    const bool ok = kiln_prefix_cache_set_state(e->pcache, b, r);
    for (int32_t k = 0; ok && k < e->win_keep; k++) {
        if (r[k].id < 0) continue;
        e->win_ckref[r[k].id]++;
        kiln_kv_pool_set_cached(e->pool_swa, r[k].id, true);
    }
    free(r);
    return ok;
}

bool kiln_engine_window_share(kiln_engine *e, kiln_seq *s, int32_t b, int32_t n) {
    if (!e->pool_swa) return true;
    const win_ref *r = e->pcache ? kiln_prefix_cache_state(e->pcache, b) : NULL;
    if (!r || n < 1 || !kiln_engine_window_valid(e, r)) return false;
    const int32_t k = n < e->win_keep ? n : e->win_keep;
    int32_t *ids = malloc((size_t)k * sizeof *ids);
    if (!ids) return false;
    for (int32_t j = 0; j < k; j++) ids[j] = r[j].id;
    kiln_error err = {0};
    bool ok = kiln_block_table_holes(&s->bt_swa, n - k, &err) == KILN_OK &&
              kiln_block_table_share(&s->bt_swa, e->pool_swa, ids, k, &err) == KILN_OK;
    if (!ok) kiln_block_table_release(&s->bt_swa, e->pool_swa);
    free(ids);
    return ok;
}
