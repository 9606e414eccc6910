/* bench_forward: the measurements behind the "CPU forward pass" section of
 * docs/BENCHMARKS.md.  scripts/bench-cpu builds and drives it;
 * every mode prints tab-separated rows with a header line.
 *
 *   bench_forward gemm --mode full --threads 2     # one sgemm per shape, BLAS threads
 *   bench_forward gemm --mode tiled --threads 2    # 64-row tiles over our threads,
 *                                                  # as lib/model/forward.c calls BLAS
 *   bench_forward attn                             # attention_task's GEMM shapes
 *   bench_forward membw --threads 2                # streaming read and copy
 *   bench_forward prefill MODEL --tokens 2048 --chunk 128 --threads 2 --reps 3
 *   bench_forward decode MODEL --tokens 512 --generate 128 --threads 1
 *
 * Rates count 2 flops per multiply-add; "best" is the fastest repetition,
 * "sustained" the total over the whole timed window, so a gap between the
 * two shows interference from other processes.  toks_per_cpu_s divides by
 * the process's CPU time: with one thread, what a core of its own gives.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/blas.h"
#include "model/forward.h"
#include "model/model_load.h"
#include "model/sampler.h"
#include "vocab/tokenizer.h"

/* Output rows of a weight matrix per BLAS call in lib/model/forward.c (TILE_ROWS). */
#define TILE_ROWS 64
/* Query rows per attention task in lib/model/forward.c (ATT_ROWS). */
#define ATT_ROWS 16

static const char *progname = "bench_forward";

typedef struct {
    const char *mode;  /* gemm: full | tiled */
    int threads, chunk, tokens, generate, reps;
    double seconds;
    const char *text;
    const char *logits; /* prefill: none | last | all */
    size_t mib;
} options;

static void usage(FILE *fp, int status)
{
    fprintf(fp,
            "usage: %s gemm [--mode full|tiled] [--threads T] [--seconds S]\n"
            "       %s attn [--seconds S]\n"
            "       %s membw [--threads T] [--mib M] [--seconds S]\n"
            "       %s prefill MODEL [--tokens N] [--chunk C] [--threads T] [--reps R]\n"
            "                  [--logits none|last|all] [--text FILE]\n"
            "       %s decode MODEL [--tokens N] [--generate G] [--chunk C] [--threads T]\n"
            "                  [--reps R] [--text FILE]\n"
            "Prompts are the tokens of FILE (default /usr/share/common-licenses/GPL-3),\n"
            "repeated up to N tokens, after BOS when the model's tokenizer adds one.\n",
            progname, progname, progname, progname, progname);
    exit(status);
}

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", progname);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(1);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static double peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

