# mkv-compress: usage errors (exit 2) and runtime errors (exit 1), each with
# its exact stderr and nothing on stdout, and no output left behind. The
# cases whose message lists the registered methods, and the parameters of
# the methods other than full, are in tests/cli_compress.sh.

% skip-unless-h5py
# raw.h5: written by h5py, float32, 2 layers, 4 query heads on 2 KV heads,
# head_dim 32, 40 tokens, 3 queries; nan.h5: the same with a NaN in a key
% fixture valid raw.h5 --dtype float32 --tokens 40 --queries 3 --seed 5
% fixture corrupt raw.h5 nan.h5 nan
% cksum <raw.h5 >raw.sum

# ---------------------------------------------------------------- usage errors: exit 2
# operands and the options every run needs
$ mkv-compress
! mkv-compress: missing IN (the raw dump to compress); try 'mkv-compress --help'
[2]
$ mkv-compress raw.h5 raw.h5 -o c.h5 -m full
! mkv-compress: too many operands ('raw.h5' after IN); try 'mkv-compress --help'
[2]
$ mkv-compress raw.h5 -o c.h5
! mkv-compress: missing --method NAME (see --list-methods); try 'mkv-compress --help'
[2]
$ mkv-compress raw.h5 -m full
! mkv-compress: missing -o FILE (use '-o -' for stdout); try 'mkv-compress --help'
[2]

# method parameters (-P KEY=VALUE[,KEY=VALUE...]; -p is gone)
$ mkv-compress raw.h5 -o c.h5 -m full -P keep=1
! mkv-compress: method 'full': unknown parameter 'keep' (the method takes none)
[2]
$ mkv-compress raw.h5 -o c.h5 -m full -P keep
! mkv-compress: method 'full': invalid parameter 'keep': expected KEY=VALUE
[2]
$ mkv-compress raw.h5 -o c.h5 -m full -P ' '
! mkv-compress: method 'full': invalid parameter list ' ': expected KEY=VALUE[,KEY=VALUE...]
[2]
$ mkv-compress raw.h5 -o c.h5 -m full --param ,,
! mkv-compress: method 'full': invalid parameter list ',,': expected KEY=VALUE[,KEY=VALUE...]
[2]
$ mkv-compress raw.h5 -o c.h5 -m full -p keep=1
! mkv-compress: option '-p' is now '-P'; try 'mkv-compress --help'
[2]
$ mkv-compress raw.h5 -o c.h5 -m full -p
! mkv-compress: option '-p' is now '-P'; try 'mkv-compress --help'
[2]

# options
$ mkv-compress --bogus raw.h5
! mkv-compress: unknown option '--bogus'; try 'mkv-compress --help'
[2]
$ mkv-compress raw.h5 -m full -o
! mkv-compress: option '-o' needs a value; try 'mkv-compress --help'
[2]
$ mkv-compress raw.h5 -o c.h5 -m full --threads 0
! mkv-compress: invalid value '0' for --threads: must be in 1..1024
[2]
$ mkv-compress --help-method
! mkv-compress: --help-method needs --method NAME; try 'mkv-compress --help'
[2]

# an output over the input, also by another name: refused, the input unchanged
$ mkv-compress raw.h5 -o raw.h5 -m full
! mkv-compress: output 'raw.h5' would overwrite the input
[2]
$ mkv-compress raw.h5 -o ./raw.h5 -m full
! mkv-compress: output './raw.h5' would overwrite the input
[2]
$ cksum <raw.h5 | cmp -s - raw.sum

# mkv-compress has no --device (it runs on the CPU)
$ mkv-compress raw.h5 -o c.h5 -m full --device cpu
! mkv-compress: unknown option '--device'; try 'mkv-compress --help'
[2]

# ---------------------------------------------------------------- runtime errors: exit 1
$ mkv-compress nope.h5 -o c.h5 -m full
! mkv-compress: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-compress nan.h5 -o c.h5 -m full
! mkv-compress: 'nan.h5': /layers/00/k: NaN at [0,5,3]
[1]
$ mkv-compress raw.h5 -o nodir/c.h5 -m full
! mkv-compress: cannot create 'nodir/c.h5': No such file or directory
[1]

# nothing but the fixtures is left (no partial or temporary output)
$ ls -A | grep -v -x -e 'got\..*' -e 'want\..*' -e setup.out -e raw.sum
| nan.h5
| raw.h5
