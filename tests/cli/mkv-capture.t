# mkv-capture: every misuse that needs no model file, with its exact
# stderr, nothing on stdout and its exit status (2 misuse, 1 runtime), and
# no output file left behind. The refusals that need stories260K are in
# tests/cli_capture_model.sh.

# ---------------------------------------------------------------- options and modes
$ mkv-capture --frobnicate
! mkv-capture: unknown option '--frobnicate'; try 'mkv-capture --help'
[2]
$ mkv-capture -x
! mkv-capture: unknown option '-x'; try 'mkv-capture --help'
[2]
$ mkv-capture --synthetic -o
! mkv-capture: option '-o' needs a value; try 'mkv-capture --help'
[2]
$ mkv-capture --synthetic=yes -o x.h5
! mkv-capture: option '--synthetic' takes no value; try 'mkv-capture --help'
[2]
$ mkv-capture -o x.h5
! mkv-capture: nothing to do: give MODEL, --shape NAME, --synthetic or --import SRC; try 'mkv-capture --help'
[2]
$ mkv-capture --synthetic --import a.npy -o x.h5
! mkv-capture: --synthetic and --import exclude each other; try 'mkv-capture --help'
[2]
$ mkv-capture --synthetic
! mkv-capture: missing -o FILE (use '-o -' for stdout); try 'mkv-capture --help'
[2]
$ mkv-capture --synthetic -o x.h5 model.bin
! mkv-capture: --synthetic and the MODEL operand 'model.bin' exclude each other; try 'mkv-capture --help'
[2]

# ---------------------------------------------------------------- values; an option of the other mode
$ mkv-capture --synthetic --tokens 0 -o x.h5
! mkv-capture: invalid value '0' for --tokens: must be in 1..2147483647
[2]
$ mkv-capture --synthetic --tokens abc -o x.h5
! mkv-capture: invalid value 'abc' for --tokens: expected a number with an optional K, M or G suffix
[2]
$ mkv-capture --synthetic --heads 6 --kv-heads 4 -o x.h5
! mkv-capture: --heads 6 is not a multiple of --kv-heads 4
[2]
$ mkv-capture --synthetic --dtype f8 -o x.h5
! mkv-capture: invalid value 'f8' for --dtype: expected f32, f16 or bf16
[2]
$ mkv-capture --synthetic --deflate 10 -o x.h5
! mkv-capture: invalid value '10' for --deflate: must be in 0..9
[2]
$ mkv-capture --synthetic --head-dim 7 -o x.h5
! mkv-capture: --head-dim 7 must be even: RoPE rotates channel pairs
[2]
$ mkv-capture --synthetic --tokens 4K --queries 5K -o x.h5
! mkv-capture: --queries 5120 is more than --tokens 4096
[2]
$ mkv-capture --synthetic --layers 0 -o x.h5
! mkv-capture: invalid value '0' for --layers: must be in 1..1000
[2]
$ mkv-capture --synthetic --seed -1 -o x.h5
! mkv-capture: invalid value '-1' for --seed: expected an integer in 0..18446744073709551615
[2]
$ mkv-capture --synthetic --rope-theta 0 -o x.h5
! mkv-capture: invalid value '0' for --rope-theta: must be in 1..1e+12
[2]
$ mkv-capture --synthetic --param rank -o x.h5
! mkv-capture: invalid value 'rank' for --param: expected KEY=VALUE
[2]
$ mkv-capture --synthetic -P rank=4,noise -o x.h5
! mkv-capture: invalid value 'noise' for --param: expected KEY=VALUE
[2]
$ mkv-capture --synthetic -P , -o x.h5
! mkv-capture: invalid value ',' for --param: expected KEY=VALUE[,KEY=VALUE...]
[2]
$ mkv-capture --synthetic --param attn_mass=1 -o x.h5
! mkv-capture: --param: attn_mass=1 must be in (0, 1)
[2]
$ mkv-capture --synthetic --param colour=red -o x.h5
! mkv-capture: --param: unknown synthetic parameter 'colour' (known: seed, rank, noise, outliers, outlier_scale, region_len, region_sigma, value_sigma, targets, sink, recent_window, salience, query_content, attn_mass)
[2]
$ mkv-capture --synthetic --format npy -o x.h5
! mkv-capture: --format is not an option of --synthetic; try 'mkv-capture --help'
[2]
$ mkv-capture --import a.npy --tokens 5 -o x.h5
! mkv-capture: --tokens is not an option of --import; try 'mkv-capture --help'
[2]

# ---------------------------------------------------------------- --import
$ mkv-capture --import a.npy --format hdf -o x.h5
! mkv-capture: invalid value 'hdf' for --format: expected auto, safetensors, vllm or npy
[2]
$ mkv-capture --import a.npy --k-rope mid -o x.h5
! mkv-capture: invalid value 'mid' for --k-rope: expected post or pre
[2]

# ---------------------------------------------------------------- runtime errors: exit 1
$ mkv-capture --import missing.npy -o x.h5
! mkv-capture: cannot open 'missing.npy': No such file or directory
[1]
$ mkv-capture --synthetic -o no-such-dir/x.h5
! mkv-capture: cannot create 'no-such-dir/x.h5': No such file or directory
[1]
# a failed run leaves no x.h5 behind
$ test ! -e x.h5

