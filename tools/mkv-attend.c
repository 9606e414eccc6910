/* mkv-attend: run attention for a dump's queries over a compressed cache
 * and measure it against exact attention over the raw dump.
 *
 * Examples:
 *   mkv-attend kv-mosaic.h5 > fidelity.tsv             # reference: the recorded source
 *   mkv-attend kv-mosaic.h5 --reference kv.h5 -o fidelity.tsv
 *   mkv-attend kv-quest.h5 --summary                    # one-row summary TSV only
 *   mkv-attend kv-quest.h5 --summary --budget 0.05 | tail -n 1
 *   for m in full quest mosaic; do mkv-attend kv-$m.h5 --summary | tail -n 1; done
 *   mkv-attend kv-mosaic.h5 --device gpu --summary        # the GPU kernels (mosaic, uniform2d, quest, full)
 *   mkv-attend --bench -o bench.tsv                        # GPU benchmark, synthetic LLaMA-3.1-8B caches
 *   mkv-attend --bench --contexts 256K --batches 4 --budgets 0.1 --methods dense,quest,packed
 *
 * Work is split over (layer, KV head): the main thread reads a batch of
 * layers from the raw dump, workers load the method's state for one head,
 * answer every query with it and with exact attention, and fill their own
 * rows of the result table, so the output does not depend on --threads.
 * On the GPU a worker answers all queries of its head in one call
 * (lib/gpu/gpu_packed.c), one head on the GPU at a time; exact attention and
 * the metrics stay on the CPU threads.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis/analysis.h"
#include "core/tasks.h"
#include "io/cdump.h"
#include "cli/cli.h"
#include "gpu/gpu_packed.h"
#include "io/dump.h"
#include "core/log.h"
#include "methods/method.h"
#include "methods/metrics.h"
#include "core/mkv.h"
#include "mkv_cuda.h"
#include "core/tensor.h"

enum {
    OPT_REFERENCE = MKV_OPT_FIRST_TOOL, OPT_SUMMARY, OPT_BUDGET, OPT_BENCH, OPT_CONTEXTS, OPT_BATCHES,
    OPT_BUDGETS, OPT_KEEP, OPT_DPRIME, OPT_SEGMENT, OPT_BLOCK, OPT_RUNS, OPT_WARMUP, OPT_METHODS, OPT_CHECK_CPU
};

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    MKV_THREADS_LONGOPT,
    MKV_DEVICE_LONGOPT,
    {"output", required_argument, NULL, 'o'},
    {"reference", required_argument, NULL, 'r'},
    {"summary", no_argument, NULL, OPT_SUMMARY},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"bench", no_argument, NULL, OPT_BENCH},
    {"contexts", required_argument, NULL, OPT_CONTEXTS},
    {"batches", required_argument, NULL, OPT_BATCHES},
    {"budgets", required_argument, NULL, OPT_BUDGETS},
    {"keep", required_argument, NULL, OPT_KEEP},
    {"dprime", required_argument, NULL, OPT_DPRIME},
    {"segment", required_argument, NULL, OPT_SEGMENT},
    {"block", required_argument, NULL, OPT_BLOCK},
    {"runs", required_argument, NULL, OPT_RUNS},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"methods", required_argument, NULL, OPT_METHODS},
    {"check-cpu", no_argument, NULL, OPT_CHECK_CPU},
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "o:r:"

#define ROW_HEADER "query\tpos\tlayer\thead\tkv_head\trel_l2\trecall\ttokens\tbytes_read"
/* With --check-cpu: the CPU reference's token count and how far the output
 * is from its output, ||o - o_cpu|| / ||o_cpu||. */
