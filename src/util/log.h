/*
 * log.h - kiln's one logging call: a warning about something the library recovered from on
 * its own (a corrupt cache file removed, a full disk), written as one line so a person can act
 * on it. Errors a caller must handle are returned as kiln_status values instead (DESIGN.md
 * principle 4); nothing here is fatal.
 *
 * A line reads "kiln: warning: <message>" and goes to stderr, or to a sink a program or test
 * installs (kiln_log_set_sink). Thread-safe: lines from several threads never interleave, and
 * a sink is called with a global lock held, one line at a time.
 */
#ifndef KILN_UTIL_LOG_H
#define KILN_UTIL_LOG_H

/** A log sink: receives one line ("kiln: warning: ...", NUL-terminated, no trailing newline,
 *  at most KILN_LOG_LINE_MAX - 1 bytes; longer messages are truncated). Called with the log's
 *  lock held: it must not log itself. user is the pointer given to kiln_log_set_sink. */
typedef void (*kiln_log_sink)(void *user, const char *line);

#define KILN_LOG_LINE_MAX 1024

/**
 * Log one warning line: "kiln: warning: " followed by the printf-style message (a trailing
 * newline in fmt is not needed and not added twice). Goes to the installed sink, else to
 * stderr with one write. Any thread. Never fails (an over-long message is truncated).
 */
void kiln_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/**
 * Install a sink for every later line (NULL: back to stderr). Any thread; takes effect for
 * lines logged after it returns. Meant for tests that count or inspect warnings, and for
 * programs with their own logging.
 */
void kiln_log_set_sink(kiln_log_sink fn, void *user);

#endif
