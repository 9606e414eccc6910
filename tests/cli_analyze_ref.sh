#!/bin/sh
# mkv-analyze overlap, segments, spectrum, sparsity and channels against
# numpy (tests/analysis_ref.py recomputes every table from the definitions
# in man/mkv-analyze.1 with h5py + numpy, no libmosaickv code), on dumps
# written by h5py (tests/data_fixtures.py: float32, float16 with its ties,
# bfloat16 with planted outlier channels) and by mkv-capture --synthetic;
# then the ground truth planted in those dumps: outlier key channels found
# by `segments` and `channels`, attention targets seen by `sparsity`; and
# info and strategies of compressed dumps against h5py's reading
# (tests/strategies_ref.py).
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (a python with h5py and numpy; default /usr/bin/python3).
# Exit: 0 pass, 1 fail, 77 skip (mkv-analyze not built, or no h5py).

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_analyze_ref mkv-analyze
cli_need_h5py
A=$ANALYZE
REF=$top_srcdir/tests/analysis_ref.py

# against_numpy DUMP COMMAND [OPTION...]: the command's table equals numpy's.
against_numpy() {
    dump=$1 cmd=$2
    shift 2
    if "$A" "$cmd" "$@" "$dump" >got.tsv 2>got.err &&
        "$PY" "$REF" "$cmd" "$dump" got.tsv "$@" >ref.out 2>&1; then
        pass
    else
        fail "$cmd $* $dump differs from numpy"
        sed 's/^/    /' got.err ref.out
    fi
}

# ---------------------------------------------------------------- fixtures
# 700 tokens: windows of 256 leave a remainder, segments of 256 a short one.
fixture valid f32.h5 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 700 --queries 5
# float16 values repeat within a vector: the tie rule of top-p selection.
fixture valid f16.h5 --dtype float16 --layers 1 --heads 6 --kv-heads 2 --head-dim 16 \
    --tokens 300 --queries 4 --seed 5
fixture valid bf16.h5 --dtype bfloat16 --outlier-channels 3,17 --tokens 512 --seed 3
if [ -x "$CAPTURE" ] && "$CAPTURE" --synthetic --tokens 1K --queries 8 -o syn.h5 2>capture.err; then
    dumps="f32.h5 f16.h5 bf16.h5 syn.h5"
else
    echo "SKIP: the synthetic dump (mkv-capture --synthetic unavailable)"
    dumps="f32.h5 f16.h5 bf16.h5"
fi

# ---------------------------------------------------------------- every command against numpy
for dump in $dumps; do
    for cmd in overlap segments spectrum sparsity channels; do
        against_numpy $dump $cmd
    done
done
against_numpy f32.h5 overlap --keep 0.5 --lengths 100,350
against_numpy f32.h5 overlap --keep 0.1 --lengths 700,64 --prefix
against_numpy f16.h5 overlap --keep 0.3 --lengths 50
against_numpy f32.h5 segments --segment 100 --outlier-factor 3 --top 4
against_numpy f16.h5 segments --segment 1K --outlier-factor 1.5 --top 16
against_numpy f32.h5 spectrum --segment 300 --energy 0.5,0.999,1
against_numpy f32.h5 spectrum --segment 256 --full
against_numpy f16.h5 sparsity --fractions 0.5,0.02,1
against_numpy f32.h5 channels --top 3 --shares 0.1,0.75,1
against_numpy f32.h5 channels --full
if [ -f syn.h5 ]; then
    against_numpy syn.h5 overlap --keep 0.125 --lengths 128,512
    against_numpy syn.h5 spectrum --segment 256 --energy 0.8
fi

# ---------------------------------------------------------------- stdin gives the same table
"$A" overlap f32.h5 >file.tsv 2>/dev/null
if "$A" overlap - <f32.h5 >stdin.tsv 2>stdin.err && cmp -s file.tsv stdin.tsv; then
    pass
else
    fail "overlap of stdin differs from overlap of the file"
    sed 's/^/    /' stdin.err
fi

