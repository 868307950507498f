/*
 * engine_internal.h - the engine's private structures: request snapshots, streams,
 * sequences and their methods, the engine itself (DESIGN.md "Key structures").
 *
 * Threads. Submitters touch only the request snapshot they build, the engine's incoming
 * queue (under engine->mu) and their stream. Everything else (the pool, the waiting FIFO, the
 * running sequences, the batch buffers) belongs to the engine thread. A stream is shared by
 * its consumer and the engine: its event queue is under stream->mu, its cancel flag atomic, and
 * its text pipeline (detokenizer, stop matcher) belongs to the thread reading it.
 */
#ifndef KILN_ENGINE_ENGINE_INTERNAL_H
#define KILN_ENGINE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine_debug.h"
#include "engine/sampler.h"
#include "engine/stop.h"
#include "kiln.h"
#include "kv/kv_pool.h"
#include "kv/prefix_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "backend/runner.h"
#include "util/vec.h"

/* ---- request snapshot (request.c) ---------------------------------------------------- */

/** An immutable, owned copy of a validated request, with its prompt tokenized. */
typedef struct kiln_req {
    kiln_ivec prompt; /* token ids, each in [0, n_vocab) */
    int32_t max_tokens;
    kiln_sampler_params sampler; /* bias arrays point into bias_ids / bias_values below */
    int32_t *bias_ids;
    float *bias_values;
    bool logprobs;
    int32_t top_logprobs;
    bool prompt_logprobs;        /* PROMPT_LOGPROB events (kiln_request) */
    int32_t top_prompt_logprobs;
    int32_t n_stop;
    char *stop[KILN_MAX_STOP_STRINGS];
    int32_t n_stop_ids;
    int32_t *stop_ids;
    bool ignore_eos;
    bool render_special; /* TEXT events show control tokens' text (kiln_request) */
    kiln_request_debug debug; /* debug.force_tokens points to force_tokens below */
    int32_t *force_tokens;
    /* speculation and fill (validated; spec and spec_k still as the client gave them) */
    kiln_spec_source spec;
    int32_t spec_k;
    kiln_spec_accept spec_accept;
    kiln_ivec prediction; /* tokens; a verify-policy fill lands here too */
    kiln_ivec fill;       /* asserted tokens that begin the output (a hidden fill is already
                             appended to prompt) */
    int32_t n_hidden_fill; /* of prompt's tokens, the last n came from a hidden fill */
    const kiln_fill_session *fill_session;
    void *fill_session_user; /* owned: fill_session->release at kiln_req_destroy */
    kiln_grammar *grammar;   /* one reference (structured output), or NULL */
    bool grammar_no_jump;    /* jump-forward off */
} kiln_req;

/** Validate req against the model and build the snapshot (tokenizing a text prompt).
 *  Errors: as kiln_engine_submit's validation errors. */
kiln_status kiln_req_create(const kiln_model *m, const kiln_request *req,
                            const kiln_request_debug *debug, kiln_req **out, kiln_error *err);
void kiln_req_destroy(kiln_req *r);

/* ---- streams (stream.c) -------------------------------------------------------------- */

/*
 * A stream has two sides (DESIGN.md "One request, end to end", steps 5 and 7). The engine
 * thread queues TOKEN events (ids and logprobs) and, last, the engine's FINISH. The reader
 * (the thread calling kiln_stream_next; one at a time) turns them into what kiln.h promises:
 * it detokenizes incrementally, holds back incomplete UTF-8 and any text that could still begin
 * a stop string, emits the TEXT deltas, and matches the stop strings. When a stop string matches
 * (or the text pipeline fails) the reader finishes the request itself: it sets the cancel flag
 * so the engine stops the sequence and releases its blocks at the next step boundary, drops the
 * TOKEN events the engine queued after the deciding token, and delivers its own FINISH once
 * the engine's FINISH has arrived (so a reader that saw FINISH sees the blocks released).
 */
typedef struct kiln_stream_out {
    kiln_event ev;
    char *owned; /* the TEXT bytes the event points to (heap), or NULL */
} kiln_stream_out;

