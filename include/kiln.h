/*
 * kiln.h - the public C API of kiln, an LLM inference engine.
 *
 * Conventions (see DESIGN.md):
 *   - Every fallible call returns a kiln_status and, when `err` is non-NULL, fills
 *     err->message with a sentence a person can act on.
 *   - Objects have one owner and a _create/_destroy (or _load/_free) pair;
 *     _destroy(NULL) is a no-op.
 *
 * The serving API (DESIGN.md "One request, end to end"):
 *
 *     kiln_model *m;   kiln_model_load("model.gguf", NULL, &m, &err);
 *     kiln_engine *e;  kiln_engine_create(m, NULL, &e, &err);      // starts the engine thread
 *     kiln_request r = kiln_request_defaults();
 *     r.prompt = "Once upon a time";  r.max_tokens = 64;
 *     kiln_stream *s;  kiln_engine_submit(e, &r, &s, &err);         // any thread
 *     kiln_event ev;
 *     do { kiln_stream_next(s, -1, &ev, &err); ... } while (ev.type != KILN_EVENT_FINISH);
 *     kiln_stream_destroy(s);  kiln_engine_destroy(e);  kiln_model_free(m);
 *
 * The engine batches every running request into one forward per step (continuous batching
 * over a paged KV cache, as vLLM, Kwon et al. 2023). A request's tokens and logits do not
 * depend on what else runs (DESIGN.md principle 3, batch invariance).
 */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION "0.1.0"

/* The symbols libkiln.so exports: the functions declared here, nothing else (the library
 * is built with hidden visibility). */
#if defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

/** Result of every fallible kiln call. KILN_OK is 0; all errors are non-zero. */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARGUMENT,    /* a caller-supplied value is out of range or malformed */
    KILN_ERR_IO,                  /* open/read/write/mmap failed */
    KILN_ERR_FORMAT,              /* a file is corrupt, truncated or inconsistent */
    KILN_ERR_UNSUPPORTED,         /* well-formed, but kiln does not implement it */
    KILN_ERR_OUT_OF_MEMORY,       /* an allocation failed */
    KILN_ERR_NOT_FOUND,           /* a named key, tensor or file does not exist */
    KILN_ERR_CANCELLED,           /* the operation was cancelled */
    KILN_ERR_INTERNAL,            /* a broken invariant inside kiln: a bug */
    KILN_ERR_CONTEXT_OVER_BUDGET, /* a request's prompt + max_tokens can never fit: not in the
                                     context window, or not in the whole KV pool */
    KILN_ERR_QUEUE_FULL,          /* the engine's queue holds max_queue requests; retry later */
} kiln_status;

/** Human-readable error filled by fallible calls. `message` is NUL-terminated. */
typedef struct kiln_error {
    kiln_status status;
    char message[1024];
} kiln_error;

/** Stable short name of a status ("ok", "invalid_argument", ...). Never NULL. */
KILN_API const char *kiln_status_name(kiln_status status);

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                    */

/** A loaded model: weights (memory-mapped; the matrices moved into huge-page memory at load,
 *  README KILN_REPACK), config and tokenizer. Immutable after loading;
 *  any number of engines and threads may share it. */
typedef struct kiln_model kiln_model;

/** Where a model's weights live, and so where every engine over the model computes. */
typedef enum kiln_device_kind {
    KILN_DEVICE_AUTO = 0, /* the default: the GPU device_index (0) when this build and machine
                             have one (kiln_device_count(KILN_DEVICE_CUDA) > device_index) and
                             the CUDA backend runs the model; otherwise (no GPU, or the CUDA
                             backend refuses the model as KILN_ERR_UNSUPPORTED) the CPU.
                             kiln_model_device says where it went */
    KILN_DEVICE_CPU = 1,  /* host memory and the CPU kernels */
    KILN_DEVICE_CUDA = 2, /* an NVIDIA GPU's memory and the CUDA kernels (a build with CUDA:
                             CMake -DKILN_CUDA=ON|AUTO where nvcc is found) */
} kiln_device_kind;

typedef struct kiln_model_params {
    const char *tokenizer_path; /* llama2.c tokenizer.bin; NULL = look beside the model */
    bool require_tokenizer;     /* fail when no tokenizer can be found (text prompts need one) */
    kiln_device_kind device;    /* default KILN_DEVICE_AUTO (above). KILN_DEVICE_CUDA copies every
                                   weight to the GPU at load (f32, f16 and bf16 weights;
                                   dense architectures without experts or recurrent layers);
                                   engines created over the model then run there, with their
                                   KV cache in the GPU's memory */
    int32_t device_index;       /* CUDA (and AUTO): the GPU, in [0, kiln_device_count(KILN_DEVICE_CUDA)) */
} kiln_model_params;

/** Where a loaded model's weights are: KILN_DEVICE_CPU or KILN_DEVICE_CUDA (never AUTO);
 *  *index (may be NULL) gets the GPU's index (0 for the CPU). NULL model: KILN_DEVICE_CPU. */
KILN_API kiln_device_kind kiln_model_device(const kiln_model *model, int32_t *index);

/** Devices of a kind this build and machine can run on: 1 for the CPU; for CUDA the GPUs the
 *  driver reports, 0 when there is no driver or GPU or kiln was built without CUDA. */
KILN_API int32_t kiln_device_count(kiln_device_kind kind);

/** Free and total memory in bytes of GPU `index` of kind KILN_DEVICE_CUDA (cudaMemGetInfo: free
 *  counts what this process and others have not allocated). Errors: KILN_ERR_INVALID_ARGUMENT
 *  (not a CUDA device of this build and machine), KILN_ERR_INTERNAL (the driver's reason). */
KILN_API kiln_status kiln_device_memory(kiln_device_kind kind, int32_t index, int64_t *free_bytes,
                                        int64_t *total_bytes, kiln_error *err);

/**
 * Load a model from a GGUF file, a llama2.c checkpoint or a Hugging Face directory.
 * params may be NULL (defaults: tokenizer found beside the model, not required, device
 * KILN_DEVICE_AUTO).
 * *out is set only on success; free it with kiln_model_free after every engine using it is
 * destroyed and its streams are read (kiln_stream_next decodes text with the model's
 * tokenizer; kiln_stream_destroy does not need the model).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL path/out, a device kind or index out of range),
 * KILN_ERR_IO, KILN_ERR_FORMAT, KILN_ERR_UNSUPPORTED (also: CUDA in a build without it, a
 * weight dtype or architecture the CUDA backend does not run yet), KILN_ERR_NOT_FOUND
 * (tokenizer required but missing), KILN_ERR_OUT_OF_MEMORY (also: the weights do not fit in
 * the GPU's free memory; the message gives both sizes); every message names the file.
 */
KILN_API kiln_status kiln_model_load(const char *path, const kiln_model_params *params,
                                     kiln_model **out, kiln_error *err);

/** Free a model. NULL is a no-op. */
KILN_API void kiln_model_free(kiln_model *model);

/** Vocabulary size: valid token ids are [0, n_vocab). */
KILN_API int32_t kiln_model_n_vocab(const kiln_model *model);

/** The context length the model was trained with (positions); 0 when unknown. */
KILN_API int32_t kiln_model_n_ctx_train(const kiln_model *model);

/**
 * Tokenize text[0..len) (UTF-8) into ids[0..cap). *n_out receives the full count, even when
 * it exceeds cap (then only cap ids are written, as snprintf does). add_special prepends BOS
 * (and appends EOS) as the vocabulary asks; parse_special recognises control-token texts.
 * Semantics: llama.cpp llama_vocab::tokenize for GGUF vocabs, llama2.c run.c encode for
 * tokenizer.bin.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL model/n_out, invalid UTF-8 with its offset),
 * KILN_ERR_NOT_FOUND (the model has no tokenizer), KILN_ERR_OUT_OF_MEMORY.
 */
KILN_API kiln_status kiln_model_tokenize(const kiln_model *model, const char *text, size_t len,
                                         bool add_special, bool parse_special, int32_t *ids,
                                         int32_t cap, int32_t *n_out, kiln_error *err);

