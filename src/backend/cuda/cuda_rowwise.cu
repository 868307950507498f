/*
 * cuda_rowwise.cu - the CUDA backend's row-wise and elementwise kernels (cuda_kernels.h):
 * embedding rows, RMSNorm / LayerNorm, the q/k head norm, RoPE, activations and gates, bias and
 * residual adds, soft capping, head splits and row gathers. The arithmetic of each is the CPU
 * reference's (backend/cpu/ops.c, cpu_backend.c), expression for expression; the norms' sums
 * run in the fixed tree order of cu_block_sum instead of left to right, and libdevice's expf,
 * tanhf, erff, sinf and cosf (within 2 ulp) stand in for glibc's.
 */
#include "backend/cuda/cuda_elem.cuh"

/* ---- embedding ---------------------------------------------------------------------------- */

/* element i of a row-major table of type e as f32; Q8_0 / Q4_0 as tensor/dtype.c's to_float:
 * (float)q * d, (float)(nibble - 8) * d (rows are whole blocks) */
__device__ __forceinline__ float cu_load_rt(const void *p, int64_t i, int e) {
    if (e == CU_Q8_0 || e == CU_Q4_0) {
        const int bs = e == CU_Q8_0 ? 34 : 18;
        const uint8_t *b = (const uint8_t *)p + (i >> 5) * bs;
        const float d = __half2float(__ushort_as_half(*(const unsigned short *)b));
        const int j = (int)(i & 31);
        const int q = e == CU_Q8_0 ? (int)(int8_t)b[2 + j]
                                   : (j < 16 ? b[2 + j] & 15 : b[2 + j - 16] >> 4) - 8;
        return (float)q * d;
    }
    if (e == CU_F16) return cu_load<CU_F16>(p, i);
    if (e == CU_BF16) return cu_load<CU_BF16>(p, i);
    return cu_load<CU_F32>(p, i);
}

__global__ void k_embed(float *x, const void *tok, int te, const void *pos, int pe, int64_t d,
                        float scale, cu_step st) {
    const int32_t i = blockIdx.x;
    const int64_t trow = (int64_t)st.token[i] * d;
    const int64_t prow = pos ? (int64_t)st.tok_pos[i] * d : 0;
    float *xi = x + (int64_t)i * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float v = cu_load_rt(tok, trow + j, te);
        if (scale != 1.0f) v *= scale;
        if (pos) v += cu_load_rt(pos, prow + j, pe);
        xi[j] = v;
    }
}

extern "C" cudaError_t kiln_cu_embed(cudaStream_t s, float *x, const void *tok, cu_elem tok_elem,
                                     const void *pos, cu_elem pos_elem, int64_t d, float scale,
                                     const cu_step *st) {
    if (st->n_tokens < 1) return cudaSuccess;
    k_embed<<<st->n_tokens, 256, 0, s>>>(x, tok, tok_elem, pos, pos_elem, d, scale, *st);
    return cudaGetLastError();
}

/* ---- norms -------------------------------------------------------------------------------- */

#define CU_NORM_THREADS 256
#define CU_NORM_REGS    32 /* rows up to 8192 elements are held in registers */

/* sum over the block (CU_NORM_THREADS threads): each warp's butterfly, then the 8 warp sums by
 * a butterfly in every warp; the same bits in every thread */
__device__ __forceinline__ float cu_block_sum(float v, float *sh) {
    v = cu_warp_sum(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads(); /* sh may still be read by an earlier call */
    if (l == 0) sh[w] = v;
    __syncthreads();
    return cu_warp_sum(l < CU_NORM_THREADS / 32 ? sh[l] : 0.0f);
}

__global__ void __launch_bounds__(CU_NORM_THREADS)
    k_norm(float *out, const float *x, const float *w, const float *b, int64_t d, int kind,
           float eps) {
    __shared__ float sh[CU_NORM_THREADS / 32];
    cu_pdl_wait(); /* launched programmatically: what the kernel ahead wrote is visible */
    cu_pdl_launch_dependents(); /* the matmul after it may be scheduled (it waits for this) */
    const float *xr = x + (int64_t)blockIdx.x * d;
    float *orow = out + (int64_t)blockIdx.x * d;
    if (kind == 1) { /* LayerNorm: mean, then the biased variance, two passes */
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += CU_NORM_THREADS) s += xr[j];
        const float mean = cu_block_sum(s, sh) / (float)d;
        float v = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += CU_NORM_THREADS) {
            const float t = xr[j] - mean;
            v += t * t;
        }
        const float var = cu_block_sum(v, sh) / (float)d;
        const float rstd = 1.0f / sqrtf(var + eps);
        for (int64_t j = threadIdx.x; j < d; j += CU_NORM_THREADS) {
            const float y = (xr[j] - mean) * rstd * w[j];
            orow[j] = b ? y + b[j] : y;
        }
        return;
    }
    float ss = 0.0f;
    if (d <= CU_NORM_THREADS * CU_NORM_REGS) {
        /* the row's elements (and w's) loaded at once into registers: the same sums, without
         * a load latency per element */
        float xv[CU_NORM_REGS], wv[CU_NORM_REGS];
#pragma unroll
        for (int c = 0; c < CU_NORM_REGS; c++) {
            const int64_t j = threadIdx.x + (int64_t)CU_NORM_THREADS * c;
            xv[c] = j < d ? xr[j] : 0.0f;
            wv[c] = j < d && w ? w[j] : 1.0f;
        }
#pragma unroll
        for (int c = 0; c < CU_NORM_REGS; c++)
            if (threadIdx.x + (int64_t)CU_NORM_THREADS * c < d) ss += xv[c] * xv[c];
        ss = cu_block_sum(ss, sh);
        ss /= (float)d;
        ss += eps;
        ss = 1.0f / sqrtf(ss);
#pragma unroll
        for (int c = 0; c < CU_NORM_REGS; c++) {
            const int64_t j = threadIdx.x + (int64_t)CU_NORM_THREADS * c;
            if (j < d) orow[j] = w ? wv[c] * (ss * xv[c]) : ss * xv[c];
        }
        return;
    }
    for (int64_t j = threadIdx.x; j < d; j += CU_NORM_THREADS) ss += xr[j] * xr[j];
    ss = cu_block_sum(ss, sh);
    ss /= (float)d;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int64_t j = threadIdx.x; j < d; j += CU_NORM_THREADS)
        orow[j] = w ? w[j] * (ss * xr[j]) : ss * xr[j];
}

