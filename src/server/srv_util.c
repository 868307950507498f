/* srv_util.c - buffers, clocks, ids and UTF-8 repair for the HTTP server. */
#include "server/srv_util.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "util/utf8.h"

static bool buf_reserve(srv_buf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

bool srv_buf_add(srv_buf *b, const void *s, size_t n) {
    if (!buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

bool srv_buf_adds(srv_buf *b, const char *s) {
    return srv_buf_add(b, s, strlen(s));
}

bool srv_buf_addf(srv_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return false;
    }
    if ((size_t)n < sizeof small) return srv_buf_add(b, small, (size_t)n);
    if (!buf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void srv_buf_consume(srv_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        if (b->p) b->p[0] = '\0';
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = '\0';
}

void srv_buf_reset(srv_buf *b) {
    b->len = 0;
    b->oom = false;
    if (b->p) b->p[0] = '\0';
}

void srv_buf_free(srv_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

double srv_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

void srv_random(void *out, size_t n) {
    unsigned char *p = out;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(p + got, n - got, GRND_NONBLOCK);
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got == n) return;
    /* No entropy source: a clock- and counter-seeded mix (ids stay unique, not secret). */
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 __atomic_add_fetch(&counter, 0x9E3779B97F4A7C15ull, __ATOMIC_RELAXED);
    for (; got < n; got++) {
        x = mix64(x + 0x9E3779B97F4A7C15ull);
        p[got] = (unsigned char)x;
    }
}

uint64_t srv_random_u64(void) {
    uint64_t x;
    srv_random(&x, sizeof x);
    return x;
}

void srv_make_id(const char *prefix, char *out, size_t cap) {
    unsigned char r[12];
    srv_random(r, sizeof r);
    char hex[25];
    for (int i = 0; i < 12; i++) snprintf(hex + 2 * i, 3, "%02x", r[i]);
    snprintf(out, cap, "%s%s", prefix, hex);
}

bool srv_utf8_repair(const char *s, size_t n, srv_buf *out) {
    static const char repl[] = "\xEF\xBF\xBD";
    size_t i = 0;
    while (i < n) {
        int l = kiln_utf8_seq_len(s + i, n - i);
        if (l > 0) {
            if (!srv_buf_add(out, s + i, (size_t)l)) return false;
            i += (size_t)l;
            continue;
        }
        /* Maximal invalid subpart: the lead byte plus the continuation bytes that still
         * form a valid prefix (Unicode 15 ch. 3, "U+FFFD substitution of maximal subparts").
         * kiln_utf8_seq_len returns -1 for a valid incomplete prefix; find its length. */
        size_t k = 1;
        while (i + k < n && k < 4 && kiln_utf8_seq_len(s + i, k + 1) == -1) k++;
        if (kiln_utf8_seq_len(s + i, k) != -1) k = 1; /* not even a valid prefix */
        if (!srv_buf_add(out, repl, 3)) return false;
        i += k;
    }
    if (!out->p) return srv_buf_add(out, "", 0);
    return true;
}

int64_t srv_utf8_count(const char *s, size_t n) {
    int64_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

bool srv_secret_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la; i++) d |= (unsigned char)a[i] ^ (unsigned char)b[lb ? i % lb : 0];
    return d == 0;
}
