/* cmd_run.c - `kiln run`: generate text from a prompt through the engine, streaming it to
 * stdout (or printing one JSON object with --json). The stats line on stderr gives the
 * prompt's tokens and how many of them came from the prefix cache (with --cache-dir, from an
 * earlier run's blocks on disk), the tok/s of the prompt and of the generation and, when
 * speculation, a prediction or a fill was asked for, the speculation counters of kiln_usage.
 * Speculative decoding (--spec, --draft-model), a client prediction (--prediction, OpenAI's
 * Predicted Outputs) and a fill (--fill) map to kiln_engine_params / kiln_request (issue 18). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "util/error.h"

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: kiln run -m MODEL -p PROMPT [options]\n"
            "\n"
            "  -m, --model PATH        GGUF file, llama2.c checkpoint, or Hugging Face directory\n"
            "      --tokenizer FILE    llama2.c tokenizer.bin (default: beside the checkpoint)\n"
            "  -p, --prompt TEXT       prompt text ('-' reads stdin)\n"
            "  -n, --max-tokens N      tokens to generate (default 256)\n"
            "      --temp T            temperature in [0, 2]; 0 = greedy (default 0.8)\n"
            "      --top-k K           keep the K most likely tokens; 0 = off (default 40)\n"
            "      --top-p P           nucleus sampling, (0, 1] (default 0.95)\n"
            "      --min-p P           min-p filter, [0, 1] (default 0.05)\n"
            "      --xtc-probability P XTC (exclude top choices) chance per token, [0, 1];\n"
            "                          0 = off (default)\n"
            "      --xtc-threshold T   XTC probability threshold, [0, 1] (default 0.1)\n"
            "      --seed S            random seed (default: random, printed)\n"
            "      --device D          auto (default: the GPU when one is present and runs the\n"
            "                          model, else the CPU), cpu, cuda or cuda:N: where the\n"
            "                          weights, the KV cache and the computation live\n"
            "  -t, --threads N         threads (default: physical cores; 1 below ~4M weights)\n"
            "      --ctx N             context length (default: the model's)\n"
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
            "      --kv-memory SIZE    KV pool size in bytes, or with K/M/G/T (1024s) or\n"
            "                          KB/MB/GB/TB (1000s) (default: prompt + max tokens)\n"
            "      --kv-tokens N       KV pool size in positions\n"
            "      --gpu-memory M      GPU memory for weights + KV pool + scratch: a fraction\n"
            "                          of the GPU's total (0.9) or a size (60G); the pool gets\n"
            "                          the rest (the model on a GPU; excludes --kv-memory,\n"
            "                          --kv-tokens, --memory-budget)\n"
            "      --step-tokens N     tokens per engine step (default 512)\n"
            "      --prefill-chunk N   prompt tokens per step (default: --step-tokens)\n"
            "      --block-size N, --max-seqs N, --max-queue N\n"
            "                          engine limits, as for kiln serve\n"
            "      --no-prefix-cache   compute every prompt token (no prefix cache)\n"
            "      --kv-keep-window    keep every KV block of sliding-window layers (default:\n"
            "                          blocks outside the window are freed; prefix hits then\n"
            "                          end where a window was checkpointed, no --cache-dir)\n"
            "      --cache-dir DIR     keep the prefix cache's KV blocks in DIR too (created\n"
            "                          if absent): a later run with the same prompt prefix\n"
            "                          reads them instead of computing them\n"
            "      --cache-disk-max SIZE\n"
            "                          most bytes DIR may hold (default 16G)\n"
            "      --json              print one JSON object instead of streaming text\n"
            "speculative decoding (the output is the same as without, faster when drafts are\n"
            "accepted):\n"
            "      --spec S            draft source: off (default), ngram (prompt lookup over\n"
            "                          the prompt and output), draft (--draft-model) or random\n"
            "      --spec-k N          most drafts per verify step, [1, 32] (default: 32\n"
            "                          for a prediction, 8 for the others)\n"
            "      --spec-ngram MIN:MAX\n"
            "                          n-gram sizes ngram tries, longest first (default 1:4)\n"
            "      --draft-model PATH  a smaller model with the same vocabulary; --spec then\n"
            "                          defaults to draft\n"
            "      --prediction TEXT   the expected output (OpenAI's Predicted Outputs): drafted\n"
            "                          where it agrees with the output\n"
            "      --prediction-file PATH\n"
            "                          the same, read from a file\n"
            "      --fill TEXT         the output begins with TEXT\n"
            "      --fill-policy P     assert (default: TEXT is forced) or verify (TEXT is a\n"
            "                          prediction of the output's start: output unchanged)\n");
}

/* The whole of a file into a malloc'd NUL-terminated buffer; NULL (errno set) on failure. */
static char *read_whole_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        if (r == 0) break;
        n += r;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* A span (--fill, --prediction) that continues the prompt's text: tokenized together with
 * it, its ids are those a run over the joined text sees and decode to exactly the span after
 * the prompt (tokenized alone, an SPM vocabulary would give it a space prefix). *out gets the
 * joined text's ids past the prompt's when those are a prefix of them; else it stays empty
 * and the engine tokenizes the span's text. Returns 0, or KILN_EXIT_ERROR after printing. */
