/*
 * pretokenize.c - GPT-2 byte-level mapping and the regex pre-tokenizers of llama.cpp,
 * run on PCRE2. See pretokenize.h for the semantics being reproduced.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenize.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/utf8.h"

/* ---- GPT-2 byte-level mapping ------------------------------------------------------------ */

/* Bytes GPT-2 keeps as their own code point: '!'..'~', '¡'..'¬', '®'..'ÿ'. */
static bool bytelevel_is_kept(uint32_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t kiln_bytelevel_cpt(uint8_t b) {
    if (bytelevel_is_kept(b)) return b;
    /* The others are numbered in byte order: 0x00..0x20 (33), 0x7F..0xA0 (34), 0xAD (1). */
    uint32_t n;
    if (b <= 0x20)
        n = b;
    else if (b >= 0x7F && b <= 0xA0)
        n = 33u + (uint32_t)(b - 0x7F);
    else
        n = 67u; /* 0xAD */
    return 256u + n;
}

int kiln_bytelevel_byte(uint32_t cpt) {
    if (cpt <= 0xFF) return bytelevel_is_kept(cpt) ? (int)cpt : -1;
    if (cpt < 256u || cpt > 256u + 67u) return -1;
    uint32_t n = cpt - 256u;
    if (n <= 32u) return (int)n;
    if (n <= 66u) return (int)(0x7Fu + (n - 33u));
    return 0xAD;
}

size_t kiln_bytelevel_encode(const char *in, size_t len, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        /* every mapped code point is below U+0800: one or two bytes */
        o += kiln_utf8_encode(kiln_bytelevel_cpt((uint8_t)in[i]), out + o);
    }
    return o;
}

size_t kiln_bytelevel_decode(const char *piece, size_t len, char *out) {
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        int n = kiln_utf8_decode(piece + i, len - i, &cp);
        if (n <= 0) { /* malformed or truncated: copy the byte through */
            out[o++] = piece[i++];
            continue;
        }
        int b = kiln_bytelevel_byte(cp);
        if (b >= 0) {
            out[o++] = (char)b;
        } else {
            memcpy(out + o, piece + i, (size_t)n);
            o += (size_t)n;
        }
        i += (size_t)n;
    }
    return o;
}

/* ---- spans --------------------------------------------------------------------------------- */

void kiln_spans_free(kiln_spans *s) {
    if (!s) return;
    free(s->data);
    s->data = NULL;
    s->n = s->cap = 0;
}

static bool spans_push(kiln_spans *s, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        kiln_span *d = realloc(s->data, cap * sizeof *d);
        if (!d) return false;
        s->data = d;
        s->cap = cap;
    }
    s->data[s->n].off = off;
    s->data[s->n].len = len;
    s->n++;
    return true;
}

/* ---- pre-tokenizer regex sets (llama.cpp llm_tokenizer_bpe, by pre type) ----------------- */

#define RX_GPT2         "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_LLAMA3                                                                                  \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"   \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                   \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek LLM's cased-letter class, written with PCRE2 \x{...} escapes. */
#define RX_DEEPSEEK_LETTERS                                                                        \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"            \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"         \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-"         \
    "\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"             \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-"       \
    "\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"        \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"         \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"        \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-"       \
    "\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"          \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"         \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"         \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-"        \
    "\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"        \
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"               \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"         \
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
/* CJK ideographs U+4E00..U+9FA5, U+0800..U+4E00, Hangul U+AC00..U+D7FF. */
#define RX_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* " ?[^(\s|.,!?…。，、।۔،)]+" */
#define RX_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
#define RX_TEKKEN_WORDS                                                                            \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"                        \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"

enum { MAX_RX = 6 };

typedef struct pretok_family {
    const char *name;
    bool ignore_merges;
    const char *rx[MAX_RX + 1]; /* NULL-terminated */
} pretok_family;

