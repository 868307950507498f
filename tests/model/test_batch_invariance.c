/*
 * Batch invariance at the model level (DESIGN.md principle 3) for the sliding-window,
 * softcapped, MoE and recurrent families: a sequence's logits from kiln_model_forward_batch
 * are bitwise identical whether it runs
 *   - alone in one step,
 *   - prefilled in chunks of 1, 7 or everything,
 *   - mixed into steps with other sequences (prefilling and decoding, before and after it
 *     in the flat batch), on a 2-thread pool,
 * with f32, f16 and bf16 KV pools. The block tables come from a shared kiln_kv_pool, so the
 * sequence's blocks are scattered differently in each schedule.
 * Token ids come from ../shared/reference/hf/<arch>/reference.safetensors (input_ids: 48
 * tokens, more than the sliding window of 16).
 */
#include "model_test_util.h"
#include "util/threadpool.h"

#define MAX_SEQS 3

typedef struct seq {
    const int32_t *tok;
    int32_t n_tok, n_past;
    kiln_block_table bt;
    float *state;
} seq;

typedef struct step {
    int32_t n;               /* entries */
    int32_t which[MAX_SEQS]; /* sequence index, in batch order */
    int32_t n_new[MAX_SEQS];
} step;

/* Run steps over seqs; rows of seqs[0] go to out[pos * V]. */
static void run(const kiln_model *m, kiln_kv_pool *pool, kiln_backend *tp, seq *seqs,
                int32_t n_seqs, const step *steps, int32_t n_steps, float *out) {
    const int32_t V = m->cfg.n_vocab;
    kiln_error err = {0};
    for (int32_t s = 0; s < n_seqs; s++) {
        seqs[s].n_past = 0;
        seqs[s].bt = (kiln_block_table){0};
        REQUIRE(kiln_block_table_reserve(&seqs[s].bt, pool, seqs[s].n_tok, &err) == KILN_OK);
        seqs[s].state = NULL;
        if (kiln_model_seq_state_floats(m) > 0) {
            seqs[s].state = malloc((size_t)kiln_model_seq_state_floats(m) * sizeof(float));
            REQUIRE(seqs[s].state);
            memset(seqs[s].state, 0xff, (size_t)kiln_model_seq_state_floats(m) * sizeof(float));
        }
    }
    for (int32_t k = 0; k < n_steps; k++) {
        const step *st = &steps[k];
        kiln_batch_seq bs[MAX_SEQS];
        int32_t toks[256], outs[256], n = 0;
        for (int32_t e = 0; e < st->n; e++) {
            seq *q = &seqs[st->which[e]];
            REQUIRE(q->n_past + st->n_new[e] <= q->n_tok);
            bs[e] = (kiln_batch_seq){.block_table = q->bt.blocks,
                                     .n_past = q->n_past,
                                     .n_new = st->n_new[e],
                                     .first = n,
                                     .n_blocks = q->bt.n_blocks,
                                     .rec_state = q->state};
            for (int32_t j = 0; j < st->n_new[e]; j++, n++) {
                toks[n] = q->tok[q->n_past + j];
                outs[n] = n;
            }
        }
        float *logits = malloc((size_t)n * V * sizeof(float));
        REQUIRE(logits);
        kiln_batch b = {n, toks, st->n, bs, n, outs};
        if (kiln_model_forward_batch(m, pool, tp, &b, logits, &err) != KILN_OK) {
            fprintf(stderr, "forward_batch: %s\n", err.message);
            exit(1);
        }
        for (int32_t e = 0; e < st->n; e++) {
            seq *q = &seqs[st->which[e]];
            if (st->which[e] == 0)
                memcpy(out + (size_t)q->n_past * V, logits + (size_t)bs[e].first * V,
                       (size_t)st->n_new[e] * V * sizeof(float));
            q->n_past += st->n_new[e];
        }
        free(logits);
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        kiln_block_table_release(&seqs[s].bt, pool);
        free(seqs[s].state);
    }
}

