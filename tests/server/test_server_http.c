/*
 * test_server_http.c - the HTTP server in process on a loopback port, driven over raw
 * sockets: loading state, routes, response shapes, errors and their status codes, body
 * limits, client disconnects (the sequence is cancelled and its KV blocks return), silent
 * half requests (timed out), queue full, and the graceful shutdown.
 *
 * Expected generations come from ../shared/golden/llama2c-greedy.json (llama2.c run.c,
 * greedy) and from the engine's own API for the same request (the server must not change
 * what the engine produces).
 */
#include <math.h>
#include <pthread.h>

#include "model/model.h"
#include "server/chat_page.h"
#include "server_test_util.h"

/* The prefix cache (issue 13): the second of two identical long prompts must report
 * usage.prompt_tokens_details.cached_tokens > 0. */

static kiln_model *g_model;
static const char *KEY_HDR = "Authorization: Bearer sk-test\r\n";

/* The engine's text for a request, straight through the C API. */
static char *engine_text(kiln_engine *e, const kiln_request *rq) {
    kiln_stream *s = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_submit(e, rq, &s, &err) == KILN_OK);
    srv_buf b = {0};
    srv_buf_add(&b, "", 0);
    for (;;) {
        kiln_event ev;
        REQUIRE(kiln_stream_next(s, 10000, &ev, &err) == KILN_OK && ev.type != KILN_EVENT_NONE);
        if (ev.type == KILN_EVENT_TEXT) srv_buf_add(&b, ev.text, ev.text_len);
        if (ev.type == KILN_EVENT_FINISH) break;
    }
    kiln_stream_destroy(s);
    return b.p;
}

/* The engine's text, finish and usage for a request, straight through the C API. */
static char *engine_run(kiln_engine *e, const kiln_request *rq, kiln_finish_reason *fin,
                        kiln_usage *usage) {
    kiln_stream *s = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_submit(e, rq, &s, &err) == KILN_OK);
    srv_buf b = {0};
    srv_buf_add(&b, "", 0);
    for (;;) {
        kiln_event ev;
        REQUIRE(kiln_stream_next(s, 10000, &ev, &err) == KILN_OK && ev.type != KILN_EVENT_NONE);
        if (ev.type == KILN_EVENT_TEXT) srv_buf_add(&b, ev.text, ev.text_len);
        if (ev.type == KILN_EVENT_FINISH) {
            *fin = ev.finish_reason;
            *usage = ev.usage;
            break;
        }
    }
    kiln_stream_destroy(s);
    return b.p;
}

static void expect_error(tsrv *t, const char *method, const char *path, const char *headers,
                         const char *body, int status, const char *code, const char *param);

/* The engine's text for the prompt "Once upon a time" (BOS added) sampled at temperature 0.9
 * with this seed, max_tokens 8, through the C API. */
static char *seeded_text(kiln_engine *e, uint64_t seed, kiln_usage *u) {
    kiln_request rq = kiln_request_defaults();
    rq.prompt = "Once upon a time";
    rq.max_tokens = 8;
    rq.temperature = 0.9f;
    rq.seed = seed;
    kiln_finish_reason fin;
    return engine_run(e, &rq, &fin, u);
}

/* Several choices (n), several prompts, echo, logprobs 0, the request's model (issue 20). */
static void test_choices(tsrv *t) {
    /* n = 3 through an alias of the served id: choice i is the single request with seed 42+i */
    tu_resp r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR,
                           "{\"model\":\"tiny-alias\",\"prompt\":\"Once upon a time\",\"n\":3,"
                           "\"max_tokens\":8,\"temperature\":0.9,\"seed\":42,\"logprobs\":0}");
    CHECKF(r.status == 200, "n=3: %d %s", r.status, r.body.p);
    json_t *j = tu_json(&r);
    json_t *chs = json_object_get(j, "choices");
    CHECK(json_array_size(chs) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(j, "model")) ?: "", "stories"));
    long long completion = 0;
    kiln_usage u1 = {0};
    for (size_t i = 0; i < json_array_size(chs); i++) {
        json_t *c = json_array_get(chs, i);
        CHECK(json_integer_value(json_object_get(c, "index")) == (json_int_t)i);
        char *want = seeded_text(t->e, 42 + i, &u1);
        const char *got = json_string_value(json_object_get(c, "text")) ?: "";
        CHECKF(!strcmp(got, want), "choice %zu: '%s', single request with seed %zu: '%s'", i,
               got, 42 + i, want);
        free(want);
        completion += u1.completion_tokens;
        /* logprobs 0: no alternatives (null, as OpenAI), text_offset from the prompt's end */
        json_t *lp = json_object_get(c, "logprobs");
        CHECK(json_is_null(json_object_get(lp, "top_logprobs")));
        CHECKF(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 0)) == 16,
               "text_offset starts at %lld, want 16 (the prompt's length)",
               (long long)json_integer_value(
                   json_array_get(json_object_get(lp, "text_offset"), 0)));
    }
    json_t *u = json_object_get(j, "usage");
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == u1.prompt_tokens);
    CHECKF(json_integer_value(json_object_get(u, "completion_tokens")) == completion,
           "usage.completion_tokens %lld, the choices' sum %lld",
           (long long)json_integer_value(json_object_get(u, "completion_tokens")), completion);
    json_decref(j);
    tu_free(&r);

    /* the model field: unknown -> 404 model_not_found; a wrong type -> 400 */
    expect_error(t, "POST", "/v1/completions", KEY_HDR, "{\"model\":\"gpt-4\",\"prompt\":\"a\"}",
                 404, "model_not_found", "model");
    expect_error(t, "POST", "/v1/chat/completions", KEY_HDR,
                 "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", 404,
                 "model_not_found", "model");
    expect_error(t, "POST", "/v1/completions", KEY_HDR, "{\"model\":7,\"prompt\":\"a\"}", 400,
                 NULL, "model");

    /* a streamed chat with n = 2, greedy: every chunk names its choice, both texts equal */
    r = tu_request(t->port, "POST", "/v1/chat/completions", KEY_HDR,
                   "{\"model\":\"stories\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                   "\"n\":2,\"max_tokens\":12,\"temperature\":0,\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true}}");
    CHECKF(r.status == 200, "chat stream n=2: %d", r.status);
    srv_buf txt[2] = {{0}, {0}};
    int finishes[2] = {0, 0}, roles[2] = {0, 0};
    long long usage_completion = -1;
    for (char *p = r.body.p; p && *p;) {
        REQUIRE(!strncmp(p, "data: ", 6));
        char *end = strstr(p, "\n\n");
        REQUIRE(end);
        *end = '\0';
        if (strcmp(p + 6, "[DONE]")) {
            json_t *ev = json_loads(p + 6, 0, NULL);
            REQUIRE(ev);
            json_t *c = json_array_get(json_object_get(ev, "choices"), 0);
            if (c) {
                json_int_t ix = json_integer_value(json_object_get(c, "index"));
                REQUIRE(ix == 0 || ix == 1);
                json_t *d = json_object_get(c, "delta");
                if (json_object_get(d, "role")) roles[ix]++;
                srv_buf_adds(&txt[ix], json_string_value(json_object_get(d, "content")) ?: "");
                if (json_is_string(json_object_get(c, "finish_reason"))) finishes[ix]++;
            } else {
                usage_completion = json_integer_value(
                    json_object_get(json_object_get(ev, "usage"), "completion_tokens"));
            }
            json_decref(ev);
        }
        p = end + 2;
    }
    CHECK(roles[0] == 1 && roles[1] == 1 && finishes[0] == 1 && finishes[1] == 1);
    CHECKF(txt[0].len > 0 && txt[0].len == txt[1].len && !memcmp(txt[0].p, txt[1].p, txt[0].len),
           "greedy choices differ: '%s' / '%s'", txt[0].p ? txt[0].p : "",
           txt[1].p ? txt[1].p : "");
    CHECK(usage_completion == 24);
    for (int k = 0; k < 2; k++) srv_buf_free(&txt[k]);
    tu_free(&r);

    /* a batch of two prompts (a string, token ids) with n = 2: four choices, prompt-major */
    r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR,
                   "{\"prompt\":[\"Once upon a time\",[1,403,407]],\"n\":2,\"max_tokens\":4,"
                   "\"temperature\":0}");
    CHECKF(r.status == 200, "batch: %d %s", r.status, r.body.p);
    j = tu_json(&r);
    chs = json_object_get(j, "choices");
    CHECK(json_array_size(chs) == 4);
    for (size_t i = 0; i < json_array_size(chs); i++)
        CHECK(json_integer_value(json_object_get(json_array_get(chs, i), "index")) ==
              (json_int_t)i);
    const char *a0 = json_string_value(json_object_get(json_array_get(chs, 0), "text")) ?: "?";
    const char *a1 = json_string_value(json_object_get(json_array_get(chs, 1), "text")) ?: "!";
    CHECK(!strcmp(a0, a1));
    CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) ==
          u1.prompt_tokens + 3);
    json_decref(j);
    tu_free(&r);

    /* echo: the text begins with the prompt */
    r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR,
                   "{\"prompt\":\"Once upon a time\",\"echo\":true,\"max_tokens\":4,"
                   "\"temperature\":0}");
    j = tu_json(&r);
    const char *et = json_string_value(
                         json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"))
                         ?: "";
    CHECKF(r.status == 200 && !strncmp(et, "Once upon a time", 16) && strlen(et) > 16,
           "echo: %d '%s'", r.status, et);
    json_decref(j);
    tu_free(&r);
}

