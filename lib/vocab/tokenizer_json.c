/* Hugging Face tokenizer.json (see tokenizer_json.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/heap.h"
#include "vocab/bpe_gpt2.h"
#include "core/json.h"
#include "vocab/tokenizer_json.h"

#define MAX_VOCAB (1 << 24)
#define METASPACE "\xe2\x96\x81" /* U+2581, sentencepiece's visible space */
#define METASPACE_LEN 3

/* ------------------------------------------------------------ rank-merge BPE
 *
 * Sentencepiece-style vocabularies in tokenizer.json merge by the rank of
 * each listed pair (tokenizers' Word::merge_all): the pair with the lowest
 * rank is merged first, the leftmost on ties, and only listed pairs merge.
 * A hash table maps (left id, right id) to (rank, merged id). */

typedef enum {
    PREFIX_NEVER,  /* no dummy prefix */
    PREFIX_FIRST,  /* Metaspace "first": only the text's first segment, unless it starts with a space */
    PREFIX_ALWAYS, /* Metaspace "always": every segment, unless it starts with a space */
    PREFIX_LEGACY  /* Prepend normalizer: every non-empty segment, unconditionally */
} prefix_mode;

typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank, id;
} merge_slot;

typedef struct {
    merge_slot *slots;
    size_t mask;
    prefix_mode prefix;
    int split_words; /* Metaspace split=true: every U+2581 starts a word */
    int byte_fallback;
    int fuse_unk;
} spm_impl;

static size_t slot_of(const spm_impl *im, uint64_t key)
{
    uint64_t h = key * 0x9e3779b97f4a7c15ULL;
    size_t i = (size_t)(h ^ (h >> 29)) & im->mask;
    while (im->slots[i].key != UINT64_MAX && im->slots[i].key != key)
        i = (i + 1) & im->mask;
    return i;
}

static const merge_slot *find_merge(const spm_impl *im, int32_t left, int32_t right)
{
    const merge_slot *s = &im->slots[slot_of(im, (uint64_t)(uint32_t)left << 32 | (uint32_t)right)];
    return s->key == UINT64_MAX ? NULL : s;
}

static void spm_free(void *impl)
{
    spm_impl *im = impl;
    if (im)
        free(im->slots);
    free(im);
}

typedef struct {
    int32_t rank, pos, id;
} merge_cand;

static int cand_before(const merge_cand *a, const merge_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

MKV_HEAP_DEFINE(cand_heap, merge_cand, cand_before)

typedef struct {
    int32_t id, prev, next; /* next = -1 at the end; id = -1 once merged away */
} spm_symbol;

static void push_pair(const spm_impl *im, cand_heap *h, const spm_symbol *sym, int32_t left)
{
    if (left < 0 || sym[left].next < 0)
        return;
    const merge_slot *m = find_merge(im, sym[left].id, sym[sym[left].next].id);
    if (m)
        cand_heap_push(h, (merge_cand){m->rank, left, m->id});
}

/* Encode one word (no further splitting) s[0..n). */
static int spm_encode_word(const mkv_tokenizer *t, const char *s, size_t n, spm_symbol *sym,
                           cand_heap *heap, mkv_idbuf *out, mkv_error *err)
{
    const spm_impl *im = t->impl;
    int32_t count = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && ((unsigned char)s[j] & 0xC0) == 0x80 && j - i < 4)
            j++;
        int id = mkv_tokenizer_lookup(t, s + i, j - i);
        int bytes_ok = im->byte_fallback;
        for (size_t k = i; id < 0 && bytes_ok && k < j; k++)
            bytes_ok = t->byte_id[(unsigned char)s[k]] >= 0;
        if (id >= 0) {
            sym[count++].id = id;
        } else if (bytes_ok) {
            for (size_t k = i; k < j; k++)
                sym[count++].id = t->byte_id[(unsigned char)s[k]];
        } else if (t->unk_id >= 0) {
            if (!(im->fuse_unk && count > 0 && sym[count - 1].id == t->unk_id))
                sym[count++].id = t->unk_id;
        } else {
            return mkv_fail(err, MKV_EFORMAT, "cannot encode the character at byte %zu: the vocabulary "
                            "has neither a piece, byte-fallback tokens nor an unknown token for it", i);
        }
        i = j;
    }
    for (int32_t i = 0; i < count; i++) {
        sym[i].prev = i - 1;
        sym[i].next = i + 1 < count ? i + 1 : -1;
    }
    heap->n = 0;
    for (int32_t i = 0; i + 1 < count; i++)
        push_pair(im, heap, sym, i);
    while (heap->n > 0) {
        merge_cand c = cand_heap_pop(heap);
        spm_symbol *l = &sym[c.pos];
        /* Stale when the left symbol was merged away or its pair changed. */
        if (l->id < 0 || l->next < 0)
            continue;
        const merge_slot *m = find_merge(im, l->id, sym[l->next].id);
        if (!m || m->id != c.id)
            continue;
        spm_symbol *r = &sym[l->next];
        l->id = c.id;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = c.pos;
        r->id = -1;
        push_pair(im, heap, sym, l->prev);
        push_pair(im, heap, sym, c.pos);
    }
    int rc = MKV_OK;
    for (int32_t i = count > 0 ? 0 : -1; i >= 0 && rc == MKV_OK; i = sym[i].next)
        rc = mkv_idbuf_push(out, sym[i].id, err);
    return rc;
}

