/* mkv-analyze: inspect KV dumps (validation, header, per-head statistics).
 *
 * Examples:
 *   mkv-analyze check kv.h5                     # "kv.h5: ok", or one line per problem, exit 1
 *   mkv-analyze check -q a.h5 b.h5               # only the problems
 *   mkv-capture --synthetic -o - | mkv-analyze check -
 *   mkv-analyze info kv.h5                      # shapes, dtype, tokens, bytes, source
 *   mkv-analyze stats kv.h5 > stats.tsv         # layer x kv-head x k|v table
 *   mkv-analyze stats --outlier-factor 6 kv.h5 | awk -F'\t' '$3 == "k" && $10 > 0'
 *   mkv-analyze overlap --keep 0.25 --lengths 256,1K,4K kv.h5   # the paper's Fig. 4 statistic
 *   mkv-analyze segments --segment 512 --top 4 kv.h5            # variance, outliers per segment
 *   mkv-analyze spectrum --energy 0.9,0.99 kv.h5                # channels for 90%/99% energy
 *   mkv-analyze spectrum --segment 1K --full kv.h5 > eig.tsv    # every eigenvalue
 *   mkv-analyze sparsity --fractions 0.01,0.1 kv.h5             # attention mass in top tokens
 *   mkv-analyze channels --top 8 kv.h5                          # ThinK key-channel scores
 *
 * Each command is one entry of `commands` (lib/cli/subcommand.h): its help,
 * its options and their settings, and either a table analysis (begin, the
 * rows of one layer, head and tensor, end: lib/analysis/table.h runs the
 * loop) or a function of its files.
 */
#include "config.h"

#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/analysis.h"
#include "analysis/stats.h"
#include "analysis/table.h"
#include "cli/cli.h"
#include "cli/subcommand.h"
#include "core/log.h"
#include "core/mkv.h"
#include "core/tensor.h"
#include "io/dump.h"

/* ------------------------------------------------------------ check */

/* ctx: the file's label */
static void print_problem(void *ctx, const char *problem)
{
    printf("%s: %s\n", (const char *)ctx, problem);
}

static int run_check(const mkv_subcommand *cmd, const mkv_common_opts *common, int n_files,
                     char **files)
{
    (void)cmd;
    int status = 0;
    for (int i = 0; i < n_files; i++) {
        /* the label the library gives stdin in its own messages */
        const char *label = strcmp(files[i], "-") == 0 ? "(stdin)" : files[i];
        mkv_error err;
        mkv_error_clear(&err);
        int n = mkv_dump_validate(files[i], print_problem, (void *)label, &err);
        if (n < 0) {
            mkv_report(&err);
            status = 1;
        } else if (n > 0) {
            status = 1;
        } else if (common->verbosity > MKV_LOG_ERROR) {
            printf("%s: ok\n", label);
        }
        fflush(stdout);
    }
    return status;
}

/* ------------------------------------------------------------ info */

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

static int run_info(const mkv_subcommand *cmd, const mkv_common_opts *common, int n_files,
                    char **files)
{
    (void)cmd, (void)common, (void)n_files;
    const char *path = files[0];
    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    uint64_t stored = 0, raw = 0;
    if (mkv_dump_open(path, &d, &err) != MKV_OK ||
        mkv_dump_storage_bytes(d, &stored, &raw, &err) != MKV_OK) {
        mkv_report(&err);
        if (d)
            mkv_dump_close(d);
        return mkv_exit_code(err.code);
    }
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    /* K and V at 16 bits per value: the "logical" size compression ratios
     * are quoted against (docs/DESIGN.md 7). */
    uint64_t dense = 2u * 2u * (uint64_t)m->n_layers * (uint64_t)m->n_kv_heads *
                     (uint64_t)m->n_tokens * (uint64_t)m->head_dim;
    char b1[64], b2[64], b3[64];
    printf("file:          %s\n", path);
    printf("format:        %s\n", MKV_DUMP_FORMAT);
    printf("version:       %d\n", MKV_DUMP_VERSION);
    printf("model:         %s\n", m->model);
    printf("source:        %s\n", m->source);
    printf("created_by:    %s\n", m->created_by);
    printf("layers:        %d\n", m->n_layers);
    printf("heads:         %d\n", m->n_heads);
    printf("kv_heads:      %d\n", m->n_kv_heads);
    printf("head_dim:      %d\n", m->head_dim);
    printf("rope_theta:    %g\n", m->rope_theta);
    printf("k_rope:        %s\n", m->k_rope);
    printf("tokens:        %" PRId64 "\n", m->n_tokens);
    printf("queries:       %" PRId64 "\n", m->n_queries);
    printf("kv_shape:      [%d,%" PRId64 ",%d] per layer\n", m->n_kv_heads, m->n_tokens, m->head_dim);
    printf("q_shape:       [%d,%" PRId64 ",%d] per layer\n", m->n_heads, m->n_queries, m->head_dim);
    printf("dtype:         %s\n", mkv_dtype_name(m->dtype));
    printf("token_ids:     %s\n", m->has_tokens ? "yes" : "no");
    printf("dense_bytes:   %s\n", format_bytes(dense, b1, sizeof b1));
    printf("raw_bytes:     %s\n", format_bytes(raw, b2, sizeof b2));
    printf("stored_bytes:  %s\n", format_bytes(stored, b3, sizeof b3));
    if (stored > 0)
        printf("deflate_ratio: %.2f\n", (double)raw / (double)stored);
    else
        printf("deflate_ratio: -\n");
    mkv_dump_close(d);
    return 0;
}

