#!/bin/sh
# mkv-capture MODEL and --shape, checked against independent references:
#
# - llama2.c models: the one tests/model_fixture.py writes here (numpy
#   weights, 5 layers, a tokenizer whose merges it learns from
#   data/filler.txt) and, when it is there, stories260K (Karpathy's
#   TinyStories model).  K, V and queries in the dump must agree with
#   tests/model_ref.py's float64 numpy forward pass to 1e-4 relative, for
#   post- and pre-RoPE keys, a layer subset, several prefill chunks and a
#   query window that straddles them; generated tokens must be the
#   reference's greedy choice and --print their text; prompts are tokenized
#   by tests/model_ref.py (a numpy tokenizer written from the format
#   description).  Read with h5py, which shares no code with libmosaickv.
# - the same weights written here as a Hugging Face directory (numpy writes
#   config.json and model.safetensors, q/k rows in rotate_half order): the
#   dump must hold the reference's K/V/Q with each head's channels permuted.
# - stories260K only: greedy generation from BOS + "Once upon a time" must
#   give the published sample's token ids and text.
# - SmolLM2-135M-Instruct (GGUF, optional: scripts/get-models, MKV_SMOLLM2):
#   --chat answers "What is the capital of France?" with Paris; ChatML turns.
# - shape-only models: layout and attributes, determinism, HF rotate_half
#   RoPE with the shape's base recomputed in numpy from pre- and post-RoPE
#   captures, layer selection that keeps a layer's weights.
# - every bad input that needs the model: exact stderr, exit status, no
#   output file left behind (those that need none: tests/cli/mkv-capture.t).
#
# Environment: top_builddir, top_srcdir (set by `make check`; default .),
# PYTHON_H5PY (python with h5py and numpy; default /usr/bin/python3),
# MKV_MODELS_DIR (directory holding stories260K.bin and tok512.bin; default
# $top_srcdir/../shared/models), MKV_SMOLLM2 (the SmolLM2 GGUF; default in
# ${MKV_CACHE_DIR:-$HOME/.cache/mosaickv}).  Without stories260K only its
# published-sample cases are skipped; without h5py and numpy the model
# fixture and the numerical cases are.  Each skip says so, and the test
# exits 77 after the others pass.  Exit: 0 pass, 1 fail, 77 skip.

. "${top_srcdir:-.}/tests/cli/common.sh"
cli_init cli_capture_model mkv-capture
REF=$top_srcdir/tests/model_ref.py

skipped=0
if [ -r "$MODELS/stories260K.bin" ] && [ -r "$MODELS/tok512.bin" ]; then
    MODELS=$(cd "$MODELS" && pwd)
    have_stories=1
else
    # a file no test can write: said, and the rest still decides
    echo "SKIP: stories260K cases (its published sample): no stories260K.bin and tok512.bin in '$MODELS' (set MKV_MODELS_DIR)"
    have_stories=0
fi
if [ $have_h5py = 0 ]; then
    echo "SKIP: the model fixture and the numerical cases: no python with h5py and numpy (set PYTHON_H5PY)"
    skipped=1
fi

# py NAME SCRIPT ARG...: run a python check; it prints FAIL lines and exits 1.
py() {
    name=$1
    shift
    if "$PY" "$@"; then pass; else fail "$name"; fi
}

P=mkv-capture
PUBLISHED="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."

# Compare a dump with model_ref.py's forward pass over the dump's own tokens.
# check.py DUMP CHECKPOINT [--pre] [--layers 1,3,4] [--window W] [--generated N]
#          [--hf NAME] [--print OUT --tokenizer TOK]: the dump is of the
#          checkpoint converted by mkhf.py into the Hugging Face directory
#          NAME (q/k channels in rotate_half order); OUT holds what --print
#          wrote, the text of the generated tokens in TOK's pieces
cat >check.py <<'EOF'
import re
import sys
import h5py
import numpy as np

sys.path.insert(0, sys.argv[1])
import model_ref

dump, ckpt = sys.argv[2], sys.argv[3]
opts = sys.argv[4:]
pre = "--pre" in opts
def opt(name, default):
    return opts[opts.index(name) + 1] if name in opts else default
shape, w = model_ref.read_checkpoint(ckpt)
H, KV, hd = shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
layers = [int(x) for x in opt("--layers", ",".join(str(l) for l in range(shape["n_layers"]))).split(",")]
window = int(opt("--window", "-1"))
generated = int(opt("--generated", "0"))
hf = opt("--hf", None)
printed = opt("--print", None)

def fail(msg):
    print("FAIL: %s: %s" % (dump, msg))
    sys.exit(1)

