/* mkv-capture: make KV dumps (mosaickv-dump v1): seeded synthetic ones, or
 * imported from safetensors, vLLM per-layer files or .npy.
 *
 * Examples:
 *   mkv-capture --synthetic -o kv.h5                 # 2 layers, 8/2 heads, d 64, 1K tokens
 *   mkv-capture --synthetic --layers 4 --heads 32 --kv-heads 8 --head-dim 128 \
 *               --tokens 8K --queries 32 --seed 7 -o kv.h5
 *   mkv-capture --synthetic --param 'rank=16 outliers=2' --dtype f32 -o kv.h5
 *   mkv-capture --synthetic --tokens 4K -o - | mkv-analyze check -
 *   mkv-capture --import cache.safetensors --heads 32 --model llama-3.1-8b -o kv.h5
 *   mkv-capture --import vllm_kv/ --heads 32 --rope-theta 500000 -o kv.h5
 *   mkv-capture --import kv.npy --k-rope pre --dtype bf16 -o kv.h5
 *
 * Each source is a mode; capture from a model (issue 3) becomes one more:
 * a MODEL operand, handled where main() rejects operands today.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dump.h"
#include "import.h"
#include "log.h"
#include "mkv.h"
#include "synthetic.h"

enum {
    OPT_SYNTHETIC = MKV_OPT_FIRST_TOOL,
    OPT_IMPORT,
    OPT_FORMAT,
    OPT_K_ROPE,
    OPT_LAYERS,
    OPT_HEADS,
    OPT_KV_HEADS,
    OPT_HEAD_DIM,
    OPT_TOKENS,
    OPT_QUERIES,
    OPT_SEED,
    OPT_PARAM,
    OPT_ROPE_THETA,
    OPT_MODEL,
    OPT_DTYPE,
    OPT_DEFLATE,
    OPT_CHUNK
};

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    {"output", required_argument, NULL, 'o'},
    {"synthetic", no_argument, NULL, OPT_SYNTHETIC},
    {"import", required_argument, NULL, OPT_IMPORT},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"k-rope", required_argument, NULL, OPT_K_ROPE},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"heads", required_argument, NULL, OPT_HEADS},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"queries", required_argument, NULL, OPT_QUERIES},
    {"seed", required_argument, NULL, OPT_SEED},
    {"param", required_argument, NULL, OPT_PARAM},
    {"rope-theta", required_argument, NULL, OPT_ROPE_THETA},
    {"model", required_argument, NULL, OPT_MODEL},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"deflate", required_argument, NULL, OPT_DEFLATE},
    {"chunk", required_argument, NULL, OPT_CHUNK},
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "o:"

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s --synthetic [options] -o FILE\n"
            "       %s --import SRC [options] -o FILE\n\n"
            "Make a KV dump (mosaickv-dump v1, see mosaickv(5)). FILE '-' is stdout.\n\n"
            "Modes:\n"
            "      --synthetic      seeded synthetic dump that resembles real KV (see\n"
            "                       mkv-capture(1) for the model)\n"
            "      --import SRC     import SRC: safetensors file, vLLM directory or .npy\n\n"
            "Output:\n"
            "  -o, --output FILE    write the dump to FILE (required)\n"
            "      --dtype T        f32, f16 or bf16 (default f16)\n"
            "      --deflate N      zlib level 0..9, 0 = none (default 4)\n"
            "      --chunk N        chunk length along tokens (default 1K)\n"
            "      --model NAME     model attribute (default: synthetic / SRC's name)\n"
            "      --rope-theta X   RoPE base (default 10000)\n\n"
            "Shape (synthetic; for --import they override or fill in the source's):\n"
            "      --layers N       layers (default 2)\n"
            "      --heads N        query heads (default 8; import: as many as KV heads)\n"
            "      --kv-heads N     KV heads, divides --heads (default 2)\n"
            "      --head-dim N     channels per head, even (default 64)\n"
            "      --tokens N       context length T, K/M suffixes (default 1K)\n"
            "      --queries N      queries at positions T-N..T-1 (default 16)\n"
            "      --seed N         random seed, 0..2^64-1 (default 1)\n"
            "      --param K=V      set a model parameter (repeatable; 'K=V K=V' works):\n"
            "                       rank, noise, outliers, outlier_scale, region_len,\n"
            "                       region_sigma, value_sigma, targets, sink,\n"
            "                       recent_window, salience, query_content, attn_mass\n\n"
            "Import:\n"
            "      --format F       auto, safetensors, vllm or npy (default auto)\n"
            "      --k-rope R       keys in SRC are post- or pre-RoPE (default post)\n\n",
            mkv_progname(), mkv_progname());
    fputs(MKV_COMMON_USAGE, fp);
    exit(status);
}

static void misuse(const char *what)
{
    mkv_usage_error("%s; try '%s --help'", what, mkv_progname());
    exit(2);
}

/* Say which option getopt_long just rejected, as the user wrote it. glibc
 * leaves optopt 0 for an unknown long option and sets it to the option's
 * value for a long option given a value it does not take. */
