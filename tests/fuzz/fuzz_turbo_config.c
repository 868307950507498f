/*
 * fuzz_turbo_config - libFuzzer target for the TurboQuant config parser
 * (kiln_turbo_config_parse, kv/turboquant.h), which reads --kv-type / --kv-type-k / --kv-type-v
 * text from the command line and the server's options.
 *
 * Oracles: no crash or sanitizer report; a rejection always says why and names the option; an
 * accepted text gives valid specs whose canonical name parses back to the same config.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv/turboquant.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    kiln_turbo_config c, c2;
    kiln_error e = {0};
    if (kiln_turbo_config_parse("--kv-type", s, &c, &e) == KILN_OK) {
        char name[64];
        if (!kiln_turbo_spec_valid(c.k) || !kiln_turbo_spec_valid(c.v)) abort();
        if (kiln_turbo_config_name(&c, name, sizeof name) <= 0) abort();
        if (kiln_turbo_config_parse(NULL, name, &c2, NULL) != KILN_OK) abort();
        if (c.k.bits != c2.k.bits || c.k.qjl != c2.k.qjl || c.v.bits != c2.v.bits ||
            c.v.qjl != c2.v.qjl)
            abort();
    } else {
        if (e.message[0] == '\0' || !strstr(e.message, "--kv-type")) abort();
    }
    free(s);
    return 0;
}