static int spm_encode(const mkv_tokenizer *t, const char *text, size_t len, int at_start, mkv_idbuf *out,
                      mkv_error *err)
{
    const spm_impl *im = t->impl;
    if (len == 0)
        return MKV_OK;
    int starts_with_space = text[0] == ' ' || (len >= METASPACE_LEN && !memcmp(text, METASPACE, METASPACE_LEN));
    int prefix = im->prefix == PREFIX_LEGACY ||
                 (!starts_with_space && (im->prefix == PREFIX_ALWAYS || (im->prefix == PREFIX_FIRST && at_start)));
    /* Every byte may become three (a space), plus the prefix. */
    if (len > (SIZE_MAX - METASPACE_LEN) / METASPACE_LEN || len > (size_t)INT32_MAX / 4)
        return mkv_fail(err, MKV_EUSAGE, "text of %zu bytes is too long to tokenize", len);
    size_t cap = len * METASPACE_LEN + METASPACE_LEN;
    char *s = malloc(cap);
    spm_symbol *sym = malloc(cap * sizeof *sym);
    cand_heap heap = {malloc(3 * cap * sizeof *heap.items), 0};
    int rc = MKV_OK;
    if (!s || !sym || !heap.items) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory tokenizing %zu bytes", len);
        goto done;
    }
    size_t n = 0;
    if (prefix) {
        memcpy(s, METASPACE, METASPACE_LEN);
        n = METASPACE_LEN;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s + n, METASPACE, METASPACE_LEN);
            n += METASPACE_LEN;
        } else {
            s[n++] = text[i];
        }
    }
    size_t word = 0;
    for (size_t i = 1; i <= n && rc == MKV_OK; i++) {
        int boundary = i == n || (im->split_words && i + METASPACE_LEN <= n &&
                                  !memcmp(s + i, METASPACE, METASPACE_LEN));
        if (boundary) {
            rc = spm_encode_word(t, s + word, i - word, sym, &heap, out, err);
            word = i;
        }
    }
done:
    free(s);
    free(sym);
    free(heap.items);
    return rc;
}

/* Pieces spell spaces as U+2581 (t->space) and bytes as <0xNN>: the scored
 * BPE's decoding. */
static size_t spm_piece_bytes(const mkv_tokenizer *t, int id, char *dst)
{
    return mkv_scored_bpe_ops.piece_bytes(t, id, dst);
}

static const mkv_tokenizer_ops spm_ops = {"hf-sentencepiece-bpe", spm_encode, spm_piece_bytes, spm_free};

/* ------------------------------------------------------------ reading the files */

typedef struct {
    const char *path;
    const mkv_json *root, *model;
    int n;                 /* ids 0..n-1 */
    const char **text;     /* [n]; NULL = no token with that id */
    size_t *len;
    int *type;
    int *from_vocab;       /* 1 when model.vocab defines the id (merges may use it) */
    const char *unk_token; /* model.unk_token */
    int byte_fallback;
} tj_vocab;

static void vocab_free(tj_vocab *v)
{
    free(v->text);
    free(v->len);
    free(v->type);
    free(v->from_vocab);
}

static const mkv_json *member(const mkv_json *obj, const char *key)
{
    const mkv_json *v = mkv_json_get(obj, key);
    return v && mkv_json_type_of(v) != MKV_JSON_NULL ? v : NULL;
}

/* The type string of a tokenizers component, "" when absent. */
static const char *type_of(const mkv_json *component)
{
    const char *s = mkv_json_str(mkv_json_get(component, "type"), NULL);
    return s ? s : "";
}

static int bool_member(const mkv_json *obj, const char *key, int dflt)
{
    int b;
    return mkv_json_bool(mkv_json_get(obj, key), &b) == 0 ? b : dflt;
}

