/* Independent tasks over a few threads: what the tools do per (layer, KV
 * head). */
#ifndef MKV_TASKS_H
#define MKV_TASKS_H

#include "core/mkv.h"

/* One task; a failure returns its status with err filled. */
typedef int (*mkv_task_fn)(void *ctx, int task, mkv_error *err);

/* Run fn(ctx, i, ...) for every i in [0, n) on up to `threads` threads, the
 * calling one included (fewer when a thread cannot be created).  Once a
 * task fails no further task starts.  Returns MKV_OK, or the status of the
 * failed task with the lowest index; *failed gets that index and *err its
 * error (a task that failed without a message gets a generic one).
 * With OpenBLAS this sets OpenBLAS to one thread (process-wide): the tasks
 * divide the work among their own threads. */
int mkv_run_tasks(int n, int threads, mkv_task_fn fn, void *ctx, int *failed, mkv_error *err);

/* Threads that someone else keeps (the forward pass's, idle while it calls
 * a hook): run(user, body, arg) calls body(arg) on each of them, the
 * calling thread included, and returns once every call has returned. */
typedef struct {
    void (*run)(void *user, void (*body)(void *arg), void *arg);
    void *user;
} mkv_task_threads;

/* mkv_run_tasks on those threads: the same tasks, taken in index order,
 * the same rule on failure and the same result. */
int mkv_run_tasks_on(const mkv_task_threads *threads, int n, mkv_task_fn fn, void *ctx, int *failed,
                     mkv_error *err);

#endif
