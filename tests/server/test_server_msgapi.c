/*
 * test_server_msgapi.c - POST /v1/messages (Anthropic Messages) and POST /v1/responses (OpenAI
 * Responses) through the in-process server over loopback (issue 20):
 *   - response shapes, and the generated text equal to the chat route's for the equivalent
 *     chat request (the translation must not change what the engine produces);
 *   - the streams' event grammar (Anthropic: message_start, ping, content_block_start, deltas,
 *     content_block_stop, message_delta, message_stop; Responses: response.created ...
 *     response.completed with consecutive sequence numbers), their text equal to the whole
 *     response's;
 *   - stop_sequences (stop_reason "stop_sequence" naming the one that matched), assistant
 *     prefill, tool_use / tool_result and function_call / function_call_output items,
 *     item_reference, cache_read_input_tokens / cached_tokens on a repeated prompt;
 *   - errors in each API's shape, with the right statuses;
 *   - the response store: previous_response_id, GET and DELETE, store false, an unknown id
 *     (404), TTL expiry and byte-cap eviction (least recently used first), and the store's own
 *     API (response_store.h) with a moved clock.
 */
#include "server/response_store.h"
#include "server_test_util.h"

static kiln_model *g_model;
static const char *KEY = "sk-msgapi";
static const char *AUTH_ANTH = "x-api-key: sk-msgapi\r\nanthropic-version: 2023-06-01\r\n";
static const char *AUTH_OAI = "Authorization: Bearer sk-msgapi\r\n";

/* ------------------------------------------------------------------------------------ */
/* Helpers.                                                                              */

static json_t *post_json(tsrv *t, const char *path, const char *hdr, const char *body,
                         int *status) {
    tu_resp r = tu_request(t->port, "POST", path, hdr, body);
    *status = r.status;
    json_t *j = tu_json(&r);
    if (!j) fprintf(stderr, "POST %s: %d, not JSON: %.300s\n", path, r.status, r.body.p);
    tu_free(&r);
    return j;
}

/* The chat route's reply to body: content (malloc'd), finish_reason and usage. */
typedef struct chat_ref {
    char *text;
    char finish[16];
    long long prompt, completion, cached;
} chat_ref;

