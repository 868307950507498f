/*
 * server.c - the HTTP side of `kiln serve` (see server.h): libmicrohttpd daemon, routing,
 * request bodies, generation requests (whole or SSE), and the graceful shutdown.
 *
 * Threading: libmicrohttpd runs one thread per connection; the access handler, the SSE
 * content reader and the request-completed callback of a connection all run on that thread,
 * so a request's state (srv_req) needs no lock. A generation blocks its connection thread
 * while it waits for engine events; a client that goes away meanwhile is noticed by the
 * disconnect watcher (watch.h), which cancels the stream so the wait ends within one engine
 * step. While a generation runs, the connection's idle timeout is off (the client is not
 * silent, the engine is); it is restored when the request completes.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/anthropic.h"
#include "server/api_out.h"
#include "server/chat_page.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/prompt.h"
#include "server/response_store.h"
#include "server/responses.h"
#include "server/srv_util.h"
#include "server/watch.h"
#include "util/error.h"

#define SRV_DEFAULT_MAX_BODY  ((size_t)8 << 20)
#define SRV_DEFAULT_MAX_CONN  256
#define SRV_DEFAULT_TIMEOUT_S 30
#define SRV_MAX_MODEL_NAMES   16
#define SRV_SSE_BLOCK         (16 * 1024)
#define SRV_WAIT_MS           200
#define SRV_DEFAULT_RESPONSE_STORE_MAX ((size_t)64 << 20)
#define SRV_DEFAULT_RESPONSE_STORE_TTL 3600.0

/* Routes; the values index srv_endpoint_names (metrics.c). */
enum {
    ROUTE_NONE = 0,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_MESSAGES,    /* POST /v1/messages (Anthropic) */
    ROUTE_RESPONSES,   /* POST /v1/responses */
    ROUTE_RESPONSE_ID, /* GET, DELETE /v1/responses/{id} */
    ROUTE_PAGE,        /* GET / : the chat page (chat_page.h) */
};

enum { STATE_LOADING = 0, STATE_READY = 1, STATE_DRAINING = 2 };

struct kiln_server {
    char *host, *api_key, *model_name; /* model_name: the served id, the first name */
    char *names_buf;                   /* every name, NUL-separated; names[] point into it */
    const char *names[SRV_MAX_MODEL_NAMES];
    int32_t n_names;
    size_t max_body;
    int32_t max_conn, timeout_s;
    bool quiet, verbose;
    FILE *log;
    int listen_fd;
    int port;
    struct MHD_Daemon *d;
    int64_t started_at; /* Unix seconds */

    atomic_int state;
    const kiln_model *m;
    kiln_engine *e;
    int32_t n_ctx, n_vocab;
    int32_t kv_blocks_total, block_size;
    bool has_draft; /* the engine has a draft model (speculation.source "draft") */
    srv_chat chat;
    bool tool_override; /* --tool-parser given */
    kiln_tool_format tool_format;
    kiln_generation_defaults gen; /* the model's generation_config.json */

    srv_metrics metrics;
    srv_watch *watch;
    srv_rstore *rstore; /* stored /v1/responses results */
    atomic_bool force_cancel;
    atomic_int in_flight;
    pthread_mutex_t shut_mu;
    bool shut_down;
};

/* One choice of a generation request: its stream and what it produced so far. */
typedef struct srv_choice {
    kiln_stream *stream;
    int64_t watch_h;
    srv_resp_info ri; /* the request's, with this choice's index and tool calls */
    srv_buf text;     /* whole responses: the text */
    srv_buf echo;     /* completions with echo: the prompt's text, sent first */
    srv_tok *toks;    /* tokens with logprobs not yet reported */
    int32_t n_toks, cap_toks;
    int32_t *ids; /* token_ids (a model without a tokenizer) */
    int32_t n_ids, cap_ids;
    int64_t text_offset;
    int32_t n_prompt;   /* echo with logprobs: the prompt's tokens */
    int64_t *prompt_offs; /* echo with logprobs: [n_prompt] each prompt token's text_offset */
    bool echo_pending;  /* streaming echo with logprobs: the echo chunk waits for the prompt's
                           logprobs (PROMPT_LOGPROB events) */
    int32_t n_tokens; /* TOKEN events seen */
    double t_last;
    bool finished;
    kiln_finish_reason finish;
    kiln_usage usage;
    kiln_status fin_status;
    char fin_message[300];
    /* tool calls (chat with tools): the reply's text goes through tp; whole responses
     * collect the calls in tool_calls ({id, type, function: {name, arguments}}), the current
     * call's arguments in args */
    kiln_tool_parser *tp;
    json_t *tool_calls;
    srv_buf args;
} srv_choice;

typedef struct srv_req {
    kiln_server *s;
    struct MHD_Connection *conn;
    int route;
    char method[12];
    char path[160];
    char id[64];
    double t_start;
    srv_buf body;
    bool too_large;
    bool checked;
    bool responded;
    int status;
    char err_msg[200];

    /* generation */
    bool is_gen;
    srv_gen gen;
    srv_api_out *api; /* /v1/messages, /v1/responses: their own response shapes (api_out.h) */
    srv_resp_info ri;
    srv_choice *ch; /* [n_ch]: n choices per prompt, prompt-major (index = prompt * n + j) */
    int32_t n_ch;
    int32_t rr; /* the choice read first next time (streams read them in turn) */
    kiln_grammar *tool_grammar; /* tool_choice required / named, until submitted */
    bool counted; /* in s->in_flight */
    int32_t n_prompt; /* prompt tokens, every prompt once */
    int32_t n_tokens; /* TOKEN events seen, all choices */
    double t_first;
    bool finished; /* every choice finished (or a stream ended on an error) */
    bool errored;  /* a stream sent an error event */
    bool client_gone, timeout_off;
    kiln_finish_reason finish; /* the first error or cancellation, else choice 0's */
    kiln_usage usage;          /* summed over the choices (sum_usage) */
    kiln_status fin_status;
    char fin_message[300];

    /* SSE */
    srv_buf out;
    size_t out_off;
} srv_req;

/* ------------------------------------------------------------------------------------ */
/* Logging.                                                                              */

static void srv_log(kiln_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void srv_log(kiln_server *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    flockfile(s->log);
    fputs("kiln serve: ", s->log);
    vfprintf(s->log, fmt, ap);
    fputc('\n', s->log);
    funlockfile(s->log);
    fflush(s->log);
    va_end(ap);
}

static void mhd_logger(void *cls, const char *fmt, va_list ap) {
    kiln_server *s = cls;
    if (!s->verbose) return;
    flockfile(s->log);
    fputs("kiln serve: http: ", s->log);
    vfprintf(s->log, fmt, ap);
    funlockfile(s->log);
    fflush(s->log);
}

/* ------------------------------------------------------------------------------------ */
/* Responses.                                                                            */

static enum MHD_Result queue_body(srv_req *r, int status, const char *ctype, char *body, size_t len,
                                  bool close) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (close) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->responded = true;
    r->status = status;
    return ret;
}

static enum MHD_Result queue_json(srv_req *r, int status, json_t *j) {
    size_t len = 0;
    char *s = j ? srv_json_dump(j, &len) : NULL;
    json_decref(j);
    return queue_body(r, status, "application/json", s, len, false);
}

static enum MHD_Result queue_error(srv_req *r, const srv_error *e) {
    size_t len = 0;
    char *s = r->route == ROUTE_MESSAGES ? srv_anthropic_error_json(e, &len)
                                         : srv_error_json(e, &len);
    snprintf(r->err_msg, sizeof r->err_msg, "%.190s", e->message);
    /* After a 413 or an early answer the unread body makes the connection unusable. */
    bool close = e->http_status == 413 || atomic_load(&r->s->state) == STATE_DRAINING;
    return queue_body(r, e->http_status, "application/json", s, len, close);
}

static enum MHD_Result fail(srv_req *r, int status, const char *type, const char *code,
                            const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(srv_req *r, int status, const char *type, const char *code,
                            const char *param, const char *fmt, ...) {
    srv_error e = {.http_status = status, .type = type, .code = code};
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return queue_error(r, &e);
}

/* ------------------------------------------------------------------------------------ */
/* Simple routes.                                                                        */

static json_t *model_object(kiln_server *s) {
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->started_at, "owned_by", "kiln", "max_model_len", s->n_ctx);
}

