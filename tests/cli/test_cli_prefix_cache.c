/*
 * The prefix cache's command line (issue 13), through the kiln binary:
 *   - run, serve and bench --help list --no-prefix-cache, --cache-dir and --cache-disk-max
 *     (bench also --shared-prefix, --clients, --requests);
 *   - sizes: --kv-memory and --cache-disk-max share one parser: "60K", "61440", "61.44KB"
 *     give the same KV pool, "80KiB" = "81920" a larger one; malformed sizes, a zero size,
 *     --cache-dir with --no-prefix-cache, --cache-disk-max without --cache-dir and the
 *     shared-prefix options outside --shared-prefix are usage errors (exit 2) naming the flag;
 *   - kiln run's stats line says "prompt N tokens (M cached)" and --json has cached_tokens;
 *   - kiln bench --shared-prefix 64 --clients 2 --requests 4 prints the off and on rows, and a
 *     restart row with --cache-dir; --json gives each phase's numbers.
 * The prefix cache must hit: the "on" phase takes the whole 64-token prefix from RAM, the
 * "restart" phase from disk, a second kiln run with --cache-dir from disk.
 */
#include <jansson.h>

#include "cli_test_util.h"

static const char *g_model;

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* Run kiln; returns its exit code, *out its stdout and err its stderr. */
static int kiln_out(const char *const *args, char **out, char *err, size_t cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", g_tmpdir);
    int rc = run_kiln_to(args, path, err, cap);
    *out = read_file(path);
    remove(path);
    return rc;
}

static void test_help(void) {
    const char *cmds[] = {"run", "serve", "bench"};
    for (int i = 0; i < 3; i++) {
        const char *const args[] = {cmds[i], "--help", NULL};
        char *out, err[4096];
        int rc = kiln_out(args, &out, err, sizeof err);
        CHECKF(rc == 0, "kiln %s --help: exit %d", cmds[i], rc);
        const char *flags[] = {"--no-prefix-cache", "--cache-dir DIR", "--cache-disk-max SIZE"};
        for (int k = 0; k < 3; k++)
            CHECKF(strstr(out, flags[k]), "kiln %s --help does not list %s", cmds[i], flags[k]);
        if (!strcmp(cmds[i], "bench"))
            CHECKF(strstr(out, "--shared-prefix N") && strstr(out, "--clients C") &&
                       strstr(out, "--requests R"),
                   "kiln bench --help lacks the shared-prefix options");
        free(out);
    }
}

/* KV blocks of a bench pool of `size` (--kv-memory); -1 when the run fails. */
static int64_t pool_blocks(const char *size) {
    const char *const args[] = {
        "bench", "-m", g_model, "--concurrency", "1",  "--prompt-tokens", "8", "--gen-tokens",
        "2",     "-t", "1",     "--kv-memory",   size, "--json",          NULL};
    char *out, err[4096];
    int rc = kiln_out(args, &out, err, sizeof err);
    CHECKF(rc == 0, "bench --kv-memory %s: exit %d: %s", size, rc, err);
    json_t *j = rc == 0 ? json_loads(out, 0, NULL) : NULL;
    int64_t n = j ? json_integer_value(json_object_get(j, "kv_blocks_total")) : -1;
    json_decref(j);
    free(out);
    return n;
}

static void expect_usage(const char *what, const char *const *args, const char *mention) {
    char err[4096];
    int rc = run_kiln(args, err, sizeof err);
    CHECKF(rc == 2, "%s: exit %d, want 2 (usage); stderr: %s", what, rc, err);
    CHECKF(strstr(err, mention), "%s: the message does not mention '%s': %s", what, mention, err);
}

