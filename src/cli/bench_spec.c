/*
 * bench_spec.c - `kiln bench --spec MODE`: speculative decoding against plain decoding, in
 * one process and one engine (issue 18, "Telemetry" and the "Speed" goals), and
 * `--verify-scaling`: what one forward of M tokens costs against one of 1 token.
 *
 * --spec MODE. Every request is greedy with ignore_eos and generates --gen-tokens tokens. Its
 * prompt is synthetic (deterministic pseudo-random ordinary tokens from --seed, as plain
 * `kiln bench` makes them) or taken from --prompt-file (the file's text, tokenized; request i
 * takes --prompt-tokens tokens from offset i * N, wrapping around the file; without
 * --prompt-tokens every request takes the whole file). Each request runs twice: a plain phase
 * (speculation off) and a spec phase, whose drafts come from MODE:
 *   ngram              prompt lookup (KILN_SPEC_NGRAM);
 *   random             uniformly random drafts (KILN_SPEC_RANDOM: what rejected drafts cost,
 *                      after adaptive k backs off);
 *   draft:PATH         the draft model loaded from PATH (engine draft_model, KILN_SPEC_DRAFT);
 *   prediction:self    a client prediction (prediction_ids) equal to the request's own plain
 *                      greedy output;
 *   prediction:edit=P  that output with round(P% of its tokens) replaced by other ordinary
 *                      ids, at positions and with ids drawn from --seed and the request index.
 * For each concurrency level C the phases alternate group by group, C requests submitted
 * together per group: plain group, spec group of the same prompts, next plain group, ... (with
 * C = 1, request by request), so load noise on a shared machine hits both phases. A level runs
 * max(--requests, C) requests per phase, rounded up to a multiple of C. One uncounted warm-up
 * (a short plain request and its spec twin) runs first. The prefix cache is off, so both
 * phases compute their prompts.
 * Reported per level and phase: decode tok/s per request, (tokens - 1) / (last token time -
 * first token time) from the engine's event times, as median, min and max (with a prompt of
 * 64 tokens or fewer the engine may verify drafts in the prompt's own forward, so the first
 * token can arrive with some accepted drafts, which this rate then counts as free; the
 * default 128-token prompts never do); the total wall time
 * of the phase's groups (submit to last finish); for the spec phase the engine's usage counters
 * summed over its requests: drafted, accepted, acceptance = accepted / drafted, verify steps,
 * tokens per verify step = (accepted + verify steps) / verify steps (each verify step emits its
 * accepted drafts and one sampled token), accepted / rejected prediction tokens; the ratio of
 * the spec median to the plain median, and the median over requests of each one's spec tok/s
 * over its own plain tok/s (the two ran back to back: steadier when the machine's speed
 * drifts); and whether every spec output equals its plain output
 * token for token, as exact speculation promises (otherwise MISMATCH, and exit status 1).
 *
 * --verify-scaling. On the same warm engine, for M in 1, 2, 5, 9, 17, 33, median of 5
 * repetitions (interleaved: every M once, then again):
 *   prefill  TTFT of a synthetic M-token prompt generating 1 token (one forward of M tokens,
 *            logits of the last row only), as a ratio to M = 1;
 *   verify   the time per forward of a request whose prediction is its own plain output, at
 *            spec_k = M - 1: every step verifies M - 1 drafts and accepts them all (logits of
 *            all M rows, the accept walk), as (last token - first token) / forwards, where
 *            forwards = tokens - 1 - accepted drafts (a verify step emits accepted + 1
 *            tokens, a plain step 1); M = 1 is the plain request. Steps near the end carry
 *            fewer drafts (max_tokens), so the mean tokens per forward is given too.
 * A verify of k drafts pays off when its cost ratio at k + 1 is below the tokens it emits:
 * prediction:self's speedup is about (k + 1) / ratio(k + 1).
 */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "util/error.h"

#define VS_REPS 5
/* the verify column's prompt: longer than the 64 known tokens a sequence may still have to
 * feed when drafts join its step (spec.c), so the prompt's forward carries no drafts and
 * every forward after the first token is a verify step */
#define VS_PROMPT 80
static const int32_t k_vs_m[] = {1, 2, 5, 9, 17, 33};
#define VS_N ((int32_t)(sizeof k_vs_m / sizeof k_vs_m[0]))

