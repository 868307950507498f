/*
 * test_bpe_bytelevel - GPT-2's bytes_to_unicode mapping (OpenAI gpt-2 encoder.py): the
 * printable bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF map to themselves, the remaining 68 bytes
 * map in increasing order to U+0100.. ; the map is a bijection and encode/decode round-trip.
 */
#include <stdint.h>

#include "test.h"
#include "tokenizer/pretokenize.h"

int main(void) {
    int seen[0x200] = {0};
    int n_shifted = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t c = kiln_bytelevel_cpt((uint8_t)b);
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (printable) {
            CHECKF(c == (uint32_t)b, "byte %#x -> U+%04X, want itself", b, c);
        } else {
            /* the n-th non-printable byte (in byte order) maps to 256 + n */
            CHECKF(c == 256u + (uint32_t)n_shifted, "byte %#x -> U+%04X, want U+%04X", b, c,
                   256 + n_shifted);
            n_shifted++;
        }
        REQUIRE(c < 0x200);
        CHECKF(seen[c] == 0, "U+%04X assigned twice", c);
        seen[c]++;
        CHECKF(kiln_bytelevel_byte(c) == b, "inverse of U+%04X is %d, want %d", c,
               kiln_bytelevel_byte(c), b);
    }
    CHECK(n_shifted == 68);
    /* well-known values: ' ' -> 'Ġ' (U+0120), '\n' -> 'Ċ' (U+010A), '\t' -> 'ĉ' (U+0109) */
    CHECK(kiln_bytelevel_cpt(' ') == 0x120);
    CHECK(kiln_bytelevel_cpt('\n') == 0x10A);
    CHECK(kiln_bytelevel_cpt('\t') == 0x109);
    CHECK(kiln_bytelevel_cpt(0xAD) == 0x143);
    CHECK(kiln_bytelevel_cpt(0x7F) == 0x121);
    /* code points outside the map */
    CHECK(kiln_bytelevel_byte(0x20) == -1);
    CHECK(kiln_bytelevel_byte(0x7F) == -1);
    CHECK(kiln_bytelevel_byte(0xAD) == -1);
    CHECK(kiln_bytelevel_byte(0x144) == -1);
    CHECK(kiln_bytelevel_byte(0x4E00) == -1);

    /* encode / decode of every byte value */
    char in[256], enc[512], dec[512];
    for (int b = 0; b < 256; b++) in[b] = (char)b;
    size_t ne = kiln_bytelevel_encode(in, 256, enc);
    CHECK(ne == 94 + 2 * (12 + 82) + 2 * 68); /* kept Latin-1 bytes >= 0x80 take 2 bytes */
    size_t nd = kiln_bytelevel_decode(enc, ne, dec);
    CHECK(nd == 256 && memcmp(dec, in, 256) == 0);

    /* " hello\n" -> "Ġhello" + "Ċ" */
    ne = kiln_bytelevel_encode(" hello\n", 7, enc);
    CHECK(ne == 9 && memcmp(enc, "\xC4\xA0hello\xC4\x8A", 9) == 0);
    /* "é" (C3 A9) -> "Ã©" (U+00C3 U+00A9) */
    ne = kiln_bytelevel_encode("\xC3\xA9", 2, enc);
    CHECK(ne == 4 && memcmp(enc, "\xC3\x83\xC2\xA9", 4) == 0);
    /* decode passes through characters outside the map (added-token texts) */
    nd = kiln_bytelevel_decode("<|\xE4\xB8\x80|>", 7, dec);
    CHECK(nd == 7 && memcmp(dec, "<|\xE4\xB8\x80|>", 7) == 0);
    nd = kiln_bytelevel_decode("\xC4\xA0x\xFF", 4, dec); /* malformed byte copied */
    CHECK(nd == 3 && memcmp(dec, " x\xFF", 3) == 0);
    return kiln_test_finish("test_bpe_bytelevel");
}