#define CHECK_HEADER "\tcpu_tokens\tcpu_rel_diff"
#define SUMMARY_HEADER                                                                       \
    "method\tparams\tdevice\tratio\tlogical_bytes\tphysical_bytes\trows\trel_l2_mean\t"      \
    "rel_l2_median\trel_l2_p90\trel_l2_max\trecall_mean\ttokens_mean\tbytes_read_mean\t"     \
    "dense_bytes_mean"

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s COMPRESSED [--reference RAW] [-o OUT.tsv] [--summary] [options]\n"
            "       %s --bench [-o BENCH.tsv] [benchmark options]\n\n"
            "Answer every query of the dump with the compressed cache COMPRESSED (made by\n"
            "mkv-compress) and with exact attention over the raw dump RAW, and report the\n"
            "fidelity per query x layer x query head as TSV:\n"
            "  " ROW_HEADER "\n"
            "rel_l2 is ||o - o_exact|| / ||o_exact||, recall the exact softmax mass of the\n"
            "tokens the method attended, bytes_read what the step read of the KV head's\n"
            "compressed state (shared by the query heads of the group).\n"
            "A one-row summary TSV follows on stderr (unless -q):\n"
            "  " SUMMARY_HEADER "\n\n"
            "Options:\n"
            "  -r, --reference RAW  the raw dump (default: the source COMPRESSED records)\n"
            "  -o, --output FILE    write the table to FILE instead of stdout\n"
            "      --summary        write only the summary TSV (to stdout or FILE)\n"
            "      --budget X       override the method's token budget per step: a fraction\n"
            "                       of the context when <= 1, a count of tokens above 1\n"
            "      --check-cpu      also answer with the CPU reference and add the columns\n"
            "                       cpu_tokens and cpu_rel_diff (||o - o_cpu|| / ||o_cpu||)\n\n"
            "--device gpu runs the GPU kernels (mosaic and uniform2d: packed attention;\n"
            "quest: Quest-style selection; full: dense decode attention); auto (the\n"
            "default) uses them when this build, the machine and the dump allow, else the\n"
            "CPU reference (-v says why).  The summary's device column says which ran.\n\n"
            "Benchmark (--bench, needs a GPU): synthetic caches of one attention shape for\n"
            "every context x batch, per method the median kernel time over --runs steps,\n"
            "bytes read, bandwidth against a device-to-device copy, cache bytes, peak\n"
            "memory, as TSV (one row per configuration and method):\n"
            "      --contexts LIST  tokens per request (default 32K,128K,256K,512K,1M)\n"
            "      --batches LIST   requests per step (default 1,4,8)\n"
            "      --budgets LIST   token budgets of quest and packed (default 0.0625,0.1,0.125,0.25)\n"
            "      --methods LIST   of dense, dense-variant, quest, packed (default dense,quest,packed)\n"
            "      --keep X         packed: fraction of head_dim kept per vector (default 0.25)\n"
            "      --dprime N       packed: rotated channels d' (default 64)\n"
            "      --segment N      packed: tokens per segment and rotation (default 4096)\n"
            "      --block N        packed: tokens per block key (default 8)\n"
            "      --runs N         timed steps per measurement (default 30)\n"
            "      --warmup N       untimed steps first (default 5)\n"
            "  The shape is LLaMA-3.1-8B's: 32 query heads, 8 KV heads, head_dim 128, bf16.\n\n",
            mkv_progname(), mkv_progname());
    mkv_common_usage(fp, MKV_COMMON_THREADS | MKV_COMMON_DEVICE);
    exit(status);
}

MKV_TOOL_MISUSE(SHORTOPTS)

typedef struct {
    const char *compressed;
    const char *reference;
    const char *output;
    const char *budget;
    int summary_only;
    int check_cpu;
    int bench;
    mkv_bench_opts bo;
    int bench_opt_seen;         /* a benchmark option was given (refused without --bench) */
    mkv_common_opts common;
} attend_args;

/* "32K,1M" etc. into out (at most MKV_BENCH_MAX_LIST); exits 2 on a bad
 * list, an empty entry ("32K,,1M") included. */
static int parse_list(const char *arg, const char *name, int is_size, double lo, double hi, double *out)
{
    char buf[512];
    if (strlen(arg) >= sizeof buf) {
        mkv_usage_error("invalid value for --%s: longer than %zu characters", name, sizeof buf - 1);
        exit(2);
    }
    snprintf(buf, sizeof buf, "%s", arg);
    int n = 0, empty = 0;
    for (char *rest = buf, *tok; (tok = strsep(&rest, ",")) != NULL;) {
        if (*tok == '\0') {
            empty = 1;
            continue;
        }
        if (n == MKV_BENCH_MAX_LIST) {
            mkv_usage_error("invalid value '%s' for --%s: at most %d entries", arg, name, MKV_BENCH_MAX_LIST);
            exit(2);
        }
        if (is_size) {
            int64_t v;
            if (mkv_parse_size(tok, name, (int64_t)lo, (int64_t)hi, &v))
                exit(2);
            out[n++] = (double)v;
        } else if (mkv_parse_double(tok, name, lo, hi, &out[n++])) {
            exit(2);
        }
    }
    if (n == 0 || empty) {
        mkv_usage_error("invalid value '%s' for --%s: %s", arg, name, n == 0 ? "empty list" : "empty entry");
        exit(2);
    }
    return n;
}

static unsigned parse_methods(const char *arg)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    unsigned m = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "dense"))
            m |= MKV_BENCH_DENSE;
        else if (!strcmp(tok, "dense-variant"))
            m |= MKV_BENCH_DENSE_VARIANT;
        else if (!strcmp(tok, "quest"))
            m |= MKV_BENCH_QUEST;
        else if (!strcmp(tok, "packed"))
            m |= MKV_BENCH_PACKED;
        else {
            mkv_usage_error("invalid value '%s' for --methods: '%s' is not dense, dense-variant, quest or packed",
                            arg, tok);
            exit(2);
        }
    }
    if (!m) {
        mkv_usage_error("invalid value '%s' for --methods: empty list", arg);
        exit(2);
    }
    return m;
}

