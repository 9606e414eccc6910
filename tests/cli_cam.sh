#!/bin/sh
# End-to-end test of the method "cam" through mkv-compress and mkv-attend
# on a synthetic dump: every compressed file is checked against its raw
# dump by tests/cam_ref.py (h5py/numpy: the observation scores, the sliding
# window's merges with the draws of mkv_rng's streams written again there,
# the kept keys, merged values and window scores; byte counts by hand), and
# every row of mkv-attend's table against attention over the values merged
# there; keep=1 merges nothing, the other settings merge some rows; bad
# parameters exit 2 with one line naming them and leave no output.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (default /usr/bin/python3). Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_cam mkv-compress mkv-attend mkv-capture
REF=$top_srcdir/tests/cam_ref.py
if ! "$COMPRESS" --list-methods 2>/dev/null | grep -q "^cam\b"; then
    echo "cli_cam: SKIP: method cam is not registered (lib/methods/registry.c)"
    exit 77
fi
cli_need_h5py

"$CAPTURE" --synthetic --tokens 200 --head-dim 32 --heads 4 --kv-heads 2 --layers 2 \
    --queries 5 --dtype f32 -o raw.h5 -q || { echo "FAIL: mkv-capture"; exit 1; }

# PARAMS|MERGES: MERGES is "none" when nothing may merge, "some" otherwise
while IFS='|' read -r params merges; do
    [ -n "$params$merges" ] || continue
    if ! "$COMPRESS" raw.h5 -o c.h5 -m cam ${params:+-P "$params"} -q; then
        fail "mkv-compress -m cam $params"
        continue
    fi
    if "$PY" "$REF" store raw.h5 c.h5 >ref.out 2>ref.err; then pass; else fail "store $params: $(cat ref.err)"; fi
    n=$(sed -n 's/^merged rows: //p' ref.out)
    case $merges:$n in
        none:0 | some:[1-9]*) pass ;;
        *) fail "cam $params: $n merged rows, expected $merges" ;;
    esac
    if "$ATTEND" c.h5 -r raw.h5 -q -o table.tsv; then
        if "$PY" "$REF" attend table.tsv raw.h5 c.h5 2>ref.err; then pass; else fail "attend $params: $(cat ref.err)"; fi
    else
        fail "mkv-attend on cam $params"
    fi
done <<'CASES'
|some
keep=1|none
keep=0.3,start=0.25,merge=4,window=3,seed=7|some
keep=40,start=0,merge=0.5,window=1|some
keep=0.1,merge=1000,seed=4294967295|some
CASES

rm -f c.h5
for bad in keep=0 start=-0.1 merge=0 seed=-1 window=0; do
    expect "cam $bad" 2 '' "mkv-compress: method 'cam': invalid value '${bad#*=}' for parameter '${bad%%=*}': ..." \
        "$COMPRESS" raw.h5 -o c.h5 -m cam -P "$bad"
done
expect "cam start=1" 2 '' "mkv-compress: method 'cam': start=1 leaves no window: the share of first tokens must be below 1" \
    "$COMPRESS" raw.h5 -o c.h5 -m cam -P start=1
expect "cam merge=2.5" 2 '' "mkv-compress: method 'cam': merge=2.5: a count above 1 must be a whole number of tokens" \
    "$COMPRESS" raw.h5 -o c.h5 -m cam -P merge=2.5
expect "cam keep=500" 2 '' "mkv-compress: method 'cam': keep=500 tokens is larger than the context of 200 tokens" \
    "$COMPRESS" raw.h5 -o c.h5 -m cam -P keep=500
if [ -e c.h5 ]; then fail "a refused run left c.h5"; else pass; fi
cli_finish
