/*
 * The GGUF side of the model families: each ../shared/reference/hf/<arch> checkpoint is
 * written as a GGUF file following llama.cpp's conversion conventions (convert_hf_to_gguf.py
 * and llama-arch.cpp tensor names, as documented by llama.cpp):
 *   - general.architecture llama (also Mixtral: llama with expert_count), qwen2, qwen3,
 *     qwen3moe, gemma2, gemma3, phi3, gpt2, with <arch>.* hyper-parameter keys;
 *   - llama/Mixtral q_proj and k_proj rows permuted per head from HF's half-split order to
 *     adjacent pairs (llama.cpp runs them with LLAMA_ROPE_TYPE_NORM); the others stay in HF
 *     order (NEOX rope);
 *   - Gemma norm weights (every *norm.weight, q/k norms included) stored as 1 + w;
 *   - GPT-2 Conv1D weights transposed to [out, in];
 *   - MoE experts merged into 3-D ffn_{gate,up,down}_exps [n_expert, rows, cols];
 *   - Phi-3's fused attn_qkv and ffn_up ([gate; up]) kept fused; output.weight omitted when
 *     the embeddings are tied.
 * kiln then loads the GGUF and must give the logits of the Hugging Face directory (<= 1e-5)
 * and of transformers (<= 1e-4; for Gemma 2 against reference_eager_f64.safetensors, the
 * softcapped eager computation, since the SDPA reference skipped the attention softcap: see
 * ../shared/README.md), and greedy decoding must reproduce greedy_ids.
 */
#include "engine/sampler.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "model_test_util.h"

typedef struct out_tensor {
    char name[64];
    int32_t n_dims;
    int64_t ne[3];
    float *data;
} out_tensor;

typedef struct conv {
    out_tensor t[1024];
    int n;
} conv;

static float *to_f32(const kiln_st_tensor *t, int64_t *count) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    float *f = malloc((size_t)n * sizeof *f);
    REQUIRE(f && t->dtype == KILN_DTYPE_F32);
    memcpy(f, t->data, (size_t)n * sizeof *f);
    *count = n;
    return f;
}

static void add(conv *c, const char *name, int32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                float *data) {
    REQUIRE(c->n < 1024);
    out_tensor *o = &c->t[c->n++];
    snprintf(o->name, sizeof o->name, "%.63s", name);
    o->n_dims = n_dims;
    o->ne[0] = ne0;
    o->ne[1] = ne1;
    o->ne[2] = ne2;
    o->data = data;
}

/* HF half-split rows -> adjacent pairs, per head (llama.cpp's conversion permute). */
static float *permute_rows(const float *w, int64_t n_head, int64_t hd, int64_t n_in) {
    float *o = malloc((size_t)(n_head * hd * n_in) * sizeof *o);
    REQUIRE(o);
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t j = 0; j < hd / 2; j++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(o + (h * hd + 2 * j + s) * n_in, w + (h * hd + s * hd / 2 + j) * n_in,
                       (size_t)n_in * sizeof *o);
    return o;
}

static float *transpose(const float *w, int64_t rows, int64_t cols) {
    float *o = malloc((size_t)(rows * cols) * sizeof *o);
    REQUIRE(o);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) o[c * rows + r] = w[r * cols + c];
    return o;
}

