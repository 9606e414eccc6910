# mkv-attend: refusals of its operands, references and options, each with
# its exact stderr, nothing on stdout and its exit status, and no output
# left behind. --device gpu (whose reason depends on the machine) is in
# tests/cli_compress.sh, the --bench options in tests/cli_attend_bench.sh.

% skip-unless-h5py
# raw.h5 (h5py, 40 tokens) compressed by method full; small.h5 another dump
# (30 tokens); nan.h5 raw.h5 with a NaN in a key
% fixture valid raw.h5 --dtype float32 --tokens 40 --queries 3 --seed 5
% fixture corrupt raw.h5 nan.h5 nan
% fixture valid small.h5 --dtype float32 --tokens 30 --queries 3
% mkv-compress -q raw.h5 -o c-full.h5 -m full
% cksum <raw.h5 >raw.sum
# c-gone.h5 records a source that is no longer there
% cp raw.h5 raw-gone.h5 && mkv-compress -q raw-gone.h5 -o c-gone.h5 -m full && rm raw-gone.h5

# ---------------------------------------------------------------- the compressed dump and its reference
$ mkv-attend
! mkv-attend: missing COMPRESSED (a dump made by mkv-compress); try 'mkv-attend --help'
[2]
$ mkv-attend raw.h5
! mkv-attend: 'raw.h5' is a raw KV dump; mkv-attend needs a compressed dump (mkv-compress)
[1]
$ mkv-attend c-full.h5 --reference c-full.h5
! mkv-attend: 'c-full.h5' is not a raw KV dump (mkv_format is 'mosaickv-compressed', expected 'mosaickv-dump')
[1]
$ mkv-attend c-full.h5 -r small.h5
! mkv-attend: 'small.h5' is not the dump 'c-full.h5' was made from: n_tokens is 30 there, 40 here
[1]
$ mkv-attend nope.h5
! mkv-attend: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-attend c-gone.h5
! mkv-attend: cannot open 'raw-gone.h5': No such file or directory (the source recorded in 'c-gone.h5'; give --reference RAW)
[1]

# ---------------------------------------------------------------- --budget
$ mkv-attend c-full.h5 --budget 0.1
! mkv-attend: --budget: method 'full' has no token budget
[2]
$ mkv-attend c-full.h5 --budget 0
! mkv-attend: invalid value '0' for --budget: must be positive
[2]

# ---------------------------------------------------------------- -o over an input: refused, the input unchanged
$ mkv-attend c-full.h5 -o c-full.h5
! mkv-attend: output 'c-full.h5' would overwrite an input
[2]
$ mkv-attend c-full.h5 -o raw.h5
! mkv-attend: output 'raw.h5' would overwrite an input
[2]
$ cksum <raw.h5 | cmp -s - raw.sum

# ---------------------------------------------------------------- a bad reference writes no table
$ mkv-attend c-full.h5 -r nan.h5 -o nan.tsv
! mkv-attend: 'nan.h5': /layers/00/k: NaN at [0,5,3]
[1]
$ test ! -e nan.tsv

# ---------------------------------------------------------------- help
$ mkv-attend --help
| *

# nothing but the fixtures is left (no partial or temporary output)
$ ls -A | grep -v -x -e 'got\..*' -e 'want\..*' -e setup.out -e raw.sum
| c-full.h5
| c-gone.h5
| nan.h5
| raw.h5
| small.h5
