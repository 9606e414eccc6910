"""An independent re-implementation of the method "turboquant" (the top
comment of lib/methods/turboquant.c) in numpy, checked against what
mkv-compress stores and mkv-attend answers, read with h5py:

  turboquant_ref.py store RAW.h5 C.h5
      every array of every (layer, KV head): the norms, the codes of the
      rotated unit vectors in the Lloyd-Max codebook, and with prod=on the
      residual's sign bits and norm, recomputed from RAW; the byte count by
      hand. The random streams (mkv_rng: splitmix64, xoshiro256**, polar
      normals) are written again here, the rotation is numpy's QR, and the
      codebook comes from Lloyd's iteration on the density of a rotated
      unit vector's coordinate integrated by Gauss-Legendre quadrature (the
      library uses a closed form).
  turboquant_ref.py attend TABLE.tsv RAW.h5 C.h5
      every row of mkv-attend's table: attention over the keys and values
      reconstructed here from C's arrays against exact attention over RAW
      (rel_l2), every token attended, bytes read by hand.
  turboquant_ref.py codebook D BITS
      print the codebook's centroids and distortion (for reading).

Exit status 0 when everything holds, 1 with a message per failure.
"""
import sys

import h5py
import numpy as np

M64 = (1 << 64) - 1
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


# ---------------------------------------------------------------- mkv_rng


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


def rng_log(x):
    """The library's portable logarithm: frexp, then 2 atanh(s) by its series."""
    m, e = np.frexp(x)
    m, e = float(m), int(e)
    if m < 0.70710678118654752440:
        m *= 2.0
        e -= 1
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    poly = 1.0 / 23
    for k in range(10, -1, -1):
        poly = 1.0 / (2 * k + 1) + s2 * poly
    return e * 6.93147180369123816490e-01 + (e * 1.90821492927058770002e-10 + 2.0 * s * poly)