f = h5py.File(dump, "r")
a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
name = hf or re.sub(r"\.bin$", "", ckpt.split("/")[-1])
want = {"mkv_format": "mosaickv-dump", "mkv_version": 1, "model": name,
        "n_layers": len(layers), "n_heads": H, "n_kv_heads": KV, "head_dim": hd,
        "rope_theta": 10000.0, "k_rope": "pre" if pre else "post", "source": "capture",
        "layer_index": ",".join(str(l) for l in layers)}
for k, v in want.items():
    if a.get(k) != v:
        fail("attribute %s = %r, expected %r" % (k, a.get(k), v))
if "weights" in a:
    fail("a model file's dump says weights=%r" % a["weights"])
tokens = [int(t) for t in f["tokens"][:]]
T = len(tokens)
n_prompt = T - generated
W = min(window, n_prompt) if window >= 0 else min(32, n_prompt)
qpos = f["query_pos"][:]
if list(qpos) != list(range(n_prompt - W, T)):
    fail("query_pos %r, expected %d..%d" % (list(qpos), n_prompt - W, T - 1))

captured, logits = model_ref.forward(shape, w, tokens, 10000.0, hd, "interleaved",
                                     np.float32(1e-5).astype(np.float64), None)
# each generated token is the reference's greedy choice (or within float32
# rounding of it)
for t in range(n_prompt - 1, T - 1):
    row = logits[t]
    if row[tokens[t + 1]] < row.max() - 1e-4 * np.abs(row).max():
        fail("token %d = %d is not the greedy choice %d" % (t + 1, tokens[t + 1], int(row.argmax())))
if printed:
    pieces, _ = model_ref.read_tokenizer(opt("--tokenizer", None))
    text = b""
    for prev, tok in zip(tokens[n_prompt - 1:], tokens[n_prompt:]):
        p = pieces[tok]
        m = re.fullmatch(rb"<0x([0-9A-F]{2})>", p)
        text += bytes([int(m.group(1), 16)]) if m else p[1:] if prev == 1 and p[:1] == b" " else p
    with open(printed, "rb") as fp:
        out = fp.read()
    if out != text + b"\n":
        fail("--print wrote %r, the generated tokens are %r" % (out, text))
def close(name, got, ref):
    if got.shape != ref.shape:
        fail("%s: shape %r, expected %r" % (name, got.shape, ref.shape))
    err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    if not err <= 1e-4:
        fail("%s: relative error %.3g > 1e-4" % (name, err))
positions = np.arange(T, dtype=np.float64)
# rotate_half order: channel j is interleaved channel 2j, channel j + hd/2 is 2j + 1
perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)]) if hf else np.arange(hd)
for i, l in enumerate(layers):
    q, k, k_pre, v = [x[..., perm] for x in captured[l][:3]] + [captured[l][3]]
    g = f["layers/%02d" % i]
    if g["k"].dtype != np.float32:
        fail("dtype %r" % g["k"].dtype)
    close("layer %d k" % l, g["k"][:].astype(np.float64), k_pre if pre else k)
    close("layer %d v" % l, g["v"][:].astype(np.float64), v)
    q_ref = q[:, qpos, :]
    if pre:
        # undo RoPE with the reference's own rotation at the negated positions
        q_ref = model_ref.rope(q_ref.transpose(1, 0, 2), -positions[qpos], 10000.0, hd,
                               "half" if hf else "interleaved").transpose(1, 0, 2)
    close("layer %d q" % l, g["q"][:].astype(np.float64), q_ref)
EOF

# The same weights as a Hugging Face directory (config.json +
# model.safetensors written by numpy, q/k rows permuted into rotate_half
# order as HF checkpoints have them); token ids need no tokenizer.json.
# mkhf.py TESTS CHECKPOINT DIR
cat >mkhf.py <<'EOF'
import json
import os
import struct
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import model_ref
shape, w = model_ref.read_checkpoint(sys.argv[2])
out = sys.argv[3]
os.makedirs(out, exist_ok=True)
H, KV, hd, L = shape["n_heads"], shape["n_kv_heads"], shape["head_dim"], shape["n_layers"]
perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
def rows(m, heads):
    return m.reshape(heads, hd, -1)[:, perm, :].reshape(heads * hd, -1)
t = {"model.embed_tokens.weight": w["embedding"], "model.norm.weight": w["rms_final"]}
for l in range(L):
    p = "model.layers.%d." % l
    t[p + "input_layernorm.weight"] = w["rms_att"][l]
    t[p + "post_attention_layernorm.weight"] = w["rms_ffn"][l]
    t[p + "self_attn.q_proj.weight"] = rows(w["wq"][l], H)
    t[p + "self_attn.k_proj.weight"] = rows(w["wk"][l], KV)
    t[p + "self_attn.v_proj.weight"] = w["wv"][l]
    t[p + "self_attn.o_proj.weight"] = w["wo"][l]
    t[p + "mlp.gate_proj.weight"] = w["w1"][l]
    t[p + "mlp.down_proj.weight"] = w["w2"][l]
    t[p + "mlp.up_proj.weight"] = w["w3"][l]
