/* The TSV tables of `mkv-analyze stats|overlap|segments|spectrum|sparsity|
 * channels` (columns in man/mkv-analyze.1): each is a mkv_table_analysis
 * (table.h) whose state is its settings struct below. A tool fills the
 * settings from its options and runs the table with
 * mkv_table_analysis_run(&mkv_NAME_table, &settings, path, err); the fields
 * after "set by begin" are the table's own and need not be initialised.
 * Each table lives beside its analysis, in lib/analysis/NAME.c. */
#ifndef MKV_ANALYSIS_TABLES_H
#define MKV_ANALYSIS_TABLES_H

#include <stdint.h>
#include <stdio.h>
#include "analysis/stats.h"
#include "analysis/table.h"

/* Most values a list setting (lengths, energies, fractions, shares) holds. */
#define MKV_TABLE_LIST_MAX 32

/* ---- stats: one row per layer, KV head and tensor */
typedef struct {
    double factor;              /* outlier threshold (MKV_OUTLIER_FACTOR_DEFAULT) */
    /* set by begin */
    mkv_tensor_stats acc;
} mkv_stats_settings;
extern const mkv_table_analysis mkv_stats_table;

/* ---- overlap: one row per layer, KV head, tensor, length and rotation */
typedef struct {
    double keep;                /* share of elements per vector, (0, 1] */
    int64_t lengths[MKV_TABLE_LIST_MAX];
    int n_lengths;              /* 0: 256, 1K, 4K, ... times 4 up to T (T if T < 256) */
    int prefix;                 /* only the first window of each length */
    /* set by begin */
    int m_keep;                 /* elements kept per vector */
    float *X;                   /* one head's vectors */
    double *ov;                 /* per-vector overlaps of the longest window */
} mkv_overlap_settings;
extern const mkv_table_analysis mkv_overlap_table;

/* ---- segments: one row per layer, KV head, tensor and segment */
typedef struct {
    int64_t S;                  /* tokens per segment */
    double factor;              /* outlier threshold in segment RMS */
    long top;                   /* channels for top_energy, 1..head_dim */
    /* set by begin */
    int64_t seg;                /* tokens per segment in this dump */
    float *X;                   /* one segment */
    int *channels;              /* its top channels */
} mkv_segments_settings;
extern const mkv_table_analysis mkv_segments_table;

/* ---- spectrum: one row per layer, KV head, tensor and segment (full: and
 * eigenvalue) */
typedef struct {
    int64_t S;                  /* tokens per segment, 0: the whole context */
    double energy[MKV_TABLE_LIST_MAX];
    int n_energy;
    int full;                   /* one row per eigenvalue */
    /* set by begin */
    int64_t seg;                /* tokens per segment in this dump */
    float *X;                   /* one segment */
    double *evals;              /* its eigenvalues */
} mkv_spectrum_settings;
extern const mkv_table_analysis mkv_spectrum_table;

/* ---- sparsity: one row per layer and query head */
typedef struct {
    double fractions[MKV_TABLE_LIST_MAX];
    int n_fractions;
    /* set by begin */
    int32_t *pos;               /* query positions */
    int64_t keys;               /* keys the latest query sees */
    float *K, *Q;               /* one head's keys, its query group */
    double *scratch;            /* attention weights */
    double *sums;               /* mean, min and mass per fraction */
} mkv_sparsity_settings;
extern const mkv_table_analysis mkv_sparsity_table;

/* ---- channels: one row per layer and KV head (full: and channel) */
typedef struct {
    long top;                   /* channels listed, 1..head_dim */
    double shares[MKV_TABLE_LIST_MAX];
    int n_shares;
    int full;                   /* one row per channel */
    /* set by begin */
    int64_t chunk;              /* keys read per call */
    float *K, *Q;               /* a chunk of keys, the query group */
    double *work;               /* q and k channel sums of squares, scores, top_share scratch */
    int *order;                 /* channel ranks */
} mkv_channels_settings;
extern const mkv_table_analysis mkv_channels_table;

/* ---- helpers the tables share (table.c) */

/* "25" for 0.25, "0.5" for 0.005: the percentage in column names. */
const char *mkv_table_percent(double share, char *buf, size_t size);
/* The end of a header line: a column PREFIX<percent> per share, then the
 * newline. */
void mkv_table_percent_columns(FILE *out, const char *prefix, const double *shares, int n);
/* Refuse a --top N above the dump's head_dim (MKV_EUSAGE). */
int mkv_table_check_top(long top, const mkv_dump_meta *m, mkv_error *err);

#endif
