/*
 * cpu_experts.c - the CPU backend's mixture-of-experts routing, gather and scatter
 * (transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock order): a token's experts
 * come from its own router logits, and each selected expert's contribution is added to the
 * token's accumulator in ascending expert id whatever the other tokens chose.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_context.h"
#include "backend/cpu/ops.h"

void kiln_cpu_moe_route(kiln_backend *be, float *probs, int32_t *sel_all, float *wt_all,
                        int32_t n_rows, int32_t E, int32_t k, bool renorm) {
    (void)be;
    for (int32_t i = 0; i < n_rows; i++) {
        float *p = probs + (int64_t)i * E;
        kiln_softmax(p, E);
        int32_t *sel = sel_all + (int64_t)i * k;
        float *wt = wt_all + (int64_t)i * k;
        for (int32_t a = 0; a < k; a++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                bool taken = false;
                for (int32_t b2 = 0; b2 < a; b2++) taken |= sel[b2] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[a] = best;
            wt[a] = p[best];
        }
        if (renorm) {
            float sum = 0.0f;
            for (int32_t a = 0; a < k; a++) sum += wt[a];
            for (int32_t a = 0; a < k; a++) wt[a] /= sum;
        }
    }
}

int32_t kiln_cpu_moe_gather(kiln_backend *be, float *xe, int32_t *erow, const float *x,
                            const int32_t *sel, int32_t n_rows, int32_t k, int64_t d,
                            int32_t expert) {
    (void)be;
    int32_t m = 0;
    for (int32_t i = 0; i < n_rows; i++)
        for (int32_t a = 0; a < k; a++)
            if (sel[(int64_t)i * k + a] == expert) {
                erow[m] = i * k + a;
                memcpy(xe + (int64_t)m * d, x + (int64_t)i * d, (size_t)d * sizeof(float));
                m++;
            }
    return m;
}

void kiln_cpu_moe_scatter(kiln_backend *be, float *acc_all, const float *y_all, const int32_t *erow,
                          const float *wt, int32_t m, int32_t k, int64_t d) {
    (void)be;
    for (int32_t r = 0; r < m; r++) {
        const int32_t i = erow[r] / k;
        const float w = wt[erow[r]];
        float *acc = acc_all + (int64_t)i * d;
        const float *y = y_all + (int64_t)r * d;
        for (int64_t j = 0; j < d; j++) acc[j] = acc[j] + y[j] * w;
    }
}

void kiln_cpu_moe_shared(kiln_backend *be, float *o, const float *acc, const float *y,
                         const float *gate_logit, int32_t n_rows, int64_t d) {
    (void)be;
    for (int32_t i = 0; i < n_rows; i++) {
        const float sg = gate_logit ? kiln_cpu_sigmoid(gate_logit[i]) : 1.0f;
        for (int64_t j = 0; j < d; j++) o[i * d + j] = acc[i * d + j] + sg * y[i * d + j];
    }
}
