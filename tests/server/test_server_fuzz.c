/*
 * test_server_fuzz.c - raw socket abuse of the in-process server, bounded in count and time:
 * garbage bytes, truncated and mutated HTTP, malformed framing (bad Content-Length, bad
 * chunks), huge and numerous headers, slow senders, silent half requests, the connection
 * cap, pipelining, and randomised JSON bodies on the generation routes (near-valid Anthropic
 * Messages and Responses bodies too). After each group
 * the server must still answer the next request; at the end no sequence runs and no KV
 * block is in use. A response, when one comes, must be well-formed HTTP and never a 500.
 */
#include "server_test_util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static uint32_t rnd(uint32_t n) {
    return n ? (uint32_t)(next_u64() % n) : 0;
}

static int g_port;
static int g_responses, g_silent, g_sent;

/* Send raw bytes, optionally close the write side, read what comes (bounded), check it. */
static void exchange(const void *data, size_t n, int read_ms) {
    int fd = tu_connect(g_port);
    REQUIRE(fd >= 0);
    g_sent++;
    tu_send(fd, data, n);
    /* Every other client also half-closes: the server sees the end of its input at once. */
    if (g_sent % 2) shutdown(fd, SHUT_WR);
    srv_buf got = {0};
    tu_read(fd, &got, NULL, read_ms);
    close(fd);
    if (got.len > 0) {
        g_responses++;
        int status = 0;
        CHECKF(sscanf(got.p, "HTTP/1.%*d %d", &status) == 1, "not an HTTP response: %.60s", got.p);
        CHECKF(status != 500, "500 for input of %zu bytes: %.300s", n, got.p);
    } else {
        g_silent++;
    }
    srv_buf_free(&got);
}

static const char *valid_requests[] = {
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
    "application/json\r\nContent-Length: 58\r\n\r\n"
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"stream\":true}",
    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 69\r\n"
    "\r\n{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,\"seed\":5}",
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 18\r\n\r\n"
    "{\"prompt\":\"a cat\"}",
};
#define N_VALID (sizeof valid_requests / sizeof valid_requests[0])

static void check_alive(const char *after) {
    CHECKF(tu_healthy(g_port), "server not healthy after %s", after);
}

static void fuzz_garbage(int iters) {
    char buf[2048];
    for (int i = 0; i < iters; i++) {
        size_t n = 1 + rnd(sizeof buf - 1);
        for (size_t k = 0; k < n; k++) buf[k] = (char)next_u64();
        if (i % 3 == 0) memcpy(buf, "GET ", n < 4 ? n : 4); /* past the method check */
        exchange(buf, n, 300);
    }
    check_alive("garbage");
}

static void fuzz_truncated(int iters) {
    for (int i = 0; i < iters; i++) {
        const char *r = valid_requests[rnd(N_VALID)];
        size_t n = rnd((uint32_t)strlen(r));
        exchange(r, n, 100); /* the client goes away after 100 ms */
    }
    check_alive("truncated requests");
}

static void fuzz_mutated(int iters) {
    char buf[1024];
    for (int i = 0; i < iters; i++) {
        const char *r = valid_requests[rnd(N_VALID)];
        size_t n = strlen(r);
        memcpy(buf, r, n);
        int flips = 1 + (int)rnd(4);
        for (int f = 0; f < flips; f++) {
            size_t at = rnd((uint32_t)n);
            switch (rnd(3)) {
            case 0:
                buf[at] = (char)next_u64();
                break;
            case 1:
                buf[at] = "{}[]\":,\r\n 0-9aZ\\"[rnd(17)];
                break;
            default:
                buf[at] = (char)(buf[at] ^ (1 << rnd(8)));
                break;
            }
        }
        exchange(buf, n, 1000);
    }
    check_alive("mutated requests");
}

