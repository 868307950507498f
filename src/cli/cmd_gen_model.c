/*
 * cmd_gen_model.c - `kiln gen-model`: a Llama model with deterministic random weights and
 * real shapes, streamed to a GGUF file that llama.cpp and kiln both load (benchmarks make
 * their models with it; nothing large is committed).
 *
 * Weights: element e of tensor number t (in file order) is a function of (seed, t, e) only,
 * so every type, thread count and chunking produces the same underlying floats:
 *   k_t = mix(seed ^ mix((t + 1) * G)),  u = mix(k_t + e * G)   (G = 0x9E3779B97F4A7C15,
 *   mix = the splitmix64 finaliser), then the sum of u's four 16-bit lanes, centred and
 *   scaled: z = (sum - 2 * 65535) / 65535 * sqrt(3) has mean 0, variance 1, range
 *   [-2 sqrt 3, 2 sqrt 3] (Irwin-Hall of 4 uniforms, close to a normal).
 * Weight matrices are 0.02 z (the usual initializer range); norm weights are 1 + 0.02 z, so
 * activations stay in a sane range through the layers.
 * The tokenizer (every tokenizer.ggml.* key) is copied from a vocabulary GGUF, by default
 * llama.cpp's ggml-vocab-llama-spm.gguf from ../shared/tokenizer, and fixes n_vocab.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "util/error.h"

typedef struct gen_preset {
    const char *name;
    int32_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float eps, theta;
    bool own_vocab; /* no shipped vocabulary has n_vocab tokens: the default is --vocab none */
} gen_preset;

/* llama3.1-8b: Meta's Llama-3.1-8B config.json (hidden 4096, 32 layers, 32 heads, 8 KV heads,
 * intermediate 14336, vocab 128256, rms_norm_eps 1e-5, rope_theta 500000; its llama3 RoPE
 * frequency scaling is not written: the shape and the bytes are what the benchmarks need).
 * 8.03e9 parameters: 16.06 GB in bf16. */
static const gen_preset k_presets[] = {
    {"tiny", 64, 2, 4, 2, 256, 32000, 512, 1e-5f, 10000.0f, false},
    {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, 2048, 1e-5f, 10000.0f, false},
    {"llama-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 1e-5f, 10000.0f, false},
    {"llama-13b", 5120, 40, 40, 40, 13824, 32000, 4096, 1e-5f, 10000.0f, false},
    {"llama3.1-8b", 4096, 32, 32, 8, 14336, 128256, 8192, 1e-5f, 500000.0f, true},
};
#define N_PRESETS (sizeof k_presets / sizeof k_presets[0])

#define VOCAB_REL "tokenizer/ggml-vocab-llama-spm.gguf"

static void gen_usage(FILE *f) {
    fprintf(f, "usage: kiln gen-model --preset NAME -o OUT.gguf [--arch llama] [--type TYPE]\n"
               "                      [--seed S] [--vocab FILE|none] [-t N]\n"
               "\n"
               "Writes a Llama model with deterministic random weights and the shapes of a real\n"
               "one, streamed to disk (no tensor is held in memory whole).\n"
               "\n"
               "presets (hidden, layers, heads, KV heads, FFN, context, vocabulary, RoPE theta):\n");
    for (size_t i = 0; i < N_PRESETS; i++) {
        const gen_preset *p = &k_presets[i];
        fprintf(f, "  %-15s %5d %3d %3d %3d %6d %5d %6d%s %8.0f\n", p->name, p->n_embd, p->n_layer,
                p->n_head, p->n_head_kv, p->n_ff, p->n_ctx, p->n_vocab, p->own_vocab ? "*" : " ",
                (double)p->theta);
    }
    fprintf(f, "  (* no tokenizer unless --vocab names one: no shipped vocabulary has that many\n"
               "   tokens; the others take the default vocabulary's count)\n");
    fprintf(f,
            "\n"
            "options:\n"
            "  --type TYPE      weight matrix type: f16 (default), f32, bf16, q8_0, q4_0, q4_k,\n"
            "                   q6_k (matrices whose rows do not split into blocks, and norms,\n"
            "                   stay f32)\n"
            "  --seed S         unsigned 64-bit seed (default 0); same seed, same weights\n"
            "  --vocab FILE     vocabulary GGUF whose tokenizer.ggml.* keys are copied (default:\n"
            "                   $KILN_SHARED_DIR or the source tree's ../shared, %s);\n"
            "                   'none' writes no tokenizer (n_vocab from the preset)\n"
            "  -t, --threads N  threads (default: physical cores)\n",
            VOCAB_REL);
}

/* ---- the generator ------------------------------------------------------------------- */

#define GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct gen_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[4];
    kiln_dtype dtype;
    float center, scale; /* value = center + scale * z */
} gen_tensor;