static chat_ref chat_reference(tsrv *t, const char *body) {
    chat_ref c = {0};
    int st = 0;
    json_t *j = post_json(t, "/v1/chat/completions", AUTH_OAI, body, &st);
    CHECKF(st == 200, "reference chat: %d for %s", st, body);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *tx = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    c.text = strdup(tx ? tx : "");
    snprintf(c.finish, sizeof c.finish, "%s",
             json_string_value(json_object_get(ch, "finish_reason")) ?: "");
    json_t *u = json_object_get(j, "usage");
    c.prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
    c.completion = json_integer_value(json_object_get(u, "completion_tokens"));
    c.cached = json_integer_value(
        json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    json_decref(j);
    return c;
}

/* SSE with named events: [{"event": name, "data": parsed}, ...]; NULL when malformed. */
static json_t *parse_sse(const char *body) {
    json_t *arr = json_array();
    char *copy = strdup(body ? body : "");
    char *p = copy;
    while (p && *p) {
        char *end = strstr(p, "\n\n");
        if (!end) {
            fprintf(stderr, "SSE: unterminated event: %.200s\n", p);
            json_decref(arr);
            arr = NULL;
            break;
        }
        *end = '\0';
        char *nl = strchr(p, '\n');
        if (strncmp(p, "event: ", 7) || !nl || strncmp(nl + 1, "data: ", 6)) {
            fprintf(stderr, "SSE: not 'event:' then 'data:': %.200s\n", p);
            json_decref(arr);
            arr = NULL;
            break;
        }
        *nl = '\0';
        json_t *d = json_loads(nl + 7, 0, NULL);
        if (!d) {
            fprintf(stderr, "SSE: data is not JSON: %.200s\n", nl + 7);
            json_decref(arr);
            arr = NULL;
            break;
        }
        json_array_append_new(arr, json_pack("{s:s, s:o}", "event", p + 7, "data", d));
        p = end + 2;
    }
    free(copy);
    return arr;
}

static json_t *stream_events(tsrv *t, const char *path, const char *hdr, const char *body) {
    tu_resp r = tu_request(t->port, "POST", path, hdr, body);
    CHECKF(r.status == 200, "stream %s: %d %.300s", path, r.status, r.body.p);
    CHECKF(strcasestr(r.headers, "content-type: text/event-stream") != NULL, "stream %s headers: %s",
           path, r.headers);
    json_t *ev = r.status == 200 ? parse_sse(r.body.p) : NULL;
    tu_free(&r);
    return ev;
}

static const char *ev_name(json_t *evs, size_t i) {
    return json_string_value(json_object_get(json_array_get(evs, i), "event")) ?: "";
}
static json_t *ev_data(json_t *evs, size_t i) {
    return json_object_get(json_array_get(evs, i), "data");
}
static const char *sget(json_t *o, const char *k) {
    return json_string_value(json_object_get(o, k)) ?: "";
}
static long long iget(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* An Anthropic error body of type `type` (NULL: any). */
static void expect_anth_error(tsrv *t, const char *method, const char *path, const char *hdr,
                              const char *body, int status, const char *type, const char *needle) {
    tu_resp r = tu_request(t->port, method, path, hdr, body);
    CHECKF(r.status == status, "%s %s %.120s: %d, want %d (%.300s)", method, path, body ?: "",
           r.status, status, r.body.p);
    json_t *j = tu_json(&r);
    CHECKF(!strcmp(sget(j, "type"), "error"), "not an Anthropic error: %.300s", r.body.p);
    json_t *e = json_object_get(j, "error");
    CHECKF(json_is_string(json_object_get(e, "message")), "no error.message: %.300s", r.body.p);
    if (type)
        CHECKF(!strcmp(sget(e, "type"), type), "error type '%s', want '%s' (%.200s)", sget(e, "type"),
               type, body ?: "");
    if (needle)
        CHECKF(strstr(sget(e, "message"), needle) != NULL, "message '%s' lacks '%s'",
               sget(e, "message"), needle);
    json_decref(j);
    tu_free(&r);
}

/* An OpenAI error body. */
static void expect_oai_error(tsrv *t, const char *method, const char *path, const char *body,
                             int status, const char *code, const char *param, const char *needle) {
    tu_resp r = tu_request(t->port, method, path, AUTH_OAI, body);
    CHECKF(r.status == status, "%s %s %.160s: %d, want %d (%.300s)", method, path, body ?: "",
           r.status, status, r.body.p);
    json_t *j = tu_json(&r);
    json_t *e = json_object_get(j, "error");
    CHECKF(json_is_string(json_object_get(e, "message")), "not an OpenAI error: %.300s", r.body.p);
    if (code)
        CHECKF(!strcmp(sget(e, "code"), code), "code '%s', want '%s'", sget(e, "code"), code);
    if (param)
        CHECKF(!strcmp(sget(e, "param"), param), "param '%s', want '%s' (%.200s)", sget(e, "param"),
               param, body ?: "");
    if (needle)
        CHECKF(strstr(sget(e, "message"), needle) != NULL, "message '%s' lacks '%s'",
               sget(e, "message"), needle);
    json_decref(j);
    tu_free(&r);
}

static char *json_str(const char *s) {
    json_t *j = json_string(s);
    char *out = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    return out;
}

/* ------------------------------------------------------------------------------------ */
/* The store's API with a moved clock.                                                   */

static void test_store_unit(void) {
    char big[201];
    memset(big, 'x', 200);
    big[200] = '\0';
    const size_t one = SRV_RSTORE_ENTRY_OVERHEAD + 1 + 200 + 200; /* id "a", two strings */
    srv_rstore *s = srv_rstore_create(2 * one + one / 2, 10.0);
    REQUIRE(s);
    CHECK(srv_rstore_put(s, "a", big, big, NULL, 0, 0.0));
    int64_t n = 0;
    size_t bytes = 0;
    srv_rstore_stats(s, &n, &bytes);
    CHECKF(n == 1 && bytes == one, "one entry: n %lld bytes %zu (want %zu)", (long long)n, bytes,
           one);
    char *g = srv_rstore_get(s, "a", SRV_RSTORE_RESPONSE, 9.9);
    CHECK(g && !strcmp(g, big));
    free(g);
    CHECK(srv_rstore_get(s, "a", SRV_RSTORE_MESSAGES, 10.0) == NULL); /* expired at 0 + 10 */
    srv_rstore_stats(s, &n, &bytes);
    CHECKF(n == 0 && bytes == 0, "expired entry kept: n %lld bytes %zu", (long long)n, bytes);

    /* LRU: a, b stored; a read; c evicts b (not a). */
    const char *item[] = {"msg_1"};
    CHECK(srv_rstore_put(s, "a", big, big, NULL, 0, 20.0));
    CHECK(srv_rstore_put(s, "b", big, big, item, 1, 21.0));
    g = srv_rstore_find_item(s, "msg_1", 21.5);
    CHECK(g && !strcmp(g, big));
    free(g);
    CHECK(srv_rstore_find_item(s, "msg_2", 21.5) == NULL);
    g = srv_rstore_get(s, "a", SRV_RSTORE_RESPONSE, 22.0);
    CHECK(g != NULL);
    free(g);
    CHECK(srv_rstore_put(s, "c", big, big, NULL, 0, 23.0));
    g = srv_rstore_get(s, "b", SRV_RSTORE_RESPONSE, 23.0);
    CHECKF(g == NULL, "the least recently used entry b survived");
    free(g);
    g = srv_rstore_get(s, "a", SRV_RSTORE_RESPONSE, 23.0);
    CHECKF(g != NULL, "the recently read entry a was evicted");
    free(g);
    CHECK(srv_rstore_find_item(s, "msg_1", 23.0) == NULL);
    srv_rstore_stats(s, &n, &bytes);
    CHECK(n == 2 && bytes <= 2 * one + one / 2);

    /* Replacing an id keeps one entry; an entry larger than the cap is refused and drops the
     * old one of its id. */
    CHECK(srv_rstore_put(s, "a", "short", "[]", NULL, 0, 24.0));
    srv_rstore_stats(s, &n, &bytes);
    CHECK(n == 2);
    char huge[2000];
    memset(huge, 'y', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    CHECK(!srv_rstore_put(s, "a", huge, "[]", NULL, 0, 25.0));
    CHECK(srv_rstore_get(s, "a", SRV_RSTORE_RESPONSE, 25.0) == NULL);
    CHECK(srv_rstore_delete(s, "c", 25.0));
    CHECK(!srv_rstore_delete(s, "c", 25.0));
    srv_rstore_stats(s, &n, &bytes);
    CHECKF(n == 0 && bytes == 0, "after deletes: n %lld bytes %zu", (long long)n, bytes);
    srv_rstore_destroy(s);

    /* A zero cap stores nothing. */
    s = srv_rstore_create(0, 10.0);
    CHECK(!srv_rstore_put(s, "a", "x", "[]", NULL, 0, 0.0));
    CHECK(srv_rstore_get(s, "a", SRV_RSTORE_RESPONSE, 0.0) == NULL);
    srv_rstore_destroy(s);
    srv_rstore_destroy(NULL);
}

/* ------------------------------------------------------------------------------------ */
/* Anthropic Messages.                                                                   */

static const char *SYS = "You are a storyteller.";
static const char *USER = "Tell me a story about a cat.";

static void test_anthropic_basic(tsrv *t) {
    char body[1024], ref_body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"stories\",\"max_tokens\":24,\"temperature\":0,\"system\":\"%s\","
             "\"metadata\":{\"user_id\":\"u1\"},\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}",
             SYS, USER);
    snprintf(ref_body, sizeof ref_body,
             "{\"max_tokens\":24,\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":"
             "\"%s\"},{\"role\":\"user\",\"content\":\"%s\"}]}",
             SYS, USER);
    chat_ref ref = chat_reference(t, ref_body);
    REQUIRE(ref.text && strlen(ref.text) > 0);
    int st = 0;
    json_t *j = post_json(t, "/v1/messages", AUTH_ANTH, body, &st);
    CHECKF(st == 200, "messages: %d", st);
    CHECK(!strncmp(sget(j, "id"), "msg_", 4));
    CHECK(!strcmp(sget(j, "type"), "message"));
    CHECK(!strcmp(sget(j, "role"), "assistant"));
    CHECK(!strcmp(sget(j, "model"), "stories"));
    json_t *content = json_object_get(j, "content");
    CHECKF(json_array_size(content) == 1, "content blocks: %zu", json_array_size(content));
    json_t *blk = json_array_get(content, 0);
    CHECK(!strcmp(sget(blk, "type"), "text"));
    CHECKF(!strcmp(sget(blk, "text"), ref.text), "messages text '%s', chat route's '%s'",
           sget(blk, "text"), ref.text);
    const char *want_stop = !strcmp(ref.finish, "length") ? "max_tokens" : "end_turn";
    CHECKF(!strcmp(sget(j, "stop_reason"), want_stop), "stop_reason %s (chat finish %s)",
           sget(j, "stop_reason"), ref.finish);
    CHECK(json_is_null(json_object_get(j, "stop_sequence")));
    json_t *u = json_object_get(j, "usage");
    long long in = iget(u, "input_tokens"), cr = iget(u, "cache_read_input_tokens");
    CHECKF(in >= 0 && cr >= 0 && in + cr == ref.prompt, "input %lld + cache_read %lld != %lld", in,
           cr, ref.prompt);
    CHECK(iget(u, "cache_creation_input_tokens") == 0);
    CHECK(iget(u, "output_tokens") == ref.completion);

    /* Streamed: the event grammar, and the same text, stop reason and usage. */
    char sbody[1100];
    snprintf(sbody, sizeof sbody, "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    json_t *evs = stream_events(t, "/v1/messages", AUTH_ANTH, sbody);
    REQUIRE(evs);
    size_t n = json_array_size(evs);
    REQUIRE(n >= 4);
    for (size_t i = 0; i < n; i++)
        CHECKF(!strcmp(ev_name(evs, i), sget(ev_data(evs, i), "type")),
               "event %zu: name %s, data.type %s", i, ev_name(evs, i), sget(ev_data(evs, i), "type"));
    CHECKF(!strcmp(ev_name(evs, 0), "message_start"), "first event %s", ev_name(evs, 0));
    json_t *m0 = json_object_get(ev_data(evs, 0), "message");
    CHECK(!strncmp(sget(m0, "id"), "msg_", 4) && json_array_size(json_object_get(m0, "content")) == 0);
    CHECK(json_is_null(json_object_get(m0, "stop_reason")));
    CHECK(iget(json_object_get(m0, "usage"), "output_tokens") == 0);
    CHECK(!strcmp(ev_name(evs, 1), "ping"));
    /* block start, deltas, block stop, then message_delta and message_stop */
    size_t i = 2;
    CHECKF(!strcmp(ev_name(evs, i), "content_block_start"), "event 2: %s", ev_name(evs, i));
    json_t *cb = json_object_get(ev_data(evs, i), "content_block");
    CHECK(iget(ev_data(evs, i), "index") == 0 && !strcmp(sget(cb, "type"), "text") &&
          !strcmp(sget(cb, "text"), ""));
    srv_buf text = {0};
    srv_buf_add(&text, "", 0);
    for (i = 3; i < n && !strcmp(ev_name(evs, i), "content_block_delta"); i++) {
        json_t *d = json_object_get(ev_data(evs, i), "delta");
        CHECK(iget(ev_data(evs, i), "index") == 0 && !strcmp(sget(d, "type"), "text_delta"));
        srv_buf_adds(&text, sget(d, "text"));
    }
    CHECKF(i > 3, "no content_block_delta");
    CHECKF(i + 3 == n, "after the deltas: %zu events left, want 3", n - i);
    CHECK(!strcmp(ev_name(evs, i), "content_block_stop") && iget(ev_data(evs, i), "index") == 0);
    CHECK(!strcmp(ev_name(evs, i + 1), "message_delta"));
    json_t *md = ev_data(evs, i + 1);
    CHECKF(!strcmp(sget(json_object_get(md, "delta"), "stop_reason"), want_stop),
           "streamed stop_reason %s", sget(json_object_get(md, "delta"), "stop_reason"));
    CHECK(iget(json_object_get(md, "usage"), "output_tokens") == ref.completion);
    CHECK(iget(json_object_get(md, "usage"), "input_tokens") +
              iget(json_object_get(md, "usage"), "cache_read_input_tokens") ==
          ref.prompt);
    CHECK(!strcmp(ev_name(evs, n - 1), "message_stop"));
    CHECKF(!strcmp(text.p, ref.text), "streamed text '%s', whole '%s'", text.p, ref.text);
    srv_buf_free(&text);
    json_decref(evs);

    /* stop_sequences: a piece of the greedy reply stops it where that piece first begins. */
    size_t L = strlen(ref.text);
    char stop[8] = {0};
    memcpy(stop, ref.text + L / 2, L / 2 + 3 <= L ? 3 : 1);
    const char *at = strstr(ref.text, stop);
    REQUIRE(at);
    char *want = strndup(ref.text, (size_t)(at - ref.text));
    char *stop_lit = json_str(stop);
    for (int streamed = 0; streamed < 2; streamed++) {
        snprintf(sbody, sizeof sbody, "%.*s,\"stop_sequences\":[\"zzzq\",%s]%s}",
                 (int)strlen(body) - 1, body, stop_lit, streamed ? ",\"stream\":true" : "");
        const char *reason = NULL, *seq = NULL;
        srv_buf got = {0};
        srv_buf_add(&got, "", 0);
        json_t *keep = NULL;
        if (!streamed) {
            keep = post_json(t, "/v1/messages", AUTH_ANTH, sbody, &st);
            CHECKF(st == 200, "stop_sequences: %d", st);
            srv_buf_adds(&got, sget(json_array_get(json_object_get(keep, "content"), 0), "text"));
            reason = sget(keep, "stop_reason");
            seq = json_string_value(json_object_get(keep, "stop_sequence"));
        } else {
            keep = stream_events(t, "/v1/messages", AUTH_ANTH, sbody);
            for (size_t k = 0; k < json_array_size(keep); k++) {
                json_t *d = ev_data(keep, k);
                if (!strcmp(ev_name(keep, k), "content_block_delta"))
                    srv_buf_adds(&got, sget(json_object_get(d, "delta"), "text"));
                if (!strcmp(ev_name(keep, k), "message_delta")) {
                    reason = sget(json_object_get(d, "delta"), "stop_reason");
                    seq = json_string_value(json_object_get(json_object_get(d, "delta"),
                                                            "stop_sequence"));
                }
            }
        }
        CHECKF(reason && !strcmp(reason, "stop_sequence"), "%s: stop_reason %s for stop '%s'",
               streamed ? "streamed" : "whole", reason ?: "(none)", stop);
        CHECKF(seq && !strcmp(seq, stop), "%s: stop_sequence %s, want '%s'",
               streamed ? "streamed" : "whole", seq ?: "null", stop);
        CHECKF(!strcmp(got.p, want), "%s: text '%s', want '%s'", streamed ? "streamed" : "whole",
               got.p, want);
        srv_buf_free(&got);
        json_decref(keep);
    }
    free(want);
    free(stop_lit);
    free(ref.text);
    json_decref(j);
}

/* A final assistant message is continued (the chat route's prefill, asserted), tool_use and
 * tool_result blocks become the chat route's tool_calls and tool messages. */
static void test_anthropic_prefill_tools(tsrv *t) {
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":16,\"temperature\":0,\"messages\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Tell me\"},{\"type\":"
        "\"text\",\"text\":\"a story.\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\","
        "\"text\":\"Once upon a time\"}]}]}";
    const char *ref_body = "{\"max_tokens\":16,\"temperature\":0,\"messages\":[{\"role\":\"user\","
                           "\"content\":\"Tell me\\na story.\"},{\"role\":\"assistant\","
                           "\"content\":\"Once upon a time\"}]}";
    chat_ref ref = chat_reference(t, ref_body);
    int st = 0;
    json_t *j = post_json(t, "/v1/messages", AUTH_ANTH, body, &st);
    CHECKF(st == 200, "prefill: %d", st);
    const char *got = sget(json_array_get(json_object_get(j, "content"), 0), "text");
    CHECKF(ref.text[0] && !strcmp(got, ref.text), "prefill: '%s', chat route's '%s'", got, ref.text);
    CHECKF(strncmp(got, "Once upon a time", 16) != 0, "the reply repeats the prefill: '%s'", got);
    json_t *u = json_object_get(j, "usage");
    CHECK(iget(u, "input_tokens") + iget(u, "cache_read_input_tokens") == ref.prompt);
    free(ref.text);
    json_decref(j);

    /* tools: a tool_use turn and its tool_result */
    body = "{\"model\":\"m\",\"max_tokens\":12,\"temperature\":0,\"tools\":[{\"name\":\"get_weather\","
           "\"description\":\"Weather of a city\",\"input_schema\":{\"type\":\"object\","
           "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}],"
           "\"tool_choice\":{\"type\":\"auto\"},\"messages\":[{\"role\":\"user\",\"content\":"
           "\"Weather in Paris?\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":"
           "\"Let me look.\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
           "\"input\":{\"city\":\"Paris\"}}]},{\"role\":\"user\",\"content\":[{\"type\":"
           "\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"sunny\"},{\"type\":\"text\","
           "\"text\":\"Thanks\"}]}]}";
    ref_body = "{\"max_tokens\":12,\"temperature\":0,\"tools\":[{\"type\":\"function\",\"function\":"
               "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
               "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]},\"description\":"
               "\"Weather of a city\"}}],\"tool_choice\":\"auto\",\"messages\":[{\"role\":\"user\","
               "\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\",\"content\":\"Let me "
               "look.\",\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":"
               "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"sunny\"},{\"role\":"
               "\"user\",\"content\":\"Thanks\"}]}";
    ref = chat_reference(t, ref_body);
    j = post_json(t, "/v1/messages", AUTH_ANTH, body, &st);
    CHECKF(st == 200, "tools: %d", st);
    got = sget(json_array_get(json_object_get(j, "content"), 0), "text");
    CHECKF(!strcmp(got, ref.text), "tools: '%s', chat route's '%s'", got, ref.text);
    u = json_object_get(j, "usage");
    CHECKF(iget(u, "input_tokens") + iget(u, "cache_read_input_tokens") == ref.prompt,
           "tools: prompt %lld + %lld, chat route's %lld", iget(u, "input_tokens"),
           iget(u, "cache_read_input_tokens"), ref.prompt);
    free(ref.text);
    json_decref(j);
}

/* The second sight of a long prompt reads whole KV blocks from the prefix cache. */
static void test_anthropic_cache(tsrv *t) {
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":4,\"temperature\":0,\"system\":\"Quokkas and wombats "
        "live in a big green forest with tall trees, a river, and many friendly birds who sing "
        "every morning.\",\"messages\":[{\"role\":\"user\",\"content\":\"A story, please.\"}]%s}";
    char b[600];
    long long in[3], cr[3];
    char *text[2];
    for (int k = 0; k < 3; k++) {
        snprintf(b, sizeof b, body, k == 2 ? ",\"stream\":true" : "");
        if (k < 2) {
            int st = 0;
            json_t *j = post_json(t, "/v1/messages", AUTH_ANTH, b, &st);
            CHECK(st == 200);
            json_t *u = json_object_get(j, "usage");
            in[k] = iget(u, "input_tokens");
            cr[k] = iget(u, "cache_read_input_tokens");
            text[k] = strdup(sget(json_array_get(json_object_get(j, "content"), 0), "text"));
            json_decref(j);
        } else {
            json_t *evs = stream_events(t, "/v1/messages", AUTH_ANTH, b);
            json_t *u = json_object_get(ev_data(evs, json_array_size(evs) - 2), "usage");
            in[k] = iget(u, "input_tokens");
            cr[k] = iget(u, "cache_read_input_tokens");
            json_decref(evs);
        }
        CHECK(tu_wait_idle(t->e, 3000));
    }
    /* the first sight may share the template's first block with earlier requests */
    CHECKF(cr[0] >= 0 && cr[0] % 16 == 0 && cr[0] <= 16, "first sight cached %lld", cr[0]);
    for (int k = 1; k < 3; k++) {
        CHECKF(cr[k] > cr[0] && cr[k] % 16 == 0, "repeat %d: cache_read_input_tokens %lld", k,
               cr[k]);
        CHECKF(in[k] + cr[k] == in[0] + cr[0], "repeat %d: %lld + %lld != %lld + %lld", k, in[k],
               cr[k], in[0], cr[0]);
    }
    CHECKF(!strcmp(text[0], text[1]), "cached reply '%s' differs from '%s'", text[1], text[0]);
    free(text[0]);
    free(text[1]);
}

static void test_anthropic_errors(tsrv *t) {
    const char *P = "/v1/messages";
    const char *H = AUTH_ANTH;
    expect_anth_error(t, "POST", P, H, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      400, "invalid_request_error", "max_tokens");
    expect_anth_error(t, "POST", P, H, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      400, "invalid_request_error", "model");
    expect_anth_error(t, "POST", P, H, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[]}", 400,
                      "invalid_request_error", "messages");
    expect_anth_error(t, "POST", P, H, "{\"model\":\"m\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      400, "invalid_request_error", "max_tokens");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
                      "[{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":"
                      "\"image/png\",\"data\":\"AAAA\"}}]}]}",
                      400, "invalid_request_error", "image");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\","
                      "\"content\":\"x\"}]}",
                      400, "invalid_request_error", "messages[0].role");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":5,\"temperature\":1.5,\"messages\":[{\"role\":"
                      "\"user\",\"content\":\"x\"}]}",
                      400, "invalid_request_error", "temperature");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\","
                      "\"e\"],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      400, "invalid_request_error", "stop_sequences");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"type\":\"web_search_20250305\","
                      "\"name\":\"web_search\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      400, "invalid_request_error", "tools[0]");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\","
                      "\"budget_tokens\":1024},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      400, "invalid_request_error", "thinking");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
                      "[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
                      400, "invalid_request_error", "assistant");
    expect_anth_error(t, "POST", P, H, "{\"model\":", 400, "invalid_request_error", "JSON");
    expect_anth_error(t, "POST", P, H,
                      "{\"model\":\"m\",\"max_tokens\":100000,\"messages\":[{\"role\":\"user\","
                      "\"content\":\"x\"}]}",
                      400, "invalid_request_error", "context");
    expect_anth_error(t, "GET", P, H, NULL, 405, "invalid_request_error", NULL);
    expect_anth_error(t, "POST", P, "x-api-key: wrong\r\n",
                      "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
                      "\"x\"}]}",
                      401, "authentication_error", NULL);
    /* the OpenAI routes take the Anthropic header too */
    tu_resp r = tu_request(t->port, "GET", "/v1/models", "x-api-key: sk-msgapi\r\n", NULL);
    CHECKF(r.status == 200, "x-api-key on /v1/models: %d", r.status);
    tu_free(&r);
}

