# mkv-decode: usage errors (exit 2) and runtime errors (exit 1), each with
# its exact stderr and nothing on stdout, and the shape of what a run
# writes. The model is tests/model_fixture.py's: random weights, a byte
# tokenizer, a context of 512 tokens.

% skip-unless-h5py
% "$PY" "$top_srcdir/tests/model_fixture.py" model.bin tok.bin
% printf 'short text' >short.txt
% cp "$top_srcdir/data/heldout.txt" text.txt

# ---------------------------------------------------------------- usage errors: exit 2
$ mkv-decode
! mkv-decode: missing MODEL (or --shape NAME); try 'mkv-decode --help'
[2]
$ mkv-decode model.bin a
! mkv-decode: too many operands ('a' after MODEL); try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --shape smollm2-135m
! mkv-decode: MODEL and --shape exclude each other; try 'mkv-decode --help'
[2]
$ mkv-decode --shape smollm2-135m --ppl text.txt
! mkv-decode: --ppl needs a real model, not --shape (random weights measure speed only); try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --tokens 5 --context 100 --ppl text.txt
! mkv-decode: --tokens is not an option of --ppl; try 'mkv-decode --help'
[2]

# options of the other mode
$ mkv-decode model.bin --context 100 -p hi
! mkv-decode: --context is not an option of generation; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --ppl text.txt -p hi
! mkv-decode: --prompt is not an option of --ppl; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --ppl text.txt --stats s.tsv
! mkv-decode: --stats is not an option of --ppl; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin -p hi --per-token t.tsv
! mkv-decode: --per-token is not an option of generation; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin -p hi --windows 2
! mkv-decode: --windows is not an option of generation; try 'mkv-decode --help'
[2]

$ mkv-decode model.bin --needle --ppl text.txt
! mkv-decode: --ppl and --needle exclude each other; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --needle -p hi
! mkv-decode: --prompt is not an option of --needle; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --needle --score 5
! mkv-decode: --score is not an option of --needle; try 'mkv-decode --help'
[2]
$ mkv-decode --shape smollm2-135m --needle
! mkv-decode: --needle needs a real model, not --shape (random weights measure speed only); try 'mkv-decode --help'
[2]
$ mkv-decode model.bin -p hi --fill 100
! mkv-decode: --fill is for speed runs with --shape (synthetic rows under a real model mean nothing); try 'mkv-decode --help'
[2]
$ mkv-decode --shape smollm2-135m --fill 100 -m quest
! mkv-decode: --fill fills the full cache (and quest's and mosaic's with --device gpu); method 'quest' compresses a real prefill
[2]
$ mkv-decode model.bin --ppl text.txt --fill 100
! mkv-decode: --fill is not an option of --ppl; try 'mkv-decode --help'
[2]
$ mkv-decode --shape smollm2-135m --fill 0
! mkv-decode: invalid value '0' for --fill: must be in 1..2147483647
[2]
# a filled cache past the shape's context of 8192: the steps count the filled positions
$ mkv-decode --shape smollm2-135m --fill 8200 --tokens 8 -n 2 --device cpu --threads 2 --stats s.tsv -q >/dev/null && cut -f1,2,4 s.tsv | tr '\t' ' '
| step tokens tail_tokens
| 1 8209 1
| 2 8210 2

# values
$ mkv-decode model.bin --needle --depths 0,2
! mkv-decode: invalid value '2' for --depths: must be in 0..1
[2]
$ mkv-decode model.bin --tokenizer tok.bin --needle --lengths 20
! mkv-decode: --lengths: 20 tokens cannot hold a passkey prompt
[2]
$ mkv-decode model.bin --ppl text.txt --context 0
! mkv-decode: invalid value '0' for --context: must be in 1..2147483647
[2]
$ mkv-decode model.bin -p hi --window 0
! mkv-decode: invalid value '0' for --window: must be in 1..65536
[2]
$ mkv-decode model.bin -p hi --manager later
! mkv-decode: invalid value 'later' for --manager: expected async, sync or off
[2]
$ mkv-decode model.bin -p hi --close-loss 1.5
! mkv-decode: invalid value '1.5' for --close-loss: must be in 0..1
[2]
$ mkv-decode model.bin --tokenizer tok.bin -p hi -n 2 -m quest --manager off 2>&1 >/dev/null | grep -e --manager
| mkv-decode: warning: --manager applies to the dual buffer of mosaic and uniform2d only; method quest ignores it
$ mkv-decode model.bin -p hi -m nope
! mkv-decode: unknown method 'nope' (methods: full, mosaic, uniform2d, quest, think, kivi, snapkv, streaming, naive2d, turboquant, cam)
[2]
$ mkv-decode model.bin -p hi -m quest -P budget=0
! mkv-decode: method 'quest': invalid value '0' for parameter 'budget': must be in (0, 1e+15]
[2]
$ mkv-decode model.bin --tokenizer tok.bin -p hi -n 5 -m quest -P budget=600
! mkv-decode: method 'quest': budget=600 tokens is larger than the context of 4 tokens
[2]