class Rng:
    def __init__(self, seed, keys):
        state, h = splitmix64(seed)
        for key in keys:
            state, h = splitmix64(h ^ key)
        state = h
        self.s = []
        for _ in range(4):
            state, out = splitmix64(state)
            self.s.append(out)
        self.spare = None

    def next(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53

    def normal(self):
        if self.spare is not None:
            x, self.spare = self.spare, None
            return x
        while True:
            u = 2.0 * self.uniform() - 1.0
            v = 2.0 * self.uniform() - 1.0
            s = u * u + v * v
            if 0.0 < s < 1.0:
                break
        f = np.sqrt(-2.0 * rng_log(s) / s)
        self.spare = v * f
        return u * f


def normals(seed, keys, n):
    r = Rng(seed, keys)
    return np.array([r.normal() for _ in range(n)])


def rotation(seed, layer, head, tensor, d):
    a = normals(seed, (layer, head, tensor, 0), d * d).reshape(d, d)
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    return q.T          # rows: y = rotation @ u


def sketch(seed, layer, head, d):
    return normals(seed, (layer, head, 0, 1), d * d).reshape(d, d)


# ---------------------------------------------------------------- Lloyd-Max


def codebook(d, bits):
    """Centroids, boundaries and distortion of the Lloyd-Max quantizer of a
    coordinate of a random unit vector in d dimensions, density
    proportional to (1 - t^2)^((d - 3) / 2), by quadrature."""
    L = 1 << bits
    if L == 1:
        return np.zeros(1), np.zeros(0), 1.0
    nodes, weights = np.polynomial.legendre.leggauss(200)

    def integrals(a, b):
        t = (b - a) / 2 * nodes + (a + b) / 2
        w = weights * (b - a) / 2 * (1 - t * t) ** ((d - 3) / 2)
        return w.sum(), (w * t).sum(), (w * t * t).sum()

    z = integrals(-1.0, 0.0)[0] * 2
    c = np.linspace(-1, 1, L + 2)[1:-1] * min(2 / np.sqrt(d), 0.9)
    for _ in range(20000):
        edges = np.concatenate(([-1.0], (c[1:] + c[:-1]) / 2, [1.0]))
        new = np.array([integrals(edges[i], edges[i + 1])[1] / integrals(edges[i], edges[i + 1])[0]
                        for i in range(L)])
        moved = np.abs(new - c).max()
        c = new
        if moved < 1e-14:
            break
    edges = np.concatenate(([-1.0], (c[1:] + c[:-1]) / 2, [1.0]))
    err = sum(integrals(edges[i], edges[i + 1])[2] - 2 * c[i] * integrals(edges[i], edges[i + 1])[1]
              + c[i] ** 2 * integrals(edges[i], edges[i + 1])[0] for i in range(L)) / z
    return c, edges[1:-1], d * err


# ---------------------------------------------------------------- the method


def f16(x):
    """As the library rounds a double norm: to float32, then float16."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def params_of(f):
    text = f.attrs["params"]
    text = text.decode() if isinstance(text, bytes) else str(text)
    p = dict(kv.split("=", 1) for kv in text.split())
    return int(p["key_bits"]), int(p["value_bits"]), p["prod"] == "on", int(p["seed"])


def unpack(packed, n, bits):
    """n codes of `bits` from the little-endian bit stream."""
    stream = np.unpackbits(np.asarray(packed, dtype=np.uint8), bitorder="little")
    stream = stream[:n * bits].reshape(n, bits).astype(np.int64)
    return (stream << np.arange(bits)).sum(axis=1)


def encode(x, rot, cents, bounds, S):
    """Norms, codes and (with S) signs and residual norms of the rows of x."""
    norm = np.sqrt((x * x).sum(axis=1))
    u = np.where(norm[:, None] > 0, x / np.where(norm > 0, norm, 1)[:, None], 0)
    y = u @ rot.T
    codes = np.searchsorted(bounds, y, side="left")
    if S is None:
        return f16(norm), codes, None, None
    r = y - cents[codes]
    signs = (r @ S.T >= 0).astype(np.int64)
    return f16(norm), codes, signs, f16(np.sqrt((r * r).sum(axis=1)))


def head_bytes(T, d, kb, vb, prod):
    nbits = T * d
    b = (nbits * kb + 7) // 8 + (nbits * vb + 7) // 8 + 2 * 2 * T
    if prod:
        b += (nbits + 7) // 8 + 2 * T
    return b


def read_raw(r, l, kind):
    return r["layers/%02d/%s" % (l, kind)][()].astype(np.float64)


def cmd_store(raw, path):
    with h5py.File(raw, "r") as r, h5py.File(path, "r") as f:
        check(f.attrs["method"] in (b"turboquant", "turboquant"), "method is %r" % f.attrs["method"])
        key_bits, value_bits, prod, seed = params_of(f)
        L, KVH, D = (int(r.attrs[k]) for k in ("n_layers", "n_kv_heads", "head_dim"))
        kb = key_bits - prod
        kc, kbounds, kdist = codebook(D, kb)
        vc, vbounds, vdist = codebook(D, value_bits)
        total = 0
        for l in range(L):
            k_all, v_all = read_raw(r, l, "k"), read_raw(r, l, "v")
            for h in range(KVH):
                g = f["layers/%02d/%02d" % (l, h)]
                T = k_all.shape[1]
                names = {"k_norm", "v_norm", "v_codes"} | ({"k_codes"} if kb else set()) | \
                    ({"k_signs", "k_rnorm"} if prod else set())
                check(set(g.keys()) == names, "layer %d head %d: arrays %s" % (l, h, sorted(g.keys())))
                for kind, x, bits, cents, bounds, tensor in (("k", k_all[h], kb, kc, kbounds, 0),
                                                             ("v", v_all[h], value_bits, vc, vbounds, 1)):
                    S = sketch(seed, l, h, D) if kind == "k" and prod else None
                    norm, codes, signs, rnorm = encode(x, rotation(seed, l, h, tensor, D), cents, bounds, S)
                    where = "layer %d head %d %s" % (l, h, kind)
                    check(g[kind + "_norm"].dtype == np.float16, "%s: norms are %s" % (where, g[kind + "_norm"].dtype))
                    check(np.array_equal(g[kind + "_norm"][()].astype(np.float64), norm), "%s: norms differ" % where)
                    if bits:
                        got = unpack(g[kind + "_codes"][()], T * D, bits).reshape(T, D)
                        check(g[kind + "_codes"].shape == ((T * D * bits + 7) // 8,), "%s: codes shape" % where)
                        check(np.array_equal(got, codes), "%s: %d of %d codes differ" %
                              (where, int((got != codes).sum()), codes.size))
                    if S is not None:
                        got = unpack(g["k_signs"][()], T * D, 1).reshape(T, D)
                        check(np.array_equal(got, signs), "%s: %d of %d signs differ" %
                              (where, int((got != signs).sum()), signs.size))
                        check(np.array_equal(g["k_rnorm"][()].astype(np.float64), rnorm),
                              "%s: residual norms differ" % where)
                want = head_bytes(T, D, kb, value_bits, prod)
                check(int(g.attrs["physical_bytes"]) == want,
                      "layer %d head %d: physical_bytes %d, by hand %d" % (l, h, g.attrs["physical_bytes"], want))
                total += want
        check(int(f.attrs["physical_bytes"]) == total, "physical_bytes %d, by hand %d" % (f.attrs["physical_bytes"], total))


def reconstruct(g, kind, l, h, T, D, bits, prod, seed):
    """The keys or values of (l, h) as C stores them, rotated back."""
    cents = codebook(D, bits)[0]
    codes = unpack(g[kind + "_codes"][()], T * D, bits).reshape(T, D) if bits else np.zeros((T, D), dtype=np.int64)
    y = cents[codes]
    if prod:
        z = 2.0 * unpack(g["k_signs"][()], T * D, 1).reshape(T, D) - 1
        gamma = g["k_rnorm"][()].astype(np.float64)
        y = y + np.sqrt(np.pi / 2) / D * gamma[:, None] * (z @ sketch(seed, l, h, D))
    rot = rotation(seed, l, h, 0 if kind == "k" else 1, D)
    return g[kind + "_norm"][()].astype(np.float64)[:, None] * (y @ rot)


def softmax_attend(k, v, q, pos):
    s = k[:pos + 1] @ q / np.sqrt(k.shape[1])
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v[:pos + 1]


def read_table(table, check):
    """The rows of mkv-attend's table, its header checked."""
    with open(table) as fp:
        lines = [line.rstrip("\n").split("\t") for line in fp]
    header, rows = lines[0], lines[1:]
    check(header[:9] == ["query", "pos", "layer", "head", "kv_head", "rel_l2", "recall", "tokens", "bytes_read"],
          "table header %r" % header)
    return rows


def cmd_attend(table, raw, path):
    rows = read_table(table, check)
    with h5py.File(raw, "r") as r, h5py.File(path, "r") as f:
        key_bits, value_bits, prod, seed = params_of(f)
        L, H, KVH, D = (int(r.attrs[k]) for k in ("n_layers", "n_heads", "n_kv_heads", "head_dim"))
        G = H // KVH
        check(len(rows) == len(r["query_pos"]) * L * H, "%d rows" % len(rows))
        cache = {}
        for row in rows:
            w, pos, l, h, kvh = (int(x) for x in row[:5])
            if (l, kvh) not in cache:
                g = f["layers/%02d/%02d" % (l, kvh)]
                T = r["layers/%02d/k" % l].shape[1]
                cache[(l, kvh)] = (reconstruct(g, "k", l, kvh, T, D, key_bits - prod, prod, seed),
                                   reconstruct(g, "v", l, kvh, T, D, value_bits, False, seed),
                                   read_raw(r, l, "k")[kvh], read_raw(r, l, "v")[kvh])
            kq, vq, k, v = cache[(l, kvh)]
            q = read_raw(r, l, "q")[h, w]
            exact = softmax_attend(k, v, q, pos)
            want = np.linalg.norm(softmax_attend(kq, vq, q, pos) - exact) / np.linalg.norm(exact)
            rel, recall, tokens, nbytes = float(row[5]), float(row[6]), int(row[7]), int(row[8])
            where = "row w=%d l=%d h=%d" % (w, l, h)
            # the tool prints 6 significant digits; its float32 output adds ~1e-7
            check(abs(rel - want) <= 1e-6 + 1e-4 * want, "%s: rel_l2 %g, numpy gives %g" % (where, rel, want))
            check(recall == 1.0 and tokens == pos + 1, "%s: recall %g, tokens %d" % (where, recall, tokens))
            check(kvh == h // G, "%s: kv_head %d" % (where, kvh))
            want_bytes = head_bytes(pos + 1, D, key_bits - prod, value_bits, prod)
            check(nbytes == want_bytes, "%s: bytes_read %d, by hand %d" % (where, nbytes, want_bytes))


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "store":
        cmd_store(*args)
    elif cmd == "attend":
        cmd_attend(*args)
    elif cmd == "codebook":
        c, b, dist = codebook(int(args[0]), int(args[1]))
        print(" ".join("%.12g" % x for x in c), "distortion %.9g" % dist)
    else:
        print("turboquant_ref.py: unknown command %r" % cmd, file=sys.stderr)
        return 2
    for msg in failures[:20]:
        print("turboquant_ref.py %s: %s" % (cmd, msg), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
