/*
 * test_utf8_lax.c - the lax readings of ill-formed UTF-8 that callers build on util/utf8
 * (kiln_utf8_decode for well-formed text, kiln_utf8_bits for the rest), pinned as they have
 * always been: the tokenizer.json pipeline's hf_utf8_next (tokenizer/hf_internal.h) and the
 * template language's tpl_utf8_dec (template/tpl.h). They differ from each other on purpose
 * (each keeps its module's behaviour); both agree with kiln_utf8_decode on valid text.
 */
#include <stdint.h>

#include "template/tpl.h"
#include "test.h"
#include "tokenizer/hf_internal.h"
#include "util/utf8.h"

typedef struct lax {
    const char *s;
    size_t n;
    size_t hf_len;
    uint32_t hf_cp;
    size_t tpl_len;
    uint32_t tpl_cp;
} lax;

static const lax cases[] = {
    /* valid: both as kiln_utf8_decode */
    {"A", 1, 1, 0x41, 1, 0x41},
    {"\xC3\xA9", 2, 2, 0xE9, 2, 0xE9},
    {"\xE2\x82\xAC", 3, 3, 0x20AC, 3, 0x20AC},
    {"\xF0\x9F\x98\x80", 4, 4, 0x1F600, 4, 0x1F600},
    /* a continuation byte first: hf reads 2 bytes, tpl 1 */
    {"\x80\x80", 2, 2, 0x0, 1, 0x80},
    {"\xBF\x41", 2, 2, 0x7C1, 1, 0xBF},
    /* overlong and surrogate forms: both read the bits */
    {"\xC0\xA0", 2, 2, 0x20, 2, 0x20},
    {"\xE0\x80\x80", 3, 3, 0x0, 3, 0x0},
    {"\xED\xA0\x80", 3, 3, 0xD800, 3, 0xD800},
    {"\xF4\x90\x80\x80", 4, 4, 0x110000, 4, 0x110000},
    /* a lead whose next byte is no continuation byte: unchecked */
    {"\xC3\x41", 2, 2, 0xC1, 2, 0xC1},
    /* F8..FF: hf reads 4 bytes (3 when only 3 are left), tpl 1 */
    {"\xF8\x88\x80\x80", 4, 4, 0x8000, 1, 0xF8},
    {"\xFF\x80\x80", 3, 3, 0xF000, 1, 0xFF},
    /* truncated at the end */
    {"\xC3", 1, 1, 0xC3, 1, 0xC3},
    {"\xE2\x82", 2, 1, 0xE2, 1, 0xE2},
    {"\xF0\x9F", 2, 1, 0xF0, 1, 0xF0},
    {"\xF0\x9F\x98", 3, 3, 0x7D8, 1, 0xF0}, /* hf: read as a 3-byte sequence */
};

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const lax *c = &cases[i];
        uint32_t cp = 0;
        size_t l = hf_utf8_next(c->s, c->n, 0, &cp);
        CHECKF(l == c->hf_len && cp == c->hf_cp, "hf case %zu: %zu/%x, want %zu/%x", i, l, cp,
               c->hf_len, c->hf_cp);
        /* the same from an offset into a longer buffer */
        char buf[8] = "xx";
        memcpy(buf + 2, c->s, c->n);
        l = hf_utf8_next(buf, c->n + 2, 2, &cp);
        CHECKF(l == c->hf_len && cp == c->hf_cp, "hf case %zu at offset 2", i);
        size_t adv = 0;
        cp = tpl_utf8_dec(c->s, c->n, &adv);
        CHECKF(adv == c->tpl_len && cp == c->tpl_cp, "tpl case %zu: %zu/%x, want %zu/%x", i, adv,
               cp, c->tpl_len, c->tpl_cp);
    }
    /* encoding and validation are util's own */
    char a[4], b[4];
    for (uint32_t cp = 0; cp < 0x110000; cp += 7) {
        size_t n = tpl_utf8_enc(cp, a);
        CHECK(n == kiln_utf8_encode(cp, b) && memcmp(a, b, n) == 0);
    }
    size_t off = 0;
    CHECK(!tpl_utf8_valid("ok\xED\xA0\x80", 5, &off) && off == 2);
    return kiln_test_finish("test_utf8_lax");
}
