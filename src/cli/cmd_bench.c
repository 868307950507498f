/*
 * cmd_bench.c - `kiln bench`: serving throughput of the engine, in process.
 *
 * For each concurrency C, C requests with synthetic prompts (deterministic pseudo-random
 * ordinary tokens: no control or end-of-generation ids) are submitted at once; each asks for
 * exactly --gen-tokens greedy tokens (ignore_eos). One consumer thread per request reads its
 * stream; times are the engine's event timestamps (kiln_event.time_ns), so a consumer
 * thread that wakes late does not skew them. Reported per level:
 *   total gen tok/s        all generated tokens / wall time (first submit to last finish)
 *   per-request gen tok/s  mean over requests of (tokens - 1) / (last token - first token)
 *   prefill tok/s          all prompt tokens / time until the last request's first token
 *   TTFT p50, p99          submit to first token (nearest-rank percentiles)
 *   cached/req             mean prompt tokens per request that came from the prefix cache
 *                          (usage.cached_tokens; 0 unless prompts repeat, e.g. a level listed
 *                          twice, or --cache-dir holds an earlier run's blocks)
 *   peak KV blocks         most blocks in use during the level
 *   CPU s                  CPU time the whole process used during the level (all threads);
 *                          steadier than wall time on a shared machine
 * A short warm-up request runs first. The engine is created once, with a pool sized for
 * the largest level (unless --kv-memory/--kv-tokens say otherwise).
 * --shared-prefix N runs the prefix-cache benchmark instead (bench_prefix.c), --spec MODE
 * and --verify-scaling the speculative-decoding one (bench_spec.c).
 */
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "engine/generate.h"
#include "util/error.h"

#define BENCH_MAX_LEVELS      16
#define BENCH_MAX_CONCURRENCY 4096

