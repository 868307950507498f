/*
 * scheduler.c - one engine step (DESIGN.md "One request, end to end", steps 2 to 6):
 * cancellations, admission, planning a token budget, one forward over the flat batch,
 * each sequence's method consuming its logits, and commit.
 *
 * Admission policy (DESIGN.md "Block lifecycle"). Requests are admitted in FIFO order. A
 * sequence holds blocks only for what it has computed plus the current step (grow as you
 * go, as vLLM does), so admission does not reserve the request's lifetime. It first shares
 * the longest run of the prompt's full blocks the prefix cache holds (prefix.c; a RAM miss
 * may first send the request to LOADING while the disk tier reads its blocks), then admits
 * when the free plus evictable blocks cover the rest of the prompt, the blocks the decoding
 * sequences need this step, and a watermark of 1% of the pool. Admission stops at the first
 * request that does not fit (strict FIFO: a large request is not starved by small ones behind
 * it). A request that could never fit (prompt + max_tokens - 1 positions beyond the engine's
 * n_ctx, or more blocks than the whole pool) finishes at once with context_over_budget.
 *
 * Preemption (vLLM's recompute policy). When the decoding sequences need more new blocks
 * than the pool can give, the most recently admitted running sequence is preempted: its
 * blocks are released (its full blocks stay indexed, as evictable blocks at the LRU's most
 * recent end) and it goes back to the front of the waiting FIFO with its generated tokens.
 * Re-admission then shares those blocks again and recomputes only the partial last block;
 * batch invariance makes the resumed output bitwise the uninterrupted one. Prefill chunks
 * never preempt: they shrink to the blocks available, or wait.
 *
 * Planning. Decoding sequences (one known token not yet computed) go first, one token each
 * (rotating who goes first when they outnumber the budget); prefilling sequences then take
 * chunks of at most prefill_chunk tokens, in admission order, from what is left of
 * step_tokens. With recurrent layers and the prefix cache on, a prefill chunk that crosses a
 * block boundary ends on the last one it crosses, so its state can be checkpointed there.
 * Sequences join and leave only here, between forwards.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/spec.h"
#include "util/error.h"

void kiln_engine_drain_incoming(kiln_engine *e) {
    pthread_mutex_lock(&e->mu);
    kiln_seq *h = e->in_head, *t = e->in_tail;
    e->in_head = e->in_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    if (!h) return;
    if (e->wait_tail)
        e->wait_tail->next = h;
    else
        e->wait_head = h;
    e->wait_tail = t;
}

/* Drop waiting requests that were cancelled before admission. */
static void sweep_waiting_cancelled(kiln_engine *e) {
    kiln_seq *prev = NULL;
    for (kiln_seq *s = e->wait_head, *next; s; s = next) {
        next = s->next;
        if (!atomic_load(&s->stream->cancel)) {
            prev = s;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            e->wait_head = next;
        if (e->wait_tail == s) e->wait_tail = prev;
        atomic_fetch_sub(&e->n_queued, 1);
        kiln_seq_finish(s, KILN_FINISH_CANCELLED, KILN_OK, NULL);
        kiln_seq_release(e, s);
    }
}

static kiln_seq *pop_waiting(kiln_engine *e) {
    kiln_seq *s = e->wait_head;
    e->wait_head = s->next;
    if (!e->wait_head) e->wait_tail = NULL;
    s->next = NULL;
    atomic_fetch_sub(&e->n_queued, 1);
    return s;
}

static void reject(kiln_engine *e, kiln_seq *s, kiln_status status, const char *msg) {
    kiln_seq_finish(s, KILN_FINISH_ERROR, status, msg);
    kiln_seq_release(e, s);
}

/* Put s back at the head of the waiting FIFO (counted as queued again when count). */
static void push_front_waiting(kiln_engine *e, kiln_seq *s, bool count) {
    s->state = KILN_SEQ_QUEUED;
    s->next = e->wait_head;
    e->wait_head = s;
    if (!e->wait_tail) e->wait_tail = s;
    if (count) atomic_fetch_add(&e->n_queued, 1);
}

static bool decoding(const kiln_seq *s) {
    return (int32_t)s->tokens.n - s->n_computed == 1;
}

/* New blocks the decoding sequences need for this step's token. */
static int32_t decode_demand(const kiln_engine *e) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        const kiln_seq *s = e->running[i];
        if (s->finish == KILN_FINISH_NONE && decoding(s) &&
            s->bt.n_blocks < kiln_kv_blocks_for_tokens(s->n_computed + 1, e->p.block_size))
            n++;
    }
    return n;
}

