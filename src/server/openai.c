/*
 * openai.c - OpenAI request parsing/validation and response building (see openai.h).
 */
#include "server/openai.h"
#include "server/structured.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool srv_fail(srv_error *e, int http_status, const char *type, const char *code, const char *param,
              const char *fmt, ...) {
    if (!e) return false;
    e->http_status = http_status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(e, param, ...) srv_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

char *srv_json_dump(const json_t *j, size_t *len) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (s && len) *len = strlen(s);
    return s;
}

/* A JSON string of s[0..n), invalid UTF-8 repaired. */
static json_t *str_json(const char *s, size_t n) {
    json_t *j = json_stringn(s ? s : "", s ? n : 0);
    if (j) return j;
    srv_buf b = {0};
    if (srv_utf8_repair(s, n, &b)) j = json_stringn(b.p, b.len);
    srv_buf_free(&b);
    return j;
}

char *srv_error_json(const srv_error *e, size_t *len) {
    json_t *o = json_object();
    json_t *in = json_object();
    if (!o || !in) {
        json_decref(o);
        json_decref(in);
        return NULL;
    }
    json_object_set_new(in, "message", str_json(e->message, strlen(e->message)));
    json_object_set_new(in, "type", json_string(e->type ? e->type : "server_error"));
    json_object_set_new(in, "param",
                        e->param[0] ? str_json(e->param, strlen(e->param)) : json_null());
    json_object_set_new(in, "code", e->code ? json_string(e->code) : json_null());
    json_object_set_new(o, "error", in);
    char *s = srv_json_dump(o, len);
    json_decref(o);
    return s;
}

/* ------------------------------------------------------------------------------------ */
/* Field readers. A field that is absent or JSON null is "not given" (false, no error).   */

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

