/* The reports of check and info (report.h). */
#include "config.h"
#include "io/report.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/tensor.h"
#include "io/dump.h"

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

int mkv_dump_info_report(const char *path, FILE *out, mkv_error *err)
{
    mkv_dump *d = NULL;
    uint64_t stored = 0, raw = 0;
    if (mkv_dump_open(path, &d, err) != MKV_OK ||
        mkv_dump_storage_bytes(d, &stored, &raw, err) != MKV_OK) {
        if (d)
            mkv_dump_close(d);
        return err->code;
    }
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
    fprintf(out, "layers:        %d\n", m->n_layers);
    fprintf(out, "heads:         %d\n", m->n_heads);
    fprintf(out, "kv_heads:      %d\n", m->n_kv_heads);
    fprintf(out, "head_dim:      %d\n", m->head_dim);
    fprintf(out, "rope_theta:    %g\n", m->rope_theta);
    fprintf(out, "k_rope:        %s\n", m->k_rope);
    fprintf(out, "tokens:        %" PRId64 "\n", m->n_tokens);
    fprintf(out, "queries:       %" PRId64 "\n", m->n_queries);
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
    mkv_dump_close(d);
    return MKV_OK;
}
