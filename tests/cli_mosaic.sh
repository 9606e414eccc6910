#!/bin/sh
# End-to-end test of the methods "mosaic" and "uniform2d" through
# mkv-compress and mkv-attend on a synthetic dump: every compressed file is
# checked against its raw dump by tests/mosaic_ref.py (h5py/numpy: byte
# accounting, table tiling, rotations, packed values, bitmaps, block keys,
# losses); nothing dropped (keep=1, energy=1, budget=1) must give exact
# attention to fp16 precision; strategy=ratio must land at its ratio (at
# most 5% above); a corrupt bitmap is refused at load (exit 1, one exact
# line); bad parameters exit 2 with a message naming them and leave no
# output.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (default /usr/bin/python3). Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_mosaic mkv-compress mkv-attend mkv-capture
REF=$top_srcdir/tests/mosaic_ref.py
for m in mosaic uniform2d; do
    if ! "$COMPRESS" --list-methods 2>/dev/null | grep -q "^$m\b"; then
        echo "cli_mosaic: SKIP: method $m is not registered (lib/methods/registry.c)"
        exit 77
    fi
done
cli_need_h5py

"$CAPTURE" --synthetic --tokens 1500 --head-dim 32 --heads 4 --kv-heads 2 --layers 2 \
    --queries 6 --dtype f32 -o raw.h5 -q || { echo "FAIL: mkv-capture"; exit 1; }

# method and parameters, one case a line
while read -r method params; do
    set -- $params
    args=
    for kv in "$@"; do args="$args -P $kv"; done
    if ! "$COMPRESS" raw.h5 -o c.h5 --method "$method" $args -q; then
        fail "mkv-compress --method $method $params"
        continue
    fi
    "$PY" "$REF" raw.h5 c.h5 >ref.out || fail "$method $params: $(cat ref.out)"
    "$ATTEND" c.h5 --summary -q >sum.tsv || fail "mkv-attend on $method $params"
done <<'CASES'
mosaic
mosaic strategy=dynamic
mosaic strategy=dynamic threshold=0.3 bound=0 agg=sum
mosaic strategy=fixed
mosaic strategy=fixed group=2 keep=0.375 energy=0.8
mosaic strategy=fixed rotate=off group=4
mosaic rotate=off segment=300
mosaic segment=256 block=16 ratio=2 sink=0 recent=0
mosaic keydim=1 bound=4 ratio=4
mosaic recent=2000
mosaic strategy=fixed bits=4 keep=0.5
mosaic strategy=fixed bits=2 keep=1 energy=0.6
mosaic strategy=fixed bits=8 group=2 keep=0.25 rotate=off
mosaic quantize=on ratio=6 segment=400
mosaic quantize=on ratio=6 segment=400 qgroup=50
mosaic strategy=fixed bits=4 keep=1 qgroup=100
mosaic strategy=fixed keep=0.25 dprime=0.5 block=8 budget=0.1
mosaic quantize=on strategy=dynamic threshold=0.05
mosaic budget=1 ratio=5 quantize=on
mosaic budget=1 strategy=fixed rotate=off
uniform2d
uniform2d keep=0.5 segment=500 keydim=0.25 bound=0
CASES

# narrow heads with observation queries: keeping 2 of 8 rotated channels
# can put every kept-element score of a segment far below the exact
# maximum; the measured output loss must still be finite (and checked)
"$CAPTURE" --synthetic --tokens 1024 --head-dim 8 --queries 16 --dtype f32 -o narrow.h5 -q ||
    fail "mkv-capture --head-dim 8"
for method in uniform2d mosaic; do
    if "$COMPRESS" narrow.h5 -o n.h5 --method $method -q; then
        "$PY" "$REF" narrow.h5 n.h5 >ref.out || fail "$method at head_dim 8: $(cat ref.out)"
    else
        fail "mkv-compress --method $method at head_dim 8"
    fi
done

# the byte budget: logical / physical at or just above the ratio asked
# with fp16 candidates, whose loss falls with every byte added; with the
# quantized ones at or above it (8-bit codes can leave nothing to gain
# from more bytes: the rule then stops short of the budget)
for want in 2 3 5; do
    for quantize in off on; do
        "$COMPRESS" raw.h5 -o r.h5 --method mosaic -P ratio=$want -P quantize=$quantize -q ||
            fail "mkv-compress ratio=$want quantize=$quantize"
        got=$("$ATTEND" r.h5 --summary -q | awk -F'\t' 'NR == 2 { print $4 }')
        awk -v g="$got" -v w="$want" -v q=$quantize 'BEGIN { exit !(g != "" && g >= w && (q == "on" || g <= 1.05 * w)) }' ||
            fail "ratio=$want quantize=$quantize: the file's ratio is $got"
    done
