/* responses.c - OpenAI Responses requests to chat requests, response objects and their
 * streams from engine events, and the stored responses (see responses.h). */
#include "server/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_util.h"

/* ------------------------------------------------------------------------------------ */
/* Input items.                                                                          */

/* Text of a content string or array of text parts (input_text, output_text, text, refusal),
 * joined with "\n". *out is a new string. */
static bool content_text(const json_t *c, const char *param, json_t **out, srv_error *e) {
    *out = NULL;
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return true;
    }
    if (!json_is_array(c))
        return srv_bad(e, param, "%s must be a string or an array of content parts (got %s)",
                       param, srv_json_type_name(c));
    srv_buf b = {0};
    srv_buf_add(&b, "", 0);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        const char *t = json_is_string(type) ? json_string_value(type) : NULL;
        json_t *text = NULL;
        if (t && (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text")))
            text = json_object_get(part, "text");
        else if (t && !strcmp(t, "refusal"))
            text = json_object_get(part, "refusal");
        if (!t || (!text && strcmp(t, "refusal") && strncmp(t, "input_", 6) && strcmp(t, "text") &&
                   strcmp(t, "output_text"))) {
            srv_buf_free(&b);
            return srv_bad(e, param, "%s[%zu] must be a content part with a known \"type\"", param,
                           k);
        }
        if (!text) {
            srv_buf_free(&b);
            if (!strncmp(t, "input_", 6) && strcmp(t, "input_text") != 0)
                return srv_bad(e, param,
                               "%s[%zu]: content parts of type \"%.32s\" are not supported (kiln "
                               "serves text-only models; send input_text)",
                               param, k, t);
            return srv_bad(e, param, "%s[%zu].text must be a string", param, k);
        }
        if (!json_is_string(text)) {
            srv_buf_free(&b);
            return srv_bad(e, param, "%s[%zu].%s must be a string (got %s)", param, k,
                           strcmp(t, "refusal") ? "text" : "refusal", srv_json_type_name(text));
        }
        if (k > 0) srv_buf_add(&b, "\n", 1);
        srv_buf_add(&b, json_string_value(text), json_string_length(text));
    }
    *out = b.oom ? NULL : json_stringn(b.p, b.len);
    srv_buf_free(&b);
    return *out ? true : srv_oom(e, "input");
}

static bool add_item(json_t *msgs, const json_t *item, const char *param, srv_rstore *store,
                     double now, int depth, srv_error *e);

/* An item_reference: the output item `id` of a stored response. */
static bool add_reference(json_t *msgs, const json_t *item, const char *param, srv_rstore *store,
                          double now, int depth, srv_error *e) {
    json_t *id = json_object_get(item, "id");
    if (!json_is_string(id)) return srv_bad(e, param, "%s.id must be a string", param);
    char *resp = depth == 0 ? srv_rstore_find_item(store, json_string_value(id), now) : NULL;
    json_t *r = resp ? json_loads(resp, 0, NULL) : NULL;
    free(resp);
    json_t *found = NULL;
    json_t *output = json_object_get(r, "output");
    for (size_t i = 0; i < json_array_size(output) && !found; i++) {
        json_t *it = json_array_get(output, i);
        json_t *iid = json_object_get(it, "id");
        if (json_is_string(iid) && !strcmp(json_string_value(iid), json_string_value(id))) found = it;
    }
    if (!found) {
        json_decref(r);
        return srv_fail(e, 404, "invalid_request_error", NULL, param,
                        "Item with id '%.100s' not found.", json_string_value(id));
    }
    bool ok = add_item(msgs, found, param, store, now, depth + 1, e);
    json_decref(r);
    return ok;
}

/* The last chat message, when it is an assistant turn that a function_call may join. */
static json_t *open_assistant_turn(json_t *msgs) {
    size_t n = json_array_size(msgs);
    json_t *last = n ? json_array_get(msgs, n - 1) : NULL;
    json_t *role = json_object_get(last, "role");
    return json_is_string(role) && !strcmp(json_string_value(role), "assistant") ? last : NULL;
}

