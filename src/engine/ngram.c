/*
 * ngram.c - prompt-lookup drafts: continue the sequence the way it continued the last time
 * its current suffix occurred (spec.h).
 */
#include "engine/spec.h"

int32_t kiln_ngram_propose(const int32_t *tokens, int32_t len, int32_t nmin, int32_t nmax,
                           int32_t *out, int32_t cap) {
    if (!tokens || len < 2 || cap < 1 || nmin < 1 || nmax < nmin) return 0;
    for (int32_t n = nmax < len - 1 ? nmax : len - 1; n >= nmin; n--) {
        const int32_t *suf = tokens + len - n;
        /* occurrences end at i (exclusive), latest first; i < len keeps it earlier */
        for (int32_t i = len - 1; i >= n; i--) {
            int32_t k = 0;
            while (k < n && tokens[i - n + k] == suf[k]) k++;
            if (k < n) continue;
            int32_t m = len - i < cap ? len - i : cap;
            for (int32_t d = 0; d < m; d++) out[d] = tokens[i + d];
            return m;
        }
    }
    return 0;
}