static int continuation(const kiln_model *m, const char *prompt, size_t prompt_len,
                        const kiln_ivec *ids, const char *span, size_t span_len, const char *flag,
                        kiln_ivec *out) {
    if (!span || span_len == 0) return 0;
    kiln_error err = {0};
    char *joined = malloc(prompt_len + span_len);
    if (!joined) {
        kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory (%s)", flag);
        return cli_fail(&err);
    }
    memcpy(joined, prompt, prompt_len);
    memcpy(joined + prompt_len, span, span_len);
    kiln_ivec whole = {0};
    kiln_status st =
        kiln_tokenizer_encode(m->tokenizer, joined, prompt_len + span_len, true, false, &whole, &err);
    free(joined);
    if (st == KILN_OK && whole.n > ids->n &&
        !memcmp(whole.data, ids->data, ids->n * sizeof *ids->data))
        st = kiln_ivec_append(out, whole.data + ids->n, whole.n - ids->n);
    kiln_ivec_free(&whole);
    if (st != KILN_OK) {
        kiln_error_prefix(&err, "%s: ", flag);
        return cli_fail(&err);
    }
    return 0;
}

/* getopt_long codes of run's own long options without a short form. */
enum {
    RUN_OPT_PREDICTION = 0x200,
    RUN_OPT_PREDICTION_FILE,
    RUN_OPT_FILL,
    RUN_OPT_FILL_POLICY,
};

/* Text of the whole completion, grown as TEXT events arrive. */
typedef struct text_buf {
    char *data;
    size_t len, cap;
} text_buf;

