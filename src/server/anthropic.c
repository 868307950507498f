/* anthropic.c - Anthropic Messages requests to chat requests, and message responses and
 * streams from engine events (see anthropic.h). */
#include "server/anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_util.h"

/* ------------------------------------------------------------------------------------ */
/* Errors.                                                                               */

const char *srv_anthropic_error_type(int http_status) {
    switch (http_status) {
    case 400:
    case 405:
    case 422:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return "overloaded_error";
    case 408:
    case 504:
        return "timeout_error";
    default:
        return "api_error";
    }
}

static json_t *error_object(const char *type, const char *message) {
    return json_pack("{s:s, s:{s:s, s:o?}}", "type", "error", "error", "type", type, "message",
                     srv_json_text(message, strlen(message)));
}

char *srv_anthropic_error_json(const srv_error *e, size_t *len) {
    json_t *o = error_object(srv_anthropic_error_type(e->http_status), e->message);
    if (!o) return NULL;
    char *s = srv_json_dump(o, len);
    json_decref(o);
    return s;
}

/* ------------------------------------------------------------------------------------ */
/* The request.                                                                          */

/* Text of a string or of an array of text blocks (joined with "\n"); other block types are
 * a 400 naming param[k]. *out is a new string. */
static bool text_of(const json_t *c, const char *param, json_t **out, srv_error *e) {
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return true;
    }
    if (!json_is_array(c))
        return srv_bad(e, param, "%s must be a string or an array of text blocks (got %s)", param,
                       srv_json_type_name(c));
    srv_buf b = {0};
    srv_buf_add(&b, "", 0);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *blk = json_array_get(c, k);
        json_t *type = json_is_object(blk) ? json_object_get(blk, "type") : NULL;
        json_t *text = json_is_object(blk) ? json_object_get(blk, "text") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text)) {
            srv_buf_free(&b);
            return srv_bad(e, param, "%s[%zu] must be a text block {\"type\": \"text\", \"text\": ...}",
                           param, k);
        }
        if (k > 0) srv_buf_add(&b, "\n", 1);
        srv_buf_add(&b, json_string_value(text), json_string_length(text));
    }
    *out = b.oom ? NULL : json_stringn(b.p, b.len);
    srv_buf_free(&b);
    return *out ? true : srv_oom(e, "system");
}

static bool is_media_block(const char *t) {
    static const char *const media[] = {"image", "document", "search_result", "container_upload"};
    for (size_t i = 0; i < sizeof media / sizeof media[0]; i++)
        if (!strcmp(t, media[i])) return true;
    return false;
}

