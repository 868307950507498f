/*
 * openai.h - the OpenAI API surface of `kiln serve`: request bodies of /v1/completions and
 * /v1/chat/completions parsed and validated into a kiln_request, and the response bodies
 * (whole responses, SSE chunks, errors) built from engine events.
 *
 * Semantics follow the OpenAI API reference ("Completions", "Chat Completions", "Streaming",
 * "Error codes", "Predicted Outputs"), with vLLM's extensions of the same endpoints (top_k,
 * min_p, repetition_penalty, ignore_eos, stop_token_ids, add_special_tokens,
 * add_generation_prompt, chat_template_kwargs) and kiln's own (speculation, fill; a chat
 * whose last message is the assistant's is continued from it, as Anthropic's Messages API
 * and llama.cpp's server do). Unknown fields are ignored. Nothing here does I/O.
 */
#ifndef KILN_SERVER_OPENAI_H
#define KILN_SERVER_OPENAI_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"
#include "server/srv_util.h"
#include "server/tools.h"

/** An error in OpenAI's shape {"error": {"message", "type", "param", "code"}}. */
typedef struct srv_error {
    int http_status;  /* 400, 401, 404, 405, 413, 500, 503 */
    const char *type; /* "invalid_request_error", "server_error", ... (static) */
    const char *code; /* NULL = JSON null (static) */
    char param[64];   /* "" = JSON null */
    char message[1100];
} srv_error;