/* Blocks the prefilling sequences still need to reach their last known token: admission
 * keeps them available, so admitted prefills can always complete (else several half-done
 * prefills could hold the whole pool and wait on each other). */
static int32_t prefill_demand(const kiln_engine *e) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        const kiln_seq *s = e->running[i];
        if (s->finish != KILN_FINISH_NONE || decoding(s)) continue;
        int32_t want = kiln_kv_blocks_for_tokens((int32_t)s->tokens.n, e->p.block_size);
        if (want > s->bt.n_blocks) n += want - s->bt.n_blocks;
    }
    return n;
}

static int32_t watermark(const kiln_engine *e) {
    int32_t w = kiln_kv_pool_n_blocks(e->pool) / 100;
    return w < 1 ? 1 : w;
}

static void admit(kiln_engine *e) {
    int32_t bs = e->p.block_size;
    int32_t total = kiln_kv_pool_n_blocks(e->pool);
    while (e->wait_head && e->n_running < e->p.max_seqs) {
        kiln_seq *s = e->wait_head;
        char msg[512];
        /* Positions the sequence can ever occupy: the prompt and every generated token but
         * the last, which is never fed back. */
        int64_t need_pos = (int64_t)s->n_prompt + s->req->max_tokens - 1;
        if (need_pos > e->p.n_ctx) {
            snprintf(msg, sizeof msg,
                     "context_over_budget: the prompt has %d tokens and max_tokens is %d, "
                     "which needs %lld positions (prompt + max_tokens - 1), but the context "
                     "holds %d; shorten the prompt or lower max_tokens",
                     s->n_prompt, s->req->max_tokens, (long long)need_pos, e->p.n_ctx);
            reject(e, pop_waiting(e), KILN_ERR_CONTEXT_OVER_BUDGET, msg);
            continue;
        }
        int32_t lifetime = kiln_kv_blocks_for_tokens((int32_t)need_pos, bs);
        if (lifetime > total) {
            snprintf(msg, sizeof msg,
                     "context_over_budget: the prompt has %d tokens and max_tokens is %d, which "
                     "needs %d KV blocks of %d positions, but the whole KV pool has %d; lower "
                     "max_tokens or give the engine more KV memory",
                     s->n_prompt, s->req->max_tokens, lifetime, bs, total);
            reject(e, pop_waiting(e), KILN_ERR_CONTEXT_OVER_BUDGET, msg);
            continue;
        }
        /* prompt logprobs need every prompt position's logits row: no cache hits */
        const bool no_hits = s->req->prompt_logprobs;
        int32_t hit = no_hits ? 0 : kiln_engine_prefix_lookup(e, s, e->hit_blocks);
        if (e->disk && !s->disk_tried && !no_hits) {
            s->disk_tried = true;
            if (kiln_engine_prefix_start_load(e, s, hit)) {
                pop_waiting(e);
                atomic_fetch_add(&e->n_queued, 1); /* still waiting for admission */
                s->state = KILN_SEQ_LOADING;
                s->next = e->load_head;
                e->load_head = s;
                continue;
            }
        }
        /* Blocks to compute the rest of the known tokens; the hit blocks that sit idle in the
         * LRU are counted as available by the pool, but sharing them takes them out. */
        int32_t need = kiln_kv_blocks_for_tokens((int32_t)s->tokens.n, bs) - hit;
        int32_t avail = kiln_kv_pool_n_available(e->pool);
        for (int32_t i = 0; i < hit; i++)
            avail -= kiln_kv_pool_refcount(e->pool, e->hit_blocks[i]) == 0;
        int32_t margin = e->n_running > 0 ? watermark(e) + decode_demand(e) + prefill_demand(e) : 0;
        if (need + margin > avail) {
            if (e->n_running > 0) break; /* wait for blocks (FIFO) */
            /* Nothing runs, yet the pool lacks blocks: they leaked. Fail the request rather
             * than wait forever. */
            snprintf(msg, sizeof msg,
                     "internal error: the KV pool has %d free or evictable blocks of %d with no "
                     "sequence running; %d are needed",
                     avail, total, need);
            reject(e, pop_waiting(e), KILN_ERR_INTERNAL, msg);
            continue;
        }
        kiln_error err = {0};
        kiln_status st = s->rec_state ? KILN_OK : kiln_seq_start(e, s, &err);
        pop_waiting(e);
        if (st) {
            kiln_error_prefix(&err, "admission: ");
            reject(e, s, st, err.message);
            continue;
        }
        if (!kiln_engine_prefix_share(e, s, e->hit_blocks, hit)) hit = 0;
        int32_t hit_tokens = hit * bs;
        atomic_fetch_add(hit > 0 ? &e->st_hit_req : &e->st_miss_req, 1);
        atomic_fetch_add(&e->st_hit_tok, hit_tokens);
        atomic_fetch_add(&e->st_miss_tok, (int64_t)s->tokens.n - hit_tokens);
        if (!s->admitted_once) s->n_cached = hit_tokens;
        s->admitted_once = true;
        s->disk_tried = false;
        s->state = KILN_SEQ_RUNNING;
        e->running[e->n_running++] = s;
        atomic_store(&e->st_running, e->n_running);
    }
}

