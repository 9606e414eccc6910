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
 *   mkv-capture --synthetic -P rank=16,outliers=2 --dtype f32 -o kv.h5
 *   mkv-capture --synthetic --tokens 4K -o - | mkv-analyze check -
 *   mkv-capture --import cache.safetensors --heads 32 --model llama-3.1-8b -o kv.h5
 *   mkv-capture --import vllm_kv/ --heads 32 --rope-theta 500000 -o kv.h5
 *   mkv-capture --import kv.npy --k-rope pre --dtype bf16 -o kv.h5
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/outfile.h"
#include "core/mkv.h"
#include "io/dump.h"
#include "io/import.h"
#include "io/synthetic.h"
#include "model/capture.h"
#include "model/model_load.h"
#include "model/prompt.h"
#include "model/run_model.h"

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
    {"param", required_argument, NULL, 'P'},
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
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "o:p:f:P:"

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
            "  -P, --param K=V,...  set model parameters (repeatable; 'K=V K=V' works too):\n"
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
    mkv_prompt_opts prompt;
    const char *tokenizer;
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

/* -P 'K=V,K=V ...': assignments separated by commas or blanks. */
static void parse_params(mkv_synthetic_params *p, const char *arg)
{
    char *copy = strdup(arg);
    if (!copy) {
        mkv_usage_error("out of memory");
        exit(1);
    }
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(copy, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
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
        mkv_usage_error("invalid value '%s' for --param: expected KEY=VALUE[,KEY=VALUE...]", arg);
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
    {'P', MODE_SYNTHETIC},
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
    mkv_prompt_opts_init(&a->prompt);
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
        MKV_TOOL_STANDARD_CASES
        case OPT_LIST_SHAPES:
            mkv_shape_list(stdout);
            exit(0);
        case 'o':
            a->output = optarg;
            break;
        case 'p':
            a->prompt.text = optarg;
            break;
        case 'f':
            a->prompt.file = optarg;
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
            if (mkv_parse_seed(optarg, "seed", &a->syn.seed))
                exit(2);
            break;
        case 'P':
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
            a->prompt.token_ids = optarg;
            break;
        case OPT_CHAT:
            a->prompt.chat = 1;
            break;
        case OPT_SYSTEM:
            a->prompt.system = optarg;
            break;
        case OPT_SPECIAL:
            a->prompt.special = 1;
            break;
        case OPT_BOS:
            a->prompt.bos = 1;
            break;
        case OPT_NO_BOS:
            a->prompt.bos = 0;
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
    mkv_run_model m;
    mkv_capture *cap;
    mkv_dump_writer *writer;
} model_run;

static void model_run_free(model_run *r)
{
    mkv_dump_abort(r->writer);
    mkv_capture_free(r->cap);
    mkv_run_model_free(&r->m);
}

/* Exit with the message and status of err, after freeing the run. */
static void fail_run(model_run *r, const mkv_error *err)
{
    model_run_free(r);
    mkv_report(err);
    exit(mkv_exit_code(err->code));
}

/* A usage error when the output would replace the input file input (the
 * MODEL is protected by the dump writer itself). */
static void refuse_overwrite(model_run *r, const char *output, const char *input)
{
    mkv_error err;
    mkv_error_clear(&err);
    if (mkv_outfile_overwrites(output, input)) {
        mkv_fail(&err, MKV_EUSAGE, "output '%s' would overwrite the input", output);
        fail_run(r, &err);
    }
}

/* The root attribute capture_params: how the run was made. */
static void capture_params(const capture_args *a, const model_run *r, char *buf, size_t size)
{
    const mkv_prompt *p = &r->m.prompt;
    int n = snprintf(buf, size,
                     "format=%s prompt_tokens=%zu window=%d generate=%" PRId64
                     " temperature=%g top_p=%g seed=%" PRIu64 " bos=%d chat=%s",
                     r->m.shape ? "shape" : mkv_model_format_name(r->m.lm.format), p->n,
                     r->cap->n_queries - (int)a->generate, a->generate, a->temperature, a->top_p,
                     a->syn.seed, p->bos, p->chat_family ? p->chat_family : "none");
    if (r->m.shape && n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, " vocab=%d", r->m.model->cfg.vocab_size);
}

static int capture_model(const capture_args *a)
{
    model_run r;
    memset(&r, 0, sizeof r);
    mkv_error err;
    mkv_error_clear(&err);
    const mkv_prompt_opts *po = &a->prompt;
    if (mkv_prompt_opts_check(po, &err))
        misuse(err.msg);
    if (po->token_ids && a->given[OPT_TOKENS])
        misuse("--tokens and --token-ids exclude each other");
    if (a->print && strcmp(a->output, "-") == 0)
        misuse("--print and -o - both write to standard output");
    refuse_overwrite(&r, a->output, po->file);
    refuse_overwrite(&r, a->output, po->token_ids);
    refuse_overwrite(&r, a->output, a->tokenizer);

    /* 1. the model and the prompt */
    int chunk = (int)a->wo.chunk_tokens;
    mkv_run_model_opts mo = {a->model_path, a->shape, a->tokenizer, !po->token_ids || a->print,
                             a->layers, (int)a->vocab, a->syn.seed, (size_t)a->syn.n_tokens,
                             a->max_memory, a->threads, chunk, (int)a->generate, 0, 1};
    if (mkv_run_model_open(&mo, po, &r.m, &err))
        fail_run(&r, &err);
    refuse_overwrite(&r, a->output, r.m.lm.tokenizer_path[0] ? r.m.lm.tokenizer_path : NULL);
    const mkv_model_config *c = &r.m.model->cfg;
    const mkv_prompt *p = &r.m.prompt;
    mkv_info("%s: %s, %d layers, dim %d, %d/%d heads, head_dim %d, vocab %d, context %d",
             c->name, r.m.shape ? "random weights" : mkv_model_format_name(r.m.lm.format),
             c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size,
             c->max_seq_len);
    int window = a->window < (int64_t)p->n ? (int)a->window : (int)p->n;
    mkv_info("prompt: %zu tokens%s; capturing %d of %d layers, queries of %d positions", p->n,
             p->bos ? " (BOS first)" : "", r.m.n_layers, c->n_layers, window + (int)a->generate);

    /* 2. the forward pass, sized to this run */
    mkv_capture_opts co;
    mkv_capture_opts_init(&co);
    co.run.threads = a->threads;
    co.run.chunk = chunk;
    co.run.generate = (int)a->generate;
    co.run.temperature = a->temperature;
    co.run.top_p = a->top_p;
    co.run.seed = a->syn.seed;
    /* a shape-only model is built from the selected layers alone */
    co.layers = r.m.shape ? NULL : r.m.layer_index;
    co.n_layers = r.m.n_layers;
    co.k_rope_pre = a->k_rope_pre;
    co.window = window;
    if (mkv_capture_create(r.m.model, p->tokens, p->n, &co, &r.cap, &err))
        fail_run(&r, &err);

    /* 3. the dump, created before the long work so output errors come first */
    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    mkv_capture_meta(r.cap, &meta);
    if (a->model)
        snprintf(meta.model, sizeof meta.model, "%s", a->model);
    meta.dtype = a->dtype;
    mkv_dump_write_opts wo = a->wo;
    wo.protect = a->model_path;
    char params[1024];
    capture_params(a, &r, params, sizeof params);
    if (mkv_dump_create(a->output, &meta, &wo, &r.writer, &err) ||
        mkv_capture_set_attrs(r.writer, c, r.m.layer_index, r.m.n_layers, params, &err) ||
        (r.m.shape && mkv_dump_set_attr(r.writer, "weights", "random", &err)))
        fail_run(&r, &err);

    /* 4. the run, then commit */
    const mkv_run *run = &r.cap->run;
    if (mkv_capture_write(r.cap, r.writer, &err))
        fail_run(&r, &err);
    if (a->generate > 0 && r.m.lm.tok && mkv_log_get_level() >= MKV_LOG_INFO) {
        char *text = mkv_continuation_text(r.m.lm.tok, run->tokens, run->n_prompt, run->n_total);
        mkv_info("generated: %s", text ? text : "(out of memory)");
        free(text);
    }
    mkv_dump_writer *w = r.writer;
    r.writer = NULL;   /* commit frees it whatever the outcome */
    if (mkv_dump_commit(w, &err))
        fail_run(&r, &err);
    mkv_info("wrote %s: %s, %zu tokens (%zu generated), %d layers, %d queries",
             strcmp(a->output, "-") == 0 ? "stdout" : a->output, meta.model, run->n_total,
             run->n_total - run->n_prompt, r.m.n_layers, r.cap->n_queries);
    if (a->print) {
        mkv_print_continuation(r.m.lm.tok, run->tokens, run->n_prompt, run->n_total, stdout);
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
