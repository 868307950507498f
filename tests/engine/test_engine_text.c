/*
 * Text streaming on stories260K (issue 3): stop strings and UTF-8 holdback.
 *   - a stop string split across tokens: the text ends right before its first occurrence in
 *     the unstopped text (found here with strstr), finish "stop";
 *   - with two stop strings the earliest occurrence wins;
 *   - a stop string at the very first token: no text at all, one completion token;
 *   - a multi-byte character split across byte-fallback tokens (forced with the test hook,
 *     and with a logit_bias that bans everything else): no TEXT event until it is complete,
 *     then exactly the character; a stop string inside such a character; a partial stop
 *     match held back and released;
 *   - end-of-generation and stop_token_ids end with "stop" (the token is not emitted);
 *     ignore_eos keeps going;
 *   - logprobs/top_logprobs equal a log-softmax of the captured logits computed here;
 *   - stop strings across the engine/reader boundary (the reader matches them, stream.c):
 *     a reader that lags while the engine runs on to max_tokens still gets exactly the
 *     tokens up to the deciding one, their usage and logits rows, finish "stop", and the
 *     blocks are free when FINISH arrives; a stop completed by the last allowed token is
 *     "stop", one token earlier the held-back text is flushed with "length"; a match that
 *     waits on another stop string's partial match is decided (and counted) by the next
 *     token.
 */
#include <math.h>
#include <time.h>

#include "engine_test_util.h"
#include "tokenizer/tokenizer.h"

static kiln_model *g_m;
static int32_t g_nv;
static int32_t g_prompt[32];
static int32_t g_n_prompt;

static kiln_engine_params params(void) {
    kiln_engine_params p = kiln_engine_default_params();
    p.n_threads = 1;
    return p;
}

static void run_one(kiln_request *r, const kiln_request_debug *dbg, et_result *res) {
    et_job j;
    memset(&j, 0, sizeof j);
    j.req = *r;
    if (dbg) j.dbg = *dbg;
    j.cancel_step = -1;
    j.res = res;
    kiln_engine_params p = params();
    kiln_engine_stats st = et_run_jobs(g_m, &p, &j, 1, NULL);
    CHECK(st.kv_blocks_used == 0);
    CHECKF(res->text_events_valid_utf8, "a TEXT event was not complete UTF-8");
    CHECK(res->order_ok);
}

static kiln_request greedy(int32_t max_tokens) {
    kiln_request r = kiln_request_defaults();
    r.prompt_ids = g_prompt;
    r.n_prompt_ids = g_n_prompt;
    r.max_tokens = max_tokens;
    r.temperature = 0.0f;
    return r;
}

/* Byte offsets in the completion text where each generated token's text ends. */
static void token_ends(const int32_t *toks, int32_t n, size_t *ends) {
    kiln_detok *d = NULL;
    REQUIRE(kiln_detok_create(g_m->tokenizer, &d, NULL) == KILN_OK);
    const char *t;
    size_t len, off = 0;
    for (int32_t i = 0; i < g_n_prompt; i++)
        REQUIRE(kiln_detok_push(d, g_prompt[i], &t, &len, NULL) == KILN_OK);
    for (int32_t i = 0; i < n; i++) {
        REQUIRE(kiln_detok_push(d, toks[i], &t, &len, NULL) == KILN_OK);
        off += len;
        ends[i] = off;
    }
    kiln_detok_destroy(d);
}

