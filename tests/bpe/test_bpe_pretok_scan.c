/*
 * test_bpe_pretok_scan - cross-checks the PCRE2-based pre-tokenizers against independent
 * hand-written scanners of the same regexes (written from the regex semantics: leftmost
 * alternative wins, greedy runs, \s+(?!\S) backs off one whitespace before a non-space,
 * \s*[\r\n]+ ends after the last CR/LF of a whitespace run, unmatched characters form gaps).
 * Inputs: every string of ../shared/tokenizer/ggml-vocab-*.inp (including the llama-bpe,
 * qwen2 and command-r files whose vocabs are absent) and random strings over an alphabet of
 * tricky characters. Unicode categories (\p{L}, \p{N}) come from single-character PCRE2
 * matches; whitespace is Unicode White_Space.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>

#include "test.h"
#include "tokenizer/pretokenize.h"

static pcre2_code *re_l, *re_n;

static size_t utf8_put(uint32_t c, char *o) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static bool has_prop(pcre2_code *re, uint32_t c) {
    char b[4];
    size_t n = utf8_put(c, b);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)b, n, 0, PCRE2_ANCHORED, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static bool is_l(uint32_t c) {
    return has_prop(re_l, c);
}
static bool is_n(uint32_t c) {
    return has_prop(re_n, c);
}
static bool is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}
static bool is_other(uint32_t c) {
    return !is_ws(c) && !is_l(c) && !is_n(c);
}
static uint32_t lower(uint32_t c) {
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* Contractions at i; returns the match length or 0. */
static size_t contraction(const uint32_t *cp, size_t n, size_t i, bool icase) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = icase ? lower(cp[i + 1]) : cp[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    uint32_t b = icase ? lower(cp[i + 2]) : cp[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

static size_t ws_run(const uint32_t *cp, size_t n, size_t i) {
    size_t k = i;
    while (k < n && is_ws(cp[k])) k++;
    return k;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
static size_t match_gpt2(const uint32_t *cp, size_t n, size_t i) {
    size_t m = contraction(cp, n, i, false);
    if (m) return m;
    size_t j = i + (cp[i] == ' ' && i + 1 < n ? 1 : 0);
    if (is_l(cp[j])) {
        while (j < n && is_l(cp[j])) j++;
        return j - i;
    }
    j = i + (cp[i] == ' ' && i + 1 < n ? 1 : 0);
    if (is_n(cp[j])) {
        while (j < n && is_n(cp[j])) j++;
        return j - i;
    }
    j = i + (cp[i] == ' ' && i + 1 < n ? 1 : 0);
    if (is_other(cp[j])) {
        while (j < n && is_other(cp[j])) j++;
        return j - i;
    }
    size_t k = ws_run(cp, n, i);
    if (k > i && k == n) return k - i;
    if (k - i >= 2) return k - i - 1;
    return 0;
}

/* Llama 3 (digits=3) / Qwen2 (digits=1): (?:'[sS]|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,d}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(const uint32_t *cp, size_t n, size_t i, size_t digits) {
    size_t m = contraction(cp, n, i, true);
    if (m) return m;
    uint32_t c = cp[i];
    if (c != '\r' && c != '\n' && !is_l(c) && !is_n(c) && i + 1 < n && is_l(cp[i + 1])) {
        size_t j = i + 1;
        while (j < n && is_l(cp[j])) j++;
        return j - i;
    }
    if (is_l(c)) {
        size_t j = i;
        while (j < n && is_l(cp[j])) j++;
        return j - i;
    }
    if (is_n(c)) {
        size_t j = i;
        while (j < n && j - i < digits && is_n(cp[j])) j++;
        return j - i;
    }
    size_t j = i + (c == ' ' && i + 1 < n && is_other(cp[i + 1]) ? 1 : 0);
    if (is_other(cp[j])) {
        while (j < n && is_other(cp[j])) j++;
        while (j < n && (cp[j] == '\r' || cp[j] == '\n')) j++;
        return j - i;
    }
    size_t k = ws_run(cp, n, i);
    size_t last_nl = 0;
    for (size_t t = i; t < k; t++)
        if (cp[t] == '\r' || cp[t] == '\n') last_nl = t + 1;
    if (last_nl) return last_nl - i;
    if (k > i && k == n) return k - i;
    if (k - i >= 2) return k - i - 1;
    return k - i; /* \s+, or 0 */
}

/* Split into code point spans with the scanner; returns byte spans. */
static size_t scan(int kind, const char *text, size_t len, kiln_span *out) {
    uint32_t cp[1024];
    size_t off[1025], n = 0;
    for (size_t i = 0; i < len;) {
        unsigned char b = (unsigned char)text[i];
        size_t l = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        uint32_t c = l == 1 ? b : l == 2 ? b & 0x1F : l == 3 ? b & 0x0F : b & 0x07;
        for (size_t k = 1; k < l; k++) c = (c << 6) | ((unsigned char)text[i + k] & 0x3F);
        off[n] = i;
        cp[n++] = c;
        i += l;
    }
    off[n] = len;
    size_t ns = 0, gap = 0;
    for (size_t i = 0; i < n;) {
        size_t m = kind == 0   ? match_gpt2(cp, n, i)
                   : kind == 1 ? match_llama3(cp, n, i, 3)
                               : match_llama3(cp, n, i, 1);
        if (!m) {
            i++;
            continue;
        }
        if (i > gap) out[ns++] = (kiln_span){off[gap], off[i] - off[gap]};
        out[ns++] = (kiln_span){off[i], off[i + m] - off[i]};
        i += m;
        gap = i;
    }
    if (n > gap) out[ns++] = (kiln_span){off[gap], len - off[gap]};
    return ns;
}

static const char *kinds[] = {"gpt-2", "llama-bpe", "qwen2"};
static kiln_pretok *pt[3];
static int n_compared;

static void compare(const char *text, size_t len) {
    if (len > 1000) return;
    for (int k = 0; k < 3; k++) {
        kiln_span want[2048];
        size_t nw = scan(k, text, len, want);
        kiln_spans got = {0};
        REQUIRE(kiln_pretok_split(pt[k], text, len, &got, NULL) == KILN_OK);
        bool ok = got.n == nw;
        for (size_t i = 0; ok && i < nw; i++)
            ok = got.data[i].off == want[i].off && got.data[i].len == want[i].len;
        if (!ok) {
            fprintf(stderr, "[%s] \"%.*s\":\n  scanner:", kinds[k], (int)len, text);
            for (size_t i = 0; i < nw; i++)
                fprintf(stderr, " [%.*s]", (int)want[i].len, text + want[i].off);
            fprintf(stderr, "\n  pcre2:  ");
            for (size_t i = 0; i < got.n; i++)
                fprintf(stderr, " [%.*s]", (int)got.data[i].len, text + got.data[i].off);
            fprintf(stderr, "\n");
        }
        CHECK(ok);
        n_compared++;
        kiln_spans_free(&got);
    }
}

int main(void) {
    int ec;
    PCRE2_SIZE eo;
    re_l = pcre2_compile((PCRE2_SPTR) "\\p{L}", PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    re_n = pcre2_compile((PCRE2_SPTR) "\\p{N}", PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    REQUIRE(re_l && re_n);
    for (int k = 0; k < 3; k++) REQUIRE(kiln_pretok_create(kinds[k], &pt[k], NULL) == KILN_OK);

    /* the conformance-suite strings */
    static const char *files[] = {"gpt-2", "llama-bpe", "qwen2", "command-r", "deepseek-llm"};
    int n_files = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf.inp", files[f]);
        FILE *fp = fopen(kiln_test_shared(rel), "rb");
        if (!fp) continue;
        n_files++;
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf - 1, fp);
        fclose(fp);
        buf[n] = 0;
        static const char sep[] = "\n__ggml_vocab_test__\n";
        for (char *p = buf, *e; (e = strstr(p, sep)) != NULL; p = e + sizeof sep - 1)
            compare(p, (size_t)(e - p));
    }

    /* random strings over tricky characters */
    static const char *alpha[] = {" ",
                                  "\n",
                                  "\r",
                                  "\t",
                                  "\v",
                                  "a",
                                  "Z",
                                  "s",
                                  "S",
                                  "'",
                                  "1",
                                  "7",
                                  "!",
                                  ".",
                                  "$",
                                  "é",
                                  "中",
                                  "٣",
                                  "\xC2\xA0",
                                  "\xE3\x80\x80",
                                  "\xE1\xA0\x8E",
                                  "\xC2\x85",
                                  "\xF0\x9F\xA6\x99",
                                  "ll",
                                  "ve",
                                  "\xCC\x81"};
    const size_t na = sizeof alpha / sizeof alpha[0];
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int t = 0; t < 3000; t++) {
        char s[256];
        size_t len = 0;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int parts = (int)((rng >> 33) % 14);
        for (int q = 0; q < parts; q++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = alpha[(rng >> 33) % na];
            memcpy(s + len, a, strlen(a));
            len += strlen(a);
        }
        compare(s, len);
    }
    printf("%d splits compared (%d .inp files)\n", n_compared, n_files);
    for (int k = 0; k < 3; k++) kiln_pretok_destroy(pt[k]);
    pcre2_code_free(re_l);
    pcre2_code_free(re_n);
    return kiln_test_finish("test_bpe_pretok_scan");
}
