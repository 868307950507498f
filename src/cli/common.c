#include <errno.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

int cli_fail(const kiln_error *err) {
    fprintf(stderr, "kiln: error: %s\n",
            err->message[0] ? err->message : kiln_status_name(err->status));
    return KILN_EXIT_ERROR;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    fprintf(stderr, "kiln %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(run 'kiln %s --help' for usage)\n", cmd);
    return KILN_EXIT_USAGE;
}

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_f32(const char *s, float lo, float hi, float *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

char *cli_read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, stdin);
        if (r == 0) break;
        n += r;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int cli_threadpool(int n, kiln_threadpool **tp) {
    *tp = NULL;
    if (n <= 0) n = kiln_physical_cores();
    if (n == 1) return 0;
    kiln_error err = {0};
    if (kiln_threadpool_create(n, tp, &err) != KILN_OK) return cli_fail(&err);
    return 0;
}

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

bool cli_parse_kv_type(const char *s, kiln_dtype *out) {
    if (!strcmp(s, "f32"))
        *out = KILN_DTYPE_F32;
    else if (!strcmp(s, "f16"))
        *out = KILN_DTYPE_F16;
    else
        return false;
    return true;
}

uint64_t cli_random_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
        /* no entropy source: mix the clock's nanoseconds and the pid */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
               ((uint64_t)getpid() << 32);
    }
    return seed >> 1; /* keep it printable as a non-negative int64 for --seed */
}

int cli_check_stdout(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kiln: error: writing to standard output failed: %s\n", strerror(errno));
        return KILN_EXIT_ERROR;
    }
    return 0;
}

bool cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

void cli_warn_ctx(const char *cmd, const kiln_model *m, int64_t n_ctx) {
    int32_t train = kiln_model_n_ctx_train(m);
    if (train > 0 && n_ctx > train)
        fprintf(stderr,
                "kiln %s: warning: --ctx %lld exceeds the model's training context of %d "
                "positions; output past position %d may degrade\n",
                cmd, (long long)n_ctx, train, train);
}