/* The completion's choice 0 of a whole (non-streamed) response. */
static json_t *choice0(json_t *j) {
    return json_array_get(json_object_get(j, "choices"), 0);
}

/* echo with logprobs: the prompt's tokens lead logprobs (the first with null logprob and
 * null alternatives), text_offset starts at 0 and advances by each token's characters; a
 * prompt token's logprob is that of the same token generated after the shorter prompt
 * (the logits row of the position before it); streamed, the prompt's entries come in the
 * first chunk, with the prompt's text. */
static void test_echo_logprobs(tsrv *t) {
    /* a: "Once upon a time" as token ids, one generated token g with its logprob */
    tu_resp r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR,
                           "{\"prompt\":\"Once upon a time\",\"max_tokens\":1,\"temperature\":0,"
                           "\"logprobs\":1,\"ignore_eos\":true}");
    json_t *j = tu_json(&r);
    REQUIRE(r.status == 200 && j);
    const json_int_t n_prompt =
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    const double lp_g = json_real_value(
        json_array_get(json_object_get(json_object_get(choice0(j), "logprobs"), "token_logprobs"),
                       0));
    const char *g_text = json_string_value(json_object_get(choice0(j), "text")) ?: "";
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time%s\",\"echo\":true,\"logprobs\":2,\"max_tokens\":3,"
             "\"temperature\":0,\"ignore_eos\":true",
             g_text);
    json_decref(j);
    tu_free(&r);

    char whole_body[600];
    snprintf(whole_body, sizeof whole_body, "%s}", body);
    r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR, whole_body);
    j = tu_json(&r);
    CHECKF(r.status == 200 && j, "echo + logprobs: %d %s", r.status, r.body.p);
    if (!j) {
        tu_free(&r);
        return;
    }
    json_t *c = choice0(j), *lp = json_object_get(c, "logprobs");
    json_t *toks = json_object_get(lp, "tokens"), *lps = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs"), *offs = json_object_get(lp, "text_offset");
    json_t *u = json_object_get(j, "usage");
    const json_int_t pt = json_integer_value(json_object_get(u, "prompt_tokens"));
    const json_int_t ct = json_integer_value(json_object_get(u, "completion_tokens"));
    const char *text = json_string_value(json_object_get(c, "text")) ?: "";
    CHECKF(pt == n_prompt + 1 && ct == 3, "prompt_tokens %lld completion_tokens %lld",
           (long long)pt, (long long)ct);
    const size_t n_ent = (size_t)(pt + ct);
    CHECKF(json_array_size(toks) == n_ent && json_array_size(lps) == n_ent &&
               json_array_size(tops) == n_ent && json_array_size(offs) == n_ent,
           "%zu logprobs entries, want %lld", json_array_size(toks), (long long)(pt + ct));
    CHECK(json_is_null(json_array_get(lps, 0)) && json_is_null(json_array_get(tops, 0)));
    /* the logprob of g after the prompt: the row of the position before it, bitwise */
    CHECKF(json_real_value(json_array_get(lps, (size_t)n_prompt)) == lp_g,
           "prompt token %lld: logprob %.9g, generated after the shorter prompt %.9g",
           (long long)n_prompt, json_real_value(json_array_get(lps, (size_t)n_prompt)), lp_g);
    /* text_offset indexes the text (characters): 0 first, non-decreasing, and each token's
     * piece found at its offset (SPM's leading space dropped at the start of the text) */
    bool shape = true, offs_ok = json_integer_value(json_array_get(offs, 0)) == 0;
    const int64_t text_chars = srv_utf8_count(text, strlen(text));
    for (size_t i = 0; i < json_array_size(toks); i++) {
        const char *tk = json_string_value(json_array_get(toks, i)) ?: "";
        if (i > 0 && !(json_is_real(json_array_get(lps, i)) &&
                       json_real_value(json_array_get(lps, i)) <= 0.0 &&
                       json_object_size(json_array_get(tops, i)) >= 1))
            shape = false;
        const json_int_t o = json_integer_value(json_array_get(offs, i));
        if (o < 0 || o > text_chars ||
            (i > 0 && o < json_integer_value(json_array_get(offs, i - 1))))
            offs_ok = false;
        /* the text is ASCII here: offsets are byte indices */
        const char *at = text + (o <= text_chars ? o : 0);
        if (*tk && strncmp(at, tk, strlen(tk)) && !(i <= 1 && tk[0] == ' ' &&
                                                    !strncmp(at, tk + 1, strlen(tk) - 1)))
            offs_ok = false;
    }
    CHECK(shape);
    CHECKF(offs_ok, "text_offset does not index the text '%s'", text);

    /* streamed: the prompt's entries with the prompt's text first, then the same entries */
    char stream_body[600];
    snprintf(stream_body, sizeof stream_body, "%s,\"stream\":true}", body);
    tu_resp rs = tu_request(t->port, "POST", "/v1/completions", KEY_HDR, stream_body);
    CHECKF(rs.status == 200, "echo + logprobs streamed: %d", rs.status);
    size_t n_entries = 0, first_n = 0;
    bool first = true, same = true;
    for (char *p = rs.body.p; p && *p;) {
        REQUIRE(!strncmp(p, "data: ", 6));
        char *end = strstr(p, "\n\n");
        REQUIRE(end);
        *end = '\0';
        json_t *ev = strcmp(p + 6, "[DONE]") ? json_loads(p + 6, 0, NULL) : NULL;
        json_t *sc = json_array_get(json_object_get(ev, "choices"), 0);
        json_t *sl = json_object_get(sc, "logprobs");
        json_t *st = json_object_get(sl, "tokens"), *sp = json_object_get(sl, "token_logprobs");
        if (json_array_size(st) > 0) {
            if (first) {
                first = false;
                first_n = json_array_size(st);
                CHECKF(!strcmp(json_string_value(json_object_get(sc, "text")) ?: "",
                               "Once upon a time") ||
                           !strncmp(json_string_value(json_object_get(sc, "text")) ?: "",
                                    "Once upon a time", 16),
                       "first chunk text '%s'", json_string_value(json_object_get(sc, "text")));
            }
            for (size_t i = 0; i < json_array_size(st); i++, n_entries++)
                if (!json_equal(json_array_get(st, i), json_array_get(toks, n_entries)) ||
                    !json_equal(json_array_get(sp, i), json_array_get(lps, n_entries)))
                    same = false;
        }
        json_decref(ev);
        p = end + 2;
    }
    CHECKF(first_n == (size_t)pt, "first chunk: %zu entries, want the prompt's %lld", first_n,
           (long long)pt);
    CHECKF(same && n_entries == json_array_size(toks), "streamed %zu entries (same: %d)",
           n_entries, same);
    tu_free(&rs);
    json_decref(j);
    tu_free(&r);
}

