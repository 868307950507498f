/*
 * test_stop.c - stop token ids and the incremental stop-string matcher (src/engine/stop.h).
 * Usage: test_stop <case>. Expected outputs are written from the documented rule (earliest
 * start wins, same start: shortest, the stop string is not emitted) or computed by a
 * whole-text reference matcher in this file.
 */
#include <stdint.h>

#include "engine/stop.h"
#include "test.h"

/* Run a stream through a matcher: feed each chunk, concatenate the emitted text, flush at the
 * end when nothing matched. Returns the stop index (-1 = none). Checks the invariants on the
 * way: held text is bounded, emitted text is valid UTF-8 piece by piece. */
static bool utf8_ok(const char *s, size_t n);
static int32_t run(const char *const *stops, int32_t n_stops, const char *const *chunks,
                   int n_chunks, char *out, size_t cap) {
    kiln_stop_matcher *m = NULL;
    REQUIRE(kiln_stop_matcher_create(stops, n_stops, &m, NULL) == KILN_OK);
    size_t len = 0;
    int32_t idx = -1;
    for (int i = 0; i < n_chunks; i++) {
        kiln_stop_result r;
        REQUIRE(kiln_stop_matcher_feed(m, chunks[i], strlen(chunks[i]), &r, NULL) == KILN_OK);
        REQUIRE(r.text != NULL && len + r.len < cap);
        CHECK(utf8_ok(r.text, r.len));
        CHECK(kiln_stop_matcher_held(m) < KILN_STOP_MAX_BYTES);
        memcpy(out + len, r.text, r.len);
        len += r.len;
        if (idx >= 0) CHECK(r.len == 0 && r.stop_index == idx); /* finished: nothing more */
        if (r.stop_index >= 0) idx = r.stop_index;
    }
    kiln_stop_result r;
    kiln_stop_matcher_flush(m, &r);
    REQUIRE(r.text != NULL && len + r.len < cap);
    CHECK(utf8_ok(r.text, r.len));
    if (idx >= 0) CHECK(r.len == 0 && r.stop_index == idx);
    idx = r.stop_index;
    memcpy(out + len, r.text, r.len);
    len += r.len;
    out[len] = 0;
    CHECK(kiln_stop_matcher_matched(m) == idx);
    CHECK(kiln_stop_matcher_held(m) == 0);
    kiln_stop_matcher_destroy(m);
    return idx;
}

static bool utf8_ok(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (l == 0 || i + l > n) return false;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += l;
    }
    return true;
}

#define STREAM(stops, chunks, want_text, want_idx)                                                 \
    do {                                                                                           \
        char buf_[2048];                                                                           \
        int32_t idx_ = run(stops, (int32_t)(sizeof(stops) / sizeof(stops[0])), chunks,             \
                           (int)(sizeof(chunks) / sizeof(chunks[0])), buf_, sizeof buf_);          \
        CHECKF(strcmp(buf_, want_text) == 0 && idx_ == want_idx,                                   \
               "line %d: got '%s' (stop %d), want '%s' (stop %d)", __LINE__, buf_, idx_,           \
               want_text, want_idx);                                                               \
    } while (0)

static void feed_expect(kiln_stop_matcher *m, const char *chunk, const char *emit, int32_t idx,
                        size_t held) {
    kiln_stop_result r;
    REQUIRE(kiln_stop_matcher_feed(m, chunk, strlen(chunk), &r, NULL) == KILN_OK);
    CHECKF(r.len == strlen(emit) && memcmp(r.text, emit, r.len) == 0 && r.stop_index == idx &&
               kiln_stop_matcher_held(m) == held,
           "feed '%s': emitted '%.*s' (stop %d, held %zu), want '%s' (stop %d, held %zu)", chunk,
           (int)r.len, r.text, r.stop_index, kiln_stop_matcher_held(m), emit, idx, held);
}

