/* Per-head token budgets under one mean budget. Heads differ widely in how
 * concentrated their attention is: some need a large share of the context
 * to reproduce their output, most need few tokens. A method that selects
 * tokens per step can take a budget per (layer, KV head), planned from the
 * observation queries of every head at once:
 *
 *   error curve of a head: for f = 1/P, 2/P, ..., 1 (P =
 *     MKV_HEAD_BUDGET_POINTS), the relative L2 error of the attention
 *     output over k = ceil(f (p+1)) tokens against the exact output, for
 *     a query at position p: the `sink` first and `recent` last tokens
 *     (always attended, as the methods attend them) and the others of the
 *     largest exact weight up to k in all; averaged over the G query heads
 *     and the observation positions (exact attention in double);
 *   allocation: every head starts at the floor, then, round by round, the
 *     head and the run of j steps of 1/P whose error falls most per step
 *     (ties: the lower head, then the shorter run) takes those steps, until
 *     the budgets average `mean` over the heads (rounded to a whole number
 *     of steps in all). Runs cross flat stretches of a curve (budgets the
 *     always-attended tokens fill alone) that single steps would never
 *     cross.
 *
 * The selection a method makes per step is coarser than the exact top
 * tokens (blocks, bounds on scores), so the curves rank heads rather than
 * predict their error. The budgets are fractions of p + 1 like a method's
 * own `budget`. */
#ifndef MKV_HEAD_BUDGET_H
#define MKV_HEAD_BUDGET_H

#include "core/mkv.h"
#include "methods/method.h"

#define MKV_HEAD_BUDGET_POINTS 200

/* The error curve [MKV_HEAD_BUDGET_POINTS] of head `in` from its
 * observation queries (in->W > 0). */
int mkv_head_error_curve(const mkv_head_kv *in, int64_t sink, int64_t recent, double *curve, mkv_error *err);

/* Budgets [nheads] from the curves [nheads][MKV_HEAD_BUDGET_POINTS]: at
 * least floor_frac each (rounded up to a step, at least one step), their
 * mean `mean` (0 < mean <= 1) unless the floors alone exceed it. */
int mkv_allocate_head_budgets(const double *curves, int nheads, double mean, double floor_frac, double *budget,
                              mkv_error *err);

#endif
