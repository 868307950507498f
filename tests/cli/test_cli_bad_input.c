/*
 * Acceptance 5: bad input through the `kiln` binary gives a clear message, exit code 1 and
 * no sanitizer report (this test runs in the ASan+UBSan build too, where kiln is
 * instrumented). Cases: a GGUF truncated at 20 cut points; bit flips in the header, counts,
 * string lengths and type tags; a tensor offset beyond the end of the file; an unknown
 * dtype; a llama2.c checkpoint without its tokenizer; a prompt that is not valid UTF-8;
 * a NaN weight (the run must fail, not sample from NaN logits).
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

#include <math.h>

#include "cli_test_util.h"
#include "format/gguf.h"

static bool sanitizer_report(const char *err) {
    return strstr(err, "Sanitizer") || strstr(err, "runtime error:");
}

/* Expect exit 1 with "kiln: error:" and `must_mention` (if non-NULL) in stderr. */
static void expect_error(const char *what, const char *const *args, const char *must_mention) {
    char err[8192];
    int rc = run_kiln(args, err, sizeof err);
    CHECKF(rc == 1, "%s: exit code %d, want 1; stderr: %s", what, rc, err);
    CHECKF(strstr(err, "kiln: error:") != NULL, "%s: no error message; stderr: %s", what, err);
    CHECKF(!sanitizer_report(err), "%s: sanitizer report: %s", what, err);
    if (must_mention)
        CHECKF(strstr(err, must_mention) != NULL, "%s: message does not mention '%s': %s", what,
               must_mention, err);
}

/* For inputs that might still be valid (a flipped bit in a harmless place): exit 0 or 1,
 * never a crash or sanitizer report, and an error message whenever it fails. */
