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
    a->u = 0;
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
    int32_t t = output[n_output - 1], j = a->j, u = a->u;
    int32_t take = -1; /* the prediction index t takes */
    if (a->pred[j] == t)
        take = j; /* in step (or an insertion is over) */
    else if (u >= 1 && j + u < a->n && a->pred[j + u] == t)
        take = j + u; /* u output tokens replaced u prediction tokens */
    else if (u == 0 && j + 1 < a->n && a->pred[j + 1] == t)
        take = j + 1; /* one prediction token left out */
    int32_t retro = 0; /* unaligned tokens before t that a matched n-gram aligns too */
    int32_t m_max = n_output < KILN_PRED_REALIGN_MAX ? n_output : KILN_PRED_REALIGN_MAX;
    for (int32_t m = m_max; take < 0 && m >= 2; m--) {
        /* q - 1 >= j: the token t takes is at or after j; q >= m for the n-gram to fit */
        for (int32_t q = j + 1 > m ? j + 1 : m; q <= a->n; q++)
            if (a->pred[q - 1] == t && tail_matches(a->pred, q, output, n_output, m)) {
                take = q - 1;
                retro = m - 1 < u ? m - 1 : u;
                if (retro > q - 1 - j) retro = q - 1 - j;
                break;
            }
    }
    if (take < 0) {
        a->u++;
        return;
    }
    a->j = take + 1;
    a->u = 0;
    a->accepted += 1 + retro;
}

int32_t kiln_pred_align_drafts(const kiln_pred_align *a, int32_t *out, int32_t cap) {
    int32_t from = a->j + a->u; /* after unaligned tokens: the guess that they replaced as many */
    int32_t n = a->n - from;
    if (n > cap) n = cap;
    if (n < 0) n = 0;
    for (int32_t i = 0; i < n; i++) out[i] = a->pred[from + i];
    return n;
}
