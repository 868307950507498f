/*
 * fuzz_grammar_regex.c - libFuzzer target for the regex-subset translator (src/grammar/regex.c): any input either compiles or
 * fails with KILN_ERR_INVALID_ARGUMENT and a message; a compiled grammar is then run over a
 * few texts through the recognizer (and the input itself), which must not crash or leak.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 4096) return 0;
    kiln_grammar *g = NULL;
    kiln_error err;
    kiln_status st = kiln_grammar_create(KILN_GRAMMAR_REGEX, (const char *)data, size, &g, &err);
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
