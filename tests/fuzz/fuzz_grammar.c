/*
 * fuzz_grammar.c - libFuzzer target for the grammar front ends, one binary per kind: the GBNF
 * parser and compiler (src/grammar/gbnf.c), the regex-subset translator (src/grammar/regex.c)
 * and the JSON Schema converter (src/grammar/schema.c), chosen at compile time by
 * FUZZ_GRAMMAR_KIND (tests/fuzz/CMakeLists.txt). Any input either compiles or fails with
 * KILN_ERR_INVALID_ARGUMENT and a message; a compiled grammar is then run over a few texts
 * through the recognizer (and the input itself), which must not crash or leak.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kiln.h"

#ifndef FUZZ_GRAMMAR_KIND
#error "FUZZ_GRAMMAR_KIND: KILN_GRAMMAR_GBNF, KILN_GRAMMAR_REGEX or KILN_GRAMMAR_JSON_SCHEMA"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 4096) return 0;
    kiln_grammar *g = NULL;
    kiln_error err;
    kiln_status st = kiln_grammar_create(FUZZ_GRAMMAR_KIND, (const char *)data, size, &g, &err);
    if (st != KILN_OK) {
        if (st != KILN_ERR_INVALID_ARGUMENT && st != KILN_ERR_OUT_OF_MEMORY) __builtin_trap();
        if (!err.message[0]) __builtin_trap();
        return 0;
    }
    static const char *texts[] = {"", "a", "{}", "{\"a\":1}", "[1,2]", "\"x\"", "0", "abc123",
                                  "\xc3\xa9", "\xff"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        bool pre, full;
        (void)kiln_grammar_match(g, texts[i], strlen(texts[i]), &pre, &full, &err);
    }
    bool pre, full;
    (void)kiln_grammar_match(g, (const char *)data, size, &pre, &full, &err);
    (void)kiln_grammar_gbnf(g);
    kiln_grammar_destroy(g);
    return 0;
}
