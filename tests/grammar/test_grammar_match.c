/*
 * test_grammar_match.c - GBNF, regex and JSON-schema grammars on hand-worked strings: each
 * case says whether a text is a whole sentence (accept), only a prefix of one, or neither
 * (reject); and the compile errors name the problem. The expectations are worked out by hand
 * from the grammar, never produced by the code under test.
 *
 *   test_grammar_match gbnf | regex | schema | errors | mask
 */
#include <stdint.h>
#include <string.h>

#include "grammar/grammar.h"
#include "kiln.h"
#include "test.h"

enum { REJECT = 0, PREFIX = 1, ACCEPT = 2 };

static void expect(kiln_grammar *g, const char *src, const char *text, int want) {
    bool pre = false, full = false;
    kiln_error err;
    kiln_status st = kiln_grammar_match(g, text, strlen(text), &pre, &full, &err);
    CHECKF(st == KILN_OK, "match failed: %s", err.message);
    int got = full ? ACCEPT : pre ? PREFIX : REJECT;
    CHECKF(got == want, "grammar %s on \"%s\": got %d, want %d", src, text, got, want);
}

static kiln_grammar *make(kiln_grammar_kind k, const char *src) {
    kiln_grammar *g = NULL;
    kiln_error err;
    kiln_status st = kiln_grammar_create(k, src, 0, &g, &err);
    CHECKF(st == KILN_OK, "compile %s: %s", src, err.message);
    return g;
}

typedef struct gcase {
    const char *text;
    int want;
} gcase;

static void run(kiln_grammar_kind k, const char *src, const gcase *cs) {
    kiln_grammar *g = make(k, src);
    if (!g) return;
    for (; cs->text; cs++) expect(g, src, cs->text, cs->want);
    kiln_grammar_destroy(g);
}

