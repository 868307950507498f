/*
 * grammar.h - the grammar layer (DESIGN.md "Layers": src/grammar, above the tokenizer, below
 * the engine): structured output. Everything a client may constrain generation with (GBNF,
 * a regex, a JSON schema, a choice list, "any JSON object") is compiled to one IR, a
 * context-free grammar over BYTES, and recognised by an incremental pushdown recognizer.
 *
 * Pipeline:
 *   JSON schema --(schema.c)--> GBNF text --+
 *   regex       --(regex.c)---> GBNF text --+--(gbnf.c)--> code-point grammar (builder)
 *   choice list --(grammar_api.c)-> GBNF ---+          --(compile.c)--> byte grammar (kiln_grammar)
 * The byte grammar is recognised by kiln_gmatch (matcher.c): a set of parse stacks, each a
 * hash-consed linked list (node = the next element to match, its continuation), advanced
 * byte by byte, with the sets interned as states and their transitions cached (a lazily
 * built DFA over stack sets). Token masks (vocab_trie.c) walk a trie of the vocabulary's
 * token bytes with those transitions.
 *
 * Semantics follow llama.cpp's GBNF (grammars/README.md: rules, alternatives, groups, ? * +
 * {m,n}, character classes, literals, comments; characters are Unicode code points, matched
 * here as their UTF-8 bytes) and llama.cpp's grammar sampler in spirit (a set of stacks).
 */
#ifndef KILN_GRAMMAR_GRAMMAR_H
#define KILN_GRAMMAR_GRAMMAR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

/* ---- the code-point grammar under construction (builder.c) ----------------------------- */

typedef enum kg_item_kind { KG_ITEM_CSET = 0, KG_ITEM_REF = 1 } kg_item_kind;

typedef struct kg_item {
    uint8_t kind;
    int32_t id; /* CSET: index into csets; REF: rule index */
} kg_item;

typedef struct kg_seq {
    kg_item *it;
    int32_t n, cap;
} kg_seq;

typedef struct kg_rule {
    char *name;
    kg_seq *alts;
    int32_t n_alts, cap_alts;
    bool defined;
    int32_t ref_line, ref_col; /* where it was first referenced (undefined-rule errors) */
} kg_rule;

/* A set of code points: sorted, disjoint, non-adjacent [lo, hi] pairs. */
typedef struct kg_cset {
    uint32_t *r; /* [2 * n] */
    int32_t n;
} kg_cset;

typedef struct kg_builder {
    kg_rule *rules;
    int32_t n_rules, cap_rules;
    kg_cset *csets;
    int32_t n_csets, cap_csets;
    int64_t size; /* items in all, bounded (KG_MAX_ITEMS) */
} kg_builder;

/** Most items (rule elements) a grammar may have after repetitions are expanded. */
#define KG_MAX_ITEMS (1 << 20)
/** Largest bound of a {m,n} repetition. */
#define KG_MAX_REPEAT 10000

void kg_builder_free(kg_builder *b);
/** The rule named name[0..len) (created, undefined, when new); -1 on allocation failure. */
int32_t kg_rule_get(kg_builder *b, const char *name, size_t len);
/** A new anonymous rule named after base ("base-N"); -1 on allocation failure. */
int32_t kg_rule_new(kg_builder *b, const char *base);
/** Append an empty alternative to rule r; returns it or NULL (out of memory). */
kg_seq *kg_alt_add(kg_builder *b, int32_t r);
/** Append an item; false on out of memory or when the grammar grows past KG_MAX_ITEMS. */
bool kg_seq_push(kg_builder *b, kg_seq *s, kg_item it);
/** Intern a code-point set from ranges[0..2n) (any order, overlapping allowed), complemented
 *  over [0, 0x10FFFF] when negate; returns its index or -1 (out of memory). */
int32_t kg_cset_add(kg_builder *b, const uint32_t *ranges, int32_t n, bool negate);

/* ---- the byte grammar (compile.c) ------------------------------------------------------- */

typedef enum kg_elem_type { KG_END = 0, KG_BYTES = 1, KG_REF = 2 } kg_elem_type;

typedef struct kg_elem {
    int32_t type; /* kg_elem_type */
    int32_t arg;  /* BYTES: index of its 256-bit set; REF: rule; END: rule */
} kg_elem;