/* Whether `name` is the served id or one of its aliases (--model-name). */
static bool model_known(const kiln_server *s, const char *name) {
    for (int32_t i = 0; i < s->n_names; i++)
        if (!strcmp(name, s->names[i])) return true;
    return false;
}

/* Split "a,b, c" into s->names (trimmed, empties dropped, at most SRV_MAX_MODEL_NAMES); the
 * first is the served id (s->model_name). False on allocation failure. */
static bool split_model_names(kiln_server *s, const char *spec) {
    s->names_buf = strdup(spec && spec[0] ? spec : "kiln");
    if (!s->names_buf) return false;
    for (char *p = s->names_buf; *p && s->n_names < SRV_MAX_MODEL_NAMES;) {
        char *end = strchr(p, ',');
        if (end) *end = '\0';
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strlen(p);
        while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t')) p[--n] = '\0';
        if (n > 0) s->names[s->n_names++] = p;
        if (!end) break;
        p = end + 1;
    }
    if (s->n_names == 0) s->names[s->n_names++] = "kiln";
    s->model_name = strdup(s->names[0]);
    return s->model_name != NULL;
}

static enum MHD_Result route_models(srv_req *r, const char *url) {
    kiln_server *s = r->s;
    const char *sub = url + strlen("/v1/models");
    if (*sub == '/' && sub[1]) {
        if (!model_known(s, sub + 1))
            return fail(r, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%.100s' does not exist", sub + 1);
        return queue_json(r, 200, model_object(s));
    }
    return queue_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(s)));
}

static enum MHD_Result route_page(srv_req *r) {
    struct MHD_Response *resp = srv_chat_page_response();
    if (!resp) return MHD_NO;
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->responded = true;
    r->status = 200;
    return ret;
}

static enum MHD_Result route_health(srv_req *r) {
    int st = atomic_load(&r->s->state);
    const char *what = st == STATE_READY ? "ok" : st == STATE_LOADING ? "loading" : "draining";
    return queue_json(r, st == STATE_READY ? 200 : 503, json_pack("{s:s}", "status", what));
}

static enum MHD_Result route_metrics(srv_req *r) {
    kiln_server *s = r->s;
    kiln_engine_stats st;
    bool ready = atomic_load(&s->state) != STATE_LOADING;
    if (ready) kiln_engine_get_stats(s->e, &st);
    srv_buf b = {0};
    srv_metrics_render(&s->metrics, ready ? &st : NULL, &b);
    srv_buf_addf(&b,
                 "# HELP kiln_server_requests_in_flight Generation requests being served.\n"
                 "# TYPE kiln_server_requests_in_flight gauge\n"
                 "kiln_server_requests_in_flight %d\n",
                 atomic_load(&s->in_flight));
    int64_t n_stored = 0;
    size_t stored_bytes = 0;
    srv_rstore_stats(s->rstore, &n_stored, &stored_bytes);
    srv_buf_addf(&b,
                 "# HELP kiln_response_store_entries Stored /v1/responses results.\n"
                 "# TYPE kiln_response_store_entries gauge\n"
                 "kiln_response_store_entries %lld\n"
                 "# HELP kiln_response_store_bytes Bytes of stored /v1/responses results.\n"
                 "# TYPE kiln_response_store_bytes gauge\n"
                 "kiln_response_store_bytes %zu\n",
                 (long long)n_stored, stored_bytes);
    if (b.oom) {
        srv_buf_free(&b);
        return fail(r, 500, "server_error", NULL, NULL, "out of memory (metrics)");
    }
    char *p = b.p;
    size_t n = b.len;
    if (!p) return MHD_NO;
    return queue_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", p, n, false);
}

static enum MHD_Result route_tokenize(srv_req *r) {
    kiln_server *s = r->s;
    srv_error e = {0};
    srv_gen g;
    json_error_t je;
    json_t *root = json_loadb(r->body.p ? r->body.p : "", r->body.len, 0, &je);
    bool chat = root && json_is_object(root) && json_object_get(root, "messages");
    json_decref(root);
    bool ok = srv_gen_parse(chat ? SRV_CHAT : SRV_COMPLETION, r->body.p, r->body.len, s->n_vocab,
                            NULL, &g, &e);
    int32_t *ids = NULL, n = 0;
    if (ok && g.n_prompts > 1)
        ok = srv_fail(&e, 400, "invalid_request_error", NULL, "prompt",
                      "/tokenize takes one prompt (got a batch of %d)", g.n_prompts);
    if (ok) ok = srv_prompt_ids(&s->chat, s->m, &g, &ids, &n, &e);
    if (!ok) {
        srv_gen_free(&g);
        return queue_error(r, &e);
    }
    bool strs = json_is_true(json_object_get(g.root, "return_token_strs"));
    json_t *arr = json_array(), *sarr = strs ? json_array() : NULL;
    for (int32_t i = 0; arr && i < n; i++) {
        json_array_append_new(arr, json_integer(ids[i]));
        if (sarr) {
            char buf[256];
            size_t len = kiln_model_token_piece(s->m, ids[i], buf, sizeof buf);
            srv_buf rb = {0};
            srv_utf8_repair(buf, len < sizeof buf ? len : sizeof buf, &rb);
            json_array_append_new(sarr, json_stringn(rb.p ? rb.p : "", rb.len));
            srv_buf_free(&rb);
        }
    }
    free(ids);
    srv_gen_free(&g);
    json_t *o = json_pack("{s:i, s:i, s:o?}", "count", n, "max_model_len", s->n_ctx, "tokens", arr);
    if (o && sarr)
        json_object_set_new(o, "token_strs", sarr);
    else
        json_decref(sarr);
    return queue_json(r, 200, o);
}

