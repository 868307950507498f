/*
 * Sliding-window memory (issue 14 item 4; src/engine/kv_window.c): a model with windowed
 * layers keeps them in a second pool and gives back every block outside the window at the
 * commit step. Its outputs must be bitwise those of the all-blocks-kept path
 * (kv_keep_window), at lengths far past the window (the references' W is 16 positions, one
 * block), for greedy and seeded sampling:
 *   alone; in a crowd of requests joining and leaving; prefilled in chunks of 7 with a step
 *   budget of 16; repeated on one engine, the repeat a prefix-cache hit of every full block
 *   before its last token (its sliding blocks from the first run's window checkpoint); with
 *   n-gram speculation; with a client prediction that is partly wrong (drafts rejected and
 *   rolled back); on a pool small enough to preempt (with the prefix cache, so preempted
 *   sequences resume from their checkpoints).
 * After every run no block of either pool is in use (sliding blocks kept only for checkpoints
 * are cached), and the freeing engine has a sliding pool.
 *
 * With "fit" (gemma3): `kiln fit`'s arithmetic (kv_fit.h) for 8192 tokens is below 0.3x the
 * all-full figure, and a real 8192-token sequence holds exactly fit's kv_bytes in the two
 * pools (blocks held x each pool's block bytes), read at the step boundary where the sequence
 * has 8192 positions computed.
 *
 * usage: test_engine_window MODEL_REL [fit]
 */
#include <stdatomic.h>

#include "engine_test_util.h"
#include "kv/kv_fit.h"
#include "kv/kv_pool.h"
#include "model/model_fit.h"

#define N_CTX     384
#define N_TARGETS 2
#define N_OTHERS  6
#define BS        16

static int32_t g_nv;

typedef struct target {
    int32_t prompt[256];
    int32_t n_prompt, max_tokens;
} target;

static void make_target_job(et_job *j, const target *t, bool sampled, uint64_t seed,
                            et_result *res) {
    memset(j, 0, sizeof *j);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = t->prompt;
    j->req.n_prompt_ids = t->n_prompt;
    j->req.max_tokens = t->max_tokens;
    j->req.ignore_eos = true;
    if (sampled) {
        j->req.temperature = 0.8f;
        j->req.top_p = 0.9f;
        j->req.seed = seed;
    } else {
        j->req.temperature = 0.0f;
    }
    j->dbg.capture_logits = true;
    j->cancel_step = -1;
    j->res = res;
}

static int32_t g_other_prompts[N_OTHERS][120];

static void make_other_job(et_job *j, int k, et_result *res) {
    memset(j, 0, sizeof *j);
    const int32_t n_prompt = 5 + 19 * k;
    et_prompt(g_other_prompts[k], n_prompt, 500 + (uint64_t)k, g_nv);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = g_other_prompts[k];
    j->req.n_prompt_ids = n_prompt;
    j->req.max_tokens = 10 + 13 * k;
    j->req.ignore_eos = true;
    j->req.temperature = k % 2 ? 0.7f : 0.0f;
    j->req.seed = 9 + (uint64_t)k;
    j->join_step = k * 3;
    j->cancel_step = k == 4 ? 20 : -1;
    j->res = res;
}

static void compare(const char *what, const et_result *ref, const et_result *got) {
    CHECKF(got->finish == ref->finish, "%s: finish %s, reference %s (%s)", what,
           kiln_finish_reason_name(got->finish), kiln_finish_reason_name(ref->finish),
           got->message);
    CHECKF(got->n_tokens == ref->n_tokens &&
               memcmp(got->tokens, ref->tokens, (size_t)ref->n_tokens * sizeof(int32_t)) == 0,
           "%s: tokens differ from the all-blocks-kept path", what);
    bool same = got->n_logit_rows == ref->n_logit_rows && ref->n_logit_rows > 0;
    int32_t first = -1;
    for (int32_t r = 0; same && r < ref->n_logit_rows; r++)
        if (memcmp(got->logits + (size_t)r * g_nv, ref->logits + (size_t)r * g_nv,
                   (size_t)g_nv * sizeof(float)) != 0) {
            same = false;
            first = r;
        }
    CHECKF(same, "%s: logits differ from the all-blocks-kept path (%d rows vs %d, first at %d)",
           what, got->n_logit_rows, ref->n_logit_rows, first);
}

static kiln_engine_params base_params(bool keep) {
    kiln_engine_params p = kiln_engine_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.block_size = BS;
    p.kv_tokens = 64 * N_CTX;
    p.kv_keep_window = keep;
    return p;
}

