#!/bin/sh
# mkv-analyze overlap, segments, spectrum, sparsity and channels against
# numpy (tests/analysis_ref.py recomputes every table from the definitions
# in man/mkv-analyze.1 with h5py + numpy, no libmosaickv code), on dumps
# written by h5py (tests/data_fixtures.py: float32, float16 with its ties,
# bfloat16 with planted outlier channels) and by mkv-capture --synthetic;
# then the ground truth planted in those dumps: outlier key channels found
# by `segments` and `channels`, attention targets seen by `sparsity`.
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
