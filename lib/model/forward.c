/* fp32 CPU forward pass: RMSNorm, RoPE, grouped-query attention with a KV
 * cache, SwiGLU, over CBLAS, with a small pool of threads. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/blas.h"
#include "core/half.h"
#include "core/kvfill.h"
#include "model/forward.h"
#include "model/ggml_quant.h"
#include "core/tensor.h"

#define DEFAULT_CHUNK 128
/* Output rows of a weight matrix per task.  Fixed, so that every output
 * element is computed by the same BLAS call whatever the thread count. */
#define TILE_ROWS 64
/* Query rows per attention task; bounds the score scratch per thread. */
#define ATT_ROWS 16
/* Jobs smaller than this many multiply-adds run on the calling thread:
 * waking workers costs more than the work. */
#define PARALLEL_MIN_WORK 262144

/* ------------------------------------------------------------ thread pool */

typedef void (*task_fn)(void *ctx, int task, int worker);

typedef struct {
    int n_workers;           /* threads besides the caller */
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    atomic_ulong generation;
    atomic_int stop;
    atomic_int running;      /* workers still in the current job */
    task_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next;
} pool;

typedef struct {
    pool *p;
    int index;               /* 1..n_workers; the caller is 0 */
} worker_arg;

static void run_tasks(pool *p, task_fn fn, void *ctx, int n_tasks, int worker)
{
    for (int t; (t = atomic_fetch_add(&p->next, 1)) < n_tasks;)
        fn(ctx, t, worker);
}

/* A decode step hands its workers a job every few tens of microseconds
 * (each layer's products, then its attention); a worker that slept on the
 * condition variable between them took a wake-up through the kernel each
 * time.  Workers and the caller first watch the shared counter for this
 * long, then sleep. */
#define SPIN_NS 50000

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spin until *word != value or stop is set, or the time is up. */
static void spin_while_equal_ul(atomic_ulong *word, unsigned long value, atomic_int *stop)
{
    double end = now_ns() + SPIN_NS;
    for (int i = 1; atomic_load_explicit(word, memory_order_acquire) == value &&
                    !atomic_load_explicit(stop, memory_order_relaxed);
         i++) {
        cpu_relax();
        if (i % 64 == 0 && now_ns() > end)
            return;
    }
}

static void spin_until_zero(atomic_int *word)
{
    double end = now_ns() + SPIN_NS;
    for (int i = 1; atomic_load_explicit(word, memory_order_acquire) != 0; i++) {
        cpu_relax();
        if (i % 64 == 0 && now_ns() > end)
            return;
    }
}