/** Fill e and return false (for `return srv_fail(e, ...)`). param may be NULL. */
bool srv_fail(srv_error *e, int http_status, const char *type, const char *code, const char *param,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/** The JSON body of an error (malloc'd, NUL-terminated). NULL on allocation failure. */
char *srv_error_json(const srv_error *e, size_t *len);

typedef enum srv_kind {
    SRV_COMPLETION = 0, /* /v1/completions */
    SRV_CHAT = 1,       /* /v1/chat/completions */
} srv_kind;

/** A parsed generation request. Pointers into `root` stay valid until srv_gen_free. */
typedef struct srv_gen {
    srv_kind kind;
    json_t *root; /* the request body */

    /* Completions: a text prompt (borrowed from root) or token ids (owned). */
    const char *prompt_text;
    size_t prompt_len;
    int32_t *prompt_ids;
    int32_t n_prompt_ids;
    /* A batch (an array of strings or of token arrays, borrowed from root): n_prompts > 1 of
     * them, each validated; prompt_text / prompt_ids hold the one srv_gen_use_prompt chose
     * (the first after parsing). NULL with n_prompts 1 otherwise. */
    const json_t *prompt_batch;
    int32_t n_prompts;
    int32_t n;  /* choices per prompt (OpenAI `n`), [1, KILN_MAX_CHOICES] */
    bool echo;  /* completions: the text begins with the prompt's */
    bool add_special; /* add BOS/EOS to a text prompt (completions default true, chat false) */

    /* Chat: messages normalised for the template (owned): content parts joined, the
     * "developer" role renamed "system". tools/kwargs borrowed from root (NULL = absent). */
    json_t *messages;
    json_t *tools; /* the tools shown to the template: tc.tools, NULL with tool_choice "none" */
    json_t *template_kwargs;
    bool add_generation_prompt;
    srv_tools tc; /* tools, tool_choice, parallel_tool_calls (tools.h) */
    /* Chat assistant prefill: the last message was the assistant's (string or text parts, no
     * tool_calls) and add_generation_prompt was not set false: it is removed from messages
     * (which are then rendered with add_generation_prompt true) and its content, this string
     * (owned reference), continues the prompt as a hidden asserted fill (srv_prompt_ids). */
    json_t *prefill;

    /* Generation settings; prompt fields are filled by the caller before submitting. */
    kiln_request req;
    bool max_tokens_set; /* max_tokens / max_completion_tokens given */
    const char *stop[KILN_MAX_STOP_STRINGS];
    int32_t stop_ids[64];
    int32_t *bias_ids;
    float *bias_values;
    /* Speculation and fill (kiln_request's spec, spec_k, spec_accept, prediction, fill):
     * req.prediction points into root or into prediction_buf (text parts concatenated),
     * req.fill into root. */
    bool has_prediction, has_fill;
    srv_buf prediction_buf;

    /* Output options. */
    bool stream;
    bool include_usage;
    bool logprobs;        /* report token logprobs */
    int32_t top_logprobs; /* alternatives per token, 0..20 */

    /* Structured output (structured.h): the compiled grammar (one reference, released by
     * srv_gen_free), also in req.grammar; NULL when none. */
    kiln_grammar *grammar;
} srv_gen;

/**
 * Parse and validate a request body. n_vocab bounds token ids (prompt arrays, logit_bias,
 * stop_token_ids); gen (may be NULL) gives the model's sampling defaults, applied to fields
 * the request omits (generation_config.json semantics: do_sample false = greedy).
 * A request without `seed` gets a random one. Speculation and fill: `prediction` (OpenAI),
 * `speculation` and `fill` (kiln) as kiln_request's fields; a 400 names the field for a
 * wrong type or an unknown value (prediction.type, prediction.content[i], fill.content,
 * fill.policy, speculation.source, speculation.k outside [1, 32], speculation.accept), for
 * a verify-policy fill together with a prediction, and for a fill together with a chat
 * assistant prefill (srv_gen.prefill). On failure fills e (400; param names the field) and
 * leaves g empty. g must be freed with srv_gen_free either way.
 */
bool srv_gen_parse(srv_kind kind, const char *body, size_t len, int32_t n_vocab,
                   const kiln_generation_defaults *gen, srv_gen *g, srv_error *e);

void srv_gen_free(srv_gen *g);

/** The most prompts one completions request may batch. */
#define SRV_MAX_PROMPTS 16

/** Make prompt i of a batch (0 <= i < g->n_prompts) the request's prompt (prompt_text or
 *  prompt_ids). False (e filled, 400) when it does not parse, which parsing already ruled
 *  out, or on allocation failure. */
bool srv_gen_use_prompt(srv_gen *g, int32_t i, int32_t n_vocab, srv_error *e);

/**
 * The checks of a parsed request that depend on the engine: speculation.source "draft" needs
 * an engine with a draft model (has_draft: kiln_engine_params.draft_model of the engine). On
 * failure fills e (400 naming the field).
 */
bool srv_gen_check_engine(const srv_gen *g, bool has_draft, srv_error *e);

/** One token with its logprobs, as the engine reported it (a generated token, or with echo a
 *  prompt token: KILN_EVENT_PROMPT_LOGPROB). */
typedef struct srv_tok {
    int32_t token;
    bool none; /* the prompt's first token: no logprob (token_logprobs and top_logprobs null) */
    bool has_offset; /* echo: a prompt token's text_offset is `offset` (its place in the
                        prompt's text), not the running one */
    int64_t offset;
    float logprob;
    int32_t n_top;
    kiln_token_logprob top[KILN_MAX_TOP_LOGPROBS];
} srv_tok;

/** What every response of one request shares. */
typedef struct srv_resp_info {
    srv_kind kind;
    const char *id;      /* "cmpl-..." / "chatcmpl-..." */
    int64_t created;     /* Unix seconds */
    const char *model;   /* served model name */
    const kiln_model *m; /* token pieces */
    bool logprobs;
    int32_t top_logprobs;
    bool include_usage;
    /* Tool calls (chat): whole responses put `tool_calls` (an array of OpenAI's
     * {id, type, function: {name, arguments}}, borrowed) in the message, with content null
     * when it is empty; streams count the calls they sent in n_tool_calls. Either makes a
     * finish "stop" read "tool_calls". */
    const json_t *tool_calls;
    int32_t n_tool_calls;
    int32_t index;  /* the choice's index (choices[i].index): prompt * n + choice */
    bool token_ids; /* kiln's choices[i].token_ids (the generated ids) are sent: the model has
                       no tokenizer, so the text is always "" */
} srv_resp_info;

/** One choice of a whole response. */
typedef struct srv_choice_out {
    const srv_resp_info *ri; /* the choice's: index, tool calls */
    const char *text;
    size_t text_len;
    const srv_tok *toks; /* logprobs of the generated tokens */
    int32_t n_toks;
    kiln_finish_reason finish;
    const int32_t *ids; /* token_ids when ri->token_ids */
    int32_t n_ids;
    int64_t text_offset; /* completions: the first token's text_offset (the prompt's length in
                            code points, as OpenAI counts it) */
} srv_choice_out;

/** A whole response with n choices (srv_response_json's shape, "choices" holding each in
 *  order; usage as given: the caller sums completion tokens over choices and counts each
 *  prompt once). Malloc'd JSON; NULL on allocation failure. */
char *srv_response_json_n(const srv_resp_info *ri, const srv_choice_out *choices, int32_t n,
                          const kiln_usage *usage, size_t *len);

/** A chunk carrying kiln's token_ids for a model without a tokenizer: text "" and the ids. */
bool srv_sse_ids(const srv_resp_info *ri, const int32_t *ids, int32_t n, srv_buf *out);

/** OpenAI's finish_reason for an engine finish: "stop", "length", or "abort" for a request
 *  the server cancelled (shutdown). */
const char *srv_finish_reason(kiln_finish_reason r);

/**
 * A whole (non-streamed) response: text_completion or chat.completion with one choice,
 * logprobs (when asked) for toks[0..n_toks) and usage {prompt_tokens, completion_tokens,
 * total_tokens, prompt_tokens_details: {cached_tokens}, completion_tokens_details:
 * {accepted_prediction_tokens, rejected_prediction_tokens}} (OpenAI's shape; cached_tokens is
 * usage->cached_tokens, the prompt tokens whose KV came from the prefix cache, counted in
 * prompt_tokens too; the prediction counts are kiln_usage's, by OpenAI's definition) plus
 * kiln's "speculation": {drafted_tokens, accepted_tokens, verify_steps, fill_tokens}
 * (kiln_usage's spec_drafted, spec_accepted, spec_verify_steps, fill_tokens). Returns a
 * malloc'd JSON string, NULL on allocation failure.
 */
char *srv_response_json(const srv_resp_info *ri, const char *text, size_t text_len,
                        const srv_tok *toks, int32_t n_toks, kiln_finish_reason finish,
                        const kiln_usage *usage, size_t *len);

/**
 * Append one SSE event "data: {...}\n\n" to out:
 *   srv_sse_role:   chat only: delta {"role":"assistant","content":""}, the first chunk;
 *   srv_sse_text:   a text delta with the logprobs of toks[0..n_toks) (text may be empty
 *                   when only logprobs are sent); *text_offset (completions' text_offset, in
 *                   code points since the start of the completion) advances;
 *   srv_sse_finish: the last choice chunk: empty delta/text and finish_reason, carrying the
 *                   logprobs of tokens whose text was never sent (held back, then dropped);
 *   srv_sse_usage:  when include_usage: "choices": [] and usage, in srv_response_json's
 *                   shape (prompt_tokens_details, completion_tokens_details and speculation
 *                   included);
 *   srv_sse_done:   "data: [DONE]\n\n".
 * With include_usage every choice chunk carries "usage": null, as OpenAI sends it.
 * Return false on allocation failure.
 */
bool srv_sse_role(const srv_resp_info *ri, srv_buf *out);
bool srv_sse_text(const srv_resp_info *ri, const char *text, size_t len, const srv_tok *toks,
                  int32_t n_toks, int64_t *text_offset, srv_buf *out);
bool srv_sse_finish(const srv_resp_info *ri, kiln_finish_reason finish, const srv_tok *toks,
                    int32_t n_toks, int64_t *text_offset, srv_buf *out);
bool srv_sse_usage(const srv_resp_info *ri, const kiln_usage *usage, srv_buf *out);
/** A tool-call delta (chat), OpenAI's streaming shape: delta {"tool_calls": [{"index", "id",
 *  "type": "function", "function": {"name", "arguments": ""}}]} when id is non-NULL (the
 *  call's first chunk), else {"tool_calls": [{"index", "function": {"arguments": args}}]}. */
bool srv_sse_tool_call(const srv_resp_info *ri, int32_t index, const char *id, const char *name,
                       const char *args, size_t args_len, srv_buf *out);
bool srv_sse_done(srv_buf *out);
/** An error inside an already started stream: data: {"error": {...}}. */
bool srv_sse_error(const srv_error *e, srv_buf *out);

/**
 * Logprobs in OpenAI's shape for toks[0..n): completions
 * {"tokens", "token_logprobs", "top_logprobs": [{piece: logprob}], "text_offset"} (offsets
 * start at *text_offset, which advances by each token's code points); chat
 * {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token","logprob","bytes"}]}]}.
 * A token's string is its piece with invalid UTF-8 replaced by U+FFFD; "bytes" holds the
 * piece's real bytes. New reference; NULL on allocation failure.
 */
json_t *srv_logprobs_json(const srv_resp_info *ri, const srv_tok *toks, int32_t n,
                          int64_t *text_offset);

/** json_dumps with the server's settings (compact, 9 significant digits for reals). */
char *srv_json_dump(const json_t *j, size_t *len);

#endif
