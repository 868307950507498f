#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* ---- stop token ids ------------------------------------------------------------------ */

bool kiln_stop_token_match(const int32_t *ids, int32_t n, int32_t token) {
    if (!ids) return false;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] == token) return true;
    return false;
}

kiln_status kiln_stop_tokens_validate(const int32_t *ids, int32_t n, int32_t n_vocab,
                                      kiln_error *err) {
    if (n < 0 || n > KILN_STOP_MAX_TOKENS)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "stop_token_ids must have at most %d entries (got %d)",
                              KILN_STOP_MAX_TOKENS, n);
    if (n > 0 && !ids)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "stop_token_ids has %d entries but no array", n);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "stop_token_ids[%d] must be in [0, %d) (got %d)", i, n_vocab,
                                  ids[i]);
    return KILN_OK;
}

/* ---- stop strings -------------------------------------------------------------------- */

/* RFC 3629 well-formedness (Unicode Table 3-7). */
static bool utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (n - i < len) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return false;
        i += len;
    }
    return true;
}

kiln_status kiln_stop_strings_validate(const char *const *stops, int32_t n, kiln_error *err) {
    if (n < 0 || n > KILN_STOP_MAX_STRINGS)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "stop must have at most %d entries (got %d)", KILN_STOP_MAX_STRINGS,
                              n);
    if (n > 0 && !stops)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stop has %d entries but no array",
                              n);
    for (int32_t i = 0; i < n; i++) {
        if (!stops[i]) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stop[%d] is NULL", i);
        size_t len = 0; /* bounded strlen */
        while (len <= KILN_STOP_MAX_BYTES && stops[i][len]) len++;
        if (len == 0)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stop[%d] must not be empty", i);
        if (len > KILN_STOP_MAX_BYTES)
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                  "stop[%d] must be at most %d bytes long", i, KILN_STOP_MAX_BYTES);
        if (!utf8_valid((const unsigned char *)stops[i], len))
            return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stop[%d] is not valid UTF-8", i);
    }
    return KILN_OK;
}

struct kiln_stop_matcher {
    int32_t n;
    char *stops[KILN_STOP_MAX_STRINGS];
    size_t lens[KILN_STOP_MAX_STRINGS];
    size_t max_len;
    /* buf[0..start) was emitted by the last call (and backs its result); buf[start..len) is
     * the held text. */
    char *buf;
    size_t start, len, cap;
    int32_t matched;
    bool finished;
};

static const char k_empty[1] = "";

kiln_status kiln_stop_matcher_create(const char *const *stops, int32_t n, kiln_stop_matcher **out,
                                     kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    kiln_status st = kiln_stop_strings_validate(stops, n, err);
    if (st) return st;
    kiln_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    m->matched = -1;
    for (int32_t i = 0; i < n; i++) {
        size_t len = strlen(stops[i]);
        m->stops[i] = malloc(len);
        if (!m->stops[i]) {
            kiln_stop_matcher_destroy(m);
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
        memcpy(m->stops[i], stops[i], len);
        m->lens[i] = len;
        if (len > m->max_len) m->max_len = len;
        m->n = i + 1;
    }
    *out = m;
    return KILN_OK;
}

void kiln_stop_matcher_destroy(kiln_stop_matcher *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->buf);
    free(m);
}

/* First occurrence of pat[0..pn) in s[0..n), or SIZE_MAX. */
static size_t find(const char *s, size_t n, const char *pat, size_t pn) {
    if (pn > n) return SIZE_MAX;
    for (size_t i = 0; i + pn <= n; i++)
        if (s[i] == pat[0] && memcmp(s + i, pat, pn) == 0) return i;
    return SIZE_MAX;
}

/* Earliest complete match in s[0..n): same start: shortest; same string: first listed.
 * Returns the stop index (or -1) and its start in *at. */
