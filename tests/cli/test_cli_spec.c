/*
 * Speculative decoding, predictions and fill on the command line (issue 18), through the
 * kiln binary on stories260K:
 *   - run and serve --help list --spec, --spec-k, --spec-ngram, --draft-model (run also
 *     --prediction, --prediction-file, --fill, --fill-policy);
 *   - bad values and conflicting flags are usage errors (exit 2) naming the flag; a draft
 *     model or prediction file that cannot be read, or a draft model with another
 *     vocabulary, is a runtime error (exit 1) naming it;
 *   - greedy `kiln run --spec ngram` (and random, and a prediction equal to the plain output,
 *     and a draft model that is the target itself) prints the same ids and text as plain
 *     `kiln run` (exact speculation), and --json's "speculation" object and the stats line
 *     report the drafts; --fill TEXT: the text begins with TEXT.
 * The expected output is plain `kiln run`'s own, in the same test.
 */
#include <jansson.h>

#include "cli_test_util.h"

static const char *g_model;
static char g_joined[8192];

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    static char buf[1 << 16];
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
    const char *cmds[] = {"run", "serve"};
    for (int i = 0; i < 2; i++) {
        const char *const args[] = {cmds[i], "--help", NULL};
        char *out, err[4096];
        CHECK(kiln_out(args, &out, err, sizeof err) == 0);
        const char *flags[] = {"--spec S",           "--spec-k N",        "--spec-ngram MIN:MAX",
                               "--draft-model PATH", "--prediction TEXT", "--prediction-file PATH",
                               "--fill TEXT",        "--fill-policy P"};
        for (int k = 0; k < (i == 0 ? 8 : 4); k++)
            CHECKF(strstr(out, flags[k]), "kiln %s --help does not list %s", cmds[i], flags[k]);
        free(out);
    }
}

static void test_flag_errors(void) {
    const char *cmds[] = {"run", "serve"};
    for (int i = 0; i < 2; i++) {
        const char *c = cmds[i];
        char what[128];
#define BAD(flag, value, mention)                                                                  \
    do {                                                                                           \
        const char *const a[] = {c, "-m", g_model, "-p", "x", flag, value, NULL};                  \
        const char *const s[] = {c, "-m", g_model, flag, value, NULL};                             \
        snprintf(what, sizeof what, "kiln %s %s '%s'", c, flag, value);                            \
        expect_rc(what, i == 0 ? a : s, 2, mention);                                               \
    } while (0)
        BAD("--spec", "eagle", "--spec");
        BAD("--spec", "", "--spec");
        BAD("--spec", "default", "--spec");
        BAD("--spec-k", "0", "--spec-k");
        BAD("--spec-k", "33", "--spec-k");
        BAD("--spec-k", "four", "--spec-k");
        BAD("--spec-ngram", "4", "--spec-ngram");
        BAD("--spec-ngram", "0:2", "--spec-ngram");
        BAD("--spec-ngram", "3:2", "--spec-ngram");
        BAD("--spec-ngram", "1:65", "--spec-ngram");
        BAD("--spec-ngram", "a:b", "--spec-ngram");
        BAD("--spec-ngram", "1:", "--spec-ngram");
        BAD("--draft-model", "", "--draft-model");
        BAD("--spec", "draft", "--draft-model"); /* draft needs a draft model */
        /* KV formats and TurboQuant configs (kv/kv_format.h kiln_kv_format_parse) */
        BAD("--kv-type", "q9", "--kv-type");
        BAD("--kv-type", "turbo:k9v3", "--kv-type");
        BAD("--kv-type", "turbo:x", "--kv-type");
        BAD("--kv-type", "turbo:k8", "--kv-type");
        BAD("--kv-type-k", "turbo:k0v3", "--kv-type-k");
        BAD("--kv-type-v", "turbo:k8v3x", "--kv-type-v");
        BAD("--kv-type-v", "turbo9", "--kv-type-v");
#undef BAD
    }
    const char *const pol[] = {"run",    "-m",    g_model,         "-p",    "x",
                               "--fill", "hello", "--fill-policy", "force", NULL};
    expect_rc("--fill-policy force", pol, 2, "--fill-policy");
    const char *const orphan[] = {"run", "-m", g_model, "-p", "x", "--fill-policy", "verify", NULL};
    expect_rc("--fill-policy without --fill", orphan, 2, "--fill");
    const char *const both[] = {
        "run",       "-m", g_model, "-p", "x", "--prediction", "a", "--prediction-file",
        "/dev/null", NULL};
    expect_rc("--prediction with --prediction-file", both, 2, "--prediction-file");
    const char *const vp[] = {"run",           "-m",     g_model,        "-p", "x", "--fill", "a",
                              "--fill-policy", "verify", "--prediction", "ab", NULL};
    expect_rc("--fill-policy verify with --prediction", vp, 2, "--prediction");
    /* runtime errors: exit 1, naming what failed */
    char missing[512];
    snprintf(missing, sizeof missing, "%s/no-such-model.gguf", g_tmpdir);
    const char *const dm[] = {"run", "-m", g_model,         "-p",    "x",
                              "-n",  "2",  "--draft-model", missing, NULL};
    expect_rc("a draft model that does not load", dm, 1, "draft model");
    /* a draft model with another vocabulary (pycode10M: 8192 tokens) is refused at engine
     * creation with the reason */
    const char *other = kiln_test_shared("models/pycode10M");
    char other_cfg[4200];
    snprintf(other_cfg, sizeof other_cfg, "%s/config.json", other);
    if (access(other_cfg, R_OK) == 0) {
        const char *const dv[] = {"run", "-m", g_model,         "-p",  "x",
                                  "-n",  "2",  "--draft-model", other, NULL};
        expect_rc("a draft model with another vocabulary", dv, 1, "vocabular");
        const char *const sv[] = {"serve",         "-m",  g_model, "--port", "0",
                                  "--draft-model", other, NULL};
        expect_rc("kiln serve with a draft model of another vocabulary", sv, 1, "vocabular");
    } else {
        fprintf(stderr, "note: %s is missing: the vocabulary refusal is not checked\n", other);
    }
    const char *const pf[] = {"run", "-m", g_model, "-p", "x", "--prediction-file", missing, NULL};
    expect_rc("a prediction file that does not exist", pf, 1, "--prediction-file");
}