static const pretok_family families[] = {
    {"default", false, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL}},
    {"llama3", true, {RX_LLAMA3, NULL}},
    {"dbrx", false, {RX_LLAMA3, NULL}},
    {"deepseek-llm",
     false,
     {"[\r\n]", RX_DEEPSEEK_LETTERS,
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", RX_CJK, "\\p{N}+", NULL}},
    {"deepseek-coder", false, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK, "\\p{N}", NULL}},
    {"falcon", false, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]", NULL}},
    {"starcoder", false, {"\\p{N}", RX_GPT2, NULL}},
    {"gpt2", false, {RX_GPT2, NULL}},
    {"qwen2", false, {RX_QWEN2, NULL}},
    {"chameleon",
     false,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", RX_GPT2, NULL}},
    {"poro", false, {RX_PORO, NULL}},
    {"viking", false, {RX_PORO, "\\p{N}", NULL}},
    {"tekken",
     true,
     {RX_TEKKEN_WORDS "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"gpt-4o",
     false,
     {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RX_CONTRACTIONS
      "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RX_CONTRACTIONS
      "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"seed-coder",
     false,
     {RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"bailingmoe",
     false,
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
      NULL}},
};

enum {
    FAM_DEFAULT,
    FAM_LLAMA3,
    FAM_DBRX,
    FAM_DEEPSEEK_LLM,
    FAM_DEEPSEEK_CODER,
    FAM_FALCON,
    FAM_STARCODER,
    FAM_GPT2,
    FAM_QWEN2,
    FAM_CHAMELEON,
    FAM_PORO,
    FAM_VIKING,
    FAM_TEKKEN,
    FAM_GPT4O,
    FAM_SEED_CODER,
    FAM_BAILINGMOE,
    FAM_COUNT
};
_Static_assert(sizeof families / sizeof families[0] == FAM_COUNT, "families table");

/* tokenizer.ggml.pre value -> family, per llama.cpp's llama_vocab::impl::load. */
static const struct {
    const char *pre;
    int family;
} aliases[] = {
    {"default", FAM_DEFAULT},
    {"llama3", FAM_LLAMA3},
    {"llama-v3", FAM_LLAMA3},
    {"llama-bpe", FAM_LLAMA3},
    {"falcon3", FAM_LLAMA3},
    {"falcon-h1", FAM_LLAMA3},
    {"pixtral", FAM_LLAMA3},
    {"midm-2.0", FAM_LLAMA3},
    {"lfm2", FAM_LLAMA3},
    {"dbrx", FAM_DBRX},
    {"smaug-bpe", FAM_DBRX},
    {"chatglm-bpe", FAM_DBRX},
    {"glm4", FAM_DBRX},
    {"deepseek-llm", FAM_DEEPSEEK_LLM},
    {"deepseek-coder", FAM_DEEPSEEK_CODER},
    {"falcon", FAM_FALCON},
    {"starcoder", FAM_STARCODER},
    {"refact", FAM_STARCODER},
    {"command-r", FAM_STARCODER},
    {"smollm", FAM_STARCODER},
    {"codeshell", FAM_STARCODER},
    {"exaone", FAM_STARCODER},
    {"minerva-7b", FAM_STARCODER},
    {"gpt-2", FAM_GPT2},
    {"phi-2", FAM_GPT2},
    {"jina-es", FAM_GPT2},
    {"jina-de", FAM_GPT2},
    {"gigachat", FAM_GPT2},
    {"jina-v1-en", FAM_GPT2},
    {"jina-v2-es", FAM_GPT2},
    {"jina-v2-de", FAM_GPT2},
    {"jina-v2-code", FAM_GPT2},
    {"roberta-bpe", FAM_GPT2},
    {"a.x-4.0", FAM_GPT2},
    {"mellum", FAM_GPT2},
    {"exaone4", FAM_GPT2},
    {"mpt", FAM_GPT2},
    {"olmo", FAM_GPT2},
    {"jais", FAM_GPT2},
    {"trillion", FAM_GPT2},
    {"granite-docling", FAM_GPT2},
    {"qwen2", FAM_QWEN2},
    {"deepseek-r1-qwen", FAM_QWEN2},
    {"kormo", FAM_QWEN2},
    {"stablelm2", FAM_QWEN2},
    {"megrez", FAM_QWEN2},
    {"hunyuan", FAM_QWEN2},
    {"grok-2", FAM_QWEN2},
    {"chameleon", FAM_CHAMELEON},
    {"poro-chat", FAM_PORO},
    {"bloom", FAM_PORO},
    {"gpt3-finnish", FAM_PORO},
    {"viking", FAM_VIKING},
    {"tekken", FAM_TEKKEN},
    {"gpt-4o", FAM_GPT4O},
    {"llama4", FAM_GPT4O},
    {"seed-coder", FAM_SEED_CODER},
    {"bailingmoe", FAM_BAILINGMOE},
    {"bailingmoe2", FAM_BAILINGMOE},
    {"llada-moe", FAM_BAILINGMOE},
};

struct kiln_pretok {
    int family;
    int n_rx;
    pcre2_code *rx[MAX_RX];
};

/*
 * Rewrite \s and \S to ASCII whitespace classes. llama.cpp's std::regex only ever sees ASCII
 * whitespace (it turns every non-ASCII White_Space code point into U+000B first, and we do the
 * same to the subject), whereas PCRE2's \s in UCP mode also matches e.g. U+180E.
 * Returns a malloc'd pattern, or NULL (out of memory, or \S inside a class: unsupported).
 */
static char *rewrite_whitespace(const char *rx) {
    size_t n = strlen(rx);
    char *o = malloc(n * 10 + 1);
    if (!o) return NULL;
    size_t k = 0;
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; i < n; i++) {
        char c = rx[i];
        if (c == '\\' && i + 1 < n) {
            char d = rx[i + 1];
            if (d == 's') {
                const char *r = in_class ? "\\t-\\r " : "[\\t-\\r ]";
                memcpy(o + k, r, strlen(r));
                k += strlen(r);
            } else if (d == 'S') {
                if (in_class) {
                    free(o);
                    return NULL;
                }
                memcpy(o + k, "[^\\t-\\r ]", 9);
                k += 9;
            } else {
                o[k++] = c;
                o[k++] = d;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = i;
        } else if (in_class && c == ']') {
            /* ']' right after '[' or '[^' is a literal */
            bool first = i == class_start + 1 || (i == class_start + 2 && rx[i - 1] == '^');
            if (!first) in_class = false;
        }
        o[k++] = c;
    }
    o[k] = '\0';
    return o;
}

kiln_status kiln_pretok_create(const char *pre, kiln_pretok **out, kiln_error *err) {
    *out = NULL;
    int fam = -1;
    if (!pre || !*pre) {
        fam = FAM_DEFAULT;
    } else {
        for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
            if (strcmp(aliases[i].pre, pre) == 0) {
                fam = aliases[i].family;
                break;
            }
        }
    }
    if (fam < 0)
        return kiln_error_set(err, KILN_ERR_UNSUPPORTED,
                              "unknown BPE pre-tokenizer type (tokenizer.ggml.pre) '%s'", pre);
    kiln_pretok *p = calloc(1, sizeof *p);
    if (!p) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (pre-tokenizer)");
    p->family = fam;
    for (int i = 0; families[fam].rx[i]; i++) {
        char *pat = rewrite_whitespace(families[fam].rx[i]);
        if (!pat) {
            kiln_pretok_destroy(p);
            return kiln_error_set(err, KILN_ERR_INTERNAL,
                                  "pre-tokenizer '%s': cannot rewrite regex %d", families[fam].name,
                                  i);
        }
        int ec;
        PCRE2_SIZE eoff;
        pcre2_code *code =
            pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eoff, NULL);
        free(pat);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            kiln_pretok_destroy(p);
            return kiln_error_set(err, KILN_ERR_INTERNAL,
                                  "pre-tokenizer '%s': regex %d failed to compile at offset "
                                  "%zu: %s",
                                  families[fam].name, i, (size_t)eoff, (const char *)msg);
        }
        (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* optional speed-up */
        p->rx[p->n_rx++] = code;
    }
    *out = p;
    return KILN_OK;
}

void kiln_pretok_destroy(kiln_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_rx; i++) pcre2_code_free(p->rx[i]);
    free(p);
}

