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
#include "methods/method.h"
#include "model/prompt.h"
#include "model/run_model.h"
#include "model/sampler.h"

enum {
    OPT_LIST_METHODS = MKV_OPT_FIRST_TOOL,
    OPT_HELP_METHOD,
    OPT_PPL,
    OPT_CONTEXT,
    OPT_SCORE,
    OPT_NO_REFERENCE,
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
    OPT_END
};

static const struct option longopts[] = {
    MKV_COMMON_LONGOPTS,
    MKV_THREADS_LONGOPT,
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
    {NULL, 0, NULL, 0}};

/* Leading ':' so a missing value is told apart from an unknown option. */
#define SHORTOPTS ":" MKV_COMMON_SHORTOPTS "m:P:p:f:n:o:"

#define DEFAULT_GENERATE 64
#define DEFAULT_CONTEXT 1024
#define DEFAULT_SCORE 256
#define MAX_CONTEXTS 16

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "Usage: %s MODEL [-p TEXT | -f FILE | --token-ids FILE] [-n N] [-m METHOD [-P K=V,...]] [options]\n"
            "       %s MODEL --ppl TEXTFILE [--context C[,C...]] [--score N] [-m METHOD [-P K=V,...]] [options]\n"
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
            "      --no-reference   skip the full-cache run (no KL or agreement)\n"
            "  -o, --output FILE    the perplexity table (TSV; default stdout)\n\n"
            "Method:\n"
            "  -m, --method NAME    compression method (default full; see --list-methods)\n"
            "  -P, --param K=V[,K=V...]\n"
            "                       method parameters (repeatable)\n"
            "      --window W       observation queries: the last W prefill positions (default 32)\n"
            "      --list-methods   list the methods and their parameters, then exit\n"
            "      --help-method    describe the parameters of --method NAME, then exit\n\n"
            "Speed runs (random weights, never accuracy):\n"
            "      --shape NAME     a model of a published shape with seeded random weights\n"
            "      --tokens N       random prompt of N tokens (default 1K)\n"
            "      --chunk N        prefill chunk in tokens (default 512)\n\n",
            mkv_progname(), mkv_progname(), mkv_progname(), mkv_progname(), DEFAULT_GENERATE, DEFAULT_SCORE);
    mkv_common_usage(fp, MKV_COMMON_THREADS);
    mkv_method_names_usage(fp);
    exit(status);
}

MKV_TOOL_MISUSE(SHORTOPTS)

typedef struct {
    const char *model_path;
    const char *shape;
    const char *tokenizer;
    const mkv_method *method;
    mkv_params params;
    mkv_prompt_opts prompt;
    int64_t generate, tokens;
    const char *ppl, *output, *stats;
    int64_t contexts[MAX_CONTEXTS];
    int n_contexts;
    int64_t score, window, chunk;
    int reference;
    double temperature, top_p;
    uint64_t seed;
    int threads, verbosity;
    int given[OPT_END + 128];
} decode_args;

static int64_t size_or_exit(const char *arg, const char *name, int64_t lo, int64_t hi)
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

static void parse_contexts(decode_args *a, const char *arg)
{
    char *copy = strdup(arg);
    if (!copy) {
        mkv_usage_error("out of memory");
        exit(1);
    }
    a->n_contexts = 0;
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (a->n_contexts == MAX_CONTEXTS) {
            mkv_usage_error("invalid value '%s' for --context: at most %d contexts", arg, MAX_CONTEXTS);
            exit(2);
        }
        a->contexts[a->n_contexts++] = size_or_exit(tok, "context", 1, INT32_MAX);
    }
    free(copy);
    if (a->n_contexts == 0) {
        mkv_usage_error("invalid value '%s' for --context: expected C[,C...]", arg);
        exit(2);
    }
}

/* Options that belong to one mode only. */
static const struct {
    int opt;
    int ppl;   /* 1: --ppl only, 0: generation only */
} MODE_OPTIONS[] = {
    {OPT_CONTEXT, 1}, {OPT_SCORE, 1}, {OPT_NO_REFERENCE, 1}, {'o', 1},
    {'p', 0}, {'n', 0}, {OPT_TOKEN_IDS, 0}, {OPT_CHAT, 0}, {OPT_SYSTEM, 0}, {OPT_SPECIAL, 0},
    {OPT_TEMPERATURE, 0}, {OPT_TOP_P, 0}, {OPT_STATS, 0}, {'f', 0},
};

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
            a->seed = parse_seed(optarg);
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
    if (help_method) {
        mkv_print_method(stdout, mkv_method_or_exit(method_name));
        exit(0);
    }
    a->method = mkv_method_or_exit(method_name);
    mkv_params_init(&a->params, a->method->params);
    for (int i = 0; i < n_param_args; i++)
        mkv_method_params_or_exit(a->method, &a->params, param_args[i]);
    free(param_args);

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
    if (a->shape && a->ppl)
        misuse("--ppl needs a real model, not --shape (random weights measure speed only)");
    if (a->given[OPT_TOKENS] && !a->shape)
        misuse("--tokens is an option of --shape");
    for (size_t i = 0; i < sizeof MODE_OPTIONS / sizeof *MODE_OPTIONS; i++)
        if (a->given[MODE_OPTIONS[i].opt] && MODE_OPTIONS[i].ppl != !!a->ppl) {
            char what[160];
            snprintf(what, sizeof what, "--%s is not an option of %s", option_name(MODE_OPTIONS[i].opt),
                     a->ppl ? "--ppl" : "generation (it needs --ppl)");
            misuse(what);
        }
    mkv_error err;
    if (mkv_prompt_opts_check(&a->prompt, &err))
        misuse(err.msg);
    if (a->stats && a->stats[0] == '-' && a->stats[1] == '\0')
        misuse("--stats - and the generated text both write to standard output");
    if (a->ppl && a->output && mkv_outfile_overwrites(a->output, a->ppl))
        misuse("-o would overwrite the --ppl text");
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
}

