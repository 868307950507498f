/* model_test_util.h - helpers shared by the model conformance tests. */
#ifndef KILN_MODEL_TEST_UTIL_H
#define KILN_MODEL_TEST_UTIL_H

#include <math.h>
#include <stdint.h>

#include "format/safetensors.h"
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

#endif
