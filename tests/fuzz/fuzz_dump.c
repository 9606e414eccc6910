/* Fuzz harness: raw KV dumps (io/dump.h): mkv_dump_validate, then
 * mkv_dump_open and reads of every dataset. A file that validates without
 * a problem must open and read back finite values everywhere; every HDF5
 * object is closed afterwards. */
#include "config.h"
#include "fuzz.h"
#include "io/dump.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens read per dataset: the first and the last ones. */
#define READ_TOKENS 256
/* Longest /tokens and /query_pos read whole. */
#define MAX_READ (1 << 24)

static void on_problem(void *ctx, const char *problem)
{
    size_t len = strlen(problem);
    if (len == 0 || memchr(problem, '\n', len))
        fuzz_bug("mkv_dump_validate reported a problem that is not one line: \"%s\"", problem);
    (*(int *)ctx)++;
    if (getenv("MKV_FUZZ_VERBOSE"))
        fprintf(stderr, "  mkv_dump_validate: %s\n", problem);
}

static void check_closed(void)
{
    ssize_t open = H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open != 0)
        fuzz_bug("%zd HDF5 objects are still open", open);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("in.h5", data, size);
    mkv_error err;
    int reported = 0;
    int problems = mkv_dump_validate(path, on_problem, &reported, &err);
    if (problems < 0)
        fuzz_check_refusal(err.code ? (int)err.code : -1, &err, "mkv_dump_validate");
    else if (problems != reported)
        fuzz_bug("mkv_dump_validate counted %d problems and reported %d", problems, reported);
    check_closed();

    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, &err);
    fuzz_check_refusal(rc, &err, "mkv_dump_open");
    if (rc) {
        if (problems == 0)
            fuzz_bug("mkv_dump_validate found no problem, mkv_dump_open refused: %s", err.msg);
        check_closed();
        return 0;
    }
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    int clean = problems == 0;
    int64_t T = m->n_tokens, W = m->n_queries;
    /* query_pos and tokens: a reader that succeeds gives positions in
     * range (a file's own claim of W and T is bounded by its size) */
    if (W <= MAX_READ && T <= MAX_READ) {
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)(W + 1));
        int32_t *tok = m->has_tokens ? malloc(sizeof(int32_t) * (size_t)(T + 1)) : NULL;
        if (!pos || (m->has_tokens && !tok))
            fuzz_bug("out of memory for %lld queries and %lld tokens", (long long)W, (long long)T);
        rc = mkv_dump_read_query_pos(d, pos, &err);
        fuzz_check_refusal(rc, &err, "mkv_dump_read_query_pos");
        if (rc && clean)
            fuzz_bug("a valid dump's query_pos does not read: %s", err.msg);
        for (int64_t w = 0; !rc && w < W; w++)
            if (pos[w] < 0 || pos[w] >= T)
                fuzz_bug("mkv_dump_read_query_pos gave query %lld at position %d of %lld tokens", (long long)w,
                         pos[w], (long long)T);
        if (tok) {
            rc = mkv_dump_read_tokens(d, tok, &err);
            fuzz_check_refusal(rc, &err, "mkv_dump_read_tokens");
            if (rc && clean)
                fuzz_bug("a valid dump's tokens do not read: %s", err.msg);
        }
        free(pos);
        free(tok);
    } else if (clean) {
        fuzz_bug("a valid dump of %zu bytes has %lld tokens and %lld queries", size, (long long)T, (long long)W);
    }
    size_t d_ = (size_t)m->head_dim;
    float *buf = malloc(sizeof(float) * READ_TOKENS * d_);
    if (!buf)
        fuzz_bug("out of memory for head_dim %d", m->head_dim);
    for (int l = 0; l < m->n_layers && l < 64; l++)
        for (int k = 0; k < 3; k++) {
            char kind = "kvq"[k];
            int heads = kind == 'q' ? m->n_heads : m->n_kv_heads;
            int64_t n = kind == 'q' ? W : T;
            int64_t cnt = n < READ_TOKENS ? n : READ_TOKENS;
            for (int h = 0; h < heads && h < 64; h += heads > 1 ? heads - 1 : 1)
                for (int end = 0; end < 2; end++) {
                    int64_t t0 = end ? n - cnt : 0;
                    rc = mkv_dump_read_finite(d, l, kind, h, 1, t0, cnt, buf, &err);
                    fuzz_check_refusal(rc, &err, "mkv_dump_read_finite");
                    if (rc && clean)
                        fuzz_bug("a valid dump does not read: %s", err.msg);
                }
        }
    free(buf);
    uint64_t stored, raw;
    rc = mkv_dump_storage_bytes(d, &stored, &raw, &err);
    fuzz_check_refusal(rc, &err, "mkv_dump_storage_bytes");
    mkv_dump_close(d);
    check_closed();
    return 0;
}