typedef struct name_map {
    const char *hf, *gguf; /* suffix after "model.layers.N." (or "transformer.h.N.") */
} name_map;

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Convert the HF tensors of m (loaded from dir) into c, llama.cpp style. */
static void convert(const kiln_model *m, const kiln_safetensors *st, const char *garch, conv *c) {
    const kiln_model_config *k = &m->cfg;
    const bool llama = !strcmp(garch, "llama"), gemma = !strncmp(garch, "gemma", 5),
               gpt2 = !strcmp(garch, "gpt2");
    static const name_map LAYER[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.gate_up_proj.weight", "ffn_up.weight"},
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
        /* post_attention_layernorm: ffn_norm, or Gemma's post_attention_norm (below) */
        {"ln_1.weight", "attn_norm.weight"},
        {"ln_1.bias", "attn_norm.bias"},
        {"ln_2.weight", "ffn_norm.weight"},
        {"ln_2.bias", "ffn_norm.bias"},
        {"attn.c_attn.weight", "attn_qkv.weight"},
        {"attn.c_attn.bias", "attn_qkv.bias"},
        {"attn.c_proj.weight", "attn_output.weight"},
        {"attn.c_proj.bias", "attn_output.bias"},
        {"mlp.c_fc.weight", "ffn_up.weight"},
        {"mlp.c_fc.bias", "ffn_up.bias"},
        {"mlp.c_proj.weight", "ffn_down.weight"},
        {"mlp.c_proj.bias", "ffn_down.bias"},
    };
    const int64_t E = k->n_expert, d = k->n_embd;
    /* merged experts: [layer][gate, up, down] */
    float *exps[64][3] = {{0}};
    for (size_t i = 0; i < st->n_tensors; i++) {
        const kiln_st_tensor *t = &st->tensors[i];
        const char *nm = t->name;
        int64_t n;
        char out[128];
        int layer = -1, expert = -1, used = 0;
        const char *rest = NULL;
        if (sscanf(nm, "model.layers.%d.%n", &layer, &used) == 1 && used > 0)
            rest = nm + used;
        else if (sscanf(nm, "transformer.h.%d.%n", &layer, &used) == 1 && used > 0)
            rest = nm + used;
        if (!rest) {
            const char *g = NULL;
            if (!strcmp(nm, "model.embed_tokens.weight") || !strcmp(nm, "transformer.wte.weight"))
                g = "token_embd.weight";
            else if (!strcmp(nm, "transformer.wpe.weight"))
                g = "position_embd.weight";
            else if (!strcmp(nm, "model.norm.weight") || !strcmp(nm, "transformer.ln_f.weight"))
                g = "output_norm.weight";
            else if (!strcmp(nm, "transformer.ln_f.bias"))
                g = "output_norm.bias";
            else if (!strcmp(nm, "lm_head.weight"))
                g = k->tied_embeddings ? NULL : "output.weight";
            if (!g) continue;
            float *f = to_f32(t, &n);
            if (gemma && ends_with(nm, "norm.weight"))
                for (int64_t e = 0; e < n; e++) f[e] += 1.0f;
            if (t->n_dims == 1)
                add(c, g, 1, t->shape[0], 1, 1, f);
            else
                add(c, g, 2, t->shape[1], t->shape[0], 1, f);
            continue;
        }
        REQUIRE(layer >= 0 && layer < 64);
        int kind = -1;
        if (sscanf(rest, "mlp.experts.%d.", &expert) == 1 ||
            sscanf(rest, "block_sparse_moe.experts.%d.", &expert) == 1) {
            if (ends_with(rest, "gate_proj.weight") || ends_with(rest, "w1.weight"))
                kind = 0;
            else if (ends_with(rest, "up_proj.weight") || ends_with(rest, "w3.weight"))
                kind = 1;
            else if (ends_with(rest, "down_proj.weight") || ends_with(rest, "w2.weight"))
                kind = 2;
            REQUIRE(kind >= 0 && expert < E);
            const int64_t per = k->n_ff_expert * d;
            if (!exps[layer][kind]) exps[layer][kind] = calloc((size_t)(E * per), sizeof(float));
            REQUIRE(exps[layer][kind]);
            float *f = to_f32(t, &n);
            REQUIRE(n == per);
            memcpy(exps[layer][kind] + expert * per, f, (size_t)per * sizeof(float));
            free(f);
            continue;
        }
        const char *g = NULL;
        if (!strcmp(rest, "post_attention_layernorm.weight"))
            g = gemma ? "post_attention_norm.weight" : "ffn_norm.weight";
        for (size_t r = 0; !g && r < sizeof LAYER / sizeof LAYER[0]; r++)
            if (!strcmp(rest, LAYER[r].hf)) g = LAYER[r].gguf;
        if (!g) {
            fprintf(stderr, "%s: no GGUF name for %s\n", garch, nm);
            exit(1);
        }
        snprintf(out, sizeof out, "blk.%d.%s", layer, g);
        float *f = to_f32(t, &n);
        if (gemma && ends_with(rest, "norm.weight"))
            for (int64_t e = 0; e < n; e++) f[e] += 1.0f;
        if (t->n_dims == 1) {
            add(c, out, 1, t->shape[0], 1, 1, f);
            continue;
        }
        int64_t rows = t->shape[0], cols = t->shape[1];
        if (gpt2) { /* Conv1D [in, out] -> [out, in] */
            float *tr = transpose(f, rows, cols);
            free(f);
            f = tr;
            int64_t tmp = rows;
            rows = cols;
            cols = tmp;
        }
        if (llama && (!strcmp(g, "attn_q.weight") || !strcmp(g, "attn_k.weight"))) {
            float *p = permute_rows(f, !strcmp(g, "attn_q.weight") ? k->n_head : k->n_head_kv,
                                    k->head_dim, cols);
            free(f);
            f = p;
        }
        add(c, out, 2, cols, rows, 1, f);
    }
    for (int l = 0; l < k->n_layer; l++) {
        static const char *names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                       "ffn_down_exps.weight"};
        for (int w = 0; w < 3; w++) {
            if (!exps[l][w]) continue;
            char out[128];
            snprintf(out, sizeof out, "blk.%d.%s", l, names[w]);
            const int64_t rows = w == 2 ? d : k->n_ff_expert, cols = w == 2 ? k->n_ff_expert : d;
            add(c, out, 3, cols, rows, E, exps[l][w]);
        }
    }
}