typedef struct gen_ctx {
    uint64_t key;
    int64_t ne0;
    float center, scale;
} gen_ctx;

static void gen_row(void *vctx, int64_t row, float *out) {
    const gen_ctx *c = vctx;
    const float k = 1.7320508075688772f / 65535.0f; /* sqrt(3) / 65535 */
    uint64_t e = (uint64_t)row * (uint64_t)c->ne0;
    for (int64_t i = 0; i < c->ne0; i++, e++) {
        uint64_t u = mix64(c->key + e * GOLDEN);
        int64_t s = (int64_t)(u & 0xFFFF) + (int64_t)((u >> 16) & 0xFFFF) +
                    (int64_t)((u >> 32) & 0xFFFF) + (int64_t)(u >> 48) - 2 * 65535;
        out[i] = c->center + c->scale * ((float)s * k);
    }
}

static bool file_readable(const char *p) {
    return access(p, R_OK) == 0;
}

/* Default vocabulary: $KILN_SHARED_DIR, then <source root>/../shared (from __FILE__), then
 * ../shared relative to the working directory. */
static bool default_vocab(char *buf, size_t cap) {
    const char *env = getenv("KILN_SHARED_DIR");
    if (env && *env) {
        snprintf(buf, cap, "%s/%s", env, VOCAB_REL);
        if (file_readable(buf)) return true;
    }
    const char *self = __FILE__, *suffix = "src/cli/cmd_gen_model.c";
    size_t n = strlen(self), k = strlen(suffix);
    if (n >= k && strcmp(self + n - k, suffix) == 0) {
        snprintf(buf, cap, "%.*s../shared/%s", (int)(n - k), self, VOCAB_REL);
        if (file_readable(buf)) return true;
    }
    snprintf(buf, cap, "../shared/%s", VOCAB_REL);
    return file_readable(buf);
}

