/* The human-readable reports of `mkv-analyze check` and `mkv-analyze info`
 * of a dump: the validator's problems of a raw dump (dump.h) one per
 * line, and the header, shapes and bytes of a raw or compressed dump
 * (cdump.h) as "key: value" lines. */
#ifndef MKV_IO_REPORT_H
#define MKV_IO_REPORT_H

#include <stdio.h>
#include "core/mkv.h"

/* Validate the dump at path (mkv_dump_validate) and print one
 * "LABEL: problem" line per problem to out, or "LABEL: ok" when there is
 * none and print_ok is set; LABEL is the path, "(stdin)" for "-" (the
 * name the library gives stdin in its messages). Returns the number of
 * problems, or -1 with err set when the file cannot be read. */
int mkv_dump_check_report(const char *path, int print_ok, FILE *out, mkv_error *err);

/* Print the header of the dump at path as "key: value" lines to out. A
 * raw dump: its shapes, its dense 16-bit K+V size and its bytes raw and
 * stored (with the deflate ratio). A compressed dump (cdump.h): its
 * method and parameters as recorded, the source it was made from, its
 * shape, and its logical and physical bytes with their ratio. */
int mkv_dump_info_report(const char *path, FILE *out, mkv_error *err);

#endif
