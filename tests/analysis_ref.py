"""numpy reference of `mkv-analyze overlap|segments|spectrum|sparsity|channels`.

Reads the dump with h5py and recomputes every number of the tool's table
from the definitions in man/mkv-analyze.1, sharing no code with
libmosaickv (numpy's eigh instead of LAPACK/GSL, stable argsort instead of
our selection), then compares row by row:

  analysis_ref.py COMMAND DUMP TSV [the command's options, as given to mkv-analyze]

Numbers must agree to 1e-6 relative (or 1e-9 absolute near zero); counts
and channel lists exactly, except a channel count whose cumulative energy
share lies within 1e-9 of its threshold. Exit 0 when every row matches,
1 otherwise (one line per difference on stderr).
"""
import argparse
import math
import sys

import h5py
import numpy as np

RTOL = 1e-6
ATOL = 1e-9


def attr_str(v):
    """A string attribute as text: fixed-length ones come as bytes."""
    return v.decode() if isinstance(v, bytes) else str(v)


def read_float(ds, index=()):
    """A float dataset of a dump (or a slice of it) as float64, decoding bfloat16."""
    x = ds[index]
    if attr_str(ds.attrs.get("dtype", "")) == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def size(text):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1].lower(), 1)
    return int(text[:-1] if mult > 1 else text) * mult


def shares(text):
    return [float(s) for s in text.split(",")]


def percent(share):
    """The column-name form of a share: 0.25 -> '25' (C's %g of 100 * share)."""
    return "%g" % (share * 100.0)


def keep_count(p, d):
    return min(d, max(1, int(math.floor(p * d + 0.5))))


def fraction_count(f, n):
    x = f * n
    r = math.floor(x + 0.5)
    k = int(r) if abs(x - r) <= 1e-9 * x else int(math.ceil(x))
    return min(n, max(1, k))


def top_order(score):
    """Indices by decreasing score, ties to the lower index."""
    return np.argsort(-score, kind="stable")


def eigh_desc(C):
    """Eigenvalues descending and eigenvectors (columns), largest-|.|
    component of each made positive (the first within 1e-10 of the largest)."""
    w, V = np.linalg.eigh(C)
    w, V = w[::-1], V[:, ::-1].copy()
    for j in range(V.shape[1]):
        a = np.abs(V[:, j])
        if V[np.argmax(a >= a.max() * (1 - 1e-10)), j] < 0:
            V[:, j] = -V[:, j]
    return w, V


def heads(f):
    return int(f.attrs["n_layers"]), int(f.attrs["n_kv_heads"]), int(f.attrs["head_dim"])


def kv(f, layer, tensor, head):
    return read_float(f["layers/%02d/%s" % (layer, tensor)], (head,))


# ------------------------------------------------------------------ overlap

def overlap_window(X, m, rotated):
    if rotated:
        _, V = eigh_desc(X.T @ X)
        X = X @ V
    A = np.abs(X)
    glob = np.zeros(X.shape[1], bool)
    glob[top_order(A.sum(axis=0))[:m]] = True
    mine = np.argsort(-A, axis=1, kind="stable")[:, :m]
    return glob[mine].sum(axis=1) / m


def expect_overlap(f, a):
    L_, H, d = heads(f)
    T = f["layers/00/k"].shape[1]
    if a.lengths:
        lengths = [size(x) for x in a.lengths.split(",")]
    else:
        lengths = [min(T, 256)]
        while lengths[-1] * 4 <= T:
            lengths.append(lengths[-1] * 4)
    m = keep_count(a.keep, d)
    rows = {}
    for layer in range(L_):
        for head in range(H):
            for tensor in "kv":
                X = kv(f, layer, tensor, head)
                for L in lengths:
                    windows = 1 if a.prefix else T // L
                    for rot in (0, 1):
                        ov = [overlap_window(X[w * L:(w + 1) * L], m, rot) for w in range(windows)]
                        means = [o.mean() for o in ov]
                        allv = np.concatenate(ov)
                        rows[(layer, head, tensor, L, rot)] = {
                            "windows": windows, "overlap_mean": allv.mean(),
                            "overlap_min": allv.min(), "window_min": min(means),
                            "window_max": max(means)}
    return rows, ["layer", "head", "tensor", "length", "rotated"], [
        "layer", "head", "tensor", "length", "rotated", "windows", "overlap_mean", "overlap_min",
        "window_min", "window_max"]


# ------------------------------------------------------------------ segments

