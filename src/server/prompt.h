/*
 * prompt.h - from a parsed request to prompt token ids: tokenization of completion prompts
 * and chat templates rendered the way Hugging Face transformers' apply_chat_template does
 * (messages, add_generation_prompt, bos_token, eos_token, tools, documents = None, plus
 * chat_template_kwargs), then tokenized with control-token texts recognised.
 */
#ifndef KILN_SERVER_PROMPT_H
#define KILN_SERVER_PROMPT_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "server/openai.h"

/** The chat template of a model and the tokens around it. */
typedef struct srv_chat {
    kiln_chat_template *tpl;
    bool fallback;     /* ChatML: the model has no template or it does not parse */
    char reason[1200]; /* why the fallback was taken ("" otherwise) */
    int32_t bos_id;    /* -1 = none */
    bool add_bos;      /* the vocabulary prepends BOS to text (tokenize("") == [BOS]) */
    /* Tool calls: the family the template's markup asks for (kiln_tool_format_detect, or the
     * server's --tool-parser), and whether the template reads `tools` itself (else the tools
     * are described in a system message in the Hermes format: srv_tools_messages). */
    kiln_tool_format tool_format;
    bool native_tools;
} srv_chat;

/** Compile the model's template, or ChatML when it has none or it fails to parse
 *  (c->fallback, c->reason); params as kiln_chat_template_create's (NULL = the model's own).
 *  c->tool_format and c->native_tools come from the template's source (ChatML: HERMES, not
 *  native).
 *  Errors: KILN_ERR_OUT_OF_MEMORY, or ChatML itself failing (KILN_ERR_INTERNAL), or those of a
 *  params->source that does not parse. */
kiln_status srv_chat_init(srv_chat *c, const kiln_model *m, const kiln_chat_template_params *params,
                          kiln_error *err);
void srv_chat_free(srv_chat *c);

/**
 * Render the chat request's messages (with their tool calls and tool messages prepared for the
 * template by srv_tools_messages, and g->tools). On failure e is a 400 whose message is the template's
 * own text for raise_exception, else the renderer's message. Free *out with kiln_free.
 */
bool srv_chat_render(const srv_chat *c, const srv_gen *g, char **out, size_t *out_len,
                     srv_error *e);

/** Tokenize text into a malloc'd array (*ids, *n). Errors map to 400 (invalid UTF-8) or 500. */
bool srv_tokenize(const kiln_model *m, const char *text, size_t len, bool add_special,
                  bool parse_special, int32_t **ids, int32_t *n, srv_error *e);

/** A generation's prompt and the spans that continue it, as token ids. */
typedef struct srv_prompt {
    int32_t *ids;      /* malloc'd: the prompt, ending with a chat assistant prefill's ids */
    int32_t n;         /* >= 1 */
    int32_t n_prefill; /* of n, the prefill's (the last ones); 0 without one */
    /* g->req.fill / g->req.prediction as continuations of the prompt's text (malloc'd), or
     * NULL: left as text, for the engine to tokenize (a token-id prompt, an empty span, or a
     * span whose first token merges with the prompt's last) */
    int32_t *fill_ids, n_fill;
    int32_t *pred_ids, n_pred;
} srv_prompt;

/**
 * The prompt of a request: completions' ids as given or its text tokenized (add_special per
 * the request, control texts not parsed); chat's rendered template tokenized with control
 * texts parsed and, unless add_special_tokens, BOS prepended when the vocabulary adds one
 * and the template did not (llama.cpp's server does the same).
 * Continuations of the prompt's text are tokenized together with it (as llama.cpp's server
 * continues a final assistant message), so their ids are those a completion of the joined
 * text sees, and decode to exactly their text after the prompt (tokenized alone, a span of
 * an SPM vocabulary gets a space prefix):
 *   - a chat assistant prefill (g->prefill) ends p->ids: its p->n_prefill ids are those past
 *     the longest common prefix of the rendered text's ids and the joined text's, leaving at
 *     least one id before them (the caller passes them as a hidden asserted fill; they count
 *     as prompt tokens);
 *   - with `spans`, the fill's and the prediction's content (after the prefill, if any): the
 *     ids past the prompt's own when those are a prefix of the joined text's, else NULL.
 * On failure (a 400 for an empty prompt or a template error, 500 out of memory) p is empty.
 * Free with srv_prompt_free.
 */
bool srv_prompt_build(const srv_chat *c, const kiln_model *m, const srv_gen *g, bool spans,
                      srv_prompt *p, srv_error *e);
void srv_prompt_free(srv_prompt *p);

/** srv_prompt_build's p->ids alone (a prefill included), into *ids (malloc'd), *n >= 1. */
bool srv_prompt_ids(const srv_chat *c, const kiln_model *m, const srv_gen *g, int32_t **ids,
                    int32_t *n, srv_error *e);

#endif
