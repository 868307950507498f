/*
 * test_server_openai.c - request validation and response shapes of the OpenAI layer
 * (src/server/openai.h), without HTTP or a model. Expectations come from the OpenAI API
 * reference (field names, ranges, response objects, SSE framing) and from Unicode's
 * "U+FFFD substitution of maximal subparts" for the UTF-8 repair.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "server/openai.h"
#include "server/prompt.h"
#include "server/srv_util.h"
#include "template/template.h"
#include "test.h"

#define NV 512

static bool parse(srv_kind k, const char *body, srv_gen *g, srv_error *e) {
    memset(e, 0, sizeof *e);
    return srv_gen_parse(k, body, strlen(body), NV, NULL, g, e);
}

/* Expect a 400 naming `param` ("" = null). */
static void expect_400(srv_kind k, const char *body, const char *param) {
    srv_gen g;
    srv_error e;
    bool ok = parse(k, body, &g, &e);
    CHECKF(!ok, "accepted: %s", body);
    if (!ok) {
        CHECKF(e.http_status == 400, "status %d for %s", e.http_status, body);
        CHECKF(!strcmp(e.param, param), "param '%s' (want '%s') for %s: %s", e.param, param, body,
               e.message);
        CHECKF(e.message[0] != '\0', "empty message for %s", body);
        CHECK(e.type && !strcmp(e.type, "invalid_request_error"));
    }
    srv_gen_free(&g);
}

