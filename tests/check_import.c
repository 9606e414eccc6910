/* Unit tests: the JSON parser, the safetensors and .npy readers, and
 * mkv_import.
 *
 * References are independent of the code under test: JSON cases are
 * computed by hand; safetensors and .npy files are written here byte by
 * byte (headers typed out, values encoded by a separate exact fp16/bf16
 * encoder, known bit patterns), and one .npy is written by numpy itself
 * when /usr/bin/python3 has it.  Imports are read back through the dump
 * reader and compared with the formula that generated the input. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "io/dump.h"
#include "io/h5file.h"
#include "io/import.h"
#include "core/json.h"
#include "core/log.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "testutil.h"

/* ================================================================ helpers */

static char *tpath(const char *name)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ % 8];
    return test_path(b, 512, name);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A .safetensors file from a header typed by the test, with a given
 * header-length field (normally strlen(header)). */
static void write_st_raw(const char *path, uint64_t hlen_field, const char *header, const void *data,
                         size_t dlen)
{
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl + dlen + 1);
    put_le(buf, hlen_field, 8);
    memcpy(buf + 8, header, hl);
    if (dlen)
        memcpy(buf + 8 + hl, data, dlen);
    write_bytes(path, buf, 8 + hl + dlen);
    free(buf);
}

static void write_st(const char *path, const char *header, const void *data, size_t dlen)
{
    write_st_raw(path, strlen(header), header, data, dlen);
}

/* Exact encoders for values that fp16/bf16 represent exactly (asserted):
 * built from frexp, independent of lib/core/half.c. */
static uint16_t enc_small_float(double x, int mant_bits, int bias)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (x == 0)
        return sign;
    int e;
    double m = frexp(fabs(x), &e); /* |x| = m 2^e, m in [0.5, 1) */
    double frac = (2 * m - 1) * (double)(1 << mant_bits);
    ck_assert_msg(frac == floor(frac) && e - 1 + bias > 0, "%g is not exact in this format", x);
    return (uint16_t)(sign | (uint16_t)((e - 1 + bias) << mant_bits) | (uint16_t)frac);
}
static uint16_t enc_f16(double x) { return enc_small_float(x, 10, 15); }
static uint16_t enc_bf16(double x) { return enc_small_float(x, 7, 127); }

/* The value of element (l, h, t, d) of k (kind 0), v (1) or q (2): quarter
 * steps in [-7.5, 7.5], exact in every format, different for swapped h/t. */
static float val(int kind, int l, int h, int t, int d)
{
    return (float)(((kind * 11 + l * 7 + h * 5 + t * 3 + d) % 61 - 30) * 0.25);
}

/* Append n values in dtype ("F32", "F16", "BF16") to a byte buffer. */
typedef struct {
    uint8_t *data;
    size_t len, cap;
    char hdr[1 << 15];
    size_t hlen;
} st_builder;

static void sb_init(st_builder *b)
{
    memset(b, 0, sizeof *b);
    b->hdr[b->hlen++] = '{';
}

static uint8_t *sb_grow(st_builder *b, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->data = realloc(b->data, b->cap);
        ck_assert(b->data != NULL);
    }
    uint8_t *p = b->data + b->len;
    b->len += n;
    return p;
}

static void sb_put_value(st_builder *b, const char *dtype, double x)
{
    if (strcmp(dtype, "F32") == 0) {
        float f = (float)x;
        uint32_t u;
        memcpy(&u, &f, 4);
        put_le(sb_grow(b, 4), u, 4);
    } else if (strcmp(dtype, "F16") == 0) {
        put_le(sb_grow(b, 2), enc_f16(x), 2);
    } else if (strcmp(dtype, "BF16") == 0) {
        put_le(sb_grow(b, 2), enc_bf16(x), 2);
    } else if (strcmp(dtype, "I64") == 0) {
        put_le(sb_grow(b, 8), (uint64_t)(int64_t)x, 8);
    } else {
        ck_assert_str_eq(dtype, "I32");
        put_le(sb_grow(b, 4), (uint32_t)(int32_t)x, 4);
    }
}

/* Start a tensor entry; its values follow with sb_put_value, then sb_end. */
static size_t sb_begin;
static void sb_start(st_builder *b) { sb_begin = b->len; }
static void sb_end(st_builder *b, const char *name, const char *dtype, int ndim, const int64_t *shape)
{
    char shp[128] = "";
    size_t n = 0;
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(shp + n, sizeof shp - n, "%s%lld", i ? "," : "", (long long)shape[i]);
    b->hlen += (size_t)snprintf(b->hdr + b->hlen, sizeof b->hdr - b->hlen,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                                b->hlen > 1 ? "," : "", name, dtype, shp, sb_begin, b->len);
    ck_assert(b->hlen < sizeof b->hdr - 2);
}

static void sb_write(st_builder *b, const char *path)
{
    b->hdr[b->hlen++] = '}';
    b->hdr[b->hlen] = '\0';
    write_st(path, b->hdr, b->data, b->len);
    free(b->data);
    b->data = NULL;
}

/* Add a [heads, len, D] tensor of val(kind, l, ...). */
static void sb_add_block(st_builder *b, const char *name, const char *dtype, int kind, int l, int heads,
                         int len, int D)
{
    sb_start(b);
    for (int h = 0; h < heads; h++)
        for (int t = 0; t < len; t++)
            for (int d = 0; d < D; d++)
                sb_put_value(b, dtype, val(kind, l, h, t, d));
    int64_t shape[3] = {heads, len, D};
    sb_end(b, name, dtype, 3, shape);
}

/* Read a dump back through the dump reader and compare every value with
 * val(); W queries at positions qpos (NULL: none). */
static void check_dump(const char *path, int L, int NH, int H, int T, int W, int D, const int32_t *qpos,
                       const int32_t *tokens)
{
    mkv_dump *d;
    mkv_error err;
    ck_assert_msg(mkv_dump_open(path, &d, &err) == MKV_OK, "%s", err.msg);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    ck_assert_int_eq(m->n_layers, L);
    ck_assert_int_eq(m->n_heads, NH);
    ck_assert_int_eq(m->n_kv_heads, H);
    ck_assert_int_eq(m->head_dim, D);
    ck_assert_int_eq(m->n_tokens, T);
    ck_assert_int_eq(m->n_queries, W);
    ck_assert_str_eq(m->source, "import");
    ck_assert_int_eq(m->has_tokens, tokens != NULL);
    float *buf = malloc(sizeof(float) * (size_t)(NH > H ? NH : H) * (size_t)T * (size_t)D);
    for (int l = 0; l < L; l++)
        for (int kind = 0; kind < (W ? 3 : 2); kind++) {
            int heads = kind == 2 ? NH : H, len = kind == 2 ? W : T;
            ck_assert_msg(mkv_dump_read(d, l, "kvq"[kind], 0, heads, 0, len, buf, &err) == MKV_OK, "%s",
                          err.msg);
            for (int h = 0; h < heads; h++)
                for (int t = 0; t < len; t++)
                    for (int x = 0; x < D; x++) {
                        float got = buf[((size_t)h * len + t) * D + x];
                        ck_assert_msg(got == val(kind, l, h, t, x), "layer %d %c [%d,%d,%d]: %g != %g", l,
                                      "kvq"[kind], h, t, x, got, val(kind, l, h, t, x));
                    }
        }
    int32_t ibuf[64];
    if (W) {
        ck_assert_int_eq(mkv_dump_read_query_pos(d, ibuf, &err), MKV_OK);
        for (int i = 0; i < W; i++)
            ck_assert_int_eq(ibuf[i], qpos[i]);
    }
    if (tokens) {
        ck_assert_int_eq(mkv_dump_read_tokens(d, ibuf, &err), MKV_OK);
        for (int i = 0; i < T; i++)
            ck_assert_int_eq(ibuf[i], tokens[i]);
    }
    free(buf);
    mkv_dump_close(d);
}

