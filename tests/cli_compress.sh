#!/bin/sh
# CLI test of mkv-compress and mkv-attend: the misuses whose message names
# what this build has (its methods and their parameters, a GPU), with their
# exit status and no output left behind (the misuses with a fixed message
# are tests/cli/mkv-compress.t and mkv-attend.t); then an end-to-end run
# of method "full" on dumps written by h5py (tests/data_fixtures.py) and by
# mkv-capture --synthetic, checked by tests/cdump_h5py.py with h5py/numpy:
# byte accounting recomputed, stored values, every row of mkv-attend's table
# recomputed, and the summary's statistics.
#
# Cases that need a method other than "full" run when that method is
# registered and has the parameter concerned; otherwise they print SKIP.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (default /usr/bin/python3). Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_compress mkv-compress mkv-attend mkv-capture
cli_need_h5py
CHECK=$top_srcdir/tests/cdump_h5py.py

# no_output NAME: nothing but the fixtures in the directory (no partial or
# temporary output left behind).
no_output() {
    extra=$(ls -A | grep -v -x -e 'raw.*\.h5' -e 'got\..*' -e 'want\..*' -e 'c-.*\.h5' -e '.*\.tsv' \
        -e 'nodir' -e '.*\.sum')
    if [ -z "$extra" ]; then pass; else fail "$1: left behind: $extra"; fi
}

C=mkv-compress
A=mkv-attend

# ---------------------------------------------------------------- fixtures
# raw.h5: written by h5py, float32 (so float16 storage is visible), 2 layers,
# 4 query heads on 2 KV heads, head_dim 32, 40 tokens, 3 queries.
"$PY" "$FIXTURES" valid raw.h5 --dtype float32 --tokens 40 --queries 3 --seed 5 ||
    { echo "FAIL: data_fixtures.py valid"; exit 1; }
# the shape of the golden byte counts below
shape=$("$PY" -c 'import h5py,sys; f=h5py.File(sys.argv[1]); a=f.attrs
print(a["n_layers"], a["n_heads"], a["n_kv_heads"], a["head_dim"], f["layers/00/k"].shape[1])' raw.h5)
[ "$shape" = "2 4 2 32 40" ] || { echo "FAIL: fixture shape is '$shape', expected '2 4 2 32 40'"; exit 1; }

methods=$("$COMPRESS" --help | sed -n 's/^Methods: //p')
method_list=$(echo "$methods" | sed 's/ /, /g')
# has_param METHOD PARAM: the method is registered and takes PARAM
has_param() {
    "$COMPRESS" -m "$1" --help-method 2>/dev/null | grep -q "^    $2="
}

# ---------------------------------------------------------------- mkv-compress usage errors: exit 2
# The usage errors with a fixed message are the golden transcript
# tests/cli/mkv-compress.t; these two name the methods of this build.
expect "unknown method" 2 '' "$C: unknown method 'foo' (methods: $method_list)" \
    $COMPRESS raw.h5 -o c.h5 --method foo
expect "--help-method unknown" 2 '' "$C: unknown method 'foo' (methods: $method_list)" \
    $COMPRESS --help-method -m foo
no_output "usage errors"

# Parameters of the other methods, when they are registered: refused with
# exit status 2 and one line naming the method and the parameter.
refused() {   # refused METHOD PARAM VALUE
    expect "$1 $2=$3" 2 '' "$C: method '$1': ..." $COMPRESS raw.h5 -o c.h5 -m $1 -P $2=$3
    grep -q "$2" got.err || fail "$1 $2=$3: the message does not name '$2': $(cat got.err)"
}
for m in $methods; do
    # keep > 100% (a fraction) or not a whole number of tokens (a count)
    has_param $m keep && refused $m keep 1.5
    has_param $m block && refused $m block 0
    # 41 tokens per step in a 40-token context
    has_param $m budget && refused $m budget 41
done
if has_param mosaic group; then
    # group sizes must divide the kept rotated channels: 3 divides no power of two
    expect "mosaic group=3" 2 '' "$C: method 'mosaic': ..." $COMPRESS raw.h5 -o c.h5 -m mosaic -P group=3
    grep -q group got.err || fail "mosaic group=3: the message does not name the group: $(cat got.err)"
else
    echo "SKIP: group not dividing the rank (no method 'mosaic' with a parameter 'group')"
fi
no_output "parameter errors"

# ---------------------------------------------------------------- mkv-compress runtime errors: exit 1
# tests/cli/mkv-compress.t

# ---------------------------------------------------------------- help and listings
expect "-h" 0 '*' '' $COMPRESS -h
expect "--version" 0 '*' '' $COMPRESS --version
expect "--list-methods" 0 '*' '' $COMPRESS --list-methods
expect "--help-method full" 0 "full - uncompressed baseline: dense float16 K and V, attends to every token
    (no parameters)" '' $COMPRESS -m full --help-method
for m in $methods; do
    expect "--help-method $m" 0 '*' '' $COMPRESS --help-method --method $m
    grep -q "^$m - " got.out || fail "--help-method $m: no '$m - summary' line"
done

# ---------------------------------------------------------------- parameter lists
# -P takes KEY=VALUE items separated by commas or blanks; one list, the same
# items in several -P and a blank-separated list give the same file, whose
# params attribute is the canonical text written out by hand below.
params_attr() {
    "$PY" -c 'import h5py, sys; print(h5py.File(sys.argv[1]).attrs["params"].decode())' "$1"
}
if has_param quest page && has_param quest budget; then
    expect "-P comma list" 0 '' '' $COMPRESS -q raw.h5 -o c-list.h5 -m quest -P page=8,budget=0.5
    expect "-P repeated" 0 '' '' $COMPRESS -q raw.h5 -o c-repeat.h5 -m quest -P page=8 --param budget=0.5
    expect "-P blank list" 0 '' '' $COMPRESS -q raw.h5 -o c-blank.h5 -m quest -P 'page=8 budget=0.5'
    if cmp -s c-list.h5 c-repeat.h5 && cmp -s c-list.h5 c-blank.h5; then pass; else
        fail "-P page=8,budget=0.5, -P page=8 -P budget=0.5 and -P 'page=8 budget=0.5' differ"; fi
    got=$(params_attr c-list.h5)
    if [ "$got" = "page=8 budget=0.5 sink=4 recent=64 agg=max" ]; then pass; else
        fail "-P page=8,budget=0.5: params '$got'"; fi
else
    echo "SKIP: parameter lists (no method 'quest' with parameters 'page' and 'budget')"
fi
if has_param mosaic keep && has_param mosaic strategy; then
    expect "-P keep=1,strategy=fixed" 0 '' '' $COMPRESS -q raw.h5 -o c-mosaic.h5 -m mosaic \
        -P keep=1,strategy=fixed
    case " $(params_attr c-mosaic.h5) " in
    *" keep=1 "*" strategy=fixed "*) pass ;;
    *) fail "-P keep=1,strategy=fixed: params '$(params_attr c-mosaic.h5)'" ;;
    esac