/* ------------------------------------------------------------------------------------ */
/* OpenAI Responses.                                                                     */

static char *resp_text(json_t *j) {
    json_t *it = json_array_get(json_object_get(j, "output"), 0);
    return strdup(sget(json_array_get(json_object_get(it, "content"), 0), "text"));
}

static void test_responses_basic(tsrv *t) {
    char body[1024], ref_body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"stories\",\"max_output_tokens\":20,\"temperature\":0,\"instructions\":"
             "\"%s\",\"input\":\"%s\"}",
             SYS, USER);
    snprintf(ref_body, sizeof ref_body,
             "{\"max_tokens\":20,\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":"
             "\"%s\"},{\"role\":\"user\",\"content\":\"%s\"}]}",
             SYS, USER);
    chat_ref ref = chat_reference(t, ref_body);
    int st = 0;
    tu_resp raw = tu_request(t->port, "POST", "/v1/responses", AUTH_OAI, body);
    CHECKF(raw.status == 200, "responses: %d %.300s", raw.status, raw.body.p);
    json_t *j = tu_json(&raw);
    CHECK(!strncmp(sget(j, "id"), "resp_", 5));
    CHECK(!strcmp(sget(j, "object"), "response"));
    CHECK(json_is_integer(json_object_get(j, "created_at")));
    CHECK(!strcmp(sget(j, "model"), "stories"));
    CHECK(!strcmp(sget(j, "instructions"), SYS));
    CHECK(iget(j, "max_output_tokens") == 20);
    bool length = !strcmp(ref.finish, "length");
    CHECKF(!strcmp(sget(j, "status"), length ? "incomplete" : "completed"), "status %s (finish %s)",
           sget(j, "status"), ref.finish);
    if (length)
        CHECK(!strcmp(sget(json_object_get(j, "incomplete_details"), "reason"),
                      "max_output_tokens"));
    else
        CHECK(json_is_null(json_object_get(j, "incomplete_details")));
    json_t *out = json_object_get(j, "output");
    CHECK(json_array_size(out) == 1);
    json_t *it = json_array_get(out, 0);
    CHECK(!strcmp(sget(it, "type"), "message") && !strcmp(sget(it, "role"), "assistant") &&
          !strncmp(sget(it, "id"), "msg_", 4));
    json_t *part = json_array_get(json_object_get(it, "content"), 0);
    CHECK(!strcmp(sget(part, "type"), "output_text"));
    CHECK(json_is_array(json_object_get(part, "annotations")));
    CHECKF(!strcmp(sget(part, "text"), ref.text), "responses text '%s', chat route's '%s'",
           sget(part, "text"), ref.text);
    CHECK(!strcmp(sget(j, "output_text"), ref.text));
    json_t *u = json_object_get(j, "usage");
    CHECK(iget(u, "input_tokens") == ref.prompt && iget(u, "output_tokens") == ref.completion);
    CHECK(iget(u, "total_tokens") == ref.prompt + ref.completion);
    CHECK(iget(json_object_get(u, "input_tokens_details"), "cached_tokens") >= 0);

    /* GET returns the same body; the stored conversation continues (instructions are not
     * carried over: OpenAI's rule). */
    char path[128];
    snprintf(path, sizeof path, "/v1/responses/%s", sget(j, "id"));
    tu_resp g = tu_request(t->port, "GET", path, AUTH_OAI, NULL);
    CHECKF(g.status == 200 && g.body.p && !strcmp(g.body.p, raw.body.p),
           "GET %s: %d, body differs: %.200s", path, g.status, g.body.p);
    tu_free(&g);

    char *text1_lit = json_str(ref.text);
    char b2[1400];
    snprintf(b2, sizeof b2,
             "{\"previous_response_id\":\"%s\",\"max_output_tokens\":12,\"temperature\":0,"
             "\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"And "
             "then?\"}]}]}",
             sget(j, "id"));
    snprintf(ref_body, sizeof ref_body,
             "{\"max_tokens\":12,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"%s\"},{\"role\":\"assistant\",\"content\":%s},{\"role\":\"user\",\"content\":\"And "
             "then?\"}]}",
             USER, text1_lit);
    chat_ref ref2 = chat_reference(t, ref_body);
    json_t *j2 = post_json(t, "/v1/responses", AUTH_OAI, b2, &st);
    CHECKF(st == 200, "previous_response_id: %d", st);
    char *t2 = resp_text(j2);
    CHECKF(!strcmp(t2, ref2.text), "continued: '%s', chat route's '%s'", t2, ref2.text);
    CHECK(!strcmp(sget(j2, "previous_response_id"), sget(j, "id")));
    CHECK(json_is_null(json_object_get(j2, "instructions")));
    CHECK(iget(json_object_get(j2, "usage"), "input_tokens") == ref2.prompt);
    free(t2);

    /* item_reference: the first response's message item, by id */
    snprintf(b2, sizeof b2,
             "{\"max_output_tokens\":12,\"temperature\":0,\"store\":false,\"input\":[{\"type\":"
             "\"message\",\"role\":\"user\",\"content\":\"%s\"},{\"type\":\"item_reference\","
             "\"id\":\"%s\"},{\"role\":\"user\",\"content\":\"And then?\"}]}",
             USER, sget(it, "id"));
    json_t *j3 = post_json(t, "/v1/responses", AUTH_OAI, b2, &st);
    CHECKF(st == 200, "item_reference: %d", st);
    char *t3 = resp_text(j3);
    CHECKF(!strcmp(t3, ref2.text), "item_reference: '%s', chat route's '%s'", t3, ref2.text);
    CHECK(json_is_false(json_object_get(j3, "store")));
    /* store false: not kept */
    snprintf(path, sizeof path, "/v1/responses/%s", sget(j3, "id"));
    expect_oai_error(t, "GET", path, NULL, 404, NULL, NULL, "not found");
    snprintf(b2, sizeof b2, "{\"previous_response_id\":\"%s\",\"input\":\"x\"}", sget(j3, "id"));
    expect_oai_error(t, "POST", "/v1/responses", b2, 404, "previous_response_not_found",
                     "previous_response_id", NULL);
    free(t3);
    json_decref(j3);

    /* Streamed: the event grammar, sequence numbers, the same text; then stored. */
    snprintf(b2, sizeof b2, "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    json_t *evs = stream_events(t, "/v1/responses", AUTH_OAI, b2);
    REQUIRE(evs);
    size_t n = json_array_size(evs);
    static const char *const head[] = {"response.created", "response.in_progress",
                                       "response.output_item.added", "response.content_part.added"};
    REQUIRE(n >= 9);
    for (size_t i = 0; i < n; i++) {
        CHECKF(!strcmp(ev_name(evs, i), sget(ev_data(evs, i), "type")), "event %zu: %s vs %s", i,
               ev_name(evs, i), sget(ev_data(evs, i), "type"));
        CHECKF(iget(ev_data(evs, i), "sequence_number") == (long long)i,
               "event %zu: sequence_number %lld", i, iget(ev_data(evs, i), "sequence_number"));
    }
    for (size_t i = 0; i < 4; i++)
        CHECKF(!strcmp(ev_name(evs, i), head[i]), "event %zu: %s, want %s", i, ev_name(evs, i),
               head[i]);
    json_t *r0 = json_object_get(ev_data(evs, 0), "response");
    CHECK(!strcmp(sget(r0, "status"), "in_progress") &&
          json_array_size(json_object_get(r0, "output")) == 0);
    const char *item_id = sget(json_object_get(ev_data(evs, 2), "item"), "id");
    srv_buf text = {0};
    srv_buf_add(&text, "", 0);
    size_t i = 4;
    for (; i < n && !strcmp(ev_name(evs, i), "response.output_text.delta"); i++) {
        CHECK(!strcmp(sget(ev_data(evs, i), "item_id"), item_id));
        CHECK(iget(ev_data(evs, i), "output_index") == 0 &&
              iget(ev_data(evs, i), "content_index") == 0);
        srv_buf_adds(&text, sget(ev_data(evs, i), "delta"));
    }
    CHECKF(i + 4 == n, "after the deltas: %zu events, want 4", n - i);
    static const char *const tail[] = {"response.output_text.done", "response.content_part.done",
                                       "response.output_item.done"};
    for (size_t k = 0; k < 3; k++)
        CHECKF(!strcmp(ev_name(evs, i + k), tail[k]), "event %zu: %s, want %s", i + k,
               ev_name(evs, i + k), tail[k]);
    CHECKF(!strcmp(text.p, ref.text), "streamed '%s', whole '%s'", text.p, ref.text);
    CHECK(!strcmp(sget(ev_data(evs, i), "text"), ref.text));
    CHECK(!strcmp(sget(json_object_get(ev_data(evs, i + 1), "part"), "text"), ref.text));
    const char *last = ev_name(evs, n - 1);
    CHECKF(!strcmp(last, length ? "response.incomplete" : "response.completed"), "last event %s",
           last);
    json_t *fin = json_object_get(ev_data(evs, n - 1), "response");
    CHECK(!strcmp(sget(fin, "status"), sget(j, "status")));
    char *ft = resp_text(fin);
    CHECK(!strcmp(ft, ref.text));
    free(ft);
    CHECK(iget(json_object_get(fin, "usage"), "output_tokens") == ref.completion);
    snprintf(path, sizeof path, "/v1/responses/%s", sget(fin, "id"));
    g = tu_request(t->port, "GET", path, AUTH_OAI, NULL);
    CHECKF(g.status == 200, "GET of a streamed response: %d", g.status);
    tu_free(&g);
    srv_buf_free(&text);
    json_decref(evs);

    /* DELETE, then it is gone */
    snprintf(path, sizeof path, "/v1/responses/%s", sget(j, "id"));
    g = tu_request(t->port, "DELETE", path, AUTH_OAI, NULL);
    json_t *del = tu_json(&g);
    CHECKF(g.status == 200 && json_is_true(json_object_get(del, "deleted")) &&
               !strcmp(sget(del, "object"), "response.deleted"),
           "DELETE: %d %s", g.status, g.body.p);
    json_decref(del);
    tu_free(&g);
    expect_oai_error(t, "GET", path, NULL, 404, NULL, NULL, "not found");
    expect_oai_error(t, "DELETE", path, NULL, 404, NULL, NULL, "not found");
    snprintf(b2, sizeof b2, "{\"previous_response_id\":\"%s\",\"input\":\"x\"}", sget(j, "id"));
    expect_oai_error(t, "POST", "/v1/responses", b2, 404, "previous_response_not_found",
                     "previous_response_id", NULL);

    free(text1_lit);
    free(ref.text);
    free(ref2.text);
    json_decref(j);
    json_decref(j2);
    tu_free(&raw);
}

