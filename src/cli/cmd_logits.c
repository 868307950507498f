/* cmd_logits.c - `kiln logits`: one forward over token ids, all positions' logits to a file. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/runner.h"
#include "cli/cli.h"
#include "format/safetensors_write.h"
#include "util/error.h"

static void logits_usage(FILE *f) {
    fprintf(f, "usage: kiln logits -m MODEL (--ids 1,2,3 | -p PROMPT) -o OUT.safetensors\n"
               "                   [--tokenizer FILE] [-t N] [--kv-type T] [--kv-type-k T]\n"
               "                   [--kv-type-v T]\n"
               "\n"
               "Runs one forward over the tokens and writes input_ids [T] (I32) and\n"
               "logits [T, n_vocab] (F32) for every position. KV storage T: f32 (default),\n"
               "f16, bf16, q8_0, q4_0 or a TurboQuant config turbo:kBvB (--kv-type for K and V;\n"
               "-k / -v override one side, taking their side of a turbo config).\n");
}

static int parse_ids(const char *s, kiln_ivec *ids) {
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) return -1;
        if (kiln_ivec_push(ids, (int32_t)v) != KILN_OK) return -1;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return ids->n > 0 ? 0 : -1;
}

int kiln_cmd_logits(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"tokenizer", required_argument, 0, 'T'},
        {"ids", required_argument, 0, 'i'},
        {"prompt", required_argument, 0, 'p'},
        {"output", required_argument, 0, 'o'},
        {"threads", required_argument, 0, 't'},
        {"kv-type", required_argument, 0, 'K'},
        {"kv-type-k", required_argument, 0, 'k'},
        {"kv-type-v", required_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *ids_arg = NULL, *prompt = NULL, *out_path = NULL;
    kiln_model_load_params lp = {0};
    int64_t threads = 0;
    kiln_dtype kv_type = KILN_DTYPE_F32, kv_type_v = KILN_DTYPE_F32, kv_k = KILN_DTYPE_COUNT,
               kv_v = KILN_DTYPE_COUNT;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:p:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case 'T':
            lp.tokenizer_path = optarg;
            break;
        case 'i':
            ids_arg = optarg;
            break;
        case 'p':
            prompt = optarg;
            break;
        case 'o':
            out_path = optarg;
            break;
        case 't':
            if (!cli_parse_i64(optarg, 1, 512, &threads))
                return cli_usage_error("logits", "--threads must be in [1, 512] (got '%s')",
                                       optarg);
            break;
        case 'K':
        case 'k':
        case 'v': {
            /* --kv-type sets the pair (kv_type, and for a turbo config its V side apart);
             * --kv-type-k / -v override their side whatever the order */
            const char *opt = c == 'K' ? "--kv-type" : c == 'k' ? "--kv-type-k" : "--kv-type-v";
            kiln_dtype *pk = c == 'K' ? &kv_type : &kv_k, *pv = c == 'K' ? &kv_type_v : &kv_v;
            const int rc = cli_kv_side_option("logits", opt, optarg, pk, pv);
            if (rc) return rc;
            break;
        }
        case 'h':
            logits_usage(stdout);
            return 0;
        default:
            return cli_bad_option("logits", c, argv);
        }
    }
    if (optind < argc) return cli_usage_error("logits", "unexpected argument '%s'", argv[optind]);
    if (!model_path || !out_path)
        return cli_usage_error("logits", "-m MODEL and -o OUT are required");
    if (!ids_arg == !prompt) return cli_usage_error("logits", "give exactly one of --ids and -p");
    if (cli_clobbers_input(out_path, model_path) || cli_clobbers_input(out_path, lp.tokenizer_path))
        return cli_usage_error("logits", "-o '%s' is one of the input files; write to a new path",
                               out_path);
    kiln_ivec ids = {0};
    if (ids_arg && parse_ids(ids_arg, &ids) != 0) {
        kiln_ivec_free(&ids);
        return cli_usage_error("logits", "--ids must be a comma-separated list of token ids");
    }
    lp.require_tokenizer = prompt != NULL;
    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_backend *be = NULL;
    kiln_kv_seq *kv = NULL;
    float *logits = NULL;
    int rc = 0;
    if (kiln_model_open(model_path, &lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if (prompt && kiln_tokenizer_encode(m->tokenizer, prompt, strlen(prompt), true, false, &ids,
                                        &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if ((rc = cli_backend((int)threads, &be))) goto done;
    const int64_t T = (int64_t)ids.n, V = m->cfg.n_vocab;
    logits = malloc((size_t)T * (size_t)V * sizeof *logits);
    if (!logits) {
        kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory for %lld x %lld logits",
                       (long long)T, (long long)V);
        rc = cli_fail(&err);
        goto done;
    }
    if (kv_k == KILN_DTYPE_COUNT) kv_k = kv_type;
    if (kv_v == KILN_DTYPE_COUNT) kv_v = kv_type_v;
    if (kiln_kv_seq_create_kv(m, NULL, (int32_t)T, kv_k, kv_v, &kv, &err) != KILN_OK ||
        kiln_model_forward(m, kv, be, ids.data, (int32_t)T, 0, true, logits, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    int64_t shape_ids[1] = {T}, shape_logits[2] = {T, V};
    kiln_st_out_tensor outs[2] = {
        {"input_ids", KILN_DTYPE_I32, 1, shape_ids, ids.data},
        {"logits", KILN_DTYPE_F32, 2, shape_logits, logits},
    };
    if (kiln_safetensors_write(out_path, outs, 2, &err) != KILN_OK) rc = cli_fail(&err);
done:
    free(logits);
    kiln_kv_seq_destroy(kv);
    kiln_backend_destroy(be);
    kiln_model_close(m);
    kiln_ivec_free(&ids);
    return rc;
}
