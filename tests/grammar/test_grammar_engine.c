/*
 * test_grammar_engine.c - structured output through the engine on stories260K:
 *   spec      with speculation (random drafts, which the grammar mostly forbids, and n-gram
 *             drafts) under the exact accept rule, a grammar's output is bitwise the output
 *             without speculation: forbidden drafts are rejected, allowed ones verified
 *             against the masked rows;
 *   length    a grammar that cannot finish within max_tokens ends with KILN_FINISH_LENGTH;
 *   fill      an asserted fill the grammar rejects is refused at submission; one it accepts
 *             is kept and the output continues the grammar;
 *   greedy    greedy decoding under a GBNF grammar gives a sentence (checked by hand);
 *   jump      jump-forward inserts the forced text of a grammar with long fixed spans, and
 *             counts it as fill tokens.
 */
#include <string.h>

#include "kiln.h"
#include "test.h"

static kiln_model *g_m;
static kiln_engine *g_e;

typedef struct out {
    char text[4096];
    kiln_finish_reason fin;
    kiln_usage usage;
    int32_t toks[512];
    int n_toks;
} out;

static kiln_status run(const kiln_request *r, out *o) {
    kiln_stream *s;
    kiln_error err;
    memset(o, 0, sizeof *o);
    kiln_status st = kiln_engine_submit(g_e, r, &s, &err);
    if (st) return st;
    size_t n = 0;
    for (;;) {
        kiln_event ev;
        REQUIRE(kiln_stream_next(s, -1, &ev, &err) == KILN_OK);
        if (ev.type == KILN_EVENT_TOKEN && o->n_toks < 512) o->toks[o->n_toks++] = ev.token;
        if (ev.type == KILN_EVENT_TEXT && n + ev.text_len < sizeof o->text) {
            memcpy(o->text + n, ev.text, ev.text_len);
            n += ev.text_len;
        }
        if (ev.type == KILN_EVENT_FINISH) {
            o->fin = ev.finish_reason;
            o->usage = ev.usage;
            if (ev.finish_reason == KILN_FINISH_ERROR) fprintf(stderr, "finish error: %s\n", ev.message);
            break;
        }
    }
    kiln_stream_destroy(s);
    return KILN_OK;
}

static kiln_grammar *make(kiln_grammar_kind k, const char *src) {
    kiln_grammar *g = NULL;
    kiln_error err;
    if (kiln_grammar_create(k, src, 0, &g, &err)) fprintf(stderr, "%s\n", err.message);
    REQUIRE(g);
    return g;
}

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bb\",\"ccc\"]},\"maxItems\":4},"
    "\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":500}},\"required\":[\"name\",\"n\"]}";

static void test_spec(void) {
    kiln_grammar *g = make(KILN_GRAMMAR_JSON_SCHEMA, k_schema);
    int compared = 0;
    for (int jump = 0; jump < 2; jump++)
        for (uint64_t seed = 0; seed < 6; seed++) {
            kiln_request r = kiln_request_defaults();
            r.prompt = "Once upon a time";
            r.max_tokens = 120;
            r.temperature = seed % 3 == 0 ? 0.0f : 1.0f;
            r.seed = seed;
            r.grammar = g;
            r.grammar_no_jump_forward = !jump;
            r.spec = KILN_SPEC_OFF;
            out plain, rnd, ng;
            REQUIRE(run(&r, &plain) == KILN_OK);
            r.spec = KILN_SPEC_RANDOM;
            r.spec_k = 4;
            REQUIRE(run(&r, &rnd) == KILN_OK);
            r.spec = KILN_SPEC_NGRAM;
            REQUIRE(run(&r, &ng) == KILN_OK);
            CHECKF(plain.fin == KILN_FINISH_STOP, "plain finish %d: %s", plain.fin, plain.text);
            CHECKF(!strcmp(plain.text, rnd.text) && plain.n_toks == rnd.n_toks &&
                       !memcmp(plain.toks, rnd.toks, sizeof(int32_t) * (size_t)plain.n_toks),
                   "seed %llu jump %d: random drafts changed the output:\n%s\n%s",
                   (unsigned long long)seed, jump, plain.text, rnd.text);
            CHECKF(!strcmp(plain.text, ng.text), "seed %llu jump %d: n-gram drafts changed the output:\n%s\n%s",
                   (unsigned long long)seed, jump, plain.text, ng.text);
            CHECKF(rnd.usage.spec_drafted > 0, "no drafts were verified");
            compared++;
        }
    CHECK(compared == 12);
    kiln_grammar_destroy(g);
}

