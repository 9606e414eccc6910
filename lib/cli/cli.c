/* Option helpers shared by every tool. */
#include "config.h"
#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gsl/gsl_version.h>
#include <hdf5.h>
#include <zlib.h>

#include "core/log.h"
#include "methods/method.h"
#include "mkv_cuda.h"

void mkv_common_init(mkv_common_opts *c)
{
    c->verbosity = MKV_LOG_WARN;
    c->threads = 0;
    c->device = MKV_DEVICE_AUTO;
    mkv_log_set_level(c->verbosity);
}

void mkv_renamed_option(const char *old, const char *new_spelling)
{
    mkv_usage_error("option '%s' is now '%s'; try '%s --help'", old, new_spelling, mkv_progname());
    exit(2);
}

void mkv_common_usage(FILE *fp, unsigned set)
{
    fputs("Common options:\n"
          "  -h, --help           show this help and exit\n"
          "      --version        show version and build features, then exit\n"
          "  -q, --quiet          only print errors\n"
          "  -v, --verbose        more messages (repeat for debug)\n",
          fp);
    if (set & MKV_COMMON_THREADS)
        fputs("      --threads N      worker threads (default: number of CPUs)\n", fp);
    if (set & MKV_COMMON_DEVICE)
        fputs("      --device D       auto, cpu or gpu (default auto)\n", fp);
}

int mkv_common_option(mkv_common_opts *c, int opt, const char *arg)
{
    long v;
    switch (opt) {
    case 'q':
        c->verbosity = MKV_LOG_ERROR;
        break;
    case 'v':
        if (c->verbosity < MKV_LOG_DEBUG)
            c->verbosity = c->verbosity < MKV_LOG_INFO ? MKV_LOG_INFO : c->verbosity + 1;
        break;
    case MKV_OPT_THREADS:
        if (mkv_parse_int(arg, "threads", 1, 1024, &v))
            return -1;
        c->threads = (int)v;
        return 1;
    case MKV_OPT_DEVICE:
        if (strcmp(arg, "auto") == 0)
            c->device = MKV_DEVICE_AUTO;
        else if (strcmp(arg, "cpu") == 0)
            c->device = MKV_DEVICE_CPU;
        else if (strcmp(arg, "gpu") == 0)
            c->device = MKV_DEVICE_GPU;
        else {
            mkv_usage_error("invalid value '%s' for --device: expected auto, cpu or gpu", arg);
            return -1;
        }
        return 1;
    default:
        return 0;
    }
    mkv_log_set_level(c->verbosity);
    return 1;
}

void mkv_usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", mkv_progname());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void mkv_describe_bad_option(int opt, char **argv, const char *shortopts, char *buf, size_t size)
{
    const char *arg = argv[optind - 1];
    int name_len = (int)strcspn(arg, "=");
    /* a long option with a short letter sets optopt to the letter too */
    int is_short = optopt > 0 && optopt < 0x100 && strncmp(arg, "--", 2) != 0;
    if (opt == ':' && is_short)
        snprintf(buf, size, "option '-%c' needs a value", optopt);
    else if (opt == ':')
        snprintf(buf, size, "option '%s' needs a value", arg);
    else if (optopt == 0)
        snprintf(buf, size, "unknown option '%.*s'", name_len, arg);
    else if (!is_short || strchr(shortopts, optopt))
        snprintf(buf, size, "option '%.*s' takes no value", name_len, arg);
    else
        snprintf(buf, size, "unknown option '-%c'", optopt);
}

void mkv_report(const mkv_error *err)
{
    fprintf(stderr, "%s: %s\n", mkv_progname(), err->msg[0] ? err->msg : "unknown error");
}

