/* tools.c - tool calling on chat completions (see tools.h). */
#include "server/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "server/openai.h"

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static json_t *field(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static bool valid_name(const char *s, size_t n) {
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

static bool check_tool(const json_t *tool, size_t i, srv_error *e) {
    char p[96];
    snprintf(p, sizeof p, "tools[%zu]", i);
    if (!json_is_object(tool)) return BAD(e, p, "'%s' must be an object", p);
    json_t *type = json_object_get(tool, "type");
    snprintf(p, sizeof p, "tools[%zu].type", i);
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
        return BAD(e, p, "'%s' must be \"function\" (the only tool type supported)", p);
    json_t *fn = json_object_get(tool, "function");
    snprintf(p, sizeof p, "tools[%zu].function", i);
    if (!json_is_object(fn)) return BAD(e, p, "'%s' must be an object", p);
    json_t *name = json_object_get(fn, "name");
    snprintf(p, sizeof p, "tools[%zu].function.name", i);
    if (!json_is_string(name)) return BAD(e, p, "'%s' is required (a string)", p);
    if (!valid_name(json_string_value(name), json_string_length(name)))
        return BAD(e, p,
                   "'%s' must be 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-' (got "
                   "'%.64s')",
                   p, json_string_value(name));
    json_t *d = field(fn, "description");
    snprintf(p, sizeof p, "tools[%zu].function.description", i);
    if (d && !json_is_string(d)) return BAD(e, p, "'%s' must be a string", p);
    json_t *params = field(fn, "parameters");
    snprintf(p, sizeof p, "tools[%zu].function.parameters", i);
    if (params && !json_is_object(params))
        return BAD(e, p, "'%s' must be an object (a JSON Schema)", p);
    json_t *strict = field(fn, "strict");
    snprintf(p, sizeof p, "tools[%zu].function.strict", i);
    if (strict && !json_is_boolean(strict)) return BAD(e, p, "'%s' must be a boolean", p);
    return true;
}

static const json_t *find_tool(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *n = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) return t;
    }
    return NULL;
}

bool srv_tools_parse(const json_t *root, srv_tools *t, srv_error *e) {
    memset(t, 0, sizeof *t);
    t->parallel = true;
    json_t *tools = field(root, "tools");
    if (tools) {
        if (!json_is_array(tools))
            return BAD(e, "tools", "'tools' must be an array (got %s)", json_type_name(tools));
        if (json_array_size(tools) > 128)
            return BAD(e, "tools", "'tools' may hold at most 128 tools (got %zu)",
                       json_array_size(tools));
        size_t i;
        json_t *tool;
        json_array_foreach(tools, i, tool) {
            if (!check_tool(tool, i, e)) return false;
            const char *n = json_string_value(json_object_get(json_object_get(tool, "function"),
                                                              "name"));
            if (find_tool(tools, n) != tool)
                return BAD(e, "tools", "'tools' names the function '%s' twice", n);
        }
        if (json_array_size(tools) > 0) t->tools = tools;
    }
    json_t *pc = field(root, "parallel_tool_calls");
    if (pc) {
        if (!json_is_boolean(pc))
            return BAD(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean (got %s)",
                       json_type_name(pc));
        t->parallel = json_is_true(pc);
    }
    t->choice = t->tools ? SRV_TOOLS_AUTO : SRV_TOOLS_NONE;
    json_t *tc = field(root, "tool_choice");
    if (!tc) return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "none")) {
            t->choice = SRV_TOOLS_NONE;
            return true;
        }
        if (!strcmp(s, "auto")) return true;
        if (!strcmp(s, "required")) {
            if (!t->tools)
                return BAD(e, "tool_choice", "'tool_choice' \"required\" needs 'tools'");
            t->choice = SRV_TOOLS_REQUIRED;
            return true;
        }
        return BAD(e, "tool_choice",
                   "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                   "\"function\", \"function\": {\"name\": ...}} (got \"%.64s\")",
                   s);
    }
    if (!json_is_object(tc))
        return BAD(e, "tool_choice",
                   "'tool_choice' must be a string or an object (got %s)", json_type_name(tc));
    json_t *type = json_object_get(tc, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
        return BAD(e, "tool_choice.type", "'tool_choice.type' must be \"function\"");
    json_t *name = json_object_get(json_object_get(tc, "function"), "name");
    if (!json_is_string(name))
        return BAD(e, "tool_choice.function.name",
                   "'tool_choice.function.name' is required (a string)");
    if (!t->tools)
        return BAD(e, "tool_choice", "'tool_choice' names a function but 'tools' is absent");
    const json_t *tool = find_tool(t->tools, json_string_value(name));
    if (!tool)
        return BAD(e, "tool_choice.function.name",
                   "'tool_choice.function.name' is '%.64s', which is not a function in 'tools'",
                   json_string_value(name));
    t->choice = SRV_TOOLS_NAMED;
    t->name = json_string_value(name);
    t->named = tool;
    return true;
}

