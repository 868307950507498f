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
    if (c < 0xE0) n = 2;
    else if (c < 0xF0) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        else if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c < 0xF5) {
        n = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        else if (c == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else return 0;
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
