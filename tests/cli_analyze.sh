#!/bin/sh
# CLI test of mkv-analyze's errors (and of mkv-capture's refusal to write
# binary output to a terminal): for every bad input that needs h5py's damaged
# fixtures, or whose answer depends on the dump, the exact stderr, the exact
# stdout where there is one, and the exit status (the unreadable files and
# usage errors are the golden transcript tests/cli/mkv-analyze.t); then `stats` checked
# against numpy on dumps written by h5py (tests/data_fixtures.py), which
# shares no code with libmosaickv. The analyses' numbers are checked
# against numpy by tests/cli_analyze_ref.sh.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (a python with h5py and numpy; default /usr/bin/python3).
# Without h5py the cases that need its fixtures are skipped with a message;
# without mkv-capture, the terminal case. Exit: 0 pass, 1 fail, 77 skip
# (mkv-analyze not built).

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_analyze mkv-analyze
if [ $have_h5py = 0 ]; then
    echo "SKIP: cases needing h5py fixtures (no python with h5py and numpy; set PYTHON_H5PY)"
fi

E=mkv-analyze
A=$ANALYZE

# ---------------------------------------------------------------- fixtures
# A valid dump of known shape: written by h5py (independent of our writer)
# or, without h5py, by mkv-capture.
if [ $have_h5py = 1 ]; then
    fixture valid good.h5 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 40 --queries 3
    fixture foreign foreign.h5
    for defect in version format no-head-dim shape nan inf query-pos; do
        fixture corrupt good.h5 $defect.h5 $defect
    done
elif [ -x "$CAPTURE" ]; then
    "$CAPTURE" --synthetic --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 40 \
        --queries 3 -o good.h5 || { echo "FAIL: mkv-capture --synthetic"; exit 1; }
fi
if [ ! -f good.h5 ]; then
    echo "SKIP: cases needing a valid dump (neither h5py nor mkv-capture)"
fi

# The unreadable files and the usage errors (fixed text, whatever the
# dump) are the golden transcript tests/cli/mkv-analyze.t.

# ---------------------------------------------------------------- binary output to a terminal
# script(1) gives the command a pseudo-terminal as stdout (and stderr: the
# two arrive merged, with CR LF line ends).
if [ ! -x "$CAPTURE" ]; then
    echo "SKIP: output to a terminal ($CAPTURE is not built)"
elif ! command -v script >/dev/null 2>&1; then
    echo "SKIP: output to a terminal (no script(1) to make one)"
else
    script -qec "'$CAPTURE' --synthetic -o -" /dev/null </dev/null >tty.raw 2>&1
    status=$?
    tr -d '\r' <tty.raw >tty.out
    printf '%s\n' "mkv-capture: refusing to write binary output to a terminal (use -o FILE or a pipe)" >tty.want
    if [ $status -eq 2 ] && cmp -s tty.want tty.out; then
        pass
    else
        echo "FAIL: mkv-capture -o - to a terminal: exit status $status, expected 2; output:"
        diff -u tty.want tty.out | sed '1,2d; s/^/    /'
        failed=$((failed + 1))
    fi
fi

# ---------------------------------------------------------------- a valid dump
if [ -f good.h5 ]; then
    expect "check valid" 0 'good.h5: ok' '' $A check good.h5
    expect "check valid -q" 0 '' '' $A check -q good.h5
    STDIN=good.h5 expect "check valid stdin" 0 '(stdin): ok' '' $A check -
    expect "info valid" 0 '*' '' $A info good.h5
    expect "stats valid" 0 '*' '' $A stats good.h5
    STDIN=good.h5 expect "stats from stdin" 0 "$("$A" stats good.h5)" '' $A stats -
    for cmd in overlap segments spectrum sparsity channels; do
        expect "$cmd valid" 0 '*' '' $A $cmd good.h5
    done
    # limits that depend on the dump: a runtime refusal, still exit 2
    expect "overlap --lengths beyond T" 2 '' \
        "$E: --lengths 4096 is longer than the context of 'good.h5' (40 tokens)" \
        $A overlap --lengths 4K good.h5
    expect "segments --top beyond head_dim" 2 '' "$E: --top 33 is more than head_dim (32)" \
        $A segments --top 33 good.h5
    expect "channels --top beyond head_dim" 2 '' "$E: --top 100 is more than head_dim (32)" \
        $A channels --top 100 good.h5