# outputs that would destroy an input or mix with the text
$ mkv-decode model.bin -p hi --stats -
! mkv-decode: --stats - and the generated text both write to standard output; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --ppl text.txt -o text.txt
! mkv-decode: -o would overwrite the --ppl text; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --ppl text.txt --per-token -
! mkv-decode: --per-token - and the perplexity table both write to standard output; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --ppl text.txt --per-token text.txt
! mkv-decode: --per-token would overwrite the --ppl text; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin --ppl text.txt -o p.tsv --per-token ./p.tsv
! mkv-decode: --per-token and -o name the same file; try 'mkv-decode --help'
[2]

# ---------------------------------------------------------------- runtime errors: exit 1
$ mkv-decode nosuch.bin -p hi
! mkv-decode: cannot open 'nosuch.bin': No such file or directory
[1]
$ mkv-decode model.bin --tokenizer tok.bin --ppl nosuch.txt
! mkv-decode: cannot open 'nosuch.txt': No such file or directory
[1]
$ mkv-decode model.bin --tokenizer tok.bin -p hi --tokens 50 -n 1
! mkv-decode: --tokens 50: the prompt has only 4 tokens
[1]
$ mkv-decode model.bin --tokenizer tok.bin --ppl short.txt --context 100 --score 10
! mkv-decode: the text has 12 tokens; context 100 and 10 scored need 111
[1]
$ mkv-decode model.bin --tokenizer tok.bin --ppl short.txt --context 4 --score 2 --windows 2
! mkv-decode: the text has 12 tokens; 2 windows of context 4 and 2 scored need 14
[1]
$ mkv-decode model.bin --tokenizer tok.bin --ppl text.txt --context 1K --score 10
! mkv-decode: a run of 1034 tokens exceeds the context of 512 of model 'model'
[1]
$ mkv-decode model.bin --tokenizer tok.bin -p hi -n 600
! mkv-decode: the prompt has 4 tokens; 600 more to generate exceed the context of 512
[1]
$ mkv-decode model.bin --tokenizer tok.bin --needle --lengths 1K
! mkv-decode: a prompt of 1024 tokens exceeds the context of 512 of model 'model'
[1]
$ mkv-decode model.bin --tokenizer tok.bin --needle --lengths 200
! mkv-decode: cannot fit a passkey prompt in 188 tokens
[1]
$ mkv-decode model.bin --tokenizer tok.bin --needle --lengths 300 --filler nosuch.txt
! mkv-decode: cannot open 'nosuch.txt': No such file or directory
[1]
$ mkv-decode model.bin --tokenizer tok.bin -p hi -n 3 --stats nosuch/s.tsv
! mkv-decode: cannot create 'nosuch/s.tsv': No such file or directory
[1]
$ mkv-decode model.bin --tokenizer tok.bin --ppl text.txt --context 64 --score 8 -o nosuch/p.tsv
! mkv-decode: cannot create 'nosuch/p.tsv': No such file or directory
[1]
$ mkv-decode model.bin --tokenizer tok.bin --ppl text.txt --context 64 --score 8 -o p.tsv --per-token nosuch/t.tsv
! mkv-decode: cannot create 'nosuch/t.tsv': No such file or directory
[1]
$ test ! -e p.tsv && echo 'no table'
| no table

