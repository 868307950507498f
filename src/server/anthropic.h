/*
 * anthropic.h - POST /v1/messages: Anthropic's Messages API over the chat route (api_out.h).
 *
 * Semantics follow Anthropic's API reference ("Messages", "Streaming Messages", "Errors"):
 * the request (model, max_tokens, messages with string or block content, system,
 * stop_sequences, temperature, top_p, top_k, stream, metadata, tools, tool_choice) becomes an
 * OpenAI chat request: system first, text blocks joined with "\n", tool_use blocks as the
 * assistant's tool_calls (input as JSON arguments), tool_result blocks as "tool" messages, a
 * final assistant message continued as the chat route's assistant prefill (its tokens
 * asserted, not sampled). The response is a "message" object; the stream uses Anthropic's
 * events (message_start, ping, content_block_start, content_block_delta, content_block_stop,
 * message_delta, message_stop; "error" when the generation fails after the stream started).
 * usage.input_tokens excludes the prompt tokens whose KV came from kiln's prefix cache, which
 * are usage.cache_read_input_tokens (Anthropic's split: the three add up to the prompt);
 * cache_creation_input_tokens is always 0 (kiln caches every prompt, with no cache_control).
 */
#ifndef KILN_SERVER_ANTHROPIC_H
#define KILN_SERVER_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "server/api_out.h"
#include "server/openai.h"

/**
 * Translate a parsed Messages request (root, borrowed) into an OpenAI chat request (*chat,
 * new reference) and its response object (*out). On failure fills e (400 naming the field:
 * a missing model, max_tokens or messages, a wrong type, an unknown role, an image or other
 * unsupported content block, a server tool, extended thinking, more stop_sequences than the
 * engine matches) and leaves *chat and *out NULL.
 */
bool srv_anthropic_translate(const json_t *root, json_t **chat, srv_api_out **out, srv_error *e);

/** Anthropic's error "type" for an HTTP status: invalid_request_error (400, 405, 422),
 *  authentication_error (401), permission_error (403), not_found_error (404),
 *  request_too_large (413), rate_limit_error (429), overloaded_error (503, 529),
 *  timeout_error (408, 504), api_error (500 and anything else). */
const char *srv_anthropic_error_type(int http_status);

/** The body {"type": "error", "error": {"type", "message"}} of e (malloc'd). NULL on
 *  allocation failure. */
char *srv_anthropic_error_json(const srv_error *e, size_t *len);

#endif