static void parse_args(int argc, char **argv, attend_args *a)
{
    memset(a, 0, sizeof *a);
    mkv_common_init(&a->common);
    mkv_bench_opts_default(&a->bo);
    opterr = 0;   /* bad_option prints the one-line message */
    int opt;
    double budget, list[MKV_BENCH_MAX_LIST];
    long v;
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
            /* '-' is stdout, where the table goes anyway */
            a->output = strcmp(optarg, "-") == 0 ? NULL : optarg;
            break;
        case 'r':
            a->reference = optarg;
            break;
        case OPT_SUMMARY:
            a->summary_only = 1;
            break;
        case OPT_BUDGET:
            /* the method's own range check follows once it is known */
            if (mkv_parse_double(optarg, "budget", 0, 1e18, &budget))
                exit(2);
            if (budget <= 0) {
                mkv_usage_error("invalid value '%s' for --budget: must be positive", optarg);
                exit(2);
            }
            a->budget = optarg;
            break;
        case OPT_BENCH:
            a->bench = 1;
            break;
        case OPT_CHECK_CPU:
            a->check_cpu = 1;
            break;
        case OPT_CONTEXTS:
            a->bo.n_contexts = parse_list(optarg, "contexts", 1, 1, INT32_MAX, list);
            for (int i = 0; i < a->bo.n_contexts; i++)
                a->bo.contexts[i] = (int64_t)list[i];
            a->bench_opt_seen = 1;
            break;
        case OPT_BATCHES:
            a->bo.n_batches = parse_list(optarg, "batches", 1, 1, 4096, list);
            for (int i = 0; i < a->bo.n_batches; i++)
                a->bo.batches[i] = (int)list[i];
            a->bench_opt_seen = 1;
            break;
        case OPT_BUDGETS:
            a->bo.n_budgets = parse_list(optarg, "budgets", 0, 1e-9, 1e15, a->bo.budgets);
            a->bench_opt_seen = 1;
            break;
        case OPT_KEEP:
            if (mkv_parse_double(optarg, "keep", 1e-9, 1, &a->bo.keep))
                exit(2);
            a->bench_opt_seen = 1;
            break;
        case OPT_DPRIME:
        case OPT_SEGMENT:
        case OPT_BLOCK:
        case OPT_RUNS:
        case OPT_WARMUP: {
            static const char *names[] = {"dprime", "segment", "block", "runs", "warmup"};
            static const long lo[] = {1, 1, 1, 1, 0}, hi[] = {128, 1 << 30, 16, 10000, 10000};
            int i = opt - OPT_DPRIME;
            if (mkv_parse_int(optarg, names[i], lo[i], hi[i], &v))
                exit(2);
            int *dst[] = {&a->bo.dprime, &a->bo.segment, &a->bo.block, &a->bo.runs, &a->bo.warmup};
            *dst[i] = (int)v;
            a->bench_opt_seen = 1;
            break;
        }
        case OPT_METHODS:
            a->bo.methods = parse_methods(optarg);
            a->bench_opt_seen = 1;
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
    if (a->bench) {
        if (optind < argc) {
            char what[300];
            snprintf(what, sizeof what, "--bench takes no operand ('%s')", argv[optind]);
            misuse(what);
        }
        if (a->common.device == MKV_DEVICE_CPU)
            misuse("--bench runs on the GPU: --device cpu does not apply");
        if (a->budget)
            misuse("--budget applies to a dump; --bench takes --budgets");
        if (a->reference || a->summary_only || a->check_cpu)
            misuse("-r, --summary and --check-cpu apply to a dump, not to --bench");
        /* The packed caches' geometry; the benchmark checks it again for
         * library callers, after the device is found. */
        if (a->bo.block & (a->bo.block - 1))
            misuse("--block must be a power of two (1, 2, 4, 8 or 16)");
        if (a->bo.segment < a->bo.block)
            misuse("--segment must be at least --block");
        return;
    }
    if (a->bench_opt_seen)
        misuse("benchmark options (--contexts, --batches, --budgets, --methods, --keep, --dprime, --segment, "
               "--block, --runs, --warmup) need --bench");
    if (optind >= argc)
        misuse("missing COMPRESSED (a dump made by mkv-compress)");
    if (argc - optind > 1) {
        char what[300];
        snprintf(what, sizeof what, "too many operands ('%s' after COMPRESSED)", argv[optind + 1]);
        misuse(what);
    }
    a->compressed = argv[optind];
}

/* ------------------------------------------------------------ setup */

typedef struct {
    const char *c_label;        /* the compressed dump as messages name it */
    const char *raw_path;
    mkv_cdump *c;
    mkv_dump *raw;
    const mkv_method *method;
    mkv_params params;
    const mkv_cdump_meta *cm;
    const mkv_dump_meta *m;     /* of the raw dump */
    int32_t *query_pos;         /* [W] */
    int gpu;                    /* answer with the GPU kernels */
    int check_cpu;              /* and with the CPU reference, compared */
    pthread_mutex_t gpu_mu;     /* one head on the GPU at a time */
} session;

/* Rebuild the parameters the file records (every one, in canonical form). */
static int load_params(session *s, mkv_error *err)
{
    mkv_params_init(&s->params, s->method->params);
    char *copy = strdup(s->cm->params);
    if (!copy)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    int rc = MKV_OK;
    for (char *save = NULL, *tok = strtok_r(copy, " ", &save); tok && !rc; tok = strtok_r(NULL, " ", &save))
        if (mkv_params_parse(&s->params, tok, err)) {
            mkv_error_prefix(err, "'%s': the recorded parameters of method '%s'", s->c_label, s->method->name);
            rc = err->code = MKV_EFORMAT;
        }
    free(copy);
    return rc;
}

