/*
 * server.h - `kiln serve`: an OpenAI-compatible HTTP server over one engine.
 *
 * HTTP/1.1 by libmicrohttpd (one thread per connection), JSON by jansson. Routes:
 *   POST /v1/completions, POST /v1/chat/completions (OpenAI API; SSE when "stream": true),
 *   POST /v1/messages (Anthropic's Messages API, anthropic.h; errors in Anthropic's shape),
 *   POST /v1/responses, GET and DELETE /v1/responses/{id} (OpenAI's Responses API,
 *   responses.h, with the in-memory store of response_store.h),
 *   GET /v1/models, GET /v1/models/{id}, GET /health (200 ready, 503 loading/draining),
 *   GET /metrics (Prometheus text), POST /tokenize, POST /detokenize (vLLM's shapes).
 * Errors use OpenAI's {"error": {"message", "type", "param", "code"}} body.
 *
 * Life cycle: kiln_server_start listens at once and answers 503 until kiln_server_set_ready
 * hands it a model and an engine (so /health can report loading). kiln_server_shutdown
 * stops accepting connections, lets in-flight requests finish for a grace period, cancels
 * the rest (their streams still end with a finish chunk and [DONE]) and waits for them.
 * kiln_server_destroy stops the HTTP daemon; the engine and model stay the caller's.
 */
#ifndef KILN_SERVER_SERVER_H
#define KILN_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln.h"

typedef struct kiln_server kiln_server;

typedef struct kiln_server_params {
    const char *host;        /* address to bind; NULL = "127.0.0.1" */
    int port;                /* 0 = an ephemeral port (see kiln_server_port) */
    const char *api_key;     /* when set, the /v1 routes, /tokenize and /detokenize require
                                "Authorization: Bearer <key>" or "x-api-key: <key>" (401
                                otherwise) */
    const char *model_name;  /* the served model's names, comma-separated: the first is the id
                                /v1/models lists and responses carry, the others are aliases.
                                A request's "model" (completions, chat) must be one of them or
                                absent (404 model_not_found otherwise, as OpenAI answers); at
                                most 16 names; NULL or "" = "kiln" */
    size_t max_body;         /* request body limit in bytes (413 above); 0 = 8 MiB */
    int32_t max_connections; /* concurrent connections; 0 = 256 */
    int32_t timeout_s;       /* seconds a client may stay silent while sending a request or
                                between requests; 0 = 30 */
    FILE *log;               /* one line per request and server events; NULL = stderr */
    bool quiet;              /* no per-request log lines */
    bool verbose;            /* also libmicrohttpd's own messages */
    int64_t response_store_max;  /* bytes of stored /v1/responses results (previous_response_id,
                                    GET /v1/responses/{id}); 0 = 64 MiB, < 0 = store nothing */
    double response_store_ttl_s; /* seconds a stored response lives; 0 = 3600 */
    const char *tool_parser; /* the tool-call markup parsed from chat replies: "hermes",
                                "llama3", "mistral" or "none"; NULL or "auto" = the family the
                                chat template asks for (kiln_tool_format_detect) */
} kiln_server_params;

/**
 * Bind and start answering (503 "loading" until kiln_server_set_ready).
 * Errors: KILN_ERR_INVALID_ARGUMENT (bad host or port, or tool_parser, named), KILN_ERR_IO (bind/listen
 * failed: address in use, permission), KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL.
 */
kiln_status kiln_server_start(const kiln_server_params *params, kiln_server **out, kiln_error *err);

/** The bound TCP port (useful with port 0). */
int kiln_server_port(const kiln_server *s);

/**
 * Serve `model` through `engine` (both borrowed; they must outlive the server's use of them,
 * i.e. until kiln_server_destroy). n_ctx is the engine's context (prompt + max_tokens - 1
 * must fit; 0 = the model's training context, or 4096). The chat template comes from the
 * model's tokenizer; without one (or when it does not parse) ChatML is used and logged.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL model/engine, already ready).
 */
kiln_status kiln_server_set_ready(kiln_server *s, const kiln_model *model, kiln_engine *engine,
                                  int32_t n_ctx, kiln_error *err);

/** True when the chat template in use is the ChatML fallback. */
bool kiln_server_chat_fallback(const kiln_server *s);

/**
 * Graceful stop: refuse new connections (the listening socket is closed), answer 503 on kept-
 * alive ones, wait up to grace_s seconds for in-flight generations, cancel the rest (finish
 * reason "abort") and wait for their responses to end. Idempotent. Safe from any thread but
 * the server's own.
 */
void kiln_server_shutdown(kiln_server *s, double grace_s);

/** Cancel every in-flight generation now (their streams end with finish reason "abort");
 *  new requests are cancelled as they arrive. For a second Ctrl-C during a shutdown. */
void kiln_server_cancel_all(kiln_server *s);

/** Shut down (grace 0) if not done, stop the HTTP daemon and free. NULL is a no-op. */
void kiln_server_destroy(kiln_server *s);

/** Generation requests in flight now. */
int32_t kiln_server_in_flight(kiln_server *s);

#endif