/* Remove a directory tree of plain files (what the tests create). */
static void rm_rf(const char *path)
{
    DIR *dir = opendir(path);
    if (dir != NULL) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        closedir(dir);
    }
    remove(path);
}

/* ================================================================ JSON */

static const mkv_json *parse_ok(const char *text, mkv_json_doc **doc)
{
    mkv_error err;
    int rc = mkv_json_parse(text, strlen(text), NULL, doc, &err);
    ck_assert_msg(rc == MKV_OK, "%s: %s", text, err.msg);
    return mkv_json_root(*doc);
}

START_TEST(json_values)
{
    mkv_json_doc *doc;
    const mkv_json *r = parse_ok(
        " {\"a\": [1, -2, 3.5, 1e2, -0.125E+1, true, false, null, {}, []],\n"
        "  \"s\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\",\n"
        "  \"u\": \"\\u00e9\\u20AC\\ud83d\\ude00 \xc3\xa9\xf0\x9f\x98\x80\",\n"
        "  \"big\": 9223372036854775807, \"neg\": -9223372036854775808,\n"
        "  \"over\": 9223372036854775808, \"zero\": \"\\u0000a\", \"\": 0} ",
        &doc);
    ck_assert_int_eq(mkv_json_type_of(r), MKV_JSON_OBJECT);
    ck_assert_uint_eq(mkv_json_len(r), 8);
    const mkv_json *a = mkv_json_get(r, "a");
    ck_assert_uint_eq(mkv_json_len(a), 10);
    int64_t i;
    double x;
    int b;
    ck_assert_int_eq(mkv_json_int64(mkv_json_at(a, 0), &i), 0);
    ck_assert_int_eq(i, 1);
    ck_assert_int_eq(mkv_json_int64(mkv_json_at(a, 1), &i), 0);
    ck_assert_int_eq(i, -2);
    ck_assert_int_eq(mkv_json_int64(mkv_json_at(a, 2), &i), -1); /* 3.5 is not an integer */
    ck_assert_int_eq(mkv_json_double(mkv_json_at(a, 2), &x), 0);
    ck_assert(x == 3.5);
    ck_assert_int_eq(mkv_json_int64(mkv_json_at(a, 3), &i), -1); /* 1e2: exponent form */
    ck_assert_int_eq(mkv_json_double(mkv_json_at(a, 3), &x), 0);
    ck_assert(x == 100.0);
    ck_assert_int_eq(mkv_json_double(mkv_json_at(a, 4), &x), 0);
    ck_assert(x == -1.25);
    ck_assert_int_eq(mkv_json_bool(mkv_json_at(a, 5), &b), 0);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(mkv_json_bool(mkv_json_at(a, 6), &b), 0);
    ck_assert_int_eq(b, 0);
    ck_assert_int_eq(mkv_json_type_of(mkv_json_at(a, 7)), MKV_JSON_NULL);
    ck_assert_int_eq(mkv_json_bool(mkv_json_at(a, 7), &b), -1);
    ck_assert_int_eq(mkv_json_type_of(mkv_json_at(a, 8)), MKV_JSON_OBJECT);
    ck_assert_uint_eq(mkv_json_len(mkv_json_at(a, 8)), 0);
    ck_assert_int_eq(mkv_json_type_of(mkv_json_at(a, 9)), MKV_JSON_ARRAY);
    ck_assert_ptr_null(mkv_json_at(a, 10));
    ck_assert_ptr_null(mkv_json_at(r, 0)); /* not an array */

    size_t n;
    const char *s = mkv_json_str(mkv_json_get(r, "s"), &n);
    ck_assert_uint_eq(n, 9);
    ck_assert_mem_eq(s, "x\"\\/\b\f\n\r\t", 9);
    s = mkv_json_str(mkv_json_get(r, "u"), &n);
    const char *want_u = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xc3\xa9\xf0\x9f\x98\x80";
    ck_assert_uint_eq(n, strlen(want_u));
    ck_assert_str_eq(s, want_u);
    ck_assert_int_eq(mkv_json_int64(mkv_json_get(r, "big"), &i), 0);
    ck_assert(i == INT64_MAX);
    ck_assert_int_eq(mkv_json_int64(mkv_json_get(r, "neg"), &i), 0);
    ck_assert(i == INT64_MIN);
    ck_assert_int_eq(mkv_json_int64(mkv_json_get(r, "over"), &i), -1);
    ck_assert_int_eq(mkv_json_double(mkv_json_get(r, "over"), &x), 0);
    ck_assert(x == 9223372036854775808.0);
    s = mkv_json_str(mkv_json_get(r, "zero"), &n);
    ck_assert_uint_eq(n, 2);
    ck_assert(s[0] == '\0' && s[1] == 'a');
    ck_assert_ptr_nonnull(mkv_json_get(r, ""));
    ck_assert_ptr_null(mkv_json_get(r, "missing"));
    ck_assert_ptr_null(mkv_json_get(a, "a")); /* not an object */
    ck_assert_ptr_null(mkv_json_str(a, NULL));

    size_t klen, idx;
    ck_assert_str_eq(mkv_json_key_at(r, 1, &klen), "s");
    ck_assert_uint_eq(klen, 1);
    ck_assert_int_eq(mkv_json_find(r, "zero", 4, &idx), 0);
    ck_assert_uint_eq(idx, 6);
    ck_assert_ptr_eq(mkv_json_value_at(r, 6), mkv_json_get(r, "zero"));
    ck_assert_ptr_null(mkv_json_key_at(r, 8, NULL));
    mkv_json_free(doc);

    /* any value at top level (RFC 8259) */
    r = parse_ok("\"top\"", &doc);
    ck_assert_str_eq(mkv_json_str(r, NULL), "top");
    mkv_json_free(doc);
    r = parse_ok("-0", &doc);
    ck_assert_int_eq(mkv_json_int64(r, &i), 0);
    ck_assert_int_eq(i, 0);
    mkv_json_free(doc);
}
END_TEST

/* Hash-indexed objects: every key found, order kept, duplicates refused. */
START_TEST(json_large_object)
{
    const int n = 20000;
    size_t cap = (size_t)n * 24 + 64, len = 0;
    char *text = malloc(cap);
    len += (size_t)sprintf(text + len, "{");
    for (int i = 0; i < n; i++)
        len += (size_t)sprintf(text + len, "%s\"key%d\":%d", i ? "," : "", i, i * 3);
    len += (size_t)sprintf(text + len, "}");
    mkv_json_doc *doc;
    mkv_error err;
    ck_assert_int_eq(mkv_json_parse(text, len, NULL, &doc, &err), MKV_OK);
    const mkv_json *r = mkv_json_root(doc);
    ck_assert_uint_eq(mkv_json_len(r), (size_t)n);
    for (int i = 0; i < n; i++) {
        char key[32];
        int64_t v;
        snprintf(key, sizeof key, "key%d", i);
        ck_assert_int_eq(mkv_json_int64(mkv_json_get(r, key), &v), 0);
        ck_assert_int_eq(v, i * 3);
        ck_assert_str_eq(mkv_json_key_at(r, (size_t)i, NULL), key);
    }
    ck_assert_ptr_null(mkv_json_get(r, "key20000"));
    mkv_json_free(doc);

    /* a duplicate deep inside a large object */
    len -= 1;
    len += (size_t)sprintf(text + len, ",\"key777\":1}");
    ck_assert_int_eq(mkv_json_parse(text, len, NULL, &doc, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "duplicate key \"key777\""));
    free(text);
}
END_TEST

