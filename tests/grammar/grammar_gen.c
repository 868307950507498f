/*
 * grammar_gen.c - generate under JSON schemas for test_grammar_schemas.py (which validates
 * the outputs with python3-jsonschema): every schema file given, for seeds 0..n_seeds-1, at
 * temperature 1, all requests submitted at once to one engine (continuous batching), each
 * output written as one JSON line {"schema", "seed", "text", "finish", "tokens", "fill"}.
 *
 *   grammar_gen MODEL OUT.jsonl MAX_TOKENS N_SEEDS [--no-jump] SCHEMA.json...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kiln.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    *len = (size_t)n;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: grammar_gen MODEL OUT.jsonl MAX_TOKENS N_SEEDS [--no-jump] SCHEMA...\n");
        return 2;
    }
    const char *model_path = argv[1], *out_path = argv[2];
    int max_tokens = atoi(argv[3]), n_seeds = atoi(argv[4]);
    int first = 5;
    bool no_jump = false;
    if (!strcmp(argv[first], "--no-jump")) {
        no_jump = true;
        first++;
    }
    int n_schemas = argc - first;
    kiln_error err;
    kiln_model *m;
    kiln_model_params mp = {.require_tokenizer = true};
    if (kiln_model_load(model_path, &mp, &m, &err)) {
        fprintf(stderr, "load: %s\n", err.message);
        return 1;
    }
    kiln_engine_params ep = kiln_engine_default_params();
    ep.max_seqs = n_schemas * n_seeds;
    ep.n_ctx = 1024;
    if (kiln_model_n_ctx_train(m) > 0 && kiln_model_n_ctx_train(m) < ep.n_ctx)
        ep.n_ctx = kiln_model_n_ctx_train(m);
    ep.kv_tokens = ep.max_seqs * ep.n_ctx;
    kiln_engine *e;
    if (kiln_engine_create(m, &ep, &e, &err)) {
        fprintf(stderr, "engine: %s\n", err.message);
        return 1;
    }
    int n_req = n_schemas * n_seeds;
    kiln_stream **st = calloc((size_t)n_req, sizeof *st);
    int rc = 0;
    for (int i = 0; i < n_schemas; i++) {
        size_t len;
        char *text = slurp(argv[first + i], &len);
        if (!text) {
            fprintf(stderr, "cannot read %s\n", argv[first + i]);
            return 1;
        }
        kiln_grammar *g;
        if (kiln_grammar_create(KILN_GRAMMAR_JSON_SCHEMA, text, len, &g, &err)) {
            fprintf(stderr, "%s: %s\n", argv[first + i], err.message);
            return 1;
        }
        free(text);
        for (int sd = 0; sd < n_seeds; sd++) {
            kiln_request r = kiln_request_defaults();
            r.prompt = "Once upon a time, the answer in JSON was";
            r.max_tokens = max_tokens;
            r.temperature = 1.0f;
            r.seed = (uint64_t)sd;
            r.grammar = g;
            r.grammar_no_jump_forward = no_jump;
            if (kiln_engine_submit(e, &r, &st[i * n_seeds + sd], &err)) {
                fprintf(stderr, "submit: %s\n", err.message);
                return 1;
            }
        }
        kiln_grammar_destroy(g); /* the requests hold their references */
    }
    FILE *out = fopen(out_path, "w");
    if (!out) return 1;
    for (int i = 0; i < n_req; i++) {
        char *buf = NULL;
        size_t n = 0, cap = 0;
        kiln_event ev;
        int32_t tokens = 0, fill = 0;
        const char *finish = "none";
        char msg[1024] = "";
        for (;;) {
            if (kiln_stream_next(st[i], -1, &ev, &err)) {
                rc = 1;
                break;
            }
            if (ev.type == KILN_EVENT_TEXT) {
                if (n + ev.text_len + 1 > cap) {
                    cap = (n + ev.text_len + 1) * 2;
                    buf = realloc(buf, cap);
                }
                memcpy(buf + n, ev.text, ev.text_len);
                n += ev.text_len;
            } else if (ev.type == KILN_EVENT_FINISH) {
                finish = kiln_finish_reason_name(ev.finish_reason);
                tokens = ev.usage.completion_tokens;
                fill = ev.usage.fill_tokens;
                snprintf(msg, sizeof msg, "%s", ev.message ? ev.message : "");
                break;
            }
        }
        json_t *o = json_pack("{s:s, s:i, s:s%, s:s, s:i, s:i, s:s}", "schema",
                              argv[first + i / n_seeds], "seed", i % n_seeds, "text", buf ? buf : "",
                              n, "finish", finish, "tokens", tokens, "fill", fill, "message", msg);
        char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (!line) {
            /* invalid UTF-8 in the text: report it as such */
            fprintf(out, "{\"schema\":\"%s\",\"seed\":%d,\"text\":null,\"finish\":\"%s\"}\n",
                    argv[first + i / n_seeds], i % n_seeds, finish);
        } else {
            fprintf(out, "%s\n", line);
        }
        free(line);
        json_decref(o);
        free(buf);
        kiln_stream_destroy(st[i]);
    }
    fclose(out);
    kiln_engine_stats es;
    kiln_engine_get_stats(e, &es);
    fprintf(stderr, "grammar_gen: %d requests, %lld steps, %lld fill tokens\n", n_req,
            (long long)es.n_steps, (long long)es.fill_tokens);
    kiln_engine_destroy(e);
    kiln_model_free(m);
    free(st);
    return rc;
}