static json_t *field(const json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* *out = value; false + error on wrong type or out of [lo, hi]. *given = present. */
static bool get_number(const json_t *root, const char *key, double lo, double hi, bool lo_open,
                       double *out, bool *given, srv_error *e) {
    json_t *v = field(root, key);
    *given = v != NULL;
    if (!v) return true;
    if (!json_is_number(v))
        return BAD(e, key, "'%s' must be a number (got %s)", key, json_type_name(v));
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return BAD(e, key, "'%s' must be in %c%g, %g] (got %g)", key, lo_open ? '(' : '[', lo, hi,
                   x);
    *out = x;
    return true;
}

static bool get_int(const json_t *root, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    bool *given, srv_error *e) {
    json_t *v = field(root, key);
    *given = v != NULL;
    if (!v) return true;
    if (!json_is_integer(v))
        return BAD(e, key, "'%s' must be an integer (got %s)", key, json_type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return BAD(e, key, "'%s' must be in [%lld, %lld] (got %lld)", key, (long long)lo,
                   (long long)hi, (long long)x);
    *out = x;
    return true;
}

static bool get_bool(const json_t *root, const char *key, bool *out, bool *given, srv_error *e) {
    json_t *v = field(root, key);
    *given = v != NULL;
    if (!v) return true;
    if (!json_is_boolean(v))
        return BAD(e, key, "'%s' must be a boolean (got %s)", key, json_type_name(v));
    *out = json_is_true(v);
    return true;
}

/* ------------------------------------------------------------------------------------ */
/* Prompt (completions) and messages (chat).                                             */

static bool parse_id_array(const json_t *arr, const char *param, int32_t n_vocab, srv_gen *g,
                           srv_error *e) {
    size_t n = json_array_size(arr);
    if (n == 0) return BAD(e, param, "'%s' must not be an empty token array", param);
    if (n > (size_t)INT32_MAX / 4) return BAD(e, param, "'%s' has too many tokens", param);
    g->prompt_ids = malloc(n * sizeof *g->prompt_ids);
    if (!g->prompt_ids)
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory (prompt)");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(arr, i);
        if (!json_is_integer(t))
            return BAD(e, param,
                       "'%s' must be a string or an array of token ids (element %zu "
                       "is %s)",
                       param, i, json_type_name(t));
        json_int_t id = json_integer_value(t);
        if (id < 0 || id >= n_vocab)
            return BAD(e, param, "'%s' token id %lld at index %zu is outside [0, %d)", param,
                       (long long)id, i, n_vocab);
        g->prompt_ids[i] = (int32_t)id;
    }
    g->n_prompt_ids = (int32_t)n;
    return true;
}

/* One prompt: a string or a token array (param names it in errors). */
static bool use_prompt(const json_t *p, const char *param, int32_t n_vocab, srv_gen *g,
                       srv_error *e) {
    free(g->prompt_ids);
    g->prompt_ids = NULL;
    g->n_prompt_ids = 0;
    g->prompt_text = NULL;
    g->prompt_len = 0;
    if (json_is_string(p)) {
        g->prompt_text = json_string_value(p);
        g->prompt_len = json_string_length(p);
        return true;
    }
    if (json_is_array(p)) return parse_id_array(p, param, n_vocab, g, e);
    return BAD(e, param, "'%s' must be a string or an array of token ids (got %s)", param,
               json_type_name(p));
}

/* OpenAI's four prompt shapes: a string, an array of token ids, an array of strings, an array
 * of token arrays (the last two: a batch, one prompt per element, each giving n choices). */
static bool parse_prompt(const json_t *root, int32_t n_vocab, srv_gen *g, srv_error *e) {
    json_t *p = field(root, "prompt");
    if (!p) return BAD(e, "prompt", "'prompt' is required");
    g->n_prompts = 1;
    if (json_is_string(p)) return use_prompt(p, "prompt", n_vocab, g, e);
    if (!json_is_array(p))
        return BAD(e, "prompt", "'prompt' must be a string or an array (got %s)",
                   json_type_name(p));
    size_t n = json_array_size(p);
    if (n == 0) return BAD(e, "prompt", "'prompt' must not be empty");
    json_t *first = json_array_get(p, 0);
    if (json_is_integer(first)) return parse_id_array(p, "prompt", n_vocab, g, e);
    if (n > SRV_MAX_PROMPTS)
        return BAD(e, "prompt", "'prompt' holds %zu prompts; at most %d per request", n,
                   SRV_MAX_PROMPTS);
    for (size_t i = 0; i < n; i++) {
        json_t *pi = json_array_get(p, i);
        char param[32];
        snprintf(param, sizeof param, "prompt[%zu]", i);
        if (!json_is_string(pi) && !json_is_array(pi))
            return BAD(e, "prompt",
                       "'prompt' must be a string, an array of token ids, or a list of "
                       "those (element %zu is %s)",
                       i, json_type_name(pi));
        if (!use_prompt(pi, param, n_vocab, g, e)) return false; /* validates every one */
    }
    g->prompt_batch = p;
    g->n_prompts = (int32_t)n;
    return use_prompt(first, "prompt[0]", n_vocab, g, e);
}

bool srv_gen_use_prompt(srv_gen *g, int32_t i, int32_t n_vocab, srv_error *e) {
    if (!g->prompt_batch) return i == 0;
    char param[32];
    snprintf(param, sizeof param, "prompt[%d]", i);
    return use_prompt(json_array_get(g->prompt_batch, (size_t)i), param, n_vocab, g, e);
}

static bool known_role(const char *r) {
    static const char *const roles[] = {"system",    "developer", "user",
                                        "assistant", "tool",      "function"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(r, roles[i])) return true;
    return false;
}

static bool parse_messages(const json_t *root, srv_gen *g, srv_error *e) {
    json_t *ms = field(root, "messages");
    if (!ms) return BAD(e, "messages", "'messages' is required");
    if (!json_is_array(ms))
        return BAD(e, "messages", "'messages' must be an array (got %s)", json_type_name(ms));
    if (json_array_size(ms) == 0)
        return BAD(e, "messages", "'messages' must contain at least one message");
    g->messages = json_array();
    if (!g->messages) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    char param[64];
    for (size_t i = 0; i < json_array_size(ms); i++) {
        json_t *m = json_array_get(ms, i);
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m))
            return BAD(e, param, "'%s' must be an object (got %s)", param, json_type_name(m));
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role) return BAD(e, param, "'%s' is required", param);
        if (!json_is_string(role))
            return BAD(e, param, "'%s' must be a string (got %s)", param, json_type_name(role));
        const char *r = json_string_value(role);
        if (!known_role(r))
            return BAD(e, param,
                       "'%s' is '%.64s', which is not a known role (system, developer, user, "
                       "assistant, tool)",
                       param, r);
        json_t *c = json_object_get(m, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        json_t *content = NULL;
        if (!c || json_is_null(c)) {
            bool may_omit = !strcmp(r, "assistant") && json_object_get(m, "tool_calls");
            if (!may_omit && strcmp(r, "assistant") != 0)
                return BAD(e, param, "'%s' is required", param);
            content = may_omit ? json_null() : json_string("");
        } else if (json_is_string(c)) {
            content = json_incref(c);
        } else if (json_is_array(c)) {
            srv_buf b = {0};
            srv_buf_add(&b, "", 0);
            for (size_t k = 0; k < json_array_size(c); k++) {
                json_t *part = json_array_get(c, k);
                json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
                json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
                snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
                if (!json_is_string(type)) {
                    srv_buf_free(&b);
                    return BAD(e, param, "'%s' must be an object with a string 'type'", param);
                }
                if (strcmp(json_string_value(type), "text") != 0) {
                    srv_buf_free(&b);
                    return BAD(e, param, "content part type '%.64s' is not supported (only 'text')",
                               json_string_value(type));
                }
                if (!json_is_string(text)) {
                    srv_buf_free(&b);
                    return BAD(e, param, "'%s.text' must be a string", param);
                }
                if (k > 0) srv_buf_add(&b, "\n", 1);
                srv_buf_add(&b, json_string_value(text), json_string_length(text));
            }
            content = b.oom ? NULL : json_stringn(b.p, b.len);
            srv_buf_free(&b);
            if (!content) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        } else {
            return BAD(e, param, "'%s' must be a string or an array of content parts (got %s)",
                       param, json_type_name(c));
        }
        json_t *copy = json_copy(m); /* shallow: other keys (name, tool_calls...) shared */
        if (!copy) {
            json_decref(content);
            return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        json_object_set_new(copy, "content", content);
        if (!strcmp(r, "developer")) json_object_set_new(copy, "role", json_string("system"));
        json_array_append_new(g->messages, copy);
    }
    return true;
}

/* ------------------------------------------------------------------------------------ */

static bool parse_stop(const json_t *root, srv_gen *g, srv_error *e) {
    json_t *s = field(root, "stop");
    if (!s) return true;
    if (json_is_string(s)) {
        if (json_string_length(s) > 0 && !memchr(json_string_value(s), 0, json_string_length(s)))
            g->stop[g->req.n_stop++] = json_string_value(s);
        return true;
    }
    if (!json_is_array(s))
        return BAD(e, "stop", "'stop' must be a string or an array of strings (got %s)",
                   json_type_name(s));
    if (json_array_size(s) > KILN_MAX_STOP_STRINGS)
        return BAD(e, "stop", "'stop' may hold at most %d strings (got %zu)", KILN_MAX_STOP_STRINGS,
                   json_array_size(s));
    for (size_t i = 0; i < json_array_size(s); i++) {
        json_t *x = json_array_get(s, i);
        if (!json_is_string(x))
            return BAD(e, "stop",
                       "'stop' must be a string or an array of strings (element %zu "
                       "is %s)",
                       i, json_type_name(x));
        if (memchr(json_string_value(x), 0, json_string_length(x)))
            return BAD(e, "stop", "'stop' strings must not contain NUL characters");
        /* An empty stop string can never end a generation: skip it. */
        if (json_string_length(x) > 0) g->stop[g->req.n_stop++] = json_string_value(x);
    }
    return true;
}

