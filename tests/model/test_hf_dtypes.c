/*
 * Hugging Face directories with F16 and BF16 weights. Each reference checkpoint is rewritten
 * twice into a temp dir beside its config.json: once with every tensor stored as F16 (or
 * BF16), once as F32 holding exactly the same rounded values. kiln must give the same logits
 * from both (<= 1e-4: only the kernels' handling of the storage type differs), and logits
 * close to transformers' f32 ones (the rounding of the weights: argmax agrees at >= 75% of
 * the positions; a broken dtype path would give near-random agreement). The random
 * qwen3_next checkpoint is the most sensitive to weight rounding (its logits move by ~1).
 */
#include "format/safetensors_write.h"
#include "model_test_util.h"

static float round_to(kiln_dtype t, float v) {
    return t == KILN_DTYPE_F16 ? kiln_fp16_to_fp32(kiln_fp32_to_fp16(v))
                               : kiln_bf16_to_fp32(kiln_fp32_to_bf16(v));
}

/* Write src's tensors to dir/model.safetensors as `as` (F16/BF16, or F32 of values rounded
 * to `round`). */
static void write_weights(const kiln_safetensors *src, const char *dir, kiln_dtype as,
                          kiln_dtype round) {
    kiln_st_out_tensor *out = calloc(src->n_tensors, sizeof *out);
    void **bufs = calloc(src->n_tensors, sizeof *bufs);
    REQUIRE(out && bufs);
    for (size_t i = 0; i < src->n_tensors; i++) {
        const kiln_st_tensor *t = &src->tensors[i];
        REQUIRE(t->dtype == KILN_DTYPE_F32);
        int64_t n = 1;
        for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
        const float *f = t->data;
        if (as == KILN_DTYPE_F32) {
            float *b = malloc((size_t)n * sizeof *b);
            REQUIRE(b);
            for (int64_t e = 0; e < n; e++) b[e] = round_to(round, f[e]);
            bufs[i] = b;
        } else {
            uint16_t *b = malloc((size_t)n * sizeof *b);
            REQUIRE(b);
            for (int64_t e = 0; e < n; e++)
                b[e] = as == KILN_DTYPE_F16 ? kiln_fp32_to_fp16(f[e]) : kiln_fp32_to_bf16(f[e]);
            bufs[i] = b;
        }
        out[i] = (kiln_st_out_tensor){t->name, as, t->n_dims, t->shape, bufs[i]};
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path); /* the variant dir holds a symlink to the original */
    kiln_error err = {0};
    if (kiln_safetensors_write(path, out, src->n_tensors, &err) != KILN_OK) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    for (size_t i = 0; i < src->n_tensors; i++) free(bufs[i]);
    free(bufs);
    free(out);
}

static int32_t argmax_row(const float *x, int32_t n) {
    int32_t a = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

static void check(const char *arch, kiln_dtype dt) {
    char dir[256], refp[256];
    snprintf(dir, sizeof dir, "reference/hf/%s", arch);
    snprintf(refp, sizeof refp, "reference/hf/%s/reference.safetensors", arch);
    const char *mdir = kiln_test_shared(dir), *rpath = kiln_test_shared(refp);
    if (access(rpath, R_OK) != 0) {
        printf("%-10s skipped (no reference)\n", arch);
        return;
    }
    kiln_error err = {0};
    kiln_safetensors *src = NULL, *ref = NULL;
    REQUIRE(kiln_safetensors_open(mdir, &src, &err) == KILN_OK);
    REQUIRE(kiln_safetensors_open(rpath, &ref, &err) == KILN_OK);
    char *dh = variant_dir(mdir, NULL, NULL), *df = variant_dir(mdir, NULL, NULL);
    write_weights(src, dh, dt, dt);
    write_weights(src, df, KILN_DTYPE_F32, dt);
    kiln_model *mh = NULL, *mf = NULL;
    kiln_model_load_params lp = {0};
    if (kiln_model_open(dh, &lp, &mh, &err) != KILN_OK) {
        fprintf(stderr, "%s %s: %s\n", arch, kiln_dtype_name(dt), err.message);
        kiln_test_failures++;
    } else {
        REQUIRE(kiln_model_open(df, &lp, &mf, &err) == KILN_OK);
        CHECK(mh->tok_embd.dtype == dt);
        const kiln_st_tensor *ids = ref_tensor(ref, "input_ids", KILN_DTYPE_I32);
        const kiln_st_tensor *want = ref_tensor(ref, "logits", KILN_DTYPE_F32);
        const int32_t T = (int32_t)ids->shape[0], V = mh->cfg.n_vocab;
        float *lh = forward_all(mh, ids->data, T, KILN_DTYPE_F32);
        float *lf = forward_all(mf, ids->data, T, KILN_DTYPE_F32);
        const float d = max_abs_diff(lh, lf, (size_t)T * V);
        const float dref = max_abs_diff(lh, want->data, (size_t)T * V);
        int agree = 0;
        for (int32_t t = 0; t < T; t++)
            agree += argmax_row(lh + (size_t)t * V, V) ==
                     argmax_row((const float *)want->data + (size_t)t * V, V);
        CHECKF(d <= 1e-4f, "%s %s: vs f32 of the same values %g > 1e-4", arch, kiln_dtype_name(dt),
               d);
        CHECKF(agree * 4 >= T * 3, "%s %s: argmax agrees with transformers at %d/%d", arch,
               kiln_dtype_name(dt), agree, T);
        printf("%-10s %-4s weights: vs f32 of the same values %.3g; vs transformers f32 %.3g, "
               "argmax %d/%d\n",
               arch, kiln_dtype_name(dt), d, dref, agree, T);
        free(lh);
        free(lf);
    }
    kiln_model_close(mh);
    kiln_model_close(mf);
    variant_dir_remove(dh);
    variant_dir_remove(df);
    kiln_safetensors_close(src);
    kiln_safetensors_close(ref);
}

int main(void) {
    static const char *ARCHS[] = {"llama", "qwen2",   "gemma2", "gemma3",
                                  "phi3",  "mixtral", "gpt2",   "qwen3_next"};
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) {
        check(ARCHS[i], KILN_DTYPE_F16);
        check(ARCHS[i], KILN_DTYPE_BF16);
    }
    return kiln_test_finish("test_hf_dtypes");
}