/* A model without a tokenizer (stories260K.bin: its tok512.bin is not the default name):
 * token prompts only, and the choices carry token_ids, whole and streamed, equal to the
 * engine's ids (issue 20: no "text": "" without ids). */
static void test_no_tokenizer(void) {
    kiln_model *m = NULL;
    kiln_error err = {0};
    /* the checkpoint alone in a directory of its own: no tokenizer beside it */
    char dir[64], path[96], cmd[512];
    snprintf(dir, sizeof dir, "/tmp/kiln-test-notok-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/model.bin", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s %s", dir,
             kiln_test_shared("models/stories260K/stories260K.bin"), path);
    REQUIRE(system(cmd) == 0);
    kiln_status lst = kiln_model_load(path, NULL, &m, &err);
    remove(path);
    rmdir(dir);
    if (lst != KILN_OK || kiln_model_has_tokenizer(m)) {
        kiln_model_free(m);
        printf("test_no_tokenizer: skipped (%s)\n", err.message);
        return;
    }
    kiln_server_params sp = {.model_name = "bare"};
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    tsrv t;
    tsrv_start(&t, m, &sp, &ep);
    int32_t prompt[3] = {1, 403, 407};
    kiln_request rq = kiln_request_defaults();
    rq.prompt_ids = prompt;
    rq.n_prompt_ids = 3;
    rq.max_tokens = 5;
    rq.temperature = 0;
    rq.ignore_eos = true;
    kiln_stream *st = NULL;
    REQUIRE(kiln_engine_submit(t.e, &rq, &st, &err) == KILN_OK);
    int32_t want[5], nw = 0;
    for (;;) {
        kiln_event ev;
        REQUIRE(kiln_stream_next(st, 10000, &ev, &err) == KILN_OK && ev.type != KILN_EVENT_NONE);
        if (ev.type == KILN_EVENT_TOKEN && nw < 5) want[nw++] = ev.token;
        if (ev.type == KILN_EVENT_FINISH) break;
    }
    kiln_stream_destroy(st);
    REQUIRE(nw == 5);
    const char *body = "{\"prompt\":[1,403,407],\"max_tokens\":5,\"temperature\":0,"
                       "\"ignore_eos\":true}";
    tu_resp r = tu_request(t.port, "POST", "/v1/completions", NULL, body);
    CHECKF(r.status == 200, "no tokenizer: %d %s", r.status, r.body.p);
    json_t *j = tu_json(&r);
    json_t *ids = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "token_ids");
    CHECKF(json_array_size(ids) == 5, "token_ids: %s", r.body.p);
    for (int i = 0; i < 5; i++)
        CHECK(json_integer_value(json_array_get(ids, (size_t)i)) == want[i]);
    json_decref(j);
    tu_free(&r);
    /* streamed: one chunk per token, the same ids */
    r = tu_request(t.port, "POST", "/v1/completions", NULL,
                   "{\"prompt\":[1,403,407],\"max_tokens\":5,\"temperature\":0,"
                   "\"ignore_eos\":true,\"stream\":true}");
    CHECK(r.status == 200);
    int got = 0;
    for (char *p = r.body.p; p && (p = strstr(p, "\"token_ids\":[")); p++) {
        long v = strtol(p + strlen("\"token_ids\":["), NULL, 10);
        CHECK(got < 5 && v == want[got]);
        got++;
    }
    CHECKF(got == 5, "%d streamed token_ids", got);
    tu_free(&r);
    /* a text prompt needs a tokenizer: a 400, never an empty text */
    r = tu_request(t.port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once\"}");
    CHECKF(r.status == 400, "text prompt without a tokenizer: %d", r.status);
    tu_free(&r);
    tsrv_stop(&t);
    kiln_model_free(m);
}

/* A stop string through HTTP (matched on the connection's thread, which reads the stream):
 * the same text, finish and usage as the engine API gives, whole and streamed, one logprobs
 * entry per counted token, and the KV blocks back once the response is complete. */
static void test_stop_usage(tsrv *t) {
    kiln_request rq = kiln_request_defaults();
    rq.prompt = "Once upon a time";
    rq.max_tokens = 40;
    rq.temperature = 0;
    kiln_finish_reason fin;
    kiln_usage base_usage;
    char *base = engine_run(t->e, &rq, &fin, &base_usage);
    REQUIRE(strlen(base) > 30);
    char stop[8] = {0};
    memcpy(stop, base + 20, 3); /* somewhere mid-text, maybe across tokens */
    const char *stops[] = {stop};
    rq.stop = stops;
    rq.n_stop = 1;
    kiln_usage want_usage;
    char *want = engine_run(t->e, &rq, &fin, &want_usage);
    CHECK(fin == KILN_FINISH_STOP && want_usage.completion_tokens < 40);
    json_t *stop_json = json_string(stop);
    char *stop_lit = json_dumps(stop_json, JSON_ENCODE_ANY);
    json_decref(stop_json);
    for (int streamed = 0; streamed < 2; streamed++) {
        srv_buf b = {0};
        srv_buf_addf(&b,
                     "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,"
                     "\"logprobs\":1,\"stop\":[%s]%s}",
                     stop_lit,
                     streamed ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}"
                              : "");
        tu_resp r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR, b.p);
        srv_buf_free(&b);
        CHECKF(r.status == 200, "stop completion: %d", r.status);
        srv_buf text = {0};
        srv_buf_add(&text, "", 0);
        const char *finish = NULL;
        int64_t completion = -1;
        size_t n_lp = 0;
        json_t *keep[64];
        int n_keep = 0;
        for (char *p = r.body.p; p && *p;) {
            json_t *j;
            if (streamed) {
                char *end = strstr(p, "\n\n");
                REQUIRE(end && !strncmp(p, "data: ", 6));
                *end = '\0';
                j = strcmp(p + 6, "[DONE]") ? json_loads(p + 6, 0, NULL) : NULL;
                p = end + 2;
                if (!j) continue;
            } else {
                j = json_loads(p, 0, NULL);
                p = NULL;
                REQUIRE(j);
            }
            json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
            if (ch) {
                srv_buf_adds(&text, json_string_value(json_object_get(ch, "text")) ?: "");
                n_lp += json_array_size(json_object_get(json_object_get(ch, "logprobs"), "tokens"));
                if (json_is_string(json_object_get(ch, "finish_reason")))
                    finish = json_string_value(json_object_get(ch, "finish_reason"));
            }
            json_t *u = json_object_get(j, "usage");
            if (json_is_object(u))
                completion = json_integer_value(json_object_get(u, "completion_tokens"));
            if (n_keep < 64)
                keep[n_keep++] = j; /* finish points into it */
            else
                json_decref(j);
        }
        CHECKF(!strcmp(text.p, want), "%s stop '%s': text '%s', want '%s'",
               streamed ? "streamed" : "whole", stop, text.p, want);
        CHECKF(finish && !strcmp(finish, "stop"), "%s stop: finish %s",
               streamed ? "streamed" : "whole", finish ? finish : "(none)");
        CHECKF(completion == want_usage.completion_tokens && n_lp == (size_t)completion,
               "%s stop: usage %lld, %zu logprobs, want %d", streamed ? "streamed" : "whole",
               (long long)completion, n_lp, want_usage.completion_tokens);
        for (int k = 0; k < n_keep; k++) json_decref(keep[k]);
        srv_buf_free(&text);
        tu_free(&r);
        CHECK(tu_wait_idle(t->e, 3000));
    }
    free(stop_lit);
    free(want);
    free(base);
}

