/*
 * hf_model.c - the tokenizer.json models: BPE with merges (Hugging Face tokenizers
 * models/bpe: merge_word + Word::merge_all, i.e. ranks on id pairs, lowest rank first, ties by
 * position; byte_fallback to "<0xNN>" tokens, unk with fuse_unk, ignore_merges,
 * continuing_subword_prefix, end_of_word_suffix) and WordPiece (models/wordpiece: greedy
 * longest match first, continuing_subword_prefix, max_input_chars_per_word) and WordLevel
 * (models/wordlevel: the whole pre-token, else unk_token).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/hf_internal.h"
#include "util/error.h"

/* Model ids must stay below this, and not be much sparser than the vocab itself. */
enum { HF_MAX_IDS = 1 << 24 };

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

int32_t hf_model_find(const hf_model *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    size_t i = (size_t)hash_bytes(s, n) & m->mask;
    for (;;) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        if (m->tok_len[id] == n && memcmp(m->tok[id], s, n) == 0) return id;
        i = (i + 1) & m->mask;
    }
}

/* Insert id (text already in m->tok[id]); false when the text is already present. */
static bool vocab_insert(hf_model *m, int32_t id) {
    const char *s = m->tok[id];
    size_t n = m->tok_len[id];
    size_t i = (size_t)hash_bytes(s, n) & m->mask;
    for (;;) {
        int32_t o = m->slots[i];
        if (o < 0) {
            m->slots[i] = id;
            return true;
        }
        if (m->tok_len[o] == n && memcmp(m->tok[o], s, n) == 0) return false;
        i = (i + 1) & m->mask;
    }
}

static bool merge_get(const hf_merge_map *mm, int32_t a, int32_t b, uint32_t *rank,
                      int32_t *new_id) {
    if (!mm->keys) return false;
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = (size_t)hash_u64(k) & mm->mask;
    for (;;) {
        uint64_t o = mm->keys[i];
        if (!o) return false;
        if (o == k) {
            *rank = mm->rank[i];
            *new_id = mm->new_id[i];
            return true;
        }
        i = (i + 1) & mm->mask;
    }
}

/* Insert or overwrite (a later duplicate merge replaces the earlier one, as HF's HashMap). */
static void merge_put(hf_merge_map *mm, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = (size_t)hash_u64(k) & mm->mask;
    while (mm->keys[i] && mm->keys[i] != k) i = (i + 1) & mm->mask;
    if (!mm->keys[i]) mm->n++;
    mm->keys[i] = k;
    mm->rank[i] = rank;
    mm->new_id[i] = new_id;
}

void hf_model_free(hf_model *m) {
    if (!m) return;
    if (m->tok)
        for (int32_t i = 0; i < m->n_ids; i++) free(m->tok[i]);
    free(m->tok);
    free(m->tok_len);
    free(m->slots);
    free(m->unk);
    free(m->prefix);
    free(m->suffix);
    free(m->merges.keys);
    free(m->merges.rank);
    free(m->merges.new_id);
    memset(m, 0, sizeof *m);
}

static kiln_status oom(kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (tokenizer model)");
}

static kiln_status opt_strdup(const json_t *j, const char *key, const hf_where *w, char **out,
                              kiln_error *err) {
    const char *s = NULL;
    size_t n = 0;
    kiln_status st = hf_get_str(j, key, w, &s, &n, err);
    if (st || !s) return st;
    if (!(*out = hf_strndup(s, n))) return oom(err);
    return KILN_OK;
}

