#!/bin/sh
# Golden CLI test of mkv-capture: a small synthetic dump written to a file
# and through a pipe, byte-identical for the same seed (cmp), different for
# another; the refusal of binary output to a terminal (the other misuses
# are the golden transcript tests/cli/mkv-capture.t); and, with h5py
# (an HDF5 reader that shares no code with libmosaickv), the layout and
# attributes of DESIGN.md section 4 and the planted statistics recomputed
# in numpy.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (a python with h5py and numpy; default /usr/bin/python3).
# Exit: 0 pass, 1 fail, 77 skip (mkv-capture not built).

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_capture mkv-capture

SMALL="--synthetic --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 300 --queries 6 --seed 5"

# ---------------------------------------------------------------- output
expect "write a file" 0 '*' '' "$CAPTURE" $SMALL -o a.h5
expect "write again" 0 '*' '' "$CAPTURE" $SMALL -o b.h5
if cmp -s a.h5 b.h5; then pass; else fail "same seed, different files"; fi

# stdout through a pipe (an in-memory image written at the end)
if "$CAPTURE" $SMALL -o - 2>pipe.err | cat >pipe.h5 && [ ! -s pipe.err ]; then pass
else fail "writing to a pipe: $(cat pipe.err)"; fi
if cmp -s a.h5 pipe.h5; then pass; else fail "the pipe gave other bytes than the file"; fi

expect "another seed" 0 '*' '' "$CAPTURE" $SMALL --seed 6 -o c.h5
if cmp -s a.h5 c.h5; then fail "seeds 5 and 6 gave the same file"; else pass; fi

# the model parameters of the synthetic_params attribute are accepted back
expect "--param" 0 '*' '' "$CAPTURE" $SMALL --param 'rank=4 noise=0.05' --param attn_mass=0.9 -o p.h5
# -P is --param, and takes the assignments as a comma list too
expect "-P comma list" 0 '*' '' "$CAPTURE" $SMALL -P rank=4,noise=0.05 -P attn_mass=0.9 -o pc.h5
if cmp -s p.h5 pc.h5; then pass; else fail "-P rank=4,noise=0.05 gave other bytes than --param 'rank=4 noise=0.05'"; fi
expect "-P mixed separators" 0 '*' '' "$CAPTURE" $SMALL -P 'rank=4, noise=0.05,attn_mass=0.9' -o pm.h5
if cmp -s p.h5 pm.h5; then pass; else fail "-P 'rank=4, noise=0.05,attn_mass=0.9' gave other bytes"; fi

expect "--help" 0 '*' '' "$CAPTURE" --help
if head -n 1 got.out | grep -q '^Usage: mkv-capture MODEL '; then pass
else fail "--help: unexpected first line: $(head -n 1 got.out)"; fi
expect "--version" 0 '*' '' "$CAPTURE" --version
if head -n 1 got.out | grep -q '^mkv-capture (mosaickv) [0-9]'; then pass
else fail "--version: unexpected first line: $(head -n 1 got.out)"; fi

if [ -x "$ANALYZE" ]; then
    if "$CAPTURE" $SMALL -o - | "$ANALYZE" check - >check.out 2>&1 &&
       [ "$(cat check.out)" = "(stdin): ok" ]; then pass
    else fail "mkv-capture -o - | mkv-analyze check -: $(cat check.out)"; fi
fi

# ---------------------------------------------------------------- misuse
# Each misuse's exact stderr and exit status: the golden transcript
# tests/cli/mkv-capture.t.
P=mkv-capture

# binary output to a terminal (needs script(1) for a pseudo-terminal)
if command -v script >/dev/null 2>&1 &&
   script -qec "'$CAPTURE' --synthetic --tokens 16 -o - 2>tty.err" /dev/null >/dev/null 2>&1
then
    fail "binary output to a terminal was not refused"
elif [ -f tty.err ]; then
    if [ "$(cat tty.err)" = "$P: refusing to write binary output to a terminal (use -o FILE or a pipe)" ]
    then pass; else fail "terminal: unexpected message: $(cat tty.err)"; fi
else
    echo "note: no script(1) or no pseudo-terminal: terminal refusal not tested"
fi

# ---------------------------------------------------------------- h5py
if "$PY" -c 'import h5py, numpy' 2>/dev/null; then
    expect "bf16, no deflate, chunk 100" 0 '*' '' "$CAPTURE" $SMALL --dtype bf16 --deflate 0 --chunk 100 -o bf.h5
    if "$PY" - a.h5 bf.h5 pc.h5 <<'EOF'
