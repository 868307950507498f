/*
 * test_server_structured.c - structured-output fields through the HTTP server (issue 20), on
 * stories260K over raw sockets, completions and chat:
 *   - response_format json_object: the content is a JSON object (parsed with jansson);
 *     json_schema: the content has the schema's required properties with the right types and
 *     bounds (checked here by hand, not by the grammar code); text: unconstrained;
 *   - grammar (GBNF) / guided_grammar, guided_regex, guided_choice, guided_json: the content
 *     is a sentence (checked by hand against each field's language);
 *   - streaming: the deltas join into a JSON object;
 *   - a grammar that cannot finish within max_tokens ends with finish_reason "length";
 *   - 400s naming the field: invalid schema (unsupported keyword, not JSON), invalid GBNF,
 *     invalid regex (lookahead, backreference), an unknown response_format type, two
 *     constraining fields, wrong types.
 */
#include <ctype.h>

#include "server_test_util.h"

static kiln_model *g_model;
/* "logit_bias": +25 for every token whose piece holds '}' or ']', +4 for '"' (stories260K writes
 * stories, not JSON: without it a free string or key rarely ends within max_tokens). The bias
 * comes after the grammar's mask, so it never lets a forbidden token through. */
static char g_bias[16384];

static void make_bias(void) {
    size_t n = (size_t)snprintf(g_bias, sizeof g_bias, "\"logit_bias\":{");
    bool first = true;
    for (int32_t id = 0; id < kiln_model_n_vocab(g_model); id++) {
        char p[64];
        size_t len = kiln_model_token_piece(g_model, id, p, sizeof p);
        if (len == 0 || len >= sizeof p) continue;
        p[len] = 0;
        if (!strpbrk(p, "\"}]")) continue;
        n += (size_t)snprintf(g_bias + n, sizeof g_bias - n, "%s\"%d\":%d", first ? "" : ",", id,
                              strpbrk(p, "}]") ? 25 : 4);
        first = false;
    }
    snprintf(g_bias + n, sizeof g_bias - n, "}");
}

static json_t *post(int port, const char *path, const char *body, int *status) {
    tu_resp r = tu_request(port, "POST", path, NULL, body);
    *status = r.status;
    json_t *j = tu_json(&r);
    tu_free(&r);
    return j;
}