static void test_loading_then_ready(void) {
    kiln_server_params sp = {.api_key = "sk-test"};
    tsrv t;
    tsrv_start(&t, NULL, &sp, NULL);
    tu_resp r = tu_request(t.port, "GET", "/health", NULL, NULL);
    CHECKF(r.status == 503, "health while loading: %d", r.status);
    CHECK(r.body.p && strstr(r.body.p, "loading"));
    tu_free(&r);
    r = tu_request(t.port, "POST", "/v1/completions", KEY_HDR, "{\"prompt\":\"a\"}");
    CHECKF(r.status == 503, "completion while loading: %d", r.status);
    json_t *j = tu_json(&r);
    CHECK(!strcmp(tu_err_field(j, "code"), "model_loading"));
    json_decref(j);
    tu_free(&r);
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    kiln_error err = {0};
    REQUIRE(kiln_engine_create(g_model, &ep, &t.e, &err) == KILN_OK);
    REQUIRE(kiln_server_set_ready(t.srv, g_model, t.e, 0, &err) == KILN_OK);
    CHECK(kiln_server_chat_fallback(t.srv)); /* stories260K ships no chat template */
    CHECK(tu_healthy(t.port));
    tsrv_stop(&t);
}

/* golden case 0 of stories260K: prompt ids and greedy continuation. */
typedef struct golden {
    int32_t prompt[64], gen[300];
    int n_prompt, n_gen;
    char prompt_text[128];
} golden;

static bool load_golden(golden *g) {
    const char *path = kiln_test_shared("golden/llama2c-greedy.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return false;
    json_t *c;
    size_t i;
    bool found = false;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *model = json_string_value(json_object_get(c, "model"));
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        if (!model || strcmp(model, "stories260K") || !prompt || strcmp(prompt, "Once upon a time"))
            continue;
        json_t *p = json_object_get(c, "prompt_ids"), *gen = json_object_get(c, "generated_ids");
        g->n_prompt = (int)json_array_size(p);
        g->n_gen = (int)json_array_size(gen);
        if (g->n_prompt > 64 || g->n_gen > 300) break;
        for (int k = 0; k < g->n_prompt; k++)
            g->prompt[k] = (int32_t)json_integer_value(json_array_get(p, (size_t)k));
        for (int k = 0; k < g->n_gen; k++)
            g->gen[k] = (int32_t)json_integer_value(json_array_get(gen, (size_t)k));
        snprintf(g->prompt_text, sizeof g->prompt_text, "%s", prompt);
        found = true;
        break;
    }
    json_decref(root);
    return found;
}

static void ids_json(srv_buf *b, const int32_t *ids, int n) {
    srv_buf_adds(b, "[");
    for (int i = 0; i < n; i++) srv_buf_addf(b, "%s%d", i ? "," : "", ids[i]);
    srv_buf_adds(b, "]");
}

