/*
 * cpu_attention.c - the CPU backend's KV row writes and paged attention over a whole varlen
 * batch: how (sequence, tile, KV head) work items are dealt to the threads, and the per-item
 * kernel (kiln_attention_group, ops.h). Any deal gives the same bits: every (token, head)
 * result is independent of the tiling (ops.h).
 */
#include <string.h>

#include "backend/cpu/attn_turbo.h"
#include "backend/cpu/cpu_context.h"
#include "backend/cpu/ops.h"
#include "kv/kv_format.h"
#include "kv/kv_pool.h"

void kiln_cpu_kv_write(kiln_backend *be, kiln_kv_pool *pool, int32_t layer, const kiln_step *st,
                       const float *k, const float *v) {
    (void)be;
    const int32_t bs = kiln_kv_pool_block_size(pool);
    const int64_t kv_dim = kiln_kv_pool_kv_dim(pool);
    const int32_t hd = kiln_kv_pool_head_dim(pool);
    const kiln_kv_geom g = {kv_dim, (int32_t)(kv_dim / hd), hd};
    const bool sliding = kiln_kv_pool_window(pool) > 0;
    for (int32_t i = 0; i < st->n_tokens; i++) {
        const int32_t pos = st->tok_pos[i];
        const int32_t block =
            kiln_batch_seq_blocks(&st->b->seqs[st->tok_seq[i]], sliding)[pos / bs];
        const kiln_kv_format_traits *fk =
            kiln_kv_format_of(kiln_kv_pool_block_format_k(pool, block));
        const kiln_kv_format_traits *fv =
            kiln_kv_format_of(kiln_kv_pool_block_format_v(pool, block));
        const size_t r = (size_t)(pos % bs);
        fk->write_row((char *)kiln_kv_pool_k(pool, layer, block) +
                          r * kiln_kv_pool_row_bytes_k(pool, block),
                      k + i * kv_dim, &g);
        fv->write_row((char *)kiln_kv_pool_v(pool, layer, block) +
                          r * kiln_kv_pool_row_bytes_v(pool, block),
                      v + i * kv_dim, &g);
    }
}

/* Whether dealing whole (sequence, tile) units round-robin keeps nth threads balanced: at
 * least two sequences per thread, and no thread with more than 5/4 of the mean work, a
 * unit's work taken as its tokens x the keys of its last token (sequences of very different
 * lengths, e.g. 2000/50/50/50 keys, would give one thread ~1.9x the mean). Decided once per
 * step (attn_per), so every thread of every layer uses the same deal. */
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

void kiln_cpu_attention_deal(cpu_backend *c, const kiln_step *st) {
    const int32_t n_head_kv = c->res.n_head_kv;
    c->attn_tile = kiln_cpu_attn_tile(c->res.n_head, n_head_kv);
    c->attn_per = 1;
    if (n_head_kv > 0 && c->res.head_dim > 0)
        c->attn_per = whole_units_balanced(st->b, c->attn_tile, c->nth) ? n_head_kv : 1;
}

typedef struct attn_job {
    cpu_backend *c;
    const kiln_attn_params *p;
    const kiln_step *st;
    const float *q;
    float *out;
    int32_t bs;
} attn_job;

/* Work items: (sequence, tile of up to attn_tile consecutive new tokens, KV head); each runs
 * kiln_attention_group for the tile's tokens and the KV head's query heads. Every (token,
 * head) result is independent of the tiling (ops.h), so any split gives the same bits.
 * With at least two sequences per thread (and a balanced deal: whole_units_balanced, attn_per),
 * the KV heads of a (sequence, tile) all go to one thread, tiles dealt round-robin: a KV block
 * row holds every head's slice of a token, so one core then reads whole rows instead of two
 * cores each reading every other head's slice (128 bytes in f16, 256 in f32 for head_dim 64).
 * tinyllama Q4_0, 2 threads, 16 sequences decoding: attention 14.3% -> 11.8% of the step at
 * 128-256 keys (perf); A/B 1.10x (3 pairs) at 512-544 keys, 1.00-1.04x at 128-192. Otherwise
 * (one sequence decoding, one prompt's prefill, lengths far apart) the items are dealt
 * round-robin one by one. */