static void write_gguf(const kiln_model *m, const conv *c, const char *garch, const char *path) {
    const kiln_model_config *k = &m->cfg;
    kiln_error err = {0};
    kiln_gguf_writer *w = NULL;
    REQUIRE(kiln_gguf_writer_create(&w, &err) == KILN_OK);
    char key[128];
#define U32(sfx, v)                                                                                \
    do {                                                                                           \
        snprintf(key, sizeof key, "%s.%s", garch, sfx);                                            \
        REQUIRE(kiln_gguf_writer_set_u32(w, key, (uint32_t)(v), &err) == KILN_OK);                 \
    } while (0)
#define F32(sfx, v)                                                                                \
    do {                                                                                           \
        snprintf(key, sizeof key, "%s.%s", garch, sfx);                                            \
        REQUIRE(kiln_gguf_writer_set_f32(w, key, (float)(v), &err) == KILN_OK);                    \
    } while (0)
    REQUIRE(kiln_gguf_writer_set_str(w, "general.architecture", garch, &err) == KILN_OK);
    U32("vocab_size", k->n_vocab);
    U32("context_length", k->n_ctx_train);
    U32("embedding_length", k->n_embd);
    U32("block_count", k->n_layer);
    U32("feed_forward_length", k->n_ff);
    U32("attention.head_count", k->n_head);
    U32("attention.head_count_kv", k->n_head_kv);
    if (k->head_dim != k->n_embd / k->n_head) {
        U32("attention.key_length", k->head_dim);
        U32("attention.value_length", k->head_dim);
    }
    if (k->norm_kind == KILN_NORM_LAYER) {
        F32("attention.layer_norm_epsilon", k->norm_eps);
    } else {
        F32("attention.layer_norm_rms_epsilon", k->norm_eps);
        U32("rope.dimension_count", k->rope_dim);
        F32("rope.freq_base", k->rope_theta);
    }
    if (k->n_expert > 0) {
        U32("expert_count", k->n_expert);
        U32("expert_used_count", k->n_expert_used);
        if (!strcmp(garch, "qwen3moe")) U32("expert_feed_forward_length", k->n_ff_expert);
    }
    if (!strncmp(garch, "gemma", 5)) {
        for (int32_t l = 0; l < k->n_layer; l++)
            if (k->layer[l].sliding_window > 0)
                U32("attention.sliding_window", k->layer[l].sliding_window);
        if (k->attn_softcap > 0) F32("attn_logit_softcapping", k->attn_softcap);
        if (k->final_softcap > 0) F32("final_logit_softcapping", k->final_softcap);
    }
#undef U32
#undef F32
    for (int i = 0; i < c->n; i++)
        REQUIRE(kiln_gguf_writer_add_tensor(w, c->t[i].name, KILN_DTYPE_F32,
                                            (uint32_t)c->t[i].n_dims, c->t[i].ne, &err) == KILN_OK);
    REQUIRE(kiln_gguf_writer_begin(w, path, &err) == KILN_OK);
    for (int i = 0; i < c->n; i++) {
        const size_t n = (size_t)(c->t[i].ne[0] * c->t[i].ne[1] * c->t[i].ne[2]);
        REQUIRE(kiln_gguf_writer_write_data(w, c->t[i].data, n * sizeof(float), &err) == KILN_OK);
    }
    if (kiln_gguf_writer_finish(w, &err) != KILN_OK) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    kiln_gguf_writer_destroy(w);
}

