/*
 * disk_block_seed.h - the one block the disk-block fuzz target verifies against, shared by
 * fuzz_disk_block.c (the expectation) and make_fuzz_corpus.c (the seed files, encoded with
 * kiln_disk_block_encode). A small geometry, so files stay short and mutations reach every
 * field: 2 layers, kv_dim 4, 4 tokens per block, f16 pages (128 kv bytes), a 24-byte checkpoint.
 */
#ifndef KILN_TESTS_FUZZ_DISK_BLOCK_SEED_H
#define KILN_TESTS_FUZZ_DISK_BLOCK_SEED_H

#include <stdint.h>

#include "kv/disk_tier.h"
#include "tensor/dtype.h"

#define SEED_BS  4
#define SEED_KVB (2 * 2 * SEED_BS * 4 * 2)
#define SEED_SB  24
/* a seed file: header + kv + state */
#define SEED_MAX (112 + 4 * SEED_BS + SEED_KVB + SEED_SB)

static const int32_t seed_tokens[SEED_BS] = {1, 15043, 29892, -7};

static inline kiln_disk_block_desc seed_desc(void) {
    kiln_disk_block_desc d = {.fingerprint = 0x0123456789abcdefull,
                              .ns = 0xfedcba9876543210ull,
                              .page_format = KILN_DTYPE_F16,
                              .n_layer = 2,
                              .kv_dim = 4,
                              .block_size = SEED_BS,
                              .kv_bytes = SEED_KVB,
                              .state_bytes = SEED_SB,
                              .hash = 0xa5a5a5a55a5a5a5aull,
                              .parent = 0xfedcba9876543210ull,
                              .tokens = seed_tokens};
    return d;
}

/* The seed block's file into out[SEED_MAX] (with or without the checkpoint); returns its size. */
static inline size_t seed_file(uint8_t *out, int with_state) {
    uint8_t kv[SEED_KVB], st[SEED_SB];
    for (int i = 0; i < SEED_KVB; i++) kv[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < SEED_SB; i++) st[i] = (uint8_t)(i * 91 + 3);
    kiln_disk_block_desc d = seed_desc();
    return kiln_disk_block_encode(&d, kv, with_state ? st : NULL, out, SEED_MAX);
}

#endif