/**
 * The bytes token `id` decodes to in isolation (control tokens: empty). Writes up to cap
 * bytes to buf (no NUL) and returns the full length; 0 for an id out of range or a model
 * without a tokenizer.
 */
KILN_API size_t kiln_model_token_piece(const kiln_model *model, int32_t id, char *buf, size_t cap);

/**
 * Text of a whole token sequence ids[0..n), as the engine's TEXT events spell a stream that
 * starts with it: pieces joined, bytes of a character split over tokens reassembled,
 * invalid UTF-8 as U+FFFD, control tokens as "", and SPM's one leading space dropped at the
 * start of the sequence (llama.cpp's detokenize; llama2.c run.c's decode for tokenizer.bin).
 * Each call is a new sequence: calls on consecutive pieces of one text lose those leading
 * spaces and split characters (stream with the engine's TEXT events instead). Writes up to cap
 * bytes to buf (no NUL) and sets *n_out to the full length, as snprintf does. Errors:
 * KILN_ERR_INVALID_ARGUMENT (NULL model/n_out, n < 0, an id outside [0, n_vocab) with its index),
 * KILN_ERR_NOT_FOUND (no tokenizer), KILN_ERR_OUT_OF_MEMORY.
 */
KILN_API kiln_status kiln_model_detokenize(const kiln_model *model, const int32_t *ids, int32_t n,
                                           char *buf, size_t cap, size_t *n_out, kiln_error *err);

/** The vocabulary's BOS / EOS ids; -1 when it has none or the model has no tokenizer. */
KILN_API int32_t kiln_model_bos(const kiln_model *model);
KILN_API int32_t kiln_model_eos(const kiln_model *model);

/** True when generating id ends a generation: EOS, EOT and the model's other
 *  end-of-generation ids (GGUF tokenizer.ggml.eot_token_id/eom, generation_config.json
 *  eos_token_id lists); for llama2.c checkpoints also BOS (id 1), as run.c stops on it. */
KILN_API bool kiln_model_is_eog(const kiln_model *model, int32_t id);

/** The model's chat template, a Jinja text (GGUF tokenizer.chat_template, Hugging Face
 *  tokenizer_config.json chat_template); owned by the model; NULL when it has none. */
KILN_API const char *kiln_model_chat_template(const kiln_model *model);

/** True when the model has a tokenizer: text prompts, TEXT events, kiln_model_tokenize /
 *  detokenize / token_piece and the chat template's bos_token / eos_token need one. False for
 *  a NULL model. */
KILN_API bool kiln_model_has_tokenizer(const kiln_model *model);

/**
 * Sampling defaults a checkpoint ships: Hugging Face transformers' generation_config.json
 * (GenerationConfig), read from a Hugging Face directory; GGUF files and llama2.c checkpoints
 * carry none (every has_ flag false). A value applies only when its has_ flag is set (the
 * file gave it, with a JSON number; top_k an integer, do_sample a boolean). Values are as the
 * file wrote them, not range-checked: callers keep only those valid for kiln_request.
 * Semantics as transformers: do_sample false means greedy decoding (the sampling fields are
 * then ignored, i.e. temperature 0 here); top_k 0 = off; repetition_penalty 1 = off (CTRL).
 */
typedef struct kiln_generation_defaults {
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty, has_do_sample;
    float temperature;        /* softmax temperature */
    float top_p;              /* nucleus mass, (0, 1] */
    int32_t top_k;            /* most likely tokens kept; 0 = off */
    float min_p;              /* probability floor relative to the most likely token, [0, 1] */
    float repetition_penalty; /* > 0; 1 = off */
    bool do_sample;           /* false = greedy */
} kiln_generation_defaults;

/** Fill *out with the model's generation defaults (all zero / false for a NULL model or one
 *  without generation_config.json). out must not be NULL. */
KILN_API void kiln_model_generation_defaults(const kiln_model *model,
                                             kiln_generation_defaults *out);

/* ---------------------------------------------------------------------------------------- */
/* Chat templates                                                                            */

/**
 * A compiled chat template: Jinja source rendered with Hugging Face semantics, as
 * transformers' apply_chat_template does (Jinja2 sandbox, trim_blocks, lstrip_blocks,
 * loopcontrols, tojson, raise_exception, strftime_now; src/template/template.h lists the
 * subset). Immutable once created: any number of threads may render it at once.
 */
typedef struct kiln_chat_template kiln_chat_template;

typedef struct kiln_chat_template_params {
    const char *source;    /* Jinja text to use instead of the model's own (NUL-terminated); NULL =
                              the model's (kiln_model_chat_template), else ChatML */
    const char *bos_token; /* the template's bos_token; NULL = the model's BOS text (the
                              tokenizer_config.json bos_token, else the BOS piece), "" if none */
    const char *eos_token; /* likewise eos_token */
} kiln_chat_template_params;

/**
 * Compile a chat template. model may be NULL (bos_token / eos_token are then "" unless params
 * give them); params may be NULL (all defaults). With params->source NULL the model's own
 * template is used; when the model has none, or it does not parse (or uses Jinja that kiln does
 * not implement), the ChatML template is used instead ("<|im_start|>{role}\n{content}<|im_end|>\n"
 * per message, then "<|im_start|>assistant\n" when add_generation_prompt: transformers' former
 * default, llama.cpp's "chatml") and kiln_chat_template_fallback says why. A source given in
 * params never falls back: it must parse.
 * *out is set only on success; free it with kiln_chat_template_destroy.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL out; params->source not valid UTF-8),
 * KILN_ERR_FORMAT (params->source has a syntax error: "line L, column C: ..."),
 * KILN_ERR_UNSUPPORTED (params->source uses extends/include/import/block/...),
 * KILN_ERR_OUT_OF_MEMORY, KILN_ERR_INTERNAL (ChatML itself does not parse: a bug).
 */
KILN_API kiln_status kiln_chat_template_create(const kiln_model *model,
                                               const kiln_chat_template_params *params,
                                               kiln_chat_template **out, kiln_error *err);

/** Free a chat template. NULL is a no-op. */
KILN_API void kiln_chat_template_destroy(kiln_chat_template *tpl);

/** NULL when the template in use is the model's own (or params->source); else the ChatML
 *  fallback is in use and this says why ("the model has no chat template", "the model's chat
 *  template does not parse (...)"). Owned by tpl. */
KILN_API const char *kiln_chat_template_fallback(const kiln_chat_template *tpl);

/** What one rendering gets. The JSON texts are NUL-terminated UTF-8; each is parsed as
 *  json.loads would (object key order kept, integers and reals apart, "\u0000" allowed). */
typedef struct kiln_chat_input {
    const char *messages_json;  /* a JSON array of message objects: "role", "content" and
                                   whatever else the template reads (tool_calls, name, ...);
                                   NULL = [] */
    const char *tools_json;     /* a JSON array of tool definitions; NULL = tools is None */
    const char *kwargs_json;    /* a JSON object of extra template variables (vLLM's
                                   chat_template_kwargs, e.g. {"enable_thinking": false}); NULL
                                   = none */
    bool add_generation_prompt; /* end with the header of an assistant turn */
} kiln_chat_input;

/**
 * Render a conversation to prompt text, as transformers' apply_chat_template(messages,
 * tools=..., documents=None, add_generation_prompt=..., tokenize=False, **kwargs) does. The
 * template sees: the kwargs first, then messages, add_generation_prompt and tools (these win
 * over kwargs of the same name), and bos_token, eos_token and documents (None) unless the
 * kwargs set them (transformers' {**special_tokens_map, **kwargs}). strftime_now uses the
 * local time. The text is not tokenized: tokenize it with parse_special true (control-token
 * texts such as "<|im_start|>" recognised) and add_special false when the template writes the
 * BOS itself.
 * On success *out is a malloc'd NUL-terminated string of *out_len bytes; free it with kiln_free.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL tpl/in/out/out_len; a JSON text that does not parse
 * or has the wrong type, named; and every template failure: raise_exception(msg), where the
 * message is exactly msg, undefined values, type errors, sandbox refusals, resource limits,
 * whose messages read like Jinja2's), KILN_ERR_OUT_OF_MEMORY. *out is untouched on failure.
 */