static bool add_item(json_t *msgs, const json_t *item, const char *param, srv_rstore *store,
                     double now, int depth, srv_error *e) {
    if (!json_is_object(item))
        return srv_bad(e, param, "%s must be an object (got %s)", param, srv_json_type_name(item));
    json_t *type = srv_json_field(item, "type");
    if (type && !json_is_string(type)) return srv_bad(e, param, "%s.type must be a string", param);
    const char *t = type ? json_string_value(type) : "message";
    char sub[112];
    if (!strcmp(t, "message")) {
        json_t *role = json_object_get(item, "role");
        snprintf(sub, sizeof sub, "%s.role", param);
        static const char *const roles[] = {"user", "assistant", "system", "developer"};
        const char *r = json_is_string(role) ? json_string_value(role) : NULL;
        size_t k = 0;
        while (r && k < 4 && strcmp(r, roles[k])) k++;
        if (!r || k == 4)
            return srv_bad(e, sub,
                           "%s must be \"user\", \"assistant\", \"system\" or \"developer\"", sub);
        snprintf(sub, sizeof sub, "%s.content", param);
        json_t *text = NULL;
        if (!content_text(json_object_get(item, "content"), sub, &text, e)) return false;
        return json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", r, "content", text)) ==
                   0 ||
               srv_oom(e, "input");
    }
    if (!strcmp(t, "function_call")) {
        json_t *cid = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
        json_t *args = json_object_get(item, "arguments");
        if (!json_is_string(cid) || !json_is_string(name) || !json_is_string(args))
            return srv_bad(e, param,
                           "%s must be {\"type\": \"function_call\", \"call_id\": string, "
                           "\"name\": string, \"arguments\": string}",
                           param);
        json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", cid, "type", "function",
                                 "function", "name", name, "arguments", args);
        if (!call) return srv_oom(e, "input");
        json_t *turn = open_assistant_turn(msgs);
        if (!turn) {
            /* content "" rather than null: templates that concatenate content accept it */
            turn = json_pack("{s:s, s:s, s:[]}", "role", "assistant", "content", "", "tool_calls");
            if (!turn || json_array_append_new(msgs, turn) != 0) {
                json_decref(call);
                return srv_oom(e, "input");
            }
        }
        json_t *calls = json_object_get(turn, "tool_calls");
        if (!json_is_array(calls)) {
            calls = json_array();
            if (!calls || json_object_set_new(turn, "tool_calls", calls) != 0) {
                json_decref(call);
                return srv_oom(e, "input");
            }
        }
        return json_array_append_new(calls, call) == 0 || srv_oom(e, "input");
    }
    if (!strcmp(t, "function_call_output")) {
        json_t *cid = json_object_get(item, "call_id");
        if (!json_is_string(cid)) return srv_bad(e, param, "%s.call_id must be a string", param);
        snprintf(sub, sizeof sub, "%s.output", param);
        json_t *text = NULL;
        if (!content_text(json_object_get(item, "output"), sub, &text, e)) return false;
        return json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool",
                                                     "tool_call_id", cid, "content", text)) == 0 ||
               srv_oom(e, "input");
    }
    if (!strcmp(t, "item_reference")) return add_reference(msgs, item, param, store, now, depth, e);
    if (!strcmp(t, "reasoning")) return true; /* no reasoning models: nothing to render */
    return srv_bad(e, param,
                   "%s: input items of type \"%.40s\" are not supported (message, function_call, "
                   "function_call_output, item_reference)",
                   param, t);
}

/* ------------------------------------------------------------------------------------ */
/* Other request fields.                                                                 */

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
            json_t *type = json_object_get(t, "type");
            if (!json_is_object(t) || !json_is_string(type))
                return srv_bad(e, param, "%s must be an object with a string \"type\"", param);
            if (strcmp(json_string_value(type), "function") != 0)
                return srv_bad(e, param,
                               "%s: tools of type \"%.40s\" are not supported (only \"function\")",
                               param, json_string_value(type));
            json_t *name = json_object_get(t, "name");
            if (!json_is_string(name) || json_string_length(name) == 0)
                return srv_bad(e, param, "%s.name must be a non-empty string", param);
            json_t *fn = json_pack("{s:O}", "name", name);
            static const char *const keys[] = {"description", "parameters", "strict"};
            for (size_t k = 0; fn && k < 3; k++) {
                json_t *v = srv_json_field(t, keys[k]);
                if (v) json_object_set(fn, keys[k], v);
            }
            if (!fn || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function",
                                                            "function", fn)) != 0)
                return srv_oom(e, "tools");
        }
    }
    json_t *tc = srv_json_field(root, "tool_choice");
    if (tc) {
        json_t *v = NULL;
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required"))
                return srv_bad(e, "tool_choice",
                               "tool_choice must be \"auto\", \"none\", \"required\" or "
                               "{\"type\": \"function\", \"name\": ...}");
            v = json_incref(tc);
        } else {
            json_t *type = json_object_get(tc, "type"), *name = json_object_get(tc, "name");
            if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
                !json_is_string(name))
                return srv_bad(e, "tool_choice",
                               "tool_choice must be \"auto\", \"none\", \"required\" or "
                               "{\"type\": \"function\", \"name\": ...}");
            v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
        }
        if (!v) return srv_oom(e, "tool_choice");
        json_object_set_new(chat, "tool_choice", v);
    }
    json_t *ptc = srv_json_field(root, "parallel_tool_calls");
    if (ptc) {
        if (!json_is_boolean(ptc))
            return srv_bad(e, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
        json_object_set(chat, "parallel_tool_calls", ptc);
    }
    return true;
}

