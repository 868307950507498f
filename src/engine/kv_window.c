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
 * Sizing: the sliding pool gets min(n_main, max_seqs * (ceil(W/bs) + ceil(step_tokens/bs) +
 * 2)) blocks. Either bound means it never runs dry before the full pool: a sequence's live
 * sliding blocks are a subset of the indices of its full table, whose blocks are its own
 * (prefix hits are off, below), and a sequence never holds more than the second bound.
 *
 * Prefix cache: off while a sliding group frees blocks. A hit of H tokens needs the sliding
 * blocks of [H - W + 1, H), and they are not indexed (only the full group's blocks are); so
 * every hit is treated as empty, and the cache (with its disk tier) is not built at all.
 * kv_keep_window restores one pool and the cache.
 */
#include <stdlib.h>

#include "backend/runner.h"
#include "engine/engine_internal.h"
#include "util/log.h"

int32_t kiln_engine_window_plan(const kiln_model *m, const kiln_engine_params *p,
                                bool host_memory, bool *sliding) {
    const kiln_model_config *c = &m->cfg;
    if (p->kv_keep_window || p->kv_quant_start > 0 || !kiln_config_has_sliding(c)) return 0;
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

kiln_status kiln_engine_window_create(kiln_engine *e, const kiln_kv_pool_params *main_params,
                                      const bool *sliding, int32_t window, kiln_error *err) {
    const int32_t bs = e->p.block_size;
    int64_t cap = (int64_t)kiln_kv_blocks_for_tokens(window, bs) +
                  kiln_kv_blocks_for_tokens(e->p.step_tokens, bs) + 2;
    int64_t n = cap * e->p.max_seqs;
    if (n > main_params->n_blocks) n = main_params->n_blocks;
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
    const int32_t keep = kiln_kv_blocks_for_tokens(kiln_kv_pool_window(e->pool_swa), bs) + 1;
    const int32_t first = kiln_kv_blocks_for_tokens(s->n_computed, bs) - keep;
    if (first > 0) (void)kiln_block_table_free_below(&s->bt_swa, e->pool_swa, first * bs);
}
