/* mkv-compress: apply a compression method (MosaicKV or a baseline) to a
 * raw KV dump and write a compressed dump with honest byte accounting.
 *
 * Examples:
 *   mkv-compress kv.h5 -o kv-full.h5 --method full
 *   mkv-compress kv.h5 -o kv-mosaic.h5 --method mosaic -p keep=0.25 -p block=8
 *   mkv-compress kv.h5 -o kv-quest.h5 -m quest -p budget=0.1 --threads 4
 *   mkv-capture --synthetic -o - | mkv-compress - -o kvc.h5 -m full
 *   mkv-compress --list-methods
 *   mkv-compress -m mosaic --help-method
 *
 * The tool is a loop over layers: read all heads of a layer, compress the
 * KV heads in parallel (each head is independent), move on. Methods and
 * their parameters come from the registry (lib/methods/registry.c).
 */
#include "config.h"

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/analysis.h"
#include "core/tasks.h"
#include "io/cdump.h"
#include "cli/cli.h"
#include "io/dump.h"
#include "core/log.h"
#include "methods/method.h"
#include "core/mkv.h"
#include "core/tensor.h"

enum { OPT_LIST_METHODS = MKV_OPT_FIRST_TOOL, OPT_HELP_METHOD };

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    MKV_THREADS_LONGOPT,
    {"output", required_argument, NULL, 'o'},
    {"method", required_argument, NULL, 'm'},
    {"param", required_argument, NULL, 'p'},
    {"list-methods", no_argument, NULL, OPT_LIST_METHODS},
    {"help-method", no_argument, NULL, OPT_HELP_METHOD},
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "o:m:p:"

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s IN -o OUT --method NAME [-p KEY=VALUE]... [options]\n"
            "       %s --list-methods\n"
            "       %s --method NAME --help-method\n\n"
            "Compress the raw KV dump IN (mosaickv-dump, see mosaickv(5)) with a method and\n"
            "write a compressed dump OUT. IN or OUT '-' is stdin or stdout. The summary\n"
            "line on stderr gives logical bytes (dense 16-bit K+V), physical bytes (every\n"
            "stored array counted) and their ratio; the file records them too.\n\n"
            "Options:\n"
            "  -o, --output FILE    write the compressed dump to FILE (required)\n"
            "  -m, --method NAME    compression method (required; see --list-methods)\n"
            "  -p, --param K=V      set a method parameter (repeatable; 'K=V K=V' works)\n"
            "      --list-methods   list the methods and their parameters, then exit\n"
            "      --help-method    describe the parameters of --method NAME, then exit\n\n",
            mkv_progname(), mkv_progname(), mkv_progname());
    mkv_common_usage(fp, MKV_COMMON_THREADS);
    fprintf(fp, "\nMethods:");
    for (int i = 0; mkv_methods[i]; i++)
        fprintf(fp, " %s", mkv_methods[i]->name);
    fprintf(fp, "\n");
    exit(status);
}

MKV_TOOL_MISUSE(SHORTOPTS)

/* ------------------------------------------------------------ methods */

static void method_names(char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; mkv_methods[i] && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", mkv_methods[i]->name);
}

static const mkv_method *find_method_or_exit(const char *name)
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

/* "0..1", "1..65536", "a|b|c" or "any" */
static void describe_range(const mkv_param_spec *s, char *buf, size_t size)
{
    if (s->kind == MKV_PARAM_STRING) {
        if (!s->choices) {
            snprintf(buf, size, "text");
            return;
        }
        size_t len = 0;
        buf[0] = '\0';
        for (const char *c = s->choices; *c && len < size;) {
            c += strspn(c, " ");
            size_t n = strcspn(c, " ");
            if (n)
                len += (size_t)snprintf(buf + len, size - len, "%s%.*s", len ? "|" : "", (int)n, c);
            c += n;
        }
    } else if (s->kind == MKV_PARAM_INT) {
        snprintf(buf, size, "%.0f..%.0f", s->min, s->max);
    } else {
        snprintf(buf, size, "%g..%g", s->min, s->max);
    }
}

static void print_method(FILE *fp, const mkv_method *m)
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
        describe_range(s, range, sizeof range);
        fprintf(fp, "    %-18s %-6s %-14s %s\n", setting,
                s->kind == MKV_PARAM_INT ? "int" : s->kind == MKV_PARAM_DOUBLE ? "real" : "text", range,
                s->help ? s->help : "");
    }
}

