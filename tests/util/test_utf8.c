/*
 * test_utf8.c - util/utf8: validation, decoding, encoding and the raw bit layout, against an
 * independent reading of The Unicode Standard ch. 3 Table 3-7 (well-formed UTF-8 byte
 * sequences, = RFC 3629 section 4): every 1-, 2- and 3-byte string, every 4-byte string whose
 * last three bytes are continuation bytes, every scalar value round trip, and named vectors.
 */
#include <stdint.h>

#include "test.h"
#include "util/utf8.h"

/* Table 3-7, row by row: the first byte's range and the second byte's range; later bytes are
 * always 80..BF. */
typedef struct row {
    uint8_t lo0, hi0, lo1, hi1;
    int len;
} row;

static const row table_3_7[] = {
    {0x00, 0x7F, 0, 0, 1},       {0xC2, 0xDF, 0x80, 0xBF, 2}, {0xE0, 0xE0, 0xA0, 0xBF, 3},
    {0xE1, 0xEC, 0x80, 0xBF, 3}, {0xED, 0xED, 0x80, 0x9F, 3}, {0xEE, 0xEF, 0x80, 0xBF, 3},
    {0xF0, 0xF0, 0x90, 0xBF, 4}, {0xF1, 0xF3, 0x80, 0xBF, 4}, {0xF4, 0xF4, 0x80, 0x8F, 4},
};

/* The reference: length 1..4, 0 ill-formed, -1 a well-formed but incomplete prefix. */
static int ref_len(const uint8_t *s, size_t avail) {
    if (avail == 0) return -1;
    for (size_t r = 0; r < sizeof table_3_7 / sizeof table_3_7[0]; r++) {
        const row *t = &table_3_7[r];
        if (s[0] < t->lo0 || s[0] > t->hi0) continue;
        for (int i = 1; i < t->len; i++) {
            if ((size_t)i >= avail) return -1;
            uint8_t lo = i == 1 ? t->lo1 : 0x80, hi = i == 1 ? t->hi1 : 0xBF;
            if (s[i] < lo || s[i] > hi) return 0;
        }
        return t->len;
    }
    return 0;
}

/* The reference value of a well-formed sequence (RFC 3629 section 3's bit layout). */
static uint32_t ref_cp(const uint8_t *s, int n) {
    static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = s[0] & lead_mask[n];
    for (int i = 1; i < n; i++) cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

static long n_checked = 0;

static void check_one(const uint8_t *b, size_t n) {
    const char *s = (const char *)b;
    int want = ref_len(b, n);
    int got = kiln_utf8_seq_len(s, n);
    uint32_t cp = 0x12345678;
    int dl = kiln_utf8_decode(s, n, &cp);
    n_checked++;
    if (got != want || dl != want) {
        CHECKF(0, "seq_len/decode of %02x %02x %02x %02x (n=%zu): %d/%d, want %d", b[0],
               n > 1 ? b[1] : 0, n > 2 ? b[2] : 0, n > 3 ? b[3] : 0, n, got, dl, want);
        return;
    }
    if (want > 0) {
        uint32_t r = ref_cp(b, want);
        if (cp != r || kiln_utf8_bits(s, want) != r) {
            CHECKF(0, "decode of %02x..: %x, want %x", b[0], cp, r);
            return;
        }
        if (r > 0x10FFFF || (r >= 0xD800 && r <= 0xDFFF)) CHECKF(0, "decoded non-scalar %x", r);
    } else if (cp != KILN_UTF8_REPLACEMENT) {
        CHECKF(0, "ill-formed %02x.. decoded to %x, want U+FFFD", b[0], cp);
    }
    /* kiln_utf8_valid agrees on the whole string: valid iff it is a chain of sequences */
    size_t i = 0;
    bool valid = true;
    while (i < n) {
        int l = ref_len(b + i, n - i);
        if (l <= 0) {
            valid = false;
            break;
        }
        i += (size_t)l;
    }
    size_t bad = 99;
    bool v = kiln_utf8_valid(s, n, &bad);
    if (v != valid || (!v && bad != i))
        CHECKF(0, "valid(%02x.., n=%zu) = %d at %zu, want %d at %zu", b[0], n, v, bad, valid, i);
}

static void test_exhaustive(void) {
    uint8_t b[4];
    for (int x = 0; x < 256; x++) {
        b[0] = (uint8_t)x;
        check_one(b, 1);
        for (int y = 0; y < 256; y++) {
            b[1] = (uint8_t)y;
            check_one(b, 2);
            for (int z = 0; z < 256; z++) {
                b[2] = (uint8_t)z;
                check_one(b, 3);
            }
        }
    }
    /* 4 bytes: every lead, every continuation-byte tail */
    for (int x = 0; x < 256; x++)
        for (int y = 0x80; y < 0xC0; y++)
            for (int z = 0x80; z < 0xC0; z++)
                for (int w = 0x80; w < 0xC0; w++) {
                    b[0] = (uint8_t)x, b[1] = (uint8_t)y, b[2] = (uint8_t)z, b[3] = (uint8_t)w;
                    check_one(b, 4);
                }
}

static void test_round_trip(void) {
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        char o[4];
        size_t n = kiln_utf8_encode(cp, o);
        size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        uint32_t back = 0;
        int dl = kiln_utf8_decode(o, n, &back);
        if (n != want) {
            CHECKF(0, "encode(%x) gave %zu bytes, want %zu", cp, n, want);
            continue;
        }
        if (kiln_utf8_bits(o, (int)n) != cp) CHECKF(0, "bits(encode(%x)) != cp", cp);
        if (cp >= 0xD800 && cp <= 0xDFFF) { /* written as 3 bytes, refused on reading */
            if (dl != 0) CHECKF(0, "surrogate %x decoded (%d)", cp, dl);
        } else if (dl != (int)n || back != cp) {
            CHECKF(0, "decode(encode(%x)) = %d/%x", cp, dl, back);
        }
    }
}

