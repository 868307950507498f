/* test.h - a minimal assertion harness for kiln's CTest binaries. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int kiln_test_failures = 0;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            kiln_test_failures++;                                                                  \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            kiln_test_failures++;                                                                  \
        }                                                                                          \
    } while (0)

/* Fatal check: stop the test now. */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond);             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Path under ../shared (an absolute path is kept as it is, for files a test fixture made in
 * the build tree); returns a static buffer (one at a time per call site use). */
static inline const char *kiln_test_shared(const char *rel) {
    static char buf[8][4096];
    static int slot = 0;
    char *b = buf[slot++ & 7];
    if (rel[0] == '/')
        snprintf(b, 4096, "%s", rel);
    else
        snprintf(b, 4096, "%s/%s", KILN_SHARED_DIR, rel);
    return b;
}

/* Skip the whole test (exit 77) when a reference file is missing, saying which. */
static inline void kiln_test_require_file(const char *path) {
    if (access(path, R_OK) != 0) {
        printf("SKIP: reference file %s is missing\n", path);
        exit(77);
    }
}

static inline int kiln_test_finish(const char *name) {
    if (kiln_test_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, kiln_test_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

#endif
