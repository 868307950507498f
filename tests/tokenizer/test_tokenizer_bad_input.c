/*
 * test_tokenizer_bad_input - the tokenizer's error paths and edge cases:
 *   - input that is not UTF-8 (RFC 3629: stray continuation, overlong, surrogate, > U+10FFFF,
 *     truncated) is KILN_ERR_INVALID_ARGUMENT naming the byte offset, output untouched;
 *   - empty input (add_special gives only the special tokens, as llama.cpp / run.c do);
 *   - large input encodes and, for SPM, decodes back;
 *   - special-token partitioning: CONTROL texts only with parse_special, USER_DEFINED always,
 *     phi-3's right-strip;
 *   - malformed tokenizer metadata in a GGUF built here: missing keys, unknown model,
 *     length mismatch, bad ids.
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

static void bad_utf8(const kiln_tokenizer *t, const char *name) {
    static const struct {
        const char *s;
        size_t len, off;
    } cases[] = {
        {"ab\xFF"
         "cd",
         5, 2},
        {"\x80", 1, 0},
        {"ok \xC0\xAF", 5, 3},
        {"\xED\xA0\x80", 3, 0}, /* surrogate */
        {"x\xF4\x90\x80\x80", 5, 1},
        {"abc\xE2\x82", 5, 3}, /* > U+10FFFF, truncated */
        {"\xE2\x82\xAC\xE2\x28\xA1", 6, 3},
    };
    kiln_ivec ids = {0};
    REQUIRE(kiln_ivec_push(&ids, 12345) == KILN_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_error err = {0};
        kiln_status st = kiln_tokenizer_encode(t, cases[i].s, cases[i].len, true, true, &ids, &err);
        CHECKF(st == KILN_ERR_INVALID_ARGUMENT, "%s case %zu: %s", name, i, kiln_status_name(st));
        char want[64];
        snprintf(want, sizeof want, "offset %zu", cases[i].off);
        CHECKF(strstr(err.message, want) != NULL, "%s case %zu: message \"%s\" lacks \"%s\"", name,
               i, err.message, want);
        CHECK(ids.n == 1 && ids.data[0] == 12345);
    }
    kiln_error err = {0};
    CHECK(kiln_tokenizer_encode(t, NULL, 3, false, false, &ids, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_tokenizer_encode(t, NULL, 0, false, false, &ids, &err) == KILN_OK);
    CHECK(ids.n == 1);
    kiln_ivec_free(&ids);
}

static kiln_tokenizer *open_vocab(const char *name, kiln_gguf **g) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    const char *path = kiln_test_shared(rel);
    if (access(path, R_OK) != 0) {
        printf("note: %s missing, skipping its checks\n", path);
        return NULL;
    }
    kiln_error err = {0};
    REQUIRE(kiln_gguf_open(path, g, &err) == KILN_OK);
    kiln_tokenizer *t = NULL;
    kiln_status st = kiln_tokenizer_from_gguf(*g, &t, &err);
    CHECKF(st == KILN_OK, "%s: %s", name, err.message);
    return t;
}

static bool ids_are(const kiln_ivec *v, const int32_t *w, size_t n) {
    return v->n == n && (n == 0 || memcmp(v->data, w, n * sizeof *w) == 0);
}

static void encode_ok(const kiln_tokenizer *t, const char *s, bool add, bool parse, kiln_ivec *o) {
    kiln_error err = {0};
    o->n = 0;
    kiln_status st = kiln_tokenizer_encode(t, s, strlen(s), add, parse, o, &err);
    CHECKF(st == KILN_OK, "encode \"%s\": %s", s, err.message);
}

