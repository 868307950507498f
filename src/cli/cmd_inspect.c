/* cmd_inspect.c - `kiln inspect`: metadata, tensor table and detected model config. */
#include <math.h>
#include <errno.h>
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
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch == '\n')
            printf("\\n");
        else if (ch < 0x20)
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    putchar('"');
    if (len > max) printf("...(%llu bytes)", (unsigned long long)len);
}

static const char *gguf_type_name(kiln_gguf_type t) {
    static const char *names[] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
                                  "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static void print_value(const kiln_gguf_value *v) {
    switch (v->type) {
    case KILN_GGUF_UINT8:
    case KILN_GGUF_UINT16:
    case KILN_GGUF_UINT32:
    case KILN_GGUF_UINT64:
        printf("%llu", (unsigned long long)v->u64);
        break;
    case KILN_GGUF_INT8:
    case KILN_GGUF_INT16:
    case KILN_GGUF_INT32:
    case KILN_GGUF_INT64:
        printf("%lld", (long long)v->i64);
        break;
    case KILN_GGUF_FLOAT32:
    case KILN_GGUF_FLOAT64:
        printf("%g", v->f64);
        break;
    case KILN_GGUF_BOOL:
        printf("%s", v->b ? "true" : "false");
        break;
    case KILN_GGUF_STRING:
        print_str(v->str.data, v->str.len, 200);
        break;
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
            case KILN_GGUF_ARRAY:
                print_value((const kiln_gguf_value *)v->arr.data + i);
                break;
            case KILN_GGUF_UINT8:
                printf("%u", ((const uint8_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_INT8:
                printf("%d", ((const int8_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_UINT16:
                printf("%u", ((const uint16_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_INT16:
                printf("%d", ((const int16_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_UINT32:
                printf("%u", ((const uint32_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_INT32:
                printf("%d", ((const int32_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_UINT64:
                printf("%llu", (unsigned long long)((const uint64_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_INT64:
                printf("%lld", (long long)((const int64_t *)v->arr.data)[i]);
                break;
            case KILN_GGUF_FLOAT32:
                printf("%g", ((const float *)v->arr.data)[i]);
                break;
            case KILN_GGUF_FLOAT64:
                printf("%g", ((const double *)v->arr.data)[i]);
                break;
            case KILN_GGUF_BOOL:
                printf("%s", ((const uint8_t *)v->arr.data)[i] ? "true" : "false");
                break;
            }
        }
        printf(v->arr.n > show ? ", ...]" : "]");
        break;
    }
    }
}

static void print_config(const kiln_model *m) {
    const kiln_model_config *c = &m->cfg;
    static const char *act_names[] = {"silu", "gelu-tanh", "gelu"};
    const char *act = (unsigned)c->act < 3 ? act_names[c->act] : "?";
    printf("\nmodel:\n  architecture: %s\n", kiln_arch_name(c->arch));
    printf("  n_vocab %d, n_embd %d, n_layer %d, n_head %d, n_head_kv %d, head_dim %d, n_ff %d, "
           "n_ctx_train %d\n",
           c->n_vocab, c->n_embd, c->n_layer, c->n_head, c->n_head_kv, c->head_dim, c->n_ff,
           c->n_ctx_train);
    printf("  features:\n");
    printf("    norm: %s%s (eps %g)%s\n",
           c->norm_kind == KILN_NORM_LAYER ? "LayerNorm with bias" : "RMSNorm",
           c->norm_unit_offset ? " with (1 + w)" : "", c->norm_eps,
           c->sandwich_norms ? ", post-attention and post-FFN norms" : "");
    if (c->rope_style == KILN_ROPE_NONE) {
        printf("    positions: learned absolute embeddings (%d)\n", c->n_ctx_train);
    } else {
        printf("    positions: RoPE (theta %g, %s pairs", c->rope_theta,
               c->rope_style == KILN_ROPE_ADJACENT ? "adjacent" : "half-split");
        if (c->rope_dim != c->head_dim)
            printf(", partial: %d of %d dims", c->rope_dim, c->head_dim);
        if (c->rope_scaling == KILN_ROPE_SCALING_LLAMA3)
            printf(", llama3 scaling x%g", c->rope_factor);
        if (c->rope_scaling == KILN_ROPE_SCALING_LINEAR)
            printf(", linear scaling x%g", c->rope_factor);
        bool local = false;
        for (int32_t l = 0; l < c->n_layer; l++) local |= c->layer[l].rope_local != 0;
        if (local) printf(", local layers theta %g", c->rope_theta_local);
        printf(")\n");
    }
    printf("    attention: %s", c->n_head_kv < c->n_head ? "GQA" : "MHA");
    if (c->attn_bias_qkv) printf(", q/k/v bias");
    if (c->attn_bias_o) printf(", output bias");
    if (c->qk_norm) printf(", q/k norm");
    if (c->attn_out_gate) printf(", sigmoid output gate");
    if (c->attn_score_div != sqrtf((float)c->head_dim)) printf(", scores / %g", c->attn_score_div);
    if (c->attn_scale_inv_layer) printf(", scores / (layer + 1)");
    if (c->attn_softcap > 0) printf(", logit softcap %g", c->attn_softcap);
    printf("\n");
    int32_t n_slide = 0, n_gdn = 0, n_moe = 0, window = 0;
    char pattern[KILN_MAX_LAYERS + 1];
    for (int32_t l = 0; l < c->n_layer; l++) {
        const kiln_layer_config *L = &c->layer[l];
        if (L->sliding_window > 0) n_slide++, window = L->sliding_window;
        if (L->mixer == KILN_MIXER_GATED_DELTA_NET) n_gdn++;
        if (L->moe) n_moe++;
        pattern[l] = L->mixer == KILN_MIXER_GATED_DELTA_NET ? 'D'
                     : L->sliding_window > 0                ? 'S'
                                                            : 'F';
    }
    pattern[c->n_layer] = '\0';
    if (n_slide || n_gdn)
        printf("    layers: %s (F full attention%s%s)\n", pattern,
               n_slide ? ", S sliding window" : "", n_gdn ? ", D gated delta net" : "");
    if (n_slide)
        printf("    sliding window: %d tokens on %d of %d layers\n", window, n_slide, c->n_layer);
    if (n_gdn)
        printf("    gated delta net: %d key heads x %d, %d value heads x %d, conv %d; recurrent "
               "state %lld floats per sequence\n",
               c->ssm_n_k_heads, c->ssm_k_head_dim, c->ssm_n_v_heads, c->ssm_v_head_dim,
               c->ssm_conv_kernel, (long long)kiln_model_seq_state_floats(m));
    printf("    ffn: %s %s%s\n", c->ffn_gated ? "gated" : "MLP", act,
           c->ffn_bias ? " with bias" : "");
    if (n_moe)
        printf("    moe: %d of %d layers, %d experts (top-%d%s), expert ffn %d\n", n_moe,
               c->n_layer, c->n_expert, c->n_expert_used,
               c->expert_norm_topk ? ", renormalised" : "", c->n_ff_expert);
    if (n_moe && c->n_ff_shexp)
        printf("    shared expert: ffn %d%s\n", c->n_ff_shexp,
               c->shexp_gate ? ", sigmoid-gated" : "");
    printf("    embeddings %s; %s output head",
           c->embed_scale != 1.0f ? "scaled by sqrt(n_embd)" : "unscaled",
           c->tied_embeddings ? "tied" : "separate");
    if (c->final_softcap > 0) printf(", final logit softcap %g", c->final_softcap);
    printf("\n");
    const kiln_layer_weights *L0 = &m->layers[0];
    printf("  weights: token_embd %s, output %s", kiln_dtype_name(m->tok_embd.dtype),
           kiln_dtype_name(m->output.dtype));
    if (L0->wq.data) printf(", layer 0 attn_q %s", kiln_dtype_name(L0->wq.dtype));
    if (L0->w_down.data) printf(", ffn_down %s", kiln_dtype_name(L0->w_down.dtype));
    if (L0->exp_down) printf(", expert ffn_down %s", kiln_dtype_name(L0->exp_down[0].dtype));
    printf("\n");
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
    if (stat(path, &sb) != 0) {
        kiln_error_set(&err, KILN_ERR_IO, "%s: %s", path, strerror(errno));
        return cli_fail(&err);
    }
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode)) {
        kiln_error_set(&err, KILN_ERR_IO, "%s: not a regular file or a directory", path);
        return cli_fail(&err);
    }
    size_t plen = strlen(path);
    bool dir = S_ISDIR(sb.st_mode) ||
               (plen > 12 && !strcmp(path + plen - 12, ".safetensors")); /* tensor table */
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
            for (uint32_t d = 0; d < t->n_dims; d++)
                printf(d ? ", %lld" : "%lld", (long long)t->ne[d]);
            printf("] offset %llu, %zu bytes\n", (unsigned long long)t->offset, t->nbytes);
        }
        kiln_gguf_close(g);
    } else if (dir) {
        kiln_safetensors *st = NULL;
        if (kiln_safetensors_open(path, &st, &err) != KILN_OK) return cli_fail(&err);
        printf("%s: safetensors, %zu tensors in %zu shard(s)\n\ntensors:\n", path, st->n_tensors,
               st->n_shards);
        for (size_t i = 0; i < st->n_tensors; i++) {
            const kiln_st_tensor *t = &st->tensors[i];
            printf("  %-52s %-5s [", t->name, kiln_dtype_name(t->dtype));
            for (int32_t d = 0; d < t->n_dims; d++)
                printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
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
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    struct stat cb;
    bool no_cfg = S_ISDIR(sb.st_mode) && !(stat(cfg, &cb) == 0 && S_ISREG(cb.st_mode));
    if ((!S_ISDIR(sb.st_mode) && dir) || no_cfg) { /* weights without a config */
        printf(no_cfg ? "\n(no config.json here, so no model configuration to show)\n"
                      : "\n(the model configuration comes from config.json: inspect the "
                        "directory)\n");
        return cli_check_stdout();
    }
    kiln_model *m = NULL;
    kiln_model_load_params lp = {.keep_file_layout = true};
    if (kiln_model_open(path, &lp, &m, &err) != KILN_OK) return cli_fail(&err);
    print_config(m);
    kiln_model_close(m);
    return cli_check_stdout();
}
