## baselines: Quest, ThinK, KIVI, SnapKV, StreamingLLM, naive 2-D (included by Makefile.am).
lib_libmosaickv_a_SOURCES += \
	lib/baseline_util.h lib/baseline_util.c \
	lib/method_quest.c lib/method_think.c lib/method_kivi.c \
	lib/method_snapkv.c lib/method_streaming.c lib/method_naive2d.c

if HAVE_CHECK
check_PROGRAMS += tests/check_baselines
TESTS += tests/check_baselines
tests_check_baselines_SOURCES = tests/check_baselines.c tests/testutil.h
tests_check_baselines_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_baselines_LDADD = $(CHECK_LDADD)
endif