/* ------------------------------------------------------------ options */

enum {
    OPT_OUTLIER_FACTOR = MKV_OPT_FIRST_TOOL,
    OPT_KEEP,
    OPT_LENGTHS,
    OPT_PREFIX,
    OPT_SEGMENT,
    OPT_TOP,
    OPT_ENERGY,
    OPT_FULL,
    OPT_FRACTIONS,
    OPT_SHARES
};

/* Most values a list option takes. */
#define MAX_LIST 32

/* One share in (0, 1] (--keep, list items); exits 2 on a bad value. */
static double parse_share(const char *arg, const char *name)
{
    double v;
    if (mkv_parse_double(arg, name, -DBL_MAX, DBL_MAX, &v))
        exit(2);
    if (!(v > 0.0 && v <= 1.0)) {
        mkv_usage_error("invalid value '%s' for --%s: must be in (0, 1]", arg, name);
        exit(2);
    }
    return v;
}

/* Split a comma-separated list into items of at most 63 characters and
 * hand each to parse(item, name, index, ctx); returns the count. Exits 2 on
 * an empty item or more than MAX_LIST items. */
static int parse_list(const char *arg, const char *name,
                      void (*parse)(const char *item, const char *name, int i, void *ctx), void *ctx)
{
    int n = 0;
    for (const char *p = arg;; n++) {
        size_t len = strcspn(p, ",");
        char item[64];
        if (len == 0 || len >= sizeof item || n == MAX_LIST) {
            mkv_usage_error("invalid value '%s' for --%s: expected a comma-separated list of "
                            "at most %d values", arg, name, MAX_LIST);
            exit(2);
        }
        memcpy(item, p, len);
        item[len] = '\0';
        parse(item, name, n, ctx);
        if (p[len] == '\0')
            return n + 1;
        p += len + 1;
    }
}

static void share_item(const char *item, const char *name, int i, void *ctx)
{
    ((double *)ctx)[i] = parse_share(item, name);
}

static void size_item(const char *item, const char *name, int i, void *ctx)
{
    if (mkv_parse_size(item, name, 1, INT64_C(1) << 40, &((int64_t *)ctx)[i]))
        exit(2);
}

/* --outlier-factor F of stats and segments. */
static void parse_outlier_factor(const char *arg, double *factor)
{
    if (mkv_parse_double(arg, "outlier-factor", 1.0, 1e6, factor))
        exit(2);
}

/* --top N of segments and channels. */
static void parse_top(const char *arg, long *top)
{
    if (mkv_parse_int(arg, "top", 1, 65536, top))
        exit(2);
}

/* "25" for 0.25, "0.5" for 0.005: the percentage in column names. */
static const char *percent(double share, char *buf, size_t size)
{
    snprintf(buf, size, "%g", share * 100.0);
    return buf;
}

/* --top N against the dump's head_dim. */
static int check_top(long top, const mkv_dump_meta *m, mkv_error *err)
{
    if (top > m->head_dim)
        return mkv_fail(err, MKV_EUSAGE, "--top %ld is more than head_dim (%d)", top, m->head_dim);
    return MKV_OK;
}

/* Positions of the dump's queries, refusing a dump without any (the
 * query-based analyses have nothing to measure then). */
static int32_t *read_query_positions(mkv_dump *d, mkv_error *err)
{
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    if (m->n_queries == 0) {
        mkv_fail(err, MKV_EFORMAT, "'%s' has no queries (W = 0)", mkv_dump_path(d));
        return NULL;
    }
    int32_t *pos = mkv_alloc((size_t)m->n_queries, sizeof *pos, "query positions", err);
    if (pos && mkv_dump_read_query_pos(d, pos, err) != MKV_OK) {
        mkv_free(pos);
        return NULL;
    }
    return pos;
}

/* ------------------------------------------------------------ stats */

typedef struct {
    double factor;
    mkv_tensor_stats acc;
} stats_conf;
static stats_conf stats_settings = {.factor = MKV_OUTLIER_FACTOR_DEFAULT};

static const struct option stats_longopts[] = {
    {"outlier-factor", required_argument, NULL, OPT_OUTLIER_FACTOR},
    {NULL, 0, NULL, 0}};

static void stats_option(void *conf, int opt, const char *arg)
{
    stats_conf *cfg = conf;
    if (opt == OPT_OUTLIER_FACTOR)
        parse_outlier_factor(arg, &cfg->factor);
}

static int stats_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    stats_conf *cfg = ctx;
    int rc = mkv_tensor_stats_init(&cfg->acc, mkv_dump_meta_of(d)->head_dim, err);
    if (rc == MKV_OK)
        fprintf(out, "layer\thead\ttensor\ttokens\tmean\tstd\tabsmax\t"
                     "rms_median\trms_max\toutlier_channels\n");
    return rc;
}

static int stats_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                      mkv_error *err)
{
    stats_conf *cfg = ctx;
    int rc = mkv_dump_tensor_stats(d, layer, kind, head, &cfg->acc, err);
    if (rc != MKV_OK)
        return rc;
    mkv_tensor_summary s;
    mkv_tensor_stats_summarize(&cfg->acc, cfg->factor, &s);
    fprintf(out, "%d\t%d\t%c\t%" PRId64 "\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t%d\n", layer, head, kind,
            s.n_tokens, s.mean, s.std, s.absmax, s.rms_median, s.rms_max, s.outlier_channels);
    return MKV_OK;
}

