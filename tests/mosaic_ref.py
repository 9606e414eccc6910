#!/usr/bin/env python3
"""Independent numpy check of a compressed dump made by the methods
"mosaic" or "uniform2d" (layout: lib/mosaic/packed.h) against its raw dump.

    mosaic_ref.py RAW.h5 COMPRESSED.h5

Reads both files with h5py only and checks, for every layer and KV head:
  - physical_bytes equals the sum of numel x itemsize of every dataset under
    /layers (per head and in total), logical_bytes = 2 T d 2 per head;
  - the strategy tables tile the compressed tokens and the flat arrays have
    exactly the sizes the tables imply;
  - dense rows are the raw sink and recent rows rounded to fp16;
  - every stored rotation has orthonormal columns (to fp16 precision) whose
    Rayleigh quotients on the segment's Gram matrix are the leading
    eigenvalues numpy finds, in descending order, max(d', keydim) of them
    for keys and d' for values;
  - every bitmap keeps r / g groups; the packed values are the rotated
    elements x R at the bitmap's positions (to fp16 rounding), and no
    dropped group holds more energy than a kept one;
  - a quantized segment (bits 8, 4, 2): each rotated channel's zero and
    step span the channel's range over the segment's vectors, and every
    code (unpacked here, low bits first) reads back as fp16(zero + code
    step) within step / 2 of the rotated element, pad bits zero;
  - block keys (k/blockdims gives keydim and bound per segment; 0 and 0:
    none stored) are, per block, the min and max of the first `bound` rotated key channels and
    the means of the others up to keydim (raw channels, all d, no bound,
    when unrotated);
  - the recorded energy loss is the one of the kept-only reconstruction
    (quantized: of the kept elements as they read back).
Exit 0 when everything holds, 1 with a message otherwise.
"""
import sys

import h5py
import numpy as np

F16_REL = 2.0 ** -10  # fp16 rounding, with margin


def fail(msg):
    print("mosaic_ref: FAIL: " + msg)
    sys.exit(1)


def near(a, b, rel, what, atol=0.0):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        fail("%s: shape %s, expected %s" % (what, a.shape, b.shape))
    if b.size == 0:
        return
    tol = atol + rel * np.maximum(np.abs(b), np.abs(b).max() * 1e-3 + 1e-30)
    bad = np.abs(a - b) > tol
    if bad.any():
        i = np.argwhere(bad)[0]
        fail("%s: %r vs %r at %s" % (what, a[tuple(i)], b[tuple(i)], tuple(i)))


def attr_str(v):
    """A string attribute as text: fixed-length ones come as bytes."""
    return v.decode() if isinstance(v, bytes) else str(v)


def parse_params(text):
    return dict(kv.split("=", 1) for kv in text.split())