/* echo with logprobs asks the engine for the prompt's logprobs with as many alternatives */
static void test_echo_logprobs_fields(void) {
    srv_gen g;
    srv_error e;
    CHECK(parse(SRV_COMPLETION, "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":3}", &g, &e));
    CHECK(g.echo && g.req.prompt_logprobs && g.req.top_prompt_logprobs == 3);
    srv_gen_free(&g);
    CHECK(parse(SRV_COMPLETION, "{\"prompt\":\"a\",\"echo\":true}", &g, &e));
    CHECK(g.echo && !g.req.prompt_logprobs && g.req.top_prompt_logprobs == 0);
    srv_gen_free(&g);
    CHECK(parse(SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":2}", &g, &e));
    CHECK(!g.req.prompt_logprobs);
    srv_gen_free(&g);
}

static void test_completion_fields(void) {
    srv_gen g;
    srv_error e;
    const char *body =
        "{\"model\":\"x\",\"prompt\":\"Hello\",\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":-1,\"min_p\":0.1,\"presence_penalty\":-1.5,"
        "\"xtc_probability\":0.25,\"xtc_threshold\":0.2,"
        "\"frequency_penalty\":2,\"repetition_penalty\":1.3,\"seed\":-1,"
        "\"stop\":[\"a\",\"\",\"bc\"],\"logit_bias\":{\"5\":-100,\"7\":3.5},\"logprobs\":3,"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"user\":\"u\","
        "\"some_unknown_field\":{\"x\":[1,2]},\"n\":1,\"echo\":false,\"best_of\":1}";
    REQUIRE(parse(SRV_COMPLETION, body, &g, &e));
    CHECK(g.prompt_text && !strcmp(g.prompt_text, "Hello") && g.prompt_len == 5);
    CHECK(g.add_special);
    CHECK(g.max_tokens_set && g.req.max_tokens == 7);
    CHECK(g.req.temperature == 0.5f && g.req.top_p == 0.9f && g.req.top_k == 0);
    CHECK(g.req.min_p == 0.1f && g.req.presence_penalty == -1.5f);
    CHECK(g.req.xtc_probability == 0.25f && g.req.xtc_threshold == 0.2f);
    CHECK(g.req.frequency_penalty == 2.0f && g.req.repetition_penalty == 1.3f);
    CHECK(g.req.seed == UINT64_MAX);
    CHECK(g.req.n_stop == 2 && !strcmp(g.req.stop[0], "a") && !strcmp(g.req.stop[1], "bc"));
    REQUIRE(g.req.n_logit_bias == 2);
    for (int i = 0; i < 2; i++) {
        if (g.req.logit_bias_ids[i] == 5)
            CHECK(isinf(g.req.logit_bias_values[i]) && g.req.logit_bias_values[i] < 0);
        else
            CHECK(g.req.logit_bias_ids[i] == 7 && g.req.logit_bias_values[i] == 3.5f);
    }
    CHECK(g.logprobs && g.top_logprobs == 3 && g.req.logprobs && g.req.top_logprobs == 3);
    CHECK(g.stream && g.include_usage);
    srv_gen_free(&g);

    /* max_completion_tokens wins over max_tokens; a single stop string; no seed = random. */
    REQUIRE(
        parse(SRV_COMPLETION,
              "{\"prompt\":[1,2,3],\"max_tokens\":5,\"max_completion_tokens\":9,\"stop\":\"x\"}",
              &g, &e));
    CHECK(g.req.max_tokens == 9 && g.n_prompt_ids == 3 && g.prompt_ids[2] == 3);
    CHECK(g.req.n_stop == 1 && !strcmp(g.stop[0], "x"));
    CHECK(!g.stream && !g.include_usage && !g.logprobs);
    uint64_t s1 = g.req.seed;
    srv_gen_free(&g);
    REQUIRE(parse(SRV_COMPLETION, "{\"prompt\":\"a\"}", &g, &e));
    CHECKF(g.req.seed != s1, "two unseeded requests got the same seed");
    CHECK(!g.max_tokens_set);
    CHECK(g.req.temperature == 1.0f); /* OpenAI's default */
    srv_gen_free(&g);

    /* Batches of one prompt. */
    REQUIRE(parse(SRV_COMPLETION, "{\"prompt\":[\"only\"]}", &g, &e));
    CHECK(g.prompt_text && !strcmp(g.prompt_text, "only"));
    srv_gen_free(&g);
    REQUIRE(parse(SRV_COMPLETION, "{\"prompt\":[[4,5]]}", &g, &e));
    CHECK(g.n_prompt_ids == 2 && g.prompt_ids[0] == 4);
    srv_gen_free(&g);
    /* stream_options without stream: include_usage stays off; null fields are absent. */
    REQUIRE(parse(SRV_COMPLETION,
                  "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true},"
                  "\"temperature\":null,\"stop\":null,\"logprobs\":null,\"n\":null}",
                  &g, &e));
    CHECK(!g.include_usage && !g.logprobs && g.req.n_stop == 0);
    srv_gen_free(&g);
}

static void test_defaults(void) {
    kiln_generation_defaults gd = {.has_temperature = true,
                                   .temperature = 0.7f,
                                   .has_top_p = true,
                                   .top_p = 0.8f,
                                   .has_top_k = true,
                                   .top_k = 20};
    srv_gen g;
    srv_error e;
    const char *b = "{\"prompt\":\"a\"}";
    REQUIRE(srv_gen_parse(SRV_COMPLETION, b, strlen(b), NV, &gd, &g, &e));
    CHECK(g.req.temperature == 0.7f && g.req.top_p == 0.8f && g.req.top_k == 20);
    srv_gen_free(&g);
    b = "{\"prompt\":\"a\",\"temperature\":0.2,\"top_k\":0}";
    REQUIRE(srv_gen_parse(SRV_COMPLETION, b, strlen(b), NV, &gd, &g, &e));
    CHECK(g.req.temperature == 0.2f && g.req.top_p == 0.8f && g.req.top_k == 0);
    srv_gen_free(&g);
    kiln_generation_defaults greedy = {.has_do_sample = true, .do_sample = false};
    b = "{\"prompt\":\"a\"}";
    REQUIRE(srv_gen_parse(SRV_COMPLETION, b, strlen(b), NV, &greedy, &g, &e));
    CHECK(g.req.temperature == 0.0f);
    srv_gen_free(&g);
}

static void test_chat_messages(void) {
    srv_gen g;
    srv_error e;
    const char *body = "{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"one\"},"
                       "{\"type\":\"text\",\"text\":\"two\"}],\"name\":\"bob\"},"
                       "{\"role\":\"assistant\",\"content\":null},"
                       "{\"role\":\"user\",\"content\":[]}],"
                       "\"logprobs\":true,\"top_logprobs\":2,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                       "\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    REQUIRE(parse(SRV_CHAT, body, &g, &e));
    REQUIRE(json_array_size(g.messages) == 4);
    json_t *m0 = json_array_get(g.messages, 0), *m1 = json_array_get(g.messages, 1);
    CHECK(!strcmp(json_string_value(json_object_get(m0, "role")), "system"));
    CHECK(!strcmp(json_string_value(json_object_get(m1, "content")), "one\ntwo"));
    CHECK(!strcmp(json_string_value(json_object_get(m1, "name")), "bob"));
    CHECK(
        !strcmp(json_string_value(json_object_get(json_array_get(g.messages, 2), "content")), ""));
    CHECK(
        !strcmp(json_string_value(json_object_get(json_array_get(g.messages, 3), "content")), ""));
    CHECK(g.logprobs && g.top_logprobs == 2 && g.req.top_logprobs == 2);
    CHECK(json_is_array(g.tools) && json_is_object(g.template_kwargs));
    CHECK(g.add_generation_prompt && !g.add_special);
    srv_gen_free(&g);
    /* The request's own body is not modified by normalisation. */
    REQUIRE(parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &g, &e));
    CHECK(json_array_size(g.messages) == 1);
    srv_gen_free(&g);
}

