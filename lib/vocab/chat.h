/* Chat templates: a user prompt (and optional system prompt) wrapped the way
 * an instruction-tuned model was trained to see it.
 *
 * Models ship their template as Jinja text (GGUF tokenizer.chat_template,
 * Hugging Face tokenizer_config.json).  We do not run Jinja: we recognise
 * the family from its markers and render a single-turn conversation
 * ending in the assistant's turn (add_generation_prompt):
 *
 *   ChatML   (<|im_start|>: SmolLM2, Qwen2)
 *            <|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nUSER<|im_end|>\n
 *            <|im_start|>assistant\n
 *            with the template's default system prompt when it has one.
 *   Llama-3  (<|start_header_id|>)
 *            <|start_header_id|>system<|end_header_id|>\n\nSYS<|eot_id|>
 *            <|start_header_id|>user<|end_header_id|>\n\nUSER<|eot_id|>
 *            <|start_header_id|>assistant<|end_header_id|>\n\n
 *   Llama-2  ([INST] and <<SYS>>)
 *            [INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST]
 *   Mistral  ([INST] without <<SYS>>)
 *            [INST] SYS\n\nUSER [/INST]
 *
 * (system parts only when there is a system prompt).  BOS is not part of
 * the text: the template says whether the conversation starts with it
 * (it mentions bos_token), and the caller adds the token.  Encode the
 * text with MKV_ENCODE_SPECIAL so the markers become their control tokens.
 */
#ifndef MKV_CHAT_H
#define MKV_CHAT_H

#include "core/mkv.h"

typedef enum {
    MKV_CHAT_CHATML = 0,
    MKV_CHAT_LLAMA3,
    MKV_CHAT_LLAMA2,
    MKV_CHAT_MISTRAL
} mkv_chat_family;

const char *mkv_chat_family_name(mkv_chat_family f);   /* "chatml", "llama3", ... */

/* Recognise the family of a template; MKV_EUNSUP for one we do not know. */
int mkv_chat_detect(const char *tmpl, mkv_chat_family *family, mkv_error *err);

/* The template's default system prompt (ChatML templates that insert one
 * when the conversation has none), malloc'd, or NULL when it has none. */
char *mkv_chat_default_system(const char *tmpl);

/* 1 when the template starts the conversation with BOS. */
int mkv_chat_wants_bos(const char *tmpl);

/* Render one user turn and the start of the assistant's turn.  system:
 * NULL for the template's default (if any), "" for none.  *out is
 * malloc'd and NUL-terminated. */
int mkv_chat_render(const char *tmpl, const char *system, const char *user, char **out,
                    mkv_error *err);

#endif