static void *worker_main(void *arg)
{
    worker_arg *w = arg;
    pool *p = w->p;
    unsigned long seen = 0;
    for (;;) {
        spin_while_equal_ul(&p->generation, seen, &p->stop);
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
            pthread_cond_wait(&p->start, &p->mu);
        if (atomic_load(&p->stop)) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        seen = atomic_load(&p->generation);
        task_fn fn = p->fn;
        void *ctx = p->ctx;
        int n = p->n_tasks;
        pthread_mutex_unlock(&p->mu);
        run_tasks(p, fn, ctx, n, w->index);
        pthread_mutex_lock(&p->mu);
        if (atomic_fetch_sub(&p->running, 1) == 1)
            pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

/* Every task of a job on the workers and the caller; a job below
 * PARALLEL_MIN_WORK (or of one task) on the caller alone. */
static void pool_run(pool *p, task_fn fn, void *ctx, int n_tasks, double work)
{
    if (p->n_workers == 0 || n_tasks <= 1 || work < PARALLEL_MIN_WORK) {
        for (int t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->running, p->n_workers);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, fn, ctx, n_tasks, 0);
    spin_until_zero(&p->running);
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->running) > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* mkv_task_threads over the pool: body once per thread. */
typedef struct {
    void (*body)(void *arg);
    void *arg;
} body_job;

static void body_task(void *ctx, int task, int worker)
{
    (void)task;
    (void)worker;
    body_job *b = ctx;
    b->body(b->arg);
}

static void pool_run_body(void *user, void (*body)(void *arg), void *arg)
{
    pool *p = user;
    body_job b = {body, arg};
    pool_run(p, body_task, &b, p->n_workers + 1, INFINITY);
}

static void pool_stop(pool *p, worker_arg *args, int started)
{
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++)
        pthread_join(p->tids[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->tids);
    free(args);
}

/* ------------------------------------------------------------ state */

struct mkv_forward {
    const mkv_model *m;
    mkv_model_config c;
    int q_dim, kv_dim, group;
    int threads, chunk, max_seq, pos;
    int cache_layers;             /* layers the cache holds: n_layers, or 1 (one_layer_cache) */
    int held_layer;               /* with one layer: the layer whose rows it holds, -1 none */
    float *k_cache, *v_cache;     /* [cache_layers][kv_head][max_seq][head_dim] */
    /* per-chunk activations, rows = tokens */
    float *x;                     /* [chunk][dim] residual stream */
    float *xb;                    /* [chunk][dim] normalized */
    float *q;                     /* [chunk][q_dim] */
    float *k, *v, *k_pre;         /* [chunk][kv_dim] */
    float *att;                   /* [chunk][q_dim] attention output */
    float *h1, *h3;               /* [chunk][hidden_dim] */
    float *rope_cos, *rope_sin;   /* [chunk][rope_dim/2] */
    float *scores;                /* [threads][ATT_ROWS][max_seq] */
    float *weight_tiles;          /* [threads][TILE_ROWS][widest input]: matrices kept in
                                     blocks, dequantized a tile at a time (a single token's
                                     products: x's block sums and the dots); NULL when none are */
    size_t tile_floats;
    mkv_task_threads task_threads; /* the pool, for the hooks */
    mkv_capture_fn capture;
    void *capture_user;
    mkv_attention_fn attention;
    void *attention_user;
    pool pool;
    worker_arg *worker_args;
};

static float *cache_row(const mkv_forward *f, float *cache, int layer, int kv_head, int pos)
{
    size_t slot = f->cache_layers == 1 ? 0 : (size_t)layer;
    size_t head = slot * (size_t)f->c.n_kv_heads + (size_t)kv_head;
    return cache + (head * (size_t)f->max_seq + (size_t)pos) * (size_t)f->c.head_dim;
}

/* Whether the cache holds the rows of layer. */
static int holds_layer(const mkv_forward *f, int layer)
{
    if (!f->k_cache || layer < 0 || layer >= f->c.n_layers)
        return 0;
    return f->cache_layers == f->c.n_layers || layer == f->held_layer;
}

const float *mkv_forward_k(const mkv_forward *f, int layer, int kv_head)
{
    return holds_layer(f, layer) ? cache_row(f, f->k_cache, layer, kv_head, 0) : NULL;
}

const float *mkv_forward_v(const mkv_forward *f, int layer, int kv_head)
{
    return holds_layer(f, layer) ? cache_row(f, f->v_cache, layer, kv_head, 0) : NULL;
}

int mkv_forward_pos(const mkv_forward *f) { return f->pos; }
int mkv_forward_max_seq_len(const mkv_forward *f) { return f->max_seq; }
void mkv_forward_reset(mkv_forward *f) { f->pos = 0; }

int mkv_forward_seek(mkv_forward *f, int pos, mkv_error *err)
{
    if (f->k_cache)
        return mkv_fail(err, MKV_EUSAGE, "a forward pass with its own cache cannot skip positions");
    if (pos < 0 || pos > f->max_seq)
        return mkv_fail(err, MKV_EUSAGE, "position %d is outside the context of %d tokens", pos, f->max_seq);
    f->pos = pos;
    return MKV_OK;
}

int mkv_forward_fill(mkv_forward *f, int n, uint64_t seed, mkv_error *err)
{
    if (!f->k_cache || f->cache_layers != f->c.n_layers)
        return mkv_fail(err, MKV_EUSAGE, "only a forward pass with its own cache of every layer is filled");
    if (f->pos != 0)
        return mkv_fail(err, MKV_EUSAGE, "a cache is filled before its first token, not at position %d", f->pos);
    if (n < 0 || n > f->max_seq)
        return mkv_fail(err, MKV_EUSAGE, "%d positions to fill exceed the context of %d tokens", n, f->max_seq);
    const mkv_model_config *c = &f->c;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++)
            for (int t = 0; t < n; t++) {
                float *k = cache_row(f, f->k_cache, l, h, t), *v = cache_row(f, f->v_cache, l, h, t);
                for (int j = 0; j < c->head_dim; j++) {
                    k[j] = mkv_f16_to_f32(mkv_f32_to_f16(mkv_kvfill_value(seed, l, c->n_kv_heads, h, t, c->head_dim, j, 0)));
                    v[j] = mkv_f16_to_f32(mkv_f32_to_f16(mkv_kvfill_value(seed, l, c->n_kv_heads, h, t, c->head_dim, j, 1)));
                }
            }
    f->pos = n;
    return MKV_OK;
}

int mkv_forward_rewind(mkv_forward *f, int pos, mkv_error *err)
{
    if (pos < 0 || pos > f->pos)
        return mkv_fail(err, MKV_EUSAGE, "cannot rewind to position %d (at %d)", pos, f->pos);
    f->pos = pos;
    return MKV_OK;
}

void mkv_forward_set_capture(mkv_forward *f, mkv_capture_fn fn, void *user)
{
    f->capture = fn;
    f->capture_user = user;
}

void mkv_forward_set_attention(mkv_forward *f, mkv_attention_fn fn, void *user)
{
    f->attention = fn;
    f->attention_user = user;
}

void mkv_forward_drop_cache(mkv_forward *f)
{
    mkv_free(f->k_cache);
    mkv_free(f->v_cache);
    mkv_free(f->scores);
    f->k_cache = f->v_cache = f->scores = NULL;
}

/* The buffers of one chunk's activations (and the weight tiles of a model
 * in blocks): needed while a layer runs, not between layers. */
static void free_activations(mkv_forward *f)
{
    float **bufs[] = {&f->x, &f->xb, &f->q, &f->k, &f->v, &f->k_pre, &f->att,
                      &f->h1, &f->h3, &f->rope_cos, &f->rope_sin, &f->weight_tiles};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        mkv_free(*bufs[i]);
        *bufs[i] = NULL;
    }
}

