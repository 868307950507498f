/*
 * golden_decode.c - greedy decoding through the public API (<kiln.h> only), printed bit for
 * bit, for tests/golden/golden.py.
 *
 *   golden_decode -m MODEL -n N [--kv f32|f16] [-t T] [--chunk C] IDS [IDS ...]
 *
 * Each IDS (comma-separated token ids) is one request; all are submitted before any stream
 * is read, so the engine may batch them. Every request is greedy (temperature 0), ignores
 * end-of-generation tokens (always N tokens) and asks for logprobs with the top 20
 * alternatives. The output, one line per generated token,
 *
 *   R I TOKEN LOGPROB_BITS TOP_ID:TOP_BITS ...
 *
 * gives request R's I-th token and its logprob as the hex bits of the f32, then its top
 * alternatives, so a hash of the output pins the decode steps' logits (through their
 * log-softmax) and not only the argmax. A last line per request gives its finish reason and
 * usage. Nothing timing-dependent is printed. Exit status 0 on success, 1 on an error (its
 * message on stderr), 2 on bad usage.
 *
 * It uses only the public API so that it builds unchanged against any libkiln, in particular
 * the one of the commit that made the goldens (make_goldens.sh links it against that build's
 * libkiln.so).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln.h>

enum { MAX_REQ = 8, MAX_IDS = 4096 };

static int usage(void) {
    fprintf(stderr, "usage: golden_decode -m MODEL -n N [--kv f32|f16] [-t T] [--chunk C] "
                    "IDS [IDS ...]\n");
    return 2;
}

static int parse_ids(const char *s, int32_t *ids, int32_t cap) {
    int32_t n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffffL || n == cap) return -1;
        ids[n++] = (int32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

static unsigned bits(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    int n_gen = 0, n_threads = 1, chunk = 0;
    kiln_kv_type kv = KILN_KV_F32;
    static int32_t ids[MAX_REQ][MAX_IDS];
    int32_t n_ids[MAX_REQ];
    int n_req = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-m") && has_val)
            model_path = argv[++i];
        else if (!strcmp(a, "-n") && has_val)
            n_gen = atoi(argv[++i]);
        else if (!strcmp(a, "-t") && has_val)
            n_threads = atoi(argv[++i]);
        else if (!strcmp(a, "--chunk") && has_val)
            chunk = atoi(argv[++i]);
        else if (!strcmp(a, "--kv") && has_val) {
            const char *v = argv[++i];
            if (!strcmp(v, "f32"))
                kv = KILN_KV_F32;
            else if (!strcmp(v, "f16"))
                kv = KILN_KV_F16;
            else
                return usage();
        } else if (a[0] != '-' && n_req < MAX_REQ) {
            n_ids[n_req] = parse_ids(a, ids[n_req], MAX_IDS);
            if (n_ids[n_req] <= 0) return usage();
            n_req++;
        } else
            return usage();
    }
    if (!model_path || n_gen < 1 || n_threads < 1 || chunk < 0 || n_req == 0) return usage();

    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_engine *e = NULL;
    kiln_stream *s[MAX_REQ] = {0};
    int rc = 1;
    if (kiln_model_load(model_path, NULL, &m, &err) != KILN_OK) goto fail;
    kiln_engine_params ep = kiln_engine_default_params();
    int32_t need = 0, longest = 0;
    for (int r = 0; r < n_req; r++) {
        int32_t len = n_ids[r] + n_gen;
        need += len + 16; /* a block of slack per request */
        if (len > longest) longest = len;
    }
    ep.kv_type = kv;
    ep.kv_tokens = need;
    ep.n_ctx = longest;
    ep.n_threads = n_threads;
    ep.prefill_chunk = chunk;
    if (kiln_engine_create(m, &ep, &e, &err) != KILN_OK) goto fail;
    for (int r = 0; r < n_req; r++) {
        kiln_request rq = kiln_request_defaults();
        rq.prompt_ids = ids[r];
        rq.n_prompt_ids = n_ids[r];
        rq.max_tokens = n_gen;
        rq.temperature = 0.0f;
        rq.ignore_eos = true;
        rq.logprobs = true;
        rq.top_logprobs = KILN_MAX_TOP_LOGPROBS;
        if (kiln_engine_submit(e, &rq, &s[r], &err) != KILN_OK) goto fail;
    }
    for (int r = 0; r < n_req; r++) {
        printf("req %d prompt %d\n", r, n_ids[r]);
        kiln_event ev;
        do {
            if (kiln_stream_next(s[r], -1, &ev, &err) != KILN_OK) goto fail;
            if (ev.type == KILN_EVENT_TOKEN) {
                printf("%d %d %d %08x", r, ev.index, ev.token, bits(ev.logprob));
                for (int k = 0; k < ev.n_top_logprobs; k++)
                    printf(" %d:%08x", ev.top_logprobs[k].token, bits(ev.top_logprobs[k].logprob));
                printf("\n");
            }
        } while (ev.type != KILN_EVENT_FINISH);
        printf("%d finish %s prompt_tokens %d completion_tokens %d\n", r,
               kiln_finish_reason_name(ev.finish_reason), ev.usage.prompt_tokens,
               ev.usage.completion_tokens);
        if (ev.finish_reason == KILN_FINISH_ERROR) {
            fprintf(stderr, "golden_decode: request %d: %s\n", r, ev.message);
            goto done;
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "golden_decode: %s\n", err.message);
done:
    for (int r = 0; r < n_req; r++) kiln_stream_destroy(s[r]);
    kiln_engine_destroy(e);
    kiln_model_free(m);
    return rc;
}
