/* Chat templates recognised by their markers (see chat.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vocab/chat.h"

const char *mkv_chat_family_name(mkv_chat_family f)
{
    switch (f) {
    case MKV_CHAT_CHATML: return "chatml";
    case MKV_CHAT_LLAMA3: return "llama3";
    case MKV_CHAT_LLAMA2: return "llama2";
    case MKV_CHAT_MISTRAL: return "mistral";
    }
    return "?";
}

int mkv_chat_detect(const char *tmpl, mkv_chat_family *family, mkv_error *err)
{
    if (!tmpl || !*tmpl)
        return mkv_fail(err, MKV_EUNSUP, "the model has no chat template");
    if (strstr(tmpl, "<|im_start|>"))
        *family = MKV_CHAT_CHATML;
    else if (strstr(tmpl, "<|start_header_id|>"))
        *family = MKV_CHAT_LLAMA3;
    else if (strstr(tmpl, "[INST]"))
        *family = strstr(tmpl, "<<SYS>>") ? MKV_CHAT_LLAMA2 : MKV_CHAT_MISTRAL;
    else
        return mkv_fail(err, MKV_EUNSUP,
                        "unknown chat template (known: ChatML <|im_start|>, Llama-3 "
                        "<|start_header_id|>, Llama-2/Mistral [INST]); give the formatted "
                        "prompt with --special instead of --chat");
    return MKV_OK;
}

int mkv_chat_wants_bos(const char *tmpl) { return tmpl && strstr(tmpl, "bos_token") != NULL; }

/* A newline as the template writes it inside a string literal: a real
 * newline, or the two characters backslash-n. */
static size_t newline_at(const char *s)
{
    if (s[0] == '\n')
        return 1;
    if (s[0] == '\\' && s[1] == 'n')
        return 2;
    return 0;
}

char *mkv_chat_default_system(const char *tmpl)
{
    static const char head[] = "<|im_start|>system";
    for (const char *p = tmpl ? strstr(tmpl, head) : NULL; p; p = strstr(p + 1, head)) {
        const char *s = p + sizeof head - 1;
        size_t nl = newline_at(s);
        if (!nl)
            continue;
        s += nl;
        const char *end = strstr(s, "<|im_end|>");
        if (!end || end == s)
            continue;
        /* A literal system prompt, not the place the conversation's own
         * system message is spliced in (quotes, +, braces). */
        if (strcspn(s, "'\"+{}") < (size_t)(end - s))
            continue;
        char *out = malloc((size_t)(end - s) + 1);
        if (!out)
            return NULL;
        size_t n = 0;
        while (s < end) {
            size_t k = newline_at(s);
            out[n++] = k ? '\n' : *s;
            s += k ? k : 1;
        }
        out[n] = '\0';
        return out;
    }
    return NULL;
}

/* Append to a growing string; returns 0 or -1 when out of memory. */
typedef struct {
    char *s;
    size_t len, cap;
} strbuf;

static int append(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int append(strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0)
        return -1;
    if (b->len + (size_t)need + 1 > b->cap) {
        size_t cap = (b->len + (size_t)need + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s)
            return -1;
        b->s = s;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)need;
    return 0;
}

int mkv_chat_render(const char *tmpl, const char *system, const char *user, char **out,
                    mkv_error *err)
{
    *out = NULL;
    mkv_chat_family fam;
    int rc = mkv_chat_detect(tmpl, &fam, err);
    if (rc)
        return rc;
    char *default_sys = NULL;
    if (!system && fam == MKV_CHAT_CHATML)
        system = default_sys = mkv_chat_default_system(tmpl);
    int has_sys = system && *system;
    strbuf b = {0};
    int bad = 0;
    switch (fam) {
    case MKV_CHAT_CHATML:
        if (has_sys)
            bad |= append(&b, "<|im_start|>system\n%s<|im_end|>\n", system);
        bad |= append(&b, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
        break;
    case MKV_CHAT_LLAMA3:
        if (has_sys)
            bad |= append(&b, "<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>", system);
        bad |= append(&b,
                      "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n", user);
        break;
    case MKV_CHAT_LLAMA2:
        if (has_sys)
            bad |= append(&b, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", system, user);
        else
            bad |= append(&b, "[INST] %s [/INST]", user);
        break;
    case MKV_CHAT_MISTRAL:
        if (has_sys)
            bad |= append(&b, "[INST] %s\n\n%s [/INST]", system, user);
        else
            bad |= append(&b, "[INST] %s [/INST]", user);
        break;
    }
    free(default_sys);
    if (bad || !b.s) {
        free(b.s);
        return mkv_fail(err, MKV_ENOMEM, "out of memory rendering the chat template");
    }
    *out = b.s;
    return MKV_OK;
}