static bool text_append(text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *nd = realloc(b->data, cap);
        if (!nd) return false;
        b->data = nd;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

int kiln_cmd_run(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"tokenizer", required_argument, 0, 'T'},
        {"prompt", required_argument, 0, 'p'},
        {"max-tokens", required_argument, 0, 'n'},
        {"temp", required_argument, 0, 'e'},
        {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'P'},
        {"min-p", required_argument, 0, 'M'},
        {"xtc-probability", required_argument, 0, 'X'},
        {"xtc-threshold", required_argument, 0, 'Y'},
        {"seed", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},
        {"prediction", required_argument, 0, RUN_OPT_PREDICTION},
        {"prediction-file", required_argument, 0, RUN_OPT_PREDICTION_FILE},
        {"fill", required_argument, 0, RUN_OPT_FILL},
        {"fill-policy", required_argument, 0, RUN_OPT_FILL_POLICY},
        {"device", required_argument, 0, CLI_OPT_DEVICE},
        CLI_ENGINE_LONG_OPTIONS,
        CLI_SPEC_LONG_OPTIONS,
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *prompt = NULL;
    kiln_model_params lp = {.require_tokenizer = true};
    kiln_engine_params ep = kiln_engine_default_params();
    kiln_request rq = kiln_request_defaults();
    rq.temperature = 0.8f;
    rq.top_k = 40;
    rq.top_p = 0.95f;
    rq.min_p = 0.05f;
    bool seed_set = false, json = false, fill_policy_set = false;
    const char *prediction = NULL, *prediction_file = NULL;
    cli_spec cs = {0};
    int64_t v;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:p:n:t:h", opts, NULL)) != -1) {
        int er = cli_engine_option("run", c, optarg, &ep);
        if (er < 0) er = cli_spec_option("run", c, optarg, &ep, &cs);
        if (er >= 0) {
            if (er) return er;
            continue;
        }
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case RUN_OPT_PREDICTION:
            prediction = optarg;
            break;
        case RUN_OPT_PREDICTION_FILE:
            prediction_file = optarg;
            break;
        case RUN_OPT_FILL:
            rq.fill = optarg;
            rq.fill_len = strlen(optarg);
            break;
        case RUN_OPT_FILL_POLICY:
            if (!strcmp(optarg, "assert"))
                rq.fill_policy = KILN_FILL_ASSERT;
            else if (!strcmp(optarg, "verify"))
                rq.fill_policy = KILN_FILL_VERIFY;
            else
                return cli_usage_error("run", "--fill-policy must be assert or verify (got '%s')",
                                       optarg);
            fill_policy_set = true;
            break;
        case 'T':
            lp.tokenizer_path = optarg;
            break;
        case 'p':
            prompt = optarg;
            break;
        case 'n':
            if (!cli_parse_i64(optarg, 1, 1 << 30, &v))
                return cli_usage_error("run",
                                       "--max-tokens must be an integer in [1, 1073741824] (got "
                                       "'%s')",
                                       optarg);
            rq.max_tokens = (int32_t)v;
            break;
        case 'e':
            if (!cli_parse_f32(optarg, 0.0f, 2.0f, &rq.temperature))
                return cli_usage_error("run", "--temp must be a number in [0, 2] (got '%s')",
                                       optarg);
            break;
        case 'k':
            if (!cli_parse_i64(optarg, 0, 1 << 30, &v))
                return cli_usage_error("run", "--top-k must be an integer >= 0 (got '%s')", optarg);
            rq.top_k = (int32_t)v;
            break;
        case 'P':
            if (!cli_parse_f32(optarg, 0.0f, 1.0f, &rq.top_p) || rq.top_p <= 0.0f)
                return cli_usage_error("run", "--top-p must be in (0, 1] (got '%s')", optarg);
            break;
        case 'M':
            if (!cli_parse_f32(optarg, 0.0f, 1.0f, &rq.min_p))
                return cli_usage_error("run", "--min-p must be in [0, 1] (got '%s')", optarg);
            break;
        case 'X':
            if (!cli_parse_f32(optarg, 0.0f, 1.0f, &rq.xtc_probability))
                return cli_usage_error("run", "--xtc-probability must be in [0, 1] (got '%s')",
                                       optarg);
            break;
        case 'Y':
            if (!cli_parse_f32(optarg, 0.0f, 1.0f, &rq.xtc_threshold))
                return cli_usage_error("run", "--xtc-threshold must be in [0, 1] (got '%s')",
                                       optarg);
            break;
        case 's':
            if (!cli_parse_u64(optarg, &rq.seed))
                return cli_usage_error(
                    "run", "--seed must be an integer in [0, 18446744073709551615] (got '%s')",
                    optarg);
            seed_set = true;
            break;
        case 'j':
            json = true;
            break;
        case CLI_OPT_DEVICE:
            if (!cli_parse_device(optarg, &lp))
                return cli_usage_error("run", "--device must be auto, cpu, cuda or cuda:N (got '%s')",
                                       optarg);
            break;
        case 'h':
            run_usage(stdout);
            return 0;
        default:
            return cli_bad_option("run", c, argv);
        }
    }
    if (optind < argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!model_path) return cli_usage_error("run", "-m MODEL is required");
    if (!prompt) return cli_usage_error("run", "-p PROMPT is required");
    if ((c = cli_engine_check("run", &ep))) return c;
    if ((c = cli_spec_check("run", &ep, &cs))) return c;
    if (prediction && prediction_file)
        return cli_usage_error("run", "--prediction and --prediction-file cannot be used together");
    if (fill_policy_set && !rq.fill)
        return cli_usage_error("run", "--fill-policy needs --fill TEXT");
    if (rq.fill && rq.fill_policy == KILN_FILL_VERIFY && (prediction || prediction_file))
        return cli_usage_error("run",
                               "--fill-policy verify makes --fill a prediction of the output's "
                               "start: it cannot be used with --prediction or --prediction-file");
    if (!seed_set) rq.seed = cli_random_seed();

    char *stdin_buf = NULL, *prediction_buf = NULL;
    if (prediction_file) {
        size_t len = 0;
        prediction_buf = read_whole_file(prediction_file, &len);
        if (!prediction_buf) {
            fprintf(stderr, "kiln: error: --prediction-file %s: %s\n", prediction_file,
                    strerror(errno ? errno : EIO));
            return KILN_EXIT_ERROR;
        }
        rq.prediction = prediction_buf;
        rq.prediction_len = len;
    } else if (prediction) {
        rq.prediction = prediction;
        rq.prediction_len = strlen(prediction);
    }
    size_t prompt_len = strlen(prompt);
    if (!strcmp(prompt, "-")) {
        stdin_buf = cli_read_stdin(&prompt_len);
        if (!stdin_buf) {
            fprintf(stderr, "kiln: error: cannot read the prompt from stdin\n");
            return KILN_EXIT_ERROR;
        }
        prompt = stdin_buf;
    }

    int rc = 0;
    kiln_error err = {0};
    kiln_model *m = NULL, *draft = NULL;
    kiln_engine *engine = NULL;
    kiln_stream *stream = NULL;
    kiln_detok *echo = NULL;
    kiln_ivec ids = {0}, gen = {0}, fill_ids = {0}, pred_ids = {0};
    text_buf text = {0};
    double t0 = cli_now_ms();
    if (kiln_model_load(model_path, &lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if ((rc = cli_spec_load(&cs, &ep, &draft))) goto done;
    double load_ms = cli_now_ms() - t0;
    if (kiln_tokenizer_encode(m->tokenizer, prompt, prompt_len, true, false, &ids, &err) !=
        KILN_OK) {
        kiln_error_prefix(&err, "prompt: ");
        rc = cli_fail(&err);
        goto done;
    }
    if (ids.n == 0) {
        fprintf(stderr, "kiln: error: the prompt encodes to no tokens\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    /* The fill and the prediction continue the prompt's text: tokenized with it. */
    if ((rc = continuation(m, prompt, prompt_len, &ids, rq.fill, rq.fill_len, "--fill", &fill_ids)) ||
        (rc = continuation(m, prompt, prompt_len, &ids, rq.prediction, rq.prediction_len,
                           prediction_file ? "--prediction-file" : "--prediction", &pred_ids)))
        goto done;
    if (fill_ids.n > 0) {
        rq.fill_ids = fill_ids.data;
        rq.n_fill_ids = (int32_t)fill_ids.n;
    }
    if (pred_ids.n > 0) {
        rq.prediction_ids = pred_ids.data;
        rq.n_prediction_ids = (int32_t)pred_ids.n;
    }
    /* Context: --ctx, else the model's, else just what this request needs. A request that
     * would run past it is cut to end exactly at the context's last position (finish
     * "length"), as the single-sequence loop always did. */
    if (ep.n_ctx > 0) cli_warn_ctx("run", m, ep.n_ctx);
    int64_t n_ctx = ep.n_ctx > 0 ? ep.n_ctx : kiln_model_n_ctx_train(m);
    if (n_ctx <= 0) n_ctx = (int64_t)ids.n + rq.max_tokens;
    if ((int64_t)ids.n > n_ctx) {
        fprintf(stderr, "kiln: error: the prompt has %zu tokens but the context holds %lld\n",
                ids.n, (long long)n_ctx);
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    if ((int64_t)ids.n + rq.max_tokens - 1 > n_ctx)
        rq.max_tokens = (int32_t)(n_ctx - (int64_t)ids.n + 1);
    ep.n_ctx = (int32_t)n_ctx;
    if (ep.kv_memory == 0 && ep.kv_tokens == 0 && ep.memory_budget == 0 && ep.gpu_memory == 0) {
        /* one request: exactly its need, plus room for one verify step's drafts */
        int64_t kv = (int64_t)ids.n + rq.max_tokens;
        if (ep.spec > KILN_SPEC_OFF || rq.prediction) kv += KILN_MAX_SPEC_K + 1;
        if (ep.kv_quant_start > 0) {
            /* the delayed transition's f16 reserve (engine.c: N positions plus 4 blocks, at
             * most half the pool) counted in quantized blocks: an f16 block costs up to 3.6
             * q4_0 blocks, so 8 reserves' positions more cover it, and up to 10.7 TurboQuant
             * blocks (turbo:k1v1, 1.5 bits at head size 64), so 16 with a turbo side */
            const int64_t bs = ep.block_size > 0 ? ep.block_size : 16;
            const bool turbo = ep.kv_type == KILN_KV_TURBO ||
                               (ep.kv_type_name && !strncmp(ep.kv_type_name, "turbo", 5)) ||
                               (ep.kv_type_k && !strncmp(ep.kv_type_k, "turbo", 5)) ||
                               (ep.kv_type_v && !strncmp(ep.kv_type_v, "turbo", 5));
            kv += (turbo ? 16 : 8) * (((int64_t)ep.kv_quant_start + bs - 1) / bs + 4) * bs;
        }
        ep.kv_tokens = kv > INT32_MAX ? INT32_MAX : (int32_t)kv;
    }
    if (kiln_engine_create(m, &ep, &engine, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if (!json) {
        /* Echo the prompt; the engine's text starts after it, with the spacing rules applied
         * to the whole sequence. */
        if (kiln_detok_create(m->tokenizer, &echo, &err) != KILN_OK) {
            rc = cli_fail(&err);
            goto done;
        }
        for (size_t i = 0; i < ids.n; i++) {
            const char *piece;
            size_t len;
            if (kiln_detok_push(echo, ids.data[i], &piece, &len, &err) != KILN_OK) {
                rc = cli_fail(&err);
                goto done;
            }
            fwrite(piece, 1, len, stdout);
        }
        fflush(stdout);
    }
    rq.prompt_ids = ids.data;
    rq.n_prompt_ids = (int32_t)ids.n;
    double t_submit = cli_now_ms(), t_first = 0, t_end = 0;
    if (kiln_engine_submit(engine, &rq, &stream, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    kiln_event ev;
    kiln_finish_reason finish = KILN_FINISH_NONE;
    int32_t cached = 0; /* prompt tokens the prefix cache supplied (RAM or --cache-dir) */
    kiln_usage usage = {0};
    for (;;) {
        if (kiln_stream_next(stream, -1, &ev, &err) != KILN_OK) {
            rc = cli_fail(&err);
            goto done;
        }
        /* Timings use the engine's event times (CLOCK_MONOTONIC, as cli_now_ms), not the
         * moment this thread woke up to read them. */
        if (ev.type == KILN_EVENT_TOKEN) {
            double t = (double)ev.time_ns / 1e6;
            if (t_first == 0) t_first = t;
            t_end = t;
            if (kiln_ivec_push(&gen, ev.token) != KILN_OK) goto oom;
        } else if (ev.type == KILN_EVENT_TEXT) {
            if (!text_append(&text, ev.text, ev.text_len)) goto oom;
            if (!json) {
                fwrite(ev.text, 1, ev.text_len, stdout);
                fflush(stdout);
            }
        } else if (ev.type == KILN_EVENT_FINISH) {
            if (t_first == 0) t_first = t_end = (double)ev.time_ns / 1e6;
            finish = ev.finish_reason;
            cached = ev.usage.cached_tokens;
            usage = ev.usage;
            if (finish == KILN_FINISH_ERROR) {
                kiln_error_set(&err, ev.status, "%s", ev.message);
                rc = cli_fail(&err);
                goto done;
            }
            break;
        }
    }
    if (!json) {
        fputc('\n', stdout);
        fflush(stdout); /* before the stderr summary, when both go to one pipe */
    }
    double prompt_ms = t_first - t_submit, gen_ms = t_end - t_first;
    double pp_tps = prompt_ms > 0 ? (double)ids.n * 1e3 / prompt_ms : 0.0;
    double tg_tps = gen_ms > 0 && gen.n > 1 ? (double)(gen.n - 1) * 1e3 / gen_ms : 0.0;
    if (json) {
        json_t *pj = json_array(), *gj = json_array();
        for (size_t i = 0; i < ids.n; i++) json_array_append_new(pj, json_integer(ids.data[i]));
        for (size_t i = 0; i < gen.n; i++) json_array_append_new(gj, json_integer(gen.data[i]));
        json_t *o = json_pack(
            "{s:o, s:o, s:s%, s:s, s:i, s:{s:f, s:f, s:f, s:f, s:f}, s:I}", "prompt_ids", pj,
            "generated_ids", gj, "text", text.data ? text.data : "", text.len, "finish_reason",
            kiln_finish_reason_name(finish), "cached_tokens", cached, "timings", "load_ms", load_ms,
            "prompt_ms", prompt_ms, "generation_ms", gen_ms, "prompt_tokens_per_s", pp_tps,
            "generation_tokens_per_s", tg_tps, "seed", (json_int_t)rq.seed);
        /* kiln_usage's speculation counters, named as the server's usage names them */
        if (o)
            json_object_set_new(
                o, "speculation",
                json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i}", "source",
                          cli_spec_name(ep.spec == KILN_SPEC_DEFAULT ? KILN_SPEC_OFF : ep.spec),
                          "drafted_tokens", usage.spec_drafted, "accepted_tokens",
                          usage.spec_accepted, "verify_steps", usage.spec_verify_steps,
                          "fill_tokens", usage.fill_tokens, "accepted_prediction_tokens",
                          usage.accepted_prediction_tokens, "rejected_prediction_tokens",
                          usage.rejected_prediction_tokens));
        if (cli_print_json(o)) rc = KILN_EXIT_ERROR;
    }
    char spec[256] = "";
    if (ep.spec > KILN_SPEC_OFF || rq.prediction || rq.fill || usage.spec_drafted > 0)
        snprintf(spec, sizeof spec,
                 " | spec %s: drafted %d, accepted %d (%.1f%%), %d verify steps | prediction "
                 "accepted %d, rejected %d | fill %d",
                 cli_spec_name(ep.spec == KILN_SPEC_DEFAULT ? KILN_SPEC_OFF : ep.spec),
                 usage.spec_drafted, usage.spec_accepted,
                 usage.spec_drafted > 0 ? 100.0 * usage.spec_accepted / usage.spec_drafted : 0.0,
                 usage.spec_verify_steps, usage.accepted_prediction_tokens,
                 usage.rejected_prediction_tokens, usage.fill_tokens);
    fprintf(stderr,
            "kiln: load %.1f ms | prompt %zu tokens (%d cached), %.1f tok/s | generated %zu "
            "tokens, %.1f tok/s | finish %s | seed %llu%s\n",
            load_ms, ids.n, cached, pp_tps, gen.n, tg_tps, kiln_finish_reason_name(finish),
            (unsigned long long)rq.seed, spec);
    if (rc == 0) rc = cli_check_stdout();
    goto done;
oom:
    kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    rc = cli_fail(&err);
done:
    kiln_stream_destroy(stream);
    kiln_engine_destroy(engine);
    kiln_detok_destroy(echo);
    kiln_ivec_free(&ids);
    kiln_ivec_free(&gen);
    kiln_ivec_free(&fill_ids);
    kiln_ivec_free(&pred_ids);
    free(text.data);
    kiln_model_free(m);
    kiln_model_free(draft);
    free(stdin_buf);
    free(prediction_buf);
    return rc;
}
