/* utf8.h - UTF-8 validation and sequence lengths (RFC 3629). */
#ifndef KILN_UTIL_UTF8_H
#define KILN_UTIL_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/**
 * True when s[0..len) is valid UTF-8 per RFC 3629: no overlong forms, no surrogates
 * (U+D800..U+DFFF), nothing above U+10FFFF. On false, *bad_offset (if non-NULL) receives
 * the offset of the first byte of the first invalid sequence.
 */
bool kiln_utf8_valid(const char *s, size_t len, size_t *bad_offset);

/**
 * Length of the valid UTF-8 sequence starting at s (1..4), given `avail` bytes; 0 when the
 * bytes are invalid, -1 when they are a valid but incomplete prefix (more bytes needed).
 */
int kiln_utf8_seq_len(const char *s, size_t avail);

#endif