header, blobs, at = {}, [], 0
for name, a in t.items():
    b = np.ascontiguousarray(a, dtype="<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
    blobs.append(b)
    at += len(b)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as fp:
    fp.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape["dim"],
       "intermediate_size": shape["hidden"], "num_hidden_layers": L, "num_attention_heads": H,
       "num_key_value_heads": KV, "vocab_size": shape["vocab"], "max_position_embeddings": 512,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
       "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
with open(os.path.join(out, "config.json"), "w") as fp:
    json.dump(cfg, fp)
EOF

# ================================================================ llama2.c models
# llama2c_cases CHECKPOINT TOKENIZER 'ID ...' 'HEADER': the cases for a
# llama2.c checkpoint (absolute path) of 5 layers, a vocabulary and a
# context of 512, with its tokenizer beside it; the ids of "Once upon a
# time" without BOS; HEADER as the loader describes the checkpoint's header.
# Run in a fresh directory of their own.
llama2c_cases() {
    MODEL=$1 TOK=$2 PROMPT_IDS=$3 HEADER=$4
    TOKNAME=${TOK##*/}
    printf '%s\n' "$PROMPT_IDS" >prompt.ids
    if [ $have_h5py = 1 ]; then
        # ids of the published text, BOS first, from the numpy tokenizer
        printf '%s' "$PUBLISHED" >published.txt
        "$PY" "$REF" tokenize "$TOK" published.txt >published.ids || fail "model_ref.py tokenize"
        printf 'Once upon a time' >once.txt
        "$PY" "$REF" tokenize "$TOK" once.txt >once.ids || fail "model_ref.py tokenize"
        if [ "$(cat once.ids)" = "1 $PROMPT_IDS" ]; then pass
        else fail "model_ref.py: 'Once upon a time' is '$(cat once.ids)', the test says '1 $PROMPT_IDS'"; fi
    fi

    expect "capture and generate 20" 0 '*' '' "$CAPTURE" "$MODEL" -p "Once upon a time" --generate 20 \
        --dtype f32 --print -o gen.h5
    cp got.out gen.out
    if [ -x "$ANALYZE" ]; then
        expect "generated dump validates" 0 '*' '' "$ANALYZE" check gen.h5
    fi
    if [ $have_h5py = 1 ]; then
        py "K/V/Q of prompt and generated tokens vs model_ref.py, greedy tokens, --print" \
            "$tmp/check.py" "$top_srcdir/tests" gen.h5 "$MODEL" --generated 20 --print gen.out --tokenizer "$TOK"
    fi

    # pre-RoPE keys (and queries), the default window capped at the prompt
    expect "--k-rope pre" 0 '*' '' "$CAPTURE" "$MODEL" -p "Once upon a time" --k-rope pre --dtype f32 -o pre.h5
    # a layer subset, a prompt over several prefill chunks, a query window
    # that straddles chunks, two threads, the prompt on stdin
    printf '%s' "$PUBLISHED" | "$CAPTURE" "$MODEL" --layers 1,3-4 --chunk 5 --window 7 \
        --threads 2 --dtype f32 -o sub.h5 2>sub.err
    if [ $? -eq 0 ] && [ ! -s sub.err ]; then pass; else fail "prompt on stdin, --layers 1,3-4 --chunk 5: $(cat sub.err)"; fi
    if [ $have_h5py = 1 ]; then
        expect "--token-ids, --window 0" 0 '*' '' "$CAPTURE" "$MODEL" --token-ids published.ids \
            --window 0 --generate 2 --dtype f32 -o ids.h5
        py "--k-rope pre vs model_ref.py" "$tmp/check.py" "$top_srcdir/tests" pre.h5 "$MODEL" --pre
        py "--layers 1,3-4 --chunk 5 --window 7 vs model_ref.py" "$tmp/check.py" "$top_srcdir/tests" sub.h5 "$MODEL" --layers 1,3,4 --window 7
        py "--window 0 --generate 2: only the generated positions are queries" \
            "$tmp/check.py" "$top_srcdir/tests" ids.h5 "$MODEL" --window 0 --generated 2
    fi

    # stdout, float16 default, through a pipe into the validator
    if [ -x "$ANALYZE" ]; then
        if "$CAPTURE" "$MODEL" -p "Once upon a time" --generate 3 -o - 2>pipe.err |
           "$ANALYZE" check - >check.out 2>&1 && [ "$(cat check.out)" = "(stdin): ok" ] && [ ! -s pipe.err ]
        then pass; else fail "-o - | mkv-analyze check -: $(cat pipe.err check.out)"; fi
    fi
    # the same prompt as token ids or as text gives the same tokens (and bytes: BOS given explicitly)
    expect "--token-ids --bos" 0 '*' '' "$CAPTURE" "$MODEL" --token-ids prompt.ids --bos --dtype f32 -o a.h5
    expect "text prompt" 0 '*' '' "$CAPTURE" "$MODEL" -p "Once upon a time" --dtype f32 -o b.h5
    if [ $have_h5py = 1 ]; then
        py "token ids and text give the same K/V" - a.h5 b.h5 "1 $PROMPT_IDS" <<'EOF'
import sys
import h5py
import numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
want = [int(t) for t in sys.argv[3].split()]
if list(a["tokens"][:]) != want or list(b["tokens"][:]) != want:
    print("FAIL: tokens %r %r, expected %r" % (list(a["tokens"][:]), list(b["tokens"][:]), want))
    sys.exit(1)
for l in range(5):
    for kind in "kvq":
        x, y = a["layers/%02d/%s" % (l, kind)][:], b["layers/%02d/%s" % (l, kind)][:]
        if not np.array_equal(x, y):
            print("FAIL: layer %d %s differs" % (l, kind))
            sys.exit(1)
EOF
    fi

    # The same weights as a Hugging Face directory: K/V/Q must be the
    # reference's with the channels of each head permuted the same way.
    if [ $have_h5py = 1 ]; then
        if "$PY" "$tmp/mkhf.py" "$top_srcdir/tests" "$MODEL" as-hf; then pass; else fail "mkhf.py"; fi
        expect "Hugging Face directory" 0 '*' '' "$CAPTURE" as-hf --token-ids published.ids --window 9 \
            --dtype f32 -o hf.h5
        py "Hugging Face directory vs model_ref.py" "$tmp/check.py" "$top_srcdir/tests" hf.h5 "$MODEL" --hf as-hf --window 9
        expect "Hugging Face directory, pre-RoPE" 0 '*' '' "$CAPTURE" as-hf --token-ids prompt.ids --bos \
            --k-rope pre --layers 2 --dtype f32 -o hfpre.h5
        py "Hugging Face directory, pre-RoPE, vs model_ref.py" "$tmp/check.py" "$top_srcdir/tests" hfpre.h5 "$MODEL" --hf as-hf --pre --layers 2
        expect "--tokenizer with a directory" 2 '*' "$P: --tokenizer is for llama2.c checkpoints; 'as-hf' (hf) carries its own tokenizer" \
            "$CAPTURE" as-hf --tokenizer "$TOK" --token-ids prompt.ids -o x.h5
        mkdir not-a-model
        expect "directory without config.json" 1 '*' "$P: 'not-a-model': a directory without config.json is not a Hugging Face model" \
            "$CAPTURE" not-a-model --token-ids prompt.ids -o x.h5
    fi

    # the thread count changes nothing, to the byte
    expect "one thread" 0 '*' '' "$CAPTURE" "$MODEL" -p "Once upon a time there was" --generate 10 --threads 1 -o t1.h5
    expect "two threads" 0 '*' '' "$CAPTURE" "$MODEL" -p "Once upon a time there was" --generate 10 --threads 2 -o t2.h5
    if cmp -s t1.h5 t2.h5; then pass; else fail "--threads 1 and 2 gave different dumps"; fi

    # ---------------------------------------------------------- bad input
    awk 'BEGIN { for (i = 0; i < 600; i++) printf "5 "; print "" }' >long.ids
    awk 'BEGIN { for (i = 0; i < 500; i++) printf "5\n" }' >l500.ids
    printf '1 2\n512 7\n' >big.ids
    printf '1 2x 5\n' >word.ids
    : >empty.ids
    head -c 1000 "$MODEL" >trunc.bin
    cp "$MODEL" alone.bin
    cp "$MODEL" model.bin
    expect "prompt longer than the context" 1 '*' "$P: the prompt has 600 tokens, more than the context of 512" \
        "$CAPTURE" "$MODEL" --token-ids long.ids -o x.h5
    expect "generation past the context" 1 '*' "$P: the prompt has 500 tokens; 20 more to generate exceed the context of 512" \
        "$CAPTURE" "$MODEL" --token-ids l500.ids --generate 20 -o x.h5
    expect "empty prompt" 1 '*' "$P: empty prompt" "$CAPTURE" "$MODEL" -p "" -o x.h5
    expect "empty prompt on stdin" 1 '*' "$P: empty prompt on standard input" "$CAPTURE" "$MODEL" -o x.h5
    expect "empty prompt file" 1 '*' "$P: empty prompt file" "$CAPTURE" "$MODEL" -f empty.ids -o x.h5
    expect "id outside the vocabulary" 1 '*' "$P: 'big.ids': token id 512 at index 2 is outside the vocabulary of 512" \
        "$CAPTURE" "$MODEL" --token-ids big.ids -o x.h5
    expect "not a token id" 1 '*' "$P: 'word.ids': '2x' is not a token id" "$CAPTURE" "$MODEL" --token-ids word.ids -o x.h5
    expect "no token ids" 1 '*' "$P: 'empty.ids': no token ids" "$CAPTURE" "$MODEL" --token-ids empty.ids -o x.h5
    expect "missing model" 1 '*' "$P: cannot open 'missing.bin': No such file or directory" "$CAPTURE" missing.bin -p hi -o x.h5
    expect "truncated model" 1 '*' "$P: 'trunc.bin': truncated: the header ($HEADER) implies $(wc -c <"$MODEL" | tr -d ' ') bytes, the file has 1000" \
        "$CAPTURE" trunc.bin -p hi -o x.h5
    expect "no tokenizer beside" 1 '*' "$P: 'alone.bin': no tokenizer beside the checkpoint (looked for tokenizer.bin and tok512.bin in .); give --tokenizer FILE" \
        "$CAPTURE" alone.bin -p hi -o x.h5
    expect "missing tokenizer" 1 '*' "$P: cannot open 'none.bin': No such file or directory" \
        "$CAPTURE" alone.bin --tokenizer none.bin -p hi -o x.h5
    expect "--tokenizer given" 0 '*' '' "$CAPTURE" alone.bin --tokenizer "$TOK" -p hi -o y.h5
    expect "token ids need no tokenizer" 0 '*' '' "$CAPTURE" alone.bin --token-ids prompt.ids -o y.h5
    expect "output over the model" 2 '*' "$P: output 'model.bin' would overwrite the input" \
        "$CAPTURE" model.bin --token-ids prompt.ids -o model.bin
    if cmp -s model.bin "$MODEL"; then pass; else fail "the model was overwritten"; fi
    # no other input is overwritten either: the prompt file, the token ids,
    # the tokenizer found beside the checkpoint (also by another name)
    printf 'Once upon a time' >prompt.txt
    cp prompt.txt prompt.keep
    cp prompt.ids ids.keep
    mkdir beside
    cp "$MODEL" beside/model.bin
    cp "$TOK" "beside/$TOKNAME"
    expect "output over the prompt file" 2 '*' "$P: output 'prompt.txt' would overwrite the input" \
        "$CAPTURE" "$MODEL" -f prompt.txt -o prompt.txt
    if cmp -s prompt.txt prompt.keep; then pass; else fail "the prompt file was overwritten"; fi
    expect "output over the token ids" 2 '*' "$P: output './prompt.ids' would overwrite the input" \
        "$CAPTURE" "$MODEL" --token-ids prompt.ids -o ./prompt.ids
    if cmp -s prompt.ids ids.keep; then pass; else fail "the token ids were overwritten"; fi
    expect "output over the token ids of a shape" 2 '*' "$P: output 'prompt.ids' would overwrite the input" \
        "$CAPTURE" --shape llama3.1-8b --layers 0 --vocab 512 --token-ids prompt.ids -o prompt.ids
    if cmp -s prompt.ids ids.keep; then pass; else fail "the token ids were overwritten by --shape"; fi
    expect "output over the tokenizer found beside" 2 '*' "$P: output 'beside/$TOKNAME' would overwrite the input" \
        "$CAPTURE" beside/model.bin -p 'Once upon a time' -o "beside/$TOKNAME"
    if cmp -s "beside/$TOKNAME" "$TOK"; then pass; else fail "the tokenizer was overwritten"; fi
    expect "output over the tokenizer given" 2 '*' "$P: output 'beside/../beside/$TOKNAME' would overwrite the input" \
        "$CAPTURE" alone.bin --tokenizer "beside/$TOKNAME" -p hi -o "beside/../beside/$TOKNAME"
    if cmp -s "beside/$TOKNAME" "$TOK"; then pass; else fail "the given tokenizer was overwritten"; fi
    expect "--chat without a template" 1 '*' "$P: '$MODEL': the model has no chat template" \
        "$CAPTURE" "$MODEL" --chat -p hi -o x.h5
    expect "--layers outside" 2 '*' "$P: invalid value '5' for --layers: the model has 5 layers (0..4)" \
        "$CAPTURE" "$MODEL" -p hi --layers 5 -o x.h5
    expect "--layers backwards" 2 '*' "$P: invalid value '3-1' for --layers: expected a list of layers like 0,3,5-7" \
        "$CAPTURE" "$MODEL" -p hi --layers 3-1 -o x.h5
    expect "--layers empty item" 2 '*' "$P: invalid value '1,,2' for --layers: expected a list of layers like 0,3,5-7" \
        "$CAPTURE" "$MODEL" -p hi --layers 1,,2 -o x.h5
    if [ -e x.h5 ]; then fail "a failed run left x.h5 behind"; else pass; fi
}

# ---------------------------------------------------------------- the fixture
if [ $have_h5py = 1 ]; then
    mkdir fixture run-fixture
    if "$PY" "$top_srcdir/tests/model_fixture.py" fixture/tiny.bin fixture/tokenizer.bin --bpe --layers 5; then
        pass
        printf 'Once upon a time' >once.txt
        once=$("$PY" "$REF" tokenize fixture/tokenizer.bin once.txt | cut -d' ' -f2-)
        cd run-fixture || exit 1
        llama2c_cases "$tmp/fixture/tiny.bin" "$tmp/fixture/tokenizer.bin" "$once" \
            "dim 32, hidden 64, 5 layers, vocab 512, seq_len 512"
        cd "$tmp" || exit 1
    else
        fail "model_fixture.py"
    fi
fi

# ---------------------------------------------------------------- stories260K
if [ $have_stories = 1 ]; then
    mkdir run-stories
    cd run-stories || exit 1
    llama2c_cases "$MODELS/stories260K.bin" "$MODELS/tok512.bin" "403 407 261 378" \
        "dim 64, hidden 172, 5 layers, vocab 512, seq_len 512"
    # its published sample: the 20 tokens generated from BOS + "Once upon a
    # time" continue the prompt as the published text does, in ids and text
    printf 'Once upon a time%s' "$(cat gen.out)" >text.txt
    case "$PUBLISHED" in
    "$(cat text.txt)"*) pass ;;
    *) fail "--print: 'Once upon a time' + '$(cat gen.out)' is not a prefix of the published sample" ;;
    esac
    if [ $have_h5py = 1 ]; then
        want_ids=$(tr ' ' '\n' <published.ids | head -n 25 | tr '\n' ' ' | sed 's/ $//')
        got_ids=$("$PY" -c 'import h5py, sys; print(" ".join(str(t) for t in h5py.File(sys.argv[1])["tokens"][:]))' gen.h5)
        if [ "$got_ids" = "$want_ids" ]; then pass
        else fail "/tokens: got '$got_ids', published '$want_ids'"; fi
    fi
    cd "$tmp" || exit 1