/* text.format to the chat route's response_format. */
static bool translate_text(const json_t *root, json_t *chat, srv_error *e) {
    json_t *text = srv_json_field(root, "text");
    if (!text) return true;
    if (!json_is_object(text))
        return srv_bad(e, "text", "text must be an object (got %s)", srv_json_type_name(text));
    json_t *f = srv_json_field(text, "format");
    if (!f) return true;
    json_t *type = json_object_get(f, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!strcmp(t, "text")) return true;
    if (!strcmp(t, "json_object"))
        return json_object_set_new(chat, "response_format", json_pack("{s:s}", "type",
                                                                      "json_object")) == 0 ||
               srv_oom(e, "text");
    if (!strcmp(t, "json_schema")) {
        json_t *js = json_object();
        static const char *const keys[] = {"name", "schema", "strict", "description"};
        for (size_t k = 0; js && k < 4; k++) {
            json_t *v = srv_json_field(f, keys[k]);
            if (v) json_object_set(js, keys[k], v);
        }
        return json_object_set_new(chat, "response_format",
                                   json_pack("{s:s, s:o?}", "type", "json_schema", "json_schema",
                                             js)) == 0 ||
               srv_oom(e, "text");
    }
    return srv_bad(e, "text.format.type",
                   "text.format.type must be \"text\", \"json_object\" or \"json_schema\"");
}

/* ------------------------------------------------------------------------------------ */
/* The response object.                                                                  */

typedef struct resp_out {
    srv_api_out base;
    srv_rstore *store; /* borrowed; NULL = do not store */
    double now_s;      /* the request's time */
    json_t *echo;      /* request fields the response object repeats */
    json_t *history;   /* the conversation without the instructions (for the store) */
    /* the stream's output items, as they stand (finished ones in their final form) */
    json_t *items;
    bool open;         /* the last item is still being written */
    bool open_is_call; /* ... and it is a function_call */
    srv_buf cur;       /* the open item's text (a message's, or a call's arguments) */
    srv_buf text;      /* every message's text, concatenated (output_text) */
    int64_t seq;       /* the next sequence_number */
} resp_out;

static json_t *usage_json(const kiln_usage *u) {
    int32_t cached = u->cached_tokens > 0 ? u->cached_tokens : 0;
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", u->prompt_tokens,
                     "input_tokens_details", "cached_tokens", cached, "output_tokens",
                     u->completion_tokens, "output_tokens_details", "reasoning_tokens", 0,
                     "total_tokens", u->prompt_tokens + u->completion_tokens);
}

static json_t *part_json(const char *text, size_t len) {
    return json_pack("{s:s, s:o?, s:[], s:[]}", "type", "output_text", "text",
                     srv_json_text(text, len), "annotations", "logprobs");
}

static json_t *message_item(const char *id, const char *status, const char *text, size_t len,
                            bool with_part) {
    json_t *content = with_part ? json_pack("[o?]", part_json(text, len)) : json_array();
    return json_pack("{s:s, s:s, s:s, s:s, s:o?}", "id", id, "type", "message", "status", status,
                     "role", "assistant", "content", content);
}

static json_t *call_item(const char *id, const char *status, const char *call_id,
                         const char *name, size_t name_len, const char *args, size_t args_len) {
    return json_pack("{s:s, s:s, s:s, s:s, s:s%, s:o?}", "id", id, "type", "function_call",
                     "status", status, "call_id", call_id, "name", name, name_len, "arguments",
                     srv_json_text(args, args_len));
}

/* The response object: status, output (new reference or NULL = []), usage (NULL = null),
 * the finish's details. */
