/*
 * cpu_delta_net.c - the CPU backend's gated delta net (Qwen3-Next linear attention; Yang et
 * al. 2024, "Gated Delta Networks"; the recurrent form of transformers'
 * torch_recurrent_gated_delta_rule): the causal depthwise conv with its window in the
 * sequence's recurrent state, and the delta rule per (sequence, value head), dealt
 * round-robin over the threads (each item is one sequential chain, so any deal gives the same
 * bits).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_context.h"
#include "backend/cpu/ops.h"

/* torch.nn.functional.softplus (beta 1, threshold 20). */
static float softplusf(float v) {
    return v > 20.0f ? v : log1pf(expf(v));
}

/* causal depthwise conv over [q | k | v] channels, then silu; the window holds the previous
 * K-1 inputs of each channel, oldest first */
void kiln_cpu_gdn_conv(kiln_backend *be, float *c_out, const float *proj, const kiln_gdn_params *P,
                       const kiln_step *st) {
    (void)be;
    const int32_t nk = P->n_k_heads, nv = P->n_v_heads, hk = P->k_head_dim, hv = P->v_head_dim,
                  r = nv / nk, K = P->conv_kernel;
    const int64_t key_dim = (int64_t)nk * hk, value_dim = (int64_t)nv * hv,
                  conv_dim = 2 * key_dim + value_dim, grp = 2 * (int64_t)hk + 2 * (int64_t)r * hv,
                  pw = 2 * key_dim + 2 * value_dim;
    for (int32_t s = 0; s < st->b->n_seqs; s++) {
        const kiln_batch_seq *sq = &st->b->seqs[s];
        float *win = sq->rec_state + P->state_off;
        for (int32_t t = 0; t < sq->n_new; t++) {
            const int32_t i = sq->first + t;
            const float *p = proj + i * pw;
            for (int64_t ch = 0; ch < conv_dim; ch++) {
                float xin;
                if (ch < 2 * key_dim) {
                    const int64_t part = ch / key_dim, e = ch % key_dim;
                    xin = p[(e / hk) * grp + part * hk + e % hk];
                } else {
                    const int64_t e = ch - 2 * key_dim, vh = e / hv;
                    xin = p[(vh / r) * grp + 2 * hk + (vh % r) * hv + e % hv];
                }
                const float *w = P->conv + ch * K;
                float *cw = win + ch * (K - 1);
                float acc = 0.0f;
                for (int32_t a = 0; a < K - 1; a++) acc += w[a] * cw[a];
                acc += w[K - 1] * xin;
                for (int32_t a = 0; a + 1 < K - 1; a++) cw[a] = cw[a + 1];
                if (K > 1) cw[K - 2] = xin;
                c_out[i * conv_dim + ch] = kiln_act_value(acc, KILN_OP_ACT_SILU);
            }
        }
    }
}

typedef struct gdn_job {
    cpu_backend *c;
    float *out;
    const float *cv, *proj, *ba;
    const kiln_gdn_params *P;
    const kiln_step *st;
} gdn_job;

/* The delta rule along one sequence's tokens for one value head, then the gated RMSNorm:
 *   S *= exp(g);  delta = (v - S^T k) * beta;  S += k delta^T;  o = S^T q
 *   o = rms(o) * w * silu(z) */
static void gdn_worker(void *ctx, int ith, int nth) {
    gdn_job *j = ctx;
    const kiln_gdn_params *P = j->P;
    const int32_t nk = P->n_k_heads, nv = P->n_v_heads, hk = P->k_head_dim, hv = P->v_head_dim,
                  r = nv / nk, K = P->conv_kernel;
    const int64_t key_dim = (int64_t)nk * hk, value_dim = (int64_t)nv * hv,
                  conv_dim = 2 * key_dim + value_dim, grp = 2 * (int64_t)hk + 2 * (int64_t)r * hv,
                  proj = 2 * key_dim + 2 * value_dim;
    const int32_t mx = j->c->res.gdn_head_dim;
    float *qn = j->c->gdn_scratch + (size_t)ith * 4 * (size_t)mx, *kn = qn + mx, *kvm = kn + mx,
          *ov = kvm + mx;
    const float qscale = 1.0f / sqrtf((float)hk);
    const int64_t total = (int64_t)j->st->b->n_seqs * nv;
    for (int64_t w = ith; w < total; w += nth) {
        const int32_t s = (int32_t)(w / nv), h = (int32_t)(w % nv), kh = h / r;
        const kiln_batch_seq *sq = &j->st->b->seqs[s];
        float *S = sq->rec_state + P->state_off + conv_dim * (K - 1) + (int64_t)h * hk * hv;
        const float A = expf(P->a_log[h]);
        for (int32_t t = 0; t < sq->n_new; t++) {
            const int32_t i = sq->first + t;
            const float *cr = j->cv + i * conv_dim;
            memcpy(qn, cr + (int64_t)kh * hk, (size_t)hk * sizeof(float));
            memcpy(kn, cr + key_dim + (int64_t)kh * hk, (size_t)hk * sizeof(float));
            kiln_l2norm(qn, hk, 1e-6f);
            kiln_l2norm(kn, hk, 1e-6f);
            for (int32_t e = 0; e < hk; e++) qn[e] *= qscale;
            const float *vv = cr + 2 * key_dim + (int64_t)h * hv;
            const float *ba = j->ba + i * 2 * (int64_t)nv + (int64_t)kh * 2 * r;
            const float beta = kiln_cpu_sigmoid(ba[h % r]);
            const float g = -A * softplusf(ba[r + h % r] + P->dt_bias[h]);
            const float decay = expf(g);
            for (int64_t e = 0; e < (int64_t)hk * hv; e++) S[e] *= decay;
            for (int32_t b2 = 0; b2 < hv; b2++) kvm[b2] = 0.0f;
            for (int32_t a = 0; a < hk; a++)
                for (int32_t b2 = 0; b2 < hv; b2++) kvm[b2] += S[a * hv + b2] * kn[a];
            for (int32_t b2 = 0; b2 < hv; b2++) kvm[b2] = (vv[b2] - kvm[b2]) * beta;
            for (int32_t a = 0; a < hk; a++)
                for (int32_t b2 = 0; b2 < hv; b2++) S[a * hv + b2] += kn[a] * kvm[b2];
            for (int32_t b2 = 0; b2 < hv; b2++) ov[b2] = 0.0f;
            for (int32_t a = 0; a < hk; a++)
                for (int32_t b2 = 0; b2 < hv; b2++) ov[b2] += S[a * hv + b2] * qn[a];
            /* gated RMSNorm with z of this head */
            const float *z = j->proj + i * proj + (int64_t)kh * grp + 2 * hk + (int64_t)r * hv +
                             (int64_t)(h % r) * hv;
            float *out = j->out + i * value_dim + (int64_t)h * hv;
            kiln_rmsnorm(out, ov, P->norm, hv, P->norm_eps);
            for (int32_t b2 = 0; b2 < hv; b2++)
                out[b2] = out[b2] * kiln_act_value(z[b2], KILN_OP_ACT_SILU);
        }
    }
}

void kiln_cpu_gdn_rule(kiln_backend *be, float *out, const float *c, const float *proj,
                       const float *ba, const kiln_gdn_params *p, const kiln_step *st) {
    gdn_job job = {cpu_be(be), out, c, proj, ba, p, st};
    kiln_threadpool_run(cpu_be(be)->tp, gdn_worker, &job);
}