fi

# ================================================================ SmolLM2 (GGUF, chat)
# The GGUF that scripts/get-models fetches; optional (it is a download).
SMOLLM2=${MKV_SMOLLM2:-${MKV_CACHE_DIR:-${HOME:-/nonexistent}/.cache/mosaickv}/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -r "$SMOLLM2" ]; then
    expect "SmolLM2 --chat" 0 '*' '' "$CAPTURE" "$SMOLLM2" --chat -p "What is the capital of France?" \
        --generate 8 --layers 0,29 --print -o smol.h5
    if grep -q Paris got.out; then pass; else fail "SmolLM2 --chat: no 'Paris' in the answer '$(cat got.out)'"; fi
    if [ $have_h5py = 1 ]; then
        py "SmolLM2 chat dump" - smol.h5 <<'EOF'
import sys
import h5py
f = h5py.File(sys.argv[1], "r")
a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
t = list(f["tokens"][:])
prompt = t[:len(t) - 8]
# SmolLM2's vocabulary: <|im_start|> = 1, <|im_end|> = 2.  ChatML with the
# template's default system turn: system, user, then the assistant's turn
# opened; no BOS of its own (the template has none).
if prompt[0] != 1 or prompt.count(1) != 3 or prompt.count(2) != 2:
    print("FAIL: ChatML structure: %r" % prompt)
    sys.exit(1)
