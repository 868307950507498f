/*
 * llama2c.c - llama2.c v0 checkpoints and tokenizer.bin (source: karpathy/llama2.c run.c:
 * read_checkpoint, memory_map_weights, build_tokenizer). Weights are mmap'd, never copied.
 */
#include "format/llama2c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/mapped_file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln's llama2.c reader assumes a little-endian host"
#endif

#define L2C_HEADER_BYTES 28 /* 7 x int32 */

static const char *const field_names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                           "n_kv_heads", "vocab_size", "seq_len"};

/* a*b (+ c) in uint64 with overflow detection; returns false on overflow. */
static bool mul3(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) {
    uint64_t t;
    if (__builtin_mul_overflow(a, b, &t)) return false;
    return !__builtin_mul_overflow(t, c, out);
}

static bool add_to(uint64_t *acc, uint64_t v) {
    return !__builtin_add_overflow(*acc, v, acc);
}

static kiln_status parse_checkpoint(const void *data, size_t size, const char *name,
                                    kiln_llama2c *m, kiln_error *err) {
    if (!data || size < L2C_HEADER_BYTES) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header at offset 0 needs %d bytes (7 int32) but the file is "
                              "%zu bytes: truncated or not a llama2.c checkpoint",
                              name, L2C_HEADER_BYTES, data ? size : 0);
    }
    if (((uintptr_t)data & 3u) != 0) {
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: buffer is not 4-byte aligned; f32 weights need it", name);
    }
    int32_t h[7];
    memcpy(h, data, sizeof h);
    for (int i = 0; i < 7; i++) {
        bool bad = i == 5 ? (h[i] == 0 || h[i] == INT32_MIN) : h[i] <= 0;
        if (bad) {
            return kiln_error_set(
                err, KILN_ERR_FORMAT, "%s: header.%s at offset %d is %d; it must be %s", name,
                field_names[i], 4 * i, h[i],
                i == 5 ? "non-zero (negative = separate classifier)" : "positive");
        }
    }
    kiln_llama2c_config *c = &m->config;
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->shared_classifier = h[5] > 0;
    c->vocab_size = h[5] > 0 ? h[5] : -h[5];
    c->seq_len = h[6];
    if (c->dim % c->n_heads != 0) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header.dim (%d, offset 0) is not divisible by header.n_heads "
                              "(%d, offset 12)",
                              name, c->dim, c->n_heads);
    }
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: header.n_heads (%d, offset 12) is not a multiple of "
                              "header.n_kv_heads (%d, offset 16)",
                              name, c->n_heads, c->n_kv_heads);
    }

    /* Float counts, in run.c's memory_map_weights order. */
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t V = (uint64_t)c->vocab_size, S = (uint64_t)c->seq_len;
    uint64_t hs = dim / (uint64_t)c->n_heads;
    uint64_t q_out = (uint64_t)c->n_heads * hs, kv_out = (uint64_t)c->n_kv_heads * hs;
    uint64_t n_emb = 0, n_rms = 0, n_wq = 0, n_wkv = 0, n_wo = 0, n_ffn = 0, n_freq = 0;
    bool ok = mul3(V, dim, 1, &n_emb) && mul3(L, dim, 1, &n_rms) && mul3(L, dim, q_out, &n_wq) &&
              mul3(L, dim, kv_out, &n_wkv) && mul3(L, q_out, dim, &n_wo) &&
              mul3(L, dim, hid, &n_ffn) && mul3(S, hs, 1, &n_freq);
    n_freq /= 2; /* seq_len * head_size / 2 floats each for freq_cis_real and _imag */
    const float *base = (const float *)((const char *)data + L2C_HEADER_BYTES);
    uint64_t off = 0; /* in floats, from the end of the header */
    uint64_t o_emb = 0, o_att, o_wq, o_wk, o_wv, o_wo, o_ffn, o_w1, o_w2, o_w3, o_fin, o_cls;
    ok = ok && add_to(&off, n_emb);
    o_att = off;
    ok = ok && add_to(&off, n_rms);
    o_wq = off;
    ok = ok && add_to(&off, n_wq);
    o_wk = off;
    ok = ok && add_to(&off, n_wkv);
    o_wv = off;
    ok = ok && add_to(&off, n_wkv);
    o_wo = off;
    ok = ok && add_to(&off, n_wo);
    o_ffn = off;
    ok = ok && add_to(&off, n_rms);
    o_w1 = off;
    ok = ok && add_to(&off, n_ffn);
    o_w2 = off;
    ok = ok && add_to(&off, n_ffn);
    o_w3 = off;
    ok = ok && add_to(&off, n_ffn);
    o_fin = off;
    ok = ok && add_to(&off, dim);
    ok = ok && add_to(&off, n_freq) && add_to(&off, n_freq);
    o_cls = off;
    if (!c->shared_classifier) ok = ok && add_to(&off, n_emb);
    uint64_t need_bytes = 0;
    ok = ok && mul3(off, 4, 1, &need_bytes) && add_to(&need_bytes, L2C_HEADER_BYTES);
    if (!ok || need_bytes > size) {
        char nb[48];
        if (ok) {
            snprintf(nb, sizeof nb, "%llu bytes", (unsigned long long)need_bytes);
        } else {
            snprintf(nb, sizeof nb, "more than 2^64 bytes");
        }
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: the header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                              "n_kv_heads %d, vocab_size %d%s, seq_len %d) declares weights "
                              "ending at offset %s, but the file is %zu bytes (truncated or "
                              "corrupt)",
                              name, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                              h[5], c->shared_classifier ? "" : " = separate classifier",
                              c->seq_len, nb, size);
    }
    m->token_embedding = base + o_emb;
    m->rms_att = base + o_att;
    m->wq = base + o_wq;
    m->wk = base + o_wk;
    m->wv = base + o_wv;
    m->wo = base + o_wo;
    m->rms_ffn = base + o_ffn;
    m->w1 = base + o_w1;
    m->w2 = base + o_w2;
    m->w3 = base + o_w3;
    m->rms_final = base + o_fin;
    m->wcls = c->shared_classifier ? m->token_embedding : base + o_cls;
    return KILN_OK;
}

