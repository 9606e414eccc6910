/* The mosaic methods at decode time: the method hooks over a packed head
 * (load, attend, free) and its growth by the dual buffer, docs/DESIGN.md
 * 5.3.
 *
 * GROWTH, per layer and KV head, one new token (post-RoPE k, v) per step:
 *  1. The new token joins the dense recent window (fp16); once the window
 *     holds `recent` tokens its oldest token leaves it for the temporary
 *     region. With no packed segment to take its strategy from (a prompt
 *     shorter than sink + recent), the window grows instead.
 *  2. Temporary region: the open segment at the end of the strategy
 *     tables. A token entering it is packed at once with the strategy and
 *     rotations of the prefill's last segment (r, g, d', block keys of the
 *     same shape; its block key row recomputed over the tokens of its
 *     block; values in fp16 whatever the bits of that segment, whose zeros
 *     and steps span its own vectors only), so attention reads it like any
 *     packed token from the next query on. The region's raw tokens are
 *     kept beside it.
 *     Each token entering it is added to the open segment's Gram matrices
 *     (C += x x^T per tensor, in double) and to its running loss: the
 *     energy the template drops from it (|x|^2 less the energy of the
 *     elements the template keeps of x R), summed, over the summed |x|^2
 *     of the segment's tokens.
 *  3. The open segment closes when it reaches `segment` tokens (S_max), or
 *     early by the running-loss rule: once it holds at least a quarter of
 *     `segment` tokens, as soon as the running loss of K or of V exceeds
 *     the energy loss recorded for the template's own segment by more
 *     than the close-loss rise (mkv_mosaic_set_close_loss; default
 *     MKV_MOSAIC_CLOSE_LOSS_DEFAULT): the template no longer fits the
 *     tokens. The manager then compresses the segment as one of its own
 *     (lib/mosaic/finalize.c: the rotation from its accumulated Gram
 *     matrix, the strategy by the method's rule -- fixed, dynamic or
 *     ratio on the segment's own bytes, with the energy loss: decode has
 *     no observation queries for it) on its own thread, and the next
 *     token opens a new segment.
 *  4. At the start of a step (an append) a finished segment is published:
 *     its packed arrays replace the temporary ones in place. Decode never
 *     waits for the manager; the switch happens only between steps.
 * The final cache (every closed segment published, mkv_mosaic_state_flush)
 * does not depend on when the manager ran: temporary tokens are packed
 * with the prefill's strategy, finished segments with their own, and
 * where a segment closes depends on its tokens only. With the manager off
 * (mkv_mosaic_set_manager) no segment closes: the temporary region takes
 * every token, which measures what the manager costs decoding. */
#include "config.h"
#include "mosaic/mosaic.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/half.h"
#include "core/tensor.h"
#include "mosaic/finalize_priv.h"

/* ---------------------------------------------------------------- the manager */

/* One closed segment to finalise. */
typedef struct job {
    mkv_mosaic_config c;
    int64_t start, len;
    int d, G;
    float *k, *v;            /* [len][d] raw (fp16 values) */
    double *gram_k, *gram_v; /* [d][d] their Gram matrices (rotated strategies only) */
    mkv_mosaic_head out;     /* one segment at start 0 */
    int rc;
    mkv_error err;
    double seconds, cpu_seconds;
    atomic_int done;
    struct job *next;        /* the manager's queue */
} job;

/* One manager thread for every growing state of the process: started by
 * the first closed segment, stopped when the last growing state goes. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, finished;
    job *head, *tail;
    int started;             /* 1 running, -1 could not start, 0 not yet */
    int stop;
    int users;               /* growing states */
    pthread_t tid;
    atomic_int mode;         /* mkv_mosaic_manager_mode */
} manager = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0, 0,
             0, MKV_MOSAIC_MANAGER_ASYNC};

/* The running-loss rule's rise; read when a state starts growing. */
static _Atomic double close_loss = MKV_MOSAIC_CLOSE_LOSS_DEFAULT;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the calling thread. */
static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_job(job *j)
{
    double t0 = now(), c0 = thread_cpu();
    mkv_error_clear(&j->err);
    j->rc = mkv_mosaic_finalize_segment(&j->c, j->k, j->v, j->len, j->d, j->G, j->gram_k, j->gram_v, &j->out,
                                        &j->err);
    j->seconds = now() - t0;
    j->cpu_seconds = thread_cpu() - c0;
}