/* Requeue running[idx] at the head of the waiting FIFO, releasing its blocks. */
static void preempt(kiln_engine *e, int32_t idx) {
    kiln_seq *s = e->running[idx];
    memmove(e->running + idx, e->running + idx + 1,
            (size_t)(e->n_running - idx - 1) * sizeof *e->running);
    e->n_running--;
    atomic_store(&e->st_running, e->n_running);
    kiln_block_table_release(&s->bt, e->pool);
    kiln_engine_window_release(e, s);
    s->n_computed = 0;
    s->n_registered = 0;
    push_front_waiting(e, s, true);
    atomic_fetch_add(&e->st_preempt, 1);
}

/* Preempt the most recently admitted unfinished sequence; false when there is none. */
static bool preempt_newest(kiln_engine *e) {
    int32_t victim = e->n_running - 1;
    while (victim >= 0 && e->running[victim]->finish != KILN_FINISH_NONE) victim--;
    if (victim < 0) return false;
    preempt(e, victim);
    return true;
}

/* Preempt the most recently admitted sequences until the decoding ones get their blocks. */
static void preempt_for_decode(kiln_engine *e) {
    while (e->n_running > 0 && decode_demand(e) > kiln_kv_pool_n_available(e->pool))
        if (!preempt_newest(e)) return;
}

/* Finish a LOADING sequence (already unlinked) as cancelled: its read is dropped. */
static void cancel_loading_seq(kiln_engine *e, kiln_seq *s) {
    kiln_engine_prefix_cancel_load(e, s);
    atomic_fetch_sub(&e->n_queued, 1); /* loading counts as queued */
    kiln_seq_finish(s, KILN_FINISH_CANCELLED, KILN_OK, NULL);
    kiln_seq_release(e, s);
}

/* LOADING sequences whose disk read finished go back to the head of the FIFO (their blocks
 * now sit in the RAM cache); cancelled ones finish. */
static void poll_loading(kiln_engine *e) {
    for (kiln_seq **pp = &e->load_head; *pp;) {
        kiln_seq *s = *pp;
        bool cancel = atomic_load(&s->stream->cancel);
        if (!cancel && !kiln_engine_prefix_load_done(s)) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        s->next = NULL;
        if (cancel) {
            cancel_loading_seq(e, s);
        } else {
            kiln_engine_prefix_finish_load(e, s);
            push_front_waiting(e, s, false);
        }
    }
}

bool kiln_engine_any_load_done(const kiln_engine *e) {
    for (const kiln_seq *s = e->load_head; s; s = s->next)
        if (kiln_engine_prefix_load_done(s) || atomic_load(&s->stream->cancel)) return true;
    return false;
}

void kiln_engine_cancel_loading(kiln_engine *e) {
    while (e->load_head) {
        kiln_seq *s = e->load_head;
        e->load_head = s->next;
        s->next = NULL;
        cancel_loading_seq(e, s);
    }
}

