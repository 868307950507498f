/*
 * Quantized KV pages (q8_0, q4_0; kv/kv_format.h) against f32 KV, teacher-forced: for every
 * Hugging Face reference checkpoint (../shared/reference/hf: heads of 8 and 16, so a q8_0 /
 * q4_0 block of 32 spans 4 or 2 KV heads) and pycode10M (a trained 10M Llama, heads of 64),
 * one forward (teacher-forced) over the reference's input_ids continued by kiln's own f32-KV
 * greedy tokens to 256 positions, with each KV format; at each position the
 * greedy argmax with q8_0 KV must equal the argmax with f32 KV at >= 95% of the positions
 * (the bound), and the max |logit difference| is printed. q4_0 is printed, with only a
 * loose sanity bound (argmax >= 50%: a page read with a wrong layout agrees at ~1/n_vocab);
 * q8_0 K with q4_0 V is printed too, and TurboQuant (turbo:k8v3, k4v4, k4v3, k3v3, k8qv3q with
 * the QJL residual; skipped for a head size that is not a power of two) with a sanity bound of
 * 10% on the untrained HF references (their logit margins are tiny: measured 23-98%; 3-bit V
 * rows of heads of 8 flip the most) and 90% on pycode10M (measured 92-97%).
 * Any path may run: CTest registers this test on the
 * dispatching path (AVX-512 here) and again with KILN_SIMD=avx2 (the scalar reference).
 * The format must change the logits (d > 0: pages really quantized).
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "engine/sampler.h"
#include "kv/turboquant.h"
#include "model_test_util.h"

/* the TurboQuant page id of B bits (Q: with the QJL bit) */
#define TQ(B, Q) ((kiln_dtype)(KILN_KV_TURBO_DTYPE_BASE + 2 * ((B)-1) + (Q)))

static const char *ARCHS[] = {"llama",  "llama3",  "mistral",   "qwen2",      "qwen3",
                              "gemma2", "gemma3",  "phi3",      "mixtral",    "qwen3_moe",
                              "qwen3_next", "gpt2", "pycode10M"};

static float *forward_kv(const kiln_model *m, const int32_t *ids, int32_t n, kiln_dtype k,
                         kiln_dtype v) {
    kiln_error err = {0};
    kiln_kv_seq *kv = NULL;
    float *logits = malloc((size_t)n * (size_t)m->cfg.n_vocab * sizeof(float));
    REQUIRE(logits);
    if (kiln_kv_seq_create_kv(m, NULL, n, k, v, &kv, &err) != KILN_OK ||
        kiln_model_forward(m, kv, NULL, ids, n, 0, true, logits, &err) != KILN_OK) {
        fprintf(stderr, "forward failed: %s\n", err.message);
        exit(1);
    }
    kiln_kv_seq_destroy(kv);
    return logits;
}

enum { N_POS = 256 };

/* ids[0..N_POS): the reference's input_ids, then f32-KV greedy continuation (kiln's own,
 * decoded one position at a time) up to N_POS positions */
static int32_t make_inputs(const kiln_model *m, const int32_t *ref_ids, int32_t n_ref, int32_t *ids) {
    const int32_t V = m->cfg.n_vocab;
    int32_t n = n_ref < N_POS ? n_ref : N_POS;
    memcpy(ids, ref_ids, (size_t)n * sizeof *ids);
    kiln_error err = {0};
    kiln_kv_seq *kv = NULL;
    float *lg = malloc((size_t)n * (size_t)V * sizeof(float));
    REQUIRE(lg && kiln_kv_seq_create(m, N_POS, KILN_DTYPE_F32, &kv, &err) == KILN_OK);
    REQUIRE(kiln_model_forward(m, kv, NULL, ids, n, 0, true, lg, &err) == KILN_OK);
    int32_t next = kiln_argmax(lg + (size_t)(n - 1) * V, V);
    while (n < N_POS) {
        ids[n] = next;
        REQUIRE(kiln_model_forward(m, kv, NULL, ids + n, 1, n, true, lg, &err) == KILN_OK);
        next = kiln_argmax(lg, V);
        n++;
    }
    free(lg);
    kiln_kv_seq_destroy(kv);
    return n;
}

