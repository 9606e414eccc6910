/* mkv_bench_attention in a build without nvcc, linked like kernels/bench.cu
 * into the programs that benchmark only. */
#include "mkv_cuda.h"

int mkv_bench_attention(const mkv_bench_opts *o, FILE *tsv, FILE *log, mkv_error *err)
{
    (void)o; (void)tsv; (void)log;
    return mkv_fail(err, MKV_EUNSUP, "GPU benchmark: built without CUDA");
}