static void bench_usage(FILE *f) {
    fprintf(
        f,
        "usage: kiln bench -m MODEL [options]\n"
        "\n"
        "  -m, --model PATH        GGUF file, llama2.c checkpoint, or Hugging Face directory\n"
        "      --tokenizer FILE    llama2.c tokenizer.bin (default: beside the checkpoint)\n"
        "      --concurrency LIST  comma-separated request counts (default 1,4,16)\n"
        "      --prompt-tokens N   prompt length of every request (default 128)\n"
        "      --gen-tokens N      tokens generated per request (default 128)\n"
        "  -t, --threads N         compute threads (default: physical cores; 1 below ~4M weights)\n"
        "      --kv-type T         KV cache storage, K and V: f32 (default), f16, bf16,\n"
        "                          q8_0, q4_0 (ggml blocks of 32; kv_dim %% 32 == 0), or\n"
            "                          turbo:kBvB (TurboQuant: K at B bits, V at B bits,\n"
            "                          B in 1..8, Bq adds the QJL bit; turbo = turbo:k8v3;\n"
            "                          head size a power of two)\n"
        "      --kv-type-k T       K's storage (overrides --kv-type for K; of a\n"
            "                          turbo:kBvB config it takes the K side)\n"
        "      --kv-type-v T       V's storage (overrides --kv-type for V; of a\n"
            "                          turbo:kBvB config it takes the V side)\n"
        "      --kv-quant-start N  keep blocks in f16 until a sequence passes N tokens,\n"
        "                          then convert its full blocks (default 0: from the start)\n"
        "      --kv-memory SIZE    KV pool size: bytes, or with K/M/G/T or KB/MB/GB/TB\n"
        "                          (default: enough for the largest level)\n"
        "      --kv-tokens N       KV pool size in positions\n"
        "      --gpu-memory M      GPU memory for weights + KV pool + scratch: a fraction\n"
        "                          of the GPU's total (0.9) or a size (60G); the pool gets\n"
        "                          the rest (the model on a GPU; excludes --kv-memory,\n"
        "                          --kv-tokens, --memory-budget)\n"
        "      --step-tokens N     tokens per engine step (default 512)\n"
        "      --prefill-chunk N   prompt tokens per sequence per step (default: --step-tokens)\n"
        "      --ctx N             positions per sequence (default: the model's, stretched to\n"
        "                          fit prompt + generated tokens)\n"
        "      --block-size N, --max-seqs N, --max-queue N\n"
        "                          engine limits, as for kiln serve\n"
        "      --no-prefix-cache   compute every prompt token (no prefix cache)\n"
        "      --kv-keep-window    keep every KV block of sliding-window layers (default:\n"
        "                          blocks outside the window are freed; prefix hits then\n"
        "                          end where a window was checkpointed, no --cache-dir)\n"
        "      --cache-dir DIR     disk tier of the prefix cache (see kiln serve --help)\n"
        "      --cache-disk-max SIZE\n"
        "                          most bytes DIR may hold (default 16G)\n"
        "      --seed S            seed of the synthetic prompts (default 1)\n"
        "      --json              print one JSON object instead of a table\n"
        "      --device D          auto (default), cpu, cuda or cuda:N (as for kiln run)\n"
        "\n"
        "shared prefix (what the prefix cache buys; replaces --concurrency, --prompt-tokens):\n"
        "      --shared-prefix N   every prompt starts with the same N synthetic tokens; runs\n"
        "                          the phases off (no prefix cache), on (the RAM cache, warmed\n"
        "                          by one uncounted request) and, with --cache-dir, restart\n"
        "                          (the first request of a fresh engine over the directory an\n"
        "                          earlier engine filled: its prefix comes from disk)\n"
        "      --suffix-tokens N   tokens of each prompt after the prefix, unique per request\n"
        "                          (default 16)\n"
        "      --clients C         client threads submitting to the one engine (default 4)\n"
        "      --requests R        measured requests per phase (default 16)\n"
        "                          (--gen-tokens defaults to 16 here)\n"
        "\n"
        "speculative decoding (plain and speculative phases interleaved in one run, greedy,\n"
        "prefix cache off; reports decode tok/s, acceptance and whether outputs match):\n"
        "      --spec MODE         ngram (prompt lookup), random (random drafts), draft:PATH (a\n"
        "                          draft model), prediction:self (the prediction is the\n"
        "                          request's own plain output) or prediction:edit=P (that\n"
        "                          output with P%% of its tokens replaced, from --seed)\n"
        "      --spec-k N          most drafts per verify step, [1, 32] (default: 32\n"
        "                          for a prediction, 8 for the others)\n"
        "      --spec-ngram MIN:MAX\n"
        "                          n-gram sizes of ngram (default 1:4)\n"
        "      --requests R        requests per phase per level (default 3; at least the\n"
        "                          level's concurrency)\n"
        "      --concurrency LIST  requests submitted together (default 1)\n"
        "      --prompt-file FILE  prompts from FILE's text, tokenized: --prompt-tokens N from\n"
        "                          successive offsets (default: the whole file per request)\n"
        "      --verify-scaling    also (or alone: only) the cost of one forward of M = 1, 2,\n"
        "                          5, 9, 17, 33 tokens as prefill and as a verify step, as a\n"
        "                          ratio to M = 1\n");
}

typedef struct bench_level {
    int32_t concurrency;
    double wall_s, cpu_s, total_tps, per_req_tps, prefill_tps, ttft_p50, ttft_p99;
    double cached_per_req; /* mean usage.cached_tokens */
    int32_t peak_blocks;
} bench_level;

