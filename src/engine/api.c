/*
 * api.c - the model half of the public API (kiln.h): loading, freeing and a few read-only
 * accessors over the internal kiln_model.
 */
#include <string.h>

#include "kiln.h"
#include "backend/loader.h"
#include "model/model.h"
#include "util/error.h"
#include "util/vec.h"

/* the load on one device kind (CPU or CUDA) */
static kiln_status load_on(const char *path, const kiln_model_params *params,
                           kiln_device_kind dev, kiln_model **out, kiln_error *err) {
    kiln_model_load_params lp = {0};
    if (params) {
        lp.tokenizer_path = params->tokenizer_path;
        lp.require_tokenizer = params->require_tokenizer;
    }
    if (dev == KILN_DEVICE_CUDA) {
        const int32_t idx = params ? params->device_index : 0;
        lp.backend = kiln_backend_ops_of(KILN_BACKEND_CUDA);
        if (!lp.backend)
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "%s: device cuda: this kiln was built without CUDA "
                                  "(configure with -DKILN_CUDA=ON where nvcc is installed)",
                                  path);
        const int32_t n = kiln_backend_device_count(KILN_BACKEND_CUDA);
        if (idx < 0 || idx >= n)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: device cuda:%d: %s", path,
                                  idx,
                                  n == 0 ? "no CUDA GPU is available (no driver or no device)"
                                         : "no such GPU");
        lp.device = idx;
    }
    return kiln_model_open(path, &lp, out, err);
}

kiln_status kiln_model_load(const char *path, const kiln_model_params *params, kiln_model **out,
                            kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = NULL;
    if (!path) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "path must not be NULL");
    const kiln_device_kind dev = params ? params->device : KILN_DEVICE_AUTO;
    if (dev == KILN_DEVICE_CPU || dev == KILN_DEVICE_CUDA) return load_on(path, params, dev, out, err);
    if (dev != KILN_DEVICE_AUTO)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: unknown device kind %d", path,
                              (int)dev);
    /* AUTO: the GPU when there is one and its backend runs the model, else the CPU */
    const int32_t idx = params ? params->device_index : 0;
    if (idx >= 0 && idx < kiln_backend_device_count(KILN_BACKEND_CUDA)) {
        const kiln_status st = load_on(path, params, KILN_DEVICE_CUDA, out, err);
        if (st != KILN_ERR_UNSUPPORTED) return st;
        if (err) *err = (kiln_error){0};
    }
    return load_on(path, params, KILN_DEVICE_CPU, out, err);
}

kiln_device_kind kiln_model_device(const kiln_model *model, int32_t *index) {
    const bool gpu = model && model->placed && !model->placed->host_memory;
    if (index) *index = gpu ? model->device : 0;
    return gpu ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU;
}

int32_t kiln_device_count(kiln_device_kind kind) {
    if (kind == KILN_DEVICE_CPU) return 1;
    if (kind == KILN_DEVICE_CUDA) return kiln_backend_device_count(KILN_BACKEND_CUDA);
    return 0;
}

kiln_status kiln_device_memory(kiln_device_kind kind, int32_t index, int64_t *free_bytes,
                               int64_t *total_bytes, kiln_error *err) {
    int64_t f = 0, t = 0;
    const kiln_status st =
        kind == KILN_DEVICE_CUDA
            ? kiln_backend_device_memory(KILN_BACKEND_CUDA, index, &f, &t, err)
            : kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                             "kiln_device_memory: only KILN_DEVICE_CUDA devices report memory");
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return st;
}

void kiln_model_free(kiln_model *model) {
    kiln_model_close(model);
}

int32_t kiln_model_n_vocab(const kiln_model *model) {
    return model ? model->cfg.n_vocab : 0;
}

int32_t kiln_model_n_ctx_train(const kiln_model *model) {
    return model && model->cfg.n_ctx_train > 0 ? model->cfg.n_ctx_train : 0;
}

kiln_status kiln_model_tokenize(const kiln_model *model, const char *text, size_t len,
                                bool add_special, bool parse_special, int32_t *ids, int32_t cap,
                                int32_t *n_out, kiln_error *err) {
    if (!model || !n_out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "model and n_out must not be NULL");
    *n_out = 0;
    if (!model->tokenizer)
        return kiln_error_set(err, KILN_ERR_NOT_FOUND, "the model %s has no tokenizer",
                              model->path ? model->path : "");
    if (cap < 0 || (cap > 0 && !ids))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "ids is NULL or cap < 0");
    kiln_ivec v = {0};
    kiln_status st =
        kiln_tokenizer_encode(model->tokenizer, text, len, add_special, parse_special, &v, err);
    if (st) return st;
    if (v.n > INT32_MAX) {
        kiln_ivec_free(&v);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "text is too long to tokenize");
    }
    *n_out = (int32_t)v.n;
    size_t n = v.n < (size_t)cap ? v.n : (size_t)cap;
    if (n) memcpy(ids, v.data, n * sizeof *ids);
    kiln_ivec_free(&v);
    return KILN_OK;
}

size_t kiln_model_token_piece(const kiln_model *model, int32_t id, char *buf, size_t cap) {
    if (!model || !model->tokenizer) return 0;
    return kiln_tokenizer_piece(model->tokenizer, id, false, buf, cap);
}

kiln_status kiln_model_detokenize(const kiln_model *model, const int32_t *ids, int32_t n, char *buf,
                                  size_t cap, size_t *n_out, kiln_error *err) {
    if (!model || !n_out)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "model and n_out must not be NULL");
    *n_out = 0;
    if (n < 0 || (n > 0 && !ids))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "ids is NULL or n < 0");
    if (!model->tokenizer)
        return kiln_error_set(err, KILN_ERR_NOT_FOUND, "the model %s has no tokenizer",
                              model->path ? model->path : "");
    int32_t nv = kiln_tokenizer_n_vocab(model->tokenizer);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "token id %d at index %d is outside [0, %d)", ids[i], i, nv);
    kiln_detok *d = NULL;
    kiln_status st = kiln_detok_create(model->tokenizer, &d, err);
    size_t total = 0;
    const char *text;
    size_t len;
    for (int32_t i = 0; st == KILN_OK && i <= n; i++) {
        st = i < n ? kiln_detok_push(d, ids[i], &text, &len, err)
                   : kiln_detok_flush(d, &text, &len, err);
        if (st == KILN_OK && len > 0) {
            if (buf && total < cap)
                memcpy(buf + total, text, len < cap - total ? len : cap - total);
            total += len;
        }
    }
    kiln_detok_destroy(d);
    if (st == KILN_OK) *n_out = total;
    return st;
}

int32_t kiln_model_bos(const kiln_model *model) {
    return model && model->tokenizer ? kiln_tokenizer_bos(model->tokenizer) : -1;
}

int32_t kiln_model_eos(const kiln_model *model) {
    return model && model->tokenizer ? kiln_tokenizer_eos(model->tokenizer) : -1;
}

const char *kiln_model_chat_template(const kiln_model *model) {
    return model && model->tokenizer ? kiln_tokenizer_chat_template(model->tokenizer) : NULL;
}

bool kiln_model_has_tokenizer(const kiln_model *model) {
    return model && model->tokenizer;
}

void kiln_model_generation_defaults(const kiln_model *model, kiln_generation_defaults *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!model) return;
    *out = model->gen;
}