static void expect_bad_json(const char *text, size_t len, const char *what, long offset)
{
    mkv_json_doc *doc = (mkv_json_doc *)1;
    mkv_error err;
    int rc = mkv_json_parse(text, len, NULL, &doc, &err);
    ck_assert_msg(rc == MKV_EFORMAT, "accepted: %.*s", (int)len, text);
    ck_assert_ptr_null(doc);
    ck_assert_msg(strstr(err.msg, what) != NULL, "for %.*s: got '%s', expected '%s'", (int)len, text,
                  err.msg, what);
    if (offset >= 0) {
        char at[64];
        snprintf(at, sizeof at, "invalid JSON at byte %ld: ", offset);
        ck_assert_msg(strncmp(err.msg, at, strlen(at)) == 0, "for %s: got '%s', expected offset %ld", text,
                      err.msg, offset);
    }
}
#define BAD(text, what, offset) expect_bad_json(text, sizeof(text) - 1, what, offset)

START_TEST(json_malformed)
{
    BAD("", "unexpected end of input", 0);
    BAD("   ", "unexpected end of input", 3);
    BAD("{\"a\": 1", "expected ',' or '}' in object, found end of input", 7);
    BAD("[1, 2", "expected ',' or ']' in array", 5);
    BAD("{\"a\":", "unexpected end of input", 5);
    BAD("\"abc", "unterminated string", 0);
    BAD("\"abc\\", "unterminated string", 0);
    BAD("[\"a\\x\"]", "invalid escape: backslash followed by 'x'", 3);
    BAD("\"\\u12G4\"", "four hex digits expected", 1);
    BAD("\"\\u12\"", "four hex digits expected", 1);
    BAD("\"\\ud800\"", "not followed by a low surrogate", 1);
    BAD("\"\\ud800\\u0041\"", "not followed by a low surrogate", 1);
    BAD("\"\\udc00\"", "unpaired low surrogate", 1);
    BAD("[1] x", "unexpected 'x' after the JSON value", 4);
    BAD("{} {}", "after the JSON value", 3);
    BAD("[1,]", "a value was expected", 3);
    BAD("[,1]", "a value was expected", 1);
    BAD("{\"a\" 1}", "expected ':' after object key", 5);
    BAD("{a:1}", "expected a string key", 1);
    BAD("{\"a\":1,}", "expected a string key", 7);
    BAD("01", "leading zero", 0);
    BAD("1.", "digit expected after '.'", 0);
    BAD(".5", "unexpected '.'", 0);
    BAD("-", "digit expected after '-'", 0);
    BAD("1e", "digit expected in exponent", 0);
    BAD("1e+", "digit expected in exponent", 0);
    BAD("+1", "unexpected '+'", 0);
    BAD("0x10", "after the JSON value", 1);
    BAD("tru", "unexpected 't'", 0);
    BAD("nul", "unexpected 'n'", 0);
    BAD("True", "unexpected 'T'", 0);
    BAD("NaN", "unexpected 'N'", 0);
    BAD("[Infinity]", "unexpected 'I'", 1);
    BAD("\"a\x01" "b\"", "unescaped control character 0x01", 2);
    BAD("\"tab\there\"", "unescaped control character 0x09", 4);
    BAD("\"\xff\"", "invalid UTF-8", 1);
    BAD("\"\xc0\x80\"", "invalid UTF-8", 1);         /* overlong NUL */
    BAD("\"\xed\xa0\x80\"", "invalid UTF-8", 1);     /* encoded surrogate */
    BAD("\"\xf4\x90\x80\x80\"", "invalid UTF-8", 1); /* above U+10FFFF */
    BAD("\"\xe2\x82\"", "invalid UTF-8", 1);         /* truncated sequence */
    BAD("\xef\xbb\xbf{}", "unexpected byte 0xef", 0); /* no BOM */
    BAD("1e999", "out of range", 0);
    BAD("{\"a\":1,\"a\":2}", "duplicate key \"a\"", 7);
    BAD("[1]\0", "unexpected byte 0x00 after the JSON value", 3);

    /* deep nesting: default limit 256 */
    char deep[1200];
    memset(deep, '[', 600);
    memset(deep + 600, ']', 600);
    expect_bad_json(deep, 1200, "nesting deeper than 256 levels", 256);
    memset(deep, '[', 256);
    memset(deep + 256, ']', 256);
    mkv_json_doc *doc;
    mkv_error err;
    ck_assert_int_eq(mkv_json_parse(deep, 512, NULL, &doc, &err), MKV_OK);
    mkv_json_free(doc);
    /* a bracket soup far beyond any stack: refused, not a crash */
    size_t huge = 4u << 20;
    char *soup = malloc(huge);
    memset(soup, '[', huge);
    mkv_json_limits lim = {.max_depth = 1 << 30};
    ck_assert_int_eq(mkv_json_parse(soup, huge, &lim, &doc, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "nesting deeper than 4096 levels"));
    free(soup);
}
END_TEST

