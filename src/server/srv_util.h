/*
 * srv_util.h - small helpers of the HTTP server: a growable byte buffer, clocks, request ids
 * and UTF-8 repair for JSON strings.
 */
#ifndef KILN_SERVER_SRV_UTIL_H
#define KILN_SERVER_SRV_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** A growable byte buffer; always NUL-terminated when p != NULL. Zero-initialise to start. */
typedef struct srv_buf {
    char *p;
    size_t len, cap;
    bool oom; /* an append failed; the content is then incomplete */
} srv_buf;

/** Append s[0..n). On allocation failure sets b->oom and returns false. */
bool srv_buf_add(srv_buf *b, const void *s, size_t n);
/** Append a NUL-terminated string. */
bool srv_buf_adds(srv_buf *b, const char *s);
/** Append printf-formatted text. */
bool srv_buf_addf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Drop the first n bytes (memmove). */
void srv_buf_consume(srv_buf *b, size_t n);
void srv_buf_reset(srv_buf *b);
void srv_buf_free(srv_buf *b);

/** Monotonic clock in milliseconds. */
double srv_now_ms(void);

/** Fill out[0..n) with random bytes (getrandom, falling back to a clock-seeded mix). */
void srv_random(void *out, size_t n);

/** A random 64-bit value (for unseeded sampling requests). */
uint64_t srv_random_u64(void);

/**
 * Write "<prefix><24 hex digits>" into out (cap bytes, NUL-terminated): a process-unique,
 * unguessable id such as "chatcmpl-3f9a...".
 */
void srv_make_id(const char *prefix, char *out, size_t cap);

/**
 * Copy s[0..n) to out as valid UTF-8: every invalid or incomplete sequence becomes U+FFFD
 * (as Python's bytes.decode(errors="replace") does, one U+FFFD per maximal invalid
 * subpart). Returns false on allocation failure.
 */
bool srv_utf8_repair(const char *s, size_t n, srv_buf *out);

/** Number of code points in s[0..n) counted as lead bytes (bytes that are not 10xxxxxx). */
int64_t srv_utf8_count(const char *s, size_t n);

/** Constant-time comparison of two NUL-terminated strings (length leaks, content does not). */
bool srv_secret_equal(const char *a, const char *b);

#endif