static bool parse_logit_bias(const json_t *root, int32_t n_vocab, srv_gen *g, srv_error *e) {
    json_t *b = field(root, "logit_bias");
    if (!b) return true;
    if (!json_is_object(b))
        return BAD(e, "logit_bias",
                   "'logit_bias' must be an object mapping token ids to "
                   "numbers (got %s)",
                   json_type_name(b));
    size_t n = json_object_size(b);
    if (n == 0) return true;
    g->bias_ids = malloc(n * sizeof *g->bias_ids);
    g->bias_values = malloc(n * sizeof *g->bias_values);
    if (!g->bias_ids || !g->bias_values)
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory (logit_bias)");
    const char *key;
    json_t *v;
    int32_t k = 0;
    json_object_foreach(b, key, v) {
        char *end = NULL;
        long long id = strtoll(key, &end, 10);
        if (!key[0] || *end || key[0] == '+' || key[0] == ' ' || id < 0 || id >= n_vocab)
            return BAD(e, "logit_bias", "'logit_bias' key '%.32s' is not a token id in [0, %d)",
                       key, n_vocab);
        if (!json_is_number(v))
            return BAD(e, "logit_bias",
                       "'logit_bias' value for token %lld must be a number "
                       "(got %s)",
                       id, json_type_name(v));
        double x = json_number_value(v);
        if (!(x >= -100 && x <= 100))
            return BAD(e, "logit_bias",
                       "'logit_bias' value for token %lld must be in "
                       "[-100, 100] (got %g)",
                       id, x);
        g->bias_ids[k] = (int32_t)id;
        /* OpenAI: -100 "should result in a ban or exclusive selection". */
        g->bias_values[k] = x <= -100 ? -INFINITY : (float)x;
        k++;
    }
    g->req.n_logit_bias = k;
    g->req.logit_bias_ids = g->bias_ids;
    g->req.logit_bias_values = g->bias_values;
    return true;
}

static bool parse_sampling(const json_t *root, int32_t n_vocab, const kiln_generation_defaults *gd,
                           srv_gen *g, srv_error *e) {
    kiln_request *r = &g->req;
    double x;
    int64_t i;
    bool given;

    /* Model defaults (generation_config.json) first, each only when valid for the engine. */
    if (gd) {
        if (gd->has_temperature && gd->temperature >= 0 && gd->temperature <= 2)
            r->temperature = gd->temperature;
        if (gd->has_do_sample && !gd->do_sample) r->temperature = 0;
        if (gd->has_top_p && gd->top_p > 0 && gd->top_p <= 1) r->top_p = gd->top_p;
        if (gd->has_top_k && gd->top_k >= 0) r->top_k = gd->top_k;
        if (gd->has_min_p && gd->min_p >= 0 && gd->min_p <= 1) r->min_p = gd->min_p;
        if (gd->has_repetition_penalty && gd->repetition_penalty > 0)
            r->repetition_penalty = gd->repetition_penalty;
    }

    if (!get_number(root, "temperature", 0, 2, false, &x, &given, e)) return false;
    if (given) r->temperature = (float)x;
    if (!get_number(root, "top_p", 0, 1, true, &x, &given, e)) return false;
    if (given) r->top_p = (float)x;
    if (!get_int(root, "top_k", -1, INT32_MAX, &i, &given, e)) return false;
    if (given) r->top_k = i < 0 ? 0 : (int32_t)i; /* vLLM: -1 = off */
    if (!get_number(root, "min_p", 0, 1, false, &x, &given, e)) return false;
    if (given) r->min_p = (float)x;
    /* XTC under llama.cpp server's names */
    if (!get_number(root, "xtc_probability", 0, 1, false, &x, &given, e)) return false;
    if (given) r->xtc_probability = (float)x;
    if (!get_number(root, "xtc_threshold", 0, 1, false, &x, &given, e)) return false;
    if (given) r->xtc_threshold = (float)x;
    if (!get_number(root, "presence_penalty", -2, 2, false, &x, &given, e)) return false;
    if (given) r->presence_penalty = (float)x;
    if (!get_number(root, "frequency_penalty", -2, 2, false, &x, &given, e)) return false;
    if (given) r->frequency_penalty = (float)x;
    if (!get_number(root, "repetition_penalty", 0, 100, true, &x, &given, e)) return false;
    if (given) r->repetition_penalty = (float)x;

    json_t *seed = field(root, "seed");
    if (seed) {
        if (!json_is_integer(seed))
            return BAD(e, "seed", "'seed' must be an integer (got %s)", json_type_name(seed));
        r->seed = (uint64_t)json_integer_value(seed);
    } else {
        r->seed = srv_random_u64();
    }

    /* max_completion_tokens supersedes max_tokens (OpenAI). */
    int64_t mt = 0;
    bool mt_given = false, mct_given = false;
    if (!get_int(root, "max_tokens", 1, INT32_MAX, &mt, &mt_given, e)) return false;
    if (mt_given) r->max_tokens = (int32_t)mt;
    if (!get_int(root, "max_completion_tokens", 1, INT32_MAX, &mt, &mct_given, e)) return false;
    if (mct_given) r->max_tokens = (int32_t)mt;
    g->max_tokens_set = mt_given || mct_given;

    if (!parse_stop(root, g, e)) return false;
    r->stop = g->stop;
    if (!parse_logit_bias(root, n_vocab, g, e)) return false;

    bool b;
    if (!get_bool(root, "ignore_eos", &b, &given, e)) return false;
    if (given) r->ignore_eos = b;
    json_t *sti = field(root, "stop_token_ids");
    if (sti) {
        if (!json_is_array(sti))
            return BAD(e, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        if (json_array_size(sti) > 64)
            return BAD(e, "stop_token_ids", "'stop_token_ids' may hold at most 64 ids (got %zu)",
                       json_array_size(sti));
        for (size_t k = 0; k < json_array_size(sti); k++) {
            json_t *t = json_array_get(sti, k);
            if (!json_is_integer(t) || json_integer_value(t) < 0 ||
                json_integer_value(t) >= n_vocab)
                return BAD(e, "stop_token_ids",
                           "'stop_token_ids' element %zu is not a token id in [0, %d)", k, n_vocab);
            g->stop_ids[k] = (int32_t)json_integer_value(t);
        }
        r->n_stop_token_ids = (int32_t)json_array_size(sti);
        r->stop_token_ids = g->stop_ids;
    }
    return true;
}

/* ------------------------------------------------------------------------------------ */
/* Speculation, prediction and fill (issue 18).                                          */

/* A value for an error message: a string's text (cut), else its JSON type. */
static const char *got_value(const json_t *v, char *buf, size_t cap) {
    if (json_is_string(v))
        snprintf(buf, cap, "\"%.64s\"", json_string_value(v));
    else
        snprintf(buf, cap, "%s", v ? json_type_name(v) : "nothing");
    return buf;
}

/* OpenAI's Predicted Outputs: "prediction": {"type": "content", "content": string | [{"type":
 * "text", "text": string}, ...]}. Text parts are concatenated as they are (they are pieces of
 * one expected output, not separate messages). Maps to req.prediction/prediction_len. */
static bool parse_prediction(const json_t *root, srv_gen *g, srv_error *e) {
    json_t *p = field(root, "prediction");
    if (!p) return true;
    char got[96];
    if (!json_is_object(p))
        return BAD(e, "prediction",
                   "prediction must be an object {\"type\": \"content\", \"content\": ...} "
                   "(got %s)",
                   json_type_name(p));
    json_t *type = json_object_get(p, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "content") != 0)
        return BAD(e, "prediction.type", "prediction.type must be \"content\" (got %s)",
                   got_value(type, got, sizeof got));
    json_t *c = json_object_get(p, "content");
    if (json_is_string(c)) {
        g->req.prediction = json_string_value(c);
        g->req.prediction_len = json_string_length(c);
    } else if (json_is_array(c)) {
        srv_buf *b = &g->prediction_buf;
        srv_buf_add(b, "", 0);
        for (size_t k = 0; k < json_array_size(c); k++) {
            json_t *part = json_array_get(c, k);
            json_t *pt = json_is_object(part) ? json_object_get(part, "type") : NULL;
            json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
            char param[48];
            snprintf(param, sizeof param, "prediction.content[%zu]", k);
            if (!json_is_string(pt) || strcmp(json_string_value(pt), "text") != 0)
                return BAD(e, param, "%s must be a text part {\"type\": \"text\", \"text\": ...}",
                           param);
            if (!json_is_string(text))
                return BAD(e, param, "%s.text must be a string (got %s)", param,
                           got_value(text, got, sizeof got));
            srv_buf_add(b, json_string_value(text), json_string_length(text));
        }
        if (b->oom) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        g->req.prediction = b->p;
        g->req.prediction_len = b->len;
    } else {
        return BAD(e, "prediction.content",
                   "prediction.content must be a string or an array of text parts (got %s)",
                   c ? json_type_name(c) : "nothing");
    }
    g->has_prediction = true;
    return true;
}