START_TEST(json_limits_and_files)
{
    mkv_json_doc *doc;
    mkv_error err;
    mkv_json_limits lim = {.max_depth = 3};
    ck_assert_int_eq(mkv_json_parse("[[[1]]]", 7, &lim, &doc, &err), MKV_OK);
    mkv_json_free(doc);
    ck_assert_int_eq(mkv_json_parse("[[[[1]]]]", 9, &lim, &doc, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "invalid JSON at byte 3: nesting deeper than 3 levels");
    lim = (mkv_json_limits){.max_bytes = 5};
    ck_assert_int_eq(mkv_json_parse("[1, 2]", 6, &lim, &doc, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "JSON text of 6 bytes exceeds the limit of 5 bytes");
    /* the input need not be NUL-terminated: only len bytes are looked at */
    ck_assert_int_eq(mkv_json_parse("[12]345", 4, NULL, &doc, &err), MKV_OK);
    mkv_json_free(doc);

    const char *p = tpath("j.json");
    write_bytes(p, "{\"x\": [1,2,3]}\n", 15);
    ck_assert_int_eq(mkv_json_parse_file(p, NULL, &doc, &err), MKV_OK);
    ck_assert_uint_eq(mkv_json_len(mkv_json_get(mkv_json_root(doc), "x")), 3);
    mkv_json_free(doc);
    write_bytes(p, "{\"x\": [1,2,3}\n", 14);
    ck_assert_int_eq(mkv_json_parse_file(p, NULL, &doc, &err), MKV_EFORMAT);
    char want[600];
    snprintf(want, sizeof want, "'%s': invalid JSON at byte 12: expected ',' or ']' in array, found '}'", p);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(mkv_json_parse_file(tpath("absent.json"), NULL, &doc, &err), MKV_EIO);
    ck_assert_ptr_nonnull(strstr(err.msg, "No such file or directory"));
    remove(p);
}
END_TEST

/* Tens of MB (tokenizer.json sizes) parse in linear time: a quadratic
 * parser would not finish within the test's timeout. */
START_TEST(json_large_input)
{
    const size_t n_items = 500000, str_len = 20u << 20;
    size_t cap = n_items * 24 + str_len + 64, len = 0;
    char *text = malloc(cap);
    text[len++] = '[';
    for (size_t i = 0; i < n_items; i++)
        len += (size_t)sprintf(text + len, "[%zu,\"t\"],", i);
    text[len++] = '"';
    for (size_t i = 0; i < str_len; i++)
        text[len++] = (i % 64 == 63) ? 'n' : (i % 64 == 62 ? '\\' : 'a');
    text[len++] = '"';
    text[len++] = ']';
    mkv_json_doc *doc;
    mkv_error err;
    ck_assert_msg(mkv_json_parse(text, len, NULL, &doc, &err) == MKV_OK, "%s", err.msg);
    const mkv_json *r = mkv_json_root(doc);
    ck_assert_uint_eq(mkv_json_len(r), n_items + 1);
    int64_t v;
    ck_assert_int_eq(mkv_json_int64(mkv_json_at(mkv_json_at(r, 123457), 0), &v), 0);
    ck_assert_int_eq(v, 123457);
    ck_assert_uint_eq(mkv_json_len(mkv_json_at(r, n_items)), str_len - str_len / 64);
    mkv_json_free(doc);
    free(text);
}
END_TEST

/* ================================================================ safetensors */

START_TEST(st_read_values)
{
    const char *header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
        "\"c\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20]},"
        "\"i\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[24,48]},"
        "\"j\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[48,56]},"
        "\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[56,56]}}    ";
    const uint8_t data[56] = {
        0x00, 0x3c, 0x00, 0xc0, 0x55, 0x35, 0x01, 0x00, 0xff, 0x7b, 0x00, 0x80, /* a: fp16 */
        0x80, 0x3f, 0x49, 0x40,                                                 /* b: bf16 */
        0x00, 0x00, 0xc0, 0x3f,                                                 /* c: f32 1.5 */
        0xee, 0xee, 0xee, 0xee,                                                 /* unused bytes */
        7, 0, 0, 0, 0, 0, 0, 0,                                                 /* i: 7 */
        0xfb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,                         /* -5 */
        0, 0, 0, 0, 1, 0, 0, 0,                                                 /* 2^32 */
        0x40, 0xe2, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff,                         /* j: 123456, -1 */
    };
    const char *p = tpath("v.safetensors");
    write_st(p, header, data, sizeof data);
    mkv_st_file *f;
    mkv_error err;
    ck_assert_msg(mkv_st_open(p, &f, &err) == MKV_OK, "%s", err.msg);
    ck_assert_str_eq(mkv_st_path(f), p);
    ck_assert_uint_eq(mkv_st_count(f), 6);
    ck_assert_str_eq(mkv_st_tensor_at(f, 0)->name, "a");
    ck_assert_str_eq(mkv_json_str(mkv_json_get(mkv_st_metadata(f), "format"), NULL), "pt");
    ck_assert_ptr_null(mkv_st_find(f, "__metadata__"));
    ck_assert_ptr_null(mkv_st_find(f, "zz"));

    const mkv_st_tensor *a = mkv_st_find(f, "a");
    ck_assert_int_eq(a->dtype, MKV_ST_F16);
    ck_assert_str_eq(mkv_st_dtype_name(a->dtype), "F16");
    ck_assert_int_eq(a->ndim, 2);
    ck_assert_int_eq(a->shape[0], 2);
    ck_assert_int_eq(a->shape[1], 3);
    ck_assert_uint_eq(a->numel, 6);
    ck_assert_uint_eq(a->nbytes, 12);
    ck_assert_uint_eq(a->offset, 8 + strlen(header));
    ck_assert_uint_eq(mkv_st_row_elems(a), 3);
    float fa[6];
    ck_assert_int_eq(mkv_st_read_f32(f, a, 0, 6, fa, &err), MKV_OK);
    ck_assert(fa[0] == 1.0f && fa[1] == -2.0f && fa[2] == 0.333251953125f);
    ck_assert(fa[3] == 5.9604644775390625e-8f && fa[4] == 65504.0f);
    ck_assert(fa[5] == 0.0f && signbit(fa[5]));
    /* slice along the first dimension: row 1 */
    memset(fa, 0, sizeof fa);
    ck_assert_int_eq(mkv_st_read_f32(f, a, 1 * mkv_st_row_elems(a), 3, fa, &err), MKV_OK);
    ck_assert(fa[0] == 5.9604644775390625e-8f && fa[1] == 65504.0f && fa[2] == 0.0f);
    uint16_t raw[3];
    ck_assert_int_eq(mkv_st_read_raw(f, a, 1, 2, raw, &err), MKV_OK);
    ck_assert_uint_eq(raw[0], 0xc000);
    ck_assert_uint_eq(raw[1], 0x3555);

    const mkv_st_tensor *b = mkv_st_find(f, "b");
    ck_assert_int_eq(mkv_st_read_f32(f, b, 0, 2, fa, &err), MKV_OK);
    ck_assert(fa[0] == 1.0f && fa[1] == 3.140625f);
    const mkv_st_tensor *c = mkv_st_find(f, "c");
    ck_assert_int_eq(c->ndim, 0);
    ck_assert_uint_eq(c->numel, 1);
    ck_assert_uint_eq(mkv_st_row_elems(c), 1);
    ck_assert_int_eq(mkv_st_read_f32(f, c, 0, 1, fa, &err), MKV_OK);
    ck_assert(fa[0] == 1.5f);

    int32_t iv[3];
    const mkv_st_tensor *ti = mkv_st_find(f, "i");
    ck_assert_int_eq(mkv_st_read_i32(f, ti, 0, 2, iv, &err), MKV_OK);
    ck_assert_int_eq(iv[0], 7);
    ck_assert_int_eq(iv[1], -5);
    ck_assert_int_eq(mkv_st_read_i32(f, ti, 0, 3, iv, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor 'i': element 2 does not fit in int32"));
    ck_assert_int_eq(mkv_st_read_i32(f, mkv_st_find(f, "j"), 0, 2, iv, &err), MKV_OK);
    ck_assert_int_eq(iv[0], 123456);
    ck_assert_int_eq(iv[1], -1);

    ck_assert_int_eq(mkv_st_read_f32(f, ti, 0, 1, fa, &err), MKV_EUNSUP);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor 'i' has dtype I64, which cannot be read as float32"));
    ck_assert_int_eq(mkv_st_read_i32(f, a, 0, 1, iv, &err), MKV_EUNSUP);
    ck_assert_int_eq(mkv_st_read_f32(f, a, 4, 3, fa, &err), MKV_EUSAGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "elements [4, 7) requested of 6"));

    const mkv_st_tensor *e = mkv_st_find(f, "e");
    ck_assert_uint_eq(e->numel, 0);
    ck_assert_uint_eq(mkv_st_row_elems(e), 4);
    ck_assert_int_eq(mkv_st_read_f32(f, e, 0, 0, fa, &err), MKV_OK);
    mkv_st_close(f);
    remove(p);
}
END_TEST

static void expect_bad_st(const char *path, const char *what)
{
    mkv_st_file *f = (mkv_st_file *)1;
    mkv_error err;
    int rc = mkv_st_open(path, &f, &err);
    ck_assert_msg(rc != MKV_OK, "accepted (expected '%s')", what);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(err.msg, what) != NULL, "got '%s', expected '%s'", err.msg, what);
    ck_assert_msg(strstr(err.msg, path) != NULL, "'%s' does not name the file", err.msg);
}

static void bad_header(const char *header, size_t dlen, const char *what)
{
    static const uint8_t zeros[64];
    const char *p = tpath("bad.safetensors");
    write_st(p, header, zeros, dlen);
    expect_bad_st(p, what);
}

START_TEST(st_corrupt)
{
    const char *p = tpath("bad.safetensors");
    write_bytes(p, "", 0);
    expect_bad_st(p, "empty file");
    write_bytes(p, "\x10\0\0\0", 4);
    expect_bad_st(p, "too short (4 bytes)");
    write_st_raw(p, 1000, "{}", NULL, 0);
    expect_bad_st(p, "header length 1000 exceeds the file size (10 bytes)");
    write_st_raw(p, (uint64_t)1 << 40, "{}", NULL, 0);
    expect_bad_st(p, "header length 1099511627776 is beyond the 100000000-byte limit");
    write_st_raw(p, UINT64_MAX, "{}", NULL, 0);
    expect_bad_st(p, "is beyond the");
    expect_bad_st(tpath("absent.safetensors"), "No such file or directory");

    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
               "header: invalid JSON at byte 53: expected ',' or '}' in object, found end of input");
    bad_header("[1]", 0, "header is a JSON array, not an object");
    bad_header("", 0, "header: invalid JSON at byte 0: unexpected end of input");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
               "tensor 'a': data_offsets [0, 8] lie outside the data area (4 bytes)");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8,
               "tensor 'a': data_offsets [8, 4] run backwards");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "tensors 'a' and 'b' overlap in the data area");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}", 16,
               "tensors 'a' and 'b' overlap");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16,
               "tensor 'a': data_offsets span 8 bytes but F32 of 3 elements needs 12");
    bad_header("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': unknown dtype \"Q4\"");
    bad_header("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': missing or non-string \"dtype\"");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a': shape[0] is not a non-negative integer");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
               "shape[0] is not a non-negative integer");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "9 dimensions (at most 8 supported)");
    /* 2^32 * 2^32 wraps to 0 in 64 bits: must not pass as an empty tensor */
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
               "element count overflows");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
               "byte count overflows");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
               "\"data_offsets\" must be two non-negative integers");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
               "\"data_offsets\" must be two non-negative integers");
    bad_header("{\"a\":[1,2]}", 0, "tensor 'a': entry is a JSON array, not an object");
    bad_header("{\"__metadata__\":{\"n\":1}}", 0, "__metadata__ entry 'n' is not a string");
    bad_header("{\"__metadata__\":[]}", 0, "__metadata__ is a JSON array, not an object");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
               "duplicate key \"a\"");
    /* a name is looked up as a C string: "a\u0000b" would answer to "a"
     * (found by tests/fuzz/fuzz_safetensors) */
    bad_header("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor name 'a\\u0000...' holds a NUL character");
    bad_header("{\"__metadata__\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor name '__metadata__\\u0000...' holds a NUL character");

    /* empty tensors sit anywhere without overlapping anything */
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}";
    static const uint8_t zeros[8];
    write_st(p, ok, zeros, 8);
    mkv_st_file *f;
    mkv_error err;
    ck_assert_msg(mkv_st_open(p, &f, &err) == MKV_OK, "%s", err.msg);
    mkv_st_close(f);
    remove(p);
}
END_TEST