static json_t *response_object(const resp_out *r, const char *status, json_t *output,
                               const kiln_usage *usage, const char *incomplete,
                               const char *error) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:b}", "id", r->base.id, "object", "response",
                          "created_at", (json_int_t)r->base.created, "status", status, "background",
                          0);
    if (!o) {
        json_decref(output);
        return NULL;
    }
    json_object_set_new(o, "error",
                        error ? json_pack("{s:s, s:o?}", "code", "server_error", "message",
                                          srv_json_text(error, strlen(error)))
                              : json_null());
    json_object_set_new(o, "incomplete_details",
                        incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null());
    json_object_update(o, r->echo);
    json_object_set_new(o, "model", json_string(r->base.model ? r->base.model : ""));
    json_object_set_new(o, "output", output ? output : json_array());
    json_object_set_new(o, "usage", usage ? usage_json(usage) : json_null());
    return o;
}

/* The finished response: its output_text (the SDKs' convenience field: every message's text)
 * and, when stored, its store entry: the conversation with the reply (text and calls) as the
 * assistant's turn, and the ids of its output items. */
static void finish_object(resp_out *r, json_t *o, const char *text, size_t len, bool store) {
    json_object_set_new(o, "output_text", srv_json_text(text, len));
    if (!store || !r->store) return;
    json_t *output = json_object_get(o, "output");
    json_t *calls = json_array();
    const char *ids[64];
    int n_ids = 0;
    for (size_t i = 0; i < json_array_size(output); i++) {
        json_t *it = json_array_get(output, i);
        if (n_ids < 64) ids[n_ids++] = json_string_value(json_object_get(it, "id"));
        if (strcmp(json_string_value(json_object_get(it, "type")) ?: "", "function_call") != 0)
            continue;
        json_array_append_new(calls, json_pack("{s:O?, s:s, s:{s:O?, s:O?}}", "id",
                                               json_object_get(it, "call_id"), "type", "function",
                                               "function", "name", json_object_get(it, "name"),
                                               "arguments", json_object_get(it, "arguments")));
    }
    char *resp = srv_json_dump(o, NULL);
    json_t *hist = json_deep_copy(r->history);
    size_t nh = json_array_size(hist);
    json_t *last = nh ? json_array_get(hist, nh - 1) : NULL;
    json_t *lc = json_object_get(last, "content");
    json_t *turn = NULL;
    if (json_is_string(lc) &&
        !strcmp(json_string_value(json_object_get(last, "role")) ?: "", "assistant") &&
        !json_object_get(last, "tool_calls")) {
        /* an assistant prefill: the output continues it, as one message */
        srv_buf b = {0};
        srv_buf_add(&b, json_string_value(lc), json_string_length(lc));
        srv_buf_add(&b, text, len);
        json_object_set_new(last, "content", srv_json_text(b.p, b.len));
        srv_buf_free(&b);
        turn = last;
    } else if (hist) {
        turn = json_pack("{s:s, s:o?}", "role", "assistant", "content", srv_json_text(text, len));
        if (turn) json_array_append_new(hist, turn);
    }
    if (turn && json_array_size(calls) > 0) json_object_set(turn, "tool_calls", calls);
    char *msgs = hist ? json_dumps(hist, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    if (resp && msgs) srv_rstore_put(r->store, r->base.id, resp, msgs, ids, n_ids, srv_now_ms() / 1e3);
    json_decref(calls);
    json_decref(hist);
    free(resp);
    free(msgs);
}

static const char *status_of(kiln_finish_reason f, const char **incomplete) {
    *incomplete = NULL;
    if (f == KILN_FINISH_LENGTH) {
        *incomplete = "max_output_tokens";
        return "incomplete";
    }
    if (f == KILN_FINISH_ERROR || f == KILN_FINISH_CANCELLED) return "failed";
    return "completed";
}

static bool emit(resp_out *r, const char *type, json_t *o, srv_buf *out) {
    if (!o) return false;
    json_t *ev = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t)r->seq++);
    if (!ev || json_object_update(ev, o) != 0) {
        json_decref(ev);
        json_decref(o);
        return false;
    }
    json_decref(o);
    return srv_sse_event(type, ev, out);
}

static bool resp_start(srv_api_out *o, srv_buf *out) {
    resp_out *r = (resp_out *)o;
    return emit(r, "response.created",
                json_pack("{s:o?}", "response",
                          response_object(r, "in_progress", NULL, NULL, NULL, NULL)),
                out) &&
           emit(r, "response.in_progress",
                json_pack("{s:o?}", "response",
                          response_object(r, "in_progress", NULL, NULL, NULL, NULL)),
                out);
}