/* Release finished running sequences, keeping admission order. The counters are updated
 * before the FINISH events go out, so a consumer that saw FINISH sees consistent stats. */
static void reap(kiln_engine *e) {
    int32_t alive = 0;
    for (int32_t i = 0; i < e->n_running; i++) alive += e->running[i]->finish == KILN_FINISH_NONE;
    atomic_store(&e->st_running, alive);
    int32_t k = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        kiln_seq *s = e->running[i];
        if (s->finish == KILN_FINISH_NONE)
            e->running[k++] = s;
        else
            kiln_seq_release(e, s);
    }
    e->n_running = k;
}

typedef struct plan_state {
    int32_t n_tokens, n_seqs, n_out, budget;
} plan_state;

static void plan_seq(kiln_engine *e, kiln_seq *s, plan_state *ps) {
    int32_t n_logits = 0;
    int32_t n = s->method->plan(e, s, ps->budget, &n_logits);
    s->n_new = 0;
    if (n <= 0) return;
    if (n_logits < 0) n_logits = 0;
    if (n_logits > n) n_logits = n;
    /* Blocks for this step: grow the table; a chunk that cannot get them all shrinks to the
     * blocks the pool can give (dropping the logits rows of the tokens cut off). */
    const int32_t bs = e->p.block_size;
    const bool align = kiln_engine_prefix_align_chunks(e);
    int32_t cap = n;
    for (int pass = 0; pass < 2; pass++) {
        if (align && cap > 1) {
            int32_t end = s->n_computed + cap, lb = end / bs * bs;
            if (lb > s->n_computed && lb != end) cap = lb - s->n_computed;
        }
        kiln_error err = {0};
        if (kiln_block_table_reserve(&s->bt, e->pool, s->n_computed + cap, &err) == KILN_OK) break;
        int64_t room =
            ((int64_t)s->bt.n_blocks + kiln_kv_pool_n_available(e->pool)) * bs - s->n_computed;
        cap = room < cap ? (int32_t)room : cap;
        if (cap <= 0 || pass == 1) return;
    }
    {
        kiln_error err = {0};
        if (kiln_engine_window_reserve(e, s, &err) != KILN_OK) {
            /* the sliding pool is short (sequences sharing a prefix can hold more sliding
             * blocks than full ones): not this step; a step that plans nothing preempts */
            kiln_block_table_truncate(&s->bt, e->pool, s->n_computed);
            return;
        }
    }
    /* drafts sit after the known tokens: a cut removes them first */
    int32_t n_known = n - (s->draft ? s->n_draft : 0);
    if (cap < n) {
        n_logits -= n - cap;
        if (n_logits < 0) n_logits = 0;
        n = cap;
    }
    if (n_known > n) n_known = n;
    s->n_draft = n - n_known;
    if (s->spec) {
        kiln_error err = {0};
        if (kiln_spec_begin(e, s, n_known, s->n_draft, &err) != KILN_OK) {
            kiln_seq_finish(s, KILN_FINISH_ERROR, KILN_ERR_INTERNAL, err.message);
            return;
        }
    }
    s->n_new = n;
    s->n_logits = n_logits;
    s->first = ps->n_tokens;
    s->out_row = ps->n_out;
    s->failed_forward = false;
    memcpy(e->b_tokens + ps->n_tokens, s->tokens.data + s->n_computed,
           (size_t)n_known * sizeof(int32_t));
    if (s->n_draft > 0)
        memcpy(e->b_tokens + ps->n_tokens + n_known, s->draft,
               (size_t)s->n_draft * sizeof(int32_t));
    e->b_seqs[ps->n_seqs] = (kiln_batch_seq){.block_table = s->bt.blocks,
                                             .n_past = s->n_computed,
                                             .n_new = n,
                                             .first = ps->n_tokens,
                                             .n_blocks = s->bt.n_blocks,
                                             .rec_state = s->rec_state,
                                             .block_table_swa = s->bt_swa.blocks,
                                             .n_blocks_swa = s->bt_swa.n_blocks};
    e->b_seq_of[ps->n_seqs] = s;
    for (int32_t j = n - n_logits; j < n; j++) e->b_out[ps->n_out++] = ps->n_tokens + j;
    ps->n_tokens += n;
    ps->n_seqs++;
    ps->budget -= n;
}

