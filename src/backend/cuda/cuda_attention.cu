/*
 * cuda_attention.cu - the KV row write and paged attention over a whole varlen batch
 * (cuda_kernels.h kiln_cu_kv_write, kiln_cu_attention). The page layout is kv/kv_pool.h's;
 * the semantics are ops.h kiln_attention_paged's (PagedAttention, Kwon et al. 2023): causal,
 * optionally windowed, grouped-query heads, the score divisor and softcap, and for f16 / bf16
 * pages the operand rounding of q and of the softmax probabilities.
 *
 * This is the plain, correct version of the milestone: one warp per (token, head), two passes
 * over the keys. Flash-attention tiling for prefill and a length-determined split of the keys
 * for long decodes are issue 16's next steps; both keep the rule that a token's result depends
 * only on its own sequence.
 */
#include "backend/cuda/cuda_elem.cuh"

/* ---- KV row write ----------------------------------------------------------------------- */

template <int E>
__global__ void k_kv_write(cu_kv kv, cu_step st, const float *k, const float *v, int64_t n) {
    CU_GRID_STRIDE(i, n) {
        const int64_t tok = i / kv.kv_dim, j = i % kv.kv_dim;
        const int32_t pos = st.tok_pos[tok];
        const int32_t blk = st.tables[st.seq_table[st.tok_seq[tok]] + pos / kv.block_size];
        const int64_t e = (int64_t)(pos % kv.block_size) * kv.kv_dim + j;
        cu_store<E>(kv.k + (int64_t)blk * kv.region, e, k[i]);
        cu_store<E>(kv.v + (int64_t)blk * kv.region, e, v[i]);
    }
}

extern "C" cudaError_t kiln_cu_kv_write(cudaStream_t s, const cu_kv *kv, const cu_step *st,
                                        const float *k, const float *v) {
    const int64_t n = (int64_t)st->n_tokens * kv->kv_dim;
    if (n < 1) return cudaSuccess;
    const unsigned g = cu_ew_blocks(n);
    if (kv->elem == CU_F16)
        k_kv_write<CU_F16><<<g, CU_EW_THREADS, 0, s>>>(*kv, *st, k, v, n);
    else if (kv->elem == CU_BF16)
        k_kv_write<CU_BF16><<<g, CU_EW_THREADS, 0, s>>>(*kv, *st, k, v, n);
    else
        k_kv_write<CU_F32><<<g, CU_EW_THREADS, 0, s>>>(*kv, *st, k, v, n);
    return cudaGetLastError();
}

/* ---- attention ---------------------------------------------------------------------------- */

#define CU_ATT_WARPS 4
#define CU_ATT_DPL (KILN_CU_ATTN_MAX_HEAD_DIM / 32) /* dims per lane, at most */

typedef struct att_args {
    cu_kv kv;
    cu_step st;
    int32_t n_head, G, hd, window;
    float score_div, softcap;
    const float *q;
    float *out;
} att_args;

/* the row of K (or V) of key t of sequence s for KV head g */
__device__ __forceinline__ const char *att_row(const att_args &a, const char *base, int32_t s,
                                               int32_t t, int32_t g) {
    const int32_t blk = a.st.tables[a.st.seq_table[s] + t / a.kv.block_size];
    const size_t esz = a.kv.elem == CU_F32 ? 4 : 2;
    return base + (int64_t)blk * a.kv.region +
           (size_t)((int64_t)(t % a.kv.block_size) * a.kv.kv_dim + (int64_t)g * a.hd) * esz;
}

/* s_t = (q . k_t) / score_div, softcapped: one fmaf chain over d ascending */
template <int E>
__device__ __forceinline__ float att_score(const att_args &a, const float *qs, int32_t s,
                                           int32_t t, int32_t g) {
    const char *kr = att_row(a, a.kv.k, s, t, g);
    float acc = 0.0f;
    for (int32_t d = 0; d < a.hd; d++) acc = fmaf(qs[d], cu_load<E>(kr, d), acc);
    float sc = acc / a.score_div;
    if (a.softcap > 0.0f) sc = a.softcap * tanhf(sc / a.softcap);
    return sc;
}