static void test_sizes(void) {
    int64_t a = pool_blocks("60K"), b = pool_blocks("61440"), c = pool_blocks("61.44KB");
    int64_t d = pool_blocks("80KiB"), e = pool_blocks("81920"), f = pool_blocks("0.078125m");
    CHECKF(a > 0 && a == b && b == c, "60K / 61440 / 61.44KB: %lld / %lld / %lld blocks",
           (long long)a, (long long)b, (long long)c);
    CHECKF(d == e && e == f && d > a, "80KiB / 81920 / 0.078125m: %lld / %lld / %lld blocks",
           (long long)d, (long long)e, (long long)f);
    const char *bad[] = {"",    "-1", "+5",  "0",   "1.5.5",        "12Q",
                         "1 G", "G",  ".5G", "1.G", "99999999999T", "9223372036854775808"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "--cache-disk-max '%s'", bad[i]);
        const char *const args[] = {"run",  "-m",          g_model,  "-p",
                                    "x",    "--cache-dir", g_tmpdir, "--cache-disk-max",
                                    bad[i], NULL};
        expect_usage(what, args, "--cache-disk-max");
        snprintf(what, sizeof what, "--kv-memory '%s'", bad[i]);
        const char *const kv[] = {"serve", "-m", g_model, "--kv-memory", bad[i], NULL};
        expect_usage(what, kv, "--kv-memory");
    }
    const char *const conflict[] = {"serve",       "-m",     g_model, "--no-prefix-cache",
                                    "--cache-dir", g_tmpdir, NULL};
    expect_usage("--cache-dir with --no-prefix-cache", conflict, "--no-prefix-cache");
    const char *const orphan[] = {"bench", "-m", g_model, "--cache-disk-max", "1G", NULL};
    expect_usage("--cache-disk-max without --cache-dir", orphan, "--cache-dir");
    const char *const empty_dir[] = {"run", "-m", g_model, "-p", "x", "--cache-dir", "", NULL};
    expect_usage("--cache-dir ''", empty_dir, "--cache-dir");
    const char *const clients[] = {"bench", "-m", g_model, "--clients", "2", NULL};
    expect_usage("--clients without --shared-prefix", clients, "--shared-prefix");
    const char *const mixed[] = {"bench",         "-m", g_model, "--shared-prefix", "64",
                                 "--concurrency", "2",  NULL};
    expect_usage("--shared-prefix with --concurrency", mixed, "--concurrency");
    const char *const off[] = {"bench", "-m", g_model, "--shared-prefix", "64", "--no-prefix-cache",
                               NULL};
    expect_usage("--shared-prefix with --no-prefix-cache", off, "--no-prefix-cache");
}

/* kiln run with --cache-dir, twice with the same prompt: the stats line and --json. */
static void test_run(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/run-cache", g_tmpdir);
    const char *prompt = "Once upon a time, there was a little girl named Lily. She loved to play "
                         "outside in the park with her friends.";
    long long cached[2] = {-1, -1}, n_prompt = -1;
    for (int k = 0; k < 2; k++) {
        const char *const args[] = {
            "run",    "-m", g_model, "-p", prompt,        "-n", "4",
            "--temp", "0",  "-t",    "1",  "--cache-dir", dir,  "--cache-disk-max",
            "64MiB",  NULL};
        char *out, err[4096];
        int rc = kiln_out(args, &out, err, sizeof err);
        CHECKF(rc == 0, "kiln run --cache-dir: exit %d: %s", rc, err);
        const char *p = strstr(err, "| prompt ");
        CHECKF(p && sscanf(p, "| prompt %lld tokens (%lld cached)", &n_prompt, &cached[k]) == 2,
               "kiln run's stats line lacks 'prompt N tokens (M cached)': %s", err);
        free(out);
    }
    CHECKF(cached[0] == 0, "the first run cached %lld tokens", cached[0]);
    CHECK(n_prompt > 16);
    CHECKF(cached[1] > 0 && cached[1] < n_prompt,
           "the second run with --cache-dir cached %lld of %lld tokens", cached[1], n_prompt);
    const char *const js[] = {"run",
                              "-m",
                              g_model,
                              "-p",
                              prompt,
                              "-n",
                              "4",
                              "--temp",
                              "0",
                              "-t",
                              "1",
                              "--json",
                              "--no-prefix-cache",
                              NULL};
    char *out, err[4096];
    int rc = kiln_out(js, &out, err, sizeof err);
    json_t *j = rc == 0 ? json_loads(out, 0, NULL) : NULL;
    CHECKF(j && json_is_integer(json_object_get(j, "cached_tokens")) &&
               json_integer_value(json_object_get(j, "cached_tokens")) == 0,
           "kiln run --json --no-prefix-cache: cached_tokens missing or not 0: %s", out);
    json_decref(j);
    free(out);
}

static json_t *phase(json_t *j, const char *name) {
    json_t *ph = json_object_get(j, "phases");
    for (size_t i = 0; i < json_array_size(ph); i++) {
        json_t *p = json_array_get(ph, i);
        if (!strcmp(json_string_value(json_object_get(p, "phase")) ?: "", name)) return p;
    }
    return NULL;
}

static double num(json_t *p, const char *k) {
    return json_number_value(json_object_get(p, k));
}

