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

/* ---- the first milestone's attention, unchanged (KILN_CUDA_KERNELS=v1: before/after) ------ */

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

template <int E> __global__ void __launch_bounds__(CU_ATT_WARPS * 32) k_attention_v1(att_args a) {
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

extern "C" cudaError_t kiln_cu_attention_v1(cudaStream_t s, const cu_kv *kv, const cu_step *st,
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
        k_attention_v1<CU_F16><<<g, CU_ATT_WARPS * 32, 0, s>>>(a);
    else if (kv->elem == CU_BF16)
        k_attention_v1<CU_BF16><<<g, CU_ATT_WARPS * 32, 0, s>>>(a);
    else
        k_attention_v1<CU_F32><<<g, CU_ATT_WARPS * 32, 0, s>>>(a);
    return cudaGetLastError();
}

/* ---- RoPE of q and k, then the KV row write, in one launch ---------------------------------- */

/* one block per token: q's pairs rotated in place; k's pairs rotated in place and, with k's
 * other dims and v, written to the token's page row: k_rope's and k_kv_write's arithmetic
 * exactly, so the same bits as rope(q), rope(k), kv_write. The block's threads take the items
 * (q pairs, k pairs, k's unrotated dims, v's elements) of one index space in turn. */
#define ROPE_KV_THREADS 1024
template <int E>
__global__ void __launch_bounds__(ROPE_KV_THREADS)
    k_rope_kv(cu_kv kv, cu_step st, float *q, int64_t q_stride, int32_t n_head, float *k,
              const float *v, int32_t n_head_kv, int32_t hd, int32_t half, const float *inv_freq,
              int adjacent) {
    cu_pdl_wait(); /* launched programmatically: what the kernel ahead wrote is visible */
    cu_pdl_launch_dependents();
    const int32_t i = blockIdx.x;
    const int32_t pos = st.tok_pos[i];
    const int64_t kvd = kv.kv_dim;
    const int32_t blk = st.tables[st.seq_table[st.tok_seq[i]] + pos / kv.block_size];
    const int64_t e0 = (int64_t)(pos % kv.block_size) * kvd;
    char *kp = kv.k + (int64_t)blk * kv.region, *vp = kv.v + (int64_t)blk * kv.region;
    float *qi = q + (int64_t)i * q_stride, *ki = k + (int64_t)i * kvd;
    const float *vi = v + (int64_t)i * kvd;
    const int32_t rest = hd - 2 * half; /* dims past rot_dim pass through */
    const int64_t nq = (int64_t)n_head * half, nk = (int64_t)n_head_kv * half,
                  nr = (int64_t)n_head_kv * rest, total = nq + nk + nr + kvd;
    for (int64_t idx = threadIdx.x; idx < total; idx += ROPE_KV_THREADS) {
        if (idx < nq + nk) {
            const bool isq = idx < nq;
            const int64_t t = isq ? idx : idx - nq;
            const int32_t h = (int32_t)(t / half), j = (int32_t)(t % half);
            const float angle = (float)pos * inv_freq[j];
            const float c = cosf(angle), sn = sinf(angle);
            float *x = (isq ? qi : ki) + (int64_t)h * hd;
            const int32_t a = adjacent ? 2 * j : j, b = adjacent ? 2 * j + 1 : j + half;
            const float v0 = x[a], v1 = x[b];
            const float r0 = v0 * c - v1 * sn, r1 = v0 * sn + v1 * c;
            x[a] = r0;
            x[b] = r1;
            if (!isq) {
                cu_store<E>(kp, e0 + (int64_t)h * hd + a, r0);
                cu_store<E>(kp, e0 + (int64_t)h * hd + b, r1);
            }
        } else if (idx < nq + nk + nr) {
            const int64_t t = idx - nq - nk;
            const int64_t e = (t / rest) * hd + 2 * half + t % rest;
            cu_store<E>(kp, e0 + e, ki[e]);
        } else {
            const int64_t e = idx - nq - nk - nr;
            cu_store<E>(vp, e0 + e, vi[e]);
        }
    }
}

extern "C" cudaError_t kiln_cu_rope_kv(cudaStream_t s, const cu_kv *kv, const cu_step *st,
                                       float *q, int64_t q_stride, int32_t n_head, float *k,
                                       const float *v, int32_t n_head_kv, int32_t head_dim,
                                       int32_t rot_dim, const float *inv_freq, int adjacent) {
    if (st->n_tokens < 1) return cudaSuccess;
    const int32_t half = rot_dim / 2;
    if (half < 1) return cudaErrorInvalidValue;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)st->n_tokens);
    cfg.blockDim = dim3(ROPE_KV_THREADS);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cu_pdl_enabled() ? 1 : 0;
    const cu_kv kvv = *kv;
    const cu_step stv = *st;
    if (kv->elem == CU_F16)
        cudaLaunchKernelEx(&cfg, k_rope_kv<CU_F16>, kvv, stv, q, q_stride, n_head, k, v,
                           n_head_kv, head_dim, half, inv_freq, adjacent);
    else if (kv->elem == CU_BF16)
        cudaLaunchKernelEx(&cfg, k_rope_kv<CU_BF16>, kvv, stv, q, q_stride, n_head, k, v,
                           n_head_kv, head_dim, half, inv_freq, adjacent);
    else
        cudaLaunchKernelEx(&cfg, k_rope_kv<CU_F32>, kvv, stv, q, q_stride, n_head, k, v,
                           n_head_kv, head_dim, half, inv_freq, adjacent);
    return cudaGetLastError();
}