static void test_length(void) {
    kiln_grammar *g = make(KILN_GRAMMAR_GBNF, "root ::= \"ab\"{30} \"!\"");
    for (int jump = 0; jump < 2; jump++) {
        kiln_request r = kiln_request_defaults();
        r.prompt = "Once";
        r.max_tokens = 5;
        r.grammar = g;
        r.grammar_no_jump_forward = !jump;
        out o;
        REQUIRE(run(&r, &o) == KILN_OK);
        CHECKF(o.fin == KILN_FINISH_LENGTH, "finish %d", o.fin);
        CHECKF(o.usage.completion_tokens == 5, "completion tokens %d", o.usage.completion_tokens);
        /* a prefix of (ab)^30 */
        for (size_t i = 0; i < strlen(o.text); i++) CHECK(o.text[i] == (i % 2 ? 'b' : 'a'));
    }
    kiln_grammar_destroy(g);
}

static void test_fill(void) {
    kiln_grammar *g = make(KILN_GRAMMAR_GBNF, "root ::= \"yes\" [a-z]{0,4} \".\"");
    kiln_request r = kiln_request_defaults();
    r.prompt = "Once upon a time";
    r.max_tokens = 20;
    r.grammar = g;
    r.fill = "no";
    kiln_stream *s = NULL;
    kiln_error err;
    kiln_status st = kiln_engine_submit(g_e, &r, &s, &err);
    CHECKF(st == KILN_ERR_INVALID_ARGUMENT && strstr(err.message, "does not match the grammar"),
           "st %d: %s", st, err.message);
    kiln_stream_destroy(s);
    r.fill = "ye";
    out o;
    REQUIRE(run(&r, &o) == KILN_OK);
    CHECKF(o.fin == KILN_FINISH_STOP && !strncmp(o.text, "yes", 3) && o.text[strlen(o.text) - 1] == '.',
           "fill: %d %s", o.fin, o.text);
    kiln_grammar_destroy(g);
}

static void test_greedy(void) {
    kiln_grammar *g = make(KILN_GRAMMAR_GBNF, "root ::= (\"Tom\" | \"Lily\") \" \" [a-z]{2,6} \"!\"");
    kiln_request r = kiln_request_defaults();
    r.prompt = "Once upon a time there was a girl named";
    r.max_tokens = 30;
    r.temperature = 0.0f;
    r.grammar = g;
    out o;
    REQUIRE(run(&r, &o) == KILN_OK);
    CHECK(o.fin == KILN_FINISH_STOP);
    const char *sp = strchr(o.text, ' ');
    CHECKF(sp && (!strncmp(o.text, "Tom ", 4) || !strncmp(o.text, "Lily ", 5)), "%s", o.text);
    size_t n = strlen(o.text);
    CHECKF(n > 0 && o.text[n - 1] == '!', "%s", o.text);
    for (const char *p = sp ? sp + 1 : o.text; *p && *p != '!'; p++) CHECK(*p >= 'a' && *p <= 'z');
    kiln_grammar_destroy(g);
}

static void test_jump(void) {
    kiln_grammar *g = make(KILN_GRAMMAR_GBNF,
                           "root ::= \"The answer is: once upon a time\" [0-9] \" and they lived happily\"");
    kiln_request r = kiln_request_defaults();
    r.prompt = "Once";
    r.max_tokens = 60;
    r.grammar = g;
    out on, off;
    REQUIRE(run(&r, &on) == KILN_OK);
    r.grammar_no_jump_forward = true;
    REQUIRE(run(&r, &off) == KILN_OK);
    CHECKF(on.fin == KILN_FINISH_STOP && off.fin == KILN_FINISH_STOP, "%d %d", on.fin, off.fin);
    CHECKF(!strncmp(on.text, "The answer is: once upon a time", 31) &&
               !strcmp(on.text + 32, " and they lived happily"),
           "%s", on.text);
    CHECKF(!strncmp(off.text, "The answer is: once upon a time", 31), "%s", off.text);
    CHECKF(on.usage.fill_tokens > 10, "jump-forward tokens %d", on.usage.fill_tokens);
    CHECK(off.usage.fill_tokens == 0);
    kiln_grammar_destroy(g);
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "spec";
    const char *path = kiln_test_shared("models/stories260K/stories260K.bin");
    kiln_test_require_file(path);
    kiln_error err;
    REQUIRE(kiln_model_load(path, NULL, &g_m, &err) == KILN_OK);
    kiln_engine_params ep = kiln_engine_default_params();
    ep.n_threads = 1;
    REQUIRE(kiln_engine_create(g_m, &ep, &g_e, &err) == KILN_OK);
    if (!strcmp(c, "spec")) test_spec();
    else if (!strcmp(c, "length")) test_length();
    else if (!strcmp(c, "fill")) test_fill();
    else if (!strcmp(c, "greedy")) test_greedy();
    else if (!strcmp(c, "jump")) test_jump();
    else return 2;
    kiln_engine_destroy(g_e);
    kiln_model_free(g_m);
    return kiln_test_finish(c);
}
