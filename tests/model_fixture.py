"""A tiny llama2.c model with random weights and its tokenizer, written
with numpy only, for the CLI tests of the tools that run a model (their
behaviour, not the quality of the text).

  model_fixture.py MODEL TOKENIZER [--seed S] [--seq-len N]

MODEL: a version-0 llama2.c checkpoint (../shared/models/README.md): dim
32, 2 layers, 4 query heads on 2 KV heads, hidden 64, shared classifier.
TOKENIZER: <unk>, <s>, </s>, the 256 byte pieces <0x00>..<0xFF>, then every
printable ASCII character as its own piece: 354 tokens, scores 0.
"""
import argparse
import struct

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=512)
    a = ap.parse_args()
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)]
    pieces += [bytes([c]) for c in range(0x20, 0x7F)]
    vocab = len(pieces)
    dim, hidden, layers, heads, kv_heads = 32, 64, 2, 4, 2
    head_dim = dim // heads
    kv_dim = kv_heads * head_dim
    rng = np.random.default_rng(a.seed)

    def normal(*shape, mean=0.0, sd=0.3):
        return (mean + sd * rng.standard_normal(shape)).astype("<f4")

    with open(a.model, "wb") as fp:
        fp.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, a.seq_len))
        for arr in (normal(vocab, dim, sd=1.0), normal(layers, dim, mean=1.0, sd=0.1),
                    normal(layers, dim, dim), normal(layers, kv_dim, dim), normal(layers, kv_dim, dim),
                    normal(layers, dim, dim), normal(layers, dim, mean=1.0, sd=0.1),
                    normal(layers, hidden, dim), normal(layers, dim, hidden), normal(layers, hidden, dim),
                    normal(dim, mean=1.0, sd=0.1), np.zeros((a.seq_len, head_dim), dtype="<f4")):
            fp.write(arr.tobytes())
    with open(a.tokenizer, "wb") as fp:
        fp.write(struct.pack("<i", max(len(p) for p in pieces)))
        for p in pieces:
            fp.write(struct.pack("<fi", 0.0, len(p)) + p)


if __name__ == "__main__":
    main()