/* ---- split-KV attention ---------------------------------------------------------------------- */

#define AT_THREADS 128
#define AT_ND      (KILN_CU_ATTN_MAX_HEAD_DIM / AT_THREADS) /* dims per thread, at most */
#define AT_MCHUNK  32 /* the wide form's merge reads this many splits' statistics at once */

typedef struct at_args {
    cu_kv kv;
    cu_step st;
    int32_t n_head, G, hd, window, n_grp; /* n_grp: query-head groups of HG per KV head */
    float score_div, softcap;
    const float *q;
    float *out;
    float *part;  /* wide: partials, [tokens][n_head_kv * n_grp][s_grid][HG (2 + hd)] */
    int32_t *cnt; /* wide: arrivals per (token, KV head, group), zero between launches */
    int32_t s_grid; /* wide: splits per token in the grid; 0: loop mode */
    bool vec;       /* K rows by 16-byte loads */
} at_args;

/* split geometry of a token with n keys: KILN_CU_ATTN_SPLIT keys each, the last shorter */
__host__ __device__ __forceinline__ int32_t at_splits(int32_t n) {
    return (n + KILN_CU_ATTN_SPLIT - 1) / KILN_CU_ATTN_SPLIT;
}

/* the fold of one split's (m, l, acc) into the running (M, L, O): the merge, in split order */
__device__ __forceinline__ void at_fold(float &M, float &L, float *O, int nd, float m, float l,
                                        const float *acc) {
    const float Mn = fmaxf(M, m);
    const float a = expf(M - Mn), b = expf(m - Mn);
    L = L * a + l * b;
    for (int c = 0; c < nd; c++) O[c] = O[c] * a + acc[c] * b;
    M = Mn;
}

/* ND: dims per thread, ceil(hd / 128) (1, 2 or 4); VU: keys whose V loads are in flight at
 * once in P V (at_launch: 64 / ND keys, the first group issued before the softmax, which does
 * not need them; runs 2-6 of bench/gpu/README.md had 8, run 7 timed both) */
