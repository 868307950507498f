/*
 * chat_page.h - the built-in chat page, served at GET / (issue 20).
 *
 * The page is src/server/chat_page.html, turned into a C array at build time by
 * src/server/chat_page.cmake (no build step outside CMake, nothing fetched at run time). Its
 * Content-Security-Policy names the SHA-256 of the page's own <style> and <script> elements
 * (CSP Level 3 hash sources, https://www.w3.org/TR/CSP3/#grammardef-hash-source), so no other
 * script or style can run in it, and it may connect only to this server.
 */
#ifndef KILN_SERVER_CHAT_PAGE_H
#define KILN_SERVER_CHAT_PAGE_H

#include <stddef.h>

struct MHD_Response;

/** The page: `*len` bytes of UTF-8 HTML (static storage, also NUL-terminated). */
const char *srv_chat_page(size_t *len);

/** The page's Content-Security-Policy header value (static storage). */
const char *srv_chat_page_csp(void);

/** A new libmicrohttpd response with the page and its headers: Content-Type
 *  "text/html; charset=utf-8", Content-Security-Policy (srv_chat_page_csp),
 *  X-Content-Type-Options nosniff, Referrer-Policy no-referrer and Cache-Control no-cache.
 *  The caller queues it and then destroys it (MHD_destroy_response). NULL when out of memory. */
struct MHD_Response *srv_chat_page_response(void);

#endif