static void check_idle(const char *what, const kiln_engine_stats *st, bool freeing) {
    CHECKF(st->kv_blocks_used == 0 && st->kv_blocks_window_held == st->kv_blocks_window_cached,
           "%s: blocks still used after the run: %d full, %d sliding", what, st->kv_blocks_used,
           st->kv_blocks_window_held - st->kv_blocks_window_cached);
    CHECKF(freeing ? st->kv_blocks_window_total > 0 : st->kv_blocks_window_total == 0,
           "%s: the sliding pool has %d blocks (freeing %s)", what, st->kv_blocks_window_total,
           freeing ? "on" : "off");
}

typedef enum { ALONE, CROWD, CHUNKED, PREFIX, NGRAM, PREDICT, PREEMPT, N_MODES } mode;
static const char *const mode_name[N_MODES] = {
    "alone", "crowd", "chunks of 7, budget 16", "prefix cache asked", "n-gram speculation",
    "a partly wrong prediction", "a pool that preempts"};

static void run_mode(const kiln_model *m, mode md, bool keep, const target *tg, bool sampled,
                     const et_result *ref, et_result *out) {
    kiln_engine_params p = base_params(keep);
    if (md == CHUNKED) {
        p.prefill_chunk = 7;
        p.step_tokens = 16;
    }
    if (md == PREFIX || md == PREEMPT) p.no_prefix_cache = false;
    if (md != PREFIX && md != PREEMPT) p.no_prefix_cache = true;
    if (md == NGRAM) p.spec = KILN_SPEC_NGRAM;
    if (md == PREEMPT) p.kv_tokens = BS * 24;
    char what[256];
    if (md == PREFIX) {
        /* each target twice on one engine: the second is a prefix-cache hit (its sliding
         * blocks come from the window checkpoint of the first's prompt) */
        for (int t = 0; t < N_TARGETS; t++) {
            et_job j[2];
            static et_result again;
            make_target_job(&j[0], &tg[t], sampled, 31 + (uint64_t)t, &out[t]);
            make_target_job(&j[1], &tg[t], sampled, 31 + (uint64_t)t, &again);
            j[1].join_step = 100000; /* submitted once the first finished */
            kiln_engine_stats st = et_run_jobs(m, &p, j, 2, NULL);
            snprintf(what, sizeof what, "%s target %d (%s)", mode_name[md], t,
                     sampled ? "sampled" : "greedy");
            check_idle(what, &st, !keep);
            const int32_t want = (tg[t].n_prompt - 1) / BS * BS;
            CHECKF(again.usage.cached_tokens == want && st.prefix_hit_requests == 1,
                   "%s: the repeat had %d cached tokens (expected %d), %lld hits", what,
                   again.usage.cached_tokens, want, (long long)st.prefix_hit_requests);
            char w2[300];
            snprintf(w2, sizeof w2, "%s, repeated (a prefix hit)", what);
            if (ref) compare(w2, &ref[t], &again);
            et_result_free(&again);
        }
    } else if (md == CROWD || md == PREEMPT) {
        et_job jobs[N_TARGETS + N_OTHERS];
        static et_result others[N_OTHERS];
        for (int k = 0; k < N_OTHERS; k++) make_other_job(&jobs[N_TARGETS + k], k, &others[k]);
        for (int t = 0; t < N_TARGETS; t++) {
            make_target_job(&jobs[t], &tg[t], sampled, 31 + (uint64_t)t, &out[t]);
            jobs[t].join_step = 2 + 3 * t;
        }
        kiln_engine_stats st = et_run_jobs(m, &p, jobs, N_TARGETS + N_OTHERS, NULL);
        snprintf(what, sizeof what, "%s (%s)", mode_name[md], sampled ? "sampled" : "greedy");
        check_idle(what, &st, !keep);
        if (md == PREEMPT)
            CHECKF(st.preemptions > 0, "%s: nothing was preempted", what);
        for (int k = 0; k < N_OTHERS; k++) {
            CHECKF(others[k].finish != KILN_FINISH_ERROR, "%s: other %d failed: %s", what, k,
                   others[k].message);
            et_result_free(&others[k]);
        }
    } else {
        for (int t = 0; t < N_TARGETS; t++) {
            et_job j;
            make_target_job(&j, &tg[t], sampled, 31 + (uint64_t)t, &out[t]);
            int32_t pred[256];
            if (md == PREDICT && ref) {
                /* the reference output with every 9th token wrong: drafts are accepted, then
                 * rejected and rolled back */
                int32_t n = ref[t].n_tokens < 256 ? ref[t].n_tokens : 256;
                for (int32_t i = 0; i < n; i++)
                    pred[i] = i % 9 == 8 ? (ref[t].tokens[i] + 1) % g_nv : ref[t].tokens[i];
                j.req.prediction_ids = pred;
                j.req.n_prediction_ids = n;
            }
            kiln_engine_stats st = et_run_jobs(m, &p, &j, 1, NULL);
            snprintf(what, sizeof what, "%s target %d (%s)", mode_name[md], t,
                     sampled ? "sampled" : "greedy");
            check_idle(what, &st, !keep);
            if (md == PREDICT || md == NGRAM)
                CHECKF(st.spec_drafted > 0 && (md == NGRAM || st.spec_accepted > 0) &&
                           (md == NGRAM || st.spec_accepted < st.spec_drafted),
                       "%s: %lld drafted, %lld accepted", what, (long long)st.spec_drafted,
                       (long long)st.spec_accepted);
        }
    }
}

