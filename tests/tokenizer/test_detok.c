/*
 * test_detok - token pieces and the incremental detokenizer:
 *   - a character split over byte-fallback tokens comes out only when complete;
 *   - bytes that can never be UTF-8 become U+FFFD at once, a truncated tail at flush;
 *   - decode(encode(x)) == x for every string of llama.cpp's SPM suites (llama-spm, phi-3;
 *     SentencePiece with byte fallback is lossless) and of the byte-level BPE suite (gpt-2,
 *     when the BPE encoder is available);
 *   - SPM leading-space rule (first piece, after BOS) and run.c's rule for llama2.c;
 *   - ids out of range are errors.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/utf8.h"
#include "util/vec.h"

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        REQUIRE(b->s != NULL);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

/* Decode ids through the streaming API; every chunk must be valid UTF-8 on its own. */
static void decode_all(const kiln_tokenizer *t, const int32_t *ids, size_t n, sbuf *out) {
    kiln_error err = {0};
    kiln_detok *d = NULL;
    REQUIRE(kiln_detok_create(t, &d, &err) == KILN_OK);
    out->n = 0;
    sb_add(out, "", 0);
    const char *s;
    size_t sl;
    for (size_t i = 0; i < n; i++) {
        REQUIRE(kiln_detok_push(d, ids[i], &s, &sl, &err) == KILN_OK);
        CHECKF(kiln_utf8_valid(s, sl, NULL), "chunk after id %d is not valid UTF-8", ids[i]);
        sb_add(out, s, sl);
    }
    REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
    sb_add(out, s, sl);
    kiln_detok_destroy(d);
}

static kiln_tokenizer *load_gguf(const char *rel, kiln_gguf **g, kiln_status *st_out) {
    const char *path = kiln_test_shared(rel);
    kiln_error err = {0};
    *st_out = KILN_ERR_NOT_FOUND;
    if (access(path, R_OK) != 0) {
        printf("note: %s missing, its checks are skipped\n", path);
        return NULL;
    }
    REQUIRE(kiln_gguf_open(path, g, &err) == KILN_OK);
    kiln_tokenizer *t = NULL;
    *st_out = kiln_tokenizer_from_gguf(*g, &t, &err);
    if (*st_out != KILN_OK) printf("note: %s: %s\n", rel, err.message);
    return t;
}

/* decode(encode(x)) == x over a conformance .inp file */
static void round_trip_suite(const char *name, bool add_special) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    kiln_gguf *g = NULL;
    kiln_status st;
    kiln_tokenizer *t = load_gguf(rel, &g, &st);
    if (!t) {
        /* BPE is written elsewhere; only its absence (UNSUPPORTED) may skip */
        CHECKF(st == KILN_ERR_NOT_FOUND || st == KILN_ERR_UNSUPPORTED, "%s: %s", name,
               kiln_status_name(st));
        kiln_gguf_close(g);
        return;
    }
    char inp_rel[300];
    snprintf(inp_rel, sizeof inp_rel, "%s.inp", rel);
    FILE *f = fopen(kiln_test_shared(inp_rel), "rb");
    REQUIRE(f != NULL);
    sbuf all = {0}, dec = {0};
    char chunk[4096];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) sb_add(&all, chunk, r);
    fclose(f);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t p = 0;
    int n = 0, ok = 0;
    kiln_ivec ids = {0};
    kiln_error err = {0};
    while (p < all.n) {
        const char *m = memmem(all.s + p, all.n - p, sep, sizeof sep - 1);
        REQUIRE(m != NULL);
        size_t len = (size_t)(m - all.s) - p;
        ids.n = 0;
        REQUIRE(kiln_tokenizer_encode(t, all.s + p, len, add_special, false, &ids, &err) ==
                KILN_OK);
        decode_all(t, ids.data, ids.n, &dec);
        bool same = dec.n == len && memcmp(dec.s, all.s + p, len) == 0;
        CHECKF(same, "%s: round trip of \"%.*s\" gave \"%s\"", name, (int)len, all.s + p, dec.s);
        n++;
        ok += same;
        p += len + sizeof sep - 1;
    }
    printf("%s round trip (add_special=%d): %d/%d\n", name, add_special, ok, n);
    kiln_ivec_free(&ids);
    free(all.s);
    free(dec.s);
    kiln_tokenizer_destroy(t);
    kiln_gguf_close(g);
}