static void spm_cases(void) {
    kiln_gguf *g = NULL;
    kiln_tokenizer *t = open_vocab("llama-spm", &g);
    if (!t) return;
    bad_utf8(t, "llama-spm");
    kiln_ivec ids = {0};
    kiln_error err = {0};
    /* llama.cpp: encode('') is [] without specials and [BOS] with them */
    encode_ok(t, "", false, false, &ids);
    CHECK(ids.n == 0);
    encode_ok(t, "", true, false, &ids);
    CHECK(ids.n == 1 && ids.data[0] == 1);
    CHECK(kiln_tokenizer_bos(t) == 1 && kiln_tokenizer_eos(t) == 2);
    CHECK(kiln_tokenizer_is_eog(t, 2) && !kiln_tokenizer_is_eog(t, 1));

    /* control texts: literal text unless parse_special */
    encode_ok(t, "</s>", false, true, &ids);
    CHECK(ids.n == 1 && ids.data[0] == 2);
    encode_ok(t, "</s>", false, false, &ids);
    CHECK(ids.n > 1);

    /* large input: 2 MiB of mixed text, then decode back */
    const char *unit = "The quick brown fox \xE2\x80\x94 jumps over 13 lazy dogs! \xF0\x9F\x90\xB6 "
                       "\xE4\xB8\xAD\xE6\x96\x87\n\t";
    size_t ul = strlen(unit), n = (2u << 20) / ul, len = n * ul;
    char *big = malloc(len);
    REQUIRE(big != NULL);
    for (size_t i = 0; i < n; i++) memcpy(big + i * ul, unit, ul);
    ids.n = 0;
    REQUIRE(kiln_tokenizer_encode(t, big, len, true, false, &ids, &err) == KILN_OK);
    CHECK(ids.n > len / 16);
    kiln_detok *d = NULL;
    REQUIRE(kiln_detok_create(t, &d, &err) == KILN_OK);
    size_t pos = 0;
    bool same = true;
    const char *s;
    size_t sl;
    for (size_t i = 0; i < ids.n && same; i++) {
        REQUIRE(kiln_detok_push(d, ids.data[i], &s, &sl, &err) == KILN_OK);
        same = pos + sl <= len && memcmp(big + pos, s, sl) == 0;
        pos += sl;
    }
    REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
    CHECK(same && sl == 0 && pos == len);
    kiln_detok_destroy(d);

    /* one long run with no merges at all */
    memset(big, 'x', len);
    ids.n = 0;
    REQUIRE(kiln_tokenizer_encode(t, big, len, false, false, &ids, &err) == KILN_OK);
    CHECK(ids.n > 0);
    free(big);
    kiln_ivec_free(&ids);
    kiln_tokenizer_destroy(t);
    kiln_gguf_close(g);
}

static void phi3_cases(void) {
    kiln_gguf *g = NULL;
    kiln_tokenizer *t = open_vocab("phi-3", &g);
    if (!t) return;
    kiln_ivec ids = {0}, a = {0}, b = {0};
    /* <|user|> (32010) and <|end|> (32007) are CONTROL, with right-strip for phi-3 */
    encode_ok(t, "<|user|>\nHi<|end|>\n", false, true, &ids);
    encode_ok(t, "Hi", false, false, &a);
    REQUIRE(a.n > 0);
    CHECK(ids.n == a.n + 2 && ids.data[0] == 32010 && ids.data[ids.n - 1] == 32007 &&
          !memcmp(ids.data + 1, a.data, a.n * sizeof(int32_t)));
    encode_ok(t, "<|user|>", false, false, &ids);
    CHECK(ids.n > 1); /* literal text without parse_special */
    /* </s> is USER_DEFINED: split out even without parse_special, spaces after it eaten */
    encode_ok(t, "a </s>   b", false, false, &ids);
    encode_ok(t, "a ", false, false, &a);
    encode_ok(t, "b", false, false, &b); /* a fragment after a token gets the space prefix */
    CHECK(ids.n == a.n + 1 + b.n && ids.data[a.n] == 2 &&
          !memcmp(ids.data, a.data, a.n * sizeof(int32_t)) &&
          !memcmp(ids.data + a.n + 1, b.data, b.n * sizeof(int32_t)));
    CHECK(kiln_tokenizer_is_eog(t, 32000) && kiln_tokenizer_is_eog(t, 32007));
    kiln_ivec_free(&ids);
    kiln_ivec_free(&a);
    kiln_ivec_free(&b);
    kiln_tokenizer_destroy(t);
    kiln_gguf_close(g);
}

static void wpm_cases(void) {
    kiln_gguf *g = NULL;
    kiln_tokenizer *t = open_vocab("bert-bge", &g);
    if (!t) return;
    bad_utf8(t, "bert-bge");
    kiln_ivec ids = {0};
    encode_ok(t, "", true, false, &ids);
    int32_t cls_sep[] = {101, 102};
    CHECK(ids_are(&ids, cls_sep, 2));
    encode_ok(t, "hello", true, false, &ids);
    CHECK(ids.n == 3 && ids.data[0] == 101 && ids.data[2] == 102);
    encode_ok(t, "[MASK]", false, true, &ids);
    CHECK(ids.n == 1 && ids.data[0] == 103);
    kiln_ivec_free(&ids);
    kiln_tokenizer_destroy(t);
    kiln_gguf_close(g);
}