static int read_id(const mkv_json *v, int64_t *id)
{
    return mkv_json_int64(v, id) == 0 && *id >= 0 && *id < MAX_VOCAB ? 0 : -1;
}

static int parse_vocab(tj_vocab *v, int vocab_size, mkv_error *err)
{
    const mkv_json *vocab = member(v->model, "vocab");
    const mkv_json *added = member(v->root, "added_tokens");
    if (!vocab || mkv_json_type_of(vocab) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': model.vocab must be an object of piece: id", v->path);
    if (added && mkv_json_type_of(added) != MKV_JSON_ARRAY)
        return mkv_fail(err, MKV_EFORMAT, "'%s': added_tokens must be a list", v->path);
    int64_t max_id = -1, id;
    for (size_t i = 0; i < mkv_json_len(vocab); i++) {
        if (read_id(mkv_json_value_at(vocab, i), &id))
            return mkv_fail(err, MKV_EFORMAT, "'%s': model.vocab entry '%s' has no valid id", v->path,
                            mkv_json_key_at(vocab, i, NULL));
        max_id = id > max_id ? id : max_id;
    }
    for (size_t i = 0; i < mkv_json_len(added); i++) {
        const mkv_json *a = mkv_json_at(added, i);
        if (read_id(mkv_json_get(a, "id"), &id) || !mkv_json_str(mkv_json_get(a, "content"), NULL))
            return mkv_fail(err, MKV_EFORMAT, "'%s': added_tokens[%zu] needs an id and a content string",
                            v->path, i);
        max_id = id > max_id ? id : max_id;
    }
    if (max_id < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': the vocabulary is empty", v->path);
    if (vocab_size > 0 && max_id >= vocab_size)
        return mkv_fail(err, MKV_EFORMAT, "'%s': token id %lld is outside the model's vocabulary of %d",
                        v->path, (long long)max_id, vocab_size);
    v->n = vocab_size > 0 ? vocab_size : (int)max_id + 1;
    size_t n = (size_t)v->n;
    v->text = calloc(n, sizeof *v->text);
    v->len = calloc(n, sizeof *v->len);
    v->type = calloc(n, sizeof *v->type);
    v->from_vocab = calloc(n, sizeof *v->from_vocab);
    if (!v->text || !v->len || !v->type || !v->from_vocab)
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory for %d tokens", v->path, v->n);
    for (size_t i = 0; i < mkv_json_len(vocab); i++) {
        read_id(mkv_json_value_at(vocab, i), &id);
        if (v->text[id])
            return mkv_fail(err, MKV_EFORMAT, "'%s': id %lld is given to both '%s' and '%s'", v->path,
                            (long long)id, v->text[id], mkv_json_key_at(vocab, i, NULL));
        v->text[id] = mkv_json_key_at(vocab, i, &v->len[id]);
        v->type[id] = MKV_TOKEN_NORMAL;
        v->from_vocab[id] = 1;
    }
    /* An added token either has an id of its own or the id model.vocab
     * gives to the same text. */
    for (size_t i = 0; i < mkv_json_len(added); i++) {
        const mkv_json *a = mkv_json_at(added, i);
        read_id(mkv_json_get(a, "id"), &id);
        size_t len;
        const char *content = mkv_json_str(mkv_json_get(a, "content"), &len);
        if (v->from_vocab[id] && (len != v->len[id] || memcmp(content, v->text[id], len) != 0))
            return mkv_fail(err, MKV_EFORMAT, "'%s': added_tokens[%zu] '%s' has id %lld, which model.vocab gives to '%s'",
                            v->path, i, content, (long long)id, v->text[id]);
        const mkv_json *special = mkv_json_get(a, "special");
        int is_special = 0;
        if (special && mkv_json_type_of(special) != MKV_JSON_NULL && mkv_json_bool(special, &is_special) != 0)
            return mkv_fail(err, MKV_EFORMAT, "'%s': added_tokens[%zu] '%s': \"special\" must be true or false",
                            v->path, i, content);
        v->text[id] = content;
        v->len[id] = len;
        v->type[id] = is_special ? MKV_TOKEN_CONTROL : MKV_TOKEN_USER_DEFINED;
    }
    for (int i = 0; i < v->n; i++) {
        if (!v->text[i]) {
            v->text[i] = "";
            v->type[i] = MKV_TOKEN_UNUSED;
        } else if (strlen(v->text[i]) != v->len[i]) {
            return mkv_fail(err, MKV_EFORMAT, "'%s': token %d contains a NUL character", v->path, i);
        }
    }
    return MKV_OK;
}

/* Merge i as its two pieces: "a b" or ["a", "b"]. */
static int merge_pieces(const tj_vocab *v, const mkv_json *merges, size_t i, const char **a, size_t *alen,
                        const char **b, size_t *blen, mkv_error *err)
{
    const mkv_json *m = mkv_json_at(merges, i);
    if (mkv_json_type_of(m) == MKV_JSON_ARRAY && mkv_json_len(m) == 2) {
        *a = mkv_json_str(mkv_json_at(m, 0), alen);
        *b = mkv_json_str(mkv_json_at(m, 1), blen);
        if (*a && *b)
            return MKV_OK;
    } else if (mkv_json_type_of(m) == MKV_JSON_STRING) {
        size_t len;
        const char *s = mkv_json_str(m, &len);
        const char *space = memchr(s, ' ', len);
        if (space && space > s && space + 1 < s + len && !memchr(space + 1, ' ', (size_t)(s + len - space - 1))) {
            *a = s;
            *alen = (size_t)(space - s);
            *b = space + 1;
            *blen = (size_t)(s + len - space - 1);
            return MKV_OK;
        }
    }
    return mkv_fail(err, MKV_EFORMAT, "'%s': merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", v->path, i);
}

/* ------------------------------------------------------------ style detection */

/* The pre-tokenizer components: the section itself or its Sequence. */
static size_t components(const mkv_json *section, const char *list_key, const mkv_json **out, size_t max)
{
    if (!section)
        return 0;
    if (!strcmp(type_of(section), "Sequence")) {
        const mkv_json *list = mkv_json_get(section, list_key);
        size_t n = mkv_json_len(list) < max ? mkv_json_len(list) : max;
        for (size_t i = 0; i < n; i++)
            out[i] = mkv_json_at(list, i);
        return n;
    }
    out[0] = section;
    return 1;
}

/* Byte-level vocabularies: the pre-tokenizer's name for mkv_bpe_gpt2_create,
 * or an MKV_EUNSUP error naming what the file has. */
static int byte_level_pre(const tj_vocab *v, const mkv_json *pre_section, const char **pre, mkv_error *err)
{
    const mkv_json *parts[16];
    size_t n = components(pre_section, "pretokenizers", parts, 16);
    const char *regex = NULL;
    int digits = 0, byte_level_regex = 0;
    for (size_t i = 0; i < n; i++) {
        const char *type = type_of(parts[i]);
        if (!strcmp(type, "Split")) {
            const mkv_json *pattern = mkv_json_get(parts[i], "pattern");
            const char *behavior = mkv_json_str(mkv_json_get(parts[i], "behavior"), NULL);
            if (regex || !(regex = mkv_json_str(mkv_json_get(pattern, "Regex"), NULL)) ||
                bool_member(parts[i], "invert", 0) || !behavior || strcmp(behavior, "Isolated") != 0)
                return mkv_fail(err, MKV_EUNSUP, "'%s': unsupported Split pre-tokenizer (only one "
                                "Isolated regex split is supported)", v->path);
        } else if (!strcmp(type, "Digits")) {
            if (!bool_member(parts[i], "individual_digits", 0))
                return mkv_fail(err, MKV_EUNSUP, "'%s': Digits pre-tokenizer without individual_digits "
                                "is not supported", v->path);
            digits = 1;
        } else if (!strcmp(type, "ByteLevel")) {
            if (bool_member(parts[i], "add_prefix_space", 0))
                return mkv_fail(err, MKV_EUNSUP, "'%s': ByteLevel with add_prefix_space is not supported",
                                v->path);
            byte_level_regex = bool_member(parts[i], "use_regex", 1);
        } else {
            return mkv_fail(err, MKV_EUNSUP, "'%s': pre-tokenizer '%s' is not supported with a "
                            "byte-level vocabulary", v->path, type);
        }
    }
    /* ByteLevel's own regex is GPT-2's; a Split regex replaces it. */
    if (regex && byte_level_regex)
        return mkv_fail(err, MKV_EUNSUP, "'%s': a Split regex followed by ByteLevel with use_regex "
                        "is not supported", v->path);
    *pre = regex ? mkv_bpe_gpt2_pre_for_regex(regex, digits) : byte_level_regex ? (digits ? "smollm" : "gpt2") : NULL;
    if (!*pre)
        return mkv_fail(err, MKV_EUNSUP, "'%s': unsupported byte-level pre-tokenization%s%s%s (known: "
                        "GPT-2, SmolLM, LLaMA-3, Qwen2)", v->path, regex ? " with regex '" : "",
                        regex ? regex : "", regex ? "'" : "");
    return MKV_OK;
}

/* Sentencepiece-style: a Metaspace pre-tokenizer, or Prepend/Replace
 * normalizers.  Returns 0 and fills the mode when the file is one. */
static int metaspace_style(const tj_vocab *v, const mkv_json *normalizer, const mkv_json *pre_section,
                           spm_impl *im, int *is_spm, mkv_error *err)
{
    const mkv_json *parts[16];
    *is_spm = 0;
    im->prefix = PREFIX_NEVER;
    size_t n = components(normalizer, "normalizers", parts, 16);
    int replaces = 0;
    for (size_t i = 0; i < n; i++) {
        const char *type = type_of(parts[i]);
        if (!strcmp(type, "Prepend")) {
            const char *p = mkv_json_str(mkv_json_get(parts[i], "prepend"), NULL);
            if (!p || strcmp(p, METASPACE) != 0)
                return mkv_fail(err, MKV_EUNSUP, "'%s': Prepend normalizer of another string than "
                                "U+2581 is not supported", v->path);
            im->prefix = PREFIX_LEGACY;
        } else if (!strcmp(type, "Replace")) {
            const char *from = mkv_json_str(mkv_json_get(mkv_json_get(parts[i], "pattern"), "String"), NULL);
            const char *to = mkv_json_str(mkv_json_get(parts[i], "content"), NULL);
            if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, METASPACE) != 0)
                return mkv_fail(err, MKV_EUNSUP, "'%s': Replace normalizer other than ' ' -> U+2581 is "
                                "not supported", v->path);
            replaces = 1;
        } else {
            return mkv_fail(err, MKV_EUNSUP, "'%s': normalizer '%s' is not supported with a "
                            "sentencepiece-style vocabulary", v->path, type);
        }
    }
    n = components(pre_section, "pretokenizers", parts, 16);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(type_of(parts[i]), "Metaspace") != 0)
            return mkv_fail(err, MKV_EUNSUP, "'%s': pre-tokenizer '%s' is not supported with a "
                            "sentencepiece-style vocabulary", v->path, type_of(parts[i]));
        const char *rep = mkv_json_str(mkv_json_get(parts[i], "replacement"), NULL);
        if (!rep || strcmp(rep, METASPACE) != 0)
            return mkv_fail(err, MKV_EUNSUP, "'%s': Metaspace replacement other than U+2581", v->path);
        const char *scheme = mkv_json_str(mkv_json_get(parts[i], "prepend_scheme"), NULL);
        if (!scheme) /* files older than prepend_scheme: add_prefix_space */
            scheme = bool_member(parts[i], "add_prefix_space", 1) ? "always" : "never";
        if (!strcmp(scheme, "first"))
            im->prefix = PREFIX_FIRST;
        else if (!strcmp(scheme, "always"))
            im->prefix = PREFIX_ALWAYS;
        else if (!strcmp(scheme, "never"))
            im->prefix = PREFIX_NEVER;
        else
            return mkv_fail(err, MKV_EUNSUP, "'%s': Metaspace prepend_scheme '%s'", v->path, scheme);
        im->split_words = bool_member(parts[i], "split", 1);
        replaces = 1;
    }
    *is_spm = replaces;
    return MKV_OK;
}

