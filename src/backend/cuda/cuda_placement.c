/*
 * cuda_placement.c - the CUDA backend's weight placement (cuda_backend.h
 * kiln_cuda_place_device): every matrix and vector the forward pass reads, copied once into
 * one device allocation.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "util/error.h"

#define PLACE_ALIGN 256

typedef struct cuda_placement {
    int32_t device;
    void *base;
    size_t bytes;
} cuda_placement;

/* one distinct host source: its bytes and its offset in the device block */
typedef struct source {
    const void *host;
    size_t bytes, off;
} source;

/* index of host in src[0 .. n) or -1 (linear: a model has a few hundred sources) */
static ptrdiff_t find_source(const source *src, size_t n, const void *host) {
    for (size_t i = 0; i < n; i++)
        if (src[i].host == host) return (ptrdiff_t)i;
    return -1;
}

/* add a source (deduplicated by address, the larger size kept); returns its index or -1 */
static ptrdiff_t add_source(source *src, size_t *n, const void *host, size_t bytes) {
    ptrdiff_t i = find_source(src, *n, host);
    if (i >= 0) {
        if (bytes > src[i].bytes) src[i].bytes = bytes;
        return i;
    }
    src[*n] = (source){host, bytes, 0};
    return (ptrdiff_t)(*n)++;
}

static kiln_status cuda_fail(kiln_error *err, kiln_status st, cudaError_t e, int32_t device,
                             const char *what) {
    (void)cudaGetLastError(); /* clear a non-sticky error */
    return kiln_error_set(err, st, "cuda backend: device %d: %s: %s", device, what,
                          cudaGetErrorString(e));
}

kiln_status kiln_cuda_place_device(int32_t device, kiln_mat *const *mats, size_t n_mats,
                                   const kiln_vec_ref *vecs, size_t n_vecs, void **handle,
                                   kiln_error *err) {
    *handle = NULL;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) {
        (void)cudaGetLastError();
        n_dev = 0;
    }
    if (device < 0 || device >= n_dev)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "cuda backend: no device %d (%d CUDA device(s) present)", device,
                              n_dev);
    for (size_t i = 0; i < n_mats; i++) {
        const kiln_mat *w = mats[i];
        if (!w || !w->data) continue;
        const bool ok_dtype = w->dtype == KILN_DTYPE_F32 || w->dtype == KILN_DTYPE_F16 ||
                              w->dtype == KILN_DTYPE_BF16 || w->dtype == KILN_DTYPE_Q8_0 ||
                              w->dtype == KILN_DTYPE_Q4_0;
        if (!ok_dtype || w->layout != KILN_MAT_ROWS)
            return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                                  "cuda backend: weight '%s' is %s%s; this backend multiplies f32, "
                                  "f16, bf16, q8_0 and q4_0 weights in the file's row layout "
                                  "(convert the model: kiln quantize --type q8_0 or q4_0)",
                                  w->name ? w->name : "?", kiln_dtype_name(w->dtype),
                                  w->layout != KILN_MAT_ROWS ? " in a CPU-packed layout" : "");
    }
    source *src = malloc((n_mats + n_vecs + 1) * sizeof *src);
    ptrdiff_t *mat_src = malloc((n_mats + 1) * sizeof *mat_src);
    ptrdiff_t *vec_src = malloc((n_vecs + 1) * sizeof *vec_src);
    cuda_placement *pl = calloc(1, sizeof *pl);
    if (!src || !mat_src || !vec_src || !pl) {
        free(src);
        free(mat_src);
        free(vec_src);
        free(pl);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "cuda backend: out of memory");
    }
    size_t n_src = 0;
    for (size_t i = 0; i < n_mats; i++) {
        const kiln_mat *w = mats[i];
        mat_src[i] = -1;
        if (!w || !w->data) continue;
        const size_t bytes = kiln_dtype_row_size(w->dtype, w->n_in) * (size_t)w->n_out;
        mat_src[i] = add_source(src, &n_src, w->data, bytes);
    }
    for (size_t i = 0; i < n_vecs; i++) {
        vec_src[i] = -1;
        if (!vecs[i].p || !*vecs[i].p || vecs[i].n < 1) continue;
        vec_src[i] = add_source(src, &n_src, *vecs[i].p, (size_t)vecs[i].n * sizeof(float));
    }
    size_t total = 0;
    for (size_t i = 0; i < n_src; i++) {
        src[i].off = total;
        total += (src[i].bytes + PLACE_ALIGN - 1) & ~(size_t)(PLACE_ALIGN - 1);
    }
    kiln_status st = KILN_OK;
    void *base = NULL;
    cudaError_t e = cudaSetDevice(device);
    size_t free_b = 0, total_b = 0;
    if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        st = cuda_fail(err, KILN_ERR_INTERNAL, e, device, "reading the free memory");
        goto fail;
    }
    if (total > free_b) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY,
                            "cuda backend: the weights need %.1f MiB (%zu bytes: %zu distinct "
                            "matrices and vectors) but device %d has %.1f MiB free of %.1f MiB",
                            (double)total / 1048576.0, total, n_src, device,
                            (double)free_b / 1048576.0, (double)total_b / 1048576.0);
        goto fail;
    }
    if (total > 0 && (e = cudaMalloc(&base, total)) != cudaSuccess) {
        st = cuda_fail(err, KILN_ERR_OUT_OF_MEMORY, e, device, "allocating the weights");
        goto fail;
    }
    for (size_t i = 0; i < n_src; i++)
        if ((e = cudaMemcpy((char *)base + src[i].off, src[i].host, src[i].bytes,
                            cudaMemcpyHostToDevice)) != cudaSuccess) {
            cudaFree(base);
            st = cuda_fail(err, KILN_ERR_INTERNAL, e, device, "copying the weights");
            goto fail;
        }
    for (size_t i = 0; i < n_mats; i++)
        if (mat_src[i] >= 0) mats[i]->data = (char *)base + src[mat_src[i]].off;
    for (size_t i = 0; i < n_vecs; i++)
        if (vec_src[i] >= 0) *vecs[i].p = (const float *)((char *)base + src[vec_src[i]].off);
    pl->device = device;
    pl->base = base;
    pl->bytes = total;
    *handle = pl;
    pl = NULL;
fail:
    free(src);
    free(mat_src);
    free(vec_src);
    free(pl);
    return st;
}

void kiln_cuda_release_weights(void *handle) {
    cuda_placement *pl = handle;
    if (!pl) return;
    if (cudaSetDevice(pl->device) == cudaSuccess && pl->base) cudaFree(pl->base);
    free(pl);
}