static kiln_status parse_vocab(const json_t *j, const hf_where *w, hf_model *m, kiln_error *err) {
    hf_where wv;
    hf_where_sub(&wv, w, "vocab");
    json_t *voc = json_object_get(j, "vocab");
    if (!json_is_object(voc)) return hf_err_type(err, &wv, "an object {token: id}");
    size_t count = json_object_size(voc);
    int64_t max_id = -1;
    for (void *it = json_object_iter(voc); it; it = json_object_iter_next(voc, it)) {
        json_t *v = json_object_iter_value(it);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= HF_MAX_IDS) {
            hf_where wk;
            hf_where_sub(&wk, &wv, json_object_iter_key(it));
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s must be an integer id in [0, %d)",
                                  wk.file, wk.path, HF_MAX_IDS);
        }
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    if ((uint64_t)(max_id + 1) > 4 * (uint64_t)count + 65536)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "%s: %s: ids go up to %lld for %zu tokens (too sparse)", wv.file,
                              wv.path, (long long)max_id, count);
    m->n_ids = (int32_t)(max_id + 1);
    size_t cap = 16;
    while (cap < 2 * count) cap *= 2;
    m->tok = calloc((size_t)m->n_ids + 1, sizeof *m->tok);
    m->tok_len = calloc((size_t)m->n_ids + 1, sizeof *m->tok_len);
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->tok || !m->tok_len || !m->slots) return oom(err);
    memset(m->slots, 0xff, cap * sizeof *m->slots);
    m->mask = cap - 1;
    for (void *it = json_object_iter(voc); it; it = json_object_iter_next(voc, it)) {
        const char *key = json_object_iter_key(it);
        size_t klen = json_object_iter_key_len(it);
        int32_t id = (int32_t)json_integer_value(json_object_iter_value(it));
        if (m->tok[id]) {
            hf_where wk;
            hf_where_sub(&wk, &wv, key);
            return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s: id %d is also used by '%s'",
                                  wk.file, wk.path, id, m->tok[id]);
        }
        if (!(m->tok[id] = hf_strndup(key, klen))) return oom(err);
        m->tok_len[id] = (uint32_t)klen;
        if (klen > m->max_tok_len) m->max_tok_len = klen;
        vocab_insert(m, id); /* JSON object keys are unique */
    }
    return KILN_OK;
}

/* Split a legacy "a b" merge: exactly one space. */
static bool split_legacy(const char *s, size_t n, size_t *ll) {
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) return false;
    *ll = (size_t)(sp - s);
    return true;
}

static kiln_status parse_merges(const json_t *j, const hf_where *w, hf_model *m, kiln_error *err) {
    hf_where wm;
    hf_where_sub(&wm, w, "merges");
    json_t *arr = json_object_get(j, "merges");
    if (!arr || json_is_null(arr)) arr = NULL;
    if (arr && !json_is_array(arr)) return hf_err_type(err, &wm, "an array");
    size_t n = arr ? json_array_size(arr) : 0;
    if (n > (size_t)UINT32_MAX / 4) return hf_err_type(err, &wm, "a smaller array");
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    m->merges.keys = calloc(cap, sizeof *m->merges.keys);
    m->merges.rank = malloc(cap * sizeof *m->merges.rank);
    m->merges.new_id = malloc(cap * sizeof *m->merges.new_id);
    if (!m->merges.keys || !m->merges.rank || !m->merges.new_id) return oom(err);
    m->merges.mask = cap - 1;
    size_t plen = m->prefix ? strlen(m->prefix) : 0;
    hf_buf cat = {0};
    uint32_t rank = 0;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i);
        hf_where wi;
        hf_where_idx(&wi, &wm, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(e)) {
            const char *s = json_string_value(e);
            size_t sl = json_string_length(e);
            if (sl >= 8 && !memcmp(s, "#version", 8)) continue;
            if (!split_legacy(s, sl, &al)) {
                st = kiln_error_set(err, KILN_ERR_FORMAT,
                                    "%s: %s: '%s' is not two tokens separated by one space",
                                    wi.file, wi.path, s);
                goto done;
            }
            a = s;
            b = s + al + 1;
            bl = sl - al - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bl = json_string_length(json_array_get(e, 1));
        } else {
            st = hf_err_type(err, &wi, "a string \"a b\" or a pair [\"a\", \"b\"]");
            goto done;
        }
        int32_t ia = hf_model_find(m, a, al), ib = hf_model_find(m, b, bl);
        if (ia < 0 || ib < 0) {
            st = kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s: token '%.*s' is not in the vocab",
                                wi.file, wi.path, ia < 0 ? (int)al : (int)bl, ia < 0 ? a : b);
            goto done;
        }
        if (bl < plen) {
            st = kiln_error_set(err, KILN_ERR_FORMAT,
                                "%s: %s: '%.*s' is shorter than continuing_subword_prefix", wi.file,
                                wi.path, (int)bl, b);
            goto done;
        }
        cat.n = 0;
        if (!hf_buf_put(&cat, a, al) || !hf_buf_put(&cat, b + plen, bl - plen)) {
            st = oom(err);
            goto done;
        }
        int32_t inew = hf_model_find(m, cat.p, cat.n);
        if (inew < 0) {
            st = kiln_error_set(err, KILN_ERR_FORMAT,
                                "%s: %s: the merged token '%s' is not in the vocab", wi.file,
                                wi.path, cat.p);
            goto done;
        }
        merge_put(&m->merges, ia, ib, rank++, inew);
    }
