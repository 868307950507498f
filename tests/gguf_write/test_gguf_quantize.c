/*
 * test_gguf_quantize - `kiln quantize` (src/cli/cmd_quantize.c) end to end.
 *
 * References:
 *   - llama2xs-f32.gguf and llama.cpp's own llama2xs-Q8_0.gguf of the same weights
 *     (../shared/models, made by llama-quantize), plus llama.cpp's logits for both
 *     (../shared/golden/llamacpp-llama2xs-{f32,Q8_0}.safetensors);
 *   - ggml's Q8_0 reference quantizer semantics (quantize_row_q8_0_ref: d = amax / 127,
 *     q = roundf(x / d), d stored as the nearest fp16), re-implemented here to check that
 *     llama.cpp's file bytes are what that rule gives, and to report whether kiln's
 *     quantizer (which rounds d up to the next fp16 to bound its error) gives the same bytes;
 *   - llama.cpp's llama_ftype numbers (llama.h) for general.file_type.
 * Tolerances (stated up front, not fitted): kiln's q8_0 file must be no noisier than
 * llama.cpp's: max |logits(kiln q8_0) - logits(f32)| <= 1.5 x max |logits(llama.cpp Q8_0) -
 * logits(f32)| + 1e-3, both through kiln. For the other types the relative RMS error of each
 * tensor is bounded by the format (q8_0 1%, q6_k 3%, q4_0 / q4_k 15%, f16 0.1%, bf16 1%),
 * which a scrambled row or block would break by a factor of ~100.
 */
#include "gw_util.h"

#include "format/safetensors.h"

/* ---- ggml's Q8_0 rule, for the byte comparison --------------------------------------- */

static void ggml_rule_q8_0(const float *x, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = kiln_fp32_to_fp16(d);
        uint8_t *o = out + b * 34;
        o[0] = (uint8_t)dh;
        o[1] = (uint8_t)(dh >> 8);
        for (int j = 0; j < 32; j++) o[2 + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
    }
}

static kiln_gguf *open_gguf(const char *path) {
    kiln_error e = {0};
    kiln_gguf *g = NULL;
    if (kiln_gguf_open(path, &g, &e) != KILN_OK) {
        fprintf(stderr, "%s\n", e.message);
        kiln_test_failures++;
        return NULL;
    }
    return g;
}

static bool values_equal(const kiln_gguf_value *a, const kiln_gguf_value *b) {
    if (a->type != b->type) return false;
    if (a->type == KILN_GGUF_STRING)
        return a->str.len == b->str.len && !memcmp(a->str.data, b->str.data, a->str.len);
    if (a->type == KILN_GGUF_ARRAY) {
        if (a->arr.elem_type != b->arr.elem_type || a->arr.n != b->arr.n) return false;
        if (a->arr.elem_type == KILN_GGUF_STRING) {
            const kiln_gguf_str *x = a->arr.data, *y = b->arr.data;
            for (uint64_t i = 0; i < a->arr.n; i++)
                if (x[i].len != y[i].len || memcmp(x[i].data, y[i].data, x[i].len)) return false;
            return true;
        }
        if (a->arr.elem_type == KILN_GGUF_ARRAY) return true; /* none in these files */
        size_t es = a->arr.elem_type <= KILN_GGUF_INT8 || a->arr.elem_type == KILN_GGUF_BOOL ? 1
                    : a->arr.elem_type <= KILN_GGUF_INT16                                    ? 2
                    : a->arr.elem_type <= KILN_GGUF_FLOAT32                                  ? 4
                                                                                             : 8;
        return a->arr.n == 0 || !memcmp(a->arr.data, b->arr.data, a->arr.n * es);
    }
    return memcmp(&a->u64, &b->u64, sizeof a->u64) == 0;
}

static float *logits_of(const char *path, const int32_t *ids, int32_t n) {
    kiln_model *m = gw_open_model(path, false);
    REQUIRE(m);
    float *l = gw_forward_all(m, ids, n);
    kiln_model_close(m);
    return l;
}

/* ---- llama2xs f32 -> q8_0 ------------------------------------------------------------ */

