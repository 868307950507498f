/*
 * fuzz_template - libFuzzer target for the chat-template parser and interpreter. The input
 * is template source; whatever parses is rendered against a small chat context (system,
 * user, assistant with a tool call, tool; one tool) with tight limits, so loops, recursion
 * and output growth stay cheap. Properties checked: no crash, leak or sanitizer report;
 * every failure carries a message; every success is valid NUL-terminated output of the
 * reported length.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "template/template.h"

static json_t *ctx;

static const char ctx_json[] =
    "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,"
    "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Weather in Paris? \\u00e9\\\"'\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
    "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"arguments\":{\"city\":\"Paris\"}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"{\\\"temp\\\": 18}\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"description\":\"Get the weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"n\":{\"type\":\"number\",\"default\":1.5}},"
    "\"required\":[\"city\"]}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) {
        json_error_t je;
        ctx = json_loads(ctx_json, 0, &je);
        if (!ctx) __builtin_trap();
    }
    kiln_template *t = NULL;
    kiln_error e;
    e.message[0] = 0;
    if (kiln_template_parse((const char *)data, size, &t, &e) != KILN_OK) {
        if (e.message[0] == '\0' || t) __builtin_trap();
        return 0;
    }
    struct tm now = {.tm_year = 126, .tm_mon = 0, .tm_mday = 15, .tm_hour = 9, .tm_min = 30};
    kiln_template_diag diag;
    kiln_template_options o = {.now = &now,
                               .max_steps = 20000,
                               .max_output = 1 << 20,
                               .max_memory = 64 << 20,
                               .diag = &diag};
    char *out = NULL;
    size_t len = 0;
    e.message[0] = 0;
    if (kiln_template_render(t, ctx, &o, &out, &len, &e) == KILN_OK) {
        if (!out || out[len] != 0 || strlen(out) > len) __builtin_trap();
        free(out);
    } else if (e.message[0] == '\0' || diag.kind == KILN_TEMPLATE_OK) {
        __builtin_trap();
    }
    kiln_template_destroy(t);
    return 0;
}
