/*
 * Acceptance 3: Hugging Face transformers parity for the llama and llama3 checkpoints in
 * ../shared/reference/hf/<arch>/ (reference.safetensors saved by transformers 5.17.0):
 *   - one forward over input_ids [48]: max |kiln - HF| <= 1e-4 over all [48, 512] logits;
 *   - greedy decoding with KV cache from prompt_ids [16] reproduces greedy_ids [24] exactly
 *     (no EOS stop, as HF generate was run).
 */
#include "engine/sampler.h"
#include "model_test_util.h"

static void check_arch(const char *arch) {
    char dir[256], refp[256];
    snprintf(dir, sizeof dir, "reference/hf/%s", arch);
    snprintf(refp, sizeof refp, "reference/hf/%s/reference.safetensors", arch);
    const char *mdir = kiln_test_shared(dir), *rpath = kiln_test_shared(refp);
    kiln_test_require_file(rpath);
    kiln_error err = {0};
    kiln_safetensors *ref = NULL;
    kiln_model *m = NULL;
    REQUIRE(kiln_safetensors_open(rpath, &ref, &err) == KILN_OK);
    kiln_model_load_params lp = {0};
    if (kiln_model_open(mdir, &lp, &m, &err) != KILN_OK) {
        fprintf(stderr, "%s: %s\n", arch, err.message);
        kiln_test_failures++;
        kiln_safetensors_close(ref);
        return;
    }
    const kiln_st_tensor *ids = ref_tensor(ref, "input_ids", KILN_DTYPE_I32);
    const kiln_st_tensor *want = ref_tensor(ref, "logits", KILN_DTYPE_F32);
    const int32_t T = (int32_t)ids->shape[0], V = m->cfg.n_vocab;
    REQUIRE(want->shape[0] == T && want->shape[1] == V);
    float *got = forward_all(m, ids->data, T, KILN_DTYPE_F32);
    float mad = max_abs_diff(got, want->data, (size_t)T * (size_t)V);
    CHECKF(mad <= 1e-4f, "%s: max abs logit difference %g > 1e-4", arch, mad);
    free(got);

    const kiln_st_tensor *prompt = ref_tensor(ref, "prompt_ids", KILN_DTYPE_I32);
    const kiln_st_tensor *greedy = ref_tensor(ref, "greedy_ids", KILN_DTYPE_I32);
    const int32_t np = (int32_t)prompt->shape[0], ng = (int32_t)greedy->shape[0];
    const int32_t *want_ids = greedy->data;
    kiln_kv_seq *kv = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    REQUIRE(logits && kiln_kv_seq_create(m, np + ng, KILN_DTYPE_F32, &kv, &err) == KILN_OK);
    REQUIRE(kiln_model_forward(m, kv, NULL, prompt->data, np, 0, false, logits, &err) == KILN_OK);
    int32_t first_bad = -1;
    for (int32_t i = 0; i < ng; i++) {
        int32_t tok = kiln_argmax(logits, V);
        if (tok != want_ids[i] && first_bad < 0) first_bad = i;
        tok = want_ids[i]; /* teacher-force so one miss does not cascade into many */
        REQUIRE(kiln_model_forward(m, kv, NULL, &tok, 1, np + i, false, logits, &err) == KILN_OK);
    }
    CHECKF(first_bad < 0, "%s: greedy id %d differs from transformers", arch, first_bad);
    printf("%-8s logits max|diff| %.3g over [%d, %d]; greedy %d/%d ids %s\n", arch, mad, T, V, ng, ng,
           first_bad < 0 ? "identical" : "DIFFER");
    free(logits);
    kiln_kv_seq_destroy(kv);
    kiln_model_close(m);
    kiln_safetensors_close(ref);
}

int main(void) {
    check_arch("llama");
    check_arch("llama3");
    return kiln_test_finish("test_hf_logits");
}