# ---------------------------------------------------------------- a MODEL capture and --shape
$ mkv-capture model.bin --window -1 -o x.h5
! mkv-capture: invalid value '-1' for --window: must be in 0..2147483647
[2]
$ mkv-capture model.bin --generate x -o x.h5
! mkv-capture: invalid value 'x' for --generate: expected a number with an optional K, M or G suffix
[2]
$ mkv-capture model.bin --temperature -1 -o x.h5
! mkv-capture: invalid value '-1' for --temperature: must be in 0..100
[2]
$ mkv-capture model.bin --top-p 0 -o x.h5
! mkv-capture: invalid value '0' for --top-p: must be in (0, 1]
[2]
$ mkv-capture model.bin -p hi --tokens 5 -o x.h5
! mkv-capture: --tokens is not an option of a MODEL capture; try 'mkv-capture --help'
[2]
$ mkv-capture model.bin -p hi --heads 5 -o x.h5
! mkv-capture: --heads is not an option of a MODEL capture; try 'mkv-capture --help'
[2]
$ mkv-capture model.bin -p hi --print -o -
! mkv-capture: --print and -o - both write to standard output; try 'mkv-capture --help'
[2]
$ mkv-capture --synthetic m.bin -o x.h5
! mkv-capture: --synthetic and the MODEL operand 'm.bin' exclude each other; try 'mkv-capture --help'
[2]
$ mkv-capture --shape smollm2-135m m.bin -o x.h5
! mkv-capture: --shape and the MODEL operand 'm.bin' exclude each other; try 'mkv-capture --help'
[2]
$ mkv-capture a.bin b.bin -o x.h5
! mkv-capture: unexpected operand 'b.bin'; try 'mkv-capture --help'
[2]
$ mkv-capture model.bin -p hi --token-ids a -o x.h5
! mkv-capture: give only one of -p, -f and --token-ids; try 'mkv-capture --help'
[2]
$ mkv-capture model.bin -p hi --system x -o x.h5
! mkv-capture: --system needs --chat; try 'mkv-capture --help'
[2]
$ mkv-capture model.bin --chat --token-ids a -o x.h5
! mkv-capture: --chat applies to text prompts, not --token-ids; try 'mkv-capture --help'
[2]
$ mkv-capture model.bin -p hi
! mkv-capture: missing -o FILE (use '-o -' for stdout); try 'mkv-capture --help'
[2]
$ mkv-capture --shape gpt-5 -o x.h5
! mkv-capture: unknown shape 'gpt-5' (known: llama3.1-8b, qwen2.5-7b, smollm2-135m, llama2-7b, mistral-7b, ministral-8b)
[2]
$ mkv-capture model.bin -p hi --vocab 5 -o x.h5
! mkv-capture: --vocab is not an option of a MODEL capture; try 'mkv-capture --help'
[2]
$ mkv-capture --shape smollm2-135m --print -o x.h5
! mkv-capture: --print is not an option of --shape; try 'mkv-capture --help'
[2]
$ mkv-capture --shape smollm2-135m --layers 30 -o x.h5
! mkv-capture: invalid value '30' for --layers: the model has 30 layers (0..29)
[2]
$ mkv-capture --shape qwen2.5-7b --bos -o x.h5
! mkv-capture: --bos: shape qwen2.5-7b with a vocabulary of 152064 has no BOS token
[2]
# Llama-3.1-8B's 32 layers in float32: 8.03e9 weights = 29.9 GiB; its KV
# cache for 1K tokens adds 0.25 GiB and the activations the rest.
$ mkv-capture --shape llama3.1-8b --max-memory 1G --threads 1 -o x.h5
! mkv-capture: shape llama3.1-8b with 32 layers and a vocabulary of 128256 needs about 30.3 GiB (weights 29.9 GiB), more than the 1.0 GiB of --max-memory; build fewer layers (--layers) or a smaller vocabulary (--vocab)
[1]
$ test ! -e x.h5

# ---------------------------------------------------------------- warnings: exit 0
# synthetic parameters beyond what the shape allows are clamped, said, and
# recorded as used, so synthetic_params remakes the same file
$ mkv-capture --synthetic --layers 1 --heads 2 --kv-heads 1 --head-dim 56 --tokens 64 --queries 2 -P outliers=100,rank=60 -o syn.h5
! mkv-capture: warning: synthetic: rank=60 is more than head_dim 56: 56 used
! mkv-capture: warning: synthetic: outliers=100 is more than head_dim/4 = 14: 14 used
$ mkv-capture --synthetic --layers 1 --heads 2 --kv-heads 1 --head-dim 56 --tokens 64 --queries 2 -P outliers=14,rank=56 -o syn2.h5
$ cmp syn.h5 syn2.h5
% skip-unless-h5py
$ "$PY" -c 'import h5py; print(h5py.File("syn.h5").attrs["synthetic_params"].decode())'
| seed=1 rank=56 noise=0.1 outliers=14 outlier_scale=6 region_len=128 region_sigma=0.3 value_sigma=0.5 targets=4 sink=1 recent_window=64 salience=2.5 query_content=0.1 attn_mass=0.8
