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
} srv_chat;

/** Compile the model's template, or ChatML when it has none or it fails to parse
 *  (c->fallback, c->reason); params as kiln_chat_template_create's (NULL = the model's own).
 *  Errors: KILN_ERR_OUT_OF_MEMORY, or ChatML itself failing (KILN_ERR_INTERNAL), or those of a
 *  params->source that does not parse. */
kiln_status srv_chat_init(srv_chat *c, const kiln_model *m, const kiln_chat_template_params *params,
                          kiln_error *err);
void srv_chat_free(srv_chat *c);

/**
 * Render the chat request's messages. On failure e is a 400 whose message is the template's
 * own text for raise_exception, else the renderer's message. Free *out with kiln_free.
 */
bool srv_chat_render(const srv_chat *c, const srv_gen *g, char **out, size_t *out_len,
                     srv_error *e);

/** Tokenize text into a malloc'd array (*ids, *n). Errors map to 400 (invalid UTF-8) or 500. */
bool srv_tokenize(const kiln_model *m, const char *text, size_t len, bool add_special,
                  bool parse_special, int32_t **ids, int32_t *n, srv_error *e);

/**
 * The prompt ids of a request: completions' ids as given or its text tokenized
 * (add_special per the request, control texts not parsed); chat's rendered template
 * tokenized with control texts parsed and, unless add_special_tokens, BOS prepended when
 * the vocabulary adds one and the template did not (llama.cpp's server does the same).
 * A continuation of the prompt's text is tokenized together with it, so its ids are those
 * a completion over the joined text sees (as llama.cpp's server continues a final
 * assistant message), and *n_fill (may be NULL; 0 without one) says how many of the last
 * ids are the continuation's:
 *   - a chat assistant prefill (g->prefill): the ids past the longest common prefix with the
 *     rendered text's own ids, at most *n - 1 (the caller passes them as a hidden asserted
 *     fill; they count as prompt tokens);
 *   - with n_fill non-NULL, a visible asserted fill of a text prompt (g->req.fill, policy
 *     assert): its ids when the prompt's own ids are a prefix of the joined text's (so they
 *     decode to exactly the fill after the prompt), else 0 (the fill then stays text, for
 *     the engine to tokenize); the caller passes them as fill_ids.
 * *ids is malloc'd; *n >= 1 on success (an empty prompt is a 400).
 */
bool srv_prompt_ids(const srv_chat *c, const kiln_model *m, const srv_gen *g, int32_t **ids,
                    int32_t *n, int32_t *n_fill, srv_error *e);

#endif
