/*
 * cmd_serve.c - `kiln serve`: the OpenAI-compatible HTTP server (src/server/server.h).
 *
 * The server listens before the model loads (GET /health answers 503 "loading" meanwhile),
 * then serves until SIGINT or SIGTERM: new connections are refused, in-flight requests get
 * --shutdown-timeout seconds to finish, the rest are cancelled (their streams still end with
 * a finish chunk and [DONE]); a second signal cancels at once.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "server/server.h"
#include "util/error.h"

static void serve_usage(FILE *f) {
    fprintf(
        f, "usage: kiln serve -m MODEL [options]\n"
           "\n"
           "  -m, --model PATH          GGUF file, llama2.c checkpoint, or Hugging Face directory\n"
           "      --tokenizer FILE      llama2.c tokenizer.bin (default: beside the checkpoint)\n"
           "      --host ADDR           address to listen on (default 127.0.0.1)\n"
           "      --port N              TCP port, 0 = any free port (default 8080)\n"
           "      --api-key KEY         require 'Authorization: Bearer KEY' (default: the\n"
           "                            KILN_API_KEY environment variable, else none)\n"
           "      --model-name NAME     model id in /v1/models and responses (default: the\n"
           "                            file name without extension); repeat it or give a\n"
           "                            comma list for aliases a request's model may name\n"
           "      --max-body BYTES      request body limit (default 8388608)\n"
           "      --max-connections N   concurrent connections (default 256)\n"
           "      --timeout S           seconds a client may stay silent while sending a\n"
           "                            request or between requests (default 30)\n"
           "      --shutdown-timeout S  seconds in-flight requests get on SIGINT/SIGTERM\n"
           "                            before they are cancelled (default 5)\n"
           "      --response-store-max SIZE  bytes of stored /v1/responses results, for\n"
           "                            previous_response_id and GET /v1/responses/{id}\n"
           "                            (default 64M; 0 = store nothing); least recently\n"
           "                            used ones are evicted first\n"
           "      --response-store-ttl S  seconds a stored response lives (default 3600)\n"
           "  -q, --quiet               no per-request log lines\n"
           "  -v, --verbose             also log libmicrohttpd's messages\n"
           "      --tool-parser F       tool-call markup parsed from chat replies: hermes,\n"
           "                            llama3, mistral, none, or auto (default: the family\n"
           "                            the chat template writes; hermes without one)\n"
           "      --device D            auto (default: the GPU when one is present and runs\n"
           "                            the model, else the CPU), cpu, cuda or cuda:N\n"
           "engine limits:\n"
           "  -t, --threads N           compute threads (default: physical cores; 1 below\n"
           "                            ~4M weights)\n"
           "      --ctx N               positions per sequence (default: the model's)\n"
           "      --kv-type T           KV cache storage, K and V: f32 (default), f16, bf16,\n"
           "                            q8_0, q4_0 (ggml blocks of 32; kv_dim %% 32 == 0), or\n"
            "                            turbo:kBvB (TurboQuant: K at B bits, V at B bits,\n"
            "                            B in 1..8, Bq adds the QJL bit; turbo = turbo:k8v3;\n"
            "                            head size a power of two)\n"
           "      --kv-type-k T         K's storage (overrides --kv-type for K; of a\n"
            "                            turbo:kBvB config it takes the K side)\n"
           "      --kv-type-v T         V's storage (overrides --kv-type for V; of a\n"
            "                            turbo:kBvB config it takes the V side)\n"
           "      --kv-quant-start N    keep blocks in f16 until a sequence passes N tokens,\n"
           "                            then convert its full blocks (default 0: from the start)\n"
           "      --kv-memory SIZE      KV pool size: bytes, or with K/M/G/T (powers of\n"
           "                            1024) or KB/MB/GB/TB (powers of 1000), e.g. 4G\n"
           "      --kv-tokens N         KV pool size in positions (default: 16 contexts or\n"
           "                            2 GiB, whichever is smaller)\n"
           "      --memory-budget SIZE  memory for the whole server: the KV pool gets what\n"
           "                            the weights and step scratch leave (kiln fit's\n"
           "                            arithmetic); excludes --kv-memory / --kv-tokens\n"
           "      --gpu-memory M        GPU memory for the whole server (the model on a GPU):\n"
           "                            a fraction of the GPU's total (0.9) or a size (60G);\n"
           "                            --memory-budget's arithmetic, checked against the\n"
           "                            GPU's free memory; excludes --kv-memory / --kv-tokens\n"
           "      --block-size N        positions per KV block (default 16)\n"
           "      --step-tokens N       tokens per engine step (default 512)\n"
           "      --prefill-chunk N     prompt tokens per sequence per step\n"
           "      --max-seqs N          sequences running at once (default 256)\n"
           "      --max-queue N         requests waiting for admission; more get 503\n"
           "                            (default 4096)\n"
           "prefix cache (on by default: requests that share a prompt prefix share its KV\n"
           "blocks; usage.prompt_tokens_details.cached_tokens says how many):\n"
           "      --no-prefix-cache     compute every prompt token (no prefix cache)\n"
           "      --kv-keep-window      keep every KV block of sliding-window layers (default:\n"
           "                            blocks outside the window are freed; prefix hits then\n"
           "                            end where a window was checkpointed, no --cache-dir)\n"
           "      --cache-dir DIR       also write cached KV blocks to DIR (created if\n"
           "                            absent; one server per DIR): they survive a restart\n"
           "      --cache-disk-max SIZE most bytes DIR may hold (default 16G)\n"
           "speculative decoding (the default for requests; a request's \"speculation\"\n"
           "overrides it, its \"prediction\" drafts in any case; outputs are unchanged):\n"
           "      --spec S              draft source: off (default), ngram (prompt lookup),\n"
           "                            draft (--draft-model) or random\n"
           "      --spec-k N            most drafts per verify step, [1, 32] (default: 32\n"
           "                            for a prediction, 8 for the others)\n"
           "      --spec-ngram MIN:MAX  n-gram sizes ngram tries, longest first (default 1:4)\n"
           "      --draft-model PATH    a smaller model with the same vocabulary (enables\n"
           "                            \"speculation\": {\"source\": \"draft\"}); --spec then\n"
           "                            defaults to draft\n");
}

/* Model name: the file (or directory) name without its extension. */
static void default_name(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(n - b), path + b);
    char *dot = strrchr(out, '.');
    if (dot && dot != out && (!strcmp(dot, ".gguf") || !strcmp(dot, ".bin"))) *dot = '\0';
}