static void test_split_and_first(void) {
    /* a stop string split across many tokens, step by step */
    const char *s1[] = {"###"};
    kiln_stop_matcher *m = NULL;
    REQUIRE(kiln_stop_matcher_create(s1, 1, &m, NULL) == KILN_OK);
    feed_expect(m, "Hello", "Hello", -1, 0);
    feed_expect(m, " #", " ", -1, 1);
    feed_expect(m, "#", "", -1, 2);
    feed_expect(m, "# world", "", 0, 0);
    feed_expect(m, "more", "", 0, 0); /* finished */
    kiln_stop_matcher_destroy(m);

    const char *c1[] = {"a", "#", "#", "#", "b"};
    STREAM(s1, c1, "a", 0);
    /* at the very first token, whole or split */
    const char *s2[] = {"STOP"};
    const char *c2[] = {"STOP and more"};
    STREAM(s2, c2, "", 0);
    const char *c3[] = {"S", "T", "O", "P"};
    STREAM(s2, c3, "", 0);
    const char *c4[] = {"STOP"};
    STREAM(s2, c4, "", 0);
    /* text before the match in the same chunk */
    const char *c5[] = {"abcSTOPdef"};
    STREAM(s2, c5, "abc", 0);
    /* a longer stop string spread over many one-byte chunks */
    const char *s3[] = {"<|im_end|>"};
    const char *c6[] = {"ok", "<", "|", "im", "_", "end", "|", ">", "tail"};
    STREAM(s3, c6, "ok", 0);
    /* an empty chunk changes nothing */
    const char *c7[] = {"x", "", "<|im", "", "_end|>"};
    STREAM(s3, c7, "x", 0);
}

static void test_earliest_wins(void) {
    /* the later-listed stop string starts earlier: it wins */
    const char *s1[] = {"world", "lo"};
    const char *c1[] = {"hello world"};
    STREAM(s1, c1, "hel", 1);
    const char *c2[] = {"h", "e", "l", "l", "o", " ", "w", "o", "r", "l", "d"};
    STREAM(s1, c2, "hel", 1);
    /* a complete later-starting match waits for an earlier partial one */
    const char *s2[] = {"xyz12", "z"};
    const char *c3[] = {"xyz12"};
    STREAM(s2, c3, "", 0);
    const char *c4[] = {"x", "y", "z", "1", "2"};
    STREAM(s2, c4, "", 0);
    const char *c5[] = {"x", "y", "z", "9"};
    STREAM(s2, c5, "xy", 1);
    const char *c6[] = {"xyz9"};
    STREAM(s2, c6, "xy", 1);
    kiln_stop_matcher *m = NULL;
    REQUIRE(kiln_stop_matcher_create(s2, 2, &m, NULL) == KILN_OK);
    feed_expect(m, "ax", "a", -1, 1);
    feed_expect(m, "yz", "", -1, 3); /* "z" matched but "xyz12" may still start at x */
    feed_expect(m, "1", "", -1, 4);
    feed_expect(m, "3", "xy", 1, 0);
    kiln_stop_matcher_destroy(m);
    /* same start: the shortest wins (whole chunk or streamed) */
    const char *s3[] = {"abc", "ab"};
    const char *c7[] = {"--abcd"};
    STREAM(s3, c7, "--", 1);
    const char *c8[] = {"--a", "b", "c"};
    STREAM(s3, c8, "--", 1);
    /* identical strings: the first listed */
    const char *s4[] = {"end", "end"};
    const char *c9[] = {"the end"};
    STREAM(s4, c9, "the ", 0);
    /* the first occurrence of a string counts, not a later one */
    const char *s5[] = {"b", "cd"};
    const char *c10[] = {"acdab"};
    STREAM(s5, c10, "a", 1);
}

static void test_partial_release(void) {
    const char *s1[] = {"</end>"};
    kiln_stop_matcher *m = NULL;
    REQUIRE(kiln_stop_matcher_create(s1, 1, &m, NULL) == KILN_OK);
    feed_expect(m, "a </e", "a ", -1, 3);
    feed_expect(m, "nd", "", -1, 5);
    feed_expect(m, "x more", "</endx more", -1, 0);
    feed_expect(m, "<", "", -1, 1);
    feed_expect(m, "<", "<", -1, 1); /* the first '<' is released, the new one held */
    feed_expect(m, "/end>", "", 0, 0);
    kiln_stop_matcher_destroy(m);
    /* a partial match whose continuation contains a real match later */
    const char *c1[] = {"</en", "</end>"};
    STREAM(s1, c1, "</en", 0);
    /* self-overlapping stop string: "aab" in "aaab" */
    const char *s2[] = {"aab"};
    const char *c2[] = {"a", "a", "a", "b"};
    STREAM(s2, c2, "a", 0);
    const char *c3[] = {"a", "a", "a", "c"};
    STREAM(s2, c3, "aaac", -1);
}