static float *alloc_floats(size_t a, size_t b, const char *what, mkv_error *err)
{
    size_t n;
    if (mkv_mul_size(a, b, &n) != 0) {
        mkv_fail(err, MKV_ENOMEM, "size of the %s overflows", what);
        return NULL;
    }
    return mkv_calloc(n, sizeof(float), what, err);
}

static int alloc_activations(mkv_forward *f, mkv_error *err)
{
    const mkv_model_config *c = &f->c;
    size_t ch = (size_t)f->chunk;
    if (!(f->x = alloc_floats(ch, (size_t)c->dim, "activations", err)) ||
        !(f->xb = alloc_floats(ch, (size_t)c->dim, "activations", err)) ||
        !(f->q = alloc_floats(ch, (size_t)f->q_dim, "activations", err)) ||
        !(f->k = alloc_floats(ch, (size_t)f->kv_dim, "activations", err)) ||
        !(f->v = alloc_floats(ch, (size_t)f->kv_dim, "activations", err)) ||
        !(f->k_pre = alloc_floats(ch, (size_t)f->kv_dim, "activations", err)) ||
        !(f->att = alloc_floats(ch, (size_t)f->q_dim, "activations", err)) ||
        !(f->h1 = alloc_floats(ch, (size_t)c->hidden_dim, "activations", err)) ||
        !(f->h3 = alloc_floats(ch, (size_t)c->hidden_dim, "activations", err)) ||
        !(f->rope_cos = alloc_floats(ch, (size_t)c->rope_dim / 2, "RoPE table", err)) ||
        !(f->rope_sin = alloc_floats(ch, (size_t)c->rope_dim / 2, "RoPE table", err)) ||
        (f->tile_floats && !(f->weight_tiles = alloc_floats((size_t)f->threads, f->tile_floats, "weight tiles", err)))) {
        free_activations(f);
        return err ? err->code : MKV_ENOMEM;
    }
    return MKV_OK;
}

void mkv_forward_free(mkv_forward *f)
{
    if (!f)
        return;
    if (f->pool.tids)
        pool_stop(&f->pool, f->worker_args, f->pool.n_workers);
    mkv_free(f->k_cache);
    mkv_free(f->v_cache);
    mkv_free(f->scores);
    free_activations(f);
    free(f);
}

/* The caches are not zeroed: attention reads only rows already written, and
 * untouched pages of a long context cost no memory. */
static float *alloc_cache(size_t rows, size_t head_dim, const char *what, mkv_error *err)
{
    size_t n;
    if (mkv_mul_size(rows, head_dim, &n) != 0) {
        mkv_fail(err, MKV_ENOMEM, "size of the %s overflows", what);
        return NULL;
    }
    return mkv_alloc(n, sizeof(float), what, err);
}