/* One message of "messages" appended to the chat messages (one or more chat messages). */
static bool add_message(json_t *msgs, const json_t *m, size_t i, srv_error *e) {
    char param[96];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(m))
        return srv_bad(e, param, "%s must be an object (got %s)", param, srv_json_type_name(m));
    json_t *role = json_object_get(m, "role");
    snprintf(param, sizeof param, "messages[%zu].role", i);
    if (!json_is_string(role))
        return srv_bad(e, param, "%s must be \"user\" or \"assistant\" (got %s)", param,
                       srv_json_type_name(role));
    const char *r = json_string_value(role);
    bool user = !strcmp(r, "user");
    if (!user && strcmp(r, "assistant") != 0)
        return srv_bad(e, param,
                       "%s must be \"user\" or \"assistant\" (got \"%.32s\"; a system prompt goes "
                       "in the top-level \"system\" field)",
                       param, r);
    json_t *c = json_object_get(m, "content");
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(c))
        return json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", r, "content", c)) == 0
                   ? true
                   : srv_oom(e, "messages");
    if (!json_is_array(c))
        return srv_bad(e, param, "%s must be a string or an array of content blocks (got %s)",
                       param, srv_json_type_name(c));
    srv_buf text = {0};
    srv_buf_add(&text, "", 0);
    bool has_text = false;
    json_t *calls = json_array();
    json_t *tools = json_array(); /* tool messages from tool_result blocks */
    bool ok = calls && tools;
    for (size_t k = 0; ok && k < json_array_size(c); k++) {
        json_t *blk = json_array_get(c, k);
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
        json_t *type = json_is_object(blk) ? json_object_get(blk, "type") : NULL;
        if (!json_is_string(type)) {
            ok = srv_bad(e, param, "%s must be a content block with a string \"type\"", param);
            break;
        }
        const char *t = json_string_value(type);
        if (!strcmp(t, "text")) {
            json_t *tx = json_object_get(blk, "text");
            if (!json_is_string(tx)) {
                ok = srv_bad(e, param, "%s.text must be a string (got %s)", param,
                             srv_json_type_name(tx));
                break;
            }
            if (has_text) srv_buf_add(&text, "\n", 1);
            srv_buf_add(&text, json_string_value(tx), json_string_length(tx));
            has_text = true;
        } else if (!strcmp(t, "tool_use")) {
            json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            json_t *input = json_object_get(blk, "input");
            if (user) {
                ok = srv_bad(e, param, "%s: tool_use blocks belong in assistant messages", param);
                break;
            }
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                ok = srv_bad(e, param,
                             "%s must be {\"type\": \"tool_use\", \"id\": string, \"name\": string, "
                             "\"input\": object}",
                             param);
                break;
            }
            char *args = json_dumps(input, JSON_COMPACT | JSON_REAL_PRECISION(17));
            json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type",
                                            "function", "function", "name", name, "arguments", args)
                                : NULL;
            free(args);
            ok = call && json_array_append_new(calls, call) == 0;
            if (!ok) srv_oom(e, "tool_use");
        } else if (!strcmp(t, "tool_result")) {
            json_t *id = json_object_get(blk, "tool_use_id");
            json_t *rc = json_object_get(blk, "content");
            if (!user) {
                ok = srv_bad(e, param, "%s: tool_result blocks belong in user messages", param);
                break;
            }
            if (!json_is_string(id)) {
                ok = srv_bad(e, param, "%s.tool_use_id must be a string", param);
                break;
            }
            json_t *content = NULL;
            char cparam[112];
            snprintf(cparam, sizeof cparam, "%s.content", param);
            if (!rc || json_is_null(rc))
                content = json_string("");
            else if (!text_of(rc, cparam, &content, e)) {
                ok = false;
                break;
            }
            json_t *tm = content ? json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id,
                                             "content", content)
                                 : NULL;
            ok = tm && json_array_append_new(tools, tm) == 0;
            if (!ok) srv_oom(e, "tool_result");
        } else if (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) {
            /* a reasoning model's earlier thoughts: nothing a template renders */
        } else if (is_media_block(t)) {
            ok = srv_bad(e, param,
                         "%s: content blocks of type \"%.32s\" are not supported (kiln serves "
                         "text-only models; send text blocks)",
                         param, t);
        } else {
            ok = srv_bad(e, param,
                         "%s: content block type \"%.32s\" is not supported (text, tool_use, "
                         "tool_result)",
                         param, t);
        }
    }
    if (ok && text.oom) ok = srv_oom(e, "messages");
    if (ok) {
        for (size_t k = 0; ok && k < json_array_size(tools); k++)
            ok = json_array_append(msgs, json_array_get(tools, k)) == 0;
        if (ok && (has_text || json_array_size(calls) > 0 || json_array_size(tools) == 0)) {
            json_t *msg = json_pack("{s:s}", "role", r);
            if (msg) {
                if (json_array_size(calls) > 0) {
                    /* "" rather than null without text: templates that concatenate
                     * content accept it */
                    json_object_set_new(msg, "content", json_stringn(text.p, text.len));
                    json_object_set(msg, "tool_calls", calls);
                } else {
                    json_object_set_new(msg, "content", json_stringn(text.p, text.len));
                }
            }
            ok = msg && json_array_append_new(msgs, msg) == 0;
        }
        if (!ok) srv_oom(e, "messages");
    }
    srv_buf_free(&text);
    json_decref(calls);
    json_decref(tools);
    return ok;
}