int bench_spec_parse_mode(const char *arg, bench_spec_opts *o) {
    o->mode_arg = arg;
    if (!strcmp(arg, "ngram")) {
        o->mode = BENCH_SPEC_NGRAM;
    } else if (!strcmp(arg, "random")) {
        o->mode = BENCH_SPEC_RANDOM;
    } else if (!strncmp(arg, "draft:", 6)) {
        const char *path = arg + 6;
        if (!path[0])
            return cli_usage_error("bench", "--spec draft:PATH needs the draft model's path");
        if (access(path, R_OK) != 0)
            return cli_usage_error("bench", "--spec draft:PATH: cannot read the draft model '%s'",
                                   path);
        o->mode = BENCH_SPEC_DRAFT;
        o->draft_path = path;
    } else if (!strcmp(arg, "prediction:self")) {
        o->mode = BENCH_SPEC_PRED_SELF;
    } else if (!strncmp(arg, "prediction:edit=", 16)) {
        if (!cli_parse_f32(arg + 16, 0.0f, 100.0f, &o->edit_pct))
            return cli_usage_error("bench",
                                   "--spec prediction:edit=P: P must be a percentage in [0, 100] "
                                   "(got '%s')",
                                   arg + 16);
        o->mode = BENCH_SPEC_PRED_EDIT;
    } else {
        return cli_usage_error("bench",
                               "--spec must be ngram, random, draft:PATH, prediction:self or "
                               "prediction:edit=P (got '%s')",
                               arg);
    }
    return 0;
}

/* ---- prompts ---------------------------------------------------------------------------- */

typedef struct prompt_src {
    int32_t *ids; /* synthetic: [n_req * len]; file: the file's tokens [n_file] */
    int32_t n_file;
    int32_t len; /* tokens per prompt */
    bool file;
} prompt_src;

/* Request i's prompt (len tokens). */
static const int32_t *prompt_of(const prompt_src *ps, int32_t i) {
    if (!ps->file) return ps->ids + (size_t)i * (size_t)ps->len;
    int64_t span = (int64_t)ps->n_file - ps->len + 1; /* distinct offsets */
    return ps->ids + ((int64_t)i * ps->len) % span;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, nc);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Fill ps for n_req requests. Returns 0, KILN_EXIT_ERROR or KILN_EXIT_USAGE (printed). */
static int make_prompts(const kiln_model *m, const bench_spec_opts *o, const int32_t *ord,
                        int32_t n_ord, int32_t n_req, prompt_src *ps) {
    kiln_error err = {0};
    if (!o->prompt_file) {
        ps->len = o->prompt_tokens > 0 ? o->prompt_tokens : 128;
        ps->ids = malloc((size_t)n_req * (size_t)ps->len * sizeof *ps->ids);
        if (!ps->ids) goto oom;
        uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 0x5BEC;
        if (x == 0) x = 1;
        for (size_t i = 0; i < (size_t)n_req * (size_t)ps->len; i++)
            ps->ids[i] = ord[bench_xorshift(&x) % (uint64_t)n_ord];
        return 0;
    }
    size_t len = 0;
    char *text = slurp(o->prompt_file, &len);
    if (!text) {
        fprintf(stderr, "kiln: error: --prompt-file %s: cannot read it\n", o->prompt_file);
        return KILN_EXIT_ERROR;
    }
    int32_t n = 0;
    kiln_status st = kiln_model_tokenize(m, text, len, true, false, NULL, 0, &n, &err);
    if (st == KILN_OK && n > 0) {
        ps->ids = malloc((size_t)n * sizeof *ps->ids);
        if (!ps->ids) {
            free(text);
            goto oom;
        }
        st = kiln_model_tokenize(m, text, len, true, false, ps->ids, n, &n, &err);
    }
    free(text);
    if (st != KILN_OK) {
        kiln_error_prefix(&err, "--prompt-file %s: ", o->prompt_file);
        return cli_fail(&err);
    }
    if (n == 0) {
        fprintf(stderr, "kiln: error: --prompt-file %s holds no tokens\n", o->prompt_file);
        return KILN_EXIT_ERROR;
    }
    ps->file = true;
    ps->n_file = n;
    ps->len = o->prompt_tokens > 0 ? o->prompt_tokens : n;
    if (ps->len > n) {
        fprintf(stderr,
                "kiln bench: --prompt-tokens %d is more than --prompt-file %s holds (%d "
                "tokens)\n",
                ps->len, o->prompt_file, n);
        return KILN_EXIT_USAGE;
    }
    return 0;
oom:
    fprintf(stderr, "kiln: error: out of memory (prompts)\n");
    return KILN_EXIT_ERROR;
}

/* ---- running groups of requests ------------------------------------------------------------ */

/* One request to run: its prompt, and for the spec phase its speculation settings. */
typedef struct job {
    const int32_t *prompt;
    int32_t n_prompt;
    kiln_spec_source spec; /* KILN_SPEC_OFF for plain and for predictions */
    int32_t spec_k;
    const int32_t *pred; /* prediction ids or NULL */
    int32_t n_pred;
    int32_t max_tokens;
} job;

