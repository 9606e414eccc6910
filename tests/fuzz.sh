#!/bin/sh
# The fuzz harnesses of tests/fuzz/ as a test: each runs over its seed
# corpus (tests/fuzz/make-corpus, written here from the tools and fixtures)
# and then over a fixed number of inputs made from it by the driver's
# mutator with seed 1: the same inputs on every run, bounded by count, not
# time. A crash, a hang (an input running past a generous --timeout, which
# only a loop can reach) or a harness's bug report fails the test; the
# input is kept in tests/fuzz-crashes/ of the build directory (run it again
# with tests/fuzz/fuzz_NAME FILE). Memory: the harnesses run with a 4 GB
# address-space limit, so that an input that makes HDF5 ask for tens of GB
# fails that allocation instead of taking the machine (single allocations
# are not judged here; scripts/fuzz's libFuzzer runs report them).
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY, MKV_FUZZ_FACTOR (mutations x FACTOR; default 1, 0 = the
# corpus only). Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init fuzz mkv-capture mkv-compress
factor=${MKV_FUZZ_FACTOR:-1}
case $factor in '' | *[!0-9]*) echo "fuzz: MKV_FUZZ_FACTOR must be a whole number"; exit 1 ;; esac
bins=$top_builddir/tests/fuzz
for h in fuzz_seeds fuzz_dump; do
    [ -x "$bins/$h" ] || { echo "fuzz: SKIP: $bins/$h is not built (make check builds it)"; exit 77; }
done
top_builddir=$top_builddir top_srcdir=$top_srcdir sh "$top_srcdir/tests/fuzz/make-corpus" corpus >make-corpus.log 2>&1 ||
    { cat make-corpus.log; echo "FAIL: tests/fuzz/make-corpus"; exit 1; }
keep=$top_builddir/tests/fuzz-crashes
export OPENBLAS_NUM_THREADS=1
# Under AddressSanitizer the address-space limit does not hold allocations
# back (the sanitizer reserves its own): cap them at the same 4 GB and let
# the excess fail as malloc failures, as they do in a plain build, instead
# of aborting (libhdf5 asks for tens of GB on some damaged files) or taking
# a minute to map them
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1:max_allocation_size_mb=4096"
export ASAN_OPTIONS
# the harnesses' scratch directories: a crashed one cannot remove its own
mkdir -p scratch && TMPDIR=$(pwd)/scratch && export TMPDIR

# Under AddressSanitizer, mutated HDF5 files reach libhdf5's own faults
# (a heap overflow parsing object headers under H5Aexists, docs/RELIABILITY.md):
# there the HDF5 harnesses run their corpus only; the plain build runs
# their mutations, and every other harness mutates under both.
asan=0
if ldd "$bins/fuzz_dump" 2>/dev/null | grep -q libasan; then
    asan=1
    echo "fuzz: AddressSanitizer build: dump and cdump run their corpus only (libhdf5's own faults)"
fi

# harness and mutations: about 90 s in all on a loaded 2-core machine
for spec in dump:10000 cdump:20000 methods:5000 safetensors:20000 npy:10000 gguf:40000 llama2c:20000 tokenizer:20000 \
    tokenizer_json:20000 hf_config:20000; do
    h=${spec%%:*}
    n=$((${spec#*:} * factor))
    case $asan:$h in 1:dump | 1:cdump) n=0 ;; esac
    if "$bins/fuzz_$h" -q --mutate "$n" --seed 1 --timeout 60 --malloc-limit 0 --max-memory 4096 \
        --crashes crashes "corpus/$h" >"$h.log" 2>&1; then
        pass
        tail -n 1 "$h.log"
    else
        fail "fuzz_$h:"
        sed 's/^/    /' "$h.log" | tail -n 30
        if [ -n "$(ls crashes 2>/dev/null)" ]; then
            mkdir -p "$keep" && cp crashes/* "$keep/" && echo "    reproducers kept in $keep/"
            rm -f crashes/*
        fi
    fi
done
cli_finish
