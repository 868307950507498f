/*
 * kiln_pp_tg - kiln's side of the llama-bench comparison (bench/cpu_vs_llamacpp/README.md).
 *
 * Usage: kiln_pp_tg -m MODEL.gguf [-t THREADS] [-p 512] [-n 128] [-r REPS] [--kv f32|f16]
 *                   [--batched 1,4,8,16] [--batch-prompt 128] [--batch-gen 32]
 *                   [--what pp,tg,batched]
 *
 * Measures what llama-bench measures, through kiln's forward pass on one thread pool:
 *   pp<P>: one forward of a P-token prompt of one sequence from an empty cache, logits of
 *          the last token only (llama-bench's prompt test: one llama_decode of P tokens);
 *   tg<N>: N forwards of 1 token each from an empty cache, logits every step (llama-bench's
 *          generation test);
 *   batched decode: B sequences, each first prefilled with a P'-token prompt (untimed), then
 *          G steps that each carry one new token of every sequence (one forward of B tokens,
 *          B logits rows); aggregate tok/s = B * G / time.
 * Token ids are pseudo-random (xorshift, fixed seed), as llama-bench's are random.
 * Every test runs once untimed (warm-up: page faults, caches), then REPS timed repetitions
 * (the batched levels' repetitions interleaved: rep r of every level, then rep r + 1).
 * Output: one JSON object per line per test, {"test": ..., "tps": [per repetition], ...}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln.h"
#include "kv/kv_pool.h"
#include "backend/runner.h"
#include "backend/loader.h"
#include "model/model.h"
#include "util/threadpool.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static int32_t rand_token(int32_t n_vocab) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int32_t)(rng % (uint64_t)(n_vocab > 1 ? n_vocab - 1 : 1)) + 1;
}

static void die(const char *what, const kiln_error *err) {
    fprintf(stderr, "kiln_pp_tg: %s: %s\n", what, err ? err->message : "");
    exit(1);
}

static void print_tps(const char *test, const char *model, int threads, const double *tps, int reps,
                      const char *extra) {
    printf("{\"test\": \"%s\", \"model\": \"%s\", \"threads\": %d%s%s, \"tps\": [", test, model,
           threads, extra ? ", " : "", extra ? extra : "");
    for (int i = 0; i < reps; i++) printf("%s%.3f", i ? ", " : "", tps[i]);
    printf("]}\n");
    fflush(stdout);
}

/* pp: one forward of P tokens, last logits. Returns tok/s. */
static double run_pp(const kiln_model *m, kiln_backend *tp, kiln_dtype kvt, int32_t P,
                     float *logits) {
    kiln_error err = {0};
    kiln_kv_seq *kv;
    if (kiln_kv_seq_create(m, P, kvt, &kv, &err)) die("kv", &err);
    int32_t *tok = malloc((size_t)P * sizeof *tok);
    for (int32_t i = 0; i < P; i++) tok[i] = rand_token(m->cfg.n_vocab);
    double t0 = now();
    if (kiln_model_forward(m, kv, tp, tok, P, 0, false, logits, &err)) die("forward", &err);
    double dt = now() - t0;
    free(tok);
    kiln_kv_seq_destroy(kv);
    return P / dt;
}

/* tg: N single-token forwards from an empty cache. Returns tok/s. */
static double run_tg(const kiln_model *m, kiln_backend *tp, kiln_dtype kvt, int32_t N,
                     float *logits) {
    kiln_error err = {0};
    kiln_kv_seq *kv;
    if (kiln_kv_seq_create(m, N, kvt, &kv, &err)) die("kv", &err);
    double t0 = now();
    for (int32_t i = 0; i < N; i++) {
        int32_t t = rand_token(m->cfg.n_vocab);
        if (kiln_model_forward(m, kv, tp, &t, 1, i, false, logits, &err)) die("forward", &err);
    }
    double dt = now() - t0;
    kiln_kv_seq_destroy(kv);
    return N / dt;
}

/* batched decode: B sequences, prompt P each (untimed), then G steps of B tokens. */
static double run_batched(const kiln_model *m, kiln_backend *tp, kiln_dtype kvt, int32_t B,
                          int32_t P, int32_t G) {
    kiln_error err = {0};
    const int32_t bs = KILN_KV_DEFAULT_BLOCK_SIZE;
    kiln_kv_pool_params pp = {
        .n_layer = m->cfg.n_layer,
        .kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim,
        .block_size = bs,
        .n_blocks = B * kiln_kv_blocks_for_tokens(P + G, bs),
        .dtype = kvt,
    };
    kiln_kv_pool *pool;
    if (kiln_kv_pool_create(&pp, &pool, &err)) die("pool", &err);
    kiln_block_table *bt = calloc((size_t)B, sizeof *bt);
    kiln_batch_seq *sq = calloc((size_t)B, sizeof *sq);
    int32_t *tok = malloc((size_t)(B > P ? B : P) * sizeof *tok);
    int32_t *out = malloc((size_t)B * sizeof *out);
    float *logits = malloc((size_t)B * (size_t)m->cfg.n_vocab * sizeof(float));
    for (int32_t s = 0; s < B; s++)
        if (kiln_block_table_reserve(&bt[s], pool, P + G, &err)) die("reserve", &err);
    /* prefill each sequence alone (untimed) */
    for (int32_t s = 0; s < B; s++) {
        for (int32_t i = 0; i < P; i++) tok[i] = rand_token(m->cfg.n_vocab);
        kiln_batch_seq one = {bt[s].blocks, 0, P, 0, bt[s].n_blocks, NULL, NULL, 0};
        int32_t last = P - 1;
        kiln_batch b = {P, tok, 1, &one, 1, &last};
        if (kiln_model_forward_batch(m, pool, tp, &b, logits, &err)) die("prefill", &err);
    }
    double t0 = now();
    for (int32_t g = 0; g < G; g++) {
        for (int32_t s = 0; s < B; s++) {
            sq[s] = (kiln_batch_seq){bt[s].blocks, P + g, 1, s, bt[s].n_blocks, NULL, NULL, 0};
            tok[s] = rand_token(m->cfg.n_vocab);
            out[s] = s;
        }
        kiln_batch b = {B, tok, B, sq, B, out};
        if (kiln_model_forward_batch(m, pool, tp, &b, logits, &err)) die("decode", &err);
    }
    double dt = now() - t0;
    for (int32_t s = 0; s < B; s++) kiln_block_table_release(&bt[s], pool);
    kiln_kv_pool_destroy(pool);
    free(bt), free(sq), free(tok), free(out), free(logits);
    return (double)B * G / dt;
}