static void stats_end(void *ctx)
{
    stats_conf *cfg = ctx;
    mkv_tensor_stats_free(&cfg->acc);
}

static const mkv_table_analysis stats_table = {"stats", 1, stats_begin, stats_rows, stats_end};

/* ------------------------------------------------------------ overlap */

typedef struct {
    double keep;
    int64_t lengths[MAX_LIST];
    int n_lengths, prefix;
    int m_keep;      /* elements kept per vector */
    float *X;        /* one head's vectors */
    double *ov;      /* per-vector overlaps of the longest window */
} overlap_conf;
static overlap_conf overlap_settings = {.keep = 0.25};

static const struct option overlap_longopts[] = {
    {"keep", required_argument, NULL, OPT_KEEP},
    {"lengths", required_argument, NULL, OPT_LENGTHS},
    {"prefix", no_argument, NULL, OPT_PREFIX},
    {NULL, 0, NULL, 0}};

static void overlap_option(void *conf, int opt, const char *arg)
{
    overlap_conf *cfg = conf;
    if (opt == OPT_KEEP)
        cfg->keep = parse_share(arg, "keep");
    else if (opt == OPT_LENGTHS)
        cfg->n_lengths = parse_list(arg, "lengths", size_item, cfg->lengths);
    else if (opt == OPT_PREFIX)
        cfg->prefix = 1;
}

typedef struct {
    double mean;      /* over every vector of every window */
    double vec_min;   /* lowest vector */
    double win_min;   /* lowest window mean */
    double win_max;   /* highest window mean */
} overlap_summary;

/* Overlap of the first `windows` windows of L tokens of X[.][hd]; ov holds
 * L doubles. */
static int overlap_windows(const float *X, int64_t windows, int64_t L, int hd, int m, int rotated,
                           double *ov, overlap_summary *o, mkv_error *err)
{
    double sum = 0.0;
    o->vec_min = o->win_min = 1.0;
    o->win_max = 0.0;
    for (int64_t w = 0; w < windows; w++) {
        int rc = mkv_overlap(X + (size_t)(w * L) * (size_t)hd, L, hd, m, rotated, ov, err);
        if (rc != MKV_OK)
            return rc;
        double wsum = 0.0;
        for (int64_t i = 0; i < L; i++) {
            wsum += ov[i];
            o->vec_min = ov[i] < o->vec_min ? ov[i] : o->vec_min;
        }
        double wmean = wsum / (double)L;
        o->win_min = wmean < o->win_min ? wmean : o->win_min;
        o->win_max = wmean > o->win_max ? wmean : o->win_max;
        sum += wsum;
    }
    o->mean = sum / ((double)windows * (double)L);
    return MKV_OK;
}

static int overlap_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    overlap_conf *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens;
    int64_t *lengths = cfg->lengths;
    if (cfg->n_lengths == 0) {
        int n = 0;
        lengths[n++] = T < 256 ? T : 256;
        while (n < MAX_LIST && lengths[n - 1] * 4 <= T)
            lengths[n] = lengths[n - 1] * 4, n++;
        cfg->n_lengths = n;
    }
    int64_t longest = 0;
    for (int i = 0; i < cfg->n_lengths; i++) {
        if (lengths[i] > T)
            return mkv_fail(err, MKV_EUSAGE, "--lengths %lld is longer than the context of '%s' "
                            "(%lld tokens)", (long long)lengths[i], mkv_dump_path(d), (long long)T);
        longest = lengths[i] > longest ? lengths[i] : longest;
    }
    cfg->m_keep = mkv_keep_count(cfg->keep, m->head_dim);
    cfg->X = mkv_alloc((size_t)T * (size_t)m->head_dim, sizeof *cfg->X, "one head's vectors", err);
    cfg->ov = cfg->X ? mkv_alloc((size_t)longest, sizeof *cfg->ov, "per-vector overlaps", err)
                           : NULL;
    if (!cfg->ov)
        return err->code;
    fprintf(out, "layer\thead\ttensor\tlength\trotated\twindows\toverlap_mean\toverlap_min\t"
                 "window_min\twindow_max\n");
    return MKV_OK;
}

static int overlap_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                        mkv_error *err)
{
    overlap_conf *cfg = ctx;
    const int64_t T = mkv_dump_meta_of(d)->n_tokens;
    const int hd = mkv_dump_meta_of(d)->head_dim;
    int rc = mkv_dump_read_finite(d, layer, kind, head, 1, 0, T, cfg->X, err);
    for (int li = 0; li < cfg->n_lengths && rc == MKV_OK; li++) {
        const int64_t L = cfg->lengths[li], windows = cfg->prefix ? 1 : T / L;
        for (int rotated = 0; rotated < 2 && rc == MKV_OK; rotated++) {
            overlap_summary o;
            rc = overlap_windows(cfg->X, windows, L, hd, cfg->m_keep, rotated, cfg->ov, &o,
                                 err);
            if (rc == MKV_OK)
                fprintf(out, "%d\t%d\t%c\t%lld\t%d\t%lld\t%.9g\t%.9g\t%.9g\t%.9g\n", layer, head,
                        kind, (long long)L, rotated, (long long)windows, o.mean, o.vec_min,
                        o.win_min, o.win_max);
        }
    }
    return rc;
}