kiln_status kiln_llama2c_open_memory(const void *data, size_t size, const char *name,
                                     kiln_llama2c **out, kiln_error *err) {
    *out = NULL;
    if (!name) name = "<memory>";
    kiln_llama2c *m = calloc(1, sizeof *m);
    if (!m) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    kiln_status s = parse_checkpoint(data, size, name, m, err);
    if (s != KILN_OK) {
        free(m);
        return s;
    }
    *out = m;
    return KILN_OK;
}

kiln_status kiln_llama2c_open(const char *path, kiln_llama2c **out, kiln_error *err) {
    *out = NULL;
    kiln_mapped_file *f = NULL;
    kiln_status s = kiln_mapped_file_open(path, &f, err);
    if (s == KILN_ERR_INVALID_ARGUMENT) {
        return kiln_error_set(err, KILN_ERR_IO, "%s: is a directory, not a llama2.c checkpoint",
                              path);
    }
    if (s != KILN_OK) return s;
    s = kiln_llama2c_open_memory(f->data, f->size, path, out, err);
    if (s != KILN_OK) {
        kiln_mapped_file_close(f);
        return s;
    }
    (*out)->map = f;
    return KILN_OK;
}

void kiln_llama2c_close(kiln_llama2c *m) {
    if (!m) return;
    kiln_mapped_file_close(m->map);
    free(m);
}

void kiln_llama2c_vocab_free(kiln_llama2c_vocab *v) {
    if (!v) return;
    if (v->pieces) {
        for (int32_t i = 0; i < v->n_tokens; i++) free(v->pieces[i]);
    }
    free(v->pieces);
    free(v->scores);
    free(v->lens);
    free(v);
}