template <int E> __global__ void __launch_bounds__(CU_ATT_WARPS * 32) k_attention(att_args a) {
    __shared__ float q_sh[CU_ATT_WARPS][KILN_CU_ATTN_MAX_HEAD_DIM];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * CU_ATT_WARPS + warp;
    if (item >= (int64_t)a.st.n_tokens * a.n_head) return;
    const int32_t i = (int32_t)(item / a.n_head), h = (int32_t)(item % a.n_head);
    const int32_t g = h / a.G;
    const int32_t s = a.st.tok_seq[i], pos = a.st.tok_pos[i];
    const int32_t begin = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    const int32_t end = pos + 1;
    const int64_t q_dim = (int64_t)a.n_head * a.hd;
    const float *qi = a.q + (int64_t)i * q_dim + (int64_t)h * a.hd;
    float *qs = q_sh[warp];
    for (int32_t d = lane; d < a.hd; d += 32) qs[d] = cu_round<E>(qi[d]);
    __syncwarp();

    /* pass 1: the max and the sum of exp(s - max), lane by lane, then merged */
    float m = -INFINITY, l = 0.0f;
    for (int32_t t = begin + lane; t < end; t += 32) {
        const float sc = att_score<E>(a, qs, s, t, g);
        if (sc > m) {
            l = l * expf(m - sc) + 1.0f;
            m = sc;
        } else {
            l += expf(sc - m);
        }
    }
    const float M = cu_warp_max(m);
    const float L = cu_warp_sum(m == -INFINITY ? 0.0f : l * expf(m - M));

    /* pass 2: out[d] = sum_t round(p_t) v_t[d], keys ascending */
    float acc[CU_ATT_DPL];
#pragma unroll
    for (int c = 0; c < CU_ATT_DPL; c++) acc[c] = 0.0f;
    for (int32_t t0 = begin; t0 < end; t0 += 32) {
        const int32_t t = t0 + lane;
        float p = 0.0f;
        if (t < end) p = cu_round<E>(expf(att_score<E>(a, qs, s, t, g) - M) / L);
        const int32_t nk = end - t0 < 32 ? end - t0 : 32;
        for (int32_t j = 0; j < nk; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const char *vr = att_row(a, a.kv.v, s, t0 + j, g);
#pragma unroll
            for (int c = 0; c < CU_ATT_DPL; c++) {
                const int32_t d = lane + 32 * c;
                if (d < a.hd) acc[c] = fmaf(pj, cu_load<E>(vr, d), acc[c]);
            }
        }
    }
    float *oi = a.out + (int64_t)i * q_dim + (int64_t)h * a.hd;
#pragma unroll
    for (int c = 0; c < CU_ATT_DPL; c++) {
        const int32_t d = lane + 32 * c;
        if (d < a.hd) oi[d] = acc[c];
    }
}

extern "C" cudaError_t kiln_cu_attention(cudaStream_t s, const cu_kv *kv, const cu_step *st,
                                         int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                         float score_div, float softcap, int32_t window,
                                         const float *q, float *out) {
    const int64_t items = (int64_t)st->n_tokens * n_head;
    if (items < 1) return cudaSuccess;
    if (head_dim < 1 || head_dim > KILN_CU_ATTN_MAX_HEAD_DIM || n_head_kv < 1 ||
        n_head % n_head_kv != 0)
        return cudaErrorInvalidValue;
    const att_args a = {*kv,    *st,     n_head, n_head / n_head_kv, head_dim, window,
                        score_div, softcap, q,      out};
    const unsigned g = (unsigned)((items + CU_ATT_WARPS - 1) / CU_ATT_WARPS);
    if (kv->elem == CU_F16)
        k_attention<CU_F16><<<g, CU_ATT_WARPS * 32, 0, s>>>(a);
    else if (kv->elem == CU_BF16)
        k_attention<CU_BF16><<<g, CU_ATT_WARPS * 32, 0, s>>>(a);
    else
        k_attention<CU_F32><<<g, CU_ATT_WARPS * 32, 0, s>>>(a);
    return cudaGetLastError();
}
