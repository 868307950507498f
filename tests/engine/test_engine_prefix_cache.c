/*
 * The prefix cache's promise (issue 13, DESIGN.md "Block lifecycle"): a request's tokens and
 * its logits at every generated position are bitwise identical whether its prefix was
 *   (a) computed (the reference: an engine with no_prefix_cache, the request alone);
 *   (b) shared from RAM (an engine that ran another request with the same prefix first);
 *   (c) loaded from disk after a restart (an engine on the same cache_dir, created after the
 *       first one was destroyed);
 *   (d) or the request was preempted and resumed (a pool smaller than the demand, cache on
 *       and off);
 * and usage.cached_tokens says how many prompt tokens were shared: exactly the shared
 * prefix's full blocks (for recurrent models, up to the last checkpoint: a block boundary
 * where a prefill chunk ended).
 *
 * Prompts: a shared 80-token prefix (5 blocks of 16) then a distinct suffix; greedy and
 * seeded sampling (temperature 0.8, top-p 0.9), 20 generated tokens each, which cross a
 * block boundary while decoding.
 *
 * usage: test_engine_prefix_cache MODEL_REL [hf]
 */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine_test_util.h"

#define N_PROMPTS  4
#define PREFIX_LEN 80
#define MAX_TOK    20
#define BS         16

typedef struct prompt {
    int32_t ids[160];
    int32_t n;
} prompt;

static const kiln_model *g_m;
static int32_t g_nv;
static prompt g_prompts[N_PROMPTS];
static bool g_recurrent;

static void make_prompts(void) {
    int32_t prefix[PREFIX_LEN];
    et_prompt(prefix, PREFIX_LEN, 1, g_nv);
    for (int k = 0; k < N_PROMPTS; k++) {
        prompt *p = &g_prompts[k];
        p->n = PREFIX_LEN + 7 + 5 * k;
        memcpy(p->ids, prefix, sizeof prefix);
        et_prompt(p->ids + PREFIX_LEN, p->n - PREFIX_LEN, 10 + (uint64_t)k, g_nv);
        /* distinct first suffix tokens: the prompts share exactly the prefix */
        p->ids[PREFIX_LEN] = 3 + (k * 7919) % (g_nv - 3);
    }
}

static void make_job_n(et_job *j, int k, int32_t n_prompt, int32_t max_tokens, bool sampled,
                       et_result *res) {
    memset(j, 0, sizeof *j);
    j->req = kiln_request_defaults();
    j->req.prompt_ids = g_prompts[k].ids;
    j->req.n_prompt_ids = n_prompt;
    j->req.max_tokens = max_tokens;
    j->req.ignore_eos = true;
    if (sampled) {
        j->req.temperature = 0.8f;
        j->req.top_p = 0.9f;
        j->req.seed = 1000 + (uint64_t)k;
    } else {
        j->req.temperature = 0.0f;
    }
    j->dbg.capture_logits = true;
    j->cancel_step = -1;
    j->res = res;
}

static void make_job(et_job *j, int k, bool sampled, et_result *res) {
    make_job_n(j, k, g_prompts[k].n, MAX_TOK, sampled, res);
}

static kiln_engine_params base_params(void) {
    kiln_engine_params p = kiln_engine_default_params();
    p.n_ctx = 256;
    p.kv_tokens = 64 * 256;
    p.n_threads = 2;
    /* hits at every block and the disk tier need every block of a sliding-window layer
     * (src/engine/kv_window.c; test_engine_window covers hits on the freeing path) */
    p.kv_keep_window = true;
    return p;
}

/* Bitwise: tokens, finish, and every logits row. */
static void compare(const char *what, const et_result *ref, const et_result *got) {
    CHECKF(got->finish == ref->finish, "%s: finish %s, reference %s (%s)", what,
           kiln_finish_reason_name(got->finish), kiln_finish_reason_name(ref->finish),
           got->message);
    bool same_tok = got->n_tokens == ref->n_tokens &&
                    memcmp(got->tokens, ref->tokens, (size_t)ref->n_tokens * 4) == 0;
    CHECKF(same_tok, "%s: tokens differ from the computed reference", what);
    bool same_rows = got->n_logit_rows == ref->n_logit_rows && ref->n_logit_rows > 0;
    int32_t first_diff = -1;
    for (int32_t r = 0; same_rows && r < ref->n_logit_rows; r++)
        if (memcmp(got->logits + (size_t)r * g_nv, ref->logits + (size_t)r * g_nv,
                   (size_t)g_nv * sizeof(float)) != 0) {
            same_rows = false;
            first_diff = r;
        }
    CHECKF(same_rows, "%s: logits not bitwise identical (rows %d vs %d, first differing row %d)",
           what, got->n_logit_rows, ref->n_logit_rows, first_diff);
}

