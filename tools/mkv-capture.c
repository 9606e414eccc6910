/* mkv-capture: make KV dumps (mosaickv-dump v1): captured from a model's
 * forward pass, from a shape-only model with random weights, seeded
 * synthetic ones, or imported from safetensors, vLLM per-layer files or .npy.
 *
 * Examples:
 *   mkv-capture stories260K.bin -p "Once upon a time" --generate 20 -o kv.h5
 *   mkv-capture model.gguf -f essay.txt --window 64 --dtype f16 -o kv.h5
 *   mkv-capture smollm2.gguf --chat -p "What is 2+2?" --generate 32 --print -o kv.h5
 *   mkv-capture stories260K.bin --token-ids ids.txt --layers 0,3-4 --k-rope pre -o kv.h5
 *   mkv-capture --shape llama3.1-8b --layers 0-1 --vocab 32000 --tokens 4K -o kv.h5
 *   mkv-capture --list-shapes
 *   mkv-capture --synthetic -o kv.h5                 # 2 layers, 8/2 heads, d 64, 1K tokens
 *   mkv-capture --synthetic --layers 4 --heads 32 --kv-heads 8 --head-dim 128 \
 *               --tokens 8K --queries 32 --seed 7 -o kv.h5
 *   mkv-capture --synthetic --param 'rank=16 outliers=2' --dtype f32 -o kv.h5
 *   mkv-capture --synthetic --tokens 4K -o - | mkv-analyze check -
 *   mkv-capture --import cache.safetensors --heads 32 --model llama-3.1-8b -o kv.h5
 *   mkv-capture --import vllm_kv/ --heads 32 --rope-theta 500000 -o kv.h5
 *   mkv-capture --import kv.npy --k-rope pre --dtype bf16 -o kv.h5
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vocab/chat.h"
#include "cli/cli.h"
#include "io/dump.h"
#include "model/forward.h"
#include "io/import.h"
#include "core/log.h"
#include "core/mkv.h"
#include "model/model.h"
#include "model/model_load.h"
#include "core/rng.h"
#include "model/sampler.h"
#include "model/shapes.h"
#include "io/synthetic.h"
#include "core/tensor.h"
#include "vocab/tokenizer.h"

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
    OPT_CHUNK,
    OPT_TOKENIZER,
    OPT_TOKEN_IDS,
    OPT_CHAT,
    OPT_SYSTEM,
    OPT_SPECIAL,
    OPT_BOS,
    OPT_NO_BOS,
    OPT_WINDOW,
    OPT_GENERATE,
    OPT_TEMPERATURE,
    OPT_TOP_P,
    OPT_PRINT,
    OPT_SHAPE,
    OPT_LIST_SHAPES,
    OPT_VOCAB,
    OPT_MAX_MEMORY,
    OPT_END
};

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    MKV_THREADS_LONGOPT,
    {"output", required_argument, NULL, 'o'},
    {"prompt", required_argument, NULL, 'p'},
    {"file", required_argument, NULL, 'f'},
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
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"token-ids", required_argument, NULL, OPT_TOKEN_IDS},
    {"chat", no_argument, NULL, OPT_CHAT},
    {"system", required_argument, NULL, OPT_SYSTEM},
    {"special", no_argument, NULL, OPT_SPECIAL},
    {"bos", no_argument, NULL, OPT_BOS},
    {"no-bos", no_argument, NULL, OPT_NO_BOS},
    {"window", required_argument, NULL, OPT_WINDOW},
    {"generate", required_argument, NULL, OPT_GENERATE},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"print", no_argument, NULL, OPT_PRINT},
    {"shape", required_argument, NULL, OPT_SHAPE},
    {"list-shapes", no_argument, NULL, OPT_LIST_SHAPES},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"max-memory", required_argument, NULL, OPT_MAX_MEMORY},
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "o:p:f:"

/* Model mode defaults. */
#define DEFAULT_WINDOW 32
#define DEFAULT_MODEL_CHUNK 512

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s MODEL [-p TEXT | -f FILE | --token-ids FILE] [options] -o FILE\n"
            "       %s --shape NAME [options] -o FILE\n"
            "       %s --synthetic [options] -o FILE\n"
            "       %s --import SRC [options] -o FILE\n\n"
            "Make a KV dump (mosaickv-dump v1, see mosaickv(5)). FILE '-' is stdout.\n\n"
            "Modes:\n"
            "  MODEL                run MODEL on a prompt and capture K, V and queries:\n"
            "                       a llama2.c checkpoint, a GGUF file or a Hugging Face\n"
            "                       directory (config.json + safetensors)\n"
            "      --shape NAME     the same from a model of a published shape with seeded\n"
            "                       random weights (--list-shapes lists them)\n"
            "      --synthetic      seeded synthetic dump that resembles real KV (see\n"
            "                       mkv-capture(1) for the model)\n"
            "      --import SRC     import SRC: safetensors file, vLLM directory or .npy\n\n"
            "Output:\n"
            "  -o, --output FILE    write the dump to FILE (required)\n"
            "      --dtype T        f32, f16 or bf16 (default f16)\n"
            "      --deflate N      zlib level 0..9, 0 = none (default 4)\n"
            "      --chunk N        chunk length along tokens (default 1K; MODEL and --shape:\n"
            "                       also the prefill chunk, default 512)\n"
            "      --model NAME     model attribute (default: the model's, synthetic, SRC's name)\n"
            "      --rope-theta X   RoPE base (default 10000; not for MODEL/--shape)\n\n"
            "Prompt (MODEL; --shape takes --token-ids or --tokens):\n"
            "  -p, --prompt TEXT    the prompt text\n"
            "  -f, --file FILE      read the prompt from FILE ('-' = stdin; default: stdin\n"
            "                       when it is not a terminal)\n"
            "      --token-ids FILE whitespace-separated token ids, used as they are\n"
            "      --tokenizer FILE llama2.c tokenizer (default: tokenizer.bin or\n"
            "                       tok<vocab>.bin beside the checkpoint)\n"
            "      --chat           wrap the prompt in the model's chat template\n"
            "      --system TEXT    system prompt for --chat (default: the template's)\n"
            "      --special        control-token text in the prompt becomes the tokens\n"
            "      --bos, --no-bos  start with BOS or not (default: as the model does)\n\n"
            "Capture (MODEL and --shape):\n"
            "      --layers LIST    layers to capture, e.g. 0,3,5-7 (default all)\n"
            "      --k-rope R       store keys and queries post- or pre-RoPE (default post)\n"
            "      --window W       queries of the last W prompt positions (default 32)\n"
            "      --generate N     generate N tokens; their K, V and queries are captured\n"
            "      --temperature T  sampling temperature, 0 = greedy (default 0)\n"
            "      --top-p P        nucleus sampling cut-off in (0, 1] (default 1)\n"
            "      --seed N         sampling seed; --shape: weights and prompt too (default 1)\n"
            "      --print          print the generated text on stdout (MODEL)\n\n"
            "Shape-only (--shape):\n"
            "      --list-shapes    list the known shapes and exit\n"
            "      --tokens N       random prompt of N tokens (default 1K)\n"
            "      --vocab N        vocabulary size instead of the shape's\n"
            "      --max-memory S   refuse to need more than S bytes (default: available)\n\n"
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
            mkv_progname(), mkv_progname(), mkv_progname(), mkv_progname());
    mkv_common_usage(fp, MKV_COMMON_THREADS);
    exit(status);
}

