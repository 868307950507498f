/*
 * The delayed KV transition (kiln_engine_params.kv_quant_start; issue 14), on pycode10M
 * (a trained 10M Llama, kv_dim 128) with q8_0 K and V, and again with TurboQuant turbo:k8v3
 * (K at 8 bits, V at 3; the f16 blocks and the converted turbo blocks of one sequence are read
 * by one rotated-domain kernel), block size 16, greedy:
 *   1. until N: a request whose sequence never passes N = 300 positions (40 + 200) gives
 *      logits and tokens bitwise those of an f16-KV engine, and converts nothing;
 *   2. after N = 64: the rows computed while the sequence was at most N positions long (the
 *      generated tokens 0..25: positions 39..64) are bitwise the f16 engine's; later rows
 *      differ (the pages really changed) but stay close: argmax equal to f32 KV's at >= 90% of
 *      the generated positions, max |dlogit| printed; the pool converted the committed full
 *      blocks (>= 13 of the 15), held at most ceil(N / 16) + 4 f16 blocks at any step (no
 *      prefix cache: a converted block's f16 storage is free again), and the quantized blocks
 *      it held grew to the sequence's full blocks;
 *   3. the prefix cache with the transition: a second identical request reuses the indexed
 *      f16 originals and gives the same bits as the first (cached = uncached);
 *   4. speculative rollback across the transition: random drafts (mostly rejected, so every
 *      verify step rolls back) finish with the same number of tokens, the rows before N
 *      bitwise the plain run's, and every block back in the pool.
 */
#include <math.h>

#include "engine_test_util.h"

#define BS     16
#define NPR    40
#define NGEN   200
#define MODEL  "models/pycode10M"

typedef struct watch {
    int32_t max_hi_held, max_main_held;
    int64_t converted;
} watch;

static void on_step(void *user, kiln_engine *e, int64_t step) {
    (void)step;
    watch *w = user;
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    if (st.kv_blocks_hi_held > w->max_hi_held) w->max_hi_held = st.kv_blocks_hi_held;
    if (st.kv_blocks_main_held > w->max_main_held) w->max_main_held = st.kv_blocks_main_held;
    w->converted = st.kv_blocks_converted;
}

/* run n_req identical greedy requests one after another on one engine; res[n_req] */
static kiln_engine_stats run(const kiln_model *m, kiln_kv_type kv, int32_t quant_start,
                             bool prefix_cache, kiln_spec_source spec, const int32_t *prompt,
                             int n_req, et_result *res, watch *w) {
    kiln_engine_params p = kiln_engine_default_params();
    p.kv_type = kv;
    p.kv_quant_start = quant_start;
    p.block_size = BS;
    p.kv_tokens = 4096;
    p.max_seqs = 4;
    p.n_ctx = 512;
    p.n_threads = 1;
    p.no_prefix_cache = !prefix_cache;
    p.spec = spec;
    memset(w, 0, sizeof *w);
    kiln_engine_debug dbg = {.on_step = on_step, .user = w};
    kiln_engine *e = NULL;
    kiln_error err = {0};
    REQUIRE(kiln_engine_create_debug(m, &p, &dbg, &e, &err) == KILN_OK);
    for (int r = 0; r < n_req; r++) {
        kiln_request req = kiln_request_defaults();
        req.prompt_ids = prompt;
        req.n_prompt_ids = NPR;
        req.max_tokens = NGEN;
        req.ignore_eos = true;
        req.temperature = 0.0f;
        kiln_request_debug rd = {0};
        rd.capture_logits = true;
        kiln_stream *s = NULL;
        REQUIRE(kiln_engine_submit_debug(e, &req, &rd, &s, &err) == KILN_OK);
        et_collect(s, &res[r], kiln_model_n_vocab(m));
        kiln_stream_destroy(s);
        CHECKF(res[r].finish == KILN_FINISH_LENGTH && res[r].n_tokens == NGEN,
               "kv %d start %d: finish %s after %d tokens (%s)", (int)kv, quant_start,
               kiln_finish_reason_name(res[r].finish), res[r].n_tokens, res[r].message);
    }
    kiln_engine_stats st;
    kiln_engine_get_stats(e, &st);
    kiln_engine_destroy(e);
    return st;
}