/* Submit one job to e and read it to the end. */
static void run_one(kiln_engine *e, et_job *j) {
    kiln_error err = {0};
    kiln_stream *s = NULL;
    REQUIRE(kiln_engine_submit_debug(e, &j->req, &j->dbg, &s, &err) == KILN_OK);
    et_collect(s, j->res, g_nv);
    kiln_stream_destroy(s);
}

static kiln_engine *make_engine(const kiln_engine_params *p) {
    kiln_engine *e = NULL;
    kiln_error err = {0};
    if (kiln_engine_create(g_m, p, &e, &err) != KILN_OK) {
        fprintf(stderr, "engine create: %s\n", err.message);
        exit(1);
    }
    return e;
}

/* What a hit on g_prompts[k] shares after g_prompts[0] ran: the prefix's full blocks (the
 * prefix is a whole number of blocks, the suffixes differ from their first token). For a
 * recurrent model, the state must have been checkpointed there: prompt 0's first prefill
 * chunk ends on the last block boundary it crosses, which is the prefix's end. */
static int32_t expected_hit(int k) {
    (void)k;
    return PREFIX_LEN;
}

static void check_pool_idle(const char *what, kiln_engine *e) {
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0 && st.kv_blocks_cached + st.kv_blocks_free == st.kv_blocks_total,
           "%s: after the run used %d, cached %d, free %d of %d", what, st.kv_blocks_used,
           st.kv_blocks_cached, st.kv_blocks_free, st.kv_blocks_total);
}

static char g_dir[256];

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[512];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

