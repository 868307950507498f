/*
 * tool_calls.c - the incremental tool-call parser of kiln.h (kiln_tool_parser_*): the
 * markup of the Hermes/Qwen, Llama-3.1 JSON and Mistral families (kiln_tool_format) turned
 * into content and tool-call events as a reply's text arrives.
 *
 * The parser keeps the text it has not decided yet in `in` and scans it byte by byte with
 * one state machine: the family's wrapper (markers, separators, closing tags) around a call
 * object ({"name": ..., "arguments": {...}}), whose arguments value is checked by a JSON
 * recognizer (RFC 8259's grammar, a pushdown over bytes) so that the bytes handed out as
 * arguments are always a prefix of one JSON object. When markup fails, scanning rewinds:
 * the marker's text becomes content and the bytes after it are scanned again as text (or,
 * for a call already announced in stream_arguments mode, the bytes from the failing one on).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kiln.h"
#include "util/error.h"

#define TC_MAX_DEPTH 64

/* ---------------------------------------------------------------- formats */

const char *kiln_tool_format_name(kiln_tool_format f) {
    switch (f) {
    case KILN_TOOL_FORMAT_NONE:
        return "none";
    case KILN_TOOL_FORMAT_HERMES:
        return "hermes";
    case KILN_TOOL_FORMAT_LLAMA3:
        return "llama3";
    case KILN_TOOL_FORMAT_MISTRAL:
        return "mistral";
    }
    return "?";
}

kiln_status kiln_tool_format_parse(const char *name, kiln_tool_format *out, kiln_error *err) {
    static const kiln_tool_format all[] = {KILN_TOOL_FORMAT_NONE, KILN_TOOL_FORMAT_HERMES,
                                           KILN_TOOL_FORMAT_LLAMA3, KILN_TOOL_FORMAT_MISTRAL};
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tool format: NULL out");
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(name, kiln_tool_format_name(all[i]))) {
            *out = all[i];
            return KILN_OK;
        }
    return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                          "unknown tool-call format '%.64s' (expected hermes, llama3, mistral "
                          "or none)",
                          name ? name : "(null)");
}

kiln_tool_format kiln_tool_format_detect(const char *src) {
    if (!src) return KILN_TOOL_FORMAT_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return KILN_TOOL_FORMAT_MISTRAL;
    if (strstr(src, "<tool_call>")) return KILN_TOOL_FORMAT_HERMES;
    if (strstr(src, "<|python_tag|>") ||
        (strstr(src, "<|start_header_id|>") && strstr(src, "\"parameters\"")))
        return KILN_TOOL_FORMAT_LLAMA3;
    return KILN_TOOL_FORMAT_HERMES;
}

static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
}

bool kiln_chat_template_uses_tools(const char *src) {
    if (!src) return false;
    char quote = 0;
    bool in_tag = false; /* inside {{ }} or {% %}: quotes there delimit string literals */
    for (const char *s = src; *s; s++) {
        if (!in_tag) {
            if (s[0] == '{' && (s[1] == '{' || s[1] == '%')) {
                in_tag = true;
                s++;
            }
            continue;
        }
        if (quote) {
            if (*s == '\\' && s[1]) s++;
            else if (*s == quote) quote = 0;
            continue;
        }
        if (*s == '\'' || *s == '"') quote = *s;
        else if ((s[0] == '}' || s[0] == '%') && s[1] == '}') {
            in_tag = false;
            s++;
        } else if (!strncmp(s, "tools", 5) && (s == src || !ident_char(s[-1])) &&
                   !ident_char(s[5]))
            return true;
    }
    return false;
}

/* ---------------------------------------------------------------- JSON recognizer */

/* A pushdown recognizer of one JSON value over bytes. jr_push returns false when the byte
 * cannot continue a JSON text; `done` is set by the byte that completes the value (a number
 * at the top level never completes: only objects are asked for). */
enum { JR_VALUE, JR_KEY_OR_END, JR_KEY, JR_COLON, JR_COMMA_OR_END, JR_VALUE_OR_END, JR_STRING,
       JR_ESC, JR_HEX, JR_NUMBER, JR_LIT, JR_DONE };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