static void test_stop_strings(void) {
    kiln_request r = greedy(60);
    et_result base, got;
    run_one(&r, NULL, &base);
    REQUIRE(base.n_tokens == 60 && base.text_len > 40);
    size_t ends[64];
    token_ends(base.tokens, base.n_tokens, ends);
    CHECKF(ends[base.n_tokens - 1] == base.text_len, "detok offsets %zu vs text %zu",
           ends[base.n_tokens - 1], base.text_len);

    /* A stop string spanning the boundary between two tokens whose texts are both >= 2
     * bytes, late in the text. */
    int32_t pick = -1;
    for (int32_t i = base.n_tokens / 2; i < base.n_tokens - 2 && pick < 0; i++) {
        size_t a = i ? ends[i - 1] : 0;
        if (ends[i] - a >= 2 && ends[i + 1] - ends[i] >= 2) pick = i;
    }
    REQUIRE(pick >= 0);
    char stop[8] = {0};
    memcpy(stop, base.text + ends[pick] - 2, 4);
    const char *first = strstr(base.text, stop);
    REQUIRE(first);
    size_t want_len = (size_t)(first - base.text);
    const char *stops[] = {stop};
    r.stop = stops;
    r.n_stop = 1;
    run_one(&r, NULL, &got);
    CHECKF(got.finish == KILN_FINISH_STOP, "split stop '%s': finish %s", stop,
           kiln_finish_reason_name(got.finish));
    CHECKF(got.text_len == want_len && !memcmp(got.text, base.text, want_len),
           "split stop '%s': text '%s', want the first %zu bytes of '%s'", stop, got.text, want_len,
           base.text);
    CHECK(got.n_tokens <= pick + 2 && got.n_tokens >= 1);
    CHECK(!memcmp(got.tokens, base.tokens, (size_t)got.n_tokens * sizeof(int32_t)));
    CHECK(got.usage.completion_tokens == got.n_tokens);

    /* Two stop strings: the one occurring first wins, whatever the list order. */
    char early[8] = {0};
    int32_t e_tok = 3;
    size_t e_off = ends[e_tok] - 1; /* straddles tokens 3 and 4 */
    memcpy(early, base.text + e_off, 2);
    const char *stops2[] = {stop, early};
    r.stop = stops2;
    r.n_stop = 2;
    et_result got2;
    run_one(&r, NULL, &got2);
    const char *f2 = strstr(base.text, early);
    REQUIRE(f2);
    size_t want2 = (size_t)(f2 - base.text);
    if (first && (size_t)(first - base.text) < want2) want2 = (size_t)(first - base.text);
    CHECKF(got2.finish == KILN_FINISH_STOP && got2.text_len == want2,
           "two stops: %zu bytes '%s', want %zu", got2.text_len, got2.text, want2);

    /* A stop string completed by the very first token. */
    char firsttext[64] = {0};
    memcpy(firsttext, base.text, ends[0] < 63 ? ends[0] : 63);
    REQUIRE(firsttext[0]);
    const char *stops3[] = {firsttext};
    r.stop = stops3;
    r.n_stop = 1;
    et_result got3;
    run_one(&r, NULL, &got3);
    CHECKF(got3.finish == KILN_FINISH_STOP && got3.text_len == 0 && got3.n_text_events == 0 &&
               got3.usage.completion_tokens == 1,
           "first-token stop '%s': finish %s, text '%s', %d tokens", firsttext,
           kiln_finish_reason_name(got3.finish), got3.text, got3.usage.completion_tokens);
    et_result_free(&base);
}

/* The id of the byte-fallback token for byte b. */
static int32_t byte_token(unsigned char b) {
    for (int32_t id = 0; id < g_nv; id++) {
        char buf[8];
        size_t n = kiln_model_token_piece(g_m, id, buf, sizeof buf);
        if (n == 1 && (unsigned char)buf[0] == b) return id;
    }
    return -1;
}

/* Events in order, as a string: 'T' per TOKEN, then "[text]" per TEXT. */
static void event_trace(kiln_request *r, const kiln_request_debug *dbg, char *trace, size_t cap,
                        kiln_event *fin) {
    kiln_engine *e = NULL;
    kiln_engine_params p = params();
    kiln_error err = {0};
    REQUIRE(kiln_engine_create(g_m, &p, &e, &err) == KILN_OK);
    kiln_stream *s = NULL;
    REQUIRE(kiln_engine_submit_debug(e, r, dbg, &s, &err) == KILN_OK);
    size_t n = 0;
    trace[0] = '\0';
    for (;;) {
        kiln_event ev;
        REQUIRE(kiln_stream_next(s, -1, &ev, &err) == KILN_OK);
        if (ev.type == KILN_EVENT_TOKEN) n += (size_t)snprintf(trace + n, cap - n, "T");
        if (ev.type == KILN_EVENT_TEXT) n += (size_t)snprintf(trace + n, cap - n, "[%s]", ev.text);
        if (ev.type == KILN_EVENT_FINISH) {
            *fin = ev;
            break;
        }
        REQUIRE(n < cap);
    }
    kiln_stream_destroy(s);
    kiln_engine_destroy(e);
}