static enum MHD_Result route_detokenize(srv_req *r) {
    kiln_server *s = r->s;
    json_error_t je;
    json_t *root = json_loadb(r->body.p ? r->body.p : "", r->body.len, 0, &je);
    if (!root)
        return fail(r, 400, "invalid_request_error", NULL, NULL,
                    "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                    je.column);
    json_t *toks = json_is_object(root) ? json_object_get(root, "tokens") : NULL;
    if (!json_is_array(toks)) {
        json_decref(root);
        return fail(r, 400, "invalid_request_error", NULL, "tokens",
                    "'tokens' must be an array of token ids");
    }
    if (!kiln_model_has_tokenizer(s->m)) {
        json_decref(root);
        return fail(r, 400, "invalid_request_error", NULL, NULL, "the model has no tokenizer");
    }
    size_t n = json_array_size(toks);
    if (n > INT32_MAX) {
        json_decref(root);
        return fail(r, 400, "invalid_request_error", NULL, "tokens", "'tokens' is too long");
    }
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    char *text = NULL;
    kiln_error err = {0};
    enum MHD_Result ret;
    if (!ids) {
        ret = fail(r, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(toks, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) >= s->n_vocab) {
            ret = fail(r, 400, "invalid_request_error", NULL, "tokens",
                       "'tokens' element %zu is not a token id in [0, %d)", i, s->n_vocab);
            goto done;
        }
        ids[i] = (int32_t)json_integer_value(t);
    }
    size_t len = 0; /* first the length, then the text */
    if (kiln_model_detokenize(s->m, ids, (int32_t)n, NULL, 0, &len, &err) != KILN_OK ||
        !(text = malloc(len + 1)) ||
        kiln_model_detokenize(s->m, ids, (int32_t)n, text, len, &len, &err) != KILN_OK) {
        ret = fail(r, 500, "server_error", NULL, NULL, "%s",
                   err.message[0] ? err.message : "out of memory");
        goto done;
    }
    srv_buf fixed = {0};
    srv_utf8_repair(text, len, &fixed);
    ret = queue_json(r, 200, json_pack("{s:s%}", "prompt", fixed.p ? fixed.p : "", fixed.len));
    srv_buf_free(&fixed);
done:
    free(ids);
    free(text);
    json_decref(root);
    return ret;
}

/* GET /v1/responses/{id} (the stored response) and DELETE /v1/responses/{id}. */
static enum MHD_Result route_response_id(srv_req *r, const char *url) {
    const char *id = url + strlen("/v1/responses/");
    srv_error e = {0};
    size_t len = 0;
    double now = srv_now_ms() / 1e3;
    char *body = !strcmp(r->method, "DELETE") ? srv_responses_delete(r->s->rstore, id, now, &len, &e)
                                              : srv_responses_get(r->s->rstore, id, now, &len, &e);
    if (!body) return queue_error(r, &e);
    return queue_body(r, 200, "application/json", body, len, false);
}

/* ------------------------------------------------------------------------------------ */
/* Generation.                                                                           */

static bool push_tok(srv_choice *c, const kiln_event *ev) {
    if (c->n_toks == c->cap_toks) {
        int32_t cap = c->cap_toks ? c->cap_toks * 2 : 64;
        srv_tok *t = realloc(c->toks, (size_t)cap * sizeof *t);
        if (!t) return false;
        c->toks = t;
        c->cap_toks = cap;
    }
    srv_tok *t = &c->toks[c->n_toks++];
    memset(t, 0, sizeof *t);
    t->token = ev->token;
    t->logprob = ev->logprob;
    t->n_top = ev->n_top_logprobs;
    if (t->n_top > KILN_MAX_TOP_LOGPROBS) t->n_top = KILN_MAX_TOP_LOGPROBS;
    if (t->n_top > 0) memcpy(t->top, ev->top_logprobs, (size_t)t->n_top * sizeof t->top[0]);
    return true;
}

static bool push_id(srv_choice *c, int32_t id) {
    if (c->n_ids == c->cap_ids) {
        int32_t cap = c->cap_ids ? c->cap_ids * 2 : 64;
        int32_t *t = realloc(c->ids, (size_t)cap * sizeof *t);
        if (!t) return false;
        c->ids = t;
        c->cap_ids = cap;
    }
    c->ids[c->n_ids++] = id;
    return true;
}

static void choice_free(srv_choice *c) {
    srv_buf_free(&c->text);
    srv_buf_free(&c->args);
    kiln_tool_parser_destroy(c->tp);
    json_decref(c->tool_calls);
    free(c->toks);
    free(c->ids);
    free(c->prompt_offs);
    memset(c, 0, sizeof *c);
}

/* The finished arguments of the last call of a whole response. */
static bool tool_args_close(srv_choice *c) {
    size_t n = json_array_size(c->tool_calls);
    if (n == 0) return true;
    json_t *fn = json_object_get(json_array_get(c->tool_calls, n - 1), "function");
    json_t *a = json_stringn(c->args.p ? c->args.p : "", c->args.len);
    srv_buf_reset(&c->args);
    return a && json_object_set_new(fn, "arguments", a) == 0;
}

/* Reply text through the tool-call parser (finish: the reply ended): content goes where text
 * goes; calls become SSE tool_calls deltas (streams) or c->tool_calls (whole responses). */
static bool tool_text(srv_req *r, srv_choice *c, const char *text, size_t len, bool finish) {
    kiln_error err = {0};
    kiln_status st = finish ? kiln_tool_parser_finish(c->tp, &err)
                            : kiln_tool_parser_feed(c->tp, text, len, &err);
    if (st) return false;
    kiln_tool_event te;
    while (kiln_tool_parser_next(c->tp, &te)) {
        switch (te.type) {
        case KILN_TOOL_EVENT_CONTENT:
            if (!r->gen.stream) {
                if (!srv_buf_add(&c->text, te.text, te.len)) return false;
            } else if (r->api) {
                if (!r->api->ops->text(r->api, te.text, te.len, &r->out)) return false;
            } else {
                bool ok = srv_sse_text(&c->ri, te.text, te.len, c->toks, c->n_toks,
                                       &c->text_offset, &r->out);
                c->n_toks = 0;
                if (!ok) return false;
            }
            break;
        case KILN_TOOL_EVENT_CALL:
            if (!r->gen.stream) {
                if (!tool_args_close(c)) return false;
                json_t *call = json_pack("{s:s, s:s, s:{s:s%, s:s}}", "id", te.id, "type",
                                         "function", "function", "name", te.name, te.name_len,
                                         "arguments", "");
                if (!call || json_array_append_new(c->tool_calls, call)) return false;
            } else if (r->api) {
                if (!r->api->ops->tool_call(r->api, te.index, te.id, te.name, te.name_len,
                                            &r->out))
                    return false;
            } else {
                c->ri.n_tool_calls++;
                if (!srv_sse_tool_call(&c->ri, te.index, te.id, te.name, NULL, 0, &r->out))
                    return false;
            }
            break;
        case KILN_TOOL_EVENT_ARGUMENTS:
            if (!r->gen.stream) {
                if (!srv_buf_add(&c->args, te.text, te.len)) return false;
            } else if (r->api) {
                if (!r->api->ops->tool_args(r->api, te.index, te.text, te.len, &r->out))
                    return false;
            } else if (!srv_sse_tool_call(&c->ri, te.index, NULL, NULL, te.text, te.len, &r->out)) {
                return false;
            }
            break;
        }
    }
    return !finish || r->gen.stream || tool_args_close(c);
}

/* Usage over every choice: completion tokens (and speculation counters) summed, each
 * prompt's tokens counted once (from its first choice). */
static void sum_usage(srv_req *r) {
    kiln_usage u = {0};
    for (int32_t i = 0; i < r->n_ch; i++) {
        const kiln_usage *c = &r->ch[i].usage;
        if (i % r->gen.n == 0) {
            u.prompt_tokens += c->prompt_tokens;
            u.cached_tokens += c->cached_tokens;
        }
        u.completion_tokens += c->completion_tokens;
        u.spec_drafted += c->spec_drafted;
        u.spec_accepted += c->spec_accepted;
        u.spec_verify_steps += c->spec_verify_steps;
        u.fill_tokens += c->fill_tokens;
        u.accepted_prediction_tokens += c->accepted_prediction_tokens;
        u.rejected_prediction_tokens += c->rejected_prediction_tokens;
    }
    r->usage = u;
}

/* Take one event of choice c into the request's state; for streams, append its SSE chunks to
 * r->out. Returns false on allocation failure. */
/* Characters of the text of ids[0..n) (kiln_model_detokenize); -1 on failure. */
static int64_t detok_chars(const kiln_model *m, const int32_t *ids, int32_t n) {
    char buf[512];
    size_t len = 0;
    kiln_error err = {0};
    if (kiln_model_detokenize(m, ids, n, buf, sizeof buf, &len, &err) != KILN_OK) return -1;
    if (len <= sizeof buf) return srv_utf8_count(buf, len);
    char *heap = malloc(len);
    int64_t c = heap && kiln_model_detokenize(m, ids, n, heap, len, &len, &err) == KILN_OK
                    ? srv_utf8_count(heap, len)
                    : -1;
    free(heap);
    return c;
}

/* Echo with logprobs: offs[i] = where prompt token i's text starts in the prompt's text (in
 * characters, as text_offset counts), so the offsets agree with the echoed text: control
 * tokens take no characters and SPM's leading space is dropped at the start, as
 * kiln_model_detokenize spells it. Token i - 1's share is the text it adds after a context of
 * up to 4 tokens (enough to finish a split character), so the cost is O(n). NULL on failure. */
static int64_t *prompt_offsets(const kiln_model *m, const int32_t *ids, int32_t n) {
    int64_t *offs = malloc((size_t)(n > 0 ? n : 1) * sizeof *offs);
    if (!offs) return NULL;
    if (n > 0) offs[0] = 0;
    for (int32_t i = 1; i < n; i++) {
        const int32_t a = i - 1 > 4 ? i - 1 - 4 : 0; /* context: ids[a .. i - 1) */
        int64_t with = detok_chars(m, ids + a, i - a), without = detok_chars(m, ids + a, i - 1 - a);
        if (with < 0 || without < 0) {
            free(offs);
            return NULL;
        }
        offs[i] = offs[i - 1] + (with > without ? with - without : 0);
    }
    return offs;
}

/* Streaming echo with logprobs: the echoed prompt's chunk, with the prompt's logprobs. */
static bool flush_echo(srv_req *r, srv_choice *c) {
    if (!c->echo_pending || !r->gen.stream) return true;
    c->echo_pending = false;
    bool ok = srv_sse_text(&c->ri, c->echo.p ? c->echo.p : "", c->echo.len, c->toks, c->n_toks,
                           &c->text_offset, &r->out);
    c->n_toks = 0;
    return ok;
}

static bool take_event(srv_req *r, srv_choice *c, const kiln_event *ev) {
    kiln_server *s = r->s;
    double now = srv_now_ms();
    if (ev->type == KILN_EVENT_PROMPT_LOGPROB) {
        if (ev->index < 1 || ev->index >= c->n_prompt || !push_tok(c, ev)) return false;
        c->toks[c->n_toks - 1].has_offset = true;
        c->toks[c->n_toks - 1].offset = c->prompt_offs[ev->index];
        return ev->index + 1 < c->n_prompt || flush_echo(r, c); /* the prompt's last */
    }
    if (!flush_echo(r, c)) return false; /* a prompt of one token, or an early finish */
    switch (ev->type) {
    case KILN_EVENT_TOKEN:
        if (r->n_tokens == 0) {
            r->t_first = now;
            srv_metrics_ttft(&s->metrics, (now - r->t_start) / 1e3);
        } else if (c->n_tokens > 0) {
            srv_metrics_itl(&s->metrics, (now - c->t_last) / 1e3);
        }
        c->t_last = now;
        c->n_tokens++;
        r->n_tokens++;
        if (r->api && r->api->ops->token) r->api->ops->token(r->api, ev->token);
        if (c->ri.token_ids) {
            if (!push_id(c, ev->token)) return false;
            if (r->gen.stream && !r->api && !srv_sse_ids(&c->ri, &ev->token, 1, &r->out))
                return false;
        }
        if (r->gen.logprobs) return push_tok(c, ev);
        return true;
    case KILN_EVENT_TEXT:
        if (c->tp) return tool_text(r, c, ev->text, ev->text_len, false);
        if (!r->gen.stream) return srv_buf_add(&c->text, ev->text, ev->text_len);
        if (r->api) return r->api->ops->text(r->api, ev->text, ev->text_len, &r->out);
        {
            bool ok = srv_sse_text(&c->ri, ev->text, ev->text_len, c->toks, c->n_toks,
                                   &c->text_offset, &r->out);
            c->n_toks = 0;
            return ok;
        }
    case KILN_EVENT_FINISH: {
        if (c->tp && !tool_text(r, c, NULL, 0, true)) return false;
        c->finished = true;
        c->finish = ev->finish_reason;
        c->usage = ev->usage;
        c->fin_status = ev->status;
        snprintf(c->fin_message, sizeof c->fin_message, "%s", ev->message ? ev->message : "");
        if (ev->finish_reason == KILN_FINISH_CANCELLED && srv_watch_hungup(s->watch, c->watch_h))
            r->client_gone = true;
        {
            /* a prompt's tokens count once, with its first choice */
            const bool first = r->gen.n <= 1 || c->ri.index % r->gen.n == 0;
            srv_metrics_generation(&s->metrics, first ? ev->usage.prompt_tokens : 0,
                                   first ? ev->usage.cached_tokens : 0, ev->usage.completion_tokens,
                                   ev->finish_reason, (now - r->t_start) / 1e3);
        }
        /* the request's finish: the first error or cancellation, else choice 0's */
        if (c == &r->ch[0] || ev->finish_reason == KILN_FINISH_ERROR ||
            (ev->finish_reason == KILN_FINISH_CANCELLED && r->finish != KILN_FINISH_ERROR)) {
            r->finish = ev->finish_reason;
            r->fin_status = ev->status;
            snprintf(r->fin_message, sizeof r->fin_message, "%s", c->fin_message);
        }
        bool all = true;
        for (int32_t i = 0; i < r->n_ch; i++) all = all && r->ch[i].finished;
        if (all) sum_usage(r);
        if (r->gen.stream && !r->client_gone && r->api) {
            r->finished = all;
            srv_api_end end = {r->finish, &r->usage, r->fin_message, NULL};
            return !all || r->api->ops->end(r->api, &end, &r->out);
        }
        bool ok = true;
        if (r->gen.stream && !r->client_gone && !r->errored) {
            if (ev->finish_reason == KILN_FINISH_ERROR) {
                srv_error e = {.http_status = 500, .type = "server_error"};
                snprintf(e.message, sizeof e.message, "%s", c->fin_message);
                r->errored = true; /* one error ends the whole stream */
                ok = srv_sse_error(&e, &r->out) && srv_sse_done(&r->out);
            } else {
                int64_t off = c->text_offset;
                ok = srv_sse_finish(&c->ri, c->finish, c->toks, c->n_toks, &off, &r->out);
                c->n_toks = 0;
                if (ok && all)
                    ok = srv_sse_usage(&r->ri, &r->usage, &r->out) && srv_sse_done(&r->out);
            }
        }
        r->finished = all || r->errored;
        return ok;
    }
    default:
        return true;
    }
}

/* Wait for choice c's next event (timeout_ms < 0: until one comes). False when none came. */
static bool next_event(srv_req *r, srv_choice *c, int64_t timeout_ms, kiln_event *ev) {
    kiln_server *s = r->s;
    for (;;) {
        kiln_error err = {0};
        int64_t t = timeout_ms < 0 || timeout_ms > SRV_WAIT_MS ? SRV_WAIT_MS : timeout_ms;
        if (kiln_stream_next(c->stream, t, ev, &err) != KILN_OK) return false;
        if (ev->type != KILN_EVENT_NONE) return true;
        if (kiln_stream_finished(c->stream) && c->finished) return false;
        if (atomic_load(&s->force_cancel)) kiln_stream_cancel(c->stream);
        if (timeout_ms >= 0) return false;
    }
}

/* The next event of any unfinished choice, in turn (*which: its choice); waits up to
 * timeout_ms (< 0: until one comes). False when none came or a read failed. */
static bool next_any(srv_req *r, int64_t timeout_ms, kiln_event *ev, srv_choice **which) {
    if (r->n_ch == 1) {
        *which = &r->ch[0];
        return !r->ch[0].finished && next_event(r, &r->ch[0], timeout_ms, ev);
    }
    for (;;) {
        srv_choice *wait = NULL;
        for (int32_t k = 0; k < r->n_ch; k++) {
            srv_choice *c = &r->ch[(r->rr + k) % r->n_ch];
            if (c->finished) continue;
            if (!wait) wait = c;
            if (next_event(r, c, 0, ev)) {
                r->rr = (int32_t)(c - r->ch + 1) % r->n_ch;
                *which = c;
                return true;
            }
        }
        if (!wait || timeout_ms == 0) return false;
        /* nothing ready: wait a little on the first unfinished choice */
        if (next_event(r, wait, 5, ev)) {
            *which = wait;
            return true;
        }
        if (atomic_load(&r->s->force_cancel))
            for (int32_t k = 0; k < r->n_ch; k++) kiln_stream_cancel(r->ch[k].stream);
        if (timeout_ms > 0) return false;
    }
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_req *r = cls;
    (void)pos;
    for (;;) {
        if (r->client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r->out.len > r->out_off) {
            size_t n = r->out.len - r->out_off;
            if (n > max) n = max;
            memcpy(buf, r->out.p + r->out_off, n);
            r->out_off += n;
            if (r->out_off == r->out.len) {
                srv_buf_reset(&r->out);
                r->out_off = 0;
            }
            return (ssize_t)n;
        }
        if (r->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        kiln_event ev;
        srv_choice *c;
        if (!next_any(r, -1, &ev, &c)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!take_event(r, c, &ev)) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* Batch what is already there (one write for several tokens under load). */
        while (!r->finished && r->out.len < SRV_SSE_BLOCK && next_any(r, 0, &ev, &c))
            if (!take_event(r, c, &ev)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static enum MHD_Result finish_error(srv_req *r) {
    if (r->fin_status == KILN_ERR_CONTEXT_OVER_BUDGET)
        return fail(r, 400, "invalid_request_error", "context_over_budget", NULL, "%s",
                    r->fin_message);
    return fail(r, 500, "server_error", NULL, NULL, "%s",
                r->fin_message[0] ? r->fin_message : "generation failed");
}

static enum MHD_Result route_generate(srv_req *r) {
    kiln_server *s = r->s;
    srv_kind kind = r->route == ROUTE_COMPLETIONS ? SRV_COMPLETION : SRV_CHAT;
    srv_error e = {0};
    r->is_gen = true;
    const char *in = r->body.p;
    size_t in_len = r->body.len;
    char *chat = NULL; /* /v1/messages, /v1/responses: the request as a chat request */
    if (r->route == ROUTE_MESSAGES || r->route == ROUTE_RESPONSES) {
        srv_api_ctx ctx = {.store = s->rstore, .now_s = srv_now_ms() / 1e3};
        if (!srv_api_translate(r->route == ROUTE_MESSAGES ? SRV_API_ANTHROPIC : SRV_API_RESPONSES,
                               in, in_len, &ctx, &chat, &in_len, &r->api, &e))
            return queue_error(r, &e);
        in = chat;
    }
    bool parsed = srv_gen_parse(kind, in, in_len, s->n_vocab, &s->gen, &r->gen, &e);
    free(chat);
    if (!parsed) return queue_error(r, &e);
    json_t *mj = json_object_get(r->gen.root, "model");
    if (!r->api && mj && !json_is_null(mj)) {
        /* OpenAI (and vLLM) answer an unknown model with 404 model_not_found */
        if (!json_is_string(mj))
            return fail(r, 400, "invalid_request_error", NULL, "model",
                        "'model' must be a string naming the served model '%s'", s->model_name);
        if (!model_known(s, json_string_value(mj)))
            return fail(r, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%.100s' does not exist; this server serves '%s' (GET "
                        "/v1/models)",
                        json_string_value(mj), s->model_name);
    }
    srv_gen *g = &r->gen;
    if (!srv_gen_check_engine(g, s->has_draft, &e)) return queue_error(r, &e);
    if (r->api) g->n = 1; /* /v1/messages, /v1/responses: one reply */
    if (g->n_prompts < 1) g->n_prompts = 1;
    r->n_ch = g->n * g->n_prompts;
    r->ch = calloc((size_t)r->n_ch, sizeof *r->ch);
    if (!r->ch) return fail(r, 500, "server_error", NULL, NULL, "out of memory (choices)");
    for (int32_t i = 0; i < r->n_ch; i++) r->ch[i].watch_h = -1;
    bool want_tp = false;
    kiln_grammar *tool_grammar = NULL;
    if (r->api) {
        snprintf(r->id, sizeof r->id, "%s", r->api->id);
        r->api->model = s->model_name;
        r->api->m = s->m;
        r->api->created = (int64_t)time(NULL);
    } else {
        srv_make_id(kind == SRV_CHAT ? "chatcmpl-" : "cmpl-", r->id, sizeof r->id);
    }
    r->ri = (srv_resp_info){.kind = kind,
                            .id = r->id,
                            .created = (int64_t)time(NULL),
                            .model = s->model_name,
                            .m = s->m,
                            .logprobs = g->logprobs,
                            .top_logprobs = g->top_logprobs,
                            .include_usage = g->include_usage};
    if (kind == SRV_CHAT && g->tc.choice != SRV_TOOLS_NONE &&
        s->chat.tool_format != KILN_TOOL_FORMAT_NONE) {
        want_tp = true;
        /* markers that are control tokens (<|python_tag|>, [TOOL_CALLS]) must reach the parser */
        g->req.render_special = true;
    }
    r->ri.token_ids = kind == SRV_COMPLETION && !kiln_model_has_tokenizer(s->m);
    if (kind == SRV_CHAT &&
        (g->tc.choice == SRV_TOOLS_REQUIRED || g->tc.choice == SRV_TOOLS_NAMED)) {
        /* the reply must be a call: the grammar of the family's markup around the arguments'
         * schema (srv_tools_grammar) */
        char *gbnf = NULL;
        kiln_error gerr = {0};
        if (s->chat.tool_format == KILN_TOOL_FORMAT_NONE) {
            return fail(r, 400, "invalid_request_error", NULL, "tool_choice",
                        "'tool_choice' %s needs a tool-call parser, and this server runs with "
                        "--tool-parser none",
                        g->tc.choice == SRV_TOOLS_REQUIRED ? "\"required\"" : "naming a function");
        }
        if (g->req.grammar) {
            return fail(r, 400, "invalid_request_error", NULL, "tool_choice",
                        "'tool_choice' %s constrains the reply to a tool call: it cannot be "
                        "combined with another grammar (response_format, grammar, guided_*)",
                        g->tc.choice == SRV_TOOLS_REQUIRED ? "\"required\"" : "naming a function");
        }
        if (!srv_tools_grammar(&g->tc, s->chat.tool_format, &gbnf, &e)) {
            return queue_error(r, &e);
        }
        kiln_status gst = kiln_grammar_create(KILN_GRAMMAR_GBNF, gbnf, 0, &tool_grammar, &gerr);
        free(gbnf);
        if (gst) {
            if (gst == KILN_ERR_OUT_OF_MEMORY)
                return fail(r, 500, "server_error", NULL, NULL, "out of memory (grammar)");
            return fail(r, 400, "invalid_request_error", NULL, "tools",
                        "the tools' parameters cannot constrain the call: %s", gerr.message);
        }
        r->tool_grammar = tool_grammar;
        g->req.grammar = tool_grammar;
    }

    for (int32_t pi = 0; pi < g->n_prompts; pi++) {
        if (!srv_gen_use_prompt(g, pi, s->n_vocab, &e)) return queue_error(r, &e);
        srv_prompt pr;
        if (!srv_prompt_build(&s->chat, s->m, g, true, &pr, &e)) return queue_error(r, &e);
        const int32_t n = pr.n; /* a chat assistant prefill counts as prompt tokens (fill_hidden) */
        r->n_prompt += n;

        /* Budget: prompt + max_tokens - 1 positions must fit the context and the KV pool. */
        int64_t pool = (int64_t)s->kv_blocks_total * s->block_size;
        int64_t limit = pool < s->n_ctx ? pool : s->n_ctx;
        int64_t max_tokens = g->req.max_tokens;
        if (!g->max_tokens_set) {
            max_tokens = limit - n + 1;
            /* OpenAI's default of 16 generated tokens, after an asserted fill's own tokens (which
             * count towards max_tokens): its continuation ids, else the fill tokenized alone as
             * the engine will (a default only: the engine checks the real count) */
            int64_t dflt = 16;
            if (kind == SRV_COMPLETION && g->has_fill && g->req.fill_policy == KILN_FILL_ASSERT) {
                if (pr.fill_ids) {
                    dflt += pr.n_fill;
                } else {
                    int32_t *fids = NULL, nf = 0;
                    srv_error fe = {0};
                    if (srv_tokenize(s->m, g->req.fill, g->req.fill_len, false, false, &fids, &nf,
                                     &fe))
                        dflt += nf;
                    free(fids);
                }
            }
            if (kind == SRV_COMPLETION && max_tokens > dflt) max_tokens = dflt;
        }
        int64_t need = (int64_t)n + (max_tokens > 0 ? max_tokens : 1) - 1;
        if (max_tokens < 1 || need > s->n_ctx) {
            srv_prompt_free(&pr);
            return fail(r, 400, "invalid_request_error", "context_over_budget",
                        g->max_tokens_set && n <= s->n_ctx ? "max_tokens"
                        : kind == SRV_CHAT                 ? "messages"
                                                           : "prompt",
                        "This model's maximum context length is %d tokens. However, you requested "
                        "%lld tokens (%d in the prompt, %lld for the completion).",
                        s->n_ctx, (long long)(n + (max_tokens > 0 ? max_tokens : 0)), n,
                        (long long)(max_tokens > 0 ? max_tokens : 0));
        }
        if (s->block_size > 0 && (need + s->block_size - 1) / s->block_size > s->kv_blocks_total) {
            srv_prompt_free(&pr);
            return fail(r, 400, "invalid_request_error", "context_over_budget", "max_tokens",
                        "The request needs %lld KV positions (%d prompt + %lld completion tokens, "
                        "less the last generated token, which is never stored), more than the "
                        "server's whole KV cache (%lld positions).",
                        (long long)need, n, (long long)max_tokens, (long long)pool);
        }
        g->req.max_tokens = (int32_t)max_tokens;
        g->req.prompt_ids = pr.ids;
        g->req.n_prompt_ids = n - pr.n_prefill;
        g->req.prompt = NULL;
        if (pr.n_prefill > 0) {
            /* Chat assistant prefill: the message's tokens continue the prompt, asserted and not
             * emitted, so the reply is only the continuation. */
            g->req.fill_ids = pr.ids + (n - pr.n_prefill);
            g->req.n_fill_ids = pr.n_prefill;
            g->req.fill = NULL;
            g->req.fill_policy = KILN_FILL_ASSERT;
            g->req.fill_hidden = true;
        } else if (pr.fill_ids) {
            /* the fill as the prompt's continuation (srv_prompt_build): exactly its text */
            g->req.fill_ids = pr.fill_ids;
            g->req.n_fill_ids = pr.n_fill;
            g->req.fill = NULL;
        }
        if (pr.pred_ids) {
            g->req.prediction_ids = pr.pred_ids;
            g->req.n_prediction_ids = pr.n_pred;
            g->req.prediction = NULL;
        }

        if (r->api) r->api->n_prompt = n;
        /* The prompt's text: echoed, and where completions' text_offset starts (OpenAI counts
         * offsets from the start of prompt + completion). */
        srv_buf ptext = {0};
        if (kind == SRV_COMPLETION) {
            if (g->prompt_text) {
                srv_buf_add(&ptext, g->prompt_text, g->prompt_len);
            } else if (kiln_model_has_tokenizer(s->m)) {
                size_t tl = 0;
                kiln_error derr = {0};
                char *tb = NULL;
                if (kiln_model_detokenize(s->m, g->prompt_ids, g->n_prompt_ids, NULL, 0, &tl,
                                          &derr) == KILN_OK &&
                    (tb = malloc(tl + 1)) &&
                    kiln_model_detokenize(s->m, g->prompt_ids, g->n_prompt_ids, tb, tl, &tl,
                                          &derr) == KILN_OK)
                    srv_buf_add(&ptext, tb, tl);
                free(tb);
            }
        }

        /* The engine is now in charge of time: no idle timeout until the response is done. */
        if (!r->timeout_off) {
            MHD_set_connection_option(r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
            r->timeout_off = true;
            atomic_fetch_add(&s->in_flight, 1);
            r->counted = true;
        }

        kiln_error err = {0};
        kiln_stream *streams[KILN_MAX_CHOICES] = {0};
        int64_t *poffs = NULL; /* echo with logprobs: the prompt tokens' text offsets */
        const int32_t first_id = n > 0 ? pr.ids[0] : 0;
        if (g->req.prompt_logprobs && n > 0 && !(poffs = prompt_offsets(s->m, pr.ids, n))) {
            srv_prompt_free(&pr);
            srv_buf_free(&ptext);
            return fail(r, 500, "server_error", NULL, NULL, "out of memory (text offsets)");
        }
        kiln_status st = kiln_engine_submit_n(s->e, &g->req, g->n, streams, &err);
        srv_prompt_free(&pr); /* the engine copied what it needs */
        g->req.prompt_ids = NULL;
        g->req.fill_ids = NULL;
        g->req.prediction_ids = NULL;
        if (st != KILN_OK) {
            free(poffs);
            srv_buf_free(&ptext);
            if (st == KILN_ERR_QUEUE_FULL)
                return fail(r, 503, "server_error", "queue_full", NULL,
                            "The server is busy: its request queue is full. Retry later. (%s)",
                            err.message);
            if (st == KILN_ERR_CANCELLED)
                return fail(r, 503, "server_error", "shutting_down", NULL, "%s", err.message);
            if (st == KILN_ERR_CONTEXT_OVER_BUDGET)
                return fail(r, 400, "invalid_request_error", "context_over_budget", NULL, "%s",
                            err.message);
            if (st == KILN_ERR_INVALID_ARGUMENT || st == KILN_ERR_NOT_FOUND)
                return fail(r, 400, "invalid_request_error", NULL, NULL, "%s", err.message);
            return fail(r, 500, "server_error", NULL, NULL, "%s", err.message);
        }
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const int64_t chars = srv_utf8_count(ptext.p ? ptext.p : "", ptext.len);
        for (int32_t j = 0; j < g->n; j++) {
            srv_choice *c = &r->ch[pi * g->n + j];
            c->stream = streams[j];
            c->ri = r->ri;
            c->ri.index = pi * g->n + j;
            c->text_offset = chars;
            c->watch_h = srv_watch_add(s->watch, ci ? ci->connect_fd : -1, c->stream);
            if (atomic_load(&s->force_cancel)) kiln_stream_cancel(c->stream);
            if (g->echo && ptext.len > 0 && !srv_buf_add(&c->echo, ptext.p, ptext.len)) {
                free(poffs);
                srv_buf_free(&ptext);
                return fail(r, 500, "server_error", NULL, NULL, "out of memory (echo)");
            }
            if (poffs) {
                /* the prompt's first token leads, with no logprob (OpenAI's null) */
                kiln_event e0 = {.type = KILN_EVENT_PROMPT_LOGPROB, .token = first_id};
                if (!push_tok(c, &e0) ||
                    !(c->prompt_offs = malloc((size_t)n * sizeof *c->prompt_offs))) {
                    free(poffs);
                    srv_buf_free(&ptext);
                    return fail(r, 500, "server_error", NULL, NULL, "out of memory (logprobs)");
                }
                memcpy(c->prompt_offs, poffs, (size_t)n * sizeof *poffs);
                c->toks[c->n_toks - 1].none = true;
                c->toks[c->n_toks - 1].has_offset = true;
                c->n_prompt = n;
                c->echo_pending = g->stream;
            }
            if (want_tp) {
                kiln_tool_parser_params tpp = {.format = s->chat.tool_format,
                                               .stream_arguments = g->stream,
                                               .seed = srv_random_u64()};
                kiln_error terr = {0};
                c->tool_calls = json_array();
                if (!c->tool_calls || kiln_tool_parser_create(&tpp, &c->tp, &terr) != KILN_OK) {
                    free(poffs);
                    srv_buf_free(&ptext);
                    return fail(r, 500, "server_error", NULL, NULL, "out of memory (tool parser)");
                }
                c->ri.tool_calls = c->tool_calls;
            }
        }
        srv_buf_free(&ptext);
        free(poffs);
    }                   /* prompts */
    if (tool_grammar) { /* the engine took its own references */
        kiln_grammar_destroy(tool_grammar);
        r->tool_grammar = NULL;
        g->req.grammar = NULL;
    }

    kiln_event ev;
    srv_choice *c;
    if (!g->stream) {
        for (int32_t i = 0; i < r->n_ch; i++) /* the echoed prompt begins the text */
            if (r->ch[i].echo.len &&
                !srv_buf_add(&r->ch[i].text, r->ch[i].echo.p, r->ch[i].echo.len))
                return MHD_NO;
        while (!r->finished) {
            if (!next_any(r, -1, &ev, &c) || !take_event(r, c, &ev)) {
                for (int32_t i = 0; i < r->n_ch; i++) kiln_stream_cancel(r->ch[i].stream);
                return MHD_NO;
            }
        }
        if (r->client_gone) return MHD_NO;
        if (r->finish == KILN_FINISH_ERROR) return finish_error(r);
        for (int32_t i = 0; i < r->n_ch; i++)
            if (r->ch[i].text.oom) return MHD_NO;
        size_t len = 0;
        char *body;
        if (r->api) {
            if (r->finish == KILN_FINISH_CANCELLED)
                return fail(r, 503, "server_error", "shutting_down", NULL,
                            "The server is shutting down; the generation was cancelled");
            srv_choice *c0 = &r->ch[0];
            srv_api_end end = {r->finish, &r->usage, r->fin_message, c0->tool_calls};
            body = r->api->ops->whole(r->api, c0->text.p ? c0->text.p : "", c0->text.len, &end,
                                      &len);
        } else {
            srv_choice_out outs[KILN_MAX_CHOICES * SRV_MAX_PROMPTS];
            for (int32_t i = 0; i < r->n_ch; i++) {
                srv_choice *ci2 = &r->ch[i];
                outs[i] = (srv_choice_out){.ri = &ci2->ri,
                                           .text = ci2->text.p ? ci2->text.p : "",
                                           .text_len = ci2->text.len,
                                           .toks = ci2->toks,
                                           .n_toks = ci2->n_toks,
                                           .finish = ci2->finish,
                                           .ids = ci2->ids,
                                           .n_ids = ci2->n_ids,
                                           .text_offset = ci2->text_offset};
            }
            body = srv_response_json_n(&r->ri, outs, r->n_ch, &r->usage, &len);
        }
        return queue_body(r, 200, "application/json", body, len, false);
    }

    /* Streaming: wait for the first event so that a request that fails at admission still
     * gets a proper status instead of a broken stream. */
    if (!next_any(r, -1, &ev, &c)) {
        for (int32_t i = 0; i < r->n_ch; i++) kiln_stream_cancel(r->ch[i].stream);
        return MHD_NO;
    }
    if (ev.type == KILN_EVENT_FINISH && ev.finish_reason == KILN_FINISH_ERROR) {
        r->gen.stream = false; /* no chunk: a proper error status instead */
        take_event(r, c, &ev);
        for (int32_t i = 0; i < r->n_ch; i++) kiln_stream_cancel(r->ch[i].stream);
        return finish_error(r);
    }
    bool started = r->api ? r->api->ops->start(r->api, &r->out) : true;
    for (int32_t i = 0; started && !r->api && i < r->n_ch; i++) {
        srv_choice *ci2 = &r->ch[i];
        started = srv_sse_role(&ci2->ri, &r->out);
        if (started && ci2->echo.len && !ci2->echo_pending) /* the echoed prompt first */
            started = srv_sse_text(&ci2->ri, ci2->echo.p, ci2->echo.len, NULL, 0,
                                   &ci2->text_offset, &r->out);
    }
    if (!started || !take_event(r, c, &ev)) return MHD_NO;
    if (r->client_gone) return MHD_NO;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SRV_SSE_BLOCK, sse_reader, r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->responded = true;
    r->status = 200;
    return ret;
}

/* ------------------------------------------------------------------------------------ */
/* Dispatch.                                                                             */

static int route_of(const char *url, bool *is_post) {
    static const struct {
        const char *path;
        int route;
        bool post;
    } table[] = {
        {"/v1/completions", ROUTE_COMPLETIONS, true}, {"/v1/chat/completions", ROUTE_CHAT, true},
        {"/v1/models", ROUTE_MODELS, false},          {"/health", ROUTE_HEALTH, false},
        {"/metrics", ROUTE_METRICS, false},           {"/tokenize", ROUTE_TOKENIZE, true},
        {"/detokenize", ROUTE_DETOKENIZE, true},      {"/v1/messages", ROUTE_MESSAGES, true},
        {"/v1/responses", ROUTE_RESPONSES, true},     {"/", ROUTE_PAGE, false},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(url, table[i].path)) {
            *is_post = table[i].post;
            return table[i].route;
        }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *is_post = false;
        return ROUTE_MODELS;
    }
    if (!strncmp(url, "/v1/responses/", 14) && url[14] && !strchr(url + 14, '/')) {
        *is_post = false;
        return ROUTE_RESPONSE_ID;
    }
    return ROUTE_NONE;
}

/* The key as "Authorization: Bearer <key>" (OpenAI) or "x-api-key: <key>" (Anthropic). */
static bool authorized(kiln_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x && srv_secret_equal(x, s->api_key)) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return srv_secret_equal(h, s->api_key);
}

static enum MHD_Result dispatch(srv_req *r, const char *url) {
    switch (r->route) {
    case ROUTE_MODELS:
        return route_models(r, url);
    case ROUTE_HEALTH:
        return route_health(r);
    case ROUTE_PAGE:
        return route_page(r);
    case ROUTE_METRICS:
        return route_metrics(r);
    case ROUTE_TOKENIZE:
        return route_tokenize(r);
    case ROUTE_DETOKENIZE:
        return route_detokenize(r);
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT:
    case ROUTE_MESSAGES:
    case ROUTE_RESPONSES:
        return route_generate(r);
    case ROUTE_RESPONSE_ID:
        return route_response_id(r, url);
    default:
        return fail(r, 404, "invalid_request_error", NULL, NULL, "Invalid URL");
    }
}

/* Route, method, key and state checks. True when an error response was queued (*ret). */
static bool precheck(srv_req *r, struct MHD_Connection *c, const char *method, const char *url,
                     enum MHD_Result *ret) {
    kiln_server *s = r->s;
    bool is_post = false;
    r->route = route_of(url, &is_post);
    r->checked = true;
    bool is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD") ||
                  (r->route == ROUTE_RESPONSE_ID && !strcmp(method, "DELETE"));
    int state = atomic_load(&s->state);
    /* The page is open (no key, any state): it asks for the key itself. */
    bool open_route =
        r->route == ROUTE_HEALTH || r->route == ROUTE_METRICS || r->route == ROUTE_PAGE;
    if (r->route == ROUTE_NONE)
        *ret = fail(r, 404, "invalid_request_error", NULL, NULL, "Invalid URL (%.12s %.100s)",
                    method, url);
    else if (is_post ? strcmp(method, "POST") != 0 : !is_get)
        *ret = fail(r, 405, "invalid_request_error", NULL, NULL,
                    "Method %.12s is not allowed on %.100s (use %s)", method, url,
                    is_post ? "POST" : r->route == ROUTE_RESPONSE_ID ? "GET or DELETE" : "GET");
    else if (!open_route && !authorized(s, c))
        *ret = fail(r, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>' (or "
                    "'x-api-key: <key>').");
    else if (state == STATE_DRAINING && !open_route)
        *ret = fail(r, 503, "server_error", "shutting_down", NULL, "The server is shutting down");
    else if (state == STATE_LOADING && !open_route)
        *ret = fail(r, 503, "server_error", "model_loading", NULL,
                    "The model is still loading; retry shortly");
    else
        return false;
    return true;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_size, void **con_cls) {
    kiln_server *s = cls;
    srv_req *r = *con_cls;
    enum MHD_Result ret = MHD_YES;
    (void)version;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        r->s = s;
        r->conn = c;
        r->t_start = srv_now_ms();
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        /* Requests without a body are answered at the final call: a response queued now
         * would make libmicrohttpd close the connection (no keep-alive, no pipelining).
         * A POST that will be refused is refused now, before its body is read. */
        if (strcmp(method, "POST") != 0) return MHD_YES;
        if (precheck(r, c, method, url, &ret)) return ret;
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end = NULL;
            unsigned long long v = strtoull(cl, &end, 10);
            if (end != cl && v > s->max_body)
                return fail(r, 413, "invalid_request_error", "request_too_large", NULL,
                            "The request body (%llu bytes) exceeds the limit of %zu bytes", v,
                            s->max_body);
        }
        return MHD_YES; /* the body follows */
    }
    if (*upload_size) {
        if (!r->responded && !r->too_large) {
            if (r->body.len + *upload_size > s->max_body) {
                r->too_large = true;
                srv_buf_free(&r->body);
            } else if (!srv_buf_add(&r->body, upload_data, *upload_size)) {
                return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->responded) return MHD_YES;
    if (!r->checked && precheck(r, c, method, url, &ret)) return ret;
    if (r->too_large)
        return fail(r, 413, "invalid_request_error", "request_too_large", NULL,
                    "The request body exceeds the limit of %zu bytes", s->max_body);
    return dispatch(r, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    kiln_server *s = cls;
    srv_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    bool gone = r->client_gone;
    /* A generation whose FINISH event was never read (the connection failed first) still
     * counts, as cancelled, with the tokens seen so far. */
    for (int32_t i = 0; i < r->n_ch; i++) {
        srv_choice *ch = &r->ch[i];
        if (!ch->stream) continue;
        if (!ch->finished)
            srv_metrics_generation(&s->metrics, i == 0 ? r->n_prompt : 0, 0, ch->n_tokens,
                                   KILN_FINISH_CANCELLED, (srv_now_ms() - r->t_start) / 1e3);
        /* a hang-up the watcher saw after a generation finished on its own and its response
         * went out whole is the client closing a done connection, not a disconnect */
        const bool done_ok = r->finished && r->finish != KILN_FINISH_CANCELLED &&
                             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
        if (srv_watch_remove(s->watch, ch->watch_h) && !done_ok) gone = true;
        kiln_stream_destroy(ch->stream); /* cancels it if still running */
        ch->stream = NULL;
    }
    if (r->timeout_off)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->timeout_s);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->is_gen && r->counted) gone = true;
    int status = r->status;
    if (gone)
        status = 499; /* the client closed the connection (nginx's convention) */
    else if (!r->responded)
        status = toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? 408 : 400;
    srv_metrics_request(&s->metrics, r->route, status);
    if (!s->quiet) {
        double total = srv_now_ms() - r->t_start;
        if (r->is_gen && r->counted) {
            const char *fin = !r->finished ? "cancelled"
                              : r->finish == KILN_FINISH_CANCELLED && !gone
                                  ? "abort"
                                  : kiln_finish_reason_name(r->finish);
            char ttft[32], spec[96] = "";
            if (r->n_tokens > 0)
                snprintf(ttft, sizeof ttft, "%.1f", r->t_first - r->t_start);
            else
                snprintf(ttft, sizeof ttft, "-");
            if (r->finished && (r->usage.spec_drafted > 0 || r->usage.fill_tokens > 0))
                snprintf(spec, sizeof spec, " spec_accepted=%d/%d fill=%d",
                         r->usage.spec_accepted, r->usage.spec_drafted, r->usage.fill_tokens);
            srv_log(s,
                    "%s %s %s %d prompt=%d cached=%d completion=%d ttft_ms=%s total_ms=%.1f "
                    "finish=%s%s%s",
                    r->id, r->method, r->path, status, r->n_prompt,
                    r->finished ? r->usage.cached_tokens : 0,
                    r->finished ? r->usage.completion_tokens : r->n_tokens, ttft, total, fin, spec,
                    gone ? " (client disconnected)" : "");
        } else {
            char id[48];
            srv_make_id("req-", id, sizeof id);
            srv_log(s, "%s %s %s %d total_ms=%.1f%s%s%s", r->is_gen && r->id[0] ? r->id : id,
                    r->method, r->path, status, total, r->err_msg[0] ? " error=\"" : "", r->err_msg,
                    r->err_msg[0] ? "\"" : "");
        }
    }
    if (r->counted) atomic_fetch_sub(&s->in_flight, 1);
    srv_gen_free(&r->gen);
    srv_api_out_destroy(r->api);
    srv_buf_free(&r->body);
    srv_buf_free(&r->out);
    for (int32_t i = 0; i < r->n_ch; i++) {
        srv_buf_free(&r->ch[i].echo);
        choice_free(&r->ch[i]);
    }
    free(r->ch);
    kiln_grammar_destroy(r->tool_grammar);
    free(r);
}

/* ------------------------------------------------------------------------------------ */
/* Life cycle.                                                                           */

static kiln_status bind_listen(kiln_server *s, const char *host, int port, bool *ipv6,
                               kiln_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0 || !res)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "cannot resolve host '%s': %s", host,
                              gai_strerror(rc));
    int fd = -1, saved = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
            *ipv6 = a->ai_family == AF_INET6;
            break;
        }
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return kiln_error_set(err, KILN_ERR_IO, "cannot listen on %s:%d: %s", host, port,
                              strerror(saved));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    s->listen_fd = fd;
    return KILN_OK;
}