KILN_API kiln_status kiln_chat_template_render(const kiln_chat_template *tpl,
                                               const kiln_chat_input *in, char **out,
                                               size_t *out_len, kiln_error *err);

/** Free memory kiln allocated for the caller (kiln_chat_template_render's text). NULL is a
 *  no-op. */
KILN_API void kiln_free(void *p);

/* ---------------------------------------------------------------------------------------- */
/* Tool calls                                                                                */

/**
 * The markup a model writes its tool calls in. Each family is the one its chat templates ask
 * for (../shared/templates):
 *   HERMES:  <tool_call>{"name": N, "arguments": {...}}</tool_call>, one or more per reply,
 *            text before, between and after them (NousResearch Hermes 2 Pro / 3, Qwen2.5);
 *   LLAMA3:  the reply begins with {"name": N, "parameters": {...}} (Llama 3.1/3.2/3.3's
 *            "JSON based tool calling"), or <|python_tag|> is followed by such objects;
 *            several are separated by ";" (vLLM's llama3_json parser does the same);
 *   MISTRAL: [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] (Mistral-Nemo's template;
 *            a single object without the brackets is taken too).
 * "arguments" and "parameters" are synonyms in every family; an "id" or "type" key in the call
 * object is allowed and ignored; any other key fails the markup.
 */
typedef enum kiln_tool_format {
    KILN_TOOL_FORMAT_NONE = 0, /* no tool-call parsing: everything is content */
    KILN_TOOL_FORMAT_HERMES = 1,
    KILN_TOOL_FORMAT_LLAMA3 = 2,
    KILN_TOOL_FORMAT_MISTRAL = 3,
} kiln_tool_format;

/** "none", "hermes", "llama3", "mistral"; "?" for other values. */
KILN_API const char *kiln_tool_format_name(kiln_tool_format f);

/** The format named `name` (kiln_tool_format_name's spellings). Errors:
 *  KILN_ERR_INVALID_ARGUMENT for any other name (the message lists the valid ones). */
KILN_API kiln_status kiln_tool_format_parse(const char *name, kiln_tool_format *out,
                                            kiln_error *err);

/**
 * The family a chat template's source asks for, from the markup it writes (the same rule as
 * llama.cpp's common_chat_templates detection, by the literal texts): "[TOOL_CALLS]" ->
 * MISTRAL; "<tool_call>" -> HERMES; "<|python_tag|>" or "<|start_header_id|>" together with
 * "\"parameters\"" -> LLAMA3; any other template, or none (source NULL), -> HERMES, the format
 * kiln describes tools in when the template has no `tools` variable (see
 * kiln_chat_template_uses_tools).
 */
KILN_API kiln_tool_format kiln_tool_format_detect(const char *template_source);

/** True when a chat template's source reads a `tools` variable (the word "tools" outside a
 *  string literal's quotes is enough: a heuristic over the text, not the parse tree). NULL ->
 *  false. A template without it never shows the model the tools it is given. */
KILN_API bool kiln_chat_template_uses_tools(const char *template_source);

/** An incremental tool-call parser over one reply's text. */
typedef struct kiln_tool_parser kiln_tool_parser;

typedef struct kiln_tool_parser_params {
    kiln_tool_format format; /* NONE: every byte is content, at once */
    bool stream_arguments;   /* true: a call is announced (KILN_TOOL_EVENT_CALL) as soon as its
                                name is known and its arguments object has begun, and each feed
                                then gives the argument bytes it consumed; false: a call's
                                events come only once its whole markup has parsed, so markup
                                that fails is always content, unchanged */
    uint64_t seed;           /* for the call ids ("call_" + 24 alphanumerics; MISTRAL: 9
                                alphanumerics, which its template requires); same seed, same ids */
} kiln_tool_parser_params;

typedef enum kiln_tool_event_type {
    KILN_TOOL_EVENT_CONTENT = 1,   /* text: ordinary reply text */
    KILN_TOOL_EVENT_CALL = 2,      /* call `index` begins: id and name */
    KILN_TOOL_EVENT_ARGUMENTS = 3, /* text: the next bytes of call `index`'s arguments, a JSON
                                      object exactly as the model wrote it */
} kiln_tool_event_type;

typedef struct kiln_tool_event {
    kiln_tool_event_type type;
    int32_t index;    /* CALL / ARGUMENTS: 0, 1, ... in the reply's order */
    const char *text; /* CONTENT / ARGUMENTS: the bytes (not NUL-terminated) */
    size_t len;
    const char *id;   /* CALL: NUL-terminated */
    const char *name; /* CALL: the function name, JSON-unescaped, NUL-terminated */
    size_t name_len;
} kiln_tool_event;

/**
 * Create a parser. params NULL = NONE. Errors: KILN_ERR_INVALID_ARGUMENT (NULL out, unknown
 * format), KILN_ERR_OUT_OF_MEMORY. Free with kiln_tool_parser_destroy.
 */
KILN_API kiln_status kiln_tool_parser_create(const kiln_tool_parser_params *params,
                                             kiln_tool_parser **out, kiln_error *err);

/** Free a parser. NULL is a no-op. */
KILN_API void kiln_tool_parser_destroy(kiln_tool_parser *p);

/**
 * Feed the next `len` bytes of the reply (any split: a marker or a JSON token may straddle
 * feeds; the text should be UTF-8 as kiln_stream_next gives it). Then drain the events with
 * kiln_tool_parser_next. Text that could still be the start of markup (a proper prefix of
 * "<tool_call>" at the end of what was fed, a call not yet complete, whitespace after a call
 * that may precede another) is held back until later bytes decide it. Markup that fails to
 * parse (not JSON, a call object without a string "name" or with an arguments value that is
 * not an object, a wrong closing tag, JSON nested deeper than 64) is content, unchanged, from
 * its first byte (the text after its marker is scanned again), with two exceptions: the calls
 * before the failing one in a Mistral list or a Llama ";" sequence stay calls (the text after
 * the last of them is content); and in stream_arguments mode a call already announced ends
 * with the arguments given so far, the text from the failing byte on being content.
 * Whitespace around calls (between them, before the first and after the last) is dropped.
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL p, or text NULL with len > 0, or after
 * kiln_tool_parser_finish), KILN_ERR_OUT_OF_MEMORY (the parser is then unusable).
 */
KILN_API kiln_status kiln_tool_parser_feed(kiln_tool_parser *p, const char *text, size_t len,
                                           kiln_error *err);

/**
 * The reply has ended: what was held back is decided. A call whose object is complete but
 * whose closing markup is missing ("<tool_call>{...}" at the end, the "]" of a Mistral list)
 * is a call; an incomplete one is content (or, announced in stream_arguments mode, ends as
 * it is). Further feeds fail. Errors: as kiln_tool_parser_feed.
 */
KILN_API kiln_status kiln_tool_parser_finish(kiln_tool_parser *p, kiln_error *err);

/**
 * Take the next event, in order; false when there is none. Consecutive content is merged
 * into one event per feed. The event's pointers stay valid until the next feed, finish or
 * destroy.
 */
KILN_API bool kiln_tool_parser_next(kiln_tool_parser *p, kiln_tool_event *ev);

/** Calls announced so far (the next call's index). */
KILN_API int32_t kiln_tool_parser_n_calls(const kiln_tool_parser *p);

/* ---------------------------------------------------------------------------------------- */
/* Engines                                                                                   */

/** A serving engine: one model (borrowed), a paged KV pool, a FIFO queue and a thread that
 *  runs the steps. Submission and stream reading are safe from any number of threads. */
typedef struct kiln_engine kiln_engine;

/* Speculative decoding and fill (DESIGN.md "Speculation and fill share one transaction").
 *
 * A speculating sequence feeds, in one step of the flat batch, its pending token plus k draft
 * tokens and gets logits for all k + 1 rows. The drafts are verified in order and the longest
 * accepted prefix is kept; the KV of the rest is rolled back (recurrent layers included).
 * Under the default accept rule the output is bitwise that of plain decoding: the same tokens,
 * the same logits and logprobs of every emitted position, greedy or seeded. */

