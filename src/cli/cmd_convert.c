/*
 * cmd_convert.c - `kiln convert HF_DIR OUT.gguf [--type T]`: a Hugging Face checkpoint
 * (config.json + safetensors, sharded or not) to a GGUF file that llama.cpp and kiln load.
 *
 * Semantics follow llama.cpp's convert_hf_to_gguf.py (read for its conventions only):
 *   - architectures: "llama" (LlamaForCausalLM, model_type "llama") and "qwen2"
 *     (Qwen2ForCausalLM: q/k/v biases, NEOX-style RoPE);
 *   - metadata: general.architecture, general.name, general.file_type (+
 *     general.quantization_version for quantized files) and <arch>.vocab_size,
 *     .context_length, .embedding_length, .block_count, .feed_forward_length,
 *     .rope.dimension_count, .attention.head_count, .attention.head_count_kv,
 *     .attention.layer_norm_rms_epsilon, .rope.freq_base, and .attention.key_length /
 *     .value_length when head_dim differs from hidden_size / num_attention_heads;
 *   - tensor names: token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
 *     ffn_norm, ffn_gate, ffn_up, ffn_down}, output_norm, output (absent when the
 *     embeddings are tied), with .weight (and .bias for qwen2's q/k/v);
 *   - llama's q_proj / k_proj rows are permuted per head from the half-split order that
 *     transformers' rotate_half expects to the adjacent-pair order of llama.cpp's
 *     LLAMA_ROPE_TYPE_NORM: GGUF row h*hd + 2i + s = HF row h*hd + s*hd/2 + i (k_proj with
 *     the KV head count). qwen2 keeps HF order (llama.cpp runs it with NEOX RoPE);
 *   - llama3 rope scaling: a rope_freqs.weight f32 [head_dim/2] tensor of per-frequency
 *     factors (1 above the high-frequency wavelength, `factor` below the low one, and
 *     1 / ((1 - s) / factor + s) between, s the smoothing of transformers'
 *     _compute_llama3_parameters); a runtime divides each inverse frequency by its factor.
 * Weight matrices become --type (default: the checkpoint's own dtype per tensor, lossless);
 * those whose rows do not split into the type's blocks, and every 1-D tensor (norms,
 * biases), are stored as f32.
 * Tokenizer: a directory with tokenizer.json gets its tokenizer as GGUF metadata
 * (tokenizer/hf_to_gguf.h: tokenizer.ggml.model "gpt2", .pre, .tokens, .token_type, .merges,
 * special ids, add_bos/add_eos, tokenizer.chat_template), checked after writing: kiln reads
 * the GGUF's tokenizer back and must encode a probe text as it does from tokenizer.json (a
 * mismatch is an error). Tokenizers it cannot write (SentencePiece-style, WordPiece, unknown
 * pre-tokenizers) are refused with the reason; --vocab FILE instead copies the
 * tokenizer.ggml.* keys of a GGUF (exactly vocab_size tokens), and --no-tokenizer writes none
 * (llama.cpp refuses such a file; kiln loads it for token ids).
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/safetensors.h"
#include "format/json_file.h"
#include "tokenizer/hf_to_gguf.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

static void convert_usage(FILE *f) {
    fprintf(f,
            "usage: kiln convert HF_DIR OUT.gguf [--type TYPE] [--vocab FILE | --no-tokenizer]\n"
            "                    [-t N]\n"
            "\n"
            "Converts a Hugging Face checkpoint directory (config.json and model.safetensors,\n"
            "or a sharded model.safetensors.index.json) of a Llama-family model (model_type\n"
            "llama or qwen2) to GGUF with llama.cpp's metadata keys, tensor names and Q/K row\n"
            "order.\n"
            "\n"
            "options:\n"
            "  --type TYPE      weight matrix type: auto (default: keep each tensor's f32/f16/\n"
            "                   bf16), f32, f16, bf16, q8_0, q4_0, q4_k, q6_k; norms, biases and\n"
            "                   matrices whose rows do not split into blocks stay f32\n"
            "  --vocab FILE     copy the tokenizer (tokenizer.ggml.* keys) of this GGUF, whose\n"
            "                   token count must equal vocab_size\n"
            "  --no-tokenizer   write no tokenizer metadata (llama.cpp then refuses the file)\n"
            "  -t, --threads N  threads (default: physical cores)\n"
            "\n"
            "The directory's tokenizer.json (byte-level BPE with GPT-2, Llama 3 or Qwen2\n"
            "pre-tokenization) becomes the GGUF's tokenizer.ggml.* metadata and\n"
            "tokenizer.chat_template (from tokenizer_config.json), which llama.cpp reads; kiln\n"
            "checks that the written tokenizer encodes a probe text as tokenizer.json does.\n"
            "Other tokenizers are refused with the reason (use --vocab or --no-tokenizer).\n");
}

typedef enum { ARCH_LLAMA, ARCH_QWEN2 } conv_arch;

typedef struct hf_cfg {
    conv_arch arch;
    const char *arch_name;
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx;
    double eps, theta;
    bool tied;
    bool llama3;
    double r_factor, r_low, r_high;
    int32_t r_orig_ctx;
} hf_cfg;

/* ---- config.json --------------------------------------------------------------------- */

