/*
 * fuzz_msgapi - libFuzzer target for the request translators of POST /v1/messages (Anthropic
 * Messages) and POST /v1/responses (OpenAI Responses): srv_api_translate (api_out.h) on the
 * input's bytes after the first (whose low bit picks the API), against a response store that
 * holds one response (so previous_response_id "resp_seed" and item_reference "msg_seed" /
 * "fc_seed" resolve). A translated request must parse as a chat request or fail with a 400;
 * a refused one must be a 400 or a 404 with a message. The response object is then driven
 * with the input's bytes as reply text and tool-call arguments (stream events, then the whole
 * response), so ASan sees the formatting of arbitrary, invalid UTF-8 text too.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_out.h"
#include "server/openai.h"
#include "server/response_store.h"

static srv_rstore *seed_store(void) {
    srv_rstore *s = srv_rstore_create((size_t)1 << 20, 1e12);
    const char *resp =
        "{\"id\":\"resp_seed\",\"object\":\"response\",\"output\":[{\"id\":\"msg_seed\",\"type\":"
        "\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
        "\"output_text\",\"text\":\"Once\",\"annotations\":[]}]},{\"id\":\"fc_seed\",\"type\":"
        "\"function_call\",\"status\":\"completed\",\"call_id\":\"call_1\",\"name\":\"f\","
        "\"arguments\":\"{}\"}]}";
    const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
                       "\"content\":\"Once\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
                       "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]";
    const char *items[] = {"msg_seed", "fc_seed"};
    if (s) srv_rstore_put(s, "resp_seed", resp, msgs, items, 2, 0.0);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static srv_rstore *store;
    if (!store) store = seed_store();
    if (size < 1) return 0;
    srv_api api = (data[0] & 1) ? SRV_API_RESPONSES : SRV_API_ANTHROPIC;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    srv_api_ctx ctx = {.store = store, .now_s = 1.0};
    char *chat = NULL;
    size_t n = 0;
    srv_api_out *out = NULL;
    srv_error e = {0};
    if (!srv_api_translate(api, body, len, &ctx, &chat, &n, &out, &e)) {
        if (chat || out || !e.message[0] || (e.http_status != 400 && e.http_status != 404))
            __builtin_trap();
        return 0;
    }
    srv_gen g;
    srv_error ge = {0};
    if (!srv_gen_parse(SRV_CHAT, chat, n, 32000, NULL, &g, &ge) && ge.http_status != 400)
        __builtin_trap();
    srv_gen_free(&g);

    out->model = "m";
    out->n_prompt = 3;
    kiln_usage u = {.prompt_tokens = 3, .cached_tokens = 16, .completion_tokens = 2};
    srv_api_end end = {.finish = (data[0] & 2) ? KILN_FINISH_LENGTH : KILN_FINISH_STOP,
                       .usage = &u,
                       .message = "",
                       .tool_calls = NULL};
    srv_buf sb = {0};
    size_t half = len / 2;
    out->ops->start(out, &sb);
    out->ops->text(out, body, half, &sb);
    out->ops->tool_call(out, 0, "call_1", body, half < 16 ? half : 16, &sb);
    out->ops->tool_args(out, 0, body + half, len - half, &sb);
    out->ops->text(out, body + half, len - half, &sb);
    out->ops->end(out, &end, &sb);
    size_t wl = 0;
    free(out->ops->whole(out, body, len, &end, &wl));
    srv_buf_free(&sb);
    srv_api_out_destroy(out);
    free(chat);
    return 0;
}
