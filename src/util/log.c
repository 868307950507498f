/* log.c - warning lines to stderr or an installed sink (see log.h). */
#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static kiln_log_sink log_fn;
static void *log_user;

void kiln_log_set_sink(kiln_log_sink fn, void *user) {
    pthread_mutex_lock(&log_mu);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_mu);
}

void kiln_log_warn(const char *fmt, ...) {
    char line[KILN_LOG_LINE_MAX + 1]; /* room for the newline stderr gets */
    static const char prefix[] = "kiln: warning: ";
    size_t n = sizeof prefix - 1;
    memcpy(line, prefix, n);
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line + n, KILN_LOG_LINE_MAX - n, fmt, ap);
    va_end(ap);
    if (k > 0) n += (size_t)k < KILN_LOG_LINE_MAX - n ? (size_t)k : KILN_LOG_LINE_MAX - n - 1;
    while (n > sizeof prefix - 1 && line[n - 1] == '\n') n--;
    line[n] = '\0';
    pthread_mutex_lock(&log_mu);
    if (log_fn) {
        log_fn(log_user, line);
    } else {
        line[n] = '\n';
        ssize_t w = write(STDERR_FILENO, line, n + 1);
        (void)w;
        line[n] = '\0';
    }
    pthread_mutex_unlock(&log_mu);
}
