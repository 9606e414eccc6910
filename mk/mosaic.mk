## mosaic: MosaicKV dynamic 2-D compression (included by Makefile.am).
## The pieces (rotation, selection, packing, block keys, strategy search)
## and the methods "mosaic" and "uniform2d" built from them.
lib_libmosaickv_a_SOURCES += \
	lib/mosaic.h lib/mosaic.c \
	lib/method_mosaic.c lib/method_uniform2d.c

# End to end through mkv-compress/mkv-attend, every file checked by the
# h5py/numpy reference.
TESTS += tests/cli_mosaic.sh
EXTRA_DIST += tests/cli_mosaic.sh tests/mosaic_ref.py

if HAVE_CHECK
check_PROGRAMS += tests/check_mosaic
TESTS += tests/check_mosaic
tests_check_mosaic_SOURCES = tests/check_mosaic.c tests/testutil.h
tests_check_mosaic_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_mosaic_LDADD = $(CHECK_LDADD)
endif
