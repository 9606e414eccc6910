#!/usr/bin/env python3
"""Where a kernel's warps wait, by how often the code runs.

Reads the CSV that
    ncu --section WarpStateStats --section SourceCounters \
        --page source --print-source sass --csv ...
writes (one table per profiled kernel: SASS address, source, warp-stall
samples, instructions executed, stall reasons) and prints, per kernel:
the stall reasons' shares of all samples, the samples grouped by each
instruction's execution count (code run once per block, per tile, per
copy piece ... falls into its own group: a loop body shows up as one
large count), and the instructions with the most samples.

    scripts/ncu_regions.py source.csv [--top N]
"""
import argparse
import collections
import csv
import sys


def tables(lines):
    """(kernel name, header, rows) for each kernel's table in the CSV."""
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')]
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        name = next(csv.reader([lines[start]]))[1]
        rows = list(csv.reader(lines[start + 1:end]))
        if not rows:
            continue
        header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
        yield name, header, body


def number(text):
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def summarize(name, header, rows, top, out):
    need = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    if any(h not in header for h in need):
        out.write(f"{name}: no source-level columns (was --page source --print-source sass given?)\n")
        return
    ia, isrc, iw, ie = (header.index(h) for h in need)
    stall_cols = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(number(r[iw]) for r in rows)
    out.write(f"== {name}\n")
    if total <= 0:
        out.write("   no warp-stall samples\n")
        return
    out.write(f"   samples {total:.0f}, instructions executed {sum(number(r[ie]) for r in rows):.0f}\n")
    reasons = collections.Counter()
    for r in rows:
        for i in stall_cols:
            reasons[header[i][len("stall_"):]] += number(r[i])
    out.write("   stall reasons: " + ", ".join(f"{k} {v / total:.1%}" for k, v in reasons.most_common(8)) + "\n")
    groups = collections.defaultdict(lambda: [0.0, 0])
    for r in rows:
        g = groups[int(number(r[ie]))]
        g[0] += number(r[iw])
        g[1] += 1
    out.write("   samples by execution count (count: share of samples, instructions):\n")
    for count, (w, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        if w > 0:
            out.write(f"     {count:>10}: {w / total:6.1%}  {n:5d}\n")
    base = min(int(r[ia], 16) for r in rows)
    out.write("   instructions with the most samples (offset, share, executions, top reasons, source):\n")
    for r in sorted(rows, key=lambda r: -number(r[iw]))[:top]:
        top2 = sorted(((number(r[i]), header[i][len("stall_"):]) for i in stall_cols), reverse=True)[:2]
        why = ", ".join(f"{k} {v:.0f}" for v, k in top2 if v > 0)
        out.write(f"     {int(r[ia], 16) - base:#8x} {number(r[iw]) / total:6.1%} {r[ie]:>9}  {why:30}"
                  f"  {r[isrc].strip()[:60]}\n")


def main():
    ap = argparse.ArgumentParser(description="Summarize ncu source-level warp-stall samples.")
    ap.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("--top", type=int, default=12, help="rows per list (default 12)")
    args = ap.parse_args()
    try:
        with open(args.csv, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit(f"ncu_regions.py: cannot open '{args.csv}': {e.strerror}")
    found, seen = False, set()
    for name, header, rows in tables(lines):
        found = True
        key = (name, len(rows), tuple(tuple(r) for r in rows[:3]))
        if key in seen:   # ncu may print a kernel's table twice
            continue
        seen.add(key)
        summarize(name, header, rows, args.top, sys.stdout)
    if not found:
        sys.exit(f"ncu_regions.py: no kernel tables in '{args.csv}' (ncu printed no source page?)")


if __name__ == "__main__":
    main()
