/* mkv-analyze: inspect KV dumps (validation, header, per-head statistics).
 *
 * Examples:
 *   mkv-analyze check kv.h5                     # "kv.h5: ok", or one line per problem, exit 1
 *   mkv-analyze check -q a.h5 b.h5               # only the problems
 *   mkv-capture --synthetic -o - | mkv-analyze check -
 *   mkv-analyze info kv.h5                      # shapes, dtype, tokens, bytes, source
 *   mkv-analyze stats kv.h5 > stats.tsv         # layer x kv-head x k|v table
 *   mkv-analyze stats --outlier-factor 6 kv.h5 | awk -F'\t' '$3 == "k" && $10 > 0'
 *
 * Each command is a function over the library; a new one (overlap,
 * segments, spectrum, ...) is one more row in `commands`.
 */
#include "config.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dump.h"
#include "log.h"
#include "mkv.h"
#include "stats.h"

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
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *fp, int status)
{
    if (status != 0) {
        fprintf(fp, "%s: expected a command (check, info or stats); try '%s --help'\n",
                mkv_progname(), mkv_progname());
        exit(status);
    }
    fprintf(fp, "Usage: %s COMMAND [options] FILE\n\n"
                "Inspect KV dumps (mosaickv-dump v1, see mosaickv(5)). FILE '-' reads stdin.\n\n"
                "Commands:\n", mkv_progname());
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(fp, "  %-7s %s\n", commands[i].name, commands[i].summary);
    fprintf(fp, "\n'%s COMMAND --help' describes a command's options.\n\n"
                "  -h, --help           show this help and exit\n"
                "      --version        show version and build features, then exit\n\n"
                "Examples:\n"
                "  %s check kv.h5\n"
                "  mkv-capture --synthetic -o - | %s info -\n"
                "  %s stats kv.h5 > stats.tsv\n",
            mkv_progname(), mkv_progname(), mkv_progname(), mkv_progname());
    exit(status);
}

static void command_usage(const command *cmd, FILE *fp, int status)
{
    fprintf(fp, "Usage: %s %s %s\n\n%s\n", mkv_progname(), cmd->name, cmd->operands,
            cmd->details);
    if (cmd->options)
        fprintf(fp, "Options:\n%s\n", cmd->options);
    fputs(MKV_COMMON_USAGE, fp);
    exit(status);
}

/* One-line misuse message for a command, then exit 2. */
static void command_misuse(const command *cmd, const char *what)
{
    mkv_usage_error("%s; try '%s %s --help'", what, mkv_progname(), cmd->name);
    exit(2);
}

/* Say which option getopt_long just rejected ('?' or ':'), as the user
 * wrote it. glibc leaves optopt 0 for an unknown long option and sets it
 * to the option's value for a long option given a value it does not take. */
static void bad_option(const command *cmd, int opt, char **argv, const char *shortopts)
{
    char what[300];
    const char *arg = argv[optind - 1];
    int name_len = (int)strcspn(arg, "=");
    int is_short = optopt > 0 && optopt < 0x100;
    if (opt == ':' && is_short)
        snprintf(what, sizeof what, "option '-%c' needs a value", optopt);
    else if (opt == ':')
        snprintf(what, sizeof what, "option '%s' needs a value", arg);
    else if (optopt == 0)
        snprintf(what, sizeof what, "unknown option '%.*s'", name_len, arg);
    else if (!is_short || strchr(shortopts, optopt))
        snprintf(what, sizeof what, "option '%.*s' takes no value", name_len, arg);
    else
        snprintf(what, sizeof what, "unknown option '-%c'", optopt);
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