typedef struct fam {
    const char *hf, *gguf;
    kiln_arch want;
    float tol_ref;
} fam;

static void check(const fam *f) {
    char dir[256], refp[256];
    snprintf(dir, sizeof dir, "reference/hf/%s", f->hf);
    snprintf(refp, sizeof refp, "reference/hf/%s/reference.safetensors", f->hf);
    const char *mdir = kiln_test_shared(dir), *rpath = kiln_test_shared(refp);
    if (access(rpath, R_OK) != 0) {
        printf("%-10s skipped (no reference)\n", f->hf);
        return;
    }
    kiln_error err = {0};
    kiln_model *mh = NULL, *mg = NULL;
    kiln_safetensors *st = NULL, *ref = NULL;
    kiln_model_load_params lp = {0};
    REQUIRE(kiln_model_open(mdir, &lp, &mh, &err) == KILN_OK);
    REQUIRE(kiln_safetensors_open(mdir, &st, &err) == KILN_OK);
    REQUIRE(kiln_safetensors_open(rpath, &ref, &err) == KILN_OK);
    static conv c;
    c.n = 0;
    convert(mh, st, f->gguf, &c);
    char path[] = "/tmp/kiln-gguf-family-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    write_gguf(mh, &c, f->gguf, path);
    for (int i = 0; i < c.n; i++) free(c.t[i].data);
    if (kiln_model_open(path, &lp, &mg, &err) != KILN_OK) {
        fprintf(stderr, "%s GGUF: %s\n", f->hf, err.message);
        kiln_test_failures++;
    } else {
        CHECKF(mg->cfg.arch == f->want, "%s: GGUF loads as %s", f->hf,
               kiln_arch_name(mg->cfg.arch));
        const kiln_st_tensor *ids = ref_tensor(ref, "input_ids", KILN_DTYPE_I32);
        /* the eager (softcapped, float64) logits where the folder has them (gemma2) */
        char eagerp[256];
        snprintf(eagerp, sizeof eagerp, "reference/hf/%s/reference_eager_f64.safetensors", f->hf);
        const char *epath = kiln_test_shared(eagerp);
        kiln_safetensors *eager = NULL;
        if (access(epath, R_OK) == 0)
            REQUIRE(kiln_safetensors_open(epath, &eager, &err) == KILN_OK);
        const kiln_st_tensor *want = ref_tensor(eager ? eager : ref, "logits", KILN_DTYPE_F32);
        const int32_t T = (int32_t)ids->shape[0], V = mh->cfg.n_vocab;
        float *lg = forward_all(mg, ids->data, T, KILN_DTYPE_F32);
        float *lh = forward_all(mh, ids->data, T, KILN_DTYPE_F32);
        const float d_hf = max_abs_diff(lg, lh, (size_t)T * V);
        const float d_ref = max_abs_diff(lg, want->data, (size_t)T * V);
        CHECKF(d_hf <= 1e-5f, "%s: GGUF vs HF dir max abs diff %g > 1e-5", f->hf, d_hf);
        CHECKF(d_ref <= f->tol_ref, "%s: GGUF vs transformers%s %g > %g", f->hf,
               eager ? " (eager f64)" : "", d_ref, f->tol_ref);
        /* greedy from prompt_ids */
        const kiln_st_tensor *prompt = ref_tensor(ref, "prompt_ids", KILN_DTYPE_I32);
        const kiln_st_tensor *greedy = ref_tensor(ref, "greedy_ids", KILN_DTYPE_I32);
        const int32_t np = (int32_t)prompt->shape[0], ng = (int32_t)greedy->shape[0];
        kiln_kv_seq *kv = NULL;
        float *logits = malloc((size_t)V * sizeof *logits);
        REQUIRE(logits && kiln_kv_seq_create(mg, np + ng, KILN_DTYPE_F32, &kv, &err) == KILN_OK);
        REQUIRE(kiln_model_forward(mg, kv, NULL, prompt->data, np, 0, false, logits, &err) ==
                KILN_OK);
        int32_t same = 0;
        for (int32_t i = 0; i < ng; i++) {
            int32_t tok = kiln_argmax(logits, V);
            same += tok == ((const int32_t *)greedy->data)[i];
            tok = ((const int32_t *)greedy->data)[i];
            if (i + 1 < ng)
                REQUIRE(kiln_model_forward(mg, kv, NULL, &tok, 1, np + i, false, logits, &err) ==
                        KILN_OK);
        }
        CHECKF(same == ng, "%s: GGUF greedy %d/%d", f->hf, same, ng);
        printf("%-10s as GGUF '%s' (%s): vs HF dir %.3g, vs transformers%s %.3g, greedy %d/%d\n",
               f->hf, f->gguf, kiln_arch_name(mg->cfg.arch), d_hf, eager ? " (eager f64)" : "",
               d_ref, same, ng);
        kiln_safetensors_close(eager);
        free(logits);
        kiln_kv_seq_destroy(kv);
        free(lg);
        free(lh);
    }
    kiln_model_close(mg);
    kiln_model_close(mh);
    kiln_safetensors_close(st);
    kiln_safetensors_close(ref);
    unlink(path);
}

