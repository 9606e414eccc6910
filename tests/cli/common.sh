# Shared by every CLI test (sourced, POSIX sh): where the tools are, a
# scratch directory the test runs in, and the pass/fail/expect helpers.
#
#   . "${top_srcdir:-.}/tests/cli/common.sh"
#   cli_init NAME mkv-compress mkv-attend   # skip (77) unless these are built
#   expect "case" 2 '' "mkv-compress: ..." "$COMPRESS" in.h5 -o x.h5
#   cli_finish                              # "NAME: N passed, N failed"
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (a python with h5py and numpy; default /usr/bin/python3).
# After cli_init: CAPTURE ANALYZE COMPRESS ATTEND DECODE (tool paths), PY,
# FIXTURES (tests/data_fixtures.py), MODELS (stories260K's directory),
# have_h5py (1 or 0), and the working directory is a fresh scratch
# directory, removed on exit, so files are named as a user would type them.

cli_init() {
    cli_name=$1
    shift
    cli_builddir=${top_builddir:-.}
    top_builddir=$(cd "$cli_builddir" 2>/dev/null && pwd) || {
        echo "$cli_name: SKIP: build directory '$cli_builddir' does not exist"
        exit 77
    }
    top_srcdir=$(cd "${top_srcdir:-.}" && pwd) || exit 1
    CAPTURE=$top_builddir/tools/mkv-capture
    ANALYZE=$top_builddir/tools/mkv-analyze
    COMPRESS=$top_builddir/tools/mkv-compress
    ATTEND=$top_builddir/tools/mkv-attend
    DECODE=$top_builddir/tools/mkv-decode
    PY=${PYTHON_H5PY:-/usr/bin/python3}
    FIXTURES=$top_srcdir/tests/data_fixtures.py
    MODELS=${MKV_MODELS_DIR:-$top_srcdir/../shared/models}
    for tool; do
        if [ ! -x "$top_builddir/tools/$tool" ]; then
            echo "$cli_name: SKIP: $top_builddir/tools/$tool is not built"
            exit 77
        fi
    done
    if "$PY" -c 'import h5py, numpy' 2>/dev/null; then have_h5py=1; else have_h5py=0; fi
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/$cli_name.XXXXXX") || exit 1
    trap 'rm -rf "$tmp"' EXIT
    trap 'exit 1' HUP INT TERM
    cd "$tmp" || exit 1
    passed=0
    failed=0
}

# The python helpers must be there for tests that need them.
cli_need_h5py() {
    if [ "$have_h5py" != 1 ]; then
        echo "$cli_name: SKIP: no python with h5py and numpy (set PYTHON_H5PY)"
        exit 77
    fi
}

pass() { passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# fixture ARGS...: tests/data_fixtures.py ARGS, which must succeed.
fixture() { "$PY" "$FIXTURES" "$@" || { echo "FAIL: data_fixtures.py $*"; exit 1; }; }

# heap_refusal FILE: how a reader refuses FILE, damaged by `fixture corrupt
# ... heap-loop` (WHAT=free) or heap-overrun (WHAT=first); the offsets
# depend on where h5py put the collection.
heap_refusal() {
    set -- "$1" "${2:-free}" $("$PY" "$FIXTURES" heap "$1")
    if [ "$2" = free ]; then
        printf "attribute 'mkv_format' cannot be read: the global heap collection at byte %s is damaged: the object at byte %s has size 0" "$3" "$5"
    else
        printf "attribute 'mkv_format' cannot be read: the global heap collection at byte %s is damaged: the object at byte %s (4096 bytes) runs past the collection's end" "$3" "$4"
    fi
}

# expect NAME STATUS STDOUT STDERR CMD [ARG...]
# Run CMD with stdin from $STDIN (default /dev/null) and compare its exit
# status, stdout and stderr with the expectations. STDOUT and STDERR: the
# exact text without the final newline ('' = nothing at all), '*' =
# anything (for stderr: some message), or 'PREFIX...' = one line starting
# with PREFIX.
expect() {
    name=$1 want_status=$2 want_out=$3 want_err=$4
    shift 4
    [ -z "${CLI_RECORD:-}" ] || cli_record "$@"
    "$@" <"${STDIN:-/dev/null}" >got.out 2>got.err
    status=$?
    ok=1
    if [ "$status" -ne "$want_status" ]; then
        echo "FAIL: $name: exit status $status, expected $want_status ($*)"
        ok=0
    fi
    for stream in out err; do
        if [ "$stream" = out ]; then want=$want_out; else want=$want_err; fi
        cli_match "$name" "$stream" "$want" || ok=0
    done
    if [ $ok = 1 ]; then pass; else failed=$((failed + 1)); fi
}

# cli_match NAME STREAM WANT: got.STREAM against WANT as expect() reads it.
cli_match() {
    case $3 in
    '*')
        if [ "$2" = err ] && [ ! -s got.err ]; then
            echo "FAIL: $1: expected a message on stderr, got none"
            return 1
        fi
        return 0 ;;
    *...)
        prefix=${3%...}
        first=$(head -n 1 "got.$2")
        case $first in
        "$prefix"*) [ "$(wc -l <"got.$2")" -eq 1 ] && return 0 ;;
        esac
        echo "FAIL: $1: std$2 should be one line starting with '$prefix', got:"
        sed 's/^/    /' "got.$2"
        return 1 ;;
    esac
    if [ -n "$3" ]; then printf '%s\n' "$3" >"want.$2"; else : >"want.$2"; fi
    if ! cmp -s "want.$2" "got.$2"; then
        echo "FAIL: $1: std$2 differs (--- expected, +++ got):"
        diff -u "want.$2" "got.$2" | sed '1,2d; s/^/    /'
        return 1
    fi
    return 0
}

# With CLI_RECORD=FILE, every expect() appends its case to FILE in the
# transcript form tests/cli_golden.sh reads: how a script's cases become a
# golden transcript.
cli_quote() {
    case $1 in
    '' | *[!A-Za-z0-9_./=:,+@%^-]*) printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")" ;;
    *) printf '%s' "$1" ;;
    esac
}
cli_record() {
    {
        printf '$'
        for a; do
            case $a in "$top_builddir"/tools/*) a=${a##*/} ;; esac
            printf ' %s' "$(cli_quote "$a")"
        done
        printf '\n'
        [ -z "${STDIN:-}" ] || printf '< %s\n' "$STDIN"
        [ -z "$want_out" ] || printf '%s\n' "$want_out" | sed 's/^/| /; s/^| $/|/'
        [ -z "$want_err" ] || printf '%s\n' "$want_err" | sed 's/^/! /'
        [ "$want_status" -eq 0 ] || printf '[%s]\n' "$want_status"
    } >>"$CLI_RECORD"
}

# The summary line and the exit status of the test.
cli_finish() {
    echo "$cli_name: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