static int start_pool(mkv_forward *f, mkv_error *err)
{
    pool *p = &f->pool;
    p->n_workers = f->threads - 1;
    f->task_threads = (mkv_task_threads){pool_run_body, p};
    if (p->n_workers == 0)
        return MKV_OK;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->generation, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->running, 0);
    p->tids = calloc((size_t)p->n_workers, sizeof *p->tids);
    f->worker_args = calloc((size_t)p->n_workers, sizeof *f->worker_args);
    if (!p->tids || !f->worker_args) {
        free(f->worker_args);
        free(p->tids);
        p->tids = NULL;
        f->worker_args = NULL;
        return mkv_fail(err, MKV_ENOMEM, "out of memory for %d threads", f->threads);
    }
    for (int i = 0; i < p->n_workers; i++) {
        f->worker_args[i] = (worker_arg){p, i + 1};
        if (pthread_create(&p->tids[i], NULL, worker_main, &f->worker_args[i]) != 0) {
            pool_stop(p, f->worker_args, i);
            p->tids = NULL;
            f->worker_args = NULL;
            return mkv_fail(err, MKV_ENOMEM, "cannot start worker thread %d of %d", i + 1, f->threads);
        }
    }
    return MKV_OK;
}

int mkv_forward_create(const mkv_model *model, const mkv_forward_opts *opts, mkv_forward **out,
                       mkv_error *err)
{
    *out = NULL;
    const mkv_model_config *c = &model->cfg;
    int rc = mkv_model_config_check(c, c->name, err);
    if (rc)
        return rc;
    mkv_forward *f = calloc(1, sizeof *f);
    if (!f)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the forward pass");
    f->m = model;
    f->c = *c;
    f->q_dim = c->n_heads * c->head_dim;
    f->kv_dim = c->n_kv_heads * c->head_dim;
    f->group = c->n_heads / c->n_kv_heads;
    f->threads = opts && opts->threads > 0 ? opts->threads : 1;
    f->chunk = opts && opts->chunk > 0 ? opts->chunk : DEFAULT_CHUNK;
    f->max_seq = opts && opts->max_seq_len > 0 ? opts->max_seq_len : c->max_seq_len;
    if (f->max_seq > c->max_seq_len) {
        rc = mkv_fail(err, MKV_EUSAGE, "context of %d tokens exceeds the %d of model '%s'",
                      f->max_seq, c->max_seq_len, c->name);
        goto fail;
    }
    if (f->threads > 1024) {
        rc = mkv_fail(err, MKV_EUSAGE, "%d threads is too many", f->threads);
        goto fail;
    }
    if (f->chunk > f->max_seq)
        f->chunk = f->max_seq;
    f->cache_layers = opts && opts->one_layer_cache ? 1 : c->n_layers;
    f->held_layer = -1;
#ifdef HAVE_OPENBLAS
    /* Our own threads split the work; BLAS calls stay single-threaded so
     * each task's result does not depend on how many threads run. */
    openblas_set_num_threads(1);
#endif
    size_t cache_rows = (size_t)f->cache_layers * (size_t)c->n_kv_heads * (size_t)f->max_seq;
    if (mkv_model_has_blocks(model))
        f->tile_floats = (size_t)TILE_ROWS * (size_t)mkv_model_widest_input(c);
    if (!(f->k_cache = alloc_cache(cache_rows, (size_t)c->head_dim, "key cache", err)) ||
        !(f->v_cache = alloc_cache(cache_rows, (size_t)c->head_dim, "value cache", err)) ||
        !(f->scores = alloc_floats((size_t)f->threads * ATT_ROWS, (size_t)f->max_seq,
                                   "attention scores", err)) ||
        alloc_activations(f, err)) {
        rc = err ? err->code : MKV_ENOMEM;
        goto fail;
    }
    if ((rc = start_pool(f, err)))
        goto fail;
    *out = f;
    return MKV_OK;
fail:
    mkv_forward_free(f);
    return rc;
}

/* ------------------------------------------------------------ matmul jobs */

/* y[r][0..out) = beta * y[r] + x[r] . W^T (+ bias) for r < rows. */
typedef struct {
    const float *x;
    int ldx;
    const float *w;        /* [out x in], or NULL: */
    const mkv_qmatrix *qw; /* W in blocks, dequantized a tile of rows at a time */
    int in, out;
    float *y;
    int ldy;
    float beta;
    const float *bias;
} matmul;

typedef struct {
    matmul mm[3];
    int n_mm;
    int rows;
    int tiles[3];
    const mkv_forward *f;  /* set by run_matmuls */
} matmul_job;