template <int E, int HG, int ND, int VU>
__global__ void __launch_bounds__(AT_THREADS) k_attention(at_args a) {
    __shared__ __align__(16) float q_sh[HG][KILN_CU_ATTN_MAX_HEAD_DIM];
    __shared__ float p_sh[HG][KILN_CU_ATTN_SPLIT];
    __shared__ const char *vrow_sh[KILN_CU_ATTN_SPLIT];
    __shared__ float m_sh[HG], l_sh[HG];
    __shared__ float st_sh[AT_MCHUNK][2 * HG];
    __shared__ int last_sh;
    cu_pdl_launch_dependents(); /* the output projection may be scheduled (it waits) */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool wide = a.s_grid > 0;
    const int32_t i = wide ? (int32_t)(blockIdx.x / a.s_grid) : (int32_t)blockIdx.x;
    const int32_t s_me = wide ? (int32_t)(blockIdx.x % a.s_grid) : 0;
    const int32_t g = blockIdx.y / a.n_grp, h0 = g * a.G + (blockIdx.y % a.n_grp) * HG;
    const int32_t seq = a.st.tok_seq[i], pos = a.st.tok_pos[i];
    const int32_t begin = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    const int32_t end = pos + 1;
    const int32_t S = at_splits(end - begin);
    if (wide && s_me >= S) return;
    const int32_t hd = a.hd;
    const int64_t q_dim = (int64_t)a.n_head * hd;
    for (int idx = tid; idx < HG * hd; idx += AT_THREADS)
        q_sh[idx / hd][idx % hd] = cu_round<E>(a.q[(int64_t)i * q_dim + (int64_t)h0 * hd + idx]);
    const size_t esz = E == CU_F32 ? 4 : 2;
    const int32_t *table = a.st.tables + a.st.seq_table[seq];
    const int64_t head_off = (int64_t)g * hd * (int64_t)esz;
    /* the fold state (loop mode): thread tid owns dims d = tid + 128 c of every head */
    float M[HG], L[HG], O[HG][ND];
#pragma unroll
    for (int h = 0; h < HG; h++) {
        M[h] = -INFINITY;
        L[h] = 0.0f;
#pragma unroll
        for (int c = 0; c < ND; c++) O[h][c] = 0.0f;
    }
    const int32_t s_lo = wide ? s_me : 0, s_hi = wide ? s_me + 1 : S;
    for (int32_t sp = s_lo; sp < s_hi; sp++) {
        const int32_t kb = begin + sp * KILN_CU_ATTN_SPLIT;
        const int32_t nk = end - kb < KILN_CU_ATTN_SPLIT ? end - kb : KILN_CU_ATTN_SPLIT;
        __syncthreads(); /* q_sh written; p_sh, vrow_sh free again */
        /* scores: thread t takes key kb + t, one fmaf chain over d ascending per head */
        if (tid < nk) {
            const int32_t t = kb + tid;
            const int64_t roff =
                (int64_t)(t % a.kv.block_size) * a.kv.kv_dim * (int64_t)esz + head_off;
            const int64_t boff = (int64_t)table[t / a.kv.block_size] * a.kv.region;
            const char *kr = a.kv.k + boff + roff;
            vrow_sh[tid] = a.kv.v + boff + roff;
            float acc[HG];
#pragma unroll
            for (int h = 0; h < HG; h++) acc[h] = 0.0f;
            if (a.vec) {
                constexpr int PER = E == CU_F32 ? 4 : 8; /* elements per 16-byte load */
#pragma unroll 8
                for (int32_t d0 = 0; d0 < hd; d0 += PER) {
                    const uint4 raw = *(const uint4 *)(kr + (size_t)d0 * esz);
                    float kf[PER];
                    const uint32_t wds[4] = {raw.x, raw.y, raw.z, raw.w};
                    if constexpr (E == CU_F32) {
#pragma unroll
                        for (int e = 0; e < 4; e++) kf[e] = __uint_as_float(wds[e]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            kf[2 * e] = cu_half_lo(wds[e], E);
                            kf[2 * e + 1] = cu_half_hi(wds[e], E);
                        }
                    }
#pragma unroll
                    for (int h = 0; h < HG; h++)
#pragma unroll
                        for (int e = 0; e < PER; e++) acc[h] = fmaf(q_sh[h][d0 + e], kf[e], acc[h]);
                }
            } else {
                for (int32_t d = 0; d < hd; d++) {
                    const float kd = cu_load<E>(kr, d);
#pragma unroll
                    for (int h = 0; h < HG; h++) acc[h] = fmaf(q_sh[h][d], kd, acc[h]);
                }
            }
#pragma unroll
            for (int h = 0; h < HG; h++) {
                float sc = acc[h] / a.score_div;
                if (a.softcap > 0.0f) sc = a.softcap * tanhf(sc / a.softcap);
                p_sh[h][tid] = sc;
            }
        }
        __syncthreads();
        /* the first VU keys' V elements of this thread's dims, in flight during the softmax */
        float vd[VU][ND];
        auto load_v = [&](int32_t t0) {
#pragma unroll
            for (int u = 0; u < VU; u++) {
                const char *vr = t0 + u < nk ? vrow_sh[t0 + u] : NULL;
#pragma unroll
                for (int c = 0; c < ND; c++) {
                    const int32_t d = tid + AT_THREADS * c;
                    vd[u][c] = vr && d < hd ? cu_load<E>(vr, d) : 0.0f;
                }
            }
        };
        load_v(0);
        /* per head: m = max, p_t = exp(s_t - m), l = sum of p_t (lane l sums keys l + 32 j in
         * ascending j, then the xor butterfly); p_t rounded to the operand for P V */
        for (int h = warp; h < HG; h += AT_THREADS / 32) {
            float m = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < KILN_CU_ATTN_SPLIT / 32; jj++) {
                const int t = lane + 32 * jj;
                if (t < nk) m = fmaxf(m, p_sh[h][t]);
            }
            m = cu_warp_max(m);
            float l = 0.0f;
#pragma unroll
            for (int jj = 0; jj < KILN_CU_ATTN_SPLIT / 32; jj++) {
                const int t = lane + 32 * jj;
                if (t < nk) {
                    const float p = expf(p_sh[h][t] - m);
                    l += p;
                    p_sh[h][t] = cu_round<E>(p);
                }
            }
            l = cu_warp_sum(l);
            if (lane == 0) {
                m_sh[h] = m;
                l_sh[h] = l;
            }
        }
        __syncthreads();
        /* P V: acc[h][c] = sum over the split's keys, ascending, of p_t v_t[d] */
        float acc[HG][ND];
#pragma unroll
        for (int h = 0; h < HG; h++)
#pragma unroll
            for (int c = 0; c < ND; c++) acc[h][c] = 0.0f;
        /* VU keys' V loads in flight before their fmafs (the chain stays in key order) */
        for (int32_t t0 = 0; t0 < nk; t0 += VU) {
            if (t0 > 0) load_v(t0);
#pragma unroll
            for (int u = 0; u < VU; u++) {
                if (t0 + u >= nk) break;
#pragma unroll
                for (int c = 0; c < ND; c++)
#pragma unroll
                    for (int h = 0; h < HG; h++)
                        acc[h][c] = fmaf(p_sh[h][t0 + u], vd[u][c], acc[h][c]);
            }
        }
        if (wide) {
            float *pp = a.part + (((int64_t)i * gridDim.y + blockIdx.y) * a.s_grid + sp) *
                                     (int64_t)(HG * (2 + hd));
            if (tid < HG) {
                pp[2 * tid] = m_sh[tid];
                pp[2 * tid + 1] = l_sh[tid];
            }
#pragma unroll
            for (int h = 0; h < HG; h++)
#pragma unroll
                for (int c = 0; c < ND; c++) {
                    const int32_t d = tid + AT_THREADS * c;
                    if (d < hd) pp[2 * HG + h * hd + d] = acc[h][c];
                }
        } else {
#pragma unroll
            for (int h = 0; h < HG; h++) at_fold(M[h], L[h], O[h], ND, m_sh[h], l_sh[h], acc[h]);
        }
    }
    if (wide) {
        /* the last split of (token, KV head, group) to finish folds all of them, in order */
        __threadfence();
        __syncthreads();
        int32_t *cnt = a.cnt + (int64_t)i * gridDim.y + blockIdx.y;
        if (tid == 0) last_sh = atomicAdd(cnt, 1) == S - 1;
        __syncthreads();
        if (!last_sh) return;
        __threadfence();
        /* the splits' statistics AT_MCHUNK at a time into shared memory, then VB splits'
         * partials at a time into registers, each folded by at_fold in split order: the loads
         * in flight together, the arithmetic the loop form's */
        const int64_t stride = HG * (2 + hd);
        const float *base = a.part + ((int64_t)i * gridDim.y + blockIdx.y) * a.s_grid * stride;
        constexpr int VB = 32 / (HG * ND) < 1 ? 1 : 32 / (HG * ND) > 8 ? 8 : 32 / (HG * ND);
        for (int32_t s0 = 0; s0 < S; s0 += AT_MCHUNK) {
            const int32_t ns = S - s0 < AT_MCHUNK ? S - s0 : AT_MCHUNK;
            __syncthreads(); /* st_sh free */
            for (int e = tid; e < ns * 2 * HG; e += AT_THREADS)
                st_sh[e / (2 * HG)][e % (2 * HG)] =
                    __ldcg(base + (int64_t)(s0 + e / (2 * HG)) * stride + e % (2 * HG));
            __syncthreads();
            for (int32_t j0 = 0; j0 < ns; j0 += VB) {
                float pv[VB][HG][ND];
#pragma unroll
                for (int u = 0; u < VB; u++)
#pragma unroll
                    for (int h = 0; h < HG; h++)
#pragma unroll
                        for (int c = 0; c < ND; c++) {
                            const int32_t d = tid + AT_THREADS * c;
                            pv[u][h][c] = j0 + u < ns && d < hd
                                              ? __ldcg(base + (int64_t)(s0 + j0 + u) * stride +
                                                       2 * HG + h * hd + d)
                                              : 0.0f;
                        }
#pragma unroll
                for (int u = 0; u < VB; u++) {
                    if (j0 + u >= ns) break;
#pragma unroll
                    for (int h = 0; h < HG; h++)
                        at_fold(M[h], L[h], O[h], ND, st_sh[j0 + u][2 * h],
                                st_sh[j0 + u][2 * h + 1], pv[u][h]);
                }
            }
        }
        if (tid == 0) *cnt = 0;
    }
    float *oi = a.out + (int64_t)i * q_dim + (int64_t)h0 * hd;
