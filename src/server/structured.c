/*
 * structured.c - structured-output request fields (structured.h).
 */
#include "server/structured.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"

/* fill e as srv_fail does (written out here: openai.c calls this file, so this file calls
 * nothing of openai.c) */
static bool fail(srv_error *e, int status, const char *type, const char *param, const char *fmt,
                 ...) __attribute__((format(printf, 5, 6)));
static bool fail(srv_error *e, int status, const char *type, const char *param, const char *fmt,
                 ...) {
    if (!e) return false;
    e->http_status = status;
    e->type = type;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(e, param, ...) fail(e, 400, "invalid_request_error", param, __VA_ARGS__)
#define SRVERR(e, param, ...) fail(e, 500, "server_error", param, __VA_ARGS__)

static json_t *given(const json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* compile; a compile error becomes a 400 naming the field */
static bool compile(kiln_grammar_kind kind, const char *text, size_t len, const char *param,
                    kiln_grammar **out, srv_error *e) {
    kiln_error err;
    memset(&err, 0, sizeof err);
    kiln_status st = kiln_grammar_create(kind, text, len, out, &err);
    if (st == KILN_ERR_OUT_OF_MEMORY)
        return SRVERR(e, param, "%s: %s", param, err.message);
    if (st) return BAD(e, param, "invalid '%s': %s", param, err.message);
    return true;
}

static bool schema_value(const json_t *schema, const char *param, kiln_grammar **out,
                         srv_error *e) {
    char *text = NULL;
    if (json_is_string(schema)) {
        text = strdup(json_string_value(schema)); /* vLLM accepts the schema as a string too */
    } else if (json_is_object(schema) || json_is_boolean(schema)) {
        text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    } else {
        return BAD(e, param, "'%s' must be a JSON schema (an object)", param);
    }
    if (!text) return SRVERR(e, param, "out of memory");
    bool ok = compile(KILN_GRAMMAR_JSON_SCHEMA, text, strlen(text), param, out, e);
    free(text);
    return ok;
}

static bool response_format(const json_t *rf, kiln_grammar **out, srv_error *e) {
    if (!json_is_object(rf)) return BAD(e, "response_format", "'response_format' must be an object");
    json_t *t = json_object_get(rf, "type");
    if (!json_is_string(t))
        return BAD(e, "response_format.type",
                   "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    const char *ty = json_string_value(t);
    if (!strcmp(ty, "text")) return true;
    if (!strcmp(ty, "json_object"))
        return compile(KILN_GRAMMAR_JSON_OBJECT, NULL, 0, "response_format", out, e);
    if (!strcmp(ty, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        if (!json_is_object(js))
            return BAD(e, "response_format.json_schema",
                       "'response_format.json_schema' must be an object {\"name\", \"schema\", "
                       "\"strict\"}");
        json_t *name = json_object_get(js, "name");
        if (name && !json_is_string(name))
            return BAD(e, "response_format.json_schema.name",
                       "'response_format.json_schema.name' must be a string");
        json_t *strict = json_object_get(js, "strict");
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return BAD(e, "response_format.json_schema.strict",
                       "'response_format.json_schema.strict' must be a boolean");
        json_t *schema = json_object_get(js, "schema");
        if (!schema || json_is_null(schema)) /* no schema: any JSON value */
            return compile(KILN_GRAMMAR_JSON_SCHEMA, "{}", 2, "response_format.json_schema.schema",
                           out, e);
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return BAD(e, "response_format.json_schema.schema",
                       "'response_format.json_schema.schema' must be an object");
        return schema_value(schema, "response_format.json_schema.schema", out, e);
    }
    return BAD(e, "response_format.type",
               "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got "
               "\"%.100s\")",
               ty);
}

bool srv_structured_parse(const json_t *root, kiln_grammar **out, srv_error *e) {
    *out = NULL;
    static const char *const fields[] = {"response_format", "grammar", "guided_json",
                                         "guided_regex", "guided_choice", "guided_grammar"};
    const char *first = NULL;
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        json_t *v = given(root, fields[i]);
        if (!v) continue;
        if (i == 0 && json_is_object(v)) { /* response_format text constrains nothing */
            json_t *t = json_object_get(v, "type");
            if (json_is_string(t) && !strcmp(json_string_value(t), "text")) continue;
        }
        if (first)
            return BAD(e, fields[i],
                       "'%s' and '%s' both constrain the output; give only one", first, fields[i]);
        first = fields[i];
    }
    json_t *v;
    if ((v = given(root, "response_format"))) {
        if (!response_format(v, out, e)) return false;
        if (*out) return true;
    }
    if ((v = given(root, "grammar")) || (v = given(root, "guided_grammar"))) {
        const char *param = given(root, "grammar") ? "grammar" : "guided_grammar";
        if (!json_is_string(v)) return BAD(e, param, "'%s' must be a string (GBNF)", param);
        return compile(KILN_GRAMMAR_GBNF, json_string_value(v), json_string_length(v), param, out, e);
    }
    if ((v = given(root, "guided_json"))) return schema_value(v, "guided_json", out, e);
    if ((v = given(root, "guided_regex"))) {
        if (!json_is_string(v)) return BAD(e, "guided_regex", "'guided_regex' must be a string");
        if (json_string_length(v) == 0) return BAD(e, "guided_regex", "'guided_regex' is empty");
        return compile(KILN_GRAMMAR_REGEX, json_string_value(v), json_string_length(v),
                       "guided_regex", out, e);
    }
    if ((v = given(root, "guided_choice"))) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return BAD(e, "guided_choice", "'guided_choice' must be a non-empty array of strings");
        size_t n = json_array_size(v);
        const char **c = calloc(n, sizeof *c);
        if (!c) return SRVERR(e, "guided_choice", "out of memory");
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_array_get(v, i);
            if (!json_is_string(s) || json_string_length(s) == 0 ||
                strlen(json_string_value(s)) != json_string_length(s)) {
                free(c);
                return BAD(e, "guided_choice",
                           "'guided_choice[%zu]' must be a non-empty string without NUL", i);
            }
            c[i] = json_string_value(s);
        }
        kiln_error err;
        memset(&err, 0, sizeof err);
        kiln_status st = kiln_grammar_from_choices(c, (int32_t)n, out, &err);
        free(c);
        if (st) return BAD(e, "guided_choice", "invalid 'guided_choice': %s", err.message);
        return true;
    }
    return true;
}
