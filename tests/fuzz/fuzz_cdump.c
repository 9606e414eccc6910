/* Fuzz harness: compressed KV dumps (io/cdump.h) and every method's loader
 * (methods/method.h): mkv_cdump_open, then, as mkv-attend does, the method
 * the file names with the parameters it records and the method's check of
 * them against the shape, then load and attend for (layer, head) pairs:
 * three queries each, at the first and last positions and at the file's
 * first query position. Every HDF5 object is closed afterwards.
 *
 * Not covered: a compressed dump claiming more than MAX_TOKENS tokens is
 * not loaded (mkv-attend compares the count with the raw dump's first, so
 * the claim is bounded by a real file there). */
#include "config.h"
#include "fuzz.h"
#include "io/cdump.h"
#include "methods/method.h"

#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS (1 << 22)
#define HEADS 4   /* the first HEADS layers and KV heads, and the last ones */

static void check_closed(void)
{
    ssize_t open = H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open != 0)
        fuzz_bug("%zd HDF5 objects are still open", open);
}

/* The recorded parameters, as mkv-attend reads them back. */
static int load_params(const mkv_method *m, const char *text, mkv_params *p, mkv_error *err)
{
    mkv_params_init(p, m->params);
    char *copy = strdup(text);
    if (!copy)
        fuzz_bug("out of memory");
    int rc = MKV_OK;
    for (char *save = NULL, *tok = strtok_r(copy, " ", &save); tok && !rc; tok = strtok_r(NULL, " ", &save))
        rc = mkv_params_parse(p, tok, err);
    free(copy);
    return rc;
}

static int pick(int i, int n)
{
    return i < HEADS ? i : n - 1 - (i - HEADS);
}

static void attend_head(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                        const int32_t *query_pos, int64_t W)
{
    int64_t T;
    int d, G;
    mkv_cdump_cache_shape(c, &T, &d, &G);
    size_t gd = (size_t)G * (size_t)d;
    float *q = malloc(sizeof(float) * gd);
    if (!q)
        fuzz_bug("out of memory for G=%d, d=%d", G, d);
    for (size_t i = 0; i < gd; i++)
        q[i] = (float)sin(0.7 * (double)i + 0.3);
    int64_t positions[3] = {0, T - 1, W > 0 ? query_pos[0] : T / 2};
    fuzz_load_attend(m, p, c, layer, head, q, positions, 3);
    free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("in.h5", data, size);
    mkv_error err;
    mkv_cdump *c = NULL;
    int rc = mkv_cdump_open(path, &c, &err);
    fuzz_check_refusal(rc, &err, "mkv_cdump_open");
    if (rc) {
        check_closed();
        return 0;
    }
    const mkv_cdump_meta *cm = mkv_cdump_meta_of(c);
    const mkv_method *m = mkv_method_find(cm->method);
    mkv_params p;
    int64_t W = cm->raw.n_queries;
    int32_t *query_pos = malloc(sizeof(int32_t) * (size_t)(W + 1));
    if (!query_pos)
        fuzz_bug("out of memory for %lld queries", (long long)W);
    rc = mkv_cdump_read_query_pos(c, query_pos, &err);
    if (rc)
        fuzz_bug("mkv_cdump_open accepted a file whose query_pos does not read: %s", err.msg);
    for (int64_t w = 0; w < W; w++)
        if (query_pos[w] < 0 || query_pos[w] >= cm->raw.n_tokens)
            fuzz_bug("mkv_cdump_open accepted query position %d of %lld tokens", query_pos[w],
                     (long long)cm->raw.n_tokens);
    rc = m && cm->raw.n_tokens <= MAX_TOKENS ? load_params(m, cm->params, &p, &err) : -1;
    fuzz_check_refusal(rc > 0 ? rc : MKV_OK, &err, "mkv_params_parse (the recorded parameters)");
    if (!rc) {
        rc = m->check(&p, &cm->raw, &err);
        fuzz_check_refusal(rc, &err, "check");
    }
    if (!rc) {
        const mkv_dump_meta *r = &cm->raw;
        int nl = r->n_layers < 2 * HEADS ? r->n_layers : 2 * HEADS;
        int nh = r->n_kv_heads < 2 * HEADS ? r->n_kv_heads : 2 * HEADS;
        for (int i = 0; i < nl; i++)
            for (int j = 0; j < nh; j++)
                attend_head(m, &p, c, pick(i, r->n_layers), pick(j, r->n_kv_heads), query_pos, W);
    }
    free(query_pos);
    mkv_cdump_close(c);
    check_closed();
    return 0;
}