struct kiln_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when an event is queued */
    atomic_int refs;   /* the consumer's handle + the engine's sequence */
    atomic_bool cancel;
    atomic_bool finished; /* the engine's FINISH event is queued */
    /* under mu: the engine's side */
    kiln_event *q; /* TOKEN events, oldest first (a ring) */
    size_t q_head, q_len, q_cap;
    kiln_event fin; /* the engine's FINISH, stored apart so queueing it cannot fail */
    char fin_message[1024];
    bool fin_taken; /* the reader has taken fin */
    float *logits;  /* debug capture: [n_logit_rows][n_vocab] */
    int32_t n_logit_rows, cap_logit_rows, n_vocab;
    /* the reader's side (kiln_stream_next's thread only) */
    kiln_detok *detok;       /* primed with the prompt; NULL: no tokenizer, no TEXT events */
    kiln_stop_matcher *stop; /* NULL with detok */
    kiln_stream_out out[3];  /* events ready for the reader, out[out_head..] in order */
    int out_head, out_n;
    char *delivered; /* the TEXT bytes of the event last returned by kiln_stream_next */
    bool r_done;     /* the FINISH event is ready or delivered: nothing more to read */
    bool r_finished; /* the reader finished the request (stop string, text error) */
    kiln_finish_reason r_reason;
    kiln_status r_status;
    int32_t r_completion; /* completion_tokens: the deciding token's index + 1 */
    int64_t r_time_ns;    /* the deciding token's time */
    char r_message[1024];
    /* engine thread only */
    struct kiln_seq *seq;
};

/**
 * A stream with two references (consumer and engine), its reader side set up for request r
 * of model m: the detokenizer primed with r's prompt (so the spacing rules see the whole
 * sequence; the prompt's text is dropped) and a matcher for r's stop strings. Runs on the
 * submitting thread. Errors: KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (a mutex), detok errors.
 */
kiln_status kiln_stream_create(const kiln_model *m, const kiln_req *r, kiln_stream **out,
                               kiln_error *err);
/** Drop one reference; the last one frees the stream. */
void kiln_stream_unref(kiln_stream *s);
/** Queue a TOKEN event (engine thread). Errors: KILN_ERR_OUT_OF_MEMORY (the event is lost). */
kiln_status kiln_stream_push_token(kiln_stream *s, int32_t token, int32_t index,
                                   const kiln_logprobs *lp, bool with_logprobs, kiln_error *err);
/** Queue a PROMPT_LOGPROB event for prompt token `index` (engine thread). Errors: as
 *  kiln_stream_push_token. */
kiln_status kiln_stream_push_prompt_logprob(kiln_stream *s, int32_t index,
                                            const kiln_logprobs *lp, kiln_error *err);
/** Queue the engine's FINISH event (once; later calls are ignored). Never fails: it has its
 *  own slot, delivered after every other event; an over-long message is truncated. */
void kiln_stream_push_finish(kiln_stream *s, kiln_finish_reason reason, kiln_usage usage,
                             kiln_status status, const char *message);
/** Append one captured logits row. Errors: KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_stream_capture_logits(kiln_stream *s, const float *row, int32_t n_vocab,
                                       kiln_error *err);

/* ---- sequences and methods (sequence.c, method_sample.c) ----------------------------- */

typedef struct kiln_engine kiln_engine;
typedef struct kiln_seq kiln_seq;

/**
 * A method decides what a running sequence contributes to a step and what is done with its
 * logits (DESIGN.md "Consume": sample, speculate, fill). The engine calls plan for every
 * running sequence, runs one forward over everything planned, then calls consume for each
 * sequence that asked for logits, then commits: n_computed advances by n_keep.
 */
typedef struct kiln_seq_method {
    const char *name;
    /* Choose this step's contribution: the n_new (returned, 0..budget) tokens starting at
     * tokens[n_computed] (the method may append draft tokens first) and how many of the last
     * of them need logits (*n_logits, 0..n_new). */
    int32_t (*plan)(kiln_engine *e, kiln_seq *s, int32_t budget, int32_t *n_logits);
    /* Read logits[n_logits][n_vocab] (rows for the last n_logits planned tokens). Sets
     * *n_keep (0..n_new): how many planned tokens stay in the KV (fewer = rollback of
     * rejected drafts to n_past + accepted + 1). May finish the sequence (seq_finish).
     * An error finishes the sequence with KILN_FINISH_ERROR. */
    kiln_status (*consume)(kiln_engine *e, kiln_seq *s, const float *logits, int32_t n_logits,
                           int32_t *n_keep, kiln_error *err);
} kiln_seq_method;

