/*
 * scheduler.c - one engine step (DESIGN.md "One request, end to end", steps 2 to 6):
 * cancellations, admission, planning a token budget, one forward over the flat batch,
 * each sequence's method consuming its logits, and commit.
 *
 * Admission policy. A request is admitted in FIFO order when the pool has free blocks for
 * its whole lifetime: prompt + max_tokens - 1 positions (the last sampled token is never fed
 * back). Reserving everything up front means a running sequence can never run out of KV, so
 * no preemption is needed, at the price of idle reserved blocks while it generates; vLLM
 * instead reserves block by block and preempts (recompute or swap) when the pool runs dry,
 * which is the planned improvement. Admission stops at the first request that does not fit
 * (strict FIFO: a large request is not starved by small ones behind it). A request that could
 * never fit (prompt + max_tokens - 1 positions beyond the engine's n_ctx, or more blocks than the
 * whole pool) finishes at once with context_over_budget.
 *
 * Planning. Decoding sequences go first, one token each (rotating who goes first when they
 * outnumber the budget); prefilling sequences then take chunks of at most prefill_chunk
 * tokens, in admission order, from what is left of step_tokens. Sequences join and leave
 * only here, between forwards.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
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
        int32_t kv_tokens = (int32_t)need_pos;
        int32_t need = kiln_kv_blocks_for_tokens(kv_tokens, bs);
        if (need > total) {
            snprintf(msg, sizeof msg,
                     "context_over_budget: the prompt has %d tokens and max_tokens is %d, which "
                     "needs %d KV blocks of %d positions, but the whole KV pool has %d; lower "
                     "max_tokens or give the engine more KV memory",
                     s->n_prompt, s->req->max_tokens, need, bs, total);
            reject(e, pop_waiting(e), KILN_ERR_CONTEXT_OVER_BUDGET, msg);
            continue;
        }
        if (need > kiln_kv_pool_n_free(e->pool)) {
            if (e->n_running > 0) break; /* wait for blocks (FIFO) */
            /* Nothing runs, yet the pool lacks blocks: they leaked. Fail the request rather
             * than wait forever. */
            snprintf(msg, sizeof msg,
                     "internal error: the KV pool has %d free blocks of %d with no sequence "
                     "running; %d are needed",
                     kiln_kv_pool_n_free(e->pool), total, need);
            reject(e, pop_waiting(e), KILN_ERR_INTERNAL, msg);
            continue;
        }
        kiln_error err = {0};
        kiln_status st = kiln_block_table_reserve(&s->bt, e->pool, kv_tokens, &err);
        if (st == KILN_OK) st = kiln_seq_start(e, s, &err);
        pop_waiting(e);
        if (st) {
            kiln_error_prefix(&err, "admission: ");
            reject(e, s, st, err.message);
            continue;
        }
        s->n_reserved = kv_tokens;
        s->state = KILN_SEQ_RUNNING;
        e->running[e->n_running++] = s;
        atomic_store(&e->st_running, e->n_running);
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
    s->n_new = n;
    s->n_logits = n_logits;
    s->first = ps->n_tokens;
    s->out_row = ps->n_out;
    s->failed_forward = false;
    memcpy(e->b_tokens + ps->n_tokens, s->tokens.data + s->n_computed, (size_t)n * sizeof(int32_t));
    e->b_seqs[ps->n_seqs] = (kiln_batch_seq){.block_table = s->bt.blocks,
                                             .n_past = s->n_computed,
                                             .n_new = n,
                                             .first = ps->n_tokens,
                                             .n_blocks = s->bt.n_blocks,
                                             .rec_state = s->rec_state};
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

    /* 2. Admit. */
    admit(e);
    if (e->n_running == 0) return;

    /* 3. Plan: decode first, then prefill chunks. */
    plan_state ps = {.budget = e->p.step_tokens};
    int32_t n_dec = 0, served = 0;
    for (int32_t i = 0; i < e->n_running; i++)
        if (e->running[i]->n_computed >= e->running[i]->n_prompt) n_dec++;
    for (int32_t k = 0; k < e->n_running && ps.budget > 0; k++) {
        kiln_seq *s = e->running[(e->decode_rr + k) % e->n_running];
        if (s->n_computed < s->n_prompt) continue;
        plan_seq(e, s, &ps);
        served++;
    }
    if (served < n_dec) e->decode_rr = (e->decode_rr + served) % e->n_running;
    for (int32_t i = 0; i < e->n_running && ps.budget > 0; i++) {
        kiln_seq *s = e->running[i];
        if (s->n_computed >= s->n_prompt) continue;
        plan_seq(e, s, &ps);
    }
    if (ps.n_tokens == 0) return;

    /* 4. Forward. */
    kiln_error err = {0};
    kiln_status st = ensure_logits(e, ps.n_out, &err);
    if (st == KILN_OK) {
        kiln_batch b = {.n_tokens = ps.n_tokens,
                        .token = e->b_tokens,
                        .n_seqs = ps.n_seqs,
                        .seqs = e->b_seqs,
                        .n_out = ps.n_out,
                        .out = e->b_out};
        st = kiln_runner_step(e->runner, &b, e->logits_buf, &err);
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
        if (s->n_logits > 0) {
            kiln_error cerr = {0};
            kiln_status cst = s->method->consume(
                e, s, e->logits_buf + (size_t)s->out_row * e->n_vocab, s->n_logits, &n_keep, &cerr);
            if (cst) {
                kiln_seq_finish(s, KILN_FINISH_ERROR, cst, cerr.message);
                continue;
            }
            if (n_keep < 0) n_keep = 0;
            if (n_keep > s->n_new) n_keep = s->n_new;
        }
        s->n_computed += n_keep;
        if (n_keep < s->n_new) {
            /* Rollback of rejected positions: their KV rows are simply overwritten later.
             * Blocks beyond the admission reservation (none with the sample method) go back
             * to the pool. */
            int32_t keep_tokens = s->n_computed > s->n_reserved ? s->n_computed : s->n_reserved;
            kiln_block_table_truncate(&s->bt, e->pool, keep_tokens);
        }
    }
    atomic_fetch_add(&e->st_prefill, n_pre);
    atomic_fetch_add(&e->st_decode, n_dec_tok);

    /* 6. Finish: release blocks, then send FINISH. */
    reap(e);
}
