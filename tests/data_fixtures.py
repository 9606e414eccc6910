"""Dumps for the CLI tests, written and checked with h5py + numpy only.

The point is independence from libmosaickv: valid dumps are written here
straight from docs/DESIGN.md 4, corruptions are applied with h5py, and
`compare-stats` recomputes `mkv-analyze stats` with numpy.

  data_fixtures.py valid OUT [--dtype float32|float16|bfloat16] [--layers L]
                   [--heads H] [--kv-heads KH] [--head-dim D] [--tokens T]
                   [--queries W] [--seed S] [--outlier-channels 3,17]
  data_fixtures.py corrupt IN OUT DEFECT     (DEFECT: see DEFECTS and HEAP_DEFECTS below)
  data_fixtures.py heap FILE                 (where the first global heap collection is)
  data_fixtures.py foreign OUT               (an HDF5 file that is not a dump)
  data_fixtures.py compare-stats DUMP TSV FACTOR
"""
import argparse
import shutil
import sys

import h5py
import numpy as np


def attr_str(v):
    """A string attribute as text: fixed-length ones come as bytes."""
    return v.decode() if isinstance(v, bytes) else str(v)


def write_float(group, name, x, dtype):
    """Store float64 data x as float32, float16 or bfloat16 (uint16 + attr)."""
    opts = dict(chunks=(x.shape[0], min(x.shape[1], 16), x.shape[2]) if x.shape[1] else None,
                compression="gzip" if x.shape[1] else None)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32)
        # round to nearest even on the upper 16 bits (no NaN in fixtures)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        ds = group.create_dataset(name, data=rounded, **opts)
        ds.attrs["dtype"] = "bfloat16"
    else:
        group.create_dataset(name, data=x.astype(dtype), **opts)


