# mkv-analyze: the usage errors and refusals whose answer is fixed text:
# exact stderr (and stdout), exit status. The cases that need h5py's
# damaged fixtures, or whose expected text is computed, are in
# tests/cli_analyze.sh.

% : >empty.h5
% printf 'layer\thead\nnot an HDF5 file\n' >notes.txt
# a valid dump of known shape: written by h5py (independent of our writer) or,
# without h5py, by mkv-capture; its first half is a truncated file
% if [ "$have_h5py" = 1 ]; then fixture valid good.h5 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 40 --queries 3; else mkv-capture --synthetic --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 40 --queries 3 -o good.h5; fi
% head -c $(($(wc -c <good.h5) / 2)) good.h5 >cut.h5
# compressed dumps of a synthetic dump (the same with or without h5py); at
# 40 tokens mosaic keeps every token dense (sink 4 + recent 64): no segment
% mkv-capture --synthetic --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --tokens 40 --queries 3 -o syn.h5
% mkv-compress syn.h5 -m full -o full.h5 -q
% mkv-compress syn.h5 -m kivi -o kivi.h5 -q
% mkv-compress syn.h5 -m mosaic -o dense.h5 -q

# ---------------------------------------------------------------- unreadable files

# check
$ mkv-analyze check nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze check .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze check empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze check notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze check -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze check -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze check cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze check -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# info
$ mkv-analyze info nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze info .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze info empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze info notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze info -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze info -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze info cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze info -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# strategies
$ mkv-analyze strategies nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze strategies .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze strategies empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze strategies notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze strategies -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze strategies -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze strategies cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze strategies -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# stats
$ mkv-analyze stats nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze stats .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze stats empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze stats notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze stats -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze stats -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze stats cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze stats -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# overlap
$ mkv-analyze overlap nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze overlap .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze overlap empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze overlap notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze overlap -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze overlap -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze overlap cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze overlap -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# segments
$ mkv-analyze segments nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze segments .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze segments empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze segments notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze segments -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze segments -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze segments cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze segments -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# spectrum
$ mkv-analyze spectrum nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze spectrum .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze spectrum empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze spectrum notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze spectrum -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze spectrum -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze spectrum cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze spectrum -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# sparsity
$ mkv-analyze sparsity nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze sparsity .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze sparsity empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze sparsity notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze sparsity -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze sparsity -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze sparsity cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze sparsity -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# channels
$ mkv-analyze channels nope.h5
! mkv-analyze: cannot open 'nope.h5': No such file or directory
[1]
$ mkv-analyze channels .
! mkv-analyze: cannot open '.': Is a directory
[1]
$ mkv-analyze channels empty.h5
! mkv-analyze: 'empty.h5' is empty
[1]
$ mkv-analyze channels notes.txt
! mkv-analyze: 'notes.txt' is not an HDF5 file
[1]
$ mkv-analyze channels -
< empty.h5
! mkv-analyze: standard input is empty
[1]
$ mkv-analyze channels -
< notes.txt
! mkv-analyze: standard input is not an HDF5 file
[1]
$ mkv-analyze channels cut.h5
! mkv-analyze: 'cut.h5' is truncated or damaged
[1]
$ mkv-analyze channels -
< cut.h5
! mkv-analyze: standard input is a truncated or damaged HDF5 file
[1]

# ---------------------------------------------------------------- usage errors: one line, exit 2
$ mkv-analyze
! mkv-analyze: expected a command (check, info, strategies, stats, overlap, segments, spectrum, sparsity or channels); try 'mkv-analyze --help'
[2]
$ mkv-analyze frob good.h5
! mkv-analyze: unknown command 'frob'; try 'mkv-analyze --help'
[2]
$ mkv-analyze -q check good.h5
! mkv-analyze: expected a command before '-q'; try 'mkv-analyze --help'
[2]

