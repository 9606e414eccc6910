## analysis: sources and tests of one work area (included by Makefile.am).
## Importance-distribution analyses behind mkv-analyze overlap, segments,
## spectrum, sparsity and channels, and the symmetric eigensolver they share
## with the compressor.
lib_libmosaickv_a_SOURCES += \
	lib/eigen.h lib/eigen.c \
	lib/analysis.h lib/analysis.c \
	lib/overlap.c lib/segments.c lib/spectrum.c lib/sparsity.c lib/channels.c

# The numpy reference of every analysis, run by tests/cli_analysis.sh.
TESTS += tests/cli_analysis.sh
EXTRA_DIST += tests/cli_analysis.sh tests/analysis_ref.py

if HAVE_CHECK
check_PROGRAMS += tests/check_analysis
TESTS += tests/check_analysis
tests_check_analysis_SOURCES = tests/check_analysis.c tests/testutil.h
tests_check_analysis_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_analysis_LDADD = $(CHECK_LDADD)
endif
