/*
 * test_tool_calls.c - the incremental tool-call parser (kiln_tool_parser_*, kiln.h) on
 * hand-written model outputs of each family: several calls, text before, between and after,
 * malformed markup returned as content, every split of the text (whole, byte by byte, every
 * two-piece split) in both modes, held-back marker prefixes, arguments streamed in pieces, ids,
 * template detection.
 */
#include "kiln.h"
#include "test.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAXC 8

typedef struct result {
    char content[4096];
    size_t n_content;
    int n_calls;
    char name[MAXC][128];
    char args[MAXC][1024];
    char id[MAXC][64];
    int arg_events[MAXC]; /* ARGUMENTS events per call */
    bool order_ok;        /* CALL before its ARGUMENTS, indexes in order */
} result;

static void take(kiln_tool_parser *p, result *r) {
    kiln_tool_event ev;
    while (kiln_tool_parser_next(p, &ev)) {
        switch (ev.type) {
        case KILN_TOOL_EVENT_CONTENT:
            REQUIRE(r->n_content + ev.len < sizeof r->content);
            memcpy(r->content + r->n_content, ev.text, ev.len);
            r->n_content += ev.len;
            r->content[r->n_content] = '\0';
            break;
        case KILN_TOOL_EVENT_CALL:
            if (ev.index != r->n_calls) r->order_ok = false;
            REQUIRE(r->n_calls < MAXC);
            snprintf(r->name[r->n_calls], sizeof r->name[0], "%s", ev.name);
            if (strlen(ev.name) != ev.name_len) r->order_ok = false;
            snprintf(r->id[r->n_calls], sizeof r->id[0], "%s", ev.id);
            r->n_calls++;
            break;
        case KILN_TOOL_EVENT_ARGUMENTS:
            if (ev.index != r->n_calls - 1) {
                r->order_ok = false;
                break;
            }
            {
                char *a = r->args[ev.index];
                size_t n = strlen(a);
                REQUIRE(n + ev.len < sizeof r->args[0]);
                memcpy(a + n, ev.text, ev.len);
                a[n + ev.len] = '\0';
                r->arg_events[ev.index]++;
            }
            break;
        }
    }
}

/* Parse `text` fed in pieces at the offsets cuts[0..n_cuts) (increasing). */
static void parse(kiln_tool_format f, bool stream, const char *text, const size_t *cuts,
                  int n_cuts, result *r) {
    memset(r, 0, sizeof *r);
    r->order_ok = true;
    kiln_tool_parser_params pp = {.format = f, .stream_arguments = stream, .seed = 7};
    kiln_tool_parser *p = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_tool_parser_create(&pp, &p, &err) == KILN_OK);
    size_t len = strlen(text), at = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        REQUIRE(kiln_tool_parser_feed(p, text + at, to - at, &err) == KILN_OK);
        take(p, r);
        at = to;
    }
    REQUIRE(kiln_tool_parser_finish(p, &err) == KILN_OK);
    take(p, r);
    CHECK(kiln_tool_parser_n_calls(p) == r->n_calls);
    CHECK(kiln_tool_parser_feed(p, "x", 1, &err) == KILN_ERR_INVALID_ARGUMENT);
    kiln_tool_parser_destroy(p);
}

typedef struct expect {
    const char *content;
    int n_calls;
    const char *name[MAXC];
    const char *args[MAXC];
} expect;

static bool same(const result *r, const expect *x) {
    if (!r->order_ok || strcmp(r->content, x->content) != 0 || r->n_calls != x->n_calls)
        return false;
    for (int i = 0; i < x->n_calls; i++)
        if (strcmp(r->name[i], x->name[i]) || strcmp(r->args[i], x->args[i])) return false;
    return true;
}

static void show(const char *what, const result *r) {
    fprintf(stderr, "  %s: content=[%s] calls=%d", what, r->content, r->n_calls);
    for (int i = 0; i < r->n_calls; i++) fprintf(stderr, " {%s %s}", r->name[i], r->args[i]);
    fprintf(stderr, "\n");
}

/* Every split: whole, byte by byte, each two-piece split; both modes unless `stream_x` gives
 * stream mode its own expectation (markup that fails after its call was announced). */