#pragma unroll
    for (int h = 0; h < HG; h++)
#pragma unroll
        for (int c = 0; c < ND; c++) {
            const int32_t d = tid + AT_THREADS * c;
            if (d < hd) oi[(int64_t)h * hd + d] = O[h][c] / L[h];
        }
}

/* query heads per block: the largest of 8, 4, 2, 1 dividing G */
static int at_hg(int32_t G) {
    return G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
}

extern "C" size_t kiln_cu_attention_part_floats(int32_t n_tokens, int32_t n_head,
                                                int32_t head_dim, int32_t max_keys) {
    return (size_t)n_tokens * (size_t)n_head * (size_t)at_splits(max_keys > 0 ? max_keys : 1) *
           (size_t)(2 + head_dim);
}

extern "C" size_t kiln_cu_attention_cnt_ints(int32_t n_tokens, int32_t n_head) {
    return (size_t)n_tokens * (size_t)n_head;
}

template <int E, int ND>
static void at_launch_nd(cudaStream_t s, const at_args &a, int hg, dim3 grid) {
    constexpr int VU = 64 / ND;
    if (hg == 8)
        k_attention<E, 8, ND, VU><<<grid, AT_THREADS, 0, s>>>(a);
    else if (hg == 4)
        k_attention<E, 4, ND, VU><<<grid, AT_THREADS, 0, s>>>(a);
    else if (hg == 2)
        k_attention<E, 2, ND, VU><<<grid, AT_THREADS, 0, s>>>(a);
    else
        k_attention<E, 1, ND, VU><<<grid, AT_THREADS, 0, s>>>(a);
}

