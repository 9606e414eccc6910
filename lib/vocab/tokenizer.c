/* Tokenizer structure, decoding, and the scored BPE of llama2.c and
 * sentencepiece vocabularies. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/heap.h"
#include "vocab/tokenizer.h"

#define MAX_VOCAB (1 << 24)
/* tokenizer.bin files are a few hundred kilobytes for 32K vocabularies. */
#define MAX_TOKENIZER_FILE (1L << 30)
#define MAX_PIECE_LEN 65536

int mkv_idbuf_push(mkv_idbuf *b, int32_t id, mkv_error *err)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        int32_t *ids = cap < SIZE_MAX / sizeof *ids ? realloc(b->ids, cap * sizeof *ids) : NULL;
        if (!ids)
            return mkv_fail(err, MKV_ENOMEM, "out of memory for token ids");
        b->ids = ids;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return MKV_OK;
}

/* ------------------------------------------------------------ structure */

int mkv_tokenizer_new(const mkv_tokenizer_ops *ops, int vocab_size, mkv_tokenizer **out,
                      mkv_error *err)
{
    *out = NULL;
    if (vocab_size < 1 || vocab_size > MAX_VOCAB)
        return mkv_fail(err, MKV_EFORMAT, "vocabulary size %d is out of range [1, %d]",
                        vocab_size, MAX_VOCAB);
    mkv_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->tokens = calloc((size_t)vocab_size, sizeof *t->tokens))) {
        free(t);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for a vocabulary of %d tokens", vocab_size);
    }
    t->ops = ops;
    t->vocab_size = vocab_size;
    t->bos_id = t->eos_id = t->unk_id = -1;
    strcpy(t->space, " ");
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    *out = t;
    return MKV_OK;
}

int mkv_tokenizer_set_token(mkv_tokenizer *t, int id, const char *text, size_t len, float score,
                            int type, mkv_error *err)
{
    if (id < 0 || id >= t->vocab_size)
        return mkv_fail(err, MKV_EFORMAT, "token id %d outside the vocabulary of %d", id, t->vocab_size);
    if (len > MAX_PIECE_LEN)
        return mkv_fail(err, MKV_EFORMAT, "token %d is %zu bytes long (limit %d)", id, len, MAX_PIECE_LEN);
    if (type < MKV_TOKEN_NORMAL || type > MKV_TOKEN_BYTE)
        return mkv_fail(err, MKV_EFORMAT, "token %d has unknown type %d", id, type);
    char *copy = malloc(len + 1);
    if (!copy)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for token %d", id);
    memcpy(copy, text, len);
    copy[len] = '\0';
    mkv_token *tok = &t->tokens[id];
    free(tok->text);
    tok->text = copy;
    tok->len = (uint32_t)len;
    tok->score = score;
    tok->type = type;
    return MKV_OK;
}