int kiln_cmd_gen_model(int argc, char **argv) {
    static const struct option opts[] = {
        {"arch", required_argument, 0, 'A'},
        {"preset", required_argument, 0, 'P'},
        {"type", required_argument, 0, 'T'},
        {"seed", required_argument, 0, 'S'},
        {"output", required_argument, 0, 'o'},
        {"vocab", required_argument, 0, 'V'},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *arch = "llama", *preset_name = NULL, *type_arg = "f16", *out_path = NULL,
               *vocab_arg = NULL;
    uint64_t seed = 0;
    int64_t threads = 0;
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":o:t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'A':
            arch = optarg;
            break;
        case 'P':
            preset_name = optarg;
            break;
        case 'T':
            type_arg = optarg;
            break;
        case 'S': {
            char *end;
            if (!*optarg || *optarg == '-')
                return cli_usage_error("gen-model", "--seed must be an unsigned integer");
            errno = 0;
            seed = strtoull(optarg, &end, 0);
            if (*end || errno)
                return cli_usage_error("gen-model", "--seed must be an unsigned 64-bit integer");
            break;
        }
        case 'o':
            out_path = optarg;
            break;
        case 'V':
            vocab_arg = optarg;
            break;
        case 't':
            if (!cli_parse_i64(optarg, 1, 512, &threads))
                return cli_usage_error("gen-model", "--threads must be in [1, 512] (got '%s')",
                                       optarg);
            break;
        case 'h':
            gen_usage(stdout);
            return 0;
        default:
            return cli_bad_option("gen-model", ch, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("gen-model", "unexpected argument '%s'", argv[optind]);
    if (strcmp(arch, "llama") != 0)
        return cli_usage_error("gen-model", "--arch '%s' is not supported (supported: llama)",
                               arch);
    if (!preset_name || !out_path)
        return cli_usage_error("gen-model", "--preset NAME and -o OUT.gguf are required");
    const gen_preset *pr = NULL;
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcmp(k_presets[i].name, preset_name)) pr = &k_presets[i];
    if (!pr)
        return cli_usage_error("gen-model",
                               "unknown preset '%s' (tiny, tinyllama-1.1b, llama-7b, llama-13b, "
                               "llama3.1-8b)",
                               preset_name);
    kiln_dtype type;
    if (!cli_parse_weight_type(type_arg, &type))
        return cli_usage_error("gen-model",
                               "--type must be one of f16 f32 bf16 q8_0 q4_0 q4_k q6_k (got '%s')",
                               type_arg);

    kiln_error err = {0};
    kiln_gguf *vocab = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_threadpool *tp = NULL;
    gen_tensor *ts = NULL;
    int rc = KILN_EXIT_ERROR;
    kiln_status st = KILN_OK;
    double t0 = cli_now_ms();
    int32_t n_vocab = pr->n_vocab;

    if (!vocab_arg && pr->own_vocab) vocab_arg = "none";
    if (!vocab_arg || strcmp(vocab_arg, "none") != 0) {
        char vpath[4400];
        if (vocab_arg) {
            snprintf(vpath, sizeof vpath, "%s", vocab_arg);
        } else if (!default_vocab(vpath, sizeof vpath)) {
            fprintf(stderr,
                    "kiln: error: cannot find the default vocabulary %s (looked under "
                    "$KILN_SHARED_DIR, the source tree's ../shared and ./../shared); "
                    "pass --vocab FILE or --vocab none\n",
                    VOCAB_REL);
            return KILN_EXIT_ERROR;
        }
        if ((st = kiln_gguf_open(vpath, &vocab, &err))) goto fail;
        const kiln_gguf_value *toks = kiln_gguf_get_arr(vocab, "tokenizer.ggml.tokens");
        if (!toks || toks->arr.elem_type != KILN_GGUF_STRING || toks->arr.n == 0 ||
            toks->arr.n > INT32_MAX || !kiln_gguf_find(vocab, "tokenizer.ggml.model")) {
            st = kiln_error_set(&err, KILN_ERR_FORMAT,
                                "%s: no tokenizer (tokenizer.ggml.model and a string array "
                                "tokenizer.ggml.tokens are required)",
                                vpath);
            goto fail;
        }
        if ((int64_t)toks->arr.n != n_vocab)
            fprintf(stderr,
                    "kiln gen-model: note: the vocabulary has %llu tokens; n_vocab follows "
                    "it (preset: %d)\n",
                    (unsigned long long)toks->arr.n, n_vocab);
        n_vocab = (int32_t)toks->arr.n;
    }

    /* tensors, in llama.cpp's order */
    const int64_t d = pr->n_embd, hd = pr->n_embd / pr->n_head, qd = (int64_t)pr->n_head * hd,
                  kvd = (int64_t)pr->n_head_kv * hd;
    size_t n_t = 3 + 9 * (size_t)pr->n_layer, k = 0;
    ts = calloc(n_t, sizeof *ts);
    if (!ts) {
        st = kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
#define MAT(nm, rows, cols)                                                                        \
    do {                                                                                           \
        gen_tensor *g_ = &ts[k++];                                                                 \
        snprintf(g_->name, sizeof g_->name, "%s", nm);                                             \
        g_->n_dims = 2;                                                                            \
        g_->ne[0] = (cols);                                                                        \
        g_->ne[1] = (rows);                                                                        \
        g_->ne[2] = g_->ne[3] = 1;                                                                 \
        g_->dtype =                                                                                \
            g_->ne[0] % kiln_dtype_traits_of(type)->block_size == 0 ? type : KILN_DTYPE_F32;       \
        g_->center = 0.0f;                                                                         \
        g_->scale = 0.02f;                                                                         \
    } while (0)
#define VEC(nm, n)                                                                                 \
    do {                                                                                           \
        gen_tensor *g_ = &ts[k++];                                                                 \
        snprintf(g_->name, sizeof g_->name, "%s", nm);                                             \
        g_->n_dims = 1;                                                                            \
        g_->ne[0] = (n);                                                                           \
        g_->ne[1] = g_->ne[2] = g_->ne[3] = 1;                                                     \
        g_->dtype = KILN_DTYPE_F32;                                                                \
        g_->center = 1.0f;                                                                         \
        g_->scale = 0.02f;                                                                         \
    } while (0)
    MAT("token_embd.weight", n_vocab, d);
    char nm[64];
    for (int32_t l = 0; l < pr->n_layer; l++) {
#define LNAME(s) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), nm)
        VEC(LNAME("attn_norm.weight"), d);
        MAT(LNAME("attn_q.weight"), qd, d);
        MAT(LNAME("attn_k.weight"), kvd, d);
        MAT(LNAME("attn_v.weight"), kvd, d);
        MAT(LNAME("attn_output.weight"), d, qd);
        VEC(LNAME("ffn_norm.weight"), d);
        MAT(LNAME("ffn_gate.weight"), pr->n_ff, d);
        MAT(LNAME("ffn_up.weight"), pr->n_ff, d);
        MAT(LNAME("ffn_down.weight"), d, pr->n_ff);
#undef LNAME
    }
    VEC("output_norm.weight", d);
    MAT("output.weight", n_vocab, d);
#undef MAT
#undef VEC

    /* metadata */
    char name[128];
    snprintf(name, sizeof name, "kiln gen-model %s seed %llu", pr->name, (unsigned long long)seed);
    st = kiln_gguf_writer_create(&w, &err);
#define OK(call)                                                                                   \
    if (st == KILN_OK) st = (call)
    OK(kiln_gguf_writer_set_str(w, "general.architecture", "llama", &err));
    OK(kiln_gguf_writer_set_str(w, "general.name", name, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)n_vocab, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)pr->n_ctx, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)pr->n_embd, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)pr->n_layer, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)pr->n_ff, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)hd, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)pr->n_head, &err));
    OK(kiln_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)pr->n_head_kv, &err));
    OK(kiln_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", pr->eps, &err));
    OK(kiln_gguf_writer_set_f32(w, "llama.rope.freq_base", pr->theta, &err));
    OK(kiln_gguf_writer_set_file_type(w, type, &err));
    OK(kiln_gguf_writer_set_str(w, "kiln.gen_model.preset", pr->name, &err));
    OK(kiln_gguf_writer_set_u64(w, "kiln.gen_model.seed", seed, &err));
    if (vocab) OK(kiln_gguf_writer_copy_kv(w, vocab, "tokenizer.ggml.", &err));
    for (size_t i = 0; i < n_t; i++)
        OK(kiln_gguf_writer_add_tensor(w, ts[i].name, ts[i].dtype, ts[i].n_dims, ts[i].ne, &err));
#undef OK
    if (st != KILN_OK) goto fail;
    if (cli_threadpool((int)threads, &tp) != 0) goto out;

    uint64_t total = 0;
    for (size_t i = 0; i < n_t; i++) total += kiln_gguf_writer_tensor_nbytes(w, i);
    fprintf(stderr, "kiln gen-model: %s, %s, %zu tensors, %.2f GB of weights -> %s\n", pr->name,
            kiln_dtype_name(type), n_t, (double)total / 1e9, out_path);
    st = kiln_gguf_writer_begin(w, out_path, &err);
    for (size_t i = 0; i < n_t && st == KILN_OK; i++) {
        gen_ctx gc = {mix64(seed ^ mix64((uint64_t)(i + 1) * GOLDEN)), ts[i].ne[0], ts[i].center,
                      ts[i].scale};
        st = kiln_gguf_writer_write_rows(w, gen_row, &gc, ts[i].ne[1] * ts[i].ne[2] * ts[i].ne[3],
                                         tp, &err);
    }
    if (st == KILN_OK) st = kiln_gguf_writer_finish(w, &err);
    if (st != KILN_OK) goto fail;
    printf("%s: %s %s seed %llu, %zu tensors, %.2f GB (%.1f s)\n", out_path, pr->name,
           kiln_dtype_name(type), (unsigned long long)seed, n_t, (double)total / 1e9,
           (cli_now_ms() - t0) / 1e3);
    rc = 0;
    goto out;
fail:
    rc = cli_fail(&err);
out:
    kiln_gguf_writer_destroy(w);
    kiln_gguf_close(vocab);
    kiln_threadpool_destroy(tp);
    free(ts);
    return rc;
}