static void bad_option(int opt, char **argv)
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
    else if (!is_short || strchr(SHORTOPTS, optopt))
        snprintf(what, sizeof what, "option '%.*s' takes no value", name_len, arg);
    else
        snprintf(what, sizeof what, "unknown option '-%c'", optopt);
    misuse(what);
}

/* What the command line asked for; given[] records which options were
 * used, so an option of the other mode is refused rather than ignored. */
typedef struct {
    int synthetic;
    const char *import_src;
    const char *output;
    mkv_synthetic_params syn;
    mkv_import_opts imp;
    mkv_dump_write_opts wo;
    mkv_dtype dtype;
    double rope_theta;
    const char *model;
    int given[OPT_CHUNK + 1];
} capture_args;

static long parse_int_or_exit(const char *arg, const char *name, long lo, long hi)
{
    long v;
    if (mkv_parse_int(arg, name, lo, hi, &v))
        exit(2);
    return v;
}

static int64_t parse_size_or_exit(const char *arg, const char *name, int64_t lo, int64_t hi)
{
    int64_t v;
    if (mkv_parse_size(arg, name, lo, hi, &v))
        exit(2);
    return v;
}

static uint64_t parse_seed(const char *arg)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (end == arg || *end || errno || arg[strspn(arg, " \t")] == '-') {
        mkv_usage_error("invalid value '%s' for --seed: expected an integer in 0..18446744073709551615", arg);
        exit(2);
    }
    return (uint64_t)v;
}