static int32_t earliest_match(const kiln_stop_matcher *m, const char *s, size_t n, size_t *at) {
    size_t best_q = SIZE_MAX, best_len = 0;
    int32_t best = -1;
    for (int32_t i = 0; i < m->n; i++) {
        size_t q = find(s, n, m->stops[i], m->lens[i]);
        if (q == SIZE_MAX) continue;
        if (q < best_q || (q == best_q && m->lens[i] < best_len)) {
            best_q = q;
            best_len = m->lens[i];
            best = i;
        }
    }
    *at = best_q;
    return best;
}

static void set_result(kiln_stop_result *res, const char *text, size_t len, int32_t idx) {
    res->text = len ? text : k_empty;
    res->len = len;
    res->stop_index = idx;
}

kiln_status kiln_stop_matcher_feed(kiln_stop_matcher *m, const char *text, size_t len,
                                   kiln_stop_result *res, kiln_error *err) {
    if (!m || !res || (len > 0 && !text)) {
        if (res) set_result(res, k_empty, 0, -1);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stop matcher: NULL argument");
    }
    if (m->finished) {
        set_result(res, k_empty, 0, m->matched);
        return KILN_OK;
    }
    size_t held = m->len - m->start;
    if (held > SIZE_MAX - len) {
        set_result(res, k_empty, 0, -1);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "stop matcher: chunk too long");
    }
    size_t need = held + len;
    if (need > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *nb = realloc(m->buf, cap);
        if (!nb) {
            set_result(res, k_empty, 0, -1);
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
        m->buf = nb;
        m->cap = cap;
    }
    if (m->start > 0 && held > 0) memmove(m->buf, m->buf + m->start, held);
    if (len > 0) memcpy(m->buf + held, text, len);
    m->start = 0;
    m->len = need;
    const char *b = m->buf;
    size_t n = m->len;

    size_t best_q;
    int32_t best = earliest_match(m, b, n, &best_q);

    /* earliest start of a suffix that is a proper prefix of some stop string */
    size_t h = n;
    size_t from = (m->max_len > 0 && n > m->max_len - 1) ? n - (m->max_len - 1) : 0;
    for (size_t p = from; p < n && h == n; p++) {
        size_t tail = n - p;
        for (int32_t i = 0; i < m->n; i++) {
            if (m->lens[i] > tail && memcmp(b + p, m->stops[i], tail) == 0) {
                h = p;
                break;
            }
        }
    }

    if (best >= 0 && best_q <= h) {
        /* no stop string can still match earlier: commit */
        m->finished = true;
        m->matched = best;
        m->start = m->len = 0;
        set_result(res, b, best_q, best);
        return KILN_OK;
    }
    /* emit up to the earliest possible (complete or partial) match; hold the rest */
    size_t emit = h;
    m->start = emit;
    set_result(res, b, emit, -1);
    return KILN_OK;
}

void kiln_stop_matcher_flush(kiln_stop_matcher *m, kiln_stop_result *res) {
    if (!res) return;
    if (!m) {
        set_result(res, k_empty, 0, -1);
        return;
    }
    if (m->finished) {
        set_result(res, k_empty, 0, m->matched);
        return;
    }
    m->finished = true;
    if (m->len > m->start) {
        /* partial matches can no longer complete: a complete match that waited on an
         * earlier partial one now wins */
        const char *b = m->buf + m->start;
        size_t q;
        int32_t idx = earliest_match(m, b, m->len - m->start, &q);
        m->matched = idx;
        set_result(res, b, idx >= 0 ? q : m->len - m->start, idx);
    } else {
        set_result(res, k_empty, 0, -1);
    }
    m->start = m->len = 0;
}

size_t kiln_stop_matcher_held(const kiln_stop_matcher *m) {
    return (m && !m->finished) ? m->len - m->start : 0;
}

int32_t kiln_stop_matcher_matched(const kiln_stop_matcher *m) {
    return m ? m->matched : -1;
}

void kiln_stop_matcher_reset(kiln_stop_matcher *m) {
    if (!m) return;
    m->start = m->len = 0;
    m->matched = -1;
    m->finished = false;
}
