#include "util/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

kiln_status kiln_mapped_file_open(const char *path, kiln_mapped_file **out, kiln_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_error_set(err, KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kiln_error_set(err, KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: is a directory, not a file",
                              path);
    }
    kiln_mapped_file *f = calloc(1, sizeof *f);
    char *p = strdup(path);
    if (!f || !p) {
        free(f);
        free(p);
        close(fd);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    f->path = p;
    f->size = (size_t)st.st_size;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(p);
            free(f);
            return kiln_error_set(err, KILN_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
        f->data = m;
    }
    close(fd);
    *out = f;
    return KILN_OK;
}

bool kiln_mapped_file_contains(const kiln_mapped_file *f, const void *p, size_t n) {
    if (!f || !f->data || !p) return false;
    uintptr_t base = (uintptr_t)f->data, a = (uintptr_t)p;
    return a >= base && a - base <= f->size && n <= f->size - (a - base);
}

void kiln_mapped_file_release(const kiln_mapped_file *f, const void *p, size_t n) {
    if (!kiln_mapped_file_contains(f, p, n)) return;
    uintptr_t a = (uintptr_t)p;
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return;
    uintptr_t lo = (a + (uintptr_t)ps - 1) / (uintptr_t)ps * (uintptr_t)ps;
    uintptr_t hi = (a + n) / (uintptr_t)ps * (uintptr_t)ps;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void kiln_advise_hugepages(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20, a = (uintptr_t)p;
    uintptr_t lo = (a + huge - 1) & ~(huge - 1), hi = (a + n) & ~(huge - 1);
    if (p && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

size_t kiln_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return kb > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kb * 1024;
}

void kiln_mapped_file_close(kiln_mapped_file *f) {
    if (!f) return;
    if (f->data) munmap((void *)f->data, f->size);
    free(f->path);
    free(f);
}

kiln_status kiln_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                           kiln_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return kiln_error_set(err, KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(fp);
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > max_bytes + 1) {
                free(buf);
                fclose(fp);
                return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                                      "%s: larger than the %zu-byte limit", path, max_bytes);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(fp);
                return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, fp);
        n += r;
        if (r == 0) break;
    }
    int failed = ferror(fp);
    fclose(fp);
    if (failed) {
        free(buf);
        return kiln_error_set(err, KILN_ERR_IO, "%s: read error", path);
    }
    if (n > max_bytes) {
        free(buf);
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "%s: larger than the %zu-byte limit",
                              path, max_bytes);
    }
    buf[n] = '\0';
    *out = buf;
    if (out_len) *out_len = n;
    return KILN_OK;
}