static void test_llama2xs_q8_0(void) {
    const char *f32p = kiln_test_shared("models/llama2xs-260K/llama2xs-f32.gguf");
    const char *refq8 = kiln_test_shared("models/llama2xs-260K/llama2xs-Q8_0.gguf");
    const char *gold = kiln_test_shared("golden/llamacpp-llama2xs-f32.safetensors");
    kiln_test_require_file(f32p);
    kiln_test_require_file(refq8);
    kiln_test_require_file(gold);
    const char *out = gw_path("llama2xs-q8_0.gguf");
    const char *args[] = {"quantize", f32p, out, "--type", "q8_0", "-t", "2", NULL};
    CHECK(gw_kiln(args) == 0);
    CHECK(access(gw_path("llama2xs-q8_0.gguf.tmp"), F_OK) != 0);

    kiln_gguf *src = open_gguf(f32p), *q = open_gguf(out), *ref = open_gguf(refq8);
    REQUIRE(src && q && ref);
    /* metadata: every source pair in its order, then the keys the source lacked */
    size_t extra = !kiln_gguf_find(src, "general.quantization_version") +
                   !kiln_gguf_find(src, "general.file_type");
    CHECKF(q->n_kv == src->n_kv + extra, "%zu keys, source %zu + %zu", q->n_kv, src->n_kv, extra);
    for (size_t i = 0; i < src->n_kv && i < q->n_kv; i++) {
        CHECK(!strcmp(src->kv[i].key, q->kv[i].key));
        if (strcmp(src->kv[i].key, "general.file_type") != 0)
            CHECKF(values_equal(&src->kv[i].value, &q->kv[i].value), "key %s changed",
                   src->kv[i].key);
    }
    uint32_t ft = 0, qv = 0;
    CHECK(kiln_gguf_get_u32(q, "general.file_type", &ft) && ft == 7);
    CHECK(kiln_gguf_get_u32(q, "general.quantization_version", &qv) && qv == 2);

    /* tensors: 2-D weights q8_0 (within d/2 of the source), the rest f32 and unchanged */
    size_t n_q8 = 0, blocks = 0, kiln_same = 0, rule_same = 0, ref_blocks = 0;
    for (size_t i = 0; i < src->n_tensors; i++) {
        const kiln_gguf_tensor *s = &src->tensors[i];
        const kiln_gguf_tensor *t = kiln_gguf_find_tensor(q, s->name);
        CHECKF(t, "tensor %s missing", s->name);
        if (!t) continue;
        for (int d = 0; d < 4; d++) CHECK(t->ne[d] == s->ne[d]);
        if (s->n_dims == 1) {
            CHECK(t->dtype == KILN_DTYPE_F32 && !memcmp(t->data, s->data, s->nbytes));
            continue;
        }
        CHECKF(t->dtype == KILN_DTYPE_Q8_0, "%s is %s", t->name, kiln_dtype_name(t->dtype));
        if (t->dtype != KILN_DTYPE_Q8_0) continue;
        n_q8++;
        int64_t n = s->ne[0] * s->ne[1];
        const float *x = s->data;
        float *deq = gw_tensor_f32(t);
        for (int64_t b = 0; b < n / 32; b++) {
            float amax = gw_max_abs(x + b * 32, 32);
            float bound = amax / 127.0f * (1.0f + 1.0f / 1024.0f) * 0.5f + 1e-7f;
            float err = gw_max_abs_diff(deq + b * 32, x + b * 32, 32);
            if (!(err <= bound)) {
                CHECKF(err <= bound, "%s block %lld: error %g > %g", t->name, (long long)b, err,
                       bound);
                break;
            }
        }
        free(deq);
        /* bytes vs llama.cpp's Q8_0 file */
        const kiln_gguf_tensor *r = kiln_gguf_find_tensor(ref, s->name);
        if (!r || r->dtype != KILN_DTYPE_Q8_0 || r->nbytes != t->nbytes) continue;
        uint8_t *rule = malloc(t->nbytes);
        ggml_rule_q8_0(x, n, rule);
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *rb = (const uint8_t *)r->data + b * 34;
            kiln_same += !memcmp((const uint8_t *)t->data + b * 34, rb, 34);
            rule_same += !memcmp(rule + b * 34, rb, 34);
        }
        ref_blocks += (size_t)(n / 32);
        blocks += (size_t)(n / 32);
        free(rule);
    }
    CHECK(n_q8 == 37); /* 5 layers x 7 matrices + token_embd + output */
    CHECK(ref_blocks > 0);
    /* the reference rule reproduces llama.cpp's bytes exactly: the byte comparison is sound */
    CHECKF(rule_same == ref_blocks, "ggml's Q8_0 rule matches %zu of %zu llama.cpp blocks",
           rule_same, ref_blocks);
    printf("q8_0 bytes vs llama.cpp llama2xs-Q8_0.gguf: kiln's quantizer %zu/%zu blocks "
           "identical (%.1f%%); ggml's rule re-implemented here %zu/%zu\n",
           kiln_same, blocks, 100.0 * (double)kiln_same / (double)(blocks ? blocks : 1), rule_same,
           ref_blocks);

    /* logits through kiln: kiln's q8_0 is no noisier than llama.cpp's Q8_0 */
    kiln_error e = {0};
    kiln_safetensors *g = NULL;
    REQUIRE(kiln_safetensors_open(gold, &g, &e) == KILN_OK);
    const kiln_st_tensor *ids = kiln_safetensors_find(g, "input_ids");
    REQUIRE(ids && ids->dtype == KILN_DTYPE_I32);
    int32_t T = (int32_t)ids->shape[0];
    float *lf = logits_of(f32p, ids->data, T), *lk = logits_of(out, ids->data, T),
          *lr = logits_of(refq8, ids->data, T);
    size_t nl = (size_t)T * 512;
    float dk = gw_max_abs_diff(lk, lf, nl), dr = gw_max_abs_diff(lr, lf, nl);
    float tol = 1.5f * dr + 1e-3f;
    CHECKF(dk <= tol, "kiln q8_0 logits differ from f32 by %g > %g (llama.cpp's Q8_0: %g)", dk, tol,
           dr);
    /* same argmax as f32 wherever f32's top-2 logits are more than 0.05 apart */
    int32_t argmax_bad = 0, argmax_n = 0;
    for (int32_t r = 0; r < T; r++) {
        const float *a = lf + (size_t)r * 512, *b = lk + (size_t)r * 512;
        int32_t i1 = 0, j1 = 0;
        for (int32_t v = 1; v < 512; v++) {
            if (a[v] > a[i1]) i1 = v;
            if (b[v] > b[j1]) j1 = v;
        }
        float second = -INFINITY;
        for (int32_t v = 0; v < 512; v++)
            if (v != i1 && a[v] > second) second = a[v];
        if (a[i1] - second > 0.05f) {
            argmax_n++;
            argmax_bad += i1 != j1;
        }
    }
    CHECKF(argmax_bad == 0, "%d of %d confident argmaxes changed", argmax_bad, argmax_n);
    printf("llama2xs logits max|q8_0 - f32| over [%d, 512]: kiln q8_0 %.4g, llama.cpp Q8_0 %.4g "
           "(tolerance %.4g); argmax kept at %d/%d confident positions\n",
           T, dk, dr, tol, argmax_n - argmax_bad, argmax_n);
    free(lf);
    free(lk);
    free(lr);
    kiln_safetensors_close(g);
    kiln_gguf_close(src);
    kiln_gguf_close(q);
    kiln_gguf_close(ref);
}

