/*
 * test_cpu_features - cpuid detection against the kernel's view (/proc/cpuinfo flags, an
 * independent source), path support rules, names, and the KILN_SIMD override.
 * Run as `test_cpu_features [scalar|avx2|avx512]`: the argument is put in KILN_SIMD
 * before the first query, and the active path must be the named one when supported.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "test.h"

/* 1 if /proc/cpuinfo lists the flag, 0 if not, -1 when cpuinfo is unavailable */
static int cpuinfo_has(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    char line[8192];
    int found = 0, seen_flags = 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        seen_flags = 1;
        char *p = strchr(line, ':');
        for (char *tok = p ? strtok(p + 1, " \t\n") : NULL; tok; tok = strtok(NULL, " \t\n"))
            if (strcmp(tok, flag) == 0) found = 1;
        break; /* first CPU is enough */
    }
    fclose(f);
    return seen_flags ? found : -1;
}

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : NULL;
    if (want)
        setenv("KILN_SIMD", want, 1);
    else
        unsetenv("KILN_SIMD");

    const kiln_cpu_features *f = kiln_cpu_features_get();
    REQUIRE(f != NULL);
    CHECK(f == kiln_cpu_features_get());
    struct {
        const char *flag;
        bool have;
    } m[] = {{"avx2", f->avx2},
             {"fma", f->fma},
             {"f16c", f->f16c},
             {"avx512f", f->avx512f},
             {"avx512bw", f->avx512bw},
             {"avx512vl", f->avx512vl},
             {"avx512dq", f->avx512dq},
             {"avx512_vnni", f->avx512vnni},
             {"avx512_bf16", f->avx512bf16}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        int c = cpuinfo_has(m[i].flag);
        printf("%-12s cpuid %d  /proc/cpuinfo %d\n", m[i].flag, m[i].have, c);
        if (c >= 0)
            CHECKF((int)m[i].have == c, "%s: cpuid says %d, kernel says %d", m[i].flag, m[i].have,
                   c);
    }
    CHECK(kiln_simd_supported(KILN_SIMD_SCALAR));
    CHECK(kiln_simd_supported(KILN_SIMD_AVX2) == (f->avx2 && f->fma && f->f16c));
    if (kiln_simd_supported(KILN_SIMD_AVX512)) CHECK(kiln_simd_supported(KILN_SIMD_AVX2));
    CHECK(strcmp(kiln_simd_name(KILN_SIMD_SCALAR), "scalar") == 0);
    CHECK(strcmp(kiln_simd_name(KILN_SIMD_AVX2), "avx2") == 0);
    CHECK(strcmp(kiln_simd_name(KILN_SIMD_AVX512), "avx512") == 0);

    kiln_simd a = kiln_simd_active();
    CHECK(kiln_simd_supported(a));
    kiln_simd best = kiln_simd_supported(KILN_SIMD_AVX512) ? KILN_SIMD_AVX512
                     : kiln_simd_supported(KILN_SIMD_AVX2) ? KILN_SIMD_AVX2
                                                           : KILN_SIMD_SCALAR;
    kiln_simd expect = best;
    if (want && strcmp(want, "scalar") == 0) expect = KILN_SIMD_SCALAR;
    if (want && strcmp(want, "avx2") == 0 && best >= KILN_SIMD_AVX2) expect = KILN_SIMD_AVX2;
    printf("KILN_SIMD=%s -> active %s (best %s)\n", want ? want : "(unset)", kiln_simd_name(a),
           kiln_simd_name(best));
    CHECK(a == expect);
    CHECK(kiln_simd_active() == a); /* read once */
    return kiln_test_finish("test_cpu_features");
}