/* kiln's "fill": {"content": string, "policy": "assert" | "verify"}: the output begins with
 * content, forced (assert, the default) or verified as a prediction of the output's start. */
static bool parse_fill(const json_t *root, srv_gen *g, srv_error *e) {
    json_t *f = field(root, "fill");
    if (!f) return true;
    char got[96];
    if (!json_is_object(f))
        return BAD(e, "fill",
                   "fill must be an object {\"content\": string, \"policy\": \"assert\" | "
                   "\"verify\"} (got %s)",
                   json_type_name(f));
    json_t *c = json_object_get(f, "content");
    if (!json_is_string(c))
        return BAD(e, "fill.content", "fill.content must be a string (got %s)",
                   c ? json_type_name(c) : "nothing");
    json_t *pol = field(f, "policy");
    g->req.fill_policy = KILN_FILL_ASSERT;
    if (pol) {
        const char *s = json_is_string(pol) ? json_string_value(pol) : NULL;
        if (s && !strcmp(s, "assert"))
            g->req.fill_policy = KILN_FILL_ASSERT;
        else if (s && !strcmp(s, "verify"))
            g->req.fill_policy = KILN_FILL_VERIFY;
        else
            return BAD(e, "fill.policy", "fill.policy must be \"assert\" or \"verify\" (got %s)",
                       got_value(pol, got, sizeof got));
    }
    g->req.fill = json_string_value(c);
    g->req.fill_len = json_string_length(c);
    g->has_fill = true;
    return true;
}

/* kiln's "speculation": false (off for this request), true (the server's default), or
 * {"source": "default"|"off"|"ngram"|"draft"|"random", "k": 1..32, "accept":
 * "exact"|"rejection"}, each optional. Maps to req.spec, spec_k, spec_accept. */
