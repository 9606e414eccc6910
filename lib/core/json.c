/* Strict RFC 8259 JSON parser (see json.h).
 *
 * One recursive-descent pass over the input.  Children of an array or
 * object are collected on a growing stack and copied into the document's
 * arena when the container closes, so every value is copied once and the
 * whole parse stays linear.  Strings are decoded straight into the arena. */
#include "core/json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Recursion is two C frames per nesting level; keep it far from the stack
 * limit whatever the caller asks for. */
#define DEPTH_CAP 4096
/* Objects with at least this many members get a hash index. */
#define HASH_MIN_MEMBERS 8

typedef struct json_member json_member;

struct mkv_json {
    mkv_json_type type;
    int is_int;        /* number written as an integer that fits int64 */
    size_t n;          /* string bytes, array elements, object members */
    union {
        struct {
            double d;
            int64_t i;
        } num;
        const char *str;
        mkv_json *items;
        struct {
            json_member *members;
            uint32_t *index; /* open addressing, member index + 1, 0 = empty */
            size_t index_cap; /* power of two, 0 = no index */
        } obj;
    } u;
};

struct json_member {
    const char *key;
    size_t key_len;
    size_t offset; /* byte offset of the key in the input, for messages */
    mkv_json value;
};

typedef struct arena_block {
    struct arena_block *next;
    size_t cap, used;
    max_align_t data[];
} arena_block;

struct mkv_json_doc {
    arena_block *blocks;
    mkv_json *root;
};

typedef struct {
    const unsigned char *start, *p, *end;
    int depth, max_depth;
    mkv_json_doc *doc;
    mkv_json *vstack;
    size_t vlen, vcap;
    json_member *mstack;
    size_t mlen, mcap;
    mkv_error *err;
} parser;

/* ---------------------------------------------------------------- arena */

static void *arena_alloc(mkv_json_doc *doc, size_t size)
{
    const size_t align = sizeof(max_align_t);
    size = (size + align - 1) / align * align;
    if (size == 0)
        size = align;
    arena_block *b = doc->blocks;
    if (b == NULL || b->cap - b->used < size) {
        size_t cap = (size_t)1 << 16;
        if (b != NULL && b->cap < ((size_t)1 << 24))
            cap = b->cap * 2; /* grow blocks geometrically: few mallocs for big inputs */
        if (cap < size)
            cap = size;
        if (cap > SIZE_MAX - sizeof(arena_block))
            return NULL;
        arena_block *nb = malloc(sizeof(arena_block) + cap);
        if (nb == NULL)
            return NULL;
        nb->cap = cap;
        nb->used = 0;
        nb->next = doc->blocks;
        doc->blocks = nb;
        b = nb;
    }
    void *p = (char *)b->data + b->used;
    b->used += size;
    return p;
}

/* ---------------------------------------------------------------- errors */