/* The open item (the last of r->items) and its output_index. */
static json_t *open_item(resp_out *r, int *index) {
    *index = (int)json_array_size(r->items) - 1;
    return json_array_get(r->items, (size_t)*index);
}

/* Close the open item with `status`: its done events, its final form in r->items. */
static bool close_item(resp_out *r, const char *status, srv_buf *out) {
    if (!r->open) return true;
    r->open = false;
    int idx;
    json_t *it = open_item(r, &idx);
    const char *id = json_string_value(json_object_get(it, "id"));
    const char *tx = r->cur.p ? r->cur.p : "";
    size_t n = r->cur.len;
    json_t *done;
    bool ok;
    if (r->open_is_call) {
        done = call_item(id, status, json_string_value(json_object_get(it, "call_id")),
                         json_string_value(json_object_get(it, "name")),
                         json_string_length(json_object_get(it, "name")), tx, n);
        ok = emit(r, "response.function_call_arguments.done",
                  json_pack("{s:s, s:i, s:o?}", "item_id", id, "output_index", idx, "arguments",
                            srv_json_text(tx, n)),
                  out);
    } else {
        done = message_item(id, status, tx, n, true);
        ok = emit(r, "response.output_text.done",
                  json_pack("{s:s, s:i, s:i, s:o?, s:[]}", "item_id", id, "output_index", idx,
                            "content_index", 0, "text", srv_json_text(tx, n), "logprobs"),
                  out) &&
             emit(r, "response.content_part.done",
                  json_pack("{s:s, s:i, s:i, s:o?}", "item_id", id, "output_index", idx,
                            "content_index", 0, "part", part_json(tx, n)),
                  out);
    }
    if (!done) return false;
    ok = ok && emit(r, "response.output_item.done",
                    json_pack("{s:i, s:O}", "output_index", idx, "item", done), out);
    json_array_set_new(r->items, (size_t)idx, done);
    srv_buf_reset(&r->cur);
    return ok;
}

static bool open_message(resp_out *r, srv_buf *out) {
    if (r->open && !r->open_is_call) return true;
    if (!close_item(r, "completed", out)) return false;
    char id[64];
    srv_make_id("msg_", id, sizeof id);
    json_t *it = message_item(id, "in_progress", NULL, 0, false);
    if (!it || json_array_append(r->items, it) != 0) {
        json_decref(it);
        return false;
    }
    r->open = true;
    r->open_is_call = false;
    int idx = (int)json_array_size(r->items) - 1;
    return emit(r, "response.output_item.added",
                json_pack("{s:i, s:o}", "output_index", idx, "item", it), out) &&
           emit(r, "response.content_part.added",
                json_pack("{s:s, s:i, s:i, s:o?}", "item_id", id, "output_index", idx,
                          "content_index", 0, "part", part_json("", 0)),
                out);
}

static bool resp_text(srv_api_out *o, const char *text, size_t len, srv_buf *out) {
    resp_out *r = (resp_out *)o;
    if (len == 0) return true;
    if (!open_message(r, out)) return false;
    srv_buf_add(&r->text, text, len);
    srv_buf_add(&r->cur, text, len);
    int idx;
    json_t *it = open_item(r, &idx);
    return emit(r, "response.output_text.delta",
                json_pack("{s:O?, s:i, s:i, s:o?, s:[]}", "item_id", json_object_get(it, "id"),
                          "output_index", idx, "content_index", 0, "delta",
                          srv_json_text(text, len), "logprobs"),
                out);
}

static bool resp_tool_call(srv_api_out *o, int32_t index, const char *call_id, const char *name,
                           size_t name_len, srv_buf *out) {
    resp_out *r = (resp_out *)o;
    (void)index;
    if (!close_item(r, "completed", out)) return false;
    char id[64];
    srv_make_id("fc_", id, sizeof id);
    json_t *it = call_item(id, "in_progress", call_id, name, name_len, "", 0);
    if (!it || json_array_append(r->items, it) != 0) {
        json_decref(it);
        return false;
    }
    r->open = true;
    r->open_is_call = true;
    return emit(r, "response.output_item.added",
                json_pack("{s:i, s:o}", "output_index", (int)json_array_size(r->items) - 1,
                          "item", it),
                out);
}