static int has_byte_level(const mkv_json *pre_section)
{
    const mkv_json *parts[16];
    size_t n = components(pre_section, "pretokenizers", parts, 16);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(type_of(parts[i]), "ByteLevel"))
            return 1;
    return 0;
}

/* ------------------------------------------------------------ builders */

/* Id of any token spelled text[0..len), whatever its type; -1 if none. */
static int find_piece(const tj_vocab *v, const char *text, size_t len)
{
    for (int id = 0; id < v->n; id++)
        if (v->len[id] == len && v->type[id] != MKV_TOKEN_UNUSED && !memcmp(v->text[id], text, len))
            return id;
    return -1;
}

static int build_spm(tj_vocab *v, spm_impl *im_in, mkv_tokenizer **out, mkv_error *err)
{
    const mkv_json *merges = member(v->model, "merges");
    size_t n_merges = mkv_json_len(merges);
    if (merges && mkv_json_type_of(merges) != MKV_JSON_ARRAY)
        return mkv_fail(err, MKV_EFORMAT, "'%s': model.merges must be a list", v->path);
    if (n_merges > (size_t)INT32_MAX / 4)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %zu merges is too many", v->path, n_merges);
    spm_impl *im = malloc(sizeof *im);
    if (!im)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for a tokenizer");
    *im = *im_in;
    size_t cap = 16;
    while (cap < 2 * n_merges + 2)
        cap *= 2;
    im->mask = cap - 1;
    im->slots = malloc(cap * sizeof *im->slots);
    mkv_tokenizer *t = NULL;
    int rc = MKV_OK;
    char *joined = NULL;
    if (!im->slots) {
        spm_free(im);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for %zu merges", n_merges);
    }
    for (size_t i = 0; i < cap; i++)
        im->slots[i].key = UINT64_MAX;
    if ((rc = mkv_tokenizer_new(&spm_ops, v->n, &t, err))) {
        spm_free(im);
        return rc;
    }
    t->impl = im;
    snprintf(t->space, sizeof t->space, "%s", METASPACE);
    t->strip_space_after_bos = 1;
    for (int id = 0; id < v->n && rc == MKV_OK; id++) {
        int type = v->type[id];
        if (type == MKV_TOKEN_NORMAL && v->unk_token && !strcmp(v->text[id], v->unk_token))
            type = MKV_TOKEN_UNKNOWN;
        else if (type == MKV_TOKEN_NORMAL && im->byte_fallback && v->len[id] == 6 &&
                 !memcmp(v->text[id], "<0x", 3) && v->text[id][5] == '>')
            type = MKV_TOKEN_BYTE;
        rc = mkv_tokenizer_set_token(t, id, v->text[id], v->len[id], 0.0f, type, err);
    }
    if (rc || (rc = mkv_tokenizer_finish(t, err)))
        goto fail;
    if (v->unk_token)
        for (int id = 0; id < v->n && t->unk_id < 0; id++)
            if (!strcmp(v->text[id], v->unk_token))
                t->unk_id = id;
    for (size_t i = 0; i < n_merges; i++) {
        const char *a, *b;
        size_t alen, blen;
        if ((rc = merge_pieces(v, merges, i, &a, &alen, &b, &blen, err)))
            goto fail;
        char *grown = realloc(joined, alen + blen + 1);
        if (!grown) {
            rc = mkv_fail(err, MKV_ENOMEM, "out of memory reading merges");
            goto fail;
        }
        joined = grown;
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        int left = mkv_tokenizer_lookup(t, a, alen), right = mkv_tokenizer_lookup(t, b, blen);
        int merged = mkv_tokenizer_lookup(t, joined, alen + blen);
        if (left < 0 || right < 0 || merged < 0) {
            /* A pair of special or byte pieces: our symbols never hold
             * them as mergeable pieces, so the merge cannot apply. */
            joined[alen + blen] = '\0';
            if (find_piece(v, a, alen) >= 0 && find_piece(v, b, blen) >= 0 &&
                find_piece(v, joined, alen + blen) >= 0)
                continue;
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': merges[%zu] '%.*s' + '%.*s' uses or makes a piece "
                          "that is not in the vocabulary", v->path, i, (int)alen, a, (int)blen, b);
            goto fail;
        }
        merge_slot *s = &im->slots[slot_of(im, (uint64_t)(uint32_t)left << 32 | (uint32_t)right)];
        if (s->key == UINT64_MAX) /* a repeated pair keeps its first rank */
            *s = (merge_slot){(uint64_t)(uint32_t)left << 32 | (uint32_t)right, (int32_t)i, merged};
    }
    free(joined);
    *out = t;
    return MKV_OK;
