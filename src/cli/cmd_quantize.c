/*
 * cmd_quantize.c - `kiln quantize IN.gguf OUT.gguf --type T`: rewrite a GGUF model with its
 * weight matrices in another dtype, using llama.cpp's block formats and metadata
 * conventions, so that llama.cpp and kiln both read the result.
 *
 * Tensor policy (documented in the usage text):
 *   - a tensor is a weight matrix when it has >= 2 dims, its name ends in ".weight", it is
 *     not a norm ("_norm.weight") and not a MoE router ("ffn_gate_inp.weight", which
 *     llama.cpp keeps in f32 too), and its dtype converts to float;
 *   - every weight matrix whose row length (ne[0]) is a multiple of the target's block size
 *     becomes the target type, token_embd.weight and output.weight included. (llama-quantize
 *     also mixes types by role, e.g. output.weight in q6_K for its q4 presets; kiln applies
 *     the one requested type everywhere, so a file's type is exactly what was asked for);
 *   - weight matrices whose rows do not split into blocks, 1-D tensors (norms, biases,
 *     rope_freqs) and other float tensors are stored as f32 (lossless from f32/f16/bf16);
 *   - tensors already in their output dtype, and non-float tensors (i32), are copied byte for
 *     byte.
 * Metadata is copied in order; general.file_type is set to the target's llama_ftype and
 * general.quantization_version to 2 for block-quantized targets.
 */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "util/error.h"

bool cli_parse_weight_type(const char *s, kiln_dtype *out) {
    static const kiln_dtype types[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16,
                                       KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_K,
                                       KILN_DTYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const char *n = kiln_dtype_name(types[i]);
        size_t k = 0;
        while (n[k] && s[k] && tolower((unsigned char)n[k]) == tolower((unsigned char)s[k])) k++;
        if (!n[k] && !s[k]) {
            *out = types[i];
            return true;
        }
    }
    return false;
}