static void expect_clean(const char *what, const char *const *args) {
    char err[8192];
    int rc = run_kiln(args, err, sizeof err);
    CHECKF(rc == 0 || rc == 1, "%s: exit code %d; stderr: %s", what, rc, err);
    CHECKF(!sanitizer_report(err), "%s: sanitizer report: %s", what, err);
    if (rc == 1) CHECKF(strstr(err, "kiln: error:") != NULL, "%s: no message: %s", what, err);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz);
    REQUIRE(b && fread(b, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void write_all(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* Offset of the GGUF (v2/v3) tensor-info record for `name`: the u64 length + name bytes. */
static size_t find_tensor_info(const uint8_t *b, size_t n, const char *name) {
    size_t len = strlen(name), found = 0;
    for (size_t i = 8; i + len <= n && i < n; i++) {
        uint64_t l;
        memcpy(&l, b + i - 8, 8);
        if (l == len && !memcmp(b + i, name, len)) found = i - 8; /* keep the last match */
    }
    return found;
}

int main(void) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    kiln_test_require_file(g_kiln);
    const char *gguf = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    const char *ckpt = kiln_test_shared("models/stories260K/stories260K.bin");
    kiln_test_require_file(gguf);
    kiln_test_require_file(ckpt);
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kiln-cli-bad-XXXXXX");
    REQUIRE(mkdtemp(g_tmpdir));
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.gguf", g_tmpdir);
    size_t n;
    uint8_t *orig = read_all(gguf, &n);
    const char *const run_args[] = {"run", "-m", bad, "-p", "Once", "-n", "2", "--temp", "0", NULL};

    /* 1. truncation at 20 cut points: inside the header, the metadata, the tensor infos and
     * the data section. */
    size_t cuts[20] = {0, 3, 4, 7, 8, 15, 16, 23, 24, 40, 100, 1000, 5000};
    for (int i = 13; i < 20; i++) cuts[i] = n / 20 * (size_t)(i - 12) * 2 + 1;
    cuts[19] = n - 1;
    for (int i = 0; i < 20; i++) {
        REQUIRE(cuts[i] < n);
        write_all(bad, orig, cuts[i]);
        char what[64];
        snprintf(what, sizeof what, "truncated at %zu of %zu bytes", cuts[i], n);
        expect_error(what, run_args, "bad.gguf");
    }

    /* 2. bit flips in the version, counts, first key's length and first value's type tag:
     * each must be rejected. */
    const struct {
        size_t off;
        uint8_t mask;
        const char *what;
    } flips[] = {
        {0, 0x01, "magic"},
        {4, 0x40, "version"},
        {8 + 6, 0x10, "n_tensors high"},
        {16 + 5, 0x01, "n_kv high"},
        {24 + 7, 0x80, "first key length"},
    };
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        b[flips[i].off] ^= flips[i].mask;
        write_all(bad, b, n);
        expect_error(flips[i].what, run_args, NULL);
        free(b);
    }
    /* ...and single-bit flips swept over the first 4 KiB (metadata, tensor infos): never a
     * crash; an error message whenever kiln refuses. */
    for (size_t off = 0; off < 4096 && off < n; off += 37) {
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        b[off] ^= (uint8_t)(1u << (off % 8));
        write_all(bad, b, n);
        char what[64];
        snprintf(what, sizeof what, "bit flip at byte %zu", off);
        expect_clean(what, run_args);
        free(b);
    }

    /* 3. a tensor offset beyond the end of the file, 4. an unknown dtype. */
    size_t ti = find_tensor_info(orig, n, "output_norm.weight");
    REQUIRE(ti > 0);
    size_t p = ti + 8 + strlen("output_norm.weight");
    uint32_t n_dims;
    memcpy(&n_dims, orig + p, 4);
    REQUIRE(n_dims >= 1 && n_dims <= 4);
    size_t type_off = p + 4 + 8 * (size_t)n_dims, offset_off = type_off + 4;
    {
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        uint64_t far = (uint64_t)n * 4;
        memcpy(b + offset_off, &far, 8);
        write_all(bad, b, n);
        expect_error("tensor offset beyond EOF", run_args, "output_norm.weight");
        uint32_t dtype = 99;
        memcpy(b, orig, n);
        memcpy(b + type_off, &dtype, 4);
        write_all(bad, b, n);
        expect_error("unknown dtype 99", run_args, "output_norm.weight");
        free(b);
    }

    /* 5. a llama2.c checkpoint alone in a directory: no tokenizer. */
    {
        size_t cn;
        uint8_t *c = read_all(ckpt, &cn);
        char lone[512];
        snprintf(lone, sizeof lone, "%s/model.bin", g_tmpdir);
        write_all(lone, c, cn);
        free(c);
        const char *const args[] = {"run", "-m", lone, "-p", "Once", NULL};
        expect_error("missing tokenizer", args, "tokenizer");
        remove(lone);
    }

    /* 6. a prompt that is not valid UTF-8. */
    {
        const char *const args[] = {"run", "-m", gguf, "-p", "Once \xff\xfe upon", NULL};
        expect_error("invalid UTF-8 prompt", args, "UTF-8");
        const char *const args2[] = {"tokenize", "-m", gguf, "\xc3\x28", NULL};
        expect_error("invalid UTF-8 to tokenize", args2, "UTF-8");
    }

    /* 7. NaN weights: generation stops with an error instead of sampling from NaN logits. */
    {
        kiln_gguf *g = NULL;
        kiln_error e = {0};
        REQUIRE(kiln_gguf_open(gguf, &g, &e) == KILN_OK);
        const kiln_gguf_tensor *t = kiln_gguf_find_tensor(g, "output_norm.weight");
        REQUIRE(t && t->dtype == KILN_DTYPE_F32);
        size_t off = (size_t)((const uint8_t *)t->data - (const uint8_t *)g->base);
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        float nan = NAN;
        memcpy(b + off, &nan, sizeof nan);
        write_all(bad, b, n);
        expect_error("NaN weight", run_args, "NaN");
        free(b);
        kiln_gguf_close(g);
    }

    /* 8. paths that are not models: a device, a directory without config.json, a
     * config.json that is malformed JSON (its position named), a config.json that is a
     * directory. */
    {
        const char *const dev[] = {"run", "-m", "/dev/null", "-p", "Once", NULL};
        expect_error("a device as the model", dev, "not a regular file");
        const char *const dir[] = {"run", "-m", g_tmpdir, "-p", "Once", NULL};
        expect_error("a directory without config.json", dir, "without config.json");
        char cfg[600];
        snprintf(cfg, sizeof cfg, "%s/config.json", g_tmpdir);
        write_all(cfg, (const uint8_t *)"{\"a\":\n  [1,", 11);
        expect_error("malformed config.json", dir, "config.json: line 2, column");
        remove(cfg);
        REQUIRE(mkdir(cfg, 0700) == 0);
        expect_error("config.json is a directory", dir, "without config.json");
        rmdir(cfg);
    }

    /* 8b. a lone .safetensors file as the model, inspect on a device, convert on a file. */
    {
        const char *st = kiln_test_shared("reference/hf/llama/model.safetensors");
        if (access(st, R_OK) == 0) {
            const char *const args[] = {"run", "-m", st, "-p", "Once", NULL};
            expect_error("a .safetensors file as the model", args, "model directory");
        }
        const char *const ins[] = {"inspect", "/dev/null", NULL};
        expect_error("inspect a device", ins, "not a regular file");
        char out[600];
        snprintf(out, sizeof out, "%s/out.gguf", g_tmpdir);
        const char *const conv[] = {"convert", gguf, out, NULL};
        expect_error("convert a file", conv, "not a directory");
        CHECKF(access(out, F_OK) != 0, "convert left %s behind", out);
    }

    /* 8c. metadata declaring fewer layers than the file holds (llama.block_count - 1): the
     * tensors of the last layer would be ignored; the load refuses it. The value is the
     * uint32 after the key string and its type tag (GGUF spec). */
    {
        static const char key[] = "llama.block_count";
        size_t kpos = 0;
        for (size_t i = 0; i + sizeof key - 1 <= n; i++)
            if (memcmp(orig + i, key, sizeof key - 1) == 0) {
                kpos = i;
                break;
            }
        REQUIRE(kpos > 0);
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        size_t vpos = kpos + sizeof key - 1;
        uint32_t type, layers;
        memcpy(&type, b + vpos, 4);
        memcpy(&layers, b + vpos + 4, 4);
        REQUIRE(type == 4 && layers >= 2); /* GGUF_TYPE_UINT32 */
        layers--;
        memcpy(b + vpos + 4, &layers, 4);
        write_all(bad, b, n);
        expect_error("block_count one short", run_args, "declares");
        free(b);
    }

    /* 8d. a quantization type none of the matrices can take (q6_k blocks hold 256 elements,
     * stories260K's rows 64 or 172): an error, and no output file. */
    {
        char out[600];
        snprintf(out, sizeof out, "%s/q6.gguf", g_tmpdir);
        const char *const args[] = {"quantize", gguf, out, "--type", "q6_k", NULL};
        expect_error("q6_k on 64-wide rows", args, "no weight matrix");
        CHECKF(access(out, F_OK) != 0, "quantize left %s behind", out);
        /* a file that happens to be named OUT.tmp is not the writer's to overwrite */
        char keep[640];
        snprintf(keep, sizeof keep, "%s.tmp", out);
        write_all(keep, (const uint8_t *)"keep", 4);
        const char *const ok[] = {"quantize", gguf, out, "--type", "q8_0", NULL};
        char err[8192];
        CHECKF(run_kiln(ok, err, sizeof err) == 0, "quantize q8_0: %s", err);
        size_t kn = 0;
        uint8_t *kb = read_all(keep, &kn);
        CHECKF(kb && kn == 4 && memcmp(kb, "keep", 4) == 0, "quantize overwrote %s", keep);
        free(kb);
        remove(keep);
        remove(out);
    }

    /* 8e. outputs that would overwrite an input are usage errors, and the input survives:
     * logits -o onto the model, convert onto the checkpoint's own safetensors file. */
    {
        char copy[600], err[8192];
        snprintf(copy, sizeof copy, "%s/copy.gguf", g_tmpdir);
        write_all(copy, orig, n);
        const char *const lg[] = {"logits", "-m", copy, "--ids", "1,2", "-o", copy, NULL};
        CHECKF(run_kiln(lg, err, sizeof err) == 2, "logits -o MODEL: %s", err);
        size_t cn = 0;
        uint8_t *cb = read_all(copy, &cn);
        CHECK(cb && cn == n && memcmp(cb, orig, n) == 0);
        free(cb);
        remove(copy);
        const char *hfst = kiln_test_shared("reference/hf/llama/model.safetensors");
        const char *hfcfg = kiln_test_shared("reference/hf/llama/config.json");
        if (access(hfst, R_OK) == 0 && access(hfcfg, R_OK) == 0) {
            /* a copy of the checkpoint (never the shared reference itself) */
            char hd[600], hs[700], hc[700];
            snprintf(hd, sizeof hd, "%s/hf", g_tmpdir);
            snprintf(hs, sizeof hs, "%s/model.safetensors", hd);
            snprintf(hc, sizeof hc, "%s/config.json", hd);
            REQUIRE(mkdir(hd, 0700) == 0);
            size_t sn = 0, fn = 0;
            uint8_t *sb = read_all(hfst, &sn), *fb = read_all(hfcfg, &fn);
            REQUIRE(sb && fb);
            write_all(hs, sb, sn);
            write_all(hc, fb, fn);
            const char *const cv[] = {"convert", hd, hs, NULL};
            CHECKF(run_kiln(cv, err, sizeof err) == 2, "convert onto its input: %s", err);
            CHECKF(strstr(err, "input files") != NULL, "convert onto its input: %s", err);
            size_t after = 0;
            uint8_t *ab = read_all(hs, &after);
            CHECK(ab && after == sn && memcmp(ab, sb, sn) == 0);
            free(ab), free(sb), free(fb);
            remove(hs), remove(hc), rmdir(hd);
        }
    }

    /* 9. --ctx beyond the model's training context (512) runs, with a warning. */
    {
        const char *const args[] = {"run", "-m", gguf,    "-p",  "Once",
                                    "-n",  "2",  "--ctx", "600", NULL};
        char err[8192];
        CHECKF(run_kiln(args, err, sizeof err) == 0, "--ctx 600: %s", err);
        CHECKF(strstr(err, "exceeds the model's training context of 512") != NULL,
               "--ctx 600 gives no warning: %s", err);
    }

    /* The intact file still works (so the failures above are about the damage). */
    {
        const char *const ok_args[] = {"run", "-m", gguf,     "-p", "Once",
                                       "-n",  "2",  "--temp", "0",  NULL};
        char err[8192];
        CHECKF(run_kiln(ok_args, err, sizeof err) == 0, "intact model fails: %s", err);
    }
    free(orig);
    remove(bad);
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", g_tmpdir);
    remove(errpath);
    rmdir(g_tmpdir);
    return kiln_test_finish("test_cli_bad_input");
}