static void matmul_task(void *ctx, int task, int worker)
{
    matmul_job *job = ctx;
    int i = 0;
    while (task >= job->tiles[i])
        task -= job->tiles[i++];
    const matmul *mm = &job->mm[i];
    int r0 = task * TILE_ROWS;
    int nr = mm->out - r0 < TILE_ROWS ? mm->out - r0 : TILE_ROWS;
    float *y = mm->y + r0;
    if (job->rows == 1 && !mm->w && mkv_ggml_can_dot(mm->qw->type)) {
        /* one token: the rows' blocks dotted with x as they are read */
        float *tile = job->f->weight_tiles + (size_t)worker * job->f->tile_floats;
        float *dots = tile + mm->in / 4;
        mkv_ggml_dot_rows(mm->qw->type, mm->qw->data + (size_t)r0 * mm->qw->row_bytes, mm->qw->row_bytes,
                          (size_t)mm->in, (size_t)nr, mm->x, tile, dots);
        for (int j = 0; j < nr; j++)
            y[j] = (mm->beta == 0.0f ? 0.0f : mm->beta * y[j]) + dots[j] + (mm->bias ? mm->bias[r0 + j] : 0.0f);
        return;
    }
    const float *w;
    if (mm->w) {
        w = mm->w + (size_t)r0 * (size_t)mm->in;
    } else {
        /* the same floats the float32 model holds, so the same sums */
        float *tile = job->f->weight_tiles + (size_t)worker * job->f->tile_floats;
        mkv_matrix_rows(NULL, mm->qw, (size_t)mm->in, (size_t)r0, (size_t)nr, tile);
        w = tile;
    }
    if (job->rows == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, nr, mm->in, 1.0f, w, mm->in, mm->x, 1, mm->beta, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, job->rows, nr, mm->in, 1.0f, mm->x,
                    mm->ldx, w, mm->in, mm->beta, y, mm->ldy);
    if (mm->bias)
        for (int r = 0; r < job->rows; r++)
            for (int j = 0; j < nr; j++)
                y[(size_t)r * (size_t)mm->ldy + (size_t)j] += mm->bias[r0 + j];
}

static void run_matmuls(mkv_forward *f, matmul_job *job)
{
    job->f = f;
    int n_tasks = 0;
    double work = 0.0;
    for (int i = 0; i < job->n_mm; i++) {
        job->tiles[i] = (job->mm[i].out + TILE_ROWS - 1) / TILE_ROWS;
        n_tasks += job->tiles[i];
        work += (double)job->rows * job->mm[i].in * job->mm[i].out;
    }
    pool_run(&f->pool, matmul_task, job, n_tasks, work);
}

static matmul mm_make(const float *x, int ldx, const float *w, const mkv_qmatrix *qw, int in, int out,
                      float *y, int ldy, float beta, const float *bias)
{
    return (matmul){x, ldx, w, qw, in, out, y, ldy, beta, bias};
}

/* ------------------------------------------------------------ layers */

static void rmsnorm(float *out, const float *x, const float *weight, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * weight[i];
}

double mkv_rope_inv_freq(const mkv_model_config *cfg, int j)
{
    double inv_freq = pow(cfg->rope_theta, -2.0 * j / cfg->rope_dim);
    if (cfg->has_rope_freq_factors)
        inv_freq /= cfg->rope_freq_factors[j];
    return inv_freq;
}

void mkv_rope_angle(const mkv_model_config *cfg, int pos, int j, double *c, double *s)
{
    double angle = pos * mkv_rope_inv_freq(cfg, j);
    *c = cos(angle);
    *s = sin(angle);
}

static void rope_tables(mkv_forward *f, int pos0, int n)
{
    int half = f->c.rope_dim / 2;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < half; j++) {
            double c, s;
            mkv_rope_angle(&f->c, pos0 + i, j, &c, &s);
            f->rope_cos[(size_t)i * half + j] = (float)c;
            f->rope_sin[(size_t)i * half + j] = (float)s;
        }
    }
}

/* Rotate n_heads heads of head_dim channels, for token row i. */
static void rope_apply(const mkv_forward *f, float *vec, int n_heads, int i)
{
    int half = f->c.rope_dim / 2;
    const float *cs = f->rope_cos + (size_t)i * half, *sn = f->rope_sin + (size_t)i * half;
    /* Pair j is (2j, 2j+1) interleaved or (j, j + rope_dim/2) split. */
    int stride = f->c.rope_layout == MKV_ROPE_INTERLEAVED ? 2 : 1;
    int second = f->c.rope_layout == MKV_ROPE_INTERLEAVED ? 1 : half;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * f->c.head_dim;
        for (int j = 0; j < half; j++) {
            float *a = v + j * stride, *b = a + second;
            float x0 = *a, x1 = *b;
            *a = x0 * cs[j] - x1 * sn[j];
            *b = x0 * sn[j] + x1 * cs[j];
        }
    }
}

