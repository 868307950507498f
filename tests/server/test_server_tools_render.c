/*
 * test_server_tools_render.c - the grammar of tool_choice "required" / named per family
 * (srv_tools_grammar: what it takes, the parser finds), and a chat request with tools, tool calls and tool messages in
 * OpenAI's wire shape (arguments as a JSON string), parsed by srv_gen_parse and rendered by
 * srv_chat_render, against the real templates of ../shared/templates:
 *   - every template whose `tools_call_roundtrip` case of cases.json renders (Python Jinja2's
 *     output, with arguments given as objects, as transformers' callers pass them) and that
 *     reads `tools` gives exactly that case's expected text from the wire-shaped request;
 *   - Mistral-Nemo, whose case fails on the id "call_1" (its template wants 9 alphanumerics):
 *     the ids are mapped, the same one in the call and in the tool result;
 *   - templates without `tools` (ChatML, Phi-3.5, Gemma-2 which refuses a system message):
 *     the tools are described in the Hermes format, calls and results become <tool_call> and
 *     <tool_response> text; with tool_choice "none" no tools are shown.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "server/openai.h"
#include "server/prompt.h"
#include "server/tools.h"
#include "test.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* A chat with the template `src` (NULL = ChatML), as the server sets it up. */
static void chat_of(const char *src, srv_chat *c) {
    memset(c, 0, sizeof *c);
    kiln_chat_template_params tp = {.source = src, .bos_token = "<|bos|>", .eos_token = "<|eos|>"};
    kiln_error err = {0};
    REQUIRE(kiln_chat_template_create(NULL, &tp, &c->tpl, &err) == KILN_OK);
    c->tool_format = kiln_tool_format_detect(src);
    c->native_tools = kiln_chat_template_uses_tools(src);
}

/* Render a request body; NULL (and the error printed) on failure. */
static char *render(const srv_chat *c, const char *body, srv_error *e) {
    srv_gen g;
    char *text = NULL;
    size_t len = 0;
    bool ok = srv_gen_parse(SRV_CHAT, body, strlen(body), 32000, NULL, &g, e) &&
              srv_chat_render(c, &g, &text, &len, e);
    srv_gen_free(&g);
    return ok ? text : NULL;
}

/* The case's context with every tool call's arguments object turned into its JSON string. */
static char *wire_body(const json_t *ctx) {
    json_t *msgs = json_deep_copy(json_object_get(ctx, "messages"));
    size_t i, k;
    json_t *m, *c;
    json_array_foreach(msgs, i, m) {
        json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
            json_t *fn = json_object_get(c, "function");
            char *a = json_dumps(json_object_get(fn, "arguments"), JSON_COMPACT);
            json_object_set_new(fn, "arguments", json_string(a));
            free(a);
        }
    }
    json_t *body = json_pack("{s:o, s:O, s:O}", "messages", msgs, "tools",
                             json_object_get(ctx, "tools"), "add_generation_prompt",
                             json_object_get(ctx, "add_generation_prompt"));
    char *s = json_dumps(body, 0);
    json_decref(body);
    return s;
}