static void test_routes(tsrv *t) {
    golden g;
    REQUIRE(load_golden(&g));
    int n_gen = g.n_gen < 40 ? g.n_gen : 40;

    /* /tokenize of the golden prompt gives run.c's ids. */
    tu_resp r =
        tu_request(t->port, "POST", "/tokenize", KEY_HDR, "{\"prompt\":\"Once upon a time\"}");
    CHECKF(r.status == 200, "tokenize: %d", r.status);
    json_t *j = tu_json(&r);
    json_t *toks = json_object_get(j, "tokens");
    CHECK((int)json_array_size(toks) == g.n_prompt);
    for (int i = 0; i < g.n_prompt && i < (int)json_array_size(toks); i++)
        CHECK(json_integer_value(json_array_get(toks, (size_t)i)) == g.prompt[i]);
    CHECK(json_integer_value(json_object_get(j, "count")) == g.n_prompt);
    CHECK(json_integer_value(json_object_get(j, "max_model_len")) == 512);
    json_decref(j);
    tu_free(&r);

    /* Greedy completion from the golden prompt ids = llama2.c's continuation: the text must
     * equal detokenize(prompt + continuation) minus detokenize(prompt). */
    srv_buf b = {0};
    srv_buf_adds(&b, "{\"tokens\":");
    ids_json(&b, g.prompt, g.n_prompt);
    srv_buf_adds(&b, "}");
    r = tu_request(t->port, "POST", "/detokenize", KEY_HDR, b.p);
    CHECKF(r.status == 200, "detokenize: %d", r.status);
    j = tu_json(&r);
    char *prompt_text = strdup(json_string_value(json_object_get(j, "prompt")) ?: "");
    json_decref(j);
    tu_free(&r);
    CHECKF(!strcmp(prompt_text, "Once upon a time"), "detokenized prompt '%s'", prompt_text);
    int32_t all[400];
    memcpy(all, g.prompt, (size_t)g.n_prompt * sizeof *all);
    memcpy(all + g.n_prompt, g.gen, (size_t)n_gen * sizeof *all);
    srv_buf_reset(&b);
    srv_buf_adds(&b, "{\"tokens\":");
    ids_json(&b, all, g.n_prompt + n_gen);
    srv_buf_adds(&b, "}");
    r = tu_request(t->port, "POST", "/detokenize", KEY_HDR, b.p);
    j = tu_json(&r);
    const char *full = json_string_value(json_object_get(j, "prompt"));
    REQUIRE(full && strlen(full) >= strlen(prompt_text));
    char *want = strdup(full + strlen(prompt_text));
    json_decref(j);
    tu_free(&r);

    srv_buf_reset(&b);
    srv_buf_adds(&b, "{\"model\":\"stories\",\"prompt\":");
    ids_json(&b, g.prompt, g.n_prompt);
    srv_buf_addf(&b, ",\"max_tokens\":%d,\"temperature\":0,\"unknown_field\":[1]}", n_gen);
    r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR, b.p);
    CHECKF(r.status == 200, "completion: %d %s", r.status, r.body.p);
    CHECK(strstr(r.headers, "application/json") != NULL);
    j = tu_json(&r);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(c0, "text"));
    CHECKF(text && !strcmp(text, want), "greedy text '%s'\n want '%s'", text, want);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")) ?: "", "text_completion"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "model")) ?: "", "stories"));
    CHECK(!strncmp(json_string_value(json_object_get(j, "id")) ?: "", "cmpl-", 5));
    CHECK(json_integer_value(json_object_get(j, "created")) > 1600000000);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "finish_reason")) ?: "", "length"));
    json_t *u = json_object_get(j, "usage");
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == g.n_prompt);
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == n_gen);
    CHECK(json_integer_value(
              json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) == 0);
    json_decref(j);
    tu_free(&r);

    /* The same request as text through the engine API directly: identical text. */
    kiln_request rq = kiln_request_defaults();
    rq.prompt = "Once upon a time";
    rq.max_tokens = n_gen;
    rq.temperature = 0;
    char *direct = engine_text(t->e, &rq);
    r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR,
                   "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}");
    j = tu_json(&r);
    text = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    CHECKF(n_gen != 40 || (text && !strcmp(text, direct)), "server '%s' vs engine '%s'", text,
           direct);
    json_decref(j);
    tu_free(&r);
    free(direct);

    /* Streaming completion: chunks concatenate to the same text; [DONE] last. */
    r = tu_request(t->port, "POST", "/v1/completions", KEY_HDR,
                   "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,"
                   "\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    CHECKF(r.status == 200, "stream: %d", r.status);
    CHECK(strcasestr(r.headers, "content-type: text/event-stream") != NULL);
    srv_buf joined = {0};
    srv_buf_add(&joined, "", 0);
    int n_finish = 0, n_usage = 0, n_events = 0;
    bool done_last = false;
    for (char *p = r.body.p; p && *p;) {
        REQUIRE(!strncmp(p, "data: ", 6));
        char *end = strstr(p, "\n\n");
        REQUIRE(end);
        *end = '\0';
        done_last = !strcmp(p + 6, "[DONE]");
        if (!done_last) {
            json_error_t je;
            json_t *ev = json_loads(p + 6, 0, &je);
            REQUIRE(ev);
            CHECK(n_finish == 0 || json_array_size(json_object_get(ev, "choices")) == 0);
            json_t *ch = json_array_get(json_object_get(ev, "choices"), 0);
            if (ch) {
                srv_buf_adds(&joined, json_string_value(json_object_get(ch, "text")) ?: "");
                if (json_is_string(json_object_get(ch, "finish_reason"))) n_finish++;
            } else {
                n_usage++;
                json_t *uj = json_object_get(ev, "usage");
                CHECK(json_integer_value(json_object_get(uj, "completion_tokens")) == 40);
                CHECK(json_is_integer(json_object_get(json_object_get(uj, "prompt_tokens_details"),
                                                      "cached_tokens")));
            }
            json_decref(ev);
        }
        n_events++;
        p = end + 2;
    }
    CHECK(done_last && n_finish == 1 && n_usage == 1 && n_events >= 3);
    CHECKF(n_gen != 40 || !strcmp(joined.p, want), "streamed '%s'", joined.p);
    srv_buf_free(&joined);
    tu_free(&r);

    /* Chat (ChatML fallback): a whole response in the chat.completion shape. */
    r = tu_request(t->port, "POST", "/v1/chat/completions", KEY_HDR,
                   "{\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"A cat\"}]}],"
                   "\"max_completion_tokens\":8,\"temperature\":0,\"logprobs\":true,"
                   "\"top_logprobs\":3}");
    CHECKF(r.status == 200, "chat: %d %s", r.status, r.body.p);
    j = tu_json(&r);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")) ?: "", "chat.completion"));
    CHECK(!strcmp(json_string_value(json_object_get(msg, "role")) ?: "", "assistant"));
    CHECK(json_is_string(json_object_get(msg, "content")));
    json_t *content = json_object_get(json_object_get(c0, "logprobs"), "content");
    int64_t ct =
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    CHECKF((int64_t)json_array_size(content) == ct || (int64_t)json_array_size(content) == ct - 1,
           "%zu logprob entries for %lld tokens", json_array_size(content), (long long)ct);
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *e = json_array_get(content, i);
        json_t *top = json_object_get(e, "top_logprobs");
        double lp = json_number_value(json_object_get(e, "logprob"));
        CHECK(json_is_string(json_object_get(e, "token")) && lp <= 0);
        CHECK(json_is_array(json_object_get(e, "bytes")));
        CHECK(json_array_size(top) == 3);
        /* Greedy: the sampled token is the most likely one. */
        CHECK(fabs(json_number_value(json_object_get(json_array_get(top, 0), "logprob")) - lp) <
              1e-6);
        for (size_t k = 1; k < json_array_size(top); k++)
            CHECK(json_number_value(json_object_get(json_array_get(top, k), "logprob")) <=
                  json_number_value(json_object_get(json_array_get(top, k - 1), "logprob")));
    }
    json_decref(j);
    tu_free(&r);

    /* /v1/models, /v1/models/{id}, /metrics. */
    r = tu_request(t->port, "GET", "/v1/models", KEY_HDR, NULL);
    j = tu_json(&r);
    CHECK(r.status == 200 &&
          !strcmp(json_string_value(json_object_get(j, "object")) ?: "", "list"));
    CHECK(!strcmp(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"))
            ?: "",
        "stories"));
    json_decref(j);
    tu_free(&r);
    r = tu_request(t->port, "GET", "/v1/models/stories", KEY_HDR, NULL);
    CHECK(r.status == 200);
    tu_free(&r);
    r = tu_request(t->port, "GET", "/v1/models/gpt-4", KEY_HDR, NULL);
    CHECK(r.status == 404);
    tu_free(&r);
    r = tu_request(t->port, "GET", "/metrics", NULL, NULL);
    CHECK(r.status == 200 && strstr(r.headers, "text/plain"));
    const char *names[] = {"kiln_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}",
                           "kiln_prompt_tokens_total",
                           "kiln_generation_tokens_total",
                           "kiln_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
                           "kiln_inter_token_latency_seconds_count",
                           "kiln_num_requests_running 0",
                           "kiln_num_requests_waiting 0",
                           "kiln_kv_blocks_used 0",
                           "# TYPE kiln_prompt_tokens_cached_total counter",
                           "# TYPE kiln_kv_blocks_cached gauge",
                           "# TYPE kiln_prefix_cache_hits_total counter",
                           "# TYPE kiln_prefix_cache_misses_total counter",
                           "# TYPE kiln_prefix_cache_hit_tokens_total counter",
                           "# TYPE kiln_prefix_cache_miss_tokens_total counter",
                           "# TYPE kiln_kv_evictions_total counter",
                           "# TYPE kiln_preemptions_total counter",
                           "# TYPE kiln_disk_cache_reads_total counter",
                           "# TYPE kiln_disk_cache_writes_total counter",
                           "# TYPE kiln_disk_cache_read_bytes_total counter",
                           "# TYPE kiln_disk_cache_write_bytes_total counter",
                           "# TYPE kiln_disk_cache_corrupt_total counter",
                           "# TYPE kiln_disk_cache_files gauge",
                           "# TYPE kiln_disk_cache_bytes gauge",
                           "\nkiln_disk_cache_files 0\n",
                           "\nkiln_disk_cache_reads_total 0\n"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECKF(r.body.p && strstr(r.body.p, names[i]), "metrics lack %s", names[i]);
    tu_free(&r);
    srv_buf_free(&b);
    free(prompt_text);
    free(want);
}

/* The value of an unlabelled sample `name` in a /metrics body; -1 when absent. */
static long long metric_value(const char *body, const char *name) {
    size_t n = strlen(name);
    for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') return strtoll(p + n + 1, NULL, 10);
    return -1;
}

static long long get_metric(int port, const char *name) {
    tu_resp r = tu_request(port, "GET", "/metrics", NULL, NULL);
    long long v = r.status == 200 ? metric_value(r.body.p, name) : -1;
    tu_free(&r);
    return v;
}

/* usage.prompt_tokens_details.cached_tokens of a response body or usage chunk; -1 when it is
 * missing or not an integer. */
