/* The strategies table (strategies.h). */
#include "config.h"
#include "cli/strategies.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/outfile.h"
#include "io/cdump.h"
#include "methods/method.h"
#include "mosaic/packed.h"

/* The columns taken from a segment's mkv_mosaic_strategy, in table order:
 * a field added to the strategy is one more line here. */
typedef enum { FIELD_INT, FIELD_INT64 } field_type;
static const struct {
    const char *name;
    field_type type;
    size_t offset;
} strategy_columns[] = {
    {"start", FIELD_INT64, offsetof(mkv_mosaic_strategy, start)},
    {"length", FIELD_INT64, offsetof(mkv_mosaic_strategy, len)},
    {"rotate", FIELD_INT, offsetof(mkv_mosaic_strategy, rotate)},
    {"r", FIELD_INT, offsetof(mkv_mosaic_strategy, r)},
    {"g", FIELD_INT, offsetof(mkv_mosaic_strategy, g)},
    {"dprime", FIELD_INT, offsetof(mkv_mosaic_strategy, dprime)},
    {"pervector", FIELD_INT, offsetof(mkv_mosaic_strategy, pervector)},
    {"bits", FIELD_INT, offsetof(mkv_mosaic_strategy, bits)},
    {"qgroup", FIELD_INT, offsetof(mkv_mosaic_strategy, qgroup)},
    {"keydim", FIELD_INT, offsetof(mkv_mosaic_strategy, keydim)},
    {"bound", FIELD_INT, offsetof(mkv_mosaic_strategy, bound)},
};

/* The columns taken from the segment's mkv_mosaic_bytes, the total last. */
static const struct {
    const char *name;
    size_t offset;
} byte_columns[] = {
    {"values_bytes", offsetof(mkv_mosaic_bytes, values)},
    {"qparams_bytes", offsetof(mkv_mosaic_bytes, qparams)},
    {"bitmap_bytes", offsetof(mkv_mosaic_bytes, bitmap)},
    {"blockkey_bytes", offsetof(mkv_mosaic_bytes, blockkeys)},
    {"rotation_bytes", offsetof(mkv_mosaic_bytes, rotation)},
    {"bytes", offsetof(mkv_mosaic_bytes, total)},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void print_header(FILE *out)
{
    fputs("layer\thead\ttensor\tsegment", out);
    for (size_t i = 0; i < N_OF(strategy_columns); i++)
        fprintf(out, "\t%s", strategy_columns[i].name);
    for (size_t i = 0; i < N_OF(byte_columns); i++)
        fprintf(out, "\t%s", byte_columns[i].name);
    fputs("\tbytes_per_token\tenergy_loss\toutput_loss\n", out);
}

/* A stored loss; NaN (not measured) as "nan", whatever its sign bit. */
static void print_loss(FILE *out, float loss)
{
    if (isnan(loss))
        fputs("\tnan", out);
    else
        fprintf(out, "\t%.9g", (double)loss);
}

static void print_rows(FILE *out, int layer, int head, char tensor, const mkv_mosaic_tensor *t, int d,
                       int block)
{
    for (int64_t i = 0; i < t->nseg; i++) {
        const mkv_mosaic_strategy *s = &t->seg[i];
        mkv_mosaic_bytes b;
        mkv_mosaic_strategy_bytes(s, d, tensor == 'k' ? block : 0, &b);
        fprintf(out, "%d\t%d\t%c\t%" PRId64, layer, head, tensor, i);
        for (size_t c = 0; c < N_OF(strategy_columns); c++) {
            const char *field = (const char *)s + strategy_columns[c].offset;
            if (strategy_columns[c].type == FIELD_INT)
                fprintf(out, "\t%d", *(const int *)field);
            else
                fprintf(out, "\t%" PRId64, *(const int64_t *)field);
        }
        for (size_t c = 0; c < N_OF(byte_columns); c++)
            fprintf(out, "\t%" PRIu64, *(const uint64_t *)((const char *)&b + byte_columns[c].offset));
        fprintf(out, "\t%.9g", (double)b.total / (double)s->len);
        print_loss(out, t->loss[i * MKV_MOSAIC_LOSS_COLS]);
        print_loss(out, t->loss[i * MKV_MOSAIC_LOSS_COLS + 1]);
        fputc('\n', out);
    }
}

/* The recorded parameters mkv_mosaic_load needs: block, sink, recent. */
static int load_settings(mkv_cdump *c, int *block, int64_t *sink, int64_t *recent, mkv_error *err)
{
    const char *name = mkv_cdump_meta_of(c)->method;
    if (strcmp(name, "mosaic") != 0 && strcmp(name, "uniform2d") != 0)
        return mkv_fail(err, MKV_EFORMAT,
                        "strategies: '%s' was compressed with '%s'; per-segment strategies exist for mosaic "
                        "and uniform2d only", mkv_cdump_path(c), name);
    const mkv_method *m = mkv_method_find(name);
    if (!m)
        return mkv_fail(err, MKV_EUNSUP, "strategies: this build lacks method '%s'", name);
    mkv_params p;
    int rc = mkv_params_recorded(&p, m, c, err);
    if (rc != MKV_OK)
        return rc;
    *block = (int)mkv_params_int(&p, "block");
    *sink = mkv_params_int(&p, "sink");
    *recent = mkv_params_int(&p, "recent");
    return MKV_OK;
}

/* The whole table into out (a buffer). */
static int print_table(mkv_cdump *c, FILE *out, mkv_error *err)
{
    int block = 0;
    int64_t sink = 0, recent = 0;
    int rc = load_settings(c, &block, &sink, &recent, err);
    if (rc != MKV_OK)
        return rc;
    const mkv_dump_meta *m = &mkv_cdump_meta_of(c)->raw;
    print_header(out);
    mkv_progress progress;
    mkv_progress_start(&progress, "strategies", (int64_t)m->n_layers * m->n_kv_heads);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int head = 0; head < m->n_kv_heads && rc == MKV_OK; head++) {
            mkv_mosaic_head h;
            rc = mkv_mosaic_load(c, layer, head, block, sink, recent, &h, err);
            if (rc != MKV_OK)
                break;
            print_rows(out, layer, head, 'k', &h.k, h.d, h.block);
            print_rows(out, layer, head, 'v', &h.v, h.d, h.block);
            mkv_mosaic_head_free(&h);
            mkv_progress_update(&progress, (int64_t)layer * m->n_kv_heads + head + 1);
        }
    mkv_progress_finish(&progress);
    return rc;
}

int mkv_strategies_report(const char *path, const char *output, mkv_error *err)
{
    mkv_outfile o;
    int rc = mkv_outfile_open(&o, output ? output : "-", path, 0, err);
    if (rc != MKV_OK)
        return rc;
    mkv_cdump *c = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *table = NULL;
    rc = mkv_cdump_open(path, &c, err);
    if (rc == MKV_OK && !(table = open_memstream(&buf, &len)))
        rc = mkv_fail_errno(err, MKV_ENOMEM, errno, "cannot buffer the table");
    if (rc == MKV_OK)
        rc = print_table(c, table, err);
    if (table) {
        int bad = ferror(table);
        if ((fclose(table) != 0 || bad) && rc == MKV_OK)
            rc = mkv_fail(err, MKV_ENOMEM, "out of memory for the table");
    }
    if (rc == MKV_OK)
        rc = mkv_outfile_write(&o, buf, len, err);
    if (rc == MKV_OK)
        rc = mkv_outfile_commit(&o, err);
    else
        mkv_outfile_abort(&o);
    free(buf);
    mkv_cdump_close(c);
    return rc;
}