static int run_level(kiln_engine *e, const int32_t *ord, int32_t n_ord, int32_t c,
                     int32_t prompt_tokens, int32_t gen_tokens, uint64_t seed, bench_level *out) {
    int rc = 0;
    int32_t *prompts = malloc((size_t)c * (size_t)prompt_tokens * sizeof *prompts);
    bench_req *reqs = calloc((size_t)c, sizeof *reqs);
    pthread_t *th = calloc((size_t)c, sizeof *th);
    double *ttft = calloc((size_t)c, sizeof *ttft);
    if (!prompts || !reqs || !th || !ttft) {
        fprintf(stderr, "kiln: error: out of memory\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)c;
    for (size_t i = 0; i < (size_t)c * (size_t)prompt_tokens; i++)
        prompts[i] = ord[bench_xorshift(&x) % (uint64_t)n_ord];
    kiln_engine_reset_peak(e);
    kiln_request rq = kiln_request_defaults();
    rq.temperature = 0.0f;
    rq.max_tokens = gen_tokens;
    rq.ignore_eos = true;
    rq.n_prompt_ids = prompt_tokens;
    double t0 = cli_now_ms(), cpu0 = bench_cpu_now_s();
    int32_t started = 0;
    for (int32_t i = 0; i < c; i++) {
        rq.prompt_ids = prompts + (size_t)i * prompt_tokens;
        reqs[i].t_submit = cli_now_ms();
        kiln_error err = {0};
        if (kiln_engine_submit(e, &rq, &reqs[i].stream, &err) != KILN_OK) {
            rc = cli_fail(&err);
            break;
        }
        if (pthread_create(&th[i], NULL, bench_consume, &reqs[i]) != 0) {
            fprintf(stderr, "kiln: error: cannot start a consumer thread\n");
            kiln_stream_cancel(reqs[i].stream);
            bench_consume(&reqs[i]);
            rc = KILN_EXIT_ERROR;
            started = i;
            break;
        }
        started = i + 1;
    }
    for (int32_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    out->cpu_s = bench_cpu_now_s() - cpu0;
    if (rc) goto done;
    double t_end = t0, t_first_max = t0, per_req = 0;
    int64_t total_tokens = 0, cached = 0;
    for (int32_t i = 0; i < c; i++) {
        bench_req *r = &reqs[i];
        if (r->finish == KILN_FINISH_ERROR) {
            rc = cli_fail(&r->err);
            goto done;
        }
        if (r->t_end > t_end) t_end = r->t_end;
        if (r->t_first > t_first_max) t_first_max = r->t_first;
        ttft[i] = r->t_first - r->t_submit;
        total_tokens += r->n_tokens;
        cached += r->cached_tokens;
        if (r->n_tokens > 1 && r->t_last > r->t_first)
            per_req += (r->n_tokens - 1) * 1e3 / (r->t_last - r->t_first);
    }
    qsort(ttft, (size_t)c, sizeof *ttft, bench_cmp_double);
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    out->concurrency = c;
    out->wall_s = (t_end - t0) / 1e3;
    out->total_tps = out->wall_s > 0 ? (double)total_tokens / out->wall_s : 0;
    out->per_req_tps = per_req / c;
    out->prefill_tps = t_first_max > t0 ? (double)c * prompt_tokens * 1e3 / (t_first_max - t0) : 0;
    out->ttft_p50 = bench_percentile(ttft, c, 50);
    out->ttft_p99 = bench_percentile(ttft, c, 99);
    out->peak_blocks = st.kv_blocks_peak;
    out->cached_per_req = (double)cached / c;
done:
    for (int32_t i = 0; reqs && i < c; i++) kiln_stream_destroy(reqs[i].stream);
    free(prompts);
    free(reqs);
    free(th);
    free(ttft);
    return rc;
}

/* getopt_long codes of bench's own long options without a short form. */
enum {
    BENCH_OPT_SPEC = 0x200,
    BENCH_OPT_PROMPT_FILE,
    BENCH_OPT_VERIFY_SCALING,
};

int kiln_cmd_bench(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"tokenizer", required_argument, 0, 'T'},
        {"concurrency", required_argument, 0, 'c'},
        {"prompt-tokens", required_argument, 0, 'p'},
        {"gen-tokens", required_argument, 0, 'g'},
        CLI_ENGINE_LONG_OPTIONS,
        {"seed", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},
        {"device", required_argument, 0, CLI_OPT_DEVICE},
        {"shared-prefix", required_argument, 0, 'S'},
        {"suffix-tokens", required_argument, 0, 'u'},
        {"clients", required_argument, 0, 'C'},
        {"requests", required_argument, 0, 'R'},
        {"spec", required_argument, 0, BENCH_OPT_SPEC},
        {"spec-k", required_argument, 0, CLI_OPT_SPEC_K},
        {"spec-ngram", required_argument, 0, CLI_OPT_SPEC_NGRAM},
        {"prompt-file", required_argument, 0, BENCH_OPT_PROMPT_FILE},
        {"verify-scaling", no_argument, 0, BENCH_OPT_VERIFY_SCALING},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL;
    kiln_model_params lp = {0};
    kiln_engine_params ep = kiln_engine_default_params();
    int32_t levels[BENCH_MAX_LEVELS] = {1, 4, 16}, n_levels = 3;
    int64_t prompt_tokens = 128, gen_tokens = 128, v;
    uint64_t seed = 1;
    bool json = false;
    /* --shared-prefix: 0 = the concurrency levels; which options the user gave, to refuse
     * those of the other mode */
    bench_prefix_opts po = {.suffix_tokens = 16, .clients = 4, .requests = 16};
    bool levels_given = false, prompt_given = false, gen_given = false, prefix_only = false;
    bool requests_given = false, spec_only = false;
    /* --spec / --verify-scaling */
    bench_spec_opts so = {.requests = 3};
    cli_spec cs = {0};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:t:h", opts, NULL)) != -1) {
        int er = cli_engine_option("bench", c, optarg, &ep);
        if (er < 0 && (c == CLI_OPT_SPEC_K || c == CLI_OPT_SPEC_NGRAM)) {
            er = cli_spec_option("bench", c, optarg, &ep, &cs);
            spec_only = true;
        }
        if (er >= 0) {
            if (er) return er;
            continue;
        }
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case 'T':
            lp.tokenizer_path = optarg;
            break;
        case 'c': {
            levels_given = true;
            n_levels = 0;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", optarg);
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save)) {
                if (n_levels == BENCH_MAX_LEVELS ||
                    !cli_parse_i64(tok, 1, BENCH_MAX_CONCURRENCY, &v))
                    return cli_usage_error("bench",
                                           "--concurrency must be a list of at most %d integers "
                                           "in [1, %d] (got '%s')",
                                           BENCH_MAX_LEVELS, BENCH_MAX_CONCURRENCY, optarg);
                levels[n_levels++] = (int32_t)v;
            }
            if (n_levels == 0) return cli_usage_error("bench", "--concurrency is empty");
            break;
        }
        case 'p':
            prompt_given = true;
            if (!cli_parse_i64(optarg, 1, 1 << 20, &prompt_tokens))
                return cli_usage_error(
                    "bench", "--prompt-tokens must be in [1, 1048576] (got '%s')", optarg);
            break;
        case 'g':
            gen_given = true;
            if (!cli_parse_i64(optarg, 1, 1 << 20, &gen_tokens))
                return cli_usage_error("bench", "--gen-tokens must be in [1, 1048576] (got '%s')",
                                       optarg);
            break;
        case 's':
            if (!cli_parse_u64(optarg, &seed))
                return cli_usage_error(
                    "bench", "--seed must be an integer in [0, 18446744073709551615] (got '%s')",
                    optarg);
            break;
        case 'j':
            json = true;
            break;
        case CLI_OPT_DEVICE:
            if (!cli_parse_device(optarg, &lp))
                return cli_usage_error("bench", "--device must be auto, cpu, cuda or cuda:N (got '%s')",
                                       optarg);
            break;
        case 'S':
            if (!cli_parse_i64(optarg, 1, 1 << 20, &v))
                return cli_usage_error(
                    "bench", "--shared-prefix must be an integer in [1, 1048576] (got '%s')",
                    optarg);
            po.prefix_tokens = (int32_t)v;
            break;
        case 'u':
        case 'C':
        case 'R': {
            static const struct {
                int opt;
                const char *name;
                int64_t hi;
            } lim[] = {{'u', "--suffix-tokens", 1 << 16},
                       {'C', "--clients", BENCH_MAX_CONCURRENCY},
                       {'R', "--requests", 1 << 20}};
            int k = c == 'u' ? 0 : c == 'C' ? 1 : 2;
            if (!cli_parse_i64(optarg, 1, lim[k].hi, &v))
                return cli_usage_error("bench", "%s must be an integer in [1, %lld] (got '%s')",
                                       lim[k].name, (long long)lim[k].hi, optarg);
            *(c == 'u' ? &po.suffix_tokens : c == 'C' ? &po.clients : &po.requests) = (int32_t)v;
            if (c == 'R') {
                requests_given = true;
                so.requests = (int32_t)v;
            } else {
                prefix_only = true;
            }
            break;
        }
        case BENCH_OPT_SPEC:
            if ((er = bench_spec_parse_mode(optarg, &so))) return er;
            break;
        case BENCH_OPT_PROMPT_FILE:
            if (!optarg[0]) return cli_usage_error("bench", "--prompt-file needs a file");
            so.prompt_file = optarg;
            spec_only = true;
            break;
        case BENCH_OPT_VERIFY_SCALING:
            so.verify_scaling = true;
            break;
        case 'h':
            bench_usage(stdout);
            return 0;
        default:
            return cli_bad_option("bench", c, argv);
        }
    }
    if (optind < argc) return cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    if (!model_path) return cli_usage_error("bench", "-m MODEL is required");
    if ((c = cli_engine_check("bench", &ep))) return c;
    if (so.mode != BENCH_SPEC_NONE || so.verify_scaling) {
        if (po.prefix_tokens > 0)
            return cli_usage_error("bench", "--spec and --verify-scaling cannot be used with "
                                            "--shared-prefix");
        if (prefix_only)
            return cli_usage_error("bench", "--clients and --suffix-tokens need --shared-prefix "
                                            "(--spec takes --concurrency and --requests)");
        if (ep.cache_dir || ep.cache_disk_max > 0)
            return cli_usage_error("bench", "--spec runs with the prefix cache off: --cache-dir "
                                            "and --cache-disk-max do not apply");
        if (so.mode == BENCH_SPEC_NONE &&
            (requests_given || levels_given || prompt_given || so.prompt_file || spec_only))
            return cli_usage_error("bench", "--verify-scaling alone takes only --gen-tokens "
                                            "and the engine options; --requests, --concurrency, "
                                            "--prompt-tokens, --prompt-file, --spec-k and "
                                            "--spec-ngram need --spec MODE");
        if (levels_given) {
            memcpy(so.levels, levels, (size_t)n_levels * sizeof *levels);
            so.n_levels = n_levels;
        } else {
            so.levels[0] = 1;
            so.n_levels = 1;
        }
        so.prompt_tokens = prompt_given ? (int32_t)prompt_tokens : 0;
        so.gen_tokens = (int32_t)gen_tokens;
        so.spec_k = ep.spec_k;
        so.seed = seed;
        so.json = json;
        return bench_spec_run(model_path, &lp, &ep, &so);
    }
    if (spec_only)
        return cli_usage_error("bench",
                               "--spec-k, --spec-ngram and --prompt-file need --spec MODE");
    if (requests_given && po.prefix_tokens == 0)
        prefix_only = true; /* --requests without a mode: refused below */
    if (po.prefix_tokens > 0) {
        if (levels_given || prompt_given)
            return cli_usage_error("bench", "--shared-prefix sets the prompts and the clients: "
                                            "it cannot be used with --concurrency or "
                                            "--prompt-tokens (use --clients, --suffix-tokens)");
        if (ep.no_prefix_cache)
            return cli_usage_error("bench", "--shared-prefix runs with the prefix cache off and "
                                            "on: --no-prefix-cache does not apply");
        po.gen_tokens = gen_given ? (int32_t)gen_tokens : 16;
        po.seed = seed;
        po.json = json;
        return bench_prefix_run(model_path, &lp, &ep, &po);
    }
    if (prefix_only)
        return cli_usage_error("bench", "--clients, --requests and --suffix-tokens need "
                                        "--shared-prefix (--requests also goes with --spec)");

    int rc = 0;
    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_engine *e = NULL;
    int32_t *ord = NULL, n_ord = 0;
    bench_level res[BENCH_MAX_LEVELS];
    if (kiln_model_load(model_path, &lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    int32_t max_c = 0;
    for (int32_t i = 0; i < n_levels; i++) max_c = levels[i] > max_c ? levels[i] : max_c;
    int64_t per_req = prompt_tokens + gen_tokens;
    /* The synthetic requests may be longer than the model was trained for; the engine's
     * context is stretched to fit them (RoPE extrapolates; the numbers stay meaningful for
     * speed, not for text quality). */
    if ((rc = bench_fit_ctx(m, &ep, per_req)) != 0) goto done;
    if (ep.kv_memory == 0 && ep.kv_tokens == 0 && ep.memory_budget == 0 && ep.gpu_memory == 0) {
        int64_t want = (int64_t)max_c * (per_req + 16); /* + a partial block each */
        ep.kv_tokens = want > INT32_MAX ? INT32_MAX : (int32_t)want;
    }
    if (ep.max_seqs == 0) ep.max_seqs = max_c > 256 ? max_c : 256;
    if (ep.max_queue == 0) ep.max_queue = max_c > 4096 ? max_c : 4096;
    if (kiln_engine_create(m, &ep, &e, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    kiln_engine_params used;
    kiln_engine_get_params(e, &used); /* the engine's choice when --threads is not given */
    int32_t n_threads = used.n_threads;
    if (!(ord = bench_ordinary_tokens(m, &n_ord)) || n_ord == 0) {
        fprintf(stderr, "kiln: error: the vocabulary has no ordinary tokens to build prompts\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    bench_level warm;
    int32_t wp = prompt_tokens < 16 ? (int32_t)prompt_tokens : 16;
    int32_t wg = gen_tokens < 8 ? (int32_t)gen_tokens : 8;
    if ((rc = run_level(e, ord, n_ord, 1, wp, wg, seed + 1000, &warm))) goto done;
    for (int32_t i = 0; i < n_levels; i++) {
        if ((rc = run_level(e, ord, n_ord, levels[i], (int32_t)prompt_tokens, (int32_t)gen_tokens,
                            seed, &res[i])))
            goto done;
        if (!json) {
            if (i == 0) {
                kiln_engine_stats st;
                kiln_engine_get_stats(e, &st);
                printf("kiln bench: %s | prompt %lld, gen %lld tokens | %d threads | KV %s/%s, "
                       "%d blocks of %d, %.1f bytes/token | step %d tokens\n",
                       model_path, (long long)prompt_tokens, (long long)gen_tokens, n_threads,
                       used.kv_type_k, used.kv_type_v, st.kv_blocks_total, st.block_size,
                       (double)st.kv_bytes / ((double)st.kv_blocks_total * st.block_size),
                       ep.step_tokens ? ep.step_tokens : 512);
                printf("%11s %8s %8s %14s %16s %12s %12s %12s %11s %8s\n", "concurrency", "wall s",
                       "CPU s", "total gen t/s", "per-req gen t/s", "prefill t/s", "TTFT p50 ms",
                       "TTFT p99 ms", "cached/req", "peak KV");
            }
            printf("%11d %8.3f %8.3f %14.1f %16.1f %12.1f %12.1f %12.1f %11.1f %8d\n",
                   res[i].concurrency, res[i].wall_s, res[i].cpu_s, res[i].total_tps,
                   res[i].per_req_tps, res[i].prefill_tps, res[i].ttft_p50, res[i].ttft_p99,
                   res[i].cached_per_req, res[i].peak_blocks);
            fflush(stdout);
        }
    }
    if (json) {
        kiln_engine_stats st;
        kiln_engine_get_stats(e, &st);
        json_t *arr = json_array();
        for (int32_t i = 0; i < n_levels; i++)
            json_array_append_new(
                arr, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i}", "concurrency",
                               res[i].concurrency, "wall_s", res[i].wall_s, "cpu_s", res[i].cpu_s,
                               "total_gen_tok_s", res[i].total_tps, "per_request_gen_tok_s",
                               res[i].per_req_tps, "prefill_tok_s", res[i].prefill_tps,
                               "ttft_ms_p50", res[i].ttft_p50, "ttft_ms_p99", res[i].ttft_p99,
                               "cached_tokens_per_request", res[i].cached_per_req, "peak_kv_blocks",
                               res[i].peak_blocks));
        json_t *o = json_pack("{s:s, s:I, s:I, s:i, s:s, s:i, s:i, s:o}", "model", model_path,
                              "prompt_tokens", (json_int_t)prompt_tokens, "gen_tokens",
                              (json_int_t)gen_tokens, "threads", n_threads, "kv_type",
                              cli_kv_type_label(&ep), "kv_blocks_total", st.kv_blocks_total,
                              "block_size", st.block_size, "levels", arr);
        /* the formats in use and the pool's bytes (both block classes) */
        json_object_set_new(o, "kv_type_k", json_string(used.kv_type_k));
        json_object_set_new(o, "kv_type_v", json_string(used.kv_type_v));
        json_object_set_new(o, "kv_quant_start", json_integer(used.kv_quant_start));
        json_object_set_new(o, "kv_bytes", json_integer(st.kv_bytes));
        json_object_set_new(o, "kv_bytes_per_token",
                            json_real((double)st.kv_bytes /
                                      ((double)st.kv_blocks_total * st.block_size)));
        if (cli_print_json(o)) rc = KILN_EXIT_ERROR;
    }
done:
    free(ord);
    kiln_engine_destroy(e);
    kiln_model_free(m);
    return rc;
}