static const char *content(json_t *j) {
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *t = json_object_get(c, "text");
    if (!t) t = json_object_get(json_object_get(c, "message"), "content");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static const char *finish(json_t *j) {
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *f = json_object_get(c, "finish_reason");
    return json_is_string(f) ? json_string_value(f) : "";
}

static const char *err_param(json_t *j) {
    json_t *p = json_object_get(json_object_get(j, "error"), "param");
    return json_is_string(p) ? json_string_value(p) : "";
}
static const char *err_msg(json_t *j) {
    json_t *p = json_object_get(json_object_get(j, "error"), "message");
    return json_is_string(p) ? json_string_value(p) : "";
}

/* body prefix for completions / chat */
static void body(char *out, size_t cap, bool chat, int seed, const char *fields) {
    if (chat)
        snprintf(out, cap,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
                 "\"max_tokens\":200,\"temperature\":1,\"seed\":%d,%s}",
                 seed, fields);
    else
        snprintf(out, cap, "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,"
                           "\"temperature\":1,\"seed\":%d,%s}", seed, fields);
}

static json_t *gen(int port, bool chat, int seed, const char *fields0, const char **text) {
    char b[32768], fields[20000];
    bool constrained = !strstr(fields0, "\"text\"");
    snprintf(fields, sizeof fields, "%s%s%s", fields0, constrained ? "," : "", constrained ? g_bias : "");
    body(b, sizeof b, chat, seed, fields);
    int st;
    json_t *j = post(port, chat ? "/v1/chat/completions" : "/v1/completions", b, &st);
    CHECKF(st == 200, "%s: status %d %s", fields, st, j ? err_msg(j) : "");
    *text = j ? content(j) : NULL;
    CHECKF(*text != NULL, "%s: no content", fields);
    if (*text && constrained)
        CHECKF(!strcmp(finish(j), "stop"), "%s: finish %s (%s)", fields0, finish(j), *text);
    return j;
}

static void test_json(tsrv *t) {
    for (int chat = 0; chat < 2; chat++)
        for (int seed = 0; seed < 3; seed++) {
            const char *text;
            json_t *j = gen(t->port, chat, seed, "\"response_format\":{\"type\":\"json_object\"}", &text);
            if (text) {
                json_error_t je;
                json_t *v = json_loads(text, 0, &je);
                CHECKF(json_is_object(v), "json_object: not an object: %s", text);
                json_decref(v);
            }
            json_decref(j);
            j = gen(t->port, chat, seed,
                    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\","
                    "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"name\":"
                    "{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\","
                    "\"minimum\":1,\"maximum\":99},\"pet\":{\"enum\":[\"cat\",\"dog\"]}},"
                    "\"required\":[\"name\",\"age\",\"pet\"],\"additionalProperties\":false}}}",
                    &text);
            if (text) {
                json_error_t je;
                json_t *v = json_loads(text, 0, &je);
                CHECKF(json_is_object(v) && json_object_size(v) == 3, "json_schema: %s", text);
                json_t *nm = json_object_get(v, "name"), *age = json_object_get(v, "age"),
                       *pet = json_object_get(v, "pet");
                CHECKF(json_is_string(nm) && json_string_length(nm) <= 12 * 4, "name: %s", text);
                CHECKF(json_is_integer(age) && json_integer_value(age) >= 1 &&
                           json_integer_value(age) <= 99,
                       "age: %s", text);
                CHECKF(json_is_string(pet) && (!strcmp(json_string_value(pet), "cat") ||
                                               !strcmp(json_string_value(pet), "dog")),
                       "pet: %s", text);
                json_decref(v);
            }
            json_decref(j);
            /* vLLM's guided_json, the schema as an object */
            j = gen(t->port, chat, seed,
                    "\"guided_json\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},"
                    "\"minItems\":2,\"maxItems\":3}",
                    &text);
            if (text) {
                json_error_t je;
                json_t *v = json_loads(text, 0, &je);
                CHECKF(json_is_array(v) && json_array_size(v) >= 2 && json_array_size(v) <= 3,
                       "guided_json: %s", text);
                for (size_t i = 0; v && i < json_array_size(v); i++)
                    CHECK(json_is_boolean(json_array_get(v, i)));
                json_decref(v);
            }
            json_decref(j);
        }
}

static void test_other_fields(tsrv *t) {
    for (int chat = 0; chat < 2; chat++)
        for (int seed = 0; seed < 3; seed++) {
            const char *text;
            json_t *j = gen(t->port, chat, seed, "\"guided_choice\":[\"alpha\",\"beta\",\"gamma ray\"]", &text);
            if (text)
                CHECKF(!strcmp(text, "alpha") || !strcmp(text, "beta") || !strcmp(text, "gamma ray"),
                       "guided_choice: %s", text);
            json_decref(j);
            /* three digits, a dash, two to four lowercase letters */
            j = gen(t->port, chat, seed, "\"guided_regex\":\"[0-9]{3}-[a-z]{2,4}\"", &text);
            if (text) {
                size_t n = strlen(text);
                bool ok = n >= 6 && n <= 8 && text[3] == '-';
                for (size_t i = 0; ok && i < 3; i++) ok = isdigit((unsigned char)text[i]);
                for (size_t i = 4; ok && i < n; i++) ok = text[i] >= 'a' && text[i] <= 'z';
                CHECKF(ok, "guided_regex: %s", text);
            }
            json_decref(j);
            /* GBNF: words of a b c separated by single spaces, ending with a period */
            const char *g = chat ? "guided_grammar" : "grammar";
            char f[256];
            snprintf(f, sizeof f, "\"%s\":\"root ::= w (\\\" \\\" w){0,4} \\\".\\\"\\nw ::= [abc]{1,5}\"", g);
            j = gen(t->port, chat, seed, f, &text);
            if (text) {
                size_t n = strlen(text);
                bool ok = n >= 2 && text[n - 1] == '.' && text[0] != ' ';
                for (size_t i = 0; ok && i + 1 < n; i++)
                    ok = (text[i] >= 'a' && text[i] <= 'c') || (text[i] == ' ' && text[i + 1] != ' ' && text[i + 1] != '.');
                CHECKF(ok, "grammar: %s", text);
            }
            json_decref(j);
            /* response_format text: no constraint (the plain completion) */
            j = gen(t->port, chat, seed, "\"response_format\":{\"type\":\"text\"}", &text);
            json_decref(j);
        }
}

static void test_stream(tsrv *t) {
    char b[32768], f[20000];
    snprintf(f, sizeof f, "\"stream\":true,\"response_format\":{\"type\":\"json_object\"},%s", g_bias);
    body(b, sizeof b, true, 7, f);
    tu_resp r = tu_request(t->port, "POST", "/v1/chat/completions", NULL, b);
    CHECK(r.status == 200);
    /* join the deltas */
    srv_buf acc = {0};
    const char *p = r.body.p;
    while (p && (p = strstr(p, "data: ")) != NULL) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (strncmp(p, "[DONE]", 6) != 0) {
            json_error_t je;
            json_t *j = json_loadb(p, (size_t)(e - p), 0, &je);
            json_t *c = json_array_get(json_object_get(j, "choices"), 0);
            json_t *d = json_object_get(json_object_get(c, "delta"), "content");
            if (json_is_string(d)) srv_buf_add(&acc, json_string_value(d), json_string_length(d));
            json_decref(j);
        }
        p = e;
    }
    json_error_t je;
    json_t *v = acc.p ? json_loadb(acc.p, acc.len, 0, &je) : NULL;
    CHECKF(json_is_object(v), "stream: %.*s", (int)acc.len, acc.p ? acc.p : "");
    json_decref(v);
    srv_buf_free(&acc);
    tu_free(&r);
}

