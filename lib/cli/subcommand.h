/* Tools made of subcommands (mkv-analyze check|info|stats|...): a table of
 * commands, each with its synopsis, help text and own options, and one
 * option loop that handles the common options, -h, --version, every misuse
 * and the FILE operands, so that a command is a small entry. */
#ifndef MKV_SUBCOMMAND_H
#define MKV_SUBCOMMAND_H

#include <getopt.h>
#include <stdio.h>
#include "analysis/table.h"
#include "cli/cli.h"

/* The most own options a command takes. */
#define MKV_SUBCOMMAND_MAX_OPTIONS 16

typedef struct mkv_subcommand mkv_subcommand;
struct mkv_subcommand {
    const char *name;
    const char *operands;   /* what follows "PROG NAME" in the synopsis */
    const char *summary;    /* one line for the command list */
    const char *details;    /* for the command's --help */
    const char *options;    /* the command's own options for --help, or NULL */
    /* The command's own short options in getopt's spelling ("o:"), or
     * NULL; each has its entry in longopts with the letter as its value. */
    const char *shortopts;
    /* The command's own long options (long-only ones with values from
     * MKV_OPT_FIRST_TOOL), {NULL} terminated, or NULL; the common ones are
     * added. */
    const struct option *longopts;
    /* Take one of those options; on a bad value print the usage error and
     * exit 2. */
    void (*option)(void *conf, int opt, const char *arg);
    void *conf;             /* the command's settings, with their defaults */
    int many_files;         /* FILE... (at least one) rather than one FILE */
    /* The command is a table over the dump's layers and heads, run with
     * conf as its state ... */
    const mkv_table_analysis *table;
    /* ... or it runs on its FILE operands itself and gives the exit status. */
    int (*run)(const mkv_subcommand *cmd, const mkv_common_opts *common, int n_files, char **files);
};

/* Parse the command's arguments (argv[0] is the command's name) and run
 * it; returns the exit status. */
int mkv_subcommand_run(const mkv_subcommand *cmd, int argc, char **argv);

/* "Usage: PROG NAME OPERANDS", the details, the options; exits with status. */
void mkv_subcommand_usage(const mkv_subcommand *cmd, FILE *fp, int status) __attribute__((noreturn));
/* "PROG: WHAT; try 'PROG NAME --help'" on stderr, exit 2. */
void mkv_subcommand_misuse(const mkv_subcommand *cmd, const char *what) __attribute__((noreturn));

#endif