static bool jint(json_t *o, const char *key, int32_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x <= 0 || x > INT32_MAX) return false;
    *out = (int32_t)x;
    return true;
}

static bool jnum(json_t *o, const char *key, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return true;
}

static kiln_status read_config(const char *dir, hf_cfg *c, kiln_error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root;
    kiln_status jst = kiln_json_load_path(path, JSON_REJECT_DUPLICATES, &root, err);
    if (jst) return jst;
    kiln_status st = KILN_OK;
    memset(c, 0, sizeof *c);
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!json_is_object(root) || !mt) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: no model_type", path);
        goto done;
    }
    if (!strcmp(mt, "llama")) {
        c->arch = ARCH_LLAMA;
        c->arch_name = "llama";
    } else if (!strcmp(mt, "qwen2")) {
        c->arch = ARCH_QWEN2;
        c->arch_name = "qwen2";
    } else {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: model_type '%s' cannot be converted (supported: llama, qwen2)",
                            path, mt);
        goto done;
    }
    static const char *req[] = {"vocab_size", "hidden_size", "num_hidden_layers",
                                "num_attention_heads", "intermediate_size"};
    int32_t *dst[] = {&c->n_vocab, &c->n_embd, &c->n_layer, &c->n_head, &c->n_ff};
    for (int i = 0; i < 5; i++)
        if (!jint(root, req[i], dst[i])) {
            st =
                kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: field '%s' is missing or not a positive integer", path, req[i]);
            goto done;
        }
    c->n_head_kv = c->n_head;
    if (json_object_get(root, "num_key_value_heads") &&
        !json_is_null(json_object_get(root, "num_key_value_heads")) &&
        !jint(root, "num_key_value_heads", &c->n_head_kv)) {
        st = kiln_error_set(err, KILN_ERR_FORMAT,
                            "%s: num_key_value_heads is not a positive "
                            "integer",
                            path);
        goto done;
    }
    c->head_dim = c->n_embd / c->n_head;
    json_t *hd = json_object_get(root, "head_dim");
    if (hd && !json_is_null(hd) && !jint(root, "head_dim", &c->head_dim)) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: head_dim is not a positive integer", path);
        goto done;
    }
    if (c->n_head % c->n_head_kv != 0 || c->head_dim % 2 != 0) {
        st = kiln_error_set(err, KILN_ERR_FORMAT,
                            "%s: num_attention_heads (%d) must be a multiple of "
                            "num_key_value_heads (%d) and head_dim (%d) even",
                            path, c->n_head, c->n_head_kv, c->head_dim);
        goto done;
    }
    c->n_ctx = 0;
    jint(root, "max_position_embeddings", &c->n_ctx);
    c->eps = 1e-6;
    if (!jnum(root, "rms_norm_eps", &c->eps) || !(c->eps > 0)) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: rms_norm_eps is missing or not positive",
                            path);
        goto done;
    }
    c->tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu") != 0) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: hidden_act '%s' is not supported "
                            "(silu only)",
                            path, act);
        goto done;
    }
    if (json_is_true(json_object_get(root, "mlp_bias")) ||
        (c->arch == ARCH_LLAMA && json_is_true(json_object_get(root, "attention_bias")))) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: attention_bias / mlp_bias are not supported for %s", path, mt);
        goto done;
    }
    if (c->arch == ARCH_QWEN2 && json_is_true(json_object_get(root, "use_sliding_window"))) {
        st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: use_sliding_window is not supported for qwen2", path);
        goto done;
    }
    /* rope: transformers 5.x rope_parameters, or 4.x rope_theta + rope_scaling */
    c->theta = 10000.0;
    jnum(root, "rope_theta", &c->theta);
    json_t *rp = json_object_get(root, "rope_parameters");
    if (!json_is_object(rp)) rp = json_object_get(root, "rope_scaling");
    if (json_is_object(rp)) {
        jnum(rp, "rope_theta", &c->theta);
        const char *rt = json_string_value(json_object_get(rp, "rope_type"));
        if (!rt) rt = json_string_value(json_object_get(rp, "type"));
        if (rt && !strcmp(rt, "llama3")) {
            c->llama3 = true;
            if (!jnum(rp, "factor", &c->r_factor) || !jnum(rp, "low_freq_factor", &c->r_low) ||
                !jnum(rp, "high_freq_factor", &c->r_high) ||
                !jint(rp, "original_max_position_embeddings", &c->r_orig_ctx) ||
                !(c->r_factor > 0) || !(c->r_high > c->r_low) || !(c->r_low > 0)) {
                st = kiln_error_set(err, KILN_ERR_FORMAT,
                                    "%s: llama3 rope scaling needs positive factor, "
                                    "low_freq_factor < high_freq_factor and "
                                    "original_max_position_embeddings",
                                    path);
                goto done;
            }
        } else if (rt && strcmp(rt, "default") != 0) {
            st = kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                "%s: rope_type '%s' cannot be converted (supported: default, "
                                "llama3)",
                                path, rt);
            goto done;
        }
    }
    if (!(c->theta > 0)) {
        st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: rope_theta must be positive", path);
        goto done;
    }