typedef struct {
    mkv_forward *f;
    int layer, pos0, n;
    int row_blocks;
} attention_job;

/* One query head over one block of up to ATT_ROWS query rows: scores
 * against every cached key up to each row's own position (causal),
 * softmax, weighted sum of values. */
static void attention_task(void *ctx, int task, int worker)
{
    attention_job *job = ctx;
    mkv_forward *f = job->f;
    int hd = f->c.head_dim;
    int h = task / job->row_blocks;
    int r0 = (task % job->row_blocks) * ATT_ROWS;
    int rows = job->n - r0 < ATT_ROWS ? job->n - r0 : ATT_ROWS;
    int kvh = h / f->group;
    int keys = job->pos0 + r0 + rows; /* the block's last row sees this many */
    const float *K = cache_row(f, f->k_cache, job->layer, kvh, 0);
    const float *V = cache_row(f, f->v_cache, job->layer, kvh, 0);
    const float *q = f->q + (size_t)r0 * f->q_dim + (size_t)h * hd;
    float *out = f->att + (size_t)r0 * f->q_dim + (size_t)h * hd;
    float *s = f->scores + (size_t)worker * ATT_ROWS * f->max_seq;
    float scale = (float)(1.0 / sqrt((double)hd));

    if (rows == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, keys, hd, scale, K, hd, q, 1, 0.0f, s, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd, scale, q, f->q_dim,
                    K, hd, 0.0f, s, keys);
    for (int r = 0; r < rows; r++) {
        float *row = s + (size_t)r * keys;
        int visible = job->pos0 + r0 + r + 1;
        float max = row[0];
        for (int t = 1; t < visible; t++)
            if (row[t] > max)
                max = row[t];
        double sum = 0.0;
        for (int t = 0; t < visible; t++) {
            row[t] = expf(row[t] - max);
            sum += row[t];
        }
        float inv = (float)(1.0 / sum);
        for (int t = 0; t < visible; t++)
            row[t] *= inv;
        for (int t = visible; t < keys; t++)
            row[t] = 0.0f;
    }
    if (rows == 1)
        cblas_sgemv(CblasRowMajor, CblasTrans, keys, hd, 1.0f, V, hd, s, 1, 0.0f, out, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, keys, 1.0f, s, keys,
                    V, hd, 0.0f, out, f->q_dim);
}

