/*
 * bench_prefix.c - `kiln bench --shared-prefix N`: what the prefix cache buys when requests
 * share a prompt prefix (a system prompt, a few-shot preamble, a document asked about again).
 *
 * Every request's prompt is the same N synthetic tokens (deterministic pseudo-random ordinary
 * tokens, from --seed) followed by --suffix-tokens tokens of its own; it generates
 * --gen-tokens greedy tokens (ignore_eos). --clients threads share one engine through the C
 * API: each takes the next request, submits it, reads its stream to the end, and repeats,
 * until --requests requests are done. Each phase creates a fresh engine:
 *   off      no_prefix_cache: every prompt token is computed;
 *   on       the RAM prefix cache: after one warm-up request (not counted) has put the
 *            prefix's blocks in the cache, the measured requests find them there;
 *   restart  only with --cache-dir: one request on an engine over the directory, the
 *            engine destroyed (its cached blocks written to the directory), then a fresh
 *            engine on the same directory, whose FIRST request is measured: its prefix can
 *            only come from the disk.
 * "off" runs the same uncounted warm-up request as "on", so both start from a warm process.
 * Reported per phase: TTFT p50/p99 (submit to first token, engine event times), throughput
 * over the phase's wall time (first submit to last finish) counting prompt + generated tokens
 * (the cached ones included: that is the work the cache saves) and generated tokens alone,
 * the mean cached tokens per request (usage.cached_tokens), and the engine's counters over the
 * measured requests (kiln_engine_stats): prefix-cache hits, disk reads and bytes, and the disk
 * read rate, bytes read over the TTFT of the requests that read them.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "util/error.h"

/* The prompts of one benchmark: prefix + suffix(i). */
typedef struct prompt_set {
    const int32_t *ord; /* ordinary tokens to draw from */
    int32_t n_ord;
    int32_t *prefix; /* [n_prefix] */
    int32_t n_prefix, n_suffix;
    uint64_t seed;
} prompt_set;

/* Write request `index`'s prompt (n_prefix + n_suffix ids) to out. */
static void make_prompt(const prompt_set *ps, int32_t index, int32_t *out) {
    memcpy(out, ps->prefix, (size_t)ps->n_prefix * sizeof *out);
    uint64_t x = (ps->seed ^ 0xD1B54A32D192ED03ull) * 0x9E3779B97F4A7C15ull + (uint64_t)index + 1;
    if (x == 0) x = 1;
    for (int32_t i = 0; i < ps->n_suffix; i++)
        out[ps->n_prefix + i] = ps->ord[bench_xorshift(&x) % (uint64_t)ps->n_ord];
}

/* Clients sharing one engine: request i (first <= i < first + n) goes to whichever client
 * takes it next. */
typedef struct client_pool {
    kiln_engine *e;
    const prompt_set *ps;
    int32_t gen_tokens;
    int32_t first, n;
    atomic_int next;
    bench_req *reqs; /* [n] */
} client_pool;

