/*
 * test_bpe_pretok - regex pre-tokenizers of llama.cpp (llama-vocab.cpp llm_tokenizer_bpe,
 * unicode.cpp unicode_regex_split). Every expectation below was worked out by hand from the
 * regex definitions: each regex in the list splits every fragment into matches and the
 * unmatched gaps between them; non-ASCII White_Space is whitespace for \s, other code points
 * keep their Unicode category.
 */
#include <stdarg.h>

#include "test.h"
#include "tokenizer/pretokenize.h"

/* Split text with pre-tokenizer `pre` and compare against the NULL-terminated pieces. */
static void expect_split(const char *pre, const char *text, ...) {
    kiln_pretok *p = NULL;
    kiln_error err = {0};
    kiln_status st = kiln_pretok_create(pre, &p, &err);
    CHECKF(st == KILN_OK, "create '%s': %s", pre ? pre : "(null)", err.message);
    if (st != KILN_OK) return;
    kiln_spans sp = {0};
    size_t len = strlen(text);
    st = kiln_pretok_split(p, text, len, &sp, &err);
    CHECKF(st == KILN_OK, "split: %s", err.message);

    va_list ap;
    va_start(ap, text);
    size_t i = 0, covered = 0;
    bool ok = st == KILN_OK;
    for (const char *want; (want = va_arg(ap, const char *)) != NULL; i++) {
        if (!ok) continue;
        if (i >= sp.n) {
            ok = false;
            CHECKF(0, "[%s] %s: missing piece %zu '%s'", pre, text, i, want);
            continue;
        }
        const char *got = text + sp.data[i].off;
        if (sp.data[i].off != covered || sp.data[i].len != strlen(want) ||
            memcmp(got, want, sp.data[i].len) != 0) {
            ok = false;
            CHECKF(0, "[%s] '%s': piece %zu is '%.*s' (off %zu), want '%s'", pre ? pre : "null",
                   text, i, (int)sp.data[i].len, got, sp.data[i].off, want);
        }
        covered += sp.data[i].len;
    }
    va_end(ap);
    if (ok) {
        CHECKF(sp.n == i, "[%s] '%s': %zu pieces, want %zu", pre ? pre : "null", text, sp.n, i);
        CHECKF(covered == len, "[%s] '%s': pieces cover %zu of %zu bytes", pre, text, covered, len);
    }
    kiln_spans_free(&sp);
    kiln_pretok_destroy(p);
}

#define E(...) expect_split(__VA_ARGS__, (const char *)NULL)