static int compare_text(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

/* qsort has no context argument: the comparators see the vocabulary being
 * sorted through this thread-local pointer. */
static _Thread_local const mkv_token *sort_tokens;

static int by_text_then_id(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    int c = compare_text(sort_tokens[a].text, sort_tokens[a].len, sort_tokens[b].text, sort_tokens[b].len);
    return c ? c : (a > b) - (a < b);
}

static int by_length_desc_then_id(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint32_t la = sort_tokens[a].len, lb = sort_tokens[b].len;
    if (la != lb)
        return la > lb ? -1 : 1;
    return (a > b) - (a < b);
}

/* "<0xNN>" -> NN, or -1. */
static int parse_byte_piece(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

int mkv_tokenizer_finish(mkv_tokenizer *t, mkv_error *err)
{
    size_t total = 0;
    int n_lookup = 0, n_special = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        const mkv_token *tok = &t->tokens[id];
        if (!tok->text)
            return mkv_fail(err, MKV_EFORMAT, "token %d of the vocabulary is not set", id);
        total += tok->len;
        if (tok->type == MKV_TOKEN_NORMAL || tok->type == MKV_TOKEN_USER_DEFINED)
            n_lookup++;
        if ((tok->type == MKV_TOKEN_CONTROL || tok->type == MKV_TOKEN_USER_DEFINED) && tok->len > 0)
            n_special++;
        if (tok->type == MKV_TOKEN_BYTE) {
            int b = parse_byte_piece(tok->text, tok->len);
            if (b < 0)
                return mkv_fail(err, MKV_EFORMAT, "byte token %d is not of the form <0xNN>", id);
            if (t->byte_id[b] < 0)
                t->byte_id[b] = id;
        }
    }
    free(t->sorted);
    free(t->special);
    t->sorted = malloc(((size_t)n_lookup + 1) * sizeof *t->sorted);
    t->special = malloc(((size_t)n_special + 1) * sizeof *t->special);
    char *bytes = malloc(total + 1);
    if (!t->sorted || !t->special || !bytes) {
        free(bytes);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the tokenizer index");
    }
    t->n_sorted = t->n_special = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        int type = t->tokens[id].type;
        if (type == MKV_TOKEN_NORMAL || type == MKV_TOKEN_USER_DEFINED)
            t->sorted[t->n_sorted++] = id;
        if ((type == MKV_TOKEN_CONTROL || type == MKV_TOKEN_USER_DEFINED) && t->tokens[id].len > 0)
            t->special[t->n_special++] = id;
    }
    sort_tokens = t->tokens;
    qsort(t->sorted, (size_t)t->n_sorted, sizeof *t->sorted, by_text_then_id);
    qsort(t->special, (size_t)t->n_special, sizeof *t->special, by_length_desc_then_id);
    sort_tokens = NULL;

    free(t->decoded);
    t->decoded = bytes;
    for (int id = 0; id < t->vocab_size; id++) {
        mkv_token *tok = &t->tokens[id];
        tok->bytes = bytes;
        if (tok->type == MKV_TOKEN_CONTROL || tok->type == MKV_TOKEN_UNUSED)
            tok->n_bytes = 0;
        else
            tok->n_bytes = (uint32_t)t->ops->piece_bytes(t, id, bytes);
        bytes += tok->n_bytes;
    }
    return MKV_OK;
}

void mkv_tokenizer_free(mkv_tokenizer *t)
{
    if (!t)
        return;
    if (t->ops && t->ops->free_impl)
        t->ops->free_impl(t->impl);
    for (int id = 0; id < t->vocab_size; id++)
        free(t->tokens[id].text);
    free(t->decoded);
    free(t->tokens);
    free(t->sorted);
    free(t->special);
    free(t);
}

int mkv_tokenizer_lookup(const mkv_tokenizer *t, const char *text, size_t len)
{
    /* Lower bound, so duplicates resolve to the smallest id. */
    int lo = 0, hi = t->n_sorted;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const mkv_token *tok = &t->tokens[t->sorted[mid]];
        if (compare_text(tok->text, tok->len, text, len) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->n_sorted) {
        const mkv_token *tok = &t->tokens[t->sorted[lo]];
        if (tok->len == len && memcmp(tok->text, text, len) == 0)
            return t->sorted[lo];
    }
    return -1;
}

/* ------------------------------------------------------------ encode/decode */

/* Longest special piece starting at text[0..len), or -1. */
static int match_special(const mkv_tokenizer *t, const char *text, size_t len)
{
    for (int i = 0; i < t->n_special; i++) {
        const mkv_token *tok = &t->tokens[t->special[i]];
        if (tok->len <= len && memcmp(tok->text, text, tok->len) == 0)
            return t->special[i];
    }
    return -1;
}

int mkv_tokenizer_encode(const mkv_tokenizer *t, const char *text, size_t len, int flags,
                         int32_t **ids, size_t *n, mkv_error *err)
{
    *ids = NULL;
    *n = 0;
    mkv_idbuf buf = {0};
    int rc = MKV_OK;
    if ((flags & MKV_ENCODE_BOS) && t->bos_id < 0)
        return mkv_fail(err, MKV_EUNSUP, "the vocabulary has no BOS token");
    if ((flags & MKV_ENCODE_EOS) && t->eos_id < 0)
        return mkv_fail(err, MKV_EUNSUP, "the vocabulary has no EOS token");
    if ((flags & MKV_ENCODE_BOS) && (rc = mkv_idbuf_push(&buf, t->bos_id, err)))
        goto fail;
    if (flags & MKV_ENCODE_SPECIAL) {
        size_t seg = 0;
        for (size_t i = 0; i < len;) {
            int id = match_special(t, text + i, len - i);
            if (id < 0) {
                i++;
                continue;
            }
            if (i > seg && (rc = t->ops->encode(t, text + seg, i - seg, seg == 0, &buf, err)))
                goto fail;
            if ((rc = mkv_idbuf_push(&buf, id, err)))
                goto fail;
            i += t->tokens[id].len;
            seg = i;
        }
        if (len > seg && (rc = t->ops->encode(t, text + seg, len - seg, seg == 0, &buf, err)))
            goto fail;
    } else if ((rc = t->ops->encode(t, text, len, 1, &buf, err))) {
        goto fail;
    }
    if ((flags & MKV_ENCODE_EOS) && (rc = mkv_idbuf_push(&buf, t->eos_id, err)))
        goto fail;
    *ids = buf.ids;
    *n = buf.n;
    return MKV_OK;
fail:
    free(buf.ids);
    return rc;
}

