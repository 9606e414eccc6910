#!/bin/sh
# CLI test of where a tool's -o may point: a symbolic link (the file it
# names is written, the link stays), a FIFO and a pipe (written through,
# the FIFO stays), /dev/full (exit 1 with one ENOSPC line, the device
# stays), a stale temporary of a dead process (removed by the next write
# to the same target; a live process's temporary is kept), and SIGHUP
# inherited as ignored (the run survives it). Every HDF5 result is opened
# with h5py and compared, dataset by dataset and attribute by attribute
# (created_by aside), with the same dump written to a plain new file.
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (default /usr/bin/python3). Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_output mkv-compress mkv-capture mkv-attend
cli_need_h5py
trap - HUP    # as before: only INT and TERM end this test early
check() { if eval "$2"; then pass; else fail "$1"; fi; }

# same_h5 GOT WANT FORMAT: GOT is an HDF5 file of mkv_format FORMAT with
# the same groups, datasets and attributes (created_by aside) as WANT.
same_h5() {
    "$PY" - "$1" "$2" "$3" <<'EOF'
import sys, h5py, numpy as np
got, want, fmt = sys.argv[1:]
def items(path):
    out = {}
    with h5py.File(path, "r") as f:
        def attrs(name, obj):
            for k, v in obj.attrs.items():
                if k != "created_by":
                    out["attr:%s@%s" % (name, k)] = np.asarray(v).tolist()
        attrs("/", f)
        def visit(name, obj):
            attrs(name, obj)
            if isinstance(obj, h5py.Dataset):
                out["data:" + name] = (obj.dtype.str, obj[()].tobytes())
            else:
                out["group:" + name] = None
        f.visititems(visit)
        kind = f.attrs["mkv_format"]
    return out, kind.decode() if isinstance(kind, bytes) else kind
g, gk = items(got)
w, _ = items(want)
if gk != fmt:
    sys.exit("%s: mkv_format %r, not %r" % (got, gk, fmt))
if g != w:
    diff = sorted(set(g) ^ set(w)) or sorted(k for k in g if g[k] != w[k])
    sys.exit("%s differs from %s: %s" % (got, want, diff[:5]))
EOF
}

"$CAPTURE" --synthetic --layers 1 --heads 4 --kv-heads 2 --head-dim 16 --tokens 300 --queries 5 \
    --seed 5 -q -o raw.h5 || { echo "FAIL: mkv-capture --synthetic"; exit 1; }
"$COMPRESS" raw.h5 -m full -q -o plain.h5 || { echo "FAIL: mkv-compress to a new file"; exit 1; }

# A symbolic link: the file it names is replaced, the link stays.
echo old >target.h5
ln -s target.h5 link.h5
check "compress -o link exits 0" '"$COMPRESS" raw.h5 -m full -q -o link.h5'
check "the link stays a link to target.h5" '[ -L link.h5 ] && [ "$(readlink link.h5)" = target.h5 ]'
check "the link's target is the dump" 'same_h5 target.h5 plain.h5 mosaickv-compressed'
# a dangling link gets its target created (the raw dump writer)
ln -s made.h5 dangling.h5
check "capture -o dangling link exits 0" \
    '"$CAPTURE" --synthetic --layers 1 --heads 4 --kv-heads 2 --head-dim 16 --tokens 300 --queries 5 --seed 5 -q -o dangling.h5'
check "the dangling link stays" '[ -L dangling.h5 ] && [ "$(readlink dangling.h5)" = made.h5 ]'
check "its target is the raw dump" 'same_h5 made.h5 raw.h5 mosaickv-dump'

# A FIFO with a reader: written through, the FIFO stays.
mkfifo fifo
cat fifo >from-fifo.h5 &
reader=$!
check "compress -o fifo exits 0" '"$COMPRESS" raw.h5 -m full -q -o fifo'
check "the FIFO stays a FIFO" '[ -p fifo ]'
# a FIFO that was replaced never gets a writer: do not wait for its reader
[ -p fifo ] || kill $reader 2>/dev/null
wait $reader
check "the reader got the dump" 'same_h5 from-fifo.h5 plain.h5 mosaickv-compressed'

