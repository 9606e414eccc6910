/* mkv-attend: run attention for a dump's queries over a compressed cache
 * and measure it against exact attention over the raw dump
 * (lib/methods/evaluate.h), or benchmark the GPU kernels (--bench).
 *
 * Examples:
 *   mkv-attend kv-mosaic.h5 > fidelity.tsv             # reference: the recorded source
 *   mkv-attend kv-mosaic.h5 --reference kv.h5 -o fidelity.tsv
 *   mkv-attend kv-quest.h5 --summary                    # one-row summary TSV only
 *   mkv-attend kv-quest.h5 --summary --budget 0.05 | tail -n 1
 *   for m in full quest mosaic; do mkv-attend kv-$m.h5 --summary | tail -n 1; done
 *   mkv-attend kv-mosaic.h5 --device gpu --summary        # the GPU kernels (mosaic, uniform2d, quest, full)
 *   mkv-attend --bench -o bench.tsv                        # GPU benchmark, synthetic LLaMA-3.1-8B caches
 *   mkv-attend --bench --contexts 256K --batches 4 --budgets 0.1 --methods full,mosaic -P keep=0.125
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/outfile.h"
#include "core/mkv.h"
#include "gpu/bench_options.h"
#include "gpu/gpu_method.h"
#include "methods/evaluate.h"
#include "methods/method.h"
#include "mkv_cuda.h"

enum {
    OPT_SUMMARY = MKV_OPT_FIRST_TOOL, OPT_BUDGET, OPT_BENCH, OPT_CONTEXTS, OPT_BATCHES, OPT_BUDGETS, OPT_RUNS,
    OPT_WARMUP, OPT_METHODS, OPT_VARIANT, OPT_CHECK_CPU, OPT_HEADS, OPT_HEAD_DIM, OPT_FP16, OPT_MEM_FRACTION, OPT_BLOCKKEY_BITS,
    OPT_OLD_KEEP, OPT_OLD_DPRIME, OPT_OLD_SEGMENT, OPT_OLD_BLOCK
};

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    MKV_THREADS_LONGOPT,
    MKV_DEVICE_LONGOPT,
    {"output", required_argument, NULL, 'o'},
    {"reference", required_argument, NULL, 'r'},
    {"summary", no_argument, NULL, OPT_SUMMARY},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"check-cpu", no_argument, NULL, OPT_CHECK_CPU},
    {"bench", no_argument, NULL, OPT_BENCH},
    {"contexts", required_argument, NULL, OPT_CONTEXTS},
    {"batches", required_argument, NULL, OPT_BATCHES},
    {"budgets", required_argument, NULL, OPT_BUDGETS},
    {"methods", required_argument, NULL, OPT_METHODS},
    {"variant", no_argument, NULL, OPT_VARIANT},
    {"param", required_argument, NULL, 'P'},
    {"runs", required_argument, NULL, OPT_RUNS},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"heads", required_argument, NULL, OPT_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"fp16", no_argument, NULL, OPT_FP16},
    {"mem-fraction", required_argument, NULL, OPT_MEM_FRACTION},
    {"blockkey-bits", required_argument, NULL, OPT_BLOCKKEY_BITS},
    /* spellings that moved to -P, kept to say so */
    {"keep", optional_argument, NULL, OPT_OLD_KEEP},
    {"dprime", optional_argument, NULL, OPT_OLD_DPRIME},
    {"segment", optional_argument, NULL, OPT_OLD_SEGMENT},
    {"block", optional_argument, NULL, OPT_OLD_BLOCK},
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "o:r:P:"

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s COMPRESSED [--reference RAW] [-o OUT.tsv] [--summary] [options]\n"
            "       %s --bench [-o BENCH.tsv] [benchmark options]\n\n"
            "Answer every query of the dump with the compressed cache COMPRESSED (made by\n"
            "mkv-compress) and with exact attention over the raw dump RAW, and report the\n"
            "fidelity per query x layer x query head as TSV:\n"
            "  " MKV_EVAL_ROW_HEADER "\n"
            "rel_l2 is ||o - o_exact|| / ||o_exact||, recall the exact softmax mass of the\n"
            "tokens the method attended, bytes_read what the step read of the KV head's\n"
            "compressed state (shared by the query heads of the group).\n"
            "A one-row summary TSV follows on stderr (unless -q):\n"
            "  " MKV_EVAL_SUMMARY_HEADER "\n\n"
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
            "      --budgets LIST   token budgets of quest and mosaic (default 0.0625,0.1,0.125,0.25)\n"
            "      --methods LIST   of full, quest, mosaic (default full,quest,mosaic)\n"
            "      --variant        also time the other build of the full (dense) kernel\n"
            "      --blockkey-bits LIST  mosaic's block keys scored as fp16 (16) and/or\n"
            "                       8-bit codes with a scale per row (8; rows mosaic-bk8)\n"
            "                       (default 16)\n"
            "  -P, --param KEY=VAL[,KEY=VAL...]\n"
            "                       parameters of the methods, as mkv-compress names them:\n"
            "                       mosaic: keep (default 0.25), keydim (d' = keydim x\n"
            "                       head_dim, default 0.5), segment (default 4096), block\n"
            "                       (1, 2, 4, 8 or 16, default 8); quest: page (default 16);\n"
            "                       both: sink (default 4), recent (default 64)\n"
            "      --runs N         timed steps per measurement (default 30)\n"
            "      --warmup N       untimed steps first (default 5)\n"
            "      --heads Q/KV     query and KV heads (default 32/8)\n"
            "      --head-dim D     64 or 128 (default 128)\n"
            "      --fp16           fp16 K/V instead of bf16\n"
            "      --mem-fraction F share of the free device memory to use (default 0.9)\n"
            "  The default shape is LLaMA-3.1-8B's: 32 query heads, 8 KV heads, head_dim 128, bf16.\n\n",
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
    int variant;
    mkv_bench_params bench_params;
    const char *bench_param_args[MKV_BENCH_MAX_LIST];  /* -P, read once the shape is known */
    int n_bench_params;
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

