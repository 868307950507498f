/*
 * hf_internal.h - the parts of the tokenizer.json pipeline (hf_tokenizer.h): strings and
 * piece lists, Unicode predicates, patterns, normalizers, pre-tokenizers, models, decoders,
 * added tokens and the pipeline struct itself.
 * Private to src/tokenizer/hf_*.c. Semantics: Hugging Face tokenizers (see each function).
 */
#ifndef KILN_TOKENIZER_HF_INTERNAL_H
#define KILN_TOKENIZER_HF_INTERNAL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/vocab.h"
#include "util/vec.h"

/* ---- byte buffers and piece lists ---------------------------------------------------------- */

typedef struct hf_buf {
    char *p;
    size_t n, cap;
} hf_buf;

bool hf_buf_reserve(hf_buf *b, size_t extra); /* room for n + extra (+1 for a NUL) */
bool hf_buf_put(hf_buf *b, const char *s, size_t n);
void hf_buf_free(hf_buf *b);

/* One string of a pre-tokenized sequence: bytes text.p[off .. off+len). */
typedef struct hf_piece {
    size_t off, len;
    int32_t id;    /* >= 0: an added token, already resolved; -1: text still to tokenize */
    bool at_start; /* starts at offset 0 of the original input (Metaspace prepend "first") */
} hf_piece;

typedef struct hf_pieces {
    hf_buf text;
    hf_piece *a;
    size_t n, cap;
} hf_pieces;

/* Append a copy of s[0..n) as a piece (s must not point into l->text). */
bool hf_pieces_add(hf_pieces *l, const char *s, size_t n, int32_t id, bool at_start);
void hf_pieces_clear(hf_pieces *l);
void hf_pieces_free(hf_pieces *l);

/* ---- Unicode ----------------------------------------------------------------------------- */

/*
 * Decode the character at s[i] (i < n) into *cp; returns its byte length (>= 1). Valid UTF-8
 * is read by kiln_utf8_decode (util/utf8.h). Ill-formed bytes (reachable: decoders such as
 * ByteFallback and ByteLevel make raw bytes) are read laxly, as this pipeline always has: the
 * length from the lead byte's range (below E0: 2, so 80..BF and C0..C1 too; below F0: 3;
 * else 4, F8..FF too), the rest taken unchecked (kiln_utf8_bits); a lead E0..FF with only 2
 * bytes left, or any byte with 1 left, is 1 byte (its value); F0..FF with 3 left reads as a
 * 3-byte sequence. Encoding: kiln_utf8_encode.
 */
size_t hf_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp);
bool hf_is_whitespace(uint32_t cp); /* Unicode White_Space (Rust char::is_whitespace) */
bool hf_is_word(uint32_t cp);       /* Rust regex \w: alphabetic, marks, Nd, Pc, joiners */
bool hf_is_numeric(uint32_t cp);    /* Rust char::is_numeric: Nd, Nl, No */
bool hf_is_punct(uint32_t cp);      /* ASCII punctuation or Unicode P* */

/* ---- JSON helpers ------------------------------------------------------------------------- */

/* Where a JSON value sits, for error messages: "tokenizer.json: pre_tokenizer.pretokenizers[1]". */
typedef struct hf_where {
    const char *file;
    char path[256];
} hf_where;

void hf_where_sub(hf_where *dst, const hf_where *w, const char *key); /* w.key */
void hf_where_idx(hf_where *dst, const hf_where *w, size_t i);        /* w[i] */
kiln_status hf_err_type(kiln_error *err, const hf_where *w, const char *want);
/* Optional members: absent or null leaves *out unchanged; a wrong type is KILN_ERR_FORMAT. */
kiln_status hf_get_bool(const json_t *o, const char *key, const hf_where *w, bool *out,
                        kiln_error *err);
kiln_status hf_get_str(const json_t *o, const char *key, const hf_where *w, const char **s,
                       size_t *n, kiln_error *err);
kiln_status hf_get_uint(const json_t *o, const char *key, const hf_where *w, uint64_t max,
                        uint64_t *out, kiln_error *err);
