/*
 * A Hugging Face directory runs without a GGUF (model-families issue): kiln_model_open on a
 * directory with config.json + model.safetensors + tokenizer.json + generation_config.json
 * loads the tokenizer.json tokenizer and marks generation_config's eos_token_id as
 * end-of-generation, and reads its sampling defaults.
 * Fixture: ../shared/reference/hf/llama (vocab 512, no tokenizer) plus a tokenizer.json
 * exported by kiln-export-tokenizer from stories260K's GGUF vocabulary (also 512 tokens),
 * assembled in a temp dir with symlinks. Expected ids come from the GGUF tokenizer.
 */
#include <stdlib.h>
#include <sys/wait.h>

#include "engine/generate.h"
#include "backend/loader.h"
#include "model/model.h"
#include "test.h"

static void link_into(const char *dir, const char *src_dir, const char *name) {
    char from[1024], to[1024];
    snprintf(from, sizeof from, "%s/%s", src_dir, name);
    snprintf(to, sizeof to, "%s/%s", dir, name);
    REQUIRE(symlink(from, to) == 0);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    REQUIRE(f && fputs(text, f) >= 0);
    fclose(f);
}

int main(void) {
    const char *ref = kiln_test_shared("reference/hf/llama");
    const char *gguf = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    char tool[1024];
    snprintf(tool, sizeof tool, "%s/kiln-export-tokenizer", KILN_BINARY_DIR);
    kiln_test_require_file(gguf);
    kiln_test_require_file(tool);
    char ref_cfg[1024];
    snprintf(ref_cfg, sizeof ref_cfg, "%s/config.json", ref);
    kiln_test_require_file(ref_cfg);

    char dir[] = "/tmp/kiln-hf-dir-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' >/dev/null", tool, gguf, dir);
    REQUIRE(system(cmd) == 0);
    link_into(dir, ref, "config.json");
    link_into(dir, ref, "model.safetensors");
    write_text(dir, "generation_config.json",
               "{\"eos_token_id\": [2, 13], \"temperature\": 0.6, \"top_p\": 0.9, \"do_sample\": true}");

    kiln_error err = {0};
    kiln_model *hf = NULL, *gm = NULL;
    kiln_model_load_params lp = {.require_tokenizer = true};
    if (kiln_model_open(dir, &lp, &hf, &err) != KILN_OK) {
        fprintf(stderr, "HF dir: %s\n", err.message);
        return 1;
    }
    REQUIRE(kiln_model_open(gguf, &lp, &gm, &err) == KILN_OK);
    const char *texts[] = {"Once upon a time", "Lily and Tom went to the park.", "Der Hund 🐶"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        kiln_ivec a = {0}, b = {0};
        REQUIRE(kiln_tokenizer_encode(hf->tokenizer, texts[i], strlen(texts[i]), true, false, &a, &err) == KILN_OK);
        REQUIRE(kiln_tokenizer_encode(gm->tokenizer, texts[i], strlen(texts[i]), true, false, &b, &err) == KILN_OK);
        bool same = a.n == b.n && !memcmp(a.data, b.data, a.n * sizeof *a.data);
        CHECKF(same, "'%s': tokenizer.json ids differ from the GGUF tokenizer's", texts[i]);
        kiln_ivec_free(&a);
        kiln_ivec_free(&b);
    }
    CHECK(kiln_model_is_eog(hf, 2));
    CHECK(kiln_model_is_eog(hf, 13)); /* from generation_config's list */
    CHECK(!kiln_model_is_eog(hf, 14));
    CHECK(hf->gen.has_temperature && hf->gen.temperature == 0.6f);
    CHECK(hf->gen.has_top_p && hf->gen.top_p == 0.9f);
    CHECK(hf->gen.has_do_sample && hf->gen.do_sample);
    CHECK(!hf->gen.has_top_k);

    /* A directory without tokenizer.json is refused when a tokenizer is required. */
    char p[1100];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    REQUIRE(remove(p) == 0);
    kiln_model *none = NULL;
    CHECK(kiln_model_open(dir, &lp, &none, &err) == KILN_ERR_NOT_FOUND);
    CHECK(strstr(err.message, "tokenizer.json") != NULL);
    /* ... and a malformed generation_config.json is a clear error. */
    write_text(dir, "generation_config.json", "{\"eos_token_id\": [2, ");
    kiln_model_load_params lp2 = {0};
    CHECK(kiln_model_open(dir, &lp2, &none, &err) == KILN_ERR_FORMAT);
    CHECK(strstr(err.message, "generation_config.json") != NULL);

    kiln_model_close(hf);
    kiln_model_close(gm);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    REQUIRE(system(cmd) == 0);
    return kiln_test_finish("test_hf_dir_tokenizer");
}