static void parse_args(int argc, char **argv, attend_args *a)
{
    memset(a, 0, sizeof *a);
    mkv_common_init(&a->common);
    mkv_bench_opts_default(&a->bo);
    mkv_error perr;
    opterr = 0;   /* bad_option prints the one-line message */
    int opt;
    double budget, list[MKV_BENCH_MAX_LIST];
    long v;
    while ((opt = getopt_long(argc, argv, SHORTOPTS, longopts, NULL)) != -1) {
        switch (opt) {
        MKV_TOOL_STANDARD_CASES
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
        case OPT_CHECK_CPU:
            a->check_cpu = 1;
            break;
        case OPT_BENCH:
            a->bench = 1;
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
        case OPT_METHODS:
            if (mkv_bench_parse_methods(optarg, &a->bo.methods, &perr)) {
                mkv_usage_error("%s", perr.msg);
                exit(2);
            }
            a->bench_opt_seen = 1;
            break;
        case OPT_VARIANT:
            a->variant = 1;
            a->bench_opt_seen = 1;
            break;
        case OPT_BLOCKKEY_BITS: {
            const int n = parse_list(optarg, "blockkey-bits", 0, 8, 16, list);
            if (n > 2 || (n == 2 && list[0] == list[1])) {
                mkv_usage_error("invalid value '%s' for --blockkey-bits: 16, 8 or both", optarg);
                exit(2);
            }
            for (int i = 0; i < n; i++) {
                if (list[i] != 16 && list[i] != 8) {
                    mkv_usage_error("invalid value '%s' for --blockkey-bits: 16, 8 or both", optarg);
                    exit(2);
                }
                a->bo.blockkey_bits[i] = (int)list[i];
            }
            a->bo.n_blockkey_bits = n;
            a->bench_opt_seen = 1;
            break;
        }
        case 'P':
            if (a->n_bench_params == MKV_BENCH_MAX_LIST)
                misuse("too many -P options");
            a->bench_param_args[a->n_bench_params++] = optarg;
            a->bench_opt_seen = 1;
            break;
        case OPT_HEADS: {
            char extra;
            if (sscanf(optarg, "%d/%d%c", &a->bo.n_heads, &a->bo.n_kv_heads, &extra) != 2 || a->bo.n_heads < 1 ||
                a->bo.n_kv_heads < 1 || a->bo.n_heads > 1024 || a->bo.n_heads % a->bo.n_kv_heads) {
                mkv_usage_error("invalid value '%s' for --heads: expected Q/KV, KV dividing Q (e.g. 32/8)", optarg);
                exit(2);
            }
            a->bench_opt_seen = 1;
            break;
        }
        case OPT_HEAD_DIM:
            if (mkv_parse_int(optarg, "head-dim", 64, 128, &v))
                exit(2);
            if (v != 64 && v != 128) {
                mkv_usage_error("invalid value '%s' for --head-dim: expected 64 or 128", optarg);
                exit(2);
            }
            a->bo.head_dim = (int)v;
            a->bench_opt_seen = 1;
            break;
        case OPT_FP16:
            a->bo.is_bf16 = 0;
            a->bench_opt_seen = 1;
            break;
        case OPT_MEM_FRACTION:
            if (mkv_parse_double(optarg, "mem-fraction", 0.01, 1, &a->bo.mem_fraction))
                exit(2);
            a->bench_opt_seen = 1;
            break;
        case OPT_RUNS:
        case OPT_WARMUP: {
            int runs = opt == OPT_RUNS;
            if (mkv_parse_int(optarg, runs ? "runs" : "warmup", runs ? 1 : 0, 10000, &v))
                exit(2);
            *(runs ? &a->bo.runs : &a->bo.warmup) = (int)v;
            a->bench_opt_seen = 1;
            break;
        }
        case OPT_OLD_KEEP:
            mkv_renamed_option("--keep", "-P keep");
        case OPT_OLD_DPRIME:
            mkv_renamed_option("--dprime", "-P keydim");
        case OPT_OLD_SEGMENT:
            mkv_renamed_option("--segment", "-P segment");
        case OPT_OLD_BLOCK:
            mkv_renamed_option("--block", "-P block");
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
        if (a->variant)
            a->bo.methods |= MKV_BENCH_DENSE_VARIANT;
        /* after --head-dim, which the default of keydim is a fraction of */
        if (mkv_bench_params_init(&a->bench_params, &a->bo, &perr))
            misuse(perr.msg);
        for (int i = 0; i < a->n_bench_params; i++)
            if (mkv_params_parse_list(&a->bench_params.params, a->bench_param_args[i], &perr) < 0) {
                mkv_usage_error("%s", perr.msg);
                exit(2);
            }
        if (mkv_bench_params_apply(&a->bench_params, &a->bo, &perr))
            misuse(perr.msg);
        return;
    }
    if (a->bench_opt_seen)
        misuse("benchmark options (--contexts, --batches, --budgets, --methods, --variant, -P, --runs, "
               "--warmup, --heads, --head-dim, --fp16, --mem-fraction, --blockkey-bits) need --bench");
    if (optind >= argc)
        misuse("missing COMPRESSED (a dump made by mkv-compress)");
    if (argc - optind > 1) {
        char what[300];
        snprintf(what, sizeof what, "too many operands ('%s' after COMPRESSED)", argv[optind + 1]);
        misuse(what);
    }
    a->compressed = argv[optind];
}

/* ------------------------------------------------------------ output */

/* Finish an output: rc is the run's status so far, the result the final one. */
static int output_close(mkv_outfile *o, int rc, mkv_error *err)
{
    if (rc) {
        mkv_outfile_abort(o);
        return rc;
    }
    return mkv_outfile_commit(o, err);
}

static int write_report(const attend_args *a, const mkv_eval *e, const mkv_eval_row *rows, mkv_error *err)
{
    mkv_outfile o;
    int rc = mkv_outfile_open(&o, a->output ? a->output : "-", NULL, 0, err);
    if (rc)
        return rc;
    if (a->summary_only)
        rc = mkv_eval_print_summary(mkv_outfile_fp(&o), e, rows, err);
    else
        mkv_eval_print_rows(mkv_outfile_fp(&o), e, rows);
    return output_close(&o, rc, err);
}

/* ------------------------------------------------------------ runs */

/* The device of a run: the GPU when it can and was not ruled out. */
static int choose_device(const attend_args *a, mkv_eval *e, mkv_error *err)
{
    if (a->common.device == MKV_DEVICE_CPU)
        return MKV_OK;
    char why[256];
    int usable = mkv_gpu_method_usable(e->method, &e->params, e->m, why, sizeof why);
    if (usable > 0) {
        e->device = mkv_gpu_method_attend;
        e->device_name = "gpu";
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

/* --bench: the GPU benchmark to -o FILE or stdout. */
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
    mkv_outfile o;
    int rc = mkv_outfile_open(&o, a->output ? a->output : "-", NULL, 0, err);
    if (rc)
        return rc;
    mkv_info("benchmark on %s", info[0].name);
    rc = mkv_bench_attention(&a->bo, mkv_outfile_fp(&o), a->common.verbosity > MKV_LOG_ERROR ? stderr : NULL, err);
    return output_close(&o, rc, err);
}

/* Evaluate the compressed dump a->compressed. */
static int run_eval(const attend_args *a, mkv_error *err)
{
    mkv_eval e;
    mkv_eval_row *rows = NULL;
    mkv_eval_inputs in = {.compressed = a->compressed, .reference = a->reference, .budget = a->budget,
                          .check_cpu = a->check_cpu};
    int rc = mkv_eval_open(&e, &in, err);
    if (!rc)
        rc = choose_device(a, &e, err);
    if (!rc && a->output && (mkv_outfile_overwrites(a->output, a->compressed) || mkv_outfile_overwrites(a->output, e.raw_path)))
        rc = mkv_fail(err, MKV_EUSAGE, "output '%s' would overwrite an input", a->output);
    if (!rc && !(rows = calloc((size_t)mkv_eval_n_rows(&e), sizeof *rows)))
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for the result table");
    if (!rc) {
        int threads = a->common.threads ? a->common.threads : mkv_ncpus();
        mkv_info("%s: method %s, reference %s, %d threads on the CPU%s", e.c_label, e.method->name,
                 mkv_dump_path(e.raw), threads, e.device ? ", attention on the GPU" : "");
        rc = mkv_eval_run(&e, threads, rows, err);
    }
    if (!rc)
        rc = write_report(a, &e, rows, err);
    if (!rc && !a->summary_only && a->common.verbosity > MKV_LOG_ERROR)
        rc = mkv_eval_print_summary(stderr, &e, rows, err);
    free(rows);
    mkv_eval_close(&e);
    return rc;
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    attend_args a;
    parse_args(argc, argv, &a);
    mkv_error err;
    mkv_error_clear(&err);
    int rc = a.bench ? run_bench(&a, &err) : run_eval(&a, &err);
    if (rc)
        mkv_report(&err);
    return mkv_exit_code(rc);
}
