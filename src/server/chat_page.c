/* chat_page.c - the built-in chat page at GET / (chat_page.h). */
#include "server/chat_page.h"

#include <microhttpd.h>

/* Written by chat_page.cmake from chat_page.html (the build's chat_page_data.c). */
extern const unsigned char srv_chat_page_html[];
extern const size_t srv_chat_page_html_len;
extern const char srv_chat_page_csp_value[];

const char *srv_chat_page(size_t *len) {
    *len = srv_chat_page_html_len;
    return (const char *)srv_chat_page_html;
}

const char *srv_chat_page_csp(void) { return srv_chat_page_csp_value; }

struct MHD_Response *srv_chat_page_response(void) {
    size_t len = 0;
    const char *page = srv_chat_page(&len);
    /* MHD_RESPMEM_PERSISTENT: the page is static and never copied or freed. */
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)page, MHD_RESPMEM_PERSISTENT);
    if (!resp) return NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    MHD_add_response_header(resp, "Content-Security-Policy", srv_chat_page_csp_value);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return resp;
}
