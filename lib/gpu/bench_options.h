/* The methods and parameters of the GPU attention benchmark
 * (mkv_bench_attention, kernels/mkv_cuda.h) as the command line spells
 * them: the registry's method names and the registry's parameter specs,
 * with the benchmark's own defaults. */
#ifndef MKV_BENCH_OPTIONS_H
#define MKV_BENCH_OPTIONS_H

#include "core/mkv.h"
#include "methods/method.h"
#include "mkv_cuda.h"

/* keep, keydim, segment, block (mosaic); page, sink, recent (quest; sink
 * and recent apply to mosaic's caches as well). */
#define MKV_BENCH_N_PARAMS 7

typedef struct {
    mkv_param_spec specs[MKV_BENCH_N_PARAMS + 1];
    char defaults[MKV_BENCH_N_PARAMS][32];
    mkv_params params;          /* set with mkv_params_parse_list */
} mkv_bench_params;

/* A list "full,quest,mosaic" into MKV_BENCH_* bits; MKV_EUSAGE with a
 * message "invalid value 'LIST' for --methods: ..." naming the new name of
 * a former one (dense, packed, dense-variant). */
int mkv_bench_parse_methods(const char *list, unsigned *bits, mkv_error *err);

/* The parameters with the registry's specs and o's values as defaults. */
int mkv_bench_params_init(mkv_bench_params *bp, const mkv_bench_opts *o, mkv_error *err);
/* Into o, refusing (MKV_EUSAGE) what the benchmark's caches cannot take. */
int mkv_bench_params_apply(const mkv_bench_params *bp, mkv_bench_opts *o, mkv_error *err);

#endif