static void *manager_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&manager.mu);
    for (;;) {
        while (!manager.head && !manager.stop)
            pthread_cond_wait(&manager.wake, &manager.mu);
        if (!manager.head)
            break;
        job *j = manager.head;
        manager.head = j->next;
        if (!manager.head)
            manager.tail = NULL;
        pthread_mutex_unlock(&manager.mu);
        run_job(j);
        pthread_mutex_lock(&manager.mu);
        atomic_store_explicit(&j->done, 1, memory_order_release);
        pthread_cond_broadcast(&manager.finished);
    }
    pthread_mutex_unlock(&manager.mu);
    return NULL;
}

static void manager_use(void)
{
    pthread_mutex_lock(&manager.mu);
    manager.users++;
    pthread_mutex_unlock(&manager.mu);
}

/* The last user stops the thread (its queue is empty by then: every
 * state waits for its own jobs before it goes). */
static void manager_release(void)
{
    pthread_mutex_lock(&manager.mu);
    int last = --manager.users == 0 && manager.started == 1;
    if (last) {
        manager.stop = 1;
        pthread_cond_broadcast(&manager.wake);
    }
    pthread_mutex_unlock(&manager.mu);
    if (!last)
        return;
    pthread_join(manager.tid, NULL);
    pthread_mutex_lock(&manager.mu);
    manager.started = 0;
    manager.stop = 0;
    pthread_mutex_unlock(&manager.mu);
}

void mkv_mosaic_set_manager(mkv_mosaic_manager_mode mode)
{
    atomic_store(&manager.mode, (int)mode);
}

void mkv_mosaic_set_close_loss(double rise)
{
    atomic_store(&close_loss, rise);
}

/* Queue j, or run it now when the manager is synchronous (sync) or
 * cannot start; returns 1 when it ran on the caller's thread. */
static int submit(job *j, int sync)
{
    if (sync) {
        run_job(j);
        atomic_store(&j->done, 1);
        return 1;
    }
    pthread_mutex_lock(&manager.mu);
    if (!manager.started)
        manager.started = pthread_create(&manager.tid, NULL, manager_main, NULL) == 0 ? 1 : -1;
    if (manager.started < 0) {
        pthread_mutex_unlock(&manager.mu);
        run_job(j);
        atomic_store(&j->done, 1);
        return 1;
    }
    j->next = NULL;
    if (manager.tail)
        manager.tail->next = j;
    else
        manager.head = j;
    manager.tail = j;
    pthread_cond_signal(&manager.wake);
    pthread_mutex_unlock(&manager.mu);
    return 0;
}

static void wait_job(job *j)
{
    if (atomic_load_explicit(&j->done, memory_order_acquire))
        return;
    pthread_mutex_lock(&manager.mu);
    while (!atomic_load_explicit(&j->done, memory_order_acquire))
        pthread_cond_wait(&manager.finished, &manager.mu);
    pthread_mutex_unlock(&manager.mu);
}

static void job_free(job *j)
{
    if (!j)
        return;
    wait_job(j);
    mkv_free(j->k);
    mkv_free(j->v);
    mkv_free(j->gram_k);
    mkv_free(j->gram_v);
    mkv_mosaic_head_free(&j->out);
    free(j);
}

/* ---------------------------------------------------------------- state */

#define MAX_PENDING 64

typedef struct {
    mkv_mosaic_head h;
    mkv_mosaic_attn_opts o;
    mkv_mosaic_config cfg;
    int growing;                      /* growth set up (first append) */
    /* the temporary region's strategy: the prefill's last segment */
    int have_template;
    mkv_mosaic_strategy tk, tv;
    double *rk, *rv;                  /* [d][d] their rotations (zero beyond the stored columns) */
    uint16_t *rot_k, *rot_v;          /* [d][cols] as stored (fp16) */
    double ref_loss[2];               /* K, V: the template's recorded energy loss */
    mkv_mosaic_manager_mode mode;     /* as set when growth started */
    double close_rise;                /* the running-loss rule's rise */
    /* the open segment: its raw tokens, their Gram matrices (rotating
     * configurations only) and running loss */
    int64_t open_len, open_cap;
    float *raw_k, *raw_v;             /* [open_cap][d] */
    double *gram[2];                  /* K, V: [d][d], the upper triangle kept */
    double energy[2], dropped[2];     /* K, V: sum |x|^2, sum of what the template drops */
    /* closed segments waiting for the manager, oldest first */
    job *pending[MAX_PENDING];
    int n_pending;
    /* capacities of the growing arrays */
    int64_t cap[2][6];                /* k/v x values, bitmap, blockkeys, rotation, codes, qparams */
    int64_t dense_cap;
    mkv_decode_counters stats;
} mosaic_state;