const char *mkv_tokenizer_piece(const mkv_tokenizer *t, int prev, int id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size) {
        *len = 0;
        return NULL;
    }
    const mkv_token *tok = &t->tokens[id];
    const char *s = tok->bytes;
    size_t n = tok->n_bytes;
    if (t->strip_space_after_bos && prev >= 0 && prev == t->bos_id && n > 0 && s[0] == ' ') {
        s++;
        n--;
    }
    *len = n;
    return s;
}

int mkv_tokenizer_decode(const mkv_tokenizer *t, const int32_t *ids, size_t n, char **text,
                         size_t *len, mkv_error *err)
{
    *text = NULL;
    *len = 0;
    size_t total = 0, piece_len;
    for (size_t i = 0; i < n; i++) {
        if (!mkv_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &piece_len))
            return mkv_fail(err, MKV_EFORMAT, "token id %d at position %zu is outside the vocabulary of %d",
                            (int)ids[i], i, t->vocab_size);
        total += piece_len;
    }
    char *out = malloc(total + 1);
    if (!out)
        return mkv_fail(err, MKV_ENOMEM, "out of memory decoding %zu tokens", n);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = mkv_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &piece_len);
        memcpy(out + at, p, piece_len);
        at += piece_len;
    }
    out[at] = '\0';
    *text = out;
    *len = at;
    return MKV_OK;
}

/* ------------------------------------------------------------ scored BPE */

/* Start from UTF-8 characters (pieces of the vocabulary, or byte-fallback
 * tokens when a character is not one), then repeatedly merge the adjacent
 * pair whose concatenation is the vocabulary piece with the highest score,
 * the leftmost pair on ties: llama2.c's encoder.  A heap of candidate pairs
 * makes it O(n log n) instead of llama2.c's O(n^2) rescans; stale
 * candidates are recognised by their length and dropped. */

typedef struct {
    float score;
    int32_t left, right; /* symbol indices */
    uint32_t len;        /* combined length when pushed */
    int32_t id;
} bpe_pair;

static int pair_before(const bpe_pair *a, const bpe_pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

MKV_HEAP_DEFINE(bpe_heap, bpe_pair, pair_before)

typedef struct {
    uint32_t start, len;
    int32_t id;
    int32_t prev, next; /* neighbours, -1 at the ends */
    int mergeable;      /* byte-fallback symbols never merge */
} bpe_symbol;

typedef struct {
    const mkv_tokenizer *t;
    const char *text;
    bpe_symbol *sym;
    bpe_heap heap;
} bpe_state;

static void consider_pair(bpe_state *s, int32_t left)
{
    if (left < 0)
        return;
    int32_t right = s->sym[left].next;
    if (right < 0 || !s->sym[left].mergeable || !s->sym[right].mergeable)
        return;
    uint32_t len = s->sym[left].len + s->sym[right].len;
    int id = mkv_tokenizer_lookup(s->t, s->text + s->sym[left].start, len);
    if (id < 0)
        return;
    bpe_pair p = {s->t->tokens[id].score, left, right, len, id};
    bpe_heap_push(&s->heap, p);
}

/* The input with a dummy prefix and spaces spelled as the vocabulary
 * spells them; *owned is set when a copy was needed. */
static const char *normalize(const mkv_tokenizer *t, const char *text, size_t len, int at_start,
                             size_t *out_len, char **owned, mkv_error *err)
{
    *owned = NULL;
    int prefix = at_start && t->add_space_prefix && len > 0;
    size_t slen = strlen(t->space);
    int respell = strcmp(t->space, " ") != 0;
    if (!prefix && !respell) {
        *out_len = len;
        return text;
    }
    /* Bound: every byte may become slen bytes, plus the prefix. */
    char *buf = len < (SIZE_MAX - slen) / slen ? malloc(len * slen + slen + 1) : NULL;
    if (!buf) {
        mkv_fail(err, MKV_ENOMEM, "out of memory normalizing %zu bytes of text", len);
        return NULL;
    }
    size_t at = 0;
    if (prefix) {
        memcpy(buf, t->space, slen);
        at = slen;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ' && respell) {
            memcpy(buf + at, t->space, slen);
            at += slen;
        } else {
            buf[at++] = text[i];
        }
    }
    *out_len = at;
    *owned = buf;
    return buf;
}

