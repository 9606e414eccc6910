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
$ mkv-compress raw.h5 -m full --output
! mkv-compress: option '--output' needs a value; try 'mkv-compress --help'
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

# ---------------------------------------------------------------- warnings: exit 0
# long.h5: 800 tokens, no queries, so every byte count below follows from
# the shape (fixed strategies without rotation; the cheapest strategies of
# an unreachable ratio).
% fixture valid long.h5 --dtype float32 --tokens 800 --queries 0 --seed 7
# parameters of another strategy change nothing: named
$ mkv-compress long.h5 -o c.h5 -m mosaic -P strategy=fixed,rotate=off,ratio=5,threshold=0.2
! mkv-compress: warning: mosaic: strategy=fixed ignores threshold=0.2 (strategy=dynamic only), ratio=5 (strategy=ratio only)
! mkv-compress: c.h5: method mosaic, logical 409600 bytes, physical 175872 bytes, ratio 2.329
# a ratio the cheapest strategies cannot reach: requested and reached said,
# the reached one recorded as compression_ratio
$ mkv-compress long.h5 -o c.h5 -m mosaic -P ratio=50,keep=0.05
! mkv-compress: warning: mosaic: strategy=ratio ignores keep=0.05 (strategy=fixed only)
! mkv-compress: warning: mosaic: ratio=50 requested, 6.31 reached (4 of 4 heads short of it, the lowest at 6.31): the most compact strategies with the dense sink and recent tokens, block keys and rotations take more bytes
! mkv-compress: c.h5: method mosaic, logical 409600 bytes, physical 64896 bytes, ratio 6.312
$ "$PY" -c 'import h5py; a = h5py.File("c.h5").attrs; print("%.3f" % a["compression_ratio"], a["params"].decode())'
| 6.312 sink=4 recent=64 segment=2048 block=8 keydim=0.5 bound=2 keep=0.05 group=1 energy=0.95 dprime=0 bits=16 quantize=on qgroup=64 rotate=on strategy=ratio threshold=0.1 ratio=50 budget=0.1 agg=max refine=1 headbudget=off
# a budget below the sink and recent tokens, which every step attends
$ mkv-compress long.h5 -o c.h5 -m mosaic -P strategy=fixed,rotate=off,budget=20
! mkv-compress: warning: mosaic: budget=20 is 20 of the 800 tokens, fewer than the sink=4 and recent=64 tokens always attended: a step attends at least 68
! mkv-compress: c.h5: method mosaic, logical 409600 bytes, physical 175872 bytes, ratio 2.329
$ mkv-compress long.h5 -o c.h5 -m uniform2d -P budget=0.05
! mkv-compress: warning: uniform2d: budget=0.05 is 40 of the 800 tokens, fewer than the sink=4 and recent=64 tokens always attended: a step attends at least 68
! mkv-compress: c.h5: method uniform2d, logical 409600 bytes, physical 148288 bytes, ratio 2.762
$ mkv-compress long.h5 -o c.h5 -m quest -P budget=0.05
! mkv-compress: warning: quest: budget=0.05 is 40 of the 800 tokens, fewer than the sink=4 and recent=64 tokens always attended: a step attends at least 68
! mkv-compress: c.h5: method quest, logical 409600 bytes, physical 435200 bytes, ratio 0.941
$ mkv-compress long.h5 -o c.h5 -m naive2d -P budget=60,recent=60
! mkv-compress: warning: naive2d: budget=60 is 60 of the 800 tokens, fewer than the sink=4 and recent=60 tokens always attended: a step attends at least 64
! mkv-compress: c.h5: method naive2d, logical 409600 bytes, physical 217856 bytes, ratio 1.880
# -q keeps warnings off
$ mkv-compress -q long.h5 -o c.h5 -m mosaic -P ratio=50,keep=0.05