/* ---------------------------------------------------------- generation */

#define STATS_HEADER "step\ttokens\tprefix_tokens\ttail_tokens\tbytes_held\tlogical_bytes\tbytes_read\tstep_ms\n"

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
    float *logits = mkv_alloc((size_t)V, sizeof(float), "logits", err);
    if (!logits) {
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
        int tok = mkv_sample(&s, logits, V, err);
        if (tok < 0) {
            rc = err->code;
            break;
        }
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
        if ((rc = mkv_decoder_step(d, tok, logits, err)))
            break;
        double dt = now() - t0;
        steps_seconds += dt;
        done++;
        if (have_stats) {
            mkv_decoder_stats st;
            mkv_decoder_get_stats(d, &st);
            fprintf(mkv_outfile_fp(&stats), "%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRIu64
                    "\t%" PRIu64 "\t%" PRIu64 "\t%.3f\n", i + 1, st.tokens, st.prefix_tokens, st.tail_tokens,
                    st.bytes_held, st.logical_bytes, st.bytes_read, 1e3 * dt);
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
        fprintf(stderr,
                "%s: %s: prompt %zu tokens, %" PRId64 " decode steps, %.2f ms per step; KV %" PRIu64
                " bytes held (dense 16-bit %" PRIu64 ", ratio %.3f); prefill %.2f s, compression %.2f s\n",
                mkv_progname(), a->method->name, p->n, done, done ? 1e3 * steps_seconds / (double)done : 0.0,
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
    mkv_free(logits);
    return rc;
}

/* ---------------------------------------------------------- perplexity */

#define PPL_HEADER                                                                                   \
    "context\tscored\tmethod\tparams\tppl\tppl_full\tppl_increase_pct\tkl\tagreement\tphysical_ratio\t" \
    "bytes_held\tlogical_bytes\tbytes_read_step\tdense_read_step\tprefill_s\tcompress_s\tstep_ms\t"      \
    "step_ms_full\n"

static int perplexity(const decode_args *a, mkv_run_model *rm, mkv_error *err)
{
    const mkv_prompt *p = &rm->prompt;
    int rc;
    for (int i = 0; i < a->n_contexts; i++)
        if ((rc = mkv_ppl_check(p->n, a->contexts[i], a->score, err)))
            return rc;
    mkv_outfile out;
    if ((rc = mkv_outfile_open(&out, a->output ? a->output : "-", a->ppl, 0, err)))
        return rc;
    FILE *fp = mkv_outfile_fp(&out);
    fputs(PPL_HEADER, fp);
    char params[1024];
    mkv_params_format(&a->params, params, sizeof params);
    for (int i = 0; i < a->n_contexts && !rc; i++) {
        mkv_decoder_opts o;
        decoder_opts(a, (int)a->score, &o);
        mkv_ppl_result r;
        if ((rc = mkv_decode_ppl(rm->model, p->tokens, p->n, a->contexts[i], a->score, &o, a->reference, &r, err)))
            break;
        double ppl = exp(r.nll), ppl_full = exp(r.nll_full);
        fprintf(fp, "%" PRId64 "\t%" PRId64 "\t%s\t%s\t%.6f\t%.6f\t%.4f\t%.6g\t%.4f\t%.4f\t%" PRIu64 "\t%" PRIu64
                "\t%.0f\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\n",
                r.context, r.scored, a->method->name, params[0] ? params : "-", ppl, ppl_full,
                100.0 * (ppl / ppl_full - 1.0), r.kl, r.agreement,
                (double)r.prefix_logical_bytes / (double)r.prefix_bytes_held, r.bytes_held, r.logical_bytes,
                r.bytes_read_mean, r.dense_read_mean, r.prefill_seconds, r.compress_seconds, 1e3 * r.step_seconds,
                1e3 * r.step_seconds_full);
        fflush(fp);
        mkv_info("context %" PRId64 ": perplexity %.4f (full %.4f)", r.context, ppl, ppl_full);
    }
    if (rc) {
        mkv_outfile_abort(&out);
        return rc;
    }
    return mkv_outfile_commit(&out, err);
}

int main(int argc, char **argv)
{
    mkv_log_init(argv[0]);
    decode_args a;
    parse_args(argc, argv, &a);
    mkv_error err;
    mkv_error_clear(&err);

    mkv_prompt_opts po = a.prompt;
    int64_t run_tokens = 0, max_context = 0;
    if (a.ppl) {
        mkv_prompt_opts_init(&po);
        po.file = a.ppl;
        for (int i = 0; i < a.n_contexts; i++)
            if (a.contexts[i] > max_context)
                max_context = a.contexts[i];
        run_tokens = max_context + a.score;
    }
    mkv_run_model_opts mo = {.path = a.model_path, .shape = a.shape, .tokenizer = a.tokenizer,
                             .need_tokenizer = !po.token_ids, .vocab = 0, .seed = a.seed,
                             .random_tokens = (size_t)a.tokens, .threads = a.threads,
                             .chunk = a.chunk > 0 ? (int)a.chunk : 512, .generate = a.ppl ? 0 : (int)a.generate,
                             .run_tokens = run_tokens};
    mkv_run_model rm;
    if (mkv_run_model_open(&mo, &po, &rm, &err)) {
        mkv_run_model_free(&rm);
        fail(&err);
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