int main(void) {
    /* --- GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) --- */
    E("gpt-2", "Hello world", "Hello", " world");
    /* two spaces before a word: \s+(?!\S) backs off one, the last space joins the word */
    E("gpt-2", "I'm  fine!!", "I", "'m", " ", " fine", "!!");
    E("gpt-2", "abc123 4567", "abc", "123", " 4567");
    /* "\n" before a letter matches nothing: it is left as a gap of its own */
    E("gpt-2", "a\n\nb", "a", "\n", "\n", "b");
    E("gpt-2", "x   ", "x", "   ");
    E("gpt-2", "  y", " ", " y");
    E("gpt-2", "'S", "'", "S"); /* contractions are case-sensitive in GPT-2 */
    E("gpt-2", "", (const char *)NULL);
    /* U+00A0 (NBSP) is whitespace: "a", NBSP (\s+ backs off), NBSP gap, "b" */
    E("gpt-2",
      "a\xC2\xA0\xC2\xA0"
      "b",
      "a", "\xC2\xA0", "\xC2\xA0", "b");
    /* U+180E is Cf (not White_Space): a run of two is one [^\s\p{L}\p{N}]+ piece */
    E("gpt-2",
      "\xE1\xA0\x8E\xE1\xA0\x8E"
      "b",
      "\xE1\xA0\x8E\xE1\xA0\x8E", "b");
    /* U+3000 ideographic space x2 before a letter */
    E("gpt-2", "\xE3\x80\x80\xE3\x80\x80x", "\xE3\x80\x80", "\xE3\x80\x80", "x");
    /* non-ASCII letters and digits */
    E("gpt-2", "F\xC3\xBChrer \xD9\xA3\xD9\xA4", "F\xC3\xBChrer", " \xD9\xA3\xD9\xA4");
    /* mpt and roberta-bpe share the GPT-2 regex */
    E("mpt", "I'm  fine!!", "I", "'m", " ", " fine", "!!");
    E("roberta-bpe", "a\n\nb", "a", "\n", "\n", "b");

    /* --- Llama 3 --- */
    E("llama-bpe", "Hello World", "Hello", " World");
    E("llama-bpe", "12345", "123", "45");
    E("llama-bpe", "I'M", "I", "'M"); /* contractions are case-insensitive */
    /* \s*[\r\n]+ takes "\n\n"; then "  b" -> " " + " b" */
    E("llama-bpe", "a\n\n  b", "a", "\n\n", " ", " b");
    /* punctuation swallows the newlines after it */
    E("llama-bpe", "x!!\n\ny", "x", "!!\n\n", "y");
    E("llama-bpe", "..  Hi  ", "..", " ", " Hi", "  ");
    /* one non-letter, non-digit, non-newline char may lead a word */
    E("llama-bpe", "$Hello", "$Hello");
    E("llama3", "\tab\n", "\tab", "\n");

    /* --- Qwen2: like Llama 3 but single digits --- */
    E("qwen2", "x12345", "x", "1", "2", "3", "4", "5");
    E("deepseek-r1-qwen", "I've 42", "I", "'ve", " ", "4", "2");

    /* --- StarCoder / Refact / Command-R: \p{N} isolated, then GPT-2 --- */
    E("starcoder", "abc 123", "abc", " ", "1", "2", "3");
    E("refact", "x1 y", "x", "1", " y");
    E("command-r", "a 9b", "a", " ", "9", "b");

    /* --- Falcon: punctuation runs, GPT-2, then groups of three ASCII digits --- */
    E("falcon", "Hi, 12345!", "Hi", ",", " ", "123", "45", "!");
    E("falcon", "a`b", "a", "`", "b");

    /* --- default (e.g. gpt-neox without tokenizer.ggml.pre) --- */
    E(NULL, "a+b 1234", "a", "+", "b", " ", "123", "4");
    E("default", "x == y", "x", " ", "==", " y");

    /* --- DeepSeek Coder --- */
    E("deepseek-coder", "Hi there\n12 ok.", "Hi", " there", "\n", "1", "2", " ok", ".");
    /* CJK run; digits one by one */
    E("deepseek-coder",
      "\xE4\xB8\x96\xE7\x95\x8C"
      "99",
      "\xE4\xB8\x96\xE7\x95\x8C", "9", "9");

    /* --- DeepSeek LLM --- */
    E("deepseek-llm", "Hello, \xE4\xB8\x96\xE7\x95\x8C 42  ", "Hello", ",", " ",
      "\xE4\xB8\x96\xE7\x95\x8C", " ", "42", "  ");
    E("deepseek-llm", "a\r\nb", "a", "\r", "\n", "b");

    /* --- Chameleon --- */
    E("chameleon", "<sentinel:12>ab", "<", "sentinel", ":", "1", "2", ">", "ab");

    /* --- errors --- */
    {
        kiln_pretok *p = (kiln_pretok *)1;
        kiln_error err = {0};
        CHECK(kiln_pretok_create("no-such-pre", &p, &err) == KILN_ERR_UNSUPPORTED);
        CHECK(p == NULL);
        CHECKF(strstr(err.message, "no-such-pre") != NULL, "message: %s", err.message);
    }
    /* family names and flags */
    {
        kiln_pretok *p = NULL;
        REQUIRE(kiln_pretok_create("llama-bpe", &p, NULL) == KILN_OK);
        CHECK(kiln_pretok_ignore_merges(p));
        CHECK(strcmp(kiln_pretok_family(p), "llama3") == 0);
        kiln_pretok_destroy(p);
        REQUIRE(kiln_pretok_create("gpt-2", &p, NULL) == KILN_OK);
        CHECK(!kiln_pretok_ignore_merges(p));
        kiln_pretok_destroy(p);
        REQUIRE(kiln_pretok_create("", &p, NULL) == KILN_OK);
        CHECK(strcmp(kiln_pretok_family(p), "default") == 0);
        kiln_pretok_destroy(p);
    }
    /* malformed UTF-8 is not fatal and the pieces still cover the input */
    {
        kiln_pretok *p = NULL;
        REQUIRE(kiln_pretok_create("llama-bpe", &p, NULL) == KILN_OK);
        kiln_spans sp = {0};
        const char bad[] = "ab\xFF\xC3 c";
        CHECK(kiln_pretok_split(p, bad, sizeof bad - 1, &sp, NULL) == KILN_OK);
        size_t cov = 0;
        for (size_t i = 0; i < sp.n; i++) {
            CHECK(sp.data[i].off == cov && sp.data[i].len > 0);
            cov += sp.data[i].len;
        }
        CHECK(cov == sizeof bad - 1);
        kiln_spans_free(&sp);
        kiln_pretok_destroy(p);
    }
    /* every listed pre type compiles */
    const char *all[] = {"default",
                         "llama3",
                         "llama-v3",
                         "llama-bpe",
                         "falcon3",
                         "dbrx",
                         "smaug-bpe",
                         "deepseek-llm",
                         "deepseek-coder",
                         "falcon",
                         "mpt",
                         "starcoder",
                         "gpt-2",
                         "refact",
                         "command-r",
                         "qwen2",
                         "deepseek-r1-qwen",
                         "stablelm2",
                         "olmo",
                         "poro-chat",
                         "chatglm-bpe",
                         "viking",
                         "jais",
                         "tekken",
                         "smollm",
                         "codeshell",
                         "bloom",
                         "gpt3-finnish",
                         "exaone",
                         "chameleon",
                         "minerva-7b",
                         "megrez",
                         "gpt-4o",
                         "llama4",
                         "seed-coder",
                         "grok-2",
                         "bailingmoe",
                         "roberta-bpe",
                         "trillion"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        kiln_pretok *p = NULL;
        kiln_error err = {0};
        CHECKF(kiln_pretok_create(all[i], &p, &err) == KILN_OK, "%s: %s", all[i], err.message);
        kiln_pretok_destroy(p);
    }
    return kiln_test_finish("test_bpe_pretok");
}
