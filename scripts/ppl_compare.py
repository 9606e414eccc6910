#!/usr/bin/env python3
"""Paired comparison of perplexity runs over the same scored tokens.

  python3 scripts/ppl_compare.py A.tsv [B.tsv ...]

Each file is what `mkv-decode --ppl ... --per-token FILE` wrote: one row per
scored token with its log-probability under the run's method and under the
full cache of the same prefill.  Runs of the same model over the same text,
contexts and scored tokens have the same full-cache log-probabilities; the
files are refused otherwise.

For each context and each run the table gives the perplexity increase over
the full cache with a 95% interval, and for each run after the first the
difference from the first (B - A, in percent of A's perplexity) with its
95% interval: the per-token differences of log-probability are paired, so
their standard error is far smaller than either run's.  Tokens are taken as
independent (the interval is a normal approximation); consecutive tokens of
a text are not quite, so read an interval that barely excludes zero with
care.  An interval that contains zero says the runs are not told apart by
this many tokens.
"""
import csv
import math
import sys

COLUMNS = ("context", "position", "target", "logprob", "logprob_full")
Z95 = 1.959963984540054


def fail(msg):
    sys.stderr.write("ppl_compare.py: %s\n" % msg)
    sys.exit(1)


def read_run(path):
    """{context: [(position, target, logprob, logprob_full)]} of one file."""
    try:
        fp = open(path, newline="")
    except OSError as e:
        fail("cannot open '%s': %s" % (path, e.strerror))
    with fp:
        rows = csv.DictReader(fp, delimiter="\t")
        missing = [c for c in COLUMNS if c not in (rows.fieldnames or [])]
        if missing:
            fail("'%s' is not a --per-token table (no column %s)" % (path, missing[0]))
        run = {}
        for line, r in enumerate(rows, start=2):
            try:
                key = (int(r["position"]), int(r["target"]))
                lp, lp_full = float(r["logprob"]), float(r["logprob_full"])
                context = int(r["context"])
            except (TypeError, ValueError):
                fail("'%s' line %d: not a row of numbers" % (path, line))
            if not (math.isfinite(lp) and math.isfinite(lp_full)):
                fail("'%s' line %d: no finite log-probabilities (a run with --no-reference?)" % (path, line))
            run.setdefault(context, []).append(key + (lp, lp_full))
    if not run:
        fail("'%s' has no scored tokens" % path)
    return run


def mean_se(x):
    n = len(x)
    m = sum(x) / n
    if n < 2:
        return m, float("nan")
    return m, math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1) / n)


def pct(nats):
    return 100.0 * math.expm1(nats)


def interval(m, se):
    return "%+.2f%% [%+.2f, %+.2f]" % (pct(m), pct(m - Z95 * se), pct(m + Z95 * se))


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(__doc__)
        return 0
    if not argv:
        sys.stderr.write("usage: python3 scripts/ppl_compare.py A.tsv [B.tsv ...] (--help for more)\n")
        return 2
    runs = [read_run(p) for p in argv]
    first = runs[0]
    for path, run in zip(argv[1:], runs[1:]):
        if sorted(run) != sorted(first):
            fail("'%s' and '%s' score different contexts" % (argv[0], path))
        for c in first:
            a, b = first[c], run[c]
            if [t[:2] for t in a] != [t[:2] for t in b]:
                fail("'%s' and '%s' score different tokens at context %d" % (argv[0], path, c))
            # the same full cache: equal up to the 9 digits the files hold
            if any(abs(x[3] - y[3]) > 1e-6 * max(1.0, abs(x[3])) for x, y in zip(a, b)):
                fail("'%s' and '%s' have different full-cache log-probabilities at context %d "
                     "(another model or text?)" % (argv[0], path, c))
    print("context\tscored\trun\tincrease over full, 95%\tdifference from the first, 95%")
    for c in sorted(first):
        n = len(first[c])
        for i, (path, run) in enumerate(zip(argv, runs)):
            m, se = mean_se([t[3] - t[2] for t in run[c]])
            inc = interval(m, se)
            if i == 0:
                diff = "-"
            else:
                dm, dse = mean_se([x[2] - y[2] for x, y in zip(first[c], run[c])])
                diff = interval(dm, dse)
            print("%d\t%d\t%s\t%s\t%s" % (c, n, path, inc, diff))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
