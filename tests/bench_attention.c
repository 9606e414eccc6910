/* Driver for the GPU attention benchmark (mkv_bench_attention in
 * kernels/mkv_cuda.h) until mkv-attend --bench calls it; used by
 * scripts/bench-gpu.
 *
 *   tests/bench_attention                     # all defaults, TSV to stdout
 *   tests/bench_attention -o bench.tsv --contexts 128K,256K --batches 4
 *   tests/bench_attention --variant --budgets 0.1 --runs 50
 *   tests/bench_attention --methods full,mosaic -P keep=0.125,segment=8K
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mkv.h"
#include "gpu/bench_options.h"
#include "methods/method.h"
#include "mkv_cuda.h"

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "usage: bench_attention [options]\n"
            "  -o FILE           TSV output (default stdout)\n"
            "  --contexts LIST   tokens per request, e.g. 32K,128K,1M (default 32K,128K,256K,512K,1M)\n"
            "  --batches LIST    requests per step (default 1,4,8)\n"
            "  --budgets LIST    token budgets of quest and mosaic (default 0.0625,0.1,0.125,0.25)\n"
            "  --methods LIST    of full, quest, mosaic (default full,quest,mosaic)\n"
            "  -P KEY=VAL,...    method parameters: keep, keydim, segment, block, page, sink, recent\n"
            "  --heads Q/KV      query and KV heads (default 32/8)\n"
            "  --head-dim D      64 or 128 (default 128)\n"
            "  --fp16            fp16 K/V instead of bf16\n"
            "  --runs N          timed steps per measurement (default 30)\n"
            "  --warmup N        untimed steps first (default 5)\n"
            "  --variant         also time the other build of the full (dense) kernel\n"
            "  --mem-fraction F  share of free device memory to use (default 0.9)\n"
            "  -q                no progress lines on stderr\n"
            "  -h, --help        this help\n");
    exit(status);
}

static void misuse(const char *msg, const char *arg)
{
    fprintf(stderr, "bench_attention: %s '%s' (try --help)\n", msg, arg);
    exit(2);
}

static void refuse(const char *msg)
{
    fprintf(stderr, "bench_attention: %s (try --help)\n", msg);
    exit(2);
}

/* "32K" -> 32768, "1M" -> 1048576. */
static long long parse_size(const char *s)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s)
        misuse("bad size", s);
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end != '\0' || v <= 0)
        misuse("bad size", s);
    return v;
}

static int split_list(char *arg, char **items, int max)
{
    int n = 0;
    for (char *tok = strtok(arg, ","); tok; tok = strtok(NULL, ",")) {
        if (n == max)
            misuse("too many list entries in", tok);
        items[n++] = tok;
    }
    if (n == 0)
        misuse("empty list", arg);
    return n;
}

int main(int argc, char **argv)
{
    enum { O_CONTEXTS = 256, O_BATCHES, O_BUDGETS, O_HEADS, O_HEAD_DIM, O_FP16, O_RUNS, O_WARMUP, O_VARIANT,
           O_METHODS, O_MEM };
    static const struct option longopts[] = {
        {"contexts", required_argument, NULL, O_CONTEXTS}, {"batches", required_argument, NULL, O_BATCHES},
        {"budgets", required_argument, NULL, O_BUDGETS},   {"heads", required_argument, NULL, O_HEADS},
        {"head-dim", required_argument, NULL, O_HEAD_DIM}, {"fp16", no_argument, NULL, O_FP16},
        {"runs", required_argument, NULL, O_RUNS},         {"warmup", required_argument, NULL, O_WARMUP},
        {"variant", no_argument, NULL, O_VARIANT},         {"methods", required_argument, NULL, O_METHODS},
        {"mem-fraction", required_argument, NULL, O_MEM},  {"param", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    mkv_bench_opts o;
    mkv_bench_opts_default(&o);
    mkv_bench_params bp;
    mkv_error err = {0};
    const char *out_path = NULL, *params[MKV_BENCH_MAX_LIST];
    int quiet = 0, variant = 0, n_params = 0, c;
    char *items[MKV_BENCH_MAX_LIST];
    while ((c = getopt_long(argc, argv, "o:qhP:", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': out_path = optarg; break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout, 0); break;
        case O_CONTEXTS:
            o.n_contexts = split_list(optarg, items, MKV_BENCH_MAX_LIST);
            for (int i = 0; i < o.n_contexts; i++)
                o.contexts[i] = parse_size(items[i]);
            break;
        case O_BATCHES:
            o.n_batches = split_list(optarg, items, MKV_BENCH_MAX_LIST);
            for (int i = 0; i < o.n_batches; i++)
                o.batches[i] = (int)parse_size(items[i]);
            break;
        case O_BUDGETS:
            o.n_budgets = split_list(optarg, items, MKV_BENCH_MAX_LIST);
            for (int i = 0; i < o.n_budgets; i++) {
                char *end = NULL;
                o.budgets[i] = strtod(items[i], &end);
                if (end == items[i] || *end || !(o.budgets[i] > 0))
                    misuse("bad budget", items[i]);
            }
            break;
        case O_HEADS:
            if (sscanf(optarg, "%d/%d", &o.n_heads, &o.n_kv_heads) != 2 || o.n_heads < 1 || o.n_kv_heads < 1)
                misuse("bad heads (want Q/KV)", optarg);
            break;
        case O_HEAD_DIM: o.head_dim = (int)parse_size(optarg); break;
        case O_FP16: o.is_bf16 = 0; break;
        case O_RUNS: o.runs = (int)parse_size(optarg); break;
        case O_WARMUP: o.warmup = atoi(optarg); break;
        case O_VARIANT: variant = 1; break;
        case O_METHODS:
            if (mkv_bench_parse_methods(optarg, &o.methods, &err) != MKV_OK)
                refuse(err.msg);
            break;
        case 'P':
            if (n_params == MKV_BENCH_MAX_LIST)
                misuse("too many -P options at", optarg);
            params[n_params++] = optarg;
            break;
        case O_MEM: o.mem_fraction = atof(optarg); break;
        default:
            fprintf(stderr, "bench_attention: bad option (try --help)\n");
            return 2;
        }
    }
    if (optind < argc)
        misuse("unexpected argument", argv[optind]);
    if (variant)
        o.methods |= MKV_BENCH_DENSE_VARIANT;
    /* after --head-dim, which the default of keydim is a fraction of */
    if (mkv_bench_params_init(&bp, &o, &err) != MKV_OK) {
        fprintf(stderr, "bench_attention: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < n_params; i++)
        if (mkv_params_parse_list(&bp.params, params[i], &err) < 0)
            refuse(err.msg);
    if (mkv_bench_params_apply(&bp, &o, &err) != MKV_OK)
        refuse(err.msg);
    FILE *tsv = stdout;
    if (out_path && !(tsv = fopen(out_path, "w"))) {
        fprintf(stderr, "bench_attention: cannot open '%s': %s\n", out_path, strerror(errno));
        return 1;
    }
    int rc = mkv_bench_attention(&o, tsv, quiet ? NULL : stderr, &err);
    if (tsv != stdout && fclose(tsv) != 0 && rc == MKV_OK)
        rc = mkv_fail(&err, MKV_EIO, "cannot write '%s'", out_path);
    if (rc != MKV_OK) {
        fprintf(stderr, "bench_attention: %s\n", err.msg);
        return mkv_exit_code((mkv_status)rc);
    }
    return 0;
}