typedef struct jrec {
    uint8_t stack[TC_MAX_DEPTH]; /* 'o' or 'a' */
    int depth;
    int state;
    bool key; /* the string being read is an object key */
    int hex;  /* \u digits left */
    int num;
    const char *lit;
    bool done;
} jrec;

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void jr_init(jrec *j) {
    memset(j, 0, sizeof *j);
    j->state = JR_VALUE;
}

/* After a value ends: where the enclosing container goes next. */
static void jr_value_end(jrec *j) {
    if (j->depth == 0) {
        j->state = JR_DONE;
        j->done = true;
    } else {
        j->state = JR_COMMA_OR_END;
    }
}

static bool jr_start_value(jrec *j, unsigned char c) {
    switch (c) {
    case '{':
    case '[':
        if (j->depth == TC_MAX_DEPTH) return false;
        j->stack[j->depth++] = c == '{' ? 'o' : 'a';
        j->state = c == '{' ? JR_KEY_OR_END : JR_VALUE_OR_END;
        return true;
    case '"':
        j->state = JR_STRING;
        j->key = false;
        return true;
    case 't':
        j->lit = "rue";
        j->state = JR_LIT;
        return true;
    case 'f':
        j->lit = "alse";
        j->state = JR_LIT;
        return true;
    case 'n':
        j->lit = "ull";
        j->state = JR_LIT;
        return true;
    case '-':
        j->num = N_MINUS;
        j->state = JR_NUMBER;
        return true;
    default:
        if (c >= '0' && c <= '9') {
            j->num = c == '0' ? N_ZERO : N_INT;
            j->state = JR_NUMBER;
            return true;
        }
        return false;
    }
}

