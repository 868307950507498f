/* registry.c - kiln_backend_create: the one place that names each backend (backend.h). */
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"

kiln_status kiln_backend_create(const kiln_backend_params *p, kiln_backend **out, kiln_error *err) {
    *out = NULL;
    if (!p) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "backend: no parameters");
    switch (p->kind) {
    case KILN_BACKEND_CPU:
        return kiln_cpu_backend_create(p->n_threads, out, err);
    }
    return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "backend: unknown kind %d", (int)p->kind);
}

const kiln_backend_ops *kiln_backend_ops_of(kiln_backend_kind kind) {
    return kind == KILN_BACKEND_CPU ? &kiln_cpu_backend_ops : NULL;
}

void kiln_backend_destroy(kiln_backend *be) {
    if (be) be->ops->destroy(be);
}
