/*
 * test_hftok_units - the tokenizer.json components one at a time, on small hand-written
 * tokenizer.json documents. Expected ids follow Hugging Face tokenizers' semantics; where the
 * tokenizers library has a unit test for the same case (Split behaviours on
 * "The-final--countdown", Metaspace "Hey friend!", ByteLevel, Digits, Whitespace,
 * BertPreTokenizer, the BPE "unrelated" and byte_fallback examples) the same inputs and
 * outputs are used. Pre-tokens are made observable with a BPE model with ignore_merges whose
 * vocab holds exactly the expected pieces (a piece that is a token is emitted whole).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/vec.h"

/* JSON written with ' for " (no test token contains a quote). */
static char *J(const char *s) {
    char *d = strdup(s);
    REQUIRE(d);
    for (char *p = d; *p; p++)
        if (*p == '\'') *p = '"';
    return d;
}

static kiln_tokenizer *load2(const char *json, const char *cfg) {
    char *j = J(json), *c = cfg ? J(cfg) : NULL;
    kiln_tokenizer *t = NULL;
    kiln_error err = {0};
    kiln_status st = kiln_tokenizer_from_hf_json(j, strlen(j), c, c ? strlen(c) : 0, &t, &err);
    CHECKF(st == KILN_OK, "load: %s: %s", kiln_status_name(st), err.message);
    free(j);
    free(c);
    return t;
}

static kiln_tokenizer *load(const char *json) {
    return load2(json, NULL);
}

static int n_cases = 0;

static void expect_ids(kiln_tokenizer *t, const char *label, const char *text, bool add_special,
                       bool parse_special, const int32_t *want, size_t n) {
    n_cases++;
    if (!t) {
        CHECKF(0, "%s: no tokenizer", label);
        return;
    }
    kiln_ivec ids = {0};
    kiln_error err = {0};
    kiln_status st =
        kiln_tokenizer_encode(t, text, strlen(text), add_special, parse_special, &ids, &err);
    bool ok =
        st == KILN_OK && ids.n == n && (n == 0 || !memcmp(ids.data, want, n * sizeof(int32_t)));
    if (!ok) {
        fprintf(stderr, "%s: \"%s\" -> %s%s", label, text, kiln_status_name(st),
                st ? err.message : "");
        fprintf(stderr, "\n   want:");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n   got: ");
        for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.data[i]);
        fputc('\n', stderr);
    }
    CHECK(ok);
    kiln_ivec_free(&ids);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / 4)
#define NONE     ((const int32_t *)NULL), 0

static void expect_decode(kiln_tokenizer *t, const char *label, const int32_t *ids, size_t n,
                          const char *want) {
    n_cases++;
    if (!t) return;
    kiln_detok *d = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_detok_create(t, &d, &err) == KILN_OK);
    char out[512];
    size_t on = 0;
    const char *s;
    size_t sl;
    for (size_t i = 0; i <= n; i++) {
        if (i < n)
            REQUIRE(kiln_detok_push(d, ids[i], &s, &sl, &err) == KILN_OK);
        else
            REQUIRE(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
        REQUIRE(on + sl < sizeof out);
        memcpy(out + on, s, sl);
        on += sl;
    }
    kiln_detok_destroy(d);
    out[on] = '\0';
    CHECKF(on == strlen(want) && !memcmp(out, want, on), "%s: decoded \"%s\", want \"%s\"", label,
           out, want);
}

/* ---- pre-tokenizers ------------------------------------------------------------------------ */

static const char *MODEL_WHOLE_FMT =
    "{'model': {'type': 'BPE', 'ignore_merges': true, 'vocab': {%s}, 'merges': []},"
    " 'pre_tokenizer': %s, 'normalizer': %s, 'decoder': %s}";

static kiln_tokenizer *whole(const char *vocab, const char *pretok, const char *norm,
                             const char *dec) {
    char buf[4096];
    snprintf(buf, sizeof buf, MODEL_WHOLE_FMT, vocab, pretok, norm ? norm : "null",
             dec ? dec : "null");
    return load(buf);
}