static void test_errors(void) {
    const srv_kind C = SRV_COMPLETION, H = SRV_CHAT;
    expect_400(C, "{\"prompt\":", "");
    expect_400(C, "", "");
    expect_400(C, "[1,2]", "");
    expect_400(C, "{}", "prompt");
    expect_400(C, "{\"prompt\":5}", "prompt");
    expect_400(C, "{\"prompt\":[]}", "prompt");
    expect_400(C, "{\"prompt\":[1,512]}", "prompt");
    expect_400(C, "{\"prompt\":[1,-1]}", "prompt");
    expect_400(C, "{\"prompt\":[1,\"a\"]}", "prompt");
    expect_400(C, "{\"prompt\":[\"a\",7]}", "prompt");
    expect_400(C, "{\"prompt\":[\"a\",[1,\"x\"]]}", "prompt[1]");
    expect_400(C,
               "{\"prompt\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
               "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
               "prompt");
    expect_400(C, "{\"prompt\":\"a\",\"max_tokens\":\"ten\"}", "max_tokens");
    expect_400(C, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens");
    expect_400(C, "{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens");
    expect_400(C, "{\"prompt\":\"a\",\"max_completion_tokens\":-3}", "max_completion_tokens");
    expect_400(C, "{\"prompt\":\"a\",\"temperature\":2.5}", "temperature");
    expect_400(C, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature");
    expect_400(C, "{\"prompt\":\"a\",\"temperature\":true}", "temperature");
    expect_400(C, "{\"prompt\":\"a\",\"top_p\":0}", "top_p");
    expect_400(C, "{\"prompt\":\"a\",\"top_p\":1.01}", "top_p");
    expect_400(C, "{\"prompt\":\"a\",\"top_k\":-2}", "top_k");
    expect_400(C, "{\"prompt\":\"a\",\"min_p\":-0.1}", "min_p");
    expect_400(C, "{\"prompt\":\"a\",\"xtc_probability\":1.5}", "xtc_probability");
    expect_400(C, "{\"prompt\":\"a\",\"xtc_threshold\":\"x\"}", "xtc_threshold");
    expect_400(C, "{\"prompt\":\"a\",\"presence_penalty\":2.1}", "presence_penalty");
    expect_400(C, "{\"prompt\":\"a\",\"frequency_penalty\":-3}", "frequency_penalty");
    expect_400(C, "{\"prompt\":\"a\",\"repetition_penalty\":0}", "repetition_penalty");
    expect_400(C, "{\"prompt\":\"a\",\"seed\":1.5}", "seed");
    expect_400(C, "{\"prompt\":\"a\",\"stop\":5}", "stop");
    expect_400(C, "{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop");
    expect_400(C, "{\"prompt\":\"a\",\"stop\":[\"a\",3]}", "stop");
    expect_400(C, "{\"prompt\":\"a\",\"logit_bias\":[1]}", "logit_bias");
    expect_400(C, "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", "logit_bias");
    expect_400(C, "{\"prompt\":\"a\",\"logit_bias\":{\"512\":1}}", "logit_bias");
    expect_400(C, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", "logit_bias");
    expect_400(C, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"1\"}}", "logit_bias");
    expect_400(C, "{\"prompt\":\"a\",\"logprobs\":21}", "logprobs");
    expect_400(C, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs");
    expect_400(C, "{\"prompt\":\"a\",\"n\":17}", "n");
    expect_400(C, "{\"prompt\":\"a\",\"n\":0}", "n");
    expect_400(C, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":6}", "n"); /* 18 choices */
    expect_400(C, "{\"prompt\":\"a\",\"stream\":\"yes\"}", "stream");
    expect_400(C, "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":3}", "stream_options");
    expect_400(C, "{\"prompt\":\"a\",\"best_of\":3}", "best_of");
    expect_400(C, "{\"prompt\":\"a\",\"stop_token_ids\":[600]}", "stop_token_ids");
    expect_400(H, "{\"messages\":[]}", "messages");
    expect_400(H, "{\"messages\":{}}", "messages");
    expect_400(H, "{}", "messages");
    expect_400(H, "{\"messages\":[3]}", "messages[0]");
    expect_400(H, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role");
    expect_400(H, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role");
    expect_400(H, "{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", "messages[0].role");
    expect_400(H, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content");
    expect_400(H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content");
    expect_400(H,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
               "\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
               "messages[1].content[0]");
    expect_400(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
               "messages[0].content[0]");
    expect_400(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}",
               "top_logprobs");
    expect_400(H,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,"
               "\"top_logprobs\":21}",
               "top_logprobs");
    expect_400(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":1}",
               "logprobs");
    expect_400(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":{}}", "tools");
    expect_400(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":17}", "n");
}

static json_t *load(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    CHECKF(j != NULL, "not JSON (%s): %s", je.text, s);
    return j;
}

static void test_error_json(void) {
    srv_error e;
    srv_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL, "bad key %d", 7);
    char *s = srv_error_json(&e, NULL);
    REQUIRE(s);
    json_t *j = load(s);
    json_t *in = json_object_get(j, "error");
    CHECK(json_is_object(in));
    CHECK(!strcmp(json_string_value(json_object_get(in, "message")), "bad key 7"));
    CHECK(!strcmp(json_string_value(json_object_get(in, "type")), "invalid_request_error"));
    CHECK(!strcmp(json_string_value(json_object_get(in, "code")), "invalid_api_key"));
    CHECK(json_is_null(json_object_get(in, "param")));
    json_decref(j);
    free(s);
}

/* OpenAI's usage: prompt_tokens (the cached ones included), completion_tokens, total_tokens
 * and prompt_tokens_details.cached_tokens (kiln_usage.cached_tokens). */
static void check_usage(json_t *u, int p, int cached, int c) {
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == p);
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == c);
    CHECK(json_integer_value(json_object_get(u, "total_tokens")) == p + c);
    json_t *d = json_object_get(u, "prompt_tokens_details");
    CHECKF(json_is_integer(json_object_get(d, "cached_tokens")) &&
               json_integer_value(json_object_get(d, "cached_tokens")) == cached,
           "usage.prompt_tokens_details.cached_tokens: want %d", cached);
}

static void test_responses(void) {
    srv_resp_info ri = {.kind = SRV_COMPLETION, .id = "cmpl-1", .created = 123, .model = "m"};
    kiln_usage u = {.prompt_tokens = 4, .completion_tokens = 2};
    char *s = srv_response_json(&ri, "hi \xE2\x82", 5, NULL, 0, KILN_FINISH_LENGTH, &u, NULL);
    REQUIRE(s);
    json_t *j = load(s);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "text_completion"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "id")), "cmpl-1"));
    CHECK(json_integer_value(json_object_get(j, "created")) == 123);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(json_array_size(json_object_get(j, "choices")) == 1);
    CHECK(json_integer_value(json_object_get(c0, "index")) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "text")), "hi \xEF\xBF\xBD"));
    CHECK(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), "length"));
    CHECK(json_is_null(json_object_get(c0, "logprobs")));
    check_usage(json_object_get(j, "usage"), 4, 0, 2);
    json_decref(j);
    free(s);

    /* A prefix-cache hit: the engine's cached_tokens, counted in prompt_tokens as well. */
    kiln_usage hit = {.prompt_tokens = 40, .cached_tokens = 32, .completion_tokens = 2};
    s = srv_response_json(&ri, "ok", 2, NULL, 0, KILN_FINISH_LENGTH, &hit, NULL);
    REQUIRE(s);
    j = load(s);
    check_usage(json_object_get(j, "usage"), 40, 32, 2);
    json_decref(j);
    free(s);

    ri.kind = SRV_CHAT;
    ri.id = "chatcmpl-1";
    s = srv_response_json(&ri, "ok", 2, NULL, 0, KILN_FINISH_STOP, &hit, NULL);
    j = load(s);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "chat.completion"));
    check_usage(json_object_get(j, "usage"), 40, 32, 2);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    CHECK(!strcmp(json_string_value(json_object_get(msg, "role")), "assistant"));
    CHECK(!strcmp(json_string_value(json_object_get(msg, "content")), "ok"));
    CHECK(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), "stop"));
    json_decref(j);
    free(s);
}

