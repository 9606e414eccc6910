#!/bin/sh
# End-to-end test of the method "turboquant" through mkv-compress and
# mkv-attend on a synthetic dump: every compressed file is checked against
# its raw dump by tests/turboquant_ref.py (h5py/numpy: norms, codes, sign
# bits and residual norms recomputed with the random streams, rotation and
# codebook written again there; byte counts by hand), and every row of
# mkv-attend's table against attention over the reconstruction made there;
# bad parameters exit 2 with one line naming them and leave no output.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (default /usr/bin/python3). Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_turboquant mkv-compress mkv-attend mkv-capture
REF=$top_srcdir/tests/turboquant_ref.py
if ! "$COMPRESS" --list-methods 2>/dev/null | grep -q "^turboquant\b"; then
    echo "cli_turboquant: SKIP: method turboquant is not registered (lib/methods/registry.c)"
    exit 77
fi
cli_need_h5py

"$CAPTURE" --synthetic --tokens 200 --head-dim 32 --heads 4 --kv-heads 2 --layers 2 \
    --queries 5 --dtype f32 -o raw.h5 -q || { echo "FAIL: mkv-capture"; exit 1; }

while read -r params; do
    if ! "$COMPRESS" raw.h5 -o c.h5 -m turboquant ${params:+-P "$params"} -q; then
        fail "mkv-compress -m turboquant $params"
        continue
    fi
    if "$PY" "$REF" store raw.h5 c.h5 2>ref.err; then pass; else fail "store $params: $(cat ref.err)"; fi
    if "$ATTEND" c.h5 -r raw.h5 -q -o table.tsv; then
        if "$PY" "$REF" attend table.tsv raw.h5 c.h5 2>ref.err; then pass; else fail "attend $params: $(cat ref.err)"; fi
    else
        fail "mkv-attend on turboquant $params"
    fi
done <<'CASES'

key_bits=4,value_bits=2
key_bits=1,value_bits=4
key_bits=3,value_bits=3,prod=on,seed=12345
key_bits=1,value_bits=2,prod=on
CASES

rm -f c.h5
for bad in key_bits=0 key_bits=5 value_bits=9 prod=yes seed=-1; do
    expect "turboquant $bad" 2 '' "mkv-compress: method 'turboquant': invalid value '${bad#*=}' for parameter '${bad%%=*}': ..." \
        "$COMPRESS" raw.h5 -o c.h5 -m turboquant -P "$bad"
done
if [ -e c.h5 ]; then fail "a refused run left c.h5"; else pass; fi
cli_finish