/** Where a request's drafts come from. */
typedef enum kiln_spec_source {
    KILN_SPEC_DEFAULT = 0, /* request: the engine's spec; engine: KILN_SPEC_OFF */
    KILN_SPEC_OFF = 1,     /* no drafts (a client prediction still drafts) */
    KILN_SPEC_NGRAM = 2,   /* prompt lookup: the tokens that followed the latest earlier
                              occurrence of the sequence's last n tokens (n from spec_ngram_max
                              down to spec_ngram_min), in the prompt and the output so far
                              (Saxena 2023, "Prompt Lookup Decoding"; llama.cpp's lookup) */
    KILN_SPEC_DRAFT = 3,   /* greedy drafts of the engine's draft_model, batched across all
                              speculating sequences, with its own KV pool */
    KILN_SPEC_RANDOM = 4,  /* uniformly random drafts (benchmarks: what rejected drafts cost) */
} kiln_spec_source;

/** How drafted tokens are accepted. */
typedef enum kiln_spec_accept {
    /* Sample each verified position from the request's own (seed, step) stream and accept
     * while the sample equals the draft: the output is bitwise plain decoding's. Greedy: the
     * longest prefix agreeing with the argmax. */
    KILN_SPEC_ACCEPT_EXACT = 0,
    /* Speculative sampling (Leviathan, Kalman, Matias 2023; Chen et al. 2023) with the
     * drafter's point-mass distribution: a draft d is accepted with probability p(d) (p: the
     * sampler's final distribution), else a token is drawn from p with d removed. The output
     * has plain decoding's distribution, with more drafts accepted, but not its bits. */
    KILN_SPEC_ACCEPT_REJECTION = 1,
} kiln_spec_accept;

/** The most drafts one verify step may carry (request or engine spec_k). */
#define KILN_MAX_SPEC_K 32

/** How a fill span's tokens join the output. */
typedef enum kiln_fill_policy {
    KILN_FILL_ASSERT = 0, /* appended without sampling (one forward for the span, logits only
                             where a decision follows, or for logprobs) */
    KILN_FILL_VERIFY = 1, /* drafted and verified like a prediction: the output is unchanged,
                             faster when it agrees */
} kiln_fill_policy;

/**
 * A fill session: a per-request object that sees the output as it grows and may propose a
 * span of known tokens (DESIGN.md "Speculation and fill"). The engine asks it on its thread,
 * each time the sequence is about to take a decision (before a verify or decode step) and the
 * output has changed since the last call. Use: jumping over the spans a grammar forces.
 */
typedef struct kiln_fill_session {
    /* output[0..n_output): the tokens emitted so far (sampled and filled, in order). Write up
     * to cap tokens of a span to continue it into span[] and its policy into *policy; return
     * how many (0: none now). Ids outside [0, n_vocab) finish the request with an error.
     * An asserted span counts towards max_tokens and is cut to what max_tokens leaves. */
    int32_t (*propose)(void *user, const int32_t *output, int32_t n_output, int32_t *span,
                       int32_t cap, kiln_fill_policy *policy);
    /* Called once when the request is released (engine thread), or when submission fails;
     * may be NULL. */
    void (*release)(void *user);
} kiln_fill_session;

/** Storage of the KV cache. */
typedef enum kiln_kv_type {
    KILN_KV_F32 = 0,
    KILN_KV_F16 = 1,  /* half the memory; attention runs on f16 operands with f32 sums */
    KILN_KV_BF16 = 2, /* half the memory; attention runs on bf16 operands with f32 sums */
    KILN_KV_Q8_0 = 3, /* ggml's q8_0 blocks (34 bytes per 32 values: 0.53x f16); attention runs
                         on f16-rounded q and probabilities with each value int8 * scale,
                         f32 sums. Needs n_head_kv * head_dim % 32 == 0. CPU backend only. */
    KILN_KV_Q4_0 = 4, /* ggml's q4_0 blocks (18 bytes per 32 values: 0.28x f16); as q8_0 */
    KILN_KV_TURBO = 5, /* TurboQuant (arXiv 2504.19874) turbo:k8v3: K at 8 bits, V at 3 bits per
                          element plus an f32 norm per head row (6.0 bits per element at head
                          size 64); other configs by name (kv_type_name). Needs a head size that
                          is a power of two in 8..1024. CPU backend only. */
} kiln_kv_type;

