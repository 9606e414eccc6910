#!/usr/bin/python3
"""What 8-bit block keys change in MosaicKV's token selection.

    scripts/blockkey8_selection.py COMPRESSED.h5 RAW.h5 [--budget 0.1]

COMPRESSED is a mosaic dump of mkv-compress, RAW the dump it was made
from (its queries and keys).  For every query, KV head and layer the
blocks are scored twice in double, with the stored fp16 block keys and with
the 8-bit codes the GPU makes of them (mkv_cuda_mosaic_blockkeys8 in
kernels/mkv_cuda.h: per row, codes rint(x 127 / a) with a the row's
largest |x|, and the scale a / 127), then selected by the method's rule
(docs/DESIGN.md 5.2: the group's heads aggregated by max, blocks taken in
descending score until the budget, counted with the sink and recent
tokens, is reached; ties to the earlier block).  Printed: the selection
recall of the 8-bit selection against the fp16 one (the share of the
tokens the fp16 keys select that the codes select too), the queries whose
selection changed, and the attention-mass recall of both selections under
exact attention over the raw keys.  Written for this measurement from the
file format of lib/mosaic/packed.h; reads segments of one strategy table
per head (K's), with or without rotation."""
import argparse
import math
import sys

import h5py
import numpy as np


def codes_of(rows):
    """The 8-bit codes and per-row scales of fp16 rows (float64 arrays)."""
    amax = np.abs(rows).max(axis=1)
    safe = np.where(amax > 0, amax, 1.0)
    codes = np.where(amax[:, None] > 0, np.rint(rows * 127.0 / safe[:, None]), 0.0)
    return codes, (amax / 127.0).astype(np.float32).astype(np.float64)


def block_scores(qt, rows, kd, kb):
    """Scores of blocks (rows [nb][kb + kd]) for rotated queries qt [G][>= kd]."""
    lo, hi, mean = rows[:, :kb], rows[:, kb:2 * kb], rows[:, 2 * kb:kb + kd]
    s = np.zeros((qt.shape[0], rows.shape[0]))
    if kb:
        s += np.maximum(qt[:, None, :kb] * lo[None], qt[:, None, :kb] * hi[None]).sum(axis=2)
    s += qt[:, kb:kd] @ mean.T
    return s.max(axis=0)


def select(score, weight, need):
    """Block flags: descending score, ties to the earlier, until need tokens."""
    order = np.lexsort((np.arange(len(score)), -score))
    taken = np.zeros(len(score), bool)
    got = 0
    for i in order:
        if got >= need:
            break
        taken[i] = True
        got += weight[i]
    return taken


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("compressed")
    ap.add_argument("raw")
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--recent", type=int, default=64)
    ap.add_argument("--block", type=int, default=8)
    a = ap.parse_args()
    B = a.block
    cf, rf = h5py.File(a.compressed, "r"), h5py.File(a.raw, "r")
    qpos = rf["query_pos"][:]
    sel_tok = both_tok = 0
    changed = queries = 0
    mass16, mass8 = [], []
    for lname in sorted(rf["layers"]):
        K = rf["layers"][lname]["k"][:].astype(np.float64)
        Q = rf["layers"][lname]["q"][:].astype(np.float64)
        n_kv, T, d = K.shape
        G = Q.shape[0] // n_kv
        for h in range(n_kv):
            g = cf["layers"][lname]["%02d" % h]["k"]
            strat, dims = g["strategy"][:], g["blockdims"][:]
            bk = g["blockkeys"][:].astype(np.float64)
            rot = g["rotation"][:].astype(np.float64) if "rotation" in g else None
            sink = min(a.sink, T)
            recent = min(a.recent, T - sink)
            segs, off_bk, off_rot = [], 0, 0
            for s, (kd, kb) in zip(strat, dims):
                start, length, rotate, dprime = int(s[0]), int(s[1]), int(s[2]), int(s[5])
                nb = -(-length // B)
                rows = bk[off_bk:off_bk + nb * (kd + kb)].reshape(nb, kd + kb)
                off_bk += nb * (kd + kb)
                R = None
                if rotate:
                    cols = max(dprime, kd)
                    R = rot[off_rot:off_rot + d * cols].reshape(d, cols)
                    off_rot += d * cols
                segs.append((start, length, kd, kb, rows, codes_of(rows), R))
            for w, pos in enumerate(qpos):
                qs = Q[h * G:(h + 1) * G, w]
                n_tok = pos + 1
                need = max(1, min(n_tok, math.ceil(a.budget * n_tok - 1e-9)))
                fixed = min(sink, n_tok) + max(0, min(recent, n_tok - (T - recent)))
                sc16, sc8, wts, toks = [], [], [], []
                for start, length, kd, kb, rows, (codes, scale), R in segs:
                    vb = min(-(-length // B), (pos - start) // B + 1) if pos >= start else 0
                    if vb <= 0:
                        continue
                    qt = qs @ R if R is not None else qs
                    sc16.append(block_scores(qt, rows[:vb], kd, kb))
                    sc8.append(block_scores(qt, codes[:vb], kd, kb) * scale[:vb])
                    for b in range(vb):
                        t0 = start + b * B
                        t1 = min(t0 + B, start + length, pos + 1)
                        wts.append(t1 - t0)
                        toks.append((t0, t1))
                if not wts:
                    continue
                sc16, sc8, wts = np.concatenate(sc16), np.concatenate(sc8), np.array(wts)
                s16 = select(sc16, wts, need - fixed)
                s8 = select(sc8, wts, need - fixed)
                queries += 1
                changed += bool((s16 != s8).any())
                sel_tok += wts[s16].sum()
                both_tok += wts[s16 & s8].sum()
                logits = qs @ K[h, :n_tok].T / math.sqrt(d)
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                always = np.zeros(n_tok, bool)
                always[:min(sink, n_tok)] = True
                always[T - recent:n_tok] = True
                for flags, out in ((s16, mass16), (s8, mass8)):
                    att = always.copy()
                    for i in np.nonzero(flags)[0]:
                        att[toks[i][0]:toks[i][1]] = True
                    out.extend(p[:, att].sum(axis=1))
    m16, m8 = float(np.mean(mass16)), float(np.mean(mass8))
    print("queries x KV heads x layers\t%d" % queries)
    print("selection changed\t%d (%.1f%%)" % (changed, 100.0 * changed / max(queries, 1)))
    print("selection recall of the 8-bit keys (tokens of the fp16 selection kept)\t%.5f" % (both_tok / max(sel_tok, 1)))
    print("attention-mass recall, fp16 keys\t%.6f" % m16)
    print("attention-mass recall, 8-bit keys\t%.6f (%+.3f%%)" % (m8, 100.0 * (m8 / m16 - 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