else
    echo "SKIP: -P keep=1,strategy=fixed (no method 'mosaic' with parameters 'keep' and 'strategy')"
fi

# ---------------------------------------------------------------- end to end: full
expect "compress full" 0 '' \
    "$C: c-full.h5: method full, logical 20480 bytes, physical 20480 bytes, ratio 1.000" \
    $COMPRESS raw.h5 -o c-full.h5 -m full
if "$PY" "$CHECK" accounting c-full.h5 raw.h5 && "$PY" "$CHECK" full c-full.h5 raw.h5; then pass; else
    fail "h5py checks of c-full.h5"; fi
expect "compress -q" 0 '' '' $COMPRESS -q raw.h5 -o c-full2.h5 -m full --threads 2
if cmp -s c-full.h5 c-full2.h5; then pass; else fail "1 and 2 threads give different files"; fi
expect "compressed given as raw" 1 '' \
    "$C: 'c-full.h5' is not a raw KV dump (mkv_format is 'mosaickv-compressed', expected 'mosaickv-dump')" \
    $COMPRESS c-full.h5 -o c-x.h5 -m full
[ -e c-x.h5 ] && fail "c-x.h5 was written"

expect "attend full" 0 '*' '*' $ATTEND c-full.h5 -o table.tsv
mv got.err summary-stderr.tsv
if "$PY" "$CHECK" attend-full table.tsv c-full.h5 raw.h5 && "$PY" "$CHECK" summary summary-stderr.tsv table.tsv; then
    pass; else fail "numpy disagrees with mkv-attend"; fi
