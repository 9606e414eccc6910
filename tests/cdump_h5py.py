"""Independent checks of compressed dumps and of mkv-attend, with h5py and
numpy only (no libmosaickv code):

  cdump_h5py.py accounting C.h5 [RAW.h5]
      physical_bytes recomputed as the sum of numel x itemsize over every
      dataset under /layers must equal the attributes (root and per head);
      logical_bytes must equal n_layers x n_kv_heads x 2 x T x head_dim x 2;
      arrays are contiguous and unfiltered; /query_pos equals RAW's.
  cdump_h5py.py full C.h5 RAW.h5
      method "full" stores K and V as RAW's values rounded to float16.
  cdump_h5py.py attend-full TABLE.tsv C.h5 RAW.h5
      every row of mkv-attend's table for a "full" dump, recomputed: exact
      attention over RAW in float64 against attention over C's float16 K/V.
  cdump_h5py.py summary SUMMARY.tsv TABLE.tsv
      the summary's statistics equal numpy's over the table (mean, median,
      90th percentile and max of rel_l2, mean recall, tokens and bytes).

Exit status 0 when everything holds, 1 with a message per failure.
"""
import sys

import h5py
import numpy as np

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def read_float(ds):
    """A float dataset of a raw dump as float64, decoding bfloat16."""
    if attr_str(ds.attrs.get("dtype", "")) == "bfloat16":
        return (ds[()].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return ds[()].astype(np.float64)


def attr_str(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def cmd_accounting(path, raw=None):
    with h5py.File(path, "r") as f:
        a = f.attrs
        check(attr_str(a["mkv_format"]) == "mosaickv-compressed", "mkv_format is %r" % a["mkv_format"])
        check(int(a["mkv_version"]) == 1, "mkv_version is %r" % a["mkv_version"])
        for name in ("method", "params", "model", "k_rope", "source", "created_by"):
            check(name in a, "missing attribute %s" % name)
        L, KVH, D, T = (int(a[k]) for k in ("n_layers", "n_kv_heads", "head_dim", "n_tokens"))
        per_head = {}
        total = 0

        def visit(name, obj):
            nonlocal total
            if isinstance(obj, h5py.Dataset):
                parts = name.split("/")
                check(len(parts) >= 3, "dataset /layers/%s is not inside a head group" % name)
                nbytes = int(np.prod(obj.shape, dtype=np.int64)) * obj.dtype.itemsize
                key = (parts[0], parts[1])
                per_head[key] = per_head.get(key, 0) + nbytes
                total += nbytes
                check(obj.chunks is None and obj.compression is None,
                      "/layers/%s is chunked or filtered" % name)

        f["layers"].visititems(visit)
        check(int(a["physical_bytes"]) == total,
              "physical_bytes attribute %d, datasets hold %d bytes" % (a["physical_bytes"], total))
        logical = L * KVH * 2 * T * D * 2
        check(int(a["logical_bytes"]) == logical,
              "logical_bytes attribute %d, formula gives %d" % (a["logical_bytes"], logical))
        check(abs(float(a["compression_ratio"]) - logical / total) < 1e-12 * logical / total,
              "compression_ratio %r, expected %r" % (a["compression_ratio"], logical / total))
        for l in range(L):
            for h in range(KVH):
                g = f["layers/%02d/%02d" % (l, h)]
                got = per_head.get(("%02d" % l, "%02d" % h), 0)
                check(int(g.attrs["physical_bytes"]) == got,
                      "layer %d head %d: physical_bytes %d, datasets hold %d" % (l, h, g.attrs["physical_bytes"], got))
                check(int(g.attrs["logical_bytes"]) == 2 * T * D * 2,
                      "layer %d head %d: logical_bytes %d" % (l, h, g.attrs["logical_bytes"]))
        check(f["query_pos"].dtype == np.int32, "query_pos is %s" % f["query_pos"].dtype)
        if raw:
            with h5py.File(raw, "r") as r:
                check(np.array_equal(f["query_pos"][()], r["query_pos"][()]), "query_pos differs from the raw dump")
                check(int(r.attrs["n_layers"]) == L and int(r.attrs["head_dim"]) == D, "shape differs from the raw dump")
                check(r["layers/00/k"].shape[1] == T, "n_tokens differs from the raw dump")
    return total


def cmd_full(path, raw):
    with h5py.File(path, "r") as f, h5py.File(raw, "r") as r:
        check(attr_str(f.attrs["method"]) == "full", "method is %r" % f.attrs["method"])
        for l in range(int(r.attrs["n_layers"])):
            for kind in ("k", "v"):
                x = read_float(r["layers/%02d/%s" % (l, kind)])
                for h in range(x.shape[0]):
                    ds = f["layers/%02d/%02d/%s" % (l, h, kind)]
                    check(ds.dtype == np.float16, "%s is %s, expected float16" % (ds.name, ds.dtype))
                    check(np.array_equal(ds[()], x[h].astype(np.float16)),
                          "%s is not the raw values rounded to float16" % ds.name)


def read_tsv(path):
    with open(path) as fp:
        lines = [line.rstrip("\n").split("\t") for line in fp]
    header, rows = lines[0], lines[1:]
    return header, rows


def softmax_attend(k, v, q, pos):
    s = k[:pos + 1] @ q / np.sqrt(k.shape[1])
    p = np.exp(s - s.max())
    p /= p.sum()
    return p @ v[:pos + 1], p


def cmd_attend_full(table, path, raw):
    header, rows = read_tsv(table)
    want = ["query", "pos", "layer", "head", "kv_head", "rel_l2", "recall", "tokens", "bytes_read"]
    check(header == want, "table header %r" % header)
    with h5py.File(path, "r") as f, h5py.File(raw, "r") as r:
        L, H, KVH, D = (int(r.attrs[k]) for k in ("n_layers", "n_heads", "n_kv_heads", "head_dim"))
        G = H // KVH
        qpos = r["query_pos"][()]
        check(len(rows) == len(qpos) * L * H, "%d rows, expected %d" % (len(rows), len(qpos) * L * H))
        layers = {}
        for l in range(L):
            layers[l] = tuple(read_float(r["layers/%02d/%s" % (l, kind)]) for kind in "kvq")
        worst = 0.0
        for i, row in enumerate(rows):
            w, pos, l, h, kvh = (int(x) for x in row[:5])
            rel, recall, tokens, nbytes = float(row[5]), float(row[6]), int(row[7]), int(row[8])
            check((w, l, h) == (i // (L * H), i // H % L, i % H), "row %d out of order: %r" % (i, row[:5]))
            check(pos == qpos[w] and kvh == h // G, "row %d: pos/kv_head %r" % (i, row[:5]))
            k, v, q = layers[l]
            exact, _ = softmax_attend(k[kvh], v[kvh], q[h, w], pos)
            kc = f["layers/%02d/%02d/k" % (l, kvh)][()].astype(np.float64)
            vc = f["layers/%02d/%02d/v" % (l, kvh)][()].astype(np.float64)
            approx, _ = softmax_attend(kc, vc, q[h, w], pos)
            expect = np.linalg.norm(approx - exact) / np.linalg.norm(exact)
            worst = max(worst, expect)
            # the tool prints 6 significant digits; float32 outputs add ~1e-7
            check(abs(rel - expect) <= 1e-6 + 1e-4 * expect,
                  "row %d: rel_l2 %g, numpy gives %g" % (i, rel, expect))
            check(recall == 1.0, "row %d: recall %r, expected 1" % (i, recall))
            check(tokens == pos + 1, "row %d: tokens %d, expected %d" % (i, tokens, pos + 1))
            check(nbytes == (pos + 1) * D * 2 * 2, "row %d: bytes_read %d" % (i, nbytes))
    return worst


def cmd_summary(summary, table):
    sh, srows = read_tsv(summary)
    th, trows = read_tsv(table)
    check(len(srows) == 1, "summary has %d rows" % len(srows))
    s = dict(zip(sh, srows[0]))
    col = {name: i for i, name in enumerate(th)}
    rel = np.array([float(r[col["rel_l2"]]) for r in trows])
    recall = np.array([float(r[col["recall"]]) for r in trows])
    tokens = np.array([float(r[col["tokens"]]) for r in trows])
    nbytes = np.array([float(r[col["bytes_read"]]) for r in trows])
    check(int(s["rows"]) == len(trows), "rows %s, table has %d" % (s["rows"], len(trows)))
    # the table's values are rounded to 6 digits, the summary uses full precision
    for name, got in (("rel_l2_mean", rel.mean()), ("rel_l2_median", np.median(rel)),
                      ("rel_l2_p90", np.percentile(rel, 90)), ("rel_l2_max", rel.max()),
                      ("recall_mean", recall.mean()), ("tokens_mean", tokens.mean()),
                      ("bytes_read_mean", nbytes.mean())):
        check(abs(float(s[name]) - got) <= 1e-5 * abs(got) + 1e-9 + (0.005 if name == "tokens_mean" else 0),
              "%s is %s, numpy gives %r" % (name, s[name], got))
    check(abs(float(s["ratio"]) - int(s["logical_bytes"]) / int(s["physical_bytes"])) < 1e-4, "ratio %s" % s["ratio"])


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "accounting":
        cmd_accounting(*args)
    elif cmd == "full":
        cmd_full(*args)
    elif cmd == "attend-full":
        cmd_attend_full(*args)
    elif cmd == "summary":
        cmd_summary(*args)
    else:
        print("cdump_h5py.py: unknown command %r" % cmd, file=sys.stderr)
        return 2
    for msg in failures[:20]:
        print("cdump_h5py.py %s: %s" % (cmd, msg), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