MKV_TOOL_MISUSE(SHORTOPTS)

typedef enum { MODE_NONE = 0, MODE_SYNTHETIC = 1, MODE_IMPORT = 2, MODE_MODEL = 4, MODE_SHAPE = 8 } mode;

/* What the command line asked for; given[] records which options were
 * used, so an option of another mode is refused rather than ignored. */
typedef struct {
    mode mode;
    const char *model_path;   /* MODEL operand */
    const char *shape;
    const char *import_src;
    const char *output;
    mkv_synthetic_params syn;
    mkv_import_opts imp;
    mkv_dump_write_opts wo;
    mkv_dtype dtype;
    double rope_theta;
    const char *model;
    const char *layers;       /* --layers as given: a count or a list, by mode */
    int k_rope_pre;
    /* prompt */
    const char *prompt, *prompt_file, *token_ids, *tokenizer, *system;
    int chat, special, bos;   /* bos: -1 model default, 0 no, 1 yes */
    /* capture */
    int64_t window, generate, vocab, max_memory;
    double temperature, top_p;
    int print;
    int threads;
    int given[OPT_END];
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

/* The modes each option belongs to; options absent here (the common ones,
 * -o, --model, --dtype, --deflate, --chunk) apply to every mode. */
static const struct {
    int opt;
    int modes;
} OPTION_MODES[] = {
    {OPT_FORMAT, MODE_IMPORT},
    {OPT_K_ROPE, MODE_IMPORT | MODE_MODEL | MODE_SHAPE},
    {OPT_LAYERS, MODE_SYNTHETIC | MODE_MODEL | MODE_SHAPE},
    {OPT_HEADS, MODE_SYNTHETIC | MODE_IMPORT},
    {OPT_KV_HEADS, MODE_SYNTHETIC | MODE_IMPORT},
    {OPT_HEAD_DIM, MODE_SYNTHETIC | MODE_IMPORT},
    {OPT_TOKENS, MODE_SYNTHETIC | MODE_SHAPE},
    {OPT_QUERIES, MODE_SYNTHETIC},
    {OPT_SEED, MODE_SYNTHETIC | MODE_MODEL | MODE_SHAPE},
    {OPT_PARAM, MODE_SYNTHETIC},
    {OPT_ROPE_THETA, MODE_SYNTHETIC | MODE_IMPORT},
    {'p', MODE_MODEL},
    {'f', MODE_MODEL},
    {OPT_TOKENIZER, MODE_MODEL},
    {OPT_TOKEN_IDS, MODE_MODEL | MODE_SHAPE},
    {OPT_CHAT, MODE_MODEL},
    {OPT_SYSTEM, MODE_MODEL},
    {OPT_SPECIAL, MODE_MODEL},
    {OPT_BOS, MODE_MODEL | MODE_SHAPE},
    {OPT_NO_BOS, MODE_MODEL | MODE_SHAPE},
    {OPT_WINDOW, MODE_MODEL | MODE_SHAPE},
    {OPT_GENERATE, MODE_MODEL | MODE_SHAPE},
    {OPT_TEMPERATURE, MODE_MODEL | MODE_SHAPE},
    {OPT_TOP_P, MODE_MODEL | MODE_SHAPE},
    {OPT_PRINT, MODE_MODEL},
    {OPT_VOCAB, MODE_SHAPE},
    {OPT_MAX_MEMORY, MODE_SHAPE},
};

static const char *option_name(int opt)
{
    for (const struct option *o = longopts; o->name; o++)
        if (o->val == opt)
            return o->name;
    return "?";
}

static const char *mode_name(mode m)
{
    switch (m) {
    case MODE_SYNTHETIC: return "--synthetic";
    case MODE_IMPORT: return "--import";
    case MODE_SHAPE: return "--shape";
    case MODE_MODEL: return "a MODEL capture";
    default: return "?";
    }
}

/* Refuse options that belong to other modes. */
static void refuse_options(const capture_args *a)
{
    for (size_t i = 0; i < sizeof OPTION_MODES / sizeof *OPTION_MODES; i++)
        if (a->given[OPTION_MODES[i].opt] && !(OPTION_MODES[i].modes & a->mode)) {
            char what[160];
            snprintf(what, sizeof what, "--%s is not an option of %s",
                     option_name(OPTION_MODES[i].opt), mode_name(a->mode));
            misuse(what);
        }
}

/* --list-shapes: one TSV row per shape. */
static void list_shapes(void)
{
    printf("name\tlayers\tdim\theads\tkv_heads\thead_dim\thidden\tvocab\tcontext\trope_theta\t"
           "tied\tqkv_bias\tmodel\n");
    for (int i = 0; mkv_shape_at(i); i++) {
        const mkv_shape *s = mkv_shape_at(i);
        printf("%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\n", s->name, s->n_layers,
               s->dim, s->n_heads, s->n_kv_heads, s->head_dim, s->hidden_dim, s->vocab_size,
               s->max_seq_len, s->rope_theta, s->tied_classifier ? "yes" : "no",
               s->has_qkv_bias ? "yes" : "no", s->description);
    }
    exit(0);
}

/* Say which two modes were both asked for: --synthetic, --import, --shape,
 * then the MODEL operand. */
static void set_mode(capture_args *a, const char **first, mode m, const char *what)
{
    if (a->mode != MODE_NONE) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s and %s exclude each other", *first, what);
        misuse(msg);
    }
    a->mode = m;
    *first = what;
}