int main(int argc, char **argv) {
    const char *path = NULL, *what = "pp,tg", *batched = "1,4,8,16";
    int threads = 0, reps = 3;
    int32_t P = 512, N = 128, BP = 128, BG = 32;
    kiln_dtype kvt = KILN_DTYPE_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "kiln_pp_tg: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-m"))
            path = v;
        else if (!strcmp(a, "-t"))
            threads = atoi(v);
        else if (!strcmp(a, "-p"))
            P = atoi(v);
        else if (!strcmp(a, "-n"))
            N = atoi(v);
        else if (!strcmp(a, "-r"))
            reps = atoi(v);
        else if (!strcmp(a, "--kv"))
            kvt = !strcmp(v, "f16") ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        else if (!strcmp(a, "--batched"))
            batched = v;
        else if (!strcmp(a, "--batch-prompt"))
            BP = atoi(v);
        else if (!strcmp(a, "--batch-gen"))
            BG = atoi(v);
        else if (!strcmp(a, "--what"))
            what = v;
        else {
            fprintf(stderr, "kiln_pp_tg: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!path || P < 1 || N < 1 || reps < 1 || reps > 100 || BP < 1 || BG < 1) {
        fprintf(stderr, "usage: kiln_pp_tg -m MODEL [-t N] [-p 512] [-n 128] [-r R] [--kv f32|f16]"
                        " [--what pp,tg,batched] [--batched 1,4,8,16] [--batch-prompt 128]"
                        " [--batch-gen 32]\n");
        return 2;
    }
    if (threads < 1) threads = kiln_physical_cores();
    kiln_error err = {0};
    kiln_model *m;
    if (kiln_model_open(path, NULL, &m, &err)) die("open", &err);
    kiln_backend *tp;
    const kiln_backend_params bp = {.kind = KILN_BACKEND_CPU, .n_threads = threads};
    if (kiln_backend_create(&bp, &tp, &err)) die("backend", &err);
    float *logits = malloc((size_t)m->cfg.n_vocab * sizeof(float));
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    double tps[100];
    if (strstr(what, "pp")) {
        run_pp(m, tp, kvt, P, logits);
        for (int r = 0; r < reps; r++) tps[r] = run_pp(m, tp, kvt, P, logits);
        char name[32];
        snprintf(name, sizeof name, "pp%d", P);
        print_tps(name, base, threads, tps, reps, NULL);
    }
    if (strstr(what, "tg")) {
        run_tg(m, tp, kvt, 8, logits);
        for (int r = 0; r < reps; r++) tps[r] = run_tg(m, tp, kvt, N, logits);
        char name[32];
        snprintf(name, sizeof name, "tg%d", N);
        print_tps(name, base, threads, tps, reps, NULL);
    }
    if (strstr(what, "batched")) {
        /* the levels' repetitions interleave (rep r of every level, then rep r + 1), so each
         * level's samples span the same time window: this machine's memory bandwidth drifts by
         * tens of percent within minutes, and the ratios between levels are what is compared */
        enum { MAX_LEVELS = 16 };
        int levels[MAX_LEVELS], nl = 0;
        for (const char *p = batched; *p && nl < MAX_LEVELS;) {
            int B = atoi(p);
            if (B >= 1) levels[nl++] = B;
            p = strchr(p, ',');
            if (!p) break;
            p++;
        }
        double *lt = malloc(sizeof(double) * (size_t)(nl * reps + 1));
        if (!lt) die("out of memory", NULL);
        for (int i = 0; i < nl; i++) run_batched(m, tp, kvt, levels[i], BP, 2);
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < nl; i++)
                lt[i * reps + r] = run_batched(m, tp, kvt, levels[i], BP, BG);
        for (int i = 0; i < nl; i++) {
            char extra[96];
            snprintf(extra, sizeof extra, "\"sequences\": %d, \"prompt\": %d, \"steps\": %d",
                     levels[i], BP, BG);
            print_tps("batched", base, threads, lt + i * reps, reps, extra);
        }
        free(lt);
    }
    free(logits);
    kiln_backend_destroy(tp);
    kiln_model_close(m);
    return 0;
}
