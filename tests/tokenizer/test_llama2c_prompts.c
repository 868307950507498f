/*
 * test_llama2c_prompts - llama2.c tokenizer.bin encoding and decoding against
 * ../shared/golden/llama2c-greedy.json (output of karpathy/llama2.c run.c):
 *   - prompt_ids (BOS + run.c encode) for every case;
 *   - run.c's printed text, rebuilt from the pieces of prompt and generated ids with run.c's
 *     decode rule (leading space dropped after BOS) and safe_printf filter;
 *   - the incremental detokenizer gives back the prompt exactly (byte-fallback emoji
 *     included);
 *   - the heap-based encoder agrees with a direct O(n^3) transcription of run.c's encode
 *     loop on random strings, for tok512 (byte fallback) and tok105 (no byte tokens).
 */
#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/vec.h"

/* ---- run.c encode, transcribed directly (linear scans, strict '>' on scores) ---- */
static int32_t lookup(const kiln_vocab *v, const char *s, size_t n) {
    for (int32_t i = 0; i < v->n_tokens; i++)
        if (v->text_len[i] == n && memcmp(v->text[i], s, n) == 0) return i;
    return -1;
}

static void naive_encode(const kiln_vocab *v, const char *text, size_t len, kiln_ivec *out) {
    out->n = 0;
    REQUIRE(kiln_ivec_push(out, 1) == KILN_OK);
    if (len > 0) {
        int32_t sp = lookup(v, " ", 1);
        if (sp >= 0) REQUIRE(kiln_ivec_push(out, sp) == KILN_OK);
    }
    char buf[8];
    size_t bl = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c & 0xC0) != 0x80) bl = 0;
        buf[bl++] = (char)c;
        if (i + 1 < len && (((unsigned char)text[i + 1]) & 0xC0) == 0x80 && bl < 4) continue;
        int32_t id = lookup(v, buf, bl);
        if (id >= 0) {
            REQUIRE(kiln_ivec_push(out, id) == KILN_OK);
        } else {
            for (size_t k = 0; k < bl; k++) {
                int32_t b = (int32_t)(unsigned char)buf[k] + 3;
                if (b >= v->n_tokens) b = 0; /* kiln's documented guard; run.c reads out of range */
                REQUIRE(kiln_ivec_push(out, b) == KILN_OK);
            }
        }
        bl = 0;
    }
    char *cat = malloc(4096);
    REQUIRE(cat != NULL);
    for (;;) {
        float best = -1e10f;
        int32_t best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < out->n; i++) {
            const int32_t a = out->data[i], b = out->data[i + 1];
            size_t la = v->text_len[a], lb = v->text_len[b];
            REQUIRE(la + lb < 4096);
            memcpy(cat, v->text[a], la);
            memcpy(cat + la, v->text[b], lb);
            int32_t id = lookup(v, cat, la + lb);
            if (id >= 0 && v->scores[id] > best) {
                best = v->scores[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_id < 0) break;
        out->data[best_i] = best_id;
        memmove(out->data + best_i + 1, out->data + best_i + 2,
                (out->n - best_i - 2) * sizeof(int32_t));
        out->n--;
    }
    free(cat);
}

static const char *tok_path_for(const char *model) {
    if (!strcmp(model, "stories260K")) return kiln_test_shared("models/stories260K/tok512.bin");
    if (!strcmp(model, "llama2xs")) return kiln_test_shared("models/llama2xs-260K/tok512.bin");
    return NULL;
}

static bool ids_eq(const kiln_ivec *a, json_t *arr) {
    if (a->n != json_array_size(arr)) return false;
    for (size_t i = 0; i < a->n; i++)
        if (a->data[i] != (int32_t)json_integer_value(json_array_get(arr, i))) return false;
    return true;
}

