/* watch.c - in-flight request registry and disconnect watcher (see watch.h). */
#include "server/watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "util/error.h"

typedef struct watch_slot {
    bool used;
    bool hungup;
    int fd;   /* -1: not in epoll */
    int conn; /* the connection's socket, -1 for none: a request with n > 1 choices or a
                 prompt batch has a slot per choice on one socket, of which one is in epoll
                 (epoll takes a socket once); a hang-up cancels every slot of the socket */
    uint32_t gen;
    kiln_stream *stream;
} watch_slot;

struct srv_watch {
    pthread_mutex_t mu;
    watch_slot *slots;
    int32_t cap, count;
    int epfd;
    int wake[2]; /* pipe: a byte stops the thread */
    pthread_t thread;
    bool thread_started;
};

/* handle = gen << 32 | index; gen starts at 1 so a handle is never 0-ambiguous. */
static int64_t make_handle(int32_t idx, uint32_t gen) {
    return (int64_t)(((uint64_t)gen << 32) | (uint32_t)idx);
}

static watch_slot *slot_of(srv_watch *w, int64_t h) {
    if (h < 0) return NULL;
    int32_t idx = (int32_t)(uint32_t)h;
    uint32_t gen = (uint32_t)((uint64_t)h >> 32);
    if (idx < 0 || idx >= w->cap) return NULL;
    watch_slot *s = &w->slots[idx];
    return s->used && s->gen == gen ? s : NULL;
}

static void *watch_main(void *arg) {
    srv_watch *w = arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(w->epfd, evs, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == UINT64_MAX) return NULL; /* the wake pipe */
            pthread_mutex_lock(&w->mu);
            /* The handle may be stale (removed after epoll_wait returned): slot_of checks
             * the generation, so a reused slot is never cancelled by mistake. */
            watch_slot *s = slot_of(w, (int64_t)evs[i].data.u64);
            if (s && (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
                const int conn = s->conn;
                for (int32_t k = 0; k < w->cap; k++) {
                    watch_slot *o = &w->slots[k];
                    if (o->used && (o == s || (conn >= 0 && o->conn == conn))) {
                        o->hungup = true;
                        kiln_stream_cancel(o->stream);
                    }
                }
            }
            pthread_mutex_unlock(&w->mu);
        }
    }
    return NULL;
}

kiln_status srv_watch_create(int32_t capacity, srv_watch **out, kiln_error *err) {
    *out = NULL;
    srv_watch *w = calloc(1, sizeof *w);
    if (!w) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (watcher)");
    w->epfd = -1;
    w->wake[0] = w->wake[1] = -1;
    pthread_mutex_init(&w->mu, NULL);
    w->cap = capacity > 0 ? capacity : 1;
    w->slots = calloc((size_t)w->cap, sizeof *w->slots);
    if (!w->slots) {
        srv_watch_destroy(w);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (watcher slots)");
    }
    for (int32_t i = 0; i < w->cap; i++) w->slots[i].fd = w->slots[i].conn = -1;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (w->epfd < 0 || pipe(w->wake) != 0) {
        srv_watch_destroy(w);
        return kiln_error_set(err, KILN_ERR_INTERNAL, "cannot create the disconnect watcher: %s",
                              strerror(errno));
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wake[0], &ev) != 0 ||
        pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        srv_watch_destroy(w);
        return kiln_error_set(err, KILN_ERR_INTERNAL, "cannot start the disconnect watcher");
    }
    w->thread_started = true;
    *out = w;
    return KILN_OK;
}

void srv_watch_destroy(srv_watch *w) {
    if (!w) return;
    if (w->thread_started) {
        char c = 1;
        while (write(w->wake[1], &c, 1) < 0 && errno == EINTR) {
        }
        pthread_join(w->thread, NULL);
    }
    if (w->epfd >= 0) close(w->epfd);
    if (w->wake[0] >= 0) close(w->wake[0]);
    if (w->wake[1] >= 0) close(w->wake[1]);
    pthread_mutex_destroy(&w->mu);
    free(w->slots);
    free(w);
}

int64_t srv_watch_add(srv_watch *w, int fd, kiln_stream *s) {
    pthread_mutex_lock(&w->mu);
    int32_t idx = -1;
    for (int32_t i = 0; i < w->cap; i++)
        if (!w->slots[i].used) {
            idx = i;
            break;
        }
    if (idx < 0) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    watch_slot *sl = &w->slots[idx];
    uint32_t gen = sl->gen + 1 ? sl->gen + 1 : 1;
    *sl = (watch_slot){.used = true, .fd = -1, .conn = fd, .gen = gen, .stream = s};
    int64_t h = make_handle(idx, gen);
    if (fd >= 0) {
        bool sibling = false; /* another slot of this socket is in epoll already */
        for (int32_t i = 0; i < w->cap && !sibling; i++)
            sibling = i != idx && w->slots[i].used && w->slots[i].conn == fd &&
                      w->slots[i].fd >= 0;
        /* Level-triggered would report a hang-up forever; one shot is enough. */
        struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.u64 = (uint64_t)h};
        if (!sibling && epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) == 0) sl->fd = fd;
        if (!sibling && sl->fd < 0) sl->conn = -1; /* epoll refused the socket: unwatched */
    }
    w->count++;
    pthread_mutex_unlock(&w->mu);
    return h;
}

bool srv_watch_remove(srv_watch *w, int64_t h) {
    pthread_mutex_lock(&w->mu);
    watch_slot *s = slot_of(w, h);
    bool hung = false;
    if (s) {
        hung = s->hungup;
        const int fd = s->fd;
        if (fd >= 0) epoll_ctl(w->epfd, EPOLL_CTL_DEL, fd, NULL);
        s->used = false;
        s->stream = NULL;
        s->fd = s->conn = -1;
        w->count--;
        /* the socket's other choices keep running: hand the epoll entry to one of them */
        for (int32_t i = 0; fd >= 0 && i < w->cap; i++) {
            watch_slot *o = &w->slots[i];
            if (!o->used || o->conn != fd || o->hungup) continue;
            struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT,
                                     .data.u64 = (uint64_t)make_handle(i, o->gen)};
            if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) == 0) o->fd = fd;
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return hung;
}

bool srv_watch_hungup(srv_watch *w, int64_t h) {
    pthread_mutex_lock(&w->mu);
    watch_slot *s = slot_of(w, h);
    bool hung = s && s->hungup;
    pthread_mutex_unlock(&w->mu);
    return hung;
}

void srv_watch_cancel_all(srv_watch *w) {
    pthread_mutex_lock(&w->mu);
    for (int32_t i = 0; i < w->cap; i++)
        if (w->slots[i].used) kiln_stream_cancel(w->slots[i].stream);
    pthread_mutex_unlock(&w->mu);
}

int32_t srv_watch_count(srv_watch *w) {
    pthread_mutex_lock(&w->mu);
    int32_t n = w->count;
    pthread_mutex_unlock(&w->mu);
    return n;
}
