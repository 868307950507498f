/* utf8.c - UTF-8 validation, decoding and encoding (utf8.h: RFC 3629, Unicode Table 3-7). */
#include "util/utf8.h"

#include <stdint.h>

int kiln_utf8_seq_len(const char *s, size_t avail) {
    if (avail == 0) return -1;
    const uint8_t *p = (const uint8_t *)s;
    uint8_t c = p[0];
    int n;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0; /* continuation byte or overlong 2-byte lead */
    if (c < 0xE0)
        n = 2;
    else if (c < 0xF0) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c < 0xF5) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90; /* overlong */
        else if (c == 0xF4)
            hi = 0x8F; /* > U+10FFFF */
    } else
        return 0;
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= avail) return -1;
        uint8_t b = p[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return n;
}

bool kiln_utf8_valid(const char *s, size_t len, size_t *bad_offset) {
    size_t i = 0;
    while (i < len) {
        int n = kiln_utf8_seq_len(s + i, len - i);
        if (n <= 0) {
            if (bad_offset) *bad_offset = i;
            return false;
        }
        i += (size_t)n;
    }
    return true;
}

uint32_t kiln_utf8_bits(const char *s, int n) {
    const uint8_t *p = (const uint8_t *)s;
    if (n <= 1) return p[0];
    uint32_t cp = p[0] & (0x7Fu >> n); /* 2: 0x1F, 3: 0x0F, 4: 0x07 */
    for (int i = 1; i < n; i++) cp = (cp << 6) | (p[i] & 0x3Fu);
    return cp;
}

int kiln_utf8_decode(const char *s, size_t avail, uint32_t *cp) {
    int n = kiln_utf8_seq_len(s, avail);
    *cp = n > 0 ? kiln_utf8_bits(s, n) : KILN_UTF8_REPLACEMENT;
    return n;
}

size_t kiln_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