extern "C" cudaError_t kiln_cu_norm(cudaStream_t s, float *out, const float *x, const float *w,
                                    const float *b, int32_t n_rows, int64_t d, int kind,
                                    float eps) {
    if (n_rows < 1) return cudaSuccess;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)n_rows);
    cfg.blockDim = dim3(CU_NORM_THREADS);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cu_pdl_enabled() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k_norm, out, x, w, b, d, kind, eps);
    return cudaGetLastError();
}

__global__ void k_head_rmsnorm(float *x, int32_t n_items, int64_t stride, int32_t n_heads,
                               int32_t hd, const float *w, float eps) {
    const int32_t item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (item >= n_items) return;
    float *xh = x + (int64_t)(item / n_heads) * stride + (int64_t)(item % n_heads) * hd;
    float ss = 0.0f;
    for (int32_t j = lane; j < hd; j += 32) ss += xh[j] * xh[j];
    ss = cu_warp_sum(ss);
    ss /= (float)hd;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    __syncwarp();
    for (int32_t j = lane; j < hd; j += 32) xh[j] = w ? w[j] * (ss * xh[j]) : ss * xh[j];
}

extern "C" cudaError_t kiln_cu_head_rmsnorm(cudaStream_t s, float *x, int32_t n_rows,
                                            int64_t stride, int32_t n_heads, int32_t head_dim,
                                            const float *w, float eps) {
    const int32_t n = n_rows * n_heads;
    if (n < 1) return cudaSuccess;
    k_head_rmsnorm<<<(n + 7) / 8, 256, 0, s>>>(x, n, stride, n_heads, head_dim, w, eps);
    return cudaGetLastError();
}

/* ---- RoPE ----------------------------------------------------------------------------------- */

__global__ void k_rope(float *x, int64_t stride, int32_t n_heads, int32_t hd, int32_t half,
                       const float *inv_freq, int adjacent, int64_t n, cu_step st) {
    CU_GRID_STRIDE(i, n) {
        const int32_t j = (int32_t)(i % half);
        const int32_t h = (int32_t)((i / half) % n_heads);
        const int64_t row = i / ((int64_t)half * n_heads);
        const float angle = (float)st.tok_pos[row] * inv_freq[j];
        const float c = cosf(angle), sn = sinf(angle);
        float *v = x + row * stride + (int64_t)h * hd;
        const int32_t a = adjacent ? 2 * j : j, b = adjacent ? 2 * j + 1 : j + half;
        const float v0 = v[a], v1 = v[b];
        v[a] = v0 * c - v1 * sn;
        v[b] = v0 * sn + v1 * c;
    }
}

extern "C" cudaError_t kiln_cu_rope(cudaStream_t s, float *x, int64_t stride, int32_t n_heads,
                                    int32_t head_dim, int32_t rot_dim, const float *inv_freq,
                                    int adjacent, const cu_step *st) {
    const int32_t half = rot_dim / 2;
    const int64_t n = (int64_t)st->n_tokens * n_heads * half;
    if (n < 1) return cudaSuccess;
    k_rope<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(x, stride, n_heads, head_dim, half, inv_freq,
                                                      adjacent, n, *st);
    return cudaGetLastError();
}

/* ---- elementwise ---------------------------------------------------------------------------- */

