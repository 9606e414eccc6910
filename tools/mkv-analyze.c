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
 * Each command is a function over the library; a new one is one more row
 * in `commands`.
 */
#include "config.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/analysis.h"
#include "cli/cli.h"
#include "io/dump.h"
#include "core/log.h"
#include "core/mkv.h"
#include "analysis/stats.h"
#include "core/tensor.h"

typedef struct command command;
struct command {
    const char *name;
    const char *operands;   /* what follows "mkv-analyze NAME" in the synopsis */
    const char *summary;    /* one line for the command list */
    const char *details;    /* for the command's --help */
    const char *options;    /* the command's own options for --help, or NULL */
    int (*run)(const command *cmd, int argc, char **argv);
};

static int cmd_check(const command *cmd, int argc, char **argv);
static int cmd_info(const command *cmd, int argc, char **argv);
static int cmd_stats(const command *cmd, int argc, char **argv);
static int cmd_overlap(const command *cmd, int argc, char **argv);
static int cmd_segments(const command *cmd, int argc, char **argv);
static int cmd_spectrum(const command *cmd, int argc, char **argv);
static int cmd_sparsity(const command *cmd, int argc, char **argv);
static int cmd_channels(const command *cmd, int argc, char **argv);

static const command commands[] = {
    {"check", "[options] FILE...", "validate dumps",
     "Check attributes, shapes, dtypes, query positions and every value (NaN/Inf).\n"
     "Prints \"FILE: ok\" (nothing with -q) or one \"FILE: problem\" line per problem\n"
     "on stdout; exits 1 if any file is invalid or cannot be read.\n",
     NULL, cmd_check},
    {"info", "[options] FILE", "print the header, sizes and bytes stored",
     "Print \"key: value\" lines: format, model, source, shapes, dtype, tokens,\n"
     "queries, dense 16-bit K+V bytes, bytes stored (after deflate) and raw.\n",
     NULL, cmd_info},
    {"stats", "[options] FILE", "per-head statistics of K and V (TSV)",
     "Print a TSV table with a header line and one row per layer, KV head and\n"
     "tensor (k or v): layer, head, tensor, tokens, mean, std (population), absmax,\n"
     "rms_median and rms_max (median and largest channel RMS over the tokens) and\n"
     "outlier_channels: channels whose RMS exceeds F times rms_median.\n",
     "      --outlier-factor F  outlier threshold F, 1..1e6 (default 4)\n",
     cmd_stats},
    {"overlap", "[options] FILE", "per-vector vs global top-p channel overlap (TSV)",
     "For windows of L consecutive tokens (a context of L tokens): the share of each\n"
     "vector's top-p elements (by |x|) that lie in the window's global top-p channels\n"
     "(the channels of largest sum of |x| over the window), with the raw channels\n"
     "(rotated 0) and after rotating the window by the eigenvectors of X^T X (rotated\n"
     "1). One row per layer, KV head, tensor, length and rotation: layer, head,\n"
     "tensor, length, rotated, windows, overlap_mean (over every vector of every\n"
     "window), overlap_min (lowest vector), window_min and window_max (lowest and\n"
     "highest window mean). Only complete windows count.\n",
     "      --keep P            share p of elements per vector, 0 < P <= 1 (default 0.25)\n"
     "      --lengths L,...     context lengths, K/M suffixes (default 256,1K,4K,...\n"
     "                          times 4 up to the dump's T; T itself if T < 256)\n"
     "      --prefix            only the first window of each length (the first L\n"
     "                          tokens), not every window\n",
     cmd_overlap},
    {"segments", "[options] FILE", "magnitude statistics per segment of tokens (TSV)",
     "Split K and V into segments of S tokens (the last one may be shorter). One row\n"
     "per layer, KV head, tensor and segment: layer, head, tensor, segment, start,\n"
     "tokens, rms (of all values), mag_var (population variance of |x|), kurtosis\n"
     "(excess, of x), outlier_share (elements with |x| > K times rms), top_energy\n"
     "(share of sum x^2 in the N channels of largest sum x^2) and top_channels\n"
     "(those N channels, largest first, comma-separated).\n",
     "      --segment S         tokens per segment, K/M suffixes (default 256)\n"
     "      --outlier-factor K  outlier threshold in segment RMS, 1..1e6 (default 6)\n"
     "      --top N             channels for top_energy, 1..head_dim (default 8)\n",
     cmd_segments},
    {"spectrum", "[options] FILE", "eigenvalue energy of segment covariances (TSV)",
     "Eigenvalues of X^T X of each segment of S tokens (default: the whole context).\n"
     "One row per layer, KV head, tensor and segment: layer, head, tensor, segment,\n"
     "start, tokens, energy (sum of eigenvalues = sum of x^2), lambda1_share, and for\n"
     "each energy share E a column dE: the fewest rotated channels whose eigenvalues\n"
     "hold at least E of the energy. With --full one row per eigenvalue instead:\n"
     "layer, head, tensor, segment, start, tokens, index, eigenvalue, share, cumulative.\n",
     "      --segment S         tokens per segment, K/M suffixes (default 0: whole context)\n"
     "      --energy E,...      energy shares, each in (0, 1] (default 0.9,0.95,0.99)\n"
     "      --full              print every eigenvalue (long table)\n",
     cmd_spectrum},
    {"sparsity", "[options] FILE", "attention mass captured by the top tokens (TSV)",
     "For each captured query (at position p: attends to tokens 0..p, softmax of\n"
     "q.k/sqrt(head_dim); query head h reads KV head h / (n_heads / n_kv_heads)):\n"
     "the attention mass of its ceil(f * (p + 1)) most attended tokens, for each\n"
     "fraction f. One row per layer and query head: layer, head, kv_head, queries,\n"
     "then topF_mean and topF_min (F = 100 f) over the queries.\n",
     "      --fractions F,...   token fractions, each in (0, 1] (default 0.01,0.05,0.1,0.25)\n",
     cmd_sparsity},
    {"channels", "[options] FILE", "ThinK key-channel importance per KV head (TSV)",
     "Score of key channel j of a KV head: || Q[:,j] K[:,j]^T ||_F over the dump's\n"
     "queries Q of the head's query group and all its keys K (= ||Q[:,j]|| ||K[:,j]||).\n"
     "One row per layer and KV head: layer, head, queries, keys, top_channels (the N\n"
     "best channels, best first, comma-separated) and share_topP: the share of the\n"
     "total score in the round(P/100 * head_dim) best channels. With --full one row\n"
     "per channel: layer, head, channel, rank (1 = best), score, share.\n",
     "      --top N             channels listed, 1..head_dim (default 8)\n"
     "      --shares P,...      channel shares, each in (0, 1] (default 0.25,0.5)\n"
     "      --full              one row per channel\n",
     cmd_channels},
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

static void command_usage(const command *cmd, FILE *fp, int status)
{
    fprintf(fp, "Usage: %s %s %s\n\n%s\n", mkv_progname(), cmd->name, cmd->operands,
            cmd->details);
    if (cmd->options)
        fprintf(fp, "Options:\n%s\n", cmd->options);
    mkv_common_usage(fp, 0);
    exit(status);
}

/* One-line misuse message for a command, then exit 2. */
static void command_misuse(const command *cmd, const char *what)
{
    mkv_usage_error("%s; try '%s %s --help'", what, mkv_progname(), cmd->name);
    exit(2);
}

/* A rejected option is a usage error, in the user's own spelling. */
static void bad_option(const command *cmd, int opt, char **argv, const char *shortopts)
{
    char what[300];
    mkv_describe_bad_option(opt, argv, shortopts, what, sizeof what);
    command_misuse(cmd, what);
}

/* getopt_long over a command's arguments (argv[0] is the command name).
 * Handles the common options, -h, --version and every misuse; returns the
 * command's own options one by one, -1 when done. */
static int next_option(const command *cmd, int argc, char **argv, const char *shortopts,
                       const struct option *longopts, mkv_common_opts *common)
{
    for (;;) {
        int opt = getopt_long(argc, argv, shortopts, longopts, NULL);
        switch (opt) {
        case -1:
            return -1;
        case 'h':
            command_usage(cmd, stdout, 0);
            break;
        case MKV_OPT_VERSION:
            mkv_print_version(stdout);
            exit(0);
        case '?':
        case ':':
            bad_option(cmd, opt, argv, shortopts);
            break;
        default: {
            int handled = mkv_common_option(common, opt, optarg);
            if (handled < 0)
                exit(2);
            if (!handled)
                return opt;
        }
        }
    }
}

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS

/* Option loop of a command that has only the common options. */
static void common_options_only(const command *cmd, int argc, char **argv, mkv_common_opts *common)
{
    static const struct option longopts[] = {MKV_COMMON_LONGOPTS, {NULL, 0, NULL, 0}};
    mkv_common_init(common);
    while (next_option(cmd, argc, argv, SHORTOPTS, longopts, common) != -1)
        continue;
}

/* ------------------------------------------------------------ check */

/* ctx: the file's label */
static void print_problem(void *ctx, const char *problem)
{
    printf("%s: %s\n", (const char *)ctx, problem);
}

static int cmd_check(const command *cmd, int argc, char **argv)
{
    mkv_common_opts common;
    common_options_only(cmd, argc, argv, &common);
    if (optind >= argc)
        command_misuse(cmd, "missing FILE");

    int status = 0;
    for (int i = optind; i < argc; i++) {
        /* the label the library gives stdin in its own messages */
        const char *label = strcmp(argv[i], "-") == 0 ? "(stdin)" : argv[i];
        mkv_error err;
        mkv_error_clear(&err);
        int n = mkv_dump_validate(argv[i], print_problem, (void *)label, &err);
        if (n < 0) {
            mkv_report(&err);
            status = 1;
        } else if (n > 0) {
            status = 1;
        } else if (common.verbosity > MKV_LOG_ERROR) {
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

/* The operand of a command that takes exactly one FILE. */
static const char *single_file(const command *cmd, int argc, char **argv)
{
    if (optind >= argc)
        command_misuse(cmd, "missing FILE");
    if (argc - optind > 1) {
        char what[300];
        snprintf(what, sizeof what, "too many operands ('%s' after FILE)", argv[optind + 1]);
        command_misuse(cmd, what);
    }
    return argv[optind];
}

static int cmd_info(const command *cmd, int argc, char **argv)
{
    mkv_common_opts common;
    common_options_only(cmd, argc, argv, &common);
    const char *path = single_file(cmd, argc, argv);

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
     * are quoted against (DESIGN.md section 7). */
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

/* ------------------------------------------------------------ stats */

enum { OPT_OUTLIER_FACTOR = MKV_OPT_FIRST_TOOL };

typedef struct {
    int layer, head;
    char kind;
    mkv_tensor_summary s;
} stats_row;

static int cmd_stats(const command *cmd, int argc, char **argv)
{
    static const struct option longopts[] = {
        MKV_COMMON_LONGOPTS,
        {"outlier-factor", required_argument, NULL, OPT_OUTLIER_FACTOR},
        {NULL, 0, NULL, 0}};
    mkv_common_opts common;
    mkv_common_init(&common);
    double factor = MKV_OUTLIER_FACTOR_DEFAULT;
    int opt;
    while ((opt = next_option(cmd, argc, argv, SHORTOPTS, longopts, &common)) != -1) {
        if (opt == OPT_OUTLIER_FACTOR &&
            mkv_parse_double(optarg, "outlier-factor", 1.0, 1e6, &factor))
            exit(2);
    }
    const char *path = single_file(cmd, argc, argv);

    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    if (mkv_dump_open(path, &d, &err) != MKV_OK) {
        mkv_report(&err);
        return mkv_exit_code(err.code);
    }
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    /* Rows are kept until every tensor has been read: a NaN in the last
     * layer must not leave a partial table behind. */
    size_t n_rows = (size_t)m->n_layers * (size_t)m->n_kv_heads * 2;
    stats_row *rows = calloc(n_rows, sizeof *rows);
    mkv_tensor_stats acc;
    int rc = rows ? mkv_tensor_stats_init(&acc, m->head_dim, &err)
                  : mkv_fail(&err, MKV_ENOMEM, "out of memory for %zu rows of statistics", n_rows);
    if (rc != MKV_OK) {
        mkv_report(&err);
        free(rows);
        mkv_dump_close(d);
        return mkv_exit_code(rc);
    }

    mkv_progress progress;
    mkv_progress_start(&progress, "stats", (int64_t)n_rows);
    size_t r = 0;
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int head = 0; head < m->n_kv_heads && rc == MKV_OK; head++)
            for (int k = 0; k < 2 && rc == MKV_OK; k++) {
                char kind = k ? 'v' : 'k';
                rc = mkv_dump_tensor_stats(d, layer, kind, head, &acc, &err);
                if (rc != MKV_OK)
                    break;
                rows[r].layer = layer;
                rows[r].head = head;
                rows[r].kind = kind;
                mkv_tensor_stats_summarize(&acc, factor, &rows[r].s);
                mkv_progress_update(&progress, (int64_t)++r);
            }
    mkv_progress_finish(&progress);

    if (rc == MKV_OK) {
        printf("layer\thead\ttensor\ttokens\tmean\tstd\tabsmax\t"
               "rms_median\trms_max\toutlier_channels\n");
        for (size_t i = 0; i < n_rows; i++) {
            const mkv_tensor_summary *s = &rows[i].s;
            printf("%d\t%d\t%c\t%" PRId64 "\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t%d\n", rows[i].layer,
                   rows[i].head, rows[i].kind, s->n_tokens, s->mean, s->std, s->absmax,
                   s->rms_median, s->rms_max, s->outlier_channels);
        }
        if (fflush(stdout) != 0 || ferror(stdout))
            rc = mkv_fail(&err, MKV_EIO, "cannot write the table to stdout");
    }
    if (rc != MKV_OK)
        mkv_report(&err);
    mkv_tensor_stats_free(&acc);
    free(rows);
    mkv_dump_close(d);
    return mkv_exit_code(rc);
}

/* ------------------------------------------------------------ analyses */

enum {
    OPT_KEEP = MKV_OPT_FIRST_TOOL + 1,
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

/* "25" for 0.25, "0.5" for 0.005: the percentage in column names. */
static const char *percent(double share, char *buf, size_t size)
{
    snprintf(buf, size, "%g", share * 100.0);
    return buf;
}

/* A table is printed to memory first: an error in the last head must not
 * leave a partial table on stdout. */
typedef struct {
    FILE *fp;
    char *buf;
    size_t len;
} table;

static int table_open(table *t, mkv_error *err)
{
    t->buf = NULL;
    t->len = 0;
    t->fp = open_memstream(&t->buf, &t->len);
    return t->fp ? MKV_OK : mkv_fail_errno(err, MKV_ENOMEM, errno, "cannot buffer the table");
}

/* Print the table when rc is MKV_OK, free it in any case; returns rc or
 * the error of printing. */
static int table_close(table *t, int rc, mkv_error *err)
{
    if (!t->fp)
        return rc;
    int bad = ferror(t->fp);
    if (fclose(t->fp) != 0 || bad)
        rc = rc != MKV_OK ? rc : mkv_fail(err, MKV_ENOMEM, "out of memory for the table");
    if (rc == MKV_OK &&
        (fwrite(t->buf, 1, t->len, stdout) != t->len || fflush(stdout) != 0 || ferror(stdout)))
        rc = mkv_fail(err, MKV_EIO, "cannot write the table to stdout");
    free(t->buf);
    t->fp = NULL;
    return rc;
}

/* Report an error (if any), close the dump, give the exit status. */
static int finish(int rc, mkv_error *err, mkv_dump *d)
{
    if (rc != MKV_OK)
        mkv_report(err);
    if (d)
        mkv_dump_close(d);
    return mkv_exit_code(rc);
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

/* ------------------------------------------------------------ overlap */

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

static int cmd_overlap(const command *cmd, int argc, char **argv)
{
    static const struct option longopts[] = {
        MKV_COMMON_LONGOPTS,
        {"keep", required_argument, NULL, OPT_KEEP},
        {"lengths", required_argument, NULL, OPT_LENGTHS},
        {"prefix", no_argument, NULL, OPT_PREFIX},
        {NULL, 0, NULL, 0}};
    mkv_common_opts common;
    mkv_common_init(&common);
    double keep = 0.25;
    int64_t lengths[MAX_LIST];
    int n_lengths = 0, prefix = 0, opt;
    while ((opt = next_option(cmd, argc, argv, SHORTOPTS, longopts, &common)) != -1) {
        if (opt == OPT_KEEP)
            keep = parse_share(optarg, "keep");
        else if (opt == OPT_LENGTHS)
            n_lengths = parse_list(optarg, "lengths", size_item, lengths);
        else if (opt == OPT_PREFIX)
            prefix = 1;
    }
    const char *path = single_file(cmd, argc, argv);

    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, &err);
    if (rc != MKV_OK)
        return finish(rc, &err, d);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens;
    const int hd = m->head_dim;
    if (n_lengths == 0) {
        lengths[n_lengths++] = T < 256 ? T : 256;
        while (n_lengths < MAX_LIST && lengths[n_lengths - 1] * 4 <= T)
            lengths[n_lengths] = lengths[n_lengths - 1] * 4, n_lengths++;
    }
    int64_t longest = 0;
    for (int i = 0; i < n_lengths && rc == MKV_OK; i++) {
        if (lengths[i] > T)
            rc = mkv_fail(&err, MKV_EUSAGE, "--lengths %lld is longer than the context of '%s' "
                          "(%lld tokens)", (long long)lengths[i], path, (long long)T);
        longest = lengths[i] > longest ? lengths[i] : longest;
    }
    const int m_keep = mkv_keep_count(keep, hd);

    float *X = NULL;
    double *ov = NULL;
    table t = {0};
    if (rc == MKV_OK) {
        X = mkv_alloc((size_t)T * (size_t)hd, sizeof *X, "one head's vectors", &err);
        ov = X ? mkv_alloc((size_t)longest, sizeof *ov, "per-vector overlaps", &err) : NULL;
        rc = ov ? MKV_OK : (int)err.code;
    }
    if (rc == MKV_OK)
        rc = table_open(&t, &err);
    if (rc == MKV_OK)
        fprintf(t.fp, "layer\thead\ttensor\tlength\trotated\twindows\toverlap_mean\toverlap_min\t"
                      "window_min\twindow_max\n");

    mkv_progress progress;
    mkv_progress_start(&progress, "overlap", (int64_t)m->n_layers * m->n_kv_heads * 2);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int head = 0; head < m->n_kv_heads && rc == MKV_OK; head++)
            for (int k = 0; k < 2 && rc == MKV_OK; k++) {
                char kind = k ? 'v' : 'k';
                rc = mkv_dump_read_finite(d, layer, kind, head, 1, 0, T, X, &err);
                for (int li = 0; li < n_lengths && rc == MKV_OK; li++) {
                    const int64_t L = lengths[li], windows = prefix ? 1 : T / L;
                    for (int rotated = 0; rotated < 2 && rc == MKV_OK; rotated++) {
                        overlap_summary o;
                        rc = overlap_windows(X, windows, L, hd, m_keep, rotated, ov, &o, &err);
                        if (rc == MKV_OK)
                            fprintf(t.fp, "%d\t%d\t%c\t%lld\t%d\t%lld\t%.9g\t%.9g\t%.9g\t%.9g\n",
                                    layer, head, kind, (long long)L, rotated, (long long)windows,
                                    o.mean, o.vec_min, o.win_min, o.win_max);
                    }
                }
                mkv_progress_update(&progress, ((int64_t)layer * m->n_kv_heads + head) * 2 + k + 1);
            }
    mkv_progress_finish(&progress);
    rc = table_close(&t, rc, &err);
    mkv_free(X);
    mkv_free(ov);
    return finish(rc, &err, d);
}

/* ------------------------------------------------------------ segments */

static int cmd_segments(const command *cmd, int argc, char **argv)
{
    static const struct option longopts[] = {
        MKV_COMMON_LONGOPTS,
        {"segment", required_argument, NULL, OPT_SEGMENT},
        {"outlier-factor", required_argument, NULL, OPT_OUTLIER_FACTOR},
        {"top", required_argument, NULL, OPT_TOP},
        {NULL, 0, NULL, 0}};
    mkv_common_opts common;
    mkv_common_init(&common);
    int64_t S = 256;
    double factor = 6.0;
    long top = 8;
    int opt;
    while ((opt = next_option(cmd, argc, argv, SHORTOPTS, longopts, &common)) != -1) {
        if ((opt == OPT_SEGMENT && mkv_parse_size(optarg, "segment", 1, INT64_C(1) << 40, &S)) ||
            (opt == OPT_OUTLIER_FACTOR &&
             mkv_parse_double(optarg, "outlier-factor", 1.0, 1e6, &factor)) ||
            (opt == OPT_TOP && mkv_parse_int(optarg, "top", 1, 65536, &top)))
            exit(2);
    }
    const char *path = single_file(cmd, argc, argv);

    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, &err);
    if (rc != MKV_OK)
        return finish(rc, &err, d);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens;
    const int hd = m->head_dim;
    const int64_t seg = S < T ? S : T;
    rc = check_top(top, m, &err);

    float *X = NULL;
    int *channels = NULL;
    table t = {0};
    if (rc == MKV_OK) {
        X = mkv_alloc((size_t)seg * (size_t)hd, sizeof *X, "a segment", &err);
        channels = X ? mkv_alloc((size_t)top, sizeof *channels, "channel indices", &err) : NULL;
        rc = channels ? MKV_OK : (int)err.code;
    }
    if (rc == MKV_OK)
        rc = table_open(&t, &err);
    if (rc == MKV_OK)
        fprintf(t.fp, "layer\thead\ttensor\tsegment\tstart\ttokens\trms\tmag_var\tkurtosis\t"
                      "outlier_share\ttop_energy\ttop_channels\n");

    mkv_progress progress;
    mkv_progress_start(&progress, "segments", (int64_t)m->n_layers * m->n_kv_heads * 2);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int head = 0; head < m->n_kv_heads && rc == MKV_OK; head++)
            for (int k = 0; k < 2 && rc == MKV_OK; k++) {
                char kind = k ? 'v' : 'k';
                for (int64_t s0 = 0, i = 0; s0 < T && rc == MKV_OK; s0 += seg, i++) {
                    int64_t n = T - s0 < seg ? T - s0 : seg;
                    mkv_segment_summary sum;
                    rc = mkv_dump_read_finite(d, layer, kind, head, 1, s0, n, X, &err);
                    if (rc == MKV_OK)
                        rc = mkv_segment_stats(X, n, hd, factor, (int)top, &sum, channels, &err);
                    if (rc != MKV_OK)
                        break;
                    fprintf(t.fp, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t",
                            layer, head, kind, (long long)i, (long long)s0, (long long)n, sum.rms,
                            sum.mag_var, sum.kurtosis, sum.outlier_share, sum.top_energy);
                    for (int c = 0; c < top; c++)
                        fprintf(t.fp, "%d%c", channels[c], c + 1 < top ? ',' : '\n');
                }
                mkv_progress_update(&progress, ((int64_t)layer * m->n_kv_heads + head) * 2 + k + 1);
            }
    mkv_progress_finish(&progress);
    rc = table_close(&t, rc, &err);
    mkv_free(X);
    mkv_free(channels);
    return finish(rc, &err, d);
}

/* ------------------------------------------------------------ spectrum */

static int cmd_spectrum(const command *cmd, int argc, char **argv)
{
    static const struct option longopts[] = {
        MKV_COMMON_LONGOPTS,
        {"segment", required_argument, NULL, OPT_SEGMENT},
        {"energy", required_argument, NULL, OPT_ENERGY},
        {"full", no_argument, NULL, OPT_FULL},
        {NULL, 0, NULL, 0}};
    mkv_common_opts common;
    mkv_common_init(&common);
    int64_t S = 0;
    double energy[MAX_LIST] = {0.9, 0.95, 0.99};
    int n_energy = 3, full = 0, opt;
    while ((opt = next_option(cmd, argc, argv, SHORTOPTS, longopts, &common)) != -1) {
        if (opt == OPT_SEGMENT && mkv_parse_size(optarg, "segment", 0, INT64_C(1) << 40, &S))
            exit(2);
        if (opt == OPT_ENERGY)
            n_energy = parse_list(optarg, "energy", share_item, energy);
        if (opt == OPT_FULL)
            full = 1;
    }
    const char *path = single_file(cmd, argc, argv);

    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, &err);
    if (rc != MKV_OK)
        return finish(rc, &err, d);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens;
    const int hd = m->head_dim;
    const int64_t seg = S == 0 || S > T ? T : S;

    float *X = mkv_alloc((size_t)seg * (size_t)hd, sizeof *X, "a segment", &err);
    double *evals = X ? mkv_alloc((size_t)hd, sizeof *evals, "eigenvalues", &err) : NULL;
    table t = {0};
    rc = evals ? table_open(&t, &err) : (int)err.code;
    if (rc == MKV_OK && full) {
        fprintf(t.fp, "layer\thead\ttensor\tsegment\tstart\ttokens\tindex\teigenvalue\tshare\t"
                      "cumulative\n");
    } else if (rc == MKV_OK) {
        char pct[32];
        fprintf(t.fp, "layer\thead\ttensor\tsegment\tstart\ttokens\tenergy\tlambda1_share");
        for (int e = 0; e < n_energy; e++)
            fprintf(t.fp, "\td%s", percent(energy[e], pct, sizeof pct));
        fputc('\n', t.fp);
    }

    mkv_progress progress;
    mkv_progress_start(&progress, "spectrum", (int64_t)m->n_layers * m->n_kv_heads * 2);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int head = 0; head < m->n_kv_heads && rc == MKV_OK; head++)
            for (int k = 0; k < 2 && rc == MKV_OK; k++) {
                char kind = k ? 'v' : 'k';
                for (int64_t s0 = 0, i = 0; s0 < T && rc == MKV_OK; s0 += seg, i++) {
                    int64_t n = T - s0 < seg ? T - s0 : seg;
                    rc = mkv_dump_read_finite(d, layer, kind, head, 1, s0, n, X, &err);
                    if (rc == MKV_OK)
                        rc = mkv_spectrum(X, n, hd, evals, &err);
                    if (rc != MKV_OK)
                        break;
                    double total = 0.0;
                    for (int j = 0; j < hd; j++)
                        total += evals[j];
                    double share = total > 0.0 ? 1.0 / total : 0.0;
                    if (full) {
                        double cum = 0.0;
                        for (int j = 0; j < hd; j++) {
                            cum += evals[j];
                            fprintf(t.fp, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%d\t%.9g\t%.9g\t%.9g\n",
                                    layer, head, kind, (long long)i, (long long)s0, (long long)n,
                                    j, evals[j], evals[j] * share, cum * share);
                        }
                        continue;
                    }
                    fprintf(t.fp, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%.9g\t%.9g", layer, head, kind,
                            (long long)i, (long long)s0, (long long)n, total, evals[0] * share);
                    for (int e = 0; e < n_energy; e++)
                        fprintf(t.fp, "\t%d", mkv_energy_rank(evals, hd, energy[e]));
                    fputc('\n', t.fp);
                }
                mkv_progress_update(&progress, ((int64_t)layer * m->n_kv_heads + head) * 2 + k + 1);
            }
    mkv_progress_finish(&progress);
    rc = table_close(&t, rc, &err);
    mkv_free(X);
    mkv_free(evals);
    return finish(rc, &err, d);
}

