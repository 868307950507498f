/*
 * template.h - chat templates: a Jinja subset interpreter with Hugging Face semantics.
 *
 * Hugging Face models ship their prompt format as a Jinja template (`chat_template` in
 * tokenizer_config.json, `tokenizer.chat_template` in GGUF metadata). transformers renders it
 * (transformers/utils/chat_template_utils.py, "Chat templates" in the transformers docs) with
 *
 *     ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 *                                   extensions=[jinja2.ext.loopcontrols])
 *     filters["tojson"] = json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)
 *     globals raise_exception(msg) (fails the render with msg) and strftime_now(fmt)
 *
 * and this module reproduces that environment: the Jinja2 3.1 template language (Jinja2
 * "Template Designer Documentation"), its default Undefined, Python value semantics (truth,
 * str()/repr() printing, arithmetic, comparisons, slicing), the built-in filters and tests, the
 * str/dict/list methods the sandbox allows, and the sandbox itself (mutating methods such as
 * list.append fail, range() is capped at 100000 items).
 *
 * Supported statements: if/elif/else, for (else, `if` filter, tuple targets, `recursive`,
 * loop.* incl. previtem/nextitem/cycle/changed, break/continue), set (expression, tuple,
 * namespace attribute, block form with filters), macro (defaults, varargs, kwargs, caller),
 * call blocks, filter blocks, with, print, raw, and transformers' `generation` block. Not
 * supported (parse error KILN_ERR_UNSUPPORTED): extends, block, include, import, from,
 * autoescape, do. Known approximations: upper/lower/title/capitalize map case for Latin,
 * Greek, Cyrillic and Armenian only; integers are 64-bit (overflow is an error where Python
 * would promote).
 *
 * A parsed template is immutable: any number of threads may render it at once. All
 * render-time values live in one arena freed when the render returns, so failures cannot
 * leak and reference cycles (a namespace holding itself) cannot either.
 *
 * Known differences from Jinja2 (besides the unsupported tags): slicing a literal constant
 * that is not a sequence ({{ 1[1:] }}) is an error here while Jinja2's constant folding
 * makes it undefined; Markup string methods return plain strings; str.format() supports
 * fields and conversions but no format specs; the filters filesizeformat, pprint, random,
 * striptags, urlencode, urlize, wordwrap, xmlattr and the globals lipsum, cycler, joiner are
 * not implemented; generators (map, select, ...) are computed eagerly.
 */
#ifndef KILN_TEMPLATE_H
#define KILN_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A parsed chat template. */
typedef struct kiln_template kiln_template;

/** What went wrong, for callers that need more than the message. */
typedef enum kiln_template_error_kind {
    KILN_TEMPLATE_OK = 0,
    KILN_TEMPLATE_ERR_SYNTAX,      /* the source does not parse (Jinja TemplateSyntaxError) */
    KILN_TEMPLATE_ERR_UNSUPPORTED, /* valid Jinja this interpreter does not implement */
    KILN_TEMPLATE_ERR_RAISED,      /* the template called raise_exception(msg) */
    KILN_TEMPLATE_ERR_UNDEFINED,   /* an undefined value was used (Jinja UndefinedError) */
    KILN_TEMPLATE_ERR_TYPE,        /* Python TypeError/ValueError/ZeroDivisionError... */
    KILN_TEMPLATE_ERR_SECURITY,    /* the sandbox refused (e.g. list.append) */
    KILN_TEMPLATE_ERR_LIMIT,       /* a resource limit was hit (steps, depth, output, memory) */
    KILN_TEMPLATE_ERR_MEMORY,      /* malloc failed */
} kiln_template_error_kind;

/** Details of a failure: kind, 1-based line and column in the template source (0 when
 *  unknown), and the bare message (for KILN_TEMPLATE_ERR_RAISED exactly the template's own
 *  text). */
typedef struct kiln_template_diag {
    kiln_template_error_kind kind;
    int line, column;
    char message[1024];
} kiln_template_diag;

/** Render options. Zero-initialised fields take the defaults given here. */
typedef struct kiln_template_options {
    /* Clock for strftime_now(fmt): broken-down local time (tm_year, tm_mon, tm_mday, tm_hour,
       tm_min, tm_sec are used; the weekday and year day are derived). NULL = the system's
       local time at render. Tests pin it (../shared/templates uses 2026-01-15T09:30:00). */
    const struct tm *now;
    uint64_t max_steps;       /* statements + loop iterations + filter items; 0 = 5,000,000 */
    size_t max_output;        /* bytes of any one output buffer; 0 = 16 MiB */
    size_t max_memory;        /* bytes of render-time values; 0 = 256 MiB */
    int max_depth;            /* nesting of evaluation (macro recursion included); 0 = 1000,
                                 about 250 levels of macro recursion (Python's default
                                 recursion limit allows Jinja2 about 190); rendering at the
                                 default needs about 0.5 MiB of stack (1 MiB with ASan) */
    kiln_template_diag *diag; /* optional out: filled on failure, kind = OK on success */
} kiln_template_options;

/**
 * Parse template source src[0..len) (UTF-8; need not be NUL-terminated) into *out.
 * Lexing follows Jinja2's lexer with trim_blocks and lstrip_blocks on: \r\n and \r become \n,
 * one trailing newline is dropped, `{%-`/`-%}` strip whitespace, `{%+`/`+%}` keep it.
 * Unknown filters and tests are errors here, as Jinja2 reports them at compile time.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL src with len > 0, NULL out, invalid UTF-8),
 * KILN_ERR_FORMAT (syntax error; the message starts "line L, column C: "),
 * KILN_ERR_UNSUPPORTED (extends/include/import/block/...), KILN_ERR_OUT_OF_MEMORY.
 * Nesting deeper than 256 levels is a syntax error (no unbounded recursion).
 */
kiln_status kiln_template_parse(const char *src, size_t len, kiln_template **out, kiln_error *err);

/**
 * Render t with the variables of `context` (a JSON object; NULL = no variables), e.g.
 * {"messages": [...], "tools": [...], "add_generation_prompt": true, "bos_token": "<s>",
 *  "eos_token": "</s>"}. JSON maps to Python as json.loads does (object -> dict in key order,
 * array -> list, integer -> int, real -> float, true/false -> bool, null -> None); keys absent
 * from the object are undefined in the template (transformers itself passes tools=None and
 * documents=None when there are none: callers that want that pass JSON null).
 * On success *out is a malloc'd NUL-terminated UTF-8 string (free() it) of *out_len bytes.
 * opts may be NULL (all defaults).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL t/out/out_len, context not an object, and every
 * template failure: raise_exception - the message is exactly the template's text -, undefined
 * values, type errors, sandbox refusals, exceeded limits; other messages read like Jinja2's,
 * "TypeError: can only concatenate str (not \"dict\") to str (line 12)"),
 * KILN_ERR_OUT_OF_MEMORY. *out is untouched on failure.
 */
kiln_status kiln_template_render(const kiln_template *t, const json_t *context,
                                 const kiln_template_options *opts, char **out, size_t *out_len,
                                 kiln_error *err);

/** Free a template. NULL is a no-op. */
void kiln_template_destroy(kiln_template *t);

/**
 * The ChatML template, for models that ship none (as transformers' former default and
 * llama.cpp's "chatml"): each message as "<|im_start|>{role}\n{content}<|im_end|>\n", then
 * "<|im_start|>assistant\n" when add_generation_prompt is true.
 */
extern const char kiln_template_chatml[];

#ifdef __cplusplus
}
#endif

#endif
