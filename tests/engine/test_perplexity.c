/*
 * test_perplexity - kiln_perplexity (src/engine/perplexity.c, llama-perplexity's method) and
 * `kiln perplexity`, against references computed here (issue 14 item 5).
 *
 *   1. pycode10M (HF directory): the 128 held-out ids of reference.safetensors as one chunk of
 *      ctx 128 (no BOS: the tokenizer adds none). The expected perplexity is computed here from
 *      transformers' float64 logits in that file: exp(mean over positions 64..126 of
 *      logsumexp(logits[p]) - logits[p][ids[p+1]]). kiln's f32-KV perplexity must agree to
 *      5e-5 relative (measured 1.3e-7; kiln's f32 logits are within 1e-4 of those logits), f16
 *      pages to 1e-3 (measured 9e-5), bf16 and q8_0 pages to 1e-2, q4_0 to 1e-1 (bounds on
 *      quantization noise, not measured goldens); q8_0 K with f16 V runs too.
 *   2. stories260K (GGUF, adds BOS = 1): a tokenized text in chunks of 32. The reference here
 *      runs each chunk in one forward of all 32 positions from an empty f32 cache with its
 *      first token replaced by BOS, and scores positions 16..30 with its own log-softmax; kiln
 *      (which runs each chunk as two forwards) must agree to 1e-9 relative. Scoring without the
 *      BOS replacement must differ (the replacement is observable), and --chunks limits.
 *   3. The CLI on a text file: --json fields, ppl equal to the API's on the same tokens,
 *      a text shorter than 2 x ctx and a bad --kv-type / --ctx are refused naming the cause.
 */
#include <jansson.h>
#include <math.h>

#include "backend/loader.h"
#include "cli/cli_test_util.h"
#include "engine/perplexity.h"
#include "format/fmt_util.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "test.h"

static double nll_of(const float *row, int32_t V, int32_t tok) {
    double mx = row[0];
    for (int32_t i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0;
    for (int32_t i = 0; i < V; i++) s += exp((double)row[i] - mx);
    return log(s) + mx - (double)row[tok];
}

static kiln_model *open_model(const char *path) {
    kiln_error e = {0};
    kiln_model *m = NULL;
    kiln_model_load_params lp = {0};
    if (kiln_model_open(path, &lp, &m, &e) != KILN_OK) {
        fprintf(stderr, "cannot open %s: %s\n", path, e.message);
        return NULL;
    }
    return m;
}

static void test_pycode_reference(void) {
    const char *dir = kiln_test_shared("models/pycode10M");
    char p[1024];
    snprintf(p, sizeof p, "%s/reference.safetensors", dir);
    if (access(p, R_OK) != 0) {
        printf("SKIP pycode10M: %s missing\n", p);
        return;
    }
    kiln_error e = {0};
    kiln_safetensors *ref = NULL;
    REQUIRE(kiln_safetensors_open(p, &ref, &e) == KILN_OK);
    const kiln_st_tensor *ids_t = kiln_safetensors_find(ref, "input_ids");
    const kiln_st_tensor *lg_t = kiln_safetensors_find(ref, "logits");
    REQUIRE(ids_t && lg_t && ids_t->dtype == KILN_DTYPE_I32 && lg_t->dtype == KILN_DTYPE_F32);
    const int32_t T = (int32_t)ids_t->shape[0], V = (int32_t)lg_t->shape[1];
    REQUIRE(T == 128);
    const int32_t *ids = ids_t->data;
    const float *lg = lg_t->data;
    double nll = 0;
    int n = 0;
    for (int32_t k = T / 2; k < T - 1; k++, n++) nll += nll_of(lg + (size_t)k * V, V, ids[k + 1]);
    const double want = exp(nll / n);
    kiln_model *m = open_model(dir);
    REQUIRE(m && m->cfg.n_vocab == V);
    const kiln_dtype fmts[5] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
                                KILN_DTYPE_Q4_0};
    const double tol[5] = {5e-5, 1e-3, 1e-2, 1e-2, 1e-1};
    for (int f = 0; f < 5; f++) {
        kiln_ppl_params pp = {.n_ctx = T, .kv_k = fmts[f], .kv_v = fmts[f], .bos = -1};
        kiln_ppl_result r;
        REQUIRE(kiln_perplexity(m, NULL, ids, T, &pp, &r, &e) == KILN_OK);
        CHECK(r.n_chunks == 1 && r.n_scored == n);
        double rel = fabs(r.ppl / want - 1);
        printf("pycode10M reference ppl %.6f, kiln %s KV %.6f (rel %.2e)\n", want,
               kiln_dtype_name(fmts[f]), r.ppl, rel);
        CHECKF(rel <= tol[f], "pycode10M %s KV: ppl %.6f vs reference %.6f (rel %.2e > %.0e)",
               kiln_dtype_name(fmts[f]), r.ppl, want, rel, tol[f]);
    }
    /* K and V in different formats */
    kiln_ppl_params pk = {.n_ctx = T, .kv_k = KILN_DTYPE_Q8_0, .kv_v = KILN_DTYPE_F16, .bos = -1};
    kiln_ppl_result r;
    CHECKF(kiln_perplexity(m, NULL, ids, T, &pk, &r, &e) == KILN_OK, "q8_0 K, f16 V: %s",
           e.message);
    CHECKF(fabs(r.ppl / want - 1) <= 1e-2, "q8_0 K / f16 V ppl %.6f vs %.6f", r.ppl, want);
    kiln_model_close(m);
    kiln_safetensors_close(ref);
}