__global__ void k_add_bias(float *y, const float *bias, int64_t dim, int64_t n) {
    CU_GRID_STRIDE(i, n) y[i] += bias[i % dim];
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    CU_GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void k_act(float *x, int64_t n, int act) {
    CU_GRID_STRIDE(i, n) x[i] = cu_act(x[i], act);
}

__global__ void k_glu(float *g, const float *u, int64_t n, int act) {
    CU_GRID_STRIDE(i, n) g[i] = cu_glu_value(g[i], u[i], act);
}

__global__ void k_softcap(float *x, int64_t n, float cap) {
    CU_GRID_STRIDE(i, n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void k_split_heads(float *a, float *b, const float *src, int32_t hd, int32_t n_heads,
                              int64_t n) {
    CU_GRID_STRIDE(i, n) { /* i over rows x heads x hd of a */
        const int64_t e = i % hd, rh = i / hd;
        const float *sp = src + rh * 2 * hd;
        a[i] = sp[e];
        b[i] = sp[hd + e];
    }
}

__global__ void k_gate_sigmoid(float *x, const float *gate, int64_t n) {
    CU_GRID_STRIDE(i, n) x[i] = x[i] * (1.0f / (1.0f + expf(-gate[i])));
}

__global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t d,
                              int64_t n) {
    cu_pdl_launch_dependents();
    CU_GRID_STRIDE(i, n) dst[i] = src[(int64_t)rows[i / d] * d + i % d];
}

extern "C" cudaError_t kiln_cu_add_bias(cudaStream_t s, float *y, const float *bias,
                                        int32_t n_rows, int64_t dim) {
    const int64_t n = (int64_t)n_rows * dim;
    if (!bias || n < 1) return cudaSuccess;
    k_add_bias<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(y, bias, dim, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_add(cudaStream_t s, float *y, const float *x, int64_t n) {
    if (n < 1) return cudaSuccess;
    k_add<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(y, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_act(cudaStream_t s, float *x, int64_t n, int act) {
    if (n < 1) return cudaSuccess;
    k_act<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(x, n, act);
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_glu(cudaStream_t s, float *g, const float *u, int64_t n, int act) {
    if (n < 1) return cudaSuccess;
    k_glu<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(g, u, n, act);
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_softcap(cudaStream_t s, float *x, int64_t n, float cap) {
    if (n < 1) return cudaSuccess;
    k_softcap<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(x, n, cap);
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_split_heads(cudaStream_t s, float *a, float *b, const float *src,
                                           int32_t n_rows, int32_t n_heads, int32_t head_dim) {
    const int64_t n = (int64_t)n_rows * n_heads * head_dim;
    if (n < 1) return cudaSuccess;
    k_split_heads<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(a, b, src, head_dim, n_heads, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_gate_sigmoid(cudaStream_t s, float *x, const float *gate,
                                            int64_t n) {
    if (n < 1) return cudaSuccess;
    k_gate_sigmoid<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(x, gate, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kiln_cu_gather_rows(cudaStream_t s, float *dst, const float *src,
                                           const int32_t *rows, int32_t n_rows, int64_t d) {
    const int64_t n = (int64_t)n_rows * d;
    if (n < 1) return cudaSuccess;
    k_gather_rows<<<cu_ew_blocks(n), CU_EW_THREADS, 0, s>>>(dst, src, rows, d, n);
    return cudaGetLastError();
}

/* ---- greedy argmax ------------------------------------------------------------------------ */

/* one block per row: thread t scans i = t + 256 j keeping the first largest finite value
 * (sampler.c kiln_argmax: non-finite logits skipped, the lowest index among equals), then the
 * block merges (value, index) pairs preferring the larger value, then the lower index: the
 * first maximum, whatever the order of the merge; -1 when the row holds a NaN */
#define ARGMAX_THREADS 1024
__global__ void __launch_bounds__(ARGMAX_THREADS) k_argmax(int32_t *ids, const float *logits, int64_t n) {
    __shared__ float bv[ARGMAX_THREADS];
    __shared__ int32_t bi[ARGMAX_THREADS];
    const float *x = logits + (int64_t)blockIdx.x * n;
    float v = -INFINITY;
    int32_t best = -1;
    int nan_seen = 0;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
        const float xi = x[i];
        nan_seen |= isnan(xi);
        if (isfinite(xi) && (best < 0 || xi > v)) {
            v = xi;
            best = (int32_t)i;
        }
    }
    bv[threadIdx.x] = v;
    bi[threadIdx.x] = best;
    nan_seen = __syncthreads_or(nan_seen);
    for (int off = ARGMAX_THREADS / 2; off > 0; off >>= 1) {
        if (threadIdx.x < off) {
            const float ov = bv[threadIdx.x + off];
            const int32_t oi = bi[threadIdx.x + off];
            const int32_t mi = bi[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < mi))) {
                bv[threadIdx.x] = ov;
                bi[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) ids[blockIdx.x] = nan_seen ? -1 : bi[0] < 0 ? 0 : bi[0];
}

extern "C" cudaError_t kiln_cu_argmax(cudaStream_t s, int32_t *ids, const float *logits,
                                      int32_t n_rows, int64_t n_vocab) {
    if (n_rows < 1) return cudaSuccess;
    k_argmax<<<n_rows, ARGMAX_THREADS, 0, s>>>(ids, logits, n_vocab);
    return cudaGetLastError();
}
