## gguf: sources and tests of one work area (included by Makefile.am).
## GGUF reading and the llama loader, GPT-2 byte-level BPE, the model fetch.
lib_libmosaickv_a_SOURCES += \
	lib/gguf.h lib/gguf.c \
	lib/bpe_gpt2.h lib/bpe_gpt2.c lib/bpe_gpt2_tables.h

EXTRA_DIST += tests/gguf_ref.py

if HAVE_CHECK
check_PROGRAMS += tests/check_gguf
TESTS += tests/check_gguf
tests_check_gguf_SOURCES = tests/check_gguf.c tests/testutil.h
tests_check_gguf_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_check_gguf_LDADD = $(CHECK_LDADD)
endif