static bool translate_tools(const json_t *root, json_t *chat, srv_error *e) {
    json_t *tools = srv_json_field(root, "tools");
    if (tools) {
        if (!json_is_array(tools))
            return srv_bad(e, "tools", "tools must be an array (got %s)", srv_json_type_name(tools));
        json_t *out = json_array();
        if (!out) return srv_oom(e, "tools");
        json_object_set_new(chat, "tools", out);
        for (size_t i = 0; i < json_array_size(tools); i++) {
            json_t *t = json_array_get(tools, i);
            char param[48];
            snprintf(param, sizeof param, "tools[%zu]", i);
            if (!json_is_object(t))
                return srv_bad(e, param, "%s must be an object (got %s)", param,
                               srv_json_type_name(t));
            json_t *type = srv_json_field(t, "type");
            if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "custom")))
                return srv_bad(e, param,
                               "%s: tool type %s is not supported (only client tools with a name "
                               "and an input_schema; no server tools)",
                               param, json_is_string(type) ? json_string_value(type) : "(not a string)");
            json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
            json_t *desc = srv_json_field(t, "description");
            if (!json_is_string(name) || json_string_length(name) == 0)
                return srv_bad(e, param, "%s.name must be a non-empty string", param);
            if (!json_is_object(schema))
                return srv_bad(e, param, "%s.input_schema must be an object (a JSON Schema)",
                               param);
            if (desc && !json_is_string(desc))
                return srv_bad(e, param, "%s.description must be a string", param);
            json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
            if (fn && desc) json_object_set(fn, "description", desc);
            if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function",
                                                            "function", fn)) != 0)
                return srv_oom(e, "tools");
        }
    }
    json_t *tc = srv_json_field(root, "tool_choice");
    if (!tc) return true;
    json_t *type = json_is_object(tc) ? json_object_get(tc, "type") : NULL;
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    json_t *v = NULL;
    if (!strcmp(t, "auto"))
        v = json_string("auto");
    else if (!strcmp(t, "any"))
        v = json_string("required");
    else if (!strcmp(t, "none"))
        v = json_string("none");
    else if (!strcmp(t, "tool")) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name))
            return srv_bad(e, "tool_choice.name",
                           "tool_choice.name must be a string when tool_choice.type is \"tool\"");
        v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        return srv_bad(e, "tool_choice",
                       "tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    }
    if (!v) return srv_oom(e, "tool_choice");
    json_object_set_new(chat, "tool_choice", v);
    json_t *dp = srv_json_field(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp))
        return srv_bad(e, "tool_choice.disable_parallel_tool_use",
                       "tool_choice.disable_parallel_tool_use must be a boolean");
    if (json_is_true(dp)) json_object_set_new(chat, "parallel_tool_calls", json_false());
    return true;
}

