## gpu_packed: packed MosaicKV attention, GPU encode and batched rotations on
## the GPU; the host-side conversion of loaded heads into the GPU layout and
## the per-method GPU drivers of mkv-attend --device gpu; their tests
## (included by Makefile.am, after mk/gpu.mk: kernels/bench.cu uses the
## packed kernels).
lib_libmosaickv_a_SOURCES += lib/gpu_packed.h lib/gpu_packed.c
if HAVE_CUDA
lib_libmosaickv_a_SOURCES += kernels/attn_packed.cuh kernels/attn_packed.cu kernels/encode.cu
endif

# mkv-attend --device gpu against --device cpu on data/sample.h5 (skips
# without a GPU).
TESTS += tests/gpu_attend_cli.sh
EXTRA_DIST += tests/gpu_attend_cli.sh

if HAVE_CHECK
check_PROGRAMS += tests/check_gpu_packed
TESTS += tests/check_gpu_packed
tests_check_gpu_packed_SOURCES = tests/check_gpu_packed.c tests/gpu_testutil.h
tests_check_gpu_packed_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_gpu_packed_LDADD = $(CHECK_LDADD)
endif