# A pipe named by /dev/stdout (a link to /proc/self/fd/1): written through.
check "compress -o /dev/stdout into a pipe exits 0" \
    '"$COMPRESS" raw.h5 -m full -q -o /dev/stdout | cat >from-pipe.h5 && [ -L /dev/stdout ]'
check "the pipe got the dump" 'same_h5 from-pipe.h5 plain.h5 mosaickv-compressed'

# The text outputs of mkv-attend take the same path.
"$ATTEND" plain.h5 -r raw.h5 --summary >summary.want || { echo "FAIL: mkv-attend --summary"; exit 1; }
echo old >summary.target
ln -s summary.target summary.link
check "attend -o link exits 0" '"$ATTEND" plain.h5 -r raw.h5 --summary -o summary.link'
check "the summary link stays and its target is the table" \
    '[ -L summary.link ] && cmp -s summary.target summary.want'
check "attend -o /dev/stdout into a pipe" \
    '"$ATTEND" plain.h5 -r raw.h5 --summary -o /dev/stdout | cat >summary.pipe && [ -L /dev/stdout ] && cmp -s summary.pipe summary.want'

# /dev/full: ENOSPC is an error, and the device stays a device.
if [ "$(id -u)" != 0 ] || [ ! -c /dev/full ]; then
    echo "SKIP: the /dev/full case (needs root and /dev/full)"
else
    "$COMPRESS" raw.h5 -m full -q -o /dev/full 2>full.err
    status=$?
    check "compress -o /dev/full exits 1" '[ $status -eq 1 ]'
    check "one ENOSPC line" \
        '[ "$(cat full.err)" = "mkv-compress: cannot write '"'"'/dev/full'"'"': No space left on device" ]'
    check "/dev/full stays a character device" '[ -c /dev/full ]'
fi

# Stale temporaries: a dead process's old one goes, a live process's stays.
sh -c 'exit 0' &
dead=$!
wait $dead
echo partial >".out.h5.mkvtmp.$dead.AbC123"
echo partial >".out.h5.mkvtmp.$$.DeF456"
touch -d '1 minute ago' ".out.h5.mkvtmp.$dead.AbC123" ".out.h5.mkvtmp.$$.DeF456"
check "compress -o out.h5 exits 0" '"$COMPRESS" raw.h5 -m full -q -o out.h5'
check "the dead process's temporary is removed" '[ ! -e ".out.h5.mkvtmp.$dead.AbC123" ]'
check "the live process's temporary is kept" '[ -e ".out.h5.mkvtmp.$$.DeF456" ]'
check "out.h5 is the dump" 'same_h5 out.h5 plain.h5 mosaickv-compressed'

# SIGHUP inherited as ignored: the run survives it. The output is a FIFO
# without a reader yet, so the run waits at the open; once it has its
# cleanup handlers (SIGTERM caught, in /proc/PID/status), it gets SIGHUP.
mkfifo hup-fifo
(
    trap '' HUP
    exec "$COMPRESS" raw.h5 -m full -q -o hup-fifo
) &
run=$!
caught=0
if [ -r /proc/$run/status ]; then
    i=0
    while [ $i -lt 600 ]; do   # up to a minute: the machine may be loaded
        cgt=$(sed -n 's/^SigCgt:[[:space:]]*//p' /proc/$run/status 2>/dev/null)
        # SIGTERM is signal 15: bit 14 of the mask, 0x4000
        if [ -n "$cgt" ] && [ $(( 0x$cgt & 0x4000 )) -ne 0 ]; then
            caught=1
            break
        fi
        sleep 0.1
        i=$((i + 1))
    done
fi
check "the run installed its cleanup handlers" '[ $caught -eq 1 ]'
kill -HUP $run 2>/dev/null
sleep 0.2
check "the run survives SIGHUP" 'kill -0 $run 2>/dev/null'
cat hup-fifo >from-hup.h5
wait $run
status=$?
check "the run exits 0 after SIGHUP" '[ $status -eq 0 ]'
check "its output is the dump" 'same_h5 from-hup.h5 plain.h5 mosaickv-compressed'

check "no temporary left behind" '[ -z "$(ls -A | grep "\.mkvtmp\." | grep -v "\.$$\.DeF456$")" ]'

cli_finish