# full: rel_l2 < 2e-3 on every row, recall 1
bad=$(awk -F'\t' 'NR > 1 && !($6 < 2e-3 && $7 == 1)' table.tsv)
rows=$(awk 'END { print NR - 1 }' table.tsv)
if [ -z "$bad" ] && [ "$rows" -eq 24 ]; then pass; else fail "full: rows $rows (expected 24), bad rows: $bad"; fi
expect "attend --summary" 0 '*' '' $ATTEND c-full.h5 --summary --reference raw.h5
cp got.out summary.tsv
if cmp -s summary.tsv summary-stderr.tsv; then pass; else fail "--summary differs from the summary on stderr"; fi
check_summary=$(awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    { print $col["method"], $col["params"], $col["device"], $col["ratio"], $col["rows"], $col["recall_mean"],
      ($col["rel_l2_mean"] < 2e-3 ? "small" : "LARGE") }' summary.tsv)
if [ "$check_summary" = "full - cpu 1.0000 24 1.000000 small" ]; then pass; else
    fail "summary: '$check_summary'"; fi
expect "attend --threads 1" 0 '*' '' $ATTEND -q c-full.h5 --threads 1
cp got.out t1.tsv
expect "attend --threads 3" 0 '*' '' $ATTEND -q c-full.h5 --threads 3
if cmp -s got.out t1.tsv && cmp -s t1.tsv table.tsv; then pass; else fail "tables differ with the thread count"; fi
expect "attend -o -" 0 '*' '' $ATTEND -q c-full.h5 -o -
if cmp -s got.out table.tsv; then pass; else fail "-o - differs from -o FILE"; fi

# A synthetic dump from mkv-capture, through a pipe.
"$CAPTURE" --synthetic --dtype f32 --layers 1 --heads 4 --kv-heads 2 --head-dim 16 --tokens 300 --queries 5 \
    -o raw-syn.h5 || fail "mkv-capture --synthetic"
STDIN=raw-syn.h5 expect "compress from stdin" 0 '' '' $COMPRESS -q - -o c-syn.h5 -m full
expect "source was stdin" 2 '' "$A: 'c-syn.h5' was compressed from standard input: give --reference RAW" \
    $ATTEND c-syn.h5
expect "attend synthetic" 0 '*' '' $ATTEND c-syn.h5 -r raw-syn.h5 --summary
if awk -F'\t' 'NR == 2 { exit !($8 < 2e-3 && $12 == 1) }' got.out; then pass; else
    fail "synthetic: summary $(sed -n 2p got.out)"; fi
"$COMPRESS" -q raw-syn.h5 -o - -m full | cat >c-pipe.h5
if "$PY" "$CHECK" accounting c-pipe.h5 raw-syn.h5; then pass; else fail "compress to stdout"; fi

# ---------------------------------------------------------------- a damaged global heap
# Variable-length strings (h5py's str) live in the global heap, where a
# free space of size 0 makes libhdf5 1.10 loop forever: refused, exit 1,
# for a raw dump given to mkv-compress and a compressed dump given to
# mkv-attend (as its input and as its reference).
fixture corrupt raw.h5 raw-heap.h5 heap-loop
fixture corrupt c-full.h5 c-heap.h5 heap-loop
expect "compress, damaged heap" 1 '' "$C: 'raw-heap.h5': $(heap_refusal raw-heap.h5)" \
    timeout 60 $COMPRESS raw-heap.h5 -o c-x.h5 -m full
[ -e c-x.h5 ] && fail "c-x.h5 was written"
expect "attend, damaged heap" 1 '' "$A: 'c-heap.h5': $(heap_refusal c-heap.h5)" \
    timeout 60 $ATTEND c-heap.h5 --summary
expect "attend, reference with a damaged heap" 1 '' "$A: 'raw-heap.h5': $(heap_refusal raw-heap.h5)" \
    timeout 60 $ATTEND c-full.h5 -r raw-heap.h5 --summary

# ---------------------------------------------------------------- mkv-attend errors
# The refusals with a fixed message are the golden transcript
# tests/cli/mkv-attend.t; without CUDA or without a GPU the reason of this
# one differs, the refusal does not.
expect "attend --device gpu" 1 '' "$A: --device gpu: ..." $ATTEND c-full.h5 --device gpu
no_output "mkv-attend errors"

# Methods with a token budget: --budget beyond the context is refused too.
# In 40 tokens sink and recent hold every token: the methods that select
# tokens (mosaic's, Quest, naive 2-D) say that half of them cannot be the
# budget.
for m in $methods; do
    if has_param $m budget && "$COMPRESS" -q raw.h5 -o c-$m.h5 -m $m; then
        expect "attend $m --budget 41" 2 '' "$A: method '$m': ..." $ATTEND c-$m.h5 --budget 41
        case $m in
        mosaic | uniform2d | quest | naive2d) warning="$A: warning: $m: budget=0.5 is 20 of the 40 tokens, fewer than the \
sink=4 and recent=64 tokens always attended: a step attends at least 40" ;;
        *) warning= ;;
        esac
        expect "attend $m --budget 0.5" 0 '*' "$warning" $ATTEND c-$m.h5 --budget 0.5 --summary
        grep -q 'budget=0.5' got.out || fail "attend $m --budget 0.5: the summary does not show budget=0.5"
    fi
done

cli_finish
