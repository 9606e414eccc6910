/* mkv-decode: run a model with its KV cache compressed by a method, and
 * measure what that costs: generation, or teacher-forced perplexity, KL
 * divergence and top-1 agreement against the full cache.
 *
 * Examples:
 *   mkv-decode stories260K.bin -p "Once upon a time" -n 64 -m quest -P budget=0.25
 *   mkv-decode smollm2.gguf --chat -p "Name three colours." -n 40 -m mosaic
 *   mkv-decode smollm2.gguf --ppl data/heldout.txt --context 1K,2K --score 256 -m mosaic
 *   mkv-decode --shape smollm2-135m --tokens 4K -n 32 -m quest --stats steps.tsv
 *
 * The tool parses the command line and hands the run to the library's
 * decoder (lib/decode/decoder.h); models load through lib/model, methods
 * come from the registry (lib/methods/registry.c).
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/mkv.h"
#include "core/outfile.h"
#include "core/tensor.h"
#include "decode/decoder.h"
#include "decode/needle.h"
#include "gpu/decode_gpu.h"
#include "methods/method.h"
#include "mkv_cuda.h"
#include "model/prompt.h"
#include "mosaic/mosaic.h"
#include "model/run_model.h"
#include "model/sampler.h"

enum {
    OPT_LIST_METHODS = MKV_OPT_FIRST_TOOL,
    OPT_HELP_METHOD,
    OPT_PPL,
    OPT_CONTEXT,
    OPT_SCORE,
    OPT_NO_REFERENCE,
    OPT_WINDOWS,
    OPT_PER_TOKEN,
    OPT_STATS,
    OPT_WINDOW,
    OPT_CHUNK,
    OPT_TEMPERATURE,
    OPT_TOP_P,
    OPT_SEED,
    OPT_TOKENIZER,
    OPT_TOKEN_IDS,
    OPT_CHAT,
    OPT_SYSTEM,
    OPT_SPECIAL,
    OPT_BOS,
    OPT_NO_BOS,
    OPT_SHAPE,
    OPT_TOKENS,
    OPT_FILL,
    OPT_BATCH,
    OPT_LAYERS,
    OPT_NEEDLE,
    OPT_LENGTHS,
    OPT_DEPTHS,
    OPT_TRIALS,
    OPT_FILLER,
    OPT_PROMPTS,
    OPT_MANAGER,
    OPT_CLOSE_LOSS,
    OPT_GPU_WEIGHTS,
    OPT_GPU_BLOCKKEYS,
    OPT_END
};

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    MKV_THREADS_LONGOPT,
    MKV_DEVICE_LONGOPT,
    {"gpu-weights", required_argument, NULL, OPT_GPU_WEIGHTS},
    {"gpu-blockkeys", required_argument, NULL, OPT_GPU_BLOCKKEYS},
    {"method", required_argument, NULL, 'm'},
    {"param", required_argument, NULL, 'P'},
    {"list-methods", no_argument, NULL, OPT_LIST_METHODS},
    {"help-method", no_argument, NULL, OPT_HELP_METHOD},
    {"prompt", required_argument, NULL, 'p'},
    {"file", required_argument, NULL, 'f'},
    {"generate", required_argument, NULL, 'n'},
    {"output", required_argument, NULL, 'o'},
    {"ppl", required_argument, NULL, OPT_PPL},
    {"context", required_argument, NULL, OPT_CONTEXT},
    {"score", required_argument, NULL, OPT_SCORE},
    {"no-reference", no_argument, NULL, OPT_NO_REFERENCE},
    {"per-token", required_argument, NULL, OPT_PER_TOKEN},
    {"windows", required_argument, NULL, OPT_WINDOWS},
    {"stats", required_argument, NULL, OPT_STATS},
    {"window", required_argument, NULL, OPT_WINDOW},
    {"chunk", required_argument, NULL, OPT_CHUNK},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"seed", required_argument, NULL, OPT_SEED},
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"token-ids", required_argument, NULL, OPT_TOKEN_IDS},
    {"chat", no_argument, NULL, OPT_CHAT},
    {"system", required_argument, NULL, OPT_SYSTEM},
    {"special", no_argument, NULL, OPT_SPECIAL},
    {"bos", no_argument, NULL, OPT_BOS},
    {"no-bos", no_argument, NULL, OPT_NO_BOS},
    {"shape", required_argument, NULL, OPT_SHAPE},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"fill", required_argument, NULL, OPT_FILL},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"needle", no_argument, NULL, OPT_NEEDLE},
    {"lengths", required_argument, NULL, OPT_LENGTHS},
    {"depths", required_argument, NULL, OPT_DEPTHS},
    {"trials", required_argument, NULL, OPT_TRIALS},
    {"filler", required_argument, NULL, OPT_FILLER},
    {"prompts", required_argument, NULL, OPT_PROMPTS},
    {"manager", required_argument, NULL, OPT_MANAGER},
    {"close-loss", required_argument, NULL, OPT_CLOSE_LOSS},
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "m:P:p:f:n:o:"

#define DEFAULT_GENERATE 64
#define DEFAULT_CONTEXT 1024
#define DEFAULT_SCORE 256
#define MAX_CONTEXTS 16
#define NEEDLE_ANSWER_TOKENS 12

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s MODEL [-p TEXT | -f FILE | --token-ids FILE] [-n N] [-m METHOD [-P K=V,...]] [options]\n"
            "       %s MODEL --ppl TEXTFILE [--context C[,C...]] [--score N] [-m METHOD [-P K=V,...]] [options]\n"
            "       %s MODEL --needle [--lengths L,...] [--depths D,...] [--trials K] [-m METHOD] [options]\n"
            "       %s --shape NAME [--tokens N] [-n N] [-m METHOD] [options]\n"
            "       %s --list-methods | -m METHOD --help-method\n\n"
            "Decode MODEL with its KV cache compressed by METHOD: the prompt (or the first C\n"
            "tokens of the text) is prefilled with full attention, the cache it leaves is\n"
            "compressed, and every later token is one decode step over the compressed cache\n"
            "plus the tokens decoded since (kept dense in 16 bits). METHOD 'full' (the\n"
            "default) is the model's own dense cache.\n\n"
            "Generation (default mode):\n"
            "  -p, --prompt TEXT    the prompt text\n"
            "  -f, --file FILE      read the prompt from FILE ('-' = stdin; default: stdin\n"
            "                       when it is not a terminal)\n"
            "      --token-ids FILE whitespace-separated token ids, used as they are\n"
            "      --chat           wrap the prompt in the model's chat template\n"
            "      --system TEXT    system prompt for --chat\n"
            "      --special        control-token text in the prompt becomes the tokens\n"
            "      --bos, --no-bos  start with BOS or not (default: as the model does)\n"
            "      --tokenizer FILE llama2.c tokenizer (default: beside the checkpoint)\n"
            "  -n, --generate N     tokens to generate (default %d); the text streams to stdout\n"
            "      --temperature T  sampling temperature, 0 = greedy (default 0)\n"
            "      --top-p P        nucleus sampling cut-off in (0, 1] (default 1)\n"
            "      --seed N         sampling seed (--shape: weights and prompt too; default 1)\n"
            "      --stats FILE     one TSV row per decode step ('-' = stdout)\n\n"
            "Perplexity:\n"
            "      --ppl FILE       score the text of FILE: for each context C, prefill its\n"
            "                       first C tokens, compress, then teacher-force the next N\n"
            "                       tokens one decode step each\n"
            "      --context LIST   contexts in tokens, K suffixes (default 1K)\n"
            "      --score N        tokens scored per context (default %d)\n"
            "      --windows K      score K disjoint windows of the text, each C+N+1 tokens\n"
            "                       from the end of the last, pooled in one row (default 1)\n"
            "      --no-reference   skip the full-cache run (no KL or agreement)\n"
            "      --per-token FILE one TSV row per scored token: its log-probability with\n"
            "                       the method and with the full cache, KL and top-1 of the\n"
            "                       step ('-' = stdout), for paired comparisons of runs\n"
            "  -o, --output FILE    the perplexity or retrieval table (TSV; default stdout)\n\n"
            "Retrieval (passkey):\n"
            "      --needle         hide a 5-7 digit pass key in filler prose at each depth,\n"
            "                       ask for it at the end, answer greedily (exact match)\n"
            "      --lengths LIST   prompt lengths in tokens, K suffixes (default 1K,2K,4K,8K)\n"
            "      --depths LIST    where the key goes, 0..1 of the filler (default\n"
            "                       0,0.25,0.5,0.75,1)\n"
            "      --trials K       keys per length and depth (default 1)\n"
            "      --seed N         the keys' seed (default 1)\n"
            "      --filler FILE    the filler prose (default: data/filler.txt)\n"
            "      --prompts FILE   the prompts' text, one TSV row per case\n"
            "      --chat           wrap each prompt in the model's chat template\n\n"
            "Method:\n"
            "  -m, --method NAME    compression method (default full; see --list-methods)\n"
            "  -P, --param K=V[,K=V...]\n"
            "                       method parameters (repeatable)\n"
            "      --window W       observation queries: the last W prefill positions (default 32)\n"
            "      --list-methods   list the methods and their parameters, then exit\n"
            "      --help-method    describe the parameters of --method NAME, then exit\n"
            "      --manager MODE   the dual buffer's manager (mosaic, uniform2d): async (a\n"
            "                       thread of its own, the default), sync (on the decoding\n"
            "                       thread) or off (no segment closes: its cost, by difference)\n"
            "      --close-loss X   close a segment early once the energy its temporary\n"
            "                       strategy drops exceeds that strategy's own loss by X\n"
            "                       (0..1, default %.2g; 1: only at 'segment' tokens)\n\n"
            "Speed runs (random weights, never accuracy):\n"
            "      --shape NAME     a model of a published shape with seeded random weights\n"
            "      --tokens N       random prompt of N tokens (default 1K); with MODEL: the\n"
            "                       prompt's first N tokens (speed runs over real text)\n"
            "      --fill N         the full cache's first N positions filled directly with\n"
            "                       synthetic keys and values (no prefill), the prompt after\n"
            "                       them: long contexts in seconds (the shape's context grows\n"
            "                       to hold them); also quest's and mosaic's with --device gpu\n"
            "      --batch B        with --device gpu (full, quest, mosaic): B requests\n"
            "                       decoded together, each the prompt after its own filled\n"
            "                       rows; the text is request 0's, a step all B\n"
            "      --layers LIST    keep these layers of the shape, e.g. 0-3 (default all):\n"
            "                       where a cache does not fit, time a subset and scale\n"
            "      --chunk N        prefill chunk in tokens (default 512)\n\n"
            "Device:\n"
            "      --device D       gpu: the forward pass and the cache on the GPU\n"
            "                       (methods full, quest and mosaic so far); cpu; auto\n"
            "                       (default): the GPU when this build has CUDA, a GPU is\n"
            "                       there and the method is full\n"
            "      --gpu-weights T  the GPU's copy of the matrices: f32 (default) or f16\n"
            "      --gpu-blockkeys B\n"
            "                       mosaic on the GPU: blocks scored with block keys of 16\n"
            "                       bits (default, the CPU's) or 8 (8-bit codes, a scale per\n"
            "                       row; the fp16 rows not kept: less memory and reading)\n\n",
            mkv_progname(), mkv_progname(), mkv_progname(), mkv_progname(), mkv_progname(), DEFAULT_GENERATE,
            DEFAULT_SCORE, MKV_MOSAIC_CLOSE_LOSS_DEFAULT);
    mkv_common_usage(fp, MKV_COMMON_THREADS);
    mkv_method_names_usage(fp);
    exit(status);
}

MKV_TOOL_MISUSE(SHORTOPTS)

typedef struct {
    const char *model_path;
    const char *shape;
    const char *layers;
    const char *tokenizer;
    const mkv_method *method;
    mkv_params params;
    mkv_prompt_opts prompt;
    int64_t generate, tokens, fill, batch;
    const char *ppl, *output, *stats, *per_token;
    int64_t contexts[MAX_CONTEXTS];
    int n_contexts;
    int windows;               /* --ppl: disjoint windows of the text per context */
    int needle;
    int64_t lengths[MAX_CONTEXTS];
    int n_lengths;
    double depths[MAX_CONTEXTS];
    int n_depths;
    int64_t trials;
    const char *filler;
    const char *prompts;
    int64_t score, window, chunk;
    int reference;
    double temperature, top_p;
    uint64_t seed;
    int threads, verbosity;
    mkv_device device;
    int gpu_f16_weights;
    int gpu_blockkey_bits;
    int given[OPT_END + 128];
} decode_args;

