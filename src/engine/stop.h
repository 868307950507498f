/*
 * stop.h - stop conditions of a request: stop token ids and stop strings (OpenAI `stop`).
 *
 * Stop strings are matched on the decoded text stream (DESIGN.md "Read": detokenize
 * incrementally and hold back any text that could still begin a stop string). The matcher
 * is fed complete UTF-8 chunks (the detokenizer already holds back incomplete sequences) and
 * says which bytes are safe to emit now.
 *
 * Match rule, defined on the whole text so that it never depends on how the text was split
 * into chunks: the occurrence of any stop string that STARTS earliest wins; among stop
 * strings that start at the same position the SHORTEST wins (it completes first while
 * streaming; the emitted text is the same either way); identical strings: the first listed.
 * The text before the match is emitted; the stop string and everything after it are not.
 * A complete match is therefore only reported once no other stop string could still match
 * at an earlier position. As vLLM / the OpenAI API do, the stop string is not included.
 */
#ifndef KILN_ENGINE_STOP_H
#define KILN_ENGINE_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

/** Most stop strings a request may give (the OpenAI API's limit). */
#define KILN_STOP_MAX_STRINGS 4
/** Longest stop string, in bytes. */
#define KILN_STOP_MAX_BYTES 256
/** Most extra stop token ids a request may give. */
#define KILN_STOP_MAX_TOKENS 64

/** True when `token` is one of ids[0..n) (linear scan; n is small). ids may be NULL if n=0. */
bool kiln_stop_token_match(const int32_t *ids, int32_t n, int32_t token);

/**
 * Check stop token ids: n in [0, KILN_STOP_MAX_TOKENS], each id in [0, n_vocab).
 * Errors: KILN_ERR_INVALID_ARGUMENT ("stop_token_ids[2] must be in [0, 32000) (got -1)").
 */
kiln_status kiln_stop_tokens_validate(const int32_t *ids, int32_t n, int32_t n_vocab,
                                      kiln_error *err);

/**
 * Check stop strings: n in [0, KILN_STOP_MAX_STRINGS]; each NUL-terminated, non-NULL,
 * 1..KILN_STOP_MAX_BYTES bytes, valid UTF-8 (RFC 3629: no overlongs, surrogates or values
 * above U+10FFFF). Errors: KILN_ERR_INVALID_ARGUMENT naming `stop` ("stop[1] must not be
 * empty", "stop must have at most 4 entries (got 5)").
 */
kiln_status kiln_stop_strings_validate(const char *const *stops, int32_t n, kiln_error *err);

/** Incremental stop-string matcher for one request's text stream. */
typedef struct kiln_stop_matcher kiln_stop_matcher;

/**
 * Create a matcher for stops[0..n) (validated as kiln_stop_strings_validate; the strings
 * are copied). n = 0 gives a pass-through matcher.
 * Errors: KILN_ERR_INVALID_ARGUMENT, KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kiln_stop_matcher_create(const char *const *stops, int32_t n, kiln_stop_matcher **out,
                                     kiln_error *err);
void kiln_stop_matcher_destroy(kiln_stop_matcher *m);

/** What a feed/flush call produced. */
typedef struct kiln_stop_result {
    const char *text; /* bytes safe to emit now (never NULL, may be empty; not
                         NUL-terminated); valid until the next call on the matcher */
    size_t len;
    int32_t stop_index; /* >= 0: stops[stop_index] matched: the request is finished and
                           `text` is its last text; -1: no match (yet) */
} kiln_stop_result;

/**
 * Feed newly decoded text[0..len) (complete UTF-8). The held-back text plus this chunk is
 * scanned; *res gets the text safe to emit now: everything except (a) on a match, the
 * stop string and all after it, or (b) the longest suffix that is a proper prefix of some
 * stop string (held back until resolved; it always starts on a UTF-8 character boundary).
 * Held text never exceeds KILN_STOP_MAX_BYTES - 1 bytes. After a match the matcher is
 * finished: later feeds emit nothing and report the same stop_index. text may be NULL when
 * len is 0. Cost: O((held + len) * total stop bytes) worst case.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL m/res, NULL text with len > 0),
 * KILN_ERR_OUT_OF_MEMORY (then *res is empty and the matcher unchanged).
 */
kiln_status kiln_stop_matcher_feed(kiln_stop_matcher *m, const char *text, size_t len,
                                   kiln_stop_result *res, kiln_error *err);

/**
 * End of stream (EOS, max_tokens, a stop token, ...): the held text is resolved and the
 * matcher is finished. Usually *res gets all the held text (a partial match can no longer
 * complete) with stop_index -1. But when the held text contains a complete match that was
 * waiting on an earlier partial one (stops "abcd" and "c", text ending "abc"), that match now
 * wins: *res gets the text before it and stop_index its index (callers may report finish
 * reason "stop"). After an earlier match, *res is empty and stop_index is the matched index.
 */
void kiln_stop_matcher_flush(kiln_stop_matcher *m, kiln_stop_result *res);

/** Bytes currently held back. */
size_t kiln_stop_matcher_held(const kiln_stop_matcher *m);

/** Index of the matched stop string, or -1 when none matched. */
int32_t kiln_stop_matcher_matched(const kiln_stop_matcher *m);

/** Forget all text and any match; the stop strings are kept. */
void kiln_stop_matcher_reset(kiln_stop_matcher *m);

#endif