def positions(bits, r, g, dprime, nbytes):
    """Kept channels of one vector from its bitmap (LSB first)."""
    if nbytes == 0:
        return np.arange(r)
    groups = [i for i in range(dprime // g) if bits[i // 8] >> (i % 8) & 1]
    if len(groups) * g != r:
        fail("bitmap keeps %d groups of %d, r = %d" % (len(groups), g, r))
    return np.array([i * g + c for i in groups for c in range(g)])


def check_tensor(grp, x, X, sink_n, recent_n, block, T, d, where):
    """block > 0: keys (block keys and k/blockdims)."""
    name = lambda a: "%s/%s" % (x, a)
    dense = grp[name("dense")][...] if name("dense") in grp else np.zeros((0, d))
    rows = np.r_[np.arange(sink_n), np.arange(T - recent_n, T)].astype(int)
    near(dense, X[rows].astype(np.float16), 0, where + " dense rows")
    first, last = sink_n, T - recent_n
    if last <= first:
        return
    table = grp[name("strategy")][...]
    loss = grp[name("loss")][...]
    if block:
        bdims = grp["k/blockdims"][...]
        if bdims.shape != (len(table), 2):
            fail("%s: k/blockdims is %s, expected (%d, 2)" % (where, bdims.shape, len(table)))
    else:
        bdims = np.zeros((len(table), 2), int)
    flat = {a: (grp[name(a)][...] if name(a) in grp else np.zeros(0))
            for a in ("values", "bitmap", "blockkeys", "rotation", "codes", "qparams")}
    off = dict.fromkeys(flat, 0)
    nxt = first
    for row, ls, bd in zip(table, loss, bdims):
        start, length, rot, r, g, dp, perv = (int(v) for v in row[:7])
        bits = int(row[7]) if len(row) > 7 else 16
        qgroup = int(row[8]) if len(row) > 8 else 0
        if bits not in (16, 8, 4, 2):
            fail("%s %s segment at %d: bits %d" % (where, x, start, bits))
        if qgroup < 0 or (qgroup and (bits == 16 or qgroup >= length)):
            fail("%s %s segment at %d: qgroup %d with %d bits over %d tokens" % (where, x, start, qgroup, bits,
                                                                                length))
            qgroup = 0
        kd, bound = int(bd[0]), int(bd[1])
        w = "%s %s segment at %d" % (where, x, start)
        if start != nxt or length < 1:
            fail(w + ": segments do not tile the compressed tokens")
        nxt = start + length
        nbytes = (dp // g + 7) // 8 if perv and r < dp else 0
        Xs = X[start:start + length].astype(np.float64)
        if block and not ((kd == 0 and bound == 0) or
                          (1 <= kd <= d and 0 <= bound <= kd and (rot or (kd == d and bound == 0)))):
            fail(w + ": block keys of %d channels with %d bounds" % (kd, bound))
        cols = max(dp, kd) if block else dp
        R = np.eye(d)
        if rot:
            R = flat["rotation"][off["rotation"]:off["rotation"] + d * cols].astype(np.float64).reshape(d, cols)
            off["rotation"] += d * cols
            near(R.T @ R, np.eye(cols), 0, w + " R^T R", atol=2e-3)
            C = Xs.T @ Xs
            ev = np.linalg.eigvalsh(C)[::-1][:cols]
            rq = np.einsum("ic,ij,jc->c", R, C, R)
            if (np.diff(rq) > 1e-2 * ev[0]).any():
                fail(w + ": rotation columns are not sorted by eigenvalue")
            near(rq, ev, 1e-2 * ev[0] / np.maximum(ev, 1e-300), w + " eigenvalues")
        elif dp != d:
            fail(w + ": unrotated segment with d' != d")
        Xfull = Xs @ R
        Xt = Xfull[:, :dp]
        kept_e = [0.0]
        bm = flat["bitmap"][off["bitmap"]:off["bitmap"] + length * nbytes].reshape(length, nbytes)
        off["bitmap"] += length * nbytes
        if bits == 16:
            vals = flat["values"][off["values"]:off["values"] + length * r].reshape(length, r)
            off["values"] += length * r
        else:
            vb = -(-r * bits // 8)
            codes = flat["codes"][off["codes"]:off["codes"] + length * vb].reshape(length, vb).astype(np.uint32)
            per = qgroup if qgroup else length
            ngroups = -(-length // per)
            qp = flat["qparams"][off["qparams"]:off["qparams"] + 2 * dp * ngroups].astype(np.float64)
            qp = qp.reshape(ngroups, dp, 2)
            off["codes"] += length * vb
            off["qparams"] += 2 * dp * ngroups
            # each token's zero and step: those of its group of `per` tokens
            zero, step = np.repeat(qp[:, :, 0], per, 0)[:length], np.repeat(qp[:, :, 1], per, 0)[:length]
            for gi in range(ngroups):
                seg = Xt[gi * per:(gi + 1) * per]
                lo, hi = seg.min(0), seg.max(0)
                slack = 1e-9 * np.maximum(np.abs(lo), np.abs(hi)) + 1e-12
                z, st = qp[gi, :, 0], qp[gi, :, 1]
                if (st < 0).any() or (z > lo + slack).any() or (z + (2 ** bits - 1) * st < hi - slack).any():
                    fail(w + ": zeros and steps of token group %d do not span its rotated channels" % gi)
            allbits = np.unpackbits(codes.astype(np.uint8), axis=1, bitorder="little")
            if allbits[:, r * bits:].any():
                fail(w + ": codes set pad bits")
            code = (allbits[:, :r * bits].reshape(length, r, bits) * (1 << np.arange(bits))).sum(2)
            vals = np.zeros((length, r))
        for t in range(length):
            pos = positions(bm[t] if nbytes else None, r, g, dp, nbytes)
            if bits == 16:
                near(vals[t], Xt[t, pos], F16_REL, w + " packed values")
            else:
                vals[t] = (zero[t, pos] + code[t] * step[t, pos]).astype(np.float16)
                err = np.abs(vals[t] - Xt[t, pos])
                lim = step[t, pos] / 2 * (1 + 1e-6) + F16_REL * np.abs(Xt[t, pos]) + 1e-12
                if (err > lim).any():
                    i = int(np.argmax(err - lim))
                    fail(w + ": token %d value %d reads back as %r, %r away from %r (step %r)"
                         % (start + t, i, vals[t][i], err[i], Xt[t, pos[i]], step[t, pos[i]]))
            kept_e[0] += (Xt[t, pos] ** 2).sum() - (0 if bits == 16 else ((Xt[t, pos] - vals[t]) ** 2).sum())
            if perv and nbytes:
                e = (Xt[t] ** 2).reshape(dp // g, g).sum(1)
                kept = np.zeros(dp // g, bool)
                kept[pos[::g] // g] = True
                if e[~kept].size and e[~kept].max() > e[kept].min() * (1 + 1e-6) + 1e-12:
                    fail(w + ": token %d drops a group with more energy than a kept one" % (start + t))
        if block:
            nb = -(-length // block)
            wd = kd + bound
            keys = flat["blockkeys"][off["blockkeys"]:off["blockkeys"] + nb * wd].reshape(nb, wd)
            off["blockkeys"] += nb * wd
            rows = []
            for b in range(nb):
                blk = Xfull[b * block:(b + 1) * block, :kd]
                rows.append(np.r_[blk[:, :bound].min(0), blk[:, :bound].max(0), blk[:, bound:].mean(0)])
            near(keys, np.array(rows), F16_REL, w + " block keys")
        # energy dropped: R is orthonormal to fp16 precision, so the energy
        # of all rotated channels is that of X
        drop = 1 - kept_e[0] / max((Xs ** 2).sum(), 1e-300)
        if abs(drop - ls[0]) > 2e-3 + 2e-2 * abs(ls[0]):
            fail(w + ": recorded energy loss %g, recomputed %g" % (ls[0], drop))
        if not (np.isnan(ls[1]) or abs(ls[1]) <= 10):
            fail(w + ": recorded output error %g is neither NaN nor a relative error" % ls[1])
    if nxt != last:
        fail("%s %s: segments end at %d, not %d" % (where, x, nxt, last))
    for a, n in off.items():
        if n != flat[a].size:
            fail("%s %s/%s holds %d elements, the table implies %d" % (where, x, a, flat[a].size, n))


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().split("\n\n")[1])
        sys.exit(2)
    raw, comp = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
    method = attr_str(comp.attrs["method"])
    if method not in ("mosaic", "uniform2d"):
        fail("method %s is not mosaic or uniform2d" % method)
    params = parse_params(attr_str(comp.attrs["params"]))
    T, d = int(comp.attrs["n_tokens"]), int(comp.attrs["head_dim"])
    sink_n = min(int(params["sink"]), T)
    recent_n = min(int(params["recent"]), T - sink_n)
    block = int(params["block"])
    total = 0
    for layer in comp["layers"]:
        for head in comp["layers"][layer]:
            grp = comp["layers"][layer][head]
            where = "layer %s head %s" % (layer, head)
            counted = []
            grp.visititems(lambda n, o: counted.append(o.size * o.dtype.itemsize)
                           if isinstance(o, h5py.Dataset) else None)
            if sum(counted) != int(grp.attrs["physical_bytes"]):
                fail("%s: physical_bytes %d, datasets hold %d" % (where, grp.attrs["physical_bytes"], sum(counted)))
            total += sum(counted)
            k = raw["layers"][layer]["k"][int(head)].astype(np.float64)
            v = raw["layers"][layer]["v"][int(head)].astype(np.float64)
            check_tensor(grp, "k", k, sink_n, recent_n, block, T, d, where)
            check_tensor(grp, "v", v, sink_n, recent_n, 0, T, d, where)
    if total != int(comp.attrs["physical_bytes"]):
        fail("file physical_bytes %d, datasets hold %d" % (comp.attrs["physical_bytes"], total))
    heads = sum(len(comp["layers"][l]) for l in comp["layers"])
    if int(comp.attrs["logical_bytes"]) != heads * 2 * T * d * 2:
        fail("logical_bytes %d, expected %d" % (comp.attrs["logical_bytes"], heads * 2 * T * d * 2))
    print("mosaic_ref: ok: %d heads, physical %d bytes, ratio %.3f"
          % (heads, total, comp.attrs["logical_bytes"] / total))


if __name__ == "__main__":
    main()
