/*
 * server_test_util.h - an in-process kiln server on a loopback port and a minimal raw-socket
 * HTTP/1.1 client for the server tests. Every wait is bounded.
 */
#ifndef KILN_SERVER_TEST_UTIL_H
#define KILN_SERVER_TEST_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kiln.h"
#include "server/server.h"
#include "server/srv_util.h"
#include "test.h"

static double tu_now_ms(void) {
    return srv_now_ms();
}

static void tu_sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A server over a model, its own engine. */
typedef struct tsrv {
    kiln_server *srv;
    kiln_engine *e;
    int port;
} tsrv;

static FILE *tu_log(void) {
    static FILE *f;
    if (!f) f = getenv("KILN_TEST_VERBOSE") ? stderr : fopen("/dev/null", "w");
    return f;
}

static void tsrv_start(tsrv *t, const kiln_model *m, const kiln_server_params *sp0,
                       const kiln_engine_params *ep0) {
    kiln_server_params sp = sp0 ? *sp0 : (kiln_server_params){0};
    sp.host = "127.0.0.1";
    sp.port = 0;
    if (!sp.log) sp.log = tu_log();
    kiln_engine_params ep = ep0 ? *ep0 : kiln_engine_default_params();
    kiln_error err = {0};
    memset(t, 0, sizeof *t);
    if (kiln_server_start(&sp, &t->srv, &err) != KILN_OK) {
        fprintf(stderr, "server start: %s\n", err.message);
        exit(1);
    }
    t->port = kiln_server_port(t->srv);
    REQUIRE(t->port > 0);
    if (m) {
        if (kiln_engine_create(m, &ep, &t->e, &err) != KILN_OK ||
            kiln_server_set_ready(t->srv, m, t->e, ep.n_ctx, &err) != KILN_OK) {
            fprintf(stderr, "engine/ready: %s\n", err.message);
            exit(1);
        }
    }
}

static void tsrv_stop(tsrv *t) {
    kiln_server_destroy(t->srv);
    kiln_engine_destroy(t->e);
    memset(t, 0, sizeof *t);
}

static int tu_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static bool tu_send(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

/* Read until EOF, until `until` appears in what was read (if non-NULL), or timeout.
 * Returns true on EOF or match, false on timeout or error. */
static bool tu_read(int fd, srv_buf *out, const char *until, int timeout_ms) {
    double end = tu_now_ms() + timeout_ms;
    for (;;) {
        if (until && out->p && strstr(out->p, until)) return true;
        int left = (int)(end - tu_now_ms());
        if (left <= 0) return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        char buf[8192];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno == ECONNRESET;
        if (n == 0) return true;
        srv_buf_add(out, buf, (size_t)n);
    }
}

typedef struct tu_resp {
    int status;
    char headers[4096];
    srv_buf body;
    bool complete; /* EOF seen */
} tu_resp;

/* Decode a chunked body in place into out. */
static void tu_dechunk(const char *p, size_t n, srv_buf *out) {
    const char *end = p + n;
    while (p < end) {
        char *e = NULL;
        unsigned long sz = strtoul(p, &e, 16);
        const char *nl = strstr(p, "\r\n");
        if (!nl || e == p) return;
        p = nl + 2;
        if (sz == 0) return;
        if ((size_t)(end - p) < sz) {
            srv_buf_add(out, p, (size_t)(end - p));
            return;
        }
        srv_buf_add(out, p, sz);
        p += sz + 2;
    }
}

static void tu_parse(const srv_buf *raw, tu_resp *r) {
    r->status = 0;
    r->headers[0] = '\0';
    if (!raw->p) return;
    if (sscanf(raw->p, "HTTP/1.%*d %d", &r->status) != 1) r->status = 0;
    const char *sep = strstr(raw->p, "\r\n\r\n");
    if (!sep) return;
    snprintf(r->headers, sizeof r->headers, "%.*s", (int)(sep - raw->p), raw->p);
    const char *body = sep + 4;
    size_t n = raw->len - (size_t)(body - raw->p);
    if (strcasestr(r->headers, "transfer-encoding: chunked"))
        tu_dechunk(body, n, &r->body);
    else
        srv_buf_add(&r->body, body, n);
    if (!r->body.p) srv_buf_add(&r->body, "", 0);
}

/* One request on a fresh connection with "Connection: close"; reads to EOF. */
static tu_resp tu_request(int port, const char *method, const char *path, const char *headers,
                          const char *body) {
    tu_resp r = {0};
    int fd = tu_connect(port);
    if (fd < 0) return r;
    srv_buf req = {0};
    srv_buf_addf(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                 headers ? headers : "");
    if (body)
        srv_buf_addf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                     strlen(body));
    srv_buf_adds(&req, "\r\n");
    if (body) srv_buf_adds(&req, body);
    srv_buf raw = {0};
    if (tu_send(fd, req.p, req.len)) r.complete = tu_read(fd, &raw, NULL, 30000);
    tu_parse(&raw, &r);
    srv_buf_free(&raw);
    srv_buf_free(&req);
    close(fd);
    return r;
}

static void tu_free(tu_resp *r) {
    srv_buf_free(&r->body);
}

static inline json_t *tu_json(const tu_resp *r) {
    json_error_t je;
    return r->body.p ? json_loadb(r->body.p, r->body.len, 0, &je) : NULL;
}

/* The error object's field of an OpenAI error body ("" when absent or null). */
static inline const char *tu_err_field(json_t *j, const char *key) {
    json_t *v = json_object_get(json_object_get(j, "error"), key);
    return json_is_string(v) ? json_string_value(v) : "";
}

/* Poll the engine until no sequence runs and no KV block is used (bounded). */
static inline bool tu_wait_idle(kiln_engine *e, int timeout_ms) {
    double end = tu_now_ms() + timeout_ms;
    for (;;) {
        kiln_engine_stats st;
        kiln_engine_get_stats(e, &st);
        if (st.n_running == 0 && st.n_queued == 0 && st.kv_blocks_used == 0) return true;
        if (tu_now_ms() > end) return false;
        tu_sleep_ms(2);
    }
}

/* A GET /health on a fresh connection answers 200. */
static inline bool tu_healthy(int port) {
    tu_resp r = tu_request(port, "GET", "/health", NULL, NULL);
    bool ok = r.status == 200;
    tu_free(&r);
    return ok;
}

#endif