kiln_status kiln_server_start(const kiln_server_params *p, kiln_server **out, kiln_error *err) {
    if (!p || !out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "NULL argument");
    *out = NULL;
    if (p->port < 0 || p->port > 65535)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "port must be in [0, 65535] (got %d)",
                              p->port);
    if (p->max_connections < 0 || p->timeout_s < 0)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "max_connections and timeout_s must be >= 0");
    kiln_tool_format tf = KILN_TOOL_FORMAT_HERMES;
    bool tool_override = p->tool_parser && strcmp(p->tool_parser, "auto") != 0;
    if (tool_override) {
        kiln_status tst = kiln_tool_format_parse(p->tool_parser, &tf, err);
        if (tst) return tst;
    }
    kiln_server *s = calloc(1, sizeof *s);
    if (!s) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (server)");
    s->tool_override = tool_override;
    s->tool_format = tf;
    s->listen_fd = -1;
    pthread_mutex_init(&s->shut_mu, NULL);
    srv_metrics_init(&s->metrics);
    s->host = strdup(p->host ? p->host : "127.0.0.1");
    s->api_key = p->api_key && p->api_key[0] ? strdup(p->api_key) : NULL;
    bool names_ok = split_model_names(s, p->model_name);
    s->max_body = p->max_body ? p->max_body : SRV_DEFAULT_MAX_BODY;
    s->max_conn = p->max_connections ? p->max_connections : SRV_DEFAULT_MAX_CONN;
    s->timeout_s = p->timeout_s ? p->timeout_s : SRV_DEFAULT_TIMEOUT_S;
    s->quiet = p->quiet;
    s->verbose = p->verbose;
    s->log = p->log ? p->log : stderr;
    s->started_at = (int64_t)time(NULL);
    atomic_init(&s->state, STATE_LOADING);
    atomic_init(&s->force_cancel, false);
    atomic_init(&s->in_flight, 0);
    kiln_status st;
    if (!s->host || !names_ok || (p->api_key && p->api_key[0] && !s->api_key)) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (server)");
        goto fail;
    }
    if ((st = srv_watch_create(s->max_conn + 8, &s->watch, err))) goto fail;
    s->rstore = srv_rstore_create(p->response_store_max > 0   ? (size_t)p->response_store_max
                                  : p->response_store_max < 0 ? 0
                                                              : SRV_DEFAULT_RESPONSE_STORE_MAX,
                                  p->response_store_ttl_s > 0 ? p->response_store_ttl_s
                                                              : SRV_DEFAULT_RESPONSE_STORE_TTL);
    if (!s->rstore) {
        st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (response store)");
        goto fail;
    }
    bool ipv6 = false;
    if ((st = bind_listen(s, s->host, p->port, &ipv6, err))) goto fail;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, s,
        MHD_OPTION_LISTEN_SOCKET, s->listen_fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->max_conn,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_END);
    if (!s->d) {
        st = kiln_error_set(err, KILN_ERR_INTERNAL, "cannot start the HTTP daemon on %s:%d",
                            s->host, s->port);
        goto fail;
    }
    *out = s;
    return KILN_OK;
