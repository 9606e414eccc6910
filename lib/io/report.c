/* The reports of check and info (report.h). */
#include "config.h"
#include "io/report.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/tensor.h"
#include "io/cdump.h"
#include "io/dump.h"
#include "io/dump_priv.h"
#include "io/h5file.h"

/* ---- check */

typedef struct {
    FILE *out;
    const char *label;
} check_ctx;

static void print_problem(void *ctx, const char *problem)
{
    const check_ctx *c = ctx;
    fprintf(c->out, "%s: %s\n", c->label, problem);
}

int mkv_dump_check_report(const char *path, int print_ok, FILE *out, mkv_error *err)
{
    check_ctx c = {out, strcmp(path, "-") == 0 ? "(stdin)" : path};
    int n = mkv_dump_validate(path, print_problem, &c, err);
    if (n == 0 && print_ok)
        fprintf(out, "%s: ok\n", c.label);
    return n;
}

/* ---- info */

/* "1234567 (1.2 MiB)" */
static const char *format_bytes(uint64_t bytes, char *buf, size_t size)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%" PRIu64, bytes);
    else
        snprintf(buf, size, "%" PRIu64 " (%.1f %s)", bytes, v, unit[u]);
    return buf;
}

/* The shape lines both kinds of dump share, values from column width. */
static void print_shape(FILE *out, const mkv_dump_meta *m, int width)
{
    fprintf(out, "%-*s%d\n", width, "layers:", m->n_layers);
    fprintf(out, "%-*s%d\n", width, "heads:", m->n_heads);
    fprintf(out, "%-*s%d\n", width, "kv_heads:", m->n_kv_heads);
    fprintf(out, "%-*s%d\n", width, "head_dim:", m->head_dim);
    fprintf(out, "%-*s%g\n", width, "rope_theta:", m->rope_theta);
    fprintf(out, "%-*s%s\n", width, "k_rope:", m->k_rope);
    fprintf(out, "%-*s%" PRId64 "\n", width, "tokens:", m->n_tokens);
    fprintf(out, "%-*s%" PRId64 "\n", width, "queries:", m->n_queries);
}

static int raw_info(mkv_dump *d, const char *path, FILE *out, mkv_error *err)
{
    uint64_t stored = 0, raw = 0;
    if (mkv_dump_storage_bytes(d, &stored, &raw, err) != MKV_OK)
        return err->code;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    /* K and V at 16 bits per value: the "logical" size compression ratios
     * are quoted against (docs/DESIGN.md 7). */
    uint64_t dense = 2u * 2u * (uint64_t)m->n_layers * (uint64_t)m->n_kv_heads *
                     (uint64_t)m->n_tokens * (uint64_t)m->head_dim;
    char b1[64], b2[64], b3[64];
    fprintf(out, "file:          %s\n", path);
    fprintf(out, "format:        %s\n", MKV_DUMP_FORMAT);
    fprintf(out, "version:       %d\n", MKV_DUMP_VERSION);
    fprintf(out, "model:         %s\n", m->model);
    fprintf(out, "source:        %s\n", m->source);
    fprintf(out, "created_by:    %s\n", m->created_by);
    print_shape(out, m, 15);
    fprintf(out, "kv_shape:      [%d,%" PRId64 ",%d] per layer\n", m->n_kv_heads, m->n_tokens,
            m->head_dim);
    fprintf(out, "q_shape:       [%d,%" PRId64 ",%d] per layer\n", m->n_heads, m->n_queries,
            m->head_dim);
    fprintf(out, "dtype:         %s\n", mkv_dtype_name(m->dtype));
    fprintf(out, "token_ids:     %s\n", m->has_tokens ? "yes" : "no");
    fprintf(out, "dense_bytes:   %s\n", format_bytes(dense, b1, sizeof b1));
    fprintf(out, "raw_bytes:     %s\n", format_bytes(raw, b2, sizeof b2));
    fprintf(out, "stored_bytes:  %s\n", format_bytes(stored, b3, sizeof b3));
    if (stored > 0)
        fprintf(out, "deflate_ratio: %.2f\n", (double)raw / (double)stored);
    else
        fprintf(out, "deflate_ratio: -\n");
    return MKV_OK;
}

/* What a compressed dump records of its method, its source and its bytes;
 * what each method stores is its own (mosaickv(5)). */
static void compressed_info(const mkv_cdump *c, const char *path, FILE *out)
{
    const mkv_cdump_meta *cm = mkv_cdump_meta_of(c);
    const mkv_dump_meta *m = &cm->raw;
    char b1[64], b2[64];
    fprintf(out, "file:           %s\n", path);
    fprintf(out, "format:         %s\n", MKV_CDUMP_FORMAT);
    fprintf(out, "version:        %d\n", MKV_CDUMP_VERSION);
    fprintf(out, "method:         %s\n", cm->method);
    fprintf(out, "params:         %s\n", cm->params[0] ? cm->params : "-");
    fprintf(out, "source:         %s\n", cm->source[0] ? cm->source : "-");
    fprintf(out, "source_digest:  %s\n", cm->source_digest[0] ? cm->source_digest : "-");
    fprintf(out, "raw_source:     %s\n", m->source);
    fprintf(out, "model:          %s\n", m->model);
    fprintf(out, "created_by:     %s\n", m->created_by);
    print_shape(out, m, 16);
    fprintf(out, "logical_bytes:  %s\n", format_bytes(cm->logical_bytes, b1, sizeof b1));
    fprintf(out, "physical_bytes: %s\n", format_bytes(cm->physical_bytes, b2, sizeof b2));
    /* the open refuses a dump whose arrays hold no byte */
    fprintf(out, "ratio:          %.3f\n", (double)cm->logical_bytes / (double)cm->physical_bytes);
}

int mkv_dump_info_report(const char *path, FILE *out, mkv_error *err)
{
    hid_t fid;
    int rc = mkv_h5_open_read(path, &fid, err);
    if (rc != MKV_OK)
        return rc;
    /* Anything but a readable "compressed" mkv_format goes to the raw
     * reader, whose refusals name what is wrong. */
    char fmt[64] = "";
    mkv_error ignored;
    if (mkv_h5_has_attr(fid, "mkv_format") &&
        mkv_h5_attr_get_str(fid, "mkv_format", fmt, sizeof fmt, &ignored) == MKV_OK &&
        strcmp(fmt, MKV_CDUMP_FORMAT) == 0) {
        mkv_cdump *c;
        if ((rc = mkv_cdump_open_fid(fid, path, &c, err)) != MKV_OK)
            return rc;
        compressed_info(c, path, out);
        mkv_cdump_close(c);
        return MKV_OK;
    }
    mkv_dump *d;
    if ((rc = mkv_dump_open_fid(fid, path, &d, err)) != MKV_OK)
        return rc;
    rc = raw_info(d, path, out, err);
    mkv_dump_close(d);
    return rc;
}