static bool resp_tool_args(srv_api_out *o, int32_t index, const char *text, size_t len,
                           srv_buf *out) {
    resp_out *r = (resp_out *)o;
    (void)index;
    if (!r->open || !r->open_is_call || len == 0) return true;
    srv_buf_add(&r->cur, text, len);
    int idx;
    json_t *it = open_item(r, &idx);
    return emit(r, "response.function_call_arguments.delta",
                json_pack("{s:O?, s:i, s:o?}", "item_id", json_object_get(it, "id"),
                          "output_index", idx, "delta", srv_json_text(text, len)),
                out);
}

static bool resp_end(srv_api_out *o, const srv_api_end *end, srv_buf *out) {
    resp_out *r = (resp_out *)o;
    const char *incomplete = NULL;
    const char *status = status_of(end->finish, &incomplete);
    const char *tx = r->text.p ? r->text.p : "";
    size_t n = r->text.len;
    if (end->finish == KILN_FINISH_ERROR || end->finish == KILN_FINISH_CANCELLED) {
        const char *msg = end->finish == KILN_FINISH_ERROR
                              ? (end->message && end->message[0] ? end->message : "generation failed")
                              : "The server is shutting down; the generation was cancelled";
        bool ok = close_item(r, "incomplete", out);
        return ok && emit(r, "response.failed",
                          json_pack("{s:o?}", "response",
                                    response_object(r, status, json_deep_copy(r->items),
                                                    end->usage, NULL, msg)),
                          out);
    }
    /* a reply of nothing is still one (empty) message */
    bool ok = (json_array_size(r->items) > 0 || open_message(r, out)) &&
              close_item(r, incomplete ? "incomplete" : "completed", out);
    json_t *resp = response_object(r, status, json_deep_copy(r->items), end->usage, incomplete,
                                   NULL);
    if (!resp) return false;
    finish_object(r, resp, tx, n, true);
    return ok && emit(r, incomplete ? "response.incomplete" : "response.completed",
                      json_pack("{s:o}", "response", resp), out);
}

