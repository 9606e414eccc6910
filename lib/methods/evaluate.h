/* Evaluation of a compressed dump against the raw dump it was made from:
 * every stored query is answered through the method interface over the
 * compressed cache and exactly over the raw cache, and each
 * (query, layer, query head) gets a row of fidelity metrics; the rows
 * aggregate into a one-line summary.
 *
 * Work is split over (layer, KV head): the calling thread reads a batch of
 * layers from the raw dump, workers load the method's state for one head,
 * answer every query with it and with exact attention, and fill their own
 * rows, so the result does not depend on the thread count.  A device hook
 * (mkv_eval_device) may answer all queries of a head at once instead of
 * the method's CPU attend, one head at a time; exact attention and the
 * metrics stay on the CPU threads.  With check_cpu the CPU attend runs as
 * well and each row records how far the hook's answer is from it. */
#ifndef MKV_EVALUATE_H
#define MKV_EVALUATE_H

#include <stdint.h>
#include <stdio.h>

#include "core/mkv.h"
#include "io/cdump.h"
#include "io/dump.h"
#include "methods/method.h"

#define MKV_EVAL_ROW_HEADER "query\tpos\tlayer\thead\tkv_head\trel_l2\trecall\ttokens\tbytes_read"
/* With check_cpu: the CPU reference's token count and how far the output
 * is from its output, ||o - o_cpu|| / ||o_cpu||. */
#define MKV_EVAL_CHECK_HEADER "\tcpu_tokens\tcpu_rel_diff"
#define MKV_EVAL_SUMMARY_HEADER                                                              \
    "method\tparams\tdevice\tratio\tlogical_bytes\tphysical_bytes\trows\trel_l2_mean\t"      \
    "rel_l2_median\trel_l2_p90\trel_l2_max\trecall_mean\ttokens_mean\tbytes_read_mean\t"     \
    "dense_bytes_mean"

/* The queries of one (layer, KV head), for a device hook (the GPU's:
 * mkv_gpu_method_attend of gpu/gpu_method.h). */
typedef struct {
    int G, d;
    int64_t T, W;
    const float *q;          /* [W][G][d] */
    const int64_t *pos;      /* [W] query positions */
} mkv_eval_queries;

typedef struct {
    float *out;              /* [W][G][d] */
    uint8_t *attended;       /* [W][T], zeroed by the caller */
    uint64_t *bytes_read;    /* [W], as the method's CPU attend counts them */
} mkv_eval_answers;

/* Answers every query of (layer, head) with method m over the arrays of c
 * (scale 1/sqrt(d)); called for one head at a time. */
typedef int (*mkv_eval_device)(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                               const mkv_eval_queries *q, mkv_eval_answers *a, mkv_error *err);

typedef struct {
    double rel_l2, recall;
    int64_t tokens;
    uint64_t bytes_read;
    int64_t cpu_tokens;      /* with check_cpu */
    double cpu_diff;
} mkv_eval_row;

typedef struct {
    const char *c_label;        /* the compressed dump as messages name it */
    const char *raw_path;       /* the reference dump */
    mkv_cdump *c;
    mkv_dump *raw;
    const mkv_method *method;
    mkv_params params;          /* as recorded, with the budget override */
    const mkv_cdump_meta *cm;
    const mkv_dump_meta *m;     /* of the raw dump */
    int32_t *query_pos;         /* [W] */
    mkv_eval_device device;     /* NULL: the method's CPU attend */
    const char *device_name;    /* the summary's device column: "cpu" unless set */
    int check_cpu;
} mkv_eval;

typedef struct {
    const char *compressed;     /* a compressed dump, "-" for stdin */
    const char *reference;      /* its raw dump; NULL: the source it records */
    const char *budget;         /* NULL, or the token budget replacing the recorded one */
    int check_cpu;
} mkv_eval_inputs;

/* Open both dumps, check that the raw one is the compressed one's source
 * (shape and query positions) and the method's parameters against it.
 * Messages name the options --reference and --budget.  On failure e is
 * left ready for mkv_eval_close. */
int mkv_eval_open(mkv_eval *e, const mkv_eval_inputs *in, mkv_error *err);
void mkv_eval_close(mkv_eval *e);

/* Rows in the dump's order [W][n_layers][n_heads]. */
int64_t mkv_eval_n_rows(const mkv_eval *e);
/* Fill rows (mkv_eval_n_rows of them) with threads CPU workers, showing
 * progress on stderr when it is a terminal. */
int mkv_eval_run(mkv_eval *e, int threads, mkv_eval_row *rows, mkv_error *err);

/* The rows as TSV under MKV_EVAL_ROW_HEADER (plus the check columns). */
void mkv_eval_print_rows(FILE *fp, const mkv_eval *e, const mkv_eval_row *rows);
/* The one-row summary under MKV_EVAL_SUMMARY_HEADER. */
int mkv_eval_print_summary(FILE *fp, const mkv_eval *e, const mkv_eval_row *rows, mkv_error *err);

#endif
