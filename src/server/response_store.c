/* response_store.c - stored Responses API results with a TTL and a byte cap (see
 * response_store.h). A doubly linked list in recency order (head = most recently used);
 * lookups scan it, which stays cheap at the sizes a byte cap allows. */
#include "server/response_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct rs_entry {
    struct rs_entry *prev, *next;
    char *id;
    char *response;
    char *messages;
    char **items;
    int n_items;
    double expires;
    size_t bytes;
} rs_entry;

struct srv_rstore {
    pthread_mutex_t mu;
    size_t max_bytes, bytes;
    double ttl;
    int64_t n;
    rs_entry *head, *tail;
};

srv_rstore *srv_rstore_create(size_t max_bytes, double ttl_s) {
    srv_rstore *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->max_bytes = max_bytes;
    s->ttl = ttl_s > 0 ? ttl_s : 1;
    return s;
}

static void entry_free(rs_entry *e) {
    if (!e) return;
    free(e->id);
    free(e->response);
    free(e->messages);
    for (int i = 0; i < e->n_items; i++) free(e->items[i]);
    free(e->items);
    free(e);
}

static void unlink_entry(srv_rstore *s, rs_entry *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        s->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->tail = e->prev;
    e->prev = e->next = NULL;
    s->bytes -= e->bytes;
    s->n--;
}

static void push_front(srv_rstore *s, rs_entry *e) {
    e->prev = NULL;
    e->next = s->head;
    if (s->head) s->head->prev = e;
    s->head = e;
    if (!s->tail) s->tail = e;
    s->bytes += e->bytes;
    s->n++;
}

static void drop(srv_rstore *s, rs_entry *e) {
    unlink_entry(s, e);
    entry_free(e);
}

static void drop_expired(srv_rstore *s, double now) {
    for (rs_entry *e = s->head, *next; e; e = next) {
        next = e->next;
        if (now >= e->expires) drop(s, e);
    }
}

static rs_entry *find(srv_rstore *s, const char *id) {
    for (rs_entry *e = s->head; e; e = e->next)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

/* A live entry made the most recently used, or NULL (an expired one is dropped). */
static rs_entry *touch(srv_rstore *s, rs_entry *e, double now) {
    if (!e) return NULL;
    if (now >= e->expires) {
        drop(s, e);
        return NULL;
    }
    unlink_entry(s, e);
    push_front(s, e);
    return e;
}

void srv_rstore_destroy(srv_rstore *s) {
    if (!s) return;
    while (s->head) drop(s, s->head);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

bool srv_rstore_put(srv_rstore *s, const char *id, const char *response_json,
                    const char *messages_json, const char *const *item_ids, int n_items,
                    double now_s) {
    if (!s || !id || !response_json || !messages_json || n_items < 0) return false;
    size_t bytes = SRV_RSTORE_ENTRY_OVERHEAD + strlen(id) + strlen(response_json) +
                   strlen(messages_json) + (size_t)n_items * sizeof(char *);
    for (int i = 0; i < n_items; i++) bytes += strlen(item_ids[i]) + 1;
    if (bytes > s->max_bytes) {
        pthread_mutex_lock(&s->mu);
        rs_entry *old = find(s, id);
        if (old) drop(s, old);
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    rs_entry *e = calloc(1, sizeof *e);
    if (!e) return false;
    e->id = strdup(id);
    e->response = strdup(response_json);
    e->messages = strdup(messages_json);
    e->items = n_items ? calloc((size_t)n_items, sizeof *e->items) : NULL;
    bool ok = e->id && e->response && e->messages && (!n_items || e->items);
    for (int i = 0; ok && i < n_items; i++) {
        e->items[i] = strdup(item_ids[i]);
        e->n_items = i + 1;
        ok = e->items[i] != NULL;
    }
    if (!ok) {
        entry_free(e);
        return false;
    }
    e->bytes = bytes;
    e->expires = now_s + s->ttl;
    pthread_mutex_lock(&s->mu);
    rs_entry *old = find(s, id);
    if (old) drop(s, old);
    drop_expired(s, now_s);
    while (s->tail && s->bytes + bytes > s->max_bytes) drop(s, s->tail);
    push_front(s, e);
    pthread_mutex_unlock(&s->mu);
    return true;
}

char *srv_rstore_get(srv_rstore *s, const char *id, srv_rstore_part part, double now_s) {
    if (!s || !id) return NULL;
    pthread_mutex_lock(&s->mu);
    rs_entry *e = touch(s, find(s, id), now_s);
    char *out = e ? strdup(part == SRV_RSTORE_MESSAGES ? e->messages : e->response) : NULL;
    pthread_mutex_unlock(&s->mu);
    return out;
}

char *srv_rstore_find_item(srv_rstore *s, const char *item_id, double now_s) {
    if (!s || !item_id) return NULL;
    pthread_mutex_lock(&s->mu);
    rs_entry *hit = NULL;
    for (rs_entry *e = s->head; e && !hit; e = e->next)
        for (int i = 0; i < e->n_items; i++)
            if (!strcmp(e->items[i], item_id)) {
                hit = e;
                break;
            }
    hit = touch(s, hit, now_s);
    char *out = hit ? strdup(hit->response) : NULL;
    pthread_mutex_unlock(&s->mu);
    return out;
}

bool srv_rstore_delete(srv_rstore *s, const char *id, double now_s) {
    if (!s || !id) return false;
    pthread_mutex_lock(&s->mu);
    rs_entry *e = find(s, id);
    bool live = e && now_s < e->expires;
    if (e) drop(s, e);
    pthread_mutex_unlock(&s->mu);
    return live;
}

void srv_rstore_stats(srv_rstore *s, int64_t *n_entries, size_t *bytes) {
    if (!s) {
        if (n_entries) *n_entries = 0;
        if (bytes) *bytes = 0;
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (n_entries) *n_entries = s->n;
    if (bytes) *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}