done:
    json_decref(root);
    return st;
}

/* ---- tensor plan --------------------------------------------------------------------- */

typedef struct plan_tensor {
    char name[64];
    const kiln_st_tensor *src; /* NULL: synthesized (rope_freqs) */
    const float *synth;
    kiln_dtype dtype;
    uint32_t n_dims;
    int64_t ne[4];
    int32_t perm_heads; /* > 0: permute rows per head (llama q/k) */
} plan_tensor;

typedef struct plan {
    plan_tensor *t;
    size_t n, cap;
} plan;

static kiln_status plan_add(plan *p, const kiln_safetensors *st, const char *hf_name,
                            const char *gguf_name, int64_t rows, int64_t cols, int32_t perm,
                            bool want_type, kiln_dtype type, const char *dir, kiln_error *err) {
    const kiln_st_tensor *s = kiln_safetensors_find(st, hf_name);
    if (!s) return kiln_error_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' is missing", dir, hf_name);
    bool vec = rows == 0;
    bool shape_ok = vec ? (s->n_dims == 1 && s->shape[0] == cols)
                        : (s->n_dims == 2 && s->shape[0] == rows && s->shape[1] == cols);
    if (!shape_ok) {
        if (vec)
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "%s: tensor '%s' should be a vector of %lld elements", dir,
                                  hf_name, (long long)cols);
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: tensor '%s' should have shape [%lld, %lld]", dir, hf_name,
                              (long long)rows, (long long)cols);
    }
    const kiln_dtype_traits *tr = kiln_dtype_traits_of((int32_t)s->dtype);
    if (!tr || !tr->to_float)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s", dir,
                              hf_name, kiln_dtype_name((int32_t)s->dtype));
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 64;
        plan_tensor *nt = realloc(p->t, nc * sizeof *nt);
        if (!nt) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        p->t = nt;
        p->cap = nc;
    }
    plan_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", gguf_name);
    t->src = s;
    t->n_dims = vec ? 1 : 2;
    t->ne[0] = cols;
    t->ne[1] = vec ? 1 : rows;
    t->ne[2] = t->ne[3] = 1;
    t->perm_heads = perm;
    /* matrices: the requested type if its blocks fit, else f32; auto keeps f32/f16/bf16 */
    kiln_dtype want = want_type ? type : s->dtype;
    if (vec || cols % kiln_dtype_traits_of((int32_t)want)->block_size != 0) want = KILN_DTYPE_F32;
    t->dtype = want;
    return KILN_OK;
}