static bool parse_speculation(const json_t *root, srv_gen *g, srv_error *e) {
    json_t *s = field(root, "speculation");
    if (!s) return true;
    char got[96];
    if (json_is_boolean(s)) {
        if (!json_is_true(s)) g->req.spec = KILN_SPEC_OFF;
        return true;
    }
    if (!json_is_object(s))
        return BAD(e, "speculation",
                   "speculation must be false or an object {\"source\", \"k\", \"accept\"} (got "
                   "%s)",
                   json_type_name(s));
    static const struct {
        const char *name;
        kiln_spec_source v;
    } sources[] = {{"default", KILN_SPEC_DEFAULT}, {"off", KILN_SPEC_OFF},
                   {"ngram", KILN_SPEC_NGRAM},     {"draft", KILN_SPEC_DRAFT},
                   {"random", KILN_SPEC_RANDOM}};
    json_t *src = field(s, "source");
    if (src) {
        size_t i = 0, n = sizeof sources / sizeof sources[0];
        while (i < n && !(json_is_string(src) && !strcmp(json_string_value(src), sources[i].name)))
            i++;
        if (i == n)
            return BAD(e, "speculation.source",
                       "speculation.source must be \"default\", \"off\", \"ngram\", \"draft\" or "
                       "\"random\" (got %s)",
                       got_value(src, got, sizeof got));
        g->req.spec = sources[i].v;
    }
    json_t *k = field(s, "k");
    if (k) {
        if (!json_is_integer(k) || json_integer_value(k) < 1 ||
            json_integer_value(k) > KILN_MAX_SPEC_K) {
            if (json_is_integer(k))
                snprintf(got, sizeof got, "%lld", (long long)json_integer_value(k));
            else
                got_value(k, got, sizeof got);
            return BAD(e, "speculation.k", "speculation.k must be an integer in [1, %d] (got %s)",
                       KILN_MAX_SPEC_K, got);
        }
        g->req.spec_k = (int32_t)json_integer_value(k);
    }
    json_t *acc = field(s, "accept");
    if (acc) {
        const char *a = json_is_string(acc) ? json_string_value(acc) : NULL;
        if (a && !strcmp(a, "exact"))
            g->req.spec_accept = KILN_SPEC_ACCEPT_EXACT;
        else if (a && !strcmp(a, "rejection"))
            g->req.spec_accept = KILN_SPEC_ACCEPT_REJECTION;
        else
            return BAD(e, "speculation.accept",
                       "speculation.accept must be \"exact\" or \"rejection\" (got %s)",
                       got_value(acc, got, sizeof got));
    }
    return true;
}

/* Chat assistant prefill (see srv_gen.prefill): the last message, when it is the assistant's
 * with string or text-part content and no tool_calls, is taken out of g->messages. */
static bool take_prefill(const json_t *root, bool agp_given, srv_gen *g, srv_error *e) {
    json_t *ms = field(root, "messages");
    size_t n = json_array_size(g->messages);
    if (n == 0 || (agp_given && !g->add_generation_prompt)) return true;
    json_t *orig = json_array_get(ms, json_array_size(ms) - 1);
    json_t *role = json_object_get(orig, "role");
    json_t *c = json_object_get(orig, "content");
    json_t *calls = json_object_get(orig, "tool_calls");
    if (!json_is_string(role) || strcmp(json_string_value(role), "assistant") != 0) return true;
    if (!(json_is_string(c) || json_is_array(c)) || (calls && !json_is_null(calls))) return true;
    json_t *norm = json_object_get(json_array_get(g->messages, n - 1), "content");
    if (!json_is_string(norm)) return true;
    if (g->has_fill)
        return BAD(e, "fill",
                   "fill cannot be combined with a final assistant message: that message is "
                   "already continued (put the text in the message, or drop it)");
    g->prefill = json_incref(norm);
    if (json_array_remove(g->messages, n - 1) != 0) {
        json_decref(g->prefill);
        g->prefill = NULL;
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    g->add_generation_prompt = true;
    return true;
}

static bool parse_spec_fields(const json_t *root, srv_gen *g, srv_error *e) {
    if (!parse_speculation(root, g, e) || !parse_prediction(root, g, e) ||
        !parse_fill(root, g, e))
        return false;
    if (g->has_fill && g->req.fill_policy == KILN_FILL_VERIFY && g->has_prediction)
        return BAD(e, "fill",
                   "a fill with policy \"verify\" is a prediction of the output's start: it "
                   "cannot be combined with prediction");
    return true;
}

bool srv_gen_check_engine(const srv_gen *g, bool has_draft, srv_error *e) {
    if (g->req.spec == KILN_SPEC_DRAFT && !has_draft)
        return BAD(e, "speculation.source",
                   "speculation.source \"draft\" needs a server started with --draft-model");
    return true;
}

static bool parse_output(const json_t *root, srv_gen *g, srv_error *e) {
    bool given, b;
    int64_t i;
    g->n = 1;
    if (!get_int(root, "n", 1, KILN_MAX_CHOICES, &i, &given, e)) return false;
    if (given) g->n = (int32_t)i;
    if (!get_bool(root, "stream", &b, &given, e)) return false;
    g->stream = given && b;
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return BAD(e, "stream_options", "'stream_options' must be an object (got %s)",
                       json_type_name(so));
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu) && !json_is_boolean(iu))
            return BAD(e, "stream_options.include_usage",
                       "'stream_options.include_usage' must be a boolean (got %s)",
                       json_type_name(iu));
        g->include_usage = g->stream && json_is_true(iu);
    }

    if (g->kind == SRV_COMPLETION) {
        /* logprobs: an integer, the number of alternatives (OpenAI allows up to 5). */
        if (!get_int(root, "logprobs", 0, KILN_MAX_TOP_LOGPROBS, &i, &given, e)) return false;
        if (given) {
            g->logprobs = true;
            g->top_logprobs = (int32_t)i;
        }
        if (!get_bool(root, "echo", &b, &given, e)) return false;
        g->echo = given && b;
        /* echo with logprobs: the prompt's tokens' logprobs too (the engine's prompt logprobs) */
        g->req.prompt_logprobs = g->echo && g->logprobs;
        g->req.top_prompt_logprobs = g->req.prompt_logprobs ? g->top_logprobs : 0;
        if (!get_int(root, "best_of", INT64_MIN, INT64_MAX, &i, &given, e)) return false;
        if (given && i != 1)
            return BAD(e, "best_of", "'best_of' must be 1 (got %lld)", (long long)i);
        json_t *suffix = field(root, "suffix");
        if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
            return BAD(e, "suffix", "'suffix' is not supported");
    } else {
        if (!get_bool(root, "logprobs", &b, &given, e)) return false;
        g->logprobs = given && b;
        if (!get_int(root, "top_logprobs", 0, KILN_MAX_TOP_LOGPROBS, &i, &given, e)) return false;
        if (given) {
            if (!g->logprobs && i > 0)
                return BAD(e, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
            g->top_logprobs = (int32_t)i;
        }
    }
    g->req.logprobs = g->logprobs;
    g->req.top_logprobs = g->logprobs ? g->top_logprobs : 0;
    return true;
}

