/*
 * prediction.c - aligning a client prediction (OpenAI `prediction`) to the output as it is
 * generated, for drafting and for accepted/rejected_prediction_tokens (kiln_usage gives the
 * rule; spec.h declares it).
 */
#include "engine/spec.h"

void kiln_pred_align_init(kiln_pred_align *a, const int32_t *pred, int32_t n) {
    a->pred = pred;
    a->n = n > 0 ? n : 0;
    a->j = 0;
    a->accepted = 0;
}

/* Whether out[n_out - m .. n_out) == pred[q - m .. q). */
static bool tail_matches(const int32_t *pred, int32_t q, const int32_t *out, int32_t n_out,
                         int32_t m) {
    for (int32_t i = 1; i <= m; i++)
        if (pred[q - i] != out[n_out - i]) return false;
    return true;
}

void kiln_pred_align_push(kiln_pred_align *a, const int32_t *output, int32_t n_output) {
    if (n_output < 1 || a->j >= a->n) return;
    int32_t t = output[n_output - 1];
    if (a->pred[a->j] == t) {
        a->j++;
        a->accepted++;
        return;
    }
    int32_t m_max = n_output < KILN_PRED_REALIGN_MAX ? n_output : KILN_PRED_REALIGN_MAX;
    for (int32_t m = m_max; m >= 1; m--) {
        /* q - 1 >= j: the token t takes is at or after j; q >= m for the n-gram to fit */
        int32_t q0 = a->j + 1 > m ? a->j + 1 : m;
        for (int32_t q = q0; q <= a->n; q++) {
            if (a->pred[q - 1] != t || !tail_matches(a->pred, q, output, n_output, m)) continue;
            a->j = q;
            a->accepted++;
            return;
        }
    }
}

int32_t kiln_pred_align_drafts(const kiln_pred_align *a, int32_t *out, int32_t cap) {
    int32_t n = a->n - a->j;
    if (n > cap) n = cap;
    if (n < 0) n = 0;
    for (int32_t i = 0; i < n; i++) out[i] = a->pred[a->j + i];
    return n;
}
