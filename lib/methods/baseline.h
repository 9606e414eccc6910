/* Pieces the baseline methods share (lib/methods/quest.c, think.c,
 * kivi.c, snapkv.c, streaming.c, naive2d.c, turboquant.c, cam.c):
 * parameter checks worded alike, the Quest page score, the observation
 * attention that scores tokens (SnapKV, CaM) and
 * the token-selection rule every selecting method follows, KIVI's
 * asymmetric quantizer, the packing of codes of 1 to 8 bits, and the
 * growth of stored arrays by decode-time appends.
 *
 * Token selection (Quest, naive 2-D), the same for every method that selects
 * tokens so that comparisons are fair:
 *   - a query at position p attends only tokens 0..p;
 *   - the first `sink` tokens and the `recent` last tokens of the cache
 *     (t >= T - recent) are always attended when <= p;
 *   - the step's budget is mkv_budget_tokens(budget, p + 1) tokens (a
 *     fraction <= 1 of p + 1, or a count > 1) and counts sink and recent;
 *   - pages whose first token is <= p are ranked by score (descending, ties
 *     to the lower page) and added whole, tokens > p left out, until the
 *     attended count reaches the budget (so it may pass it by less than one
 *     page; sink and recent alone may pass it too);
 *   - the G query heads of a KV head share one selection: their page scores
 *     are aggregated with max (or sum).
 * The page holding p may also hold tokens > p (an offline dump keeps the
 * whole cache): its metadata covers them, which only loosens its bound. */
#ifndef MKV_METHODS_BASELINE_H
#define MKV_METHODS_BASELINE_H

#include <stddef.h>
#include <stdint.h>
#include "io/cdump.h"
#include "methods/method.h"
#include "core/mkv.h"

/* ---- parameter checks: MKV_EUSAGE with a message naming the parameter ---- */

/* A token budget for n tokens: a fraction in (0, 1] or a whole count in
 * (1, n]. */
int mkv_bl_check_budget(const char *name, double v, int64_t n, mkv_error *err);
/* MKV_EFORMAT when the dump holds no queries. */
int mkv_bl_need_queries(const char *method, int64_t W, mkv_error *err);
/* MKV_EFORMAT when a value would not fit fp16 (|x| > 65504). */
int mkv_bl_check_f16_range(const float *x, size_t n, const char *what, int layer, int head,
                           mkv_error *err);
/* A query fits the loaded cache: G and d match (MKV_EFORMAT), 0 <= pos < T
 * (MKV_EUSAGE). */
int mkv_bl_check_query(const mkv_attend_query *q, int64_t T, int d, int G, mkv_error *err);

/* ---- Quest page metadata, scoring and token selection ---- */

/* Number of pages of `page` tokens covering T tokens. */
int64_t mkv_bl_pages(int64_t T, int page);
/* Elementwise min and max of each page of x [T][n] into mn, mx [pages][n]. */
void mkv_bl_page_minmax(const float *x, int64_t T, int n, int page, float *mn, float *mx);
/* Quest's bound on q.k for every k with mn <= k <= mx elementwise:
 * sum_i max(q_i mn_i, q_i mx_i), in double. */
double mkv_bl_page_score(const float *q, const float *mn, const float *mx, int n);

typedef struct {
    int64_t sink, recent;
    int page;
    double budget;
    int agg_sum;           /* 0: max over the G heads, 1: sum */
} mkv_bl_selection;

/* Warn (stderr) when the budget (parameter "budget") at the end of a
 * context of T tokens is below the sink and recent tokens always attended
 * (parameters "sink" and "recent"): it cannot be honoured. */
void mkv_bl_warn_budget(const char *method, const mkv_params *p, int64_t T);
/* Read the selection parameters page, budget, sink, recent, agg. */
void mkv_bl_selection_from(const mkv_params *p, mkv_bl_selection *s);
/* Check them against a context of T tokens (MKV_EUSAGE). */
int mkv_bl_check_selection(const mkv_params *p, int64_t T, mkv_error *err);

/* Page scores for a step at position p: score[i] for the pages whose first
 * token is <= p (returned count), aggregated over the G queries q [G][n]. */
int64_t mkv_bl_score_pages(const mkv_bl_selection *s, const float *q, int G, int n,
                           const float *mn, const float *mx, int64_t p, double *score);
/* Mark the tokens the step attends in attended [T] (zeroed by the caller)
 * following the rule above; returns their number, or -1 (MKV_ENOMEM). */
int64_t mkv_bl_select(const mkv_bl_selection *s, const double *score, int64_t T, int64_t p,
                      uint8_t *attended, mkv_error *err);

