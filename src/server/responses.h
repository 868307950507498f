/*
 * responses.h - POST /v1/responses: OpenAI's Responses API over the chat route (api_out.h),
 * with GET and DELETE /v1/responses/{id} answered from the response store.
 *
 * Semantics follow OpenAI's API reference ("Responses": create, retrieve, delete, the
 * response object, "Streaming events"). The request (input as a string or a list of items,
 * instructions, previous_response_id, max_output_tokens, temperature, top_p, stream, store,
 * tools, tool_choice, parallel_tool_calls, text.format, metadata) becomes an OpenAI chat
 * request:
 *   - the instructions, as the first (system) message; they are not carried over to a later
 *     response that names this one as previous_response_id (OpenAI's rule);
 *   - previous_response_id: the stored conversation of that response (its input and its
 *     output), then this request's input;
 *   - message items (role user, assistant, system or developer; content a string or parts
 *     input_text / output_text / refusal, joined with "\n") as chat messages;
 *     function_call items as the assistant's tool_calls (consecutive ones form one assistant
 *     turn), function_call_output items as "tool" messages; item_reference items are looked
 *     up among the stored responses' output items; reasoning items are skipped;
 *   - a final assistant message is continued (the chat route's assistant prefill);
 *   - text.format json_object / json_schema as the chat route's response_format.
 * The response object has one "message" output item with one "output_text" part; status
 * "completed", or "incomplete" with incomplete_details.reason "max_output_tokens" when the
 * token budget ran out; usage {input_tokens, input_tokens_details.cached_tokens (the prefix
 * cache's), output_tokens, output_tokens_details.reasoning_tokens (0), total_tokens}. A stream
 * sends response.created, response.in_progress, response.output_item.added,
 * response.content_part.added, response.output_text.delta..., response.output_text.done,
 * response.content_part.done, response.output_item.done, then response.completed (or
 * response.incomplete; response.failed when the generation fails), each with a
 * sequence_number from 0. With store (the default) the finished response is kept in the
 * response store (response_store.h).
 */
#ifndef KILN_SERVER_RESPONSES_H
#define KILN_SERVER_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "server/api_out.h"
#include "server/openai.h"
#include "server/response_store.h"

/**
 * Translate a parsed Responses request (root, borrowed) into an OpenAI chat request (*chat,
 * new reference) and its response object (*out), looking previous_response_id and
 * item_reference ids up in store (borrowed; NULL = an empty store) at now_s. On failure fills
 * e and leaves *chat and *out NULL: 404 (code previous_response_not_found, param
 * previous_response_id) for an unknown or expired previous response, 404 for an unknown
 * item_reference, else 400 naming the field (wrong types, an unknown item type or role, an
 * image, file or audio part, a tool that is not a function, background or conversation).
 */
bool srv_responses_translate(const json_t *root, srv_rstore *store, double now_s, json_t **chat,
                             srv_api_out **out, srv_error *e);

/** GET /v1/responses/{id}: the stored response's JSON (malloc'd) or a 404 in e. */
char *srv_responses_get(srv_rstore *store, const char *id, double now_s, size_t *len,
                        srv_error *e);

/** DELETE /v1/responses/{id}: {"id", "object": "response.deleted", "deleted": true}
 *  (malloc'd) or a 404 in e. */
char *srv_responses_delete(srv_rstore *store, const char *id, double now_s, size_t *len,
                           srv_error *e);

#endif