typedef struct sig_state {
    sigset_t set;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int signals;
    kiln_server *srv;
} sig_state;

/* Waits for SIGINT/SIGTERM: the first wakes the main thread, the second cancels. */
static void *sig_thread(void *arg) {
    sig_state *st = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&st->set, &sig) != 0) continue;
        pthread_mutex_lock(&st->mu);
        st->signals++;
        int n = st->signals;
        fprintf(stderr, "kiln serve: received %s%s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                n > 1 ? ": cancelling in-flight requests" : "");
        if (n > 1 && st->srv) kiln_server_cancel_all(st->srv); /* under mu: srv stays alive */
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
    }
    return NULL;
}

static bool got_signal(sig_state *st) {
    pthread_mutex_lock(&st->mu);
    bool r = st->signals > 0;
    pthread_mutex_unlock(&st->mu);
    return r;
}

int kiln_cmd_serve(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"tokenizer", required_argument, 0, 'T'},
        {"host", required_argument, 0, 'H'},
        {"port", required_argument, 0, 'p'},
        {"api-key", required_argument, 0, 'k'},
        {"model-name", required_argument, 0, 'n'},
        {"max-body", required_argument, 0, 'b'},
        {"max-connections", required_argument, 0, 'c'},
        {"timeout", required_argument, 0, 'o'},
        {"shutdown-timeout", required_argument, 0, 'g'},
        {"response-store-max", required_argument, 0, 0x200},
        {"response-store-ttl", required_argument, 0, 0x201},
        {"quiet", no_argument, 0, 'q'},
        {"verbose", no_argument, 0, 'v'},
        {"tool-parser", required_argument, 0, 0x3001},
        {"device", required_argument, 0, CLI_OPT_DEVICE},
        CLI_ENGINE_LONG_OPTIONS,
        CLI_SPEC_LONG_OPTIONS,
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *model_name = NULL;
    char names_join[1024];
    kiln_model_params lp = {0};
    kiln_engine_params ep = kiln_engine_default_params();
    kiln_server_params sp = {.host = "127.0.0.1", .port = 8080};
    cli_spec cs = {0};
    double grace_s = 5;
    int64_t v;
    float f;
    const char *env_key = getenv("KILN_API_KEY");
    if (env_key && env_key[0]) sp.api_key = env_key;
    optind = 1;
    opterr = 0;
    int c;