/* ================================================================ npy */

/* A .npy file: magic, version, padded header typed by the test, data. */
static void write_npy(const char *path, int major, const char *dict, const void *data, size_t dlen)
{
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = (pre + dl + 1 + 63) / 64 * 64; /* numpy aligns the data to 64 */
    size_t hl = total - pre;
    uint8_t *buf = malloc(total + dlen);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major;
    buf[7] = 0;
    put_le(buf + 8, hl, major == 1 ? 2 : 4);
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hl - dl - 1);
    buf[total - 1] = '\n';
    if (dlen)
        memcpy(buf + total, data, dlen);
    write_bytes(path, buf, total + dlen);
    free(buf);
}

START_TEST(npy_read_values)
{
    const char *p = tpath("a.npy");
    mkv_npy *f;
    mkv_error err;
    float out[6];

    const float f4[6] = {1.5f, -2.25f, 0.0f, 1e-3f, 3e38f, -7.0f};
    write_npy(p, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f4, sizeof f4);
    ck_assert_msg(mkv_npy_open(p, &f, &err) == MKV_OK, "%s", err.msg);
    const mkv_npy_info *in = mkv_npy_info_of(f);
    ck_assert_str_eq(in->descr, "<f4");
    ck_assert_int_eq(in->version, 1);
    ck_assert_int_eq(in->ndim, 2);
    ck_assert_int_eq(in->shape[0], 2);
    ck_assert_int_eq(in->shape[1], 3);
    ck_assert_uint_eq(in->numel, 6);
    ck_assert_uint_eq(in->data_offset, 128); /* 10 + 60-byte dict + '\n', padded to 64 */
    ck_assert_int_eq(mkv_npy_read_f32(f, 0, 6, out, &err), MKV_OK);
    ck_assert_mem_eq(out, f4, sizeof f4);
    ck_assert_int_eq(mkv_npy_read_f32(f, 4, 2, out, &err), MKV_OK);
    ck_assert(out[0] == 3e38f && out[1] == -7.0f);
    ck_assert_int_eq(mkv_npy_read_f32(f, 5, 2, out, &err), MKV_EUSAGE);
    mkv_npy_close(f);

    const uint8_t f2[8] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0xff, 0x7b};
    write_npy(p, 2, "{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": (4,)}", f2, sizeof f2);
    ck_assert_msg(mkv_npy_open(p, &f, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(mkv_npy_info_of(f)->version, 2);
    ck_assert_int_eq(mkv_npy_read_f32(f, 0, 4, out, &err), MKV_OK);
    ck_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == 5.9604644775390625e-8f && out[3] == 65504.0f);
    mkv_npy_close(f);

    uint8_t i8[16];
    put_le(i8, (uint64_t)(int64_t)-3, 8);
    put_le(i8 + 8, 1000000, 8);
    write_npy(p, 3, "{'descr': '<i8', 'fortran_order': False, 'shape': (1L, 2L), }", i8, sizeof i8);
    ck_assert_msg(mkv_npy_open(p, &f, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(mkv_npy_info_of(f)->version, 3);
    ck_assert_int_eq(mkv_npy_read_f32(f, 0, 2, out, &err), MKV_OK);
    ck_assert(out[0] == -3.0f && out[1] == 1e6f);
    mkv_npy_close(f);

    const double f8[2] = {0.1, -1e300};
    write_npy(p, 1, "{'shape': (2,), 'fortran_order': False, 'descr': '<f8'}", f8, sizeof f8);
    ck_assert_msg(mkv_npy_open(p, &f, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(mkv_npy_read_f32(f, 0, 2, out, &err), MKV_OK);
    ck_assert(out[0] == 0.1f && isinf(out[1]) && out[1] < 0);
    mkv_npy_close(f);

    write_npy(p, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", "\x05\0\0\0", 4);
    ck_assert_msg(mkv_npy_open(p, &f, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(mkv_npy_info_of(f)->ndim, 0);
    ck_assert_int_eq(mkv_npy_read_f32(f, 0, 1, out, &err), MKV_OK);
    ck_assert(out[0] == 5.0f);
    mkv_npy_close(f);
    remove(p);
}
END_TEST

static void expect_bad_npy(int major, const char *dict, size_t dlen, const char *what)
{
    static const uint8_t zeros[64];
    const char *p = tpath("bad.npy");
    write_npy(p, major, dict, zeros, dlen);
    mkv_npy *f = (mkv_npy *)1;
    mkv_error err;
    ck_assert_msg(mkv_npy_open(p, &f, &err) != MKV_OK, "accepted %s", dict);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(err.msg, what) != NULL, "for %s: got '%s', expected '%s'", dict, err.msg, what);
}

START_TEST(npy_corrupt)
{
    const char *ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
    expect_bad_npy(1, ok, 4, "truncated: the header promises 8 data bytes, 4 present");
    expect_bad_npy(1, ok, 12, "4 bytes after the data the header describes");
    expect_bad_npy(4, ok, 8, ".npy format version 4.0 is not supported");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8,
                   "Fortran-order arrays are not supported");
    expect_bad_npy(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8,
                   "unsupported dtype '>f4'");
    expect_bad_npy(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", 4,
                   "unsupported dtype '<u2'");
    expect_bad_npy(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8,
                   "structured arrays are not supported");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': False, }", 8, "npy header lacks 'shape'");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", 8,
                   "a one-dimensional shape needs a trailing comma");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", 8,
                   "expected a non-negative integer in the shape tuple");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8,
                   "unexpected or repeated key 'x'");
    expect_bad_npy(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8,
                   "unexpected or repeated key 'descr'");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } x", 8,
                   "unexpected text after the dictionary");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", 8, "expected True or False");
    expect_bad_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 8,
                   "byte count overflows");

    const char *p = tpath("bad.npy");
    mkv_npy *f;
    mkv_error err;
    write_bytes(p, "\x93NUMPX\x01\x00\x10\x00{}", 12);
    ck_assert_int_eq(mkv_npy_open(p, &f, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "not a .npy file (bad magic)"));
    write_bytes(p, "\x93NUMPY\x01\x00\xff\x00{}", 12);
    ck_assert_int_eq(mkv_npy_open(p, &f, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "npy header length 255 exceeds the file size (12 bytes)"));
    write_bytes(p, "\x93NUMPY\x02\x00\xff\xff\xff\x7f{}", 14);
    ck_assert_int_eq(mkv_npy_open(p, &f, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "beyond the 1048576-byte limit"));
    remove(p);
}
END_TEST