static int64_t size_or_exit(const char *arg, const char *name, int64_t lo, int64_t hi)
{
    int64_t v;
    if (mkv_parse_size(arg, name, lo, hi, &v))
        exit(2);
    return v;
}

/* The items of a comma-separated list given to --name, each handed to
 * take(item, index, out); at most MAX_CONTEXTS.  Returns the count. */
static int parse_list(const char *arg, const char *name, void (*take)(const char *, const char *, int, void *),
                      void *out)
{
    char *copy = strdup(arg);
    if (!copy) {
        mkv_usage_error("out of memory");
        exit(1);
    }
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_CONTEXTS) {
            mkv_usage_error("invalid value '%s' for --%s: at most %d values", arg, name, MAX_CONTEXTS);
            exit(2);
        }
        take(tok, name, n++, out);
    }
    free(copy);
    if (n == 0) {
        mkv_usage_error("invalid value '%s' for --%s: expected a comma-separated list", arg, name);
        exit(2);
    }
    return n;
}

static void take_size(const char *item, const char *name, int i, void *out)
{
    ((int64_t *)out)[i] = size_or_exit(item, name, 1, INT32_MAX);
}

static void take_depth(const char *item, const char *name, int i, void *out)
{
    if (mkv_parse_double(item, name, 0.0, 1.0, &((double *)out)[i]))
        exit(2);
}

