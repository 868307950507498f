/*
 * KV page formats against transformers: for every Hugging Face reference checkpoint, the
 * logits of one forward with f16 and with bf16 KV pages (kv/kv_format.h) against the
 * reference's f32 logits, and against kiln's own f32-KV logits.
 *
 * Tolerances, stated per format from the formats' precision: rounding K, V, q and the softmax
 * probabilities to f16 (11 significant bits) moves the logits of these random checkpoints by
 * up to ~2e-3; bf16 (8 significant bits) is 2^3 coarser, so its bound is 8x f16's. The bounds
 * are: f16 <= 1e-2, bf16 <= 8e-2 absolute (the logits reach ~±20), and the greedy argmax
 * agrees with transformers' at >= 90% of the positions. Mixture-of-experts checkpoints
 * (mixtral, qwen3_moe, qwen3_next) route each token to its top-k experts, a discontinuous
 * choice: a rounding that flips one expert moves that token's logits by ~0.5-1 (measured), so
 * for them the bound holds for the median position's max abs difference, not the worst. A format
 * whose pages were written or read with the wrong layout gives errors of order 1 and fails. The
 * measured figures print per architecture.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "engine/sampler.h"
#include "model_test_util.h"

static const char *ARCHS[] = {"llama",  "llama3", "mistral", "qwen2",     "qwen3",      "gemma2",
                              "gemma3", "phi3",   "mixtral", "qwen3_moe", "qwen3_next", "gpt2"};

static void check(const char *arch) {
    char dir[256], refp[256];
    snprintf(dir, sizeof dir, "reference/hf/%s", arch);
    snprintf(refp, sizeof refp, "reference/hf/%s/%s", arch,
             strcmp(arch, "gemma2") ? "reference.safetensors" : "reference_eager_f64.safetensors");
    const char *mdir = kiln_test_shared(dir), *rpath = kiln_test_shared(refp);
    if (access(rpath, R_OK) != 0) {
        printf("%-10s skipped (no %s)\n", arch, rpath);
        return;
    }
    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_safetensors *ref = NULL;
    REQUIRE(kiln_model_open(mdir, NULL, &m, &err) == KILN_OK);
    REQUIRE(kiln_safetensors_open(rpath, &ref, &err) == KILN_OK);
    const kiln_st_tensor *ids = ref_tensor(ref, "input_ids", KILN_DTYPE_I32);
    const kiln_st_tensor *want = ref_tensor(ref, "logits", KILN_DTYPE_F32);
    const int32_t T = (int32_t)ids->shape[0], V = m->cfg.n_vocab;
    float *l32 = forward_all(m, ids->data, T, KILN_DTYPE_F32);
    const kiln_dtype fmts[] = {KILN_DTYPE_F16, KILN_DTYPE_BF16};
    const float tol[] = {1e-2f, 8e-2f};
    for (int f = 0; f < 2; f++) {
        float *lk = forward_all(m, ids->data, T, fmts[f]);
        const bool moe = kiln_config_has_moe(&m->cfg);
        float per[512] = {0};
        REQUIRE(T <= 512);
        for (int32_t t = 0; t < T; t++)
            per[t] = max_abs_diff(lk + (size_t)t * V, (const float *)want->data + (size_t)t * V,
                                  (size_t)V);
        const float d_max = max_abs_diff(lk, want->data, (size_t)T * V);
        float d_ref = d_max;
        if (moe) { /* the median position (insertion sort of T <= 512 values) */
            for (int32_t i = 1; i < T; i++)
                for (int32_t j = i; j > 0 && per[j - 1] > per[j]; j--) {
                    const float x = per[j];
                    per[j] = per[j - 1];
                    per[j - 1] = x;
                }
            d_ref = per[T / 2];
        }
        const float d_32 = max_abs_diff(lk, l32, (size_t)T * V);
        int agree = 0;
        for (int32_t t = 0; t < T; t++)
            agree += kiln_argmax(lk + (size_t)t * V, V) ==
                     kiln_argmax((const float *)want->data + (size_t)t * V, V);
        CHECKF(d_ref <= tol[f], "%s %s KV: vs transformers%s %g > %g", arch,
               kiln_dtype_name(fmts[f]), moe ? " (median position)" : "", d_ref, tol[f]);
        CHECKF(agree * 10 >= T * 9, "%s %s KV: argmax agrees at %d/%d", arch,
               kiln_dtype_name(fmts[f]), agree, T);
        /* the format must change something (pages really stored rounded) */
        CHECKF(d_32 > 0.0f, "%s %s KV: identical to f32 KV", arch, kiln_dtype_name(fmts[f]));
        printf("%-10s %-4s KV: vs transformers max %.3g (median position %.3g), vs f32 KV %.3g, "
               "argmax %d/%d\n",
               arch, kiln_dtype_name(fmts[f]), d_max, moe ? d_ref : per[T / 2], d_32, agree, T);
        free(lk);
    }
    free(l32);
    kiln_safetensors_close(ref);
    kiln_model_close(m);
}

int main(void) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) check(ARCHS[i]);
    return kiln_test_finish("test_kv_format_logits");
}
