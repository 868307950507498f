/*
 * loader.h - loading a model for a backend: the model layer binds the weights from the file
 * (model.h kiln_model_load_file), and the backend places them (its place_weights entry).
 */
#ifndef KILN_BACKEND_LOADER_H
#define KILN_BACKEND_LOADER_H

#include "model/model.h"

/**
 * kiln_model_load_file with the weights placed for the CPU backend (params->backend NULL) or
 * the backend params->backend names: for the CPU, the matrices the forward pass multiplies by
 * are moved into owned memory with transparent huge pages, F16 ones packed into
 * KILN_LAYOUT_F16_R64 (backend/cpu/cpu.h), the others copied as they are (the mapped pages of
 * each source are released), unless env KILN_REPACK=0, params->keep_file_layout, or the copies
 * would exceed 3/4 of MemAvailable; a matrix whose copy cannot be allocated stays mapped.
 * params may be NULL (defaults). Errors: as kiln_model_load_file.
 */
kiln_status kiln_model_open(const char *path, const kiln_model_load_params *params,
                            kiln_model **out, kiln_error *err);

#endif
