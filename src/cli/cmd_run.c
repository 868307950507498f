/* cmd_run.c - `kiln run`: generate text from a prompt, streaming it to stdout. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "engine/generate.h"
#include "util/error.h"

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: kiln run -m MODEL -p PROMPT [options]\n"
            "\n"
            "  -m, --model PATH       GGUF file, llama2.c checkpoint, or Hugging Face directory\n"
            "      --tokenizer FILE   llama2.c tokenizer.bin (default: beside the checkpoint)\n"
            "  -p, --prompt TEXT      prompt text ('-' reads stdin)\n"
            "  -n, --max-tokens N     tokens to generate (default 256)\n"
            "      --temp T           temperature in [0, 2]; 0 = greedy (default 0.8)\n"
            "      --top-k K          keep the K most likely tokens; 0 = off (default 40)\n"
            "      --top-p P          nucleus sampling, (0, 1] (default 0.95)\n"
            "      --min-p P          min-p filter, [0, 1] (default 0.05)\n"
            "      --seed S           random seed (default: from the clock, printed)\n"
            "  -t, --threads N        threads (default: physical cores)\n"
            "      --ctx N            context length (default: the model's)\n"
            "      --kv-type T        KV cache storage, f32 (default) or f16\n"
            "      --json             print one JSON object instead of streaming text\n");
}

typedef struct run_state {
    kiln_detok *detok;
    bool stream;
    kiln_status st;
    kiln_error err;
} run_state;

static bool on_token(void *user, int32_t tok) {
    run_state *rs = user;
    if (!rs->stream) return true;
    const char *text;
    size_t len;
    if ((rs->st = kiln_detok_push(rs->detok, tok, &text, &len, &rs->err)) != KILN_OK) return false;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

int kiln_cmd_run(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"tokenizer", required_argument, 0, 'T'},
        {"prompt", required_argument, 0, 'p'},  {"max-tokens", required_argument, 0, 'n'},
        {"temp", required_argument, 0, 'e'},    {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'P'},   {"min-p", required_argument, 0, 'M'},
        {"seed", required_argument, 0, 's'},    {"threads", required_argument, 0, 't'},
        {"ctx", required_argument, 0, 'c'},     {"json", no_argument, 0, 'j'},
        {"kv-type", required_argument, 0, 'K'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *model_path = NULL, *prompt = NULL;
    kiln_model_load_params lp = {.require_tokenizer = true};
    kiln_generate_params gp = {.max_tokens = 256};
    gp.sampler = kiln_sampler_defaults();
    gp.sampler.temperature = 0.8f;
    gp.sampler.top_k = 40;
    gp.sampler.top_p = 0.95f;
    gp.sampler.min_p = 0.05f;
    bool seed_set = false, json = false;
    int64_t threads = 0, v;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:p:n:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'T': lp.tokenizer_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n':
            if (!cli_parse_i64(optarg, 1, 1 << 30, &v))
                return cli_usage_error("run", "--max-tokens must be an integer >= 1 (got '%s')", optarg);
            gp.max_tokens = (int32_t)v;
            break;
        case 'e':
            if (!cli_parse_f32(optarg, 0.0f, 2.0f, &gp.sampler.temperature))
                return cli_usage_error("run", "--temp must be a number in [0, 2] (got '%s')", optarg);
            break;
        case 'k':
            if (!cli_parse_i64(optarg, 0, 1 << 30, &v))
                return cli_usage_error("run", "--top-k must be an integer >= 0 (got '%s')", optarg);
            gp.sampler.top_k = (int32_t)v;
            break;
        case 'P':
            if (!cli_parse_f32(optarg, 0.0f, 1.0f, &gp.sampler.top_p) || gp.sampler.top_p <= 0.0f)
                return cli_usage_error("run", "--top-p must be in (0, 1] (got '%s')", optarg);
            break;
        case 'M':
            if (!cli_parse_f32(optarg, 0.0f, 1.0f, &gp.sampler.min_p))
                return cli_usage_error("run", "--min-p must be in [0, 1] (got '%s')", optarg);
            break;
        case 's':
            if (!cli_parse_i64(optarg, 0, INT64_MAX, &v))
                return cli_usage_error("run", "--seed must be a non-negative integer (got '%s')", optarg);
            gp.sampler.seed = (uint64_t)v;
            seed_set = true;
            break;
        case 't':
            if (!cli_parse_i64(optarg, 1, 512, &threads))
                return cli_usage_error("run", "--threads must be in [1, 512] (got '%s')", optarg);
            break;
        case 'c':
            if (!cli_parse_i64(optarg, 1, 1 << 24, &v))
                return cli_usage_error("run", "--ctx must be in [1, 16777216] (got '%s')", optarg);
            gp.n_ctx = (int32_t)v;
            break;
        case 'j': json = true; break;
        case 'K':
            if (!cli_parse_kv_type(optarg, &gp.kv_type))
                return cli_usage_error("run", "--kv-type must be f32 or f16 (got '%s')", optarg);
            break;
        case 'h': run_usage(stdout); return 0;
        case ':': return cli_usage_error("run", "option '%s' needs a value", argv[optind - 1]);
        default: return cli_usage_error("run", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!model_path) return cli_usage_error("run", "-m MODEL is required");
    if (!prompt) return cli_usage_error("run", "-p PROMPT is required");
    if (!seed_set) gp.sampler.seed = (uint64_t)time(NULL);

    char *stdin_buf = NULL;
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
    kiln_model *m = NULL;
    kiln_threadpool *tp = NULL;
    kiln_ivec ids = {0};
    kiln_generate_result res = {0};
    run_state rs = {.stream = !json};
    double t0 = cli_now_ms();
    if (kiln_model_open(model_path, &lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    double load_ms = cli_now_ms() - t0;
    if ((rc = cli_threadpool((int)threads, &tp))) goto done;
    if (kiln_tokenizer_encode(m->tokenizer, prompt, prompt_len, true, false, &ids, &err) != KILN_OK) {
        kiln_error_prefix(&err, "prompt: ");
        rc = cli_fail(&err);
        goto done;
    }
    if (ids.n == 0) {
        fprintf(stderr, "kiln: error: the prompt encodes to no tokens\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    if (kiln_detok_create(m->tokenizer, &rs.detok, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if (rs.stream) {
        /* Echo the prompt through the detokenizer so spacing rules see the whole sequence. */
        for (size_t i = 0; i < ids.n; i++) {
            const char *text;
            size_t len;
            if (kiln_detok_push(rs.detok, ids.data[i], &text, &len, &err) != KILN_OK) {
                rc = cli_fail(&err);
                goto done;
            }
            fwrite(text, 1, len, stdout);
        }
        fflush(stdout);
    }
    kiln_status st = kiln_generate(m, tp, ids.data, (int32_t)ids.n, &gp, on_token, &rs, &res, &err);
    if (rs.st != KILN_OK) {
        rc = cli_fail(&rs.err);
        goto done;
    }
    if (st != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    const char *tail;
    size_t tail_len;
    if (rs.stream) {
        if (kiln_detok_flush(rs.detok, &tail, &tail_len, &err) == KILN_OK) fwrite(tail, 1, tail_len, stdout);
        fputc('\n', stdout);
    }
    double pp_tps = res.prompt_ms > 0 ? (double)ids.n * 1e3 / res.prompt_ms : 0.0;
    double tg_tps = res.gen_ms > 0 && res.tokens.n > 1 ? (double)(res.tokens.n - 1) * 1e3 / res.gen_ms : 0.0;
    if (json) {
        /* Generated text alone: a fresh detokenizer primed with the prompt ids. */
        kiln_detok *d2 = NULL;
        char *text = NULL;
        size_t tlen = 0, cap = 0;
        kiln_status s2 = kiln_detok_create(m->tokenizer, &d2, &err);
        for (size_t i = 0; s2 == KILN_OK && i < ids.n + res.tokens.n + 1; i++) {
            const char *piece;
            size_t plen;
            if (i < ids.n + res.tokens.n) {
                int32_t tok = i < ids.n ? ids.data[i] : res.tokens.data[i - ids.n];
                s2 = kiln_detok_push(d2, tok, &piece, &plen, &err);
            } else {
                s2 = kiln_detok_flush(d2, &piece, &plen, &err);
            }
            if (s2 != KILN_OK || i < ids.n) continue;
            if (tlen + plen + 1 > cap) {
                cap = (tlen + plen + 1) * 2;
                char *nt = realloc(text, cap);
                if (!nt) {
                    s2 = kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
                    break;
                }
                text = nt;
            }
            memcpy(text + tlen, piece, plen);
            tlen += plen;
        }
        kiln_detok_destroy(d2);
        if (s2 != KILN_OK) {
            free(text);
            rc = cli_fail(&err);
            goto done;
        }
        json_t *pj = json_array(), *gj = json_array();
        for (size_t i = 0; i < ids.n; i++) json_array_append_new(pj, json_integer(ids.data[i]));
        for (size_t i = 0; i < res.tokens.n; i++) json_array_append_new(gj, json_integer(res.tokens.data[i]));
        json_t *o = json_pack("{s:o, s:o, s:s%, s:s, s:{s:f, s:f, s:f, s:f, s:f}, s:I}", "prompt_ids", pj,
                              "generated_ids", gj, "text", text ? text : "", tlen, "finish_reason",
                              kiln_finish_reason_name(res.finish), "timings", "load_ms", load_ms,
                              "prompt_ms", res.prompt_ms, "generation_ms", res.gen_ms,
                              "prompt_tokens_per_s", pp_tps, "generation_tokens_per_s", tg_tps,
                              "seed", (json_int_t)gp.sampler.seed);
        free(text);
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!s) {
            fprintf(stderr, "kiln: error: cannot build the JSON output\n");
            rc = KILN_EXIT_ERROR;
        } else {
            printf("%s\n", s);
        }
        free(s);
        json_decref(o);
    }
    fprintf(stderr,
            "kiln: load %.1f ms | prompt %zu tokens, %.1f tok/s | generated %zu tokens, %.1f tok/s "
            "| finish %s | seed %llu\n",
            load_ms, ids.n, pp_tps, res.tokens.n, tg_tps, kiln_finish_reason_name(res.finish),
            (unsigned long long)gp.sampler.seed);
done:
    kiln_ivec_free(&ids);
    kiln_ivec_free(&res.tokens);
    kiln_detok_destroy(rs.detok);
    kiln_threadpool_destroy(tp);
    kiln_model_close(m);
    free(stdin_buf);
    return rc;
}