/* ---- fit against a real 8192-token sequence --------------------------------------------- */

#define FIT_N 8192

typedef struct fit_probe {
    _Atomic(kiln_stream *) stream;
    bool seen;
    kiln_engine_stats st;
} fit_probe;

static void fit_hook(void *user, kiln_engine *e, int64_t step) {
    (void)step;
    fit_probe *fp = user;
    kiln_stream *s = atomic_load(&fp->stream);
    if (!s || fp->seen) return;
    kiln_seq_progress pr;
    if (kiln_engine_debug_progress(e, s, &pr, NULL) != KILN_OK || !pr.admitted || pr.finished)
        return;
    if (pr.n_computed == FIT_N) {
        kiln_engine_get_stats(e, &fp->st);
        fp->seen = true;
    }
}

static void fit_check(const kiln_model *m) {
    kiln_kv_fit_layout lay;
    REQUIRE(kiln_model_kv_layout(m, BS, KILN_DTYPE_F32, KILN_DTYPE_F32, &lay));
    const int64_t kv = kiln_kv_fit_seq_bytes(&lay, FIT_N, false);
    const int64_t all = kiln_kv_fit_seq_bytes(&lay, FIT_N, true);
    printf("fit at %d tokens: kv_bytes %lld, all full %lld (%.3fx)\n", FIT_N, (long long)kv,
           (long long)all, (double)kv / (double)all);
    CHECKF(kv > 0 && (double)kv < 0.3 * (double)all, "fit: kv_bytes %lld is not < 0.3x %lld",
           (long long)kv, (long long)all);

    static int32_t prompt[FIT_N];
    et_prompt(prompt, FIT_N - 2, 8192, g_nv);
    kiln_engine_params p = base_params(false);
    p.n_ctx = FIT_N + 8;
    p.kv_tokens = FIT_N + 64;
    p.no_prefix_cache = true;
    fit_probe fp = {.seen = false};
    atomic_init(&fp.stream, NULL);
    kiln_engine_debug dbg = {.on_step = fit_hook, .user = &fp};
    kiln_engine *e = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_create_debug(m, &p, &dbg, &e, &err) == KILN_OK);
    kiln_request r = kiln_request_defaults();
    r.prompt_ids = prompt;
    r.n_prompt_ids = FIT_N - 2;
    r.max_tokens = 4; /* positions FIT_N - 2 + 3 are computed; FIT_N is a step boundary */
    r.ignore_eos = true;
    r.temperature = 0.0f;
    kiln_stream *s = NULL;
    REQUIRE(kiln_engine_submit(e, &r, &s, &err) == KILN_OK);
    atomic_store(&fp.stream, s);
    et_result res;
    et_collect(s, &res, g_nv);
    CHECKF(res.finish == KILN_FINISH_LENGTH, "8k run: finish %s (%s)",
           kiln_finish_reason_name(res.finish), res.message);
    CHECKF(fp.seen, "8k run: no step boundary at %d positions was seen", FIT_N);
    if (fp.seen) {
        /* block bytes of each pool: the layers it holds (kv_pool.h) */
        int32_t n_sliding = 0;
        for (int32_t l = 0; l < m->cfg.n_layer; l++) n_sliding += m->cfg.layer[l].sliding_window > 0;
        const int64_t kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim;
        const int64_t bb_full =
            m->cfg.n_layer > n_sliding
                ? kiln_kv_block_bytes(m->cfg.n_layer - n_sliding, kv_dim, BS, KILN_DTYPE_F32)
                : 0;
        const int64_t bb_win = kiln_kv_block_bytes(n_sliding, kv_dim, BS, KILN_DTYPE_F32);
        const int64_t held = (int64_t)fp.st.kv_blocks_used * bb_full +
                             (int64_t)fp.st.kv_blocks_window_held * bb_win;
        printf("8k run: %d full blocks, %d sliding blocks held: %lld bytes\n",
               fp.st.kv_blocks_used, fp.st.kv_blocks_window_held, (long long)held);
        CHECKF(held == kv, "8k run holds %lld bytes (%d full + %d sliding blocks); fit says %lld",
               (long long)held, fp.st.kv_blocks_used, fp.st.kv_blocks_window_held, (long long)kv);
    }
    et_result_free(&res);
    kiln_stream_destroy(s);
    kiln_engine_destroy(e);
}

