/* cli_test_util.h - run the kiln binary from a test and capture its output. */
#ifndef KILN_CLI_TEST_UTIL_H
#define KILN_CLI_TEST_UTIL_H

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "test.h"

static char g_tmpdir[256];
static char g_kiln[1024];

/* Run kiln with args (NULL-terminated); returns its exit code (-signal if killed) and fills
 * err_out (NUL-terminated, truncated to cap) with its stderr. stdout goes to out_path, or
 * /dev/null when out_path is NULL. g_kiln and g_tmpdir must be set. */
static int run_kiln_to(const char *const *args, const char *out_path, char *err_out, size_t cap) {
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", g_tmpdir);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int null = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || null < 0) _exit(126);
        dup2(fd, 2);
        dup2(null, 1);
        const char *argv[32];
        argv[0] = g_kiln;
        int i = 1;
        for (; args[i - 1] && i < 31; i++) argv[i] = args[i - 1];
        argv[i] = NULL;
        execv(g_kiln, (char *const *)argv);
        _exit(127);
    }
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    FILE *f = fopen(errpath, "rb");
    size_t n = f ? fread(err_out, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    err_out[n] = '\0';
    if (WIFSIGNALED(status)) return -WTERMSIG(status);
    return WEXITSTATUS(status);
}

static int run_kiln(const char *const *args, char *err_out, size_t cap) {
    return run_kiln_to(args, NULL, err_out, cap);
}

#endif