static void test_cases(void) {
    const char *cases_path = kiln_test_shared("templates/cases.json");
    kiln_test_require_file(cases_path);
    json_error_t je;
    json_t *root = json_load_file(cases_path, 0, &je);
    REQUIRE(root);
    size_t k;
    json_t *cs;
    int native = 0;
    json_array_foreach(json_object_get(root, "cases"), k, cs) {
        if (strcmp(json_string_value(json_object_get(cs, "case")), "tools_call_roundtrip") != 0)
            continue;
        const char *name = json_string_value(json_object_get(cs, "template"));
        char rel[256];
        snprintf(rel, sizeof rel, "templates/%s", name);
        char *src = slurp(kiln_test_shared(rel));
        REQUIRE(src);
        srv_chat c;
        chat_of(src, &c);
        json_t *expected = json_object_get(cs, "expected");
        char *body = wire_body(json_object_get(cs, "context"));
        srv_error e = {0};
        char *text = render(&c, body, &e);
        if (c.native_tools && json_is_string(expected)) {
            native++;
            /* strftime_now: the reference ran with a fixed clock; take its date */
            const char *d_want = strstr(json_string_value(expected), "Today Date: ");
            char *d_got = text ? strstr(text, "Today Date: ") : NULL;
            if (d_want && d_got && strlen(d_got) > 23) memcpy(d_got + 12, d_want + 12, 11);
            CHECKF(text && !strcmp(text, json_string_value(expected)),
                   "%s: rendered differently:\n%s\n--- expected:\n%s\n(%s)", name,
                   text ? text : "(failed)", json_string_value(expected), e.message);
        }
        if (!strcmp(name, "mistralai-Mistral-Nemo-Instruct-2407.jinja")) {
            CHECKF(text != NULL, "mistral: %s", e.message);
            const char *call =
                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
                "\"id\": \"";
            const char *p = text ? strstr(text, call) : NULL;
            CHECKF(p != NULL, "mistral: %s", text ? text : "");
            if (p) {
                char id[10];
                memcpy(id, p + strlen(call), 9);
                id[9] = '\0';
                for (int i = 0; i < 9; i++)
                    CHECK((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
                          (id[i] >= '0' && id[i] <= '9'));
                char res[128];
                snprintf(res, sizeof res, "\"call_id\": \"%s\"}[/TOOL_RESULTS]", id);
                CHECKF(strstr(text, res) != NULL, "mistral result id: %s", text);
            }
        }
        /* firefunction-v2 reads `functions`, which nothing sets (its case fails too) */
        if (!c.native_tools && !strstr(name, "firefunction")) {
            /* gemma-2, phi-3.5, deepseek...: described in the Hermes format */
            CHECKF(text != NULL, "%s: %s", name, e.message);
            if (text) {
                CHECKF(strstr(text, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
                                    "\"get_weather\"") != NULL,
                       "%s: %s", name, text);
                CHECKF(strstr(text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                    "{\"city\": \"Paris\"}}\n</tool_call>") != NULL,
                       "%s: %s", name, text);
                CHECKF(strstr(text, "<tool_response>\n{\"temp\": 18}\n</tool_response>") != NULL,
                       "%s: %s", name, text);
            }
        }
        kiln_free(text);
        free(body);
        free(src);
        kiln_chat_template_destroy(c.tpl);
    }
    CHECKF(native >= 6, "only %d native tool templates rendered", native);
    json_decref(root);
}

/* ChatML (the fallback): the whole text, written out here. */
static void test_chatml(void) {
    srv_chat c;
    chat_of(NULL, &c);
    CHECK(!c.native_tools && c.tool_format == KILN_TOOL_FORMAT_HERMES);
    const char *body =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        " {\"role\": \"user\", \"content\": \"Weather?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"w\", \"arguments\": "
        "\"{\\\"city\\\":\\\"Paris\\\"}\"}}, {\"id\": \"call_2\", \"type\": \"function\", "
        "\"function\": {\"name\": \"w\", \"arguments\": \"{}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"18C\"},"
        " {\"role\": \"tool\", \"tool_call_id\": \"call_2\", \"content\": \"?\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": "
        "{\"type\": \"object\"}}}]}";
    const char *want =
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
        "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"w\", "
        "\"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nFor each function call, return a "
        "json object with function name and arguments within <tool_call></tool_call> XML "
        "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": "
        "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"w\", \"arguments\": "
        "{}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n?\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n";
    srv_error e = {0};
    char *text = render(&c, body, &e);
    CHECKF(text && !strcmp(text, want), "chatml:\n%s\n--- expected:\n%s\n(%s)",
           text ? text : "(failed)", want, e.message);
    kiln_free(text);

    /* tool_choice none: no tools shown (the history still rendered as text) */
    const char *none = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": "
                       "[{\"type\": \"function\", \"function\": {\"name\": \"w\"}}], "
                       "\"tool_choice\": \"none\"}";
    text = render(&c, none, &e);
    CHECKF(text && !strcmp(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
           "none: %s", text ? text : e.message);
    kiln_free(text);
    kiln_chat_template_destroy(c.tpl);
}

/* The parser's view of a text: calls and whether any content is left. */
static int parsed_calls(kiln_tool_format f, const char *text, bool *content) {
    kiln_tool_parser_params pp = {.format = f};
    kiln_tool_parser *p = NULL;
    REQUIRE(kiln_tool_parser_create(&pp, &p, NULL) == KILN_OK);
    REQUIRE(kiln_tool_parser_feed(p, text, strlen(text), NULL) == KILN_OK);
    REQUIRE(kiln_tool_parser_finish(p, NULL) == KILN_OK);
    kiln_tool_event ev;
    *content = false;
    while (kiln_tool_parser_next(p, &ev))
        if (ev.type == KILN_TOOL_EVENT_CONTENT) *content = true;
    int n = kiln_tool_parser_n_calls(p);
    kiln_tool_parser_destroy(p);
    return n;
}

/* srv_tools_grammar: the texts each family's grammar takes are the calls its parser finds. */
static void test_grammar(void) {
    const char *tools =
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
        "\"string\", \"maxLength\": 8}, \"unit\": {\"enum\": [\"c\", \"f\"]}}, \"required\": "
        "[\"city\", \"unit\"], \"additionalProperties\": false}}}, {\"type\": \"function\", "
        "\"function\": {\"name\": \"ping\"}}]";
    static const struct {
        const char *choice; /* tool_choice and parallel_tool_calls */
        kiln_tool_format f;
        const char *text;
        bool ok;
        int calls;
    } T[] = {
        {"\"required\"", KILN_TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
         "\"unit\": \"c\"}}\n</tool_call>",
         true, 1},
        {"\"required\"", KILN_TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
         "{\"name\": \"ping\", \"arguments\": {\"x\": [1]}}\n</tool_call>",
         true, 2},
        /* the schema: unit must be c or f, city at most 8 characters, no other keys */
        {"\"required\"", KILN_TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
         "\"unit\": \"k\"}}\n</tool_call>",
         false, 0},
        {"\"required\"", KILN_TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Parisienne\", "
         "\"unit\": \"c\"}}\n</tool_call>",
         false, 0},
        {"\"required\"", KILN_TOOL_FORMAT_HERMES, "Sure: <tool_call>\n{\"name\": \"ping\", "
                                                   "\"arguments\": {}}\n</tool_call>",
         false, 0},
        {"\"required\"", KILN_TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"pong\", "
                                                   "\"arguments\": {}}\n</tool_call>",
         false, 0},
        {"\"required\", \"parallel_tool_calls\": false", KILN_TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
         "{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
         false, 0},
        {"{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}",
         KILN_TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"y\": null}}\n</tool_call>", true,
         1},
        {"{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}",
         KILN_TOOL_FORMAT_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\", \"unit\": "
         "\"c\"}}\n</tool_call>",
         false, 0},
        {"\"required\"", KILN_TOOL_FORMAT_LLAMA3,
         "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"f\"}}; "
         "{\"name\": \"ping\", \"parameters\": {}}",
         true, 2},
        {"\"required\"", KILN_TOOL_FORMAT_MISTRAL,
         "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}, {\"name\": \"get_weather\", "
         "\"arguments\": {\"city\":\"x\",\"unit\":\"c\"}}]",
         true, 2},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        char body[2048];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s, "
                 "\"tool_choice\": %s}",
                 tools, T[i].choice);
        srv_gen g;
        srv_error e = {0};
        REQUIRE(srv_gen_parse(SRV_CHAT, body, strlen(body), 100, NULL, &g, &e));
        char *gbnf = NULL;
        REQUIRE(srv_tools_grammar(&g.tc, T[i].f, &gbnf, &e));
        kiln_grammar *gr = NULL;
        kiln_error err = {0};
        CHECKF(kiln_grammar_create(KILN_GRAMMAR_GBNF, gbnf, 0, &gr, &err) == KILN_OK,
               "case %zu: %s\n%s", i, err.message, gbnf);
        bool prefix = false, complete = false;
        if (gr)
            REQUIRE(kiln_grammar_match(gr, T[i].text, strlen(T[i].text), &prefix, &complete,
                                       &err) == KILN_OK);
        CHECKF(complete == T[i].ok, "case %zu: grammar %s '%s'", i,
               complete ? "takes" : "refuses", T[i].text);
        if (T[i].ok) {
            bool content;
            CHECKF(parsed_calls(T[i].f, T[i].text, &content) == T[i].calls && !content,
                   "case %zu: the parser does not find %d calls", i, T[i].calls);
        }
        kiln_grammar_destroy(gr);
        free(gbnf);
        srv_gen_free(&g);
    }
    /* a schema the grammar engine refuses is a 400 naming the tool's parameters */
    const char *bad = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                      "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                      "{\"type\": \"object\", \"patternProperties\": {\"a\": {}}}}}], "
                      "\"tool_choice\": \"required\"}";
    srv_gen g;
    srv_error e = {0};
    REQUIRE(srv_gen_parse(SRV_CHAT, bad, strlen(bad), 100, NULL, &g, &e));
    char *gbnf = NULL;
    CHECK(!srv_tools_grammar(&g.tc, KILN_TOOL_FORMAT_HERMES, &gbnf, &e));
    CHECKF(e.http_status == 400 && !strcmp(e.param, "tools[0].function.parameters"), "%d %s: %s",
           e.http_status, e.param, e.message);
    free(gbnf);
    srv_gen_free(&g);
}

int main(void) {
    test_grammar();
    test_chatml();
    test_cases();
    return kiln_test_finish("test_server_tools_render");
}