/* A number field in [lo, hi] copied to chat (absent: nothing). */
static bool copy_number(const json_t *root, const char *key, double lo, double hi, json_t *chat,
                        srv_error *e) {
    json_t *v = srv_json_field(root, key);
    if (!v) return true;
    if (!json_is_number(v))
        return srv_bad(e, key, "%s must be a number (got %s)", key, srv_json_type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return srv_bad(e, key, "%s must be in [%g, %g] (got %g)", key, lo, hi, x);
    json_object_set(chat, key, v);
    return true;
}

typedef struct anth_out anth_out;
static srv_api_out *anth_out_create(const json_t *stops);

bool srv_anthropic_translate(const json_t *root, json_t **chat_out, srv_api_out **out,
                             srv_error *e) {
    *chat_out = NULL;
    *out = NULL;
    if (!json_is_object(root))
        return srv_bad(e, NULL, "the request body must be a JSON object (got %s)",
                       srv_json_type_name(root));
    json_t *model = srv_json_field(root, "model");
    if (!model) return srv_bad(e, "model", "model: Field required");
    if (!json_is_string(model))
        return srv_bad(e, "model", "model must be a string (got %s)", srv_json_type_name(model));
    json_t *mt = srv_json_field(root, "max_tokens");
    if (!mt) return srv_bad(e, "max_tokens", "max_tokens: Field required");
    if (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > INT32_MAX)
        return srv_bad(e, "max_tokens", "max_tokens must be an integer >= 1 (got %s)",
                       json_is_integer(mt) ? "a smaller one" : srv_json_type_name(mt));
    json_t *ms = srv_json_field(root, "messages");
    if (!ms) return srv_bad(e, "messages", "messages: Field required");
    if (!json_is_array(ms))
        return srv_bad(e, "messages", "messages must be an array (got %s)", srv_json_type_name(ms));
    if (json_array_size(ms) == 0)
        return srv_bad(e, "messages", "messages: at least one message is required");
    json_t *th = srv_json_field(root, "thinking");
    if (th) {
        json_t *tt = json_is_object(th) ? json_object_get(th, "type") : NULL;
        if (!json_is_string(tt) || strcmp(json_string_value(tt), "disabled") != 0)
            return srv_bad(e, "thinking",
                           "thinking: extended thinking is not supported (omit the field or send "
                           "{\"type\": \"disabled\"})");
    }
    json_t *md = srv_json_field(root, "metadata");
    if (md && !json_is_object(md))
        return srv_bad(e, "metadata", "metadata must be an object (got %s)", srv_json_type_name(md));

    json_t *chat = json_object();
    json_t *msgs = json_array();
    if (!chat || !msgs) {
        json_decref(chat);
        json_decref(msgs);
        return srv_oom(e, "request");
    }
    json_object_set_new(chat, "messages", msgs);
    json_object_set(chat, "model", model);
    json_object_set(chat, "max_tokens", mt);
    bool ok = true;
    json_t *sys = srv_json_field(root, "system");
    if (sys) {
        json_t *st = NULL;
        ok = text_of(sys, "system", &st, e);
        if (ok) ok = json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content",
                                                           st)) == 0 || srv_oom(e, "system");
    }
    for (size_t i = 0; ok && i < json_array_size(ms); i++)
        ok = add_message(msgs, json_array_get(ms, i), i, e);

    json_t *stops = srv_json_field(root, "stop_sequences");
    if (ok && stops) {
        if (!json_is_array(stops))
            ok = srv_bad(e, "stop_sequences", "stop_sequences must be an array of strings (got %s)",
                         srv_json_type_name(stops));
        else if (json_array_size(stops) > KILN_MAX_STOP_STRINGS)
            ok = srv_bad(e, "stop_sequences", "stop_sequences may hold at most %d strings (got %zu)",
                         KILN_MAX_STOP_STRINGS, json_array_size(stops));
        for (size_t i = 0; ok && i < json_array_size(stops); i++) {
            json_t *s = json_array_get(stops, i);
            if (!json_is_string(s) || json_string_length(s) == 0 ||
                memchr(json_string_value(s), 0, json_string_length(s)))
                ok = srv_bad(e, "stop_sequences",
                             "stop_sequences[%zu] must be a non-empty string without NUL", i);
        }
        if (ok) json_object_set(chat, "stop", stops);
    }
    if (ok) ok = copy_number(root, "temperature", 0, 1, chat, e);
    if (ok) ok = copy_number(root, "top_p", 0, 1, chat, e);
    json_t *tk = srv_json_field(root, "top_k");
    if (ok && tk) {
        if (!json_is_integer(tk) || json_integer_value(tk) < 0)
            ok = srv_bad(e, "top_k", "top_k must be an integer >= 0 (got %s)",
                         json_is_integer(tk) ? "a negative one" : srv_json_type_name(tk));
        else
            json_object_set(chat, "top_k", tk);
    }
    json_t *stream = srv_json_field(root, "stream");
    if (ok && stream) {
        if (!json_is_boolean(stream))
            ok = srv_bad(e, "stream", "stream must be a boolean (got %s)",
                         srv_json_type_name(stream));
        else
            json_object_set(chat, "stream", stream);
    }
    if (ok) ok = translate_tools(root, chat, e);
    /* kiln's own extensions of the chat route, passed through as they are */
    static const char *const passthrough[] = {"seed",        "min_p", "repetition_penalty",
                                              "speculation", "fill",  "chat_template_kwargs"};
    for (size_t i = 0; ok && i < sizeof passthrough / sizeof passthrough[0]; i++) {
        json_t *v = json_object_get(root, passthrough[i]);
        if (v) json_object_set(chat, passthrough[i], v);
    }
    if (ok && !(*out = anth_out_create(stops))) ok = srv_oom(e, "response");
    if (!ok) {
        json_decref(chat);
        return false;
    }
    *chat_out = chat;
    return true;
}