/* run.c: decode(prev, token) then safe_printf (drop single non-printable bytes) */
static void runc_text(const kiln_tokenizer *t, const int32_t *ids, size_t n, char **out,
                      size_t *out_n) {
    size_t cap = 1024, k = 0;
    char *o = malloc(cap);
    REQUIRE(o != NULL);
    char piece[256];
    for (size_t i = 1; i < n; i++) {
        size_t pl = kiln_tokenizer_piece(t, ids[i], true, piece, sizeof piece);
        REQUIRE(pl <= sizeof piece);
        const char *p = piece;
        if (ids[i - 1] == 1 && pl > 0 && p[0] == ' ') p++, pl--;
        if (pl == 1 && !(isprint((unsigned char)p[0]) || isspace((unsigned char)p[0]))) continue;
        while (k + pl + 1 > cap) {
            cap *= 2;
            o = realloc(o, cap);
            REQUIRE(o != NULL);
        }
        memcpy(o + k, p, pl);
        k += pl;
    }
    o[k] = '\0';
    *out = o;
    *out_n = k;
}

static void random_cross_check(const char *path, int32_t n_vocab, unsigned seed) {
    kiln_error err = {0};
    kiln_tokenizer *t = NULL;
    kiln_status st = kiln_tokenizer_from_llama2c(path, n_vocab, &t, &err);
    CHECKF(st == KILN_OK, "%s: %s", path, err.message);
    if (st != KILN_OK) return;
    const kiln_vocab *v = kiln_tokenizer_vocab(t);
    /* alphabet: common text, spaces, and multi-byte characters with and without tokens */
    static const char *const alpha[] = {"a",
                                        "e",
                                        "t",
                                        "h",
                                        "o",
                                        " ",
                                        "  ",
                                        "n",
                                        "s",
                                        ".",
                                        ",",
                                        "T",
                                        "\n",
                                        "\xC3\xA9",
                                        "\xE2\x84\xA2",
                                        "\xF0\x9F\x90\xB6",
                                        "\xE4\xB8\xAD",
                                        "ing",
                                        "the",
                                        "!",
                                        "\xE2\x80\x8A",
                                        "q",
                                        "Z",
                                        "'"};
    const size_t na = sizeof alpha / sizeof alpha[0];
    unsigned s = seed;
    kiln_ivec a = {0}, b = {0};
    char text[512];
    int mismatches = 0;
    for (int iter = 0; iter < 300; iter++) {
        size_t len = 0;
        s = s * 1103515245u + 12345u;
        int parts = (int)((s >> 16) % 24);
        for (int p = 0; p < parts; p++) {
            s = s * 1103515245u + 12345u;
            const char *x = alpha[(s >> 16) % na];
            size_t xl = strlen(x);
            if (len + xl >= sizeof text) break;
            memcpy(text + len, x, xl);
            len += xl;
        }
        a.n = 0;
        st = kiln_tokenizer_encode(t, text, len, true, false, &a, &err);
        CHECKF(st == KILN_OK, "encode: %s", err.message);
        naive_encode(v, text, len, &b);
        bool same = a.n == b.n && (a.n == 0 || !memcmp(a.data, b.data, a.n * sizeof(int32_t)));
        if (!same && mismatches++ < 3)
            fprintf(stderr, "%s: heap encoder differs from run.c loop on \"%.*s\"\n", path,
                    (int)len, text);
        CHECK(same);
    }
    kiln_ivec_free(&a);
    kiln_ivec_free(&b);
    kiln_tokenizer_destroy(t);
}