static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    cpu_backend *c = j->c;
    const kiln_attn_params *p = j->p;
    const kiln_step *st = j->st;
    const int32_t hd = p->head_dim, G = p->n_head / p->n_head_kv, M = c->attn_tile;
    const int64_t q_dim = (int64_t)p->n_head * hd, kv_dim = (int64_t)p->n_head_kv * hd;
    float *scratch = c->attn_scratch + (size_t)ith * c->attn_scratch_floats;
    int64_t w = 0;
    const int64_t per = c->attn_per;
    for (int32_t s = 0; s < st->b->n_seqs; s++) {
        const kiln_batch_seq *sq = &st->b->seqs[s];
        const int32_t tiles = (sq->n_new + M - 1) / M;
        for (int32_t tl = 0; tl < tiles; tl++) {
            for (int32_t g = 0; g < p->n_head_kv; g++, w++) {
                if (w / per % nth != ith) continue;
                const int32_t i0 = sq->first + tl * M;
                const int32_t nt = sq->first + sq->n_new - i0 < M ? sq->first + sq->n_new - i0 : M;
                int32_t begin[KILN_ATTN_MAX_TILE], end[KILN_ATTN_MAX_TILE];
                for (int32_t k = 0; k < nt; k++) {
                    const int32_t pos = st->tok_pos[i0 + k];
                    begin[k] = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
                    end[k] = pos + 1;
                }
                const int64_t po = c->ptr_off[s];
                const int op = c->seq_operand[s];
                const kiln_attn_kv kv = {c->kb + po,
                                         c->vb + po,
                                         j->bs,
                                         kv_dim,
                                         (int64_t)g * hd,
                                         hd,
                                         op < 0 ? 0 : op,
                                         op < 0 ? c->kfmt + po : NULL,
                                         op < 0 ? c->vfmt + po : NULL};
                float *o = j->out + i0 * q_dim + (int64_t)g * G * hd;
                const float *qi = j->q + i0 * q_dim + (int64_t)g * G * hd;
                /* TurboQuant pages: the rotated-domain kernel (attn_turbo.h) */
                if (!kiln_attention_turbo_group(o, q_dim, qi, q_dim, G, nt, begin, end, &kv,
                                                p->score_div, p->softcap, scratch))
                    kiln_attention_group(o, q_dim, qi, q_dim, G, nt, begin, end, &kv,
                                         p->score_div, p->softcap, scratch);
            }
        }
    }
}

/* Only the blocks each sequence's keys need get pointers: with a window W, from the block of
 * the first key of the step's first token (n_past - W + 1) on; the entries before it stay NULL
 * (in a sliding group's table they may be holes, blocks given back to the pool), and no kernel
 * reads a key outside [begin, end) of its token. A sequence whose blocks are all of one
 * plain format (f32, f16 or bf16 on both sides) is read as plain rows of that operand, exactly
 * as before quantized formats existed; any other sequence (q8_0 / q4_0 on a side, K and V
 * differing, or blocks of several formats after the delayed transition) gets its per-block
 * formats (kiln_attn_kv.k_fmt / v_fmt). */
void kiln_cpu_attention(kiln_backend *be, kiln_kv_pool *pool, const kiln_attn_params *p,
                        const kiln_step *st, const float *q, float *out) {
    cpu_backend *c = cpu_be(be);
    const int32_t bs = kiln_kv_pool_block_size(pool);
    for (int32_t s = 0; s < st->b->n_seqs; s++) {
        const kiln_batch_seq *sq = &st->b->seqs[s];
        const int32_t nb = kiln_kv_blocks_for_tokens(sq->n_past + sq->n_new, bs);
        const int32_t *table = kiln_batch_seq_blocks(sq, kiln_kv_pool_window(pool) > 0);
        const int32_t lo =
            (p->window > 0 && sq->n_past - p->window + 1 > 0 ? sq->n_past - p->window + 1 : 0) / bs;
        const kiln_dtype f0 = kiln_kv_pool_block_format_k(pool, table[lo]);
        bool plain = f0 == KILN_DTYPE_F32 || f0 == KILN_DTYPE_F16 || f0 == KILN_DTYPE_BF16;
        for (int32_t i = 0; i < lo; i++) {
            const int64_t o = c->ptr_off[s] + i;
            c->kb[o] = c->vb[o] = NULL;
            c->kfmt[o] = c->vfmt[o] = (uint8_t)f0;
        }
        for (int32_t i = lo; i < nb; i++) {
            const int32_t blk = table[i];
            const int64_t o = c->ptr_off[s] + i;
            c->kb[o] = kiln_kv_pool_k(pool, p->layer, blk);
            c->vb[o] = kiln_kv_pool_v(pool, p->layer, blk);
            c->kfmt[o] = (uint8_t)kiln_kv_pool_block_format_k(pool, blk);
            c->vfmt[o] = (uint8_t)kiln_kv_pool_block_format_v(pool, blk);
            plain = plain && c->kfmt[o] == f0 && c->vfmt[o] == f0;
        }
        c->seq_operand[s] = plain ? (int)kiln_kv_format_of(f0)->operand : -1;
    }
    attn_job job = {c, p, st, q, out, bs};
    kiln_threadpool_run(c->tp, attn_worker, &job);
}