static int method_names(char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; mkv_methods[i] && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", mkv_methods[i]->name);
    return (int)len;
}

/* The raw dump must be the one the compressed dump was made from. */
static int match_reference(session *s, mkv_error *err)
{
    const mkv_dump_meta *r = s->m, *c = &s->cm->raw;
    struct { const char *name; int64_t raw, comp; } f[] = {
        {"n_layers", r->n_layers, c->n_layers}, {"n_heads", r->n_heads, c->n_heads},
        {"n_kv_heads", r->n_kv_heads, c->n_kv_heads}, {"head_dim", r->head_dim, c->head_dim},
        {"n_tokens", r->n_tokens, c->n_tokens}, {"queries", r->n_queries, c->n_queries},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].raw != f[i].comp)
            return mkv_fail(err, MKV_EFORMAT, "'%s' is not the dump '%s' was made from: %s is %" PRId64
                            " there, %" PRId64 " here", mkv_dump_path(s->raw), s->c_label, f[i].name,
                            f[i].raw, f[i].comp);
    int32_t *raw_pos = calloc((size_t)r->n_queries + 1, sizeof *raw_pos);
    if (!raw_pos)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    int rc = mkv_dump_read_query_pos(s->raw, raw_pos, err);
    for (int64_t w = 0; !rc && w < r->n_queries; w++)
        if (raw_pos[w] != s->query_pos[w])
            rc = mkv_fail(err, MKV_EFORMAT, "'%s' is not the dump '%s' was made from: query %" PRId64
                          " is at position %d there, %d here", mkv_dump_path(s->raw), s->c_label, w,
                          raw_pos[w], s->query_pos[w]);
    free(raw_pos);
    return rc;
}