static kiln_status ensure_logits(kiln_engine *e, int32_t rows, kiln_error *err) {
    if (rows <= e->cap_out) return KILN_OK;
    int32_t cap = e->cap_out ? e->cap_out : 16;
    while (cap < rows) cap *= 2;
    float *nb = realloc(e->logits_buf, (size_t)cap * (size_t)e->n_vocab * sizeof *nb);
    if (!nb) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (logits buffer)");
    e->logits_buf = nb;
    e->cap_out = cap;
    return KILN_OK;
}

/* The batch forward failed: run each sequence alone, so that only the ones that fail on
 * their own finish with an error (batch invariance makes the survivors' logits identical to
 * what the batched forward would have produced). */
static void forward_each(kiln_engine *e, const plan_state *ps) {
    for (int32_t i = 0; i < ps->n_seqs; i++) {
        kiln_seq *s = e->b_seq_of[i];
        kiln_batch_seq one = e->b_seqs[i];
        one.first = 0;
        int32_t out[1 << 10];
        int32_t n_out = s->n_logits <= (int32_t)(sizeof out / sizeof out[0]) ? s->n_logits : 0;
        for (int32_t j = 0; j < n_out; j++) out[j] = s->n_new - n_out + j;
        kiln_batch b = {.n_tokens = s->n_new,
                        .token = e->b_tokens + s->first,
                        .n_seqs = 1,
                        .seqs = &one,
                        .n_out = n_out,
                        .out = out};
        kiln_error err = {0};
        kiln_status st =
            n_out == s->n_logits
                ? KILN_OK
                : kiln_error_set(&err, KILN_ERR_INTERNAL, "too many logits rows (%d)", s->n_logits);
        if (!st)
            st = kiln_runner_step(e->runner, &b, e->logits_buf + (size_t)s->out_row * e->n_vocab,
                                  &err);
        if (st) {
            s->failed_forward = true;
            kiln_seq_finish(s, KILN_FINISH_ERROR, st, err.message);
        }
    }
}

