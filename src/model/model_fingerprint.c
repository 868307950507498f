/*
 * model_fingerprint.c - a 64-bit identity of a model's weights, for keys that must never
 * match another model's (the prefix cache's namespace, the disk tier's file headers).
 *
 * It hashes (XXH3-64) the model's source files: the GGUF or llama2.c file, or a Hugging Face
 * directory's config.json and every *.safetensors file in it, in name order. A file
 * contributes its name's last component, its size, its first and last 64 KiB and 64 evenly
 * spaced 4 KiB samples between, so fingerprinting a multi-GiB model reads under 1 MiB per file.
 * Two checkpoints that differ only outside every sample (a handful of weights) would share a
 * fingerprint; fine-tunes and quantizations change every sample.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "model/model.h"
#include "model/model_internal.h"
#include "util/error.h"

#define FP_EDGE    (64 * 1024)
#define FP_SAMPLE  4096
#define FP_SAMPLES 64

static kiln_status hash_range(XXH3_state_t *st, int fd, off_t off, size_t len, const char *path,
                              kiln_error *err) {
    unsigned char buf[FP_SAMPLE];
    while (len > 0) {
        size_t want = len < sizeof buf ? len : sizeof buf;
        ssize_t got = pread(fd, buf, want, off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return kiln_error_set(err, KILN_ERR_IO, "%s: reading for the fingerprint: %s", path,
                                  got < 0 ? strerror(errno) : "unexpected end of file");
        XXH3_64bits_update(st, buf, (size_t)got);
        off += got;
        len -= (size_t)got;
    }
    return KILN_OK;
}

static kiln_status hash_file(XXH3_state_t *st, const char *path, kiln_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_error_set(err, KILN_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return kiln_error_set(err, KILN_ERR_IO, "%s: %s", path, strerror(errno));
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    XXH3_64bits_update(st, base, strlen(base) + 1);
    uint64_t size = (uint64_t)sb.st_size;
    XXH3_64bits_update(st, &size, sizeof size);
    kiln_status rc;
    if (size <= 2 * FP_EDGE + FP_SAMPLES * FP_SAMPLE) {
        rc = hash_range(st, fd, 0, (size_t)size, path, err);
    } else {
        rc = hash_range(st, fd, 0, FP_EDGE, path, err);
        uint64_t span = size - 2 * FP_EDGE - FP_SAMPLE;
        for (int i = 0; rc == KILN_OK && i < FP_SAMPLES; i++)
            rc = hash_range(st, fd, (off_t)(FP_EDGE + span * (uint64_t)i / (FP_SAMPLES - 1)),
                            FP_SAMPLE, path, err);
        if (rc == KILN_OK) rc = hash_range(st, fd, (off_t)(size - FP_EDGE), FP_EDGE, path, err);
    }
    close(fd);
    return rc;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static kiln_status hash_dir(XXH3_state_t *st, const char *dir, kiln_error *err) {
    DIR *d = opendir(dir);
    if (!d) return kiln_error_set(err, KILN_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    kiln_status rc = KILN_OK;
    for (struct dirent *e; (e = readdir(d));) {
        if (!ends_with(e->d_name, ".safetensors") && strcmp(e->d_name, "config.json")) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
                break;
            }
            names = nn;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len))) {
            rc = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (rc == KILN_OK) {
        qsort(names, n, sizeof *names, name_cmp);
        for (size_t i = 0; rc == KILN_OK && i < n; i++) rc = hash_file(st, names[i], err);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

kiln_status kiln_model_fingerprint(const kiln_model *m, uint64_t *out, kiln_error *err) {
    if (!m || !out || !m->path)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "fingerprint: NULL argument");
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    const kiln_model_config *c = &m->cfg;
    const int32_t geo[] = {(int32_t)c->arch, c->n_vocab, c->n_embd, c->n_layer, c->n_head,
                           c->n_head_kv, c->head_dim, c->n_ff};
    XXH3_64bits_update(&st, geo, sizeof geo);
    kiln_status rc = kiln_model_is_dir(m->path) ? hash_dir(&st, m->path, err)
                                                : hash_file(&st, m->path, err);
    if (rc == KILN_OK) *out = XXH3_64bits_digest(&st);
    return rc;
}