fail:
    free(joined);
    mkv_tokenizer_free(t);
    return rc;
}

static int build_byte_level(tj_vocab *v, const char *pre, mkv_tokenizer **out, mkv_error *err)
{
    const mkv_json *merges = member(v->model, "merges");
    size_t n_merges = mkv_json_len(merges);
    if (merges && mkv_json_type_of(merges) != MKV_JSON_ARRAY)
        return mkv_fail(err, MKV_EFORMAT, "'%s': model.merges must be a list", v->path);
    const char **list = malloc((n_merges + 1) * sizeof *list);
    char **owned = calloc(n_merges + 1, sizeof *owned);
    int rc = MKV_OK;
    if (!list || !owned) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for %zu merges", n_merges);
        goto done;
    }
    for (size_t i = 0; i < n_merges; i++) {
        const mkv_json *m = mkv_json_at(merges, i);
        const char *a, *b;
        size_t alen, blen;
        if ((rc = merge_pieces(v, merges, i, &a, &alen, &b, &blen, err)))
            goto done;
        if (mkv_json_type_of(m) == MKV_JSON_STRING) {
            list[i] = mkv_json_str(m, NULL);
            continue;
        }
        /* Byte-level pieces spell a space as U+0120, so "a b" is unambiguous. */
        if (memchr(a, ' ', alen) || memchr(b, ' ', blen)) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': merges[%zu] has a piece with a space, which a "
                          "byte-level vocabulary cannot have", v->path, i);
            goto done;
        }
        if (!(owned[i] = malloc(alen + blen + 2))) {
            rc = mkv_fail(err, MKV_ENOMEM, "out of memory for %zu merges", n_merges);
            goto done;
        }
        snprintf(owned[i], alen + blen + 2, "%.*s %.*s", (int)alen, a, (int)blen, b);
        list[i] = owned[i];
    }
    rc = mkv_bpe_gpt2_create(v->text, v->type, v->n, list, n_merges, pre, -1, -1, out, err);
    if (rc)
        mkv_error_prefix(err, "'%s'", v->path);