static const char g_story[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "sunshine. One day, she saw a big tree in the park. She wanted to climb it, but her mom said "
    "no. Lily was sad, but she listened to her mom. Then a little bird came and sat on the tree. "
    "The bird sang a happy song. Lily smiled and clapped her hands. The bird and Lily became good "
    "friends. Every day, Lily went to the park to see the bird. They played together and had lots "
    "of fun. One day, the bird did not come. Lily looked for the bird everywhere. She was very "
    "sad. Then she heard a song. It was the bird! It had a new friend with it. Lily was happy "
    "again. The end.";

/* the reference: every chunk in one forward of all its positions, BOS first if bos >= 0 */
static double ref_ppl(const kiln_model *m, const int32_t *toks, int32_t ctx, int32_t chunks,
                      int32_t bos) {
    kiln_error e = {0};
    const int32_t V = m->cfg.n_vocab;
    float *lg = malloc((size_t)ctx * V * sizeof *lg);
    int32_t *c = malloc((size_t)ctx * sizeof *c);
    REQUIRE(lg && c);
    double nll = 0;
    int64_t n = 0;
    for (int32_t k = 0; k < chunks; k++) {
        kiln_kv_seq *kv = NULL;
        REQUIRE(kiln_kv_seq_create(m, ctx, KILN_DTYPE_F32, &kv, &e) == KILN_OK);
        memcpy(c, toks + (size_t)k * ctx, (size_t)ctx * sizeof *c);
        if (bos >= 0) c[0] = bos;
        REQUIRE(kiln_model_forward(m, kv, NULL, c, ctx, 0, true, lg, &e) == KILN_OK);
        for (int32_t q = ctx / 2; q < ctx - 1; q++, n++)
            nll += nll_of(lg + (size_t)q * V, V, toks[(size_t)k * ctx + q + 1]);
        kiln_kv_seq_destroy(kv);
    }
    free(lg);
    free(c);
    return exp(nll / (double)n);
}

static double g_api_ppl; /* stories260K, ctx 32, all chunks: for the CLI check */
static size_t g_api_tokens;

static void test_stories_bos(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    if (access(path, R_OK) != 0) {
        printf("SKIP stories260K: %s missing\n", path);
        return;
    }
    kiln_model *m = open_model(path);
    REQUIRE(m && m->tokenizer);
    kiln_error e = {0};
    kiln_ivec ids = {0};
    REQUIRE(kiln_tokenizer_encode(m->tokenizer, g_story, strlen(g_story), true, false, &ids, &e) ==
            KILN_OK);
    const kiln_vocab *v = kiln_tokenizer_vocab(m->tokenizer);
    REQUIRE(v->add_bos && v->bos_id == 1 && ids.data[0] == 1);
    const int32_t ctx = 32, chunks = (int32_t)(ids.n / ctx);
    REQUIRE(chunks >= 4);
    double want = ref_ppl(m, ids.data, ctx, chunks, v->bos_id);
    kiln_ppl_params pp = {.n_ctx = ctx, .kv_k = KILN_DTYPE_F32, .kv_v = KILN_DTYPE_F32,
                          .bos = v->bos_id};
    kiln_ppl_result r;
    REQUIRE(kiln_perplexity(m, NULL, ids.data, (int64_t)ids.n, &pp, &r, &e) == KILN_OK);
    printf("stories260K ctx 32: %d chunks, reference %.9f, kiln %.9f\n", r.n_chunks, want, r.ppl);
    CHECK(r.n_chunks == chunks && r.n_scored == (int64_t)chunks * (ctx - ctx / 2 - 1));
    CHECKF(fabs(r.ppl / want - 1) < 1e-9, "ppl %.12f vs reference %.12f", r.ppl, want);
    g_api_ppl = r.ppl;
    g_api_tokens = ids.n;
    /* the BOS replacement is observable: without it chunks 2.. score differently */
    double nobos = ref_ppl(m, ids.data, ctx, chunks, -1);
    CHECKF(fabs(nobos / want - 1) > 1e-6, "BOS replacement not observable (%.9f vs %.9f)", nobos,
           want);
    kiln_ppl_params p2 = pp;
    p2.bos = -1;
    REQUIRE(kiln_perplexity(m, NULL, ids.data, (int64_t)ids.n, &p2, &r, &e) == KILN_OK);
    CHECKF(fabs(r.ppl / nobos - 1) < 1e-9, "no-BOS ppl %.12f vs %.12f", r.ppl, nobos);
    /* --chunks */
    kiln_ppl_params p3 = pp;
    p3.max_chunks = 2;
    REQUIRE(kiln_perplexity(m, NULL, ids.data, (int64_t)ids.n, &p3, &r, &e) == KILN_OK);
    CHECK(r.n_chunks == 2 && fabs(r.ppl / ref_ppl(m, ids.data, ctx, 2, 1) - 1) < 1e-9);
    /* bad input */
    kiln_ppl_params p4 = pp;
    p4.n_ctx = 2;
    CHECK(kiln_perplexity(m, NULL, ids.data, (int64_t)ids.n, &p4, &r, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    p4.n_ctx = (int32_t)ids.n + 1;
    CHECK(kiln_perplexity(m, NULL, ids.data, (int64_t)ids.n, &p4, &r, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    kiln_ivec_free(&ids);
    kiln_model_close(m);
}

static void test_cli(void) {
    const char *path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    if (access(path, R_OK) != 0 || g_api_tokens == 0) return;
    char txt[512], out[512], errbuf[4096];
    snprintf(txt, sizeof txt, "%s/story.txt", g_tmpdir);
    snprintf(out, sizeof out, "%s/ppl.json", g_tmpdir);
    REQUIRE(write_whole(txt, g_story, strlen(g_story)) == 0);
    const char *a[] = {"perplexity", "-m", path, "-f", txt, "--ctx", "32", "--json", NULL};
    int rc = run_kiln_to(a, out, errbuf, sizeof errbuf);
    CHECKF(rc == 0, "kiln perplexity: exit %d: %s", rc, errbuf);
    json_t *j = json_load_file(out, 0, NULL);
    REQUIRE(j);
    double ppl = json_real_value(json_object_get(j, "ppl"));
    CHECKF(fabs(ppl / g_api_ppl - 1) < 1e-12, "CLI ppl %.12f vs API %.12f", ppl, g_api_ppl);
    CHECK((size_t)json_integer_value(json_object_get(j, "tokens")) == g_api_tokens);
    CHECK(json_integer_value(json_object_get(j, "ctx")) == 32);
    CHECK(json_is_true(json_object_get(j, "bos_replaced")));
    CHECK(!strcmp(json_string_value(json_object_get(j, "kv_type_k")), "f32"));
    json_decref(j);
    const char *a2[] = {"perplexity", "-m", path, "-f", txt, "--ctx", "512", NULL};
    rc = run_kiln(a2, errbuf, sizeof errbuf);
    CHECKF(rc == 1 && strstr(errbuf, "2 x ctx"), "short text: exit %d: %s", rc, errbuf);
    const char *a3[] = {"perplexity", "-m", path, "-f", txt, "--kv-type", "q9", NULL};
    rc = run_kiln(a3, errbuf, sizeof errbuf);
    CHECKF(rc == 2 && strstr(errbuf, "--kv-type"), "bad kv type: exit %d: %s", rc, errbuf);
    const char *bad_turbo[] = {"turbo:k9v3", "turbo:x", "turbo:k8"};
    for (int i = 0; i < 3; i++) {
        const char *a3t[] = {"perplexity", "-m", path, "-f", txt, "--kv-type-v", bad_turbo[i], NULL};
        rc = run_kiln(a3t, errbuf, sizeof errbuf);
        CHECKF(rc == 2 && strstr(errbuf, "--kv-type-v") && strstr(errbuf, bad_turbo[i]),
               "bad turbo config %s: exit %d: %s", bad_turbo[i], rc, errbuf);
    }
    const char *a4[] = {"perplexity", "-m", path, "-f", txt, "--ctx", "1", NULL};
    rc = run_kiln(a4, errbuf, sizeof errbuf);
    CHECKF(rc == 2 && strstr(errbuf, "--ctx"), "bad ctx: exit %d: %s", rc, errbuf);
    const char *a5[] = {"perplexity", "-m", path, "-f", "/nonexistent/x.txt", NULL};
    rc = run_kiln(a5, errbuf, sizeof errbuf);
    CHECKF(rc == 1 && strstr(errbuf, "-f"), "missing file: exit %d: %s", rc, errbuf);
}

int main(void) {
    snprintf(g_kiln, sizeof g_kiln, "%s/kiln", KILN_BINARY_DIR);
    snprintf(g_tmpdir, sizeof g_tmpdir, "%.200s", make_tmpdir("kiln-ppl"));
    test_pycode_reference();
    test_stories_bos();
    if (access(g_kiln, X_OK) == 0)
        test_cli();
    else
        printf("SKIP CLI: %s not built\n", g_kiln);
    rm_rf(g_tmpdir);
    return kiln_test_finish("test_perplexity");
}