/* ---- KIVI: asymmetric round-to-nearest quantization, packed codes ---- */

/* fp16 scale and zero for values in [mn, mx] with 2^bits levels, chosen so
 * that zero <= mn and zero + (2^bits - 1) scale >= mx: every value then
 * dequantizes within scale / 2. */
void mkv_bl_quant_range(float mn, float mx, int bits, float *scale, float *zero);
unsigned mkv_bl_quant_code(float x, float scale, float zero, int bits);
/* Bytes holding n codes of `bits` (1..8) bits: ceil(n bits / 8). */
size_t mkv_bl_packed_bytes(size_t n, int bits);
/* Codes form one little-endian bit stream: code i holds bits i*bits to
 * i*bits + bits - 1, bit k of the stream being bit k mod 8 of byte k / 8
 * (so with 2 or 4 bits, 8/bits codes to a byte, the first in the low bits;
 * with 3 bits a code may straddle two bytes). out must hold
 * mkv_bl_packed_bytes(n, bits). */
void mkv_bl_pack(const uint8_t *codes, size_t n, int bits, uint8_t *out);
unsigned mkv_bl_unpack(const uint8_t *packed, size_t i, int bits);

/* ---- decode-time growth (mkv_method.append) ---- */

/* p (mkv_alloc'd, *cap elements of elem bytes, the first `used` kept) made
 * to hold at least need elements, growing by an eighth (at least 16): p
 * itself when it does, else a new buffer (p freed, *cap updated), or NULL
 * (MKV_ENOMEM; p untouched). */
void *mkv_bl_grow(void *p, int64_t *cap, int64_t used, int64_t need, size_t elem, mkv_error *err);
/* The same for rows of n floats. */
int mkv_bl_grow_rows(float **rows, int64_t *cap, int64_t used, int64_t need, int n, mkv_error *err);
/* x [n] rounded to float16 (as stored) into out [n] (out may be x);
 * MKV_EFORMAT naming what when a value does not fit float16. */
int mkv_bl_round_f16(const float *x, int n, float *out, const char *what, mkv_error *err);
/* Store a new row at row `row` of *rows (grown, rows of n floats): x [n]
 * (or x[idx[j]] for j < n, the channels kept, when idx is given) rounded
 * to float16. */
int mkv_bl_append_row(float **rows, int64_t *cap, int64_t row, const float *x, const int *idx, int n,
                      const char *what, mkv_error *err);
/* Fold the stored key x [n] of token t (t = the tokens held before it)
 * into the page metadata mn, mx [*pages][n] (*cap pages allocated, grown):
 * it widens the minimum and maximum of page t / page, or opens that page. */
int mkv_bl_page_append(float **mn, float **mx, int64_t *cap, int64_t *pages, int64_t t, int page,
                       const float *x, int n, mkv_error *err);

/* ---- attention ---- */

/* Dot product of q and k over n channels, in double. */
double mkv_bl_dot(const float *q, const float *k, int n);
/* Dot product of q restricted to channels idx[0..n) with the packed k [n]. */
double mkv_bl_dot_idx(const float *q, const int *idx, const float *k, int n);
/* Observation attention (SnapKV's and CaM's token score): score[t] for
 * t < n (zeroed here) = the sum over the G query heads and the last wq
 * queries of the dump of softmax_{0..p}(q.k / sqrt(d))_t, p the query's
 * position, over the full-precision keys; MKV_EFORMAT for a position
 * outside the cache. */
int mkv_bl_observe(const mkv_head_kv *in, int64_t wq, int64_t n, double *score, mkv_error *err);
/* Attention of the q->G heads over rows [0, n) of k, v [n][q->d] (only the
 * rows with mask[r] != 0 when mask is given), scores q.k scale, an exact
 * softmax in double (two passes); r->out [G][d] and r->lse when asked for. */
int mkv_bl_attend_rows(const mkv_attend_query *q, const float *k, const float *v, int64_t n,
                       const uint8_t *mask, mkv_attend_result *r, mkv_error *err);
/* The same over rows held as fp16 (the stored bit patterns), each read as
 * floats: the same result as mkv_bl_attend_rows over their float values. */
int mkv_bl_attend_rows_f16(const mkv_attend_query *q, const uint16_t *k, const uint16_t *v, int64_t n,
                           const uint8_t *mask, mkv_attend_result *r, mkv_error *err);
/* Channels of `keep` kept out of d: ceil(keep d) clamped to 1..d. */
int mkv_bl_kept_channels(double keep, int d);
/* Indices of the k largest of score [n] (ties: lower index), ascending. */
int mkv_bl_top_channels(const double *score, int n, int k, int *idx, mkv_error *err);

#endif
