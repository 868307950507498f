/* api_out.c - the translation of /v1/messages and /v1/responses requests into chat requests
 * (see api_out.h). */
#include "server/api_out.h"

#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "server/json_util.h"
#include "server/responses.h"

bool srv_api_translate(srv_api api, const char *body, size_t len, const srv_api_ctx *ctx,
                       char **chat, size_t *chat_len, srv_api_out **out, srv_error *e) {
    *chat = NULL;
    *chat_len = 0;
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", len, 0, &je);
    if (!root)
        return srv_bad(e, NULL, "the request body is not valid JSON: %s (line %d, column %d)",
                       je.text, je.line, je.column);
    json_t *c = NULL;
    bool ok = api == SRV_API_ANTHROPIC
                  ? srv_anthropic_translate(root, &c, out, e)
                  : srv_responses_translate(root, ctx ? ctx->store : NULL, ctx ? ctx->now_s : 0,
                                            &c, out, e);
    json_decref(root);
    if (!ok) return false;
    /* exact reals: sampling values and tool schemas pass through unchanged */
    *chat = json_dumps(c, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(c);
    if (!*chat) {
        srv_api_out_destroy(*out);
        *out = NULL;
        return srv_oom(e, "request");
    }
    *chat_len = strlen(*chat);
    return true;
}

void srv_api_out_destroy(srv_api_out *o) {
    if (o) o->ops->destroy(o);
}