# check: unknown options, flags given a value, --help anywhere
$ mkv-analyze check
! mkv-analyze: missing FILE; try 'mkv-analyze check --help'
[2]
$ mkv-analyze check --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze check --help'
[2]
$ mkv-analyze check -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze check --help'
[2]
$ mkv-analyze check --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze check --help'
[2]
$ mkv-analyze check --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze check --help'
[2]
$ mkv-analyze check --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze check --help'
[2]
$ mkv-analyze check -h
| *
$ mkv-analyze check good.h5 --help
| *

# info: unknown options, flags given a value, --help anywhere
$ mkv-analyze info
! mkv-analyze: missing FILE; try 'mkv-analyze info --help'
[2]
$ mkv-analyze info --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze info --help'
[2]
$ mkv-analyze info -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze info --help'
[2]
$ mkv-analyze info --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze info --help'
[2]
$ mkv-analyze info --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze info --help'
[2]
$ mkv-analyze info --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze info --help'
[2]
$ mkv-analyze info -h
| *
$ mkv-analyze info good.h5 --help
| *

# strategies: unknown options, flags given a value, --help anywhere
$ mkv-analyze strategies
! mkv-analyze: missing FILE; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze strategies --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze strategies -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze strategies --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze strategies --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze strategies --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze strategies -h
| *
$ mkv-analyze strategies good.h5 --help
| *

# stats: unknown options, flags given a value, --help anywhere
$ mkv-analyze stats
! mkv-analyze: missing FILE; try 'mkv-analyze stats --help'
[2]
$ mkv-analyze stats --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze stats --help'
[2]
$ mkv-analyze stats -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze stats --help'
[2]
$ mkv-analyze stats --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze stats --help'
[2]
$ mkv-analyze stats --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze stats --help'
[2]
$ mkv-analyze stats --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze stats --help'
[2]
$ mkv-analyze stats -h
| *
$ mkv-analyze stats good.h5 --help
| *

# overlap: unknown options, flags given a value, --help anywhere
$ mkv-analyze overlap
! mkv-analyze: missing FILE; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze overlap --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze overlap -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze overlap --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze overlap --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze overlap --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze overlap -h
| *
$ mkv-analyze overlap good.h5 --help
| *

# segments: unknown options, flags given a value, --help anywhere
$ mkv-analyze segments
! mkv-analyze: missing FILE; try 'mkv-analyze segments --help'
[2]
$ mkv-analyze segments --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze segments --help'
[2]
$ mkv-analyze segments -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze segments --help'
[2]
$ mkv-analyze segments --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze segments --help'
[2]
$ mkv-analyze segments --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze segments --help'
[2]
$ mkv-analyze segments --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze segments --help'
[2]
$ mkv-analyze segments -h
| *
$ mkv-analyze segments good.h5 --help
| *

# spectrum: unknown options, flags given a value, --help anywhere
$ mkv-analyze spectrum
! mkv-analyze: missing FILE; try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze spectrum --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze spectrum -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze spectrum --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze spectrum --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze spectrum --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze spectrum -h
| *
$ mkv-analyze spectrum good.h5 --help
| *

# sparsity: unknown options, flags given a value, --help anywhere
$ mkv-analyze sparsity
! mkv-analyze: missing FILE; try 'mkv-analyze sparsity --help'
[2]
$ mkv-analyze sparsity --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze sparsity --help'
[2]
$ mkv-analyze sparsity -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze sparsity --help'
[2]
$ mkv-analyze sparsity --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze sparsity --help'
[2]
$ mkv-analyze sparsity --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze sparsity --help'
[2]
$ mkv-analyze sparsity --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze sparsity --help'
[2]
$ mkv-analyze sparsity -h
| *
$ mkv-analyze sparsity good.h5 --help
| *