extern const kiln_seq_method kiln_method_sample;
/** Speculation and fill (method_spec.c): drafts, predictions, asserted spans (spec.h). */
extern const kiln_seq_method kiln_method_spec;

/**
 * Sample the token at output index s->tokens.n - s->n_prompt from one logits row, as the
 * plain method does (method_sample.c): the debug capture and injected failure, the NaN check,
 * the request's sampler with step = that output index, a forced token (debug). With draft >= 0
 * under KILN_SPEC_ACCEPT_REJECTION the draft is verified by speculative sampling instead
 * (*accepted set); otherwise *accepted = (token == draft). lp is filled when the request
 * wants logprobs. Errors: as the sampler's misuse, NaN logits, the injected failure.
 */
kiln_status kiln_seq_sample_row(kiln_engine *e, kiln_seq *s, const float *row, int32_t draft,
                                int32_t *tok, bool *accepted, kiln_logprobs *lp,
                                kiln_error *err);
/**
 * Prompt logprobs (kiln_request.prompt_logprobs): this step's rows logits[n_logits][n_vocab]
 * are those of the last n_logits of the s->n_new positions planned from s->n_computed; the
 * row of position p gives prompt token p + 1 its PROMPT_LOGPROB event (p + 1 < n_prompt),
 * each position once (s->n_prompt_lp: the next one; a recomputed prefix after a preemption
 * sends nothing again). A no-op for other requests. Errors: KILN_ERR_OUT_OF_MEMORY, NaN
 * logits (KILN_ERR_INTERNAL).
 */
kiln_status kiln_seq_prompt_logprobs(kiln_engine *e, kiln_seq *s, const float *logits,
                                     int32_t n_logits, kiln_error *err);
/** Prompt logprobs: the most prompt positions one step feeds for such a sequence, so its
 *  logits rows stay bounded (256 rows of a 128k vocabulary: 128 MiB); the values do not
 *  depend on the chunking (batch invariance). */
#define KILN_PROMPT_ROWS_MAX 256
/** Whether this step's plan must compute a row for every planned prompt position (those
 *  from s->n_computed up to n_prompt - 2), for kiln_seq_prompt_logprobs. */
bool kiln_seq_wants_prompt_rows(const kiln_seq *s);
/** Whether s's next token is the plain argmax of its logits row: the plain method, one row,
 *  a greedy sampler with no bias or penalty, no logprobs and no debug hooks. Such rows may be
 *  decided on the device (kiln_runner_step_argmax). */
bool kiln_seq_plain_greedy(const kiln_seq *s);
/** The plain method's consume given the argmax of its row instead of the row (tok; -1: the
 *  row held a NaN, an error as in kiln_seq_sample_row). */
kiln_status kiln_seq_consume_argmax(kiln_engine *e, kiln_seq *s, int32_t tok, int32_t *n_keep,
                                    kiln_error *err);
/** Whether tok ends s's generation (an end-of-generation id unless ignore_eos, or a stop id). */
bool kiln_seq_is_stop_token(const kiln_engine *e, const kiln_seq *s, int32_t tok);

typedef enum kiln_seq_state {
    KILN_SEQ_QUEUED = 0, /* submitted (or preempted), waiting for admission */
    KILN_SEQ_LOADING,    /* waiting for its prefix's blocks to be read from the disk tier */
    KILN_SEQ_RUNNING,    /* admitted: prefilling or decoding */
    KILN_SEQ_FINISHED,
} kiln_seq_state;

