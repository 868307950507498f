/*
 * test_weight_placement - loading moves the matrices the forward pass multiplies by out of the
 * file mapping into owned huge-page memory (model.h, kiln_model_open). For dtypes other than
 * F16 that is a byte copy, so a model loaded that way must give exactly the logits of the same
 * model loaded with keep_file_layout (weights read from the mapping): checked bit for bit on a
 * Q8_0, a Q4_0 and an F32 GGUF, a llama2.c checkpoint and three Hugging Face directories
 * (plain; phi3's fused QKV and gate_up views; mixtral's experts), over a 16-token
 * prompt, logits of every position. Also checked, over layer 0's matrices, the first experts
 * and an untied head: every one left the file mappings (none with env KILN_REPACK=0), and the
 * token embedding never moves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/safetensors.h"
#include "backend/loader.h"
#include "model/model.h"
#include "util/mapped_file.h"
#include "model_test_util.h"
#include "test.h"

enum { T = 16 };

static float *run(const kiln_model *m) {
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 104729 + 7) % m->cfg.n_vocab);
    return forward_all(m, tok, T, KILN_DTYPE_F32);
}

/* true when p lies in one of m's file mappings (GGUF, llama2.c, safetensors shards) */
static bool in_file(const kiln_model *m, const void *p) {
    const kiln_mapped_file *maps[256];
    size_t n = 0;
    if (m->gguf) maps[n++] = ((const kiln_gguf *)m->gguf)->owned_map;
    if (m->llama2c) maps[n++] = ((const kiln_llama2c *)m->llama2c)->map;
    const kiln_safetensors *st = m->safetensors;
    for (size_t i = 0; st && i < st->n_shards && n < 256; i++) maps[n++] = st->shards[i];
    for (size_t i = 0; i < n; i++) {
        const char *base = maps[i] ? maps[i]->data : NULL;
        if (base && (const char *)p >= base && (const char *)p < base + maps[i]->size) return true;
    }
    return false;
}

/* the matrices of layer 0 that exist (and the first experts) plus an untied output head */
static int mats_of(const kiln_model *m, const kiln_mat **out) {
    const kiln_layer_weights *L = &m->layers[0];
    const kiln_mat *cand[] = {&L->wq,     &L->wk,      &L->wv,    &L->wo,      &L->w_gate, &L->w_up,
                              &L->w_down, L->exp_gate, L->exp_up, L->exp_down, &m->output};
    int n = 0;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++)
        if (cand[i] && cand[i]->data &&
            (cand[i] != &m->output || m->output.data != m->tok_embd.data))
            out[n++] = cand[i];
    return n;
}

static void check(const char *rel) {
    const char *path = kiln_test_shared(rel);
    kiln_test_require_file(path);
    kiln_model *mapped = NULL, *moved = NULL;
    kiln_error err = {0};
    kiln_model_load_params keep = {.keep_file_layout = true}, dflt = {0};
    REQUIRE(kiln_model_open(path, &keep, &mapped, &err) == KILN_OK);
    REQUIRE(kiln_model_open(path, &dflt, &moved, &err) == KILN_OK);
    const char *env = getenv("KILN_REPACK");
    const bool repack = !(env && strcmp(env, "0") == 0);
    const kiln_mat *a[16], *b[16];
    const int na = mats_of(mapped, a), nb = mats_of(moved, b);
    REQUIRE(na == nb && na >= 7);
    int stayed = 0, moved_n = 0;
    for (int i = 0; i < na; i++) {
        CHECKF(a[i]->dtype != KILN_DTYPE_F16, "%s: this test is for byte copies", rel);
        CHECKF(in_file(mapped, a[i]->data), "%s: keep_file_layout moved matrix %d", rel, i);
        CHECK(b[i]->layout == KILN_LAYOUT_ROWS);
        if (in_file(moved, b[i]->data))
            stayed++;
        else
            moved_n++;
    }
    CHECKF(repack ? stayed == 0 : moved_n == 0, "%s: %d of %d matrices %s", rel,
           repack ? stayed : moved_n, na, repack ? "stayed mapped" : "moved with KILN_REPACK=0");
    CHECKF(in_file(moved, moved->tok_embd.data), "%s: the token embedding moved", rel);
    const size_t n = (size_t)T * (size_t)mapped->cfg.n_vocab;
    float *la = run(mapped), *lb = run(moved);
    CHECKF(memcmp(la, lb, n * sizeof(float)) == 0, "%s: logits differ from the mapped weights'",
           rel);
    printf("%-45s %d matrices %s, %zu logits bit-identical\n", rel, na,
           repack ? "moved" : "mapped (KILN_REPACK=0)", n);
    free(la), free(lb);
    kiln_model_close(mapped);
    kiln_model_close(moved);
}

int main(void) {
    check("models/llama2xs-260K/llama2xs-Q8_0.gguf");
    check("models/llama2xs-260K/llama2xs-Q4_0.gguf");
    check("models/llama2xs-260K/llama2xs-f32.gguf");
    check("models/stories260K/stories260K.bin");
    /* Hugging Face directories (safetensors): plain, fused QKV and gate_up views (phi3),
     * experts (mixtral) */
    check("reference/hf/llama");
    check("reference/hf/phi3");
    check("reference/hf/mixtral");
    return kiln_test_finish("test_weight_placement");
}