static void test_utf8_holdback(void) {
    /* U+1F600 = F0 9F 98 80, then 'a' (byte 0x61) and U+00E9 = C3 A9. */
    static const unsigned char bytes[] = {0xF0, 0x9F, 0x98, 0x80, 0x61, 0xC3, 0xA9};
    int32_t forced[7];
    for (int i = 0; i < 7; i++) {
        forced[i] = byte_token(bytes[i]);
        REQUIRE(forced[i] >= 0);
    }
    kiln_request r = greedy(7);
    kiln_request_debug dbg = {.force_tokens = forced, .n_force_tokens = 7};
    char trace[256];
    kiln_event fin;
    event_trace(&r, &dbg, trace, sizeof trace, &fin);
    CHECKF(!strcmp(trace, "TTTT[\xF0\x9F\x98\x80]T[a]TT[\xC3\xA9]"), "holdback trace: %s", trace);
    CHECK(fin.finish_reason == KILN_FINISH_LENGTH && fin.usage.completion_tokens == 7);

    /* Forced by logit_bias instead: only the two bytes of U+00E9 may be sampled; whatever
     * order the model picks, every TEXT event must be complete UTF-8 (et_collect checks). */
    int32_t ban_ids[512];
    float ban_vals[512];
    int32_t nb = 0;
    for (int32_t id = 0; id < g_nv; id++)
        if (id != forced[5] && id != forced[6]) {
            ban_ids[nb] = id;
            ban_vals[nb++] = -INFINITY;
        }
    r = greedy(6);
    r.logit_bias_ids = ban_ids;
    r.logit_bias_values = ban_vals;
    r.n_logit_bias = nb;
    et_result res;
    run_one(&r, NULL, &res);
    CHECK(res.n_tokens == 6);
    for (int32_t i = 0; i < res.n_tokens; i++)
        CHECK(res.tokens[i] == forced[5] || res.tokens[i] == forced[6]);
    CHECK(kiln_utf8_valid(res.text, res.text_len, NULL));
    et_result_free(&res);

    /* A stop string equal to the character: nothing is emitted, finish stop at token 4. */
    const char *stops[] = {"\xF0\x9F\x98\x80"};
    r = greedy(7);
    r.stop = stops;
    r.n_stop = 1;
    event_trace(&r, &dbg, trace, sizeof trace, &fin);
    CHECKF(!strcmp(trace, "TTTT"), "stop inside a character: %s", trace);
    CHECK(fin.finish_reason == KILN_FINISH_STOP && fin.usage.completion_tokens == 4);

    /* A partial match ("\U0001F600a", then 'b' expected) is held back until the text proves
     * it wrong: \xC3 alone is not text yet, so the release comes with the whole U+00E9. */
    const char *stops2[] = {"\xF0\x9F\x98\x80"
                            "ab"};
    r.stop = stops2;
    event_trace(&r, &dbg, trace, sizeof trace, &fin);
    CHECKF(!strcmp(trace, "TTTTTTT[\xF0\x9F\x98\x80"
                          "a\xC3\xA9]"),
           "partial stop: %s", trace);
    CHECK(fin.finish_reason == KILN_FINISH_LENGTH);
}

static void test_stop_tokens(void) {
    int32_t eos = kiln_tokenizer_eos(g_m->tokenizer);
    REQUIRE(eos >= 0);
    et_result base, res;
    kiln_request r = greedy(12);
    run_one(&r, NULL, &base);
    int32_t forced[4] = {base.tokens[0], base.tokens[1], base.tokens[2], eos};
    kiln_request_debug dbg = {.force_tokens = forced, .n_force_tokens = 4};
    run_one(&r, &dbg, &res);
    CHECKF(res.finish == KILN_FINISH_STOP && res.n_tokens == 3 && res.usage.completion_tokens == 4,
           "EOS: finish %s, %d tokens, usage %d", kiln_finish_reason_name(res.finish), res.n_tokens,
           res.usage.completion_tokens);
    et_result_free(&res);
    /* ignore_eos: EOS is an ordinary token (rendered as no text). */
    r.ignore_eos = true;
    run_one(&r, &dbg, &res);
    CHECK(res.finish == KILN_FINISH_LENGTH && res.n_tokens == 12 && res.tokens[3] == eos);
    et_result_free(&res);
    /* stop_token_ids: the 3rd generated token stops. */
    r = greedy(12);
    int32_t stop_ids[] = {base.tokens[2]};
    r.stop_token_ids = stop_ids;
    r.n_stop_token_ids = 1;
    run_one(&r, NULL, &res);
    int32_t first_at = 0;
    while (base.tokens[first_at] != stop_ids[0]) first_at++;
    CHECKF(res.finish == KILN_FINISH_STOP && res.n_tokens == first_at,
           "stop_token_ids: finish %s after %d tokens, want %d",
           kiln_finish_reason_name(res.finish), res.n_tokens, first_at);
    et_result_free(&res);
    et_result_free(&base);
}

