#!/bin/sh
# Interoperability with an independent HDF5 reader and writer (h5py/numpy):
# numpy writes an .npy, mkv-capture --import turns it into a dump, h5py
# checks layout, attributes and every value (numpy does the rounding to
# float16/bfloat16); then h5py writes a dump and our tools accept it.
. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_h5py mkv-capture mkv-analyze
cli_need_h5py
py=$PY capture=$CAPTURE analyze=$ANALYZE
fail=0

"$py" -c '
import numpy as np
rng = np.random.default_rng(11)
x = rng.standard_normal((3, 2, 2, 70, 16)) * np.array([1, 30, 1, 1e-3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1e4])
np.save("'"$tmp"'/kv.npy", x.astype(np.float32))
' || exit 1

for dt in f32 f16 bf16; do
    if "$capture" --import "$tmp/kv.npy" --heads 4 --dtype $dt -o "$tmp/kv-$dt.h5" &&
       "$py" "$top_srcdir/tests/h5py_read.py" check-import "$tmp/kv-$dt.h5" "$tmp/kv.npy" $dt; then :
    else
        echo "FAIL: import as $dt"; fail=1
    fi
done

"$py" "$top_srcdir/tests/h5py_read.py" write-dump "$tmp/ext.h5" || exit 1
if ! "$analyze" check "$tmp/ext.h5"; then
    echo "FAIL: a dump written by h5py is not accepted"; fail=1
fi
if ! "$analyze" info "$tmp/ext.h5" | grep -q 'h5py-written'; then
    echo "FAIL: info does not show the model of the h5py dump"; fail=1
fi
[ $fail = 0 ] && echo "cli_h5py: all passed"
exit $fail