/* ------------------------------------------------------------------------------------ */
/* The response.                                                                         */

struct anth_out {
    srv_api_out base;
    char *stops[KILN_MAX_STOP_STRINGS];
    int n_stops;
    int32_t *ids; /* generated tokens (for the stop sequence that matched) */
    int32_t n_ids, cap_ids;
    srv_buf text; /* streamed text so far */
    bool block_open, block_is_tool;
    int n_blocks; /* blocks closed so far (the open one's index) */
    int n_calls;  /* tool_use blocks streamed */
};

static void anth_token(srv_api_out *o, int32_t id) {
    anth_out *a = (anth_out *)o;
    if (a->n_stops == 0) return; /* only needed to name a matched stop sequence */
    if (a->n_ids == a->cap_ids) {
        int32_t cap = a->cap_ids ? a->cap_ids * 2 : 64;
        int32_t *p = realloc(a->ids, (size_t)cap * sizeof *p);
        if (!p) return;
        a->ids = p;
        a->cap_ids = cap;
    }
    a->ids[a->n_ids++] = id;
}

/* The stop sequence that ended the generation, or NULL (an end-of-turn token). The engine
 * counts a stopping EOS (or stop id) in completion_tokens without a TOKEN event; a stop
 * string ends on a delivered token whose text completes it. The match is the stop string
 * whose first occurrence in the delivered tokens' text ends first (the engine matches left to
 * right and stops at the first completion). */
static const char *matched_stop(anth_out *a, const kiln_usage *u) {
    if (a->n_stops == 0 || a->n_ids == 0 || u->completion_tokens > a->n_ids || !a->base.m)
        return NULL;
    size_t len = 0;
    kiln_error err = {0};
    if (kiln_model_detokenize(a->base.m, a->ids, a->n_ids, NULL, 0, &len, &err) != KILN_OK)
        return NULL;
    char *full = malloc(len + 1);
    if (!full) return NULL;
    const char *best = NULL;
    size_t best_end = (size_t)-1;
    if (kiln_model_detokenize(a->base.m, a->ids, a->n_ids, full, len, &len, &err) == KILN_OK) {
        full[len] = '\0';
        for (int i = 0; i < a->n_stops; i++) {
            const char *p = strstr(full, a->stops[i]);
            if (!p) continue;
            size_t end = (size_t)(p - full) + strlen(a->stops[i]);
            if (end < best_end) {
                best_end = end;
                best = a->stops[i];
            }
        }
    }
    free(full);
    return best;
}

/* stop_reason and stop_sequence of a finished generation (n_calls tool calls in the reply). */
static const char *stop_reason(anth_out *a, const srv_api_end *end, int n_calls,
                               const char **stop_seq) {
    *stop_seq = NULL;
    if (end->finish == KILN_FINISH_LENGTH) return "max_tokens";
    if (n_calls > 0) return "tool_use";
    *stop_seq = matched_stop(a, end->usage);
    return *stop_seq ? "stop_sequence" : "end_turn";
}

