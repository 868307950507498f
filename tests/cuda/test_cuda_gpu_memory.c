/*
 * test_cuda_gpu_memory - kiln_engine_params.gpu_memory (`--gpu-memory BYTES|FRACTION`, issue
 * 16) with pycode10M's weights on the GPU, f32 KV pages, the engine's defaults (step 512,
 * n_ctx 1024):
 *   - kiln_device_memory: 0 < free <= total;
 *   - gpu_memory = weights + scratch + 10 KV blocks + half a block (bytes, the arithmetic of
 *     memory_budget and `kiln fit`, model/model_fit.h): the pool holds exactly 10 blocks
 *     (kiln_engine_get_params), so the same bytes as a fraction of the total give the same;
 *   - a budget half a block short of one block: KILN_ERR_INVALID_ARGUMENT naming gpu_memory
 *     with the figures;
 *   - 1.0 (the whole device, more than is free beside the weights): KILN_ERR_OUT_OF_MEMORY
 *     saying by how much to lower it;
 *   - with kv_tokens: KILN_ERR_INVALID_ARGUMENT.
 * Without a GPU it prints "skipped: no CUDA device" and exits 77.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device_test.h"
#include "kiln.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/model_fit.h"
#include "test.h"

int main(void) {
    kiln_test_require_cuda(0);
    const char *path = kiln_test_shared("models/pycode10M");
    kiln_test_require_file(path);
    kiln_error e = {0};
    int64_t free_b = 0, total_b = 0;
    REQUIRE(kiln_device_memory(KILN_DEVICE_CUDA, 0, &free_b, &total_b, &e) == KILN_OK);
    CHECKF(free_b > 0 && free_b <= total_b, "device memory: free %lld, total %lld",
           (long long)free_b, (long long)total_b);
    CHECK(kiln_device_memory(KILN_DEVICE_CPU, 0, &free_b, &total_b, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    kiln_model *m = NULL;
    const kiln_model_params mp = {.device = KILN_DEVICE_CUDA, .device_index = 0};
    REQUIRE(kiln_model_load(path, &mp, &m, &e) == KILN_OK);
    REQUIRE(kiln_model_device(m, NULL) == KILN_DEVICE_CUDA);
    const int64_t w = kiln_model_weights_bytes(m), scratch = kiln_model_scratch_bytes(m, 512, 1024);
    const int64_t block = kiln_kv_block_bytes(m->cfg.n_layer,
                                              (int64_t)m->cfg.n_head_kv * m->cfg.head_dim, 16,
                                              KILN_DTYPE_F32);
    REQUIRE(kiln_device_memory(KILN_DEVICE_CUDA, 0, &free_b, &total_b, &e) == KILN_OK);
    kiln_engine_params p = kiln_engine_default_params();
    p.n_ctx = 1024;
    p.step_tokens = 512;
    kiln_engine *eng = NULL;
    /* bytes, then the same as a fraction of the total (rounded up to whole bytes there) */
    for (int frac = 0; frac < 2; frac++) {
        const double bytes = (double)(w + scratch + 10 * block + block / 2);
        p.gpu_memory = frac ? (bytes + 0.5) / (double)total_b : bytes;
        CHECKF(kiln_engine_create(m, &p, &eng, &e) == KILN_OK, "engine: %s", e.message);
        if (eng) {
            kiln_engine_params got;
            kiln_engine_get_params(eng, &got);
            CHECKF(got.kv_tokens == 10 * 16 && got.kv_memory == 10 * block,
                   "gpu_memory %g: pool of %d tokens, %lld bytes; want 160, %lld", p.gpu_memory,
                   got.kv_tokens, (long long)got.kv_memory, (long long)(10 * block));
            kiln_engine_destroy(eng);
            eng = NULL;
        }
    }
    p.gpu_memory = (double)(w + scratch + block / 2);
    CHECK(kiln_engine_create(m, &p, &eng, &e) == KILN_ERR_INVALID_ARGUMENT &&
          strstr(e.message, "gpu_memory") && strstr(e.message, "KV block"));
    printf("too small: %s\n", e.message);
    p.gpu_memory = 1.0;
    CHECK(kiln_engine_create(m, &p, &eng, &e) == KILN_ERR_OUT_OF_MEMORY &&
          strstr(e.message, "lower it"));
    printf("1.0: %s\n", e.message);
    p.gpu_memory = 0.5;
    p.kv_tokens = 64;
    CHECK(kiln_engine_create(m, &p, &eng, &e) == KILN_ERR_INVALID_ARGUMENT &&
          strstr(e.message, "gpu_memory"));
    printf("gpu_memory: device 0 %.2f GiB total, %.2f GiB free; pycode10M weights %lld bytes, "
           "scratch %lld, block %lld: pools sized as stated\n",
           (double)total_b / (1 << 30), (double)free_b / (1 << 30), (long long)w,
           (long long)scratch, (long long)block);
    kiln_model_free(m);
    return kiln_test_finish("test_cuda_gpu_memory");
}