/* Mark an HF tensor as consumed (by name) so leftovers can be reported. */
static bool is_ignorable(const char *name) {
    /* buffers some checkpoints carry: recomputed at load time */
    return strstr(name, "rotary_emb.inv_freq") != NULL;
}

typedef struct row_src {
    const plan_tensor *t;
    size_t row_bytes;
    const kiln_dtype_traits *tr;
} row_src;

static void plan_row(void *ctx, int64_t row, float *out) {
    const row_src *c = ctx;
    const plan_tensor *t = c->t;
    if (!t->src) {
        memcpy(out, t->synth + row * t->ne[0], (size_t)t->ne[0] * sizeof *out);
        return;
    }
    int64_t src_row = row;
    if (t->perm_heads > 0) {
        int64_t hd = t->ne[1] / t->perm_heads, h = row / hd, i = row % hd;
        src_row = h * hd + (i % 2) * (hd / 2) + i / 2;
    }
    c->tr->to_float((const uint8_t *)t->src->data + (size_t)src_row * c->row_bytes, out, t->ne[0]);
}

/* llama3 per-frequency factors (see the file comment). */
static void llama3_factors(const hf_cfg *c, float *f) {
    const double two_pi = 6.283185307179586;
    double low_wavelen = c->r_orig_ctx / c->r_low, high_wavelen = c->r_orig_ctx / c->r_high;
    for (int32_t j = 0; j < c->head_dim / 2; j++) {
        double inv = 1.0 / pow(c->theta, (double)(2 * j) / (double)c->head_dim);
        double wavelen = two_pi / inv;
        double factor;
        if (wavelen < high_wavelen) {
            factor = 1.0;
        } else if (wavelen > low_wavelen) {
            factor = c->r_factor;
        } else {
            double s = (c->r_orig_ctx / wavelen - c->r_low) / (c->r_high - c->r_low);
            factor = 1.0 / ((1.0 - s) / c->r_factor + s);
        }
        f[j] = (float)factor;
    }
}

static const char *base_name(const char *dir) {
    static char buf[256];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    size_t len = n - b < sizeof buf - 1 ? n - b : sizeof buf - 1;
    memcpy(buf, dir + b, len);
    buf[len] = '\0';
    return buf;
}

static kiln_status set_metadata(kiln_gguf_writer *w, const hf_cfg *c, const char *dir,
                                kiln_dtype file_type, kiln_error *err) {
    char key[128];
    kiln_status st;
#define U32(suffix, val)                                                                           \
    do {                                                                                           \
        snprintf(key, sizeof key, "%s.%s", c->arch_name, suffix);                                  \
        if ((st = kiln_gguf_writer_set_u32(w, key, (uint32_t)(val), err))) return st;              \
    } while (0)
#define F32(suffix, val)                                                                           \
    do {                                                                                           \
        snprintf(key, sizeof key, "%s.%s", c->arch_name, suffix);                                  \
        if ((st = kiln_gguf_writer_set_f32(w, key, (float)(val), err))) return st;                 \
    } while (0)
    if ((st = kiln_gguf_writer_set_str(w, "general.architecture", c->arch_name, err))) return st;
    if ((st = kiln_gguf_writer_set_str(w, "general.name", base_name(dir), err))) return st;
    U32("vocab_size", c->n_vocab);
    if (c->n_ctx > 0) U32("context_length", c->n_ctx);
    U32("embedding_length", c->n_embd);
    U32("block_count", c->n_layer);
    U32("feed_forward_length", c->n_ff);
    U32("rope.dimension_count", c->head_dim);
    U32("attention.head_count", c->n_head);
    U32("attention.head_count_kv", c->n_head_kv);
    F32("attention.layer_norm_rms_epsilon", c->eps);
    F32("rope.freq_base", c->theta);
    if (c->head_dim != c->n_embd / c->n_head) {
        U32("attention.key_length", c->head_dim);
        U32("attention.value_length", c->head_dim);
    }
#undef U32
#undef F32
    return kiln_gguf_writer_set_file_type(w, file_type, err);
}