typedef struct kiln_engine_params {
    /* KV pool size: kv_memory bytes (rounded down to whole blocks) when > 0, else kv_tokens
     * positions (rounded up to whole blocks) when > 0, else the default: 16 full contexts
     * (16 * n_ctx positions) or 2 GiB, whichever is smaller, but at least one full context. */
    int64_t kv_memory;
    int32_t kv_tokens;
    kiln_kv_type kv_type;  /* K and V storage; default KILN_KV_F32 */
    /* K's and V's storage by name ("f32", "f16", "bf16", "q8_0", "q4_0", "turbo8", ...), overriding kv_type
     * for that side; NULL or "" = kv_type. An unknown name is KILN_ERR_INVALID_ARGUMENT naming
     * the field. Borrowed for kiln_engine_create only; kiln_engine_get_params returns the
     * formats in use here (static strings). */
    const char *kv_type_k, *kv_type_v;
    /* K and V storage by name, overriding kv_type (kv_type_k / kv_type_v still override it per
     * side): any name kv_type_k takes, or a TurboQuant config "turbo:kBvB" (B bits 1..8 for K
     * and for V; a "q" after B spends one of them on the QJL residual; "turbo" = turbo:k8v3).
     * kv_type_k / kv_type_v also take a config, keeping their own side of it ("turbo:k4v3" as
     * kv_type_k is K at 4 bits), or a side's name: "turbo4", "turbo3q". NULL or "" = kv_type.
     * A bad name or config is KILN_ERR_INVALID_ARGUMENT naming the field and the bad part.
     * Borrowed for kiln_engine_create only; kiln_engine_get_params returns NULL here and the
     * per-side names in kv_type_k / kv_type_v. */
    const char *kv_type_name;
    /* Delayed KV quantization (DESIGN.md "Delayed quantization"): 0 = K and V are stored in
     * their formats from the first token. N > 0 with a quantized K or V format (q8_0, q4_0,
     * TurboQuant): a sequence's blocks are written in f16 and stay f16 until the sequence is longer than N
     * tokens (its logits until then are bitwise those of kv_type f16); from then on, at each
     * step's commit, its committed full f16 blocks are converted to the K / V formats and the
     * f16 block goes back to the pool (new blocks, the partial last block and the speculative
     * suffix stay f16 until they are full and committed). The pool's memory is split: f16
     * blocks for up to max_seqs sequences of N + 2 blocks' positions, at most half of it, and
     * the rest in the quantized formats. Ignored (0) when neither side is quantized. */
    int32_t kv_quant_start;
    /* Sliding-window memory (src/engine/kv_window.c). A model with sliding-window
     * layers (Gemma 2 and 3, Mistral) keeps their K/V in a second block pool, one table per
     * sequence, and at each step's commit gives back every block wholly before the window
     * of the next position (p - W, p]: a sequence then holds about W positions there, not
     * all of them. Outputs are bitwise those of keeping every block. Not done (every block is
     * kept, as with this flag) with kv_quant_start or on a backend without host memory
     * (CUDA). The prefix cache keeps the window's sliding blocks as checkpoints at block
     * boundaries (prefill chunk ends, the latest decode boundary), and a hit is shortened to
     * the longest run ending on one; the disk tier (cache_dir) is off for such a model.
     * true: keep every block of every layer (one pool; hits at every block, the disk tier). */
    bool kv_keep_window;
    int32_t block_size;    /* positions per KV block; 0 = 16 */
    int32_t step_tokens;   /* tokens per forward step (decode first, then prefill); 0 = 512 */
    int32_t prefill_chunk; /* most prompt tokens one sequence feeds per step; 0 = step_tokens */
    int32_t max_seqs;      /* most sequences running at once; 0 = 256 */
    int32_t max_queue;     /* most requests waiting for admission; 0 = 4096 */
    int32_t n_threads;     /* compute threads; 0 = physical cores (1 for models under ~4M
                              weights, whose steps are too short to share) */
    int32_t n_ctx;         /* most positions per sequence (prompt + max_tokens - 1 must fit);
                              0 = the model's training context (4096 when unknown). May exceed
                              it (RoPE extrapolates), except with learned position embeddings
                              (KILN_ERR_INVALID_ARGUMENT). */
    /* Prefix cache (DESIGN.md "KV cache"). Full KV blocks of running and finished sequences
     * are indexed by a chain hash of their tokens; a request whose prompt starts with cached
     * blocks shares them instead of recomputing them. The output is bitwise the same either
     * way. On by default. */
    bool no_prefix_cache; /* true: no prefix cache (every prompt is computed) */
    const char *cache_dir; /* disk tier: blocks evicted from RAM are kept in this directory
                              (created if absent) and reused after a restart; NULL or "": RAM
                              only. Borrowed for kiln_engine_create only (copied). */
    int64_t cache_disk_max; /* bytes the disk tier may hold; 0 = 16 GiB */
    /* Speculative decoding: the default for requests that leave spec at KILN_SPEC_DEFAULT. */
    kiln_spec_source spec;       /* KILN_SPEC_DEFAULT / OFF: none; NGRAM; DRAFT (needs
                                    draft_model); RANDOM */
    int32_t spec_k;              /* most drafts per verify step, [1, KILN_MAX_SPEC_K]; 0 = per
                                    source: 32 for a client prediction (or a verify fill, a
                                    fill session), 8 for n-gram, draft-model and random drafts.
                                    Adaptive: a prediction starts at the most, the others at 2,
                                    growing by half while all are accepted; a rejection cuts k
                                    to max(accepted + 1, k / 2); a step that accepts nothing
                                    pauses the guessing sources for 2^misses - 1 decisions */
    int32_t spec_ngram_min;      /* n-gram sizes tried, longest first; 0 = 1 */
    int32_t spec_ngram_max;      /* 0 = 4; >= spec_ngram_min, <= 64 */
    const kiln_model *draft_model; /* borrowed (must outlive the engine): the model of
                                      KILN_SPEC_DRAFT, with the target's vocabulary (checked at
                                      create: same size, same token texts, same end-of-generation
                                      ids; KILN_ERR_INVALID_ARGUMENT names the first difference) */
    int64_t draft_kv_tokens;     /* the draft model's KV pool in positions; 0 = the target's */
    /* Memory budget in bytes for the whole engine (`kiln serve --memory-budget`): when > 0 the
     * KV pool gets what is left after the weights (the model's, and the draft model's) and
     * the step scratch: kv_memory = memory_budget - weights - scratch, rounded down to whole
     * blocks, the arithmetic `kiln fit` prints (src/model/model_fit.h). Excludes kv_memory and
     * kv_tokens; KILN_ERR_INVALID_ARGUMENT when what is left holds no block (the message
     * gives the three figures). The draft model's own KV pool is not counted. 0: unused. */
    int64_t memory_budget;
    /* GPU memory for the whole engine (`--gpu-memory BYTES|FRACTION`), for a model whose
     * weights are on a GPU (kiln_model_device): in (0, 1] a fraction of the device's total
     * memory (cudaMemGetInfo), > 1 bytes. It becomes memory_budget (weights + KV pool + step
     * scratch, the pool getting what is left, as above) after a check that the part beyond
     * the weights, which are placed already, fits the device's free memory; otherwise
     * KILN_ERR_OUT_OF_MEMORY with the figures. Excludes memory_budget, kv_memory and
     * kv_tokens; KILN_ERR_INVALID_ARGUMENT for a model on the CPU. 0: unused. */
    double gpu_memory;
} kiln_engine_params;

/** All zero: every field takes its default. */
KILN_API kiln_engine_params kiln_engine_default_params(void);

/**
 * Create an engine over `model` (borrowed: it must outlive the engine) and start its thread.
 * params may be NULL (defaults). The KV pool is allocated here, once.
 * Errors: KILN_ERR_INVALID_ARGUMENT (a field out of range, named; a pool smaller than one
 * block), KILN_ERR_OUT_OF_MEMORY (the pool; the message gives the bytes),
 * KILN_ERR_INTERNAL (a thread could not be started).
 */
KILN_API kiln_status kiln_engine_create(const kiln_model *model, const kiln_engine_params *params,
                                        kiln_engine **out, kiln_error *err);

/**
 * Stop the engine: requests still queued or running finish with KILN_FINISH_CANCELLED (their
 * streams get the FINISH event and stay readable until destroyed), then the thread is joined
 * and the pool freed. Streams may outlive the engine (not the model: reading them decodes
 * text). NULL is a no-op. Must not be called from the engine thread.
 */
KILN_API void kiln_engine_destroy(kiln_engine *engine);

/** A snapshot of the engine's counters (any thread). */
typedef struct kiln_engine_stats {
    int32_t kv_blocks_total, kv_blocks_used, kv_blocks_free;
    int32_t kv_blocks_peak; /* most blocks used at once since creation or the last reset */
    int32_t block_size;     /* positions per block */
    int32_t n_running;      /* sequences admitted and not finished */
    int32_t n_queued;       /* requests submitted and not yet admitted */
    int64_t n_steps;        /* forward steps run */
    int64_t n_prefill_tokens, n_decode_tokens; /* tokens fed to the model, by kind (with the
                                                  few a request runs past its stop string
                                                  before the engine sees it stopped) */
    int64_t n_requests_finished;
    /* Prefix cache. A request is a hit when at least one prompt block came from the cache
     * (RAM or disk); tokens are prompt tokens, counted at admission (a preempted request
     * resumed from the cache counts again). */
    int32_t kv_blocks_cached;  /* blocks holding no sequence but kept for the cache
                                  (refcount 0, evictable); used + cached + free = total */
    int64_t prefix_hit_requests, prefix_miss_requests;
    int64_t prefix_hit_tokens;  /* prompt tokens whose KV came from the cache */
    int64_t prefix_miss_tokens; /* prompt tokens computed */
    int64_t kv_evictions;       /* cached blocks taken back for other sequences */
    int64_t preemptions;        /* running sequences requeued because the pool ran dry */
    /* Disk tier (zero without cache_dir). */
    int64_t disk_reads, disk_writes;           /* block files read (verified) and written */
    int64_t disk_read_bytes, disk_write_bytes; /* their bytes */
    int64_t disk_corrupt;                      /* files that failed a check: skipped, removed */
    int64_t disk_files, disk_bytes;            /* what the directory holds now */
    /* Speculation and fill. */
    int64_t spec_verify_steps;   /* sequence-steps that verified at least one draft */
    int64_t spec_drafted;        /* draft tokens fed for verification */
    int64_t spec_accepted;       /* of those, the ones accepted */
    int64_t fill_tokens;         /* asserted fill tokens appended without sampling */
    /* KV memory and formats (kv_quant_start): bytes the pool's storage holds; blocks held
     * (used or cached) of the quantized (main) class and of the f16 class of the delayed
     * transition, and their totals; blocks converted so far. Without kv_quant_start every
     * block is main. */
    int64_t kv_bytes;
    /* Sliding-window memory (kv_keep_window false on a model with windows): blocks the
     * sliding group's pool holds (used or cached; one block: block_size positions of every
     * sliding layer), of those the ones only kept for prefix-cache checkpoints (cached,
     * evictable), and its total; 0 without one. The kv_blocks_* above and below count the
     * full group's pool, whose blocks then cover only the layers without a window. kv_bytes
     * includes both pools. */
    int32_t kv_blocks_window_held, kv_blocks_window_cached, kv_blocks_window_total;
    int32_t kv_blocks_main_held, kv_blocks_hi_held;
    int32_t kv_blocks_main_total, kv_blocks_hi_total;
    int64_t kv_blocks_converted;
    /* Choices of kiln_engine_submit_n that forked from choice 0's prompt KV (shared its full
     * blocks, copied its partial one) instead of computing the prompt. */
    int64_t n_forked;
} kiln_engine_stats;