const char *kiln_pretok_family(const kiln_pretok *p) {
    return families[p->family].name;
}

const char *const *kiln_pretok_regexes(const kiln_pretok *p, int *n) {
    const char *const *rx = families[p->family].rx;
    int k = 0;
    while (k < MAX_RX && rx[k]) k++;
    *n = k;
    return rx;
}

bool kiln_pretok_ignore_merges(const kiln_pretok *p) {
    return families[p->family].ignore_merges;
}

/* White_Space code points above ASCII (Unicode PropList.txt), which llama.cpp maps to 0x0B. */
static bool is_nonascii_space(uint32_t c) {
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/*
 * Split subject[0..slen) (valid UTF-8) by one regex: every match and every gap between
 * matches becomes a span (offsets shifted by base). Empty matches produce no span; after
 * one, the next attempt at the same position must be non-empty, as std::regex_iterator and
 * Perl do.
 */
static kiln_status split_one(const pcre2_code *re, const char *subject, size_t slen, size_t base,
                             pcre2_match_data *md, kiln_spans *out, kiln_error *err) {
    size_t start = 0, last = 0;
    uint32_t opts = 0;
    while (start <= slen) {
        int rc =
            pcre2_match(re, (PCRE2_SPTR)subject, slen, start, opts | PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)subject, slen, start,
                             opts | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (opts == 0 || start >= slen) break;
            /* no non-empty match where the empty one was: search on from the next character */
            int n = kiln_utf8_seq_len(subject + start, slen - start);
            start += n > 0 ? (size_t)n : 1;
            opts = 0;
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kiln_error_set(err, KILN_ERR_INTERNAL, "pre-tokenizer regex match failed: %s",
                                  (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms < start || me < ms || me > slen) /* only \K could do this; no pattern uses it */
            return kiln_error_set(err, KILN_ERR_INTERNAL, "pre-tokenizer regex: odd match");
        if (ms > last && !spans_push(out, base + last, ms - last)) goto oom;
        if (me > ms && !spans_push(out, base + ms, me - ms)) goto oom;
        last = me;
        start = me;
        opts = me == ms ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
    if (last < slen && !spans_push(out, base + last, slen - last)) goto oom;
    return KILN_OK;
oom:
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (pre-tokenizer spans)");
}

kiln_status kiln_pretok_split(const kiln_pretok *p, const char *text, size_t len, kiln_spans *out,
                              kiln_error *err) {
    out->n = 0;
    if (len == 0) return KILN_OK;

    /* Does the regex subject differ from the text (non-ASCII whitespace, bad bytes)? */
    bool identity = true;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int n = kiln_utf8_decode(text + i, len - i, &cp);
        if (n <= 0 || (n >= 2 && is_nonascii_space(cp))) {
            identity = false;
            break;
        }
        i += (size_t)n;
    }

    kiln_status st = KILN_OK;
    char *subj = NULL;
    size_t *t2o = NULL; /* subject byte offset -> text byte offset, at character starts */
    size_t slen = len;
    kiln_spans a = {0}, b = {0};
    pcre2_match_data *md = NULL;

    if (!identity) {
        subj = malloc(3 * len + 1);
        t2o = malloc((3 * len + 1) * sizeof *t2o);
        if (!subj || !t2o) goto oom;
        size_t k = 0;
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            int n = kiln_utf8_decode(text + i, len - i, &cp);
            t2o[k] = i;
            if (n <= 0) { /* malformed byte: the regexes see U+FFFD */
                memcpy(subj + k, "\xEF\xBF\xBD", 3);
                k += 3;
                i += 1;
            } else if (n >= 2 && is_nonascii_space(cp)) {
                subj[k++] = '\x0B';
                i += (size_t)n;
            } else {
                memcpy(subj + k, text + i, (size_t)n);
                k += (size_t)n;
                i += (size_t)n;
            }
        }
        t2o[k] = len;
        slen = k;
    }
    const char *s = identity ? text : subj;

    md = pcre2_match_data_create(1, NULL);
    if (!md) goto oom;
    if (!spans_push(&a, 0, slen)) goto oom;
    for (int r = 0; r < p->n_rx; r++) {
        b.n = 0;
        for (size_t f = 0; f < a.n; f++) {
            st = split_one(p->rx[r], s + a.data[f].off, a.data[f].len, a.data[f].off, md, &b, err);
            if (st != KILN_OK) goto done;
        }
        kiln_spans t = a;
        a = b;
        b = t;
    }
    for (size_t f = 0; f < a.n; f++) {
        size_t o0 = a.data[f].off, o1 = o0 + a.data[f].len;
        if (!identity) {
            o0 = t2o[o0];
            o1 = t2o[o1];
        }
        if (!spans_push(out, o0, o1 - o0)) goto oom;
    }
    goto done;
oom:
    st = kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "out of memory (pre-tokenizer)");
done:
    pcre2_match_data_free(md);
    kiln_spans_free(&a);
    kiln_spans_free(&b);
    free(subj);
    free(t2o);
    return st;
}
