/*
 * test_f16_gguf_logits - an F16 GGUF model, whose matrices kiln packs at load
 * (KILN_LAYOUT_F16_R64), against the same model rewritten as F32 by `kiln quantize --type
 * f32` (a fixture): every F32 weight is then exactly the F16 value, so the two differ only in
 * the matmul order (packed fmaf chain vs the f32 row kernels). Checks, over a 24-token prompt
 * with logits of every position: max |logit difference| <= 1e-4 (test_hf_dtypes' bound for
 * F16 weights against F32 of the same values) and the same greedy ids; and that the F16
 * model's projection matrices really are packed (and the F32 ones are not), unless
 * KILN_REPACK=0, when both are in the row layout.
 * Usage: test_f16_gguf_logits F16.gguf F32.gguf
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/loader.h"
#include "model/model.h"
#include "model_test_util.h"
#include "test.h"

enum { T = 24 };

static float *run(const kiln_model *m) {
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7919 + 13) % m->cfg.n_vocab);
    return forward_all(m, tok, T, KILN_DTYPE_F32);
}

int main(int argc, char **argv) {
    REQUIRE(argc == 3);
    kiln_test_require_file(argv[1]);
    kiln_test_require_file(argv[2]);
    kiln_model *a = NULL, *b = NULL;
    kiln_error err = {0};
    kiln_model_load_params lp = {0};
    REQUIRE(kiln_model_open(argv[1], &lp, &a, &err) == KILN_OK);
    REQUIRE(kiln_model_open(argv[2], &lp, &b, &err) == KILN_OK);
    REQUIRE(a->cfg.n_vocab == b->cfg.n_vocab);
    const char *env = getenv("KILN_REPACK");
    const bool packing = !(env && strcmp(env, "0") == 0);
    const kiln_mat *wa = &a->layers[0].wq, *wb = &b->layers[0].wq;
    CHECKF(wa->dtype == KILN_DTYPE_F16 && wb->dtype == KILN_DTYPE_F32, "dtypes %s / %s",
           kiln_dtype_name(wa->dtype), kiln_dtype_name(wb->dtype));
    CHECKF(wa->layout == (packing ? KILN_LAYOUT_F16_R64 : KILN_LAYOUT_ROWS),
           "F16 wq layout %d (packing %d)", (int)wa->layout, (int)packing);
    CHECK(a->layers[0].w_down.layout == wa->layout);
    CHECK(wb->layout == KILN_LAYOUT_ROWS);
    float *la = run(a), *lb = run(b);
    const int64_t V = a->cfg.n_vocab;
    double mad = 0, amax = 0;
    int same = 0;
    for (int t = 0; t < T; t++) {
        int ia = 0, ib = 0;
        for (int64_t v = 0; v < V; v++) {
            double d = fabs((double)la[t * V + v] - lb[t * V + v]);
            if (!(d <= mad)) mad = d; /* NaN propagates */
            if (fabs(lb[t * V + v]) > amax) amax = fabs(lb[t * V + v]);
            if (la[t * V + v] > la[t * V + ia]) ia = (int)v;
            if (lb[t * V + v] > lb[t * V + ib]) ib = (int)v;
        }
        same += ia == ib;
    }
    printf("%s vs %s: max |diff| %.3g (max |logit| %.3g), greedy %d/%d, layout %s\n", argv[1],
           argv[2], mad, amax, same, T, packing ? "packed" : "rows");
    CHECKF(mad <= 1e-4, "max |logit difference| %.3g > 1e-4", mad);
    CHECKF(same == T, "greedy ids agree at %d of %d positions", same, T);
    free(la), free(lb);
    kiln_model_close(a);
    kiln_model_close(b);
    return kiln_test_finish("test_f16_gguf_logits");
}