/** Fill *out (all zero for a NULL engine). Any thread; the counters are read one by one, so
 *  a snapshot taken while the engine steps may mix two steps. A request's counters (blocks
 *  released, n_running, n_requests_finished) are updated before its FINISH event is queued. */
KILN_API void kiln_engine_get_stats(const kiln_engine *engine, kiln_engine_stats *out);

/** The engine's parameters as resolved at creation: every 0 ("default") replaced by the
 *  value in use (n_ctx, KV pool, step budget, threads, ...). */
KILN_API void kiln_engine_get_params(const kiln_engine *engine, kiln_engine_params *out);

/** Reset kv_blocks_peak to the blocks used now (benchmarks measure one phase at a time).
 *  Exact when the engine is idle; while it steps, a concurrent allocation may be missed. */
KILN_API void kiln_engine_reset_peak(kiln_engine *engine);

/* ---------------------------------------------------------------------------------------- */
/* Structured output (grammars)                                                              */

/**
 * A compiled grammar that constrains a request's output (README.md "Structured output"):
 * a context-free grammar over the output's bytes. Immutable and reference-counted: any number
 * of requests and threads may use one at once; kiln_engine_submit takes its own reference, so
 * the caller may destroy its handle right after submitting.
 */
typedef struct kiln_grammar kiln_grammar;

/** What the text given to kiln_grammar_create is. */
typedef enum kiln_grammar_kind {
    KILN_GRAMMAR_GBNF = 0,        /* llama.cpp's GBNF (grammars/README.md); the start rule is
                                     `root` */
    KILN_GRAMMAR_JSON_SCHEMA = 1, /* a JSON Schema (draft 2020-12 subset, README.md), as JSON
                                     text: the output is one JSON value valid against it */
    KILN_GRAMMAR_REGEX = 2,       /* a regular expression (README.md's subset) the whole output
                                     matches (vLLM guided_regex) */
    KILN_GRAMMAR_JSON_OBJECT = 3, /* any JSON object (OpenAI response_format json_object); the
                                     text is ignored (may be NULL) */
} kiln_grammar_kind;

/**
 * Compile text[0..len) (UTF-8; len 0 = strlen(text)) of the given kind. On success *out holds
 * one reference (kiln_grammar_destroy). Errors: KILN_ERR_INVALID_ARGUMENT with the problem and
 * where it is: GBNF "grammar: line L, column C: ..." (syntax, an undefined rule, no root, a
 * left-recursive rule), JSON Schema "json_schema: at /properties/x: keyword 'multipleOf' is
 * not supported" (or invalid JSON with its line and column), regex "regex: position P:
 * lookahead (?=...) is not supported"; KILN_ERR_OUT_OF_MEMORY.
 */
KILN_API kiln_status kiln_grammar_create(kiln_grammar_kind kind, const char *text, size_t len,
                                         kiln_grammar **out, kiln_error *err);

/**
 * A grammar whose sentences are exactly the n strings choices[0..n) (vLLM guided_choice).
 * Errors: KILN_ERR_INVALID_ARGUMENT (n < 1, a NULL or empty choice, invalid UTF-8),
 * KILN_ERR_OUT_OF_MEMORY.
 */
KILN_API kiln_status kiln_grammar_from_choices(const char *const *choices, int32_t n,
                                               kiln_grammar **out, kiln_error *err);

/**
 * The GBNF rules of a JSON schema, every rule name prefixed with `prefix` (NULL = ""), the
 * start rule named "<prefix>root", for pasting into a larger GBNF grammar (a tool call's
 * envelope around its arguments). *out is malloc'd NUL-terminated text (kiln_free).
 * Errors: as kiln_grammar_create for KILN_GRAMMAR_JSON_SCHEMA.
 */
KILN_API kiln_status kiln_json_schema_to_gbnf(const char *schema, size_t len, const char *prefix,
                                              char **out, kiln_error *err);

/** Drop one reference; the last frees the grammar. NULL is a no-op. */
KILN_API void kiln_grammar_destroy(kiln_grammar *g);

/** The GBNF text the grammar was compiled from (a schema's or regex's translation); owned
 *  by g. */
KILN_API const char *kiln_grammar_gbnf(const kiln_grammar *g);

/**
 * Run text[0..len) through the grammar's recognizer: *prefix_ok = whether every byte was
 * accepted (the text can still be extended to a sentence), *complete = whether the text is a
 * whole sentence. Either out pointer may be NULL. Errors: KILN_ERR_INVALID_ARGUMENT (NULL g),
 * KILN_ERR_OUT_OF_MEMORY (also: the recognizer's state tables outgrew their limits).
 */
KILN_API kiln_status kiln_grammar_match(const kiln_grammar *g, const char *text, size_t len,
                                        bool *prefix_ok, bool *complete, kiln_error *err);

/* ---------------------------------------------------------------------------------------- */
/* Requests                                                                                  */

#define KILN_MAX_STOP_STRINGS 4
#define KILN_MAX_TOP_LOGPROBS 20

/**
 * One generation request. Every pointer is borrowed only for the duration of
 * kiln_engine_submit, which copies what it needs (an immutable snapshot).
 * Start from kiln_request_defaults().
 */
