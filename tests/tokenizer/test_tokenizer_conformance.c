/*
 * test_tokenizer_conformance <vocab> - llama.cpp's tokenizer conformance suite
 * (test-tokenizer-0): ../shared/tokenizer/ggml-vocab-<vocab>.gguf with its .gguf.inp (test
 * strings, each followed by a line "__ggml_vocab_test__") and .gguf.out (one line of
 * space-separated ids per string). Every string must tokenize to exactly the expected ids
 * with add_special = false and parse_special = false.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/vec.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL);
    REQUIRE(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    REQUIRE(n >= 0);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    REQUIRE(b != NULL);
    REQUIRE(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", ids[i]);
    if (n > 64) fprintf(stderr, " ... (%zu ids)", n);
    fputc('\n', stderr);
}

/*
 * A vocab shipped without reference ids (baichuan, gpt-neox): it must load, and a few
 * strings must encode to in-range ids that decode back to the input. This is a smoke test,
 * not conformance; it says so.
 */
static int load_only(const char *name, const char *path) {
    printf("%s: no .inp/.out reference ids; checking loading and round trip only\n", name);
    kiln_error err = {0};
    kiln_gguf *g = NULL;
    REQUIRE(kiln_gguf_open(path, &g, &err) == KILN_OK);
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokenizer_from_gguf(g, &tok, &err);
    CHECKF(st == KILN_OK, "tokenizer for %s: %s (%s)", name, kiln_status_name(st), err.message);
    static const char *const texts[] = {"Hello world",
                                        " Hello World!",
                                        "3.14159 is pi",
                                        "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96"
                                        "\xE7\x95\x8C",
                                        "tab\tand\nnewline",
                                        "caf\xC3\xA9 \xF0\x9F\x98\x80"};
    kiln_ivec ids = {0};
    for (size_t i = 0; tok && i < sizeof texts / sizeof texts[0]; i++) {
        size_t len = strlen(texts[i]);
        ids.n = 0;
        st = kiln_tokenizer_encode(tok, texts[i], len, false, false, &ids, &err);
        CHECKF(st == KILN_OK, "%s: encode \"%s\": %s", name, texts[i], err.message);
        CHECK(ids.n > 0);
        kiln_detok *d = NULL;
        REQUIRE(kiln_detok_create(tok, &d, &err) == KILN_OK);
        char out[256];
        size_t on = 0;
        const char *s;
        size_t sl;
        for (size_t k = 0; k < ids.n; k++) {
            CHECK(ids.data[k] >= 0 && ids.data[k] < kiln_tokenizer_n_vocab(tok));
            REQUIRE(kiln_detok_push(d, ids.data[k], &s, &sl, &err) == KILN_OK);
            REQUIRE(on + sl < sizeof out);
            memcpy(out + on, s, sl);
            on += sl;
        }
        REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
        REQUIRE(on + sl < sizeof out);
        memcpy(out + on, s, sl);
        on += sl;
        CHECKF(on == len && memcmp(out, texts[i], len) == 0, "%s: \"%s\" decoded as \"%.*s\"", name,
               texts[i], (int)on, out);
        kiln_detok_destroy(d);
    }
    kiln_ivec_free(&ids);
    kiln_tokenizer_destroy(tok);
    kiln_gguf_close(g);
    return kiln_test_finish(name);
}

int main(int argc, char **argv) {
    REQUIRE(argc == 2);
    const char *name = argv[1];
    char rel[256], path[4096], inp_path[4200], out_path[4200];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    snprintf(path, sizeof path, "%s", kiln_test_shared(rel));
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);
    kiln_test_require_file(path);
    if (access(inp_path, R_OK) != 0 || access(out_path, R_OK) != 0) return load_only(name, path);
    kiln_test_require_file(inp_path);
    kiln_test_require_file(out_path);

    size_t inp_len, out_len;
    char *inp = slurp(inp_path, &inp_len);
    char *outs = slurp(out_path, &out_len);

    kiln_error err = {0};
    kiln_gguf *g = NULL;
    kiln_status st = kiln_gguf_open(path, &g, &err);
    CHECKF(st == KILN_OK, "open %s: %s", path, err.message);
    if (st != KILN_OK) return kiln_test_finish(name);
    kiln_tokenizer *tok = NULL;
    st = kiln_tokenizer_from_gguf(g, &tok, &err);
    CHECKF(st == KILN_OK, "tokenizer for %s: %s (%s)", name, kiln_status_name(st), err.message);
    if (st != KILN_OK) {
        kiln_gguf_close(g);
        free(inp);
        free(outs);
        return kiln_test_finish(name);
    }

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    size_t ip = 0, op = 0;
    int n_cases = 0, n_pass = 0;
    kiln_ivec ids = {0}, want = {0};
    while (ip < inp_len) {
        const char *m = memmem(inp + ip, inp_len - ip, sep, sep_len);
        REQUIRE(m != NULL); /* every string is followed by a separator line */
        size_t slen = (size_t)(m - (inp + ip));
        const char *s = inp + ip;
        ip += slen + sep_len;

        REQUIRE(op < out_len);
        const char *nl = memchr(outs + op, '\n', out_len - op);
        size_t llen = nl ? (size_t)(nl - (outs + op)) : out_len - op;
        want.n = 0;
        for (size_t k = op; k < op + llen;) {
            char *end;
            long x = strtol(outs + k, &end, 10);
            if (end == outs + k) {
                k++;
                continue;
            }
            REQUIRE(kiln_ivec_push(&want, (int32_t)x) == KILN_OK);
            k = (size_t)(end - outs);
        }
        op += llen + 1;

        n_cases++;
        ids.n = 0;
        st = kiln_tokenizer_encode(tok, s, slen, false, false, &ids, &err);
        bool ok = st == KILN_OK && ids.n == want.n &&
                  (ids.n == 0 || memcmp(ids.data, want.data, ids.n * sizeof(int32_t)) == 0);
        if (ok) {
            n_pass++;
        } else {
            fprintf(stderr, "%s: case %d (%zu bytes) \"%.*s\" mismatch (%s%s%s)\n", name, n_cases,
                    slen, (int)(slen > 80 ? 80 : slen), s, kiln_status_name(st), st ? ": " : "",
                    st ? err.message : "");
            print_ids("expected", want.data, want.n);
            print_ids("got     ", ids.data, ids.n);
        }
        CHECK(ok);
    }
    CHECKF(n_cases > 0, "no test strings in %s", inp_path);
    printf("%s: %d/%d strings match\n", name, n_pass, n_cases);
    kiln_ivec_free(&ids);
    kiln_ivec_free(&want);
    kiln_tokenizer_destroy(tok);
    kiln_gguf_close(g);
    free(inp);
    free(outs);
    return kiln_test_finish(name);
}