static void overlap_end(void *ctx)
{
    overlap_conf *cfg = ctx;
    mkv_free(cfg->X);
    mkv_free(cfg->ov);
}

static const mkv_table_analysis overlap_table = {"overlap", 1, overlap_begin, overlap_rows,
                                                 overlap_end};

/* ------------------------------------------------------------ segments */

typedef struct {
    int64_t S;
    double factor;
    long top;
    int64_t seg;     /* tokens per segment in this dump */
    float *X;        /* one segment */
    int *channels;   /* its top channels */
} segments_conf;
static segments_conf segments_settings = {.S = 256, .factor = 6.0, .top = 8};

static const struct option segments_longopts[] = {
    {"segment", required_argument, NULL, OPT_SEGMENT},
    {"outlier-factor", required_argument, NULL, OPT_OUTLIER_FACTOR},
    {"top", required_argument, NULL, OPT_TOP},
    {NULL, 0, NULL, 0}};

static void segments_option(void *conf, int opt, const char *arg)
{
    segments_conf *cfg = conf;
    if (opt == OPT_SEGMENT && mkv_parse_size(arg, "segment", 1, INT64_C(1) << 40, &cfg->S))
        exit(2);
    if (opt == OPT_OUTLIER_FACTOR)
        parse_outlier_factor(arg, &cfg->factor);
    if (opt == OPT_TOP)
        parse_top(arg, &cfg->top);
}

static int segments_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    segments_conf *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    cfg->seg = cfg->S < m->n_tokens ? cfg->S : m->n_tokens;
    int rc = check_top(cfg->top, m, err);
    if (rc != MKV_OK)
        return rc;
    cfg->X = mkv_alloc((size_t)cfg->seg * (size_t)m->head_dim, sizeof *cfg->X,
                           "a segment", err);
    cfg->channels = cfg->X ? mkv_alloc((size_t)cfg->top, sizeof *cfg->channels,
                                               "channel indices", err)
                                   : NULL;
    if (!cfg->channels)
        return err->code;
    fprintf(out, "layer\thead\ttensor\tsegment\tstart\ttokens\trms\tmag_var\tkurtosis\t"
                 "outlier_share\ttop_energy\ttop_channels\n");
    return MKV_OK;
}

static int segments_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                         mkv_error *err)
{
    segments_conf *cfg = ctx;
    const int64_t T = mkv_dump_meta_of(d)->n_tokens, seg = cfg->seg;
    const int hd = mkv_dump_meta_of(d)->head_dim, top = (int)cfg->top;
    for (int64_t s0 = 0, i = 0; s0 < T; s0 += seg, i++) {
        int64_t n = T - s0 < seg ? T - s0 : seg;
        mkv_segment_summary sum;
        int rc = mkv_dump_read_finite(d, layer, kind, head, 1, s0, n, cfg->X, err);
        if (rc == MKV_OK)
            rc = mkv_segment_stats(cfg->X, n, hd, cfg->factor, top, &sum, cfg->channels,
                                   err);
        if (rc != MKV_OK)
            return rc;
        fprintf(out, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t", layer, head,
                kind, (long long)i, (long long)s0, (long long)n, sum.rms, sum.mag_var,
                sum.kurtosis, sum.outlier_share, sum.top_energy);
        for (int c = 0; c < top; c++)
            fprintf(out, "%d%c", cfg->channels[c], c + 1 < top ? ',' : '\n');
    }
    return MKV_OK;
}

static void segments_end(void *ctx)
{
    segments_conf *cfg = ctx;
    mkv_free(cfg->X);
    mkv_free(cfg->channels);
}

static const mkv_table_analysis segments_table = {"segments", 1, segments_begin, segments_rows,
                                                  segments_end};

/* ------------------------------------------------------------ spectrum */

typedef struct {
    int64_t S;
    double energy[MAX_LIST];
    int n_energy, full;
    int64_t seg;     /* tokens per segment in this dump */
    float *X;        /* one segment */
    double *evals;   /* its eigenvalues */
} spectrum_conf;
static spectrum_conf spectrum_settings = {.energy = {0.9, 0.95, 0.99}, .n_energy = 3};

static const struct option spectrum_longopts[] = {
    {"segment", required_argument, NULL, OPT_SEGMENT},
    {"energy", required_argument, NULL, OPT_ENERGY},
    {"full", no_argument, NULL, OPT_FULL},
    {NULL, 0, NULL, 0}};

static void spectrum_option(void *conf, int opt, const char *arg)
{
    spectrum_conf *cfg = conf;
    if (opt == OPT_SEGMENT && mkv_parse_size(arg, "segment", 0, INT64_C(1) << 40, &cfg->S))
        exit(2);
    if (opt == OPT_ENERGY)
        cfg->n_energy = parse_list(arg, "energy", share_item, cfg->energy);
    if (opt == OPT_FULL)
        cfg->full = 1;
}

