#include "util/vec.h"

#include <stdlib.h>
#include <string.h>

static kiln_status reserve(kiln_ivec *v, size_t need) {
    if (need <= v->cap) return KILN_OK;
    size_t cap = v->cap ? v->cap : 16;
    while (cap < need) cap *= 2;
    int32_t *d = realloc(v->data, cap * sizeof *d);
    if (!d) return KILN_ERR_OUT_OF_MEMORY;
    v->data = d;
    v->cap = cap;
    return KILN_OK;
}

kiln_status kiln_ivec_push(kiln_ivec *v, int32_t x) {
    if (reserve(v, v->n + 1) != KILN_OK) return KILN_ERR_OUT_OF_MEMORY;
    v->data[v->n++] = x;
    return KILN_OK;
}

kiln_status kiln_ivec_append(kiln_ivec *v, const int32_t *xs, size_t n) {
    if (n == 0) return KILN_OK;
    if (reserve(v, v->n + n) != KILN_OK) return KILN_ERR_OUT_OF_MEMORY;
    memcpy(v->data + v->n, xs, n * sizeof *xs);
    v->n += n;
    return KILN_OK;
}

void kiln_ivec_free(kiln_ivec *v) {
    free(v->data);
    v->data = NULL;
    v->n = v->cap = 0;
}
