/*
 * fuzz_disk_block - libFuzzer target for the disk tier's block-file verifier
 * (kiln_disk_block_read_fd, the code every disk-tier read goes through). Byte 0 is the mode:
 * bit 0 reseals the image first (kiln_disk_block_seal recomputes its checksums, so mutations
 * get past them to the field checks), bit 1 passes a checkpoint buffer. The rest is the file,
 * put in a memfd and verified against the seed block (disk_block_seed.h).
 *
 * Oracles: no crash or sanitizer report; a rejection always gives a reason; an accepted file
 * read with a checkpoint buffer is byte for byte the canonical encoding of what was returned
 * (every header byte is checked, the payload is covered by its checksums); an accepted file
 * read without one returns exactly the file's K and V bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "disk_block_seed.h"

static int memfd = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (memfd < 0) memfd = memfd_create("fuzz-block", MFD_CLOEXEC);
    if (memfd < 0) return 0;
    unsigned mode = data[0];
    size_t n = size - 1;
    uint8_t *img = malloc(n ? n : 1);
    if (!img) return 0;
    if (n) memcpy(img, data + 1, n);
    if (mode & 1) kiln_disk_block_seal(img, n);
    if (ftruncate(memfd, 0) != 0 || (n && pwrite(memfd, img, n, 0) != (ssize_t)n)) {
        free(img);
        return 0;
    }
    kiln_disk_block_desc d = seed_desc();
    uint8_t *kv = malloc(SEED_KVB), *st = malloc(SEED_SB);
    bool want_state = mode & 2, got = false;
    char why[256];
    kiln_status s =
        kiln_disk_block_read_fd(memfd, &d, kv, want_state ? st : NULL, &got, why, sizeof why);
    if (s == KILN_OK) {
        size_t h = (size_t)kiln_disk_block_header_bytes(SEED_BS);
        if (want_state) {
            uint8_t enc[SEED_MAX];
            size_t m = kiln_disk_block_encode(&d, kv, got ? st : NULL, enc, sizeof enc);
            if (m != n || memcmp(enc, img, n) != 0) __builtin_trap();
        } else if (got || n < h + SEED_KVB || memcmp(kv, img + h, SEED_KVB) != 0) {
            __builtin_trap();
        }
    } else if (!why[0] || (s != KILN_ERR_FORMAT && s != KILN_ERR_IO)) {
        __builtin_trap();
    }
    free(kv);
    free(st);
    free(img);
    return 0;
}
