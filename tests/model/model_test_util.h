/* model_test_util.h - helpers shared by the model conformance tests. */
#ifndef KILN_MODEL_TEST_UTIL_H
#define KILN_MODEL_TEST_UTIL_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/loader.h"
#include "format/safetensors.h"
#include "backend/runner.h"
#include "model/model.h"
#include "test.h"

/* A reference tensor from a safetensors file, REQUIREd to exist with dtype dt. */
static inline const kiln_st_tensor *ref_tensor(const kiln_safetensors *st, const char *name,
                                               kiln_dtype dt) {
    const kiln_st_tensor *t = kiln_safetensors_find(st, name);
    if (!t || t->dtype != dt) {
        fprintf(stderr, "reference tensor '%s' missing or of the wrong dtype\n", name);
        exit(1);
    }
    return t;
}

/* All-position logits of ids[0..n) from one forward with a KV cache of kv_type:
 * malloc'd [n, n_vocab]. */
static inline float *forward_all(const kiln_model *m, const int32_t *ids, int32_t n,
                                 kiln_dtype kv_type) {
    kiln_error err = {0};
    kiln_kv_seq *kv = NULL;
    float *logits = malloc((size_t)n * (size_t)m->cfg.n_vocab * sizeof(float));
    REQUIRE(logits);
    if (kiln_kv_seq_create(m, n, kv_type, &kv, &err) != KILN_OK ||
        kiln_model_forward(m, kv, NULL, ids, n, 0, true, logits, &err) != KILN_OK) {
        fprintf(stderr, "forward failed: %s\n", err.message);
        exit(1);
    }
    kiln_kv_seq_destroy(kv);
    return logits;
}

static inline float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

/* A copy of the Hugging Face directory src_dir in a fresh temp dir: config.json rewritten with
 * `edit` applied to its JSON object (edit may be NULL), the other files symlinked. Returns
 * the malloc'd directory path; remove it with variant_dir_remove. */
static inline char *variant_dir(const char *src_dir, void (*edit)(json_t *cfg, const void *arg),
                                const void *arg) {
    char tmpl[] = "/tmp/kiln-variant-XXXXXX";
    char *dir = mkdtemp(tmpl);
    REQUIRE(dir);
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/config.json", src_dir);
    json_error_t jerr;
    json_t *root = json_load_file(src, 0, &jerr);
    REQUIRE(root);
    if (edit) edit(root, arg);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    REQUIRE(json_dump_file(root, dst, JSON_INDENT(2)) == 0);
    json_decref(root);
    const char *links[] = {"model.safetensors", "generation_config.json"};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", src_dir, links[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, links[i]);
        if (access(src, R_OK) == 0) REQUIRE(symlink(src, dst) == 0);
    }
    return strdup(dir);
}

static inline void variant_dir_remove(char *dir) {
    const char *files[] = {"config.json", "model.safetensors", "generation_config.json"};
    char p[4096];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
    free(dir);
}

#endif