static double current_rss_mib(void)
{
    long pages = 0, resident = 0;
    FILE *fp = fopen("/proc/self/statm", "r");
    if (fp) {
        if (fscanf(fp, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(fp);
    }
    return (double)resident * 4096.0 / (1024.0 * 1024.0);
}

static float *random_floats(size_t n)
{
    float *p = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
    if (!p)
        die("out of memory for %s", "the operands");
    uint64_t s = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    return p;
}

static void set_blas_threads(int n)
{
#ifdef HAVE_OPENBLAS
    openblas_set_num_threads(n);
#else
    (void)n;
#endif
}

/* ------------------------------------------------------------ timing loop */

typedef void (*rep_fn)(void *ctx);

typedef struct {
    double best, sustained; /* seconds per repetition */
    int reps;
} rep_timing;

/* One untimed warm-up, then repetitions until `seconds` have passed (at
 * least 3). */
static rep_timing time_reps(rep_fn fn, void *ctx, double seconds)
{
    fn(ctx);
    rep_timing t = {1e30, 0.0, 0};
    double start = now(), last = start;
    while (t.reps < 3 || last - start < seconds) {
        fn(ctx);
        double end = now();
        if (end - last < t.best)
            t.best = end - last;
        last = end;
        t.reps++;
    }
    t.sustained = (last - start) / t.reps;
    return t;
}

/* ------------------------------------------------------------ gemm */

/* y[rows x out] = x[rows x in] . W^T with W [out x in]: lib/model/forward.c's
 * projection layout. */
typedef struct {
    const char *name;
    int in, out;
} weight_shape;

/* SmolLM2-135M: dim 576, hidden 1536, 9 query heads and 3 KV heads of 64. */
static const weight_shape smollm2_shapes[] = {
    {"qkv", 576, 576 + 2 * 192}, /* one job of three matmuls in the forward */
    {"wo", 576, 576},
    {"w1+w3", 576, 2 * 1536},
    {"w2", 1536, 576},
    {"classifier", 576, 49152},
};

typedef struct {
    int rows, in, out;
    const float *x, *w;
    float *y;
    /* tiled mode: our threads take TILE_ROWS-row tiles of W */
    int threads, tiles;
    atomic_int next;
    pthread_barrier_t start, done;
    int stop;
} gemm_ctx;

static void gemm_rows(const gemm_ctx *g, int r0, int nr)
{
    const float *w = g->w + (size_t)r0 * (size_t)g->in;
    if (g->rows == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, nr, g->in, 1.0f, w, g->in, g->x, 1, 0.0f, g->y + r0, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->rows, nr, g->in, 1.0f, g->x, g->in,
                    w, g->in, 0.0f, g->y + r0, g->out);
}

static void gemm_full(void *ctx)
{
    gemm_ctx *g = ctx;
    gemm_rows(g, 0, g->out);
}

static void tiled_pass(gemm_ctx *g)
{
    for (int t; (t = atomic_fetch_add(&g->next, 1)) < g->tiles;) {
        int r0 = t * TILE_ROWS;
        gemm_rows(g, r0, g->out - r0 < TILE_ROWS ? g->out - r0 : TILE_ROWS);
    }
}

static void gemm_tiled(void *ctx)
{
    gemm_ctx *g = ctx;
    atomic_store(&g->next, 0);
    if (g->threads > 1)
        pthread_barrier_wait(&g->start);
    tiled_pass(g);
    if (g->threads > 1)
        pthread_barrier_wait(&g->done);
}

static void *tiled_worker(void *arg)
{
    gemm_ctx *g = arg;
    for (;;) {
        pthread_barrier_wait(&g->start);
        if (g->stop)
            return NULL;
        tiled_pass(g);
        pthread_barrier_wait(&g->done);
    }
}

static void print_rate(const char *kind, const char *name, int rows, int in, int out, int threads,
                       const char *mode, double flops, rep_timing t)
{
    printf("%s\t%s\t%d\t%d\t%d\t%d\t%s\t%.2f\t%.2f\t%.4f\n", kind, name, rows, in, out, threads, mode,
           flops / t.sustained * 1e-9, flops / t.best * 1e-9, t.best * 1e3);
    fflush(stdout);
}

static void run_gemm(const weight_shape *s, int rows, const options *o)
{
    int tiled = strcmp(o->mode, "tiled") == 0;
    gemm_ctx g = {.rows = rows, .in = s->in, .out = s->out, .threads = o->threads};
    g.x = random_floats((size_t)rows * s->in);
    g.w = random_floats((size_t)s->out * s->in);
    g.y = random_floats((size_t)rows * s->out);
    g.tiles = (s->out + TILE_ROWS - 1) / TILE_ROWS;
    pthread_t *tids = NULL;
    if (tiled && o->threads > 1) {
        pthread_barrier_init(&g.start, NULL, (unsigned)o->threads);
        pthread_barrier_init(&g.done, NULL, (unsigned)o->threads);
        tids = calloc((size_t)o->threads, sizeof *tids);
        if (!tids)
            die("out of memory for %s", "threads");
        for (int i = 1; i < o->threads; i++)
            if (pthread_create(&tids[i], NULL, tiled_worker, &g) != 0)
                die("cannot start %s", "a thread");
    }
    rep_timing t = time_reps(tiled ? gemm_tiled : gemm_full, &g, o->seconds);
    if (tids) {
        g.stop = 1;
        pthread_barrier_wait(&g.start);
        for (int i = 1; i < o->threads; i++)
            pthread_join(tids[i], NULL);
        pthread_barrier_destroy(&g.start);
        pthread_barrier_destroy(&g.done);
        free(tids);
    }
    print_rate("gemm", s->name, rows, s->in, s->out, o->threads, o->mode,
               2.0 * rows * (double)s->in * s->out, t);
    free((void *)g.x);
    free((void *)g.w);
    free(g.y);
}

static int mode_gemm(const options *o)
{
    if (strcmp(o->mode, "full") && strcmp(o->mode, "tiled"))
        die("unknown --mode '%s' (full or tiled)", o->mode);
    /* tiled: BLAS single-threaded, our threads split the tiles (as the
     * forward pass does); full: BLAS threads split one call. */
    set_blas_threads(strcmp(o->mode, "tiled") == 0 ? 1 : o->threads);
    static const int rows[] = {128, 512, 1};
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
        for (size_t i = 0; i < sizeof smollm2_shapes / sizeof *smollm2_shapes; i++)
            run_gemm(&smollm2_shapes[i], rows[r], o);
    return 0;
}

/* ------------------------------------------------------------ attention GEMMs */

/* The two products of one attention_task in lib/model/forward.c, one thread:
 * scores[rows x keys] = q[rows x 64] . K^T, out[rows x 64] = P[rows x keys] . V. */
typedef struct {
    int rows, keys, hd;
    const float *q, *k, *v;
    float *s, *out;
    int which; /* 0: q.K^T, 1: P.V */
} attn_ctx;

static void attn_rep(void *ctx)
{
    attn_ctx *a = ctx;
    if (a->which == 0) {
        if (a->rows == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, a->keys, a->hd, 1.0f, a->k, a->hd, a->q, 1, 0.0f,
                        a->s, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a->rows, a->keys, a->hd, 1.0f, a->q,
                        a->hd, a->k, a->hd, 0.0f, a->s, a->keys);
    } else {
        if (a->rows == 1)
            cblas_sgemv(CblasRowMajor, CblasTrans, a->keys, a->hd, 1.0f, a->v, a->hd, a->s, 1, 0.0f,
                        a->out, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, a->rows, a->hd, a->keys, 1.0f, a->s,
                        a->keys, a->v, a->hd, 0.0f, a->out, a->hd);
    }
}

/* expf over a row of scores as attention_task's softmax does it. */
static void softmax_rep(void *ctx)
{
    attn_ctx *a = ctx;
    for (int r = 0; r < a->rows; r++) {
        float *row = a->s + (size_t)r * a->keys;
        float max = row[0];
        for (int t = 1; t < a->keys; t++)
            if (row[t] > max)
                max = row[t];
        double sum = 0.0;
        for (int t = 0; t < a->keys; t++) {
            row[t] = expf(row[t] - max);
            sum += row[t];
        }
        float inv = (float)(1.0 / sum);
        for (int t = 0; t < a->keys; t++)
            row[t] *= inv;
    }
}

static int mode_attn(const options *o)
{
    set_blas_threads(1);
    static const int keys[] = {256, 1024, 4096, 8192};
    static const int rows[] = {ATT_ROWS, 1};
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            attn_ctx a = {rows[r], keys[i], 64, NULL, NULL, NULL, NULL, NULL, 0};
            a.q = random_floats((size_t)a.rows * a.hd);
            a.k = random_floats((size_t)a.keys * a.hd);
            a.v = random_floats((size_t)a.keys * a.hd);
            a.s = random_floats((size_t)a.rows * a.keys);
            a.out = random_floats((size_t)a.rows * a.hd);
            double flops = 2.0 * a.rows * a.keys * a.hd;
            a.which = 0;
            print_rate("attn", "q.K^T", a.rows, a.hd, a.keys, 1, "task", flops, time_reps(attn_rep, &a, o->seconds));
            a.which = 1;
            print_rate("attn", "P.V", a.rows, a.keys, a.hd, 1, "task", flops, time_reps(attn_rep, &a, o->seconds));
            /* softmax: the rate columns are 1e9 scores per second */
            print_rate("attn", "softmax", a.rows, a.keys, 1, 1, "task", (double)a.rows * a.keys,
                       time_reps(softmax_rep, &a, o->seconds));
            free((void *)a.q);
            free((void *)a.k);
            free((void *)a.v);
            free(a.s);
            free(a.out);
        }
    return 0;
}

/* ------------------------------------------------------------ memory bandwidth */

typedef struct {
    uint64_t *src, *dst;
    size_t words; /* per thread */
    int threads, op; /* op 0: read, 1: copy */
    pthread_barrier_t start, done;
    int stop;
    uint64_t sink[64];
} bw_ctx;

/* XOR-reduce: an integer reduction the compiler may vectorize, so one core
 * can issue loads as fast as the memory delivers them. */
static void bw_part(bw_ctx *b, int part)
{
    uint64_t *s = b->src + (size_t)part * b->words;
    if (b->op == 0) {
        uint64_t acc = 0;
        for (size_t i = 0; i < b->words; i++)
            acc ^= s[i];
        b->sink[part] ^= acc;
    } else {
        memcpy(b->dst + (size_t)part * b->words, s, b->words * sizeof *s);
    }
}

static void *bw_worker(void *arg)
{
    bw_ctx *b = ((bw_ctx **)arg)[0];
    int part = (int)(intptr_t)((void **)arg)[1];
    for (;;) {
        pthread_barrier_wait(&b->start);
        if (b->stop)
            return NULL;
        bw_part(b, part);
        pthread_barrier_wait(&b->done);
    }
}

static void bw_rep(void *ctx)
{
    bw_ctx *b = ctx;
    if (b->threads > 1)
        pthread_barrier_wait(&b->start);
    bw_part(b, 0);
    if (b->threads > 1)
        pthread_barrier_wait(&b->done);
}

static int mode_membw(const options *o)
{
    bw_ctx b = {0};
    b.threads = o->threads;
    size_t bytes = o->mib << 20;
    b.words = bytes / sizeof(uint64_t) / (size_t)b.threads;
    b.src = aligned_alloc(64, bytes);
    b.dst = aligned_alloc(64, bytes);
    if (!b.src || !b.dst)
        die("out of memory for %s", "the buffers");
    for (size_t i = 0; i < bytes / sizeof(uint64_t); i++)
        b.src[i] = i * 0x9e3779b97f4a7c15u, b.dst[i] = 0;
    pthread_t tids[64];
    void *args[64][2];
    if (b.threads > 64)
        die("at most 64 threads, not %s", "more");
    pthread_barrier_init(&b.start, NULL, (unsigned)b.threads);
    pthread_barrier_init(&b.done, NULL, (unsigned)b.threads);
    for (int i = 1; i < b.threads; i++) {
        args[i][0] = &b;
        args[i][1] = (void *)(intptr_t)i;
        if (pthread_create(&tids[i], NULL, bw_worker, args[i]) != 0)
            die("cannot start %s", "a thread");
    }
    static const char *names[] = {"read", "copy"};
    for (b.op = 0; b.op < 2; b.op++) {
        rep_timing t = time_reps(bw_rep, &b, o->seconds);
        /* copy counts read + write bytes (STREAM's convention) */
        double moved = (double)bytes * (b.op == 1 ? 2.0 : 1.0);
        printf("membw\t%s\t%zu\t%d\t%.1f\t%.1f\n", names[b.op], o->mib, b.threads,
               moved / t.sustained * 1e-9, moved / t.best * 1e-9);
        fflush(stdout);
    }
    b.stop = 1;
    pthread_barrier_wait(&b.start);
    for (int i = 1; i < b.threads; i++)
        pthread_join(tids[i], NULL);
    uint64_t x = 0;
    for (int i = 0; i < 64; i++)
        x ^= b.sink[i];
    fprintf(stderr, "%s: (checksum %llx)\n", progname, (unsigned long long)x);
    free(b.src);
    free(b.dst);
    return 0;
}

/* ------------------------------------------------------------ model runs */

typedef struct {
    mkv_loaded_model lm;
    int32_t *prompt;
    double load_s, rss_model_mib;
} model_setup;

static void load_model(const char *path, const options *o, size_t n_tokens, model_setup *ms)
{
    mkv_error err = {0};
    double t0 = now();
    if (mkv_model_load(path, NULL, &ms->lm, &err))
        die("%s", err.msg);
    ms->load_s = now() - t0;
    ms->rss_model_mib = current_rss_mib();
    const mkv_model_config *c = &ms->lm.model->cfg;
    /* weights the GEMMs read per token: every projection, plus the classifier */
    double layer = (double)c->dim * (2.0 * c->n_heads * c->head_dim + 2.0 * c->n_kv_heads * c->head_dim) +
                   3.0 * c->dim * c->hidden_dim;
    fprintf(stderr,
            "%s: %s: dim %d hidden %d layers %d heads %d/%d head_dim %d vocab %d %s; "
            "%.0f projection + %.0f classifier weights; loaded in %.2f s\n",
            progname, c->name, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
            c->vocab_size, c->tied_classifier ? "tied" : "untied", layer * c->n_layers,
            (double)c->vocab_size * c->dim, ms->load_s);

    FILE *fp = fopen(o->text, "rb");
    if (!fp)
        die("cannot open '%s'", o->text);
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap && !(text = realloc(text, cap = cap ? 2 * cap : 65536)))
            die("out of memory for %s", "the text");
        size_t got = fread(text + len, 1, cap - len, fp);
        len += got;
        if (got == 0)
            break;
    }
    fclose(fp);
    int32_t *ids;
    size_t n_ids;
    if (mkv_tokenizer_encode(ms->lm.tok, text, len, 0, &ids, &n_ids, &err))
        die("%s", err.msg);
    free(text);
    if (n_ids == 0)
        die("'%s' has no tokens", o->text);
    if (!(ms->prompt = malloc(n_tokens * sizeof *ms->prompt)))
        die("out of memory for %s", "the prompt");
    size_t i = 0;
    int bos = ms->lm.model->cfg.bos_id;
    if (ms->lm.add_bos && bos >= 0 && n_tokens > 0)
        ms->prompt[i++] = bos;
    for (size_t j = 0; i < n_tokens; i++, j = (j + 1) % n_ids)
        ms->prompt[i] = ids[j];
    free(ids);
}