static int spectrum_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    spectrum_conf *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens;
    cfg->seg = cfg->S == 0 || cfg->S > T ? T : cfg->S;
    cfg->X = mkv_alloc((size_t)cfg->seg * (size_t)m->head_dim, sizeof *cfg->X,
                           "a segment", err);
    cfg->evals = cfg->X ? mkv_alloc((size_t)m->head_dim, sizeof *cfg->evals,
                                            "eigenvalues", err)
                                : NULL;
    if (!cfg->evals)
        return err->code;
    if (cfg->full) {
        fprintf(out, "layer\thead\ttensor\tsegment\tstart\ttokens\tindex\teigenvalue\tshare\t"
                     "cumulative\n");
    } else {
        char pct[32];
        fprintf(out, "layer\thead\ttensor\tsegment\tstart\ttokens\tenergy\tlambda1_share");
        for (int e = 0; e < cfg->n_energy; e++)
            fprintf(out, "\td%s", percent(cfg->energy[e], pct, sizeof pct));
        fputc('\n', out);
    }
    return MKV_OK;
}

static int spectrum_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                         mkv_error *err)
{
    spectrum_conf *cfg = ctx;
    const int64_t T = mkv_dump_meta_of(d)->n_tokens, seg = cfg->seg;
    const int hd = mkv_dump_meta_of(d)->head_dim;
    const double *evals = cfg->evals;
    for (int64_t s0 = 0, i = 0; s0 < T; s0 += seg, i++) {
        int64_t n = T - s0 < seg ? T - s0 : seg;
        int rc = mkv_dump_read_finite(d, layer, kind, head, 1, s0, n, cfg->X, err);
        if (rc == MKV_OK)
            rc = mkv_spectrum(cfg->X, n, hd, cfg->evals, err);
        if (rc != MKV_OK)
            return rc;
        double total = 0.0;
        for (int j = 0; j < hd; j++)
            total += evals[j];
        double share = total > 0.0 ? 1.0 / total : 0.0;
        if (cfg->full) {
            double cum = 0.0;
            for (int j = 0; j < hd; j++) {
                cum += evals[j];
                fprintf(out, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%d\t%.9g\t%.9g\t%.9g\n", layer, head,
                        kind, (long long)i, (long long)s0, (long long)n, j, evals[j],
                        evals[j] * share, cum * share);
            }
            continue;
        }
        fprintf(out, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%.9g\t%.9g", layer, head, kind, (long long)i,
                (long long)s0, (long long)n, total, evals[0] * share);
        for (int e = 0; e < cfg->n_energy; e++)
            fprintf(out, "\t%d", mkv_energy_rank(evals, hd, cfg->energy[e]));
        fputc('\n', out);
    }
    return MKV_OK;
}

static void spectrum_end(void *ctx)
{
    spectrum_conf *cfg = ctx;
    mkv_free(cfg->X);
    mkv_free(cfg->evals);
}

static const mkv_table_analysis spectrum_table = {"spectrum", 1, spectrum_begin, spectrum_rows,
                                                  spectrum_end};

/* ------------------------------------------------------------ sparsity */

typedef struct {
    double fractions[MAX_LIST];
    int n_fractions;
    int32_t *pos;      /* query positions */
    int64_t keys;      /* keys the latest query sees */
    float *K, *Q;      /* one head's keys, its query group */
    double *scratch;   /* attention weights */
    double *sums;      /* mean, min and mass per fraction */
} sparsity_conf;
static sparsity_conf sparsity_settings = {.fractions = {0.01, 0.05, 0.1, 0.25}, .n_fractions = 4};

static const struct option sparsity_longopts[] = {
    {"fractions", required_argument, NULL, OPT_FRACTIONS},
    {NULL, 0, NULL, 0}};

static void sparsity_option(void *conf, int opt, const char *arg)
{
    sparsity_conf *cfg = conf;
    if (opt == OPT_FRACTIONS)
        cfg->n_fractions = parse_list(arg, "fractions", share_item, cfg->fractions);
}

static int sparsity_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    sparsity_conf *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads, nf = cfg->n_fractions;
    cfg->pos = read_query_positions(d, err);
    cfg->keys = 0;
    for (int64_t w = 0; cfg->pos && w < W; w++)
        cfg->keys = cfg->pos[w] + 1 > cfg->keys ? cfg->pos[w] + 1 : cfg->keys;
    const int64_t keys = cfg->keys;
    cfg->K = cfg->pos ? mkv_alloc((size_t)keys * (size_t)hd, sizeof *cfg->K,
                                          "one head's keys", err)
                              : NULL;
    cfg->Q = cfg->K ? mkv_alloc((size_t)G * (size_t)W * (size_t)hd, sizeof *cfg->Q,
                                        "queries", err)
                            : NULL;
    cfg->scratch = cfg->Q ? mkv_alloc((size_t)keys, sizeof *cfg->scratch,
                                              "attention weights", err)
                                  : NULL;
    cfg->sums = cfg->scratch ? mkv_alloc(3 * (size_t)nf, sizeof *cfg->sums, "sums", err)
                                     : NULL;
    if (!cfg->sums)
        return err->code;
    char pct[32];
    fprintf(out, "layer\thead\tkv_head\tqueries");
    for (int f = 0; f < nf; f++) {
        percent(cfg->fractions[f], pct, sizeof pct);
        fprintf(out, "\ttop%s_mean\ttop%s_min", pct, pct);
    }
    fputc('\n', out);
    return MKV_OK;
}

