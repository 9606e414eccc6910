#!/bin/sh
# CLI test of interrupted writes: SIGKILL, SIGINT and SIGTERM delivered at
# seeded random moments of mkv-capture --synthetic, mkv-compress and
# mkv-attend runs that write -o FILE, over an older FILE or where there was
# none. Afterwards FILE is the complete previous file (cmp), absent where
# there was none, or -- when the signal came after the rename -- the
# complete new file (cmp with an uninterrupted run: the tools' outputs are
# the same bytes on every run); never anything else. After SIGINT and
# SIGTERM the run's own handlers have removed its temporary, except an
# empty one (a signal between mkstemp and the handler's registration); a
# SIGKILL leaves its temporary, which the next run of the same tool on the
# same target removes (core/outfile.h: a temporary of a process that no
# longer exists, older than MKV_OUTFILE_STALE_SECONDS = 5: the test ages
# the leftovers with touch rather than waiting), so that no .FILE.mkvtmp.*
# is left after it.
#
# The moments are drawn in [0, 1.2 T], T the time of one uninterrupted run
# here, so that most kills land during the run on any machine; where one
# lands does not change what is checked. Environment: top_builddir,
# top_srcdir (set by `make check`; default .), MKV_KILL_SEED (default 1).
# Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_kill mkv-capture mkv-compress mkv-attend
seed=${MKV_KILL_SEED:-1}
# A background job of a script starts with SIGINT ignored, and the tools
# leave an inherited SIG_IGN alone: give the runs SIGINT's default back.
if env --default-signal=INT true 2>/dev/null; then
    dfl="env --default-signal=INT"
elif command -v perl >/dev/null 2>&1; then
    dfl="perl -e \$SIG{INT}=q(DEFAULT);exec(@ARGV)or(die)"
else
    echo "cli_kill: SKIP: neither env --default-signal nor perl to run a job with SIGINT's default"
    exit 77
fi

now_ms() { date +%s%3N; }
# delay N: the N-th moment, in seconds, in [0, 1.2 T]
delay() { awk -v s="$seed" -v n="$1" -v t="$run_ms" 'BEGIN { srand(s * 1000 + n); printf "%.3f", rand() * 1.2 * t / 1000 }'; }
temps() { ls -A | grep "^\.$1\.mkvtmp\." ; }

# kill_case TOOL_NAME FILE N SIGNAL OLD(yes|no) ARGS...: run the tool with
# -o FILE, signal it after delay N, check FILE, its temporaries, and the
# next (quick) run.
kill_case() {
    name=$1 file=$2 n=$3 sig=$4 old=$5
    shift 5
    what="$name $sig at $(delay "$n") s, $( [ "$old" = yes ] && echo 'over an old file' || echo 'no old file')"
    rm -f "$file"
    [ "$old" = no ] || cp "$file.old" "$file" || exit 1
    $dfl "$@" -q -o "$file" 2>/dev/null &
    pid=$!
    sleep "$(delay "$n")"
    kill -s "$sig" $pid 2>/dev/null
    { wait $pid; } 2>/dev/null
    status=$?
    case $sig.$status in
    *.0 | KILL.137 | INT.130 | TERM.143) ;;
    *) fail "$what: exit status $status" ;;
    esac
    if [ -e "$file" ] && cmp -s "$file" "$file.new"; then
        pass    # the run had renamed its output into place
        after=$((after + 1))
    elif [ "$old" = yes ] && cmp -s "$file" "$file.old"; then
        pass
    elif [ "$old" = no ] && [ ! -e "$file" ] && [ ! -L "$file" ]; then
        pass
    else
        fail "$what: '$file' is neither the old file, nor the new one, nor absent ($(ls -l "$file" 2>&1))"
    fi
    if [ "$sig" != KILL ]; then
        for t in $(temps "$file"); do
            [ ! -s "$t" ] || fail "$what: the run's handler left its temporary '$t' ($(wc -c <"$t") bytes)"
        done
    fi
    # age what is left: the next run removes a dead process's temporary
    # only once it is MKV_OUTFILE_STALE_SECONDS old
    for t in $(temps "$file"); do
        touch -d '1 minute ago' "$t"
        left=$((left + 1))
    done
    # shellcheck disable=SC2086
    if "$@" $old_args -q -o "$file" 2>next.err; then pass; else fail "$what: the next run failed: $(cat next.err)"; fi
    [ -z "$(temps "$file")" ] && pass || fail "$what: temporaries left after the next run: $(temps "$file" | tr '\n' ' ')"
    cmp -s "$file" "$file.old" && pass || fail "$what: the next run's '$file' is not the complete file"
}

# tool_cases NAME FILE OLD_ARGS -- ARGS: FILE.old from the quick run (ARGS
# then OLD_ARGS), FILE.new from ARGS (timed: T), then six kills of ARGS
# runs: each signal over the old file and over none. The next run after
# each kill is the quick one (its output must be FILE.old).
case_no=0 after=0 left=0
tool_cases() {
    name=$1 file=$2
    shift 2
    old_args=
    while [ "$1" != -- ]; do old_args="$old_args $1"; shift; done
    shift
    # shellcheck disable=SC2086
    "$@" $old_args -q -o "$file.old" || { fail "$name: the quick run failed"; return; }
    t0=$(now_ms)
    "$@" -q -o "$file.new" || { fail "$name: the full run failed"; return; }
    run_ms=$(($(now_ms) - t0))
    for sig in KILL INT TERM; do
        for old in yes no; do
            case_no=$((case_no + 1))
            kill_case "$name" "$file" $case_no $sig $old "$@"
        done
    done
}

# The quick run's extra options come last and override the full run's.
tool_cases mkv-capture cap.h5 --tokens 256 --layers 1 -- \
    "$CAPTURE" --synthetic --layers 2 --heads 8 --kv-heads 4 --head-dim 64 --tokens 6K --queries 16 --seed 3
tool_cases mkv-compress comp.h5 -m full -- "$COMPRESS" cap.h5.new -m kivi
tool_cases mkv-attend att.tsv --summary -- "$ATTEND" comp.h5.new
echo "cli_kill: $case_no kills (seed $seed), $after after the rename; $left temporaries left for the next run"
cli_finish