def segment_bounds(T, S):
    S = T if S == 0 or S > T else S
    return [(i, s0, min(S, T - s0)) for i, s0 in enumerate(range(0, T, S))]


def expect_segments(f, a):
    L_, H, d = heads(f)
    T = f["layers/00/k"].shape[1]
    rows = {}
    for layer in range(L_):
        for head in range(H):
            for tensor in "kv":
                X = kv(f, layer, tensor, head)
                for i, s0, n in segment_bounds(T, a.segment):
                    x = X[s0:s0 + n]
                    rms = math.sqrt(np.mean(x * x))
                    dev = x - x.mean()
                    m2, m4 = np.mean(dev ** 2), np.mean(dev ** 4)
                    energy = (x * x).sum(axis=0)
                    order = top_order(energy)[:a.top]
                    rows[(layer, head, tensor, i)] = {
                        "start": s0, "tokens": n, "rms": rms, "mag_var": np.abs(x).var(),
                        "kurtosis": m4 / m2 ** 2 - 3 if m2 > 0 else 0.0,
                        "outlier_share": np.mean(np.abs(x) > a.outlier_factor * rms),
                        "top_energy": energy[order].sum() / energy.sum(),
                        "top_channels": ",".join(str(c) for c in order)}
    return rows, ["layer", "head", "tensor", "segment"], [
        "layer", "head", "tensor", "segment", "start", "tokens", "rms", "mag_var", "kurtosis",
        "outlier_share", "top_energy", "top_channels"]


# ------------------------------------------------------------------ spectrum

def energy_rank(w, share):
    """(smallest k with cumsum(w)[k-1] >= share * total, whether that
    decision is within rounding of the threshold)."""
    total = w.sum()
    cum = np.concatenate([[0.0], np.cumsum(w)])
    reached = cum >= share * total
    k = int(np.argmax(reached)) if reached.any() else len(w)   # rounding may keep cum[d] < total
    near = np.any(np.abs(cum - share * total) <= 1e-9 * max(total, 1e-300))
    return k, near


def expect_spectrum(f, a):
    L_, H, d = heads(f)
    T = f["layers/00/k"].shape[1]
    rows = {}
    for layer in range(L_):
        for head in range(H):
            for tensor in "kv":
                X = kv(f, layer, tensor, head)
                for i, s0, n in segment_bounds(T, a.segment):
                    x = X[s0:s0 + n]
                    w = np.clip(np.linalg.eigvalsh(x.T @ x)[::-1], 0, None)
                    total = w.sum()
                    if a.full:
                        cum = np.cumsum(w)
                        for j in range(d):
                            rows[(layer, head, tensor, i, j)] = {
                                "start": s0, "tokens": n, "eigenvalue": w[j],
                                "share": w[j] / total, "cumulative": cum[j] / total}
                        continue
                    row = {"start": s0, "tokens": n, "energy": total,
                           "lambda1_share": w[0] / total}
                    for e in shares(a.energy):
                        row["d" + percent(e)] = energy_rank(w, e)
                    rows[(layer, head, tensor, i)] = row
    head = ["layer", "head", "tensor", "segment", "start", "tokens"]
    if a.full:
        return rows, head[:4] + ["index"], head + ["index", "eigenvalue", "share", "cumulative"]
    return rows, head[:4], head + ["energy", "lambda1_share"] + [
        "d" + percent(e) for e in shares(a.energy)]


# ------------------------------------------------------------------ sparsity