static void parse_args(int argc, char **argv, capture_args *a)
{
    memset(a, 0, sizeof *a);
    mkv_synthetic_params_init(&a->syn);
    mkv_import_opts_init(&a->imp);
    mkv_dump_write_opts_init(&a->wo);
    a->dtype = MKV_DTYPE_F16;
    a->rope_theta = 10000.0;
    a->bos = -1;
    a->window = DEFAULT_WINDOW;
    a->top_p = 1.0;
    mkv_common_opts common;
    mkv_common_init(&common);

    opterr = 0;   /* bad_option prints the one-line message */
    int opt;
    while ((opt = getopt_long(argc, argv, SHORTOPTS, longopts, NULL)) != -1) {
        if (opt >= 0 && opt < OPT_END)
            a->given[opt] = 1;
        switch (opt) {
        case 'h':
            usage(stdout, 0);
            break;
        case MKV_OPT_VERSION:
            mkv_print_version(stdout);
            exit(0);
        case OPT_LIST_SHAPES:
            list_shapes();
            break;
        case '?':
        case ':':
            bad_option(opt, argv);
            break;
        case 'o':
            a->output = optarg;
            break;
        case 'p':
            a->prompt = optarg;
            break;
        case 'f':
            a->prompt_file = optarg;
            break;
        case OPT_SYNTHETIC:   /* the mode is settled after parsing, from given[] */
            break;
        case OPT_IMPORT:
            a->import_src = optarg;
            break;
        case OPT_SHAPE:
            a->shape = optarg;
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
            a->k_rope_pre = strcmp(optarg, "pre") == 0;
            break;
        case OPT_LAYERS:
            a->layers = optarg;
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
        case OPT_TOKENIZER:
            a->tokenizer = optarg;
            break;
        case OPT_TOKEN_IDS:
            a->token_ids = optarg;
            break;
        case OPT_CHAT:
            a->chat = 1;
            break;
        case OPT_SYSTEM:
            a->system = optarg;
            break;
        case OPT_SPECIAL:
            a->special = 1;
            break;
        case OPT_BOS:
            a->bos = 1;
            break;
        case OPT_NO_BOS:
            a->bos = 0;
            break;
        case OPT_WINDOW:
            a->window = parse_size_or_exit(optarg, "window", 0, INT32_MAX);
            break;
        case OPT_GENERATE:
            a->generate = parse_size_or_exit(optarg, "generate", 0, INT32_MAX);
            break;
        case OPT_TEMPERATURE:
            if (mkv_parse_double(optarg, "temperature", 0.0, 100.0, &a->temperature))
                exit(2);
            break;
        case OPT_TOP_P:
            if (mkv_parse_double(optarg, "top-p", 0.0, 1.0, &a->top_p))
                exit(2);
            if (a->top_p == 0.0) {
                mkv_usage_error("invalid value '%s' for --top-p: must be in (0, 1]", optarg);
                exit(2);
            }
            break;
        case OPT_PRINT:
            a->print = 1;
            break;
        case OPT_VOCAB:
            a->vocab = parse_size_or_exit(optarg, "vocab", 1, 1 << 24);
            break;
        case OPT_MAX_MEMORY:
            a->max_memory = parse_size_or_exit(optarg, "max-memory", 1, INT64_MAX);
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
    a->threads = common.threads > 0 ? common.threads : mkv_ncpus();

    const char *first = NULL;
    char model_what[300] = "";
    if (a->given[OPT_SYNTHETIC])
        set_mode(a, &first, MODE_SYNTHETIC, "--synthetic");
    if (a->import_src)
        set_mode(a, &first, MODE_IMPORT, "--import");
    if (a->shape)
        set_mode(a, &first, MODE_SHAPE, "--shape");
    if (optind < argc) {
        snprintf(model_what, sizeof model_what, "the MODEL operand '%s'", argv[optind]);
        set_mode(a, &first, MODE_MODEL, model_what);
        a->model_path = argv[optind++];
    }
    if (optind < argc) {
        char what[300];
        snprintf(what, sizeof what, "unexpected operand '%s'", argv[optind]);
        misuse(what);
    }
    if (a->mode == MODE_NONE)
        misuse("nothing to do: give MODEL, --shape NAME, --synthetic or --import SRC");
    refuse_options(a);
    if (!a->output)
        misuse("missing -o FILE (use '-o -' for stdout)");
}

static void check_synthetic_args(capture_args *a)
{
    mkv_synthetic_params *p = &a->syn;
    if (a->layers)
        p->n_layers = (int)parse_int_or_exit(a->layers, "layers", 1, 1000);
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

/* ================================================================ models */

/* Everything a model capture holds, freed in one place. */
typedef struct {
    mkv_loaded_model lm;      /* MODEL mode */
    mkv_model *model;         /* lm.model or the shape-only model */
    int *layer_index;         /* original index of each captured layer */
    int n_selected;
    int32_t *tokens;          /* prompt, then generated tokens: [n_prompt + generate] */
    size_t n_prompt, n_total;
    mkv_forward *fwd;
    mkv_dump_writer *writer;
    float *logits;
    float *scratch;           /* one transposed chunk: [heads][n][head_dim] */
    const char *chat_family;
    int bos;
} model_run;

static void model_run_free(model_run *r)
{
    mkv_dump_abort(r->writer);
    mkv_forward_free(r->fwd);
    if (r->lm.model)
        mkv_loaded_model_free(&r->lm);
    else
        mkv_model_free(r->model);
    free(r->layer_index);
    free(r->tokens);
    free(r->logits);
    mkv_free(r->scratch);
}

/* Exit with the message and status of err, after freeing the run. */
static void fail_run(model_run *r, const mkv_error *err)
{
    model_run_free(r);
    mkv_report(err);
    exit(mkv_exit_code(err->code));
}

static int cmp_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* --layers LIST ("0,3,5-7") against a model of n layers: sorted, without
 * repeats, into a malloc'd array.  NULL list: every layer.  On a bad list
 * the message is printed and NULL returned with *status the exit status. */
static int *parse_layer_list(const char *list, int n, int *count, int *status)
{
    int *out = malloc((size_t)n * sizeof *out);
    char *seen = calloc((size_t)n, 1);
    *status = 2;
    if (!out || !seen) {
        mkv_usage_error("out of memory");
        *status = 1;
        goto fail;
    }
    int k = 0;
    for (const char *p = list; p;) {
        char *end;
        errno = 0;
        long lo = strtol(p, &end, 10), hi = lo;
        int ok = end != p && errno == 0 && (*p >= '0' && *p <= '9');
        if (ok && *end == '-') {
            const char *q = end + 1;
            hi = strtol(q, &end, 10);
            ok = end != q && errno == 0 && (*q >= '0' && *q <= '9') && hi >= lo;
        }
        if (!ok || (*end != ',' && *end != '\0')) {
            mkv_usage_error("invalid value '%s' for --layers: expected a list of layers like 0,3,5-7",
                            list);
            goto fail;
        }
        if (hi >= n) {
            mkv_usage_error("invalid value '%s' for --layers: the model has %d layers (0..%d)", list, n,
                            n - 1);
            goto fail;
        }
        for (long l = lo; l <= hi; l++)
            if (!seen[l]) {
                seen[l] = 1;
                out[k++] = (int)l;
            }
        p = *end == '\0' ? NULL : end + 1;
    }
    if (!list)
        for (k = 0; k < n; k++)
            out[k] = k;
    free(seen);
    qsort(out, (size_t)k, sizeof *out, cmp_int);
    *count = k;
    return out;
fail:
    free(out);
    free(seen);
    return NULL;
}

/* Read a whole file ("-" = stdin) into a malloc'd NUL-terminated buffer. */
static int read_all(const char *path, char **data, size_t *len, mkv_error *err)
{
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    const char *name = fp == stdin ? "(stdin)" : path;
    if (!fp)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int rc = MKV_OK;
    while (buf) {
        if (n + 1 >= cap) {
            char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0)
            break;
    }
    if (!buf)
        rc = mkv_fail(err, MKV_ENOMEM, "'%s': out of memory", name);
    else if (ferror(fp))
        rc = mkv_fail_errno(err, MKV_EIO, errno, "'%s': read error", name);
    if (fp != stdin)
        fclose(fp);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return MKV_OK;
}

/* --token-ids FILE: whitespace-separated decimal ids below vocab. */
static int read_token_ids(const char *path, int vocab, mkv_idbuf *ids, mkv_error *err)
{
    char *text;
    size_t len;
    int rc = read_all(path, &text, &len, err);
    if (rc)
        return rc;
    const char *name = strcmp(path, "-") == 0 ? "(stdin)" : path;
    size_t base = ids->n;   /* a BOS the caller put first is not in the file */
    char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == '\0' || (size_t)(p - text) >= len)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        int sep = *end == '\0' || *end == ' ' || *end == '\t' || *end == '\n' || *end == '\r';
        if (end == p || !sep || errno) {
            int n = (int)strcspn(p, " \t\r\n");
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': '%.*s' is not a token id", name, n > 40 ? 40 : n, p);
            break;
        }
        if (v < 0 || v >= vocab) {
            rc = mkv_fail(err, MKV_EFORMAT,
                          "'%s': token id %ld at index %zu is outside the vocabulary of %d", name, v,
                          ids->n - base, vocab);
            break;
        }
        if ((rc = mkv_idbuf_push(ids, (int32_t)v, err)))
            break;
        p = end;
    }
    free(text);
    if (!rc && ids->n == base)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': no token ids", name);
    return rc;
}

/* The prompt text: -p, -f, or stdin when it is not a terminal. */
static int read_prompt(const capture_args *a, char **text, size_t *len, mkv_error *err)
{
    if (a->prompt) {
        *text = strdup(a->prompt);
        *len = strlen(a->prompt);
        return *text ? MKV_OK : mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    if (a->prompt_file)
        return read_all(a->prompt_file, text, len, err);
    if (isatty(STDIN_FILENO))
        return mkv_fail(err, MKV_EUSAGE,
                        "no prompt: give -p TEXT, -f FILE or --token-ids FILE, or pipe the prompt "
                        "to standard input");
    return read_all("-", text, len, err);
}

/* Prompt tokens of a MODEL capture. */
static int model_prompt(const capture_args *a, model_run *r, mkv_error *err)
{
    const mkv_model_config *c = &r->model->cfg;
    mkv_idbuf ids = {0};
    int rc;
    if (a->token_ids) {
        /* ids are taken as they are; only an explicit --bos adds one */
        r->bos = a->bos == 1;
        if (r->bos && c->bos_id < 0)
            return mkv_fail(err, MKV_EUSAGE, "--bos: the model has no BOS token");
        if (r->bos && (rc = mkv_idbuf_push(&ids, c->bos_id, err)))
            return rc;
        if ((rc = read_token_ids(a->token_ids, c->vocab_size, &ids, err))) {
            free(ids.ids);
            return rc;
        }
        r->tokens = ids.ids;
        r->n_prompt = ids.n;
        return MKV_OK;
    }
    char *text;
    size_t len;
    if ((rc = read_prompt(a, &text, &len, err)))
        return rc;
    if (len == 0) {
        free(text);
        return mkv_fail(err, MKV_EFORMAT, "empty prompt%s",
                        a->prompt ? "" : a->prompt_file && strcmp(a->prompt_file, "-") != 0
                                             ? " file" : " on standard input");
    }
    const char *tmpl = r->lm.chat_template;
    r->bos = r->lm.add_bos;
    if (a->chat) {
        mkv_chat_family fam;
        if (memchr(text, '\0', len))
            rc = mkv_fail(err, MKV_EFORMAT, "the prompt contains a NUL byte, which --chat cannot carry");
        else if (!tmpl)
            rc = mkv_fail(err, MKV_EUNSUP, "'%s': the model has no chat template", a->model_path);
        else if ((rc = mkv_chat_detect(tmpl, &fam, err)) == MKV_OK) {
            char *chat;
            if ((rc = mkv_chat_render(tmpl, a->system, text, &chat, err)) == MKV_OK) {
                free(text);
                text = chat;
                len = strlen(chat);
                r->chat_family = mkv_chat_family_name(fam);
                /* the template decides whether the conversation starts with BOS */
                r->bos = mkv_chat_wants_bos(tmpl);
            }
        }
        if (rc) {
            free(text);
            return rc;
        }
    }
    if (a->bos >= 0)
        r->bos = a->bos;
    const mkv_tokenizer *t = r->lm.tok;
    if (r->bos && t->bos_id < 0) {
        if (a->bos == 1) {
            free(text);
            return mkv_fail(err, MKV_EUSAGE, "--bos: the model has no BOS token");
        }
        r->bos = 0;   /* a default the vocabulary cannot honour */
    }
    int flags = (r->bos ? MKV_ENCODE_BOS : 0) | (a->chat || a->special ? MKV_ENCODE_SPECIAL : 0);
    rc = mkv_tokenizer_encode(t, text, len, flags, &r->tokens, &r->n_prompt, err);
    free(text);
    return rc;
}

/* Prompt tokens of a shape-only capture: --token-ids, or --tokens N seeded
 * random ids (the first BOS when the shape's tokenizer adds one). */
static int shape_prompt(const capture_args *a, const mkv_shape *s, const mkv_model_config *c,
                        model_run *r, mkv_error *err)
{
    mkv_idbuf ids = {0};
    int rc;
    r->bos = a->bos >= 0 ? a->bos : (a->token_ids ? 0 : s->add_bos && c->bos_id >= 0);
    if (r->bos && c->bos_id < 0)
        return mkv_fail(err, MKV_EUSAGE, "--bos: shape %s with a vocabulary of %d has no BOS token",
                        s->name, c->vocab_size);
    if (a->token_ids) {
        if ((r->bos && (rc = mkv_idbuf_push(&ids, c->bos_id, err))) ||
            (rc = read_token_ids(a->token_ids, c->vocab_size, &ids, err))) {
            free(ids.ids);
            return rc;
        }
        r->tokens = ids.ids;
        r->n_prompt = ids.n;
        return MKV_OK;
    }
    size_t n = (size_t)a->syn.n_tokens;
    r->tokens = malloc(n * sizeof *r->tokens);
    if (!r->tokens)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for %zu prompt tokens", n);
    mkv_rng rng;
    const uint64_t key[1] = {UINT64_C(0x70726f6d7074)}; /* "prompt": apart from the weights' streams */
    mkv_rng_seed_stream(&rng, a->syn.seed, key, 1);
    for (size_t i = 0; i < n; i++)
        r->tokens[i] = (int32_t)mkv_rng_below(&rng, (uint64_t)c->vocab_size);
    if (r->bos)
        r->tokens[0] = c->bos_id;
    r->n_prompt = n;
    return MKV_OK;
}

static double gib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

/* Build the shape-only model of cfg after checking that a run of r's
 * tokens fits in memory. */
static int build_shape(const capture_args *a, const mkv_shape *s, const mkv_model_config *cfg,
                       model_run *r, mkv_error *err)
{
    uint64_t weights = (uint64_t)mkv_model_storage_floats(cfg) * sizeof(float);
    uint64_t need = weights + mkv_run_bytes_estimate(cfg, (int)r->n_total, (int)a->wo.chunk_tokens,
                                                     a->threads);
    uint64_t limit = a->max_memory > 0 ? (uint64_t)a->max_memory : mkv_available_memory();
    if (limit > 0 && need > limit)
        return mkv_fail(err, MKV_ENOMEM,
                        "shape %s with %d layers and a vocabulary of %d needs about %.1f GiB "
                        "(weights %.1f GiB), more than the %.1f GiB %s; build fewer layers "
                        "(--layers) or a smaller vocabulary (--vocab)",
                        s->name, cfg->n_layers, cfg->vocab_size, gib(need), gib(weights), gib(limit),
                        a->max_memory > 0 ? "of --max-memory" : "available");
    mkv_info("building shape %s: %d layers, %.2f GiB of random weights, seed %" PRIu64, s->name,
             cfg->n_layers, gib(weights), a->syn.seed);
    return mkv_shape_build(cfg, r->layer_index, a->syn.seed, a->threads, &r->model, err);
}

/* ---------------------------------------------------------------- capture hook */

typedef struct {
    mkv_dump_writer *w;
    const mkv_model_config *cfg;
    int *dump_layer;          /* model layer -> dump layer, -1 when not captured */
    int k_pre;                /* store pre-RoPE keys and queries */
    int q_first;              /* first position whose query is captured */
    float *scratch;
    mkv_progress progress;
    int progress_on;
} capture_state;

/* [n][heads][d] rows from src into [heads][n][d] at dst. */
static void to_head_major(const float *src, int n, int heads, int d, float *dst)
{
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < n; i++)
            memcpy(dst + ((size_t)h * n + i) * d, src + ((size_t)i * heads + h) * d, (size_t)d * sizeof(float));
}

/* Undo RoPE on [heads][n][d] vectors at positions pos0..pos0+n-1: the
 * forward pass hands out queries only after RoPE. */
static void unrotate(const mkv_model_config *c, float *x, int heads, int n, int pos0)
{
    int half = c->rope_dim / 2;
    int stride = c->rope_layout == MKV_ROPE_INTERLEAVED ? 2 : 1;
    int second = c->rope_layout == MKV_ROPE_INTERLEAVED ? 1 : half;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            double cs, sn;
            mkv_rope_angle(c, pos0 + i, j, &cs, &sn);
            for (int h = 0; h < heads; h++) {
                float *a = x + ((size_t)h * n + i) * c->head_dim + j * stride, *b = a + second;
                double x0 = *a, x1 = *b;
                *a = (float)(x0 * cs + x1 * sn);
                *b = (float)(-x0 * sn + x1 * cs);
            }
        }
}

