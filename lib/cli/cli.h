/* Command-line helpers shared by every tool: the common options, number
 * and size parsing with K/M/G suffixes, --version output. */
#ifndef MKV_CLI_H
#define MKV_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include "core/mkv.h"
#include "methods/method.h"

/* The common options (samtools' SAM_OPT_GLOBAL_OPTIONS): every tool takes
 * -h, -q, -v and --version; each declares which of the others it takes by
 * putting their entries in its long-option table and passing the same set
 * to mkv_common_usage(), so --help lists exactly what the tool accepts and
 * an option the tool does not take is an unknown option. Long-only options
 * use values above 0x100. */
enum {
    MKV_OPT_VERSION = 0x100,
    MKV_OPT_THREADS,
    MKV_OPT_DEVICE,
    MKV_OPT_FIRST_TOOL = 0x200 /* tools number their own long options from here */
};
enum { MKV_COMMON_THREADS = 1u << 0, MKV_COMMON_DEVICE = 1u << 1 };
#define MKV_COMMON_SHORTOPTS "hqv"
#define MKV_COMMON_LONGOPTS                                   \
    {"help", no_argument, NULL, 'h'},                         \
    {"quiet", no_argument, NULL, 'q'},                        \
    {"verbose", no_argument, NULL, 'v'},                      \
    {"version", no_argument, NULL, MKV_OPT_VERSION}
#define MKV_THREADS_LONGOPT {"threads", required_argument, NULL, MKV_OPT_THREADS}
#define MKV_DEVICE_LONGOPT {"device", required_argument, NULL, MKV_OPT_DEVICE}

/* The "Common options:" block of a tool's --help, for the set it takes
 * (MKV_COMMON_THREADS | MKV_COMMON_DEVICE, or 0). */
void mkv_common_usage(FILE *fp, unsigned set);

typedef enum { MKV_DEVICE_AUTO = 0, MKV_DEVICE_CPU, MKV_DEVICE_GPU } mkv_device;

typedef struct {
    int verbosity;     /* starts at MKV_LOG_WARN */
    int threads;       /* 0 = not given */
    mkv_device device;
} mkv_common_opts;

void mkv_common_init(mkv_common_opts *c);
/* Handle one of the common options. Returns 1 if handled, 0 if opt is not
 * a common option, -1 on a bad value (message printed, caller exits 2).
 * -h and --version are handled by the caller (they need usage()). */
int mkv_common_option(mkv_common_opts *c, int opt, const char *arg);

/* Number parsing for option values; on error print
 * "PROG: invalid value 'ARG' for --NAME: reason" to stderr and return -1. */
int mkv_parse_int(const char *arg, const char *name, long lo, long hi, long *out);
int mkv_parse_double(const char *arg, const char *name, double lo, double hi, double *out);
/* A seed: any integer in 0..2^64-1. */
int mkv_parse_seed(const char *arg, const char *name, uint64_t *out);
/* Sizes with an optional K, M, G (x1024) suffix: "64K" = 65536. */
int mkv_parse_size(const char *arg, const char *name, int64_t lo, int64_t hi, int64_t *out);

/* Describe the option getopt_long just rejected (opt is '?' or ':') as
 * the user wrote it, e.g. "unknown option '--x'", "option '-o' needs a
 * value", "option '--help' takes no value"; shortopts is the string given
 * to getopt_long. glibc leaves optopt 0 for an unknown long option and sets
 * it to the option's value for a long option given a value it does not take. */
void mkv_describe_bad_option(int opt, char **argv, const char *shortopts, char *buf, size_t size);

/* Print "PROG: message" + newline to stderr (for usage errors: exit 2). */
void mkv_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The misuse() and bad_option() of a tool with one command line: a usage
 * error with the --help hint, exit 2; an option getopt_long rejected, in
 * the user's own spelling.  Expands to two static functions, so that the
 * exit stays in the tool. */
#define MKV_TOOL_MISUSE(shortopts)                                             \
    static void misuse(const char *what)                                       \
    {                                                                          \
        mkv_usage_error("%s; try '%s --help'", what, mkv_progname());          \
        exit(2);                                                               \
    }                                                                          \
    static void bad_option(int opt, char **argv)                               \
    {                                                                          \
        char what[300];                                                        \
        mkv_describe_bad_option(opt, argv, shortopts, what, sizeof what);      \
        misuse(what);                                                          \
    }

/* An option spelling the tools no longer take: "PROG: option 'OLD' is now
 * 'NEW'; try 'PROG --help'" on stderr, exit 2. */
void mkv_renamed_option(const char *old, const char *new_spelling) __attribute__((noreturn));

/* The cases every tool's getopt_long loop over `opt` starts with: -h
 * (the tool's usage(stdout, 0)), --version, and an option getopt_long
 * rejected (bad_option of MKV_TOOL_MISUSE). */
#define MKV_TOOL_STANDARD_CASES                                                \
    case 'h':                                                                  \
        usage(stdout, 0);                                                      \
        break;                                                                 \
    case MKV_OPT_VERSION:                                                      \
        mkv_print_version(stdout);                                             \
        exit(0);                                                               \
    case '?':                                                                  \
    case ':':                                                                  \
        bad_option(opt, argv);                                                 \
        break;

/* ---- methods on the command line (mkv-compress, mkv-decode) ---- */
/* The method called name; otherwise "PROG: unknown method 'x' (methods:
 * a, b, ...)" on stderr and exit 2. */
const mkv_method *mkv_method_or_exit(const char *name);
/* Apply -P 'K=V,K=V ...' to p; otherwise "PROG: method 'NAME': message"
 * and exit 2. */
void mkv_method_params_or_exit(const mkv_method *m, mkv_params *p, const char *arg);
/* A method and its parameters (KEY=DEFAULT, type, range, meaning), as
 * --help-method shows it. */
void mkv_print_method(FILE *fp, const mkv_method *m);
/* Every method, as --list-methods shows them. */
void mkv_list_methods(FILE *fp);
/* "\nMethods: a b c\n", the end of a usage text. */
void mkv_method_names_usage(FILE *fp);

/* Print "PROG: <err->msg>" to stderr. */
void mkv_report(const mkv_error *err);

/* --version: package version and build features, GPUs seen. */
void mkv_print_version(FILE *fp);

/* Number of CPUs available. */
int mkv_ncpus(void);

#endif
