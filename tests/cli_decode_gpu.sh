#!/bin/sh
# mkv-decode --device: on a GPU, the GPU forward pass against the CPU's on
# stories260K: the same greedy text over 60 tokens (float32 weights), and
# perplexity over data/heldout.txt within 1e-3 relative (float32 and fp16
# weights); --device auto takes the GPU (the -v line says so).  Without
# CUDA or without a GPU: --device gpu fails in one line (exit 1) naming
# why, and --device auto decodes on the CPU exactly as --device cpu does.
. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_decode_gpu mkv-decode
STORIES=$MODELS/stories260K.bin
[ -r "$STORIES" ] || { echo "SKIP: no $STORIES (MKV_MODELS_DIR)"; exit 77; }
gen() { "$DECODE" "$STORIES" -q -p "Once upon a time" -n 60 "$@"; }

gen --device cpu >cpu.txt 2>cpu.err || { echo "FAIL: --device cpu: $(cat cpu.err)"; exit 1; }
[ -s cpu.txt ] || { echo "FAIL: --device cpu wrote nothing"; exit 1; }
if "$DECODE" --version | grep -q '^CUDA: no CUDA'; then
    expect "--device gpu without CUDA" 1 '' \
        "mkv-decode: --device gpu: built without CUDA (use --device cpu or auto)" \
        gen --device gpu
    gpu=0
elif "$DECODE" --version | grep -q '^GPUs: none found'; then
    expect "--device gpu without a GPU" 1 '' \
        "mkv-decode: --device gpu: no GPU found (use --device cpu or auto)" \
        gen --device gpu
    gpu=0
else
    gpu=1
fi

if [ $gpu = 0 ]; then
    gen --device auto >auto.txt 2>auto.err || fail "--device auto: $(cat auto.err)"
    if cmp -s cpu.txt auto.txt; then pass; else fail "--device auto without a GPU differs from --device cpu"; fi
    cli_finish
    exit
fi

gen --device gpu >gpu.txt 2>gpu.err || { echo "FAIL: --device gpu: $(cat gpu.err)"; exit 1; }
if cmp -s cpu.txt gpu.txt; then pass; else
    fail "greedy text on the GPU differs from the CPU's:"; diff cpu.txt gpu.txt | sed 's/^/    /'
fi
"$DECODE" "$STORIES" -v -p Once -n 4 >/dev/null 2>auto.err || fail "--device auto: $(cat auto.err)"
if grep -q '^mkv-decode: decoding on GPU 0' auto.err; then pass; else
    fail "--device auto did not take the GPU:"; sed 's/^/    /' auto.err
fi
# the ppl column (5th) of each table, CPU against GPU
"$DECODE" "$STORIES" -q --ppl "$top_srcdir/data/heldout.txt" --context 200,400 --score 100 --device cpu \
    -o ppl-cpu.tsv || fail "--ppl on the CPU"
for w in f32 f16; do
    "$DECODE" "$STORIES" -q --ppl "$top_srcdir/data/heldout.txt" --context 200,400 --score 100 --device gpu \
        --gpu-weights $w -o ppl-gpu-$w.tsv || { fail "--ppl on the GPU ($w weights)"; continue; }
    if paste ppl-cpu.tsv ppl-gpu-$w.tsv | awk -F'\t' -v w=$w '
        NR == 1 { n = NF / 2; next }
        { a = $5; b = $(n + 5); r = (b - a) / a; if (r < 0) r = -r
          printf "context %s: perplexity %s on the CPU, %s on the GPU (%s weights, %.2g relative)\n", $1, a, b, w, r
          if (!(r <= 1e-3)) bad = 1; rows++ }
        END { exit bad || rows != 2 }'; then pass; else fail "--ppl on the GPU ($w weights) is not the CPU's"; fi
done
cli_finish
