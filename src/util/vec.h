/* vec.h - a growable int32 array, the currency of token id lists. */
#ifndef KILN_UTIL_VEC_H
#define KILN_UTIL_VEC_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef struct kiln_ivec {
    int32_t *data;
    size_t n, cap;
} kiln_ivec;

/** Append one value. Returns KILN_ERR_OUT_OF_MEMORY on allocation failure (vec unchanged). */
kiln_status kiln_ivec_push(kiln_ivec *v, int32_t x);
/** Append n values. Same errors as kiln_ivec_push. */
kiln_status kiln_ivec_append(kiln_ivec *v, const int32_t *xs, size_t n);
/** Free the storage and zero the struct. */
void kiln_ivec_free(kiln_ivec *v);

#endif