static void state_free(mosaic_state *s)
{
    for (int i = 0; i < s->n_pending; i++)
        job_free(s->pending[i]);
    if (s->growing)
        manager_release();
    mkv_mosaic_head_free(&s->h);
    mkv_free(s->rk);
    mkv_free(s->rv);
    mkv_free(s->rot_k);
    mkv_free(s->rot_v);
    mkv_free(s->raw_k);
    mkv_free(s->raw_v);
    mkv_free(s->gram[0]);
    mkv_free(s->gram[1]);
    mkv_free(s);
}

int mkv_mosaic_state_load(const mkv_params *p, mkv_cdump *c, int layer, int head, mkv_mosaic_config_fn config,
                          void **state, mkv_error *err)
{
    mosaic_state *s = mkv_calloc(1, sizeof *s, "a mosaic state", err);
    if (!s)
        return err ? err->code : MKV_ENOMEM;
    s->o.budget = mkv_params_double(p, "budget");
    s->o.agg_sum = strcmp(mkv_params_str(p, "agg"), "sum") == 0;
    s->o.refine = mkv_params_double(p, "refine");
    int rc = mkv_mosaic_load(c, layer, head, (int)mkv_params_int(p, "block"), mkv_params_int(p, "sink"),
                             mkv_params_int(p, "recent"), &s->h, err);
    if (rc != MKV_OK) {
        mkv_free(s);
        return rc;
    }
    config(p, s->h.d, &s->cfg);
    s->o.budget = mkv_mosaic_scaled_budget(s->h.budget_scale, s->o.budget);
    *state = s;
    return MKV_OK;
}

int mkv_mosaic_method_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    mosaic_state *s = state;
    return mkv_mosaic_attend(&s->h, &s->o, q, r, err);
}

int mkv_mosaic_method_attend_begin(void *state, const mkv_attend_query *q, mkv_attend_result *r, void **job,
                                   mkv_error *err)
{
    mosaic_state *s = state;
    mkv_mosaic_attend_job *j;
    int rc = mkv_mosaic_attend_begin(&s->h, &s->o, q, r, &j, err);
    *job = j;
    return rc;
}

void mkv_mosaic_method_attend_piece(void *job, int piece) { mkv_mosaic_attend_piece(job, piece); }

void mkv_mosaic_method_attend_end(void *job, mkv_attend_result *r) { mkv_mosaic_attend_end(job, r); }

void mkv_mosaic_method_free(void *state)
{
    if (state)
        state_free(state);
}

const mkv_mosaic_head *mkv_mosaic_state_head(const void *state)
{
    return &((const mosaic_state *)state)->h;
}

const double *mkv_mosaic_state_gram(const void *state, int is_key, int64_t *tokens)
{
    const mosaic_state *s = state;
    *tokens = s->open_len;
    return s->gram[!is_key];
}

/* ---------------------------------------------------------------- bytes */

static uint64_t tensor_bytes(const mkv_mosaic_tensor *t, int d, int block)
{
    uint64_t b = (uint64_t)t->nseg * (MKV_MOSAIC_TABLE_COLS + MKV_MOSAIC_LOSS_COLS +
                                      (block > 0 ? MKV_MOSAIC_BLOCKDIM_COLS : 0)) * 4;
    for (int64_t i = 0; i < t->nseg; i++) {
        mkv_mosaic_bytes mb;
        mkv_mosaic_strategy_bytes(&t->seg[i], d, block, &mb);
        b += mb.total;
    }
    return b;
}

uint64_t mkv_mosaic_head_bytes(const mkv_mosaic_head *h)
{
    return 2 * (uint64_t)(h->sink_n + h->recent_n) * (uint64_t)h->d * 2 + tensor_bytes(&h->k, h->d, h->block) +
           tensor_bytes(&h->v, h->d, 0) + (h->budget_scale > 0 ? sizeof(float) : 0);
}

uint64_t mkv_mosaic_method_state_bytes(const void *state)
{
    return mkv_mosaic_head_bytes(&((const mosaic_state *)state)->h);
}

void mkv_mosaic_method_decode_stats(const void *state, mkv_decode_counters *out)
{
    *out = ((const mosaic_state *)state)->stats;
}

/* ---------------------------------------------------------------- growth */

/* Room for `need` elements of `elem` bytes in *p (used kept).  The arrays
 * arrive from the prefill filled to the last element, so growing by an
 * eighth keeps appends amortised without doubling the held bytes at the
 * first step. */
static int grow(void **p, int64_t *cap, int64_t used, int64_t need, size_t elem, mkv_error *err)
{
    if (need <= *cap && *p)
        return MKV_OK;
    int64_t c = *cap + *cap / 8;
    if (c < 16)
        c = 16;
    if (c < need)
        c = need;
    void *q = mkv_alloc((size_t)c, elem, "a growing mosaic array", err);
    if (!q)
        return err ? err->code : MKV_ENOMEM;
    if (used > 0)
        memcpy(q, *p, (size_t)used * elem);
    mkv_free(*p);
    *p = q;
    *cap = c;
    return MKV_OK;
}

