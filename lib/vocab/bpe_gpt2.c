/* GPT-2-style byte-level BPE: byte<->unicode spelling, hand-written
 * pre-tokenizers, merges by rank.  See bpe_gpt2.h for the rules. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/heap.h"
#include "vocab/bpe_gpt2.h"
#include "vocab/bpe_gpt2_tables_priv.h"

/* ------------------------------------------------------------ byte spelling */

/* GPT-2 spells the printable Latin-1 bytes ('!'..'~', 0xA1..0xAC,
 * 0xAE..0xFF) as themselves and the other 68 bytes, in increasing order, as
 * U+0100, U+0101, ...; so every byte is a visible character. */
static int byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

unsigned mkv_bpe_gpt2_byte_char(unsigned char b)
{
    if (byte_is_printable(b))
        return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        n += !byte_is_printable(x);
    return 0x100 + n;
}

#define N_BYTE_CHARS (0x100 + 68)

/* ------------------------------------------------------------ UTF-8 */

/* Decode one character of s[0..len): its code point in *cp and its length.
 * A byte that does not start a valid, shortest-form UTF-8 sequence is one
 * character of its own with *cp = UINT32_MAX. */
static size_t utf8_next(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned c = s[0];
    size_t need;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        need = 1, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        need = 2, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        need = 3, v = c & 0x07, min = 0x10000;
    } else {
        *cp = UINT32_MAX;
        return 1;
    }
    if (len < need + 1) {
        *cp = UINT32_MAX;
        return 1;
    }
    for (size_t i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = UINT32_MAX;
            return 1;
        }
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = UINT32_MAX;
        return 1;
    }
    *cp = v;
    return need + 1;
}