/* The "type" member of a component object (required). */
kiln_status hf_get_type(const json_t *o, const hf_where *w, const char **type, kiln_error *err);
char *hf_strndup(const char *s, size_t n);

/* ---- patterns (Split, Replace) ------------------------------------------------------------ */

typedef struct hf_pattern {
    char *lit; /* literal String pattern (re == NULL) */
    size_t lit_len;
    pcre2_code *re; /* Regex pattern */
} hf_pattern;

typedef struct hf_match {
    size_t off, len;
    bool is_match;
} hf_match;

typedef struct hf_matches {
    hf_match *a;
    size_t n, cap;
} hf_matches;

/* Compile a regex (UTF, UCP, MULTILINE; JIT when available). KILN_ERR_FORMAT names w. */
kiln_status hf_regex_compile(const char *rx, size_t len, const hf_where *w, pcre2_code **out,
                             kiln_error *err);
/* {"String": s} or {"Regex": r}. */
kiln_status hf_pattern_parse(const json_t *j, const hf_where *w, hf_pattern *p, kiln_error *err);
void hf_pattern_free(hf_pattern *p);
/*
 * HF find_matches: ordered spans covering s[0..n), each flagged match or not; an empty string
 * gives one empty non-match. Regex iteration follows Rust/Oniguruma find_iter: an empty match
 * right where the previous match ended is skipped. out->n is reset first.
 */
kiln_status hf_regex_find(const pcre2_code *re, const char *s, size_t n, hf_matches *out,
                          kiln_error *err);
kiln_status hf_pattern_find(const hf_pattern *p, const char *s, size_t n, hf_matches *out,
                            kiln_error *err);
void hf_matches_free(hf_matches *m);

/* ---- normalizers ------------------------------------------------------------------------ */

typedef struct hf_normalizer hf_normalizer;

/* Parse a normalizer object (not null). */
kiln_status hf_normalizer_parse(const json_t *j, const hf_where *w, hf_normalizer **out,
                                kiln_error *err);
void hf_normalizer_free(hf_normalizer *n);
/*
 * Normalize s[0..n) into out (reset first). *at_start is cleared when leading text of the
 * input is removed (Strip, Replace by "", clean-up), as HF's alignment then no longer starts
 * at the original offset 0.
 */
kiln_status hf_normalize(const hf_normalizer *nz, const char *s, size_t n, hf_buf *out,
                         bool *at_start, kiln_error *err);

/* ---- pre-tokenizers ----------------------------------------------------------------------- */

typedef struct hf_pretok hf_pretok;

kiln_status hf_pretok_parse(const json_t *j, const hf_where *w, hf_pretok **out, kiln_error *err);
void hf_pretok_free(hf_pretok *p);
/* Pre-tokenize every piece of *io (all with id < 0); tmp is scratch. Empty pieces dropped. */
kiln_status hf_pretokenize(const hf_pretok *p, hf_pieces *io, hf_pieces *tmp, kiln_error *err);

/* ---- models -------------------------------------------------------------------------------- */

typedef enum hf_model_kind {
    HF_MODEL_BPE = 1,
    HF_MODEL_WORDPIECE = 2,
    HF_MODEL_WORDLEVEL = 3,
} hf_model_kind;

typedef struct hf_merge_map {
    uint64_t *keys; /* (left id << 32 | right id) + 1; 0 = empty */
    uint32_t *rank;
    int32_t *new_id;
    size_t mask, n;
} hf_merge_map;

typedef struct hf_model {
    hf_model_kind kind;
    int32_t n_ids; /* model ids are in [0, n_ids) */
    char **tok;    /* [n_ids] token texts, NULL for ids the vocab skips */
    uint32_t *tok_len;
    int32_t *slots; /* text -> id hash: id or -1 */
    size_t mask;
    size_t max_tok_len;

    char *unk;      /* unk_token text or NULL */
    int32_t unk_id; /* -1: none, or unk_token not in the vocab (an error when needed) */
    char *prefix;   /* continuing_subword_prefix (BPE, WordPiece) or NULL */
    char *suffix;   /* end_of_word_suffix (BPE) or NULL */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256]; /* "<0xNN>" ids, -1 when absent */
    hf_merge_map merges;
    uint64_t max_chars; /* WordPiece max_input_chars_per_word */
} hf_model;

