#!/usr/bin/env python3
"""Independent references for tests/check_gguf.c, produced with Hugging
Face's `tokenizers` (the Rust tokenizer, its regex engine is Oniguruma) and
llama.cpp's `gguf` Python reader.  The test does not run this script: its
output is committed into tests/check_gguf.c.  To regenerate:

  python3 -m venv /tmp/refenv
  /tmp/refenv/bin/pip install tokenizers gguf
  /tmp/refenv/bin/python tests/gguf_ref.py ids SmolLM2-135M-Instruct.Q4_1.gguf
  /tmp/refenv/bin/python tests/gguf_ref.py pieces

`ids`: builds SmolLM2's tokenizer from the vocabulary and merges stored in
the GGUF, with the pre-tokenizer and decoder of SmolLM2's published
tokenizer.json (Digits(individual_digits) then ByteLevel without prefix
space), and prints the ids of the strings in STRINGS (special tokens
recognised, as Hugging Face does by default).

`logits`: an independent float64 numpy forward pass of SmolLM2 from the
GGUF, its tensors dequantized by gguf-py (llama.cpp's own Python
dequantizer), RoPE on adjacent channel pairs (llama.cpp's "norm" RoPE for
the llama architecture); prints the five largest logits after LOGIT_IDS.

  /tmp/refenv/bin/python tests/gguf_ref.py logits SmolLM2-135M-Instruct.Q4_1.gguf

`pieces`: splits PIECE_TEXTS with the pre-tokenizer regular expressions of
GPT-2, SmolLM (digits first), LLaMA-3 and Qwen2 (tokenizers' Split with
behavior "isolated") and prints the pieces.
"""
import sys

STRINGS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "I'm 12345 years old; it's 3.14159.",
    "  leading spaces\n\n\tand tabs  ",
    "don't DON'T we've they'll I'd",
    "Ünïcödé: naïve café, 東京タワー, Привет мир, مرحبا",
    "emoji 🦙🚀 and symbols ≤≥ €100",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
]

PIECE_TEXTS = [
    "Hello world\n\n  foo\r\n\tbar   \n",
    "x  \n y",
    "a\u00a0b c\u3000d",
    "1234567 12 x1y22",
    "'S 's 'll 'LL 'Re it's",
    "(word) [x] --flag",
    "日本語テキスト123 Ünïcödé",
    "hello...world!!! ?? \n\n\n",
    "   ",
    " \n ",
    "tab\tsep\t\tend",
    "a\x1cb",
]

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def c_string(s):
    out = []
    for b in s.encode("utf-8"):
        if b in (0x22, 0x5C):
            out.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append("\\%03o" % b)
    return '"' + "".join(out) + '"'


def smollm_tokenizer(path):
    import gguf
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    types = r.fields["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, k in enumerate(types.data) if int(types.parts[k][0]) == 3]
    tok.add_special_tokens(special)
    return tok


# "The capital of France is" in SmolLM2's vocabulary
LOGIT_IDS = [504, 3575, 282, 4649, 314]


def smollm_logits(path, ids):
    import gguf
    import numpy as np
    r = gguf.GGUFReader(path)

    def val(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    t = {}
    for tensor in r.tensors:
        x = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        t[tensor.name] = np.asarray(x, dtype=np.float64).reshape([int(d) for d in reversed(tensor.shape)])
    dim = int(val("llama.embedding_length"))
    n_layers = int(val("llama.block_count"))
    n_heads = int(val("llama.attention.head_count"))
    n_kv = int(val("llama.attention.head_count_kv"))
    theta = float(val("llama.rope.freq_base"))
    eps = float(val("llama.attention.layer_norm_rms_epsilon"))
    hd = dim // n_heads
    T = len(ids)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x):  # x [T, heads, hd]; pairs (2j, 2j+1)
        j = np.arange(hd // 2)
        ang = np.arange(T)[:, None] * theta ** (-2.0 * j / hd)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    h = t["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(n_layers):
        p = "blk.%d." % l
        x = rms(h, t[p + "attn_norm.weight"])
        q = rope((x @ t[p + "attn_q.weight"].T).reshape(T, n_heads, hd))
        k = rope((x @ t[p + "attn_k.weight"].T).reshape(T, n_kv, hd))
        v = (x @ t[p + "attn_v.weight"].T).reshape(T, n_kv, hd)
        g = n_heads // n_kv
        att = np.empty((T, n_heads, hd))
        for hh in range(n_heads):
            sc = q[:, hh] @ k[:, hh // g].T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            att[:, hh] = sc @ v[:, hh // g]
        h = h + att.reshape(T, dim) @ t[p + "attn_output.weight"].T
        x = rms(h, t[p + "ffn_norm.weight"])
        a = x @ t[p + "ffn_gate.weight"].T
        h = h + ((a / (1 + np.exp(-a))) * (x @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
    out = t.get("output.weight", t["token_embd.weight"])
    return rms(h[-1], t["output_norm.weight"]) @ out.T


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "ids":
        tok = smollm_tokenizer(sys.argv[2])
        for s in STRINGS:
            ids = tok.encode(s).ids
            assert tok.decode(ids, skip_special_tokens=False) == s
            print("    {%s,\n     {%s}, %d}," % (c_string(s), ", ".join(map(str, ids)), len(ids)))
    elif len(sys.argv) >= 3 and sys.argv[1] == "logits":
        logits = smollm_logits(sys.argv[2], LOGIT_IDS)
        top = sorted(range(len(logits)), key=lambda i: -logits[i])[:5]
        print("    " + ", ".join("{%d, %.6f}" % (i, logits[i]) for i in top))
    elif len(sys.argv) == 2 and sys.argv[1] == "pieces":
        from tokenizers import Regex, pre_tokenizers
        splitters = {
            "gpt2": pre_tokenizers.Split(Regex(GPT2), behavior="isolated"),
            "smollm": pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.Split(Regex(GPT2), behavior="isolated")]),
            "llama3": pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
            "qwen2": pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
        }
        for name, sp in splitters.items():
            for s in PIECE_TEXTS:
                pieces = [p for p, _ in sp.pre_tokenize_str(s)]
                assert "".join(pieces) == s
                print("    {\"%s\", %s,\n     {%s}}," % (name, c_string(s),
                                                   ", ".join(c_string(p) for p in pieces)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
