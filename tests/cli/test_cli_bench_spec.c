/*
 * `kiln bench --spec MODE` and `--verify-scaling` (issue 18, "Telemetry"), through the kiln
 * binary on stories260K (no timing is asserted):
 *   - bench --help lists --spec MODE, --spec-k, --prompt-file FILE and --verify-scaling;
 *   - bad values are usage errors (exit 2) naming the flag: an unknown MODE, edit=P outside
 *     [0, 100] or not a number, draft: with a missing file, --spec-k out of range, the spec
 *     options without --spec, --spec with --shared-prefix or --cache-dir, --prompt-tokens past
 *     what --prompt-file holds; a prompt file that cannot be read is a runtime error (exit 1);
 *   - a smoke run of every MODE with --gen-tokens 8 --requests 1 --json has the per-phase
 *     fields, and every speculative output equals its plain one (outputs_match); where the
 *     counts follow from the mode alone they are checked: prediction:self's prediction is
 *     the output, so all of it is accepted; prediction:edit=25 replaces round(8 * 0.25) = 2 of
 *     8 tokens, so accepted + rejected prediction tokens = 8 with at least 2 rejected; a draft
 *     model that is the target itself has every draft accepted;
 *   - --concurrency 1,2 runs a level per entry, --prompt-file takes the file's tokens (as
 *     `kiln tokenize --add-special` counts them) or --prompt-tokens of them, and
 *     --verify-scaling gives the rows M = 1, 2, 5, 9, 17, 33.
 */
#include <jansson.h>
#include <unistd.h>

#include "cli_test_util.h"

static const char *g_model;

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    static char buf[1 << 18];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

static int kiln_out(const char *const *args, char **out, char *err, size_t cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", g_tmpdir);
    int rc = run_kiln_to(args, path, err, cap);
    *out = read_file(path);
    remove(path);
    return rc;
}

static void expect_rc(const char *what, const char *const *args, int want, const char *mention) {
    char err[4096];
    int rc = run_kiln(args, err, sizeof err);
    CHECKF(rc == want, "%s: exit %d, want %d; stderr: %s", what, rc, want, err);
    CHECKF(strstr(err, mention), "%s: the message does not mention '%s': %s", what, mention, err);
}

static void test_help(void) {
    const char *const args[] = {"bench", "--help", NULL};
    char *out, err[4096];
    CHECK(kiln_out(args, &out, err, sizeof err) == 0);
    const char *flags[] = {"--spec MODE",      "--spec-k N",        "--prompt-file FILE",
                           "--verify-scaling", "prediction:edit=P", "draft:PATH"};
    for (int k = 0; k < 6; k++)
        CHECKF(strstr(out, flags[k]), "kiln bench --help does not list %s", flags[k]);
    free(out);
}

