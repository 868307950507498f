/* cmd_tokenize.c - `kiln tokenize`: print a text's token ids as a JSON array. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "format/gguf.h"
#include "util/error.h"

static void tokenize_usage(FILE *f) {
    fprintf(
        f,
        "usage: kiln tokenize -m MODEL [--tokenizer FILE] [--add-special] [--parse-special] TEXT\n"
        "\n"
        "  TEXT '-' reads stdin. Prints a JSON array of token ids.\n"
        "  --add-special    add BOS/EOS as the vocabulary's metadata says\n"
        "  --parse-special  recognise control-token texts (e.g. <|eot_id|>) in TEXT\n");
}

int kiln_cmd_tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"tokenizer", required_argument, 0, 'T'},
        {"add-special", no_argument, 0, 'a'}, {"parse-special", no_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    const char *model_path = NULL;
    kiln_model_load_params lp = {.require_tokenizer = true, .keep_file_layout = true};
    bool add_special = false, parse_special = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model_path = optarg;
            break;
        case 'T':
            lp.tokenizer_path = optarg;
            break;
        case 'a':
            add_special = true;
            break;
        case 's':
            parse_special = true;
            break;
        case 'h':
            tokenize_usage(stdout);
            return 0;
        default:
            return cli_bad_option("tokenize", c, argv);
        }
    }
    if (!model_path) return cli_usage_error("tokenize", "-m MODEL is required");
    if (optind != argc - 1)
        return cli_usage_error("tokenize", "exactly one TEXT argument is required");
    const char *text = argv[optind];
    size_t len = strlen(text);
    char *buf = NULL;
    if (!strcmp(text, "-")) {
        if (!(buf = cli_read_stdin(&len))) {
            fprintf(stderr, "kiln: error: cannot read stdin\n");
            return KILN_EXIT_ERROR;
        }
        text = buf;
    }
    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_gguf *g = NULL;
    kiln_tokenizer *tok = NULL; /* borrowed from m, or owned when read from a GGUF alone */
    kiln_ivec ids = {0};
    int rc = 0;
    /* A GGUF needs no weights to tokenize: vocabulary-only files (as in llama.cpp's
     * tokenizer suite) work too. Other formats go through the model loader. */
    FILE *probe = fopen(model_path, "rb");
    char magic[4] = {0};
    bool is_gguf = probe && fread(magic, 1, 4, probe) == 4 && !memcmp(magic, "GGUF", 4);
    if (probe) fclose(probe);
    kiln_status st;
    if (is_gguf) {
        st = kiln_gguf_open(model_path, &g, &err);
        if (st == KILN_OK) st = kiln_tokenizer_from_gguf(g, &tok, &err);
    } else {
        st = kiln_model_open(model_path, &lp, &m, &err);
        if (st == KILN_OK) tok = m->tokenizer;
    }
    if (st != KILN_OK) {
        rc = cli_fail(&err);
    } else if (kiln_tokenizer_encode(tok, text, len, add_special, parse_special, &ids, &err) !=
               KILN_OK) {
        rc = cli_fail(&err);
    } else {
        putchar('[');
        for (size_t i = 0; i < ids.n; i++) printf(i ? ",%d" : "%d", ids.data[i]);
        printf("]\n");
    }
    kiln_ivec_free(&ids);
    if (g) kiln_tokenizer_destroy(tok);
    kiln_gguf_close(g);
    kiln_model_close(m);
    free(buf);
    if (rc == 0) rc = cli_check_stdout();
    return rc;
}