/** A compiled grammar: immutable once built, shared by reference (atomic count). */
struct kiln_grammar {
    atomic_int refs;
    kg_elem *el; /* every alternative's elements, each alternative ended by KG_END */
    int32_t n_el;
    uint64_t (*sets)[4]; /* byte sets: bit b of set s = sets[s][b >> 6] >> (b & 63) & 1 */
    int32_t n_sets;
    int32_t *rule_first; /* [n_rules]: index into alt_start */
    int32_t *rule_n;     /* [n_rules]: its alternatives */
    int32_t *alt_start;  /* element index of each alternative's first element */
    int32_t n_rules, n_alts;
    int32_t root;
    char *gbnf;          /* the GBNF text it was compiled from (owned) */
    char *kind;          /* what it came from: "gbnf", "json_schema", "regex", "choice", ... */
};

/**
 * Parse GBNF text (llama.cpp's syntax) into b. Errors (KILN_ERR_INVALID_ARGUMENT):
 * "line L, column C: <problem>" for syntax errors; an undefined rule (named, with where it was
 * referenced); a missing root; a rule defined twice; a repetition over KG_MAX_REPEAT.
 */
kiln_status kg_parse_gbnf(const char *text, size_t len, kg_builder *b, int32_t *root,
                          kiln_error *err);

/**
 * Compile b (root rule `root`) into a byte grammar: character sets become UTF-8 byte
 * sequences (code points outside [0, 0x10FFFF] and surrogates are never produced), and the
 * grammar is checked for left recursion (a rule that can reach itself before consuming a
 * byte: the recognizer would loop; llama.cpp refuses it too). Errors: KILN_ERR_INVALID_ARGUMENT
 * ("rule 'x' is left-recursive"), KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kg_compile(const kg_builder *b, int32_t root, kiln_grammar **out, kiln_error *err);

/** Compile GBNF text all the way (kg_parse_gbnf + kg_compile); kind is stored ("gbnf"...). */
kiln_status kg_from_gbnf(const char *text, size_t len, const char *kind, kiln_grammar **out,
                         kiln_error *err);

/**
 * Translate a regular expression (the subset README.md lists: literals and escapes, classes
 * [...] [^...] with ranges, \d \w \s \D \W \S, ., * + ? {m} {m,} {m,n} and their lazy forms,
 * |, groups (...) (?:...), anchors ^ $ only at the ends; the whole output must match) into
 * GBNF rules appended to *out as rule `name`. json_string: the regex constrains the content
 * of a JSON string, so '"' and '\' are written escaped, control characters never occur.
 * Errors: KILN_ERR_INVALID_ARGUMENT naming the construct and its offset ("regex: position 3:
 * backreferences are not supported"), KILN_ERR_OUT_OF_MEMORY.
 */