static void test_bench_shared_prefix(void) {
    /* The table: off and on rows, no restart row without --cache-dir. */
    const char *const table[] = {"bench", "-m",        g_model, "--shared-prefix",
                                 "64",    "--clients", "2",     "--requests",
                                 "4",     "-t",        "1",     NULL};
    char *out, err[8192];
    int rc = kiln_out(table, &out, err, sizeof err);
    CHECKF(rc == 0, "bench --shared-prefix: exit %d: %s", rc, err);
    CHECKF(strstr(out, "\noff ") && strstr(out, "\non "), "no off/on rows:\n%s", out);
    CHECKF(!strstr(out, "\nrestart "), "a restart row without --cache-dir:\n%s", out);
    CHECKF(strstr(out, "TTFT p50 ms") && strstr(out, "cached/req") && strstr(out, "disk MB/s"),
           "the table lacks its columns:\n%s", out);
    free(out);

    /* With --cache-dir: the restart row too. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/bench-cache", g_tmpdir);
    const char *const rs[] = {
        "bench", "-m", g_model, "--shared-prefix", "64", "--clients", "2", "--requests",
        "4",     "-t", "1",     "--cache-dir",     dir,  NULL};
    rc = kiln_out(rs, &out, err, sizeof err);
    CHECKF(rc == 0, "bench --shared-prefix --cache-dir: exit %d: %s", rc, err);
    CHECKF(strstr(out, "\noff ") && strstr(out, "\non ") && strstr(out, "\nrestart "),
           "no off/on/restart rows:\n%s", out);
    free(out);

    /* --json: the numbers. */
    const char *const js[] = {
        "bench", "-m", g_model, "--shared-prefix", "64", "--clients", "2", "--requests",
        "4",     "-t", "1",     "--cache-dir",     dir,  "--json",    NULL};
    rc = kiln_out(js, &out, err, sizeof err);
    CHECKF(rc == 0, "bench --shared-prefix --json: exit %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    CHECKF(j, "bench --shared-prefix --json: not JSON: %s", out);
    free(out);
    if (!j) return;
    CHECK(json_integer_value(json_object_get(j, "prefix_tokens")) == 64);
    CHECK(json_integer_value(json_object_get(j, "clients")) == 2);
    json_t *off = phase(j, "off"), *on = phase(j, "on"), *re = phase(j, "restart");
    REQUIRE(off && on && re);
    int64_t per_req = 64 + json_integer_value(json_object_get(j, "suffix_tokens"));
    int64_t gen = json_integer_value(json_object_get(j, "gen_tokens"));
    json_t *rows[] = {off, on, re};
    for (int i = 0; i < 3; i++) {
        json_t *p = rows[i];
        int64_t n = json_integer_value(json_object_get(p, "requests"));
        CHECK(n == (i < 2 ? 4 : 1));
        CHECK(num(p, "ttft_ms_p50") > 0 && num(p, "ttft_ms_p50") <= num(p, "ttft_ms_p99"));
        CHECK(num(p, "total_tok_s") > num(p, "gen_tok_s") && num(p, "gen_tok_s") > 0);
        CHECK(json_integer_value(json_object_get(p, "prompt_tokens")) == n * per_req);
        CHECK(json_integer_value(json_object_get(p, "gen_tokens")) == n * gen);
        CHECK(num(p, "cached_tokens_per_request") >= 0 &&
              num(p, "cached_tokens_per_request") <= 64);
    }
    CHECKF(num(off, "cached_tokens_per_request") == 0 &&
               json_integer_value(json_object_get(off, "prefix_hit_requests")) == 0,
           "the off phase hit the cache");
    /* Every measured request of "on" takes the whole prefix (4 blocks of 16) from RAM. */
    {
        CHECKF(num(on, "cached_tokens_per_request") == 64, "on: %.1f cached tokens per request",
               num(on, "cached_tokens_per_request"));
        CHECK(json_integer_value(json_object_get(on, "prefix_hit_requests")) == 4);
    }
    /* The restart's request reads the prefix's blocks from disk. */
    {
        CHECKF(num(re, "cached_tokens_per_request") == 64, "restart: %.1f cached tokens",
               num(re, "cached_tokens_per_request"));
        CHECK(json_integer_value(json_object_get(re, "disk_reads")) >= 4);
        CHECK(json_integer_value(json_object_get(re, "disk_read_bytes")) > 0 &&
              num(re, "disk_read_mb_s") > 0);
        CHECK(json_integer_value(json_object_get(re, "disk_files_at_start")) >= 4);
    }
    json_decref(j);
}

/* rm -r of what the test made under g_tmpdir (one level of directories). */
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
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kiln-cli-prefix-XXXXXX");
    REQUIRE(mkdtemp(g_tmpdir));
    test_help();
    test_sizes();
    test_run();
    test_bench_shared_prefix();
    cleanup(g_tmpdir);
    return kiln_test_finish("test_cli_prefix_cache");
}