static void quantize_usage(FILE *f) {
    fprintf(f,
            "usage: kiln quantize IN.gguf OUT.gguf --type TYPE [-t N]\n"
            "\n"
            "Rewrites a GGUF model with its weight matrices in TYPE, one of\n"
            "  q8_0 q4_0 q4_k q6_k f16 bf16 f32\n"
            "using llama.cpp's block formats and kiln's reference quantizers.\n"
            "\n"
            "Every 2-D weight matrix (token_embd and output included) whose row length is a\n"
            "multiple of TYPE's block size (32, or 256 for the k-quants) becomes TYPE; other\n"
            "weight matrices, norms and 1-D tensors are stored as f32. Metadata is copied, with\n"
            "general.file_type (and general.quantization_version) updated. The output is\n"
            "written to a temporary file beside OUT and renamed when complete.\n"
            "\n"
            "options:\n"
            "  --type TYPE      target weight type (required)\n"
            "  -t, --threads N  threads (default: physical cores)\n");
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

/* The dtype tensor t is written as, for target type `target`. */
static kiln_dtype output_dtype(const kiln_gguf_tensor *t, kiln_dtype target) {
    const kiln_dtype_traits *src = kiln_dtype_traits_of((int32_t)t->dtype);
    if (!src || !src->to_float) return t->dtype; /* i32 and the like: copied */
    bool matrix = t->n_dims >= 2 && ends_with(t->name, ".weight") &&
                  !ends_with(t->name, "_norm.weight") && !ends_with(t->name, "ffn_gate_inp.weight");
    if (matrix && t->ne[0] % kiln_dtype_traits_of((int32_t)target)->block_size == 0) return target;
    return KILN_DTYPE_F32;
}

typedef struct src_rows {
    const uint8_t *data;
    size_t row_bytes;
    const kiln_dtype_traits *tr;
    int64_t ne0;
} src_rows;

static void src_row(void *ctx, int64_t row, float *out) {
    const src_rows *c = ctx;
    c->tr->to_float(c->data + (size_t)row * c->row_bytes, out, c->ne0);
}

int kiln_cmd_quantize(int argc, char **argv) {
    static const struct option opts[] = {
        {"type", required_argument, 0, 'T'},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *type_arg = NULL;
    int64_t threads = 0;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'T':
            type_arg = optarg;
            break;
        case 't':
            if (!cli_parse_i64(optarg, 1, 512, &threads))
                return cli_usage_error("quantize", "--threads must be in [1, 512] (got '%s')",
                                       optarg);
            break;
        case 'h':
            quantize_usage(stdout);
            return 0;
        default:
            return cli_bad_option("quantize", c, argv);
        }
    }
    if (argc - optind != 2)
        return cli_usage_error("quantize", "expected IN.gguf OUT.gguf (got %d arguments)",
                               argc - optind);
    const char *in_path = argv[optind], *out_path = argv[optind + 1];
    if (cli_clobbers_input(out_path, in_path))
        return cli_usage_error("quantize", "OUT.gguf is the input file '%s'; write to a new path",
                               in_path);
    kiln_dtype target;
    if (!type_arg) return cli_usage_error("quantize", "--type is required");
    if (!cli_parse_weight_type(type_arg, &target))
        return cli_usage_error("quantize",
                               "--type must be one of q8_0 q4_0 q4_k q6_k f16 bf16 f32 (got '%s')",
                               type_arg);

    kiln_error err = {0};
    kiln_gguf *g = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_threadpool *tp = NULL;
    int rc = KILN_EXIT_ERROR;
    double t0 = cli_now_ms();
    kiln_status st = kiln_gguf_open(in_path, &g, &err);
    if (st == KILN_OK) { /* a file type that none of the matrices can take is an error */
        size_t n_can = 0, n_mat = 0;
        int64_t row = 0;
        for (size_t i = 0; i < g->n_tensors; i++) {
            const kiln_gguf_tensor *t = &g->tensors[i];
            if (output_dtype(t, target) == target) n_can++;
            if (t->n_dims >= 2) n_mat++, row = t->ne[0];
        }
        if (n_can == 0 && n_mat > 0 && target != KILN_DTYPE_F32) {
            st = kiln_error_set(&err, KILN_ERR_INVALID_ARGUMENT,
                                "%s: no weight matrix can be stored as %s: its blocks hold %d "
                                "elements and rows here have %lld (nothing written)",
                                in_path, kiln_dtype_name(target),
                                (int)kiln_dtype_traits_of((int32_t)target)->block_size,
                                (long long)row);
            goto done;
        }
    }
    if (st == KILN_OK) st = kiln_gguf_writer_create(&w, &err);
    if (st == KILN_OK) st = kiln_gguf_writer_copy_kv(w, g, NULL, &err);
    if (st == KILN_OK) st = kiln_gguf_writer_set_file_type(w, target, &err);
    if (st != KILN_OK) goto done;
    if (cli_threadpool((int)threads, &tp) != 0) goto done_quiet;

    size_t n_target = 0, n_f32 = 0, n_copied = 0, n_requant = 0;
    for (size_t i = 0; i < g->n_tensors && st == KILN_OK; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        st = kiln_gguf_writer_add_tensor(w, t->name, output_dtype(t, target), t->n_dims, t->ne,
                                         &err);
    }
    if (st == KILN_OK) st = kiln_gguf_writer_begin(w, out_path, &err);
    for (size_t i = 0; i < g->n_tensors && st == KILN_OK; i++) {
        const kiln_gguf_tensor *t = &g->tensors[i];
        kiln_dtype od = output_dtype(t, target);
        if (od == t->dtype) {
            st = kiln_gguf_writer_write_data(w, t->data, t->nbytes, &err);
            n_copied++;
            continue;
        }
        const kiln_dtype_traits *tr = kiln_dtype_traits_of((int32_t)t->dtype);
        if (tr->is_quantized && od != KILN_DTYPE_F32) n_requant++;
        src_rows sr = {t->data, kiln_dtype_row_size(t->dtype, t->ne[0]), tr, t->ne[0]};
        st = kiln_gguf_writer_write_rows(w, src_row, &sr, (int64_t)(t->nbytes / sr.row_bytes), tp,
                                         &err);
        if (od == target)
            n_target++;
        else
            n_f32++;
    }
    if (st == KILN_OK) st = kiln_gguf_writer_finish(w, &err);
    if (st != KILN_OK) goto done;
    if (n_requant)
        fprintf(stderr,
                "kiln quantize: warning: %zu tensors were already quantized and were "
                "re-quantized (the errors of both quantizations add up)\n",
                n_requant);
    printf("%s: %zu tensors: %zu to %s, %zu to f32, %zu copied unchanged (%.1f s)\n", out_path,
           g->n_tensors, n_target, kiln_dtype_name(target), n_f32, n_copied,
           (cli_now_ms() - t0) / 1e3);
    rc = 0;
    goto done_quiet;
done:
    rc = cli_fail(&err);
done_quiet:
    kiln_gguf_writer_destroy(w);
    kiln_gguf_close(g);
    kiln_threadpool_destroy(tp);
    return rc;
}