typedef struct vec {
    const char *s;
    size_t n;
    int len;     /* kiln_utf8_decode */
    uint32_t cp; /* its value (U+FFFD when len <= 0) */
} vec;

static void test_vectors(void) {
    static const vec v[] = {
        {"A", 1, 1, 0x41},
        {"\x7F", 1, 1, 0x7F},
        {"\xC2\x80", 2, 2, 0x80},
        {"\xC3\xA9", 2, 2, 0xE9}, /* é */
        {"\xDF\xBF", 2, 2, 0x7FF},
        {"\xE0\xA0\x80", 3, 3, 0x800},
        {"\xE2\x82\xAC", 3, 3, 0x20AC}, /* € */
        {"\xED\x9F\xBF", 3, 3, 0xD7FF}, /* last before the surrogates */
        {"\xEE\x80\x80", 3, 3, 0xE000}, /* first after them */
        {"\xEF\xBF\xBD", 3, 3, 0xFFFD},
        {"\xEF\xBF\xBF", 3, 3, 0xFFFF},
        {"\xF0\x90\x80\x80", 4, 4, 0x10000},
        {"\xF0\x90\x8D\x88", 4, 4, 0x10348}, /* 𐍈 */
        {"\xF4\x8F\xBF\xBF", 4, 4, 0x10FFFF},
        {"\xE2\x82\xACx", 4, 3, 0x20AC},    /* only the sequence is read */
        {"\xC0\x80", 2, 0, 0xFFFD},         /* overlong NUL */
        {"\xC1\xBF", 2, 0, 0xFFFD},         /* overlong */
        {"\xE0\x80\x80", 3, 0, 0xFFFD},     /* overlong */
        {"\xE0\x9F\xBF", 3, 0, 0xFFFD},     /* overlong U+07FF */
        {"\xF0\x80\x80\x80", 4, 0, 0xFFFD}, /* overlong */
        {"\xF0\x8F\xBF\xBF", 4, 0, 0xFFFD}, /* overlong U+FFFF */
        {"\xED\xA0\x80", 3, 0, 0xFFFD},     /* U+D800 */
        {"\xED\xBF\xBF", 3, 0, 0xFFFD},     /* U+DFFF */
        {"\xF4\x90\x80\x80", 4, 0, 0xFFFD}, /* U+110000 */
        {"\xF5\x80\x80\x80", 4, 0, 0xFFFD},
        {"\xF8\x88\x80\x80\x80", 5, 0, 0xFFFD}, /* RFC 2279's 5-byte form */
        {"\xFE", 1, 0, 0xFFFD},
        {"\xFF", 1, 0, 0xFFFD},
        {"\x80", 1, 0, 0xFFFD}, /* lone continuation byte */
        {"\xBF\x80", 2, 0, 0xFFFD},
        {"\xC3\x41", 2, 0, 0xFFFD}, /* lead without its continuation */
        {"\xE2\x82\x41", 3, 0, 0xFFFD},
        {"\xC3", 1, -1, 0xFFFD}, /* truncated */
        {"\xE2\x82", 2, -1, 0xFFFD},
        {"\xF0\x9F\x98", 3, -1, 0xFFFD},
        {"", 0, -1, 0xFFFD},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint32_t cp = 0;
        int l = kiln_utf8_decode(v[i].s, v[i].n, &cp);
        CHECKF(l == v[i].len && cp == v[i].cp, "vector %zu: %d/%x, want %d/%x", i, l, cp, v[i].len,
               v[i].cp);
        CHECKF(kiln_utf8_seq_len(v[i].s, v[i].n) == v[i].len, "vector %zu: seq_len", i);
    }
}

