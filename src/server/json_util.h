/*
 * json_util.h - small JSON helpers shared by the request translators of /v1/messages and
 * /v1/responses (anthropic.c, responses.c): typed field reads whose errors name the field,
 * and the SSE framing of named events.
 */
#ifndef KILN_SERVER_JSON_UTIL_H
#define KILN_SERVER_JSON_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "server/openai.h"
#include "server/srv_util.h"

/** "an object", "an array", "a string", "an integer", "a number", "a boolean", "null". */
const char *srv_json_type_name(const json_t *v);

/** root[key] unless absent or JSON null (then NULL). */
json_t *srv_json_field(const json_t *root, const char *key);

/** A 400 invalid_request_error naming param (for `return srv_bad(...)`). */
bool srv_bad(srv_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** A 500 "out of memory" (what). */
bool srv_oom(srv_error *e, const char *what);

/**
 * Append "event: <name>\ndata: <o as compact JSON>\n\n" to out (the SSE framing of the
 * Anthropic and Responses streams). Takes o's reference. False on allocation failure.
 */
bool srv_sse_event(const char *name, json_t *o, srv_buf *out);

/** A JSON string of s[0..n), invalid UTF-8 replaced by U+FFFD. New reference. */
json_t *srv_json_text(const char *s, size_t n);

#endif