def expect_sparsity(f, a):
    L_, H, d = heads(f)
    nh = int(f.attrs["n_heads"])
    G = nh // H
    pos = f["query_pos"][()]
    fr = shares(a.fractions)
    rows = {}
    for layer in range(L_):
        K = read_float(f["layers/%02d/k" % layer])
        Q = read_float(f["layers/%02d/q" % layer])
        for h in range(nh):
            masses = []
            for w, p in enumerate(pos):
                s = K[h // G, :p + 1] @ Q[h, w] / math.sqrt(d)
                prob = np.exp(s - s.max())
                prob = np.sort(prob / prob.sum())[::-1]
                masses.append([prob[:fraction_count(x, p + 1)].sum() for x in fr])
            masses = np.array(masses)
            row = {"kv_head": h // G, "queries": len(pos)}
            for i, x in enumerate(fr):
                row["top%s_mean" % percent(x)] = masses[:, i].mean()
                row["top%s_min" % percent(x)] = masses[:, i].min()
            rows[(layer, h)] = row
    return rows, ["layer", "head"], ["layer", "head", "kv_head", "queries"] + [
        "top%s_%s" % (percent(x), stat) for x in fr for stat in ("mean", "min")]


# ------------------------------------------------------------------ channels

def expect_channels(f, a):
    L_, H, d = heads(f)
    G = int(f.attrs["n_heads"]) // H
    rows = {}
    for layer in range(L_):
        K = read_float(f["layers/%02d/k" % layer])
        Q = read_float(f["layers/%02d/q" % layer])
        for h in range(H):
            Qo = Q[h * G:(h + 1) * G].reshape(-1, d)   # the group's observation queries
            Kh = K[h]
            # the definition itself: Frobenius norm of Q[:, j] K[:, j]^T
            score = np.array([np.linalg.norm(np.outer(Qo[:, j], Kh[:, j])) for j in range(d)])
            order = top_order(score)
            if a.full:
                for r, c in enumerate(order):
                    rows[(layer, h, int(c))] = {"rank": r + 1, "score": score[c],
                                                "share": score[c] / score.sum()}
                continue
            row = {"queries": Qo.shape[0], "keys": Kh.shape[0],
                   "top_channels": ",".join(str(c) for c in order[:a.top])}
            for s in shares(a.shares):
                row["share_top" + percent(s)] = np.sort(score)[::-1][:keep_count(s, d)].sum() / score.sum()
            rows[(layer, h)] = row
    if a.full:
        return rows, ["layer", "head", "channel"], ["layer", "head", "channel", "rank", "score",
                                                    "share"]
    return rows, ["layer", "head"], ["layer", "head", "queries", "keys", "top_channels"] + [
        "share_top" + percent(s) for s in shares(a.shares)]


# ------------------------------------------------------------------ comparison

def same(got, want):
    if isinstance(want, tuple):            # (channel count, near its threshold)
        k, near = want
        return int(got) == k or (near and abs(int(got) - k) <= 1)
    if isinstance(want, str):
        return got == want
    if isinstance(want, (int, np.integer)):
        return int(got) == want
    g = float(got)
    return abs(g - want) <= max(RTOL * abs(want), ATOL)


def compare(rows, keys, want_header, tsv):
    with open(tsv) as fp:
        lines = fp.read().splitlines()
    if not lines:
        return ["empty table"]
    header = lines[0].split("\t")
    bad = []
    if header != want_header:
        bad.append("header is %r, expected %r" % ("\t".join(header), "\t".join(want_header)))
        return bad
    seen = set()
    for line in lines[1:]:
        c = line.split("\t")
        key = tuple(c[header.index(k)] if k == "tensor" else int(c[header.index(k)]) for k in keys)
        if key not in rows:
            bad.append("unexpected row %r" % line)
            continue
        seen.add(key)
        for name, got in zip(header, c):
            if name in keys:
                continue
            want = rows[key][name]
            if not same(got, want):
                bad.append("%s: %s is %s, numpy says %r" % (key, name, got, want))
    for key in sorted(set(rows) - seen, key=str):
        bad.append("missing row %s" % (key,))
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["overlap", "segments", "spectrum", "sparsity", "channels"])
    p.add_argument("dump")
    p.add_argument("tsv")
    p.add_argument("--keep", type=float, default=0.25)
    p.add_argument("--lengths", default="")
    p.add_argument("--prefix", action="store_true")
    p.add_argument("--segment", type=size, default=None)
    p.add_argument("--outlier-factor", type=float, default=6.0)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--energy", default="0.9,0.95,0.99")
    p.add_argument("--full", action="store_true")
    p.add_argument("--fractions", default="0.01,0.05,0.1,0.25")
    p.add_argument("--shares", default="0.25,0.5")
    a = p.parse_args()
    if a.segment is None:
        a.segment = 256 if a.command == "segments" else 0
    expect = {"overlap": expect_overlap, "segments": expect_segments,
              "spectrum": expect_spectrum, "sparsity": expect_sparsity,
              "channels": expect_channels}[a.command]
    with h5py.File(a.dump, "r") as f:
        rows, keys, header = expect(f, a)
    bad = compare(rows, keys, header, a.tsv)
    for b in bad[:20]:
        print("analysis_ref %s: %s" % (a.command, b), file=sys.stderr)
    if len(bad) > 20:
        print("analysis_ref %s: ... %d more" % (a.command, len(bad) - 20), file=sys.stderr)
    if not bad:
        print("analysis_ref %s: %d rows match numpy" % (a.command, len(rows)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