done:
    for (size_t i = 0; owned && i < n_merges; i++)
        free(owned[i]);
    free(owned);
    free(list);
    return rc;
}

/* ------------------------------------------------------------ specials */

static int find_token(const mkv_tokenizer *t, const char *text)
{
    if (!text)
        return -1;
    size_t len = strlen(text);
    for (int id = 0; id < t->vocab_size; id++)
        if (t->tokens[id].len == len && !memcmp(t->tokens[id].text, text, len) &&
            t->tokens[id].type != MKV_TOKEN_UNUSED)
            return id;
    return -1;
}

/* bos_token / eos_token of tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(const mkv_json *cfg, const char *key, int *present)
{
    const mkv_json *v = mkv_json_get(cfg, key);
    *present = v != NULL;
    if (v && mkv_json_type_of(v) == MKV_JSON_OBJECT)
        v = mkv_json_get(v, "content");
    return mkv_json_str(v, NULL);
}

/* The first item of the post-processor's single-sequence template when it
 * is a special token: the BOS the tokenizer adds. */
static const char *template_bos(const mkv_json *root)
{
    const mkv_json *parts[16];
    size_t n = components(member(root, "post_processor"), "processors", parts, 16);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(type_of(parts[i]), "TemplateProcessing") != 0)
            continue;
        const mkv_json *first = mkv_json_at(mkv_json_get(parts[i], "single"), 0);
        const mkv_json *special = mkv_json_get(first, "SpecialToken");
        if (special)
            return mkv_json_str(mkv_json_get(special, "id"), NULL);
    }
    return NULL;
}

