## compress: compressed dumps, methods, mkv-compress, mkv-attend (included by Makefile.am).
lib_libmosaickv_a_SOURCES += \
	lib/cdump.h lib/cdump.c \
	lib/method.h lib/method.c lib/params.c lib/methods_registry.c \
	lib/method_full.c \
	lib/metrics.h lib/metrics.c

bin_PROGRAMS += tools/mkv-compress tools/mkv-attend
tools_mkv_compress_SOURCES = tools/mkv-compress.c
tools_mkv_attend_SOURCES = tools/mkv-attend.c

dist_man_MANS += man/mkv-compress.1 man/mkv-attend.1

TESTS += tests/cli_compress.sh
EXTRA_DIST += tests/cli_compress.sh tests/cdump_h5py.py

if HAVE_CHECK
check_PROGRAMS += tests/check_cdump tests/check_methods
TESTS += tests/check_cdump tests/check_methods
tests_check_cdump_SOURCES = tests/check_cdump.c tests/testutil.h
tests_check_cdump_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_cdump_LDADD = $(CHECK_LDADD)
tests_check_methods_SOURCES = tests/check_methods.c tests/testutil.h
tests_check_methods_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_methods_LDADD = $(CHECK_LDADD)
endif