typedef struct kg_text {
    char *p;
    size_t n, cap;
} kg_text;
bool kg_text_add(kg_text *t, const char *s, size_t n);
bool kg_text_addf(kg_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kg_text_free(kg_text *t);
kiln_status kg_regex_to_gbnf(const char *re, size_t len, const char *name, bool json_string,
                             kg_text *out, kiln_error *err);

/**
 * Translate a JSON schema (JSON text) into GBNF with rule root (schema.c gives the keyword
 * set and the choices: compact JSON with an optional space after ':' and ',', properties in
 * the schema's order). Errors: KILN_ERR_INVALID_ARGUMENT ("json_schema: at /properties/a:
 * keyword 'multipleOf' is not supported", a JSON syntax error with line and column),
 * KILN_ERR_OUT_OF_MEMORY.
 */
kiln_status kg_schema_to_gbnf(const char *schema, size_t len, kg_text *out, kiln_error *err);
/** The same with every rule name prefixed (the start rule is "<prefix>root"), so the rules
 *  can be pasted into a larger grammar. */
kiln_status kg_schema_to_gbnf_prefixed(const char *schema, size_t len, const char *prefix,
                                       kg_text *out, kiln_error *err);

/* ---- the recognizer (matcher.c) --------------------------------------------------------- */

/**
 * Where a generation stands in a grammar: interned parse stacks and their sets (states), the
 * byte transitions found so far, and the current state. One per request; not thread-safe.
 * States are ids >= 0; KG_DEAD (-1) is the empty set (no stack survives).
 */
typedef struct kiln_gmatch kiln_gmatch;
#define KG_DEAD (-1)

/** Start matching g (a reference is taken). Errors: KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_gmatch_create(kiln_grammar *g, kiln_gmatch **out, kiln_error *err);
void kiln_gmatch_destroy(kiln_gmatch *m);
/** The current state. */
int32_t kiln_gmatch_state(const kiln_gmatch *m);
/** The state after byte b from state s (KG_DEAD: b is not allowed there). Computed once per
 *  (s, b) and cached. A state-count overflow also gives KG_DEAD and sets the overflow flag. */
int32_t kiln_gmatch_next(kiln_gmatch *m, int32_t s, uint8_t b);
/** Whether state s has a stack that is empty: the text so far is a complete sentence. */
bool kiln_gmatch_accepting(const kiln_gmatch *m, int32_t s);
/** Whether some byte continues s (all 256 transitions computed and cached). */
bool kiln_gmatch_can_continue(kiln_gmatch *m, int32_t s);
/** The only byte that continues s, or -1 when none or several do (cached). */
int32_t kiln_gmatch_only_byte(kiln_gmatch *m, int32_t s);
/** Advance the current state over bytes[0..n); false (state unchanged) if they are rejected. */
bool kiln_gmatch_advance(kiln_gmatch *m, const uint8_t *bytes, size_t n);
/** Whether the state tables outgrew their limits (the request should fail). */
bool kiln_gmatch_overflowed(const kiln_gmatch *m);
/** States interned so far (benchmarks, tests). */
int32_t kiln_gmatch_n_states(const kiln_gmatch *m);

/* Per-state cached token masks (vocab_trie.c keeps them here). */
uint32_t *kiln_gmatch_mask_cache(kiln_gmatch *m, int32_t s, int32_t words, bool create,
                                 bool *fresh);

/* ---- token masks over a vocabulary trie (vocab_trie.c) ---------------------------------- */

/** A trie of the vocabulary's token byte strings, in preorder with subtree-skip links;
 *  immutable, shared by every request of an engine. Tokens with empty bytes (control tokens)
 *  are not in it. */
typedef struct kiln_vocab_trie kiln_vocab_trie;

/** Build from pieces: piece(user, id, buf, cap) returns token id's byte length (writing at
 *  most cap bytes), as kiln_model_token_piece. Errors: KILN_ERR_OUT_OF_MEMORY. */
kiln_status kiln_vocab_trie_create(int32_t n_vocab,
                                   size_t (*piece)(void *user, int32_t id, char *buf, size_t cap),
                                   void *user, kiln_vocab_trie **out, kiln_error *err);
void kiln_vocab_trie_destroy(kiln_vocab_trie *t);
int32_t kiln_vocab_trie_n_nodes(const kiln_vocab_trie *t);
/** The bytes of token id (borrowed; *len = 0 for a control token). */
const uint8_t *kiln_vocab_trie_bytes(const kiln_vocab_trie *t, int32_t id, int32_t *len);

/**
 * The tokens whose bytes, fed to m from state s, leave a live state: bit id of bits[] (n_vocab
 * bits, ceil(n_vocab / 32) words, fully written). Tokens without bytes are never set (the
 * caller decides end-of-generation tokens: kiln_gmatch_accepting). use_cache: remember the
 * mask per state (a state seen again costs a copy). Returns the number of tokens set.
 */
int32_t kiln_gmatch_token_mask(kiln_gmatch *m, const kiln_vocab_trie *t, int32_t s,
                               uint32_t *bits, bool use_cache);

/**
 * Jump-forward: the tokens the grammar forces from the current state. The forced bytes are
 * those of the state's only continuation (while exactly one byte is allowed and the text is
 * not complete, at most 256); they are split greedily into the longest vocabulary tokens, and
 * the last token is kept only when the forced bytes end the grammar (no continuation), so the
 * model still chooses how to tokenize across the boundary. Writes at most cap ids; returns
 * how many. Does not advance m.
 */
int32_t kiln_gmatch_forced_tokens(kiln_gmatch *m, const kiln_vocab_trie *t, int32_t *out,
                                  int32_t cap);

#endif