static int scored_bpe_encode(const mkv_tokenizer *t, const char *text, size_t len, int at_start,
                             mkv_idbuf *out, mkv_error *err)
{
    size_t n;
    char *owned;
    const char *s = normalize(t, text, len, at_start, &n, &owned, err);
    if (!s)
        return err ? err->code : MKV_ENOMEM;
    if (n == 0) {
        free(owned);   /* a respelled empty text still has its copy */
        return MKV_OK;
    }
    if (n > (size_t)INT32_MAX) {
        free(owned);
        return mkv_fail(err, MKV_EUSAGE, "text of %zu bytes is too long to tokenize", n);
    }
    int rc = MKV_OK;
    bpe_state st = {t, s, malloc(n * sizeof *st.sym), {malloc(3 * n * sizeof(bpe_pair)), 0}};
    if (!st.sym || !st.heap.items) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory tokenizing %zu bytes", n);
        goto done;
    }
    int32_t count = 0;
    for (size_t i = 0; i < n;) {
        /* One UTF-8 character: a lead byte and up to three continuation bytes. */
        size_t j = i + 1;
        while (j < n && ((unsigned char)s[j] & 0xC0) == 0x80 && j - i < 4)
            j++;
        int id = mkv_tokenizer_lookup(t, s + i, j - i);
        if (id >= 0) {
            st.sym[count] = (bpe_symbol){(uint32_t)i, (uint32_t)(j - i), id, count - 1, count + 1, 1};
            count++;
        } else {
            for (size_t k = i; k < j; k++) {
                unsigned char byte = (unsigned char)s[k];
                int bid = t->byte_id[byte] >= 0 ? t->byte_id[byte] : t->unk_id;
                if (bid < 0) {
                    rc = mkv_fail(err, MKV_EFORMAT,
                                  "cannot encode byte 0x%02x at offset %zu: the vocabulary has "
                                  "neither a piece nor a byte-fallback or unknown token for it",
                                  byte, k);
                    goto done;
                }
                st.sym[count] = (bpe_symbol){(uint32_t)k, 1, bid, count - 1, count + 1, 0};
                count++;
            }
        }
        i = j;
    }
    st.sym[count - 1].next = -1;
    for (int32_t i = 0; i + 1 < count; i++)
        consider_pair(&st, i);
    while (st.heap.n > 0) {
        bpe_pair p = bpe_heap_pop(&st.heap);
        bpe_symbol *l = &st.sym[p.left], *r = &st.sym[p.right];
        if (l->len == 0 || l->next != p.right || l->len + r->len != p.len)
            continue; /* a neighbour merged since this pair was pushed */
        l->len = p.len;
        l->id = p.id;
        l->next = r->next;
        if (r->next >= 0)
            st.sym[r->next].prev = p.left;
        r->len = 0;
        consider_pair(&st, l->prev);
        consider_pair(&st, p.left);
    }
    for (int32_t i = 0; i >= 0 && rc == MKV_OK; i = st.sym[i].next)
        rc = mkv_idbuf_push(out, st.sym[i].id, err);
done:
    free(st.sym);
    free(st.heap.items);
    free(owned);
    return rc;
}

static size_t scored_bpe_piece_bytes(const mkv_tokenizer *t, int id, char *dst)
{
    const mkv_token *tok = &t->tokens[id];
    if (tok->type == MKV_TOKEN_BYTE) {
        dst[0] = (char)parse_byte_piece(tok->text, tok->len);
        return 1;
    }
    size_t slen = strlen(t->space), n = 0;
    for (size_t i = 0; i < tok->len;) {
        if (slen > 0 && i + slen <= tok->len && memcmp(tok->text + i, t->space, slen) == 0) {
            dst[n++] = ' ';
            i += slen;
        } else {
            dst[n++] = tok->text[i++];
        }
    }
    return n;
}