static void test_gbnf(void) {
    run(KILN_GRAMMAR_GBNF, "root ::= \"ab\" | \"cd\"",
        (gcase[]){{"ab", ACCEPT}, {"cd", ACCEPT}, {"a", PREFIX}, {"", PREFIX}, {"ac", REJECT},
                  {"abc", REJECT}, {NULL, 0}});
    /* repetition, classes, groups, comments, multi-line */
    run(KILN_GRAMMAR_GBNF,
        "# a comment\nroot ::= num (\",\" num)*   # trailing\nnum ::= [1-9] [0-9]* | \"0\"\n",
        (gcase[]){{"0", ACCEPT}, {"10,2,300", ACCEPT}, {"01", REJECT}, {"1,", PREFIX},
                  {"1,,", REJECT}, {",", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_GBNF, "root ::= [a-c]+ \"!\"?",
        (gcase[]){{"abcab", ACCEPT}, {"a!", ACCEPT}, {"!", REJECT}, {"", PREFIX},
                  {"a!!", REJECT}, {"d", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_GBNF, "root ::= \"x\"{2,3} [0-9]{2}",
        (gcase[]){{"xx12", ACCEPT}, {"xxx12", ACCEPT}, {"x12", REJECT}, {"xxxx12", REJECT},
                  {"xx1", PREFIX}, {"xx123", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_GBNF, "root ::= \"a\"{2,}",
        (gcase[]){{"a", PREFIX}, {"aa", ACCEPT}, {"aaaaaa", ACCEPT}, {"ab", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_GBNF, "root ::= (\"ab\")? \"c\"",
        (gcase[]){{"c", ACCEPT}, {"abc", ACCEPT}, {"ac", REJECT}, {NULL, 0}});
    /* negated class, escapes, any character, UTF-8 */
    run(KILN_GRAMMAR_GBNF, "root ::= \"\\\"\" [^\"\\\\\\n]* \"\\\"\"",
        (gcase[]){{"\"hi there\"", ACCEPT}, {"\"caf\xc3\xa9\"", ACCEPT}, {"\"a\nb\"", REJECT},
                  {"\"a\\", REJECT}, {"\"abc", PREFIX}, {NULL, 0}});
    run(KILN_GRAMMAR_GBNF, "root ::= [\\u00e0-\\u00ff] . [\\x41]",
        (gcase[]){{"\xc3\xa9\xe2\x82\xac" "A", ACCEPT}, {"\xc3\xa9zA", ACCEPT},
                  {"\xc3", PREFIX}, {"eza", REJECT}, {"\xc3\xa9zB", REJECT}, {NULL, 0}});
    /* an invalid UTF-8 byte is never accepted, even by '.' */
    run(KILN_GRAMMAR_GBNF, "root ::= .*",
        (gcase[]){{"abc", ACCEPT}, {"\xff", REJECT}, {"\xed\xa0\x80", REJECT}, {"\xf0\x9f\x98\x80", ACCEPT},
                  {NULL, 0}});
    /* recursion (balanced parentheses), rules across lines and alternatives after '|' */
    run(KILN_GRAMMAR_GBNF, "root ::= item*\nitem ::= \"(\" item* \")\" |\n  \"x\"",
        (gcase[]){{"", ACCEPT}, {"(x(x))x", ACCEPT}, {"((", PREFIX}, {"())", REJECT},
                  {NULL, 0}});
    /* nullable items inside a repetition do not loop */
    run(KILN_GRAMMAR_GBNF, "root ::= (\"a\"?)* \"b\"",
        (gcase[]){{"b", ACCEPT}, {"aab", ACCEPT}, {"aa", PREFIX}, {"c", REJECT}, {NULL, 0}});
}

static void test_regex(void) {
    run(KILN_GRAMMAR_REGEX, "[a-z]+@[a-z]+\\.(com|org)",
        (gcase[]){{"bob@ex.com", ACCEPT}, {"bob@ex.org", ACCEPT}, {"bob@ex.net", REJECT},
                  {"bob@", PREFIX}, {"Bob@ex.com", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_REGEX, "^\\d{3}-\\d{2,4}$",
        (gcase[]){{"123-45", ACCEPT}, {"123-4567", ACCEPT}, {"123-45678", REJECT},
                  {"12-34", REJECT}, {"123-4", PREFIX}, {NULL, 0}});
    run(KILN_GRAMMAR_REGEX, "(?:ab|c)*?d",
        (gcase[]){{"d", ACCEPT}, {"abcabd", ACCEPT}, {"ad", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_REGEX, "[^0-9\\s]\\w?.",
        (gcase[]){{"a_x", ACCEPT}, {"ab", ACCEPT}, {"1ab", REJECT}, {" ab", REJECT},
                  {"ab\n", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_REGEX, "a\\.b\\+c\\{",
        (gcase[]){{"a.b+c{", ACCEPT}, {"axb+c{", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_REGEX, "colou?r|gr[ae]y",
        (gcase[]){{"color", ACCEPT}, {"colour", ACCEPT}, {"grey", ACCEPT}, {"gray", ACCEPT},
                  {"groy", REJECT}, {NULL, 0}});
}

static void test_schema(void) {
    /* compact JSON with an optional space after ':' and ',' */
    run(KILN_GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
        "\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
        (gcase[]){{"{\"a\":1}", ACCEPT}, {"{\"a\": -12,\"b\":\"x\"}", ACCEPT},
                  {"{\"a\":1, \"b\": \"\"}", ACCEPT}, {"{\"b\":\"x\"}", REJECT},
                  {"{\"b\":\"x\",\"a\":1}", REJECT}, {"{\"a\":01}", REJECT},
                  {"{\"a\":1,\"c\":2}", REJECT}, {"{\"a\":  1}", REJECT}, {"{\"a\"", PREFIX},
                  {NULL, 0}});
    /* optional properties between required ones */
    run(KILN_GRAMMAR_JSON_SCHEMA,
        "{\"properties\":{\"x\":{\"const\":1},\"y\":{\"const\":2},\"z\":{\"const\":3}},"
        "\"required\":[\"z\"]}",
        (gcase[]){{"{\"z\":3}", ACCEPT}, {"{\"x\":1,\"z\":3}", ACCEPT},
                  {"{\"y\":2,\"z\":3}", ACCEPT}, {"{\"x\":1,\"y\":2,\"z\":3}", ACCEPT},
                  {"{\"x\":1", PREFIX}, {"{\"x\":1}", REJECT}, {"{}", REJECT}, {"{,\"z\":3}", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120}",
        (gcase[]){{"-5", ACCEPT}, {"0", ACCEPT}, {"7", ACCEPT}, {"99", ACCEPT}, {"119", ACCEPT},
                  {"120", REJECT}, {"-6", REJECT}, {"-0", REJECT}, {"05", REJECT},
                  {"1000", REJECT}, {"-", PREFIX}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":37,\"maximum\":4321}",
        (gcase[]){{"37", ACCEPT}, {"36", PREFIX}, {"0", REJECT}, {"4400", REJECT}, {"99", ACCEPT}, {"100", ACCEPT},
                  {"4321", ACCEPT}, {"4322", REJECT}, {"4299", ACCEPT}, {"5000", REJECT},
                  {"3", PREFIX}, {"2", PREFIX}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"exclusiveMinimum\":10}",
        (gcase[]){{"10", PREFIX}, {"11", ACCEPT}, {"9", PREFIX}, {"0", REJECT}, {"-1", REJECT}, {"100", ACCEPT},
                  {"123456", ACCEPT}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
        (gcase[]){{"\"ab\"", ACCEPT}, {"\"a\\nb\"", ACCEPT}, {"\"\xc3\xa9\xc3\xa9\"", ACCEPT},
                  {"\"a\"", REJECT}, {"\"abcd\"", REJECT}, {"\"\\ud800x\"", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"a\\\"[0-9]+\"}",
        (gcase[]){{"\"a\\\"12\"", ACCEPT}, {"\"a\"12\"", REJECT}, {"\"a\\\"\"", REJECT},
                  {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"array\",\"items\":{\"enum\":[\"x\",null,true]},\"minItems\":1,\"maxItems\":2}",
        (gcase[]){{"[\"x\"]", ACCEPT}, {"[null, true]", ACCEPT}, {"[]", REJECT},
                  {"[true,true,true]", REJECT}, {"[false]", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA,
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/n\"}}},\"required\":[\"k\"]}},\"$ref\":\"#/$defs/n\"}",
        (gcase[]){{"{\"k\":[]}", ACCEPT}, {"{\"k\":[{\"k\":[]},{\"k\":[{\"k\":[]}]}]}", ACCEPT},
                  {"{\"k\":[{}]}", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_SCHEMA, "{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"number\"}]}",
        (gcase[]){{"null", ACCEPT}, {"1.5e-3", ACCEPT}, {"-0.25", ACCEPT}, {"1.", PREFIX},
                  {"true", REJECT}, {NULL, 0}});
    run(KILN_GRAMMAR_JSON_OBJECT, NULL,
        (gcase[]){{"{}", ACCEPT}, {"{\"a\":[1,{\"b\":null}], \"c\":\"d\"}", ACCEPT},
                  {"[]", REJECT}, {"{\"a\"}", REJECT}, {NULL, 0}});
    const char *ch[] = {"yes", "no", "a \"quoted\" one"};
    kiln_grammar *g = NULL;
    kiln_error err;
    CHECK(kiln_grammar_from_choices(ch, 3, &g, &err) == KILN_OK);
    if (g) {
        expect(g, "choice", "yes", ACCEPT);
        expect(g, "choice", "no", ACCEPT);
        expect(g, "choice", "a \"quoted\" one", ACCEPT);
        expect(g, "choice", "n", PREFIX);
        expect(g, "choice", "maybe", REJECT);
        kiln_grammar_destroy(g);
    }
}

static void expect_error(kiln_grammar_kind k, const char *src, const char *needle) {
    kiln_grammar *g = NULL;
    kiln_error err;
    memset(&err, 0, sizeof err);
    kiln_status st = kiln_grammar_create(k, src, 0, &g, &err);
    CHECKF(st == KILN_ERR_INVALID_ARGUMENT, "%s: expected an error, got %d", src, st);
    CHECKF(strstr(err.message, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", src,
           err.message, needle);
    kiln_grammar_destroy(g);
}

static void test_errors(void) {
    expect_error(KILN_GRAMMAR_GBNF, "root ::= foo", "rule 'foo' is not defined");
    expect_error(KILN_GRAMMAR_GBNF, "start ::= \"a\"", "no rule named 'root'");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= \"a\n", "line 1, column 10: unterminated string");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= x\nx ::= x \"a\" | \"b\"", "left-recursive");
    /* a grammar whose root can never finish (empty language) is refused at compile time,
     * not at generation time (a fresh-user check got a 500 after 0 tokens for these) */
    expect_error(KILN_GRAMMAR_GBNF, "root ::= root", "rule 'root' can never finish");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= x\nx ::= x", "rule 'x' only refers back");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= \"ab\" x\nx ::= \"c\" x", "can never finish");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= [^\\x00-\\U0010FFFF]", "can never finish");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#\"}", "can never finish");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA,
                 "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
                 "can never finish");
    {   /* an unfinishable rule beside a finishable alternative is fine */
        kiln_grammar *g = NULL;
        kiln_error err = {0};
        CHECKF(kiln_grammar_create(KILN_GRAMMAR_GBNF, "root ::= \"a\" | x\nx ::= \"b\" x", 0,
                                   &g, &err) == KILN_OK,
               "root with one finishable alternative refused: %s", err.message);
        kiln_grammar_destroy(g);
    }
    expect_error(KILN_GRAMMAR_GBNF, "root ::= [b-a]", "out of order");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= (\"a\"", "unclosed group");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= \"a\"{3,1}", "below the minimum");
    expect_error(KILN_GRAMMAR_GBNF, "root ::= \"\\q\"", "unknown escape");
    expect_error(KILN_GRAMMAR_REGEX, "(a)\\1", "position 3: backreferences");
    expect_error(KILN_GRAMMAR_REGEX, "a(?=b)", "lookahead");
    expect_error(KILN_GRAMMAR_REGEX, "a(?<=b)", "lookbehind");
    expect_error(KILN_GRAMMAR_REGEX, "\\bword", "word boundaries");
    expect_error(KILN_GRAMMAR_REGEX, "a^b", "anchor");
    expect_error(KILN_GRAMMAR_REGEX, "(ab", "unclosed group");
    expect_error(KILN_GRAMMAR_REGEX, "*a", "nothing to repeat");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":3}",
                 "keyword 'multipleOf' is not supported");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA,
                 "{\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"email\"}}}",
                 "at /properties/a: keyword 'format'");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}",
                 "uniqueItems");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", "does not resolve");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":", "not valid JSON");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"strin\"}", "unknown type 'strin'");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(?=x)\"}",
                 "pattern: regex: position 0: lookahead");
    expect_error(KILN_GRAMMAR_JSON_SCHEMA, "{\"not\":{}}", "keyword 'not'");
    /* annotations are fine */
    kiln_grammar *g = make(KILN_GRAMMAR_JSON_SCHEMA,
                           "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\","
                           "\"title\":\"t\",\"description\":\"d\",\"default\":1,\"examples\":[1],"
                           "\"type\":\"integer\"}");
    kiln_grammar_destroy(g);
}

/* a toy vocabulary: masks and forced tokens against hand-worked expectations */
static const char *k_vocab[] = {"", "a", "b", "ab", "abc", "{", "{\"", "\"", "\":", "x", "xy",
                                "}", "\"}", "1", "12"};
static size_t toy_piece(void *user, int32_t id, char *buf, size_t cap) {
    (void)user;
    size_t n = strlen(k_vocab[id]);
    memcpy(buf, k_vocab[id], n < cap ? n : cap);
    return n;
}

static void test_mask(void) {
    int32_t nv = (int32_t)(sizeof k_vocab / sizeof *k_vocab);
    kiln_vocab_trie *t = NULL;
    kiln_error err;
    REQUIRE(kiln_vocab_trie_create(nv, toy_piece, NULL, &t, &err) == KILN_OK);
    kiln_grammar *g = make(KILN_GRAMMAR_GBNF, "root ::= \"ab\" [c]? \"x\"+");
    kiln_gmatch *m = NULL;
    REQUIRE(kiln_gmatch_create(g, &m, &err) == KILN_OK);
    uint32_t bits[1];
    int32_t n = kiln_gmatch_token_mask(m, t, kiln_gmatch_state(m), bits, true);
    /* from the start: "a" (1), "ab" (3), "abc" (4) */
    CHECKF(n == 3 && bits[0] == ((1u << 1) | (1u << 3) | (1u << 4)), "n %d bits %x", n, bits[0]);
    /* cached: the same again */
    n = kiln_gmatch_token_mask(m, t, kiln_gmatch_state(m), bits, true);
    CHECK(n == 3 && bits[0] == ((1u << 1) | (1u << 3) | (1u << 4)));
    /* forced: "ab" is forced, then c or x: the only forced token would be "ab"; it is the
     * last one and the grammar does not close there, so none is kept */
    int32_t forced[8];
    CHECK(kiln_gmatch_forced_tokens(m, t, forced, 8) == 0);
    CHECK(kiln_gmatch_advance(m, (const uint8_t *)"abc", 3));
    n = kiln_gmatch_token_mask(m, t, kiln_gmatch_state(m), bits, false);
    /* after "abc": "x" (9) only ("xy" has a y) */
    CHECKF(n == 1 && bits[0] == (1u << 9), "n %d bits %x", n, bits[0]);
    CHECK(!kiln_gmatch_accepting(m, kiln_gmatch_state(m)));
    CHECK(kiln_gmatch_advance(m, (const uint8_t *)"x", 1));
    CHECK(kiln_gmatch_accepting(m, kiln_gmatch_state(m)));
    kiln_gmatch_destroy(m);
    kiln_grammar_destroy(g);

    /* a forced span that closes the grammar: all its tokens are kept */
    g = make(KILN_GRAMMAR_GBNF, "root ::= \"{\\\"x\\\":12}\"");
    REQUIRE(kiln_gmatch_create(g, &m, &err) == KILN_OK);
    n = kiln_gmatch_forced_tokens(m, t, forced, 8);
    /* greedy longest: {" (6), x (9), ": (8), 12 (14), } (11) */
    CHECKF(n == 5 && forced[0] == 6 && forced[1] == 9 && forced[2] == 8 && forced[3] == 14 &&
               forced[4] == 11,
           "n %d", n);
    kiln_gmatch_destroy(m);
    kiln_grammar_destroy(g);
    kiln_vocab_trie_destroy(t);
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "gbnf";
    if (!strcmp(c, "gbnf")) test_gbnf();
    else if (!strcmp(c, "regex")) test_regex();
    else if (!strcmp(c, "schema")) test_schema();
    else if (!strcmp(c, "errors")) test_errors();
    else if (!strcmp(c, "mask")) test_mask();
    else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    return kiln_test_finish(c);
}
