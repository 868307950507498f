/*
 * weight_placement.h - moving weight matrices out of the file mappings they were bound in
 * into owned, 64-byte aligned memory with transparent huge pages, F16 ones packed into the CPU
 * backend's KILN_LAYOUT_F16_R64 (backend/cpu/cpu.h), and releasing the mapped pages they were
 * read from. Used by kiln_model_open (model.c); knows kiln_mat and the mappings, nothing else
 * of the model.
 */
#ifndef KILN_MODEL_WEIGHT_PLACEMENT_H
#define KILN_MODEL_WEIGHT_PLACEMENT_H

#include <stddef.h>

typedef struct kiln_mat kiln_mat;                 /* model/model.h */
typedef struct kiln_mapped_file kiln_mapped_file; /* util/mapped_file.h */

/** Allocates `bytes` of zeroed memory that stays valid as long as the weights (the caller
 *  frees it with them), or returns NULL. owner: the caller's context. */
typedef void *(*kiln_placement_alloc_fn)(void *owner, size_t bytes);

/**
 * Place the matrices mats[0 .. n_mats) (NULL entries are skipped) the forward pass multiplies
 * by. Considered are row-layout matrices with data: F16 ones wherever they are, others only
 * while they lie in one of the file mappings maps[0 .. n_maps) (NULL entries never match), so
 * owned copies are not copied again. Each is moved into owned, 64-byte aligned memory with
 * transparent huge pages: F16 packed into KILN_LAYOUT_F16_R64 (w->layout set), other dtypes
 * copied as they are; w->data then points at the copy and the whole pages of its source inside
 * a mapping are released. The copies come from one 2 MiB-aligned block from alloc, in the
 * order of mats, or from one allocation each when that block cannot be had; a matrix whose
 * copy cannot be allocated stays where it is.
 * Nothing is moved when env KILN_REPACK=0 (read once), or when the copies would exceed three
 * quarters of the memory the system has available (the copies are private memory, while a
 * mapped file's pages can be evicted and shared between processes).
 */
void kiln_place_weights(kiln_mat *const *mats, size_t n_mats, const kiln_mapped_file *const *maps,
                        size_t n_maps, kiln_placement_alloc_fn alloc, void *owner);

#endif
