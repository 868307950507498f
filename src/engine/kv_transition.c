/*
 * kv_transition.c - the delayed KV transition (DESIGN.md "Delayed quantization";
 * kiln_engine_params.kv_quant_start): at a sequence's commit, once it is longer than
 * kv_quant_start positions, each committed full block still in the f16 class is rewritten into
 * a block of the main (quantized) class and the f16 block is released to the pool.
 *
 * Choices:
 *   - Only committed positions count: the blocks covering [0, n_computed / block_size) after the
 *     step's rollback. The partial last block and a speculative suffix are never converted.
 *   - A block shared with another table (refcount > 1: a prefix-cache hit another sequence
 *     also holds, a fork) is left in f16 while it is shared; the owners see one format.
 *   - The prefix cache keeps indexing the f16 original under the f16 namespace (it goes idle
 *     to the LRU, evictable, with its contents intact); the quantized copy is never indexed.
 *     A later prompt with the same prefix therefore reuses f16 blocks, whose logits are those
 *     of an uncached run below kv_quant_start.
 *   - No main-class block free (or evictable): the block stays f16 and is tried again at the
 *     next commit.
 * Conversion reads each f16 row back to f32 (exact) and writes it with the main format's
 * write_row (kv/kv_format.h): the same bytes a row written directly in that format gets.
 */
#include <stdlib.h>

#include "engine/engine_internal.h"
#include "kv/kv_format.h"

static void convert_block(kiln_engine *e, int32_t from, int32_t to, float *tmp) {
    kiln_kv_pool *pool = e->pool;
    const kiln_model_config *c = &e->model->cfg;
    const kiln_kv_geom g = {(int64_t)c->n_head_kv * c->head_dim, c->n_head_kv, c->head_dim};
    const int32_t bs = e->p.block_size;
    const kiln_kv_format_traits *hk = kiln_kv_format_of(kiln_kv_pool_block_format_k(pool, from));
    const kiln_kv_format_traits *hv = kiln_kv_format_of(kiln_kv_pool_block_format_v(pool, from));
    const kiln_kv_format_traits *lk = kiln_kv_format_of(kiln_kv_pool_block_format_k(pool, to));
    const kiln_kv_format_traits *lv = kiln_kv_format_of(kiln_kv_pool_block_format_v(pool, to));
    const size_t hrk = kiln_kv_pool_row_bytes_k(pool, from), hrv = kiln_kv_pool_row_bytes_v(pool, from);
    const size_t lrk = kiln_kv_pool_row_bytes_k(pool, to), lrv = kiln_kv_pool_row_bytes_v(pool, to);
    for (int32_t l = 0; l < c->n_layer; l++) {
        const char *sk = kiln_kv_pool_k(pool, l, from), *sv = kiln_kv_pool_v(pool, l, from);
        char *dk = kiln_kv_pool_k(pool, l, to), *dv = kiln_kv_pool_v(pool, l, to);
        for (int32_t r = 0; r < bs; r++) {
            hk->read_row(sk + (size_t)r * hrk, tmp, &g);
            lk->write_row(dk + (size_t)r * lrk, tmp, &g);
            hv->read_row(sv + (size_t)r * hrv, tmp, &g);
            lv->write_row(dv + (size_t)r * lrv, tmp, &g);
        }
    }
}

void kiln_engine_kv_transition(kiln_engine *e, kiln_seq *s) {
    if (e->p.kv_quant_start <= 0 || s->n_computed <= e->p.kv_quant_start) return;
    if (!e->be->ops->host_memory) return; /* refused at creation for device pools */
    kiln_kv_pool *pool = e->pool;
    int32_t full = s->n_computed / e->p.block_size;
    if (full > s->bt.n_blocks) full = s->bt.n_blocks;
    float *tmp = NULL;
    for (int32_t i = 0; i < full; i++) {
        const int32_t b = s->bt.blocks[i];
        if (kiln_kv_pool_block_class(pool, b) != KILN_KV_CLASS_HI) continue;
        if (kiln_kv_pool_refcount(pool, b) != 1) continue;
        if (!tmp) {
            const kiln_model_config *c = &e->model->cfg;
            tmp = malloc((size_t)c->n_head_kv * (size_t)c->head_dim * sizeof *tmp);
            if (!tmp) return;
        }
        const int32_t nb = kiln_kv_pool_alloc_class(pool, KILN_KV_CLASS_MAIN);
        if (nb < 0) break;
        convert_block(e, b, nb, tmp);
        s->bt.blocks[i] = nb;
        kiln_kv_pool_unref(pool, b);
        kiln_kv_pool_note_converted(pool);
    }
    free(tmp);
}