/* A metadata-only GGUF (no tensors): refused while reading the config. */
static void check_refused(const char *arch, const char *scaling, const char *mention) {
    char path[] = "/tmp/kiln-gguf-refuse-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    kiln_error err = {0};
    kiln_gguf_writer *w = NULL;
    REQUIRE(kiln_gguf_writer_create(&w, &err) == KILN_OK);
    REQUIRE(kiln_gguf_writer_set_str(w, "general.architecture", arch, &err) == KILN_OK);
    const char *ints[] = {"embedding_length", "block_count", "attention.head_count",
                          "feed_forward_length", "vocab_size"};
    const uint32_t vals[] = {64, 2, 8, 128, 512};
    char key[128];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, ints[i]);
        REQUIRE(kiln_gguf_writer_set_u32(w, key, vals[i], &err) == KILN_OK);
    }
    if (scaling) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        REQUIRE(kiln_gguf_writer_set_str(w, key, scaling, &err) == KILN_OK);
    }
    REQUIRE(kiln_gguf_writer_begin(w, path, &err) == KILN_OK);
    REQUIRE(kiln_gguf_writer_finish(w, &err) == KILN_OK);
    kiln_gguf_writer_destroy(w);
    kiln_model *m = NULL;
    kiln_model_load_params lp = {0};
    kiln_status st = kiln_model_open(path, &lp, &m, &err);
    CHECKF(st == KILN_ERR_UNSUPPORTED && strstr(err.message, mention),
           "GGUF %s (scaling %s): status %d, message '%s'", arch, scaling ? scaling : "-", (int)st,
           st ? err.message : "");
    printf("GGUF %-9s %-6s -> %s\n", arch, scaling ? scaling : "", st ? err.message : "loads");
    kiln_model_close(m);
    unlink(path);
}

int main(void) {
    check_refused("qwen3next", NULL, "'qwen3next' is not supported from GGUF");
    check_refused("falcon", NULL, "'falcon' is not supported");
    check_refused("llama", "yarn", "'yarn' is not supported");
    static const fam FAMS[] = {
        {"llama", "llama", KILN_ARCH_LLAMA, 1e-4f},
        {"llama3", "llama", KILN_ARCH_LLAMA, 1e-4f}, /* tied; rope_freqs absent: see below */
        {"qwen2", "qwen2", KILN_ARCH_QWEN2, 1e-4f},
        {"qwen3", "qwen3", KILN_ARCH_QWEN3, 1e-4f},
        {"gemma2", "gemma2", KILN_ARCH_GEMMA2, 1e-4f},
        {"gemma3", "gemma3", KILN_ARCH_GEMMA3, 1e-4f},
        {"phi3", "phi3", KILN_ARCH_PHI3, 1e-4f},
        {"mixtral", "llama", KILN_ARCH_MIXTRAL, 1e-4f},
        {"qwen3_moe", "qwen3moe", KILN_ARCH_QWEN3_MOE, 1e-4f},
        {"gpt2", "gpt2", KILN_ARCH_GPT2, 1e-4f},
    };
    for (size_t i = 0; i < sizeof FAMS / sizeof FAMS[0]; i++) {
        if (!strcmp(FAMS[i].hf, "llama3"))
            continue; /* llama3 scaling needs rope_freqs.weight:
                          covered by tests/gguf_write */
        check(&FAMS[i]);
    }
    return kiln_test_finish("test_gguf_families");
}