fi

# Everything below needs the h5py fixtures.
if [ $have_h5py = 0 ]; then
    cli_finish
    exit
fi

# ---------------------------------------------------------------- check: one line per problem
expect "check foreign HDF5" 1 'foreign.h5: not a mosaickv dump: no mkv_format attribute' '' \
    $A check foreign.h5
expect "check other mkv_format" 1 \
    "format.h5: mkv_format is 'mosaickv-compressed', expected 'mosaickv-dump'" '' $A check format.h5
expect "check wrong version" 1 \
    'version.h5: unsupported mkv_version 2 (this build reads version 1)' '' $A check version.h5
expect "check missing attribute" 1 "no-head-dim.h5: missing attribute 'head_dim'" '' \
    $A check no-head-dim.h5
expect "check shape mismatch" 1 \
    'shape.h5: /layers/01/k: shape [2,39,32] does not match n_kv_heads=2, T=40, head_dim=32' '' \
    $A check shape.h5
expect "check NaN in k" 1 'nan.h5: /layers/00/k: NaN at [0,5,3] (1 non-finite value)' '' \
    $A check nan.h5
expect "check Inf in v" 1 'inf.h5: /layers/01/v: -Inf at [1,2,0] (1 non-finite value)' '' \
    $A check inf.h5
expect "check query_pos out of range" 1 \
    'query-pos.h5: /query_pos: position 40 at index 2 is outside 0..39' '' $A check query-pos.h5
# Several files: every one is checked, unreadable ones on stderr, status 1.
expect "check several files" 1 "good.h5: ok
nan.h5: /layers/00/k: NaN at [0,5,3] (1 non-finite value)" \
    "$E: cannot open 'nope.h5': No such file or directory" $A check good.h5 nope.h5 nan.h5

# ---------------------------------------------------------------- info and stats: stderr, nothing on stdout
for cmd in info stats; do
    expect "$cmd foreign HDF5" 1 '' \
        "$E: 'foreign.h5' is not a mosaickv dump (no mkv_format attribute)" $A $cmd foreign.h5
    # a raw dump claiming to be compressed: info reads it as one
    if [ $cmd = info ]; then
        want="$E: 'format.h5': missing attribute 'n_tokens'"
    else
        want="$E: 'format.h5' is not a raw KV dump (mkv_format is 'mosaickv-compressed', expected 'mosaickv-dump')"
    fi
    expect "$cmd other mkv_format" 1 '' "$want" $A $cmd format.h5
    expect "$cmd wrong version" 1 '' \
        "$E: 'version.h5': unsupported mkv_version 2 (this build reads version 1)" $A $cmd version.h5
    expect "$cmd shape mismatch" 1 '' \
        "$E: 'shape.h5': /layers/01/k has shape [2,39,32], expected [2,40,32] (n_kv_heads, T, head_dim)" \
        $A $cmd shape.h5
done
# stats reads every value: no partial table before the error.
expect "stats NaN in k" 1 '' "$E: 'nan.h5': /layers/00/k: NaN at [0,5,3]" $A stats nan.h5
expect "stats -Inf in v" 1 '' "$E: 'inf.h5': /layers/01/v: -Inf at [1,2,0]" $A stats inf.h5
# The analyses neither: the table is printed only once every head is read.
for cmd in overlap segments spectrum sparsity channels; do
    expect "$cmd foreign HDF5" 1 '' \
        "$E: 'foreign.h5' is not a mosaickv dump (no mkv_format attribute)" $A $cmd foreign.h5
    expect "$cmd NaN in k" 1 '' "$E: 'nan.h5': /layers/00/k: NaN at [0,5,3]" $A $cmd nan.h5