/* Submit jobs[0..n) at once, read them to their ends (one thread each), fill out[i] (whose
 * ids / ids_cap the caller set) and *wall_ms (first submit to last finish). Returns 0 or
 * KILN_EXIT_ERROR (printed). */
static int run_group(kiln_engine *e, const job *jobs, int32_t n, bench_req *out, double *wall_ms) {
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!th) {
        fprintf(stderr, "kiln: error: out of memory\n");
        return KILN_EXIT_ERROR;
    }
    int rc = 0;
    int32_t started = 0;
    double t0 = cli_now_ms();
    for (int32_t i = 0; i < n; i++) {
        kiln_request rq = kiln_request_defaults();
        rq.temperature = 0.0f;
        rq.ignore_eos = true;
        rq.max_tokens = jobs[i].max_tokens;
        rq.prompt_ids = jobs[i].prompt;
        rq.n_prompt_ids = jobs[i].n_prompt;
        rq.spec = jobs[i].spec;
        rq.spec_k = jobs[i].spec_k;
        rq.prediction_ids = jobs[i].pred;
        rq.n_prediction_ids = jobs[i].pred ? jobs[i].n_pred : 0;
        bench_req *r = &out[i];
        r->stream = NULL;
        r->n_tokens = 0;
        r->finish = KILN_FINISH_NONE;
        r->t_submit = cli_now_ms();
        kiln_error err = {0};
        if (kiln_engine_submit(e, &rq, &r->stream, &err) != KILN_OK) {
            rc = cli_fail(&err);
            break;
        }
        if (pthread_create(&th[i], NULL, bench_consume, r) != 0) {
            fprintf(stderr, "kiln: error: cannot start a consumer thread\n");
            kiln_stream_cancel(r->stream);
            bench_consume(r);
            kiln_stream_destroy(r->stream);
            r->stream = NULL;
            rc = KILN_EXIT_ERROR;
            break;
        }
        started = i + 1;
    }
    for (int32_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    double t_end = t0;
    for (int32_t i = 0; i < started; i++) {
        bench_req *r = &out[i];
        if (!rc && r->finish == KILN_FINISH_ERROR) rc = cli_fail(&r->err);
        if (r->t_end > t_end) t_end = r->t_end;
        kiln_stream_destroy(r->stream);
        r->stream = NULL;
    }
    *wall_ms = t_end - t0;
    free(th);
    return rc;
}

/* Decode tok/s of one request: (tokens - 1) / (last - first token), 0 when undefined. */
static double decode_tps(const bench_req *r) {
    return r->n_tokens > 1 && r->t_last > r->t_first
               ? (r->n_tokens - 1) * 1e3 / (r->t_last - r->t_first)
               : 0.0;
}

static double median(const double *v, int32_t n) {
    if (n <= 0) return 0.0;
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return v[0];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, bench_cmp_double);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

/* ---- one level ------------------------------------------------------------------------- */

typedef struct phase_res {
    int32_t n;
    double *tps; /* [n] per request */
    double med, min, max, wall_s;
    int64_t tokens, drafted, accepted, verify_steps, acc_pred, rej_pred;
} phase_res;

typedef struct level_res {
    int32_t concurrency, n;
    phase_res plain, spec;
    double pair_ratio; /* median over requests of spec tok/s / its own plain tok/s */
    int32_t mismatches;
    int32_t first_mismatch_req, first_mismatch_pos; /* -1 when none */
} level_res;

static void phase_finish(phase_res *p) {
    p->med = median(p->tps, p->n);
    p->min = p->max = p->n ? p->tps[0] : 0;
    for (int32_t i = 1; i < p->n; i++) {
        if (p->tps[i] < p->min) p->min = p->tps[i];
        if (p->tps[i] > p->max) p->max = p->tps[i];
    }
}

static void phase_add(phase_res *p, const bench_req *r) {
    p->tps[p->n++] = decode_tps(r);
    p->tokens += r->n_tokens;
    p->drafted += r->usage.spec_drafted;
    p->accepted += r->usage.spec_accepted;
    p->verify_steps += r->usage.spec_verify_steps;
    p->acc_pred += r->usage.accepted_prediction_tokens;
    p->rej_pred += r->usage.rejected_prediction_tokens;
}

/* The spec settings of MODE. */
static kiln_spec_source mode_source(bench_spec_mode m) {
    switch (m) {
    case BENCH_SPEC_NGRAM:
        return KILN_SPEC_NGRAM;
    case BENCH_SPEC_RANDOM:
        return KILN_SPEC_RANDOM;
    case BENCH_SPEC_DRAFT:
        return KILN_SPEC_DRAFT;
    default:
        return KILN_SPEC_OFF; /* predictions draft without a source */
    }
}