#define INT_OPT(lo, hi, dst, name)                                                                 \
    do {                                                                                           \
        if (!cli_parse_i64(optarg, lo, hi, &v))                                                    \
            return cli_usage_error("serve", "%s must be an integer in [%lld, %lld] (got '%s')",    \
                                   name, (long long)(lo), (long long)(hi), optarg);                \
        dst = v;                                                                                   \
    } while (0)
    while ((c = getopt_long(argc, argv, ":m:t:qvh", opts, NULL)) != -1) {
        int er = cli_engine_option("serve", c, optarg, &ep);
        if (er < 0) er = cli_spec_option("serve", c, optarg, &ep, &cs);
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
        case CLI_OPT_DEVICE:
            if (!cli_parse_device(optarg, &lp))
                return cli_usage_error("serve",
                                       "--device must be auto, cpu, cuda or cuda:N (got '%s')",
                                       optarg);
            break;
        case 'H':
            sp.host = optarg;
            break;
        case 'p':
            INT_OPT(0, 65535, sp.port, "--port");
            break;
        case 'k':
            sp.api_key = optarg;
            break;
        case 'n': /* repeatable: the names join into one comma list (served id first) */
            if (model_name && model_name != names_join) {
                snprintf(names_join, sizeof names_join, "%s", model_name);
                model_name = names_join;
            }
            if (!model_name) {
                model_name = optarg;
            } else {
                size_t used = strlen(names_join);
                if (used + 1 + strlen(optarg) >= sizeof names_join)
                    return cli_usage_error("serve", "--model-name: the names are too long");
                snprintf(names_join + used, sizeof names_join - used, ",%s", optarg);
            }
            break;
        case 'b':
            INT_OPT(1, INT64_MAX, sp.max_body, "--max-body");
            break;
        case 'c':
            INT_OPT(1, 100000, sp.max_connections, "--max-connections");
            break;
        case 'o':
            INT_OPT(1, 86400, sp.timeout_s, "--timeout");
            break;
        case 'g':
            if (!cli_parse_f32(optarg, 0, 86400, &f))
                return cli_usage_error("serve",
                                       "--shutdown-timeout must be in [0, 86400] (got "
                                       "'%s')",
                                       optarg);
            grace_s = f;
            break;
        case 0x200:
            if (!cli_parse_size(optarg, 0, INT64_MAX, &v))
                return cli_usage_error("serve",
                                       "--response-store-max must be a size in bytes (e.g. 64M, "
                                       "0 = none) (got '%s')",
                                       optarg);
            sp.response_store_max = v > 0 ? v : -1;
            break;
        case 0x201:
            if (!cli_parse_f32(optarg, 0.001f, 1e9f, &f))
                return cli_usage_error("serve",
                                       "--response-store-ttl must be seconds in (0, 1e9] (got "
                                       "'%s')",
                                       optarg);
            sp.response_store_ttl_s = f;
            break;
        case 'q':
            sp.quiet = true;
            break;
        case 'v':
            sp.verbose = true;
            break;
        case 0x3001: {
            kiln_tool_format tf;
            if (strcmp(optarg, "auto") != 0 && kiln_tool_format_parse(optarg, &tf, NULL) != KILN_OK)
                return cli_usage_error("serve",
                                       "--tool-parser must be hermes, llama3, mistral, none or "
                                       "auto (got '%s')",
                                       optarg);
            sp.tool_parser = optarg;
            break;
        }
        case 'h':
            serve_usage(stdout);
            return 0;
        default:
            return cli_bad_option("serve", c, argv);
        }
    }