/* Split an SSE body into its data payloads. */
static int sse_split(const char *body, char payloads[][4096], int cap) {
    int n = 0;
    const char *p = body;
    while (*p && n < cap) {
        CHECKF(!strncmp(p, "data: ", 6), "event does not start with 'data: ': %.40s", p);
        if (strncmp(p, "data: ", 6) != 0) break;
        const char *end = strstr(p, "\n\n");
        REQUIRE(end);
        snprintf(payloads[n++], 4096, "%.*s", (int)(end - p - 6), p + 6);
        p = end + 2;
    }
    return n;
}

static void test_sse(void) {
    srv_resp_info ri = {
        .kind = SRV_CHAT, .id = "chatcmpl-x", .created = 1, .model = "m", .include_usage = true};
    srv_buf b = {0};
    int64_t off = 0;
    kiln_usage u = {.prompt_tokens = 19, .cached_tokens = 16, .completion_tokens = 1};
    REQUIRE(srv_sse_role(&ri, &b));
    REQUIRE(srv_sse_text(&ri, "Hi", 2, NULL, 0, &off, &b));
    REQUIRE(srv_sse_finish(&ri, KILN_FINISH_STOP, NULL, 0, &off, &b));
    REQUIRE(srv_sse_usage(&ri, &u, &b));
    REQUIRE(srv_sse_done(&b));
    static char pl[8][4096];
    int n = sse_split(b.p, pl, 8);
    REQUIRE(n == 5);
    json_t *j = load(pl[0]);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "chat.completion.chunk"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(c0, "delta"), "role")),
                  "assistant"));
    CHECK(json_is_null(json_object_get(c0, "finish_reason")));
    CHECK(json_object_get(j, "usage") && json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    j = load(pl[1]);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(
        !strcmp(json_string_value(json_object_get(json_object_get(c0, "delta"), "content")), "Hi"));
    json_decref(j);
    j = load(pl[2]);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(json_object_size(json_object_get(c0, "delta")) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), "stop"));
    json_decref(j);
    j = load(pl[3]);
    CHECK(json_array_size(json_object_get(j, "choices")) == 0);
    check_usage(json_object_get(j, "usage"), 19, 16, 1);
    json_decref(j);
    CHECK(!strcmp(pl[4], "[DONE]"));
    srv_buf_free(&b);

    /* Completions chunks: no role chunk, no usage keys without include_usage. */
    ri.kind = SRV_COMPLETION;
    ri.include_usage = false;
    REQUIRE(srv_sse_role(&ri, &b));
    CHECK(b.len == 0);
    REQUIRE(srv_sse_text(&ri, "x", 1, NULL, 0, &off, &b));
    n = sse_split(b.p, pl, 8);
    REQUIRE(n == 1);
    j = load(pl[0]);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "text_completion"));
    CHECK(json_object_get(j, "usage") == NULL);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "text")), "x"));
    json_decref(j);
    srv_buf_free(&b);
}

