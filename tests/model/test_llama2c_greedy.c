/*
 * Acceptance 1: greedy generation reproduces llama2.c run.c (-t 0.0 -n 256) for every case
 * of ../shared/golden/llama2c-greedy.json: prompt_ids and generated_ids, from the llama2.c
 * checkpoint; and for stories260K and llama2xs also from their f32 GGUF files (EOS is id 2
 * there, BOS is not a stop token, so only the first len(generated_ids) tokens are compared).
 * With env KILN_TEST_DEVICE=cuda (tests/cuda) the models run on the GPU (kiln_generate makes
 * its context and KV cache there).
 */
#include <jansson.h>

#include "device_test.h"
#include "engine/generate.h"
#include "backend/loader.h"
#include "model/model.h"
#include "test.h"

typedef struct model_files {
    const char *name, *ckpt, *gguf;
} model_files;

static const model_files MODELS[] = {
    {"stories260K", "models/stories260K/stories260K.bin",
     "models/stories260K/stories260K-f32.gguf"},
    {"llama2xs", "models/llama2xs-260K/llama2xs.bin", "models/llama2xs-260K/llama2xs-f32.gguf"},
};

static void run_case(const char *path, const char *prompt, json_t *want_prompt, json_t *want_gen) {
    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_model_params mp = {.require_tokenizer = true};
    kiln_test_device(&mp); /* env KILN_TEST_DEVICE: the GPU run of tests/cuda */
    if (kiln_model_load(path, &mp, &m, &err) != KILN_OK) {
        fprintf(stderr, "%s: %s\n", path, err.message);
        kiln_test_failures++;
        return;
    }
    kiln_ivec ids = {0};
    REQUIRE(kiln_tokenizer_encode(m->tokenizer, prompt, strlen(prompt), true, false, &ids, &err) ==
            KILN_OK);
    size_t np = json_array_size(want_prompt), ng = json_array_size(want_gen);
    bool same_prompt = ids.n == np;
    for (size_t i = 0; same_prompt && i < np; i++)
        same_prompt = ids.data[i] == json_integer_value(json_array_get(want_prompt, i));
    CHECKF(same_prompt, "%s: prompt '%s' encodes differently (%zu ids, want %zu)", path, prompt,
           ids.n, np);
    /* llama.cpp's llama2xs conversion records context_length 128 while run.c ran 256
     * positions, so the context is set to what the case needs. */
    kiln_generate_params gp = {.max_tokens = (int32_t)ng, .n_ctx = (int32_t)(np + ng)};
    gp.sampler = kiln_sampler_defaults();
    gp.sampler.temperature = 0.0f;
    kiln_generate_result res;
    REQUIRE(kiln_generate(m, NULL, ids.data, (int32_t)ids.n, &gp, NULL, NULL, &res, &err) ==
            KILN_OK);
    size_t mismatch = (size_t)-1;
    for (size_t i = 0; i < ng && i < res.tokens.n; i++)
        if (res.tokens.data[i] != json_integer_value(json_array_get(want_gen, i))) {
            mismatch = i;
            break;
        }
    CHECKF(mismatch == (size_t)-1, "%s: prompt '%s': first mismatch at generated index %zu", path,
           prompt, mismatch);
    CHECKF(res.tokens.n == ng, "%s: prompt '%s': generated %zu tokens, run.c generated %zu", path,
           prompt, res.tokens.n, ng);
    printf("%-48s %-32s %zu tokens %s\n", path + strlen(KILN_SHARED_DIR) + 1, prompt, ng,
           mismatch == (size_t)-1 ? "ok" : "MISMATCH");
    kiln_ivec_free(&res.tokens);
    kiln_ivec_free(&ids);
    kiln_model_close(m);
}

int main(void) {
    const char *golden = kiln_test_shared("golden/llama2c-greedy.json");
    kiln_test_require_file(golden);
    json_error_t jerr;
    json_t *root = json_load_file(golden, 0, &jerr);
    REQUIRE(root);
    json_t *cases = json_object_get(root, "cases");
    REQUIRE(json_array_size(cases) == 12);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *model = json_string_value(json_object_get(c, "model"));
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        REQUIRE(model && prompt);
        const model_files *mf = NULL;
        for (size_t k = 0; k < sizeof MODELS / sizeof MODELS[0]; k++)
            if (!strcmp(MODELS[k].name, model)) mf = &MODELS[k];
        REQUIRE(mf);
        const char *ckpt = kiln_test_shared(mf->ckpt), *gguf = kiln_test_shared(mf->gguf);
        kiln_test_require_file(ckpt);
        kiln_test_require_file(gguf);
        run_case(ckpt, prompt, json_object_get(c, "prompt_ids"),
                 json_object_get(c, "generated_ids"));
        run_case(gguf, prompt, json_object_get(c, "prompt_ids"),
                 json_object_get(c, "generated_ids"));
    }
    json_decref(root);
    return kiln_test_finish("test_llama2c_greedy");
}
