/*
 * cmd_perplexity.c - `kiln perplexity -m MODEL -f TEXT [--ctx N] [--kv-type T] ...`: the
 * perplexity of a text file by llama-perplexity's method (engine/perplexity.h), with the
 * model's KV cache in the chosen page formats.
 *
 * Tokenization follows llama-perplexity's common_tokenize(ctx, text, add_special = true,
 * parse_special = false): BOS at the start where the vocab adds it, special texts not parsed.
 * The file is read as it is (llama-perplexity's -f also processes backslash escapes unless it
 * is given --no-escape; compare with --no-escape). Like llama-perplexity it needs at least
 * 2 * ctx tokens.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/perplexity.h"
#include "util/error.h"

static void ppl_usage(FILE *f) {
    fprintf(f,
            "usage: kiln perplexity -m MODEL -f TEXT [--ctx N] [--kv-type T] [--kv-type-k T]\n"
            "                       [--kv-type-v T] [--chunks N] [-t N] [--tokenizer FILE]\n"
            "                       [--json]\n"
            "\n"
            "Perplexity of the text file by llama-perplexity's method: the text tokenized whole\n"
            "(BOS first where the model adds one), cut into chunks of ctx tokens, each chunk run\n"
            "from an empty KV cache with its first token replaced by BOS where the model adds\n"
            "BOS, and scored on its second half (the logits at positions ctx/2 .. ctx-2 against\n"
            "the next tokens); ppl = exp(mean negative log-likelihood).\n"
            "\n"
            "options:\n"
            "  --ctx N          tokens per chunk (default 512)\n"
            "  --kv-type T      KV page format of K and V: %s (default f32)\n"
            "  --kv-type-k T, --kv-type-v T   the format of K / V rows alone\n"
            "  --chunks N       score at most N chunks (default: all)\n"
            "  -t, --threads N  threads (default: physical cores)\n"
            "  --json           print {\"ppl\", \"tokens\", \"scored\", \"chunks\", ...} only\n",
            cli_kv_format_names());
}

enum { OPT_CTX = 0x200, OPT_KV, OPT_KVK, OPT_KVV, OPT_CHUNKS, OPT_JSON, OPT_TOK };

static void progress(void *user, int32_t chunk, int32_t n_chunks, double ppl) {
    (void)n_chunks;
    if (!*(bool *)user) fprintf(stderr, "[%d]%.4f,", chunk + 1, ppl);
}

int kiln_cmd_perplexity(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"file", required_argument, 0, 'f'},
        {"threads", required_argument, 0, 't'},
        {"ctx", required_argument, 0, OPT_CTX},
        {"kv-type", required_argument, 0, OPT_KV},
        {"kv-type-k", required_argument, 0, OPT_KVK},
        {"kv-type-v", required_argument, 0, OPT_KVV},
        {"chunks", required_argument, 0, OPT_CHUNKS},
        {"json", no_argument, 0, OPT_JSON},
        {"tokenizer", required_argument, 0, OPT_TOK},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *text_path = NULL;
    kiln_model_load_params lp = {0};
    int64_t threads = 0, n_ctx = 512, chunks = 0;
    kiln_dtype kv_k = KILN_DTYPE_F32, kv_v = KILN_DTYPE_F32;
    bool json = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:f:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case 'f':
            text_path = optarg;
            break;
        case OPT_TOK:
            lp.tokenizer_path = optarg;
            break;
        case 't':
            if (!cli_parse_i64(optarg, 1, 512, &threads))
                return cli_usage_error("perplexity", "--threads must be in [1, 512] (got '%s')",
                                       optarg);
            break;
        case OPT_CTX:
            if (!cli_parse_i64(optarg, 4, 1 << 24, &n_ctx))
                return cli_usage_error("perplexity", "--ctx must be in [4, 16777216] (got '%s')",
                                       optarg);
            break;
        case OPT_CHUNKS:
            if (!cli_parse_i64(optarg, 1, INT32_MAX, &chunks))
                return cli_usage_error("perplexity", "--chunks must be a positive integer (got "
                                                     "'%s')",
                                       optarg);
            break;
        case OPT_KV:
        case OPT_KVK:
        case OPT_KVV: {
            const char *name = c == OPT_KV ? "--kv-type" : c == OPT_KVK ? "--kv-type-k"
                                                                         : "--kv-type-v";
            const int rc = cli_kv_side_option("perplexity", name, optarg, &kv_k, &kv_v);
            if (rc) return rc;
            break;
        }
        case OPT_JSON:
            json = true;
            break;
        case 'h':
            ppl_usage(stdout);
            return 0;
        default:
            return cli_bad_option("perplexity", c, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("perplexity", "unexpected argument '%s'", argv[optind]);
    if (!model_path || !text_path)
        return cli_usage_error("perplexity", "-m MODEL and -f TEXT are required");

    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_backend *be = NULL;
    kiln_ivec ids = {0};
    char *text = NULL;
    int rc = 0;
    FILE *f = fopen(text_path, "rb");
    if (!f) {
        kiln_error_set(&err, KILN_ERR_IO, "%s: cannot open the text file (-f)", text_path);
        return cli_fail(&err);
    }
    size_t cap = 1 << 16, len = 0;
    text = malloc(cap);
    while (text) {
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (len < cap) break;
        char *nt = realloc(text, cap * 2);
        if (!nt) {
            free(text);
            text = NULL;
        }
        text = nt;
        cap *= 2;
    }
    bool rerr = ferror(f);
    fclose(f);
    if (!text || rerr) {
        free(text);
        kiln_error_set(&err, KILN_ERR_IO, "%s: cannot read the text file (-f)", text_path);
        return cli_fail(&err);
    }
    lp.require_tokenizer = true;
    if (kiln_model_open(model_path, &lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if (kiln_tokenizer_encode(m->tokenizer, text, len, true, false, &ids, &err) != KILN_OK) {
        kiln_error_prefix(&err, "%s: ", text_path);
        rc = cli_fail(&err);
        goto done;
    }
    if ((int64_t)ids.n < 2 * n_ctx) {
        kiln_error_set(&err, KILN_ERR_INVALID_ARGUMENT,
                       "%s tokenizes to %zu tokens; --ctx %lld needs at least %lld (2 x ctx, as "
                       "llama-perplexity)",
                       text_path, ids.n, (long long)n_ctx, (long long)(2 * n_ctx));
        rc = cli_fail(&err);
        goto done;
    }
    cli_warn_ctx("perplexity", m, n_ctx);
    if ((rc = cli_backend((int)threads, &be))) goto done;
    const kiln_vocab *v = kiln_tokenizer_vocab(m->tokenizer);
    kiln_ppl_params pp = {
        .n_ctx = (int32_t)n_ctx,
        .max_chunks = (int32_t)chunks,
        .kv_k = kv_k,
        .kv_v = kv_v,
        .bos = v->add_bos ? v->bos_id : -1,
        .progress = progress,
        .user = &json,
    };
    kiln_ppl_result r;
    if (kiln_perplexity(m, be, ids.data, (int64_t)ids.n, &pp, &r, &err) != KILN_OK) {
        if (!json) fputc('\n', stderr);
        rc = cli_fail(&err);
        goto done;
    }
    if (json) {
        rc = cli_print_json(json_pack(
            "{s:f, s:I, s:I, s:i, s:I, s:s, s:s, s:b, s:f, s:f, s:f, s:f}", "ppl", r.ppl, "tokens",
            (json_int_t)ids.n, "scored", (json_int_t)r.n_scored, "chunks", r.n_chunks, "ctx",
            (json_int_t)n_ctx, "kv_type_k", cli_kv_format_name(kv_k), "kv_type_v",
            cli_kv_format_name(kv_v), "bos_replaced", pp.bos >= 0, "nll", r.nll, "nll_stderr",
            r.nll_stderr, "ppl_stderr", r.ppl_stderr, "seconds", r.seconds));
    } else {
        fputc('\n', stderr);
        printf("%s: %zu tokens, %d chunks of %lld, %lld scored, KV %s/%s%s\n", text_path, ids.n,
               r.n_chunks, (long long)n_ctx, (long long)r.n_scored, cli_kv_format_name(kv_k),
               cli_kv_format_name(kv_v), pp.bos >= 0 ? ", BOS first in each chunk" : "");
        printf("Final estimate: PPL = %.4f +/- %.5f (%.1f s)\n", r.ppl, r.ppl_stderr, r.seconds);
    }
    if (rc == 0) rc = cli_check_stdout();
done:
    kiln_ivec_free(&ids);
    free(text);
    kiln_backend_destroy(be);
    kiln_model_close(m);
    return rc;
}