static void test_flag_errors(void) {
    char what[256], missing[512], text[512];
    snprintf(missing, sizeof missing, "%s/no-such-model.gguf", g_tmpdir);
#define BAD(mention, ...)                                                                          \
    do {                                                                                           \
        const char *const a[] = {"bench", "-m", g_model, __VA_ARGS__, NULL};                       \
        snprintf(what, sizeof what, "kiln bench %s (%s)", #__VA_ARGS__, mention);                  \
        expect_rc(what, a, 2, mention);                                                            \
    } while (0)
    BAD("--spec", "--spec", "eagle");
    BAD("--spec", "--spec", "");
    BAD("--spec", "--spec", "prediction");
    BAD("--spec", "--spec", "prediction:other");
    BAD("--spec", "--spec", "prediction:edit=101");
    BAD("--spec", "--spec", "prediction:edit=-1");
    BAD("--spec", "--spec", "prediction:edit=ten");
    BAD("--spec", "--spec", "prediction:edit=");
    BAD("--spec", "--spec", "draft:");
    {
        char arg[600];
        snprintf(arg, sizeof arg, "draft:%s", missing);
        const char *const a[] = {"bench", "-m", g_model, "--spec", arg, NULL};
        expect_rc("kiln bench --spec draft:<missing file>", a, 2, "--spec draft:PATH");
    }
    BAD("--spec-k", "--spec", "ngram", "--spec-k", "0");
    BAD("--spec-k", "--spec", "ngram", "--spec-k", "33");
    BAD("--spec-ngram", "--spec", "ngram", "--spec-ngram", "3:2");
    BAD("--spec", "--spec-k", "4");              /* needs --spec */
    BAD("--spec", "--prompt-file", "/dev/null"); /* needs --spec */
    BAD("--shared-prefix", "--spec", "ngram", "--shared-prefix", "16");
    BAD("--cache-dir", "--spec", "ngram", "--cache-dir", g_tmpdir);
    BAD("--shared-prefix", "--spec", "ngram", "--clients", "2");
    BAD("--spec", "--verify-scaling", "--requests", "2"); /* --requests goes with --spec */
#undef BAD
    /* a prompt file: shorter than --prompt-tokens (usage), unreadable (runtime) */
    snprintf(text, sizeof text, "%s/short.txt", g_tmpdir);
    FILE *f = fopen(text, "w");
    REQUIRE(f);
    fputs("Once upon a time", f);
    fclose(f);
    const char *const big[] = {"bench",         "-m", g_model,           "--spec", "ngram",
                               "--prompt-file", text, "--prompt-tokens", "1000",   NULL};
    expect_rc("--prompt-tokens beyond the prompt file", big, 2, "--prompt-tokens");
    const char *const nofile[] = {"bench",         "-m",    g_model, "--spec", "ngram",
                                  "--prompt-file", missing, NULL};
    expect_rc("a prompt file that does not exist", nofile, 1, "--prompt-file");
}

static json_t *bench_json(const char *const *args, const char *what) {
    char *out, err[8192];
    int rc = kiln_out(args, &out, err, sizeof err);
    CHECKF(rc == 0, "%s: exit %d: %s", what, rc, err);
    json_t *j = rc == 0 ? json_loads(out, 0, NULL) : NULL;
    CHECKF(rc != 0 || j, "%s: not JSON: %s", what, out);
    free(out);
    return j;
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    CHECKF(v && json_is_number(v), "field %s is missing or not a number", key);
    return v ? json_number_value(v) : -1;
}

/* The fields every level has; returns the level's spec phase. */
static json_t *check_level(json_t *lv, const char *what, int32_t gen) {
    json_t *plain = json_object_get(lv, "plain"), *spec = json_object_get(lv, "spec");
    CHECKF(plain && spec, "%s: no plain / spec phase", what);
    if (!plain || !spec) return NULL;
    const char *phase_keys[] = {"decode_tok_s_median", "decode_tok_s_min", "decode_tok_s_max",
                                "wall_s"};
    for (int k = 0; k < 4; k++) {
        CHECKF(num(plain, phase_keys[k]) >= 0, "%s: plain %s", what, phase_keys[k]);
        CHECKF(num(spec, phase_keys[k]) >= 0, "%s: spec %s", what, phase_keys[k]);
    }
    const char *spec_keys[] = {"drafted_tokens",
                               "accepted_tokens",
                               "acceptance",
                               "verify_steps",
                               "tokens_per_verify_step",
                               "accepted_prediction_tokens",
                               "rejected_prediction_tokens"};
    for (int k = 0; k < 7; k++)
        CHECKF(num(spec, spec_keys[k]) >= 0, "%s: spec %s", what, spec_keys[k]);
    CHECKF(num(lv, "ratio") >= 0, "%s: ratio", what);
    CHECKF(json_is_true(json_object_get(lv, "outputs_match")), "%s: outputs differ", what);
    double req = num(lv, "requests");
    CHECKF(num(plain, "tokens") == req * gen && num(spec, "tokens") == req * gen,
           "%s: %g / %g tokens, want %g (ignore_eos)", what, num(plain, "tokens"),
           num(spec, "tokens"), req * gen);
    CHECKF(num(spec, "accepted_tokens") <= num(spec, "drafted_tokens"), "%s: accepted > drafted",
           what);
    return spec;
}

static void test_modes(void) {
    char draft[600];
    snprintf(draft, sizeof draft, "draft:%s", g_model);
    const char *modes[] = {"ngram", "random", "prediction:self", "prediction:edit=25", draft};
    for (int i = 0; i < 5; i++) {
        const char *const args[] = {
            "bench", "-m", g_model, "--spec", modes[i], "--gen-tokens", "8", "--requests",
            "1",     "-t", "1",     "--json", NULL};
        json_t *j = bench_json(args, modes[i]);
        if (!j) continue;
        CHECKF(json_is_true(json_object_get(j, "outputs_match")), "%s: outputs differ", modes[i]);
        CHECK(!strcmp(json_string_value(json_object_get(j, "spec")), modes[i]));
        json_t *levels = json_object_get(j, "levels");
        CHECKF(json_array_size(levels) == 1, "%s: %zu levels", modes[i], json_array_size(levels));
        json_t *spec = check_level(json_array_get(levels, 0), modes[i], 8);
        if (spec && i == 2) { /* the prediction is the output: all of it aligns */
            CHECKF(num(spec, "accepted_prediction_tokens") == 8 &&
                       num(spec, "rejected_prediction_tokens") == 0,
                   "prediction:self: %g accepted, %g rejected prediction tokens",
                   num(spec, "accepted_prediction_tokens"),
                   num(spec, "rejected_prediction_tokens"));
            CHECKF(num(spec, "drafted_tokens") > 0 &&
                       num(spec, "accepted_tokens") == num(spec, "drafted_tokens"),
                   "prediction:self: %g of %g drafts accepted", num(spec, "accepted_tokens"),
                   num(spec, "drafted_tokens"));
        }
        if (spec && i == 3) { /* 2 of its 8 tokens replaced by other ids */
            double acc = num(spec, "accepted_prediction_tokens"),
                   rej = num(spec, "rejected_prediction_tokens");
            CHECKF(acc + rej == 8 && rej >= 2 && acc >= 1,
                   "prediction:edit=25: %g accepted + %g rejected prediction tokens", acc, rej);
        }
        if (spec && i == 4) /* the draft model is the target: its drafts are the output */
            CHECKF(num(spec, "drafted_tokens") > 0 &&
                       num(spec, "accepted_tokens") == num(spec, "drafted_tokens"),
                   "draft = target: %g of %g drafts accepted", num(spec, "accepted_tokens"),
                   num(spec, "drafted_tokens"));
        json_decref(j);
    }
    /* the table: a row per phase, the ratio and the match verdict */
    const char *const table[] = {
        "bench", "-m", g_model, "--spec", "prediction:self", "--gen-tokens", "8", "--requests",
        "1",     "-t", "1",     NULL};
    char *out, err[8192];
    int rc = kiln_out(table, &out, err, sizeof err);
    CHECKF(rc == 0, "bench --spec prediction:self (table): exit %d: %s", rc, err);
    CHECKF(strstr(out, " plain ") && strstr(out, " spec ") && strstr(out, "spec/plain") &&
               strstr(out, "identical to plain") && !strstr(out, "MISMATCH"),
           "bench --spec table: %s", out);
    free(out);
}

static void test_levels_and_prompts(void) {
    const char *const lv[] = {"bench",        "-m", g_model,      "--spec", "ngram",
                              "--gen-tokens", "8",  "--requests", "1",      "--concurrency",
                              "1,2",          "-t", "1",          "--json", NULL};
    json_t *j = bench_json(lv, "--concurrency 1,2");
    if (j) {
        json_t *levels = json_object_get(j, "levels");
        CHECKF(json_array_size(levels) == 2, "--concurrency 1,2: %zu levels",
               json_array_size(levels));
        if (json_array_size(levels) == 2) {
            json_t *l1 = json_array_get(levels, 1);
            CHECK(num(l1, "concurrency") == 2);
            CHECKF(num(l1, "requests") == 2, "level 2 ran %g requests per phase, want 2",
                   num(l1, "requests"));
            check_level(l1, "--concurrency 2", 8);
        }
        json_decref(j);
    }
    /* --prompt-file: the whole file, as kiln tokenize --add-special counts it */
    char text[512];
    snprintf(text, sizeof text, "%s/story.txt", g_tmpdir);
    FILE *f = fopen(text, "w");
    REQUIRE(f);
    const char *story = "Once upon a time, there was a little girl named Lily. She liked to play "
                        "in the park with her dog. One day, Lily and her dog went to the park.";
    fputs(story, f);
    fclose(f);
    const char *const tok[] = {"tokenize", "-m", g_model, "--add-special", story, NULL};
    char *out, err[4096];
    CHECK(kiln_out(tok, &out, err, sizeof err) == 0);
    json_t *ids = json_loads(out, 0, NULL);
    free(out);
    size_t n_tok = json_array_size(ids);
    json_decref(ids);
    CHECK(n_tok > 8);
    const char *const whole[] = {
        "bench", "-m",         g_model, "--spec", "ngram", "--prompt-file", text, "--gen-tokens",
        "8",     "--requests", "1",     "-t",     "1",     "--json",        NULL};
    j = bench_json(whole, "--prompt-file");
    if (j) {
        CHECKF(num(j, "prompt_tokens") == (double)n_tok,
               "--prompt-file: %g prompt tokens, want %zu", num(j, "prompt_tokens"), n_tok);
        check_level(json_array_get(json_object_get(j, "levels"), 0), "--prompt-file", 8);
        json_decref(j);
    }
    const char *const part[] = {"bench",
                                "-m",
                                g_model,
                                "--spec",
                                "prediction:self",
                                "--prompt-file",
                                text,
                                "--prompt-tokens",
                                "6",
                                "--gen-tokens",
                                "8",
                                "--requests",
                                "3",
                                "-t",
                                "1",
                                "--json",
                                NULL};
    j = bench_json(part, "--prompt-file --prompt-tokens 6");
    if (j) {
        CHECK(num(j, "prompt_tokens") == 6);
        check_level(json_array_get(json_object_get(j, "levels"), 0), "--prompt-tokens 6", 8);
        json_decref(j);
    }
}

static void test_verify_scaling(void) {
    const char *const args[] = {"bench", "-m", g_model, "--verify-scaling", "--gen-tokens",
                                "8",     "-t", "1",     "--json",           NULL};
    json_t *j = bench_json(args, "--verify-scaling");
    if (!j) return;
    json_t *rows = json_object_get(j, "verify_scaling");
    const int want[] = {1, 2, 5, 9, 17, 33};
    CHECKF(json_array_size(rows) == 6, "--verify-scaling: %zu rows", json_array_size(rows));
    for (size_t i = 0; i < json_array_size(rows) && i < 6; i++) {
        json_t *r = json_array_get(rows, i);
        CHECK(num(r, "m") == want[i]);
        CHECK(num(r, "prefill_ttft_ms") > 0 && num(r, "verify_forward_ms") > 0);
        CHECK(num(r, "prefill_ratio") > 0 && num(r, "verify_ratio") > 0);
        CHECKF(json_is_true(json_object_get(r, "outputs_match")), "M = %d: outputs differ",
               want[i]);
        if (i == 0) CHECK(num(r, "prefill_ratio") == 1.0 && num(r, "verify_ratio") == 1.0);
    }
    CHECK(json_array_size(json_object_get(j, "levels")) == 0);
    json_decref(j);
}

static void cleanup(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    kiln_test_require_file(g_kiln);
    g_model = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(g_model);
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kiln-cli-bench-spec-XXXXXX");
    REQUIRE(mkdtemp(g_tmpdir));
    test_help();
    test_flag_errors();
    test_modes();
    test_levels_and_prompts();
    test_verify_scaling();
    cleanup(g_tmpdir);
    return kiln_test_finish("test_cli_bench_spec");
}