/* The template of the temporary region: the last packed segment's
 * strategies and rotations (none: the recent window grows). */
static int set_template(mosaic_state *s, mkv_error *err)
{
    mkv_mosaic_head *h = &s->h;
    int d = h->d;
    s->growing = 1;
    manager_use();
    s->mode = (mkv_mosaic_manager_mode)atomic_load(&manager.mode);
    s->close_rise = atomic_load(&close_loss);
    s->dense_cap = h->sink_n + h->recent_n;
    for (int x = 0; x < 2; x++) {
        mkv_mosaic_tensor *t = x ? &h->v : &h->k;
        s->cap[x][0] = t->n_values;
        s->cap[x][1] = t->n_bitmap;
        s->cap[x][2] = t->n_blockkeys;
        s->cap[x][3] = t->n_rotation;
        s->cap[x][4] = t->n_codes;
        s->cap[x][5] = t->n_qparams;
    }
    if (h->k.nseg == 0)
        return MKV_OK;
    int64_t last = h->k.nseg - 1;
    s->tk = h->k.seg[last];
    s->tv = h->v.seg[last];
    /* packed at once, with no segment of its own to take zeros and steps
     * from: fp16 values */
    s->tk.bits = s->tv.bits = 16;
    s->tk.qgroup = s->tv.qgroup = 0;
    for (int x = 0; x < 2; x++) {
        /* a dump from elsewhere may not have measured it */
        double loss = (x ? h->v.loss : h->k.loss)[last * MKV_MOSAIC_LOSS_COLS];
        s->ref_loss[x] = isfinite(loss) ? loss : 0;
    }
    size_t dd = (size_t)d * (size_t)d;
    if (!(s->rk = mkv_calloc(dd, sizeof *s->rk, "a rotation", err)) ||
        !(s->rv = mkv_calloc(dd, sizeof *s->rv, "a rotation", err)) ||
        !(s->rot_k = mkv_alloc(dd, sizeof *s->rot_k, "a rotation", err)) ||
        !(s->rot_v = mkv_alloc(dd, sizeof *s->rot_v, "a rotation", err)) ||
        (s->cfg.rotate && (!(s->gram[0] = mkv_alloc(dd, sizeof(double), "a Gram matrix", err)) ||
                           !(s->gram[1] = mkv_alloc(dd, sizeof(double), "a Gram matrix", err)))))
        return err ? err->code : MKV_ENOMEM;
    for (int x = 0; x < 2; x++) {
        const mkv_mosaic_tensor *t = x ? &h->v : &h->k;
        const mkv_mosaic_strategy *ts = x ? &s->tv : &s->tk;
        int cols = mkv_mosaic_rotation_cols(ts);
        const uint16_t *R = t->rotation + t->off_rotation[last];
        double *full = x ? s->rv : s->rk;
        uint16_t *copy = x ? s->rot_v : s->rot_k;
        for (int j = 0; j < d; j++)
            for (int c = 0; c < cols; c++) {
                full[j * d + c] = mkv_f16_to_f32(R[j * cols + c]);
                copy[j * cols + c] = R[j * cols + c];
            }
    }
    s->have_template = 1;
    return MKV_OK;
}

/* Open a segment at token `start` with the template's strategies. */
static int open_segment(mosaic_state *s, int64_t start, mkv_error *err)
{
    mkv_mosaic_head *h = &s->h;
    int d = h->d;
    for (int x = 0; x < 2; x++) {
        mkv_mosaic_tensor *t = x ? &h->v : &h->k;
        mkv_mosaic_strategy st = x ? s->tv : s->tk;
        st.start = start;
        st.len = 0;
        int64_t n = t->nseg + 1;
        mkv_mosaic_strategy *seg = mkv_alloc((size_t)n, sizeof *seg, "strategies", err);
        float *loss = mkv_alloc((size_t)n * MKV_MOSAIC_LOSS_COLS, sizeof *loss, "losses", err);
        if (!seg || !loss) {
            mkv_free(seg);
            mkv_free(loss);
            return err ? err->code : MKV_ENOMEM;
        }
        if (t->nseg) {
            memcpy(seg, t->seg, (size_t)t->nseg * sizeof *seg);
            memcpy(loss, t->loss, (size_t)t->nseg * MKV_MOSAIC_LOSS_COLS * sizeof *loss);
        }
        seg[t->nseg] = st;
        loss[t->nseg * MKV_MOSAIC_LOSS_COLS] = NAN;
        loss[t->nseg * MKV_MOSAIC_LOSS_COLS + 1] = NAN;
        mkv_free(t->seg);
        mkv_free(t->loss);
        t->seg = seg;
        t->loss = loss;
        t->nseg = n;
        int cols = mkv_mosaic_rotation_cols(&st);
        int64_t nr = (int64_t)d * cols;
        int rc = grow((void **)&t->rotation, &s->cap[x][3], t->n_rotation, t->n_rotation + nr, sizeof *t->rotation,
                      err);
        if (rc)
            return rc;
        if (nr)
            memcpy(t->rotation + t->n_rotation, x ? s->rot_v : s->rot_k, (size_t)nr * sizeof *t->rotation);
        t->n_rotation += nr;
        s->energy[x] = s->dropped[x] = 0;
        if (s->gram[x])
            memset(s->gram[x], 0, (size_t)d * (size_t)d * sizeof(double));
    }
    s->open_len = 0;
    return MKV_OK;
}