template <int E>
static void at_launch(cudaStream_t s, const at_args &a, int hg, dim3 grid) {
    if (a.hd <= AT_THREADS)
        at_launch_nd<E, 1>(s, a, hg, grid);
    else if (a.hd <= 2 * AT_THREADS)
        at_launch_nd<E, 2>(s, a, hg, grid);
    else
        at_launch_nd<E, AT_ND>(s, a, hg, grid);
}

extern "C" cudaError_t kiln_cu_attention(cudaStream_t s, const cu_kv *kv, const cu_step *st,
                                         int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                         float score_div, float softcap, int32_t window,
                                         const float *q, float *out, const cu_att_split *sp) {
    if (st->n_tokens < 1) return cudaSuccess;
    if (head_dim < 1 || head_dim > KILN_CU_ATTN_MAX_HEAD_DIM || n_head_kv < 1 ||
        n_head % n_head_kv != 0)
        return cudaErrorInvalidValue;
    const int32_t G = n_head / n_head_kv;
    const int hg = at_hg(G);
    const size_t esz = kv->elem == CU_F32 ? 4 : 2, per = 16 / esz;
    at_args a = {};
    a.kv = *kv;
    a.st = *st;
    a.n_head = n_head;
    a.G = G;
    a.hd = head_dim;
    a.window = window;
    a.n_grp = G / hg;
    a.score_div = score_div;
    a.softcap = softcap;
    a.q = q;
    a.out = out;
    a.vec = head_dim % per == 0 && kv->kv_dim % per == 0 && kv->region % 16 == 0 &&
            (uintptr_t)kv->k % 16 == 0 && (uintptr_t)kv->v % 16 == 0;
    /* wide (a block per split, the last one folding) when the partials fit; else a block per
     * (token, KV head) folding its splits as it goes: the same bits either way */
    const int32_t s_grid = sp && sp->s_grid > 0 ? sp->s_grid : 0;
    if (s_grid > 0 && sp->part && st->n_tokens <= KILN_CU_ATTN_WIDE_MAX_TOKENS &&
        kiln_cu_attention_part_floats(st->n_tokens, n_head, head_dim,
                                      s_grid * KILN_CU_ATTN_SPLIT) <= sp->part_floats &&
        kiln_cu_attention_cnt_ints(st->n_tokens, n_head) <= sp->cnt_ints) {
        a.part = sp->part;
        a.cnt = sp->cnt;
        a.s_grid = s_grid;
    }
    const int64_t gx = (int64_t)st->n_tokens * (a.s_grid > 0 ? a.s_grid : 1);
    if (gx > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)gx, (unsigned)(n_head_kv * a.n_grp));
    if (kv->elem == CU_F16)
        at_launch<CU_F16>(s, a, hg, grid);
    else if (kv->elem == CU_BF16)
        at_launch<CU_BF16>(s, a, hg, grid);
    else
        at_launch<CU_F32>(s, a, hg, grid);
    return cudaGetLastError();
}