/* A probe text for the round trip: code, contractions, digits, runs of spaces and newlines,
 * punctuation, several scripts, an emoji and the special-token texts left unparsed. */
static const char g_probe[] =
    "def f(x, y=3):\n    return x**2 + y  # it's 12345 o'clock\n\n\n\t\tclass A:\n"
    "  \"\"\"Doc.\"\"\"   \n    pass\r\n"
    "Hello world! I'm here, you're there; we'll see. 3.14159 1,000,000 ...\n"
    "\xc3\xa9t\xc3\xa9 na\xc3\xafve \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80 "
    "<|endoftext|> <s> </s>   \n";

/* The written GGUF's tokenizer must encode the probe text (with and without specials) as
 * kiln's tokenizer.json loader does. */
static kiln_status check_tokenizer(const char *dir, const char *gguf_path, kiln_error *err) {
    kiln_gguf *g = NULL;
    kiln_tokenizer *tg = NULL, *th = NULL;
    kiln_ivec a = {0}, b = {0};
    kiln_status st = kiln_gguf_open(gguf_path, &g, err);
    if (!st) st = kiln_tokenizer_from_gguf(g, &tg, err);
    if (!st) st = kiln_tokenizer_from_hf_dir(dir, &th, err);
    for (int pass = 0; pass < 2 && !st; pass++) {
        bool special = pass == 1;
        a.n = b.n = 0;
        st = kiln_tokenizer_encode(th, g_probe, sizeof g_probe - 1, special, special, &a, err);
        if (!st)
            st = kiln_tokenizer_encode(tg, g_probe, sizeof g_probe - 1, special, special, &b, err);
        if (st) break;
        size_t i = 0;
        while (i < a.n && i < b.n && a.data[i] == b.data[i]) i++;
        if (i < a.n || i < b.n)
            st = kiln_error_set(err, KILN_ERR_INTERNAL,
                                "%s: the written tokenizer encodes the probe text differently "
                                "from %s/tokenizer.json (%s specials: %zu vs %zu ids, first "
                                "difference at id %zu: %d vs %d)",
                                gguf_path, dir, special ? "with" : "without", b.n, a.n, i,
                                i < b.n ? b.data[i] : -1, i < a.n ? a.data[i] : -1);
    }
    kiln_ivec_free(&a);
    kiln_ivec_free(&b);
    kiln_tokenizer_destroy(tg);
    kiln_tokenizer_destroy(th);
    kiln_gguf_close(g);
    return st;
}