/* pred[0..n) := plain[0..n) with round(n * pct / 100) tokens replaced by other ordinary ids,
 * at distinct positions; both drawn from (seed, req). */
static void make_edit(const int32_t *plain, int32_t n, float pct, uint64_t seed, int32_t req,
                      const int32_t *ord, int32_t n_ord, int32_t *pos_scratch, int32_t *pred) {
    memcpy(pred, plain, (size_t)n * sizeof *pred);
    int32_t n_edit = (int32_t)floor((double)n * pct / 100.0 + 0.5);
    if (n_edit > n) n_edit = n;
    uint64_t x = (seed ^ 0xED17ED17ED17ull) * 0x9E3779B97F4A7C15ull + (uint64_t)req * 0x2545F491ull;
    if (x == 0) x = 1;
    for (int32_t i = 0; i < n; i++) pos_scratch[i] = i;
    for (int32_t i = 0; i < n_edit; i++) { /* partial Fisher-Yates: the first n_edit positions */
        int32_t j = i + (int32_t)(bench_xorshift(&x) % (uint64_t)(n - i));
        int32_t t = pos_scratch[i];
        pos_scratch[i] = pos_scratch[j];
        pos_scratch[j] = t;
        int32_t p = pos_scratch[i], id = pred[p];
        if (n_ord < 2) continue;
        while (id == plain[p]) id = ord[bench_xorshift(&x) % (uint64_t)n_ord];
        pred[p] = id;
    }
}

/* Run one level: n requests per phase (a multiple of c) in groups of c, plain then spec;
 * fill *lr (its tps arrays are allocated here). Returns 0 or KILN_EXIT_ERROR (printed). */