static void test_split(void) {
    const char *vocab = "'The': 0, '-': 1, 'final': 2, '--': 3, 'countdown': 4, 'The-': 5, "
                        "'final-': 6, '-final': 7, '-countdown': 8";
    static const struct {
        const char *beh;
        int32_t ids[8];
        size_t n;
    } cases[] = {
        {"Removed", {0, 2, 4}, 3},
        {"Isolated", {0, 1, 2, 1, 1, 4}, 6},
        {"MergedWithPrevious", {5, 6, 1, 4}, 4},
        {"MergedWithNext", {0, 7, 1, 8}, 4},
        {"Contiguous", {0, 1, 2, 3, 4}, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int rx = 0; rx < 2; rx++) {
            char pre[256];
            snprintf(pre, sizeof pre,
                     "{'type': 'Split', 'pattern': {'%s': '-'}, 'behavior': '%s', 'invert': false}",
                     rx ? "Regex" : "String", cases[i].beh);
            kiln_tokenizer *t = whole(vocab, pre, NULL, NULL);
            expect_ids(t, cases[i].beh, "The-final--countdown", false, false, cases[i].ids,
                       cases[i].n);
            kiln_tokenizer_destroy(t);
        }
    }
    /* invert: the regex matches the words, the gaps are the delimiters */
    kiln_tokenizer *t = whole(vocab,
                              "{'type': 'Split', 'pattern': {'Regex': '[a-zA-Z]+'}, "
                              "'behavior': 'Removed', 'invert': true}",
                              NULL, NULL);
    expect_ids(t, "Split invert", "The-final--countdown", false, false, IDS(0, 2, 4));
    kiln_tokenizer_destroy(t);
}

static void test_metaspace(void) {
    const char *vocab = "'\\u2581Hey': 0, '\\u2581friend!': 1, '\\u2581': 2, "
                        "'\\u2581Hey\\u2581friend!': 3, 'Hey': 4, 'friend!': 5";
    kiln_tokenizer *t =
        whole(vocab, "{'type': 'Metaspace', 'replacement': '\\u2581', 'prepend_scheme': 'always'}",
              NULL, NULL);
    expect_ids(t, "Metaspace", "Hey friend!", false, false, IDS(0, 1));
    expect_ids(t, "Metaspace spaces", "Hey   friend!", false, false, IDS(0, 2, 2, 1));
    kiln_tokenizer_destroy(t);
    t = whole(vocab,
              "{'type': 'Metaspace', 'replacement': '\\u2581', 'prepend_scheme': 'always', "
              "'split': false}",
              NULL, NULL);
    expect_ids(t, "Metaspace split=false", "Hey friend!", false, false, IDS(3));
    kiln_tokenizer_destroy(t);
    t = whole(vocab, "{'type': 'Metaspace', 'replacement': '\\u2581', 'prepend_scheme': 'never'}",
              NULL, NULL);
    expect_ids(t, "Metaspace never", "Hey friend!", false, false, IDS(4, 1));
    kiln_tokenizer_destroy(t);
    /* legacy form: add_prefix_space false means never */
    t = whole(vocab, "{'type': 'Metaspace', 'replacement': '\\u2581', 'add_prefix_space': false}",
              NULL, NULL);
    expect_ids(t, "Metaspace legacy", "Hey friend!", false, false, IDS(4, 1));
    kiln_tokenizer_destroy(t);

    /* prepend_scheme first: only the piece at the start of the input; always: every piece */
    const char *fmt = "{'model': {'type': 'BPE', 'ignore_merges': true, 'vocab': {%s}, "
                      "'merges': []}, 'added_tokens': [{'id': 9, 'content': '<x>', "
                      "'special': false}], 'pre_tokenizer': {'type': 'Metaspace', "
                      "'replacement': '\\u2581', 'prepend_scheme': '%s'}}";
    char buf[1024];
    snprintf(buf, sizeof buf, fmt, vocab, "first");
    t = load(buf);
    expect_ids(t, "Metaspace first", "Hey<x>friend!", false, false, IDS(0, 9, 5));
    expect_ids(t, "Metaspace first after token", "<x>Hey", false, false, IDS(9, 4));
    kiln_tokenizer_destroy(t);
    snprintf(buf, sizeof buf, fmt, vocab, "always");
    t = load(buf);
    expect_ids(t, "Metaspace always", "Hey<x>friend!", false, false, IDS(0, 9, 1));
    kiln_tokenizer_destroy(t);
}