static void case_all(const char *label, kiln_tool_format f, const char *text, const expect *x,
                     const expect *stream_x) {
    size_t len = strlen(text);
    size_t cuts[4096];
    REQUIRE(len < 4096);
    for (int mode = 0; mode < 2; mode++) {
        bool stream = mode == 1;
        const expect *want = stream && stream_x ? stream_x : x;
        result r;
        int bad = 0;
        parse(f, stream, text, NULL, 0, &r);
        if (!same(&r, want)) {
            fprintf(stderr, "%s (%s, whole) differs\n", label, stream ? "stream" : "hold");
            show("got", &r);
            bad++;
        }
        for (size_t i = 0; i + 1 < len; i++) cuts[i] = i + 1;
        parse(f, stream, text, cuts, len > 1 ? (int)len - 1 : 0, &r);
        if (!same(&r, want)) {
            fprintf(stderr, "%s (%s, byte by byte) differs\n", label, stream ? "stream" : "hold");
            show("got", &r);
            bad++;
        }
        for (size_t c = 1; c < len && bad < 3; c++) {
            cuts[0] = c;
            parse(f, stream, text, cuts, 1, &r);
            if (!same(&r, want)) {
                fprintf(stderr, "%s (%s, split at %zu) differs\n", label,
                        stream ? "stream" : "hold", c);
                show("got", &r);
                bad++;
            }
        }
        CHECKF(bad == 0, "%s", label);
    }
}

#define CALLS(...) __VA_ARGS__

static void test_hermes(void) {
    const kiln_tool_format H = KILN_TOOL_FORMAT_HERMES;
    expect plain = {"Hello, world. <b>x</b> <tool>y", 0, {0}, {0}};
    case_all("hermes plain", H, "Hello, world. <b>x</b> <tool>y", &plain, NULL);

    expect one = {"", 1, {"get_weather"}, {"{\"city\": \"Paris\"}"}};
    case_all("hermes one", H,
             "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
             "</tool_call>",
             &one, NULL);

    expect two = {"Let me check.\n\nDone.",
                  2,
                  {"a", "b"},
                  {"{}", "{\"x\": [1, 2.5e3, -0, true, null, \"\\u00e9\\\"\", {\"y\": false}]}"}};
    case_all("hermes two + text", H,
             "Let me check.\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n"
             "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2.5e3, -0, true, null, "
             "\"\\u00e9\\\"\", {\"y\": false}]}}\n</tool_call>\nDone.",
             &two, NULL);

    const char *arr = "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>";
    expect arr_x = {arr, 0, {0}, {0}};
    case_all("hermes arguments not an object", H, arr, &arr_x, NULL);

    const char *close = "ok <tool_call>{\"name\":\"a\",\"arguments\":{\"x\":1}}</tool_cal> end";
    expect close_x = {close, 0, {0}, {0}};
    /* stream mode: the call was announced with its arguments; content from the failing '>' */
    expect close_s = {"ok > end", 1, {"a"}, {"{\"x\":1}"}};
    case_all("hermes wrong closing tag", H, close, &close_x, &close_s);

    expect open_end = {"", 1, {"a"}, {"{}"}};
    case_all("hermes missing closing tag at the end", H,
             "<tool_call>{\"name\":\"a\",\"arguments\":{}}\n", &open_end, NULL);

    const char *cut = "x<tool_call>{\"name\":\"a\",\"argu";
    expect cut_x = {cut, 0, {0}, {0}};
    case_all("hermes cut inside the call", H, cut, &cut_x, NULL);

    const char *badjs = "<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":tru}}</tool_call>";
    expect badjs_x = {badjs, 0, {0}, {0}};
    expect badjs_s = {"}}</tool_call>", 1, {"a"}, {"{\"x\":tru"}};
    case_all("hermes invalid JSON in the arguments", H, badjs, &badjs_x, &badjs_s);

    expect order = {"", 1, {"s"}, {"{\"q\": \"x\"}"}};
    case_all("hermes arguments before name", H,
             "<tool_call>{\"arguments\": {\"q\": \"x\"}, \"name\": \"s\"}</tool_call>", &order,
             NULL);

    const char *unk = "<tool_call>{\"name\": \"a\", \"foo\": 1}</tool_call>";
    expect unk_x = {unk, 0, {0}, {0}};
    case_all("hermes unknown key", H, unk, &unk_x, NULL);

    expect esc = {"", 1, {"na\"me\xc3\xa9"}, {"{}"}};
    case_all("hermes escaped name", H,
             "<tool_call>{\"name\": \"na\\\"me\\u00e9\", \"id\": \"c1\", \"arguments\": {}}"
             "</tool_call>",
             &esc, NULL);

    expect noargs = {"", 1, {"ping"}, {"{}"}};
    case_all("hermes no arguments", H, "<tool_call>{\"name\": \"ping\"}</tool_call>", &noargs,
             NULL);

    /* failed markup, then a good call: the second is still found */
    expect retry = {"<tool_call>oops ", 1, {"a"}, {"{}"}};
    case_all("hermes bad then good", H,
             "<tool_call>oops <tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>", &retry,
             NULL);

    const char *deep =
        "<tool_call>{\"name\":\"a\",\"arguments\":"
        "{\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]"
        "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}</tool_call>";
    expect deep_x = {deep, 0, {0}, {0}};
    result r;
    parse(H, false, deep, NULL, 0, &r);
    CHECK(same(&r, &deep_x));
}