static size_t utf8_put(uint32_t cp, char *dst)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | cp >> 6);
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | cp >> 12);
        dst[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | cp >> 18);
    dst[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    dst[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------------------ character classes */

enum { CLS_OTHER = 0, CLS_LETTER = 1, CLS_NUMBER = 2, CLS_SPACE = 3 };

/* Unicode White_Space (what \s matches in the regex engines of Hugging
 * Face tokenizers and llama.cpp). */
static int is_white_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int char_class(uint32_t c)
{
    if (c == UINT32_MAX)
        return CLS_OTHER;
    if (is_white_space(c))
        return CLS_SPACE;
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            return CLS_LETTER;
        return c >= '0' && c <= '9' ? CLS_NUMBER : CLS_OTHER;
    }
    size_t lo = 0, hi = sizeof mkv_unicode_classes / sizeof mkv_unicode_classes[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (mkv_unicode_classes[mid].last < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < sizeof mkv_unicode_classes / sizeof mkv_unicode_classes[0] &&
        mkv_unicode_classes[lo].first <= c)
        return mkv_unicode_classes[lo].cls;
    return CLS_OTHER;
}

/* ------------------------------------------------------------ pre-tokenizers */

typedef enum { PRE_GPT2, PRE_SMOLLM, PRE_LLAMA3, PRE_QWEN2 } pre_kind;

static const struct {
    const char *name;
    pre_kind kind;
} PRE_NAMES[] = {
    {"gpt2", PRE_GPT2}, {"gpt-2", PRE_GPT2}, {"phi-2", PRE_GPT2}, {"mpt", PRE_GPT2},
    {"olmo", PRE_GPT2},
    {"smollm", PRE_SMOLLM}, {"starcoder", PRE_SMOLLM}, {"refact", PRE_SMOLLM},
    {"command-r", PRE_SMOLLM}, {"codeshell", PRE_SMOLLM}, {"exaone", PRE_SMOLLM},
    {"minerva", PRE_SMOLLM}, {"minerva-7b", PRE_SMOLLM},
    {"llama3", PRE_LLAMA3}, {"llama-v3", PRE_LLAMA3}, {"llama-bpe", PRE_LLAMA3},
    {"dbrx", PRE_LLAMA3}, {"smaug-bpe", PRE_LLAMA3},
    {"qwen2", PRE_QWEN2}, {"deepseek-r1-qwen", PRE_QWEN2}, {"stablelm2", PRE_QWEN2},
    {"megrez", PRE_QWEN2},
};

static int find_pre(const char *name, pre_kind *kind)
{
    if (!name)
        name = "gpt2";
    for (size_t i = 0; i < sizeof PRE_NAMES / sizeof PRE_NAMES[0]; i++) {
        if (strcmp(PRE_NAMES[i].name, name) == 0) {
            *kind = PRE_NAMES[i].kind;
            return 1;
        }
    }
    return 0;
}

int mkv_bpe_gpt2_pre_known(const char *pre)
{
    pre_kind k;
    return find_pre(pre, &k);
}

const char *mkv_bpe_gpt2_pre_for_regex(const char *regex, int individual_digits)
{
    if (!regex)
        return NULL;
    if (strcmp(regex, MKV_BPE_REGEX_GPT2) == 0)
        return individual_digits ? "smollm" : "gpt2";
    if (individual_digits)
        return NULL;
    if (strcmp(regex, MKV_BPE_REGEX_LLAMA3) == 0)
        return "llama3";
    if (strcmp(regex, MKV_BPE_REGEX_QWEN2) == 0)
        return "qwen2";
    return NULL;
}

/* The text as characters: code point, class, and byte offset of each
 * (off[n] = the text's length). */
typedef struct {
    uint32_t *cp;
    unsigned char *cls;
    size_t *off;
    size_t n;
} chars;

static void chars_free(chars *c)
{
    free(c->cp);
    free(c->cls);
    free(c->off);
}

static int chars_decode(const char *text, size_t len, chars *c, mkv_error *err)
{
    memset(c, 0, sizeof *c);
    if (len >= SIZE_MAX / sizeof(size_t) - 1)
        return mkv_fail(err, MKV_ENOMEM, "text of %zu bytes is too long to tokenize", len);
    c->cp = malloc((len + 1) * sizeof *c->cp);
    c->cls = malloc(len + 1);
    c->off = malloc((len + 1) * sizeof *c->off);
    if (!c->cp || !c->cls || !c->off) {
        chars_free(c);
        return mkv_fail(err, MKV_ENOMEM, "out of memory tokenizing %zu bytes", len);
    }
    const unsigned char *s = (const unsigned char *)text;
    size_t at = 0;
    while (at < len) {
        uint32_t cp;
        size_t k = utf8_next(s + at, len - at, &cp);
        c->cp[c->n] = cp;
        c->cls[c->n] = (unsigned char)char_class(cp);
        c->off[c->n] = at;
        c->n++;
        at += k;
    }
    c->off[c->n] = len;
    return MKV_OK;
}

static int is_cr_lf(uint32_t c) { return c == '\r' || c == '\n'; }

static uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Length of the contraction 's 't 're 've 'm 'll 'd at i, or 0. */
static size_t contraction(const chars *c, size_t i, size_t n, int any_case)
{
    if (c->cp[i] != '\'' || i + 1 >= n)
        return 0;
    uint32_t a = c->cp[i + 1], b = i + 2 < n ? c->cp[i + 2] : 0;
    if (any_case) {
        a = ascii_lower(a);
        b = ascii_lower(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

static size_t run_of(const chars *c, size_t i, size_t n, int cls)
{
    while (i < n && c->cls[i] == cls)
        i++;
    return i;
}

/* \s+(?!\S)|\s+ at i (a whitespace character): the run, less its last
 * character when a non-space follows and the run is longer than one. */
static size_t whitespace_tail(const chars *c, size_t i, size_t n)
{
    size_t r = run_of(c, i, n, CLS_SPACE);
    if (r == n || r - i == 1)
        return r;
    return r - 1;
}

/* End of the pre-token that starts at i < n under the GPT-2 rules. */
static size_t match_gpt2(const chars *c, size_t i, size_t n)
{
    size_t k = contraction(c, i, n, 0);
    if (k)
        return i + k;
    /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': a space joins what follows */
    size_t j = i + (c->cp[i] == ' ' && i + 1 < n && c->cls[i + 1] != CLS_SPACE);
    if (c->cls[j] != CLS_SPACE)
        return run_of(c, j, n, c->cls[j]);
    return whitespace_tail(c, i, n);
}

/* End of the pre-token at i under the LLaMA-3 rules (max_digits 3) or the
 * Qwen2 rules (max_digits 1). */
static size_t match_llama3(const chars *c, size_t i, size_t n, size_t max_digits)
{
    size_t k = contraction(c, i, n, 1);
    if (k)
        return i + k;
    int cls = c->cls[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (cls == CLS_LETTER)
        return run_of(c, i, n, CLS_LETTER);
    if (cls != CLS_NUMBER && !is_cr_lf(c->cp[i]) && i + 1 < n && c->cls[i + 1] == CLS_LETTER)
        return run_of(c, i + 1, n, CLS_LETTER);
    /* \p{N}{1,max} */
    if (cls == CLS_NUMBER) {
        size_t j = i;
        while (j < n && j - i < max_digits && c->cls[j] == CLS_NUMBER)
            j++;
        return j;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = i + (c->cp[i] == ' ' && i + 1 < n && c->cls[i + 1] == CLS_OTHER);
    if (c->cls[j] == CLS_OTHER) {
        j = run_of(c, j, n, CLS_OTHER);
        while (j < n && is_cr_lf(c->cp[j]))
            j++;
        return j;
    }
    /* \s*[\r\n]+: the whitespace run up to its last line break */
    size_t r = run_of(c, i, n, CLS_SPACE);
    for (size_t m = r; m > i; m--) {
        if (is_cr_lf(c->cp[m - 1]))
            return m;
    }
    return whitespace_tail(c, i, n);
}

typedef int (*piece_fn)(void *user, size_t start, size_t end, mkv_error *err);

/* Call fn with the byte range of each pre-token of c, in order. */
static int pretokenize(pre_kind kind, const chars *c, piece_fn fn, void *user, mkv_error *err)
{
    size_t n = c->n;
    size_t stop = 0; /* PRE_SMOLLM: the first digit at or after i, or n */
    int rc;
    for (size_t i = 0; i < n;) {
        size_t end;
        if (kind == PRE_SMOLLM) {
            /* \p{N} first: each digit alone; the GPT-2 rules see the text
             * between digits as separate fragments. A fragment's pieces
             * share its end, found once per fragment. */
            if (c->cls[i] == CLS_NUMBER) {
                end = i + 1;
            } else {
                if (stop <= i) {
                    stop = i;
                    while (stop < n && c->cls[stop] != CLS_NUMBER)
                        stop++;
                }
                end = match_gpt2(c, i, stop);
            }
        } else if (kind == PRE_GPT2) {
            end = match_gpt2(c, i, n);
        } else {
            end = match_llama3(c, i, n, kind == PRE_LLAMA3 ? 3 : 1);
        }
        if ((rc = fn(user, c->off[i], c->off[end], err)))
            return rc;
        i = end;
    }
    return MKV_OK;
}

typedef struct {
    size_t *ends;
    size_t n, cap;
} ends_buf;

static int collect_end(void *user, size_t start, size_t end, mkv_error *err)
{
    (void)start;
    ends_buf *b = user;
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        size_t *p = cap < SIZE_MAX / sizeof *p ? realloc(b->ends, cap * sizeof *p) : NULL;
        if (!p)
            return mkv_fail(err, MKV_ENOMEM, "out of memory pre-tokenizing");
        b->ends = p;
        b->cap = cap;
    }
    b->ends[b->n++] = end;
    return MKV_OK;
}

int mkv_bpe_gpt2_pretokenize(const char *pre, const char *text, size_t len, size_t **ends,
                             size_t *n, mkv_error *err)
{
    *ends = NULL;
    *n = 0;
    pre_kind kind;
    if (!find_pre(pre, &kind))
        return mkv_fail(err, MKV_EUNSUP, "unknown pre-tokenizer '%s'", pre);
    chars c;
    int rc = chars_decode(text, len, &c, err);
    if (rc)
        return rc;
    ends_buf b = {0};
    rc = pretokenize(kind, &c, collect_end, &b, err);
    chars_free(&c);
    if (rc) {
        free(b.ends);
        return rc;
    }
    *ends = b.ends;
    *n = b.n;
    return MKV_OK;
}

/* ------------------------------------------------------------ merges */

typedef struct {
    uint64_t key;   /* left id << 32 | right id */
    int32_t rank;   /* -1: empty slot */
    int32_t result; /* id of the merged piece */
} merge_slot;

typedef struct {
    pre_kind pre;
    int ignore_merges;           /* whole pre-tokens in the vocabulary skip merging */
    int32_t byte_token[256];     /* token spelled by byte b's character */
    uint32_t byte_char[256];     /* GPT-2's character for byte b */
    int16_t char_byte[N_BYTE_CHARS]; /* inverse, -1 for other characters */
    merge_slot *merges;
    size_t mask;                 /* slots - 1 (a power of two) */
} bpe_impl;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static const merge_slot *find_merge(const bpe_impl *b, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (size_t i = mix(key) & b->mask;; i = (i + 1) & b->mask) {
        const merge_slot *s = &b->merges[i];
        if (s->rank < 0)
            return NULL;
        if (s->key == key)
            return s;
    }
}

/* Insert unless present (the first occurrence, the higher priority, wins). */
static void add_merge(bpe_impl *b, int32_t left, int32_t right, int32_t rank, int32_t result)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (size_t i = mix(key) & b->mask;; i = (i + 1) & b->mask) {
        merge_slot *s = &b->merges[i];
        if (s->rank < 0) {
            *s = (merge_slot){key, rank, result};
            return;
        }
        if (s->key == key)
            return;
    }
}

static void impl_free(void *p)
{
    bpe_impl *b = p;
    if (b)
        free(b->merges);
    free(b);
}

/* ------------------------------------------------------------ encoding */

typedef struct {
    int32_t rank;
    int32_t left, right;        /* symbol indices */
    int32_t left_id, right_id;  /* their ids when pushed, to spot stale pairs */
    int32_t result;
} pair;

typedef struct {
    int32_t id;
    int32_t prev, next;
} symbol;

static int pair_before(const pair *a, const pair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

MKV_HEAP_DEFINE(heap, pair, pair_before)

typedef struct {
    const mkv_tokenizer *t;
    const bpe_impl *b;
    const char *text;
    mkv_idbuf *out;
    /* Scratch for one pre-token of up to `cap` bytes, grown on demand
     * (pre-tokens are short but may be as long as the text): */
    size_t cap;
    symbol *sym;        /* one per byte */
    heap heap;          /* each merge pushes at most two pairs after the
                           first n - 1: 3 per byte */
    char *spelled;      /* ignore_merges: the piece spelled, 2 per byte */
} encoder;

static int reserve(encoder *e, size_t n, mkv_error *err)
{
    if (n <= e->cap)
        return MKV_OK;
    size_t cap = n > 2 * e->cap ? n : 2 * e->cap;
    symbol *sym = realloc(e->sym, cap * sizeof *sym);
    if (sym)
        e->sym = sym;
    pair *items = realloc(e->heap.items, 3 * cap * sizeof *items);
    if (items)
        e->heap.items = items;
    char *spelled = realloc(e->spelled, 2 * cap);
    if (spelled)
        e->spelled = spelled;
    if (!sym || !items || !spelled)
        return mkv_fail(err, MKV_ENOMEM, "out of memory tokenizing a piece of %zu bytes", n);
    e->cap = cap;
    return MKV_OK;
}

static void consider(encoder *e, int32_t left)
{
    if (left < 0 || e->sym[left].next < 0)
        return;
    int32_t right = e->sym[left].next;
    const merge_slot *m = find_merge(e->b, e->sym[left].id, e->sym[right].id);
    if (m)
        heap_push(&e->heap, (pair){m->rank, left, right, e->sym[left].id, e->sym[right].id, m->result});
}

/* BPE on one pre-token text[start, end). */
static int encode_piece(void *user, size_t start, size_t end, mkv_error *err)
{
    encoder *e = user;
    const unsigned char *s = (const unsigned char *)e->text + start;
    int32_t n = (int32_t)(end - start);
    int rc = reserve(e, (size_t)n, err);
    if (rc)
        return rc;
    if (e->b->ignore_merges) {
        size_t len = 0;
        for (int32_t i = 0; i < n; i++)
            len += utf8_put(e->b->byte_char[s[i]], e->spelled + len);
        int id = mkv_tokenizer_lookup(e->t, e->spelled, len);
        if (id >= 0)
            return mkv_idbuf_push(e->out, id, err);
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t id = e->b->byte_token[s[i]];
        if (id < 0 && (id = e->t->unk_id) < 0)
            return mkv_fail(err, MKV_EFORMAT, "cannot encode byte 0x%02x at offset %zu: the "
                            "vocabulary has no token for it and no unknown token", s[i],
                            start + (size_t)i);
        e->sym[i] = (symbol){id, i - 1, i + 1 < n ? i + 1 : -1};
    }
    e->heap.n = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        consider(e, i);
    while (e->heap.n > 0) {
        pair p = heap_pop(&e->heap);
        symbol *l = &e->sym[p.left], *r = &e->sym[p.right];
        if (l->id != p.left_id || l->next != p.right || r->id != p.right_id)
            continue; /* a neighbour merged since this pair was pushed */
        l->id = p.result;
        l->next = r->next;
        if (r->next >= 0)
            e->sym[r->next].prev = p.left;
        r->id = -1;
        consider(e, l->prev);
        consider(e, p.left);
    }
    for (int32_t i = 0; i >= 0 && rc == MKV_OK; i = e->sym[i].next)
        rc = mkv_idbuf_push(e->out, e->sym[i].id, err);
    return rc;
}

static int bpe_encode(const mkv_tokenizer *t, const char *text, size_t len, int at_start,
                      mkv_idbuf *out, mkv_error *err)
{
    (void)at_start;
    if (len == 0)
        return MKV_OK;
    if (len > (size_t)INT32_MAX / 2)
        return mkv_fail(err, MKV_EUSAGE, "text of %zu bytes is too long to tokenize", len);
    const bpe_impl *b = t->impl;
    chars c;
    int rc = chars_decode(text, len, &c, err);
    if (rc)
        return rc;
    encoder e = {t, b, text, out, 0, NULL, {NULL, 0}, NULL};
    rc = pretokenize(b->pre, &c, encode_piece, &e, err);
    free(e.sym);
    free(e.heap.items);
    free(e.spelled);
    chars_free(&c);
    return rc;
}

/* ------------------------------------------------------------ decoding */

static size_t bpe_piece_bytes(const mkv_tokenizer *t, int id, char *dst)
{
    const bpe_impl *b = t->impl;
    const mkv_token *tok = &t->tokens[id];
    if (tok->type != MKV_TOKEN_NORMAL) {
        memcpy(dst, tok->text, tok->len);
        return tok->len;
    }
    /* Each character maps back to its byte; a character outside GPT-2's
     * table (a malformed vocabulary) is copied as it is. */
    const unsigned char *s = (const unsigned char *)tok->text;
    size_t n = 0;
    for (size_t i = 0; i < tok->len;) {
        uint32_t cp;
        size_t k = utf8_next(s + i, tok->len - i, &cp);
        if (cp < N_BYTE_CHARS && b->char_byte[cp] >= 0) {
            dst[n++] = (char)b->char_byte[cp];
        } else {
            memcpy(dst + n, s + i, k);
            n += k;
        }
        i += k;
    }
    return n;
}

const mkv_tokenizer_ops mkv_bpe_gpt2_ops = {"gpt2-bpe", bpe_encode, bpe_piece_bytes, impl_free};

/* ------------------------------------------------------------ building */

static int build_merges(mkv_tokenizer *t, bpe_impl *b, const char *const *merges, size_t n_merges,
                        mkv_error *err)
{
    if (n_merges > (size_t)INT32_MAX / 4)
        return mkv_fail(err, MKV_EFORMAT, "%zu merges is too many", n_merges);
    size_t slots = 16;
    while (slots < 2 * n_merges)
        slots *= 2;
    b->merges = malloc(slots * sizeof *b->merges);
    if (!b->merges)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for %zu merges", n_merges);
    for (size_t i = 0; i < slots; i++)
        b->merges[i].rank = -1;
    b->mask = slots - 1;
    char *joined = NULL;
    size_t joined_cap = 0;
    int rc = MKV_OK;
    for (size_t i = 0; i < n_merges && rc == MKV_OK; i++) {
        const char *m = merges[i];
        if (!m) {
            rc = mkv_fail(err, MKV_EFORMAT, "merge %zu is missing", i);
            break;
        }
        /* The separator is the first space after the first byte (a piece in
         * byte-level spelling never contains a space). */
        const char *sp = m[0] ? strchr(m + 1, ' ') : NULL;
        if (!sp || !sp[1]) {
            rc = mkv_fail(err, MKV_EFORMAT, "merge %zu ('%.64s') is not two pieces separated by a space",
                          i, m);
            break;
        }
        size_t llen = (size_t)(sp - m), rlen = strlen(sp + 1);
        if (llen + rlen + 1 > joined_cap) {
            joined_cap = 2 * (llen + rlen + 1);
            char *p = realloc(joined, joined_cap);
            if (!p) {
                rc = mkv_fail(err, MKV_ENOMEM, "out of memory for merges");
                break;
            }
            joined = p;
        }
        memcpy(joined, m, llen);
        memcpy(joined + llen, sp + 1, rlen);
        int left = mkv_tokenizer_lookup(t, m, llen);
        int right = mkv_tokenizer_lookup(t, sp + 1, rlen);
        int result = mkv_tokenizer_lookup(t, joined, llen + rlen);
        if (left < 0 || right < 0 || result < 0)
            rc = mkv_fail(err, MKV_EFORMAT, "merge %zu ('%.64s'): %s is not in the vocabulary", i, m,
                          left < 0 ? "the left piece" : right < 0 ? "the right piece"
                                                               : "the merged piece");
        else
            add_merge(b, left, right, (int32_t)i, result);
    }
    free(joined);
    return rc;
}

int mkv_bpe_gpt2_create(const char *const *tokens, const int *types, int n,
                        const char *const *merges, size_t n_merges, const char *pre,
                        int bos, int eos, mkv_tokenizer **out, mkv_error *err)
{
    *out = NULL;
    pre_kind kind;
    if (!find_pre(pre, &kind))
        return mkv_fail(err, MKV_EUNSUP,
                        "unsupported pre-tokenizer '%s' (supported: gpt2, smollm, llama3, qwen2 "
                        "and their aliases; see bpe_gpt2.h)", pre);
    if (bos < -1 || bos >= n || eos < -1 || eos >= n)
        return mkv_fail(err, MKV_EFORMAT, "BOS/EOS ids %d/%d outside the vocabulary of %d", bos, eos, n);
    bpe_impl *b = calloc(1, sizeof *b);
    if (!b)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for a tokenizer");
    b->pre = kind;
    b->ignore_merges = kind == PRE_LLAMA3;
    for (int i = 0; i < N_BYTE_CHARS; i++)
        b->char_byte[i] = -1;
    for (int i = 0; i < 256; i++) {
        b->byte_char[i] = mkv_bpe_gpt2_byte_char((unsigned char)i);
        b->char_byte[b->byte_char[i]] = (int16_t)i;
    }
    mkv_tokenizer *t = NULL;
    int rc = mkv_tokenizer_new(&mkv_bpe_gpt2_ops, n, &t, err);
    if (rc) {
        impl_free(b);
        return rc;
    }
    t->impl = b;
    t->bos_id = bos;
    t->eos_id = eos;
    for (int id = 0; id < n && rc == MKV_OK; id++) {
        if (!tokens[id]) {
            rc = mkv_fail(err, MKV_EFORMAT, "token %d is missing", id);
            break;
        }
        int type = types ? types[id] : MKV_TOKEN_NORMAL;
        /* Byte-fallback pieces are a sentencepiece notion; GPT-2 vocabularies
         * that mark tokens so have no use for it. */
        if (type == MKV_TOKEN_BYTE)
            type = MKV_TOKEN_NORMAL;
        rc = mkv_tokenizer_set_token(t, id, tokens[id], strlen(tokens[id]), 0.0f, type, err);
    }
    if (rc == MKV_OK)
        rc = mkv_tokenizer_finish(t, err);
    /* Some vocabularies lack bytes that valid UTF-8 never or rarely uses
     * (SmolLM2 has no 0xC0, 0xF5..0xFF nor some control characters):
     * such a byte encodes as the unknown token, or is an error. */
    for (int i = 0; i < 256 && rc == MKV_OK; i++) {
        char spelled[4];
        size_t len = utf8_put(b->byte_char[i], spelled);
        b->byte_token[i] = mkv_tokenizer_lookup(t, spelled, len);
    }
    if (rc == MKV_OK)
        rc = build_merges(t, b, merges, n_merges, err);
    if (rc) {
        mkv_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return MKV_OK;
}