static int32_t id_of(const kiln_tokenizer *t, const char *s) {
    return kiln_vocab_find(kiln_tokenizer_vocab(t), s, strlen(s));
}

static void spm_checks(void) {
    kiln_gguf *g = NULL;
    kiln_status st;
    kiln_tokenizer *t = load_gguf("tokenizer/ggml-vocab-llama-spm.gguf", &g, &st);
    if (!t) {
        CHECK(st == KILN_ERR_NOT_FOUND);
        return;
    }
    kiln_error err = {0};
    sbuf out = {0};
    char buf[64];

    /* pieces in isolation */
    int32_t hello = id_of(t, "\xE2\x96\x81Hello"), world = id_of(t, "\xE2\x96\x81world");
    int32_t bare = id_of(t, "Hello");
    REQUIRE(hello >= 0 && world >= 0 && bare >= 0);
    size_t n = kiln_tokenizer_piece(t, hello, false, buf, sizeof buf);
    CHECK(n == 6 && !memcmp(buf, " Hello", 6));
    CHECK(kiln_tokenizer_piece(t, id_of(t, "<0x41>"), false, buf, sizeof buf) == 1 &&
          buf[0] == 'A');
    CHECK(kiln_tokenizer_piece(t, 1, false, buf, sizeof buf) == 0); /* <s> control */
    CHECK(kiln_tokenizer_piece(t, 1, true, buf, sizeof buf) == 3 && !memcmp(buf, "<s>", 3));
    CHECK(kiln_tokenizer_piece(t, hello, false, buf, 2) == 6); /* snprintf-like */
    CHECK(kiln_tokenizer_piece(t, -1, true, buf, sizeof buf) == 0);
    CHECK(kiln_tokenizer_piece(t, 32000, true, buf, sizeof buf) == 0);

    /* leading space: dropped from the first piece, after BOS too, nowhere else */
    int32_t a[] = {1, hello, world};
    decode_all(t, a, 3, &out);
    CHECKF(!strcmp(out.s, "Hello world"), "got \"%s\"", out.s);
    decode_all(t, a + 1, 2, &out);
    CHECKF(!strcmp(out.s, "Hello world"), "got \"%s\"", out.s);
    int32_t b[] = {bare, hello};
    decode_all(t, b, 2, &out);
    CHECKF(!strcmp(out.s, "Hello Hello"), "got \"%s\"", out.s);

    /* a 4-byte character over byte tokens: nothing until the last byte */
    const char dog[] = "\xF0\x9F\x90\xB6";
    int32_t bytes[4];
    for (int i = 0; i < 4; i++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)dog[i]);
        bytes[i] = id_of(t, hex);
        REQUIRE(bytes[i] >= 0);
    }
    kiln_detok *d = NULL;
    REQUIRE(kiln_detok_create(t, &d, &err) == KILN_OK);
    const char *s;
    size_t sl;
    REQUIRE(kiln_detok_push(d, hello, &s, &sl, &err) == KILN_OK);
    CHECK(sl == 5 && !memcmp(s, "Hello", 5));
    for (int i = 0; i < 3; i++) {
        REQUIRE(kiln_detok_push(d, bytes[i], &s, &sl, &err) == KILN_OK);
        CHECKF(sl == 0, "byte %d of 4 emitted %zu bytes early", i + 1, sl);
    }
    REQUIRE(kiln_detok_push(d, bytes[3], &s, &sl, &err) == KILN_OK);
    CHECK(sl == 4 && !memcmp(s, dog, 4));
    REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
    CHECK(sl == 0);

    /* bytes that cannot start or continue UTF-8 */
    int32_t ff = id_of(t, "<0xFF>"), e2 = id_of(t, "<0xE2>"), x41 = id_of(t, "<0x41>");
    REQUIRE(kiln_detok_push(d, ff, &s, &sl, &err) == KILN_OK);
    CHECK(sl == 3 && !memcmp(s, "\xEF\xBF\xBD", 3)); /* provably invalid: at once */
    REQUIRE(kiln_detok_push(d, e2, &s, &sl, &err) == KILN_OK);
    CHECK(sl == 0);
    REQUIRE(kiln_detok_push(d, x41, &s, &sl, &err) == KILN_OK);
    CHECK(sl == 4 && !memcmp(s,
                             "\xEF\xBF\xBD"
                             "A",
                             4));
    REQUIRE(kiln_detok_push(d, e2, &s, &sl, &err) == KILN_OK);
    CHECK(sl == 0);
    REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
    CHECK(sl == 3 && !memcmp(s, "\xEF\xBF\xBD", 3)); /* truncated at the end of the stream */

    /* ids out of range */
    CHECK(kiln_detok_push(d, -1, &s, &sl, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_detok_push(d, 32000, &s, &sl, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "32000") != NULL);
    CHECK(kiln_detok_push(d, INT32_MAX, &s, &sl, &err) == KILN_ERR_INVALID_ARGUMENT);
    kiln_detok_destroy(d);
    kiln_detok_destroy(NULL);

    free(out.s);
    kiln_tokenizer_destroy(t);
    kiln_gguf_close(g);
}