struct kiln_seq {
    uint64_t id;
    kiln_seq *next;      /* incoming queue / waiting FIFO link */
    kiln_req *req;       /* owned */
    kiln_stream *stream; /* one reference */
    const kiln_seq_method *method;
    kiln_seq_state state;
    int32_t n_prompt;
    kiln_ivec tokens;    /* prompt then generated tokens (the stopping token excluded) */
    int32_t n_computed;  /* positions whose KV is written (n_past) */
    int32_t n_generated; /* tokens sampled, the stopping token included */
    int32_t n_prompt_lp; /* prompt logprobs: the next prompt position whose row is due */
    kiln_block_table bt; /* covers n_computed positions, plus this step's while it runs */
    kiln_block_table bt_swa; /* the sliding group's table (e->pool_swa), as long as bt, with
                                holes before the window; empty without a sliding pool */
    /* prefix cache (prefix.c) */
    uint64_t *bhash; /* chain hashes of the full blocks of tokens: [n_hashed] */
    int32_t n_hashed, cap_hash;
    int32_t n_registered; /* leading full blocks offered to the cache since admission */
    int32_t n_cached;     /* prompt tokens shared from the cache at the first admission */
    bool admitted_once;
    bool disk_tried;               /* the disk tier was asked once for this admission */
    int32_t ckpt_index;            /* index of the block carrying this sequence's latest decode
                                      checkpoint (recurrent models), or -1 */
    struct kiln_disk_fetch *fetch; /* LOADING: the disk read in flight */
    int32_t fetch_first;           /* LOADING: index of the first block being read */
    float *rec_state;          /* recurrent-layer state (kiln_model_seq_state_floats), or NULL */
    struct kiln_seq_spec *spec; /* speculation and fill (spec.h), or NULL: plain sampling */
    struct kiln_gmatch *gm;     /* the grammar's recognizer over the output (grammar_seq.c), or
                                   NULL; always at the end of tokens[n_prompt..] */
    kiln_seq *fork_kids;        /* choices 1..n-1 of kiln_engine_submit_n, waiting to fork
                                   from this one's prompt KV (a list via next; counted as
                                   queued); NULL for every other sequence */
    const int32_t *draft;       /* this step: tokens planned after tokens[n_computed..] */
    int32_t n_draft;
    kiln_finish_reason finish; /* KILN_FINISH_NONE while running */
    kiln_error finish_err;     /* status and message when finish is KILN_FINISH_ERROR */
    /* this step */
    int32_t n_new, first, n_logits, out_row;
    bool failed_forward;
};

/** Allocate per-sequence state (recurrent-layer state). Engine thread, at admission.
 *  Errors: KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_seq_start(kiln_engine *e, kiln_seq *s, kiln_error *err);
/** Mark the sequence finished with `reason` (status/message for errors). The engine releases
 *  it at the end of the step. Its text is the reader's business (stream.c). */
void kiln_seq_finish(kiln_seq *s, kiln_finish_reason reason, kiln_status status,
                     const char *message);
/** Release the blocks, queue the FINISH event, drop the stream reference, free. */
void kiln_seq_release(kiln_engine *e, kiln_seq *s);

/* ---- the engine (engine.c, scheduler.c) ---------------------------------------------- */

struct kiln_engine {
    const kiln_model *model;
    kiln_engine_params p; /* resolved: every field has its final value */
    int32_t n_vocab;
    int64_t rec_state_floats; /* per-sequence recurrent state size; 0 for most models */
    kiln_kv_pool *pool;     /* the full group's blocks (every layer without pool_swa) */
    kiln_kv_pool *pool_swa; /* the sliding group's blocks (kv_window.c), or NULL */
    int32_t win_keep;       /* sliding blocks a sequence keeps: ceil(W / bs) + 1 */
    int32_t *win_ckref;     /* [pool_swa blocks]: prefix-cache checkpoints keeping it */
    uint32_t *win_gen;      /* [pool_swa blocks]: evictions so far (stale checkpoints) */
    kiln_backend *be;    /* the compute backend context (threads, arena) */
    kiln_runner *runner; /* executes the scheduler's batches on be and pool */
    kiln_engine_debug debug;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* submissions and shutdown */
    /* under mu */
    bool shutdown;
    kiln_seq *in_head, *in_tail;
    uint64_t next_id;
    atomic_int n_queued; /* submitted, not yet admitted */

