/*
 * cpu_backend.h - the CPU backend: the operations table of backend/backend.h over host memory,
 * with a persistent thread pool, the SIMD kernels of cpu.h / ops.h, and the CPU's work-dealing
 * policy (how attention and delta-net work is split over threads).
 */
#ifndef KILN_BACKEND_CPU_CPU_BACKEND_H
#define KILN_BACKEND_CPU_CPU_BACKEND_H

#include "backend/backend.h"
#include "util/threadpool.h"

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
