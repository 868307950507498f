/*
 * grammar_bench.c - what structured output costs per decode step (issue 20: at most 10% of a
 * decode step for a 32k vocabulary at 16 sequences).
 *
 *   grammar_bench MODEL SCHEMA.json [N_SEQ=16] [N_TOKENS=48] [THREADS=0]
 *
 * 1. The token mask alone (src/grammar): the vocabulary trie is built from MODEL's tokenizer;
 *    a walk through the schema's grammar takes, at each position, the mask of the current
 *    state and then a pseudo-random allowed token (fixed seed). "cold" masks are computed
 *    from the trie every time (no per-state cache; the recognizer's transition cache warms
 *    as it would in one request); "warm" replays the same walk with the per-state mask cache
 *    on (a state seen before costs a copy). Medians over every position of 8 walks.
 * 2. Decode steps through the engine: N_SEQ requests at once (temperature 1, ignore_eos off,
 *    N_TOKENS each), once without a grammar and once with the schema (jump-forward off, so
 *    each step is one token per sequence). The step time is the median interval between
 *    stream 0's TOKEN events (the engine's clock) after its first token.
 * Prints both, and mask cost per step = N_SEQ x mask median, as a share of the plain step.
 * GRAMMAR_BENCH_MASK_ONLY=1 stops after part 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "kiln.h"

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double median(int64_t *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    return n % 2 ? (double)v[n / 2] : 0.5 * (double)(v[n / 2 - 1] + v[n / 2]);
}

static size_t piece(void *u, int32_t id, char *buf, size_t cap) {
    return kiln_model_token_piece((const kiln_model *)u, id, buf, cap);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    b[n] = 0;
    return b;
}

/* median step time (ns) of n_seq concurrent requests; g may be NULL */
static double engine_steps(kiln_engine *e, const kiln_grammar *g, int n_seq, int n_tokens) {
    kiln_stream **st = calloc((size_t)n_seq, sizeof *st);
    kiln_error err;
    for (int i = 0; i < n_seq; i++) {
        kiln_request r = kiln_request_defaults();
        r.prompt = "Once upon a time";
        r.max_tokens = n_tokens;
        r.temperature = 1.0f;
        r.seed = (uint64_t)i + 1;
        r.grammar = g;
        r.grammar_no_jump_forward = true;
        if (kiln_engine_submit(e, &r, &st[i], &err)) {
            fprintf(stderr, "submit: %s\n", err.message);
            exit(1);
        }
    }
    int64_t *iv = malloc((size_t)n_tokens * sizeof *iv);
    int n_iv = 0;
    int64_t last = -1;
    for (int i = 0; i < n_seq; i++) {
        kiln_event ev;
        for (;;) {
            if (kiln_stream_next(st[i], -1, &ev, &err)) exit(1);
            if (i == 0 && ev.type == KILN_EVENT_TOKEN) {
                if (last >= 0 && n_iv < n_tokens) iv[n_iv++] = ev.time_ns - last;
                last = ev.time_ns;
            }
            if (ev.type == KILN_EVENT_FINISH) break;
        }
        kiln_stream_destroy(st[i]);
    }
    double m = median(iv, n_iv);
    free(iv);
    free(st);
    return m;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: grammar_bench MODEL SCHEMA.json [N_SEQ=16] [N_TOKENS=48] [THREADS=0]\n");
        return 2;
    }
    int n_seq = argc > 3 ? atoi(argv[3]) : 16;
    int n_tokens = argc > 4 ? atoi(argv[4]) : 48;
    int threads = argc > 5 ? atoi(argv[5]) : 0;
    kiln_error err;
    kiln_model *m;
    kiln_model_params mp = {.require_tokenizer = true};
    if (kiln_model_load(argv[1], &mp, &m, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    char *schema = slurp(argv[2]);
    if (!schema) return 1;
    kiln_grammar *g;
    if (kiln_grammar_create(KILN_GRAMMAR_JSON_SCHEMA, schema, 0, &g, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    int32_t nv = kiln_model_n_vocab(m);
    int64_t t0 = now_ns();
    kiln_vocab_trie *t;
    if (kiln_vocab_trie_create(nv, piece, m, &t, &err)) return 1;
    int64_t t_trie = now_ns() - t0;
    printf("model %s: n_vocab %d, trie %d nodes, built in %.1f ms\n", argv[1], nv,
           kiln_vocab_trie_n_nodes(t), (double)t_trie / 1e6);

    /* 1. masks alone */
    uint32_t *bits = malloc((size_t)((nv + 31) / 32) * sizeof *bits);
    int cap = 8 * 256;
    int64_t *cold = malloc((size_t)cap * sizeof *cold), *warm = malloc((size_t)cap * sizeof *warm);
    int n_cold = 0, n_warm = 0;
    int32_t *walk = malloc(256 * sizeof *walk);
    int64_t allowed_sum = 0;
    for (int w = 0; w < 8; w++) {
        uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(w + 1);
        for (int pass = 0; pass < 2; pass++) {
            kiln_gmatch *gm;
            if (kiln_gmatch_create(g, &gm, &err)) return 1;
            uint64_t x = rng;
            for (int k = 0; k < 256; k++) {
                int32_t s = kiln_gmatch_state(gm);
                if (kiln_gmatch_accepting(gm, s) && !kiln_gmatch_can_continue(gm, s)) break;
                int64_t a = now_ns();
                int32_t n = kiln_gmatch_token_mask(gm, t, s, bits, pass == 1);
                int64_t b = now_ns();
                if (pass == 0 && n_cold < cap) cold[n_cold++] = b - a;
                if (pass == 1 && n_warm < cap) warm[n_warm++] = b - a;
                if (pass == 1) {
                    /* the warm pass: a second walk, masks cached from the first */
                    n = kiln_gmatch_token_mask(gm, t, s, bits, true);
                    int64_t c = now_ns();
                    warm[n_warm - 1] = c - b;
                }
                if (n == 0) break;
                allowed_sum += n;
                /* a pseudo-random allowed token */
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                int32_t pick = (int32_t)((x * 0x2545F4914F6CDD1Dull) >> 33) % n, id = -1;
                for (int32_t i = 0; i < nv; i++)
                    if (bits[i >> 5] >> (i & 31) & 1 && pick-- == 0) {
                        id = i;
                        break;
                    }
                int32_t len;
                const uint8_t *p = kiln_vocab_trie_bytes(t, id, &len);
                if (!kiln_gmatch_advance(gm, p, (size_t)len)) break;
                walk[k % 256] = id;
            }
            kiln_gmatch_destroy(gm);
        }
    }
    int64_t sum_c = 0, max_c = 0;
    for (int i = 0; i < n_cold; i++) {
        sum_c += cold[i];
        if (cold[i] > max_c) max_c = cold[i];
    }
    double mc = median(cold, n_cold), mw = median(warm, n_warm); /* sorts them */
    printf("mask alone: cold mean %.1f us, p90 %.1f us, max %.1f us\n",
           n_cold ? (double)sum_c / n_cold / 1e3 : 0, n_cold ? (double)cold[n_cold * 9 / 10] / 1e3 : 0,
           (double)max_c / 1e3);
    printf("mask alone: cold median %.1f us (%d masks, %.0f tokens allowed on average), warm "
           "(cached state) median %.1f us\n",
           mc / 1e3, n_cold, n_cold ? (double)allowed_sum / (n_cold + n_warm) : 0, mw / 1e3);

    if (getenv("GRAMMAR_BENCH_MASK_ONLY")) return 0;
    /* 2. decode steps */
    kiln_engine_params ep = kiln_engine_default_params();
    ep.max_seqs = n_seq;
    ep.n_threads = threads;
    ep.n_ctx = 512;
    kiln_engine *e;
    if (kiln_engine_create(m, &ep, &e, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    (void)engine_steps(e, NULL, n_seq, 8); /* warm up */
    double plain = engine_steps(e, NULL, n_seq, n_tokens);
    double gram = engine_steps(e, g, n_seq, n_tokens);
    double plain2 = engine_steps(e, NULL, n_seq, n_tokens);
    double gram2 = engine_steps(e, g, n_seq, n_tokens);
    printf("decode step at %d sequences: plain median %.2f ms / %.2f ms, with the grammar %.2f ms / "
           "%.2f ms (two runs each, interleaved)\n",
           n_seq, plain / 1e6, plain2 / 1e6, gram / 1e6, gram2 / 1e6);
    double pm = plain < plain2 ? plain : plain2;
    printf("mask cost per step (%d x cold median) = %.2f ms = %.1f%% of the plain step; warm: "
           "%.2f ms = %.2f%%\n",
           n_seq, n_seq * mc / 1e6, 100.0 * n_seq * mc / pm, n_seq * mw / 1e6,
           100.0 * n_seq * mw / pm);
    printf("step with grammar / plain step (medians): %.3f, %.3f\n", gram / plain, gram2 / plain2);
    kiln_engine_destroy(e);
    kiln_vocab_trie_destroy(t);
    kiln_grammar_destroy(g);
    kiln_model_free(m);
    free(bits);
    free(cold);
    free(warm);
    free(walk);
    free(schema);
    return 0;
}
