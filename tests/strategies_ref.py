"""h5py reference of `mkv-analyze info` and `mkv-analyze strategies` on a
compressed dump, sharing no code with libmosaickv:

  strategies_ref.py info COMPRESSED INFO_TXT [LABEL]
  strategies_ref.py strategies COMPRESSED TSV

info: every "key: value" line, in order, from the file's root attributes;
physical_bytes also recomputed as the sum over every dataset under /layers
of elements x element size, logical_bytes as n_layers x n_kv_heads x 2 x
T x head_dim x 2, the ratio from the two (LABEL: the name the tool was
given, default COMPRESSED).

strategies: one row per layer, KV head, tensor (k, v) and segment, in that
order, from X/strategy, k/blockdims and X/loss read directly; the byte
columns recomputed by hand from the strategy row with the rules of
mosaickv(5) (values len*r*2; bitmap len*ceil(d'/g/8) when per-vector and
r < d'; block keys ceil(len/B)*(keydim+bound)*2; rotation
d*max(d',keydim)*2 for rotated keys, d*d'*2 for rotated values); per
tensor their sum must equal the stored X/values, X/bitmap, k/blockkeys and
X/rotation; losses must be the stored float32 exactly ("nan" for NaN).
Exit 0 when everything matches, 1 otherwise (one line per difference).
"""
import math
import sys

import h5py
import numpy as np

COLUMNS = ["layer", "head", "tensor", "segment", "start", "length", "rotate", "r", "g", "dprime",
           "pervector", "bits", "qgroup", "keydim", "bound", "values_bytes", "qparams_bytes", "bitmap_bytes", "blockkey_bytes",
           "rotation_bytes", "bytes", "bytes_per_token", "energy_loss", "output_loss"]

problems = []


def fail(msg):
    problems.append(msg)


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def params_of(f):
    return dict(kv.split("=", 1) for kv in text(f.attrs["params"]).split())


def format_bytes(n):
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, u = float(n), 0
    while v >= 1024.0 and u < 5:
        v /= 1024.0
        u += 1
    return str(n) if u == 0 else "%d (%.1f %s)" % (n, v, units[u])


def stored_bytes(group):
    total = 0

    def visit(_name, obj):
        nonlocal total
        if isinstance(obj, h5py.Dataset):
            total += obj.size * obj.dtype.itemsize
    group.visititems(visit)
    return total


def stored_bytes_of(grp, name):
    """Bytes of one array of a head; an absent array is an empty one."""
    return int(grp[name].size * grp[name].dtype.itemsize) if name in grp else 0


def table_of(grp, name, cols):
    """A per-segment table as stored (strategy and blockdims int32, loss
    float32); absent when the head has no segment."""
    if name not in grp:
        return np.zeros((0, cols))
    t = grp[name]
    want = np.float32 if name.endswith("loss") else np.int32
    if t.dtype != want or t.ndim != 2 or t.shape[1] != cols:
        fail("%s: %s %s, expected %s [nseg][%d]" % (t.name, t.dtype, t.shape, np.dtype(want), cols))
    return t[...]


def check_info(path, info_path, label):
    with h5py.File(path, "r") as f:
        a = f.attrs
        L, H, T, d = (int(a[k]) for k in ("n_layers", "n_kv_heads", "n_tokens", "head_dim"))
        physical = stored_bytes(f["layers"])
        logical = L * H * 2 * T * d * 2
        if physical != int(a["physical_bytes"]) or logical != int(a["logical_bytes"]):
            fail("the file's byte attributes %d, %d differ from its datasets' %d, %d"
                 % (int(a["logical_bytes"]), int(a["physical_bytes"]), logical, physical))
        want = [
            ("file", label),
            ("format", text(a["mkv_format"])),
            ("version", str(int(a["mkv_version"]))),
            ("method", text(a["method"])),
            ("params", text(a["params"]) or "-"),
            ("source", text(a["source"]) or "-"),
            ("source_digest", text(a["source_digest"]) if "source_digest" in a else "-"),
            ("raw_source", text(a["raw_source"]) if "raw_source" in a else "import"),
            ("model", text(a["model"])),
            ("created_by", text(a["created_by"])),
            ("layers", str(L)),
            ("heads", str(int(a["n_heads"]))),
            ("kv_heads", str(H)),
            ("head_dim", str(d)),
            ("rope_theta", "%g" % float(a["rope_theta"])),
            ("k_rope", text(a["k_rope"])),
            ("tokens", str(T)),
            ("queries", str(f["query_pos"].shape[0])),
            ("logical_bytes", format_bytes(logical)),
            ("physical_bytes", format_bytes(physical)),
            ("ratio", "%.3f" % (logical / physical)),
        ]
    with open(info_path) as fp:
        lines = fp.read().split("\n")
    if lines[-1] != "":
        fail("info does not end with a newline")
    got = []
    for line in lines[:-1]:
        key, sep, value = line.partition(":")
        if not sep:
            fail("not a 'key: value' line: %r" % line)
            continue
        got.append((key, value.lstrip(" ")))
        if value[:1] != " ":
            fail("no blank after %r" % key)
    for i in range(max(len(got), len(want))):
        g = got[i] if i < len(got) else None
        w = want[i] if i < len(want) else None
        if g != w:
            fail("info line %d: %s, expected %s" % (i + 1, g, w))