/* ------------------------------------------------------------ sparsity */

static int cmd_sparsity(const command *cmd, int argc, char **argv)
{
    static const struct option longopts[] = {
        MKV_COMMON_LONGOPTS,
        {"fractions", required_argument, NULL, OPT_FRACTIONS},
        {NULL, 0, NULL, 0}};
    mkv_common_opts common;
    mkv_common_init(&common);
    double fractions[MAX_LIST] = {0.01, 0.05, 0.1, 0.25};
    int n_fractions = 4, opt;
    while ((opt = next_option(cmd, argc, argv, SHORTOPTS, longopts, &common)) != -1)
        if (opt == OPT_FRACTIONS)
            n_fractions = parse_list(optarg, "fractions", share_item, fractions);
    const char *path = single_file(cmd, argc, argv);

    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, &err);
    if (rc != MKV_OK)
        return finish(rc, &err, d);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads;

    int32_t *pos = read_query_positions(d, &err);
    int64_t keys = 0;   /* keys the latest query sees */
    for (int64_t w = 0; pos && w < W; w++)
        keys = pos[w] + 1 > keys ? pos[w] + 1 : keys;
    float *K = pos ? mkv_alloc((size_t)keys * (size_t)hd, sizeof *K, "one head's keys", &err) : NULL;
    float *Q = K ? mkv_alloc((size_t)G * (size_t)W * (size_t)hd, sizeof *Q, "queries", &err) : NULL;
    double *scratch = Q ? mkv_alloc((size_t)keys, sizeof *scratch, "attention weights", &err) : NULL;
    double *stats = scratch ? mkv_alloc(3 * (size_t)n_fractions, sizeof *stats, "sums", &err) : NULL;
    table t = {0};
    rc = stats ? table_open(&t, &err) : (int)err.code;
    if (rc == MKV_OK) {
        char pct[32];
        fprintf(t.fp, "layer\thead\tkv_head\tqueries");
        for (int f = 0; f < n_fractions; f++) {
            percent(fractions[f], pct, sizeof pct);
            fprintf(t.fp, "\ttop%s_mean\ttop%s_min", pct, pct);
        }
        fputc('\n', t.fp);
    }

    mkv_progress progress;
    mkv_progress_start(&progress, "sparsity", (int64_t)m->n_layers * m->n_kv_heads);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int kv = 0; kv < m->n_kv_heads && rc == MKV_OK; kv++) {
            rc = mkv_dump_read_finite(d, layer, 'k', kv, 1, 0, keys, K, &err);
            if (rc == MKV_OK)
                rc = mkv_dump_read_finite(d, layer, 'q', kv * G, G, 0, W, Q, &err);
            for (int g = 0; g < G && rc == MKV_OK; g++) {
                double *sum = stats, *min = stats + n_fractions, *mass = stats + 2 * n_fractions;
                for (int f = 0; f < n_fractions; f++)
                    sum[f] = 0.0, min[f] = 1.0;
                for (int64_t w = 0; w < W; w++) {
                    mkv_topk_mass(Q + ((size_t)g * W + w) * hd, K, pos[w] + 1, hd, fractions,
                                  n_fractions, mass, scratch);
                    for (int f = 0; f < n_fractions; f++) {
                        sum[f] += mass[f];
                        min[f] = mass[f] < min[f] ? mass[f] : min[f];
                    }
                }
                fprintf(t.fp, "%d\t%d\t%d\t%lld", layer, kv * G + g, kv, (long long)W);
                for (int f = 0; f < n_fractions; f++)
                    fprintf(t.fp, "\t%.9g\t%.9g", sum[f] / (double)W, min[f]);
                fputc('\n', t.fp);
            }
            mkv_progress_update(&progress, (int64_t)layer * m->n_kv_heads + kv + 1);
        }
    mkv_progress_finish(&progress);
    rc = table_close(&t, rc, &err);
    mkv_free(pos);
    mkv_free(K);
    mkv_free(Q);
    mkv_free(scratch);
    mkv_free(stats);
    return finish(rc, &err, d);
}

