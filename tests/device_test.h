/* device_test.h - which device a test runs its model on (tests/cuda registers some engine and
 * golden tests a second time for the GPU). */
#ifndef KILN_DEVICE_TEST_H
#define KILN_DEVICE_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

/* Print the CUDA skip line and exit 77 (CTest's skip) when no GPU can be used. */
static inline void kiln_test_require_cuda(int32_t index) {
    const int32_t n = kiln_device_count(KILN_DEVICE_CUDA);
    if (index >= n) {
        printf("skipped: no CUDA device%s (%d usable, device %d asked for)\n",
               n == 0 ? "" : " of that index", n, index);
        exit(77);
    }
}

/* Set mp's device from env KILN_TEST_DEVICE: unset, "" or "cpu" leave the CPU; "cuda" or
 * "cuda:N" pick that GPU, skipping the test (exit 77) when there is none. Returns the kind. */
static inline kiln_device_kind kiln_test_device(kiln_model_params *mp) {
    const char *d = getenv("KILN_TEST_DEVICE");
    if (!d || !*d || !strcmp(d, "cpu")) {
        mp->device = KILN_DEVICE_CPU; /* not the library's default (AUTO: the GPU when present) */
        return KILN_DEVICE_CPU;
    }
    if (strncmp(d, "cuda", 4) != 0 || (d[4] != '\0' && d[4] != ':')) {
        fprintf(stderr, "KILN_TEST_DEVICE='%s': expected cpu, cuda or cuda:N\n", d);
        exit(1);
    }
    mp->device = KILN_DEVICE_CUDA;
    mp->device_index = d[4] == ':' ? atoi(d + 5) : 0;
    kiln_test_require_cuda(mp->device_index);
    return KILN_DEVICE_CUDA;
}

#endif