static void check(const char *arch) {
    char dir[256], refp[300];
    const bool own = !strcmp(arch, "pycode10M");
    snprintf(dir, sizeof dir, own ? "models/%s" : "reference/hf/%s", arch);
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    const char *mdir = kiln_test_shared(dir), *rpath = kiln_test_shared(refp);
    if (access(rpath, R_OK) != 0) {
        printf("%-10s skipped (no %s)\n", arch, rpath);
        return;
    }
    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_safetensors *ref = NULL;
    REQUIRE(kiln_model_open(mdir, NULL, &m, &err) == KILN_OK);
    REQUIRE(kiln_safetensors_open(rpath, &ref, &err) == KILN_OK);
    const kiln_st_tensor *rid = ref_tensor(ref, "input_ids", KILN_DTYPE_I32);
    static int32_t in[N_POS];
    const int32_t T = make_inputs(m, rid->data, (int32_t)rid->shape[0], in), V = m->cfg.n_vocab;
    float *l32 = forward_kv(m, in, T, KILN_DTYPE_F32, KILN_DTYPE_F32);
    /* min_pct: the argmax bound on the HF references; min_own: on pycode10M (trained) */
    static const struct {
        kiln_dtype k, v;
        const char *name;
        int min_pct, min_own;
    } fm[] = {{KILN_DTYPE_F16, KILN_DTYPE_F16, "f16", 0, 0},
              {KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0, "q8_0", 95, 95},
              {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0, "q4_0", 50, 50},
              {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0, "q8_0/q4_0", 50, 50},
              {TQ(8, 0), TQ(3, 0), "turbo:k8v3", 10, 90},
              {TQ(4, 0), TQ(4, 0), "turbo:k4v4", 10, 90},
              {TQ(4, 0), TQ(3, 0), "turbo:k4v3", 10, 90},
              {TQ(3, 0), TQ(3, 0), "turbo:k3v3", 10, 90},
              {TQ(8, 1), TQ(3, 1), "turbo:k8qv3q", 10, 90}};
    for (size_t f = 0; f < sizeof fm / sizeof fm[0]; f++) {
        if (kiln_turbo_spec_of_dtype((int32_t)fm[f].k, NULL) &&
            !kiln_turbo_head_dim_valid(m->cfg.head_dim)) {
            printf("%-10s %-9s skipped (head_dim %d is not a power of two)\n", arch, fm[f].name,
                   m->cfg.head_dim);
            continue;
        }
        float *lk = forward_kv(m, in, T, fm[f].k, fm[f].v);
        const float d = max_abs_diff(lk, l32, (size_t)T * V);
        int agree = 0;
        float worst_margin = 0; /* the largest f32 top-2 margin among the flipped positions */
        for (int32_t t = 0; t < T; t++) {
            const int32_t a = kiln_argmax(lk + (size_t)t * V, V), b = kiln_argmax(l32 + (size_t)t * V, V);
            agree += a == b;
            if (a != b) {
                const float mg = l32[(size_t)t * V + b] - l32[(size_t)t * V + a];
                if (mg > worst_margin) worst_margin = mg;
            }
        }
        printf("%-10s %-9s KV vs f32 KV: argmax %3d/%3d (%5.1f%%), max |dlogit| %.4g, flips within "
               "an f32 margin of %.3g (kv_dim %d, head_dim %d)\n",
               arch, fm[f].name, agree, T, 100.0 * agree / T, d, worst_margin,
               m->cfg.n_head_kv * m->cfg.head_dim, m->cfg.head_dim);
        const int min_pct = own ? fm[f].min_own : fm[f].min_pct;
        CHECKF(agree * 100 >= T * min_pct, "%s %s KV: argmax agrees at %d/%d (< %d%%)", arch,
               fm[f].name, agree, T, min_pct);
        CHECKF(d > 0.0f, "%s %s KV: identical to f32 KV", arch, fm[f].name);
        free(lk);
    }
    free(l32);
    kiln_safetensors_close(ref);
    kiln_model_close(m);
}

int main(void) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++) check(ARCHS[i]);
    return kiln_test_finish("test_kv_quant_accuracy");
}