static int capture_hook(void *user, const mkv_capture_batch *b, mkv_error *err)
{
    capture_state *s = user;
    const mkv_model_config *c = s->cfg;
    int layer = s->dump_layer[b->layer], d = c->head_dim, rc;
    if (layer >= 0) {
        to_head_major(s->k_pre ? b->k_pre : b->k, b->n, c->n_kv_heads, d, s->scratch);
        if ((rc = mkv_dump_write(s->w, layer, 'k', 0, c->n_kv_heads, b->pos0, b->n, s->scratch, err)))
            return rc;
        to_head_major(b->v, b->n, c->n_kv_heads, d, s->scratch);
        if ((rc = mkv_dump_write(s->w, layer, 'v', 0, c->n_kv_heads, b->pos0, b->n, s->scratch, err)))
            return rc;
        int first = b->pos0 > s->q_first ? b->pos0 : s->q_first;
        int m = b->pos0 + b->n - first;
        if (m > 0) {
            const float *q = b->q + (size_t)(first - b->pos0) * c->n_heads * d;
            to_head_major(q, m, c->n_heads, d, s->scratch);
            if (s->k_pre)
                unrotate(c, s->scratch, c->n_heads, m, first);
            if ((rc = mkv_dump_write(s->w, layer, 'q', 0, c->n_heads, first - s->q_first, m, s->scratch, err)))
                return rc;
        }
    }
    if (s->progress_on)
        mkv_progress_update(&s->progress, (int64_t)b->pos0 * c->n_layers + (int64_t)(b->layer + 1) * b->n);
    return MKV_OK;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The continuation as text: each generated token's bytes after its
 * predecessor (so a leading space after BOS is dropped as in decoding). */
static void print_generated(const mkv_tokenizer *t, const int32_t *tokens, size_t n_prompt,
                            size_t n_total, FILE *fp)
{
    for (size_t i = n_prompt; i < n_total; i++) {
        size_t len;
        const char *piece = mkv_tokenizer_piece(t, i > 0 ? tokens[i - 1] : -1, tokens[i], &len);
        if (piece)
            fwrite(piece, 1, len, fp);
    }
}

static char *generated_text(const mkv_tokenizer *t, const int32_t *tokens, size_t n_prompt,
                            size_t n_total)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *fp = open_memstream(&buf, &size);
    if (!fp)
        return NULL;
    print_generated(t, tokens, n_prompt, n_total, fp);
    fclose(fp);
    return buf;
}