def hand_bytes(row, keydim, bound, d, B, is_key):
    start, length, rotate, r, g, dprime, pervector = (int(x) for x in row[:7])
    bits = int(row[7]) if len(row) > 7 else 16
    qgroup = int(row[8]) if len(row) > 8 else 0
    values = length * r * 2 if bits == 16 else length * math.ceil(r * bits / 8)
    groups = math.ceil(length / qgroup) if qgroup else 1
    qparams = 0 if bits == 16 else groups * dprime * 2 * 2
    bitmap = length * math.ceil(dprime / g / 8) if pervector and r < dprime else 0
    blockkeys = math.ceil(length / B) * (keydim + bound) * 2 if is_key else 0
    cols = max(dprime, keydim) if is_key else dprime
    rotation = d * cols * 2 if rotate else 0
    return [values, qparams, bitmap, blockkeys, rotation, values + qparams + bitmap + blockkeys + rotation]


def float_cell(cell):
    return float("nan") if cell == "nan" else float(cell)


def check_strategies(path, tsv_path):
    with open(tsv_path) as fp:
        lines = fp.read().split("\n")
    if lines[-1] != "":
        fail("the table does not end with a newline")
    if lines[0].split("\t") != COLUMNS:
        fail("header %r, expected %r" % (lines[0], "\t".join(COLUMNS)))
    rows = [line.split("\t") for line in lines[1:-1]]
    n = 0
    with h5py.File(path, "r") as f:
        a = f.attrs
        L, H, d = int(a["n_layers"]), int(a["n_kv_heads"]), int(a["head_dim"])
        B = int(params_of(f)["block"])
        for layer in range(L):
            for head in range(H):
                grp = f["layers/%02d/%02d" % (layer, head)]
                for x in "kv":
                    table = table_of(grp, x + "/strategy", 9)
                    loss = table_of(grp, x + "/loss", 2)
                    dims = table_of(grp, "k/blockdims", 2) if x == "k" else np.zeros((len(table), 2), int)
                    per_array = np.zeros(5, dtype=np.int64)
                    for i, (srow, lrow, drow) in enumerate(zip(table, loss, dims)):
                        where = "layer %d head %d %s segment %d" % (layer, head, x, i)
                        if n >= len(rows):
                            fail("%s: missing row" % where)
                            n += 1
                            continue
                        got = rows[n]
                        n += 1
                        if len(got) != len(COLUMNS):
                            fail("%s: %d cells, expected %d" % (where, len(got), len(COLUMNS)))
                            continue
                        keydim, bound = int(drow[0]), int(drow[1])
                        sizes = hand_bytes(srow, keydim, bound, d, B, x == "k")
                        per_array += sizes[:5]
                        want = [str(layer), str(head), x, str(i)] + [str(int(v)) for v in srow] + \
                            [str(keydim), str(bound)] + [str(v) for v in sizes]
                        if got[:21] != want:
                            fail("%s: %s, expected %s" % (where, got[:21], want))
                        if not math.isclose(float(got[21]), sizes[5] / int(srow[1]), rel_tol=1e-8):
                            fail("%s: bytes_per_token %s, expected %r" % (where, got[21], sizes[5] / int(srow[1])))
                        for col, stored in zip(got[22:], lrow):
                            value = np.float32(float_cell(col))
                            same = (np.isnan(value) and np.isnan(stored)) or value == stored
                            if not same or (np.isnan(stored) and col != "nan"):
                                fail("%s: loss %s, stored %r" % (where, col, float(stored)))
                    # values_bytes counts fp16 values and codes alike
                    arrays = ["qparams", "bitmap", "blockkeys", "rotation"]
                    stored = [stored_bytes_of(grp, x + "/values") + stored_bytes_of(grp, x + "/codes")] + \
                        [stored_bytes_of(grp, x + "/" + name) for name in arrays]
                    if list(per_array) != stored:
                        fail("layer %d head %d %s: the rows' bytes by array %s, the stored arrays %s"
                             % (layer, head, x, list(per_array), stored))
    if n != len(rows):
        fail("%d rows, the file has %d segments" % (len(rows), n))


def main():
    mode, path, out = sys.argv[1:4]
    if mode == "info":
        check_info(path, out, sys.argv[4] if len(sys.argv) > 4 else path)
    else:
        check_strategies(path, out)
    for p in problems[:20]:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
