/*
 * test_weight_placement - loading moves the matrices the forward pass multiplies by out of the
 * file mapping into owned huge-page memory (model.h, kiln_model_open). For dtypes other than
 * F16 that is a byte copy, so a model loaded that way must give exactly the logits of the same
 * model loaded with keep_file_layout (weights read from the mapping): checked bit for bit on a
 * Q8_0 and an F32 GGUF and a llama2.c checkpoint, over a 16-token prompt, logits of every
 * position. Also checked: the projection matrices really moved (another address than the
 * mapped one) unless env KILN_REPACK=0, and the token embedding never moves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "format/llama2c.h"
#include "model/model.h"
#include "util/mapped_file.h"
#include "test.h"

enum { T = 16 };

static float *run(const kiln_model *m) {
    kiln_error err = {0};
    kiln_kv_seq *kv = NULL;
    REQUIRE(kiln_kv_seq_create(m, T, KILN_DTYPE_F32, &kv, &err) == KILN_OK);
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 104729 + 7) % m->cfg.n_vocab);
    float *logits = malloc(sizeof(float) * (size_t)T * (size_t)m->cfg.n_vocab);
    REQUIRE(logits);
    CHECKF(kiln_model_forward(m, kv, NULL, tok, T, 0, true, logits, &err) == KILN_OK, "forward: %s",
           err.message);
    kiln_kv_seq_destroy(kv);
    return logits;
}

/* true when p lies in m's GGUF file or llama2.c checkpoint mapping */
static bool in_file(const kiln_model *m, const void *p) {
    const char *base = NULL;
    size_t size = 0;
    if (m->gguf) {
        base = ((const kiln_gguf *)m->gguf)->base;
        size = ((const kiln_gguf *)m->gguf)->size;
    } else if (m->llama2c) {
        const kiln_mapped_file *f = ((const kiln_llama2c *)m->llama2c)->map;
        base = f->data;
        size = f->size;
    }
    return base && (const char *)p >= base && (const char *)p < base + size;
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
    const kiln_layer_weights *a = &mapped->layers[0], *b = &moved->layers[0];
    CHECKF(a->wq.dtype != KILN_DTYPE_F16, "%s: this test is for byte copies", rel);
    CHECKF(in_file(mapped, a->wq.data) && in_file(mapped, a->w_down.data),
           "%s: keep_file_layout moved weights", rel);
    CHECKF(in_file(moved, b->wq.data) != repack && in_file(moved, b->w_down.data) != repack,
           "%s: wq/w_down %s", rel, repack ? "were not moved" : "moved with KILN_REPACK=0");
    CHECK(a->wq.layout == KILN_LAYOUT_ROWS && b->wq.layout == KILN_LAYOUT_ROWS);
    CHECKF(in_file(moved, moved->tok_embd.data), "%s: the token embedding moved", rel);
    const size_t n = (size_t)T * (size_t)mapped->cfg.n_vocab;
    float *la = run(mapped), *lb = run(moved);
    CHECKF(memcmp(la, lb, n * sizeof(float)) == 0, "%s: logits differ from the mapped weights'",
           rel);
    printf("%-45s %s, %zu logits bit-identical\n", rel, repack ? "moved" : "mapped (KILN_REPACK=0)",
           n);
    free(la), free(lb);
    kiln_model_close(mapped);
    kiln_model_close(moved);
}

int main(void) {
    check("models/llama2xs-260K/llama2xs-Q8_0.gguf");
    check("models/llama2xs-260K/llama2xs-Q4_0.gguf");
    check("models/llama2xs-260K/llama2xs-f32.gguf");
    check("models/stories260K/stories260K.bin");
    return kiln_test_finish("test_weight_placement");
}
