/*
 * cpu_backend.h - the CPU backend: the operations table of backend/backend.h over host memory,
 * with a persistent thread pool, the SIMD kernels of cpu.h / ops.h, and the CPU's work-dealing
 * policy (how attention and delta-net work is split over threads).
 */
#ifndef KILN_BACKEND_CPU_CPU_BACKEND_H
#define KILN_BACKEND_CPU_CPU_BACKEND_H

#include "backend/backend.h"
#include "util/threadpool.h"

/**
 * The CPU backend's weight placement (its place_weights entry, backend.h). Considered are
 * row-layout matrices with data: F16 ones wherever they are, others only while they lie in
 * one of the file mappings maps[0 .. n_maps) (NULL entries never match), so owned copies are
 * not copied again. Each is moved into owned, 64-byte aligned memory with transparent huge
 * pages: F16 packed into KILN_LAYOUT_F16_R64 (cpu.h; w->layout set), other dtypes copied as
 * they are; w->data then points at the copy and the whole pages of its source inside a mapping
 * are released. The copies come from one 2 MiB-aligned block from alloc, in the order of
 * mats, or from one allocation each when that block cannot be had; a matrix whose copy cannot
 * be allocated stays where it is. Nothing is moved when env KILN_REPACK=0 (read once), or when
 * the copies would exceed three quarters of the memory the system has available (the copies
 * are private memory, while a mapped file's pages can be evicted and shared between
 * processes).
 */
void kiln_cpu_place_weights(kiln_mat *const *mats, size_t n_mats,
                            const kiln_mapped_file *const *maps, size_t n_maps,
                            kiln_placement_alloc_fn alloc, void *owner);

/** The CPU backend's operations table (host_memory = true). */
extern const kiln_backend_ops kiln_cpu_backend_ops;

/**
 * A CPU backend context with n_threads compute threads (the caller counts as one: n_threads - 1
 * workers; 1 runs everything on the caller). The arena is empty until arena_reserve.
 * Errors: KILN_ERR_INVALID_ARGUMENT (n_threads outside [1, 512]), KILN_ERR_OUT_OF_MEMORY,
 * KILN_ERR_INTERNAL (a thread could not be started).
 */
kiln_status kiln_cpu_backend_create(int n_threads, kiln_backend **out, kiln_error *err);

/** The context's thread pool (NULL with one thread), borrowed; for CPU-only helpers such as
 *  benchmarks and weight packing. be must be a CPU context. */
kiln_threadpool *kiln_cpu_backend_threadpool(kiln_backend *be);

#endif