/* Prefill the prompt, then generate; every processed position goes
 * through capture_hook into the writer. */
static int run_forward(const capture_args *a, model_run *r, capture_state *cs, mkv_error *err)
{
    const mkv_model_config *c = &r->model->cfg;
    int gen = (int)a->generate, rc;
    if (gen > 0) {
        r->logits = malloc((size_t)c->vocab_size * sizeof *r->logits);
        if (!r->logits)
            return mkv_fail(err, MKV_ENOMEM, "out of memory for the logits");
    }
    cs->progress_on = r->n_prompt > (size_t)a->wo.chunk_tokens;
    if (cs->progress_on)
        mkv_progress_start(&cs->progress, "prefill", (int64_t)r->n_prompt * c->n_layers);
    double t0 = now_seconds();
    rc = mkv_forward_run(r->fwd, r->tokens, r->n_prompt, r->logits,
                         gen > 0 ? MKV_LOGITS_LAST : MKV_LOGITS_NONE, err);
    if (cs->progress_on) {
        mkv_progress_finish(&cs->progress);
        cs->progress_on = 0;
    }
    if (rc)
        return rc;
    double t1 = now_seconds();
    mkv_info("prefill: %zu tokens in %.2f s (%.1f tokens/s)", r->n_prompt, t1 - t0,
             (double)r->n_prompt / (t1 - t0 > 1e-9 ? t1 - t0 : 1e-9));
    mkv_sampler sampler;
    mkv_sampler_init(&sampler, (float)a->temperature, (float)a->top_p, a->syn.seed);
    for (int i = 0; i < gen && rc == MKV_OK; i++) {
        int next = mkv_sample(&sampler, r->logits, c->vocab_size, err);
        if (next < 0) {
            rc = err->code ? err->code : MKV_ENOMEM;
            break;
        }
        r->tokens[r->n_prompt + (size_t)i] = next;
        /* the last token is run only for its K, V and query */
        rc = mkv_forward_run(r->fwd, &r->tokens[r->n_prompt + (size_t)i], 1, r->logits,
                             i + 1 < gen ? MKV_LOGITS_LAST : MKV_LOGITS_NONE, err);
    }
    mkv_sampler_free(&sampler);
    if (rc)
        return rc;
    if (gen > 0) {
        double t2 = now_seconds();
        mkv_info("generate: %d tokens in %.2f s (%.1f tokens/s)", gen, t2 - t1,
                 gen / (t2 - t1 > 1e-9 ? t2 - t1 : 1e-9));
        if (r->lm.tok && mkv_log_get_level() >= MKV_LOG_INFO) {
            char *text = generated_text(r->lm.tok, r->tokens, r->n_prompt, r->n_total);
            mkv_info("generated: %s", text ? text : "(out of memory)");
            free(text);
        }
    }
    return MKV_OK;
}

