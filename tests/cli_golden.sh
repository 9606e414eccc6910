#!/bin/sh
# The golden CLI transcripts: every tests/cli/*.t (or the ones named on the
# command line), each run in its own scratch directory with the tools on
# PATH. A transcript is a list of commands with their exact stdout, stderr
# and exit status:
#
#   # a comment
#   % fixture valid good.h5 --tokens 40      set-up: must succeed, output ignored
#   $ mkv-analyze check --bogus good.h5      a case, run by sh -c
#   ! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze check --help'
#   [2]
#
# After a `$` line: `| TEXT` lines are the exact stdout, `! TEXT` lines the
# exact stderr (none: the stream must be empty; a single `| *` or `! *`:
# anything, stderr not empty), `[N]` the exit status (default 0), and
# `< FILE` the case's standard input (default /dev/null). `%` lines run in
# the runner's shell, so they see the helpers of tests/cli/common.sh
# (fixture, PY, ...) and can set variables; `$` lines see the exported
# ones. A `%` line `skip-unless-root` ends the transcript there, counted
# as skipped, when not run as root; `skip-unless-h5py` likewise without a
# python with h5py and numpy (PYTHON_H5PY). Exit: 0 pass, 1 fail, 77 when nothing ran.
. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_golden mkv-capture mkv-analyze mkv-compress mkv-attend mkv-decode
PATH=$top_builddir/tools:$PATH
export PATH PY FIXTURES MODELS top_srcdir top_builddir
transcripts=$*
[ -n "$transcripts" ] || transcripts=$(ls "$top_srcdir"/tests/cli/*.t)
skipped=0
scratch=$tmp

# run_case: the pending case (cmd, its want.out/want.err, status, stdin).
run_case() {
    [ -n "$cmd" ] || return 0
    sh -c "$cmd" <"$case_in" >got.out 2>got.err
    got_status=$?
    ok=1
    label="$(basename "$t"):$case_line: $cmd"
    if [ "$got_status" -ne "$want_status" ]; then
        echo "FAIL: $label: exit status $got_status, expected $want_status"
        ok=0
    fi
    for stream in out err; do
        if [ "$(cat "want.$stream.any" 2>/dev/null)" = 1 ]; then
            want='*'
        elif [ -s "want.$stream.lines" ]; then
            want=$(cat "want.$stream.lines")
        else
            want=''
        fi
        cli_match "$label" "$stream" "$want" || ok=0
    done
    if [ $ok = 1 ]; then pass; else failed=$((failed + 1)); fi
    cmd=
}

new_case() {
    cmd=$1 case_line=$2 want_status=0 case_in=/dev/null
    : >want.out.lines; : >want.err.lines
    echo 0 >want.out.any; echo 0 >want.err.any
}

for t in $transcripts; do
    dir=$scratch/$(basename "$t" .t)
    mkdir -p "$dir" && cd "$dir" || exit 1
    cmd= n=0 stop=0
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        case $line in
        '$ '*)
            run_case
            new_case "${line#\$ }" "$n" ;;
        '| '*)
            if [ -z "$cmd" ]; then echo "FAIL: $t:$n: output line before any command"; failed=$((failed + 1)); continue; fi
            if [ "$line" = '| *' ]; then echo 1 >want.out.any; else printf '%s\n' "${line#| }" >>want.out.lines; fi ;;
        '|')
            printf '\n' >>want.out.lines ;;
        '! '*)
            if [ -z "$cmd" ]; then echo "FAIL: $t:$n: stderr line before any command"; failed=$((failed + 1)); continue; fi
            if [ "$line" = '! *' ]; then echo 1 >want.err.any; else printf '%s\n' "${line#! }" >>want.err.lines; fi ;;
        '['*']')
            want_status=${line#[}; want_status=${want_status%]} ;;
        '< '*)
            case_in=${line#< } ;;
        '% skip-unless-root' | '% skip-unless-h5py')
            run_case
            if [ "$line" = '% skip-unless-root' ]; then
                need=root; have=0; [ "$(id -u)" != 0 ] || have=1
            else
                need='h5py and numpy (set PYTHON_H5PY)'; have=$have_h5py
            fi
            if [ "$have" != 1 ]; then
                echo "$(basename "$t"):$n: SKIP: the rest needs $need"
                skipped=$((skipped + 1)); stop=1; break
            fi ;;
        '% '*)
            run_case
            eval "${line#% }" >setup.out 2>&1 || {
                echo "FAIL: $t:$n: set-up failed: ${line#% }"; sed 's/^/    /' setup.out
                failed=$((failed + 1)); stop=1; break
            } ;;
        '#'*|'') ;;
        *)
            echo "FAIL: $t:$n: not a transcript line: $line"; failed=$((failed + 1)) ;;
        esac
    done <"$t"
    [ $stop = 1 ] || run_case
done
cd "$scratch" || exit 1
[ $((passed + failed)) -gt 0 ] || { echo "cli_golden: SKIP: no case ran"; exit 77; }
cli_finish