/* index of the first logits row that differs, or n */
static int32_t first_diff(const et_result *a, const et_result *b, int32_t V) {
    int32_t n = a->n_logit_rows < b->n_logit_rows ? a->n_logit_rows : b->n_logit_rows;
    for (int32_t r = 0; r < n; r++)
        if (memcmp(a->logits + (size_t)r * V, b->logits + (size_t)r * V, (size_t)V * sizeof(float)))
            return r;
    return n;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* sections 1-4 of the header with target format kv (name: for messages) */
static void check_target(const kiln_model *m, kiln_kv_type kv, const char *name,
                         const int32_t *prompt, const et_result *f16p, const et_result *f32p) {
    const int32_t V = kiln_model_n_vocab(m);
    const et_result f16 = *f16p, f32 = *f32p;
    watch w;
    static et_result q8, a, b[2], sp;
    run(m, kv, 0, false, KILN_SPEC_OFF, prompt, 1, &q8, &w);
    CHECKF(first_diff(&q8, &f16, V) == 0, "%s from the start gives f16's first row", name);

    /* 1. never past N: bitwise f16 */
    kiln_engine_stats st = run(m, kv, 300, false, KILN_SPEC_OFF, prompt, 1, &a, &w);
    CHECKF(first_diff(&a, &f16, V) == NGEN, "below N: row %d differs from f16 KV",
           first_diff(&a, &f16, V));
    CHECKF(memcmp(a.tokens, f16.tokens, sizeof(int32_t) * NGEN) == 0, "below N: tokens differ");
    CHECKF(w.converted == 0 && w.max_main_held == 0, "below N: %lld converted, %d main held",
           (long long)w.converted, w.max_main_held);
    printf("%s: kv_quant_start 300: bitwise f16 for all %d rows; pool %lld bytes (%d %s + %d f16 "
           "blocks)\n",
           name, NGEN, (long long)st.kv_bytes, st.kv_blocks_main_total, name, st.kv_blocks_hi_total);
    et_result_free(&a);

    /* 2. past N = 64 */
    const int32_t N = 64;
    run(m, kv, N, false, KILN_SPEC_OFF, prompt, 1, &a, &w);
    const int32_t fd = first_diff(&a, &f16, V), same_rows = N - NPR + 2; /* positions 39..64 */
    CHECKF(fd >= same_rows, "after N: row %d differs from f16 (rows < %d must not)", fd, same_rows);
    CHECKF(fd < NGEN, "after N: identical to f16 KV: nothing was converted");
    int agree = 0;
    float dmax = 0;
    for (int32_t r = 0; r < a.n_logit_rows && r < f32.n_logit_rows; r++) {
        agree += argmax(a.logits + (size_t)r * V, V) == argmax(f32.logits + (size_t)r * V, V);
        for (int32_t v = 0; v < V; v++) {
            const float d = fabsf(a.logits[(size_t)r * V + v] - f32.logits[(size_t)r * V + v]);
            if (!(d <= dmax)) dmax = d;
        }
    }
    CHECKF(agree * 10 >= NGEN * 9, "after N: argmax agrees with f32 KV at %d/%d", agree, NGEN);
    const int32_t full = (NPR + NGEN - 1) / BS; /* full committed blocks at the end: 14 */
    CHECKF(w.converted >= full - 1, "after N: %lld blocks converted, expected >= %d",
           (long long)w.converted, full - 1);
    CHECKF(w.max_hi_held <= (N + BS - 1) / BS + 4, "after N: %d f16 blocks held at once",
           w.max_hi_held);
    CHECKF(w.max_main_held >= full - 1, "after N: at most %d %s blocks held", w.max_main_held,
           name);
    printf("%s: kv_quant_start %d: rows 0..%d bitwise f16 (first difference at row %d); vs f32 KV "
           "argmax %d/%d, max |dlogit| %.4g; %lld blocks converted, at most %d f16 and %d %s "
           "blocks held\n",
           name, N, same_rows - 1, fd, agree, NGEN, dmax, (long long)w.converted, w.max_hi_held,
           w.max_main_held, name);

    /* 3. prefix cache: the second request reuses the first's indexed f16 blocks */
    st = run(m, kv, N, true, KILN_SPEC_OFF, prompt, 2, b, &w);
    CHECKF(first_diff(&b[0], &a, V) == NGEN, "prefix cache on, first request: row %d differs",
           first_diff(&b[0], &a, V));
    CHECKF(first_diff(&b[1], &b[0], V) == NGEN, "cached request: row %d differs from uncached",
           first_diff(&b[1], &b[0], V));
    CHECKF(st.prefix_hit_tokens >= 32, "the second request hit %lld cached tokens",
           (long long)st.prefix_hit_tokens);
    CHECKF(st.kv_blocks_used == 0, "%d blocks still used", st.kv_blocks_used);

    /* 4. speculative rollback across the transition */
    st = run(m, kv, N, false, KILN_SPEC_RANDOM, prompt, 1, &sp, &w);
    CHECKF(first_diff(&sp, &a, V) >= same_rows, "spec: row %d differs before N",
           first_diff(&sp, &a, V));
    CHECKF(st.spec_drafted > st.spec_accepted, "spec: no rejected drafts (%lld of %lld)",
           (long long)st.spec_accepted, (long long)st.spec_drafted);
    CHECKF(st.kv_blocks_used == 0, "spec: %d blocks still used", st.kv_blocks_used);
    CHECKF(w.converted >= full - 2, "spec: %lld blocks converted", (long long)w.converted);
    printf("%s: spec (random drafts, %lld of %lld accepted): rows before N bitwise, %lld converted\n",
           name, (long long)st.spec_accepted, (long long)st.spec_drafted, (long long)w.converted);

    et_result *all[] = {&q8, &a, &b[0], &b[1], &sp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) et_result_free(all[i]);
}

int main(void) {
    kiln_model *m = et_load_opt(MODEL, false);
    const int32_t V = kiln_model_n_vocab(m);
    int32_t prompt[NPR];
    et_prompt(prompt, NPR, 7, V);
    watch w;
    static et_result f16, f32;

    run(m, KILN_KV_F16, 0, false, KILN_SPEC_OFF, prompt, 1, &f16, &w);
    run(m, KILN_KV_F32, 0, false, KILN_SPEC_OFF, prompt, 1, &f32, &w);
    check_target(m, KILN_KV_Q8_0, "q8_0", prompt, &f16, &f32);
    check_target(m, KILN_KV_TURBO, "turbo:k8v3", prompt, &f16, &f32);

    et_result *all[] = {&f16, &f32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) et_result_free(all[i]);
    kiln_model_free(m);
    return kiln_test_finish("test_engine_kv_transition");
}