/* ================================================================ import */

enum { L = 2, H = 2, NH = 4, T = 5, W = 2, D = 4 };

static void import_ok(const char *in, const mkv_import_opts *o, const char *out, int64_t chunk)
{
    mkv_dump_write_opts wo;
    mkv_dump_write_opts_init(&wo);
    wo.chunk_tokens = chunk;
    mkv_error err;
    int rc = mkv_import(in, o, out, &wo, &err);
    ck_assert_msg(rc == MKV_OK, "import of %s: %s", in, err.msg);
}

/* The import fails with a message containing what, and leaves no file. */
static void import_bad(const char *in, const mkv_import_opts *o, const char *what)
{
    char outdir[512];
    snprintf(outdir, sizeof outdir, "%s/out-bad", test_tmpdir());
    mkdir(outdir, 0755);
    char out[600];
    snprintf(out, sizeof out, "%s/x.h5", outdir);
    mkv_error err;
    int rc = mkv_import(in, o, out, NULL, &err);
    ck_assert_msg(rc != MKV_OK, "import of %s accepted (expected '%s')", in, what);
    ck_assert_msg(strstr(err.msg, what) != NULL, "got '%s', expected '%s'", err.msg, what);
    ck_assert_int_eq(test_count_entries(outdir), 0); /* no output, no temporary */
    rmdir(outdir);
}

/* One file: k in F32, v in F16, q in BF16, int64 tokens, int32 positions. */
static void write_single(const char *path, int with_q, int with_tokens, int with_qpos)
{
    st_builder *b = malloc(sizeof *b);
    sb_init(b);
    for (int l = L - 1; l >= 0; l--) { /* header order must not matter */
        char name[32];
        snprintf(name, sizeof name, "layers.%d.k", l);
        sb_add_block(b, name, "F32", 0, l, H, T, D);
        snprintf(name, sizeof name, "layers.%d.v", l);
        sb_add_block(b, name, "F16", 1, l, H, T, D);
        if (with_q) {
            snprintf(name, sizeof name, "layers.%d.q", l);
            sb_add_block(b, name, "BF16", 2, l, NH, W, D);
        }
    }
    if (with_tokens) {
        sb_start(b);
        for (int t = 0; t < T; t++)
            sb_put_value(b, "I64", 100 + t * 7);
        sb_end(b, "tokens", "I64", 1, (int64_t[]){T});
    }
    if (with_qpos) {
        sb_start(b);
        sb_put_value(b, "I32", 1);
        sb_put_value(b, "I32", 3);
        sb_end(b, "query_pos", "I32", 1, (int64_t[]){W});
    }
    sb_start(b); /* unrelated tensors are ignored */
    sb_put_value(b, "F32", 1);
    sb_end(b, "other.weight", "F32", 1, (int64_t[]){1});
    sb_write(b, path);
    free(b);
}

START_TEST(import_safetensors)
{
    const char *in = tpath("kv.safetensors"), *out = tpath("kv.h5");
    write_single(in, 1, 1, 1);
    mkv_import_opts o;
    mkv_import_opts_init(&o);
    o.dtype = MKV_DTYPE_F32;
    o.rope_theta = 500000;
    import_ok(in, &o, out, 2); /* chunks of 2 tokens: 2 + 2 + 1 */
    const int32_t qpos[W] = {1, 3}, tokens[T] = {100, 107, 114, 121, 128};
    check_dump(out, L, NH, H, T, W, D, qpos, tokens);
    mkv_dump *d;
    mkv_error err;
    ck_assert_int_eq(mkv_dump_open(out, &d, &err), MKV_OK);
    ck_assert_str_eq(mkv_dump_meta_of(d)->model, "kv.safetensors");
    ck_assert(mkv_dump_meta_of(d)->rope_theta == 500000);
    ck_assert_str_eq(mkv_dump_meta_of(d)->k_rope, "post");
    ck_assert_int_eq(mkv_dump_meta_of(d)->dtype, MKV_DTYPE_F32);
    mkv_dump_close(d);

    /* the values are exact in float16 too; options that agree are fine */
    o.dtype = MKV_DTYPE_F16;
    o.model = "toy-model";
    o.n_heads = NH;
    o.n_kv_heads = H;
    o.head_dim = D;
    o.k_rope = "pre";
    o.kind = MKV_IMPORT_SAFETENSORS;
    import_ok(in, &o, out, 1024);
    check_dump(out, L, NH, H, T, W, D, qpos, tokens);
    ck_assert_int_eq(mkv_dump_open(out, &d, &err), MKV_OK);
    ck_assert_str_eq(mkv_dump_meta_of(d)->model, "toy-model");
    ck_assert_str_eq(mkv_dump_meta_of(d)->k_rope, "pre");
    ck_assert_int_eq(mkv_dump_meta_of(d)->dtype, MKV_DTYPE_F16);
    mkv_dump_close(d);
    remove(out);

    /* queries without positions: the last W tokens */
    write_single(in, 1, 0, 0);
    mkv_import_opts_init(&o);
    o.dtype = MKV_DTYPE_BF16;
    import_ok(in, &o, out, 3);
    check_dump(out, L, NH, H, T, W, D, (const int32_t[]){T - 2, T - 1}, NULL);
    remove(out);

    /* no queries: W = 0, query heads from the options */
    write_single(in, 0, 1, 0);
    o.n_heads = 2 * H;
    import_ok(in, &o, out, 1024);
    check_dump(out, L, 2 * H, H, T, 0, D, NULL, tokens);
    o.n_heads = 0; /* default: as many as KV heads */
    import_ok(in, &o, out, 1024);
    check_dump(out, L, H, H, T, 0, D, NULL, tokens);
    remove(out);
    remove(in);
}
END_TEST