static int sparsity_rows(void *ctx, mkv_dump *d, int layer, int kv, char kind, FILE *out,
                         mkv_error *err)
{
    sparsity_conf *cfg = ctx;
    (void)kind;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads, nf = cfg->n_fractions;
    const float *K = cfg->K, *Q = cfg->Q;
    int rc = mkv_dump_read_finite(d, layer, 'k', kv, 1, 0, cfg->keys, cfg->K, err);
    if (rc == MKV_OK)
        rc = mkv_dump_read_finite(d, layer, 'q', kv * G, G, 0, W, cfg->Q, err);
    for (int g = 0; g < G && rc == MKV_OK; g++) {
        double *sum = cfg->sums, *min = sum + nf, *mass = sum + 2 * nf;
        for (int f = 0; f < nf; f++)
            sum[f] = 0.0, min[f] = 1.0;
        for (int64_t w = 0; w < W; w++) {
            mkv_topk_mass(Q + ((size_t)g * W + w) * hd, K, cfg->pos[w] + 1, hd,
                          cfg->fractions, nf, mass, cfg->scratch);
            for (int f = 0; f < nf; f++) {
                sum[f] += mass[f];
                min[f] = mass[f] < min[f] ? mass[f] : min[f];
            }
        }
        fprintf(out, "%d\t%d\t%d\t%lld", layer, kv * G + g, kv, (long long)W);
        for (int f = 0; f < nf; f++)
            fprintf(out, "\t%.9g\t%.9g", sum[f] / (double)W, min[f]);
        fputc('\n', out);
    }
    return rc;
}

static void sparsity_end(void *ctx)
{
    sparsity_conf *cfg = ctx;
    mkv_free(cfg->pos);
    mkv_free(cfg->K);
    mkv_free(cfg->Q);
    mkv_free(cfg->scratch);
    mkv_free(cfg->sums);
}

static const mkv_table_analysis sparsity_table = {"sparsity", 0, sparsity_begin, sparsity_rows,
                                                  sparsity_end};

/* ------------------------------------------------------------ channels */

/* Tokens read per call when summing the keys' channel energies. */
#define CHANNEL_CHUNK_TOKENS 4096

typedef struct {
    long top;
    double shares[MAX_LIST];
    int n_shares, full;
    int64_t chunk;    /* keys read per call */
    float *K, *Q;     /* a chunk of keys, the query group */
    double *work;     /* q and k channel sums of squares, scores, top_share scratch */
    int *order;       /* channel ranks */
} channels_conf;
static channels_conf channels_settings = {.top = 8, .shares = {0.25, 0.5}, .n_shares = 2};

static const struct option channels_longopts[] = {
    {"top", required_argument, NULL, OPT_TOP},
    {"shares", required_argument, NULL, OPT_SHARES},
    {"full", no_argument, NULL, OPT_FULL},
    {NULL, 0, NULL, 0}};

static void channels_option(void *conf, int opt, const char *arg)
{
    channels_conf *cfg = conf;
    if (opt == OPT_TOP)
        parse_top(arg, &cfg->top);
    if (opt == OPT_SHARES)
        cfg->n_shares = parse_list(arg, "shares", share_item, cfg->shares);
    if (opt == OPT_FULL)
        cfg->full = 1;
}

static int channels_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    channels_conf *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens, W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads;
    cfg->chunk = T < CHANNEL_CHUNK_TOKENS ? T : CHANNEL_CHUNK_TOKENS;
    int rc = check_top(cfg->top, m, err);
    if (rc == MKV_OK && W == 0)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s' has no queries (W = 0)", mkv_dump_path(d));
    if (rc != MKV_OK)
        return rc;
    cfg->K = mkv_alloc((size_t)cfg->chunk * hd, sizeof *cfg->K, "a chunk of keys", err);
    cfg->Q = cfg->K ? mkv_alloc((size_t)G * (size_t)W * (size_t)hd, sizeof *cfg->Q,
                                        "queries", err)
                            : NULL;
    cfg->work = cfg->Q ? mkv_alloc(4 * (size_t)hd, sizeof *cfg->work, "channel scores",
                                           err)
                               : NULL;
    cfg->order = cfg->work ? mkv_alloc((size_t)hd, sizeof *cfg->order,
                                               "channel ranks", err)
                                   : NULL;
    if (!cfg->order)
        return err->code;
    if (cfg->full) {
        fprintf(out, "layer\thead\tchannel\trank\tscore\tshare\n");
    } else {
        char pct[32];
        fprintf(out, "layer\thead\tqueries\tkeys\ttop_channels");
        for (int s = 0; s < cfg->n_shares; s++)
            fprintf(out, "\tshare_top%s", percent(cfg->shares[s], pct, sizeof pct));
        fputc('\n', out);
    }
    return MKV_OK;
}