static int layer_forward(mkv_forward *f, int l, int pos0, int n, mkv_error *err)
{
    const mkv_model_config *c = &f->c;
    const mkv_layer_weights *w = &f->m->layers[l];
    int dim = c->dim, hd = c->head_dim;

    for (int i = 0; i < n; i++)
        rmsnorm(f->xb + (size_t)i * dim, f->x + (size_t)i * dim, w->rms_att, dim, c->rms_eps);
    matmul_job qkv = {{mm_make(f->xb, dim, w->wq, &w->qwq, dim, f->q_dim, f->q, f->q_dim, 0.0f, w->bq),
                       mm_make(f->xb, dim, w->wk, &w->qwk, dim, f->kv_dim, f->k, f->kv_dim, 0.0f, w->bk),
                       mm_make(f->xb, dim, w->wv, &w->qwv, dim, f->kv_dim, f->v, f->kv_dim, 0.0f, w->bv)},
                      3, n, {0}};
    run_matmuls(f, &qkv);
    if (f->capture)
        memcpy(f->k_pre, f->k, (size_t)n * f->kv_dim * sizeof(float));
    for (int i = 0; i < n; i++) {
        rope_apply(f, f->q + (size_t)i * f->q_dim, c->n_heads, i);
        rope_apply(f, f->k + (size_t)i * f->kv_dim, c->n_kv_heads, i);
        if (f->attention)
            continue;
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t src = (size_t)i * f->kv_dim + (size_t)h * hd;
            memcpy(cache_row(f, f->k_cache, l, h, pos0 + i), f->k + src, (size_t)hd * sizeof(float));
            memcpy(cache_row(f, f->v_cache, l, h, pos0 + i), f->v + src, (size_t)hd * sizeof(float));
        }
    }
    mkv_capture_batch b = {l, pos0, n, f->q, f->k, f->k_pre, f->v, &f->task_threads};
    if (f->capture) {
        int rc = f->capture(f->capture_user, &b, err);
        if (rc)
            return rc;
    }

    if (f->attention) {
        int rc = f->attention(f->attention_user, &b, f->att, err);
        if (rc)
            return rc;
    } else {
        attention_job att = {f, l, pos0, n, (n + ATT_ROWS - 1) / ATT_ROWS};
        double att_work = 2.0 * n * (pos0 + n) * (double)hd * c->n_heads;
        pool_run(&f->pool, attention_task, &att, c->n_heads * att.row_blocks, att_work);
    }

    matmul_job wo = {{mm_make(f->att, f->q_dim, w->wo, &w->qwo, f->q_dim, dim, f->x, dim, 1.0f, NULL)}, 1, n, {0}};
    run_matmuls(f, &wo);

    for (int i = 0; i < n; i++)
        rmsnorm(f->xb + (size_t)i * dim, f->x + (size_t)i * dim, w->rms_ffn, dim, c->rms_eps);
    int hid = c->hidden_dim;
    matmul_job up = {{mm_make(f->xb, dim, w->w1, &w->qw1, dim, hid, f->h1, hid, 0.0f, NULL),
                      mm_make(f->xb, dim, w->w3, &w->qw3, dim, hid, f->h3, hid, 0.0f, NULL)},
                     2, n, {0}};
    run_matmuls(f, &up);
    for (size_t i = 0; i < (size_t)n * hid; i++) {
        float g = f->h1[i];
        f->h1[i] = g / (1.0f + expf(-g)) * f->h3[i];
    }
    matmul_job down = {{mm_make(f->h1, hid, w->w2, &w->qw2, hid, dim, f->x, dim, 1.0f, NULL)}, 1, n, {0}};
    run_matmuls(f, &down);
    return MKV_OK;
}

/* Logits for rows [first, first+count) of the chunk into out (rows of vocab). */
static void classify(mkv_forward *f, int first, int count, float *out)
{
    const mkv_model_config *c = &f->c;
    for (int i = 0; i < count; i++)
        rmsnorm(f->xb + (size_t)i * c->dim, f->x + (size_t)(first + i) * c->dim, f->m->rms_final,
                c->dim, c->rms_eps);
    matmul_job job = {{mm_make(f->xb, c->dim, f->m->classifier, &f->m->qclassifier, c->dim, c->vocab_size, out,
                               c->vocab_size, 0.0f, NULL)}, 1, count, {0}};
    run_matmuls(f, &job);
}

/* The checks both runs make before any work: the tokens fit the context
 * and the vocabulary. */
static int check_tokens(const mkv_forward *f, const int32_t *tokens, size_t n, mkv_error *err)
{
    if (n == 0)
        return mkv_fail(err, MKV_EUSAGE, "no tokens to run");
    if (!f->x)
        return mkv_fail(err, MKV_ENOMEM, "the forward pass lost its activation buffers to a failed allocation");
    if (n > (size_t)(f->max_seq - f->pos))
        return mkv_fail(err, MKV_EFORMAT,
                        "%zu tokens at position %d exceed the context of %d tokens", n, f->pos, f->max_seq);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= f->c.vocab_size)
            return mkv_fail(err, MKV_EFORMAT, "token id %d at index %zu is outside the vocabulary of %d",
                            (int)tokens[i], i, f->c.vocab_size);
    return MKV_OK;
}

/* Embeddings of tokens[0..count) into rows of x. */
static void embed(const mkv_forward *f, const int32_t *tokens, int count, float *x)
{
    size_t dim = (size_t)f->c.dim;
    for (int i = 0; i < count; i++)
        mkv_matrix_rows(f->m->tok_embedding, &f->m->qtok_embedding, dim, (size_t)tokens[i], 1,
                        x + (size_t)i * dim);
}