static char *resp_whole(srv_api_out *o, const char *text, size_t len, const srv_api_end *end,
                        size_t *n) {
    resp_out *r = (resp_out *)o;
    const char *incomplete = NULL;
    const char *status = status_of(end->finish, &incomplete);
    const char *item_status = incomplete ? "incomplete" : "completed";
    json_t *output = json_array();
    size_t n_calls = json_array_size(end->tool_calls);
    if (output && (len > 0 || n_calls == 0)) {
        char id[64];
        srv_make_id("msg_", id, sizeof id);
        json_array_append_new(output, message_item(id, item_status, text, len, true));
    }
    for (size_t i = 0; output && i < n_calls; i++) {
        json_t *c = json_array_get(end->tool_calls, i);
        json_t *fn = json_object_get(c, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        char id[64];
        srv_make_id("fc_", id, sizeof id);
        json_array_append_new(output, call_item(id, "completed",
                                                json_string_value(json_object_get(c, "id")) ?: "",
                                                json_string_value(name) ?: "",
                                                json_string_length(name),
                                                json_string_value(args) ?: "",
                                                json_string_length(args)));
    }
    json_t *resp = response_object(r, status, output, end->usage, incomplete,
                                   end->finish == KILN_FINISH_ERROR ? end->message : NULL);
    if (!resp) return NULL;
    finish_object(r, resp, text, len, end->finish == KILN_FINISH_STOP || incomplete);
    char *s = srv_json_dump(resp, n);
    json_decref(resp);
    return s;
}

static void resp_destroy(srv_api_out *o) {
    resp_out *r = (resp_out *)o;
    json_decref(r->echo);
    json_decref(r->history);
    json_decref(r->items);
    srv_buf_free(&r->cur);
    srv_buf_free(&r->text);
    free(r);
}

static const srv_api_out_ops resp_ops = {
    .start = resp_start,
    .text = resp_text,
    .tool_call = resp_tool_call,
    .tool_args = resp_tool_args,
    .end = resp_end,
    .whole = resp_whole,
    .destroy = resp_destroy,
};

/* ------------------------------------------------------------------------------------ */
/* The request.                                                                          */

/* The request fields the response object repeats (OpenAI's defaults when absent). */
static json_t *echo_fields(const json_t *root, bool store) {
    json_t *o = json_pack("{s:n, s:n, s:b, s:n, s:{s:n, s:n}, s:b, s:n, s:{s:{s:s}}, s:s, s:[], "
                          "s:n, s:s, s:n, s:{}}",
                          "instructions", "max_output_tokens", "parallel_tool_calls", 1,
                          "previous_response_id", "reasoning", "effort", "summary", "store", store,
                          "temperature", "text", "format", "type", "text", "tool_choice", "auto",
                          "tools", "top_p", "truncation", "disabled", "user", "metadata");
    static const char *const keys[] = {"instructions", "max_output_tokens", "parallel_tool_calls",
                                       "previous_response_id", "temperature", "text",
                                       "tool_choice", "tools", "top_p", "truncation", "user",
                                       "metadata"};
    for (size_t k = 0; o && k < sizeof keys / sizeof keys[0]; k++) {
        json_t *v = srv_json_field(root, keys[k]);
        if (v) json_object_set(o, keys[k], v);
    }
    return o;
}

static bool copy_number(const json_t *root, const char *key, double lo, double hi, bool lo_open,
                        json_t *chat, srv_error *e) {
    json_t *v = srv_json_field(root, key);
    if (!v) return true;
    if (!json_is_number(v))
        return srv_bad(e, key, "%s must be a number (got %s)", key, srv_json_type_name(v));
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return srv_bad(e, key, "%s must be in %c%g, %g] (got %g)", key, lo_open ? '(' : '[', lo,
                       hi, x);
    json_object_set(chat, key, v);
    return true;
}

static bool check_fields(const json_t *root, srv_error *e) {
    static const char *const strings[] = {"model", "instructions", "previous_response_id", "user"};
    for (size_t k = 0; k < 4; k++) {
        json_t *v = srv_json_field(root, strings[k]);
        if (v && !json_is_string(v))
            return srv_bad(e, strings[k], "%s must be a string (got %s)", strings[k],
                           srv_json_type_name(v));
    }
    static const char *const bools[] = {"stream", "store", "background"};
    for (size_t k = 0; k < 3; k++) {
        json_t *v = srv_json_field(root, bools[k]);
        if (v && !json_is_boolean(v))
            return srv_bad(e, bools[k], "%s must be a boolean (got %s)", bools[k],
                           srv_json_type_name(v));
    }
    if (json_is_true(srv_json_field(root, "background")))
        return srv_bad(e, "background", "background responses are not supported");
    if (srv_json_field(root, "conversation"))
        return srv_bad(e, "conversation",
                       "conversation is not supported (use previous_response_id)");
    json_t *md = srv_json_field(root, "metadata");
    if (md && !json_is_object(md))
        return srv_bad(e, "metadata", "metadata must be an object (got %s)", srv_json_type_name(md));
    json_t *tl = srv_json_field(root, "top_logprobs");
    if (tl && !(json_is_integer(tl) && json_integer_value(tl) == 0))
        return srv_bad(e, "top_logprobs", "top_logprobs is not supported on /v1/responses");
    json_t *tr = srv_json_field(root, "truncation");
    if (tr && !(json_is_string(tr) && (!strcmp(json_string_value(tr), "disabled") ||
                                       !strcmp(json_string_value(tr), "auto"))))
        return srv_bad(e, "truncation", "truncation must be \"disabled\" or \"auto\"");
    json_t *mt = srv_json_field(root, "max_output_tokens");
    if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 1 ||
               json_integer_value(mt) > INT32_MAX))
        return srv_bad(e, "max_output_tokens", "max_output_tokens must be an integer >= 1");
    return true;
}