done:
    hf_buf_free(&cat);
    return st;
}

kiln_status hf_model_parse(const json_t *j, const hf_where *w, hf_model *m, kiln_error *err) {
    memset(m, 0, sizeof *m);
    for (int b = 0; b < 256; b++) m->byte_ids[b] = -1;
    m->unk_id = -1;
    if (!json_is_object(j)) return hf_err_type(err, w, "an object");
    const char *type = NULL;
    json_t *jt = json_object_get(j, "type");
    kiln_status st;
    if (jt) {
        if ((st = hf_get_type(j, w, &type, err))) return st;
    } else if (json_object_get(j, "merges")) {
        type = "BPE"; /* tokenizers accepts an untagged BPE */
    } else {
        return kiln_error_set(err, KILN_ERR_FORMAT, "%s: %s has no \"type\"", w->file, w->path);
    }
    if (!strcmp(type, "BPE")) {
        m->kind = HF_MODEL_BPE;
    } else if (!strcmp(type, "WordPiece")) {
        m->kind = HF_MODEL_WORDPIECE;
    } else if (!strcmp(type, "WordLevel")) {
        m->kind = HF_MODEL_WORDLEVEL;
    } else {
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "%s: %s.type '%s' is not supported (BPE, WordPiece, WordLevel are)",
                              w->file, w->path, type);
    }
    if ((st = parse_vocab(j, w, m, err))) goto fail;
    if ((st = opt_strdup(j, "unk_token", w, &m->unk, err))) goto fail;
    if ((st = opt_strdup(j, "continuing_subword_prefix", w, &m->prefix, err))) goto fail;
    if (m->unk) m->unk_id = hf_model_find(m, m->unk, strlen(m->unk));
    if (m->kind == HF_MODEL_WORDLEVEL) {
        if (!m->unk && !(m->unk = hf_strndup("<unk>", 5))) goto nomem;
        m->unk_id = hf_model_find(m, m->unk, strlen(m->unk));
        return KILN_OK;
    }
    if (m->kind == HF_MODEL_WORDPIECE) {
        if (!m->prefix && !(m->prefix = hf_strndup("##", 2))) goto nomem;
        m->max_chars = 100;
        if ((st = hf_get_uint(j, "max_input_chars_per_word", w, UINT32_MAX, &m->max_chars, err)))
            goto fail;
        if (!m->unk && !(m->unk = hf_strndup("[UNK]", 5))) goto nomem;
        m->unk_id = hf_model_find(m, m->unk, strlen(m->unk));
        return KILN_OK;
    }
    if ((st = opt_strdup(j, "end_of_word_suffix", w, &m->suffix, err))) goto fail;
    if ((st = hf_get_bool(j, "fuse_unk", w, &m->fuse_unk, err))) goto fail;
    if ((st = hf_get_bool(j, "byte_fallback", w, &m->byte_fallback, err))) goto fail;
    if ((st = hf_get_bool(j, "ignore_merges", w, &m->ignore_merges, err))) goto fail;
    json_t *dr = json_object_get(j, "dropout");
    if (dr && !json_is_null(dr) && !json_is_number(dr)) {
        hf_where wd;
        hf_where_sub(&wd, w, "dropout");
        st = hf_err_type(err, &wd, "a number or null");
        goto fail;
    }
    for (int b = 0; b < 256; b++) {
        char buf[8];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        m->byte_ids[b] = hf_model_find(m, buf, 6);
    }
    if ((st = parse_merges(j, w, m, err))) goto fail;
    return KILN_OK;
nomem:
    st = oom(err);
fail:
    hf_model_free(m);
    return st;
}

/* ---- BPE ----------------------------------------------------------------------------------- */

typedef struct sym {
    int32_t c;
    int32_t prev, next;
    uint32_t len;
} sym;

typedef struct qent {
    uint32_t rank;
    int32_t pos, new_id;
} qent;