static int fail_at(parser *ps, const unsigned char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail_at(parser *ps, const unsigned char *where, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mkv_fail(ps->err, MKV_EFORMAT, "invalid JSON at byte %zu: %s",
                    (size_t)(where - ps->start), what);
}

static int fail_nomem(parser *ps)
{
    return mkv_fail(ps->err, MKV_ENOMEM, "out of memory while parsing JSON (input of %zu bytes)",
                    (size_t)(ps->end - ps->start));
}

/* Describe the byte at p for a message: 'x', "end of input" or 0xNN. */
static const char *describe(const parser *ps, const unsigned char *p, char buf[16])
{
    if (p >= ps->end)
        return "end of input";
    if (*p >= 0x20 && *p < 0x7f)
        snprintf(buf, 16, "'%c'", *p);
    else
        snprintf(buf, 16, "byte 0x%02x", *p);
    return buf;
}

/* ---------------------------------------------------------------- lexing */

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Four hex digits at p (bounds checked by the caller); -1 if not hex. */
static long hex4(const unsigned char *p)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(p[i]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

static size_t put_utf8(unsigned char *out, unsigned long cp)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0 if ill-formed. */
static size_t utf8_seq_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return n;
}

/* The opening quote is at ps->p.  Decodes into the arena. */
static int parse_string(parser *ps, const char **out, size_t *out_len)
{
    const unsigned char *open = ps->p;
    const unsigned char *q = open + 1;
    /* Find the closing quote first so the output buffer can be sized:
     * decoding never makes a string longer. */
    while (q < ps->end && *q != '"') {
        if (*q == '\\' && ps->end - q < 2) {
            q = ps->end; /* a lone backslash at the very end */
            break;
        }
        q += (*q == '\\') ? 2 : 1;
    }
    if (q >= ps->end)
        return fail_at(ps, open, "unterminated string");
    const unsigned char *close = q;

    unsigned char *buf = arena_alloc(ps->doc, (size_t)(close - open));
    if (buf == NULL)
        return fail_nomem(ps);
    size_t n = 0;
    const unsigned char *p = open + 1;
    char desc[16];
    while (p < close) {
        unsigned char c = *p;
        if (c == '\\') {
            unsigned char e = p[1]; /* p + 1 < close: a backslash never precedes close directly */
            switch (e) {
            case '"': buf[n++] = '"'; p += 2; continue;
            case '\\': buf[n++] = '\\'; p += 2; continue;
            case '/': buf[n++] = '/'; p += 2; continue;
            case 'b': buf[n++] = '\b'; p += 2; continue;
            case 'f': buf[n++] = '\f'; p += 2; continue;
            case 'n': buf[n++] = '\n'; p += 2; continue;
            case 'r': buf[n++] = '\r'; p += 2; continue;
            case 't': buf[n++] = '\t'; p += 2; continue;
            case 'u': break;
            default:
                return fail_at(ps, p, "invalid escape: backslash followed by %s",
                               describe(ps, p + 1, desc));
            }
            long cp = (close - p >= 6) ? hex4(p + 2) : -1;
            if (cp < 0)
                return fail_at(ps, p, "invalid \\u escape: four hex digits expected");
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return fail_at(ps, p, "unpaired low surrogate \\u%04lX in string", (unsigned long)cp);
            if (cp >= 0xd800 && cp <= 0xdbff) {
                long lo = -1;
                if (close - p >= 12 && p[6] == '\\' && p[7] == 'u')
                    lo = hex4(p + 8);
                if (lo < 0xdc00 || lo > 0xdfff)
                    return fail_at(ps, p, "high surrogate \\u%04lX not followed by a low surrogate",
                                   (unsigned long)cp);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            p += 6;
            n += put_utf8(buf + n, (unsigned long)cp);
        } else if (c < 0x20) {
            return fail_at(ps, p, "unescaped control character 0x%02x in string", c);
        } else if (c < 0x80) {
            buf[n++] = c;
            p++;
        } else {
            size_t len = utf8_seq_len(p, close);
            if (len == 0)
                return fail_at(ps, p, "invalid UTF-8 in string");
            memcpy(buf + n, p, len);
            n += len;
            p += len;
        }
    }
    buf[n] = '\0';
    *out = (const char *)buf;
    *out_len = n;
    ps->p = close + 1;
    return MKV_OK;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *ps, mkv_json *v)
{
    const unsigned char *s = ps->p, *p = s;
    int neg = 0, integral = 1;
    if (p < ps->end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= ps->end || !is_digit(*p))
        return fail_at(ps, s, "invalid number: digit expected after '-'");
    if (*p == '0') {
        p++;
        if (p < ps->end && is_digit(*p))
            return fail_at(ps, s, "invalid number: leading zero");
    } else {
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && *p == '.') {
        integral = 0;
        p++;
        if (p >= ps->end || !is_digit(*p))
            return fail_at(ps, s, "invalid number: digit expected after '.'");
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < ps->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= ps->end || !is_digit(*p))
            return fail_at(ps, s, "invalid number: digit expected in exponent");
        while (p < ps->end && is_digit(*p))
            p++;
    }
    size_t len = (size_t)(p - s);

    v->type = MKV_JSON_NUMBER;
    v->is_int = 0;
    if (integral) {
        /* Exact int64 when it fits; |INT64_MIN| = INT64_MAX + 1. */
        uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, acc = 0;
        int fits = 1;
        for (const unsigned char *d = s + neg; d < p && fits; d++) {
            unsigned dig = (unsigned)(*d - '0');
            if (acc > (limit - dig) / 10)
                fits = 0;
            else
                acc = acc * 10 + dig;
        }
        if (fits) {
            v->is_int = 1;
            v->u.num.i = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc)
                             : (int64_t)acc;
        }
    }

    /* strtod needs a terminated copy: the input need not be. */
    char small[64];
    char *tmp = len < sizeof small ? small : malloc(len + 1);
    if (tmp == NULL)
        return fail_nomem(ps);
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    errno = 0;
    double d = strtod(tmp, NULL);
    if (tmp != small)
        free(tmp);
    if (isinf(d))
        return fail_at(ps, s, "number %.*s out of range", len > 40 ? 40 : (int)len, (const char *)s);
    v->u.num.d = d;
    ps->p = p;
    return MKV_OK;
}