/* vLLM: <layer>.safetensors with kv_cache [2, T, kv_heads, head_dim]. */
static void write_vllm_layer(const char *dir, const char *name, int l, int merged, const char *dtype)
{
    st_builder *b = malloc(sizeof *b);
    sb_init(b);
    sb_start(b);
    for (int kv = 0; kv < 2; kv++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++)
                    sb_put_value(b, dtype, val(kv, l, h, t, d));
    if (merged)
        sb_end(b, "kv_cache", dtype, 3, (int64_t[]){2, T, H * D});
    else
        sb_end(b, "kv_cache", dtype, 4, (int64_t[]){2, T, H, D});
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    sb_write(b, path);
    free(b);
}

START_TEST(import_vllm)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vllm", test_tmpdir());
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    /* zero-padded and plain names mix; other files are ignored */
    write_vllm_layer(dir, "02.safetensors", 2, 0, "F16");
    write_vllm_layer(dir, "1.safetensors", 1, 0, "BF16");
    write_vllm_layer(dir, "0.safetensors", 0, 0, "F32");
    char extra[600];
    snprintf(extra, sizeof extra, "%s/config.json", dir);
    write_bytes(extra, "{}", 2);
    const char *out = tpath("vllm.h5");
    mkv_import_opts o;
    mkv_import_opts_init(&o);
    o.dtype = MKV_DTYPE_F32;
    o.n_heads = 2 * H;
    import_ok(dir, &o, out, 2);
    check_dump(out, 3, 2 * H, H, T, 0, D, NULL, NULL);
    mkv_dump *d;
    mkv_error err;
    ck_assert_int_eq(mkv_dump_open(out, &d, &err), MKV_OK);
    ck_assert_str_eq(mkv_dump_meta_of(d)->model, "vllm");
    mkv_dump_close(d);
    remove(out);

    /* a missing layer: 0, 1, 3 */
    char p[600];
    snprintf(p, sizeof p, "%s/02.safetensors", dir);
    remove(p);
    write_vllm_layer(dir, "3.safetensors", 3, 0, "F16");
    import_bad(dir, &o, "layer file 2.safetensors is missing (found layers up to 3)");
    /* two names for one layer */
    write_vllm_layer(dir, "2.safetensors", 2, 0, "F16");
    write_vllm_layer(dir, "003.safetensors", 3, 0, "F16");
    import_bad(dir, &o, "both hold layer 3");
    snprintf(p, sizeof p, "%s/003.safetensors", dir);
    remove(p);
    /* a layer number of eight or more digits is a layer, and beyond the limit */
    write_vllm_layer(dir, "10000000.safetensors", 3, 0, "F16");
    import_bad(dir, &o, "10000000.safetensors': layer 10000000 is beyond the limit of");
    snprintf(p, sizeof p, "%s/10000000.safetensors", dir);
    remove(p);
    write_vllm_layer(dir, "123456789012345678901234567890.safetensors", 3, 0, "F16");
    import_bad(dir, &o, "is beyond the limit of");
    snprintf(p, sizeof p, "%s/123456789012345678901234567890.safetensors", dir);
    remove(p);

    /* heads and channels merged: the options must say how to split */
    write_vllm_layer(dir, "3.safetensors", 3, 1, "F16");
    import_bad(dir, &o, "heads and channels merged");
    for (int l = 0; l < 4; l++) {
        char name[32];
        snprintf(name, sizeof name, "%d.safetensors", l);
        write_vllm_layer(dir, name, l, 1, "F16");
    }
    o.head_dim = D;
    import_ok(dir, &o, out, 1024);
    check_dump(out, 4, 2 * H, H, T, 0, D, NULL, NULL);
    remove(out);
    o.head_dim = 3;
    import_bad(dir, &o, "its last dimension 8 is not n_kv_heads 2 x head_dim 3");
    o.head_dim = 0;
    /* a layer whose shape differs from layer 0's */
    write_vllm_layer(dir, "2.safetensors", 2, 0, "F16");
    o.n_kv_heads = H;
    st_builder *b = malloc(sizeof *b);
    sb_init(b);
    sb_start(b);
    for (int i = 0; i < 2 * (T - 1) * H * D; i++)
        sb_put_value(b, "F16", 1);
    sb_end(b, "kv_cache", "F16", 4, (int64_t[]){2, T - 1, H, D});
    snprintf(p, sizeof p, "%s/1.safetensors", dir);
    sb_write(b, p);
    free(b);
    import_bad(dir, &o, "kv_cache holds 4 tokens x 2 heads x 4, but layer 0 holds 5 x 2 x 4");
    /* contradicting options */
    write_vllm_layer(dir, "1.safetensors", 1, 0, "F16");
    o.n_kv_heads = 0;
    o.head_dim = 8;
    import_bad(dir, &o, "head_dim 8 was requested but");
    rm_rf(dir);

    ck_assert_int_eq(mkdir(dir, 0755), 0);
    import_bad(dir, NULL, "no <layer>.safetensors files");
    rm_rf(dir);
}
END_TEST

/* [n_layers, 2, kv_heads, T, head_dim] */
static void write_kv_npy(const char *path, const char *descr, int layers)
{
    size_t n = (size_t)layers * 2 * H * T * D, esize = strcmp(descr, "<f4") == 0 ? 4 : 2, i = 0;
    uint8_t *data = malloc(n * esize);
    for (int l = 0; l < layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++)
                    for (int d = 0; d < D; d++, i++) {
                        float x = val(kv, l, h, t, d);
                        if (esize == 4)
                            memcpy(data + 4 * i, &x, 4);
                        else
                            put_le(data + 2 * i, enc_f16(x), 2);
                    }
    char dict[160];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%d, 2, %d, %d, %d), }", descr,
             layers, H, T, D);
    write_npy(path, 1, dict, data, n * esize);
    free(data);
}

START_TEST(import_npy)
{
    const char *in = tpath("kv.npy"), *out = tpath("npy.h5");
    mkv_import_opts o;
    mkv_import_opts_init(&o);
    o.dtype = MKV_DTYPE_F32;
    write_kv_npy(in, "<f4", 3);
    import_ok(in, &o, out, 2);
    check_dump(out, 3, H, H, T, 0, D, NULL, NULL);
    write_kv_npy(in, "<f2", 2);
    o.n_heads = 3 * H;
    import_ok(in, &o, out, 4);
    check_dump(out, 2, 3 * H, H, T, 0, D, NULL, NULL);
    remove(out);

    o.n_kv_heads = 4;
    import_bad(in, &o, "n_kv_heads 4 was requested but");
    o.n_kv_heads = 0;
    o.n_heads = 3; /* not a multiple of the 2 KV heads */
    import_bad(in, &o, "n_heads=3 is not a multiple of n_kv_heads=2");
    write_bytes(in, "", 0);
    import_bad(in, NULL, "not a .npy file");
    float zeros[24] = {0};
    write_npy(in, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }", zeros, sizeof zeros);
    import_bad(in, NULL, "array of shape [2, 3, 4]; expected [n_layers, 2, kv_heads, T, head_dim]");
    remove(in);
}
END_TEST