/* ------------------------------------------------------------ channels */

/* Tokens read per call when summing the keys' channel energies. */
#define CHANNEL_CHUNK_TOKENS 4096

static int cmd_channels(const command *cmd, int argc, char **argv)
{
    static const struct option longopts[] = {
        MKV_COMMON_LONGOPTS,
        {"top", required_argument, NULL, OPT_TOP},
        {"shares", required_argument, NULL, OPT_SHARES},
        {"full", no_argument, NULL, OPT_FULL},
        {NULL, 0, NULL, 0}};
    mkv_common_opts common;
    mkv_common_init(&common);
    long top = 8;
    double shares[MAX_LIST] = {0.25, 0.5};
    int n_shares = 2, full = 0, opt;
    while ((opt = next_option(cmd, argc, argv, SHORTOPTS, longopts, &common)) != -1) {
        if (opt == OPT_TOP && mkv_parse_int(optarg, "top", 1, 65536, &top))
            exit(2);
        if (opt == OPT_SHARES)
            n_shares = parse_list(optarg, "shares", share_item, shares);
        if (opt == OPT_FULL)
            full = 1;
    }
    const char *path = single_file(cmd, argc, argv);

    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, &err);
    if (rc != MKV_OK)
        return finish(rc, &err, d);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens, W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads;
    const int64_t chunk = T < CHANNEL_CHUNK_TOKENS ? T : CHANNEL_CHUNK_TOKENS;
    rc = check_top(top, m, &err);

    if (rc == MKV_OK && W == 0)
        rc = mkv_fail(&err, MKV_EFORMAT, "'%s' has no queries (W = 0)", mkv_dump_path(d));
    float *K = rc == MKV_OK ? mkv_alloc((size_t)chunk * hd, sizeof *K, "a chunk of keys", &err)
                            : NULL;
    float *Q = K ? mkv_alloc((size_t)G * (size_t)W * (size_t)hd, sizeof *Q, "queries", &err) : NULL;
    /* q and k channel sums of squares, scores, top_share scratch */
    double *work = Q ? mkv_alloc(4 * (size_t)hd, sizeof *work, "channel scores", &err) : NULL;
    int *order = work ? mkv_alloc((size_t)hd, sizeof *order, "channel ranks", &err) : NULL;
    table t = {0};
    if (rc == MKV_OK)
        rc = order ? table_open(&t, &err) : (int)err.code;
    if (rc == MKV_OK && full) {
        fprintf(t.fp, "layer\thead\tchannel\trank\tscore\tshare\n");
    } else if (rc == MKV_OK) {
        char pct[32];
        fprintf(t.fp, "layer\thead\tqueries\tkeys\ttop_channels");
        for (int s = 0; s < n_shares; s++)
            fprintf(t.fp, "\tshare_top%s", percent(shares[s], pct, sizeof pct));
        fputc('\n', t.fp);
    }

    mkv_progress progress;
    mkv_progress_start(&progress, "channels", (int64_t)m->n_layers * m->n_kv_heads);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int kv = 0; kv < m->n_kv_heads && rc == MKV_OK; kv++) {
            double *qsq = work, *ksq = work + hd, *score = work + 2 * hd, *scratch = work + 3 * hd;
            memset(work, 0, 2 * (size_t)hd * sizeof *work);
            for (int64_t t0 = 0; t0 < T && rc == MKV_OK; t0 += chunk) {
                int64_t n = T - t0 < chunk ? T - t0 : chunk;
                rc = mkv_dump_read_finite(d, layer, 'k', kv, 1, t0, n, K, &err);
                if (rc == MKV_OK)
                    mkv_channel_sumsq_add(ksq, K, n, hd);
            }
            if (rc == MKV_OK)
                rc = mkv_dump_read_finite(d, layer, 'q', kv * G, G, 0, W, Q, &err);
            if (rc != MKV_OK)
                break;
            mkv_channel_sumsq_add(qsq, Q, (int64_t)G * W, hd);
            mkv_channel_scores(qsq, ksq, hd, score);
            if (full) {
                double total = 0.0;
                for (int j = 0; j < hd; j++)
                    total += score[j];
                mkv_top_indices(score, hd, hd, order);
                for (int r = 0; r < hd; r++)
                    fprintf(t.fp, "%d\t%d\t%d\t%d\t%.9g\t%.9g\n", layer, kv, order[r], r + 1,
                            score[order[r]], total > 0.0 ? score[order[r]] / total : 0.0);
            } else {
                mkv_top_indices(score, hd, (int)top, order);
                fprintf(t.fp, "%d\t%d\t%lld\t%lld\t", layer, kv, (long long)G * W, (long long)T);
                for (int c = 0; c < top; c++)
                    fprintf(t.fp, "%d%s", order[c], c + 1 < top ? "," : "");
                for (int s = 0; s < n_shares; s++)
                    fprintf(t.fp, "\t%.9g",
                            mkv_top_share(score, hd, mkv_keep_count(shares[s], hd), scratch));
                fputc('\n', t.fp);
            }
            mkv_progress_update(&progress, (int64_t)layer * m->n_kv_heads + kv + 1);
        }
    mkv_progress_finish(&progress);
    rc = table_close(&t, rc, &err);
    mkv_free(K);
    mkv_free(Q);
    mkv_free(work);
    mkv_free(order);
    return finish(rc, &err, d);
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
            opterr = 0;   /* bad_option prints the one-line message */
            return commands[i].run(&commands[i], argc - 1, argv + 1);
        }
    if (name[0] == '-')
        mkv_usage_error("expected a command before '%s'; try '%s --help'", name, mkv_progname());
    else
        mkv_usage_error("unknown command '%s'; try '%s --help'", name, mkv_progname());
    return 2;
}