static int parse_literal(parser *ps, const char *word, mkv_json_type type, mkv_json *v)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) {
        char desc[16];
        return fail_at(ps, ps->p, "unexpected %s", describe(ps, ps->p, desc));
    }
    ps->p += n;
    v->type = type;
    return MKV_OK;
}

/* ---------------------------------------------------------------- containers */

static int parse_value(parser *ps, mkv_json *v);

static int enter(parser *ps)
{
    if (++ps->depth > ps->max_depth)
        return fail_at(ps, ps->p, "nesting deeper than %d levels", ps->max_depth);
    return MKV_OK;
}

static int push_value(parser *ps, const mkv_json *v)
{
    if (ps->vlen == ps->vcap) {
        size_t cap = ps->vcap ? ps->vcap * 2 : 64;
        mkv_json *s = realloc(ps->vstack, cap * sizeof *s);
        if (s == NULL)
            return fail_nomem(ps);
        ps->vstack = s;
        ps->vcap = cap;
    }
    ps->vstack[ps->vlen++] = *v;
    return MKV_OK;
}

static int push_member(parser *ps, const json_member *m)
{
    if (ps->mlen == ps->mcap) {
        size_t cap = ps->mcap ? ps->mcap * 2 : 64;
        json_member *s = realloc(ps->mstack, cap * sizeof *s);
        if (s == NULL)
            return fail_nomem(ps);
        ps->mstack = s;
        ps->mcap = cap;
    }
    ps->mstack[ps->mlen++] = *m;
    return MKV_OK;
}

static int parse_array(parser *ps, mkv_json *v)
{
    int rc = enter(ps);
    if (rc)
        return rc;
    ps->p++; /* '[' */
    size_t base = ps->vlen;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
    } else {
        for (;;) {
            mkv_json item;
            if ((rc = parse_value(ps, &item)) || (rc = push_value(ps, &item)))
                return rc;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == ']') {
                ps->p++;
                break;
            }
            char desc[16];
            return fail_at(ps, ps->p, "expected ',' or ']' in array, found %s", describe(ps, ps->p, desc));
        }
    }
    size_t n = ps->vlen - base;
    v->type = MKV_JSON_ARRAY;
    v->n = n;
    v->u.items = NULL;
    if (n > 0) {
        v->u.items = arena_alloc(ps->doc, n * sizeof(mkv_json));
        if (v->u.items == NULL)
            return fail_nomem(ps);
        memcpy(v->u.items, ps->vstack + base, n * sizeof(mkv_json));
    }
    ps->vlen = base;
    ps->depth--;
    return MKV_OK;
}