static void repair_case(const char *in, size_t n, const char *want) {
    srv_buf b = {0};
    REQUIRE(srv_utf8_repair(in, n, &b));
    CHECKF(b.len == strlen(want) && !memcmp(b.p, want, b.len), "repair of %zu bytes gave '%s'", n,
           b.p);
    srv_buf_free(&b);
}

static void test_utf8(void) {
    repair_case("abc", 3, "abc");
    repair_case("", 0, "");
    repair_case("a\xE2\x82", 3, "a\xEF\xBF\xBD"); /* truncated 3-byte: one U+FFFD */
    repair_case("\xE2\x82"
                "A",
                3,
                "\xEF\xBF\xBD"
                "A");                                       /* interrupted */
    repair_case("\x80\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"); /* lone continuation bytes */
    repair_case("\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"); /* overlong: no valid prefix */
    repair_case("\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"); /* surrogate */
    repair_case("\xF0\x9F\x90\xB6", 4, "\xF0\x9F\x90\xB6");
    CHECK(srv_utf8_count("a\xC3\xA9\xF0\x9F\x90\xB6", 7) == 3);
    CHECK(srv_secret_equal("sk-abc", "sk-abc"));
    CHECK(!srv_secret_equal("sk-abc", "sk-abd"));
    CHECK(!srv_secret_equal("sk-abc", "sk-ab"));
    CHECK(!srv_secret_equal("", "x"));
    char id1[48], id2[48];
    srv_make_id("cmpl-", id1, sizeof id1);
    srv_make_id("cmpl-", id2, sizeof id2);
    CHECK(strlen(id1) == 5 + 24 && !strncmp(id1, "cmpl-", 5) && strcmp(id1, id2) != 0);
}

/* Chat templates through the server's context (transformers' apply_chat_template variables). */
static void render_case(const char *src, const char *bos, const char *body, bool expect_ok,
                        const char *want) {
    /* No model: src NULL gives the ChatML fallback; bos NULL renders bos_token as "". */
    kiln_chat_template_params tp = {.source = src, .bos_token = bos, .eos_token = "</s>"};
    srv_chat c;
    REQUIRE(srv_chat_init(&c, NULL, &tp, NULL) == KILN_OK);
    CHECK(c.fallback == (src == NULL) && c.bos_id == -1 && !c.add_bos);
    srv_gen g;
    srv_error e;
    REQUIRE(parse(SRV_CHAT, body, &g, &e));
    char *out = NULL;
    size_t len = 0;
    memset(&e, 0, sizeof e);
    bool ok = srv_chat_render(&c, &g, &out, &len, &e);
    CHECKF(ok == expect_ok, "render of %s: %s", body, ok ? out : e.message);
    if (ok && expect_ok) CHECKF(!strcmp(out, want), "rendered '%s'\n want '%s'", out, want);
    if (!ok && !expect_ok) {
        CHECK(e.http_status == 400);
        CHECKF(!strcmp(e.message, want), "template error '%s', want '%s'", e.message, want);
        CHECK(e.code && !strcmp(e.code, "chat_template_error"));
    }
    kiln_free(out);
    srv_gen_free(&g);
    srv_chat_free(&c);
}