# ---------------------------------------------------------------- compressed dumps against h5py
# info of every kind of compressed dump, and the strategies table of mosaic
# and uniform2d dumps with several segments per head (tests/strategies_ref.py):
# with observation queries and without (output_loss NaN), rotated and not,
# groups of 2, r = d' (no bitmap), keydim above d'.
# against_h5py DUMP info|strategies: the command's output equals h5py's reading.
against_h5py() {
    if "$A" "$2" "$1" >got.out 2>got.err && "$PY" "$SREF" "$2" "$1" got.out >ref.out 2>&1; then
        pass
    else
        fail "$2 $1 differs from h5py"
        sed 's/^/    /' got.err ref.out
    fi
}
SREF=$top_srcdir/tests/strategies_ref.py
if [ -x "$CAPTURE" ] && [ -x "$COMPRESS" ] &&
    "$CAPTURE" --synthetic --tokens 1500 --head-dim 32 --heads 4 --kv-heads 2 --layers 2 --queries 6 \
        -o q.h5 -q 2>capture.err &&
    "$CAPTURE" --synthetic --tokens 700 --head-dim 16 --heads 2 --kv-heads 1 --layers 1 --queries 0 \
        -o noq.h5 -q 2>capture.err; then
    n=0
    while read -r raw method params; do
        n=$((n + 1))
        if ! "$COMPRESS" "$raw" -m "$method" ${params:+-P "$params"} -o c$n.h5 -q 2>compress.err; then
            fail "mkv-compress $raw -m $method -P $params"
            sed 's/^/    /' compress.err
            continue
        fi
        against_h5py c$n.h5 info
        case $method in mosaic | uniform2d) against_h5py c$n.h5 strategies ;; esac
    done <<'CASES'
q.h5 mosaic segment=512
q.h5 mosaic strategy=fixed,segment=300,group=2
q.h5 mosaic strategy=dynamic,rotate=off,segment=256
q.h5 uniform2d segment=400
noq.h5 mosaic segment=256,sink=0,recent=0
q.h5 mosaic segment=400,quantize=on,ratio=6
q.h5 mosaic strategy=fixed,bits=4,keep=0.5,segment=300,budget=1
q.h5 turboquant
q.h5 kivi bits=2
q.h5 full
CASES
    # standard input and -o give the same text
    if "$A" info - <c1.h5 >stdin.txt 2>stdin.err && "$PY" "$SREF" info c1.h5 stdin.txt - >ref.out 2>&1; then
        pass
    else
        fail "info of a compressed dump on stdin differs from h5py"
        sed 's/^/    /' stdin.err ref.out
    fi
    "$A" strategies c1.h5 >file.tsv 2>/dev/null
    if "$A" strategies -o out.tsv - <c1.h5 2>out.err && [ ! -s out.err ] && cmp -s file.tsv out.tsv; then
        pass
    else
        fail "strategies -o out.tsv of stdin differs from strategies to stdout"
        sed 's/^/    /' out.err
    fi
else
    echo "SKIP: compressed dumps (mkv-capture --synthetic or mkv-compress unavailable)"
fi

# ---------------------------------------------------------------- planted ground truth
# bf16.h5: key channels 3 and 17 are 20x the others in every head, queries
# are isotropic: both statistics must name exactly those two channels.
"$A" segments --top 2 bf16.h5 >seg.tsv 2>seg.err
wrong=$(awk -F'\t' 'NR > 1 && $3 == "k" && $12 != "3,17" && $12 != "17,3"' seg.tsv)
if [ -s seg.tsv ] && [ -z "$wrong" ]; then
    pass
else
    fail "segments --top 2: key segments whose top channels are not {3,17}:"
    printf '%s\n' "$wrong" | sed 's/^/    /'
    sed 's/^/    /' seg.err
fi
"$A" channels --top 2 bf16.h5 >chan.tsv 2>chan.err
wrong=$(awk -F'\t' 'NR > 1 && $5 != "3,17" && $5 != "17,3"' chan.tsv)
if [ -s chan.tsv ] && [ -z "$wrong" ]; then
    pass
else
    fail "channels --top 2: heads whose best channels are not {3,17}:"
    printf '%s\n' "$wrong" | sed 's/^/    /'
    sed 's/^/    /' chan.err
fi
# syn.h5: each query puts attn_mass = 0.8 of its softmax on at most 4
# planted targets; the top 1% (11 of ~1K tokens) holds at least that.
if [ -f syn.h5 ]; then
    "$A" sparsity syn.h5 >sp.tsv 2>sp.err
    wrong=$(awk -F'\t' 'NR > 1 && $5 < 0.8' sp.tsv)
    if [ -s sp.tsv ] && [ -z "$wrong" ]; then
        pass
    else
        fail "sparsity: query heads whose top-1% mass is below the planted 0.8:"
        printf '%s\n' "$wrong" | sed 's/^/    /'
        sed 's/^/    /' sp.err
    fi
fi

cli_finish