# channels: unknown options, flags given a value, --help anywhere
$ mkv-analyze channels
! mkv-analyze: missing FILE; try 'mkv-analyze channels --help'
[2]
$ mkv-analyze channels --bogus good.h5
! mkv-analyze: unknown option '--bogus'; try 'mkv-analyze channels --help'
[2]
$ mkv-analyze channels -x good.h5
! mkv-analyze: unknown option '-x'; try 'mkv-analyze channels --help'
[2]
$ mkv-analyze channels --quiet=1 good.h5
! mkv-analyze: option '--quiet' takes no value; try 'mkv-analyze channels --help'
[2]
$ mkv-analyze channels --threads 2 good.h5
! mkv-analyze: unknown option '--threads'; try 'mkv-analyze channels --help'
[2]
$ mkv-analyze channels --device cpu good.h5
! mkv-analyze: unknown option '--device'; try 'mkv-analyze channels --help'
[2]
$ mkv-analyze channels -h
| *
$ mkv-analyze channels good.h5 --help
| *

# one FILE only (check takes several)
$ mkv-analyze info good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze info --help'
[2]
$ mkv-analyze strategies good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze stats good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze stats --help'
[2]
$ mkv-analyze overlap good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze segments good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze segments --help'
[2]
$ mkv-analyze spectrum good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze sparsity good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze sparsity --help'
[2]
$ mkv-analyze channels good.h5 good.h5
! mkv-analyze: too many operands ('good.h5' after FILE); try 'mkv-analyze channels --help'
[2]

# option values (the dump is only read after they pass)
$ mkv-analyze stats --outlier-factor -1 good.h5
! mkv-analyze: invalid value '-1' for --outlier-factor: must be in 1..1e+06
[2]
$ mkv-analyze stats --outlier-factor 0.5 good.h5
! mkv-analyze: invalid value '0.5' for --outlier-factor: must be in 1..1e+06
[2]
$ mkv-analyze stats --outlier-factor abc good.h5
! mkv-analyze: invalid value 'abc' for --outlier-factor: not a number
[2]
$ mkv-analyze stats --outlier-factor nan good.h5
! mkv-analyze: invalid value 'nan' for --outlier-factor: not a number
[2]
$ mkv-analyze stats good.h5 --outlier-factor
! mkv-analyze: option '--outlier-factor' needs a value; try 'mkv-analyze stats --help'
[2]
$ mkv-analyze overlap --keep 0 good.h5
! mkv-analyze: invalid value '0' for --keep: must be in (0, 1]
[2]
$ mkv-analyze overlap --keep 1.5 good.h5
! mkv-analyze: invalid value '1.5' for --keep: must be in (0, 1]
[2]
$ mkv-analyze overlap --keep abc good.h5
! mkv-analyze: invalid value 'abc' for --keep: not a number
[2]
$ mkv-analyze overlap --lengths 0 good.h5
! mkv-analyze: invalid value '0' for --lengths: must be in 1..1099511627776
[2]
$ mkv-analyze overlap --lengths 256,1X good.h5
! mkv-analyze: invalid value '1X' for --lengths: expected a number with an optional K, M or G suffix
[2]
$ mkv-analyze overlap --lengths 256,,1K good.h5
! mkv-analyze: invalid value '256,,1K' for --lengths: expected a comma-separated list of at most 32 values
[2]
$ mkv-analyze overlap --prefix=1 good.h5
! mkv-analyze: option '--prefix' takes no value; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze overlap good.h5 --keep
! mkv-analyze: option '--keep' needs a value; try 'mkv-analyze overlap --help'
[2]
$ mkv-analyze segments --segment 0 good.h5
! mkv-analyze: invalid value '0' for --segment: must be in 1..1099511627776
[2]
$ mkv-analyze segments --top 0 good.h5
! mkv-analyze: invalid value '0' for --top: must be in 1..65536
[2]
$ mkv-analyze segments --outlier-factor 0.5 good.h5
! mkv-analyze: invalid value '0.5' for --outlier-factor: must be in 1..1e+06
[2]
$ mkv-analyze spectrum --energy 0.9,1.1 good.h5
! mkv-analyze: invalid value '1.1' for --energy: must be in (0, 1]
[2]
$ mkv-analyze spectrum --segment -1 good.h5
! mkv-analyze: invalid value '-1' for --segment: must be in 0..1099511627776
[2]
$ mkv-analyze spectrum --full=yes good.h5
! mkv-analyze: option '--full' takes no value; try 'mkv-analyze spectrum --help'
[2]
$ mkv-analyze sparsity --fractions '' good.h5
! mkv-analyze: invalid value '' for --fractions: expected a comma-separated list of at most 32 values
[2]
$ mkv-analyze sparsity --fractions 0.1,x good.h5
! mkv-analyze: invalid value 'x' for --fractions: not a number
[2]
$ mkv-analyze channels --shares 0 good.h5
! mkv-analyze: invalid value '0' for --shares: must be in (0, 1]
[2]