typedef struct kiln_request {
    /* The prompt: token ids when prompt_ids is non-NULL, else UTF-8 text. */
    const int32_t *prompt_ids; /* [n_prompt_ids], each in [0, n_vocab) */
    int32_t n_prompt_ids;
    const char *prompt; /* text; NUL-terminated unless prompt_len > 0 */
    size_t prompt_len;  /* bytes of prompt; 0 = strlen(prompt) */
    bool add_special;   /* text: add BOS/EOS as the vocabulary asks (default true) */
    bool parse_special; /* text: recognise control-token texts (default false) */

    int32_t max_tokens; /* most tokens to generate, >= 1 (default 256) */

    /* Sampling (DESIGN.md "Sampling" gives the processor order). */
    float temperature;         /* [0, 2]; 0 = greedy (default 1) */
    int32_t top_k;             /* >= 0; 0 = off (default) */
    float top_p;               /* (0, 1]; 1 = off (default) */
    float min_p;               /* [0, 1]; 0 = off (default) */
    float xtc_probability;     /* [0, 1]; 0 = off (default). XTC, "exclude top choices": with
                                  this probability per step, when two or more tokens have
                                  probability >= xtc_threshold, all but the least likely of
                                  them are removed (llama.cpp's xtc sampler) */
    float xtc_threshold;       /* [0, 1] (default 0.1); above 0.5 XTC never acts */
    uint64_t seed;             /* the draw at generation step s depends only on (seed, s) */
    float repetition_penalty;  /* > 0; 1 = off (default). CTRL (Keskar et al. 2019) */
    int32_t repetition_window; /* tokens looked back (prompt + generated); 0 = all */
    float presence_penalty;    /* [-2, 2]; 0 = off. OpenAI semantics */
    int32_t presence_window;
    float frequency_penalty; /* [-2, 2]; 0 = off. OpenAI semantics */
    int32_t frequency_window;
    int32_t n_logit_bias;           /* entries of logit_bias_ids / logit_bias_values */
    const int32_t *logit_bias_ids;  /* each in [0, n_vocab) */
    const float *logit_bias_values; /* added to the logit; -inf bans the token */

    /* Logprobs: log-softmax of the logits after bias and penalties, before temperature. */
    bool logprobs;        /* TOKEN events carry the sampled token's logprob */
    int32_t top_logprobs; /* [0, 20]: TOKEN events also carry the most likely alternatives */
    /* Prompt logprobs (vLLM `prompt_logprobs`; OpenAI `echo` with `logprobs`): before the
     * first TOKEN event, one PROMPT_LOGPROB event per prompt token i >= 1 (in order) with the
     * log-softmax of the raw logits of position i - 1 (before every sampling processor: no
     * bias, penalty or grammar mask), for token i and the top_prompt_logprobs best. Token 0
     * has no predecessor and no event. Every prompt position then computes a logits row, so
     * such a request takes no prefix-cache hits (RAM or disk: its whole prompt is computed;
     * it still offers its blocks to the cache), and its n > 1 choices do not fork (each
     * computes the prompt). The values are bitwise the same however the prompt is chunked
     * and batched (DESIGN.md "Batch invariance"). */
    bool prompt_logprobs;
    int32_t top_prompt_logprobs; /* [0, 20]; > 0 implies prompt_logprobs */

    /* Stopping. End-of-generation tokens of the vocabulary always stop (finish "stop") unless
     * ignore_eos; stop_token_ids add more. The stopping token is not emitted. */
    int32_t n_stop;                /* <= KILN_MAX_STOP_STRINGS */
    const char *const *stop;       /* NUL-terminated, non-empty UTF-8 strings. The earliest match
                                      in the generated text ends generation; the match and
                                      everything after it are left out of the text. Matched
                                      while the stream is read (kiln_stream_next): see
                                      kiln_usage for what is counted. */
    int32_t n_stop_token_ids;      /* <= 64 */
    const int32_t *stop_token_ids; /* each in [0, n_vocab) (vLLM `stop_token_ids`) */
    bool ignore_eos;               /* keep generating through end-of-generation tokens */
    bool render_special;           /* TEXT events carry the text of control tokens too
                                      ("<|python_tag|>", "[TOOL_CALLS]": tool-call markers);
                                      by default they render as "" (the stopping token is
                                      never emitted either way) */

    /* Speculative decoding (see kiln_spec_source). */
    kiln_spec_source spec;   /* KILN_SPEC_DEFAULT: the engine's; KILN_SPEC_OFF turns it off
                                for this request; KILN_SPEC_DRAFT needs the engine's
                                draft_model */
    int32_t spec_k;          /* 0 = the engine's; else [1, KILN_MAX_SPEC_K] */
    kiln_spec_accept spec_accept; /* default KILN_SPEC_ACCEPT_EXACT */
    /* Client prediction (OpenAI `prediction`, the verify policy): drafts are taken from this
     * text where it agrees with the output; after a rejection it is re-aligned to the output
     * (kiln_usage gives the rule). Token ids when prediction_ids is non-NULL, else UTF-8
     * text, tokenized as the continuation of a text prompt (the two together, the prompt's
     * tokens dropped; alone, without special tokens, after a prompt given as ids or when a
     * token spans the seam). Its tokens must fit the context: prompt + prediction <= n_ctx. */
    const int32_t *prediction_ids;
    int32_t n_prediction_ids;
    const char *prediction;
    size_t prediction_len; /* bytes; 0 = strlen(prediction) */
    /* Fill (a kiln extension): the output begins with this content, asserted (forced, it
     * counts as completion tokens) or verified (a prediction of the output's start). Text is
     * tokenized as the prediction's is. */
    const int32_t *fill_ids;
    int32_t n_fill_ids;
    const char *fill;
    size_t fill_len; /* bytes; 0 = strlen(fill) */
    kiln_fill_policy fill_policy;
    bool fill_hidden; /* assert fill only: the span continues the prompt instead of starting
                         the output: it is counted as prompt tokens and not emitted (chat
                         assistant prefill: the reply continues the assistant's message) */
    /* A fill session (may be NULL); user is passed to its functions. The request owns user
     * from a successful or failed kiln_engine_submit on: release is called exactly once. */
    const kiln_fill_session *fill_session;
    void *fill_session_user;

    /* Structured output: the output must be a sentence of this grammar (borrowed; submit takes
     * a reference). Each step a token mask built from the vocabulary's trie allows only the
     * tokens whose bytes keep the output a prefix of a sentence; end-of-generation tokens (and
     * stop_token_ids) only once it is a whole sentence. The mask is applied before every other
     * logit processor, so logprobs are those of the masked distribution (what OpenAI and vLLM
     * report: after the processors). A draft the grammar forbids is always rejected. A
     * grammar that cannot finish within max_tokens ends with KILN_FINISH_LENGTH. Needs a model
     * with a tokenizer. */
    const kiln_grammar *grammar;
    /* Jump-forward (default on): where the grammar allows exactly one continuation, its bytes
     * (split greedily into the longest vocabulary tokens, the last one left to sampling unless
     * it ends the grammar) are appended as an asserted fill, without sampling. true turns it
     * off (the output is then exactly masked sampling's). */
    bool grammar_no_jump_forward;
} kiln_request;

/** max_tokens 256, temperature 1, top_p 1, top_k 0, min_p 0, seed 0, XTC off (threshold
 *  0.1), penalties off,
 *  add_special true, everything else off/empty. */
KILN_API kiln_request kiln_request_defaults(void);

/** A request's event stream: the consumer side of one request. */
typedef struct kiln_stream kiln_stream;

/**
 * Validate `req`, copy it, tokenize a text prompt, and enqueue it. On success *out is a new
 * stream owned by the caller (kiln_stream_destroy). Safe from any thread, including
 * concurrently. A rejected request never reaches the engine thread.
 * Errors (the message names the field): KILN_ERR_INVALID_ARGUMENT: empty prompt, a prompt id
 * outside [0, n_vocab) (index given), max_tokens < 1, temperature outside [0, 2], top_p
 * outside (0, 1], min_p outside [0, 1], top_k < 0, xtc_probability or xtc_threshold outside
 * [0, 1], penalties out of range, a logit_bias or
 * stop_token_ids id out of range, top_logprobs or top_prompt_logprobs outside [0, 20], more
 * than 4 stop strings or an empty one, a text prompt that is not valid UTF-8, spec_k outside [0, 32], an unknown spec,
 * spec_accept or fill_policy, KILN_SPEC_DRAFT on an engine without a draft model, a
 * prediction or fill id outside [0, n_vocab), a prediction whose tokens with the prompt's
 * exceed the engine's n_ctx, an asserted fill longer than max_tokens, a verify-policy fill
 * together with a prediction; KILN_ERR_NOT_FOUND (text prompt, model without
 * tokenizer); KILN_ERR_QUEUE_FULL; KILN_ERR_CANCELLED (the engine is shutting down);
 * KILN_ERR_OUT_OF_MEMORY.
 * Admission (engine thread, FIFO): a request waits until the KV pool has free blocks for
 * its whole lifetime, prompt + max_tokens - 1 positions (the last generated token is never
 * fed back), and reserves them. A request that passes validation but can never fit (those
 * positions exceed the engine's n_ctx, or need more blocks than the whole pool) finishes at
 * admission with KILN_FINISH_ERROR and status KILN_ERR_CONTEXT_OVER_BUDGET.
 */
KILN_API kiln_status kiln_engine_submit(kiln_engine *engine, const kiln_request *req,
                                        kiln_stream **out, kiln_error *err);

/** The most choices kiln_engine_submit_n takes. Each choice is a running sequence that
 *  decodes one token in every step, so a request of n choices takes n of the engine's max_seqs
 *  slots and n rows of each step's budget; 16 keeps one request from crowding out the others
 *  (OpenAI's own limit is 128; llama.cpp's server has no n at all). */
#define KILN_MAX_CHOICES 16

/**
 * Submit n choices of one request (OpenAI's `n`): out[0..n) get n streams, choice i's. Choice i
 * is the request with seed = req->seed + i (unsigned wrap-around): its tokens, logprobs and
 * text are bitwise those of kiln_engine_submit with that seed (greedy choices are all equal).
 * The prompt is computed once. Choice 0 prefills it; once its KV covers the prompt's first
 * P - 1 positions (P prompt tokens), each other choice forks from it (DESIGN.md principle 2):
 * it shares choice 0's full blocks (refcount + 1), copies the one partial block
 * (copy-on-write, kiln_block_table_fork_prefix) and computes only the prompt's last token
 * itself, to get its own logits row, then samples apart. So the engine feeds P + n - 1 prompt
 * positions instead of n * P (kiln_engine_stats n_forked counts the forks). A choice that
 * cannot fork at that moment (no free block for the copy, max_seqs running, a prompt of one
 * token, a model with recurrent layers or freed sliding-window blocks, choice 0 cancelled or failed first) is admitted as an
 * ordinary request instead (the prefix cache may still share the prompt's full blocks): its
 * output is the same either way. Each stream is independent: its own events, usage
 * (prompt_tokens is P in every choice), cancellation and FINISH.
 * Errors: as kiln_engine_submit; KILN_ERR_INVALID_ARGUMENT also for n outside
 * [1, KILN_MAX_CHOICES], NULL out, or a fill_session with n > 1 (a session is one object with
 * one release); KILN_ERR_QUEUE_FULL when the n choices do not fit the queue. On failure no
 * stream is created (out[] all NULL).
 */