done

# the paper's 2-D form: r = head_dim/4 of d' = head_dim/2 rotated channels
# in every segment of K and V
"$COMPRESS" raw.h5 -o paper.h5 --method mosaic -P strategy=fixed,keep=0.25,dprime=0.5 -q ||
    fail "mkv-compress dprime=0.5"
"$PY" - <<'PY' || fail "dprime=0.5: r and d' are not head_dim/4 and head_dim/2"
import sys, h5py
with h5py.File("paper.h5", "r") as f:
    d = int(f.attrs["head_dim"])
    rows = [r for l in f["layers"].values() for h in l.values() for x in "kv" for r in h[x + "/strategy"][...]]
    sys.exit(not rows or any((int(r[3]), int(r[5])) != (d // 4, d // 2) for r in rows))
PY

# per-head token budgets: the stored shares match a numpy re-planning
# from the raw dump's queries (tests/head_budget_ref.py), every stored byte
# is counted, a budget given as a token count plans none, and a damaged
# share is refused at load
"$COMPRESS" raw.h5 -o hb.h5 --method mosaic -P headbudget=on,budget=0.1 -q || fail "mkv-compress headbudget=on"
"$PY" "$REF" raw.h5 hb.h5 >ref.out || fail "headbudget=on: $(cat ref.out)"
"$PY" "$top_srcdir/tests/head_budget_ref.py" raw.h5 hb.h5 0.1 0.025 4 64 >hbref.out ||
    fail "headbudget=on: $(cat hbref.out)"
"$ATTEND" hb.h5 --summary -q >/dev/null || fail "mkv-attend on headbudget=on"
"$COMPRESS" raw.h5 -o hbc.h5 --method mosaic -P headbudget=on,budget=200 -q || fail "mkv-compress headbudget=on budget=200"
"$PY" - <<'PY' || fail "budget=200: per-head shares stored"
import sys, h5py
with h5py.File("hbc.h5", "r") as f:
    sys.exit(any("budget_scale" in h for l in f["layers"].values() for h in l.values()))
PY
"$PY" -c 'import h5py; h5py.File("hb.h5", "r+")["layers/01/00/budget_scale"][0] = -2' || fail "damaging budget_scale"
"$ATTEND" hb.h5 --summary >hb.out 2>hb.err
status=$?
want="mkv-attend: 'hb.h5': layer 1, KV head 0: array 'budget_scale': -2 is not a positive multiple of the budget"
[ $status -eq 1 ] || fail "damaged budget_scale: exit $status, not 1"
[ "$(cat hb.err)" = "$want" ] || fail "damaged budget_scale: stderr '$(cat hb.err)', expected '$want'"

# nothing dropped, every token attended: exact attention up to fp16
"$COMPRESS" raw.h5 -o full.h5 --method mosaic -P strategy=fixed,keep=1,energy=1,budget=1 -q || fail "mkv-compress keep=1"
err=$("$ATTEND" full.h5 --summary -q | awk -F'\t' 'NR == 2 { print $8 }')
awk -v e="$err" 'BEGIN { exit !(e != "" && e < 5e-3) }' || fail "keep=1 budget=1: rel_l2_mean $err"

# a corrupt bitmap (one kept group of the first compressed key of layer 1,
# KV head 1 cleared) is refused at load: exit 1, one line naming the file,
# layer, head and array, with the counts worked out here from the file
"$COMPRESS" raw.h5 -o bitmap.h5 --method mosaic -P strategy=fixed,energy=1 -q ||
    fail "mkv-compress energy=1"
want=$("$PY" - <<'PY'
import h5py
with h5py.File("bitmap.h5", "r+") as f:
    start, length, rotate, r, g, dprime, pervector = (int(x) for x in f["layers/01/01/k/strategy"][0][:7])
    bitmap = f["layers/01/01/k/bitmap"]
    nbytes = (dprime // g + 7) // 8
    first = int(bitmap[0])
    bitmap[0] = first & (first - 1)
    kept = sum(bin(int(b)).count("1") for b in bitmap[0:nbytes])
    print("mkv-attend: 'bitmap.h5': layer 1, KV head 1: array 'k/bitmap': token %d "
          "(segment 0) keeps %d of %d groups, the strategy keeps r/g = %d" % (start, kept, dprime // g, r // g))
PY
)
"$ATTEND" bitmap.h5 --summary >bitmap.out 2>bitmap.err
status=$?
[ $status -eq 1 ] || fail "corrupt bitmap: exit $status, not 1"
[ "$(cat bitmap.err)" = "$want" ] || fail "corrupt bitmap: stderr '$(cat bitmap.err)', expected '$want'"
[ ! -s bitmap.out ] || fail "corrupt bitmap: wrote a table"

# every token attended (budget=1): no block keys are stored, and with
# nothing else dropped attention is exact to fp16 precision
"$COMPRESS" raw.h5 -o all.h5 --method mosaic -P budget=1,strategy=fixed,keep=1,energy=1 -q ||
    fail "mkv-compress budget=1"
"$PY" - <<'PY' || fail "budget=1: block keys stored"
import sys, h5py
with h5py.File("all.h5", "r") as f:
    for l in f["layers"]:
        for h in f["layers"][l]:
            g = f["layers"][l][h]
            if "k/blockkeys" in g or (g["k/blockdims"][...] != 0).any():
                sys.exit(1)
PY
err=$("$ATTEND" all.h5 --summary -q | awk -F'\t' 'NR == 2 { print $8 }')
awk -v e="$err" 'BEGIN { exit !(e != "" && e < 5e-3) }' || fail "budget=1 keep=1: rel_l2_mean $err"

# damaged quantized values are refused at load (exit 1, one line naming
# the array): a negative step, and a set pad bit (r = 3 codes of 2 bits
# leave 2 pad bits per vector)
"$COMPRESS" raw.h5 -o q.h5 --method mosaic -P strategy=fixed,bits=2,keep=0.09,energy=1 -q ||
    fail "mkv-compress bits=2"
for damage in step pad; do
    cp q.h5 qd.h5
    DAMAGE=$damage "$PY" - <<'PY'
import os, h5py
with h5py.File("qd.h5", "r+") as f:
    g = f["layers/01/01"]
    if os.environ["DAMAGE"] == "step":
        q = g["v/qparams"]
        q[3] = -1.0
    else:
        c = g["k/codes"]
        c[0] = int(c[0]) | 0x80
PY
    "$ATTEND" qd.h5 --summary >qd.out 2>qd.err
    status=$?
    case $damage in
    step) want="mkv-attend: 'qd.h5': layer 1, KV head 1: array 'v/qparams': segment 0, token group 0, channel 1: negative step -1" ;;
    pad) want="mkv-attend: 'qd.h5': layer 1, KV head 1: array 'k/codes': token 4 (segment 0) sets pad bits" ;;
    esac
    [ $status -eq 1 ] || fail "damaged $damage: exit $status, not 1"
    [ "$(cat qd.err)" = "$want" ] || fail "damaged $damage: stderr '$(cat qd.err)', expected '$want'"
    [ ! -s qd.out ] || fail "damaged $damage: wrote a table"
done

# bad parameters: exit 2, a message naming the parameter, no output file
# (parameters separated by commas, then words the message must hold)
while read -r param words; do
    "$COMPRESS" raw.h5 -o bad.h5 --method mosaic -P strategy=fixed -P "$param" 2>err.txt
    status=$?
    [ $status -eq 2 ] || fail "$param: exit $status, not 2"
    grep -q "$words" err.txt || fail "$param: message '$(cat err.txt)' lacks '$words'"
    [ ! -e bad.h5 ] || fail "$param: left an output file"
done <<'BAD'
keep=1.5 keep
block=0 block
segment=4 smaller than block
budget=5000 larger than the context
group=3 group
group=4,keep=0.2 does not divide r = 7
bound=20 larger than the 16 block-key channels
keydim=0 keydim
ratio=0.5 ratio
bits=3 bits
quantize=maybe quantize
strategy=greedy strategy
BAD

if [ $failed -gt 0 ]; then
    echo "cli_mosaic: $failed failure(s)"
    exit 1
fi
echo "cli_mosaic: ok"
exit 0