static int parse_size_list(const char *arg, const char *name, int64_t *out)
{
    return parse_list(arg, name, take_size, out);
}

static int parse_depths(const char *arg, double *out)
{
    return parse_list(arg, "depths", take_depth, out);
}

static void parse_contexts(decode_args *a, const char *arg)
{
    a->n_contexts = parse_size_list(arg, "context", a->contexts);
}

enum { MODE_GENERATE = 1, MODE_PPL = 2, MODE_NEEDLE = 4 };

/* Options that belong to some modes only. */
static const struct {
    int opt;
    int modes;
} MODE_OPTIONS[] = {
    {OPT_CONTEXT, MODE_PPL}, {OPT_SCORE, MODE_PPL}, {OPT_NO_REFERENCE, MODE_PPL | MODE_NEEDLE}, {OPT_PER_TOKEN, MODE_PPL},
    {OPT_WINDOWS, MODE_PPL},
    {'o', MODE_PPL | MODE_NEEDLE}, {'p', MODE_GENERATE}, {'n', MODE_GENERATE}, {'f', MODE_GENERATE},
    {OPT_TOKEN_IDS, MODE_GENERATE}, {OPT_TOKENS, MODE_GENERATE}, {OPT_FILL, MODE_GENERATE}, {OPT_BATCH, MODE_GENERATE},
    {OPT_LAYERS, MODE_GENERATE}, {OPT_CHAT, MODE_GENERATE | MODE_NEEDLE},
    {OPT_SYSTEM, MODE_GENERATE | MODE_NEEDLE}, {OPT_SPECIAL, MODE_GENERATE}, {OPT_TEMPERATURE, MODE_GENERATE},
    {OPT_TOP_P, MODE_GENERATE}, {OPT_STATS, MODE_GENERATE}, {OPT_LENGTHS, MODE_NEEDLE},
    {OPT_DEPTHS, MODE_NEEDLE}, {OPT_TRIALS, MODE_NEEDLE}, {OPT_FILLER, MODE_NEEDLE}, {OPT_PROMPTS, MODE_NEEDLE},
};

static const char *mode_name(int mode)
{
    return mode == MODE_PPL ? "--ppl" : mode == MODE_NEEDLE ? "--needle" : "generation";
}

static const char *option_name(int opt)
{
    for (const struct option *o = longopts; o->name; o++)
        if (o->val == opt)
            return o->name;
    return "?";
}