static void test_responses_items(tsrv *t) {
    /* function_call / function_call_output items, tools, parts joined, a prefill */
    const char *body =
        "{\"max_output_tokens\":10,\"temperature\":0,\"tools\":[{\"type\":\"function\",\"name\":"
        "\"get_weather\",\"description\":\"Weather of a city\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"}}}}],\"tool_choice\":\"auto\",\"input\":["
        "{\"role\":\"developer\",\"content\":\"Answer briefly.\"},{\"role\":\"user\",\"content\":"
        "[{\"type\":\"input_text\",\"text\":\"Weather\"},{\"type\":\"input_text\",\"text\":\"in "
        "Paris?\"}]},{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},{\"type\":\"function_call_output\","
        "\"call_id\":\"call_1\",\"output\":\"sunny\"},{\"type\":\"reasoning\",\"id\":\"rs_1\","
        "\"summary\":[]},{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":"
        "\"It is\"}]}]}";
    const char *ref_body =
        "{\"max_tokens\":10,\"temperature\":0,\"tools\":[{\"type\":\"function\",\"function\":{"
        "\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],\"tool_choice\":\"auto\","
        "\"messages\":[{\"role\":\"developer\",\"content\":\"Answer briefly.\"},{\"role\":\"user\","
        "\"content\":\"Weather\\nin Paris?\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\","
        "\"tool_call_id\":\"call_1\",\"content\":\"sunny\"},{\"role\":\"assistant\",\"content\":"
        "\"It is\"}]}";
    chat_ref ref = chat_reference(t, ref_body);
    int st = 0;
    json_t *j = post_json(t, "/v1/responses", AUTH_OAI, body, &st);
    CHECKF(st == 200, "items: %d", st);
    char *got = resp_text(j);
    CHECKF(ref.text[0] && !strcmp(got, ref.text), "items: '%s', chat route's '%s'", got, ref.text);
    CHECK(iget(json_object_get(j, "usage"), "input_tokens") == ref.prompt);
    CHECK(json_array_size(json_object_get(j, "tools")) == 1);
    free(got);
    free(ref.text);
    json_decref(j);

    /* cached_tokens on a repeated prompt */
    body = "{\"max_output_tokens\":4,\"temperature\":0,\"input\":\"Numbats and bilbies dig long "
           "tunnels under the red sand, and at night they come out to look at the stars.\"}";
    long long cached[2];
    for (int k = 0; k < 2; k++) {
        j = post_json(t, "/v1/responses", AUTH_OAI, body, &st);
        CHECK(st == 200);
        cached[k] = iget(json_object_get(json_object_get(j, "usage"), "input_tokens_details"),
                         "cached_tokens");
        json_decref(j);
        CHECK(tu_wait_idle(t->e, 3000));
    }
    CHECKF(cached[0] >= 0 && cached[1] > cached[0] && cached[1] % 16 == 0,
           "cached_tokens %lld then %lld", cached[0], cached[1]);
}

