/*
 * make_fuzz_corpus - builds the seed corpora of the fuzz targets at test time (never
 * committed): usage make_fuzz_corpus SHARED_DIR OUT_DIR. Writes OUT_DIR/{gguf,safetensors,
 * llama2c}/ from the model files of SHARED_DIR (files over 400 KB cut to their first 64 KB,
 * which keeps the headers the readers parse) plus small hand-built valid files, writes
 * OUT_DIR/disk_block/ (the disk tier's seed block file, with and without a checkpoint, under
 * each of fuzz_disk_block's four mode bytes), and creates OUT_DIR/../fuzz-artifacts/ for crash
 * reports.
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "disk_block_seed.h"
#include "gguf_builder.h"

#define WHOLE_LIMIT (400u * 1024u)
#define CUT         (64u * 1024u)

static char out_dir[4096];
static int n_written;

static void emit(const char *sub, const char *name, const void *prefix, size_t np, const void *p,
                 size_t n) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    if (np) fwrite(prefix, 1, np, f);
    if (n) fwrite(p, 1, n, f);
    fclose(f);
    n_written++;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Number of entries in a tokenizer.bin image. */
static int count_tokens(const uint8_t *p, size_t n) {
    size_t pos = 4;
    int k = 0;
    while (pos + 8 <= n) {
        int32_t len;
        memcpy(&len, p + pos + 4, 4);
        if (len < 0 || (size_t)len > n - pos - 8) break;
        pos += 8 + (size_t)len;
        k++;
    }
    return k;
}

static int visit(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    if (flag != FTW_F) return 0;
    const char *base = path + ftw->base;
    const char *sub = NULL;
    if (ends_with(base, ".gguf")) sub = "gguf";
    if (ends_with(base, ".safetensors")) sub = "safetensors";
    if (ends_with(base, ".bin")) sub = "llama2c";
    if (!sub) return 0;
    size_t n = 0;
    uint8_t *p = read_whole(path, &n);
    if (!p) return 0;
    size_t keep = n > WHOLE_LIMIT ? CUT : n;
    char name[600];
    snprintf(name, sizeof name, "%.200s%s", base, keep < n ? ".cut" : "");
    if (strcmp(sub, "llama2c") == 0) {
        if (strncmp(base, "tok", 3) == 0) {
            int k = count_tokens(p, n);
            uint8_t pre[3] = {1, (uint8_t)((k - 1) & 255), (uint8_t)((k - 1) >> 8)};
            if (k > 0) emit(sub, name, pre, 3, p, keep);
        } else {
            uint8_t pre[1] = {0};
            emit(sub, name, pre, 1, p, keep);
        }
    } else {
        emit(sub, name, NULL, 0, p, keep);
    }
    free(p);
    return 0;
}

static void synthetic_gguf(uint32_t version) {
    gb g = {0};
    gb_header(&g, version, 2, 6);
    gb_kv_str(&g, "general.architecture", "llama");
    gb_kv_u32(&g, "general.alignment", 64);
    gb_key(&g, "f", 6);
    bb_f32(&g.b, 1.5f);
    gb_key(&g, "toks", 9);
    gb_arr(&g, 8, 2);
    gb_str(&g, "a");
    gb_str(&g, "bc");
    gb_key(&g, "nest", 9);
    gb_arr(&g, 9, 1);
    gb_arr(&g, 5, 2);
    bb_u32(&g.b, 1);
    bb_u32(&g.b, 2);
    gb_key(&g, "b", 7);
    bb_u8(&g.b, 1);
    uint64_t ne1[2] = {4, 2}, ne2[1] = {32};
    gb_tensor(&g, "w", 2, ne1, 0, 0);
    gb_tensor(&g, "q", 1, ne2, 8, 64);
    bb_pad_to(&g.b, 64);
    bb_zeros(&g.b, 64 + 34);
    char name[32];
    snprintf(name, sizeof name, "synthetic-v%u.gguf", version);
    emit("gguf", name, NULL, 0, g.b.p, g.b.n);
    bb_free(&g.b);
}

static void synthetic_safetensors(void) {
    const char *j =
        "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],"
        "\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"BF16\",\"shape\":[3],"
        "\"data_offsets\":[16,22]}}";
    bb b = {0};
    bb_u64(&b, strlen(j));
    bb_bytes(&b, j, strlen(j));
    bb_zeros(&b, 22);
    emit("safetensors", "synthetic.safetensors", NULL, 0, b.p, b.n);
    bb_free(&b);
}

static void synthetic_llama2c(int32_t vocab) {
    const int32_t h[7] = {8, 12, 1, 2, 1, vocab, 4};
    uint32_t dim = 8, hid = 12, hs = 4, kv = 4, V = 3, S = 4;
    size_t floats = V * dim + dim + dim * dim + 2 * dim * kv + dim * dim + dim + 3 * dim * hid +
                    dim + 2 * (S * hs / 2) + (vocab < 0 ? V * dim : 0);
    bb b = {0};
    bb_bytes(&b, h, sizeof h);
    for (size_t i = 0; i < floats; i++) bb_f32(&b, (float)i);
    uint8_t pre[1] = {0};
    emit("llama2c", vocab < 0 ? "synthetic-sep.bin" : "synthetic.bin", pre, 1, b.p, b.n);
    bb_free(&b);
}

/* fuzz_disk_block's input: a mode byte, then the file */
static void synthetic_disk_blocks(void) {
    uint8_t file[SEED_MAX];
    for (int with_state = 0; with_state < 2; with_state++) {
        size_t n = seed_file(file, with_state);
        for (uint8_t mode = 0; mode < 4; mode++) {
            char name[64];
            snprintf(name, sizeof name, "seed-%s-mode%u.kvb", with_state ? "state" : "plain", mode);
            emit("disk_block", name, &mode, 1, file, n);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SHARED_DIR OUT_DIR\n", argv[0]);
        return 2;
    }
    snprintf(out_dir, sizeof out_dir, "%s", argv[2]);
    const char *subs[] = {"",         "/gguf",       "/safetensors",
                          "/llama2c", "/disk_block", "/../fuzz-artifacts"};
    for (int i = 0; i < 6; i++) {
        char d[4200];
        snprintf(d, sizeof d, "%s%s", out_dir, subs[i]);
        mkdir(d, 0755);
    }
    const char *roots[] = {"models", "tokenizer", "reference", "golden"};
    for (int i = 0; i < 4; i++) {
        char r[4200];
        snprintf(r, sizeof r, "%s/%s", argv[1], roots[i]);
        nftw(r, visit, 16, FTW_PHYS);
    }
    for (uint32_t v = 1; v <= 3; v++) synthetic_gguf(v);
    synthetic_safetensors();
    synthetic_llama2c(3);
    synthetic_llama2c(-3);
    synthetic_disk_blocks();
    printf("make_fuzz_corpus: %d seed files in %s\n", n_written, out_dir);
    return 0;
}