static json_t *usage_json(const anth_out *a, const kiln_usage *u) {
    int32_t cached = u ? (u->cached_tokens > 0 ? u->cached_tokens : 0) : 0;
    int32_t prompt = u ? u->prompt_tokens : a->base.n_prompt;
    /* the engine may count an asserted fill's cached blocks too: never more than the prompt */
    if (cached > prompt) cached = prompt;
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", prompt - cached,
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens", cached,
                     "output_tokens", u ? u->completion_tokens : 0);
}

static json_t *message_object(const anth_out *a, json_t *content, const char *stop,
                              const char *stop_seq, json_t *usage) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o?, s:s?, s:s?, s:o?}", "id", a->base.id, "type",
                     "message", "role", "assistant", "model", a->base.model ? a->base.model : "",
                     "content", content, "stop_reason", stop, "stop_sequence", stop_seq, "usage",
                     usage);
}

static bool anth_start(srv_api_out *o, srv_buf *out) {
    anth_out *a = (anth_out *)o;
    json_t *msg = message_object(a, json_array(), NULL, NULL, usage_json(a, NULL));
    if (msg) {
        json_object_set_new(msg, "stop_reason", json_null());
        json_object_set_new(msg, "stop_sequence", json_null());
    }
    return srv_sse_event("message_start", json_pack("{s:s, s:o?}", "type", "message_start",
                                                    "message", msg),
                         out) &&
           srv_sse_event("ping", json_pack("{s:s}", "type", "ping"), out);
}

static bool close_block(anth_out *a, srv_buf *out) {
    if (!a->block_open) return true;
    a->block_open = false;
    return srv_sse_event("content_block_stop",
                         json_pack("{s:s, s:i}", "type", "content_block_stop", "index",
                                   a->n_blocks++),
                         out);
}

static bool open_block(anth_out *a, srv_buf *out) {
    if (a->block_open && !a->block_is_tool) return true;
    if (!close_block(a, out)) return false;
    a->block_open = true;
    a->block_is_tool = false;
    return srv_sse_event("content_block_start",
                         json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start",
                                   "index", a->n_blocks, "content_block", "type", "text", "text",
                                   ""),
                         out);
}

static bool anth_text(srv_api_out *o, const char *text, size_t len, srv_buf *out) {
    anth_out *a = (anth_out *)o;
    if (len == 0) return true;
    srv_buf_add(&a->text, text, len);
    return open_block(a, out) &&
           srv_sse_event("content_block_delta",
                         json_pack("{s:s, s:i, s:{s:s, s:o?}}", "type", "content_block_delta",
                                   "index", a->n_blocks, "delta", "type", "text_delta", "text",
                                   srv_json_text(text, len)),
                         out);
}

static bool anth_tool_call(srv_api_out *o, int32_t index, const char *id, const char *name,
                           size_t name_len, srv_buf *out) {
    anth_out *a = (anth_out *)o;
    (void)index;
    if (!close_block(a, out)) return false;
    a->block_open = true;
    a->block_is_tool = true;
    a->n_calls++;
    return srv_sse_event("content_block_start",
                         json_pack("{s:s, s:i, s:{s:s, s:s, s:s%, s:{}}}", "type",
                                   "content_block_start", "index", a->n_blocks, "content_block",
                                   "type", "tool_use", "id", id, "name", name, name_len, "input"),
                         out);
}

static bool anth_tool_args(srv_api_out *o, int32_t index, const char *text, size_t len,
                           srv_buf *out) {
    anth_out *a = (anth_out *)o;
    (void)index;
    if (!a->block_open || !a->block_is_tool || len == 0) return true;
    return srv_sse_event("content_block_delta",
                         json_pack("{s:s, s:i, s:{s:s, s:o?}}", "type", "content_block_delta",
                                   "index", a->n_blocks, "delta", "type", "input_json_delta",
                                   "partial_json", srv_json_text(text, len)),
                         out);
}

