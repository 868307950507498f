/*
 * model_internal.h - what the units of the model loader share inside src/model; not part of
 * the model API (model.h).
 */
#ifndef KILN_MODEL_MODEL_INTERNAL_H
#define KILN_MODEL_MODEL_INTERNAL_H

#include <stddef.h>

#include "model/model.h"

/* ---- model_owned.c ---- */

/** Zeroed memory of `bytes` (at least 1) owned by m: freed by kiln_model_close. NULL when out
 *  of memory. */
void *kiln_model_alloc(kiln_model *m, size_t bytes);

/** Set err to KILN_ERR_OUT_OF_MEMORY naming m's path; returns that status. */
kiln_status kiln_model_oom(const kiln_model *m, kiln_error *err);

#endif
