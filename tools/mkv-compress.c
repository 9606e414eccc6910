/* mkv-compress: apply a compression method (MosaicKV or a baseline) to a
 * raw KV dump and write a compressed dump with honest byte accounting.
 *
 * Examples:
 *   mkv-compress kv.h5 -o kv-full.h5 --method full
 *   mkv-compress kv.h5 -o kv-mosaic.h5 --method mosaic -P keep=0.25,block=8
 *   mkv-compress kv.h5 -o kv-quest.h5 -m quest -P budget=0.1 --threads 4
 *   mkv-capture --synthetic -o - | mkv-compress - -o kvc.h5 -m full
 *   mkv-compress --list-methods
 *   mkv-compress -m mosaic --help-method
 *
 * The tool parses the command line and hands the run to the library's
 * compression driver (lib/methods/compress.h). Methods and their
 * parameters come from the registry (lib/methods/registry.c).
 */
#include "config.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/mkv.h"
#include "methods/compress.h"
#include "methods/method.h"

enum { OPT_LIST_METHODS = MKV_OPT_FIRST_TOOL, OPT_HELP_METHOD };

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    MKV_THREADS_LONGOPT,
    {"output", required_argument, NULL, 'o'},
    {"method", required_argument, NULL, 'm'},
    {"param", required_argument, NULL, 'P'},
    {"list-methods", no_argument, NULL, OPT_LIST_METHODS},
    {"help-method", no_argument, NULL, OPT_HELP_METHOD},
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
/* -p is the old spelling of -P, kept only to say so. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "o:m:P:p"

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s IN -o OUT --method NAME [-P KEY=VALUE[,KEY=VALUE...]]... [options]\n"
            "       %s --list-methods\n"
            "       %s --method NAME --help-method\n\n"
            "Compress the raw KV dump IN (mosaickv-dump, see mosaickv(5)) with a method and\n"
            "write a compressed dump OUT. IN or OUT '-' is stdin or stdout. The summary\n"
            "line on stderr gives logical bytes (dense 16-bit K+V), physical bytes (every\n"
            "stored array counted) and their ratio; the file records them too.\n\n"
            "Options:\n"
            "  -o, --output FILE    write the compressed dump to FILE (required)\n"
            "  -m, --method NAME    compression method (required; see --list-methods)\n"
            "  -P, --param K=V[,K=V...]\n"
            "                       set method parameters (repeatable; commas or blanks\n"
            "                       separate them)\n"
            "      --list-methods   list the methods and their parameters, then exit\n"
            "      --help-method    describe the parameters of --method NAME, then exit\n\n",
            mkv_progname(), mkv_progname(), mkv_progname());
    mkv_common_usage(fp, MKV_COMMON_THREADS);
    mkv_method_names_usage(fp);
    exit(status);
}

MKV_TOOL_MISUSE(SHORTOPTS)

/* ------------------------------------------------------------ arguments */

typedef struct {
    const char *input;
    const char *output;
    const mkv_method *method;
    mkv_params params;
    mkv_common_opts common;
} compress_args;

static void parse_args(int argc, char **argv, compress_args *a)
{
    memset(a, 0, sizeof *a);
    mkv_common_init(&a->common);
    const char *method_name = NULL;
    const char **param_args = calloc((size_t)argc + 1, sizeof *param_args);
    int n_param_args = 0, help_method = 0;
    if (!param_args) {
        mkv_usage_error("out of memory");
        exit(1);
    }

    opterr = 0;   /* bad_option prints the one-line message */
    int opt;
    while ((opt = getopt_long(argc, argv, SHORTOPTS, longopts, NULL)) != -1) {
        switch (opt) {
        MKV_TOOL_STANDARD_CASES
        case 'o':
            a->output = optarg;
            break;
        case 'm':
            method_name = optarg;
            break;
        case 'P':
            /* applied once the method is known, whatever the option order */
            param_args[n_param_args++] = optarg;
            break;
        case 'p':
            mkv_renamed_option("-p", "-P");
        case OPT_LIST_METHODS:
            mkv_list_methods(stdout);
            exit(0);
        case OPT_HELP_METHOD:
            help_method = 1;
            break;
        default: {
            int handled = mkv_common_option(&a->common, opt, optarg);
            if (handled < 0)
                exit(2);
            if (!handled)
                misuse("internal error: unhandled option");
        }
        }
    }
    if (help_method) {
        if (!method_name)
            misuse("--help-method needs --method NAME");
        mkv_print_method(stdout, mkv_method_or_exit(method_name));
        exit(0);
    }
    if (optind >= argc)
        misuse("missing IN (the raw dump to compress)");
    if (argc - optind > 1) {
        char what[300];
        snprintf(what, sizeof what, "too many operands ('%s' after IN)", argv[optind + 1]);
        misuse(what);
    }
    a->input = argv[optind];
    if (!method_name)
        misuse("missing --method NAME (see --list-methods)");
    a->method = mkv_method_or_exit(method_name);
    mkv_params_init(&a->params, a->method->params);
    for (int i = 0; i < n_param_args; i++)
        mkv_method_params_or_exit(a->method, &a->params, param_args[i]);
    free(param_args);
    if (!a->output)
        misuse("missing -o FILE (use '-o -' for stdout)");
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    compress_args a;
    parse_args(argc, argv, &a);

    mkv_error err;
    mkv_error_clear(&err);
    mkv_compressor c = {.method = a.method, .params = &a.params};
    int threads = a.common.threads ? a.common.threads : mkv_ncpus();
    mkv_compress_bytes bytes;
    int rc = mkv_compress_dump(&c, a.input, a.output, threads, &bytes, &err);
    if (rc != MKV_OK) {
        mkv_report(&err);
        return mkv_exit_code(rc);
    }
    if (a.common.verbosity > MKV_LOG_ERROR)
        fprintf(stderr, "%s: %s: method %s, logical %" PRIu64 " bytes, physical %" PRIu64 " bytes, ratio %.3f\n",
                mkv_progname(), strcmp(a.output, "-") == 0 ? "stdout" : a.output, a.method->name,
                bytes.logical_bytes, bytes.physical_bytes,
                (double)bytes.logical_bytes / (double)bytes.physical_bytes);
    return 0;
}