static void test_bytelevel(void) {
    /* tokenizers' ByteLevel test sentence; 'Ġ' is U+0120 */
    const char *vocab = "'Hello': 0, '\\u0120my': 1, '\\u0120friend': 2, ',': 3, '\\u0120how': 4, "
                        "'\\u0120is': 5, '\\u0120your': 6, '\\u0120day': 7, '\\u0120going': 8, "
                        "'?': 9, '\\u0120Hello': 10, 'Hello\\u0120my': 11";
    const char *s = "Hello my friend, how is your day going?";
    kiln_tokenizer *t = whole(vocab,
                              "{'type': 'ByteLevel', 'add_prefix_space': false, "
                              "'use_regex': true}",
                              NULL, "{'type': 'ByteLevel'}");
    expect_ids(t, "ByteLevel", s, false, false, IDS(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
    expect_decode(t, "ByteLevel decode", IDS(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), s);
    kiln_tokenizer_destroy(t);
    t = whole(vocab, "{'type': 'ByteLevel', 'add_prefix_space': true}", NULL,
              "{'type': 'ByteLevel'}");
    expect_ids(t, "ByteLevel prefix", s, false, false, IDS(10, 1, 2, 3, 4, 5, 6, 7, 8, 9));
    expect_decode(t, "ByteLevel prefix decode", IDS(10, 1), " Hello my");
    kiln_tokenizer_destroy(t);
    t = whole(vocab, "{'type': 'ByteLevel', 'add_prefix_space': false, 'use_regex': false}", NULL,
              NULL);
    expect_ids(t, "ByteLevel no regex", "Hello my", false, false, IDS(11));
    kiln_tokenizer_destroy(t);
    /* bytes outside ASCII map to the GPT-2 alphabet: "é" = C3 A9 -> "Ã©" */
    t = whole("'\\u00c3\\u00a9': 0", "{'type': 'ByteLevel', 'add_prefix_space': false}", NULL,
              "{'type': 'ByteLevel'}");
    expect_ids(t, "ByteLevel bytes", "\xC3\xA9", false, false, IDS(0));
    expect_decode(t, "ByteLevel bytes decode", IDS(0), "\xC3\xA9");
    kiln_tokenizer_destroy(t);
}

static void test_digits_whitespace(void) {
    const char *vocab = "'Hey ': 0, '123': 1, ' friend!': 2, '1': 3, '2': 4, '3': 5";
    kiln_tokenizer *t = whole(vocab, "{'type': 'Digits', 'individual_digits': false}", NULL, NULL);
    expect_ids(t, "Digits", "Hey 123 friend!", false, false, IDS(0, 1, 2));
    kiln_tokenizer_destroy(t);
    t = whole(vocab, "{'type': 'Digits', 'individual_digits': true}", NULL, NULL);
    expect_ids(t, "Digits individual", "Hey 123 friend!", false, false, IDS(0, 3, 4, 5, 2));
    kiln_tokenizer_destroy(t);

    vocab = "'How': 0, 'are': 1, 'you': 2, 'doing': 3, '?': 4, 'Hey': 5, 'man': 6, '!': 7, "
            "'man!': 8, 'friend': 9";
    t = whole(vocab, "{'type': 'Whitespace'}", NULL, NULL);
    expect_ids(t, "Whitespace", "How are you doing?", false, false, IDS(0, 1, 2, 3, 4));
    expect_ids(t, "Whitespace 2", "Hey man!", false, false, IDS(5, 6, 7));
    kiln_tokenizer_destroy(t);
    t = whole(vocab, "{'type': 'WhitespaceSplit'}", NULL, NULL);
    expect_ids(t, "WhitespaceSplit", "Hey man!", false, false, IDS(5, 8));
    kiln_tokenizer_destroy(t);
    t = whole(vocab, "{'type': 'BertPreTokenizer'}", NULL, NULL);
    expect_ids(t, "BertPreTokenizer", "Hey friend!     How are you?!?", false, false,
               IDS(5, 9, 7, 0, 1, 2, 4, 7, 4));
    kiln_tokenizer_destroy(t);
    t = whole(vocab,
              "{'type': 'Sequence', 'pretokenizers': [{'type': 'WhitespaceSplit'}, "
              "{'type': 'Punctuation', 'behavior': 'Isolated'}]}",
              NULL, NULL);
    expect_ids(t, "Sequence(WhitespaceSplit, Punctuation)", "Hey man!", false, false, IDS(5, 6, 7));
    kiln_tokenizer_destroy(t);
    t = whole("'a': 0, 'b': 1", "{'type': 'CharDelimiterSplit', 'delimiter': 'x'}", NULL, NULL);
    expect_ids(t, "CharDelimiterSplit", "axbxxa", false, false, IDS(0, 1, 0));
    kiln_tokenizer_destroy(t);
}

/* ---- normalizers --------------------------------------------------------------------------- */

static void norm_case(const char *label, const char *norm, const char *in, const char *out_json) {
    char vocab[256];
    snprintf(vocab, sizeof vocab, "'%s': 0", out_json);
    kiln_tokenizer *t = whole(vocab, "null", norm, NULL);
    expect_ids(t, label, in, false, false, IDS(0));
    kiln_tokenizer_destroy(t);
}

static void test_normalizers(void) {
    norm_case("NFC", "{'type': 'NFC'}", "e\xCC\x81", "\\u00e9");
    norm_case("NFKC", "{'type': 'NFKC'}", "\xEF\xAC\x81", "fi");
    norm_case("NFD", "{'type': 'NFD'}", "\xC3\xA9", "e\\u0301");
    norm_case("NFKD", "{'type': 'NFKD'}", "\xEF\xAC\x81\xC3\xA9", "fie\\u0301");
    norm_case("Lowercase", "{'type': 'Lowercase'}", "HeLLo \xC3\x89", "hello \\u00e9");
    norm_case("Lowercase dotted I", "{'type': 'Lowercase'}", "\xC4\xB0", "i\\u0307");
    norm_case("Strip", "{'type': 'Strip', 'strip_left': true, 'strip_right': true}",
              " \t hi \xE3\x80\x80", "hi");
    norm_case("Strip left", "{'type': 'Strip', 'strip_left': true, 'strip_right': false}", "  hi ",
              "hi ");
    norm_case("Replace regex", "{'type': 'Replace', 'pattern': {'Regex': ' +'}, 'content': '_'}",
              "a  b c", "a_b_c");
    norm_case("Prepend+Replace",
              "{'type': 'Sequence', 'normalizers': [{'type': 'Prepend', 'prepend': '\\u2581'}, "
              "{'type': 'Replace', 'pattern': {'String': ' '}, 'content': '\\u2581'}]}",
              "a b", "\\u2581a\\u2581b");
    norm_case("NFD+StripAccents",
              "{'type': 'Sequence', 'normalizers': [{'type': 'NFD'}, {'type': 'StripAccents'}]}",
              "caf\xC3\xA9", "cafe");
    norm_case("BertNormalizer",
              "{'type': 'BertNormalizer', 'clean_text': true, 'handle_chinese_chars': true, "
              "'strip_accents': null, 'lowercase': true}",
              "H\xC3\xA9llo\tW\x01ORLD", "hello world");
    norm_case("BertNormalizer chinese", "{'type': 'BertNormalizer', 'lowercase': false}",
              "\xE4\xB8\xAD", " \\u4e2d ");
    /* Prepend only applies to non-empty text: the empty input stays empty */
    kiln_tokenizer *t =
        whole("'\\u2581': 0", "null", "{'type': 'Prepend', 'prepend': '\\u2581'}", NULL);
    expect_ids(t, "Prepend empty", "", false, false, NONE);
    kiln_tokenizer_destroy(t);
}

/* ---- added tokens ---------------------------------------------------------------------------- */

/* char-level BPE over a..e, space, <, >, s, /, m, x, y, plus added tokens */
static const char *CHARS = "'a': 0, 'b': 1, 'c': 2, 'd': 3, 'e': 4, ' ': 5, '<': 6, '>': 7, "
                           "'s': 8, '/': 9, 'm': 10, 'x': 11, 'y': 12, 'h': 13, 'l': 14, "
                           "'o': 15, 'H': 16, 'L': 17, 'O': 18, 'E': 19";

static void test_added(void) {
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{'model': {'type': 'BPE', 'vocab': {%s}, 'merges': []}, 'added_tokens': ["
             "{'id': 30, 'content': '<s>', 'special': true},"
             "{'id': 31, 'content': 'ab', 'single_word': true, 'special': false},"
             "{'id': 32, 'content': '<m>', 'lstrip': true, 'rstrip': true, 'special': false},"
             "{'id': 33, 'content': 'abc', 'special': false},"
             "{'id': 34, 'content': 'bcde', 'special': false},"
             "{'id': 35, 'content': 'x', 'special': false}]}",
             CHARS);
    kiln_tokenizer *t = load(buf);
    /* special tokens only with parse_special */
    expect_ids(t, "special parsed", "a<s>b", false, true, IDS(0, 30, 1));
    expect_ids(t, "special not parsed", "a<s>b", false, false, IDS(0, 6, 8, 7, 1));
    /* single_word: not inside a word */
    expect_ids(t, "single_word", "ab cab", false, false, IDS(31, 5, 2, 0, 1));
    /* lstrip/rstrip take the surrounding whitespace */
    expect_ids(t, "lstrip rstrip", "a  <m>  b", false, false, IDS(0, 32, 1));
    /* leftmost-longest: "abc" at 0 wins over "bcde" at 1 */
    expect_ids(t, "leftmost longest", "abcde", false, false, IDS(33, 3, 4));
    /* a content that is a model token gets the model's id */
    expect_ids(t, "added = model token", "x", false, false, IDS(11));
    CHECK(kiln_tokenizer_n_vocab(t) == 35); /* ids 20..29 unused, 35 became 11 */
    kiln_tokenizer_destroy(t);

    /* normalized tokens match the normalized text; non-normalized ones the raw text */
    snprintf(buf, sizeof buf,
             "{'model': {'type': 'BPE', 'vocab': {%s}, 'merges': []}, "
             "'normalizer': {'type': 'Lowercase'}, 'added_tokens': ["
             "{'id': 40, 'content': 'hello', 'normalized': true, 'special': false},"
             "{'id': 41, 'content': 'EL', 'normalized': false, 'special': false}]}",
             CHARS);
    t = load(buf);
    expect_ids(t, "normalized added", "HeLlo", false, false, IDS(40));
    /* raw tokens are split out first: "EL" inside "HELLO" wins over "hello" */
    expect_ids(t, "raw before normalized", "HELLO", false, false, IDS(13, 41, 14, 15));
    expect_ids(t, "raw added", "HELO", false, false, IDS(13, 41, 15));
    kiln_tokenizer_destroy(t);
}

/* ---- models -------------------------------------------------------------------------------- */

static void test_bpe(void) {
    /* tokenizers' BPE test: "unrelated" merges all the way */
    const char *vocab = "'u': 0, 'n': 1, 'r': 2, 'e': 3, 'l': 4, 'a': 5, 't': 6, 'd': 7, "
                        "'re': 8, 'at': 9, 'ed': 10, 'un': 11, 'ated': 12, 'rel': 13, "
                        "'related': 14, 'unrelated': 15";
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{'model': {'type': 'BPE', 'vocab': {%s}, 'merges': ['r e', 'a t', 'e d', 'u n', "
             "'at ed', 're l', 'rel ated', 'un related']}}",
             vocab);
    kiln_tokenizer *t = load(buf);
    expect_ids(t, "BPE unrelated", "unrelated", false, false, IDS(15));
    expect_ids(t, "BPE related", "related", false, false, IDS(14));
    expect_ids(t, "BPE partial", "rated", false, false, IDS(2, 12));
    kiln_tokenizer_destroy(t);
    snprintf(buf, sizeof buf,
             "{'model': {'type': 'BPE', 'vocab': {%s}, 'merges': [['r', 'e'], ['a', 't'], "
             "['e', 'd'], ['u', 'n'], ['at', 'ed'], ['re', 'l'], ['rel', 'ated'], "
             "['un', 'related']]}}",
             vocab);
    t = load(buf);
    expect_ids(t, "BPE pairs", "unrelated", false, false, IDS(15));
    kiln_tokenizer_destroy(t);

    /* byte_fallback (tokenizers' test): 'c' -> unk, 'a' -> <0x61>; newline */
    t = load("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'byte_fallback': true, "
             "'vocab': {'<unk>': 0, '<0x61>': 1, '<0x0A>': 2}, 'merges': []}}");
    expect_ids(t, "byte_fallback unk", "c", false, false, IDS(0));
    expect_ids(t, "byte_fallback", "a", false, false, IDS(1));
    expect_ids(t, "byte_fallback newline", "\n", false, false, IDS(2));
    kiln_tokenizer_destroy(t);

    /* fuse_unk */
    t = load("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': true, "
             "'vocab': {'<unk>': 0, 'a': 1}, 'merges': []}}");
    expect_ids(t, "fuse_unk", "xxa\xC3\xA9y", false, false, IDS(0, 1, 0));
    kiln_tokenizer_destroy(t);
    t = load("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, "
             "'vocab': {'<unk>': 0, 'a': 1}, 'merges': []}}");
    expect_ids(t, "no fuse_unk", "xxa", false, false, IDS(0, 0, 1));
    kiln_tokenizer_destroy(t);
    /* no unk_token: unknown characters are dropped */
    t = load("{'model': {'type': 'BPE', 'vocab': {'a': 0}, 'merges': []}}");
    expect_ids(t, "no unk", "xax", false, false, IDS(0));
    kiln_tokenizer_destroy(t);

    /* ignore_merges */
    const char *v2 = "'a': 0, 'b': 1, 'c': 2, 'ab': 3, 'bc': 4, 'abc': 5";
    snprintf(buf, sizeof buf,
             "{'model': {'type': 'BPE', 'ignore_merges': false, 'vocab': {%s}, "
             "'merges': ['b c', 'a b']}}",
             v2);
    t = load(buf);
    expect_ids(t, "merges", "abc", false, false, IDS(0, 4));
    kiln_tokenizer_destroy(t);
    snprintf(buf, sizeof buf,
             "{'model': {'type': 'BPE', 'ignore_merges': true, 'vocab': {%s}, "
             "'merges': ['b c', 'a b']}}",
             v2);
    t = load(buf);
    expect_ids(t, "ignore_merges", "abc", false, false, IDS(5));
    kiln_tokenizer_destroy(t);
    /* a repeated merge takes its later rank (tokenizers builds a HashMap) */
    snprintf(buf, sizeof buf,
             "{'model': {'type': 'BPE', 'vocab': {%s}, 'merges': ['a b', 'b c', 'a b']}}", v2);
    t = load(buf);
    expect_ids(t, "repeated merge", "abc", false, false, IDS(0, 4));
    kiln_tokenizer_destroy(t);
    /* ties: the leftmost pair first */
    t = load("{'model': {'type': 'BPE', 'vocab': {'a': 0, 'aa': 1}, 'merges': ['a a']}}");
    expect_ids(t, "leftmost", "aaa", false, false, IDS(1, 0));
    kiln_tokenizer_destroy(t);
    /* continuing_subword_prefix and end_of_word_suffix */
    t = load("{'model': {'type': 'BPE', 'continuing_subword_prefix': '##', "
             "'vocab': {'a': 0, '##b': 1, 'ab': 2, '##c': 3}, 'merges': [['a', '##b']]}}");
    expect_ids(t, "subword prefix", "abc", false, false, IDS(2, 3));
    kiln_tokenizer_destroy(t);
    t = load("{'model': {'type': 'BPE', 'end_of_word_suffix': '</w>', "
             "'vocab': {'a': 0, 'b</w>': 1, 'ab</w>': 2}, 'merges': [['a', 'b</w>']]}}");
    expect_ids(t, "end_of_word_suffix", "ab", false, false, IDS(2));
    kiln_tokenizer_destroy(t);
    /* "#version" lines of merges.txt are skipped */
    t = load("{'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1, 'ab': 2}, "
             "'merges': ['#version: 0.2', 'a b']}}");
    expect_ids(t, "#version", "ab", false, false, IDS(2));
    kiln_tokenizer_destroy(t);
}

static void test_wordpiece(void) {
    kiln_tokenizer *t =
        load("{'model': {'type': 'WordPiece', 'unk_token': '[UNK]', "
             "'continuing_subword_prefix': '##', 'max_input_chars_per_word': 9, "
             "'vocab': {'[UNK]': 0, 'un': 1, '##aff': 2, '##able': 3, 'runn': 4, '##ing': 5}}, "
             "'pre_tokenizer': {'type': 'WhitespaceSplit'}, "
             "'decoder': {'type': 'WordPiece', 'prefix': '##', 'cleanup': true}}");
    expect_ids(t, "WordPiece", "unaffable running", false, false, IDS(1, 2, 3, 4, 5));
    expect_ids(t, "WordPiece unk", "unaffx", false, false, IDS(0));
    expect_ids(t, "WordPiece too long", "unaffableun", false, false, IDS(0));
    expect_decode(t, "WordPiece decode", IDS(1, 2, 3, 4, 5), "unaffable running");
    kiln_tokenizer_destroy(t);
    t = load("{'model': {'type': 'WordPiece', 'vocab': {'[UNK]': 0, 'i': 1, 'do': 2, "
             "'not': 3, '.': 4, 'it': 5, '##s': 6}}, "
             "'decoder': {'type': 'WordPiece'}}");
    /* cleanup works per token: " ." becomes "." */
    expect_decode(t, "WordPiece cleanup", IDS(1, 2, 3, 4), "i do not.");
    kiln_tokenizer_destroy(t);
}

static void test_wordlevel(void) {
    kiln_tokenizer *t = load("{'model': {'type': 'WordLevel', 'unk_token': '<unk>', "
                             "'vocab': {'<unk>': 0, 'hello': 1, 'world': 2}}, "
                             "'pre_tokenizer': {'type': 'Whitespace'}}");
    expect_ids(t, "WordLevel", "hello there world", false, false, IDS(1, 0, 2));
    kiln_tokenizer_destroy(t);
}

/* ---- decoders -------------------------------------------------------------------------- */

static void test_decoders(void) {
    /* Llama (legacy) decoder: Replace, ByteFallback, Fuse, Strip */
    kiln_tokenizer *t =
        load("{'model': {'type': 'BPE', 'byte_fallback': true, 'vocab': {'<unk>': 0, '<s>': 1, "
             "'\\u2581Hello': 2, '\\u2581world': 3, '<0x21>': 4, '<0xE4>': 5, '<0xBD>': 6, "
             "'<0xA0>': 7, '\\u2581': 8}, 'merges': []}, "
             "'added_tokens': [{'id': 1, 'content': '<s>', 'special': true}], "
             "'decoder': {'type': 'Sequence', 'decoders': [{'type': 'Replace', "
             "'pattern': {'String': '\\u2581'}, 'content': ' '}, {'type': 'ByteFallback'}, "
             "{'type': 'Fuse'}, {'type': 'Strip', 'content': ' ', 'start': 1, 'stop': 0}]}}");
    expect_decode(t, "llama decode", IDS(1, 2, 3, 4), "Hello world!");
    expect_decode(t, "llama decode bytes", IDS(2, 5, 6, 7), "Hello\xE4\xBD\xA0");
    expect_decode(t, "llama decode invalid", IDS(2, 5), "Hello\xEF\xBF\xBD");
    expect_decode(t, "llama decode space first", IDS(8, 8, 2), "  Hello");
    char piece[32];
    CHECK(kiln_tokenizer_piece(t, 2, false, piece, sizeof piece) == 6 &&
          !memcmp(piece, " Hello", 6));
    CHECK(kiln_tokenizer_piece(t, 1, false, piece, sizeof piece) == 0);
    CHECK(kiln_tokenizer_piece(t, 1, true, piece, sizeof piece) == 3 && !memcmp(piece, "<s>", 3));
    CHECK(kiln_tokenizer_piece(t, 4, false, piece, sizeof piece) == 1 && piece[0] == '!');
    kiln_tokenizer_destroy(t);

    /* Metaspace decoder: the first token loses its replacement characters */
    const char *fmt = "{'model': {'type': 'BPE', 'vocab': {'\\u2581Hey': 0, '\\u2581friend': 1, "
                      "'<s>': 2}, 'merges': []}, 'added_tokens': [{'id': 2, 'content': '<s>', "
                      "'special': true}], 'decoder': {'type': 'Metaspace', 'replacement': "
                      "'\\u2581', 'prepend_scheme': '%s'}}";
    char buf[1024];
    snprintf(buf, sizeof buf, fmt, "always");
    t = load(buf);
    expect_decode(t, "Metaspace decode", IDS(2, 0, 1), "Hey friend");
    kiln_tokenizer_destroy(t);
    snprintf(buf, sizeof buf, fmt, "never");
    t = load(buf);
    expect_decode(t, "Metaspace decode never", IDS(0, 1), " Hey friend");
    kiln_tokenizer_destroy(t);

    /* Strip without Fuse works on every token; Replace with a regex */
    t = load("{'model': {'type': 'BPE', 'vocab': {'-a-': 0, '-b-': 1, 'x1y': 2}, 'merges': []}, "
             "'decoder': {'type': 'Sequence', 'decoders': [{'type': 'Strip', 'content': '-', "
             "'start': 1, 'stop': 1}, {'type': 'Replace', 'pattern': {'Regex': '[0-9]'}, "
             "'content': '#'}]}}");
    expect_decode(t, "Strip per token", IDS(0, 1, 2), "abx#y");
    kiln_tokenizer_destroy(t);

    /* no decoder: tokens joined with spaces */
    t = load("{'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1}, 'merges': []}}");
    expect_decode(t, "no decoder", IDS(0, 1, 0), "a b a");
    kiln_tokenizer_destroy(t);

    /* BPEDecoder: the suffix becomes a space */
    t = load("{'model': {'type': 'BPE', 'vocab': {'hel': 0, 'lo</w>': 1, 'wor': 2, 'ld</w>': 3}, "
             "'merges': []}, 'decoder': {'type': 'BPEDecoder', 'suffix': '</w>'}}");
    expect_decode(t, "BPEDecoder", IDS(0, 1, 2, 3), "hello world ");
    kiln_tokenizer_destroy(t);
}

/* ---- post-processor, tokenizer_config.json ------------------------------------------------ */

static void test_post_and_config(void) {
    const char *base = "{'model': {'type': 'BPE', 'vocab': {'<s>': 0, '</s>': 1, 'a': 2, "
                       "'<pad>': 3}, 'merges': []}, 'added_tokens': [{'id': 0, 'content': '<s>', "
                       "'special': true}, {'id': 1, 'content': '</s>', 'special': true}], "
                       "'post_processor': %s}";
    char buf[2048];
    snprintf(buf, sizeof buf, base,
             "{'type': 'TemplateProcessing', 'single': '<s> $A </s>', 'pair': '<s> $A </s> $B:1', "
             "'special_tokens': {'<s>': {'id': '<s>', 'ids': [0], 'tokens': ['<s>']}, "
             "'</s>': {'id': '</s>', 'ids': [1], 'tokens': ['</s>']}}}");
    kiln_tokenizer *t = load(buf);
    expect_ids(t, "template string", "aa", true, false, IDS(0, 2, 2, 1));
    expect_ids(t, "template off", "aa", false, false, IDS(2, 2));
    expect_ids(t, "template empty", "", true, false, IDS(0, 1));
    CHECK(t && kiln_tokenizer_bos(t) == 0 && kiln_tokenizer_eos(t) == 1);
    kiln_tokenizer_destroy(t);
    snprintf(buf, sizeof buf, base,
             "{'type': 'Sequence', 'processors': [{'type': 'ByteLevel', 'trim_offsets': false}, "
             "{'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': '<s>', "
             "'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}}], "
             "'special_tokens': {'<s>': {'id': '<s>', 'ids': [0], 'tokens': ['<s>']}}}]}");
    t = load(buf);
    expect_ids(t, "template objects", "a", true, false, IDS(0, 2));
    kiln_tokenizer_destroy(t);
    snprintf(buf, sizeof buf, base,
             "{'type': 'RobertaProcessing', 'sep': ['</s>', 1], 'cls': ['<s>', 0], "
             "'trim_offsets': true, 'add_prefix_space': true}");
    t = load(buf);
    expect_ids(t, "Roberta", "a", true, false, IDS(0, 2, 1));
    kiln_tokenizer_destroy(t);

    /* tokenizer_config.json: add_bos_token / add_eos_token rebuild the template */
    snprintf(buf, sizeof buf, base, "null");
    t = load2(buf, "{'bos_token': {'content': '<s>', 'lstrip': false}, 'eos_token': '</s>', "
                   "'pad_token': '<pad>', 'add_bos_token': true, 'add_eos_token': true, "
                   "'chat_template': [{'name': 'tool_use', 'template': 'T'}, "
                   "{'name': 'default', 'template': '{{ bos_token }}D'}]}");
    expect_ids(t, "config add_bos/eos", "a", true, false, IDS(0, 2, 1));
    CHECK(t && kiln_tokenizer_chat_template(t) &&
          !strcmp(kiln_tokenizer_chat_template(t), "{{ bos_token }}D"));
    CHECK(t && kiln_tokenizer_bos_text(t) && !strcmp(kiln_tokenizer_bos_text(t), "<s>"));
    CHECK(t && kiln_tokenizer_eos_text(t) && !strcmp(kiln_tokenizer_eos_text(t), "</s>"));
    CHECK(t && kiln_tokenizer_is_eog(t, 1) && !kiln_tokenizer_is_eog(t, 2));
    CHECK(t && kiln_tokenizer_vocab(t)->pad_id == 3);
    CHECK(t && kiln_tokenizer_add_eog(t, 3, NULL) == KILN_OK && kiln_tokenizer_is_eog(t, 3));
    CHECK(t && kiln_tokenizer_add_eog(t, 4, NULL) == KILN_ERR_INVALID_ARGUMENT);
    kiln_tokenizer_destroy(t);
    snprintf(buf, sizeof buf, base,
             "{'type': 'TemplateProcessing', 'single': '<s> $A', "
             "'special_tokens': {'<s>': {'id': '<s>', 'ids': [0], 'tokens': ['<s>']}}}");
    t = load2(buf, "{'add_bos_token': false, 'bos_token': '<s>'}");
    expect_ids(t, "config add_bos false", "a", true, false, IDS(2));
    CHECK(t && kiln_tokenizer_chat_template(t) == NULL);
    kiln_tokenizer_destroy(t);

    /* kiln_tokenizer_from_hf_dir: chat_template.jinja beside the files */
    char dir[] = "/tmp/kiln-hftok-unit-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char p[256];
    snprintf(buf, sizeof buf, base, "null");
    char *j = J(buf);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    FILE *f = fopen(p, "w");
    REQUIRE(f && fputs(j, f) >= 0 && fclose(f) == 0);
    free(j);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    f = fopen(p, "w");
    REQUIRE(f && fputs("{% for m in messages %}{{ m.content }}{% endfor %}", f) >= 0 &&
            fclose(f) == 0);
    snprintf(p, sizeof p, "%s/special_tokens_map.json", dir);
    f = fopen(p, "w");
    REQUIRE(f && fputs("{\"eos_token\": \"</s>\"}", f) >= 0 && fclose(f) == 0);
    kiln_error err = {0};
    kiln_status st = kiln_tokenizer_from_hf_dir(dir, &t, &err);
    CHECKF(st == KILN_OK, "from_hf_dir: %s", err.message);
    CHECK(t && kiln_tokenizer_chat_template(t) &&
          !strcmp(kiln_tokenizer_chat_template(t),
                  "{% for m in messages %}{{ m.content }}{% endfor %}"));
    CHECK(t && kiln_tokenizer_eos(t) == 1);
    kiln_tokenizer_destroy(t);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/special_tokens_map.json", dir);
    unlink(p);
    /* no tokenizer.json: NOT_FOUND naming the directory */
    st = kiln_tokenizer_from_hf_dir(dir, &t, &err);
    CHECK(st == KILN_ERR_NOT_FOUND && t == NULL && strstr(err.message, dir));
    CHECK(rmdir(dir) == 0);
}

int main(void) {
    test_split();
    test_metaspace();
    test_bytelevel();
    test_digits_whitespace();
    test_normalizers();
    test_added();
    test_bpe();
    test_wordpiece();
    test_wordlevel();
    test_decoders();
    test_post_and_config();
    printf("test_hftok_units: %d cases\n", n_cases);
    return kiln_test_finish("test_hftok_units");
}