want = {"n_layers": 2, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64, "rope_theta": 100000.0,
        "layer_index": "0,29", "source": "capture"}
for k, v in want.items():
    if a.get(k) != v:
        print("FAIL: %s = %r, expected %r" % (k, a.get(k), v))
        sys.exit(1)
if "chat=chatml" not in a["capture_params"] or "format=gguf" not in a["capture_params"]:
    print("FAIL: capture_params %r" % a["capture_params"])
    sys.exit(1)
EOF
    fi
else
    echo "note: SmolLM2 GGUF not found (scripts/get-models; MKV_SMOLLM2): chat case skipped"
fi

# A file starting with "GGUF" goes to the GGUF loader, whose message names it.
printf 'GGUF\003\000\000\000garbage' >bad.gguf
"$CAPTURE" bad.gguf --token-ids /dev/null -o x.h5 </dev/null >/dev/null 2>gguf.err
status=$?
case "$status:$(cat gguf.err)" in
"1:$P: 'bad.gguf': "*GGUF*) pass ;;
*) fail "corrupt GGUF: exit $status, '$(cat gguf.err)'" ;;
esac

# ================================================================ usage
# The usage errors that need no model file (exact stderr, exit status):
# the golden transcript tests/cli/mkv-capture.t.
expect "--list-shapes" 0 '*' '' "$CAPTURE" --list-shapes
if head -n 1 got.out | grep -q '^name	layers	dim	heads	kv_heads	head_dim	hidden	vocab	context	rope_theta	tied	qkv_bias	model$' &&
   grep -q '^llama3.1-8b	32	4096	32	8	128	14336	128256	131072	500000	no	no	' got.out &&
   grep -q '^qwen2.5-7b	28	3584	28	4	128	18944	152064	32768	1000000	no	yes	' got.out &&
   grep -q '^smollm2-135m	30	576	9	3	64	1536	49152	8192	100000	yes	no	' got.out