/* kiln run --json (greedy, 48 tokens) with extra flags; the parsed object (NULL on failure)
 * and the stats line in err. */
static const char *PROMPT = "One day, Lily went to the park. One day, Lily went to the park with "
                            "her mom. One day,";

static json_t *run_json(const char *const *extra, char *err, size_t cap) {
    const char *args[40] = {"run", "-m",     g_model, "-p", PROMPT, "-n",
                            "48",  "--temp", "0",     "-t", "1",    "--json"};
    int n = 12;
    for (int i = 0; extra && extra[i] && n < 38; i++) args[n++] = extra[i];
    args[n] = NULL;
    char *out;
    int rc = kiln_out(args, &out, err, cap);
    CHECKF(rc == 0, "kiln run --json %s: exit %d: %s", extra && extra[0] ? extra[0] : "", rc, err);
    json_t *j = rc == 0 ? json_loads(out, 0, NULL) : NULL;
    CHECKF(rc != 0 || j, "not JSON: %s", out);
    free(out);
    return j;
}

static long long spec_of(json_t *j, const char *key) {
    json_t *v = json_object_get(json_object_get(j, "speculation"), key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static void test_run_exact(void) {
    char err[4096];
    json_t *plain = run_json(NULL, err, sizeof err);
    REQUIRE(plain);
    json_t *want_ids = json_object_get(plain, "generated_ids");
    const char *want_text = json_string_value(json_object_get(plain, "text"));
    REQUIRE(json_array_size(want_ids) > 8 && want_text);
    CHECK(spec_of(plain, "drafted_tokens") == 0 && spec_of(plain, "fill_tokens") == 0);
    CHECKF(!strstr(err, "| spec "), "plain run prints speculation stats: %s", err);

    /* Is the output its text's own tokenization (prompt + text tokenized = prompt ids +
     * generated ids)? kiln tokenize --add-special, as kiln run tokenizes the prompt. */
    bool canonical = false;
    {
        snprintf(g_joined, sizeof g_joined, "%s%s", PROMPT, want_text);
        const char *const ta[] = {"tokenize", "-m", g_model, "--add-special", g_joined, NULL};
        char *out;
        CHECK(kiln_out(ta, &out, err, sizeof err) == 0);
        json_t *got = json_loads(out, 0, NULL), *both = json_array();
        json_array_extend(both, json_object_get(plain, "prompt_ids"));
        json_array_extend(both, want_ids);
        canonical = got && json_equal(got, both);
        json_decref(got);
        json_decref(both);
        free(out);
    }
    if (!canonical)
        fprintf(stderr, "note: the plain output is not its text's own tokenization: the "
                        "all-accepted check of --prediction is skipped\n");
    char draft_len[16];
    snprintf(draft_len, sizeof draft_len, "%d", 5);
    const char *const ngram[] = {"--spec", "ngram", NULL};
    const char *const ngram_k[] = {"--spec",       "ngram", "--spec-k", draft_len,
                                   "--spec-ngram", "2:3",   NULL};
    const char *const rnd[] = {"--spec", "random", "--spec-k", "3", NULL};
    const char *const pred[] = {"--prediction", want_text, NULL};
    const char *const self[] = {"--draft-model", g_model, NULL};
    const char *const off[] = {"--spec", "off", "--spec-k", "4", NULL};
    const struct {
        const char *what;
        const char *const *extra;
        bool drafts;
    } cases[] = {{"--spec ngram", ngram, true},
                 {"--spec ngram --spec-k 5 --spec-ngram 2:3", ngram_k, true},
                 {"--spec random", rnd, true},
                 {"--prediction <plain text>", pred, true},
                 {"--draft-model <itself>", self, true},
                 {"--spec off", off, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = run_json(cases[i].extra, err, sizeof err);
        if (!j) continue;
        CHECKF(json_equal(json_object_get(j, "generated_ids"), want_ids),
               "kiln run %s: other ids than plain kiln run", cases[i].what);
        CHECKF(!strcmp(json_string_value(json_object_get(j, "text")) ?: "", want_text),
               "kiln run %s: text '%s', want '%s'", cases[i].what,
               json_string_value(json_object_get(j, "text")), want_text);
        long long d = spec_of(j, "drafted_tokens"), a = spec_of(j, "accepted_tokens");
        CHECKF(cases[i].drafts ? d > 0 && a >= 0 && a <= d : d == 0,
               "kiln run %s: drafted %lld, accepted %lld", cases[i].what, d, a);
        if (cases[i].drafts)
            CHECKF(strstr(err, "| spec ") && strstr(err, "drafted"),
                   "kiln run %s: no speculation stats: %s", cases[i].what, err);
        if (cases[i].extra == pred) {
            long long acc = spec_of(j, "accepted_prediction_tokens"),
                      rej = spec_of(j, "rejected_prediction_tokens");
            CHECKF(acc > 0, "a prediction equal to the output accepted %lld tokens", acc);
            /* tokenized as the prompt's continuation, the prediction is the output's tokens
             * when those are its text's own tokenization: then every one is accepted */
            if (canonical)
                CHECKF(rej == 0 && acc == (long long)json_array_size(want_ids),
                       "a prediction equal to the output: accepted %lld, rejected %lld of %zu", acc,
                       rej, json_array_size(want_ids));
        }
        if (cases[i].extra == self)
            CHECKF(!strcmp(json_string_value(
                               json_object_get(json_object_get(j, "speculation"), "source"))
                               ?: "",
                           "draft"),
                   "--draft-model without --spec did not default to draft");
        json_decref(j);
    }
    json_decref(plain);

    /* --fill: the text begins with it (streamed to stdout after the prompt as well). */
    const char *fill = " Lily saw a big red ball";
    const char *const fa[] = {"--fill", fill, NULL};
    json_t *j = run_json(fa, err, sizeof err);
    if (j) {
        const char *t = json_string_value(json_object_get(j, "text")) ?: "";
        CHECKF(!strncmp(t, fill, strlen(fill)), "--fill: text '%s' does not begin with '%s'", t,
               fill);
        CHECKF(spec_of(j, "fill_tokens") > 0, "--fill: fill_tokens %lld",
               spec_of(j, "fill_tokens"));
        json_decref(j);
    }
}

static void cleanup(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* `kiln run --kv-quant-start N` with the default pool (sized from the request): the run must
 * find room for the delayed transition's f16 reserve (it was refused before: the reserve was
 * more than half of a pool of exactly prompt + max tokens), and while the sequence is not
 * longer than N its greedy tokens are those of --kv-type f16 (the design's promise: bitwise
 * f16 logits below N). */
static void test_kv_quant_start_default_pool(const char *kv) {
    char err[4096];
    const char *const f16[] = {"--kv-type", "f16", NULL};
    json_t *ref = run_json(f16, err, sizeof err);
    REQUIRE(ref);
    const size_t n_prompt = json_array_size(json_object_get(ref, "prompt_ids"));
    char start[16];
    snprintf(start, sizeof start, "%zu", n_prompt + 10);
    const char *const q[] = {"--kv-type", kv, "--kv-quant-start", start, NULL};
    json_t *got = run_json(q, err, sizeof err);
    CHECKF(got != NULL, "--kv-type %s --kv-quant-start %s with the default pool: %s", kv, start,
           err);
    if (got) {
        json_t *a = json_object_get(ref, "generated_ids"), *b = json_object_get(got, "generated_ids");
        CHECK(json_array_size(b) == json_array_size(a));
        for (size_t i = 0; i < 9 && i < json_array_size(a); i++)
            CHECKF(json_equal(json_array_get(a, i), json_array_get(b, i)),
                   "%s: token %zu below --kv-quant-start differs from --kv-type f16", kv, i);
    }
    json_decref(ref);
    json_decref(got);
}

/* `kiln run --kv-type turbo:k4v4` and --kv-type-k / -v taking their side of a config run */
static void test_turbo_run(void) {
    char err[4096];
    const char *const a[] = {"--kv-type", "turbo:k4v4", NULL};
    json_t *got = run_json(a, err, sizeof err);
    CHECKF(got != NULL, "--kv-type turbo:k4v4: %s", err);
    json_decref(got);
    const char *const b[] = {"--kv-type-k", "turbo:k8v3", "--kv-type-v", "turbo:k8v3", NULL};
    got = run_json(b, err, sizeof err);
    CHECKF(got != NULL, "--kv-type-k/-v turbo:k8v3: %s", err);
    json_decref(got);
}

int main(void) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    kiln_test_require_file(g_kiln);
    g_model = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(g_model);
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kiln-cli-spec-XXXXXX");
    REQUIRE(mkdtemp(g_tmpdir));
    test_help();
    test_flag_errors();
    test_run_exact();
    test_kv_quant_start_default_pool("q4_0");
    test_kv_quant_start_default_pool("turbo");
    test_turbo_run();
    cleanup(g_tmpdir);
    return kiln_test_finish("test_cli_spec");
}