bool srv_responses_translate(const json_t *root, srv_rstore *store, double now_s,
                             json_t **chat_out, srv_api_out **out, srv_error *e) {
    *chat_out = NULL;
    *out = NULL;
    if (!json_is_object(root))
        return srv_bad(e, NULL, "the request body must be a JSON object (got %s)",
                       srv_json_type_name(root));
    if (!check_fields(root, e)) return false;
    json_t *input = srv_json_field(root, "input");
    json_t *prev = srv_json_field(root, "previous_response_id");
    if (!input && !prev) return srv_bad(e, "input", "input is required");
    if (input && !json_is_string(input) && !json_is_array(input))
        return srv_bad(e, "input", "input must be a string or an array of input items (got %s)",
                       srv_json_type_name(input));

    json_t *history = NULL;
    if (prev) {
        char *m = srv_rstore_get(store, json_string_value(prev), SRV_RSTORE_MESSAGES, now_s);
        history = m ? json_loads(m, 0, NULL) : NULL;
        free(m);
        if (!json_is_array(history)) {
            json_decref(history);
            return srv_fail(e, 404, "invalid_request_error", "previous_response_not_found",
                            "previous_response_id", "Previous response with id '%.100s' not found.",
                            json_string_value(prev));
        }
    } else {
        history = json_array();
        if (!history) return srv_oom(e, "input");
    }
    bool ok = true;
    if (json_is_string(input)) {
        ok = json_array_append_new(history, json_pack("{s:s, s:O}", "role", "user", "content",
                                                      input)) == 0 ||
             srv_oom(e, "input");
    } else {
        for (size_t i = 0; ok && i < json_array_size(input); i++) {
            char param[48];
            snprintf(param, sizeof param, "input[%zu]", i);
            ok = add_item(history, json_array_get(input, i), param, store, now_s, 0, e);
        }
    }
    if (ok && json_array_size(history) == 0)
        ok = srv_bad(e, "input", "input must contain at least one message");

    json_t *chat = ok ? json_object() : NULL;
    json_t *msgs = ok ? json_array() : NULL;
    if (ok && (!chat || !msgs)) ok = srv_oom(e, "request");
    if (ok) {
        json_object_set(chat, "messages", msgs);
        json_t *ins = srv_json_field(root, "instructions");
        if (ins)
            ok = json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content",
                                                       ins)) == 0 ||
                 srv_oom(e, "instructions");
        ok = ok && (json_array_extend(msgs, history) == 0 || srv_oom(e, "input"));
    }
    json_decref(msgs);
    json_t *model = srv_json_field(root, "model");
    if (ok && model) json_object_set(chat, "model", model);
    json_t *mt = srv_json_field(root, "max_output_tokens");
    if (ok && mt) json_object_set(chat, "max_tokens", mt);
    if (ok) ok = copy_number(root, "temperature", 0, 2, false, chat, e);
    if (ok) ok = copy_number(root, "top_p", 0, 1, true, chat, e);
    json_t *stream = srv_json_field(root, "stream");
    if (ok && stream) json_object_set(chat, "stream", stream);
    if (ok) ok = translate_tools(root, chat, e);
    if (ok) ok = translate_text(root, chat, e);
    static const char *const passthrough[] = {
        "seed",        "top_k", "min_p", "repetition_penalty",  "presence_penalty",
        "frequency_penalty", "stop",  "speculation", "fill", "chat_template_kwargs"};
    for (size_t i = 0; ok && i < sizeof passthrough / sizeof passthrough[0]; i++) {
        json_t *v = json_object_get(root, passthrough[i]);
        if (v) json_object_set(chat, passthrough[i], v);
    }
    resp_out *r = ok ? calloc(1, sizeof *r) : NULL;
    if (ok && !r) ok = srv_oom(e, "response");
    if (ok) {
        bool store_it = !json_is_false(srv_json_field(root, "store"));
        r->base.ops = &resp_ops;
        srv_make_id("resp_", r->base.id, sizeof r->base.id);
        r->items = json_array();
        r->store = store_it ? store : NULL;
        r->now_s = now_s;
        r->echo = echo_fields(root, store_it);
        r->history = json_incref(history);
        if (!r->echo || !r->items) ok = srv_oom(e, "response");
    }
    json_decref(history);
    if (!ok) {
        if (r) resp_destroy(&r->base);
        json_decref(chat);
        return false;
    }
    *chat_out = chat;
    *out = &r->base;
    return true;
}

char *srv_responses_get(srv_rstore *store, const char *id, double now_s, size_t *len,
                        srv_error *e) {
    char *s = srv_rstore_get(store, id, SRV_RSTORE_RESPONSE, now_s);
    if (!s) {
        srv_fail(e, 404, "invalid_request_error", NULL, NULL, "Response with id '%.100s' not found.",
                 id);
        return NULL;
    }
    *len = strlen(s);
    return s;
}

char *srv_responses_delete(srv_rstore *store, const char *id, double now_s, size_t *len,
                           srv_error *e) {
    if (!srv_rstore_delete(store, id, now_s)) {
        srv_fail(e, 404, "invalid_request_error", NULL, NULL, "Response with id '%.100s' not found.",
                 id);
        return NULL;
    }
    json_t *o = json_pack("{s:s, s:s, s:b}", "id", id, "object", "response.deleted", "deleted", 1);
    char *s = o ? srv_json_dump(o, len) : NULL;
    json_decref(o);
    if (!s) srv_oom(e, "response");
    return s;
}