kiln_status hf_model_parse(const json_t *j, const hf_where *w, hf_model *m, kiln_error *err);
void hf_model_free(hf_model *m);
int32_t hf_model_find(const hf_model *m, const char *s, size_t n);

/* Scratch space for hf_model_encode, reused across words; zero-initialise. */
typedef struct hf_model_work {
    void *syms, *queue;
    size_t n_syms, cap_syms, n_queue, cap_queue;
    hf_buf tmp;
} hf_model_work;
void hf_model_work_free(hf_model_work *w);
/* Tokenize one pre-token s[0..n) and append ids. */
kiln_status hf_model_encode(const hf_model *m, const char *s, size_t n, kiln_ivec *out,
                            hf_model_work *w, kiln_error *err);

/* ---- decoders ---------------------------------------------------------------------------- */

typedef struct hf_decoder hf_decoder;

/* j may be NULL/null: no decoder (tokens joined by " "). */
kiln_status hf_decoder_parse(const json_t *j, const hf_where *w, hf_decoder **out, kiln_error *err);
void hf_decoder_free(hf_decoder *d);
/* Decode one token text in stream state s into out (reset first); advances s. */
bool hf_decode_one(const hf_decoder *d, const char *tok, size_t n, kiln_hf_dstate *s, hf_buf *out,
                   hf_buf *tmp);

/* ---- added tokens (hf_added.c) ----------------------------------------------------------- */

/* One entry of tokenizer.json's added_tokens (AddedToken). */
typedef struct hf_added {
    int32_t id;
    char *content; /* as written */
    size_t len;
    char *norm; /* normalized content (normalized tokens with a normalizer), else NULL */
    size_t norm_len;
    bool single_word, lstrip, rstrip, normalized, special;
} hf_added;

/* Byte trie for leftmost-longest matching; the root is implicit (its children in root[]). */
typedef struct hf_tnode {
    int32_t child, sibling; /* first child, next sibling; -1 none */
    int32_t token;          /* index into kiln_hf.added, or -1 */
    uint8_t byte;
} hf_tnode;

typedef struct hf_trie {
    hf_tnode *nodes;
    size_t n, cap;
    int32_t root[256]; /* children of the root by byte */
    bool empty;
} hf_trie;

/* An empty trie. */
void hf_trie_init(hf_trie *t);
/* Add s[0..n) (n > 0) for added token index tok; a later token with the same text wins.
 * False when out of memory. */
bool hf_trie_add(hf_trie *t, const char *s, size_t n, int32_t tok);
void hf_trie_free(hf_trie *t);
/*
 * AddedVocabulary::find_matches + split_with_indices (added_vocabulary.rs): split s[0..n) into
 * text pieces and the added tokens (indices into added[]) that t finds, leftmost-longest and
 * non-overlapping, honouring single_word, lstrip and rstrip; special tokens only when
 * parse_special. Appends to out; at_start says whether s starts the original input. False when
 * out of memory.
 */
bool hf_added_split(const hf_added *added, const hf_trie *t, const char *s, size_t n, bool at_start,
                    bool parse_special, hf_pieces *out);

/* ---- the pipeline (hf_pipeline.c runs it, hf_tokenizer.c builds it) ------------------------ */

/* A loaded tokenizer.json; kiln_hf_encode, kiln_hf_decode_token, kiln_hf_free use it. */
struct kiln_hf {
    hf_model model;
    hf_normalizer *norm;
    hf_pretok *pretok;
    hf_decoder *dec;
    hf_added *added;
    size_t n_added;
    hf_trie raw, normd;
    kiln_ivec prefix, suffix; /* post-processor ids around the sequence (add_special) */
    const kiln_vocab *v;      /* borrowed: the owning tokenizer's vocab */
    bool *skip;               /* [n_tokens] special tokens (dropped when decoding) */
    bool *unused;             /* [n_tokens] ids nothing names */
    char **dec_text;          /* [n_tokens] decode-text overrides, NULL entries */
    uint32_t *dec_len;
    int32_t n_tokens;
};

#endif