    /* engine thread only */
    kiln_seq *wait_head, *wait_tail; /* FIFO of requests waiting for admission */
    kiln_seq **running;              /* [n_running], in admission order */
    int32_t n_running;
    kiln_seq *load_head; /* sequences in KILN_SEQ_LOADING (a list via next) */
    int32_t *hit_blocks; /* [n_blocks]: admission's lookup result */
    /* prefix cache (prefix.c): NULL when off */
    kiln_prefix_cache *pcache;
    struct kiln_disk_tier *disk; /* NULL without cache_dir */
    char *cache_dir;             /* owned copy of p.cache_dir, or NULL */
    uint8_t *disk_buf;           /* one block's payload, gathered for the disk tier */
    int64_t disk_kv_bytes;       /* its size: 2 * n_layer * block_size * kv_dim elements */
    int64_t ckpt_bytes_max;      /* budget for recurrent checkpoints, bytes */
    int32_t decode_rr;           /* rotation of the decode order when the budget is short */
    int64_t step;
    kiln_sampler_scratch *scratch;
    float *logits_buf; /* [cap_out][n_vocab] */
    int32_t cap_out;
    struct kiln_drafter *drafter;     /* KILN_SPEC_DRAFT's model (drafter.h), or NULL */
    struct kiln_draft_req *draft_reqs; /* [max_seqs]: one step's requests to the drafter */
    int32_t *b_tokens;      /* [step_tokens] */
    int32_t *b_out;         /* [step_tokens] */
    int32_t *b_ids;         /* [step_tokens]: a greedy step's argmax per out row (device) */
    kiln_batch_seq *b_seqs; /* [max_seqs] */
    kiln_seq **b_seq_of;    /* [max_seqs]: the sequence behind b_seqs[i] */

    /* structured output (grammar_seq.c): built at the first grammar request, under mu */
    struct kiln_vocab_trie *trie;
    int32_t *eog_ids; /* the vocabulary's end-of-generation ids */
    int32_t n_eog;
    float *gram_row;     /* [n_vocab]: a masked logits row (engine thread) */
    uint32_t *gram_bits; /* [ceil(n_vocab / 32)] */
    atomic_llong st_mask_ns, st_masks; /* time spent building token masks, and how many */

    /* stats, any thread */
    atomic_int st_running;
    atomic_llong st_steps, st_prefill, st_decode, st_finished;
    atomic_llong st_hit_req, st_miss_req, st_hit_tok, st_miss_tok, st_preempt;
    atomic_llong st_verify, st_drafted, st_accepted, st_fill;
    atomic_llong st_forked;
};

/* ---- the prefix cache's engine side (prefix.c) --------------------------------------- */

/**
 * Set up the prefix cache for e (after the pool, the backend and e->p exist): the namespace
 * (the model's fingerprint, the KV page format, the block size and the backend's numerics,
 * hashed), the RAM index over the pool, and with p.cache_dir the disk tier. Does nothing when
 * p.no_prefix_cache. Errors: KILN_ERR_IO (the model's files cannot be fingerprinted while a
 * cache_dir is set; the cache directory cannot be used), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_engine_prefix_init(kiln_engine *e, kiln_error *err);
/** Flush the disk tier's queued writes and close it, then drop the RAM index. */
void kiln_engine_prefix_shutdown(kiln_engine *e);
/**
 * The longest run of s's leading full blocks the cache holds in RAM, capped so that the last
 * token of s->tokens is always computed, and for recurrent models ending at a checkpoint:
 * returns the run's length in blocks and writes their ids to blocks[] (room for
 * tokens.n / block_size). Takes no references.
 */
int32_t kiln_engine_prefix_lookup(kiln_engine *e, kiln_seq *s, int32_t *blocks);
/** The parent hash of s's block i: h_{i-1}, or the namespace for i == 0 (s->bhash must cover
 *  i - 1). Inline: prefix.c and prefix_disk.c both chain through it. */
static inline uint64_t kiln_engine_prefix_parent(const kiln_engine *e, const kiln_seq *s,
                                                 int32_t i) {
    return i ? s->bhash[i - 1] : kiln_prefix_cache_namespace(e->pcache);
}
/** Share blocks[0..n) into s's (empty) table and restore the checkpoint after them; s then
 *  starts at n_computed = n * block_size. False (nothing changes) if one cannot be acquired. */