then pass; else fail "--list-shapes: $(cat got.out)"; fi

# ================================================================ shape-only
expect "smollm2-135m shape" 0 '*' '' "$CAPTURE" --shape smollm2-135m --tokens 64 --window 8 --generate 2 --threads 2 -o s1.h5
expect "again, one thread" 0 '*' '' "$CAPTURE" --shape smollm2-135m --tokens 64 --window 8 --generate 2 --threads 1 -o s2.h5
if cmp -s s1.h5 s2.h5; then pass; else fail "--shape: same seed, other thread count, different files"; fi
expect "another seed" 0 '*' '' "$CAPTURE" --shape smollm2-135m --tokens 64 --window 8 --generate 2 --seed 2 -o s3.h5
if cmp -s s1.h5 s3.h5; then fail "--shape: seeds 1 and 2 gave the same file"; else pass; fi
expect "pre-RoPE, layers 0 and 29" 0 '*' '' "$CAPTURE" --shape smollm2-135m --tokens 64 --window 8 --generate 2 \
    --layers 0,29 --k-rope pre --dtype f32 -o pre.h5
expect "post-RoPE, layer 0" 0 '*' '' "$CAPTURE" --shape smollm2-135m --tokens 64 --window 8 --generate 2 \
    --layers 0 --dtype f32 -o post.h5