KILN_API kiln_status kiln_engine_submit_n(kiln_engine *engine, const kiln_request *req, int32_t n,
                                          kiln_stream **out, kiln_error *err);

/* ---------------------------------------------------------------------------------------- */
/* Streams                                                                                   */

/** Why a request finished. */
typedef enum kiln_finish_reason {
    KILN_FINISH_NONE = 0,
    KILN_FINISH_STOP = 1,   /* an end-of-generation token, a stop id or a stop string */
    KILN_FINISH_LENGTH = 2, /* max_tokens reached (or the context is full) */
    KILN_FINISH_CANCELLED = 3,
    KILN_FINISH_ERROR = 4,
} kiln_finish_reason;

/** "stop", "length", "cancelled", "error" (or "none"). Never NULL. */
KILN_API const char *kiln_finish_reason_name(kiln_finish_reason r);

typedef enum kiln_event_type {
    KILN_EVENT_NONE = 0, /* no event: the timeout passed, or the stream is finished and drained */
    KILN_EVENT_TOKEN,    /* a generated token */
    KILN_EVENT_TEXT,     /* a text delta */
    KILN_EVENT_FINISH,   /* the last event of every stream */
    KILN_EVENT_PROMPT_LOGPROB, /* a prompt token's logprob (kiln_request.prompt_logprobs):
                                  token, index (its prompt position, >= 1), logprob and
                                  top_logprobs as a TOKEN event's; no TEXT follows */
} kiln_event_type;

typedef struct kiln_token_logprob {
    int32_t token;
    float logprob; /* natural log */
} kiln_token_logprob;

typedef struct kiln_usage {
    int32_t prompt_tokens;     /* tokens of the (tokenized) prompt */
    int32_t cached_tokens;     /* of those, the tokens whose KV came from the prefix cache (RAM
                                  or disk) at admission instead of being computed: OpenAI's
                                  usage.prompt_tokens_details.cached_tokens. A multiple of the
                                  block size, at most prompt_tokens - 1 (the last prompt token
                                  is always computed: its logits are needed). A request that
                                  was preempted and resumed reports its first admission. */
    int32_t completion_tokens; /* tokens generated, the stopping token included: the EOS or
                                  stop id (counted, not emitted), or the token whose text
                                  decided a stop string's match (the one that completed it, or
                                  a later one when another stop string's partial match had to
                                  fail first); = the TOKEN events delivered, plus 1 for a
                                  stopping EOS or stop id. Tokens the engine generated after
                                  a stop string's deciding token are never delivered or
                                  counted. */
    /* Speculation (counted by the engine, so a stop string's tail is included). */
    int32_t spec_drafted;      /* draft tokens fed for verification */
    int32_t spec_accepted;     /* of those, accepted */
    int32_t spec_verify_steps; /* steps that verified at least one draft */
    int32_t fill_tokens;       /* asserted fill tokens in the output */
    /* Prediction accounting (OpenAI usage.completion_tokens_details): a prediction token is
     * accepted when an output token was aligned to it, rejected otherwise, so accepted +
     * rejected = the prediction's length. Alignment, per output token t, with pred[0..n), j
     * the next prediction index (0 at start) and u the output tokens since the last aligned
     * one (0 at start): t takes the first of j if pred[j] == t; j + u if u >= 1 and
     * pred[j + u] == t (u tokens replaced u); j + 1 if u == 0 and pred[j + 1] == t (one left
     * out); else q - 1 for the longest m in [2, min(4, output so far)] whose last m output
     * tokens equal pred[q - m .. q) with q - 1 >= j, at the smallest such q (the n-gram's
     * tokens before t that took nothing, at most u of them at indices >= j, are aligned
     * too). Then j = t's index + 1, u = 0; if none applies, t takes nothing and u grows by
     * one. Drafts are pred[j + u ..]. */
    int32_t accepted_prediction_tokens;
    int32_t rejected_prediction_tokens;
} kiln_usage;

/**
 * One event. Events of a stream come in order: PROMPT_LOGPROB events (only when asked for),
 * then for each generated token a TOKEN event, then
 * (when the token completed some text) a TEXT event; last, one FINISH event.
 * Pointers are owned by the stream and valid until the next kiln_stream_next on it or its
 * destruction.
 */
typedef struct kiln_event {
    kiln_event_type type;
    int64_t time_ns; /* when the engine queued the event: CLOCK_MONOTONIC, nanoseconds (for
                        latency metrics that must not depend on when the consumer woke). A TEXT
                        event has its token's time (the engine FINISH's for text released at
                        the end); the FINISH of a stop string the deciding token's time */

    /* KILN_EVENT_TOKEN (and KILN_EVENT_PROMPT_LOGPROB, for a prompt token) */
    int32_t token;          /* id in [0, n_vocab) */
    int32_t index;          /* 0-based position among the generated tokens (PROMPT_LOGPROB:
                               among the prompt's tokens) */
    float logprob;          /* when the request asked for logprobs or top_logprobs, else 0 */
    int32_t n_top_logprobs; /* = the request's top_logprobs (fewer if the vocab is smaller) */
    kiln_token_logprob top_logprobs[KILN_MAX_TOP_LOGPROBS]; /* most likely first; ties by id */

    /* KILN_EVENT_TEXT: complete UTF-8, never a partial character, never any part of a stop
     * string. The concatenation of all TEXT events is the completion text. */
    const char *text; /* NUL-terminated as well */
    size_t text_len;

    /* KILN_EVENT_FINISH */
    kiln_finish_reason finish_reason;
    kiln_usage usage;
    kiln_status status;  /* KILN_OK unless finish_reason is KILN_FINISH_ERROR */
    const char *message; /* "" unless finish_reason is KILN_FINISH_ERROR */
} kiln_event;

/**
 * Take the next event. timeout_ms < 0 waits as long as needed, 0 does not wait, > 0 waits
 * at most that many milliseconds. When no event arrives in time, or the stream is finished
 * and its FINISH event was already taken, ev->type is KILN_EVENT_NONE and KILN_OK is
 * returned. Only one thread may read a stream at a time (several threads may take turns).
 * The text pipeline runs here, on the caller's thread (DESIGN.md "One request, end to end",
 * step 7): TOKEN events are detokenized incrementally, incomplete UTF-8 and text that could
 * still begin a stop string are held back, and stop strings are matched. When one matches,
 * this call asks the engine to stop the request (as kiln_stream_cancel does), drops the
 * tokens the engine generated after the deciding one, and delivers FINISH (reason stop) once
 * the engine has released the request's KV blocks (at its next step boundary).
 * Errors: KILN_ERR_INVALID_ARGUMENT (NULL stream or ev).
 */
KILN_API kiln_status kiln_stream_next(kiln_stream *stream, int64_t timeout_ms, kiln_event *ev,
                                      kiln_error *err);

/** True once the engine has queued its FINISH (the request is released; the FINISH event and
 *  some TOKEN/TEXT events may still be unread). Any thread. */
KILN_API bool kiln_stream_finished(const kiln_stream *stream);

/**
 * Ask the engine to stop this request. It is noticed at the next step boundary: the request
 * finishes with KILN_FINISH_CANCELLED (unless it finished first) and its KV blocks are
 * released. Any thread; idempotent; NULL is a no-op.
 */
KILN_API void kiln_stream_cancel(kiln_stream *stream);

/** Cancel (if still running) and drop the caller's handle; unread events are discarded.
 *  NULL is a no-op. */
KILN_API void kiln_stream_destroy(kiln_stream *stream);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