static void list_methods(void)
{
    printf("Methods and their parameters (KEY=DEFAULT, type, range, meaning);\n"
           "set them with -p KEY=VALUE:\n");
    for (int i = 0; mkv_methods[i]; i++) {
        printf("\n");
        print_method(stdout, mkv_methods[i]);
    }
    exit(0);
}

/* -p 'K=V K=V ...' */
static void set_params(const mkv_method *m, mkv_params *p, const char *arg)
{
    char *copy = strdup(arg);
    if (!copy) {
        mkv_usage_error("out of memory");
        exit(1);
    }
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        mkv_error err;
        mkv_error_clear(&err);
        if (mkv_params_parse(p, tok, &err) != MKV_OK) {
            mkv_usage_error("method '%s': %s", m->name, err.msg);
            exit(2);
        }
        n++;
    }
    free(copy);
    if (n == 0) {
        mkv_usage_error("invalid value '%s' for --param: expected KEY=VALUE", arg);
        exit(2);
    }
}

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
        case 'h':
            usage(stdout, 0);
            break;
        case MKV_OPT_VERSION:
            mkv_print_version(stdout);
            exit(0);
        case '?':
        case ':':
            bad_option(opt, argv);
            break;
        case 'o':
            a->output = optarg;
            break;
        case 'm':
            method_name = optarg;
            break;
        case 'p':
            /* applied once the method is known, whatever the option order */
            param_args[n_param_args++] = optarg;
            break;
        case OPT_LIST_METHODS:
            list_methods();
            break;
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
        print_method(stdout, find_method_or_exit(method_name));
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
    a->method = find_method_or_exit(method_name);
    mkv_params_init(&a->params, a->method->params);
    for (int i = 0; i < n_param_args; i++)
        set_params(a->method, &a->params, param_args[i]);
    free(param_args);
    if (!a->output)
        misuse("missing -o FILE (use '-o -' for stdout)");
}

/* ------------------------------------------------------------ compression */

/* One layer: the raw arrays of every head and what the workers share. */
typedef struct {
    const compress_args *a;
    const mkv_dump_meta *m;
    mkv_cdump_writer *w;
    const int32_t *query_pos;
    int layer;
    float *k, *v;          /* [n_kv_heads][T][d] */
    float *q;              /* [n_heads][W][d] */
    int threads_per_head;
} layer_job;

/* Task h of mkv_run_tasks: KV head h of the layer. */
static int compress_head(void *ctx, int h, mkv_error *err)
{
    const layer_job *j = ctx;
    const mkv_dump_meta *m = j->m;
    int G = m->n_heads / m->n_kv_heads;
    size_t kv_head = (size_t)m->n_tokens * (size_t)m->head_dim;
    size_t q_group = (size_t)G * (size_t)m->n_queries * (size_t)m->head_dim;
    mkv_head_kv in = {
        .layer = j->layer,
        .head = h,
        .T = m->n_tokens,
        .d = m->head_dim,
        .G = G,
        .k = j->k + (size_t)h * kv_head,
        .v = j->v + (size_t)h * kv_head,
        .W = m->n_queries,
        /* query heads h*G .. h*G+G-1 are consecutive: [G][W][d] */
        .q = m->n_queries ? j->q + (size_t)h * q_group : NULL,
        .query_pos = j->query_pos,
        .threads = j->threads_per_head,
    };
    int rc = j->a->method->compress(&j->a->params, &in, j->w, err);
    if (rc && !err->msg[0])
        mkv_fail(err, rc, "method '%s' failed without a message", j->a->method->name);
    return rc;
}

/* Compress every KV head of one layer with up to `threads` workers. The
 * first failing head (lowest index) gives the error. */
static int run_layer(layer_job *j, int threads, mkv_error *err)
{
    int h;
    int rc = mkv_run_tasks(j->m->n_kv_heads, threads, compress_head, j, &h, err);
    if (rc != MKV_OK && h >= 0) {
        /* name the head unless the message (from lib/io/cdump.c) does */
        char tag[64];
        snprintf(tag, sizeof tag, "layer %d head %d:", j->layer, h);
        if (strncmp(err->msg, tag, strlen(tag)) != 0)
            mkv_error_prefix(err, "layer %d head %d", j->layer, h);
    }
    return rc;
}