kiln_status kiln_llama2c_vocab_read_memory(const void *data, size_t size, const char *name,
                                           int32_t n_tokens, kiln_llama2c_vocab **out,
                                           kiln_error *err) {
    *out = NULL;
    if (!name) name = "<memory>";
    if (n_tokens <= 0) {
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "%s: n_tokens is %d; it must be positive", name, n_tokens);
    }
    const uint8_t *p = data;
    if (!p) size = 0;
    if (size < 4) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: max_token_length at offset 0 needs 4 bytes but the file is %zu "
                              "bytes (truncated)",
                              name, size);
    }
    int32_t max_len;
    memcpy(&max_len, p, 4);
    if (max_len <= 0) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: max_token_length at offset 0 is %d; it must be positive", name,
                              max_len);
    }
    /* Each entry needs at least 8 bytes (score + length): bound n_tokens before allocating. */
    if ((uint64_t)n_tokens > (size - 4) / 8) {
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: %d tokens need at least %llu bytes but the file is %zu bytes "
                              "(truncated, or a tokenizer for a smaller vocabulary)",
                              name, n_tokens, 4 + 8ull * (uint64_t)n_tokens, size);
    }
    kiln_llama2c_vocab *v = calloc(1, sizeof *v);
    if (!v) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    v->max_token_length = max_len;
    v->scores = malloc((size_t)n_tokens * sizeof *v->scores);
    v->lens = malloc((size_t)n_tokens * sizeof *v->lens);
    v->pieces = calloc((size_t)n_tokens, sizeof *v->pieces);
    v->n_tokens = n_tokens; /* pieces are zeroed, so a partial read frees cleanly */
    kiln_status s = KILN_OK;
    if (!v->scores || !v->lens || !v->pieces) {
        s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
        goto fail;
    }
    size_t pos = 4;
    for (int32_t i = 0; i < n_tokens; i++) {
        if (size - pos < 8) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: token %d at offset %zu: score and length need 8 bytes but only "
                               "%zu remain (truncated; file is %zu bytes)",
                               name, i, pos, size - pos, size);
            goto fail;
        }
        int32_t len;
        memcpy(&v->scores[i], p + pos, 4);
        memcpy(&len, p + pos + 4, 4);
        if (len < 0 || len > max_len) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: token %d: length at offset %zu is %d; it must be 0 to "
                               "max_token_length (%d)",
                               name, i, pos + 4, len, max_len);
            goto fail;
        }
        pos += 8;
        if ((size_t)len > size - pos) {
            s = kiln_error_set(err, KILN_ERR_FORMAT,
                               "%s: token %d: %d bytes at offset %zu extend beyond end of file "
                               "(%zu bytes)",
                               name, i, len, pos, size);
            goto fail;
        }
        v->pieces[i] = malloc((size_t)len + 1);
        if (!v->pieces[i]) {
            s = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
            goto fail;
        }
        memcpy(v->pieces[i], p + pos, (size_t)len);
        v->pieces[i][len] = '\0';
        v->lens[i] = (uint32_t)len;
        pos += (size_t)len;
    }
    if (pos != size) {
        s = kiln_error_set(err, KILN_ERR_FORMAT,
                           "%s: %zu bytes follow the %d tokens at offset %zu: the tokenizer holds "
                           "more tokens than the model's vocabulary (or is corrupt)",
                           name, size - pos, n_tokens, pos);
        goto fail;
    }
    *out = v;
    return KILN_OK;
fail:
    kiln_llama2c_vocab_free(v);
    return s;
}

kiln_status kiln_llama2c_vocab_read(const char *path, int32_t n_tokens, kiln_llama2c_vocab **out,
                                    kiln_error *err) {
    *out = NULL;
    kiln_mapped_file *f = NULL;
    kiln_status s = kiln_mapped_file_open(path, &f, err);
    if (s == KILN_ERR_INVALID_ARGUMENT) {
        return kiln_error_set(err, KILN_ERR_IO, "%s: is a directory, not a tokenizer.bin", path);
    }
    if (s != KILN_OK) return s;
    s = kiln_llama2c_vocab_read_memory(f->data, f->size, path, n_tokens, out, err);
    kiln_mapped_file_close(f);
    return s;
}
