#!/usr/bin/env python3
"""Independent check of the per-head token budgets (headbudget=on):
recompute every head's error curve from the raw dump's observation
queries with numpy (exact softmax in float64; the relative L2 error of
the output over the `sink` first and `recent` last tokens and the others
of largest weight, ceil(f (p+1)) tokens in all for f = 1/200 .. 1,
averaged over the group's query heads and positions), allocate the steps
by runs as lib/methods/head_budget.h describes, and compare each head's
stored budget_scale (float32) with budget / mean.

usage: head_budget_ref.py RAW.h5 COMPRESSED.h5 MEAN FLOOR SINK RECENT
Exit 0 when every head matches, 1 otherwise (one line per difference)."""
import math
import sys

import h5py
import numpy as np

P = 200


def curve(k, v, q, pos, d, sink, recent):
    c = np.zeros(P)
    n = 0
    for qv in q:                       # [W][d] of one query head
        for w, p in enumerate(pos):
            s = k[:p + 1] @ qv[w] / math.sqrt(d)
            e = np.exp(s - s.max())
            exact = e @ v[:p + 1] / e.sum()
            m = p + 1
            fixed = [t for t in range(m) if t < min(sink, m) or t >= m - min(recent, m - min(sink, m))]
            rest = [t for t in sorted(range(m), key=lambda t: (-e[t], t)) if t not in set(fixed)]
            order = np.array(fixed + rest)
            cw = np.cumsum(e[order])
            cwv = np.cumsum(e[order][:, None] * v[order], 0)
            want = np.maximum(np.ceil(np.arange(1, P + 1) / P * m - 1e-9).astype(int), len(fixed))
            out = cwv[want - 1] / cw[want - 1][:, None]
            c += np.linalg.norm(out - exact, axis=1) / np.linalg.norm(exact)
            n += 1
    return c / n


def main():
    raw, comp = sys.argv[1], sys.argv[2]
    mean, floor, sink, recent = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    problems = []
    with h5py.File(raw, "r") as f:
        a = f.attrs
        L, H, Hq, d = int(a["n_layers"]), int(a["n_kv_heads"]), int(a["n_heads"]), int(a["head_dim"])
        G = Hq // H
        pos = f["query_pos"][...]
        curves = []
        for l in range(L):
            K = f["layers/%02d/k" % l][...].astype(np.float64)
            V = f["layers/%02d/v" % l][...].astype(np.float64)
            Q = f["layers/%02d/q" % l][...].astype(np.float64)
            for h in range(H):
                curves.append(curve(K[h], V[h], Q[h * G:(h + 1) * G], pos, d, sink, recent))
    n = len(curves)
    steps = [max(1, min(P, math.ceil(floor * P - 1e-9)))] * n
    total, used = int(round(mean * P * n)), sum(steps)
    while used < total:
        best = None                      # (rate, head, run): the first of equal rates
        for i in range(n):
            c = curves[i]
            for j in range(1, min(P - steps[i], total - used) + 1):
                r = (c[steps[i] - 1] - c[steps[i] + j - 1]) / j
                if best is None or r > best[0]:
                    best = (r, i, j)
        if best is None:
            break
        steps[best[1]] += best[2]
        used += best[2]
    with h5py.File(comp, "r") as f:
        for i, s in enumerate(steps):
            l, h = divmod(i, H)
            name = "layers/%02d/%02d/budget_scale" % (l, h)
            if name not in f:
                problems.append("layer %d head %d: no budget_scale" % (l, h))
                continue
            got, want = float(f[name][0]), float(np.float32(s / P / mean))
            if got != want:
                problems.append("layer %d head %d: budget_scale %r, expected %r (%d of %d steps)"
                                % (l, h, got, want, s, P))
    for p in problems:
        print("head_budget_ref: FAIL: " + p)
    if not problems:
        print("head_budget_ref: ok: %d heads, budgets %.3f .. %.3f" % (n, min(steps) / P, max(steps) / P))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