done
for cmd in overlap segments spectrum; do
    expect "$cmd -Inf in v" 1 '' "$E: 'inf.h5': /layers/01/v: -Inf at [1,2,0]" $A $cmd inf.h5
done
# sparsity and channels read only keys and queries
for cmd in sparsity channels; do
    expect "$cmd -Inf in v (not read)" 0 '*' '' $A $cmd inf.h5
done
fixture valid noq.h5 --queries 0
for cmd in sparsity channels; do
    expect "$cmd without queries" 1 '' "$E: 'noq.h5' has no queries (W = 0)" $A $cmd noq.h5
done

# ---------------------------------------------------------------- stats against numpy
# compare_stats NAME FACTOR DUMP: mkv-analyze stats against numpy within 1e-5.
compare_stats() {
    if "$A" stats --outlier-factor "$2" "$3" >stats.tsv 2>stats.err &&
        "$PY" "$FIXTURES" compare-stats "$3" stats.tsv "$2" >compare.out 2>&1; then
        pass
    else
        echo "FAIL: stats vs numpy: $1"
        sed 's/^/    /' stats.err compare.out
        failed=$((failed + 1))
    fi
}
compare_stats "float32" 4 good.h5
fixture valid f16.h5 --dtype float16 --layers 1 --kv-heads 2 --heads 2 --head-dim 16 \
    --tokens 5000 --queries 0 --seed 7
# 5000 tokens span two of stats' 4096-token chunks: exercises the merge.
compare_stats "float16, 5000 tokens, factor 2.5" 2.5 f16.h5
fixture valid bf16.h5 --dtype bfloat16 --outlier-channels 3,17 --seed 3
compare_stats "bfloat16 with planted outliers" 4 bf16.h5
# Channels 3 and 17 of every key head were scaled 20x, the rest are
# N(mu, 1): exactly 2 outliers per key head and none per value head.
"$A" stats bf16.h5 >bf16.tsv 2>/dev/null
wrong=$(awk -F'\t' 'NR > 1 && !(($3 == "k" && $10 == 2) || ($3 == "v" && $10 == 0))' bf16.tsv)
rows=$(awk 'END { print NR - 1 }' bf16.tsv)
if [ -z "$wrong" ] && [ "$rows" -eq 8 ]; then
    pass
else
    echo "FAIL: planted outliers: expected 2 per key head, 0 per value head, 8 rows; got:"
    sed 's/^/    /' bf16.tsv
    failed=$((failed + 1))
fi
if [ -x "$CAPTURE" ] && "$CAPTURE" --synthetic -o synthetic.h5 >/dev/null 2>capture.err; then
    compare_stats "mkv-capture --synthetic dump" 4 synthetic.h5
else
    echo "SKIP: stats vs numpy on a synthetic dump (mkv-capture --synthetic unavailable)"
fi

# ---------------------------------------------------------------- damaged indices, metadata, dimensions
for defect in query-pos-negative query-pos-max query-pos-huge tokens-int64 rope-inf huge-k huge-kv; do
    fixture corrupt good.h5 $defect.h5 $defect
