/* model_owned.c - the memory a model owns (kiln_model.owned), freed by kiln_model_close. */
#include <stdlib.h>

#include "model/model.h"
#include "model/model_internal.h"
#include "util/error.h"

void *kiln_model_alloc(kiln_model *m, size_t bytes) {
    void **list = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *list);
    if (!list) return NULL;
    m->owned = list;
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) return NULL;
    m->owned[m->n_owned++] = p;
    return p;
}

kiln_status kiln_model_oom(const kiln_model *m, kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", m->path);
}
