/* One loop for the analyses that print a table over a dump: open it, visit
 * every layer x KV head (x tensor k, v), let the analysis print its rows,
 * and print the table to stdout only when every visit succeeded, so that an error in
 * the last head never leaves a partial table behind. */
#ifndef MKV_ANALYSIS_TABLE_H
#define MKV_ANALYSIS_TABLE_H

#include <stdio.h>
#include "io/dump.h"
#include "core/mkv.h"

typedef struct {
    const char *label;   /* of the progress bar */
    int per_tensor;      /* 1: visit k and v of each KV head; 0: each KV head once */
    /* Check the settings against the dump, allocate, print the header line
     * to out. */
    int (*begin)(void *ctx, mkv_dump *d, FILE *out, mkv_error *err);
    /* Print the rows of one layer, KV head and tensor ('k' or 'v'; 0 when
     * per_tensor is 0). */
    int (*rows)(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out, mkv_error *err);
    /* Free what begin allocated (called whatever happened, begin too). */
    void (*end)(void *ctx);
} mkv_table_analysis;

/* Run analysis a with state ctx over the dump at path and print its table
 * to stdout. */
int mkv_table_analysis_run(const mkv_table_analysis *a, void *ctx, const char *path, mkv_error *err);

#endif
