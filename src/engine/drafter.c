/* drafter.c - greedy drafts of a draft model for many sequences at once (drafter.h). */
#include "engine/drafter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/runner.h"
#include "engine/sampler.h"
#include "kv/kv_pool.h"
#include "util/error.h"

#define DEFAULT_STEP_TOKENS 512
#define DEFAULT_MAX_SLOTS   256
#define DEFAULT_N_CTX       4096

typedef struct drafter_slot {
    bool open;
    kiln_block_table bt; /* covers at least n_hist positions */
    int32_t *hist;       /* [cap] tokens whose KV positions 0 .. n_hist-1 hold */
    int32_t n_hist, cap;
} drafter_slot;

/* One request's progress through a propose call. */
typedef struct drafter_work {
    int32_t next;  /* next history position to feed */
    int32_t end;   /* history positions to feed: [next, end) of tokens */
    int32_t k_eff; /* drafts this call gives */
    bool busy;     /* still feeding */
} drafter_work;

struct kiln_drafter {
    const kiln_model *m;
    int32_t n_vocab, n_ctx, step_tokens, max_slots, block_size;
    kiln_backend *be;
    kiln_kv_pool *pool;
    kiln_runner *runner;
    drafter_slot *slots;    /* [max_slots] */
    drafter_work *work;     /* [max_slots]: per request of the current call */
    int32_t *b_tokens;      /* [step_tokens] */
    int32_t *b_out;         /* [step_tokens] */
    kiln_batch_seq *b_seqs; /* [max_slots] */
    int32_t *b_req;         /* [max_slots] the request of each batch sequence */
    float *logits;          /* [logit_rows, n_vocab] */
    int32_t logit_rows;
    kiln_drafter_stats stats;
};

kiln_status kiln_drafter_create(const kiln_model *draft, const kiln_model *target,
                                const kiln_drafter_params *p, kiln_drafter **out, kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "drafter: out is NULL");
    *out = NULL;
    if (!draft || !target || !p)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "drafter: %s is NULL",
                              !draft    ? "the draft model"
                              : !target ? "the target model"
                                        : "params");
#define CHECK_RANGE(field, lo, hi)                                                                 \
    if (p->field < (lo) || p->field > (hi))                                                        \
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,                                      \
                              "drafter: " #field " must be in [%lld, %lld] (got %lld)",            \
                              (long long)(lo), (long long)(hi), (long long)p->field);
    CHECK_RANGE(n_threads, 0, 512)
    CHECK_RANGE(kv_tokens, 1, INT64_MAX)
    CHECK_RANGE(step_tokens, 0, 1 << 20)
    CHECK_RANGE(n_ctx, 0, 1 << 24)
    CHECK_RANGE(max_slots, 0, 1 << 16)
#undef CHECK_RANGE
    char why[512];
    if (!kiln_model_vocab_compatible(target, draft, why, sizeof why))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "the draft model cannot draft for the target: %s", why);
    if (kiln_model_seq_state_floats(draft) > 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "the draft model has recurrent layers, which a drafter cannot roll "
                              "back");

    kiln_drafter *d = calloc(1, sizeof *d);
    if (!d) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "drafter: out of memory");
    const kiln_model_config *c = &draft->cfg;
    d->m = draft;
    d->n_vocab = c->n_vocab;
    d->step_tokens = p->step_tokens ? p->step_tokens : DEFAULT_STEP_TOKENS;
    d->max_slots = p->max_slots ? p->max_slots : DEFAULT_MAX_SLOTS;
    d->n_ctx = p->n_ctx ? p->n_ctx : c->n_ctx_train > 0 ? c->n_ctx_train : DEFAULT_N_CTX;
    if (c->learned_pos && c->n_ctx_train > 0 && d->n_ctx > c->n_ctx_train)
        d->n_ctx = c->n_ctx_train;
    d->block_size = KILN_KV_DEFAULT_BLOCK_SIZE;
    int64_t blocks = (p->kv_tokens + d->block_size - 1) / d->block_size;
    if (blocks > INT32_MAX) blocks = INT32_MAX;

    kiln_status st;
    const kiln_backend_params bp = {.kind = KILN_BACKEND_CPU,
                                    .n_threads = p->n_threads ? p->n_threads : 1};
    if ((st = kiln_backend_create(&bp, &d->be, err))) goto fail;
    const kiln_kv_pool_params pp = {
        .n_layer = c->n_layer,
        .kv_dim = (int64_t)c->n_head_kv * c->head_dim,
        .block_size = d->block_size,
        .n_blocks = (int32_t)blocks,
        .dtype = KILN_DTYPE_F32,
        .backend = d->be,
    };
    if ((st = kiln_kv_pool_create(&pp, &d->pool, err))) goto fail;
    if ((st = kiln_runner_create(draft, d->be, d->pool, d->step_tokens, d->n_ctx, &d->runner, err)))
        goto fail;
    d->slots = calloc((size_t)d->max_slots, sizeof *d->slots);
    d->work = calloc((size_t)d->max_slots, sizeof *d->work);
    d->b_tokens = malloc((size_t)d->step_tokens * sizeof *d->b_tokens);
    d->b_out = malloc((size_t)d->step_tokens * sizeof *d->b_out);
    d->b_seqs = calloc((size_t)d->max_slots, sizeof *d->b_seqs);
    d->b_req = malloc((size_t)d->max_slots * sizeof *d->b_req);
    if (!d->slots || !d->work || !d->b_tokens || !d->b_out || !d->b_seqs || !d->b_req) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "drafter: out of memory (buffers)");
        goto fail;
    }
    *out = d;
    return KILN_OK;
