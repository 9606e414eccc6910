## Models, tokenizers, forward pass: sources and tests (included by Makefile.am).
lib_libmosaickv_a_SOURCES += \
	lib/blas.h \
	lib/model.h lib/model.c lib/llama2c.c \
	lib/tokenizer.h lib/tokenizer.c lib/heap.h \
	lib/forward.h lib/forward.c \
	lib/sampler.h lib/sampler.c

EXTRA_DIST += tests/model_ref.py

if HAVE_CHECK
check_PROGRAMS += tests/check_model
TESTS += tests/check_model
tests_check_model_SOURCES = tests/check_model.c tests/testutil.h
tests_check_model_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_model_LDADD = $(CHECK_LDADD)
endif