int main(int argc, char **argv) {
    REQUIRE(argc >= 2);
    bool hf = argc >= 3 && !strcmp(argv[2], "hf");
    kiln_model *m = et_load_opt(argv[1], !hf);
    g_m = m;
    g_nv = kiln_model_n_vocab(m);
    g_recurrent = kiln_model_seq_state_floats(m) > 0;
    make_prompts();
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln-test-prefix-%d", (int)getpid());

    for (int sampled = 0; sampled <= 1; sampled++) {
        const char *mode = sampled ? "sampled" : "greedy";
        et_job j[N_PROMPTS];
        et_result ref[N_PROMPTS], got[N_PROMPTS];
        char what[512];

        /* (a) computed: cache off, each prompt alone */
        kiln_engine_params off = base_params();
        off.no_prefix_cache = true;
        for (int k = 0; k < N_PROMPTS; k++) {
            make_job(&j[k], k, sampled, &ref[k]);
            kiln_engine *e = make_engine(&off);
            run_one(e, &j[k]);
            kiln_engine_params got_p;
            kiln_engine_get_params(e, &got_p);
            CHECK(got_p.no_prefix_cache);
            kiln_engine_destroy(e);
            REQUIRE(ref[k].finish == KILN_FINISH_LENGTH && ref[k].n_tokens == MAX_TOK);
            CHECKF(ref[k].usage.cached_tokens == 0, "cache off: %d cached tokens",
                   ref[k].usage.cached_tokens);
        }

        /* (b) RAM: prompt 0 warms the cache, the others (and prompt 0 again) hit it; then
         *     the same with prefill chunks that are not a multiple of the block size */
        for (int chunked = 0; chunked <= 1; chunked++) {
            kiln_engine_params on = base_params();
            if (chunked) on.prefill_chunk = 24;
            kiln_engine *e = make_engine(&on);
            for (int k = 0; k < N_PROMPTS; k++) {
                make_job(&j[k], k, sampled, &got[k]);
                run_one(e, &j[k]);
                snprintf(what, sizeof what, "%s %s prompt %d from RAM%s", argv[1], mode, k,
                         chunked ? " (chunks of 24)" : "");
                compare(what, &ref[k], &got[k]);
                int32_t want = k == 0 ? 0 : expected_hit(k);
                CHECKF(got[k].usage.cached_tokens == want, "%s: cached_tokens %d, expected %d",
                       what, got[k].usage.cached_tokens, want);
                CHECK(got[k].usage.prompt_tokens == g_prompts[k].n);
                et_result_free(&got[k]);
            }
            /* prompt 0 again: its own prompt blocks are cached now (all full blocks but
             * the one holding the last token; for recurrent models only where a
             * checkpoint was taken: at least the prefix) */
            et_result again;
            make_job(&j[0], 0, sampled, &again);
            run_one(e, &j[0]);
            snprintf(what, sizeof what, "%s %s prompt 0 again%s", argv[1], mode,
                     chunked ? " (chunks of 24)" : "");
            compare(what, &ref[0], &again);
            int32_t full = (g_prompts[0].n - 1) / BS * BS;
            CHECKF(g_recurrent ? again.usage.cached_tokens >= PREFIX_LEN &&
                                     again.usage.cached_tokens <= full
                               : again.usage.cached_tokens == full,
                   "%s: cached_tokens %d (full blocks before the last token: %d)", what,
                   again.usage.cached_tokens, full);
            et_result_free(&again);
            kiln_engine_stats st;
            kiln_engine_get_stats(e, &st);
            CHECKF(st.prefix_hit_requests == N_PROMPTS && st.prefix_miss_requests == 1,
                   "%s: %lld hits, %lld misses", argv[1], (long long)st.prefix_hit_requests,
                   (long long)st.prefix_miss_requests);
            check_pool_idle("RAM", e);
            kiln_engine_destroy(e);
        }

        /* (c) disk after a restart: one engine runs prompt 0 and is destroyed; a new one on
         *     the same directory serves the others from disk */
        rm_tree(g_dir);
        kiln_engine_params dp = base_params();
        dp.cache_dir = g_dir;
        {
            kiln_engine *e = make_engine(&dp);
            make_job(&j[0], 0, sampled, &got[0]);
            run_one(e, &j[0]);
            compare("disk: first engine, prompt 0", &ref[0], &got[0]);
            et_result_free(&got[0]);
            kiln_engine_destroy(e);
        }
        for (int k = 1; k < N_PROMPTS; k++) {
            kiln_engine *e = make_engine(&dp); /* a restart before every prompt */
            make_job(&j[k], k, sampled, &got[k]);
            run_one(e, &j[k]);
            snprintf(what, sizeof what, "%s %s prompt %d from disk after a restart", argv[1], mode,
                     k);
            compare(what, &ref[k], &got[k]);
            CHECKF(got[k].usage.cached_tokens == expected_hit(k),
                   "%s: cached_tokens %d, expected %d", what, got[k].usage.cached_tokens,
                   expected_hit(k));
            kiln_engine_stats st;
            kiln_engine_get_stats(e, &st);
            CHECKF(st.disk_reads >= expected_hit(k) / BS && st.disk_read_bytes > 0 &&
                       st.disk_corrupt == 0,
                   "%s: %lld disk reads (%lld bytes), %lld corrupt", what,
                   (long long)st.disk_reads, (long long)st.disk_read_bytes,
                   (long long)st.disk_corrupt);
            et_result_free(&got[k]);
            check_pool_idle("disk", e);
            kiln_engine_destroy(e);
        }
        rm_tree(g_dir);

        /* (d) preempted and resumed: short prompts (2 to 3 blocks, the first 24 shared) that
         *     decode long (60 tokens: 6 blocks over a life), all at once on a pool of 10
         *     blocks: admission lets several start, and they outgrow the pool while decoding.
         *     Cache on and off; each against its own computed run alone. */
        for (int k = 0; k < N_PROMPTS; k++) et_result_free(&ref[k]);
        for (int k = 0; k < N_PROMPTS; k++) {
            make_job_n(&j[k], k, 24 + 4 * k, 60, sampled, &ref[k]);
            kiln_engine *e = make_engine(&off);
            run_one(e, &j[k]);
            kiln_engine_destroy(e);
            REQUIRE(ref[k].finish == KILN_FINISH_LENGTH && ref[k].n_tokens == 60);
        }
        for (int cache = 0; cache <= 1; cache++) {
            kiln_engine_params sp = base_params();
            sp.kv_tokens = BS * 10;
            sp.no_prefix_cache = !cache;
            for (int k = 0; k < N_PROMPTS; k++) make_job_n(&j[k], k, 24 + 4 * k, 60, sampled, &got[k]);
            et_run run;
            kiln_engine_stats st = et_run_jobs(m, &sp, j, N_PROMPTS, &run);
            CHECKF(st.preemptions > 0, "%s %s small pool (cache %s): no preemption", argv[1],
                   mode, cache ? "on" : "off");
            for (int k = 0; k < N_PROMPTS; k++) {
                snprintf(what, sizeof what, "%s %s prompt %d on a small pool, cache %s", argv[1],
                         mode, k, cache ? "on" : "off");
                compare(what, &ref[k], &got[k]);
                et_result_free(&got[k]);
            }
            CHECKF(st.kv_blocks_used == 0, "small pool: %d blocks still used", st.kv_blocks_used);
        }
        for (int k = 0; k < N_PROMPTS; k++) et_result_free(&ref[k]);
    }
    kiln_model_free(m);
    if (kiln_test_failures) {
        fprintf(stderr, "test_engine_prefix_cache %s: %d check(s) failed\n", argv[1],
                kiln_test_failures);
        return 1;
    }
    printf("test_engine_prefix_cache %s: all checks passed\n", argv[1]);
    return 0;
}