/* ---- every type, on a gen-model tiny file (rows of 64 and 256: k-quants fit ffn_down) - */

typedef struct qtype {
    const char *arg;
    kiln_dtype dt;
    uint32_t ftype;  /* llama.h llama_ftype */
    float rel_rms;   /* bound on a tensor's relative RMS error */
    float rel_logit; /* bound on max |logit diff| / max |f32 logit| */
} qtype;

static void test_all_types(void) {
    const char *vocab = kiln_test_shared("tokenizer/ggml-vocab-llama-spm.gguf");
    kiln_test_require_file(vocab);
    const char *f32p = gw_path("tiny-f32.gguf");
    const char *gen[] = {"gen-model", "--preset", "tiny", "--type", "f32", "--seed",
                         "5",         "--vocab",  vocab,  "-o",     f32p,  NULL};
    REQUIRE(gw_kiln(gen) == 0);
    static const int32_t ids[] = {1,   450, 4996,  17354, 1701,  29916, 432, 17204,
                                  975, 278, 17366, 11203, 29889, 13,    1576};
    const int32_t T = (int32_t)(sizeof ids / sizeof ids[0]);
    float *lf = logits_of(f32p, ids, T);
    const size_t nl = (size_t)T * 32000;
    const float lmax = gw_max_abs(lf, nl);
    kiln_gguf *src = open_gguf(f32p);
    REQUIRE(src);
    static const qtype types[] = {
        {"q8_0", KILN_DTYPE_Q8_0, 7, 0.01f, 0.05f}, {"q4_0", KILN_DTYPE_Q4_0, 2, 0.15f, 0.5f},
        {"q4_k", KILN_DTYPE_Q4_K, 15, 0.15f, 0.5f}, {"Q6_K", KILN_DTYPE_Q6_K, 18, 0.03f, 0.1f},
        {"f16", KILN_DTYPE_F16, 1, 0.001f, 0.005f}, {"bf16", KILN_DTYPE_BF16, 32, 0.01f, 0.05f},
    };
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const qtype *qt = &types[k];
        char name[64];
        snprintf(name, sizeof name, "tiny-%s.gguf", qt->arg);
        const char *out = gw_path(name);
        const char *args[] = {"quantize", f32p, out, "--type", qt->arg, NULL};
        CHECK(gw_kiln(args) == 0);
        kiln_gguf *g = open_gguf(out);
        if (!g) continue;
        uint32_t ft = 0, qv = 0;
        CHECKF(kiln_gguf_get_u32(g, "general.file_type", &ft) && ft == qt->ftype,
               "%s: file_type %u", qt->arg, ft);
        bool quant = kiln_dtype_traits_of(qt->dt)->is_quantized;
        CHECK(kiln_gguf_get_u32(g, "general.quantization_version", &qv) == quant);
        CHECK(!quant || qv == 2);
        int32_t bs = kiln_dtype_traits_of(qt->dt)->block_size;
        size_t n_target = 0;
        float worst = 0.0f;
        for (size_t i = 0; i < src->n_tensors; i++) {
            const kiln_gguf_tensor *s = &src->tensors[i], *t = kiln_gguf_find_tensor(g, s->name);
            REQUIRE(t);
            kiln_dtype want = s->n_dims == 2 && s->ne[0] % bs == 0 ? qt->dt : KILN_DTYPE_F32;
            CHECKF(t->dtype == want, "%s: %s is %s, want %s", qt->arg, s->name,
                   kiln_dtype_name(t->dtype), kiln_dtype_name(want));
            if (t->dtype != qt->dt) continue;
            n_target++;
            int64_t n = s->ne[0] * s->ne[1];
            float *deq = gw_tensor_f32(t);
            const float *x = s->data;
            double se = 0, sx = 0;
            for (int64_t j = 0; j < n; j++) {
                se += (double)(deq[j] - x[j]) * (deq[j] - x[j]);
                sx += (double)x[j] * x[j];
            }
            float rel = (float)sqrt(se / sx);
            if (rel > worst) worst = rel;
            CHECKF(rel <= qt->rel_rms, "%s: %s relative RMS error %g > %g", qt->arg, s->name, rel,
                   qt->rel_rms);
            free(deq);
        }
        /* k-quants fit only ffn_down (rows of 256) in each of the 2 layers */
        CHECK(n_target == (bs == 256 ? 2u : 2u + 2u * 7u));
        float *lq = logits_of(out, ids, T);
        float d = gw_max_abs_diff(lq, lf, nl);
        CHECKF(d <= qt->rel_logit * lmax, "%s: logits differ by %g > %g x %g", qt->arg, d,
               qt->rel_logit, lmax);
        printf("tiny %-5s: %2zu tensors converted, worst relative RMS error %.3g, max|logit diff| "
               "%.3g (max|logit| %.3g)\n",
               qt->arg, n_target, worst, d, lmax);
        free(lq);
        kiln_gguf_close(g);
    }
    /* re-quantizing a quantized file works (with a warning) */
    const char *rq[] = {
        "quantize", gw_path("tiny-q8_0.gguf"), gw_path("tiny-rq.gguf"), "--type", "q4_0", NULL};
    char errbuf[4096];
    CHECK(run_kiln(rq, errbuf, sizeof errbuf) == 0 && strstr(errbuf, "re-quantized"));
    kiln_gguf_close(src);
    free(lf);
}