bool srv_gen_parse(srv_kind kind, const char *body, size_t len, int32_t n_vocab,
                   const kiln_generation_defaults *gd, srv_gen *g, srv_error *e) {
    memset(g, 0, sizeof *g);
    g->kind = kind;
    g->req = kiln_request_defaults();
    g->req.max_tokens = 0; /* decided later when not given */
    json_error_t je;
    g->root = json_loadb(body ? body : "", len, 0, &je);
    if (!g->root)
        return BAD(e, NULL, "the request body is not valid JSON: %s (line %d, column %d)", je.text,
                   je.line, je.column);
    if (!json_is_object(g->root))
        return BAD(e, NULL, "the request body must be a JSON object (got %s)",
                   json_type_name(g->root));
    const json_t *root = g->root;
    bool given, b, agp_given = false;
    if (kind == SRV_COMPLETION) {
        if (!parse_prompt(root, n_vocab, g, e)) return false;
        g->add_special = true;
    } else {
        if (!parse_messages(root, g, e)) return false;
        g->add_special = false;
        if (!srv_tools_parse(root, &g->tc, e) ||
            !srv_tools_check_messages(field(root, "messages"), e))
            return false;
        g->tools = g->tc.choice != SRV_TOOLS_NONE ? (json_t *)g->tc.tools : NULL;
        json_t *kw = field(root, "chat_template_kwargs");
        if (kw && !json_is_object(kw))
            return BAD(e, "chat_template_kwargs",
                       "'chat_template_kwargs' must be an object "
                       "(got %s)",
                       json_type_name(kw));
        g->template_kwargs = kw;
        g->add_generation_prompt = true;
        if (!get_bool(root, "add_generation_prompt", &b, &agp_given, e)) return false;
        if (agp_given) g->add_generation_prompt = b;
    }
    if (!get_bool(root, "add_special_tokens", &b, &given, e)) return false;
    if (given) g->add_special = b;
    if (!parse_sampling(root, n_vocab, gd, g, e)) return false;
    if (!parse_output(root, g, e)) return false;
    /* one request's choices (prompts x n) are bounded together, as n alone is */
    if ((int64_t)g->n_prompts * g->n > KILN_MAX_CHOICES)
        return BAD(e, "n",
                   "%d prompts x 'n' %d make %lld choices; at most %d per request (prompts "
                   "times n)",
                   g->n_prompts, g->n, (long long)g->n_prompts * g->n, KILN_MAX_CHOICES);
    if (!parse_spec_fields(root, g, e)) return false;
    if (kind == SRV_CHAT && !take_prefill(root, agp_given, g, e)) return false;
    if (!srv_structured_parse(root, &g->grammar, e)) return false;
    g->req.grammar = g->grammar;
    return true;
}

void srv_gen_free(srv_gen *g) {
    if (!g) return;
    json_decref(g->messages);
    json_decref(g->prefill);
    json_decref(g->root);
    srv_buf_free(&g->prediction_buf);
    kiln_grammar_destroy(g->grammar);
    free(g->prompt_ids);
    free(g->bias_ids);
    free(g->bias_values);
    memset(g, 0, sizeof *g);
}

/* ------------------------------------------------------------------------------------ */
/* Responses.                                                                            */

/* finish_reason of a response: "tool_calls" for a reply that stopped after tool calls. */
static const char *finish_of(const srv_resp_info *ri, kiln_finish_reason r) {
    bool calls = ri->n_tool_calls > 0 || (ri->tool_calls && json_array_size(ri->tool_calls) > 0);
    return calls && r == KILN_FINISH_STOP ? "tool_calls" : srv_finish_reason(r);
}

const char *srv_finish_reason(kiln_finish_reason r) {
    switch (r) {
    case KILN_FINISH_STOP:
        return "stop";
    case KILN_FINISH_LENGTH:
        return "length";
    default:
        return "abort";
    }
}

/* JSON can hold no infinity: OpenAI reports impossible tokens as -9999. */
static json_t *lp_json(float lp) {
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

/* OpenAI's usage object: prompt_tokens counts every prompt token, the cached ones
 * included; prompt_tokens_details.cached_tokens says how many of them came from the prefix
 * cache (the engine's kiln_usage.cached_tokens). */
/* completion_tokens_details holds OpenAI's Predicted Outputs counts (a prediction token is
 * accepted when an output token was aligned to it, rejected otherwise: kiln_usage); kiln's
 * "speculation" the engine's draft, verify and fill counters for this request. */
static json_t *usage_json(const kiln_usage *u) {
    return json_pack(
        "{s:i, s:i, s:i, s:{s:i}, s:{s:i, s:i}, s:{s:i, s:i, s:i, s:i}}", "prompt_tokens",
        u->prompt_tokens, "completion_tokens", u->completion_tokens, "total_tokens",
        u->prompt_tokens + u->completion_tokens, "prompt_tokens_details", "cached_tokens",
        u->cached_tokens > 0 ? u->cached_tokens : 0, "completion_tokens_details",
        "accepted_prediction_tokens", u->accepted_prediction_tokens, "rejected_prediction_tokens",
        u->rejected_prediction_tokens, "speculation", "drafted_tokens", u->spec_drafted,
        "accepted_tokens", u->spec_accepted, "verify_steps", u->spec_verify_steps, "fill_tokens",
        u->fill_tokens);
}

/* The piece of a token: string (repaired) and, optionally, its bytes. */
static json_t *piece_json(const kiln_model *m, int32_t id, json_t **bytes) {
    char buf[256];
    size_t n = m ? kiln_model_token_piece(m, id, buf, sizeof buf) : 0;
    char *p = buf;
    char *heap = NULL;
    if (n > sizeof buf) {
        heap = malloc(n);
        if (!heap) return NULL;
        kiln_model_token_piece(m, id, heap, n);
        p = heap;
    }
    json_t *s = str_json(p, n);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; *bytes && i < n; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)p[i]));
    }
    free(heap);
    return s;
}

