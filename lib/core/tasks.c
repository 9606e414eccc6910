#include "core/tasks.h"

#include "core/blas.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    mkv_task_fn fn;
    void *ctx;
    int n;
    pthread_mutex_t mu;
    int next, stop;   /* next task to take; a task failed: take no more */
    int *rc;          /* [n] */
    mkv_error *errs;  /* [n] */
} task_pool;

static void *task_worker(void *arg)
{
    task_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int t = p->stop || p->next >= p->n ? -1 : p->next++;
        pthread_mutex_unlock(&p->mu);
        if (t < 0)
            return NULL;
        mkv_error_clear(&p->errs[t]);
        p->rc[t] = p->fn(p->ctx, t, &p->errs[t]);
        if (p->rc[t]) {
            pthread_mutex_lock(&p->mu);
            p->stop = 1;
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Worker threads kept between calls: a decode step runs its layers'
 * attention as one call each, and a thread started and joined per call
 * (a stack mapped and unmapped) cost more than the work of a short one.
 * One call at a time uses them; a call made while they are busy (from a
 * task, or another thread) starts threads of its own. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int started;           /* workers running */
    int busy;              /* a call holds them */
    unsigned long gen;     /* bumped per call */
    task_pool *job;
    int want, joined;      /* workers the call wants, and those that took it */
    int running;           /* of those, still working */
} kept = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, NULL, 0, 0, 0};

static void *kept_worker(void *arg)
{
    (void)arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&kept.mu);
    for (;;) {
        while (kept.gen == seen)
            pthread_cond_wait(&kept.work, &kept.mu);
        seen = kept.gen;
        if (kept.joined >= kept.want)
            continue;
        kept.joined++;
        task_pool *p = kept.job;
        pthread_mutex_unlock(&kept.mu);
        task_worker(p);
        pthread_mutex_lock(&kept.mu);
        if (--kept.running == 0)
            pthread_cond_signal(&kept.done);
    }
    return NULL;
}

/* A forked child has none of the parent's threads. */
static void kept_reset_in_child(void)
{
    pthread_mutex_init(&kept.mu, NULL);
    pthread_cond_init(&kept.work, NULL);
    pthread_cond_init(&kept.done, NULL);
    kept.started = kept.busy = kept.want = kept.joined = kept.running = 0;
    kept.job = NULL;
}

static pthread_once_t kept_once = PTHREAD_ONCE_INIT;
static void kept_init(void) { pthread_atfork(NULL, NULL, kept_reset_in_child); }

/* Hand p to `workers` kept threads (started as needed); returns how many
 * took it, 0 when they are busy or none can start. */
static int kept_start(task_pool *p, int workers)
{
    pthread_once(&kept_once, kept_init);
    pthread_mutex_lock(&kept.mu);
    if (kept.busy) {
        pthread_mutex_unlock(&kept.mu);
        return 0;
    }
    while (kept.started < workers) {
        pthread_t tid;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int ok = pthread_create(&tid, &attr, kept_worker, NULL) == 0;
        pthread_attr_destroy(&attr);
        if (!ok)
            break;
        kept.started++;
    }
    if (workers > kept.started)
        workers = kept.started;
    if (workers > 0) {
        kept.busy = 1;
        kept.job = p;
        kept.want = kept.running = workers;
        kept.joined = 0;
        kept.gen++;
        pthread_cond_broadcast(&kept.work);
    }
    pthread_mutex_unlock(&kept.mu);
    return workers;
}

/* After the caller's own share: no worker takes the call from now on (the
 * tasks are taken), and those that took it finish. */
static void kept_finish(void)
{
    pthread_mutex_lock(&kept.mu);
    kept.running -= kept.want - kept.joined;
    kept.want = kept.joined;
    while (kept.running > 0)
        pthread_cond_wait(&kept.done, &kept.mu);
    kept.job = NULL;
    kept.busy = 0;
    pthread_mutex_unlock(&kept.mu);
}

static void task_body(void *arg) { task_worker(arg); }

/* mkv_run_tasks, on its own threads (on == NULL) or on those given. */
static int run_tasks(const mkv_task_threads *on, int n, int threads, mkv_task_fn fn, void *ctx, int *failed,
                     mkv_error *err)
{
    *failed = -1;
    if (n <= 0)
        return MKV_OK;
    task_pool p = {.fn = fn, .ctx = ctx, .n = n};
    p.rc = calloc((size_t)n, sizeof *p.rc);
    p.errs = calloc((size_t)n, sizeof *p.errs);
    if (!p.rc || !p.errs) {
        free(p.rc);
        free(p.errs);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for %d tasks", n);
    }
#ifdef HAVE_OPENBLAS
    /* The tasks are the parallelism: a BLAS call inside one runs on the
     * task's thread. OpenBLAS's own threads on top of ours would compete
     * for the same cores and spin (mosaic compression of data/sample.h5 on
     * 2 cores took 9 s instead of 6). */
    openblas_set_num_threads(1);
#endif
    pthread_mutex_init(&p.mu, NULL);
    if (on) {
        on->run(on->user, task_body, &p);
    } else {
        int workers = threads < n ? threads : n;
        int kept_workers = workers > 1 ? kept_start(&p, workers - 1) : 0;
        pthread_t *tids = workers > 1 && !kept_workers ? calloc((size_t)workers - 1, sizeof *tids) : NULL;
        int started = 0;
        if (tids)
            for (; started < workers - 1; started++)
                if (pthread_create(&tids[started], NULL, task_worker, &p) != 0)
                    break;   /* fewer threads: the caller does the rest */
        task_worker(&p);
        if (kept_workers)
            kept_finish();
        for (int i = 0; i < started; i++)
            pthread_join(tids[i], NULL);
        free(tids);
    }
    pthread_mutex_destroy(&p.mu);
    int rc = MKV_OK;
    for (int t = 0; t < n; t++)
        if (p.rc[t]) {
            *failed = t;
            *err = p.errs[t];
            if (!err->msg[0])
                mkv_fail(err, p.rc[t], "task %d failed without a message", t);
            rc = p.rc[t];
            break;
        }
    free(p.rc);
    free(p.errs);
    return rc;
}

int mkv_run_tasks(int n, int threads, mkv_task_fn fn, void *ctx, int *failed, mkv_error *err)
{
    return run_tasks(NULL, n, threads, fn, ctx, failed, err);
}

int mkv_run_tasks_on(const mkv_task_threads *threads, int n, mkv_task_fn fn, void *ctx, int *failed,
                     mkv_error *err)
{
    return run_tasks(threads, n, 0, fn, ctx, failed, err);
}
