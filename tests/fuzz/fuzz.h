/* What the fuzz harnesses share (tests/fuzz/README).
 *
 * A harness is one C file defining the libFuzzer entry point
 * LLVMFuzzerTestOneInput for one parser of the library. It is linked either
 * with tests/fuzz/driver.c (a main() that runs it over corpus files and a
 * small deterministic mutator; built by `make check`) or with libFuzzer
 * (clang -fsanitize=fuzzer; scripts/fuzz). Parsers that take a path get
 * the input written to a file of the process's own scratch directory.
 *
 * A harness returns 0 for every input the parser refuses with an error;
 * what it treats as a bug it reports with fuzz_bug, which aborts, so that
 * the engine (or the driver) records the input as a crash: a refusal
 * without a one-line message, a file that validates but cannot be read,
 * HDF5 objects left open. */
#ifndef MKV_FUZZ_H
#define MKV_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"
#include "methods/method.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* util.c: the library logs errors only. */
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Write data to NAME in the scratch directory (made at the first call,
 * removed at exit) and return its path, valid until the next call with the
 * same NAME. NAME may hold one '/' (a subdirectory, made as needed). */
const char *fuzz_file(const char *name, const void *data, size_t size);
/* The path of NAME in the scratch directory (a subdirectory is made). */
const char *fuzz_path(const char *name);

/* Report a bug: print "fuzz: BUG: ..." on stderr and abort. */
void fuzz_bug(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* A refusal must carry its status and a one-line message. With
 * MKV_FUZZ_VERBOSE set in the environment the message is printed (to see
 * which seeds a parser takes). */
void fuzz_check_refusal(int rc, const mkv_error *err, const char *call);

/* Encode fixed texts with t (plain, with special tokens, with BOS and
 * EOS) and decode the ids: encoding may refuse, but only with a message;
 * every id it gives lies in the vocabulary and decodes. */
struct mkv_tokenizer;
void fuzz_tokenizer_roundtrip(const struct mkv_tokenizer *t);

/* Load (layer, head) of c with method m and parameters p, as mkv-attend
 * does, and answer the query q [G][d] at each of the positions: load and
 * attend may refuse, with a message. */
void fuzz_load_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                      const float *q, const int64_t *positions, int n_positions);

#endif