static long long cached_of(json_t *j) {
    json_t *c = json_object_get(
        json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens");
    return json_is_integer(c) ? (long long)json_integer_value(c) : -1;
}

/* The usage chunk's cached_tokens of a streamed response (include_usage); -1 when absent. */
static long long stream_cached(const tu_resp *r) {
    long long cached = -1;
    char *copy = strdup(r->body.p ? r->body.p : "");
    for (char *p = copy; p && *p;) {
        char *end = strstr(p, "\n\n");
        if (!end || strncmp(p, "data: ", 6)) break;
        *end = '\0';
        json_t *j = strcmp(p + 6, "[DONE]") ? json_loads(p + 6, 0, NULL) : NULL;
        if (j && json_is_object(json_object_get(j, "usage"))) cached = cached_of(j);
        json_decref(j);
        p = end + 2;
    }
    free(copy);
    return cached;
}

/* Prefix cache through HTTP (issue 13): the same long prompt twice, whole and streamed, for
 * completions and chat. The first is computed (cached_tokens 0); later ones report the
 * blocks that came from the cache in usage.prompt_tokens_details.cached_tokens, produce the
 * same greedy text, and are summed by kiln_prompt_tokens_cached_total; the log line says
 * cached=N. With the cache off (no_prefix_cache) cached_tokens stays 0. */
static void test_prefix_cache(bool cache_off) {
    char logpath[] = "/tmp/kiln-srv-prefix-XXXXXX";
    int lfd = mkstemp(logpath);
    REQUIRE(lfd >= 0);
    FILE *log = fdopen(lfd, "w+");
    REQUIRE(log);
    kiln_server_params sp = {.model_name = "stories", .log = log};
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    ep.no_prefix_cache = cache_off;
    tsrv t;
    tsrv_start(&t, g_model, &sp, &ep);
    kiln_engine_stats st;
    kiln_engine_get_stats(t.e, &st);
    const int bs = st.block_size > 0 ? st.block_size : 16;
    const char *what = cache_off ? "cache off" : "cache on";

    /* 5 full blocks and a bit: ids no other test sends. */
    enum { N_PROMPT = 90 };
    srv_buf b = {0};
    srv_buf_adds(&b, "{\"prompt\":[1");
    for (int i = 1; i < N_PROMPT; i++) srv_buf_addf(&b, ",%d", 3 + (i * 37) % 500);
    srv_buf_adds(&b, "],\"max_tokens\":8,\"temperature\":0");
    srv_buf whole = {0}, streamed = {0};
    srv_buf_addf(&whole, "%s}", b.p);
    srv_buf_addf(&streamed, "%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", b.p);

    long long cached[5] = {-1, -1, -1, -1, -1};
    char *text[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        tu_resp r = tu_request(t.port, "POST", "/v1/completions", NULL, whole.p);
        CHECKF(r.status == 200, "%s: completion %d: %d %s", what, k, r.status, r.body.p);
        json_t *j = tu_json(&r);
        cached[k] = cached_of(j);
        CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")) ==
              N_PROMPT);
        const char *tx = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        text[k] = strdup(tx ? tx : "");
        json_decref(j);
        tu_free(&r);
        CHECK(tu_wait_idle(t.e, 3000));
    }
    tu_resp r = tu_request(t.port, "POST", "/v1/completions", NULL, streamed.p);
    CHECKF(r.status == 200, "%s: streamed completion: %d", what, r.status);
    cached[2] = stream_cached(&r);
    tu_free(&r);
    CHECK(tu_wait_idle(t.e, 3000));

    /* Chat: a long system message, the same conversation twice. */
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"You are a storyteller. "
                       "Tell short, happy stories about animals in a park, with a dog, a cat and a "
                       "little bird who are friends.\"},{\"role\":\"user\",\"content\":\"A story, "
                       "please.\"}],\"max_tokens\":4,\"temperature\":0}";
    for (int k = 0; k < 2; k++) {
        r = tu_request(t.port, "POST", "/v1/chat/completions", NULL, chat);
        CHECKF(r.status == 200, "%s: chat %d: %d %s", what, k, r.status, r.body.p);
        json_t *j = tu_json(&r);
        cached[3 + k] = cached_of(j);
        json_decref(j);
        tu_free(&r);
        CHECK(tu_wait_idle(t.e, 3000));
    }

    for (int k = 0; k < 5; k++)
        CHECKF(cached[k] >= 0, "%s: response %d has no cached_tokens", what, k);
    CHECKF(cached[0] == 0 && cached[3] == 0, "%s: first sight of a prompt cached %lld / %lld", what,
           cached[0], cached[3]);
    CHECKF(!strcmp(text[0], text[1]), "%s: the repeated prompt's text '%s' differs from '%s'", what,
           text[1], text[0]);
    long long hits = get_metric(t.port, "kiln_prefix_cache_hits_total");
    CHECK(hits >= 0 && get_metric(t.port, "kiln_prefix_cache_misses_total") >= 0);
    long long sum = 0;
    for (int k = 0; k < 5; k++) sum += cached[k] > 0 ? cached[k] : 0;
    CHECKF(get_metric(t.port, "kiln_prompt_tokens_cached_total") == sum,
           "%s: kiln_prompt_tokens_cached_total %lld, responses sum to %lld", what,
           get_metric(t.port, "kiln_prompt_tokens_cached_total"), sum);
    if (cache_off) {
        for (int k = 0; k < 5; k++)
            CHECKF(cached[k] == 0, "cache off: response %d cached %lld", k, cached[k]);
        CHECK(hits == 0);
    } else {
        /* The repeats hit: whole blocks, at most N_PROMPT - 1 (the last token is computed). */
        for (int k = 1; k < 3; k++)
            CHECKF(cached[k] > 0 && cached[k] % bs == 0 && cached[k] <= N_PROMPT - 1,
                   "completion %d: cached_tokens %lld (blocks of %d, prompt %d)", k, cached[k], bs,
                   N_PROMPT);
        CHECKF(cached[4] > 0 && cached[4] % bs == 0, "repeated chat: cached_tokens %lld",
               cached[4]);
        CHECKF(hits >= 3, "kiln_prefix_cache_hits_total %lld after 3 repeats", hits);
        CHECK(get_metric(t.port, "kiln_prefix_cache_hit_tokens_total") >= sum);
    }
    tsrv_stop(&t);

    /* The log line of the repeated whole completion says how many tokens were cached. */
    fflush(log);
    rewind(log);
    char line[1024], want[64];
    snprintf(want, sizeof want, " 200 prompt=%d cached=%lld completion=8 ", N_PROMPT, cached[1]);
    int n_lines = 0;
    while (fgets(line, sizeof line, log))
        if (strstr(line, "/v1/completions") && strstr(line, want)) n_lines++;
    CHECKF(n_lines >= 1, "%s: no log line with '%s'", what, want);
    fclose(log);
    remove(logpath);
    for (int k = 0; k < 2; k++) free(text[k]);
    srv_buf_free(&b);
    srv_buf_free(&whole);
    srv_buf_free(&streamed);
}

static void expect_error(tsrv *t, const char *method, const char *path, const char *headers,
                         const char *body, int status, const char *code, const char *param) {
    tu_resp r = tu_request(t->port, method, path, headers, body);
    CHECKF(r.status == status, "%s %s %.80s: status %d, want %d (%s)", method, path,
           body ? body : "", r.status, status, r.body.p);
    json_t *j = tu_json(&r);
    CHECKF(json_is_object(json_object_get(j, "error")), "no error object: %s", r.body.p);
    CHECK(json_is_string(json_object_get(json_object_get(j, "error"), "message")));
    CHECK(json_is_string(json_object_get(json_object_get(j, "error"), "type")));
    if (code)
        CHECKF(!strcmp(tu_err_field(j, "code"), code), "code '%s', want '%s'",
               tu_err_field(j, "code"), code);
    if (param)
        CHECKF(!strcmp(tu_err_field(j, "param"), param), "param '%s', want '%s'",
               tu_err_field(j, "param"), param);
    json_decref(j);
    tu_free(&r);
}