static void test_templates(void) {
    /* ChatML as template.h specifies it. */
    render_case(NULL, NULL,
                "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                "\"content\":[{\"type\":\"text\",\"text\":\"U1\"},{\"type\":\"text\","
                "\"text\":\"U2\"}]}]}",
                true,
                "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1\nU2<|im_end|>\n"
                "<|im_start|>assistant\n");
    render_case(kiln_template_chatml, NULL,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"U\"}],"
                "\"add_generation_prompt\":false}",
                true, "<|im_start|>user\nU<|im_end|>\n");
    /* raise_exception: a 400 carrying the template's own text. */
    render_case("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
                "supported') }}{% endif %}ok",
                NULL, "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", false,
                "System role not supported");
    /* The variables: bos/eos tokens, add_generation_prompt, tools (None when absent),
     * chat_template_kwargs; "developer" arrives as "system". */
    render_case("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|"
                "{{ messages|length }}|{{ messages[0].role }}|{{ enable_thinking }}",
                "<s>",
                "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\","
                "\"content\":\"u\"}],\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                true, "<s>|</s>|True|True|2|system|False");
    /* Through kiln_chat_template_render's JSON texts: kwargs lose to the conversation's own
     * variables but set bos_token; reals and integers keep their exact values and types, key
     * order is kept. */
    render_case("{{ bos_token }}|{{ messages|length }}|{{ add_generation_prompt }}|{{ x }}|"
                "{{ y }}|{{ z|tojson }}|{{ messages[0].content|length }}|{{ documents is none }}",
                "<s>",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u00e9b\"}],"
                "\"chat_template_kwargs\":{\"bos_token\":\"B\",\"messages\":[],"
                "\"add_generation_prompt\":false,\"x\":0.1,\"y\":3,\"z\":{\"k2\":1.5,\"k1\":2}}}",
                true, "B|1|True|0.1|3|{\"k2\": 1.5, \"k1\": 2}|3|True");
    render_case("{{ tools[0].function.name }}", NULL,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"tools\":[{\"type\":"
                "\"function\",\"function\":{\"name\":\"get_weather\"}}]}",
                true, "get_weather");
}

/* Speculation, prediction and fill (issue 18): what each field maps to in kiln_request, and a
 * 400 naming the field for every wrong type or value (OpenAI's Predicted Outputs shape for
 * prediction; kiln's speculation and fill extensions). */
static void test_spec_fields(void) {
    const srv_kind C = SRV_COMPLETION, H = SRV_CHAT;
    srv_gen g;
    srv_error e;
    /* Nothing given: the engine's defaults. */
    REQUIRE(parse(C, "{\"prompt\":\"a\"}", &g, &e));
    CHECK(g.req.spec == KILN_SPEC_DEFAULT && g.req.spec_k == 0 &&
          g.req.spec_accept == KILN_SPEC_ACCEPT_EXACT);
    CHECK(!g.has_prediction && !g.req.prediction && !g.has_fill && !g.req.fill);
    srv_gen_free(&g);
    /* prediction as a string and as text parts (concatenated as they are). */
    REQUIRE(parse(C,
                  "{\"prompt\":\"a\",\"prediction\":{\"type\":\"content\",\"content\":\"x = "
                  "1\\ny = 2\"}}",
                  &g, &e));
    CHECK(g.has_prediction && g.req.prediction && g.req.prediction_len == 11 &&
          !memcmp(g.req.prediction, "x = 1\ny = 2", 11));
    srv_gen_free(&g);
    REQUIRE(parse(H,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"prediction\":{\"type\":"
                  "\"content\",\"content\":[{\"type\":\"text\",\"text\":\"ab\"},{\"type\":\"text\","
                  "\"text\":\"c\"}]}}",
                  &g, &e));
    CHECK(g.has_prediction && g.req.prediction_len == 3 && !memcmp(g.req.prediction, "abc", 3));
    srv_gen_free(&g);
    REQUIRE(parse(C, "{\"prompt\":\"a\",\"prediction\":{\"type\":\"content\",\"content\":[]}}", &g,
                  &e));
    CHECK(g.has_prediction && g.req.prediction && g.req.prediction_len == 0);
    srv_gen_free(&g);
    /* fill: policy assert by default, verify on request. */
    REQUIRE(parse(C, "{\"prompt\":\"a\",\"fill\":{\"content\":\"The end\"}}", &g, &e));
    CHECK(g.has_fill && g.req.fill && g.req.fill_len == 7 && !memcmp(g.req.fill, "The end", 7) &&
          g.req.fill_policy == KILN_FILL_ASSERT && !g.req.fill_hidden);
    srv_gen_free(&g);
    REQUIRE(parse(H,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"fill\":{\"content\":"
                  "\"ok\",\"policy\":\"verify\"}}",
                  &g, &e));
    CHECK(g.has_fill && g.req.fill_policy == KILN_FILL_VERIFY && g.req.fill_len == 2);
    CHECK(!g.prefill && json_array_size(g.messages) == 1);
    srv_gen_free(&g);
    /* An assert fill may come with a prediction. */
    REQUIRE(parse(C,
                  "{\"prompt\":\"a\",\"fill\":{\"content\":\"b\",\"policy\":\"assert\"},"
                  "\"prediction\":{\"type\":\"content\",\"content\":\"bc\"}}",
                  &g, &e));
    CHECK(g.has_fill && g.has_prediction);
    srv_gen_free(&g);
    /* speculation: false, true, and each field. */
    REQUIRE(parse(C, "{\"prompt\":\"a\",\"speculation\":false}", &g, &e));
    CHECK(g.req.spec == KILN_SPEC_OFF);
    srv_gen_free(&g);
    REQUIRE(parse(C, "{\"prompt\":\"a\",\"speculation\":true}", &g, &e));
    CHECK(g.req.spec == KILN_SPEC_DEFAULT);
    srv_gen_free(&g);
    static const struct {
        const char *name;
        kiln_spec_source v;
    } src[] = {{"default", KILN_SPEC_DEFAULT}, {"off", KILN_SPEC_OFF}, {"ngram", KILN_SPEC_NGRAM},
               {"draft", KILN_SPEC_DRAFT},     {"random", KILN_SPEC_RANDOM}};
    for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) {
        char body[160];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"a\",\"speculation\":{\"source\":\"%s\",\"k\":%zu,\"accept\":"
                 "\"%s\"}}",
                 src[i].name, 1 + i * 7, i % 2 ? "rejection" : "exact");
        REQUIRE(parse(C, body, &g, &e));
        CHECKF(g.req.spec == src[i].v && g.req.spec_k == (int32_t)(1 + i * 7) &&
                   g.req.spec_accept ==
                       (i % 2 ? KILN_SPEC_ACCEPT_REJECTION : KILN_SPEC_ACCEPT_EXACT),
               "%s", body);
        srv_gen_free(&g);
    }
    REQUIRE(parse(C, "{\"prompt\":\"a\",\"speculation\":{\"k\":32}}", &g, &e));
    CHECK(g.req.spec == KILN_SPEC_DEFAULT && g.req.spec_k == 32);
    /* "draft" depends on the engine. */
    CHECK(srv_gen_check_engine(&g, false, &e));
    srv_gen_free(&g);
    REQUIRE(parse(C, "{\"prompt\":\"a\",\"speculation\":{\"source\":\"draft\"}}", &g, &e));
    CHECK(srv_gen_check_engine(&g, true, &e));
    memset(&e, 0, sizeof e);
    CHECK(!srv_gen_check_engine(&g, false, &e));
    CHECK(e.http_status == 400 && !strcmp(e.param, "speculation.source") &&
          strstr(e.message, "--draft-model"));
    srv_gen_free(&g);

    /* The 400s, each naming its field. */
    expect_400(C, "{\"prompt\":\"a\",\"prediction\":\"text\"}", "prediction");
    expect_400(C, "{\"prompt\":\"a\",\"prediction\":{\"content\":\"x\"}}", "prediction.type");
    expect_400(C, "{\"prompt\":\"a\",\"prediction\":{\"type\":\"text\",\"content\":\"x\"}}",
               "prediction.type");
    expect_400(C, "{\"prompt\":\"a\",\"prediction\":{\"type\":\"content\"}}", "prediction.content");
    expect_400(C, "{\"prompt\":\"a\",\"prediction\":{\"type\":\"content\",\"content\":5}}",
               "prediction.content");
    expect_400(C,
               "{\"prompt\":\"a\",\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":"
               "\"text\",\"text\":\"a\"},{\"type\":\"text\"}]}}",
               "prediction.content[1]");
    expect_400(C,
               "{\"prompt\":\"a\",\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":"
               "\"image_url\",\"text\":\"a\"}]}}",
               "prediction.content[0]");
    expect_400(C, "{\"prompt\":\"a\",\"prediction\":{\"type\":\"content\",\"content\":[\"a\"]}}",
               "prediction.content[0]");
    expect_400(C, "{\"prompt\":\"a\",\"fill\":\"x\"}", "fill");
    expect_400(C, "{\"prompt\":\"a\",\"fill\":{}}", "fill.content");
    expect_400(C, "{\"prompt\":\"a\",\"fill\":{\"content\":[\"x\"]}}", "fill.content");
    expect_400(C, "{\"prompt\":\"a\",\"fill\":{\"content\":\"x\",\"policy\":\"force\"}}",
               "fill.policy");
    expect_400(C, "{\"prompt\":\"a\",\"fill\":{\"content\":\"x\",\"policy\":1}}", "fill.policy");
    expect_400(C,
               "{\"prompt\":\"a\",\"fill\":{\"content\":\"x\",\"policy\":\"verify\"},"
               "\"prediction\":{\"type\":\"content\",\"content\":\"xy\"}}",
               "fill");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":\"ngram\"}", "speculation");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":3}", "speculation");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":{\"source\":\"eagle\"}}",
               "speculation.source");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":{\"source\":2}}", "speculation.source");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":{\"k\":0}}", "speculation.k");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":{\"k\":33}}", "speculation.k");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":{\"k\":2.5}}", "speculation.k");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":{\"k\":\"4\"}}", "speculation.k");
    expect_400(C, "{\"prompt\":\"a\",\"speculation\":{\"accept\":\"greedy\"}}",
               "speculation.accept");
    expect_400(H,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"speculation\":{\"k\":"
               "-1}}",
               "speculation.k");
    expect_400(H,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"prediction\":{\"type\":"
               "\"content\",\"content\":null}}",
               "prediction.content");
    /* The messages quote the field and the rule. */
    const struct {
        const char *body, *want;
    } msgs[] = {
        {"{\"prompt\":\"a\",\"prediction\":{\"type\":\"x\",\"content\":\"y\"}}",
         "prediction.type must be \"content\""},
        {"{\"prompt\":\"a\",\"speculation\":{\"k\":99}}",
         "speculation.k must be an integer in [1, 32]"},
        {"{\"prompt\":\"a\",\"fill\":{\"content\":\"x\",\"policy\":\"nope\"}}",
         "fill.policy must be \"assert\" or \"verify\""},
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        CHECK(!parse(C, msgs[i].body, &g, &e));
        CHECKF(strstr(e.message, msgs[i].want), "message '%s' lacks '%s'", e.message,
               msgs[i].want);
        srv_gen_free(&g);
    }
}