static void *client_main(void *arg) {
    client_pool *cp = arg;
    int32_t len = cp->ps->n_prefix + cp->ps->n_suffix;
    int32_t *ids = malloc((size_t)len * sizeof *ids);
    for (;;) {
        int32_t k = atomic_fetch_add(&cp->next, 1);
        if (k >= cp->n) break;
        bench_req *r = &cp->reqs[k];
        if (!ids) {
            r->finish = KILN_FINISH_ERROR;
            kiln_error_set(&r->err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
            continue;
        }
        make_prompt(cp->ps, cp->first + k, ids);
        kiln_request rq = kiln_request_defaults();
        rq.temperature = 0.0f;
        rq.max_tokens = cp->gen_tokens;
        rq.ignore_eos = true;
        rq.prompt_ids = ids;
        rq.n_prompt_ids = len;
        r->t_submit = cli_now_ms();
        if (kiln_engine_submit(cp->e, &rq, &r->stream, &r->err) != KILN_OK) {
            r->finish = KILN_FINISH_ERROR;
            continue;
        }
        bench_consume(r);
        kiln_stream_destroy(r->stream);
        r->stream = NULL;
    }
    free(ids);
    return NULL;
}

/* One phase's row. */
typedef struct phase_row {
    const char *name;
    bool warmup;                         /* an uncounted request ran first */
    int32_t n;                           /* measured requests */
    double wall_s;                       /* first submit to last finish */
    double ttft_p50, ttft_p99, ttft_sum; /* ms */
    double tps_all, tps_gen;
    double cached_per_req;
    int64_t prompt_tokens, gen_tokens;
    kiln_engine_stats d;         /* counters over the measured requests; gauges at the end */
    int64_t disk_files_at_start; /* restart: what the fresh engine found in the directory */
    double disk_mb_s;            /* disk_read_bytes / ttft_sum */
} phase_row;

/* The counters of b minus those of a (the gauges as b has them). */
static kiln_engine_stats stats_delta(const kiln_engine_stats *a, const kiln_engine_stats *b) {
    kiln_engine_stats d = *b;
    d.n_steps -= a->n_steps;
    d.n_prefill_tokens -= a->n_prefill_tokens;
    d.n_decode_tokens -= a->n_decode_tokens;
    d.n_requests_finished -= a->n_requests_finished;
    d.prefix_hit_requests -= a->prefix_hit_requests;
    d.prefix_miss_requests -= a->prefix_miss_requests;
    d.prefix_hit_tokens -= a->prefix_hit_tokens;
    d.prefix_miss_tokens -= a->prefix_miss_tokens;
    d.kv_evictions -= a->kv_evictions;
    d.preemptions -= a->preemptions;
    d.disk_reads -= a->disk_reads;
    d.disk_writes -= a->disk_writes;
    d.disk_read_bytes -= a->disk_read_bytes;
    d.disk_write_bytes -= a->disk_write_bytes;
    d.disk_corrupt -= a->disk_corrupt;
    return d;
}

/* Run requests [first, first + n) over `clients` threads on e and fill row (not name,
 * warmup, disk_files_at_start). Returns 0 or KILN_EXIT_ERROR (printed). */
static int run_requests(kiln_engine *e, const prompt_set *ps, int32_t gen_tokens, int32_t first,
                        int32_t n, int32_t clients, phase_row *row) {
    int rc = 0;
    if (clients > n) clients = n;
    client_pool cp = {.e = e, .ps = ps, .gen_tokens = gen_tokens, .first = first, .n = n};
    atomic_init(&cp.next, 0);
    cp.reqs = calloc((size_t)n, sizeof *cp.reqs);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    double *ttft = calloc((size_t)n, sizeof *ttft);
    if (!cp.reqs || !th || !ttft) {
        fprintf(stderr, "kiln: error: out of memory\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    kiln_engine_stats s0, s1;
    kiln_engine_get_stats(e, &s0);
    double t0 = cli_now_ms();
    int32_t started = 0;
    for (; started < clients; started++)
        if (pthread_create(&th[started], NULL, client_main, &cp) != 0) break;
    if (started == 0) client_main(&cp); /* no thread could start: run them here, one by one */
    for (int32_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    kiln_engine_get_stats(e, &s1);
    double t_end = t0, ttft_sum = 0;
    int64_t cached = 0, prompt = 0, gen = 0;
    for (int32_t i = 0; i < n; i++) {
        bench_req *r = &cp.reqs[i];
        if (r->finish == KILN_FINISH_ERROR) {
            rc = cli_fail(&r->err);
            goto done;
        }
        if (r->t_end > t_end) t_end = r->t_end;
        ttft[i] = r->t_first - r->t_submit;
        ttft_sum += ttft[i];
        cached += r->cached_tokens;
        prompt += r->prompt_tokens;
        gen += r->n_tokens;
    }
    qsort(ttft, (size_t)n, sizeof *ttft, bench_cmp_double);
    row->n = n;
    row->wall_s = (t_end - t0) / 1e3;
    row->ttft_p50 = bench_percentile(ttft, n, 50);
    row->ttft_p99 = bench_percentile(ttft, n, 99);
    row->ttft_sum = ttft_sum;
    row->prompt_tokens = prompt;
    row->gen_tokens = gen;
    row->tps_all = row->wall_s > 0 ? (double)(prompt + gen) / row->wall_s : 0;
    row->tps_gen = row->wall_s > 0 ? (double)gen / row->wall_s : 0;
    row->cached_per_req = (double)cached / n;
    row->d = stats_delta(&s0, &s1);
    row->disk_mb_s = ttft_sum > 0 ? (double)row->d.disk_read_bytes / 1e6 / (ttft_sum / 1e3) : 0;
done:
    free(cp.reqs);
    free(th);
    free(ttft);
    return rc;
}

static int make_engine(const kiln_model *m, const kiln_engine_params *ep, kiln_engine **e) {
    kiln_error err = {0};
    if (kiln_engine_create(m, ep, e, &err) != KILN_OK) return cli_fail(&err);
    return 0;
}

/* off / on: a fresh engine, one uncounted warm-up request (index o->requests), then the
 * measured requests 0 .. requests-1. */
static int phase_ram(const kiln_model *m, const kiln_engine_params *ep, const prompt_set *ps,
                     const bench_prefix_opts *o, const char *name, phase_row *row,
                     kiln_engine_params *used) {
    kiln_engine *e = NULL;
    int rc = make_engine(m, ep, &e);
    if (!rc) kiln_engine_get_params(e, used); /* the engine's choice of threads, block size */
    phase_row warm;
    if (!rc) rc = run_requests(e, ps, o->gen_tokens, o->requests, 1, 1, &warm);
    if (!rc) rc = run_requests(e, ps, o->gen_tokens, 0, o->requests, o->clients, row);
    row->name = name;
    row->warmup = true;
    kiln_engine_destroy(e);
    return rc;
}

/* restart: populate the directory with one request (index requests) on one engine, destroy
 * it, then measure the first request (index requests + 1) of a fresh engine on the same
 * directory. */
static int phase_restart(const kiln_model *m, const kiln_engine_params *ep, const prompt_set *ps,
                         const bench_prefix_opts *o, phase_row *row) {
    kiln_engine *e = NULL;
    phase_row fill;
    int rc = make_engine(m, ep, &e);
    if (!rc) rc = run_requests(e, ps, o->gen_tokens, o->requests, 1, 1, &fill);
    kiln_engine_destroy(e); /* writes its cached blocks behind, to the directory */
    e = NULL;
    if (!rc) rc = make_engine(m, ep, &e);
    if (!rc) {
        kiln_engine_stats st;
        kiln_engine_get_stats(e, &st);
        row->disk_files_at_start = st.disk_files;
        rc = run_requests(e, ps, o->gen_tokens, o->requests + 1, 1, 1, row);
    }
    row->name = "restart";
    row->warmup = false;
    kiln_engine_destroy(e);
    return rc;
}

static json_t *row_json(const phase_row *r) {
    return json_pack(
        "{s:s, s:i, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, "
        "s:I, s:I, s:I, s:I, s:f, s:I, s:I}",
        "phase", r->name, "requests", r->n, "warmup_request", r->warmup, "wall_s", r->wall_s,
        "ttft_ms_p50", r->ttft_p50, "ttft_ms_p99", r->ttft_p99, "total_tok_s", r->tps_all,
        "gen_tok_s", r->tps_gen, "cached_tokens_per_request", r->cached_per_req, "prompt_tokens",
        (json_int_t)r->prompt_tokens, "gen_tokens", (json_int_t)r->gen_tokens,
        "prefix_hit_requests", (json_int_t)r->d.prefix_hit_requests, "prefix_miss_requests",
        (json_int_t)r->d.prefix_miss_requests, "prefix_hit_tokens",
        (json_int_t)r->d.prefix_hit_tokens, "kv_evictions", (json_int_t)r->d.kv_evictions,
        "preemptions", (json_int_t)r->d.preemptions, "disk_reads", (json_int_t)r->d.disk_reads,
        "disk_read_bytes", (json_int_t)r->d.disk_read_bytes, "disk_corrupt",
        (json_int_t)r->d.disk_corrupt, "disk_read_mb_s", r->disk_mb_s, "disk_files",
        (json_int_t)r->d.disk_files, "disk_files_at_start", (json_int_t)r->disk_files_at_start);
}

int bench_prefix_run(const char *model_path, const kiln_model_params *lp,
                     const kiln_engine_params *ep0, const bench_prefix_opts *o) {
    int rc = 0;
    kiln_error err = {0};
    kiln_model *m = NULL;
    int32_t *ord = NULL, n_ord = 0;
    prompt_set ps = {.n_prefix = o->prefix_tokens, .n_suffix = o->suffix_tokens, .seed = o->seed};
    phase_row rows[3];
    memset(rows, 0, sizeof rows);
    int n_rows = 0;
    if (kiln_model_load(model_path, lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if (!(ord = bench_ordinary_tokens(m, &n_ord)) || n_ord == 0) {
        fprintf(stderr, "kiln: error: the vocabulary has no ordinary tokens to build prompts\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    ps.ord = ord;
    ps.n_ord = n_ord;
    if (!(ps.prefix = malloc((size_t)o->prefix_tokens * sizeof *ps.prefix))) {
        fprintf(stderr, "kiln: error: out of memory\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 0x5EED;
    if (x == 0) x = 1;
    for (int32_t i = 0; i < o->prefix_tokens; i++)
        ps.prefix[i] = ord[bench_xorshift(&x) % (uint64_t)n_ord];

    /* The engine: the context stretched to fit a request (as the plain bench does), a pool for
     * every client's request plus a partial block each and one more request's worth, so the
     * cache can keep the prefix while the clients run. */
    kiln_engine_params ep = *ep0;
    int64_t per_req = (int64_t)o->prefix_tokens + o->suffix_tokens + o->gen_tokens;
    if ((rc = bench_fit_ctx(m, &ep, per_req)) != 0) goto done;
    int32_t bs = ep.block_size > 0 ? ep.block_size : 16;
    if (ep.kv_memory == 0 && ep.kv_tokens == 0 && ep.memory_budget == 0 && ep.gpu_memory == 0) {
        int64_t want = ((int64_t)o->clients + 1) * (per_req + bs);
        ep.kv_tokens = want > INT32_MAX ? INT32_MAX : (int32_t)want;
    }
    const char *dir = ep.cache_dir && ep.cache_dir[0] ? ep.cache_dir : NULL;
    ep.cache_dir = NULL; /* off and on: RAM only */
    int64_t disk_max = ep.cache_disk_max;
    ep.cache_disk_max = 0;

    kiln_engine_params used = ep;
    ep.no_prefix_cache = true;
    if ((rc = phase_ram(m, &ep, &ps, o, "off", &rows[n_rows++], &used))) goto done;
    ep.no_prefix_cache = false;
    if ((rc = phase_ram(m, &ep, &ps, o, "on", &rows[n_rows++], &used))) goto done;
    if (dir) {
        ep.cache_dir = dir;
        ep.cache_disk_max = disk_max;
        if ((rc = phase_restart(m, &ep, &ps, o, &rows[n_rows++]))) goto done;
    }

    if (o->json) {
        json_t *arr = json_array();
        for (int i = 0; i < n_rows; i++) json_array_append_new(arr, row_json(&rows[i]));
        json_t *j =
            json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:s?, s:o}", "model",
                      model_path, "mode", "shared_prefix", "prefix_tokens", o->prefix_tokens,
                      "suffix_tokens", o->suffix_tokens, "gen_tokens", o->gen_tokens, "clients",
                      o->clients, "requests", o->requests, "threads", used.n_threads, "kv_type",
                      cli_kv_type_label(&ep), "block_size",
                      used.block_size > 0 ? used.block_size : bs, "cache_dir", dir, "phases", arr);
        if (cli_print_json(j)) rc = KILN_EXIT_ERROR;
    } else {
        printf("kiln bench --shared-prefix: %s | prefix %d + suffix %d tokens, gen %d | %d "
               "clients, %d requests per phase | %d threads | KV %s, blocks of %d\n",
               model_path, o->prefix_tokens, o->suffix_tokens, o->gen_tokens, o->clients,
               o->requests, used.n_threads, cli_kv_type_label(&ep),
               used.block_size > 0 ? used.block_size : bs);
        printf("%-8s %8s %12s %12s %15s %10s %11s %9s %11s %10s %10s\n", "phase", "requests",
               "TTFT p50 ms", "TTFT p99 ms", "prompt+gen t/s", "gen t/s", "cached/req", "hit reqs",
               "disk reads", "disk MB", "disk MB/s");
        for (int i = 0; i < n_rows; i++) {
            const phase_row *r = &rows[i];
            printf("%-8s %8d %12.2f %12.2f %15.1f %10.1f %11.1f %9lld %11lld %10.3f %10.1f\n",
                   r->name, r->n, r->ttft_p50, r->ttft_p99, r->tps_all, r->tps_gen,
                   r->cached_per_req, (long long)r->d.prefix_hit_requests,
                   (long long)r->d.disk_reads, (double)r->d.disk_read_bytes / 1e6, r->disk_mb_s);
        }
        printf("off and on: fresh engines, one warm-up request first (not counted; in on it "
               "puts the prefix in the cache)");
        if (dir)
            printf("; restart: the first request of a fresh engine over %s, filled by an "
                   "engine destroyed before (%lld block files found)",
                   dir, (long long)rows[n_rows - 1].disk_files_at_start);
        printf("\n");
    }
    if (dir && rows[n_rows - 1].cached_per_req == 0)
        fprintf(stderr,
                "kiln bench: note: the restart's first request took no prefix blocks from %s "
                "(cached 0)\n",
                dir);
    fflush(stdout);
done:
    free(ps.prefix);
    free(ord);
    kiln_model_free(m);
    return rc;
}