static uint64_t hash_key(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int keys_equal(const json_member *m, const char *key, size_t len)
{
    return m->key_len == len && memcmp(m->key, key, len) == 0;
}

static int fail_duplicate(parser *ps, const json_member *m)
{
    return fail_at(ps, ps->start + m->offset, "duplicate key \"%.*s\" in object",
                   m->key_len > 80 ? 80 : (int)m->key_len, m->key);
}

/* Index the members of a finished object (and find duplicate keys). */
static int index_object(parser *ps, mkv_json *v)
{
    json_member *m = v->u.obj.members;
    size_t n = v->n;
    if (n < HASH_MIN_MEMBERS) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (keys_equal(&m[j], m[i].key, m[i].key_len))
                    return fail_duplicate(ps, &m[i]);
        return MKV_OK;
    }
    if (n >= UINT32_MAX / 2)
        return fail_at(ps, ps->start + m[0].offset, "object with too many members (%zu)", n);
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint32_t *index = arena_alloc(ps->doc, cap * sizeof(uint32_t));
    if (index == NULL)
        return fail_nomem(ps);
    memset(index, 0, cap * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        size_t slot = (size_t)hash_key(m[i].key, m[i].key_len) & (cap - 1);
        while (index[slot] != 0) {
            if (keys_equal(&m[index[slot] - 1], m[i].key, m[i].key_len))
                return fail_duplicate(ps, &m[i]);
            slot = (slot + 1) & (cap - 1);
        }
        index[slot] = (uint32_t)(i + 1);
    }
    v->u.obj.index = index;
    v->u.obj.index_cap = cap;
    return MKV_OK;
}

static int parse_object(parser *ps, mkv_json *v)
{
    int rc = enter(ps);
    if (rc)
        return rc;
    ps->p++; /* '{' */
    size_t base = ps->mlen;
    char desc[16];
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
    } else {
        for (;;) {
            json_member m;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"')
                return fail_at(ps, ps->p, "expected a string key in object, found %s",
                               describe(ps, ps->p, desc));
            m.offset = (size_t)(ps->p - ps->start);
            if ((rc = parse_string(ps, &m.key, &m.key_len)))
                return rc;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return fail_at(ps, ps->p, "expected ':' after object key, found %s",
                               describe(ps, ps->p, desc));
            ps->p++;
            if ((rc = parse_value(ps, &m.value)) || (rc = push_member(ps, &m)))
                return rc;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == '}') {
                ps->p++;
                break;
            }
            return fail_at(ps, ps->p, "expected ',' or '}' in object, found %s", describe(ps, ps->p, desc));
        }
    }
    size_t n = ps->mlen - base;
    v->type = MKV_JSON_OBJECT;
    v->n = n;
    v->u.obj.members = NULL;
    v->u.obj.index = NULL;
    v->u.obj.index_cap = 0;
    if (n > 0) {
        v->u.obj.members = arena_alloc(ps->doc, n * sizeof(json_member));
        if (v->u.obj.members == NULL)
            return fail_nomem(ps);
        memcpy(v->u.obj.members, ps->mstack + base, n * sizeof(json_member));
    }
    ps->mlen = base;
    ps->depth--;
    return index_object(ps, v);
}

static int parse_value(parser *ps, mkv_json *v)
{
    char desc[16];
    skip_ws(ps);
    memset(v, 0, sizeof *v);
    if (ps->p >= ps->end)
        return fail_at(ps, ps->p, "unexpected end of input, a value was expected");
    switch (*ps->p) {
    case '{':
        return parse_object(ps, v);
    case '[':
        return parse_array(ps, v);
    case '"':
        v->type = MKV_JSON_STRING;
        return parse_string(ps, &v->u.str, &v->n);
    case 't':
        return parse_literal(ps, "true", MKV_JSON_TRUE, v);
    case 'f':
        return parse_literal(ps, "false", MKV_JSON_FALSE, v);
    case 'n':
        return parse_literal(ps, "null", MKV_JSON_NULL, v);
    default:
        if (*ps->p == '-' || is_digit(*ps->p))
            return parse_number(ps, v);
        return fail_at(ps, ps->p, "unexpected %s, a value was expected", describe(ps, ps->p, desc));
    }
}