int mkv_forward_run(mkv_forward *f, const int32_t *tokens, size_t n, float *logits,
                    mkv_logits_mode mode, mkv_error *err)
{
    const mkv_model_config *c = &f->c;
    if ((mode != MKV_LOGITS_NONE) && !logits)
        return mkv_fail(err, MKV_EUSAGE, "no buffer for the logits");
    if (!f->attention && !f->k_cache)
        return mkv_fail(err, MKV_EUSAGE, "the forward pass has no cache and no attention to run");
    if (!f->attention && f->cache_layers != c->n_layers)
        return mkv_fail(err, MKV_EUSAGE,
                        "a forward pass whose cache holds one layer runs only a prefill by layer or an "
                        "external attention");
    int rc = check_tokens(f, tokens, n, err);
    if (rc)
        return rc;
    int start_pos = f->pos;
    for (size_t done = 0; done < n;) {
        int count = n - done < (size_t)f->chunk ? (int)(n - done) : f->chunk;
        embed(f, tokens + done, count, f->x);
        rope_tables(f, f->pos, count);
        for (int l = 0; l < c->n_layers; l++) {
            int rc = layer_forward(f, l, f->pos, count, err);
            if (rc) {
                f->pos = start_pos;
                return rc;
            }
        }
        if (mode == MKV_LOGITS_ALL)
            classify(f, 0, count, logits + done * (size_t)c->vocab_size);
        else if (mode == MKV_LOGITS_LAST && done + (size_t)count == n)
            classify(f, count - 1, 1, logits);
        f->pos += count;
        done += (size_t)count;
    }
    return MKV_OK;
}

int mkv_forward_run_by_layer(mkv_forward *f, const int32_t *tokens, size_t n, float *logits,
                             mkv_layer_done_fn done, void *user, mkv_error *err)
{
    const mkv_model_config *c = &f->c;
    if (f->attention)
        return mkv_fail(err, MKV_EUSAGE, "a prefill by layer runs the pass's own attention, not an external one");
    if (!f->k_cache)
        return mkv_fail(err, MKV_EUSAGE, "the forward pass has no cache for a prefill by layer");
    if (f->cache_layers != c->n_layers && f->pos != 0)
        return mkv_fail(err, MKV_EUSAGE,
                        "a forward pass whose cache holds one layer prefills by layer from position 0, not %d",
                        f->pos);
    int rc = check_tokens(f, tokens, n, err);
    if (rc)
        return rc;
    size_t half = (size_t)c->rope_dim / 2;
    float *resid = mkv_alloc(n, (size_t)c->dim * sizeof(float), "residual stream of the prompt", err);
    float *cos_all = resid ? mkv_alloc(n, half * sizeof(float), "RoPE table of the prompt", err) : NULL;
    float *sin_all = cos_all ? mkv_alloc(n, half * sizeof(float), "RoPE table of the prompt", err) : NULL;
    if (!sin_all) {
        mkv_free(resid);
        mkv_free(cos_all);
        return err ? err->code : MKV_ENOMEM;
    }
    /* Point the chunk's buffers at slices of the prompt's: the layers read
     * and write them exactly as in mkv_forward_run, chunk for chunk. */
    float *chunk_x = f->x, *chunk_cos = f->rope_cos, *chunk_sin = f->rope_sin;
    int pos0 = f->pos;
    embed(f, tokens, (int)n, resid);
    f->rope_cos = cos_all;
    f->rope_sin = sin_all;
    rope_tables(f, pos0, (int)n);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        f->held_layer = l;
        for (size_t first = 0; first < n && !rc;) {
            int count = n - first < (size_t)f->chunk ? (int)(n - first) : f->chunk;
            f->x = resid + first * (size_t)c->dim;
            f->rope_cos = cos_all + first * half;
            f->rope_sin = sin_all + first * half;
            rc = layer_forward(f, l, pos0 + (int)first, count, err);
            first += (size_t)count;
        }
        f->x = chunk_x;
        f->rope_cos = chunk_cos;
        f->rope_sin = chunk_sin;
        if (!rc && done) {
            /* done (a layer's compression, say) runs without the chunk's
             * buffers: its own memory and theirs never add up. */
            free_activations(f);
            f->pos = pos0 + (int)n;   /* what done reads: rows 0..pos0+n-1 */
            rc = done(user, l, err);
            f->pos = pos0;
            int got = alloc_activations(f, rc ? NULL : err);
            if (!rc)
                rc = got;
            chunk_x = f->x;
            chunk_cos = f->rope_cos;
            chunk_sin = f->rope_sin;
        }
    }
    if (!rc && logits) {
        /* the last token's row, as the last chunk of mkv_forward_run leaves it */
        memcpy(f->x, resid + (n - 1) * (size_t)c->dim, (size_t)c->dim * sizeof(float));
        classify(f, 0, 1, logits);
    }
    mkv_free(resid);
    mkv_free(cos_all);
    mkv_free(sin_all);
    if (rc) {
        f->held_layer = -1;
        return rc;
    }
    f->pos = pos0 + (int)n;
    return MKV_OK;
}