fail:
    kiln_drafter_destroy(d);
    return st;
}

void kiln_drafter_destroy(kiln_drafter *d) {
    if (!d) return;
    if (d->slots)
        for (int32_t i = 0; i < d->max_slots; i++) {
            kiln_block_table_release(&d->slots[i].bt, d->pool);
            free(d->slots[i].hist);
        }
    kiln_runner_destroy(d->runner);
    kiln_kv_pool_destroy(d->pool);
    kiln_backend_destroy(d->be);
    free(d->slots);
    free(d->work);
    free(d->b_tokens);
    free(d->b_out);
    free(d->b_seqs);
    free(d->b_req);
    free(d->logits);
    free(d);
}

kiln_status kiln_drafter_open(kiln_drafter *d, int32_t *slot, kiln_error *err) {
    if (!d || !slot)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "drafter open: %s is NULL",
                              !d ? "the drafter" : "slot");
    for (int32_t i = 0; i < d->max_slots; i++)
        if (!d->slots[i].open) {
            d->slots[i].open = true;
            d->slots[i].n_hist = 0;
            *slot = i;
            return KILN_OK;
        }
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "drafter open: all %d slots are open",
                          d->max_slots);
}

void kiln_drafter_close(kiln_drafter *d, int32_t slot) {
    if (!d || slot < 0 || slot >= d->max_slots || !d->slots[slot].open) return;
    drafter_slot *s = &d->slots[slot];
    kiln_block_table_truncate(&s->bt, d->pool, 0); /* the buffers are kept for the next open */
    s->n_hist = 0;
    s->open = false;
}

/* Check every request before anything changes (DESIGN.md principle 4). */
static kiln_status validate(const kiln_drafter *d, const kiln_draft_req *reqs, int32_t n,
                            kiln_error *err) {
    if (n < 0 || (n > 0 && !reqs))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "drafter propose: %s",
                              n < 0 ? "n < 0" : "reqs is NULL");
    if (n > d->max_slots)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "drafter propose: %d requests, more than the %d slots", n,
                              d->max_slots);
    for (int32_t i = 0; i < n; i++) {
        const kiln_draft_req *r = &reqs[i];
        if (r->slot < 0 || r->slot >= d->max_slots || !d->slots[r->slot].open)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "drafter propose: request %d: slot %d is not open", i, r->slot);
        for (int32_t j = 0; j < i; j++)
            if (reqs[j].slot == r->slot)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "drafter propose: requests %d and %d name the same slot %d",
                                      j, i, r->slot);
        if (r->n_tokens < 1 || !r->tokens)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "drafter propose: request %d: %s",
                                  i, !r->tokens ? "tokens is NULL" : "n_tokens must be >= 1");
        if (r->k < 0 || (r->k > 0 && !r->out))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "drafter propose: request %d: %s",
                                  i, r->k < 0 ? "k must be >= 0" : "out is NULL");
        for (int32_t t = 0; t < r->n_tokens; t++)
            if (r->tokens[t] < 0 || r->tokens[t] >= d->n_vocab)
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "drafter propose: request %d: token id %d at index %d is "
                                      "outside [0, %d)",
                                      i, r->tokens[t], t, d->n_vocab);
    }
    return KILN_OK;
}