static int64_t piece_chars(const kiln_model *m, int32_t id) {
    char buf[256];
    size_t n = m ? kiln_model_token_piece(m, id, buf, sizeof buf) : 0;
    if (n <= sizeof buf) return srv_utf8_count(buf, n);
    char *heap = malloc(n);
    if (!heap) return 0;
    kiln_model_token_piece(m, id, heap, n);
    int64_t c = srv_utf8_count(heap, n);
    free(heap);
    return c;
}

json_t *srv_logprobs_json(const srv_resp_info *ri, const srv_tok *toks, int32_t n,
                          int64_t *text_offset) {
    if (ri->kind == SRV_CHAT) {
        json_t *content = json_array();
        for (int32_t i = 0; content && i < n; i++) {
            json_t *bytes = NULL;
            json_t *tok = piece_json(ri->m, toks[i].token, &bytes);
            json_t *top = json_array();
            for (int32_t k = 0; top && k < toks[i].n_top && k < ri->top_logprobs; k++) {
                json_t *tb = NULL;
                json_t *ts = piece_json(ri->m, toks[i].top[k].token, &tb);
                json_array_append_new(top, json_pack("{s:o?, s:o?, s:o?}", "token", ts, "logprob",
                                                     lp_json(toks[i].top[k].logprob), "bytes", tb));
            }
            json_array_append_new(content, json_pack("{s:o?, s:o?, s:o?, s:o?}", "token", tok,
                                                     "logprob", lp_json(toks[i].logprob), "bytes",
                                                     bytes, "top_logprobs", top));
        }
        return json_pack("{s:o?, s:n}", "content", content, "refusal");
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int32_t i = 0; i < n && tokens && lps && tops && offs; i++) {
        json_array_append_new(tokens, piece_json(ri->m, toks[i].token, NULL));
        if (toks[i].has_offset) /* echo: a prompt token */
            json_array_append_new(offs, json_integer(toks[i].offset));
        if (toks[i].none) { /* echo: the prompt's first token has no predecessor (OpenAI) */
            json_array_append_new(lps, json_null());
            if (ri->top_logprobs > 0) json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, lp_json(toks[i].logprob));
        /* The top alternatives plus the sampled token (OpenAI: up to logprobs + 1). */
        json_t *d = json_object();
        bool has_sampled = false;
        for (int32_t k = 0; d && k < toks[i].n_top && k < ri->top_logprobs; k++) {
            json_t *s = piece_json(ri->m, toks[i].top[k].token, NULL);
            if (s && !json_object_get(d, json_string_value(s)))
                json_object_set_new(d, json_string_value(s), lp_json(toks[i].top[k].logprob));
            json_decref(s);
            if (toks[i].top[k].token == toks[i].token) has_sampled = true;
        }
        if (d && !has_sampled) {
            json_t *s = piece_json(ri->m, toks[i].token, NULL);
            if (s && !json_object_get(d, json_string_value(s)))
                json_object_set_new(d, json_string_value(s), lp_json(toks[i].logprob));
            json_decref(s);
        }
        if (ri->top_logprobs > 0) {
            json_array_append_new(tops, d);
        } else { /* logprobs: 0 asks for no alternatives: OpenAI sends null */
            json_decref(d);
        }
        if (toks[i].has_offset) continue;
        json_array_append_new(offs, json_integer(*text_offset));
        *text_offset += piece_chars(ri->m, toks[i].token);
    }
    if (ri->top_logprobs <= 0) {
        json_decref(tops);
        tops = json_null();
    }
    return json_pack("{s:o?, s:o?, s:o?, s:o?}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *base_object(const srv_resp_info *ri, bool chunk) {
    const char *object = ri->kind == SRV_CHAT
                             ? (chunk ? "chat.completion.chunk" : "chat.completion")
                             : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", ri->id, "object", object, "created",
                     (json_int_t)ri->created, "model", ri->model);
}

/* kiln's token_ids (a model without a tokenizer): the generated ids, or NULL */
static json_t *ids_json(const int32_t *ids, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *choice_json(const srv_choice_out *c) {
    const srv_resp_info *ri = c->ri;
    int64_t off = c->text_offset;
    json_t *lp = ri->logprobs ? srv_logprobs_json(ri, c->toks, c->n_toks, &off) : json_null();
    json_t *choice;
    if (ri->kind == SRV_CHAT) {
        bool calls = ri->tool_calls && json_array_size(ri->tool_calls) > 0;
        choice = json_pack("{s:i, s:{s:s, s:o?}, s:o?, s:s}", "index", (int)ri->index, "message",
                           "role", "assistant", "content",
                           calls && c->text_len == 0 ? json_null() : str_json(c->text, c->text_len),
                           "logprobs", lp, "finish_reason", finish_of(ri, c->finish));
        if (choice && calls)
            json_object_set(json_object_get(choice, "message"), "tool_calls",
                            (json_t *)ri->tool_calls);
    } else {
        choice = json_pack("{s:i, s:o?, s:o?, s:s}", "index", (int)ri->index, "text",
                           str_json(c->text, c->text_len), "logprobs", lp, "finish_reason",
                           srv_finish_reason(c->finish));
    }
    if (choice && ri->token_ids)
        json_object_set_new(choice, "token_ids", ids_json(c->ids, c->n_ids));
    return choice;
}

char *srv_response_json_n(const srv_resp_info *ri, const srv_choice_out *choices, int32_t n,
                          const kiln_usage *usage, size_t *len) {
    json_t *o = base_object(ri, false);
    json_t *arr = json_array();
    if (!o || !arr) {
        json_decref(o);
        json_decref(arr);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) json_array_append_new(arr, choice_json(&choices[i]));
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_json(usage));
    char *s = srv_json_dump(o, len);
    json_decref(o);
    return s;
}