bool kiln_engine_prefix_share(kiln_engine *e, kiln_seq *s, const int32_t *blocks, int32_t n);
/** After a commit: index s's newly full blocks, and for recurrent models attach the state as
 *  a checkpoint when n_computed sits on a block boundary. */
void kiln_engine_prefix_commit(kiln_engine *e, kiln_seq *s);
/** The delayed KV transition at s's commit (kv_transition.c): once s is longer than
 *  kv_quant_start positions, convert its committed full f16 blocks into the quantized class
 *  and release the f16 ones. No-op without kv_quant_start. */
void kiln_engine_kv_transition(kiln_engine *e, kiln_seq *s);

/* ---- sliding-window memory (kv_window.c; src/engine/kv_window.c) ---- */

/** Whether an engine of model m with params p (resolved) gets a sliding group: its window W
 *  (the largest layer window) with sliding[l] (n_layer entries, filled) telling the group's
 *  layers, or 0 (one pool for every layer): without windowed layers, with kv_keep_window or
 *  kv_quant_start, for a model with recurrent state as well, or when host_memory is false (the
 *  CUDA kernels read one table). */
int32_t kiln_engine_window_plan(const kiln_model *m, const kiln_engine_params *p,
                                bool host_memory, bool *sliding);
/** Blocks of the full group's pool when the engine's KV memory is a byte budget
 *  (p->kv_memory, resolved): with c = ceil(W/bs) + ceil(step_tokens/bs) + 2 and S =
 *  max_seqs * c, the sliding pool gets min(n, S) blocks and the full group the rest:
 *  n = (budget - S * sliding_block_bytes) / full_block_bytes when the budget holds S blocks of
 *  both, else budget / (full + sliding block bytes); a full group without layers (Mistral)
 *  gets max(S, max_seqs * ceil(n_ctx / bs)) ids when the budget holds S sliding blocks (the
 *  rest of the budget is not used). At least 1. */
int32_t kiln_engine_window_main_blocks(const kiln_model *m, const kiln_engine_params *p,
                                       const bool *sliding, int32_t window, kiln_dtype fk,
                                       kiln_dtype fv);
/** Create e->pool_swa for the layers sliding[] with window W, in the formats and backend of
 *  main_params (the full group's pool), and hand it to e->runner. Its size: kv_window.c.
 *  Errors: kiln_kv_pool_create's and kiln_runner_set_sliding_pool's; e->pool_swa stays NULL. */
kiln_status kiln_engine_window_create(kiln_engine *e, const kiln_kv_pool_params *main_params,
                                      const bool *sliding, int32_t window, kiln_error *err);
/** Grow s->bt_swa to s->bt's length (after s->bt was reserved for a step). No-op without a
 *  sliding pool. Errors: kiln_block_table_reserve's (its pool is sized so it does not run dry
 *  before e->pool; an error is an internal one). */
kiln_status kiln_engine_window_reserve(kiln_engine *e, kiln_seq *s, kiln_error *err);
/** s->bt_swa after a rollback to s->n_computed positions (kiln_block_table_truncate). */
void kiln_engine_window_truncate(kiln_engine *e, kiln_seq *s);
/** Give back s->bt_swa (finish, preemption). */
void kiln_engine_window_release(kiln_engine *e, kiln_seq *s);
/** Bytes of a window checkpoint (win_keep sliding block ids) in the prefix cache. */
size_t kiln_engine_window_ckpt_bytes(const kiln_engine *e);
/** Install the sliding pool's eviction hook and the prefix cache's checkpoint-free hook
 *  (after the prefix cache exists). */
void kiln_engine_window_attach_cache(kiln_engine *e);
/** Checkpoint the sliding blocks of the window before block i's end (i + 1 blocks committed)
 *  on the indexed full-group block b (replacing a stale one): they are marked cached in the
 *  sliding pool and kept until every checkpoint naming them is freed, or evicted (which makes
 *  those checkpoints stale). False when a needed block was given back already or memory ran
 *  out. */
