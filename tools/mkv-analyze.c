/* mkv-analyze: inspect KV dumps (validation, header, per-head statistics).
 *
 * Examples:
 *   mkv-analyze check kv.h5                     # "kv.h5: ok", or one line per problem, exit 1
 *   mkv-analyze check -q a.h5 b.h5               # only the problems
 *   mkv-capture --synthetic -o - | mkv-analyze check -
 *   mkv-analyze info kv.h5                      # shapes, dtype, tokens, bytes, source
 *   mkv-analyze info kvc.h5                     # method, parameters, source, physical bytes
 *   mkv-analyze strategies kvc.h5 -o seg.tsv    # mosaic's strategy and bytes per segment
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
 * its options and the parsing of their values into its settings, and either
 * a table of lib/analysis/tables.h (the library prints it: header, rows,
 * errors) or a function of its files (check and info, whose reports are
 * lib/io/report.h's; strategies, lib/cli/strategies.h's). Nothing here
 * computes or formats a result.
 */
#include "config.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/tables.h"
#include "cli/cli.h"
#include "cli/strategies.h"
#include "cli/subcommand.h"
#include "core/log.h"
#include "core/mkv.h"
#include "io/report.h"

/* ------------------------------------------------------------ check */

static int run_check(const mkv_subcommand *cmd, const mkv_common_opts *common, int n_files,
                     char **files)
{
    (void)cmd;
    int status = 0;
    for (int i = 0; i < n_files; i++) {
        mkv_error err;
        mkv_error_clear(&err);
        int n = mkv_dump_check_report(files[i], common->verbosity > MKV_LOG_ERROR, stdout, &err);
        if (n < 0)
            mkv_report(&err);
        status = n != 0 ? 1 : status;
        fflush(stdout);
    }
    return status;
}

/* ------------------------------------------------------------ info */

/* The exit status of a report, after saying what went wrong. */
static int report_status(int rc, const mkv_error *err)
{
    if (rc != MKV_OK)
        mkv_report(err);
    return mkv_exit_code(rc);
}

static int run_info(const mkv_subcommand *cmd, const mkv_common_opts *common, int n_files,
                    char **files)
{
    (void)cmd, (void)common, (void)n_files;
    mkv_error err;
    mkv_error_clear(&err);
    return report_status(mkv_dump_info_report(files[0], stdout, &err), &err);
}

/* ------------------------------------------------------------ strategies */

typedef struct {
    const char *output;         /* -o; NULL: stdout */
} strategies_settings;

static strategies_settings strategies_conf;

static const struct option strategies_longopts[] = {
    {"output", required_argument, NULL, 'o'},
    {NULL, 0, NULL, 0}};

static void strategies_option(void *conf, int opt, const char *arg)
{
    if (opt == 'o')
        ((strategies_settings *)conf)->output = arg;
}