static mkv_forward *make_forward(const model_setup *ms, const options *o, int max_seq)
{
    mkv_forward_opts fo = {o->threads, o->chunk, max_seq};
    mkv_forward *f;
    mkv_error err = {0};
    if (mkv_forward_create(ms->lm.model, &fo, &f, &err))
        die("%s", err.msg);
    return f;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int mode_prefill(const char *path, const options *o)
{
    model_setup ms = {0};
    load_model(path, o, (size_t)o->tokens, &ms);
    const mkv_model_config *c = &ms.lm.model->cfg;
    mkv_forward *f = make_forward(&ms, o, o->tokens);
    mkv_logits_mode lmode = !strcmp(o->logits, "none") ? MKV_LOGITS_NONE
                          : !strcmp(o->logits, "all") ? MKV_LOGITS_ALL : MKV_LOGITS_LAST;
    if (lmode == MKV_LOGITS_LAST && strcmp(o->logits, "last"))
        die("unknown --logits '%s' (none, last or all)", o->logits);
    size_t n_logits = lmode == MKV_LOGITS_ALL ? (size_t)o->tokens * c->vocab_size : (size_t)c->vocab_size;
    float *logits = malloc(n_logits * sizeof *logits);
    double *wall = calloc((size_t)o->reps, sizeof *wall);
    if (!logits || !wall)
        die("out of memory for %s", "the logits");
    double cpu = 0.0;
    mkv_error err = {0};
    for (int r = 0; r < o->reps; r++) {
        mkv_forward_reset(f);
        double c0 = cpu_seconds(), t0 = now();
        if (mkv_forward_run(f, ms.prompt, (size_t)o->tokens, logits, lmode, &err))
            die("%s", err.msg);
        wall[r] = now() - t0;
        cpu += cpu_seconds() - c0;
    }
    double first = wall[0];
    qsort(wall, (size_t)o->reps, sizeof *wall, cmp_double);
    printf("prefill\t%d\t%d\t%d\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\t%.2f\t%.0f\t%.0f\n",
           o->tokens, o->chunk, o->threads, o->logits, o->reps, wall[0], wall[o->reps / 2], first,
           o->tokens / wall[0], o->tokens / wall[o->reps / 2], (double)o->tokens * o->reps / cpu,
           cpu / o->reps / wall[o->reps / 2], ms.rss_model_mib, peak_rss_mib());
    free(wall);
    free(logits);
    mkv_forward_free(f);
    free(ms.prompt);
    mkv_loaded_model_free(&ms.lm);
    return 0;
}

static int mode_decode(const char *path, const options *o)
{
    model_setup ms = {0};
    load_model(path, o, (size_t)o->tokens, &ms);
    const mkv_model_config *c = &ms.lm.model->cfg;
    mkv_forward *f = make_forward(&ms, o, o->tokens + o->generate);
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    double *wall = calloc((size_t)o->reps, sizeof *wall);
    if (!logits || !wall)
        die("out of memory for %s", "the logits");
    mkv_error err = {0};
    double t0 = now();
    if (mkv_forward_run(f, ms.prompt, (size_t)o->tokens, logits, MKV_LOGITS_LAST, &err))
        die("%s", err.msg);
    double prefill_s = now() - t0, cpu = 0.0;
    int first = mkv_argmax(logits, c->vocab_size);
    /* Each repetition rewinds to the end of the prompt and regenerates the
     * same greedy continuation, every step computing all the logits. */
    for (int r = 0; r < o->reps; r++) {
        if (mkv_forward_rewind(f, o->tokens, &err))
            die("%s", err.msg);
        int32_t next = first;
        double c0 = cpu_seconds(), t1 = now();
        for (int i = 0; i < o->generate; i++) {
            if (mkv_forward_run(f, &next, 1, logits, MKV_LOGITS_LAST, &err))
                die("%s", err.msg);
            next = mkv_argmax(logits, c->vocab_size);
        }
        wall[r] = now() - t1;
        cpu += cpu_seconds() - c0;
    }
    qsort(wall, (size_t)o->reps, sizeof *wall, cmp_double);
    printf("decode\t%d\t%d\t%d\t%d\t%.3f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.0f\t%.0f\n", o->tokens,
           o->generate, o->threads, o->reps, prefill_s, o->generate / wall[0], o->generate / wall[o->reps / 2],
           (double)o->generate * o->reps / cpu, 1e3 * wall[0] / o->generate, cpu / o->reps / wall[o->reps / 2],
           ms.rss_model_mib, peak_rss_mib());
    free(wall);
    free(logits);
    mkv_forward_free(f);
    free(ms.prompt);
    mkv_loaded_model_free(&ms.lm);
    return 0;
}

/* ------------------------------------------------------------ main */

static int positive(const char *s, const char *what)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v <= 0 || v > 1 << 24) {
        fprintf(stderr, "%s: %s must be a positive integer, not '%s'\n", progname, what, s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    options o = {"full", 1, 128, 2048, 128, 3, 1.0, "/usr/share/common-licenses/GPL-3", "last", 1024};
    static const struct option longopts[] = {
        {"mode", required_argument, NULL, 'm'},  {"threads", required_argument, NULL, 't'},
        {"chunk", required_argument, NULL, 'c'}, {"tokens", required_argument, NULL, 'n'},
        {"generate", required_argument, NULL, 'g'}, {"reps", required_argument, NULL, 'r'},
        {"seconds", required_argument, NULL, 's'}, {"text", required_argument, NULL, 'f'},
        {"logits", required_argument, NULL, 'l'}, {"mib", required_argument, NULL, 'M'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "m:t:c:n:g:r:s:f:l:M:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm': o.mode = optarg; break;
        case 't': o.threads = positive(optarg, "--threads"); break;
        case 'c': o.chunk = positive(optarg, "--chunk"); break;
        case 'n': o.tokens = positive(optarg, "--tokens"); break;
        case 'g': o.generate = positive(optarg, "--generate"); break;
        case 'r': o.reps = positive(optarg, "--reps"); break;
        case 's': o.seconds = positive(optarg, "--seconds"); break;
        case 'f': o.text = optarg; break;
        case 'l': o.logits = optarg; break;
        case 'M': o.mib = (size_t)positive(optarg, "--mib"); break;
        case 'h': usage(stdout, 0); break;
        default:
            fprintf(stderr, "%s: try --help\n", progname);
            exit(2);
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "%s: missing mode (gemm, attn, membw, prefill, decode); try --help\n", progname);
        exit(2);
    }
    const char *mode = argv[optind++];
    const char *model = optind < argc ? argv[optind++] : NULL;
    int needs_model = !strcmp(mode, "prefill") || !strcmp(mode, "decode");
    if ((needs_model && !model) || (!needs_model && model) || optind < argc) {
        fprintf(stderr, "%s: wrong arguments for '%s'; try --help\n", progname, mode);
        exit(2);
    }
    if (!strcmp(mode, "gemm")) {
        printf("kind\tshape\trows\tin\tout\tthreads\tmode\tgflops_sustained\tgflops_best\tms_best\n");
        return mode_gemm(&o);
    }
    if (!strcmp(mode, "attn")) {
        printf("kind\tshape\trows\tin\tout\tthreads\tmode\tgflops_sustained\tgflops_best\tms_best\n");
        return mode_attn(&o);
    }
    if (!strcmp(mode, "membw")) {
        printf("kind\top\tmib\tthreads\tgbs_sustained\tgbs_best\n");
        return mode_membw(&o);
    }
    if (!strcmp(mode, "prefill")) {
        printf("kind\ttokens\tchunk\tthreads\tlogits\treps\tbest_s\tmedian_s\tfirst_s\ttoks_best\t"
               "toks_median\ttoks_per_cpu_s\tcpu_per_wall\trss_model_mib\tpeak_rss_mib\n");
        return mode_prefill(model, &o);
    }
    if (!strcmp(mode, "decode")) {
        printf("kind\tprompt\tgenerate\tthreads\treps\tprefill_s\ttoks_best\ttoks_median\ttoks_per_cpu_s\tms_per_token_best\t"
               "cpu_per_wall\trss_model_mib\tpeak_rss_mib\n");
        return mode_decode(model, &o);
    }
    fprintf(stderr, "%s: unknown mode '%s'; try --help\n", progname, mode);
    return 2;
}
