/* bench_util.c - helpers of `kiln bench`'s two modes (bench.h). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "util/error.h"

void *bench_consume(void *arg) {
    bench_req *r = arg;
    for (;;) {
        kiln_event ev;
        if (kiln_stream_next(r->stream, -1, &ev, &r->err) != KILN_OK) {
            r->finish = KILN_FINISH_ERROR;
            break;
        }
        double now = (double)ev.time_ns / 1e6; /* engine-side time: same clock as cli_now_ms */
        if (ev.type == KILN_EVENT_TOKEN) {
            if (r->ids && r->n_tokens < r->ids_cap) r->ids[r->n_tokens] = ev.token;
            if (r->n_tokens == 0) r->t_first = now;
            r->t_last = now;
            r->n_tokens++;
        } else if (ev.type == KILN_EVENT_FINISH) {
            r->t_end = now;
            r->finish = ev.finish_reason;
            r->cached_tokens = ev.usage.cached_tokens;
            r->prompt_tokens = ev.usage.prompt_tokens;
            r->usage = ev.usage;
            if (ev.finish_reason == KILN_FINISH_ERROR)
                kiln_error_set(&r->err, ev.status, "%s", ev.message);
            break;
        }
    }
    return NULL;
}

int32_t *bench_ordinary_tokens(const kiln_model *m, int32_t *n_out) {
    int32_t nv = kiln_model_n_vocab(m), n = 0;
    int32_t *ids = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *ids);
    if (!ids) return NULL;
    for (int32_t id = 0; id < nv; id++) {
        char buf[64];
        if (kiln_model_is_eog(m, id)) continue;
        if (m->tokenizer && kiln_model_token_piece(m, id, buf, sizeof buf) == 0) continue;
        if (m->tokenizer && id == kiln_tokenizer_bos(m->tokenizer)) continue;
        ids[n++] = id;
    }
    *n_out = n;
    return ids;
}

uint64_t bench_xorshift(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_percentile(const double *v, int32_t n, double p) {
    int32_t k = (int32_t)((p / 100.0) * n + 0.999999);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}

double bench_cpu_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int bench_fit_ctx(const kiln_model *m, kiln_engine_params *ep, int64_t per_req) {
    int64_t n_ctx = ep->n_ctx > 0 ? ep->n_ctx : kiln_model_n_ctx_train(m);
    if (ep->n_ctx > 0 && n_ctx < per_req) {
        fprintf(stderr, "kiln: error: --ctx %lld is shorter than a request (%lld positions)\n",
                (long long)n_ctx, (long long)per_req);
        return KILN_EXIT_USAGE;
    }
    if (n_ctx > 0 && n_ctx < per_req)
        fprintf(stderr,
                "kiln bench: warning: requests of %lld positions exceed the model's training "
                "context of %lld; the context is stretched to fit (speed figures only)\n",
                (long long)per_req, (long long)n_ctx);
    if (n_ctx < per_req) n_ctx = per_req;
    ep->n_ctx = (int32_t)n_ctx;
    return 0;
}
