/* What the GPU test programs (check_gpu, check_gpu_attn, check_gpu_packed,
 * check_gpu_methods) share: whether to skip, and the run.  Without CUDA or
 * without a GPU the program checks that the entry points fail cleanly,
 * then skips (77). */
#ifndef MKV_GPU_TESTUTIL_H
#define MKV_GPU_TESTUTIL_H

#include <check.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/mkv.h"
#include "mkv_cuda.h"

/* Calls a program's entry points where they cannot work and returns 0
 * when each failed with `want` and a message and wrote no result. */
typedef int (*gpu_test_failure_check)(mkv_status want);

/* The reason to skip, or NULL when GPU 0 is usable (the tests run on the
 * current device, GPU 0 unless CUDA_VISIBLE_DEVICES says otherwise).
 * Exits 1 when the entry points misbehave without a GPU. */
static inline const char *gpu_test_skip_reason(const char *prog, gpu_test_failure_check clean_failure, char *buf,
                                               size_t len)
{
    mkv_gpu_info info[1];
    mkv_error err = {0};
    int count = -1;
    if (mkv_cuda_devices(info, 1, &count, &err) != MKV_OK) {
        fprintf(stderr, "%s: FAIL: device query: %s\n", prog, err.msg);
        exit(1);
    }
    if (!mkv_cuda_built()) {
        if (count != 0 || strcmp(mkv_cuda_build_info(), "no CUDA") != 0 || clean_failure(MKV_EUNSUP) != 0) {
            fprintf(stderr, "%s: FAIL: the no-CUDA entry points misbehave\n", prog);
            exit(1);
        }
        return "built without CUDA";
    }
    if (count == 0) {
        if (clean_failure(MKV_EGPU) != 0)
            exit(1);
        return "no GPU (the CUDA runtime sees none)";
    }
    if (!info[0].usable) {
        snprintf(buf, len, "GPU 0 '%s' (compute capability %d.%d) is not a target of this build (%s)", info[0].name,
                 info[0].cc_major, info[0].cc_minor, mkv_cuda_build_info());
        return buf;
    }
    return NULL;
}

/* The run's seed: MKV_TEST_SEED when set (to repeat a run), else a fresh
 * one; printed first so that a failure can be repeated. */
static inline uint64_t gpu_test_seed(const char *prog)
{
    const char *env = getenv("MKV_TEST_SEED");
    const uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("%s: seed %" PRIu64 " (MKV_TEST_SEED=%" PRIu64 " repeats this run)\n", prog, seed, seed);
    fflush(stdout);
    return seed;
}

/* MKV_TEST_QUICK=1: the long cases left out (for compute-sanitizer). */
static inline int gpu_test_quick(void)
{
    const char *env = getenv("MKV_TEST_QUICK");
    return env != NULL && atoi(env) > 0;
}

/* A GPU test program's main: skip (77) with the reason on stdout, or run
 * the suite in this process (CK_NOFORK: one CUDA context per process). */
static inline int gpu_test_main(const char *prog, Suite *(*make_suite)(void), gpu_test_failure_check clean_failure)
{
    char buf[512];
    const char *why = gpu_test_skip_reason(prog, clean_failure, buf, sizeof buf);
    if (why != NULL) {
        printf("%s: SKIP: %s\n", prog, why);
        return 77;
    }
    SRunner *sr = srunner_create(make_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

#endif