static void llama2c_cases(void) {
    const char *path = kiln_test_shared("models/stories260K/tok512.bin");
    if (access(path, R_OK) != 0) return;
    kiln_error err = {0};
    kiln_tokenizer *t = NULL;
    CHECK(kiln_tokenizer_from_llama2c(path, 0, &t, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_tokenizer_from_llama2c(path, 100000, &t, &err) == KILN_ERR_FORMAT);
    CHECK(kiln_tokenizer_from_llama2c("/nonexistent/tok.bin", 512, &t, &err) == KILN_ERR_IO);
    REQUIRE(kiln_tokenizer_from_llama2c(path, 512, &t, &err) == KILN_OK);
    bad_utf8(t, "tok512");
    kiln_ivec ids = {0};
    encode_ok(t, "", true, false, &ids);
    CHECK(ids.n == 1 && ids.data[0] == 1); /* run.c: no dummy prefix for empty text */
    encode_ok(t, "", false, false, &ids);
    CHECK(ids.n == 0);
    kiln_ivec_free(&ids);
    kiln_tokenizer_destroy(t);

    /* tok105 has no byte tokens: byte+3 where that id exists, unk (0) where it does not */
    const char *p105 = kiln_test_shared("models/babyllama-tok105/tok105.bin");
    if (access(p105, R_OK) != 0) return;
    REQUIRE(kiln_tokenizer_from_llama2c(p105, 105, &t, &err) == KILN_OK);
    encode_ok(t, "\xF0\x9F\x90\xB6", false, false, &ids);
    for (size_t i = 0; i < ids.n; i++) CHECK(ids.data[i] >= 0 && ids.data[i] < 105);
    kiln_ivec_free(&ids);
    kiln_tokenizer_destroy(t);
}

/* ---- a tiny GGUF v3 writer for malformed metadata ---- */
typedef struct wbuf {
    unsigned char *b;
    size_t n, cap;
} wbuf;

static void w(wbuf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 64;
        o->b = realloc(o->b, o->cap);
        REQUIRE(o->b != NULL);
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void w32(wbuf *o, uint32_t x) {
    w(o, &x, 4);
}
static void w64(wbuf *o, uint64_t x) {
    w(o, &x, 8);
}
static void wstr(wbuf *o, const char *s) {
    w64(o, strlen(s));
    w(o, s, strlen(s));
}
static void kv_str(wbuf *o, const char *k, const char *v) {
    wstr(o, k);
    w32(o, KILN_GGUF_STRING);
    wstr(o, v);
}
static void kv_u32(wbuf *o, const char *k, uint32_t v) {
    wstr(o, k);
    w32(o, KILN_GGUF_UINT32);
    w32(o, v);
}
static void kv_tokens(wbuf *o, const char *const *t, size_t n) {
    wstr(o, "tokenizer.ggml.tokens");
    w32(o, KILN_GGUF_ARRAY);
    w32(o, KILN_GGUF_STRING);
    w64(o, n);
    for (size_t i = 0; i < n; i++) wstr(o, t[i]);
}
static void kv_scores(wbuf *o, size_t n) {
    wstr(o, "tokenizer.ggml.scores");
    w32(o, KILN_GGUF_ARRAY);
    w32(o, KILN_GGUF_FLOAT32);
    w64(o, n);
    for (size_t i = 0; i < n; i++) {
        float f = -(float)i;
        w(o, &f, 4);
    }
}

/* tokenizer.ggml.token_type: every token normal (1) but `byte_id`, type byte (6) */
static void kv_types(wbuf *o, size_t n, size_t byte_id) {
    wstr(o, "tokenizer.ggml.token_type");
    w32(o, KILN_GGUF_ARRAY);
    w32(o, KILN_GGUF_INT32);
    w64(o, n);
    for (size_t i = 0; i < n; i++) w32(o, i == byte_id ? 6u : 1u);
}

enum { M_NONE, M_T5, M_SCORES_SHORT, M_BAD_BOS, M_NO_TOKENS, M_OK, M_BYTE };

/* The text of the byte-typed token 5 in mode M_BYTE. */
static const char *g_byte_text = "<0x41>";

static kiln_status build_and_load(int mode, kiln_tokenizer **t, kiln_error *err) {
    const char *const toks[] = {"<unk>",
                                "<s>",
                                "</s>",
                                "\xE2\x96\x81",
                                "a",
                                mode == M_BYTE ? g_byte_text : "b",
                                "\xE2\x96\x81"
                                "a",
                                "ab"};
    const size_t nt = sizeof toks / sizeof toks[0];
    wbuf o = {0};
    w(&o, "GGUF", 4);
    w32(&o, 3);
    w64(&o, 0); /* tensors */
    uint64_t n_kv = mode == M_NONE       ? 1
                    : mode == M_NO_TOKENS ? 1
                    : mode == M_BAD_BOS || mode == M_BYTE ? 4
                                                           : 3;
    w64(&o, n_kv);
    if (mode != M_NONE) kv_str(&o, "tokenizer.ggml.model", mode == M_T5 ? "t5" : "llama");
    if (mode != M_NO_TOKENS) kv_tokens(&o, toks, nt);
    if (mode != M_NONE && mode != M_NO_TOKENS) kv_scores(&o, mode == M_SCORES_SHORT ? nt - 1 : nt);
    if (mode == M_BAD_BOS) kv_u32(&o, "tokenizer.ggml.bos_token_id", 99);
    if (mode == M_BYTE) kv_types(&o, nt, 5);
    kiln_gguf *g = NULL;
    kiln_status st = kiln_gguf_open_memory(o.b, o.n, "<test>", &g, err);
    CHECKF(st == KILN_OK, "test gguf mode %d: %s", mode, err->message);
    if (st == KILN_OK) st = kiln_tokenizer_from_gguf(g, t, err);
    kiln_gguf_close(g);
    free(o.b);
    return st;
}

static void malformed_metadata(void) {
    kiln_error err = {0};
    kiln_tokenizer *t = NULL;
    CHECK(build_and_load(M_NONE, &t, &err) == KILN_ERR_NOT_FOUND && t == NULL);
    CHECK(build_and_load(M_NO_TOKENS, &t, &err) == KILN_ERR_NOT_FOUND && t == NULL);
    CHECK(build_and_load(M_T5, &t, &err) == KILN_ERR_UNSUPPORTED && t == NULL);
    CHECK(strstr(err.message, "t5") != NULL);
    CHECK(build_and_load(M_SCORES_SHORT, &t, &err) == KILN_ERR_FORMAT && t == NULL);
    CHECK(build_and_load(M_BAD_BOS, &t, &err) == KILN_ERR_FORMAT && t == NULL);
    CHECK(strstr(err.message, "bos_token_id") != NULL);
    /* a byte token's text must be "<0xNN>" (issue 20): "<0x-1>", "<0xZZ>" are refused */
    static const char *const bad_bytes[] = {"<0x-1>", "<0xZZ>", "<0x100>", "<0x4>", "b"};
    for (size_t i = 0; i < sizeof bad_bytes / sizeof bad_bytes[0]; i++) {
        g_byte_text = bad_bytes[i];
        CHECKF(build_and_load(M_BYTE, &t, &err) == KILN_ERR_FORMAT && t == NULL,
               "byte token '%s' was accepted", bad_bytes[i]);
        CHECKF(strstr(err.message, "token 5 has type byte") != NULL, "'%s': %s", bad_bytes[i],
               err.message);
    }
    g_byte_text = "<0x4a>";
    REQUIRE(build_and_load(M_BYTE, &t, &err) == KILN_OK);
    kiln_tokenizer_destroy(t);
    t = NULL;
    REQUIRE(build_and_load(M_OK, &t, &err) == KILN_OK);
    /* "ab" scores below "▁a"? scores are -id: ▁a (-6) beats ab (-7) */
    kiln_ivec ids = {0};
    REQUIRE(kiln_tokenizer_encode(t, "ab", 2, true, false, &ids, &err) == KILN_OK);
    int32_t want[] = {1, 6, 5};
    CHECK(ids_are(&ids, want, 3));
    /* "c" has no token and the vocab has no byte tokens: unk */
    ids.n = 0;
    REQUIRE(kiln_tokenizer_encode(t, "c", 1, false, false, &ids, &err) == KILN_OK);
    int32_t want2[] = {3, 0};
    CHECK(ids_are(&ids, want2, 2));
    kiln_ivec_free(&ids);
    kiln_tokenizer_destroy(t);
    kiln_tokenizer_destroy(NULL);
}

int main(void) {
    malformed_metadata();
    spm_cases();
    phi3_cases();
    wpm_cases();
    llama2c_cases();
    return kiln_test_finish("test_tokenizer_bad_input");
}
