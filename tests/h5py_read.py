"""Independent checks of mosaickv dumps with h5py and numpy.

  h5py_read.py check-import DUMP NPY DTYPE   dump made by mkv-capture --import from NPY
  h5py_read.py write-dump OUT                write a dump v1 with h5py alone
"""
import sys

import h5py
import numpy as np


def bf16_round(x):
    """float32 -> bfloat16 (round to nearest even) -> float32, in numpy."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def attr_str(a, name):
    """A string attribute as mosaickv writes it: fixed-length (h5py gives
    numpy.bytes_), never variable-length (str, in the global heap)."""
    v = a[name]
    assert isinstance(v, bytes), (name, type(v), "expected a fixed-length string")
    return v.decode()


def check_import(dump, npy, dtype):
    src = np.load(npy)                      # [L, 2, kvh, T, d]
    L, _, kvh, T, d = src.shape
    with h5py.File(dump, "r") as f:
        a = f.attrs
        assert attr_str(a, "mkv_format") == "mosaickv-dump", a["mkv_format"]
        assert int(a["mkv_version"]) == 1
        for name, want in (("n_layers", L), ("n_kv_heads", kvh), ("head_dim", d)):
            assert int(a[name]) == want, (name, a[name], want)
        assert int(a["n_heads"]) % kvh == 0
        assert attr_str(a, "k_rope") in ("post", "pre")
        assert attr_str(a, "source") == "import", a["source"]
        for key in ("model", "created_by"):
            attr_str(a, key)
        assert "rope_theta" in a
        assert f["query_pos"].dtype == np.int32
        for l in range(L):
            for i, kind in enumerate("kv"):
                ds = f[f"layers/{l:02d}/{kind}"]
                assert ds.shape == (kvh, T, d), ds.shape
                assert ds.chunks is not None and ds.chunks[0] == 1 and ds.chunks[2] == d, ds.chunks
                assert ds.compression == "gzip", ds.compression
                x = src[l, i]
                if dtype == "f32":
                    assert ds.dtype == np.float32
                    want = x.astype(np.float32)
                    got = ds[...]
                elif dtype == "f16":
                    assert ds.dtype == np.float16
                    want = x.astype(np.float32).astype(np.float16).astype(np.float32)
                    got = ds[...].astype(np.float32)
                else:
                    assert ds.dtype == np.uint16 and attr_str(ds.attrs, "dtype") == "bfloat16"
                    want = bf16_round(x)
                    got = (ds[...].astype(np.uint32) << 16).view(np.float32)
                assert np.array_equal(got, want), (l, kind, np.abs(got - want).max())
            q = f[f"layers/{l:02d}/q"]
            assert q.shape[0] == int(a["n_heads"]) and q.shape[2] == d
    print(f"ok: {dump} matches {npy} as {dtype}")


def write_dump(out):
    rng = np.random.default_rng(5)
    L, H, KVH, T, W, D = 2, 4, 2, 50, 3, 16
    with h5py.File(out, "w") as f:
        f.attrs["mkv_format"] = "mosaickv-dump"
        f.attrs["mkv_version"] = np.int32(1)
        f.attrs["model"] = "h5py-written"
        for k, v in (("n_layers", L), ("n_heads", H), ("n_kv_heads", KVH), ("head_dim", D)):
            f.attrs[k] = np.int32(v)
        f.attrs["rope_theta"] = 500000.0
        f.attrs["k_rope"] = "post"
        f.attrs["source"] = "capture"
        f.attrs["created_by"] = "tests/h5py_read.py"
        f["tokens"] = rng.integers(0, 1000, T).astype(np.int32)
        f["query_pos"] = np.arange(T - W, T, dtype=np.int32)
        for l in range(L):
            g = f.create_group(f"layers/{l:02d}")
            g["k"] = rng.standard_normal((KVH, T, D)).astype(np.float16)
            g["v"] = rng.standard_normal((KVH, T, D)).astype(np.float16)
            g["q"] = rng.standard_normal((H, W, D)).astype(np.float16)


if __name__ == "__main__":
    if sys.argv[1] == "check-import":
        check_import(*sys.argv[2:5])
    elif sys.argv[1] == "write-dump":
        write_dump(sys.argv[2])
    else:
        sys.exit("unknown command " + sys.argv[1])