static void test_responses_errors(tsrv *t) {
    const char *P = "/v1/responses";
    expect_oai_error(t, "POST", P, "{\"model\":\"m\"}", 400, NULL, "input", "input");
    expect_oai_error(t, "POST", P, "{\"input\":5}", 400, NULL, "input", NULL);
    expect_oai_error(t, "POST", P,
                     "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
                     "\"image_url\":\"http://x/y.png\"}]}]}",
                     400, NULL, "input[0].content", "input_image");
    expect_oai_error(t, "POST", P, "{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400, NULL,
                     "input[0].role", NULL);
    expect_oai_error(t, "POST", P, "{\"input\":[{\"type\":\"computer_call\"}]}", 400, NULL,
                     "input[0]", "computer_call");
    expect_oai_error(t, "POST", P,
                     "{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", 400, NULL,
                     "tools[0]", "web_search");
    expect_oai_error(t, "POST", P, "{\"input\":\"x\",\"max_output_tokens\":0}", 400, NULL,
                     "max_output_tokens", NULL);
    expect_oai_error(t, "POST", P, "{\"input\":\"x\",\"temperature\":3}", 400, NULL, "temperature",
                     NULL);
    expect_oai_error(t, "POST", P, "{\"input\":\"x\",\"background\":true}", 400, NULL, "background",
                     NULL);
    expect_oai_error(t, "POST", P, "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", 400,
                     NULL, "text.format.type", NULL);
    expect_oai_error(t, "POST", P, "{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_nope\"}]}",
                     404, NULL, "input[0]", "msg_nope");
    expect_oai_error(t, "POST", P, "{\"previous_response_id\":\"resp_nope\",\"input\":\"x\"}", 404,
                     "previous_response_not_found", "previous_response_id", "resp_nope");
    expect_oai_error(t, "POST", P, "{\"input\":\"x\",\"max_output_tokens\":100000}", 400,
                     "context_over_budget", NULL, NULL);
    expect_oai_error(t, "GET", "/v1/responses/resp_nope", NULL, 404, NULL, NULL, "resp_nope");
    expect_oai_error(t, "PUT", "/v1/responses/resp_nope", NULL, 405, NULL, NULL, NULL);
    expect_oai_error(t, "GET", P, NULL, 405, NULL, NULL, NULL);
    tu_resp r = tu_request(t->port, "POST", P, NULL, "{\"input\":\"x\"}");
    CHECKF(r.status == 401, "no key: %d", r.status);
    tu_free(&r);
}