/* --param 'K=V K=V ...' */
static void parse_params(mkv_synthetic_params *p, const char *arg)
{
    char *copy = strdup(arg);
    if (!copy) {
        mkv_usage_error("out of memory");
        exit(1);
    }
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        mkv_error err;
        mkv_error_clear(&err);
        if (!eq) {
            mkv_usage_error("invalid value '%s' for --param: expected KEY=VALUE", tok);
            exit(2);
        }
        *eq = '\0';
        if (mkv_synthetic_set(p, tok, eq + 1, &err) != MKV_OK) {
            mkv_usage_error("--param: %s", err.msg);
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

static const char *option_name(int opt)
{
    for (const struct option *o = longopts; o->name; o++)
        if (o->val == opt)
            return o->name;
    return "?";
}

/* Refuse options that belong to the other mode. */
static void refuse_options(const capture_args *a, const int *opts, int n, const char *mode)
{
    for (int i = 0; i < n; i++)
        if (a->given[opts[i]]) {
            char what[160];
            snprintf(what, sizeof what, "--%s is not an option of %s", option_name(opts[i]), mode);
            misuse(what);
        }
}

static void parse_args(int argc, char **argv, capture_args *a)
{
    memset(a, 0, sizeof *a);
    mkv_synthetic_params_init(&a->syn);
    mkv_import_opts_init(&a->imp);
    mkv_dump_write_opts_init(&a->wo);
    a->dtype = MKV_DTYPE_F16;
    a->rope_theta = 10000.0;
    mkv_common_opts common;
    mkv_common_init(&common);

    opterr = 0;   /* bad_option prints the one-line message */
    int opt;
    while ((opt = getopt_long(argc, argv, SHORTOPTS, longopts, NULL)) != -1) {
        if (opt >= OPT_SYNTHETIC && opt <= OPT_CHUNK)
            a->given[opt] = 1;
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
        case OPT_SYNTHETIC:
            a->synthetic = 1;
            break;
        case OPT_IMPORT:
            a->import_src = optarg;
            break;
        case OPT_FORMAT:
            if (strcmp(optarg, "auto") == 0)
                a->imp.kind = MKV_IMPORT_AUTO;
            else if (strcmp(optarg, "safetensors") == 0)
                a->imp.kind = MKV_IMPORT_SAFETENSORS;
            else if (strcmp(optarg, "vllm") == 0)
                a->imp.kind = MKV_IMPORT_VLLM;
            else if (strcmp(optarg, "npy") == 0)
                a->imp.kind = MKV_IMPORT_NPY;
            else {
                mkv_usage_error("invalid value '%s' for --format: expected auto, safetensors, vllm or npy", optarg);
                exit(2);
            }
            break;
        case OPT_K_ROPE:
            if (strcmp(optarg, "post") != 0 && strcmp(optarg, "pre") != 0) {
                mkv_usage_error("invalid value '%s' for --k-rope: expected post or pre", optarg);
                exit(2);
            }
            a->imp.k_rope = optarg;
            break;
        case OPT_LAYERS:
            a->syn.n_layers = (int)parse_int_or_exit(optarg, "layers", 1, 1000);
            break;
        case OPT_HEADS:
            a->syn.n_heads = a->imp.n_heads = (int)parse_int_or_exit(optarg, "heads", 1, 4096);
            break;
        case OPT_KV_HEADS:
            a->syn.n_kv_heads = a->imp.n_kv_heads = (int)parse_int_or_exit(optarg, "kv-heads", 1, 4096);
            break;
        case OPT_HEAD_DIM:
            a->syn.head_dim = a->imp.head_dim = (int)parse_int_or_exit(optarg, "head-dim", 1, 4096);
            break;
        case OPT_TOKENS:
            a->syn.n_tokens = parse_size_or_exit(optarg, "tokens", 1, INT32_MAX);
            break;
        case OPT_QUERIES:
            a->syn.n_queries = parse_size_or_exit(optarg, "queries", 0, INT32_MAX);
            break;
        case OPT_SEED:
            a->syn.seed = parse_seed(optarg);
            break;
        case OPT_PARAM:
            parse_params(&a->syn, optarg);
            break;
        case OPT_ROPE_THETA:
            if (mkv_parse_double(optarg, "rope-theta", 1.0, 1e12, &a->rope_theta))
                exit(2);
            break;
        case OPT_MODEL:
            if (strlen(optarg) == 0 || strlen(optarg) >= sizeof a->syn.model) {
                mkv_usage_error("invalid value for --model: expected 1..%zu characters",
                                sizeof a->syn.model - 1);
                exit(2);
            }
            a->model = optarg;
            break;
        case OPT_DTYPE:
            if (mkv_dtype_parse(optarg, &a->dtype) != 0) {
                mkv_usage_error("invalid value '%s' for --dtype: expected f32, f16 or bf16", optarg);
                exit(2);
            }
            break;
        case OPT_DEFLATE:
            a->wo.deflate = (int)parse_int_or_exit(optarg, "deflate", 0, 9);
            break;
        case OPT_CHUNK:
            a->wo.chunk_tokens = parse_size_or_exit(optarg, "chunk", 1, INT32_MAX);
            break;
        default: {
            int handled = mkv_common_option(&common, opt, optarg);
            if (handled < 0)
                exit(2);
            if (!handled)
                misuse("internal error: unhandled option");
        }
        }
    }
    if (optind < argc) {
        /* a MODEL operand: capture from a model arrives with issue 3 */
        char what[300];
        snprintf(what, sizeof what, "unexpected operand '%s'", argv[optind]);
        misuse(what);
    }
    if (a->synthetic && a->import_src)
        misuse("--synthetic and --import exclude each other");
    if (!a->synthetic && !a->import_src)
        misuse("nothing to do: give --synthetic or --import SRC");
    if (!a->output)
        misuse("missing -o FILE (use '-o -' for stdout)");
}

static void check_synthetic_args(capture_args *a)
{
    static const int import_only[] = {OPT_FORMAT, OPT_K_ROPE};
    refuse_options(a, import_only, 2, "--synthetic");
    mkv_synthetic_params *p = &a->syn;
    if (p->n_heads % p->n_kv_heads != 0)
        mkv_usage_error("--heads %d is not a multiple of --kv-heads %d", p->n_heads, p->n_kv_heads);
    else if (p->head_dim % 2 != 0)
        mkv_usage_error("--head-dim %d must be even: RoPE rotates channel pairs", p->head_dim);
    else if (p->n_queries > p->n_tokens)
        mkv_usage_error("--queries %" PRId64 " is more than --tokens %" PRId64, p->n_queries, p->n_tokens);
    else {
        p->dtype = a->dtype;
        p->rope_theta = a->rope_theta;
        if (a->model)
            snprintf(p->model, sizeof p->model, "%s", a->model);
        mkv_error err;
        mkv_error_clear(&err);
        if (mkv_synthetic_check(p, &err) == MKV_OK)
            return;
        mkv_usage_error("--param: %s", err.msg);
    }
    exit(2);
}

static void check_import_args(capture_args *a)
{
    static const int synthetic_only[] = {OPT_LAYERS, OPT_TOKENS, OPT_QUERIES, OPT_SEED, OPT_PARAM};
    refuse_options(a, synthetic_only, 5, "--import");
    mkv_import_opts *o = &a->imp;
    if (o->n_heads && o->n_kv_heads && o->n_heads % o->n_kv_heads != 0) {
        mkv_usage_error("--heads %d is not a multiple of --kv-heads %d", o->n_heads, o->n_kv_heads);
        exit(2);
    }
    if (o->head_dim % 2 != 0) {
        mkv_usage_error("--head-dim %d must be even: RoPE rotates channel pairs", o->head_dim);
        exit(2);
    }
    o->dtype = a->dtype;
    o->rope_theta = a->rope_theta;
    if (a->model)
        o->model = a->model;
    /* never write the dump over its own source */
    a->wo.protect = a->import_src;
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    capture_args a;
    parse_args(argc, argv, &a);

    mkv_error err;
    mkv_error_clear(&err);
    int rc;
    if (a.synthetic) {
        check_synthetic_args(&a);
        rc = mkv_synthetic_write(&a.syn, a.output, &a.wo, &err);
        if (rc == MKV_OK)
            mkv_info("wrote %s: synthetic, %d layers, %d/%d heads, head_dim %d, %" PRId64
                     " tokens, %" PRId64 " queries, seed %" PRIu64,
                     strcmp(a.output, "-") == 0 ? "stdout" : a.output, a.syn.n_layers,
                     a.syn.n_heads, a.syn.n_kv_heads, a.syn.head_dim, a.syn.n_tokens,
                     a.syn.n_queries, a.syn.seed);
    } else {
        check_import_args(&a);
        rc = mkv_import(a.import_src, &a.imp, a.output, &a.wo, &err);
        if (rc == MKV_OK)
            mkv_info("wrote %s: imported from %s",
                     strcmp(a.output, "-") == 0 ? "stdout" : a.output, a.import_src);
    }
    if (rc != MKV_OK)
        mkv_report(&err);
    return mkv_exit_code(rc);
}
