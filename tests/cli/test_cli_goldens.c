/*
 * Acceptance 1 and 2 through the kiln binary, as a user runs it:
 *   - `kiln run --temp 0 --json -n N` reproduces llama2.c run.c's prompt_ids and
 *     generated_ids for all 12 cases of ../shared/golden/llama2c-greedy.json, from the
 *     llama2.c checkpoints and (with --ctx covering the case) from the f32 GGUF files;
 *   - `kiln logits --kv-type f16` writes a safetensors file whose input_ids equal llama.cpp's
 *     and whose logits agree with llama.cpp's for stories260K f32 (position 0 <= 1e-4, all
 *     positions <= 2e-2, see test_llamacpp_logits for why).
 */
#include <jansson.h>
#include <math.h>

#include "cli_test_util.h"
#include "format/safetensors.h"

static bool same_ids(json_t *a, json_t *b) {
    if (json_array_size(a) != json_array_size(b)) return false;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (json_integer_value(json_array_get(a, i)) != json_integer_value(json_array_get(b, i)))
            return false;
    return true;
}

static void golden_run(const char *model, json_t *c) {
    const char *prompt = json_string_value(json_object_get(c, "prompt"));
    json_t *want_p = json_object_get(c, "prompt_ids"), *want_g = json_object_get(c, "generated_ids");
    char n[32], ctx[32], out[512], err[8192];
    snprintf(n, sizeof n, "%zu", json_array_size(want_g));
    snprintf(ctx, sizeof ctx, "%zu", json_array_size(want_g) + json_array_size(want_p));
    snprintf(out, sizeof out, "%s/out.json", g_tmpdir);
    const char *const args[] = {"run", "-m", model, "-p", prompt, "-n", n, "--ctx", ctx,
                                "--temp", "0", "--json", "-t", "1", NULL};
    int rc = run_kiln_to(args, out, err, sizeof err);
    CHECKF(rc == 0, "%s '%s': exit %d: %s", model, prompt, rc, err);
    json_error_t jerr;
    json_t *got = json_load_file(out, 0, &jerr);
    CHECKF(got != NULL, "%s '%s': stdout is not one JSON object: %s", model, prompt, jerr.text);
    if (!got) return;
    CHECKF(same_ids(json_object_get(got, "prompt_ids"), want_p), "%s '%s': prompt_ids differ", model,
           prompt);
    CHECKF(same_ids(json_object_get(got, "generated_ids"), want_g), "%s '%s': generated_ids differ",
           model, prompt);
    const char *fr = json_string_value(json_object_get(got, "finish_reason"));
    CHECKF(fr && (!strcmp(fr, "stop") || !strcmp(fr, "length")), "%s: finish_reason '%s'", model,
           fr ? fr : "(none)");
    CHECKF(json_is_string(json_object_get(got, "text")) && json_is_object(json_object_get(got, "timings")),
           "%s: text/timings missing", model);
    json_decref(got);
}

static void logits_cli(void) {
    const char *golden = kiln_test_shared("golden/llamacpp-stories260K-f32.safetensors");
    const char *model = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(golden);
    kiln_error e = {0};
    kiln_safetensors *ref = NULL, *got = NULL;
    REQUIRE(kiln_safetensors_open(golden, &ref, &e) == KILN_OK);
    const kiln_st_tensor *ids = kiln_safetensors_find(ref, "input_ids");
    const kiln_st_tensor *want = kiln_safetensors_find(ref, "logits");
    REQUIRE(ids && want);
    char list[8192] = "", out[512], err[8192];
    const int32_t *idv = ids->data;
    for (int64_t i = 0; i < ids->shape[0]; i++) {
        char one[16];
        snprintf(one, sizeof one, i ? ",%d" : "%d", idv[i]);
        strcat(list, one);
    }
    snprintf(out, sizeof out, "%s/logits.safetensors", g_tmpdir);
    const char *const args[] = {"logits", "-m", model, "--ids", list, "--kv-type", "f16", "-o", out, NULL};
    int rc = run_kiln(args, err, sizeof err);
    CHECKF(rc == 0, "kiln logits: exit %d: %s", rc, err);
    if (rc != 0) return;
    REQUIRE(kiln_safetensors_open(out, &got, &e) == KILN_OK);
    const kiln_st_tensor *gi = kiln_safetensors_find(got, "input_ids");
    const kiln_st_tensor *gl = kiln_safetensors_find(got, "logits");
    REQUIRE(gi && gl && gi->dtype == KILN_DTYPE_I32 && gl->dtype == KILN_DTYPE_F32);
    CHECK(gi->nbytes == ids->nbytes && !memcmp(gi->data, ids->data, ids->nbytes));
    REQUIRE(gl->n_dims == 2 && gl->shape[0] == want->shape[0] && gl->shape[1] == want->shape[1]);
    const float *a = gl->data, *b = want->data;
    float mad = 0, mad0 = 0;
    for (int64_t i = 0; i < want->shape[0] * want->shape[1]; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= mad)) mad = d;
        if (i < want->shape[1] && !(d <= mad0)) mad0 = d;
    }
    printf("kiln logits vs llama.cpp (stories260K f32, f16 KV): position 0 %.3g, all %.3g\n", mad0, mad);
    CHECKF(mad0 <= 1e-4f && mad <= 2e-2f, "logits differ: position 0 %g, all %g", mad0, mad);
    kiln_safetensors_close(got);
    kiln_safetensors_close(ref);
    remove(out);
}

int main(void) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    kiln_test_require_file(g_kiln);
    const char *gpath = kiln_test_shared("golden/llama2c-greedy.json");
    kiln_test_require_file(gpath);
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kiln-cli-golden-XXXXXX");
    REQUIRE(mkdtemp(g_tmpdir));
    json_error_t jerr;
    json_t *root = json_load_file(gpath, 0, &jerr);
    REQUIRE(root);
    json_t *cases = json_object_get(root, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *m = json_string_value(json_object_get(c, "model"));
        bool st = !strcmp(m, "stories260K");
        golden_run(kiln_test_shared(st ? "models/stories260K/stories260K.bin"
                                       : "models/llama2xs-260K/llama2xs.bin"), c);
        golden_run(kiln_test_shared(st ? "models/stories260K/stories260K-f32.gguf"
                                       : "models/llama2xs-260K/llama2xs-f32.gguf"), c);
    }
    json_decref(root);
    logits_cli();
    char p[512];
    snprintf(p, sizeof p, "%s/out.json", g_tmpdir);
    remove(p);
    snprintf(p, sizeof p, "%s/stderr.txt", g_tmpdir);
    remove(p);
    rmdir(g_tmpdir);
    return kiln_test_finish("test_cli_goldens");
}
