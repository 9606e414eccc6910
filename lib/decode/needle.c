/* Passkey retrieval: the case generator and the greedy answers. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/tensor.h"
#include "decode/needle.h"
#include "model/sampler.h"

static const char INSTRUCTION[] =
    "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the pass key.\n\n";
static const char QUESTION[] = "\n\nWhat is the pass key? The pass key is";

void mkv_needle_passkey(uint64_t seed, int64_t length, double depth, int trial, char out[8])
{
    uint64_t keys[3] = {(uint64_t)length, (uint64_t)llround(depth * 1e6), (uint64_t)trial};
    mkv_rng r;
    mkv_rng_seed_stream(&r, seed, keys, 3);
    int digits = 5 + (int)mkv_rng_below(&r, 3);
    out[0] = (char)('1' + mkv_rng_below(&r, 9));
    for (int i = 1; i < digits; i++)
        out[i] = (char)('0' + mkv_rng_below(&r, 10));
    out[digits] = '\0';
}

static int is_stop(char c) { return c == '.' || c == '!' || c == '?'; }

int mkv_needle_text(const char *filler, size_t filler_len, size_t haystack_bytes, double depth,
                    const char *passkey, char **text, size_t *needle_at, double *needle_depth, mkv_error *err)
{
    *text = NULL;
    if (filler_len == 0)
        return mkv_fail(err, MKV_EFORMAT, "the filler text is empty");
    char needle[128];
    int nl = snprintf(needle, sizeof needle, " The pass key is %s. Remember it. %s is the pass key.", passkey,
                      passkey);
    /* the haystack: the filler repeated as needed, cut back to a sentence end */
    char *hay = malloc(haystack_bytes + 1);
    if (!hay)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for a haystack of %zu bytes", haystack_bytes);
    for (size_t i = 0; i < haystack_bytes; i++)
        hay[i] = filler[i % filler_len];
    size_t h = haystack_bytes;
    while (h > 0 && !is_stop(hay[h - 1]))
        h--;
    if (h == 0)
        h = haystack_bytes;
    /* the needle goes to the sentence end nearest depth x h; the start
     * and the end of the haystack count as sentence ends */
    size_t want = (size_t)llround(depth * (double)h), at = 0, best = want;
    if (h - want < best) {
        best = h - want;
        at = h;
    }
    for (size_t i = 0; i + 1 < h; i++)
        if (is_stop(hay[i]) && isspace((unsigned char)hay[i + 1])) {
            size_t pos = i + 1, dist = pos > want ? pos - want : want - pos;
            if (dist < best) {
                best = dist;
                at = pos;
            }
        }
    size_t n1 = sizeof INSTRUCTION - 1, n2 = sizeof QUESTION - 1;
    size_t total = n1 + h + (size_t)nl + n2;
    char *t = malloc(total + 1);
    if (!t) {
        free(hay);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for a prompt of %zu bytes", total);
    }
    memcpy(t, INSTRUCTION, n1);
    memcpy(t + n1, hay, at);
    memcpy(t + n1 + at, needle, (size_t)nl);
    memcpy(t + n1 + at + nl, hay + at, h - at);
    memcpy(t + n1 + h + nl, QUESTION, n2);
    t[total] = '\0';
    free(hay);
    *text = t;
    *needle_at = n1 + at;
    *needle_depth = h ? (double)at / (double)h : 0.0;
    return MKV_OK;
}

/* One try: the prompt of hay filler bytes into out (text and tokens). */
static int build_try(const mkv_loaded_model *lm, const char *model_path, const mkv_prompt_opts *o,
                     const char *filler, size_t filler_len, size_t hay, double depth, mkv_needle_case *out,
                     mkv_error *err)
{
    char *text;
    int rc = mkv_needle_text(filler, filler_len, hay, depth, out->passkey, &text, &out->needle_at,
                             &out->needle_depth, err);
    if (rc)
        return rc;
    mkv_prompt_opts po = *o;
    po.text = text;
    free(out->prompt.tokens);
    memset(&out->prompt, 0, sizeof out->prompt);
    free(out->text);
    out->text = text;
    return mkv_prompt_tokens(lm, model_path, &po, &out->prompt, err);
}