static void parse_args(int argc, char **argv, decode_args *a)
{
    memset(a, 0, sizeof *a);
    mkv_prompt_opts_init(&a->prompt);
    a->generate = DEFAULT_GENERATE;
    a->score = DEFAULT_SCORE;
    a->window = 32;
    a->reference = 1;
    a->top_p = 1.0;
    a->seed = 1;
    a->tokens = 1024;
    a->contexts[0] = DEFAULT_CONTEXT;
    a->n_contexts = 1;
    a->windows = 1;
    static const int64_t default_lengths[] = {1024, 2048, 4096, 8192};
    static const double default_depths[] = {0, 0.25, 0.5, 0.75, 1};
    memcpy(a->lengths, default_lengths, sizeof default_lengths);
    a->n_lengths = 4;
    memcpy(a->depths, default_depths, sizeof default_depths);
    a->n_depths = 5;
    a->trials = 1;
    mkv_common_opts common;
    mkv_common_init(&common);
    const char *method_name = "full";
    const char **param_args = calloc((size_t)argc + 1, sizeof *param_args);
    int n_param_args = 0, help_method = 0;
    if (!param_args) {
        mkv_usage_error("out of memory");
        exit(1);
    }

    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, SHORTOPTS, longopts, NULL)) != -1) {
        if (opt >= 0 && opt < (int)(sizeof a->given / sizeof *a->given))
            a->given[opt] = 1;
        switch (opt) {
        MKV_TOOL_STANDARD_CASES
        case 'm':
            method_name = optarg;
            break;
        case 'P':
            param_args[n_param_args++] = optarg;
            break;
        case OPT_LIST_METHODS:
            mkv_list_methods(stdout);
            exit(0);
        case OPT_HELP_METHOD:
            help_method = 1;
            break;
        case 'p':
            a->prompt.text = optarg;
            break;
        case 'f':
            a->prompt.file = optarg;
            break;
        case 'n':
            a->generate = size_or_exit(optarg, "generate", 0, INT32_MAX);
            break;
        case 'o':
            a->output = optarg;
            break;
        case OPT_PPL:
            a->ppl = optarg;
            break;
        case OPT_CONTEXT:
            parse_contexts(a, optarg);
            break;
        case OPT_SCORE:
            a->score = size_or_exit(optarg, "score", 1, INT32_MAX);
            break;
        case OPT_NO_REFERENCE:
            a->reference = 0;
            break;
        case OPT_PER_TOKEN:
            a->per_token = optarg;
            break;
        case OPT_WINDOWS:
            a->windows = (int)size_or_exit(optarg, "windows", 1, 1024);
            break;
        case OPT_STATS:
            a->stats = optarg;
            break;
        case OPT_WINDOW:
            a->window = size_or_exit(optarg, "window", 1, 65536);
            break;
        case OPT_CHUNK:
            a->chunk = size_or_exit(optarg, "chunk", 1, 1 << 20);
            break;
        case OPT_TEMPERATURE:
            if (mkv_parse_double(optarg, "temperature", 0.0, 100.0, &a->temperature))
                exit(2);
            break;
        case OPT_TOP_P:
            if (mkv_parse_double(optarg, "top-p", 1e-9, 1.0, &a->top_p))
                exit(2);
            break;
        case OPT_SEED:
            if (mkv_parse_seed(optarg, "seed", &a->seed))
                exit(2);
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
        case OPT_SHAPE:
            a->shape = optarg;
            break;
        case OPT_TOKENS:
            a->tokens = size_or_exit(optarg, "tokens", 1, INT32_MAX);
            break;
        case OPT_FILL:
            a->fill = size_or_exit(optarg, "fill", 1, INT32_MAX);
            break;
        case OPT_BATCH:
            a->batch = size_or_exit(optarg, "batch", 1, 4096);
            break;
        case OPT_LAYERS:
            a->layers = optarg;
            break;
        case OPT_NEEDLE:
            a->needle = 1;
            break;
        case OPT_LENGTHS:
            a->n_lengths = parse_size_list(optarg, "lengths", a->lengths);
            break;
        case OPT_DEPTHS:
            a->n_depths = parse_depths(optarg, a->depths);
            break;
        case OPT_TRIALS:
            a->trials = size_or_exit(optarg, "trials", 1, 1000000);
            break;
        case OPT_FILLER:
            a->filler = optarg;
            break;
        case OPT_PROMPTS:
            a->prompts = optarg;
            break;
        case OPT_MANAGER:
            if (strcmp(optarg, "async") && strcmp(optarg, "sync") && strcmp(optarg, "off")) {
                mkv_usage_error("invalid value '%s' for --manager: expected async, sync or off", optarg);
                exit(2);
            }
            mkv_mosaic_set_manager(optarg[0] == 'a'   ? MKV_MOSAIC_MANAGER_ASYNC
                                   : optarg[0] == 's' ? MKV_MOSAIC_MANAGER_SYNC
                                                      : MKV_MOSAIC_MANAGER_OFF);
            break;
        case OPT_CLOSE_LOSS: {
            double rise;
            if (mkv_parse_double(optarg, "close-loss", 0.0, 1.0, &rise))
                exit(2);
            mkv_mosaic_set_close_loss(rise);
            break;
        }
        case OPT_GPU_WEIGHTS:
            if (strcmp(optarg, "f16") != 0 && strcmp(optarg, "f32") != 0) {
                mkv_usage_error("invalid value '%s' for --gpu-weights: expected f32 or f16", optarg);
                exit(2);
            }
            a->gpu_f16_weights = strcmp(optarg, "f16") == 0;
            break;
        case OPT_GPU_BLOCKKEYS:
            if (strcmp(optarg, "16") != 0 && strcmp(optarg, "8") != 0) {
                mkv_usage_error("invalid value '%s' for --gpu-blockkeys: expected 16 or 8", optarg);
                exit(2);
            }
            a->gpu_blockkey_bits = atoi(optarg);
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
    a->threads = common.threads ? common.threads : mkv_ncpus();
    a->verbosity = common.verbosity;
    a->device = common.device;
    if (help_method) {
        mkv_print_method(stdout, mkv_method_or_exit(method_name));
        exit(0);
    }
    a->method = mkv_method_or_exit(method_name);
    mkv_params_init(&a->params, a->method->params);
    for (int i = 0; i < n_param_args; i++)
        mkv_method_params_or_exit(a->method, &a->params, param_args[i]);
    free(param_args);
    if ((a->given[OPT_MANAGER] || a->given[OPT_CLOSE_LOSS]) && a->method->append != mkv_mosaic_method_append)
        mkv_warn("--%s applies to the dual buffer of mosaic and uniform2d only; method %s ignores it",
                 option_name(a->given[OPT_MANAGER] ? OPT_MANAGER : OPT_CLOSE_LOSS), a->method->name);

    if (optind < argc)
        a->model_path = argv[optind++];
    if (optind < argc) {
        char what[300];
        snprintf(what, sizeof what, "too many operands ('%s' after MODEL)", argv[optind]);
        misuse(what);
    }
    if (!a->model_path && !a->shape)
        misuse("missing MODEL (or --shape NAME)");
    if (a->model_path && a->shape)
        misuse("MODEL and --shape exclude each other");
    if (a->ppl && a->needle)
        misuse("--ppl and --needle exclude each other");
    if (a->shape && (a->ppl || a->needle))
        misuse(a->ppl ? "--ppl needs a real model, not --shape (random weights measure speed only)"
                      : "--needle needs a real model, not --shape (random weights measure speed only)");
    const int on_gpu_mosaic = a->device == MKV_DEVICE_GPU && strcmp(a->method->name, "mosaic") == 0;
    if (a->device == MKV_DEVICE_GPU && strcmp(a->method->name, "full") != 0 && strcmp(a->method->name, "quest") != 0 &&
        !on_gpu_mosaic) {
        mkv_usage_error("method '%s' has no GPU decode path yet (only full, quest and mosaic have); use --device cpu",
                        a->method->name);
        exit(2);
    }
    char why[160];
    if (on_gpu_mosaic && !mkv_gpu_decode_mosaic_supports(&a->params, why, sizeof why)) {
        mkv_usage_error("mosaic on the GPU: %s; use --device cpu", why);
        exit(2);
    }
    if (a->given[OPT_GPU_WEIGHTS] && a->device == MKV_DEVICE_CPU)
        misuse("--gpu-weights is an option of --device gpu or auto");
    if (a->given[OPT_GPU_BLOCKKEYS] && !on_gpu_mosaic)
        misuse("--gpu-blockkeys is an option of -m mosaic with --device gpu");
    int mode = a->ppl ? MODE_PPL : a->needle ? MODE_NEEDLE : MODE_GENERATE;
    for (size_t i = 0; i < sizeof MODE_OPTIONS / sizeof *MODE_OPTIONS; i++)
        if (a->given[MODE_OPTIONS[i].opt] && !(MODE_OPTIONS[i].modes & mode)) {
            char what[160];
            snprintf(what, sizeof what, "--%s is not an option of %s", option_name(MODE_OPTIONS[i].opt),
                     mode_name(mode));
            misuse(what);
        }
    if (a->batch > 1 && (!a->shape || a->device != MKV_DEVICE_GPU))
        misuse("--batch is for speed runs with --shape and --device gpu");
    if (a->layers && !a->shape)
        misuse("--layers is for speed runs with --shape (a real model without some of its layers means nothing)");
    if (a->fill && !a->shape)
        misuse("--fill is for speed runs with --shape (synthetic rows under a real model mean nothing)");
    if (a->fill && strcmp(a->method->name, "full") != 0 &&
        !((strcmp(a->method->name, "quest") == 0 || on_gpu_mosaic) && a->device == MKV_DEVICE_GPU)) {
        mkv_usage_error("--fill fills the full cache (and quest's and mosaic's with --device gpu); method '%s' "
                        "compresses a real prefill", a->method->name);
        exit(2);
    }
    mkv_error err;
    if (mkv_prompt_opts_check(&a->prompt, &err))
        misuse(err.msg);
    if (a->stats && a->stats[0] == '-' && a->stats[1] == '\0')
        misuse("--stats - and the generated text both write to standard output");
    if (a->ppl && a->output && mkv_outfile_overwrites(a->output, a->ppl))
        misuse("-o would overwrite the --ppl text");
    if (a->per_token) {
        int to_stdout = a->per_token[0] == '-' && a->per_token[1] == '\0';
        if (to_stdout && (!a->output || strcmp(a->output, "-") == 0))
            misuse("--per-token - and the perplexity table both write to standard output");
        if (!to_stdout && mkv_outfile_overwrites(a->per_token, a->ppl))
            misuse("--per-token would overwrite the --ppl text");
        if (!to_stdout && a->output && mkv_outfile_overwrites(a->per_token, a->output))
            misuse("--per-token and -o name the same file");
    }
}

static void fail(const mkv_error *err)
{
    mkv_report(err);
    exit(mkv_exit_code(err->code));
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void decoder_opts(const decode_args *a, int max_new, mkv_decoder_opts *o)
{
    mkv_decoder_opts_init(o);
    o->method = a->method;
    o->params = &a->params;
    o->threads = a->threads;
    o->chunk = (int)a->chunk;
    o->window = (int)a->window;
    o->max_new = max_new;
    o->gpu = a->device == MKV_DEVICE_GPU;
    o->gpu_f16_weights = a->gpu_f16_weights;
    o->gpu_blockkey_bits = a->gpu_blockkey_bits;
    o->fill = a->fill;
    o->fill_seed = a->seed;
    o->batch = (int)a->batch;
}

/* --device: gpu must find a usable GPU; auto takes one when the method can
 * use it (the CPU otherwise, saying why at -v). */
static int resolve_device(decode_args *a, mkv_error *err)
{
    if (a->device == MKV_DEVICE_CPU)
        return MKV_OK;
    const char *why = NULL;
    mkv_gpu_info info[1];
    int count = 0;
    const int full = strcmp(a->method->name, "full") == 0;
    if (!full && strcmp(a->method->name, "quest") != 0 && strcmp(a->method->name, "mosaic") != 0)
        why = "the method has no GPU decode path yet";
    else if (!full && a->device != MKV_DEVICE_GPU)
        why = "quest and mosaic decode on the GPU with --device gpu only";
    else if (!mkv_cuda_built())
        why = "built without CUDA";
    else if (mkv_cuda_devices(info, 1, &count, err) != MKV_OK)
        return err->code;
    else if (count == 0)
        why = "no GPU found";
    else if (!info[0].usable)
        why = "GPU 0 is not a target of this build";
    if (!why) {
        a->device = MKV_DEVICE_GPU;
        mkv_info("decoding on GPU 0, %s", info[0].name);
        return MKV_OK;
    }
    if (a->device == MKV_DEVICE_GPU)
        return mkv_fail(err, MKV_EUNSUP, "--device gpu: %s (use --device cpu or auto)", why);
    mkv_info("%s; decoding on the CPU", why);
    a->device = MKV_DEVICE_CPU;
    return MKV_OK;
}

/* ---------------------------------------------------------- generation */

#define STATS_HEADER                                                                                  \
    "step\ttokens\tprefix_tokens\ttail_tokens\tbytes_held\tlogical_bytes\tbytes_read\tstep_ms\t"        \
    "segments_finalized\ttemp_tokens\twaited\n"

static int generate(const decode_args *a, mkv_run_model *rm, mkv_error *err)
{
    const mkv_model *model = rm->model;
    const mkv_prompt *p = &rm->prompt;
    int V = model->cfg.vocab_size;
    mkv_outfile stats = {0};
    int have_stats = 0, rc;
    if (a->stats) {
        const char *protect = a->model_path ? a->model_path : NULL;
        if (a->prompt.file && mkv_outfile_overwrites(a->stats, a->prompt.file))
            return mkv_fail(err, MKV_EUSAGE, "--stats would overwrite the prompt file '%s'", a->prompt.file);
        if ((rc = mkv_outfile_open(&stats, a->stats, protect, 0, err)))
            return rc;
        have_stats = 1;
        fputs(STATS_HEADER, mkv_outfile_fp(&stats));
    }
    const int B = a->batch > 1 ? (int)a->batch : 1;
    float *logits = mkv_alloc((size_t)B * (size_t)V, sizeof(float), "logits", err);
    int32_t *toks = logits ? mkv_alloc((size_t)B, sizeof *toks, "tokens", err) : NULL;
    if (!toks) {
        mkv_free(logits);
        if (have_stats)
            mkv_outfile_abort(&stats);
        return MKV_ENOMEM;
    }
    mkv_decoder_opts o;
    decoder_opts(a, (int)a->generate, &o);
    mkv_decoder *d = NULL;
    mkv_sampler s;
    mkv_sampler_init(&s, (float)a->temperature, (float)a->top_p, a->seed);
    rc = mkv_decoder_prefill(model, p->tokens, (int64_t)p->n, &o, logits, &d, err);
    int prev = p->n ? p->tokens[p->n - 1] : -1;
    double steps_seconds = 0;
    int64_t done = 0;
    for (int64_t i = 0; i < a->generate && !rc; i++) {
        for (int b = 0; b < B && !rc; b++)
            if ((toks[b] = mkv_sample(&s, logits + (size_t)b * V, V, err)) < 0)
                rc = err->code;
        if (rc)
            break;
        const int tok = toks[0];
        if (rm->lm.tok) {
            size_t len;
            const char *piece = mkv_tokenizer_piece(rm->lm.tok, prev, tok, &len);
            if (piece && fwrite(piece, 1, len, stdout) != len)
                rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write to standard output");
            fflush(stdout);
        } else {
            printf("%s%d", i ? " " : "", tok);
        }
        prev = tok;
        if (rc)
            break;
        if (rm->lm.tok && tok == rm->lm.tok->eos_id)
            break;
        double t0 = now();
        if ((rc = mkv_decoder_step_batch(d, toks, logits, err)))
            break;
        double dt = now() - t0;
        steps_seconds += dt;
        done++;
        if (have_stats) {
            mkv_decoder_stats st;
            mkv_decoder_get_stats(d, &st);
            fprintf(mkv_outfile_fp(&stats), "%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRIu64
                    "\t%" PRIu64 "\t%" PRIu64 "\t%.3f\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\n", i + 1, st.tokens,
                    st.prefix_tokens, st.tail_tokens, st.bytes_held, st.logical_bytes, st.bytes_read, 1e3 * dt,
                    st.growth.finalized, st.growth.temp_tokens, st.growth.steps_waited);
        }
    }
    if (!rc) {
        fputc('\n', stdout);
        if (fflush(stdout) != 0)
            rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot write to standard output");
    }
    if (!rc && a->verbosity > MKV_LOG_ERROR) {
        mkv_decoder_stats st;
        mkv_decoder_get_stats(d, &st);
        if (st.growth.finalized || st.growth.temp_bytes_peak)
            fprintf(stderr,
                    "%s: %s: during decoding %" PRId64 " segments (over all layers and heads) were finalised, "
                    "%.1f ms each on average (at most %.1f ms), %.1f ms of manager CPU in all, %" PRId64
                    " steps waited; temporary region at most %" PRIu64 " bytes\n",
                    mkv_progname(), a->method->name, st.growth.finalized,
                    st.growth.finalized ? 1e3 * st.growth.finalize_seconds / (double)st.growth.finalized : 0.0,
                    1e3 * st.growth.finalize_seconds_max, 1e3 * st.growth.manager_cpu_seconds,
                    st.growth.steps_waited, st.growth.temp_bytes_peak);
        char filled[96] = "";
        if (a->fill)
            snprintf(filled, sizeof filled, " after %" PRId64 " filled positions", a->fill);
        if (B > 1)
            snprintf(filled + strlen(filled), sizeof filled - strlen(filled), ", %d requests", B);
        fprintf(stderr,
                "%s: %s%s: prompt %zu tokens%s, %" PRId64 " decode steps, %.2f ms per step; KV %" PRIu64
                " bytes held (dense 16-bit %" PRIu64 ", ratio %.3f); prefill %.2f s, compression %.2f s\n",
                mkv_progname(), a->method->name, o.gpu ? " on the GPU" : "", p->n, filled, done,
                done ? 1e3 * steps_seconds / (double)done : 0.0,
                st.bytes_held, st.logical_bytes, (double)st.logical_bytes / (double)st.bytes_held,
                st.prefill_seconds, st.compress_seconds);
    }
    if (have_stats) {
        if (rc)
            mkv_outfile_abort(&stats);
        else
            rc = mkv_outfile_commit(&stats, err);
    }
    mkv_decoder_free(d);
    mkv_sampler_free(&s);
    mkv_free(toks);
    mkv_free(logits);
    return rc;
}

/* ---------------------------------------------------------- perplexity */

#define PPL_HEADER                                                                                   \
    "context\tscored\tmethod\tparams\tppl\tppl_full\tppl_increase_pct\tkl\tagreement\tphysical_ratio\t" \
    "bytes_held\tlogical_bytes\tbytes_read_step\tdense_read_step\tprefill_s\tcompress_s\tstep_ms\t"      \
    "step_ms_full\tnll_diff_se\tppl_increase_lo_pct\tppl_increase_hi_pct\n"

#define PER_TOKEN_HEADER "context\tposition\ttarget\tlogprob\tlogprob_full\tkl\ttop1\ttop1_full\n"

/* The increase of exp(nll - nll_full) at z standard errors (95%: 1.96). */
static double increase_at(const mkv_ppl_result *r, double z)
{
    return 100.0 * (exp(r->nll - r->nll_full + z * r->nll_diff_se) - 1.0);
}

static void per_token_rows(FILE *fp, const mkv_ppl_result *r, const mkv_ppl_token *t)
{
    for (int64_t i = 0; i < r->scored; i++)
        fprintf(fp, "%" PRId64 "\t%" PRId64 "\t%" PRId32 "\t%.9g\t%.9g\t%.6g\t%" PRId32 "\t%" PRId32 "\n",
                r->context, t[i].position, t[i].target, t[i].logprob, t[i].logprob_full, t[i].kl, t[i].top1,
                t[i].top1_full);
}

static int perplexity(const decode_args *a, mkv_run_model *rm, mkv_error *err)
{
    const mkv_prompt *p = &rm->prompt;
    int rc;
    for (int i = 0; i < a->n_contexts; i++)
        if ((rc = mkv_ppl_check(p->n, a->contexts[i], a->score, a->windows, err)))
            return rc;
    mkv_outfile out, tokens_out;
    mkv_ppl_token *per_token = NULL;
    if (a->per_token) {
        if (!(per_token = mkv_alloc((size_t)a->windows * (size_t)a->score, sizeof *per_token, "per-token results",
                                    err)))
            return MKV_ENOMEM;
        if ((rc = mkv_outfile_open(&tokens_out, a->per_token, a->ppl, 0, err))) {
            mkv_free(per_token);
            return rc;
        }
        fputs(PER_TOKEN_HEADER, mkv_outfile_fp(&tokens_out));
    }
    if ((rc = mkv_outfile_open(&out, a->output ? a->output : "-", a->ppl, 0, err))) {
        if (per_token)
            mkv_outfile_abort(&tokens_out);
        mkv_free(per_token);
        return rc;
    }
    FILE *fp = mkv_outfile_fp(&out);
    fputs(PPL_HEADER, fp);
    char params[1024];
    mkv_params_format(&a->params, params, sizeof params);
    for (int i = 0; i < a->n_contexts && !rc; i++) {
        mkv_decoder_opts o;
        decoder_opts(a, (int)a->score, &o);
        mkv_ppl_result r;
        if ((rc = mkv_decode_ppl_windows(rm->model, p->tokens, p->n, a->contexts[i], a->score, a->windows, &o,
                                         a->reference, &r, per_token, err)))
            break;
        double ppl = exp(r.nll), ppl_full = exp(r.nll_full);
        fprintf(fp, "%" PRId64 "\t%" PRId64 "\t%s\t%s\t%.6f\t%.6f\t%.4f\t%.6g\t%.4f\t%.4f\t%" PRIu64 "\t%" PRIu64
                "\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.6g\t%.4f\t%.4f\n",
                r.context, r.scored, a->method->name, params[0] ? params : "-", ppl, ppl_full,
                100.0 * (ppl / ppl_full - 1.0), r.kl, r.agreement,
                (double)r.prefix_logical_bytes / (double)r.prefix_bytes_held, r.bytes_held, r.logical_bytes,
                r.bytes_read_mean, r.dense_read_mean, r.prefill_seconds, r.compress_seconds, 1e3 * r.step_seconds,
                1e3 * r.step_seconds_full, r.nll_diff_se, increase_at(&r, -1.96), increase_at(&r, 1.96));
        fflush(fp);
        if (per_token)
            per_token_rows(mkv_outfile_fp(&tokens_out), &r, per_token);
        mkv_info("context %" PRId64 ": perplexity %.4f (full %.4f)", r.context, ppl, ppl_full);
    }
    mkv_free(per_token);
    if (!rc && per_token)
        rc = mkv_outfile_commit(&tokens_out, err);
    else if (per_token)
        mkv_outfile_abort(&tokens_out);
    if (rc) {
        mkv_outfile_abort(&out);
        return rc;
    }
    return mkv_outfile_commit(&out, err);
}

/* ---------------------------------------------------------- retrieval */

#define NEEDLE_HEADER                                                                              \
    "length\tdepth\ttrial\ttokens\tneedle_depth\tpasskey\tmethod\tparams\tanswer\tcorrect\t"     \
    "answer_full\tcorrect_full\n"

/* The answer's text with tabs and line breaks as spaces, for a TSV cell. */
static char *answer_text(const mkv_tokenizer *t, const int32_t *ids, int n, mkv_error *err)
{
    char *text;
    size_t len;
    if (mkv_tokenizer_decode(t, ids, (size_t)n, &text, &len, err))
        return NULL;
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\t' || text[i] == '\n' || text[i] == '\r' || text[i] == '\0')
            text[i] = ' ';
    return text;
}

static const char *filler_path(const decode_args *a, char *buf, size_t size)
{
    if (a->filler)
        return a->filler;
    const char *dir = getenv("MKV_DATA_DIR");
    snprintf(buf, size, "%s/filler.txt", dir && *dir ? dir : MKV_SOURCE_DATA_DIR);
    return buf;
}

/* --prompts: one row per case, the text with backslash, tab and line
 * breaks escaped (\\, \t, \n, \r). */
static int write_prompts(const decode_args *a, const mkv_needle_case *cases, size_t n, const char *filler,
                         mkv_error *err)
{
    mkv_outfile o;
    int rc = mkv_outfile_open(&o, a->prompts, filler, 0, err);
    if (rc)
        return rc;
    FILE *fp = mkv_outfile_fp(&o);
    fputs("length\tdepth\ttrial\tpasskey\tprompt\n", fp);
    for (size_t i = 0; i < n; i++) {
        int li = (int)(i / ((size_t)a->n_depths * (size_t)a->trials));
        int di = (int)(i / (size_t)a->trials % (size_t)a->n_depths);
        fprintf(fp, "%" PRId64 "\t%g\t%zu\t%s\t", a->lengths[li], a->depths[di], i % (size_t)a->trials,
                cases[i].passkey);
        for (const char *c = cases[i].text; *c; c++)
            if (*c == '\\' || *c == '\t' || *c == '\n' || *c == '\r')
                fprintf(fp, "\\%c", *c == '\\' ? '\\' : *c == '\t' ? 't' : *c == '\n' ? 'n' : 'r');
            else
                fputc(*c, fp);
        fputc('\n', fp);
    }
    return mkv_outfile_commit(&o, err);
}

static int needle(const decode_args *a, mkv_error *err)
{
    char fbuf[4200];
    const char *fpath = filler_path(a, fbuf, sizeof fbuf);
    if (a->output && mkv_outfile_overwrites(a->output, fpath))
        return mkv_fail(err, MKV_EUSAGE, "-o would overwrite the filler text '%s'", fpath);
    if (a->prompts && mkv_outfile_overwrites(a->prompts, fpath))
        return mkv_fail(err, MKV_EUSAGE, "--prompts would overwrite the filler text '%s'", fpath);
    if (a->prompts && a->output && mkv_outfile_overwrites(a->prompts, a->output))
        return mkv_fail(err, MKV_EUSAGE, "--prompts and -o name the same file");
    mkv_loaded_model lm;
    mkv_model_load_opts lo = {a->tokenizer, 1, a->device == MKV_DEVICE_CPU};
    int rc = mkv_model_load(a->model_path, &lo, &lm, err);
    if (rc)
        return rc;
    const mkv_model_config *c = &lm.model->cfg;
    char *filler = NULL;
    size_t filler_len = 0;
    for (int i = 0; i < a->n_lengths && !rc; i++)
        if (a->lengths[i] > c->max_seq_len)
            rc = mkv_fail(err, MKV_EFORMAT, "a prompt of %lld tokens exceeds the context of %d of model '%s'",
                          (long long)a->lengths[i], c->max_seq_len, c->name);
        else if (a->lengths[i] <= 4 * NEEDLE_ANSWER_TOKENS)
            rc = mkv_fail(err, MKV_EUSAGE, "--lengths: %lld tokens cannot hold a passkey prompt",
                          (long long)a->lengths[i]);
    if (!rc)
        rc = mkv_read_file(fpath, &filler, &filler_len, err);
    /* every prompt first, so that a length that cannot be met fails
     * before anything is written */
    int cells = a->n_lengths * a->n_depths;
    size_t n_cases = (size_t)cells * (size_t)a->trials;
    mkv_needle_case *cases = rc ? NULL : calloc(n_cases, sizeof *cases);
    int64_t *hits = rc ? NULL : calloc((size_t)cells * 2, sizeof *hits);
    if (!rc && (!cases || !hits))
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for %zu passkey prompts", n_cases);
    for (size_t i = 0; i < n_cases && !rc; i++) {
        int li = (int)(i / ((size_t)a->n_depths * (size_t)a->trials));
        int di = (int)(i / (size_t)a->trials % (size_t)a->n_depths);
        rc = mkv_needle_build(&lm, a->model_path, &a->prompt, filler, filler_len,
                              a->lengths[li] - NEEDLE_ANSWER_TOKENS, a->seed, a->lengths[li], a->depths[di],
                              (int)(i % (size_t)a->trials), &cases[i], err);
    }
    if (!rc && a->prompts)
        rc = write_prompts(a, cases, n_cases, fpath, err);
    mkv_outfile out;
    int have_out = 0;
    if (!rc && !(rc = mkv_outfile_open(&out, a->output ? a->output : "-", fpath, 0, err)))
        have_out = 1;
    if (have_out)
        fputs(NEEDLE_HEADER, mkv_outfile_fp(&out));
    char params[1024];
    mkv_params_format(&a->params, params, sizeof params);
    int32_t answer[NEEDLE_ANSWER_TOKENS], answer_full[NEEDLE_ANSWER_TOKENS];
    for (int li = 0; li < a->n_lengths && !rc; li++)
        for (int di = 0; di < a->n_depths && !rc; di++)
            for (int64_t k = 0; k < a->trials && !rc; k++) {
                const mkv_needle_case *c0 = &cases[((size_t)li * (size_t)a->n_depths + (size_t)di) * (size_t)a->trials + (size_t)k];
                mkv_needle_case nc = *c0;
                mkv_decoder_opts o;
                decoder_opts(a, NEEDLE_ANSWER_TOKENS, &o);
                int n = 0, n_full = 0;
                rc = mkv_needle_answer(lm.model, nc.prompt.tokens, nc.prompt.n, &o, NEEDLE_ANSWER_TOKENS,
                                       lm.tok->eos_id, answer, &n, a->reference ? answer_full : NULL, &n_full,
                                       err);
                char *text = rc ? NULL : answer_text(lm.tok, answer, n, err);
                char *text_full = rc || !text || !a->reference ? NULL : answer_text(lm.tok, answer_full, n_full, err);
                if (!rc && (!text || (a->reference && !text_full)))
                    rc = err->code ? err->code : MKV_ENOMEM;
                if (!rc) {
                    int ok = mkv_needle_correct(text, nc.passkey);
                    int ok_full = a->reference && mkv_needle_correct(text_full, nc.passkey);
                    hits[2 * (li * a->n_depths + di)] += ok;
                    hits[2 * (li * a->n_depths + di) + 1] += ok_full;
                    fprintf(mkv_outfile_fp(&out), "%" PRId64 "\t%g\t%" PRId64 "\t%zu\t%.4f\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n",
                            a->lengths[li], a->depths[di], k, nc.prompt.n, nc.needle_depth, nc.passkey,
                            a->method->name, params[0] ? params : "-", text, ok, a->reference ? text_full : "-",
                            a->reference ? (ok_full ? "1" : "0") : "-");
                    fflush(mkv_outfile_fp(&out));
                }
                free(text);
                free(text_full);
            }
    if (!rc && a->verbosity > MKV_LOG_ERROR) {
        fprintf(stderr, "%s: %s: passkey accuracy (full cache in parentheses)\n%-8s", mkv_progname(),
                a->method->name, "length");
        for (int di = 0; di < a->n_depths; di++)
            fprintf(stderr, "  depth %-9g", a->depths[di]);
        fputc('\n', stderr);
        for (int li = 0; li < a->n_lengths; li++) {
            fprintf(stderr, "%-8" PRId64, a->lengths[li]);
            for (int di = 0; di < a->n_depths; di++) {
                int64_t *h = hits + 2 * (li * a->n_depths + di);
                if (a->reference)
                    fprintf(stderr, "  %5.2f (%5.2f)   ", (double)h[0] / a->trials, (double)h[1] / a->trials);
                else
                    fprintf(stderr, "  %5.2f           ", (double)h[0] / a->trials);
            }
            fputc('\n', stderr);
        }
    }
    for (size_t i = 0; cases && i < n_cases; i++) {
        free(cases[i].prompt.tokens);
        free(cases[i].text);
    }
    free(cases);
    free(hits);
    free(filler);
    if (have_out) {
        if (rc)
            mkv_outfile_abort(&out);
        else
            rc = mkv_outfile_commit(&out, err);
    }
    mkv_loaded_model_free(&lm);
    return rc;
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    decode_args a;
    parse_args(argc, argv, &a);
    mkv_error err;
    mkv_error_clear(&err);
    if (resolve_device(&a, &err))
        fail(&err);

    if (a.needle) {
        if (needle(&a, &err))
            fail(&err);
        return 0;
    }
    mkv_prompt_opts po = a.prompt;
    int64_t run_tokens = 0, max_context = 0;
    if (a.ppl) {
        mkv_prompt_opts_init(&po);
        po.file = a.ppl;
        for (int i = 0; i < a.n_contexts; i++)
            if (a.contexts[i] > max_context)
                max_context = a.contexts[i];
        run_tokens = max_context + a.score;
    } else if (a.model_path && a.given[OPT_TOKENS]) {
        run_tokens = a.tokens + a.generate; /* the prompt is cut to its first a.tokens */
    }
    mkv_run_model_opts mo = {.path = a.model_path, .shape = a.shape, .tokenizer = a.tokenizer, .layers = a.layers,
                             .need_tokenizer = !po.token_ids, .vocab = 0, .seed = a.seed,
                             .random_tokens = (size_t)a.tokens, .threads = a.threads,
                             .chunk = a.chunk > 0 ? (int)a.chunk : 512, .generate = a.ppl ? 0 : (int)a.generate,
                             .run_tokens = run_tokens, .keep_blocks = a.device == MKV_DEVICE_CPU,
                             .fill = a.fill, .fill_on_host = a.device == MKV_DEVICE_CPU};
    mkv_run_model rm;
    if (mkv_run_model_open(&mo, &po, &rm, &err)) {
        mkv_run_model_free(&rm);
        fail(&err);
    }
    if (a.model_path && a.given[OPT_TOKENS] && !a.ppl) {
        if (rm.prompt.n < (size_t)a.tokens) {
            mkv_fail(&err, MKV_EFORMAT, "--tokens %lld: the prompt has only %zu tokens", (long long)a.tokens,
                     rm.prompt.n);
            mkv_run_model_free(&rm);
            fail(&err);
        }
        rm.prompt.n = (size_t)a.tokens;
    }
    const mkv_model_config *c = &rm.model->cfg;
    mkv_info("%s: %d layers, %d/%d heads, head_dim %d, vocab %d, context %d; method %s", c->name, c->n_layers,
             c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->max_seq_len, a.method->name);
    int rc = a.ppl ? perplexity(&a, &rm, &err) : generate(&a, &rm, &err);
    mkv_run_model_free(&rm);
    if (rc)
        fail(&err);
    return 0;
}
