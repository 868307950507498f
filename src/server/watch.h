/*
 * watch.h - the in-flight request registry and its disconnect watcher.
 *
 * Every generation request registers its client socket and its engine stream here. A
 * watcher thread waits (epoll) for the peer to close its side of any registered socket
 * (EPOLLRDHUP / EPOLLHUP / EPOLLERR) and cancels that request's stream at once, so the
 * engine drops the sequence at its next step boundary and its KV blocks return to the pool,
 * while the connection's own thread may still be blocked waiting for tokens. The registry
 * also lets a shutdown cancel everything still running.
 *
 * A client that half-closes its sending side after a complete request (shutdown(SHUT_WR))
 * is treated as gone: HTTP/1.1 clients do not do that while they wait for a response.
 */
#ifndef KILN_SERVER_WATCH_H
#define KILN_SERVER_WATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

typedef struct srv_watch srv_watch;

/** Create the registry with room for `capacity` requests and start the watcher thread.
 *  Errors: KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (epoll or thread creation failed). */
kiln_status srv_watch_create(int32_t capacity, srv_watch **out, kiln_error *err);

/** Stop the thread and free the registry (every entry must have been removed). */
void srv_watch_destroy(srv_watch *w);

/** Register (fd, stream); returns a handle >= 0, or -1 when the registry is full (the
 *  request then runs without disconnect detection; so does one whose fd epoll refuses). fd
 *  may be -1 (tracked for shutdown only). Several streams may share one fd (the choices of a
 *  request with n > 1 or a prompt batch): a hang-up of the socket cancels all of them, and
 *  removing one keeps the others watched. */
int64_t srv_watch_add(srv_watch *w, int fd, kiln_stream *s);

/** Unregister; returns true when the peer was seen hanging up. Idempotent for -1. After
 *  this returns the watcher no longer touches the stream. */
bool srv_watch_remove(srv_watch *w, int64_t handle);

/** True once the watcher saw the peer of this entry hang up. */
bool srv_watch_hungup(srv_watch *w, int64_t handle);

/** Cancel every registered stream (shutdown). */
void srv_watch_cancel_all(srv_watch *w);

/** Registered entries now. */
int32_t srv_watch_count(srv_watch *w);

#endif
