/*
 * tools.h - tool calling on /v1/chat/completions (OpenAI "Function calling"): the `tools`,
 * `tool_choice` and `parallel_tool_calls` fields validated, the conversation's tool messages
 * prepared for the chat template, and the model's reply parsed into `tool_calls` with the
 * library's parser (kiln_tool_parser, kiln.h). Nothing here does I/O.
 */
#ifndef KILN_SERVER_TOOLS_H
#define KILN_SERVER_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "kiln.h"

struct srv_error;

/** tool_choice. */
typedef enum srv_tool_choice {
    SRV_TOOLS_NONE = 0, /* no tools: none given, or tool_choice "none" */
    SRV_TOOLS_AUTO,     /* the model may call a tool (the default with tools) */
    SRV_TOOLS_REQUIRED, /* the reply must be one call or more */
    SRV_TOOLS_NAMED,    /* the reply must be a call of `name` */
} srv_tool_choice;

/** A request's tool settings (pointers borrowed from the request body). */
typedef struct srv_tools {
    const json_t *tools; /* the validated `tools` array; NULL when absent or empty */
    srv_tool_choice choice;
    const char *name;      /* SRV_TOOLS_NAMED: the function */
    const json_t *named;   /* SRV_TOOLS_NAMED: its tools[] entry */
    bool parallel;         /* parallel_tool_calls (default true) */
} srv_tools;

/**
 * Validate `tools` (an array of {"type": "function", "function": {"name": 1-64 of
 * [A-Za-z0-9_-], "description": string, "parameters": object, "strict": bool}}, names
 * unique), `tool_choice` ("none", "auto", "required" or {"type": "function", "function":
 * {"name": one of the tools}}; without tools only "none" and "auto") and
 * `parallel_tool_calls` (bool), as OpenAI's Chat Completions API defines them. On failure a
 * 400 naming the field (e.g. "tools[1].function.name").
 */
bool srv_tools_parse(const json_t *root, srv_tools *t, struct srv_error *e);

/**
 * Validate the tool parts of messages (OpenAI's shapes): an assistant's `tool_calls`
 * ([{"id": string, "type": "function", "function": {"name": string, "arguments": string}}])
 * and a tool message's `tool_call_id` (a string, required). 400 naming the field.
 */
bool srv_tools_check_messages(const json_t *messages, struct srv_error *e);

/**
 * The messages as the chat template should see them (a new array, the caller owns it; NULL
 * on allocation failure):
 *   - each tool call's `arguments` string is parsed into the object it encodes (what the
 *     templates' `tool_call.arguments | tojson` expects, as transformers' callers pass it),
 *     left a string when it is not a JSON object;
 *   - MISTRAL: tool call ids and tool_call_id that are not 9 alphanumerics (what Mistral's
 *     template requires) are mapped to 9 alphanumerics derived from them (the same id, the
 *     same mapping: a hash), as vLLM does for Mistral;
 *   - when the template has no `tools` variable (native false): the tools are described in a
 *     system message in the Hermes format (prepended to the first system message, else a new
 *     one), assistant tool calls become "<tool_call>\n{...}\n</tool_call>" text in the
 *     message's content, and tool messages become user messages holding
 *     "<tool_response>\n...\n</tool_response>" (consecutive ones merged), as Qwen2.5's
 *     template writes them.
 * tools may be NULL (no tools offered: only the message rewriting is done).
 */
json_t *srv_tools_messages(const json_t *messages, const json_t *tools, bool native,
                           kiln_tool_format fmt);

/** The Hermes-format system text describing tools (malloc'd; NULL on allocation failure). */
char *srv_tools_system_text(const json_t *tools);

#endif
