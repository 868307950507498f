/*
 * test_server_spec.c - speculative decoding, client predictions and fill through the HTTP
 * server (issue 18), on stories260K, over raw sockets:
 *   - greedy chat and completions with `prediction` equal to the plain output's text give the
 *     same text, accepted_prediction_tokens > 0 and accepted + rejected = the prediction's
 *     token count (tokenized here through kiln_model_tokenize, without special tokens, as
 *     kiln_request.prediction says), whole and in the include_usage chunk;
 *   - `speculation` false, ngram, random (and draft, on a server whose draft model is the
 *     target itself, where every greedy draft agrees) give the plain text;
 *   - `fill` assert: the text begins with the fill's content; fill_tokens counts it;
 *   - chat assistant prefill: the reply continues the final assistant message: it equals a
 *     completion whose prompt is the conversation rendered here in ChatML (template.h's
 *     fallback, which stories260K uses) up to the generation prompt, plus the message;
 *   - engine refusals (a prediction longer than the context, a fill longer than max_tokens)
 *     are 400s carrying the engine's message; speculation.source "draft" without a draft
 *     model is a 400 naming speculation.source;
 *   - /metrics: the speculation counters, their HELP/TYPE lines and the acceptance ratio,
 *     increasing by what the responses report.
 * Expected texts come from the same server's plain requests (speculation must not change
 * the output) and from the engine's C API.
 */
#include <math.h>

#include "server_test_util.h"

static kiln_model *g_model;

/* POST a JSON body; the parsed response (NULL unless JSON), *status its HTTP status. */
static json_t *post(int port, const char *path, const char *body, int *status) {
    tu_resp r = tu_request(port, "POST", path, NULL, body);
    *status = r.status;
    json_t *j = tu_json(&r);
    if (r.status != 200 && r.status != 400)
        fprintf(stderr, "POST %s: %d %.300s\n", path, r.status, r.body.p ? r.body.p : "");
    tu_free(&r);
    return j;
}

/* The text of choice 0 (completions' text or chat's message content); "" when absent. */
static const char *text_of(json_t *j) {
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *t = json_object_get(c, "text");
    if (!t) t = json_object_get(json_object_get(c, "message"), "content");
    return json_is_string(t) ? json_string_value(t) : "";
}