/* Token x [d] enters the open segment of tensor `which` (0 K, 1 V): its
 * Gram matrix gains x x^T, its running loss what the template drops of x. */
static void track_token(mosaic_state *s, int which, const float *x)
{
    int d = s->h.d;
    double *C = s->gram[which];
    for (int i = 0; C && i < d; i++)
        for (int j = i; j < d; j++)
            C[i * d + j] += (double)x[i] * (double)x[j];
    const mkv_mosaic_strategy *st = which ? &s->tv : &s->tk;
    double xt[MKV_MOSAIC_MAX_D], e = 0;
    int pos[MKV_MOSAIC_MAX_D];
    mkv_mosaic_rotate(x, 1, d, st->rotate ? (which ? s->rv : s->rk) : NULL, d, st->dprime, xt);
    for (int i = 0; i < d; i++)
        e += (double)x[i] * (double)x[i];
    double kept = mkv_mosaic_select(xt, st, pos, NULL);
    s->energy[which] += e;
    s->dropped[which] += e > kept ? e - kept : 0;
}

/* The running-loss rule (the top comment, 3). */
static int loss_rose(const mosaic_state *s)
{
    if (4 * s->open_len < s->cfg.segment)
        return 0;
    for (int x = 0; x < 2; x++)
        if (s->energy[x] > 0 && s->dropped[x] / s->energy[x] > s->ref_loss[x] + s->close_rise)
            return 1;
    return 0;
}

/* Pack token x (already the open segment's last raw row) into the open
 * segment of tensor t: its values and bitmap, and its block's key row. */
static int pack_token(mosaic_state *s, int is_key, mkv_error *err)
{
    mkv_mosaic_head *h = &s->h;
    mkv_mosaic_tensor *t = is_key ? &h->k : &h->v;
    int d = h->d, B = h->block, x = !is_key;
    mkv_mosaic_strategy *st = &t->seg[t->nseg - 1];
    const float *raw = is_key ? s->raw_k : s->raw_v;
    int64_t j = s->open_len - 1;                   /* the token within the open segment */
    int64_t b0 = is_key ? j / B * B : j;           /* its block's first token */
    mkv_mosaic_strategy part = *st;
    part.start = st->start + b0;
    part.len = j - b0 + 1;
    int nbytes = mkv_mosaic_bitmap_bytes(st), width = is_key ? mkv_mosaic_block_width(st) : 0;
    uint16_t keyrow[2 * MKV_MOSAIC_MAX_D];
    uint16_t *vals = mkv_alloc((size_t)part.len * (size_t)st->r, sizeof *vals, "packed values", err);
    uint8_t *bits = mkv_alloc((size_t)part.len * (size_t)(nbytes ? nbytes : 1), 1, "bitmaps", err);
    uint16_t *rot = mkv_alloc((size_t)d * (size_t)d, sizeof *rot, "a rotation", err);
    int rc = vals && bits && rot ? MKV_OK : MKV_ENOMEM;
    part.rotate = st->rotate;
    if (!rc)
        rc = mkv_mosaic_encode(&part, raw + b0 * d, d, st->rotate ? (is_key ? s->rk : s->rv) : NULL,
                               is_key ? B : 0, vals, nbytes ? bits : NULL, NULL, NULL, keyrow, rot, err);
    if (!rc)
        rc = grow((void **)&t->values, &s->cap[x][0], t->n_values, t->n_values + st->r, sizeof *t->values, err);
    if (!rc)
        rc = grow((void **)&t->bitmap, &s->cap[x][1], t->n_bitmap, t->n_bitmap + nbytes, 1, err);
    if (!rc && is_key)
        rc = grow((void **)&t->blockkeys, &s->cap[x][2], t->n_blockkeys, t->n_blockkeys + width,
                  sizeof *t->blockkeys, err);
    if (!rc) {
        memcpy(t->values + t->n_values, vals + (j - b0) * st->r, (size_t)st->r * sizeof *t->values);
        t->n_values += st->r;
        if (nbytes)
            memcpy(t->bitmap + t->n_bitmap, bits + (j - b0) * nbytes, (size_t)nbytes);
        t->n_bitmap += nbytes;
        if (is_key) {
            /* a new block gets a row; a block already open has its row redone */
            if (j == b0)
                t->n_blockkeys += width;
            memcpy(t->blockkeys + t->n_blockkeys - width, keyrow, (size_t)width * sizeof *t->blockkeys);
        }
        st->len++;
    }
    mkv_free(vals);
    mkv_free(bits);
    mkv_free(rot);
    return rc;
}