static void test_errors(tsrv *t) {
    expect_error(t, "GET", "/v2/nothing", KEY_HDR, NULL, 404, NULL, NULL);
    expect_error(t, "POST", "/v1/embeddings", KEY_HDR, "{}", 404, NULL, NULL);
    expect_error(t, "GET", "/v1/completions", KEY_HDR, NULL, 405, NULL, NULL);
    expect_error(t, "POST", "/v1/completions", NULL, "{\"prompt\":\"a\"}", 401, "invalid_api_key",
                 NULL);
    expect_error(t, "POST", "/v1/completions", "Authorization: Bearer sk-wrong\r\n",
                 "{\"prompt\":\"a\"}", 401, "invalid_api_key", NULL);
    expect_error(t, "GET", "/v1/models", "Authorization: sk-test\r\n", NULL, 401, NULL, NULL);
    expect_error(t, "POST", "/v1/completions", KEY_HDR, "{\"prompt\": \"a\",", 400, NULL, NULL);
    expect_error(t, "POST", "/v1/completions", KEY_HDR, "{\"prompt\":\"a\",\"max_tokens\":\"3\"}",
                 400, NULL, "max_tokens");
    expect_error(t, "POST", "/v1/completions", KEY_HDR, "{\"prompt\":\"a\",\"top_p\":7}", 400, NULL,
                 "top_p");
    expect_error(t, "POST", "/v1/completions", KEY_HDR, "{\"prompt\":\"a\",\"n\":17}", 400, NULL,
                 "n");
    expect_error(t, "POST", "/v1/chat/completions", KEY_HDR, "{\"messages\":[]}", 400, NULL,
                 "messages");
    expect_error(t, "POST", "/v1/chat/completions", KEY_HDR,
                 "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400, NULL,
                 "messages[0].role");
    /* Can never fit: the context is 512 positions. */
    expect_error(t, "POST", "/v1/completions", KEY_HDR,
                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":600}", 400, "context_over_budget",
                 NULL);
    srv_buf big = {0};
    srv_buf_adds(&big, "{\"prompt\":\"");
    for (int i = 0; i < 700; i++) srv_buf_adds(&big, " cat");
    srv_buf_adds(&big, "\",\"max_tokens\":1}");
    expect_error(t, "POST", "/v1/completions", KEY_HDR, big.p, 400, "context_over_budget", NULL);
    /* 413: declared length over --max-body (4096 here), and a chunked body that grows past it. */
    srv_buf_reset(&big);
    srv_buf_adds(&big, "{\"prompt\":\"");
    for (int i = 0; i < 1200; i++) srv_buf_adds(&big, "abcd");
    srv_buf_adds(&big, "\"}");
    expect_error(t, "POST", "/v1/completions", KEY_HDR, big.p, 413, "request_too_large", NULL);
    int fd = tu_connect(t->port);
    REQUIRE(fd >= 0);
    const char *hdr = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Authorization: Bearer sk-test\r\nTransfer-Encoding: chunked\r\n\r\n";
    tu_send(fd, hdr, strlen(hdr));
    for (int i = 0; i < 6; i++) {
        char chunk[1100];
        int n = snprintf(chunk, sizeof chunk, "400\r\n");
        memset(chunk + n, 'x', 0x400);
        memcpy(chunk + n + 0x400, "\r\n", 2);
        tu_send(fd, chunk, (size_t)n + 0x400 + 2);
    }
    tu_send(fd, "0\r\n\r\n", 5);
    srv_buf raw = {0};
    tu_read(fd, &raw, NULL, 10000);
    close(fd);
    tu_resp r = {0};
    tu_parse(&raw, &r);
    CHECKF(r.status == 413, "chunked over the limit: %d", r.status);
    tu_free(&r);
    srv_buf_free(&raw);
    srv_buf_free(&big);
    CHECK(tu_healthy(t->port));
}

/* Start a long streaming generation and return its socket once the first token arrived. */
static int start_stream(int port, bool stream, const char *extra) {
    int fd = tu_connect(port);
    REQUIRE(fd >= 0);
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":500,\"ignore_eos\":true,"
             "\"stream\":%s%s}",
             stream ? "true" : "false", extra ? extra : "");
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    REQUIRE(tu_send(fd, req, (size_t)n));
    return fd;
}

static void test_disconnects(tsrv *t) {
    /* Mid-stream: read the first chunk, then close; the engine drops the sequence. */
    for (int round = 0; round < 3; round++) {
        REQUIRE(tu_wait_idle(t->e, 5000));
        int fd = start_stream(t->port, true, NULL);
        srv_buf got = {0};
        CHECK(tu_read(fd, &got, "\"text\"", 10000));
        kiln_engine_stats before;
        kiln_engine_get_stats(t->e, &before);
        CHECK(before.n_running == 1 && before.kv_blocks_used > 0);
        close(fd);
        double t0 = tu_now_ms();
        bool idle = tu_wait_idle(t->e, 3000);
        kiln_engine_stats after;
        kiln_engine_get_stats(t->e, &after);
        CHECKF(idle, "still running %d, %d blocks used after a disconnect", after.n_running,
               after.kv_blocks_used);
        printf("disconnect mid-stream: cancelled after %lld engine steps, %.1f ms\n",
               (long long)(after.n_steps - before.n_steps), tu_now_ms() - t0);
        /* It ended long before its 500 tokens: the generation did not run to completion. */
        CHECK(after.n_decode_tokens - before.n_decode_tokens < 400);
        srv_buf_free(&got);
    }
    /* Mid-request (no stream): close while the server is generating. */
    REQUIRE(tu_wait_idle(t->e, 5000));
    int fd = start_stream(t->port, false, NULL);
    double t0 = tu_now_ms();
    kiln_engine_stats st;
    do {
        kiln_engine_get_stats(t->e, &st);
        tu_sleep_ms(1);
    } while (st.n_running == 0 && tu_now_ms() - t0 < 5000);
    close(fd);
    CHECKF(tu_wait_idle(t->e, 3000), "non-streaming request not cancelled after a disconnect");
    CHECK(tu_healthy(t->port));
    /* n > 1, no stream: every choice watches the one socket, so a close cancels all of them
     * (each would run 500 tokens; a watcher of choice 0 alone let the others finish) */
    REQUIRE(tu_wait_idle(t->e, 5000));
    kiln_engine_stats before;
    kiln_engine_get_stats(t->e, &before);
    fd = start_stream(t->port, false, ",\"n\":4");
    t0 = tu_now_ms();
    do {
        kiln_engine_get_stats(t->e, &st);
        tu_sleep_ms(1);
    } while (st.n_decode_tokens - before.n_decode_tokens < 8 && tu_now_ms() - t0 < 5000);
    close(fd);
    CHECKF(tu_wait_idle(t->e, 3000), "n = 4 request not cancelled after a disconnect");
    kiln_engine_get_stats(t->e, &st);
    CHECKF(st.n_decode_tokens - before.n_decode_tokens < 1000,
           "n = 4: %lld tokens decoded after the client left (4 x 500 if not cancelled)",
           (long long)(st.n_decode_tokens - before.n_decode_tokens));
    CHECK(tu_healthy(t->port));
}