static int channels_rows(void *ctx, mkv_dump *d, int layer, int kv, char kind, FILE *out,
                         mkv_error *err)
{
    channels_conf *cfg = ctx;
    (void)kind;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens, W = m->n_queries, chunk = cfg->chunk;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads, top = (int)cfg->top;
    double *work = cfg->work, *qsq = work, *ksq = work + hd, *score = work + 2 * hd,
           *scratch = work + 3 * hd;
    int *order = cfg->order;
    int rc = MKV_OK;
    memset(work, 0, 2 * (size_t)hd * sizeof *work);
    for (int64_t t0 = 0; t0 < T && rc == MKV_OK; t0 += chunk) {
        int64_t n = T - t0 < chunk ? T - t0 : chunk;
        rc = mkv_dump_read_finite(d, layer, 'k', kv, 1, t0, n, cfg->K, err);
        if (rc == MKV_OK)
            mkv_channel_sumsq_add(ksq, cfg->K, n, hd);
    }
    if (rc == MKV_OK)
        rc = mkv_dump_read_finite(d, layer, 'q', kv * G, G, 0, W, cfg->Q, err);
    if (rc != MKV_OK)
        return rc;
    mkv_channel_sumsq_add(qsq, cfg->Q, (int64_t)G * W, hd);
    mkv_channel_scores(qsq, ksq, hd, score);
    if (cfg->full) {
        double total = 0.0;
        for (int j = 0; j < hd; j++)
            total += score[j];
        mkv_top_indices(score, hd, hd, order);
        for (int r = 0; r < hd; r++)
            fprintf(out, "%d\t%d\t%d\t%d\t%.9g\t%.9g\n", layer, kv, order[r], r + 1,
                    score[order[r]], total > 0.0 ? score[order[r]] / total : 0.0);
        return MKV_OK;
    }
    mkv_top_indices(score, hd, top, order);
    fprintf(out, "%d\t%d\t%lld\t%lld\t", layer, kv, (long long)G * W, (long long)T);
    for (int c = 0; c < top; c++)
        fprintf(out, "%d%s", order[c], c + 1 < top ? "," : "");
    for (int s = 0; s < cfg->n_shares; s++)
        fprintf(out, "\t%.9g", mkv_top_share(score, hd, mkv_keep_count(cfg->shares[s], hd), scratch));
    fputc('\n', out);
    return MKV_OK;
}

static void channels_end(void *ctx)
{
    channels_conf *cfg = ctx;
    mkv_free(cfg->K);
    mkv_free(cfg->Q);
    mkv_free(cfg->work);
    mkv_free(cfg->order);
}

static const mkv_table_analysis channels_table = {"channels", 0, channels_begin, channels_rows,
                                                  channels_end};

/* ------------------------------------------------------------ commands */