static kiln_status grow_hist(drafter_slot *s, int32_t need, kiln_error *err) {
    if (need <= s->cap) return KILN_OK;
    int32_t cap = s->cap < 64 ? 64 : s->cap;
    while (cap < need) cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
    int32_t *h = realloc(s->hist, (size_t)cap * sizeof *h);
    if (!h)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "drafter: out of memory for a slot's %d tokens", cap);
    s->hist = h;
    s->cap = cap;
    return KILN_OK;
}

/* Roll request r's slot back to the common prefix of its tokens and r's history (at most
 * n_tokens - 1 of them: the pending token is always fed, for its logits). */
static void roll_back(kiln_drafter *d, const kiln_draft_req *r, drafter_work *w) {
    drafter_slot *s = &d->slots[r->slot];
    int32_t keep = 0;
    const int32_t lim = s->n_hist < r->n_tokens - 1 ? s->n_hist : r->n_tokens - 1;
    while (keep < lim && s->hist[keep] == r->tokens[keep]) keep++;
    d->stats.rolled_back += s->n_hist - keep;
    s->n_hist = keep;
    kiln_block_table_truncate(&s->bt, d->pool, keep);
    *w = (drafter_work){.next = keep, .end = keep};
}

/* Size what request r feeds this call (the n_ctx and pool limits) and take its blocks. */
static kiln_status plan(kiln_drafter *d, const kiln_draft_req *r, drafter_work *w,
                        kiln_error *err) {
    drafter_slot *s = &d->slots[r->slot];
    if (r->n_tokens > d->n_ctx) { /* the history itself does not fit */
        if (r->k > 0) d->stats.short_ctx++;
        return KILN_OK;
    }
    int32_t k = r->k;
    if (k > d->n_ctx - r->n_tokens) {
        k = d->n_ctx - r->n_tokens;
        d->stats.short_ctx++;
    }
    /* positions written: the history, then every draft but the last */
    const int64_t avail =
        (int64_t)(s->bt.n_blocks + kiln_kv_pool_n_available(d->pool)) * d->block_size;
    if (avail < r->n_tokens) { /* not even the history fits */
        if (r->k > 0) d->stats.short_pool++;
        return KILN_OK;
    }
    if ((int64_t)r->n_tokens + k - 1 > avail) {
        k = (int32_t)(avail - r->n_tokens + 1);
        d->stats.short_pool++;
    }
    const int32_t positions = r->n_tokens + (k > 0 ? k - 1 : 0);
    kiln_status st = grow_hist(s, positions, err);
    if (st == KILN_OK) st = kiln_block_table_reserve(&s->bt, d->pool, positions, err);
    if (st) return st;
    w->end = r->n_tokens;
    w->k_eff = k;
    w->busy = true;
    return KILN_OK;
}

static kiln_status ensure_logits(kiln_drafter *d, int32_t rows, kiln_error *err) {
    if (rows <= d->logit_rows) return KILN_OK;
    float *l = realloc(d->logits, (size_t)rows * (size_t)d->n_vocab * sizeof *l);
    if (!l)
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                              "drafter: out of memory for %d rows of logits", rows);
    d->logits = l;
    d->logit_rows = rows;
    return KILN_OK;
}

/* Add w's next tokens (n of them) to the batch being built. */
static void add_seq(kiln_drafter *d, kiln_batch *b, int32_t *n_tok, int32_t *n_out,
                    const kiln_draft_req *r, drafter_work *w, int32_t req, int32_t n) {
    drafter_slot *s = &d->slots[r->slot];
    kiln_batch_seq *q = &d->b_seqs[b->n_seqs];
    const bool drafting = w->next >= w->end;
    *q = (kiln_batch_seq){.block_table = s->bt.blocks,
                          .n_past = s->n_hist,
                          .n_new = n,
                          .first = *n_tok,
                          .n_blocks = s->bt.n_blocks};
    if (drafting)
        d->b_tokens[(*n_tok)++] = r->out[r->n_out - 1];
    else
        for (int32_t j = 0; j < n; j++) d->b_tokens[(*n_tok)++] = r->tokens[w->next + j];
    /* logits when this is the history's last token or a draft, and a draft is still due */
    if ((drafting || w->next + n == w->end) && r->n_out < w->k_eff)
        d->b_out[(*n_out)++] = *n_tok - 1;
    d->b_req[b->n_seqs++] = req;
}