int kiln_cmd_convert(int argc, char **argv) {
    static const struct option opts[] = {
        {"type", required_argument, 0, 'T'},
        {"vocab", required_argument, 0, 'V'},
        {"no-tokenizer", no_argument, 0, 'N'},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *type_arg = NULL, *vocab_path = NULL;
    bool no_tokenizer = false;
    int64_t threads = 0;
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'T':
            type_arg = optarg;
            break;
        case 'V':
            vocab_path = optarg;
            break;
        case 'N':
            no_tokenizer = true;
            break;
        case 't':
            if (!cli_parse_i64(optarg, 1, 512, &threads))
                return cli_usage_error("convert", "--threads must be in [1, 512] (got '%s')",
                                       optarg);
            break;
        case 'h':
            convert_usage(stdout);
            return 0;
        default:
            return cli_bad_option("convert", ch, argv);
        }
    }
    if (argc - optind != 2)
        return cli_usage_error("convert", "expected HF_DIR OUT.gguf (got %d arguments)",
                               argc - optind);
    const char *dir = argv[optind], *out_path = argv[optind + 1];
    if (no_tokenizer && vocab_path)
        return cli_usage_error("convert", "--vocab and --no-tokenizer exclude each other");
    if (cli_clobbers_input(out_path, dir) || cli_clobbers_input(out_path, vocab_path))
        return cli_usage_error(
            "convert", "OUT.gguf '%s' is one of the input files; write to a new path", out_path);
    bool want_type = false;
    kiln_dtype type = KILN_DTYPE_F32;
    if (type_arg && strcmp(type_arg, "auto") != 0) {
        if (!cli_parse_weight_type(type_arg, &type))
            return cli_usage_error("convert",
                                   "--type must be one of auto f32 f16 bf16 q8_0 q4_0 q4_k q6_k "
                                   "(got '%s')",
                                   type_arg);
        want_type = true;
    }

    kiln_error err = {0};
    struct stat dsb;
    if (stat(dir, &dsb) != 0 || !S_ISDIR(dsb.st_mode)) {
        kiln_error_set(&err, KILN_ERR_INVALID_ARGUMENT,
                       "%s: not a directory (convert takes a Hugging Face model directory, the "
                       "one holding config.json)",
                       dir);
        return cli_fail(&err);
    }
    hf_cfg c;
    kiln_safetensors *st = NULL;
    kiln_gguf_writer *w = NULL;
    kiln_threadpool *tp = NULL;
    kiln_gguf *vocab = NULL;
    plan p = {0};
    float *rope_factors = NULL;
    bool *used = NULL;
    int rc = KILN_EXIT_ERROR;
    double t0 = cli_now_ms();
    kiln_status s = read_config(dir, &c, &err);
    if (s == KILN_OK) s = kiln_safetensors_open(dir, &st, &err);
    if (s == KILN_OK && vocab_path) {
        s = kiln_gguf_open(vocab_path, &vocab, &err);
        const kiln_gguf_value *toks =
            s == KILN_OK ? kiln_gguf_get_arr(vocab, "tokenizer.ggml.tokens") : NULL;
        if (s == KILN_OK && (!toks || toks->arr.elem_type != KILN_GGUF_STRING ||
                             !kiln_gguf_find(vocab, "tokenizer.ggml.model")))
            s = kiln_error_set(&err, KILN_ERR_FORMAT,
                               "%s: no tokenizer (tokenizer.ggml.model and a string array "
                               "tokenizer.ggml.tokens are required)",
                               vocab_path);
        else if (s == KILN_OK && toks->arr.n != (uint64_t)c.n_vocab)
            s = kiln_error_set(
                &err, KILN_ERR_INVALID_ARGUMENT,
                "%s: the vocabulary has %llu tokens but the model's vocab_size is %d", vocab_path,
                (unsigned long long)toks->arr.n, c.n_vocab);
    }
    if (s != KILN_OK) goto fail;

    /* tensor plan, in llama.cpp's order */
    const int64_t d = c.n_embd, qd = (int64_t)c.n_head * c.head_dim,
                  kvd = (int64_t)c.n_head_kv * c.head_dim;
    const bool llama = c.arch == ARCH_LLAMA;
    s = plan_add(&p, st, "model.embed_tokens.weight", "token_embd.weight", c.n_vocab, d, 0,
                 want_type, type, dir, &err);
    if (s == KILN_OK && c.llama3) {
        rope_factors = malloc((size_t)(c.head_dim / 2) * sizeof *rope_factors);
        if (!rope_factors) {
            s = kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        llama3_factors(&c, rope_factors);
        plan_tensor *rt = NULL;
        if (p.n == p.cap) {
            plan_tensor *nt = realloc(p.t, (p.cap + 1) * sizeof *nt);
            if (!nt) {
                s = kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
                goto fail;
            }
            p.t = nt;
            p.cap++;
        }
        rt = &p.t[p.n++];
        memset(rt, 0, sizeof *rt);
        snprintf(rt->name, sizeof rt->name, "rope_freqs.weight");
        rt->synth = rope_factors;
        rt->dtype = KILN_DTYPE_F32;
        rt->n_dims = 1;
        rt->ne[0] = c.head_dim / 2;
        rt->ne[1] = rt->ne[2] = rt->ne[3] = 1;
    }
    for (int32_t l = 0; l < c.n_layer && s == KILN_OK; l++) {
        struct {
            const char *hf, *gguf;
            int64_t rows, cols;
            int32_t perm;
        } L[] = {
            {"input_layernorm.weight", "attn_norm.weight", 0, d, 0},
            {"self_attn.q_proj.weight", "attn_q.weight", qd, d, llama ? c.n_head : 0},
            {"self_attn.q_proj.bias", "attn_q.bias", 0, qd, 0},
            {"self_attn.k_proj.weight", "attn_k.weight", kvd, d, llama ? c.n_head_kv : 0},
            {"self_attn.k_proj.bias", "attn_k.bias", 0, kvd, 0},
            {"self_attn.v_proj.weight", "attn_v.weight", kvd, d, 0},
            {"self_attn.v_proj.bias", "attn_v.bias", 0, kvd, 0},
            {"self_attn.o_proj.weight", "attn_output.weight", d, qd, 0},
            {"post_attention_layernorm.weight", "ffn_norm.weight", 0, d, 0},
            {"mlp.gate_proj.weight", "ffn_gate.weight", c.n_ff, d, 0},
            {"mlp.up_proj.weight", "ffn_up.weight", c.n_ff, d, 0},
            {"mlp.down_proj.weight", "ffn_down.weight", d, c.n_ff, 0},
        };
        for (size_t i = 0; i < sizeof L / sizeof L[0] && s == KILN_OK; i++) {
            bool bias = strstr(L[i].hf, ".bias") != NULL;
            if (bias && llama) continue;
            char hf[160], gg[64];
            snprintf(hf, sizeof hf, "model.layers.%d.%s", l, L[i].hf);
            snprintf(gg, sizeof gg, "blk.%d.%s", l, L[i].gguf);
            s = plan_add(&p, st, hf, gg, L[i].rows, L[i].cols, L[i].perm, want_type, type, dir,
                         &err);
        }
    }
    if (s == KILN_OK)
        s = plan_add(&p, st, "model.norm.weight", "output_norm.weight", 0, d, 0, want_type, type,
                     dir, &err);
    if (s == KILN_OK && !c.tied) {
        if (kiln_safetensors_find(st, "lm_head.weight"))
            s = plan_add(&p, st, "lm_head.weight", "output.weight", c.n_vocab, d, 0, want_type,
                         type, dir, &err);
        else
            fprintf(stderr, "kiln convert: note: no lm_head.weight; the output layer is tied to "
                            "the embeddings\n");
    }
    if (s != KILN_OK) goto fail;

    /* every checkpoint tensor must be used (or a known buffer): never drop weights silently */
    used = calloc(st->n_tensors + 1, sizeof *used);
    if (!used) {
        s = kiln_error_set(&err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < p.n; i++)
        if (p.t[i].src) used[p.t[i].src - st->tensors] = true;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const char *n = st->tensors[i].name;
        if (used[i] || is_ignorable(n) || (c.tied && !strcmp(n, "lm_head.weight"))) continue;
        s = kiln_error_set(&err, KILN_ERR_UNSUPPORTED,
                           "%s: tensor '%s' has no place in a %s GGUF (unsupported variant?)", dir,
                           n, c.arch_name);
        goto fail;
    }
    char tokp[4200];
    snprintf(tokp, sizeof tokp, "%s/tokenizer.json", dir);
    bool has_json = access(tokp, F_OK) == 0;
    snprintf(tokp, sizeof tokp, "%s/tokenizer.model", dir);
    bool has_spm = access(tokp, F_OK) == 0;
    bool carry = !vocab && !no_tokenizer && has_json;
    if (!vocab && !no_tokenizer && !has_json && has_spm) {
        s = kiln_error_set(&err, KILN_ERR_UNSUPPORTED,
                           "%s: only tokenizer.model (SentencePiece) is there, which convert does "
                           "not read: give --vocab FILE (a GGUF with this vocabulary) or "
                           "--no-tokenizer",
                           dir);
        goto fail;
    }
    if (!vocab && !no_tokenizer && !has_json)
        fprintf(stderr, "kiln convert: note: %s has no tokenizer.json; the GGUF has no tokenizer "
                        "metadata\n",
                dir);

    /* file type: that of the first weight matrix (token_embd) */
    s = kiln_gguf_writer_create(&w, &err);
    if (s == KILN_OK) s = set_metadata(w, &c, dir, p.t[0].dtype, &err);
    if (s == KILN_OK && vocab) s = kiln_gguf_writer_copy_kv(w, vocab, "tokenizer.ggml.", &err);
    kiln_hf_gguf_info tinfo = {0};
    if (s == KILN_OK && carry) {
        s = kiln_hf_tokenizer_to_gguf(dir, c.n_vocab, w, &tinfo, &err);
        if (s != KILN_OK)
            kiln_error_prefix(&err, "tokenizer (give --vocab FILE or --no-tokenizer to convert "
                                    "without it): ");
    }
    for (size_t i = 0; i < p.n && s == KILN_OK; i++)
        s = kiln_gguf_writer_add_tensor(w, p.t[i].name, p.t[i].dtype, p.t[i].n_dims, p.t[i].ne,
                                        &err);
    if (s != KILN_OK) goto fail;
    if (cli_threadpool((int)threads, &tp) != 0) goto out;
    s = kiln_gguf_writer_begin(w, out_path, &err);
    for (size_t i = 0; i < p.n && s == KILN_OK; i++) {
        const plan_tensor *t = &p.t[i];
        if (t->src && t->src->dtype == t->dtype && t->perm_heads == 0) {
            s = kiln_gguf_writer_write_data(w, t->src->data, t->src->nbytes, &err);
            continue;
        }
        row_src rs = {t, 0, NULL};
        if (t->src) {
            rs.tr = kiln_dtype_traits_of((int32_t)t->src->dtype);
            rs.row_bytes = kiln_dtype_row_size(t->src->dtype, t->ne[0]);
        }
        s = kiln_gguf_writer_write_rows(w, plan_row, &rs, t->ne[1] * t->ne[2] * t->ne[3], tp, &err);
    }
    if (s == KILN_OK) s = kiln_gguf_writer_finish(w, &err);
    if (s == KILN_OK && carry && (s = check_tokenizer(dir, out_path, &err)) != KILN_OK)
        unlink(out_path);
    if (s != KILN_OK) goto fail;
    if (carry) {
        printf("%s: tokenizer: %s (pre %s), %d tokens (%d named), %d merges\n", out_path,
               tinfo.model, tinfo.pre, tinfo.n_tokens, tinfo.n_named, tinfo.n_merges);
        if (tinfo.note) fprintf(stderr, "kiln convert: note: %s\n", tinfo.note);
    }
    printf("%s: %s, %zu tensors, weights %s%s (%.1f s)\n", out_path, c.arch_name, p.n,
           want_type ? kiln_dtype_name(type) : "as in the checkpoint",
           c.llama3 ? ", llama3 rope_freqs" : "", (cli_now_ms() - t0) / 1e3);
    rc = 0;
    goto out;
fail:
    rc = cli_fail(&err);
out:
    kiln_gguf_writer_destroy(w);
    kiln_safetensors_close(st);
    kiln_gguf_close(vocab);
    kiln_threadpool_destroy(tp);
    free(p.t);
    free(rope_factors);
    free(used);
    return rc;
}