bool srv_tools_check_messages(const json_t *ms, srv_error *e) {
    char p[96];
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) continue;
        if (!strcmp(role, "tool")) {
            json_t *id = json_object_get(m, "tool_call_id");
            snprintf(p, sizeof p, "messages[%zu].tool_call_id", i);
            if (!json_is_string(id)) return BAD(e, p, "'%s' is required (a string)", p);
            continue;
        }
        json_t *calls = field(m, "tool_calls");
        if (!calls) continue;
        snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
        if (strcmp(role, "assistant") != 0)
            return BAD(e, p, "'%s': only assistant messages have tool calls", p);
        if (!json_is_array(calls)) return BAD(e, p, "'%s' must be an array", p);
        size_t k;
        json_t *c;
        json_array_foreach(calls, k, c) {
            snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu]", i, k);
            if (!json_is_object(c)) return BAD(e, p, "'%s' must be an object", p);
            json_t *id = json_object_get(c, "id");
            json_t *type = json_object_get(c, "type");
            json_t *fn = json_object_get(c, "function");
            snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].id", i, k);
            if (!json_is_string(id)) return BAD(e, p, "'%s' is required (a string)", p);
            snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].type", i, k);
            if (type && !json_is_null(type) &&
                !(json_is_string(type) && !strcmp(json_string_value(type), "function")))
                return BAD(e, p, "'%s' must be \"function\"", p);
            snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function", i, k);
            if (!json_is_object(fn)) return BAD(e, p, "'%s' must be an object", p);
            snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function.name", i, k);
            if (!json_is_string(json_object_get(fn, "name")))
                return BAD(e, p, "'%s' is required (a string)", p);
            json_t *args = json_object_get(fn, "arguments");
            snprintf(p, sizeof p, "messages[%zu].tool_calls[%zu].function.arguments", i, k);
            if (!json_is_string(args) && !json_is_object(args))
                return BAD(e, p, "'%s' must be a string (the arguments as JSON)", p);
        }
    }
    return true;
}

/* ------------------------------------------------------------------------------------ */

static bool mistral_id_ok(const char *s) {
    size_t n = strlen(s);
    if (n != 9) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return false;
    }
    return true;
}

static json_t *mistral_id(const char *s) {
    if (mistral_id_ok(s)) return json_string(s);
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t h = XXH3_64bits(s, strlen(s));
    char id[10];
    for (int i = 0; i < 9; i++) {
        id[i] = alnum[h % 62];
        h /= 62;
        if (i == 4) h ^= XXH3_64bits_withSeed(s, strlen(s), 1);
    }
    id[9] = '\0';
    return json_string(id);
}

/* "arguments" as the template wants them: the object a string encodes. */
static json_t *args_value(json_t *a) {
    if (json_is_string(a)) {
        json_error_t je;
        json_t *v = json_loadb(json_string_value(a), json_string_length(a), 0, &je);
        if (json_is_object(v)) return v;
        json_decref(v);
    }
    return json_incref(a);
}

/* The call object text of the Hermes markup: {"name": N, "arguments": A}. */
static bool hermes_call_text(srv_buf *b, const json_t *fn) {
    json_t *args = args_value(json_object_get(fn, "arguments"));
    json_t *o = json_pack("{s:O, s:o}", "name", json_object_get(fn, "name"), "arguments",
                          args ? args : json_object());
    char *s = o ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17))
                : NULL;
    json_decref(o);
    if (!s) return false;
    /* jansson writes ": " and ", " like json.dumps by default (no JSON_COMPACT) */
    srv_buf_adds(b, "<tool_call>\n");
    srv_buf_adds(b, s);
    srv_buf_adds(b, "\n</tool_call>");
    free(s);
    return !b->oom;
}