const mkv_tokenizer_ops mkv_scored_bpe_ops = {
    "scored-bpe", scored_bpe_encode, scored_bpe_piece_bytes, NULL
};

/* ------------------------------------------------------------ llama2.c file */

static int32_t get_i32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static float get_f32(const unsigned char *p)
{
    uint32_t u = (uint32_t)get_i32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int read_whole_file(const char *path, unsigned char **data, size_t *size, mkv_error *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    struct stat st;
    int rc = MKV_OK;
    unsigned char *buf = NULL;
    if (fstat(fileno(fp), &st) != 0) {
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot stat '%s'", path);
    } else if (!S_ISREG(st.st_mode)) {
        rc = mkv_fail(err, MKV_EIO, "'%s': not a regular file", path);
    } else if (st.st_size > MAX_TOKENIZER_FILE) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %lld bytes is too large for a tokenizer file",
                      path, (long long)st.st_size);
    } else if (!(buf = malloc((size_t)st.st_size + 1))) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory reading '%s'", path);
    } else if (fread(buf, 1, (size_t)st.st_size, fp) != (size_t)st.st_size) {
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot read '%s'", path);
    }
    fclose(fp);
    if (rc) {
        free(buf);
        return rc;
    }
    *data = buf;
    *size = (size_t)st.st_size;
    return MKV_OK;
}

int mkv_tokenizer_load_llama2c(const char *path, int vocab_size, mkv_tokenizer **out,
                               mkv_error *err)
{
    *out = NULL;
    unsigned char *data = NULL;
    size_t size = 0;
    int rc = read_whole_file(path, &data, &size, err);
    if (rc)
        return rc;
    mkv_tokenizer *t = NULL;
    if (size < 4) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': too short for a llama2.c tokenizer", path);
        goto done;
    }
    int32_t max_len = get_i32(data);
    if (max_len < 1 || max_len > MAX_PIECE_LEN) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': max_token_length = %d is out of range [1, %d]",
                      path, (int)max_len, MAX_PIECE_LEN);
        goto done;
    }
    /* First pass: validate the entries and count them. */
    int count = 0;
    for (size_t at = 4; at < size; count++) {
        if (count >= MAX_VOCAB) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': more than %d entries", path, MAX_VOCAB);
            goto done;
        }
        if (size - at < 8) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': truncated: file ends inside the header of entry %d",
                          path, count);
            goto done;
        }
        float score = get_f32(data + at);
        int32_t len = get_i32(data + at + 4);
        if (!isfinite(score) || len < 0 || len > max_len) {
            rc = mkv_fail(err, MKV_EFORMAT,
                          "'%s': corrupt entry %d (score %g, length %d, max_token_length %d)",
                          path, count, (double)score, (int)len, (int)max_len);
            goto done;
        }
        if (size - at - 8 < (size_t)len) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': truncated: file ends inside entry %d", path, count);
            goto done;
        }
        at += 8 + (size_t)len;
    }
    if (count == 0 || (vocab_size > 0 && count != vocab_size)) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': has %d entries, the model's vocabulary has %d",
                      path, count, vocab_size);
        goto done;
    }
    if (count < 3) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %d entries cannot hold <unk>, BOS and EOS", path, count);
        goto done;
    }
    if ((rc = mkv_tokenizer_new(&mkv_scored_bpe_ops, count, &t, err)))
        goto in_context;
    t->unk_id = 0;
    t->bos_id = 1;
    t->eos_id = 2;
    t->add_space_prefix = 1;
    t->strip_space_after_bos = 1;
    size_t at = 4;
    for (int id = 0; id < count; id++) {
        float score = get_f32(data + at);
        size_t len = (size_t)get_i32(data + at + 4);
        const char *piece = (const char *)data + at + 8;
        int type = id == 0 ? MKV_TOKEN_UNKNOWN
                 : id <= 2 ? MKV_TOKEN_CONTROL
                 : parse_byte_piece(piece, len) >= 0 ? MKV_TOKEN_BYTE : MKV_TOKEN_NORMAL;
        if ((rc = mkv_tokenizer_set_token(t, id, piece, len, score, type, err)))
            goto in_context;
        at += 8 + len;
    }
    if ((rc = mkv_tokenizer_finish(t, err)))
        goto in_context;
    *out = t;
    free(data);
    return MKV_OK;
in_context:
    if (err)
        mkv_error_prefix(err, "'%s'", path);
done:
    mkv_tokenizer_free(t);
    free(data);
    return rc;
}