static void test_length(tsrv *t) {
    int st;
    json_t *j = post(t->port, "/v1/completions",
                     "{\"prompt\":\"Once\",\"max_tokens\":4,\"grammar\":\"root ::= \\\"x\\\"{50}\"}", &st);
    CHECK(st == 200);
    CHECKF(!strcmp(finish(j), "length"), "finish %s", finish(j));
    const char *c = content(j);
    CHECK(c && strspn(c, "x") == strlen(c) && strlen(c) >= 4);
    json_decref(j);
}

static void expect_400(tsrv *t, const char *fields, const char *param, const char *needle) {
    char b[2048];
    snprintf(b, sizeof b, "{\"prompt\":\"Once\",\"max_tokens\":8,%s}", fields);
    int st;
    json_t *j = post(t->port, "/v1/completions", b, &st);
    CHECKF(st == 400, "%s: status %d", fields, st);
    CHECKF(!strcmp(err_param(j), param), "%s: param %s, want %s", fields, err_param(j), param);
    CHECKF(strstr(err_msg(j), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", fields,
           err_msg(j), needle);
    json_decref(j);
}

static void test_errors(tsrv *t) {
    expect_400(t, "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
                  "\"schema\":{\"type\":\"integer\",\"multipleOf\":2}}}",
               "response_format.json_schema.schema", "keyword 'multipleOf' is not supported");
    expect_400(t, "\"guided_json\":\"{\\\"type\\\":\"", "guided_json", "not valid JSON");
    expect_400(t, "\"guided_json\":{\"properties\":{\"a\":{\"not\":{}}}}", "guided_json",
               "at /properties/a: keyword 'not'");
    expect_400(t, "\"grammar\":\"root ::= \\\"a\\\" bad\"", "grammar", "rule 'bad' is not defined");
    expect_400(t, "\"guided_grammar\":\"root ::= (\\\"a\\\"\"", "guided_grammar", "unclosed group");
    expect_400(t, "\"guided_regex\":\"a(?=b)\"", "guided_regex", "position 1: lookahead");
    expect_400(t, "\"guided_regex\":\"(a)\\\\1\"", "guided_regex", "backreferences");
    expect_400(t, "\"response_format\":{\"type\":\"xml\"}", "response_format.type", "xml");
    expect_400(t, "\"response_format\":{\"type\":\"json_object\"},\"guided_regex\":\"a\"",
               "guided_regex", "give only one");
    expect_400(t, "\"guided_choice\":[]", "guided_choice", "non-empty");
    expect_400(t, "\"guided_choice\":[\"a\",3]", "guided_choice", "guided_choice[1]");
    expect_400(t, "\"grammar\":7", "grammar", "must be a string");
    expect_400(t, "\"response_format\":{\"type\":\"json_schema\"}", "response_format.json_schema",
               "must be an object");
}

int main(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K.bin");
    kiln_test_require_file(path);
    kiln_model *m;
    kiln_error err = {0};
    REQUIRE(kiln_model_load(path, NULL, &m, &err) == KILN_OK);
    g_model = m;
    make_bias();
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    tsrv t;
    tsrv_start(&t, m, NULL, &ep);
    test_json(&t);
    test_other_fields(&t);
    test_stream(&t);
    test_length(&t);
    test_errors(&t);
    tsrv_stop(&t);
    kiln_model_free(m);
    return kiln_test_finish("test_server_structured");
}