int main(void) {
    const char *golden = kiln_test_shared("golden/llama2c-greedy.json");
    kiln_test_require_file(golden);
    json_error_t jerr;
    json_t *root = json_load_file(golden, 0, &jerr);
    REQUIRE(root != NULL);
    json_t *cases = json_object_get(root, "cases");
    REQUIRE(json_is_array(cases) && json_array_size(cases) > 0);

    int n_ok = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *model = json_string_value(json_object_get(c, "model"));
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        json_t *want = json_object_get(c, "prompt_ids");
        json_t *gen = json_object_get(c, "generated_ids");
        const char *stdout_text = json_string_value(json_object_get(c, "stdout"));
        REQUIRE(model && prompt && json_is_array(want));
        const char *path = tok_path_for(model);
        CHECKF(path != NULL, "case %zu: unknown model %s", i, model);
        if (!path) continue;
        kiln_test_require_file(path);

        kiln_error err = {0};
        kiln_tokenizer *t = NULL;
        kiln_status st = kiln_tokenizer_from_llama2c(path, 512, &t, &err);
        CHECKF(st == KILN_OK, "%s: %s", path, err.message);
        if (st != KILN_OK) continue;

        kiln_ivec ids = {0};
        st = kiln_tokenizer_encode(t, prompt, strlen(prompt), true, false, &ids, &err);
        CHECKF(st == KILN_OK, "encode: %s", err.message);
        bool ok = ids_eq(&ids, want);
        if (!ok) {
            fprintf(stderr, "case %zu (%s) \"%s\": got", i, model, prompt);
            for (size_t k = 0; k < ids.n; k++) fprintf(stderr, " %d", ids.data[k]);
            fputc('\n', stderr);
        }
        CHECK(ok);
        n_ok += ok;

        /* streaming decode of the prompt ids gives the prompt back */
        kiln_detok *d = NULL;
        REQUIRE(kiln_detok_create(t, &d, &err) == KILN_OK);
        char text[4096];
        size_t tn = 0;
        for (size_t k = 0; k < json_array_size(want); k++) {
            const char *s;
            size_t sl;
            int32_t id = (int32_t)json_integer_value(json_array_get(want, k));
            REQUIRE(kiln_detok_push(d, id, &s, &sl, &err) == KILN_OK);
            REQUIRE(tn + sl < sizeof text);
            memcpy(text + tn, s, sl);
            tn += sl;
        }
        const char *s;
        size_t sl;
        REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
        REQUIRE(tn + sl < sizeof text);
        memcpy(text + tn, s, sl);
        tn += sl;
        CHECKF(tn == strlen(prompt) && memcmp(text, prompt, tn) == 0,
               "case %zu: detok gave \"%.*s\", prompt \"%s\"", i, (int)tn, text, prompt);
        kiln_detok_destroy(d);

        /* run.c's printed text from the pieces */
        if (stdout_text && json_is_array(gen)) {
            kiln_ivec all = {0};
            for (size_t k = 0; k < json_array_size(want); k++)
                REQUIRE(kiln_ivec_push(
                            &all, (int32_t)json_integer_value(json_array_get(want, k))) == KILN_OK);
            for (size_t k = 0; k < json_array_size(gen); k++)
                REQUIRE(kiln_ivec_push(&all, (int32_t)json_integer_value(json_array_get(gen, k))) ==
                        KILN_OK);
            char *rt;
            size_t rn;
            runc_text(t, all.data, all.n, &rt, &rn);
            size_t sn = strlen(stdout_text);
            /* run.c ends its output with one "\n" */
            bool same = (rn == sn && !memcmp(rt, stdout_text, sn)) ||
                        (rn + 1 == sn && !memcmp(rt, stdout_text, rn) && stdout_text[rn] == '\n');
            CHECKF(same, "case %zu: run.c text differs:\n  got  \"%.120s\"\n  want \"%.120s\"", i,
                   rt, stdout_text);
            free(rt);
            kiln_ivec_free(&all);
        }
        kiln_ivec_free(&ids);
        kiln_tokenizer_destroy(t);
    }
    printf("llama2c prompts: %d/%zu prompt_ids match\n", n_ok, json_array_size(cases));
    json_decref(root);

    random_cross_check(kiln_test_shared("models/stories260K/tok512.bin"), 512, 1);
    const char *tok105 = kiln_test_shared("models/babyllama-tok105/tok105.bin");
    if (access(tok105, R_OK) == 0) random_cross_check(tok105, 105, 2);
    return kiln_test_finish("test_llama2c_prompts");
}