static void wpm_checks(void) {
    kiln_gguf *g = NULL;
    kiln_status st;
    kiln_tokenizer *t = load_gguf("tokenizer/ggml-vocab-bert-bge.gguf", &g, &st);
    if (!t) {
        CHECK(st == KILN_ERR_NOT_FOUND);
        return;
    }
    char buf[64];
    int32_t hello = id_of(t, "\xE2\x96\x81hello");
    REQUIRE(hello >= 0);
    CHECK(kiln_tokenizer_piece(t, hello, false, buf, sizeof buf) == 6 && !memcmp(buf, " hello", 6));
    CHECK(kiln_tokenizer_piece(t, 101, false, buf, sizeof buf) == 0); /* [CLS] */
    CHECK(kiln_tokenizer_piece(t, 101, true, buf, sizeof buf) == 5 && !memcmp(buf, "[CLS]", 5));
    kiln_tokenizer_destroy(t);
    kiln_gguf_close(g);
}

static void llama2c_checks(void) {
    const char *path = kiln_test_shared("models/stories260K/tok512.bin");
    if (access(path, R_OK) != 0) {
        printf("note: %s missing\n", path);
        return;
    }
    kiln_error err = {0};
    kiln_tokenizer *t = NULL;
    REQUIRE(kiln_tokenizer_from_llama2c(path, 512, &t, &err) == KILN_OK);
    char buf[16];
    /* "<0xNN>" pieces are the byte; BOS/EOS are control */
    CHECK(kiln_tokenizer_piece(t, 0x41 + 3, false, buf, sizeof buf) == 1 && buf[0] == 'A');
    CHECK(kiln_tokenizer_piece(t, 1, false, buf, sizeof buf) == 0);
    CHECK(kiln_tokenizer_is_eog(t, 1) && kiln_tokenizer_is_eog(t, 2) &&
          !kiln_tokenizer_is_eog(t, 3));
    /* run.c: the leading space is dropped only right after BOS */
    int32_t sp_a = id_of(t, " a");
    REQUIRE(sp_a >= 0);
    sbuf out = {0};
    int32_t a[] = {1, sp_a, sp_a};
    decode_all(t, a, 3, &out);
    CHECKF(!strcmp(out.s, "a a"), "got \"%s\"", out.s);
    decode_all(t, a + 1, 2, &out);
    CHECKF(!strcmp(out.s, " a a"), "got \"%s\"", out.s);
    free(out.s);
    kiln_tokenizer_destroy(t);
}

int main(void) {
    spm_checks();
    wpm_checks();
    llama2c_checks();
    round_trip_suite("llama-spm", false);
    round_trip_suite("llama-spm", true);
    round_trip_suite("phi-3", false);
    round_trip_suite("gpt-2", false);
    return kiln_test_finish("test_detok");
}