void kiln_engine_step(kiln_engine *e) {
    if (e->debug.on_step) e->debug.on_step(e->debug.user, e, e->step);
    e->step++;

    /* 1. Take new submissions; honour cancellations (a request cancelled before admission
     *    never gets blocks). */
    kiln_engine_drain_incoming(e);
    sweep_waiting_cancelled(e);
    for (int32_t i = 0; i < e->n_running; i++)
        if (atomic_load(&e->running[i]->stream->cancel))
            kiln_seq_finish(e->running[i], KILN_FINISH_CANCELLED, KILN_OK, NULL);
    reap(e);

    /* 2. Admit (after the disk tier's finished reads rejoin the FIFO's head). */
    poll_loading(e);
    admit(e);
    if (e->n_running == 0) return;

    /* 3. Plan: blocks for the decoding sequences (preempting if the pool ran dry), decode
     *    first, then prefill chunks. */
    preempt_for_decode(e);
    if (e->n_running == 0) return;
    kiln_engine_spec_propose(e);
    plan_state ps;
    for (;;) {
        ps = (plan_state){.budget = e->p.step_tokens};
        int32_t n_dec = 0, served = 0;
        for (int32_t i = 0; i < e->n_running; i++) n_dec += decoding(e->running[i]);
        for (int32_t k = 0; k < e->n_running && ps.budget > 0; k++) {
            kiln_seq *s = e->running[(e->decode_rr + k) % e->n_running];
            if (!decoding(s)) continue;
            plan_seq(e, s, &ps);
            served++;
        }
        if (served < n_dec) e->decode_rr = (e->decode_rr + served) % e->n_running;
        for (int32_t i = 0; i < e->n_running && ps.budget > 0; i++) {
            kiln_seq *s = e->running[i];
            if (decoding(s)) continue;
            plan_seq(e, s, &ps);
        }
        /* Nothing could get a block (admission's accounting should prevent it): preempt
         * the newest rather than spin. */
        if (ps.n_tokens > 0 || e->n_running == 0 || !preempt_newest(e)) break;
    }
    if (ps.n_tokens == 0) return;

    /* 4. Forward. A step whose every logits row is a plain greedy decision is decided on
     *    the device when the backend can (only the ids come back: kiln_runner_step_argmax). */
    kiln_error err = {0};
    bool by_ids = ps.n_out > 0 && !e->be->ops->host_memory && e->be->ops->argmax;
    for (int32_t i = 0; i < ps.n_seqs && by_ids; i++)
        if (e->b_seq_of[i]->n_logits > 0 && !kiln_seq_plain_greedy(e->b_seq_of[i])) by_ids = false;
    kiln_status st = ensure_logits(e, ps.n_out, &err);
    if (st == KILN_OK) {
        kiln_batch b = {.n_tokens = ps.n_tokens,
                        .token = e->b_tokens,
                        .n_seqs = ps.n_seqs,
                        .seqs = e->b_seqs,
                        .n_out = ps.n_out,
                        .out = e->b_out};
        st = by_ids ? kiln_runner_step_argmax(e->runner, &b, e->b_ids, &err)
                    : kiln_runner_step(e->runner, &b, e->logits_buf, &err);
        if (st) by_ids = false; /* the fallback below fills logits */
        if (st && e->rec_state_floats == 0) {
            forward_each(e, &ps);
        } else if (st) {
            /* Recurrent state may have advanced for part of the batch and cannot be rolled
             * back: every sequence of the batch fails. */
            for (int32_t i = 0; i < ps.n_seqs; i++) {
                e->b_seq_of[i]->failed_forward = true;
                kiln_seq_finish(e->b_seq_of[i], KILN_FINISH_ERROR, st, err.message);
            }
        }
    } else {
        for (int32_t i = 0; i < ps.n_seqs; i++) {
            e->b_seq_of[i]->failed_forward = true;
            kiln_seq_finish(e->b_seq_of[i], KILN_FINISH_ERROR, st, err.message);
        }
    }
    atomic_fetch_add(&e->st_steps, 1);

    /* 5. Consume and commit. */
    int64_t n_pre = 0, n_dec_tok = 0;
    for (int32_t i = 0; i < ps.n_seqs; i++) {
        kiln_seq *s = e->b_seq_of[i];
        int32_t pre = s->n_prompt - s->n_computed;
        if (pre < 0) pre = 0;
        if (pre > s->n_new) pre = s->n_new;
        n_pre += pre;
        n_dec_tok += s->n_new - pre;
        if (s->failed_forward || s->finish != KILN_FINISH_NONE) continue;
        int32_t n_keep = s->n_new;
        if (s->n_logits == 0 && s->spec) {
            /* no row to decide on: the transaction keeps the known tokens (it has no drafts) */
            kiln_error cerr = {0};
            if (kiln_spec_resolve(e, s, 0, &n_keep, &cerr) != KILN_OK) {
                kiln_seq_finish(s, KILN_FINISH_ERROR, KILN_ERR_INTERNAL, cerr.message);
                continue;
            }
        } else if (s->n_logits > 0) {
            kiln_error cerr = {0};
            kiln_status cst =
                by_ids ? kiln_seq_consume_argmax(e, s, e->b_ids[s->out_row], &n_keep, &cerr)
                       : s->method->consume(e, s, e->logits_buf + (size_t)s->out_row * e->n_vocab,
                                            s->n_logits, &n_keep, &cerr);
            if (cst) {
                kiln_seq_finish(s, KILN_FINISH_ERROR, cst, cerr.message);
                continue;
            }
            if (n_keep < 0) n_keep = 0;
            if (n_keep > s->n_new) n_keep = s->n_new;
        }
        s->n_computed += n_keep;
        if (n_keep < s->n_new) {
            /* Rollback of rejected positions: blocks past n_computed go back to the pool;
             * rows of the kept partial block are simply overwritten later. */
            kiln_block_table_truncate(&s->bt, e->pool, s->n_computed);
            kiln_engine_window_truncate(e, s);
            kiln_engine_prefix_rollback(e, s);
        }
        kiln_engine_prefix_commit(e, s);
        kiln_engine_window_commit(e, s);
        kiln_engine_kv_transition(e, s);
        if (s->fork_kids) kiln_engine_fork_kids(e, s, false);
    }
    atomic_fetch_add(&e->st_prefill, n_pre);
    atomic_fetch_add(&e->st_decode, n_dec_tok);

    /* 6. Finish: release blocks, then send FINISH. */
    reap(e);
}