char *srv_response_json(const srv_resp_info *ri, const char *text, size_t text_len,
                        const srv_tok *toks, int32_t n_toks, kiln_finish_reason finish,
                        const kiln_usage *usage, size_t *len) {
    srv_choice_out c = {.ri = ri,
                        .text = text,
                        .text_len = text_len,
                        .toks = toks,
                        .n_toks = n_toks,
                        .finish = finish};
    return srv_response_json_n(ri, &c, 1, usage, len);
}

static bool sse_add(json_t *o, srv_buf *out) {
    if (!o) return false;
    size_t n;
    char *s = srv_json_dump(o, &n);
    json_decref(o);
    if (!s) return false;
    bool ok = srv_buf_adds(out, "data: ") && srv_buf_add(out, s, n) && srv_buf_adds(out, "\n\n");
    free(s);
    return ok;
}

/* A chunk with one choice: chat delta or completion text. */
static bool sse_choice(const srv_resp_info *ri, json_t *delta_or_text, json_t *logprobs,
                       const char *finish, srv_buf *out) {
    json_t *o = base_object(ri, true);
    json_t *choice =
        ri->kind == SRV_CHAT
            ? json_pack("{s:i, s:o?, s:o?, s:s?}", "index", (int)ri->index, "delta",
                        delta_or_text, "logprobs", logprobs ? logprobs : json_null(),
                        "finish_reason", finish)
            : json_pack("{s:i, s:o?, s:o?, s:s?}", "index", (int)ri->index, "text",
                        delta_or_text, "logprobs", logprobs ? logprobs : json_null(),
                        "finish_reason", finish);
    if (!o || !choice) {
        json_decref(o);
        json_decref(choice);
        return false;
    }
    if (!finish) json_object_set_new(choice, "finish_reason", json_null());
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (ri->include_usage) json_object_set_new(o, "usage", json_null());
    return sse_add(o, out);
}

bool srv_sse_role(const srv_resp_info *ri, srv_buf *out) {
    if (ri->kind != SRV_CHAT) return true;
    return sse_choice(ri, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, NULL,
                      out);
}

bool srv_sse_text(const srv_resp_info *ri, const char *text, size_t len, const srv_tok *toks,
                  int32_t n_toks, int64_t *text_offset, srv_buf *out) {
    json_t *lp =
        ri->logprobs && n_toks > 0 ? srv_logprobs_json(ri, toks, n_toks, text_offset) : NULL;
    json_t *t = str_json(text, len);
    json_t *d = ri->kind == SRV_CHAT ? json_pack("{s:o?}", "content", t) : t;
    return sse_choice(ri, d, lp, NULL, out);
}

bool srv_sse_ids(const srv_resp_info *ri, const int32_t *ids, int32_t n, srv_buf *out) {
    json_t *o = base_object(ri, true);
    json_t *choice = json_pack("{s:i, s:s, s:n, s:n, s:o?}", "index", (int)ri->index, "text", "",
                               "logprobs", "finish_reason", "token_ids", ids_json(ids, n));
    if (!o || !choice) {
        json_decref(o);
        json_decref(choice);
        return false;
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (ri->include_usage) json_object_set_new(o, "usage", json_null());
    return sse_add(o, out);
}

bool srv_sse_finish(const srv_resp_info *ri, kiln_finish_reason finish, const srv_tok *toks,
                    int32_t n_toks, int64_t *text_offset, srv_buf *out) {
    json_t *lp =
        ri->logprobs && n_toks > 0 ? srv_logprobs_json(ri, toks, n_toks, text_offset) : NULL;
    json_t *d = ri->kind == SRV_CHAT ? json_object() : json_string("");
    return sse_choice(ri, d, lp, finish_of(ri, finish), out);
}

bool srv_sse_tool_call(const srv_resp_info *ri, int32_t index, const char *id, const char *name,
                       const char *args, size_t args_len, srv_buf *out) {
    json_t *call =
        id ? json_pack("{s:i, s:s, s:s, s:{s:o?, s:s}}", "index", (int)index, "id", id, "type",
                       "function", "function", "name", str_json(name, strlen(name)), "arguments",
                       "")
           : json_pack("{s:i, s:{s:o?}}", "index", (int)index, "function", "arguments",
                       str_json(args, args_len));
    return sse_choice(ri, json_pack("{s:[o?]}", "tool_calls", call), NULL, NULL, out);
}

bool srv_sse_usage(const srv_resp_info *ri, const kiln_usage *usage, srv_buf *out) {
    if (!ri->include_usage) return true;
    json_t *o = base_object(ri, true);
    if (!o) return false;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_json(usage));
    return sse_add(o, out);
}

bool srv_sse_done(srv_buf *out) {
    return srv_buf_adds(out, "data: [DONE]\n\n");
}

bool srv_sse_error(const srv_error *e, srv_buf *out) {
    size_t n;
    char *s = srv_error_json(e, &n);
    if (!s) return false;
    bool ok = srv_buf_adds(out, "data: ") && srv_buf_add(out, s, n) && srv_buf_adds(out, "\n\n");
    free(s);
    return ok;
}
