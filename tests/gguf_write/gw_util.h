/* gw_util.h - helpers of the GGUF writer / quantize / convert / gen-model tests. */
#ifndef KILN_GW_UTIL_H
#define KILN_GW_UTIL_H

#include <math.h>
#include <stdint.h>

#include "cli/cli_test_util.h"
#include "format/fmt_util.h"
#include "format/gguf.h"
#include "backend/runner.h"
#include "backend/loader.h"
#include "model/model.h"
#include "test.h"

/* Sets g_kiln (the binary next to the tests) and g_tmpdir (a fresh temp dir). */
static inline void gw_setup(const char *tag) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    if (access(g_kiln, X_OK) != 0) {
        printf("SKIP: the kiln binary %s is not built\n", g_kiln);
        exit(77);
    }
    snprintf(g_tmpdir, sizeof g_tmpdir, "%.200s", make_tmpdir(tag));
}

static inline const char *gw_path(const char *name) {
    static char buf[8][1024];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 1024, "%s/%s", g_tmpdir, name);
    return b;
}

/* Run kiln; on a non-zero exit print its stderr. Returns the exit code. */
static inline int gw_kiln(const char *const *args) {
    char errbuf[4096];
    int rc = run_kiln(args, errbuf, sizeof errbuf);
    if (rc != 0) fprintf(stderr, "kiln %s exited %d: %s\n", args[0], rc, errbuf);
    return rc;
}

static inline kiln_model *gw_open_model(const char *path, bool need_tok) {
    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_model_load_params lp = {0};
    lp.require_tokenizer = need_tok;
    if (kiln_model_open(path, &lp, &m, &err) != KILN_OK) {
        fprintf(stderr, "cannot open %s: %s\n", path, err.message);
        return NULL;
    }
    return m;
}

/* All-position logits of ids[0..n) in one forward (f32 KV): malloc'd [n, n_vocab]. */
static inline float *gw_forward_all(const kiln_model *m, const int32_t *ids, int32_t n) {
    kiln_error err = {0};
    kiln_kv_seq *kv = NULL;
    float *logits = malloc((size_t)n * (size_t)m->cfg.n_vocab * sizeof(float));
    REQUIRE(logits);
    if (kiln_kv_seq_create(m, n, KILN_DTYPE_F32, &kv, &err) != KILN_OK ||
        kiln_model_forward(m, kv, NULL, ids, n, 0, true, logits, &err) != KILN_OK) {
        fprintf(stderr, "forward failed: %s\n", err.message);
        exit(1);
    }
    kiln_kv_seq_destroy(kv);
    return logits;
}

static inline float gw_max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

static inline float gw_max_abs(const float *a, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(a[i]) <= m)) m = fabsf(a[i]);
    return m;
}

/* Dequantized copy of a GGUF tensor (malloc'd, ne[0]*...*ne[3] floats). */
static inline float *gw_tensor_f32(const kiln_gguf_tensor *t) {
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *f = malloc((size_t)n * sizeof *f);
    REQUIRE(f);
    kiln_dtype_traits_of(t->dtype)->to_float(t->data, f, n);
    return f;
}

#endif