/* Close the open segment: its raw tokens go to the manager. */
static int close_segment(mosaic_state *s, mkv_error *err)
{
    if (s->n_pending == MAX_PENDING)
        return mkv_fail(err, MKV_ENOMEM, "mosaic: %d segments wait for the manager", MAX_PENDING);
    const mkv_mosaic_head *h = &s->h;
    int d = h->d;
    job *j = calloc(1, sizeof *j);
    if (!j)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for a segment to finalise");
    atomic_init(&j->done, 1);   /* not submitted yet: nothing to wait for */
    j->c = s->cfg;
    j->c.sink = 0;
    j->c.recent = 0;
    j->c.segment = s->open_len;
    j->start = h->k.seg[h->k.nseg - 1].start;
    j->len = s->open_len;
    j->d = d;
    j->G = h->G;
    size_t n = (size_t)s->open_len * (size_t)d;
    j->k = mkv_alloc(n, sizeof(float), "segment keys", err);
    j->v = mkv_alloc(n, sizeof(float), "segment values", err);
    size_t dd = (size_t)d * (size_t)d;
    if (s->gram[0]) {
        j->gram_k = mkv_alloc(dd, sizeof(double), "a Gram matrix", err);
        j->gram_v = mkv_alloc(dd, sizeof(double), "a Gram matrix", err);
    }
    if (!j->k || !j->v || (s->gram[0] && (!j->gram_k || !j->gram_v))) {
        job_free(j);
        return MKV_ENOMEM;
    }
    memcpy(j->k, s->raw_k, n * sizeof(float));
    memcpy(j->v, s->raw_v, n * sizeof(float));
    /* the Gram matrices with both triangles, as the decomposition reads them */
    for (int x = 0; x < 2 && s->gram[0]; x++)
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++)
                (x ? j->gram_v : j->gram_k)[a * d + b] = s->gram[x][a <= b ? a * d + b : b * d + a];
    atomic_store(&j->done, 0);
    s->pending[s->n_pending++] = j;
    /* finalised on this thread: the step waits for it */
    s->stats.steps_waited += submit(j, s->mode == MKV_MOSAIC_MANAGER_SYNC);
    s->open_len = 0;
    return MKV_OK;
}

/* Replace the arrays of segment i of t by the one segment of src (start
 * shifted to `start`). */
static int splice(mosaic_state *s, mkv_mosaic_tensor *t, int x, int64_t i, const mkv_mosaic_tensor *src,
                  int64_t start, mkv_error *err)
{
    const mkv_mosaic_head *h = &s->h;
    int d = h->d, block = x ? 0 : h->block;
    enum { N = 6 };
    int64_t lim[N] = {t->n_values, t->n_bitmap, t->n_blockkeys, t->n_rotation, t->n_codes, t->n_qparams};
    const int64_t *offs[N] = {t->off_values, t->off_bitmap, t->off_blockkeys, t->off_rotation, t->off_codes,
                              t->off_qparams};
    int64_t a[N], b[N], add[N] = {src->n_values, src->n_bitmap, src->n_blockkeys, src->n_rotation, src->n_codes,
                                  src->n_qparams};
    int last = i + 1 == t->nseg;
    for (int k = 0; k < N; k++) {
        a[k] = offs[k][i];
        b[k] = last ? lim[k] : offs[k][i + 1];
    }
    void **arr[N] = {(void **)&t->values, (void **)&t->bitmap, (void **)&t->blockkeys, (void **)&t->rotation,
                     (void **)&t->codes, (void **)&t->qparams};
    const void *from[N] = {src->values, src->bitmap, src->blockkeys, src->rotation, src->codes, src->qparams};
    size_t elem[N] = {sizeof *t->values, 1, sizeof *t->blockkeys, sizeof *t->rotation, 1, sizeof *t->qparams};
    void *next[N] = {NULL};
    int64_t size[N];
    for (int k = 0; k < N; k++) {
        size[k] = lim[k] - (b[k] - a[k]) + add[k];
        int64_t cap = size[k] > 16 ? size[k] : 16;
        if (!(next[k] = mkv_alloc((size_t)cap, elem[k], "a mosaic array", err))) {
            for (int m = 0; m < k; m++)
                mkv_free(next[m]);
            return err ? err->code : MKV_ENOMEM;
        }
        char *dst = next[k];
        const char *old = *arr[k];   /* NULL where the array has no element */
        if (a[k])
            memcpy(dst, old, (size_t)a[k] * elem[k]);
        if (add[k])
            memcpy(dst + (size_t)a[k] * elem[k], from[k], (size_t)add[k] * elem[k]);
        if (lim[k] > b[k])
            memcpy(dst + (size_t)(a[k] + add[k]) * elem[k], old + (size_t)b[k] * elem[k],
                   (size_t)(lim[k] - b[k]) * elem[k]);
        s->cap[x][k] = cap;
    }
    for (int k = 0; k < N; k++) {
        mkv_free(*arr[k]);
        *arr[k] = next[k];
    }
    t->seg[i] = src->seg[0];
    t->seg[i].start = start;
    memcpy(t->loss + i * MKV_MOSAIC_LOSS_COLS, src->loss, MKV_MOSAIC_LOSS_COLS * sizeof *t->loss);
    return mkv_mosaic_layout(t, d, block, h->sink_n, h->T - h->recent_n, err);
}