static bool jr_push(jrec *j, unsigned char c) {
    bool digit = c >= '0' && c <= '9';
    switch (j->state) {
    case JR_VALUE:
        if (is_ws(c)) return true;
        return jr_start_value(j, c);
    case JR_VALUE_OR_END: /* just after '[' */
        if (is_ws(c)) return true;
        if (c == ']') {
            j->depth--;
            jr_value_end(j);
            return true;
        }
        return jr_start_value(j, c);
    case JR_KEY_OR_END: /* just after '{' */
        if (is_ws(c)) return true;
        if (c == '}') {
            j->depth--;
            jr_value_end(j);
            return true;
        }
        /* fallthrough */
    case JR_KEY:
        if (is_ws(c)) return true;
        if (c != '"') return false;
        j->state = JR_STRING;
        j->key = true;
        return true;
    case JR_COLON:
        if (is_ws(c)) return true;
        if (c != ':') return false;
        j->state = JR_VALUE;
        return true;
    case JR_COMMA_OR_END:
        if (is_ws(c)) return true;
        if (c == ',') {
            j->state = j->stack[j->depth - 1] == 'o' ? JR_KEY : JR_VALUE;
            return true;
        }
        if (c == (j->stack[j->depth - 1] == 'o' ? '}' : ']')) {
            j->depth--;
            jr_value_end(j);
            return true;
        }
        return false;
    case JR_STRING:
        if (c < 0x20) return false;
        if (c == '\\') j->state = JR_ESC;
        else if (c == '"') {
            if (j->key) j->state = JR_COLON;
            else jr_value_end(j);
        }
        return true;
    case JR_ESC:
        if (c == 'u') {
            j->hex = 4;
            j->state = JR_HEX;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return false;
        j->state = JR_STRING;
        return true;
    case JR_HEX:
        if (!(digit || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
        if (--j->hex == 0) j->state = JR_STRING;
        return true;
    case JR_LIT:
        if (c != (unsigned char)*j->lit) return false;
        if (!*++j->lit) jr_value_end(j);
        return true;
    case JR_NUMBER:
        switch (j->num) {
        case N_MINUS:
            if (!digit) return false;
            j->num = c == '0' ? N_ZERO : N_INT;
            return true;
        case N_ZERO:
        case N_INT:
            if (digit && j->num == N_INT) return true;
            if (c == '.') {
                j->num = N_DOT;
                return true;
            }
            if (c == 'e' || c == 'E') {
                j->num = N_E;
                return true;
            }
            break; /* the number ended: c continues the container */
        case N_DOT:
            if (!digit) return false;
            j->num = N_FRAC;
            return true;
        case N_FRAC:
            if (digit) return true;
            if (c == 'e' || c == 'E') {
                j->num = N_E;
                return true;
            }
            break;
        case N_E:
            if (c == '+' || c == '-') {
                j->num = N_ESIGN;
                return true;
            }
            /* fallthrough */
        case N_ESIGN:
            if (!digit) return false;
            j->num = N_EXP;
            return true;
        case N_EXP:
            if (digit) return true;
            break;
        }
        if (j->depth == 0) return false; /* a bare number never ends here */
        j->state = JR_COMMA_OR_END;
        return jr_push(j, c);
    default: /* JR_DONE */
        return false;
    }
}

/* ---------------------------------------------------------------- the parser */

/* Scanner states. */
enum {
    S_TEXT,      /* content; looking for a marker */
    S_AFTER,     /* whitespace after a call: dropped if a marker or the end follows */
    S_M_OPEN,    /* MISTRAL, after [TOOL_CALLS]: '[' or '{' */
    S_OBJ_OPEN,  /* the call object's '{' */
    S_OBJ_KEY,   /* a key's opening quote (or '}' for an empty object) */
    S_OBJ_KSTR,  /* inside a key */
    S_OBJ_COLON, /* ':' */
    S_OBJ_VALUE, /* the value's first byte */
    S_OBJ_NAME,  /* inside the name string */
    S_OBJ_ARGS,  /* inside the arguments object (jrec) */
    S_OBJ_SKIP,  /* inside an ignored value (jrec) */
    S_OBJ_NEXT,  /* ',' or '}' */
    S_CLOSE,     /* after the call object: the family's closing markup */
};

enum { KEY_NAME, KEY_ARGS, KEY_SKIP };

typedef struct tc_event {
    kiln_tool_event_type type;
    int32_t index;
    size_t off, len;   /* text in p->ev_text */
    size_t id_off;     /* CALL: id in p->ev_text (NUL-terminated) */
    size_t name_off;   /* CALL: name in p->ev_text (NUL-terminated) */
    size_t name_len;
} tc_event;

struct kiln_tool_parser {
    kiln_tool_format fmt;
    bool stream_args;
    uint64_t rng;
    bool finished, broken;

    char *in; /* undecided text: in[0..n_in) */
    size_t n_in, cap_in;
    size_t pos;        /* next byte of `in` to scan */
    size_t text_start; /* S_TEXT/S_AFTER: content (or held whitespace) begins here */
    bool at_start;     /* LLAMA3: nothing but whitespace so far in the reply */

    int state;
    size_t mark;     /* where the current markup began in `in` */
    size_t mark_len; /* its marker's bytes (content on failure) */
    bool in_list;    /* MISTRAL: inside [ ... ] */
    int key_kind;
    size_t kstr_start; /* S_OBJ_KSTR / S_OBJ_NAME: first byte of the string's body */
    bool esc;
    jrec j;
    const char *close; /* S_CLOSE: the literal still expected (HERMES "</tool_call>") */
    size_t close_i;

    /* the call being parsed */
    char *name;
    size_t name_len;
    bool have_name, have_args;
    size_t args_start; /* in `in` */
    bool announced;    /* stream_arguments: CALL sent */
    size_t args_sent;  /* stream_arguments: bytes of `in` up to which arguments were sent */
    char *args;        /* hold mode, or arguments before name: the finished arguments */
    size_t args_len;

    int32_t n_calls;

    tc_event *ev;
    size_t n_ev, cap_ev, ev_next;
    char *ev_text;
    size_t n_ev_text, cap_ev_text;
};

static const char *marker_of(kiln_tool_format f) {
    switch (f) {
    case KILN_TOOL_FORMAT_HERMES:
        return "<tool_call>";
    case KILN_TOOL_FORMAT_LLAMA3:
        return "<|python_tag|>";
    case KILN_TOOL_FORMAT_MISTRAL:
        return "[TOOL_CALLS]";
    default:
        return NULL;
    }
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static bool ev_store(kiln_tool_parser *p, const char *s, size_t n, size_t *off, bool nul) {
    if (!grow((void **)&p->ev_text, &p->cap_ev_text, p->n_ev_text + n + 1, 1)) return false;
    *off = p->n_ev_text;
    if (n) memcpy(p->ev_text + p->n_ev_text, s, n);
    p->n_ev_text += n;
    if (nul) p->ev_text[p->n_ev_text++] = '\0';
    return true;
}

static bool ev_add(kiln_tool_parser *p, kiln_tool_event_type type, int32_t index, const char *s,
                   size_t n) {
    if (n == 0 && type != KILN_TOOL_EVENT_CALL) return true;
    /* merge with the previous event of the same kind and call */
    if (p->n_ev > p->ev_next) {
        tc_event *last = &p->ev[p->n_ev - 1];
        if (last->type == type && type != KILN_TOOL_EVENT_CALL && last->index == index &&
            last->off + last->len == p->n_ev_text) {
            size_t off;
            if (!ev_store(p, s, n, &off, false)) return false;
            last->len += n;
            return true;
        }
    }
    if (!grow((void **)&p->ev, &p->cap_ev, p->n_ev + 1, sizeof *p->ev)) return false;
    tc_event *e = &p->ev[p->n_ev];
    memset(e, 0, sizeof *e);
    e->type = type;
    e->index = index;
    if (!ev_store(p, s, n, &e->off, false)) return false;
    e->len = n;
    p->n_ev++;
    return true;
}

static bool content(kiln_tool_parser *p, size_t from, size_t to) {
    return to <= from || ev_add(p, KILN_TOOL_EVENT_CONTENT, -1, p->in + from, to - from);
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static bool announce(kiln_tool_parser *p) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char id[40];
    size_t n = 0;
    int k = 24;
    if (p->fmt == KILN_TOOL_FORMAT_MISTRAL) {
        k = 9;
    } else {
        memcpy(id, "call_", 5);
        n = 5;
    }
    for (int i = 0; i < k; i++) id[n++] = alnum[splitmix(&p->rng) % 62];
    if (!grow((void **)&p->ev, &p->cap_ev, p->n_ev + 1, sizeof *p->ev)) return false;
    tc_event *e = &p->ev[p->n_ev];
    memset(e, 0, sizeof *e);
    e->type = KILN_TOOL_EVENT_CALL;
    e->index = p->n_calls;
    if (!ev_store(p, id, n, &e->id_off, true) ||
        !ev_store(p, p->name, p->name_len, &e->name_off, true))
        return false;
    e->name_len = p->name_len;
    p->n_ev++;
    p->announced = true;
    return true;
}

static void call_reset(kiln_tool_parser *p) {
    free(p->name);
    free(p->args);
    p->name = p->args = NULL;
    p->name_len = p->args_len = 0;
    p->have_name = p->have_args = p->announced = false;
}

/* The call object parsed completely: its events (hold mode) or its last arguments bytes. */
static bool call_done(kiln_tool_parser *p) {
    if (!p->announced && !announce(p)) return false;
    if (p->args) {
        if (!ev_add(p, KILN_TOOL_EVENT_ARGUMENTS, p->n_calls, p->args, p->args_len)) return false;
    } else if (!p->have_args) {
        if (!ev_add(p, KILN_TOOL_EVENT_ARGUMENTS, p->n_calls, "{}", 2)) return false;
    }
    p->n_calls++;
    call_reset(p);
    return true;
}

static bool send_args(kiln_tool_parser *p);

/* Back to content at `at` (a byte position in `in`). */
static void to_text(kiln_tool_parser *p, size_t at) {
    p->state = S_TEXT;
    p->text_start = at;
    p->pos = at;
    p->in_list = false;
}

/* The markup failed at byte p->pos. */
static bool fail(kiln_tool_parser *p) {
    if (p->announced) {
        /* stream mode: the call ends with the arguments consumed; the rest is content */
        if (!send_args(p)) return false;
        p->n_calls++;
        call_reset(p);
        to_text(p, p->pos);
        return true;
    }
    call_reset(p);
    /* the marker is content; what follows it is scanned again */
    size_t resume = p->mark + p->mark_len;
    to_text(p, p->mark);
    p->pos = resume;
    p->at_start = false;
    return true;
}

/* A call object completed at p->pos (the '}' consumed): where its wrapper goes next. */
static bool obj_complete(kiln_tool_parser *p) {
    if (!p->have_name) return fail(p);
    if (p->fmt == KILN_TOOL_FORMAT_HERMES) {
        p->state = S_CLOSE;
        p->close = "</tool_call>";
        p->close_i = 0;
        return true;
    }
    p->state = S_CLOSE; /* MISTRAL: ',' or ']' in a list, else done; LLAMA3: ';' or done */
    p->close = NULL;
    return true;
}

/* The wrapper is complete up to p->pos: commit the call, continue as text (whitespace held). */
static bool group_done(kiln_tool_parser *p) {
    if (!call_done(p)) return false;
    p->state = S_AFTER;
    p->text_start = p->pos;
    p->in_list = false;
    p->at_start = false;
    return true;
}

static bool start_obj(kiln_tool_parser *p) {
    call_reset(p);
    p->state = S_OBJ_OPEN;
    return true;
}

/* Decode the JSON string body in[from..to) (escapes included) into a malloc'd string. */
static char *json_unescape(const char *s, size_t n, size_t *out_len) {
    char *q = malloc(n + 3);
    if (!q) return NULL;
    q[0] = '"';
    memcpy(q + 1, s, n);
    q[n + 1] = '"';
    json_error_t je;
    json_t *v = json_loadb(q, n + 2, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    free(q);
    if (!json_is_string(v)) {
        json_decref(v);
        return NULL;
    }
    size_t len = json_string_length(v);
    char *r = malloc(len + 1);
    if (r) {
        memcpy(r, json_string_value(v), len);
        r[len] = '\0';
        *out_len = len;
    }
    json_decref(v);
    return r;
}

/* In stream mode, send the arguments bytes consumed so far. */
static bool send_args(kiln_tool_parser *p) {
    if (!p->announced || p->state != S_OBJ_ARGS) return true;
    size_t from = p->args_sent > p->args_start ? p->args_sent : p->args_start;
    if (p->pos > from &&
        !ev_add(p, KILN_TOOL_EVENT_ARGUMENTS, p->n_calls, p->in + from, p->pos - from))
        return false;
    p->args_sent = p->pos;
    return true;
}

/* Try a marker at p->pos. 1 = matched (p->pos advanced past it), 0 = no, -1 = undecided
 * (a proper prefix at the end of the text fed so far). */
static int match_marker(kiln_tool_parser *p, const char *m) {
    size_t n = strlen(m), avail = p->n_in - p->pos;
    size_t k = avail < n ? avail : n;
    if (memcmp(p->in + p->pos, m, k) != 0) return 0;
    if (k < n) return p->finished ? 0 : -1;
    return 1;
}

/* One scanning step. Returns 0 to go on, 1 to wait for more text, -1 out of memory. */
static int step(kiln_tool_parser *p) {
    unsigned char c = (unsigned char)p->in[p->pos];
    const char *marker = marker_of(p->fmt);
    switch (p->state) {
    case S_AFTER:
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        /* a marker follows: the whitespace is dropped; else it is content */
        if (marker) {
            int r = match_marker(p, marker);
            if (r < 0) return 1;
            if (r == 0) p->state = S_TEXT;
            else p->text_start = p->pos;
        } else {
            p->state = S_TEXT;
        }
        if (p->state == S_AFTER) p->state = S_TEXT;
        return 0;
    case S_TEXT: {
        if (p->fmt == KILN_TOOL_FORMAT_LLAMA3 && p->at_start) {
            if (is_ws(c)) {
                p->pos++;
                return 0;
            }
            p->at_start = false;
            if (c == '{') { /* a bare JSON call at the start; leading whitespace dropped */
                p->mark = p->text_start; /* on failure: the whitespace and '{' are content */
                p->mark_len = p->pos + 1 - p->text_start;
                return start_obj(p) ? 0 : -1;
            }
            /* whitespace before text stays content: fall through */
        }
        if (marker && c == (unsigned char)marker[0]) {
            int r = match_marker(p, marker);
            if (r < 0) return 1;
            if (r > 0) {
                if (!content(p, p->text_start, p->pos)) return -1;
                p->mark = p->pos;
                p->mark_len = strlen(marker);
                p->pos += p->mark_len;
                p->at_start = false;
                if (p->fmt == KILN_TOOL_FORMAT_MISTRAL) {
                    p->state = S_M_OPEN;
                    return 0;
                }
                return start_obj(p) ? 0 : -1;
            }
        }
        p->pos++;
        return 0;
    }
    case S_M_OPEN:
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        if (c == '[') {
            p->in_list = true;
            p->pos++;
            return start_obj(p) ? 0 : -1;
        }
        if (c == '{') return start_obj(p) ? 0 : -1;
        return fail(p) ? 0 : -1;
    case S_OBJ_OPEN:
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        if (c != '{') return fail(p) ? 0 : -1;
        p->pos++;
        p->state = S_OBJ_KEY;
        return 0;
    case S_OBJ_KEY:
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        if (c != '"') return fail(p) ? 0 : -1;
        p->pos++;
        p->kstr_start = p->pos;
        p->esc = false;
        p->state = S_OBJ_KSTR;
        return 0;
    case S_OBJ_KSTR:
    case S_OBJ_NAME:
        if (c < 0x20) return fail(p) ? 0 : -1;
        if (p->esc) {
            p->esc = false;
        } else if (c == '\\') {
            p->esc = true;
        } else if (c == '"') {
            size_t n = 0;
            char *s = json_unescape(p->in + p->kstr_start, p->pos - p->kstr_start, &n);
            if (!s) return fail(p) ? 0 : -1; /* a bad escape */
            p->pos++;
            if (p->state == S_OBJ_NAME) {
                if (p->have_name || n == 0) {
                    free(s);
                    return fail(p) ? 0 : -1;
                }
                p->name = s;
                p->name_len = n;
                p->have_name = true;
                if (p->args && p->stream_args && !announce(p)) return -1;
                p->state = S_OBJ_NEXT;
                return 0;
            }
            if (!strcmp(s, "name")) p->key_kind = KEY_NAME;
            else if (!strcmp(s, "arguments") || !strcmp(s, "parameters")) p->key_kind = KEY_ARGS;
            else if (!strcmp(s, "id") || !strcmp(s, "type")) p->key_kind = KEY_SKIP;
            else p->key_kind = -1;
            free(s);
            if (p->key_kind < 0 || (p->key_kind == KEY_ARGS && p->have_args))
                return fail(p) ? 0 : -1;
            p->state = S_OBJ_COLON;
            return 0;
        }
        p->pos++;
        return 0;
    case S_OBJ_COLON:
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        if (c != ':') return fail(p) ? 0 : -1;
        p->pos++;
        p->state = S_OBJ_VALUE;
        return 0;
    case S_OBJ_VALUE:
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        if (p->key_kind == KEY_NAME) {
            if (c != '"') return fail(p) ? 0 : -1;
            p->pos++;
            p->kstr_start = p->pos;
            p->esc = false;
            p->state = S_OBJ_NAME;
            return 0;
        }
        jr_init(&p->j);
        if (p->key_kind == KEY_ARGS) {
            if (c != '{') return fail(p) ? 0 : -1;
            p->args_start = p->args_sent = p->pos;
            if (p->stream_args && p->have_name && !announce(p)) return -1;
            p->state = S_OBJ_ARGS;
        } else {
            p->state = S_OBJ_SKIP;
        }
        return 0;
    case S_OBJ_ARGS:
    case S_OBJ_SKIP:
        if (!jr_push(&p->j, c)) return fail(p) ? 0 : -1;
        p->pos++;
        if (!p->j.done) return 0;
        if (p->state == S_OBJ_ARGS) {
            /* jansson has the last word (lone surrogate escapes, invalid UTF-8) */
            json_error_t je;
            json_t *v = json_loadb(p->in + p->args_start, p->pos - p->args_start,
                                   JSON_ALLOW_NUL, &je);
            bool obj = json_is_object(v);
            json_decref(v);
            if (!obj) return fail(p) ? 0 : -1;
            p->have_args = true;
            if (p->announced) {
                if (!send_args(p)) return -1;
            } else {
                p->args_len = p->pos - p->args_start;
                p->args = malloc(p->args_len + 1);
                if (!p->args) return -1;
                memcpy(p->args, p->in + p->args_start, p->args_len);
            }
        }
        p->state = S_OBJ_NEXT;
        return 0;
    case S_OBJ_NEXT:
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        if (c == ',') {
            p->pos++;
            p->state = S_OBJ_KEY;
            return 0;
        }
        if (c != '}') return fail(p) ? 0 : -1;
        p->pos++;
        return obj_complete(p) ? 0 : -1;
    case S_CLOSE:
        if (p->fmt == KILN_TOOL_FORMAT_HERMES) {
            if (p->close_i == 0 && is_ws(c)) {
                p->pos++;
                return 0;
            }
            if (c != (unsigned char)p->close[p->close_i]) return fail(p) ? 0 : -1;
            p->pos++;
            if (!p->close[++p->close_i]) return group_done(p) ? 0 : -1;
            return 0;
        }
        if (is_ws(c)) {
            p->pos++;
            return 0;
        }
        if (p->fmt == KILN_TOOL_FORMAT_MISTRAL && p->in_list) {
            if (c == ',') {
                if (!call_done(p)) return -1;
                p->pos++;
                p->mark = p->pos; /* a later failure returns the rest as content */
                p->mark_len = 0;
                return start_obj(p) ? 0 : -1;
            }
            if (c == ']') {
                p->pos++;
                return group_done(p) ? 0 : -1;
            }
            return fail(p) ? 0 : -1;
        }
        if (p->fmt == KILN_TOOL_FORMAT_LLAMA3 && c == ';') {
            if (!call_done(p)) return -1;
            p->pos++;
            p->mark = p->pos;
            p->mark_len = 0;
            return start_obj(p) ? 0 : -1;
        }
        /* anything else ends the calls: it is text, scanned again */
        {
            size_t at = p->pos;
            if (!group_done(p)) return -1;
            p->pos = at;
        }
        return 0;
    }
    return 0;
}

/* Drop the bytes of `in` nobody can need again. */
static void compact(kiln_tool_parser *p) {
    size_t keep = p->state == S_TEXT || p->state == S_AFTER ? p->text_start : p->mark;
    if (keep == 0) return;
    memmove(p->in, p->in + keep, p->n_in - keep);
    p->n_in -= keep;
    p->pos -= keep;
    p->text_start = p->text_start >= keep ? p->text_start - keep : 0;
    p->mark = p->mark >= keep ? p->mark - keep : 0;
    p->args_start = p->args_start >= keep ? p->args_start - keep : 0;
    p->args_sent = p->args_sent >= keep ? p->args_sent - keep : 0;
    p->kstr_start = p->kstr_start >= keep ? p->kstr_start - keep : 0;
}

/* Scan what was fed; emit the content that is decided. */
static kiln_status run(kiln_tool_parser *p, kiln_error *err) {
    while (p->pos < p->n_in) {
        int r = step(p);
        if (r < 0) goto oom;
        if (r > 0) break;
    }
    if (!send_args(p)) goto oom;
    if (p->state == S_TEXT) {
        /* content up to a held-back marker prefix (step returned 1 there) */
        size_t to = p->pos;
        if (!(p->fmt == KILN_TOOL_FORMAT_LLAMA3 && p->at_start)) {
            if (!content(p, p->text_start, to)) goto oom;
            p->text_start = to;
        }
    }
    compact(p);
    return KILN_OK;
oom:
    p->broken = true;
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tool-call parser: out of memory");
}

kiln_status kiln_tool_parser_create(const kiln_tool_parser_params *params,
                                    kiln_tool_parser **out, kiln_error *err) {
    if (!out) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tool parser: NULL out");
    kiln_tool_parser_params d = {0};
    if (!params) params = &d;
    if ((unsigned)params->format > KILN_TOOL_FORMAT_MISTRAL)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tool parser: unknown format %d",
                              (int)params->format);
    kiln_tool_parser *p = calloc(1, sizeof *p);
    if (!p) return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tool parser: out of memory");
    p->fmt = params->format;
    p->stream_args = params->stream_arguments;
    p->rng = params->seed;
    p->at_start = true;
    p->state = S_TEXT;
    *out = p;
    return KILN_OK;
}

void kiln_tool_parser_destroy(kiln_tool_parser *p) {
    if (!p) return;
    call_reset(p);
    free(p->in);
    free(p->ev);
    free(p->ev_text);
    free(p);
}

/* Events all taken: their storage can be reused. */
static void ev_reset(kiln_tool_parser *p) {
    if (p->ev_next < p->n_ev) return;
    p->n_ev = p->ev_next = 0;
    p->n_ev_text = 0;
}

kiln_status kiln_tool_parser_feed(kiln_tool_parser *p, const char *text, size_t len,
                                  kiln_error *err) {
    if (!p || (!text && len))
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tool parser: NULL argument");
    if (p->finished || p->broken)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "tool parser: fed after finish (or after running out of memory)");
    ev_reset(p);
    if (len == 0) return KILN_OK;
    if (p->fmt == KILN_TOOL_FORMAT_NONE) {
        if (!ev_add(p, KILN_TOOL_EVENT_CONTENT, -1, text, len)) {
            p->broken = true;
            return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tool-call parser: out of memory");
        }
        return KILN_OK;
    }
    if (!grow((void **)&p->in, &p->cap_in, p->n_in + len, 1)) {
        p->broken = true;
        return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tool-call parser: out of memory");
    }
    memcpy(p->in + p->n_in, text, len);
    p->n_in += len;
    return run(p, err);
}

kiln_status kiln_tool_parser_finish(kiln_tool_parser *p, kiln_error *err) {
    if (!p) return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT, "tool parser: NULL argument");
    if (p->finished || p->broken)
        return kiln_error_set(err, KILN_ERR_INVALID_ARGUMENT,
                              "tool parser: finished twice (or after running out of memory)");
    ev_reset(p);
    p->finished = true;
    if (p->fmt == KILN_TOOL_FORMAT_NONE) return KILN_OK;
    for (int guard = 0;; guard++) {
        kiln_status st = run(p, err);
        if (st) return st;
        switch (p->state) {
        case S_TEXT:
            if (!content(p, p->text_start, p->n_in)) goto oom;
            p->text_start = p->pos = p->n_in;
            return KILN_OK;
        case S_AFTER: /* trailing whitespace after the last call: dropped */
            return KILN_OK;
        case S_CLOSE: /* the object is complete; the closing markup is missing */
            if (!call_done(p)) goto oom;
            return KILN_OK;
        default: /* inside a call: it fails at the end, and what follows is scanned again */
            if (!fail(p)) goto oom;
            break;
        }
        (void)guard;
    }
oom:
    p->broken = true;
    return kiln_error_set(err, KILN_ERR_OUT_OF_MEMORY, "tool-call parser: out of memory");
}

bool kiln_tool_parser_next(kiln_tool_parser *p, kiln_tool_event *ev) {
    if (!p || !ev || p->ev_next >= p->n_ev) return false;
    const tc_event *e = &p->ev[p->ev_next++];
    memset(ev, 0, sizeof *ev);
    ev->type = e->type;
    ev->index = e->index;
    if (e->type == KILN_TOOL_EVENT_CALL) {
        ev->id = p->ev_text + e->id_off;
        ev->name = p->ev_text + e->name_off;
        ev->name_len = e->name_len;
    } else {
        ev->text = p->ev_text + e->off;
        ev->len = e->len;
    }
    return true;
}

int32_t kiln_tool_parser_n_calls(const kiln_tool_parser *p) {
    return p ? p->n_calls : 0;
}