static void test_half_request(tsrv *t) {
    /* Headers and half a body, then silence: the 1 s timeout closes the connection, and
     * other clients are served meanwhile. */
    int fd = tu_connect(t->port);
    REQUIRE(fd >= 0);
    const char *half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test"
                       "\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
    tu_send(fd, half, strlen(half));
    int fd2 = tu_connect(t->port);
    REQUIRE(fd2 >= 0);
    tu_send(fd2, "GET /heal", 9); /* half a request line */
    CHECK(tu_healthy(t->port));
    double t0 = tu_now_ms();
    srv_buf got = {0};
    bool closed = tu_read(fd, &got, NULL, 6000);
    CHECKF(closed, "silent client not closed after %.0f ms", tu_now_ms() - t0);
    srv_buf_reset(&got);
    CHECK(tu_read(fd2, &got, NULL, 6000));
    close(fd);
    close(fd2);
    srv_buf_free(&got);
    CHECK(tu_healthy(t->port));
}

typedef struct qf_arg {
    int port, status;
} qf_arg;

static void *qf_main(void *a) {
    qf_arg *q = a;
    tu_resp r = tu_request(q->port, "POST", "/v1/completions", KEY_HDR,
                           "{\"prompt\":\"Once upon a time\",\"max_tokens\":300,"
                           "\"ignore_eos\":true}");
    q->status = r.status;
    tu_free(&r);
    return NULL;
}

static void test_queue_full(void) {
    kiln_server_params sp = {.api_key = "sk-test"};
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    ep.max_seqs = 1;
    ep.max_queue = 1;
    tsrv t;
    tsrv_start(&t, g_model, &sp, &ep);
    enum { N = 6 };
    pthread_t th[N];
    qf_arg a[N];
    for (int i = 0; i < N; i++) {
        a[i] = (qf_arg){.port = t.port};
        REQUIRE(pthread_create(&th[i], NULL, qf_main, &a[i]) == 0);
    }
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ok += a[i].status == 200;
        busy += a[i].status == 503;
    }
    CHECKF(ok >= 1 && busy >= 1 && ok + busy == N, "%d ok, %d busy of %d", ok, busy, N);
    /* Idle again: served. */
    tu_resp r = tu_request(t.port, "POST", "/v1/completions", KEY_HDR,
                           "{\"prompt\":\"a\",\"max_tokens\":1}");
    CHECK(r.status == 200);
    tu_free(&r);
    tsrv_stop(&t);
}

typedef struct sd_arg {
    tsrv *t;
    srv_buf got;
    bool eof;
} sd_arg;

static void *sd_reader(void *a) {
    sd_arg *s = a;
    int fd = start_stream(s->t->port, true, ",\"stream_options\":{\"include_usage\":true}");
    tu_read(fd, &s->got, "\"text\"", 10000);
    s->eof = tu_read(fd, &s->got, "\r\n0\r\n\r\n", 20000); /* the last chunk */
    close(fd);
    return NULL;
}

static void test_shutdown(void) {
    kiln_server_params sp = {.api_key = "sk-test"};
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    ep.n_ctx = 4096; /* a long generation */
    tsrv t;
    tsrv_start(&t, g_model, &sp, &ep);
    int port = t.port;
    sd_arg a = {.t = &t};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, sd_reader, &a) == 0);
    double t0 = tu_now_ms();
    while (kiln_server_in_flight(t.srv) == 0 && tu_now_ms() - t0 < 5000) tu_sleep_ms(1);
    CHECK(kiln_server_in_flight(t.srv) == 1);
    kiln_server_shutdown(t.srv, 0); /* no grace: cancel what runs */
    pthread_join(th, NULL);
    CHECK(a.eof);
    /* The stream ended properly: a finish chunk ("abort"), the usage chunk, then [DONE]. */
    CHECKF(a.got.p && strstr(a.got.p, "\"finish_reason\":\"abort\""), "no finish chunk: %.200s",
           a.got.p ? a.got.p + (a.got.len > 200 ? a.got.len - 200 : 0) : "");
    CHECK(a.got.p && strstr(a.got.p, "\"usage\":{"));
    CHECK(a.got.p && strstr(a.got.p, "data: [DONE]\n\n\r\n0\r\n\r\n"));
    /* New connections are refused. */
    int fd = tu_connect(port);
    CHECKF(fd < 0, "a connection was accepted after shutdown");
    if (fd >= 0) close(fd);
    CHECK(kiln_server_in_flight(t.srv) == 0);
    CHECK(tu_wait_idle(t.e, 3000));
    srv_buf_free(&a.got);
    tsrv_stop(&t);
}

/* GET / is the chat page (chat_page.h): no key needed, HTML with its CSP, the embedded bytes
 * whole, nothing linked from elsewhere. Its hashes and behaviour are checked in a browser by
 * tests/server/e2e/page.test.mjs. */
static void test_chat_page(tsrv *t) {
    size_t len = 0;
    const char *page = srv_chat_page(&len);
    CHECK(len > 1000 && strlen(page) == len);
    tu_resp r = tu_request(t->port, "GET", "/", "", NULL);
    CHECKF(r.status == 200, "GET /: %d", r.status);
    CHECKF(strcasestr(r.headers, "Content-Type: text/html; charset=utf-8\r\n") != NULL, "%s",
           r.headers);
    char csp[600];
    snprintf(csp, sizeof csp, "Content-Security-Policy: %s\r\n", srv_chat_page_csp());
    CHECKF(strstr(r.headers, csp) != NULL, "%s", r.headers);
    CHECK(strstr(srv_chat_page_csp(), "default-src 'none'; script-src 'sha256-") ==
          srv_chat_page_csp());
    CHECK(strstr(srv_chat_page_csp(), "style-src 'sha256-") != NULL);
    CHECK(strcasestr(r.headers, "X-Content-Type-Options: nosniff\r\n") != NULL);
    CHECKF(r.body.len == len && r.body.p && !memcmp(r.body.p, page, len),
           "body %zu of %zu bytes", r.body.len, len);
    CHECK(!strncmp(page, "<!DOCTYPE html>", 15));
    CHECK(!strstr(page, "http://") && !strstr(page, "https://") && !strstr(page, " src="));
    tu_free(&r);
    r = tu_request(t->port, "POST", "/", KEY_HDR, "{}");
    CHECKF(r.status == 405, "POST /: %d", r.status);
    tu_free(&r);
    r = tu_request(t->port, "GET", "/index.html", "", NULL);
    CHECKF(r.status == 404, "GET /index.html: %d", r.status);
    tu_free(&r);
}

int main(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(path);
    kiln_test_require_file(kiln_test_shared("golden/llama2c-greedy.json"));
    kiln_error err = {0};
    REQUIRE(kiln_model_load(path, NULL, &g_model, &err) == KILN_OK);

    test_loading_then_ready();

    kiln_server_params sp = {
        .api_key = "sk-test", .model_name = "stories, tiny-alias", .max_body = 4096,
        .timeout_s = 1};
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    tsrv t;
    tsrv_start(&t, g_model, &sp, &ep);
    test_routes(&t);
    test_chat_page(&t);
    test_stop_usage(&t);
    test_choices(&t);
    test_echo_logprobs(&t);
    test_errors(&t);
    test_disconnects(&t);
    test_half_request(&t);
    CHECK(tu_wait_idle(t.e, 3000));
    tsrv_stop(&t);

    test_no_tokenizer();
    test_prefix_cache(false);
    test_prefix_cache(true);
    test_queue_full();
    test_shutdown();
    kiln_model_free(g_model);
    return kiln_test_finish("test_server_http");
}
