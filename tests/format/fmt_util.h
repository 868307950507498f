/*
 * fmt_util.h - helpers shared by the format tests: a little-endian byte builder (used to
 * write GGUF, safetensors and llama2.c images by hand, independently of the readers),
 * whole-file reads, temp directories and error-message checks.
 */
#ifndef KILN_TEST_FMT_UTIL_H
#define KILN_TEST_FMT_UTIL_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static inline void bb_bytes(bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n) nc *= 2;
        b->p = realloc(b->p, nc);
        if (!b->p) abort();
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static inline void bb_u8(bb *b, uint8_t v) {
    bb_bytes(b, &v, 1);
}
static inline void bb_u16(bb *b, uint16_t v) {
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    bb_bytes(b, x, 2);
}
static inline void bb_u32(bb *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    bb_bytes(b, x, 4);
}
static inline void bb_u64(bb *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    bb_bytes(b, x, 8);
}
static inline void bb_f32(bb *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    bb_u32(b, u);
}
static inline void bb_f64(bb *b, double f) {
    uint64_t u;
    memcpy(&u, &f, 8);
    bb_u64(b, u);
}
static inline void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_u8(b, 0);
}
static inline void bb_pad_to(bb *b, size_t align) {
    while (b->n % align) bb_u8(b, 0);
}
static inline void bb_free(bb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
static inline void put_u32_at(uint8_t *p, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) p[at + i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64_at(uint8_t *p, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) p[at + i] = (uint8_t)(v >> (8 * i));
}

/* Reads a whole file into malloc'd memory (8-byte aligned); NULL on failure. */
static inline uint8_t *read_whole(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = n > 0 ? (size_t)n : 0;
    return p;
}

static inline int write_whole(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* A fresh temp directory (static buffer). */
static inline const char *make_tmpdir(const char *tag) {
    static char buf[512];
    const char *base = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/kiln-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(1);
    }
    return buf;
}

static inline int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}
static inline void rm_rf(const char *dir) {
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* A non-empty message that names `name`. */
static inline int msg_names(const kiln_error *e, const char *name) {
    return e->message[0] != '\0' && strstr(e->message, name) != NULL;
}

/* Deterministic PRNG for the bit-flip loops. */
static inline uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#endif
