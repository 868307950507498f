/* cmd_inspect.c - `kiln inspect`: metadata, tensor table and detected model config. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/safetensors.h"
#include "util/error.h"

static void print_str(const char *s, uint64_t len, uint64_t max) {
    putchar('"');
    for (uint64_t i = 0; i < len && i < max; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch == '\n') printf("\\n");
        else if (ch < 0x20) printf("\\x%02x", ch);
        else putchar(ch);
    }
    putchar('"');
    if (len > max) printf("...(%llu bytes)", (unsigned long long)len);
}

static const char *gguf_type_name(kiln_gguf_type t) {
    static const char *names[] = {"u8",  "i8",  "u16", "i16",   "u32", "i32", "f32",
                                  "bool", "str", "arr", "u64",   "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static void print_value(const kiln_gguf_value *v) {
    switch (v->type) {
    case KILN_GGUF_UINT8: case KILN_GGUF_UINT16: case KILN_GGUF_UINT32: case KILN_GGUF_UINT64:
        printf("%llu", (unsigned long long)v->u64);
        break;
    case KILN_GGUF_INT8: case KILN_GGUF_INT16: case KILN_GGUF_INT32: case KILN_GGUF_INT64:
        printf("%lld", (long long)v->i64);
        break;
    case KILN_GGUF_FLOAT32: case KILN_GGUF_FLOAT64: printf("%g", v->f64); break;
    case KILN_GGUF_BOOL: printf("%s", v->b ? "true" : "false"); break;
    case KILN_GGUF_STRING: print_str(v->str.data, v->str.len, 200); break;
    case KILN_GGUF_ARRAY: {
        printf("[%s x %llu] [", gguf_type_name(v->arr.elem_type), (unsigned long long)v->arr.n);
        uint64_t show = v->arr.n < 8 ? v->arr.n : 8;
        for (uint64_t i = 0; i < show; i++) {
            if (i) printf(", ");
            switch (v->arr.elem_type) {
            case KILN_GGUF_STRING: {
                const kiln_gguf_str *s = (const kiln_gguf_str *)v->arr.data + i;
                print_str(s->data, s->len, 40);
                break;
            }
            case KILN_GGUF_ARRAY: print_value((const kiln_gguf_value *)v->arr.data + i); break;
            case KILN_GGUF_UINT8: printf("%u", ((const uint8_t *)v->arr.data)[i]); break;
            case KILN_GGUF_INT8: printf("%d", ((const int8_t *)v->arr.data)[i]); break;
            case KILN_GGUF_UINT16: printf("%u", ((const uint16_t *)v->arr.data)[i]); break;
            case KILN_GGUF_INT16: printf("%d", ((const int16_t *)v->arr.data)[i]); break;
            case KILN_GGUF_UINT32: printf("%u", ((const uint32_t *)v->arr.data)[i]); break;
            case KILN_GGUF_INT32: printf("%d", ((const int32_t *)v->arr.data)[i]); break;
            case KILN_GGUF_UINT64: printf("%llu", (unsigned long long)((const uint64_t *)v->arr.data)[i]); break;
            case KILN_GGUF_INT64: printf("%lld", (long long)((const int64_t *)v->arr.data)[i]); break;
            case KILN_GGUF_FLOAT32: printf("%g", ((const float *)v->arr.data)[i]); break;
            case KILN_GGUF_FLOAT64: printf("%g", ((const double *)v->arr.data)[i]); break;
            case KILN_GGUF_BOOL: printf("%s", ((const uint8_t *)v->arr.data)[i] ? "true" : "false"); break;
            }
        }
        printf(v->arr.n > show ? ", ...]" : "]");
        break;
    }
    }
}

static void print_config(const kiln_model *m) {
    const kiln_model_config *c = &m->cfg;
    printf("\nmodel:\n  architecture: llama\n");
    printf("  n_vocab %d, n_embd %d, n_layer %d, n_head %d, n_head_kv %d, head_dim %d, n_ff %d, "
           "n_ctx_train %d\n",
           c->n_vocab, c->n_embd, c->n_layer, c->n_head, c->n_head_kv, c->head_dim, c->n_ff,
           c->n_ctx_train);
    printf("  features: RMSNorm (eps %g), RoPE (theta %g, %s pairs%s), %s, SwiGLU, %s output head\n",
           c->norm_eps, c->rope_theta, c->rope_style == KILN_ROPE_ADJACENT ? "adjacent" : "half-split",
           c->rope_scaling == KILN_ROPE_SCALING_LLAMA3 ? ", llama3 scaling" : "",
           c->n_head_kv < c->n_head ? "GQA" : "MHA", c->tied_embeddings ? "tied" : "separate");
    printf("  weights: token_embd %s, output %s, layer 0 attn_q %s, ffn_down %s\n",
           kiln_dtype_name(m->tok_embd.dtype), kiln_dtype_name(m->output.dtype),
           kiln_dtype_name(m->layers[0].wq.dtype), kiln_dtype_name(m->layers[0].w_down.dtype));
    if (m->tokenizer) {
        const kiln_vocab *v = kiln_tokenizer_vocab(m->tokenizer);
        printf("  tokenizer: %d tokens, bos %d, eos %d\n", v->n_tokens, v->bos_id, v->eos_id);
    } else {
        printf("  tokenizer: none\n");
    }
}

int kiln_cmd_inspect(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: kiln inspect MODEL\n\nPrints the metadata, the tensor table and the model "
               "configuration kiln detects.\n");
        return 0;
    }
    if (argc != 2) return cli_usage_error("inspect", "exactly one MODEL argument is required");
    const char *path = argv[1];
    kiln_error err = {0};
    struct stat sb;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    FILE *f = dir ? NULL : fopen(path, "rb");
    char magic[4] = {0};
    bool is_gguf = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    if (is_gguf) {
        kiln_gguf *g = NULL;
        if (kiln_gguf_open(path, &g, &err) != KILN_OK) return cli_fail(&err);
        printf("%s: GGUF v%u, alignment %llu, %zu metadata keys, %zu tensors\n\nmetadata:\n", path,
               g->version, (unsigned long long)g->alignment, g->n_kv, g->n_tensors);
        for (size_t i = 0; i < g->n_kv; i++) {
            printf("  %-44s %-4s ", g->kv[i].key, gguf_type_name(g->kv[i].value.type));
            print_value(&g->kv[i].value);
            putchar('\n');
        }
        printf("\ntensors:\n");
        for (size_t i = 0; i < g->n_tensors; i++) {
            const kiln_gguf_tensor *t = &g->tensors[i];
            printf("  %-36s %-5s [", t->name, kiln_dtype_name(t->dtype));
            for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %lld" : "%lld", (long long)t->ne[d]);
            printf("] offset %llu, %zu bytes\n", (unsigned long long)t->offset, t->nbytes);
        }
        kiln_gguf_close(g);
    } else if (dir) {
        kiln_safetensors *st = NULL;
        if (kiln_safetensors_open(path, &st, &err) != KILN_OK) return cli_fail(&err);
        printf("%s: Hugging Face directory, %zu tensors in %zu shard(s)\n\ntensors:\n", path,
               st->n_tensors, st->n_shards);
        for (size_t i = 0; i < st->n_tensors; i++) {
            const kiln_st_tensor *t = &st->tensors[i];
            printf("  %-52s %-5s [", t->name, kiln_dtype_name(t->dtype));
            for (int32_t d = 0; d < t->n_dims; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
            printf("] %zu bytes\n", t->nbytes);
        }
        kiln_safetensors_close(st);
    } else {
        kiln_llama2c *c = NULL;
        if (kiln_llama2c_open(path, &c, &err) != KILN_OK) return cli_fail(&err);
        const kiln_llama2c_config *h = &c->config;
        printf("%s: llama2.c checkpoint (v0)\n  dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
               "n_kv_heads %d, vocab_size %d, seq_len %d, %s classifier\n",
               path, h->dim, h->hidden_dim, h->n_layers, h->n_heads, h->n_kv_heads, h->vocab_size,
               h->seq_len, h->shared_classifier ? "shared" : "separate");
        kiln_llama2c_close(c);
    }
    kiln_model *m = NULL;
    kiln_model_load_params lp = {0};
    if (kiln_model_open(path, &lp, &m, &err) != KILN_OK) return cli_fail(&err);
    print_config(m);
    kiln_model_close(m);
    return 0;
}