/* ---------------------------------------------------------------- public */

void mkv_json_free(mkv_json_doc *doc)
{
    if (doc == NULL)
        return;
    arena_block *b = doc->blocks;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(doc);
}

int mkv_json_parse(const char *text, size_t len, const mkv_json_limits *limits,
                   mkv_json_doc **out, mkv_error *err)
{
    size_t max_bytes = limits && limits->max_bytes ? limits->max_bytes : MKV_JSON_DEFAULT_MAX_BYTES;
    int max_depth = limits && limits->max_depth > 0 ? limits->max_depth : MKV_JSON_DEFAULT_MAX_DEPTH;
    if (max_depth > DEPTH_CAP)
        max_depth = DEPTH_CAP;
    *out = NULL;
    if (len > max_bytes)
        return mkv_fail(err, MKV_EFORMAT, "JSON text of %zu bytes exceeds the limit of %zu bytes",
                        len, max_bytes);
    mkv_json_doc *doc = calloc(1, sizeof *doc);
    if (doc == NULL)
        return mkv_fail(err, MKV_ENOMEM, "out of memory while parsing JSON");
    parser ps = {0};
    ps.start = ps.p = (const unsigned char *)text;
    ps.end = ps.start + len;
    ps.max_depth = max_depth;
    ps.doc = doc;
    ps.err = err;

    int rc = MKV_OK;
    doc->root = arena_alloc(doc, sizeof(mkv_json));
    if (doc->root == NULL)
        rc = fail_nomem(&ps);
    if (rc == MKV_OK)
        rc = parse_value(&ps, doc->root);
    if (rc == MKV_OK) {
        skip_ws(&ps);
        if (ps.p != ps.end) {
            char desc[16];
            rc = fail_at(&ps, ps.p, "unexpected %s after the JSON value", describe(&ps, ps.p, desc));
        }
    }
    free(ps.vstack);
    free(ps.mstack);
    if (rc != MKV_OK) {
        mkv_json_free(doc);
        return rc;
    }
    *out = doc;
    return MKV_OK;
}

int mkv_json_parse_file(const char *path, const mkv_json_limits *limits,
                        mkv_json_doc **out, mkv_error *err)
{
    size_t max_bytes = limits && limits->max_bytes ? limits->max_bytes : MKV_JSON_DEFAULT_MAX_BYTES;
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mkv_fail_errno(err, MKV_EIO, e, "cannot read '%s'", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mkv_fail(err, MKV_EIO, "cannot read '%s': not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return mkv_fail(err, MKV_EFORMAT, "'%s': JSON file of %lld bytes exceeds the limit of %zu bytes",
                        path, (long long)st.st_size, max_bytes);
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size ? size : 1);
    if (buf == NULL) {
        close(fd);
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory reading %zu bytes", path, size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(buf);
            close(fd);
            if (e)
                return mkv_fail_errno(err, MKV_EIO, e, "cannot read '%s'", path);
            return mkv_fail(err, MKV_EIO, "cannot read '%s': file shrank while reading", path);
        }
        got += (size_t)r;
    }
    close(fd);
    int rc = mkv_json_parse(buf, size, limits, out, err);
    free(buf);
    if (rc != MKV_OK)
        mkv_error_prefix(err, "'%s'", path);
    return rc;
}

const mkv_json *mkv_json_root(const mkv_json_doc *doc)
{
    return doc ? doc->root : NULL;
}

