/* A strict JSON (RFC 8259) parser into a read-only tree.
 *
 * Input must be UTF-8; strings are decoded (escapes, \uXXXX with surrogate
 * pairs) to UTF-8 and may contain NUL bytes (\u0000), so they carry a
 * length.  Duplicate keys in an object are an error.  Parsing is linear in
 * the input size; objects with many members (tokenizer vocabularies) get a
 * hash index, so member lookup by key is O(1) on average.
 *
 * Errors say what is wrong and where: "invalid JSON at byte 17: expected
 * ':' after object key".  Callers prefix the file name.
 *
 * Numbers are kept as double, and integer literals (no fraction, no
 * exponent) that fit also exactly as int64.  Numbers are converted in the
 * "C" locale's format (programs that call setlocale(LC_NUMERIC) must not
 * change the decimal point). */
#ifndef MKV_JSON_H
#define MKV_JSON_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"

typedef enum {
    MKV_JSON_NULL = 0,
    MKV_JSON_FALSE,
    MKV_JSON_TRUE,
    MKV_JSON_NUMBER,
    MKV_JSON_STRING,
    MKV_JSON_ARRAY,
    MKV_JSON_OBJECT
} mkv_json_type;

typedef struct mkv_json mkv_json;         /* a value inside a document */
typedef struct mkv_json_doc mkv_json_doc; /* owns every value of one parse */

typedef struct {
    size_t max_bytes; /* larger input is refused; 0 = MKV_JSON_DEFAULT_MAX_BYTES */
    int max_depth;    /* nesting of arrays/objects; 0 = MKV_JSON_DEFAULT_MAX_DEPTH */
} mkv_json_limits;

#define MKV_JSON_DEFAULT_MAX_BYTES ((size_t)1 << 30)
#define MKV_JSON_DEFAULT_MAX_DEPTH 256

/* Parse text[0..len) (need not be NUL-terminated).  limits may be NULL.
 * The whole input must be one value with only whitespace around it.
 * MKV_EFORMAT for malformed input, MKV_ENOMEM when memory runs out. */
int mkv_json_parse(const char *text, size_t len, const mkv_json_limits *limits,
                   mkv_json_doc **out, mkv_error *err);
/* Read and parse a whole file; messages start with "'path': ". */
int mkv_json_parse_file(const char *path, const mkv_json_limits *limits,
                        mkv_json_doc **out, mkv_error *err);
void mkv_json_free(mkv_json_doc *doc);
const mkv_json *mkv_json_root(const mkv_json_doc *doc);

mkv_json_type mkv_json_type_of(const mkv_json *v);
const char *mkv_json_type_name(mkv_json_type t); /* "null", "number", "object", ... */

/* Arrays and objects: number of elements/members; strings: bytes;
 * 0 for other types and for NULL. */
size_t mkv_json_len(const mkv_json *v);
/* Array element i; NULL when v is not an array or i is out of range. */
const mkv_json *mkv_json_at(const mkv_json *v, size_t i);

/* Object member by key (NUL-terminated, or key_len bytes); NULL when v is
 * not an object or has no such member. */
const mkv_json *mkv_json_get(const mkv_json *v, const char *key);
const mkv_json *mkv_json_get_n(const mkv_json *v, const char *key, size_t key_len);
/* Position of member key in the object (document order); 0 if found,
 * -1 if not (or v is not an object). */
int mkv_json_find(const mkv_json *v, const char *key, size_t key_len, size_t *index);
/* Member i of an object in document order: its key (NUL-terminated; length
 * in *key_len if non-NULL) and value.  NULL when out of range. */
const char *mkv_json_key_at(const mkv_json *v, size_t i, size_t *key_len);
const mkv_json *mkv_json_value_at(const mkv_json *v, size_t i);

/* String contents (NUL-terminated; *len, if non-NULL, gets the byte count,
 * which counts any embedded NULs); NULL when v is not a string. */
const char *mkv_json_str(const mkv_json *v, size_t *len);
/* Number as double; -1 when v is not a number. */
int mkv_json_double(const mkv_json *v, double *out);
/* Integer literal as int64; -1 when v is not a number written as an
 * integer in int64 range (1.0 and 1e3 are not integers here). */
int mkv_json_int64(const mkv_json *v, int64_t *out);
/* true/false as 1/0; -1 when v is not a boolean. */
int mkv_json_bool(const mkv_json *v, int *out);

#endif
