/* main.c - the kiln command-line tool: kiln run | serve | bench | tokenize | inspect | logits. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "kiln %s - LLM inference engine\n"
            "\n"
            "usage: kiln <command> [options]\n"
            "\n"
            "commands:\n"
            "  run       generate text from a prompt\n"
            "  bench     serving throughput of the engine at several concurrencies\n"
            "  serve     OpenAI-compatible HTTP server (completions, chat, SSE, metrics)\n"
            "  tokenize  print the token ids of a text as a JSON array\n"
            "  inspect   print a model file's metadata and tensor table\n"
            "  logits    run one forward over token ids and write the logits (safetensors)\n"
            "  quantize  rewrite a GGUF model with its weights in another type (q8_0, q4_0, ...)\n"
            "  convert   convert a Hugging Face checkpoint directory to GGUF\n"
            "  gen-model write a model with random weights and real shapes (GGUF)\n"
            "  perplexity  perplexity of a text file, llama-perplexity's method\n"
            "  fit       memory a model needs: weights, KV per token, longest context, sequences\n"
            "\n"
            "Run 'kiln <command> --help' for the options of a command.\n",
            KILN_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return KILN_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "run")) return kiln_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return kiln_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return kiln_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return kiln_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return kiln_cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "logits")) return kiln_cmd_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return kiln_cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return kiln_cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "gen-model")) return kiln_cmd_gen_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "perplexity")) return kiln_cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(cmd, "fit")) return kiln_cmd_fit(argc - 1, argv + 1);
    fprintf(stderr, "kiln: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return KILN_EXIT_USAGE;
}