static int compress(const compress_args *a, uint64_t *logical, uint64_t *physical, mkv_error *err)
{
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(a->input, &d, err);
    if (rc)
        return rc;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    mkv_cdump_writer *w = NULL;
    layer_job j = {.a = a, .m = m};
    int32_t *query_pos = NULL;

    if ((rc = a->method->check(&a->params, m, err))) {
        mkv_error_prefix(err, "method '%s'", a->method->name);
        goto done;
    }
    size_t kv_n, q_n;
    if (mkv_mul_size3((size_t)m->n_kv_heads, (size_t)m->n_tokens, (size_t)m->head_dim, &kv_n) ||
        mkv_mul_size3((size_t)m->n_heads, (size_t)m->n_queries, (size_t)m->head_dim, &q_n)) {
        rc = mkv_fail(err, MKV_ENOMEM, "'%s': a layer is too large to hold in memory", mkv_dump_path(d));
        goto done;
    }
    query_pos = calloc((size_t)m->n_queries + 1, sizeof *query_pos);
    j.k = mkv_alloc(kv_n, sizeof(float), "keys of a layer", err);
    j.v = mkv_alloc(kv_n, sizeof(float), "values of a layer", err);
    j.q = mkv_alloc(q_n ? q_n : 1, sizeof(float), "queries of a layer", err);
    if (!query_pos || !j.k || !j.v || !j.q) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for one layer of '%s'", mkv_dump_path(d));
        goto done;
    }
    if ((rc = mkv_dump_read_query_pos(d, query_pos, err)))
        goto done;
    j.query_pos = query_pos;

    mkv_cdump_meta cm;
    memset(&cm, 0, sizeof cm);
    snprintf(cm.method, sizeof cm.method, "%s", a->method->name);
    mkv_params_format(&a->params, cm.params, sizeof cm.params);
    snprintf(cm.source, sizeof cm.source, "%s", a->input);
    cm.raw = *m;
    if ((rc = mkv_cdump_create(a->output, a->input, &cm, query_pos, &w, err)))
        goto done;
    j.w = w;

    int threads = a->common.threads ? a->common.threads : mkv_ncpus();
    int concurrent = threads < m->n_kv_heads ? threads : m->n_kv_heads;
    j.threads_per_head = threads / concurrent > 0 ? threads / concurrent : 1;
    mkv_info("%s: %d layers x %d KV heads x %" PRId64 " tokens, head_dim %d, %" PRId64
             " queries; method %s (%s), %d threads",
             mkv_dump_path(d), m->n_layers, m->n_kv_heads, m->n_tokens, m->head_dim, m->n_queries,
             a->method->name, cm.params[0] ? cm.params : "no parameters", threads);
    mkv_progress progress;
    mkv_progress_start(&progress, "compressing", m->n_layers);
    for (int l = 0; l < m->n_layers && !rc; l++) {
        j.layer = l;
        /* all HDF5 reading happens here, never while workers write */
        if ((rc = mkv_dump_read_finite(d, l, 'k', 0, m->n_kv_heads, 0, m->n_tokens, j.k, err)) ||
            (rc = mkv_dump_read_finite(d, l, 'v', 0, m->n_kv_heads, 0, m->n_tokens, j.v, err)) ||
            (rc = mkv_dump_read_finite(d, l, 'q', 0, m->n_heads, 0, m->n_queries, j.q, err)))
            break;
        rc = run_layer(&j, threads, err);
        mkv_progress_update(&progress, l + 1);
    }
    mkv_progress_finish(&progress);
    if (!rc) {
        *logical = cm.raw.n_layers * (uint64_t)cm.raw.n_kv_heads * 2 * (uint64_t)m->n_tokens *
                   (uint64_t)m->head_dim * 2;
        *physical = mkv_cdump_total_bytes(w);
        rc = mkv_cdump_commit(w, err);
        w = NULL;
    }
done:
    if (w)
        mkv_cdump_abort(w);
    mkv_free(j.k);
    mkv_free(j.v);
    mkv_free(j.q);
    free(query_pos);
    mkv_dump_close(d);
    return rc;
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    compress_args a;
    parse_args(argc, argv, &a);

    mkv_error err;
    mkv_error_clear(&err);
    uint64_t logical = 0, physical = 0;
    int rc = compress(&a, &logical, &physical, &err);
    if (rc != MKV_OK) {
        mkv_report(&err);
        return mkv_exit_code(rc);
    }
    if (a.common.verbosity > MKV_LOG_ERROR)
        fprintf(stderr, "%s: %s: method %s, logical %" PRIu64 " bytes, physical %" PRIu64 " bytes, ratio %.3f\n",
                mkv_progname(), strcmp(a.output, "-") == 0 ? "stdout" : a.output, a.method->name, logical,
                physical, (double)logical / (double)physical);
    return 0;
}