static void test_llama3(void) {
    const kiln_tool_format L = KILN_TOOL_FORMAT_LLAMA3;
    expect one = {"", 1, {"get_weather"}, {"{\"city\": \"Paris\"}"}};
    case_all("llama3 bare", L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
             &one, NULL);
    expect two = {"", 2, {"a", "b"}, {"{}", "{\"k\":1}"}};
    case_all("llama3 two with ;", L,
             "  {\"name\":\"a\",\"parameters\":{}}; {\"name\":\"b\",\"parameters\":{\"k\":1}}",
             &two, NULL);
    expect tag = {"Sure! ", 1, {"a"}, {"{\"x\": \"y\"}"}};
    case_all("llama3 python_tag", L,
             "Sure! <|python_tag|>{\"name\": \"a\", \"arguments\": {\"x\": \"y\"}}", &tag, NULL);
    expect after = {"Then some text.", 1, {"a"}, {"{}"}};
    case_all("llama3 text after", L, "{\"name\":\"a\",\"parameters\":{}}Then some text.", &after,
             NULL);
    const char *js = " {\"a\": 1}";
    expect js_x = {js, 0, {0}, {0}};
    case_all("llama3 JSON content", L, js, &js_x, NULL);
    const char *mid = "Hello {\"name\":\"a\",\"parameters\":{}}";
    expect mid_x = {mid, 0, {0}, {0}};
    case_all("llama3 JSON not at the start", L, mid, &mid_x, NULL);
}

static void test_mistral(void) {
    const kiln_tool_format M = KILN_TOOL_FORMAT_MISTRAL;
    expect two = {"", 2, {"a", "b"}, {"{\"x\": 1}", "{}"}};
    case_all("mistral list", M,
             "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", "
             "\"arguments\": {}}]",
             &two, NULL);
    expect one = {"", 1, {"a"}, {"{}"}};
    case_all("mistral bare object", M, "[TOOL_CALLS]{\"name\":\"a\",\"arguments\":{}}", &one,
             NULL);
    const char *bad = "Hi [TOOL_CALLS] not json";
    expect bad_x = {bad, 0, {0}, {0}};
    case_all("mistral malformed", M, bad, &bad_x, NULL);
    /* the first call of a list stays when the second fails */
    expect half = {" {\"name\": 5}]", 1, {"a"}, {"{}"}};
    case_all("mistral list, second call bad", M,
             "[TOOL_CALLS][{\"name\":\"a\",\"arguments\":{}}, {\"name\": 5}]", &half, NULL);
    result r;
    parse(M, false, "[TOOL_CALLS][{\"name\":\"a\",\"arguments\":{}}]", NULL, 0, &r);
    CHECK(r.n_calls == 1 && strlen(r.id[0]) == 9);
    /* Hermes markup is only content for the Mistral parser */
    const char *h = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>";
    expect h_x = {h, 0, {0}, {0}};
    case_all("mistral sees hermes markup", M, h, &h_x, NULL);
}

static void test_none(void) {
    const char *h = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>";
    expect h_x = {h, 0, {0}, {0}};
    case_all("none", KILN_TOOL_FORMAT_NONE, h, &h_x, NULL);
}

