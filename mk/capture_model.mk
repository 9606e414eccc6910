## capture_model: sources and tests of one work area (included by Makefile.am).
## mkv-capture MODEL / --shape: format detection, shape-only models, chat templates.
lib_libmosaickv_a_SOURCES += \
	lib/model_load.h lib/model_load.c \
	lib/shapes.h lib/shapes.c \
	lib/chat.h lib/chat.c

TESTS += tests/cli_capture_model.sh
EXTRA_DIST += tests/cli_capture_model.sh

if HAVE_CHECK
check_PROGRAMS += tests/check_capture
TESTS += tests/check_capture
tests_check_capture_SOURCES = tests/check_capture.c tests/testutil.h
tests_check_capture_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_capture_LDADD = $(CHECK_LDADD)
endif