/* A pool sized in bytes spends what the sliding group does not need on more full-group blocks
 * (kiln_engine_window_main_blocks): the same kv_memory gives more blocks than keeping every
 * block (Gemma: 5/6 or 1/2 of the layers need only a window), or for Mistral, all of whose
 * layers are windowed, ids for every sequence's whole context; the storage stays within it. */
static void budget_check(const kiln_model *m) {
    int64_t total[2] = {0, 0};
    for (int keep = 0; keep <= 1; keep++) {
        kiln_engine_params p = base_params(keep);
        p.kv_tokens = 0;
        p.kv_memory = 8 << 20;
        p.max_seqs = 4;
        kiln_engine *e = NULL;
        kiln_error err = {0};
        REQUIRE(kiln_engine_create(m, &p, &e, &err) == KILN_OK);
        kiln_engine_stats st;
        kiln_engine_get_stats(e, &st);
        kiln_engine_params got;
        kiln_engine_get_params(e, &got);
        total[keep] = st.kv_blocks_total;
        printf("kv_memory 8 MiB, keep %d: %d blocks (%d sliding), %lld bytes of storage\n", keep,
               st.kv_blocks_total, st.kv_blocks_window_total, (long long)st.kv_bytes);
        CHECKF(st.kv_bytes <= p.kv_memory && got.kv_memory == st.kv_bytes,
               "keep %d: %lld bytes of storage for a budget of %lld (params say %lld)", keep,
               (long long)st.kv_bytes, (long long)p.kv_memory, (long long)got.kv_memory);
        kiln_engine_destroy(e);
    }
    /* more blocks, or (a model whose every layer has a window: the full group only counts
     * ids) enough for every sequence's whole context */
    const int64_t every = 4 * (int64_t)kiln_kv_blocks_for_tokens(N_CTX, BS);
    CHECKF(total[0] > total[1] || total[0] >= every,
           "the freeing engine has %lld blocks, keeping every block %lld (every context: %lld)",
           (long long)total[0], (long long)total[1], (long long)every);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_REL [fit]\n", argv[0]);
        return 2;
    }
    kiln_model *m = et_load_opt(argv[1], false);
    g_nv = m->cfg.n_vocab;
    REQUIRE(kiln_config_has_sliding(&m->cfg));

    /* target 0: 150 prompt tokens (9 windows), 80 generated; target 1: a short prompt that
     * repeats a 10-token motif (n-gram drafts find it), 120 generated */
    static target tg[N_TARGETS];
    tg[0].n_prompt = 150;
    tg[0].max_tokens = 80;
    et_prompt(tg[0].prompt, tg[0].n_prompt, 7, g_nv);
    tg[1].n_prompt = 40;
    tg[1].max_tokens = 120;
    et_prompt(tg[1].prompt, 10, 8, g_nv);
    for (int32_t i = 10; i < tg[1].n_prompt; i++) tg[1].prompt[i] = tg[1].prompt[i % 10];

    for (int sampled = 0; sampled <= 1; sampled++) {
        static et_result ref[N_TARGETS], got[N_TARGETS];
        run_mode(m, ALONE, true, tg, sampled, NULL, ref);
        for (int t = 0; t < N_TARGETS; t++)
            REQUIRE(ref[t].finish == KILN_FINISH_LENGTH && ref[t].n_tokens == tg[t].max_tokens);
        for (int md = 0; md < N_MODES; md++) {
            run_mode(m, (mode)md, false, tg, sampled, ref, got);
            for (int t = 0; t < N_TARGETS; t++) {
                char what[256];
                snprintf(what, sizeof what, "%s %s, target %d, %s", argv[1], mode_name[md], t,
                         sampled ? "sampled" : "greedy");
                compare(what, &ref[t], &got[t]);
                et_result_free(&got[t]);
            }
        }
        for (int t = 0; t < N_TARGETS; t++) et_result_free(&ref[t]);
    }
    budget_check(m);
    if (argc >= 3 && !strcmp(argv[2], "fit")) fit_check(m);
    kiln_model_free(m);
    if (kiln_test_failures) {
        fprintf(stderr, "test_engine_window %s: %d check(s) failed\n", argv[1], kiln_test_failures);
        return 1;
    }
    printf("test_engine_window %s: all checks passed\n", argv[1]);
    return 0;
}
