/*
 * test_api_shared.c - the public API as an outside program sees it: only <kiln.h>, linked
 * against the shared libkiln (not kiln's object libraries). Loads stories260K (f32 GGUF)
 * and checks that greedy generation from llama2.c's prompt ids reproduces llama2.c run.c's
 * tokens (../shared/golden/llama2c-greedy.json), streamed as TOKEN events in order and
 * finished with "length" and the right usage; that kiln_model_detokenize of a case's ids
 * spells run.c's printed text; and the accessors (BOS = the goldens' first prompt id, EOS an
 * end-of-generation id, no chat template in this file, the engine's resolved n_ctx = the
 * model's training context); the chat template API (this model has none: ChatML with the
 * model's BOS text, the reason given; a source of one's own; errors) and the generation
 * defaults (none in a GGUF file).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln.h>

#include "test.h"

enum { MAX_GEN = 40 };

int main(void) {
    const char *model_path = kiln_test_shared("models/stories260K/stories260K-f32.gguf");
    const char *golden_path = kiln_test_shared("golden/llama2c-greedy.json");
    kiln_test_require_file(model_path);
    kiln_test_require_file(golden_path);
    json_error_t je;
    json_t *golden = json_load_file(golden_path, 0, &je);
    REQUIRE(golden != NULL);

    kiln_error err = {0};
    kiln_model *m = NULL;
    REQUIRE(kiln_model_load(model_path, NULL, &m, &err) == KILN_OK);
    CHECK(kiln_model_n_vocab(m) == 512);
    kiln_engine *e = NULL;
    REQUIRE(kiln_engine_create(m, NULL, &e, &err) == KILN_OK);
    kiln_engine_params ep;
    kiln_engine_get_params(e, &ep);
    CHECK(kiln_model_n_ctx_train(m) > 0 && ep.n_ctx == kiln_model_n_ctx_train(m));
    CHECK(ep.n_threads >= 1 && ep.step_tokens >= 1);
    CHECK(ep.block_size > 0 && ep.kv_tokens > 0 && ep.kv_tokens % ep.block_size == 0);
    CHECK(ep.kv_memory > 0);
    CHECK(!kiln_model_is_eog(NULL, 0));
    CHECK(kiln_model_eos(m) >= 0 && kiln_model_is_eog(m, kiln_model_eos(m)));
    CHECK(!kiln_model_is_eog(m, kiln_model_bos(m)));
    CHECK(kiln_model_chat_template(m) == NULL);
    CHECK(kiln_model_bos(NULL) == -1 && kiln_model_chat_template(NULL) == NULL);
    CHECK(kiln_model_has_tokenizer(m) && !kiln_model_has_tokenizer(NULL));
    kiln_generation_defaults gd;
    kiln_model_generation_defaults(m, &gd);
    CHECK(!gd.has_temperature && !gd.has_top_p && !gd.has_top_k && !gd.has_min_p &&
          !gd.has_repetition_penalty && !gd.has_do_sample);
    kiln_chat_template *ct = NULL;
    REQUIRE(kiln_chat_template_create(m, NULL, &ct, &err) == KILN_OK);
    CHECK(kiln_chat_template_fallback(ct) &&
          !strcmp(kiln_chat_template_fallback(ct), "the model has no chat template"));
    kiln_chat_input ci = {.messages_json = "[{\"role\":\"user\",\"content\":\"hi\"}]",
                          .add_generation_prompt = true};
    char *txt = NULL;
    size_t txt_len = 0;
    REQUIRE(kiln_chat_template_render(ct, &ci, &txt, &txt_len, &err) == KILN_OK);
    CHECKF(!strcmp(txt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") &&
               txt_len == strlen(txt),
           "ChatML render: '%s'", txt);
    kiln_free(txt);
    ci.messages_json = "{}";
    CHECK(kiln_chat_template_render(ct, &ci, &txt, &txt_len, &err) == KILN_ERR_INVALID_ARGUMENT);
    kiln_chat_template_destroy(ct);
    kiln_chat_template_params tp = {.source = "{{ bos_token }}{{ raise_exception('no ' + "
                                              "messages[0].role) }}"};
    REQUIRE(kiln_chat_template_create(m, &tp, &ct, &err) == KILN_OK);
    CHECK(kiln_chat_template_fallback(ct) == NULL);
    ci.messages_json = "[{\"role\":\"tool\",\"content\":\"x\"}]";
    CHECK(kiln_chat_template_render(ct, &ci, &txt, &txt_len, &err) == KILN_ERR_INVALID_ARGUMENT);
    CHECKF(!strcmp(err.message, "no tool"), "raise_exception message: '%s'", err.message);
    kiln_chat_template_destroy(ct);
    kiln_chat_template_destroy(NULL);
    tp.source = "{% if %}";
    CHECK(kiln_chat_template_create(m, &tp, &ct, &err) == KILN_ERR_FORMAT && ct == NULL);
    size_t nt = 0;
    int32_t bad_id = 512;
    CHECK(kiln_model_detokenize(m, &bad_id, 1, NULL, 0, &nt, &err) == KILN_ERR_INVALID_ARGUMENT);

    int cases = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(golden, "cases"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "model")), "stories260K") != 0) continue;
        json_t *pj = json_object_get(c, "prompt_ids"), *gj = json_object_get(c, "generated_ids");
        int32_t prompt[256];
        int32_t np = (int32_t)json_array_size(pj);
        REQUIRE(np > 0 && np <= 256);
        for (int32_t k = 0; k < np; k++)
            prompt[k] = (int32_t)json_integer_value(json_array_get(pj, (size_t)k));
        CHECK(prompt[0] == kiln_model_bos(m));
        const char *ptext = json_string_value(json_object_get(c, "prompt"));
        bool ascii = true;
        for (const char *q = ptext; *q; q++) ascii &= (unsigned char)*q < 0x80;
        /* the case's whole text, as run.c printed it (run.c adds a final newline; its
         * safe_printf drops byte-fallback pieces that are not printable ASCII, so only ASCII
         * prompts are compared) */
        if (ascii) {
            int32_t ng = (int32_t)json_array_size(gj), all[512];
            REQUIRE(np + ng <= 512);
            memcpy(all, prompt, (size_t)np * sizeof *all);
            for (int32_t k = 0; k < ng; k++)
                all[np + k] = (int32_t)json_integer_value(json_array_get(gj, (size_t)k));
            static char text[8192];
            size_t tl = 0;
            REQUIRE(kiln_model_detokenize(m, all, np + ng, text, sizeof text, &tl, &err) ==
                    KILN_OK);
            const char *want_text = json_string_value(json_object_get(c, "stdout"));
            size_t wl = strlen(want_text);
            if (wl > 0 && want_text[wl - 1] == '\n' && (tl == 0 || text[tl - 1] != '\n')) wl--;
            CHECKF(tl == wl && memcmp(text, want_text, wl) == 0,
                   "case %zu: detokenized text differs from run.c's output (%zu vs %zu bytes)", i,
                   tl, wl);
            size_t t2 = 0; /* a short buffer gets a prefix and the full length */
            char small[5];
            REQUIRE(kiln_model_detokenize(m, all, np + ng, small, sizeof small, &t2, &err) ==
                    KILN_OK);
            CHECK(t2 == tl && memcmp(small, text, sizeof small) == 0);
        }
        int32_t want = (int32_t)json_array_size(gj);
        if (want > MAX_GEN) want = MAX_GEN;
        if (want < 1) continue;
        kiln_request r = kiln_request_defaults();
        r.prompt_ids = prompt;
        r.n_prompt_ids = np;
        r.max_tokens = want;
        r.temperature = 0.0f;
        r.ignore_eos = true;
        kiln_stream *s = NULL;
        REQUIRE(kiln_engine_submit(e, &r, &s, &err) == KILN_OK);
        int32_t got = 0, bad = 0;
        kiln_event ev;
        do {
            REQUIRE(kiln_stream_next(s, -1, &ev, &err) == KILN_OK);
            if (ev.type == KILN_EVENT_TOKEN) {
                CHECK(ev.index == got);
                int32_t w =
                    got < want ? (int32_t)json_integer_value(json_array_get(gj, (size_t)got)) : -1;
                if (ev.token != w && bad++ == 0)
                    fprintf(stderr, "case %zu: token %d is %d, llama2.c %d\n", i, got, ev.token, w);
                got++;
            }
        } while (ev.type != KILN_EVENT_FINISH);
        CHECKF(bad == 0, "case %zu: %d of %d tokens differ from llama2.c", i, bad, got);
        CHECK(got == want);
        CHECK(ev.finish_reason == KILN_FINISH_LENGTH);
        CHECK(strcmp(kiln_finish_reason_name(ev.finish_reason), "length") == 0);
        CHECK(ev.usage.prompt_tokens == np && ev.usage.completion_tokens == want);
        kiln_stream_destroy(s);
        cases++;
    }
    CHECKF(cases >= 3, "only %d stories260K cases in the golden file", cases);
    kiln_engine_destroy(e);
    kiln_model_free(m);
    json_decref(golden);
    return kiln_test_finish("test_api_shared");
}