import sys
import h5py
import numpy as np

def fail(msg):
    print("FAIL: h5py: " + msg)
    sys.exit(1)

def check(path, dtype, compressed, chunk):
    f = h5py.File(path, "r")
    a = f.attrs
    want = {"mkv_format": "mosaickv-dump", "mkv_version": 1, "model": "synthetic",
            "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32,
            "rope_theta": 10000.0, "k_rope": "post", "source": "synthetic"}
    for k, v in want.items():
        if k not in a:
            fail("%s: missing attribute %s" % (path, k))
        got = a[k].decode() if isinstance(a[k], bytes) else a[k]
        if got != v:
            fail("%s: %s = %r, expected %r" % (path, k, got, v))
    for k in ("mkv_version", "n_layers", "n_heads", "n_kv_heads", "head_dim"):
        if not np.issubdtype(np.asarray(a[k]).dtype, np.integer):
            fail("%s: %s is not an integer" % (path, k))
    if not np.issubdtype(np.asarray(a["rope_theta"]).dtype, np.floating):
        fail("rope_theta is not a float")
    cb = a["created_by"]
    cb = cb.decode() if isinstance(cb, bytes) else cb
    if not cb.startswith("mosaickv") or ":" in cb:
        fail("created_by %r (no timestamps allowed)" % cb)
    if "tokens" in f:
        fail("a synthetic dump has /tokens")
    qp = f["query_pos"]
    if qp.dtype != np.int32 or list(qp[:]) != list(range(294, 300)):
        fail("query_pos %r %r" % (qp.dtype, qp[:]))
    for l in range(2):
        for kind, shape in (("k", (2, 300, 32)), ("v", (2, 300, 32)), ("q", (4, 6, 32))):
            ds = f["layers/%02d/%s" % (l, kind)]
            if ds.shape != shape:
                fail("%s: shape %r, expected %r" % (ds.name, ds.shape, shape))
            if ds.dtype != dtype:
                fail("%s: dtype %r, expected %r" % (ds.name, ds.dtype, dtype))
            if dtype == np.uint16 and ds.attrs.get("dtype") not in ("bfloat16", b"bfloat16"):
                fail("%s: uint16 without dtype=bfloat16" % ds.name)
            if (ds.compression == "gzip") != compressed:
                fail("%s: compression %r" % (ds.name, ds.compression))
            if kind != "q" and ds.chunks != (1, chunk, 32):
                fail("%s: chunks %r" % (ds.name, ds.chunks))
    return f

f = check(sys.argv[1], np.float16, True, 300)
check(sys.argv[2], np.uint16, False, 100)

# what -P rank=4,noise=0.05 -P attn_mass=0.9 set, as h5py reads it back
sp = h5py.File(sys.argv[3], "r").attrs["synthetic_params"]
sp = dict(kv.split("=") for kv in (sp.decode() if isinstance(sp, bytes) else sp).split())
if (sp["rank"], sp["noise"], sp["attn_mass"]) != ("4", "0.05", "0.9"):
    fail("-P: synthetic_params %r" % sp)

# statistics of the model, recomputed from the file
sp = f.attrs["synthetic_params"]
sp = dict(kv.split("=") for kv in (sp.decode() if isinstance(sp, bytes) else sp).split())
if sp["seed"] != "5":
    fail("synthetic_params %r" % sp)
for l in range(2):
    k = f["layers/%02d/k" % l][:].astype(np.float64)
    q = f["layers/%02d/q" % l][:].astype(np.float64)
    for h in range(2):
        m = np.abs(k[h]).mean(axis=0)
        ratio = np.sort(m)[::-1] / np.median(m)
        # outliers=4 at most head_dim/4 = 8: the 4 largest stand out
        if ratio[3] < 4:
            fail("layer %d head %d: 4th largest channel only %.2fx the median" % (l, h, ratio[3]))
    for hq in range(4):
        for w, p in enumerate(range(294, 300)):
            s = k[hq // 2, :p + 1] @ q[hq, w] / np.sqrt(32)
            e = np.exp(s - s.max())
            e /= e.sum()
            top = np.sort(e)[::-1][:4].sum()   # targets=4
            if top < 0.75:
                fail("layer %d head %d query %d: top-4 mass %.3f" % (l, hq, w, top))
EOF
    then pass; else failed=$((failed + 1)); fi
else
    echo "note: no python with h5py and numpy: layout checks skipped"
fi

cli_finish