int mkv_needle_build(const mkv_loaded_model *lm, const char *model_path, const mkv_prompt_opts *po,
                     const char *filler, size_t filler_len, int64_t tokens, uint64_t seed, int64_t length,
                     double depth, int trial, mkv_needle_case *out, mkv_error *err)
{
    memset(out, 0, sizeof *out);
    mkv_needle_passkey(seed, length, depth, trial, out->passkey);
    mkv_prompt_opts o = *po;
    o.file = NULL;
    o.token_ids = NULL;
    /* size the haystack by the bytes per token the last tries came to,
     * aiming at the middle of [tokens - slack, tokens]; sentence ends make
     * the count jump, so the longest try that fits is kept */
    int64_t slack = tokens / 100 > 8 ? tokens / 100 : 8, aim = tokens - slack / 2;
    size_t hay = (size_t)(4 * (aim > 1 ? aim : 1)), best_hay = 0, prev_hay = 0;
    int64_t best_got = -1, prev_got = -1;
    int rc = MKV_OK;
    for (int round = 0; round < 12; round++) {
        if ((rc = build_try(lm, model_path, &o, filler, filler_len, hay, depth, out, err)))
            return rc;
        int64_t got = (int64_t)out->prompt.n;
        if (got <= tokens && got > best_got) {
            best_got = got;
            best_hay = hay;
        }
        if (got <= tokens && got >= tokens - slack)
            return MKV_OK;
        /* bytes per token: the secant through the last two tries once
         * there are two, the plain ratio before */
        double per_token = prev_got >= 0 && prev_got != got ? ((double)hay - (double)prev_hay) / (double)(got - prev_got)
                                                            : (double)hay / (double)(got > 1 ? got : 1);
        if (!(per_token > 0))
            per_token = (double)hay / (double)(got > 1 ? got : 1);
        prev_hay = hay;
        prev_got = got;
        double next = (double)hay + (double)(aim - got) * per_token;
        size_t h = next > 1 ? (size_t)next : 1;
        if (h == hay)   /* stuck on one sentence end: step past it */
            h = got > tokens ? hay - hay / 50 - 1 : hay + hay / 50 + 1;
        hay = h;
    }
    if (best_got < 0) {
        free(out->prompt.tokens);
        free(out->text);
        memset(out, 0, sizeof *out);
        return mkv_fail(err, MKV_EFORMAT, "cannot fit a passkey prompt in %lld tokens", (long long)tokens);
    }
    rc = build_try(lm, model_path, &o, filler, filler_len, best_hay, depth, out, err);
    return rc;
}

int mkv_needle_correct(const char *answer, const char *passkey)
{
    const char *a = answer;
    while (*a && !isdigit((unsigned char)*a))
        a++;
    size_t n = 0;
    while (isdigit((unsigned char)a[n]))
        n++;
    return n == strlen(passkey) && strncmp(a, passkey, n) == 0;
}

static int greedy(mkv_decoder *d, const float *first, int V, int max_new, int eos, float *logits, int32_t *out,
                  int *n, mkv_error *err)
{
    *n = 0;
    int tok = mkv_argmax(first, V);
    for (int i = 0; i < max_new; i++) {
        if (tok == eos)
            break;
        out[(*n)++] = tok;
        if (i + 1 == max_new)
            break;
        int rc = mkv_decoder_step(d, tok, logits, err);
        if (rc)
            return rc;
        tok = mkv_argmax(logits, V);
    }
    return MKV_OK;
}

int mkv_needle_answer(const mkv_model *m, const int32_t *prompt, size_t n_prompt, const mkv_decoder_opts *o,
                      int max_new, int eos, int32_t *answer, int *n, int32_t *answer_full, int *n_full,
                      mkv_error *err)
{
    int V = m->cfg.vocab_size;
    float *logits = mkv_alloc((size_t)V, 2 * sizeof(float), "logits", err);
    if (!logits)
        return MKV_ENOMEM;
    float *first = logits + V;
    mkv_decoder_opts fo = *o;
    fo.method = NULL;
    fo.max_new = max_new;
    mkv_decoder_opts mo = *o;
    mo.max_new = max_new;
    mkv_decoder *full = NULL, *dec = NULL;
    int compressed = o->method && strcmp(o->method->name, "full") != 0;
    int rc = mkv_decoder_prefill(m, prompt, (int64_t)n_prompt, &fo, first, &full, err);
    /* a GPU decoder does not fork: the method gets a prefill of its own
     * (the same full-attention pass, so the same first logits) */
    if (!rc && compressed)
        rc = o->gpu ? mkv_decoder_prefill(m, prompt, (int64_t)n_prompt, &mo, NULL, &dec, err)
                    : mkv_decoder_fork(full, &mo, &dec, err);
    if (!rc && compressed)
        rc = greedy(dec, first, V, max_new, eos, logits, answer, n, err);
    if (!rc && (answer_full || !compressed)) {
        int32_t *dst = compressed ? answer_full : answer;
        int *dn = compressed ? n_full : n;
        rc = greedy(full, first, V, max_new, eos, logits, dst, dn, err);
        if (!rc && !compressed && answer_full) {
            memcpy(answer_full, answer, (size_t)*n * sizeof *answer);
            *n_full = *n;
        }
    }
    mkv_decoder_free(dec);
    mkv_decoder_free(full);
    mkv_free(logits);
    return rc;
}