static int run_strategies(const mkv_subcommand *cmd, const mkv_common_opts *common, int n_files,
                          char **files)
{
    (void)common, (void)n_files;
    const strategies_settings *cfg = cmd->conf;
    mkv_error err;
    mkv_error_clear(&err);
    return report_status(mkv_strategies_report(files[0], cfg->output, &err), &err);
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
 * an empty item or more than MKV_TABLE_LIST_MAX items. */
static int parse_list(const char *arg, const char *name,
                      void (*parse)(const char *item, const char *name, int i, void *ctx), void *ctx)
{
    int n = 0;
    for (const char *p = arg;; n++) {
        size_t len = strcspn(p, ",");
        char item[64];
        if (len == 0 || len >= sizeof item || n == MKV_TABLE_LIST_MAX) {
            mkv_usage_error("invalid value '%s' for --%s: expected a comma-separated list of "
                            "at most %d values", arg, name, MKV_TABLE_LIST_MAX);
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

/* ------------------------------------------------------------ stats */

static mkv_stats_settings stats_settings = {.factor = MKV_OUTLIER_FACTOR_DEFAULT};

static const struct option stats_longopts[] = {
    {"outlier-factor", required_argument, NULL, OPT_OUTLIER_FACTOR},
    {NULL, 0, NULL, 0}};

static void stats_option(void *conf, int opt, const char *arg)
{
    mkv_stats_settings *cfg = conf;
    if (opt == OPT_OUTLIER_FACTOR)
        parse_outlier_factor(arg, &cfg->factor);
}

/* ------------------------------------------------------------ overlap */

static mkv_overlap_settings overlap_settings = {.keep = 0.25};

static const struct option overlap_longopts[] = {
    {"keep", required_argument, NULL, OPT_KEEP},
    {"lengths", required_argument, NULL, OPT_LENGTHS},
    {"prefix", no_argument, NULL, OPT_PREFIX},
    {NULL, 0, NULL, 0}};

static void overlap_option(void *conf, int opt, const char *arg)
{
    mkv_overlap_settings *cfg = conf;
    if (opt == OPT_KEEP)
        cfg->keep = parse_share(arg, "keep");
    else if (opt == OPT_LENGTHS)
        cfg->n_lengths = parse_list(arg, "lengths", size_item, cfg->lengths);
    else if (opt == OPT_PREFIX)
        cfg->prefix = 1;
}

/* ------------------------------------------------------------ segments */

static mkv_segments_settings segments_settings = {.S = 256, .factor = 6.0, .top = 8};

static const struct option segments_longopts[] = {
    {"segment", required_argument, NULL, OPT_SEGMENT},
    {"outlier-factor", required_argument, NULL, OPT_OUTLIER_FACTOR},
    {"top", required_argument, NULL, OPT_TOP},
    {NULL, 0, NULL, 0}};

static void segments_option(void *conf, int opt, const char *arg)
{
    mkv_segments_settings *cfg = conf;
    if (opt == OPT_SEGMENT && mkv_parse_size(arg, "segment", 1, INT64_C(1) << 40, &cfg->S))
        exit(2);
    if (opt == OPT_OUTLIER_FACTOR)
        parse_outlier_factor(arg, &cfg->factor);
    if (opt == OPT_TOP)
        parse_top(arg, &cfg->top);
}

/* ------------------------------------------------------------ spectrum */

static mkv_spectrum_settings spectrum_settings = {.energy = {0.9, 0.95, 0.99}, .n_energy = 3};

static const struct option spectrum_longopts[] = {
    {"segment", required_argument, NULL, OPT_SEGMENT},
    {"energy", required_argument, NULL, OPT_ENERGY},
    {"full", no_argument, NULL, OPT_FULL},
    {NULL, 0, NULL, 0}};

static void spectrum_option(void *conf, int opt, const char *arg)
{
    mkv_spectrum_settings *cfg = conf;
    if (opt == OPT_SEGMENT && mkv_parse_size(arg, "segment", 0, INT64_C(1) << 40, &cfg->S))
        exit(2);
    if (opt == OPT_ENERGY)
        cfg->n_energy = parse_list(arg, "energy", share_item, cfg->energy);
    if (opt == OPT_FULL)
        cfg->full = 1;
}

/* ------------------------------------------------------------ sparsity */

static mkv_sparsity_settings sparsity_settings = {.fractions = {0.01, 0.05, 0.1, 0.25}, .n_fractions = 4};

static const struct option sparsity_longopts[] = {
    {"fractions", required_argument, NULL, OPT_FRACTIONS},
    {NULL, 0, NULL, 0}};

static void sparsity_option(void *conf, int opt, const char *arg)
{
    mkv_sparsity_settings *cfg = conf;
    if (opt == OPT_FRACTIONS)
        cfg->n_fractions = parse_list(arg, "fractions", share_item, cfg->fractions);
}

/* ------------------------------------------------------------ channels */

static mkv_channels_settings channels_settings = {.top = 8, .shares = {0.25, 0.5}, .n_shares = 2};

static const struct option channels_longopts[] = {
    {"top", required_argument, NULL, OPT_TOP},
    {"shares", required_argument, NULL, OPT_SHARES},
    {"full", no_argument, NULL, OPT_FULL},
    {NULL, 0, NULL, 0}};

static void channels_option(void *conf, int opt, const char *arg)
{
    mkv_channels_settings *cfg = conf;
    if (opt == OPT_TOP)
        parse_top(arg, &cfg->top);
    if (opt == OPT_SHARES)
        cfg->n_shares = parse_list(arg, "shares", share_item, cfg->shares);
    if (opt == OPT_FULL)
        cfg->full = 1;
}

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
            "Print \"key: value\" lines. A raw dump: format, model, source, shapes, dtype,\n"
            "tokens, queries, dense 16-bit K+V bytes, bytes stored (after deflate) and raw.\n"
            "A compressed dump: format, method and params as recorded, the source it was\n"
            "made from, model, shapes, tokens, queries, logical and physical bytes, ratio.\n",
        .run = run_info,
    },
    {
        .name = "strategies",
        .operands = "[-o OUT] [options] FILE",
        .summary = "per-segment strategies of a mosaic dump (TSV)",
        .details =
            "For a compressed dump of method mosaic or uniform2d (mkv-compress), one row per\n"
            "layer, KV head, tensor (k or v) and segment: layer, head, tensor, segment,\n"
            "start, length, rotate, r, g, dprime (d'), pervector, keydim and bound (block\n"
            "keys; 0 for v), the bytes the segment stores in values_bytes, bitmap_bytes,\n"
            "blockkey_bytes and rotation_bytes, their sum bytes, bytes_per_token, and the\n"
            "recorded energy_loss and output_loss (\"nan\": not measured).\n",
        .options =
            "  -o, --output OUT        write the table to OUT (default: standard output)\n",
        .shortopts = "o:",
        .longopts = strategies_longopts,
        .option = strategies_option,
        .conf = &strategies_conf,
        .run = run_strategies,
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
        .table = &mkv_stats_table,
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
        .table = &mkv_overlap_table,
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
        .table = &mkv_segments_table,
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
        .table = &mkv_spectrum_table,
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
        .table = &mkv_sparsity_table,
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
        .table = &mkv_channels_table,
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
                "Inspect KV dumps (mosaickv-dump v1, see mosaickv(5)) and what mkv-compress\n"
                "made of them. FILE '-' reads stdin.\n\n"
                "Commands:\n", mkv_progname());
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(fp, "  %-10s %s\n", commands[i].name, commands[i].summary);
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