static void test_flush(void) {
    const char *s1[] = {"<|im_end|>", "\n\nUser:"};
    kiln_stop_matcher *m = NULL;
    REQUIRE(kiln_stop_matcher_create(s1, 2, &m, NULL) == KILN_OK);
    feed_expect(m, "abc <|im", "abc ", -1, 4);
    feed_expect(m, "\n", "<|im", -1, 1);
    kiln_stop_result r;
    kiln_stop_matcher_flush(m, &r);
    CHECK(r.len == 1 && r.text[0] == '\n' && r.stop_index == -1);
    CHECK(kiln_stop_matcher_held(m) == 0);
    feed_expect(m, "later", "", -1, 0); /* finished after flush */
    kiln_stop_matcher_flush(m, &r);
    CHECK(r.len == 0 && r.text != NULL);
    /* reset: a fresh stream */
    kiln_stop_matcher_reset(m);
    feed_expect(m, "x\n\nUs", "x", -1, 4);
    feed_expect(m, "er: hi", "", 1, 0);
    kiln_stop_matcher_flush(m, &r);
    CHECK(r.len == 0 && r.stop_index == 1);
    kiln_stop_matcher_destroy(m);
    /* a complete match waiting on an earlier partial one is reported at the flush */
    const char *s2[] = {"abcd", "c"};
    REQUIRE(kiln_stop_matcher_create(s2, 2, &m, NULL) == KILN_OK);
    feed_expect(m, "xab", "x", -1, 2);
    feed_expect(m, "c", "", -1, 3);
    kiln_stop_matcher_flush(m, &r);
    CHECK(r.len == 2 && memcmp(r.text, "ab", 2) == 0 && r.stop_index == 1);
    CHECK(kiln_stop_matcher_matched(m) == 1);
    kiln_stop_matcher_destroy(m);
    /* pass-through with no stop strings */
    REQUIRE(kiln_stop_matcher_create(NULL, 0, &m, NULL) == KILN_OK);
    feed_expect(m, "any <|im_end|> text", "any <|im_end|> text", -1, 0);
    kiln_stop_matcher_flush(m, &r);
    CHECK(r.len == 0 && r.stop_index == -1);
    kiln_stop_matcher_destroy(m);
    kiln_stop_matcher_destroy(NULL);
}

static void test_multibyte(void) {
    /* "café!" with stop "é!" split at character boundaries */
    const char *s1[] = {"\xC3\xA9!"};
    kiln_stop_matcher *m = NULL;
    REQUIRE(kiln_stop_matcher_create(s1, 1, &m, NULL) == KILN_OK);
    feed_expect(m, "caf", "caf", -1, 0);
    feed_expect(m, "\xC3\xA9", "", -1, 2);
    feed_expect(m, "!", "", 0, 0);
    kiln_stop_matcher_destroy(m);
    const char *c1[] = {"caf\xC3\xA9 ", "\xC3\xA9", "?"};
    STREAM(s1, c1, "caf\xC3\xA9 \xC3\xA9?", -1);
    /* CJK: hold "本語" (6 bytes), then release on mismatch */
    const char *s2[] = {"\xE6\x9C\xAC\xE8\xAA\x9E"
                        "X"}; /* 本語X */
    REQUIRE(kiln_stop_matcher_create(s2, 1, &m, NULL) == KILN_OK);
    feed_expect(m, "\xE6\x97\xA5\xE6\x9C\xAC", "\xE6\x97\xA5", -1, 3);             /* 日本 */
    feed_expect(m, "\xE8\xAA\x9E", "", -1, 6);                                     /* 語 */
    feed_expect(m, "\xE3\x81\xAF", "\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAF", -1, 0); /* は */
    kiln_stop_matcher_destroy(m);
    /* match right after and right before multi-byte characters; emoji stop string */
    const char *s3[] = {"\xF0\x9F\x9B\x91"}; /* 🛑 */
    const char *c2[] = {"\xE6\x97\xA5", "\xF0\x9F\x9B\x91", "\xE6\x97\xA5"};
    STREAM(s3, c2, "\xE6\x97\xA5", 0);
    /* a stop string sharing a lead byte with the text: "é" (C3 A9) vs "è" (C3 A8) */
    const char *s4[] = {"\xC3\xA9"};
    const char *c3[] = {"\xC3\xA8\xC3\xA8", "\xC3\xA9x"};
    STREAM(s4, c3, "\xC3\xA8\xC3\xA8", 0);
}