static bool q_less(const qent *a, const qent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

typedef struct bpe_work {
    sym *s;
    qent *q;
    size_t n, qn, cap, qcap;
    hf_buf tmp;
} bpe_work;

/* hf_model_work <-> bpe_work (the public struct keeps the element types private) */
static bpe_work work_in(hf_model_work *w) {
    return (bpe_work){w->syms, w->queue, 0, 0, w->cap_syms, w->cap_queue, w->tmp};
}

static void work_out(hf_model_work *w, const bpe_work *b) {
    w->syms = b->s;
    w->queue = b->q;
    w->cap_syms = b->cap;
    w->cap_queue = b->qcap;
    w->tmp = b->tmp;
}

void hf_model_work_free(hf_model_work *w) {
    free(w->syms);
    free(w->queue);
    hf_buf_free(&w->tmp);
    memset(w, 0, sizeof *w);
}

static bool q_push(bpe_work *w, qent e) {
    if (w->qn == w->qcap) {
        size_t cap = w->qcap ? w->qcap * 2 : 64;
        qent *q = realloc(w->q, cap * sizeof *q);
        if (!q) return false;
        w->q = q;
        w->qcap = cap;
    }
    size_t i = w->qn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!q_less(&e, &w->q[p])) break;
        w->q[i] = w->q[p];
        i = p;
    }
    w->q[i] = e;
    return true;
}

static qent q_pop(bpe_work *w) {
    qent top = w->q[0], last = w->q[--w->qn];
    size_t i = 0, n = w->qn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && q_less(&w->q[c + 1], &w->q[c])) c++;
        if (!q_less(&w->q[c], &last)) break;
        w->q[i] = w->q[c];
        i = c;
    }
    if (n) w->q[i] = last;
    return top;
}

static bool sym_add(bpe_work *w, int32_t c, uint32_t len) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 32;
        sym *s = realloc(w->s, cap * sizeof *s);
        if (!s) return false;
        w->s = s;
        w->cap = cap;
    }
    int32_t i = (int32_t)w->n;
    w->s[w->n++] = (sym){c, i - 1, -1, len};
    if (i > 0) w->s[i - 1].next = i;
    return true;
}

static kiln_status unk_missing(const hf_model *m, kiln_error *err) {
    return kiln_error_set(err, KILN_ERR_FORMAT,
                          "tokenizer.json: model.unk_token '%s' is not in model.vocab", m->unk);
}

static kiln_status bpe_encode(const hf_model *m, const char *wd, size_t n, kiln_ivec *out,
                              bpe_work *w, kiln_error *err) {
    if (m->ignore_merges) {
        int32_t id = hf_model_find(m, wd, n);
        if (id >= 0) return kiln_ivec_push(out, id) ? oom(err) : KILN_OK;
    }
    w->n = 0;
    w->qn = 0;
    int32_t unk_c = -1;
    uint32_t unk_len = 0;
    bool have_unk = false;
    size_t plen = m->prefix ? strlen(m->prefix) : 0, slen = m->suffix ? strlen(m->suffix) : 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = hf_utf8_next(wd, n, i, &cp);
        bool first = i == 0, last = i + cl >= n;
        const char *s = wd + i;
        size_t sl = cl;
        if ((!first && plen) || (last && slen)) {
            w->tmp.n = 0;
            if ((!first && plen && !hf_buf_put(&w->tmp, m->prefix, plen)) ||
                !hf_buf_put(&w->tmp, wd + i, cl) ||
                (last && slen && !hf_buf_put(&w->tmp, m->suffix, slen)))
                return oom(err);
            s = w->tmp.p;
            sl = w->tmp.n;
        }
        int32_t id = hf_model_find(m, s, sl);
        if (id >= 0) {
            if (have_unk && !sym_add(w, unk_c, unk_len)) return oom(err);
            have_unk = false;
            if (!sym_add(w, id, (uint32_t)cl)) return oom(err);
        } else {
            bool done = false;
            if (m->byte_fallback) {
                bool all = true;
                for (size_t k = 0; k < sl && all; k++) all = m->byte_ids[(uint8_t)s[k]] >= 0;
                if (all) {
                    for (size_t k = 0; k < sl; k++)
                        if (!sym_add(w, m->byte_ids[(uint8_t)s[k]], 1)) return oom(err);
                    done = true;
                }
            }
            if (!done && m->unk) {
                if (m->unk_id < 0) return unk_missing(m, err);
                if (have_unk && m->fuse_unk) {
                    unk_len += (uint32_t)cl;
                } else {
                    if (have_unk && !sym_add(w, unk_c, unk_len)) return oom(err);
                    unk_c = m->unk_id;
                    unk_len = (uint32_t)cl;
                    have_unk = true;
                }
            }
        }
        i += cl;
    }
    if (have_unk && !sym_add(w, unk_c, unk_len)) return oom(err);

    /* Word::merge_all */
    for (size_t i = 0; i + 1 < w->n; i++) {
        uint32_t rank;
        int32_t nid;
        if (merge_get(&m->merges, w->s[i].c, w->s[i + 1].c, &rank, &nid) &&
            !q_push(w, (qent){rank, (int32_t)i, nid}))
            return oom(err);
    }
    while (w->qn) {
        qent top = q_pop(w);
        sym *cur = &w->s[top.pos];
        if (cur->len == 0 || cur->next == -1) continue;
        int32_t next_pos = cur->next;
        sym right = w->s[next_pos];
        uint32_t rank;
        int32_t nid;
        if (!merge_get(&m->merges, cur->c, right.c, &rank, &nid) || nid != top.new_id) continue;
        cur->c = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        w->s[next_pos].len = 0;
        if (right.next >= 0) w->s[right.next].prev = top.pos;
        if (cur->prev >= 0) {
            const sym *p = &w->s[cur->prev];
            if (merge_get(&m->merges, p->c, cur->c, &rank, &nid) &&
                !q_push(w, (qent){rank, cur->prev, nid}))
                return oom(err);
        }
        cur = &w->s[top.pos];
        if (cur->next >= 0) {
            const sym *nx = &w->s[cur->next];
            if (merge_get(&m->merges, cur->c, nx->c, &rank, &nid) &&
                !q_push(w, (qent){rank, top.pos, nid}))
                return oom(err);
        }
    }
    for (size_t i = 0; i < w->n; i++)
        if (w->s[i].len && kiln_ivec_push(out, w->s[i].c)) return oom(err);
    return KILN_OK;
}