/* Publish the finished segments, oldest first (a step boundary). */
static int publish(mosaic_state *s, int wait, mkv_error *err)
{
    while (s->n_pending > 0) {
        job *j = s->pending[0];
        if (wait)
            wait_job(j);
        else if (!atomic_load_explicit(&j->done, memory_order_acquire))
            break;
        if (j->rc) {
            *err = j->err;
            return mkv_error_prefix(err, "mosaic: finalising the segment at token %lld", (long long)j->start);
        }
        mkv_mosaic_head *h = &s->h;
        int64_t i = 0;
        while (i < h->k.nseg && h->k.seg[i].start != j->start)
            i++;
        int rc;
        if (i == h->k.nseg || j->out.k.nseg != 1)
            return mkv_fail(err, MKV_EFORMAT, "mosaic: no segment at token %lld to publish", (long long)j->start);
        if ((rc = splice(s, &h->k, 0, i, &j->out.k, j->start, err)) ||
            (rc = splice(s, &h->v, 1, i, &j->out.v, j->start, err)))
            return rc;
        s->stats.finalized++;
        s->stats.finalize_seconds += j->seconds;
        s->stats.manager_cpu_seconds += j->cpu_seconds;
        if (j->seconds > s->stats.finalize_seconds_max)
            s->stats.finalize_seconds_max = j->seconds;
        job_free(j);
        memmove(s->pending, s->pending + 1, (size_t)(s->n_pending - 1) * sizeof *s->pending);
        s->n_pending--;
    }
    return MKV_OK;
}

static int relayout(mosaic_state *s, mkv_error *err)
{
    mkv_mosaic_head *h = &s->h;
    int rc = mkv_mosaic_layout(&h->k, h->d, h->block, h->sink_n, h->T - h->recent_n, err);
    return rc ? rc : mkv_mosaic_layout(&h->v, h->d, 0, h->sink_n, h->T - h->recent_n, err);
}

/* Bytes of the temporary region: the segments waiting for the manager
 * and the open one, the last of the tables. */
static uint64_t temp_bytes(const mosaic_state *s)
{
    const mkv_mosaic_head *h = &s->h;
    int64_t n = s->n_pending + (s->open_len > 0);
    uint64_t b = 0;
    for (int x = 0; x < 2; x++) {
        const mkv_mosaic_tensor *t = x ? &h->v : &h->k;
        for (int64_t i = t->nseg - n; i < t->nseg; i++) {
            mkv_mosaic_bytes mb;
            mkv_mosaic_strategy_bytes(&t->seg[i], h->d, x ? 0 : h->block, &mb);
            b += mb.total;
        }
    }
    return b;
}

