/*
 * structured.h - the request fields of structured output (README.md "Structured output"):
 * OpenAI's `response_format` ({"type": "text" | "json_object" | "json_schema", "json_schema":
 * {"name", "schema", "strict"}}), llama.cpp's `grammar` (GBNF) and vLLM's `guided_json`,
 * `guided_regex`, `guided_choice` and `guided_grammar`, compiled to a kiln_grammar.
 */
#ifndef KILN_SERVER_STRUCTURED_H
#define KILN_SERVER_STRUCTURED_H

#include <stdbool.h>

#include <jansson.h>

#include "kiln.h"

struct srv_error;

/**
 * Read the structured-output fields of a request body. At most one may constrain the output
 * (response_format "text" constrains nothing). On success *out is the compiled grammar (one
 * reference; NULL when none is asked for). Errors (false, e filled: 400 with param the field):
 * a field of the wrong type or an unknown response_format type; two constraining fields; the
 * grammar compiler's message for an invalid schema, GBNF grammar or regex.
 */
bool srv_structured_parse(const json_t *root, kiln_grammar **out, struct srv_error *e);

#endif