static void fuzz_framing(void) {
    static const char *cases[] = {
        "GET / HTTP/9.9\r\nHost: x\r\n\r\n",
        "BREW /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n", /* no Host */
        "GET  HTTP/1.1\r\n\r\n",
        "\r\n\r\n\r\n\r\n",
        "GET /health\r\n\r\n", /* HTTP/0.9 */
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
        "99999999999999999999999\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n"
        "\r\n{}",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        "Content-Length: 4\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "zz\r\n{}\r\n0\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "FFFFFFFFFFFFFFFFFF\r\n{}\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nxx",
        "GET /v1/models?x=%zz%00&&== HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /%00/../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\r\n Folded: header\r\nConnection: close\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\r\nNoColon\r\nConnection: close\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n"
        "\r\n\0\0\0\0\0",
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 4"
        "\r\n\r\n\xff\xfe\"]",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        exchange(cases[i], strlen(cases[i]) + (i == 18 ? 5 : 0), 1500);
    check_alive("malformed framing");
}

static void fuzz_big_headers(void) {
    /* One 200 KB header, then 3000 small ones: answered with an error or closed. */
    srv_buf b = {0};
    srv_buf_adds(&b, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    for (int i = 0; i < 200 * 1024; i++) srv_buf_add(&b, "a", 1);
    srv_buf_adds(&b, "\r\nConnection: close\r\n\r\n");
    exchange(b.p, b.len, 3000);
    srv_buf_reset(&b);
    srv_buf_adds(&b, "GET /health HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 3000; i++) srv_buf_addf(&b, "X-H%d: %d\r\n", i, i);
    srv_buf_adds(&b, "Connection: close\r\n\r\n");
    exchange(b.p, b.len, 3000);
    /* A huge URL. */
    srv_buf_reset(&b);
    srv_buf_adds(&b, "GET /");
    for (int i = 0; i < 100 * 1024; i++) srv_buf_add(&b, "u", 1);
    srv_buf_adds(&b, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    exchange(b.p, b.len, 3000);
    srv_buf_free(&b);
    check_alive("huge headers");
}

static void fuzz_slow(void) {
    /* A slow but steady sender is served. */
    const char *r = valid_requests[0];
    int fd = tu_connect(g_port);
    REQUIRE(fd >= 0);
    for (size_t i = 0; r[i]; i++) {
        tu_send(fd, r + i, 1);
        tu_sleep_ms(2);
    }
    srv_buf got = {0};
    tu_read(fd, &got, NULL, 10000);
    int status = 0;
    CHECKF(got.p && sscanf(got.p, "HTTP/1.1 %d", &status) == 1 && status == 200,
           "slow sender: %.80s", got.p ? got.p : "(nothing)");
    CHECK(got.p && strstr(got.p, "data: [DONE]"));
    close(fd);
    srv_buf_free(&got);
    /* Several slow senders that stop halfway: all closed by the 1 s timeout, in parallel. */
    int fds[6];
    for (int i = 0; i < 6; i++) {
        fds[i] = tu_connect(g_port);
        REQUIRE(fds[i] >= 0);
        tu_send(fds[i], r, 20 + (size_t)i * 15);
    }
    check_alive("slow senders (while they wait)");
    double t0 = tu_now_ms();
    for (int i = 0; i < 6; i++) {
        srv_buf_reset(&got);
        CHECKF(tu_read(fds[i], &got, NULL, 8000), "stalled sender %d not closed after %.0f ms", i,
               tu_now_ms() - t0);
        close(fds[i]);
    }
    srv_buf_free(&got);
    check_alive("stalled senders");
}

static void fuzz_connection_cap(int cap) {
    int fds[64];
    /* Let connections of earlier groups end (the timeout is 1 s) so that they do not count. */
    tu_sleep_ms(1500);
    for (int i = 0; i < cap; i++) {
        fds[i] = tu_connect(g_port);
        REQUIRE(fds[i] >= 0);
        tu_send(fds[i], "GET /hea", 8);
    }
    tu_sleep_ms(50);
    for (int i = 0; i < cap; i++) {
        struct pollfd p = {.fd = fds[i], .events = POLLIN};
        CHECKF(poll(&p, 1, 0) == 0, "connection %d of %d was closed under the cap", i, cap);
    }
    /* Over the cap: the connection is closed without a response. */
    int fd = tu_connect(g_port);
    if (fd >= 0) {
        const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        tu_send(fd, req, strlen(req));
        srv_buf got = {0};
        CHECK(tu_read(fd, &got, NULL, 3000));
        CHECKF(got.len == 0, "served over the connection cap: %.40s", got.p);
        srv_buf_free(&got);
        close(fd);
    }
    for (int i = 0; i < cap; i++) close(fds[i]);
    double t0 = tu_now_ms();
    while (!tu_healthy(g_port) && tu_now_ms() - t0 < 5000) tu_sleep_ms(20);
    check_alive("the connection cap");
}

static void fuzz_pipelined(void) {
    int fd = tu_connect(g_port);
    REQUIRE(fd >= 0);
    const char *two = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    tu_send(fd, two, strlen(two));
    srv_buf got = {0};
    CHECK(tu_read(fd, &got, NULL, 5000));
    int n = 0;
    for (const char *p = got.p; p && (p = strstr(p, "HTTP/1.1 200")); p++) n++;
    CHECKF(n == 2, "%d responses to 2 pipelined requests", n);
    close(fd);
    srv_buf_free(&got);
}

/* A JSON value of a random type; cases 9-14 are near-valid objects of the speculation and
 * fill fields (issue 18), so their parsers see both shapes and garbage inside a shape. */
static void rand_value(srv_buf *b) {
    static const char *const spec_objs[] = {
        "{\"type\":\"content\",\"content\":\"Once upon a time\"}",
        "{\"type\":\"content\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\"}]}",
        "{\"content\":\" there\",\"policy\":\"verify\"}",
        "{\"content\":7,\"policy\":\"assert\"}",
        "{\"source\":\"ngram\",\"k\":33,\"accept\":\"rejection\"}",
        "{\"source\":\"random\",\"k\":2}",
    };
    unsigned c = rnd(15);
    if (c >= 9) {
        srv_buf_adds(b, spec_objs[c - 9]);
        return;
    }
    switch (c) {
    case 0:
        srv_buf_adds(b, "null");
        break;
    case 1:
        srv_buf_adds(b, rnd(2) ? "true" : "false");
        break;
    case 2:
        srv_buf_addf(b, "%d", (int)rnd(2000) - 1000);
        break;
    case 3:
        srv_buf_addf(b, "%g", (double)((int)rnd(2000) - 1000) / 397.0);
        break;
    case 4:
        srv_buf_adds(b, "\"Once\"");
        break;
    case 5:
        srv_buf_adds(b, "[1,2,\"x\"]");
        break;
    case 6:
        srv_buf_adds(b, "{\"a\":1}");
        break;
    case 7:
        srv_buf_adds(b, "[]");
        break;
    default:
        srv_buf_adds(b, "\"\\u00e9\\ud83d\\ude00\"");
        break;
    }
}

static void fuzz_json(int iters) {
    static const char *fields[] = {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "xtc_probability",
        "xtc_threshold",
        "seed",
        "stop",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "n",
        "stream",
        "stream_options",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "max_completion_tokens",
        "ignore_eos",
        "stop_token_ids",
        "tools",
        "chat_template_kwargs",
        "add_generation_prompt",
        "prediction",
        "fill",
        "speculation",
        "echo",  /* issue 20: echo, model (404 when unknown), n (values 1..16 accepted) */
        "model",
        "n",
    };
    int ok = 0, bad = 0;
    for (int i = 0; i < iters; i++) {
        bool chat = rnd(2);
        srv_buf b = {0};
        srv_buf_adds(&b, chat ? "{\"messages\":" : "{\"prompt\":");
        if (rnd(4) == 0)
            rand_value(&b);
        else if (chat)
            srv_buf_adds(&b, rnd(2)
                                 ? "[{\"role\":\"user\",\"content\":\"Hi\"}]"
                                 : "[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                                   "\"text\":\"x\"}]},{\"role\":\"assistant\",\"content\":null}]");
        else
            srv_buf_adds(&b, rnd(3) == 0   ? "[\"Once\", [1, 403], \"upon\"]" /* a batch */
                             : rnd(2) ? "\"Once upon\""
                                      : "[1, 403, 407]");
        if (rnd(3) == 0) srv_buf_addf(&b, ",\"n\":%u", 1 + rnd(3));
        int nf = (int)rnd(5);
        for (int f = 0; f < nf; f++) {
            srv_buf_addf(&b, ",\"%s\":", fields[rnd(sizeof fields / sizeof fields[0])]);
            rand_value(&b);
        }
        srv_buf_adds(&b, ",\"max_tokens\":3}"); /* keep generations short (last key wins) */
        char hdr[256];
        snprintf(hdr, sizeof hdr, "Content-Length: %zu\r\n", b.len);
        tu_resp r = tu_request(g_port, "POST", chat ? "/v1/chat/completions" : "/v1/completions",
                               NULL, b.p);
        CHECKF(r.status == 200 || r.status == 400 ||
                   (r.status == 404 && strstr(r.body.p ? r.body.p : "", "model_not_found")),
               "status %d for %s: %s", r.status, b.p, r.body.p);
        if (r.status == 200) {
            ok++;
            if (!strstr(r.headers, "event-stream")) {
                json_t *j = tu_json(&r);
                CHECKF(json_is_object(j), "200 without a JSON body for %s", b.p);
                json_decref(j);
            } else {
                CHECK(r.body.p && strstr(r.body.p, "data: [DONE]"));
            }
        } else if (r.status == 400) {
            bad++;
            json_t *j = tu_json(&r);
            CHECKF(json_is_string(json_object_get(json_object_get(j, "error"), "message")),
                   "400 without an OpenAI error for %s", b.p);
            json_decref(j);
        }
        tu_free(&r);
        srv_buf_free(&b);
    }
    printf("json fuzz: %d accepted, %d rejected\n", ok, bad);
    CHECK(ok > 0 && bad > 0);
    check_alive("json fuzz");
}

/* Near-valid bodies for /v1/messages (Anthropic) and /v1/responses: a valid request with
 * fields replaced by random values, content blocks and input items of every kind (and broken
 * ones), tools and tool choices. Every answer is 200 (whole or a stream of named events), 400
 * or 404 (an unknown previous_response_id or item_reference), in the route's error shape. */
static void rand_block(srv_buf *b, bool anthropic) {
    static const char *const anth[] = {
        "{\"type\":\"text\",\"text\":\"Hi\"}",
        "{\"type\":\"text\"}",
        "{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"data\":\"AA\"}}",
        "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{\"a\":1}}",
        "{\"type\":\"tool_use\",\"id\":5,\"name\":\"f\",\"input\":[]}",
        "{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"ok\"}",
        "{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"text\","
        "\"text\":\"ok\"},{\"type\":\"image\"}]}",
        "{\"type\":\"thinking\",\"thinking\":\"hmm\"}",
        "{\"type\":\"document\"}",
        "{\"type\":7}",
        "\"text\"",
    };
    static const char *const resp[] = {
        "{\"role\":\"user\",\"content\":\"Hi\"}",
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
        "\"text\":\"Once\"}]}",
        "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":"
        "\"input_image\",\"image_url\":\"x\"}]}",
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"}",
        "{\"type\":\"function_call\",\"call_id\":1}",
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"ok\"}",
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":[{\"type\":"
        "\"input_text\",\"text\":\"ok\"}]}",
        "{\"type\":\"item_reference\",\"id\":\"msg_nope\"}",
        "{\"type\":\"reasoning\",\"summary\":[]}",
        "{\"role\":\"robot\",\"content\":\"x\"}",
        "{\"type\":\"web_search_call\"}",
        "[]",
    };
    if (anthropic)
        srv_buf_adds(b, anth[rnd(sizeof anth / sizeof anth[0])]);
    else
        srv_buf_adds(b, resp[rnd(sizeof resp / sizeof resp[0])]);
}

static void fuzz_msgapi(int iters) {
    static const char *const anth_fields[] = {
        "model", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k",
        "stream", "metadata", "tools", "tool_choice", "thinking", "seed", "fill", "speculation"};
    static const char *const resp_fields[] = {
        "model", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "store",
        "previous_response_id", "tools", "tool_choice", "parallel_tool_calls", "text",
        "metadata", "truncation", "background", "top_logprobs", "seed", "stop"};
    static const char *const extras[] = {
        "[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]",
        "[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}]",
        "[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]",
        "{\"type\":\"any\"}",
        "{\"type\":\"tool\",\"name\":\"f\"}",
        "{\"type\":\"function\",\"name\":\"f\"}",
        "\"required\"",
        "{\"format\":{\"type\":\"json_schema\",\"name\":\"x\",\"schema\":{\"type\":\"object\"}}}",
        "{\"type\":\"enabled\",\"budget_tokens\":10}",
        "[{\"type\":\"text\",\"text\":\"sys\"}]",
        "[\"\\n\\n\",\"zz\"]",
        "\"resp_0123\"",
    };
    int ok = 0, bad = 0;
    for (int i = 0; i < iters; i++) {
        bool anthropic = rnd(2);
        srv_buf b = {0};
        if (anthropic) {
            srv_buf_adds(&b, "{\"model\":\"m\",\"messages\":");
            if (rnd(5) == 0) {
                rand_value(&b);
            } else {
                srv_buf_adds(&b, "[{\"role\":\"user\",\"content\":");
                if (rnd(3) == 0) {
                    srv_buf_adds(&b, "\"Hi\"");
                } else {
                    srv_buf_adds(&b, "[");
                    int nb = 1 + (int)rnd(3);
                    for (int k = 0; k < nb; k++) {
                        if (k) srv_buf_adds(&b, ",");
                        rand_block(&b, true);
                    }
                    srv_buf_adds(&b, "]");
                }
                srv_buf_adds(&b, "}");
                if (rnd(2))
                    srv_buf_adds(&b, ",{\"role\":\"assistant\",\"content\":[{\"type\":\"text\","
                                     "\"text\":\"Once\"},{\"type\":\"tool_use\",\"id\":\"t1\","
                                     "\"name\":\"f\",\"input\":{}}]}");
                srv_buf_adds(&b, "]");
            }
        } else {
            srv_buf_adds(&b, "{\"input\":");
            if (rnd(5) == 0) {
                rand_value(&b);
            } else {
                srv_buf_adds(&b, "[");
                int nb = 1 + (int)rnd(4);
                for (int k = 0; k < nb; k++) {
                    if (k) srv_buf_adds(&b, ",");
                    rand_block(&b, false);
                }
                srv_buf_adds(&b, "]");
            }
        }
        int nf = (int)rnd(5);
        for (int f = 0; f < nf; f++) {
            const char *name = anthropic ? anth_fields[rnd(sizeof anth_fields / sizeof anth_fields[0])]
                                         : resp_fields[rnd(sizeof resp_fields / sizeof resp_fields[0])];
            srv_buf_addf(&b, ",\"%s\":", name);
            if (rnd(2))
                srv_buf_adds(&b, extras[rnd(sizeof extras / sizeof extras[0])]);
            else
                rand_value(&b);
        }
        /* keep generations short (the last key wins) */
        srv_buf_adds(&b, anthropic ? ",\"max_tokens\":3}" : ",\"max_output_tokens\":3}");
        const char *path = anthropic ? "/v1/messages" : "/v1/responses";
        tu_resp r = tu_request(g_port, "POST", path, NULL, b.p);
        CHECKF(r.status == 200 || r.status == 400 || r.status == 404, "%s: status %d for %s: %s",
               path, r.status, b.p, r.body.p);
        if (r.status == 200) {
            ok++;
            if (strstr(r.headers, "event-stream")) {
                const char *p = r.body.p ? r.body.p : "";
                bool ended = anthropic ? strstr(p, "event: message_stop") != NULL
                                       : strstr(p, "event: response.completed") != NULL ||
                                             strstr(p, "event: response.incomplete") != NULL;
                CHECKF(ended, "%s: a stream without its last event for %s", path, b.p);
            } else {
                json_t *j = tu_json(&r);
                CHECKF(json_is_object(j), "%s: 200 without a JSON body for %s", path, b.p);
                json_decref(j);
            }
        } else if (r.status == 400 || r.status == 404) {
            bad++;
            json_t *j = tu_json(&r);
            json_t *e = json_object_get(j, "error");
            CHECKF(json_is_string(json_object_get(e, "message")), "%s: %d without an error for %s",
                   path, r.status, b.p);
            if (anthropic)
                CHECKF(json_is_string(json_object_get(j, "type")) &&
                           !strcmp(json_string_value(json_object_get(j, "type")), "error") &&
                           json_is_string(json_object_get(e, "type")),
                       "/v1/messages: not Anthropic's error shape: %s", r.body.p);
            json_decref(j);
        }
        tu_free(&r);
        srv_buf_free(&b);
    }
    printf("messages/responses fuzz: %d accepted, %d rejected\n", ok, bad);
    CHECK(ok > 0 && bad > 0);
    check_alive("messages/responses fuzz");
}

static void run_framing(int n) {
    (void)n;
    fuzz_framing();
}
static void run_big_headers(int n) {
    (void)n;
    fuzz_big_headers();
}
static void run_slow(int n) {
    (void)n;
    fuzz_slow();
}
static void run_pipelined(int n) {
    (void)n;
    fuzz_pipelined();
}

int main(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(path);
    kiln_model *m = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_model_load(path, NULL, &m, &err) == KILN_OK);
    const char *seed = getenv("KILN_FUZZ_SEED");
    if (seed) rng = strtoull(seed, NULL, 0) | 1;
    int scale = 1;
    kiln_server_params sp = {.max_body = 64 * 1024, .timeout_s = 1, .max_connections = 16};
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    tsrv t;
    tsrv_start(&t, m, &sp, &ep);
    g_port = t.port;
    double t0 = tu_now_ms();

    struct {
        const char *name;
        void (*fn)(int);
        int n;
    } groups[] = {
        {"garbage", fuzz_garbage, 50 * scale},       {"truncated", fuzz_truncated, 50 * scale},
        {"mutated", fuzz_mutated, 50 * scale},       {"framing", run_framing, 0},
        {"big headers", run_big_headers, 0},         {"slow senders", run_slow, 0},
        {"connection cap", fuzz_connection_cap, 16}, {"pipelining", run_pipelined, 0},
        {"json bodies", fuzz_json, 80 * scale},      {"msg/resp bodies", fuzz_msgapi, 120 * scale},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        double g0 = tu_now_ms();
        groups[i].fn(groups[i].n);
        printf("%-15s %6.1f s\n", groups[i].name, (tu_now_ms() - g0) / 1e3);
    }

    CHECKF(tu_wait_idle(t.e, 5000), "the engine is not idle after the fuzz run");
    CHECK(kiln_server_in_flight(t.srv) == 0);
    printf("raw fuzz: %d connections, %d answered, %d closed silently, %.1f s\n", g_sent,
           g_responses, g_silent, (tu_now_ms() - t0) / 1e3);
    tsrv_stop(&t);
    kiln_model_free(m);
    return kiln_test_finish("test_server_fuzz");
}