static void check_arch(const char *arch, kiln_dtype kv_type, kiln_backend *tp2) {
    char dir[256], refp[256];
    snprintf(dir, sizeof dir, "reference/hf/%s", arch);
    snprintf(refp, sizeof refp, "reference/hf/%s/reference.safetensors", arch);
    const char *mdir = kiln_test_shared(dir), *rpath = kiln_test_shared(refp);
    if (access(rpath, R_OK) != 0) {
        printf("%-10s skipped (no reference)\n", arch);
        return;
    }
    kiln_error err = {0};
    kiln_safetensors *ref = NULL;
    kiln_model *m = NULL;
    kiln_model_load_params lp = {0};
    REQUIRE(kiln_safetensors_open(rpath, &ref, &err) == KILN_OK);
    if (kiln_model_open(mdir, &lp, &m, &err) != KILN_OK) {
        fprintf(stderr, "%s: %s\n", arch, err.message);
        kiln_test_failures++;
        kiln_safetensors_close(ref);
        return;
    }
    const kiln_st_tensor *ids = ref_tensor(ref, "input_ids", KILN_DTYPE_I32);
    const kiln_st_tensor *pids = ref_tensor(ref, "prompt_ids", KILN_DTYPE_I32);
    const int32_t T = (int32_t)ids->shape[0], V = m->cfg.n_vocab, NP = (int32_t)pids->shape[0];
    REQUIRE(T == 48 && NP >= 12);
    /* other sequences: the input reversed, and the prompt */
    int32_t rev[48];
    for (int32_t i = 0; i < T; i++) rev[i] = ((const int32_t *)ids->data)[T - 1 - i];
    kiln_kv_pool *pool = NULL;
    kiln_kv_pool_params pp = {.n_layer = m->cfg.n_layer,
                              .kv_dim = (int64_t)m->cfg.n_head_kv * m->cfg.head_dim,
                              .block_size = 16,
                              .n_blocks = 24,
                              .dtype = kv_type};
    REQUIRE(kiln_kv_pool_create(&pp, &pool, &err) == KILN_OK);
    /* a pad sequence allocated first so A's blocks differ between schedules */
    kiln_block_table pad = {0};

    seq seqs[MAX_SEQS] = {
        {ids->data, T, 0, {0}, NULL}, {rev, T, 0, {0}, NULL}, {pids->data, NP, 0, {0}, NULL}};
    const size_t bytes = (size_t)T * V * sizeof(float);
    float *alone = malloc(bytes), *got = malloc(bytes);
    REQUIRE(alone && got);
    const step one[] = {{1, {0}, {48}}};
    run(m, pool, NULL, seqs, 1, one, 1, alone);

    struct {
        const char *name;
        step steps[64];
        int32_t n_steps, n_seqs;
        bool threads;
    } sched[5] = {{"chunks of 1", {{0}}, 48, 1, false},
                  {"chunks of 7", {{0}}, 7, 1, false},
                  {"chunks of 48 (2 threads)", {{1, {0}, {48}}}, 1, 1, true},
                  {"mixed prefill", {{0}}, 0, 3, true},
                  {"mixed decode", {{0}}, 0, 3, true}};
    for (int32_t i = 0; i < 48; i++) sched[0].steps[i] = (step){1, {0}, {1}};
    for (int32_t i = 0; i < 7; i++) sched[1].steps[i] = (step){1, {0}, {i < 6 ? 7 : 6}};
    /* mixed prefill: B and C around A, B already 20 in */
    sched[3].steps[0] = (step){1, {1}, {20}};
    sched[3].steps[1] = (step){3, {2, 0, 1}, {5, 13, 3}};
    sched[3].steps[2] = (step){3, {1, 2, 0}, {1, 7, 35}};
    sched[3].n_steps = 3;
    /* mixed decode: A prefills 30 with C, then decodes beside B's chunks and C's decode */
    {
        int32_t k = 0;
        sched[4].steps[k++] = (step){2, {2, 0}, {4, 30}};
        for (int32_t i = 0; i < 18; i++)
            sched[4].steps[k++] =
                i % 2 ? (step){3, {1, 0, 2}, {2, 1, 1}} : (step){2, {0, 1}, {1, 1}};
        sched[4].n_steps = k;
    }
    for (int s = 0; s < 5; s++) {
        if (s == 3 || s == 4) { /* shift the pool's free list between schedules */
            REQUIRE(kiln_block_table_reserve(&pad, pool, 16 * (s - 2), &err) == KILN_OK);
        }
        memset(got, 0, bytes);
        run(m, pool, sched[s].threads ? tp2 : NULL, seqs, sched[s].n_seqs, sched[s].steps,
            sched[s].n_steps, got);
        const bool same = memcmp(got, alone, bytes) == 0;
        CHECKF(same, "%s (%s KV): %s: logits differ from the sequence alone (max %g)", arch,
               kiln_dtype_name(kv_type), sched[s].name, max_abs_diff(got, alone, (size_t)T * V));
        printf("%-10s %-4s KV %-26s %s\n", arch, kiln_dtype_name(kv_type), sched[s].name,
               same ? "bitwise identical" : "DIFFERENT");
    }
    if (kiln_model_seq_state_floats(m) > 0 && kv_type == KILN_DTYPE_F32) {
        /* the recurrent state is required, and must hold exactly n_past positions */
        kiln_block_table bt = {0};
        REQUIRE(kiln_block_table_reserve(&bt, pool, 8, &err) == KILN_OK);
        float *state = calloc((size_t)kiln_model_seq_state_floats(m), sizeof(float));
        REQUIRE(state);
        kiln_batch_seq bs = {.block_table = bt.blocks,
                             .n_past = 0,
                             .n_new = 4,
                             .first = 0,
                             .n_blocks = bt.n_blocks,
                             .rec_state = NULL};
        int32_t outs[1] = {3};
        kiln_batch b = {4, ids->data, 1, &bs, 1, outs};
        CHECK(kiln_model_forward_batch(m, pool, NULL, &b, got, &err) == KILN_ERR_INVALID_ARGUMENT);
        bs.rec_state = state;
        CHECK(kiln_model_forward_batch(m, pool, NULL, &b, got, &err) == KILN_OK);
        bs.n_past = 2; /* the state holds 4 positions: a rollback to 2 is refused */
        bs.n_new = 1;
        b.n_tokens = 1;
        outs[0] = 0;
        CHECK(kiln_model_forward_batch(m, pool, NULL, &b, got, &err) == KILN_ERR_INVALID_ARGUMENT);
        CHECK(strstr(err.message, "recurrent state holds 4 positions") != NULL);
        bs.n_past = 4;
        CHECK(kiln_model_forward_batch(m, pool, NULL, &b, got, &err) == KILN_OK);
        free(state);
        kiln_block_table_release(&bt, pool);
    }
    kiln_block_table_release(&pad, pool);
    free(alone);
    free(got);
    kiln_kv_pool_destroy(pool);
    kiln_model_close(m);
    kiln_safetensors_close(ref);
}

int main(int argc, char **argv) {
    static const char *DEFAULT[] = {"mistral", "gemma2",    "mixtral",
                                    "gemma3",  "qwen3_moe", "qwen3_next"};
    kiln_backend *tp2 = NULL;
    kiln_error err = {0};
    const kiln_backend_params bp = {.kind = KILN_BACKEND_CPU, .n_threads = 2};
    REQUIRE(kiln_backend_create(&bp, &tp2, &err) == KILN_OK);
    const char **archs = argc > 1 ? (const char **)argv + 1 : DEFAULT;
    const int n = argc > 1 ? argc - 1 : (int)(sizeof DEFAULT / sizeof DEFAULT[0]);
    for (int i = 0; i < n; i++) {
        check_arch(archs[i], KILN_DTYPE_F32, tp2);
        check_arch(archs[i], KILN_DTYPE_F16, tp2);
        check_arch(archs[i], KILN_DTYPE_BF16, tp2);
    }
    kiln_backend_destroy(tp2);
    return kiln_test_finish("test_batch_invariance");
}
