/* registry.c - kiln_backend_create: the one place that names each backend (backend.h). The
 * CUDA backend is compiled in when CMake finds nvcc (KILN_HAVE_CUDA, -DKILN_CUDA). */
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#if defined(KILN_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif
#include "util/error.h"

kiln_status kiln_backend_create(const kiln_backend_params *p, kiln_backend **out, kiln_error *err) {
    *out = NULL;
    if (!p) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "backend: no parameters");
    switch (p->kind) {
    case KILN_BACKEND_CPU:
        return kiln_cpu_backend_create(p->n_threads, out, err);
    case KILN_BACKEND_CUDA:
#if defined(KILN_HAVE_CUDA)
        return kiln_cuda_backend_create(p->device, out, err);
#else
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "backend: this kiln was built without CUDA (configure with "
                              "-DKILN_CUDA=ON where nvcc is installed)");
#endif
    }
    return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "backend: unknown kind %d", (int)p->kind);
}

const kiln_backend_ops *kiln_backend_ops_of(kiln_backend_kind kind) {
    switch (kind) {
    case KILN_BACKEND_CPU:
        return &kiln_cpu_backend_ops;
    case KILN_BACKEND_CUDA:
#if defined(KILN_HAVE_CUDA)
        return &kiln_cuda_backend_ops;
#else
        return NULL;
#endif
    }
    return NULL;
}

int32_t kiln_backend_device_count(kiln_backend_kind kind) {
    switch (kind) {
    case KILN_BACKEND_CPU:
        return 1;
    case KILN_BACKEND_CUDA:
#if defined(KILN_HAVE_CUDA)
        return kiln_cuda_device_count();
#else
        return 0;
#endif
    }
    return 0;
}

kiln_status kiln_backend_device_memory(kiln_backend_kind kind, int32_t device, int64_t *free_b,
                                       int64_t *total_b, kiln_error *err) {
    *free_b = *total_b = 0;
    if (kind != KILN_BACKEND_CUDA)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "device memory: only CUDA devices report it");
#if defined(KILN_HAVE_CUDA)
    return kiln_cuda_device_memory(device, free_b, total_b, err);
#else
    return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                          "device memory: cuda:%d: this build has no CUDA backend", device);
#endif
}

void kiln_backend_destroy(kiln_backend *be) {
    if (be) be->ops->destroy(be);
}