/* Held-back text, arguments in pieces, ids. */
static void test_incremental(void) {
    kiln_tool_parser_params pp = {.format = KILN_TOOL_FORMAT_HERMES, .stream_arguments = true,
                                  .seed = 1};
    kiln_tool_parser *p = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_tool_parser_create(&pp, &p, &err) == KILN_OK);
    result r;
    memset(&r, 0, sizeof r);
    r.order_ok = true;
    REQUIRE(kiln_tool_parser_feed(p, "Hi <tool_c", 10, &err) == KILN_OK);
    take(p, &r);
    CHECK(!strcmp(r.content, "Hi ")); /* "<tool_c" could begin a call: held back */
    const char *rest = "all>{\"name\": \"f\", \"arguments\": {\"a\": ";
    REQUIRE(kiln_tool_parser_feed(p, rest, strlen(rest), &err) == KILN_OK);
    take(p, &r);
    CHECK(r.n_calls == 1 && !strcmp(r.name[0], "f")); /* announced before the arguments end */
    CHECK(!strcmp(r.args[0], "{\"a\": "));
    CHECK(!strncmp(r.id[0], "call_", 5) && strlen(r.id[0]) == 29);
    REQUIRE(kiln_tool_parser_feed(p, "12}}</tool_call>", 16, &err) == KILN_OK);
    take(p, &r);
    CHECK(!strcmp(r.args[0], "{\"a\": 12}"));
    CHECK(r.arg_events[0] == 2);
    REQUIRE(kiln_tool_parser_finish(p, &err) == KILN_OK);
    take(p, &r);
    CHECK(!strcmp(r.content, "Hi ") && r.n_calls == 1);
    kiln_tool_parser_destroy(p);

    /* hold mode: nothing of the call until its markup closes */
    pp.stream_arguments = false;
    REQUIRE(kiln_tool_parser_create(&pp, &p, &err) == KILN_OK);
    memset(&r, 0, sizeof r);
    r.order_ok = true;
    const char *a = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 12}}";
    REQUIRE(kiln_tool_parser_feed(p, a, strlen(a), &err) == KILN_OK);
    take(p, &r);
    CHECK(r.n_calls == 0 && r.n_content == 0);
    REQUIRE(kiln_tool_parser_feed(p, "</tool_call>", 12, &err) == KILN_OK);
    take(p, &r);
    CHECK(r.n_calls == 1 && r.arg_events[0] == 1);
    kiln_tool_parser_destroy(p);

    /* the same seed gives the same ids */
    result r1, r2;
    parse(KILN_TOOL_FORMAT_HERMES, false,
          "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\"}</tool_call>", NULL,
          0, &r1);
    parse(KILN_TOOL_FORMAT_HERMES, true,
          "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\"}</tool_call>", NULL,
          0, &r2);
    CHECK(r1.n_calls == 2 && !strcmp(r1.id[0], r2.id[0]) && !strcmp(r1.id[1], r2.id[1]));
    CHECK(strcmp(r1.id[0], r1.id[1]) != 0);

    CHECK(kiln_tool_parser_create(NULL, NULL, &err) == KILN_ERR_INVALID_ARGUMENT);
    kiln_tool_parser_params badp = {.format = (kiln_tool_format)9};
    CHECK(kiln_tool_parser_create(&badp, &p, &err) == KILN_ERR_INVALID_ARGUMENT);
    kiln_tool_parser_destroy(NULL);
}

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

static void test_detect(void) {
    kiln_tool_format f;
    kiln_error err = {0};
    CHECK(kiln_tool_format_parse("llama3", &f, &err) == KILN_OK && f == KILN_TOOL_FORMAT_LLAMA3);
    CHECK(kiln_tool_format_parse("none", &f, &err) == KILN_OK && f == KILN_TOOL_FORMAT_NONE);
    CHECK(kiln_tool_format_parse("json", &f, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.message, "hermes") != NULL);
    CHECK(!strcmp(kiln_tool_format_name(KILN_TOOL_FORMAT_MISTRAL), "mistral"));
    CHECK(kiln_tool_format_detect(NULL) == KILN_TOOL_FORMAT_HERMES);
    CHECK(!kiln_chat_template_uses_tools(NULL));
    CHECK(!kiln_chat_template_uses_tools("{{ 'tools' }} tools {{ x.tools_x }}"));
    CHECK(kiln_chat_template_uses_tools("{% if tools %}x{% endif %}"));
    static const struct {
        const char *file;
        kiln_tool_format f;
        bool tools;
    } T[] = {
        {"templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", KILN_TOOL_FORMAT_HERMES, 1},
        {"templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", KILN_TOOL_FORMAT_HERMES,
         1},
        {"templates/Qwen-Qwen2.5-7B-Instruct.jinja", KILN_TOOL_FORMAT_HERMES, 1},
        {"templates/meta-llama-Llama-3.1-8B-Instruct.jinja", KILN_TOOL_FORMAT_LLAMA3, 1},
        {"templates/meta-llama-Llama-3.2-3B-Instruct.jinja", KILN_TOOL_FORMAT_LLAMA3, 1},
        {"templates/meta-llama-Llama-3.3-70B-Instruct.jinja", KILN_TOOL_FORMAT_LLAMA3, 1},
        {"templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", KILN_TOOL_FORMAT_MISTRAL, 1},
        {"templates/google-gemma-2-2b-it.jinja", KILN_TOOL_FORMAT_HERMES, 0},
        {"templates/microsoft-Phi-3.5-mini-instruct.jinja", KILN_TOOL_FORMAT_HERMES, 0},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        char *src = slurp(kiln_test_shared(T[i].file));
        if (!src) {
            printf("note: %s missing, detection not checked\n", T[i].file);
            continue;
        }
        CHECKF(kiln_tool_format_detect(src) == T[i].f, "%s", T[i].file);
        CHECKF(kiln_chat_template_uses_tools(src) == T[i].tools, "%s", T[i].file);
        free(src);
    }
}

int main(void) {
    test_hermes();
    test_llama3();
    test_mistral();
    test_none();
    test_incremental();
    test_detect();
    return kiln_test_finish("test_tool_calls");
}
