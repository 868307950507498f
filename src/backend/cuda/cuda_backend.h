/*
 * cuda_backend.h - the CUDA backend (issue 16, first milestone): the operations table of
 * backend/backend.h over the memory of one NVIDIA GPU. Weights are copied to the device once,
 * at load (kiln_cuda_place_device); the KV pool, the activation arena and the logits live in
 * device memory too (buf_alloc, arena_reserve); every operation is a kernel launch (or an async
 * copy) on the context's one stream, in call order, and sync waits for the stream.
 *
 * What runs here: embed (with learned positions), matmul over f32 / f16 / bf16 weights (one
 * kernel for every row count, with residual-add and GLU epilogues: the fused forms of
 * backend.h), RMS and LayerNorm, the q/k head norm, RoPE (both pairings, partial rotary; fused
 * with the KV write), bias and residual adds, silu / gelu activations and GLUs, softcap, the
 * head split and sigmoid gate, zero, copy, row gathers, the KV row write (f32, f16, bf16 pages),
 * paged attention split over each sequence's keys (prefill and decode in one varlen call,
 * causal, windows, softcaps, grouped-query heads), and greedy argmax. Decode steps run as CUDA
 * graphs (cuda_backend.c). Not here yet:
 * the mixture-of-experts and gated-delta-net entries (NULL in the table: the runner and the
 * loader refuse those models with KILN_ERR_UNSUPPORTED) and quantized weights (q8_0, q4_0 ...:
 * refused at load). Kernels and their reduction orders: cuda_kernels.h.
 *
 * Errors: the fallible entries (create, buf_alloc, arena_reserve, step_begin, place_device)
 * return them. The operations cannot (backend.h): a CUDA error during one of them (a failed
 * launch, a fault reported at a sync) leaves the device context unusable, so it is printed with
 * the operation's name and the process aborts, as for any broken invariant.
 *
 * Threads: a context may be used from any one thread at a time (every entry makes its device
 * current first); the engine uses it from its own thread.
 */
#ifndef KILN_BACKEND_CUDA_CUDA_BACKEND_H
#define KILN_BACKEND_CUDA_CUDA_BACKEND_H

#include "backend/backend.h"

/** The CUDA backend's operations table (host_memory = false, kind KILN_BACKEND_CUDA). */
extern const kiln_backend_ops kiln_cuda_backend_ops;

/**
 * A context on GPU `device`: its stream, and (after arena_reserve) its activation arena.
 * Errors: KILN_ERR_INVALID_ARGUMENT (device outside [0, kiln_cuda_device_count()), with the
 * count and the driver's reason when it is 0), KILN_ERR_INTERNAL (the stream or events could
 * not be created), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_cuda_backend_create(int32_t device, kiln_backend **out, kiln_error *err);

/** GPUs the CUDA runtime sees: 0 when there is no driver or no device (never fails). */
int32_t kiln_cuda_device_count(void);

/** Free and total bytes of GPU `device` (cudaMemGetInfo on it). Errors:
 *  KILN_ERR_INVALID_ARGUMENT (no such device), KILN_ERR_INTERNAL (the runtime's reason). */
kiln_status kiln_cuda_device_memory(int32_t device, int64_t *free_b, int64_t *total_b,
                                    kiln_error *err);

/**
 * The place_device entry (backend.h): one cudaMalloc on `device` holding every distinct
 * matrix and vector, 256-byte aligned each, filled by synchronous copies; the model's pointers
 * are then set to the copies. Matrices must be f32, f16 or bf16 in the row layout
 * (KILN_ERR_UNSUPPORTED names the first other one). KILN_ERR_OUT_OF_MEMORY gives the bytes the
 * weights need against the device's free and total memory (cudaMemGetInfo).
 */
kiln_status kiln_cuda_place_device(int32_t device, kiln_mat *const *mats, size_t n_mats,
                                   const kiln_vec_ref *vecs, size_t n_vecs, void **handle,
                                   kiln_error *err);

/** The release_weights entry: frees the device copies of kiln_cuda_place_device. */
void kiln_cuda_release_weights(void *handle);

#endif
