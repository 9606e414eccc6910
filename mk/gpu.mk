## gpu: decode-attention kernels (dense flash-decoding, Quest-style selection),
## device buffers for C callers, the attention benchmark; their GPU test and
## the benchmark driver (included by Makefile.am).
if HAVE_CUDA
lib_libmosaickv_a_SOURCES += kernels/attn_core.cuh kernels/devmem.cu kernels/attn_dense.cu \
	kernels/attn_quest.cu kernels/bench.cu
endif

if HAVE_CHECK
# bench_attention is a driver for scripts/bench-gpu, built with the tests
# and not run by make check.
check_PROGRAMS += tests/check_gpu_attn tests/bench_attention
TESTS += tests/check_gpu_attn
tests_check_gpu_attn_SOURCES = tests/check_gpu_attn.c tests/gpu_testutil.h
tests_check_gpu_attn_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_gpu_attn_LDADD = $(CHECK_LDADD)
tests_bench_attention_SOURCES = tests/bench_attention.c
endif