/* ------------------------------------------------------------------------------------ */
/* Tool calls in the reply (the chat route's parser): forced with kiln's "fill" (asserted
 * Hermes markup, the ChatML fallback's format) and cut at "</tool_call>" by a stop string. */

static const char *FILL_CALL =
    "\"fill\":{\"content\":\"Sure.<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", "
    "\\\"arguments\\\": {\\\"city\\\": \\\"Paris\\\"}}\\n</tool_call>\"}";

static void test_tool_output(tsrv *t) {
    char body[1400];
    int st = 0;
    /* Anthropic, whole: a text block, then the tool_use block; stop_reason tool_use */
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"max_tokens\":90,\"temperature\":0,\"tools\":[{\"name\":"
             "\"get_weather\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":"
             "{\"type\":\"string\"}}}}],\"stop_sequences\":[\"</tool_call>\"],%s,\"messages\":"
             "[{\"role\":\"user\",\"content\":\"Weather?\"}]%s}",
             FILL_CALL, "");
    json_t *j = post_json(t, "/v1/messages", AUTH_ANTH, body, &st);
    CHECKF(st == 200, "anthropic tool output: %d", st);
    json_t *c = json_object_get(j, "content");
    CHECKF(json_array_size(c) == 2, "content blocks %zu", json_array_size(c));
    CHECK(!strcmp(sget(json_array_get(c, 0), "text"), "Sure."));
    json_t *tu = json_array_get(c, 1);
    CHECK(!strcmp(sget(tu, "type"), "tool_use") && !strcmp(sget(tu, "name"), "get_weather") &&
          sget(tu, "id")[0]);
    CHECK(!strcmp(sget(json_object_get(tu, "input"), "city"), "Paris"));
    CHECKF(!strcmp(sget(j, "stop_reason"), "tool_use"), "stop_reason %s", sget(j, "stop_reason"));
    json_decref(j);
    /* streamed: block 0 text, block 1 tool_use with input_json_delta pieces */
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"max_tokens\":90,\"temperature\":0,\"stream\":true,\"tools\":[{"
             "\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\"}}],"
             "\"stop_sequences\":[\"</tool_call>\"],%s,\"messages\":[{\"role\":\"user\","
             "\"content\":\"Weather?\"}]}",
             FILL_CALL);
    json_t *evs = stream_events(t, "/v1/messages", AUTH_ANTH, body);
    srv_buf args = {0}, text = {0};
    srv_buf_add(&args, "", 0);
    srv_buf_add(&text, "", 0);
    int starts = 0, stops = 0;
    const char *reason = "";
    for (size_t i = 0; i < json_array_size(evs); i++) {
        json_t *d = ev_data(evs, i);
        const char *nm = ev_name(evs, i);
        if (!strcmp(nm, "content_block_start")) {
            json_t *cb = json_object_get(d, "content_block");
            CHECK(iget(d, "index") == starts);
            CHECK(!strcmp(sget(cb, "type"), starts == 0 ? "text" : "tool_use"));
            if (starts == 1) CHECK(!strcmp(sget(cb, "name"), "get_weather"));
            starts++;
        } else if (!strcmp(nm, "content_block_delta")) {
            json_t *dd = json_object_get(d, "delta");
            if (iget(d, "index") == 0)
                srv_buf_adds(&text, sget(dd, "text"));
            else {
                CHECK(!strcmp(sget(dd, "type"), "input_json_delta"));
                srv_buf_adds(&args, sget(dd, "partial_json"));
            }
        } else if (!strcmp(nm, "content_block_stop")) {
            CHECK(iget(d, "index") == stops);
            stops++;
        } else if (!strcmp(nm, "message_delta")) {
            reason = sget(json_object_get(d, "delta"), "stop_reason");
        }
    }
    CHECKF(starts == 2 && stops == 2, "blocks: %d started, %d stopped", starts, stops);
    CHECKF(!strcmp(text.p, "Sure."), "streamed text '%s'", text.p);
    json_t *in = json_loads(args.p, 0, NULL);
    CHECKF(!strcmp(sget(in, "city"), "Paris"), "streamed input '%s'", args.p);
    json_decref(in);
    CHECKF(!strcmp(reason, "tool_use"), "streamed stop_reason %s", reason);
    json_decref(evs);
    srv_buf_free(&args);
    srv_buf_free(&text);

    /* Responses, whole: a message item, then a function_call item */
    snprintf(body, sizeof body,
             "{\"max_output_tokens\":90,\"temperature\":0,\"tools\":[{\"type\":\"function\","
             "\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}],\"stop\":"
             "[\"</tool_call>\"],%s,\"input\":\"Weather?\"}",
             FILL_CALL);
    j = post_json(t, "/v1/responses", AUTH_OAI, body, &st);
    CHECKF(st == 200, "responses tool output: %d", st);
    json_t *out = json_object_get(j, "output");
    CHECKF(json_array_size(out) == 2, "output items %zu", json_array_size(out));
    CHECK(!strcmp(sget(json_array_get(out, 0), "type"), "message"));
    json_t *fc = json_array_get(out, 1);
    CHECK(!strcmp(sget(fc, "type"), "function_call") && !strcmp(sget(fc, "name"), "get_weather"));
    CHECK(!strncmp(sget(fc, "id"), "fc_", 3) && sget(fc, "call_id")[0]);
    in = json_loads(sget(fc, "arguments"), 0, NULL);
    CHECKF(!strcmp(sget(in, "city"), "Paris"), "arguments '%s'", sget(fc, "arguments"));
    json_decref(in);
    CHECK(!strcmp(sget(j, "status"), "completed") && !strcmp(sget(j, "output_text"), "Sure."));
    /* its function_call_output, through previous_response_id: the conversation as the chat
     * route would be given it */
    char *call_id = strdup(sget(fc, "call_id"));
    char b2[1400], ref_body[1400];
    snprintf(b2, sizeof b2,
             "{\"previous_response_id\":\"%s\",\"max_output_tokens\":8,\"temperature\":0,"
             "\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":"
             "\"sunny\"}]}",
             sget(j, "id"), call_id);
    snprintf(ref_body, sizeof ref_body,
             "{\"max_tokens\":8,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"Weather?\"},{\"role\":\"assistant\",\"content\":\"Sure.\",\"tool_calls\":[{\"id\":"
             "\"%s\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
             "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"%s\","
             "\"content\":\"sunny\"}]}",
             call_id, call_id);
    chat_ref ref = chat_reference(t, ref_body);
    json_t *j2 = post_json(t, "/v1/responses", AUTH_OAI, b2, &st);
    CHECKF(st == 200, "function_call_output: %d", st);
    char *t2 = resp_text(j2);
    CHECKF(!strcmp(t2, ref.text), "after the call: '%s', chat route's '%s'", t2, ref.text);
    CHECK(iget(json_object_get(j2, "usage"), "input_tokens") == ref.prompt);
    free(t2);
    free(ref.text);
    free(call_id);
    json_decref(j2);
    json_decref(j);

    /* Responses, streamed: message item 0, function_call item 1 with its argument events */
    snprintf(b2, sizeof b2, "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    evs = stream_events(t, "/v1/responses", AUTH_OAI, b2);
    static const char *const want[] = {
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"};
    size_t k = 0;
    srv_buf_add(&args, "", 0);
    for (size_t i = 0; i < json_array_size(evs); i++) {
        const char *nm = ev_name(evs, i);
        CHECK(iget(ev_data(evs, i), "sequence_number") == (long long)i);
        /* repeated deltas collapse onto one expected entry */
        if (k > 0 && !strcmp(nm, want[k - 1]) && strstr(nm, ".delta")) {
        } else {
            CHECKF(k < 13 && !strcmp(nm, want[k]), "event %zu: %s, want %s", i, nm,
                   k < 13 ? want[k] : "(end)");
            k++;
        }
        if (!strcmp(nm, "response.function_call_arguments.delta")) {
            CHECK(iget(ev_data(evs, i), "output_index") == 1);
            srv_buf_adds(&args, sget(ev_data(evs, i), "delta"));
        }
        if (!strcmp(nm, "response.function_call_arguments.done"))
            CHECKF(!strcmp(sget(ev_data(evs, i), "arguments"), args.p), "arguments.done '%s' vs '%s'",
                   sget(ev_data(evs, i), "arguments"), args.p);
    }
    CHECK(k == 13);
    json_t *fin = json_object_get(ev_data(evs, json_array_size(evs) - 1), "response");
    json_t *fo = json_object_get(fin, "output");
    CHECK(json_array_size(fo) == 2 &&
          !strcmp(sget(json_array_get(fo, 1), "type"), "function_call") &&
          !strcmp(sget(json_array_get(fo, 1), "status"), "completed") &&
          !strcmp(sget(json_array_get(fo, 1), "arguments"), args.p));
    json_decref(evs);
    srv_buf_free(&args);
}

/* ------------------------------------------------------------------------------------ */
/* The store through HTTP: TTL and byte cap.                                             */

static long long metric(tsrv *t, const char *name) {
    tu_resp r = tu_request(t->port, "GET", "/metrics", NULL, NULL);
    long long v = -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = r.body.p ? strstr(r.body.p, pat) : NULL;
    if (p) v = strtoll(p + strlen(pat), NULL, 10);
    tu_free(&r);
    return v;
}

static char *create_stored(tsrv *t) {
    int st = 0;
    json_t *j = post_json(t, "/v1/responses", AUTH_OAI,
                          "{\"max_output_tokens\":6,\"temperature\":0,\"input\":\"A fox.\"}", &st);
    CHECKF(st == 200, "create: %d", st);
    char *id = strdup(sget(j, "id"));
    json_decref(j);
    return id;
}

static int get_status(tsrv *t, const char *id) {
    char path[128];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    tu_resp r = tu_request(t->port, "GET", path, AUTH_OAI, NULL);
    int st = r.status;
    tu_free(&r);
    return st;
}

static void test_store_http(void) {
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    /* TTL */
    kiln_server_params sp = {.api_key = KEY, .model_name = "stories", .response_store_ttl_s = 0.6};
    tsrv t;
    tsrv_start(&t, g_model, &sp, &ep);
    char *a = create_stored(&t);
    CHECK(get_status(&t, a) == 200);
    CHECK(metric(&t, "kiln_response_store_entries") == 1);
    long long one = metric(&t, "kiln_response_store_bytes");
    CHECK(one > 0);
    tu_sleep_ms(800);
    CHECKF(get_status(&t, a) == 404, "a response outlived its TTL");
    char body[160];
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"x\"}", a);
    expect_oai_error(&t, "POST", "/v1/responses", body, 404, "previous_response_not_found",
                     "previous_response_id", NULL);
    free(a);
    tsrv_stop(&t);

    /* Byte cap: room for two and a half of these responses; the least recently used goes. */
    sp.response_store_ttl_s = 0;
    sp.response_store_max = one * 5 / 2;
    tsrv_start(&t, g_model, &sp, &ep);
    a = create_stored(&t);
    char *b = create_stored(&t);
    CHECK(get_status(&t, a) == 200); /* a is now more recent than b */
    char *c = create_stored(&t);
    CHECKF(get_status(&t, b) == 404, "the least recently used response survived the cap");
    CHECK(get_status(&t, a) == 200 && get_status(&t, c) == 200);
    CHECK(metric(&t, "kiln_response_store_entries") == 2);
    CHECK(metric(&t, "kiln_response_store_bytes") <= sp.response_store_max);
    free(a);
    free(b);
    free(c);
    tsrv_stop(&t);

    /* Store off */
    sp.response_store_max = -1;
    tsrv_start(&t, g_model, &sp, &ep);
    a = create_stored(&t);
    CHECK(get_status(&t, a) == 404);
    CHECK(metric(&t, "kiln_response_store_entries") == 0);
    free(a);
    tsrv_stop(&t);
}

int main(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(path);
    kiln_error err = {0};
    REQUIRE(kiln_model_load(path, NULL, &g_model, &err) == KILN_OK);

    test_store_unit();

    kiln_server_params sp = {.api_key = KEY, .model_name = "stories"};
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    ep.n_ctx = 2048; /* past the model's 512: room for the tools' system text */
    tsrv t;
    tsrv_start(&t, g_model, &sp, &ep);
    test_anthropic_basic(&t);
    test_anthropic_prefill_tools(&t);
    test_anthropic_cache(&t);
    test_anthropic_errors(&t);
    test_responses_basic(&t);
    test_responses_items(&t);
    test_responses_errors(&t);
    test_tool_output(&t);
    CHECK(tu_wait_idle(t.e, 3000));
    CHECK(kiln_server_in_flight(t.srv) == 0);
    tsrv_stop(&t);

    test_store_http();
    kiln_model_free(g_model);
    return kiln_test_finish("test_server_msgapi");
}