/* An independent writer: numpy's np.save, when /usr/bin/python3 has it. */
START_TEST(import_numpy_written)
{
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "import_numpy_written: skipped (no /usr/bin/python3 with numpy)\n");
        return;
    }
    const char *in = tpath("np.npy"), *out = tpath("np.h5");
    for (int half = 0; half < 2; half++) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c \"import numpy as np, sys\n"
                 "i = np.indices((3, 2, %d, %d, %d))\n"
                 "a = ((i[1]*11 + i[0]*7 + i[2]*5 + i[3]*3 + i[4]) %% 61 - 30) * 0.25\n"
                 "np.save(sys.argv[1], a.astype(np.%s))\" '%s'",
                 H, T, D, half ? "float16" : "float32", in);
        ck_assert_int_eq(system(cmd), 0);
        mkv_npy *f;
        mkv_error err;
        ck_assert_msg(mkv_npy_open(in, &f, &err) == MKV_OK, "%s", err.msg);
        ck_assert_str_eq(mkv_npy_info_of(f)->descr, half ? "<f2" : "<f4");
        mkv_npy_close(f);
        mkv_import_opts o;
        mkv_import_opts_init(&o);
        o.dtype = MKV_DTYPE_F32;
        import_ok(in, &o, out, 3);
        check_dump(out, 3, H, H, T, 0, D, NULL, NULL);
    }
    remove(out);
    remove(in);
}
END_TEST

START_TEST(import_errors)
{
    const char *in = tpath("e.safetensors");
    mkv_import_opts o;
    mkv_import_opts_init(&o);

    /* options that contradict the source name both values */
    write_single(in, 1, 1, 1);
    o.head_dim = 8;
    import_bad(in, &o, "head_dim 8 was requested but");
    import_bad(in, &o, "has head_dim 4 (tensor 'layers.0.k' has shape [2, 5, 4])");
    o.head_dim = 0;
    o.n_kv_heads = 1;
    import_bad(in, &o, "n_kv_heads 1 was requested but");
    o.n_kv_heads = 0;
    o.n_heads = 8;
    import_bad(in, &o, "n_heads 8 was requested but");
    import_bad(in, &o, "has n_heads 4 (tensor 'layers.0.q' has shape [4, 2, 4])");
    mkv_import_opts_init(&o);

    /* a layer set with a hole, a missing v, inconsistent shapes */
    st_builder *b = malloc(sizeof *b);
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_add_block(b, "layers.0.v", "F32", 1, 0, H, T, D);
    sb_add_block(b, "layers.2.k", "F32", 0, 2, H, T, D);
    sb_add_block(b, "layers.2.v", "F32", 1, 2, H, T, D);
    sb_write(b, in);
    import_bad(in, &o, "tensor layers.1.k is missing (layers 0..2 expected)");
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_write(b, in);
    import_bad(in, &o, "tensor layers.0.v is missing");
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_add_block(b, "layers.0.v", "F32", 1, 0, H, T - 1, D);
    sb_write(b, in);
    import_bad(in, &o, "tensor 'layers.0.v' has shape [2, 4, 4] but 'layers.0.k' has [2, 5, 4]");
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_add_block(b, "layers.00.k", "F32", 0, 0, H, T, D);
    sb_write(b, in);
    import_bad(in, &o, "tensors 'layers.0.k' and 'layers.00.k' both name layer 0's k");
    sb_init(b);
    sb_add_block(b, "model.embed", "F32", 0, 0, H, T, D);
    sb_write(b, in);
    import_bad(in, &o, "no tensors named layers.{L}.k / layers.{L}.v");
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_add_block(b, "layers.0.v", "F32", 1, 0, H, T, D);
    sb_add_block(b, "layers.0.q", "F32", 2, 0, NH, T + 1, D);
    sb_write(b, in);
    import_bad(in, &o, "6 queries for 5 tokens");
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_add_block(b, "layers.0.v", "F32", 1, 0, H, T, D);
    sb_start(b);
    sb_put_value(b, "I32", 0);
    sb_end(b, "query_pos", "I32", 1, (int64_t[]){1});
    sb_write(b, in);
    import_bad(in, &o, "tensor 'query_pos' given without queries");
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_add_block(b, "layers.0.v", "F32", 1, 0, H, T, D);
    sb_start(b);
    sb_put_value(b, "F32", 0);
    sb_end(b, "tokens", "F32", 1, (int64_t[]){1});
    sb_write(b, in);
    import_bad(in, &o, "tensor 'tokens' is F32 [1]; expected integers of shape [5]");
    sb_init(b);
    sb_add_block(b, "layers.0.k", "F32", 0, 0, H, T, D);
    sb_add_block(b, "layers.0.v", "F32", 1, 0, H, T, D);
    sb_add_block(b, "layers.0.q", "F32", 2, 0, NH, W, D);
    sb_start(b);
    sb_put_value(b, "I32", 0);
    sb_put_value(b, "I32", T);
    sb_end(b, "query_pos", "I32", 1, (int64_t[]){W});
    sb_write(b, in);
    import_bad(in, &o, "/query_pos: position 5 at 1 is outside 0..4");
    free(b);

    /* an fp16 NaN in the last layer's v: the output is abandoned after
     * layer 0 was written */
    write_single(in, 1, 1, 1);
    {
        mkv_st_file *f;
        mkv_error err;
        ck_assert_int_eq(mkv_st_open(in, &f, &err), MKV_OK);
        uint64_t off = mkv_st_find(f, "layers.1.v")->offset + 2 * 9; /* element [0,2,1] */
        mkv_st_close(f);
        FILE *fp = fopen(in, "r+b");
        ck_assert_int_eq(fseek(fp, (long)off, SEEK_SET), 0);
        ck_assert_uint_eq(fwrite("\x00\x7e", 1, 2, fp), 2);
        ck_assert_int_eq(fclose(fp), 0);
    }
    import_bad(in, &o, "(layers.1.v): /layers/01/v: NaN at [0,2,1]");

    /* corrupt safetensors: the reader's message comes through */
    write_st_raw(in, 999, "{}", NULL, 0);
    import_bad(in, &o, "header length 999 exceeds the file size");
    import_bad(tpath("absent.safetensors"), &o, "No such file or directory");
    remove(in);
}
END_TEST

int main(void)
{
    mkv_log_init("check_import");
    mkv_h5_quiet();
    test_tmpdir(); /* created once here: every forked test shares it */
    Suite *s = suite_create("import");
    TCase *tc = tcase_create("json");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, json_values);
    tcase_add_test(tc, json_large_object);
    tcase_add_test(tc, json_malformed);
    tcase_add_test(tc, json_limits_and_files);
    tcase_add_test(tc, json_large_input);
    suite_add_tcase(s, tc);
    tc = tcase_create("readers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, st_read_values);
    tcase_add_test(tc, st_corrupt);
    tcase_add_test(tc, npy_read_values);
    tcase_add_test(tc, npy_corrupt);
    suite_add_tcase(s, tc);
    tc = tcase_create("import");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, import_safetensors);
    tcase_add_test(tc, import_vllm);
    tcase_add_test(tc, import_npy);
    tcase_add_test(tc, import_numpy_written);
    tcase_add_test(tc, import_errors);
    suite_add_tcase(s, tc);
    int rc = test_run(s);
    rm_rf(test_tmpdir());
    return rc;
}
