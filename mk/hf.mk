## hf: sources and tests of one work area (included by Makefile.am).
## Hugging Face model directories (config.json + safetensors) and tokenizer.json.
lib_libmosaickv_a_SOURCES += \
	lib/hf.h lib/hf.c \
	lib/tokenizer_json.h lib/tokenizer_json.c

if HAVE_CHECK
check_PROGRAMS += tests/check_hf
TESTS += tests/check_hf
tests_check_hf_SOURCES = tests/check_hf.c tests/testutil.h
tests_check_hf_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_hf_LDADD = $(CHECK_LDADD)
endif