mkv_json_type mkv_json_type_of(const mkv_json *v)
{
    return v ? v->type : MKV_JSON_NULL;
}

const char *mkv_json_type_name(mkv_json_type t)
{
    switch (t) {
    case MKV_JSON_NULL: return "null";
    case MKV_JSON_FALSE:
    case MKV_JSON_TRUE: return "boolean";
    case MKV_JSON_NUMBER: return "number";
    case MKV_JSON_STRING: return "string";
    case MKV_JSON_ARRAY: return "array";
    case MKV_JSON_OBJECT: return "object";
    }
    return "?";
}

size_t mkv_json_len(const mkv_json *v)
{
    if (v == NULL)
        return 0;
    switch (v->type) {
    case MKV_JSON_STRING:
    case MKV_JSON_ARRAY:
    case MKV_JSON_OBJECT:
        return v->n;
    default:
        return 0;
    }
}

const mkv_json *mkv_json_at(const mkv_json *v, size_t i)
{
    if (v == NULL || v->type != MKV_JSON_ARRAY || i >= v->n)
        return NULL;
    return &v->u.items[i];
}

int mkv_json_find(const mkv_json *v, const char *key, size_t key_len, size_t *index)
{
    if (v == NULL || v->type != MKV_JSON_OBJECT)
        return -1;
    const json_member *m = v->u.obj.members;
    if (v->u.obj.index != NULL) {
        size_t mask = v->u.obj.index_cap - 1;
        size_t slot = (size_t)hash_key(key, key_len) & mask;
        for (uint32_t e; (e = v->u.obj.index[slot]) != 0; slot = (slot + 1) & mask)
            if (keys_equal(&m[e - 1], key, key_len)) {
                if (index)
                    *index = e - 1;
                return 0;
            }
        return -1;
    }
    for (size_t i = 0; i < v->n; i++)
        if (keys_equal(&m[i], key, key_len)) {
            if (index)
                *index = i;
            return 0;
        }
    return -1;
}

const mkv_json *mkv_json_get_n(const mkv_json *v, const char *key, size_t key_len)
{
    size_t i;
    if (mkv_json_find(v, key, key_len, &i) != 0)
        return NULL;
    return &v->u.obj.members[i].value;
}

const mkv_json *mkv_json_get(const mkv_json *v, const char *key)
{
    return mkv_json_get_n(v, key, strlen(key));
}

const char *mkv_json_key_at(const mkv_json *v, size_t i, size_t *key_len)
{
    if (v == NULL || v->type != MKV_JSON_OBJECT || i >= v->n)
        return NULL;
    if (key_len)
        *key_len = v->u.obj.members[i].key_len;
    return v->u.obj.members[i].key;
}

const mkv_json *mkv_json_value_at(const mkv_json *v, size_t i)
{
    if (v == NULL || v->type != MKV_JSON_OBJECT || i >= v->n)
        return NULL;
    return &v->u.obj.members[i].value;
}

const char *mkv_json_str(const mkv_json *v, size_t *len)
{
    if (v == NULL || v->type != MKV_JSON_STRING)
        return NULL;
    if (len)
        *len = v->n;
    return v->u.str;
}

int mkv_json_double(const mkv_json *v, double *out)
{
    if (v == NULL || v->type != MKV_JSON_NUMBER)
        return -1;
    *out = v->u.num.d;
    return 0;
}

int mkv_json_int64(const mkv_json *v, int64_t *out)
{
    if (v == NULL || v->type != MKV_JSON_NUMBER || !v->is_int)
        return -1;
    *out = v->u.num.i;
    return 0;
}

int mkv_json_bool(const mkv_json *v, int *out)
{
    if (v == NULL || (v->type != MKV_JSON_TRUE && v->type != MKV_JSON_FALSE))
        return -1;
    *out = v->type == MKV_JSON_TRUE;
    return 0;
}