/* Whole-text reference: earliest start; same start: shortest; then first listed. */
static int32_t reference(const char *const *stops, int n, const char *text, size_t *cut) {
    size_t tl = strlen(text);
    for (size_t q = 0; q < tl; q++) {
        int32_t best = -1;
        for (int i = 0; i < n; i++) {
            size_t l = strlen(stops[i]);
            if (q + l <= tl && memcmp(text + q, stops[i], l) == 0 &&
                (best < 0 || l < strlen(stops[best])))
                best = i;
        }
        if (best >= 0) {
            *cut = q;
            return best;
        }
    }
    *cut = tl;
    return -1;
}

static void test_random_chunking(void) {
    /* random texts over a small alphabet of 1-4 byte characters; stop strings drawn from the
     * text and the alphabet; random chunking on character boundaries must give the
     * whole-text reference result */
    static const char *alpha[] = {"a", "b", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x9B\x91", " "};
    uint64_t st = 42;
#define RND(n)                                                                                     \
    ((st = st * 6364136223846793005ull + 1442695040888963407ull), (int)((st >> 33) % (n)))
    int matched = 0, unmatched = 0;
    for (int iter = 0; iter < 3000; iter++) {
        int nch = 1 + RND(30);
        int ci[64];
        char text[512] = "";
        for (int i = 0; i < nch; i++) {
            ci[i] = RND(6);
            strcat(text, alpha[ci[i]]);
        }
        int n_stops = 1 + RND(KILN_STOP_MAX_STRINGS);
        char stop_buf[KILN_STOP_MAX_STRINGS][64];
        const char *stops[KILN_STOP_MAX_STRINGS];
        for (int k = 0; k < n_stops; k++) {
            int len = 1 + RND(4);
            stop_buf[k][0] = 0;
            int from = RND(nch);
            for (int j = 0; j < len; j++)
                strcat(stop_buf[k], RND(3) ? alpha[ci[(from + j) % nch]] : alpha[RND(6)]);
            stops[k] = stop_buf[k];
        }
        size_t cut;
        int32_t want = reference(stops, n_stops, text, &cut);
        /* chunks: 1-3 characters each */
        char chunk_buf[64][32];
        const char *chunks[64];
        int nchunks = 0;
        for (int i = 0; i < nch;) {
            int take = 1 + RND(3);
            chunk_buf[nchunks][0] = 0;
            for (int j = 0; j < take && i < nch; j++, i++) strcat(chunk_buf[nchunks], alpha[ci[i]]);
            chunks[nchunks] = chunk_buf[nchunks];
            nchunks++;
        }
        char out[1024];
        int32_t got = run(stops, n_stops, chunks, nchunks, out, sizeof out);
        bool ok = got == want && strlen(out) == cut && memcmp(out, text, cut) == 0;
        CHECKF(ok, "iter %d: text '%s' stops [%s|%s|%s|%s] got stop %d '%s', want stop %d cut %zu",
               iter, text, stops[0], n_stops > 1 ? stops[1] : "", n_stops > 2 ? stops[2] : "",
               n_stops > 3 ? stops[3] : "", got, out, want, cut);
        if (!ok) break;
        matched += want >= 0;
        unmatched += want < 0;
    }
    CHECKF(matched > 500 && unmatched > 300, "coverage: %d matched, %d unmatched", matched,
           unmatched);
}

static void test_validation(void) {
    kiln_error e = {0};
    const char *five[] = {"a", "b", "c", "d", "e"};
    CHECK(kiln_stop_strings_validate(five, 4, NULL) == KILN_OK);
    CHECK(kiln_stop_strings_validate(five, 5, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.message, "stop must have at most 4 entries (got 5)") != NULL);
    const char *empty[] = {"a", ""};
    CHECK(kiln_stop_strings_validate(empty, 2, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.message, "stop[1] must not be empty") != NULL);
    const char *null[] = {NULL};
    CHECK(kiln_stop_strings_validate(null, 1, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_stop_strings_validate(NULL, 1, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_stop_strings_validate(NULL, 0, &e) == KILN_OK);
    CHECK(kiln_stop_strings_validate(five, -1, &e) == KILN_ERR_INVALID_ARGUMENT);
    static char longs[KILN_STOP_MAX_BYTES + 2];
    memset(longs, 'x', KILN_STOP_MAX_BYTES);
    const char *lp[] = {longs};
    CHECK(kiln_stop_strings_validate(lp, 1, NULL) == KILN_OK); /* exactly the limit */
    longs[KILN_STOP_MAX_BYTES] = 'x';
    CHECK(kiln_stop_strings_validate(lp, 1, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.message, "stop[0]") != NULL);
    const char *bad_utf8[][1] = {
        {"\xC3"}, {"\xA9"}, {"a\xC0\xAF"}, {"\xED\xA0\x80"}, {"\xF4\x90\x80\x80"}, {"\xE6\x97"}};
    for (int i = 0; i < 6; i++) {
        CHECKF(kiln_stop_strings_validate(bad_utf8[i], 1, &e) == KILN_ERR_INVALID_ARGUMENT,
               "invalid UTF-8 case %d accepted", i);
        CHECK(strstr(e.message, "UTF-8") != NULL);
    }
    const char *good_utf8[] = {"\xC3\xA9", "\xF0\x9F\x9B\x91", "\xEF\xBF\xBD", "\x7F"};
    CHECK(kiln_stop_strings_validate(good_utf8, 4, NULL) == KILN_OK);
    kiln_stop_matcher *m = (kiln_stop_matcher *)1;
    CHECK(kiln_stop_matcher_create(empty, 2, &m, &e) == KILN_ERR_INVALID_ARGUMENT && m == NULL);
    REQUIRE(kiln_stop_matcher_create(good_utf8, 4, &m, NULL) == KILN_OK);
    kiln_stop_result r;
    CHECK(kiln_stop_matcher_feed(m, NULL, 3, &r, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_stop_matcher_feed(m, NULL, 0, &r, NULL) == KILN_OK && r.len == 0);
    CHECK(kiln_stop_matcher_feed(NULL, "a", 1, &r, NULL) == KILN_ERR_INVALID_ARGUMENT);
    kiln_stop_matcher_destroy(m);
}

static void test_tokens(void) {
    const int32_t ids[] = {2, 32000, 7};
    CHECK(kiln_stop_token_match(ids, 3, 7));
    CHECK(kiln_stop_token_match(ids, 3, 2));
    CHECK(!kiln_stop_token_match(ids, 3, 3));
    CHECK(!kiln_stop_token_match(ids, 2, 7)); /* only the first n */
    CHECK(!kiln_stop_token_match(NULL, 0, 0));
    kiln_error e = {0};
    CHECK(kiln_stop_tokens_validate(ids, 3, 32001, NULL) == KILN_OK);
    CHECK(kiln_stop_tokens_validate(ids, 3, 32000, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(e.message, "stop_token_ids[1] must be in [0, 32000) (got 32000)") != NULL);
    const int32_t neg[] = {-1};
    CHECK(kiln_stop_tokens_validate(neg, 1, 10, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_stop_tokens_validate(NULL, 0, 10, NULL) == KILN_OK);
    CHECK(kiln_stop_tokens_validate(NULL, 2, 10, NULL) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_stop_tokens_validate(ids, KILN_STOP_MAX_TOKENS + 1, 10, NULL) ==
          KILN_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "all";
    bool all = strcmp(c, "all") == 0;
    if (all || !strcmp(c, "split")) test_split_and_first();
    if (all || !strcmp(c, "earliest")) test_earliest_wins();
    if (all || !strcmp(c, "partial")) test_partial_release();
    if (all || !strcmp(c, "flush")) test_flush();
    if (all || !strcmp(c, "multibyte")) test_multibyte();
    if (all || !strcmp(c, "random")) test_random_chunking();
    if (all || !strcmp(c, "validation")) test_validation();
    if (all || !strcmp(c, "tokens")) test_tokens();
    return kiln_test_finish(c);
}