static int run_level(kiln_engine *e, const bench_spec_opts *o, const prompt_src *ps,
                     const int32_t *ord, int32_t n_ord, int32_t c, int32_t n, int32_t gen,
                     level_res *lr) {
    int rc = 0;
    job *jobs = calloc((size_t)c, sizeof *jobs);
    bench_req *reqs = calloc((size_t)c, sizeof *reqs);
    int32_t *plain = malloc((size_t)c * gen * sizeof *plain);
    int32_t *spec = malloc((size_t)c * gen * sizeof *spec);
    int32_t *pred = malloc((size_t)c * gen * sizeof *pred);
    int32_t *scratch = malloc((size_t)gen * sizeof *scratch);
    int32_t *n_plain_tokens = calloc((size_t)c, sizeof *n_plain_tokens);
    double *pr_scratch = calloc((size_t)n, sizeof *pr_scratch);
    lr->plain.tps = calloc((size_t)n, sizeof(double));
    lr->spec.tps = calloc((size_t)n, sizeof(double));
    if (!jobs || !reqs || !plain || !spec || !pred || !scratch || !n_plain_tokens || !pr_scratch ||
        !lr->plain.tps || !lr->spec.tps) {
        fprintf(stderr, "kiln: error: out of memory\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    lr->concurrency = c;
    lr->n = n;
    lr->first_mismatch_req = lr->first_mismatch_pos = -1;
    for (int32_t g0 = 0; g0 < n; g0 += c) {
        double wall;
        /* plain group */
        for (int32_t i = 0; i < c; i++) {
            jobs[i] = (job){.prompt = prompt_of(ps, g0 + i),
                            .n_prompt = ps->len,
                            .spec = KILN_SPEC_OFF,
                            .max_tokens = gen};
            reqs[i].ids = plain + (size_t)i * gen;
            reqs[i].ids_cap = gen;
        }
        if ((rc = run_group(e, jobs, c, reqs, &wall))) goto done;
        lr->plain.wall_s += wall / 1e3;
        for (int32_t i = 0; i < c; i++) {
            phase_add(&lr->plain, &reqs[i]);
            n_plain_tokens[i] = reqs[i].n_tokens;
        }
        /* spec group: the same prompts */
        for (int32_t i = 0; i < c; i++) {
            jobs[i].spec = mode_source(o->mode);
            jobs[i].spec_k = o->spec_k;
            int32_t np = n_plain_tokens[i] < gen ? n_plain_tokens[i] : gen;
            if (o->mode == BENCH_SPEC_PRED_SELF) {
                jobs[i].pred = plain + (size_t)i * gen;
                jobs[i].n_pred = np;
            } else if (o->mode == BENCH_SPEC_PRED_EDIT) {
                make_edit(plain + (size_t)i * gen, np, o->edit_pct, o->seed, g0 + i, ord, n_ord,
                          scratch, pred + (size_t)i * gen);
                jobs[i].pred = pred + (size_t)i * gen;
                jobs[i].n_pred = np;
            }
            if (jobs[i].pred && jobs[i].n_pred == 0) jobs[i].pred = NULL;
            reqs[i].ids = spec + (size_t)i * gen;
            reqs[i].ids_cap = gen;
        }
        if ((rc = run_group(e, jobs, c, reqs, &wall))) goto done;
        lr->spec.wall_s += wall / 1e3;
        for (int32_t i = 0; i < c; i++) {
            phase_add(&lr->spec, &reqs[i]);
            const int32_t *a = plain + (size_t)i * gen, *b = spec + (size_t)i * gen;
            int32_t na = n_plain_tokens[i], nb = reqs[i].n_tokens, pos = -1;
            int32_t m = na < nb ? na : nb;
            if (m > gen) m = gen;
            for (int32_t t = 0; t < m && pos < 0; t++)
                if (a[t] != b[t]) pos = t;
            if (pos < 0 && na != nb) pos = m;
            if (pos >= 0) {
                if (lr->mismatches++ == 0) {
                    lr->first_mismatch_req = g0 + i;
                    lr->first_mismatch_pos = pos;
                }
            }
        }
    }
    phase_finish(&lr->plain);
    phase_finish(&lr->spec);
    for (int32_t i = 0; i < n; i++) /* tps[] are in request order (median sorts a copy) */
        pr_scratch[i] = lr->plain.tps[i] > 0 ? lr->spec.tps[i] / lr->plain.tps[i] : 0.0;
    lr->pair_ratio = median(pr_scratch, n);
done:
    free(pr_scratch);
    free(jobs);
    free(reqs);
    free(plain);
    free(spec);
    free(pred);
    free(scratch);
    free(n_plain_tokens);
    return rc;
}

/* ---- verify scaling ---------------------------------------------------------------------- */

typedef struct vs_row {
    int32_t m;
    double ttft_ms, ttft_ratio; /* medians */
    double fwd_ms, fwd_ratio, tok_per_fwd;
    int32_t mismatches;
} vs_row;

static int verify_scaling(kiln_engine *e, const int32_t *ord, int32_t n_ord, int32_t gen,
                          uint64_t seed, vs_row *rows) {
    int rc = 0;
    double ttft[VS_N][VS_REPS], fwd[VS_N][VS_REPS], tpf[VS_N][VS_REPS];
    int32_t prompt[64], vprompt[VS_PROMPT];
    int32_t *plain = malloc((size_t)gen * sizeof *plain), *out = malloc((size_t)gen * sizeof *out);
    if (!plain || !out) {
        fprintf(stderr, "kiln: error: out of memory\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x7E51F1;
    if (x == 0) x = 1;
    for (int32_t i = 0; i < VS_PROMPT; i++) vprompt[i] = ord[bench_xorshift(&x) % (uint64_t)n_ord];
    bench_req r = {0};
    double wall;
    /* the reference output of the verify column (also warms the engine up) */
    job pj = {.prompt = vprompt, .n_prompt = VS_PROMPT, .spec = KILN_SPEC_OFF, .max_tokens = gen};
    r.ids = plain;
    r.ids_cap = gen;
    if ((rc = run_group(e, &pj, 1, &r, &wall))) goto done;
    int32_t n_plain = r.n_tokens < gen ? r.n_tokens : gen;
    for (int32_t i = 0; i < VS_N; i++) rows[i] = (vs_row){.m = k_vs_m[i]};
    for (int32_t rep = 0; rep < VS_REPS; rep++) {
        for (int32_t i = 0; i < VS_N; i++) {
            int32_t m = k_vs_m[i];
            for (int32_t t = 0; t < m; t++) prompt[t] = ord[bench_xorshift(&x) % (uint64_t)n_ord];
            job tj = {.prompt = prompt, .n_prompt = m, .spec = KILN_SPEC_OFF, .max_tokens = 1};
            bench_req tr = {0};
            if ((rc = run_group(e, &tj, 1, &tr, &wall))) goto done;
            ttft[i][rep] = tr.t_first - tr.t_submit;
        }
        for (int32_t i = 0; i < VS_N; i++) {
            int32_t m = k_vs_m[i];
            job vj = pj;
            if (m > 1) {
                vj.pred = plain;
                vj.n_pred = n_plain;
                vj.spec_k = m - 1;
            }
            bench_req vr = {.ids = out, .ids_cap = gen};
            if ((rc = run_group(e, &vj, 1, &vr, &wall))) goto done;
            int32_t fwds = vr.n_tokens - 1 - vr.usage.spec_accepted;
            fwd[i][rep] = fwds > 0 ? (vr.t_last - vr.t_first) / fwds : 0;
            tpf[i][rep] = fwds > 0 ? (double)(vr.n_tokens - 1) / fwds : 0; /* the first token
                                                                               came alone */
            if (vr.n_tokens != r.n_tokens || memcmp(out, plain, (size_t)n_plain * sizeof *out))
                rows[i].mismatches++;
        }
    }
    for (int32_t i = 0; i < VS_N; i++) {
        rows[i].ttft_ms = median(ttft[i], VS_REPS);
        rows[i].fwd_ms = median(fwd[i], VS_REPS);
        rows[i].tok_per_fwd = median(tpf[i], VS_REPS);
    }
    for (int32_t i = 0; i < VS_N; i++) {
        rows[i].ttft_ratio = rows[0].ttft_ms > 0 ? rows[i].ttft_ms / rows[0].ttft_ms : 0;
        rows[i].fwd_ratio = rows[0].fwd_ms > 0 ? rows[i].fwd_ms / rows[0].fwd_ms : 0;
    }
done:
    free(plain);
    free(out);
    return rc;
}

/* ---- reporting --------------------------------------------------------------------------- */

static double acceptance(const phase_res *p) {
    return p->drafted > 0 ? (double)p->accepted / (double)p->drafted : 0.0;
}

static double tok_per_verify(const phase_res *p) {
    return p->verify_steps > 0 ? (double)(p->accepted + p->verify_steps) / (double)p->verify_steps
                               : 0.0;
}

static json_t *phase_json(const phase_res *p, bool spec) {
    json_t *o = json_object();
    json_t *arr = json_array();
    for (int32_t i = 0; i < p->n; i++) json_array_append_new(arr, json_real(p->tps[i]));
    json_object_set_new(o, "requests", json_integer(p->n));
    json_object_set_new(o, "decode_tok_s_median", json_real(p->med));
    json_object_set_new(o, "decode_tok_s_min", json_real(p->min));
    json_object_set_new(o, "decode_tok_s_max", json_real(p->max));
    json_object_set_new(o, "decode_tok_s", arr);
    json_object_set_new(o, "wall_s", json_real(p->wall_s));
    json_object_set_new(o, "tokens", json_integer(p->tokens));
    if (spec) {
        json_object_set_new(o, "drafted_tokens", json_integer(p->drafted));
        json_object_set_new(o, "accepted_tokens", json_integer(p->accepted));
        json_object_set_new(o, "acceptance", json_real(acceptance(p)));
        json_object_set_new(o, "verify_steps", json_integer(p->verify_steps));
        json_object_set_new(o, "tokens_per_verify_step", json_real(tok_per_verify(p)));
        json_object_set_new(o, "accepted_prediction_tokens", json_integer(p->acc_pred));
        json_object_set_new(o, "rejected_prediction_tokens", json_integer(p->rej_pred));
    }
    return o;
}

static void print_phase(int32_t c, const char *name, const phase_res *p, bool spec) {
    printf("%11d %-6s %5d %8.2f %10.2f %8.2f %8.2f", c, name, p->n, p->wall_s, p->med, p->min,
           p->max);
    if (spec)
        printf(" %8lld %8lld %7.1f%% %7lld %8.2f %9lld %9lld", (long long)p->drafted,
               (long long)p->accepted, 100.0 * acceptance(p), (long long)p->verify_steps,
               tok_per_verify(p), (long long)p->acc_pred, (long long)p->rej_pred);
    printf("\n");
}

int bench_spec_run(const char *model_path, const kiln_model_params *lp,
                   const kiln_engine_params *ep0, const bench_spec_opts *o) {
    int rc = 0;
    kiln_error err = {0};
    kiln_model *m = NULL, *draft = NULL;
    kiln_engine *e = NULL;
    int32_t *ord = NULL, n_ord = 0;
    prompt_src ps = {0};
    level_res lv[BENCH_SPEC_MAX_LEVELS];
    memset(lv, 0, sizeof lv);
    int32_t n_lv = 0;
    vs_row vs[VS_N];
    bool spec = o->mode != BENCH_SPEC_NONE;
    int32_t gen = o->gen_tokens;

    if (kiln_model_load(model_path, lp, &m, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    kiln_model_params dlp = {0};
    if (o->mode == BENCH_SPEC_DRAFT &&
        kiln_model_load(o->draft_path, &dlp, &draft, &err) != KILN_OK) {
        kiln_error_prefix(&err, "--spec draft:%s: ", o->draft_path);
        rc = cli_fail(&err);
        goto done;
    }
    if (!(ord = bench_ordinary_tokens(m, &n_ord)) || n_ord == 0) {
        fprintf(stderr, "kiln: error: the vocabulary has no ordinary tokens to build prompts\n");
        rc = KILN_EXIT_ERROR;
        goto done;
    }
    /* requests per phase at each level: max(R, C), rounded up to a multiple of C */
    int32_t n_at[BENCH_SPEC_MAX_LEVELS], max_n = 1, max_c = 1;
    for (int32_t i = 0; spec && i < o->n_levels; i++) {
        int32_t c = o->levels[i], n = o->requests > c ? o->requests : c;
        n_at[i] = (n + c - 1) / c * c;
        if (n_at[i] > max_n) max_n = n_at[i];
        if (c > max_c) max_c = c;
    }
    if (spec && (rc = make_prompts(m, o, ord, n_ord, max_n, &ps))) goto done;

    /* The engine: the context fits a request (the prediction as long as the output) and the
     * pool every request of the largest group, with a verify step's drafts and a partial
     * block each. */
    kiln_engine_params ep = *ep0;
    ep.no_prefix_cache = true;
    ep.cache_dir = NULL;
    ep.cache_disk_max = 0;
    ep.spec = KILN_SPEC_OFF; /* per request */
    if (o->spec_k > 0) ep.spec_k = o->spec_k;
    ep.draft_model = draft;
    int64_t per_req = spec ? (int64_t)ps.len + gen : 0;
    if (o->verify_scaling && per_req < VS_PROMPT + gen)
        per_req = VS_PROMPT + gen;                       /* verify column */
    if (o->verify_scaling && per_req < 34) per_req = 34; /* its 33-token prompts */
    if ((rc = bench_fit_ctx(m, &ep, per_req + KILN_MAX_SPEC_K + 1)) != 0) goto done;
    if (ep.kv_memory == 0 && ep.kv_tokens == 0 && ep.memory_budget == 0 && ep.gpu_memory == 0) {
        int64_t want = (int64_t)max_c * (per_req + KILN_MAX_SPEC_K + 1 + 16);
        ep.kv_tokens = want > INT32_MAX ? INT32_MAX : (int32_t)want;
    }
    if (ep.max_seqs == 0) ep.max_seqs = max_c > 256 ? max_c : 256;
    if (ep.max_queue == 0) ep.max_queue = max_c > 4096 ? max_c : 4096;
    if (kiln_engine_create(m, &ep, &e, &err) != KILN_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    kiln_engine_params used;
    kiln_engine_get_params(e, &used);

    if (spec) {
        /* warm-up: one short plain request and its spec twin, not counted */
        bench_spec_opts wo = *o;
        prompt_src wps = ps;
        wps.len = ps.len < 16 ? ps.len : 16;
        level_res warm = {0};
        rc = run_level(e, &wo, &wps, ord, n_ord, 1, 1, gen < 8 ? gen : 8, &warm);
        free(warm.plain.tps);
        free(warm.spec.tps);
        if (rc) goto done;
        for (int32_t i = 0; i < o->n_levels; i++) {
            if ((rc = run_level(e, o, &ps, ord, n_ord, o->levels[i], n_at[i], gen, &lv[n_lv++])))
                goto done;
        }
    }
    if (o->verify_scaling && (rc = verify_scaling(e, ord, n_ord, gen, o->seed, vs))) goto done;

    int32_t mismatches = 0;
    for (int32_t i = 0; i < n_lv; i++) mismatches += lv[i].mismatches;
    for (int32_t i = 0; o->verify_scaling && i < VS_N; i++) mismatches += vs[i].mismatches;
    int32_t spec_k = used.spec_k;
    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "model", json_string(model_path));
        json_object_set_new(j, "mode", json_string("spec"));
        json_object_set_new(j, "spec", spec ? json_string(o->mode_arg) : json_null());
        json_object_set_new(j, "spec_k", json_integer(spec_k));
        json_object_set_new(j, "threads", json_integer(used.n_threads));
        json_object_set_new(j, "kv_type", json_string(cli_kv_type_label(&ep)));
        json_object_set_new(j, "prompt_tokens", json_integer(spec ? ps.len : 0));
        json_object_set_new(j, "prompt_file",
                            o->prompt_file ? json_string(o->prompt_file) : json_null());
        json_object_set_new(j, "gen_tokens", json_integer(gen));
        if (o->mode == BENCH_SPEC_PRED_EDIT)
            json_object_set_new(j, "edit_percent", json_real(o->edit_pct));
        json_t *levels = json_array();
        for (int32_t i = 0; i < n_lv; i++) {
            const level_res *l = &lv[i];
            json_t *lo = json_object();
            json_object_set_new(lo, "concurrency", json_integer(l->concurrency));
            json_object_set_new(lo, "requests", json_integer(l->n));
            json_object_set_new(lo, "plain", phase_json(&l->plain, false));
            json_object_set_new(lo, "spec", phase_json(&l->spec, true));
            json_object_set_new(lo, "ratio",
                                json_real(l->plain.med > 0 ? l->spec.med / l->plain.med : 0.0));
            json_object_set_new(lo, "pair_ratio_median", json_real(l->pair_ratio));
            json_object_set_new(lo, "outputs_match", json_boolean(l->mismatches == 0));
            json_object_set_new(lo, "mismatches", json_integer(l->mismatches));
            json_array_append_new(levels, lo);
        }
        json_object_set_new(j, "levels", levels);
        if (o->verify_scaling) {
            json_t *arr = json_array();
            for (int32_t i = 0; i < VS_N; i++) {
                json_t *r = json_object();
                json_object_set_new(r, "m", json_integer(vs[i].m));
                json_object_set_new(r, "prefill_ttft_ms", json_real(vs[i].ttft_ms));
                json_object_set_new(r, "prefill_ratio", json_real(vs[i].ttft_ratio));
                json_object_set_new(r, "verify_forward_ms", json_real(vs[i].fwd_ms));
                json_object_set_new(r, "verify_ratio", json_real(vs[i].fwd_ratio));
                json_object_set_new(r, "tokens_per_forward", json_real(vs[i].tok_per_fwd));
                json_object_set_new(r, "outputs_match", json_boolean(vs[i].mismatches == 0));
                json_array_append_new(arr, r);
            }
            json_object_set_new(j, "verify_scaling", arr);
        }
        json_object_set_new(j, "outputs_match", json_boolean(mismatches == 0));
        if (cli_print_json(j)) rc = KILN_EXIT_ERROR;
    } else {
        if (spec) {
            printf("kiln bench --spec %s: %s | prompt %d%s, gen %d tokens | %d threads | spec-k %d "
                   "| KV %s | greedy, prefix cache off\n",
                   o->mode_arg, model_path, ps.len, ps.file ? " (from --prompt-file)" : "", gen,
                   used.n_threads, spec_k, cli_kv_type_label(&ep));
            printf("%11s %-6s %5s %8s %10s %8s %8s %8s %8s %8s %7s %8s %9s %9s\n", "concurrency",
                   "phase", "reqs", "wall s", "decode t/s", "min", "max", "drafted", "accepted",
                   "accept", "verify", "tok/step", "pred acc", "pred rej");
            for (int32_t i = 0; i < n_lv; i++) {
                const level_res *l = &lv[i];
                print_phase(l->concurrency, "plain", &l->plain, false);
                print_phase(l->concurrency, "spec", &l->spec, true);
                printf("%11d spec/plain decode tok/s (medians) %.2fx, median of per-request ratios "
                       "%.2fx | outputs: %s\n",
                       l->concurrency, l->plain.med > 0 ? l->spec.med / l->plain.med : 0.0,
                       l->pair_ratio, l->mismatches ? "MISMATCH" : "identical to plain");
            }
        }
        if (o->verify_scaling) {
            printf("verify scaling: %s | %d threads | median of %d | prefill: TTFT of an M-token "
                   "prompt (last row's logits); verify: ms per forward verifying M - 1 accepted "
                   "drafts (all M rows' logits)\n",
                   model_path, used.n_threads, VS_REPS);
            printf("%4s %14s %8s %15s %8s %10s\n", "M", "prefill ms", "ratio", "verify ms/fwd",
                   "ratio", "tok/fwd");
            for (int32_t i = 0; i < VS_N; i++)
                printf("%4d %14.2f %8.2f %15.2f %8.2f %10.2f%s\n", vs[i].m, vs[i].ttft_ms,
                       vs[i].ttft_ratio, vs[i].fwd_ms, vs[i].fwd_ratio, vs[i].tok_per_fwd,
                       vs[i].mismatches ? "  MISMATCH" : "");
        }
    }
    fflush(stdout);
    if (mismatches > 0) {
        for (int32_t i = 0; i < n_lv; i++)
            if (lv[i].mismatches)
                fprintf(stderr,
                        "kiln bench: MISMATCH: concurrency %d: %d of %d speculative outputs differ "
                        "from plain decoding (first: request %d at token %d); speculation must be "
                        "exact\n",
                        lv[i].concurrency, lv[i].mismatches, lv[i].n, lv[i].first_mismatch_req,
                        lv[i].first_mismatch_pos);
        for (int32_t i = 0; o->verify_scaling && i < VS_N; i++)
            if (vs[i].mismatches)
                fprintf(stderr,
                        "kiln bench: MISMATCH: verify scaling M = %d: %d of %d outputs differ "
                        "from plain decoding\n",
                        vs[i].m, vs[i].mismatches, VS_REPS);
        if (!rc) rc = KILN_EXIT_ERROR;
    }
done:
    for (int32_t i = 0; i < BENCH_SPEC_MAX_LEVELS; i++) {
        free(lv[i].plain.tps);
        free(lv[i].spec.tps);
    }
    free(ps.ids);
    free(ord);
    kiln_engine_destroy(e);
    kiln_model_free(draft);
    kiln_model_free(m);
    return rc;
}