static void test_bad_input(void) {
    const char *f32p = gw_path("tiny-f32.gguf");
    char errbuf[4096];
    const char *a1[] = {"quantize", f32p, gw_path("x.gguf"), "--type", "q5_0", NULL};
    CHECK(run_kiln(a1, errbuf, sizeof errbuf) == 2 && strstr(errbuf, "--type"));
    const char *a2[] = {"quantize", f32p, gw_path("x.gguf"), NULL};
    CHECK(run_kiln(a2, errbuf, sizeof errbuf) == 2);
    const char *a3[] = {"quantize", gw_path("missing.gguf"), gw_path("x.gguf"), "--type", "q8_0",
                        NULL};
    CHECK(run_kiln(a3, errbuf, sizeof errbuf) == 1 && strstr(errbuf, "missing.gguf"));
    CHECK(access(gw_path("x.gguf"), F_OK) != 0 && access(gw_path("x.gguf.tmp"), F_OK) != 0);
    if (access("/dev/full", W_OK) == 0) {
        const char *a4[] = {"quantize", f32p, "/dev/full", "--type", "q8_0", NULL};
        int rc = run_kiln(a4, errbuf, sizeof errbuf);
        CHECKF(rc == 1 && strstr(errbuf, "/dev/full") && strstr(errbuf, "No space"),
               "quantize to /dev/full: exit %d, %s", rc, errbuf);
        CHECK(access("/dev/full.tmp", F_OK) != 0);
    }
}

int main(void) {
    gw_setup("gguf-quantize");
    test_llama2xs_q8_0();
    test_all_types();
    test_bad_input();
    rm_rf(g_tmpdir);
    return kiln_test_finish("test_gguf_quantize");
}