$ mkv-analyze strategies dense.h5 -o
! mkv-analyze: option '-o' needs a value; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze strategies dense.h5 --output
! mkv-analyze: option '--output' needs a value; try 'mkv-analyze strategies --help'
[2]
$ mkv-analyze info -o x.tsv full.h5
! mkv-analyze: unknown option '-o'; try 'mkv-analyze info --help'
[2]
$ mkv-analyze strategies -o dense.h5 dense.h5
! mkv-analyze: output 'dense.h5' would overwrite the input
[2]

# ---------------------------------------------------------------- compressed dumps
# info: what the file records. full stores K and V at 16 bits, so its
# physical bytes are the logical 2 layers x 2 KV heads x 2 x 40 tokens x 32
# channels x 2 bytes = 20480 (the digest and the writer's version are
# compared with h5py's reading in tests/cli_analyze_ref.sh)
$ mkv-analyze info full.h5 | sed '/^source_digest:/d; /^created_by:/d'
| file:           full.h5
| format:         mosaickv-compressed
| version:        1
| method:         full
| params:         -
| source:         syn.h5
| raw_source:     synthetic
| model:          synthetic
| layers:         2
| heads:          4
| kv_heads:       2
| head_dim:       32
| rope_theta:     10000
| k_rope:         post
| tokens:         40
| queries:        3
| logical_bytes:  20480 (20.0 KiB)
| physical_bytes: 20480 (20.0 KiB)
| ratio:          1.000
$ mkv-analyze info - | sed -n '1p; /^method:/p'
< full.h5
| file:           -
| method:         full

# strategies: mosaic and uniform2d only; a dump without segments is a header
$ mkv-analyze strategies kivi.h5
! mkv-analyze: strategies: 'kivi.h5' was compressed with 'kivi'; per-segment strategies exist for mosaic and uniform2d only
[1]
$ mkv-analyze strategies -
< kivi.h5
! mkv-analyze: strategies: '(stdin)' was compressed with 'kivi'; per-segment strategies exist for mosaic and uniform2d only
[1]
$ mkv-analyze strategies -o x.tsv kivi.h5; test ! -e x.tsv
! mkv-analyze: strategies: 'kivi.h5' was compressed with 'kivi'; per-segment strategies exist for mosaic and uniform2d only
$ mkv-analyze strategies good.h5
! mkv-analyze: 'good.h5' is a raw KV dump; mkv-analyze needs a compressed dump (mkv-compress)
[1]
$ mkv-analyze strategies dense.h5
| layer	head	tensor	segment	start	length	rotate	r	g	dprime	pervector	bits	qgroup	keydim	bound	values_bytes	qparams_bytes	bitmap_bytes	blockkey_bytes	rotation_bytes	bytes	bytes_per_token	energy_loss	output_loss

# help and version
$ mkv-analyze -h
| *
$ mkv-analyze --help
| *
$ mkv-analyze --version
| *