static const mkv_subcommand commands[] = {
    {
        .name = "check",
        .operands = "[options] FILE...",
        .summary = "validate dumps",
        .details =
            "Check attributes, shapes, dtypes, query positions and every value (NaN/Inf).\n"
            "Prints \"FILE: ok\" (nothing with -q) or one \"FILE: problem\" line per problem\n"
            "on stdout; exits 1 if any file is invalid or cannot be read.\n",
        .many_files = 1,
        .run = run_check,
    },
    {
        .name = "info",
        .operands = "[options] FILE",
        .summary = "print the header, sizes and bytes stored",
        .details =
            "Print \"key: value\" lines: format, model, source, shapes, dtype, tokens,\n"
            "queries, dense 16-bit K+V bytes, bytes stored (after deflate) and raw.\n",
        .run = run_info,
    },
    {
        .name = "stats",
        .operands = "[options] FILE",
        .summary = "per-head statistics of K and V (TSV)",
        .details =
            "Print a TSV table with a header line and one row per layer, KV head and\n"
            "tensor (k or v): layer, head, tensor, tokens, mean, std (population), absmax,\n"
            "rms_median and rms_max (median and largest channel RMS over the tokens) and\n"
            "outlier_channels: channels whose RMS exceeds F times rms_median.\n",
        .options =
            "      --outlier-factor F  outlier threshold F, 1..1e6 (default 4)\n",
        .longopts = stats_longopts,
        .option = stats_option,
        .conf = &stats_settings,
        .table = &stats_table,
    },
    {
        .name = "overlap",
        .operands = "[options] FILE",
        .summary = "per-vector vs global top-p channel overlap (TSV)",
        .details =
            "For windows of L consecutive tokens (a context of L tokens): the share of each\n"
            "vector's top-p elements (by |x|) that lie in the window's global top-p channels\n"
            "(the channels of largest sum of |x| over the window), with the raw channels\n"
            "(rotated 0) and after rotating the window by the eigenvectors of X^T X (rotated\n"
            "1). One row per layer, KV head, tensor, length and rotation: layer, head,\n"
            "tensor, length, rotated, windows, overlap_mean (over every vector of every\n"
            "window), overlap_min (lowest vector), window_min and window_max (lowest and\n"
            "highest window mean). Only complete windows count.\n",
        .options =
            "      --keep P            share p of elements per vector, 0 < P <= 1 (default 0.25)\n"
            "      --lengths L,...     context lengths, K/M suffixes (default 256,1K,4K,...\n"
            "                          times 4 up to the dump's T; T itself if T < 256)\n"
            "      --prefix            only the first window of each length (the first L\n"
            "                          tokens), not every window\n",
        .longopts = overlap_longopts,
        .option = overlap_option,
        .conf = &overlap_settings,
        .table = &overlap_table,
    },
    {
        .name = "segments",
        .operands = "[options] FILE",
        .summary = "magnitude statistics per segment of tokens (TSV)",
        .details =
            "Split K and V into segments of S tokens (the last one may be shorter). One row\n"
            "per layer, KV head, tensor and segment: layer, head, tensor, segment, start,\n"
            "tokens, rms (of all values), mag_var (population variance of |x|), kurtosis\n"
            "(excess, of x), outlier_share (elements with |x| > K times rms), top_energy\n"
            "(share of sum x^2 in the N channels of largest sum x^2) and top_channels\n"
            "(those N channels, largest first, comma-separated).\n",
        .options =
            "      --segment S         tokens per segment, K/M suffixes (default 256)\n"
            "      --outlier-factor K  outlier threshold in segment RMS, 1..1e6 (default 6)\n"
            "      --top N             channels for top_energy, 1..head_dim (default 8)\n",
        .longopts = segments_longopts,
        .option = segments_option,
        .conf = &segments_settings,
        .table = &segments_table,
    },
    {
        .name = "spectrum",
        .operands = "[options] FILE",
        .summary = "eigenvalue energy of segment covariances (TSV)",
        .details =
            "Eigenvalues of X^T X of each segment of S tokens (default: the whole context).\n"
            "One row per layer, KV head, tensor and segment: layer, head, tensor, segment,\n"
            "start, tokens, energy (sum of eigenvalues = sum of x^2), lambda1_share, and for\n"
            "each energy share E a column dE: the fewest rotated channels whose eigenvalues\n"
            "hold at least E of the energy. With --full one row per eigenvalue instead:\n"
            "layer, head, tensor, segment, start, tokens, index, eigenvalue, share, cumulative.\n",
        .options =
            "      --segment S         tokens per segment, K/M suffixes (default 0: whole context)\n"
            "      --energy E,...      energy shares, each in (0, 1] (default 0.9,0.95,0.99)\n"
            "      --full              print every eigenvalue (long table)\n",
        .longopts = spectrum_longopts,
        .option = spectrum_option,
        .conf = &spectrum_settings,
        .table = &spectrum_table,
    },
    {
        .name = "sparsity",
        .operands = "[options] FILE",
        .summary = "attention mass captured by the top tokens (TSV)",
        .details =
            "For each captured query (at position p: attends to tokens 0..p, softmax of\n"
            "q.k/sqrt(head_dim); query head h reads KV head h / (n_heads / n_kv_heads)):\n"
            "the attention mass of its ceil(f * (p + 1)) most attended tokens, for each\n"
            "fraction f. One row per layer and query head: layer, head, kv_head, queries,\n"
            "then topF_mean and topF_min (F = 100 f) over the queries.\n",
        .options =
            "      --fractions F,...   token fractions, each in (0, 1] (default 0.01,0.05,0.1,0.25)\n",
        .longopts = sparsity_longopts,
        .option = sparsity_option,
        .conf = &sparsity_settings,
        .table = &sparsity_table,
    },
    {
        .name = "channels",
        .operands = "[options] FILE",
        .summary = "ThinK key-channel importance per KV head (TSV)",
        .details =
            "Score of key channel j of a KV head: || Q[:,j] K[:,j]^T ||_F over the dump's\n"
            "queries Q of the head's query group and all its keys K (= ||Q[:,j]|| ||K[:,j]||).\n"
            "One row per layer and KV head: layer, head, queries, keys, top_channels (the N\n"
            "best channels, best first, comma-separated) and share_topP: the share of the\n"
            "total score in the round(P/100 * head_dim) best channels. With --full one row\n"
            "per channel: layer, head, channel, rank (1 = best), score, share.\n",
        .options =
            "      --top N             channels listed, 1..head_dim (default 8)\n"
            "      --shares P,...      channel shares, each in (0, 1] (default 0.25,0.5)\n"
            "      --full              one row per channel\n",
        .longopts = channels_longopts,
        .option = channels_option,
        .conf = &channels_settings,
        .table = &channels_table,
    },
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *fp, int status)
{
    if (status != 0) {
        fprintf(fp, "%s: expected a command (", mkv_progname());
        for (size_t i = 0; i < N_COMMANDS; i++)
            fprintf(fp, "%s%s", commands[i].name,
                    i + 2 < N_COMMANDS ? ", " : i + 1 < N_COMMANDS ? " or " : "");
        fprintf(fp, "); try '%s --help'\n", mkv_progname());
        exit(status);
    }
    fprintf(fp, "Usage: %s COMMAND [options] FILE\n\n"
                "Inspect KV dumps (mosaickv-dump v1, see mosaickv(5)). FILE '-' reads stdin.\n\n"
                "Commands:\n", mkv_progname());
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(fp, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(fp, "\n'%s COMMAND --help' describes a command's options.\n\n"
                "  -h, --help           show this help and exit\n"
                "      --version        show version and build features, then exit\n\n"
                "Examples:\n"
                "  %s check kv.h5\n"
                "  mkv-capture --synthetic -o - | %s info -\n"
                "  %s stats kv.h5 > stats.tsv\n"
                "  %s overlap --lengths 256,1K kv.h5\n",
            mkv_progname(), mkv_progname(), mkv_progname(), mkv_progname(), mkv_progname());
    exit(status);
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    if (argc < 2)
        usage(stderr, 2);
    const char *name = argv[1];
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0)
        usage(stdout, 0);
    if (strcmp(name, "--version") == 0) {
        mkv_print_version(stdout);
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0) {
            return mkv_subcommand_run(&commands[i], argc - 1, argv + 1);
        }
    if (name[0] == '-')
        mkv_usage_error("expected a command before '%s'; try '%s --help'", name, mkv_progname());
    else
        mkv_usage_error("unknown command '%s'; try '%s --help'", name, mkv_progname());
    return 2;
}