static int read_chat_template(const mkv_json *cfg, const char *path, char **out, mkv_error *err)
{
    const mkv_json *v = member(cfg, "chat_template");
    const char *s = NULL;
    if (v && mkv_json_type_of(v) == MKV_JSON_ARRAY) {
        for (size_t i = 0; i < mkv_json_len(v); i++) {
            const mkv_json *item = mkv_json_at(v, i);
            const char *name = mkv_json_str(mkv_json_get(item, "name"), NULL);
            if (!s || (name && !strcmp(name, "default")))
                s = mkv_json_str(mkv_json_get(item, "template"), NULL);
        }
    } else if (v) {
        s = mkv_json_str(v, NULL);
    }
    if (v && !s)
        return mkv_fail(err, MKV_EFORMAT, "'%s': chat_template must be a string or a list of "
                        "{name, template}", path);
    if (s && !(*out = strdup(s)))
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the chat template");
    return MKV_OK;
}

static int apply_config(mkv_tokenizer *t, const mkv_json *root, const mkv_json *cfg, const char *cfg_path,
                        int spm, mkv_tokenizer_json_info *info, mkv_error *err)
{
    int has_bos = 0, has_eos = 0;
    const char *bos = cfg ? config_token(cfg, "bos_token", &has_bos) : NULL;
    const char *eos = cfg ? config_token(cfg, "eos_token", &has_eos) : NULL;
    const char *tmpl = template_bos(root);
    if (!has_bos)
        bos = tmpl ? tmpl : spm ? "<s>" : NULL;
    if (!has_eos)
        eos = spm ? "</s>" : NULL;
    t->bos_id = find_token(t, bos);
    t->eos_id = find_token(t, eos);
    if (bos && has_bos && t->bos_id < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': bos_token '%s' is not in the vocabulary", cfg_path, bos);
    if (eos && has_eos && t->eos_id < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': eos_token '%s' is not in the vocabulary", cfg_path, eos);
    if (!info)
        return MKV_OK;
    int add_bos;
    if (cfg && mkv_json_bool(mkv_json_get(cfg, "add_bos_token"), &add_bos) == 0)
        info->add_bos = add_bos;
    else
        info->add_bos = tmpl && t->bos_id >= 0 && t->bos_id == find_token(t, tmpl);
    info->add_bos = info->add_bos && t->bos_id >= 0;
    return cfg ? read_chat_template(cfg, cfg_path, &info->chat_template, err) : MKV_OK;
}

/* ------------------------------------------------------------ entry point */

static int load(tj_vocab *v, const mkv_json *cfg, const char *cfg_path, int vocab_size, mkv_tokenizer **out,
                mkv_tokenizer_json_info *info, mkv_error *err)
{
    if (mkv_json_type_of(v->root) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': not a JSON object", v->path);
    if (cfg && mkv_json_type_of(cfg) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': not a JSON object", cfg_path);
    v->model = member(v->root, "model");
    if (!v->model || mkv_json_type_of(v->model) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': no \"model\" object", v->path);
    const char *type = mkv_json_get(v->model, "type") ? type_of(v->model) : "BPE";
    if (strcmp(type, "BPE") != 0)
        return mkv_fail(err, MKV_EUNSUP, "'%s': tokenizer model '%s' is not supported (only BPE)",
                        v->path, type);
    double dropout = 0.0;
    const char *prefix = mkv_json_str(member(v->model, "continuing_subword_prefix"), NULL);
    const char *suffix = mkv_json_str(member(v->model, "end_of_word_suffix"), NULL);
    if ((member(v->model, "dropout") && mkv_json_double(member(v->model, "dropout"), &dropout) == 0 &&
         dropout > 0.0) || (prefix && *prefix) || (suffix && *suffix))
        return mkv_fail(err, MKV_EUNSUP, "'%s': BPE with dropout, a continuing-subword prefix or an "
                        "end-of-word suffix is not supported", v->path);
    v->unk_token = mkv_json_str(member(v->model, "unk_token"), NULL);
    v->byte_fallback = bool_member(v->model, "byte_fallback", 0);
    int rc = parse_vocab(v, vocab_size, err);
    if (rc)
        return rc;

    const mkv_json *normalizer = member(v->root, "normalizer");
    const mkv_json *pre_section = member(v->root, "pre_tokenizer");
    int spm = 0;
    if (has_byte_level(pre_section)) {
        const char *nt = normalizer ? type_of(normalizer) : "NFC";
        if (strcmp(nt, "NFC") != 0)
            return mkv_fail(err, MKV_EUNSUP, "'%s': normalizer '%s' is not supported with a byte-level "
                            "vocabulary", v->path, nt);
        const char *pre;
        if ((rc = byte_level_pre(v, pre_section, &pre, err)) || (rc = build_byte_level(v, pre, out, err)))
            return rc;
    } else {
        spm_impl im = {0};
        if ((rc = metaspace_style(v, normalizer, pre_section, &im, &spm, err)))
            return rc;
        if (!spm)
            return mkv_fail(err, MKV_EUNSUP, "'%s': neither a byte-level (ByteLevel pre-tokenizer) nor a "
                            "sentencepiece-style (U+2581 spaces) BPE vocabulary", v->path);
        im.byte_fallback = v->byte_fallback;
        im.fuse_unk = bool_member(v->model, "fuse_unk", 0);
        if ((rc = build_spm(v, &im, out, err)))
            return rc;
    }
    if ((rc = apply_config(*out, v->root, cfg, cfg_path, spm, info, err))) {
        mkv_tokenizer_free(*out);
        *out = NULL;
    }
    return rc;
}

int mkv_tokenizer_json_load(const char *tokenizer_json, const char *tokenizer_config, int vocab_size,
                            mkv_tokenizer **out, mkv_tokenizer_json_info *info, mkv_error *err)
{
    *out = NULL;
    if (info)
        memset(info, 0, sizeof *info);
    mkv_json_doc *doc = NULL, *cfg = NULL;
    int rc = mkv_json_parse_file(tokenizer_json, NULL, &doc, err);
    if (rc)
        return rc;
    if (tokenizer_config && (rc = mkv_json_parse_file(tokenizer_config, NULL, &cfg, err))) {
        mkv_json_free(doc);
        return rc;
    }
    tj_vocab v = {.path = tokenizer_json, .root = mkv_json_root(doc)};
    rc = load(&v, cfg ? mkv_json_root(cfg) : NULL, tokenizer_config, vocab_size, out, info, err);
    vocab_free(&v);
    mkv_json_free(doc);
    mkv_json_free(cfg);
    if (rc)
        mkv_tokenizer_json_info_free(info);
    return rc;
}

void mkv_tokenizer_json_info_free(mkv_tokenizer_json_info *info)
{
    if (!info)
        return;
    free(info->chat_template);
    info->chat_template = NULL;
}
