/* Building blocks every attention path shares: online softmax in double,
 * the token budget rule, and top-k selection. */
#ifndef MKV_ATTN_UTIL_H
#define MKV_ATTN_UTIL_H

#include <stdint.h>
#include "core/mkv.h"

/* Online softmax: running max m, sum l = sum exp(s - m), acc = sum exp(s - m) v.
 * Order-independent up to rounding; two partial states merge exactly. */
typedef struct {
    double m;
    double l;
    double *acc;   /* [d], caller-owned */
    int d;
} mkv_osm;

void mkv_osm_init(mkv_osm *s, double *acc, int d);
/* Add one token with score s and value v [d]. */
void mkv_osm_add(mkv_osm *s, double score, const float *v);
/* Add a token whose value is given sparsely: vals[i] at channel idx[i]. */
void mkv_osm_add_sparse(mkv_osm *s, double score, const float *vals, const int *idx, int n);
/* The first half of an add: rescale for score, count its weight in l and
 * return it; the caller then adds weight * v to acc itself (as
 * mkv_osm_add_sparse would, for several heads sharing one value). */
double mkv_osm_weigh(mkv_osm *s, double score);
/* a += b (flash-decoding merge of two splits). */
void mkv_osm_merge(mkv_osm *a, const mkv_osm *b);
/* out [d] = acc / l (zeros when nothing was added). */
void mkv_osm_finish(const mkv_osm *s, float *out);
/* log sum exp of the scores added (-inf when none were): with the output,
 * what a later merge with other tokens needs. */
double mkv_osm_lse(const mkv_osm *s);
/* A state holding one finished attention: output out [d] over tokens whose
 * log-sum-exp is lse; adding or merging more tokens then gives the
 * attention over both sets. */
void mkv_osm_from_output(mkv_osm *s, double *acc, int d, const float *out, double lse);

/* Token budget per decode step, in tokens, for a context of n tokens:
 * budget <= 1 is a fraction of n (rounded up), budget > 1 a count; the
 * result is clamped to 1..n. Sink and recent tokens count towards it. */
int64_t mkv_budget_tokens(double budget, int64_t n);

/* order [n] = the indices 0..n-1 by score, highest first (ties: lower
 * index first). 0, or -1 when out of memory. Thread-safe. */
int mkv_rank(const double *scores, int64_t n, int64_t *order);

/* Indices of the k largest scores of n (ties: lower index first), written
 * to idx[0..k) in ascending index order. k is clamped to n. Returns the
 * number written, or -1 when out of memory. Thread-safe. */
int64_t mkv_topk(const double *scores, int64_t n, int64_t k, int64_t *idx);

#endif