def read_float(ds):
    """A float dataset of a dump as float64, decoding bfloat16."""
    if attr_str(ds.attrs.get("dtype", "")) == "bfloat16":
        return (ds[()].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return ds[()].astype(np.float64)


def cmd_valid(a):
    rng = np.random.default_rng(a.seed)
    T, W, D = a.tokens, a.queries, a.head_dim
    outliers = [int(c) for c in a.outlier_channels.split(",")] if a.outlier_channels else []
    with h5py.File(a.out, "w") as f:
        f.attrs["mkv_format"] = "mosaickv-dump"
        f.attrs["mkv_version"] = np.int64(1)
        f.attrs["model"] = "fixture"
        f.attrs["n_layers"] = np.int64(a.layers)
        f.attrs["n_heads"] = np.int64(a.heads)
        f.attrs["n_kv_heads"] = np.int64(a.kv_heads)
        f.attrs["head_dim"] = np.int64(D)
        f.attrs["rope_theta"] = 10000.0
        f.attrs["k_rope"] = "post"
        f.attrs["source"] = "import"
        f.attrs["created_by"] = "tests/data_fixtures.py"
        f.create_dataset("tokens", data=rng.integers(0, 512, T, dtype=np.int32))
        f.create_dataset("query_pos", data=np.linspace(T // 2, T - 1, W).astype(np.int32))
        for layer in range(a.layers):
            g = f.create_group(f"layers/{layer:02d}")
            # a per-layer offset so the mean is not ~0 everywhere
            k = rng.normal(0.1 * layer, 1.0, (a.kv_heads, T, D))
            k[:, :, outliers] *= 20.0
            v = rng.normal(0.0, 0.5, (a.kv_heads, T, D)) * rng.uniform(0.5, 2.0, (1, T, 1))
            q = rng.normal(0.0, 1.0, (a.heads, W, D))
            write_float(g, "k", k, a.dtype)
            write_float(g, "v", v, a.dtype)
            write_float(g, "q", q, a.dtype)


# Each defect rewrites IN (copied to OUT) with h5py.
def defect_version(f):
    f.attrs["mkv_version"] = np.int64(2)


def defect_format(f):
    f.attrs["mkv_format"] = "mosaickv-compressed"


def defect_no_head_dim(f):
    del f.attrs["head_dim"]


def defect_shape(f):
    """k of the last layer loses its last token."""
    name = "layers/%02d/k" % (f.attrs["n_layers"] - 1)
    k = f[name][()]
    attrs = dict(f[name].attrs)
    del f[name]
    ds = f.create_dataset(name, data=k[:, :-1, :])
    ds.attrs.update(attrs)


def defect_nan(f):
    k = f["layers/00/k"]
    x = k[()]
    x[0, 5, 3] = np.nan if k.dtype.kind == "f" else 0x7FC0  # bfloat16 quiet NaN
    k[...] = x


def defect_inf(f):
    v = f["layers/01/v"]
    x = v[()]
    x[1, 2, 0] = -np.inf if v.dtype.kind == "f" else 0xFF80  # bfloat16 -inf
    v[...] = x


def defect_query_pos(f):
    qp = f["query_pos"]
    x = qp[()]
    x[-1] = f["tokens"].shape[0] if "tokens" in f else f["layers/00/k"].shape[1]
    qp[...] = x


def set_query_pos(f, value):
    """The middle query's position becomes value (int32 storage kept)."""
    qp = f["query_pos"]
    x = qp[()]
    x[len(x) // 2] = value
    qp[...] = x


def defect_query_pos_negative(f):
    set_query_pos(f, -5)


def defect_query_pos_max(f):
    set_query_pos(f, np.iinfo(np.int32).max)


def defect_query_pos_huge(f):
    set_query_pos(f, 1 << 30)


def defect_tokens_int64(f):
    """/tokens stored as int64 (what numpy writes by default), one id 2^33."""
    tokens = f["tokens"][()].astype(np.int64)
    tokens[0] = 1 << 33
    del f["tokens"]
    f.create_dataset("tokens", data=tokens)


def defect_rope_inf(f):
    f.attrs["rope_theta"] = np.inf


def claim_tokens(f, name, tokens):
    """name becomes a chunked dataset of `tokens` tokens, none written: what
    one damaged byte of its dimensions looks like."""
    old = f[name]
    shape, dtype, attrs = old.shape, old.dtype, dict(old.attrs)
    del f[name]
    ds = f.create_dataset(name, shape=(shape[0], tokens, shape[2]), dtype=dtype,
                          chunks=(1, 16, shape[2]), compression="gzip")
    ds.attrs.update(attrs)


def defect_huge_k(f):
    claim_tokens(f, "layers/00/k", 1 << 48)


def defect_huge_kv(f):
    """Every k and v claims 2^48 tokens and /tokens is gone: the shapes
    agree with each other, only the file's size gives them away."""
    del f["tokens"]
    for layer in range(int(f.attrs["n_layers"])):
        for tensor in "kv":
            claim_tokens(f, "layers/%02d/%s" % (layer, tensor), 1 << 48)


# Damage to the global heap: a byte-level edit of the file's first global
# heap collection (HDF5 file format, "Global Heap": "GCOL", version, 3
# reserved bytes, the collection's size, then objects of an index, a
# reference count, 4 reserved bytes, a size and the data padded to 8 bytes;
# index 0 is the free space). The string attributes are first made
# variable-length (h5py's default for str), which puts them in the heap.
def vlen_strings(f):
    for name, value in list(f.attrs.items()):
        if isinstance(value, bytes):
            f.attrs[name] = value.decode()


def heap_objects(data):
    """Offset of the first collection and its objects [(offset in it, index, size)]."""
    g = data.find(b"GCOL\x01")
    assert g >= 0, "no global heap collection"
    size = int.from_bytes(data[g + 8:g + 16], "little")
    p, objects = 16, []
    while p + 16 <= size:
        index = int.from_bytes(data[g + p:g + p + 2], "little")
        n = int.from_bytes(data[g + p + 8:g + p + 16], "little")
        objects.append((p, index, n))
        if index == 0:
            break
        p += 16 + (n + 7) // 8 * 8
    return g, size, objects


def set_object_size(data, g, p, n):
    data[g + p + 8:g + p + 16] = n.to_bytes(8, "little")


def heap_loop(data):
    """The free space object's size becomes 0: libhdf5 1.10's loader never
    gets past it."""
    g, _, objects = heap_objects(data)
    p = [o for o in objects if o[1] == 0][0][0]
    set_object_size(data, g, p, 0)


def heap_overrun(data):
    """The first string object claims the whole collection: libhdf5 1.10
    would copy that many bytes into the string's buffer."""
    g, size, objects = heap_objects(data)
    set_object_size(data, g, objects[0][0], size)


def cmd_heap(a):
    """Where a heap defect is: the offsets of the first collection, of its
    first object and of its free space (-1: not reached)."""
    with open(a.file, "rb") as fp:
        data = fp.read()
    g, _, objects = heap_objects(data)
    print(g, objects[0][0], next((o[0] for o in objects if o[1] == 0), -1))


HEAP_DEFECTS = {
    "heap-loop": heap_loop,
    "heap-overrun": heap_overrun,
}


# Damage to a dataset's layout: the data layout message of the first
# chunked dataset of the shape of /layers/00/k (HDF5 file format, "Data
# Layout Message" version 3, class 2 = chunked: version, class,
# dimensionality = rank + 1, the chunk index's address in 8 bytes, then
# the chunk's dimensions and the element size, 4 bytes each). Its last
# chunk dimension grows far beyond the dataset's, the chunk staying under
# 4 GiB, as one damaged byte does: libhdf5 1.10 copied past its buffers
# reading such a dataset (found by tests/fuzz/fuzz_dump).
def chunk_layout(data, chunk, itemsize):
    import struct
    tail = struct.pack("<%dI" % (len(chunk) + 1), *chunk, itemsize)
    head = bytes([3, 2, len(chunk) + 1])
    p = 0
    while True:
        p = data.find(tail, p + 1)
        assert p >= 0, "no layout message of chunk shape %s" % (chunk,)
        if data[p - 11:p - 8] == head:
            return p


def chunk_shape(data, chunk, itemsize):
    p = chunk_layout(data, chunk, itemsize)
    last = p + 4 * (len(chunk) - 1)
    # half of what keeps the chunk under HDF5's own 4 GiB limit, which
    # libhdf5 checks at open
    row = itemsize * int(np.prod(chunk[:-1]))
    data[last:last + 4] = (chunk[-1] + (1 << 32) // row // 2).to_bytes(4, "little")


LAYOUT_DEFECTS = {
    "chunk-shape": chunk_shape,
}


DEFECTS = {
    "version": defect_version,
    "format": defect_format,
    "no-head-dim": defect_no_head_dim,
    "shape": defect_shape,
    "nan": defect_nan,
    "inf": defect_inf,
    "query-pos": defect_query_pos,
    "query-pos-negative": defect_query_pos_negative,
    "query-pos-max": defect_query_pos_max,
    "query-pos-huge": defect_query_pos_huge,
    "tokens-int64": defect_tokens_int64,
    "rope-inf": defect_rope_inf,
    "huge-k": defect_huge_k,
    "huge-kv": defect_huge_kv,
}


def cmd_corrupt(a):
    shutil.copyfile(a.src, a.out)
    with h5py.File(a.out, "r+") as f:
        if a.defect in HEAP_DEFECTS:
            vlen_strings(f)
        elif a.defect in LAYOUT_DEFECTS:
            k = f["layers/00/k"]
            chunk, itemsize = k.chunks, k.dtype.itemsize
        else:
            DEFECTS[a.defect](f)
    if a.defect in HEAP_DEFECTS or a.defect in LAYOUT_DEFECTS:
        with open(a.out, "rb") as fp:
            data = bytearray(fp.read())
        if a.defect in HEAP_DEFECTS:
            HEAP_DEFECTS[a.defect](data)
        else:
            LAYOUT_DEFECTS[a.defect](data, chunk, itemsize)
        with open(a.out, "wb") as fp:
            fp.write(data)


def cmd_foreign(a):
    """Looks like someone's model weights: HDF5, but no mkv_format."""
    with h5py.File(a.out, "w") as f:
        f.attrs["framework"] = "keras"
        f.create_dataset("dense/kernel", data=np.ones((4, 3), dtype=np.float32))


def expected_stats(path, factor):
    """numpy's own rows: {(layer, head, tensor): (tokens, mean, std, absmax,
    rms_median, rms_max, outlier range)}."""
    rows = {}
    with h5py.File(path, "r") as f:
        for layer in range(int(f.attrs["n_layers"])):
            for tensor in "kv":
                x = read_float(f["layers/%02d/%s" % (layer, tensor)])
                for head in range(x.shape[0]):
                    h = x[head]                          # [T, D]
                    rms = np.sqrt(np.mean(h * h, axis=0))
                    median = np.median(rms)
                    # a channel within rounding of the threshold may go either way
                    lo = int(np.sum(rms > factor * median * (1 + 1e-9)))
                    hi = int(np.sum(rms > factor * median * (1 - 1e-9)))
                    rows[(layer, head, tensor)] = (h.shape[0], h.mean(), h.std(),
                                                   np.abs(h).max(), median, rms.max(), (lo, hi))
    return rows


def close(got, want, scale):
    return abs(got - want) <= 1e-5 * max(abs(want), scale)


def cmd_compare_stats(a):
    expected = expected_stats(a.dump, a.factor)
    with open(a.tsv) as fp:
        lines = fp.read().splitlines()
    header = ["layer", "head", "tensor", "tokens", "mean", "std", "absmax",
              "rms_median", "rms_max", "outlier_channels"]
    bad = []
    if not lines or lines[0].split("\t") != header:
        bad.append("header is %r, expected %r" % (lines[0] if lines else "", "\t".join(header)))
    seen = set()
    for line in lines[1:]:
        c = line.split("\t")
        key = (int(c[0]), int(c[1]), c[2])
        if key not in expected:
            bad.append("unexpected row %r" % line)
            continue
        seen.add(key)
        tokens, mean, std, absmax, med, rmax, (lo, hi) = expected[key]
        got = [float(x) for x in c[4:9]]
        checks = [("tokens", int(c[3]) == tokens, tokens),
                  # the mean may be ~0: compare it on the scale of the spread
                  ("mean", close(got[0], mean, 1e-6 * std), mean),
                  ("std", close(got[1], std, 0.0), std),
                  ("absmax", close(got[2], absmax, 0.0), absmax),
                  ("rms_median", close(got[3], med, 0.0), med),
                  ("rms_max", close(got[4], rmax, 0.0), rmax),
                  ("outlier_channels", lo <= int(c[9]) <= hi, lo)]
        for name, ok, want in checks:
            if not ok:
                bad.append("layer %d head %d %s: %s is %s, numpy says %r" %
                           (key[0], key[1], key[2], name, c[header.index(name)], want))
    for key in sorted(set(expected) - seen):
        bad.append("missing row for layer %d head %d %s" % key)
    for b in bad:
        print("compare-stats: %s" % b, file=sys.stderr)
    if not bad:
        print("compare-stats: %d rows match numpy" % len(seen))
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("valid")
    v.add_argument("out")
    v.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    v.add_argument("--layers", type=int, default=2)
    v.add_argument("--heads", type=int, default=4)
    v.add_argument("--kv-heads", type=int, default=2)
    v.add_argument("--head-dim", type=int, default=32)
    v.add_argument("--tokens", type=int, default=40)
    v.add_argument("--queries", type=int, default=3)
    v.add_argument("--seed", type=int, default=1)
    v.add_argument("--outlier-channels", default="")
    c = sub.add_parser("corrupt")
    c.add_argument("src")
    c.add_argument("out")
    c.add_argument("defect", choices=sorted(DEFECTS) + sorted(HEAP_DEFECTS) + sorted(LAYOUT_DEFECTS))
    h = sub.add_parser("heap")
    h.add_argument("file")
    fo = sub.add_parser("foreign")
    fo.add_argument("out")
    s = sub.add_parser("compare-stats")
    s.add_argument("dump")
    s.add_argument("tsv")
    s.add_argument("factor", type=float)
    a = p.parse_args()
    return {"valid": cmd_valid, "corrupt": cmd_corrupt, "heap": cmd_heap, "foreign": cmd_foreign,
            "compare-stats": cmd_compare_stats}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