done
# A position outside 0..T-1 is a data error (exit 1), caught where
# /query_pos is read, whatever the analysis does with it.
for defect in query-pos-negative:-5 query-pos-max:2147483647 query-pos-huge:1073741824; do
    f=${defect%%:*}.h5 pos=${defect#*:}
    expect "check $f" 1 "$f: /query_pos: position $pos at index 1 is outside 0..39" '' $A check $f
    expect "sparsity $f" 1 '' "$E: '$f': /query_pos: position $pos at index 1 is outside 0..39" \
        $A sparsity $f
done
# int64 ids are read as stored, not clipped to int32 on the way
expect "check int64 /tokens beyond int32" 1 \
    'tokens-int64.h5: /tokens: token id 8589934592 at index 0 is outside 0..2147483647' '' \
    $A check tokens-int64.h5
# every open checks the same metadata
expect "check rope_theta inf" 1 'rope-inf.h5: rope_theta=inf must be finite and positive' '' \
    $A check rope-inf.h5
for cmd in info stats sparsity; do
    expect "$cmd rope_theta inf" 1 '' "$E: 'rope-inf.h5': rope_theta=inf must be finite and positive" \
        $A $cmd rope-inf.h5
done
# 2^48 tokens claimed by chunks never written: refused from the shapes,
# before a value is read (a scan would never end)
expect "check one k of 2^48 tokens" 1 \
    'huge-k.h5: /layers/00/k: shape [2,281474976710656,32] does not match n_kv_heads=2, T=40, head_dim=32' '' \
    $A check huge-k.h5
# claim PREFIX DATASET FILE: the refusal of DATASET's 2^48 tokens in FILE
claim() {
    printf "%s/layers/%s: shape [2,281474976710656,32] claims 7.21e+16 bytes, more than a file of %s bytes can hold (damaged dimensions?)" \
        "$1" "$2" "$(wc -c <"$3" | tr -d ' ')"
}
expect "info one k of 2^48 tokens" 1 '' "$(claim "$E: 'huge-k.h5': " 00/k huge-k.h5)" $A info huge-k.h5
expect "check every k and v of 2^48 tokens" 1 "$(claim 'huge-kv.h5: ' 00/k huge-kv.h5)
$(claim 'huge-kv.h5: ' 00/v huge-kv.h5)
$(claim 'huge-kv.h5: ' 01/k huge-kv.h5)
$(claim 'huge-kv.h5: ' 01/v huge-kv.h5)" '' $A check huge-kv.h5
for cmd in stats segments; do
    expect "$cmd every k and v of 2^48 tokens" 1 '' "$(claim "$E: 'huge-kv.h5': " 00/k huge-kv.h5)" \
        $A $cmd huge-kv.h5
done
# a chunk shape far beyond the dataset's, under HDF5's 4 GiB limit (one
# damaged byte of the layout): libhdf5 1.10 copied past its buffers
# reading it (SEGV; found by tests/fuzz/fuzz_dump); every read refuses it
fixture corrupt good.h5 chunk-shape.h5 chunk-shape
expect "check a chunk shape beyond the dataset's" 1 'chunk-shape.h5: /layers/00/k: read failed (damaged data?)' '' \
    $A check chunk-shape.h5
for cmd in stats spectrum; do
    expect "$cmd a chunk shape beyond the dataset's" 1 '' "$E: 'chunk-shape.h5': /layers/00/k: read failed (damaged data?)" \
        $A $cmd chunk-shape.h5
done

# ---------------------------------------------------------------- a damaged global heap
# h5py stores str attributes as variable-length strings in the global
# heap. libhdf5 1.10 loops forever on a collection whose free space has
# size 0 and copies past the string's buffer for an object longer than its
# collection; every open refuses both (timeout: a hang fails the case),
# from a file and from standard input.
for defect in heap-loop:free heap-overrun:first; do
    f=${defect%%:*}.h5
    fixture corrupt good.h5 $f ${defect%%:*}
    why=$(heap_refusal $f ${defect#*:})
    expect "check $f" 1 "$f: $why" '' timeout 60 $A check $f
    for cmd in info stats; do
        expect "$cmd $f" 1 '' "$E: '$f': $why" timeout 60 $A $cmd $f
    done
    STDIN=$f expect "info - <$f" 1 '' "$E: '(stdin)': $why" timeout 60 $A info -
done

cli_finish
