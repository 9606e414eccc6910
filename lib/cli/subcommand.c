/* The option loop and operands of a subcommand. */
#include "config.h"
#include "cli/subcommand.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS

/* The common short options followed by the command's own. */
static void build_shortopts(const mkv_subcommand *cmd, char *all, size_t size)
{
    int n = snprintf(all, size, "%s%s", SHORTOPTS, cmd->shortopts ? cmd->shortopts : "");
    if (n < 0 || (size_t)n >= size)
        mkv_subcommand_misuse(cmd, "internal error: too many short options");
}

void mkv_subcommand_usage(const mkv_subcommand *cmd, FILE *fp, int status)
{
    fprintf(fp, "Usage: %s %s %s\n\n%s\n", mkv_progname(), cmd->name, cmd->operands,
            cmd->details);
    if (cmd->options)
        fprintf(fp, "Options:\n%s\n", cmd->options);
    mkv_common_usage(fp, 0);
    exit(status);
}

void mkv_subcommand_misuse(const mkv_subcommand *cmd, const char *what)
{
    mkv_usage_error("%s; try '%s %s --help'", what, mkv_progname(), cmd->name);
    exit(2);
}

static const struct option common_longopts[] = {MKV_COMMON_LONGOPTS};
#define N_COMMON_LONGOPTS (sizeof common_longopts / sizeof common_longopts[0])

/* The common long options followed by the command's own. */
static void build_longopts(const mkv_subcommand *cmd, struct option *all)
{
    size_t n = N_COMMON_LONGOPTS;
    memcpy(all, common_longopts, sizeof common_longopts);
    for (size_t i = 0; cmd->longopts && cmd->longopts[i].name; i++) {
        if (i == MKV_SUBCOMMAND_MAX_OPTIONS)
            mkv_subcommand_misuse(cmd, "internal error: too many options");
        all[n++] = cmd->longopts[i];
    }
    memset(&all[n], 0, sizeof all[n]);
}

int mkv_subcommand_run(const mkv_subcommand *cmd, int argc, char **argv)
{
    struct option longopts[N_COMMON_LONGOPTS + MKV_SUBCOMMAND_MAX_OPTIONS + 1];
    build_longopts(cmd, longopts);
    char shortopts[64];
    build_shortopts(cmd, shortopts, sizeof shortopts);
    mkv_common_opts common;
    mkv_common_init(&common);
    opterr = 0;   /* a rejected option gets the one-line message below */
    int opt;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            mkv_subcommand_usage(cmd, stdout, 0);
        case MKV_OPT_VERSION:
            mkv_print_version(stdout);
            exit(0);
        case '?':
        case ':': {
            char what[300];
            mkv_describe_bad_option(opt, argv, shortopts, what, sizeof what);
            mkv_subcommand_misuse(cmd, what);
        }
        default: {
            int handled = mkv_common_option(&common, opt, optarg);
            if (handled < 0)
                exit(2);
            if (!handled)
                cmd->option(cmd->conf, opt, optarg);
        }
        }
    }
    if (optind >= argc)
        mkv_subcommand_misuse(cmd, "missing FILE");
    if (!cmd->many_files && argc - optind > 1) {
        char what[300];
        snprintf(what, sizeof what, "too many operands ('%s' after FILE)", argv[optind + 1]);
        mkv_subcommand_misuse(cmd, what);
    }
    if (!cmd->table)
        return cmd->run(cmd, &common, argc - optind, argv + optind);
    mkv_error err;
    mkv_error_clear(&err);
    int rc = mkv_table_analysis_run(cmd->table, cmd->conf, argv[optind], &err);
    if (rc != MKV_OK)
        mkv_report(&err);
    return mkv_exit_code(rc);
}