static bool anth_end(srv_api_out *o, const srv_api_end *end, srv_buf *out) {
    anth_out *a = (anth_out *)o;
    if (end->finish == KILN_FINISH_ERROR || end->finish == KILN_FINISH_CANCELLED) {
        const char *type = end->finish == KILN_FINISH_ERROR ? "api_error" : "overloaded_error";
        const char *msg = end->finish == KILN_FINISH_ERROR
                              ? (end->message && end->message[0] ? end->message : "generation failed")
                              : "The server is shutting down; the generation was cancelled";
        return srv_sse_event("error", error_object(type, msg), out);
    }
    bool ok = close_block(a, out);
    const char *seq = NULL;
    const char *reason = stop_reason(a, end, a->n_calls, &seq);
    json_t *delta = json_pack("{s:s, s:s?}", "stop_reason", reason, "stop_sequence", seq);
    if (delta && !seq) json_object_set_new(delta, "stop_sequence", json_null());
    return ok &&
           srv_sse_event("message_delta",
                         json_pack("{s:s, s:o?, s:o?}", "type", "message_delta", "delta", delta,
                                   "usage", usage_json(a, end->usage)),
                         out) &&
           srv_sse_event("message_stop", json_pack("{s:s}", "type", "message_stop"), out);
}

static char *anth_whole(srv_api_out *o, const char *text, size_t len, const srv_api_end *end,
                        size_t *n) {
    anth_out *a = (anth_out *)o;
    json_t *content = json_array();
    if (content && len > 0)
        json_array_append_new(content, json_pack("{s:s, s:o?}", "type", "text", "text",
                                                 srv_json_text(text, len)));
    size_t n_calls = json_array_size(end->tool_calls);
    for (size_t i = 0; content && i < n_calls; i++) {
        json_t *c = json_array_get(end->tool_calls, i);
        json_t *fn = json_object_get(c, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        json_t *input = args ? json_loads(args, 0, NULL) : NULL;
        if (!json_is_object(input)) {
            json_decref(input);
            input = json_object();
        }
        json_array_append_new(content, json_pack("{s:s, s:O?, s:O?, s:o?}", "type", "tool_use",
                                                 "id", json_object_get(c, "id"), "name",
                                                 json_object_get(fn, "name"), "input", input));
    }
    const char *seq = NULL;
    const char *reason = stop_reason(a, end, (int)n_calls, &seq);
    json_t *msg = message_object(a, content, reason, seq, usage_json(a, end->usage));
    if (!msg) return NULL;
    if (!seq) json_object_set_new(msg, "stop_sequence", json_null());
    char *s = srv_json_dump(msg, n);
    json_decref(msg);
    return s;
}

static void anth_destroy(srv_api_out *o) {
    anth_out *a = (anth_out *)o;
    for (int i = 0; i < a->n_stops; i++) free(a->stops[i]);
    free(a->ids);
    srv_buf_free(&a->text);
    free(a);
}

static const srv_api_out_ops anth_ops = {
    .token = anth_token,
    .start = anth_start,
    .text = anth_text,
    .tool_call = anth_tool_call,
    .tool_args = anth_tool_args,
    .end = anth_end,
    .whole = anth_whole,
    .destroy = anth_destroy,
};

static srv_api_out *anth_out_create(const json_t *stops) {
    anth_out *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->base.ops = &anth_ops;
    srv_make_id("msg_", a->base.id, sizeof a->base.id);
    for (size_t i = 0; i < json_array_size(stops) && i < KILN_MAX_STOP_STRINGS; i++) {
        a->stops[i] = strdup(json_string_value(json_array_get(stops, i)));
        if (!a->stops[i]) {
            anth_destroy(&a->base);
            return NULL;
        }
        a->n_stops = (int)i + 1;
    }
    return &a->base;
}