int mkv_parse_int(const char *arg, const char *name, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end != '\0' || errno == ERANGE) {
        mkv_usage_error("invalid value '%s' for --%s: not an integer", arg, name);
        return -1;
    }
    if (v < lo || v > hi) {
        mkv_usage_error("invalid value '%s' for --%s: must be in %ld..%ld", arg, name, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int mkv_parse_double(const char *arg, const char *name, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end != '\0' || errno == ERANGE || !isfinite(v)) {
        mkv_usage_error("invalid value '%s' for --%s: not a number", arg, name);
        return -1;
    }
    if (v < lo || v > hi) {
        mkv_usage_error("invalid value '%s' for --%s: must be in %g..%g", arg, name, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int mkv_parse_seed(const char *arg, const char *name, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (end == arg || *end || errno || arg[strspn(arg, " \t")] == '-') {
        mkv_usage_error("invalid value '%s' for --%s: expected an integer in 0..18446744073709551615", arg, name);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int mkv_parse_size(const char *arg, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(arg, &end, 10);
    int64_t mult = 1;
    if (end != arg && *end) {
        switch (*end) {
        case 'k': case 'K': mult = INT64_C(1) << 10; break;
        case 'm': case 'M': mult = INT64_C(1) << 20; break;
        case 'g': case 'G': mult = INT64_C(1) << 30; break;
        default: mult = 0;
        }
        end++;
    }
    if (end == arg || *end != '\0' || mult == 0 || errno == ERANGE) {
        mkv_usage_error("invalid value '%s' for --%s: expected a number with an optional K, M or G suffix", arg, name);
        return -1;
    }
    if (v > 0 && v > INT64_MAX / mult) {
        mkv_usage_error("invalid value '%s' for --%s: too large", arg, name);
        return -1;
    }
    int64_t s = (int64_t)v * mult;
    if (s < lo || s > hi) {
        mkv_usage_error("invalid value '%s' for --%s: must be in %lld..%lld", arg, name,
                        (long long)lo, (long long)hi);
        return -1;
    }
    *out = s;
    return 0;
}

int mkv_ncpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void mkv_print_version(FILE *fp)
{
    unsigned maj, min, rel;
    H5get_libversion(&maj, &min, &rel);
    fprintf(fp, "%s (mosaickv) %s\n", mkv_progname(), PACKAGE_VERSION);
    fprintf(fp, "HDF5: %u.%u.%u (built with %s)\n", maj, min, rel, MKV_HDF5_VERSION);
    fprintf(fp, "GSL: %s\n", gsl_version);
    fprintf(fp, "zlib: %s\n", zlibVersion());
    fprintf(fp, "BLAS: %s\n", MKV_BLAS);
    fprintf(fp, "CUDA: %s\n", mkv_cuda_build_info());
    if (!mkv_cuda_built())
        return;
    mkv_gpu_info gpus[16];
    int count = 0;
    mkv_error err;
    if (mkv_cuda_devices(gpus, 16, &count, &err) != MKV_OK) {
        fprintf(fp, "GPUs: unavailable (%s)\n", err.msg);
        return;
    }
    if (count == 0)
        fprintf(fp, "GPUs: none found\n");
    for (int i = 0; i < count && i < 16; i++)
        fprintf(fp, "GPU %d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free)%s\n",
                gpus[i].index, gpus[i].name, gpus[i].cc_major, gpus[i].cc_minor,
                gpus[i].multiprocessors, gpus[i].total_mem / 1073741824.0,
                gpus[i].free_mem / 1073741824.0,
                gpus[i].usable ? "" : " [no code for it in this build]");
}

/* ---------------------------------------------------------------- methods */

static void method_names(char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; mkv_methods[i] && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", mkv_methods[i]->name);
}

const mkv_method *mkv_method_or_exit(const char *name)
{
    const mkv_method *m = mkv_method_find(name);
    if (!m) {
        char names[512];
        method_names(names, sizeof names);
        mkv_usage_error("unknown method '%s' (methods: %s)", name, names);
        exit(2);
    }
    return m;
}

void mkv_method_params_or_exit(const mkv_method *m, mkv_params *p, const char *arg)
{
    mkv_error err;
    mkv_error_clear(&err);
    if (mkv_params_parse_list(p, arg, &err) < 0) {
        mkv_usage_error("method '%s': %s", m->name, err.msg);
        exit(2);
    }
}

void mkv_print_method(FILE *fp, const mkv_method *m)
{
    fprintf(fp, "%s - %s\n", m->name, m->summary);
    mkv_params p;
    mkv_params_init(&p, m->params);
    if (p.n == 0)
        fprintf(fp, "    (no parameters)\n");
    for (int i = 0; i < p.n; i++) {
        const mkv_param_spec *s = p.spec[i];
        char setting[96], range[128];
        snprintf(setting, sizeof setting, "%s=%s", s->name, p.value[i]);
        mkv_param_range_text(s, range, sizeof range);
        fprintf(fp, "    %-18s %-6s %-16s %s\n", setting,
                s->kind == MKV_PARAM_INT ? "int" : s->kind == MKV_PARAM_DOUBLE ? "real" : "text", range,
                s->help ? s->help : "");
    }
}

void mkv_list_methods(FILE *fp)
{
    fprintf(fp, "Methods and their parameters (KEY=DEFAULT, type, range, meaning);\n"
                "set them with -P KEY=VALUE[,KEY=VALUE...]:\n");
    for (int i = 0; mkv_methods[i]; i++) {
        fprintf(fp, "\n");
        mkv_print_method(fp, mkv_methods[i]);
    }
}

void mkv_method_names_usage(FILE *fp)
{
    fprintf(fp, "\nMethods:");
    for (int i = 0; mkv_methods[i]; i++)
        fprintf(fp, " %s", mkv_methods[i]->name);
    fprintf(fp, "\n");
}
