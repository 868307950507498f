/*
 * api_out.h - the generation routes whose request and response shapes are not OpenAI's
 * chat/completions: POST /v1/messages (Anthropic Messages, anthropic.h) and POST /v1/responses
 * (OpenAI Responses, responses.h).
 *
 * Each such route translates its request body into an OpenAI chat request (the body
 * srv_gen_parse takes as SRV_CHAT, so validation, the chat template, tools, assistant prefill
 * and sampling are the chat route's) and returns a srv_api_out: the per-request object that
 * turns the engine's events into the API's own response, whole or streamed. The server calls
 * its operations on the connection's thread, in this order:
 *   token (every TOKEN event), then for a stream: start once (after the first engine event),
 *   text for each TEXT event (with tools: the content the tool-call parser passes on, and
 *   tool_call / tool_args for the calls it finds), end once (FINISH); for a whole response:
 *   whole once (FINISH).
 * Nothing here does I/O.
 */
#ifndef KILN_SERVER_API_OUT_H
#define KILN_SERVER_API_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"
#include "server/openai.h"
#include "server/response_store.h"
#include "server/srv_util.h"

/** How a generation ended, as the FINISH event said. */
typedef struct srv_api_end {
    kiln_finish_reason finish;
    const kiln_usage *usage;
    const char *message; /* KILN_FINISH_ERROR: the engine's message ("" otherwise) */
    /* whole responses: the tool calls parsed from the reply ([{"id", "type": "function",
     * "function": {"name", "arguments": JSON text}}], borrowed), NULL or [] for none; the
     * text given to whole() is then the reply's content without their markup */
    const json_t *tool_calls;
} srv_api_end;

typedef struct srv_api_out srv_api_out;

typedef struct srv_api_out_ops {
    /** A generated token id (TOKEN event), in order. May be NULL. */
    void (*token)(srv_api_out *o, int32_t id);
    /** Stream: the events before any text. False on allocation failure. */
    bool (*start)(srv_api_out *o, srv_buf *out);
    /** Stream: a text delta (complete UTF-8, from the engine's TEXT event). */
    bool (*text)(srv_api_out *o, const char *text, size_t len, srv_buf *out);
    /** Stream, with tools: call `index` (0, 1, ...) begins (its id and name, as the tool-call
     *  parser gave them, kiln.h kiln_tool_event); text after it is content again. */
    bool (*tool_call)(srv_api_out *o, int32_t index, const char *id, const char *name,
                      size_t name_len, srv_buf *out);
    /** Stream, with tools: the next bytes of call `index`'s arguments (a JSON object's text). */
    bool (*tool_args)(srv_api_out *o, int32_t index, const char *text, size_t len,
                      srv_buf *out);
    /** Stream: the closing events (an error event for KILN_FINISH_ERROR). */
    bool (*end)(srv_api_out *o, const srv_api_end *end, srv_buf *out);
    /** The whole response body for text[0..len) (malloc'd, *n bytes); NULL on allocation
     *  failure. */
    char *(*whole)(srv_api_out *o, const char *text, size_t len, const srv_api_end *end,
                   size_t *n);
    void (*destroy)(srv_api_out *o);
} srv_api_out_ops;

/** The common part of every API's object (its first member). */
struct srv_api_out {
    const srv_api_out_ops *ops;
    char id[64];             /* the response's id ("msg_...", "resp_..."): set by the API */
    /* set by the server before the generation starts (borrowed) */
    const char *model;       /* served model name */
    const kiln_model *m;     /* for detokenizing */
    int32_t n_prompt;        /* prompt tokens (a prefill's included) */
    int64_t created;         /* Unix seconds */
};

/** Which API a route speaks. */
typedef enum srv_api {
    SRV_API_ANTHROPIC = 1, /* POST /v1/messages */
    SRV_API_RESPONSES = 2, /* POST /v1/responses */
} srv_api;

/** What the translation of a request needs from the server. */
typedef struct srv_api_ctx {
    srv_rstore *store; /* the Responses store (NULL: none; previous_response_id is then 404) */
    double now_s;      /* monotonic seconds, for the store's TTL */
} srv_api_ctx;

/**
 * Translate a request body of `api` into an OpenAI chat request body (*chat, malloc'd JSON
 * text of *chat_len bytes) and its response object (*out). On failure fills e (the HTTP
 * status and message; the route's own error shape is chosen when it is written) and leaves
 * *chat and *out NULL.
 */
bool srv_api_translate(srv_api api, const char *body, size_t len, const srv_api_ctx *ctx,
                       char **chat, size_t *chat_len, srv_api_out **out, srv_error *e);

/** Destroy an API object. NULL is a no-op. */
void srv_api_out_destroy(srv_api_out *o);

#endif