static void test_logprobs(void) {
    kiln_request r = greedy(10);
    r.logprobs = true;
    r.top_logprobs = 5;
    kiln_request_debug dbg = {.capture_logits = true};
    et_result res;
    run_one(&r, &dbg, &res);
    REQUIRE(res.n_tokens == 10 && res.n_logit_rows == 10);
    for (int32_t t = 0; t < res.n_tokens; t++) {
        const float *row = res.logits + (size_t)t * g_nv;
        double mx = -INFINITY, sum = 0;
        for (int32_t v = 0; v < g_nv; v++) mx = row[v] > mx ? row[v] : mx;
        for (int32_t v = 0; v < g_nv; v++) sum += exp((double)row[v] - mx);
        double lse = mx + log(sum);
        CHECKF(fabs(res.logprob[t] - (row[res.tokens[t]] - lse)) < 1e-4,
               "token %d: logprob %g, want %g", t, res.logprob[t], row[res.tokens[t]] - lse);
        CHECK(res.n_top[t] == 5);
        CHECK(res.top[t][0].token == res.tokens[t]); /* greedy: the argmax */
        for (int k = 0; k < 5; k++) {
            int32_t id = res.top[t][k].token;
            CHECK(id >= 0 && id < g_nv && fabs(res.top[t][k].logprob - (row[id] - lse)) < 1e-4);
            if (k) CHECK(res.top[t][k].logprob <= res.top[t][k - 1].logprob);
            int32_t better = 0; /* ids strictly more likely than the k-th entry */
            for (int32_t v = 0; v < g_nv; v++) better += row[v] > row[id];
            CHECK(better <= k);
        }
    }
    et_result_free(&res);
}

/* Submit r, let the engine finish it (max_tokens or a stop token: nobody reads, so nothing
 * cancels it) before reading a single event, then read the stream. */