static void test_bits_and_encode_edges(void) {
    CHECK(kiln_utf8_bits("\xFF", 1) == 0xFF);
    CHECK(kiln_utf8_bits("\x80", 1) == 0x80);
    CHECK(kiln_utf8_bits("\xC0\xA0", 2) == 0x20); /* overlong space */
    CHECK(kiln_utf8_bits("\xC1\xBF", 2) == 0x7F);
    CHECK(kiln_utf8_bits("\xE0\x80\x80", 3) == 0);
    CHECK(kiln_utf8_bits("\xED\xA0\x80", 3) == 0xD800); /* surrogate */
    CHECK(kiln_utf8_bits("\xF4\x90\x80\x80", 4) == 0x110000);
    CHECK(kiln_utf8_bits("\xF7\xBF\xBF\xBF", 4) == 0x1FFFFF); /* the largest */
    CHECK(kiln_utf8_bits("\x41\x41", 2) == 0x41);             /* unchecked: 0x01 << 6 | 0x01 */

    char o[4];
    CHECK(kiln_utf8_encode(0xD800, o) == 3 && memcmp(o, "\xED\xA0\x80", 3) == 0);
    CHECK(kiln_utf8_encode(0x110000, o) == 4 && memcmp(o, "\xF4\x90\x80\x80", 4) == 0);
    CHECK(kiln_utf8_encode(0x1FFFFF, o) == 4 && memcmp(o, "\xF7\xBF\xBF\xBF", 4) == 0);
    CHECK(kiln_utf8_encode(0, o) == 1 && o[0] == 0);
}

static void test_valid_offsets(void) {
    size_t bad = 99;
    CHECK(kiln_utf8_valid(NULL, 0, &bad) && bad == 99);
    const char *ok = "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80";
    CHECK(kiln_utf8_valid(ok, strlen(ok), NULL));
    CHECK(!kiln_utf8_valid("abc\xE2\x82", 5, &bad) && bad == 3);    /* truncated at the end */
    CHECK(!kiln_utf8_valid("a\xC0\x80z", 4, &bad) && bad == 1);     /* overlong */
    CHECK(!kiln_utf8_valid("ab\xED\xA0\x80", 5, &bad) && bad == 2); /* surrogate */
    CHECK(!kiln_utf8_valid("\xC3\xA9\x80", 3, &bad) && bad == 2);   /* stray continuation */
    CHECK(!kiln_utf8_valid("\xE2\x82\x41\xE2\x82\xAC", 6, &bad) && bad == 0);
}

int main(void) {
    test_vectors();
    test_bits_and_encode_edges();
    test_valid_offsets();
    test_round_trip();
    test_exhaustive();
    printf("test_utf8: %ld byte strings checked\n", n_checked);
    return kiln_test_finish("test_utf8");
}