/* usage.<obj>.<key> as an integer; -1 when missing. */
static long long usage_of(json_t *j, const char *obj, const char *key) {
    json_t *u = json_object_get(j, "usage");
    json_t *o = obj ? json_object_get(u, obj) : u;
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* A JSON string literal of s (malloc'd). */
static char *lit(const char *s) {
    json_t *j = json_string(s);
    REQUIRE(j);
    char *out = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    return out;
}

/* Tokens of text, tokenized as kiln_model_tokenize does (into a static buffer). */
static int32_t *tokens(const char *text, bool add_special, bool parse_special, int32_t *n) {
    static int32_t ids[8192];
    kiln_error err = {0};
    REQUIRE(kiln_model_tokenize(g_model, text, strlen(text), add_special, parse_special, ids, 8192,
                                n, &err) == KILN_OK);
    return ids;
}

/* Tokens of a text alone, without special tokens. */
static int32_t n_tokens(const char *text) {
    int32_t n = 0;
    tokens(text, false, false, &n);
    return n;
}

/* The tokens of `cont` as a continuation of a request's prompt: the joined text's tokens past
 * the prompt's own (a completion's prompt with BOS; a chat rendered in ChatML, control texts
 * parsed), -1 when the prompt's tokens are not a prefix of the joined text's. */
static int32_t n_continuation(bool chat, const char *prompt, const char *cont) {
    srv_buf a = {0}, b = {0};
    if (chat)
        srv_buf_addf(&a, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", prompt);
    else
        srv_buf_adds(&a, prompt);
    srv_buf_addf(&b, "%s%s", a.p, cont);
    int32_t na = 0, nb = 0;
    int32_t *ta = tokens(a.p, !chat, chat, &na);
    int32_t *head = malloc((size_t)na * sizeof *head);
    REQUIRE(head);
    memcpy(head, ta, (size_t)na * sizeof *head);
    int32_t *tb = tokens(b.p, !chat, chat, &nb);
    bool prefix = nb >= na && !memcmp(head, tb, (size_t)na * sizeof *head);
    free(head);
    srv_buf_free(&a);
    srv_buf_free(&b);
    return prefix ? nb - na : -1;
}

/* The value of an unlabelled sample `name` in a /metrics body; NAN when absent. */
static double metric(int port, const char *name) {
    tu_resp r = tu_request(port, "GET", "/metrics", NULL, NULL);
    double v = NAN;
    size_t n = strlen(name);
    for (const char *p = r.body.p; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') v = strtod(p + n + 1, NULL);
    tu_free(&r);
    return v;
}

/* The usage object of a streamed response's include_usage chunk, and its text (both owned by
 * the caller); NULL when absent. */
static json_t *stream_usage(int port, const char *path, const char *body, srv_buf *text) {
    tu_resp r = tu_request(port, "POST", path, NULL, body);
    CHECKF(r.status == 200, "stream %s: %d", path, r.status);
    json_t *usage = NULL;
    srv_buf_add(text, "", 0);
    for (char *p = r.body.p; p && *p;) {
        char *end = strstr(p, "\n\n");
        if (!end || strncmp(p, "data: ", 6)) break;
        *end = '\0';
        json_t *j = strcmp(p + 6, "[DONE]") ? json_loads(p + 6, 0, NULL) : NULL;
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        json_t *t = json_object_get(c, "text");
        if (!t) t = json_object_get(json_object_get(c, "delta"), "content");
        if (json_is_string(t)) srv_buf_adds(text, json_string_value(t));
        if (json_is_object(json_object_get(j, "usage"))) {
            json_decref(usage);
            usage = json_incref(j);
        }
        json_decref(j);
        p = end + 2;
    }
    tu_free(&r);
    return usage;
}

static const char *PROMPT = "Once upon a time, there was a little girl named Lily. She";

/* A completion or chat body: the prompt (or one user message), greedy, max_tokens, and
 * extra fields (",..." or ""). */
static char *body_of(bool chat, int max_tokens, const char *extra) {
    srv_buf b = {0};
    char *p = lit(PROMPT);
    if (chat)
        srv_buf_addf(&b, "{\"messages\":[{\"role\":\"user\",\"content\":%s}]", p);
    else
        srv_buf_addf(&b, "{\"prompt\":%s", p);
    srv_buf_addf(&b, ",\"max_tokens\":%d,\"temperature\":0%s}", max_tokens, extra);
    free(p);
    return b.p;
}

static const char *path_of(bool chat) {
    return chat ? "/v1/chat/completions" : "/v1/completions";
}

/* Greedy output with a prediction equal to the plain output: the same text, and OpenAI's
 * accounting: every prediction token is accepted or rejected, some are accepted. */
static void test_prediction(tsrv *t) {
    for (int chat = 0; chat < 2; chat++) {
        int st;
        char *b = body_of(chat, 40, "");
        json_t *plain = post(t->port, path_of(chat), b, &st);
        free(b);
        REQUIRE(st == 200);
        const char *want = text_of(plain);
        REQUIRE(strlen(want) > 20);
        CHECK(usage_of(plain, "completion_tokens_details", "accepted_prediction_tokens") == 0);
        CHECK(usage_of(plain, "completion_tokens_details", "rejected_prediction_tokens") == 0);
        CHECK(usage_of(plain, "speculation", "drafted_tokens") == 0);
        /* The prediction continues the prompt: its tokens are counted as such (as the output's
         * are), so a prediction equal to the output rejects nothing when the output's tokens
         * are its text's own tokenization (then as many as completion_tokens). */
        int32_t n_pred = n_continuation(chat, PROMPT, want);
        CHECKF(n_pred > 0, "the output does not continue the prompt's tokens");
        const bool canonical = n_pred == usage_of(plain, NULL, "completion_tokens");
        char *pl = lit(want);
        for (int parts = 0; parts < 2; parts++) {
            srv_buf x = {0};
            if (parts) {
                /* the same text as two text parts, split in the middle */
                size_t h = strlen(want) / 2;
                char *a = strndup(want, h);
                char *la = lit(a), *lb = lit(want + h);
                srv_buf_addf(&x,
                             ",\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":"
                             "\"text\",\"text\":%s},{\"type\":\"text\",\"text\":%s}]}",
                             la, lb);
                free(a);
                free(la);
                free(lb);
            } else {
                srv_buf_addf(&x, ",\"prediction\":{\"type\":\"content\",\"content\":%s}", pl);
            }
            b = body_of(chat, 40, x.p);
            json_t *j = post(t->port, path_of(chat), b, &st);
            CHECKF(st == 200, "prediction request: %d", st);
            CHECKF(!strcmp(text_of(j), want), "%s with prediction: '%s', want '%s'",
                   chat ? "chat" : "completion", text_of(j), want);
            long long acc = usage_of(j, "completion_tokens_details", "accepted_prediction_tokens");
            long long rej = usage_of(j, "completion_tokens_details", "rejected_prediction_tokens");
            CHECKF(acc > 0, "accepted_prediction_tokens %lld", acc);
            CHECKF(acc + rej == n_pred, "accepted %lld + rejected %lld != %d prediction tokens",
                   acc, rej, n_pred);
            if (canonical)
                CHECKF(rej == 0 && acc == n_pred,
                       "a prediction equal to the output: accepted %lld rejected %lld of %d", acc,
                       rej, n_pred);
            CHECKF(usage_of(j, "speculation", "drafted_tokens") > 0 &&
                       usage_of(j, "speculation", "accepted_tokens") > 0 &&
                       usage_of(j, "speculation", "verify_steps") > 0,
                   "usage.speculation of a matching prediction: drafted %lld accepted %lld "
                   "steps %lld",
                   usage_of(j, "speculation", "drafted_tokens"),
                   usage_of(j, "speculation", "accepted_tokens"),
                   usage_of(j, "speculation", "verify_steps"));
            CHECK(usage_of(j, NULL, "completion_tokens") ==
                  usage_of(plain, NULL, "completion_tokens"));
            json_decref(j);
            /* streamed, with include_usage: the same text and counts */
            srv_buf_adds(&x, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
            free(b);
            b = body_of(chat, 40, x.p);
            srv_buf text = {0};
            json_t *su = stream_usage(t->port, path_of(chat), b, &text);
            CHECKF(text.p && !strcmp(text.p, want), "streamed with prediction: '%s'", text.p);
            CHECK(su &&
                  usage_of(su, "completion_tokens_details", "accepted_prediction_tokens") +
                          usage_of(su, "completion_tokens_details", "rejected_prediction_tokens") ==
                      n_pred);
            CHECK(su &&
                  usage_of(su, "completion_tokens_details", "accepted_prediction_tokens") > 0);
            json_decref(su);
            srv_buf_free(&text);
            srv_buf_free(&x);
            free(b);
        }
        /* An empty prediction counts nothing; a longer one (the output, then more) keeps the
         * text and rejects at least what the output never reached. */
        srv_buf longer = {0};
        srv_buf_addf(&longer, "%s The end. They all lived happily.", want);
        int32_t n_long = n_continuation(chat, PROMPT, longer.p);
        char *ll = lit(longer.p);
        const char *contents[] = {"\"\"", ll};
        for (int k = 0; k < 2; k++) {
            srv_buf x = {0};
            srv_buf_addf(&x, ",\"prediction\":{\"type\":\"content\",\"content\":%s}", contents[k]);
            b = body_of(chat, 40, x.p);
            json_t *j = post(t->port, path_of(chat), b, &st);
            CHECKF(st == 200 && !strcmp(text_of(j), want), "%s prediction: '%s'",
                   k ? "a longer" : "an empty", text_of(j));
            long long acc = usage_of(j, "completion_tokens_details", "accepted_prediction_tokens");
            long long rej = usage_of(j, "completion_tokens_details", "rejected_prediction_tokens");
            if (k == 0)
                CHECKF(acc == 0 && rej == 0, "empty prediction: accepted %lld rejected %lld", acc,
                       rej);
            else
                CHECKF(acc > 0 && acc + rej == n_long && rej >= n_long - n_pred,
                       "longer prediction (%d tokens, the output's %d): accepted %lld rejected "
                       "%lld",
                       n_long, n_pred, acc, rej);
            json_decref(j);
            free(b);
            srv_buf_free(&x);
        }
        free(ll);
        srv_buf_free(&longer);
        free(pl);
        json_decref(plain);
    }
    CHECK(tu_wait_idle(t->e, 3000));
}

/* speculation false / ngram / random give the plain text (exact speculation); ngram over a
 * repetitive prompt drafts. */
static void test_speculation(tsrv *t) {
    for (int chat = 0; chat < 2; chat++) {
        int st;
        char *b = body_of(chat, 48, "");
        json_t *plain = post(t->port, path_of(chat), b, &st);
        free(b);
        REQUIRE(st == 200);
        const char *want = text_of(plain);
        const char *variants[] = {
            ",\"speculation\":false",
            ",\"speculation\":true",
            ",\"speculation\":{\"source\":\"off\"}",
            ",\"speculation\":{\"source\":\"ngram\"}",
            ",\"speculation\":{\"source\":\"ngram\",\"k\":3}",
            ",\"speculation\":{\"source\":\"ngram\",\"k\":32,\"accept\":\"exact\"}",
            ",\"speculation\":{\"source\":\"random\",\"k\":4}",
        };
        for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
            b = body_of(chat, 48, variants[i]);
            json_t *j = post(t->port, path_of(chat), b, &st);
            CHECKF(st == 200, "%s: %d", variants[i], st);
            CHECKF(!strcmp(text_of(j), want), "%s %s: '%s', want '%s'",
                   chat ? "chat" : "completion", variants[i], text_of(j), want);
            long long drafted = usage_of(j, "speculation", "drafted_tokens");
            if (i < 3) CHECKF(drafted == 0, "%s drafted %lld", variants[i], drafted);
            if (i >= 3) CHECKF(drafted > 0, "%s drafted nothing", variants[i]);
            CHECK(usage_of(j, "speculation", "accepted_tokens") <= drafted);
            CHECK(usage_of(j, NULL, "completion_tokens") ==
                  usage_of(plain, NULL, "completion_tokens"));
            json_decref(j);
            free(b);
        }
        json_decref(plain);
    }
    /* "draft" on a server without a draft model. */
    int st;
    char *b = body_of(false, 8, ",\"speculation\":{\"source\":\"draft\"}");
    json_t *j = post(t->port, "/v1/completions", b, &st);
    CHECKF(st == 400, "draft without a draft model: %d", st);
    CHECKF(!strcmp(tu_err_field(j, "param"), "speculation.source") &&
               strstr(tu_err_field(j, "message"), "--draft-model"),
           "draft without a draft model: param '%s', message '%s'", tu_err_field(j, "param"),
           tu_err_field(j, "message"));
    json_decref(j);
    free(b);
    CHECK(tu_wait_idle(t->e, 3000));
}

/* fill (assert): the text begins with the fill; fill_tokens and completion_tokens count it.
 * verify: the output is the plain one. */
static void test_fill(tsrv *t) {
    for (int chat = 0; chat < 2; chat++) {
        int st;
        const char *fill = " liked to play with her red ball";
        char *fl = lit(fill);
        srv_buf x = {0};
        srv_buf_addf(&x, ",\"fill\":{\"content\":%s}", fl);
        char *b = body_of(chat, 30, x.p);
        json_t *j = post(t->port, path_of(chat), b, &st);
        CHECKF(st == 200, "fill: %d", st);
        CHECKF(!strncmp(text_of(j), fill, strlen(fill)), "%s fill: '%s' does not begin with '%s'",
               chat ? "chat" : "completion", text_of(j), fill);
        CHECKF(strlen(text_of(j)) > strlen(fill), "nothing after the fill: '%s'", text_of(j));
        long long nf = usage_of(j, "speculation", "fill_tokens");
        CHECKF(nf > 0 && nf <= n_tokens(fill) + 1, "fill_tokens %lld for %d tokens", nf,
               n_tokens(fill));
        CHECK(usage_of(j, NULL, "completion_tokens") >= nf);
        json_decref(j);
        free(b);
        /* streamed: the same text */
        srv_buf_adds(&x, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
        b = body_of(chat, 30, x.p);
        srv_buf text = {0};
        json_t *su = stream_usage(t->port, path_of(chat), b, &text);
        CHECKF(text.p && !strncmp(text.p, fill, strlen(fill)), "streamed fill: '%s'", text.p);
        CHECK(su && usage_of(su, "speculation", "fill_tokens") == nf);
        json_decref(su);
        srv_buf_free(&text);
        free(b);
        srv_buf_free(&x);
        /* no max_tokens on a completion: 16 generated tokens after the fill's own */
        if (!chat) {
            srv_buf_reset(&x);
            srv_buf_addf(&x,
                         "{\"prompt\":\"Once upon a time\",\"temperature\":0,"
                         "\"ignore_eos\":true,\"fill\":{\"content\":%s}}",
                         fl);
            j = post(t->port, "/v1/completions", x.p, &st);
            long long ct = usage_of(j, NULL, "completion_tokens"),
                      ft = usage_of(j, "speculation", "fill_tokens");
            CHECKF(st == 200 && ft > 0 && ct == ft + 16,
                   "default max_tokens after a fill: status %d, %lld completion tokens, %lld "
                   "fill tokens",
                   st, ct, ft);
            json_decref(j);
            srv_buf_reset(&x);
        }
        /* policy verify: the plain output, whatever the fill says */
        b = body_of(chat, 30, "");
        json_t *plain = post(t->port, path_of(chat), b, &st);
        free(b);
        srv_buf_addf(&x, ",\"fill\":{\"content\":%s,\"policy\":\"verify\"}", fl);
        b = body_of(chat, 30, x.p);
        j = post(t->port, path_of(chat), b, &st);
        CHECKF(st == 200 && !strcmp(text_of(j), text_of(plain)), "verify fill: '%s', want '%s'",
               text_of(j), text_of(plain));
        CHECK(usage_of(j, "speculation", "fill_tokens") == 0);
        json_decref(j);
        json_decref(plain);
        free(b);
        srv_buf_free(&x);
        free(fl);
    }
    CHECK(tu_wait_idle(t->e, 3000));
}

/* Chat assistant prefill: the reply continues the final assistant message. The reference is
 * a completion of the conversation rendered in ChatML (the fallback template stories260K
 * gets: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
 * "<|im_start|>assistant\n") followed by the assistant's text. */
static void test_prefill(tsrv *t) {
    const char *user = "Tell me a story.";
    const char *starts[] = {"Once upon a time, there was a big", "One day, Tim"};
    for (size_t i = 0; i < 2; i++) {
        char *lu = lit(user), *la = lit(starts[i]);
        srv_buf b = {0};
        srv_buf_addf(&b,
                     "{\"messages\":[{\"role\":\"user\",\"content\":%s},{\"role\":\"assistant\","
                     "\"content\":%s}],\"max_tokens\":24,\"temperature\":0}",
                     lu, la);
        int st;
        json_t *reply = post(t->port, "/v1/chat/completions", b.p, &st);
        CHECKF(st == 200, "prefill chat: %d", st);
        srv_buf p = {0};
        srv_buf_addf(&p, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n%s", user,
                     starts[i]);
        char *lp = lit(p.p);
        srv_buf cb = {0};
        srv_buf_addf(&cb, "{\"prompt\":%s,\"max_tokens\":24,\"temperature\":0}", lp);
        json_t *ref = post(t->port, "/v1/completions", cb.p, &st);
        REQUIRE(st == 200);
        CHECKF(strlen(text_of(ref)) > 0, "empty reference completion");
        CHECKF(!strcmp(text_of(reply), text_of(ref)),
               "prefill '%s': reply '%s', want the completion's '%s'", starts[i], text_of(reply),
               text_of(ref));
        /* the hidden fill counts as prompt tokens, not as completion tokens */
        CHECKF(usage_of(reply, NULL, "prompt_tokens") == usage_of(ref, NULL, "prompt_tokens"),
               "prefill prompt_tokens %lld, the completion's %lld",
               usage_of(reply, NULL, "prompt_tokens"), usage_of(ref, NULL, "prompt_tokens"));
        CHECK(usage_of(reply, NULL, "completion_tokens") ==
              usage_of(ref, NULL, "completion_tokens"));
        /* streamed: the same continuation, without the message itself */
        b.len = b.len - 1; /* drop the closing brace */
        srv_buf_adds(&b, ",\"stream\":true}");
        srv_buf text = {0};
        json_t *su = stream_usage(t->port, "/v1/chat/completions", b.p, &text);
        CHECKF(text.p && !strcmp(text.p, text_of(ref)), "streamed prefill: '%s'", text.p);
        json_decref(su);
        srv_buf_free(&text);
        json_decref(reply);
        json_decref(ref);
        srv_buf_free(&b);
        srv_buf_free(&p);
        srv_buf_free(&cb);
        free(lu);
        free(la);
        free(lp);
    }
    /* /tokenize of a prefill conversation: the rendered prompt and the message together, as
     * the model sees them: the completion's prompt tokens */
    char *lu = lit(user), *la = lit(starts[0]);
    srv_buf b = {0};
    srv_buf_addf(&b,
                 "{\"messages\":[{\"role\":\"user\",\"content\":%s},{\"role\":\"assistant\","
                 "\"content\":%s}]}",
                 lu, la);
    int st;
    json_t *tok = post(t->port, "/tokenize", b.p, &st);
    srv_buf_free(&b);
    srv_buf_addf(&b, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n%s", user, starts[0]);
    char *lp = lit(b.p);
    srv_buf_reset(&b);
    srv_buf_addf(&b, "{\"prompt\":%s}", lp);
    json_t *ref = post(t->port, "/tokenize", b.p, &st);
    CHECKF(json_equal(json_object_get(tok, "tokens"), json_object_get(ref, "tokens")),
           "/tokenize of a prefill conversation differs from its completion text's");
    json_decref(tok);
    json_decref(ref);
    srv_buf_free(&b);
    free(lu);
    free(la);
    free(lp);
    CHECK(tu_wait_idle(t->e, 3000));
}

/* The engine's refusals at submission are 400s carrying its message. */
static void test_engine_errors(tsrv *t) {
    srv_buf big = {0};
    for (int i = 0; i < 700; i++) srv_buf_adds(&big, " cat");
    const struct {
        const char *fmt, *mention;
    } cases[] = {
        {"{\"prompt\":\"a\",\"max_tokens\":4,\"prediction\":{\"type\":\"content\",\"content\":"
         "\"%s\"}}",
         "prediction"},
        {"{\"prompt\":\"a\",\"max_tokens\":4,\"fill\":{\"content\":\"%s\"}}", "fill"},
    };
    for (size_t i = 0; i < 2; i++) {
        srv_buf b = {0};
        srv_buf_addf(&b, cases[i].fmt, i == 0 ? big.p : " the dog ran to the big tree");
        int st;
        json_t *j = post(t->port, "/v1/completions", b.p, &st);
        CHECKF(st == 400, "%s too long: %d", cases[i].mention, st);
        CHECKF(!strcmp(tu_err_field(j, "type"), "invalid_request_error") &&
                   strstr(tu_err_field(j, "message"), cases[i].mention),
               "%s too long: type '%s', message '%s'", cases[i].mention, tu_err_field(j, "type"),
               tu_err_field(j, "message"));
        json_decref(j);
        srv_buf_free(&b);
    }
    srv_buf_free(&big);
    /* n out of range is refused before anything else. */
    int st;
    json_t *j = post(t->port, "/v1/completions",
                     "{\"prompt\":\"a\",\"n\":17,\"fill\":{\"content\":\"b\"}}", &st);
    CHECK(st == 400 && !strcmp(tu_err_field(j, "param"), "n"));
    json_decref(j);
    CHECK(tu_healthy(t->port));
}

/* /metrics: HELP and TYPE lines, and the counters grow by what a request's usage reports. */
static void test_metrics(tsrv *t) {
    tu_resp r = tu_request(t->port, "GET", "/metrics", NULL, NULL);
    const char *lines[] = {
        "# TYPE kiln_spec_verify_steps_total counter",    "# HELP kiln_spec_verify_steps_total ",
        "# TYPE kiln_spec_drafted_tokens_total counter",  "# HELP kiln_spec_drafted_tokens_total ",
        "# TYPE kiln_spec_accepted_tokens_total counter", "# HELP kiln_spec_accepted_tokens_total ",
        "# TYPE kiln_fill_tokens_total counter",          "# HELP kiln_fill_tokens_total ",
        "# TYPE kiln_spec_acceptance_ratio gauge",        "# HELP kiln_spec_acceptance_ratio ",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        CHECKF(r.body.p && strstr(r.body.p, lines[i]), "/metrics lacks '%s'", lines[i]);
    tu_free(&r);
    const char *names[] = {"kiln_spec_verify_steps_total", "kiln_spec_drafted_tokens_total",
                           "kiln_spec_accepted_tokens_total", "kiln_fill_tokens_total"};
    double before[4], after[4];
    for (int i = 0; i < 4; i++) {
        before[i] = metric(t->port, names[i]);
        CHECKF(!isnan(before[i]), "no sample of %s", names[i]);
    }
    int st;
    char *b = body_of(false, 40,
                      ",\"speculation\":{\"source\":\"ngram\"},\"fill\":{\"content\":\" was "
                      "happy\"}");
    json_t *j = post(t->port, "/v1/completions", b, &st);
    free(b);
    REQUIRE(st == 200);
    CHECK(tu_wait_idle(t->e, 3000));
    long long got[4] = {
        usage_of(j, "speculation", "verify_steps"), usage_of(j, "speculation", "drafted_tokens"),
        usage_of(j, "speculation", "accepted_tokens"), usage_of(j, "speculation", "fill_tokens")};
    for (int i = 0; i < 4; i++) {
        after[i] = metric(t->port, names[i]);
        CHECKF(after[i] - before[i] == (double)got[i], "%s went %g -> %g, the request reports %lld",
               names[i], before[i], after[i], got[i]);
    }
    CHECKF(got[1] > 0 && got[3] > 0, "the request drafted %lld, filled %lld", got[1], got[3]);
    double ratio = metric(t->port, "kiln_spec_acceptance_ratio");
    CHECKF(after[1] > 0 && fabs(ratio - after[2] / after[1]) < 1e-6,
           "kiln_spec_acceptance_ratio %g, accepted/drafted %g", ratio, after[2] / after[1]);
    json_decref(j);
}

/* A server whose draft model is the target itself (speculating by default, as kiln serve
 * --draft-model does): the plain text, by default and on request. */
static void test_draft_model(void) {
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    ep.draft_model = g_model;
    ep.spec = KILN_SPEC_DRAFT; /* as kiln serve --draft-model sets it */
    tsrv t;
    tsrv_start(&t, g_model, NULL, &ep);
    int st;
    char *b = body_of(false, 40, ",\"speculation\":false");
    json_t *plain = post(t.port, "/v1/completions", b, &st);
    free(b);
    REQUIRE(st == 200);
    const char *variants[] = {"", ",\"speculation\":{\"source\":\"draft\",\"k\":5}"};
    for (int i = 0; i < 2; i++) {
        b = body_of(false, 40, variants[i]);
        json_t *j = post(t.port, "/v1/completions", b, &st);
        CHECKF(st == 200 && !strcmp(text_of(j), text_of(plain)), "draft '%s': '%s', want '%s'",
               variants[i], text_of(j), text_of(plain));
        long long d = usage_of(j, "speculation", "drafted_tokens"),
                  a = usage_of(j, "speculation", "accepted_tokens");
        CHECKF(d > 0 && a > 0 && a <= d, "draft = target: drafted %lld accepted %lld", d, a);
        json_decref(j);
        free(b);
    }
    json_decref(plain);
    CHECK(tu_wait_idle(t.e, 3000));
    tsrv_stop(&t);
}

int main(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    kiln_test_require_file(path);
    kiln_error err = {0};
    REQUIRE(kiln_model_load(path, NULL, &g_model, &err) == KILN_OK);
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    tsrv t;
    tsrv_start(&t, g_model, NULL, &ep);
    test_prediction(&t);
    test_speculation(&t);
    test_fill(&t);
    test_prefill(&t);
    test_engine_errors(&t);
    test_metrics(&t);
    tsrv_stop(&t);
    test_draft_model();
    kiln_model_free(g_model);
    return kiln_test_finish("test_server_spec");
}