fail:
    if (s->listen_fd >= 0) close(s->listen_fd);
    srv_watch_destroy(s->watch);
    srv_rstore_destroy(s->rstore);
    srv_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->shut_mu);
    free(s->host);
    free(s->api_key);
    free(s->model_name);
    free(s->names_buf);
    free(s);
    return st;
}

int kiln_server_port(const kiln_server *s) {
    return s ? s->port : 0;
}

kiln_status kiln_server_set_ready(kiln_server *s, const kiln_model *model, kiln_engine *engine,
                                  int32_t n_ctx, kiln_error *err) {
    if (!s || !model || !engine)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "NULL server, model or engine");
    if (atomic_load(&s->state) != STATE_LOADING)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "the server is already serving");
    kiln_status st = srv_chat_init(&s->chat, model, NULL, err);
    if (st) return st;
    if (s->chat.fallback) srv_log(s, "chat template: ChatML fallback (%s)", s->chat.reason);
    if (s->tool_override) s->chat.tool_format = s->tool_format;
    s->m = model;
    kiln_model_generation_defaults(model, &s->gen);
    s->e = engine;
    s->n_vocab = kiln_model_n_vocab(model);
    if (n_ctx <= 0) n_ctx = kiln_model_n_ctx_train(model);
    s->n_ctx = n_ctx > 0 ? n_ctx : 4096;
    kiln_engine_stats es;
    kiln_engine_get_stats(engine, &es);
    s->kv_blocks_total = es.kv_blocks_total;
    s->block_size = es.block_size;
    kiln_engine_params ep;
    kiln_engine_get_params(engine, &ep);
    s->has_draft = ep.draft_model != NULL;
    atomic_store(&s->state, STATE_READY);
    return KILN_OK;
}