static int open_inputs(const attend_args *a, session *s, mkv_error *err)
{
    s->c_label = strcmp(a->compressed, "-") == 0 ? "(stdin)" : a->compressed;
    int rc = mkv_cdump_open(a->compressed, &s->c, err);
    if (rc)
        return rc;
    s->cm = mkv_cdump_meta_of(s->c);
    s->method = mkv_method_find(s->cm->method);
    if (!s->method) {
        char names[512];
        method_names(names, sizeof names);
        return mkv_fail(err, MKV_EFORMAT, "'%s' was made with method '%s', which this build lacks (methods: %s)",
                        s->c_label, s->cm->method, names);
    }
    if ((rc = load_params(s, err)))
        return rc;
    if (a->budget) {
        if (!mkv_params_str(&s->params, "budget"))
            return mkv_fail(err, MKV_EUSAGE, "--budget: method '%s' has no token budget", s->method->name);
        if (mkv_params_set(&s->params, "budget", a->budget, err))
            return mkv_error_prefix(err, "--budget: method '%s'", s->method->name);
    }
    if (s->cm->raw.n_queries == 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s' has no queries to answer (capture some with --queries N)",
                        s->c_label);
    s->query_pos = calloc((size_t)s->cm->raw.n_queries, sizeof *s->query_pos);
    if (!s->query_pos)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    mkv_cdump_read_query_pos(s->c, s->query_pos, err);

    s->raw_path = a->reference ? a->reference : s->cm->source;
    if (!a->reference && (!s->raw_path[0] || strcmp(s->raw_path, "-") == 0))
        return mkv_fail(err, MKV_EUSAGE, "'%s' was compressed from standard input: give --reference RAW", s->c_label);
    if (strcmp(s->raw_path, "-") == 0 && strcmp(a->compressed, "-") == 0)
        return mkv_fail(err, MKV_EUSAGE, "COMPRESSED and --reference cannot both be standard input");
    if ((rc = mkv_dump_open(s->raw_path, &s->raw, err))) {
        if (!a->reference) {
            /* say where the name came from and how to give another */
            char msg[MKV_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s (the source recorded in '%s'; give --reference RAW)", err->msg, s->c_label);
            memcpy(err->msg, msg, sizeof msg);
        }
        return rc;
    }
    s->m = mkv_dump_meta_of(s->raw);
    if ((rc = match_reference(s, err)))
        return rc;
    if ((rc = s->method->check(&s->params, s->m, err)))
        return mkv_error_prefix(err, "method '%s'", s->method->name);
    return MKV_OK;
}

static void close_inputs(session *s)
{
    mkv_cdump_close(s->c);
    mkv_dump_close(s->raw);
    free(s->query_pos);
}

/* ------------------------------------------------------------ attention */

typedef struct {
    double rel_l2, recall;
    int64_t tokens;
    uint64_t bytes_read;
    int64_t cpu_tokens;
    double cpu_diff;
} row;

/* A batch of layers read from the raw dump, and the (layer, KV head) tasks
 * over it the workers share. */
typedef struct {
    const session *s;
    int first_layer, n_layers;
    float *k, *v;               /* [n_layers][n_kv_heads][T][d] */
    float *q;                   /* [n_layers][n_heads][W][d] */
    row *rows;                  /* [W][L][n_heads] for the whole dump */
    pthread_mutex_t mu;         /* the progress count */
    mkv_progress *progress;
    int64_t *done;
} batch;

/* Answer every query of one (layer, KV head) with the method and exactly. */
static int attend_head(const batch *b, int slot, int h, mkv_error *err)
{
    const session *s = b->s;
    const mkv_dump_meta *m = s->m;
    int layer = b->first_layer + slot, d = m->head_dim, G = m->n_heads / m->n_kv_heads;
    int64_t T = m->n_tokens, W = m->n_queries;
    size_t kv_head = (size_t)T * (size_t)d;
    const float *k = b->k + ((size_t)slot * (size_t)m->n_kv_heads + (size_t)h) * kv_head;
    const float *v = b->v + ((size_t)slot * (size_t)m->n_kv_heads + (size_t)h) * kv_head;
    const float *q = b->q + (size_t)slot * (size_t)m->n_heads * (size_t)W * (size_t)d;

    void *state = NULL;
    int rc = s->gpu && !s->check_cpu ? MKV_OK : s->method->load(&s->params, s->c, layer, h, &state, err);
    if (rc)
        return rc;
    const size_t gd = (size_t)G * (size_t)d;
    float *qbuf = malloc(sizeof(float) * gd);
    float *out = malloc(sizeof(float) * gd);
    float *exact = malloc(sizeof(float) * gd);
    double *probs = malloc(sizeof(double) * (size_t)G * (size_t)T);
    uint8_t *attended = malloc((size_t)T);
    /* GPU: every query of the head at once */
    float *gq = NULL, *gout = NULL, *cout = malloc(sizeof(float) * gd);
    uint8_t *gatt = NULL, *catt = malloc((size_t)T);
    uint64_t *gbytes = NULL;
    int64_t *gpos = NULL;
    if (!qbuf || !out || !exact || !probs || !attended || !cout || !catt)
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
    if (!rc && s->gpu) {
        gq = malloc(sizeof(float) * gd * (size_t)W);
        gout = malloc(sizeof(float) * gd * (size_t)W);
        gatt = calloc((size_t)W * (size_t)T, 1);
        gbytes = calloc((size_t)W, sizeof *gbytes);
        gpos = malloc(sizeof(int64_t) * (size_t)W);
        if (!gq || !gout || !gatt || !gbytes || !gpos)
            rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
        for (int64_t w = 0; w < W && !rc; w++) {
            gpos[w] = s->query_pos[w];
            for (int g = 0; g < G; g++)
                memcpy(gq + (size_t)w * gd + (size_t)g * (size_t)d,
                       q + ((size_t)(h * G + g) * (size_t)W + (size_t)w) * (size_t)d, sizeof(float) * (size_t)d);
        }
        if (!rc) {
            for (size_t i = 0; i < gd * (size_t)W; i++)
                gout[i] = NAN;
            mkv_gpu_queries gqs = {.G = G, .d = d, .T = T, .W = W, .q = gq, .pos = gpos};
            mkv_gpu_answers ga = {.out = gout, .attended = gatt, .bytes_read = gbytes};
            pthread_mutex_lock((pthread_mutex_t *)&s->gpu_mu);
            rc = mkv_gpu_method_attend(s->method, &s->params, s->c, layer, h, &gqs, &ga, err);
            pthread_mutex_unlock((pthread_mutex_t *)&s->gpu_mu);
            if (rc)
                mkv_error_prefix(err, "GPU");
        }
    }
    for (int64_t w = 0; w < W && !rc; w++) {
        int64_t pos = s->query_pos[w], n = pos + 1;
        for (int g = 0; g < G; g++)
            memcpy(qbuf + (size_t)g * (size_t)d, q + ((size_t)(h * G + g) * (size_t)W + (size_t)w) * (size_t)d,
                   sizeof(float) * (size_t)d);
        mkv_attend_query aq = {.G = G, .d = d, .q = qbuf, .pos = pos, .scale = 1.0 / sqrt((double)d)};
        mkv_attend_exact(k, v, d, &aq, exact, probs);
        memset(attended, 0, (size_t)T);
        for (size_t i = 0; i < gd; i++)
            out[i] = NAN;
        mkv_attend_result r = {.out = out, .attended = attended, .bytes_read = 0};
        int64_t cpu_tokens = 0;
        if (s->gpu) {
            memcpy(out, gout + (size_t)w * gd, sizeof(float) * gd);
            memcpy(attended, gatt + (size_t)w * (size_t)T, (size_t)T);
            r.bytes_read = gbytes[w];
            if (s->check_cpu) {
                memset(catt, 0, (size_t)T);
                mkv_attend_result cr = {.out = cout, .attended = catt, .bytes_read = 0};
                if ((rc = s->method->attend(state, &aq, &cr, err))) {
                    mkv_error_prefix(err, "query %" PRId64 " (position %" PRId64 "), CPU check", w, pos);
                    break;
                }
                for (int64_t t = 0; t < T; t++)
                    cpu_tokens += catt[t] != 0;
            }
        } else if ((rc = s->method->attend(state, &aq, &r, err))) {
            mkv_error_prefix(err, "query %" PRId64 " (position %" PRId64 ")", w, pos);
            break;
        } else if (s->check_cpu) {
            memcpy(cout, out, sizeof(float) * gd);
            for (int64_t t = 0; t < T; t++)
                cpu_tokens += attended[t] != 0;
        }
        int64_t bad = mkv_find_nonfinite(out, (size_t)G * (size_t)d);
        if (bad >= 0) {
            rc = mkv_fail(err, MKV_EFORMAT, "method '%s' gave a non-finite output for query %" PRId64
                          " (position %" PRId64 "), query head %" PRId64 ", channel %" PRId64,
                          s->method->name, w, pos, h * G + bad / d, bad % d);
            break;
        }
        int64_t tokens = 0;
        for (int64_t t = 0; t < T; t++) {
            if (attended[t] && t > pos) {
                rc = mkv_fail(err, MKV_EFORMAT, "method '%s' attended token %" PRId64 " after the position %"
                              PRId64 " of query %" PRId64, s->method->name, t, pos, w);
                break;
            }
            tokens += attended[t] != 0;
        }
        for (int g = 0; g < G && !rc; g++) {
            row *rw = &b->rows[((size_t)w * (size_t)m->n_layers + (size_t)layer) * (size_t)m->n_heads +
                               (size_t)(h * G + g)];
            rw->rel_l2 = mkv_rel_l2(out + (size_t)g * (size_t)d, exact + (size_t)g * (size_t)d, d);
            rw->recall = mkv_recall(probs + (size_t)g * (size_t)n, attended, n);
            rw->tokens = tokens;
            rw->bytes_read = r.bytes_read;
            rw->cpu_tokens = cpu_tokens;
            rw->cpu_diff = s->check_cpu ? mkv_rel_l2(out + (size_t)g * (size_t)d, cout + (size_t)g * (size_t)d, d) : 0;
        }
    }
    free(qbuf);
    free(out);
    free(exact);
    free(probs);
    free(attended);
    free(gq);
    free(gout);
    free(cout);
    free(catt);
    free(gatt);
    free(gbytes);
    free(gpos);
    if (state)
        s->method->free_state(state);
    return rc;
}

/* Task t of mkv_run_tasks: (layer slot t / n_kv_heads, KV head t % n_kv_heads). */
static int attend_task(void *ctx, int t, mkv_error *err)
{
    batch *b = ctx;
    int n_kv = b->s->m->n_kv_heads;
    int rc = attend_head(b, t / n_kv, t % n_kv, err);
    pthread_mutex_lock(&b->mu);
    mkv_progress_update(b->progress, ++*b->done);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int run_batch(batch *b, int threads, mkv_error *err)
{
    int n_kv = b->s->m->n_kv_heads, t;
    int rc = mkv_run_tasks(b->n_layers * n_kv, threads, attend_task, b, &t, err);
    if (rc != MKV_OK && t >= 0)
        mkv_error_prefix(err, "layer %d head %d", b->first_layer + t / n_kv, t % n_kv);
    return rc;
}

/* Fill rows [W][L][n_heads] for the whole dump. */
static int attend_all(const session *s, int threads, row *rows, mkv_error *err)
{
    const mkv_dump_meta *m = s->m;
    /* enough layers at once to give every thread a (layer, head) */
    int per_batch = (threads + m->n_kv_heads - 1) / m->n_kv_heads;
    if (per_batch > m->n_layers)
        per_batch = m->n_layers;
    size_t kv_layer, q_layer, kv_n, q_n;
    if (mkv_mul_size3((size_t)m->n_kv_heads, (size_t)m->n_tokens, (size_t)m->head_dim, &kv_layer) ||
        mkv_mul_size3((size_t)m->n_heads, (size_t)m->n_queries, (size_t)m->head_dim, &q_layer) ||
        mkv_mul_size(kv_layer, (size_t)per_batch, &kv_n) || mkv_mul_size(q_layer, (size_t)per_batch, &q_n))
        return mkv_fail(err, MKV_ENOMEM, "'%s': a layer is too large to hold in memory", mkv_dump_path(s->raw));
    batch b = {.s = s, .rows = rows};
    int64_t done = 0;
    mkv_progress progress;
    b.progress = &progress;
    b.done = &done;
    b.k = mkv_alloc(kv_n, sizeof(float), "keys", err);
    b.v = mkv_alloc(kv_n, sizeof(float), "values", err);
    b.q = mkv_alloc(q_n, sizeof(float), "queries", err);
    int rc = MKV_OK;
    if (!b.k || !b.v || !b.q)
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for %d layers of '%s'", per_batch, mkv_dump_path(s->raw));
    pthread_mutex_init(&b.mu, NULL);
    mkv_progress_start(&progress, "attending", (int64_t)m->n_layers * m->n_kv_heads);
    for (int l0 = 0; l0 < m->n_layers && !rc; l0 += per_batch) {
        b.first_layer = l0;
        b.n_layers = m->n_layers - l0 < per_batch ? m->n_layers - l0 : per_batch;
        /* all raw reading happens here, never while workers read the compressed dump */
        for (int i = 0; i < b.n_layers && !rc; i++)
            if ((rc = mkv_dump_read_finite(s->raw, l0 + i, 'k', 0, m->n_kv_heads, 0, m->n_tokens,
                                           b.k + i * kv_layer, err)) ||
                (rc = mkv_dump_read_finite(s->raw, l0 + i, 'v', 0, m->n_kv_heads, 0, m->n_tokens,
                                           b.v + i * kv_layer, err)) ||
                (rc = mkv_dump_read_finite(s->raw, l0 + i, 'q', 0, m->n_heads, 0, m->n_queries,
                                           b.q + i * q_layer, err)))
                break;
        if (!rc)
            rc = run_batch(&b, threads, err);
    }
    mkv_progress_finish(&progress);
    pthread_mutex_destroy(&b.mu);
    mkv_free(b.k);
    mkv_free(b.v);
    mkv_free(b.q);
    return rc;
}

/* ------------------------------------------------------------ output */

static void print_rows(FILE *fp, const session *s, const row *rows)
{
    const mkv_dump_meta *m = s->m;
    int G = m->n_heads / m->n_kv_heads;
    fputs(s->check_cpu ? ROW_HEADER CHECK_HEADER "\n" : ROW_HEADER "\n", fp);
    for (int64_t w = 0; w < m->n_queries; w++)
        for (int l = 0; l < m->n_layers; l++)
            for (int h = 0; h < m->n_heads; h++) {
                const row *r = &rows[((size_t)w * (size_t)m->n_layers + (size_t)l) * (size_t)m->n_heads + (size_t)h];
                fprintf(fp, "%" PRId64 "\t%d\t%d\t%d\t%d\t%.6g\t%.6f\t%" PRId64 "\t%" PRIu64, w,
                        s->query_pos[w], l, h, h / G, r->rel_l2, r->recall, r->tokens, r->bytes_read);
                if (s->check_cpu)
                    fprintf(fp, "\t%" PRId64 "\t%.3g", r->cpu_tokens, r->cpu_diff);
                fputc('\n', fp);
            }
}

static int print_summary(FILE *fp, const session *s, const row *rows, mkv_error *err)
{
    const mkv_dump_meta *m = s->m;
    int64_t n = m->n_queries * m->n_layers * m->n_heads;
    double *rel = malloc(sizeof(double) * (size_t)n);
    if (!rel)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    double recall = 0, tokens = 0, bytes = 0, dense = 0;
    for (int64_t i = 0; i < n; i++) {
        rel[i] = rows[i].rel_l2;
        recall += rows[i].recall;
        tokens += (double)rows[i].tokens;
        bytes += (double)rows[i].bytes_read;
        /* a dense float16 cache reads K and V of tokens 0..pos */
        int64_t w = i / ((int64_t)m->n_layers * m->n_heads);
        dense += (double)(s->query_pos[w] + 1) * m->head_dim * 2 * 2;
    }
    mkv_summary st;
    int fail = mkv_summarize(rel, n, &st);
    free(rel);
    if (fail)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    char params[sizeof s->cm->params];
    mkv_params_format(&s->params, params, sizeof params);
    fprintf(fp, SUMMARY_HEADER "\n");
    fprintf(fp, "%s\t%s\t%s\t%.4f\t%" PRIu64 "\t%" PRIu64 "\t%" PRId64 "\t%.6g\t%.6g\t%.6g\t%.6g\t%.6f\t%.2f\t%.1f\t%.1f\n",
            s->method->name, params[0] ? params : "-", s->gpu ? "gpu" : "cpu",
            (double)s->cm->logical_bytes / (double)s->cm->physical_bytes, s->cm->logical_bytes,
            s->cm->physical_bytes, n, st.mean, st.median, st.p90, st.max, recall / (double)n,
            tokens / (double)n, bytes / (double)n, dense / (double)n);
    return MKV_OK;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (strcmp(a, b) == 0)
        return 1;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0)
        return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Write the report to path atomically (temporary file, fsync, rename), so a
 * failed run never leaves a partial table under the name. */
static int write_report(const char *path, const attend_args *a, const session *s, const row *rows, mkv_error *err)
{
    if (!path) {
        int rc = a->summary_only ? print_summary(stdout, s, rows, err) : (print_rows(stdout, s, rows), MKV_OK);
        if (!rc && fflush(stdout) != 0)
            rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write standard output");
        return rc;
    }
    char *dcopy = strdup(path), *bcopy = strdup(path);
    size_t len = strlen(path) + 16;
    char *tmp = malloc(len);
    if (!dcopy || !bcopy || !tmp) {
        free(dcopy);
        free(bcopy);
        free(tmp);
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    snprintf(tmp, len, "%s/.%s.XXXXXX", dirname(dcopy), basename(bcopy));
    free(dcopy);
    free(bcopy);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return mkv_fail_errno(err, MKV_EIO, e, "cannot create '%s'", path);
    }
    mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    FILE *fp = fdopen(fd, "w");
    int rc = MKV_OK;
    if (!fp) {
        close(fd);
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write '%s'", path);
    } else {
        if (a->summary_only)
            rc = print_summary(fp, s, rows, err);
        else
            print_rows(fp, s, rows);
        if (!rc && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
            rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write '%s'", path);
        if (fclose(fp) != 0 && !rc)
            rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write '%s'", path);
    }
    if (!rc && rename(tmp, path) != 0)
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write '%s'", path);
    if (rc)
        unlink(tmp);
    free(tmp);
    return rc;
}

/* The device of a run: the GPU when it can and was not ruled out. */
static int choose_device(const attend_args *a, session *s, mkv_error *err)
{
    if (a->common.device == MKV_DEVICE_CPU)
        return MKV_OK;
    char why[256];
    int usable = mkv_gpu_method_usable(s->method, &s->params, s->m, why, sizeof why);
    if (usable > 0) {
        s->gpu = 1;
        return MKV_OK;
    }
    if (a->common.device == MKV_DEVICE_GPU)
        return mkv_fail(err, MKV_EUNSUP, "--device gpu: %s (use --device cpu or auto)", why);
    /* auto: expected on a machine without a GPU; worth a word when one is there */
    if (usable < 0)
        mkv_warn("%s; attending on the CPU", why);
    else
        mkv_info("%s; attending on the CPU", why);
    return MKV_OK;
}

/* --bench: the GPU benchmark to -o FILE (written whole, then renamed) or stdout. */
static int run_bench(const attend_args *a, mkv_error *err)
{
    mkv_gpu_info info[1];
    int count = 0;
    if (!mkv_cuda_built())
        return mkv_fail(err, MKV_EUNSUP, "--bench: this build has no CUDA");
    if (mkv_cuda_devices(info, 1, &count, err) != MKV_OK)
        return err->code;
    if (count == 0 || !info[0].usable)
        return mkv_fail(err, MKV_EGPU, "--bench: %s", count == 0 ? "no GPU is visible" : "the GPU is not a target of this build");
    FILE *fp = stdout;
    char *tmp = NULL;
    if (a->output) {
        size_t len = strlen(a->output) + 16;
        char *dcopy = strdup(a->output), *bcopy = strdup(a->output);
        tmp = malloc(len);
        if (!dcopy || !bcopy || !tmp) {
            free(dcopy);
            free(bcopy);
            free(tmp);
            return mkv_fail(err, MKV_ENOMEM, "out of memory");
        }
        snprintf(tmp, len, "%s/.%s.XXXXXX", dirname(dcopy), basename(bcopy));
        free(dcopy);
        free(bcopy);
        int fd = mkstemp(tmp);
        if (fd < 0 || !(fp = fdopen(fd, "w"))) {
            int e = errno;
            if (fd >= 0)
                close(fd);
            free(tmp);
            return mkv_fail_errno(err, MKV_EIO, e, "cannot create '%s'", a->output);
        }
    }
    mkv_info("benchmark on %s", info[0].name);
    int rc = mkv_bench_attention(&a->bo, fp, a->common.verbosity > MKV_LOG_ERROR ? stderr : NULL, err);
    if (!rc && fflush(fp) != 0)
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write '%s'", a->output ? a->output : "standard output");
    if (tmp) {
        if (fclose(fp) != 0 && !rc)
            rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write '%s'", a->output);
        if (!rc && rename(tmp, a->output) != 0)
            rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write '%s'", a->output);
        if (rc)
            unlink(tmp);
        free(tmp);
    }
    return rc;
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    attend_args a;
    parse_args(argc, argv, &a);
    if (a.bench) {
        mkv_error berr;
        mkv_error_clear(&berr);
        int brc = run_bench(&a, &berr);
        if (brc)
            mkv_report(&berr);
        return mkv_exit_code(brc);
    }

    mkv_error err;
    mkv_error_clear(&err);
    session s;
    memset(&s, 0, sizeof s);
    row *rows = NULL;
    pthread_mutex_init(&s.gpu_mu, NULL);
    s.check_cpu = a.check_cpu;
    int rc = open_inputs(&a, &s, &err);
    if (!rc)
        rc = choose_device(&a, &s, &err);
    if (!rc && a.output && (same_file(a.output, a.compressed) || same_file(a.output, s.raw_path)))
        rc = mkv_fail(&err, MKV_EUSAGE, "output '%s' would overwrite an input", a.output);
    if (!rc) {
        const mkv_dump_meta *m = s.m;
        rows = calloc((size_t)m->n_queries * (size_t)m->n_layers * (size_t)m->n_heads, sizeof *rows);
        if (!rows)
            rc = mkv_fail(&err, MKV_ENOMEM, "out of memory for the result table");
    }
    if (!rc) {
        int threads = a.common.threads ? a.common.threads : mkv_ncpus();
        mkv_info("%s: method %s, reference %s, %d threads on the CPU%s", s.c_label, s.method->name,
                 mkv_dump_path(s.raw), threads, s.gpu ? ", attention on the GPU" : "");
        rc = attend_all(&s, threads, rows, &err);
    }
    if (!rc)
        rc = write_report(a.output, &a, &s, rows, &err);
    if (!rc && !a.summary_only && a.common.verbosity > MKV_LOG_ERROR)
        rc = print_summary(stderr, &s, rows, &err);
    if (rc)
        mkv_report(&err);
    free(rows);
    close_inputs(&s);
    pthread_mutex_destroy(&s.gpu_mu);
    return mkv_exit_code(rc);
}
