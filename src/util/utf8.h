/*
 * utf8.h - UTF-8: validating, decoding and encoding one code point.
 *
 * Sources: RFC 3629 section 3 (the bit layout: 1 byte 0xxxxxxx; 2 bytes 110xxxxx 10xxxxxx;
 * 3 bytes 1110xxxx 10xxxxxx 10xxxxxx; 4 bytes 11110xxx 10xxxxxx 10xxxxxx 10xxxxxx) and
 * section 4 (the syntax), which is The Unicode Standard, chapter 3, Table 3-7 "Well-Formed
 * UTF-8 Byte Sequences":
 *
 *     U+0000..U+007F     00..7F
 *     U+0080..U+07FF     C2..DF 80..BF
 *     U+0800..U+0FFF     E0     A0..BF 80..BF
 *     U+1000..U+CFFF     E1..EC 80..BF 80..BF
 *     U+D000..U+D7FF     ED     80..9F 80..BF
 *     U+E000..U+FFFF     EE..EF 80..BF 80..BF
 *     U+10000..U+3FFFF   F0     90..BF 80..BF 80..BF
 *     U+40000..U+FFFFF   F1..F3 80..BF 80..BF 80..BF
 *     U+100000..U+10FFFF F4     80..8F 80..BF 80..BF
 *
 * So no overlong forms (C0, C1, E0 80..9F, F0 80..8F), no surrogates (ED A0..BF) and nothing
 * above U+10FFFF (F4 90.., F5..FF). Callers that must read ill-formed bytes in some other,
 * historical way (a lax reading) build it from kiln_utf8_decode and kiln_utf8_bits.
 */
#ifndef KILN_UTIL_UTF8_H
#define KILN_UTIL_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* U+FFFD REPLACEMENT CHARACTER, what kiln_utf8_decode gives for ill-formed bytes. */
#define KILN_UTF8_REPLACEMENT 0xFFFDu

/**
 * True when s[0..len) is valid UTF-8 per RFC 3629 (Table 3-7 above): no overlong forms, no
 * surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequence at the end. On
 * false, *bad_offset (if non-NULL) receives the offset of the first byte of the first invalid
 * (or truncated) sequence. len 0 is valid; s may then be NULL.
 */
bool kiln_utf8_valid(const char *s, size_t len, size_t *bad_offset);

/**
 * Length of the valid UTF-8 sequence starting at s (1..4), given `avail` bytes; 0 when the
 * bytes are invalid, -1 when they are a valid but incomplete prefix (more bytes needed;
 * also when avail is 0). Only the bytes the sequence needs are read.
 */
int kiln_utf8_seq_len(const char *s, size_t avail);

/**
 * Decode the code point at s, given `avail` bytes (RFC 3629, Table 3-7). Returns as
 * kiln_utf8_seq_len: the sequence's length 1..4 with *cp its scalar value (never a surrogate,
 * never above U+10FFFF); 0 for ill-formed bytes and -1 for a valid but incomplete prefix (or
 * avail 0), both with *cp = U+FFFD. The caller decides how far to skip on <= 0 (one byte is
 * the usual "replace each maximal ill-formed subpart" practice of Unicode ch. 3 section 3.9).
 */
int kiln_utf8_decode(const char *s, size_t avail, uint32_t *cp);

/**
 * The value the RFC 3629 bit layout of an n-byte sequence gives s[0..n) (n = 1..4), with no
 * check at all: n = 1, the byte itself (0..0xFF); n >= 2, the low 7 - n bits of s[0] followed
 * by the low 6 bits of each of s[1..n). For a well-formed sequence that is its code point
 * (kiln_utf8_decode uses it); for ill-formed bytes it is what a lax decoder makes of them
 * (C0 A0 gives 0x20, ED A0 80 the surrogate 0xD800; at most 0x1FFFFF). Reads s[0..n).
 */
uint32_t kiln_utf8_bits(const char *s, int n);

/**
 * Encode cp into out (RFC 3629 section 3: 1 byte below U+0080, 2 below U+0800, 3 below
 * U+10000, else 4) and return the byte count 1..4. No check: surrogates are written as 3
 * bytes (ED A0..BF xx, which kiln_utf8_decode rejects and kiln_utf8_bits reads back), values
 * up to 0x1FFFFF get the 4-byte pattern; above 0x1FFFFF the first byte is not a lead byte
 * (do not pass such values). Writes out[0..n).
 */
size_t kiln_utf8_encode(uint32_t cp, char out[4]);

#endif