bool kiln_server_chat_fallback(const kiln_server *s) {
    return s && s->chat.fallback;
}

int32_t kiln_server_in_flight(kiln_server *s) {
    return s ? atomic_load(&s->in_flight) : 0;
}

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void kiln_server_shutdown(kiln_server *s, double grace_s) {
    if (!s) return;
    pthread_mutex_lock(&s->shut_mu);
    if (s->shut_down) {
        pthread_mutex_unlock(&s->shut_mu);
        return;
    }
    s->shut_down = true;
    atomic_store(&s->state, STATE_DRAINING);
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    s->listen_fd = -1;
    int n = atomic_load(&s->in_flight);
    srv_log(s, "shutting down: no new connections; %d request(s) in flight", n);
    double t0 = srv_now_ms();
    while (atomic_load(&s->in_flight) > 0 && srv_now_ms() - t0 < grace_s * 1e3) sleep_ms(5);
    if (atomic_load(&s->in_flight) > 0) {
        srv_log(s, "shutting down: cancelling %d request(s)", atomic_load(&s->in_flight));
        atomic_store(&s->force_cancel, true);
        double t1 = srv_now_ms();
        while (atomic_load(&s->in_flight) > 0 && srv_now_ms() - t1 < 10e3) {
            if (s->watch) srv_watch_cancel_all(s->watch);
            sleep_ms(5);
        }
    }
    pthread_mutex_unlock(&s->shut_mu);
}

void kiln_server_cancel_all(kiln_server *s) {
    if (!s) return;
    atomic_store(&s->force_cancel, true);
    if (s->watch) srv_watch_cancel_all(s->watch);
}

void kiln_server_destroy(kiln_server *s) {
    if (!s) return;
    kiln_server_shutdown(s, 0);
    MHD_stop_daemon(s->d);
    srv_watch_destroy(s->watch);
    srv_rstore_destroy(s->rstore);
    srv_chat_free(&s->chat);
    srv_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->shut_mu);
    free(s->host);
    free(s->api_key);
    free(s->model_name);
    free(s->names_buf);
    free(s);
}