/* ---- WordPiece ----------------------------------------------------------------------------- */

static kiln_status wp_encode(const hf_model *m, const char *wd, size_t n, kiln_ivec *out,
                             bpe_work *w, kiln_error *err) {
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)wd[i] & 0xC0) != 0x80;
    size_t n0 = out->n;
    if (chars <= m->max_chars) {
        size_t plen = strlen(m->prefix);
        bool bad = false;
        for (size_t start = 0; start < n && !bad;) {
            size_t end = n;
            int32_t cur = -1;
            while (start < end) {
                w->tmp.n = 0;
                if ((start > 0 && !hf_buf_put(&w->tmp, m->prefix, plen)) ||
                    !hf_buf_put(&w->tmp, wd + start, end - start))
                    return oom(err);
                cur = hf_model_find(m, w->tmp.p, w->tmp.n);
                if (cur >= 0) break;
                do end--; /* back one character */
                while (end > start && ((unsigned char)wd[end] & 0xC0) == 0x80);
            }
            if (cur < 0) {
                bad = true;
                break;
            }
            if (kiln_ivec_push(out, cur)) return oom(err);
            start = end;
        }
        if (!bad) return KILN_OK;
        out->n = n0;
    }
    if (m->unk_id < 0)
        return kiln_error_set(err, KILN_ERR_FORMAT,
                              "tokenizer.json: WordPiece unk_token '%s' is not in model.vocab",
                              m->unk);
    return kiln_ivec_push(out, m->unk_id) ? oom(err) : KILN_OK;
}

kiln_status hf_model_encode(const hf_model *m, const char *s, size_t n, kiln_ivec *out,
                            hf_model_work *work, kiln_error *err) {
    if (n == 0) return KILN_OK;
    if (m->kind == HF_MODEL_WORDLEVEL) {
        int32_t id = hf_model_find(m, s, n);
        if (id < 0) id = m->unk_id;
        if (id < 0)
            return kiln_error_set(err, KILN_ERR_FORMAT,
                                  "tokenizer.json: WordLevel unk_token '%s' is not in model.vocab",
                                  m->unk);
        return kiln_ivec_push(out, id) ? oom(err) : KILN_OK;
    }
    bpe_work w = work_in(work);
    kiln_status st = m->kind == HF_MODEL_WORDPIECE ? wp_encode(m, s, n, out, &w, err)
                                                   : bpe_encode(m, s, n, out, &w, err);
    work_out(work, &w);
    return st;
}