kiln_status kiln_drafter_propose(kiln_drafter *d, kiln_draft_req *reqs, int32_t n,
                                 kiln_error *err) {
    if (!d) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "drafter propose: d is NULL");
    kiln_status st = validate(d, reqs, n, err);
    if (st) return st;
    for (int32_t i = 0; i < n; i++) reqs[i].n_out = 0;
    if ((st = ensure_logits(d, n < d->step_tokens ? n : d->step_tokens, err))) return st;
    /* every rollback first, so blocks they free serve any request; then blocks in order */
    for (int32_t i = 0; i < n; i++) roll_back(d, &reqs[i], &d->work[i]);
    for (int32_t i = 0; i < n && st == KILN_OK; i++) st = plan(d, &reqs[i], &d->work[i], err);
    for (;;) {
        if (st) break;
        kiln_batch b = {.token = d->b_tokens, .seqs = d->b_seqs, .out = d->b_out};
        int32_t n_tok = 0, n_out = 0;
        /* draft steps first, one token each; then catch-up chunks with what is left */
        for (int32_t i = 0; i < n && n_tok < d->step_tokens; i++) {
            drafter_work *w = &d->work[i];
            if (w->busy && w->next >= w->end) add_seq(d, &b, &n_tok, &n_out, &reqs[i], w, i, 1);
        }
        for (int32_t i = 0; i < n && n_tok < d->step_tokens; i++) {
            drafter_work *w = &d->work[i];
            if (!w->busy || w->next >= w->end) continue;
            int32_t chunk = w->end - w->next;
            if (chunk > d->step_tokens - n_tok) chunk = d->step_tokens - n_tok;
            add_seq(d, &b, &n_tok, &n_out, &reqs[i], w, i, chunk);
        }
        if (b.n_seqs == 0) break;
        b.n_tokens = n_tok;
        b.n_out = n_out;
        st = kiln_runner_step(d->runner, &b, d->logits, err);
        if (st) break;
        d->stats.forwards++;
        /* commit: the fed tokens are the slots' history now; read the drafts */
        int32_t row = 0;
        for (int32_t q = 0; q < b.n_seqs; q++) {
            kiln_draft_req *r = &reqs[d->b_req[q]];
            drafter_work *w = &d->work[d->b_req[q]];
            drafter_slot *s = &d->slots[r->slot];
            const kiln_batch_seq *bs = &b.seqs[q];
            memcpy(s->hist + s->n_hist, d->b_tokens + bs->first,
                   (size_t)bs->n_new * sizeof(int32_t));
            s->n_hist += bs->n_new;
            if (w->next < w->end) {
                w->next += bs->n_new;
                d->stats.catchup_tokens += bs->n_new;
            } else {
                d->stats.draft_tokens += bs->n_new;
            }
            if (row < n_out && b.out[row] == bs->first + bs->n_new - 1) {
                r->out[r->n_out++] = kiln_argmax(d->logits + (size_t)row * d->n_vocab, d->n_vocab);
                d->stats.drafted++;
                row++;
            }
            if (w->next >= w->end && r->n_out >= w->k_eff) w->busy = false;
        }
    }
    /* release blocks reserved beyond what was written (only after an error) */
    for (int32_t i = 0; i < n; i++) {
        drafter_slot *s = &d->slots[reqs[i].slot];
        kiln_block_table_truncate(&s->bt, d->pool, s->n_hist);
    }
    if (st == KILN_OK) d->stats.proposes++;
    return st;
}

kiln_drafter_stats kiln_drafter_get_stats(const kiln_drafter *d) {
    kiln_drafter_stats s;
    memset(&s, 0, sizeof s);
    return d ? d->stats : s;
}

int32_t kiln_drafter_slot_tokens(const kiln_drafter *d, int32_t slot) {
    if (!d || slot < 0 || slot >= d->max_slots || !d->slots[slot].open) return -1;
    return d->slots[slot].n_hist;
}

void kiln_drafter_pool_usage(const kiln_drafter *d, int32_t *used, int32_t *total) {
    kiln_kv_pool_stats s = kiln_kv_pool_get_stats(d ? d->pool : NULL);
    if (used) *used = s.used;
    if (total) *total = s.n_blocks;
}