expect "llama3.1-8b, one layer, small vocabulary" 0 '*' '' "$CAPTURE" --shape llama3.1-8b --layers 31 --vocab 1000 \
    --tokens 16 --window 4 --dtype f32 -o l8.h5
expect "llama3.1-8b, pre-RoPE" 0 '*' '' "$CAPTURE" --shape llama3.1-8b --layers 31 --vocab 1000 \
    --tokens 16 --window 4 --dtype f32 --k-rope pre -o l8pre.h5
if [ -x "$ANALYZE" ]; then
    for f in s1.h5 pre.h5 l8.h5; do expect "$f validates" 0 '*' '' "$ANALYZE" check $f; done
fi
if [ $have_h5py = 1 ]; then
    py "shape-only dumps" - s1.h5 pre.h5 post.h5 l8.h5 l8pre.h5 <<'EOF'
import sys
import h5py
import numpy as np

def fail(msg):
    print("FAIL: shape-only: " + msg)
    sys.exit(1)

def attrs(f):
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}

s1, pre, post, l8, l8pre = (h5py.File(p, "r") for p in sys.argv[1:6])
a = attrs(s1)
want = {"model": "shape:smollm2-135m", "weights": "random", "source": "capture", "n_layers": 30,
        "n_heads": 9, "n_kv_heads": 3, "head_dim": 64, "rope_theta": 100000.0, "k_rope": "post",
        "layer_index": ",".join(str(i) for i in range(30))}
for k, v in want.items():
    if a.get(k) != v:
        fail("%s = %r, expected %r" % (k, a.get(k), v))
if a.get("rope") != "dim=64 layout=half" or "rope_freq_factors" in a:
    fail("smollm2-135m RoPE attributes: rope=%r, rope_freq_factors %s" % (a.get("rope"),
         "present" if "rope_freq_factors" in a else "absent"))
t = s1["tokens"][:]
if len(t) != 66 or t.min() < 0 or t.max() >= 49152:
    fail("tokens: %d ids in [%d, %d]" % (len(t), t.min(), t.max()))
if list(s1["query_pos"][:]) != list(range(56, 66)):
    fail("query_pos %r" % list(s1["query_pos"][:]))
if s1["layers/29/k"].shape != (3, 66, 64) or s1["layers/29/q"].shape != (9, 10, 64):
    fail("shapes %r %r" % (s1["layers/29/k"].shape, s1["layers/29/q"].shape))
# sane activations: unit-scale keys, no blow-up in the last layer
for l in (0, 29):
    k = s1["layers/%02d/k" % l][:].astype(np.float64)
    rms = np.sqrt(np.mean(k * k))
    if not 0.1 < rms < 10:
        fail("layer %d: key rms %.3g" % (l, rms))

