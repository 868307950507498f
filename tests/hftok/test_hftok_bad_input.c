/*
 * test_hftok_bad_input - malformed tokenizer.json / tokenizer_config.json documents are refused
 * with KILN_ERR_FORMAT (bad JSON, wrong types, inconsistent vocab/merges/ids) or
 * KILN_ERR_UNSUPPORTED (component types kiln does not implement), with a message naming the
 * field, and never crash; then a few thousand deterministic mutations of a valid document
 * (run under ASan+UBSan in the sanitizer build) must load or fail cleanly.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/vec.h"

static char *J(const char *s) {
    char *d = strdup(s);
    REQUIRE(d);
    for (char *p = d; *p; p++)
        if (*p == '\'') *p = '"';
    return d;
}

static void expect_err(const char *label, const char *json, const char *cfg, kiln_status want,
                       const char *needle) {
    char *j = json ? J(json) : NULL, *c = cfg ? J(cfg) : NULL;
    kiln_tokenizer *t = (kiln_tokenizer *)(uintptr_t)1;
    kiln_error err = {0};
    kiln_status st =
        kiln_tokenizer_from_hf_json(j, j ? strlen(j) : 0, c, c ? strlen(c) : 0, &t, &err);
    CHECKF(st == want, "%s: status %s, want %s (%s)", label, kiln_status_name(st),
           kiln_status_name(want), err.message);
    CHECKF(st == KILN_OK || t == NULL, "%s: *out not NULL on error", label);
    CHECKF(!needle || strstr(err.message, needle), "%s: message \"%s\" lacks \"%s\"", label,
           err.message, needle);
    if (st == KILN_OK) kiln_tokenizer_destroy(t);
    free(j);
    free(c);
}

#define MODEL "'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1, 'ab': 2}, 'merges': ['a b']}"

static void test_errors(void) {
    expect_err("bad JSON", "{'model': ", NULL, KILN_ERR_FORMAT, "tokenizer.json:1:");
    expect_err("not an object", "[1, 2]", NULL, KILN_ERR_FORMAT, "top level");
    expect_err("no model", "{'normalizer': null}", NULL, KILN_ERR_FORMAT, "model");
    expect_err("model not object", "{'model': 3}", NULL, KILN_ERR_FORMAT, "model must be");
    expect_err("Unigram", "{'model': {'type': 'Unigram', 'vocab': [['a', 0.0]]}}", NULL,
               KILN_ERR_UNSUPPORTED, "model.type 'Unigram'");
    expect_err("untyped model", "{'model': {'vocab': {}}}", NULL, KILN_ERR_FORMAT, "\"type\"");
    expect_err("vocab array", "{'model': {'type': 'BPE', 'vocab': [], 'merges': []}}", NULL,
               KILN_ERR_FORMAT, "model.vocab");
    expect_err("vocab id string", "{'model': {'type': 'BPE', 'vocab': {'a': 'x'}, 'merges': []}}",
               NULL, KILN_ERR_FORMAT, "model.vocab.a");
    expect_err("vocab id negative", "{'model': {'type': 'BPE', 'vocab': {'a': -1}, 'merges': []}}",
               NULL, KILN_ERR_FORMAT, "model.vocab.a");
    expect_err("vocab id huge",
               "{'model': {'type': 'BPE', 'vocab': {'a': 4000000000}, 'merges': []}}", NULL,
               KILN_ERR_FORMAT, "model.vocab.a");
    expect_err("vocab sparse", "{'model': {'type': 'BPE', 'vocab': {'a': 10000000}, 'merges': []}}",
               NULL, KILN_ERR_FORMAT, "sparse");
    expect_err("vocab duplicate id",
               "{'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 0}, 'merges': []}}", NULL,
               KILN_ERR_FORMAT, "model.vocab");
    expect_err("empty vocab", "{'model': {'type': 'BPE', 'vocab': {}, 'merges': []}}", NULL,
               KILN_ERR_FORMAT, "empty");
    expect_err("merges object", "{'model': {'type': 'BPE', 'vocab': {'a': 0}, 'merges': {}}}", NULL,
               KILN_ERR_FORMAT, "model.merges");
    expect_err("merge unknown token",
               "{'model': {'type': 'BPE', 'vocab': {'a': 0, 'ab': 1}, 'merges': ['a b']}}", NULL,
               KILN_ERR_FORMAT, "model.merges[0]");
    expect_err("merge result missing",
               "{'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1}, 'merges': [['a', 'b']]}}",
               NULL, KILN_ERR_FORMAT, "merged token 'ab'");
    expect_err("merge three parts",
               "{'model': {'type': 'BPE', 'vocab': {'a': 0}, 'merges': ['a a a']}}", NULL,
               KILN_ERR_FORMAT, "model.merges[0]");
    expect_err("merge pair of numbers",
               "{'model': {'type': 'BPE', 'vocab': {'a': 0}, 'merges': [[1, 2]]}}", NULL,
               KILN_ERR_FORMAT, "model.merges[0]");
    expect_err("byte_fallback type",
               "{'model': {'type': 'BPE', 'byte_fallback': 'yes', 'vocab': {'a': 0}, "
               "'merges': []}}",
               NULL, KILN_ERR_FORMAT, "model.byte_fallback");
    expect_err("dropout type",
               "{'model': {'type': 'BPE', 'dropout': 'x', 'vocab': {'a': 0}, 'merges': []}}", NULL,
               KILN_ERR_FORMAT, "model.dropout");
    expect_err("normalizer unknown", "{" MODEL ", 'normalizer': {'type': 'Precompiled'}}", NULL,
               KILN_ERR_UNSUPPORTED, "normalizer.type 'Precompiled'");
    expect_err("normalizer untyped", "{" MODEL ", 'normalizer': {'x': 1}}", NULL, KILN_ERR_FORMAT,
               "normalizer has no \"type\"");
    expect_err("normalizer type number", "{" MODEL ", 'normalizer': {'type': 7}}", NULL,
               KILN_ERR_FORMAT, "normalizer.type");
    expect_err("normalizers not array",
               "{" MODEL ", 'normalizer': {'type': 'Sequence', 'normalizers': 1}}", NULL,
               KILN_ERR_FORMAT, "normalizer.normalizers");
    expect_err("nested normalizer",
               "{" MODEL ", 'normalizer': {'type': 'Sequence', 'normalizers': [{'type': 'NFC'}, "
               "{'type': 'Nope'}]}}",
               NULL, KILN_ERR_UNSUPPORTED, "normalizer.normalizers[1].type 'Nope'");
    expect_err("Prepend without text", "{" MODEL ", 'normalizer': {'type': 'Prepend'}}", NULL,
               KILN_ERR_FORMAT, "normalizer.prepend");
    expect_err("Replace bad regex",
               "{" MODEL ", 'normalizer': {'type': 'Replace', 'pattern': {'Regex': '('}, "
               "'content': ''}}",
               NULL, KILN_ERR_FORMAT, "normalizer.pattern.Regex");
    expect_err("pre_tokenizer unknown", "{" MODEL ", 'pre_tokenizer': {'type': 'UnicodeScripts'}}",
               NULL, KILN_ERR_UNSUPPORTED, "pre_tokenizer.type 'UnicodeScripts'");
    expect_err("Split bad regex",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Split', 'pattern': {'Regex': '[a-'}, "
               "'behavior': 'Isolated', 'invert': false}}",
               NULL, KILN_ERR_FORMAT, "pre_tokenizer.pattern.Regex");
    expect_err("Split bad behavior",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Split', 'pattern': {'String': ' '}, "
               "'behavior': 'Sideways', 'invert': false}}",
               NULL, KILN_ERR_FORMAT, "pre_tokenizer.behavior 'Sideways'");
    expect_err("Split no behavior",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Split', 'pattern': {'String': ' '}}}", NULL,
               KILN_ERR_FORMAT, "pre_tokenizer.behavior");
    expect_err("Split pattern shape",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Split', 'pattern': ' ', "
               "'behavior': 'Isolated'}}",
               NULL, KILN_ERR_FORMAT, "pre_tokenizer.pattern");
    expect_err("Metaspace two chars",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Metaspace', 'replacement': 'ab'}}", NULL,
               KILN_ERR_FORMAT, "pre_tokenizer.replacement");
    expect_err("Metaspace scheme",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Metaspace', 'prepend_scheme': 'twice'}}",
               NULL, KILN_ERR_FORMAT, "pre_tokenizer.prepend_scheme 'twice'");
    expect_err("Metaspace contradiction",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Metaspace', 'prepend_scheme': 'always', "
               "'add_prefix_space': false}}",
               NULL, KILN_ERR_FORMAT, "add_prefix_space");
    expect_err("nested pre_tokenizer",
               "{" MODEL ", 'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': "
               "[{'type': 'Digits', 'individual_digits': 3}]}}",
               NULL, KILN_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].individual_digits");
    expect_err("decoder unknown", "{" MODEL ", 'decoder': {'type': 'CTC'}}", NULL,
               KILN_ERR_UNSUPPORTED, "decoder.type 'CTC'");
    expect_err("decoder Strip start",
               "{" MODEL ", 'decoder': {'type': 'Strip', 'content': ' ', 'start': -1}}", NULL,
               KILN_ERR_FORMAT, "decoder.start");
    expect_err("decoders nested",
               "{" MODEL ", 'decoder': {'type': 'Sequence', 'decoders': [{'type': 'Fuse'}, "
               "{'type': 'Replace', 'pattern': {'String': 1}, 'content': ''}]}}",
               NULL, KILN_ERR_FORMAT, "decoder.decoders[1].pattern.String");
    expect_err("post unknown", "{" MODEL ", 'post_processor': {'type': 'Magic'}}", NULL,
               KILN_ERR_UNSUPPORTED, "post_processor.type 'Magic'");
    expect_err("template missing special",
               "{" MODEL ", 'post_processor': {'type': 'TemplateProcessing', "
               "'single': '<s> $A', 'special_tokens': {}}}",
               NULL, KILN_ERR_FORMAT, "'<s>'");
    expect_err("template id out of range",
               "{" MODEL ", 'post_processor': {'type': 'TemplateProcessing', "
               "'single': '<s> $A', 'special_tokens': {'<s>': {'id': '<s>', 'ids': [99]}}}}",
               NULL, KILN_ERR_FORMAT, "post_processor.special_tokens.<s>.ids[0]");
    expect_err("template no sequence",
               "{" MODEL ", 'post_processor': {'type': 'TemplateProcessing', "
               "'single': '<s>', 'special_tokens': {'<s>': {'id': '<s>', 'ids': [0]}}}}",
               NULL, KILN_ERR_UNSUPPORTED, "post_processor.single");
    expect_err("roberta shape",
               "{" MODEL ", 'post_processor': {'type': 'RobertaProcessing', 'sep': 'x', "
               "'cls': ['a', 0]}}",
               NULL, KILN_ERR_FORMAT, "post_processor.sep");
    expect_err("added not array", "{" MODEL ", 'added_tokens': {}}", NULL, KILN_ERR_FORMAT,
               "added_tokens");
    expect_err("added no id", "{" MODEL ", 'added_tokens': [{'content': '<s>'}]}", NULL,
               KILN_ERR_FORMAT, "added_tokens[0].id");
    expect_err("added content type", "{" MODEL ", 'added_tokens': [{'id': 5, 'content': 5}]}", NULL,
               KILN_ERR_FORMAT, "added_tokens[0].content");
    expect_err("added special type",
               "{" MODEL ", 'added_tokens': [{'id': 5, 'content': 'x', 'special': 1}]}", NULL,
               KILN_ERR_FORMAT, "added_tokens[0].special");
    expect_err("added id sparse", "{" MODEL ", 'added_tokens': [{'id': 9000000, 'content': 'x'}]}",
               NULL, KILN_ERR_FORMAT, "sparse");
    expect_err("config bad JSON", "{" MODEL "}", "{'bos_token': ", KILN_ERR_FORMAT,
               "tokenizer_config.json:1:");
    expect_err("config bos number", "{" MODEL "}", "{'bos_token': 3}", KILN_ERR_FORMAT,
               "tokenizer_config.json: bos_token");
    expect_err("config add_bos string", "{" MODEL "}", "{'add_bos_token': 'yes'}", KILN_ERR_FORMAT,
               "add_bos_token");
    expect_err("config chat_template number", "{" MODEL "}", "{'chat_template': 3}",
               KILN_ERR_FORMAT, "chat_template");
    expect_err("config chat_template list", "{" MODEL "}", "{'chat_template': [{'name': 'x'}]}",
               KILN_ERR_FORMAT, "chat_template[0]");
    expect_err("valid", "{" MODEL "}", "{}", KILN_OK, NULL);

    /* Sequences nested 40 deep are refused (bounded recursion) */
    char deep[4096] = "{" MODEL ", 'normalizer': ";
    for (int i = 0; i < 40; i++) strcat(deep, "{'type': 'Sequence', 'normalizers': [");
    strcat(deep, "{'type': 'NFC'}");
    for (int i = 0; i < 40; i++) strcat(deep, "]}");
    strcat(deep, "}");
    expect_err("deep normalizer", deep, NULL, KILN_ERR_FORMAT, "nested");
    snprintf(deep, sizeof deep, "{" MODEL ", 'pre_tokenizer': ");
    for (int i = 0; i < 40; i++) strcat(deep, "{'type': 'Sequence', 'pretokenizers': [");
    strcat(deep, "{'type': 'Digits'}");
    for (int i = 0; i < 40; i++) strcat(deep, "]}");
    strcat(deep, "}");
    expect_err("deep pre_tokenizer", deep, NULL, KILN_ERR_FORMAT, "nested");

    /* arguments */
    kiln_tokenizer *t = NULL;
    kiln_error err = {0};
    CHECK(kiln_tokenizer_from_hf_json(NULL, 0, NULL, 0, &t, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_tokenizer_from_hf_dir(NULL, &t, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_tokenizer_from_hf_files("/nonexistent/tokenizer.json", NULL, &t, &err) ==
              KILN_ERR_NOT_FOUND &&
          strstr(err.message, "/nonexistent/tokenizer.json"));

    /* unk_token not in the vocab: loads, and fails with a message when it is needed */
    char *j = J("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'vocab': {'a': 0}, "
                "'merges': []}}");
    REQUIRE(kiln_tokenizer_from_hf_json(j, strlen(j), NULL, 0, &t, &err) == KILN_OK);
    kiln_ivec ids = {0};
    CHECK(kiln_tokenizer_encode(t, "aa", 2, false, false, &ids, &err) == KILN_OK && ids.n == 2);
    ids.n = 0;
    CHECK(kiln_tokenizer_encode(t, "ab", 2, false, false, &ids, &err) == KILN_ERR_FORMAT &&
          strstr(err.message, "unk_token '<unk>'") && ids.n == 0);
    /* invalid UTF-8 input is refused before the pipeline */
    CHECK(kiln_tokenizer_encode(t, "a\xFF", 2, false, false, &ids, &err) ==
          KILN_ERR_INVALID_ARGUMENT);
    kiln_ivec_free(&ids);
    kiln_tokenizer_destroy(t);
    free(j);
}

/* ---- mutations ----------------------------------------------------------------------------- */

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint32_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void test_mutations(void) {
    char *base =
        J("{'added_tokens': [{'id': 5, 'content': '<s>', 'special': true, 'lstrip': true}, "
          "{'id': 6, 'content': 'ab', 'single_word': true, 'special': false}], "
          "'normalizer': {'type': 'Sequence', 'normalizers': [{'type': 'NFKC'}, "
          "{'type': 'Prepend', 'prepend': '\\u2581'}, {'type': 'Replace', 'pattern': "
          "{'String': ' '}, 'content': '\\u2581'}]}, "
          "'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': [{'type': 'Split', 'pattern': "
          "{'Regex': '\\\\p{N}'}, 'behavior': 'Isolated', 'invert': false}, {'type': 'Metaspace', "
          "'replacement': '\\u2581', 'prepend_scheme': 'first', 'split': true}, {'type': 'Digits', "
          "'individual_digits': true}]}, "
          "'model': {'type': 'BPE', 'unk_token': '<unk>', 'byte_fallback': true, 'fuse_unk': true, "
          "'vocab': {'<unk>': 0, 'a': 1, 'b': 2, 'ab': 3, '<0x41>': 4, '\\u2581': 7, "
          "'\\u2581a': 8}, 'merges': [['a', 'b'], '\\u2581 a']}, "
          "'post_processor': {'type': 'TemplateProcessing', 'single': '<s> $A', "
          "'special_tokens': {'<s>': {'id': '<s>', 'ids': [5], 'tokens': ['<s>']}}}, "
          "'decoder': {'type': 'Sequence', 'decoders': [{'type': 'ByteFallback'}, "
          "{'type': 'Metaspace', 'replacement': '\\u2581'}, {'type': 'Fuse'}, {'type': 'Strip', "
          "'content': ' ', 'start': 1, 'stop': 0}]}}");
    size_t blen = strlen(base);
    kiln_error err = {0};
    kiln_tokenizer *t = NULL;
    REQUIRE(kiln_tokenizer_from_hf_json(base, blen, NULL, 0, &t, &err) == KILN_OK);
    kiln_tokenizer_destroy(t);
    static const char *texts[] = {"ab <s> A1b2", "", " ab", "\xE2\x80\x83x\xEF\xAC\x81 9"};
    char *buf = malloc(blen + 16);
    REQUIRE(buf);
    int loaded = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, base, blen);
        size_t n = blen;
        int edits = 1 + (int)(next_rand() % 3);
        for (int e = 0; e < edits; e++) {
            size_t pos = next_rand() % n;
            static const char alphabet[] = "{}[]\",:0123456789-abtrue null'\\\x80\xE2";
            switch (next_rand() % 4) {
            case 0: /* replace a byte */
                buf[pos] = alphabet[next_rand() % (sizeof alphabet - 1)];
                break;
            case 1: /* delete a byte */
                memmove(buf + pos, buf + pos + 1, n - pos - 1);
                n--;
                break;
            case 2: /* insert a byte */
                memmove(buf + pos + 1, buf + pos, n - pos);
                buf[pos] = alphabet[next_rand() % (sizeof alphabet - 1)];
                n++;
                break;
            default: /* truncate */
                n = pos + 1;
                break;
            }
        }
        t = NULL;
        kiln_status st = kiln_tokenizer_from_hf_json(buf, n, NULL, 0, &t, &err);
        if (st != KILN_OK) {
            CHECK(t == NULL);
            CHECK(st == KILN_ERR_FORMAT || st == KILN_ERR_UNSUPPORTED);
            continue;
        }
        loaded++;
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
            kiln_ivec ids = {0};
            st = kiln_tokenizer_encode(t, texts[k], strlen(texts[k]), true, k & 1, &ids, &err);
            CHECK(st == KILN_OK || st == KILN_ERR_FORMAT);
            kiln_detok *d = NULL;
            REQUIRE(kiln_detok_create(t, &d, &err) == KILN_OK);
            const char *s;
            size_t sl;
            for (size_t i = 0; i < ids.n; i++)
                CHECK(kiln_detok_push(d, ids.data[i], &s, &sl, &err) == KILN_OK);
            CHECK(kiln_detok_flush(d, &s, &sl, &err) == KILN_OK);
            kiln_detok_destroy(d);
            kiln_ivec_free(&ids);
        }
        kiln_tokenizer_destroy(t);
    }
    printf("mutations: 3000 documents, %d loaded\n", loaded);
    free(buf);
    free(base);
}

int main(void) {
    test_errors();
    test_mutations();
    return kiln_test_finish("test_hftok_bad_input");
}
