/* cpu_context.h - the CPU backend context (thread pool, arena, the step), shared by its
 * operation files; the operation table itself is assembled in cpu_backend.c. */
#ifndef KILN_BACKEND_CPU_CPU_CONTEXT_H
#define KILN_BACKEND_CPU_CPU_CONTEXT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_backend.h"

#define KILN_ATTN_MAX_TILE 16 /* query tokens per attention work item, at most */

typedef struct cpu_backend {
    kiln_backend base; /* first: a kiln_backend * is a cpu_backend * */
    kiln_threadpool *tp;
    int nth;
    /* the reservation */
    kiln_backend_reserve res;
    void *arena;      /* res.act_bytes, then the per-thread scratch below */
    size_t arena_cap; /* bytes allocated */
    float *attn_scratch;
    size_t attn_scratch_floats; /* per thread, a multiple of 16 */
    float *gdn_scratch;         /* [nth, 4 * gdn_head_dim] */
    /* the step (step_begin) */
    const kiln_step *st;
    int32_t attn_tile; /* query tokens per attention work item */
    int32_t attn_per;  /* attention items dealt together (attn_worker) */
    int64_t *ptr_off;  /* [n_seqs] offset of each sequence's block pointers */
    const void **kb, **vb;
    uint8_t *kfmt, *vfmt; /* beside kb / vb: each block's K and V format (kiln_dtype ids) */
    int *seq_operand; /* [n_seqs] kiln_kv_operand of each sequence's pages; -1: per-block
                         formats (kfmt / vfmt) */
    int64_t n_ptrs, ptr_cap;
    int32_t seq_cap;
} cpu_backend;

/* 1 / (1 + exp(-v)), libm expf: the logistic gate of the attention output, the shared expert
 * and the delta net's beta */
static inline float kiln_cpu_sigmoid(float v) {
    return 1.0f / (1.0f + expf(-v));
}

/* Query tokens per attention work item: enough rows to amortize each key chunk's transpose
 * (4 for G >= 4 query heads per KV head, else 16 / G), at most KILN_ATTN_MAX_TILE; 1 without
 * attention. The arena's attention scratch and the step's deal both use it. */
static inline int32_t kiln_cpu_attn_tile(int32_t n_head, int32_t n_head_kv) {
    if (n_head_kv <= 0) return 1;
    const int32_t G = n_head / n_head_kv;
    const int32_t t = G >= 4 ? 4 : 16 / (G > 0 ? G : 1);
    return t > KILN_ATTN_MAX_TILE ? KILN_ATTN_MAX_TILE : t;
}

static inline cpu_backend *cpu_be(kiln_backend *be) {
    return (cpu_backend *)be;
}

/* operation files */
void kiln_cpu_kv_write(kiln_backend *be, kiln_kv_pool *pool, int32_t layer, const kiln_step *st,
                       const float *k, const float *v);
void kiln_cpu_attention(kiln_backend *be, kiln_kv_pool *pool, const kiln_attn_params *p,
                        const kiln_step *st, const float *q, float *out);
void kiln_cpu_attention_deal(cpu_backend *c, const kiln_step *st);
void kiln_cpu_moe_route(kiln_backend *be, float *probs, int32_t *sel, float *wt, int32_t n_rows,
                        int32_t n_expert, int32_t k, bool renorm);
int32_t kiln_cpu_moe_gather(kiln_backend *be, float *xe, int32_t *erow, const float *x,
                            const int32_t *sel, int32_t n_rows, int32_t k, int64_t d,
                            int32_t expert);
void kiln_cpu_moe_scatter(kiln_backend *be, float *acc, const float *y, const int32_t *erow,
                          const float *wt, int32_t m, int32_t k, int64_t d);
void kiln_cpu_moe_shared(kiln_backend *be, float *o, const float *acc, const float *y,
                         const float *gate_logit, int32_t n_rows, int64_t d);
void kiln_cpu_gdn_conv(kiln_backend *be, float *c, const float *proj, const kiln_gdn_params *p,
                       const kiln_step *st);
void kiln_cpu_gdn_rule(kiln_backend *be, float *out, const float *c, const float *proj,
                       const float *ba, const kiln_gdn_params *p, const kiln_step *st);

#endif
