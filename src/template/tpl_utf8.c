/* tpl_utf8.c - UTF-8 (over util/utf8.h) and the slice of Python's Unicode character database
 * the template language needs. Case mapping covers Latin (incl. Extended-A and Additional),
 * Greek, Cyrillic, Armenian and fullwidth Latin one code point to one; Python's
 * multi-character mappings (e.g. 'ß'.upper() == 'SS') are not reproduced. */
#include <string.h>

#include "template/tpl.h"
#include "util/utf8.h"

/* Valid UTF-8 is read by kiln_utf8_decode. Ill-formed bytes are read laxly, as templates
 * always have: by the lead byte's bit pattern (110xxxxx: 2 bytes, so C0..C1 too; 1110xxxx: 3;
 * 11110xxx: 4) with the following bytes' low 6 bits taken unchecked (kiln_utf8_bits) when
 * that many bytes are left; any other byte (80..BF, F8..FF, a lead too close to the end) is
 * 1 byte, its value. */
uint32_t tpl_utf8_dec(const char *s, size_t n, size_t *adv) {
    uint32_t cp;
    int l = kiln_utf8_decode(s, n, &cp);
    if (l > 0) {
        *adv = (size_t)l;
        return cp;
    }
    unsigned char c = (unsigned char)s[0];
    int len = 1;
    if (n >= 2 && (c & 0xE0) == 0xC0)
        len = 2;
    else if (n >= 3 && (c & 0xF0) == 0xE0)
        len = 3;
    else if (n >= 4 && (c & 0xF8) == 0xF0)
        len = 4;
    *adv = (size_t)len;
    return kiln_utf8_bits(s, len);
}

size_t tpl_utf8_enc(uint32_t cp, char out[4]) {
    return kiln_utf8_encode(cp, out);
}

/* RFC 3629 well-formedness, as kiln_utf8_valid (the same sequences, the same offset). */
bool tpl_utf8_valid(const char *s, size_t n, size_t *bad_off) {
    return kiln_utf8_valid(s, n, bad_off);
}

size_t tpl_utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

bool tpl_is_space(uint32_t c) {
    if (c <= 0x20) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    if (c < 0x85) return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool tpl_is_linebreak(uint32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
           c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
}

/* Python str.isprintable(): not Other (Cc Cf Cs Co Cn) nor Separator other than ' '.
 * Unassigned code points (Cn) are not tracked and count as printable. */
bool tpl_is_printable(uint32_t c) {
    if (c < 0x20 || c == 0x7F) return false;
    if (c < 0xA0) return c < 0x7F; /* C1 controls */
    if (c == 0xA0 || c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) ||
        (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064) ||
        (c >= 0x2066 && c <= 0x206F) || c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB))
        return false;
    if ((c >= 0x0600 && c <= 0x0605) || c == 0x061C || c == 0x06DD || c == 0x070F || c == 0x180E ||
        c == 0x110BD || (c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A) ||
        c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F))
        return false;
    if ((c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000) return false;
    return true;
}

/* Pairs where upper = even, lower = odd code point, over [lo, hi]. */
static const uint32_t even_odd[][2] = {
    {0x0100, 0x012F}, {0x0132, 0x0137}, {0x014A, 0x0177}, {0x01DE, 0x01EF},
    {0x01F8, 0x021F}, {0x0222, 0x0233}, {0x03D8, 0x03EF}, {0x0460, 0x0481},
    {0x048A, 0x04BF}, {0x04D0, 0x052F}, {0x1E00, 0x1E95}, {0x1EA0, 0x1EFF},
};
/* Pairs where upper = odd, lower = even. */
static const uint32_t odd_even[][2] = {
    {0x0139, 0x0148},
    {0x0179, 0x017E},
    {0x01CD, 0x01DC},
    {0x04C1, 0x04CE},
};

static int pair_case(uint32_t c, bool to_upper, uint32_t *out) {
    for (size_t k = 0; k < sizeof even_odd / sizeof even_odd[0]; k++) {
        if (c >= even_odd[k][0] && c <= even_odd[k][1]) {
            bool is_upper = (c & 1) == 0;
            *out = to_upper ? (is_upper ? c : c - 1) : (is_upper ? c + 1 : c);
            return 1;
        }
    }
    for (size_t k = 0; k < sizeof odd_even / sizeof odd_even[0]; k++) {
        if (c >= odd_even[k][0] && c <= odd_even[k][1]) {
            bool is_upper = (c & 1) == 1;
            *out = to_upper ? (is_upper ? c : c - 1) : (is_upper ? c + 1 : c);
            return 1;
        }
    }
    return 0;
}

uint32_t tpl_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    uint32_t o;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    if (pair_case(c, true, &o)) return o;
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (c >= 0x561 && c <= 0x586) return c - 48;
    if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
    return c;
}

uint32_t tpl_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    uint32_t o;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c == 0x130) return 'i';
    if (pair_case(c, false, &o)) return o;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if (c >= 0x531 && c <= 0x556) return c + 48;
    if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
    return c;
}

bool tpl_is_cased_lower(uint32_t c) {
    return tpl_upper(c) != c || c == 0xDF;
}

bool tpl_is_cased_upper(uint32_t c) {
    return tpl_lower(c) != c;
}

bool tpl_is_digit(uint32_t c) {
    return (c >= '0' && c <= '9') || (c >= 0x660 && c <= 0x669) || (c >= 0x6F0 && c <= 0x6F9) ||
           (c >= 0x966 && c <= 0x96F) || (c >= 0xFF10 && c <= 0xFF19) || c == 0xB2 || c == 0xB3 ||
           c == 0xB9;
}

/* Letters: ASCII, Latin-1 letters, and (approximately) every code point from U+0100 up that
 * is not in a punctuation, symbol, space or private block. */
bool tpl_is_alpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    if (c < 0x100)
        return c == 0xAA || c == 0xB5 || c == 0xBA || (c >= 0xC0 && c != 0xD7 && c != 0xF7);
    if (tpl_is_space(c) || !tpl_is_printable(c)) return false;
    if ((c >= 0x2000 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F) ||
        (c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFF00 && c <= 0xFF20) ||
        (c >= 0xFF3B && c <= 0xFF40) || (c >= 0xFF5B && c <= 0xFF65) ||
        (c >= 0x1F000 && c <= 0x1FAFF) || (c >= 0x300 && c <= 0x36F))
        return false;
    if (tpl_is_digit(c)) return false;
    return true;
}