#undef INT_OPT
    if (optind < argc) return cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
    if (!model_path) return cli_usage_error("serve", "-m MODEL is required");
    if ((c = cli_engine_check("serve", &ep))) return c;
    if ((c = cli_spec_check("serve", &ep, &cs))) return c;
    char name_buf[256];
    if (!model_name) {
        default_name(model_path, name_buf, sizeof name_buf);
        model_name = name_buf;
    }
    sp.model_name = model_name;

    /* Signals go to one thread only; every thread started from here on inherits the mask. */
    static sig_state sigst;
    sigemptyset(&sigst.set);
    sigaddset(&sigst.set, SIGINT);
    sigaddset(&sigst.set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigst.set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&sigst.mu, NULL);
    pthread_cond_init(&sigst.cv, NULL);
    pthread_t sth;
    if (pthread_create(&sth, NULL, sig_thread, &sigst) != 0) {
        fprintf(stderr, "kiln: error: cannot start the signal thread\n");
        return KILN_EXIT_ERROR;
    }
    pthread_detach(sth);

    int rc = 0;
    kiln_error err = {0};
    kiln_server *srv = NULL;
    kiln_model *m = NULL, *draft = NULL;
    kiln_engine *e = NULL;
    if (kiln_server_start(&sp, &srv, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    pthread_mutex_lock(&sigst.mu);
    sigst.srv = srv;
    pthread_mutex_unlock(&sigst.mu);
    fprintf(stderr, "kiln serve: listening on http://%s%s%s:%d (loading %s)\n",
            strchr(sp.host, ':') ? "[" : "", sp.host, strchr(sp.host, ':') ? "]" : "",
            kiln_server_port(srv), model_path);
    fflush(stderr);
    double t0 = cli_now_ms();
    if (kiln_model_load(model_path, &lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if ((rc = cli_spec_load(&cs, &ep, &draft))) goto done;
    if (kiln_engine_create(m, &ep, &e, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if (ep.n_ctx > 0) cli_warn_ctx("serve", m, ep.n_ctx);
    if (kiln_server_set_ready(srv, m, e, ep.n_ctx, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    char cache[600];
    if (ep.no_prefix_cache)
        snprintf(cache, sizeof cache, "prefix cache off");
    else if (ep.cache_dir)
        snprintf(cache, sizeof cache,
                 "prefix cache in RAM and in %s (%lld block files, %.1f MB, at most %.1f MB)",
                 ep.cache_dir, (long long)st.disk_files, (double)st.disk_bytes / 1e6,
                 (double)(ep.cache_disk_max > 0 ? ep.cache_disk_max : (int64_t)16 << 30) / 1e6);
    else
        snprintf(cache, sizeof cache, "prefix cache in RAM");
    char spec[1200] = "";
    if (ep.spec > KILN_SPEC_OFF)
        snprintf(spec, sizeof spec, ", speculation %s%s%.1000s", cli_spec_name(ep.spec),
                 cs.draft_path ? " with draft model " : "", cs.draft_path ? cs.draft_path : "");
    else if (cs.draft_path)
        snprintf(spec, sizeof spec, ", draft model %.1000s (speculation off by default)",
                 cs.draft_path);
    fprintf(stderr,
            "kiln serve: ready in %.0f ms: model '%s', %d-token context, KV pool %d blocks of %d, "
            "%s%s, max body %zu bytes%s\n",
            cli_now_ms() - t0, model_name,
            ep.n_ctx > 0 ? ep.n_ctx
                         : (kiln_model_n_ctx_train(m) > 0 ? kiln_model_n_ctx_train(m) : 4096),
            st.kv_blocks_total, st.block_size, cache, spec,
            sp.max_body ? sp.max_body : (size_t)8 << 20,
            sp.api_key ? ", API key required" : "");
    fflush(stderr);

    pthread_mutex_lock(&sigst.mu);
    while (sigst.signals == 0) pthread_cond_wait(&sigst.cv, &sigst.mu);
    pthread_mutex_unlock(&sigst.mu);
done:
    if (srv) {
        kiln_server_shutdown(srv, got_signal(&sigst) ? grace_s : 0);
        pthread_mutex_lock(&sigst.mu);
        sigst.srv = NULL;
        pthread_mutex_unlock(&sigst.mu);
        kiln_server_destroy(srv);
    }
    kiln_engine_destroy(e);
    kiln_model_free(draft);
    kiln_model_free(m);
    if (rc == 0) fprintf(stderr, "kiln serve: stopped\n");
    return rc;
}
