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

int mkv_run_tasks(int n, int threads, mkv_task_fn fn, void *ctx, int *failed, mkv_error *err)
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
    int workers = threads < n ? threads : n;
    pthread_t *tids = workers > 1 ? calloc((size_t)workers - 1, sizeof *tids) : NULL;
    int started = 0;
    if (tids)
        for (; started < workers - 1; started++)
            if (pthread_create(&tids[started], NULL, task_worker, &p) != 0)
                break;   /* fewer threads: the caller does the rest */
    task_worker(&p);
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    free(tids);
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