b = attrs(pre)
if b.get("layer_index") != "0,29" or b.get("n_layers") != 2 or b.get("k_rope") != "pre":
    fail("pre.h5 attributes %r" % b)
# post = HF rotate_half RoPE (pairs j, j+32) of pre with base 100000, both for
# keys and for queries, at every prompt position (the generated tokens
# differ: the two runs build different layers)
def rope_half(x, pos, theta, inv=None):
    d = x.shape[-1]
    half = d // 2
    if inv is None:
        inv = theta ** (-2.0 * np.arange(half) / d)
    ang = pos[:, None] * inv
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    out[..., :half] = x[..., :half] * c - x[..., half:] * s
    out[..., half:] = x[..., :half] * s + x[..., half:] * c
    return out
pos = np.arange(64, dtype=np.float64)
k_pre = pre["layers/00/k"][:, :64].astype(np.float64)
k_post = post["layers/00/k"][:, :64].astype(np.float64)
if not np.allclose(rope_half(k_pre, pos, 1e5), k_post, rtol=0, atol=1e-5 * np.abs(k_post).max()):
    fail("post-RoPE keys are not rotate_half(pre-RoPE keys) with base 1e5")
if np.allclose(k_pre, k_post, rtol=0, atol=1e-2 * np.abs(k_post).max()):
    fail("pre- and post-RoPE keys are the same")
q_pre = pre["layers/00/q"][:, :8].astype(np.float64)
q_post = post["layers/00/q"][:, :8].astype(np.float64)
if not np.allclose(rope_half(q_pre, pos[56:], 1e5), q_post, rtol=0, atol=1e-5 * np.abs(q_post).max()):
    fail("post-RoPE queries are not rotate_half(pre-RoPE queries) with base 1e5")
# V of layer 0 depends only on the embeddings and layer 0's weights: the
# same whether 30 layers or 2 are built (float16 vs float32 storage)
v_all = s1["layers/00/v"][:, :64].astype(np.float64)
v_sub = pre["layers/00/v"][:, :64].astype(np.float64)
if not np.allclose(v_all, v_sub, rtol=0, atol=2e-3 * np.abs(v_sub).max()):
    fail("layer 0 differs between a full and a partial build")

c = attrs(l8)
want = {"model": "shape:llama3.1-8b", "weights": "random", "n_layers": 1, "n_heads": 32,
        "n_kv_heads": 8, "head_dim": 128, "rope_theta": 500000.0, "layer_index": "31"}
for k, v in want.items():
    if c.get(k) != v:
        fail("llama3.1-8b: %s = %r, expected %r" % (k, c.get(k), v))
if l8["tokens"].shape != (16,) or l8["tokens"][:].max() >= 1000:
    fail("llama3.1-8b: tokens outside --vocab 1000")
# Llama 3.1's "llama3" RoPE scaling as Hugging Face defines it (factor 8,
# low_freq_factor 1, high_freq_factor 4, original context 8192)
inv = 500000.0 ** (-2.0 * np.arange(64) / 128)
wavelen = 2 * np.pi / inv
smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
scaled = np.where(wavelen < 8192 / 4, inv,
                  np.where(wavelen > 8192 / 1, inv / 8, (1 - smooth) * inv / 8 + smooth * inv))
# the dump says how to redo that rotation: pair layout and, per pair, the
# divisor of its frequency
if c.get("rope") != "dim=128 layout=half":
    fail("llama3.1-8b: rope = %r" % c.get("rope"))
factors = np.array([float(x) for x in c.get("rope_freq_factors", "").split(",") if x])
if factors.shape != (64,) or not np.allclose(factors, inv / scaled, rtol=1e-6, atol=0):
    fail("llama3.1-8b: rope_freq_factors %r are not Hugging Face's llama3 divisors" % c.get("rope_freq_factors"))
pos = np.arange(16, dtype=np.float64)
for kind, p in (("k", pos), ("q", pos[12:])):
    x_pre = l8pre["layers/00/" + kind][:].astype(np.float64)
    x_post = l8["layers/00/" + kind][:].astype(np.float64)
    if not np.allclose(rope_half(x_pre, p, 5e5, scaled), x_post, rtol=0, atol=1e-5 * np.abs(x_post).max()):
        fail("llama3.1-8b: post-RoPE %s is not RoPE with llama3 scaling of pre-RoPE %s" % (kind, kind))
    if np.allclose(rope_half(x_pre, p, 5e5), x_post, rtol=0, atol=1e-5 * np.abs(x_post).max()):
        fail("llama3.1-8b: %s rotated without the frequency scaling" % kind)
EOF
fi

cli_finish || exit 1
[ "$skipped" -eq 0 ] || exit 77
exit 0
