/*
 * test_bpe_merge - the BPE merge loop on a tiny hand-built vocab (token texts are in GPT-2's
 * byte-mapped form: 'Ġ' = space). Expected ids follow from llama.cpp's rules worked by hand:
 * lowest rank merges first, equal ranks merge leftmost first, a final symbol missing from the
 * vocab falls back to its single bytes (dropping bytes without a token), and with
 * ignore_merges (llama-bpe) a whole pre-token found in the vocab is used as is.
 */
#include <stdarg.h>
#include <stdlib.h>

#include "test.h"
#include "tokenizer/bpe.h"
#include "tokenizer/vocab.h"

static const char *toks[] = {
    "h",        "e",         "l",
    "o",        "w",         "x",
    "y",        "z", /* 0..7 */
    "he",       "ll",        "hell",
    "hello",                                     /* 8..11 */
    "\xC4\xA0", "\xC4\xA0w",                     /* 12 'Ġ', 13 'Ġw' */
    "\xC3\x83", "\xC2\xA9",  "\xC3\x83\xC2\xA9", /* 14 'Ã', 15 '©', 16 'Ã©' (= "é") */
    "xyz",                                       /* 17 */
};
enum {
    T_H,
    T_E,
    T_L,
    T_O,
    T_W,
    T_X,
    T_Y,
    T_Z,
    T_HE,
    T_LL,
    T_HELL,
    T_HELLO,
    T_SP,
    T_SPW,
    T_A3,
    T_CPY,
    T_EACUTE,
    T_XYZ
};

static const char *merges[] = {
    "l l",               /* 0 */
    "h e",               /* 1 */
    "he ll",             /* 2 */
    "hell o",            /* 3 */
    "\xC4\xA0 w",        /* 4: Ġ w */
    "l o",               /* 5: gives "lo", which is not a token */
    "\xC3\x83 \xC2\xA9", /* 6: Ã © */
    "nospace",           /* no separator: ignored, as llama.cpp does */
    "l l",               /* duplicate: the first rank stays */
};

static void build(kiln_vocab *v, const char *pre) {
    memset(v, 0, sizeof *v);
    v->type = KILN_VOCAB_BPE;
    v->n_tokens = (int32_t)(sizeof toks / sizeof toks[0]);
    v->text = calloc((size_t)v->n_tokens, sizeof *v->text);
    v->text_len = calloc((size_t)v->n_tokens, sizeof *v->text_len);
    v->token_type = calloc((size_t)v->n_tokens, sizeof *v->token_type);
    REQUIRE(v->text && v->text_len && v->token_type);
    for (int32_t i = 0; i < v->n_tokens; i++) {
        v->text[i] = strdup(toks[i]);
        v->text_len[i] = (uint32_t)strlen(toks[i]);
        v->token_type[i] = KILN_TOKEN_NORMAL;
    }
    v->n_merges = (int32_t)(sizeof merges / sizeof merges[0]);
    v->merges = calloc((size_t)v->n_merges, sizeof *v->merges);
    REQUIRE(v->merges);
    for (int32_t i = 0; i < v->n_merges; i++) v->merges[i] = strdup(merges[i]);
    v->pre = pre ? strdup(pre) : NULL;
    v->bos_id = v->eos_id = v->eot_id = v->unk_id = -1;
    v->sep_id = v->pad_id = v->cls_id = v->mask_id = -1;
    kiln_error err = {0};
    REQUIRE(kiln_vocab_build_index(v, &err) == KILN_OK);
    kiln_status st = kiln_bpe_init(v, &err);
    CHECKF(st == KILN_OK, "bpe_init: %s", err.message);
    REQUIRE(st == KILN_OK);
}

static void expect(const kiln_vocab *v, const char *text, int n, ...) {
    kiln_ivec out = {0};
    kiln_error err = {0};
    kiln_status st = kiln_bpe_encode(v, text, strlen(text), &out, &err);
    CHECKF(st == KILN_OK, "encode '%s': %s", text, err.message);
    va_list ap;
    va_start(ap, n);
    bool ok = (int)out.n == n;
    int want[32];
    for (int i = 0; i < n; i++) {
        want[i] = va_arg(ap, int);
        if (ok && out.data[i] != want[i]) ok = false;
    }
    va_end(ap);
    if (!ok) {
        fprintf(stderr, "'%s' [%s]: got", text, v->pre ? v->pre : "default");
        for (size_t i = 0; i < out.n; i++) fprintf(stderr, " %d", out.data[i]);
        fprintf(stderr, ", want");
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        CHECK(ok);
    }
    kiln_ivec_free(&out);
}

int main(void) {
    kiln_vocab v;
    build(&v, "gpt-2");
    /* h e l l o: "l l" (0), then "h e" (1), "he ll" (2), "hell o" (3) */
    expect(&v, "hello", 1, T_HELLO);
    /* " w" is one pre-token: Ġ w -> Ġw */
    expect(&v, "hello w", 2, T_HELLO, T_SPW);
    /* l l l: both pairs have rank 0; the leftmost merges first -> "ll" "l" */
    expect(&v, "lll", 2, T_LL, T_L);
    /* "lo" is merged (rank 5) but is no token: falls back to "l" "o" */
    expect(&v, "lo", 2, T_L, T_O);
    /* "hex": "he" + "x" */
    expect(&v, "hex", 2, T_HE, T_X);
    /* "q" has no token and no byte token: dropped */
    expect(&v, "hqe", 2, T_H, T_E);
    /* "é" = C3 A9 -> "Ã©" via merge 6 */
    expect(&v, "\xC3\xA9", 1, T_EACUTE);
    /* without ignore_merges "xyz" is three symbols */
    expect(&v, "xyz", 3, T_X, T_Y, T_Z);
    /* a lone space at the end is its own pre-token "Ġ" */
    expect(&v, "he ", 2, T_HE, T_SP);
    expect(&v, "", 0);
    kiln_vocab_free(&v);

    /* llama-bpe sets ignore_merges: a pre-token that is a whole token is used directly */
    build(&v, "llama-bpe");
    expect(&v, "xyz", 1, T_XYZ);
    expect(&v, "hello", 1, T_HELLO);
    expect(&v, "lll", 2, T_LL, T_L);
    kiln_vocab_free(&v);

    /* unknown pre type: init fails naming it, and encode refuses politely */
    {
        kiln_vocab u;
        memset(&u, 0, sizeof u);
        u.type = KILN_VOCAB_BPE;
        u.pre = strdup("martian");
        kiln_error err = {0};
        CHECK(kiln_bpe_init(&u, &err) == KILN_ERR_UNSUPPORTED);
        CHECKF(strstr(err.message, "martian") != NULL, "message: %s", err.message);
        CHECK(u.bpe == NULL);
        kiln_ivec out = {0};
        CHECK(kiln_bpe_encode(&u, "x", 1, &out, NULL) != KILN_OK);
        kiln_vocab_free(&u);
    }
    return kiln_test_finish("test_bpe_merge");
}