/* Chat assistant prefill: a final assistant message (string or text parts, no tool_calls) is
 * taken out of the rendered messages, the prompt ends with the generation prompt, and its
 * content becomes srv_gen.prefill; add_generation_prompt false keeps the old rendering. */
static void test_prefill_parse(void) {
    srv_gen g;
    srv_error e;
    REQUIRE(parse(SRV_CHAT,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
                  "\"content\":\"Once upon\"}]}",
                  &g, &e));
    CHECK(json_array_size(g.messages) == 1 && g.add_generation_prompt);
    CHECK(json_is_string(g.prefill) && !strcmp(json_string_value(g.prefill), "Once upon"));
    srv_gen_free(&g);
    REQUIRE(parse(SRV_CHAT,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
                  "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":"
                  "\"b\"}]}]}",
                  &g, &e));
    CHECK(json_array_size(g.messages) == 1 && json_is_string(g.prefill) &&
          !strcmp(json_string_value(g.prefill), "a\nb"));
    srv_gen_free(&g);
    /* Not a prefill: an assistant message before the last, a tool call, a null content,
     * add_generation_prompt false. */
    const char *not_prefill[] = {
        "{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"user\","
        "\"content\":\"u\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
        "\"content\":\"\",\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
        "\"content\":null}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
        "\"content\":\"a\"}],\"add_generation_prompt\":false}",
    };
    for (size_t i = 0; i < sizeof not_prefill / sizeof not_prefill[0]; i++) {
        REQUIRE(parse(SRV_CHAT, not_prefill[i], &g, &e));
        CHECKF(!g.prefill && json_array_size(g.messages) == 2, "%s", not_prefill[i]);
        srv_gen_free(&g);
    }
    /* A fill cannot also continue an assistant message. */
    expect_400(SRV_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
               "\"content\":\"a\"}],\"fill\":{\"content\":\"b\"}}",
               "fill");

    /* Rendered through ChatML: the prefix ends with the generation prompt, without the
     * assistant message (template.h's ChatML: "<|im_start|>assistant\n"). */
    kiln_chat_template_params tp = {.eos_token = "</s>"};
    srv_chat c;
    REQUIRE(srv_chat_init(&c, NULL, &tp, NULL) == KILN_OK);
    REQUIRE(parse(SRV_CHAT,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"U\"},{\"role\":\"assistant\","
                  "\"content\":\"A\"}]}",
                  &g, &e));
    char *out = NULL;
    size_t len = 0;
    REQUIRE(srv_chat_render(&c, &g, &out, &len, &e));
    CHECKF(!strcmp(out, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"), "rendered '%s'",
           out);
    kiln_free(out);
    srv_gen_free(&g);
    srv_chat_free(&c);
}

/* usage: OpenAI's completion_tokens_details (always present) and kiln's speculation object,
 * whole and in the include_usage chunk. */
static void check_spec_usage(json_t *u, const kiln_usage *want) {
    json_t *d = json_object_get(u, "completion_tokens_details");
    CHECKF(json_is_object(d), "usage.completion_tokens_details missing");
    CHECK(json_integer_value(json_object_get(d, "accepted_prediction_tokens")) ==
              want->accepted_prediction_tokens &&
          json_is_integer(json_object_get(d, "accepted_prediction_tokens")));
    CHECK(json_integer_value(json_object_get(d, "rejected_prediction_tokens")) ==
              want->rejected_prediction_tokens &&
          json_is_integer(json_object_get(d, "rejected_prediction_tokens")));
    json_t *s = json_object_get(u, "speculation");
    CHECKF(json_is_object(s), "usage.speculation missing");
    CHECK(json_integer_value(json_object_get(s, "drafted_tokens")) == want->spec_drafted);
    CHECK(json_integer_value(json_object_get(s, "accepted_tokens")) == want->spec_accepted);
    CHECK(json_integer_value(json_object_get(s, "verify_steps")) == want->spec_verify_steps);
    CHECK(json_integer_value(json_object_get(s, "fill_tokens")) == want->fill_tokens);
}

static void test_spec_usage(void) {
    kiln_usage u = {.prompt_tokens = 9,
                    .completion_tokens = 20,
                    .spec_drafted = 17,
                    .spec_accepted = 11,
                    .spec_verify_steps = 5,
                    .fill_tokens = 3,
                    .accepted_prediction_tokens = 12,
                    .rejected_prediction_tokens = 4};
    kiln_usage zero = {.prompt_tokens = 1, .completion_tokens = 1};
    for (int k = 0; k < 2; k++) {
        srv_resp_info ri = {.kind = k ? SRV_CHAT : SRV_COMPLETION,
                            .id = "x-1",
                            .created = 1,
                            .model = "m",
                            .include_usage = true};
        for (int z = 0; z < 2; z++) {
            const kiln_usage *w = z ? &zero : &u;
            char *s = srv_response_json(&ri, "t", 1, NULL, 0, KILN_FINISH_STOP, w, NULL);
            REQUIRE(s);
            json_t *j = load(s);
            check_usage(json_object_get(j, "usage"), w->prompt_tokens, 0, w->completion_tokens);
            check_spec_usage(json_object_get(j, "usage"), w);
            json_decref(j);
            free(s);
            srv_buf b = {0};
            REQUIRE(srv_sse_usage(&ri, w, &b));
            REQUIRE(b.p && !strncmp(b.p, "data: ", 6));
            j = load(b.p + 6);
            check_spec_usage(json_object_get(j, "usage"), w);
            json_decref(j);
            srv_buf_free(&b);
        }
    }
}

int main(void) {
    test_completion_fields();
    test_echo_logprobs_fields();
    test_defaults();
    test_chat_messages();
    test_errors();
    test_error_json();
    test_responses();
    test_sse();
    test_utf8();
    test_templates();
    test_spec_fields();
    test_prefill_parse();
    test_spec_usage();
    return kiln_test_finish("test_server_openai");
}