/* Root attributes beyond the normative ones: which layers, how captured. */
static int write_capture_attrs(const capture_args *a, const model_run *r, int n_queries,
                               mkv_error *err)
{
    char layers[8192];
    size_t at = 0;
    layers[0] = '\0';
    for (int i = 0; i < r->n_selected && at < sizeof layers; i++)
        at += (size_t)snprintf(layers + at, sizeof layers - at, "%s%d", i ? "," : "", r->layer_index[i]);
    char params[1024];
    int n = snprintf(params, sizeof params,
                     "format=%s prompt_tokens=%zu window=%d generate=%" PRId64
                     " temperature=%g top_p=%g seed=%" PRIu64 " bos=%d chat=%s",
                     a->mode == MODE_SHAPE ? "shape" : mkv_model_format_name(r->lm.format),
                     r->n_prompt, n_queries - (int)a->generate, a->generate, a->temperature,
                     a->top_p, a->syn.seed, r->bos, r->chat_family ? r->chat_family : "none");
    if (a->mode == MODE_SHAPE && n > 0 && (size_t)n < sizeof params)
        snprintf(params + n, sizeof params - (size_t)n, " vocab=%d", r->model->cfg.vocab_size);
    /* What it takes to rotate pre-RoPE keys like the model (rope_theta is
     * in the core attributes): the rotated channels, their pairing and any
     * per-pair frequency divisors (Llama 3.1's "llama3" scaling). */
    const mkv_model_config *cfg = &r->model->cfg;
    char rope[64];
    snprintf(rope, sizeof rope, "dim=%d layout=%s", cfg->rope_dim,
             cfg->rope_layout == MKV_ROPE_HALF ? "half" : "interleaved");
    int rc;
    if ((rc = mkv_dump_set_attr(r->writer, "layer_index", layers, err)) ||
        (rc = mkv_dump_set_attr(r->writer, "capture_params", params, err)) ||
        (rc = mkv_dump_set_attr(r->writer, "rope", rope, err)))
        return rc;
    if (cfg->has_rope_freq_factors) {
        char factors[MKV_ROPE_MAX_PAIRS * 18];
        size_t fat = 0;
        factors[0] = '\0';
        for (int j = 0; j < cfg->rope_dim / 2 && fat < sizeof factors; j++)
            fat += (size_t)snprintf(factors + fat, sizeof factors - fat, "%s%.9g", j ? "," : "",
                                    (double)cfg->rope_freq_factors[j]);
        if ((rc = mkv_dump_set_attr(r->writer, "rope_freq_factors", factors, err)))
            return rc;
    }
    if (a->mode == MODE_SHAPE && (rc = mkv_dump_set_attr(r->writer, "weights", "random", err)))
        return rc;
    return MKV_OK;
}

