/*
 * cuda_launch.cu - launch settings shared by every kernel file of the CUDA backend (below
 * cuda_matmul.cu, cuda_matmul_tc.cu, cuda_attention.cu and cuda_rowwise.cu, which all call
 * it, so none of them calls another for it).
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_elem.cuh"

/* Whether kernels are launched with programmatic stream serialization (PDL; on unless the
 * environment sets KILN_CUDA_PDL=0). Read once. */
bool cu_pdl_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("KILN_CUDA_PDL");
        on = !(e && !strcmp(e, "0"));
    }
    return on != 0;
}