bool kiln_engine_window_checkpoint(kiln_engine *e, kiln_seq *s, int32_t i, int32_t b);
/** Whether a window checkpoint (the prefix cache's state of a block) still names live blocks
 *  (none was evicted since). True without a sliding pool. */
bool kiln_engine_window_valid(const kiln_engine *e, const void *state);
/** A prefix hit of n blocks ending at indexed block b (which has a checkpoint): s->bt_swa
 *  (empty) gets n - k holes and shares the k checkpointed blocks. False on failure (s->bt_swa
 *  left empty). */
bool kiln_engine_window_share(kiln_engine *e, kiln_seq *s, int32_t b, int32_t n);
/** The commit step: s keeps its last min(ceil(n_computed/bs), ceil(W/bs) + 1) sliding blocks
 *  and gives back the ones before (kv_window.c says why that is safe). */
void kiln_engine_window_commit(kiln_engine *e, kiln_seq *s);
/** After s->n_computed moved back (a rollback): forget the hashes, registrations and decode
 *  checkpoint of blocks past it (their tokens may change). */
void kiln_engine_prefix_rollback(kiln_engine *e, kiln_seq *s);
/** Start reading s's blocks [first, ...) from the disk tier when RAM misses there and the disk
 *  holds them: true when s is now LOADING (the caller moves it to e->load_head). */
bool kiln_engine_prefix_start_load(kiln_engine *e, kiln_seq *s, int32_t first);
/** For a LOADING s whose read finished: put the verified blocks into the pool and the RAM
 *  index (cached, idle), free the read; s can then be admitted (it hits in RAM). */
void kiln_engine_prefix_finish_load(kiln_engine *e, kiln_seq *s);
/** Open the disk tier on e->cache_dir for a model of this fingerprint and install the
 *  write-behind (prefix_disk.c). Errors: KILN_ERR_INVALID_ARGUMENT (cache_disk_max < 0),
 *  KILN_ERR_IO (the directory: unusable, or locked by another kiln process),
 *  KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_engine_prefix_disk_open(kiln_engine *e, uint64_t fingerprint, kiln_error *err);
/** Flush the queued writes and close the disk tier (no-op without one). */
void kiln_engine_prefix_disk_close(kiln_engine *e);
/** The disk tier's counters into out's disk_* fields (left zero without one). Any thread. */
void kiln_engine_prefix_disk_stats(const kiln_engine *e, kiln_engine_stats *out);
/** Whether a LOADING s's disk read has finished (any thread may have completed it). */
bool kiln_engine_prefix_load_done(const kiln_seq *s);
/** Drop a LOADING s's read (waiting for it if it is in flight). */
void kiln_engine_prefix_cancel_load(kiln_engine *e, kiln_seq *s);
/** Whether some LOADING sequence's read finished or it was cancelled. Engine thread. */
bool kiln_engine_any_load_done(const kiln_engine *e);
/** Finish every LOADING sequence as cancelled (shutdown). Engine thread. */
void kiln_engine_cancel_loading(kiln_engine *e);
/** Whether the recurrent chunk rule applies: prefix cache on and the model has recurrent
 *  state (prefill chunks then end on block boundaries, where checkpoints are taken). */
bool kiln_engine_prefix_align_chunks(const kiln_engine *e);

/**
 * Fork s's waiting choices (s->fork_kids) once s's KV covers its prompt's first n_prompt - 1
 * positions: each shares those positions (kiln_block_table_fork_prefix) and joins the running
 * sequences, to compute the prompt's last token itself. A choice that cannot fork goes to the
 * head of the waiting FIFO as an ordinary request; a cancelled one finishes. With force, every
 * choice is let go that way whatever s's progress (s is finishing or being released).
 * Engine thread.
 */
void kiln_engine_fork_kids(kiln_engine *e, kiln_seq *s, bool force);

/** Move submissions from the incoming queue to the waiting FIFO. Engine thread. */
void kiln_engine_drain_incoming(kiln_engine *e);
/** One engine step: admission, plan, forward, consume, commit. Engine thread. */
void kiln_engine_step(kiln_engine *e);

#endif