static int capture_model(const capture_args *a)
{
    model_run r;
    memset(&r, 0, sizeof r);
    mkv_error err;
    mkv_error_clear(&err);
    int rc;
    const mkv_shape *shape = NULL;

    if (a->given[OPT_SYSTEM] && !a->chat)
        misuse("--system needs --chat");
    if (!!a->prompt + !!a->prompt_file + !!a->token_ids > 1)
        misuse("give only one of -p, -f and --token-ids");
    if (a->token_ids && (a->chat || a->special))
        misuse(a->chat ? "--chat applies to text prompts, not --token-ids"
                       : "--special applies to text prompts, not --token-ids");
    if (a->token_ids && a->given[OPT_TOKENS])
        misuse("--tokens and --token-ids exclude each other");
    if (a->print && strcmp(a->output, "-") == 0)
        misuse("--print and -o - both write to standard output");

    /* 1. the model (a shape-only one is built once its prompt is known) */
    mkv_model_config cfg;
    if (a->mode == MODE_SHAPE) {
        shape = mkv_shape_find(a->shape);
        if (!shape) {
            mkv_usage_error("unknown shape '%s' (known: %s)", a->shape, mkv_shape_names());
            exit(2);
        }
        if (!(r.layer_index = parse_layer_list(a->layers, shape->n_layers, &r.n_selected, &rc)))
            exit(rc);
        if ((rc = mkv_shape_config(shape, r.n_selected, (int)a->vocab, &cfg, &err)))
            fail_run(&r, &err);
    } else {
        mkv_model_load_opts lo = {a->tokenizer, !a->token_ids || a->print};
        if ((rc = mkv_model_load(a->model_path, &lo, &r.lm, &err)))
            fail_run(&r, &err);
        r.model = r.lm.model;
        cfg = r.model->cfg;
        if (!(r.layer_index = parse_layer_list(a->layers, cfg.n_layers, &r.n_selected, &rc))) {
            model_run_free(&r);
            exit(rc);
        }
    }
    const mkv_model_config *c = &cfg;

    /* 2. the tokens */
    rc = a->mode == MODE_SHAPE ? shape_prompt(a, shape, c, &r, &err) : model_prompt(a, &r, &err);
    if (rc)
        fail_run(&r, &err);
    if (r.n_prompt == 0) {
        mkv_fail(&err, MKV_EFORMAT, "empty prompt");
        fail_run(&r, &err);
    }
    if (r.n_prompt > (size_t)c->max_seq_len) {
        mkv_fail(&err, MKV_EFORMAT, "the prompt has %zu tokens, more than the context of %d", r.n_prompt,
                 c->max_seq_len);
        fail_run(&r, &err);
    }
    if (r.n_prompt + (size_t)a->generate > (size_t)c->max_seq_len) {
        mkv_fail(&err, MKV_EFORMAT,
                 "the prompt has %zu tokens; %" PRId64 " more to generate exceed the context of %d",
                 r.n_prompt, a->generate, c->max_seq_len);
        fail_run(&r, &err);
    }
    r.n_total = r.n_prompt + (size_t)a->generate;
    int32_t *all = realloc(r.tokens, r.n_total * sizeof *all);
    if (!all) {
        mkv_fail(&err, MKV_ENOMEM, "out of memory for %zu tokens", r.n_total);
        fail_run(&r, &err);
    }
    r.tokens = all;
    if (a->mode == MODE_SHAPE && (rc = build_shape(a, shape, c, &r, &err)))
        fail_run(&r, &err);
    mkv_info("%s: %s, %d layers, dim %d, %d/%d heads, head_dim %d, vocab %d, context %d",
             c->name, a->mode == MODE_SHAPE ? "random weights" : mkv_model_format_name(r.lm.format),
             c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size,
             c->max_seq_len);
    int window = a->window < (int64_t)r.n_prompt ? (int)a->window : (int)r.n_prompt;
    int n_queries = window + (int)a->generate;
    mkv_info("prompt: %zu tokens%s; capturing %d of %d layers, queries of %d positions",
             r.n_prompt, r.bos ? " (BOS first)" : "", r.n_selected, c->n_layers, n_queries);

    /* 3. the forward pass, sized to this run */
    int chunk = (int)a->wo.chunk_tokens;
    mkv_forward_opts fo = {a->threads, chunk, (int)r.n_total};
    if ((rc = mkv_forward_create(r.model, &fo, &r.fwd, &err)))
        fail_run(&r, &err);
    int widest = c->n_heads > c->n_kv_heads ? c->n_heads : c->n_kv_heads;
    r.scratch = mkv_alloc((size_t)chunk * (size_t)widest, (size_t)c->head_dim * sizeof(float),
                          "capture buffer", &err);
    if (!r.scratch)
        fail_run(&r, &err);

    /* 4. the dump, created before the long work so output errors come first */
    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    snprintf(meta.model, sizeof meta.model, "%s", a->model ? a->model : c->name);
    meta.n_layers = r.n_selected;
    meta.n_heads = c->n_heads;
    meta.n_kv_heads = c->n_kv_heads;
    meta.head_dim = c->head_dim;
    meta.rope_theta = c->rope_theta;
    snprintf(meta.k_rope, sizeof meta.k_rope, "%s", a->k_rope_pre ? "pre" : "post");
    snprintf(meta.source, sizeof meta.source, "capture");
    meta.n_tokens = (int64_t)r.n_total;
    meta.n_queries = n_queries;
    meta.dtype = a->dtype;
    meta.has_tokens = 1;
    mkv_dump_write_opts wo = a->wo;
    wo.protect = a->model_path;
    if ((rc = mkv_dump_create(a->output, &meta, &wo, &r.writer, &err)) ||
        (rc = write_capture_attrs(a, &r, n_queries, &err)))
        fail_run(&r, &err);

    capture_state cs;
    memset(&cs, 0, sizeof cs);
    cs.w = r.writer;
    cs.cfg = c;
    cs.k_pre = a->k_rope_pre;
    cs.q_first = (int)r.n_prompt - window;
    cs.scratch = r.scratch;
    cs.dump_layer = malloc((size_t)c->n_layers * sizeof *cs.dump_layer);
    if (!cs.dump_layer) {
        mkv_fail(&err, MKV_ENOMEM, "out of memory");
        fail_run(&r, &err);
    }
    /* a shape-only model is built from the selected layers alone */
    for (int l = 0; l < c->n_layers; l++)
        cs.dump_layer[l] = a->mode == MODE_SHAPE ? l : -1;
    if (a->mode != MODE_SHAPE)
        for (int i = 0; i < r.n_selected; i++)
            cs.dump_layer[r.layer_index[i]] = i;
    mkv_forward_set_capture(r.fwd, capture_hook, &cs);
    rc = run_forward(a, &r, &cs, &err);
    free(cs.dump_layer);
    if (rc)
        fail_run(&r, &err);

    /* 5. tokens and query positions, then commit */
    int32_t *qpos = malloc((size_t)(n_queries > 0 ? n_queries : 1) * sizeof *qpos);
    if (!qpos) {
        mkv_fail(&err, MKV_ENOMEM, "out of memory");
        fail_run(&r, &err);
    }
    for (int i = 0; i < n_queries; i++)
        qpos[i] = cs.q_first + i;
    rc = mkv_dump_write_tokens(r.writer, r.tokens, &err);
    if (!rc)
        rc = mkv_dump_write_query_pos(r.writer, qpos, &err);
    free(qpos);
    if (rc)
        fail_run(&r, &err);
    mkv_dump_writer *w = r.writer;
    r.writer = NULL;   /* commit frees it whatever the outcome */
    if ((rc = mkv_dump_commit(w, &err)))
        fail_run(&r, &err);
    mkv_info("wrote %s: %s, %zu tokens (%zu generated), %d layers, %d queries",
             strcmp(a->output, "-") == 0 ? "stdout" : a->output, meta.model, r.n_total,
             r.n_total - r.n_prompt, r.n_selected, n_queries);
    if (a->print) {
        print_generated(r.lm.tok, r.tokens, r.n_prompt, r.n_total, stdout);
        fputc('\n', stdout);
        if (fflush(stdout) != 0) {
            mkv_fail_errno(&err, MKV_EIO, errno, "cannot write to standard output");
            fail_run(&r, &err);
        }
    }
    model_run_free(&r);
    return MKV_OK;
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    capture_args a;
    parse_args(argc, argv, &a);

    mkv_error err;
    mkv_error_clear(&err);
    int rc;
    if (a.mode == MODE_MODEL || a.mode == MODE_SHAPE) {
        if (!a.given[OPT_CHUNK])
            a.wo.chunk_tokens = DEFAULT_MODEL_CHUNK;
        return capture_model(&a);
    }
    if (a.mode == MODE_SYNTHETIC) {
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
