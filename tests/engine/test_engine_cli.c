/*
 * The engine through the kiln binary:
 *   - `kiln run --json` gives the same generated_ids and text whatever --step-tokens,
 *     --prefill-chunk, --kv-type f32 and -t say (batch invariance end to end), and its text
 *     is the completion only;
 *   - `kiln run` streaming prints the prompt followed by that same text;
 *   - `kiln run` past the context ends with finish "length" at the context's last position;
 *   - `kiln bench --json` reports every concurrency level with sane numbers: all tokens
 *     generated, TTFT p50 <= p99, peak KV blocks covering the requests;
 *   - bad bench arguments are usage errors (exit 2).
 */
#include <jansson.h>
#include <math.h>

#include "cli/cli_test_util.h"

static const char *g_model;

static json_t *run_json(const char *const *args) {
    char out[512], err[8192];
    snprintf(out, sizeof out, "%s/out.json", g_tmpdir);
    int rc = run_kiln_to(args, out, err, sizeof err);
    CHECKF(rc == 0, "kiln %s: exit %d: %s", args[0], rc, err);
    if (rc != 0) return NULL;
    json_error_t jerr;
    json_t *j = json_load_file(out, 0, &jerr);
    CHECKF(j != NULL, "kiln %s: stdout is not JSON: %s", args[0], jerr.text);
    return j;
}

static void test_run_invariance(void) {
    const char *const base[] = {"run", "-m", g_model,  "-p", "Once upon a time",
                                "-n",  "48", "--temp", "0",  "--json",
                                "-t",  "1",  NULL};
    json_t *ref = run_json(base);
    REQUIRE(ref);
    json_t *rg = json_object_get(ref, "generated_ids");
    const char *rtext = json_string_value(json_object_get(ref, "text"));
    CHECK(json_array_size(rg) == 48 && rtext && strlen(rtext) > 20);
    CHECK(!strcmp(json_string_value(json_object_get(ref, "finish_reason")), "length"));
    const char *variants[][6] = {
        {"--step-tokens", "1", "--prefill-chunk", "1", "-t", "2"},
        {"--step-tokens", "3", "--prefill-chunk", "2", "-t", "1"},
        {"--prefill-chunk", "7", "--kv-tokens", "4096", "-t", "2"},
        {"--kv-memory", "10000000", "--kv-type", "f32", "-t", "1"},
    };
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const char *args[32];
        int n = 0;
        for (; base[n]; n++) args[n] = base[n];
        for (int k = 0; k < 6; k++) args[n++] = variants[v][k];
        args[n] = NULL;
        json_t *got = run_json(args);
        if (!got) continue;
        CHECKF(json_equal(json_object_get(got, "generated_ids"), rg),
               "variant %zu: generated_ids differ", v);
        CHECKF(!strcmp(json_string_value(json_object_get(got, "text")), rtext),
               "variant %zu: text differs", v);
        json_decref(got);
    }
    /* Streaming: the prompt, then the same completion text. */
    const char *const stream[] = {
        "run", "-m", g_model, "-p", "Once upon a time", "-n", "48", "--temp", "0", "-t", "1", NULL};
    char out[512], err[8192];
    snprintf(out, sizeof out, "%s/stream.txt", g_tmpdir);
    CHECK(run_kiln_to(stream, out, err, sizeof err) == 0);
    FILE *f = fopen(out, "rb");
    REQUIRE(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char want[8192];
    snprintf(want, sizeof want, "Once upon a time%s\n", rtext);
    CHECKF(!strcmp(buf, want), "streamed output '%s', want '%s'", buf, want);
    remove(out);
    json_decref(ref);

    /* Past the context (--ctx 20, prompt 5 tokens): 16 tokens, finish length. */
    const char *const ctx[] = {"run", "-m",     g_model, "-p", "Once upon a time",
                               "-n",  "100",    "--ctx", "20", "--temp",
                               "0",   "--json", "-t",    "1",  NULL};
    json_t *c = run_json(ctx);
    if (c) {
        CHECKF(json_array_size(json_object_get(c, "generated_ids")) == 16, "--ctx 20: %zu tokens",
               json_array_size(json_object_get(c, "generated_ids")));
        CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "length"));
        json_decref(c);
    }
}

static void test_bench(void) {
    const char *const args[] = {
        "bench", "-m",           g_model, "--concurrency", "1,3,8", "--prompt-tokens",
        "20",    "--gen-tokens", "6",     "--json",        "-t",    "1",
        NULL};
    json_t *j = run_json(args);
    if (!j) return;
    json_t *levels = json_object_get(j, "levels");
    CHECK(json_array_size(levels) == 3);
    int want_c[] = {1, 3, 8};
    int32_t bs = (int32_t)json_integer_value(json_object_get(j, "block_size"));
    CHECK(bs == 16);
    for (size_t i = 0; i < json_array_size(levels); i++) {
        json_t *l = json_array_get(levels, i);
        int c = (int)json_integer_value(json_object_get(l, "concurrency"));
        double p50 = json_real_value(json_object_get(l, "ttft_ms_p50"));
        double p99 = json_real_value(json_object_get(l, "ttft_ms_p99"));
        double tot = json_real_value(json_object_get(l, "total_gen_tok_s"));
        double wall = json_real_value(json_object_get(l, "wall_s"));
        double pre = json_real_value(json_object_get(l, "prefill_tok_s"));
        int peak = (int)json_integer_value(json_object_get(l, "peak_kv_blocks"));
        CHECK(c == want_c[i]);
        CHECKF(p50 > 0 && p50 <= p99, "level %d: TTFT p50 %g p99 %g", c, p50, p99);
        /* All c * 6 tokens were generated in wall seconds. */
        CHECKF(tot > 0 && fabs(tot * wall - c * 6.0) < 0.01 * c * 6.0 + 1e-6,
               "level %d: %g tok/s over %g s is not %d tokens", c, tot, wall, c * 6);
        CHECK(pre > 0);
        /* Each request reserves ceil((20 + 6 - 1) / 16) = 2 blocks while it runs. */
        CHECKF(peak >= 2 && peak <= 2 * c, "level %d: peak %d blocks", c, peak);
    }
    json_decref(j);
    char err[8192];
    const char *const bad1[] = {"bench", "-m", g_model, "--concurrency", "0", NULL};
    CHECK(run_kiln(bad1, err, sizeof err) == 2 && strstr(err, "--concurrency"));
    const char *const bad2[] = {"bench", "-m", g_model, "--gen-tokens", "x", NULL};
    CHECK(run_kiln(bad2, err, sizeof err) == 2 && strstr(err, "--gen-tokens"));
    const char *const bad3[] = {"bench", "--concurrency", "1", NULL};
    CHECK(run_kiln(bad3, err, sizeof err) == 2 && strstr(err, "-m"));
    const char *const bad4[] = {"bench", "-m", "/nonexistent.gguf", NULL};
    CHECK(run_kiln(bad4, err, sizeof err) == 1 && strstr(err, "kiln: error:"));
}

int main(void) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    kiln_test_require_file(g_kiln);
    g_model = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(g_model);
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kiln-engine-cli-XXXXXX");
    REQUIRE(mkdtemp(g_tmpdir));
    test_run_invariance();
    test_bench();
    char p[512];
    snprintf(p, sizeof p, "%s/out.json", g_tmpdir);
    remove(p);
    snprintf(p, sizeof p, "%s/stderr.txt", g_tmpdir);
    remove(p);
    rmdir(g_tmpdir);
    return kiln_test_finish("test_engine_cli");
}