char *srv_tools_system_text(const json_t *tools) {
    srv_buf b = {0};
    srv_buf_adds(&b, "# Tools\n\nYou may call one or more functions to assist with the user "
                     "query.\n\nYou are provided with function signatures within <tools></tools> "
                     "XML tags:\n<tools>");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char *s = json_dumps(t, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (!s) {
            srv_buf_free(&b);
            return NULL;
        }
        srv_buf_adds(&b, "\n");
        srv_buf_adds(&b, s);
        free(s);
    }
    srv_buf_adds(&b, "\n</tools>\n\nFor each function call, return a json object with function "
                     "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                     "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
    if (b.oom) {
        srv_buf_free(&b);
        return NULL;
    }
    return b.p; /* NUL-terminated by srv_buf */
}

static const char *content_str(const json_t *m) {
    const char *s = json_string_value(json_object_get(m, "content"));
    return s ? s : "";
}

/* The Hermes rewriting for a template without tools. */
static json_t *rewrite_plain(const json_t *ms, const json_t *tools) {
    json_t *out = json_array();
    if (!out) return NULL;
    char *sys = tools ? srv_tools_system_text(tools) : NULL;
    if (tools && !sys) goto oom;
    size_t i;
    json_t *m;
    bool sys_done = sys == NULL;
    json_array_foreach(ms, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) role = "";
        if (!sys_done && i == 0 && !strcmp(role, "system")) {
            srv_buf b = {0};
            srv_buf_adds(&b, content_str(m));
            srv_buf_adds(&b, "\n\n");
            srv_buf_adds(&b, sys);
            json_t *c = json_copy((json_t *)m);
            if (b.oom || !c || json_object_set_new(c, "content", json_string(b.p))) {
                srv_buf_free(&b);
                json_decref(c);
                goto oom;
            }
            srv_buf_free(&b);
            json_array_append_new(out, c);
            sys_done = true;
            continue;
        }
        if (!sys_done) {
            json_array_append_new(out, json_pack("{s:s, s:s}", "role", "system", "content", sys));
            sys_done = true;
        }
        json_t *calls = field(m, "tool_calls");
        if (!strcmp(role, "assistant") && json_is_array(calls)) {
            srv_buf b = {0};
            srv_buf_adds(&b, content_str(m));
            size_t k;
            json_t *c;
            json_array_foreach(calls, k, c) {
                if (b.len > 0) srv_buf_adds(&b, "\n");
                if (!hermes_call_text(&b, json_object_get(c, "function"))) b.oom = true;
            }
            json_t *n = json_copy((json_t *)m);
            if (b.oom || !n || json_object_set_new(n, "content", json_string(b.p ? b.p : "")) ||
                json_object_del(n, "tool_calls")) {
                srv_buf_free(&b);
                json_decref(n);
                goto oom;
            }
            srv_buf_free(&b);
            json_array_append_new(out, n);
            continue;
        }
        if (!strcmp(role, "tool")) {
            /* merged into the previous user message when that one holds tool responses */
            json_t *prev = json_array_size(out) ? json_array_get(out, json_array_size(out) - 1)
                                                : NULL;
            bool merge = prev && json_is_true(json_object_get(prev, "_kiln_tool_responses"));
            srv_buf b = {0};
            if (merge) {
                srv_buf_adds(&b, content_str(prev));
                srv_buf_adds(&b, "\n");
            }
            srv_buf_adds(&b, "<tool_response>\n");
            srv_buf_adds(&b, content_str(m));
            srv_buf_adds(&b, "\n</tool_response>");
            if (b.oom) {
                srv_buf_free(&b);
                goto oom;
            }
            if (merge) {
                json_object_set_new(prev, "content", json_string(b.p));
            } else {
                json_array_append_new(out, json_pack("{s:s, s:s, s:b}", "role", "user", "content",
                                                     b.p, "_kiln_tool_responses", 1));
            }
            srv_buf_free(&b);
            continue;
        }
        json_array_append(out, m);
    }
    /* drop the bookkeeping key */
    json_array_foreach(out, i, m) {
        if (json_object_get(m, "_kiln_tool_responses")) json_object_del(m, "_kiln_tool_responses");
    }
    free(sys);
    return out;
oom:
    free(sys);
    json_decref(out);
    return NULL;
}

/* Tool-call arguments as objects (and Mistral's ids) for a template with tools. */
static json_t *rewrite_native(const json_t *ms, kiln_tool_format fmt) {
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        if (!out) return NULL;
        json_t *calls = field(m, "tool_calls");
        json_t *tcid = json_object_get(m, "tool_call_id");
        if (!json_is_array(calls) && !(fmt == KILN_TOOL_FORMAT_MISTRAL && json_is_string(tcid))) {
            json_array_append(out, m);
            continue;
        }
        json_t *n = json_copy((json_t *)m);
        if (!n) goto oom;
        if (json_is_string(tcid))
            json_object_set_new(n, "tool_call_id", mistral_id(json_string_value(tcid)));
        if (json_is_array(calls)) {
            json_t *nc = json_array();
            size_t k;
            json_t *c;
            json_array_foreach(calls, k, c) {
                json_t *cc = json_copy(c);
                json_t *fn = cc ? json_copy(json_object_get(cc, "function")) : NULL;
                if (!cc || !fn || !nc) {
                    json_decref(cc);
                    json_decref(fn);
                    json_decref(nc);
                    json_decref(n);
                    goto oom;
                }
                json_object_set_new(fn, "arguments", args_value(json_object_get(fn, "arguments")));
                json_object_set_new(cc, "function", fn);
                json_t *id = json_object_get(cc, "id");
                if (fmt == KILN_TOOL_FORMAT_MISTRAL && json_is_string(id))
                    json_object_set_new(cc, "id", mistral_id(json_string_value(id)));
                json_array_append_new(nc, cc);
            }
            json_object_set_new(n, "tool_calls", nc);
        }
        json_array_append_new(out, n);
    }
    return out;
oom:
    json_decref(out);
    return NULL;
}

json_t *srv_tools_messages(const json_t *messages, const json_t *tools, bool native,
                           kiln_tool_format fmt) {
    return native ? rewrite_native(messages, fmt) : rewrite_plain(messages, tools);
}