int mkv_mosaic_method_append(void *state, const float *k, const float *v, mkv_error *err)
{
    mosaic_state *s = state;
    mkv_mosaic_head *h = &s->h;
    int d = h->d, rc;
    if (!s->growing && (rc = set_template(s, err)))
        return rc;
    if ((rc = publish(s, 0, err)))
        return rc;
    /* the new token, in fp16, at the end of the dense rows */
    int64_t nd = h->sink_n + h->recent_n;
    float kr[MKV_MOSAIC_MAX_D], vr[MKV_MOSAIC_MAX_D];
    uint16_t kh[MKV_MOSAIC_MAX_D], vh[MKV_MOSAIC_MAX_D];
    for (int j = 0; j < d; j++) {
        if (!(fabsf(k[j]) <= 65504.0f) || !(fabsf(v[j]) <= 65504.0f))
            return mkv_fail(err, MKV_EFORMAT, "mosaic: a new key or value does not fit float16");
        kh[j] = mkv_f32_to_f16(k[j]);
        vh[j] = mkv_f32_to_f16(v[j]);
        kr[j] = mkv_f16_to_f32(kh[j]);
        vr[j] = mkv_f16_to_f32(vh[j]);
    }
    int leaves = s->have_template && h->recent_n >= s->cfg.recent && h->recent_n > 0;
    int direct = s->have_template && s->cfg.recent == 0;
    if (leaves || direct) {
        /* the oldest recent token (or the new one, without a window) enters the open segment */
        if (s->open_len == 0 && (rc = open_segment(s, h->T - h->recent_n, err)))
            return rc;
        int64_t oc = s->open_cap;
        if ((rc = grow((void **)&s->raw_k, &oc, s->open_len, s->open_len + 1, (size_t)d * sizeof(float), err)) ||
            (rc = grow((void **)&s->raw_v, &s->open_cap, s->open_len, s->open_len + 1, (size_t)d * sizeof(float),
                       err)))
            return rc;
        float *ok = s->raw_k + s->open_len * d, *ov = s->raw_v + s->open_len * d;
        if (direct) {
            memcpy(ok, kr, (size_t)d * sizeof *ok);
            memcpy(ov, vr, (size_t)d * sizeof *ov);
        } else {
            mkv_f16_to_f32_n(h->dense_k + h->sink_n * d, ok, (size_t)d);
            mkv_f16_to_f32_n(h->dense_v + h->sink_n * d, ov, (size_t)d);
        }
        s->open_len++;
        if (!direct) {
            memmove(h->dense_k + h->sink_n * d, h->dense_k + (h->sink_n + 1) * d,
                    (size_t)(h->recent_n - 1) * (size_t)d * sizeof *h->dense_k);
            memmove(h->dense_v + h->sink_n * d, h->dense_v + (h->sink_n + 1) * d,
                    (size_t)(h->recent_n - 1) * (size_t)d * sizeof *h->dense_v);
            memcpy(h->dense_k + (nd - 1) * d, kh, (size_t)d * sizeof *h->dense_k);
            memcpy(h->dense_v + (nd - 1) * d, vh, (size_t)d * sizeof *h->dense_v);
        }
        if ((rc = pack_token(s, 1, err)) || (rc = pack_token(s, 0, err)))
            return rc;
        if (s->mode != MKV_MOSAIC_MANAGER_OFF) {
            track_token(s, 0, s->raw_k + (s->open_len - 1) * d);
            track_token(s, 1, s->raw_v + (s->open_len - 1) * d);
        }
    } else {
        /* no template (or the window is not full yet): the dense window grows */
        if ((rc = grow((void **)&h->dense_k, &(int64_t){s->dense_cap}, nd, nd + 1, (size_t)d * sizeof *h->dense_k,
                       err)) ||
            (rc = grow((void **)&h->dense_v, &s->dense_cap, nd, nd + 1, (size_t)d * sizeof *h->dense_v, err)))
            return rc;
        memcpy(h->dense_k + nd * d, kh, (size_t)d * sizeof *h->dense_k);
        memcpy(h->dense_v + nd * d, vh, (size_t)d * sizeof *h->dense_v);
        h->recent_n++;
    }
    h->T++;
    if ((rc = relayout(s, err)))
        return rc;
    if (s->have_template && s->mode != MKV_MOSAIC_MANAGER_OFF && (s->open_len >= s->cfg.segment || loss_rose(s)) &&
        (rc = close_segment(s, err)))
        return rc;
    s->stats.temp_bytes = temp_bytes(s);
    if (s->stats.temp_bytes > s->stats.temp_bytes_peak)
        s->stats.temp_bytes_peak = s->stats.temp_bytes;
    s->stats.temp_tokens = 0;
    for (int i = 0; i < s->n_pending; i++)
        s->stats.temp_tokens += s->pending[i]->len;
    s->stats.temp_tokens += s->open_len;
    return MKV_OK;
}

int mkv_mosaic_method_flush(void *state, mkv_error *err)
{
    mosaic_state *s = state;
    int rc = publish(s, 1, err);
    s->stats.temp_bytes = temp_bytes(s);
    s->stats.temp_tokens = s->open_len;
    return rc;
}
