/* The table loop of the analyses: the table is printed to memory first
 * and copied to stdout once complete; the helpers the tables share. */
#include "config.h"
#include "analysis/table.h"
#include "analysis/tables.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"

int mkv_table_analysis_run(const mkv_table_analysis *a, void *ctx, const char *path, mkv_error *err)
{
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, err);
    if (rc != MKV_OK)
        return rc;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    char *buf = NULL;
    size_t len = 0;
    FILE *table = open_memstream(&buf, &len);
    rc = table ? a->begin(ctx, d, table, err)
               : mkv_fail_errno(err, MKV_ENOMEM, errno, "cannot buffer the table");

    const int tensors = a->per_tensor ? 2 : 1;
    mkv_progress progress;
    mkv_progress_start(&progress, a->label, (int64_t)m->n_layers * m->n_kv_heads * tensors);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int head = 0; head < m->n_kv_heads && rc == MKV_OK; head++)
            for (int k = 0; k < tensors && rc == MKV_OK; k++) {
                char kind = a->per_tensor ? (k ? 'v' : 'k') : 0;
                rc = a->rows(ctx, d, layer, head, kind, table, err);
                mkv_progress_update(&progress,
                                    ((int64_t)layer * m->n_kv_heads + head) * tensors + k + 1);
            }
    mkv_progress_finish(&progress);

    if (table) {
        int bad = ferror(table);
        if (fclose(table) != 0 || bad)
            rc = rc != MKV_OK ? rc : mkv_fail(err, MKV_ENOMEM, "out of memory for the table");
        if (rc == MKV_OK &&
            (fwrite(buf, 1, len, stdout) != len || fflush(stdout) != 0 || ferror(stdout)))
            rc = mkv_fail(err, MKV_EIO, "cannot write the table to stdout");
        free(buf);
    }
    a->end(ctx);
    mkv_dump_close(d);
    return rc;
}

/* ---- helpers of the tables (tables.h) */

const char *mkv_table_percent(double share, char *buf, size_t size)
{
    snprintf(buf, size, "%g", share * 100.0);
    return buf;
}

void mkv_table_percent_columns(FILE *out, const char *prefix, const double *shares, int n)
{
    char pct[32];
    for (int i = 0; i < n; i++)
        fprintf(out, "\t%s%s", prefix, mkv_table_percent(shares[i], pct, sizeof pct));
    fputc('\n', out);
}

int mkv_table_check_top(long top, const mkv_dump_meta *m, mkv_error *err)
{
    if (top > m->head_dim)
        return mkv_fail(err, MKV_EUSAGE, "--top %ld is more than head_dim (%d)", top, m->head_dim);
    return MKV_OK;
}