static void run_lagging(kiln_request *r, const kiln_request_debug *dbg, et_result *res,
                        kiln_engine_stats *st) {
    kiln_engine *e = NULL;
    kiln_engine_params p = params();
    kiln_error err = {0};
    REQUIRE(kiln_engine_create(g_m, &p, &e, &err) == KILN_OK);
    kiln_stream *s = NULL;
    REQUIRE(kiln_engine_submit_debug(e, r, dbg, &s, &err) == KILN_OK);
    for (int i = 0; i < 20000 && !kiln_stream_finished(s); i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    REQUIRE(kiln_stream_finished(s));
    kiln_engine_stats before;
    kiln_engine_get_stats(e, &before);
    CHECK(before.n_decode_tokens + 1 >= r->max_tokens); /* the engine did run ahead */
    et_collect(s, res, g_nv);
    kiln_engine_get_stats(e, st);
    kiln_stream_destroy(s);
    kiln_engine_destroy(e);
    CHECKF(res->text_events_valid_utf8, "a TEXT event was not complete UTF-8");
    CHECK(res->order_ok);
}

static void test_stop_across_boundary(void) {
    kiln_request r = greedy(40);
    et_result base, got;
    run_one(&r, NULL, &base);
    REQUIRE(base.n_tokens == 40);
    size_t ends[64];
    token_ends(base.tokens, base.n_tokens, ends);

    /* A reader that lags: the stop string is the text of tokens 2..3 (so token 3 decides),
     * or of token 0 alone; the engine has generated all 40 tokens before the first read. */
    for (int k = 0; k < 2; k++) {
        int32_t from = k ? 2 : 0, at = k ? 3 : 0;
        size_t a = from ? ends[from - 1] : 0;
        char stop[128] = {0};
        REQUIRE(ends[at] - a < sizeof stop && ends[at] > a);
        memcpy(stop, base.text + a, ends[at] - a);
        const char *first = strstr(base.text, stop);
        REQUIRE(first);
        size_t want_len = (size_t)(first - base.text);
        int32_t want_tokens = 0; /* the token whose text completes the first occurrence */
        while (ends[want_tokens] < want_len + strlen(stop)) want_tokens++;
        want_tokens++;
        const char *stops[] = {stop};
        r = greedy(40);
        r.stop = stops;
        r.n_stop = 1;
        kiln_request_debug dbg = {.capture_logits = true};
        kiln_engine_stats st;
        run_lagging(&r, &dbg, &got, &st);
        CHECKF(got.finish == KILN_FINISH_STOP && got.n_tokens == want_tokens &&
                   got.usage.completion_tokens == want_tokens &&
                   got.usage.prompt_tokens == g_n_prompt,
               "lagging reader, stop '%s': finish %s, %d TOKEN events, usage %d, want %d", stop,
               kiln_finish_reason_name(got.finish), got.n_tokens, got.usage.completion_tokens,
               want_tokens);
        CHECKF(got.text_len == want_len && !memcmp(got.text, base.text, want_len),
               "lagging reader, stop '%s': text '%s'", stop, got.text);
        CHECKF(got.n_logit_rows == want_tokens, "lagging reader: %d logits rows, want %d",
               got.n_logit_rows, want_tokens);
        CHECK(!memcmp(got.tokens, base.tokens, (size_t)got.n_tokens * sizeof(int32_t)));
        CHECK(st.kv_blocks_used == 0 && st.n_running == 0);
        et_result_free(&got);
    }

    /* stop + max_tokens on the same token: a stop string spanning tokens j and j + 1
     * (ASCII, first occurring there). max_tokens j + 2: the stop wins; max_tokens j + 1: the
     * stop cannot complete, the held-back first half is flushed, finish "length". */
    int32_t j = -1;
    char stop[8] = {0};
    for (int32_t i = 4; i < 30 && j < 0; i++) {
        if (ends[i] - ends[i - 1] < 2 || ends[i + 1] - ends[i] < 2) continue;
        memcpy(stop, base.text + ends[i] - 2, 4);
        bool ascii = true;
        for (int q = 0; q < 4; q++) ascii &= (unsigned char)stop[q] < 0x80;
        if (ascii && strstr(base.text, stop) == base.text + ends[i] - 2) j = i;
    }
    REQUIRE(j >= 0);
    const char *stops[] = {stop};
    for (int k = 0; k < 2; k++) {
        r = greedy(k ? j + 1 : j + 2);
        r.stop = stops;
        r.n_stop = 1;
        run_one(&r, NULL, &got);
        if (!k) {
            CHECKF(got.finish == KILN_FINISH_STOP && got.n_tokens == j + 2 &&
                       got.usage.completion_tokens == j + 2 && got.text_len == ends[j] - 2 &&
                       !memcmp(got.text, base.text, ends[j] - 2),
                   "stop at max_tokens: finish %s, %d tokens, usage %d, text '%s'",
                   kiln_finish_reason_name(got.finish), got.n_tokens, got.usage.completion_tokens,
                   got.text);
        } else {
            CHECKF(got.finish == KILN_FINISH_LENGTH && got.n_tokens == j + 1 &&
                       got.usage.completion_tokens == j + 1 && got.text_len == ends[j] &&
                       !memcmp(got.text, base.text, ends[j]),
                   "stop one past max_tokens: finish %s, %d tokens, usage %d, text '%s'",
                   kiln_finish_reason_name(got.finish), got.n_tokens, got.usage.completion_tokens,
                   got.text);
        }
        et_result_free(&got);
    }

    /* A match decided by a later token: "xy" completes at the end of token j, but "wxy~~"
     * (starting one byte earlier, never completing) is still a partial match there, so only
     * token j + 1 (whose text does not start with '~') decides: j + 2 tokens, finish stop. */
    char early[4] = {0}, late[8] = {0};
    memcpy(early, base.text + ends[j] - 2, 2);
    memcpy(late, base.text + ends[j] - 3, 3);
    memcpy(late + 3, "~~", 2);
    if (strstr(base.text, early) == base.text + ends[j] - 2 && !strchr(base.text, '~') &&
        (unsigned char)late[0] < 0x80) {
        const char *stops2[] = {late, early};
        r = greedy(40);
        r.stop = stops2;
        r.n_stop = 2;
        run_one(&r, NULL, &got);
        CHECKF(got.finish == KILN_FINISH_STOP && got.n_tokens == j + 2 &&
                   got.usage.completion_tokens == j + 2 && got.text_len == ends[j] - 2,
               "deferred match: finish %s, %d tokens, usage %d (want %d), %zu bytes",
               kiln_finish_reason_name(got.finish), got.n_tokens, got.usage.completion_tokens,
               j + 2, got.text_len);
        et_result_free(&got);
    } else {
        CHECKF(false, "no place for the deferred-match case in '%s'", base.text);
    }
    et_result_free(&base);
}

/* A text fill or prediction continues a text prompt: on this SPM vocabulary, tokenized alone
 * " there" would get a second leading space; the output text must begin with exactly the
 * fill, and a prediction equal to the plain output's text (which here retokenizes to the same
 * tokens, checked) is all accepted. */
static void test_fill_text(void) {
    const char *prompt = "Lily and Tom went to the park";
    kiln_request r = kiln_request_defaults();
    r.prompt = prompt;
    r.max_tokens = 12;
    r.temperature = 0.0f;
    r.fill = " there";
    et_result res;
    run_one(&r, NULL, &res);
    CHECKF(res.text_len >= 6 && strncmp(res.text, " there", 6) == 0 && res.text[6] != ' ',
           "fill: the text begins '%.12s', not ' there' once", res.text);
    CHECKF(res.usage.fill_tokens >= 1, "fill: %d fill tokens", res.usage.fill_tokens);
    /* plain output, then the same request predicted by that text */
    kiln_request q = kiln_request_defaults();
    q.prompt = prompt;
    q.max_tokens = 12;
    q.temperature = 0.0f;
    et_result plain;
    run_one(&q, NULL, &plain);
    int32_t joined[64];
    int32_t n_joined = 0, n_prompt = 0;
    static char buf[ET_MAX_TEXT + 64];
    snprintf(buf, sizeof buf, "%s%s", prompt, plain.text);
    kiln_error err = {0};
    REQUIRE(kiln_model_tokenize(g_m, buf, strlen(buf), true, false, joined, 64, &n_joined, &err) ==
            KILN_OK);
    int32_t pids[32];
    REQUIRE(kiln_model_tokenize(g_m, prompt, strlen(prompt), true, false, pids, 32, &n_prompt,
                                &err) == KILN_OK);
    bool roundtrip = n_joined - n_prompt == plain.n_tokens &&
                     memcmp(joined + n_prompt, plain.tokens, (size_t)plain.n_tokens * 4) == 0;
    q.prediction = plain.text;
    et_result pred;
    run_one(&q, NULL, &pred);
    CHECKF(pred.n_tokens == plain.n_tokens &&
               memcmp(pred.tokens, plain.tokens, (size_t)plain.n_tokens * 4) == 0,
           "prediction: output differs from plain");
    if (roundtrip)
        CHECKF(pred.usage.rejected_prediction_tokens == 0 &&
                   pred.usage.accepted_prediction_tokens == plain.n_tokens,
               "prediction of the plain text: accepted %d rejected %d of %d",
               pred.usage.accepted_prediction_tokens, pred.usage.rejected_prediction_tokens,
               plain.n_tokens);
    else
        printf("note: the plain output's text does not retokenize to its tokens; the "
               "accounting check is skipped\n");
    et_result_free(&res);
    et_result_free(&plain);
    et_result_free(&pred);
}

int main(void) {
    g_m = et_load("models/stories260K/stories260K-f32.gguf");
    g_nv = kiln_model_n_vocab(g_m);
    kiln_error err = {0};
    REQUIRE(kiln_model_tokenize(g_m, "Lily and Tom went to the park", 29, true, false, g_prompt, 32,
                                &g_n_prompt, &err) == KILN_OK);
    REQUIRE(g_n_prompt > 2 && g_n_prompt <= 32);
    test_stop_strings();
    test_utf8_holdback();
    test_stop_tokens();
    test_logprobs();
    test_stop_across_boundary();
    test_fill_text();
    kiln_model_free(g_m);
    return kiln_test_finish("test_engine_text");
}
