/*
 * test_log - kiln_log_warn (util/log.h): one "kiln: warning: " line per call, delivered to an
 * installed sink (newline-free, truncated to KILN_LOG_LINE_MAX - 1 bytes) and, after the sink
 * is removed, to stderr again.
 *
 * Oracle: the line format log.h documents.
 */
#include <stdio.h>
#include <string.h>

#include "test.h"
#include "util/log.h"

static int n_lines;
static char last[KILN_LOG_LINE_MAX + 16];

static void sink(void *user, const char *line) {
    CHECK(user == &n_lines);
    n_lines++;
    snprintf(last, sizeof last, "%s", line);
}

int main(void) {
    kiln_log_set_sink(sink, &n_lines);
    kiln_log_warn("cache file %s: %s", "a/b.kvb", "bad magic");
    CHECK(n_lines == 1);
    CHECK(strcmp(last, "kiln: warning: cache file a/b.kvb: bad magic") == 0);

    kiln_log_warn("trailing newline\n");
    CHECK(n_lines == 2);
    CHECK(strcmp(last, "kiln: warning: trailing newline") == 0);

    char big[3 * KILN_LOG_LINE_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kiln_log_warn("%s", big);
    CHECK(n_lines == 3);
    CHECK(strlen(last) == KILN_LOG_LINE_MAX - 1);
    CHECK(strncmp(last, "kiln: warning: xxx", 18) == 0);

    kiln_log_set_sink(NULL, NULL);
    kiln_log_warn("this line goes to stderr (expected in the test output)");
    CHECK(n_lines == 3);
    return kiln_test_finish("test_log");
}