# ---------------------------------------------------------------- runs
# the perplexity table: one row per context
$ mkv-decode model.bin --tokenizer tok.bin --ppl text.txt --context 64,128 --score 8 -m quest -q | cut -f1-4 | tr '\t' ' '
| context scored method params
| 64 8 quest page=16 budget=0.1 sink=4 recent=64 agg=max
| 128 8 quest page=16 budget=0.1 sink=4 recent=64 agg=max
# the per-token table: one row per scored token, its target's position
$ mkv-decode model.bin --tokenizer tok.bin --ppl text.txt --context 64,128 --score 3 -m quest -q -o p.tsv --per-token t.tsv && cut -f1-2 t.tsv | tr '\t' ' '
| context position
| 64 65
| 64 66
| 64 67
| 128 129
| 128 130
| 128 131
# two windows: the second starts where the first ends (64 + 3 + 1 tokens)
$ mkv-decode model.bin --tokenizer tok.bin --ppl text.txt --context 64 --score 3 --windows 2 -q -o p.tsv --per-token t.tsv && echo $(cut -f2 p.tsv) $(cut -f2 t.tsv)
| scored 6 position 65 66 67 133 134 135
# the step table: every step adds one dense 16-bit token (2 layers x 2 KV
# heads x K and V x 8 channels x 2 bytes = 128 bytes) to the 4 of the prompt
$ mkv-decode model.bin --tokenizer tok.bin -p hi -n 3 -m streaming -P keep=0.5 --stats s.tsv -q >/dev/null && cut -f1-4,6 s.tsv | tr '\t' ' '
| step tokens prefix_tokens tail_tokens logical_bytes
| 1 5 4 1 640
| 2 6 4 2 768
| 3 7 4 3 896
# --tokens cuts a real prompt to its first N tokens: the first step finds
# N in the cache and adds its own
$ mkv-decode model.bin --tokenizer tok.bin -f text.txt --tokens 20 -n 2 --stats s.tsv -q >/dev/null && cut -f1-4 s.tsv | tr '\t' ' '
| step tokens prefix_tokens tail_tokens
| 1 21 0 1
| 2 22 0 2
# the retrieval table: one row per length, depth and trial; the same seed
# gives the same keys (this random model does not find them)
$ mkv-decode model.bin --tokenizer tok.bin --needle --lengths 300 --depths 0,1 --trials 2 --seed 3 -m quest -q | cut -f1-3,5-7 | tr '\t' ' '
| length depth trial needle_depth passkey method
| 300 0 0 0.0000 69479 quest
| 300 0 1 0.0000 68879 quest
| 300 1 0 1.0000 8132288 quest
| 300 1 1 1.0000 7206178 quest
# the prompts themselves, one row per case, the passkey inside
$ mkv-decode model.bin --tokenizer tok.bin --needle --lengths 300 --depths 0,1 --seed 3 --prompts p.tsv -q >/dev/null && cut -f1-4 p.tsv | tr '\t' ' ' && awk -F'\t' 'NR > 1 && index($5, "The pass key is " $4 ".") { n++ } END { print n }' p.tsv
| length depth trial passkey
| 300 0 0 69479
| 300 1 0 8132288
| 2
$ mkv-decode model.bin --tokenizer tok.bin --needle --lengths 300 --prompts out.tsv -o out.tsv
! mkv-decode: --prompts and -o name the same file
[2]

# ---------------------------------------------------------------- the device: usage errors (exit 2)
$ mkv-decode model.bin -p hi -m kivi --device gpu
! mkv-decode: method 'kivi' has no GPU decode path yet (only full, quest and mosaic have); use --device cpu
[2]
$ mkv-decode --shape smollm2-135m --batch 2
! mkv-decode: --batch is for speed runs with --shape and --device gpu; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin -p hi --layers 0
! mkv-decode: --layers is for speed runs with --shape (a real model without some of its layers means nothing); try 'mkv-decode --help'
[2]
$ mkv-decode model.bin -p hi -m mosaic -P refine=2 --device gpu
! mkv-decode: mosaic on the GPU: refine=2 (the GPU kernel selects whole blocks: refine=1); use --device cpu
[2]
$ mkv-decode model.bin -p hi --device tpu
! mkv-decode: invalid value 'tpu' for --device: expected auto, cpu or gpu
[2]
$ mkv-decode model.bin -p hi --gpu-weights f8
! mkv-decode: invalid value 'f8' for --gpu-weights: expected f32 or f16
[2]
$ mkv-decode model.bin -p hi --gpu-blockkeys 4
! mkv-decode: invalid value '4' for --gpu-blockkeys: expected 16 or 8
[2]
$ mkv-decode model.bin -p hi --device gpu --gpu-blockkeys 8
! mkv-decode: --gpu-blockkeys is an option of -m mosaic with --device gpu; try 'mkv-decode --help'
[2]
$ mkv-decode model.bin -p hi --device cpu --gpu-weights f16
! mkv-decode: --gpu-weights is an option of --device gpu or auto; try 'mkv-decode --help'
[2]
